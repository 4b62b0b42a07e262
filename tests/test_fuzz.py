"""Fuzzing the input readers: the spec parser, the ITCH BinaryFILE readers, MoldUDP64 and pcap/pcapng.

The contract (issue 6): every input either parses or raises :class:`SubcError` — for spec text with
a location, for binary input with a message that names the file (the path given to the reader)
and a byte offset — in under a second and a bounded amount of memory.  Where two readers read the
same format (``subc simulate``'s BinaryFILE reader and the pipeline's ``walk_binaryfile``, both
framing by the spec's message type lengths; the whole file and its splits; the scalar and the
vectorised spec decoders; MoldUDP64 decoding and encoding) they must also agree.

The corpora under ``tests/fuzz_corpus/{spec,itch,pcap}`` hold seeds and every input that once broke
a reader; each file is replayed here, and they seed a short hypothesis run of mutations (byte and
character insertions, deletions, duplications, truncations, overwrites with boundary values) and of
random token soup.  ``SUBC_FUZZ_EXAMPLES=20000 python3 -m pytest tests/test_fuzz.py`` makes the run
long; ``tests/fuzz_atheris.py`` runs the same checks under atheris (coverage-guided).
"""

from __future__ import annotations

import gc
import os
import re
import resource
import struct
import tempfile
import time
import tracemalloc
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from subc.spec.front_end import load_spec, parse_spec
from subc.spec.model import MAX_FIELD_WIDTH
from subc.errors import SubcError
from subc.analysis.messages import decode
from subc.analysis.splits import file_kind, plan_splits, read_pcap, read_split, walk_binaryfile
from subc.workloads.itch_codec import (
    decode_add_order,
    encode_add_order,
    iter_binaryfile,
    read_binaryfile,
    stock_value,
)
from subc.wire.moldudp64 import decode_packet, encode_end_of_session, encode_packet
from subc.wire.decoder import MessageDecoder
from subc.sim.trace import SimulationResult, binaryfile_messages

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "fuzz_corpus"
EXAMPLE_SPEC = HERE.parent / "examples" / "itch" / "spec.p4"
#: The example spec's decoder (scalar) and its vectorised form, and its message type lengths.
DECODER = MessageDecoder(load_spec(EXAMPLE_SPEC))
TYPES = DECODER.types


def _vector():
    from subc.analysis.gather import VectorDecoder

    return VectorDecoder(DECODER)


VECTOR = _vector()


def _warm_up() -> None:
    """Decode one message once, so that one-time costs (NumPy and Arrow kernels loading on first
    use) are not charged to the first input's CPU-time bound."""
    msg = b"S" + bytes(TYPES.lengths[ord("S")] - 1)
    decode(walk_binaryfile(len(msg).to_bytes(2, "big") + msg, 0, "warm-up", True, TYPES), 0, VECTOR)

#: Per input: CPU seconds, and bytes that Python and NumPy may allocate at the peak
#: (tracemalloc) and that the resident set may grow by (inputs are at most ~64 KB).  The time limit
#: catches hangs and blowups (the quadratic scans these tests found took 29 s and more), not
#: speed: the slowest well-behaved inputs take about 0.5 s of CPU time here with tracemalloc on,
#: and a 1 s limit failed one of them on a busy CI machine (1.1 s), so it has a 10x margin.
TIME_LIMIT = 5.0
MEMORY_LIMIT = 32 << 20
RSS_LIMIT = 256 << 20

EXAMPLES = int(os.environ.get("SUBC_FUZZ_EXAMPLES", "0"))


def fuzz_settings(n: int):
    """Hypothesis settings for a short run of ``n`` examples (``SUBC_FUZZ_EXAMPLES`` overrides)."""
    return settings(
        max_examples=EXAMPLES or n,
        # no wall-clock deadline: on a busy machine it fails inputs that are fine; :func:`bounded`
        # bounds each input's CPU time, memory and resident set instead
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
        database=None,
    )


# ------------------------------------------------------------------------------ bounds


