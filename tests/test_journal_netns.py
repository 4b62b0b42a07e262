"""The journal fed by the eBPF data plane, and recovery over a lossy link, in network namespaces.

``subc load --journal --state DIR --rerequest`` runs the broker with its recovery service; the
packed real sample is sent from the publisher namespace with scapy (as in test_delivery_netns).

* Every copy an endpoint received is in its subscriber's journal under the sequence number it was
  received with, and the journal holds nothing else: the journal files are read here with
  ``struct`` from the SoupBinTCP packet layout, the copies from the listeners' captures with
  ``struct`` from the MoldUDP64 layout, and the journal's messages are also checked against the
  reference (the rules evaluated on values the independent ITCH codec decoded).
* A lossy link: an XDP program on each subscriber's veth (compiled here with clang) drops 5% of the
  data datagrams to the endpoints' ports, at random (the kernel here has no netem:
  CONFIG_NET_SCH_NETEM is not set; reordering is tested on loopback in test_rerequest.py).
  ``subc listen --recover`` must deliver exactly the messages the reference gives its subscriber,
  once each, in sequence order, naming none lost; a listener without ``--recover`` on the same
  link shows the loss.

No verdict depends on speed: listeners end on the end of session (and, recovering, once every gap
is filled); the test waits for the journal service's status to reach the kernel's numbers.
"""

from __future__ import annotations

import json
import random
import re
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path

import pytest

from subc.lang.rules import parse_rules
from subc.semantics.delivery import recipients_of
from subc.semantics.reference import reference_decision
from subc.spec.front_end import load_spec
from subc.workloads.itch_codec import decode_add_order, read_binaryfile

from conftest import EXAMPLE, real_sample
from netns_util import Topology, call_in_netns, need_root_and_netns, sh, shared_bpffs
from test_broker_netns import HANG_GUARD, LISTENER_IDLE, broker_stats, compile_out, stop, wait_bound, wait_until
from test_delivery_netns import pack, send

ENDPOINTS = {1: [(1, 6001)], 2: [(2, 6002)], 3: [(3, 6003)], 4: [(1, 6004), (2, 6004)], 5: [(3, 6005)]}
ALL_EPS = sorted({ep for eps in ENDPOINTS.values() for ep in eps})
RR_PORT = 9100
LOSS_PER_MILLE = 50

LOSSY_C = r"""
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/udp.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
/* Drop LOSS_PER_MILLE of the MoldUDP64 data datagrams (count 1..0xfffe) to UDP ports 6000..6099,
 * at random; heartbeats and the end of session pass (a publisher repeats them). */
SEC("xdp")
int lossy(struct xdp_md *ctx)
{
    void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
    struct ethhdr *eth = data;
    struct iphdr *ip = data + sizeof(*eth);
    if ((void *)(ip + 1) > end || eth->h_proto != bpf_htons(ETH_P_IP) || ip->protocol != 17 || ip->ihl != 5)
        return XDP_PASS;
    struct udphdr *udp = (void *)(ip + 1);
    unsigned char *mold = (void *)(udp + 1);
    if ((void *)(mold + 20) > end || bpf_ntohs(udp->dest) < 6000 || bpf_ntohs(udp->dest) >= 6100)
        return XDP_PASS;
    __u16 count = (mold[18] << 8) | mold[19];
    if (count == 0 || count == 0xffff)
        return XDP_PASS;
    return bpf_get_prandom_u32() % 1000 < LOSS_PER_MILLE ? XDP_DROP : XDP_PASS;
}
char _license[] SEC("license") = "GPL";
"""


@pytest.fixture(scope="module")
def topo():
    need_root_and_netns()
    t = Topology("sjn")
    yield t
    t.remove()


