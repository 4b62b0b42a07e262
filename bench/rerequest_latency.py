#!/usr/bin/env python3
"""Re-request latency: how long subc's MoldUDP64 request server takes to answer a subscriber's
re-request for 1 and for 100 messages, p50/p99/max, at 32 subscribers, with and without the feed
running (issue 40).

Topology (network namespaces made here, removed afterwards; addresses only inside them), as
bench/broker_throughput.py's::

    per-subscriber:  publisher (rlpub, CPU 0) --veth-- broker (rlbrk, CPU 1) ==32 veths== sinks (rlsnk)
    shared:          publisher (rlpub, CPU 0) --veth-- broker (rlbrk, CPU 1) --1 veth-- sinks (rlsnk, 32 addresses)

Broker: ``subc load OUT --iface rlb0 --subscribers FILE --journal --rerequest 0.0.0.0:9100
--rerequest-rate 1000000`` (journals in memory, ``--retain 256MiB``), the recovery service pinned to
CPU 1 with taskset, the feed veth's threaded NAPI kthread too (with ``subc fanout`` on CPU 1 in the
per-subscriber topology, as broker_throughput runs it).  The request rate limit is raised so that
it never answers for the server: requests go one at a time, as fast as they are answered.

Workload: broker_throughput's (the real sample's 12,012 messages re-timed and packed as a live
feed, 2,072 datagrams), published by ``bench/xdp_publisher.py`` (the default; ``--publisher
socket``: ``udp_broker publish``, which sleeps between sends instead of spinning) on CPU 0 at
``--rate`` messages/s (the XDP publisher counts exactly the frames the broker's veth took; the
socket publisher counts what its socket took, and UDP drops silently what the veth's full queue
refuses, so its figure is an upper bound).  Subscriber 1, whose endpoint the client is, takes every Add Order (5,000
of the sample's 12,012 messages); subscribers 2 to 32 have broker_throughput's two rules each.

Sinks: an XDP program on every sink veth counts the copies and keeps, per subscriber endpoint,
the sequence number after the last one received; it drops the copies and passes to the stack only
what comes from the request server's port (its answers and cookies), so the client's socket sees
nothing else.

Client (this process, pinned to ``--client-cpu``, by default CPU 0, the publisher's): a UDP socket
in the sinks' namespace bound at subscriber 1's endpoint (a request is answered only from the
journal of the subscriber receiving at its source address).  It proves its address once (a
request, the 20-byte cookie packet, the cookie appended to every later request; a new cookie
packet, after the server's two-minute secret change, is taken and the request repeated, counted
as ``cookie_refreshes``).  Then, one at a time, alternating, requests for 1 and for 100 messages of
subscriber 1's stream at a sequence number it has received (drawn at random from the 200,000
before the sinks' last one, at least 20,000 behind it, so that the journal holds them):
``time.perf_counter_ns()`` before ``sendto`` and after the ``recvfrom`` of the answer, recognised
by its sequence number (a packet from the server that does not start inside the range asked is a
late answer to an earlier request and skipped).  A request for 100 messages is answered in part
(one packet of at most 1,400 bytes: 36 Add Orders): the first answer's message count is reported.
Unanswered after ``--timeout``: counted, not timed.

Phases: the feed fills the journals for ``--fill`` seconds (then the journal service catches up:
``subc stats`` shows it journaled up to the kernel's numbers); then **idle** (no feed) and **feed**
(the publisher running at ``--rate`` for ``--seconds``, requests from 0.5 s after the sinks see its
feed to 0.3 s before it ends), each with at most ``--requests`` requests of each count.  Reported per
phase and count: requests, p50, p99, max and mean (microseconds), the first answers' message
counts, timeouts; and the feed's published rate, the broker's ``journal_lost`` and the request
server's counters.

    sudo python3 bench/rerequest_latency.py --requests 5000 --seconds 10 --json out.json
"""

from __future__ import annotations

import argparse
import ctypes as ct
import json
import math
import os
import random
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from broker_throughput import SESSION, in_ns, loadavg, mac_of, on_signal, rules_for, sh, workload  # noqa: E402
from udp_tables import build_udp_broker, payloads_file  # noqa: E402

