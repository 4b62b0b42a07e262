"""Three ``subc serve --cluster`` brokers on a three-member etcd, in network namespaces
(cluster_netns.py): a publisher feeds all three; subscribers send requests to any of them.

The Add Orders are built here with ``struct`` (test_serve_netns's helpers); what each subscriber
must receive is the conditions evaluated by the AST evaluator on the values the messages were
built from.  Checked, in one scenario (its phases build on each other):

* requests at random brokers: after each round every broker's store holds exactly etcd's
  subscriptions at a revision at least the round's last, and each subscriber receives exactly
  what its subscriptions accept from the feed position each took effect at (read from etcd's
  ``meta/position`` after its reply; the brokers run three messages ahead of the feed, so a
  change takes effect inside the next burst, at the first datagram numbered at or past the
  position, the same datagram on every broker) to the position of its removal, once, with
  gap-free sequence numbers, every copy from one broker (its owner);
* ``kill -9`` of a broker that delivers to a subscriber, mid-stream: its kernel data path stops
  sending at its fence, a survivor takes the subscriber over and continues its sequence numbers,
  and a MoldUDP64 re-request to the survivor fills the gap: every message once, in order; the
  killed broker restarts and takes its subscribers back the same way;
* ``SIGSTOP`` of a broker past its lease: the same, with no sequence number sent twice (the
  stopped broker's kernel stops at its fence); after ``SIGCONT`` it rejoins;
* a broker cut off from etcd refuses requests with an error and stops delivering; healed, it
  rejoins; killing etcd's leader loses no acknowledged subscription;
* a broker that was down while etcd compacted its history catches up from a snapshot.

No verdict depends on speed: the test waits for replies, counters, stores and packets, with a
hang guard only.
"""

from __future__ import annotations

import json
import queue
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from subc.lang.ast import evaluate
from subc.lang.rules import parse_rules

from cluster_netns import N, PORT, RR_PORT, ClusterBroker, ClusterTopology, cluster_world
from etcd_util import EtcdCluster
from netns_util import call_in_netns
from test_serve_netns import SPEC, SPEC_PATH, SYMS, add_order, messages_counted_in, mold, values_of

HERE = Path(__file__).parent
HANG = 120.0
CONDITIONS = [
    'add_order.stock == "{s}" and add_order.price > 100',
    'add_order.stock == "{s}"',
    'add_order.price <= 99 or add_order.shares == 500',
    'add_order.buy_sell_indicator == "S" and add_order.stock != "{s}"',
]


def wait_until(cond, what: str, timeout: float = HANG):
    end = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        assert time.monotonic() < end, f"gave up waiting for {what}"
        time.sleep(0.05)


class Agent:
    """``serve_client.py`` in a namespace: replies, deliveries (with their source) and
    re-request answers."""

    def __init__(self, cmd: list[str], port: int | None):
        self.p = subprocess.Popen([*cmd, sys.executable, str(HERE / "serve_client.py")],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.replies: queue.Queue = queue.Queue()
        self.molds: list[tuple[str, list]] = []  # (source address, [session, seq, count, msgs])
        self.answers: list[tuple[str, list]] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._read, daemon=True).start()
        if port is not None:
            self.cmd(f"bind {port}")
            assert self.next_reply("bound") == port

    def _read(self) -> None:
        for line in self.p.stdout:
            doc = json.loads(line)
            with self.lock:
                if "mold" in doc:
                    self.molds.append((doc["from"], doc["mold"]))
                elif "answer" in doc:
                    self.answers.append((doc["from"], doc["answer"]))
                else:
                    self.replies.put(doc)

    def cmd(self, line: str) -> None:
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()

    def next_reply(self, key: str = "reply"):
        while True:
            doc = self.replies.get(timeout=HANG)
            if key in doc:
                return doc[key]

    def request(self, host: str, line: str) -> str:
        self.cmd(f"req {host} {PORT} {line}")
        return self.next_reply()

    def stream(self) -> dict[int, int]:
        """seq -> order reference of every message received live or in answers; a sequence
        number received twice fails."""
        out: dict[int, int] = {}
        with self.lock:
            items = [m for _, m in self.molds] + [m for _, m in self.answers if m]
        for session, seq, count, msgs in items:
            if count in (0, 0xFFFF):
                continue
            for j, m in enumerate(msgs):
                ref = int(m[22:38], 16)
                assert out.get(seq + j, ref) == ref, f"sequence number {seq + j}: two different messages"
                out[seq + j] = ref
        return out

    def live_dupes(self) -> list[int]:
        """Sequence numbers delivered live more than once."""
        seen, dup = set(), []
        with self.lock:
            for _, (_, seq, count, msgs) in self.molds:
                if count in (0, 0xFFFF):
                    continue
                for j in range(len(msgs)):
                    if seq + j in seen:
                        dup.append(seq + j)
                    seen.add(seq + j)
        return dup

    def sources(self, since: int = 0) -> set[str]:
        with self.lock:
            return {src for src, (_, _, count, _) in self.molds[since:] if count not in (0, 0xFFFF)}

    def close(self) -> None:
        try:
            self.cmd("quit")
            self.p.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            self.p.kill()


