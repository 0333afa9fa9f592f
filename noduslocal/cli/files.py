"""`noduslocal ls` and `noduslocal download`: a job's kept workspace, as `super ls` and
`super download` show a session's."""

from __future__ import annotations

from pathlib import Path

import click

from noduslocal.cli import output
from noduslocal.cli.job import json_option, project_option
from noduslocal.sdk.api_client import ApiClient


@click.command("ls")
@click.argument("job")
@click.argument("path", default="")
@project_option
@json_option
def ls(job: str, path: str, project: str | None, as_json: bool) -> None:
    """List PATH (default: the top) of JOB's workspace."""
    entries = ApiClient().list_files(job, project, path)
    if as_json:
        output.print_json(entries)
        return
    output.print_entries(entries)


@click.command("download")
@click.argument("job")
@click.argument("path")
@click.argument("dest", type=click.Path(path_type=Path))
@project_option
def download(job: str, path: str, dest: Path, project: str | None) -> None:
    """Save the file PATH of JOB's workspace at DEST, verified by its sha256."""
    saved = ApiClient().download_file(job, project, path, dest)
    click.echo(str(saved))
