"""Differential tests of the delivery semantics (docs/ebpf.md, "Delivery semantics") on random specs,
rule sets and multi-message datagrams.

Specs, messages and frames come from :mod:`spec_model` (which imports nothing from subc; frames are
built with scapy from field values).  The expected copies are computed here, from those values
alone: each message is classified on its own by the rules evaluated on the values it was built
from (a message that lacks a header the rules test goes to no port; the model's parsers accept a
message of an unknown type with its type header alone); each port receives, per datagram holding any message for it, one copy with exactly those
messages in order, the count of what it holds and its own gap-free sequence numbers from 1;
heartbeats and the end of session go to every port with its next number.

* ``subc simulate --copies`` (the table simulator over ``entries.json``) must give every port
  exactly those copies, in order;
* the eBPF broker (XDP + TC, in network namespaces: every copy that reaches each endpoint is
  inspected) must give every endpoint the same copies (as a multiset: a copy sent whole from XDP
  and one built in TC may arrive in either order), checksums the receiving kernel accepts, and
  gap-free sequence numbers.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from spec_model import (build_message, messages_for, moldudp64_payload, reference_fields, render_p4_14, render_p4_16,
                        spec_models, valid_instances)
from subc.lang.ast import evaluate, predicates
from subc.compiler.driver import compile_rules
from subc.lang.rules import parse_rules
from subc.spec.front_end import parse_spec
from subc.errors import SubcError

RENDER = {"p4_16": render_p4_16, "p4_14": render_p4_14}
PORTS = (1, 2, 3)
SESSION = b"DIFFTEST01"
HEARTBEAT, END_OF_SESSION = 0, 0xFFFF


@st.composite
def rule_sets(draw, model) -> str:
    """2 to 6 rules over the model's query fields: a predicate, or two joined by ``and`` / ``or``,
    constants on and around the values messages are drawn from; each forwards to 1 to 3 of
    :data:`PORTS`."""
    fields = model.query_fields
    lines = []
    for _ in range(draw(st.integers(2, 6))):
        preds = []
        for _ in range(draw(st.integers(1, 2))):
            q = draw(st.sampled_from(fields))
            w = model.field_width(q.name)
            c = draw(st.one_of(st.sampled_from([0, 1, (1 << w) - 1, 1 << (w - 1)]), st.integers(0, (1 << w) - 1)))
            ops = ["==", "!="] if q.kind != "range" else ["==", "<", ">", "<=", ">=", "!="]
            preds.append(f"{q.name} {draw(st.sampled_from(ops))} {c}")
        cond = f" {draw(st.sampled_from(['and', 'or']))} ".join(preds)
        ports = draw(st.lists(st.sampled_from(PORTS), min_size=1, max_size=3, unique=True))
        lines.append(f"{cond} : fwd({', '.join(map(str, sorted(ports)))});")
    return "\n".join(lines) + "\n"


@st.composite
def feeds(draw, model, max_messages: int = 12):
    """A feed: datagrams of 1 to ``max_messages`` messages (mixed types, unknown types among them),
    a heartbeat among them, an end of session last: [(count, [(code, values), ...])]."""
    batches = draw(st.lists(st.lists(messages_for(model, allow_unknown=True), min_size=1, max_size=max_messages),
                            min_size=1, max_size=6))
    out = [(len(b), b) for b in batches]
    out.insert(draw(st.integers(0, len(out))), (HEARTBEAT, []))
    out.append((END_OF_SESSION, []))
    return out


def payloads(model, feed) -> list[bytes]:
    """The MoldUDP64 payloads of ``feed``, numbered as a publisher numbers them."""
    out, seq = [], 1
    for count, batch in feed:
        if count in (HEARTBEAT, END_OF_SESSION):
            p = moldudp64_payload([], SESSION, seq)
            out.append(p[:18] + count.to_bytes(2, "big"))
            continue
        out.append(moldudp64_payload([build_message(model, c, v) for c, v in batch], SESSION, seq))
        seq += len(batch)
    return out


def expected_copies(model, rules, feed, everyone) -> dict[int, list[tuple[int, int, tuple[bytes, ...]]]]:
    """Port -> [(sequence number, count, messages)] in feed order (see the module docstring);
    heartbeats and the end of session go to the ports ``everyone``."""
    headers = {p.field.split(".")[0] for r in rules for p in predicates(r.condition)}
    nxt = {p: 1 for p in PORTS}
    out: dict[int, list] = {p: [] for p in PORTS}
    for count, batch in feed:
        if count in (HEARTBEAT, END_OF_SESSION):
            for p in everyone:
                out[p].append((nxt[p], count, ()))
            continue
        per: dict[int, list[bytes]] = {}
        for code, values in batch:
            if not headers <= set(valid_instances(model, code)):
                continue
            fields = reference_fields(model, code, values)
            ports = {a[1] for r in rules if evaluate(r.condition, fields) for a in r.atoms() if a[0] == "fwd"}
            for p in ports:
                per.setdefault(p, []).append(build_message(model, code, values))
        for p in sorted(per):
            out[p].append((nxt[p], len(per[p]), tuple(per[p])))
            nxt[p] += len(per[p])
    return out


def wait_stat(topo, name: str, at_least: int) -> None:
    """Wait until the broker's counter ``name`` (``subc stats``) reaches ``at_least``."""
    from test_broker_netns import wait_until

    def reached():
        return json.loads(topo.subc(topo.brk, "stats", "--iface", topo.b0, "--json").stdout)["stats"][name] >= at_least

    wait_until(reached, f"the broker's {name} counter at {at_least}")


