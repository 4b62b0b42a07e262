"""The address proof of ``subc serve``'s UDP control protocol (issue 40; docs/serve.md, "Address
proof"): a request whose source address is forged must get the victim one reply no larger than the
request and never a feed.

* Unit tests of the check (:class:`subc.serve.proof.AddressProof`, a fake clock, no sockets): the
  cookie of a source proves it for one to two periods of 120 s and for that (address, port) only;
  a valid ACL token proves a ``TO`` its grant covers; an unproven datagram gets at most one reply,
  never longer than itself (hypothesis draws datagrams of request lines, cookies good, stale,
  guessed and malformed, tokens and sizes); the parser takes the cookie off and keeps its columns.
* The real listener (:class:`subc.serve.network.RequestListener`) on loopback, without a data
  plane: the test plays the updater (it takes what the listener queues and replies).  Nothing
  from an unproven source is queued; with the cookie the request is; TCP needs none; the counters
  and the daemon's metrics count each event; the rate limit's complaint goes only to a proven
  source.
* In network namespaces (as tests/test_serve_netns.py): requests forged with a victim's source
  address (scapy, raw IP from the publisher's namespace) make the broker send the victim one reply
  line each, no larger than the request, and no delivery at all (the victim's own capture and the
  data plane's counters show it), while the subscriber that proves its address with the cookie is
  subscribed and receives its messages.

No verdict depends on time: the listener's replies and counters are waited for, with a hang guard.
"""

from __future__ import annotations

import ipaddress
import queue
import socket
import sys
import threading
import urllib.request

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from subc.ir.incremental import LiveDiagram
from subc.recovery.cookies import Cookies
from subc.serve.acl import Acl, Grant
from subc.serve.book import Live
from subc.serve.config import ServeConfig
from subc.serve.metrics import Metrics
from subc.serve.network import RequestListener
from subc.serve.proof import AddressProof
from subc.serve.protocol import COOKIE_REPLY_BYTES, MAX_LINE, parse_request, split_cookie
from subc.spec.front_end import load_spec

from conftest import EXAMPLE, ROOT

SPEC = load_spec(EXAMPLE / "spec.p4")
SRC = ("10.0.0.2", 6001)
HANG = 60.0


class Clock:
    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def token_acl() -> Acl:
    return Acl([Grant([ipaddress.IPv4Network("10.9.0.0/16")], token="s3cret"),
                Grant([ipaddress.IPv4Network("10.8.0.0/16")], source=ipaddress.IPv4Network("10.0.0.0/8"))])


def proof(clock: Clock | None = None, acl: Acl | None = None) -> AddressProof:
    return AddressProof(acl or token_acl(), Cookies(clock=clock or Clock()))


def with_cookie(line: bytes, cookie: bytes) -> bytes:
    return line + b" COOKIE " + cookie.hex().encode()


# -- the check (no sockets) -------------------------------------------------------------------


def test_an_unproven_request_gets_a_cookie_no_larger_than_itself():
    p = proof()
    req = b'SUBSCRIBE add_order.stock == "AAPL"'
    kept, answer = p.datagram([req], SRC, len(req))
    assert kept == [] and answer is not None
    word, hexa = answer.split()
    assert word == "COOKIE" and len(hexa) == 16 and int(hexa, 16) >= 0
    assert len(answer) + 1 == COOKIE_REPLY_BYTES == 24 <= len(req)
    assert p.counters == {"requests_unproven": 1, "cookies_sent": 1}
    # the cookie proves the source: the request is processed, its cookie taken off by the parser
    again = with_cookie(req, bytes.fromhex(hexa))
    kept, answer = p.datagram([again], SRC, len(again))
    assert kept == [again] and answer is None
    r = parse_request(again, SPEC)
    assert r.verb == "SUBSCRIBE" and r.text == 'add_order.stock == "AAPL"' and r.cookie == bytes.fromhex(hexa)
    assert p.counters["proven_cookie"] == 1


def test_a_request_shorter_than_the_cookie_gets_nothing():
    p = proof()
    for line, size in [(b"LIST", 4), (b"RENEW", 6), (b"UNSUBSCRIBE 12", 15), (b"LIST" + b" " * 19, 23)]:
        assert p.datagram([line], SRC, size) == ([], None)
    assert p.counters == {"requests_unproven": 4, "too_short_unproven": 4}
    kept, answer = p.datagram([b"LIST" + b" " * 20], SRC, 24)  # padded to 24 bytes: the cookie fits
    assert kept == [] and answer.startswith("COOKIE ") and len(answer) + 1 == 24


