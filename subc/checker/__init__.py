"""``subc check``: rule-set validation for CI (diagnostics, analyses on BDDs, target fit)."""
