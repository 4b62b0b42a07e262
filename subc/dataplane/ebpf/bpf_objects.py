"""BPF objects by file descriptor: pinning, the kernel's info about programs, maps and links, XDP
links, and ``BPF_PROG_TEST_RUN`` (through libbcc's wrappers of the bpf(2) system call, and libbpf's
``bpf_prog_test_run_opts``, which libbcc exports).  Every failure raises
:class:`~subc.errors.SubcError`."""

from __future__ import annotations

import ctypes as ct
import errno
import os
import platform
import sys
from pathlib import Path

from ...errors import SubcError
from .bpf import libbcc


def obj_get(path: Path) -> int:
    """File descriptor of the pinned object at ``path``; SubcError when absent."""
    fd = libbcc().bpf_obj_get(str(path).encode())
    if fd < 0:
        raise SubcError(f"no pinned BPF object at {path}: is subc loaded on this interface?")
    return fd


def prog_info(fd: int) -> dict:
    """``{'id', 'xlated_insns', 'jited_bytes', 'verified_insns'}`` of the loaded program ``fd``.

    ``xlated_insns``: instructions after the verifier's rewrites (8 bytes each);
    ``verified_insns``: instructions the verifier processed over all paths (its complexity
    measure, limited to 1,000,000; Linux 5.16+, else 0).  From struct bpf_prog_info.
    """
    buf = ct.create_string_buffer(256)
    size = ct.c_uint32(256)
    if libbcc().bpf_obj_get_info(fd, ct.cast(buf, ct.c_void_p), ct.byref(size)) < 0:
        raise SubcError("bpf_obj_get_info failed")
    raw = buf.raw
    u32 = lambda off: int.from_bytes(raw[off : off + 4], sys.byteorder)  # noqa: E731
    # struct bpf_prog_info (include/uapi/linux/bpf.h): id at 4, jited_prog_len at 16,
    # xlated_prog_len at 20, verified_insns at 216
    return {
        "id": u32(4),
        "jited_bytes": u32(16),
        "xlated_insns": u32(20) // 8,
        "verified_insns": u32(216) if size.value >= 220 else 0,
    }


def obj_info(fd: int, what: str) -> bytes:
    """The first 256 bytes of the kernel's info struct of BPF object ``fd`` (struct bpf_prog_info,
    bpf_map_info or bpf_link_info, include/uapi/linux/bpf.h); SubcError naming ``what`` on failure."""
    buf = ct.create_string_buffer(256)
    size = ct.c_uint32(256)
    if libbcc().bpf_obj_get_info(fd, ct.cast(buf, ct.c_void_p), ct.byref(size)) < 0:
        raise SubcError(f"bpf_obj_get_info on {what} failed: {os.strerror(ct.get_errno())}")
    return buf.raw


def obj_id(fd: int, what: str = "a BPF object") -> int:
    """The kernel's id of the BPF program, map or link ``fd`` (``id`` is at byte 4 of struct
    bpf_prog_info, bpf_map_info and bpf_link_info alike, include/uapi/linux/bpf.h)."""
    return int.from_bytes(obj_info(fd, what)[4:8], sys.byteorder)


def map_max_entries(fd: int) -> int:
    """The max_entries of BPF map ``fd`` (a ring buffer's data bytes): byte 16 of struct
    bpf_map_info (include/uapi/linux/bpf.h)."""
    return int.from_bytes(obj_info(fd, "a BPF map")[16:20], sys.byteorder)


#: ``enum bpf_cmd`` BPF_LINK_CREATE and ``enum bpf_attach_type`` BPF_XDP (include/uapi/linux/bpf.h).
BPF_LINK_CREATE = 28
BPF_XDP = 37
SYS_BPF = {"x86_64": 321, "aarch64": 280, "armv7l": 386, "riscv64": 280, "ppc64le": 361, "s390x": 351}


