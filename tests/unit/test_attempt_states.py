"""An attempt's life as the lifecycle holds it (jobs/attempt.py): the moves its table allows
and the ones it refuses, the life read back after a restart, and what the life means for
how an end reads (outcomes.outcome_of). Pure: no store, no runtime."""

from __future__ import annotations

import itertools

import pytest

from noduslocal.daemon.jobs.attempt import (
    LAUNCHED,
    LIFE_TRANSITIONS,
    Attempt,
    AttemptLife,
    check_life_transition,
    recorded_life,
)
from noduslocal.daemon.jobs.outcomes import outcome_of
from noduslocal.daemon.runtime.base import Exited, NeverStarted, Preempted
from noduslocal.daemon.scheduler.queue import Request
from noduslocal.domain.jobs import JobRecord, JobSpec
from noduslocal.domain.states import AttemptPhase, IllegalTransition, Phase, Reason

Life = AttemptLife


def attempt(life: AttemptLife = Life.STARTING, stop: str | None = None) -> Attempt:
    job = JobRecord(id=1, project="p", name="j", owner_uid=0, owner_gid=0, owner="root",
                    phase="Running", spec=JobSpec(command=["true"]), labels={},
                    created_at=0.0)
    return Attempt(job, Request(1, 1000, 0), number=1, life=life, stop_reason=stop)


def test_the_table_names_every_life_and_only_the_stop_path_moves_on() -> None:
    assert set(LIFE_TRANSITIONS) == set(Life)
    legal = {(a, b) for a, targets in LIFE_TRANSITIONS.items() for b in targets}
    assert legal == {(Life.STARTING, Life.RUNNING), (Life.STARTING, Life.STOP_DUE),
                     (Life.RUNNING, Life.STOP_ASKED), (Life.STOP_DUE, Life.STOPPING),
                     (Life.STOP_ASKED, Life.STOPPING)}
    for current, target in itertools.product(Life, Life):
        if (current, target) in legal:
            check_life_transition(current, target)
        else:
            with pytest.raises(IllegalTransition):
                check_life_transition(current, target)


def test_a_stop_is_never_taken_back_nor_a_launch_undone() -> None:
    for stopped in (Life.STOP_DUE, Life.STOP_ASKED, Life.STOPPING):
        for back in (Life.STARTING, Life.RUNNING):
            with pytest.raises(IllegalTransition):
                check_life_transition(stopped, back)
    for launched in LAUNCHED:
        for back in (Life.STARTING, Life.STOP_DUE):
            with pytest.raises(IllegalTransition):
                check_life_transition(launched, back)


def test_a_first_stop_before_the_launch_is_due_and_the_launch_makes_it_count() -> None:
    a = attempt()
    assert a.ask_stop(Reason.SUSPENDED) is True
    assert (a.life, a.launched) == (Life.STOP_DUE, False)
    a.mark_launched()
    assert (a.life, a.launched) == (Life.STOPPING, True)
    a.stop_landed()  # its SIGTERM lands afterwards: nothing changes, it counted already
    assert a.life is Life.STOPPING


def test_a_first_stop_of_a_launched_attempt_waits_for_its_signal_to_land() -> None:
    a = attempt()
    a.mark_launched()
    assert a.life is Life.RUNNING
    assert a.ask_stop(Reason.SUSPENDED) is True
    assert a.life is Life.STOP_ASKED
    # A cancel over the suspend: the reason changes, the life does not, no second signal.
    assert a.ask_stop(Reason.CANCELLED) is False
    assert (a.life, a.stop_reason) == (Life.STOP_ASKED, Reason.CANCELLED)
    a.stop_landed()
    assert a.life is Life.STOPPING
    a.mark_launched()  # an adoption that finds it running changes nothing
    assert a.life is Life.STOPPING


def test_a_stop_that_lands_without_being_asked_is_a_bug() -> None:
    for life in (Life.STARTING, Life.RUNNING):
        with pytest.raises(IllegalTransition):
            attempt(life).stop_landed()


def test_the_life_read_back_after_a_restart() -> None:
    assert recorded_life(running=False, stopping=False) is Life.STARTING
    assert recorded_life(running=True, stopping=False) is Life.RUNNING
    assert recorded_life(running=False, stopping=True) is Life.STOP_DUE
    # Whether the old daemon's signal went out is not known: the stop counts.
    assert recorded_life(running=True, stopping=True) is Life.STOPPING


def test_an_exit_before_the_stop_signal_landed_is_the_jobs_own() -> None:
    asked = attempt(Life.STOP_ASKED, Reason.CANCELLED)
    assert outcome_of(Exited(0, None, 0.0, 1.0), asked).job_phase == Phase.SUCCEEDED
    landed = attempt(Life.STOPPING, Reason.CANCELLED)
    assert outcome_of(Exited(143, 15, 0.0, 1.0), landed).job_phase == Phase.CANCELLED
    # Adopted after a restart: the old daemon may have sent it.
    adopted = attempt(recorded_life(running=True, stopping=True), Reason.CANCELLED)
    assert outcome_of(Exited(143, 15, 0.0, 1.0), adopted).job_phase == Phase.CANCELLED
    # Stopped before its ranks were launched: however they end, the end is the stop's.
    due = attempt(Life.STOP_DUE, Reason.CANCELLED)
    assert outcome_of(Exited(0, None, 0.0, 1.0), due).job_phase == Phase.CANCELLED


def test_an_attempt_that_never_started_is_lost_once_it_was_launched() -> None:
    starting = outcome_of(NeverStarted(), attempt(Life.STARTING))
    assert (starting.job_phase, starting.reason) == (Phase.PENDING, Reason.REQUEUED)
    launched = outcome_of(NeverStarted(), attempt(Life.RUNNING))
    assert (launched.job_phase, launched.reason) == (Phase.FAILED, Reason.LOST)


def test_a_launched_shim_that_found_no_room_never_started_the_job() -> None:
    """The shim says so itself (its no-room marker): the attempt is NotStarted and the job
    queued again, no retry spent, rather than lost as a shim that vanished would be."""
    refused = outcome_of(NeverStarted("no room", certain=True), attempt(Life.RUNNING))
    assert (refused.attempt_phase, refused.job_phase, refused.reason, refused.spend_retry) == (
        AttemptPhase.NOT_STARTED, Phase.PENDING, Reason.REQUEUED, False)


def test_a_preempted_attempt_runs_again_without_a_retry_unless_it_was_being_stopped() -> None:
    """A cluster's scheduler took the attempt's nodes (Slurm's PREEMPTED): lost, but the
    job is queued again with its retries untouched; a stop we asked for still wins."""
    running = attempt(Life.RUNNING)
    preempted = outcome_of(Preempted("Slurm preempted job 7"), running)
    assert (preempted.attempt_phase, preempted.job_phase, preempted.reason) == (
        AttemptPhase.LOST, Phase.PENDING, Reason.PREEMPTED)
    assert not preempted.spend_retry and "Slurm preempted job 7" in (preempted.message or "")
    stopping = outcome_of(Preempted("Slurm preempted job 7"),
                          attempt(Life.STOP_ASKED, stop=Reason.CANCELLED))
    assert stopping.job_phase == Phase.CANCELLED
