"""What `job status` shows of a gang: each rank's state, exit code and GPUs, from the
running attempt where there is one, else from what its end recorded in the attempt
directory (`ranks.json`, for any runtime).
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

from noduslocal.daemon.gpus.model import Inventory
from noduslocal.daemon.jobs.attempt import Attempt
from noduslocal.daemon.runtime.base import AttemptState, Exited, NeverStarted
from noduslocal.domain.jobs import JobRecord

RANKS = "ranks.json"  # in the attempt directory: each rank's end and GPUs, once it ended


def _gpus(uuids: list[str], rank: int, per_rank: int, inventory: Inventory) -> list[int]:
    by_uuid = inventory.by_uuid()
    share = uuids[rank * per_rank:(rank + 1) * per_rank]
    return [by_uuid[u].index for u in share if u in by_uuid]


def rank_view(job: JobRecord, attempt: Attempt | None, directory: Path | None,
              inventory: Inventory) -> list[dict[str, Any]] | None:
    gang = job.spec.gang
    if gang is None:
        return None
    ranks = []
    recorded = _recorded(directory) if attempt is None else None
    for rank in range(gang.nodes):
        view: dict[str, Any] = {"rank": rank, "state": "Pending", "exit_code": None,
                                "gpus": []}
        if attempt is not None:
            view["gpus"] = _gpus(attempt.gpus, rank, gang.gpus_per_node, inventory)
            end = attempt.ends[rank] if rank < len(attempt.ends) else None
            if end is None:
                view["state"] = "Running" if attempt.launched else "Starting"
            elif not end.done():
                view["state"] = "Running"
            else:
                view.update(_ended(end.result()))
        elif recorded is not None and rank < len(recorded):
            view.update(recorded[rank])
        else:
            view["state"] = "Unknown"
        ranks.append(view)
    return ranks


def record_ends(attempt: Attempt, inventory: Inventory) -> None:
    """Keep each rank's end and GPUs beside its logs for `job status` after the end."""
    gang, directory = attempt.job.spec.gang, attempt.directory
    if gang is None or directory is None:
        return
    ends = [_ended(end.result()) if end.done() else {"state": "Unknown", "exit_code": None}
            for end in attempt.ends]
    for rank, end in enumerate(ends):
        end["gpus"] = _gpus(attempt.gpus, rank, gang.gpus_per_node, inventory)
    tmp = directory / f".{RANKS}.tmp"
    tmp.write_text(json.dumps(ends))
    os.replace(tmp, directory / RANKS)


def _recorded(directory: Path | None) -> list[dict[str, Any]] | None:
    if directory is None:
        return None
    with contextlib.suppress(FileNotFoundError, ValueError):
        data = json.loads((directory / RANKS).read_text())
        if isinstance(data, list):
            return data
    return None


def _ended(state: AttemptState) -> dict[str, Any]:
    if isinstance(state, Exited):
        return {"state": "Exited", "exit_code": state.exit_code}
    return {"state": "NotStarted" if isinstance(state, NeverStarted) else "Lost",
            "exit_code": None}
