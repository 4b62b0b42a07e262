"""One split of a trace through the compiled tables, as a Spark task (or a plain loop) runs it.

:class:`Bundle` is what the driver ships to every task once (a Spark broadcast): the splits, the
prepared tables (:class:`~subc.pipeline.tables_np.PipelineEvaluator`), the value classes of the
rules (:class:`~subc.pipeline.reference_np.ValueClasses`) and the spec's query fields.
:func:`evaluate_split` reads and decodes a split and adds three columns to its messages:
``zero_length``, ``decision`` (the tables' decision code, null for messages that are not Add Orders) and
``class_key`` (the reference's value-class key, null likewise).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from .messages import _chars, add_order_fields, add_order_mask, be_uint, pad, symbols
from .reference_np import ValueClasses
from .splits import MessageBuffer, Split, read_split
from .tables_np import PipelineEvaluator

#: Partial aggregates of one split (:func:`aggregates`): rows of either kind
#: (class_key, decision) or (type, decision, second), with message counts and bytes.
AGGREGATE_SCHEMA = (
    "class_key long, decision int, type int, second long, messages long, bytes long, zero_length long"
)
#: One row per Add Order (:func:`add_order_rows`).
ADD_ORDER_SCHEMA = (
    "file_index int, position long, index int, type string, timestamp long, length int, stock_locate int, "
    "order_ref_number long, side string, shares long, stock string, price long, subscribers array<int>, "
    "decision int, value_class long"
)
NS_PER_S = 1_000_000_000


@dataclass
class Bundle:
    """Everything a task needs: ``splits``, ``tables``, ``classes``, ``fields`` (all query fields of
    the spec; an Add Order lacks some, for example ``ipv4.dstAddr``: they are 0, as in ``subc
    simulate``) and ``udp_port`` (pcap filter, or None)."""

    splits: list[Split]
    tables: PipelineEvaluator
    classes: ValueClasses
    fields: list[str]
    udp_port: int | None = None


def packet_columns(ao: dict[str, np.ndarray], fields: list[str]) -> dict[str, np.ndarray]:
    """The spec's query fields as uint64 columns: Add Order values, 0 for the fields they lack."""
    n = len(next(iter(ao.values())))
    return {f: ao[f] if f in ao else np.zeros(n, dtype=np.uint64) for f in fields}


@dataclass
class Evaluated:
    """A split after decoding and evaluation: the messages ``buf`` (data padded, see
    :func:`~subc.pipeline.messages.pad`), the Add Order ``mask``, their
    raw ``fields``, and per Add Order the tables' decision ``codes`` and the value-class ``keys``."""

    buf: MessageBuffer
    mask: np.ndarray
    fields: dict[str, np.ndarray]
    codes: np.ndarray
    keys: np.ndarray


def evaluate_split(bundle: Bundle, i: int) -> Evaluated:
    """Read split ``i``, decode its Add Orders and evaluate the tables and class keys on them.

    Raises :class:`~subc.errors.SubcError` for a malformed trace (file and byte offset)."""
    buf = pad(read_split(bundle.splits[i], bundle.udp_port))
    mask = add_order_mask(buf)
    ao = add_order_fields(buf, mask)
    cols = packet_columns(ao, bundle.fields)
    return Evaluated(buf, mask, ao, bundle.tables.decide(cols), bundle.classes.key(cols))


def process_split(bundle: Bundle, i: int, parts_dir: str | None = None,
                  ports: list[tuple[int, ...]] | None = None) -> pa.RecordBatch:
    """Evaluate split ``i``; write its Add Orders (:func:`add_order_rows`) to
    ``parts_dir/part-<i>.parquet`` when ``parts_dir`` is given (``ports[code]``: the subscribers
    of decision ``code``); return its counts (:func:`aggregates`)."""
    ev = evaluate_split(bundle, i)
    if parts_dir is not None:
        import pyarrow.parquet as pq

        table = pa.Table.from_batches([add_order_rows(ev, bundle.splits[i].file_index, ports or [])])
        part = os.path.join(parts_dir, f"part-{i:05d}.parquet")
        tmp = f"{os.path.dirname(part)}/.{os.path.basename(part)}.{os.getpid()}"
        pq.write_table(table, tmp)
        os.replace(tmp, part)  # a retried or speculative task attempt replaces the part whole
    return aggregates(ev)


