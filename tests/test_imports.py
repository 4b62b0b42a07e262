"""The package's import graph: no cycle, function-level imports included; no private name imported
across modules.

Every ``import`` and ``from ... import`` statement of every module of ``subc`` is read from its
source (``ast``: those inside functions count as much as those at the top), resolved to the
module it names (a name imported from a package resolves to its submodule when there is one, and
importing ``a.b.c`` also runs the ``__init__`` of ``a`` and ``a.b``), and the graph's strongly
connected components are found (Tarjan).  A cycle is a design fault even where Python resolves it
at run time by importing late: one of the two modules is in the wrong layer.
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "subc"


def modules() -> dict[str, Path]:
    """Dotted module name -> source file, for every module of the package (packages by their
    ``__init__``)."""
    out = {}
    for p in sorted(PKG.rglob("*.py")):
        parts = p.relative_to(PKG.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def imports_of(name: str, path: Path, mods: dict[str, Path]) -> list[tuple[str, str, int]]:
    """(module imported, name imported or '', line) for every import statement of ``name``."""
    out = []
    is_pkg = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(a.name, "", node.lineno) for a in node.names if a.name.split(".")[0] == "subc"]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = name.split(".") if is_pkg else name.split(".")[:-1]
                pkg = pkg[: len(pkg) - (node.level - 1)]
                base = ".".join(pkg + ([base] if base else []))
            if base.split(".")[0] != "subc":
                continue
            for a in node.names:
                sub = f"{base}.{a.name}"
                out.append((sub, "", node.lineno) if sub in mods else (base, a.name, node.lineno))
    return out


def graph() -> dict[str, set[str]]:
    mods = modules()
    g: dict[str, set[str]] = {m: set() for m in mods}
    for m, path in mods.items():
        for target, _, _ in imports_of(m, path, mods):
            parts = target.split(".")
            for k in range(1, len(parts) + 1):  # the packages on the way run their __init__
                t = ".".join(parts[:k])
                if t in mods and t != m and not m.startswith(t + "."):
                    g[m].add(t)
    return g


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out = []
    for root in sorted(g):
        if root in index:
            continue
        work = [(root, iter(sorted(g[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(g[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_the_cycle_finder_finds_cycles():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle():
    g = graph()
    assert len(g) > 100 and g["subc.compiler.driver"], "the walk found the package's modules and imports"
    found = cycles(g)
    assert not found, "import cycles (each a set of modules importing each other):\n" + "\n".join(
        " <-> ".join(c) for c in found)


def test_no_private_name_is_imported_across_modules():
    mods = modules()
    bad = [f"{path.relative_to(PKG.parent)}:{line}: {name} from {target}"
           for m, path in mods.items() for target, name, line in imports_of(m, path, mods)
           if name.startswith("_") and not name.startswith("__")]
    assert not bad, "private names imported from another module:\n" + "\n".join(bad)
