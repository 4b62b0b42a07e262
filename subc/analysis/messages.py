"""Messages as Arrow rows, decoded with the spec (:mod:`.gather`): the schema follows the spec.

One row per message (:func:`message_schema`): ``file_index``, ``position`` (byte offset of the
BinaryFILE length prefix, or pcap frame number), ``index`` (message index in its MoldUDP64
packet), ``type`` (the message type key as a label: its character for an 8-bit printable key, else
hex; '' when the spec's parser selects no type), ``length`` (message bytes, without framing),
``status`` ('ok', 'unknown_type', 'length_mismatch', 'rejected': see
:mod:`subc.wire.decoder`), then one column per query field of the message headers, named
``instance__field`` (null where the message does not carry the field, or was not decoded): text
(alpha) fields as strings with their space padding removed, the others as 64-bit integers (values
of 64-bit fields above 2**63 - 1 appear as negative numbers, two's complement).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .gather import STATUSES, VectorDecoded, VectorDecoder
from .splits import MessageBuffer


def column_name(field: str) -> str:
    """The column of query field ``instance.field``: ``instance__field``."""
    return field.replace(".", "__")


def row_fields(vector: VectorDecoder) -> list[str]:
    """The query fields that get a column: those of message headers (not network or MoldUDP64)."""
    skip = set(vector.network) | set(vector.feed.framing)
    return [f for f in vector.decoder.spec.query_fields if f.split(".", 1)[0] not in skip]


def message_schema(vector: VectorDecoder) -> str:
    """The Spark DDL schema of the rows of :func:`decode` for ``vector``'s spec."""
    q = vector.decoder.spec.query_fields
    cols = ["file_index int", "position long", "index int", "type string", "length int", "status string"]
    cols += [f"{column_name(f)} {'string' if q[f].alpha else 'long'}" for f in row_fields(vector)]
    return ", ".join(cols)


def type_labels(vector: VectorDecoder, keys: np.ndarray) -> pa.Array:
    """Labels of type keys (-1: ''), as :meth:`~subc.wire.decoder.TypeTable.label` gives them."""
    uniq, inv = np.unique(keys, return_inverse=True)
    labels = [vector.decoder.types.label(int(k)) if k >= 0 else "" for k in uniq]
    return pc.take(pa.array(labels, pa.string()), pa.array(inv.astype(np.int64)))


def alpha_strings(values: np.ndarray, nbytes: int) -> pa.Array:
    """Text from raw big-endian values of ``nbytes`` (1 to 8) ASCII bytes, space padding removed; a
    row with a byte outside ASCII keeps its text with U+FFFD for that byte (always valid UTF-8)."""
    raw = np.ascontiguousarray(values.astype(">u8").view(np.uint8).reshape(-1, 8)[:, 8 - nbytes :])
    bad = (raw >= 0x80).any(axis=1)
    clean = raw.copy()
    clean[bad] = ord(" ")
    arr = pa.FixedSizeBinaryArray.from_buffers(pa.binary(nbytes), len(raw), [None, pa.py_buffer(clean.tobytes())])
    out = pc.utf8_rtrim(pc.cast(pc.cast(arr, pa.binary()), pa.string(), safe=False), characters=" ")
    if bad.any():
        text = [raw[i].tobytes().decode("ascii", "replace").rstrip(" ") for i in np.flatnonzero(bad)]
        out = pc.replace_with_mask(out, pa.array(bad), pa.array(text, pa.string()))
    return out


def pad(buf: MessageBuffer) -> MessageBuffer:
    """``buf`` with 64 zero bytes after its data, so that gathers past a short last message stay in
    bounds."""
    return MessageBuffer(
        np.concatenate([buf.data, np.zeros(64, np.uint8)]),
        buf.starts,
        buf.lengths,
        buf.positions,
        buf.indexes,
        buf.zero_length,
        buf.times,
    )


def field_columns(vector: VectorDecoder, vd: VectorDecoded, rows: np.ndarray) -> list[pa.Array]:
    """The query field columns (:func:`row_fields`) of the messages ``rows`` (indexes)."""
    q = vector.decoder.spec.query_fields
    cols = []
    for f in row_fields(vector):
        inst = f.split(".", 1)[0]
        valid = vd.valid.get(inst, np.zeros(len(vd.status), bool))[rows]
        v = vd.values[f][rows]
        if q[f].alpha and q[f].width <= 64:
            arr = alpha_strings(v, q[f].width // 8)
            cols.append(pc.if_else(pa.array(valid), arr, pa.scalar(None, pa.string())))
        else:
            cols.append(pa.array(v.view(np.int64), mask=~valid))
    return cols


def decode(buf: MessageBuffer, file_index: int, vector: VectorDecoder) -> tuple[pa.RecordBatch, VectorDecoded]:
    """(record batch in :func:`message_schema` order, the decoded messages) of ``buf``."""
    padded = pad(buf)
    vd = vector.decode(padded.data, buf.starts, buf.lengths)
    n = len(buf)
    rows = np.arange(n)
    names = [c.split()[0] for c in message_schema(vector).split(", ")]
    batch = pa.RecordBatch.from_arrays(
        [
            pa.array(np.full(n, file_index, np.int32)),
            pa.array(buf.positions.astype(np.int64)),
            pa.array(buf.indexes.astype(np.int32)),
            type_labels(vector, vd.type_key),
            pa.array(buf.lengths.astype(np.int32)),
            pc.take(pa.array(list(STATUSES), pa.string()), pa.array(vd.status.astype(np.int64))),
            *field_columns(vector, vd, rows),
        ],
        names=names,
    )
    return batch, vd
