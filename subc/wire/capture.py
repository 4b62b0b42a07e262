"""The one capture reader: pcap/pcapng records -> UDP datagrams -> MoldUDP64 packets.

Every command that reads a capture (``simulate``, ``analyze``, ``replay``, ``listen``'s output)
goes through here, in three layers:

* :func:`~.pcap_records.read_records` (:mod:`.pcap_records`): the packet records of a pcap or
  pcapng file, every length checked against the file size before anything is read (a broken
  *file* is a :class:`SubcError` naming the file and the byte offset).
* :func:`read_datagrams`: the UDP datagrams (IPv4, IPv6) of the frames, decoded with bounds
  checks by :func:`~.frames.decode_frame` (:mod:`.frames`): Ethernet with any number of 802.1Q
  (0x8100) / 802.1ad (0x88a8) / 0x9100 / 0x9200 tags, Linux cooked SLL and SLL2, BSD loopback, raw
  IP.  Every frame is counted in exactly one *kind* of :class:`CaptureStats`; frames that are not
  datagrams to a feed port (ARP, LLDP, STP, HSRP on UDP 1985, TCP, IP fragments, cut frames, ...)
  are counted and skipped, or with ``strict`` are a SubcError naming the file, the frame number,
  the kind and the byte offset of the frame's record.
* :func:`iter_moldudp64`: the datagrams as MoldUDP64 downstream packets; a datagram whose header
  and message blocks disagree with its bytes is counted as ``malformed_moldudp64`` (with its frame
  number among the examples) and skipped, never decoded into garbage.

The feed port of a capture is found here too (:func:`detect_feed_ports`, :func:`choose_feed_ports`);
writing a capture is :mod:`.pcap_writer`'s.  IP fragments are counted, not reassembled.  Nothing
here knows about ITCH.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

from ..errors import SubcError
from .frames import FrameSkipped, decode_frame
from .moldudp64 import MoldPacket, decode_packet
from .pcap_records import read_records

#: The kinds a frame is counted as (each frame in exactly one), in report order.
FRAME_KINDS = (
    "feed_datagrams",
    "other_udp",
    "not_udp",
    "not_ip",
    "ip_fragments",
    "truncated",
    "malformed_ip",
    "undecodable_link",
)
#: Kinds that are problems with the feed (the rest is foreign traffic).
PROBLEM_KINDS = ("ip_fragments", "truncated", "malformed_ip", "undecodable_link", "malformed_moldudp64")
#: Examples kept per kind.
MAX_EXAMPLES = 10


# ------------------------------------------------------------------------------ statistics


@dataclass
class CaptureStats:
    """What reading a capture found, by kind (counts of frames, bytes not involved).

    Every frame is counted in ``frames`` and in exactly one of :data:`FRAME_KINDS`:
    ``feed_datagrams`` (UDP to a feed port, or any UDP when no ports were given), ``other_udp`` (UDP
    to another port, e.g. HSRP on 1985), ``not_udp`` (IP carrying another protocol), ``not_ip`` (ARP,
    LLDP, STP/LLC, ...), ``ip_fragments`` (any IPv4/IPv6 fragment; not reassembled), ``truncated``
    (captured bytes shorter than the IP or UDP headers or than the UDP length says),
    ``malformed_ip`` (inconsistent IP/UDP headers: bad version or header length, a UDP length below
    8 or past the IP payload) and ``undecodable_link`` (a link-layer header that does not decode, or
    an unsupported link type).  At the MoldUDP64 level (:func:`iter_moldudp64`), of the feed
    datagrams: ``moldudp64_packets`` decoded (carrying ``messages``) and ``malformed_moldudp64``.

    ``feed_ports``: the feed ports (None: all UDP); ``detected_ports``: MoldUDP64 datagrams per
    destination port when the feed port was detected (:func:`detect_feed_ports`); ``other_udp_ports``:
    other UDP datagrams per destination port; ``examples``: per kind other than ``feed_datagrams``
    the first :data:`MAX_EXAMPLES` ``(frame number, kind, message)``; ``path``: the capture last read.
    """

    frames: int = 0
    feed_datagrams: int = 0
    other_udp: int = 0
    not_udp: int = 0
    not_ip: int = 0
    ip_fragments: int = 0
    truncated: int = 0
    malformed_ip: int = 0
    undecodable_link: int = 0
    moldudp64_packets: int = 0
    messages: int = 0
    malformed_moldudp64: int = 0
    feed_ports: list[int] | None = None
    detected_ports: dict[int, int] = field(default_factory=dict)
    other_udp_ports: Counter = field(default_factory=Counter)
    examples: dict[str, list[tuple[int, str, str]]] = field(default_factory=dict)
    path: str | None = None

    def count(self, kind: str, frame: int, message: str) -> None:
        """Count one frame (or, for ``malformed_moldudp64``, one datagram) of ``kind`` and keep it as an
        example if fewer than :data:`MAX_EXAMPLES` of that kind are kept."""
        setattr(self, kind, getattr(self, kind) + 1)
        kept = self.examples.setdefault(kind, [])
        if len(kept) < MAX_EXAMPLES:
            kept.append((frame, kind, message))

    @property
    def foreign(self) -> int:
        """Frames that are not feed datagrams."""
        return self.frames - self.feed_datagrams

    @property
    def problems(self) -> int:
        """Frames and datagrams of the :data:`PROBLEM_KINDS`."""
        return sum(getattr(self, k) for k in PROBLEM_KINDS)

    def merge(self, other: "CaptureStats") -> "CaptureStats":
        """Add the counts and examples of ``other`` (another file or task) to these; returns self."""
        for k in ("frames", *FRAME_KINDS, "moldudp64_packets", "messages", "malformed_moldudp64"):
            setattr(self, k, getattr(self, k) + getattr(other, k))
        if other.feed_ports is not None:
            self.feed_ports = sorted(set(self.feed_ports or ()) | set(other.feed_ports))
        for port, n in other.detected_ports.items():
            self.detected_ports[port] = self.detected_ports.get(port, 0) + n
        self.other_udp_ports.update(other.other_udp_ports)
        for kind, kept in other.examples.items():
            mine = self.examples.setdefault(kind, [])
            mine.extend(kept[: MAX_EXAMPLES - len(mine)])
        return self

    def as_json(self) -> dict:
        """The counts as a JSON-ready dict: every kind, ``feed_ports``, ``detected_ports`` and the ten most
        common ``other_udp_ports`` (port numbers as strings), and ``examples`` as a list of
        ``{"frame", "kind", "message"}`` in kind order."""
        doc = {
            k: getattr(self, k)
            for k in ("frames", *FRAME_KINDS, "moldudp64_packets", "messages", "malformed_moldudp64")
        }
        doc["feed_ports"] = self.feed_ports
        doc["detected_ports"] = {str(p): n for p, n in sorted(self.detected_ports.items())}
        doc["other_udp_ports"] = {str(p): n for p, n in self.other_udp_ports.most_common(10)}
        doc["examples"] = [
            {"frame": fr, "kind": k, "message": m}
            for kind in (*FRAME_KINDS, "malformed_moldudp64")
            for fr, k, m in self.examples.get(kind, [])
        ]
        return doc

    def summary(self) -> str:
        """One line: the frames by kind, e.g. ``12 frames: 9 feed datagrams (UDP port 26477), 2 other UDP
        (port 1985: 2), 1 not IP; 1 malformed MoldUDP64 (frame 7: ...)``."""
        ports = (
            "all UDP"
            if self.feed_ports is None
            else ("UDP port " + ", ".join(map(str, self.feed_ports)) if self.feed_ports else "no feed port")
        )
        parts = [f"{self.feed_datagrams} feed datagrams ({ports})"]
        names = {
            "other_udp": "other UDP",
            "not_udp": "IP not UDP",
            "not_ip": "not IP",
            "ip_fragments": "IP fragments",
            "truncated": "truncated",
            "malformed_ip": "malformed IP/UDP",
            "undecodable_link": "undecodable link layer",
        }
        for kind, name in names.items():
            n = getattr(self, kind)
            if n:
                extra = ""
                if kind == "other_udp":
                    extra = " (" + ", ".join(f"port {p}: {c}" for p, c in self.other_udp_ports.most_common(3)) + ")"
                elif kind in PROBLEM_KINDS:
                    fr, _, msg = self.examples[kind][0]
                    extra = f" (first: frame {fr}: {msg})"
                parts.append(f"{n} {name}{extra}")
        line = f"{self.frames} frames: " + ", ".join(parts)
        if self.malformed_moldudp64:
            fr, _, msg = self.examples["malformed_moldudp64"][0]
            line += f"; {self.malformed_moldudp64} malformed MoldUDP64 (first: frame {fr}: {msg})"
        return line


# ------------------------------------------------------------------------------ frames


@dataclass(frozen=True)
class Datagram:
    """A UDP datagram of a capture: ``frame`` (1-based frame number), ``offset`` (byte offset of the
    frame's record in the file), ``time_ns`` (capture time, ns since the epoch; None when the record
    has none), ``src``/``dst`` ((IP address string, UDP port)), ``vlans`` (VLAN ids of the tags, outer
    first) and ``payload`` (the UDP payload, cut to the UDP length: link-layer padding dropped)."""

    frame: int
    offset: int
    time_ns: int | None
    src: tuple[str, int]
    dst: tuple[str, int]
    vlans: tuple[int, ...]
    payload: bytes


def read_datagrams(
    path: str | Path, ports: Iterable[int] | None = None, stats: CaptureStats | None = None, strict: bool = False
) -> Iterator[Datagram]:
    """Every UDP datagram of the pcap/pcapng capture at ``path`` whose destination port is in ``ports``
    (every UDP datagram when None), in capture order, as :class:`Datagram`.

    Every frame is counted in ``stats`` (see :class:`CaptureStats`).  Frames that are not such
    datagrams are skipped; with ``strict`` the first one raises :class:`SubcError` naming the file,
    the frame number, the kind and the byte offset of the frame's record.  A capture file that
    cannot be read (unknown magic, truncated record, ...) raises SubcError as :func:`read_records`."""
    stats = stats if stats is not None else CaptureStats()
    feed = None if ports is None else frozenset(ports)
    stats.path = str(path)
    if feed is not None:
        stats.feed_ports = sorted(set(stats.feed_ports or ()) | feed)
    try:
        f = open(path, "rb")
    except OSError as e:
        raise SubcError(f"cannot read trace {path}: {e}") from e
    with f:
        for number, rec in enumerate(read_records(f, str(path)), start=1):
            stats.frames += 1
            try:
                src, dst, vlans, payload = decode_frame(rec.linktype, rec.frame, feed)
            except FrameSkipped as s:
                stats.count(s.kind, number, s.message)
                if s.port is not None:
                    stats.other_udp_ports[s.port] += 1
                if strict:
                    raise SubcError(
                        f"{path}: frame {number}: {s.kind}: {s.message} (--strict: only datagrams to "
                        f"the feed port are allowed); the frame's record is at byte offset "
                        f"{rec.offset}"
                    ) from None
                continue
            stats.feed_datagrams += 1
            yield Datagram(number, rec.offset, rec.time_ns, src, dst, vlans, payload)


def iter_moldudp64(
    datagrams: Iterable[Datagram], stats: CaptureStats | None = None, strict: bool = False, path: str | None = None
) -> Iterator[tuple[Datagram, MoldPacket]]:
    """``(datagram, packet)`` for every datagram whose payload is a MoldUDP64 downstream packet
    (:func:`subc.wire.moldudp64.decode_packet`; any session bytes, printable or not).

    A datagram whose header and message blocks disagree with its bytes (short header, truncated
    block, bytes after the last block) is counted in ``stats.malformed_moldudp64`` with its frame
    number and the decoder's message among the examples, and skipped; with ``strict`` it raises
    :class:`SubcError` naming the file (``path``, else ``stats.path``), the frame and the record's
    byte offset."""
    stats = stats if stats is not None else CaptureStats()
    for dg in datagrams:
        try:
            pkt = decode_packet(dg.payload)
        except SubcError as e:
            stats.count("malformed_moldudp64", dg.frame, e.message)
            if strict:
                raise SubcError(
                    f"{path or stats.path}: frame {dg.frame}: malformed_moldudp64: {e.message} (in the "
                    f"UDP payload); the frame's record is at byte offset {dg.offset}"
                ) from None
            continue
        stats.moldudp64_packets += 1
        stats.messages += len(pkt.messages)
        yield dg, pkt


def detect_feed_ports(path: str | Path, stats: CaptureStats | None = None) -> list[int]:
    """The feed port of the capture at ``path``: ``[port]``, the UDP destination port whose datagrams
    that decode as MoldUDP64 carry the most messages (then: the most such datagrams; then the lowest
    port), or ``[]`` when none decodes.  One pass over
    the capture; records the MoldUDP64 datagrams per port in ``stats.detected_ports``.  Raises
    :class:`SubcError` when the capture cannot be read."""
    per_port: Counter = Counter()
    per_port_msgs: Counter = Counter()
    for dg, pkt in iter_moldudp64(read_datagrams(path)):
        per_port[dg.dst[1]] += 1
        per_port_msgs[dg.dst[1]] += len(pkt.messages)
    if stats is not None:
        stats.detected_ports = dict(sorted(per_port.items()))
    if not per_port:
        return []
    # messages first: 20-byte payloads of other protocols (HSRP hellos, zeros) can read as heartbeats
    return [min(per_port, key=lambda p: (-per_port_msgs[p], -per_port[p], p))]


def choose_feed_ports(
    path: str | Path, spec_ports: Iterable[int], udp_port: int | None = None, stats: CaptureStats | None = None
) -> list[int]:
    """The feed ports to read the capture at ``path`` with: ``[udp_port]`` when given; else the
    spec's ``spec_ports`` when any MoldUDP64 datagram of the capture goes to one of them; else the
    detected port (:func:`detect_feed_ports`: a real feed may use another port than the spec's,
    e.g. Nasdaq TotalView on 26477); else the spec's ports.  The choice is recorded in
    ``stats.feed_ports`` and ``stats.detected_ports``.  Raises SubcError for an unreadable capture."""
    if udp_port is not None:
        return [udp_port]
    spec_ports = sorted(set(spec_ports))
    probe = CaptureStats()
    detected = detect_feed_ports(path, probe)
    if stats is not None:
        stats.detected_ports = probe.detected_ports
    if any(p in probe.detected_ports for p in spec_ports) or not detected:
        return spec_ports
    return detected
