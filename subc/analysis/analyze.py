"""``subc analyze``: what each subscriber receives from a day of market data (a Spark job).

Steps (each Spark step runs on every core in local mode, or on a cluster under ``spark-submit``):

1. The driver compiles the rules (:func:`subc.compiler.driver.compile_rules`), prepares the
   tables for vectorised lookups and plans the splits of the traces (:mod:`.splits`); all of it is
   broadcast once.
2. One task per split reads and decodes every message with the spec (:mod:`.gather`: the spec's
   parser over the whole split in NumPy) and evaluates the compiled tables on every *classified*
   message, one that carries every header the rules test (:func:`.evaluate.evaluate_split`, an RDD
   of split ids; the tasks' counts come back as Arrow batches, summed on the driver).  Messages
   whose length differs from their type's length in the spec, or that the parser rejects, are
   counted, never decoded.
3. The messages are counted by (value-class key, table decision).  The driver evaluates the rules
   directly on one representative per class key (:mod:`.reference_np`); a message whose table
   decision differs from its class's reference decision is a disagreement.  Rule hits come from
   the same evaluation, weighted by the messages per key.
4. Outputs, written to a temporary directory and renamed to ``out_dir`` at the end:
   ``messages.parquet`` (one row per classified message: where it is in the trace, its type, its
   query fields (columns named after the spec's fields), the
   ``subscribers`` (ports) the tables deliver it to and the ``decision``), ``subscribers.parquet``
   (per port: messages, bytes), ``rules.parquet`` (per rule: line, text, hits),
   ``summary.json`` (see :func:`analyze`), ``deliveries_per_subscriber.png`` and
   ``messages_per_second.png``.

Bytes count what a subscriber receives per message in a MoldUDP64 stream: the message and its
2-byte message-block length (packet headers excluded; :mod:`.summary`).  Broadcast sends every message of the trace
to every subscriber (every port that a rule forwards to); filtering sends each classified message
to the ports of its decision and no other message.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa

from ..compiler.driver import CompileResult
from ..backends.p4.entries import entries_doc
from ..errors import SubcError
from ..wire.decoder import MessageDecoder
from .evaluate import AGGREGATE_SCHEMA, TIME, TIME_FIELD_NAMES, Bundle, process_split, representatives
from .gather import VectorDecoder
from .prepare import Prepared
from .reference_np import ValueClasses, evaluate_rules
from .session import get_session, task_error
from .splits import DEFAULT_SPLIT_BYTES, file_kind, plan_splits
from .summary import capture_summary, copies_summary, summarize
from .tables_np import PipelineEvaluator


def make_bundle(
    res: CompileResult,
    traces: list[str],
    split_bytes: int = DEFAULT_SPLIT_BYTES,
    udp_port: int | None = None,
    strict: bool = False,
) -> Bundle:
    """The :class:`Bundle` for ``res`` and the ``traces``.  Raises SubcError for unreadable files, a
    spec the vectorised decoder cannot follow (:mod:`.gather`), rules that test fields this job
    does not decode (MoldUDP64 header fields, and network header fields of captures: ``subc
    simulate`` decodes both), or aggregates over windows of arrival time and a BinaryFILE trace
    (which has no arrival times)."""
    decoder = MessageDecoder(res.spec)
    vector = VectorDecoder(decoder, list(res.spec.query_fields), {TIME: _time_fields(decoder)})
    captures = [t for t in traces if file_kind(t) == "pcap"]
    for f in res.pipeline.field_order:
        inst = f.split(".", 1)[0]
        if inst in decoder.feed.framing or (captures and inst in decoder.network_instances):
            what = "the MoldUDP64 header" if inst in decoder.feed.framing else f"the network headers of {captures[0]}"
            raise SubcError(
                f"subc analyze does not decode {what}, and a rule tests '{f}'; use `subc simulate`",
                res.spec.query_fields[f].location,
            )
    from ..wire.capture import choose_feed_ports

    stateful = res.ir.state is not None
    if res.ir.state is not None and res.spec.time_field is None:
        binary = [t for t in traces if file_kind(t) != "pcap"]
        if binary and any(i.window_ns for i in res.ir.state.instances):
            raise SubcError(
                f"{binary[0]}: the rules' aggregates have windows of arrival time, and a BinaryFILE has "
                "no arrival times: declare the time field with @pragma query_time"
            )
    spec_ports = [p for p, _ in decoder.feed.ports]
    splits = plan_splits(traces, split_bytes, decoder.types)
    capture_ports = {
        sp.file_index: choose_feed_ports(sp.path, spec_ports, udp_port) for sp in splits if sp.kind == "pcap"
    }
    return Bundle(
        splits=splits,
        tables=PipelineEvaluator(entries_doc(res.pipeline, res.target)),
        classes=ValueClasses(res.rules),
        fields=list(res.spec.query_fields),
        vector=vector,
        types=decoder.types,
        headers=list(res.pipeline.headers),
        udp_port=udp_port,
        capture_ports=capture_ports,
        strict=strict,
        stateful=stateful,
    )


def _time_fields(decoder: MessageDecoder) -> list[str]:
    """The message fields named like a time (:data:`~.evaluate.TIME_FIELD_NAMES`) of 32 to 64 bits."""
    inside = set(decoder.graph.message_instances()) - set(decoder.network_instances) - set(decoder.feed.framing)
    return [
        f
        for f, slot in decoder.graph.fields.items()
        if slot.name in TIME_FIELD_NAMES and 32 <= slot.width <= 64 and slot.instance in inside
    ]


def auto_split_bytes(traces: list[str], parallelism: int) -> int:
    """A split size that gives every core the same number of splits of at most
    :data:`~.splits.DEFAULT_SPLIT_BYTES` (a multiple of ``parallelism`` splits in all)."""
    import math

    total = sum(os.path.getsize(p) for p in traces if os.path.exists(p))
    waves = max(1, math.ceil(total / max(1, parallelism) / DEFAULT_SPLIT_BYTES))
    return max(1 << 20, math.ceil(total / (parallelism * waves)))


def analyze(
    res: CompileResult,
    traces: list[str],
    out_dir: str | Path,
    master: str | None = None,
    split_bytes: int | None = None,
    udp_port: int | None = None,
    spark=None,
    log=None,
    strict: bool = False,
) -> dict:
    """Run the job (see the module docstring) and return ``summary.json`` as a dict.

    ``split_bytes``: BinaryFILE split size (None: :func:`auto_split_bytes`; 0: one task per file).
    ``summary.json`` keys: ``files``; ``messages`` and ``by_type`` (every message read);
    ``classified`` (messages with every header the rules test); ``problems`` (messages not decoded,
    by kind); ``zero_length_fallbacks``; ``deliveries`` (message -> subscriber copies), ``unicast``
    / ``multicast`` (messages sent to one / several ports), ``no_rule_matched``, ``actions``
    (messages given a non-forwarding action, by action); ``subscribers``; ``bytes`` (``filtered``,
    ``broadcast`` = every message to every subscriber, ``broadcast_classified`` = every classified
    message to every subscriber, ``saving`` = 1 - filtered/broadcast); ``disagreements``
    (must be 0) with up to 10 ``disagreement_examples``; ``decisions`` (decision code -> text, as
    in ``messages.parquet``); ``copies_per_port`` (datagrams per port under the delivery semantics,
    :func:`~.evaluate.datagram_copies`); ``value_classes`` (distinct class keys the reference evaluated);
    ``rules``; ``splits``; ``seconds`` (wall time per step) and ``messages_per_second`` (messages
    over the wall time after Spark started).

    Raises :class:`SubcError` for unreadable or malformed traces (file and byte offset), for
    conflicting actions, or when the output directory cannot be written.
    """
    say = log or (lambda msg: None)
    out_dir = Path(out_dir)
    t0 = time.perf_counter()
    timings: dict[str, float] = {}
    if spark is None:
        spark = get_session(master, "subc analyze")
        timings["spark_start"] = time.perf_counter() - t0
    t_work = time.perf_counter()
    sc = spark.sparkContext
    if split_bytes is None:
        split_bytes = auto_split_bytes(traces, sc.defaultParallelism)
    bundle = make_bundle(res, traces, split_bytes, udp_port, strict)
    timings["plan"] = time.perf_counter() - t_work
    bc = sc.broadcast(bundle)
    prepared = Prepared(res.rules, groups=not bundle.stateful)  # a thread, while the tasks run
    tmp, parts, staging = _temporary_output(out_dir, bundle.stateful)
    n_splits = len(bundle.splits)
    say(f"analyze: {len(traces)} trace file(s) in {n_splits} split(s), {len(res.rules)} rules")
    try:
        # 1. read, decode, evaluate the tables, write messages.parquet; partial counts per split, summed by Spark
        t = time.perf_counter()
        parts_dir = str(staging if bundle.stateful else parts)
        batches = _read_and_evaluate(sc, n_splits, bc, parts_dir, [d.ports for d in bundle.tables.decisions])
        timings["read_and_tables"] = time.perf_counter() - t
        # 2. reference semantics on one representative per class key, or the stateful pass
        t = time.perf_counter()
        groups, actions, sources = prepared.result()
        timings["prepare_wait"] = time.perf_counter() - t  # what the thread had left after the tasks
        checked = _check_decisions(
            spark, res, bundle, traces, tmp, staging, parts, batches, say, timings, (groups, actions)
        )
        # 3. the other outputs, then the temporary directory is renamed
        summary = _write_outputs(res, traces, bundle, tmp, out_dir, checked, timings, t0, t_work, sources)
    except SubcError:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    except Exception as e:
        shutil.rmtree(tmp, ignore_errors=True)  # a task's SubcError arrives wrapped in Spark's exception
        err = task_error(e)
        if err is not None:
            raise err from None
        raise
    finally:
        bc.unpersist()
    return summary


def _temporary_output(out_dir: Path, stateful: bool) -> tuple[Path, Path, Path]:
    """(a new temporary directory next to ``out_dir``, its ``messages.parquet`` directory, its
    ``staging`` directory, made only when ``stateful``: the tasks' parts before the stateful pass)."""
    parent = out_dir.resolve().parent
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=parent))
    parts = tmp / "messages.parquet"
    parts.mkdir()
    staging = tmp / "staging"  # with comparisons on state: the tasks' parts, before the stateful pass
    if stateful:
        staging.mkdir()
    return tmp, parts, staging


