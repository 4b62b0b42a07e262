"""Per-source request rates, shared by the services that answer the network (``subc serve``'s
control protocol, the MoldUDP64 request server): a token bucket per source address."""

from __future__ import annotations

import time


class RateLimiter:
    """Token buckets per source address: ``rate`` requests per second, burst ``rate``; ``clock``
    in seconds."""

    def __init__(self, rate: float, clock=time.monotonic):
        self.rate, self.clock = rate, clock
        self.buckets: dict[str, tuple[float, float]] = {}

    def allow(self, source: str) -> bool:
        now = self.clock()
        tokens, last = self.buckets.get(source, (self.rate, now))
        tokens = min(self.rate, tokens + (now - last) * self.rate)
        if tokens < 1.0:
            self.buckets[source] = (tokens, now)
            return False
        self.buckets[source] = (tokens - 1.0, now)
        if len(self.buckets) > 100_000:  # forget the idle (full) buckets
            self.buckets = {k: v for k, v in self.buckets.items() if v[0] < self.rate}
        return True
