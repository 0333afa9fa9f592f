"""`noduslocal sweeps` and `noduslocal sweep ...`: how sweeps stand (counts, and every cell
on request), waiting for one, cancelling it, changing its width live, harvesting the files
its tasks left, and removing an ended one."""

from __future__ import annotations

import fnmatch
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from noduslocal.cli import output, sweep_actions
from noduslocal.cli.job import json_option, project_option
from noduslocal.cli.usage import as_click
from noduslocal.domain.states import SWEEP_TERMINAL
from noduslocal.sdk.api_client import ApiClient

WATCH_EVERY = 1.0  # seconds between repaints of `status --watch`


@click.command("sweeps")
@click.option("--running", "-r", is_flag=True, help="Only sweeps that have not ended.")
@click.option("--all", "-a", "show_all", is_flag=True, hidden=True,
              help="Every sweep (the default; kept for old scripts).")
@project_option
@json_option
def sweeps(running: bool, show_all: bool, project: str | None, as_json: bool) -> None:
    """List all sweeps (ended ones too; --running to narrow) with their cells' counts."""
    found = ApiClient().list_sweeps(project=project, running=running)
    if as_json:
        output.print_json(found)
        return
    output.print_table(
        ("NAME", "PROJECT", "OWNER", "PHASE", "CELLS", "DONE", "COUNTS", "AGE"),
        [(s["name"], s["project"], s["owner"], s["phase"], s["cells"], s["done"],
          sweep_actions.counts(s), output.age(s["created_at"])) for s in found])


@click.group("sweep")
def sweep() -> None:
    """One sweep: status, logs, wait, suspend, resume, cancel, retry, set, harvest, gc, rm."""


def _status_table(doc: dict[str, Any]) -> Any:
    from rich.table import Table

    table = Table.grid(padding=(0, 2))
    table.add_row("sweep", f"{doc['name']} ({doc['project']})")
    table.add_row("phase", doc["phase"] + (f" ({doc['reason']})" if doc.get("reason") else ""))
    if doc.get("message"):
        table.add_row("why", doc["message"])
    table.add_row("cells", f"{doc['done']} of {doc['cells']} done; {sweep_actions.counts(doc)}")
    table.add_row("width", f"at most {doc['max_parallel']} at once")
    if after := doc.get("after"):
        table.add_row("after", ", ".join(
            f"{d['condition']}:{'sweep:' if d['kind'] == 'sweep' else ''}"
            f"{d['project']}/{d['name']}" for d in after))
    table.add_row("cost", f"{doc['cost']:.4f}")
    if (est := doc.get("estimate")) and est["cells_left"]:
        table.add_row("estimate", _estimate(est))
    if best := doc.get("best"):
        table.add_row("best", f"cell {best['index']} ({_params(best)}): throughput "
                              f"{best['throughput']:g}, cost {best['cost']:.4f}")
    for group in doc.get("failures") or []:
        cells = ", ".join(map(str, group["cells"])) + (", ..." if group["count"] > len(
            group["cells"]) else "")
        table.add_row("failed", f"{group['count']} x exit {group['exit_code']}: "
                                f"{group['error']} (cells {cells})")
    return table


def _estimate(est: dict[str, Any]) -> str:
    if est["cost"] is None:
        return f"unknown: {est['basis']}"
    return (f"{est['cost']:.4f} in all, about {output.duration(est['finish_in_s'])} more "
            f"({est['basis']})")


def _params(cell: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in cell["parameters"].items())