class World:
    """Topology, etcd, brokers, agents, and the reference."""

    def __init__(self, tmp: Path):
        self.topo = ClusterTopology("cl")
        self.etcd = EtcdCluster(tmp, 3, hosts=[f"10.40.0.10{m}" for m in range(1, 4)], netns=self.topo.ctl,
                                client_port=2379, peer_port=2380, tag="e")
        self.brokers = [ClusterBroker(self.topo, k, tmp, SPEC_PATH, self.etcd.endpoints) for k in range(1, N + 1)]
        for b in self.brokers:
            b.start()
        self.subs = {k: Agent(["nsenter", f"--net=/run/netns/{self.topo.sub}"], 6000 + k) for k in (1, 2, 3)}
        self.pub = Agent(["nsenter", f"--net=/run/netns/{self.topo.pub}"], None)
        self.live: dict[int, tuple[int, object, int]] = {}  # id -> (subscriber, condition, from position)
        self.gone: list[tuple[int, object, int, int]] = []  # (subscriber, condition, from, until)
        self.first_seq: dict[int, int] = {}  # order reference -> its datagram's first sequence number (diagnostics)
        self.expected: dict[int, list[int]] = {1: [], 2: [], 3: []}
        self.sent = 0
        self.seq = 1
        self.ref = 1
        self.rng = random.Random(7)
        self.alive = {1, 2, 3}

    # -- etcd ------------------------------------------------------------------------------

    def in_ctl(self, fn):
        return call_in_netns(self.topo.ctl, fn)

    def etcd_state(self) -> tuple[int, dict[int, tuple[str, str, int]]]:
        from subc.cluster.records import SubRecord

        def read():
            e = self.etcd.etcd([i for i in range(3) if self.etcd.procs[i] is not None])
            try:
                rev, kvs = e.snapshot("/subc/sub/")
            finally:
                e.close()
            out = {}
            for kv in kvs:
                r = SubRecord.decode(kv.value)
                out[int(kv.key.rsplit("/", 1)[1])] = (r.text, r.ip, r.port)
            return rev, out

        return self.in_ctl(read)

    def position(self) -> int:
        """The feed position (sequence number) of the latest change, from etcd (0: no change has
        one yet, as none has been made since the brokers saw the feed)."""

        def read():
            e = self.etcd.etcd([i for i in range(3) if self.etcd.procs[i] is not None])
            try:
                kv = e.get("/subc/meta/position")
            finally:
                e.close()
            return json.loads(kv.value)["seq"] if kv is not None else 0  # none before the feed: at once

        return self.in_ctl(read)

    def status(self) -> dict:
        from subc.cluster.status import cluster_status

        def read():
            e = self.etcd.etcd([i for i in range(3) if self.etcd.procs[i] is not None])
            try:
                return cluster_status(e, "/subc/", with_etcd=False)
            finally:
                e.close()

        return self.in_ctl(read)

    def converged(self) -> None:
        """Every live broker's store holds etcd's subscriptions at a revision at least etcd's now."""
        rev, subs = self.etcd_state()
        for k in sorted(self.alive):
            b = self.brokers[k - 1]

            def caught_up():
                applied, stored = b.stored()
                return applied >= rev and stored == subs

            wait_until(caught_up, f"broker {k} to apply revision {rev}: {''.join(list(b.log)[-10:])}")

    def handed_over(self) -> dict:
        """Wait until every live broker is a member, acknowledged, not fenced; the status."""
        def ready():
            st = self.status()
            rows = {int(b["node"][1:]): b for b in st["brokers"] if b["live"]}
            ok = set(rows) == self.alive and all(r["acknowledged"] and r["fenced"] is False for r in rows.values())
            return st if ok else None

        return wait_until(ready, "every broker to be a member and hand over")

    # -- requests and traffic -----------------------------------------------------------------

    def subscribe(self, k: int, at: int, text: str) -> str:
        r = self.subs[k].request(self.topo.broker_ip(at), f"SUBSCRIBE {text}")
        if r.startswith("SUBACK "):
            cond = parse_rules(text + " : fwd(0);", SPEC, "t")[0].condition
            self.live[int(r.split()[1])] = (k, cond, self.position())
        return r

    def unsubscribe(self, k: int, at: int, sid: int) -> str:
        r = self.subs[k].request(self.topo.broker_ip(at), f"UNSUBSCRIBE {sid}")
        if r == f"UNSUBACK {sid}":
            kk, cond, start = self.live.pop(sid)
            self.gone.append((kk, cond, start, self.position()))
        return r

    def send(self, n_datagrams: int) -> None:
        for _ in range(n_datagrams):
            msgs = []
            for _ in range(self.rng.randint(1, 4)):
                stock, price = self.rng.choice(SYMS), self.rng.choice([10, 990000, 1000001, 5000000])
                shares, side = self.rng.choice([1, 100, 500]), self.rng.choice("BS")
                msgs.append(add_order(self.ref, stock, price, shares, side))
                v = values_of(stock, price, shares, side)
                pos = self.seq  # a change takes effect at a datagram: the first numbered at or past its position
                who = {k for k, cond, start in self.live.values() if start <= pos and evaluate(cond, v)}
                who |= {k for k, cond, start, end in self.gone if start <= pos < end and evaluate(cond, v)}
                for k in who:
                    self.expected[k].append(self.ref)
                self.first_seq[self.ref] = self.seq
                self.ref += 1
            payload = mold(self.seq, msgs).hex()
            for k in range(1, N + 1):
                self.pub.cmd(f"send 10.20.{k}.2 26400 {payload}")
                assert self.pub.next_reply("sent")
            self.seq += len(msgs)
            self.sent += len(msgs)

    def settle(self) -> None:
        """Every live broker's data plane counted every message sent."""
        for k in sorted(self.alive):
            wait_until(lambda: messages_counted_in(self.topo.brokers[k - 1], self.topo.feed_iface(k)) >= self.sent,
                       f"broker {k} to count every message")

    def check(self, recover: bool = False) -> None:
        """Each subscriber got exactly its expected messages, in sequence order, once; with
        ``recover``, gaps are re-requested from the broker that delivers now."""
        for k, agent in self.subs.items():
            want = self.expected[k]

            def complete():
                got = agent.stream()
                if recover:
                    self._recover(k, agent, got)
                return len(got) >= len(want)

            try:
                wait_until(complete, f"subscriber {k}'s messages")
            except AssertionError as e:
                got = agent.stream()
                raise AssertionError(f"{e}: got {len(got)} of {len(want)}; missing seqs "
                                     f"{sorted(set(range(1, len(want) + 1)) - set(got))[:20]}; answers "
                                     f"{[(a, m[1:3] if m else m) for a, m in agent.answers[-5:]]}; replies "
                                     f"{list(agent.replies.queue)[-5:]}; status "
                                     f"{json.dumps(self.status()['brokers'])}; logs "
                                     f"{[''.join(list(b.log)[-8:]) for b in self.brokers]}") from None
            got = agent.stream()
            refs = [got[s] for s in sorted(got)]
            if sorted(got) != list(range(1, len(want) + 1)) or refs != want:
                _, subs = self.etcd_state()
                mine = {i: v for i, v in subs.items() if v[2] == 6000 + k}
                raise AssertionError(
                    f"subscriber {k}: {len(got)} messages, {len(want)} expected; unexpected refs "
                    f"{sorted(set(refs) - set(want))[:10]}, missing {sorted(set(want) - set(refs))[:10]}; "
                    f"etcd {mine}; live {[(i, v[2]) for i, v in self.live.items() if v[0] == k]}; gone "
                    f"{[(g[2], g[3]) for g in self.gone if g[0] == k]}; datagrams of the unexpected "
                    f"{[self.first_seq.get(r) for r in sorted(set(refs) - set(want))[:10]]}"
                )

    def _recover(self, k: int, agent: Agent, got: dict[int, int]) -> None:
        want = len(self.expected[k])
        missing = sorted(set(range(1, want + 1)) - set(got))
        if not missing:
            return
        with agent.lock:  # the broker that delivers now: the latest copy's source
            src = [s for s, (_, _, c, _) in agent.molds if c not in (0, 0xFFFF)][-1:]
        if not src:
            return
        first = missing[0]
        req = b"LIVETEST01" + first.to_bytes(8, "big") + min(100, want - first + 1).to_bytes(2, "big")
        agent.cmd(f"rereq {src[0]} {RR_PORT} {req.hex()}")
        time.sleep(0.2)  # pacing of the re-requests only; the verdict waits for the answers

    def close(self) -> None:
        for b in self.brokers:
            b.stop()
        for a in [*self.subs.values(), self.pub]:
            a.close()
        self.etcd.close()
        self.topo.remove()


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    with cluster_world(lambda: World(tmp_path_factory.mktemp("cluster"))) as w:
        yield w


