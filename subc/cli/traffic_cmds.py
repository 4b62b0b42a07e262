"""Traffic tools: ``subc replay`` (a trace to a feed address) and ``subc listen`` (what arrives)."""

from __future__ import annotations

import json
import sys

import click

from ..errors import SubcError
from .app import fail, ip_port, main, open_spec, spec_options


@main.command("replay")
@spec_options
@click.argument("trace", type=click.Path(dir_okay=False, exists=True))
@click.option("--to", "dest", required=True, help="IP:PORT to send to")
@click.option(
    "--speed",
    type=click.FloatRange(min=0),
    help="pace: the trace's timestamp gaps divided by this (2: twice as fast; 0: as fast as possible); "
    "default: 1 for a capture, as fast as possible for a BinaryFILE",
)
@click.option("--max", "max_speed", is_flag=True, help="as fast as possible (--speed 0)")
@click.option("--rate", type=click.FloatRange(min=0, min_open=True), help="messages per second (instead of --speed)")
@click.option("--pps", type=click.FloatRange(min=0, min_open=True), help="datagrams per second (instead of --speed)")
@click.option(
    "--count", type=click.IntRange(1), help="stop after this many datagrams (capture) or messages (BinaryFILE)"
)
@click.option(
    "--udp-port",
    "udp_ports",
    multiple=True,
    type=click.IntRange(0, 65535),
    help="capture: the feed port (repeatable; default: the most common destination port of its MoldUDP64 datagrams)",
)
@click.option(
    "--strict",
    is_flag=True,
    help="capture: any frame that is not a MoldUDP64 datagram to the feed port is an error (exit 2)",
)
@click.option(
    "--batch", type=click.IntRange(1, 65534), help="BinaryFILE: N messages per datagram instead of the packer"
)
@click.option(
    "--window", "window_ns", type=click.IntRange(0), help="BinaryFILE: packing window in ns [default: 100000]"
)
@click.option(
    "--max-payload", type=click.IntRange(22, 65507), help="BinaryFILE: largest UDP payload in bytes [default: 1400]"
)
@click.option("--session", help="BinaryFILE: MoldUDP64 session [default: SUBC000001]")
@click.option(
    "--spec",
    "spec_path",
    type=click.Path(dir_okay=False),
    help="check every message sent against this spec (not_decoded); a BinaryFILE's zero length prefixes "
    "take its lengths [default: ITCH 5.0's]",
)
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
def replay_cmd(
    trace: str,
    dest: str,
    speed: float | None,
    max_speed: bool,
    rate: float | None,
    pps: float | None,
    count: int | None,
    udp_ports: tuple[int, ...],
    strict: bool,
    batch: int | None,
    window_ns: int | None,
    max_payload: int | None,
    session: str | None,
    spec_path: str | None,
    as_json: bool,
) -> None:
    """Send TRACE to IP:PORT: a pcap/pcapng capture datagram by datagram as captured (payloads
    unchanged), a BinaryFILE packed into MoldUDP64 datagrams as a live feed does.  Exit 1 when
    nothing was sent, 2 on bad input (and with --strict on a foreign frame)."""
    from ..traffic.replay import is_capture, replay

    try:
        if rate is not None and pps is not None:
            raise SubcError("--rate and --pps exclude each other")
        if max_speed:
            speed = 0.0
        elif speed is None and is_capture(trace):
            speed = 1.0
        decoder = None
        if spec_path:
            from ..wire.decoder import MessageDecoder

            decoder = MessageDecoder(open_spec(spec_path))
        st = replay(
            trace,
            ip_port(dest),
            rate=rate,
            batch=batch,
            session=session,
            count=count,
            speed=speed,
            pps=pps,
            window_ns=window_ns,
            max_payload=max_payload,
            ports=list(udp_ports) or None,
            strict=strict,
            log=lambda m: click.echo(m, err=True),
            decoder=decoder,
        )
    except SubcError as e:
        fail(e)
    doc = st.as_json()
    if as_json:
        click.echo(json.dumps(doc))
    else:
        click.echo(
            f"sent {doc['messages']} messages in {doc['datagrams']} datagrams ({st.messages_per_datagram:.2f} "
            f"messages per datagram, max {st.max_messages}; {doc['bytes']} bytes) in {doc['seconds']:.3f} s "
            f"to {dest} ({doc['pacing']})"
        )
        if st.capture is not None:
            click.echo(f"capture: {st.capture.summary()}")
        if st.not_decoded:
            click.echo(
                "not decodable by the spec: "
                + ", ".join(f"{n} {k.replace('_', ' ')}" for k, n in sorted(st.not_decoded.items()))
            )
    if st.nothing_sent:
        click.echo(f"error: {st.nothing_sent}", err=True)
        sys.exit(1)


@main.command("listen")
@spec_options
@click.argument("bind")
@click.option("--count", type=click.IntRange(1), help="stop after this many datagrams")
@click.option("--timeout", type=float, help="stop after this many idle seconds")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object at the end")
@click.option("--save", type=click.Path(dir_okay=False), help="write the messages received as a BinaryFILE")
@click.option(
    "--save-pcap",
    type=click.Path(dir_okay=False),
    help="write every datagram received, payload unchanged, as a pcap (UDP over Ethernet/IP)",
)
@click.option(
    "--spec",
    "spec_path",
    type=click.Path(dir_okay=False),
    help="label messages by the spec's types and count those it cannot decode",
)
@click.option(
    "--recover",
    metavar="IP:PORT[,IP:PORT...]",
    help="re-request lost messages from this MoldUDP64 request server (several, comma-separated: "
    "a cluster's brokers, tried in turn); deliver each once, in order",
)
def listen_cmd(
    bind: str,
    count: int | None,
    timeout: float | None,
    as_json: bool,
    save: str | None,
    save_pcap: str | None,
    spec_path: str | None,
    recover: str | None,
) -> None:
    """Receive MoldUDP64 on BIND (IP:PORT): count messages by type and sequence gaps.  Says
    "listening on IP:PORT" on stderr once the socket is bound.  With --recover, gaps are
    re-requested and the counts are of the messages delivered; the lost ones are listed."""
    from ..traffic.listen import listen

    endpoint = ip_port(bind)
    try:
        decoder = None
        if spec_path:
            from ..wire.decoder import MessageDecoder

            decoder = MessageDecoder(open_spec(spec_path))
        st = listen(
            endpoint,
            count=count,
            timeout=timeout,
            save=save,
            save_pcap=save_pcap,
            decoder=decoder,
            on_ready=lambda: click.echo(f"listening on {endpoint[0]}:{endpoint[1]}", err=True),
            recover=[ip_port(a) for a in recover.split(",")] if recover else None,
        )
    except SubcError as e:
        fail(e)
    doc = st.as_json()
    if as_json:
        click.echo(json.dumps(doc))
    else:
        for k in (
            "received",
            "messages",
            "by_type",
            "not_decoded",
            "gaps",
            "missing_messages",
            "duplicates",
            "malformed",
            "sha256",
            *(("recovered", "lost", "requests") if recover else ()),
        ):
            click.echo(f"{k:<17} {doc[k]}")
