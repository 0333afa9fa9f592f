"""An attempt as the lifecycle holds it (runtime-neutral: a handle and an end per rank),
and the board of attempts that hold resources, which every part of the lifecycle reads.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from noduslocal.daemon.gpus.cost import Meter
from noduslocal.daemon.runtime.attempts import AttemptState
from noduslocal.daemon.runtime.base import AttemptRef, Handle, failed
from noduslocal.daemon.scheduler.queue import Request
from noduslocal.domain.jobs import JobRecord


@dataclass
class Attempt:
    """A job that holds resources: being launched, running, or being stopped."""

    job: JobRecord
    request: Request
    number: int = 0
    directory: Path | None = None
    started: asyncio.Future[int] | None = None  # the start commit; resolves to `number`
    running: bool = False  # its ranks were launched (the attempt row says Running)
    # One per rank: set at launch or adoption; after a restart, as recorded until then.
    handles: list[Handle] = field(default_factory=list)
    ends: list[asyncio.Future[AttemptState]] = field(default_factory=list)  # each rank's
    gpus: list[str] = field(default_factory=list)  # UUIDs of the GPUs it holds
    lost: str | None = None  # why the daemon ended it as lost (a GPU broke under it)
    meter: Meter | None = None  # what its GPUs cost so far
    stop_reason: str | None = None
    # Whether the stop's SIGTERM reached the job: False while it has not (a job that ends on
    # its own meanwhile was not stopped), None when unknown (adopted after a restart).
    stop_sent: bool | None = None
    timers: list[asyncio.TimerHandle] = field(default_factory=list)
    retry_stop: asyncio.Task[None] | None = None  # a stop waiting for its runtime
    metrics: dict[str, float] = field(default_factory=dict)  # what it reported so far
    rank_dirs: dict[int, str] = field(default_factory=dict)  # see AttemptRef.rank_dirs
    task: asyncio.Task[None] | None = None

    @property
    def ref(self) -> AttemptRef:
        assert self.directory is not None, "the attempt has no directory yet"
        return AttemptRef(self.job, self.number, self.directory, self.rank_dirs)

    @property
    def ended(self) -> bool:
        """Every rank it launched has ended (the end may not be recorded yet)."""
        return bool(self.ends) and all(end.done() for end in self.ends)


class Board:
    """The attempts that hold resources, by job id; the jobs whose end is being recorded
    right now (a future that resolves once it is committed); and the jobs whose runner
    still uses their directory after letting go of the resources (retention waits)."""

    def __init__(self) -> None:
        self.active: dict[int, Attempt] = {}
        self.finishing: dict[int, asyncio.Future[None]] = {}
        self.settling: Counter[int] = Counter()  # by job id: runners still in their tail

    def occupies(self, attempt: Attempt) -> bool:
        return self.active.get(attempt.job.id) is attempt

    def job_name(self, job_id: int) -> str | None:
        attempt = self.active.get(job_id)
        return attempt.job.name if attempt is not None else None

    def running_job(self, job_id: int) -> JobRecord | None:
        attempt = self.active.get(job_id)
        return attempt.job if attempt is not None else None


async def verdict(attempt: Attempt, stop_the_rest: Callable[[], Awaitable[None]]) -> AttemptState:
    """Wait for every rank's end. The first that ends the gang (a rank that failed; for
    Ray-like launchers, rank 0 in any way) stops the rest and is the attempt's end; ends
    that follow from that stop do not count. With none such, rank 0's exit is."""
    gang = attempt.job.spec.gang
    rank_of = {end: rank for rank, end in enumerate(attempt.ends)}
    pending, decider = set(rank_of), None
    while pending:
        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        for end in sorted(done, key=rank_of.__getitem__):
            state = end.result()
            head = rank_of[end] == 0 and gang is not None and gang.ranks_wait_for_head
            if decider is None and (failed(state) or head):
                decider = state
                if pending:
                    await stop_the_rest()
    return decider if decider is not None else attempt.ends[0].result()
