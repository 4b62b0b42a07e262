"""A small client of ``subc serve``'s topics: publishers label and send, subscribers subscribe and
receive (``subc publish``, ``subc subscribe``; docs/serve.md, "Live subscriptions").

A topic message is built from the spec alone: :class:`~.encoder.MessageEncoder` writes the level
count, each level's label (from ``REGISTER`` -> ``REGACK``) and the priority into the fields that
``@pragma query_topic`` names, on the parser path to them; its payload (``@pragma query_payload``)
is, by this client's convention, a 2-byte big-endian length of the topic name, the name (UTF-8),
then the application's bytes, so a subscriber receives every message with its topic (as
Fastpuss's ``MSG <topic> <payload>``).  Messages go as MoldUDP64 datagrams (MoldUDP64 Protocol
Specification v1.00: 10-byte session, 8-byte sequence number of the first message, 2-byte message
count, then 2-byte length-prefixed blocks) to the feed address, the spec's UDP port on the
broker's interface.

Requests go over UDP with the broker's address proof (docs/serve.md, "Address proof"):
:class:`Control` appends the cookie the broker gave the socket's address to every request, sends a
request again with the cookie of a ``COOKIE <hex>`` reply, and pads a request sent without a
cookie to :data:`MIN_REQUEST` bytes (the broker answers an unproven request only with a reply no
larger than it).
"""

from __future__ import annotations

import socket
import struct
import time
from dataclasses import dataclass

from ..spec.model import Spec
from ..errors import SubcError
from ..wire.decoder import DECODED, MessageDecoder
from ..wire.encoder import MessageEncoder

MOLD_HEADER = 20  # bytes
MAX_DATAGRAM = 1400  # bytes of UDP payload a publisher packs messages into


@dataclass
class TopicMessage:
    """A received message: ``topic`` (name), ``payload`` (bytes), ``seq`` (the subscriber's
    MoldUDP64 sequence number of it), ``labels`` (of its levels), ``values`` (the message's other
    query fields, raw)."""

    topic: str
    payload: bytes
    seq: int
    labels: tuple[int, ...]
    values: dict


MIN_REQUEST = 24  # bytes: the broker's "COOKIE <16 hex digits>\n" reply to an unproven request


class Control:
    """Requests to ``broker`` ((ip, port)) over UDP from ``sock``, with the broker's address proof
    (the module docstring); ``cookie``: the last cookie the broker gave (hex), or None."""

    def __init__(self, broker: tuple[str, int], sock: socket.socket):
        self.broker, self.sock = broker, sock
        self.cookie: str | None = None

    def send(self, line: str) -> str | None:
        """Send ``line`` (with the cookie, else padded); returns the cookie it carried."""
        cookie = self.cookie
        data = f"{line} COOKIE {cookie}" if cookie else line.ljust(MIN_REQUEST - 1)
        self.sock.sendto(data.encode() + b"\n", self.broker)
        return cookie

    def ask(self, line: str, timeout: float = 2.0, retries: int = 3, other=None) -> str:
        """Send ``line`` and return the first reply line that is not a new cookie (after one, the
        request goes again with it); ``other(data)`` gets the datagrams from elsewhere (else they
        are skipped).  Raises SubcError after ``retries`` timeouts of ``timeout`` s."""
        resent = 0  # after new cookies: a broker that keeps sending new ones is answered by its last
        for _ in range(retries):
            used = self.send(line)
            deadline = time.monotonic() + timeout
            while (left := deadline - time.monotonic()) > 0:
                self.sock.settimeout(left)
                try:
                    data, addr = self.sock.recvfrom(65536)
                except socket.timeout:
                    break
                if addr != self.broker:
                    if other is not None:
                        other(data)
                    continue
                reply = data.decode("ascii", "replace").split("\n", 1)[0]
                words = reply.split()
                if len(words) == 2 and words[0] == "COOKIE" and words[1] != used and resent < 3:
                    resent += 1
                    self.cookie = words[1]
                    used = self.send(line)
                    deadline = time.monotonic() + timeout
                    continue
                return reply
        raise SubcError(f"no reply from the broker {self.broker[0]}:{self.broker[1]} to {line.split(' ', 1)[0]}")


