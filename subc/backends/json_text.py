"""The JSON text of the output documents (``entries.json``, ``report.json``, ``maps.json``):
indented (one space per level) down to :data:`PRETTY_DEPTH`, then one compact line per value,
lists of scalars on one line, as subc has always written them."""

from __future__ import annotations

import json
from collections.abc import Callable

from .output import TextStream

#: Nesting depth printed one item per line; deeper values (an entry, a match) go on one line each.
PRETTY_DEPTH = 4


def _one_line_encoder() -> Callable[[object], str]:
    """``json.dumps`` with its defaults, through one C encoder made once (``json.dumps`` makes
    one a call: a third of the time of an entry's line); ``json.dumps`` itself when this Python's
    encoder is not that one (its text on a sample differs, or it cannot be made)."""
    import json.encoder

    make = getattr(json.encoder, "c_make_encoder", None)  # (None without the C accelerator)
    if make is None:
        return json.dumps
    try:
        encode = make(
            {}, json.JSONEncoder().default, json.encoder.encode_basestring_ascii, None, ": ", ", ", False, False, True
        )
    except TypeError:  # another signature than this Python's json.dumps uses
        return json.dumps

    def dumps(v: object) -> str:
        return "".join(encode(v, 0))

    sample = {"a": [1, -2, 2**70, {"b": None, "c": True}], "d": 'x\u00e9"', "e": 1.5, "f": []}
    return dumps if dumps(sample) == json.dumps(sample) else json.dumps


#: ``json.dumps(v)`` (same text), faster on many small values (see :func:`_one_line_encoder`).
one_line = _one_line_encoder()


def dumps(doc: dict) -> str:
    """JSON text of ``doc``: indented (one space per level) down to :data:`PRETTY_DEPTH`, then one
    compact line per value, lists of scalars on one line (the C encoder: 100K-rule entries in 0.2 s
    instead of 3 s)."""
    out: list[str] = []
    _pretty(doc, 0, out.append, {})
    out.append("\n")
    return "".join(out)


def dumps_stream(make_doc: Callable[[], dict]) -> TextStream:
    """:func:`dumps` of the document ``make_doc()`` as a :class:`~..output.TextStream`: the
    document is built when the text is written, and its text goes out in pieces."""

    def write(emit: Callable[[str], object]) -> None:
        _pretty(make_doc(), 0, emit, {})
        emit("\n")

    return TextStream(write)


def _pretty(v, depth: int, emit: Callable[[str], object], memo: dict) -> None:
    if (
        depth >= PRETTY_DEPTH
        or not isinstance(v, (dict, list))
        or not v
        or (isinstance(v, list) and not isinstance(v[0], (dict, list)))
    ):
        emit(one_line(v))  # a scalar, or a list of scalars (ports, field names), on one line
        return
    pad = "\n" + " " * (depth + 1)
    if isinstance(v, dict):
        emit("{")
        for i, (k, x) in enumerate(v.items()):
            emit(("," if i else "") + pad + json.dumps(k) + ": ")
            _pretty(x, depth + 1, emit, memo)
        emit("\n" + " " * depth + "}")
    elif depth + 1 < PRETTY_DEPTH:  # a list of indented values (the tables): their text goes out as it comes
        emit("[")
        for i, x in enumerate(v):
            emit(("," if i else "") + pad)
            _pretty(x, depth + 1, emit, memo)
        emit("\n" + " " * depth + "]")
    else:
        # a list of one-line values met again at the same depth (the entries the message slots
        # share) is the same text
        hit = memo.get((id(v), depth))
        if hit is None:  # each value on its own line, as _pretty at depth + 1 writes it
            hit = memo[(id(v), depth)] = "[" + pad + ("," + pad).join(map(one_line, v)) + "\n" + " " * depth + "]"
        emit(hit)
