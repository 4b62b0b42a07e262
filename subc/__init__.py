"""subc: a packet-subscription compiler (rules -> BDD -> match-action tables -> P4 / eBPF)."""

__version__ = "0.1.0"
