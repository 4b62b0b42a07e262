#!/usr/bin/env python3
"""TCP fan-out: 1, 100 and 1,000 SoupBinTCP subscribers taking the full feed, from subc's broker
(``subc load --journal --soup``), from a user-space server that writes each message to each
socket, and from Mosquitto, on the same machine in one run (issue 40).

Topology (network namespaces made here, removed afterwards; addresses only inside them)::

    publisher (sfpub, CPU 0) --veth-- server (sfbrk, CPU 1) --veth-- clients (sfcli, CPU 0)
    10.61.0.1 sfp0                    sfb0 10.61.0.2, sfb1 10.61.1.1    sfc1 10.61.1.2

Every veth has GRO on and threaded NAPI, its NAPI kthread pinned to its side's CPU: the server's
(sfb0, sfb1) to CPU 1, the publisher's and the clients' (sfp0, sfc1) to CPU 0.  So the server and
everything the kernel does for it (the feed's receive path, XDP and TC for subc, its TCP sends, the
clients' ACKs) run on CPU 1; the publisher, the clients and their TCP receive path on CPU 0.

Feed.  The Add Orders of the real ITCH sample (``../shared/data/itch``: 5,000 of its 12,012
messages; the example spec's query fields are Add Order fields), re-timed by ``broker_throughput.retime``
and packed by the live-feed packer (``subc/workloads/feed.py``): 779 MoldUDP64 datagrams of 1 to
36 messages, 6.4 on average, sent round robin.  Every message of the feed goes to every client:
"the full feed".  The publisher is the C helper below (``sf_helper publish``), not
``bench/xdp_publisher.py``: the XDP publisher spins on its CPU, which the clients share here (the
machine has two), while this one sleeps between sends (``sendmmsg`` on a UDP socket, paced at
``--rates`` messages/s, 0: as fast as it can; the publisher's veth has a queue, so a full ring
pushes back instead of dropping).  The same datagrams, at the same rate, for each server:

* **subc**: ``subc load OUT --iface sfb0 --subscribers FILE --journal --soup 10.61.1.1:9200``
  (the recovery service pinned to CPU 1 with taskset); one subscriber, a SoupBinTCP login and no
  endpoint, whose rule (``add_order.buy_sell_indicator == "B" or ... == "S"``) takes every Add
  Order: XDP passes each datagram to TC, which builds the subscriber's copy, journals it (the BPF
  ring buffer) and sends nothing; the service appends it to the journal (in memory, ``--retain
  256MiB``) and wakes the SoupBinTCP server, which sends every client its new range of the journal
  with ``os.sendfile``.
* **user** (the baseline, ``sf_helper server``, C, pinned to CPU 1): receives the same datagrams on
  a UDP socket (``recvmmsg``, 16 MiB buffer) and writes each message, framed as a SoupBinTCP
  Sequenced Data packet, to each logged-in client with one ``send()`` per message per client
  (non-blocking; what a socket does not take waits in the client's buffer, written as the socket
  drains).  Sockets as subc's server makes them (TCP_NODELAY).
* **mosquitto** (Debian's 2.0, pinned to CPU 1; skipped with a note when not installed): the
  publisher sends each datagram's messages as MQTT 3.1.1 PUBLISH frames (QoS 0, topic ``itch``),
  one write per datagram, on one TCP connection; the clients SUBSCRIBE to ``itch``.  Its
  configuration is topic_fanout.py's (Mosquitto's defaults otherwise).

Clients (``sf_helper clients``, C, one process, one epoll loop, pinned to CPU 0): N connections
from sfcli, logged in (SoupBinTCP: sequence number 0, live data only: fan-out, not backfill, is
measured; a Client Heartbeat every second) or subscribed (MQTT) before the feed starts, after
0.2 s of feed at 5,000 msg/s (subc's server gives a login to an empty journal the blank session,
then End of Session once the feed's session is journaled; the same priming for every server).
Each connection parses its stream's framing and counts the data packets (Sequenced Data, PUBLISH)
and their bytes exactly; one the server closes (subc's: ``stalled``, a hole, retention) logs in
again (live only) 0.1 s later, counted as a reconnection.

Measured, per server, client count and offered rate: the publisher runs ``--warmup`` +
``--seconds`` + 0.3 s; the window is ``--seconds`` after the warm-up, between two snapshots of the
clients' counts and of the CPU counters; then the clients drain (until their counts stand still)
before the next rate.

* delivered msg/s: data packets received by all clients in the window / its length;
* Gbps: 8 x the bytes of those packets (SoupBinTCP: 2-byte length, type, message, 39 bytes for an
  Add Order; MQTT: fixed header, topic, message, 44 bytes) / the window, in 1e9 bit/s;
* of offered: delivered / (the publisher's messages/s x the clients connected);
* cpu1: busy share of CPU 1 in the window (``/proc/stat``: user, nice, system, irq, softirq,
  steal over all); cores/Gbps = cpu1 / Gbps, i.e. CPU seconds of the server's CPU per Gbit
  delivered (jetrelay's anchor, about 9,000 clients at 10 Gbps on 8 cores, is 0.8);
  ``own_cpu``: the CPU time of the server's process and of the server veths' NAPI kthreads, per
  second of the window (what is certainly the server's: ``/proc/stat`` counts anything else on
  CPU 1 too);
* cpu0: busy share of CPU 0 (publisher and clients): near 1, the clients may be what limits.

Per client count and server, the peak delivered msg/s over the offered rates (per repeat), with
its Gbps and CPU; the summary gives the median [min, max] over the repeats.

    sudo python3 bench/soup_fanout.py --clients 1,100,1000 --seconds 5 --repeat 3 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from broker_throughput import in_ns, loadavg, mac_of, on_signal, retime, sh  # noqa: E402

from subc.workloads.feed import feed_datagrams  # noqa: E402
from subc.workloads.itch_codec import read_binaryfile  # noqa: E402

PUB, BRK, CLI = "sfpub", "sfbrk", "sfcli"
PUB_IP, FEED_IP, SRV_IP, CLI_IP = "10.61.0.1", "10.61.0.2", "10.61.1.1", "10.61.1.2"
FEED_PORT = 26400  # the example spec's ITCH_UDP_PORT
PORTS = {"subc": 9200, "user": 9201, "mosquitto": 1883}
SERVERS = ("subc", "user", "mosquitto")
USER, PASSWORD, TOPIC = "sfb", "bench", "itch"
SESSION = "SFBENCH001"
SPEC = ROOT / "examples/itch/spec.p4"
SAMPLE = ROOT.parent / "shared/data/itch/ex20101224.TEST_ITCH_50"
SUBC = [sys.executable, "-m", "subc.cli"]
RULES = 'add_order.buy_sell_indicator == "B" or add_order.buy_sell_indicator == "S" : fwd(1);\n'
MOSQUITTO_CONF = "listener {port} 0.0.0.0\nallow_anonymous true\npersistence false\nlog_dest none\n"
CLK_TCK = os.sysconf("SC_CLK_TCK")
BROKER_CPU, OTHER_CPU = 1, 0
TAIL = 0.3  # s the publisher goes on after the window


HELPER_C = r"""/* The C side of bench/soup_fanout.py (built there with cc -O2; not part of subc).
 *
 *   sf_helper publish udp|mqtt PAYLOADS DST_IP PORT SECONDS RATE TOPIC
 *   sf_helper server UDP_IP UDP_PORT TCP_IP TCP_PORT
 *   sf_helper clients soup|mqtt IP PORT N USER PASSWORD TOPIC
 *
 * publish: the feed.  PAYLOADS: records of a 2-byte big-endian length and a MoldUDP64 payload.
 *   udp: each payload as one datagram (sendmmsg); mqtt: the payload's messages as MQTT 3.1.1
 *   PUBLISH frames (QoS 0, TOPIC), one write per payload, on one connection.  RATE messages/s (0:
 *   as fast as it can), paced with nanosleep (the sender sleeps, it does not spin: the clients
 *   share its CPU); the payloads round robin for SECONDS.  Prints {"sent", "messages", "seconds"}:
 *   what the socket took (UDP with IP_RECVERR, so a datagram dropped by the veth's full queue is
 *   an ENOBUFS error, counted in "errors" and sent again, not counted as sent).
 * server: the user-space baseline.  Receives the feed's datagrams on UDP (recvmmsg) and writes
 *   each message, framed as a SoupBinTCP Sequenced Data packet, to each logged-in client with one
 *   send() per message per client (MSG_DONTWAIT); what a socket does not take waits in that
 *   client's buffer (then written as it drains, in as few sends as it takes) and later messages
 *   queue behind it; a client more than 64 MiB behind is disconnected.  Any Login Request is
 *   accepted (Login Accepted, the next sequence number).  'q' on stdin or SIGTERM: prints its
 *   counters and exits.
 * clients: N connections (SoupBinTCP 4.1: Login Request USER/PASSWORD, session blank, sequence
 *   number 0: live only, a Client Heartbeat every second; MQTT 3.1.1: CONNECT, SUBSCRIBE TOPIC
 *   QoS 0), at most 64 logging in at once, read as fast as they come on one epoll loop; each
 *   connection parses the framing (SoupBinTCP: 2-byte length; MQTT: fixed header with its
 *   variable-length remaining length) and counts the data packets (Sequenced Data, PUBLISH) and
 *   their bytes exactly.  A connection the server closes (subc's: a hole, retention, a stall)
 *   connects and logs in again (live only) 0.1 s later, 100 times at most.  Prints {"ready": ...}
 *   once every connection is in (or failed); 's' on stdin prints a snapshot of the counts (with
 *   every connection's data packets, counted over its reconnections), 'q' exits.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define BATCH 64
#define OUT_CAP (64u << 20)
#define MAX_EVENTS 512

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static void die(const char *m)
{
    fprintf(stderr, "sf_helper: %s: %s\n", m, strerror(errno));
    exit(2);
}

static void *xrealloc(void *p, size_t n)
{
    p = realloc(p, n ? n : 1);
    if (!p)
        die("out of memory");
    return p;
}

static int tcp_nodelay(int fd)
{
    int one = 1;
    return setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

static struct sockaddr_in addr_of(const char *ip, int port)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    if (inet_pton(AF_INET, ip, &a.sin_addr) != 1) {
        errno = EINVAL;
        die(ip);
    }
    return a;
}

static int put_varint(uint8_t *p, uint32_t n)
{
    int k = 0;
    do {
        uint8_t d = n % 128;
        n /= 128;
        p[k++] = d | (n ? 0x80 : 0);
    } while (n);
    return k;
}

/* ---- publish ------------------------------------------------------------------------------ */

