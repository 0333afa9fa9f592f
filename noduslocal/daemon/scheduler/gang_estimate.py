"""What a gang's estimate adds: the GPU sets its ranks would get (the best-connected free
set now, else the best on the box once the GPUs held now are free), the worst link inside
each rank and across the gang, and what it waits for. Pure logic.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from noduslocal.daemon.gpus.model import LEVEL_NAMES, NVLINK, Gpu, Inventory
from noduslocal.daemon.scheduler.capacity import Request
from noduslocal.daemon.scheduler.gpus import GpuPool


def _level(inventory: Inventory, gpus: list[Gpu]) -> str | None:
    links = [inventory.link(a.index, b.index) for i, a in enumerate(gpus) for b in gpus[i + 1:]]
    if not links:
        return None
    worst = max(links)
    return "NVLink" if worst <= NVLINK else LEVEL_NAMES.get(worst, f"level {worst}")


def gang_topology(pool: GpuPool | None, req: Request, nodes: int, per_rank: int,
                  hold: str | None) -> dict[str, Any]:
    doc: dict[str, Any] = {"ranks": nodes, "gpus_per_rank": per_rank, "rank_gpus": None,
                           "rank_link": None, "gang_link": None, "when": None,
                           "waits_for": hold}
    if pool is None or req.gpu is None:
        doc["when"] = "no GPUs asked for"
        return doc
    by_uuid = pool.inventory.by_uuid()
    held = [by_uuid[u] for u in pool.by_job.get(req.job_id, []) if u in by_uuid]
    if held:
        chosen, doc["when"] = held, "it holds them"
    else:
        chosen, doc["when"] = pool.pick_ranks(req.gpu, nodes), "now, if it started"
    if chosen is None:
        idle = replace(pool, holder={}, by_job={}, released={})
        chosen, doc["when"] = idle.pick_ranks(req.gpu, nodes), "once the GPUs held now are free"
    if chosen is None:
        doc["when"] = "never on this box as it is (too few healthy GPUs of that kind)"
        return doc
    shares = [chosen[r * per_rank:(r + 1) * per_rank] for r in range(nodes)]
    doc["rank_gpus"] = [[g.index for g in share] for share in shares]
    levels = [lv for share in shares if (lv := _level(pool.inventory, share))]
    doc["rank_link"] = max(levels, key=_rank_of_name) if levels else None
    doc["gang_link"] = _level(pool.inventory, chosen)
    return doc


def _rank_of_name(name: str) -> int:
    order = ["NVLink", *LEVEL_NAMES.values()]
    return order.index(name) if name in order else len(order)
