"""What a cluster of ``subc serve`` brokers keeps in etcd, under one key prefix (README, "Brokers
on several hosts"):

========================  ==========================================================  =========
key (after the prefix)    value (JSON unless said)                                    lease
========================  ==========================================================  =========
``sub/<id>``              a subscription (:class:`SubRecord`); ``<id>`` zero-padded   none
``meta/next_id``          the next subscription id (decimal)                          none
``meta/position``         the feed position the latest change takes effect at         none
``meta/next_label``       the next topic label never given (decimal)                  none
``label/<name>``          a topic level name's label (decimal), while anything uses it  none
``reg/<source>/<topic>``  a publisher's registration of a topic (:class:`RegRecord`)  none
``member/<node>``         a live broker (:class:`MemberRecord`)                       the node's
``ack/<node>``            the member-set revision whose hand-over the node completed  the node's
``status/<node>``         what the node applied, owns and counts (:class:`NodeStatus`)  the node's
========================  ==========================================================  =========

A subscription's id is given by the transaction that creates it (compare on ``meta/next_id``'s
revision), so ids are unique in the cluster.  Topic labels likewise (compare on
``meta/next_label``), and never reused: a transaction that references a label (a ``SUB`` filter's
or a ``REGISTER``'s levels) compares the label key's create revision and rewrites it (so its mod
revision moves), and a label is forgotten by a transaction that compares the mod revision its
writer saw with nothing referencing it: a reference made meanwhile fails the forget, and a forget
made meanwhile fails the reference, which then takes a new label.  Subscriber numbers are not kept here: a number is a
slot of one broker's BPF maps; what names a stream on every broker is its endpoint (``ip:port`` or
``soup:<user>``) and its sequence numbers.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from ..errors import SubcError

DEFAULT_PREFIX = "/subc/"
ID_DIGITS = 16


def sub_key(prefix: str, sub_id: int) -> str:
    """Subscription ``sub_id``'s key under ``prefix`` (zero-padded: key order is id order)."""
    return f"{prefix}sub/{sub_id:0{ID_DIGITS}d}"


def next_id_key(prefix: str) -> str:
    """The key of the next subscription id (under ``prefix``)."""
    return f"{prefix}meta/next_id"


def position_key(prefix: str) -> str:
    """The key of the latest change's feed position (under ``prefix``)."""
    return f"{prefix}meta/position"


def next_label_key(prefix: str) -> str:
    """The key of the next topic label (under ``prefix``)."""
    return f"{prefix}meta/next_label"


def label_key(prefix: str, name: str) -> str:
    """Topic level ``name``'s label key under ``prefix`` (level names hold no '/')."""
    return f"{prefix}label/{name}"


def reg_key(prefix: str, source: str, topic: str) -> str:
    """The key of ``source``'s (an IP address: no '/') registration of ``topic`` under ``prefix``."""
    return f"{prefix}reg/{source}/{topic}"


def member_key(prefix: str, node: str) -> str:
    """Broker ``node``'s membership key under ``prefix`` (written under its lease)."""
    return f"{prefix}member/{node}"


def ack_key(prefix: str, node: str) -> str:
    """The key of the member set ``node`` acknowledged (under ``prefix``)."""
    return f"{prefix}ack/{node}"


def status_key(prefix: str, node: str) -> str:
    """Broker ``node``'s status key under ``prefix``."""
    return f"{prefix}status/{node}"


def check_node_name(node: str) -> str:
    """``node`` if it is a valid node name (1-64 of ``[A-Za-z0-9._-]``); raises SubcError."""
    if not (1 <= len(node) <= 64) or not all(c.isalnum() or c in "._-" for c in node):
        raise SubcError(f"node name {node!r}: 1 to 64 letters, digits, '.', '_' or '-'")
    return node


def check_prefix(prefix: str) -> str:
    """``prefix`` if it is a valid key prefix (starts and ends with '/'); raises SubcError."""
    if not prefix.startswith("/") or not prefix.endswith("/") or len(prefix) > 200:
        raise SubcError(f"cluster key prefix {prefix!r}: must start and end with '/'")
    return prefix


@dataclass(frozen=True)
class SubRecord:
    """A subscription as etcd keeps it: condition ``text`` (a topic subscription's WHERE part),
    endpoint ``ip``:``port`` (``soup:<user>``, port 0: a SoupBinTCP user's stream), the request's
    ``source`` address, lease ``expires`` (Unix s, None: none), topic ``filter`` (None: not a topic
    subscription)."""

    text: str
    ip: str
    port: int
    source: str
    expires: float | None = None
    filter: str | None = None

    @property
    def ep(self) -> tuple[str, int]:
        """The endpoint (ip, port)."""
        return (self.ip, self.port)

    def encode(self) -> bytes:
        """The record as compact JSON (UTF-8)."""
        return json.dumps(asdict(self), separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes) -> "SubRecord":
        """The record in JSON ``data``; raises ValueError, KeyError or TypeError when malformed."""
        d = json.loads(data)
        return cls(d["text"], d["ip"], int(d["port"]), d["source"], d.get("expires"), d.get("filter"))


@dataclass(frozen=True)
class RegRecord:
    """A publisher's registration of a topic: its lease ``expires`` (Unix s, None: none).  The
    topic and the source are in the key (:func:`reg_key`)."""

    expires: float | None = None

    def encode(self) -> bytes:
        """The record as compact JSON (UTF-8)."""
        return json.dumps(asdict(self), separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes) -> "RegRecord":
        """The record in JSON ``data``; raises ValueError, KeyError or TypeError when malformed."""
        d = json.loads(data)
        exp = d["expires"]
        return cls(None if exp is None else float(exp))


@dataclass(frozen=True)
class MemberRecord:
    """A live broker: its ``node`` name, request address ``listen`` (ip:port), re-request server
    and SoupBinTCP addresses (or ''), and when it started (Unix s)."""

    node: str
    listen: str
    rerequest: str = ""
    soup: str = ""
    started: float = 0.0

    def encode(self) -> bytes:
        """The record as compact JSON (UTF-8)."""
        return json.dumps(asdict(self), separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes) -> "MemberRecord":
        """The record in JSON ``data``; raises ValueError, KeyError or TypeError when malformed."""
        d = json.loads(data)
        return cls(d["node"], d.get("listen", ""), d.get("rerequest", ""), d.get("soup", ""), d.get("started", 0.0))


@dataclass(frozen=True)
class NodeStatus:
    """A broker's report, rewritten about once a second: the revision it has ``applied``, its
    live ``subscriptions``, the endpoints it ``owns`` and delivers to, whether it is ``fenced``
    (cut off: it neither delivers nor acknowledges), the ``time`` written (Unix s)."""

    applied: int
    subscriptions: int
    owns: int
    endpoints: int
    fenced: bool
    time: float

    def encode(self) -> bytes:
        """The record as compact JSON (UTF-8)."""
        return json.dumps(asdict(self), separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes) -> "NodeStatus":
        """The record in JSON ``data``; raises ValueError, KeyError or TypeError when malformed."""
        d = json.loads(data)
        return cls(
            int(d["applied"]),
            int(d["subscriptions"]),
            int(d["owns"]),
            int(d.get("endpoints", 0)),
            bool(d["fenced"]),
            float(d["time"]),
        )
