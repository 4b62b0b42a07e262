"""Replay a trace to one UDP destination: a capture as captured, a BinaryFILE as a live feed would.

A *trace* is a pcap / pcapng capture (told apart by its magic number) or an ITCH BinaryFILE.

* **Capture**: every datagram to the feed port that is a MoldUDP64 downstream packet is sent with its
  UDP payload unchanged, one datagram per datagram, in capture order: session, sequence numbers,
  heartbeats and message packing stay as captured.  The feed port is ``ports``, else the most common
  destination port of the datagrams that decode as MoldUDP64
  (:func:`~subc.wire.capture.detect_feed_ports`).  Every other frame, and every feed datagram that
  is not valid MoldUDP64, is counted by kind (:class:`~subc.wire.capture.CaptureStats`) and not
  sent; ``strict`` makes the first one a :class:`SubcError`.
* **BinaryFILE** (framed by its length prefixes; a zero prefix takes its length from ``length_of``, a
  spec's :meth:`~subc.wire.decoder.TypeTable.length_of` with ``--spec``, else from the ITCH 5.0
  lengths of :mod:`subc.workloads.itch_codec`): the messages are packed into MoldUDP64
  datagrams as a live feed does (:mod:`subc.workloads.feed`: a timestamp window and a payload limit),
  or ``batch`` messages each, with session ``session`` and gap-free sequence numbers from
  ``start_seq``.

Pacing, one of: ``rate`` messages per second (message ``i`` is due ``i / rate`` s after the start,
and a datagram when its first message is due), ``pps`` datagrams per second, ``speed`` (the gaps of
the trace's timestamps divided by ``speed``: capture times, or for a BinaryFILE the ITCH timestamp
of each datagram's last message), or none (``speed`` None or 0: as fast as possible).  The sender
sleeps until each datagram is due (no busy waiting) and never waits to catch up.
"""

from __future__ import annotations

import builtins
import hashlib
from collections import Counter
import socket
import time
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Callable, Iterator

from ..errors import SubcError
from ..workloads.feed import DEFAULT_MAX_PAYLOAD, DEFAULT_WINDOW_NS, feed_datagrams
from ..wire.capture import CaptureStats, detect_feed_ports, iter_moldudp64, read_datagrams
from ..wire.pcap_records import is_capture
from ..workloads.itch_codec import read_binaryfile
from ..wire.moldudp64 import HEADER_LEN, MAX_COUNT, encode_end_of_session

#: Largest UDP payload :func:`replay` builds from several messages by default (bytes).
MAX_PAYLOAD = DEFAULT_MAX_PAYLOAD
#: Session name of the datagrams built from a BinaryFILE by default.
DEFAULT_SESSION = "SUBC000001"

__all__ = ["DEFAULT_SESSION", "MAX_PAYLOAD", "ReplayStats", "is_capture", "iter_trace_messages", "replay"]


def iter_trace_messages(
    path: str | Path, ports: list[int] | None = None, stats: CaptureStats | None = None
) -> Iterator[bytes]:
    """Every ITCH message (bytes) of the trace at ``path``, in order.

    BinaryFILE: every message (errors as :func:`read_binaryfile`: SubcError with the byte offset).
    Capture: every message of every MoldUDP64 datagram to the feed port (``ports``, else detected),
    other frames counted in ``stats`` (see :func:`~subc.wire.capture.read_datagrams`)."""
    if is_capture(path):
        stats = stats if stats is not None else CaptureStats()
        ports = detect_feed_ports(path, stats) if ports is None else ports
        for _dg, packet in iter_moldudp64(read_datagrams(path, ports, stats), stats):
            yield from packet.messages
    else:
        for _offset, msg in read_binaryfile(path):
            yield msg


