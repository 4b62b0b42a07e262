"""Benchmark: topic fan-out, ``subc serve`` against Mosquitto, same machine, one run.

Three network namespaces made here and removed afterwards: ``tfpub`` (the publisher,
10.78.0.1), ``tfbrk`` (the broker: 10.78.0.2 towards the publisher on veth ``tfb0``, 10.78.1.1
towards the subscribers on ``tfb1``), ``tfsub`` (the subscribers, 10.78.1.2).  For 1, 8 and 32
subscribers, each subscribed to ``market/#``, the publisher sends ``--messages`` messages of a
``--payload``-byte payload on topic ``market/nasdaq/AAPL`` as fast as it can, and every message
must reach every subscriber:

* **subc**: ``subc serve --spec examples/topics/spec.p4`` on ``tfb0``; subscribers are UDP sockets
  that send ``SUB market/#`` and receive MoldUDP64 datagrams built by the XDP/TC data path; the
  publisher (:class:`subc.traffic.topic_client.Publisher`) REGISTERs the topic, then sends
  pre-built datagrams of as many messages as fit 1,400 bytes.
* **Mosquitto** (Debian's ``mosquitto`` 2.0): MQTT 3.1.1 over TCP, QoS 0; each subscriber is a
  TCP connection SUBSCRIBEd to ``market/#`` (SUBACK received before the publisher starts); the
  publisher writes the PUBLISH frames as many to a write as subc packs into a datagram.  Both
  systems' clients are minimal Python loops that count frames, so that neither is limited by
  its clients more than the other.

Delivered messages per second = messages received by all subscribers / (last receipt - first
send).  Also reported: the publisher's send rate and the loss (UDP may drop under overload; MQTT
over TCP pushes back instead).  Run as root: ``python3 bench/topic_fanout.py [--subscribers
1,8,32] [--messages 200000] [--payload 64]``; prints one JSON object per (system, subscribers).
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "examples" / "topics" / "spec.p4"
SUBC = [sys.executable, "-m", "subc.cli"]
PUB, BRK, SUB = "tfpub", "tfbrk", "tfsub"
PUB_IP, BRK_PUB_IP, BRK_SUB_IP, SUB_IP = "10.78.0.1", "10.78.0.2", "10.78.1.1", "10.78.1.2"
SERVE_PORT, FEED_PORT, MQTT_PORT = 7000, 9300, 1883
TOPIC, FILTER = "market/nasdaq/AAPL", "market/#"
IDLE = 3.0  # s without data after which a receiver stops counting


def sh(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(list(args), capture_output=True, text=True)
    if check and r.returncode:
        raise SystemExit(f"{' '.join(args)}: {r.stderr.strip()}")
    return r


def in_ns(ns: str, *args: str) -> list[str]:
    return ["nsenter", f"--net=/run/netns/{ns}", *args]


def setup() -> None:
    teardown()
    for ns in (PUB, BRK, SUB):
        sh("ip", "netns", "add", ns)
        sh("ip", "-n", ns, "link", "set", "lo", "up")
    sh("ip", "link", "add", "tfp0", "netns", PUB, "type", "veth", "peer", "name", "tfb0", "netns", BRK)
    sh("ip", "link", "add", "tfb1", "netns", BRK, "type", "veth", "peer", "name", "tfs1", "netns", SUB)
    for ns, dev, ip in ((PUB, "tfp0", PUB_IP), (BRK, "tfb0", BRK_PUB_IP), (BRK, "tfb1", BRK_SUB_IP),
                        (SUB, "tfs1", SUB_IP)):
        sh("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", dev)
        sh("ip", "-n", ns, "link", "set", dev, "up")
    sh(*in_ns(PUB, "ethtool", "-K", "tfp0", "tx", "off"))  # publishers on veth: no tx checksum offload
    sh(*in_ns(SUB, "ethtool", "-K", "tfs1", "gro", "on"))  # XDP-redirected frames reach a peer with GRO on


def teardown() -> None:
    sh(*in_ns(BRK, *SUBC, "unload", "--iface", "tfb0"), check=False)
    for ns in (PUB, BRK, SUB):
        sh("ip", "netns", "del", ns, check=False)


# -- roles run inside the namespaces ------------------------------------------------------------

def out(doc) -> None:
    sys.stdout.write(json.dumps(doc) + "\n")
    sys.stdout.flush()


def subc_receiver(n: int, expected: int) -> None:
    """n UDP sockets, each SUB market/# (with the broker's cookie exchange,
    :class:`subc.traffic.topic_client.Control`); counts MoldUDP64 messages (the header's count)."""
    from subc.traffic.topic_client import Control

    socks = []
    sel = selectors.DefaultSelector()
    for i in range(n):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.setsockopt(socket.SOL_SOCKET, 33, 64 << 20)  # SO_RCVBUFFORCE
        s.bind((SUB_IP, 20000 + i))
        reply = Control((BRK_SUB_IP, SERVE_PORT), s).ask(f"SUB {FILTER}", timeout=10, retries=1)
        assert reply.startswith("SUBACK"), reply
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ)
        socks.append(s)
    out({"ready": True})
    got, first, last = 0, None, None
    while got < expected:
        events = sel.select(timeout=IDLE if first is not None else 120)
        if not events:
            break
        for key, _ in events:
            s = key.fileobj
            while True:
                try:
                    data = s.recv(65536)
                except BlockingIOError:
                    break
                c = int.from_bytes(data[18:20], "big")
                if c in (0, 0xFFFF):
                    continue  # heartbeat, end of session
                got += c
                last = time.monotonic()
                first = first or last
    out({"received": got, "last": last})