def _read_and_evaluate(sc, n_splits: int, bc, parts_dir: str, ports: list):
    """Step 1: one task per split (a Spark RDD of split ids, ``sc``: the SparkContext) runs
    :func:`~.evaluate.process_split` on the broadcast bundle ``bc``, writing its messages' part
    into ``parts_dir``; returns the tasks' counts (:data:`~.evaluate.AGGREGATE_SCHEMA` batches).

    The counts come back as pickled Arrow batches, summed on the driver with Arrow
    (:func:`sum_counts`): no Spark SQL plan (its code generation and Arrow conversions cost more
    CPU than the sums)."""

    def run(i: int) -> pa.RecordBatch:
        return process_split(bc.value, i, parts_dir, ports)

    with warnings.catch_warnings():  # a task's error is re-raised by the caller
        warnings.simplefilter("ignore", UserWarning)
        return sc.parallelize(range(n_splits), max(1, n_splits)).map(run).collect()


def sum_counts(batches: list[pa.RecordBatch]):
    """The counts of :data:`~.evaluate.AGGREGATE_SCHEMA` batches summed per (class key, decision,
    type, second), null keys grouped as one, as a pandas DataFrame (integer columns with nulls as
    float64, except the class key: exact, a nullable Int64)."""
    import pandas as pd

    keys = ["class_key", "decision", "type", "second"]
    sums = ["messages", "bytes", "zero_length"]
    table = pa.Table.from_batches(batches) if batches else pa.Table.from_batches([], schema=_aggregate_schema())
    out = table.group_by(keys, use_threads=False).aggregate([(c, "sum") for c in sums])
    df = (
        out.rename_columns([c[: -len("_sum")] if c.endswith("_sum") else c for c in out.column_names])
        .select(keys + sums)
        .to_pandas()
    )
    df["class_key"] = out.column("class_key").to_pandas(types_mapper={pa.int64(): pd.Int64Dtype()}.get)
    return df