def test_ping_needs_no_cookie_and_its_pong_is_no_larger():
    p = proof()
    assert p.datagram([b"PING"], SRC, 4) == ([], None)  # "PONG\n" would be 5 bytes
    assert p.datagram([b"PING"], SRC, 5) == ([], "PONG")
    assert p.datagram([b"ping  "], SRC, 6) == ([], "PONG")
    assert p.counters == {"pings_unproven": 3, "too_short_unproven": 1}
    cookie = p.cookies.issue(SRC)
    line = with_cookie(b"PING", cookie)
    assert p.datagram([line], SRC, len(line)) == ([line], None)  # a proven PING: the listener answers it


def test_a_cookie_lives_one_to_two_periods_and_only_for_its_address():
    clock = Clock(1000.0)
    p = proof(clock)
    issued = clock.t
    cookie = p.cookies.issue(SRC)
    line = with_cookie(b"LIST", cookie)
    period = p.cookies.period_s
    assert period == 120.0
    next_epoch = (issued // period + 1) * period
    for t in (issued, next_epoch - 0.001, next_epoch, next_epoch + period - 0.001):  # this period and the next
        clock.t = t
        assert p.datagram([line], SRC, len(line)) == ([line], None), t
    for other in [("10.0.0.2", 6002), ("10.0.0.3", 6001)]:  # another port, another host: not proven
        kept, answer = p.datagram([line], other, len(line))
        assert kept == [] and answer == p.cookie_line(other) != p.cookie_line(SRC)
    clock.t = next_epoch + period  # two periods on: stale
    kept, answer = p.datagram([line], SRC, len(line))
    assert kept == [] and answer.startswith("COOKIE ") and answer != f"COOKIE {cookie.hex()}"
    assert p.counters["bad_cookie"] == 3 and p.counters["cookies_sent"] == 3
    fresh = with_cookie(b"LIST", bytes.fromhex(answer.split()[1]))
    assert p.datagram([fresh], SRC, len(fresh)) == ([fresh], None)


def test_guessed_and_malformed_cookies_prove_nothing():
    p = proof()
    for cookie in [b"COOKIE 0000000000000000", b"COOKIE 12", b"cookie zzzzzzzzzzzzzzzz", b"COOKIE " + b"a" * 17]:
        line = (b"RENEW " + cookie).ljust(24)
        kept, answer = p.datagram([line], SRC, len(line))
        assert kept == [] and answer.startswith("COOKIE "), cookie
    assert p.counters["bad_cookie"] == 4 and p.counters["requests_unproven"] == 4


def test_a_token_of_the_acl_proves_the_request():
    p = proof()
    good = b'SUBSCRIBE add_order.price > 1 TO 10.9.1.2:7000 TOKEN s3cret'
    assert p.datagram([good], ("192.0.2.1", 1), len(good)) == ([good], None)  # any source: the token is the proof
    assert p.counters == {"proven_token": 1}
    for bad in [b'SUBSCRIBE add_order.price > 1 TO 10.9.1.2:7000 TOKEN wrong',
                b'SUBSCRIBE add_order.price > 1 TO 10.7.1.2:7000 TOKEN s3cret',  # outside the token's grant
                b'SUBSCRIBE add_order.price > 1 TO 10.8.1.2:7000',  # a source grant: the source must prove itself
                b'LIST TO 10.9.1.2:7000 TOKEN s3cret']:
        kept, answer = p.datagram([bad], ("10.0.0.9", 1), len(bad))
        assert kept == [] and answer.startswith("COOKIE "), bad
    topic = b"SUB a/# WHERE t.prio > 1 TO 10.9.0.1:9 TOKEN s3cret"
    assert p.datagram([topic], SRC, len(topic)) == ([topic], None)


def test_a_datagram_of_many_unproven_lines_gets_one_reply():
    p = proof()
    cookie = p.cookies.issue(SRC)
    lines = [b"LIST", with_cookie(b"RENEW", cookie), b"PING", b"UNSUBSCRIBE 3", with_cookie(b"LIST", cookie)]
    size = len(b"\n".join(lines))
    kept, answer = p.datagram(lines, SRC, size)
    assert kept == [lines[1], lines[4]] and answer == p.cookie_line(SRC)
    assert p.counters["unproven_unanswered"] == 2 and p.counters["cookies_sent"] == 1
    kept, answer = p.datagram([b"PING", b"LIST"], SRC, 9)
    assert kept == [] and answer == "PONG"  # the first unproven line's reply, the only one


LINES = st.sampled_from([b"LIST", b"PING", b"RENEW", b"UNSUBSCRIBE 4", b'SUBSCRIBE add_order.price > 1',
                         b"SUBSCRIBE add_order.price > 1 TO 10.9.0.1:9 TOKEN s3cret", b"REGISTER a/b", b"", b"x" * 40])
COOKIES = st.sampled_from(["none", "good", "stale", "other", "guess", "malformed"])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(LINES, COOKIES, st.integers(0, 30)), min_size=1, max_size=6), st.integers(0, 3))
def test_no_unproven_datagram_gets_more_bytes_than_it_brought(items, shift):
    clock = Clock(5000.0)
    p = proof(clock)
    old = p.cookies.issue(SRC)
    clock.t += 240.0 + shift
    good, other = p.cookies.issue(SRC), p.cookies.issue(("10.0.0.2", 6002))
    lines = []
    for line, kind, pad in items:
        c = {"good": good, "stale": old, "other": other, "guess": bytes(8)}.get(kind)
        line = line + b" " * pad
        if c is not None:
            line = with_cookie(line, c)
        elif kind == "malformed":
            line += b" COOKIE 0x1"
        lines.append(line)
    data = b"\n".join(lines)
    lines = [ln for ln in data.split(b"\n") if ln.strip()]
    kept, answer = p.datagram(lines, SRC, len(data))
    proven = [ln for ln in lines
              if split_cookie(ln)[1] == good or (b"TOKEN s3cret" in ln and split_cookie(ln)[1] is None)]
    assert kept == proven
    if answer is not None:
        assert len(answer) + 1 <= len(data)
        assert answer == "PONG" or answer == p.cookie_line(SRC)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=80), st.binary(min_size=8, max_size=8), st.sampled_from([b" ", b"\t"]))