@contextmanager
def bounded(what: str, time_limit: float = TIME_LIMIT):
    """Assert that the body runs in under ``time_limit`` seconds of CPU time (the garbage collector
    paused meanwhile, so that the time is the body's own, not a collection of what earlier tests
    left on the heap), allocates at most
    :data:`MEMORY_LIMIT` bytes at the peak (tracemalloc: Python objects and NumPy arrays) and grows
    the resident set by at most :data:`RSS_LIMIT`.  Starts and stops tracemalloc unless it is on
    already (in CPython 3.11 each start and stop leaks a few KB, harmless for a few thousand
    inputs; tracing all the time makes hypothesis and atheris several times slower)."""
    started = not tracemalloc.is_tracing()
    if started:
        tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    collecting = gc.isenabled()
    gc.disable()
    t0 = time.process_time()  # CPU time: a busy CI machine does not make an input "slow"
    try:
        yield
    finally:
        elapsed = time.process_time() - t0
        if collecting:
            gc.enable()
        peak = tracemalloc.get_traced_memory()[1] - base
        if started:
            tracemalloc.stop()
        grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss
    # tracemalloc slows Python code down a few times: the time limit holds with it on
    assert elapsed < time_limit, f"{what}: took {elapsed:.3f} s"
    assert peak < MEMORY_LIMIT, f"{what}: allocated {peak / 2**20:.1f} MiB"
    assert grown < RSS_LIMIT, f"{what}: resident set grew by {grown / 2**20:.1f} MiB"


_OFFSET = re.compile(r"byte offset (\d+)")


def check_binary_error(e: SubcError, path: str, size: int) -> None:
    """A reader's error on a file of ``size`` bytes names ``path`` and a byte offset in the file."""
    assert e.message.startswith(f"{path}: "), e.message
    offsets = [int(m) for m in _OFFSET.findall(e.message)]
    assert offsets, f"no byte offset in {e.message!r}"
    assert all(0 <= o <= size for o in offsets), e.message
    str(e)


def outcome(fn):
    """(result, None) or (None, SubcError); any other exception propagates (a bug)."""
    try:
        return fn(), None
    except SubcError as e:
        return None, e


# ------------------------------------------------------------------------------ checks


def check_spec(text: str, path: str = "fuzz.p4"):
    """``parse_spec(text)``: a spec whose query fields are 1 to 128 bits wide, or a SubcError with a
    location in ``text``."""
    with bounded(f"parse_spec of {len(text)} characters"):
        spec, err = outcome(lambda: parse_spec(text, path))
    if err is not None:
        loc = err.location
        assert loc is not None, f"no location: {err}"
        assert loc.path == path
        assert 1 <= loc.line <= text.count("\n") + 1, (loc, len(text))
        assert 1 <= loc.column <= len(loc.source_line) + 1, loc
        err.render()
        return None
    for q in spec.query_fields.values():
        assert 1 <= q.width <= MAX_FIELD_WIDTH, q
        assert q.scale is None or 0 <= q.scale <= 18, q
    return spec


def check_spec_file(path: Path) -> None:
    """``load_spec`` of a corpus file (any bytes): as :func:`check_spec`."""
    data = path.read_bytes()
    with bounded(f"load_spec {path.name}"):
        _, err = outcome(lambda: load_spec(path))
    if err is not None:
        assert err.location is not None and err.location.path == str(path), err
    else:
        check_spec(data.decode("utf-8"), str(path))


def _messages(buf) -> list[bytes]:
    return [bytes(buf.data[s : s + n]) for s, n in zip(buf.starts.tolist(), buf.lengths.tolist())]


