"""Job, attempt and sweep phases, the legal transitions between them, and the reasons we
record.

Stdlib only: the daemon's store enforces this table inside each transaction, and the client
and CLI read the terminal sets from here. Nothing else may spell a phase or reason by hand.
"""

from __future__ import annotations

from enum import StrEnum


class Phase(StrEnum):
    PENDING = "Pending"
    STARTING = "Starting"
    RUNNING = "Running"
    SUSPENDED = "Suspended"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    CANCELLED = "Cancelled"


TERMINAL: frozenset[Phase] = frozenset({Phase.SUCCEEDED, Phase.FAILED, Phase.CANCELLED})

# Starting -> Pending: the daemon stopped before the process ran (no retry is spent), or a
# lost attempt with retries left, or an attempt a cluster (Slurm) queued in its own queue:
# the job waits there with its attempt open, and goes Pending -> Running when the cluster
# starts it, Pending -> Pending when the cluster lost it before it ran. Running ->
# Pending: lost box or preemption.
TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    Phase.PENDING: frozenset({Phase.STARTING, Phase.CANCELLED, Phase.FAILED, Phase.SUSPENDED,
                              Phase.RUNNING, Phase.PENDING}),
    Phase.STARTING: frozenset(
        {Phase.RUNNING, Phase.PENDING, Phase.FAILED, Phase.CANCELLED, Phase.SUCCEEDED,
         Phase.SUSPENDED}
    ),
    Phase.RUNNING: frozenset(
        {Phase.SUCCEEDED, Phase.FAILED, Phase.CANCELLED, Phase.PENDING, Phase.SUSPENDED}
    ),
    Phase.SUSPENDED: frozenset({Phase.PENDING, Phase.CANCELLED}),
    Phase.SUCCEEDED: frozenset(),
    Phase.FAILED: frozenset(),
    Phase.CANCELLED: frozenset(),
}


class AttemptPhase(StrEnum):
    STARTING = "Starting"
    RUNNING = "Running"
    EXITED = "Exited"
    LOST = "Lost"
    NOT_STARTED = "NotStarted"


ATTEMPT_ENDED: frozenset[AttemptPhase] = frozenset(
    {AttemptPhase.EXITED, AttemptPhase.LOST, AttemptPhase.NOT_STARTED})

ATTEMPT_TRANSITIONS: dict[AttemptPhase, frozenset[AttemptPhase]] = {
    AttemptPhase.STARTING: frozenset(
        {AttemptPhase.RUNNING, AttemptPhase.EXITED, AttemptPhase.LOST, AttemptPhase.NOT_STARTED}
    ),
    AttemptPhase.RUNNING: frozenset({AttemptPhase.EXITED, AttemptPhase.LOST}),
    AttemptPhase.EXITED: frozenset(),
    AttemptPhase.LOST: frozenset(),
    AttemptPhase.NOT_STARTED: frozenset(),
}


class SweepPhase(StrEnum):
    PENDING = "Pending"
    CANARY = "Canary"  # cell 0 (or the smoke command) runs alone and gates the rest
    RUNNING = "Running"
    SUSPENDED = "Suspended"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    CANCELLED = "Cancelled"


SWEEP_TERMINAL: frozenset[SweepPhase] = frozenset(
    {SweepPhase.SUCCEEDED, SweepPhase.FAILED, SweepPhase.CANCELLED})

# A sweep ends Succeeded, Failed or Cancelled; only a Failed one moves again, when
# `sweep retry` runs its failed cells (the canary first after a canary failure).
SWEEP_TRANSITIONS: dict[SweepPhase, frozenset[SweepPhase]] = {
    SweepPhase.PENDING: frozenset({SweepPhase.CANARY, SweepPhase.RUNNING,
                                   SweepPhase.SUCCEEDED, SweepPhase.FAILED,
                                   SweepPhase.CANCELLED, SweepPhase.SUSPENDED}),
    SweepPhase.CANARY: frozenset({SweepPhase.RUNNING, SweepPhase.FAILED,
                                  SweepPhase.CANCELLED, SweepPhase.SUSPENDED}),
    SweepPhase.RUNNING: frozenset({SweepPhase.SUCCEEDED, SweepPhase.FAILED,
                                   SweepPhase.CANCELLED, SweepPhase.SUSPENDED}),
    # Failed: its canary failed while it was suspended (it ended before the stop landed).
    SweepPhase.SUSPENDED: frozenset({SweepPhase.CANARY, SweepPhase.RUNNING,
                                     SweepPhase.CANCELLED, SweepPhase.FAILED}),
    SweepPhase.SUCCEEDED: frozenset(),
    SweepPhase.FAILED: frozenset({SweepPhase.CANARY, SweepPhase.RUNNING}),
    SweepPhase.CANCELLED: frozenset(),
}


class Reason(StrEnum):
    CREATED = "Created"
    SCHEDULED = "Scheduled"
    STARTED = "Started"
    QUEUED = "Queued"  # submitted to a cluster region's scheduler (Slurm), waiting there
    COMPLETED = "Completed"
    ERROR = "Error"  # non-zero exit status
    SIGNALED = "Signaled"  # killed by a signal nobody here sent
    TIMEOUT = "Timeout"
    CANCELLED = "Cancelled"
    LOST = "Lost"
    REQUEUED = "Requeued"  # the daemon stopped before the process ran; no retry spent
    START_FAILED = "StartFailed"
    UNSCHEDULABLE = "Unschedulable"  # asks for more than this host has
    OOM_KILLED = "OOMKilled"
    MAX_COST_EXCEEDED = "MaxCostExceeded"
    PREEMPTED = "Preempted"
    SUSPENDED = "Suspended"  # on request (job suspend); resumed by job resume
    RESUMED = "Resumed"
    CELLS_FAILED = "CellsFailed"
    CANARY_FAILED = "CanaryFailed"  # cell 0 or the smoke command failed: nothing else ran
    CANARY_PASSED = "CanaryPassed"
    RETRYING = "Retrying"  # a map task exited non-zero and has retries left
    RETRIED = "Retried"  # `sweep retry`: failed cells run again as new jobs
    DISK_FULL = "DiskFull"  # stopped: it grew most on a disk the database needs
    DISK_EXCEEDED = "DiskExceeded"  # stopped: its directory grew past its `disk`
    REMOVED = "Removed"  # `job rm`: out of listings, its name free, its history kept
    COLLECTED = "Collected"  # retention removed its directory and outputs; history stays
    # A job (or sweep) it was to run `after` ended in a way its condition can never accept.
    DEPENDENCY_NEVER_SATISFIED = "DependencyNeverSatisfied"


class IllegalTransition(RuntimeError):
    """A bug: code asked the store for a transition the table forbids."""


def check_transition(current: str, target: str) -> None:
    if Phase(target) not in TRANSITIONS[Phase(current)]:
        raise IllegalTransition(f"job phase {current} -> {target} is not a legal transition")


def check_attempt_transition(current: str, target: str) -> None:
    if AttemptPhase(target) not in ATTEMPT_TRANSITIONS[AttemptPhase(current)]:
        raise IllegalTransition(f"attempt phase {current} -> {target} is not a legal transition")


def check_sweep_transition(current: str, target: str) -> None:
    if SweepPhase(target) not in SWEEP_TRANSITIONS[SweepPhase(current)]:
        raise IllegalTransition(f"sweep phase {current} -> {target} is not a legal transition")
