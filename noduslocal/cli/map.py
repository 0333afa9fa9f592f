"""`noduslocal map`: one command over many values, GNU-parallel style, as a sweep: the code
snapshot uploaded once, the canary first, then the rest in the background."""

from __future__ import annotations

import contextlib
import shlex
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click

from noduslocal.cli import output
from noduslocal.cli.export import exported, pairs
from noduslocal.cli.job import json_option, project_option
from noduslocal.cli.usage import as_click
from noduslocal.domain import map_args as expand

CANARY_POLL = 0.5  # seconds a long poll on the canary lasts (a terminal's line)
CANARY_SETTLE = 0.05  # seconds between looks at a sweep whose canary has ended


@click.command("map", context_settings={"allow_interspersed_args": False},
               # click rewraps each paragraph but one marked \b: the grammar keeps its lines.
               epilog="\n\n".join("\b\n" + part for part in expand.GRAMMAR.split("\n\n")))
@click.option("--name", help="Sweep name (default: sweep-<8 hex>); tasks are NAME-<index>.")
@click.option("--replace", is_flag=True,
              help="Free --name first: the sweep that has it is cancelled if it runs (its "
                   "tasks waited for), then removed (`sweep rm`).")
@project_option
@click.option("--image", help="Run each task in a container of this docker image.")
@click.option("--gpus", metavar="SPEC", help="GPUs per task: 1, H100, H100:2, 2xH100.")
@click.option("--sku", metavar="SKU", help="GPUs per task as a sku, e.g. gpu_1x_l4.")
@click.option("--cpu", help="CPUs per task (default 1), e.g. 2 or 500m.")
@click.option("--memory", help="Memory per task, e.g. 4GiB.")
@click.option("--region", metavar="NAME",
              help="Where the tasks run: this box (default) or a cluster region "
                   "(`noduslocal regions`).")
@click.option("--timeout", help="Stop a task after this long: 90s, 15m, 2h.")
@click.option("--max-parallel", type=click.IntRange(1, 10_000), default=8, show_default=True,
              help="Tasks running at once; change it live with `sweep set`.")
@click.option("--retries", type=click.IntRange(0, 100), default=0, show_default=True,
              help="Re-runs of a task that exits non-zero (after 1 s, 2 s, 4 s ...; not "
                   "exit 126/127 or an OOM kill). A lost task runs again without one.")
@click.option("--canary-smoke", metavar="CMD", help="Gate on this cheap command instead.")
@click.option("--no-canary", is_flag=True, help="Start every task at once, no gate.")
@click.option("--no-wait", is_flag=True, help="Return once the sweep is created.")
@click.option("--code", metavar="DIR", type=click.Path(exists=True, file_okay=False,
                                                        path_type=Path),
              help="The code snapshot every task starts from (default: this directory; .git and "
              "what .gitignore or .nodusignore name are left out).")
@click.option("--no-code", is_flag=True, help="Upload no code; tasks start empty.")
@click.option("--from", "from_job", metavar="JOB", help="Start each task from a copy of this "
              "finished job's workspace, in its image (unless --image).")
@click.option("--volume", "volumes", multiple=True, metavar="NAME[:MOUNT]",
              help="Mount volume NAME at MOUNT (default /workspace/NAME) in every task.")
@click.option("--env", "-e", "envs", multiple=True, metavar="K=V", help="Environment variable.")
@click.option("--export", metavar="ALL|NONE|VAR,...",
              help="Your environment every task gets (default ALL; NONE with --image).")
@click.option("--secret", "secrets", multiple=True, metavar="KEY", help="Your secret KEY.")
@click.option("--label", "labels", multiple=True, metavar="K=V", help="Label.")
@click.option("--webhook", metavar="URL", help="POST the status on canary pass/fail and end.")
@click.option("--allow-large-source", is_flag=True, help="Allow a code snapshot over 100 MiB.")
@click.option("--after", "after", multiple=True, metavar="[COND:][sweep:][PROJECT/]NAME,...",
              help="The whole sweep waits for these jobs (or sweeps) first, as `job run "
                   "--after`: afterok (default), afterany or afternotok.")
