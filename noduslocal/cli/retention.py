"""`noduslocal du` (each user's disk use against their quota and keep time) and
`noduslocal gc` (an admin's retention pass now, or what it would remove)."""

from __future__ import annotations

import click

from noduslocal.cli import output
from noduslocal.cli.job import json_option
from noduslocal.domain.units import fmt_bytes, fmt_duration
from noduslocal.sdk.api_client import ApiClient

GC_TIMEOUT = 3600.0  # a pass over a large data dir walks every directory it removes


@click.command("du")
@click.option("--user", "user", help="Only this user's line.")
@click.option("--cached", is_flag=True,
              help="The last periodic measurement (du_every) instead of measuring now.")
@json_option
def du(user: str | None, cached: bool, as_json: bool) -> None:
    """Each user's use of the data dir: job directories (workspaces, logs), volumes and
    blobs (outputs, uploads), against their quota, and how long their ended jobs keep
    their files."""
    doc = ApiClient().transport.request("GET", "/v1/du",
                                     query={"refresh": "false" if cached else "true"})
    rows = [u for u in doc["users"] if user is None or u["user"] == user]
    if as_json:
        output.print_json({"measured_at": doc["measured_at"], "users": rows})
        return
    if not rows:
        click.echo(f"{user} holds nothing here" if user else "nobody holds anything here yet")
        return
    output.print_table(
        ("USER", "JOBS", "JOB DIRS", "VOLUMES", "BLOBS", "TOTAL", "QUOTA", "KEEP ENDED"),
        [(u["user"], u["jobs"], fmt_bytes(u["workspaces"]), fmt_bytes(u["volumes"]),
          fmt_bytes(u["blobs"]), fmt_bytes(u["total"]),
          "-" if u["quota"] is None else
          f"{fmt_bytes(u['quota'])}{' (over)' if u['total'] >= u['quota'] else ''}",
          fmt_duration(u["keep_ended_s"])) for u in rows])


@click.command("gc")
@click.option("--dry-run", is_flag=True, help="Say what would be removed; remove nothing.")
@json_option
def gc(dry_run: bool, as_json: bool) -> None:
    """Admins: run the retention pass now. Ended jobs past keep_ended lose their
    workspace, logs and outputs (their history stays); blobs and uploads nothing names
    any more are deleted. Running and pending jobs' files are never touched."""
    doc = ApiClient().transport.request("POST", "/v1/admin/gc",
                                     query={"dry_run": "true" if dry_run else "false"},
                                     timeout=GC_TIMEOUT)
    if as_json:
        output.print_json(doc)
        return
    verb = "would remove" if dry_run else "removed"
    for job in doc["jobs"]:
        click.echo(f"{verb} {job['project']}/{job['name']} of {job['owner']} "
                   f"({fmt_bytes(job['bytes'])})")
    click.echo(f"{'dry run: ' if dry_run else ''}{verb} the files of {len(doc['jobs'])} "
               f"ended jobs ({fmt_bytes(doc['job_bytes'])}), {doc['blobs']} blobs "
               f"({fmt_bytes(doc['blob_bytes'])}) and {doc['sources']} uploads nothing "
               "names any more")
