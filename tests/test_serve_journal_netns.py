"""``subc serve --journal``: the live broker journals every copy, answers MoldUDP64 re-requests,
and serves SoupBinTCP users whose subscriptions come as Unsequenced Data, in network namespaces.

Add Orders are built here with ``struct`` (test_serve_netns's helpers) and sent from the publisher
namespace; what each stream must hold is the conditions evaluated by the AST evaluator on the
values the messages were built from.  The SoupBinTCP client is written with ``struct``
(test_journal_netns's).  Checked:

* a ``--rules`` subscription ``TO soup:alice`` and one alice makes over her SoupBinTCP session
  (``SUBSCRIBE`` as Unsequenced Data, ``SUBACK`` back the same way): alice's login at 1 gets
  exactly the messages of both (from the SUBACK on for the second), in order, backfill then live;
  a wrong password gets ``A``;
* a UDP endpoint's stream (a ``--rules`` subscription) is in its journal: a re-request from the
  endpoint's address, proven with the cookie, gets its first messages.

No verdict depends on speed: the test waits for replies, counters and packets.
"""

from __future__ import annotations

import json
import random
import struct
import sys

import pytest

from subc.lang.ast import evaluate
from subc.lang.rules import parse_rules

from netns_util import Topology, need_root_and_netns, sh
from test_journal_netns import SoupClient
from test_serve_netns import SPEC, Agent, Broker, add_order, messages_counted, mold, values_of, wait_until

RR_PORT, SOUP_PORT = 9100, 9200

REREQUEST = r"""
import json, socket, struct
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("10.10.1.2", 6002))
s.settimeout(30)
req = struct.pack(">10sQH", b"LIVETEST01", 1, 5)
s.sendto(req, ("10.10.1.1", %d))
cookie, _ = s.recvfrom(2048)
s.sendto(req + cookie[10:18], ("10.10.1.1", %d))
answer, _ = s.recvfrom(2048)
print(json.dumps([cookie.hex(), answer.hex()]))
"""


@pytest.fixture
def topo():
    need_root_and_netns()
    t = Topology("sjs", 2)
    yield t
    t.subc(t.brk, "unload", "--iface", t.b0, check=False)
    t.remove()


def test_serve_journal_soup_users_and_rerequests(topo, tmp_path):
    rules = tmp_path / "rules.txt"
    rules.write_text('add_order.stock == "AAPL" TO soup:alice\nadd_order.shares == 100 TO 10.10.1.2:6002\n')
    acl = tmp_path / "acl.toml"
    acl.write_text('[[login]]\nuser = "alice"\npassword = "pw"\n')
    broker = Broker(topo, tmp_path, args=("--rules", str(rules), "--acl", str(acl), "--journal",
                                          "--rerequest", f"0.0.0.0:{RR_PORT}", "--soup", f"0.0.0.0:{SOUP_PORT}"))
    broker.start()
    pub = Agent(topo, topo.pub, None)
    alice = bad = None
    rng = random.Random(4)
    cond_aapl = parse_rules('add_order.stock == "AAPL" : fwd(0);', SPEC, "t")[0].condition
    cond_msft = parse_rules('add_order.stock == "MSFT" : fwd(0);', SPEC, "t")[0].condition
    cond_100 = parse_rules("add_order.shares == 100 : fwd(0);", SPEC, "t")[0].condition
    want_alice: list[bytes] = []
    want_6002: list[bytes] = []
    state = {"seq": 1, "ref": 1, "sent": 0}

    def send(n: int, msft: bool) -> None:
        for _ in range(n):
            msgs = []
            for _ in range(rng.randint(1, 4)):
                stock, shares = rng.choice(["AAPL", "MSFT", "GOOG"]), rng.choice([1, 100, 500])
                m = add_order(state["ref"], stock, 1000000, shares, "B")
                v = values_of(stock, 1000000, shares, "B")
                if evaluate(cond_aapl, v) or (msft and evaluate(cond_msft, v)):
                    want_alice.append(m)
                if evaluate(cond_100, v):
                    want_6002.append(m)
                msgs.append(m)
                state["ref"] += 1
            pub.cmd(f"send 10.10.0.2 26400 {mold(state['seq'], msgs).hex()}")
            assert pub.next_reply("sent")
            state["seq"] += len(msgs)
            state["sent"] += len(msgs)

    try:
        send(30, msft=False)
        wait_until(lambda: messages_counted(topo) >= state["sent"], "the broker to count every message")
        bad = SoupClient(topo, 2)
        assert bad.login("alice", "nope", 1) == (b"J", b"A")
        alice = SoupClient(topo, 2)
        kind, accepted = alice.login("alice", "pw", 1)
        assert kind == b"A" and int(accepted[10:]) == 1
        body = b'USUBSCRIBE add_order.stock == "MSFT"'
        alice.sock.sendall(struct.pack(">H", len(body)) + body)
        got: list[bytes] = []
        while True:  # backfill and the SUBACK, in whatever order the server sends them
            kind, payload = alice.packet()
            if kind == b"S":
                got.append(payload)
            elif kind == b"U":
                assert payload.startswith(b"SUBACK "), payload
                break
        send(30, msft=True)
        got += alice.messages(len(want_alice) - len(got))
        out = sh(*topo.in_ns(topo.subs[0], sys.executable, "-c", REREQUEST % (RR_PORT, RR_PORT))).stdout
        cookie, answer = (bytes.fromhex(h) for h in json.loads(out))
    finally:
        for c in (alice, bad):
            if c is not None:
                c.sock.close()
        pub.close()
        broker.stop()
    assert got == want_alice  # the rules' subscription and her own, once each, in order
    assert len(cookie) == 20 and cookie[18:20] == b"\xff\xfe"
    session, seq, count = struct.unpack_from(">10sQH", answer)
    assert (session, seq, count) == (b"LIVETEST01", 1, 5)
    msgs, at = [], 20
    while at < len(answer):
        (n,) = struct.unpack_from(">H", answer, at)
        msgs.append(answer[at + 2 : at + 2 + n])
        at += 2 + n
    assert msgs == want_6002[:5]
