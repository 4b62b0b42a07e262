"""Sampling helpers shared by the generators (NumPy ``Generator``, seeded)."""

from __future__ import annotations

import numpy as np


def zipf_weights(n: int, s: float = 1.0) -> np.ndarray:
    """Probabilities of ranks 1..n under a Zipf law with exponent ``s``: p(k) proportional to 1/k^s."""
    w = 1.0 / np.arange(1, n + 1, dtype=np.float64) ** s
    return w / w.sum()


def symbol_names(n: int, rng: np.random.Generator) -> list[str]:
    """``n`` distinct ticker-like symbols of 2 to 5 upper-case letters, in a seeded random order."""
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


def mean_prices(n: int, rng: np.random.Generator) -> np.ndarray:
    """Per-symbol mean prices in dollars: log-normal around $40 (median), clipped to $1..$2,000."""
    return np.clip(np.exp(rng.normal(np.log(40.0), 1.0, size=n)), 1.0, 2000.0)