def _aggregate_schema() -> pa.Schema:
    """:data:`~.evaluate.AGGREGATE_SCHEMA` as an Arrow schema."""
    types = {"long": pa.int64(), "int": pa.int32()}
    return pa.schema([(n, types[t]) for n, t in (c.split() for c in AGGREGATE_SCHEMA.split(", "))])


class _Checked(NamedTuple):
    """What step 2 found: the aggregate counts (with the stateful pass's classified messages),
    the stateful pass's outcome (None without state), the disagreements and up to 10 examples,
    the classified messages no rule matched, the hits per rule and the value classes evaluated."""

    agg: Any
    outcome: Any
    disagreements: int
    examples: list[dict]
    no_match: int
    rule_hits: Any
    n_keys: int


def _check_decisions(
    spark, res: CompileResult, bundle: Bundle, traces, tmp, staging, parts, batches, say, timings, prepared
):
    """Step 2: the stateful pass (:func:`_stateful_pass`) with comparisons on state, else the
    reference semantics on one representative per class key (:func:`_reference_pass`,
    ``prepared``: the rules' :func:`~.reference_np.shape_groups` and
    :func:`~.reference_np.action_sets`); its time goes into ``timings``.  Returns a
    :class:`_Checked`."""
    t = time.perf_counter()
    if bundle.stateful:
        agg, outcome = _stateful_pass(spark, res, bundle, traces, staging, parts, batches, say, t)
        timings["stateful_pass"] = time.perf_counter() - t
        return _Checked(
            agg,
            outcome,
            outcome.disagreements,
            outcome.examples,
            outcome.no_match,
            outcome.rule_hits,
            outcome.value_classes,
        )
    tables = bundle.tables
    agg = sum_counts(batches)
    ref, keys, counts, bad, disagreements = _reference_pass(res, bundle, agg, tables, *prepared)
    timings["reference"] = time.perf_counter() - t
    examples = _class_examples(spark, tmp, bad, keys, ref, tables, traces) if disagreements else []
    no_match = int(counts[ref.matched_rules == 0].sum())
    return _Checked(agg, None, disagreements, examples, no_match, ref.rule_hits, len(keys))