def test_the_parser_takes_the_cookie_off_and_keeps_its_columns(raw, cookie, sep):
    """Any line (request or not) with a cookie appended parses as the line alone: same request,
    or the same error at the same column; the cookie is the request's."""
    from subc.serve.protocol import ProtocolError

    def outcome(line: bytes):
        try:
            r = parse_request(line, SPEC)
        except ProtocolError as e:
            return ("error", e.column, e.message), None
        return ("ok", r.verb, r.text, r.to, r.token, r.sub_id, r.topic_text), r.cookie

    if raw != raw.rstrip() or not raw.strip() or split_cookie(raw)[1] is not None:
        return  # a line ending with white space (kept before the cookie) or with a cookie already
    line = raw + sep + b"COOKIE" + sep + cookie.hex().encode()
    assert split_cookie(line) == (raw, cookie)
    got, got_cookie = outcome(line)
    want, _ = outcome(raw)
    assert got == want
    assert got_cookie == (cookie if got[0] == "ok" else None)


def test_the_parser_reads_to_token_and_cookie_together():
    cookie = bytes(range(8))
    r = parse_request(with_cookie(b"SUBSCRIBE add_order.price > 5 TO 10.1.2.3:4000 TOKEN k", cookie), SPEC)
    assert (r.text, r.to, r.token, r.cookie) == ("add_order.price > 5", ("10.1.2.3", 4000), "k", cookie)
    assert parse_request(b"LIST cookie 0001020304050607  ", SPEC).cookie == cookie
    assert parse_request(b"LIST COOKIE 12", SPEC).cookie == b""
    assert parse_request(b"LIST", SPEC).cookie is None


# -- the listener on loopback (no data plane) -----------------------------------------------------