def check_decode(buf) -> None:
    """The vectorised decoder gives valid Arrow data, the scalar decoder's status and values for
    every message, and on well-formed Add Orders the values of ``decode_add_order`` (an ITCH codec
    that does not use the spec)."""
    from subc.analysis.gather import STATUSES

    batch, vd = decode(buf, 0, VECTOR)
    batch.validate(full=True)
    assert batch.num_rows == len(buf)
    msgs = _messages(buf)
    for i, m in enumerate(msgs):
        d = DECODER.decode(m)
        assert STATUSES[vd.status[i]] == d.status, (m, d)
        if d.classified:
            got = {f: int(vd.values[f][i]) for f in d.values}
            assert got == d.values
        if m[:1] in (b"A", b"F") and len(m) == TYPES.lengths[m[0]]:
            ref = decode_add_order(m)
            assert all(d.values[f] == v for f, v in ref.items() if f in d.values)


def check_itch(data: bytes, path: str = "fuzz.itch", workdir: str | None = None) -> None:
    """A BinaryFILE: ``iter_binaryfile`` and ``walk_binaryfile`` agree (same messages at the same
    offsets, or both raise SubcError naming ``path`` and a byte offset); then, with ``workdir``,
    the file's splits agree with the whole file."""
    n = len(data)
    with bounded(f"BinaryFILE of {n} bytes"):
        msgs, err1 = outcome(lambda: [(int(t.where.split()[-1]), t.msg) for t in
                                      binaryfile_messages(data, path, DECODER, SimulationResult())])
        buf, err2 = outcome(lambda: walk_binaryfile(data, 0, path, True, TYPES))
        if buf is not None:
            check_decode(buf)
    for err in (err1, err2):
        if err is not None:
            check_binary_error(err, path, n)
    assert (err1 is None) == (err2 is None), (err1, err2)
    if buf is not None:
        assert _messages(buf) == [m for _, m in msgs]
        assert buf.positions.tolist() == [o for o, _ in msgs]
    # a split that is not the last: a frame may not run past its end
    with bounded(f"BinaryFILE split of {n} bytes"):
        part, err = outcome(lambda: walk_binaryfile(data, 1000, path, False, TYPES))
    if err is not None:
        check_binary_error(err, path, n + 1000)
    else:
        assert buf is not None, "a split reads what the whole file does not"
        assert _messages(part) == _messages(buf)
        assert part.positions.tolist() == [o + 1000 for o, _ in msgs]
    if workdir is not None:
        check_splits(data, path, workdir, buf)


def check_splits(data: bytes, name: str, workdir: str, whole) -> None:
    """The file cut into splits of 256 and 4096 bytes: if every split reads, their messages are the
    whole file's, in order."""
    file = os.path.join(workdir, name)
    Path(file).write_bytes(data)
    for split_bytes in (256, 4096):
        with bounded(f"splits of {split_bytes} bytes of {len(data)} bytes"):
            splits, err = outcome(lambda sb=split_bytes: plan_splits([file], sb, TYPES))
            assert err is None, err
            parts = []
            for sp in splits:
                part, err = outcome(lambda sp=sp: read_split(sp, TYPES))
                if err is not None:
                    check_binary_error(err, file, len(data))
                    break
                parts.append(part)
        if err is None:
            assert whole is not None, "the splits read a file that does not read whole"
            assert [m for p in parts for m in _messages(p)] == _messages(whole)


def check_mold(data: bytes) -> None:
    """``decode_packet``: a packet that encodes back to ``data``, or a SubcError with a byte offset."""
    with bounded(f"MoldUDP64 packet of {len(data)} bytes"):
        pkt, err = outcome(lambda: decode_packet(data))
    if err is not None:
        assert err.message.startswith("MoldUDP64: ") and _OFFSET.search(err.message), err.message
        assert all(int(o) <= len(data) for o in _OFFSET.findall(err.message)), err.message
        return
    again = (encode_end_of_session(pkt.session_bytes, pkt.seq) if pkt.is_end_of_session
             else encode_packet(pkt.session_bytes, pkt.seq, pkt.messages))
    assert again == data


