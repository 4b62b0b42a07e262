"""Byte layouts of BPF map keys and values (subc/backends/ebpf/layout.py).

``Struct.pack`` runs compiled :mod:`struct` packers (one per stretch of fields in one byte
order); hypothesis draws structs and values and compares the bytes with the fields encoded one
by one here (little-endian host words, big-endian ``be*`` words, byte arrays as given), and with
``unpack``.  Values that do not fit raise as the field-by-field packer does.
"""

from __future__ import annotations

import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from subc.backends.ebpf.layout import STRUCTS, Struct

SIZES = {"u8": 1, "u16": 2, "u32": 4, "u64": 8, "be16": 2, "be32": 4, "be64": 8, "pad": 1}


@st.composite
def struct_and_values(draw):
    n = draw(st.integers(1, 6))
    fields, values = [], {}
    for i in range(n):
        kind = draw(st.sampled_from(sorted(SIZES)))
        count = draw(st.integers(1, 4))
        name = f"f{i}"
        fields.append((name, kind, count))
        if draw(st.booleans()):
            continue  # missing: zero
        if kind == "pad" or (kind == "u8" and count > 1):
            values[name] = draw(st.binary(min_size=count, max_size=count))
        elif count == 1:
            values[name] = draw(st.integers(0, (1 << (8 * SIZES[kind])) - 1))
        else:
            values[name] = draw(st.lists(st.integers(0, (1 << (8 * SIZES[kind])) - 1), max_size=count))
    return Struct("t", tuple(fields)), values


def expected(s: Struct, values: dict) -> bytes:
    out = b""
    for name, kind, count in s.fields:
        v = values.get(name, 0)
        order = "big" if kind.startswith("be") else sys.byteorder
        if kind == "pad" or (kind == "u8" and count > 1):
            out += bytes(v) if v else bytes(count)
        elif count == 1:
            out += v.to_bytes(SIZES[kind], order)
        else:
            items = list(v or []) + [0] * (count - len(v or []))
            out += b"".join(x.to_bytes(SIZES[kind], order) for x in items)
    return out


@given(struct_and_values())
def test_pack_equals_fields_encoded_one_by_one(case):
    s, values = case
    data = s.pack(**values)
    assert data == expected(s, values)
    back = s.unpack(data)
    for name, kind, count in s.fields:
        if name in values and not (kind == "pad" or (kind == "u8" and count > 1)) and count > 1:
            assert back[name][: len(values[name])] == values[name]
        elif name in values:
            assert back[name] == values[name]


@pytest.mark.parametrize("s", STRUCTS, ids=lambda s: s.name)
def test_values_that_do_not_fit_raise(s):
    for name, kind, count in s.fields:
        if kind == "pad" or (kind == "u8" and count > 1):
            with pytest.raises(ValueError):
                s.pack(**{name: bytes(count + 1)})
            continue
        for bad in (1 << (8 * SIZES[kind]), -1):
            with pytest.raises((ValueError, OverflowError)):
                s.pack(**{name: bad if count == 1 else [bad]})
        if count > 1:
            with pytest.raises(ValueError):
                s.pack(**{name: [0] * (count + 1)})


@given(st.data())
def test_positional_packers_equal_pack(data):
    for s in STRUCTS:
        try:
            fast = s.packer()
        except ValueError:
            assert any(k == "pad" or (k == "u8" and c > 1) for _, k, c in s.fields) or \
                len({k.startswith("be") for _, k, _ in s.fields}) > 1
            continue
        values, flat = {}, []
        for name, kind, count in s.fields:
            vals = [data.draw(st.integers(0, (1 << (8 * SIZES[kind])) - 1)) for _ in range(count)]
            values[name] = vals[0] if count == 1 else vals
            flat += vals
        assert fast(*flat) == s.pack(**values) == expected(s, values)


@given(struct_and_values())
def test_field_readers_read_what_was_encoded(case):
    """``Struct.reader(name)`` on bytes encoded here field by field gives the field's value; arrays
    and padding have no reader."""
    s, values = case
    data = expected(s, values)
    for name, kind, count in s.fields:
        if count == 1 and kind != "pad":
            assert s.reader(name)(data) == values.get(name, 0)
        else:
            with pytest.raises(ValueError):
                s.reader(name)
    with pytest.raises(KeyError):
        s.reader("nothing")
