"""``subc cluster``: a cluster of brokers sharing their state on etcd (README, "Brokers on several hosts")."""

from __future__ import annotations

import json

import click

from ..errors import SubcError
from .app import fail, main


@main.group("cluster")
def cluster_group() -> None:
    """Brokers of subc serve --cluster: their state in etcd."""


@cluster_group.command("status")
@click.option(
    "--cluster", "endpoints", required=True, metavar="ENDPOINTS", help="etcd client endpoints, comma-separated"
)
@click.option("--cluster-prefix", "prefix", default="/subc/", show_default=True, help="the cluster's etcd key prefix")
@click.option("--json", "as_json", is_flag=True, help="the report as JSON")
def status_cmd(endpoints: str, prefix: str, as_json: bool) -> None:
    """Members, owners, revisions and lag of the cluster, read from etcd at one revision."""
    from ..cluster.etcd import Etcd
    from ..cluster.records import check_prefix
    from ..cluster.status import cluster_status, format_status

    try:
        etcd = Etcd([e.strip() for e in endpoints.split(",") if e.strip()])
        try:
            doc = cluster_status(etcd, check_prefix(prefix))
        finally:
            etcd.close()
    except SubcError as e:
        fail(e)
    click.echo(json.dumps(doc, indent=2) if as_json else format_status(doc))