def check_capture(data: bytes, workdir: str, name: str = "fuzz.pcap") -> None:
    """A trace file (usually a capture): ``file_kind`` and ``read_split`` of its one split, and
    ``read_pcap`` with and without a port filter: messages, or SubcError naming the file and a
    byte offset."""
    file = os.path.join(workdir, name)
    Path(file).write_bytes(data)
    with bounded(f"capture of {len(data)} bytes"):
        kind = file_kind(file)
        splits = plan_splits([file], 0, TYPES)
        assert len(splits) == 1 and splits[0].kind == kind
        buf, err = outcome(lambda: read_split(splits[0], TYPES))
        if buf is not None:
            check_decode(buf)
        if kind == "pcap":
            buf2, err2 = outcome(lambda: read_pcap(file, udp_port=26400))
            if buf2 is not None:
                check_decode(buf2)
        else:
            _, err2 = outcome(lambda: read_pcap(file))
            assert err2 is not None  # not a capture
    for e in (err, err2):
        if e is not None:
            check_binary_error(e, file, len(data))


# ------------------------------------------------------------------------------ seeds


def _msg(t: bytes, fill: int) -> bytes:
    return t + bytes((fill + i) % 251 for i in range(TYPES.lengths[t[0]] - 1))


def itch_messages() -> list[bytes]:
    """A few ITCH messages: Add Orders (A and F), and other types."""
    add = [
        encode_add_order({"add_order.stock_locate": 7, "add_order.tracking_number": 2, "add_order.timestamp": 34200 * 10**9,
                          "add_order.order_ref_number": 1000 + k, "add_order.buy_sell_indicator": ord("BS"[k % 2]),
                          "add_order.shares": 100 * (k + 1), "add_order.stock": stock_value(["AAPL", "GOOGL", "MSFT"][k % 3]),
                          "add_order.price": 1442100 + k}, mpid=b"NSDQ" if k == 2 else None)
        for k in range(4)
    ]
    return [_msg(b"S", 1)] + add[:2] + [_msg(b"R", 3), _msg(b"E", 5), add[2], _msg(b"X", 7), _msg(b"P", 9), add[3]]


def binaryfile(msgs: list[bytes], zero_length: tuple[int, ...] = (), end_marker: bool = False) -> bytes:
    """BinaryFILE framing: each message after its 2-byte big-endian length (0 for the messages at
    ``zero_length``: the zero-length quirk), then an end-of-session marker if asked."""
    out = b"".join((0 if i in zero_length else len(m)).to_bytes(2, "big") + m for i, m in enumerate(msgs))
    return out + (b"\x00\x00" if end_marker else b"")


def itch_seeds() -> list[bytes]:
    msgs = itch_messages()
    return [binaryfile(msgs), binaryfile(msgs, (1, 4), True), binaryfile(msgs * 20)]


def mold_seeds() -> list[bytes]:
    msgs = itch_messages()
    return [encode_packet("SESSION01", 1, msgs[:3]), encode_packet("S", 10, []), encode_end_of_session("S", 11),
            encode_packet("X", 2**64 - 1, [b"", b"A"])]


def udp_frame(payload: bytes, link: str = "eth", dport: int = 26400, v6: bool = False) -> bytes:
    """An Ethernet ('eth'), Linux cooked ('sll') or raw IP ('raw') frame of one UDP datagram."""
    udp = struct.pack("!HHHH", 40000, dport, 8 + len(payload), 0) + payload
    if v6:
        ip = struct.pack("!IHBB", 0x60000000, len(udp), 17, 64) + bytes(range(32)) + udp
        etype = 0x86DD
    else:
        ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 1, 0, 64, 17, 0,
                         bytes([10, 0, 0, 1]), bytes([233, 54, 12, 111])) + udp
        etype = 0x0800
    if link == "eth":
        return bytes(6) + bytes([2, 0, 0, 0, 0, 1]) + struct.pack("!H", etype) + ip
    if link == "sll":
        return struct.pack("!HHH8sH", 0, 1, 6, bytes(8), etype) + ip
    return ip


LINKTYPES = {"eth": 1, "sll": 113, "raw": 101}