from subc.workloads.itch_codec import decode_add_order, read_binaryfile  # noqa: E402

PUB, BRK, SNK = "rlpub", "rlbrk", "rlsnk"
FEED_PORT = 26400  # the example spec's ITCH_UDP_PORT
RR_PORT = 9100
SUB_PORT = 5001
N_SUBS = 32
SPEC = ROOT / "examples/itch/spec.p4"
SAMPLE = ROOT.parent / "shared/data/itch/ex20101224.TEST_ITCH_50"
SUBC = [sys.executable, "-m", "subc.cli"]
CLONE_NEWNET = 0x40000000
COOKIE_COUNT = 0xFFFE
BROKER_CPU = 1
WINDOW, LAG = 200_000, 20_000  # requests start within WINDOW messages before the last received, LAG behind it

SINK_PROG = r"""
#include <uapi/linux/if_ether.h>
#include <uapi/linux/ip.h>
#include <uapi/linux/udp.h>
BPF_PERCPU_ARRAY(sink_cnt, u64, 3);   /* copies, messages, passed (from the request server) */
BPF_HASH(sink_next, u64, u64, 1024);  /* (IPv4 destination, UDP port) -> the sequence number after the last received */
static __always_inline void add(u32 i, u64 n) { u64 *c = sink_cnt.lookup(&i); if (c) *c += n; }
int sink(struct xdp_md *ctx) {
    void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
    struct ethhdr *eth = data;
    if ((void *)(eth + 1) > end || eth->h_proto != htons(ETH_P_IP)) return XDP_DROP;
    struct iphdr *ip = (void *)(eth + 1);
    if ((void *)(ip + 1) > end || ip->protocol != 17) return XDP_DROP;
    struct udphdr *udp = (void *)ip + ip->ihl * 4;
    if ((void *)(udp + 1) > end) return XDP_DROP;
    if (udp->source == htons(RR_PORT)) { add(2, 1); return XDP_PASS; }
    unsigned char *m = (void *)(udp + 1);
    if ((void *)(m + 20) > end) return XDP_DROP;
    u64 count = ((u64)m[18] << 8) | m[19], seq = 0;
    if (count == 0 || count >= 0xfffe) return XDP_DROP;
    for (int i = 10; i < 18; i++) seq = (seq << 8) | m[i];
    add(0, 1);
    add(1, count);
    u64 key = ((u64)ip->daddr << 16) | udp->dest, next = seq + count;
    u64 *nx = sink_next.lookup(&key);
    if (!nx) sink_next.update(&key, &next); else if (next > *nx) *nx = next;
    return XDP_DROP;
}
"""


class InNetns:
    """Context: this thread in network namespace ``ns`` (sockets made meanwhile stay in it)."""

    def __init__(self, ns: str):
        self.ns = ns
        self.libc = ct.CDLL(None, use_errno=True)

    def __enter__(self) -> None:
        self.own = os.open("/proc/self/ns/net", os.O_RDONLY)
        target = os.open(f"/run/netns/{self.ns}", os.O_RDONLY)
        try:
            if self.libc.setns(target, CLONE_NEWNET):
                raise SystemExit(f"setns into {self.ns}: {os.strerror(ct.get_errno())}")
        finally:
            os.close(target)

    def __exit__(self, *exc) -> None:
        try:
            if self.libc.setns(self.own, CLONE_NEWNET):
                raise SystemExit("setns back failed")
        finally:
            os.close(self.own)


