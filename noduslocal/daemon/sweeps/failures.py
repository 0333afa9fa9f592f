"""Failed cells clustered by error: the exit code plus the last line of stderr with
numbers, paths and hex ids made alike, so 400 failures read as the two causes they are.
The line is kept with each attempt's end (last_line, read then); an older end's is read
from its file."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from noduslocal.daemon.store.rows import FailedCell

TAIL = 4096  # bytes of stderr read for its last line
MAX_CELLS = 1000  # failed cells looked at; the rest are counted, not read
EXAMPLES = 5
_PATH = re.compile(r"(?:[A-Za-z0-9_.~-]*/)+[A-Za-z0-9_.-]+")
_HEX = re.compile(r"\b(?:0x[0-9a-fA-F]+|[0-9a-fA-F]{8,})\b")
_NUMBER = re.compile(r"(?<![A-Za-z])\d+(?:\.\d+)?(?:e[-+]?\d+)?")


def normalise(line: str) -> str:
    line = _PATH.sub("PATH", line.strip())
    line = _HEX.sub("HEX", line)
    return _NUMBER.sub("N", line)[:300]


def last_line(path: Path) -> str:
    try:
        with path.open("rb") as file:
            file.seek(0, 2)
            size = file.tell()
            file.seek(max(0, size - TAIL))
            data = file.read()
    except OSError:
        return ""
    lines = [x for x in data.decode("utf-8", "replace").splitlines() if x.strip()]
    return lines[-1] if lines else ""


def clusters(failed: list[FailedCell],
             line_of: Callable[[FailedCell], str]) -> list[dict[str, Any]]:
    """Groups of failed cells, the largest first: exit code, normalised error, how many,
    the first few cells and an exemplar (the first) with its error as it was.
    `line_of(cell)`: the last line of its last attempt's stderr."""
    groups: dict[tuple[int | None, str], dict[str, Any]] = {}
    for cell in failed[:MAX_CELLS]:
        line = line_of(cell) if cell.attempts else ""
        key = (cell.exit_code, normalise(line) or (cell.message or cell.reason or ""))
        group = groups.setdefault(key, {"exit_code": key[0], "error": key[1], "count": 0,
                                        "cells": [], "exemplar": cell.cell,
                                        "exemplar_job": cell.name,
                                        "exemplar_error": line or cell.message})
        group["count"] += 1
        if len(group["cells"]) < EXAMPLES:
            group["cells"].append(cell.cell)
    return sorted(groups.values(), key=lambda g: (-g["count"], g["exemplar"]))
