"""Data planes: the eBPF broker in the kernel (dataplane.ebpf), a switch over P4Runtime
(dataplane.p4rt), and the live broker that writes an incremental diagram into either.
"""
