"""What `sweep wait` does, apart from click: the fast path (cli/fast.py) and click's command
(cli/sweeps.py) both call it, so a script's `sweep wait` pays no import of click (52 ms of
CPU a call became 20, issue 25 part 5); the counts line every sweep command prints.
"""

from __future__ import annotations

import contextlib
import sys
import time

from noduslocal.cli.usage import Usage

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from typing import Any

    from noduslocal.sdk.api_client import ApiClient


def counts(sweep: dict[str, Any]) -> str:
    """The sweep's cells by phase, in the phases' order: `3 running 5 succeeded`."""
    from noduslocal.domain.states import Phase  # the wait reads it anyway (SWEEP_TERMINAL)

    found = sweep["counts"]
    return " ".join(f"{found[p]} {p.lower()}" for p in Phase if found.get(p))


def wait(o: dict[str, Any]) -> int:
    """`sweep wait`: block until the sweep ends; 0 when every cell succeeded, 1 otherwise.
    O: the command's options by their click names (name, project, timeout, as_json)."""
    timeout = o["timeout"]
    if timeout is not None and not timeout >= 0:  # NaN too: it polled without end
        raise Usage(f"{timeout} is not a number of seconds (0 or more)", "--timeout")
    from noduslocal.sdk.api_client import ApiClient

    doc = wait_with_progress(ApiClient(), o["name"], o["project"], timeout,
                             quiet=o["as_json"])
    if o["as_json"]:
        from noduslocal.cli import output

        output.print_json(doc)
    else:
        print(f"{doc['name']}: {doc['phase']}: {doc.get('message') or counts(doc)}")
    return 0 if doc["phase"] == "Succeeded" else 1


def wait_with_progress(client: ApiClient, name: str, project: str | None,
                       timeout: float | None, quiet: bool) -> dict[str, Any]:
    """wait_sweep in one-second long polls, with a live bar of cells done on a terminal's
    stderr (into a pipe rich draws nothing, and only loading it cost 0.1 s of CPU). With
    no bar to draw, in the daemon's longest polls: each answer is the sweep's whole status,
    tens of milliseconds of the daemon's CPU for a sweep of thousands of cells."""
    from noduslocal.domain import errors
    from noduslocal.domain.states import SWEEP_TERMINAL

    deadline = None if timeout is None else time.monotonic() + timeout
    doc = client.get_sweep(name, project)
    if quiet or not sys.stderr.isatty():
        return doc if doc["phase"] in SWEEP_TERMINAL else client.wait_sweep(
            name, project, None if deadline is None else deadline - time.monotonic())
    with _cells_bar(name, doc) as show:
        while doc["phase"] not in SWEEP_TERMINAL:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise errors.WaitTimeout(f"sweep {name!r} is still {doc['phase']} after "
                                         f"{timeout:g}s")
            try:
                doc = client.wait_sweep(name, project, min(1.0, left) if left else 1.0)
            except errors.WaitTimeout:
                doc = client.get_sweep(name, project)
            show(doc)
    return doc


@contextlib.contextmanager
def _cells_bar(name: str, doc: dict[str, Any]) -> Iterator[Callable[[dict[str, Any]], None]]:
    """A live bar of the sweep's cells done, on stderr; yields what updates it."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[counts]}"), transient=True,
                  console=Console(stderr=True)) as progress:
        bar = progress.add_task(name, total=doc["cells"], completed=doc["done"],
                                counts=counts(doc))
        yield lambda now: progress.update(bar, completed=now["done"], counts=counts(now))
