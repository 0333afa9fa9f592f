"""When a pending job should start: a simulation of the queue from now, where running jobs
end at their expected ends and started ones run for their expected_duration. Pure logic;
None with the reason when the answer depends on a job that has no expected duration.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from noduslocal.daemon.scheduler.queue import Queue, Request

MAX_STEPS = 2_000  # job ends simulated at most: an estimate must stay cheap


@dataclass(frozen=True)
class StartEstimate:
    at: float | None
    why: str  # how it was found, or why it cannot be


def estimate_start(queue: Queue, job_id: int, now: float,
                   name_of: Callable[[int], str | None] = lambda job_id: None,
                   ) -> StartEstimate:
    """`name_of(job_id)`: how a job that blocks the estimate is named to the user."""
    cap = queue.capacity
    pool = cap.gpus
    free_cpu, free_mem = cap.cpu_m - cap.used_cpu_m, cap.memory - cap.used_memory
    free_gpus = ({g.uuid for g in pool.inventory.gpus
                  if g.uuid not in pool.holder and pool.busy(g) is None}
                 if pool is not None else set())
    # (end or None, request, its GPUs) of everything running, soonest end first
    running = [(end, req, list(pool.by_job.get(job_id_, [])) if pool else [])
               for job_id_, (req, end) in cap.running.items()]
    target = queue.request(job_id)
    if target is None:
        return StartEstimate(None, "it is not waiting in the queue")
    if (why := queue.blocked.get(target.runtime)) is not None:
        return StartEstimate(None, why)
    # Jobs start in order in the simulation (no backfill), so the started ones are always
    # a prefix: a pointer, not list copies. Only what is ahead of the target matters.
    order = [r for r in queue.order() if r.runtime not in queue.blocked]
    pending = order[:next(i for i, r in enumerate(order) if r.job_id == job_id) + 1]
    head = 0
    t = now
    for _ in range(MAX_STEPS):
        while head < len(pending):
            req = pending[head]
            gpus = _pick(queue, req, free_gpus)
            if not (req.cpu_m <= free_cpu and req.memory <= free_mem and gpus is not None):
                break
            if req.job_id == job_id:
                return StartEstimate(t, "simulated from the queue and expected ends")
            head += 1
            free_cpu -= req.cpu_m
            free_mem -= req.memory
            free_gpus -= set(gpus)
            end = t + req.expected if req.expected is not None else None
            running.append((end, req, gpus))
        if head >= len(pending):
            break
        known = [item for item in running if item[0] is not None]
        unknown = [r for end, r, _ in running if end is None]
        why = "it waits for jobs without an expected duration" + (
            f" ({name_of(unknown[0].job_id) or f'job {unknown[0].job_id}'})" if unknown else "")
        if not known:
            return StartEstimate(None, why)
        nxt = min(known, key=lambda item: item[0] or 0.0)
        if unknown and _needs_unknown(queue, target, running, free_cpu, free_mem, free_gpus):
            return StartEstimate(None, why)
        running.remove(nxt)
        t = max(t, nxt[0] or t)
        free_cpu += nxt[1].cpu_m
        free_mem += nxt[1].memory
        free_gpus |= set(nxt[2])
    return StartEstimate(None, "the queue is too long to simulate")


def _pick(queue: Queue, req: Request, free: set[str]) -> list[str] | None:
    if req.gpu is None:
        return []
    pool = queue.capacity.gpus
    if pool is None:
        return None
    fitting = [g.uuid for g in pool.inventory.gpus
               if g.uuid in free and pool.matches(g, req.gpu) and g.healthy
               and g.uuid not in pool.drained and not g.mig]
    return fitting[:req.gpu.count] if len(fitting) >= req.gpu.count else None


def _needs_unknown(queue: Queue, target: Request,
                   running: list[tuple[float | None, Request, list[str]]], free_cpu: int,
                   free_mem: int, free_gpus: set[str]) -> bool:
    """Whether even every job with a known end ending would not let the target start."""
    cpu, mem, gpus = free_cpu, free_mem, set(free_gpus)
    for end, req, held in running:
        if end is not None:
            cpu, mem = cpu + req.cpu_m, mem + req.memory
            gpus |= set(held)
    return not (target.cpu_m <= cpu and target.memory <= mem
                and _pick(queue, target, gpus) is not None)