def request(
    broker: tuple[str, int], line: str, sock: socket.socket | None = None, timeout: float = 2.0, retries: int = 3
) -> str:
    """Send one request ``line`` over UDP to ``broker`` (from ``sock``, else a new socket) and
    return the first reply line (datagrams from elsewhere are skipped; :class:`Control`: a cookie
    exchange first when the broker asks for one).  Raises SubcError after ``retries`` timeouts of
    ``timeout`` s."""
    own = sock is None
    s = sock or socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        return Control(broker, s).ask(line, timeout, retries)
    finally:
        if own:
            s.close()


class TopicCodec:
    """Topic messages of ``spec`` (``@pragma query_topic``): :meth:`encode` and :meth:`decode`.
    Raises SubcError when the spec has no topic fields or no parser path to them."""

    def __init__(self, spec: Spec):
        if spec.topic is None:
            raise SubcError("the spec has no topic fields (@pragma query_topic)")
        self.spec = spec
        self.topic = spec.topic
        self.decoder = MessageDecoder(spec)
        self.others = [f for f in spec.query_fields if f != self.topic.levels and f not in self.topic.labels]
        self.encoder = MessageEncoder(self.decoder)
        self._headers: dict[tuple, bytes] = {}

    def headers(self, labels: list[int], values: dict[str, int] | None = None) -> bytes:
        """The message headers for a topic of ``labels`` (one per level), with ``values`` of other
        query fields of the message headers (raw; the others are 0)."""
        key = (tuple(labels), tuple(sorted((values or {}).items())))
        h = self._headers.get(key)
        if h is None:
            vals = dict(values or {})
            vals[self.topic.levels] = len(labels)
            vals.update({f: 0 for f in self.topic.labels})
            vals.update(zip(self.topic.labels, labels))
            h = self.encoder.encode(vals)
            if h is None:
                raise SubcError("no parser path of the spec carries the topic fields")
            self._headers[key] = h
        return h

    def encode(self, topic: str, labels: list[int], payload: bytes, values: dict[str, int] | None = None) -> bytes:
        """One message (without its block length): headers, then name length, name, payload."""
        name = topic.encode()
        return self.headers(labels, values) + struct.pack("!H", len(name)) + name + payload

    def decode(self, msg: bytes, seq: int = 0) -> TopicMessage | None:
        """The message ``msg`` carries, or None when it is not a topic message."""
        d = self.decoder.decode(msg)
        if d.status != DECODED or self.topic.levels not in d.values or d.expected is None:
            return None
        rest = msg[d.expected :]
        if len(rest) < 2:
            return None
        n = struct.unpack_from("!H", rest)[0]
        name = rest[2 : 2 + n].decode("utf-8", "replace")
        k = d.values[self.topic.levels]
        labels = tuple(d.values[f] for f in self.topic.labels[:k])
        return TopicMessage(name, rest[2 + n :], seq, labels, {f: d.values[f] for f in self.others if f in d.values})


def mold_datagram(session: bytes, seq: int, messages: list[bytes]) -> bytes:
    """A MoldUDP64 datagram of ``messages`` whose first has sequence number ``seq``."""
    out = [session[:10].ljust(10, b" "), struct.pack("!QH", seq, len(messages))]
    for m in messages:
        out += [struct.pack("!H", len(m)), m]
    return b"".join(out)


