"""BPF plumbing for the eBPF target: bcc compilation, program loading, maps, pinning, test runs.

Programs are compiled and loaded with bcc (Debian ``python3-bpfcc``); maps of loaded or pinned
programs are read and written through libbcc's wrappers of the ``bpf(2)`` system call
(``bpf_update_elem``, ``bpf_lookup_elem``, ``bpf_obj_pin``, ``bpf_obj_get``...), so that a later
process can reach a program another process loaded.  ``BPF_PROG_TEST_RUN`` goes through
libbpf's ``bpf_prog_test_run_opts`` (exported by libbcc).

Every failure raises :class:`~subc.errors.SubcError` with what to do: not root, bcc or kernel
headers missing (naming the Debian package), a verifier rejection (with the verifier's last
lines), a full map.
"""

from __future__ import annotations

import ctypes as ct
import errno
import os
import platform
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bcc import BPF  # no type information: Any

from ...backends.ebpf import map_names as MN
from ...errors import SubcError
from ...backends.ebpf.source import bcc_dialect

ENOTSUPP = 524  # the kernel's internal 'operation not supported' (include/linux/errno.h)

DIST_PACKAGES = "/usr/lib/python3/dist-packages"
BPFFS = Path("/sys/fs/bpf")
BPF_ANY = 0


def require_root(what: str) -> None:
    """Raise SubcError unless running as root (``what`` names the command)."""
    if os.geteuid() != 0:
        raise SubcError(f"{what} needs root (CAP_BPF and CAP_NET_ADMIN): run it with sudo")


def import_bcc():
    """The ``bcc`` module (Debian's, on the system Python path); SubcError naming the package if absent."""
    try:
        import bcc  # noqa: F401
    except ImportError:
        if DIST_PACKAGES not in sys.path and Path(DIST_PACKAGES, "bcc").is_dir():
            sys.path.append(DIST_PACKAGES)
        try:
            import bcc  # noqa: F401, F811
        except ImportError as e:
            raise SubcError(
                "bcc is not installed: install the Debian package python3-bpfcc (apt-get install python3-bpfcc)"
            ) from e
    import bcc

    return bcc


def check_kernel_headers() -> None:
    """Raise SubcError when bcc cannot find kernel headers for the running kernel."""
    build = Path("/lib/modules") / platform.release() / "build"
    if not (build / "include").exists() and not Path("/sys/kernel/kheaders.tar.xz").exists():
        raise SubcError(
            f"no kernel headers for {platform.release()} (bcc needs {build}): install linux-headers-amd64 "
            f"(or linux-headers-{platform.release()}) and link {build} to /usr/src/linux-headers-*-amd64 "
            f"and {build.parent / 'source'} to /usr/src/linux-headers-*-common"
        )


class _StderrCapture:
    """Capture file descriptor 2 (libbcc prints compiler and verifier logs there)."""

    def __enter__(self):
        sys.stderr.flush()
        self.tmp = tempfile.TemporaryFile()
        self.saved = os.dup(2)
        os.dup2(self.tmp.fileno(), 2)
        return self

    def __exit__(self, *exc):
        sys.stderr.flush()
        os.dup2(self.saved, 2)
        os.close(self.saved)
        self.tmp.seek(0)
        self.text = self.tmp.read().decode("utf-8", "replace")
        self.tmp.close()
        return False


def _tail(text: str, n: int = 25) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return "\n".join(lines[-n:])


@dataclass
class Program:
    """A compiled BPF object (bcc), its loaded XDP and TC functions, their tail-call targets
    (``tails``: the programs of :data:`TAIL_CALLS`, in order) and the fan-out's devmap program
    (``egress``: ``subc_egress``, or None when not loaded)."""

    bpf: BPF
    xdp: BPF.Function
    tc: BPF.Function
    tails: list[BPF.Function] = field(default_factory=list)
    egress: BPF.Function | None = None

    def map_fd(self, name: str) -> int:
        return self.bpf[name.encode()].map_fd

    def close(self) -> None:
        """Release the object's program and map file descriptors (bcc's ``cleanup``); programs
        and maps that are pinned or attached stay in the kernel."""
        self.bpf.cleanup()


