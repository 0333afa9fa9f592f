"""Queue order and admission against the host's CPU and memory: pure logic, no I/O.

Jobs start in submission order. When the job at the head does not fit, nothing behind it
starts (no backfill without an expected duration), so a large request is never starved by
a stream of small ones; each waiting job gets a hold that says why in words.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from noduslocal.gpu.request import GpuRequest
from noduslocal.scheduler.gpus import GpuPool
from noduslocal.units import fmt_bytes


@dataclass(frozen=True)
class Request:
    job_id: int  # also the submission order
    cpu_m: int
    memory: int
    runtime: str = "process"  # "docker" for container jobs
    gpu: GpuRequest | None = None


@dataclass
class Capacity:
    cpu_m: int
    memory: int
    used_cpu_m: int = 0
    used_memory: int = 0

    gpus: GpuPool | None = None

    def fits(self, req: Request) -> bool:
        return (self.used_cpu_m + req.cpu_m <= self.cpu_m
                and self.used_memory + req.memory <= self.memory
                and (req.gpu is None or (self.gpus is not None
                                         and self.gpus.pick(req.gpu) is not None)))

    def take(self, req: Request, gpus: list[str] | None = None) -> None:
        """Take the request's share; its GPUs are `gpus` (a running attempt's, after a
        restart) or the best free set."""
        self.used_cpu_m += req.cpu_m
        self.used_memory += req.memory
        if req.gpu is not None and self.gpus is not None:
            if gpus is None:
                picked = self.gpus.pick(req.gpu)
                assert picked is not None, "take() without fits()"
                gpus = [g.uuid for g in picked]
            self.gpus.take(req.job_id, gpus)

    def give(self, req: Request) -> None:
        self.used_cpu_m -= req.cpu_m
        self.used_memory -= req.memory
        if self.gpus is not None:
            self.gpus.give(req.job_id)

    def refusal(self, req: Request) -> str | None:
        """Why a request can never run on this host, or None."""
        if req.gpu is not None:
            if self.gpus is None:
                return f"gpu: {req.gpu.describe()} requested; this host has no GPUs"
            if (why := self.gpus.refusal(req.gpu)) is not None:
                return why
        if req.cpu_m > self.cpu_m:
            return (f"cpu: {fmt_cpu(req.cpu_m)} CPUs requested, this host runs at most "
                    f"{fmt_cpu(self.cpu_m)}")
        if req.memory > self.memory:
            return (f"memory: {fmt_bytes(req.memory)} requested, this host has "
                    f"{fmt_bytes(self.memory)}")
        return None


@dataclass
class Queue:
    """Pending requests in submission order, and the holds of the last pass."""

    capacity: Capacity
    _order: list[int] = field(default_factory=list)
    _requests: dict[int, Request] = field(default_factory=dict)
    holds: dict[int, str] = field(default_factory=dict)
    # Runtimes that cannot start anything now, with the reason: their jobs keep their place
    # but do not hold up the jobs behind them (e.g. "docker": "dockerd unreachable: ...").
    blocked: dict[str, str] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self._order)

    def __contains__(self, job_id: int) -> bool:
        return job_id in self._requests

    def push(self, req: Request) -> None:
        if req.job_id in self._requests:
            return
        self._requests[req.job_id] = req
        if not self._order or self._order[-1] < req.job_id:
            self._order.append(req.job_id)
        else:  # a requeued job keeps its place
            bisect.insort(self._order, req.job_id)

    def remove(self, job_id: int) -> Request | None:
        req = self._requests.pop(job_id, None)
        if req is not None:
            index = bisect.bisect_left(self._order, job_id)
            del self._order[index]
            self.holds.pop(job_id, None)
        return req

    def schedule(self) -> list[Request]:
        """Take every request that may start now, in order; set holds for the rest."""
        started: list[Request] = []
        cap = self.capacity
        head: Request | None = None
        skipped = 0
        for job_id in self._order:
            req = self._requests[job_id]
            if req.runtime in self.blocked:
                skipped += 1
                continue
            if cap.fits(req):
                cap.take(req)
                started.append(req)
                continue
            head = req
            break
        if skipped:
            ids = {req.job_id for req in started}
            self._order = [job_id for job_id in self._order if job_id not in ids]
        else:
            del self._order[:len(started)]
        for req in started:
            del self._requests[req.job_id]
            self.holds.pop(req.job_id, None)
        # Only the head's hold is computed each pass; the rest are derived on read.
        self.holds = {} if head is None else {head.job_id: self._head_hold(head)}
        return started

    def hold(self, job_id: int) -> str | None:
        if job_id not in self._requests:
            return None
        if job_id in self.holds:
            return self.holds[job_id]
        if (why := self.blocked.get(self._requests[job_id].runtime)) is not None:
            return why
        ahead = bisect.bisect_left(self._order, job_id)
        if ahead == 0:
            return "waiting for the scheduler"  # queued since the last pass
        return f"queued behind {ahead} job{'s' if ahead != 1 else ''}"

    def _head_hold(self, req: Request) -> str:
        cap = self.capacity
        if req.gpu is not None and cap.gpus is not None and cap.gpus.pick(req.gpu) is None:
            return cap.gpus.hold(req.gpu)
        free_cpu = cap.cpu_m - cap.used_cpu_m
        free_mem = cap.memory - cap.used_memory
        if req.cpu_m > free_cpu:
            unit = "CPU" if req.cpu_m == 1000 else "CPUs"
            return f"needs {fmt_cpu(req.cpu_m)} {unit}, {fmt_cpu(max(free_cpu, 0))} free"
        return f"needs {fmt_bytes(req.memory)} memory, {fmt_bytes(max(free_mem, 0))} free"


def fmt_cpu(millis: int) -> str:
    return f"{millis // 1000}" if millis % 1000 == 0 else f"{millis / 1000:g}"
