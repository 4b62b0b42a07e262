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


#: Egress queue depth (packets) of the switch in :func:`run_on_pcaps`: more than any test sends.
QUEUE_DEPTH = 100_000


def read_pcap(path: Path) -> list[bytes] | None:
    """The frames of a pcap file the switch writes ([] when it has none yet; None when a record is
    being written: read again later)."""
    from scapy.utils import rdpcap

    if not path.exists() or path.stat().st_size <= 24:
        return []
    try:
        return [bytes(p) for p in rdpcap(str(path))]
    except Exception:  # noqa: BLE001 - a record being written
        return None


def run_on_pcaps(out: Path, work: Path, frames: list[bytes], ports, done, after=None, separate_device: bool = False):
    """Run ``out/subc.json`` with ``out/commands.txt`` in simple_switch over pcap files in
    ``work``: ``frames`` in on port 0, the other ``ports`` with no input.  Returns (port -> frames
    out, ``after(thrift port)`` or None) once ``done(outputs)`` holds (the caller's last frames are
    sentinels that every port it waits on gets last).  The switch reads its input ``wait`` s after
    it starts; when loading the entries took longer, the run is repeated with a longer wait (a
    slow machine makes the test longer, never red).  ``separate_device``: a device id and
    notification socket of the run's own."""
    from scapy.layers.l2 import Ether
    from scapy.utils import wrpcap

    wrpcap(str(work / "p0_in.pcap"), [Ether(f) for f in frames])
    for p in ports:
        if p:
            wrpcap(str(work / f"p{p}_in.pcap"), [])
    for wait in (6, 20, 60, 180):
        for f in work.glob("p*_out.pcap"):
            f.unlink()
        started = time.time()
        extra: tuple[str, ...] = ()
        if separate_device:
            dev = free_port()
            extra = ("--device-id", str(dev), "--notifications-addr", f"ipc:///tmp/subc-bmv2-{dev}.ipc")
        sw, thrift = start_switch(out / "subc.json", work, wait, ports, extra)
        try:
            # simple_switch drops a copy that finds its egress queue (64 packets) full, and the pcap
            # reader sends as fast as it can: deep queues, so that no copy depends on speed
            cli(thrift, f"set_queue_depth {QUEUE_DEPTH}\n" + (out / "commands.txt").read_text())
            if time.time() - started >= wait - 1:
                continue  # packets may have gone through before the entries were in: again, longer
            deadline = time.time() + 600
            while True:
                outs = {p: read_pcap(work / f"p{p}_out.pcap") for p in ports}
                if all(v is not None for v in outs.values()) and done(outs):
                    return outs, (after(thrift) if after else None)
                assert time.time() < deadline, "the sentinels did not arrive within 600 s"
                time.sleep(0.5)
        finally:
            stop_switch(sw)
    raise AssertionError("the entries could not be loaded within 180 s")