#: Tail-call targets: (function, program type, prog array holding it, index in that array).
#: ``devmap``: an XDP program loaded for device map entries (expected attach type BPF_XDP_DEVMAP).
TAIL_CALLS = (
    ("subc_xdp_more", "xdp", MN.JMP_XDP, 0),
    ("subc_xdp_one", "xdp", MN.JMP_XDP, 1),
    ("subc_xdp_fan", "xdp", MN.JMP_XDP, 2),
    ("subc_tc_more", "tc", MN.JMP_TC, 0),
)
#: ``enum bpf_attach_type`` value of BPF_XDP_DEVMAP (include/uapi/linux/bpf.h).
BPF_XDP_DEVMAP = 33


def compile_and_load(
    src: str, cflags: list[str], xdp_fn: str = "subc_xdp", tc_fn: str = "subc_tc", egress_fn: str | None = None
) -> Program:
    """Compile C source ``src`` (one translation unit in standard helper syntax:
    :func:`~subc.backends.ebpf.source.program_source`; rewritten for bcc by
    :func:`~subc.backends.ebpf.source.bcc_dialect`) with bcc and load ``xdp_fn`` (XDP)
    and ``tc_fn`` (SCHED_CLS), the
    tail-call targets of :data:`TAIL_CALLS` into their prog arrays, and ``egress_fn`` (when given)
    as a devmap program (expected attach type BPF_XDP_DEVMAP).

    Raises SubcError when not root, when bcc or kernel headers are missing, when clang fails
    (with its messages), or when the verifier rejects a program (with its last lines).  A load
    the verifier gave up with EAGAIN (a signal arrived while it ran, as when a debugger or
    profiler attaches) is tried again, :data:`LOAD_ATTEMPTS` times in all.
    """
    require_root("loading BPF programs")
    bcc = import_bcc()
    check_kernel_headers()
    err: Exception | None
    with _StderrCapture() as cap:
        try:
            b = bcc.BPF(text=bcc_dialect(src).encode(), cflags=cflags)
        except Exception as e:  # bcc raises Exception on compile errors
            err = e
        else:
            err = None
    if err is not None:
        raise SubcError(f"bcc could not compile the program: {err}\n{_tail(cap.text)}")
    fns = {}
    kinds = {"xdp": (bcc.BPF.XDP, -1), "tc": (bcc.BPF.SCHED_CLS, -1), "devmap": (bcc.BPF.XDP, BPF_XDP_DEVMAP)}
    todo = [(xdp_fn, kinds["xdp"]), (tc_fn, kinds["tc"])] + [(n, kinds[k]) for n, k, _, _ in TAIL_CALLS]
    if egress_fn:
        todo.append((egress_fn, kinds["devmap"]))
    for name, (kind, attach) in todo:
        for attempt in range(LOAD_ATTEMPTS):
            with _StderrCapture() as cap:
                try:
                    fns[name] = b.load_func(name.encode(), kind, attach_type=attach)
                    err = None
                except Exception as e:
                    err = e
            # EAGAIN: a signal came while the verifier ran (it stops then), not a verdict
            if err is None or os.strerror(errno.EAGAIN) not in str(err):
                break
            time.sleep(0.05 * (attempt + 1))
        if err is not None:
            raise SubcError(
                f"the kernel verifier rejected {name}: {err}\nverifier log (last lines):\n{_tail(cap.text)}"
            )
    tails = [fns[n] for n, _, _, _ in TAIL_CALLS]
    for (_, _, array, index), fn in zip(TAIL_CALLS, tails):
        b[array.encode()][ct.c_int(index)] = ct.c_int(fn.fd)
    return Program(b, fns[xdp_fn], fns[tc_fn], tails, fns.get(egress_fn) if egress_fn else None)


#: Loads of one program tried while the verifier returns EAGAIN (as libbpf retries).
LOAD_ATTEMPTS = 5


def libbcc():
    """libbcc's ctypes library (its ``bpf_*`` wrappers of the bpf(2) system call); SubcError as
    :func:`import_bcc` when bcc is missing."""
    return import_bcc().libbcc.lib


def possible_cpus() -> int:
    """Number of possible CPUs (the per-CPU value count of per-CPU maps; CPU ids are below it)."""
    import_bcc()
    from bcc.utils import get_possible_cpus

    return max(get_possible_cpus()) + 1


