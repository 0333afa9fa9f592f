"""What the sweep controller knows of each running sweep (its held, released and running
cells, the canary, the state of each of its async looks with the moves it allows), how
many cells a max_cost affords, and why a held cell waits.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum

from noduslocal.domain.jobs import JobRecord
from noduslocal.domain.states import IllegalTransition, SweepPhase
from noduslocal.domain.sweeps import SweepRecord


class SettleLook(StrEnum):
    """The look that works out whether a sweep whose cells were all let go has ended: it
    reads the cells' totals, off the event loop's critical path, one at a time."""

    IDLE = "Idle"  # none under way: the next cell end or resume starts one
    LOOKING = "Looking"  # reading the totals
    AGAIN = "Again"  # ... and a cell's end was committed meanwhile: it reads once more
    ENDING = "Ending"  # every cell ended: the sweep's own end is being committed


SETTLE_TRANSITIONS: dict[SettleLook, frozenset[SettleLook]] = {
    SettleLook.IDLE: frozenset({SettleLook.LOOKING}),
    # Idle: a cell is suspended, or its end is not committed yet; the next one looks again.
    SettleLook.LOOKING: frozenset({SettleLook.AGAIN, SettleLook.IDLE, SettleLook.ENDING}),
    SettleLook.AGAIN: frozenset({SettleLook.LOOKING, SettleLook.ENDING}),
    # Idle from Ending: another transition (a suspend) was committed before the end, which
    # is worked out again once the sweep goes on; once it ended it is out of the controller.
    SettleLook.ENDING: frozenset({SettleLook.IDLE}),
}


class BudgetLook(StrEnum):
    """The look that releases a sweep's cells within its max_cost: it reads what the sweep
    spent before each release, one at a time."""

    IDLE = "Idle"  # none under way: the next release() starts one
    LOOKING = "Looking"  # reading the costs, releasing what they afford
    AGAIN = "Again"  # ... and something changed meanwhile (room, a held cell): once more


BUDGET_TRANSITIONS: dict[BudgetLook, frozenset[BudgetLook]] = {
    BudgetLook.IDLE: frozenset({BudgetLook.LOOKING}),
    BudgetLook.LOOKING: frozenset({BudgetLook.AGAIN, BudgetLook.IDLE}),
    # Idle from Again: the sweep stopped running, or has nothing held, before another look.
    BudgetLook.AGAIN: frozenset({BudgetLook.LOOKING, BudgetLook.IDLE}),
}


def check_settle_transition(current: SettleLook, target: SettleLook) -> None:
    if target not in SETTLE_TRANSITIONS[current]:
        raise IllegalTransition(f"sweep settle look {current} -> {target} is not a legal "
                                "transition")


def check_budget_transition(current: BudgetLook, target: BudgetLook) -> None:
    if target not in BUDGET_TRANSITIONS[current]:
        raise IllegalTransition(f"sweep budget look {current} -> {target} is not a legal "
                                "transition")


class HeldCells:
    """A sweep's cells not released yet, in job-id order (a sweep's cell order), with the
    membership test in constant time: `job list` asks it of every cell it shows, and a
    deque's `in` made a page of a 100,000-cell sweep cost 0.7 s of the event loop."""

    def __init__(self, job_ids: Iterable[int] = ()) -> None:
        self._order = deque(job_ids)
        self._members = set(self._order)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._members

    def __len__(self) -> int:
        return len(self._order)

    def __iter__(self) -> Iterator[int]:
        return iter(self._order)

    def __getitem__(self, index: int) -> int:
        return self._order[index]

    def popleft(self) -> int:
        job_id = self._order.popleft()
        self._members.discard(job_id)
        return job_id

    def insert(self, job_id: int) -> None:
        """Held again (a resume, a withdrawn release): back at its place in the order."""
        if job_id not in self._members:
            bisect.insort(self._order, job_id)
            self._members.add(job_id)

    def remove(self, job_id: int) -> None:
        self._order.remove(job_id)
        self._members.discard(job_id)

    def clear(self) -> None:
        self._order.clear()
        self._members.clear()


@dataclass
class ActiveSweep:
    record: SweepRecord
    held: HeldCells = field(default_factory=HeldCells)  # cells not released, in order
    running: set[int] = field(default_factory=set)  # released cells that have not ended
    canary: int | None = None  # the canary cell's job id while the gate is shut
    ready: dict[int, JobRecord] = field(default_factory=dict)  # held cells, read ahead
    reading: set[int] = field(default_factory=set)  # held cells whose read ahead is under way
    releasing: set[int] = field(default_factory=set)  # released, being read to be queued
    stopping: set[int] = field(default_factory=set)  # running cells a suspend stops
    # Each async look's state, moved by settle_to() and budget_to() only.
    settle: SettleLook = SettleLook.IDLE
    budget: BudgetLook = BudgetLook.IDLE

    def settle_to(self, target: SettleLook) -> None:
        check_settle_transition(self.settle, target)
        self.settle = target

    def budget_to(self, target: BudgetLook) -> None:
        check_budget_transition(self.budget, target)
        self.budget = target


def affordable(spent: float, running: list[float], typical: float, limit: float,
               room: int, held: int) -> int:
    """How many cells may start within `limit`: what was spent, plus each running cell at
    the larger of its cost so far and a typical cell's, plus `typical` for each new one.
    Before any cell has ended (typical 0), only what is spent and running counts."""
    committed = spent + sum(max(cost, typical) for cost in running)
    count = 0
    while (count < min(room, held) and committed < limit
           and committed + typical <= limit):
        count += 1
        committed += typical
    return count


def held_because(active: ActiveSweep, smoke: bool) -> str:
    """Why a held cell of the sweep waits, in words (`smoke`: a smoke command gates it)."""
    name, phase = active.record.name, active.record.phase
    if phase == SweepPhase.SUSPENDED:
        return f"sweep {name} is suspended; `noduslocal sweep resume {name}` releases its cells"
    if phase == SweepPhase.CANARY:
        which = "smoke canary" if smoke else "canary (cell 0)"
        return f"sweep {name}: waiting for its {which} to succeed"
    return (f"sweep {name}: {len(active.running)} of {active.record.max_parallel} cells "
            "running (max_parallel)")