def pcap_file(frames: list[bytes], link: str = "eth", big_endian: bool = False, nano: bool = False) -> bytes:
    e = ">" if big_endian else "<"
    out = [struct.pack(e + "IHHiIII", 0xA1B23C4D if nano else 0xA1B2C3D4, 2, 4, 0, 0, 65535, LINKTYPES[link])]
    for k, f in enumerate(frames):
        out.append(struct.pack(e + "IIII", 1700000000 + k, 0, len(f), len(f)) + f)
    return b"".join(out)


def _ng_block(e: str, btype: int, body: bytes) -> bytes:
    body += bytes(-len(body) % 4)
    n = 12 + len(body)
    return struct.pack(e + "II", btype, n) + body + struct.pack(e + "I", n)


def pcapng_file(frames: list[bytes], link: str = "eth", big_endian: bool = False, simple: bool = False) -> bytes:
    e = ">" if big_endian else "<"
    out = [_ng_block(e, 0x0A0D0D0A, struct.pack(e + "IHHq", 0x1A2B3C4D, 1, 0, -1)),
           _ng_block(e, 1, struct.pack(e + "HHI", LINKTYPES[link], 0, 0)
                     + struct.pack(e + "HH", 9, 1) + b"\x09\x00\x00\x00" + struct.pack(e + "HH", 0, 0))]
    for k, f in enumerate(frames):
        if simple:
            out.append(_ng_block(e, 3, struct.pack(e + "I", len(f)) + f))
        else:
            out.append(_ng_block(e, 6, struct.pack(e + "IIIII", 0, 0, k, len(f), len(f)) + f))
    return b"".join(out)


def capture_seeds() -> dict[str, bytes]:
    msgs = itch_messages()
    pkts = [encode_packet("S1", 1, msgs[:3]), encode_packet("S1", 4, []), encode_packet("S1", 4, msgs[3:6]),
            encode_end_of_session("S1", 7)]
    eth = [udp_frame(p) for p in pkts] + [udp_frame(b"not MoldUDP64", dport=53)]
    return {
        "eth.pcap": pcap_file(eth),
        "eth_be_nano.pcap": pcap_file(eth, big_endian=True, nano=True),
        "sll_v6.pcap": pcap_file([udp_frame(p, "sll", v6=True) for p in pkts], "sll"),
        "raw.pcap": pcap_file([udp_frame(p, "raw") for p in pkts] + [udp_frame(pkts[0], "raw", v6=True)], "raw"),
        "eth.pcapng": pcapng_file(eth),
        "eth_be_simple.pcapng": pcapng_file(eth[:4], big_endian=True, simple=True),
    }


def corpus(kind: str) -> list[Path]:
    return sorted(p for p in (CORPUS / kind).iterdir() if p.is_file())


def _seed_bytes(kind: str) -> list[bytes]:
    return [p.read_bytes() for p in corpus(kind)]


SPEC_SEEDS = [EXAMPLE_SPEC.read_text()] + [
    b.decode("utf-8", "surrogateescape") for b in _seed_bytes("spec")
]
ITCH_SEEDS = itch_seeds() + [b for b in _seed_bytes("itch") if len(b) <= 1 << 16]
PCAP_SEEDS = list(capture_seeds().values()) + _seed_bytes("pcap")


# ------------------------------------------------------------------------------ mutations

BOUNDARY_BYTES = [b"\x00", b"\xff", b"\x00\x00", b"\xff\xff", b"\x00\x01", b"\x7f\xff", b"\x80\x00",
                  b"\x00\x24", b"\x00\x28", b"\x00\x0c", b"\xff\xff\xff\xff", b"\x00\x00\x00\x00",
                  b"\x0a\x0d\x0d\x0a", b"\x4d\x3c\x2b\x1a", b"\xd4\xc3\xb2\xa1", b"A", b"F", b"S"]
