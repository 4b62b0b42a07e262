"""``subc serve --p4runtime``: live subscriptions written to a switch, checked without one.

The daemon runs in the test process against a P4Runtime server written for the tests
(tests/p4rt_fake.py: grpcio on loopback, it applies every write and fails the test on an
invalid one).  Subscribers send requests over UDP from loopback addresses that the port map
puts behind switch ports 1, 2 and 3.  After every reply, the entries the server holds are
decoded from their protobuf fields and run by the table simulator (each message slot of the
multi-message program): for packets on every operand's boundaries, the decision must be the
reference interpreter's on the live subscriptions as rules ``condition : fwd(port)``.  A
restarted daemon takes the switch over with its entries and the store, and the same holds.
On the ITCH example, and on random specs (P4_14 and P4_16 forms, other field names, widths,
match kinds and layouts; MoldUDP64-framed or not) with random conditions over all their fields.
"""

from __future__ import annotations

import json
import socket
from collections import Counter

from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from conftest import EXAMPLE
from p4rt_fake import FakeSwitch
from spec_model import spec_models
from strategies import boundary_packets, condition
from test_delivery_differential import RENDER

from subc.backends.p4.entries_doc import EntriesDoc
from subc.lang.rules import parse_rules
from subc.spec.front_end import load_spec, parse_spec
from subc.backends.p4.serve_program import serve_program
from subc.dataplane.p4rt.readback import switch_document
from subc.dataplane.p4rt.requests import P4InfoIndex
from subc.semantics.reference import reference_decision
from subc.serve.daemon import Daemon, ServeConfig, SwitchOptions
from subc.sim.switch import TableSimulator

SPEC = load_spec(EXAMPLE / "spec.p4")
ORDER = ["add_order.stock", "add_order.buy_sell_indicator", "add_order.shares", "add_order.price"]
SOURCES = {"127.0.0.1": 1, "127.0.0.2": 2, "127.0.0.3": 3}
PORT_MAP = "127.0.0.2/32 2\n127.0.0.3/32 3\n127.0.0.0/8 1\n"

atoms = st.one_of(
    st.sampled_from(['add_order.stock == "BOB"', 'add_order.stock == "ALC"', 'add_order.stock in {"CHAR", "BOB"}',
                     'add_order.buy_sell_indicator == "B"', 'add_order.buy_sell_indicator == "S"']),
    st.builds(lambda op, v: f"add_order.shares {op} {v}", st.sampled_from(["<", ">", "==", ">="]),
              st.sampled_from([100, 500, 1000])),
    st.builds(lambda op, v: f"add_order.price {op} {v}", st.sampled_from(["<", ">", "<="]),
              st.sampled_from([10, 20, 25])),
)
conditions = st.one_of(atoms, st.builds(lambda a, b: f"{a} and {b}", atoms, atoms),
                       st.builds(lambda a, b: f"{a} or not {b}", atoms, atoms))
ops = st.lists(st.one_of(st.tuples(st.just("sub"), st.sampled_from(sorted(SOURCES)), conditions),
                         st.tuples(st.just("unsub"), st.integers(0, 30))), min_size=1, max_size=14)


class Client:
    """A subscriber on loopback address ``ip`` (UDP requests, one reply each; the daemon's cookie
    kept and appended, a request sent again after a ``COOKIE`` reply, docs/serve.md)."""

    def __init__(self, ip: str, server: tuple[str, int]):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((ip, 0))
        self.sock.settimeout(60)
        self.server = server
        self.cookie = None

    def ask(self, line: str) -> str:
        for _ in range(3):
            cookie = self.cookie
            self.sock.sendto((f"{line} COOKIE {cookie}" if cookie else line.ljust(24)).encode(), self.server)
            reply = self.sock.recv(4096).decode().strip()
            if not reply.startswith("COOKIE ") or reply.split()[1] == cookie:
                return reply
            self.cookie = reply.split()[1]
        return reply


def _program(tmp, spec, order, root_slots: int = 4):
    files = serve_program(spec, order, [1, 2, 3], 200, max_messages=2, root_slots=root_slots)
    assert json.loads(files["serve.json"])["root_slots"] == root_slots
    d = tmp / "prog"
    d.mkdir(exist_ok=True)
    for name, text in files.items():
        (d / name).write_text(text)
    (d / "device.json").write_text("{}")
    (tmp / "ports.txt").write_text(PORT_MAP)
    return d


