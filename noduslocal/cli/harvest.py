"""`noduslocal sweep harvest NAME GLOB DEST`: the files every task left in its workspace
that match GLOB, downloaded to DEST/task-<index>/<path>, each checked by sha256."""

from __future__ import annotations

import fnmatch
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from noduslocal.cli.job import project_option
from noduslocal.sdk.api_client import ApiClient


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


@click.command("harvest")
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