P4_TOKENS = [
    "header", "struct", "parser", "state", "transition", "select", "accept", "reject", "default", "const",
    "typedef", "type", "action", "control", "extern", "package", "bit", "int", "varbit", "bool", "in", "out",
    "inout", "packet_in", "standard_metadata_t", "h_t", "h", "hdr", "headers", "a", "b", "start", "extract",
    "{", "}", "(", ")", "<", ">", "[", "]", ";", ",", ".", ":", "=", "@", "#", "//", "/*", "*/", '"', "\\",
    "0", "1", "8", "128", "129", "0x", "0xFFFF", "16w0x800", "8w", "99999999", "0x" + "f" * 1200, "1" * 5000,
    "-1", "_", "\n", " ", "\t", "\r", "\x00", "\u00e9", "\U0001f600", "\ud800",
    "\n@pragma query_field(h.a)\n", "\n@pragma query_field(h.a, 8)\n", "\n@pragma query_field_exact(h.b, 200)\n",
    "\n@pragma query_field_lpm(", "\n@pragma query_field_scale(h.a, -3)\n", "\n@pragma query_field_alpha(h.a)\n",
    "\n@pragma query_default_action(nop)\n", "\n@pragma query_\n", "\n#define W 16\n", "\n#include <core.p4>\n",
]


@st.composite
def mutated(draw, seeds: list, chunk):
    """A seed after up to 8 edits (mostly one or two): insert a chunk, delete, duplicate or move a
    slice, overwrite, truncate, or splice another seed in."""
    data = draw(st.sampled_from(seeds))
    for _ in range(draw(st.sampled_from([0, 1, 1, 1, 2, 2, 3, 4, 8]))):
        n = len(data)
        op = draw(st.sampled_from(["insert", "delete", "duplicate", "overwrite", "truncate", "splice", "move"]))
        i = draw(st.integers(draw(st.sampled_from([0, min(n, 4), min(n, 24)])), n))  # often keep a header
        j = draw(st.integers(i, min(n, i + draw(st.sampled_from([1, 2, 4, 16, 256, 4096])))))
        if op == "insert":
            data = data[:i] + draw(chunk) + data[i:]
        elif op == "delete":
            data = data[:i] + data[j:]
        elif op == "duplicate":
            data = data[:j] + data[i:j] * draw(st.integers(1, 4)) + data[j:]
        elif op == "overwrite":
            c = draw(chunk)
            data = data[:i] + c + data[i + len(c):]
        elif op == "truncate":
            data = data[:i]
        elif op == "splice":
            other = draw(st.sampled_from(seeds))
            k = draw(st.integers(0, len(other)))
            data = data[:i] + other[k:]
        else:
            k = draw(st.integers(0, len(data) - (j - i)))
            rest = data[:i] + data[j:]
            data = rest[:k] + data[i:j] + rest[k:]
    return data


binary_chunk = st.one_of(st.sampled_from(BOUNDARY_BYTES), st.binary(min_size=1, max_size=8))
text_chunk = st.one_of(st.sampled_from(P4_TOKENS), st.text(min_size=1, max_size=8))
token_soup = st.lists(
    st.one_of(st.sampled_from(P4_TOKENS), st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,6}", fullmatch=True)),
    max_size=120,
).flatmap(lambda toks: st.lists(st.sampled_from([" ", "\n", ""]), min_size=len(toks), max_size=len(toks))
          .map(lambda seps: "".join(t + s for t, s in zip(toks, seps))))


@pytest.fixture(scope="module")
def workdir():
    with tempfile.TemporaryDirectory(prefix="subc-fuzz-") as d:
        yield d


# ------------------------------------------------------------------------------ corpus replay


@pytest.mark.parametrize("path", corpus("spec"), ids=lambda p: p.name)
def test_spec_corpus(path):
    check_spec_file(path)
    check_spec(path.read_bytes().decode("utf-8", "surrogateescape"))


@pytest.mark.parametrize("path", corpus("itch"), ids=lambda p: p.name)
def test_itch_corpus(path, workdir):
    data = path.read_bytes()
    check_itch(data, path.name, workdir)
    check_mold(data)
    with bounded(f"read_binaryfile {path.name}"):
        _, err = outcome(lambda: list(read_binaryfile(path)))
    if err is not None:
        check_binary_error(err, str(path), len(data))


@pytest.mark.parametrize("path", corpus("pcap"), ids=lambda p: p.name)
def test_pcap_corpus(path, workdir):
    check_capture(path.read_bytes(), workdir, path.name)


