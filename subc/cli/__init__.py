"""The ``subc`` command line: the group (:mod:`.app`) and one module per group of commands.

Exit status: 0 on success, 1 when a simulation finds disagreements, 2 on bad input (with a
``file:line:col: error:`` diagnostic on stderr).
"""

from . import (  # noqa: F401 (register)
    analysis_cmds,
    cluster_cmds,
    compile_cmds,
    dataplane_cmds,
    gen_cmds,
    journal_cmds,
    serve_cmds,
    traffic_cmds,
)
from .app import main

__all__ = ["main"]
