"""The C preprocessor a spec goes through before the front end reads it, as p4c runs ``cpp``.

A spec is a P4 program written for the C preprocessor (ISO C99 section 6.10): ``#include
"file"`` and ``#include <file>``, object-like and function-like macros, ``#if``/``#ifdef``/
``#ifndef``/``#elif``/``#else``/``#endif``, ``#undef``, ``#line``, ``#error`` (``#warning`` and
``#pragma`` are dropped).  subc runs pcpp (a C99 preprocessor in pure Python, on PyPI) with:

* **includes**: ``"file"`` is searched in the including file's folder, then in the ``-I``
  folders in order, then in the spec's folder; ``<file>`` in the ``-I`` folders, then in the
  spec's folder.  ``<core.p4>``, ``<v1model.p4>``, ``<tna.p4>`` and ``<t2na.p4>`` are built in
  (:data:`BUILTIN_HEADERS`: their include guards and version macros; the front end knows the
  names they declare), so a spec that includes them needs no P4 compiler on the machine.  A file
  outside the spec's folder and the ``-I`` folders (an absolute path, ``..`` out of them, a
  symbolic link out of them) is refused before it is opened, as is anything but a regular file;
* **limits**: includes nested :data:`MAX_INCLUDE_DEPTH` deep (so recursive includes end),
  files of :data:`MAX_FILE_BYTES`, :data:`MAX_EXPANSION_TOKENS` tokens of macro expansion and
  :data:`MAX_OUTPUT_CHARS` characters of output; each a located SubcError;
* **comments** become blanks of their own length (newlines kept), so text that no directive or
  macro touched keeps its columns, and declarations copied into generated programs keep their
  layout;
* ``-D NAME`` defines ``NAME`` as ``1``, ``-D NAME=VALUE`` as ``VALUE`` (as ``cpp -D``);
* ``__DATE__`` and ``__TIME__`` are the time ``SOURCE_DATE_EPOCH`` gives (UTC; 0, 1 January 1970,
  when unset), as reproducible builds define them, so outputs never depend on when they were made.

The result is a :class:`~.source_map.SpecSource`: the text and, for every token, where it came
from (file, line, column, include chain, macro), which locates every error of the front end.
"""

from __future__ import annotations

import os
import re
import stat
import time
from collections.abc import Iterator, Sequence

from pcpp import Preprocessor
from pcpp.parser import trigraph

from ..errors import Location, SubcError
from .source_map import Origin, SourceFile, SpecSource

#: Includes nested deeper than this are an error (a file that includes itself ends here).
MAX_INCLUDE_DEPTH = 32
#: Largest file an ``#include`` (or the spec) may be.
MAX_FILE_BYTES = 16 << 20
#: Tokens that macro expansion may produce in all (counted at every level of nesting), against
#: macros that expand exponentially (the limit is reached in about a second).
MAX_EXPANSION_TOKENS = 250_000
#: Largest preprocessed text.
MAX_OUTPUT_CHARS = 32 << 20

#: What subc needs of the architecture files p4c ships (P4_16 v1.2.4 appendix "core.p4";
#: v1model.p4; Intel's tna.p4/t2na.p4): nothing but their include guards and version macros,
#: since the front end knows ``packet_in``, ``standard_metadata_t`` and skips externs, controls
#: and packages.
BUILTIN_HEADERS = {
    "core.p4": "#ifndef _CORE_P4_\n#define _CORE_P4_\n#endif\n",
    "v1model.p4": (
        "#ifndef _V1_MODEL_P4_\n#define _V1_MODEL_P4_\n#include <core.p4>\n"
        "#ifndef V1MODEL_VERSION\n#define V1MODEL_VERSION 20200408\n#endif\n#endif\n"
    ),
    "tna.p4": "#ifndef _TOFINO_NATIVE_ARCHITECTURE_P4_\n#define _TOFINO_NATIVE_ARCHITECTURE_P4_\n"
    "#include <core.p4>\n#endif\n",
    "t2na.p4": "#ifndef _TOFINO2_NATIVE_ARCHITECTURE_P4_\n#define _TOFINO2_NATIVE_ARCHITECTURE_P4_\n"
    "#include <core.p4>\n#endif\n",
}

_DEFINE_RE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*(?:\([A-Za-z0-9_,\s.]*\))?)(?:=(.*))?\Z", re.S)


class _Stamp(int):
    """A token's line number that also carries where the token stands (``at``: file key,
    offset).  pcpp gives every token of a macro's expansion the line number of the macro's name,
    so this is how the invocation's column reaches the expansion."""

    at: tuple[str, int]


