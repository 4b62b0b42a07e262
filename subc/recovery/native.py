"""The journal feed's C fast path (``feed_walk.c``), compiled at first use and loaded with ctypes.

The shared object is built with the system's C compiler (``cc``, else ``gcc`` or ``clang``:
``-O2 -shared -fPIC``) into a cache directory (``$SUBC_CACHE``, else ``$XDG_CACHE_HOME/subc``,
else ``~/.cache/subc``), named by the hash of the source, written to a temporary file and
renamed, so concurrent first uses do not collide.  :func:`feed_walk` returns None when no
compiler is found or the build fails: the feed then takes its Python path for every record
(correct, slower; ``subc stats`` says which path ran).  :func:`build` builds any such C file the
same way (``subc analyze``'s BinaryFILE frame walk, :func:`subc.analysis.splits.frame_walk`).
"""

from __future__ import annotations

import ctypes as ct
import hashlib
import os
import shutil
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path

SOURCE = Path(__file__).with_name("feed_walk.c")
#: subc_feed_walk's return values.
WALK_END, WALK_BUSY, WALK_SLOW, WALK_FULL = 0, 1, 2, 3


class FeedOut(ct.Structure):
    """``struct subc_feed_out`` of feed_walk.c: one recipient's output."""

    _fields_ = [
        ("next_seq", ct.c_uint64),
        ("first_seq", ct.c_uint64),
        ("buf", ct.c_void_p),
        ("offs", ct.c_void_p),
        ("cap", ct.c_uint32),
        ("len", ct.c_uint32),
        ("offs_cap", ct.c_uint32),
        ("n", ct.c_uint32),
        ("session", ct.c_uint8 * 10),
        ("pad", ct.c_uint8 * 6),
        ("fd", ct.c_int32),
        ("wrote", ct.c_uint32),
        ("seg_size", ct.c_uint64),
        ("seg_room", ct.c_uint64),
        ("err", ct.c_int32),
        ("pad2", ct.c_uint32),
        ("seg_session", ct.c_uint8 * 10),
        ("pad3", ct.c_uint8 * 6),
    ]


def cache_dir() -> Path:
    """Where compiled fast paths are kept."""
    if os.environ.get("SUBC_CACHE"):
        return Path(os.environ["SUBC_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "subc"


def _compiler() -> str | None:
    for cc in ("cc", "gcc", "clang"):
        if shutil.which(cc):
            return cc
    return None


@lru_cache(maxsize=None)
def build(source: Path) -> ct.CDLL | None:
    """The C file ``source`` built as a shared object in :func:`cache_dir` (named by the hash of
    its text, built once: to a temporary file, then renamed) and loaded, or None when no
    compiler is found or the build or the load fails."""
    src = source.read_bytes()
    out = cache_dir() / f"{source.stem}-{hashlib.sha256(src).hexdigest()[:16]}.so"
    if not out.is_file():
        cc = _compiler()
        if cc is None:
            return None
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=out.parent, suffix=".so")
            os.close(fd)
            r = subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", tmp, str(source)], capture_output=True, text=True)
            if r.returncode:
                os.unlink(tmp)
                return None
            os.replace(tmp, out)
        except OSError:
            return None
    try:
        return ct.CDLL(str(out))
    except OSError:
        return None


def _library() -> ct.CDLL | None:
    """feed_walk.c built and loaded, or None when it cannot be built here."""
    return build(SOURCE)


def _function(name: str, argtypes: list):
    """Function ``name`` of feed_walk.c (returning int) with its argument types, or None when the
    library cannot be built here."""
    lib = _library()
    if lib is None:
        return None
    fn = getattr(lib, name)
    fn.restype = ct.c_int
    fn.argtypes = argtypes
    return fn


def feed_walk():
    """The ``subc_feed_walk`` function (ctypes), or None when it cannot be built here."""
    return _function(
        "subc_feed_walk",
        [
            ct.c_void_p,
            ct.c_uint64,
            ct.POINTER(ct.c_uint64),
            ct.c_uint64,
            ct.POINTER(FeedOut),
            ct.c_uint32,
            ct.POINTER(ct.c_uint64),
        ],
    )


def feed_write():
    """The ``subc_feed_write`` function (ctypes), or None when it cannot be built here."""
    return _function("subc_feed_write", [ct.POINTER(FeedOut), ct.c_uint32])