static int cmd_publish(int argc, char **argv)
{
    if (argc != 9)
        die("usage: publish udp|mqtt PAYLOADS DST_IP PORT SECONDS RATE TOPIC");
    int mqtt = !strcmp(argv[2], "mqtt");
    FILE *f = fopen(argv[3], "rb");
    if (!f)
        die(argv[3]);
    uint8_t *file = NULL;
    size_t size = 0, cap = 0, r;
    for (;;) {
        if (size + 65536 > cap)
            file = xrealloc(file, cap = 2 * cap + 65536);
        if (!(r = fread(file + size, 1, cap - size, f)))
            break;
        size += r;
    }
    fclose(f);
    int n = 0;
    uint8_t **pl = NULL;
    uint32_t *len = NULL, *msgs = NULL;
    for (size_t at = 0; at + 2 <= size; n++) {
        uint32_t l = file[at] << 8 | file[at + 1];
        if (at + 2 + l > size)
            die("truncated payloads");
        pl = xrealloc(pl, (n + 1) * sizeof(*pl));
        len = xrealloc(len, (n + 1) * sizeof(*len));
        msgs = xrealloc(msgs, (n + 1) * sizeof(*msgs));
        pl[n] = file + at + 2;
        len[n] = l;
        uint32_t c = l >= 20 ? (pl[n][18] << 8 | pl[n][19]) : 0;
        msgs[n] = (c == 0xffff) ? 0 : c;
        at += 2 + l;
    }
    if (!n)
        die("no payloads");
    const char *topic = argv[8];
    size_t tlen = strlen(topic);
    if (mqtt) { /* each payload's messages as PUBLISH frames, back to back */
        for (int i = 0; i < n; i++) {
            uint8_t *out = xrealloc(NULL, msgs[i] * (tlen + 8) + len[i]), *w = out;
            uint32_t at = 20;
            for (uint32_t k = 0; k < msgs[i]; k++) {
                uint32_t ml = pl[i][at] << 8 | pl[i][at + 1];
                *w++ = 0x30;
                w += put_varint(w, 2 + tlen + ml);
                *w++ = tlen >> 8;
                *w++ = tlen & 0xff;
                memcpy(w, topic, tlen);
                w += tlen;
                memcpy(w, pl[i] + at + 2, ml);
                w += ml;
                at += 2 + ml;
            }
            pl[i] = out;
            len[i] = w - out;
        }
    }
    struct sockaddr_in a = addr_of(argv[4], atoi(argv[5]));
    int s = socket(AF_INET, mqtt ? SOCK_STREAM : SOCK_DGRAM, 0);
    if (s < 0 || connect(s, (void *)&a, sizeof(a)))
        die("connect");
    if (mqtt) {
        tcp_nodelay(s);
        uint8_t c[64], *w = c;
        const char *id = "sf-publisher";
        size_t il = strlen(id);
        *w++ = 0x10;
        *w++ = 10 + 2 + il;
        memcpy(w, "\0\4MQTT\4\2\0\0", 10); /* protocol MQTT level 4, clean session, keep alive 0 */
        w += 10;
        *w++ = 0;
        *w++ = il;
        memcpy(w, id, il);
        w += il;
        if (write(s, c, w - c) != w - c || read(s, c, 4) != 4 || c[0] != 0x20 || c[3] != 0)
            die("MQTT CONNECT");
        /* a broker that stops reading must not hold the publisher past its time: writes give up
         * after 0.1 s and the loop looks at the clock (an unfinished frame at the end is cut) */
        struct timeval tv = {0, 100000};
        setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    } else { /* IP_RECVERR: a datagram the veth's full queue refuses fails with ENOBUFS, not silently */
        int sz = 16 << 20, one = 1;
        setsockopt(s, SOL_SOCKET, SO_SNDBUFFORCE, &sz, sizeof(sz));
        setsockopt(s, IPPROTO_IP, IP_RECVERR, &one, sizeof(one));
    }
    double seconds = atof(argv[6]), rate = atof(argv[7]);
    static struct iovec iov[BATCH];
    static struct mmsghdr mm[BATCH];
    uint64_t sent = 0, sent_msgs = 0, errors = 0;
    int next = 0;
    double t0 = now(), end = t0 + seconds, t;
    while ((t = now()) < end) {
        double due = rate > 0 ? (t - t0) * rate - (double)sent_msgs : 1e18;
        if (due <= 0) {
            struct timespec ts = {0, 20000};
            nanosleep(&ts, NULL);
            continue;
        }
        if (mqtt) {
            size_t off = 0;
            while (off < len[next]) {
                ssize_t k = write(s, pl[next] + off, len[next] - off);
                if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && now() < end)
                    continue;
                if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
                    break; /* time is up while the broker does not read */
                if (k <= 0)
                    die("MQTT write");
                off += k;
            }
            if (off < len[next])
                break;
            sent++;
            sent_msgs += msgs[next];
            next = (next + 1) % n;
            continue;
        }
        int b = 0;
        for (double m = 0; b < BATCH && m < due; b++) {
            int i = (next + b) % n;
            iov[b].iov_base = pl[i];
            iov[b].iov_len = len[i];
            mm[b].msg_hdr.msg_iov = &iov[b];
            mm[b].msg_hdr.msg_iovlen = 1;
            m += msgs[i];
        }
        int k = sendmmsg(s, mm, b, 0);
        if (k < 0) { /* ENOBUFS: the veth's queue is full (the server does not keep up): wait a little */
            errors++;
            struct timespec ts = {0, 20000};
            nanosleep(&ts, NULL);
            continue;
        }
        for (int i = 0; i < k; i++)
            sent_msgs += msgs[(next + i) % n];
        sent += k;
        next = (next + k) % n;
    }
    printf("{\"sent\": %" PRIu64 ", \"messages\": %" PRIu64 ", \"errors\": %" PRIu64 ", \"seconds\": %.6f}\n", sent,
           sent_msgs, errors, now() - t0);
    return 0;
}

