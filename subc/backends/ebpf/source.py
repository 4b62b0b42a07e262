"""The eBPF program's C source: static files shipped with subc, two generated headers, and the
single translation unit bcc compiles.

The program is ``subc_filter.bpf.c`` and the ``subc_*.h`` headers it includes
(``subc/backends/ebpf/bpf/``): static C, the same for every rule set, with ``#if SUBC_MOLD`` /
``SUBC_STATE`` for the variants (as Katran and Cilium keep their BPF C static beside a small
generated configuration).  Code generation writes only ``subc_config.h`` and ``subc_classify.h``
(:data:`GENERATED_FILES`, from the Jinja templates beside them); ``subc compile`` copies the static
files next to them, so that an output directory holds the whole program and builds with
``clang -target bpf -DSUBC_LIBBPF -c subc_filter.bpf.c`` (:func:`clang_command`).

bcc, which loads the program, takes one source text: :func:`program_source` inlines the quoted
``#include "subc_*.h"`` lines, and :func:`bcc_dialect` rewrites the standard helper calls on a map
into bcc's method syntax (bcc 0.26 resolves maps only there; ``subc_compat.h``).
"""

from __future__ import annotations

import re
from functools import lru_cache
from collections.abc import Mapping, Sequence
from pathlib import Path

from ...errors import SubcError

BPF_DIR = Path(__file__).resolve().parent / "bpf"
"""The program's static C and its generated headers' templates (``subc/backends/ebpf/bpf``)."""

MAIN_FILE = "subc_filter.bpf.c"
"""The program's main file: the one a compiler is given."""

STATIC_FILES = (
    MAIN_FILE,
    "subc_compat.h",
    "subc_defs.h",
    "subc_types.h",
    "subc_maps.h",
    "subc_helpers.h",
    "subc_cluster.h",
    "subc_journal.h",
    "subc_xdp.h",
    "subc_fanout.h",
    "subc_tc.h",
)
"""The static C files, in ``subc/backends/ebpf/bpf/``."""

GENERATED_FILES = ("subc_config.h", "subc_classify.h")
"""The files code generation writes (each from ``<name>.j2``)."""

PROGRAM_FILES = STATIC_FILES + GENERATED_FILES
"""Every file of the program, as ``subc compile --target ebpf`` writes them."""

_INCLUDE = re.compile(r'^#include "([A-Za-z0-9_.]+)"[ \t]*$', re.M)


def static_files() -> dict[str, str]:
    """The static C files (name -> text), read from the installed package once (a new dict each
    call: callers add the generated headers to it)."""
    return dict(_static_texts())


@lru_cache(maxsize=1)
def _static_texts() -> tuple[tuple[str, str], ...]:
    return tuple((name, (BPF_DIR / name).read_text()) for name in STATIC_FILES)


def read_program(out: Path) -> dict[str, str]:
    """The program's files (name -> text) from an output directory of ``subc compile --target ebpf``.

    Raises SubcError naming a missing file (an output of an older subc, or a partial copy)."""
    files = {}
    for name in PROGRAM_FILES:
        path = Path(out) / name
        if not path.is_file():
            raise SubcError(f"{path}: missing: recompile with this subc (subc compile --target ebpf)")
        files[name] = path.read_text()
    return files


def program_source(files: Mapping[str, str], main: str = MAIN_FILE) -> str:
    """One translation unit: ``main`` with each quoted ``#include "name"`` replaced by the text
    of ``files[name]`` (recursively, each file once, as its include guard would); system includes
    (``<...>``) are kept.  Raises SubcError for an included file not in ``files``."""
    done: set[str] = set()

    def expand(name: str, chain: tuple[str, ...]) -> str:
        if name not in files:
            raise SubcError(f"{chain[-1] if chain else main}: includes {name!r}, which is not part of the program")
        done.add(name)

        def include(m: re.Match) -> str:
            inc = m.group(1)
            return "" if inc in done else expand(inc, chain + (name,))

        return _INCLUDE.sub(include, files[name])

    return expand(main, ())


_BCC_REWRITES = (
    # bpf_map_lookup_elem(&map, key) -> map.lookup(key)
    (re.compile(r"\bbpf_map_lookup_elem\(&(\w+),\s*"), r"\1.lookup("),
    # bpf_map_update_elem(&map, key, value, BPF_ANY) -> map.update(key, value)
    (re.compile(r"\bbpf_map_update_elem\(&(\w+),\s*([^,()]+),\s*([^,()]+),\s*BPF_ANY\)"), r"\1.update(\2, \3)"),
    # bpf_tail_call(ctx, &prog_array, index) -> prog_array.call(ctx, index)
    (re.compile(r"\bbpf_tail_call\((\w+),\s*&(\w+),\s*"), r"\2.call(\1, "),
    # bpf_ringbuf_reserve(&ring, size, 0) -> ring.ringbuf_reserve(size)
    (re.compile(r"\bbpf_ringbuf_reserve\(&(\w+),\s*([^,()]+(?:\([^()]*\))?),\s*0\)"), r"\1.ringbuf_reserve(\2)"),
    # bpf_ringbuf_output(&ring, data, size, flags) -> ring.ringbuf_output(data, size, flags)
    (re.compile(r"\bbpf_ringbuf_output\(&(\w+),\s*"), r"\1.ringbuf_output("),
)
_MAP_CALL = re.compile(r"\b(bpf_map_\w+_elem|bpf_tail_call|bpf_ringbuf_reserve|bpf_ringbuf_output)\(\s*(\w+,\s*)?&")


def bcc_dialect(src: str) -> str:
    """``src`` with the helper calls on a map written in bcc's method syntax (bcc 0.26 resolves a
    map only there, and not inside a macro): ``bpf_map_lookup_elem(&m, k)`` -> ``m.lookup(k)``,
    ``bpf_map_update_elem(&m, k, v, BPF_ANY)`` -> ``m.update(k, v)``, ``bpf_tail_call(ctx, &m, i)``
    -> ``m.call(ctx, i)``.  Raises SubcError for another helper call on a map (one this rewrite
    does not know would reach bcc as a null map)."""
    for pattern, repl in _BCC_REWRITES:
        src = pattern.sub(repl, src)
    left = _MAP_CALL.search(src)
    if left:
        line = src.count("\n", 0, left.start()) + 1
        raise SubcError(f"line {line}: {left.group(1)} on a map in a form bcc_dialect does not rewrite")
    return src


def clang_command(directory: Path, output: Path, defines: Sequence[str] = ()) -> list[str]:
    """The command that builds the program in ``directory`` (its :data:`PROGRAM_FILES`) into the BPF
    object ``output`` with clang and libbpf's headers (Debian: clang, libbpf-dev), as CI does;
    ``defines``: extra ``-D`` flags (``SUBC_PARSE_ONLY``, capacities)."""
    multiarch = [f"-I{p}" for p in sorted(Path("/usr/include").glob("*-linux-gnu")) if (p / "asm").is_dir()]
    return [
        "clang",
        "-target",
        "bpf",
        "-O2",
        "-g",
        "-Wall",
        "-Werror",
        "-DSUBC_LIBBPF",
        *multiarch,
        *[f"-D{d}" for d in defines],
        "-c",
        str(Path(directory) / MAIN_FILE),
        "-o",
        str(output),
    ]
