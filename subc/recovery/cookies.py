"""Server cookies that prove a UDP source receives at its address (as DNS cookies do, RFC 7873
section 4.2, and QUIC's Retry token): the cookie of a source address is a keyed hash of the
address under a secret that changes every ``period_s`` seconds; a cookie made under the current
or the previous secret is accepted, so a cookie lives between one and two periods.  Only a host
that received the cookie at the address can present it."""

from __future__ import annotations

import hashlib
import hmac
import os
import time
from typing import Callable

COOKIE_BYTES = 8


class Cookies:
    """Cookies for source addresses ((host, port)); ``clock`` in seconds."""

    def __init__(self, period_s: float = 120.0, clock: Callable[[], float] = time.monotonic):
        self.period_s, self.clock = period_s, clock
        self._secrets: dict[int, bytes] = {}

    def _secret(self, epoch: int) -> bytes:
        if epoch not in self._secrets:
            self._secrets = {e: s for e, s in self._secrets.items() if e >= epoch - 1}
            self._secrets[epoch] = os.urandom(32)
        return self._secrets[epoch]

    def _mac(self, epoch: int, addr: tuple[str, int]) -> bytes:
        msg = f"{addr[0]}|{addr[1]}".encode()
        return hmac.new(self._secret(epoch), msg, hashlib.sha256).digest()[:COOKIE_BYTES]

    def issue(self, addr: tuple[str, int]) -> bytes:
        """The cookie of ``addr`` now (8 bytes)."""
        return self._mac(int(self.clock() // self.period_s), addr)

    def check(self, addr: tuple[str, int], cookie: bytes | None) -> bool:
        """Whether ``cookie`` was issued to ``addr`` in this period or the one before."""
        if cookie is None or len(cookie) != COOKIE_BYTES:
            return False
        epoch = int(self.clock() // self.period_s)
        return any(hmac.compare_digest(self._mac(e, addr), cookie) for e in (epoch, epoch - 1) if e in self._secrets)
