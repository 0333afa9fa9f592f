"""Jobs bound for a cluster region (Slurm) wait here, never in this box's queue: the
cluster's own scheduler and fair share decide when they run, so nothing of this box's
capacity holds them back. One lane per region and user, each with the region's cap on jobs
submitted at once, served in turn, so one user's thousand jobs never hold up another's.
"""

from __future__ import annotations

import heapq
from collections import Counter, deque
from collections.abc import Callable

Lane = tuple[str, int]  # (region, owner uid)


class ClusterLanes:
    def __init__(self, cap: Callable[[str], int | None],
                 held: Callable[[int], str | None] = lambda uid: None) -> None:
        """`cap(region)`: the most jobs one user may have submitted there at once (read
        each pass: a reloaded config applies at the next); None: the region is no longer
        configured, and its jobs wait until it is again. `held(uid)`: why an admin holds
        that user's queue (`admin hold`), or None; a held user's jobs are not submitted."""
        self._cap = cap
        self._held_user = held
        self._waiting: dict[Lane, list[tuple[int, int]]] = {}  # heap of (-priority, id)
        self._turns: deque[Lane] = deque()  # lanes with waiting jobs, the next one first
        self._submitted: Counter[Lane] = Counter()
        self._lane_of: dict[int, Lane] = {}  # waiting jobs
        self._held: dict[int, Lane] = {}  # submitted jobs

    def push(self, job_id: int, region: str, owner_uid: int, priority: int = 0) -> None:
        if job_id in self._lane_of:  # waits already (as the local queue's add)
            return
        lane = (region, owner_uid)
        if lane not in self._waiting:
            self._waiting[lane] = []
            self._turns.append(lane)
        heapq.heappush(self._waiting[lane], (-priority, job_id))
        self._lane_of[job_id] = lane

    def remove(self, job_id: int) -> bool:
        """Take a waiting job out; False when it does not wait here."""
        lane = self._lane_of.pop(job_id, None)
        if lane is None:
            return False
        heap = self._waiting[lane]
        heap[:] = [entry for entry in heap if entry[1] != job_id]
        heapq.heapify(heap)
        if not heap:
            self._drop(lane)
        return True

    def _drop(self, lane: Lane) -> None:
        del self._waiting[lane]
        self._turns.remove(lane)

    def take(self) -> list[int]:
        """The jobs to submit now, one lane after another, each counted as submitted."""
        taken: list[int] = []
        blocked: set[Lane] = set()
        while self._turns and len(blocked) < len(self._turns):
            lane = self._turns[0]
            self._turns.rotate(-1)
            cap = self._cap(lane[0])
            if (lane in blocked or cap is None or self._submitted[lane] >= cap
                    or self._held_user(lane[1]) is not None):
                blocked.add(lane)
                continue
            _, job_id = heapq.heappop(self._waiting[lane])
            del self._lane_of[job_id]
            self.hold(job_id, *lane)
            taken.append(job_id)
            if not self._waiting[lane]:
                self._drop(lane)
        return taken

    def hold(self, job_id: int, region: str, owner_uid: int) -> None:
        """A job submitted (now, or before a restart) counts against its lane's cap."""
        lane = (region, owner_uid)
        self._held[job_id] = lane
        self._submitted[lane] += 1

    def give(self, job_id: int) -> None:
        """A submitted job's attempt ended: its place in the lane is free."""
        lane = self._held.pop(job_id, None)
        if lane is not None:
            self._submitted[lane] -= 1
            if not self._submitted[lane]:
                del self._submitted[lane]

    def reprioritize(self, job_id: int, priority: int) -> None:
        """A waiting job's new priority: its place in its lane (other lanes are not its)."""
        lane = self._lane_of.get(job_id)
        if lane is not None:
            self.remove(job_id)
            self.push(job_id, lane[0], lane[1], priority)

    def waits(self, job_id: int) -> bool:
        return job_id in self._lane_of

    def wait_reason(self, job_id: int) -> str | None:
        lane = self._lane_of.get(job_id)
        if lane is None:
            return None
        cap = self._cap(lane[0])
        if cap is None:
            return f"region {lane[0]!r} is not configured any more; it waits until it is"
        if (held := self._held_user(lane[1])) is not None:
            return held
        if self._submitted[lane] >= cap:
            return (f"{self._submitted[lane]} of your jobs are submitted to region "
                    f"{lane[0]!r}, the most one user may (max_submitted_per_user = {cap})")
        return f"being submitted to region {lane[0]!r}"
