"""The P4 back end: match-action tables, programs for v1model (BMv2) and TNA (Tofino) from Jinja
templates, multi-message slots, registers for state, P4Info and control-plane entries.
"""