def _start(tmp, spec, order, prog, sw: FakeSwitch, config: bool) -> Daemon:
    opts = SwitchOptions(sw.addr, str(prog), str(tmp / "ports.txt"), str(prog / "device.json") if config else None,
                         grace=0.0)
    d = Daemon(ServeConfig(spec, "", ("127.0.0.1", 0), order, str(tmp / "state"), switch=opts))
    d.start()
    return d


def _check(sw: FakeSwitch, spec, skeleton: dict, live: dict, packets) -> None:
    assert not sw.errors, sw.errors
    index = P4InfoIndex(sw.p4info)
    root_id = index.table(skeleton["root"]["table"]).id
    with sw.lock:
        doc = switch_document(EntriesDoc.from_json(skeleton), index, list(sw.entries.values()),
                              sw.defaults[root_id], list(sw.groups.values())).to_json()
    text = "".join(f"{cond} : fwd({port});\n" for cond, port in live.values())
    rules = parse_rules(text, spec, "live.sub") if text else []
    want = [reference_decision(rules, spec, p) for p in packets]

    def base(t):
        return t["name"].split(".", 1)[1][len(f"subc_s{t['slot']}_"):]
    slot0 = [t for t in doc["tables"] if t.get("slot") == 0]
    slots = sorted({t["slot"] for t in doc["tables"] if "slot" in t})
    views = []
    for i in slots:
        mine = {base(t): t for t in doc["tables"] if t.get("slot") == i}
        views.append({**doc, "tables": [{**t0, "entries": mine[base(t0)]["entries"]} for t0 in slot0]
                      + [t for t in doc["tables"] if "slot" not in t]})
    event(f"{len(slots)} message slots" if slots else "single-message program")
    for view in views or [doc]:  # the single-message program: the tables as they are
        sim = TableSimulator(EntriesDoc.from_json(view))
        for p, w in zip(packets, want):
            assert sim.process(p) == w, (text, p)


def _held_counts(sw: FakeSwitch) -> Counter:
    """Entries per table id that the server holds."""
    with sw.lock:
        return Counter(key[0] for key in sw.entries)


