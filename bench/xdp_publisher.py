#!/usr/bin/env python3
"""A publisher that injects prebuilt Ethernet frames into a veth from XDP, as a NIC traffic
generator does (``xdp-trafficgen`` of xdp-tools works this way): the peer receives them as XDP
frames, as from a NIC's receive ring, never as socket buffers to copy.

    xdp_publisher.py PAYLOADS DEV DST_MAC SRC_IP DST_IP PORT SECONDS RATE [--frames N] [--burst N] [--batch N]

Run it as root inside the publisher's network namespace, pinned to one CPU (the frames are made
and transmitted on the calling CPU), e.g.
``nsenter --net=/run/netns/tpub taskset -c 0 python3 bench/xdp_publisher.py ...``.  PAYLOADS: the
records of ``udp_broker publish`` (a 2-byte big-endian length, then a UDP payload).  It prints the
JSON of ``udp_broker publish``, ``{"sent": frames, "messages": n, "seconds": s}``, with more
counts (below).  Linux 5.18+ (live frames, ``bpf_xdp_store_bytes``).

Frames.  Every payload becomes a complete frame, built here: Ethernet (DEV's MAC to DST_MAC), IPv4
(SRC_IP to DST_IP, DF, TTL 64, identification the payload's index, header checksum), UDP (source
and destination port PORT, checksum over the pseudo-header), zero-padded to 60 bytes; a frame may
be 1,514 bytes.  They sit in a BPF array map (length and bytes).

Program.  A tiny XDP program takes the next frame (a counter of frames sent, modulo the number
of frames: the payloads go round robin in file order, as the socket publisher sends them), sizes
the packet with ``bpf_xdp_adjust_tail`` (by the difference from its current length, whatever the
kernel left in the page), copies the frame in with ``bpf_xdp_store_bytes`` and returns
``bpf_redirect(DEV)``.  ``BPF_PROG_TEST_RUN`` in live-frames mode (``BPF_F_TEST_XDP_LIVE_FRAMES``;
Documentation/bpf/bpf_prog_run.rst) runs it ``repeat`` times per call, in batches of ``--batch``
(64: page-pool pages, then a redirect flush), and really transmits what it redirects: the frames
go through DEV's devmap bulk queue to ``ndo_xdp_xmit``, which for a veth puts them on the peer's
XDP ring (256 frames) and schedules the peer's NAPI.  No ``ctx_in`` is needed: the run's device
is the namespace's loopback, and ``bpf_redirect`` finds DEV by index in that namespace.  The peer
veth must accept redirected frames: it needs an XDP program, or GRO on (then too it has NAPI;
without an XDP program it builds a socket buffer around each frame's page, the UDP checksum
checked in software).

Test runs are long (about 20 ms each, ``repeat`` adapted to the measured speed), for two costs
that are per call: each call makes a page pool (its pages still in flight when the call ends are
released later by a kernel worker, a second apart), and a call of more than one repeat adds the
program to the kernel's XDP dispatcher and removes it after (an RCU-synchronized code update,
~25 ms a call here) unless the program is attached somewhere already.  So it is also attached, in
generic mode, to one end of a veth pair made for that (``xph<pid>``, down, so no frame ever
reaches it; removed at exit).

Rate: ``RATE`` messages/s (0: as fast as possible).  The program paces itself against the
monotonic clock (``bpf_ktime_get_ns``): a frame of m messages (its MoldUDP64 count; 1 for a
payload without a header, 0 for an end of session or a heartbeat, as the C publisher counts)
moves the schedule m/RATE on, and a run before the next frame is due returns ``XDP_DROP`` (an idle
run, ~0.15 us here: the publisher spins on its CPU, as a traffic generator does).  So frames
leave evenly spaced (within a batch, ~10 us), not in bursts.  When the publisher falls behind
(descheduled), it catches up by at most ``--burst`` frames of the mean size; the rest of the lag
slips (``slipped_seconds``), since a larger catch-up burst would overflow the peer's ring.  It
stops at SECONDS (frames due later are not sent) or, with ``--frames``, after that many.

What was sent.  ``ndo_xdp_xmit`` takes a devmap flush's frames in order until the peer's ring is
full and drops the rest: nothing pushes back, as with a NIC receive ring that is full (the peer's
loss really, but counted on DEV: veth reports them as DEV's ``tx dropped`` and ``ethtool -S``
``tx_queue_0_xdp_xmit_errors``).  A raw tracepoint on ``xdp_devmap_xmit`` (flushes by this process
to DEV) sees each flush's sent and dropped counts; the flushes take the frames in the order the
program redirected them, so it knows which frames were dropped and their messages.  So ``sent``
and ``messages`` count exactly the frames the veth took and the messages in them; ``dropped`` and
``dropped_messages`` those it refused; ``veth_xdp_xmit``/``veth_xdp_xmit_errors`` are veth's own
counts (``ethtool -S DEV``) as a cross-check.  A redirect that fails before the bulk queue
(``redirect_errors``: DEV down, a frame over its MTU) sends nothing; after one, later drops may be
attributed to the wrong frames and ``exact`` is false.  Without kernel BTF (to find
``net_device.ifindex``) the tracepoint counts every devmap flush of this process, whatever the
device.
"""

