"""The eBPF broker in a container: commands under ``ip netns exec``, and brokers in several namespaces.

``ip netns exec`` gives each command a mount namespace of its own with a fresh ``/sys``, where
``/sys/fs/bpf`` is not the host's bpffs, as a container does.  A bpffs that a command mounted
there would vanish when it exits, and with its pins the kernel clears the program arrays the data
path tail-calls through: datagrams with several recipients were lost while ``subc load`` said
"loaded" (issue 38).  Now:

* without a bpffs that outlives the command, ``subc load`` refuses with the fix and leaves the
  interface as it was;
* with one shared as docs/ebpf.md says (``/run/subc/bpffs``), the six-endpoint delivery of
  ``test_delivery_netns`` is exact under ``ip netns exec`` (one and many messages per datagram,
  XDP fan-out on with its daemon, and off), each subscriber's sequence numbers gap-free;
* two brokers in two namespaces whose feed interfaces have the same name run at once, each exact;
  unloading one leaves the other delivering;
* a broker whose namespace is deleted without ``subc unload`` leaves nothing that blocks the next
  one: its pins are cleared by the next ``subc load``;
* ``subc serve`` under ``ip netns exec``: SUBSCRIBE, delivery, UNSUBSCRIBE, restart with ``--state``.

Every verdict compares what the subscribers received with the rules evaluated on values decoded by
the independent ITCH codec (``test_delivery_netns.feed_and_check``); no verdict depends on speed.
"""

from __future__ import annotations

import json
import os
import random

import pytest

from subc.workloads.itch_codec import read_binaryfile

from conftest import EXAMPLE, real_sample
from netns_util import Topology, call_in_netns, need_root_and_netns, no_shared_bpffs, sh, shared_bpffs
from test_broker_netns import compile_out, wait_until
from test_delivery_netns import ENDPOINTS, EQUIVALENT_RULES, check_feed, feed_and_check, load_broker, pack

RULES = (EXAMPLE / "rules.sub").read_text()


def xdp_attached(topo: Topology) -> bool:
    return "xdp" in json.loads(sh("ip", "-n", topo.brk, "-j", "link", "show", topo.b0).stdout)[0]


@pytest.fixture(scope="module")
def bpffs():
    need_root_and_netns()
    with shared_bpffs() as path:
        yield path


@pytest.fixture(scope="module")
def topo(bpffs):
    t = Topology("cnt", container=True)
    yield t
    t.remove()


def test_load_refuses_without_a_bpffs_that_outlives_it(tmp_path):
    need_root_and_netns()
    t = Topology("cnr", container=True)
    try:
        out = compile_out(tmp_path, "m", RULES)
        subs = tmp_path / "subscribers.toml"
        subs.write_text(t.subscribers_toml({1: [(1, 5001)]}))
        with no_shared_bpffs():
            r = t.subc(t.brk, "load", str(out), "--iface", t.b0, "--subscribers", str(subs), check=False)
        assert r.returncode == 2, r.stderr
        assert "ip netns exec" in r.stderr and "mount -t bpf bpf /run/subc/bpffs" in r.stderr, r.stderr
        assert not xdp_attached(t)
        # and nothing to unload: no state was written
        r = t.subc(t.brk, "unload", "--iface", t.b0, check=False)
        assert r.returncode == 2 and "not loaded" in r.stderr, r.stderr
    finally:
        t.remove()


@pytest.mark.parametrize("most, fanout", [(1, True), (40, True), (1, False), (40, False)],
                         ids=["one-per-datagram-fanout", "many-per-datagram-fanout",
                              "one-per-datagram-tc", "many-per-datagram-tc"])
def test_six_endpoints_exact_under_ip_netns_exec(topo, tmp_path, most, fanout):
    check_feed(topo, tmp_path, RULES, [], most=most, load_args=() if fanout else ("--no-fanout",),
               fanout_daemon=fanout)


