"""Which live broker delivers to an endpoint: rendezvous (highest random weight) hashing.

Thaler and Ravishankar, "Using name-based mappings to increase hit rates", IEEE/ACM ToN 6(1),
1998: every member scores every key with a hash of (member, key); the highest score owns the key.
Every broker computes the same owner from the same member set, with no coordination, and when a
member leaves only the keys it owned move (each to the member with the next-highest score); when
one joins, only the keys it now wins move to it.
"""

from __future__ import annotations

import hashlib
from typing import Iterable


def score(member: str, key: str) -> int:
    """The weight of ``member`` for ``key``: the first 8 bytes of BLAKE2b(member NUL key), as an
    unsigned big-endian integer."""
    h = hashlib.blake2b(member.encode() + b"\0" + key.encode(), digest_size=8).digest()
    return int.from_bytes(h, "big")


def owner(key: str, members: Iterable[str]) -> str | None:
    """The member of ``members`` that owns ``key`` (ties, which need equal 64-bit hashes, go to
    the smaller name), or None when there is no member."""
    best: tuple[int, str] | None = None
    for m in members:
        s = (score(m, key), m)
        if best is None or s[0] > best[0] or (s[0] == best[0] and m < best[1]):
            best = s
    return None if best is None else best[1]