def aggregates(ev: Evaluated) -> pa.RecordBatch:
    """Counts of an evaluated split in :data:`AGGREGATE_SCHEMA`: messages per (class key, decision)
    over its Add Orders, and messages, bytes and zero-length prefixes per (type byte, decision or
    -1, second of the day) over all its messages."""
    buf = ev.buf
    # (class_key, decision) over Add Orders
    order = np.lexsort((ev.codes, ev.keys))
    k, c = ev.keys[order], ev.codes[order].astype(np.int64)
    first = np.flatnonzero(np.r_[True, (k[1:] != k[:-1]) | (c[1:] != c[:-1])]) if len(k) else np.zeros(0, np.int64)
    uniq = np.stack([k[first], c[first]], axis=1)
    pair_n = np.diff(np.r_[first, len(k)]).astype(np.int64)
    # (type, decision, second) over every message
    types = buf.data[buf.starts].astype(np.int64)
    decision = np.full(len(buf), -1, dtype=np.int64)
    decision[ev.mask] = ev.codes
    ts = be_uint(buf.data, buf.starts, 5, 6).astype(np.int64)
    ts[buf.lengths < 11] = 0
    second = ts // NS_PER_S
    key = (types * 1_000_003 + (decision + 1)) * 100_000 + second  # decision < 10^6, second < 10^5
    k_uniq, k_inv = np.unique(key, return_inverse=True)
    n = np.bincount(k_inv, minlength=len(k_uniq))
    nbytes = np.bincount(k_inv, weights=buf.lengths, minlength=len(k_uniq)).astype(np.int64)
    zero = buf.zero_length if buf.zero_length is not None else np.zeros(len(buf), dtype=bool)
    nzero = np.bincount(k_inv, weights=zero, minlength=len(k_uniq)).astype(np.int64)
    k_sec = k_uniq % 100_000
    k_dec = (k_uniq // 100_000) % 1_000_003 - 1
    k_type = k_uniq // 100_000 // 1_000_003
    m, q = len(uniq), len(k_uniq)
    null_m, null_q = np.zeros(m, dtype=bool), np.zeros(q, dtype=bool)
    return pa.RecordBatch.from_arrays(
        [
            pa.array(np.r_[uniq[:, 0], np.zeros(q, np.int64)], mask=np.r_[null_m, ~null_q]),
            pa.array(np.r_[uniq[:, 1], k_dec].astype(np.int32)),
            pa.array(np.r_[np.zeros(m, np.int32), k_type.astype(np.int32)], mask=np.r_[~null_m, null_q]),
            pa.array(np.r_[np.zeros(m, np.int64), k_sec], mask=np.r_[~null_m, null_q]),
            pa.array(np.r_[pair_n, n].astype(np.int64)),
            pa.array(np.r_[np.zeros(m, np.int64), nbytes]),
            pa.array(np.r_[np.zeros(m, np.int64), nzero]),
        ],
        names=["class_key", "decision", "type", "second", "messages", "bytes", "zero_length"],
    )


def add_order_rows(ev: Evaluated, file_index: int, ports: list[tuple[int, ...]]) -> pa.RecordBatch:
    """One row per Add Order of an evaluated split (:data:`ADD_ORDER_SCHEMA`); ``ports[code]`` are
    the subscribers of decision ``code``."""
    buf, mask, ao = ev.buf, ev.mask, ev.fields
    s = buf.starts[mask]
    counts = np.array([len(p) for p in ports], dtype=np.int32)
    flat = np.array([x for p in ports for x in p], dtype=np.int32)
    first = np.r_[0, np.cumsum(counts)[:-1]].astype(np.int64)
    per = counts[ev.codes]
    offsets = np.r_[0, np.cumsum(per)].astype(np.int32)
    take = np.repeat(first[ev.codes] - offsets[:-1], per) + np.arange(offsets[-1])
    subscribers = pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat[take] if len(flat) else np.zeros(0, np.int32)))
    d = buf.data
    return pa.RecordBatch.from_arrays(
        [
            pa.array(np.full(len(s), file_index, np.int32)),
            pa.array(buf.positions[mask]),
            pa.array(buf.indexes[mask]),
            _chars(d[s]),
            pa.array(ao["add_order.timestamp"].astype(np.int64)),
            pa.array(buf.lengths[mask]),
            pa.array(ao["add_order.stock_locate"].astype(np.int32)),
            pa.array(ao["add_order.order_ref_number"].view(np.int64)),
            _chars(d[s + 19]),
            pa.array(ao["add_order.shares"].astype(np.int64)),
            symbols(ao["add_order.stock"]),
            pa.array(ao["add_order.price"].astype(np.int64)),
            subscribers,
            pa.array(ev.codes.astype(np.int32)),
            pa.array(ev.keys),
        ],
        names=[f.split()[0] for f in ADD_ORDER_SCHEMA.split(", ")],
    )


def representatives(classes: ValueClasses, keys: np.ndarray) -> dict[str, np.ndarray]:
    """One value per field for each class key: the lowest value of the key's class (every value of
    a class satisfies the same predicates, see :mod:`.reference_np`)."""
    out = {}
    rest = np.asarray(keys, dtype=np.int64).copy()
    for f in reversed(classes.fields):
        r = classes.radix[f]
        out[f] = classes.breaks[f][rest % r]
        rest //= r
    return out
