"""End to end: ``subc serve`` in network namespaces, subscribers coming and going under traffic.

A publisher namespace sends ITCH Add Orders in MoldUDP64 datagrams (packed here from values with
``struct``, nothing from subc); three subscriber namespaces run agents (``serve_client.py``) that
send requests and parse what they receive.  After every change the test waits until the data
plane has counted every message sent so far (so every message was classified before the next
change), then checks, per subscriber:

* every message sent after a SUBACK that one of its live subscriptions accepts arrives, once;
* nothing sent after its UNSUBACK or lease expiry arrives for that subscription, and nothing for
  another subscriber (the expected sets come from the conditions evaluated by the AST evaluator
  on the values the messages were built from);
* its copies carry its own gap-free MoldUDP64 sequence numbers.

The daemon is then killed (SIGKILL) and restarted under traffic: the data path keeps delivering
while it is down, and the restarted daemon keeps every subscription and loses no message.
Hostile requests (spoofed TO, malformed and oversized lines, rules over the limits, floods) get
errors and change nothing.  No verdict depends on time: the test waits for events (replies,
counters, marker messages), with a hang guard only.
"""

from __future__ import annotations

import collections
import json
import queue
import random
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from subc.lang.ast import evaluate
from subc.lang.rules import parse_rules
from subc.spec.front_end import load_spec

from conftest import EXAMPLE
from netns_util import SUBC, Topology, call_in_netns, need_root_and_netns

SPEC_PATH = EXAMPLE / "spec.p4"
SPEC = load_spec(SPEC_PATH)
HERE = Path(__file__).parent
HANG = 120.0
PORT = 7000
SYMS = ["AAPL", "MSFT", "GOOG", "AMZN"]
SESSION = b"LIVETEST01"


def add_order(ref: int, stock: str, price: int, shares: int, side: str) -> bytes:
    """An ITCH 5.0 Add Order ('A', 36 bytes; Nasdaq TotalView-ITCH 5.0 section 1.3.1)."""
    return b"A" + struct.pack(">HH6sQcI8sI", 1, 0, bytes(6), ref, side.encode(), shares,
                              stock.ljust(8).encode(), price)


def values_of(stock: str, price: int, shares: int, side: str) -> dict:
    """The field values the rules see (stock and side as the big-endian integers of their bytes)."""
    return {"add_order.stock": int.from_bytes(stock.ljust(8).encode(), "big"), "add_order.price": price,
            "add_order.shares": shares, "add_order.buy_sell_indicator": ord(side), "ipv4.dstAddr": 0x0A0A0002}


def mold(seq: int, msgs: list[bytes]) -> bytes:
    return SESSION + seq.to_bytes(8, "big") + len(msgs).to_bytes(2, "big") + b"".join(
        len(m).to_bytes(2, "big") + m for m in msgs)