/* ---- the stream parser shared by the server and the clients ------------------------------- */

struct parser {
    int mqtt;
    uint8_t hdr[8];
    int hn;          /* header bytes collected */
    uint32_t need;   /* payload bytes still to come of the current packet */
    uint32_t total;  /* the current packet's bytes, header included */
    uint8_t type;
    uint8_t first;   /* its first payload byte (Login Rejected's reason) */
    uint32_t got;    /* payload bytes seen of the current packet */
};

/* Feed bytes; calls done(ctx, type, total bytes, first payload byte) at the end of each packet;
 * returns -1 on a malformed stream.  In a packet's header while need is 0. */
static int parse(struct parser *ps, const uint8_t *p, size_t n, void *ctx,
                 void (*done)(void *, uint8_t, uint32_t, uint8_t))
{
    while (n) {
        if (ps->need == 0) {
            ps->hdr[ps->hn++] = *p++;
            n--;
            if (!ps->mqtt) {
                if (ps->hn < 3)
                    continue;
                uint32_t l = ps->hdr[0] << 8 | ps->hdr[1];
                if (l == 0)
                    return -1;
                ps->type = ps->hdr[2];
                ps->need = l - 1;
                ps->total = l + 2;
            } else {
                if (ps->hn < 2)
                    continue;
                if (ps->hdr[ps->hn - 1] & 0x80) {
                    if (ps->hn == 5)
                        return -1;
                    continue;
                }
                uint32_t rl = 0, mult = 1;
                for (int i = 1; i < ps->hn; i++, mult *= 128)
                    rl += (ps->hdr[i] & 0x7f) * mult;
                ps->type = ps->hdr[0] & 0xf0;
                ps->need = rl;
                ps->total = ps->hn + rl;
            }
            ps->hn = 0;
            ps->got = 0;
            if (ps->need == 0)
                done(ctx, ps->type, ps->total, 0);
            continue;
        }
        size_t k = n < ps->need ? n : ps->need;
        if (ps->got == 0)
            ps->first = *p;
        ps->got += k;
        p += k;
        n -= k;
        ps->need -= k;
        if (ps->need == 0)
            done(ctx, ps->type, ps->total, ps->first);
    }
    return 0;
}

/* ---- server (the user-space baseline) ----------------------------------------------------- */

struct scl {
    int fd, logged, slot;
    struct parser ps;
    uint8_t *ob;
    size_t olen, ooff, ocap;
    int close_me;
};

static struct scl **live;
static int n_live;
static uint64_t s_datagrams, s_messages, s_sends, s_partial, s_buffered, s_flush_sends, s_slow, s_closed, s_logins,
    s_accepted, s_seq = 1;
static int s_ep;
static volatile sig_atomic_t s_stop;

static void s_drop(struct scl *c)
{
    if (c->fd < 0)
        return;
    epoll_ctl(s_ep, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    c->fd = -1;
    s_closed++;
    if (c->logged) {
        live[c->slot] = live[--n_live];
        live[c->slot]->slot = c->slot;
        c->logged = 0;
    }
}

static void s_append(struct scl *c, const uint8_t *p, size_t n)
{
    if (c->olen - c->ooff + n > OUT_CAP) {
        s_slow++;
        c->close_me = 1;
        return;
    }
    if (c->ooff && c->ooff == c->olen)
        c->ooff = c->olen = 0;
    if (c->olen + n > c->ocap) {
        if (c->ooff) {
            memmove(c->ob, c->ob + c->ooff, c->olen - c->ooff);
            c->olen -= c->ooff;
            c->ooff = 0;
        }
        while (c->olen + n > c->ocap)
            c->ocap = c->ocap ? 2 * c->ocap : 65536;
        c->ob = xrealloc(c->ob, c->ocap);
    }
    memcpy(c->ob + c->olen, p, n);
    c->olen += n;
    s_buffered += n;
}

static void s_watch(struct scl *c, int out)
{
    struct epoll_event ev = {.events = EPOLLIN | (out ? EPOLLOUT : 0), .data.ptr = c};
    epoll_ctl(s_ep, EPOLL_CTL_MOD, c->fd, &ev);
}

/* One message to one client: one send(), or behind what waits. */
static void s_send(struct scl *c, const uint8_t *p, size_t n)
{
    if (c->olen > c->ooff) {
        s_append(c, p, n);
        return;
    }
    ssize_t k = send(c->fd, p, n, MSG_DONTWAIT | MSG_NOSIGNAL);
    s_sends++;
    if (k == (ssize_t)n)
        return;
    if (k < 0) {
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
            c->close_me = 1;
            return;
        }
        k = 0;
    }
    s_partial++;
    s_append(c, p + k, n - k);
    s_watch(c, 1);
}

static void s_flush(struct scl *c)
{
    while (c->olen > c->ooff) {
        ssize_t k = send(c->fd, c->ob + c->ooff, c->olen - c->ooff, MSG_DONTWAIT | MSG_NOSIGNAL);
        s_flush_sends++;
        if (k < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                c->close_me = 1;
            return;
        }
        c->ooff += k;
    }
    c->olen = c->ooff = 0;
    s_watch(c, 0);
}

static void s_packet(void *ctx, uint8_t type, uint32_t total, uint8_t first)
{
    struct scl *c = ctx;
    (void)total;
    (void)first;
    if (type == 'L' && !c->logged) {
        uint8_t a[33] = {0, 31, 'A'};
        char seq[24];
        memcpy(a + 3, "SFBENCH001", 10);
        snprintf(seq, sizeof(seq), "%20" PRIu64, s_seq);
        memcpy(a + 13, seq, 20);
        s_send(c, a, sizeof(a));
        c->logged = 1;
        c->slot = n_live;
        live = xrealloc(live, (n_live + 1) * sizeof(*live));
        live[n_live++] = c;
        s_logins++;
    } else if (type == 'O') {
        c->close_me = 1;
    }
}

