"""Whole-GPU allocation: which GPUs are free (healthy, not drained, not held by a job, not
busy with a process the daemon did not start), the best-connected set for a request
(NVLink, then one PCIe switch, then one NUMA node), and why a request waits. Pure logic.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from noduslocal.daemon.gpus.model import Gpu, Inventory
from noduslocal.domain.gpu_request import GpuRequest


@dataclass
class GpuPool:
    inventory: Inventory
    busy_memory: int = 2**30  # bytes used on an unallocated GPU that make it busy
    holder: dict[str, int] = field(default_factory=dict)  # uuid -> job id
    by_job: dict[int, list[str]] = field(default_factory=dict)
    drained: set[str] = field(default_factory=set)
    released: dict[str, float] = field(default_factory=dict)  # uuid -> when a job let go

    def busy(self, gpu: Gpu) -> str | None:
        """Why an unallocated GPU is not free, in words; None when it is."""
        if not gpu.healthy:
            return f"GPU {gpu.index} unhealthy: {gpu.problem or 'unknown'}"
        if gpu.uuid in self.drained:
            return f"GPU {gpu.index} drained"
        if gpu.mig:
            return f"GPU {gpu.index} is in MIG mode (whole GPUs only)"
        if gpu.uuid in self.holder:
            return None
        if self.inventory.read_at and self.inventory.read_at < self.released.get(gpu.uuid, 0):
            return None  # read while our job still ran there: its processes are not foreign
        for proc in gpu.processes:
            held = f"{(proc.used_memory or 0) / 2**30:.0f} GiB" if proc.used_memory else \
                "memory"
            return f"GPU {gpu.index} busy: pid {proc.pid} ({proc.user or '?'}) holds {held}"
        if gpu.memory_used > self.busy_memory:
            return (f"GPU {gpu.index} busy: {gpu.memory_used / 2**30:.1f} GiB used by "
                    "something outside noduslocal")
        return None

    def matches(self, gpu: Gpu, req: GpuRequest) -> bool:
        return ((req.model is None or gpu.model == req.model)
                and (req.min_memory is None or gpu.memory_total >= req.min_memory))

    def free(self, req: GpuRequest) -> list[Gpu]:
        return [g for g in self.inventory.gpus if self.matches(g, req)
                and g.uuid not in self.holder and self.busy(g) is None]

    def refusal(self, req: GpuRequest) -> str | None:
        """Why the request can never run on this box, with what the box has."""
        fitting = [g for g in self.inventory.gpus if self.matches(g, req)]
        if len(fitting) >= req.count:
            return None
        return (f"gpu: {req.describe()} requested; this host has "
                f"{self.inventory.summary()}")

    def pick(self, req: GpuRequest) -> list[Gpu] | None:
        free = self.free(req)
        if len(free) < req.count:
            return None
        if req.count == 1:
            return [free[0]]
        best: tuple[tuple[int, int], list[Gpu]] | None = None
        link = self.inventory.link
        for start in free:
            chosen = [start]
            # Each candidate's worst link to the set so far, kept up to date as it grows.
            worst = {g.index: (link(g.index, start.index), g) for g in free if g is not start}
            while len(chosen) < req.count:
                index = min(worst, key=lambda i: (worst[i][0], i))
                nxt = worst.pop(index)[1]
                chosen.append(nxt)
                for i, (level, g) in worst.items():
                    worst[i] = (max(level, link(i, nxt.index)), g)
            links = [self.inventory.link(a.index, b.index)
                     for i, a in enumerate(chosen) for b in chosen[i + 1:]]
            score = (max(links), sum(links))
            if best is None or score < best[0]:
                best = (score, chosen)
        assert best is not None
        return sorted(best[1], key=lambda g: g.index)

    def pick_ranks(self, req: GpuRequest, ranks: int) -> list[Gpu] | None:
        """The best-connected set for a gang as a whole, ordered so each rank's share
        (`req.count // ranks` in a row) is the best-connected subset of what is left."""
        chosen = self.pick(req)
        if chosen is None or ranks <= 1:
            return chosen
        link, size = self.inventory.link, req.count // ranks
        left, ordered = list(chosen), []
        while left:
            group = [left.pop(0)]
            while len(group) < size:
                nxt = min(left, key=lambda g: (max(link(g.index, m.index) for m in group),
                                               g.index))
                left.remove(nxt)
                group.append(nxt)
            ordered += group
        return ordered

    def take(self, job_id: int, uuids: list[str]) -> None:
        for uuid in uuids:
            self.holder[uuid] = job_id
        self.by_job[job_id] = list(uuids)

    def give(self, job_id: int, now: float | None = None) -> list[str]:
        uuids = self.by_job.pop(job_id, [])
        for uuid in uuids:
            if self.holder.get(uuid) == job_id:
                del self.holder[uuid]
                self.released[uuid] = time.time() if now is None else now
        return uuids

    def possible(self, req: GpuRequest) -> bool:
        """Whether the request could start once the jobs holding GPUs end: enough
        matching GPUs that are healthy and not drained."""
        return sum(1 for g in self.inventory.gpus if self.matches(g, req) and g.healthy
                   and g.uuid not in self.drained and not g.mig) >= req.count

    def wait_reason(self, req: GpuRequest) -> str:
        free = self.free(req)
        why = f"needs {req.describe()}, {len(free)} free"
        reasons = [r for g in self.inventory.gpus if self.matches(g, req)
                   and g.uuid not in self.holder and (r := self.busy(g))]
        return "; ".join([why, *reasons[:2]])