def draw_case(data, form: str, max_messages: int = 12):
    """(model, spec, rules, feed), or None when the drawn spec has no query field."""
    model = data.draw(spec_models(max_messages=3))
    if not model.query_fields:
        return None
    spec = parse_spec(RENDER[form](model), "m.p4")
    rules = parse_rules(data.draw(rule_sets(model)), spec, "r.sub")
    return model, spec, rules, data.draw(feeds(model, max_messages))


def write_capture(path: Path, model, pays: list[bytes]) -> None:
    """A pcap of the feed's datagrams to the spec's UDP port (scapy)."""
    from scapy.all import IP, UDP, Ether, Raw, wrpcap

    wrpcap(str(path), [Ether(dst="02:00:00:00:00:02", src="02:00:00:00:00:01") / IP(src="10.0.0.1", dst="10.0.0.2")
                       / UDP(sport=40000, dport=model.udp_port) / Raw(p) for p in pays])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data(), form=st.sampled_from(sorted(RENDER)))
def test_simulate_copies_are_the_rules_on_built_values(tmp_path_factory, data, form):
    from subc.sim.trace import simulate_trace

    case = draw_case(data, form)
    if case is None:
        return
    model, spec, rules, feed = case
    res = compile_rules(rules, spec, "bmv2")
    trace = tmp_path_factory.mktemp("d") / "feed.pcap"
    write_capture(trace, model, payloads(model, feed))
    out = simulate_trace(res, trace, udp_port=model.udp_port, copies=True)
    assert out.disagreements == 0
    used = sorted({a[1] for r in rules for a in r.atoms() if a[0] == "fwd"})  # a switch's subscriber ports
    want = expected_copies(model, rules, feed, used)
    for p in PORTS:
        got = [(c.seq, c.count, c.messages) for c, _ in out.port_copies.get(p, [])]
        assert got == want[p], f"port {p}"
        for c, _ in out.port_copies.get(p, []):
            assert c.session == SESSION


# ------------------------------------------------------------------------------ eBPF, netns

ENDPOINTS = {1: [(1, 7001)], 2: [(2, 7002)], 3: [(3, 7003), (1, 7004)]}


@pytest.fixture(scope="module")
def topo():
    from netns_util import Topology, need_root_and_netns

    need_root_and_netns()
    t = Topology("sdf")
    yield t
    t.remove()


