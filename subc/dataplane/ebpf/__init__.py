"""The eBPF data plane: bcc loading, BPF maps, pinning and attaching (XDP link, TC), the broker's home
per network namespace, map installation, live map writes, XDP fan-out, links and subscribers.
"""
