"""How the CLI shows things: JSON for scripts, rich tables for people (imported only when
a table is drawn, to keep the other commands fast), and human times and sizes."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from typing import Any

from noduslocal.timefmt import parse_iso


def print_json(value: Any) -> None:
    sys.stdout.write(json.dumps(value, indent=2) + "\n")


def print_table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in columns:
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*("" if cell is None else str(cell) for cell in row))
    Console(soft_wrap=False).print(table)


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