static void s_datagram(const uint8_t *p, size_t n)
{
    s_datagrams++;
    if (n < 20)
        return;
    uint32_t count = p[18] << 8 | p[19], at = 20;
    if (count == 0 || count == 0xffff)
        return;
    static uint8_t pkt[65536 + 3];
    for (uint32_t i = 0; i < count && at + 2 <= n; i++) {
        uint32_t ml = p[at] << 8 | p[at + 1];
        if (at + 2 + ml > n)
            break;
        pkt[0] = (ml + 1) >> 8;
        pkt[1] = (ml + 1) & 0xff;
        pkt[2] = 'S';
        memcpy(pkt + 3, p + at + 2, ml);
        for (int k = 0; k < n_live; k++)
            s_send(live[k], pkt, ml + 3);
        s_messages++;
        s_seq++;
        at += 2 + ml;
        for (int k = 0; k < n_live; k++) /* drop the ones that failed, after the round */
            if (live[k]->close_me) {
                s_drop(live[k]);
                k--;
            }
    }
}

static void on_term(int sig)
{
    (void)sig;
    s_stop = 1;
}

static int cmd_server(int argc, char **argv)
{
    if (argc != 6)
        die("usage: server UDP_IP UDP_PORT TCP_IP TCP_PORT");
    signal(SIGTERM, on_term);
    signal(SIGPIPE, SIG_IGN);
    struct sockaddr_in ua = addr_of(argv[2], atoi(argv[3])), ta = addr_of(argv[4], atoi(argv[5]));
    int u = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK, 0), one = 1, sz = 16 << 20;
    setsockopt(u, SOL_SOCKET, SO_RCVBUFFORCE, &sz, sizeof(sz));
    if (u < 0 || bind(u, (void *)&ua, sizeof(ua)))
        die("UDP bind");
    int l = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (l < 0 || bind(l, (void *)&ta, sizeof(ta)) || listen(l, 4096))
        die("TCP listen");
    s_ep = epoll_create1(0);
    static int tag_udp, tag_listen, tag_stdin;
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &tag_udp};
    epoll_ctl(s_ep, EPOLL_CTL_ADD, u, &ev);
    ev.data.ptr = &tag_listen;
    epoll_ctl(s_ep, EPOLL_CTL_ADD, l, &ev);
    ev.data.ptr = &tag_stdin;
    epoll_ctl(s_ep, EPOLL_CTL_ADD, 0, &ev);
    fprintf(stderr, "sf_helper server: listening\n");
    static uint8_t bufs[BATCH][2048], rbuf[65536];
    static struct iovec iov[BATCH];
    static struct mmsghdr mm[BATCH];
    struct epoll_event evs[MAX_EVENTS];
    while (!s_stop) {
        int k = epoll_wait(s_ep, evs, MAX_EVENTS, 100);
        for (int e = 0; e < k; e++) {
            void *tag = evs[e].data.ptr;
            if (tag == &tag_udp) {
                for (int round = 0; round < 16; round++) {
                    for (int i = 0; i < BATCH; i++) {
                        iov[i].iov_base = bufs[i];
                        iov[i].iov_len = sizeof(bufs[i]);
                        mm[i].msg_hdr.msg_iov = &iov[i];
                        mm[i].msg_hdr.msg_iovlen = 1;
                    }
                    int g = recvmmsg(u, mm, BATCH, MSG_DONTWAIT, NULL);
                    if (g <= 0)
                        break;
                    for (int i = 0; i < g; i++)
                        s_datagram(bufs[i], mm[i].msg_len);
                    if (g < BATCH)
                        break;
                }
            } else if (tag == &tag_listen) {
                for (;;) {
                    int fd = accept4(l, NULL, NULL, SOCK_NONBLOCK);
                    if (fd < 0)
                        break;
                    tcp_nodelay(fd);
                    struct scl *c = calloc(1, sizeof(*c));
                    c->fd = fd;
                    struct epoll_event ce = {.events = EPOLLIN, .data.ptr = c};
                    epoll_ctl(s_ep, EPOLL_CTL_ADD, fd, &ce);
                    s_accepted++;
                }
            } else if (tag == &tag_stdin) {
                char cmd[16];
                ssize_t r = read(0, cmd, sizeof(cmd));
                if (r <= 0 || memchr(cmd, 'q', r))
                    s_stop = 1;
            } else {
                struct scl *c = tag;
                if (c->fd < 0)
                    continue;
                if (evs[e].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
                    ssize_t r = recv(c->fd, rbuf, sizeof(rbuf), MSG_DONTWAIT);
                    if (r == 0 || (r < 0 && errno != EAGAIN) || parse(&c->ps, rbuf, r > 0 ? r : 0, c, s_packet))
                        c->close_me = 1;
                }
                if (!c->close_me && (evs[e].events & EPOLLOUT))
                    s_flush(c);
                if (c->close_me)
                    s_drop(c);
            }
        }
    }
    printf("{\"datagrams\": %" PRIu64 ", \"messages\": %" PRIu64 ", \"sends\": %" PRIu64
           ", \"partial_sends\": %" PRIu64 ", \"buffered_bytes\": %" PRIu64 ", \"flush_sends\": %" PRIu64
           ", \"slow_disconnects\": %" PRIu64 ", \"closed\": %" PRIu64 ", \"accepted\": %" PRIu64
           ", \"logins\": %" PRIu64 "}\n",
           s_datagrams, s_messages, s_sends, s_partial, s_buffered, s_flush_sends, s_slow, s_closed, s_accepted,
           s_logins);
    return 0;
}

/* ---- clients ------------------------------------------------------------------------------ */

enum { C_IDLE, C_CONNECTING, C_LOGIN, C_READY, C_CLOSED, C_FAILED };

struct ccl {
    int fd, st, tries;
    double retry_at;
    struct parser ps;
    uint64_t msgs, bytes;
};

static struct ccl *cc;
static int c_n, c_mqtt, c_ep, c_ready, c_closed, c_failed, c_rejected, c_pending, c_logins;
static uint64_t c_debug, c_eos, c_hb, c_other, c_all_bytes;
static struct sockaddr_in c_addr;
static const char *c_user, *c_pass, *c_topic;

static void c_close(struct ccl *c, int st)
{
    if (c->fd >= 0) {
        epoll_ctl(c_ep, EPOLL_CTL_DEL, c->fd, NULL);
        close(c->fd);
        c->fd = -1;
    }
    if (c->st == C_READY)
        c_closed++, c_ready--;
    if (c->st == C_CONNECTING || c->st == C_LOGIN)
        c_pending--;
    c->st = st;
}

static void c_start(struct ccl *c)
{
    c->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    if (c->fd < 0)
        die("socket");
    int sz = 4 << 20;
    setsockopt(c->fd, SOL_SOCKET, SO_RCVBUF, &sz, sizeof(sz));
    memset(&c->ps, 0, sizeof(c->ps));
    c->ps.mqtt = c_mqtt;
    c->st = C_CONNECTING;
    c_pending++;
    if (connect(c->fd, (void *)&c_addr, sizeof(c_addr)) && errno != EINPROGRESS)
        die("connect");
    struct epoll_event ev = {.events = EPOLLOUT | EPOLLIN, .data.ptr = c};
    epoll_ctl(c_ep, EPOLL_CTL_ADD, c->fd, &ev);
}

static void c_send(struct ccl *c, const uint8_t *p, size_t n)
{
    if (send(c->fd, p, n, MSG_DONTWAIT | MSG_NOSIGNAL) != (ssize_t)n) {
        c_close(c, C_FAILED);
        c_failed++;
    }
}

