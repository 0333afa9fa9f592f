"""The transition table: terminal phases are final, every phase is reachable, and the
checks fail loudly on anything the table does not allow."""

from __future__ import annotations

import pytest

from noduslocal.domain.states import (
    ATTEMPT_TRANSITIONS,
    TERMINAL,
    TRANSITIONS,
    AttemptPhase,
    IllegalTransition,
    Phase,
    check_attempt_transition,
    check_transition,
)


def test_every_phase_has_a_row() -> None:
    assert set(TRANSITIONS) == set(Phase)
    assert set(ATTEMPT_TRANSITIONS) == set(AttemptPhase)


@pytest.mark.parametrize("terminal", sorted(TERMINAL))
def test_terminal_phases_never_change(terminal: Phase) -> None:
    assert TRANSITIONS[terminal] == frozenset()
    for target in Phase:
        with pytest.raises(IllegalTransition):
            check_transition(terminal, target)


def test_every_phase_is_reachable_from_pending() -> None:
    seen, todo = {Phase.PENDING}, [Phase.PENDING]
    while todo:
        for nxt in TRANSITIONS[todo.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    assert seen == set(Phase)


@pytest.mark.parametrize(("src", "dst"), [
    (Phase.PENDING, Phase.SUCCEEDED),
    (Phase.SUSPENDED, Phase.RUNNING), (Phase.RUNNING, Phase.STARTING),
])
def test_shortcuts_are_refused(src: Phase, dst: Phase) -> None:
    with pytest.raises(IllegalTransition, match=f"{src.value} -> {dst.value}"):
        check_transition(src, dst)


def test_design_transitions_are_allowed() -> None:
    for src, dst in [(Phase.PENDING, Phase.STARTING), (Phase.STARTING, Phase.RUNNING),
                     (Phase.RUNNING, Phase.SUCCEEDED), (Phase.RUNNING, Phase.FAILED),
                     (Phase.RUNNING, Phase.CANCELLED), (Phase.RUNNING, Phase.SUSPENDED),
                     (Phase.SUSPENDED, Phase.PENDING), (Phase.RUNNING, Phase.PENDING),
                     # A job a cluster (Slurm) queued: started there, or lost there first.
                     (Phase.PENDING, Phase.RUNNING), (Phase.PENDING, Phase.PENDING)]:
        check_transition(src, dst)


def test_attempt_ends_are_final() -> None:
    for end in (AttemptPhase.EXITED, AttemptPhase.LOST, AttemptPhase.NOT_STARTED):
        with pytest.raises(IllegalTransition):
            check_attempt_transition(end, AttemptPhase.RUNNING)
    check_attempt_transition(AttemptPhase.STARTING, AttemptPhase.RUNNING)
