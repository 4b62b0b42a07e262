"""Target back ends: P4 programs (v1model, TNA), control-plane entries, reports."""