def mold_copies(pcap: Path, port: int) -> list[tuple[bytes, int, int, list[bytes]]]:
    """(session, sequence number, count, messages) of every datagram to ``port`` in ``pcap``,
    parsed here with struct (pcap: 24-byte file header, 16-byte record headers; Ethernet, IPv4,
    UDP; MoldUDP64 1.00)."""
    data = pcap.read_bytes()
    out, pos = [], 24
    while pos + 16 <= len(data):
        n = struct.unpack_from("<I", data, pos + 8)[0]
        frame = data[pos + 16 : pos + 16 + n]
        pos += 16 + n
        ihl = (frame[14] & 0x0F) * 4
        udp = 14 + ihl
        if struct.unpack_from(">H", frame, udp + 2)[0] != port:
            continue
        payload = frame[udp + 8 :]
        session, seq, count = struct.unpack_from(">10sQH", payload, 0)
        msgs, at = [], 20
        while at < len(payload):
            (m,) = struct.unpack_from(">H", payload, at)
            msgs.append(payload[at + 2 : at + 2 + m])
            at += 2 + m
        out.append((session, seq, count, msgs))
    return out


def journal_files(directory: Path) -> dict[int, tuple[bytes, bytes]]:
    """Sequence number -> (session, message) of every message in a journal directory, from the
    segment files (``<first seq>-<session hex>.seg``: SoupBinTCP Sequenced Data packets)."""
    out: dict[int, tuple[bytes, bytes]] = {}
    for seg in sorted(directory.glob("*.seg")):
        first, session_hex = seg.stem.split("-")
        seq, data, pos = int(first), seg.read_bytes(), 0
        while pos < len(data):
            (n,) = struct.unpack_from(">H", data, pos)
            assert data[pos + 2 : pos + 3] == b"S", f"{seg}: not a Sequenced Data packet at {pos}"
            assert seq not in out, f"sequence number {seq} journaled twice"
            out[seq] = (bytes.fromhex(session_hex), data[pos + 3 : pos + 2 + n])
            seq, pos = seq + 1, pos + 2 + n
    return out


def reference(rules_text: str):
    """Subscriber id -> the messages of the packed sample its rules accept (a Counter), and the
    payloads sent."""
    spec = load_spec(EXAMPLE / "spec.p4")
    rules = parse_rules(rules_text, spec, "rules.sub")
    messages = [m for _, m in read_binaryfile(real_sample())]
    want: dict[int, list[bytes]] = {sid: [] for sid in ENDPOINTS}
    for m in messages:
        if m[:1] not in (b"A", b"F"):
            continue
        for sid in recipients_of(reference_decision(rules, spec, decode_add_order(m))):
            want[sid].append(m)
    return want, pack(messages, random.Random(40), 40)


def start_broker(topo: Topology, tmp: Path, *extra: str, soup_only: bool = False) -> subprocess.Popen:
    """``subc load --journal`` of the example with :data:`ENDPOINTS` (with ``soup_only``, subscriber
    5 has a SoupBinTCP login and no endpoint), in the foreground; returns once its recovery
    service says it runs."""
    out = compile_out(tmp, "m", (EXAMPLE / "rules.sub").read_text())
    subs = tmp / "subscribers.toml"
    if soup_only:
        text = topo.subscribers_toml({k: v for k, v in ENDPOINTS.items() if k != 5})
        subs.write_text(text + '\n[[subscriber]]\nid = 5\nsoup = { user = "odd", password = "lots" }\n')
    else:
        subs.write_text(topo.subscribers_toml(ENDPOINTS))
    p = topo.popen_subc(topo.brk, "load", str(out), "--iface", topo.b0, "--subscribers", str(subs), "--journal", *extra)
    end = time.monotonic() + HANG_GUARD
    err = ""
    while "journal feed running" not in err:
        assert p.poll() is None, f"subc load --journal exited: {err}{p.communicate()}"
        assert time.monotonic() < end, f"no journal service after {HANG_GUARD:.0f} s: {err}"
        if select.select([p.stderr], [], [], 0.5)[0]:
            err += p.stderr.readline()
    return p


def stop_broker(topo: Topology, p: subprocess.Popen) -> None:
    """SIGTERM to the service (it drains and writes its status), then unload."""
    if p.poll() is None:
        p.send_signal(signal.SIGINT)
        try:
            p.communicate(timeout=HANG_GUARD)
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
    topo.subc(topo.brk, "unload", "--iface", topo.b0, check=False)


