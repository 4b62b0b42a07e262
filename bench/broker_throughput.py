#!/usr/bin/env python3
"""Throughput on veth with real-shaped datagrams: messages per second the eBPF broker and a
user-space broker deliver to 1, 8 and 32 subscribers, both measured in one run, and their ratio.

Topologies (network namespaces made here, removed afterwards; addresses only inside them)::

    per-subscriber:  publisher (tpub, CPU 0) --veth-- broker (tbrk, CPU 1) ==N veths== sink (tsnk, XDP counter)
    shared:          publisher (tpub, CPU 0) --veth-- broker (tbrk, CPU 1) --1 veth-- sink (tsnk, N addresses)

``per-subscriber``: each subscriber behind its own interface (containers or VMs on the broker's
host); ``shared``: every subscriber behind one link (hosts on the broker's LAN, the usual feed
handler deployment).  The eBPF broker fans a datagram out from XDP through device maps either way
(subc/dataplane/ebpf/fanout.py): on a shared link each copy is one clone; across interfaces a datagram
goes over its recipient set's device map, which ``subc fanout`` (run next to the broker, on its
CPU, unless ``--no-fanout-daemon``) makes after XDP first sees the set, each copy one clone; until
then, to TC, which builds the copies with bpf_clone_redirect.

Workload.  The messages of the real ITCH sample (``../shared/data/itch``, 12,012 messages of all
types: Add Orders, deletes, trades, executions...) in their order, re-timed by a bursty arrival
process (seeded: runs of messages 1, 5, 30 or 300 us apart on average, exponential gaps; see
:func:`retime`), then packed by the live-feed packer (``subc/workloads/feed.py``: a datagram
closes 100 us after its first message or at 1,400 bytes), so datagrams hold 1 to 43 messages as
a feed does between quiet periods and the open: 2,072 datagrams, 5.8 messages each on average
(median 2, 90th percentile 20), two thirds of the messages in datagrams of 10 or more.  Subscriber k of N has two rules: Add Orders of one symbol at or above
a price, and of another symbol of at least some shares (symbols, prices and share thresholds drawn
per subscriber, seeded, from the sample's values), so each message goes to its own subset of the
subscribers and copies differ: every subscriber of at least one message of a datagram gets one
datagram with exactly its messages, its own sequence number and count (docs/ebpf.md "Delivery
semantics").  Non-Add-Order messages go to no one.

* Publisher, pinned to CPU 0, for ``--seconds`` per offered rate of ``--rates`` (messages/s; 0: as
  fast as it can), the datagrams round robin, with complete IPv4 and UDP checksums; the same for
  both brokers (``--publisher``):
  - ``xdp`` (the default): ``bench/xdp_publisher.py`` injects the datagrams as prebuilt Ethernet
    frames from XDP (BPF_PROG_TEST_RUN in live-frames mode, each run redirecting the next frame
    to the publisher's veth), as a NIC traffic generator does (xdp-trafficgen).  They reach the
    broker veth's XDP ring as XDP frames, as a NIC's receive ring hands frames to XDP: no socket
    buffer is made, and the eBPF broker's XDP program gets them directly (the user-space broker's
    veth builds the socket buffers in its NAPI, on the broker's CPU, as a NIC driver does).  The
    publisher paces itself in the kernel, frames evenly spaced.  Nothing pushes back: a frame that
    finds the broker veth's ring (256 frames) full is dropped, as by a NIC whose receive ring is
    full, and counted ("pub drops": the publisher veth's tx dropped); "published" counts only the
    frames the ring took and their messages (the publisher knows which were dropped), so "of
    expected" is the broker's own loss.
  - ``socket``: ``udp_broker publish`` (C) sends them with ``sendmmsg`` through a UDP socket (tx
    checksum offload off, as a NIC on a wire).  The publisher's veth has TSO off (frames go to the
    broker's NAPI ring) and a pfifo queue (a full ring pushes back instead of dropping, Linux
    6.16+).  Every frame then reaches the broker as a socket buffer, which veth must copy into an
    XDP buffer for the eBPF broker's program (``skb_pp_cow_data``), a cost no NIC has, and when the
    ring is full the broker's CPU ends up dequeuing the publisher's queue; it tops out at about
    3.7M messages/s (640K datagrams/s) here.
* Broker, on CPU 1 only: the broker veth has GRO on and threaded NAPI, its NAPI kthread pinned to
  CPU 1, so everything after the publisher's transmit (XDP and TC programs, or the kernel UDP
  path, the user-space broker process, also pinned to CPU 1, and its sends, and the sinks' XDP)
  runs on one core.  Both brokers get the same core and the same input.
  - eBPF: ``subc load OUT --iface tb0 --subscribers FILE``.
  - user space: ``udp_broker broker`` (C): ``recvmmsg`` batches of 64, every message classified
    with the same compiled tables (``maps.json`` flattened by ``udp_tables.py``), one datagram per
    subscriber holding exactly its messages with its own sequence number (the same repacking,
    tested against an independent reference in tests/test_udp_baseline.py), one ``sendmmsg`` per
    batch for all copies.
* Sinks: every subscriber veth peer runs an XDP program that counts the copies, the messages in
  them (MoldUDP64 count), and copies that arrive out of order (a sequence number below one already
  seen on that veth), then drops them.  Copies the broker's subscriber veths refused ("copy drops":
  XDP-redirected frames that found the peer's 256-frame ring full, ``ethtool -S``
  ``xdp_xmit_errors``, plus socket buffers dropped on transmit) are counted per row: on a shared
  link a NAPI poll of 64 datagrams queues up to 64 x (recipients) clones to one peer before its
  NAPI runs, on the same CPU, so a veth loses what a NIC's larger, concurrently drained transmit
  ring would send.

Delivered messages/s = messages inside copies counted by the sinks / seconds of publishing; "of
expected" = delivered messages / (published messages x the share the subscribers should get).
Per repeat and subscriber count, each broker's peak over the offered rates (a socket broker
livelocks when offered more than it can take, so its peak is fairer to it than its rate at full
load), and the ratio of the two peaks of that repeat; the summary gives the median and the range
over the repeats, and the load average (``/proc/loadavg``) before and after, since the machine may
be shared.  The JSON output records the publisher (``publisher``, and per row).

``--journal`` adds the eBPF broker with its journal (``subc load --journal``, the recovery service
on ``--journal-cpu``) side by side, and its cost: 1 - its peak / the eBPF broker's.  ``--profile``
records per row each BPF program's runs and ns per run (``kernel.bpf_stats_enabled``, read with
``bpftool``, Debian's package), CPU 1's time by kind and the service's CPU share; ``--napi-fifo``
makes the broker input's NAPI thread real-time, so that the data path never waits for a process
(what the journal then costs is the kernel's share; the service gets what is left).

``--competitor`` runs a CPU-bound process pinned to CPU 1 while each broker is measured (a busy
host: both brokers then share their core with it under the scheduler's fair share; the eBPF
broker's work is all in the NAPI thread, the user-space broker's in the NAPI thread and its own
process, so a fair scheduler gives the latter two shares of three and the former one of two).
``--minimal`` adds the minimal XDP fan-out of ``bench/copy_ceiling.py`` (every datagram cloned to
every subscriber, nothing classified or rewritten) as a third broker: its peak copies/s is what
the veths carry on this machine, and the summary gives the eBPF broker's peak copies/s as a share
of it.

    sudo python3 bench/broker_throughput.py --subscribers 1,8,32 --repeat 3 --json out.json
"""

