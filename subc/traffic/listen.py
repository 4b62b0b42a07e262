"""Receive MoldUDP64 over UDP and count messages by type, sequence gaps and messages a spec cannot decode.

Message types and lengths come from a spec when one is given (:class:`~.decoder.MessageDecoder`:
types labelled by the spec's type key, and messages whose length differs from their type's length
in the spec, or that its parser rejects, counted as ``not_decoded``); without a spec, messages are
counted by their first byte.  Packets are MoldUDP64 downstream packets (MoldUDP64 Protocol
Specification v1.00, "Downstream
packets"; :mod:`.moldudp64`).  Gap detection follows the specification's sequencing: per
session, the next expected sequence number is the sequence number plus the message count of
the latest packet (heartbeats and end of session carry the next sequence number themselves).
"""

from __future__ import annotations

import builtins
import hashlib
import socket
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Sequence

from ..errors import SubcError
from ..wire.pcap_writer import UdpPcapWriter
from ..recovery.receiver import RecoveringReceiver
from ..wire.moldudp64 import decode_packet

if TYPE_CHECKING:
    from ..wire.decoder import MessageDecoder

#: Receive buffer requested by :func:`listen` (bytes); the kernel may grant less.
RCVBUF = 8 * 1024 * 1024


@dataclass
class ListenStats:
    """Counts of :func:`listen` (see :meth:`as_json`).

    ``received``: datagrams (malformed ones included); ``bytes``: their UDP payload bytes;
    ``messages``/``by_type``: messages in the decoded packets (those of duplicate packets
    included), by type (the spec's type label, else the first byte); ``not_decoded``: messages the
    spec cannot decode, by kind (with a spec); ``gaps``: packets whose sequence number was above the expected
    one, ``missing_messages``: the sum of the differences; ``duplicates``: packets whose sequence
    number was below the expected one; ``malformed``: datagrams that are not MoldUDP64;
    ``sessions``: session name -> next expected sequence number; ``first_seq``/``last_seq``:
    lowest/highest sequence number of a received message (None before any); ``seconds``: from
    the first to the last datagram; ``kept``: with ``keep=True``, every message received (bytes), in
    arrival order; ``sha256``: hex digest of the payloads received, in
    order, each preceded by its length as 4 bytes big-endian (as ``subc replay`` reports what it
    sent).  Sessions that are not printable are named ``0x`` and their hex bytes.

    With recovery (:func:`listen` with ``recover``), the gap counts say what the network lost,
    and ``messages``/``by_type``/``kept`` count the messages delivered (once each, in sequence
    order, lost ones recovered); ``recovered`` counts those that came from the request server,
    ``lost`` lists the (first, last) sequence numbers given up (gone from the server's retention
    or unanswered), ``requests`` the re-requests sent.
    """

    received: int = 0
    bytes: int = 0
    messages: int = 0
    by_type: Counter = field(default_factory=Counter)
    not_decoded: Counter = field(default_factory=Counter)
    heartbeats: int = 0
    end_of_session: bool = False
    gaps: int = 0
    missing_messages: int = 0
    duplicates: int = 0
    malformed: int = 0
    sessions: dict[str, int] = field(default_factory=dict)
    first_seq: int | None = None
    last_seq: int | None = None
    seconds: float = 0.0
    kept: list[builtins.bytes] = field(default_factory=list)  # (``bytes`` here is the field above)
    recovered: int = 0
    lost: list[tuple[int, int]] = field(default_factory=list)
    requests: int = 0
    decoder: MessageDecoder | None = field(default=None, repr=False)
    _digest: "hashlib._Hash" = field(default_factory=hashlib.sha256, repr=False)

    @property
    def sha256(self) -> str:
        return self._digest.hexdigest()

    def as_json(self) -> dict:
        return {
            "received": self.received,
            "bytes": self.bytes,
            "messages": self.messages,
            "by_type": dict(sorted(self.by_type.items())),
            "not_decoded": dict(sorted(self.not_decoded.items())),
            "heartbeats": self.heartbeats,
            "end_of_session": self.end_of_session,
            "gaps": self.gaps,
            "missing_messages": self.missing_messages,
            "duplicates": self.duplicates,
            "malformed": self.malformed,
            "sessions": dict(sorted(self.sessions.items())),
            "first_seq": self.first_seq,
            "last_seq": self.last_seq,
            "seconds": self.seconds,
            "sha256": self.sha256,
            "recovered": self.recovered,
            "lost": [list(r) for r in self.lost],
            "requests": self.requests,
        }

    def add_datagram(self, data: builtins.bytes, keep: bool = False, save=None, messages: bool = True) -> bool:
        """Count one datagram (its messages too unless ``messages`` is False: the recovering
        receiver counts them as it delivers them, :meth:`add_delivered`); True when it is an
        end-of-session packet."""
        self.received += 1
        self.bytes += len(data)
        self._digest.update(len(data).to_bytes(4, "big"))
        self._digest.update(data)
        try:
            packet = decode_packet(data)
        except SubcError:
            self.malformed += 1
            return False
        n = len(packet.messages)
        expected = self.sessions.get(packet.session)
        if expected is None or packet.seq == expected:
            self.sessions[packet.session] = packet.seq + n
        elif packet.seq > expected:
            self.gaps += 1
            self.missing_messages += packet.seq - expected
            self.sessions[packet.session] = packet.seq + n
        else:
            self.duplicates += 1
            self.sessions[packet.session] = max(expected, packet.seq + n)
        if n:
            last = packet.seq + n - 1
            self.first_seq = packet.seq if self.first_seq is None else min(self.first_seq, packet.seq)
            self.last_seq = last if self.last_seq is None else max(self.last_seq, last)
        if messages:
            for msg in packet.messages:
                self._count_message(msg, packet.session_bytes, packet.seq, n, keep, save)
        self.heartbeats += packet.is_heartbeat
        self.end_of_session = self.end_of_session or packet.is_end_of_session
        return packet.is_end_of_session

    def _count_message(self, msg: builtins.bytes, session: builtins.bytes, seq: int, n: int, keep: bool, save) -> None:
        if save is not None:
            save.write(len(msg).to_bytes(2, "big") + msg)
        self.messages += 1
        if self.decoder is not None:
            d = self.decoder.decode(msg, session, seq, n)
            self.by_type[self.decoder.types.label(d.type_key) or "?"] += 1
            if not d.classified:
                self.not_decoded[d.status] += 1
        else:
            self.by_type[msg[:1].decode("latin-1")] += 1
        if keep:
            self.kept.append(msg)

    def add_delivered(
        self, delivered: list[tuple[int, builtins.bytes]], session: builtins.bytes, keep: bool = False, save=None
    ) -> None:
        """Count the messages a recovering receiver delivered ((sequence number, message), in order)."""
        for seq, msg in delivered:
            self._count_message(msg, session, seq, 1, keep, save)


