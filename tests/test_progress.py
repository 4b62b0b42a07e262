"""Progress bars: on a terminal, a compile that runs past a second shows its phases; into a pipe,
nothing extra is printed."""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios

from conftest import EXAMPLE


def _camus(tmp_path, n):
    from subc.workloads.itch_rules import itch_rules

    p = tmp_path / "camus.sub"
    p.write_text(itch_rules(n, symbols=100, ports=200, seed=3, form="camus"))
    return p


def _run_on_a_terminal(argv: list[str]) -> tuple[int, str]:
    pid, fd = pty.fork()
    if pid == 0:  # the child: a 100-column terminal on stdout and stderr (fd 2)
        try:
            fcntl.ioctl(2, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
            os.execvp(argv[0], argv)
        finally:
            os._exit(127)
    out = b""
    while True:
        try:
            data = os.read(fd, 4096)
        except OSError:
            break
        if not data:
            break
        out += data
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), out.decode(errors="replace")


def test_a_long_compile_shows_its_phases_on_a_terminal(tmp_path):
    rules = _camus(tmp_path, 60_000)
    code, out = _run_on_a_terminal([sys.executable, "-m", "subc.cli", "compile", str(rules), "--spec",
                                    str(EXAMPLE / "spec.p4"), "-o", str(tmp_path / "out")])
    assert code == 0, out
    assert "phases [00:0" in out
    assert any(p in out for p in ("parsing", "compiling", "generating"))
    assert "compiled 60000 rules" in out


def test_no_progress_output_into_a_pipe(tmp_path):
    rules = _camus(tmp_path, 60_000)
    r = subprocess.run([sys.executable, "-m", "subc.cli", "compile", str(rules), "--spec", str(EXAMPLE / "spec.p4"),
                        "-o", str(tmp_path / "out")], capture_output=True, text=True, check=False)
    assert r.returncode == 0
    assert r.stderr == ""
    assert r.stdout.startswith("compiled 60000 rules")


def test_a_short_compile_shows_nothing_on_a_terminal(tmp_path):
    code, out = _run_on_a_terminal([sys.executable, "-m", "subc.cli", "compile", str(EXAMPLE / "rules.sub"), "--spec",
                                    str(EXAMPLE / "spec.p4"), "-o", str(tmp_path / "out")])
    assert code == 0 and "phases" not in out
