"""`noduslocal job outputs` and `noduslocal job download-output`: a job's declared outputs,
collected after its latest attempt and downloaded verified by sha256."""

from __future__ import annotations

from pathlib import Path

import click

from noduslocal.cli import output
from noduslocal.cli.job import json_option, project_option
from noduslocal.sdk.api_client import ApiClient


@click.command("outputs")
@click.argument("job")
@project_option
@json_option
def outputs(job: str, project: str | None, as_json: bool) -> None:
    """List JOB's declared outputs and what was collected."""
    rows = ApiClient().list_outputs(job, project)
    if as_json:
        output.print_json(rows)
        return
    indexed = any("index" in o for o in rows)
    output.print_table(
        ("NAME", *(("INDEX",) if indexed else ()), "PATH", "KIND", "SIZE", "SHA256", "ATTEMPT"),
        [(o["name"], *((o["index"],) if indexed else ()), o["path"],
          o.get("kind") or (f"not collected: {o['skipped']}" if o.get("skipped")
                            else "not collected"), o.get("size"), (o.get("sha256") or "")[:16],
          o.get("attempt")) for o in rows])


@click.command("download-output")
@click.argument("job")
@click.argument("name")
@click.argument("dest", type=click.Path(path_type=Path))
@project_option
@click.option("--index", type=click.IntRange(0), help="An indexed job's: whose output.")
def download_output(job: str, name: str, dest: Path, project: str | None,
                    index: int | None) -> None:
    """Save JOB's output NAME at DEST (a directory output becomes a directory)."""
    click.echo(str(ApiClient().download_output(job, project, name, dest, index)))
