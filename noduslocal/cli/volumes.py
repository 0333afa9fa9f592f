"""`noduslocal volume create|ls|files|download|rm`: named directories, owned by their
creator, that jobs mount (`job run --volume NAME[:MOUNT]`) and that outlive them."""

from __future__ import annotations

from pathlib import Path

import click

from noduslocal.cli import output
from noduslocal.cli.job import json_option
from noduslocal.domain import errors
from noduslocal.sdk.api_client import ApiClient


@click.group()
def volume() -> None:
    """Named volumes that jobs mount and that outlive them."""


@volume.command("create")
@click.argument("name")
@click.option("--exist-ok", is_flag=True, help="A volume NAME of yours already there is fine.")
def create(name: str, exist_ok: bool) -> None:
    """Create volume NAME, owned by you."""
    client = ApiClient()
    try:
        client.create_volume(name)
    except errors.AlreadyExists:
        mine = [v for v in client.list_volumes()
                if v["name"] == name and v["owner"] == client.info()["caller"]["name"]]
        if not (exist_ok and mine):
            raise
    click.echo(name)


@volume.command("ls")
@json_option
def ls(as_json: bool) -> None:
    """List volumes (everyone's, with their owners)."""
    rows = ApiClient().list_volumes()
    if as_json:
        output.print_json(rows)
        return
    output.print_table(("NAME", "OWNER", "CREATED"),
                       [(r["name"], r["owner"], r["created_at"]) for r in rows])


@volume.command("files")
@click.argument("name")
@click.argument("path", default="")
@json_option
def files(name: str, path: str, as_json: bool) -> None:
    """List PATH (default: the top) of volume NAME."""
    entries = ApiClient().volume_files(name, path)
    if as_json:
        output.print_json(entries)
        return
    output.print_entries(entries)


@volume.command("download")
@click.argument("name")
@click.argument("path")
@click.argument("dest", type=click.Path(path_type=Path))
def download(name: str, path: str, dest: Path) -> None:
    """Save file PATH of volume NAME at DEST, verified by its sha256."""
    click.echo(str(ApiClient().download_volume_file(name, path, dest)))


@volume.command("rm")
@click.argument("name")
def rm(name: str) -> None:
    """Remove volume NAME and its files (refused while an unfinished job uses it)."""
    ApiClient().delete_volume(name)
    click.echo(f"{name}: removed")