def owner_of(w: World, k: int) -> int:
    """The broker that delivered subscriber k's latest datagram."""
    agent = w.subs[k]
    with agent.lock:
        src = [s for s, (_, _, c, _) in agent.molds if c not in (0, 0xFFFF)][-1]
    return int(src.rsplit(".", 1)[1]) - 10


def test_requests_at_any_broker_converge_and_deliver_once(world):
    w = world
    w.handed_over()
    rng = random.Random(3)
    keep = set()
    for k in (1, 2, 3):  # one subscription each that stays: an endpoint keeps its sequence numbers
        r = w.subscribe(k, rng.randint(1, 3), 'add_order.price > 100')
        assert r.startswith("SUBACK "), r
        keep.add(int(r.split()[1]))
    for _ in range(6):
        for _ in range(rng.randint(1, 4)):
            mine = [i for i in w.live if i not in keep]
            at = rng.randint(1, 3)
            if mine and rng.random() < 0.35:
                sid = rng.choice(mine)
                assert w.unsubscribe(w.live[sid][0], at, sid) == f"UNSUBACK {sid}"
            else:
                k = rng.randint(1, 3)
                r = w.subscribe(k, at, rng.choice(CONDITIONS).format(s=rng.choice(SYMS)))
                assert r.startswith("SUBACK "), r
        w.converged()
        w.send(rng.randint(3, 8))
        w.settle()
    w.check()
    for k, agent in w.subs.items():
        assert not agent.live_dupes(), f"subscriber {k}"
        assert len(agent.sources()) == 1, f"subscriber {k}: copies from {agent.sources()}"


