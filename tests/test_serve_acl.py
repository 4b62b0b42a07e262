"""The ACL file of ``subc serve`` (subc/serve/acl.py): grants, limits and SoupBinTCP logins."""

from __future__ import annotations

import pytest

from subc.errors import SubcError
from subc.serve.acl import load_acl

ACL = """
[limits]
subscriptions_per_source = 10
requests_per_second = 50

[[grant]]
source = "10.10.0.0/16"
to = ["10.20.0.0/16"]

[[grant]]
token = "t0k"
to = ["192.0.2.0/24"]

[[login]]
user = "alice"
password = "s3cret"

[[login]]
user = "bob"
password = "pw"
"""


def test_grants_limits_and_logins(tmp_path):
    p = tmp_path / "acl.toml"
    p.write_text(ACL)
    acl = load_acl(p)
    assert (acl.subs_per_source, acl.requests_per_second) == (10, 50.0)
    assert acl.check_login("alice", "s3cret") and acl.check_login("bob", "pw")
    assert not acl.check_login("alice", "pw") and not acl.check_login("carol", "s3cret")
    assert acl.may_send_to("10.10.1.2", "10.20.3.4", None)  # a source grant
    assert not acl.may_send_to("10.11.1.2", "10.20.3.4", None)
    assert acl.may_send_to("10.11.1.2", "192.0.2.9", "t0k") and not acl.may_send_to("10.11.1.2", "192.0.2.9", "x")
    # a SoupBinTCP user's stream is no address: only a token grant lets it name another endpoint
    assert not acl.may_send_to("soup:alice", "10.20.3.4", None)
    assert acl.may_send_to("soup:alice", "192.0.2.9", "t0k")
    assert acl.may_send_to("soup:alice", "soup:alice", None)


@pytest.mark.parametrize(
    "login, message",
    [
        ('user = "toolong7"\npassword = "x"', "login 1: 'user' \\(1 to 6\\)"),
        ('user = "a b"\npassword = "x"', "login 1: 'user' \\(1 to 6\\)"),
        ('user = "al"\npassword = "elevenchars"', "login 1: 'user' \\(1 to 6\\)"),
        ('user = "al"', "login 1: 'user' \\(1 to 6\\)"),
        ('user = "al"\npassword = "x"\n[[login]]\nuser = "al"\npassword = "y"', "login 2: user 'al' appears twice"),
    ],
)
def test_a_bad_login_is_refused_naming_it(tmp_path, login, message):
    p = tmp_path / "acl.toml"
    p.write_text(f"[[login]]\n{login}\n")
    with pytest.raises(SubcError, match=message) as e:
        load_acl(p)
    assert str(p) in str(e.value)
