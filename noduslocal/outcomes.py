"""An attempt as the supervisor holds it, and what its end means for the job: the next
phase and reason for an exit, a lost shim, an attempt that never started, or a stop we
asked for; retries are spent here and only here.
"""

from __future__ import annotations

import asyncio
import signal
from dataclasses import dataclass, field
from pathlib import Path

from noduslocal.gpu.cost import Meter
from noduslocal.models import JobRecord
from noduslocal.runtime.attempts import Alive, AttemptState, Exited, NeverStarted, Vanished, inspect
from noduslocal.scheduler.queue import Request
from noduslocal.states import AttemptPhase, Phase, Reason
from noduslocal.store.jobs import Outcome


@dataclass
class Attempt:
    """A job that holds resources: being launched, running, or being stopped."""

    job: JobRecord
    request: Request
    number: int = 0
    directory: Path | None = None
    started: asyncio.Future[int] | None = None  # the start commit; resolves to `number`
    running: bool = False  # a shim was started (the attempt row says Running)
    shim_pid: int | None = None
    boot_id: str | None = None
    container_id: str | None = None
    ended: asyncio.Future[AttemptState] | None = None  # a container's end, from its runtime
    gpus: list[str] = field(default_factory=list)  # UUIDs of the GPUs it holds
    lost: str | None = None  # why the daemon ended it as lost (a GPU broke under it)
    meter: Meter | None = None  # what its GPUs cost so far
    stop_reason: str | None = None
    # Whether the stop's SIGTERM reached the job: False while it has not (a job that ends on
    # its own meanwhile was not stopped), None when unknown (adopted after a restart).
    stop_sent: bool | None = None
    timers: list[asyncio.TimerHandle] = field(default_factory=list)
    retry_stop: asyncio.Task[None] | None = None  # a container stop waiting for dockerd
    task: asyncio.Task[None] | None = None


# Stops that put the job aside rather than end it: its phase next, and why.
PAUSES: dict[str, tuple[Phase, str]] = {
    Reason.SUSPENDED: (Phase.SUSPENDED, "suspended on request; `job resume` queues it again"),
    Reason.PREEMPTED: (Phase.PENDING, "preempted for a job that was waiting; queued again, "
                                      "no retry spent"),
}


def overrides(new: str, current: str) -> bool:
    """Whether a stop asked for now replaces one under way (the first otherwise wins): a
    cancel ends a suspend or a preemption, and a suspend keeps a preempted job aside."""
    return ((new == Reason.CANCELLED and current in PAUSES)
            or (new == Reason.SUSPENDED and current == Reason.PREEMPTED))


def outcome_of(state: AttemptState, attempt: Attempt) -> Outcome:
    job, stop = attempt.job, attempt.stop_reason
    if isinstance(state, Exited) and attempt.stop_sent is False:
        stop = None  # it ended before our signal reached it: as it ended, not as we asked
    if isinstance(state, NeverStarted) and attempt.running:
        state = Vanished()  # a shim was started: whether the job ran, nobody knows
    if isinstance(state, Exited):
        code, sig = state.exit_code, state.signal
        if stop in PAUSES:
            phase, message = PAUSES[stop]
            return Outcome(AttemptPhase.EXITED, phase, stop, message, code, sig)
        if stop == Reason.CANCELLED:
            return Outcome(AttemptPhase.EXITED, Phase.CANCELLED, Reason.CANCELLED,
                               "cancelled on request", code, sig)
        if stop == Reason.MAX_COST_EXCEEDED:
            return Outcome(AttemptPhase.EXITED, Phase.FAILED, Reason.MAX_COST_EXCEEDED,
                           f"stopped: it cost more than its max_cost of {job.spec.max_cost:g}",
                           code, sig)
        if stop == Reason.TIMEOUT:
            return Outcome(AttemptPhase.EXITED, Phase.FAILED, Reason.TIMEOUT,
                               f"stopped after its timeout of {job.spec.timeout:g}s", code, sig)
        if state.oom_killed:
            limit = job.spec.memory
            return Outcome(AttemptPhase.EXITED, Phase.FAILED, Reason.OOM_KILLED,
                           "killed by the kernel: out of memory" + (
                               f" (limit {limit / 2**20:.0f} MiB)" if limit else ""), code, sig)
        if state.oom_killed is None:
            return Outcome(AttemptPhase.EXITED, Phase.FAILED, Reason.OOM_KILLED,
                           f"killed (exit status {code}), likely OOM: docker did not report "
                           "it, and nobody here sent the kill", code, sig)
        if code == 0:
            return Outcome(AttemptPhase.EXITED, Phase.SUCCEEDED, Reason.COMPLETED, None, 0)
        if sig is not None:
            return Outcome(AttemptPhase.EXITED, Phase.FAILED, Reason.SIGNALED,
                               f"killed by signal {sig} ({signal.Signals(sig).name})", code, sig)
        return Outcome(AttemptPhase.EXITED, Phase.FAILED, Reason.ERROR,
                           f"exited with code {code}", code)
    if isinstance(state, NeverStarted):
        if stop in PAUSES:
            return Outcome(AttemptPhase.NOT_STARTED, PAUSES[stop][0], stop, PAUSES[stop][1])
        if stop is not None:
            return Outcome(AttemptPhase.NOT_STARTED, Phase.CANCELLED, Reason.CANCELLED,
                               "cancelled before it started")
        return Outcome(AttemptPhase.NOT_STARTED, Phase.PENDING, Reason.REQUEUED,
                       f"{state.detail or 'the daemon stopped before the process ran'}; "
                       "queued again")
    if stop is not None:  # vanished while we were stopping it: that is what we asked for
        phase = (PAUSES[stop][0] if stop in PAUSES
                 else Phase.CANCELLED if stop == Reason.CANCELLED else Phase.FAILED)
        return Outcome(AttemptPhase.LOST, phase, stop, "stopped; no exit status recorded")
    why = (state.detail if isinstance(state, Vanished) else None) or "no exit status"
    if job.retries_used < job.spec.retries:
        left = job.spec.retries - job.retries_used - 1
        return Outcome(AttemptPhase.LOST, Phase.PENDING, Reason.LOST,
                       f"attempt {attempt.number} lost ({why}); retrying, "
                       f"{left} retr{'y' if left == 1 else 'ies'} left", spend_retry=True)
    return Outcome(AttemptPhase.LOST, Phase.FAILED, Reason.LOST,
                   f"attempt {attempt.number} lost ({why}) and no retries left")


async def settled_inspect(directory: Path) -> AttemptState:
    """inspect(), waiting out a shim that holds its lock but has not written pid.json yet
    (it does so right after starting the job)."""
    state = inspect(directory)
    for _ in range(500):
        if not (isinstance(state, Alive) and state.shim_pid == 0):
            break
        await asyncio.sleep(0.01)
        state = inspect(directory)
    return state
