"""Topics in a cluster: three ``subc serve --cluster`` brokers with examples/topics/spec.p4 on one
etcd member, in network namespaces (cluster_netns.py); the publisher feeds all three.

REGISTER, SUB and UNSUBSCRIBE go to random brokers.  Topic messages are packed here with
``struct`` (test_topics_netns.topic_message, from the spec's layout), each with the labels a
REGACK gave; what each subscriber must receive is MQTT's matching on the topic names
(test_topics.mqtt_matches) and the priority condition evaluated here, from the feed position
etcd recorded for its SUB (``meta/position``, read after the SUBACK; the brokers run three
messages ahead of the feed) to the position of its removal.  Checked:

* every broker answers REGISTER of a topic with the same labels, whichever registered it first;
  every broker's store holds etcd's subscriptions (topic filters included); each subscriber gets
  exactly what its filters accept, once, with gap-free sequence numbers, from one broker;
* ``LIST`` at any broker shows the source's registrations with their labels;
* labels that no registration and no subscription use are forgotten in etcd, and a topic
  registered again gets labels never given before;
* a broker killed with ``kill -9`` and restarted rebuilds its topic subscriptions from its store
  (nothing dropped) and its store converges again.

No verdict depends on speed: the test waits for replies, counters, stores and keys, with a hang
guard only.
"""

from __future__ import annotations

import json
import random

import pytest

from cluster_netns import N, ClusterBroker, ClusterTopology, cluster_world
from conftest import ROOT
from etcd_util import EtcdCluster
from netns_util import call_in_netns
from test_cluster_netns import Agent, wait_until
from test_serve_netns import messages_counted_in
from test_topics import mqtt_matches
from test_topics_netns import decode_message, topic_message

SPEC_PATH = ROOT / "examples" / "topics" / "spec.p4"
FEED_PORT = 9300  # TOPIC_UDP_PORT of the spec
SESSION = b"CLTOPICS01"
TOPICS = ["market/nasdaq/AAPL", "market/nasdaq/MSFT", "market/nyse/AAPL", "news/AAPL", "market//AAPL", "x"]
FILTERS = ["market/#", "market/+/AAPL", "+/AAPL", "#", "news/#", "market/nasdaq/AAPL", "+/+/+", "x/#", "nothing/here"]


