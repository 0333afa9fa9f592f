"""The queue pass: pending jobs in, attempts out. Holds the jobs that wait, starts what
the queue lets start (its start committed with whatever freed the room), asks for the
preemptions the head needs, and gives an ended attempt's share back. Jobs bound for a
cluster region skip this box's queue: they wait in their lanes (cluster_lanes.py) only for
their user's cap on submitted jobs.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from noduslocal.daemon.gpus.cost import Meter
from noduslocal.daemon.jobs.accounting import GpuAccounting
from noduslocal.daemon.jobs.attempt import Attempt, AttemptLife, Board
from noduslocal.daemon.jobs.background import Background
from noduslocal.daemon.jobs.dependencies import DependencyGate
from noduslocal.daemon.jobs.stops import Stopper
from noduslocal.daemon.scheduler.cluster_lanes import ClusterLanes
from noduslocal.daemon.scheduler.queue import Queue, Request
from noduslocal.daemon.store import Store, job_writes
from noduslocal.domain.jobs import JobRecord
from noduslocal.domain.states import Reason

log = logging.getLogger(__name__)


class Dispatch:
    def __init__(self, store: Store, queue: Queue, board: Board, accounting: GpuAccounting,
                 stopper: Stopper, background: Background,
                 on_start: Callable[[Attempt], None], lanes: ClusterLanes) -> None:
        """`on_start`: runs a new attempt (its start is queued for commit already);
        `lanes`: where jobs of cluster regions wait."""
        self.store = store
        self.queue = queue
        self.lanes = lanes
        self.board = board
        self.accounting = accounting
        self.stopper = stopper
        self.background = background
        self._on_start = on_start
        self.pending: dict[int, JobRecord] = {}
        # Jobs with `after` wait there first, and come back through enqueue once met.
        self.gate = DependencyGate(store, background,
                                   lambda job: self.enqueue(job, judged=True))
        self._later: dict[int, tuple[asyncio.TimerHandle, float]] = {}  # job id -> (timer, due)
        self.ready = False  # set once recovery has given running jobs their share back
        self._scheduled = False  # a kicked pass is queued on the loop
        self._dirty = False  # kicked since the last pass ran

    def enqueue(self, job: JobRecord, judged: bool = False) -> None:
        """Queue a pending job; one with dependencies (`after`) waits in the gate until
        they are met (`judged`: the gate found them met)."""
        if not judged and self.gate.hold(job):
            return
        if job.spec.region is not None:
            self.pending[job.id] = job
            self.lanes.push(job.id, job.spec.region, job.owner_uid, job.spec.priority)
            self.kick()
            return
        request = Request.of(job.id, job.spec, job.owner_uid)
        if (why := self.queue.capacity.refusal(request)) is not None:
            # Admitted by a daemon with more CPUs or memory than this one: it would wait
            # at the head of the queue forever, and everything behind it too.
            self.store.write(lambda c: job_writes.fail_job(
                c, job.id, time.time(), Reason.UNSCHEDULABLE, f"{why} (after a restart)"))
            return
        self.pending[job.id] = job
        self.queue.push(request)
        self.kick()

    def enqueue_later(self, job: JobRecord, delay: float) -> None:
        """Queue the job after `delay` seconds (a failed task's pause before its retry)."""
        timer = asyncio.get_running_loop().call_later(delay, self._due, job)
        self._later[job.id] = (timer, time.time() + delay)

    def _due(self, job: JobRecord) -> None:
        if self._later.pop(job.id, None) is not None and not self.background.closed:
            self.enqueue(job)

    def remove(self, job_id: int) -> bool:
        """Take a pending job out of the queue (or out of its pause before a retry);
        False when it was not waiting there."""
        if (later := self._later.pop(job_id, None)) is not None:
            later[0].cancel()
            return True
        if self.gate.remove(job_id):
            return True
        if self.lanes.remove(job_id):
            self.pending.pop(job_id, None)
            self.kick()
            return True
        if self.queue.remove(job_id) is None:
            return False
        self.pending.pop(job_id, None)
        # What waited behind it (for the GPUs it was first in line for) may start now: a
        # pass, whoever took it out (a cancel, a sweep's suspend).
        self.kick()
        return True

    def retry_hold(self, job_id: int) -> str | None:
        """Why a job waits for its retry's pause, or for its dependencies, or for its lane
        to a cluster, or None."""
        if (why := self.gate.wait_reason(job_id)) is not None:
            return why
        if (later := self._later.get(job_id)) is not None:
            return f"retrying in {max(0.0, later[1] - time.time()):.0f}s"
        return self.lanes.wait_reason(job_id)

    def describe(self) -> list[str]:
        """What waits where, a line each (the daemon's state dump, main.py's SIGUSR1)."""
        cap = self.queue.capacity
        queued = [r.job_id for r in self.queue.last_order() if r.job_id in self.queue]
        return [f"dispatch: pending {sorted(self.pending)[:16]} ({len(self.pending)}), "
                f"later {sorted(self._later)[:16]}, gate {sorted(self.gate.waiting)[:16]}, "
                f"scheduled {self._scheduled}, ready {self.ready}",
                f"queue: {queued[:16]} "
                f"({len(self.queue)}), running "
                f"{sorted(cap.running)[:16]} ({len(cap.running)}), cpu {cap.used_cpu_m}/"
                f"{cap.cpu_m}m, memory {cap.used_memory}/{cap.memory}"]

    def kick(self) -> None:
        """A pass soon, once for everything that changed meanwhile."""
        self._dirty = True
        if not self._scheduled and not self.background.closed:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._kicked)

    def _kicked(self) -> None:
        # A pass run since the kick (an end's, from release()) saw what the kick was for:
        # a sweep's next cell is queued as its last one ends, just before that end's pass,
        # and a second pass found nothing to do at every task (issue 25, part 5).
        self._scheduled = False
        if self._dirty:
            self.run_pass()

    def run_pass(self) -> None:
        if self.background.closed or not self.ready:
            return
        self._dirty = False
        started = self.queue.schedule()
        for job_id in self.queue.preempt:
            victim = self.board.active.get(job_id)
            if victim is not None and victim.life is AttemptLife.RUNNING:  # no stop yet
                self.queue.stopping.add(job_id)
                log.info("preempting job %s (interruptible) for a waiting job",
                         victim.job.name)
                self.stopper.stop_soon(victim, Reason.PREEMPTED)
        gpus = self.queue.capacity.gpus
        for request in started:
            job = self.pending.pop(request.job_id)
            attempt = Attempt(job, request)
            if gpus is not None:
                attempt.gpus = list(gpus.by_job.get(job.id, []))
            if attempt.gpus:
                attempt.meter = Meter.start(attempt.gpus, self.accounting.inventory,
                                            time.time())
            self._start(attempt)
        for job_id in self.lanes.take():
            job = self.pending.pop(job_id)
            self._start(Attempt(job, Request.of(job.id, job.spec, job.owner_uid)))

    def _start(self, attempt: Attempt) -> None:
        self.board.active[attempt.job.id] = attempt
        # Queued now, so it joins the commit of whatever freed the capacity.
        # Volatile on this box: a power loss that lost the start stops what it started.
        attempt.started = self.store.write(
            lambda c, job_id=attempt.job.id, uuids=attempt.gpus: job_writes.start_attempt(
                c, job_id, time.time(), uuids), quick=True,
            volatile=attempt.job.spec.region is None)
        self._on_start(attempt)

    def release(self, attempt: Attempt) -> None:
        """The attempt holds nothing any more: its share goes to the next pass."""
        for timer in attempt.timers:
            timer.cancel()
        if self.board.occupies(attempt):
            del self.board.active[attempt.job.id]
            if attempt.job.spec.region is not None:
                self.lanes.give(attempt.job.id)  # it held none of this box's capacity
            else:
                self.queue.stopping.discard(attempt.job.id)
                self.accounting.charge(attempt.request)
                self.queue.capacity.give(attempt.request)
            self.run_pass()
