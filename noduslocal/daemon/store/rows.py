"""Rows of the jobs and attempts tables as records: the columns read, a job's stored spec
parsed once however often it is listed, a sweep's cells grouped for its estimate, and its
failed cells as their clusters read them."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any

from noduslocal.domain.jobs import AttemptRecord, JobRecord, JobSpec
from noduslocal.domain.states import TERMINAL

JOB_COLUMNS = (
    "id, project, name, owner_uid, owner_gid, owner, phase, reason, message, spec, labels, "
    "created_at, started_at, ended_at, exit_code, signal, attempts, retries_used, cost, "
    "sweep_id, cell, metrics, collected_at"
)
TERMINAL_SQL = ", ".join(f"'{p.value}'" for p in sorted(TERMINAL))
ATTEMPT_COLUMNS = (
    "job_id, number, phase, created_at, started_at, ended_at, exit_code, signal, reason, "
    "message, stop_reason, gpus, cost, handles"
)


@functools.lru_cache(maxsize=4096)
def _spec(stored: str) -> JobSpec:
    """A spec from its stored JSON, parsed once: a listing reads every job's, and a stored
    spec never changes (JobSpec is frozen, and nothing changes its lists in place)."""
    return JobSpec.from_stored(json.loads(stored))


def job_from_row(row: tuple[Any, ...]) -> JobRecord:
    return JobRecord(
        id=row[0], project=row[1], name=row[2], owner_uid=row[3], owner_gid=row[4],
        owner=row[5], phase=row[6], reason=row[7], message=row[8],
        spec=_spec(row[9]), labels=json.loads(row[10]),
        created_at=row[11], started_at=row[12], ended_at=row[13], exit_code=row[14],
        signal=row[15], attempts=row[16], retries_used=row[17], cost=row[18],
        sweep_id=row[19], cell=row[20], metrics=json.loads(row[21]) if row[21] else {},
        collected_at=row[22],
    )


def attempt_from_row(row: tuple[Any, ...]) -> AttemptRecord:
    return AttemptRecord(*row)


# What each cell of a sweep asks for, where all of them ask the same: GPUs, their model,
# the expected duration (seconds), CPUs and memory (bytes; 0: none asked for).
CellAsks = tuple[int, str | None, float | None, float, int]


def asks_of(spec: JobSpec) -> CellAsks:
    """What a cell of this spec asks for, as the cell groups' query reads it from a row."""
    gpu = spec.gpu
    return (gpu.count if gpu is not None else 0, gpu.model if gpu is not None else None,
            spec.expected_duration, spec.cpu_m / 1000, spec.memory or 0)


@dataclass(frozen=True)
class CellGroup:
    """The current cells of one phase and one GPU request."""
    phase: str
    gpus: int
    model: str | None
    expected_duration: float | None
    count: int
    wall: float  # seconds, summed over the cells that ran and ended
    ran: int  # how many ran and ended
    started: float  # started_at summed over the running ones
    cpu: float = 1.0  # each cell's CPUs and memory (bytes; 0: none asked for)
    memory: int = 0


@dataclass(frozen=True)
class FailedCell:
    """A failed cell as its sweep's failures are clustered: what its latest job ended
    with, and the last line of that job's last attempt's stderr as kept at the end (None
    for an attempt that ended before it was kept: the file is read)."""
    sweep_id: int
    job_id: int
    cell: int
    name: str
    exit_code: int | None
    reason: str | None
    message: str | None
    attempts: int
    stderr_line: str | None
