#!/usr/bin/env python3
"""Coverage-guided fuzzing of subc's input readers with atheris (libFuzzer); not a pytest module.

    python3 tests/fuzz_atheris.py TARGET [CORPUS_DIR ...] [libFuzzer options]
    python3 tests/fuzz_atheris.py spec tests/fuzz_corpus/spec -atheris_runs=20000

TARGET is ``spec`` (the bytes, decoded as UTF-8 with surrogate escapes, are a spec for
``parse_spec``), ``itch`` (the bytes are a BinaryFILE for ``iter_binaryfile``, ``walk_binaryfile``
and the splits, and a MoldUDP64 packet for ``decode_packet``) or ``pcap`` (the bytes are a trace
file for ``file_kind``, ``read_split`` and ``read_pcap``).  Every input must satisfy the contract
checked by ``tests/test_fuzz.py`` (whose checks this runs): success, or SubcError with a location /
naming the file and a byte offset, in under a second and bounded memory; anything else is a crash.

libFuzzer writes the new inputs it finds into the first corpus directory: when that is one of the
repository's corpora (``tests/fuzz_corpus/...``) a scratch directory is put before it, so that the
repository corpus changes only when you copy an input in (crashers: always).  Crashing inputs are
written to ``crash-*`` files in the current directory (``-artifact_prefix=DIR/`` to change).
Each input runs under tracemalloc (started and stopped per input, which is faster here than
tracing all the time), and CPython 3.11 leaks a few KB per start: the resident set grows by about
3 KB per input, so give runs of more than ~500,000 inputs a larger ``-rss_limit_mb``.
atheris is not a dependency of subc: ``python3 -m pip install atheris``.
"""

from __future__ import annotations

import atexit
import importlib
import os
import shutil
import sys
import tempfile
from pathlib import Path

import atheris

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

#: The modules under test, imported with coverage instrumentation (before test_fuzz imports them).
TARGET_MODULES = ["dpkt", "subc.spec.p4lexer", "subc.spec.front_end", "subc.workloads.itch_codec", "subc.wire.moldudp64",
                  "subc.analysis.splits", "subc.analysis.messages"]
with atheris.instrument_imports(include=["subc", "dpkt"]):
    for _name in TARGET_MODULES:
        importlib.import_module(_name)

import test_fuzz as checks  # after the instrumented imports

WORKDIR = tempfile.mkdtemp(prefix="subc-atheris-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
atexit.register(shutil.rmtree, WORKDIR, True)


def fuzz_spec(data: bytes) -> None:
    checks.check_spec(data.decode("utf-8", "surrogateescape"))


def fuzz_itch(data: bytes) -> None:
    checks.check_itch(data, "fuzz.itch", WORKDIR if len(data) > 256 else None)
    checks.check_mold(data)


def fuzz_pcap(data: bytes) -> None:
    checks.check_capture(data, WORKDIR)


TARGETS = {"spec": fuzz_spec, "itch": fuzz_itch, "pcap": fuzz_pcap}


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in TARGETS:
        sys.exit(f"usage: {sys.argv[0]} {{{'|'.join(TARGETS)}}} [CORPUS_DIR ...] [libFuzzer options]")
    target, args = sys.argv[1], sys.argv[2:]
    dirs = [i for i, a in enumerate(args) if not a.startswith("-")]
    if dirs and (HERE / "fuzz_corpus") in Path(args[dirs[0]]).resolve().parents:
        scratch = tempfile.mkdtemp(prefix=f"subc-atheris-{target}-")
        print(f"new inputs go to {scratch}", file=sys.stderr)
        args.insert(dirs[0], scratch)
    atheris.Setup([sys.argv[0]] + args, TARGETS[target])
    atheris.Fuzz()


if __name__ == "__main__":
    main()
