"""ITCH subscription workloads, as in the Camus evaluation (Jepsen et al., "Packet Subscriptions
for Programmable ASICs", HotNets 2018, section 5 and Figure 5), for ``examples/itch/spec.p4``.

* ``price`` (default): ``add_order.stock == S and <price predicate> : fwd(H)``.  S follows a Zipf
  law (exponent ``zipf_s``, default 1) over ``symbols`` symbols; each symbol has a mean price
  (log-normal, median $40); the price predicate is, with equal probability, ``price > P``,
  ``price < P`` or the range ``price >= P1 and price <= P2``, with P drawn from a normal
  distribution around the symbol's mean (standard deviation 5% of it) in whole cents; H is
  uniform over ports 1..``ports``.
* ``camus``: Camus's Figure 5c workload, ``add_order.stock == S and add_order.shares > P :
  fwd(H)`` with S uniform over ``symbols`` symbols, P uniform in 1..1000, H uniform in
  1..``ports``.
"""

from __future__ import annotations

import numpy as np

from .distributions import mean_prices, symbol_names, zipf_weights

FORMS = ("price", "camus")


def itch_rules(
    n: int, symbols: int = 100, ports: int = 32, seed: int = 1, form: str = "price", zipf_s: float = 1.0
) -> str:
    """The rule text (one rule per line, ``n`` lines) of workload ``form`` (see the module docstring).

    Raises ValueError for an unknown form or non-positive counts."""
    if form not in FORMS:
        raise ValueError(f"unknown ITCH workload form {form!r} (known: {', '.join(FORMS)})")
    if n < 0 or symbols < 1 or ports < 1:
        raise ValueError("rules must be >= 0, symbols and ports >= 1")
    rng = np.random.default_rng(seed)
    names = symbol_names(symbols)
    host = rng.integers(1, ports + 1, size=n)
    if form == "camus":
        sym = rng.integers(0, symbols, size=n)
        shares = rng.integers(1, 1001, size=n)
        return "".join(
            f'add_order.stock == "{names[s]}" and add_order.shares > {p} : fwd({h});\n'
            for s, p, h in zip(sym.tolist(), shares.tolist(), host.tolist())
        )
    means = mean_prices(symbols)
    sym = rng.choice(symbols, size=n, p=zipf_weights(symbols, zipf_s))
    kind = rng.integers(0, 3, size=n)
    a = np.maximum(1, np.round(rng.normal(means[sym], 0.05 * means[sym]) * 100)).astype(np.int64)
    b = np.maximum(1, np.round(rng.normal(means[sym], 0.05 * means[sym]) * 100)).astype(np.int64)
    lo, hi = np.minimum(a, b), np.maximum(a, b)
    lines = []
    for s, k, x, l_, h_, port in zip(sym.tolist(), kind.tolist(), a.tolist(), lo.tolist(), hi.tolist(), host.tolist()):
        if k == 0:
            cond = f"add_order.price > {x // 100}.{x % 100:02d}"
        elif k == 1:
            cond = f"add_order.price < {x // 100}.{x % 100:02d}"
        else:
            cond = f"add_order.price >= {l_ // 100}.{l_ % 100:02d} and add_order.price <= {h_ // 100}.{h_ % 100:02d}"
        lines.append(f'add_order.stock == "{names[s]}" and {cond} : fwd({port});\n')
    return "".join(lines)