#: Characters Python's ``str.splitlines`` (and so pcpp) takes for line ends but P4 (and subc's
#: locations) do not: they go through pcpp as private-use characters and come back after.
_BREAKS = "\v\f\x1c\x1d\x1e\x85\u2028\u2029"
_HIDE = str.maketrans({c: chr(0xF0000 + ord(c)) for c in _BREAKS + "\r"})
_SHOW = str.maketrans({chr(0xF0000 + ord(c)): c for c in _BREAKS + "\r"})
_LONE_CR = re.compile(r"\r(?!\n)")


def _hidden(text: str) -> str:
    """``text`` with the line ends of :data:`_BREAKS` and lone carriage returns hidden from pcpp
    (one character each, so offsets are kept)."""
    return _LONE_CR.sub(chr(0xF000D), text).translate(_HIDE) if _BREAKS_RE.search(text) else text


_BREAKS_RE = re.compile(f"[{_BREAKS}]|\r(?!\n)")


def _lexed(text: str) -> str:
    """``text`` (hidden, see :func:`_hidden`) as pcpp lexes it, shown again: trigraphs replaced,
    trailing blanks of each line removed."""
    return "\n".join(x.rstrip() for x in trigraph(text).splitlines()).translate(_SHOW)


def _blank(text: str) -> str:
    return "".join(c if c == "\n" else " " for c in text)


