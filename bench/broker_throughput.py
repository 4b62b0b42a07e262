#!/usr/bin/env python3
"""Throughput on veth: messages per second the eBPF broker and a user-space broker deliver to
1, 8 and 32 subscribers, measured in one run, and their ratio.

Topology (network namespaces made here, removed afterwards; addresses only inside them)::

    publisher (tpub, CPU 0) --veth-- broker (tbrk, CPU 1) ==N veths== sink (tsnk, XDP_DROP)

* Publisher, pinned to CPU 0: ``udp_broker publish`` (C) sends MoldUDP64 packets of one ITCH Add
  Order each, ``--seconds`` per offered rate of ``--rates`` (0: as fast as it can).  By default
  (``--publisher gso``) each sendmmsg entry carries 32 messages with UDP GSO, segmented in
  software on CPU 0, which reaches several million messages/s; ``--publisher socket`` sends one
  datagram per message with complete UDP checksums instead.  The publisher's veth has TSO off
  (so frames go to the broker's NAPI ring with or without XDP) and a pfifo queue (so a full ring
  pushes back instead of dropping, Linux 6.16+).
* Broker, on CPU 1 only: the broker veth has GRO on and *threaded NAPI*, its NAPI kthread pinned
  to CPU 1, so everything after the publisher's transmit (the XDP and TC programs, or the kernel
  UDP receive path, the user-space broker process, also pinned to CPU 1, and its sends) runs on
  one core.  The two brokers get the same core and the same input.
  - eBPF: ``subc load OUT --iface tb0 --subscribers FILE``; one endpoint is an XDP redirect,
    several are XDP -> TC ingress -> ``bpf_clone_redirect`` per endpoint.
  - user space: ``udp_broker broker`` (C): ``recvmmsg`` batches of 64 on a UDP socket, the same
    compiled tables (``maps.json`` flattened by ``udp_tables.py``, classifier tested against the
    reference in tests/test_udp_baseline.py), one ``sendmmsg`` for all copies of a batch.
* Sinks: the subscriber veths drop in XDP and count in their ``rx_packets`` (veth counts every
  frame its NAPI sees), so delivery is counted without a receiver's cost.

Workload (fan-out to all): subscriber i of N has ten rules
``add_order.stock == "S<j>" and add_order.price > <i> : fwd(i)``; every published Add Order
(symbols S0..S9, price 100.0000) matches one rule of every subscriber, so each message is one
leaf with N endpoints.  Delivered messages/s = copies received by the sinks / N / seconds.
The summary gives, per broker, the peak delivered rate over the offered rates (a socket broker
livelocks when offered more than it can take) and the rate at the highest offered load.

    sudo python3 bench/broker_throughput.py --subscribers 1,8,32 --repeat 3 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from udp_tables import build_udp_broker, payloads_file, tables_text

from subc.compiler.spec import load_spec
from subc.compiler.targets.ebpf_parse import plan_parser
from subc.workloads.itch_codec import encode_add_order, stock_value
from subc.runtime.moldudp64 import encode_packet

PUB, BRK, SNK = "tpub", "tbrk", "tsnk"
PORT = 26400
SUB_PORT = 5001
SPEC = ROOT / "examples/itch/spec.p4"
SUBC = [sys.executable, "-m", "subc.cli"]
SINK_PROG = "int sink(struct xdp_md *ctx) { return XDP_DROP; }"


def sh(*args: str, check: bool = True) -> str:
    r = subprocess.run(list(args), capture_output=True, text=True)
    if check and r.returncode:
        raise SystemExit(f"{' '.join(args)} failed ({r.returncode}): {r.stderr.strip()}")
    return r.stdout


def in_ns(ns: str, *args: str) -> list[str]:
    return ["nsenter", f"--net=/run/netns/{ns}", *args]


def mac_of(ns: str, dev: str) -> str:
    return json.loads(sh("ip", "-n", ns, "-j", "link", "show", dev))[0]["address"]


class Topology:
    """The namespaces and veths above, with ``n`` subscriber veths (tbK in the broker, tsK in the sink)."""

    def __init__(self, n: int, publisher: str):
        self.n = n
        self.remove()
        for ns in (PUB, BRK, SNK):
            sh("ip", "netns", "add", ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "link", "add", "tp0", "netns", PUB, "type", "veth", "peer", "name", "tb0", "netns", BRK)
        sh("ip", "-n", PUB, "addr", "add", "10.20.0.1/24", "dev", "tp0")
        sh("ip", "-n", BRK, "addr", "add", "10.20.0.2/24", "dev", "tb0")
        for ns, dev in ((PUB, "tp0"), (BRK, "tb0")):
            sh("ip", "-n", ns, "link", "set", dev, "up")
        # No TSO on the publisher's veth: then veth hands every frame to the broker's NAPI ring
        # (veth_skb_is_eligible_for_gro), with or without XDP, not to the publisher CPU's backlog.
        sh(*in_ns(PUB, "ethtool", "-K", "tp0", "tso", "off"))
        if publisher == "socket":
            sh(*in_ns(PUB, "ethtool", "-K", "tp0", "tx", "off"))  # complete UDP checksums, as from a NIC
        else:  # UDP GSO needs checksum offload; segment in software on the publisher's CPU
            sh(*in_ns(PUB, "ethtool", "-K", "tp0", "tx", "on", "gso", "off", "tx-udp-segmentation", "off"))
        # a queue in front of the veth, so a full NAPI ring pushes back (Linux 6.16+) instead of dropping
        sh("ip", "netns", "exec", PUB, "tc", "qdisc", "replace", "dev", "tp0", "root", "pfifo", "limit", "10000")
        sh("ip", "-n", PUB, "neigh", "replace", "10.20.0.2", "lladdr", mac_of(BRK, "tb0"), "dev", "tp0", "nud",
           "permanent")
        self.macs = {}
        for k in range(1, n + 1):
            sh("ip", "link", "add", f"tb{k}", "netns", BRK, "type", "veth", "peer", "name", f"ts{k}", "netns", SNK)
            sh("ip", "-n", BRK, "addr", "add", f"10.21.{k}.1/24", "dev", f"tb{k}")
            sh("ip", "-n", SNK, "addr", "add", f"10.21.{k}.2/24", "dev", f"ts{k}")
            sh("ip", "-n", BRK, "link", "set", f"tb{k}", "up")
            sh("ip", "-n", SNK, "link", "set", f"ts{k}", "up")
            self.macs[k] = mac_of(SNK, f"ts{k}")
            sh("ip", "-n", BRK, "neigh", "replace", f"10.21.{k}.2", "lladdr", self.macs[k], "dev", f"tb{k}", "nud",
               "permanent")
        # the broker's input: GRO on (veth NAPI in both configurations), threaded NAPI on CPU 1
        sh(*in_ns(BRK, "ethtool", "-K", "tb0", "gro", "on"))
        sh("ip", "netns", "exec", BRK, "sh", "-c", "echo 1 > /sys/class/net/tb0/threaded")  # sysfs of the netns
        # the sinks: XDP_DROP (also what lets a veth take XDP-redirected frames)
        code = ("import sys; sys.path.insert(0, %r); from subc.runtime.bpf import import_bcc; b = import_bcc(); "
                "p = b.BPF(text=%r); f = p.load_func('sink', b.BPF.XDP)\n"
                "for k in range(1, %d): b.BPF.attach_xdp(f'ts{k}', f, 0)") % (str(ROOT), SINK_PROG, n + 1)
        sh(*in_ns(SNK, sys.executable, "-c", code))

    def pin_napi(self) -> None:
        """Pin the broker input's NAPI kthread to CPU 1 (it exists once the device has NAPI)."""
        pids = [ln.split()[0] for ln in sh("ps", "-eo", "pid,comm").splitlines() if "napi/tb0-" in ln]
        if not pids:
            raise SystemExit("no NAPI kthread for tb0: threaded NAPI unavailable")
        for pid in pids:
            sh("taskset", "-p", "2", pid)

    def sink_packets(self, n: int) -> int:
        links = json.loads(sh("ip", "-n", SNK, "-s", "-j", "link", "show"))
        return sum(x["stats64"]["rx"]["packets"] for x in links if x["ifname"] in {f"ts{k}" for k in range(1, n + 1)})

    def pub_dropped(self) -> int:
        return json.loads(sh("ip", "-n", PUB, "-s", "-j", "link", "show", "tp0"))[0]["stats64"]["tx"]["dropped"]

    @staticmethod
    def remove() -> None:
        for ns in (PUB, BRK, SNK):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        shutil.rmtree("/sys/fs/bpf/subc/tb0", ignore_errors=True)
        shutil.rmtree("/run/subc/tb0", ignore_errors=True)


