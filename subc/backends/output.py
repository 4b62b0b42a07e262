"""Writing an output directory atomically.

All files are written into a fresh temporary directory beside the destination, which then
replaces the destination: with ``renameat2(RENAME_EXCHANGE)`` (Linux 3.15+, one atomic step, so
the destination always exists, old or new), else with two renames.  On any error or interruption
(an exception, SIGINT, or SIGTERM, which the CLI turns into an exception) the destination is left
as it was and the temporary directory is removed: readers never see a half-written directory.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
import json
from collections.abc import Callable, Mapping
from typing import IO, Any, Iterator, TypeVar

from ..errors import SubcError

T = TypeVar("T")


def read_document(path: str | Path, parse: Callable[[Any], T]) -> T:
    """``parse`` of the JSON in file ``path`` (a document's ``from_json``); SubcError naming the
    file when it cannot be read, is no JSON or ``parse`` raises ValueError."""
    try:
        return parse(json.loads(Path(path).read_text()))
    except (OSError, ValueError) as e:
        raise SubcError(f"{path}: {e}") from None


_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap directories ``a`` and ``b`` (renameat2); False when not supported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (22, 38, 95):  # EINVAL, ENOSYS, EOPNOTSUPP: the file system cannot exchange
        return False
    raise OSError(err, os.strerror(err), str(b))


class TextStream:
    """A file's text written in pieces as it is produced, so that the whole text (tens of MB for
    a large rule set's entries) is never held in memory: ``writer(emit)`` calls ``emit(piece)``
    for each piece of text, in order.  ``str()`` joins the pieces (the text as a string); every
    use runs ``writer`` again, so it must not consume anything."""

    __slots__ = ("writer",)

    def __init__(self, writer: Callable[[Callable[[str], object]], object]):
        self.writer = writer

    def __str__(self) -> str:
        pieces: list[str] = []
        self.writer(pieces.append)
        return "".join(pieces)


def counted(stream: TextStream) -> tuple[TextStream, Callable[[], int]]:
    """``stream`` with the size in bytes (UTF-8) of its text counted as it is written, and a
    function that gives that size (of the last writing; before any, the text is produced once
    to count it)."""
    sizes: list[int] = []

    def write(emit: Callable[[str], object]) -> None:
        n = 0

        def out(piece: str) -> None:
            nonlocal n
            n += len(piece) if piece.isascii() else len(piece.encode())
            emit(piece)

        stream.writer(out)
        sizes.append(n)

    def size() -> int:
        if not sizes:
            sizes.append(len(str(stream).encode()))
        return sizes[-1]

    return TextStream(write), size


def write_directory(dest: str | Path, files: Mapping[str, str | bytes | TextStream]) -> Path:
    """Replace directory ``dest`` by one holding ``files`` (name -> text, bytes for a binary
    file, or a :class:`TextStream`, produced while it is written).

    Raises :class:`SubcError` if ``dest`` exists and is not a directory, or on an OS error
    (the destination is then unchanged).
    """
    dest = Path(dest)
    if dest.exists() and not dest.is_dir():
        raise SubcError(f"output {dest} exists and is not a directory")
    parent = dest.resolve().parent
    tmp = None
    try:
        parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=parent))
        for name, text in files.items():
            if isinstance(text, bytes):
                (tmp / name).write_bytes(text)
            elif isinstance(text, TextStream):
                with (tmp / name).open("w") as f:
                    text.writer(f.write)
            else:
                (tmp / name).write_text(text)
        os.chmod(tmp, 0o755)
        if dest.exists():
            if _exchange(tmp, dest):
                shutil.rmtree(tmp, ignore_errors=True)  # now the old directory
            else:
                old = Path(tempfile.mkdtemp(prefix=f".{dest.name}.old-", dir=parent))
                os.rename(dest, old / "d")
                os.rename(tmp, dest)
                shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, dest)
        tmp = None
    except OSError as e:
        raise SubcError(f"cannot write {dest}: {e}") from e
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return dest


@contextmanager
def atomic_file(path: str | Path, mode: str = "w") -> Iterator[IO]:
    """A file object for ``path`` (``mode`` 'w' or 'wb') whose contents replace ``path`` only when
    the block ends without an exception: written to a temporary file beside it, then renamed
    (mode 0644).  On any exception (SIGINT, SIGTERM through the CLI) the temporary file is removed."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=str(path.parent) or ".")
    try:
        with os.fdopen(fd, mode) as f:
            yield f
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