class Loopback:
    """A :class:`RequestListener` on 127.0.0.1 with a fake clock, in a thread; ``queue``: what it
    gives the updater (this test replies in the updater's place)."""

    def __init__(self, acl: Acl | None = None):
        order = list(SPEC.query_fields)
        self.clock = Clock(1000.0)
        cfg = ServeConfig(SPEC, "", ("127.0.0.1", 0), order, acl=acl or Acl())
        diagram = LiveDiagram([SPEC.query_fields[f] for f in order], [10_000] * len(order))
        self.metrics = Metrics()
        self.queue: queue.Queue = queue.Queue()
        self.stopping = threading.Event()
        self.listener = RequestListener(cfg, diagram, None, self.metrics, self.queue, self.stopping,
                                        Cookies(clock=self.clock), self.clock)
        self.port = self.listener.open()
        self.addr = ("127.0.0.1", self.port)
        self.thread = threading.Thread(target=self.listener.run, daemon=True)
        self.thread.start()

    def client(self) -> socket.socket:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind(("127.0.0.1", 0))
        s.settimeout(HANG)
        return s

    def ask(self, s: socket.socket, data: bytes) -> bytes:
        s.sendto(data, self.addr)
        return s.recv(65536)

    def pending(self):
        return self.queue.get(timeout=HANG)

    def metric(self, event: str) -> float:
        return self.metrics.registry.get_sample_value("subc_serve_address_proof_total", {"event": event}) or 0.0

    def close(self) -> None:
        self.stopping.set()
        self.thread.join(timeout=HANG)
        self.listener.close()
        self.metrics.close()


@pytest.fixture
def loop():
    lb = Loopback(Acl(requests_per_second=1000.0))
    yield lb
    lb.close()


def test_the_listener_queues_nothing_unproven_and_everything_proven(loop):
    s = loop.client()
    req = b'SUBSCRIBE add_order.stock == "AAPL" and add_order.price > 50\n'
    reply = loop.ask(s, req)
    assert reply.startswith(b"COOKIE ") and reply.endswith(b"\n") and len(reply) == 24 <= len(req)
    cookie = reply.split()[1].decode()
    assert loop.queue.empty()  # handled in the datagram's turn: nothing unproven is ever queued
    s.sendto(req.rstrip(b"\n") + f" COOKIE {cookie}\n".encode(), loop.addr)
    p = loop.pending()
    assert p.kind == "SUBSCRIBE" and p.source == s.getsockname() and p.region is not None
    assert p.req.text == 'add_order.stock == "AAPL" and add_order.price > 50' and p.req.to is None
    p.reply("SUBACK 1")  # the updater's reply goes to the proven source
    assert s.recv(100) == b"SUBACK 1\n"
    # a later request without the cookie gets a cookie again (nothing is remembered per source)
    assert loop.ask(s, b"UNSUBSCRIBE 1" + b" " * 12).startswith(b"COOKIE ")
    # a short one gets nothing: the PONG of the next datagram shows it was handled
    s.sendto(b"LIST", loop.addr)
    assert loop.ask(s, b"PING\n") == b"PONG\n"
    assert loop.queue.empty()
    c = loop.listener.counters
    assert (c["requests_unproven"], c["cookies_sent"], c["too_short_unproven"], c["proven_cookie"],
            c["pings_unproven"]) == (3, 2, 1, 1, 1)
    for event in ("requests_unproven", "cookies_sent", "too_short_unproven", "proven_cookie", "pings_unproven"):
        assert loop.metric(event) == c[event], event
    assert loop.metrics.registry.get_sample_value("subc_serve_requests_total",
                                                  {"verb": "any", "result": "unproven"}) == 4


def test_a_forged_source_cannot_use_a_cookie_sent_elsewhere(loop):
    attacker, victim = loop.client(), loop.client()
    cookie = loop.ask(attacker, b"LIST" + b" " * 20).split()[1]
    # the attacker's cookie from the victim's socket (as a forged source would present it)
    reply = loop.ask(victim, b"SUBSCRIBE add_order.price > 1 COOKIE " + cookie + b"\n")
    assert reply.startswith(b"COOKIE ") and reply.split()[1] != cookie
    assert loop.listener.counters["bad_cookie"] == 1 and loop.queue.empty()


def test_tcp_needs_no_cookie(loop):
    with socket.create_connection(loop.addr, timeout=HANG) as c:
        c.sendall(b'SUBSCRIBE add_order.price > 3 TO 127.0.0.1:5000\n')
        p = loop.pending()
        assert p.kind == "SUBSCRIBE" and p.req.to == ("127.0.0.1", 5000)
        p.reply("SUBACK 7")
        assert c.recv(100) == b"SUBACK 7\n"
    assert loop.listener.counters["requests_unproven"] == 0


def test_the_rate_limit_complains_only_to_a_proven_source():
    lb = Loopback(Acl(requests_per_second=2.0))  # the fake clock stands still: no token comes back
    try:
        s = lb.client()
        cookie = lb.ask(s, b"LIST" + b" " * 40).split()[1].decode()  # 1 of 2
        assert lb.ask(s, f"PING COOKIE {cookie}".encode()) == b"PONG\n"  # 2 of 2
        s.sendto(b"LIST" + b" " * 60, lb.addr)  # over the rate, unproven, long enough for a complaint
        reply = lb.ask(s, f"PING COOKIE {cookie}".encode())  # over the rate, proven
        assert reply.startswith(b"ERR rate limit: 2 requests per second"), reply
        assert lb.listener.counters["rate_limited"] == 2
    finally:
        lb.close()


