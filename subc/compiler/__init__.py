"""The compiler's driver: spec + rules -> IR in the chosen field order -> a target's lowering.

:mod:`.driver` runs the chain (:mod:`subc.lang`, :mod:`subc.spec` -> :mod:`subc.ir` ->
:mod:`subc.backends`) and searches the field order under :mod:`.costs`, each back end's cost
model; :mod:`.target` names the targets.
"""
