"""`noduslocal map`: one command over many values, GNU-parallel style, as a sweep: the code
snapshot uploaded once, the canary first, then the rest in the background. Its options
here; what it does in map_actions.py, which the fast path (cli/fast.py) calls too."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from noduslocal.cli import map_actions
from noduslocal.cli.job import json_option, project_option
from noduslocal.cli.usage import as_click
from noduslocal.domain import map_args as expand


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
def map_(**o: Any) -> None:
    """Run COMMAND once per value (or combination of values) as a sweep of tasks."""
    with as_click():
        code = map_actions.run(o)
    if code:
        sys.exit(code)
