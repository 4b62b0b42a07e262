"""Sampling helpers shared by the generators (NumPy ``Generator``, seeded)."""

from __future__ import annotations

import numpy as np


def zipf_weights(n: int, s: float = 1.0) -> np.ndarray:
    """Probabilities of ranks 1..n under a Zipf law with exponent ``s``: p(k) proportional to 1/k^s."""
    w = 1.0 / np.arange(1, n + 1, dtype=np.float64) ** s
    return w / w.sum()


#: Seed of the symbol names: every generator uses the same names, so rule sets and traces made with
#: the same number of symbols (or more) refer to the same stocks, most popular first.
SYMBOL_SEED = 20181115


def symbol_names(n: int) -> list[str]:
    """``n`` distinct ticker-like symbols of 2 to 5 upper-case letters; the names for ``n`` are the
    first ``n`` of the names for any larger count (:data:`SYMBOL_SEED`)."""
    rng = np.random.default_rng(SYMBOL_SEED)
    out: list[str] = []
    seen: set[str] = set()
    letters = np.frombuffer(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ", dtype=np.uint8)
    while len(out) < n:
        k = int(rng.integers(2, 6))
        name = letters[rng.integers(0, 26, size=k)].tobytes().decode()
        if name not in seen:
            seen.add(name)
            out.append(name)
    return out


def mean_prices(n: int) -> np.ndarray:
    """Mean price in dollars of each of the first ``n`` symbols of :func:`symbol_names`: log-normal
    around $40 (median), clipped to $1..$2,000; fixed like the names, so traces and rule sets agree."""
    rng = np.random.default_rng(SYMBOL_SEED + 1)
    return np.clip(np.exp(rng.normal(np.log(40.0), 1.0, size=n)), 1.0, 2000.0)