@settings(max_examples=8, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture])
@given(data=st.data(), form=st.sampled_from(sorted(RENDER)), fanout=st.sampled_from([None, 1, 3, "sets"]))
def test_ebpf_copies_are_the_rules_on_built_values(topo, tmp_path_factory, data, form, fanout):
    """Random spec, rules and feed through the eBPF broker: every copy at every endpoint, its copies
    built by the XDP fan-out's devmap programs (``fanout``: its ``--fan-ratio``; 3 also broadcasts to
    every endpoint when recipients span interfaces, dropping the other clones in egress) or
    (``--no-fanout``) by TC.  ``"sets"``: ratio 1, the feed sent twice (the first time without its
    end of session, then a heartbeat), and between the two, once XDP has seen the first (its
    heartbeats counted), ``subc fanout --once`` makes the recipient-set device maps of the sets
    XDP noted, so that every datagram whose recipients span interfaces missed a map the first
    time and takes it the second.  With the fan-out, every
    endpoint receives its copies in sequence-number order, and in feed order when no datagram went
    to TC (only datagrams with a local-stack recipient do here)."""
    from subc.backends.files import target_files
    from subc.backends.output import write_directory
    from subc.semantics.delivery import split_payload
    from test_broker_netns import LISTENER_IDLE, stop, wait_bound
    from test_delivery_netns import received, send

    case = draw_case(data, form)
    if case is None:
        return
    model, spec, rules, feed = case
    try:
        res = compile_rules(rules, spec, "ebpf")
        files, _ = target_files(res, "r.sub")
    except SubcError as e:
        assume("spans more than 8 bytes" not in e.message)  # an unaligned 64-bit field: a stated limit
        raise
    tmp = tmp_path_factory.mktemp("e")
    out = write_directory(tmp / "out", files)
    subs = tmp / "subscribers.toml"
    subs.write_text(topo.subscribers_toml(ENDPOINTS))
    first = []
    if fanout == "sets":
        first = feed[:-1] + [(HEARTBEAT, [])]
        feed = first + feed
    pays = payloads(model, feed)
    ratio = 1 if fanout == "sets" else fanout
    topo.subc(topo.brk, "load", str(out), "--iface", topo.b0, "--subscribers", str(subs),
              *(["--fan-ratio", str(ratio)] if fanout else ["--no-fanout"]))
    procs = {}
    try:
        for sid, eps in ENDPOINTS.items():
            for k, port in eps:
                procs[(k, port)] = topo.popen_subc(
                    topo.subs[k - 1], "listen", f"10.10.{k}.2:{port}", "--timeout", str(LISTENER_IDLE), "--json",
                    "--save-pcap", str(tmp / f"got_{k}_{port}.pcap"))
        for (k, port), p in procs.items():
            wait_bound(p, f"10.10.{k}.2", port)
        if first:
            send(topo, pays[:len(first)], tmp, model.udp_port)
            beats = sum(1 for count, _ in first if count == HEARTBEAT)
            wait_stat(topo, "heartbeats", beats)  # XDP has run on every datagram of the first pass
            topo.subc(topo.brk, "fanout", "--iface", topo.b0, "--once")
            send(topo, pays[len(first):], tmp, model.udp_port)
        else:
            send(topo, pays, tmp, model.udp_port)
        got = {ep: [split_payload(p) for p in ps] for ep, ps in received(procs, tmp).items()}
        stats = json.loads(topo.subc(topo.brk, "stats", "--iface", topo.b0, "--json").stdout)
    finally:
        stop(procs.values())
        topo.subc(topo.brk, "unload", "--iface", topo.b0, check=False)
    want = expected_copies(model, rules, feed, list(ENDPOINTS))
    for sid, eps in ENDPOINTS.items():
        for ep in eps:
            copies = got[ep]
            assert all(c is not None for c in copies), f"endpoint {ep}: a malformed MoldUDP64 copy"
            assert all(c[0] == SESSION for c in copies)
            assert Counter((c[2], tuple(c[3])) for c in copies) == Counter((n, m) for _, n, m in want[sid]), \
                f"endpoint {ep} (subscriber {sid})"
            nxt = 1
            for seq, n in sorted((c[1], len(c[3])) for c in copies if c[2] not in (HEARTBEAT, END_OF_SESSION)):
                assert seq == nxt, f"endpoint {ep}: sequence gap or overlap at {seq} (expected {nxt})"
                nxt += n
            assert [c[1] for c in copies if c[2] == END_OF_SESSION] == [nxt]
            if fanout:
                seqs = [c[1] for c in copies if c[2] not in (HEARTBEAT, END_OF_SESSION)]
                assert seqs == sorted(seqs), f"endpoint {ep}: copies out of sequence order"
                if not stats["stats"]["to_tc"]:
                    assert [(c[2], tuple(c[3])) for c in copies] == [(n, m) for _, n, m in want[sid]], \
                        f"endpoint {ep}: copies out of feed order"
    s = stats["stats"]
    if fanout == "sets":  # each first-pass datagram that missed its set map takes it the second time
        assert s["to_fan_set"] == s["fan_set_miss"], s
        assert stats["fan_sets"]["datagrams"] == s["to_fan_set"], stats["fan_sets"]  # per set, as XDP counts
    if fanout:
        assert s["xdp_unicast"] == 0, s  # every copy XDP sends is built by the fan-out
    else:
        assert s["to_fan"] == 0 and s["fan_copies"] == 0, s
    assert s["errors"] == 0 and s["slot_lost"] == 0 and s["malformed"] == 0 and s["fanout_overflow"] == 0
