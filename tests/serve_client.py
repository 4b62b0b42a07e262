"""A test's agent inside a network namespace (run with nsenter): a subscriber or a publisher.

Reads commands on stdin, one per line, and writes JSON lines on stdout:

* ``bind <port>``: a UDP socket on 0.0.0.0:<port> for requests and deliveries; prints
  ``{"bound": port}``;
* ``req <host> <port> <request line>``: sends the request from that socket; replies are printed as
  ``{"reply": line}`` as they arrive.  The broker's address proof (docs/serve.md) is handled here:
  a ``COOKIE <hex>`` reply is printed as ``{"cookie": hex}``, kept for that server and the last
  request sent to it is sent again with `` COOKIE <hex>`` appended; every later request to it
  carries the cookie; a request sent without a cookie is padded with spaces to 24 bytes (the
  cookie reply's size, so that the broker may send it);
* ``raw <host> <port> <request line>``: sends the line as it is (no cookie, no padding);
* ``capture <port>``: another UDP socket on 0.0.0.0:<port> that only records what arrives: every
  datagram as ``{"datagram": [source ip, source port, payload hex]}`` (a victim's view);
* ``tcp <host> <port> <request line>``: one TCP connection, one request, prints each reply line
  (``{"tcp": line}``) up to the final one, then ``{"tcp_end": true}``;
* ``send <host> <port> <hex payload>``: one UDP datagram (the publisher);
* ``rereq <host> <port> <hex request>``: a MoldUDP64 re-request (20 bytes) from the bound socket
  to a request server; a cookie packet from it (20 bytes, count 0xFFFE) makes the agent send the
  request again with the cookie appended; its answers are printed as ``{"answer": [...]}`` (parsed
  as deliveries are);
* ``quit``.

Deliveries (MoldUDP64 datagrams) are parsed here, with nothing from subc: ``{"mold": [session
hex, seq, count, [message hex, ...]], "from": source address}``.  No time decides anything: the test waits for lines.
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
MIN_REQUEST = 24  # bytes: "COOKIE <16 hex digits>\n", the broker's reply to an unproven request
COOKIES: dict[tuple[str, int], str] = {}  # the cookie each server gave this socket's address
LAST: dict[tuple[str, int], tuple[str, str | None]] = {}  # per server: the last request, its cookie
LOCK = threading.Lock()
RR: dict[tuple[str, int], bytes] = {}  # re-request servers: the last request sent to each


def send_request(sock: socket.socket, server: tuple[str, int], line: str) -> None:
    """``line`` to ``server``, with the server's cookie when there is one, else padded."""
    with LOCK:
        cookie = COOKIES.get(server)
        LAST[server] = (line, cookie)
    data = f"{line} COOKIE {cookie}" if cookie else line.ljust(MIN_REQUEST)
    sock.sendto(data.encode(), server)


def on_cookie(sock: socket.socket, server: tuple[str, int], line: str) -> bool:
    """A ``COOKIE <hex>`` reply: keep the cookie and send the last request again with it (True);
    False when that request already carried this cookie (the broker refused it: a reply)."""
    cookie = line.split()[1] if len(line.split()) == 2 else ""
    with LOCK:
        last, used = LAST.get(server, (None, None))
        if not cookie or used == cookie:
            return False
        COOKIES[server] = cookie
    out({"cookie": cookie})
    if last is not None:
        send_request(sock, server, last)
    return True


def receiver(sock: socket.socket) -> None:
    while True:
        try:
            data, addr = sock.recvfrom(65536)
        except OSError:
            return
        if addr in RR:
            if len(data) == 20 and data[18:20] == b"\xff\xfe":  # a cookie: the request again, with it
                sock.sendto(RR[addr] + data[10:18], addr)
            else:
                out({"answer": parse_mold(data), "from": addr[0]})
            continue
        if addr in SERVERS:
            for line in data.decode(errors="replace").splitlines():
                if line.startswith("COOKIE ") and on_cookie(sock, addr, line):
                    continue
                out({"reply": line})
            continue
        m = parse_mold(data)
        if m is not None:
            out({"mold": m, "from": addr[0]})


def capture(sock: socket.socket) -> None:
    while True:
        try:
            data, addr = sock.recvfrom(65536)
        except OSError:
            return
        out({"datagram": [addr[0], addr[1], data.hex()]})


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
        elif cmd == "capture":
            cap = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            cap.bind(("0.0.0.0", int(parts[1])))
            threading.Thread(target=capture, args=(cap,), daemon=True).start()
            out({"capturing": int(parts[1])})
        elif cmd == "req":
            SERVERS.add((parts[1], int(parts[2])))
            send_request(sock, (parts[1], int(parts[2])), parts[3])
        elif cmd == "raw":
            SERVERS.add((parts[1], int(parts[2])))
            with LOCK:
                LAST.pop((parts[1], int(parts[2])), None)  # a cookie reply to it is printed, nothing resent
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
        elif cmd == "rereq":
            server = (parts[1], int(parts[2]))
            RR[server] = bytes.fromhex(parts[3])
            sock.sendto(RR[server], server)
        elif cmd == "send":
            s = sock or socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.sendto(bytes.fromhex(parts[3]), (parts[1], int(parts[2])))
            out({"sent": True})
        elif cmd == "quit":
            return


if __name__ == "__main__":
    main()
