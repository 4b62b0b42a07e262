"""Traffic through ``simple_switch_grpc`` while subc loads and updates it over P4Runtime.

Run by tests/test_bmv2_p4runtime.py inside the network namespace it made (``ip netns exec``):
the switch listens on ``--grpc`` there, its port ``p`` is veth ``s<p>`` whose peer ``h<p>`` this
script sends on (port 0) and reads from (ports 1..).  The packets come from the test as hex
frames with a zero UDP checksum; this script writes a send number into six bytes of each (at
``--id-at``, a field no rule reads: the test picks the ITCH timestamp; the switch renumbers the
MoldUDP64 sequence number per port) so that every copy that arrives names the send.

Phases: ``subc load A`` then every packet once (``A``); ``subc update B`` in a subprocess with
packets sent until it returns (``during``); every packet once more (``B``); ``subc verify B``.
Packets go in batches, each followed by its phase's *sentinels* (per port, a packet the rules
send there): a batch is done when every sentinel arrived (BMv2 keeps the order of packets from
one ingress port to one egress port), so no queue overflows and no verdict depends on speed.

Writes one JSON object to ``--result``: ``sends`` [[send, packet index, phase]], ``arrivals``
{port: [send, ...]}, and the outputs of the subc commands.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import threading
import time

ETH_P_ALL = 0x0003
BATCH = 12
ID_LEN = 6


class Receiver:
    """Records the send number of every MoldUDP64 datagram arriving on ``iface`` (port ``port``)."""

    def __init__(self, iface: str, port: int, udp_port: int, id_at: int):
        self.port, self.udp_port, self.id_at = port, udp_port, id_at
        self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        self.sock.bind((iface, 0))
        self.sock.settimeout(0.2)
        self.seen: list[int] = []
        self.seen_set: set[int] = set()
        self.cond = threading.Condition()
        self.stop = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop:
            try:
                frame, addr = self.sock.recvfrom(65535)
            except socket.timeout:
                continue
            if addr[2] == socket.PACKET_OUTGOING or len(frame) < self.id_at + ID_LEN:
                continue
            if frame[12:14] != b"\x08\x00" or frame[23] != 17 or int.from_bytes(frame[36:38], "big") != self.udp_port:
                continue
            with self.cond:
                n = int.from_bytes(frame[self.id_at:self.id_at + ID_LEN], "big")
                self.seen.append(n)
                self.seen_set.add(n)
                self.cond.notify_all()

    def wait_for(self, send: int, timeout: float) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: send in self.seen_set, timeout)


class Sender:
    """Sends frames (hex) on ``iface``, each with its send number written at ``id_at``; ``sends``
    records [send, frame index, *tags] per send."""

    def __init__(self, frames: list[str], iface: str, id_at: int):
        self.frames = [bytearray(bytes.fromhex(h)) for h in frames]
        self.id_at = id_at
        self.tx = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
        self.tx.bind((iface, 0))
        self.sends: list[list] = []

    def send(self, index: int, *tags) -> int:
        n = len(self.sends) + 1
        f = self.frames[index]
        f[self.id_at:self.id_at + ID_LEN] = n.to_bytes(ID_LEN, "big")
        self.tx.send(bytes(f))
        self.sends.append([n, index, *tags])
        return n


def finish(rx: dict, tx: Sender, out: dict, path: str) -> None:
    """Stop the receivers and write ``out`` with the sends and arrivals to ``path`` (JSON)."""
    for r in rx.values():
        r.stop = True
        r.thread.join()
    out["sends"] = tx.sends
    out["arrivals"] = {p: r.seen for p, r in rx.items()}
    with open(path, "w") as f:
        json.dump(out, f)


def subc(*args: str) -> str:
    r = subprocess.run([sys.executable, "-m", "subc.cli", *args], capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"subc {' '.join(args)} failed ({r.returncode}): {r.stdout}{r.stderr}")
    return r.stdout.strip()


def wait_for_server(addr: str, timeout: float) -> None:
    host, port = addr.rsplit(":", 1)
    end = time.monotonic() + timeout
    while True:
        with socket.socket() as s:
            if s.connect_ex((host, int(port))) == 0:
                return
        if time.monotonic() > end:
            raise SystemExit(f"no P4Runtime server on {addr} after {timeout} s")
        time.sleep(0.2)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--grpc", required=True)
    ap.add_argument("--a", required=True)
    ap.add_argument("--b", required=True)
    ap.add_argument("--config", required=True)
    ap.add_argument("--packets", required=True, help="JSON: frames (hex), sentinels {phase: {port: index}}")
    ap.add_argument("--ports", type=int, required=True)
    ap.add_argument("--udp-port", type=int, required=True)
    ap.add_argument("--id-at", type=int, required=True, help="frame offset of the 6-byte send number")
    ap.add_argument("--result", required=True)
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds a sentinel may take (a stuck switch)")
    args = ap.parse_args()
    spec = json.loads(open(args.packets).read())
    sentinels = {ph: {int(p): i for p, i in s.items()} for ph, s in spec["sentinels"].items()}
    rx = {p: Receiver(f"h{p}", p, args.udp_port, args.id_at) for p in range(1, args.ports + 1)}
    tx = Sender(spec["frames"], "h0", args.id_at)
    frames, send = tx.frames, tx.send
    out: dict = {}

    def batch(indices: list[int], phase: str) -> None:
        for i in indices:
            send(i, phase)
        for port, i in sentinels[phase].items():
            n = send(i, phase)
            if not rx[port].wait_for(n, args.timeout):
                raise SystemExit(f"phase {phase}: the sentinel (send {n}, packet {i}) never reached port {port}")

    def all_once(phase: str) -> None:
        for k in range(0, len(frames), BATCH):
            batch(list(range(k, min(len(frames), k + BATCH))), phase)

    wait_for_server(args.grpc, args.timeout)
    out["load"] = subc("load", args.a, "--p4runtime", args.grpc, "--config", args.config)
    all_once("A")
    upd = subprocess.Popen([sys.executable, "-m", "subc.cli", "update", args.b, "--p4runtime", args.grpc],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    k = 0
    while upd.poll() is None:
        batch([(k + j) % len(frames) for j in range(BATCH)], "during")
        k += BATCH
    stdout, stderr = upd.communicate()
    if upd.returncode:
        raise SystemExit(f"subc update failed ({upd.returncode}): {stdout}{stderr}")
    out["update"] = stdout.strip()
    all_once("B")
    out["verify"] = subc("verify", args.b, "--p4runtime", args.grpc)
    finish(rx, tx, out, args.result)


if __name__ == "__main__":
    main()