from __future__ import annotations

import argparse
import atexit
import ctypes as ct
import json
import os
import random
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

from copy_ceiling import MinimalFanout  # noqa: E402
from udp_tables import build_udp_broker, payloads_file, tables_text  # noqa: E402

from subc.dataplane.ebpf.links import in_netns  # noqa: E402
from subc.lang.rules import parse_rules  # noqa: E402
from subc.spec.front_end import load_spec  # noqa: E402
from subc.backends.ebpf.parse_plan import plan_parser  # noqa: E402
from subc.semantics.delivery import Delivery, recipients_of  # noqa: E402
from subc.semantics.reference import reference_decision  # noqa: E402
from subc.workloads.feed import feed_datagrams  # noqa: E402
from subc.workloads.itch_codec import decode_add_order, read_binaryfile, stock_symbol  # noqa: E402

PUB, BRK, SNK = "tpub", "tbrk", "tsnk"
PORT = 26400
SUB_PORT = 5001
SPEC = ROOT / "examples/itch/spec.p4"
SAMPLE = ROOT.parent / "shared/data/itch/ex20101224.TEST_ITCH_50"
SUBC = [sys.executable, "-m", "subc.cli"]
SESSION = "BENCH00001"

# The sinks: count copies, messages and out-of-order copies per veth, then drop.
SINK_PROG = r"""
#include <uapi/linux/if_ether.h>
#include <uapi/linux/ip.h>
#include <uapi/linux/udp.h>
struct sink_next { u64 seq; };
BPF_PERCPU_ARRAY(sink_cnt, u64, 4);       /* copies, messages, out of order, not MoldUDP64 */
BPF_HASH(sink_seq, u64, struct sink_next, 1024);  /* per subscriber (IPv4 destination, UDP port): the highest sequence number seen + count */
static __always_inline void add(u32 i, u64 n) { u64 *c = sink_cnt.lookup(&i); if (c) *c += n; }
int sink(struct xdp_md *ctx) {
    void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
    struct ethhdr *eth = data;
    if ((void *)(eth + 1) > end || eth->h_proto != htons(ETH_P_IP)) return XDP_DROP;
    struct iphdr *ip = (void *)(eth + 1);
    if ((void *)(ip + 1) > end || ip->protocol != 17) return XDP_DROP;
    struct udphdr *udp = (void *)ip + ip->ihl * 4;
    if ((void *)(udp + 1) > end) return XDP_DROP;
    unsigned char *m = (void *)(udp + 1);
    if ((void *)(m + 20) > end) { add(3, 1); return XDP_DROP; }
    u64 count = ((u64)m[18] << 8) | m[19], seq = 0;
    for (int i = 10; i < 18; i++) seq = (seq << 8) | m[i];
    add(0, 1);
    if (count != 0 && count != 0xffff) add(1, count); else count = 0;
    u64 key = ((u64)ip->daddr << 16) | udp->dest;
    struct sink_next *nx = sink_seq.lookup(&key);
    if (!nx) { struct sink_next z = {seq + count}; sink_seq.update(&key, &z); return XDP_DROP; }
    if (seq < nx->seq) add(2, 1); else nx->seq = seq + count;
    return XDP_DROP;
}
"""


def sh(*args: str, check: bool = True) -> str:
    r = subprocess.run(list(args), capture_output=True, text=True)
    if check and r.returncode:
        raise SystemExit(f"{' '.join(args)} failed ({r.returncode}): {r.stderr.strip()}")
    return r.stdout