class World:
    def __init__(self, tmp):
        self.topo = ClusterTopology("ct")
        self.etcd = EtcdCluster(tmp, 1, hosts=["10.40.0.101"], netns=self.topo.ctl, client_port=2379,
                                peer_port=2380, tag="f")
        self.brokers = [ClusterBroker(self.topo, k, tmp, SPEC_PATH, self.etcd.endpoints) for k in range(1, N + 1)]
        for b in self.brokers:
            b.start()
        ns = ["nsenter", f"--net=/run/netns/{self.topo.sub}"]
        self.subs = {k: Agent(ns, 6000 + k) for k in (1, 2, 3)}
        self.registrar = Agent(ns, 5999)
        self.pub = Agent(["nsenter", f"--net=/run/netns/{self.topo.pub}"], None)
        self.labels: dict[str, list[int]] = {}
        self.live: dict[int, tuple[int, str, int, int]] = {}  # id -> (subscriber, filter, threshold, from)
        self.gone: list[tuple[int, str, int, int, int]] = []  # (subscriber, filter, threshold, from, until)
        self.expected: dict[int, list[str]] = {1: [], 2: [], 3: []}
        self.seq = 1
        self.n = 0
        self.sent = 0
        self.rng = random.Random(11)

    # -- etcd ------------------------------------------------------------------------------

    def _read(self, fn):
        def run():
            e = self.etcd.etcd()
            try:
                return fn(e)
            finally:
                e.close()

        return call_in_netns(self.topo.ctl, run)

    def position(self) -> int:
        kv = self._read(lambda e: e.get("/subc/meta/position"))
        return json.loads(kv.value)["seq"] if kv is not None else 0

    def etcd_subs(self) -> tuple[int, dict[int, tuple[str, str, int]]]:
        from subc.cluster.records import SubRecord

        rev, kvs = self._read(lambda e: e.snapshot("/subc/sub/"))
        out = {}
        for kv in kvs:
            r = SubRecord.decode(kv.value)
            out[int(kv.key.rsplit("/", 1)[1])] = (r.text, r.ip, r.port)
        return rev, out

    def etcd_labels(self) -> dict[str, int]:
        _, kvs = self._read(lambda e: e.snapshot("/subc/label/"))
        return {kv.key[len("/subc/label/"):]: int(kv.value) for kv in kvs}

    def handed_over(self, alive=(1, 2, 3)) -> None:
        from subc.cluster.status import cluster_status

        def ready():
            st = self._read(lambda e: cluster_status(e, "/subc/", with_etcd=False))
            rows = {int(b["node"][1:]): b for b in st["brokers"] if b["live"]}
            return set(rows) == set(alive) and all(r["acknowledged"] and r["fenced"] is False for r in rows.values())

        wait_until(ready, "every broker to be a member and hand over")

    def converged(self) -> None:
        rev, subs = self.etcd_subs()
        for b in self.brokers:
            def caught_up():
                applied, stored = b.stored()
                return applied >= rev and stored == subs

            wait_until(caught_up, f"broker {b.k} to apply revision {rev}: {''.join(list(b.log)[-10:])}")

    # -- requests and traffic -----------------------------------------------------------------

    def at(self) -> str:
        return self.topo.broker_ip(self.rng.randint(1, N))

    def register(self, topic: str) -> list[int]:
        r = self.registrar.request(self.at(), f"REGISTER {topic}")
        parts = r.split(" ")
        assert parts[:2] == ["REGACK", topic], r
        labels = [int(x) for x in parts[2:]]
        assert len(labels) == len(topic.split("/"))
        self.labels[topic] = labels
        return labels

    def sub(self, k: int, f: str, thr: int) -> str:
        where = f" WHERE topic.priority > {thr}" if thr >= 0 else ""
        r = self.subs[k].request(self.at(), f"SUB {f}{where}")
        if r.startswith("SUBACK "):
            self.live[int(r.split()[1])] = (k, f, thr, self.position())
        return r

    def unsub(self, sid: int) -> None:
        k, f, thr, start = self.live[sid]
        assert self.subs[k].request(self.at(), f"UNSUBSCRIBE {sid}") == f"UNSUBACK {sid}"
        del self.live[sid]
        self.gone.append((k, f, thr, start, self.position()))

    def send(self, n_datagrams: int) -> None:
        for _ in range(n_datagrams):
            msgs = []
            pos = self.seq  # a change takes effect at the first datagram numbered at or past its position
            for _ in range(self.rng.randint(1, 3)):
                topic, prio = self.rng.choice(TOPICS), self.rng.randint(0, 9)
                self.n += 1
                msgs.append(topic_message(self.labels[topic], prio, topic, f"m{self.n}".encode()))
                who = {k for k, f, thr, start in self.live.values()
                       if start <= pos and mqtt_matches(f, topic) and prio > thr}
                who |= {k for k, f, thr, start, end in self.gone
                        if start <= pos < end and mqtt_matches(f, topic) and prio > thr}
                for k in who:
                    self.expected[k].append(f"{topic} m{self.n}")
            dg = SESSION + self.seq.to_bytes(8, "big") + len(msgs).to_bytes(2, "big") + b"".join(
                len(m).to_bytes(2, "big") + m for m in msgs)
            for k in range(1, N + 1):
                self.pub.cmd(f"send 10.20.{k}.2 {FEED_PORT} {dg.hex()}")
                assert self.pub.next_reply("sent")
            self.seq += len(msgs)
            self.sent += len(msgs)
        for k in range(1, N + 1):
            wait_until(lambda: messages_counted_in(self.topo.brokers[k - 1], self.topo.feed_iface(k)) >= self.sent,
                       f"broker {k} to count every message")

    def got(self, k: int) -> dict[int, str]:
        a = self.subs[k]
        out: dict[int, str] = {}
        with a.lock:
            items = [m for _, m in a.molds]
        for _, seq, count, msgs in items:
            if count in (0, 0xFFFF):
                continue
            for j, m in enumerate(msgs):
                t, p = decode_message(m)
                assert (seq + j) not in out, f"subscriber {k}: sequence number {seq + j} twice"
                out[seq + j] = f"{t} {p.decode()}"
        return out

    def check(self) -> None:
        for k, agent in self.subs.items():
            want = self.expected[k]
            wait_until(lambda: len(self.got(k)) >= len(want), f"subscriber {k}'s {len(want)} messages")
            got = self.got(k)
            assert sorted(got) == list(range(1, len(want) + 1)), f"subscriber {k}: sequence numbers"
            assert [got[s] for s in sorted(got)] == want, f"subscriber {k}"
            with agent.lock:
                sources = {src for src, (_, _, c, _) in agent.molds if c not in (0, 0xFFFF)}
            assert len(sources) <= 1, f"subscriber {k}: copies from {sources}"

    def close(self) -> None:
        for b in self.brokers:
            b.stop()
        for a in [*self.subs.values(), self.registrar, self.pub]:
            a.close()
        self.etcd.close()
        self.topo.remove()


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    with cluster_world(lambda: World(tmp_path_factory.mktemp("cltopics"))) as w:
        yield w