def xdp_link_create(prog_fd: int, ifindex: int, flags: int) -> int:
    """Attach the XDP program ``prog_fd`` to interface ``ifindex`` through a BPF link (Linux 5.9)
    and return the link's descriptor.  ``flags``: XDP_FLAGS_SKB_MODE (2), XDP_FLAGS_DRV_MODE (4)
    or 0 (the driver's mode when it has one).  The program stays attached while the link is
    pinned or a descriptor of it is open, and nothing else can replace it meanwhile; when the
    device goes away the link stays, with no device (:func:`link_xdp_ifindex` 0).
    Raises SubcError with the kernel's reason (EBUSY: another XDP program is attached)."""
    nr = SYS_BPF.get(platform.machine())
    if nr is None:
        raise SubcError(f"no bpf(2) system call number known for {platform.machine()}")
    # union bpf_attr, link_create: prog_fd, target_ifindex, attach_type, flags (then zeros)
    attr = ct.create_string_buffer(
        b"".join(v.to_bytes(4, sys.byteorder) for v in (prog_fd, ifindex, BPF_XDP, flags)), 64
    )
    libc = ct.CDLL(None, use_errno=True)
    fd = libc.syscall(ct.c_long(nr), ct.c_int(BPF_LINK_CREATE), attr, ct.c_uint(64))
    if fd < 0:
        e = ct.get_errno()
        hint = " (another XDP program is attached)" if e == errno.EBUSY else ""
        raise SubcError(f"cannot attach XDP to interface index {ifindex}: {os.strerror(e)}{hint}")
    return fd


def link_xdp_ifindex(fd: int) -> int:
    """The interface index of the XDP link ``fd``: 0 once its device is gone (struct
    bpf_link_info: type at 0, id at 4, prog_id at 8, the union from byte 16, ``xdp.ifindex``
    first in it).  Raises SubcError when ``fd`` is not a link."""
    raw = obj_info(fd, "an XDP link")
    return int.from_bytes(raw[16:20], sys.byteorder)


def link_prog_id(fd: int) -> int:
    """The id of the program the BPF link ``fd`` runs (struct bpf_link_info ``prog_id``, byte 8)."""
    return int.from_bytes(obj_info(fd, "a BPF link")[8:12], sys.byteorder)


class BpfTestRunOpts(ct.Structure):
    """struct bpf_test_run_opts of libbpf 1.x (tools/lib/bpf/bpf.h), for :func:`test_run`."""

    _fields_ = [
        ("sz", ct.c_size_t),
        ("data_in", ct.c_void_p),
        ("data_out", ct.c_void_p),
        ("data_size_in", ct.c_uint32),
        ("data_size_out", ct.c_uint32),
        ("ctx_in", ct.c_void_p),
        ("ctx_out", ct.c_void_p),
        ("ctx_size_in", ct.c_uint32),
        ("ctx_size_out", ct.c_uint32),
        ("retval", ct.c_uint32),
        ("repeat", ct.c_int),
        ("duration", ct.c_uint32),
        ("flags", ct.c_uint32),
        ("cpu", ct.c_uint32),
        ("batch_size", ct.c_uint32),
    ]


def test_run(prog_fd: int, packet: bytes, repeat: int = 1) -> tuple[int, bytes, int]:
    """Run a loaded program on ``packet`` with BPF_PROG_TEST_RUN.

    Returns (return code, output packet, mean duration in ns per run).  Raises SubcError when
    the kernel refuses the test run.
    """
    lib = libbcc()
    fn = lib.bpf_prog_test_run_opts
    fn.argtypes = [ct.c_int, ct.POINTER(BpfTestRunOpts)]
    fn.restype = ct.c_int
    din = ct.create_string_buffer(packet, len(packet))
    dout = ct.create_string_buffer(len(packet) + 256)
    opts = BpfTestRunOpts()
    opts.sz = ct.sizeof(BpfTestRunOpts)
    opts.data_in = ct.cast(din, ct.c_void_p)
    opts.data_size_in = len(packet)
    opts.data_out = ct.cast(dout, ct.c_void_p)
    opts.data_size_out = len(dout)
    opts.repeat = repeat
    if fn(prog_fd, ct.byref(opts)) < 0:
        raise SubcError(f"BPF_PROG_TEST_RUN failed: {os.strerror(ct.get_errno())}")
    return opts.retval, dout.raw[: opts.data_size_out], opts.duration