@dataclass
class ReplayStats:
    """What :func:`replay` sent (see :meth:`as_json`).

    ``source``: 'capture' or 'binaryfile'; ``datagrams`` (end-of-session packet and captured
    heartbeats included), ITCH ``messages``, ``bytes`` (sum of UDP payload bytes),
    ``max_messages`` (most messages in one datagram), ``seconds`` (wall clock of the sending, pacing
    included), ``trace_seconds`` (from the first to the last sent datagram's timestamp in the trace),
    ``pacing`` (how it was paced), ``sha256`` (hex digest of the payloads sent, in order, each preceded
    by its length as 4 bytes big-endian: ``subc listen`` reports the same digest of what it
    received), ``capture`` (for a capture: the frames by kind, as read until the last datagram
    sent), ``not_decoded`` (with a spec's decoder: messages sent that the spec cannot decode, by
    kind, see :mod:`.decoder`) and ``nothing_sent`` (None, or why nothing was sent).
    """

    source: str = "binaryfile"
    datagrams: int = 0
    messages: int = 0
    bytes: int = 0
    max_messages: int = 0
    seconds: float = 0.0
    trace_seconds: float = 0.0
    pacing: str = "as fast as possible"
    capture: CaptureStats | None = None
    nothing_sent: str | None = None
    not_decoded: Counter = field(default_factory=Counter)
    _digest: "hashlib._Hash" = field(default_factory=hashlib.sha256, repr=False)

    @property
    def messages_per_datagram(self) -> float:
        """Mean ITCH messages per datagram sent (0 when none was sent)."""
        return self.messages / self.datagrams if self.datagrams else 0.0

    @property
    def sha256(self) -> str:
        return self._digest.hexdigest()

    def add(self, payload: builtins.bytes, messages: int) -> None:  # (``bytes`` here is the field)
        """Count one datagram sent with ``messages`` ITCH messages."""
        self.datagrams += 1
        self.messages += messages
        self.bytes += len(payload)
        self.max_messages = max(self.max_messages, messages)
        self._digest.update(len(payload).to_bytes(4, "big"))
        self._digest.update(payload)

    def as_json(self) -> dict:
        doc = {
            "source": self.source,
            "datagrams": self.datagrams,
            "messages": self.messages,
            "bytes": self.bytes,
            "messages_per_datagram": {"mean": round(self.messages_per_datagram, 3), "max": self.max_messages},
            "seconds": self.seconds,
            "trace_seconds": self.trace_seconds,
            "pacing": self.pacing,
            "sha256": self.sha256,
            "not_decoded": dict(sorted(self.not_decoded.items())),
            "nothing_sent": self.nothing_sent,
        }
        if self.capture is not None:
            doc["capture"] = self.capture.as_json()
        return doc


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise SubcError(message)


def replay(
    path: str | Path,
    dest: tuple[str, int],
    rate: float | None = None,
    batch: int | None = None,
    session: str | None = None,
    start_seq: int = 1,
    count: int | None = None,
    end_of_session: bool = False,
    *,
    speed: float | None = None,
    pps: float | None = None,
    window_ns: int | None = None,
    max_payload: int | None = None,
    ports: list[int] | None = None,
    strict: bool = False,
    log: Callable[[str], object] | None = None,
    decoder=None,
) -> ReplayStats:
    """Send the trace at ``path`` to ``dest`` = (host, UDP port) as MoldUDP64 (see the module docstring).

    Pacing: ``rate`` (messages/s) or ``pps`` (datagrams/s), else ``speed`` (> 0: the trace's pace
    times ``speed``; None or 0: as fast as possible).  ``count``: at most that many datagrams of a
    capture, or messages of a BinaryFILE.  Capture only: ``ports`` (feed UDP ports; default:
    detected), ``strict``.  BinaryFILE only: ``batch`` (messages per datagram instead of the
    packer), ``window_ns`` (default 100 µs) and ``max_payload`` (bytes, default 1400) of the packer,
    ``session`` (default ``SUBC000001``), ``start_seq``, ``end_of_session`` (finally send an
    end-of-session packet with the next sequence number).  ``log`` receives notes (the detected
    feed port).  ``decoder``: a spec's :class:`~.decoder.MessageDecoder`, which frames a BinaryFILE's
    zero length prefixes and checks every message sent (``not_decoded``); without it, zero length
    prefixes take ITCH 5.0's lengths.  When nothing is sent, the stats say why in ``nothing_sent``.

    Raises :class:`SubcError` for bad or conflicting arguments (a BinaryFILE option for a capture
    or the reverse, both ``rate`` and ``pps``), an unreadable or malformed trace file, a foreign
    frame with ``strict``, an unresolvable destination or a failed send.
    """
    _check(rate is None or rate > 0, f"rate must be a positive number of messages per second, got {rate}")
    _check(pps is None or pps > 0, f"pps must be a positive number of datagrams per second, got {pps}")
    _check(rate is None or pps is None, "give a rate in messages per second or in datagrams per second, not both")
    _check(speed is None or speed >= 0, f"speed must not be negative, got {speed}")
    _check(count is None or count >= 0, f"count must not be negative, got {count}")
    _check(batch is None or 1 <= batch <= MAX_COUNT, f"batch must be between 1 and {MAX_COUNT}, got {batch}")
    _check(window_ns is None or window_ns >= 0, f"the packing window must not be negative, got {window_ns}")
    _check(
        max_payload is None or max_payload >= HEADER_LEN,
        f"the largest payload must be at least the {HEADER_LEN}-byte MoldUDP64 header, got {max_payload}",
    )
    log = log or (lambda _m: None)
    stats = ReplayStats()

    def check(msg: bytes) -> bytes:
        if decoder is not None:
            d = decoder.decode(msg)
            if not d.classified:
                stats.not_decoded[d.status] += 1
        return msg

    if is_capture(path):
        given = [
            name
            for name, v in (("batch", batch), ("session", session), ("window", window_ns), ("max payload", max_payload))
            if v is not None
        ]
        given += ["end of session"] if end_of_session else []
        given += ["start sequence number"] if start_seq != 1 else []
        _check(not given, f"{path} is a capture, replayed as captured; only a BinaryFILE takes: {', '.join(given)}")
        stats.source, stats.capture = "capture", CaptureStats()
        items = _capture_items(path, ports, stats.capture, strict, log, check)
        if count is not None:
            items = islice(items, count)
    else:
        _check(ports is None, f"{path} is a BinaryFILE; only a capture takes: feed port")
        length_of = decoder.types.length_of if decoder is not None else None
        messages: Iterator[bytes] = (check(msg) for _off, msg in read_binaryfile(path, length_of=length_of))
        if count is not None:
            messages = islice(messages, count)
        items = _binaryfile_items(
            messages,
            session or DEFAULT_SESSION,
            start_seq,
            batch,
            DEFAULT_WINDOW_NS if window_ns is None else window_ns,
            max_payload or MAX_PAYLOAD,
            end_of_session,
        )
    _send(items, dest, stats, rate, pps, speed)
    if not stats.datagrams:
        stats.nothing_sent = (
            f"nothing sent: {path} has no MoldUDP64 datagram to replay; {stats.capture.summary()}"
            if stats.capture is not None
            else f"nothing sent: {path} holds no messages"
        )
    return stats


