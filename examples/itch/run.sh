#!/usr/bin/env bash
# Set up subc and run the ITCH example: compile for BMv2, Tofino and eBPF, analyze the real sample with
# Spark (local mode), then simulate it message by message.
# To run the eBPF broker on real interfaces: sudo subc load out/ebpf --iface IF --subscribers subscribers.toml
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
python3 -m pip install -q -e "$root[spark]"
trace="$root/../shared/data/itch/ex20101224.TEST_ITCH_50"
[ -f "$trace" ] || trace="$here/data/ex20101224.TEST_ITCH_50"
subc compile "$here/rules.sub" --spec "$here/spec.p4" --target bmv2 -o "$root/out/bmv2"
subc compile "$here/rules.sub" --spec "$here/spec.p4" --target tofino -o "$root/out/tofino"
subc compile "$here/rules.sub" --spec "$here/spec.p4" --target ebpf -o "$root/out/ebpf"
subc analyze "$here/rules.sub" --spec "$here/spec.p4" --trace "$trace" -o "$root/out/analysis" 2>/dev/null
subc simulate "$here/rules.sub" --spec "$here/spec.p4" --trace "$trace"
