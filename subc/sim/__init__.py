"""Simulation: the compiled tables run in software (SwitchSimulator, TableSimulator) and traces run
through them against the reference semantics.
"""
