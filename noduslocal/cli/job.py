"""`noduslocal job ...`: run, list, status, logs, wait, kill and attempts."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import click

from noduslocal.cli import job_actions, output
from noduslocal.cli.usage import as_click
from noduslocal.domain import errors
from noduslocal.domain.gang import LAUNCHERS, TRANSPORTS
from noduslocal.domain.states import TERMINAL, Phase
from noduslocal.domain.units import parse_duration
from noduslocal.sdk.api_client import ApiClient

project_option = click.option("--project", "-p", help="Project (default: your user name).")
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")


@click.group()
def job() -> None:
    """Run-to-completion jobs."""


@job.command("run", context_settings={"allow_interspersed_args": False})
@click.option("--name", help="Job name (default: job-<8 hex>).")
@project_option
@click.option("--image", help="Run in a container of this docker image (default: a host "
              "process). COMMAND replaces the image's entrypoint; none runs its default.")
@click.option("--as-args", is_flag=True,
              help="With --image: pass COMMAND to the image's entrypoint, as `docker run`.")
@click.option("--network", type=click.Choice(["bridge", "none"]),
              help="With --image: docker's bridge (default) or no network at all.")
@click.option("--checkpoint", metavar="PATH",
              help="A directory kept across attempts; NODUS_CHECKPOINT_DIR names it.")
@click.option("--env", "-e", "envs", multiple=True, metavar="K=V", help="Environment variable.")
@click.option("--export", metavar="ALL|NONE|VAR,...",
              help="Your environment the job gets (default ALL; NONE with --image).")
@click.option("--secret", "secrets", multiple=True, metavar="KEY[=VALUE]",
              help="Your secret KEY as variable KEY, or VALUE as secret variable KEY.")
@click.option("--gpus", "gpus", metavar="SPEC",
              help="Whole GPUs: 2, H100, H100:2, 2xH100 (`noduslocal gpus` lists them).")
@click.option("--sku", metavar="SKU", help="GPUs as a sku, e.g. gpu_2x_h100.")
@click.option("--max-cost", type=click.FloatRange(min=0, min_open=True),
              help="Stop the job once its GPUs cost more than this (MaxCostExceeded).")
@click.option("--priority", type=click.IntRange(-1000, 1000),
              help="Higher goes first (users up to the daemon's max_user_priority).")
@click.option("--expected-duration", metavar="DURATION",
              help="How long it should run (e.g. 20m): lets it start in gaps ahead of "
                   "bigger jobs.")
@click.option("--profile", metavar="NAME",
              help="The daemon's preset NAME fills every option left unset "
                   "(`noduslocal profiles`).")
@click.option("--region", metavar="NAME",
              help="Where it runs: this box (default) or a cluster region "
                   "(`noduslocal regions`).")
@click.option("--cpu", help="CPUs to reserve (default 1), e.g. 2 or 500m.")
@click.option("--memory", help="Memory to reserve, e.g. 512M or 4GiB.")
@click.option("--disk", help="Disk its directory may take, reserved at its start, e.g. 50G.")
@click.option("--min-disk-gb", type=click.IntRange(min=1),
              help="As --disk, in GiB (super job run's flag).")
@click.option("--retries", type=click.IntRange(0, 100), default=0, show_default=True,
              help="Re-runs after a lost attempt (a non-zero exit is final).")
@click.option("--timeout", help="Stop the job after this long: 90, 90s, 15m, 2h.")
@click.option("--workdir", help="Working directory (default: the job's workspace).")
@click.option("--label", "labels", multiple=True, metavar="K=V", help="Label.")
@click.option("--upload", "--include", "uploads", multiple=True, metavar="PATH",
              type=click.Path(exists=True, path_type=Path),
              help="Copy PATH into the workspace (at its name) before the job starts (.git and "
                   "what .gitignore or .nodusignore name are left out).")
@click.option("--allow-large-source", is_flag=True, help="Allow uploads over 100 MiB.")
@click.option("--volume", "volumes", multiple=True, metavar="NAME[:MOUNT]",
              help="Mount volume NAME at MOUNT (default /workspace/NAME).")
@click.option("--output", "outputs", multiple=True, metavar="NAME=PATH",
              help="Collect PATH (in the workspace) as output NAME after each attempt.")
@click.option("--nodes", type=click.IntRange(1), help="Run a gang of N ranks.")
@click.option("--gpus-per-node", type=click.IntRange(0), help="A gang rank's GPUs.")
@click.option("--launcher", type=click.Choice(LAUNCHERS), help="How a gang's ranks start.")
@click.option("--transport", type=click.Choice(list(TRANSPORTS)), help="How ranks talk.")
@click.option("--startup-timeout", metavar="DURATION", help="Every rank starts within it.")
@click.option("--completions", type=click.IntRange(1), help="Run indexes 0..N-1.")
@click.option("--parallelism", type=click.IntRange(1), help="At most P indexes at once.")
@click.option("--after", "after", multiple=True, metavar="[COND:][sweep:][PROJECT/]NAME,...",
              help="Wait for these jobs (or sweeps) to end first; COND is afterok (the "
                   "default: it succeeded), afterany (it ended) or afternotok (it failed or "
                   "was cancelled). One that can no longer be met cancels this job "
                   "(DependencyNeverSatisfied).")
@click.option("--replace", is_flag=True,
              help="A job of this --name goes first: stopped if it runs, then removed.")
@click.option("--detach", "-d", is_flag=True, help="Print the job's name and return.")
@json_option
@click.argument("command", nargs=-1)
def run(**o: Any) -> None:
    """Run COMMAND as a job: attached, stream its log and exit with its exit code."""
    with as_click():
        code = job_actions.run(o)
    sys.exit(code)


@job.command("list")
@click.option("--all", "-a", "show_all", is_flag=True, help="Include ended jobs.")
@click.option("--phase", "phases", multiple=True,
              type=click.Choice([p.value for p in Phase], case_sensitive=False))
@click.option("--owner", help="Only this user's jobs.")
@click.option("--label", "labels", multiple=True, metavar="K=V")
@click.option("--project", "-p", help="Only this project.")
@click.option("--limit", type=click.IntRange(1, 100_000), default=1000, show_default=True)
@click.option("--cells", is_flag=True, help="A line per task of a sweep (default: one line "
              "per sweep, with its tasks' counts).")
@json_option
def list_(**o: Any) -> None:
    """List jobs (everyone's; pending and running unless --all); a sweep's tasks as one
    line unless --cells (--json lists every job)."""
    with as_click():
        job_actions.list_jobs(o)


@job.command("logs")
@click.argument("name")
@project_option
@click.option("--follow", "-f", is_flag=True, help="Keep streaming until the job ends.")
@click.option("--tail", type=click.IntRange(0), help="Only the last N lines.")
@click.option("--attempt", type=click.IntRange(1), help="An earlier attempt's log.")
@click.option("--stderr", "stderr_only", is_flag=True, help="Only what went to stderr.")
@click.option("--rank", metavar="N|all", help="A gang's rank N (default 0), or all merged.")
@click.option("--index", metavar="N|all",
              help="An indexed job's index N (default 0), or all: every index's lines, "
                   "prefixed [iN].")
def logs(name: str, project: str | None, follow: bool, tail: int | None, attempt: int | None,
         stderr_only: bool, rank: str | None, index: str | None) -> None:
    """Print a job's output (stdout and stderr, in order)."""
    if rank is not None and rank != "all" and not rank.isdigit():
        raise click.BadParameter("a rank number or all", param_hint="--rank")
    if index is not None and index != "all" and not index.isdigit():
        raise click.BadParameter("an index number or all", param_hint="--index")
    stream = ApiClient().logs(name, project, follow=follow, tail=tail, attempt=attempt,
                           stream="stderr" if stderr_only else None, rank=rank,
                           index=index)
    try:
        for chunk in stream:
            sys.stdout.buffer.write(chunk)
            sys.stdout.buffer.flush()
    except KeyboardInterrupt:
        sys.exit(130)


@job.command("wait")
@click.argument("name")
@project_option
@click.option("--timeout", help="Give up after this long (exit 124).")
@click.option("--until", "until", type=click.Choice(["Running"]),
              help="Return once the job runs (exit 0), or 1 if it ended before it ran.")
@json_option
def wait(name: str, project: str | None, timeout: str | None, until: str | None,
         as_json: bool) -> None:
    """Block until a job ends; exit with its exit code."""
    seconds = None
    if timeout is not None:
        try:
            seconds = parse_duration(timeout, "timeout")
        except errors.InvalidArgument as exc:
            raise click.BadParameter(exc.message, param_hint="--timeout") from None
    client = ApiClient()
    if until is not None:
        _wait_running(client, name, project, seconds, as_json)
    try:
        if sys.stderr.isatty() and not as_json:
            from rich.console import Console

            with Console(stderr=True).status(f"waiting for {name}"):
                final = client.wait_job(name, project, seconds)
        else:
            final = client.wait_job(name, project, seconds)
    except errors.WaitTimeout as exc:
        click.echo(f"noduslocal: {exc.message}", err=True)
        sys.exit(124)
    if as_json:
        output.print_json(final)
    else:
        click.echo(output.summary(final))
    sys.exit(job_actions.exit_code(final))


def _wait_running(client: ApiClient, name: str, project: str | None, seconds: float | None,
                  as_json: bool) -> None:
    """`job wait --until Running`: for scripts that exec beside a job they just started."""
    deadline = None if seconds is None else time.monotonic() + seconds
    while True:
        doc = client.get_job(name, project)
        if doc["phase"] == Phase.RUNNING or doc["phase"] in TERMINAL:
            break
        if deadline is not None and time.monotonic() > deadline:
            click.echo(f"noduslocal: job {name!r} is still {doc['phase']} after {seconds:g}s",
                       err=True)
            sys.exit(124)
        time.sleep(0.05)
    if as_json:
        output.print_json(doc)
    else:
        click.echo(output.summary(doc))
    sys.exit(0 if doc["phase"] == Phase.RUNNING else 1)


@job.command("attempts")
@click.argument("name")
@project_option
@json_option
def attempts(name: str, project: str | None, as_json: bool) -> None:
    """List a job's attempts with their start, end, exit code and reason."""
    rows = ApiClient().attempts(name, project)
    if as_json:
        output.print_json(rows)
        return
    output.print_table(
        ("#", "PHASE", "STARTED", "ENDED", "EXIT", "SIGNAL", "REASON", "CONTAINER",
         "MESSAGE"),
        [(a["number"], a["phase"], a.get("started_at"), a.get("ended_at"), a.get("exit_code"),
          a.get("signal"), a.get("reason"), a.get("container"), a.get("message"))
         for a in rows])