def test_a_proven_list_amplifies_as_the_readme_says():
    """The worst LIST a proven source can ask for (docs/serve.md, README "UDP services and
    amplification"): as many subscriptions as the per-source limit, each with the longest condition
    a request can carry (made over TCP: no cookie), listed to a 28-byte ``LIST COOKIE <hex>``."""
    from subc.serve.acl import DEFAULT_SUBS_PER_SOURCE

    longest = "add_order.price >" + " " * (MAX_LINE - len("SUBSCRIBE add_order.price >1")) + "1"
    line = f"SUBSCRIBE {longest}".encode()
    assert len(line) == MAX_LINE
    r = parse_request(line, SPEC)
    live = Live(9_999_999, r.text, r.condition, ("255.255.255.255", 65535), 0, "255.255.255.255", None)
    per_line = len(live.listing()) + 1
    request = len(b"LIST COOKIE 0123456789abcdef")
    worst = (DEFAULT_SUBS_PER_SOURCE * per_line + len(f"END {DEFAULT_SUBS_PER_SOURCE}\n")) / request
    assert (per_line, request) == (4121, 28)
    assert round(worst / 1e6, 1) == 14.7
    typical = Live(1234, 'add_order.stock == "GOOGL" and add_order.price > 50', None, ("10.0.0.2", 6001), 0, "", None)
    assert len(typical.listing()) + 1 == 75
    assert round(DEFAULT_SUBS_PER_SOURCE * 75 / request, -3) == 268_000
    # the longest one-line reply to the shortest proven line: an error naming every request
    from subc.serve.protocol import ProtocolError

    blank = b" COOKIE 0123456789abcdef"
    with pytest.raises(ProtocolError) as e:
        parse_request(blank, SPEC)
    assert (len(e.value.reply("ERR")) + 1, len(blank)) == (94, 24)
    for doc in (ROOT / "README.md", ROOT / "docs" / "serve.md"):
        text = " ".join(doc.read_text().split())
        assert "4,121 bytes" in text and "14.7 million" in text and "268,000" in text and "94 bytes" in text, doc


# -- in network namespaces ------------------------------------------------------------------------


METRICS_PORT = 9477


def proof_metrics(topo) -> dict[str, float]:
    """The daemon's ``subc_serve_address_proof_total`` by event, read over HTTP in its namespace."""
    from netns_util import call_in_netns
    from prometheus_client.parser import text_string_to_metric_families

    text = call_in_netns(topo.brk, lambda: urllib.request.urlopen(
        f"http://127.0.0.1:{METRICS_PORT}/metrics", timeout=10).read().decode())
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "subc_serve_address_proof_total":
                out[s.labels["event"]] = s.value
    return out


