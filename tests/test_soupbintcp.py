"""The SoupBinTCP 4.1 codec (subc/wire/soupbintcp.py) against packets built here with ``struct``
from the spec's layout: a 2-byte big-endian packet length counting the type byte, the type, the
payload; alpha fields left-justified and space-padded, numeric fields ASCII digits right-justified
and space-padded.  The incremental decoder is fed random cuts of a random packet stream."""

from __future__ import annotations

import string
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from subc.errors import SubcError
from subc.wire import soupbintcp as sb

ALNUM = string.ascii_letters + string.digits
SESSIONS = st.binary(min_size=10, max_size=10)
SEQS = st.integers(0, 10**20 - 1)


def header(ptype: bytes, payload_len: int) -> bytes:
    return struct.pack(">Hc", payload_len + 1, ptype)


def login_request_bytes(user: bytes, pw: bytes, session: bytes, seq: int) -> bytes:
    return struct.pack(">Hc6s10s10s20s", 47, b"L", user.ljust(6), pw.ljust(10), session, b"%20d" % seq)


def login_accepted_bytes(session: bytes, seq: int) -> bytes:
    return struct.pack(">Hc10s20s", 31, b"A", session, b"%20d" % seq)


# -- encoding against struct -------------------------------------------------------------------


@settings(max_examples=200)
@given(
    user=st.text(ALNUM, max_size=6), pw=st.text(string.printable.strip() + " ", max_size=10), session=SESSIONS, seq=SEQS
)
def test_login_request_is_the_spec_layout(user, pw, session, seq):
    pw = pw.rstrip(" ")  # trailing spaces are padding
    want = login_request_bytes(user.encode(), pw.encode(), session, seq)
    got = sb.encode_login_request(sb.LoginRequest(user, pw, session, seq))
    assert got == want and len(got) == 49
    p = sb.decode_packet(want, sb.FROM_CLIENT)
    assert p == sb.Packet(b"L", want[3:])
    assert sb.decode_login_request(p.payload) == sb.LoginRequest(user, pw, session, seq)


@settings(max_examples=200)
@given(session=SESSIONS, seq=SEQS)
def test_login_accepted_is_the_spec_layout(session, seq):
    want = login_accepted_bytes(session, seq)
    assert sb.encode_login_accepted(session, seq) == want and len(want) == 33
    p = sb.decode_packet(want, sb.FROM_SERVER)
    assert sb.decode_login_accepted(p.payload) == sb.LoginAccepted(session, seq)


@given(msg=st.binary(max_size=2000))
def test_data_packets_are_the_spec_layout(msg):
    for ptype, enc in ((b"S", sb.encode_sequenced_data), (b"U", sb.encode_unsequenced_data), (b"+", sb.encode_debug)):
        want = header(ptype, len(msg)) + msg
        assert enc(msg) == want
        assert sb.decode_packet(want) == sb.Packet(ptype, msg)
        assert sb.Packet(ptype, msg).encode() == want


def test_fixed_packets_are_the_spec_layout():
    assert sb.encode_login_rejected(b"A") == struct.pack(">Hcc", 2, b"J", b"A")
    assert sb.encode_login_rejected(b"S") == b"\x00\x02JS"
    assert sb.SERVER_HEARTBEAT_PACKET == b"\x00\x01H"
    assert sb.END_OF_SESSION_PACKET == b"\x00\x01Z"
    assert sb.CLIENT_HEARTBEAT_PACKET == b"\x00\x01R"
    assert sb.LOGOUT_REQUEST_PACKET == b"\x00\x01O"
    assert sb.encode_debug("hé") == b"\x00\x03+h?"


def test_numeric_fields_are_read_leniently_but_must_be_digits():
    base = struct.pack(">6s10s10s", b"bob   ", b"pw        ", b" " * 10)
    for field, want in ((b"1".ljust(20), 1), (b"1".rjust(20), 1), (b"0" * 19 + b"7", 7), (b" 42 ".center(20), 42)):
        assert sb.decode_login_request(base + field).seq == want
    for bad in (b" " * 20, b"1 2".rjust(20), b"-1".rjust(20), b"0x10".rjust(20)):
        with pytest.raises(SubcError, match="not an ASCII number"):
            sb.decode_login_request(base + bad)
    with pytest.raises(SubcError, match="printable ASCII"):
        sb.decode_login_request(b"bo\x00   " + base[6:] + b"1".rjust(20))