from __future__ import annotations

import argparse
import ctypes as ct
import errno
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from subc.dataplane.ebpf.bpf import import_bcc  # noqa: E402
from subc.dataplane.ebpf.bpf_objects import BpfTestRunOpts  # noqa: E402

BPF_F_TEST_XDP_LIVE_FRAMES = 1 << 1
XDP_FLAGS_SKB_MODE = 1 << 1
MAX_FRAME = 1514          # Ethernet header and a 1,500-byte IPv4 packet
MIN_FRAME = 60            # shorter frames are padded with zeros (as a NIC pads)
MOLD_HEADER = 20
END_OF_SESSION = 0xFFFF

PROG = r"""
#include <uapi/linux/bpf.h>
struct frame { u32 len; u8 data[MAX_FRAME]; };
BPF_ARRAY(frames, struct frame, NFRAMES);
BPF_ARRAY(frame_msgs, u32, NFRAMES);
/* set before each run: 0 picoseconds a message (0: no pacing), 1 start and 2 end (ns, the
   monotonic clock), 3 frames to send at most (the value of acct[0] to stop at), 4 burst (ps) */
BPF_ARRAY(cfg, u64, 5);
/* 0: frames redirected (= the next frame's index), 1: messages redirected, 2: bad frames,
   3: frames sent (taken by the veth), 4: frames dropped, 5: messages dropped, 6: redirect errors,
   7: index of the first frame not yet flushed, 8: the schedule (ps after the start) the next frame
   waits for, 9: ps the schedule slipped, 10: idle runs (nothing sent) */
BPF_ARRAY(acct, u64, 11);

static __always_inline u64 *slot(u32 i) { return acct.lookup(&i); }
static __always_inline u64 conf(u32 i) { u64 *v = cfg.lookup(&i); return v ? *v : 0; }

int publish(struct xdp_md *ctx) {
    u64 *runs = slot(0), *msgs = slot(1), *bad = slot(2), *sched = slot(8), *slip = slot(9), *idle = slot(10);
    if (!runs || !msgs || !bad || !sched || !slip || !idle) return XDP_ABORTED;
    u64 now = bpf_ktime_get_ns(), start = conf(1), ps = conf(0);
    if (now < start || now >= conf(2) || *runs >= conf(3)) { *idle += 1; return XDP_DROP; }
    u32 i = *runs % NFRAMES;
    struct frame *f = frames.lookup(&i);
    u32 *m = frame_msgs.lookup(&i);
    if (!f || !m) return XDP_ABORTED;
    u64 t = (now - start) * 1000, burst = conf(4);
    if (ps) {
        if (t < *sched) { *idle += 1; return XDP_DROP; }   /* ahead of the schedule: spin */
        if (t > *sched + burst) { *slip += t - burst - *sched; *sched = t - burst; }  /* do not catch up */
    }
    u64 len = f->len;
    if (len > MAX_FRAME) { *bad += 1; return XDP_DROP; }
    asm volatile("" : "+r"(len));   /* two checks, or clang fuses them into one the verifier cannot use */
    if (len < MIN_FRAME) { *bad += 1; return XDP_DROP; }
    int cur = (int)bpf_xdp_get_buff_len(ctx);
    if (bpf_xdp_adjust_tail(ctx, (int)len - cur)) { *bad += 1; return XDP_DROP; }
    if (bpf_xdp_store_bytes(ctx, 0, f->data, len)) { *bad += 1; return XDP_DROP; }
    *runs += 1;
    *msgs += *m;
    *sched += (u64)*m * ps;
    return bpf_redirect(IFINDEX, 0);
}

/* xdp_devmap_xmit(from_dev, to_dev, sent, drops, err): one flush of the bulk queue to DEV,
   its frames in the order they were redirected, the first `sent` taken by the driver */
RAW_TRACEPOINT_PROBE(xdp_devmap_xmit) {
    if ((bpf_get_current_pid_tgid() >> 32) != TGID) return 0;
#if IFINDEX_OFF >= 0
    int ifindex = 0;   /* to_dev->ifindex, at its offset in the running kernel (from BTF) */
    bpf_probe_read_kernel(&ifindex, sizeof(ifindex), (void *)(ctx->args[1] + IFINDEX_OFF));
    if (ifindex != IFINDEX) return 0;
#endif
    int sent = (int)ctx->args[2], drops = (int)ctx->args[3];
    u64 *nsent = slot(3), *ndrop = slot(4), *mdrop = slot(5), *pos = slot(7);
    if (!nsent || !ndrop || !mdrop || !pos) return 0;
    u64 first = *pos + (sent > 0 ? sent : 0), lost = 0;
    for (int k = 0; k < 64; k++) {      /* a bulk queue holds 16 */
        if (k >= drops) break;
        u32 i = (first + k) % NFRAMES;
        u32 *m = frame_msgs.lookup(&i);
        if (m) lost += *m;
    }
    *nsent += sent > 0 ? sent : 0;
    *ndrop += drops > 0 ? drops : 0;
    *mdrop += lost;
    *pos += (sent > 0 ? sent : 0) + (drops > 0 ? drops : 0);
    return 0;
}

RAW_TRACEPOINT_PROBE(xdp_redirect_err) {
    if ((bpf_get_current_pid_tgid() >> 32) != TGID) return 0;
    u64 *e = slot(6);
    if (e) *e += 1;
    return 0;
}
"""