def rules_for(n: int) -> str:
    return "\n".join(f'add_order.stock == "S{j}" and add_order.price > {i} : fwd({i});'
                     for i in range(1, n + 1) for j in range(10))


def payloads(count: int = 1024) -> list[bytes]:
    out = []
    for i in range(count):
        msg = encode_add_order({"add_order.stock": stock_value(f"S{i % 10}"), "add_order.shares": 100 + i,
                                "add_order.price": 1_000_000, "add_order.order_ref_number": i})
        out.append(encode_packet("BENCH00001", i + 1, [msg]))
    return out


def subscribers_toml(topo: Topology, n: int) -> str:
    return "\n".join(
        f'[[subscriber]]\nid = {k}\nendpoints = [{{ ip = "10.21.{k}.2", port = {SUB_PORT}, mac = "{topo.macs[k]}", '
        f'iface = "tb{k}" }}]\n' for k in range(1, n + 1))


def publish(kind: str, binary: Path, work: Path, seconds: float, rate: int) -> dict:
    """Run the publisher on CPU 0 for ``seconds`` at ``rate`` messages/s (0: as fast as it can)."""
    segments = {"socket": 1, "gso": 32}[kind]
    return json.loads(sh(*in_ns(PUB, "taskset", "-c", "0", str(binary), "publish", str(work / "payloads"),
                                "10.20.0.2", str(PORT), str(seconds), "64", str(rate), str(segments))))


