"""``Map.array_values`` (BPF_MAP_LOOKUP_BATCH in chunks; one lookup each where the kernel has no
batch operations) against one ``bpf_lookup_elem`` per index, on a real BPF array map (root, bcc):
random values at random indexes, any chunk size, any count up to past the map's size.  A restarted
``subc serve`` reads its inherited states this way (``LiveMaps.inherit``)."""

from __future__ import annotations

import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ebpf_util import need_root

SIZE = 300
VALUE = 12  # bytes: not a multiple of 8, as the broker's INFO and LEAF structs need not be


@pytest.fixture(scope="module")
def array():
    need_root()
    from subc.dataplane.ebpf.bpf import Map, import_bcc

    bcc = import_bcc()
    b = bcc.BPF(text=f"struct v {{ u32 w[{VALUE // 4}]; }}; BPF_ARRAY(arr, struct v, {SIZE}); "
                     "int f(void *ctx) { return 0; }")
    try:
        yield Map(b["arr"].get_fd(), 4, VALUE, name="arr")
    finally:
        b.cleanup()


@settings(max_examples=40, deadline=None)
@given(
    writes=st.dictionaries(st.integers(0, SIZE - 1), st.binary(min_size=VALUE, max_size=VALUE), max_size=60),
    count=st.integers(0, SIZE + 5),
    chunk=st.sampled_from([1, 7, 64, 8192]),
    batch=st.booleans(),
)
def test_array_values_equal_one_lookup_each(array, writes, count, chunk, batch):
    for i in range(SIZE):  # an array map's entries always exist: reset them
        array.update(i.to_bytes(4, sys.byteorder), bytes(VALUE))
    for i, v in writes.items():
        array.update(i.to_bytes(4, sys.byteorder), v)
    array._batch = batch  # False: the path of a kernel without batch operations
    got = array.array_values(count, chunk=chunk)
    want = [array.lookup(i.to_bytes(4, sys.byteorder)) for i in range(count)]
    assert got == want
    assert [got[i] for i in writes if i < count] == [v for i, v in writes.items() if i < count]
