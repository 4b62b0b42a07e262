"""The eBPF broker's subscribers file (subc/dataplane/ebpf/subscribers.py): endpoints, SoupBinTCP
logins, and a clear error naming the file and the entry for every malformed one."""

from __future__ import annotations

import pytest

from subc.dataplane.ebpf.subscribers import SoupLogin, parse_subscribers
from subc.errors import SubcError

GOOD = """
[[subscriber]]
id = 1
name = "desk-1"
endpoints = [{ ip = "10.10.1.2", port = 5001, mac = "02:00:0A:0A:01:02", iface = "b1" }]

[[subscriber]]
id = 6
soup = { user = "alice", password = "s3cret" }

[[subscriber]]
id = 7
soup = { user = "bob", password = "pw" }
endpoints = [{ ip = "10.10.2.2", port = 5002, mac = "02:00:0a:0a:02:02", iface = "b2" }]

[[subscriber]]
id = 8
"""


def test_endpoints_and_soup_logins():
    subs = parse_subscribers(GOOD, "subs.toml")
    assert [(e.subscriber, e.ip, e.port, e.mac, e.iface) for e in subs.endpoints] == [
        (1, "10.10.1.2", 5001, "02:00:0a:0a:01:02", "b1"),
        (7, "10.10.2.2", 5002, "02:00:0a:0a:02:02", "b2"),
    ]
    assert subs.soup == {6: SoupLogin("alice", "s3cret"), 7: SoupLogin("bob", "pw")}
    assert subs.journal_only == [6]  # a login and no endpoint: journaled, not sent
    assert [s for s in (1, 6, 7, 8) if subs.receives(s)] == [1, 6, 7]  # 8: no endpoint, no login
    assert subs.names == {1: "desk-1"}


@pytest.mark.parametrize(
    "entry, message",
    [
        ('id = 1\nsoup = "alice"', "'soup' must be a table"),
        ('id = 1\nsoup = { user = "alice" }', "'soup' must be a table"),
        ('id = 1\nsoup = { user = "toolong7", password = "x" }', "soup 'user' must be 1 to 6"),
        ('id = 1\nsoup = { user = "a b", password = "x" }', "soup 'user' must be 1 to 6"),
        ('id = 1\nsoup = { user = "al", password = "elevenchars" }', "soup 'password' must be 1 to 10"),
        ('id = 1\nsoup = { user = "al", password = "" }', "soup 'password' must be 1 to 10"),
        ('id = 1\nsoup = { user = "al", password = "x", extra = 1 }', "'soup' must be a table"),
    ],
)
def test_a_bad_soup_login_is_refused_with_its_entry(entry, message):
    with pytest.raises(SubcError, match=message) as e:
        parse_subscribers(f"[[subscriber]]\n{entry}\n", "subs.toml")
    assert "subs.toml: error: subscriber #1 (id 1)" in str(e.value)


def test_a_soup_user_appears_once():
    text = '[[subscriber]]\nid = 1\nsoup = { user = "al", password = "x" }\n' \
           '[[subscriber]]\nid = 2\nsoup = { user = "al", password = "y" }\n'
    with pytest.raises(SubcError, match="soup user 'al' appears twice"):
        parse_subscribers(text, "subs.toml")
