"""Back ends: the IR lowered to a target's files.

``p4/`` (match-action tables, v1model and TNA programs, P4Info, control-plane entries) and
``ebpf/`` (BPF map contents and the XDP + TC program); :mod:`.files` gives every output file of a
compilation for its target, :mod:`.output` writes them atomically.
"""
