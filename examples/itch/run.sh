#!/usr/bin/env bash
# Set up subc and run the ITCH example: compile for BMv2, Tofino and eBPF, analyze the real sample with
# Spark (local mode), then simulate it message by message.
# To run the eBPF broker on real interfaces: sudo subc load out/ebpf --iface IF --subscribers subscribers.toml
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
# A fresh Debian 12 machine: pip and a Java 17 runtime (Spark) from apt when root, then this package.
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    missing=""
    python3 -m pip --version >/dev/null 2>&1 || missing="$missing python3-pip"
    command -v java >/dev/null || missing="$missing openjdk-17-jre-headless"
    if [ -n "$missing" ]; then
        apt-get update -q
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q $missing
    fi
fi
if ! log="$(python3 -m pip install -q -e "$root[spark]" 2>&1)"; then
    if grep -q externally-managed-environment <<<"$log"; then  # Debian's system Python (PEP 668)
        python3 -m pip install -q --break-system-packages -e "$root[spark]"
    else
        printf '%s\n' "$log" >&2
        exit 1
    fi
fi
trace="$root/../shared/data/itch/ex20101224.TEST_ITCH_50"
[ -f "$trace" ] || trace="$here/data/ex20101224.TEST_ITCH_50"
subc compile "$here/rules.sub" --spec "$here/spec.p4" --target bmv2 -o "$root/out/bmv2"
subc compile "$here/rules.sub" --spec "$here/spec.p4" --target tofino -o "$root/out/tofino"
subc compile "$here/rules.sub" --spec "$here/spec.p4" --target ebpf -o "$root/out/ebpf"
subc analyze "$here/rules.sub" --spec "$here/spec.p4" --trace "$trace" -o "$root/out/analysis" 2>/dev/null
subc simulate "$here/rules.sub" --spec "$here/spec.p4" --trace "$trace"