# -- malformed input ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data, match",
    [
        (b"\x00\x00", "at least 3 bytes"),
        (b"\x00\x00H", "packet length 0"),
        (b"\x00\x01Q", "unknown SoupBinTCP packet type b'Q'"),
        (b"\x00\x02Hx", "Server Heartbeat packet with a 1-byte payload"),
        (b"\x00\x01J", "Login Rejected packet with a 0-byte payload"),
        (header(b"L", 45) + b" " * 45, "Login Request packet with a 45-byte payload"),
        (header(b"A", 31) + b" " * 31, "Login Accepted packet with a 31-byte payload"),
        (b"\x00\x05Sab", "means 7 bytes, not 5"),
    ],
)
def test_malformed_packets_are_named(data, match):
    with pytest.raises(SubcError, match=match):
        sb.decode_packet(data)


def test_a_type_of_the_other_direction_is_refused():
    with pytest.raises(SubcError, match="unknown SoupBinTCP packet type b'S'"):
        sb.decode_packet(b"\x00\x02Sx", sb.FROM_CLIENT)
    with pytest.raises(SubcError, match="unknown SoupBinTCP packet type b'L'"):
        sb.decode_packet(login_request_bytes(b"a", b"b", b" " * 10, 0), sb.FROM_SERVER)


def test_fields_that_do_not_fit_are_refused():
    for req, match in (
        (sb.LoginRequest("bobbyxx", "pw"), "longer than its 6-byte field"),
        (sb.LoginRequest("bob", "p" * 11), "longer than its 10-byte field"),
        (sb.LoginRequest("bøb", "pw"), "not ASCII"),
        (sb.LoginRequest("bob", "pw", b"short"), "session is 10 bytes"),
        (sb.LoginRequest("bob", "pw", seq=-1), "does not fit"),
        (sb.LoginRequest("bob", "pw", seq=10**20), "does not fit"),
    ):
        with pytest.raises(SubcError, match=match):
            sb.encode_login_request(req)
    with pytest.raises(SubcError, match="reject reason"):
        sb.encode_login_rejected(b"X")
    with pytest.raises(SubcError, match="at most 65534"):
        sb.encode_sequenced_data(b"x" * 65535)
    assert len(sb.encode_sequenced_data(b"x" * 65534)) == 65537


# -- the incremental decoder -------------------------------------------------------------------


@st.composite
def server_packets(draw) -> tuple[bytes, bytes]:
    ptype = draw(st.sampled_from(sorted(sb.FROM_SERVER)))
    if ptype == b"A":
        return ptype, draw(SESSIONS) + b"%20d" % draw(SEQS)
    if ptype == b"J":
        return ptype, draw(st.sampled_from([b"A", b"S"]))
    if ptype in (b"H", b"Z"):
        return ptype, b""
    return ptype, draw(st.binary(max_size=300))


@settings(max_examples=300)
@given(packets=st.lists(server_packets(), max_size=30), cuts=st.lists(st.integers(0, 10_000), max_size=40))
def test_the_decoder_gives_the_packets_of_any_cut_of_the_stream(packets, cuts):
    stream = b"".join(header(t, len(p)) + p for t, p in packets)
    points = sorted({0, len(stream), *(c % (len(stream) + 1) for c in cuts)})
    d = sb.PacketDecoder(sb.FROM_SERVER)
    got = []
    for a, b in zip(points, points[1:]):
        got += [(p.type, p.payload) for p in d.feed(stream[a:b])]
    assert got == packets
    assert d.pending == 0


def test_the_decoder_keeps_a_partial_packet():
    d = sb.PacketDecoder(sb.FROM_SERVER)
    pkt = login_accepted_bytes(b"SESSION1  ", 12)
    assert list(d.feed(pkt[:-1])) == [] and d.pending == len(pkt) - 1
    assert list(d.feed(pkt[-1:] + b"\x00")) == [sb.Packet(b"A", pkt[3:])] and d.pending == 1
    assert list(d.feed(b"\x01H")) == [sb.Packet(b"H")] and d.pending == 0


def test_the_decoder_raises_at_a_bad_header_without_waiting_for_the_rest():
    d = sb.PacketDecoder(sb.FROM_CLIENT)
    good = struct.pack(">Hc", 3, b"U") + b"hi"
    it = d.feed(good + b"\x10\x00S")  # a Sequenced Data from a client, 4096 bytes announced
    assert next(it) == sb.Packet(b"U", b"hi")  # what came before the bad packet
    with pytest.raises(SubcError, match="unknown SoupBinTCP packet type b'S'"):
        next(it)
    with pytest.raises(SubcError):  # the framing is lost: it stays failed
        d.feed(good)
    d = sb.PacketDecoder(sb.FROM_CLIENT)
    with pytest.raises(SubcError, match="packet length 0"):
        list(d.feed(b"\x00\x00"))
    d = sb.PacketDecoder(sb.FROM_CLIENT)
    with pytest.raises(SubcError, match="Logout Request packet with a 4-byte payload"):
        list(d.feed(b"\x00\x05O"))
