"""`noduslocal admin ...`: what the daemon's admins (root and the noduslocal-admin group)
do: take a backup of its database while it runs."""

from __future__ import annotations

from pathlib import Path

import click

from noduslocal.client.api import Client


@click.group("admin")
def admin() -> None:
    """Admins only: backups of the daemon's database."""


@admin.command("backup")
@click.argument("dest", type=click.Path(dir_okay=False, path_type=Path))
def backup(dest: Path) -> None:
    """Copy the daemon's database to DEST (0600), consistent, while it runs.

    To restore: stop the daemon, move noduslocal.db (and its -wal and -shm files) out of the
    data dir, copy DEST to noduslocal.db there, start the daemon."""
    if dest.exists():
        raise click.UsageError(f"{dest} exists; name a new file")
    Client().transport.download("/v1/admin/backup", dest)
    click.echo(f"{dest}: {dest.stat().st_size} bytes, checked by sha256")
