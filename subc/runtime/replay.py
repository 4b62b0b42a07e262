"""Replay ITCH 5.0 messages as MoldUDP64 over UDP.

A *trace* is either an ITCH BinaryFILE (:func:`subc.runtime.itch.read_binaryfile`) or a pcap /
pcapng capture of MoldUDP64 over UDP, told apart by the first four bytes.  :func:`replay` sends
the trace's messages as MoldUDP64 downstream packets (MoldUDP64 Protocol Specification v1.00,
"Downstream packets"; see :mod:`.moldudp64`) to one UDP destination.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Iterable, Iterator

from ..errors import SubcError
from .itch import read_binaryfile
from .moldudp64 import HEADER_LEN, MAX_COUNT, decode_packet, encode_end_of_session, encode_packet

PCAP_MAGICS = {bytes.fromhex(m) for m in ("a1b2c3d4", "d4c3b2a1", "a1b23c4d", "4d3cb2a1")}
PCAPNG_MAGIC = bytes.fromhex("0a0d0d0a")
#: Largest UDP payload :func:`replay` builds from several messages (bytes).
MAX_PAYLOAD = 1400


def is_capture(path: str | Path) -> bool:
    """Whether the file at ``path`` starts with a pcap or pcapng magic number (unreadable: SubcError)."""
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise SubcError(f"cannot read trace {path}: {e}") from e
    return magic in PCAP_MAGICS or magic == PCAPNG_MAGIC


def iter_capture_payloads(path: str | Path) -> Iterator[bytes]:
    """The UDP payloads (bytes) of the pcap/pcapng capture at ``path``, in capture order.

    Frames without a UDP header (TCP, ARP, IP fragments after the first) are skipped.  Needs
    scapy (imported here, not at module load).  Raises :class:`SubcError` if scapy is missing or
    cannot read the file.
    """
    try:
        from scapy.error import Scapy_Exception
        from scapy.layers import inet6, l2  # noqa: F401  (link and IPv6 dissectors)
        from scapy.layers.inet import UDP
        from scapy.utils import PcapReader
    except ImportError as e:
        raise SubcError(f"reading the capture {path} needs scapy ({e}); install subc[test]") from e
    try:
        with PcapReader(str(path)) as reader:  # dispatches to PcapNgReader on a pcapng magic
            for pkt in reader:
                udp = pkt.getlayer(UDP)
                if udp is None:
                    continue
                raw = bytes(udp)
                end = udp.len if udp.len is not None and 8 <= udp.len <= len(raw) else len(raw)
                yield raw[8:end]  # the UDP length drops any link-layer padding
    except (Scapy_Exception, OSError, EOFError) as e:
        raise SubcError(f"cannot read capture {path}: {e}") from e


def iter_trace_messages(path: str | Path) -> Iterator[bytes]:
    """Every ITCH message (bytes) of the trace at ``path``, in order.

    BinaryFILE: every message (errors as :func:`read_binaryfile`: SubcError with the byte offset).
    Capture: every message of every UDP payload that decodes as a MoldUDP64 downstream packet;
    other UDP payloads are skipped.
    """
    if is_capture(path):
        for payload in iter_capture_payloads(path):
            try:
                packet = decode_packet(payload)
            except SubcError:
                continue
            yield from packet.messages
    else:
        for _offset, msg in read_binaryfile(path):
            yield msg


def iter_batches(messages: Iterable[bytes], batch: int, max_payload: int = MAX_PAYLOAD) -> Iterator[list[bytes]]:
    """Group ``messages`` in order into lists of at most ``batch`` messages whose MoldUDP64 packet
    is at most ``max_payload`` bytes; a message too long for ``max_payload`` on its own goes alone."""
    group: list[bytes] = []
    size = HEADER_LEN
    for msg in messages:
        if group and (len(group) >= batch or size + 2 + len(msg) > max_payload):
            yield group
            group, size = [], HEADER_LEN
        group.append(msg)
        size += 2 + len(msg)
    if group:
        yield group


@dataclass
class ReplayStats:
    """What :func:`replay` sent: ``datagrams`` (including an end-of-session packet), ITCH
    ``messages``, ``bytes`` (sum of UDP payload bytes), ``seconds`` (wall clock of the sending,
    pacing included)."""

    datagrams: int = 0
    messages: int = 0
    bytes: int = 0
    seconds: float = 0.0

    def as_json(self) -> dict:
        return {"datagrams": self.datagrams, "messages": self.messages, "bytes": self.bytes, "seconds": self.seconds}


def replay(
    path: str | Path,
    dest: tuple[str, int],
    rate: float | None = None,
    batch: int = 1,
    session: str = "SUBC000001",
    start_seq: int = 1,
    count: int | None = None,
    end_of_session: bool = False,
) -> ReplayStats:
    """Send the messages of the trace at ``path`` to ``dest`` = (host, UDP port) as MoldUDP64.

    Each datagram carries up to ``batch`` consecutive messages, fewer when the payload would
    exceed :data:`MAX_PAYLOAD` (1400) bytes; its sequence number is that of its first message,
    starting at ``start_seq`` and contiguous.  ``rate``: messages per second (None: as fast as
    possible); message ``i`` is due ``i / rate`` seconds after the start and the sender sleeps
    until the first message of each datagram is due.  ``count``: send at most that many
    messages.  ``end_of_session``: finally send an end-of-session packet whose sequence number
    is the next one.  Raises :class:`SubcError` for bad arguments, an unreadable trace, an
    unresolvable destination or a failed send.
    """
    if batch < 1 or batch > MAX_COUNT:
        raise SubcError(f"batch must be between 1 and {MAX_COUNT}, got {batch}")
    if rate is not None and not rate > 0:
        raise SubcError(f"rate must be a positive number of messages per second, got {rate}")
    if count is not None and count < 0:
        raise SubcError(f"count must not be negative, got {count}")
    try:
        family, _, _, _, addr = socket.getaddrinfo(dest[0], dest[1], type=socket.SOCK_DGRAM)[0]
    except (socket.gaierror, OSError) as e:
        raise SubcError(f"cannot resolve destination {dest[0]}:{dest[1]}: {e}") from e
    messages = iter_trace_messages(path)
    if count is not None:
        messages = islice(messages, count)
    stats = ReplayStats()
    seq = start_seq
    with socket.socket(family, socket.SOCK_DGRAM) as sock:
        start = time.perf_counter()
        try:
            for group in iter_batches(messages, batch):
                if rate is not None:
                    delay = start + stats.messages / rate - time.perf_counter()
                    if delay > 0:
                        time.sleep(delay)
                payload = encode_packet(session, seq, group)
                sock.sendto(payload, addr)
                seq += len(group)
                stats.datagrams += 1
                stats.messages += len(group)
                stats.bytes += len(payload)
            if end_of_session:
                payload = encode_end_of_session(session, seq)
                sock.sendto(payload, addr)
                stats.datagrams += 1
                stats.bytes += len(payload)
        except OSError as e:
            raise SubcError(f"sending to {dest[0]}:{dest[1]} failed: {e}") from e
        stats.seconds = time.perf_counter() - start
    return stats