def in_ns(ns: str, *args: str) -> list[str]:
    return ["nsenter", f"--net=/run/netns/{ns}", *args]


def ifindex_of(ns: str, dev: str) -> int:
    return json.loads(sh("ip", "-n", ns, "-j", "link", "show", dev))[0]["ifindex"]


def mac_of(ns: str, dev: str) -> str:
    return json.loads(sh("ip", "-n", ns, "-j", "link", "show", dev))[0]["address"]


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def on_signal(*_) -> None:
    """SIGTERM or SIGINT: exit through the cleanup (the namespaces removed), which a second signal
    must not cut short."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    sys.exit(1)


class Sinks:
    """The counting XDP program on every sink veth (loaded in this process, attached inside the
    sink namespace through setns); :meth:`counts` reads (copies, messages, out of order)."""

    def __init__(self, devices: list[str]):
        from subc.dataplane.ebpf.bpf import import_bcc

        bcc = import_bcc()
        self.bpf = bcc.BPF(text=SINK_PROG)
        fn = self.bpf.load_func("sink", bcc.BPF.XDP)
        with in_netns(f"/run/netns/{SNK}"):
            for dev in devices:
                bcc.BPF.attach_xdp(dev, fn, 0)

    def counts(self) -> tuple[int, int, int]:
        t = self.bpf["sink_cnt"]
        return tuple(sum(t[ct.c_int(i)]) for i in range(3))

    def reset_order(self) -> None:
        self.bpf["sink_seq"].clear()


class Topology:
    """The namespaces and veths above for ``n`` subscribers: ``shared`` False, a veth per subscriber
    (tbK in the broker, tsK in the sink, 10.21.K.0/24); True, one veth (tb1/ts1, 10.21.0.0/16)
    with subscriber K at 10.21.K.2."""

    def __init__(self, n: int, shared: bool = False):
        self.n, self.shared = n, shared
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
        # (veth_skb_is_eligible_for_gro), with or without XDP, not to the publisher CPU's backlog;
        # complete UDP checksums, as from a NIC.
        sh(*in_ns(PUB, "ethtool", "-K", "tp0", "tso", "off", "tx", "off"))
        # a queue in front of the veth, so a full NAPI ring pushes back (Linux 6.16+) instead of dropping
        sh("ip", "netns", "exec", PUB, "tc", "qdisc", "replace", "dev", "tp0", "root", "pfifo", "limit", "10000")
        sh("ip", "-n", PUB, "neigh", "replace", "10.20.0.2", "lladdr", mac_of(BRK, "tb0"), "dev", "tp0", "nud",
           "permanent")
        self.macs, self.dev = {}, {}
        for k in range(1, (1 if shared else n) + 1):
            sh("ip", "link", "add", f"tb{k}", "netns", BRK, "type", "veth", "peer", "name", f"ts{k}", "netns", SNK)
            sh("ip", "-n", BRK, "addr", "add", "10.21.0.1/16" if shared else f"10.21.{k}.1/24", "dev", f"tb{k}")
            sh("ip", "-n", BRK, "link", "set", f"tb{k}", "up")
            sh("ip", "-n", SNK, "link", "set", f"ts{k}", "up")
        for k in range(1, n + 1):
            dev = 1 if shared else k
            self.dev[k] = f"tb{dev}"
            sh("ip", "-n", SNK, "addr", "add", f"10.21.{k}.2/{16 if shared else 24}", "dev", f"ts{dev}")
            self.macs[k] = mac_of(SNK, f"ts{dev}")
            sh("ip", "-n", BRK, "neigh", "replace", f"10.21.{k}.2", "lladdr", self.macs[k], "dev", f"tb{dev}", "nud",
               "permanent")
        # the broker's input: GRO on (veth NAPI in both configurations), threaded NAPI on CPU 1
        sh(*in_ns(BRK, "ethtool", "-K", "tb0", "gro", "on"))
        sh("ip", "netns", "exec", BRK, "sh", "-c", "echo 1 > /sys/class/net/tb0/threaded")  # sysfs of the netns
        self.sinks = Sinks([f"ts{k}" for k in range(1, (1 if shared else n) + 1)])

    def pin_napi(self) -> None:
        """Pin the broker input's NAPI kthread to CPU 1 (it exists once the device has NAPI)."""
        pids = [ln.split()[0] for ln in sh("ps", "-eo", "pid,comm").splitlines() if "napi/tb0-" in ln]
        if not pids:
            raise SystemExit("no NAPI kthread for tb0: threaded NAPI unavailable")
        for pid in pids:
            sh("taskset", "-p", "2", pid)
            if NAPI_FIFO:  # real-time: it preempts everything else on CPU 1 (--napi-fifo)
                sh("chrt", "-f", "-p", "50", pid)

    def copies_dropped(self) -> int:
        """Copies the broker's subscriber veths refused, summed: XDP-redirected frames that found the
        peer's 256-frame ring full (``ethtool -S``: ``xdp_xmit_errors``) and socket buffers dropped
        on transmit (``tx dropped``)."""
        n = 0
        for k in range(1, (1 if self.shared else self.n) + 1):
            for line in sh(*in_ns(BRK, "ethtool", "-S", f"tb{k}")).splitlines():
                name, _, value = line.strip().partition(":")
                if name.endswith("xdp_xmit_errors"):
                    n += int(value)
            n += json.loads(sh("ip", "-n", BRK, "-s", "-j", "link", "show", f"tb{k}"))[0]["stats64"]["tx"]["dropped"]
        return n

    def pub_dropped(self) -> int:
        return json.loads(sh("ip", "-n", PUB, "-s", "-j", "link", "show", "tp0"))[0]["stats64"]["tx"]["dropped"]

    @staticmethod
    def remove() -> None:
        if Path(f"/run/netns/{BRK}").exists():  # the broker's pins and state are keyed by its namespace
            subprocess.run(in_ns(BRK, *SUBC, "unload", "--iface", "tb0"), capture_output=True)
        for ns in (PUB, BRK, SNK):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


