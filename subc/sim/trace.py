"""``subc simulate``: every message of a trace through the reference and the compiled tables.

Messages are decoded by the spec alone (:mod:`.decoder`): a BinaryFILE's messages (2-byte
big-endian length prefixes; a zero prefix followed by a type whose length the spec gives is taken
from the spec, as the shared real sample needs), or every message of every MoldUDP64 datagram to
a feed port of a pcap/pcapng capture (:mod:`.capture`: frames that are not the feed are counted by
kind).  Each message the spec's parser accepts is given to the reference semantics (the rules
evaluated on the decoded values, :mod:`.reference`) and to the table simulator over the compiled
``entries.json`` (:mod:`.simulator`); any difference is a disagreement.  A message that lacks a
header the rules test gets the default action in both (Camus semantics).  Messages whose length
differs from their type's length in the spec, or that the parser rejects, are counted by kind with
their position and never decoded (``strict``: the first one is an error).  ``copies_per_port``
counts the datagrams each port receives under the delivery semantics (:mod:`.delivery`: one copy
per port per captured datagram holding any message for it; a BinaryFILE message is its own
datagram).  With ``copies``, the copies themselves are built from the tables' decisions
(:class:`~.delivery.Delivery`: each port's messages in order, its own gap-free sequence numbers,
heartbeats and end of session to every port the rules forward to), and ``subc simulate --copies
DIR`` writes them as one pcap per port: what each subscriber of a switch or of the eBPF broker
must receive for the trace.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from ..lang.ast import evaluate
from ..compiler.driver import CompileResult
from ..backends.p4.entries import entries_doc
from ..errors import SubcError
from ..wire.binaryfile import iter_frames
from ..wire.pcap_records import is_capture
from ..wire.decoder import LENGTH_MISMATCH, Decoded, MessageDecoder
from ..semantics.delivery import Copy
from ..wire.moldudp64 import END_OF_SESSION, HEARTBEAT
from ..semantics.reference import combine, default_decision
from .switch import TableSimulator
from ..semantics.stateful_reference import StatefulReference

#: Problem examples kept per kind.
MAX_EXAMPLES = 10


@dataclass
class SimulationResult:
    """Counts of a simulation (see :meth:`as_json` for the keys).  ``classified`` counts the
    messages that carry every header the rules test (the others get the default action)."""

    messages: int = 0
    classified: int = 0
    by_type: Counter = field(default_factory=Counter)
    per_port: Counter = field(default_factory=Counter)
    multicast_deliveries: int = 0
    unicast_deliveries: int = 0
    default_action: int = 0
    actions: Counter = field(default_factory=Counter)
    disagreements: int = 0
    examples: list = field(default_factory=list)
    zero_length_fallbacks: int = 0
    rule_hits: Counter = field(default_factory=Counter)
    problems: Counter = field(default_factory=Counter)
    problem_examples: list = field(default_factory=list)
    capture: dict | None = None
    copies: Counter = field(default_factory=Counter)
    port_copies: dict | None = None

    def problem(self, kind: str, where: str, text: str) -> None:
        self.problems[kind] += 1
        if sum(1 for e in self.problem_examples if e["kind"] == kind) < MAX_EXAMPLES:
            self.problem_examples.append({"kind": kind, "where": where, "message": text})

    def as_json(self) -> dict:
        return {
            "messages": self.messages,
            "classified": self.classified,
            "by_type": dict(sorted(self.by_type.items())),
            "per_port": {str(p): n for p, n in sorted(self.per_port.items())},
            "unicast_deliveries": self.unicast_deliveries,
            "multicast_deliveries": self.multicast_deliveries,
            "actions": dict(sorted(self.actions.items())),
            "no_rule_matched": self.default_action,
            "disagreements": self.disagreements,
            "disagreement_examples": self.examples[:10],
            "zero_length_fallbacks": self.zero_length_fallbacks,
            "rule_hits": {str(i): n for i, n in sorted(self.rule_hits.items())},
            "problems": dict(sorted(self.problems.items())),
            "problem_examples": self.problem_examples,
            "capture": self.capture,
            "copies_per_port": {str(p): n for p, n in sorted(self.copies.items())},
        }


@dataclass(frozen=True)
class TraceMessage:
    """A message of a trace: ``where`` (for reports: 'byte offset N' or 'frame N message K'), its
    bytes, the MoldUDP64 ``session`` (10 bytes), ``seq`` and ``count`` of its datagram, and the
    ``network`` headers of its datagram (see :meth:`MessageDecoder.network`; None: no datagram)."""

    where: str
    msg: bytes
    session: bytes = b" " * 10
    seq: int = 0
    count: int = 1
    network: tuple | None = None
    datagram: int | None = None
    #: the capture time of its datagram in ns (None: a BinaryFILE message)
    time_ns: int | None = None


def binaryfile_messages(
    data: bytes, path: str, decoder: MessageDecoder, out: SimulationResult
) -> Iterator[TraceMessage]:
    """The messages of a BinaryFILE (:func:`~.binaryfile.iter_frames`; a zero length prefix takes the
    length the spec gives the message's type, counted in ``out.zero_length_fallbacks``).  Raises
    SubcError as :func:`~.binaryfile.iter_frames` does."""

    def fallback() -> None:
        out.zero_length_fallbacks += 1

    for pos, msg in iter_frames(data, path, decoder.types.length_of, fallback):
        yield TraceMessage(f"byte offset {pos}", msg, seq=out.messages + 1)


def capture_messages(
    path: str,
    decoder: MessageDecoder,
    out: SimulationResult,
    strict: bool,
    udp_port: int | None = None,
    on_datagram=None,
) -> Iterator[TraceMessage]:
    """Every message of every MoldUDP64 datagram to a feed port in the capture at ``path`` (see
    :mod:`.capture`; the feed ports are ``udp_port``, else the spec's if the capture uses them, else
    the capture's MoldUDP64 port, :func:`~.capture.choose_feed_ports`); counts of foreign frames go
    to ``out.capture``.  ``on_datagram(dg, pkt)`` is called before the messages of each datagram
    (a :class:`~.capture.Datagram` and its :class:`~.moldudp64.MoldPacket`), heartbeats included."""
    from ..wire.capture import CaptureStats, choose_feed_ports, iter_moldudp64, read_datagrams

    stats = CaptureStats()
    ports = choose_feed_ports(path, [p for p, _ in decoder.feed.ports], udp_port, stats)
    for dg, pkt in iter_moldudp64(read_datagrams(path, ports, stats, strict), stats, strict, path):
        if on_datagram is not None:
            on_datagram(dg, pkt)
        frame = network_frame(dg)
        network = decoder.network(frame) if frame is not None else (frozenset(), {})
        session = pkt.session_bytes
        for i, msg in enumerate(pkt.messages):
            yield TraceMessage(
                f"frame {dg.frame} message {i}", msg, session, pkt.seq + i, pkt.count, network, dg.frame, dg.time_ns
            )
    out.capture = stats.as_json()


def network_frame(dg) -> bytes | None:
    """An untagged Ethernet/IPv4/UDP frame (MAC addresses 0) with the addresses and ports of the
    capture's datagram ``dg`` and its payload: what the spec's parser sees of the datagram (VLAN
    tags and IPv4 options removed, as the eBPF broker's native parser does); None for IPv6."""
    import ipaddress

    try:
        src, dst = ipaddress.IPv4Address(dg.src[0]), ipaddress.IPv4Address(dg.dst[0])
    except ValueError:
        return None
    ip = (
        bytes([0x45, 0])
        + (28 + len(dg.payload)).to_bytes(2, "big")
        + bytes(5)
        + b"\x11"
        + bytes(2)
        + src.packed
        + dst.packed
    )
    udp = (
        dg.src[1].to_bytes(2, "big")
        + dg.dst[1].to_bytes(2, "big")
        + (8 + len(dg.payload)).to_bytes(2, "big")
        + bytes(2)
    )
    return bytes(12) + b"\x08\x00" + ip + udp + dg.payload


class _CopyBuilder:
    """The copies of a trace under the delivery semantics (see the module docstring): port ->
    [(Copy, (src, dst, time_ns) of the input datagram or None)]."""

    def __init__(self, everyone: list[int]):
        self.everyone = everyone
        self.next_seq: dict[int, int] = {}
        self.out: dict[int, list] = {p: [] for p in everyone}
        self.where = None
        self.session = b""
        self.pending: dict[int, list[bytes]] = {}

    def datagram(self, session: bytes, count: int, where) -> None:
        """Start a datagram (flushing the previous one); a heartbeat or end of session goes to every port."""
        self.flush()
        self.session, self.where = session, where
        if count in (HEARTBEAT, END_OF_SESSION):
            for p in self.everyone:
                self.out[p].append((Copy(session, self.next_seq.get(p, 1), count, ()), where))

    def message(self, msg: bytes, ports) -> None:
        for p in ports:
            self.pending.setdefault(p, []).append(msg)

    def flush(self) -> None:
        for p, msgs in sorted(self.pending.items()):
            seq = self.next_seq.get(p, 1)
            self.out.setdefault(p, []).append((Copy(self.session, seq, len(msgs), tuple(msgs)), self.where))
            self.next_seq[p] = seq + len(msgs)
        self.pending = {}


def simulate_trace(
    res: CompileResult, trace: str | Path, strict: bool = False, udp_port: int | None = None, copies: bool = False
) -> SimulationResult:
    """Run every message of ``trace`` (BinaryFILE, pcap or pcapng) through both semantics (see the
    module docstring; ``udp_port``: a capture's feed port; ``copies``: build each port's copies in
    ``port_copies``, port -> [(:class:`~.delivery.Copy`, ((src IP, port), (dst IP, port), time in
    ns) of the input datagram, or None for a BinaryFILE message)]).  Raises SubcError for an
    unreadable or malformed trace, a spec the decoder cannot follow, or (``strict``) the first
    problem message or foreign frame."""
    decoder = MessageDecoder(res.spec)
    sim = TableSimulator(entries_doc(res.pipeline, res.target))
    stateful = StatefulReference(res.rules, res.spec) if res.ir.state is not None else None
    out = SimulationResult()
    headers = set(res.pipeline.headers)
    default = default_decision(res.spec)
    path = str(trace)
    try:
        capture = is_capture(path)
        data = None if capture else Path(path).read_bytes()
    except OSError as e:
        raise SubcError(f"cannot read trace {path}: {e}") from e
    builder = _CopyBuilder(sorted({a[1] for r in res.rules for a in r.atoms() if a[0] == "fwd"})) if copies else None
    on_datagram = None
    if builder is not None:

        def on_datagram(dg, pkt):
            builder.datagram(pkt.session_bytes, pkt.count, (dg.src, dg.dst, dg.time_ns or 0))

    source = (
        capture_messages(path, decoder, out, strict, udp_port, on_datagram)
        if data is None  # a capture
        else binaryfile_messages(data, path, decoder, out)
    )
    current: int | None = None
    ports_here: set[int] = set()
    for m in source:
        if m.datagram != current:
            out.copies.update(ports_here)  # delivery semantics: one copy per port per datagram
            current, ports_here = m.datagram, set()
        if builder is not None and m.datagram is None:
            builder.datagram(m.session, 1, None)  # a BinaryFILE message is its own datagram
        out.messages += 1
        d: Decoded = decoder.decode(m.msg, m.session, m.seq, m.count, m.network)
        label = decoder.types.label(d.type_key) or "?"
        if not d.classified:
            text = (
                f"message of type {label} has {d.length} bytes, the spec's type has {d.expected}"
                if d.status == LENGTH_MISMATCH
                else f"the spec's parser rejects the message (type {label})"
            )
            if strict:
                raise SubcError(f"{path}: {m.where}: {text}")
            out.problem(d.status, m.where, text)
            continue
        out.by_type[label] += 1
        time_ns = None
        if headers <= d.valid:
            out.classified += 1
            if stateful is not None:  # the trace's own times: a time field, else capture times
                time_ns = stateful.message_time(d.values, m.time_ns, f"{path}: {m.where}: ")
                matched = stateful.matched(d.values, time_ns)
            else:
                matched = [r for r in res.rules if evaluate(r.condition, d.values)]
            out.rule_hits.update(r.index for r in matched)
            ref = combine(matched, res.spec)
        else:
            matched, ref = [], default
        got = sim.process(d.values, d.valid, arrival_ns=time_ns)
        if got != ref:
            out.disagreements += 1
            if len(out.examples) < 10:
                out.examples.append({"where": m.where, "reference": str(ref), "tables": str(got)})
        if not matched and headers <= d.valid:
            out.default_action += 1
        if builder is not None:
            builder.message(m.msg, got.ports)
        if got.ports:
            out.per_port.update(got.ports)
            if m.datagram is None:
                out.copies.update(got.ports)
            else:
                ports_here.update(got.ports)
            if len(got.ports) > 1:
                out.multicast_deliveries += 1
            else:
                out.unicast_deliveries += 1
        elif headers <= d.valid:
            out.actions[str(got)] += 1
    out.copies.update(ports_here)
    if builder is not None:
        builder.flush()
        out.port_copies = builder.out
    return out


def copies_pcaps(port_copies: dict) -> dict[str, bytes]:
    """One pcap per port (``port_<P>.pcap``) of the copies of :func:`simulate_trace` (``copies``):
    each copy as a UDP datagram with the input datagram's addresses, ports and time (a BinaryFILE
    message: 0.0.0.0:0 to 0.0.0.0:0 at time 0), written by :class:`~subc.wire.pcap_writer.UdpPcapWriter`."""
    import io

    from ..wire.pcap_writer import UdpPcapWriter

    files = {}
    for port, items in sorted(port_copies.items()):
        buf = io.BytesIO()
        w = UdpPcapWriter(buf)
        for c, where in items:
            src, dst, t = where if where is not None else (("0.0.0.0", 0), ("0.0.0.0", 0), 0)
            w.write(c.payload(), src, dst, t)
        files[f"port_{port}.pcap"] = buf.getvalue()
    return files
