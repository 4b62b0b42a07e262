"""BinaryFILE framing (Nasdaq's downloadable files): a 2-byte big-endian length before each message.

A zero length ends a session, except in files written by tools that write every length as zero (the
shared RITCH sample): when a zero length is followed by a message whose type gives its length, that
length is taken.  Which types have which lengths is the caller's: the spec's message types
(:meth:`subc.wire.decoder.TypeTable.length_of`) for subc's commands, or the ITCH 5.0 table of
:mod:`subc.workloads.itch_codec`.
"""

from __future__ import annotations

from typing import Callable, Iterator

from ..errors import SubcError

#: ``length_of(data, pos)``: the length in bytes of the message at byte ``pos`` of ``data`` by its
#: type, or None when its type gives none.
LengthOf = Callable[[bytes, int], "int | None"]


def iter_frames(
    data: bytes, path: str, length_of: LengthOf | None, on_fallback: Callable[[], object] | None = None
) -> Iterator[tuple[int, bytes]]:
    """Yield (byte offset of the length prefix, message bytes) for every message of ``data``.

    A zero length prefix at the end of ``data`` ends it; elsewhere the message's length is
    ``length_of(data, pos)`` (``on_fallback()`` is called for each).  Raises :class:`SubcError`
    naming ``path`` and the byte offset when a length prefix is cut, a message runs past the end of
    ``data``, or a zero length is followed by a message whose type gives no length (the file cannot
    be walked further)."""
    pos, n = 0, len(data)
    while pos < n:
        if pos + 2 > n:
            raise SubcError(f"{path}: truncated length prefix at byte offset {pos}")
        length = int.from_bytes(data[pos : pos + 2], "big")
        start = pos + 2
        if length == 0:
            if start >= n:
                return
            length = (length_of(data, start) or 0) if length_of is not None else 0
            if not length:
                raise SubcError(
                    f"{path}: zero length prefix followed by a message type whose length is not known "
                    f"({data[start : start + 1]!r}) at byte offset {pos}"
                )
            if on_fallback is not None:
                on_fallback()
        if start + length > n:
            raise SubcError(
                f"{path}: message of {length} bytes at byte offset {pos} runs past the end of the file ({n} bytes)"
            )
        yield pos, data[start : start + length]
        pos = start + length
