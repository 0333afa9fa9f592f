"""When a pending job should start: a simulation of the queue from now, where running jobs
end at their expected ends and started ones run for their expected_duration. Pure logic;
None with the reason when the answer depends on a job that has no expected duration.
"""

from __future__ import annotations

from dataclasses import dataclass

from noduslocal.scheduler.queue import Queue, Request

MAX_STEPS = 10_000


@dataclass(frozen=True)
class StartEstimate:
    at: float | None
    why: str  # how it was found, or why it cannot be


def estimate_start(queue: Queue, job_id: int, now: float) -> StartEstimate:
    cap = queue.capacity
    pool = cap.gpus
    free_cpu, free_mem = cap.cpu_m - cap.used_cpu_m, cap.memory - cap.used_memory
    free_gpus = ({g.uuid for g in pool.inventory.gpus
                  if g.uuid not in pool.holder and pool.busy(g) is None}
                 if pool is not None else set())
    # (end or None, request, its GPUs) of everything running, soonest end first
    running = [(end, req, list(pool.by_job.get(job_id_, [])) if pool else [])
               for job_id_, (req, end) in cap.running.items()]
    pending = [r for r in queue.order() if r.runtime not in queue.blocked]
    t = now
    for _ in range(MAX_STEPS):
        for req in list(pending):
            gpus = _pick(queue, req, free_gpus)
            if req.cpu_m <= free_cpu and req.memory <= free_mem and gpus is not None:
                if req.job_id == job_id:
                    return StartEstimate(t, "simulated from the queue and expected ends")
                pending.remove(req)
                free_cpu -= req.cpu_m
                free_mem -= req.memory
                free_gpus -= set(gpus)
                end = t + req.expected if req.expected is not None else None
                running.append((end, req, gpus))
            else:
                break  # in order, as the scheduler (no backfill in the estimate)
        known = [item for item in running if item[0] is not None]
        if not known:
            blocker = next((r for _, r, _ in running), None)
            return StartEstimate(None, "it waits for jobs without an expected duration"
                                 + (f" (job {blocker.job_id})" if blocker else ""))
        nxt = min(known, key=lambda item: item[0] or 0.0)
        if any(item[0] is None for item in running) and _needs_unknown(
                queue, pending, job_id, running, free_cpu, free_mem, free_gpus):
            return StartEstimate(None, "it waits for jobs without an expected duration")
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
               if g.uuid in free and pool.matches(g, req.gpu) and g.healthy]
    return fitting[:req.gpu.count] if len(fitting) >= req.gpu.count else None


def _needs_unknown(queue: Queue, pending: list[Request], job_id: int,
                   running: list[tuple[float | None, Request, list[str]]], free_cpu: int,
                   free_mem: int, free_gpus: set[str]) -> bool:
    """Whether even every job with a known end ending would not let the target start."""
    cpu, mem, gpus = free_cpu, free_mem, set(free_gpus)
    for end, req, held in running:
        if end is not None:
            cpu, mem = cpu + req.cpu_m, mem + req.memory
            gpus |= set(held)
    target = next((r for r in pending if r.job_id == job_id), None)
    if target is None:
        return False
    return not (target.cpu_m <= cpu and target.memory <= mem
                and _pick(queue, target, gpus) is not None)