def _open_socket(bind: tuple[str, int]) -> socket.socket:
    try:
        family, _, _, _, addr = socket.getaddrinfo(
            bind[0] or None, bind[1], type=socket.SOCK_DGRAM, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, socket.SOCK_DGRAM)
    except OSError as e:
        raise SubcError(f"cannot listen on {bind[0]}:{bind[1]}: {e}") from e
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF)
        if sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) < RCVBUF and hasattr(socket, "SO_RCVBUFFORCE"):
            try:  # above net.core.rmem_max: allowed with CAP_NET_ADMIN only
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUFFORCE, RCVBUF)
            except OSError:
                pass
        sock.bind(addr)
    except OSError as e:
        sock.close()
        raise SubcError(f"cannot listen on {bind[0]}:{bind[1]}: {e}") from e
    return sock


def _servers(recover) -> list[tuple[str, int]]:
    """``listen``'s ``recover``, one (host, port) or several, as a list."""
    return [recover] if isinstance(recover[0], str) else [tuple(a) for a in recover]


def _sender(sock: socket.socket, addr: tuple[str, int]) -> Callable[[bytes], object]:
    """A function that sends a packet from ``sock`` to ``addr``."""
    return lambda p: sock.sendto(p, addr)


def listen(
    bind: tuple[str, int],
    count: int | None = None,
    timeout: float | None = None,
    on_ready: Callable[[], object] | None = None,
    keep: bool = False,
    save: str | None = None,
    save_pcap: str | None = None,
    decoder=None,
    recover: tuple[str, int] | Sequence[tuple[str, int]] | None = None,
    recover_timeout: float = 0.1,
    recover_retries: int = 10,
) -> ListenStats:
    """Receive MoldUDP64 datagrams on ``bind`` = (host, UDP port) and count them (:class:`ListenStats`).

    The socket has SO_REUSEADDR and asks for an 8 MiB receive buffer; ``on_ready()`` is called
    once it is bound.  Stops after ``count`` datagrams (malformed ones included), after
    ``timeout`` seconds without a datagram (idle timeout; None: wait forever), on an
    end-of-session packet, or on KeyboardInterrupt; then returns the counts.  Datagrams that do
    not decode are counted as ``malformed``.  ``keep``: keep every message in ``kept``.  ``decoder``:
    a :class:`~.decoder.MessageDecoder` that labels and checks messages (see the module docstring).
    ``save``: write every message received to this file
    as an ITCH BinaryFILE (2-byte big-endian length, then the message).  ``save_pcap``: write every
    datagram received, malformed ones included, to this file as a pcap (:class:`UdpPcapWriter`:
    the payload unchanged, sender and receiver addresses, receive time in ns).  ``recover``: the
    (host, port) of the stream's MoldUDP64 request server, or a list of them (a cluster's
    brokers: tried in turn): gaps are re-requested from it, from the listening socket
    (:class:`~subc.recovery.receiver.RecoveringReceiver`: every ``recover_timeout`` s,
    ``recover_retries`` times per server), messages are delivered (counted, kept,
    saved) once each in sequence order, and an end of session ends the listen once every message
    before it was delivered or given up.  Raises :class:`SubcError` if the socket cannot be bound
    or a file cannot be written.
    """
    stats = ListenStats(decoder=decoder)
    files = []
    try:
        for name in (save, save_pcap):
            files.append(open(name, "wb") if name else None)  # noqa: SIM115 - closed below
    except OSError as e:
        for f in files:
            if f is not None:
                f.close()
        raise SubcError(f"cannot write {name}: {e}") from e
    try:
        sink, pcap = files[0], UdpPcapWriter(files[1]) if files[1] is not None else None
        with _open_socket(bind) as sock:
            here = sock.getsockname()[:2]
            rx = None
            servers: list[tuple[str, int]] = []
            if recover is not None:
                servers = _servers(recover)
                rx = RecoveringReceiver(
                    [_sender(sock, a) for a in servers],
                    timeout_s=recover_timeout,
                    retries=recover_retries,
                )
            sock.settimeout(timeout if rx is None else min(timeout or recover_timeout, recover_timeout))
            if on_ready is not None:
                on_ready()
            first: float | None = None
            last = 0.0  # (read once there is a first)
            idle_since = time.monotonic()
            try:
                while count is None or stats.received < count:
                    try:
                        data, sender = sock.recvfrom(65535)
                    except socket.timeout:
                        if rx is None or (timeout is not None and time.monotonic() - idle_since >= timeout):
                            break
                        stats.add_delivered(rx.tick(), rx.session_bytes or b"", keep, sink)
                        continue
                    idle_since = time.monotonic()
                    last = time.perf_counter()
                    first = last if first is None else first
                    if pcap is not None:
                        pcap.write(data, sender[:2], here, time.time_ns())
                    if rx is None:
                        if stats.add_datagram(data, keep, sink):
                            break
                        continue
                    stats.add_datagram(data, messages=False)
                    src = tuple(sender[:2])
                    server = next((k for k, a in enumerate(servers) if tuple(a) == src), None)  # a request server's
                    got = rx.packet(data, server is not None, server)
                    stats.add_delivered(got, rx.session_bytes or b"", keep, sink)
                    stats.add_delivered(rx.tick(), rx.session_bytes or b"", keep, sink)
                    if rx.ended and rx.complete:
                        break
            except KeyboardInterrupt:
                pass
            stats.seconds = (last - first) if first is not None else 0.0
            if rx is not None:
                stats.recovered, stats.lost, stats.requests = rx.recovered, list(rx.lost), rx.requests
    except OSError as e:
        raise SubcError(f"listening on {bind[0]}:{bind[1]}: {e}") from e
    finally:
        for f in files:
            if f is not None:
                f.close()
    return stats
