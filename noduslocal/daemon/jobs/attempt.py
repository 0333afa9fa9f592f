"""An attempt as the lifecycle holds it (runtime-neutral: a handle and an end per rank),
its life (launched or not, and how far a stop has got) with the moves it allows, and the
board of attempts that hold resources, which every part of the lifecycle reads.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from noduslocal.daemon.gpus.cost import Meter
from noduslocal.daemon.runtime.base import AttemptRef, AttemptState, Handle, failed
from noduslocal.daemon.scheduler.queue import Request
from noduslocal.domain.jobs import JobRecord
from noduslocal.domain.states import IllegalTransition


class AttemptLife(StrEnum):
    """Where an attempt is between its start and its end. Its end is not a life of its
    own: it is its ranks' futures (`Attempt.ended`), and how the end reads still depends
    on whether it was launched and how far its stop got."""

    STARTING = "Starting"  # its start is queued for commit; no rank launched yet
    RUNNING = "Running"  # its ranks were launched (the attempt row says Running); no stop
    # A stop asked before its ranks were launched (or, after a restart, recorded so): they
    # are stopped as they come, and however they end, that end is the stop's.
    STOP_DUE = "StopDue"
    # Launched; a stop asked whose SIGTERM has not reached it yet: an exit meanwhile is
    # the job's own, not the stop's.
    STOP_ASKED = "StopAsked"
    # Launched; the stop's signal reached it (or, adopted after a restart, may have): its
    # end is the stop's.
    STOPPING = "Stopping"


LAUNCHED: frozenset[AttemptLife] = frozenset(
    {AttemptLife.RUNNING, AttemptLife.STOP_ASKED, AttemptLife.STOPPING})

# A stop is never taken back, and a launched attempt is never unlaunched; a second stop
# (a cancel over a suspend) changes its reason, not its life.
LIFE_TRANSITIONS: dict[AttemptLife, frozenset[AttemptLife]] = {
    AttemptLife.STARTING: frozenset({AttemptLife.RUNNING, AttemptLife.STOP_DUE}),
    AttemptLife.RUNNING: frozenset({AttemptLife.STOP_ASKED}),
    AttemptLife.STOP_DUE: frozenset({AttemptLife.STOPPING}),
    AttemptLife.STOP_ASKED: frozenset({AttemptLife.STOPPING}),
    AttemptLife.STOPPING: frozenset(),
}


def check_life_transition(current: AttemptLife, target: AttemptLife) -> None:
    if target not in LIFE_TRANSITIONS[current]:
        raise IllegalTransition(f"attempt life {current} -> {target} is not a legal transition")


def recorded_life(running: bool, stopping: bool) -> AttemptLife:
    """The life of an attempt read back after a restart: whether its row says Running, and
    whether a stop was recorded (whether its signal went out is not known: it counts)."""
    if running:
        return AttemptLife.STOPPING if stopping else AttemptLife.RUNNING
    return AttemptLife.STOP_DUE if stopping else AttemptLife.STARTING


@dataclass
class Attempt:
    """A job that holds resources: being launched, running, or being stopped."""

    job: JobRecord
    request: Request
    number: int = 0
    directory: Path | None = None
    started: asyncio.Future[int] | None = None  # the start commit; resolves to `number`
    running: asyncio.Future[Any] | None = None  # its Running's commit (lazy), once queued
    running_at: float = 0.0  # when that Running says it started
    # Why an attempt launched before its start's commit (armed) has no start recorded,
    # which never happens unless that commit fails; None: recorded, or not yet known.
    unrecorded: str | None = None
    life: AttemptLife = AttemptLife.STARTING  # moved by the methods below only
    # One per rank: set at launch or adoption; after a restart, as recorded until then.
    handles: list[Handle] = field(default_factory=list)
    ends: list[asyncio.Future[AttemptState]] = field(default_factory=list)  # each rank's
    gpus: list[str] = field(default_factory=list)  # UUIDs of the GPUs it holds
    lost: str | None = None  # why the daemon ended it as lost (a GPU broke under it)
    meter: Meter | None = None  # what its GPUs cost so far
    stop_reason: str | None = None  # set with the life's first stop; a later one may replace it
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

    @property
    def launched(self) -> bool:
        """Its ranks were launched (the attempt row says Running), stopped or not."""
        return self.life in LAUNCHED

    def _become(self, life: AttemptLife) -> None:
        check_life_transition(self.life, life)
        self.life = life

    def mark_launched(self) -> None:
        """Its ranks run: launched now, or found running by an adoption (which may have
        known so already). A stop due goes out as they come, and their end is its."""
        if self.life is AttemptLife.STARTING:
            self._become(AttemptLife.RUNNING)
        elif self.life is AttemptLife.STOP_DUE:
            self._become(AttemptLife.STOPPING)

    def ask_stop(self, reason: str) -> bool:
        """A stop for `reason` (the caller decided it may replace one under way); True for
        its first stop, whose signal is still to go out (launched) or due (not yet)."""
        first = self.stop_reason is None
        if first:
            self._become(AttemptLife.STOP_ASKED if self.launched else AttemptLife.STOP_DUE)
        self.stop_reason = reason
        return first

    def stop_landed(self) -> None:
        """Its stop reached it (the SIGTERM was delivered, or it stopped between two
        indexes): from now on its end is the stop's. Without a stop asked, a bug."""
        if self.life not in (AttemptLife.STOP_DUE, AttemptLife.STOPPING):
            self._become(AttemptLife.STOPPING)


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
    if len(attempt.ends) == 1:  # its end is the attempt's (shielded: a cancel is ours)
        return await asyncio.shield(attempt.ends[0])
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
