"""Benchmark: topic fan-out, ``subc serve`` against Mosquitto, same machine, one run.

Three network namespaces made here and removed afterwards: ``tfpub`` (the publisher,
10.78.0.1), ``tfbrk`` (the broker: 10.78.0.2 towards the publisher on veth ``tfb0``, 10.78.1.1
towards the subscribers on ``tfb1``), ``tfsub`` (the subscribers, 10.78.1.2).  For 1, 8 and 32
subscribers, each subscribed to ``market/#``, the publisher sends ``--messages`` messages of a
``--payload``-byte payload on topic ``market/nasdaq/AAPL`` as fast as it can, and every message
must reach every subscriber:

* **subc**: ``subc serve --spec examples/topics/spec.p4`` on ``tfb0``; subscribers are UDP sockets
  that send ``SUB market/#`` and receive MoldUDP64 datagrams built by the XDP/TC data path; the
  publisher (:class:`subc.runtime.topic_client.Publisher`) REGISTERs the topic, then sends
  pre-built datagrams of as many messages as fit 1,400 bytes.
* **Mosquitto** (Debian's ``mosquitto`` 2.0, ``mosquitto-clients``): MQTT 3.1.1 over TCP, QoS 0;
  subscribers are ``mosquitto_sub -t market/#`` processes, the publisher ``mosquitto_pub -l``
  (one message per input line).

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
    """n UDP sockets, each SUB market/#; counts MoldUDP64 messages (the header's count)."""
    socks = []
    sel = selectors.DefaultSelector()
    for i in range(n):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.setsockopt(socket.SOL_SOCKET, 33, 64 << 20)  # SO_RCVBUFFORCE
        s.bind((SUB_IP, 20000 + i))
        s.settimeout(10)
        s.sendto(f"SUB {FILTER}\n".encode(), (BRK_SUB_IP, SERVE_PORT))
        reply = s.recv(4096).decode()
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
    from subc.compiler.spec import load_spec
    from subc.runtime.topic_client import MAX_DATAGRAM, MOLD_HEADER, Publisher, mold_datagram

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


def mqtt_receiver(n: int, expected: int) -> None:
    """n mosquitto_sub processes; counts payload lines ('W' lines are the warm-up's)."""
    procs = [subprocess.Popen(["mosquitto_sub", "-h", BRK_SUB_IP, "-p", str(MQTT_PORT), "-t", FILTER, "-q", "0"],
                              stdout=subprocess.PIPE) for _ in range(n)]
    sel = selectors.DefaultSelector()
    for p in procs:
        os.set_blocking(p.stdout.fileno(), False)
        sel.register(p.stdout, selectors.EVENT_READ, p)
    warm = {id(p): 0 for p in procs}
    lines, first, last, ready = 0, None, None, False
    while True:
        events = sel.select(timeout=IDLE if first is not None else 120)
        if not events:
            break
        for key, _ in events:
            data = os.read(key.fileobj.fileno(), 1 << 20)
            if not data:
                sel.unregister(key.fileobj)
                continue
            w = data.count(b"W\n")
            warm[id(key.data)] += w
            k = data.count(b"\n") - w
            if k:
                lines += k
                last = time.monotonic()
                first = first or last
        if not ready and all(warm.values()):
            ready = True
            out({"ready": True})
        if lines >= expected:
            break
    for p in procs:
        p.terminate()
    out({"received": lines, "last": last})


def mqtt_publisher(messages: int, payload: int, path: str) -> None:
    with open(path, "rb") as f:
        t0 = time.monotonic()
        subprocess.run(["mosquitto_pub", "-h", BRK_PUB_IP, "-p", str(MQTT_PORT), "-t", TOPIC, "-q", "0", "-l"],
                       stdin=f, check=True)
        t1 = time.monotonic()
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


def run_mqtt(n: int, messages: int, payload: int, tmp: Path) -> dict:
    conf = tmp / "mosquitto.conf"
    conf.write_text(f"listener {MQTT_PORT} 0.0.0.0\nallow_anonymous true\npersistence false\n"
                    "log_dest none\nmax_queued_messages 0\n")
    lines = tmp / "payload.txt"
    lines.write_bytes((b"x" * payload + b"\n") * messages)
    broker = subprocess.Popen(in_ns(BRK, "mosquitto", "-c", str(conf)), stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.5)  # the broker's listener (a benchmark, not a test: no verdict depends on it)
        rec = role(SUB, "mqtt-recv", str(n), str(n * messages))
        while True:  # warm-up messages until every subscriber has one (its SUBSCRIBE is in)
            sh(*in_ns(PUB, "mosquitto_pub", "-h", BRK_PUB_IP, "-p", str(MQTT_PORT), "-t", TOPIC, "-m", "W"))
            line = None
            sel = selectors.DefaultSelector()
            sel.register(rec.stdout, selectors.EVENT_READ)
            if sel.select(timeout=0.2):
                line = rec.stdout.readline()
            sel.close()
            if line and "ready" in line:
                break
        pub = role(PUB, "mqtt-pub", str(messages), str(payload), str(lines))
        p = read(pub, "t0")
        r = read(rec, "received")
        return result("mosquitto", n, messages, p, r, {"transport": "TCP, MQTT 3.1.1 QoS 0",
                                                        "version": sh("mosquitto", "-h", check=False).stdout.split("\n")[0]})
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
         "mqtt-recv": lambda: mqtt_receiver(int(args[0]), int(args[1])),
         "mqtt-pub": lambda: mqtt_publisher(int(args[0]), int(args[1]), args[2])}[kind]()
        return
    if os.geteuid() != 0 or not shutil.which("mosquitto"):
        raise SystemExit("run as root, with Debian's mosquitto and mosquitto-clients installed")
    setup()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for n in [int(x) for x in a.subscribers.split(",")]:
                print(json.dumps(run_subc(n, a.messages, a.payload)), flush=True)
                print(json.dumps(run_mqtt(n, a.messages, a.payload, Path(tmp))), flush=True)
    finally:
        teardown()


if __name__ == "__main__":
    main()