def _capture_items(
    path, ports, cstats: CaptureStats, strict: bool, log, check
) -> Iterator[tuple[int | None, bytes, int]]:
    if ports is None:
        ports = detect_feed_ports(path, cstats)
        seen = ", ".join(f"{p}: {n}" for p, n in sorted(cstats.detected_ports.items(), key=lambda kv: -kv[1])[:5])
        log(
            f"{path}: feed port {ports[0]} (MoldUDP64 datagrams by UDP port: {seen}; --udp-port to choose)"
            if ports
            else f"{path}: no UDP datagram decodes as MoldUDP64"
        )
    for dg, packet in iter_moldudp64(read_datagrams(path, ports, cstats, strict), cstats, strict, str(path)):
        for msg in packet.messages:
            check(msg)
        yield dg.time_ns, dg.payload, len(packet.messages)


def _binaryfile_items(messages, session, start_seq, batch, window_ns, max_payload, end_of_session):
    seq, when = start_seq, None
    for d in feed_datagrams(messages, session, start_seq, window_ns, max_payload, batch):
        yield d.time_ns, d.payload, len(d.messages)
        seq, when = d.seq + len(d.messages), d.time_ns
    if end_of_session:
        yield when, encode_end_of_session(session, seq), 0


def _send(items, dest: tuple[str, int], stats: ReplayStats, rate, pps, speed) -> None:
    try:
        family, _, _, _, addr = socket.getaddrinfo(dest[0], dest[1], type=socket.SOCK_DGRAM)[0]
    except (socket.gaierror, OSError) as e:
        raise SubcError(f"cannot resolve destination {dest[0]}:{dest[1]}: {e}") from e
    if rate:
        stats.pacing = f"{rate:g} messages/s"
    elif pps:
        stats.pacing = f"{pps:g} datagrams/s"
    elif speed:
        stats.pacing = f"trace timestamps x {speed:g}"
    first = last = None
    with socket.socket(family, socket.SOCK_DGRAM) as sock:
        start = time.perf_counter()
        try:
            for when, payload, n in items:
                if when is not None:
                    first = when if first is None else first
                    last = when
                due = (
                    stats.messages / rate
                    if rate
                    else stats.datagrams / pps
                    if pps
                    else max(0, last - first) / 1e9 / speed
                    if speed and last is not None
                    else None
                )
                if due is not None:
                    delay = start + due - time.perf_counter()
                    if delay > 0:
                        time.sleep(delay)
                sock.sendto(payload, addr)
                stats.add(payload, n)
        except OSError as e:
            raise SubcError(f"sending to {dest[0]}:{dest[1]} failed: {e}") from e
        stats.seconds = time.perf_counter() - start
    stats.trace_seconds = (last - first) / 1e9 if first is not None else 0.0
