"""`noduslocal queue`: pending jobs in the order they will start, with why each waits."""

from __future__ import annotations

import click

from noduslocal.cli import output
from noduslocal.cli.job import json_option
from noduslocal.sdk.api_client import ApiClient


@click.command("queue")
@json_option
def queue(as_json: bool) -> None:
    """Pending jobs in the order the scheduler takes them (priority, fair share,
    submission), with why each waits and when the first is expected to start."""
    doc = ApiClient().queue()
    if as_json:
        output.print_json(doc)
        return
    if not doc["pending"]:
        click.echo("nothing pending")
        return
    # A job bound for a cluster region has no place in this box's order: its region instead.
    output.print_table(
        ("#", "NAME", "PROJECT", "OWNER", "GPUS", "PRIO", "WHY", "ETA"),
        [(e["place"] + 1 if e["place"] is not None else e.get("region") or "-", e["name"],
          e["project"], e["owner"],
          (f"{e['gpu']['count']} x {e['gpu']['type'] or 'GPU'}" if e["gpu"] else ""),
          e["priority"] or "", e["hold"] or "", e["eta"] or "") for e in doc["pending"]])
    if (more := doc.get("total", 0) - len(doc["pending"])) > 0:
        click.echo(f"... and {more} more pending (the first {len(doc['pending'])} shown)")