# -- workload ---------------------------------------------------------------------------------------

def retime(messages: list[bytes], seed: int = 11) -> list[bytes]:
    """The messages with new ITCH timestamps (bytes 5..11) from a bursty arrival process: runs of
    a geometric number of messages (mean 60), each run's gaps exponential with a mean of 1 us
    (30% of runs: a burst, as at the open), 5 us (30%), 30 us (25%) or 300 us (15%: quiet)."""
    rng = random.Random(seed)
    out, t, left, mean = [], 34_200_000_000_000, 0, 1_000  # from 9:30
    for m in messages:
        if left == 0:
            left = 1 + int(rng.expovariate(1 / 60))
            mean = rng.choices((1_000, 5_000, 30_000, 300_000), (0.3, 0.3, 0.25, 0.15))[0]
        left -= 1
        t += int(rng.expovariate(1 / mean))
        out.append(m[:5] + t.to_bytes(6, "big") + m[11:] if len(m) >= 11 else m)
    return out


def workload(sample: Path) -> tuple[list[bytes], dict]:
    """The datagrams' payloads and their size distribution."""
    msgs = retime([m for _, m in read_binaryfile(sample)])
    dgs = list(feed_datagrams(msgs, SESSION))
    sizes = sorted(len(d.messages) for d in dgs)
    q = lambda p: sizes[min(len(sizes) - 1, int(p * len(sizes)))]  # noqa: E731
    return [d.payload for d in dgs], {
        "datagrams": len(dgs), "messages": len(msgs), "mean_messages": round(len(msgs) / len(dgs), 2),
        "median": q(0.5), "p10": q(0.1), "p90": q(0.9), "max": sizes[-1],
        "messages_in_datagrams_of_10_or_more": round(sum(s for s in sizes if s >= 10) / len(msgs), 3),
        "mean_payload_bytes": round(sum(map(len, (d.payload for d in dgs))) / len(dgs))}


def rules_for(n: int, adds: list[dict], seed: int = 5) -> str:
    """Subscriber k of n: Add Orders of one symbol at or above a price, and of another symbol of at
    least some shares (thresholds drawn from the sample's own values, seeded)."""
    rng = random.Random(seed * 1000 + n)
    symbols = sorted({stock_symbol(a["add_order.stock"]) for a in adds})
    prices = sorted(a["add_order.price"] for a in adds)
    shares = sorted(a["add_order.shares"] for a in adds)
    out = []
    for k in range(1, n + 1):
        s1, s2 = rng.sample(symbols, 2)
        p = prices[int(rng.uniform(0.0, 0.7) * len(prices))]
        q = shares[int(rng.uniform(0.0, 0.7) * len(shares))]
        out.append(f'add_order.stock == "{s1}" and add_order.price >= {p / 10_000:.4f} : fwd({k});')
        out.append(f'add_order.stock == "{s2}" and add_order.shares >= {q} : fwd({k});')
    return "\n".join(out)


def expected_delivery(spec, rules_text: str, payloads: list[bytes], n: int) -> dict:
    """Per published message: messages and copies the subscribers should receive (the reference
    semantics), for one pass over the payloads."""
    rules = parse_rules(rules_text, spec, "bench.sub")

    def decide(m: bytes) -> set:
        if m[:1] in (b"A", b"F"):
            return recipients_of(reference_decision(rules, spec, decode_add_order(m)), broker=False)
        return set()

    ref = Delivery(decide, everyone=list(range(1, n + 1)))
    msgs = copies = published = 0
    for p in payloads:
        out = ref.datagram(p)
        published += int.from_bytes(p[18:20], "big")
        copies += len(out)
        msgs += sum(c.count for c in out.values())
    return {"delivered_per_published": msgs / published, "copies_per_datagram": copies / len(payloads),
            "messages_per_copy": msgs / max(copies, 1)}


def subscribers_toml(topo: Topology, n: int) -> str:
    return "\n".join(
        f'[[subscriber]]\nid = {k}\nendpoints = [{{ ip = "10.21.{k}.2", port = {SUB_PORT}, mac = "{topo.macs[k]}", '
        f'iface = "{topo.dev[k]}" }}]\n' for k in range(1, n + 1))


def publish(publisher: str, binary: Path, work: Path, seconds: float, rate: int) -> dict:
    """Run the publisher (``xdp`` or ``socket``) on CPU 0 for ``seconds`` at ``rate`` messages/s
    (0: as fast as it can)."""
    if publisher == "xdp":
        return json.loads(sh(*in_ns(PUB, "taskset", "-c", "0", sys.executable, str(ROOT / "bench/xdp_publisher.py"),
                                    str(work / "payloads"), "tp0", mac_of(BRK, "tb0"), "10.20.0.1", "10.20.0.2",
                                    str(PORT), str(seconds), str(rate))))
    return json.loads(sh(*in_ns(PUB, "taskset", "-c", "0", str(binary), "publish", str(work / "payloads"),
                                "10.20.0.2", str(PORT), str(seconds), "64", str(rate))))