def subc_publisher(messages: int, payload: int) -> None:
    from subc.spec.front_end import load_spec
    from subc.traffic.topic_client import MAX_DATAGRAM, MOLD_HEADER, Publisher, mold_datagram

    pub = Publisher(load_spec(SPEC), (BRK_PUB_IP, SERVE_PORT), (BRK_PUB_IP, FEED_PORT), source=(PUB_IP, 0))
    labels = pub.register(TOPIC)
    msg = pub.codec.encode(TOPIC, labels, b"x" * payload)
    per = (MAX_DATAGRAM - MOLD_HEADER) // (len(msg) + 2)
    dgrams, seq, left = [], 1, messages
    while left:
        k = min(per, left)
        dgrams.append(mold_datagram(b"subc-bench", seq, [msg] * k))
        seq += k
        left -= k
    sock, dest = pub.sock, pub.feed
    t0 = time.monotonic()
    for d in dgrams:
        while True:
            try:
                sock.sendto(d, dest)
                break
            except BlockingIOError:  # pragma: no cover - a full socket buffer: retry
                continue
    t1 = time.monotonic()
    out({"t0": t0, "t1": t1, "datagrams": len(dgrams), "message_bytes": len(msg), "per_datagram": per})


def _mqtt_string(b: bytes) -> bytes:
    return len(b).to_bytes(2, "big") + b


def _mqtt_packet(kind: int, body: bytes) -> bytes:
    """An MQTT 3.1.1 control packet: fixed header (type and flags, remaining length as a
    variable byte integer, section 2.2.3), then ``body``."""
    n, rl = len(body), bytearray()
    while True:
        n, d = divmod(n, 128)
        rl.append(d | (0x80 if n else 0))
        if not n:
            break
    return bytes([kind]) + bytes(rl) + body


def mqtt_connect(client_id: str, dest: tuple[str, int]) -> socket.socket:
    """A TCP connection with CONNECT (3.1: protocol 'MQTT' level 4, clean session, keep alive
    600 s) acknowledged by CONNACK (3.2)."""
    s = socket.create_connection(dest, timeout=30)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.sendall(_mqtt_packet(0x10, _mqtt_string(b"MQTT") + bytes([4, 0x02]) + (600).to_bytes(2, "big")
                           + _mqtt_string(client_id.encode())))
    ack = s.recv(4)
    assert ack[:1] == b"\x20" and ack[3:4] == b"\x00", ack
    return s


