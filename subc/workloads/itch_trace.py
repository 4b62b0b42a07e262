"""Synthetic Nasdaq TotalView-ITCH 5.0 traces as BinaryFILE, for traces larger than the real samples.

Layout (ITCH 5.0 section 1: message formats; BinaryFILE: 2-byte big-endian length then the message):

* System Event ``S`` 'O' (start of messages, 04:00), then per symbol a Stock Directory ``R`` and a
  Stock Trading Action ``H`` ('T', trading); ``S`` 'S' (start of system hours, 04:00), 'Q' (start of
  market hours, 09:30), 'M' (end of market hours, 16:00), 'E' (end of system hours, 20:00) and 'C'
  (end of messages, 20:00) at their times.
* Order-flow messages, by default in the proportions of :data:`MESSAGE_MIX`: approximately those of a
  Nasdaq trading day (Add Orders and Order Deletes dominate, then Replaces, executions, cancels, NOII
  and trades).  These shares are a generator setting, not a measurement; pass ``mix`` to change them.
* Timestamps (ns since midnight) over 04:00-20:00: 5% of the flow before 09:30, 5% after 16:00, and
  90% in market hours with a U shape (more at the open and the close).
* Add Orders (``A``, and ``F`` with an MPID): stock Zipf (exponent 1) over ``symbols`` symbols, side
  B/S 50/50, shares in round lots (100 x geometric, mean 300) for 80% and odd lots (1..99) for 20%,
  price normal around a per-symbol log-normal mean (s.d. 1%) in whole cents, Price(4) units.  Order
  reference numbers count up from 1.  Deletes, cancels, executions and replaces refer to an earlier
  order reference (uniform among those added so far).

Everything is vectorised with NumPy and written in chunks; the same seed gives the same bytes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..backends.output import atomic_file
from .itch_codec import MESSAGE_LENGTHS
from .distributions import mean_prices, symbol_names, zipf_weights

#: Order-flow message shares (sum 1).
MESSAGE_MIX = {
    "A": 0.430,
    "D": 0.420,
    "U": 0.075,
    "E": 0.025,
    "I": 0.022,
    "X": 0.013,
    "F": 0.008,
    "P": 0.006,
    "L": 0.0007,
    "C": 0.0003,
}
CHUNK = 1 << 20
DAY_START, OPEN, CLOSE, DAY_END = 4 * 3600, 9 * 3600 + 1800, 16 * 3600, 20 * 3600
_NS = 1_000_000_000

_HDR = [("type", "S1"), ("locate", ">u2"), ("tracking", ">u2"), ("ts_hi", ">u2"), ("ts_lo", ">u4")]
DTYPES = {
    "S": np.dtype(_HDR + [("event", "S1")]),
    "R": np.dtype(
        _HDR
        + [
            ("stock", "S8"),
            ("category", "S1"),
            ("status", "S1"),
            ("lot", ">u4"),
            ("lots_only", "S1"),
            ("classification", "S1"),
            ("subtype", "S2"),
            ("authenticity", "S1"),
            ("threshold", "S1"),
            ("ipo", "S1"),
            ("luld", "S1"),
            ("etp", "S1"),
            ("leverage", ">u4"),
            ("inverse", "S1"),
        ]
    ),
    "H": np.dtype(_HDR + [("stock", "S8"), ("state", "S1"), ("reserved", "S1"), ("reason", "S4")]),
    "A": np.dtype(_HDR + [("ref", ">u8"), ("side", "S1"), ("shares", ">u4"), ("stock", "S8"), ("price", ">u4")]),
    "F": np.dtype(
        _HDR + [("ref", ">u8"), ("side", "S1"), ("shares", ">u4"), ("stock", "S8"), ("price", ">u4"), ("mpid", "S4")]
    ),
    "E": np.dtype(_HDR + [("ref", ">u8"), ("shares", ">u4"), ("match", ">u8")]),
    "C": np.dtype(_HDR + [("ref", ">u8"), ("shares", ">u4"), ("match", ">u8"), ("printable", "S1"), ("price", ">u4")]),
    "X": np.dtype(_HDR + [("ref", ">u8"), ("shares", ">u4")]),
    "D": np.dtype(_HDR + [("ref", ">u8")]),
    "U": np.dtype(_HDR + [("ref", ">u8"), ("new_ref", ">u8"), ("shares", ">u4"), ("price", ">u4")]),
    "P": np.dtype(
        _HDR + [("ref", ">u8"), ("side", "S1"), ("shares", ">u4"), ("stock", "S8"), ("price", ">u4"), ("match", ">u8")]
    ),
    "I": np.dtype(
        _HDR
        + [
            ("paired", ">u8"),
            ("imbalance", ">u8"),
            ("direction", "S1"),
            ("stock", "S8"),
            ("far", ">u4"),
            ("near", ">u4"),
            ("current", ">u4"),
            ("cross", "S1"),
            ("variation", "S1"),
        ]
    ),
    "L": np.dtype(_HDR + [("mpid", "S4"), ("stock", "S8"), ("primary", "S1"), ("mode", "S1"), ("state", "S1")]),
}
for _t, _dt in DTYPES.items():
    assert _dt.itemsize == MESSAGE_LENGTHS[_t.encode()], _t


def _timestamps(n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` sorted timestamps (ns since midnight) with the intraday profile of the module docstring."""
    part = rng.choice(3, size=n, p=[0.05, 0.90, 0.05])
    t = np.empty(n, dtype=np.float64)
    pre, mkt, post = part == 0, part == 1, part == 2
    t[pre] = rng.uniform(DAY_START + 1, OPEN, pre.sum())
    # U shape over market hours: a Beta(0.6, 0.6) density is high at both ends
    t[mkt] = OPEN + (CLOSE - OPEN) * rng.beta(0.6, 0.6, mkt.sum())
    t[post] = rng.uniform(CLOSE, DAY_END, post.sum())
    return np.sort((t * _NS).astype(np.int64))


