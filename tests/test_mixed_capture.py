"""Captures as they come, through ``subc simulate`` and ``subc analyze``: a feed on another UDP port
than the spec's (as Nasdaq TotalView's 26477), a router's HSRP frames, ARP, VLAN-tagged feed
datagrams, many messages per datagram, a zeroed MoldUDP64 session, a datagram whose message count
disagrees with its bytes, and a foreign ITCH dialect whose Add Order has another length.  Frames
and messages that are not the spec's are counted by kind, never decoded into values; ``--strict``
makes them fatal (exit 2).  Expected deliveries come from the rules evaluated on the messages'
values as the ITCH codec of the workloads encodes them (not from subc's decoder)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import EXAMPLE, real_sample
from subc.workloads.itch_codec import decode_add_order, read_binaryfile
from subc.wire.moldudp64 import encode_packet

RULES = EXAMPLE / "rules.sub"
SPEC = EXAMPLE / "spec.p4"
FEED_PORT = 26477  # the spec says 26400: the feed port is detected from the capture


def expected_ports(msgs: list[bytes]) -> dict[str, int]:
    """Per port: Add Orders the example rules send there (the rules written out in Python)."""
    ports: dict[int, int] = {}
    for m in msgs:
        if m[:1] not in (b"A", b"F"):
            continue
        d = decode_add_order(m)
        sym = d["add_order.stock"].to_bytes(8, "big").decode().rstrip()
        shares, price, side = d["add_order.shares"], d["add_order.price"] / 10_000, chr(d["add_order.buy_sell_indicator"])
        hits = {1: sym == "BOB", 2: shares >= 1000, 3: sym == "CHAR" and (side == "B" and price < 10 or shares >= 500),
                4: sym == "ALC" and 20 <= price <= 25, 5: sym in ("BOB", "CHAR", "ALC") and shares < 100}
        for p, hit in hits.items():
            ports[p] = ports.get(p, 0) + hit
    return {str(p): n for p, n in sorted(ports.items()) if n}


@pytest.fixture(scope="module")
def capture(tmp_path_factory):
    from scapy.layers.hsrp import HSRP
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import ARP, Dot1Q, Ether
    from scapy.utils import wrpcap

    msgs = [m for _, m in read_binaryfile(real_sample())][:600]
    frames, good, seq = [], [], 1
    eth = Ether(src="00:00:5e:00:01:01", dst="01:00:5e:00:00:02")
    for k in range(0, len(msgs), 38):  # 38 messages per datagram, as a captured packet at the open
        batch = msgs[k : k + 38]
        session = b"\x00" * 10 if k == 38 else b"TOTALVIEW1"
        pkt = IP(src="10.1.1.1", dst="233.54.12.1") / UDP(sport=40000, dport=FEED_PORT) / encode_packet(session, seq, batch)
        frames.append(Ether() / Dot1Q(vlan=12) / pkt if k == 76 else Ether() / pkt)
        good.extend(batch)
        seq += len(batch)
        frames.append(eth / IP(src="10.1.1.2", dst="224.0.0.2") / UDP(sport=1985, dport=1985) / HSRP())
        frames.append(eth / IP(src="10.1.1.3", dst="10.9.9.9") / UDP(sport=5, dport=7) / bytes(20))  # a "heartbeat"
    frames.append(Ether() / ARP())
    bad = encode_packet("TOTALVIEW1", seq, msgs[:3])
    frames.append(Ether() / IP() / UDP(dport=FEED_PORT) / (bad[:18] + b"\x00\x05" + bad[20:]))  # count 5, 3 blocks
    asx = [b"A" + bytes(29), b"A" + bytes(46)]  # Add Orders of another dialect: 30 and 47 bytes
    frames.append(Ether() / IP() / UDP(dport=FEED_PORT) / encode_packet("ASX0000001", seq, asx))
    path = tmp_path_factory.mktemp("cap") / "mixed.pcap"
    wrpcap(str(path), frames)
    return path, good, len(frames)


def run(*args):
    return subprocess.run([sys.executable, "-m", "subc.cli", *map(str, args)], capture_output=True, text=True)


def test_simulate_counts_foreign_frames_and_never_decodes_them(capture):
    path, good, n_frames = capture
    p = run("simulate", RULES, "--spec", SPEC, "--trace", path, "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    cap = doc["capture"]
    n_feed = (len(good) + 37) // 38
    assert cap["frames"] == n_frames
    assert cap["other_udp"] == 2 * n_feed and cap["not_ip"] == 1  # HSRP and zeros, ARP
    assert cap["malformed_moldudp64"] == 1 and cap["feed_datagrams"] == n_feed + 2
    assert doc["messages"] == len(good) + 2
    assert doc["problems"] == {"length_mismatch": 2}
    assert doc["classified"] == sum(m[:1] in (b"A", b"F") for m in good)
    assert doc["per_port"] == expected_ports(good) and doc["disagreements"] == 0
    # delivery semantics: one copy per port per datagram holding any message for it
    copies: dict[str, int] = {}
    for k in range(0, len(good), 38):
        for port in expected_ports(good[k : k + 38]):
            copies[port] = copies.get(port, 0) + 1
    assert doc["copies_per_port"] == dict(sorted(copies.items()))
    assert sum(copies.values()) < sum(expected_ports(good).values())  # datagrams carry several messages


def test_simulate_strict_fails_on_the_first_foreign_frame(capture):
    p = run("simulate", RULES, "--spec", SPEC, "--trace", capture[0], "--strict")
    assert p.returncode == 2 and "frame 2" in p.stderr, p.stderr


def test_analyze_counts_the_same(capture, tmp_path):
    path, good, n_frames = capture
    p = run("analyze", RULES, "--spec", SPEC, "--trace", path, "-o", tmp_path / "a", "--json", "--master", "local[1]")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["messages"] == len(good) + 2 and doc["problems"] == {"length_mismatch": 2}
    assert doc["classified"] == sum(m[:1] in (b"A", b"F") for m in good)
    assert doc["capture"]["other_udp"] == 2 * ((len(good) + 37) // 38) and doc["capture"]["malformed_moldudp64"] == 1
    assert doc["capture"]["feed_ports"] == {str(path): [FEED_PORT]}
    assert doc["disagreements"] == 0
    import pandas as pd

    subs = pd.read_parquet(tmp_path / "a" / "subscribers.parquet")
    assert {str(k): int(v) for k, v in zip(subs["subscriber"], subs["messages"]) if v} == expected_ports(good)
    rows = pd.read_parquet(tmp_path / "a" / "messages.parquet")
    assert set(rows["type"]) <= {"A", "F"} and (rows["length"] >= 36).all()  # no garbage rows


def test_replay_checks_messages_against_the_spec(capture):
    """``subc replay --spec`` sends the capture as captured and counts the messages the spec cannot
    decode (the foreign dialect's two Add Orders)."""
    import socket

    path, good, _ = capture
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sink:  # a bound port on loopback
        sink.bind(("127.0.0.1", 0))
        port = sink.getsockname()[1]
        p = run("replay", path, "--to", f"127.0.0.1:{port}", "--max", "--spec", SPEC, "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["not_decoded"] == {"length_mismatch": 2}
    assert doc["messages"] == len(good) + 2