def measure(kind: str, n: int, topo: Topology, binary: Path, work: Path, seconds: float, publisher: str,
            rates: list[int]) -> tuple[list[dict], dict]:
    """Broker ``kind`` ('ebpf' or 'user') with ``n`` subscribers at each offered rate (0: as fast
    as the publisher can): one row per rate, and the broker's own counters over all of them."""
    broker = None
    if kind == "ebpf":
        sh(*in_ns(BRK, *SUBC, "load", str(work / f"out{n}"), "--iface", "tb0", "--subscribers",
                  str(work / f"subs{n}.toml")))
    else:
        broker = subprocess.Popen(in_ns(BRK, "taskset", "-c", "1", str(binary), "broker", str(work / f"tables{n}"),
                                        "10.20.0.2", str(PORT), "0", "64"), stdout=subprocess.PIPE, text=True)
        time.sleep(0.5)
    rows = []
    try:
        topo.pin_napi()
        for rate in rates:
            before, drop0 = topo.sink_packets(n), topo.pub_dropped()
            pub = publish(publisher, binary, work, seconds, rate)
            time.sleep(0.3)
            copies = topo.sink_packets(n) - before
            rows.append({"broker": kind, "subscribers": n, "offered_rate": rate, "published": pub["sent"],
                         "seconds": pub["seconds"], "publisher_msgs_per_s": pub["sent"] / pub["seconds"],
                         "dropped_at_broker_input": topo.pub_dropped() - drop0, "copies": copies,
                         "copies_per_s": copies / pub["seconds"], "msgs_per_s": copies / n / pub["seconds"]})
        if kind == "ebpf":
            stats = json.loads(sh(*in_ns(BRK, *SUBC, "stats", "--iface", "tb0", "--json")))
            counters = {k: v for k, v in stats["stats"].items() if v}
        else:
            broker.terminate()
            counters = json.loads(broker.communicate(timeout=10)[0])
    finally:
        if kind == "ebpf":
            sh(*in_ns(BRK, *SUBC, "unload", "--iface", "tb0"), check=False)
        elif broker.poll() is None:
            broker.kill()
    return rows, counters


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--subscribers", default="1,8,32")
    ap.add_argument("--seconds", type=float, default=2.0, help="per offered rate")
    ap.add_argument("--rates", default="25000,50000,100000,250000,500000,1000000,2000000,3000000,0",
                    help="offered rates, messages/s (0: as fast as the publisher can)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--publisher", choices=("gso", "socket"), default="gso")
    ap.add_argument("--json", help="write every run and the summary here")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # so that the namespaces are removed
    if os.geteuid() != 0:
        raise SystemExit("needs root (network namespaces, XDP, TC)")
    if (os.cpu_count() or 1) < 2:
        raise SystemExit("needs two CPUs (publisher on CPU 0, broker on CPU 1)")
    sizes = [int(x) for x in args.subscribers.split(",")]
    rates = [int(x) for x in args.rates.split(",")]
    plan = plan_parser(load_spec(SPEC))
    runs, counters = [], []
    with tempfile.TemporaryDirectory(prefix="subc-tput-") as tmp:
        work = Path(tmp)
        binary = build_udp_broker(work / "udp_broker")
        (work / "payloads").write_bytes(payloads_file(payloads()))
        topo = Topology(max(sizes), args.publisher)
        try:
            for n in sizes:
                (work / f"rules{n}.sub").write_text(rules_for(n) + "\n")
                sh(*SUBC, "compile", str(work / f"rules{n}.sub"), "--spec", str(SPEC), "--target", "ebpf",
                   "-o", str(work / f"out{n}"))
                (work / f"subs{n}.toml").write_text(subscribers_toml(topo, n))
                doc = json.loads((work / f"out{n}" / "maps.json").read_text())
                eps = {k: [(f"10.21.{k}.2", SUB_PORT)] for k in range(1, n + 1)}
                (work / f"tables{n}").write_text(tables_text(doc, plan, PORT, eps))
            print(f"{'subs':>5} {'broker':>7} {'offered/s':>10} {'published/s':>12} {'delivered msg/s':>16} "
                  f"{'copies/s':>11}", flush=True)
            for rep in range(args.repeat):
                for n in sizes:
                    for kind in ("ebpf", "user"):
                        rows, c = measure(kind, n, topo, binary, work, args.seconds, args.publisher, rates)
                        for r in rows:
                            r["repeat"] = rep
                            print(f"{n:>5} {kind:>7} {r['offered_rate'] or 'max':>10} {r['publisher_msgs_per_s']:>12,.0f} "
                                  f"{r['msgs_per_s']:>16,.0f} {r['copies_per_s']:>11,.0f}", flush=True)
                        runs += rows
                        counters.append({"broker": kind, "subscribers": n, "repeat": rep, "counters": c})
        finally:
            topo.remove()
    summary = []
    top = 0 if 0 in rates else max(rates)  # the highest offered load
    print(f"\npeak delivered msg/s over the offered rates (median of {args.repeat} repeats), and at the highest load")
    print(f"{'subs':>5} {'eBPF peak':>11} {'user peak':>11} {'ratio':>6} {'eBPF @max':>11} {'user @max':>11} {'ratio':>6}")
    for n in sizes:
        def pick(kind, fn, n=n):
            return statistics.median(fn([r["msgs_per_s"] for r in runs if r["subscribers"] == n and r["broker"] == kind
                                         and r["repeat"] == rep and (fn is max or r["offered_rate"] == top)])
                                     for rep in range(args.repeat))
        ep, up = pick("ebpf", max), pick("user", max)
        em, um = pick("ebpf", min), pick("user", min)
        summary.append({"subscribers": n, "ebpf_peak_msgs_per_s": round(ep), "user_peak_msgs_per_s": round(up),
                        "peak_ratio": round(ep / up, 2), "ebpf_at_max_load": round(em), "user_at_max_load": round(um),
                        "ratio_at_max_load": round(em / um, 2)})
        print(f"{n:>5} {ep:>11,.0f} {up:>11,.0f} {ep / up:>6.2f} {em:>11,.0f} {um:>11,.0f} {em / um:>6.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "summary": summary, "runs": runs,
                                               "broker_counters": counters}, indent=1))


if __name__ == "__main__":
    main()