def test_stats_update_and_fanout_find_the_broker_from_another_command(topo, tmp_path):
    """Every later command (a new ``ip netns exec``, a new mount namespace) finds the broker:
    stats, update under traffic, a fan-out pass; the state records the namespace's identity."""
    load_broker(topo, tmp_path, RULES, "--capacity-factor", "4")
    try:
        order = ",".join(json.loads((tmp_path / "m" / "report.json").read_text())["field_order"])
        other = compile_out(tmp_path, "b", EQUIVALENT_RULES, order)
        messages = [m for _, m in read_binaryfile(real_sample())]
        feed_and_check(topo, tmp_path, RULES, pack(messages, random.Random(3)), [other, tmp_path / "m"])
        r = topo.subc(topo.brk, "fanout", "--iface", topo.b0, "--once")
        assert json.loads(r.stdout)["passes"] == 1
        st = json.loads(topo.subc(topo.brk, "stats", "--iface", topo.b0, "--json").stdout)
        inode = netns_inode(topo)
        assert st["netns_inode"] == inode and st["pins"].endswith(f"/subc/net{inode}/{topo.b0}")
    finally:
        topo.subc(topo.brk, "unload", "--iface", topo.b0, check=False)


def test_two_brokers_with_the_same_interface_name(bpffs, tmp_path):
    """Two namespaces, each with a feed interface named ``feed0`` and its own subscribers, loaded
    at once: both exact; unloading one leaves the other delivering."""
    a = Topology("cta", b0="feed0", container=True)
    b = None
    try:
        b = Topology("ctb", b0="feed0", container=True)
        (tmp_path / "a").mkdir()
        (tmp_path / "b").mkdir()
        load_broker(a, tmp_path / "a", RULES)
        load_broker(b, tmp_path / "b", RULES)
        messages = [m for _, m in read_binaryfile(real_sample())]
        half = len(messages) // 2
        first, second = pack(messages[:half], random.Random(5)), pack(messages[half:], random.Random(6))
        feed_and_check(a, tmp_path / "a", RULES, first)
        feed_and_check(b, tmp_path / "b", RULES, first)
        a.subc(a.brk, "unload", "--iface", "feed0")
        assert not xdp_attached(a) and xdp_attached(b)
        feed_and_check(b, tmp_path / "b", RULES, second)
        r = a.subc(a.brk, "stats", "--iface", "feed0", check=False)
        assert r.returncode == 2 and "not loaded" in r.stderr, r.stderr
    finally:
        a.remove()
        if b is not None:
            b.remove()


def test_a_broker_whose_namespace_is_gone_blocks_nothing(bpffs, tmp_path):
    """A broker left loaded when its namespaces are deleted: its pins stay (nothing unloaded it);
    once the kernel has destroyed the namespace (its XDP link has no device any more), the next
    ``subc load``, in a new namespace that may reuse the old one's inode and with the same
    interface name, clears them, says so, and loads."""
    from subc.dataplane.ebpf.bpf_objects import link_xdp_ifindex, obj_get

    old = Topology("cts", b0="feed0", container=True)
    try:
        load_broker(old, tmp_path, RULES)
        inode = netns_inode(old)
    finally:
        for ns in [old.pub, old.brk, *old.subs]:  # no unload
            sh("ip", "netns", "del", ns, check=False)
    left = bpffs / "subc" / f"net{inode}" / "feed0"
    assert (left / "link_xdp").exists()

    def device_gone() -> bool:
        fd = obj_get(left / "link_xdp")
        try:
            return link_xdp_ifindex(fd) == 0
        finally:
            os.close(fd)

    wait_until(device_gone, "the kernel to destroy the deleted namespace's devices")
    new = Topology("cts", b0="feed0", container=True)
    try:
        out = compile_out(tmp_path, "n", RULES)
        subs = tmp_path / "subscribers.toml"
        subs.write_text(new.subscribers_toml(ENDPOINTS))
        r = new.subc(new.brk, "load", str(out), "--iface", "feed0", "--subscribers", str(subs))
        assert f"cleared the broker net{inode}/feed0: its interface is gone" in r.stderr, r.stderr
        if netns_inode(new) != inode:
            assert not left.exists()
        feed_and_check(new, tmp_path, RULES, pack([m for _, m in read_binaryfile(real_sample())], random.Random(9)))
    finally:
        new.remove()


def netns_inode(topo: Topology) -> int:
    """The inode of the broker's network namespace (its key in the pins' and state's paths)."""
    return int(sh("ip", "netns", "exec", topo.brk, "stat", "-L", "-c", "%i", "/proc/self/ns/net").stdout)