class Topology:
    """The namespaces and veths for :data:`N_SUBS` subscribers: ``shared`` False, a veth per
    subscriber (rlbK in the broker, 10.63.K.1/24; rlsK in the sinks, 10.63.K.2/24); True, one veth
    (rlb1/rls1, 10.63.0.1/16) with subscriber K at 10.63.K.2.  The feed: rlp0 10.62.0.1 to rlb0
    10.62.0.2.  The sink program (loaded in this process) on every sink veth."""

    def __init__(self, shared: bool):
        from subc.dataplane.ebpf.bpf import import_bcc

        self.shared = shared
        self.remove()
        for ns in (PUB, BRK, SNK):
            sh("ip", "netns", "add", ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "link", "add", "rlp0", "netns", PUB, "type", "veth", "peer", "name", "rlb0", "netns", BRK)
        sh("ip", "-n", PUB, "addr", "add", "10.62.0.1/24", "dev", "rlp0")
        sh("ip", "-n", BRK, "addr", "add", "10.62.0.2/24", "dev", "rlb0")
        for ns, dev in ((PUB, "rlp0"), (BRK, "rlb0")):
            sh("ip", "-n", ns, "link", "set", dev, "up")
        sh(*in_ns(PUB, "ethtool", "-K", "rlp0", "tso", "off", "tx", "off"))
        sh("ip", "netns", "exec", PUB, "tc", "qdisc", "replace", "dev", "rlp0", "root", "pfifo", "limit", "10000")
        sh(
            "ip",
            "-n",
            PUB,
            "neigh",
            "replace",
            "10.62.0.2",
            "lladdr",
            mac_of(BRK, "rlb0"),
            "dev",
            "rlp0",
            "nud",
            "permanent",
        )
        self.devs = list(range(1, 2 if shared else N_SUBS + 1))
        for k in self.devs:
            sh("ip", "link", "add", f"rlb{k}", "netns", BRK, "type", "veth", "peer", "name", f"rls{k}", "netns", SNK)
            sh("ip", "-n", BRK, "addr", "add", "10.63.0.1/16" if shared else f"10.63.{k}.1/24", "dev", f"rlb{k}")
            sh("ip", "-n", BRK, "link", "set", f"rlb{k}", "up")
            sh("ip", "-n", SNK, "link", "set", f"rls{k}", "up")
        self.macs, self.dev = {}, {}
        for k in range(1, N_SUBS + 1):
            d = 1 if shared else k
            self.dev[k] = f"rlb{d}"
            sh("ip", "-n", SNK, "addr", "add", f"10.63.{k}.2/{16 if shared else 24}", "dev", f"rls{d}")
            self.macs[k] = mac_of(SNK, f"rls{d}")
            sh(
                "ip",
                "-n",
                BRK,
                "neigh",
                "replace",
                f"10.63.{k}.2",
                "lladdr",
                self.macs[k],
                "dev",
                f"rlb{d}",
                "nud",
                "permanent",
            )
        for k in self.devs:  # the sinks drop ARP: the broker's addresses are static neighbours there
            gw = "10.63.0.1" if shared else f"10.63.{k}.1"
            sh(
                "ip",
                "-n",
                SNK,
                "neigh",
                "replace",
                gw,
                "lladdr",
                mac_of(BRK, f"rlb{k}"),
                "dev",
                f"rls{k}",
                "nud",
                "permanent",
            )
        sh(*in_ns(BRK, "ethtool", "-K", "rlb0", "gro", "on"))
        sh("ip", "netns", "exec", BRK, "sh", "-c", "echo 1 > /sys/class/net/rlb0/threaded")
        bcc = import_bcc()
        self.bpf = bcc.BPF(text=SINK_PROG, cflags=[f"-DRR_PORT={RR_PORT}"])
        fn = self.bpf.load_func("sink", bcc.BPF.XDP)
        with InNetns(SNK):
            for k in self.devs:
                bcc.BPF.attach_xdp(f"rls{k}", fn, 0)

    def gateway(self, k: int) -> str:
        """The broker's address towards subscriber ``k`` (where its requests go)."""
        return "10.63.0.1" if self.shared else f"10.63.{k}.1"

    def next_seq(self, ip: str, port: int) -> int:
        """The sequence number after the last one the endpoint (ip, port) received (0: none)."""
        daddr = int.from_bytes(socket.inet_aton(ip), "little")
        dport = int.from_bytes(port.to_bytes(2, "big"), "little")
        v = self.bpf["sink_next"].get(ct.c_uint64((daddr << 16) | dport))
        return v.value if v is not None else 0

    def counts(self) -> tuple[int, ...]:
        t = self.bpf["sink_cnt"]
        return tuple(sum(t[ct.c_int(i)]) for i in range(3))

    def pin_napi(self) -> None:
        pids = [ln.split()[0] for ln in sh("ps", "-eo", "pid,comm").splitlines() if "napi/rlb0-" in ln]
        if not pids:
            raise SystemExit("no NAPI kthread for rlb0: threaded NAPI unavailable")
        for pid in pids:
            sh("taskset", "-pc", str(BROKER_CPU), pid)

    @staticmethod
    def remove() -> None:
        if Path(f"/run/netns/{BRK}").exists():  # the broker's pins and state are keyed by its namespace
            subprocess.run(in_ns(BRK, *SUBC, "unload", "--iface", "rlb0"), capture_output=True)
        for ns in (PUB, BRK, SNK):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def subscribers_toml(topo: Topology) -> str:
    return "\n".join(
        f'[[subscriber]]\nid = {k}\nendpoints = [{{ ip = "10.63.{k}.2", port = {SUB_PORT}, mac = "{topo.macs[k]}", '
        f'iface = "{topo.dev[k]}" }}]\n'
        for k in range(1, N_SUBS + 1)
    )


