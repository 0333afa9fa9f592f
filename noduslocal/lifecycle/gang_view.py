"""What `job status` shows of a gang: each rank's state, exit code and GPUs, from the
running attempt where there is one, else from the last attempt's exit records.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from noduslocal.gpu.model import Inventory
from noduslocal.lifecycle.attempt import Attempt
from noduslocal.models import JobRecord
from noduslocal.runtime.attempts import Exited, NeverStarted, read_exit
from noduslocal.runtime.base import rank_dir


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
    for rank in range(gang.nodes):
        view: dict[str, Any] = {"rank": rank, "state": "Pending", "exit_code": None,
                                "gpus": []}
        if attempt is not None:
            view["gpus"] = _gpus(attempt.gpus, rank, gang.gpus_per_node, inventory)
            end = attempt.ends[rank] if rank < len(attempt.ends) else None
            if end is None:
                view["state"] = "Running" if attempt.running else "Starting"
            elif not end.done():
                view["state"] = "Running"
            else:
                view.update(_ended(end.result()))
        elif directory is not None:
            exited = read_exit(rank_dir(directory, rank))
            if exited is not None:
                view.update(_ended(exited))
            else:
                view["state"] = "Unknown"
        ranks.append(view)
    return ranks


def _ended(state: object) -> dict[str, Any]:
    if isinstance(state, Exited):
        return {"state": "Exited", "exit_code": state.exit_code}
    return {"state": "NotStarted" if isinstance(state, NeverStarted) else "Lost"}
