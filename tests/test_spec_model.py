"""Self-test of tests/spec_model.py (the independent model of random message-format specs):
rendering is deterministic and well formed, and the message and frame bytes carry the field
values bit for bit.  Bytes are checked with a bit slicer written here (int.from_bytes and
shifts), not with scapy, which built them."""

from __future__ import annotations

import copy
import re

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spec_model import (
    RESERVED,
    binaryfile,
    build_frame,
    build_message,
    message_length,
    messages_for,
    reference_fields,
    render_p4_14,
    render_p4_16,
    spec_models,
    valid_instances,
)

FAST = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])

PRAGMA_RE = re.compile(r"^@pragma (query_field|query_field_exact|query_field_lpm)\((\w+)\.(\w+)(?:,\s*(\d+))?\)$")
KIND = {"query_field": "range", "query_field_exact": "exact", "query_field_lpm": "lpm"}


def strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def balanced(text: str) -> bool:
    depth = {"{": 0, "(": 0}
    pairs = {"}": "{", ")": "("}
    for ch in strip_comments(text):
        if ch in depth:
            depth[ch] += 1
        elif ch in pairs:
            depth[pairs[ch]] -= 1
            if depth[pairs[ch]] < 0:
                return False
    return all(v == 0 for v in depth.values())


def p4_16_fields(text: str) -> dict[str, dict[str, int]]:
    """instance -> {field: width}, read from the text's header declarations and headers struct."""
    types = {
        m.group(1): {f: int(w) for w, f in re.findall(r"bit<(\d+)>\s+(\w+);", m.group(2))}
        for m in re.finditer(r"^header (\w+) \{(.*?)^\}", text, flags=re.S | re.M)
    }
    body = re.search(r"^struct headers \{(.*?)^\}", text, flags=re.S | re.M).group(1)
    return {inst: types[t] for t, inst in re.findall(r"^\s*(\w+)\s+(\w+);", body, flags=re.M)}


def p4_14_fields(text: str) -> dict[str, dict[str, int]]:
    types = {
        m.group(1): {f: int(w) for f, w in re.findall(r"(\w+)\s*:\s*(\d+);", m.group(2))}
        for m in re.finditer(r"^header_type (\w+) \{\s*fields \{(.*?)\}", text, flags=re.S | re.M)
    }
    return {inst: types[t] for t, inst in re.findall(r"^header (\w+) (\w+);", text, flags=re.M)}


def check_pragmas(text: str, model, fields: dict[str, dict[str, int]]) -> None:
    seen = {}
    for line in text.splitlines():
        if line.startswith("@pragma query_default_action"):
            assert line == f"@pragma query_default_action({model.default_action})"
            continue
        if not line.startswith("@pragma"):
            continue
        m = PRAGMA_RE.match(line)
        assert m, line
        kind, inst, f, w = m.groups()
        assert inst in fields and f in fields[inst], line
        assert w is None or int(w) == fields[inst][f], line
        seen[f"{inst}.{f}"] = KIND[kind]
    assert seen == {q.name: q.kind for q in model.query_fields}


def check_names(model) -> None:
    names = [h.instance for h in model.headers] + [h.type_name for h in model.headers]
    names += [f.name for h in model.headers for f in h.fields]
    names += list(model.states.values()) + [m.state for m in model.messages] + [model.parser_name]
    for n in names:
        assert re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", n), n
        assert n not in RESERVED and not n.startswith("subc_"), n
    insts = [h.instance for h in model.headers]
    assert len(insts) == len(set(insts))
    for h in model.headers:
        assert len({f.name for f in h.fields}) == len(h.fields)
        assert h.width_bits % 8 == 0


@FAST
@given(spec_models())
def test_rendering_is_deterministic_and_well_formed(model):
    check_names(model)
    assert 1 <= len(model.messages) <= 4 and len(set(model.codes)) == len(model.codes)
    for m in model.messages:
        assert 1 <= len(m.headers) <= 2
        for h in m.headers:
            assert 1 <= len(h.fields) <= 6 and all(1 <= f.width_bits <= 64 for f in h.fields)
    p16, p14 = render_p4_16(model), render_p4_14(model)
    assert render_p4_16(copy.deepcopy(model)) == p16 and render_p4_14(copy.deepcopy(model)) == p14

    # P4_16
    assert balanced(p16)
    assert p16.count("#include <core.p4>") == 1
    f16 = p4_16_fields(p16)
    assert f16 == {h.instance: {f.name: f.width_bits for f in h.fields} for h in model.headers}
    check_pragmas(p16, model, f16)
    states = re.findall(r"^    state (\w+) \{", p16, flags=re.M)
    assert len(states) == len(set(states)) and "start" in states
    targets = set(re.findall(r"transition (\w+);", p16)) | set(re.findall(r":\s*(\w+);", p16))
    consts = dict(re.findall(r"^const bit<\d+> (\w+) = (0[xX][0-9a-fA-F]+);", p16, flags=re.M))
    for t in targets - {"accept"}:
        assert t in states or t in consts, t
    extracts = re.findall(r"packet\.extract\(hdr\.(\w+)\);", p16)
    assert set(extracts) == set(f16)

    # P4_14
    assert balanced(p14)
    f14 = p4_14_fields(p14)
    assert f14 == f16
    check_pragmas(p14, model, f14)
    parsers = re.findall(r"^parser (\w+) \{", p14, flags=re.M)
    assert len(parsers) == len(set(parsers)) and "start" in parsers
    defines = dict(re.findall(r"^#define (\w+) (\S+)$", p14, flags=re.M))
    assert defines == consts
    for t in set(re.findall(r"return (\w+);", p14)) | set(re.findall(r"^\s+\w+ : ([A-Za-z_]\w*);", p14, flags=re.M)):
        assert t in parsers or t == "ingress", t
    for ref in re.findall(r"select\((\w+)\.(\w+)\)", p14):
        assert ref[0] == "latest" or ref[1] in f14[ref[0]], ref


