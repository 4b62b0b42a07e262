"""The benchmark's XDP publisher (bench/xdp_publisher.py) sends exactly the frames it should.

* Frames, no root: each frame it builds is, byte for byte, the frame scapy builds from the same
  payload (Ethernet, IPv4 with DF, TTL 64 and the payload's index as identification, UDP from and
  to the feed port, both checksums computed by scapy), zero-padded to 60 bytes.
* On a veth, in network namespaces made by the test (removed afterwards; addresses in
  10.12.0.0/24 inside them only)::

      xppub: xpp0 (10.12.0.1) --- xpr0 (10.12.0.2) :xprcv

  the publisher runs in ``xppub`` (live-frames test runs, frames redirected to xpp0) for twice the
  payloads (so round robin wraps), at a low rate; the receiver either has GRO on and no XDP program
  (frames become socket buffers in veth's NAPI, as for the user-space broker) or an XDP program
  (GRO off) that counts the frames and passes them (as for the eBPF broker).  A packet socket on
  xpr0 must see every frame, in order, byte for byte as scapy built it; a UDP socket on the feed
  port every payload (the receiving kernel drops a datagram with a wrong checksum); the
  publisher's counts (frames, messages: MoldUDP64 counts, 0 for heartbeats and the end of
  session, 1 for a payload without a MoldUDP64 header) must match, with no drop.

No verdict depends on speed: the receiver has NAPI in softirq on the publisher's CPU (no threaded
NAPI), the sockets' buffers hold every frame sent, and the receiver waits for each expected frame
(with a generous guard against a hang).
"""

from __future__ import annotations

import ctypes as ct
import json
import os
import random
import socket
import struct
import subprocess
import sys
from contextlib import contextmanager

import pytest
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Raw

from conftest import ROOT
from netns_util import need_root_and_netns, sh

sys.path.insert(0, str(ROOT / "bench"))
from udp_tables import payloads_file  # noqa: E402
from xdp_publisher import build_frame, messages_of  # noqa: E402

from subc.wire.moldudp64 import encode_end_of_session, encode_packet  # noqa: E402

PUB_NS, RCV_NS = "xppub", "xprcv"
PUB_DEV, RCV_DEV = "xpp0", "xpr0"
PUB_IP, RCV_IP = "10.12.0.1", "10.12.0.2"
PORT = 26400
HANG_GUARD = 60.0   # seconds: only a hung test waits this long for a frame
CLONE_NEWNET = 0x40000000
ETH_P_ALL = 0x0003
SO_RCVBUFFORCE = 33
COUNT_PROG = r"""
BPF_ARRAY(seen, u64, 2);    /* feed frames (IPv4, UDP to PORT), their bytes */
int count(struct xdp_md *ctx) {
    unsigned char *d = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
    if ((void *)(d + 42) > (void *)end || d[12] != 8 || d[13] != 0 || d[23] != 17
        || ((d[36] << 8) | d[37]) != PORT)
        return XDP_PASS;
    u32 k = 0;
    u64 *n = seen.lookup(&k);
    if (n) *n += 1;
    k = 1;
    n = seen.lookup(&k);
    if (n) *n += bpf_xdp_get_buff_len(ctx);
    return XDP_PASS;
}
"""


def payloads(seed: int = 3) -> list[bytes]:
    """MoldUDP64 datagrams of 1 to 40 messages of 10 to 60 bytes (up to ~1,400 bytes: odd and
    even lengths), a heartbeat, a payload shorter than a MoldUDP64 header (a frame under 60
    bytes, padded) and an end of session."""
    rng = random.Random(seed)
    out, seq = [], 1
    for _ in range(40):
        msgs = [bytes(rng.randrange(256) for _ in range(rng.randint(10, 60))) for _ in range(rng.randint(1, 40))]
        while 20 + sum(2 + len(m) for m in msgs) > 1400:
            msgs.pop()
        out.append(encode_packet("XDPPUB0001", seq, msgs))
        seq += len(msgs)
    out.insert(7, encode_packet("XDPPUB0001", seq, []))
    out.insert(20, b"short payload")
    out.append(encode_end_of_session("XDPPUB0001", seq))
    return out


def expected_frame(payload: bytes, index: int, src_mac: str, dst_mac: str) -> bytes:
    f = bytes(Ether(src=src_mac, dst=dst_mac) / IP(src=PUB_IP, dst=RCV_IP, id=index, flags="DF", ttl=64)
              / UDP(sport=PORT, dport=PORT) / Raw(payload))
    return f.ljust(60, b"\0")


def test_frames_match_scapy():
    src, dst = "02:00:00:00:00:01", "02:00:00:00:00:02"
    for i, p in enumerate(payloads()):
        assert build_frame(p, src, dst, PUB_IP, RCV_IP, PORT, PORT, i) == expected_frame(p, i, src, dst), i


def test_messages_of():
    ps = payloads()
    assert [messages_of(p) for p in ps[:3]] == [int.from_bytes(p[18:20], "big") for p in ps[:3]]
    assert messages_of(ps[7]) == 0 and messages_of(ps[20]) == 1 and messages_of(ps[-1]) == 0


# -- on a veth -----------------------------------------------------------------------------------