static void c_connected(struct ccl *c)
{
    int err = 0;
    socklen_t el = sizeof(err);
    getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &el);
    if (err) { /* refused, timed out: again in 0.1 s, 100 times at most */
        c_close(c, ++c->tries >= 100 ? C_FAILED : C_IDLE);
        if (c->st == C_FAILED)
            c_failed++;
        c->retry_at = now() + 0.1;
        return;
    }
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
    epoll_ctl(c_ep, EPOLL_CTL_MOD, c->fd, &ev);
    tcp_nodelay(c->fd);
    c->st = C_LOGIN;
    uint8_t m[128], *w = m;
    if (!c_mqtt) {
        *w++ = 0;
        *w++ = 47;
        *w++ = 'L';
        w += sprintf((char *)w, "%-6.6s%-10.10s%-10s%20s", c_user, c_pass, "", "0");
    } else {
        char id[32];
        int il = snprintf(id, sizeof(id), "sf-%ld", (long)(c - cc));
        *w++ = 0x10;
        *w++ = 10 + 2 + il;
        memcpy(w, "\0\4MQTT\4\2\0\0", 10);
        w += 10;
        *w++ = 0;
        *w++ = il;
        memcpy(w, id, il);
        w += il;
    }
    c_send(c, m, w - m);
}

static void c_packet(void *ctx, uint8_t type, uint32_t total, uint8_t first)
{
    struct ccl *c = ctx;
    if (!c_mqtt) {
        switch (type) {
        case 'S':
            c->msgs++;
            c->bytes += total;
            return;
        case 'A':
            if (c->st == C_LOGIN) {
                c->st = C_READY;
                c_ready++;
                c_logins++;
                c_pending--;
            }
            return;
        case 'J':
            c_rejected++;
            fprintf(stderr, "sf_helper clients: Login Rejected %c\n", first);
            c_close(c, C_FAILED);
            c_failed++;
            return;
        case 'H':
            c_hb++;
            return;
        case 'Z':
            c_eos++;
            return;
        case '+':
            c_debug++;
            return;
        }
    } else {
        if (type == 0x30) {
            c->msgs++;
            c->bytes += total;
            return;
        }
        if (type == 0x20 && c->st == C_LOGIN) { /* CONNACK: SUBSCRIBE, packet id 1, QoS 0 */
            uint8_t m[128], *w = m;
            size_t tl = strlen(c_topic);
            *w++ = 0x82;
            *w++ = 2 + 2 + tl + 1;
            *w++ = 0;
            *w++ = 1;
            *w++ = tl >> 8;
            *w++ = tl & 0xff;
            memcpy(w, c_topic, tl);
            w += tl;
            *w++ = 0;
            c_send(c, m, w - m);
            return;
        }
        if (type == 0x90 && c->st == C_LOGIN) { /* SUBACK */
            c->st = C_READY;
            c_ready++;
            c_logins++;
            c_pending--;
            return;
        }
    }
    c_other++;
}

static void c_snapshot(void)
{
    uint64_t msgs = 0, bytes = 0;
    for (int i = 0; i < c_n; i++)
        msgs += cc[i].msgs, bytes += cc[i].bytes;
    printf("{\"t\": %.6f, \"ready\": %d, \"logins\": %d, \"closed\": %d, \"failed\": %d, \"rejected\": %d",
           now(), c_ready, c_logins, c_closed, c_failed, c_rejected);
    printf(", \"msgs\": %" PRIu64 ", \"bytes\": %" PRIu64 ", \"all_bytes\": %" PRIu64 ", \"heartbeats\": %" PRIu64
           ", \"debug\": %" PRIu64 ", \"end_of_session\": %" PRIu64 ", \"other\": %" PRIu64 ", \"per\": [",
           msgs, bytes, c_all_bytes, c_hb, c_debug, c_eos, c_other);
    for (int i = 0; i < c_n; i++)
        printf(i ? ",%" PRIu64 : "%" PRIu64, cc[i].msgs);
    printf("]}\n");
    fflush(stdout);
}

static int cmd_clients(int argc, char **argv)
{
    if (argc != 9)
        die("usage: clients soup|mqtt IP PORT N USER PASSWORD TOPIC");
    signal(SIGPIPE, SIG_IGN);
    c_mqtt = !strcmp(argv[2], "mqtt");
    c_addr = addr_of(argv[3], atoi(argv[4]));
    c_n = atoi(argv[5]);
    c_user = argv[6];
    c_pass = argv[7];
    c_topic = argv[8];
    cc = calloc(c_n, sizeof(*cc));
    for (int i = 0; i < c_n; i++)
        cc[i].fd = -1;
    c_ep = epoll_create1(0);
    static int tag_stdin;
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &tag_stdin};
    epoll_ctl(c_ep, EPOLL_CTL_ADD, 0, &ev);
    static uint8_t buf[1 << 20];
    struct epoll_event evs[MAX_EVENTS];
    int said_ready = 0, next = 0;
    double last_hb = now();
    for (;;) {
        double t = now();
        for (int i = 0; i < c_n && c_pending < 64; i++) { /* (re)connect, 64 at once */
            int j = (next + i) % c_n;
            if (cc[j].st == C_IDLE && cc[j].retry_at <= t) {
                c_start(&cc[j]);
                next = j + 1;
            }
        }
        if (!said_ready && c_ready + c_failed == c_n) {
            printf("{\"ready\": %d, \"failed\": %d, \"rejected\": %d}\n", c_ready, c_failed, c_rejected);
            fflush(stdout);
            said_ready = 1;
        }
        if (!c_mqtt && t - last_hb >= 1.0) { /* Client Heartbeats */
            static const uint8_t hb[3] = {0, 1, 'R'};
            for (int i = 0; i < c_n; i++)
                if (cc[i].st == C_READY)
                    send(cc[i].fd, hb, 3, MSG_DONTWAIT | MSG_NOSIGNAL);
            last_hb = t;
        }
        int k = epoll_wait(c_ep, evs, MAX_EVENTS, 50);
        for (int e = 0; e < k; e++) {
            if (evs[e].data.ptr == &tag_stdin) {
                char cmd[64];
                ssize_t r = read(0, cmd, sizeof(cmd));
                if (r <= 0 || memchr(cmd, 'q', r))
                    return 0;
                for (ssize_t i = 0; i < r; i++)
                    if (cmd[i] == 's')
                        c_snapshot();
                continue;
            }
            struct ccl *c = evs[e].data.ptr;
            if (c->fd < 0)
                continue;
            if (c->st == C_CONNECTING) {
                if (evs[e].events & (EPOLLOUT | EPOLLERR | EPOLLHUP))
                    c_connected(c);
                continue;
            }
            for (int round = 0; round < 4 && c->fd >= 0; round++) {
                ssize_t r = recv(c->fd, buf, sizeof(buf), MSG_DONTWAIT);
                if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
                    break;
                if (r <= 0) { /* closed by the server: in again in 0.1 s (100 times at most) */
                    int again = ++c->tries < 100;
                    if (!again)
                        c_failed++;
                    c_close(c, again ? C_IDLE : C_FAILED);
                    c->retry_at = now() + 0.1;
                    break;
                }
                c_all_bytes += r;
                if (parse(&c->ps, buf, r, c, c_packet)) {
                    fprintf(stderr, "sf_helper clients: malformed stream\n");
                    c_close(c, C_CLOSED);
                    break;
                }
                if ((size_t)r < sizeof(buf))
                    break;
            }
        }
    }
}

