"""`noduslocal admin ...`: what the daemon's admins (root and the noduslocal-admin group)
do: see every user's use against the limits, hold and release a user's queue, change a
job's priority, drain GPUs, and take a backup of the database while it runs."""

from __future__ import annotations

from pathlib import Path

import click

from noduslocal.cli import output
from noduslocal.cli.gpus import drain, undrain
from noduslocal.cli.job import json_option, project_option
from noduslocal.sdk.api_client import ApiClient
from noduslocal.sdk.wire import quote


@click.group("admin")
def admin() -> None:
    """Admins only: users' limits and use, queue holds, priorities, drains, backups."""


admin.add_command(drain)
admin.add_command(undrain)


@admin.command("users")
@json_option
def users(as_json: bool) -> None:
    """Every user with work here: running jobs, GPUs held, pending jobs, fair-share
    GPU-hours, the limits that apply, and whether their queue is held."""
    rows = ApiClient().transport.request("GET", "/v1/admin/users")["users"]
    if as_json:
        output.print_json(rows)
        return

    def limit(value: int | None) -> str:
        return "-" if value is None else str(value)

    output.print_table(
        ("USER", "UID", "RUNNING", "GPUS", "PENDING", "GPU-HOURS", "MAX JOBS", "MAX GPUS",
         "QUEUE"),
        [(u["name"], u["uid"], u["running_jobs"], u["gpus_held"], u["pending_jobs"],
          f"{u['gpu_hours']:.2f}", limit(u["limits"]["max_jobs"]),
          limit(u["limits"]["max_gpus"]),
          "open" if u["held"] is None else f"held by {u['held']['by']}"
          + (f": {u['held']['reason']}" if u["held"]["reason"] else ""))
         for u in rows])


@admin.command("hold")
@click.argument("user")
@click.option("--reason", help="Said to the user in their jobs' hold.")
def hold(user: str, reason: str | None) -> None:
    """Hold USER's queue: their pending jobs start no more (what runs goes on)."""
    ApiClient().transport.request("POST", f"/v1/admin/users/{quote(user)}/hold",
                               body={"reason": reason} if reason else {})
    click.echo(f"{user}'s queue is held; `noduslocal admin release {user}` opens it")


@admin.command("release")
@click.argument("user")
def release(user: str) -> None:
    """Open USER's held queue again: their jobs start in their old places."""
    ApiClient().transport.request("POST", f"/v1/admin/users/{quote(user)}/release")
    click.echo(f"{user}'s queue is open")


@admin.command("priority")
@click.argument("name")
@click.argument("priority", type=click.IntRange(-1000, 1000))
@project_option
def priority(name: str, priority: int, project: str | None) -> None:
    """Give job NAME another PRIORITY (higher goes first), past the users' maximum."""
    doc = ApiClient().transport.request("POST", f"/v1/admin/jobs/{quote(name)}/priority",
                                     query={"project": project}, body={"priority": priority})
    click.echo(f"{doc['name']}: priority {doc['spec']['priority']}")


@admin.command("backup")
@click.argument("dest", type=click.Path(dir_okay=False, path_type=Path))
def backup(dest: Path) -> None:
    """Copy the daemon's database to DEST (0600), consistent, while it runs.

    To restore: stop the daemon, move noduslocal.db (and its -wal and -shm files) out of the
    data dir, copy DEST to noduslocal.db there, start the daemon."""
    if dest.exists():
        raise click.UsageError(f"{dest} exists; name a new file")
    ApiClient().transport.download("/v1/admin/backup", dest)
    click.echo(f"{dest}: {dest.stat().st_size} bytes, checked by sha256")