def mqtt_publish_frame(topic: str, payload: bytes) -> bytes:
    """PUBLISH, QoS 0 (3.3): topic name, payload."""
    return _mqtt_packet(0x30, _mqtt_string(topic.encode()) + payload)


def mqtt_receiver(n: int, expected: int, payload: int) -> None:
    """n MQTT connections, each SUBSCRIBEd to market/# (QoS 0) and acknowledged (SUBACK, 3.9);
    counts the PUBLISH frames of the benchmark's size.  The frames are counted here rather than by
    ``mosquitto_sub`` (which writes every message to its output) or paho-mqtt (a callback per
    message) so that the receivers, not the broker, are not what is measured."""
    frame = len(mqtt_publish_frame(TOPIC, b"x" * payload))
    sel = selectors.DefaultSelector()
    for i in range(n):
        s = mqtt_connect(f"bench-sub-{i}", (BRK_SUB_IP, MQTT_PORT))
        s.sendall(_mqtt_packet(0x82, (1).to_bytes(2, "big") + _mqtt_string(FILTER.encode()) + b"\x00"))
        ack = s.recv(5)
        assert ack[:1] == b"\x90" and ack[4:5] == b"\x00", ack
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ, bytearray())
    out({"ready": True})
    got, first, last = 0, None, None
    while got < expected:
        events = sel.select(timeout=IDLE if first is not None else 120)
        if not events:
            break
        for key, _ in events:
            buf = key.data
            try:
                data = key.fileobj.recv(1 << 20)
            except BlockingIOError:
                continue
            if not data:
                sel.unregister(key.fileobj)
                continue
            buf += data
            i, m = 0, len(buf)
            while i + 2 <= m:  # frames: type byte, remaining length (1 to 4 bytes), body
                j, n_, mult = i + 1, 0, 1
                while j < m:
                    b = buf[j]
                    n_ += (b & 0x7F) * mult
                    mult *= 128
                    j += 1
                    if b < 0x80:
                        break
                else:
                    break
                if j + n_ > m:
                    break
                if buf[i] & 0xF0 == 0x30 and j + n_ - i == frame:
                    got += 1
                i = j + n_
            del buf[:i]
            last = time.monotonic()
            first = first or last
    out({"received": got, "last": last})


def mqtt_publisher(messages: int, payload: int, per_write: int) -> None:
    """One MQTT connection sending the PUBLISH frames ``per_write`` to a write (as subc's
    publisher packs messages into a datagram), then DISCONNECT (3.14)."""
    s = mqtt_connect("bench-pub", (BRK_PUB_IP, MQTT_PORT))
    chunk = mqtt_publish_frame(TOPIC, b"x" * payload) * per_write
    writes, rest = divmod(messages, per_write)
    t0 = time.monotonic()
    for _ in range(writes):
        s.sendall(chunk)
    if rest:
        s.sendall(mqtt_publish_frame(TOPIC, b"x" * payload) * rest)
    t1 = time.monotonic()
    s.sendall(_mqtt_packet(0xE0, b""))
    s.close()
    out({"t0": t0, "t1": t1})


# -- the driver --------------------------------------------------------------------------------