def _session(tmp, spec, order: list[str], steps, data, reject_every: int = 0) -> None:
    """Run ``steps`` (("sub", source, condition) / ("unsub", k)) against a daemon on a fake
    switch, restarting it mid-way, with :func:`_check` after every reply.  With
    ``reject_every`` k, the switch rejects every k-th table entry INSERT: the request gets an
    error reply and changes nothing, on the switch (its entries, as the daemon counts them) as
    in the daemon."""
    slots_made = data.draw(st.sampled_from([2, 3, 4, 9]), label="root slots")
    prog = _program(tmp, spec, order, slots_made)
    skeleton = json.loads((prog / "entries.json").read_text())
    qs = {n: spec.query_fields[n] for n in order}
    sw = FakeSwitch()
    daemon = None
    if reject_every:
        from p4.v1 import p4runtime_pb2 as pr

        inserts = [0]

        def reject(u) -> bool:
            # not the first field's tables: the undoing of a change re-INSERTs root slot entries
            # that it deleted, which the switch must take (else the daemon must be restarted)
            if u.type != pr.Update.INSERT or not u.entity.HasField("table_entry") or daemon is None:
                return False
            first = daemon.writer.levels[0]
            if daemon.writer.s.index.table_names.get(u.entity.table_entry.table_id) in first.stage + first.miss:
                return False
            inserts[0] += 1
            return inserts[0] % reject_every == 0
    try:
        daemon = _start(tmp, spec, order, prog, sw, config=True)
        sw.reject = reject if reject_every else None
        clients = {ip: Client(ip, ("127.0.0.1", daemon.port)) for ip in SOURCES}
        live: dict[int, tuple[str, int]] = {}
        ids: list[tuple[int, str]] = []
        all_conds = []
        for k, step in enumerate(steps):
            if step[0] == "sub":
                _, ip, cond = step
                reply = clients[ip].ask(f"SUBSCRIBE {cond}")
                if reply.endswith("the condition accepts no message"):
                    continue
                if reject_every and "rejected" in reply:
                    assert reply.startswith("SUBERR "), reply
                    event("a SUBSCRIBE rejected by the switch")
                    _consistent(sw, daemon)
                    continue
                assert reply.startswith("SUBACK "), reply
                sid = int(reply.split()[1])
                live[sid] = (cond, SOURCES[ip])
                ids.append((sid, ip))
                all_conds.append(cond)
            elif ids:
                sid, ip = ids.pop(step[1] % len(ids))
                reply = clients[ip].ask(f"UNSUBSCRIBE {sid}")
                if reject_every and "rejected" in reply:
                    assert reply.startswith("ERR "), reply
                    event("an UNSUBSCRIBE rejected by the switch")
                    ids.append((sid, ip))
                else:
                    assert reply == f"UNSUBACK {sid}", reply
                    del live[sid]
            if k == len(steps) // 2:  # the daemon restarts mid-way: the switch keeps its entries
                daemon.stop()
                daemon = None  # the switch takes every write of the start
                daemon = _start(tmp, spec, order, prog, sw, config=False)
                assert (daemon.adopted or not live) and len(daemon.subs) == len(live)
                for c in clients.values():
                    c.server = ("127.0.0.1", daemon.port)
            rules = parse_rules("".join(f"{c} : fwd(1);\n" for c in all_conds), spec, "all.sub") if all_conds else []
            packets = list(boundary_packets(rules, qs, data.draw))[:24]
            _check(sw, spec, skeleton, live, packets)
            refreshed = daemon.broker.refresh_writes
            if refreshed:
                event("free root slots refreshed ahead of time")
            # the metrics read the broker (the reclaimer may move on between the two reads)
            metric = daemon.metrics.registry.get_sample_value
            assert metric("subc_serve_root_refresh_writes") >= refreshed
            assert metric("subc_serve_root_refresh_failures") == daemon.broker.refresh_failures == 0
            slots = {k: metric("subc_serve_root_slots", {"state": k}) for k in ("free", "stale", "retired")}
            assert all(0 <= v < slots_made for v in slots.values()), slots
            if reject_every:
                _consistent(sw, daemon)
    finally:
        if daemon is not None:
            daemon.stop()
        sw.stop()


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(steps=ops, data=st.data())
def test_live_subscriptions_on_a_switch_deliver_as_the_reference_says(tmp_path_factory, steps, data):
    _session(tmp_path_factory.mktemp("serve"), SPEC, ORDER, steps, data)


def _consistent(sw: FakeSwitch, daemon: Daemon) -> None:
    """The entries the daemon's writer counts per table are those the switch holds, and every
    write (the undoing of a rejected change included) was valid for what the switch held."""
    assert not sw.errors, sw.errors
    w = daemon.writer
    mine = {w.s.index.table(name).id for lv in w.levels for name in lv.stage + lv.miss}
    with daemon.broker.lock:
        counted = {w.s.index.table(name).id: n for name, n in w.held.items() if n}
        held = {t: n for t, n in _held_counts(sw).items() if t in mine}
    assert counted == held


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(steps=ops, every=st.integers(3, 40), data=st.data())
def test_a_change_the_switch_rejects_changes_nothing(tmp_path_factory, steps, every, data):
    """The switch rejects some INSERTs of a change (as a Tofino exact table may when its hashes
    collide): the request gets SUBERR/ERR, the updates the switch applied are undone, and the
    switch still classifies as the reference on the live subscriptions."""
    _session(tmp_path_factory.mktemp("serve"), SPEC, ORDER, steps, data, reject_every=every)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(form=st.sampled_from(sorted(RENDER)), data=st.data())
def test_live_subscriptions_of_random_specs(tmp_path_factory, form, data):
    model = data.draw(spec_models())
    assume(model.query_fields)
    spec = parse_spec(RENDER[form](model), "m.p4")
    qs = {q.name: q for q in spec.query_fields.values()}
    order = data.draw(st.permutations(sorted(qs)))
    conds = condition(order, qs)
    steps = data.draw(st.lists(st.one_of(st.tuples(st.just("sub"), st.sampled_from(sorted(SOURCES)), conds),
                                         st.tuples(st.just("unsub"), st.integers(0, 30))), min_size=1, max_size=10))
    _session(tmp_path_factory.mktemp("serve"), spec, list(order), steps, data)