int main(int argc, char **argv)
{
    if (argc < 2)
        die("usage: sf_helper publish|server|clients ...");
    if (!strcmp(argv[1], "publish"))
        return cmd_publish(argc, argv);
    if (!strcmp(argv[1], "server"))
        return cmd_server(argc, argv);
    if (!strcmp(argv[1], "clients"))
        return cmd_clients(argc, argv);
    die("unknown command");
    return 2;
}
"""


# -- the topology ------------------------------------------------------------------------------


def remove_topology() -> None:
    if Path(f"/run/netns/{BRK}").exists():  # the broker's pins and state are keyed by its namespace
        subprocess.run(in_ns(BRK, *SUBC, "unload", "--iface", "sfb0"), capture_output=True)
    for ns in (PUB, BRK, CLI):
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def make_topology() -> None:
    remove_topology()
    for ns in (PUB, BRK, CLI):
        sh("ip", "netns", "add", ns)
        sh("ip", "-n", ns, "link", "set", "lo", "up")
    for (ns_a, a, ip_a), (ns_b, b, ip_b) in (
        ((PUB, "sfp0", PUB_IP), (BRK, "sfb0", FEED_IP)),
        ((BRK, "sfb1", SRV_IP), (CLI, "sfc1", CLI_IP)),
    ):
        sh("ip", "link", "add", a, "netns", ns_a, "type", "veth", "peer", "name", b, "netns", ns_b)
        for ns, dev, ip in ((ns_a, a, ip_a), (ns_b, b, ip_b)):
            sh("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", dev)
            sh("ip", "-n", ns, "link", "set", dev, "up")
            sh(*in_ns(ns, "ethtool", "-K", dev, "gro", "on"))  # NAPI on every veth, so it can be threaded
            sh("ip", "netns", "exec", ns, "sh", "-c", f"echo 1 > /sys/class/net/{dev}/threaded")
    # the feed: complete UDP checksums and no TSO (every frame to the server's NAPI ring), a queue
    # in front of the veth so that a full ring pushes back (Linux 6.16+) instead of dropping
    sh(*in_ns(PUB, "ethtool", "-K", "sfp0", "tso", "off", "tx", "off"))
    sh("ip", "netns", "exec", PUB, "tc", "qdisc", "replace", "dev", "sfp0", "root", "pfifo", "limit", "10000")
    for ns, dev, ip, peer_ns, peer in (
        (PUB, "sfp0", FEED_IP, BRK, "sfb0"),
        (BRK, "sfb0", PUB_IP, PUB, "sfp0"),
        (BRK, "sfb1", CLI_IP, CLI, "sfc1"),
        (CLI, "sfc1", SRV_IP, BRK, "sfb1"),
    ):
        sh("ip", "-n", ns, "neigh", "replace", ip, "lladdr", mac_of(peer_ns, peer), "dev", dev, "nud", "permanent")


def napi_threads() -> dict[str, list[int]]:
    """Device -> the pids of its NAPI kthreads (``napi/<dev>-<id>``)."""
    out: dict[str, list[int]] = {}
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                comm = (p / "comm").read_text().strip()
            except OSError:
                continue
            if comm.startswith("napi/sf"):
                out.setdefault(comm[5:].rsplit("-", 1)[0], []).append(int(p.name))
    return out


def pin_napi() -> list[int]:
    """Pin the server veths' NAPI kthreads to the broker's CPU, the others' to the other CPU; the
    server's ones (for ``own_cpu``)."""
    threads = napi_threads()
    for dev in ("sfb0", "sfb1", "sfp0", "sfc1"):
        if not threads.get(dev):
            raise SystemExit(f"no NAPI kthread for {dev}: threaded NAPI unavailable")
    for dev, pids in threads.items():
        cpu = BROKER_CPU if dev in ("sfb0", "sfb1") else OTHER_CPU
        for pid in pids:
            sh("taskset", "-pc", str(cpu), str(pid))
    return threads["sfb0"] + threads["sfb1"]


# -- CPU counters ------------------------------------------------------------------------------


def cpu_times() -> dict[int, tuple[int, int]]:
    """CPU -> (busy, total) jiffies from /proc/stat."""
    out = {}
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("cpu") and line[3].isdigit():
            f = line.split()
            v = [int(x) for x in f[1:9]]  # user nice system idle iowait irq softirq steal
            busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7]
            out[int(f[0][3:])] = (busy, busy + v[3] + v[4])
    return out


def proc_ticks(pids: list[int]) -> int:
    """utime + stime (clock ticks) of the processes (all their threads) ``pids``."""
    n = 0
    for pid in pids:
        try:
            f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        n += int(f[11]) + int(f[12])
    return n


# -- the workload ------------------------------------------------------------------------------


def workload(sample: Path) -> tuple[bytes, dict]:
    """The payloads file (2-byte length, payload) of the sample's Add Orders, packed as a feed."""
    msgs = [m for _, m in read_binaryfile(sample) if m[:1] in (b"A", b"F")]
    dgs = list(feed_datagrams(retime(msgs), SESSION))
    sizes = [len(d.messages) for d in dgs]
    data = b"".join(struct.pack(">H", len(d.payload)) + d.payload for d in dgs)
    return data, {
        "messages": len(msgs),
        "datagrams": len(dgs),
        "mean_messages": round(len(msgs) / len(dgs), 2),
        "max_messages": max(sizes),
        "mean_message_bytes": round(sum(map(len, msgs)) / len(msgs), 2),
    }


# -- the processes -----------------------------------------------------------------------------


