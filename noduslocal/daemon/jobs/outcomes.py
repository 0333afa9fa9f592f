"""What an attempt's end means for its job: the next phase and reason for an exit, a lost
rank, an attempt that never started, or a stop we asked for; retries are spent here and
only here.
"""

from __future__ import annotations

import signal

from noduslocal.daemon.jobs.attempt import Attempt, AttemptLife
from noduslocal.daemon.runtime.base import (
    AttemptState,
    Exited,
    NeverStarted,
    Preempted,
    Vanished,
)
from noduslocal.daemon.store.job_writes import Outcome
from noduslocal.domain.states import AttemptPhase, Phase, Reason
from noduslocal.domain.units import fmt_bytes

# Stops that put the job aside rather than end it: its phase next, and why.
PAUSES: dict[str, tuple[Phase, str]] = {
    Reason.SUSPENDED: (Phase.SUSPENDED, "suspended on request; `job resume` queues it again"),
    Reason.PREEMPTED: (Phase.PENDING, "preempted for a job that was waiting; queued again, "
                                      "no retry spent"),
}


NOT_RETRIED = frozenset({126, 127})  # cannot execute, not found: a retry cannot help
RETRY_PAUSE_MAX = 60.0
# Seconds before a job whose shim found no room to record it is tried again: the disk
# watch reads the disk every few seconds, and a full disk is not freed in less.
NO_ROOM_PAUSE = 5.0


def retry_pause(retries_used: int) -> float:
    """Seconds before a failed task runs again: 1, 2, 4, ... up to a minute."""
    return min(RETRY_PAUSE_MAX, 2.0 ** retries_used)


def overrides(new: str, current: str) -> bool:
    """Whether a stop asked for now replaces one under way (the first otherwise wins): a
    cancel ends a suspend or a preemption, and a suspend keeps a preempted job aside."""
    return ((new == Reason.CANCELLED and current in PAUSES)
            or (new == Reason.SUSPENDED and current == Reason.PREEMPTED))


def outcome_of(state: AttemptState, attempt: Attempt) -> Outcome:
    job, stop = attempt.job, attempt.stop_reason
    if isinstance(state, Exited) and attempt.life is AttemptLife.STOP_ASKED:
        stop = None  # it ended before our signal reached it: as it ended, not as we asked
    if isinstance(state, NeverStarted) and attempt.launched and not state.certain:
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
        if stop == Reason.DISK_EXCEEDED:
            return Outcome(AttemptPhase.EXITED, Phase.FAILED, Reason.DISK_EXCEEDED,
                           f"stopped: its directory grew past its disk of "
                           f"{fmt_bytes(job.spec.disk or 0)}", code, sig)
        if stop == Reason.DISK_FULL:
            return Outcome(AttemptPhase.EXITED, Phase.FAILED, Reason.DISK_FULL,
                           "stopped: the daemon's disk fell below half its reserve, and this "
                           "job grew most there", code, sig)
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
        if (job.spec.retry_errors and job.retries_used < job.spec.retries
                and code not in NOT_RETRIED):
            left = job.spec.retries - job.retries_used - 1
            return Outcome(AttemptPhase.EXITED, Phase.PENDING, Reason.RETRYING,
                           f"exited with code {code}; retrying in "
                           f"{retry_pause(job.retries_used):g}s, {left} "
                           f"retr{'y' if left == 1 else 'ies'} left", code, sig,
                           spend_retry=True)
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
    if isinstance(state, Preempted) and stop is None:
        return Outcome(AttemptPhase.LOST, Phase.PENDING, Reason.PREEMPTED,
                       f"{state.detail or 'preempted'}; queued again, no retry spent")
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
