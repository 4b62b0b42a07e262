#!/usr/bin/env bash
# Set up subc and run the ITCH example: compile for BMv2 and Tofino, then simulate the real sample.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
python3 -m pip install -q -e "$root"
trace="$root/../shared/data/itch/ex20101224.TEST_ITCH_50"
[ -f "$trace" ] || trace="$here/data/ex20101224.TEST_ITCH_50"
subc compile "$here/rules.sub" --spec "$here/spec.p4" --target bmv2 -o "$root/out/bmv2"
subc compile "$here/rules.sub" --spec "$here/spec.p4" --target tofino -o "$root/out/tofino"
subc simulate "$here/rules.sub" --spec "$here/spec.p4" --trace "$trace"