class Agent:
    """``serve_client.py`` in a namespace: requests, replies and deliveries (see that file)."""

    def __init__(self, topo: Topology, ns: str, port: int | None):
        self.p = subprocess.Popen(topo.in_ns(ns, sys.executable, str(HERE / "serve_client.py")),
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.replies: queue.Queue = queue.Queue()
        self.molds: list = []
        self.lock = threading.Lock()
        threading.Thread(target=self._read, daemon=True).start()
        if port is not None:
            self.cmd(f"bind {port}")
            assert self.next_reply("bound") == port

    def _read(self) -> None:
        for line in self.p.stdout:
            doc = json.loads(line)
            if "mold" in doc:
                with self.lock:
                    self.molds.append(doc["mold"])
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

    def refs(self) -> list[int]:
        """Order reference numbers of every message received (duplicates kept)."""
        with self.lock:
            return [int(m[22:38], 16) for d in self.molds for m in d[3]]

    def close(self) -> None:
        try:
            self.cmd("quit")
            self.p.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            self.p.kill()


def assert_gap_free(agent: Agent, k: int) -> None:
    """Subscriber ``k``'s datagrams carry gap-free MoldUDP64 sequence numbers from 1."""
    with agent.lock:
        runs = sorted((d[1], d[2]) for d in agent.molds if d[2] not in (0, 0xFFFF))
    nxt = 1
    for seq, count in runs:
        assert seq == nxt, f"subscriber {k}: sequence {seq}, expected {nxt}"
        nxt += count


def wait_until(cond, what: str) -> None:
    end = time.monotonic() + HANG
    while not cond():
        assert time.monotonic() < end, f"gave up waiting for {what}"
        time.sleep(0.02)


class Broker:
    """``subc serve`` in the broker namespace (restartable), with ``spec`` and ``args``."""

    def __init__(self, topo: Topology, tmp: Path, spec: Path = SPEC_PATH, args: tuple[str, ...] | None = None):
        self.topo, self.tmp, self.spec = topo, tmp, spec
        if args is None:  # the ITCH world's: marker subscriptions and an ACL
            rules = tmp / "markers.txt"
            rules.write_text("".join(f'add_order.stock == "MARK{k}" TO 10.10.{k}.2:600{k}\n' for k in (1, 2, 3)))
            acl = tmp / "acl.toml"
            acl.write_text('[limits]\nrequests_per_second = 300\nsubscriptions_per_source = 50\n\n'
                           '[[grant]]\ntoken = "letmein"\nto = ["10.10.0.0/16"]\n')
            args = ("--rules", str(rules), "--acl", str(acl))
        self.args = args
        self.p = None

    def start(self, *extra: str) -> None:
        self.p = subprocess.Popen(self.topo.in_ns(
            self.topo.brk, *SUBC, "serve", "--spec", str(self.spec), "--iface", self.topo.b0,
            "--listen", f"0.0.0.0:{PORT}", "--state", str(self.tmp / "state"), *self.args,
            "--capacity", "2000", *extra), stderr=subprocess.PIPE, text=True)
        while True:
            line = self.p.stderr.readline()
            assert line, f"subc serve exited: {self.p.wait()}"
            if line.startswith("serving on"):
                break
        self.log = collections.deque(maxlen=40)  # the daemon's last log lines, for a failure's message
        threading.Thread(target=lambda: self.log.extend(self.p.stderr), daemon=True).start()

    def kill(self) -> None:
        self.p.kill()
        self.p.wait()

    def stop(self) -> None:
        if self.p and self.p.poll() is None:
            self.p.terminate()
            self.p.wait(timeout=30)


def messages_counted(topo: Topology) -> int:
    """The broker's message counter, read as a process in the broker's namespace would
    (the broker's pins and state are keyed by its network namespace)."""
    return messages_counted_in(topo.brk, topo.b0)


def messages_counted_in(ns: str, iface: str) -> int:
    """The message counter of the broker on ``iface`` in namespace ``ns``."""
    from subc.dataplane.ebpf.broker_stats import stats

    return call_in_netns(ns, lambda: stats(iface))["stats"]["messages"]


class World:
    """Topology, daemon, agents, and the reference: what each subscriber must receive."""

    def __init__(self, topo: Topology, tmp: Path):
        self.topo = topo
        self.broker = Broker(topo, tmp)
        self.broker.start()
        self.subs = {k: Agent(topo, topo.subs[k - 1], 6000 + k) for k in (1, 2, 3)}
        self.pub = Agent(topo, topo.pub, None)
        self.live: dict[int, tuple[int, object, str]] = {}  # id -> (subscriber, condition, text)
        self.expected: dict[int, list[int]] = {1: [], 2: [], 3: []}
        self.sent = 0
        self.seq = 1
        self.ref = 1
        self.rng = random.Random(11)

    def subscribe(self, k: int, text: str, suffix: str = "") -> str:
        r = self.subs[k].request(f"10.10.{k}.1", f"SUBSCRIBE {text}{suffix}")
        if r.startswith("SUBACK "):
            cond = parse_rules(text + " : fwd(0);", SPEC, "t")[0].condition
            self.live[int(r.split()[1])] = (k, cond, text)
        return r

    def unsubscribe(self, k: int, sid: int) -> str:
        r = self.subs[k].request(f"10.10.{k}.1", f"UNSUBSCRIBE {sid}")
        if r == f"UNSUBACK {sid}":
            del self.live[sid]
        return r

    def send(self, n_datagrams: int, markers: bool = False) -> None:
        """Send ``n_datagrams`` random datagrams (1 to 4 Add Orders each; with ``markers``, one
        datagram of the three marker messages too) and record who must get what."""
        for i in range(n_datagrams + (1 if markers else 0)):
            msgs = []
            if markers and i == n_datagrams:
                items = [(f"MARK{k}", 1, 1, "B") for k in (1, 2, 3)]
            else:
                items = [(self.rng.choice(SYMS), self.rng.choice([10, 990000, 1000000, 1000001, 5000000]),
                          self.rng.choice([1, 100, 500]), self.rng.choice("BS")) for _ in range(self.rng.randint(1, 4))]
            for stock, price, shares, side in items:
                msgs.append(add_order(self.ref, stock, price, shares, side))
                v = values_of(stock, price, shares, side)
                who = {k for k, cond, _ in self.live.values() if evaluate(cond, v)}
                if stock.startswith("MARK"):
                    who.add(int(stock[4]))
                for k in who:
                    self.expected[k].append(self.ref)
                self.ref += 1
            self.pub.cmd(f"send 10.10.0.2 26400 {mold(self.seq, msgs).hex()}")
            assert self.pub.next_reply("sent")
            self.seq += len(msgs)
            self.sent += len(msgs)

    def settle(self) -> None:
        """Wait until the data plane has counted every message sent (each one classified)."""
        wait_until(lambda: messages_counted(self.topo) >= self.sent, "the broker to count every message")

    def check(self) -> None:
        """Every subscriber got exactly its expected messages, with gap-free sequence numbers."""
        self.send(0, markers=True)
        for k, agent in self.subs.items():
            want = sorted(self.expected[k])
            try:
                wait_until(lambda: len(agent.refs()) >= len(want) and self.expected[k][-1] in agent.refs(),
                           f"subscriber {k}'s messages")
            except AssertionError as e:
                got = agent.refs()
                raise AssertionError(f"{e}: missing {sorted(set(want) - set(got))}, unexpected "
                                     f"{sorted(set(got) - set(want))}; live {self.live}; stats "
                                     f"{messages_counted(self.topo)}/{self.sent}; daemon log:\n"
                                     + "".join(self.broker.log)) from None
            assert sorted(agent.refs()) == want, f"subscriber {k}"
            assert_gap_free(agent, k)

    def close(self) -> None:
        self.broker.stop()
        for a in [*self.subs.values(), self.pub]:
            a.close()


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    need_root_and_netns()
    topo = Topology("svt", 3)
    w = None
    try:
        w = World(topo, tmp_path_factory.mktemp("serve"))
        yield w
    finally:
        if w is not None:
            w.close()
        topo.subc(topo.brk, "unload", "--iface", topo.b0, check=False)
        topo.remove()


CONDITIONS = [
    'add_order.stock == "{s}" and add_order.price > 100',
    'add_order.stock == "{s}"',
    'add_order.price <= 99 or add_order.shares == 500',
    'add_order.buy_sell_indicator == "S" and add_order.stock != "{s}"',
    'not (add_order.shares < 100) and add_order.price >= 100.0001',
]


def test_subscribers_come_and_go_under_traffic(world):
    rng = random.Random(5)
    for _ in range(14):
        for _ in range(rng.randint(1, 3)):
            mine = [i for i, (k, _, _) in world.live.items()]
            if mine and rng.random() < 0.4:
                sid = rng.choice(mine)
                assert world.unsubscribe(world.live[sid][0], sid) == f"UNSUBACK {sid}"
            else:
                k = rng.randint(1, 3)
                r = world.subscribe(k, rng.choice(CONDITIONS).format(s=rng.choice(SYMS)))
                assert r.startswith("SUBACK "), r
        world.send(rng.randint(2, 6))
        world.settle()
    world.check()
    # LIST shows each source its own subscriptions
    for k, agent in world.subs.items():
        agent.cmd(f"req 10.10.{k}.1 {PORT} LIST")
        lines = []
        while not (lines and lines[-1].startswith("END")):
            lines.append(agent.next_reply())
        mine = sorted(i for i, (kk, _, _) in world.live.items() if kk == k)
        assert sorted(int(ln.split()[1]) for ln in lines[:-1]) == mine
        assert lines[-1] == f"END {len(mine)}"


def test_reading_stats_leaves_no_descriptor_open(world):
    """``stats`` opens the pinned maps and closes them again: a monitor that polls it (as this
    module's ``settle`` does) keeps a constant number of open files."""
    import os

    messages_counted(world.topo)
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        messages_counted(world.topo)
    assert len(os.listdir("/proc/self/fd")) == before


def test_restart_under_traffic_keeps_every_subscription(world):
    if not world.live:
        world.subscribe(1, 'add_order.stock == "AAPL"')
    before = dict(world.live)
    world.send(5)
    world.broker.kill()  # SIGKILL: no clean shutdown
    world.send(20)  # the pinned data path delivers while no daemon runs
    world.settle()
    stop = threading.Event()
    sender_done = threading.Event()

    def keep_sending():
        while not stop.is_set():
            world.send(1)
        sender_done.set()

    t = threading.Thread(target=keep_sending, daemon=True)
    t.start()
    try:
        world.broker.start()
    finally:
        stop.set()
        sender_done.wait(HANG)
    world.send(10)
    world.settle()
    world.check()
    assert world.live == before
    r = world.subscribe(2, 'add_order.stock == "GOOG"')
    assert r.startswith("SUBACK ") and int(r.split()[1]) > max(before), r
    world.send(5)
    world.settle()
    world.check()


def test_leases_expire(world):
    world.broker.stop()
    world.broker.start("--lease", "1.0")
    r = world.subscribe(3, 'add_order.stock == "AMZN"')
    assert r.startswith("SUBACK ")
    sid = int(r.split()[1])
    agent = world.subs[3]

    def gone() -> bool:
        agent.cmd(f"req 10.10.3.1 {PORT} LIST")
        ids = []
        while True:
            ln = agent.next_reply()
            if ln.startswith("END"):
                return sid not in ids
            ids.append(int(ln.split()[1]))

    wait_until(gone, "the lease to expire")
    del world.live[sid]
    world.send(8)
    world.settle()
    world.check()


def test_hostile_requests_change_nothing(world):
    a = world.subs[1]
    host = "10.10.1.1"
    n_live = len(world.live)
    deep = "add_order.price > 1"
    for i in range(80):  # nested 80 deep: over subc check's limit of 64
        deep = f"add_order.shares > {i} {'and' if i % 2 else 'or'} ({deep})"
    r = a.request(host, 'SUBSCRIBE add_order.stock == "AAPL" TO 10.10.2.2:6002')
    assert r.startswith("SUBERR ") and "ACL" in r, r
    r = a.request(host, 'SUBSCRIBE add_order.stock == "AAPL" TO 10.10.2.2:6002 TOKEN wrong')
    assert r.startswith("SUBERR "), r
    for bad, start in [("SUBSCRIBE add_order.price >", "SUBERR "), ("SUBSCRIBE nosuch.field == 1", "SUBERR "),
                       ("FROBNICATE", "ERR "), ("SUBSCRIBE " + deep, "SUBERR "),
                       ('SUBSCRIBE add_order.price > 1 : fwd(3)', "SUBERR "), ("UNSUBSCRIBE 99999", "ERR "),
                       ("SUBSCRIBE add_order.price > 1 and add_order.price < 1", "SUBERR ")]:
        r = a.request(host, bad)
        assert r.startswith(start), (bad, r)
    a.cmd(f"req {host} {PORT} SUBSCRIBE add_order.price > {'9' * 5000}")
    assert a.next_reply().startswith("SUBERR "), "oversized line"
    # another subscriber's subscription cannot be removed
    if world.live:
        other = next(i for i, (k, _, _) in world.live.items())
        if world.live[other][0] != 1:
            assert a.request(host, f"UNSUBSCRIBE {other}").startswith("ERR ")
    # a token grants TO
    r = world.subscribe(1, 'add_order.stock == "MSFT"', " TO 10.10.2.2:6002 TOKEN letmein")
    assert r.startswith("SUBACK "), r
    sid = int(r.split()[1])
    k, cond, text = world.live[sid]
    world.live[sid] = (2, cond, text)  # its messages go to subscriber 2
    world.send(6)
    world.settle()
    world.check()
    assert len(world.live) == n_live + 1
    # a flood from one source is cut at its rate (the others are served); the complaint goes
    # only to a source that proved its address (its agent gets a cookie first: PINGs carry it)
    flood = Agent(world.topo, world.topo.subs[2], 6099)
    assert flood.request("10.10.3.1", "RENEW 0") == "RENEWACK 0"
    for _ in range(3000):
        flood.cmd(f"req 10.10.3.1 {PORT} PING")
    while (r := flood.next_reply()) == "PONG":
        pass
    assert r.startswith("ERR rate limit"), r
    flood.close()
    assert world.subs[2].request("10.10.2.1", "PING") == "PONG"
