"""P4Info (``p4info.txtpb``) of the P4 programs subc generates, for P4Runtime controllers.

The P4Info message (P4Runtime specification v1.3, section 6 "P4Info") names every object a
controller reaches: the match-action tables (keys with their match kinds and widths in bits, the
actions each may run, the size), the actions (their directionless parameters with widths), the
counters and the registers.  It is built here from the same pipeline the program templates
render (:mod:`.p4program`), with the ``p4runtime`` protobuf bindings, so that it equals what
``p4c --p4runtime-files`` writes for the generated program:

* IDs follow p4c's assignment (``control-plane/p4RuntimeSymbolTable.cpp``): the resource type in
  the top 8 bits (P4Runtime specification section 6.3, ``P4Ids``: action 0x01, table 0x02,
  counter 0x12, register 0x16) and the Jenkins one-at-a-time hash of the fully qualified name in the low 24,
  names taken in sorted order with linear probing on a collision; match fields and parameters
  are numbered from 1 in declaration order;
* aliases are the shortest suffix of a name (in dot-separated components) that no other name
  ends with;
* a match field is named by its key's ``@name`` annotation, else by the key expression.

Whole programs only (v1model for bmv2, TNA for tofino): a pragma-only spec's control block is not
a program a P4Runtime server can run.  The TNA P4Info uses the standard counter and register
messages; Intel's compiler may describe TNA externs differently (not checked: no bf-p4c here).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...compiler.driver import CompileResult
from ...ir.aggregates import UPDATE_ATOM
from ...ir.decisions import COUNT_ATOM
from .tables import Table
from ...compiler.target import Target
from .p4info_shape import shape_digest
from .slots import COUNTERS, SlotPlan

#: P4Runtime resource type prefixes (P4Runtime specification section 6.3, p4info.proto P4Ids).
PREFIX = {"action": 0x01, "table": 0x02, "counter": 0x12, "register": 0x16}
#: P4Info MatchField.MatchType of each match kind.
MATCH_TYPE = {"exact": 2, "lpm": 3, "ternary": 4, "range": 5, "optional": 6}
CONTROL, EGRESS = "SubcIngress", "SubcEgress"


@dataclass
class P4Action:
    """An action of the program: fully qualified ``name``, directionless ``params`` (name, bits)
    and its annotations as written in the program."""

    name: str
    params: list[tuple[str, int]]
    annotations: tuple[str, ...] = ()


@dataclass
class P4Table:
    """A table: fully qualified ``name``; ``keys`` (match-field name, bits, match kind);
    ``actions`` (action name, default only); ``size`` in entries."""

    name: str
    keys: list[tuple[str, int, str]]
    actions: list[tuple[str, bool]]
    size: int


@dataclass
class P4Extern:
    """A counter (``kind`` "counter", ``unit`` PACKETS/BYTES/BOTH) or a register (``kind``
    "register", ``width`` bits per cell) of ``size`` cells."""

    kind: str
    name: str
    size: int
    unit: str = ""
    width: int = 0


@dataclass
class ControlPlane:
    """The objects of a program a P4Runtime controller sees, in declaration order."""

    arch: str
    actions: list[P4Action]
    tables: list[P4Table]
    externs: list[P4Extern]


def jenkins_hash(name: str) -> int:
    """Bob Jenkins's one-at-a-time hash of ``name``'s bytes (32 bits), as p4c computes it."""
    h = 0
    for b in name.encode():
        h = (h + b) & 0xFFFFFFFF
        h = (h + (h << 10)) & 0xFFFFFFFF
        h ^= h >> 6
    h = (h + (h << 3)) & 0xFFFFFFFF
    h ^= h >> 11
    return (h + (h << 15)) & 0xFFFFFFFF


def assign_ids(names: dict[str, list[str]]) -> dict[tuple[str, str], int]:
    """IDs of the named resources (``names``: resource type -> fully qualified names), as p4c
    assigns them when no ``@id`` is given: per type, names in sorted order, the hash's low 24
    bits under the type prefix, the next free value on a collision."""
    used: set[int] = set()
    out: dict[tuple[str, str], int] = {}
    for kind, ns in names.items():
        for n in sorted(set(ns)):
            h = jenkins_hash(n)
            while True:
                i = PREFIX[kind] << 24 | (h & 0xFFFFFF)
                if i not in used:
                    break
                h += 1
            used.add(i)
            out[(kind, n)] = i
    return out


def aliases(names: list[str]) -> dict[str, str]:
    """The shortest dot-separated suffix of each name that no other name shares."""
    parts = {n: n.split(".") for n in names}
    out = {}
    for n, p in parts.items():
        for k in range(1, len(p) + 1):
            suffix = p[-k:]
            if not any(o != n and q[-k:] == suffix for o, q in parts.items()):
                out[n] = ".".join(suffix)
                break
        else:
            out[n] = n
    return out


def _action_name(text: str) -> str:
    """``subc_set_state(meta.subc_s0_state)`` -> ``subc_set_state``."""
    return text.split("(", 1)[0].strip()


def _key_name(key_name: str, annotated: bool) -> str:
    from .entries import bfrt_key_name

    return bfrt_key_name(key_name) if annotated else key_name


def _table(t: Table, name: str, key_names: list[str], control: str = CONTROL) -> P4Table:
    acts = [(f"{control}.{_action_name(a)}", False) for a in t.actions]
    if t.default_action[0] == "NoAction":
        acts.append(("NoAction", True))
    return P4Table(f"{control}.{name}", [(kn, k.width, k.match_kind) for kn, k in zip(key_names, t.keys)], acts, t.size)


def _state_actions(pipe) -> list[P4Action]:
    """``subc_update(mask)`` when the rules compare state, and ``subc_count(mask)`` when they
    update named counters (:mod:`.p4state`), in declaration order."""
    if pipe.state is None:
        return []
    out = [P4Action(f"{CONTROL}.{UPDATE_ATOM}", [("mask", pipe.state.mask_width)])]
    if pipe.state.count_updates:
        out.append(P4Action(f"{CONTROL}.{COUNT_ATOM}", [("mask", pipe.state.count_width)]))
    return out


def _state_registers(pipe, tna: bool) -> list[P4Extern]:
    """The registers of the comparisons on state, in declaration order (:mod:`.p4state`): v1model
    arrays of 64-bit cells; TNA one 32-bit cell each."""
    if pipe.state is None:
        return []
    from .state import registers as state_registers, tofino_registers  # (a rule set without state does not import it)

    if tna:
        return [P4Extern("register", f"{CONTROL}.{name}", 1, width=32) for name, _ in tofino_registers(pipe.state)]
    return [P4Extern("register", f"{CONTROL}.{name}", cells, width=64) for name, cells in state_registers(pipe.state)]


def control_plane(res: CompileResult, plan: SlotPlan | None) -> ControlPlane:
    """The controller's view of the program :func:`~.p4program.render_program` writes for
    ``res`` (bmv2 or tofino, a whole program) with the multi-message ``plan`` (or None)."""
    pipe, spec = res.pipeline, res.spec
    tna = res.target == Target.TOFINO
    q = lambda a: f"{CONTROL}.{a}"  # noqa: E731
    uses_code = any(t.role == "code" for t in pipe.tables)
    spec_actions = [P4Action(q(a.name), list(a.params)) for a in spec.actions.values()]
    externs: list[P4Extern] = []
    if plan is None:
        actions = [
            P4Action(q("subc_fwd"), [("port", 9)]),
            P4Action(q("subc_mcast"), [("group", 16)]),
            P4Action(q("subc_drop"), []),
            P4Action(q("subc_nop"), []),
            P4Action(q("subc_set_state"), [("next_state", pipe.state_width)]),
        ]
        if uses_code:
            actions.append(P4Action(q("subc_set_code"), [("code", pipe.code_width)]))
        actions += _state_actions(pipe) + spec_actions
        externs += _state_registers(pipe, tna)
        tables = [_table(t, t.name, [_key_name(k.name, tna) for k in t.keys]) for t in pipe.tables]
        called = {q(pipe.default_action[0])} if pipe.headers else set()  # the apply block's else branch
    else:
        from .entries import slot_key
        from .slots import deliver_table, message_action, message_tables, port_bit_table, slot_table_name

        actions = [P4Action(q("subc_set_state"), [("next_state", pipe.state_width)])]
        if uses_code:
            actions.append(P4Action(q("subc_set_code"), [("code", pipe.code_width)]))
        actions += [
            P4Action(q("subc_msg_fwd"), [("ports", plan.port_bits)]),
            P4Action(q("subc_msg_hold"), [("code", 8)]),
            P4Action(q("subc_unicast"), [("port", 9)]),
            P4Action(q("subc_multicast"), []),
            P4Action(q("subc_to_overflow"), []),
            P4Action(q("subc_drop_datagram"), []),
        ]
        actions += _state_actions(pipe) + spec_actions
        tables = []
        for i in range(plan.max_messages):
            for t in message_tables(plan, pipe):
                tables.append(
                    _table(
                        t,
                        slot_table_name(t.name, i),
                        [_key_name(slot_key(k.name, i, plan, pipe), True) for k in t.keys],
                    )
                )
        tables.append(_table(deliver_table(plan), "subc_deliver", ["subc_union"]))
        actions.append(P4Action(f"{EGRESS}.subc_set_port_bit", [("port_bit", plan.port_bits)]))
        port_key = "eg_intr_md.egress_port" if tna else "standard_metadata.egress_port"
        tables.append(_table(port_bit_table(plan, port_key), "subc_port_bit", ["egress_port"], EGRESS))
        called = {
            q("subc_to_overflow"),
            q("subc_drop_datagram"),
            q("subc_multicast"),
            q(message_action(plan, pipe, pipe.default_action)[0]),
        }
        n_held = max(plan.held.values()) + 1
        externs.append(P4Extern("counter", q("subc_datagrams"), len(COUNTERS), unit="PACKETS"))
        if tna:
            externs += [
                P4Extern("counter", q(f"subc_held_s{i}"), n_held, unit="PACKETS") for i in range(plan.max_messages)
            ]
            externs += _state_registers(pipe, tna)
            externs.append(P4Extern("register", f"{EGRESS}.subc_seq", 512, width=32))
        else:
            externs.append(P4Extern("counter", q("subc_held"), n_held, unit="PACKETS"))
            externs += _state_registers(pipe, tna)
            externs.append(P4Extern("register", f"{EGRESS}.subc_seq", 512, width=64))
    # subc_set_root and subc_root are declared right after subc_set_state (templates/p4)
    at = next(i for i, a in enumerate(actions) if a.name == q("subc_set_state")) + 1
    actions.insert(at, P4Action(q("subc_set_root"), [("root", pipe.state_width)]))
    tables.insert(0, P4Table(q("subc_root"), [], [(q("subc_set_root"), False)], 1))
    # p4c's front end drops the actions no table lists and no apply block calls
    used = {a for t in tables for a, _ in t.actions} | called
    noaction = [P4Action("NoAction", [], ('@noWarn("unused")',))] if "NoAction" in used else []
    return ControlPlane("tna" if tna else "v1model", noaction + [a for a in actions if a.name in used], tables, externs)


def p4info(cp: ControlPlane):
    """The ``p4.config.v1.P4Info`` message of ``cp`` (the ``p4runtime`` protobuf bindings)."""
    from p4.config.v1 import p4info_pb2 as pi

    ids = assign_ids(
        {
            "table": [t.name for t in cp.tables],
            "action": [a.name for a in cp.actions],
            "counter": [e.name for e in cp.externs if e.kind == "counter"],
            "register": [e.name for e in cp.externs if e.kind == "register"],
        }
    )
    alias = aliases([t.name for t in cp.tables] + [a.name for a in cp.actions] + [e.name for e in cp.externs])
    msg = pi.P4Info()
    msg.pkg_info.arch = cp.arch
    for t in cp.tables:
        m = msg.tables.add()
        m.preamble.id, m.preamble.name, m.preamble.alias = ids[("table", t.name)], t.name, alias[t.name]
        for j, (name, width, kind) in enumerate(t.keys, 1):
            f = m.match_fields.add()
            f.id, f.name, f.bitwidth, f.match_type = j, name, width, MATCH_TYPE[kind]
        for a, default_only in t.actions:
            r = m.action_refs.add()
            r.id = ids[("action", a)]
            if default_only:
                r.annotations.append("@defaultonly")
                r.scope = pi.ActionRef.DEFAULT_ONLY
        m.size = t.size
    for act in cp.actions:
        m = msg.actions.add()
        m.preamble.id, m.preamble.name, m.preamble.alias = ids[("action", act.name)], act.name, alias[act.name]
        m.preamble.annotations.extend(act.annotations)
        for j, (name, width) in enumerate(act.params, 1):
            p = m.params.add()
            p.id, p.name, p.bitwidth = j, name, width
    for e in cp.externs:
        if e.kind == "counter":
            m = msg.counters.add()
            m.spec.unit = getattr(pi.CounterSpec, e.unit)
        else:
            m = msg.registers.add()
            m.type_spec.bitstring.bit.bitwidth = e.width
        m.preamble.id, m.preamble.name, m.preamble.alias = ids[(e.kind, e.name)], e.name, alias[e.name]
        m.size = e.size
    msg.type_info.SetInParent()
    return msg


def p4info_text(res: CompileResult, plan: SlotPlan | None) -> tuple[str, str]:
    """(``p4info.txtpb``: the P4Info of ``res``'s program in protobuf text format with the header
    p4c writes, its :func:`shape_digest`)."""
    from google.protobuf import text_format

    info = p4info(control_plane(res, plan))
    body = text_format.MessageToString(info)
    return "# proto-file: p4/config/v1/p4info.proto\n# proto-message: p4.config.v1.P4Info\n\n" + body, shape_digest(
        info
    )