def caught_up(topo: Topology) -> bool:
    """Whether the service's last status journaled up to each subscriber's kernel number."""
    s = broker_stats(topo)
    svc = (s.get("journal") or {}).get("service")
    if not svc:
        return False
    return all(
        svc["subscribers"][sid]["next_seq"] == c["next_seq"] for sid, c in s["subscribers"].items() if sid.isdigit()
    )


@pytest.mark.parametrize("soup_only", [False, True], ids=["udp", "journal-only"])
def test_the_journal_holds_every_copy_sent(topo, tmp_path, soup_only):
    """With ``soup_only``, subscriber 5 has no endpoint (a SoupBinTCP login): its copies are
    journaled and not sent, and every datagram it takes has its copies built in TC."""
    want, payloads = reference((EXAMPLE / "rules.sub").read_text())
    state = tmp_path / "state"
    broker = start_broker(topo, tmp_path, "--state", str(state), soup_only=soup_only)
    endpoints = {k: v for k, v in ENDPOINTS.items() if not (soup_only and k == 5)}
    procs = {}
    try:
        for k, port in sorted({ep for eps in endpoints.values() for ep in eps}):
            procs[(k, port)] = topo.popen_subc(
                topo.subs[k - 1], "listen", f"10.10.{k}.2:{port}", "--timeout", str(LISTENER_IDLE), "--json",
                "--save-pcap", str(tmp_path / f"got_{k}_{port}.pcap"))
        for (k, port), p in procs.items():
            wait_bound(p, f"10.10.{k}.2", port)
        send(topo, payloads, tmp_path)
        for ep, p in procs.items():
            stdout, stderr = p.communicate(timeout=HANG_GUARD)
            assert p.returncode == 0 and json.loads(stdout)["end_of_session"], stderr
        wait_until(lambda: caught_up(topo), "the journal to reach the kernel's sequence numbers")
        stats = broker_stats(topo)
    finally:
        stop(procs.values())
        stop_broker(topo, broker)
    assert stats["stats"]["journal_lost"] == 0 and stats["stats"]["errors"] == 0
    assert set(stats["journal"]["lost_messages"].values()) == {0}
    svc = stats["journal"]["service"]
    compiler = any(shutil.which(cc) for cc in ("cc", "gcc", "clang"))
    assert svc["feed"]["path"] == ("c" if compiler else "python")  # the C walk took the common case
    for sid in ENDPOINTS:
        journal = journal_files(state / "journal" / str(sid))
        assert svc["subscribers"][str(sid)]["hole_messages"] == 0
        for k, port in endpoints.get(sid, []):
            got = {}
            for session, seq, count, msgs in mold_copies(tmp_path / f"got_{k}_{port}.pcap", port):
                if count in (0, 0xFFFF):
                    continue
                for i, m in enumerate(msgs):
                    got[seq + i] = (session, m)
            assert got == journal, f"endpoint {(k, port)}: the copies received and the journal differ"
        assert Counter(m for _, m in journal.values()) == Counter(want[sid]), f"subscriber {sid}"
        assert sorted(journal) == list(range(1, len(want[sid]) + 1))