def btf_member_offset(struct_name: str, member: str, path: str = "/sys/kernel/btf/vmlinux") -> int:
    """Byte offset of ``member`` in ``struct struct_name`` of the running kernel, from its BTF (the
    kernel headers bcc compiles with may be another version's); LookupError when not found,
    OSError when the kernel has no BTF."""
    data = Path(path).read_bytes()
    magic, _, _, hdr_len, type_off, type_len, str_off, _ = struct.unpack_from("<HBBIIIII", data)
    if magic != 0xEB9F:
        raise LookupError(f"{path}: not BTF")
    types, strs = hdr_len + type_off, hdr_len + str_off

    def name(off: int) -> bytes:
        return data[strs + off:data.index(b"\0", strs + off)]

    # bytes after the 12-byte common header, per kind: int, array, struct, union, enum, func_proto,
    # var, datasec, decl_tag, enum64
    extra = {1: lambda v: 4, 3: lambda v: 12, 4: lambda v: 12 * v, 5: lambda v: 12 * v, 6: lambda v: 8 * v,
             13: lambda v: 8 * v, 14: lambda v: 4, 15: lambda v: 12 * v, 17: lambda v: 4, 19: lambda v: 12 * v}
    at, stop = types, types + type_len
    while at < stop:
        name_off, info, _ = struct.unpack_from("<III", data, at)
        kind, vlen, kflag = (info >> 24) & 0x1F, info & 0xFFFF, info >> 31
        at += 12
        if kind == 4 and name(name_off) == struct_name.encode():
            for k in range(vlen):
                m_name, _, m_off = struct.unpack_from("<III", data, at + 12 * k)
                if name(m_name) == member.encode():
                    return (m_off & 0xFFFFFF if kflag else m_off) // 8
        at += extra.get(kind, lambda v: 0)(vlen)
    raise LookupError(f"struct {struct_name} has no member {member} in {path}")


