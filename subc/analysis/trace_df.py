"""Traces as a Spark DataFrame, decoded with a spec: one row per message (:func:`~.messages.message_schema`).

``subc analyze`` reads the traces in its own fused task (:func:`.evaluate.process_split`), which
decodes only what the tables need; this is the general reader, for exploring a trace with Spark
SQL and for measuring the cost of reading alone (``bench/analyze_bench.py``).  Splits as in
:mod:`.splits`: BinaryFILE cut at safe split points, pcap/pcapng one task per file.
"""

from __future__ import annotations

from ..wire.decoder import MessageDecoder
from .gather import VectorDecoder
from .messages import decode, message_schema
from .splits import plan_splits, read_split


def read_messages(spark, traces: list[str], spec, split_bytes: int | None = None, udp_port: int | None = None):
    """A DataFrame of every message of ``traces`` decoded with ``spec`` (a
    :class:`~subc.spec.front_end.Spec`; a PySpark ``DataFrame``, lazily evaluated).

    ``split_bytes`` None: equal splits per core (:func:`.analyze.auto_split_bytes`).  Raises
    :class:`~subc.errors.SubcError` for unreadable files or a spec that cannot decode messages
    (malformed contents fail the Spark job)."""
    from .analyze import auto_split_bytes

    sc = spark.sparkContext
    vector = VectorDecoder(MessageDecoder(spec))
    if split_bytes is None:
        split_bytes = auto_split_bytes(traces, sc.defaultParallelism)
    splits = sc.broadcast(plan_splits(traces, split_bytes, vector.decoder.types))
    bv = sc.broadcast(vector)
    n = len(splits.value)

    def run(batches):
        for batch in batches:
            for i in batch.column(0).to_pylist():
                sp = splits.value[i]
                yield decode(read_split(sp, bv.value.decoder.types, udp_port), sp.file_index, bv.value)[0]

    return spark.range(0, n, 1, numPartitions=max(1, n)).mapInArrow(run, message_schema(vector))