def test_recovery_over_a_lossy_link(topo, tmp_path):
    obj = tmp_path / "lossy.o"
    src = tmp_path / "lossy.c"
    src.write_text(LOSSY_C.replace("LOSS_PER_MILLE", str(LOSS_PER_MILLE)))
    multiarch = [f"-I{p}" for p in Path("/usr/include").glob("*-linux-gnu") if (p / "asm").is_dir()]
    sh("clang", "-target", "bpf", "-O2", "-g", *multiarch, "-c", str(src), "-o", str(obj))
    for k, ns in enumerate(topo.subs, 1):
        sh("ip", "-n", ns, "link", "set", "dev", f"{topo.tag}s{k}", "xdp", "obj", str(obj), "sec", "xdp")
    want, payloads = reference((EXAMPLE / "rules.sub").read_text())
    broker = start_broker(topo, tmp_path, "--rerequest", f"0.0.0.0:{RR_PORT}", "--rerequest-rate", "100000",
                          "--metrics", "127.0.0.1:9300")
    plain = (2, 6004)  # subscriber 4's second endpoint listens without recovery: it shows the loss
    procs = {}
    try:
        for k, port in ALL_EPS:
            recover = [] if (k, port) == plain else ["--recover", f"10.10.{k}.1:{RR_PORT}"]
            procs[(k, port)] = topo.popen_subc(
                topo.subs[k - 1], "listen", f"10.10.{k}.2:{port}", "--timeout", str(LISTENER_IDLE), "--json",
                "--save", str(tmp_path / f"got_{k}_{port}.itch"), *recover)
        for (k, port), p in procs.items():
            wait_bound(p, f"10.10.{k}.2", port)
        send(topo, payloads, tmp_path)
        results = {}
        for ep, p in procs.items():
            stdout, stderr = p.communicate(timeout=HANG_GUARD)
            assert p.returncode == 0, stderr
            results[ep] = json.loads(stdout)
        # journal.json is rewritten every second: wait for the snapshot that counts the answers the
        # listeners' recoveries prove were sent (a busy machine may not have written it yet)
        def rr() -> dict:
            return (broker_stats(topo)["journal"]["service"] or {}).get("rerequest") or {}

        wait_until(lambda: rr().get("served", 0) > 0 and rr().get("cookie_sent", 0) > 0,
                   "the broker's status to count the re-requests it served")
        status = broker_stats(topo)["journal"]["service"]
        metrics = call_in_netns(topo.brk, lambda: urllib.request.urlopen("http://127.0.0.1:9300/metrics", timeout=30)
                                .read().decode())
    finally:
        stop(procs.values())
        stop_broker(topo, broker)
        for k, ns in enumerate(topo.subs, 1):
            sh("ip", "-n", ns, "link", "set", "dev", f"{topo.tag}s{k}", "xdp", "off", check=False)
    recovered = 0
    for sid, eps in ENDPOINTS.items():
        for k, port in eps:
            r = results[(k, port)]
            if (k, port) == plain:
                assert r["missing_messages"] > 0, "the lossy link lost nothing on the plain listener"
                continue
            data, msgs, pos = (tmp_path / f"got_{k}_{port}.itch").read_bytes(), [], 0
            while pos < len(data):
                (n,) = struct.unpack_from(">H", data, pos)
                msgs.append(data[pos + 2 : pos + 2 + n])
                pos += 2 + n
            assert r["lost"] == [], f"endpoint {(k, port)} gave up {r['lost']}"
            assert len(msgs) == len(want[sid]) and Counter(msgs) == Counter(want[sid]), f"endpoint {(k, port)}"
            recovered += r["recovered"]
    assert recovered > 0, "nothing was recovered: the lossy link lost nothing"
    assert status["rerequest"]["served"] > 0 and status["rerequest"]["cookie_sent"] > 0
    # the Prometheus metrics say the same (scraped after the receivers ended)
    served = re.search(r'^subc_rerequest_requests_total\{result="served"\} (\S+)$', metrics, re.M)
    assert served and float(served.group(1)) >= status["rerequest"]["served"]
    nxt = {m.group(1): float(m.group(2)) for m in re.finditer(r'^subc_journal_next_seq\{stream="(\d+)"\} (\S+)$',
                                                             metrics, re.M)}
    assert nxt == {str(sid): len(want[sid]) + 1 for sid in ENDPOINTS}


CONTROL = r"""
import json, socket, struct, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("10.10.1.2", 6001))
s.settimeout(5)
req = struct.pack(">10sQH", b"SUBCTEST01", 1, 5)
s.sendto(req, ("10.10.1.1", %d))
cookie_pkt, _ = s.recvfrom(2048)
s.sendto(req + cookie_pkt[10:18], ("10.10.1.1", %d))
answer, _ = s.recvfrom(2048)
print(json.dumps([cookie_pkt.hex(), answer.hex()]))
"""