def test_forged_subscribe_reflects_one_small_reply_and_no_feed(tmp_path):
    from netns_util import Topology, call_in_netns, need_root_and_netns, sh
    from test_serve_netns import PORT, SPEC_PATH, Agent, Broker, add_order, messages_counted, mold, wait_until

    from subc.dataplane.ebpf.broker_stats import stats

    need_root_and_netns()
    topo = Topology("ckf", 2)
    broker = None
    agents: list[Agent] = []
    try:
        acl = tmp_path / "acl.toml"
        acl.write_text('[limits]\nrequests_per_second = 100000\n\n'
                       '[[grant]]\ntoken = "letmein"\nto = ["10.10.1.0/24"]\n')
        broker = Broker(topo, tmp_path, SPEC_PATH, ("--acl", str(acl), "--metrics", f"127.0.0.1:{METRICS_PORT}"))
        broker.start()
        sub = Agent(topo, topo.subs[0], 6001)  # the subscriber, 10.10.1.2:6001
        victim = Agent(topo, topo.subs[1], None)  # the victim, 10.10.2.2:6002: records what arrives
        attacker = Agent(topo, topo.pub, 5000)  # in the publisher's namespace, 10.10.0.1
        agents += [sub, victim, attacker]
        victim.cmd("capture 6002")
        assert victim.next_reply("capturing") == 6002
        # the attacker proves its own address: it has a cookie, to try with the victim's
        attacker.cmd(f"req 10.10.0.2 {PORT} RENEW 0")
        own_cookie = attacker.next_reply("cookie")
        assert attacker.next_reply() == "RENEWACK 0"
        before = proof_metrics(topo)
        cond = 'add_order.stock == "AAPL"'
        forged = [f"SUBSCRIBE {cond}".encode(),
                  f"SUBSCRIBE {cond} COOKIE 0123456789abcdef".encode(),  # guessed
                  f"SUBSCRIBE {cond} COOKIE {own_cookie}".encode(),  # another address's
                  f"SUBSCRIBE {cond} TO 10.10.2.2:6002 TOKEN wrong".encode(),
                  f"SUBSCRIBE {cond} TO 10.10.2.2:6002 TOKEN letmein".encode(),  # outside the token's grant
                  f"LIST COOKIE {own_cookie}".encode(),
                  b"LIST" + b" " * 20,
                  b"LIST",  # shorter than a cookie: nothing
                  b"RENEW 1",  # likewise
                  b"PING\n"]  # PONG: no larger
        answered = [f for f in forged if f not in (b"LIST", b"RENEW 1")]
        code = (
            "from scapy.all import IP, UDP, Raw, send\n"
            f"ps = [bytes.fromhex(h) for h in {[f.hex() for f in forged]!r}]\n"
            f"send([IP(src='10.10.2.2', dst='10.10.0.2') / UDP(sport=6002, dport={PORT}) / Raw(p) for p in ps],"
            " verbose=False)\n"
        )
        sh(*topo.in_ns(topo.pub, sys.executable, "-c", code))

        def delta() -> dict[str, float]:
            now = proof_metrics(topo)
            return {k: now.get(k, 0) - before.get(k, 0) for k in set(now) | set(before)}

        wait_until(lambda: delta().get("requests_unproven", 0) + delta().get("pings_unproven", 0) >= len(forged),
                   "the broker to count the forged requests")
        got = [victim.next_reply("datagram") for _ in answered]  # each sent before it was counted
        d = delta()
        assert (d["requests_unproven"], d["pings_unproven"], d["too_short_unproven"], d["bad_cookie"],
                d["cookies_sent"], d.get("proven_cookie", 0), d.get("proven_token", 0)) == \
            (len(forged) - 1, 1, 2, 3, len(answered) - 1, 0, 0), d
        # the subscriber proves its address (the agent's cookie exchange) and subscribes
        sub.cmd(f"req 10.10.1.1 {PORT} SUBSCRIBE {cond}")
        assert len(sub.next_reply("cookie")) == 16
        r = sub.next_reply()
        assert r.startswith("SUBACK "), r
        assert delta()["proven_cookie"] == 1
        assert sub.request("10.10.1.1", "LIST") == f"SUB {r.split()[1]} 10.10.1.2:6001 {cond}"
        assert sub.next_reply() == "END 1"
        refs = list(range(1, 31))
        for i in range(0, 30, 3):  # the publisher's namespace sends the feed
            msgs = [add_order(ref, "AAPL" if ref % 2 else "MSFT", 100, 10, "B") for ref in refs[i:i + 3]]
            attacker.cmd(f"send 10.10.0.2 26400 {mold(1 + i, msgs).hex()}")
            assert attacker.next_reply("sent")
        wait_until(lambda: messages_counted(topo) >= 30, "the broker to count every message")
        want = [ref for ref in refs if ref % 2]
        wait_until(lambda: sorted(sub.refs()) == want, "the subscriber's messages")
        st = call_in_netns(topo.brk, lambda: stats(topo.b0))
        sent_to = {c["name"] for k, c in st["subscribers"].items() if k.isdigit() and c["datagrams"]}
        assert sent_to == {"10.10.1.2:6001"}, st["subscribers"]  # the data plane sent the victim nothing
        assert st["subscriptions"] == 1
        # the victim's view: one line per answered forged request, no larger than it, and nothing else
        for (_, sport, hexdata), req in zip(got, answered):
            data = bytes.fromhex(hexdata)
            assert sport == PORT and len(data) <= len(req), (data, req)
            if req.startswith(b"PING"):
                assert data == b"PONG\n"
            else:
                assert data.startswith(b"COOKIE ") and len(data) == 24, data
        assert victim.replies.empty(), victim.replies.get()
    finally:
        if broker is not None:
            broker.stop()
        for a in agents:
            a.close()
        topo.remove()