def measure(kind: str, n: int, topo: Topology, binary: Path, work: Path, seconds: float,
            rates: list[int], load_args: str = "", publisher: str = "xdp",
            fanout_daemon: bool = True) -> tuple[list[dict], dict]:
    """Broker ``kind`` ('ebpf' or 'user') with ``n`` subscribers at each offered rate, from
    ``publisher``: one row per rate, and the broker's own counters over all of them.  With
    ``fanout_daemon``, the eBPF broker's ``subc fanout`` control loop runs on the broker's CPU."""
    broker = daemon = service = minimal = None
    hog = subprocess.Popen(["taskset", "-c", "1", sys.executable, "-c", "while True: pass"]) if COMPETITOR else None
    if kind == "minimal":  # veth's own ceiling: every datagram cloned to every subscriber (copy_ceiling.py)
        minimal = MinimalFanout(BRK, "tb0", [ifindex_of(BRK, topo.dev[k]) for k in range(1, n + 1)], PORT)
    elif kind == "journal":  # subc load --journal: the recovery service runs in the foreground, on the broker's CPU
        service = subprocess.Popen(in_ns(BRK, "taskset", "-c", str(JOURNAL_CPU), *SUBC, "load", str(work / f"out{n}"),
                                         "--iface",
                                         "tb0", "--subscribers", str(work / f"subs{n}.toml"), *load_args.split(),
                                         "--journal", "--journal-pages", str(JOURNAL_PAGES), "--segment-bytes", "4MiB",
                                         "--retain", "16MiB"),
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        said = ""
        while "XDP fan-out" not in said:
            line = service.stdout.readline()
            if not line:
                raise SystemExit(f"subc load --journal failed: {service.communicate()}")
            said += line
        if "journal feed running" not in service.stderr.readline():
            raise SystemExit(f"subc load --journal: no journal service: {service.communicate()}")
        if fanout_daemon and "XDP fan-out: on" in said:
            daemon = subprocess.Popen(in_ns(BRK, "taskset", "-c", "1", *SUBC, "fanout", "--iface", "tb0"),
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    elif kind == "ebpf":
        said = sh(*in_ns(BRK, *SUBC, "load", str(work / f"out{n}"), "--iface", "tb0", "--subscribers",
                         str(work / f"subs{n}.toml"), *load_args.split()))
        if fanout_daemon and "XDP fan-out: on" in said:  # subc load says whether the fan-out is on
            daemon = subprocess.Popen(in_ns(BRK, "taskset", "-c", "1", *SUBC, "fanout", "--iface", "tb0"),
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    elif kind == "user":
        broker = subprocess.Popen(in_ns(BRK, "taskset", "-c", "1", str(binary), "broker", str(work / f"tables{n}"),
                                        "10.20.0.2", str(PORT), "0", "64"), stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        if not broker.stderr.readline().startswith("udp_broker: listening"):
            raise SystemExit("the user-space broker did not start")
    rows = []
    try:
        topo.pin_napi()
        for rate in rates:
            topo.sinks.reset_order()
            (c0, m0, o0), drop0, lost0 = topo.sinks.counts(), topo.pub_dropped(), topo.copies_dropped()
            j0 = journal_counts() if kind == "journal" else None
            prof0 = cpu_profile(service.pid if service else None) if PROFILE else None
            pub = publish(publisher, binary, work, seconds, rate)
            prof = profile_delta(prof0, cpu_profile(service.pid if service else None), pub["seconds"]) \
                if PROFILE else None
            time.sleep(0.3)  # let the queues drain
            c1, m1, o1 = topo.sinks.counts()
            journal = None
            if j0 is not None:
                j1 = journal_counts()
                journal = {"copies_not_journaled": j1["lost_copies"] - j0["lost_copies"],
                           "messages_not_journaled": j1["lost_messages"] - j0["lost_messages"]}
            rows.append({"broker": kind, "subscribers": n, "publisher": publisher, "offered_rate": rate,
                         "competitor": COMPETITOR,
                         "published_datagrams": pub["sent"],
                         "published_messages": pub["messages"], "seconds": pub["seconds"],
                         "publisher_msgs_per_s": pub["messages"] / pub["seconds"],
                         "dropped_at_publisher": topo.pub_dropped() - drop0,
                         "messages_dropped_at_publisher": pub.get("dropped_messages", 0),
                         "publisher_output": pub, "copies": c1 - c0,
                         "copies_dropped_at_subscriber_veths": topo.copies_dropped() - lost0,
                         "delivered_messages": m1 - m0, "out_of_order_copies": o1 - o0,
                         "copies_per_s": (c1 - c0) / pub["seconds"], "msgs_per_s": (m1 - m0) / pub["seconds"],
                         **({"journal": journal} if journal is not None else {}),
                         **({"profile": prof} if prof is not None else {})})
        if kind in ("ebpf", "journal"):
            stats = json.loads(sh(*in_ns(BRK, *SUBC, "stats", "--iface", "tb0", "--json")))
            counters = {k: v for k, v in stats["stats"].items() if v}
            if kind == "journal":
                service.send_signal(signal.SIGINT)  # the service drains the ring and writes its last status
                service.communicate(timeout=60)
                stats = json.loads(sh(*in_ns(BRK, *SUBC, "stats", "--iface", "tb0", "--json")))
                svc = stats["journal"]["service"] or {}
                counters["journal_service"] = {"feed": svc.get("feed"), "held": svc.get("held"),
                                               "hole_messages": sum(x["hole_messages"]
                                                                    for x in svc.get("subscribers", {}).values()),
                                               "kernel_next_seq_total": sum(c["next_seq"] - 1 for k, c in
                                                                            stats["subscribers"].items() if k.isdigit()),
                                               "journal_next_seq_total": sum(x["next_seq"] - 1 for x in
                                                                             svc.get("subscribers", {}).values())}
        elif kind == "minimal":
            counters = minimal.counts()
        else:
            broker.terminate()
            counters = json.loads(broker.communicate(timeout=10)[0])
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()
        if minimal is not None:
            minimal.close()
        if daemon is not None:
            daemon.terminate()
            daemon.wait(timeout=10)
        if service is not None and service.poll() is None:
            service.kill()
            service.communicate()
        if kind in ("ebpf", "journal"):
            sh(*in_ns(BRK, *SUBC, "unload", "--iface", "tb0"), check=False)
        elif broker is not None and broker.poll() is None:
            broker.kill()
    return rows, counters


JOURNAL_PAGES = 16384  # the journal's ring buffer: 64 MiB (--journal-pages)
JOURNAL_CPU = 1  # the recovery service's CPU: the broker's (--journal-cpu)
PROFILE = False  # --profile
COMPETITOR = False  # --competitor
NAPI_FIFO = False  # --napi-fifo


def cpu_profile(service_pid: int | None) -> dict:
    """A snapshot for ``--profile``: each loaded BPF program's run count and run time (ns; kernel
    statistics, ``kernel.bpf_stats_enabled``, read with bpftool), CPU 1's time by kind (USER_HZ
    ticks, /proc/stat), and the recovery service's own CPU time (ticks, /proc/PID/stat)."""
    progs = {}
    for p in json.loads(sh("bpftool", "-j", "prog", "show")):
        if p.get("name", "").startswith(("subc", "xdp_", "tc_")) and "run_cnt" in p:
            key = f"{p['name']}#{p['id']}"
            progs[key] = (p["run_cnt"], p["run_time_ns"])
    fields = ("user", "nice", "system", "idle", "iowait", "irq", "softirq")
    cpu1 = next(ln.split()[1:8] for ln in Path("/proc/stat").read_text().splitlines() if ln.startswith("cpu1 "))
    svc = None
    if service_pid is not None:
        st = Path(f"/proc/{service_pid}/stat").read_text().rsplit(")", 1)[1].split()
        svc = int(st[11]) + int(st[12])  # utime + stime, the process's threads included
    return {"progs": progs, "cpu1": dict(zip(fields, map(int, cpu1))), "service": svc}


def profile_delta(a: dict, b: dict, seconds: float) -> dict:
    """What happened between two :func:`cpu_profile` snapshots: per program, runs and ns per run;
    CPU 1's share of each kind; the service's share of a CPU."""
    hz = os.sysconf("SC_CLK_TCK")
    progs = {}
    for k, (cnt, ns) in b["progs"].items():
        c0, n0 = a["progs"].get(k, (0, 0))
        if cnt > c0:
            progs[k] = {"runs": cnt - c0, "ns_per_run": round((ns - n0) / (cnt - c0), 1),
                        "cpu_share": round((ns - n0) / 1e9 / seconds, 3)}
    total = sum(b["cpu1"].values()) - sum(a["cpu1"].values()) or 1
    cpu1 = {k: round((b["cpu1"][k] - a["cpu1"][k]) / total, 3) for k in b["cpu1"]}
    svc = None
    if a["service"] is not None and b["service"] is not None:
        svc = round((b["service"] - a["service"]) / hz / seconds, 3)
    return {"progs": progs, "cpu1": cpu1, "service_cpu_share": svc}


def journal_counts() -> dict:
    """The broker's copies and messages sent but not journaled so far (``subc stats``)."""
    stats = json.loads(sh(*in_ns(BRK, *SUBC, "stats", "--iface", "tb0", "--json")))
    return {"lost_copies": stats["stats"].get("journal_lost", 0),
            "lost_messages": sum((stats.get("journal") or {}).get("lost_messages", {}).values())}


def brokers_of(args) -> list[str]:
    """The brokers measured, in order."""
    return (["ebpf"] + (["journal"] if args.journal else []) + ([] if args.no_user else ["user"])
            + (["minimal"] if args.minimal else []))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--subscribers", default="1,8,32")
    ap.add_argument("--seconds", type=float, default=2.0, help="per offered rate")
    ap.add_argument("--rates", default="250000,500000,750000,1000000,1500000,2000000,3000000,4000000,6000000,8000000",
                    help="offered rates, messages/s (0: as fast as the publisher can)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--sample", default=str(SAMPLE), help="a BinaryFILE of ITCH 5.0 messages")
    ap.add_argument("--json", help="write every run and the summary here")
    ap.add_argument("--topologies", default="per-subscriber,shared",
                    help="per-subscriber (a veth per subscriber) and/or shared (every subscriber behind one veth)")
    ap.add_argument("--load-args", default="", help="extra subc load options for the eBPF broker, e.g. --no-fanout")
    ap.add_argument("--no-fanout-daemon", action="store_true",
                    help="do not run subc fanout (the recipient-set device maps) next to the eBPF broker")
    ap.add_argument("--journal", action="store_true",
                    help="also measure the eBPF broker with its journal (subc load --journal: the recovery service "
                         "on the broker's CPU), side by side, and its cost")
    ap.add_argument("--no-user", action="store_true", help="skip the user-space broker")
    ap.add_argument("--minimal", action="store_true",
                    help="also the minimal XDP fan-out (bench/copy_ceiling.py): every datagram cloned to every "
                         "subscriber, nothing classified or rewritten; its copies/s are what the veths carry")
    ap.add_argument("--competitor", action="store_true",
                    help="run a CPU-bound process pinned to the broker's CPU (1) while each broker is measured")
    ap.add_argument("--journal-cpu", type=int, default=1,
                    help="the recovery service's CPU (1: the broker's, the fair setting; 0: the publisher's, "
                         "which shows what the kernel's side of the journal costs alone)")
    ap.add_argument("--publisher", choices=("xdp", "socket"), default="xdp",
                    help="xdp: frames injected from XDP (bench/xdp_publisher.py, the default); "
                         "socket: udp_broker publish (sendmmsg)")
    ap.add_argument("--profile", action="store_true",
                    help="per run: each BPF program's runs and ns per run (kernel.bpf_stats_enabled, bpftool), "
                         "CPU 1's time by kind and the recovery service's CPU share; the statistics cost two clock "
                         "reads per program run, which slows the broker (in this VM by about a tenth)")
    ap.add_argument("--napi-fifo", action="store_true",
                    help="run the broker input's NAPI thread SCHED_FIFO (priority 50): the data path then takes CPU 1 "
                         "before any process, which shows what the journal costs the kernel alone (the recovery "
                         "service gets what is left, and the copies it cannot take are counted as not journaled)")
    ap.add_argument("--journal-pages", type=int, default=16384,
                    help="pages of the journal's ring buffer (subc load --journal-pages)")
    args = ap.parse_args()
    topologies = args.topologies.split(",")
    if not set(topologies) <= {"per-subscriber", "shared"}:
        raise SystemExit(f"unknown topology in {args.topologies}")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # so that the namespaces are removed
    if os.geteuid() != 0:
        raise SystemExit("needs root (network namespaces, XDP, TC)")
    if (os.cpu_count() or 1) < 2:
        raise SystemExit("needs two CPUs (publisher on CPU 0, broker on CPU 1)")
    global JOURNAL_CPU, PROFILE, JOURNAL_PAGES, NAPI_FIFO, COMPETITOR
    JOURNAL_CPU, PROFILE, JOURNAL_PAGES, NAPI_FIFO = args.journal_cpu, args.profile, args.journal_pages, args.napi_fifo
    COMPETITOR = args.competitor
    if PROFILE:
        Path("/proc/sys/kernel/bpf_stats_enabled").write_text("1\n")
        atexit.register(Path("/proc/sys/kernel/bpf_stats_enabled").write_text, "0\n")
    sizes = [int(x) for x in args.subscribers.split(",")]
    rates = [int(x) for x in args.rates.split(",")]
    spec = load_spec(SPEC)
    plan = plan_parser(spec)
    payloads, shape = workload(Path(args.sample))
    adds = [decode_add_order(m) for _, m in read_binaryfile(Path(args.sample)) if m[:1] in (b"A", b"F")]
    print(f"workload: {shape}", flush=True)
    print(f"publisher: {args.publisher}", flush=True)
    runs, counters, expect, loads = [], [], {}, []
    with tempfile.TemporaryDirectory(prefix="subc-tput-") as tmp:
        work = Path(tmp)
        binary = build_udp_broker(work / "udp_broker")
        (work / "payloads").write_bytes(payloads_file(payloads))
        for n in sizes:
            text = rules_for(n, adds)
            (work / f"rules{n}.sub").write_text(text + "\n")
            expect[n] = expected_delivery(spec, text, payloads, n)
            print(f"{n} subscribers: {expect[n]}", flush=True)
            sh(*SUBC, "compile", str(work / f"rules{n}.sub"), "--spec", str(SPEC), "--target", "ebpf",
               "-o", str(work / f"out{n}"))
            doc = json.loads((work / f"out{n}" / "maps.json").read_text())
            eps = {k: [(f"10.21.{k}.2", SUB_PORT)] for k in range(1, n + 1)}
            (work / f"tables{n}").write_text(tables_text(doc, plan, PORT, eps))
        for topology in topologies:
            topo = Topology(max(sizes), shared=topology == "shared")
            try:
                for n in sizes:
                    (work / f"subs{n}.toml").write_text(subscribers_toml(topo, n))
                print(f"\ntopology {topology}", flush=True)
                print(f"{'rep':>3} {'subs':>5} {'broker':>7} {'offered/s':>10} {'published/s':>12} "
                      f"{'delivered msg/s':>16} {'copies/s':>11} {'of expected':>11} {'late':>6} {'pub drops':>9} {'copy drops':>10}",
                      flush=True)
                for rep in range(args.repeat):
                    for n in sizes:
                        before = loadavg()
                        kinds = brokers_of(args)
                        for kind in kinds:
                            rows, c = measure(kind, n, topo, binary, work, args.seconds, rates, args.load_args,
                                              args.publisher, not args.no_fanout_daemon)
                            for r in rows:
                                r["repeat"], r["topology"] = rep, topology
                                r["fraction_of_expected"] = r["delivered_messages"] / max(
                                    1, r["published_messages"] * expect[n]["delivered_per_published"])
                                jl = r.get("journal")
                                print(f"{rep:>3} {n:>5} {kind:>7} {r['offered_rate'] or 'max':>10} "
                                      f"{r['publisher_msgs_per_s']:>12,.0f} {r['msgs_per_s']:>16,.0f} "
                                      f"{r['copies_per_s']:>11,.0f} {r['fraction_of_expected']:>11.3f} "
                                      f"{r['out_of_order_copies']:>6} {r['dropped_at_publisher']:>9} "
                                      f"{r['copies_dropped_at_subscriber_veths']:>10}"
                                      + (f"  not journaled: {jl['copies_not_journaled']} copies" if jl else ""),
                                      flush=True)
                                if "profile" in r:
                                    pr = r["profile"]
                                    print("      " + "; ".join(f"{k.split('#')[0]} {v['runs']:,} x {v['ns_per_run']} ns"
                                                           f" = {v['cpu_share']:.2f} CPU"
                                                           for k, v in sorted(pr["progs"].items()))
                                          + f"; CPU 1: {pr['cpu1']}; service {pr['service_cpu_share']} CPU",
                                          flush=True)
                            runs += rows
                            counters.append({"topology": topology, "broker": kind, "subscribers": n, "repeat": rep,
                                             "counters": c})
                        loads.append({"topology": topology, "repeat": rep, "subscribers": n,
                                      "loadavg_before": before, "loadavg_after": loadavg()})
            finally:
                topo.remove()
    summary = []
    kinds = [k for k in brokers_of(args) if k != "minimal"]  # (the minimal one's messages are not a broker's)
    print(f"\npeak delivered msg/s over the offered rates, per repeat; median [min, max] over {args.repeat} repeats")
    print(f"{'topology':>15} {'subs':>5} " + " ".join(f"{k:>32}" for k in kinds)
          + (f" {'eBPF/user':>20}" if "user" in kinds else "")
          + (f" {'journal cost':>20} {'complete-journal peak':>24}" if "journal" in kinds else ""))
    fmt = lambda xs: f"{statistics.median(xs):>10,.0f} [{min(xs):,.0f}, {max(xs):,.0f}]"  # noqa: E731
    for topology in topologies:
        for n in sizes:
            def rows_of(kind, rep, n=n, topology=topology):
                return [r for r in runs if r["subscribers"] == n and r["broker"] == kind and r["repeat"] == rep
                        and r["topology"] == topology]
            peaks = {k: [max(r["msgs_per_s"] for r in rows_of(k, rep)) for rep in range(args.repeat)] for k in kinds}
            late = {k: sum(r["out_of_order_copies"] for rep in range(args.repeat) for r in rows_of(k, rep))
                    for k in kinds}
            row = {"topology": topology, "subscribers": n, **expect[n]}
            for k in kinds:
                row[f"{k}_peak_msgs_per_s"] = peaks[k]
                row[f"{k}_median"] = round(statistics.median(peaks[k]))
                row[f"{k}_out_of_order_copies"] = late[k]
            line = f"{topology:>15} {n:>5} " + " ".join(f"{fmt(peaks[k]):>32}" for k in kinds)
            if "user" in kinds:
                ratio = [a / b for a, b in zip(peaks["ebpf"], peaks["user"])]
                row.update(ratio=[round(x, 2) for x in ratio], ratio_median=round(statistics.median(ratio), 2))
                line += f" {statistics.median(ratio):>6.2f} [{min(ratio):.2f}, {max(ratio):.2f}]"
            if args.minimal:
                copies = {k: [max(r["copies_per_s"] for r in rows_of(k, rep)) for rep in range(args.repeat)]
                          for k in ("ebpf", "minimal")}
                use = [a / b for a, b in zip(copies["ebpf"], copies["minimal"])]
                row.update(ebpf_peak_copies_per_s=copies["ebpf"], minimal_peak_copies_per_s=copies["minimal"],
                           ebpf_share_of_ceiling=[round(x, 3) for x in use])
                line += f"  copies/s eBPF {statistics.median(copies['ebpf']):,.0f} of veth ceiling " \
                        f"{statistics.median(copies['minimal']):,.0f} ({statistics.median(use):.2f})"
            if "journal" in kinds:
                cost = [1 - j / e for j, e in zip(peaks["journal"], peaks["ebpf"])]
                complete = [max([r["msgs_per_s"] for r in rows_of("journal", rep)
                                 if r["journal"]["copies_not_journaled"] == 0] or [0.0]) for rep in range(args.repeat)]
                lost_at_peak = [max(rows_of("journal", rep), key=lambda r: r["msgs_per_s"])["journal"]
                                for rep in range(args.repeat)]
                row.update(journal_cost=[round(x, 3) for x in cost], journal_cost_median=round(statistics.median(cost), 3),
                           complete_journal_peak=complete, not_journaled_at_peak=lost_at_peak)
                line += f" {100 * statistics.median(cost):>9.1f}% [{100 * min(cost):.1f}, {100 * max(cost):.1f}]" \
                        f" {fmt(complete):>24}"
            summary.append(row)
            print(line)
    print("load average (1, 5, 15 min) before/after each subscriber count:",
          "; ".join(f"{x['topology']} {x['subscribers']}: {x['loadavg_before']} -> {x['loadavg_after']}"
                    for x in loads))
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "publisher": args.publisher, "workload": shape,
                                               "summary": summary,
                                               "loads": loads, "runs": runs, "broker_counters": counters}, indent=1))


if __name__ == "__main__":
    main()