class _SpecPreprocessor(Preprocessor):
    """pcpp with subc's include search, refusals, limits and origin tracking."""

    def __init__(self, main_key: str, spec_dir: str, spec_dir_shown: str, include_dirs: Sequence[str]):
        super().__init__()
        # __DATE__ and __TIME__ from SOURCE_DATE_EPOCH (0 when unset), as reproducible builds do:
        # the same spec and rules give the same outputs on every run
        tm = time.gmtime(int(os.environ.get("SOURCE_DATE_EPOCH", "0") or 0))
        self.define(f'__DATE__ "{time.strftime("%b", tm)} {tm.tm_mday:2d} {tm.tm_year}"')
        self.define(f'__TIME__ "{time.strftime("%H:%M:%S", tm)}"')
        self.line_directive = None
        self.rewrite_paths: list[tuple[str, str]] = []  # token sources stay file keys
        self.files: dict[str, SourceFile] = {}
        self.main_key = main_key
        self.search = [(d, os.path.abspath(d)) for d in include_dirs]
        self.spec_dir = (spec_dir_shown, spec_dir)
        roots = [spec_dir] + [fs for _, fs in self.search]
        self.roots = sorted({os.path.normpath(r) for r in roots} | {os.path.realpath(r) for r in roots})
        self.stack: list[tuple[str, int]] = []  # #include directives, outermost first
        self.chain: tuple[tuple[str, int], ...] = ()
        self.expanding = 0
        self.work = 0

    # -- locations ------------------------------------------------------------------------
    def location(self, key: str, pos: int) -> Location:
        """The location of offset ``pos`` of file ``key`` (with the current include chain)."""
        src = SpecSource(self.main_key, "", "", self.files, [], [])
        return src.location_of(Origin(key, pos, self.chain))

    def fail(self, msg: str, tok) -> SubcError:
        """A SubcError ``msg`` at pcpp token ``tok`` (a directive's token)."""
        key = tok.source if tok.source in self.files else self.main_key
        at = getattr(tok, "own", None)
        pos = at.at[1] if at is not None else tok.lexpos
        return SubcError(msg, self.location(key, pos))

    def on_error(self, file, line, msg):
        """pcpp's errors (unterminated conditionals, bad macro calls, ...): a located SubcError."""
        key = file if file in self.files else self.main_key
        f = self.files[key]
        text = f.line_text(line)
        pos = f.line_starts[line - 1] + len(text) - len(text.lstrip()) if 0 < line <= len(f.line_starts) else 0
        raise SubcError(msg[0].lower() + msg[1:] if msg else "preprocessor error", self.location(key, pos))

    # -- directives -----------------------------------------------------------------------
    def on_comment(self, tok):
        """Comments pass as blanks of their own length (columns and layout are kept)."""
        tok.value, tok.type = _blank(tok.value), "CPP_WS"
        return True

    def on_directive_unknown(self, directive, toks, ifpassthru, precedingtoks):
        """``#error`` (an error), ``#line`` and linemarkers (recorded), ``#warning`` and
        ``#pragma`` (dropped); any other directive is an error, as in cpp."""
        name = directive.value
        if name == "error":
            raise self.fail("#error " + "".join(str(t.value) for t in toks).strip(), directive)
        if name in ("warning", "pragma"):
            return True
        if name == "line" or directive.type == self.t_INTEGER:
            self.line_directive_at(directive, toks if name == "line" else [directive, *toks])
            return True
        raise self.fail(f"invalid preprocessing directive #{name}", directive)

    def line_directive_at(self, directive, toks) -> None:
        """Record ``#line N ["file"]`` (its arguments macro-expanded, as C99 6.10.4 says)."""
        args = [t for t in self.expand_macros(list(toks)) if t.type not in self.t_WS]
        n = str(args[0].value) if args else ""
        if not n.isdigit() or len(args) > 2 or (len(args) == 2 and args[1].type != self.t_STRING):
            raise self.fail('#line takes a line number and an optional "file name"', directive)
        f = self.files[directive.source]
        line, _ = f.line_col(directive.lexpos)
        rec = (line, int(n), str(args[1].value)[1:-1] if len(args) == 2 else None)
        if rec not in f.line_directives:
            f.line_directives.append(rec)

    def include(self, tokens, original_line):
        """``#include``: resolve, check the limits and refusals, then preprocess the file."""
        hash_tok = next(t for t in original_line if t.type not in self.t_WS)
        if tokens and tokens[0].value != "<" and tokens[0].type != self.t_STRING:
            tokens = self.tokenstrip(self.expand_macros(tokens))
        if tokens and tokens[0].value == "<" and any(t.value == ">" for t in tokens[1:]):
            end = next(i for i, t in enumerate(tokens) if i and t.value == ">")
            name, system = "".join(str(t.value) for t in tokens[1:end]), True
        elif tokens and tokens[0].type == self.t_STRING:
            name, system = str(tokens[0].value)[1:-1], False
        else:
            raise self.fail('#include expects "FILENAME" or <FILENAME>', hash_tok)
        if len(self.stack) >= MAX_INCLUDE_DEPTH:
            raise self.fail(f"#include nested more than {MAX_INCLUDE_DEPTH} deep (a recursive include?)", hash_tok)
        key, shown, text = self.resolve(name, system, hash_tok)
        if key in self.include_once:
            return
        including = self.files[hash_tok.source]
        self.stack.append(including.presumed(including.line_col(hash_tok.lexpos)[0]))
        self.chain = tuple(reversed(self.stack))
        text = _hidden(text)
        if key not in self.files:
            self.files[key] = SourceFile(shown, _lexed(text))
        try:
            yield from self.parsegen(text, name, key)
        finally:
            self.stack.pop()
            self.chain = tuple(reversed(self.stack))

    def resolve(self, name: str, system: bool, hash_tok) -> tuple[str, str, str]:
        """(file key, path as shown, text) of the file ``#include`` names (see the module
        docstring for the search order); SubcError when it is refused or not found."""
        if system and name in BUILTIN_HEADERS:
            return f"<{name}>", f"<{name}>", BUILTIN_HEADERS[name]
        if os.path.isabs(name):
            candidates = [(name, name)]
        else:
            dirs = []
            including = self.files[hash_tok.source]
            if not system and not hash_tok.source.startswith("<"):
                dirs.append((os.path.dirname(including.display), os.path.dirname(hash_tok.source)))
            dirs += self.search + [self.spec_dir]
            candidates = [(os.path.join(shown, name), os.path.join(fs, name)) for shown, fs in dirs]
        for shown, fs in candidates:
            path = os.path.normpath(os.path.abspath(fs))
            if not self.allowed(path):
                raise self.fail(
                    f"#include '{name}' refused: {path} is outside the spec's folder and the -I folders",
                    hash_tok,
                )
            if not os.path.lexists(path):
                continue
            real = os.path.realpath(path)
            if not self.allowed(real):
                raise self.fail(f"#include '{name}' refused: {path} leads outside the allowed folders", hash_tok)
            return real, os.path.normpath(shown), self.read(real, name, hash_tok)
        if name in BUILTIN_HEADERS:
            return f"<{name}>", f"<{name}>", BUILTIN_HEADERS[name]
        raise self.fail(f"cannot find include file '{name}'", hash_tok)

    def allowed(self, path: str) -> bool:
        return any(path == r or path.startswith(r.rstrip(os.sep) + os.sep) for r in self.roots)

    def read(self, path: str, name: str, hash_tok) -> str:
        """The UTF-8 text of the regular file ``path`` (at most :data:`MAX_FILE_BYTES`)."""
        try:
            st = os.stat(path)
            if not stat.S_ISREG(st.st_mode):
                raise self.fail(f"#include '{name}': {path} is not a regular file", hash_tok)
            if st.st_size > MAX_FILE_BYTES:
                raise self.fail(f"#include '{name}': {path} is larger than {MAX_FILE_BYTES} bytes", hash_tok)
            with open(path, "rb") as fh:
                data = fh.read(MAX_FILE_BYTES + 1)
        except OSError as e:
            raise self.fail(f"#include '{name}': cannot read {path}: {e.strerror}", hash_tok) from None
        try:
            return data.decode("utf-8").removeprefix("\ufeff")
        except UnicodeDecodeError as e:
            raise self.fail(f"#include '{name}': {path} is not UTF-8 text (byte offset {e.start})", hash_tok) from None

    # -- macro expansion ------------------------------------------------------------------
    def expand_macros(self, tokens, expanding_from=None):
        """pcpp's expansion, with each token's own place stamped first (see :class:`_Stamp`) and
        the expansion work counted against :data:`MAX_EXPANSION_TOKENS`."""
        if self.expanding == 0:
            for t in tokens:
                if not hasattr(t, "own"):
                    s = _Stamp(t.lineno)
                    s.at = (t.source, t.lexpos)
                    t.lineno = t.own = s
        self.expanding += 1
        try:
            out = super().expand_macros(tokens, expanding_from or [])
        finally:
            self.expanding -= 1
        if self.expanding:  # a macro's expansion (not the text it stands in)
            self.work += len(out)
        if self.work > MAX_EXPANSION_TOKENS:
            at = getattr(self.linemacro, "at", None)  # the outermost invocation (a _Stamp)
            raise SubcError(
                f"macro expansion exceeds the limit of {MAX_EXPANSION_TOKENS} tokens",
                self.location(*at) if at is not None and at[0] in self.files else None,
            )
        return out

    def origin(self, tok) -> Origin:
        """Where the emitted token ``tok`` comes from (see :mod:`.source_map`)."""
        macro = tok.expanded_from[-1] if getattr(tok, "expanded_from", None) else None
        own = getattr(tok, "own", None)
        if own is not None:
            return Origin(own.at[0], own.at[1], self.chain, macro, True)
        if isinstance(tok.lineno, _Stamp):
            return Origin(tok.lineno.at[0], tok.lineno.at[1], self.chain, macro, False)
        return Origin(tok.source if tok.source in self.files else self.main_key, tok.lexpos, self.chain, macro, False)

    def run(self, text: str, shown: str) -> Iterator[tuple[str, Origin]]:
        """Preprocess the main file ``text`` (shown as ``shown``): (token text, origin) pairs."""
        text = _hidden(text)
        self.files[self.main_key] = SourceFile(shown, _lexed(text))
        for tok in self.parsegen(text, shown, self.main_key):
            yield str(tok.value).translate(_SHOW), self.origin(tok)


