"""Writing an output directory atomically.

All files are written into a fresh temporary directory beside the destination, which then
replaces the destination with ``rename``: on any error the destination is left as it was, and
readers never see a half-written directory.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from ...errors import SubcError


def write_directory(dest: str | Path, files: dict[str, str]) -> Path:
    """Replace directory ``dest`` by one holding ``files`` (name -> text).

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
            (tmp / name).write_text(text)
        os.chmod(tmp, 0o755)
        if dest.exists():
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
