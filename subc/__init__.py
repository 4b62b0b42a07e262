"""subc: a packet-subscription compiler (rules -> BDD -> match-action tables -> P4 / eBPF).

The public API (:mod:`subc.api`, README "Python API")::

    import subc
    spec = subc.load_spec("examples/itch/spec.p4")
    c = subc.compile(subc.parse_rules('add_order.stock == "GOOGL" : fwd(1);', spec), spec, target="ebpf")
    c.write("out/")

Its names are loaded on first use, so that ``import subc.errors`` (and every command) does not
pay for the whole compiler.
"""

__version__ = "0.1.0"

#: The public names, all from :mod:`subc.api`.
API = (
    "Compilation",
    "Rule",
    "Spec",
    "SubcError",
    "check",
    "compile",
    "load_rules",
    "load_spec",
    "parse_rules",
    "parse_spec",
    "simulate",
)
__all__ = [*API, "__version__"]


def __getattr__(name: str):
    """PEP 562: the names of :data:`API`, imported from :mod:`subc.api` on first use."""
    if name in API:
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module 'subc' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *API])
