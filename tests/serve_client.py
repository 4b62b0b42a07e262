"""A test's agent inside a network namespace (run with nsenter): a subscriber or a publisher.

Reads commands on stdin, one per line, and writes JSON lines on stdout:

* ``bind <port>``: a UDP socket on 0.0.0.0:<port> for requests and deliveries; prints
  ``{"bound": port}``;
* ``req <host> <port> <request line>``: sends the request from that socket; replies are printed as
  ``{"reply": line}`` as they arrive;
* ``tcp <host> <port> <request line>``: one TCP connection, one request, prints each reply line
  (``{"tcp": line}``) up to the final one, then ``{"tcp_end": true}``;
* ``send <host> <port> <hex payload>``: one UDP datagram (the publisher);
* ``quit``.

Deliveries (MoldUDP64 datagrams) are parsed here, with nothing from subc: ``{"mold": [session
hex, seq, count, [message hex, ...]]}``.  No time decides anything: the test waits for lines.
"""

from __future__ import annotations

import json
import socket
import struct
import sys
import threading


def out(doc) -> None:
    sys.stdout.write(json.dumps(doc) + "\n")
    sys.stdout.flush()


def parse_mold(data: bytes):
    """(session, sequence number, count, messages) of a MoldUDP64 datagram, or None."""
    if len(data) < 20:
        return None
    session, seq, count = data[:10], int.from_bytes(data[10:18], "big"), int.from_bytes(data[18:20], "big")
    msgs, off = [], 20
    while off + 2 <= len(data):
        (n,) = struct.unpack_from(">H", data, off)
        msgs.append(data[off + 2: off + 2 + n].hex())
        off += 2 + n
    return session.hex(), seq, count, msgs


SERVERS: set[tuple[str, int]] = set()  # where requests went: datagrams from there are replies
FINAL = ("SUBACK", "SUBERR", "UNSUBACK", "ERR", "RENEWACK", "END", "PONG")


def receiver(sock: socket.socket) -> None:
    while True:
        try:
            data, addr = sock.recvfrom(65536)
        except OSError:
            return
        if addr in SERVERS:
            for line in data.decode(errors="replace").splitlines():
                out({"reply": line})
            continue
        m = parse_mold(data)
        if m is not None:
            out({"mold": m})


def main() -> None:
    sock = None
    for line in sys.stdin:
        parts = line.rstrip("\n").split(" ", 3)
        cmd = parts[0]
        if cmd == "bind":
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
            sock.bind(("0.0.0.0", int(parts[1])))
            threading.Thread(target=receiver, args=(sock,), daemon=True).start()
            out({"bound": int(parts[1])})
        elif cmd == "req":
            SERVERS.add((parts[1], int(parts[2])))
            sock.sendto(parts[3].encode(), (parts[1], int(parts[2])))
        elif cmd == "tcp":
            with socket.create_connection((parts[1], int(parts[2])), timeout=60) as c:
                c.sendall(parts[3].encode() + b"\n")
                f = c.makefile("r", errors="replace")
                for ln in f:  # until the final reply line, or the server closes
                    out({"tcp": ln.rstrip("\n")})
                    if ln.startswith(FINAL):
                        break
                out({"tcp_end": True})
        elif cmd == "send":
            s = sock or socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.sendto(bytes.fromhex(parts[3]), (parts[1], int(parts[2])))
            out({"sent": True})
        elif cmd == "quit":
            return


if __name__ == "__main__":
    main()
