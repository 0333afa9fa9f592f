"""`noduslocal job kill (or cancel)|suspend|resume|exec`: what an owner (or admin) does to a
job that exists, as opposed to submitting one or reading about it."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import click

from noduslocal.cli import output
from noduslocal.cli.job import job, json_option, project_option
from noduslocal.domain import errors
from noduslocal.domain.states import TERMINAL, Phase
from noduslocal.domain.units import parse_duration
from noduslocal.sdk.api_client import ApiClient


def _act(doc: dict[str, Any], as_json: bool, said: Callable[[dict[str, Any]], str]) -> None:
    if as_json:
        output.print_json(doc)
    else:
        click.echo(said(doc))


@job.command("kill")
@click.argument("name")
@project_option
@json_option
def kill(name: str, project: str | None, as_json: bool) -> None:
    """Cancel a job: SIGTERM to its process group, SIGKILL after the grace period."""
    _act(ApiClient().cancel_job(name, project), as_json, lambda doc: (
        output.summary(doc) if doc["phase"] in TERMINAL
        else f"{doc['name']}: stopping (SIGTERM sent; SIGKILL after the grace period)"))


# The reference's verb is `kill`; the API's word is `cancel`: a user may type either.
job.add_command(click.Command(
    "cancel", callback=kill.callback, params=kill.params,
    help="The same as `job kill` (cancel is the API's word): SIGTERM to the job's process "
         "group, SIGKILL after the grace period.",
    short_help="The same as `job kill`."))


@job.command("suspend")
@click.argument("name")
@project_option
@json_option
def suspend(name: str, project: str | None, as_json: bool) -> None:
    """Stop a job and keep it aside (workspace and checkpoint kept) until `job resume`."""
    _act(ApiClient().suspend_job(name, project), as_json, lambda doc: f"{doc['name']}: " + (
        "suspended" if doc["phase"] == Phase.SUSPENDED
        else "suspending (SIGTERM sent; SIGKILL after the grace)"))


@job.command("resume")
@click.argument("name")
@project_option
@json_option
def resume(name: str, project: str | None, as_json: bool) -> None:
    """Queue a suspended job again, at its old place."""
    _act(ApiClient().resume_job(name, project), as_json,
         lambda doc: f"{doc['name']}: queued again ({doc.get('hold') or doc['phase']})")


@job.command("exec")
@click.argument("name")
@project_option
@click.option("--timeout", default="5m", show_default=True, help="Kill it after this long.")
@click.option("--rank", type=click.IntRange(0), help="Beside this rank of a gang (default 0).")
@click.option("--index", type=click.IntRange(0), help="Beside this index of an indexed job.")
@click.argument("command", nargs=-1, required=True)
def exec_(name: str, project: str | None, timeout: str, rank: int | None,
          index: int | None, command: tuple[str, ...]) -> None:
    """Run COMMAND beside the running job NAME, as its owner, in its workdir:
    noduslocal job exec NAME [--project P] -- CMD ARGS..."""
    try:
        seconds = parse_duration(timeout, "timeout")
    except errors.InvalidArgument as exc:
        raise click.BadParameter(exc.message, param_hint="--timeout") from None
    argv = list(command[1:] if command[0] == "--" else command)
    if not argv:
        raise click.UsageError("give the command to run after NAME")
    result = ApiClient().exec_job(name, project, argv, seconds, rank=rank, index=index)
    sys.stdout.write(result["stdout"])
    sys.stderr.write(result["stderr"])
    if result["truncated"]:
        click.echo("noduslocal: output truncated at 16 MiB", err=True)
    sys.exit(result["returncode"] if 0 <= result["returncode"] < 256 else 1)


@job.command("rm")
@click.argument("names", nargs=-1, required=True)
@project_option
def rm(names: tuple[str, ...], project: str | None) -> None:
    """Remove ended jobs: out of listings, their workspace and logs gone, their names free
    again (their cost stays in fair share)."""
    client = ApiClient()
    for name in names:
        client.remove_job(name, project)
        click.echo(f"{name}: removed")
