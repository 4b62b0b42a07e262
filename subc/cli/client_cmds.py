"""The topic clients of ``subc serve``: ``subc publish`` and ``subc subscribe`` (docs/serve.md,
"Topics")."""

from __future__ import annotations

import sys

import click

from ..errors import SubcError
from .app import fail, ip_port, main, open_spec, spec_options


def field_values(spec, items: tuple[str, ...]) -> dict[str, int]:
    """``FIELD=VALUE`` options (an integer, raw) as query field values."""
    out = {}
    for item in items:
        name, sep, text = item.partition("=")
        q = spec.resolve_field(name.strip())
        try:
            v = int(text.strip(), 0)
        except ValueError:
            v = -1
        if not sep or q is None or not 0 <= v <= q.max_value:
            raise click.BadParameter(
                f"'{item}' is not FIELD=VALUE with a query field of the spec and an integer that fits it"
            )
        out[q.name] = v
    return out


@main.command("publish")
@spec_options
@click.argument("topic")
@click.argument("payload", required=False)
@click.option(
    "--spec",
    "spec_path",
    required=True,
    type=click.Path(dir_okay=False, exists=True),
    help="the broker's spec (with @pragma query_topic)",
)
@click.option("--broker", required=True, help="IP:PORT of subc serve's requests")
@click.option("--feed", help="IP:PORT the messages go to (default: the broker's address, the spec's feed port)")
@click.option("--set", "sets", multiple=True, help="FIELD=VALUE of another header field (repeat)")
@click.option("--count", type=click.IntRange(1), default=1, show_default=True, help="send the payload this many times")
@click.option("--keep", is_flag=True, help="stay registered after sending (else UNREGISTER at the end)")
def publish_cmd(
    topic: str,
    payload: str | None,
    spec_path: str,
    broker: str,
    feed: str | None,
    sets: tuple[str, ...],
    count: int,
    keep: bool,
) -> None:
    """REGISTER TOPIC with the broker and send PAYLOAD (else each line of standard input) as
    messages of TOPIC: the spec's topic header with the level labels, then the topic name and the
    payload (docs/serve.md, "Live subscriptions"); then UNREGISTER unless --keep."""
    from ..spec.parse_graph import ParseGraph, spec_start
    from ..traffic.topic_client import Publisher

    try:
        spec = open_spec(spec_path)
        b = ip_port(broker)
        if feed:
            dest = ip_port(feed)
        else:
            spec_feed = ParseGraph(spec).feed()
            if spec_feed is None:  # (as the publisher's MessageDecoder says)
                raise SubcError(
                    "the spec's parser reaches no UDP destination port select after Ethernet and IPv4, "
                    "so it describes no message feed",
                    spec_start(spec),
                )
            dest = (b[0], spec_feed.ports[0][0])
        pub = Publisher(spec, b, dest)
        values = field_values(spec, sets)
        labels = pub.register(topic)
        items = (
            [(topic, payload.encode())] * count
            if payload is not None
            else [(topic, line.rstrip("\n").encode()) for line in sys.stdin]
        )
        n = pub.publish(items, values)
        if not keep:
            pub.unregister(topic)
    except SubcError as e:
        fail(e)
    click.echo(
        f"{topic} labels {' '.join(map(str, labels))}: {len(items)} messages in {n} datagrams to {dest[0]}:{dest[1]}",
        err=True,
    )


@main.command("subscribe")
@spec_options
@click.argument("topic_filter")
@click.option(
    "--spec",
    "spec_path",
    required=True,
    type=click.Path(dir_okay=False, exists=True),
    help="the broker's spec (with @pragma query_topic)",
)
@click.option("--broker", required=True, help="IP:PORT of subc serve's requests")
@click.option("--bind", default="0.0.0.0:0", show_default=True, help="IP:PORT of this subscriber's socket")
@click.option("--where", help="a condition the messages must also meet (rule language)")
@click.option("--count", type=click.IntRange(1), help="stop after this many messages")
@click.option("--timeout", type=float, help="stop after this many idle seconds")
def subscribe_cmd(
    topic_filter: str,
    spec_path: str,
    broker: str,
    bind: str,
    where: str | None,
    count: int | None,
    timeout: float | None,
) -> None:
    """SUB TOPIC_FILTER (MQTT wildcards + and #) and print each message received as
    'TOPIC<TAB>PAYLOAD' (the payload as UTF-8, undecodable bytes escaped); unsubscribes at the end."""
    from ..traffic.topic_client import Subscriber

    try:
        sub = Subscriber(
            open_spec(spec_path), ip_port(broker), ip_port(bind) if bind != "0.0.0.0:0" else ("0.0.0.0", 0)
        )
        sid = sub.sub(topic_filter, where)
    except SubcError as e:
        fail(e)
    click.echo(f"subscribed {sid} on {sub.sock.getsockname()[0]}:{sub.sock.getsockname()[1]}", err=True)
    n = 0
    try:
        while count is None or n < count:
            m = sub.recv(timeout)
            if m is None:
                break
            click.echo(f"{m.topic}\t{m.payload.decode('utf-8', 'backslashreplace')}")
            n += 1
    except KeyboardInterrupt:
        pass
    finally:
        try:
            sub.unsubscribe(sid)
        except SubcError:
            pass
        sub.close()