def _set_header(rec: np.ndarray, mtype: str, ts: np.ndarray, locate: np.ndarray) -> None:
    rec["type"] = mtype.encode()
    rec["locate"] = locate
    rec["ts_hi"] = ts >> 32
    rec["ts_lo"] = ts & 0xFFFFFFFF


def generate_trace(
    path: str | Path, messages: int, symbols: int = 500, seed: int = 1, mix: dict[str, float] | None = None
) -> dict[str, int]:
    """Write a BinaryFILE of about ``messages`` messages to ``path`` (atomically: a temporary file in
    the same directory, then renamed) and return the message count by type.

    The 6 system events and the per-symbol directory (2 x ``symbols`` messages) come out of the
    ``messages`` budget.  Raises ValueError when ``messages`` is too small for them or ``mix``
    names a type the generator does not write."""
    mix = dict(MESSAGE_MIX if mix is None else mix)
    unknown = set(mix) - set(MESSAGE_MIX)
    if unknown:
        raise ValueError(f"message types {sorted(unknown)} are not generated (known: {', '.join(MESSAGE_MIX)})")
    fixed = 1 + 2 * symbols + 5
    if messages < fixed:
        raise ValueError(f"{messages} messages are fewer than the {fixed} system and directory messages")
    rng = np.random.default_rng(seed)
    names = symbol_names(symbols)
    stock_bytes = np.array([n.encode().ljust(8) for n in names], dtype="S8")
    means = np.round(mean_prices(symbols) * 100).astype(np.int64)  # cents
    zipf = zipf_weights(symbols)
    kinds = list(mix)
    p = np.array([mix[k] for k in kinds], dtype=np.float64)
    p /= p.sum()
    flow = messages - fixed
    ts = _timestamps(flow, rng)
    ttype = rng.choice(len(kinds), size=flow, p=p)
    with atomic_file(path, "wb") as f:
        out = _Writer(f)

        def system(event: str, t_s: int) -> None:
            rec = np.zeros(1, DTYPES["S"])
            _set_header(rec, "S", np.array([t_s * _NS]), np.zeros(1, np.int64))
            rec["event"] = event.encode()
            out.records(rec)

        system("O", DAY_START)
        system("S", DAY_START)
        loc = np.arange(1, symbols + 1)
        t0 = DAY_START * _NS + 1000 + 2000 * np.arange(symbols, dtype=np.int64)  # before any order flow
        r = np.zeros(symbols, DTYPES["R"])
        _set_header(r, "R", t0, loc)
        r["stock"] = stock_bytes
        r["category"], r["status"], r["lot"], r["lots_only"] = b"Q", b"N", 100, b"N"
        r["classification"], r["subtype"], r["authenticity"], r["threshold"] = b"C", b"Z ", b"P", b"N"
        r["ipo"], r["luld"], r["etp"], r["inverse"] = b" ", b"2", b"N", b"N"
        h = np.zeros(symbols, DTYPES["H"])
        _set_header(h, "H", t0 + 1000, loc)
        h["stock"], h["state"], h["reserved"], h["reason"] = stock_bytes, b"T", b" ", b"    "
        for i in range(symbols):  # directory entry then trading action, symbol by symbol
            out.records(r[i : i + 1])
            out.records(h[i : i + 1])
        # order flow in chunks that end at the market open and close, where system events go
        cuts = sorted({0, flow, *range(CHUNK, flow, CHUNK), *np.searchsorted(ts, [OPEN * _NS, CLOSE * _NS]).tolist()})
        events = {
            int(np.searchsorted(ts, OPEN * _NS)): [("Q", OPEN)],
        }
        events.setdefault(int(np.searchsorted(ts, CLOSE * _NS)), []).append(("M", CLOSE))
        add_codes = [kinds.index(k) for k in ("A", "F") if k in kinds]
        order_base = 0  # order references added before the chunk
        for c0, c1 in zip(cuts, cuts[1:] + [None]):
            for ev in events.pop(c0, []):
                system(*ev)
            if c1 is None:
                break
            _flow_chunk(out, rng, kinds, ttype[c0:c1], ts[c0:c1], order_base, stock_bytes, means, zipf)
            order_base += int(np.isin(ttype[c0:c1], add_codes).sum())
        system("E", DAY_END)
        system("C", DAY_END)
    return dict(sorted(out.counts.items()))


