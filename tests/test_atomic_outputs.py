"""Outputs are written atomically: a failed or interrupted compile never leaves a partial directory."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from subc.backends import output
from subc.backends.output import write_directory
from subc.errors import SubcError

ROOT = Path(__file__).resolve().parent.parent


def test_failure_while_writing_leaves_the_old_directory(tmp_path, monkeypatch):
    dest = tmp_path / "out"
    write_directory(dest, {"a.txt": "old a", "b.txt": "old b"})
    calls = []
    real = Path.write_text

    def failing(self, text, *a, **k):
        calls.append(self.name)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real(self, text, *a, **k)

    monkeypatch.setattr(Path, "write_text", failing)
    with pytest.raises(SubcError, match="No space left"):
        write_directory(dest, {"a.txt": "new a", "b.txt": "new b", "c.txt": "new c"})
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no temporary directory left
    assert {p.name: p.read_text() for p in dest.iterdir()} == {"a.txt": "old a", "b.txt": "old b"}


@pytest.mark.parametrize("exchange", [True, False])
def test_replace_swaps_whole_directories(tmp_path, monkeypatch, exchange):
    if not exchange:
        monkeypatch.setattr(output, "_exchange", lambda a, b: False)
    dest = tmp_path / "out"
    write_directory(dest, {"a.txt": "1", "stale.txt": "x"})
    write_directory(dest, {"a.txt": "2"})
    assert {p.name: p.read_text() for p in dest.iterdir()} == {"a.txt": "2"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_interrupted_compiles_leave_old_or_new_outputs(tmp_path):
    """SIGTERM and SIGINT at many points of a compile: the output directory is always complete,
    either the previous compile's or the new one's, and no temporary directory is left."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    spec = ROOT / "examples" / "itch" / "spec.p4"
    rules = tmp_path / "r.sub"
    subprocess.run([sys.executable, "-m", "subc.cli", "gen", "itch", "--form", "camus", "--rules", "20000",
                    "--symbols", "100", "--ports", "200", "-o", str(rules)], check=True, env=env)
    small = tmp_path / "small.sub"
    small.write_text('add_order.price > 1 : fwd(1);\n')
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "subc.cli", "compile", "--spec", str(spec), "-o", str(out)]
    subprocess.run(cmd + [str(small)], check=True, env=env, capture_output=True)
    t0 = time.perf_counter()
    subprocess.run(cmd + [str(rules)], check=True, env=env, capture_output=True)
    full = time.perf_counter() - t0
    new_entries = json.loads((out / "report.json").read_text())["total_entries"]
    subprocess.run(cmd + [str(small)], check=True, env=env, capture_output=True)
    outcomes = set()
    # Twelve points spread over the measured compile time, then, until one compile was interrupted
    # (a loaded machine may finish them all), ever earlier signals: no verdict depends on speed.
    delays = [full * (0.3 + 0.7 * k / 11) for k in range(12)]
    k = 0
    while k < len(delays) or (False, 2) not in outcomes:
        delay = delays[k] if k < len(delays) else delays[0] / 2 ** (k - len(delays) + 1)
        sig = (signal.SIGTERM, signal.SIGINT)[k % 2]
        k += 1
        p = subprocess.Popen(cmd + [str(rules)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(delay)
        p.send_signal(sig)
        rc = p.wait()
        files = sorted(x.name for x in out.iterdir())
        assert files == ["commands.txt", "entries.json", "p4info.txtpb", "report.json", "states.jsonl", "subc.p4"], files
        total = json.loads((out / "report.json").read_text())["total_entries"]
        json.loads((out / "entries.json").read_text())
        assert total in (2, new_entries)
        outcomes.add((rc == 0, total))
        assert sorted(x.name for x in tmp_path.iterdir()) == ["out", "r.sub", "small.sub"]
        if total != 2:  # completed: put the old outputs back
            subprocess.run(cmd + [str(small)], check=True, env=env, capture_output=True)
    assert (False, 2) in outcomes  # some compiles were interrupted
