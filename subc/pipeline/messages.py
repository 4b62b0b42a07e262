"""Vectorised ITCH 5.0 decoding: a :class:`~subc.pipeline.splits.MessageBuffer` -> columns.

Every ITCH 5.0 message starts with type (1 byte), stock locate (2), tracking number (2) and
timestamp (6, ns since midnight) (ITCH 5.0 section 1.3).  Add Order ``A`` and Add Order with MPID
``F`` add order reference number (8), buy/sell indicator (1), shares (4), stock (8 ASCII bytes)
and price (4, Price(4): 1/10,000 dollar); all unsigned big-endian.  Field values are the raw
integers that :func:`subc.runtime.itch.decode_add_order` gives, computed with NumPy gathers over
the whole buffer at once.

The row schema (:data:`MESSAGE_SCHEMA`, one row per message): ``file_index``, ``position`` (byte
offset of the BinaryFILE length prefix, or pcap frame number), ``index`` (message index in its
MoldUDP64 packet), ``type`` (one character), ``length`` (message bytes, without framing),
``stock_locate``, ``tracking_number``, ``timestamp``; and for Add Orders (null otherwise)
``order_ref_number``, ``side`` ('B'/'S'), ``shares``, ``stock`` (symbol, padding removed),
``price`` (raw Price(4)).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .splits import MessageBuffer

ADD_ORDER_CODES = (ord("A"), ord("F"))

MESSAGE_COLUMNS = [
    "file_index", "position", "index", "type", "length", "stock_locate", "tracking_number", "timestamp",
    "order_ref_number", "side", "shares", "stock", "price",
]
MESSAGE_SCHEMA = (
    "file_index int, position long, index int, type string, length int, stock_locate int, "
    "tracking_number int, timestamp long, order_ref_number long, side string, shares long, stock string, price long"
)


def be_uint(data: np.ndarray, starts: np.ndarray, offset: int, width: int) -> np.ndarray:
    """The unsigned big-endian integers of ``width`` bytes at ``starts + offset`` (uint64 array)."""
    acc = np.zeros(len(starts), dtype=np.uint64)
    pos = starts + offset
    for k in range(width):
        acc = (acc << np.uint64(8)) | data[pos + k].astype(np.uint64)
    return acc


def add_order_mask(buf: MessageBuffer) -> np.ndarray:
    """Boolean mask of the Add Orders (``A``, ``F``) of at least 36 bytes in ``buf``."""
    t = buf.data[buf.starts] if len(buf) else np.zeros(0, np.uint8)
    return ((t == ADD_ORDER_CODES[0]) | (t == ADD_ORDER_CODES[1])) & (buf.lengths >= 36)


def add_order_fields(buf: MessageBuffer, mask: np.ndarray) -> dict[str, np.ndarray]:
    """Raw values (uint64 arrays, one per Add Order selected by ``mask``) keyed as
    :func:`subc.runtime.itch.decode_add_order` keys them ('add_order.price', 'itch.msg_type', ...)."""
    s = buf.starts[mask]
    d = buf.data
    return {
        "itch.msg_type": d[s].astype(np.uint64),
        "add_order.stock_locate": be_uint(d, s, 1, 2),
        "add_order.tracking_number": be_uint(d, s, 3, 2),
        "add_order.timestamp": be_uint(d, s, 5, 6),
        "add_order.order_ref_number": be_uint(d, s, 11, 8),
        "add_order.buy_sell_indicator": d[s + 19].astype(np.uint64),
        "add_order.shares": be_uint(d, s, 20, 4),
        "add_order.stock": be_uint(d, s, 24, 8),
        "add_order.price": be_uint(d, s, 32, 4),
    }


#: The one-character string of every byte value (latin-1), then '' (code 256: a message without bytes).
_CHAR_TABLE = pa.array([chr(i) for i in range(256)] + [""], pa.string())


def _chars(codes: np.ndarray) -> pa.Array:
    """One-character strings from byte values (latin-1: 'A', 'F', ...; any byte gives a valid
    string, the code 256 gives '')."""
    return pc.take(_CHAR_TABLE, pa.array(np.asarray(codes).astype(np.int16)))


def _scatter(values: np.ndarray, mask: np.ndarray, dtype) -> pa.Array:
    """An Arrow array of ``len(mask)`` rows: ``values`` where ``mask``, null elsewhere."""
    full = np.zeros(len(mask), dtype=dtype)
    full[mask] = values.astype(dtype)
    return pa.array(full, mask=~mask)


def symbols(stock: np.ndarray) -> pa.Array:
    """Stock symbols (trailing spaces removed) from raw 8-byte big-endian ``stock`` values; a byte
    outside ASCII becomes U+FFFD, as in :func:`subc.runtime.itch.stock_symbol` (always valid UTF-8)."""
    raw = stock.astype(">u8").view(np.uint8).reshape(-1, 8)
    bad = (raw >= 0x80).any(axis=1)
    if bad.any():
        raw = raw.copy()
        raw[bad] = ord(" ")
    arr = pa.FixedSizeBinaryArray.from_buffers(pa.binary(8), len(stock), [None, pa.py_buffer(raw.tobytes())])
    out = pc.utf8_rtrim(pc.cast(pc.cast(arr, pa.binary()), pa.string(), safe=False), characters=" ")
    if bad.any():
        text = [v.to_bytes(8, "big").decode("ascii", "replace").rstrip(" ") for v in stock[bad].tolist()]
        out = pc.replace_with_mask(out, pa.array(bad), pa.array(text, pa.string()))
    return out


def pad(buf: MessageBuffer) -> MessageBuffer:
    """``buf`` with 64 zero bytes after its data, so that fixed-offset reads past a short last
    message stay in bounds."""
    return MessageBuffer(np.concatenate([buf.data, np.zeros(64, np.uint8)]), buf.starts, buf.lengths, buf.positions,
                         buf.indexes, buf.zero_length)


def decode(buf: MessageBuffer, file_index: int) -> tuple[pa.RecordBatch, np.ndarray, dict[str, np.ndarray]]:
    """(record batch in :data:`MESSAGE_SCHEMA` order, Add Order mask, Add Order raw fields).

    Messages shorter than the 11-byte common header get 0 in the header fields; a message without
    bytes (a MoldUDP64 block of length 0) gets the type ''."""
    n = len(buf)
    padded = pad(buf)
    d, s = padded.data, buf.starts
    mask = add_order_mask(padded)
    ao = add_order_fields(padded, mask)
    short = buf.lengths < 11

    def header(offset: int, width: int, dtype) -> pa.Array:
        v = be_uint(d, s, offset, width)
        v[short] = 0
        return pa.array(v.astype(dtype))

    null_str = pa.scalar(None, pa.string())
    amask = pa.array(mask)
    stock_full = np.full(n, 0x2020202020202020, dtype=np.uint64)
    stock_full[mask] = ao["add_order.stock"]
    side = np.full(n, ord(" "), np.uint8)
    side[mask] = d[s[mask] + 19]
    types = d[s].astype(np.int16)
    types[buf.lengths == 0] = 256
    batch = pa.RecordBatch.from_arrays(
        [
            pa.array(np.full(n, file_index, np.int32)),
            pa.array(buf.positions.astype(np.int64)),
            pa.array(buf.indexes.astype(np.int32)),
            _chars(types),
            pa.array(buf.lengths.astype(np.int32)),
            header(1, 2, np.int32),
            header(3, 2, np.int32),
            header(5, 6, np.int64),
            _scatter(ao["add_order.order_ref_number"].view(np.int64), mask, np.int64),
            pc.if_else(amask, _chars(side), null_str),
            _scatter(ao["add_order.shares"], mask, np.int64),
            pc.if_else(amask, symbols(stock_full), null_str),
            _scatter(ao["add_order.price"], mask, np.int64),
        ],
        names=MESSAGE_COLUMNS,
    )
    return batch, mask, ao