def test_corpus_is_small():
    files = corpus("spec") + corpus("itch") + corpus("pcap")
    assert 10 <= len(files) <= 200
    assert all(p.stat().st_size < 10_000 for p in files), [p.name for p in files if p.stat().st_size >= 10_000]


def test_seeds_are_valid(workdir):
    """The generated seeds read: the mutations start from valid input."""
    assert check_spec(SPEC_SEEDS[0]) is not None
    for data in itch_seeds():
        assert len(list(iter_binaryfile(data))) >= 9
    for data in mold_seeds():
        decode_packet(data)
    for name, data in capture_seeds().items():
        path = os.path.join(workdir, name)
        Path(path).write_bytes(data)
        buf = read_pcap(path, udp_port=26400)
        assert len(buf) >= 6, name


# ------------------------------------------------------------------------------ short fuzz runs


@fuzz_settings(500)
@given(mutated(SPEC_SEEDS, text_chunk))
def test_fuzz_spec_mutations(text):
    check_spec(text)


@fuzz_settings(300)
@given(token_soup)
def test_fuzz_spec_token_soup(text):
    check_spec(text)


@fuzz_settings(600)
@given(mutated(ITCH_SEEDS, binary_chunk))
def test_fuzz_itch_mutations(data):
    check_itch(data)


@fuzz_settings(150)
@given(mutated(ITCH_SEEDS, binary_chunk))
def test_fuzz_itch_splits(data):
    with tempfile.TemporaryDirectory(prefix="subc-fuzz-") as d:
        check_itch(data, "fuzz.itch", d)


@fuzz_settings(500)
@given(st.one_of(mutated(mold_seeds(), binary_chunk), st.binary(max_size=64)))
def test_fuzz_moldudp64(data):
    check_mold(data)


@fuzz_settings(600)
@given(mutated(PCAP_SEEDS, binary_chunk))
def test_fuzz_pcap_mutations(data):
    with tempfile.TemporaryDirectory(prefix="subc-fuzz-") as d:
        check_capture(data, d)


@fuzz_settings(300)
@given(st.lists(st.tuples(st.sampled_from(["eth", "sll", "raw"]), st.booleans(),
                          st.one_of(st.sampled_from(mold_seeds()), st.binary(max_size=40)), st.integers(0, 40)),
                min_size=1, max_size=6), st.integers(0, 3))
def test_fuzz_pcap_frames(frames, form):
    """Captures of valid framing around frames cut short at random: truncated link-layer, IP and
    UDP headers and datagrams."""
    link = frames[0][0]
    full = [udp_frame(p, link, v6=v6) for _, v6, p, _ in frames]
    raw = [f[: max(0, len(f) - cut)] for f, (_, _, _, cut) in zip(full, frames)]
    data = (pcap_file(raw, link, big_endian=form & 1) if form < 2
            else pcapng_file(raw, link, big_endian=form & 1))
    with tempfile.TemporaryDirectory(prefix="subc-fuzz-") as d:
        check_capture(data, d)


def test_plan_splits_takes_linear_time(workdir):
    """Small splits of a file without any split point: every byte is searched once, not once per
    boundary (that took 29 s for 1 MiB in 1 KiB splits)."""
    path = os.path.join(workdir, "zeros.itch")
    Path(path).write_bytes(bytes(1 << 18))
    t0 = time.process_time()
    splits = plan_splits([path], 256, TYPES)
    assert time.process_time() - t0 < TIME_LIMIT
    assert [(s.start, s.stop) for s in splits] == [(0, 1 << 18)]


def test_bounded_catches_a_slow_or_big_input():
    with pytest.raises(AssertionError, match="allocated"), bounded("big"):
        np.ones(MEMORY_LIMIT // 8 + 1)
    with pytest.raises(AssertionError, match="took"), bounded("slow", time_limit=0.2):
        t0 = time.process_time()
        while time.process_time() - t0 < 0.2:
            pass


_warm_up()