def test_forged_requests_reflect_nothing(topo, tmp_path):
    """Requests forged with a subscriber's address (scapy, from the publisher's namespace) make the
    server send that address one 20-byte cookie packet each and nothing else; the subscriber
    itself, proving its address with the cookie, is served."""
    want, payloads = reference((EXAMPLE / "rules.sub").read_text())
    broker = start_broker(topo, tmp_path, "--rerequest", f"0.0.0.0:{RR_PORT}")
    victim = None
    try:
        victim = topo.popen_subc(topo.subs[0], "listen", "10.10.1.2:6001", "--timeout", str(LISTENER_IDLE), "--json",
                                 "--save-pcap", str(tmp_path / "victim.pcap"))
        wait_bound(victim, "10.10.1.2", 6001)
        send(topo, payloads[:-1], tmp_path)  # the journal fills; the end of session comes last
        wait_until(lambda: caught_up(topo), "the journal to reach the kernel's sequence numbers")
        forged = []
        for k in range(40):
            req = struct.pack(">10sQH", b"SUBCTEST01", 1 + k, 0xFFFF if k % 2 else 50)
            forged.append(req + (bytes(8) if k % 3 == 0 else b""))  # some with a guessed cookie
        code = (
            "from scapy.all import IP, UDP, Raw, send\n"
            f"ps = [bytes.fromhex(h) for h in {[p.hex() for p in forged]!r}]\n"
            f"send([IP(src='10.10.1.2', dst='10.10.0.2') / UDP(sport=6001, dport={RR_PORT}) / Raw(p) for p in ps],"
            " verbose=False)\n"
        )
        sh(*topo.in_ns(topo.pub, sys.executable, "-c", code))
        wait_until(lambda: (broker_stats(topo)["journal"]["service"] or {}).get("rerequest", {}).get("requests", 0)
                   >= len(forged), "the server's status to count the forged requests")
        send(topo, payloads[-1:], tmp_path)  # the end of session: the victim's listener ends
        stdout, stderr = victim.communicate(timeout=HANG_GUARD)
        assert victim.returncode == 0, stderr
        out = sh(*topo.in_ns(topo.subs[0], sys.executable, "-c", CONTROL % (RR_PORT, RR_PORT))).stdout
        cookie_pkt, answer = (bytes.fromhex(h) for h in json.loads(out))
        wait_until(lambda: broker_stats(topo)["journal"]["service"]["rerequest"]["requests"] >= len(forged) + 2,
                   "the server's status to count the subscriber's requests")
        counters = broker_stats(topo)["journal"]["service"]["rerequest"]
    finally:
        stop([victim])
        stop_broker(topo, broker)
    replies = mold_copies_from(tmp_path / "victim.pcap", RR_PORT)
    assert 0 < len(replies) <= len(forged)
    assert all(len(p) == 20 and p[18:20] == b"\xff\xfe" for p in replies), "a forged request got more than a cookie"
    assert counters["served"] == 1 and counters["cookie_sent"] == len(forged) + 1  # only the subscriber's own
    assert len(cookie_pkt) == 20 and cookie_pkt[18:20] == b"\xff\xfe"
    session, seq, count = struct.unpack_from(">10sQH", answer)
    assert (session, seq, count) == (b"SUBCTEST01", 1, 5)
    msgs, at = [], 20
    while at < len(answer):
        (n,) = struct.unpack_from(">H", answer, at)
        msgs.append(answer[at + 2 : at + 2 + n])
        at += 2 + n
    assert Counter(msgs) <= Counter(want[1]) and len(msgs) == 5


def mold_copies_from(pcap: Path, sport: int) -> list[bytes]:
    """The UDP payloads in ``pcap`` sent from UDP port ``sport`` (the request server's replies)."""
    data = pcap.read_bytes()
    out, pos = [], 24
    while pos + 16 <= len(data):
        n = struct.unpack_from("<I", data, pos + 8)[0]
        frame = data[pos + 16 : pos + 16 + n]
        pos += 16 + n
        udp = 14 + (frame[14] & 0x0F) * 4
        if struct.unpack_from(">H", frame, udp)[0] == sport:
            out.append(frame[udp + 8 :])
    return out


# -- SoupBinTCP: backfill then live, a service killed with -9 and restarted ------------------------

SOUP_PORT = 9200