def test_topics_at_any_broker_converge_and_deliver_what_mqtt_matching_gives(world):
    w = world
    w.handed_over()
    for t in TOPICS:
        first = w.register(t)
        for _ in range(2):  # again at random brokers: the same labels
            assert w.register(t) == first
    everything = [lab for t in TOPICS for lab in w.labels[t]]
    assert len(set(everything)) == len({lv for t in TOPICS for lv in t.split("/")})
    keep = {}
    for k in (1, 2, 3):  # one subscription each that stays: the endpoint keeps its sequence numbers
        r = w.sub(k, "#", 8)
        assert r.startswith("SUBACK "), r
        keep[int(r.split()[1])] = k
    for _ in range(5):
        for _ in range(w.rng.randint(1, 4)):
            mine = [i for i in w.live if i not in keep]
            if mine and w.rng.random() < 0.35:
                w.unsub(w.rng.choice(mine))
            else:
                thr = w.rng.choice([-1, 3, 6])
                r = w.sub(w.rng.randint(1, 3), w.rng.choice(FILTERS), thr)
                assert r.startswith("SUBACK "), r
        w.converged()
        w.send(w.rng.randint(3, 6))
    w.check()
    # LIST at any broker: the registrations with their labels
    for k in range(1, N + 1):
        w.registrar.cmd(f"req {w.topo.broker_ip(k)} 7000 LIST")
        lines = []
        while True:
            line = w.registrar.next_reply()
            if line.startswith("END"):
                break
            lines.append(line)
        regs = sorted(ln for ln in lines if ln.startswith("REG "))
        assert regs == sorted(f"REG {t} {' '.join(map(str, w.labels[t]))}" for t in TOPICS), lines


def test_unused_labels_are_forgotten_and_never_given_again(world):
    w = world
    for sid in [i for i, v in w.live.items() if v[1] != "#"]:
        w.unsub(sid)
    before = w.etcd_labels()
    top = max(before.values())
    assert w.registrar.request(w.at(), "UNREGISTER news/AAPL") == "UNREGACK news/AAPL"
    assert w.registrar.request(w.at(), "UNREGISTER news/AAPL").startswith("ERR ")
    # 'news' is used by nothing now ('AAPL' still is): forgotten by the broker picked for labels
    wait_until(lambda: "news" not in w.etcd_labels(), "the label of 'news' to be forgotten")
    assert w.etcd_labels()["AAPL"] == before["AAPL"]
    labels = w.register("news/AAPL")
    assert labels[0] > top and labels[1] == before["AAPL"]
    w.converged()
    w.send(3)
    w.check()


def test_a_killed_broker_restarts_with_its_topic_subscriptions(world):
    w = world
    for k in (1, 2):
        r = w.sub(k, "market/+/AAPL", -1)
        assert r.startswith("SUBACK "), r
    w.converged()
    b = w.brokers[1]
    b.kill()
    w.handed_over(alive=(1, 3))
    b.start()
    w.handed_over()
    w.converged()
    assert not [ln for ln in b.log if "restore_dropped" in ln or "cluster_apply_failed" in ln], list(b.log)
    w.send(4)
    w.check()
