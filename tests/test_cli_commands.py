"""The command line's table of commands (subc.cli.COMMANDS, each command's module imported when it
runs): every command is defined by the module the table names and every command is in the table;
``subc update`` imports neither the other commands' modules nor, for its help, the data plane; a
compile ends its process at once, its output and status intact."""

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


def test_compile_ends_the_process_at_once_with_its_output_and_status(tmp_path):
    """``python -m subc.cli compile`` (through ``subc.cli.run``) skips the interpreter's teardown
    after a compile: its summary still reaches a pipe, its outputs are complete and its status is
    0; an error exits as before (status 2, the diagnostic on stderr, no output directory)."""
    example = ROOT / "examples" / "itch"
    out = tmp_path / "o"
    args = [sys.executable, "-m", "subc.cli", "compile", "--spec", str(example / "spec.p4"), "-o", str(out)]
    r = subprocess.run([*args, str(example / "rules.sub")], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("compiled 5 rules for bmv2") and r.stdout.endswith(f"-> {out}/\n"), r.stdout
    assert sorted(p.name for p in out.iterdir()) == [
        "commands.txt", "entries.json", "p4info.txtpb", "report.json", "states.jsonl", "subc.p4"]
    r = subprocess.run([*args[:-1], str(tmp_path / "bad"), str(tmp_path / "missing.sub")], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 2 and "cannot read rules" in r.stderr and not (tmp_path / "bad").exists(), r.stderr