def _write_outputs(
    res, traces, bundle: Bundle, tmp: Path, out_dir: Path, checked: _Checked, timings, t0, t_work, sources
):
    """Step 3: ``summary.json`` (returned), the tables and the plots written in ``tmp``, which is
    then renamed to ``out_dir`` (removed on any error); ``sources``: per rule (location, text)."""
    t = time.perf_counter()
    agg, outcome, tables = checked.agg, checked.outcome, bundle.tables
    try:
        summary, per_port, per_sec = summarize(
            res,
            traces,
            bundle,
            agg[agg["class_key"].isna()],
            tables,
            checked.no_match,
            checked.disagreements,
            checked.examples,
            checked.n_keys,
        )
        if outcome is not None:
            summary["stateful"] = {
                "reference_one_by_one": outcome.one_by_one,
                "tables": "one by one (named counters)" if outcome.tables_one_by_one else "vectorised per split",
                "tables_one_by_one": outcome.simulated,
                "tasks": outcome.tasks,
            }
        summary["capture"] = capture_summary(tmp, bundle)
        copies = outcome.copies if outcome is not None else copies_summary(tmp)
        summary["copies_per_port"] = {
            str(p): copies.get(str(p), 0) for p in sorted(set(per_port) | {int(q) for q in copies})
        }
        _write_tables_and_plots(res, tmp, per_port, copies, checked.rule_hits, per_sec, sources)
        timings["write"] = time.perf_counter() - t
        timings["total"] = time.perf_counter() - t0
        work = time.perf_counter() - t_work
        summary["seconds"] = {k: round(v, 3) for k, v in timings.items()}
        summary["messages_per_second"] = round(summary["messages"] / max(work, 1e-9))
        (tmp / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
        os.chmod(tmp, 0o755)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return summary


def _stateful_pass(spark, res: CompileResult, bundle, traces: list[str], staging: Path, parts: Path, batches, say, t):
    """Step 2 with comparisons on state: every split in trace order on the driver
    (:class:`~.stateful_pass.StatefulPass`), its parts moved from ``staging`` to ``parts``.
    Returns (the counts of the tasks' ``batches`` and of the classified messages summed by
    :func:`sum_counts`, the pass's outcome)."""
    from .stateful_pass import StatefulPass

    n_splits = len(bundle.splits)
    sc = spark.sparkContext

    def runner(fn, tasks: list) -> list:
        return sc.parallelize(tasks, len(tasks)).map(fn).collect()

    spass = StatefulPass(res, bundle, traces, runner, sc.defaultParallelism)
    say(f"analyze: comparisons on state: {n_splits} split(s) in trace order on the driver")
    for i in range(n_splits):
        spass.split(i, staging / f"part-{i:05d}.parquet", parts / f"part-{i:05d}.parquet")
        if n_splits > 1:
            say(f"analyze: state: split {i + 1} of {n_splits} ({time.perf_counter() - t:.1f} s)")
    outcome = spass.finish()
    staging.rmdir()
    say(f"analyze: state: {outcome.tasks} task(s) one message at a time ({time.perf_counter() - t:.1f} s)")
    return sum_counts([*batches, *outcome.counts]), outcome


def _reference_pass(res: CompileResult, bundle, agg, tables, groups=None, actions=None):
    """Step 2 without state: the reference semantics on one representative message per class key,
    compared with the tables' decisions of every (class key, decision) pair (``groups`` and
    ``actions``: the rules' :func:`~.reference_np.shape_groups` and
    :func:`~.reference_np.action_sets`, or None to compute them).  Returns (the
    reference's outcome, the class keys, messages per key, the pairs that disagree, the messages
    that disagree)."""
    pairs = agg[agg["class_key"].notna()]
    per_key = pairs.groupby("class_key")["messages"].sum()
    keys = per_key.index.to_numpy(dtype=np.int64)
    counts = per_key.to_numpy(dtype=np.int64)
    ref = evaluate_rules(res.rules, res.spec, representatives(bundle.classes, keys), counts, groups, actions)
    ref_codes = decision_codes(tables, ref.decisions)
    pair_keys = pairs["class_key"].to_numpy(dtype=np.int64)
    pair_ref = ref_codes[np.searchsorted(keys, pair_keys)] if len(keys) else np.zeros(0, np.int64)
    bad = pairs[pair_ref != pairs["decision"].to_numpy(dtype=np.int64)]
    return ref, keys, counts, bad, int(bad["messages"].sum())


def decision_codes(tables, decisions: list) -> np.ndarray:
    """``tables.code_of(d)`` for each of ``decisions`` (a list of
    :class:`~subc.semantics.reference.Decision`) as an int64 array, called once per distinct
    object in order of first appearance (so new codes are numbered as one call per decision would
    number them): the reference gives one object per distinct set of ports, and hashing 136,685
    decisions of about 30 ports each took 0.23 s."""
    if not decisions:
        return np.zeros(0, np.int64)
    ids = np.fromiter(map(id, decisions), dtype=np.uint64, count=len(decisions))
    _, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
    codes = np.zeros(len(first), np.int64)
    for u in np.argsort(first, kind="stable").tolist():
        codes[u] = tables.code_of(decisions[int(first[u])])
    return codes[inverse.ravel()]


def _write_tables_and_plots(
    res: CompileResult, tmp: Path, per_port: dict, copies: dict, rule_hits, per_sec, sources: list
) -> None:
    """Step 3's files in ``tmp``: ``subscribers.parquet``, ``rules.parquet`` (``sources``: per rule
    its (location, text)) and the two plots."""
    import pyarrow.parquet as pq

    from . import plots

    sp = sorted(per_port)
    pq.write_table(
        pa.table(
            {
                "subscriber": pa.array(sp, pa.int32()),
                "messages": pa.array([per_port[p][0] for p in sp], pa.int64()),
                "bytes": pa.array([per_port[p][1] for p in sp], pa.int64()),
                "datagrams": pa.array([copies.get(str(p), 0) for p in sp], pa.int64()),
            }
        ),
        tmp / "subscribers.parquet",
    )
    pq.write_table(
        pa.table(
            {
                "rule": pa.array([r.index for r in res.rules], pa.int32()),
                "line": pa.array([loc.line for loc, _ in sources], pa.int32()),
                "text": pa.array([text for _, text in sources], pa.string()),
                "hits": pa.array(rule_hits, pa.int64()),
            }
        ),
        tmp / "rules.parquet",
    )
    plots.deliveries_per_subscriber({p: v[0] for p, v in per_port.items()}, tmp / "deliveries_per_subscriber.png")
    plots.messages_per_second(per_sec[0], per_sec[1], tmp / "messages_per_second.png")


def _class_examples(spark, tmp: Path, bad, keys, ref, tables, traces) -> list[dict]:
    """Up to 10 messages whose table decision differs from their class's reference decision."""
    from pyspark.sql import functions as F

    examples: list[dict] = []
    key_pos = {int(k): i for i, k in enumerate(keys)}
    bad_keys = [int(k) for k in bad["class_key"]][:1000]
    sample = (
        spark.read.parquet(str(tmp / "messages.parquet"))
        .where(F.col("value_class").isin(bad_keys))
        .limit(1000)
        .toPandas()
    )
    for _, r in sample.iterrows():
        ref_d = ref.decisions[key_pos[int(r["value_class"])]]
        got = tables.decisions[int(r["decision"])]
        if ref_d != got and len(examples) < 10:
            examples.append(
                {
                    "file": traces[int(r["file_index"])],
                    "position": int(r["position"]),
                    "index": int(r["index"]),
                    "reference": str(ref_d),
                    "tables": str(got),
                }
            )
    return examples
