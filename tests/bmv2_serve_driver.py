"""Traffic through ``simple_switch_grpc`` while ``subc serve --p4runtime`` subscribes and unsubscribes.

Run by tests/test_bmv2_p4runtime.py inside the network namespace it made (``ip netns exec``), as
tests/bmv2_p4rt_driver.py is (the same veths, :class:`Receiver` and send numbers).  It starts
``subc serve --p4runtime`` on the namespace's loopback with the program, device config and port
map the test made; subscribers are UDP sockets on 127.0.0.1, .2 and .3 (the port map puts them
behind switch ports 1, 2 and 3).  First each subscribes to the sentinel message (``--sentinel``
condition), so that every port receives the sentinel packet and a batch is done when it arrived
on every port.  Then for each request of ``--ops``: the request is sent and packets are sent
(phase ``during``) until its reply arrives, then every packet once (phase ``after``).  Requests
carry the cookie the daemon gave each socket (docs/serve.md, "Address proof"): a ``COOKIE <hex>``
reply makes the request go again with it, and a request without one is padded to 24 bytes.

Writes one JSON object to ``--result``: ``sends`` [[send, packet index, phase, op]], ``arrivals``
{port: [send, ...]}, ``live`` (after each op, the live subscriptions as [condition, port]) and
``replies``.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys

from bmv2_p4rt_driver import BATCH, Receiver, Sender, finish, wait_for_server

SOURCES = {"127.0.0.1": 1, "127.0.0.2": 2, "127.0.0.3": 3}
LISTEN = ("127.0.0.1", 7300)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--grpc", required=True)
    ap.add_argument("--spec", required=True)
    ap.add_argument("--program", required=True)
    ap.add_argument("--config", required=True)
    ap.add_argument("--port-map", required=True)
    ap.add_argument("--state", required=True)
    ap.add_argument("--packets", required=True, help="JSON: frames (hex), sentinel (frame index), "
                                                     "sentinel_condition, ops [[source, condition] | [k]]")
    ap.add_argument("--udp-port", type=int, required=True)
    ap.add_argument("--id-at", type=int, required=True, help="frame offset of the 6-byte send number")
    ap.add_argument("--result", required=True)
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds a sentinel or reply may take")
    args = ap.parse_args()
    spec = json.loads(open(args.packets).read())
    rx = {p: Receiver(f"h{p}", p, args.udp_port, args.id_at) for p in sorted(set(SOURCES.values()))}
    tx = Sender(spec["frames"], "h0", args.id_at)
    frames, send = tx.frames, tx.send
    out: dict = {"replies": [], "live": []}

    def sentinel(phase: str, op: int) -> None:
        n = send(spec["sentinel"], phase, op)
        for port, r in rx.items():
            if not r.wait_for(n, args.timeout):
                raise SystemExit(f"op {op}: the sentinel (send {n}) never reached port {port}")

    wait_for_server(args.grpc, args.timeout)
    daemon = subprocess.Popen([sys.executable, "-m", "subc.cli", "serve", "--spec", args.spec, "--p4runtime", args.grpc,
                               "--program", args.program, "--config", args.config, "--port-map", args.port_map,
                               "--listen", f"{LISTEN[0]}:{LISTEN[1]}", "--state", args.state, "--log-level", "warning"],
                              stderr=subprocess.PIPE, text=True)
    try:
        while not (line := daemon.stderr.readline()).startswith("serving on"):
            if not line:
                raise SystemExit(f"subc serve exited ({daemon.wait()})")
        socks = {}
        for ip in SOURCES:
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.bind((ip, 0))
            socks[ip] = s
        live: dict[int, list] = {}
        ids: list[tuple[int, str]] = []
        cookies: dict[str, str] = {}

        def request(ip: str, line: str) -> None:
            cookie = cookies.get(ip)
            socks[ip].sendto((f"{line} COOKIE {cookie}" if cookie else line.ljust(24)).encode(), LISTEN)

        def ask(ip: str, line: str, op: int | None) -> str:
            """Send ``line``; with ``op``, packets flow (phase ``during``) until the reply."""
            s = socks[ip]
            request(ip, line)
            s.settimeout(0 if op is not None else args.timeout)
            k = 0
            while True:
                try:
                    reply = s.recv(4096).decode().strip()
                    if reply.startswith("COOKIE ") and cookies.get(ip) != reply.split()[1]:
                        cookies[ip] = reply.split()[1]
                        request(ip, line)
                        continue
                    break
                except BlockingIOError:
                    for j in range(BATCH):
                        send((k + j) % len(frames), "during", op)
                    k += BATCH
                    sentinel("during", op)  # keeps the queues short
            out["replies"].append([line, reply])
            return reply

        for ip in SOURCES:
            reply = ask(ip, f"SUBSCRIBE {spec['sentinel_condition']}", None)
            if not reply.startswith("SUBACK "):
                raise SystemExit(f"sentinel subscription: {reply}")
            live[int(reply.split()[1])] = [spec["sentinel_condition"], SOURCES[ip]]
        out["live"].append(sorted(live.values()))
        for op, step in enumerate(spec["ops"], 1):
            if len(step) == 2:
                ip, cond = step
                reply = ask(ip, f"SUBSCRIBE {cond}", op)
                if not reply.startswith("SUBACK "):
                    raise SystemExit(f"SUBSCRIBE {cond}: {reply}")
                sid = int(reply.split()[1])
                live[sid] = [cond, SOURCES[ip]]
                ids.append((sid, ip))
            else:
                sid, ip = ids.pop(step[0] % len(ids))
                reply = ask(ip, f"UNSUBSCRIBE {sid}", op)
                if reply != f"UNSUBACK {sid}":
                    raise SystemExit(f"UNSUBSCRIBE {sid}: {reply}")
                del live[sid]
            out["live"].append(sorted(live.values()))
            for k in range(0, len(frames), BATCH):
                for i in range(k, min(len(frames), k + BATCH)):
                    send(i, "after", op)
                sentinel("after", op)
    finally:
        daemon.terminate()
        daemon.wait(timeout=30)
    finish(rx, tx, out, args.result)


if __name__ == "__main__":
    main()
