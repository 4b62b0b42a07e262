"""One split of a trace through the compiled tables, as a Spark task (or a plain loop) runs it.

:class:`Bundle` is what the driver ships to every task once (a Spark broadcast): the splits, the
prepared tables (:class:`~subc.analysis.tables_np.PipelineEvaluator`), the value classes of the
rules (:class:`~subc.analysis.reference_np.ValueClasses`), the spec's query fields and its
vectorised decoder (:class:`~subc.analysis.gather.VectorDecoder`).  :func:`evaluate_split` reads a
split, decodes every message with the spec, and evaluates the tables and the value-class keys on
the *classified* messages: those the spec's parser decodes that carry every header the rules test.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..wire.decoder import TypeTable
from .gather import LENGTH_MISMATCH_CODE, REJECTED_CODE, STATUSES, VectorDecoded, VectorDecoder
from .messages import field_columns, message_schema, pad, type_labels
from .reference_np import ValueClasses
from .splits import MessageBuffer, Split, read_split
from .tables_np import PipelineEvaluator

#: Partial aggregates of one split (:func:`aggregates`), rows of three kinds: per (class_key,
#: decision) the classified messages; per (type, decision) messages, bytes and zero-length
#: prefixes (``second`` null); per ``second`` of the day the messages (``type`` and ``decision``
#: null, bytes 0).  ``type`` is the message type key (-1: none); ``decision`` a decision code, or
#: :data:`NOT_CLASSIFIED`, :data:`~.gather.LENGTH_MISMATCH_CODE`, :data:`~.gather.REJECTED_CODE`.
AGGREGATE_SCHEMA = "class_key long, decision int, type long, second long, messages long, bytes long, zero_length long"
#: Decision column of a decoded message that lacks a header the rules test (default action).
NOT_CLASSIFIED = -1
NS_PER_S = 1_000_000_000
#: Names of fields that hold a message's time (ns since midnight), for the per-second counts.
TIME_FIELD_NAMES = ("timestamp", "timestamp_ns", "ts", "ts_ns", "time_ns")


@dataclass
class Bundle:
    """Everything a task needs: ``splits``, ``tables``, ``classes``, ``fields`` (all query fields of
    the spec; a message lacks some, for example ``ipv4.dstAddr`` in a BinaryFILE: they are 0, as in
    ``subc simulate``), ``vector`` (the spec's decoder), ``types`` (its message type lengths, for
    BinaryFILE framing), ``headers`` (the instances the rules test), ``time_fields`` (fields that
    hold a message's time in ns, by :data:`TIME_FIELD_NAMES`) and ``udp_port`` (pcap filter, or None)."""

    splits: list[Split]
    tables: PipelineEvaluator
    classes: ValueClasses
    fields: list[str]
    vector: VectorDecoder
    types: TypeTable
    headers: list[str]
    udp_port: int | None = None
    #: feed ports per capture file index (:func:`~subc.wire.capture.choose_feed_ports`)
    capture_ports: dict[int, list[int]] | None = None
    #: a foreign frame or a message the spec cannot decode fails the job
    strict: bool = False
    #: the rules compare state: tasks decode only, the stateful pass (:mod:`.stateful_pass`) decides
    stateful: bool = False


@dataclass
class Evaluated:
    """A split after decoding and evaluation: the messages ``buf`` (data padded, see
    :func:`~subc.analysis.messages.pad`), the decoded messages ``vd``, the ``mask`` of classified
    messages, and per classified message the tables' decision ``codes`` and the value-class ``keys``."""

    buf: MessageBuffer
    vd: VectorDecoded
    mask: np.ndarray
    codes: np.ndarray
    keys: np.ndarray


def evaluate_split(bundle: Bundle, i: int, stats=None) -> Evaluated:
    """Read split ``i``, decode its messages with the spec and evaluate the tables and class keys
    on the classified ones (``stats``: a :class:`~subc.wire.capture.CaptureStats` that counts a
    capture's frames by kind).  Raises :class:`~subc.errors.SubcError` for a malformed trace (file
    and byte offset)."""
    sp = bundle.splits[i]
    ports = (bundle.capture_ports or {}).get(sp.file_index)
    buf = pad(read_split(sp, bundle.types, None if ports else bundle.udp_port, stats, bundle.strict, ports))
    vd = bundle.vector.decode(buf.data, buf.starts, buf.lengths)
    if bundle.strict and not vd.classified().all():
        from ..errors import SubcError

        k = int(np.flatnonzero(~vd.classified())[0])
        where = (
            f"frame {int(buf.positions[k])} message {int(buf.indexes[k])}"
            if sp.kind == "pcap"
            else f"byte offset {int(buf.positions[k])}"
        )
        raise SubcError(
            f"{sp.path}: {where}: {STATUSES[vd.status[k]].replace('_', ' ')} (message of "
            f"{int(buf.lengths[k])} bytes, type {bundle.types.label(int(vd.type_key[k])) or '?'})"
        )
    mask = vd.classified()
    for h in bundle.headers:
        mask &= vd.valid.get(h, np.zeros(len(mask), bool))
    cols = {f: vd.values[f][mask] for f in bundle.fields}
    codes = np.zeros(int(mask.sum()), np.int64) if bundle.stateful else bundle.tables.decide(cols)
    return Evaluated(buf, vd, mask, codes, bundle.classes.key(cols))


def process_split(
    bundle: Bundle, i: int, parts_dir: str | None = None, ports: list[tuple[int, ...]] | None = None
) -> pa.RecordBatch:
    """Evaluate split ``i``; write its classified messages (:func:`message_rows`) to
    ``parts_dir/part-<i>.parquet`` when ``parts_dir`` is given (``ports[code]``: the subscribers
    of decision ``code``); return its counts (:func:`aggregates`).  When ``bundle.stateful`` the
    tables are not run: the part also holds the columns the stateful pass needs
    (:func:`stateful_columns`) and the counts cover the messages that are not classified."""
    from ..wire.capture import CaptureStats

    stats = CaptureStats()
    ev = evaluate_split(bundle, i, stats)
    if parts_dir is not None and bundle.splits[i].kind == "pcap":
        write_json_atomically(os.path.join(os.path.dirname(parts_dir), f"capture-{i:05d}.json"), stats.as_json())
    if parts_dir is not None and not bundle.stateful:
        rows = np.flatnonzero(ev.mask)
        write_json_atomically(
            os.path.join(os.path.dirname(parts_dir), f"copies-{i:05d}.json"),
            datagram_copies(ev.buf.positions[rows], ev.codes, ports or []),
        )
    if parts_dir is not None:
        import pyarrow.parquet as pq

        table = pa.Table.from_batches([message_rows(bundle, ev, bundle.splits[i].file_index, ports or [])])
        if bundle.stateful:
            for name, col in stateful_columns(bundle, ev).items():
                table = table.append_column(name, col)
        part = os.path.join(parts_dir, f"part-{i:05d}.parquet")
        tmp = f"{os.path.dirname(part)}/.{os.path.basename(part)}.{os.getpid()}"
        # a dictionary for the text columns only (types, statuses, symbols: few values); for the
        # numbers (positions, prices, class keys: mostly distinct) and the subscriber lists (each
        # port of each list through it) it cost 0.69 s against 0.52 s for 730,000 messages,
        # for parts of 13 instead of 22 MB
        text = [f.name for f in table.schema if pa.types.is_string(f.type)]
        pq.write_table(table, tmp, use_dictionary=text)
        os.replace(tmp, part)  # a retried or speculative task attempt replaces the part whole
    return aggregates(ev, classified=not bundle.stateful)


def write_json_atomically(path: str, doc) -> None:
    """Write ``doc`` as JSON to ``path`` through a temporary file and a rename (a retried task
    attempt replaces the file whole)."""
    import json

    with open(path + f".{os.getpid()}", "w") as f:
        json.dump(doc, f)
    os.replace(path + f".{os.getpid()}", path)


def datagram_copies(positions: np.ndarray, codes: np.ndarray, ports: list[tuple[int, ...]]) -> dict[str, int]:
    """Per port (as text), the datagrams it receives of messages at ``positions`` (int64: a
    capture's frame number, a BinaryFILE message's byte offset, which is its own datagram) with
    decision ``codes`` (``ports[code]``: its subscribers), under the delivery semantics (docs/ebpf.md,
    "Delivery semantics"): one copy per datagram holding any message for the port, so the distinct
    (position, port) pairs.  The messages of one datagram are in one split, so per-split counts
    add up.  Ports that receive nothing are left out."""
    port_list = sorted({p for ps in ports for p in ps})
    if not port_list or not len(codes):
        return {}
    col = {p: j for j, p in enumerate(port_list)}
    member = np.zeros((len(ports), len(port_list)), dtype=bool)
    for c, ps in enumerate(ports):
        for p in ps:
            member[c, col[p]] = True
    positions = positions.astype(np.int64)
    codes = codes.astype(np.int64)
    if len(positions) < 2 or bool((positions[1:] > positions[:-1]).all()):
        # one message per datagram (a BinaryFILE): every message's ports get one copy each
        per_port = np.bincount(codes, minlength=len(ports)) @ member.astype(np.int64)
    else:  # the distinct (position, code) pairs, then the ports of each datagram's codes
        pairs = np.unique(np.stack([positions, codes], axis=1), axis=0)
        starts = np.flatnonzero(np.r_[True, pairs[1:, 0] != pairs[:-1, 0]])
        per_port = np.logical_or.reduceat(member[pairs[:, 1]], starts, axis=0).sum(axis=0)
    return {str(p): int(n) for p, n in zip(port_list, per_port) if n}


#: Column name prefix of a field's raw value (uint64) in a stateful part (:func:`stateful_columns`).
RAW = "subc:raw:"


def stateful_columns(bundle: Bundle, ev: Evaluated) -> dict[str, pa.Array]:
    """Per classified message of ``ev``, what the stateful pass needs besides :func:`message_rows`:
    every query field's raw value (``subc:raw:<field>``, uint64), the capture time
    (``subc:arrival_ns``, int64 ns, -1 unknown or a BinaryFILE), the type key, the second of the day
    and whether the length prefix was 0 (for :func:`aggregates`)."""
    mask, buf = ev.mask, ev.buf
    out = {RAW + f: pa.array(ev.vd.values[f][mask].astype(np.uint64)) for f in bundle.fields}
    times = buf.times[mask] if buf.times is not None else np.full(int(mask.sum()), -1, np.int64)
    out["subc:arrival_ns"] = pa.array(times.astype(np.int64))
    out["subc:type_key"] = pa.array(ev.vd.type_key[mask].astype(np.int64))
    out["subc:second"] = pa.array(np.clip(message_times(ev.vd)[mask] // NS_PER_S, 0, 99_999).astype(np.int64))
    zero = buf.zero_length[mask] if buf.zero_length is not None else np.zeros(int(mask.sum()), bool)
    out["subc:zero_length"] = pa.array(zero.astype(bool))
    return out


#: The name of the merged time field of :class:`~.gather.VectorDecoder` (see :data:`TIME_FIELD_NAMES`).
TIME = "__time__"


def message_times(vd: VectorDecoded) -> np.ndarray:
    """Per message, its time in ns (the value of whichever time field its headers carry), else 0."""
    t = vd.values.get(TIME)
    return t.astype(np.int64) if t is not None else np.zeros(len(vd.status), dtype=np.int64)


def aggregates(ev: Evaluated, classified: bool = True) -> pa.RecordBatch:
    """Counts of an evaluated split in :data:`AGGREGATE_SCHEMA`: messages per (class key, decision)
    over its classified messages, and messages, bytes and zero-length prefixes per (type key,
    decision or status code, second of the day) over all its messages (``classified=False``: over
    the messages that are not classified only, and no class rows)."""
    buf = ev.buf
    decision = np.full(len(buf), NOT_CLASSIFIED, dtype=np.int64)
    decision[ev.vd.status == 2] = LENGTH_MISMATCH_CODE
    decision[ev.vd.status == 3] = REJECTED_CODE
    decision[ev.mask] = ev.codes
    second = np.clip(message_times(ev.vd) // NS_PER_S, 0, 99_999)
    zero = buf.zero_length if buf.zero_length is not None else np.zeros(len(buf), dtype=bool)
    rows = slice(None) if classified else ~ev.mask
    keys = ev.keys if classified else np.zeros(0, np.int64)
    codes = ev.codes if classified else np.zeros(0, np.int64)
    return count_rows(keys, codes, ev.vd.type_key[rows], decision[rows], second[rows], buf.lengths[rows], zero[rows])


def count_rows(
    keys: np.ndarray,
    codes: np.ndarray,
    type_key: np.ndarray,
    decision: np.ndarray,
    second: np.ndarray,
    lengths: np.ndarray,
    zero: np.ndarray,
) -> pa.RecordBatch:
    """Rows of :data:`AGGREGATE_SCHEMA`: messages per (class key ``keys``, decision ``codes``)
    (classified messages), then over other arrays of messages: messages, bytes (``lengths``) and
    zero-length prefixes (``zero``) per (``type_key`` (-1: none), ``decision`` (code or status)),
    and messages per ``second`` (0 to 99,999).  Decision codes are below 10**6, type keys below
    9 * 10**12."""
    uniq, pair_n = class_pairs(np.asarray(keys, np.int64), np.asarray(codes, np.int64))
    k_type, k_dec, k_inv = type_decision_pairs(type_key.astype(np.int64), decision.astype(np.int64))
    n = np.bincount(k_inv, minlength=len(k_type))
    nbytes = np.bincount(k_inv, weights=lengths, minlength=len(k_type)).astype(np.int64)
    nzero = np.bincount(k_inv, weights=zero, minlength=len(k_type)).astype(np.int64)
    per_sec = np.bincount(second.astype(np.int64), minlength=1)
    secs = np.flatnonzero(per_sec)
    m, q, s = len(uniq), len(k_type), len(secs)

    def col(parts: list[np.ndarray | int], valid: tuple[bool, bool, bool]) -> pa.Array:
        lens = (m, q, s)
        values = np.concatenate([np.broadcast_to(np.asarray(p, np.int64), (n_,)) for p, n_ in zip(parts, lens)])
        return pa.array(values, mask=np.repeat(~np.array(valid), lens))

    return pa.RecordBatch.from_arrays(
        [
            col([uniq[:, 0], 0, 0], (True, False, False)),
            col([uniq[:, 1], k_dec, 0], (True, True, False)).cast(pa.int32()),
            col([0, k_type, 0], (False, True, False)),
            col([0, 0, secs], (False, False, True)),
            col([pair_n, n, per_sec[secs]], (True, True, True)),
            col([0, nbytes, 0], (True, True, True)),
            col([0, nzero, 0], (True, True, True)),
        ],
        names=["class_key", "decision", "type", "second", "messages", "bytes", "zero_length"],
    )


#: Most (type, decision) cells :func:`type_decision_pairs` counts in a dense array.
DENSE_CELLS = 1 << 22


def type_decision_pairs(type_key: np.ndarray, decision: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The distinct (type key, decision) pairs of two int64 arrays of equal length n (type keys
    -1 to below 9 * 10**12, decisions -3 to below 10**6), in ascending (type, decision) order:
    (their type keys, their decisions, per message the index of its pair, int64 arrays).  Counted
    in a dense array of cells when the spans of the two fit :data:`DENSE_CELLS` (message types and
    decision codes are few: no sort of n values, 0.1 s for 1.67 million), else found by a sort."""
    if len(type_key):
        t0, d0 = int(type_key.min()), int(decision.min())
        width = int(decision.max()) - d0 + 1
        cells = (int(type_key.max()) - t0 + 1) * width
        if cells <= DENSE_CELLS:
            cell = (type_key - t0) * width + (decision - d0)
            present = np.flatnonzero(np.bincount(cell, minlength=cells))
            index = np.zeros(cells, np.int64)
            index[present] = np.arange(len(present))
            return present // width + t0, present % width + d0, index[cell]
    key = (type_key + 1) * 1_000_003 + (decision + 3)
    k_uniq, k_inv = np.unique(key, return_inverse=True)
    return k_uniq // 1_000_003 - 1, k_uniq % 1_000_003 - 3, k_inv.ravel()


def class_pairs(keys: np.ndarray, codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct (class key, decision code) pairs of ``keys`` and ``codes`` (int64, both at
    least 0, equal lengths) in ascending order as an (m, 2) int64 array, and the count of each
    (int64).  Packed into one int64 per pair when they fit (one sort instead of two), else sorted
    lexicographically."""
    if not len(keys):
        return np.zeros((0, 2), np.int64), np.zeros(0, np.int64)
    kmax, cmax = int(keys.max()) + 1, int(codes.max()) + 1
    if kmax * cmax < 1 << 63:
        u, n = np.unique(keys * cmax + codes, return_counts=True)
        return np.stack([u // cmax, u % cmax], axis=1), n.astype(np.int64)
    order = np.lexsort((codes, keys))
    k, c = keys[order], codes[order]
    first = np.flatnonzero(np.r_[True, (k[1:] != k[:-1]) | (c[1:] != c[:-1])])
    return np.stack([k[first], c[first]], axis=1), np.diff(np.r_[first, len(k)]).astype(np.int64)


def rows_schema(bundle: Bundle) -> str:
    """The schema of ``messages.parquet`` (:func:`message_rows`): the message schema of
    :func:`~subc.analysis.messages.message_schema`, then ``subscribers``, ``decision`` and
    ``value_class``."""
    return message_schema(bundle.vector) + ", subscribers array<int>, decision int, value_class long"


def message_rows(bundle: Bundle, ev: Evaluated, file_index: int, ports: list[tuple[int, ...]]) -> pa.RecordBatch:
    """One row per classified message of an evaluated split (:func:`rows_schema`); ``ports[code]``
    are the subscribers of decision ``code``."""
    buf, mask = ev.buf, ev.mask
    rows = np.flatnonzero(mask)
    subscribers = subscriber_lists(ev.codes, ports)
    status = pc.take(pa.array(list(STATUSES), pa.string()), pa.array(ev.vd.status[rows].astype(np.int64)))
    return pa.RecordBatch.from_arrays(
        [
            pa.array(np.full(len(rows), file_index, np.int32)),
            pa.array(buf.positions[mask].astype(np.int64)),
            pa.array(buf.indexes[mask].astype(np.int32)),
            type_labels(bundle.vector, ev.vd.type_key[mask]),
            pa.array(buf.lengths[mask].astype(np.int32)),
            status,
            *field_columns(bundle.vector, ev.vd, rows),
            subscribers,
            pa.array(ev.codes.astype(np.int32)),
            pa.array(ev.keys),
        ],
        names=[c.split()[0] for c in rows_schema(bundle).split(", ")],
    )


def subscriber_lists(codes: np.ndarray, ports: list[tuple[int, ...]]) -> pa.ListArray:
    """Per message, the subscribers (ports, int32) of its decision code (``ports[code]``)."""
    counts = np.array([len(p) for p in ports], dtype=np.int64)
    flat = np.array([x for p in ports for x in p], dtype=np.int32)
    table = pa.ListArray.from_arrays(pa.array(np.r_[0, np.cumsum(counts)].astype(np.int32)), pa.array(flat, pa.int32()))
    return table.take(pa.array(np.asarray(codes, dtype=np.int64)))


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
