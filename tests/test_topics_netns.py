"""End to end: topics through ``subc serve`` in network namespaces (examples/topics/spec.p4).

A publisher namespace REGISTERs topics (the labels come from REGACK) and sends topic messages
packed here with ``struct`` from the spec's layout as a reader of the spec file sees it (type
'T', priority, level count, eight 32-bit labels, then the payload: name length, name, bytes),
nothing from subc.  Subscriber agents (``serve_client.py``) send ``SUB <filter> [WHERE ...]``
and parse what arrives.  The reference is MQTT's matching on topic strings (``mqtt_matches`` of
``test_topics.py``) and the priority conditions evaluated in Python: every subscriber must get
exactly the messages one of its live filters matches, once, with gap-free sequence numbers.
Hypothesis draws the filters, conditions and messages of each round.  Then: topics with no
publisher and no subscriber are forgotten (a new REGISTER gives new labels); a killed and restarted
daemon keeps labels and topic subscriptions; ``subc publish`` and ``subc subscribe`` work.
No verdict depends on time: the test waits for replies, counters and marker messages.
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import ROOT
from netns_util import Topology, need_root_and_netns
from test_serve_netns import PORT, Agent, Broker, assert_gap_free, messages_counted, wait_until
from test_topics import mqtt_matches

SPEC_PATH = ROOT / "examples" / "topics" / "spec.p4"
FEED_PORT = 9300  # TOPIC_UDP_PORT of the spec
SESSION = b"TOPICTEST1"
TOPICS = ["market/nasdaq/AAPL", "market/nasdaq/MSFT", "market/nyse/AAPL", "market/nyse", "news/AAPL",
          "news/a/b/c", "market//AAPL", "x"]
FILTERS = ["market/#", "market/+/AAPL", "market/+", "+/AAPL", "#", "news/#", "market/nasdaq/AAPL", "+/+/+",
           "market//#", "x/#", "+", "nothing/here", "market/+/+/#"]


def topic_message(labels: list[int], prio: int, name: str, payload: bytes) -> bytes:
    """A message of examples/topics/spec.p4: msg_type 'T', topic_t (priority, levels, l0..l7),
    then the payload (name length, name, bytes)."""
    lab = (labels + [0] * 8)[:8]
    return b"T" + struct.pack(">BB8I", prio, len(labels), *lab) + struct.pack(">H", len(name)) + name.encode() + payload


def decode_message(hexmsg: str) -> tuple[str, bytes]:
    m = bytes.fromhex(hexmsg)
    n = struct.unpack_from(">H", m, 35)[0]
    return m[37:37 + n].decode(), m[37 + n:]


class World:
    def __init__(self, topo: Topology, tmp):
        self.topo = topo
        self.broker = Broker(topo, tmp, SPEC_PATH, ())
        self.broker.start()
        self.subs = {k: Agent(topo, topo.subs[k - 1], 6000 + k) for k in (1, 2, 3)}
        self.pub = Agent(topo, topo.pub, 5000)
        self.labels: dict[str, list[int]] = {}
        self.live: dict[int, tuple[int, str, int]] = {}  # id -> (subscriber, filter, priority threshold)
        self.expected: dict[int, list[str]] = {1: [], 2: [], 3: []}
        self.sent = 0
        self.seq = 1
        self.n = 0
        for k in (1, 2, 3):
            r = self.subs[k].request(f"10.10.{k}.1", f"SUB mark/{k}")
            assert r.startswith("SUBACK"), r
        for t in TOPICS + [f"mark/{k}" for k in (1, 2, 3)]:
            self.register(t)

    def register(self, topic: str) -> list[int]:
        r = self.pub.request("10.10.0.2", f"REGISTER {topic}")
        parts = r.split(" ")
        assert parts[:2] == ["REGACK", topic], r
        self.labels[topic] = [int(x) for x in parts[2:]]
        assert len(self.labels[topic]) == len(topic.split("/"))
        return self.labels[topic]

    def sub(self, k: int, f: str, thr: int) -> int:
        where = f" WHERE topic.priority > {thr}" if thr >= 0 else ""
        r = self.subs[k].request(f"10.10.{k}.1", f"SUB {f}{where}")
        assert r.startswith("SUBACK "), r
        sid = int(r.split()[1])
        self.live[sid] = (k, f, thr)
        return sid

    def unsub(self, k: int, sid: int) -> None:
        assert self.subs[k].request(f"10.10.{k}.1", f"UNSUBSCRIBE {sid}") == f"UNSUBACK {sid}"
        del self.live[sid]

    def send(self, items: list[tuple[str, int]], per_datagram: int = 3) -> None:
        msgs = []
        for topic, prio in items:
            self.n += 1
            payload = f"m{self.n}".encode()
            msgs.append(topic_message(self.labels[topic], prio, topic, payload))
            who = {k for k, f, thr in self.live.values() if mqtt_matches(f, topic) and prio > thr}
            if topic.startswith("mark/"):
                who.add(int(topic[5]))
            for k in who:
                self.expected[k].append(f"{topic} m{self.n}")
        for i in range(0, len(msgs), per_datagram):
            batch = msgs[i:i + per_datagram]
            dg = SESSION + self.seq.to_bytes(8, "big") + len(batch).to_bytes(2, "big") + b"".join(
                len(m).to_bytes(2, "big") + m for m in batch)
            self.pub.cmd(f"send 10.10.0.2 {FEED_PORT} {dg.hex()}")
            assert self.pub.next_reply("sent")
            self.seq += len(batch)
            self.sent += len(batch)

    def got(self, k: int) -> list[str]:
        a = self.subs[k]
        with a.lock:
            return [f"{t} {p.decode()}" for d in a.molds for t, p in map(decode_message, d[3])]

    def check(self) -> None:
        wait_until(lambda: messages_counted(self.topo) >= self.sent, "the broker to count every message")
        self.send([(f"mark/{k}", 0) for k in (1, 2, 3)])
        for k in (1, 2, 3):
            want = sorted(self.expected[k])
            wait_until(lambda: self.expected[k][-1] in self.got(k), f"subscriber {k}'s marker")
            assert sorted(self.got(k)) == want, f"subscriber {k}"
            assert_gap_free(self.subs[k], k)

    def close(self) -> None:
        self.broker.stop()
        for a in [*self.subs.values(), self.pub]:
            a.close()


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    need_root_and_netns()
    topo = Topology("tpt", 3)
    w = None
    try:
        w = World(topo, tmp_path_factory.mktemp("topics"))
        yield w
    finally:
        if w is not None:
            w.close()
        topo.subc(topo.brk, "unload", "--iface", topo.b0, check=False)
        topo.remove()


ROUND = st.tuples(
    st.lists(st.tuples(st.integers(1, 3), st.sampled_from(FILTERS), st.sampled_from([-1, -1, 2, 5])),
             min_size=1, max_size=6),
    st.lists(st.tuples(st.sampled_from(TOPICS), st.integers(0, 9)), min_size=1, max_size=24),
    st.integers(1, 4),
)


@settings(max_examples=8, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(rnd=ROUND)
def test_topic_subscribers_get_what_mqtt_matching_gives(world, rnd):
    subs, msgs, per = rnd
    ids = [(k, world.sub(k, f, thr)) for k, f, thr in subs]
    world.send(msgs, per)
    world.check()
    # half of them leave; the rest stay for the next messages of this round
    for k, sid in ids[::2]:
        world.unsub(k, sid)
    world.send(msgs, per)
    world.check()
    for k, sid in ids[1::2]:
        world.unsub(k, sid)


def test_unused_topics_are_forgotten_and_labels_never_reused(world):
    w = world
    old = w.labels["news/a/b/c"]
    sid = w.sub(1, "news/a/#", -1)
    assert w.pub.request("10.10.0.2", "UNREGISTER news/a/b/c") == "UNREGACK news/a/b/c"
    # 'news' and 'a' are still used by the subscription, 'b' and 'c' by nobody
    new = w.register("news/a/b/c")
    assert new[:2] == old[:2] and new[2] != old[2] and new[3] != old[3]
    w.unsub(1, sid)
    for t in ("news/a/b/c", "news/AAPL"):
        assert w.pub.request("10.10.0.2", f"UNREGISTER {t}") == f"UNREGACK {t}"
    again = w.register("news/a/b/c")
    assert not set(again) & set(new), "a forgotten name got a label back"
    w.register("news/AAPL")
    # a message with the forgotten labels reaches no subscriber of the name ("stale" is its key here:
    # MQTT matching of the filter on it is false, and so must delivery be)
    sid = w.sub(2, "news/a/b/c", -1)
    w.labels["stale"] = new
    w.send([("stale", 1), ("news/a/b/c", 1)])
    w.check()
    w.unsub(2, sid)
    w.pub.cmd(f"req 10.10.0.2 {PORT} LIST")
    lines = []
    while not lines or not lines[-1].startswith("END"):
        lines.append(w.pub.next_reply())
    regs = sorted(x.split(" ", 2)[1] for x in lines[:-1])
    assert regs == sorted(TOPICS + [f"mark/{k}" for k in (1, 2, 3)]), lines
    assert lines[-1] == f"END {len(regs)}"


def test_restart_keeps_labels_and_topic_subscriptions(world):
    w = world
    sid = w.sub(3, "market/+/AAPL", 4)
    before = {t: list(w.labels[t]) for t in TOPICS}
    w.broker.kill()
    w.send([("market/nyse/AAPL", 5), ("market/nyse/AAPL", 1)])  # the data path forwards while it is down
    w.broker.start()
    for t in TOPICS:
        assert w.register(t) == before[t], t
    w.send([("market/nasdaq/AAPL", 9), ("market/nasdaq/MSFT", 9)])
    w.check()
    w.unsub(3, sid)


def test_publish_and_subscribe_commands(world):
    topo = world.topo
    sub = topo.popen_subc(topo.subs[0], "subscribe", "--spec", str(SPEC_PATH), "--broker", f"10.10.1.1:{PORT}",
                          "--bind", "10.10.1.2:6101", "cli/+", "--where", "topic.priority > 3", "--count", "2")
    line = sub.stderr.readline()
    assert line.startswith("subscribed "), line
    for topic, payload, prio in [("cli/a", "one", 1), ("cli/b", "two", 7), ("cli/a/deep", "three", 9),
                                 ("cli/c", "four", 4)]:
        r = topo.subc(topo.pub, "publish", "--spec", str(SPEC_PATH), "--broker", f"10.10.0.2:{PORT}",
                      "--set", f"topic.priority={prio}", topic, payload)
        assert "1 messages in 1 datagrams" in r.stderr
    out, err = sub.communicate(timeout=120)
    assert sub.returncode == 0, err
    assert out.splitlines() == ["cli/b\ttwo", "cli/c\tfour"]