class _Writer:
    """Frames records (2-byte length + message) into a file and counts them by type."""

    def __init__(self, f):
        self.f = f
        self.counts: dict[str, int] = {}

    def records(self, rec: np.ndarray) -> None:
        n, size = len(rec), rec.dtype.itemsize
        framed = np.empty((n, size + 2), dtype=np.uint8)
        framed[:, 0] = size >> 8
        framed[:, 1] = size & 0xFF
        framed[:, 2:] = rec.view(np.uint8).reshape(n, size)
        self.f.write(framed.tobytes())
        self.count(rec["type"][0].decode(), n)

    def count(self, mtype: str, n: int) -> None:
        if n:
            self.counts[mtype] = self.counts.get(mtype, 0) + n


def _flow_chunk(out: _Writer, rng, kinds, ttype, ts, order_base, stock_bytes, means, zipf) -> None:
    """Write one chunk of order flow (types ``ttype``, timestamps ``ts``) in timestamp order."""
    n = len(ttype)
    sym = rng.choice(len(stock_bytes), size=n, p=zipf)
    is_add = np.isin(ttype, [kinds.index(k) for k in ("A", "F") if k in kinds])
    refs_before = order_base + np.cumsum(is_add) - is_add  # orders added before each message
    own_ref = refs_before + 1
    earlier = np.maximum(1, np.ceil(rng.random(n) * np.maximum(refs_before, 1))).astype(np.int64)
    side = np.where(rng.random(n) < 0.5, b"B", b"S")
    round_lot = rng.random(n) < 0.8
    shares = np.where(round_lot, 100 * rng.geometric(1 / 3, size=n), rng.integers(1, 100, size=n)).astype(np.int64)
    price = np.maximum(1, np.round(rng.normal(means[sym], 0.01 * means[sym]))).astype(np.int64) * 100
    match = np.arange(n, dtype=np.int64) + 1 + order_base * 4
    # messages must stay in timestamp order: write per type into one record buffer per message
    order = np.arange(n)
    blocks = []  # (positions in the chunk, records)
    for k_i, k in enumerate(kinds):
        sel = order[ttype == k_i]
        if not len(sel):
            continue
        rec = np.zeros(len(sel), DTYPES[k])
        _set_header(rec, k, ts[sel], sym[sel] + 1)
        names = rec.dtype.names
        assert names is not None  # a record dtype (DTYPES) has its field names
        if "ref" in names:
            rec["ref"] = own_ref[sel] if k in ("A", "F") else (0 if k == "P" else earlier[sel])
        if "side" in names:
            rec["side"] = side[sel]
        if "shares" in names:
            rec["shares"] = shares[sel]
        if "stock" in names:
            rec["stock"] = stock_bytes[sym[sel]]
        if "price" in names:
            rec["price"] = price[sel]
        if "match" in names:
            rec["match"] = match[sel]
        if k == "F":
            rec["mpid"] = b"SUBC"
        elif k == "U":
            rec["new_ref"] = (1 << 40) + sel + order_base * 2
        elif k == "C":
            rec["printable"] = b"Y"
        elif k == "I":
            rec["paired"], rec["imbalance"] = shares[sel] * 10, shares[sel]
            rec["direction"], rec["cross"], rec["variation"] = b"B", b"O", b"A"
            rec["far"] = rec["near"] = rec["current"] = price[sel]
        elif k == "L":
            rec["mpid"], rec["primary"], rec["mode"], rec["state"] = b"SUBC", b"N", b"N", b"A"
        blocks.append((k, sel, rec))
    # frame every type's records, then scatter them to their positions: the chunk stays in time order
    size_of = np.zeros(n, dtype=np.int64)
    for _, sel, rec in blocks:
        size_of[sel] = rec.dtype.itemsize + 2
    offsets = np.concatenate([[0], np.cumsum(size_of)])
    buf = np.empty(int(offsets[-1]), dtype=np.uint8)
    for k, sel, rec in blocks:
        size = rec.dtype.itemsize
        framed = np.empty((len(sel), size + 2), dtype=np.uint8)
        framed[:, 0] = size >> 8
        framed[:, 1] = size & 0xFF
        framed[:, 2:] = rec.view(np.uint8).reshape(len(sel), size)
        buf[offsets[sel][:, None] + np.arange(size + 2)] = framed
        out.count(k, len(sel))
    out.f.write(buf.tobytes())
