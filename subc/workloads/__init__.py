"""Deterministic workload generators (``subc gen``): ITCH rule sets, Siena-style rule sets and
synthetic ITCH 5.0 BinaryFILE traces.  The same seed gives byte-identical output."""