class Map:
    """A BPF map by file descriptor: ``key_size`` and ``value_size`` in bytes; per-CPU maps
    read and write ``value_size`` rounded up to 8, times the possible CPUs.  With ``owned`` (a
    descriptor of :func:`obj_get`), :meth:`close` closes the descriptor."""

    def __init__(
        self, fd: int, key_size: int, value_size: int, percpu: bool = False, name: str = "", owned: bool = False
    ):
        self.fd, self.key_size, self.value_size, self.percpu, self.name = fd, key_size, value_size, percpu, name
        self.owned = owned
        self.ncpu = possible_cpus() if percpu else 1
        self.slot = (value_size + 7) // 8 * 8 if percpu else value_size
        self.lib = libbcc()
        self._batch = self._batch_delete = True  # until the kernel says the map type has no batch operations

    def close(self) -> None:
        """Close the descriptor when this handle owns it (the map lives on while pinned or used)."""
        if self.owned and self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def _err(self, what: str) -> SubcError:
        e = ct.get_errno()
        return SubcError(f"BPF map {self.name}: {what} failed: {os.strerror(e) if e else 'error'}")

    def update(self, key: bytes, value: bytes, flags: int = BPF_ANY) -> None:
        """Write one entry (``value`` for every CPU of a per-CPU map); SubcError when the map is full."""
        if self.percpu:
            value = (value + bytes(self.slot - len(value))) * self.ncpu
        k, v = ct.create_string_buffer(key, len(key)), ct.create_string_buffer(value, len(value))
        if self.lib.bpf_update_elem(self.fd, ct.cast(k, ct.c_void_p), ct.cast(v, ct.c_void_p), flags) < 0:
            raise self._err("update")

    def update_batch(self, keys: list[bytes], values: list[bytes]) -> None:
        """Write the entries (``keys[i]``, ``values[i]``) in order, with one BPF_MAP_UPDATE_BATCH
        (Linux 5.6) where the map type has it (hash and array maps), else one update each.
        SubcError when the map is full (the entries before the failing one are written)."""
        if not keys:
            return
        if not self._batch:
            for k, v in zip(keys, values):
                self.update(k, v)
            return
        if self.percpu:
            values = [(v + bytes(self.slot - len(v))) * self.ncpu for v in values]
        kb, vb = b"".join(keys), b"".join(values)
        kbuf, vbuf = ct.create_string_buffer(kb, len(kb)), ct.create_string_buffer(vb, len(vb))
        cnt = ct.c_uint32(len(keys))
        kp, vp = ct.cast(kbuf, ct.c_void_p), ct.cast(vbuf, ct.c_void_p)
        if self.lib.bpf_update_batch(self.fd, kp, vp, ct.byref(cnt)) >= 0:
            return
        e = ct.get_errno()
        if e in (errno.EINVAL, errno.EOPNOTSUPP, ENOTSUPP) and cnt.value == 0:  # no batch operations here
            self._batch = False
            self.update_batch(keys, [v[: self.value_size] for v in values] if self.percpu else values)
            return
        raise self._err("batch update")

    def delete_batch(self, keys: list[bytes]) -> None:
        """Delete ``keys`` (absent ones are skipped) with BPF_MAP_DELETE_BATCH where the map type
        has it (hash maps), else one delete each."""
        i = 0
        while i < len(keys):
            if not self._batch_delete:
                for key in keys[i:]:
                    self.delete(key)
                return
            kb = b"".join(keys[i:])
            k = ct.create_string_buffer(kb, len(kb))
            cnt = ct.c_uint32(len(keys) - i)
            if self.lib.bpf_delete_batch(self.fd, ct.cast(k, ct.c_void_p), ct.cast(ct.pointer(cnt), ct.c_void_p)) >= 0:
                return
            e = ct.get_errno()
            if e in (errno.EINVAL, errno.EOPNOTSUPP, ENOTSUPP) and cnt.value == 0:
                self._batch_delete = False
                continue
            if e != errno.ENOENT:
                raise self._err("batch delete")
            i += cnt.value + 1  # the key at cnt.value is absent: skip it

    def lookup(self, key: bytes) -> bytes | list[bytes] | None:
        """The value of ``key`` (per-CPU maps: one value per CPU), or None."""
        k = ct.create_string_buffer(key, len(key))
        v = ct.create_string_buffer(self.slot * self.ncpu)
        if self.lib.bpf_lookup_elem(self.fd, ct.cast(k, ct.c_void_p), ct.cast(v, ct.c_void_p)) < 0:
            return None
        raw = v.raw
        if self.percpu:
            return [raw[i * self.slot : i * self.slot + self.value_size] for i in range(self.ncpu)]
        return raw[: self.value_size]

    def array_values(self, count: int, chunk: int = 8192) -> list[bytes | None]:
        """The values of array indexes 0 .. ``count`` - 1 (an array map that is not per-CPU), read
        with BPF_MAP_LOOKUP_BATCH (Linux 5.6) ``chunk`` entries at a time where the kernel has it,
        else one lookup each.  Raises SubcError when the kernel refuses a read."""
        if self.percpu:
            raise ValueError(f"BPF map {self.name}: array_values reads maps that are not per-CPU")
        out: list[bytes | None] = [None] * count
        if not self._batch or count == 0:
            for i in range(count):
                out[i] = single(self.lookup(i.to_bytes(self.key_size, sys.byteorder)))
            return out
        kbuf = ct.create_string_buffer(self.key_size * chunk)
        vbuf = ct.create_string_buffer(self.value_size * chunk)
        token_in, token_out = ct.c_uint32(0), ct.c_uint32(0)
        started = False
        while True:
            cnt = ct.c_uint32(chunk)
            rc = self.lib.bpf_lookup_batch(
                self.fd,
                ct.byref(token_in) if started else None,
                ct.byref(token_out),
                ct.cast(kbuf, ct.c_void_p),
                ct.cast(vbuf, ct.c_void_p),
                ct.byref(cnt),
            )
            e = ct.get_errno() if rc < 0 else 0
            if rc < 0 and not started and cnt.value == 0 and e in (errno.EINVAL, errno.EOPNOTSUPP, ENOTSUPP):
                self._batch = False  # no batch operations here
                return self.array_values(count, chunk)
            if rc < 0 and e != errno.ENOENT:
                raise self._err("batch lookup")
            keys, vals = kbuf.raw, vbuf.raw
            for j in range(cnt.value):
                i = int.from_bytes(keys[j * self.key_size : (j + 1) * self.key_size], sys.byteorder)
                if i < count:
                    out[i] = vals[j * self.value_size : (j + 1) * self.value_size]
            if rc < 0 or cnt.value == 0:  # ENOENT: the last entries were read
                return out
            token_in.value, started = token_out.value, True
            last = int.from_bytes(keys[(cnt.value - 1) * self.key_size : cnt.value * self.key_size], sys.byteorder)
            if last + 1 >= count:
                return out

    def delete(self, key: bytes) -> bool:
        k = ct.create_string_buffer(key, len(key))
        return self.lib.bpf_delete_elem(self.fd, ct.cast(k, ct.c_void_p)) == 0

    def keys(self) -> list[bytes]:
        """All keys (a snapshot; hash and trie maps)."""
        out: list[bytes] = []
        cur: bytes | None = None
        nxt = ct.create_string_buffer(self.key_size)
        while True:
            if cur is None:
                rc = self.lib.bpf_get_next_key(self.fd, None, ct.cast(nxt, ct.c_void_p))
            else:
                k = ct.create_string_buffer(cur, len(cur))
                rc = self.lib.bpf_get_next_key(self.fd, ct.cast(k, ct.c_void_p), ct.cast(nxt, ct.c_void_p))
            if rc < 0:
                return out
            cur = nxt.raw[: self.key_size]
            out.append(cur)

    def pin(self, path: Path) -> None:
        pin_fd(self.fd, path)


def pin_fd(fd: int, path: Path) -> None:
    """Pin the BPF object ``fd`` at ``path`` (on a BPF file system)."""
    if libbcc().bpf_obj_pin(fd, str(path).encode()) < 0:
        raise SubcError(f"cannot pin a BPF object at {path}: {os.strerror(ct.get_errno())}")


def single(value: bytes | list[bytes] | None) -> bytes | None:
    """``value``, a :meth:`Map.lookup` result of a map that is not per-CPU: its one value, or None."""
    assert not isinstance(value, list), "a per-CPU map's values"
    return value


def present(value: bytes | list[bytes] | None) -> bytes:
    """``value``, a :meth:`Map.lookup` result of a map that is not per-CPU for a key it holds (an
    array map's index below its size): its one value."""
    assert value is not None and not isinstance(value, list), "a missing key, or a per-CPU map's values"
    return value


def per_cpu(value: bytes | list[bytes] | None) -> list[bytes]:
    """``value``, a :meth:`Map.lookup` result of a per-CPU map: one value per CPU (none when the
    key is missing)."""
    assert not isinstance(value, bytes), "the value of a map that is not per-CPU"
    return value or []