def parse_define(text: str) -> tuple[str, str]:
    """A ``-D`` option's ``NAME[=VALUE]`` (``NAME(args)=VALUE`` too) as (name, value); a bare
    name is ``1``, as ``cpp -D``.  Raises SubcError for anything else."""
    m = _DEFINE_RE.match(text.strip())
    if m is None:
        raise SubcError(f"-D '{text}': expected NAME or NAME=VALUE")
    return m.group(1), "1" if m.group(2) is None else m.group(2)


def preprocess(
    path: str,
    text: str,
    include_dirs: Sequence[str] = (),
    defines: Sequence[str] = (),
) -> SpecSource:
    """Run the C preprocessor over the spec ``text`` read from ``path`` (its folder is where its
    includes are looked for and allowed; ``<spec>`` or another non-file name: the working
    folder), with the folders ``include_dirs`` (``-I``) and the macros ``defines`` (``-D``
    ``NAME[=VALUE]``).  Returns the :class:`SpecSource`.  Raises SubcError, located in the file
    where the problem is with the include chain above it: ``#error``, an include not found,
    refused, too deep or unreadable, a malformed directive, an unterminated conditional, a limit
    exceeded."""
    main_key = os.path.abspath(path) if os.path.exists(path) else path
    spec_dir = os.path.dirname(os.path.abspath(path)) if os.path.exists(path) else os.getcwd()
    pp = _SpecPreprocessor(main_key, spec_dir, os.path.dirname(path), include_dirs)
    for d in defines:
        name, value = parse_define(d)
        pp.define(f"{name} {value}")
    out: list[str] = []
    starts: list[int] = []
    origins: list[Origin] = []
    n = 0
    try:
        for value, origin in pp.run(text, path):
            if not value:
                continue
            if origins and origins[-1] == origin and not origin.exact:
                out.append(value)  # the rest of one macro's expansion: one entry
            else:
                starts.append(n)
                origins.append(origin)
                out.append(value)
            n += len(value)
            if n > MAX_OUTPUT_CHARS:
                raise SubcError(
                    f"the preprocessed spec exceeds the limit of {MAX_OUTPUT_CHARS} characters",
                    SpecSource(path, "", text, pp.files, [], []).location_of(origin),
                )
    except RecursionError:
        raise SubcError("macros or conditionals nested too deeply for the preprocessor") from None
    macros = {
        name: "".join(str(t.value) for t in m.value)
        for name, m in pp.macros.items()
        if m.arglist is None and m.source in pp.files and not m.source.startswith("<")
    }
    return SpecSource(path, "".join(out), text, pp.files, starts, origins, macros)