def slice_fields(data: bytes, header_list, start_bit: int = 0) -> dict[str, int]:
    """Independent bit slicer: every field of the headers, laid out from ``start_bit``."""
    n = int.from_bytes(data, "big")
    total = len(data) * 8
    out, off = {}, start_bit
    for h in header_list:
        for f in h.fields:
            out[f"{h.instance}.{f.name}"] = (n >> (total - off - f.width_bits)) & ((1 << f.width_bits) - 1)
            off += f.width_bits
    assert off <= total
    return out


@FAST
@given(st.data())
def test_message_bytes_carry_the_values(data):
    model = data.draw(spec_models())
    code, values = data.draw(messages_for(model, allow_unknown=True))
    msg = build_message(model, code, values)
    m = model.message(code)
    headers = [model.type_header] + (m.headers if m else [])
    assert len(msg) == model.type_width // 8 + sum(h.width_bits for h in headers[1:]) // 8
    assert len(msg) == message_length(model, code)
    sliced = slice_fields(msg, headers)
    ref = reference_fields(model, code, values)
    assert sliced == ref
    assert ref[f"{model.type_header.instance}.{model.type_field.name}"] == code
    for k, v in values.items():
        assert ref[k] == v
    assert valid_instances(model, code) == [h.instance for h in headers]
    assert valid_instances(model, code, framing=True)[:5] == [h.instance for h in model.framing]


@FAST
@given(st.data())
def test_frames_and_binaryfiles(data):
    model = data.draw(spec_models(max_messages=2))
    msgs = data.draw(st.lists(messages_for(model), min_size=1, max_size=3))
    seq = data.draw(st.integers(0, (1 << 64) - 1))
    frame = build_frame(model, msgs, session=b"S1", seq=seq)
    bodies = [build_message(model, c, v) for c, v in msgs]
    # Ethernet (14) / IPv4 without options (20) / UDP (8), read by offsets
    assert frame[12:14] == b"\x08\x00"
    assert frame[14] == 0x45 and frame[23] == 17
    assert int.from_bytes(frame[16:18], "big") == len(frame) - 14
    assert int.from_bytes(frame[36:38], "big") == model.udp_port
    assert int.from_bytes(frame[38:40], "big") == len(frame) - 34
    mold = frame[42:]
    assert mold[:10] == b"S1        "
    assert int.from_bytes(mold[10:18], "big") == seq
    assert int.from_bytes(mold[18:20], "big") == len(msgs)
    pos = 20
    for body in bodies:
        ln = int.from_bytes(mold[pos : pos + 2], "big")
        assert mold[pos + 2 : pos + 2 + ln] == body
        pos += 2 + ln
    assert pos == len(mold)
    # the framing headers of the model describe these bytes (the first message's block)
    first = slice_fields(frame, model.framing + [model.type_header])
    assert first[f"{model.udp.instance}.{model.udp.fields[1].name}"] == model.udp_port
    assert first[f"{model.ethernet.instance}.{model.ethernet.fields[2].name}"] == 0x0800
    assert first[f"{model.mold_msg.instance}.{model.mold_msg.fields[0].name}"] == len(bodies[0])
    assert first[f"{model.type_header.instance}.{model.type_field.name}"] == msgs[0][0]
    other = build_frame(model, msgs[:1], dst_port=model.udp_port ^ 1)
    assert int.from_bytes(other[36:38], "big") == model.udp_port ^ 1

    bf = binaryfile(bodies)
    pos = 0
    for body in bodies:
        ln = int.from_bytes(bf[pos : pos + 2], "big")
        assert bf[pos + 2 : pos + 2 + ln] == body
        pos += 2 + ln
    assert pos == len(bf)