class Clients:
    """``sf_helper clients``: N connections from the clients' namespace, pinned to the other CPU."""

    def __init__(self, helper: Path, proto: str, port: int, n: int, timeout: float):
        self.p = subprocess.Popen(
            in_ns(
                CLI,
                "taskset",
                "-c",
                str(OTHER_CPU),
                str(helper),
                "clients",
                proto,
                SRV_IP,
                str(port),
                str(n),
                USER,
                PASSWORD,
                TOPIC,
            ),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.ready = self._line(timeout)
        if "ready" not in self.ready:
            raise SystemExit(f"clients: {self.ready}")

    def _line(self, timeout: float) -> dict:
        import select

        if not select.select([self.p.stdout], [], [], timeout)[0]:
            self.close()
            raise SystemExit(f"the clients said nothing in {timeout:.0f} s")
        line = self.p.stdout.readline()
        if not line:
            raise SystemExit(f"the clients exited ({self.p.wait()})")
        return json.loads(line)

    def snapshot(self) -> dict:
        self.p.stdin.write("s\n")
        self.p.stdin.flush()
        return self._line(30)

    def close(self) -> None:
        if self.p.poll() is None:
            try:
                self.p.stdin.write("q\n")
                self.p.stdin.flush()
                self.p.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.p.kill()
                self.p.wait()


class Server:
    """One server in the server's namespace, on the broker's CPU: :meth:`start`, :meth:`stop`."""

    def __init__(self, kind: str, helper: Path, work: Path):
        self.kind, self.helper, self.work = kind, helper, work
        self.p: subprocess.Popen | None = None
        self.err = work / f"{kind}.stderr"
        self.counters: dict = {}

    def start(self) -> None:
        taskset = ["taskset", "-c", str(BROKER_CPU)]
        with open(self.err, "w") as err:
            if self.kind == "subc":
                args = [
                    *SUBC,
                    "load",
                    str(self.work / "out"),
                    "--iface",
                    "sfb0",
                    "--subscribers",
                    str(self.work / "subscribers.toml"),
                    "--journal",
                    "--segment-bytes",
                    "16MiB",
                    "--retain",
                    "256MiB",
                    "--soup",
                    f"{SRV_IP}:{PORTS['subc']}",
                ]
                self.p = subprocess.Popen(in_ns(BRK, *taskset, *args), stdout=subprocess.DEVNULL, stderr=err, cwd=ROOT)
                self._wait_for("journal feed running")
            elif self.kind == "user":
                args = [str(self.helper), "server", FEED_IP, str(FEED_PORT), SRV_IP, str(PORTS["user"])]
                self.p = subprocess.Popen(
                    in_ns(BRK, *taskset, *args), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True
                )
                self._wait_for("listening")
            else:
                conf = self.work / "mosquitto.conf"
                conf.write_text(MOSQUITTO_CONF.format(port=PORTS["mosquitto"]))
                self.p = subprocess.Popen(
                    in_ns(BRK, *taskset, "mosquitto", "-c", str(conf)), stdout=subprocess.DEVNULL, stderr=err
                )
                self._wait_for(None)

    def _wait_for(self, text: str | None, timeout: float = 120) -> None:
        end = time.monotonic() + timeout
        while True:
            assert self.p is not None
            if self.p.poll() is not None:
                raise SystemExit(f"{self.kind} exited ({self.p.returncode}): {self.err.read_text()[-2000:]}")
            if text is not None and text in self.err.read_text():
                return
            if text is None and f":{PORTS[self.kind]}" in sh(*in_ns(BRK, "ss", "-Hltn"), check=False):
                return
            if time.monotonic() > end:
                raise SystemExit(f"{self.kind} did not start in {timeout:.0f} s: {self.err.read_text()[-2000:]}")
            time.sleep(0.1)

    @property
    def pids(self) -> list[int]:
        return [self.p.pid] if self.p is not None and self.p.poll() is None else []

    def stats(self) -> dict:
        """subc: what ``subc stats`` says of the journal and the SoupBinTCP server (else {})."""
        if self.kind != "subc":
            return {}
        s = json.loads(sh(*in_ns(BRK, *SUBC, "stats", "--iface", "sfb0", "--json"), check=False) or "{}")
        svc = (s.get("journal") or {}).get("service") or {}
        soup = svc.get("soup") or {}
        return {
            "journal_lost": (s.get("stats") or {}).get("journal_lost", 0),
            "hole_messages": sum(x.get("hole_messages", 0) for x in (svc.get("subscribers") or {}).values()),
            "soup_counters": soup.get("counters", {}),
        }

    def stop(self) -> None:
        p, self.p = self.p, None
        if p is not None and p.poll() is None:
            if self.kind == "user":
                try:
                    out, _ = p.communicate("q\n", timeout=30)
                    self.counters = json.loads(out or "{}")
                except (subprocess.TimeoutExpired, ValueError):
                    p.kill()
            else:
                p.send_signal(signal.SIGINT if self.kind == "subc" else signal.SIGTERM)
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if self.kind == "subc":
            subprocess.run(in_ns(BRK, *SUBC, "unload", "--iface", "sfb0"), capture_output=True)


def publish(helper: Path, work: Path, kind: str, seconds: float, rate: int) -> subprocess.Popen:
    proto, port = ("mqtt", PORTS["mosquitto"]) if kind == "mosquitto" else ("udp", FEED_PORT)
    return subprocess.Popen(
        in_ns(
            PUB,
            "taskset",
            "-c",
            str(OTHER_CPU),
            str(helper),
            "publish",
            proto,
            str(work / "payloads"),
            FEED_IP,
            str(port),
            str(seconds),
            str(rate),
            TOPIC,
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


# -- one measurement ---------------------------------------------------------------------------


def snap(clients: Clients, pids: list[int]) -> dict:
    return {"clients": clients.snapshot(), "cpu": cpu_times(), "own": proc_ticks(pids), "wall": time.monotonic()}


def drain(clients: Clients, quiet: float = 0.5, limit: float = 20.0) -> dict:
    """Wait until the clients' counts stand still for ``quiet`` s (at most ``limit`` s)."""
    last, since, end = clients.snapshot(), time.monotonic(), time.monotonic() + limit
    while time.monotonic() < end:
        time.sleep(0.1)
        now = clients.snapshot()
        if now["all_bytes"] != last["all_bytes"]:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet:
            break
    return last


def measure(
    server: Server, clients: Clients, helper: Path, work: Path, rate: int, seconds: float, warmup: float
) -> dict:
    pids = server.pids + pin_napi()
    before = server.stats()
    pub = publish(helper, work, server.kind, warmup + seconds + TAIL, rate)
    time.sleep(warmup)
    a = snap(clients, pids)
    time.sleep(seconds)
    b = snap(clients, pids)
    out, err = pub.communicate(timeout=60 + seconds)
    if pub.returncode:
        raise SystemExit(f"publisher failed ({pub.returncode}): {err.strip()}")
    p = json.loads(out)
    end = drain(clients)
    after = server.stats()
    ca, cb = a["clients"], b["clients"]
    dt = cb["t"] - ca["t"]
    per = [y - x for x, y in zip(ca["per"], cb["per"])]
    connected = cb["ready"]
    gbps = 8 * (cb["bytes"] - ca["bytes"]) / dt / 1e9
    busy = {c: (b["cpu"][c][0] - a["cpu"][c][0]) / max(1, b["cpu"][c][1] - a["cpu"][c][1]) for c in b["cpu"]}
    row = {
        "server": server.kind,
        "clients": len(per),
        "connected": connected,
        "offered_rate": rate,
        "published_msgs_per_s": p["messages"] / p["seconds"],
        "publisher": p,
        "seconds": dt,
        "delivered": cb["msgs"] - ca["msgs"],
        "msgs_per_s": (cb["msgs"] - ca["msgs"]) / dt,
        "gbps": gbps,
        "per_client_min": min(per),
        "per_client_max": max(per),
        "cpu1": busy[BROKER_CPU],
        "cpu0": busy[OTHER_CPU],
        "own_cpu": (b["own"] - a["own"]) / CLK_TCK / (b["wall"] - a["wall"]),
        "reconnections": end["closed"] - ca["closed"],
        "debug_packets": end["debug"],
        "delivered_total": end["msgs"],
    }
    row["of_offered"] = row["msgs_per_s"] / max(1.0, row["published_msgs_per_s"] * max(connected, 1))
    row["cores_per_gbps"] = row["cpu1"] / gbps if gbps > 0 else None
    row["own_per_gbps"] = row["own_cpu"] / gbps if gbps > 0 else None
    if server.kind == "subc":
        row["journal_lost_copies"] = after.get("journal_lost", 0) - before.get("journal_lost", 0)
        row["soup_disconnects"] = {
            k: v for k, v in after.get("soup_counters", {}).items() if k.startswith("disconnect")
        }
    return row


TARGETS = (500_000, 2_000_000, 8_000_000, 16_000_000, 32_000_000, 64_000_000)


def default_rates(n: int) -> list[int]:
    """Offered feed rates for ``n`` clients: total deliveries of :data:`TARGETS` messages/s (the
    feed at least 1,000 and at most 2M messages/s), then as fast as the publisher can (0)."""
    rates = sorted({min(2_000_000, max(1000, int(round(t / n, -3)))) for t in TARGETS})
    return rates + [0]


def run_server(kind: str, n: int, rates: list[int], helper: Path, work: Path, args) -> tuple[list[dict], dict]:
    """Server ``kind`` with ``n`` clients at each offered rate: one row per rate, its counters."""
    server = Server(kind, helper, work)
    clients = None
    rows: list[dict] = []
    try:
        server.start()
        pin_napi()
        # a little feed first: subc's SoupBinTCP server gives a login to an empty journal the blank
        # session, and End of Session once the feed's session is journaled (so for every server alike)
        prime = publish(helper, work, kind, 0.2, 5000)
        prime.communicate(timeout=60)
        proto = "mqtt" if kind == "mosquitto" else "soup"
        clients = Clients(helper, proto, PORTS[kind], n, timeout=60 + n / 10)
        if clients.ready["ready"] < n:
            print(f"  {kind}: only {clients.ready['ready']} of {n} clients got in: {clients.ready}", flush=True)
        for rate in rates:
            rows.append(measure(server, clients, helper, work, rate, args.seconds, args.warmup))
        counters = server.stats()
    finally:
        if clients is not None:
            clients.close()
        server.stop()
    return rows, counters or server.counters


def fmt_range(xs: list[float], f: str = ",.0f") -> str:
    return f"{statistics.median(xs):{f}} [{min(xs):{f}}, {max(xs):{f}}]"


def summarize(runs: list[dict], sizes: list[int], servers: list[str], repeat: int) -> list[dict]:
    """Per client count and server: the peak delivered msg/s over the offered rates, per repeat."""
    summary = []
    for n in sizes:
        print(
            f"\n{n} client{'s' if n > 1 else ''}: peak over the offered rates, median [min, max] over "
            f"{repeat} repeat{'s' if repeat > 1 else ''}"
        )
        print(f"{'':>22} " + " ".join(f"{s:>30}" for s in servers))
        peaks: dict[str, list[dict]] = {}
        for s in servers:
            peaks[s] = []
            for rep in range(repeat):
                rows = [r for r in runs if r["clients"] == n and r["server"] == s and r["repeat"] == rep]
                if rows:
                    peaks[s].append(max(rows, key=lambda r: r["msgs_per_s"]))
        lines = {
            "delivered msg/s": ("msgs_per_s", ",.0f"),
            "Gbps": ("gbps", ".3f"),
            "offered feed msg/s": ("published_msgs_per_s", ",.0f"),
            "of offered": ("of_offered", ".3f"),
            "cpu1 busy": ("cpu1", ".2f"),
            "cores/Gbps (cpu1)": ("cores_per_gbps", ".2f"),
            "own cpu/s": ("own_cpu", ".2f"),
            "own cpu/Gbps": ("own_per_gbps", ".2f"),
            "cpu0 busy": ("cpu0", ".2f"),
        }
        row = {"clients": n}
        for label, (key, f) in lines.items():
            cells = []
            for s in servers:
                xs = [p[key] for p in peaks[s] if p.get(key) is not None]
                cells.append(fmt_range(xs, f) if xs else "-")
                row.setdefault(s, {})[key] = xs
            print(f"{label:>22} " + " ".join(f"{c:>30}" for c in cells))
        summary.append(row)
    return summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", default="1,100,1000", help="client counts, comma-separated")
    ap.add_argument("--seconds", type=float, default=3.0, help="measurement window per offered rate")
    ap.add_argument("--warmup", type=float, default=0.5, help="seconds of feed before each window")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument(
        "--rates",
        help="offered feed rates, messages/s, comma-separated (0: as fast as the publisher "
        "can); default per client count: total deliveries of 0.5M, 2M, 8M, 16M, 32M and 64M msg/s (the feed "
        "from 1,000 to 2M msg/s), then 0",
    )
    ap.add_argument("--servers", default=",".join(SERVERS), help="of subc,user,mosquitto")
    ap.add_argument("--sample", default=str(SAMPLE), help="a BinaryFILE of ITCH 5.0 messages")
    ap.add_argument("--json", help="write every run and the summary here")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root (network namespaces, XDP, TC)")
    if (os.cpu_count() or 1) < 2:
        raise SystemExit("needs two CPUs (server on CPU 1, publisher and clients on CPU 0)")
    sizes = [int(x) for x in args.clients.split(",")]
    servers = [s for s in args.servers.split(",") if s]
    if not set(servers) <= set(SERVERS):
        raise SystemExit(f"unknown server in {args.servers}")
    notes = []
    if "mosquitto" in servers and not shutil.which("mosquitto"):
        servers.remove("mosquitto")
        notes.append("mosquitto is not installed (Debian: apt-get install mosquitto): skipped")
        print(f"note: {notes[-1]}", flush=True)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = max(sizes) * 2 + 1024
    if soft < want:  # inherited by the servers and the clients
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard) if hard != resource.RLIM_INFINITY else want, hard))
        if hard != resource.RLIM_INFINITY and hard < want:
            raise SystemExit(f"the file descriptor limit ({hard}) is below the {want} that {max(sizes)} clients need")
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    payloads, shape = workload(Path(args.sample))
    print(f"feed: {shape}", flush=True)
    runs, counters, loads = [], [], []
    with tempfile.TemporaryDirectory(prefix="subc-sf-") as tmp:
        work = Path(tmp)
        helper = work / "sf_helper"
        (work / "sf_helper.c").write_text(HELPER_C)
        sh("cc", "-O2", "-Wall", "-o", str(helper), str(work / "sf_helper.c"))
        (work / "payloads").write_bytes(payloads)
        (work / "rules.sub").write_text(RULES)
        sh(*SUBC, "compile", str(work / "rules.sub"), "--spec", str(SPEC), "--target", "ebpf", "-o", str(work / "out"))
        (work / "subscribers.toml").write_text(
            f'[[subscriber]]\nid = 1\nsoup = {{ user = "{USER}", password = "{PASSWORD}" }}\n'
        )
        make_topology()
        try:
            hdr = (
                f"{'rep':>3} {'clients':>7} {'server':>9} {'offered/s':>10} {'fed msg/s':>10} "
                f"{'delivered msg/s':>16} {'Gbps':>7} {'of offered':>10} {'cpu1':>5} {'cores/Gbps':>10} "
                f"{'own':>5} {'own/Gbps':>8} {'cpu0':>5} {'min/max per client':>22}"
            )
            print(hdr, flush=True)
            for rep in range(args.repeat):
                for n in sizes:
                    rates = [int(x) for x in args.rates.split(",")] if args.rates else default_rates(n)
                    before = loadavg()
                    for kind in servers:
                        rows, c = run_server(kind, n, rates, helper, work, args)
                        for r in rows:
                            r["repeat"] = rep
                            cpg = f"{r['cores_per_gbps']:.2f}" if r["cores_per_gbps"] is not None else "-"
                            opg = f"{r['own_per_gbps']:.2f}" if r["own_per_gbps"] is not None else "-"
                            extra = ""
                            if r["connected"] < n:
                                extra += f"  connected {r['connected']}"
                            if r["reconnections"]:
                                extra += f"  reconnections {r['reconnections']}"
                            if r.get("journal_lost_copies"):
                                extra += f"  not journaled: {r['journal_lost_copies']} copies"
                            if r.get("soup_disconnects"):
                                extra += f"  {r['soup_disconnects']}"
                            print(
                                f"{rep:>3} {n:>7} {kind:>9} {r['offered_rate'] or 'max':>10} "
                                f"{r['published_msgs_per_s']:>10,.0f} {r['msgs_per_s']:>16,.0f} {r['gbps']:>7.3f} "
                                f"{r['of_offered']:>10.3f} {r['cpu1']:>5.2f} {cpg:>10} {r['own_cpu']:>5.2f} {opg:>8} "
                                f"{r['cpu0']:>5.2f} {r['per_client_min']:>10,}/{r['per_client_max']:<11,}{extra}",
                                flush=True,
                            )
                        runs += rows
                        counters.append({"server": kind, "clients": n, "repeat": rep, "counters": c})
                    loads.append({"clients": n, "repeat": rep, "loadavg_before": before, "loadavg_after": loadavg()})
        finally:
            remove_topology()
    summary = summarize(runs, sizes, servers, args.repeat)
    print(
        "load average (1, 5, 15 min) before/after each client count:",
        "; ".join(f"{x['clients']}: {x['loadavg_before']} -> {x['loadavg_after']}" for x in loads),
    )
    for note in notes:
        print(f"note: {note}")
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "args": vars(args),
                    "feed": shape,
                    "notes": notes,
                    "summary": summary,
                    "loads": loads,
                    "runs": runs,
                    "server_counters": counters,
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