def test_kill_9_of_an_owner_moves_its_subscribers_without_loss(world):
    w = world
    victim = owner_of(w, 1)
    w.send(5)
    w.settle()
    w.brokers[victim - 1].kill("KILL")
    w.alive.discard(victim)
    # traffic while the killed broker's kernel still delivers (until its fence) and after
    deadline = time.monotonic() + HANG
    before = len(w.subs[1].molds)
    while not (w.subs[1].sources(before) - {w.topo.broker_ip(victim)}):
        assert time.monotonic() < deadline, "no survivor took subscriber 1 over"
        w.send(2)
        time.sleep(0.1)  # pacing of the feed only
    w.settle()
    w.check(recover=True)
    for k, agent in w.subs.items():
        assert not agent.live_dupes(), f"subscriber {k}: a sequence number sent twice"
    # the killed broker comes back and takes its subscribers back the same way
    w.brokers[victim - 1].start()
    w.alive.add(victim)
    w.handed_over()
    w.converged()
    w.send(6)
    w.settle()
    w.check(recover=True)
    for k, agent in w.subs.items():
        assert not agent.live_dupes(), f"subscriber {k}: a sequence number sent twice"


def take_over(w: World, victim: int, k: int = 1) -> None:
    """Send traffic until a broker other than ``victim`` delivers to subscriber ``k``."""
    deadline = time.monotonic() + HANG
    before = len(w.subs[k].molds)
    while not (w.subs[k].sources(before) - {w.topo.broker_ip(victim)}):
        assert time.monotonic() < deadline, f"no survivor took subscriber {k} over"
        w.send(2)
        time.sleep(0.1)  # pacing of the feed only


