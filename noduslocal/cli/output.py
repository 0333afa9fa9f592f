"""How the CLI shows things: JSON for scripts, aligned columns for people (as `squeue` and
`docker ps` print them; rich is left to what draws live), and human times and sizes."""

from __future__ import annotations

import os
import sys
import time

from noduslocal.domain.timefmt import parse_iso

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any

GAP = "  "  # between columns


def print_json(value: Any) -> None:
    import json  # for --json alone: it brings `re`

    sys.stdout.write(json.dumps(value, indent=2) + "\n")


def print_table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """COLUMNS over ROWS, each column as wide as its widest cell; the header in bold on a
    terminal. A cell's newlines and tabs are shown as spaces, so a row stays one line."""
    cells = [["" if cell is None else " ".join(str(cell).split()) for cell in row]
             for row in rows]
    widths = [max([len(column), *(len(row[i]) for row in cells)])
              for i, column in enumerate(columns)]
    header = GAP.join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip()
    if sys.stdout.isatty() and not os.environ.get("NO_COLOR"):
        header = f"\033[1m{header}\033[0m"
    lines = [header] + [GAP.join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
                        for row in cells]
    sys.stdout.write("\n".join(lines) + "\n")


def age(stamp: str | None) -> str:
    when = parse_iso(stamp)
    return "" if when is None else duration(time.time() - when)


def duration(seconds: float | None) -> str:
    if seconds is None:
        return ""
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.1f}s" if seconds < 10 else f"{seconds:.0f}s"
    minutes, sec = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{sec:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h{minutes:02d}m"
    return f"{hours // 24}d{hours % 24}h"


def summary(job: dict[str, Any]) -> str:
    """One line on how a job stands, for people."""
    text = f"{job['name']}: {job['phase']}"
    if job.get("reason") and job["reason"] not in ("Created", "Completed", "Started"):
        text += f" ({job['reason']})"
    if job.get("message"):
        text += f": {job['message']}"
    elif job.get("hold"):
        text += f": {job['hold']}"
    return text


def print_entries(entries: Sequence[dict[str, Any]]) -> None:
    """A directory listing (of a workspace or a volume), as `ls -l` would show it."""
    print_table(
        ("MODE", "SIZE", "MODIFIED", "NAME"),
        [(e["mode"], e["size"] if e["type"] != "dir" else "-", e["mtime"],
          e["name"] + ("/" if e["type"] == "dir" else "")
          + (f" -> {e['target']}" if e.get("target") else "")) for e in entries])


def upload_said(quiet: bool) -> Callable[[int, str], None]:
    """How `map` and `job run` say what their code upload packed: on stderr, so stdout stays
    the command's. --json makes the size line quiet (as it does the progress), but not the
    warning over the threshold: that one names what to leave out, and stderr is not parsed."""

    def say(level: int, text: str) -> None:
        if not quiet or level >= 30:  # logging.WARNING, without importing logging here
            sys.stderr.write(text + "\n")

    return say