class SoupClient:
    """A SoupBinTCP 4.1 client written here with ``struct`` (2-byte length counting the type, the
    type, the payload), on a socket made in a subscriber's namespace."""

    def __init__(self, topo: Topology, k: int):
        self.sock = call_in_netns(topo.subs[k - 1], lambda: socket.create_connection((f"10.10.{k}.1", SOUP_PORT), 10))
        self.sock.settimeout(HANG_GUARD)
        self.buf = b""

    def login(self, user: str, password: str, seq: int) -> tuple[bytes, bytes]:
        """(type, payload) of the answer: b"A" (session, sequence number) or b"J" (reason)."""
        body = b"L" + user.ljust(6).encode() + password.ljust(10).encode() + b" " * 10 + str(seq).rjust(20).encode()
        self.sock.sendall(struct.pack(">H", len(body)) + body)
        return self.packet()

    def packet(self) -> tuple[bytes, bytes]:
        while True:
            if len(self.buf) >= 2:
                (n,) = struct.unpack_from(">H", self.buf)
                if len(self.buf) >= 2 + n:
                    p, self.buf = self.buf[2 : 2 + n], self.buf[2 + n :]
                    return p[:1], p[1:]
            data = self.sock.recv(65536)
            assert data, "the server closed the connection"
            self.buf += data

    def messages(self, count: int) -> list[bytes]:
        """The next ``count`` Sequenced Data messages (heartbeats and debug packets skipped)."""
        out: list[bytes] = []
        while len(out) < count:
            kind, payload = self.packet()
            assert kind in (b"S", b"H", b"+"), (kind, payload)
            if kind == b"S":
                out.append(payload)
        return out

    def close(self) -> None:
        try:
            self.sock.sendall(struct.pack(">H", 1) + b"O")  # Logout Request
        finally:
            self.sock.close()


def expected_for(payloads: list[bytes], sid: int) -> list[bytes]:
    """The messages of ``payloads`` the example's rules give subscriber ``sid``, in feed order
    (MoldUDP64 blocks parsed here with struct; the rules evaluated on the ITCH codec's values)."""
    spec = load_spec(EXAMPLE / "spec.p4")
    rules = parse_rules((EXAMPLE / "rules.sub").read_text(), spec, "rules.sub")
    out = []
    for p in payloads:
        count = struct.unpack_from(">H", p, 18)[0]
        at = 20
        for _ in range(0 if count in (0, 0xFFFF) else count):
            (n,) = struct.unpack_from(">H", p, at)
            m = p[at + 2 : at + 2 + n]
            at += 2 + n
            if m[:1] in (b"A", b"F") and sid in recipients_of(reference_decision(rules, spec, decode_add_order(m))):
                out.append(m)
    return out