def no_dupes(w: World) -> None:
    for k, agent in w.subs.items():
        assert not agent.live_dupes(), f"subscriber {k}: a sequence number sent twice"


def checked(w: World) -> None:
    """Every live broker counted the feed; every subscriber has its messages (gaps re-requested),
    no sequence number sent twice."""
    w.settle()
    w.check(recover=True)
    no_dupes(w)


def rejoined(w: World, k: int) -> None:
    """Broker ``k`` is back: it hands over, converges and delivers with the others."""
    w.alive.add(k)
    w.handed_over()
    w.converged()
    w.send(6)
    checked(w)


def test_sigstop_past_the_lease_moves_subscribers_and_the_broker_rejoins(world):
    w = world
    victim = owner_of(w, 1)
    w.brokers[victim - 1].kill("STOP")
    w.alive.discard(victim)
    take_over(w, victim)
    checked(w)
    w.brokers[victim - 1].kill("CONT")
    rejoined(w, victim)


def test_a_broker_cut_off_from_etcd_refuses_requests_stops_delivering_and_heals(world):
    w = world
    victim = owner_of(w, 1)
    w.topo.partition(victim, True)
    try:
        def refused():
            r = w.subs[2].request(w.topo.broker_ip(victim), 'SUBSCRIBE add_order.stock == "AAPL"')
            assert not r.startswith("SUBACK"), f"a broker cut off from etcd acknowledged: {r}"
            return "cut off from the cluster" in r

        wait_until(refused, "the cut-off broker to refuse requests")
        w.alive.discard(victim)
        take_over(w, victim)
        checked(w)
    finally:
        w.topo.partition(victim, False)
    rejoined(w, victim)


def test_losing_the_etcd_leader_loses_no_acknowledged_subscription(world):
    w = world
    dead = w.etcd.leader()
    w.etcd.kill(dead)
    try:
        acked = []
        for k in (1, 2, 3):
            def ack():
                r = w.subscribe(k, k, f'add_order.stock == "{SYMS[k]}" and add_order.shares == 100')
                if r.startswith("SUBACK "):
                    acked.append(int(r.split()[1]))
                    return True
                assert r.startswith("ERR"), r
                return False

            wait_until(ack, "a SUBACK with a member down")
        w.converged()
        _, subs = w.etcd_state()
        assert set(acked) <= set(subs)
        w.send(6)
        w.settle()
        w.check(recover=True)
        no_dupes(w)
    finally:
        w.etcd.start(dead)
        w.etcd.wait_healthy()


def test_a_broker_down_while_etcd_compacts_catches_up(world):
    w = world
    k = 2
    w.brokers[k - 1].stop()
    w.alive.discard(k)
    rng = random.Random(9)
    at = [b for b in (1, 2, 3) if b != k]
    for _ in range(4):
        r = w.subscribe(rng.randint(1, 3), rng.choice(at), rng.choice(CONDITIONS).format(s=rng.choice(SYMS)))
        assert r.startswith("SUBACK "), r
    victim_sub = max(w.live)
    assert w.unsubscribe(w.live[victim_sub][0], at[0], victim_sub) == f"UNSUBACK {victim_sub}"

    def compact():
        e = w.etcd.etcd()
        try:
            e.compact(e.revision())
        finally:
            e.close()

    w.in_ctl(compact)
    w.send(4)
    w.settle()
    w.brokers[k - 1].start()
    w.alive.add(k)
    w.handed_over()
    w.converged()
    w.send(6)
    w.settle()
    w.check(recover=True)
    no_dupes(w)
