"""The ``subc`` command line: the group (:mod:`.app`) and one module per group of commands, each
imported when one of its commands runs (:class:`.app.LazyGroup`; :data:`COMMANDS`).

Exit status: 0 on success, 1 when a simulation finds disagreements, 2 on bad input (with a
``file:line:col: error:`` diagnostic on stderr).
"""

from functools import partial

from .app import main, run

#: command -> the module of this package that defines it
COMMANDS = {
    "analyze": "analysis_cmds",
    "validate": "analysis_cmds",
    "cluster": "cluster_cmds",
    "compile": "compile_cmds",
    "check": "compile_cmds",
    "simulate": "compile_cmds",
    "load": "dataplane_cmds",
    "unload": "dataplane_cmds",
    "update": "dataplane_cmds",
    "fanout": "dataplane_cmds",
    "verify": "dataplane_cmds",
    "stats": "dataplane_cmds",
    "gen": "gen_cmds",
    "journal": "journal_cmds",
    "serve-program": "serve_cmds",
    "serve": "serve_cmds",
    "publish": "client_cmds",
    "subscribe": "client_cmds",
    "replay": "traffic_cmds",
    "listen": "traffic_cmds",
}
# (__import__ rather than importlib.import_module: python -X importtime reports it)
main.lazy.update({name: partial(__import__, f"{__name__}.{module}") for name, module in COMMANDS.items()})

__all__ = ["COMMANDS", "main", "run"]