def read_payloads(path: Path) -> list[bytes]:
    """The payload records of ``udp_broker publish``."""
    data, out, at = path.read_bytes(), [], 0
    while at + 2 <= len(data):
        n = int.from_bytes(data[at:at + 2], "big")
        if at + 2 + n > len(data):
            raise SystemExit(f"{path}: truncated payload record")
        out.append(data[at + 2:at + 2 + n])
        at += 2 + n
    return out


def messages_of(payload: bytes) -> int:
    """Messages in a payload, counted as the C publisher does."""
    if len(payload) < MOLD_HEADER:
        return 1
    c = int.from_bytes(payload[18:20], "big")
    return 0 if c == END_OF_SESSION else c


def checksum(data: bytes) -> int:
    """The Internet checksum (RFC 1071) of ``data``."""
    if len(data) % 2:
        data += b"\0"
    s = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def mac_bytes(mac: str) -> bytes:
    return bytes(int(x, 16) for x in mac.split(":"))


def build_frame(payload: bytes, src_mac: str, dst_mac: str, src_ip: str, dst_ip: str, sport: int, dport: int,
                ident: int = 0) -> bytes:
    """A complete Ethernet/IPv4/UDP frame carrying ``payload``, both checksums computed, padded
    with zeros to 60 bytes."""
    src, dst = socket.inet_aton(src_ip), socket.inet_aton(dst_ip)
    ulen = 8 + len(payload)
    ucs = checksum(src + dst + struct.pack("!BBH", 0, 17, ulen) + struct.pack("!HHHH", sport, dport, ulen, 0) + payload)
    udp = struct.pack("!HHHH", sport, dport, ulen, ucs or 0xFFFF) + payload
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + ulen, ident & 0xFFFF, 0x4000, 64, 17, 0, src, dst)
    ip = ip[:10] + struct.pack("!H", checksum(ip)) + ip[12:]
    frame = mac_bytes(dst_mac) + mac_bytes(src_mac) + b"\x08\x00" + ip + udp
    return frame.ljust(MIN_FRAME, b"\0")


def device_mac(dev: str) -> str:
    """The MAC address of ``dev`` in this network namespace (SIOCGIFHWADDR: /sys may be another
    namespace's under nsenter)."""
    import fcntl

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = fcntl.ioctl(s.fileno(), 0x8927, struct.pack("256s", dev.encode()[:15]))
    return ":".join(f"{b:02x}" for b in req[18:24])


def ethtool_stats(dev: str) -> dict[str, int]:
    """``ethtool -S DEV`` as a dict (empty when it cannot be read)."""
    r = subprocess.run(["ethtool", "-S", dev], capture_output=True, text=True)
    out = {}
    for ln in r.stdout.splitlines()[1:]:
        k, _, v = ln.partition(":")
        try:
            out[k.strip()] = int(v)
        except ValueError:
            pass
    return out