class Publisher:
    """Registers topics with ``broker`` ((ip, port)) and sends their messages to ``feed`` ((ip,
    port): the spec's UDP port on the broker's interface) as MoldUDP64 datagrams of ``session``."""

    def __init__(
        self,
        spec: Spec,
        broker: tuple[str, int],
        feed: tuple[str, int],
        session: bytes = b"subc-pub",
        source: tuple[str, int] = ("0.0.0.0", 0),
    ):
        self.codec = TopicCodec(spec)
        self.broker, self.feed, self.session = broker, feed, session
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(source)
        self.control = Control(broker, self.sock)
        self.seq = 1
        self.labels: dict[str, list[int]] = {}

    def register(self, topic: str) -> list[int]:
        """REGISTER ``topic`` (also renews it); returns its labels.  Raises SubcError on ERR."""
        reply = self.control.ask(f"REGISTER {topic}")
        parts = reply.split(" ")
        if parts[0] != "REGACK" or parts[1:2] != [topic]:
            raise SubcError(f"REGISTER {topic}: {reply}")
        self.labels[topic] = [int(x) for x in parts[2:]]
        return self.labels[topic]

    def unregister(self, topic: str) -> None:
        """UNREGISTER ``topic`` (the broker forgets its names once nobody uses them)."""
        reply = self.control.ask(f"UNREGISTER {topic}")
        if reply != f"UNREGACK {topic}":
            raise SubcError(f"UNREGISTER {topic}: {reply}")
        self.labels.pop(topic, None)

    def publish(self, items: list[tuple[str, bytes]], values: dict[str, int] | None = None) -> int:
        """Send (topic, payload) ``items`` in order, with ``values`` of other header fields,
        packed into as few datagrams as fit :data:`MAX_DATAGRAM` bytes; unregistered topics are
        registered first.  Returns the datagrams sent."""
        msgs = []
        for topic, payload in items:
            labels = self.labels.get(topic) or self.register(topic)
            msgs.append(self.codec.encode(topic, labels, payload, values))
        sent, size = 0, MOLD_HEADER
        batch: list[bytes] = []
        for m in msgs:
            if batch and size + 2 + len(m) > MAX_DATAGRAM:
                sent += self._send(batch)
                batch, size = [], MOLD_HEADER
            batch.append(m)
            size += 2 + len(m)
        if batch:
            sent += self._send(batch)
        return sent

    def _send(self, batch: list[bytes]) -> int:
        self.sock.sendto(mold_datagram(self.session, self.seq, batch), self.feed)
        self.seq += len(batch)
        return 1

    def close(self) -> None:
        self.sock.close()


class Subscriber:
    """A subscriber socket bound to ``bind`` ((ip, port)): its SUB requests go to ``broker`` and
    the broker delivers to this socket."""

    def __init__(self, spec: Spec, broker: tuple[str, int], bind: tuple[str, int] = ("0.0.0.0", 0)):
        self.codec = TopicCodec(spec)
        self.broker = broker
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(bind)
        self.control = Control(broker, self.sock)
        self.queue: list[TopicMessage] = []

    def sub(self, topic_filter: str, where: str | None = None) -> int:
        """SUB ``topic_filter`` [WHERE ``where``]; returns the subscription id.  Raises SubcError
        with the broker's SUBERR."""
        line = f"SUB {topic_filter}" + (f" WHERE {where}" if where else "")
        reply = self._request(line)
        if not reply.startswith("SUBACK "):
            raise SubcError(f"{line}: {reply}")
        return int(reply.split()[1])

    def unsubscribe(self, sub_id: int) -> None:
        reply = self._request(f"UNSUBSCRIBE {sub_id}")
        if not reply.startswith("UNSUBACK"):
            raise SubcError(f"UNSUBSCRIBE {sub_id}: {reply}")

    def _request(self, line: str, timeout: float = 5.0) -> str:
        return self.control.ask(line, timeout, retries=1, other=self._datagram)

    def _datagram(self, data: bytes) -> None:
        if len(data) < MOLD_HEADER:
            return
        seq, count = struct.unpack_from("!QH", data, 10)
        off = MOLD_HEADER
        for i in range(count):
            if off + 2 > len(data):
                return
            n = struct.unpack_from("!H", data, off)[0]
            m = self.codec.decode(data[off + 2 : off + 2 + n], seq + i)
            if m is not None:
                self.queue.append(m)
            off += 2 + n

    def recv(self, timeout: float | None = None) -> TopicMessage | None:
        """The next message (None after ``timeout`` s without one)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.queue:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return None
            self.sock.settimeout(left)
            try:
                data, addr = self.sock.recvfrom(65536)
            except socket.timeout:
                return None
            if addr != self.broker:
                self._datagram(data)
        return self.queue.pop(0)

    def close(self) -> None:
        self.sock.close()