def test_serve_under_ip_netns_exec(bpffs, tmp_path):
    """``subc serve`` in a container: SUBSCRIBE, delivery, UNSUBSCRIBE, SIGKILL and restart with
    ``--state`` (the pinned data path keeps delivering meanwhile; every subscription is kept)."""
    from subc.dataplane.ebpf.broker_stats import stats
    from test_serve_netns import World

    topo = Topology("cvt", 3, container=True)
    w = None
    try:
        w = World(topo, tmp_path)
        r = w.subscribe(1, 'add_order.stock == "AAPL"')
        assert r.startswith("SUBACK "), r
        r2 = w.subscribe(2, 'add_order.price > 100 and add_order.stock != "MSFT"')
        assert r2.startswith("SUBACK "), r2
        w.send(20)
        w.settle()
        w.check()
        assert w.unsubscribe(2, int(r2.split()[1])) == f"UNSUBACK {r2.split()[1]}"
        w.send(10)
        w.settle()
        w.check()
        before = dict(w.live)
        w.broker.kill()
        w.send(10)  # no daemon: the pinned data path delivers
        w.settle()
        w.broker.start()
        w.send(10)
        w.settle()
        w.check()
        assert w.live == before
        st = call_in_netns(topo.brk, lambda: stats(topo.b0))
        assert st.get("mode") == "serve" and st["subscriptions"] == len(before)
    finally:
        if w is not None:
            w.close()
        topo.remove()


def test_the_load_check_names_every_missing_delivery_path(bpffs, tmp_path):
    """``check_data_path`` (run by every ``subc load`` after attaching) passes on a complete
    broker and names what is missing after a tail-call slot is emptied and the TC program
    detached: each would drop a class of datagrams."""
    from subc.backends.ebpf import layout as L
    from subc.dataplane.ebpf import attach
    from subc.dataplane.ebpf.broker import LoadedFilter, read_maps_doc
    from subc.dataplane.ebpf.broker_home import broker_home
    from subc.errors import SubcError

    t = Topology("cck", 1, container=True)
    out = compile_out(tmp_path, "m", RULES)
    doc, src = read_maps_doc(out)

    def run() -> list[str]:
        home = broker_home(t.b0, mount=True)
        ifindex = attach.ifindex_of(t.b0)
        said = []
        with LoadedFilter.build(doc, src) as lf:
            attach.pin_and_attach(lf.program, lf.maps, home, ifindex)
            try:
                attach.check_data_path(lf.program, lf.maps, home, ifindex, [])
                lf.maps["subc_jmp_xdp"].delete(L.U32.pack(v=1))
                attach.detach_tc(ifindex)
                try:
                    attach.check_data_path(lf.program, lf.maps, home, ifindex, [])
                except SubcError as e:
                    said.append(str(e))
            finally:
                attach.remove(home)
        return said

    try:
        said = call_in_netns(t.brk, run)
    finally:
        t.remove()
    assert len(said) == 1, said
    assert "tail call subc_jmp_xdp[1] -> subc_xdp_one" in said[0] and "TC program" in said[0], said[0]
    assert "subc_jmp_xdp[0]" not in said[0] and "XDP program" not in said[0], said[0]


def test_two_loads_at_once_on_one_interface(topo, tmp_path):
    """Two ``subc load`` commands started together on the same interface of one namespace: one
    loads, the other waits for it (the home's lock) and then refuses with "already loaded"; the
    loaded broker is whole (its own after-load check passed, and stats reads it)."""
    out = compile_out(tmp_path, "m", RULES)
    subs = tmp_path / "subscribers.toml"
    subs.write_text(topo.subscribers_toml(ENDPOINTS))
    procs = []
    args = ("load", str(out), "--iface", topo.b0, "--subscribers", str(subs))
    try:
        procs = [topo.popen_subc(topo.brk, *args) for _ in range(2)]
        results = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
        assert sorted(rc for rc, _ in results) == [0, 2], results
        refused = next(err for rc, err in results if rc == 2)
        assert "already loaded" in refused and "Traceback" not in refused, refused
        st = json.loads(topo.subc(topo.brk, "stats", "--iface", topo.b0, "--json").stdout)
        assert st["generation"] == 0
        assert xdp_attached(topo)
    finally:
        topo.subc(topo.brk, "unload", "--iface", topo.b0, check=False)
        for p in procs:
            if p.poll() is None:
                p.kill()
