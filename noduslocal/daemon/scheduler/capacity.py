"""What the host has and what running jobs hold of it: CPUs, memory, GPUs (through the
GPU pool), and per user the jobs and GPUs they run and when those are expected to end.
Pure logic, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from noduslocal.daemon.scheduler.gpus import GpuPool
from noduslocal.domain.gpu_request import GpuRequest
from noduslocal.domain.units import fmt_bytes


@dataclass(frozen=True)
class Request:
    job_id: int  # also the submission order
    cpu_m: int
    memory: int
    runtime: str = "process"  # the kind of runtime (JobSpec.runtime)
    gpu: GpuRequest | None = None
    owner_uid: int = 0
    priority: int = 0  # higher first
    expected: float | None = None  # seconds it expects to run (expected_duration)
    interruptible: bool = False  # may be stopped and queued again for a job that waits
    disk: int = 0  # bytes of the data dir's disk it reserves while it runs
    ranks: int = 1  # a gang's: its GPUs are split among them

    @classmethod
    def of(cls, job_id: int, spec: Any, owner_uid: int) -> Request:
        """What a job (its JobSpec) asks of the host: a gang's CPUs and memory are its
        ranks' together, an indexed job's those of `parallelism` indexes (its GPU request
        is already the whole)."""
        ranks = (spec.gang.nodes if spec.gang is not None
                 else spec.indexed.parallelism if spec.indexed is not None else 1)
        return cls(job_id, spec.cpu_m * ranks, (spec.memory or 0) * ranks,
                   spec.runtime, spec.gpu, owner_uid,
                   spec.priority, spec.expected_duration, spec.interruptible,
                   spec.disk or 0, ranks)

    @property
    def gpu_count(self) -> int:
        return self.gpu.count if self.gpu is not None else 0


@dataclass
class Capacity:
    cpu_m: int
    memory: int
    used_cpu_m: int = 0
    used_memory: int = 0
    # The data dir's free bytes above its reserve at the last reading (None: not read yet),
    # and what running jobs reserved of it with `disk`: a job's own files count as used
    # space and as its reservation until it ends, so this errs on the safe side.
    disk_free: int | None = None
    used_disk: int = 0

    gpus: GpuPool | None = None
    # job id -> (request, expected end or None); per uid: [running jobs, GPUs held]
    running: dict[int, tuple[Request, float | None]] = field(default_factory=dict)
    started: dict[int, float] = field(default_factory=dict)  # job id -> when it took its share
    by_user: dict[int, list[int]] = field(default_factory=dict)

    def disk_left(self) -> int | None:
        return None if self.disk_free is None else self.disk_free - self.used_disk

    def fits(self, req: Request) -> bool:
        left = self.disk_left()
        return (self.used_cpu_m + req.cpu_m <= self.cpu_m
                and self.used_memory + req.memory <= self.memory
                and (not req.disk or left is None or req.disk <= left)
                and (req.gpu is None or (self.gpus is not None
                                         and self.gpus.pick(req.gpu) is not None)))

    def take(self, req: Request, gpus: list[str] | None = None,
             started_at: float | None = None) -> None:
        """Take the request's share; its GPUs are `gpus` (a running attempt's, after a
        restart) or the best free set."""
        self.used_cpu_m += req.cpu_m
        self.used_memory += req.memory
        self.used_disk += req.disk
        end = (started_at + req.expected
               if started_at is not None and req.expected is not None else None)
        self.running[req.job_id] = (req, end)
        if started_at is not None:
            self.started[req.job_id] = started_at
        held = self.by_user.setdefault(req.owner_uid, [0, 0])
        held[0] += 1
        held[1] += req.gpu_count
        if req.gpu is not None and self.gpus is not None:
            if gpus is None:
                picked = self.gpus.pick_ranks(req.gpu, req.ranks)
                assert picked is not None, "take() without fits()"
                gpus = [g.uuid for g in picked]
            self.gpus.take(req.job_id, gpus)

    def give(self, req: Request) -> None:
        self.used_cpu_m -= req.cpu_m
        self.used_memory -= req.memory
        self.used_disk -= req.disk
        self.started.pop(req.job_id, None)
        if self.running.pop(req.job_id, None) is not None:
            held = self.by_user[req.owner_uid]
            held[0] -= 1
            held[1] -= req.gpu_count
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

    def disk_refusal(self, req: Request) -> str | None:
        """Why a new job's `disk` cannot be had: more than the disk has free above its
        reserve now (a job that ends keeps its files, so waiting would not help)."""
        if req.disk and self.disk_free is not None and req.disk > self.disk_free:
            return (f"disk: {fmt_bytes(req.disk)} requested; the daemon's disk has "
                    f"{fmt_bytes(max(self.disk_free, 0))} free above its reserve")
        return None


def fmt_cpu(millis: int) -> str:
    return f"{millis // 1000}" if millis % 1000 == 0 else f"{millis / 1000:g}"