def test_soupbintcp_backfill_live_and_a_restart(topo, tmp_path):
    """Subscriber 5 has a SoupBinTCP login and no endpoint.  A client logs in at 1 after the first
    part of the feed (backfill), reads some, logs out; the service is killed with SIGKILL while the
    second part is sent, and restarted (subc journal, same --state); a client logs in at the next
    number and gets exactly the rest, the third part live.  A bad password is refused ('A')."""
    _, payloads = reference((EXAMPLE / "rules.sub").read_text())
    payloads = payloads[:-1]  # no end of session
    parts = [payloads[: len(payloads) // 3], payloads[len(payloads) // 3 : 2 * len(payloads) // 3],
             payloads[2 * len(payloads) // 3 :]]
    want = [expected_for(p, 5) for p in parts]
    assert all(len(w) > 10 for w in want)
    state = tmp_path / "state"
    soup = ["--state", str(state), "--soup", f"0.0.0.0:{SOUP_PORT}"]
    broker = start_broker(topo, tmp_path, *soup, soup_only=True)
    restarted = None
    try:
        send(topo, parts[0], tmp_path)
        wait_until(lambda: caught_up(topo), "the journal to reach the kernel's sequence numbers")
        bad = SoupClient(topo, 3)
        assert bad.login("odd", "wrong", 1) == (b"J", b"A")
        bad.sock.close()
        a = SoupClient(topo, 3)
        kind, accepted = a.login("odd", "lots", 1)
        assert kind == b"A" and accepted[:10] == b"SUBCTEST01" and int(accepted[10:]) == 1
        first = a.messages(len(want[0]) - 5)  # backfill, not all of it
        a.close()
        broker.kill()  # SIGKILL: nothing is flushed or closed
        broker.communicate()
        send(topo, parts[1], tmp_path)  # the data plane goes on; its ring keeps the copies
        restarted = topo.popen_subc(topo.brk, "journal", "--iface", topo.b0, *soup)
        wait_until(lambda: service_pid(topo) == restarted.pid and caught_up(topo), "the restarted service to catch up")
        b = SoupClient(topo, 3)
        kind, accepted = b.login("odd", "lots", len(first) + 1)
        assert kind == b"A" and int(accepted[10:]) == len(first) + 1
        rest = b.messages(len(want[0]) + len(want[1]) - len(first))
        send(topo, parts[2], tmp_path)  # live
        live = b.messages(len(want[2]))
        b.close()
        stats = broker_stats(topo)
    finally:
        stop([restarted])
        stop_broker(topo, broker)
    assert first + rest + live == want[0] + want[1] + want[2]  # every message once, in sequence order
    assert stats["journal"]["lost_messages"].get("5", 0) == 0
    assert stats["journal"]["service"]["soup"]["counters"]["logins_accepted"] == 1  # the restarted service's


def service_pid(topo: Topology) -> int | None:
    """The process id in the journal service's last status."""
    return ((broker_stats(topo).get("journal") or {}).get("service") or {}).get("pid")


def test_retention_bounds_the_journal(topo, tmp_path):
    """The sample sent three times (sequence numbers keep growing) with --retain 64KiB and 16 KiB
    segments: once the service has applied its retention, each journal's files take at most the
    bound (no segment is larger than 16 KiB), the oldest numbers are gone (counted), and the
    newest are all there."""
    _, payloads = reference((EXAMPLE / "rules.sub").read_text())
    state = tmp_path / "state"
    bound, segment = 64 << 10, 16 << 10
    broker = start_broker(topo, tmp_path, "--state", str(state), "--retain", "64KiB", "--segment-bytes", "16KiB")
    try:
        for _ in range(3):
            send(topo, payloads[:-1], tmp_path)
        wait_until(lambda: caught_up(topo), "the journal to reach the kernel's sequence numbers")
        first = time.time()

        def retained() -> bool:
            svc = broker_stats(topo)["journal"]["service"]
            return svc["updated"] > first and all(
                s["bytes"] <= bound for s in svc["subscribers"].values())

        wait_until(retained, "a status after the service applied its retention")
        svc = broker_stats(topo)["journal"]["service"]
    finally:
        stop_broker(topo, broker)
    dropped = 0
    for sid, s in svc["subscribers"].items():
        files = sorted((state / "journal" / sid).glob("*.seg"))
        on_disk = sum(f.stat().st_size for f in files)
        assert on_disk <= bound, f"subscriber {sid}: {on_disk} bytes on disk"
        assert all(f.stat().st_size <= segment for f in files)  # (no message is longer than a segment)
        journal = journal_files(state / "journal" / sid)
        if journal:
            assert min(journal) == s["first_seq"] and max(journal) == s["next_seq"] - 1
            assert sorted(journal) == list(range(s["first_seq"], s["next_seq"]))
        dropped += s["dropped_by_retention"]
        assert s["dropped_by_retention"] == s["first_seq"] - 1
    assert dropped > 0, "nothing was dropped: the bound was never reached"


def test_the_journal_in_a_container(tmp_path):
    """The same as test_the_journal_holds_every_copy_sent with the broker's commands entered as a
    container's are (``ip netns exec``: a mount namespace of its own, a fresh /sys without the host's
    BPF file system): the service finds the ring through the broker's own pins."""
    need_root_and_netns()
    with shared_bpffs():  # the broker's commands share one bpffs, as docs/ebpf.md says to set up
        t = Topology("sjk", container=True)
        try:
            test_the_journal_holds_every_copy_sent(t, tmp_path, False)
        finally:
            t.remove()