class XdpPublisher:
    """The frames of ``payloads`` loaded for redirection to ``dev`` (in this process's network
    namespace); :meth:`run` transmits them."""

    def __init__(self, payloads: list[bytes], dev: str, dst_mac: str, src_ip: str, dst_ip: str, port: int,
                 batch: int = 64):
        if not payloads:
            raise SystemExit("no payloads")
        self.dev, self.batch = dev, batch
        self.ifindex = socket.if_nametoindex(dev)
        src_mac = device_mac(dev)
        self.frames = [build_frame(p, src_mac, dst_mac, src_ip, dst_ip, port, port, i) for i, p in enumerate(payloads)]
        too_big = [i for i, f in enumerate(self.frames) if len(f) > MAX_FRAME]
        if too_big:
            raise SystemExit(f"{len(too_big)} payloads too big for a {MAX_FRAME}-byte frame (first: #{too_big[0]})")
        self.msgs = [messages_of(p) for p in payloads]
        bcc = import_bcc()
        try:
            ifindex_off = btf_member_offset("net_device", "ifindex")
        except (OSError, LookupError):
            ifindex_off = -1   # no BTF: count this process's devmap flushes, whatever their device
        self.bpf = bcc.BPF(text=PROG, cflags=[f"-DNFRAMES={len(self.frames)}", f"-DMAX_FRAME={MAX_FRAME}",
                                             f"-DMIN_FRAME={MIN_FRAME}", f"-DIFINDEX={self.ifindex}",
                                             f"-DTGID={os.getpid()}", f"-DIFINDEX_OFF={ifindex_off}"])
        self.fd = self.bpf.load_func("publish", bcc.BPF.XDP).fd
        table = self.bpf["frames"]
        for i, f in enumerate(self.frames):
            v = table.Leaf()
            v.len = len(f)
            ct.memmove(ct.addressof(v.data), f, len(f))
            table[ct.c_int(i)] = v
        mt = self.bpf["frame_msgs"]
        for i, m in enumerate(self.msgs):
            mt[ct.c_int(i)] = ct.c_uint32(m)
        # Hold the program in the kernel's XDP dispatcher: a test run of more than one repeat adds
        # the program to the dispatcher and removes it afterwards, each an RCU-synchronized text
        # update (~25 ms a call here) unless the program is attached somewhere already.  So attach
        # it (generic mode) to one end of a veth pair made for that, down, that no frame reaches.
        self.holder = f"xph{os.getpid()}"
        subprocess.run(["ip", "link", "add", self.holder, "type", "veth", "peer", "name", self.holder + "p"],
                       check=True, capture_output=True)
        try:
            bcc.BPF.attach_xdp(self.holder, self.bpf.load_func("publish", bcc.BPF.XDP), XDP_FLAGS_SKB_MODE)
        except BaseException:
            self.close()
            raise
        self.lib = bcc.libbcc.lib
        self.lib.bpf_prog_test_run_opts.argtypes = [ct.c_int, ct.POINTER(BpfTestRunOpts)]
        self.lib.bpf_prog_test_run_opts.restype = ct.c_int
        # the packet the kernel copies into each new page-pool page (the program resizes and rewrites it)
        self.data_in = ct.create_string_buffer(MIN_FRAME)

    def close(self) -> None:
        """Remove the holder veth pair (and with it the program's attachment)."""
        subprocess.run(["ip", "link", "del", self.holder], capture_output=True)

    def counters(self) -> list[int]:
        t = self.bpf["acct"]
        return [t[ct.c_int(i)].value for i in range(11)]

    def test_run(self, repeat: int) -> None:
        opts = BpfTestRunOpts()
        opts.sz = ct.sizeof(BpfTestRunOpts)
        opts.data_in = ct.cast(self.data_in, ct.c_void_p)
        opts.data_size_in = len(self.data_in)
        opts.repeat = repeat
        opts.flags = BPF_F_TEST_XDP_LIVE_FRAMES
        opts.batch_size = self.batch
        if self.lib.bpf_prog_test_run_opts(self.fd, ct.byref(opts)) < 0:
            e = ct.get_errno()
            if e != errno.EINTR:
                raise SystemExit(f"BPF_PROG_TEST_RUN (live frames) failed: {os.strerror(e) if e else 'error'}")

    def run(self, seconds: float, rate: float, burst: int = 64, frames: int | None = None,
            call_seconds: float = 0.02) -> dict:
        """Transmit for ``seconds`` (or until ``frames`` frames were sent) at ``rate`` messages/s
        (0: as fast as possible); the counts of what the veth took.  The program paces itself
        (spinning until a frame is due); test runs of about ``call_seconds`` each."""
        ps = round(1e12 / rate) if rate > 0 else 0
        mean = max(sum(self.msgs) / len(self.msgs), 1.0)   # messages a frame
        c0, veth0 = self.counters(), ethtool_stats(self.dev)
        self.bpf["acct"][ct.c_int(8)] = ct.c_uint64(0)
        start = time.monotonic_ns()
        end = start + int(seconds * 1e9)
        limit = c0[0] + frames if frames is not None else 2**64 - 1
        cfg = self.bpf["cfg"]
        for i, v in enumerate((ps, start, end, limit, int(burst * mean * ps))):
            cfg[ct.c_int(i)] = ct.c_uint64(v)
        repeat, calls = 4096, 0
        while True:
            t = time.monotonic_ns()
            if t >= end or (frames is not None and self.bpf["acct"][ct.c_int(0)].value >= limit):
                break
            self.test_run(repeat)
            calls += 1
            dt = max(time.monotonic_ns() - t, 1)
            per_ns = repeat / dt   # runs a nanosecond
            left = max(end - time.monotonic_ns(), 0)
            repeat = int(min(max(per_ns * call_seconds * 1e9, 1024), per_ns * left + 1024, 1 << 26))
        stop = min(time.monotonic_ns(), end)
        c1, veth1 = self.counters(), ethtool_stats(self.dev)
        d = [b - a for a, b in zip(c0, c1)]
        out = {"sent": d[3], "messages": d[1] - d[5], "seconds": round((stop - start) / 1e9, 6), "dropped": d[4],
               "dropped_messages": d[5], "redirected": d[0], "bad_frames": d[2], "redirect_errors": d[6],
               "exact": d[6] == 0 and d[0] == d[3] + d[4] and c1[7] == c1[0], "calls": calls,
               "idle_runs": d[10], "slipped_seconds": round(d[9] / 1e12, 6)}
        for key in ("xdp_xmit", "xdp_xmit_errors"):  # veth's own count (tx queue 0 of DEV), a cross-check
            name = f"tx_queue_0_{key}"
            if name in veth1 and name in veth0:
                out[f"veth_{key}"] = veth1[name] - veth0[name]
        return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("payloads", type=Path)
    ap.add_argument("dev", help="the veth to transmit on (in this network namespace)")
    ap.add_argument("dst_mac")
    ap.add_argument("src_ip")
    ap.add_argument("dst_ip")
    ap.add_argument("port", type=int)
    ap.add_argument("seconds", type=float)
    ap.add_argument("rate", type=float, help="messages/s, 0: as fast as possible")
    ap.add_argument("--frames", type=int, help="stop after offering this many frames")
    ap.add_argument("--burst", type=int, default=64,
                    help="frames (of the mean size) the schedule may be caught up by at once (default 64)")
    ap.add_argument("--batch", type=int, default=64, help="frames per kernel batch, at most 256 (default 64)")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # so that the holder veth is removed
    pub = XdpPublisher(read_payloads(args.payloads), args.dev, args.dst_mac, args.src_ip, args.dst_ip, args.port,
                       args.batch)
    try:
        out = pub.run(args.seconds, args.rate, args.burst, args.frames)
    finally:
        pub.close()
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