@sweep.command("status")
@click.argument("name")
@project_option
@click.option("--watch", "-w", is_flag=True, help="Repaint until the sweep ends.")
@click.option("--cells", "show_cells", is_flag=True, help="Also list every cell.")
@json_option
def status(name: str, project: str | None, watch: bool, show_cells: bool,
           as_json: bool) -> None:
    """How the sweep stands: phase, counts per phase and cost; --cells for every cell."""
    client = ApiClient()
    doc = client.get_sweep(name, project)
    if as_json:
        if show_cells:
            doc = {**doc, "cell_list": client.sweep_cells(name, project)}
        output.print_json(doc)
        return
    if watch and not sys.stdout.isatty():
        # Into a pipe or a file a repainted table shows nothing until the end: a line for
        # the status as it is, then one for each change.
        said = None
        while True:
            line = _status_line(doc)
            if line != said:
                click.echo(f"{time.strftime('%H:%M:%S')} {line}")
                said = line
            if doc["phase"] in SWEEP_TERMINAL:
                break
            time.sleep(WATCH_EVERY)
            doc = client.get_sweep(name, project)
    elif watch:
        from rich.console import Console
        from rich.live import Live

        with Live(_status_table(doc), console=Console(), auto_refresh=False) as live:
            while doc["phase"] not in SWEEP_TERMINAL:
                time.sleep(WATCH_EVERY)
                doc = client.get_sweep(name, project)
                live.update(_status_table(doc), refresh=True)
    else:
        from rich.console import Console

        Console().print(_status_table(doc))
    if show_cells:
        output.print_table(
            ("CELL", "NAME", "PARAMS", "GPU", "REGION", "PHASE", "WHY", "RAN", "THROUGHPUT",
             "COST"),
            [(c["index"], c["name"], _params(c), c["gpu"] or "", c["region"] or "",
              c["phase"], c["message"] or "", output.duration(c["wall_s"]),
              "" if c["throughput"] is None else f"{c['throughput']:g}",
              f"{c['cost']:.4f}") for c in client.sweep_cells(name, project)])


def _status_line(doc: dict[str, Any]) -> str:
    """One line of where the sweep stands (`status --watch` without a terminal)."""
    counts = ", ".join(f"{phase} {n}" for phase, n in sorted(doc["counts"].items()) if n)
    return (f"{doc['name']}: {doc['phase']}, "
            f"{doc.get('done', 0)}/{doc['cells']} done ({counts or 'none yet'}), "
            f"cost {doc['cost']:.4f}")


@sweep.command("logs")
@click.argument("name")
@project_option
@click.option("--task", type=int, help="The task (cell index); default: the exemplar of "
              "the most common failure.")
@click.option("--follow", "-f", is_flag=True, help="Follow until the task ends.")
def logs(name: str, project: str | None, task: int | None, follow: bool) -> None:
    """A task's log: by default the one failure that stands for the most."""
    client = ApiClient()
    if task is None:
        doc = client.get_sweep(name, project)
        if not doc.get("failures"):
            raise click.UsageError(f"{name} has no failed task; name one with --task N")
        cluster = doc["failures"][0]
        job = cluster["exemplar_job"]
        click.echo(f"(task {cluster['exemplar']}: {cluster['error']})", err=True)
    else:
        cells = client.sweep_cells(name, project)
        if not 0 <= task < len(cells):
            raise click.BadParameter(f"{name} has tasks 0 to {len(cells) - 1}",
                                     param_hint="--task")
        job = cells[task]["name"]  # the latest job of that task, after a retry too
    for chunk in client.logs(job, project, follow=follow):
        sys.stdout.buffer.write(chunk)
        sys.stdout.buffer.flush()


@sweep.command("wait")
@click.argument("name")
@project_option
@click.option("--timeout", type=float, help="Give up after this many seconds (exit 1).")
@json_option
def wait(name: str, project: str | None, timeout: float | None, as_json: bool) -> None:
    """Block until the sweep ends; exit 0 when every cell succeeded, 1 otherwise."""
    with as_click():
        code = sweep_actions.wait({"name": name, "project": project, "timeout": timeout,
                                   "as_json": as_json})
    sys.exit(code)


@sweep.command("cancel")
@click.argument("name")
@project_option
@click.option("--remaining", is_flag=True, help="Cancel the cells not started; let the "
              "running ones finish.")
@json_option
def cancel(name: str, project: str | None, remaining: bool, as_json: bool) -> None:
    """Cancel the sweep: cells not started, and running ones unless --remaining."""
    doc = ApiClient().cancel_sweep(name, project, remaining)
    if as_json:
        output.print_json(doc)
    else:
        click.echo(f"{doc['name']}: {doc['phase']}; {sweep_actions.counts(doc)}")


@sweep.command("suspend")
@click.argument("name")
@project_option
@json_option
def suspend(name: str, project: str | None, as_json: bool) -> None:
    """Start no more cells and stop the running ones (each kept Suspended, its checkpoint
    too) until `sweep resume`."""
    doc = ApiClient().suspend_sweep(name, project)
    if as_json:
        output.print_json(doc)
    else:
        click.echo(f"{doc['name']}: {doc['phase']}; {sweep_actions.counts(doc)}")


@sweep.command("resume")
@click.argument("name")
@project_option
@json_option
def resume(name: str, project: str | None, as_json: bool) -> None:
    """Go on with a suspended sweep: its suspended cells wait again, in order."""
    doc = ApiClient().resume_sweep(name, project)
    if as_json:
        output.print_json(doc)
    else:
        click.echo(f"{doc['name']}: {doc['phase']}: {doc['message']}")