@contextmanager
def netns(name: str):
    """This thread inside network namespace ``name`` (sockets made there stay there)."""
    libc = ct.CDLL(None, use_errno=True)
    own = os.open("/proc/self/ns/net", os.O_RDONLY)
    target = os.open(f"/run/netns/{name}", os.O_RDONLY)
    try:
        if libc.setns(target, CLONE_NEWNET):
            raise OSError(ct.get_errno(), f"setns into {name}")
        try:
            yield
        finally:
            if libc.setns(own, CLONE_NEWNET):
                raise OSError(ct.get_errno(), "setns back")
    finally:
        os.close(own)
        os.close(target)


def remove() -> None:
    for ns in (PUB_NS, RCV_NS):
        sh("ip", "netns", "del", ns, check=False)


def mac(ns: str, dev: str) -> str:
    return json.loads(sh("ip", "-n", ns, "-j", "link", "show", dev).stdout)[0]["address"]


@pytest.fixture
def veth():
    need_root_and_netns()
    if tuple(int(x) for x in os.uname().release.split(".")[:2] if x.isdigit()) < (5, 18):
        pytest.skip("live-frames test runs need Linux 5.18+")
    remove()
    try:
        for ns in (PUB_NS, RCV_NS):
            sh("ip", "netns", "add", ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "link", "add", PUB_DEV, "netns", PUB_NS, "type", "veth", "peer", "name", RCV_DEV, "netns", RCV_NS)
        sh("ip", "-n", PUB_NS, "addr", "add", f"{PUB_IP}/24", "dev", PUB_DEV)
        sh("ip", "-n", RCV_NS, "addr", "add", f"{RCV_IP}/24", "dev", RCV_DEV)
        sh("ip", "-n", PUB_NS, "link", "set", PUB_DEV, "up")
        sh("ip", "-n", RCV_NS, "link", "set", RCV_DEV, "up")
        yield
    finally:
        remove()


def receive(sock: socket.socket, n: int, keep) -> list[bytes]:
    """``n`` datagrams from ``sock`` that ``keep`` accepts, waiting at most HANG_GUARD for each."""
    out = []
    sock.settimeout(HANG_GUARD)  # (not select(): the suite's earlier tests may hold more than 1,024 descriptors)
    while len(out) < n:
        try:
            data = sock.recv(65536)
        except TimeoutError:
            break
        if keep(data):
            out.append(data)
    return out


def is_feed(frame: bytes) -> bool:
    return (len(frame) >= 42 and frame[12:14] == b"\x08\x00" and frame[23] == 17
            and struct.unpack("!H", frame[36:38])[0] == PORT)


@pytest.mark.parametrize("receiver", ["gro", "xdp"])
def test_frames_arrive_byte_exact(veth, tmp_path, receiver):
    from subc.dataplane.ebpf.bpf import import_bcc

    ps = payloads()
    n = 2 * len(ps)
    (tmp_path / "payloads").write_bytes(payloads_file(ps))
    src_mac, dst_mac = mac(PUB_NS, PUB_DEV), mac(RCV_NS, RCV_DEV)
    bpf = None
    if receiver == "gro":
        sh("ip", "netns", "exec", RCV_NS, "ethtool", "-K", RCV_DEV, "gro", "on")
    else:
        sh("ip", "netns", "exec", RCV_NS, "ethtool", "-K", RCV_DEV, "gro", "off")
        bcc = import_bcc()
        bpf = bcc.BPF(text=COUNT_PROG, cflags=[f"-DPORT={PORT}"])
        fn = bpf.load_func("count", bcc.BPF.XDP)
        with netns(RCV_NS):
            bcc.BPF.attach_xdp(RCV_DEV, fn, 0)
    with netns(RCV_NS):
        raw = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        raw.bind((RCV_DEV, 0))
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        udp.bind((RCV_IP, PORT))
    try:
        for s in (raw, udp):
            s.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 64 << 20)
        r = subprocess.run(["nsenter", f"--net=/run/netns/{PUB_NS}", sys.executable, str(ROOT / "bench/xdp_publisher.py"),
                            str(tmp_path / "payloads"), PUB_DEV, dst_mac, PUB_IP, RCV_IP, str(PORT), str(HANG_GUARD),
                            "20000", "--frames", str(n)], capture_output=True, text=True, timeout=4 * HANG_GUARD)
        assert r.returncode == 0, r.stderr[-3000:]
        out = json.loads(r.stdout)
        frames = receive(raw, n, is_feed)
        datagrams = receive(udp, n, lambda d: True)
    finally:
        raw.close()
        udp.close()
    order = [ps[j % len(ps)] for j in range(n)]
    assert out["sent"] == n and out["dropped"] == 0 and out["redirect_errors"] == 0 and out["exact"], out
    assert out["messages"] == sum(messages_of(p) for p in order), out
    assert out.get("veth_xdp_xmit", n) == n
    want = [expected_frame(ps[j % len(ps)], j % len(ps), src_mac, dst_mac) for j in range(n)]
    assert len(frames) == n, f"{len(frames)} of {n} frames arrived"
    for j, (got, exp) in enumerate(zip(frames, want)):
        assert got == exp, f"frame {j} differs"
    assert datagrams == order, "the UDP socket did not get every payload in order"
    if bpf is not None:
        seen = [bpf["seen"][ct.c_int(i)].value for i in range(2)]
        assert seen == [n, sum(len(f) for f in want)], seen
    # the publisher removed its holder veth pair
    assert not [ln for ln in sh("ip", "-n", PUB_NS, "-o", "link").stdout.splitlines() if "xph" in ln]
