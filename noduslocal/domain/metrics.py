"""What a job reports about itself: JSON lines it appends to `$NODUS_METRICS_FILE` (a file
at the top of its workspace), folded into the last value of each numeric key. Read from
the workspace's descriptor without following links, as the rest of the data plane is.
"""

from __future__ import annotations

import json
import math
import os
import stat
import warnings
from pathlib import Path
from typing import Any

from noduslocal.domain.job_paths import CONTAINER_ROOT

METRICS_FILE = ".nodus-metrics.jsonl"  # in the workspace
ENV = "NODUS_METRICS_FILE"
READ_TAIL = 64 * 1024  # bytes read from the end of the file: recent lines are what count
MAX_KEYS = 32
MAX_KEY = 64


def env(workspace: Path | None) -> dict[str, str]:
    """The variable a job finds its metrics file by (None: under /workspace, in a
    container or a host job's mount namespace)."""
    root = str(workspace) if workspace is not None else CONTAINER_ROOT
    return {ENV: f"{root}/{METRICS_FILE}"}


def read(workspace: Path, owner_uid: int) -> dict[str, float]:
    """The last value of each numeric key the job reported; {} when it reported none, or
    when the file is a link, not a regular file, or not the owner's."""
    try:
        root = os.open(workspace, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return {}
    try:
        fd = os.open(METRICS_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     dir_fd=root)
    except OSError:
        return {}
    finally:
        os.close(root)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or (owner_uid != 0 and info.st_uid != owner_uid):
            return {}
        start = max(0, info.st_size - READ_TAIL)
        data = os.pread(fd, READ_TAIL, start)
    finally:
        os.close(fd)
    lines = data.split(b"\n")
    if start:
        lines = lines[1:]  # the first may be cut
    return fold(lines)


def fold(lines: list[bytes]) -> dict[str, float]:
    values: dict[str, float] = {}
    for line in lines:
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if not isinstance(item, dict):
            continue
        for key, value in item.items():
            if (isinstance(key, str) and 0 < len(key) <= MAX_KEY
                    and isinstance(value, int | float) and not isinstance(value, bool)
                    and math.isfinite(value)
                    and (key in values or len(values) < MAX_KEYS)):
                values[key] = float(value)
    return values


def report(**metrics: float) -> None:
    """From inside a job: record metrics (`noduslocal.report(throughput=812.5)`); the
    sweep's report and `job status` show the last value of each. Outside a job it warns
    and does nothing, so the same script runs anywhere."""
    path = os.environ.get(ENV)
    if not path:
        warnings.warn(f"noduslocal.report: not inside a noduslocal job (no ${ENV}); "
                      "nothing recorded", stacklevel=2)
        return
    bad = [k for k, v in metrics.items()
           if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v)]
    if bad:
        raise TypeError(f"report: {bad[0]} must be a finite number")
    line: dict[str, Any] = dict(metrics)
    with open(path, "a") as file:
        file.write(json.dumps(line) + "\n")