def role(ns: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen(in_ns(ns, sys.executable, __file__, "--role", *args), stdout=subprocess.PIPE, text=True,
                            cwd=ROOT)


def read(p: subprocess.Popen, key: str) -> dict:
    while True:
        line = p.stdout.readline()
        if not line:
            raise SystemExit(f"a bench role exited ({p.wait()}) before giving {key}")
        doc = json.loads(line)
        if key in doc:
            return doc


def result(system: str, n: int, messages: int, pub: dict, rec: dict, extra: dict) -> dict:
    want = n * messages
    span = (rec["last"] - pub["t0"]) if rec["last"] else float("nan")
    return {"system": system, "subscribers": n, "messages": messages, "delivered": rec["received"],
            "loss": round(1 - rec["received"] / want, 6), "delivered_per_s": round(rec["received"] / span),
            "publish_per_s": round(messages / (pub["t1"] - pub["t0"])), **extra}


def run_subc(n: int, messages: int, payload: int) -> dict:
    d = subprocess.Popen(in_ns(BRK, *SUBC, "serve", "--spec", str(SPEC), "--iface", "tfb0", "--listen",
                               f"0.0.0.0:{SERVE_PORT}", "--capacity", "1000", "--log-level", "warning"),
                         stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        while not d.stderr.readline().startswith("serving on"):
            if d.poll() is not None:
                raise SystemExit("subc serve exited")
        rec = role(SUB, "subc-recv", str(n), str(n * messages))
        read(rec, "ready")
        pub = role(PUB, "subc-pub", str(messages), str(payload))
        p = read(pub, "t0")
        r = read(rec, "received")
        return result("subc", n, messages, p, r, {"transport": "UDP, MoldUDP64", "message_bytes": p["message_bytes"],
                                                   "messages_per_datagram": p["per_datagram"]})
    finally:
        d.terminate()
        d.wait(timeout=30)
        sh(*in_ns(BRK, *SUBC, "unload", "--iface", "tfb0"), check=False)


def run_mqtt(n: int, messages: int, payload: int, per_write: int, tmp: Path) -> dict:
    conf = tmp / "mosquitto.conf"
    conf.write_text(f"listener {MQTT_PORT} 0.0.0.0\nallow_anonymous true\npersistence false\nlog_dest none\n")
    broker = subprocess.Popen(in_ns(BRK, "mosquitto", "-c", str(conf)), stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):  # the broker's listener is up once a connection succeeds
            if sh(*in_ns(SUB, "mosquitto_sub", "-h", BRK_SUB_IP, "-t", "probe", "-E"), check=False).returncode == 0:
                break
            time.sleep(0.1)
        rec = role(SUB, "mqtt-recv", str(n), str(n * messages), str(payload))
        read(rec, "ready")
        pub = role(PUB, "mqtt-pub", str(messages), str(payload), str(per_write))
        p = read(pub, "t0")
        r = read(rec, "received")
        version = sh("mosquitto", "-h", check=False).stdout.split("\n")[0]
        return result("mosquitto", n, messages, p, r, {"transport": "TCP, MQTT 3.1.1 QoS 0", "version": version,
                                                        "messages_per_write": per_write})
    finally:
        broker.terminate()
        broker.wait(timeout=30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--role", nargs="+")
    ap.add_argument("--subscribers", default="1,8,32")
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--payload", type=int, default=64)
    a = ap.parse_args()
    if a.role:
        kind, *args = a.role
        {"subc-recv": lambda: subc_receiver(int(args[0]), int(args[1])),
         "subc-pub": lambda: subc_publisher(int(args[0]), int(args[1])),
         "mqtt-recv": lambda: mqtt_receiver(int(args[0]), int(args[1]), int(args[2])),
         "mqtt-pub": lambda: mqtt_publisher(int(args[0]), int(args[1]), int(args[2]))}[kind]()
        return
    if os.geteuid() != 0 or not shutil.which("mosquitto"):
        raise SystemExit("run as root, with Debian's mosquitto and mosquitto-clients installed")
    setup()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for n in [int(x) for x in a.subscribers.split(",")]:
                r = run_subc(n, a.messages, a.payload)
                print(json.dumps(r), flush=True)
                print(json.dumps(run_mqtt(n, a.messages, a.payload, r["messages_per_datagram"], Path(tmp))),
                      flush=True)
    finally:
        teardown()


if __name__ == "__main__":
    main()
