"""The command line's table of commands (subc.cli.COMMANDS, each command's module imported when it
runs): every command is defined by the module the table names and every command is in the table;
``subc update`` imports neither the other commands' modules nor, for its help, the data plane."""

from __future__ import annotations

import importlib
import subprocess
import sys

from conftest import ROOT


def test_the_table_names_the_module_of_every_command():
    from subc.cli import COMMANDS, main

    for module in sorted(set(COMMANDS.values())):
        importlib.import_module(f"subc.cli.{module}")
    assert set(main.commands) == set(COMMANDS)
    for name, cmd in main.commands.items():
        assert cmd.callback is not None and cmd.callback.__module__ == f"subc.cli.{COMMANDS[name]}", name


def test_a_command_imports_its_module_alone():
    code = (
        "import sys\n"
        "from subc.cli import main\n"
        "try:\n"
        "    main(['update', '--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(' '.join(sorted(m for m in sys.modules if m.startswith('subc.'))))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    loaded = set(r.stdout.split("\n")[-2].split())
    assert "subc.cli.dataplane_cmds" in loaded
    assert not loaded & {"subc.cli.serve_cmds", "subc.cli.compile_cmds", "subc.dataplane.p4rt.control"}, loaded
