#!/usr/bin/env bash
# The test command (README, "Quick start"; docs/tests.md):  bash tests/run.sh [pytest arguments]
#
# Works alone on a fresh Debian 12 machine.  As root with apt-get, it first installs the Debian
# packages the tests need, when one is missing (then only: apt-get update + install):
#   - python3-bpfcc and kernel headers: bcc compiles the eBPF programs against them;
#   - iproute2, util-linux (nsenter), ethtool: the network-namespace tests;
#   - gcc: the benchmark's user-space baseline (bench/udp_broker.c, tests/test_udp_baseline.py);
#   - clang, libbpf-dev, clang-format: the eBPF program built as a BPF object and its static C's
#     style checked (tests/test_ebpf_source.py);
#   - openjdk-17-jre-headless (when there is no java): the data pipeline (PySpark);
#   - etcd-server: the etcd members the cluster tests start (tests/etcd_util.py);
#   - python3-pip when python3 has no pip.
# Then it installs the package with its test extra (pip; on Debian's "externally managed" system
# Python it retries with --break-system-packages) and runs pytest with the arguments given.
# Without root nothing is installed with apt, and the tests that need root (or a tool that is
# missing) skip with their reason.  The exit status is pytest's (5, no tests collected, included).
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    arch="$(dpkg --print-architecture)"
    missing=""
    for p in python3-bpfcc "linux-headers-$arch" iproute2 util-linux ethtool gcc clang libbpf-dev clang-format \
        etcd-server; do
        dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"
    done
    command -v java >/dev/null || missing="$missing openjdk-17-jre-headless"
    python3 -m pip --version >/dev/null 2>&1 || missing="$missing python3-pip"
    kdir="/lib/modules/$(uname -r)"
    if [ -n "$missing" ]; then
        apt-get update -q
        # a Debian kernel: its own headers, when packaged
        if [ ! -e "$kdir/build/include" ] && apt-cache show "linux-headers-$(uname -r)" >/dev/null 2>&1; then
            missing="$missing linux-headers-$(uname -r)"
        fi
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q $missing
    fi
    # No headers are packaged for this kernel: point bcc at Debian's (see docs/ebpf.md, "eBPF target").
    if [ ! -e "$kdir/build/include" ]; then
        build="$(ls -d /usr/src/linux-headers-*-"$arch" 2>/dev/null | sort -V | tail -1)" || true
        common="$(ls -d /usr/src/linux-headers-*-common 2>/dev/null | sort -V | tail -1)" || true
        if [ -n "$build" ] && [ -n "$common" ]; then
            mkdir -p "$kdir"
            ln -sfn "$build" "$kdir/build"
            ln -sfn "$common" "$kdir/source"
        fi
    fi
elif [ "$(id -u)" != 0 ]; then
    echo "tests/run.sh: not root: no apt packages installed; the tests that need root skip" >&2
fi

# The test extra pulls in the spark extra (PySpark, pandas, pyarrow).
if ! log="$(python3 -m pip install -q -e '.[test]' 2>&1)"; then
    if grep -q externally-managed-environment <<<"$log"; then
        python3 -m pip install -q --break-system-packages -e '.[test]'
    else
        printf '%s\n' "$log" >&2
        exit 1
    fi
elif [ -n "$log" ]; then
    printf '%s\n' "$log" >&2
fi

# BMv2 tests run when p4c-bm2-ss and simple_switch are on PATH; eBPF and network-namespace tests as root.
exec python3 -m pytest -q "$@"