def rules(sample: Path) -> str:
    """Subscriber 1: every Add Order; 2 to 32: broker_throughput's two rules each."""
    adds = [decode_add_order(m) for _, m in read_binaryfile(sample) if m[:1] in (b"A", b"F")]
    others = [ln for ln in rules_for(N_SUBS, adds).splitlines() if not ln.endswith(": fwd(1);")]
    return "\n".join(['add_order.buy_sell_indicator == "B" or add_order.buy_sell_indicator == "S" : fwd(1);', *others])


class Publisher:
    """The feed from the publisher's namespace on CPU 0, for ``seconds`` at ``rate`` messages/s."""

    def __init__(self, kind: str, binary: Path, work: Path, seconds: float, rate: int):
        if kind == "xdp":
            args = [
                sys.executable,
                str(ROOT / "bench/xdp_publisher.py"),
                str(work / "payloads"),
                "rlp0",
                mac_of(BRK, "rlb0"),
                "10.62.0.1",
                "10.62.0.2",
                str(FEED_PORT),
                str(seconds),
                str(rate),
            ]
        else:
            args = [
                str(binary),
                "publish",
                str(work / "payloads"),
                "10.62.0.2",
                str(FEED_PORT),
                str(seconds),
                "64",
                str(rate),
            ]
        self.p = subprocess.Popen(
            in_ns(PUB, "taskset", "-c", "0", *args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )

    def wait_started(self, topo: Topology, limit: float = 60.0) -> float:
        """Wait until the sinks count copies again (the feed is flowing); the monotonic time it began."""
        c0, end = topo.counts()[0], time.monotonic() + limit
        while topo.counts()[0] == c0:
            if self.p.poll() is not None or time.monotonic() > end:
                raise SystemExit(f"the feed did not start: {self.p.communicate()[1][-2000:]}")
            time.sleep(0.005)
        return time.monotonic()

    def result(self, timeout: float = 120) -> dict:
        out, err = self.p.communicate(timeout=timeout)
        if self.p.returncode:
            raise SystemExit(f"the publisher failed ({self.p.returncode}): {err.strip()}")
        return json.loads(out)

    def stop(self) -> None:
        if self.p.poll() is None:
            self.p.terminate()
            try:
                self.p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()


class Client:
    """Subscriber 1's endpoint: a UDP socket in the sinks' namespace; :meth:`request` times one."""

    def __init__(self, topo: Topology, timeout: float):
        self.topo = topo
        self.ip, self.port = "10.63.1.2", SUB_PORT
        with InNetns(SNK):
            self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((self.ip, self.port))
        self.sock.settimeout(timeout)
        self.server = (topo.gateway(1), RR_PORT)
        self.session = SESSION.encode().ljust(10)
        self.cookie = b""
        self.cookie_refreshes = self.stray = 0

    def prove(self) -> None:
        """Get the address cookie (a request without one is answered with the cookie packet)."""
        self.sock.sendto(struct.pack(">10sQH", self.session, 1, 1), self.server)
        while True:
            data = self.sock.recv(2048)
            if len(data) == 20 and struct.unpack_from(">H", data, 18)[0] == COOKIE_COUNT:
                self.cookie = data[10:18]
                return

    def request(self, seq: int, count: int) -> tuple[int, int, int] | None:
        """(nanoseconds from sendto to the answer, the answer's first sequence number, its message
        count) of a request for ``count`` messages from ``seq``; None when unanswered in time."""
        req = struct.pack(">10sQH", self.session, seq, count) + self.cookie
        sock, server = self.sock, self.server
        t0 = time.perf_counter_ns()
        sock.sendto(req, server)
        while True:
            try:
                data = sock.recv(2048)
            except socket.timeout:
                return None
            t1 = time.perf_counter_ns()
            if len(data) < 20:
                self.stray += 1
                continue
            first, n = struct.unpack_from(">QH", data, 10)
            if len(data) == 20 and n == COOKIE_COUNT:  # a new secret: the new cookie, the request again
                self.cookie = data[10:18]
                self.cookie_refreshes += 1
                req = req[:20] + self.cookie
                sock.sendto(req, server)
                continue
            if seq <= first < seq + count:
                return t1 - t0, first, n
            self.stray += 1  # a late answer to an earlier request


def percentile(xs: list[float], p: float) -> float:
    """The nearest-rank ``p``-th percentile of ``xs``."""
    s = sorted(xs)
    return s[min(len(s), max(1, math.ceil(p / 100 * len(s)))) - 1]


def run_phase(
    client: Client,
    topo: Topology,
    requests: int,
    until: float,
    rng: random.Random,
    feed: subprocess.Popen | None = None,
) -> dict:
    """Requests for 1 and 100 messages, alternating, at most ``requests`` of each, until the
    monotonic time ``until`` (and while the publisher ``feed``, if any, runs)."""
    out = {c: {"ns": [], "at": [], "answer_messages": [], "started_later": 0, "timeouts": 0} for c in (1, 100)}
    start = time.monotonic_ns()
    for i in range(2 * requests):
        if time.monotonic() >= until or (feed is not None and feed.poll() is not None):
            break
        count = 1 if i % 2 == 0 else 100
        hi = topo.next_seq(client.ip, client.port)
        lo = max(1, hi - WINDOW)
        top = hi - LAG - count
        if top < lo:
            raise SystemExit(f"subscriber 1 received too little ({hi - 1} messages) to re-request: fill longer")
        seq = rng.randint(lo, top)
        got = client.request(seq, count)
        r = out[count]
        if got is None:
            r["timeouts"] += 1
            continue
        ns, first, n = got
        r["ns"].append(ns)
        r["at"].append(time.monotonic_ns() - start)
        r["answer_messages"].append(n)
        r["started_later"] += first != seq
    return out


def describe(r: dict) -> dict:
    us = [x / 1000 for x in r["ns"]]
    n = r["answer_messages"]
    return {
        "requests": len(us) + r["timeouts"],
        "answered": len(us),
        "timeouts": r["timeouts"],
        "p50_us": percentile(us, 50) if us else None,
        "p99_us": percentile(us, 99) if us else None,
        "max_us": max(us) if us else None,
        "mean_us": statistics.fmean(us) if us else None,
        "over_1ms": sum(x > 1000 for x in us),
        "answer_messages_min": min(n) if n else None,
        "answer_messages_median": statistics.median(n) if n else None,
        "answer_messages_max": max(n) if n else None,
        "started_later": r["started_later"],
    }


def broker_stats() -> dict:
    return json.loads(sh(*in_ns(BRK, *SUBC, "stats", "--iface", "rlb0", "--json")))


def caught_up(stats: dict) -> bool:
    """Whether the journal service's last status journaled up to every subscriber's kernel number."""
    svc = (stats.get("journal") or {}).get("service") or {}
    mine = svc.get("subscribers") or {}
    return bool(mine) and all(
        (mine.get(sid) or {}).get("next_seq") == c.get("next_seq")
        for sid, c in (stats.get("subscribers") or {}).items()
        if sid.isdigit()
    )


def wait_caught_up(limit: float = 120.0) -> float:
    """Wait until the journal service has journaled everything sent (its status is written every
    second); the seconds it took."""
    t0 = time.monotonic()
    while not caught_up(broker_stats()):
        if time.monotonic() - t0 > limit:
            raise SystemExit(f"the journal service did not catch up in {limit:.0f} s")
        time.sleep(0.2)
    return time.monotonic() - t0


def journal_figures(stats: dict) -> dict:
    svc = (stats.get("journal") or {}).get("service") or {}
    sub1 = (svc.get("subscribers") or {}).get("1") or {}
    return {
        "journal_lost_copies": stats.get("stats", {}).get("journal_lost", 0),
        "subscriber_1": {k: sub1.get(k) for k in ("first_seq", "next_seq", "hole_messages")},
        "rerequest": svc.get("rerequest"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=2000, help="requests of each count per phase, at most")
    ap.add_argument("--rate", type=int, default=1_000_000, help="the feed, messages/s (0: as fast as it can)")
    ap.add_argument("--seconds", type=float, default=10.0, help="the feed phase's length")
    ap.add_argument("--fill", type=float, default=2.0, help="seconds of feed before the idle phase")
    ap.add_argument("--timeout", type=float, default=0.5, help="seconds a request waits for its answer")
    ap.add_argument("--publisher", choices=("xdp", "socket"), default="xdp")
    ap.add_argument("--topology", choices=("shared", "per-subscriber"), default="shared")
    ap.add_argument("--client-cpu", type=int, default=0, help="the CPU of the client (this process)")
    ap.add_argument("--seed", type=int, default=40)
    ap.add_argument("--sample", default=str(SAMPLE), help="a BinaryFILE of ITCH 5.0 messages")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root (network namespaces, XDP, TC)")
    if (os.cpu_count() or 1) < 2:
        raise SystemExit("needs two CPUs (publisher and client on CPU 0, broker on CPU 1)")
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    payloads, shape = workload(Path(args.sample))
    print(f"workload: {shape}", flush=True)
    rng = random.Random(args.seed)
    result: dict = {"args": vars(args), "workload": shape, "loadavg_before": loadavg()}
    service = daemon = pub = None
    with tempfile.TemporaryDirectory(prefix="subc-rl-") as tmp:
        work = Path(tmp)
        binary = build_udp_broker(work / "udp_broker")
        (work / "payloads").write_bytes(payloads_file(payloads))
        (work / "rules.sub").write_text(rules(Path(args.sample)) + "\n")
        sh(*SUBC, "compile", str(work / "rules.sub"), "--spec", str(SPEC), "--target", "ebpf", "-o", str(work / "out"))
        topo = None
        try:
            topo = Topology(shared=args.topology == "shared")
            (work / "subs.toml").write_text(subscribers_toml(topo))
            err = work / "service.stderr"
            with open(err, "w") as ef:
                service = subprocess.Popen(
                    in_ns(
                        BRK,
                        "taskset",
                        "-c",
                        str(BROKER_CPU),
                        *SUBC,
                        "load",
                        str(work / "out"),
                        "--iface",
                        "rlb0",
                        "--subscribers",
                        str(work / "subs.toml"),
                        "--journal",
                        "--journal-pages",
                        "16384",
                        "--segment-bytes",
                        "16MiB",
                        "--retain",
                        "256MiB",
                        "--rerequest",
                        f"0.0.0.0:{RR_PORT}",
                        "--rerequest-rate",
                        "1000000",
                    ),
                    stdout=subprocess.DEVNULL,
                    stderr=ef,
                    cwd=ROOT,
                )
                end = time.monotonic() + 120
                while "journal feed running" not in err.read_text():
                    if service.poll() is not None or time.monotonic() > end:
                        raise SystemExit(f"subc load --journal did not start: {err.read_text()[-2000:]}")
                    time.sleep(0.1)
            if not topo.shared:
                daemon = subprocess.Popen(
                    in_ns(BRK, "taskset", "-c", str(BROKER_CPU), *SUBC, "fanout", "--iface", "rlb0"),
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            topo.pin_napi()
            os.sched_setaffinity(0, {args.client_cpu})
            client = Client(topo, args.timeout)
            # fill the journals, then prove the address
            fill = Publisher(args.publisher, binary, work, args.fill, args.rate).result()
            catch_up = wait_caught_up()
            time.sleep(1.0)  # a status write later: the service is idle
            client.prove()
            result["fill"] = {**fill, "journal_caught_up_after_s": catch_up}
            print(
                f"fill: {fill['messages']:,} messages in {fill['seconds']:.2f} s; subscriber 1 received "
                f"{topo.next_seq(client.ip, client.port) - 1:,}; the journal caught up {catch_up:.1f} s after",
                flush=True,
            )
            phases = {}
            idle = run_phase(client, topo, args.requests, time.monotonic() + args.seconds, rng)
            phases["idle"] = {str(c): describe(r) for c, r in idle.items()}
            stats0 = journal_figures(broker_stats())
            c0 = topo.counts()
            pub = Publisher(args.publisher, binary, work, args.seconds, args.rate)
            began = pub.wait_started(topo)  # the XDP publisher compiles its program first
            time.sleep(0.5)
            busy = run_phase(client, topo, args.requests, began + args.seconds - 0.3, rng, pub.p)
            published = pub.result()
            pub = None
            c1 = topo.counts()
            time.sleep(1.0)
            stats1 = journal_figures(broker_stats())
            phases["feed"] = {str(c): describe(r) for c, r in busy.items()}
            phases["feed"]["published"] = published
            phases["feed"]["published_msgs_per_s"] = published["messages"] / published["seconds"]
            phases["feed"]["delivered_copies"] = c1[0] - c0[0]
            phases["feed"]["delivered_msgs_per_s"] = (c1[1] - c0[1]) / published["seconds"]
            phases["feed"]["journal_lost_copies"] = stats1["journal_lost_copies"] - stats0["journal_lost_copies"]
            result.update(
                phases=phases,
                journal=stats1,
                cookie_refreshes=client.cookie_refreshes,
                stray_answers=client.stray,
                loadavg_after=loadavg(),
            )
        finally:
            if pub is not None:
                pub.stop()
            if daemon is not None:
                daemon.terminate()
                daemon.wait(timeout=10)
            if service is not None and service.poll() is None:
                service.send_signal(signal.SIGINT)
                try:
                    service.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    service.kill()
                    service.wait()
            Topology.remove()
    print(
        f"\n{'phase':>6} {'count':>5} {'answered':>8} {'timeouts':>8} {'p50 us':>8} {'p99 us':>8} {'max us':>9} "
        f"{'mean us':>8} {'> 1 ms':>6} {'msgs in answer min/med/max':>26}"
    )
    for phase in ("idle", "feed"):
        for c in ("1", "100"):
            d = result["phases"][phase][c]
            if not d["answered"]:
                print(f"{phase:>6} {c:>5} {0:>8} {d['timeouts']:>8}")
                continue
            msgs = f"{d['answer_messages_min']}/{d['answer_messages_median']:g}/{d['answer_messages_max']}"
            print(
                f"{phase:>6} {c:>5} {d['answered']:>8} {d['timeouts']:>8} {d['p50_us']:>8.1f} {d['p99_us']:>8.1f} "
                f"{d['max_us']:>9.1f} {d['mean_us']:>8.1f} {d['over_1ms']:>6} {msgs:>26}"
            )
    f = result["phases"]["feed"]
    print(
        f"feed: published {f['published_msgs_per_s']:,.0f} msg/s ({args.publisher} publisher), delivered "
        f"{f['delivered_msgs_per_s']:,.0f} msg/s to the 32 subscribers, {f['journal_lost_copies']} copies not "
        f"journaled; cookie refreshes {result['cookie_refreshes']}, late answers skipped {result['stray_answers']}"
    )
    print(f"request server: {result['journal']['rerequest']}")
    print(f"load average before/after: {result['loadavg_before']} -> {result['loadavg_after']}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
