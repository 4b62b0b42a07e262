"""``subc serve``: the broker daemon whose subscribers come and go (protocol, store, daemon)."""