@click.option("--dry-run", is_flag=True, help="Print each task's command; create nothing.")
@json_option
@click.argument("command", nargs=-1, required=True)
def map_(name: str | None, replace: bool, project: str | None, image: str | None, gpus: str | None,
         sku: str | None, cpu: str | None, memory: str | None, region: str | None,
         timeout: str | None,
         max_parallel: int, retries: int, canary_smoke: str | None, no_canary: bool,
         no_wait: bool, code: Path | None, no_code: bool, from_job: str | None,
         volumes: tuple[str, ...], envs: tuple[str, ...], export: str | None,
         secrets: tuple[str, ...],
         labels: tuple[str, ...], webhook: str | None, allow_large_source: bool,
         after: tuple[str, ...], dry_run: bool, as_json: bool, command: tuple[str, ...]) -> None:
    """Run COMMAND once per value (or combination of values) as a sweep of tasks."""
    if replace and name is None:
        raise click.UsageError("--replace needs --name")
    if canary_smoke is not None and no_canary:
        raise click.UsageError("give --canary-smoke or --no-canary, not both")
    if gpus and sku:
        raise click.UsageError("give --gpus or --sku, not both")
    if sum((code is not None, no_code, from_job is not None)) > 1:
        raise click.UsageError("give one of --code, --no-code and --from")
    args = list(command)
    lines = None
    if expand.MARKER not in args:
        if sys.stdin.isatty():
            raise click.UsageError("no ::: values, and standard input is a terminal: pipe "
                                   "one task's value per line, or see `noduslocal help map`")
        lines = sys.stdin.read().splitlines()
    tasks = expand.parse(args, lines)
    if dry_run:
        for task in tasks.tasks():
            click.echo(shlex.join(task.argv))
        return
    from noduslocal.sdk.api_client import ApiClient

    client = ApiClient()
    template: dict[str, Any] = {}
    for key, value in (("image", image), ("gpu", gpus or sku), ("cpu", cpu),
                       ("memory", memory), ("region", region), ("timeout", timeout)):
        if value is not None:
            template[key] = value
    if retries:
        template["retries"] = retries
    with as_click():
        env = {**{k: v for k, v in exported(export, image is not None).items()
                  if k not in secrets}, **pairs(envs, "--env")}
    if env:
        template["env"] = env
    if secrets:
        template["secrets"] = list(secrets)
    if volumes:
        template["volumes"] = {mount or f"/workspace/{vol}": vol for vol, _, mount in
                               (item.partition(":") for item in volumes)}
    if from_job is not None:
        copied = client.snapshot_job(from_job, project, allow_large=allow_large_source)
        template["source"] = {"sha256": copied["sha256"]}
        if image is None and copied["image"] is not None:
            template["image"] = copied["image"]  # --image names another
    elif not no_code:
        template["source"] = client.upload_source(
            [code or Path.cwd()], contents_of_single_dir=True, allow_large=allow_large_source,
            say=output.upload_said(quiet=as_json))
    body: dict[str, Any] = {"template": template, "max_parallel": max_parallel,
                            "map": {"args": args, "lines": lines} if lines is not None
                            else {"args": args},
                            "canary": "none" if no_canary else "cell"}
    if canary_smoke is not None:
        body.pop("canary")
        body["canary_smoke"] = canary_smoke
    for key, value in (("name", name), ("project", project), ("webhook", webhook)):
        if value is not None:
            body[key] = value
    if labels:
        with as_click():
            body["labels"] = pairs(labels, "--label")
    if after:
        body["after"] = [item for value in after for item in value.split(",")]
    if replace:
        assert name is not None
        client.replace_sweep(name, project)
    sweep = client.create_sweep(body)
    if no_wait or sweep["phase"] != "Canary":
        _done(sweep, as_json, "created")
        return
    try:
        sweep = _wait_canary(client, sweep, quiet=as_json)
    except KeyboardInterrupt:
        click.echo(f"\ndetached; {sweep['name']} goes on. Watch: noduslocal sweep status "
                   f"{sweep['name']} --watch  Stop: noduslocal sweep cancel {sweep['name']}",
                   err=True)
        sys.exit(130)
    if sweep["reason"] == "CanaryFailed":
        if as_json:
            output.print_json(sweep)
        else:
            click.echo(f"noduslocal: {sweep['name']}: {sweep['message']}", err=True)
            canary = f"{sweep['name']}-{'canary' if canary_smoke else 0}"
            click.echo(f"the canary's log: noduslocal job logs {canary} -p {sweep['project']}"
                       f"; after a fix: noduslocal sweep retry {sweep['name']}", err=True)
        sys.exit(1)
    _done(sweep, as_json, "canary passed")


def _wait_canary(client: Any, sweep: dict[str, Any], quiet: bool) -> dict[str, Any]:
    """Until the canary (cell 0) has passed or failed: long polls on the canary, so the
    command returns as soon as it has, with a live line of how it stands on a terminal."""
    from noduslocal.domain import errors

    live = not quiet and sys.stderr.isatty()
    settle = CANARY_SETTLE
    with _canary_line(sweep) if live else contextlib.nullcontext(None) as show:
        while sweep["phase"] == "Canary":
            try:
                canary = client.wait_job(sweep["canary_job"], sweep["project"], CANARY_POLL)
            except errors.WaitTimeout:
                canary = None
            sweep = client.get_sweep(sweep["name"], sweep["project"])
            if canary is not None and sweep["phase"] == "Canary":
                # Its sweep moves on right after it ends; should it not, looked at less
                # and less often, never in a loop of requests.
                time.sleep(settle)
                settle = min(CANARY_POLL, settle * 2)
            if show is not None:
                show(sweep, canary or client.get_job(sweep["canary_job"], sweep["project"]))
    return sweep


@contextlib.contextmanager
def _canary_line(sweep: dict[str, Any]) -> Iterator[Callable[[dict[str, Any], dict[str, Any]],
                                                             None]]:
    """A live line on stderr of how the canary stands; yields what updates it."""
    from rich.console import Console

    started = time.monotonic()
    with Console(stderr=True).status(f"{sweep['name']}: canary of {sweep['cells']} "
                                     "tasks") as bar:
        yield lambda sweep, canary: bar.update(
            f"{sweep['name']}: canary {canary['name']} {canary['phase']}"
            f"{' - ' + canary['hold'] if canary.get('hold') else ''}, "
            f"{time.monotonic() - started:.0f}s")


def _done(sweep: dict[str, Any], as_json: bool, what: str) -> None:
    if as_json:
        output.print_json(sweep)
        return
    click.echo(sweep["name"])
    click.echo(f"{what}: {sweep['cells']} tasks, at most {sweep['max_parallel']} at once. "
               f"Watch: noduslocal sweep status {sweep['name']} --watch", err=True)
