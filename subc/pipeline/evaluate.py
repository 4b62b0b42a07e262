"""One split of a trace through the compiled tables, as a Spark task (or a plain loop) runs it.

:class:`Bundle` is what the driver ships to every task once (a Spark broadcast): the splits, the
prepared tables (:class:`~subc.pipeline.tables_np.PipelineEvaluator`), the value classes of the
rules (:class:`~subc.pipeline.reference_np.ValueClasses`) and the spec's query fields.
:func:`evaluate_split` reads and decodes a split and adds three columns to its messages:
``zero_length``, ``decision`` (the tables' decision code, null for messages that are not Add Orders) and
``class_key`` (the reference's value-class key, null likewise).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from .messages import MESSAGE_SCHEMA, decode
from .reference_np import ValueClasses
from .splits import Split, read_split
from .tables_np import PipelineEvaluator

EVALUATED_SCHEMA = MESSAGE_SCHEMA + ", zero_length boolean, decision int, class_key long"


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


def evaluate_split(bundle: Bundle, i: int) -> pa.RecordBatch:
    """The messages of split ``i`` (:data:`EVALUATED_SCHEMA`): ``zero_length`` (the BinaryFILE
    length prefix was 0, see :mod:`subc.runtime.itch`), ``decision`` and ``class_key``.

    Raises :class:`~subc.errors.SubcError` for a malformed trace (file and byte offset)."""
    split = bundle.splits[i]
    buf = read_split(split, bundle.udp_port)
    batch, mask, ao = decode(buf, split.file_index)
    cols = packet_columns(ao, bundle.fields)
    codes = bundle.tables.decide(cols)
    keys = bundle.classes.key(cols)
    n = len(mask)
    decision = np.zeros(n, dtype=np.int32)
    decision[mask] = codes
    class_key = np.zeros(n, dtype=np.int64)
    class_key[mask] = keys
    zero = buf.zero_length if buf.zero_length is not None else np.zeros(n, dtype=bool)
    return pa.RecordBatch.from_arrays(
        list(batch.columns) + [pa.array(zero), pa.array(decision, mask=~mask), pa.array(class_key, mask=~mask)],
        names=list(batch.schema.names) + ["zero_length", "decision", "class_key"],
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
