"""What veth itself can carry: the copies of a minimal XDP fan-out, for ``broker_throughput.py``.

The minimal broker (``--minimal``) is an XDP program on the broker's input veth that classifies
nothing and rewrites nothing: every feed datagram (IPv4, UDP to the feed port) is redirected
through one device map with ``BPF_F_BROADCAST | BPF_F_EXCLUDE_INGRESS``, which clones it once per
entry (``dev_map_enqueue_multi``): an entry per subscriber, each its subscriber's veth (a veth
per subscriber) or the one shared veth (every subscriber behind one link), so it makes N copies
of every datagram on the same veths, the same CPU and the same publisher as the eBPF broker, whose
copies are one clone each too (XDP fan-out, docs/ebpf.md).  Its copies per second bound what any
XDP broker can send on these veths; the eBPF broker makes fewer copies per datagram (only the
recipients'), each rewritten, so its copies per second against this ceiling say how much of the
link it uses.  Other frames pass to the stack.

The program is attached and its device map filled from inside the broker's namespace
(:func:`subc.dataplane.ebpf.links.in_netns`, setns), as the sinks are attached.
"""

from __future__ import annotations

import ctypes as ct
import subprocess

from subc.dataplane.ebpf.links import in_netns

MINIMAL_PROG = r"""
#include <uapi/linux/if_ether.h>
#include <uapi/linux/ip.h>
#include <uapi/linux/udp.h>
BPF_DEVMAP(fan, NCOPIES);
BPF_PERCPU_ARRAY(fan_cnt, u64, 2);  /* datagrams broadcast, frames passed */
int minimal_fanout(struct xdp_md *ctx) {
    void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
    struct ethhdr *eth = data;
    u32 k = 1;
    if ((void *)(eth + 1) > end || eth->h_proto != htons(ETH_P_IP)) goto pass;
    struct iphdr *ip = (void *)(eth + 1);
    if ((void *)(ip + 1) > end || ip->protocol != 17 || ip->ihl != 5) goto pass;
    struct udphdr *udp = (void *)(ip + 1);
    if ((void *)(udp + 1) > end || udp->dest != htons(FEED_PORT)) goto pass;
    k = 0;
    u64 *c = fan_cnt.lookup(&k);
    if (c) *c += 1;
    return fan.redirect_map(0, BPF_F_BROADCAST | BPF_F_EXCLUDE_INGRESS);
pass:;
    u64 *p = fan_cnt.lookup(&k);
    if (p) *p += 1;
    return XDP_PASS;
}
"""


def detach_xdp_in(ns: str, device: str) -> None:
    """Remove the XDP program of ``device`` in namespace ``ns``."""
    subprocess.run(["ip", "-n", ns, "link", "set", "dev", device, "xdp", "off"], capture_output=True)


class MinimalFanout:
    """The minimal broker on ``ns``'s ``input`` veth, cloning every feed datagram to ``targets``
    (ifindexes in ``ns``, one device-map entry each, repeats allowed: N subscribers behind one veth
    are N entries of it).  :meth:`close` detaches it."""

    def __init__(self, ns: str, input_dev: str, targets: list[int], feed_port: int):
        from subc.dataplane.ebpf.bpf import import_bcc

        bcc = import_bcc()
        self.ns, self.input_dev = ns, input_dev
        self.bpf = bcc.BPF(text=MINIMAL_PROG, cflags=[f"-DNCOPIES={len(targets)}", f"-DFEED_PORT={feed_port}"])
        fn = self.bpf.load_func("minimal_fanout", bcc.BPF.XDP)
        fan = self.bpf["fan"]
        with in_netns(f"/run/netns/{ns}"):  # a device map's entries are device indexes of the updater's namespace
            for i, ifindex in enumerate(targets):
                fan[ct.c_int(i)] = ct.c_int(ifindex)
            bcc.BPF.attach_xdp(input_dev, fn, 0)

    def counts(self) -> dict:
        """Datagrams broadcast and frames passed, so far."""
        t = self.bpf["fan_cnt"]
        return {"datagrams": sum(t[ct.c_int(0)]), "passed": sum(t[ct.c_int(1)])}

    def close(self) -> None:
        detach_xdp_in(self.ns, self.input_dev)
        self.bpf.cleanup()
