"""The eBPF back end: BPF map contents (maps.json), the program (static C in bpf/ plus two generated
headers), the parse plan and the map value layouts.
"""