@sweep.command("retry")
@click.argument("name")
@project_option
@click.option("--all", "-a", "include_cancelled", is_flag=True,
              help="Cancelled cells too, not only failed ones.")
@json_option
def retry(name: str, project: str | None, include_cancelled: bool, as_json: bool) -> None:
    """Run a failed sweep's failed cells again; after a canary failure, the canary first
    and the rest once it passes."""
    doc = ApiClient().retry_sweep(name, project, all=include_cancelled)
    if as_json:
        output.print_json(doc)
    else:
        click.echo(f"{doc['name']}: {doc['phase']}: {doc['message']}")


# `noduslocal sweep harvest NAME GLOB DEST`: the files every task left in its workspace
# that match GLOB, downloaded to DEST/task-<index>/<path>, each checked by sha256.

def matches(path: str, pattern: str) -> bool:
    """A pattern without '/' matches a file's name at any depth (as .gitignore does);
    one with '/' matches the path from the workspace's top."""
    if "/" in pattern:
        return fnmatch.fnmatchcase(path, pattern.lstrip("/"))
    return fnmatch.fnmatchcase(path.rsplit("/", 1)[-1], pattern)


def walk(client: ApiClient, job: str, project: str | None, path: str = "") -> Iterator[str]:
    """Every regular file of a job's workspace (links are not followed)."""
    for entry in client.list_files(job, project, path):
        if entry["type"] == "dir":
            yield from walk(client, job, project, entry["path"])
        elif entry["type"] == "file":
            yield entry["path"]


@sweep.command("harvest")
@click.argument("name")
@click.argument("pattern", metavar="GLOB")
@click.argument("dest", type=click.Path(file_okay=False, path_type=Path))
@project_option
def harvest(name: str, pattern: str, dest: Path, project: str | None) -> None:
    """Download the tasks' files that match GLOB to DEST/task-<index>/<path>."""
    from rich.progress import Progress

    client = ApiClient()
    cells: list[dict[str, Any]] = client.sweep_cells(name, project)
    got = 0
    with Progress(transient=True) as progress:
        bar = progress.add_task(f"harvesting {name}", total=len(cells))
        for cell in cells:
            if cell["attempts"]:
                for path in walk(client, cell["name"], project):
                    if matches(path, pattern):
                        target = dest / f"task-{cell['index']}" / path
                        target.parent.mkdir(parents=True, exist_ok=True)
                        client.download_file(cell["name"], project, path, target)
                        got += 1
            progress.advance(bar)
    click.echo(f"{got} files from {len(cells)} tasks in {dest}")


@sweep.command("gc")
@click.argument("name")
@project_option
@click.option("--yes", "-y", is_flag=True, help="Do not ask.")
@json_option
def gc(name: str, project: str | None, yes: bool, as_json: bool) -> None:
    """Free a finished sweep's workspaces (harvest first); history, logs and cost stay."""
    client = ApiClient()
    doc = client.get_sweep(name, project)
    if not yes:
        if not sys.stdin.isatty():
            raise click.UsageError("gc deletes every task's workspace; add --yes")
        click.confirm(f"delete the workspaces of {doc['cells']} tasks of {name}?",
                      abort=True)
    doc = client.gc_sweep(name, project)
    if as_json:
        output.print_json(doc)
    else:
        click.echo(f"{doc['name']}: workspaces of {doc['cells']} tasks freed")


@sweep.command("rm")
@click.argument("name")
@project_option
def rm(name: str, project: str | None) -> None:
    """Remove an ended sweep: out of listings, its name free for a new sweep; its tasks
    are removed as `job rm` removes a job (workspaces and logs gone, history and cost
    kept). A sweep that runs is refused: `sweep cancel` it first, or `map --replace`."""
    done = ApiClient().remove_sweep(name, project)
    click.echo(f"{done['removed']}: removed; the name is free")


@sweep.command("set")
@click.argument("name")
@project_option
@click.option("--max-parallel", type=click.IntRange(1, 10_000), required=True,
              help="Cells running at once, from now on.")
@json_option
def set_(name: str, project: str | None, max_parallel: int, as_json: bool) -> None:
    """Change a running sweep's width."""
    doc = ApiClient().set_sweep(name, project, max_parallel=max_parallel)
    if as_json:
        output.print_json(doc)
    else:
        click.echo(f"{doc['name']}: at most {doc['max_parallel']} cells at once")
