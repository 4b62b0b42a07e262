"""Running BMv2's ``simple_switch`` on pcap files for the tests: start it, wait until its Thrift
port accepts connections (``simple_switch_CLI`` needs it), and feed commands to the CLI."""
from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

SWITCH = shutil.which("simple_switch")
CLI = shutil.which("simple_switch_CLI")
if CLI is not None and subprocess.run([CLI, "--help"], capture_output=True, timeout=60).returncode:
    CLI = None  # installed without what it imports (the Python thrift package): the tests that need it skip


def free_port() -> int:
    """An unused TCP port on 127.0.0.1 (for the switch's Thrift server)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_switch(program: Path, work: Path, wait: int, ports, extra: tuple[str, ...] = ()) -> tuple[subprocess.Popen, int]:
    """Start ``simple_switch`` on ``program`` (its JSON) with ``--use-files wait``: port ``p`` reads
    ``work/p{p}_in.pcap`` and writes ``work/p{p}_out.pcap``, starting ``wait`` s after the switch
    starts.  Returns (the process, its Thrift port) once the port accepts connections.
    Raises AssertionError (with the switch's stderr) when the switch exits before that."""
    thrift = free_port()
    ifaces = [a for p in ports for a in ("-i", f"{p}@p{p}")]
    sw = subprocess.Popen([SWITCH, "--use-files", str(wait), "--thrift-port", str(thrift), *extra, *ifaces, str(program)],
                          cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", thrift)) == 0:
                    return sw, thrift
            if sw.poll() is not None:
                raise AssertionError(f"simple_switch exited before it opened its Thrift port: "
                                     f"{sw.stderr.read().decode()[-2000:]}")
            time.sleep(0.1)
    except BaseException:
        stop_switch(sw)
        raise


def stop_switch(sw: subprocess.Popen) -> None:
    """Terminate the switch and wait for it to exit."""
    sw.terminate()
    sw.wait(timeout=30)


def cli(thrift: int, commands: str) -> str:
    """Run ``simple_switch_CLI`` on the switch's Thrift port with ``commands``; its standard output.
    Raises AssertionError when it fails or reports an error."""
    p = subprocess.run([CLI, "--thrift-port", str(thrift)], input=commands, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0 and "Error" not in p.stdout, p.stdout[-3000:]
    return p.stdout
