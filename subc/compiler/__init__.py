"""The compiler: the spec and rule front ends, slicing, the IR and the targets' lowerings.

``spec.py`` + ``p4_14.py`` (-> ``spec_model.py``) and ``rules.py`` (-> ``ast.py``) -> ``layered.py``
(slicing into one stage per field) -> ``ir.py`` (the target-neutral IR, with ``decisions.py``) ->
``tables.py`` (P4 match-action tables) and ``targets/`` (P4 programs and entries, eBPF maps and
program); ``driver.py`` runs the chain and ``costs.py`` chooses the field order.
"""
