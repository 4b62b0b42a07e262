#!/usr/bin/env python3
"""The recovery service's share of journaling, alone: CPU time per ring record of the journal feed
(subc/recovery/journal_feed.py: the C walk, the appends to the journals) on records laid out as the
data plane writes them (subc/backends/ebpf/bpf/subc_journal.h), with no kernel, network or
competing process in the measurement.

Workload: ``--records`` copies for ``--subscribers`` recipients, round robin, each of 1 to 4
messages of ``--message-bytes`` bytes (an ITCH Add Order is 36) with the recipient's consecutive
sequence numbers, as 256-byte ring records (the payload inline; a copy over 248 bytes would take a
second record, which this workload avoids, as copies of 2.8 messages on average do).  The ring is
built once in memory; the feed then drains it ``--batch`` records at a time (the producer position
moved forward by a batch, as the kernel's wake-up hands the service a batch: about 1,700 records
per wake-up in ``bench/broker_throughput.py --journal`` at 32 subscribers), into in-memory journals
(``memfd``, ``--segment-bytes``).  Reported: CPU seconds (``time.process_time``: the process's
user and system time, the journals' ``write`` calls included) per record and per message, and the
records per CPU second; the median of ``--repeat`` runs.

    python3 bench/journal_feed_bench.py --subscribers 32 --records 500000 --batch 1700
"""

from __future__ import annotations

import argparse
import ctypes as ct
import random
import statistics
import struct
import time

from subc.recovery.journal import Journal
from subc.recovery.journal_feed import JournalFeed

RECORD = struct.Struct("<IHH")  # struct subc_jrec: recipient, payload length, flags
RING_HEAD = struct.Struct("<II")  # the ring's record header: length, page offset
INLINE, PAYLOAD = 248, 1
SESSION = b"BENCH00001"


class PrebuiltRing:
    """A ring buffer holding ``records`` (payloads by recipient) as the kernel lays them out,
    whose producer position the bench moves forward (:attr:`limit`)."""

    def __init__(self, records: list[tuple[int, bytes]]):
        size = 1
        while size < len(records) * 264:
            size <<= 1
        self.size, self.mask = size, size - 1
        self.mem = ct.create_string_buffer(size)
        self.address = ct.addressof(self.mem)
        view = memoryview(self.mem).cast("B")
        self.ends = []
        pos = 0
        for r, payload in records:
            rec = RECORD.pack(r, len(payload), PAYLOAD) + payload + bytes(INLINE - len(payload))
            view[pos : pos + 8] = RING_HEAD.pack(len(rec), 0)
            view[pos + 8 : pos + 8 + len(rec)] = rec
            pos += (len(rec) + 8 + 7) & ~7
            self.ends.append(pos)
        self.limit = 0
        self.cons = 0

    @property
    def consumer(self) -> int:
        return self.cons

    @property
    def producer(self) -> int:
        return self.limit

    def read(self, pos: int, limit: int | None = None):
        raise AssertionError("the bench's records all take the C walk")

    def release(self, pos: int) -> None:
        self.cons = pos

    def wait(self, timeout_s: float) -> bool:
        return True


def workload(subscribers: int, records: int, message_bytes: int, seed: int) -> tuple[list[tuple[int, bytes]], int]:
    """(recipient, MoldUDP64 payload) copies and their messages in all."""
    rnd = random.Random(seed)
    seq = {r: 1 for r in range(1, subscribers + 1)}
    out, messages = [], 0
    for i in range(records):
        r = 1 + i % subscribers
        k = rnd.choice((1, 1, 2, 3, 4))
        msgs = [bytes([65 + (i + m) % 26]) * message_bytes for m in range(k)]
        payload = SESSION + seq[r].to_bytes(8, "big") + k.to_bytes(2, "big")
        payload += b"".join(len(m).to_bytes(2, "big") + m for m in msgs)
        assert len(payload) <= INLINE
        out.append((r, payload))
        seq[r] += k
        messages += k
    return out, messages


def run(records: list[tuple[int, bytes]], subscribers: int, batch: int, segment_bytes: int) -> tuple[float, float]:
    """(CPU seconds, wall seconds) to drain the records, ``batch`` at a time."""
    ring = PrebuiltRing(records)
    journals = {r: Journal(None, segment_bytes=segment_bytes) for r in range(1, subscribers + 1)}
    feed = JournalFeed(ring, journals.get, recipients=list(journals))
    if feed.path != "c":
        raise SystemExit("no C compiler: the feed's fast path could not be built")
    c0, w0 = time.process_time(), time.perf_counter()
    for i in range(batch - 1, len(ring.ends) + batch - 1, batch):
        ring.limit = ring.ends[min(i, len(ring.ends) - 1)]
        while feed.drain():
            pass
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    assert sum(j.next_seq - 1 for j in journals.values()) == feed.counters["journaled_messages"]
    assert feed.counters["records"] == len(records), feed.counters
    for j in journals.values():
        j.close()
    return cpu, wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--subscribers", type=int, default=32)
    ap.add_argument("--records", type=int, default=500_000)
    ap.add_argument("--batch", type=int, default=1700, help="records per wake-up")
    ap.add_argument("--message-bytes", type=int, default=36)
    ap.add_argument("--segment-bytes", type=int, default=4 << 20)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    records, messages = workload(args.subscribers, args.records, args.message_bytes, args.seed)
    cpus = []
    for _ in range(args.repeat):
        cpu, wall = run(records, args.subscribers, args.batch, args.segment_bytes)
        cpus.append(cpu)
        print(f"  {len(records):,} records ({messages:,} messages): {cpu:.3f} CPU s, {wall:.3f} s", flush=True)
    cpu = statistics.median(cpus)
    lo, hi = 1e9 * min(cpus) / len(records), 1e9 * max(cpus) / len(records)
    print(
        f"{args.subscribers} subscribers, batches of {args.batch}: {1e9 * cpu / len(records):.0f} ns per record, "
        f"{1e9 * cpu / messages:.0f} ns per message, {len(records) / cpu:,.0f} records per CPU second "
        f"(median of {args.repeat}; min {lo:.0f}, max {hi:.0f} ns)"
    )


if __name__ == "__main__":
    main()
