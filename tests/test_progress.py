"""Progress bars: on a terminal, a compile that runs past the bar's delay shows its phases; one that
ends before it, nothing; into a pipe, nothing extra is printed.  The delay is set through
``SUBC_PROGRESS_DELAY`` (0: at once; an hour: never in a test), so no verdict depends on how fast
the machine compiles."""

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


def _run_on_a_terminal(argv: list[str], delay: str) -> tuple[int, str]:
    pid, fd = pty.fork()
    if pid == 0:  # the child: a 100-column terminal on stdout and stderr (fd 2)
        try:
            fcntl.ioctl(2, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
            os.execvpe(argv[0], argv, {**os.environ, "SUBC_PROGRESS_DELAY": delay})
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


def test_a_compile_past_the_delay_shows_its_phases_on_a_terminal(tmp_path):
    code, out = _run_on_a_terminal([sys.executable, "-m", "subc.cli", "compile", str(EXAMPLE / "rules.sub"), "--spec",
                                    str(EXAMPLE / "spec.p4"), "-o", str(tmp_path / "out")], delay="0")
    assert code == 0, out
    assert "phases [00:0" in out
    assert "parsing" in out  # shown from the start: the first phase's name
    assert "compiled " in out


def test_no_progress_output_into_a_pipe(tmp_path):
    rules = _camus(tmp_path, 60_000)
    r = subprocess.run([sys.executable, "-m", "subc.cli", "compile", str(rules), "--spec", str(EXAMPLE / "spec.p4"),
                        "-o", str(tmp_path / "out")], capture_output=True, text=True, check=False)
    assert r.returncode == 0
    assert r.stderr == ""
    assert r.stdout.startswith("compiled 60000 rules")


def test_a_short_compile_shows_nothing_on_a_terminal(tmp_path):
    code, out = _run_on_a_terminal([sys.executable, "-m", "subc.cli", "compile", str(EXAMPLE / "rules.sub"), "--spec",
                                    str(EXAMPLE / "spec.p4"), "-o", str(tmp_path / "out")], delay="3600")
    assert code == 0 and "phases" not in out
