"""The API's one door to jobs: find one (never another owner's by accident), list, create,
what owners ask of a job once it exists (cancel, suspend, resume, remove: OwnerControls),
wait, exec, estimates, the job's live view (why it waits, what it has cost so far, its
ranks and indexes), where its logs are, its workspace and its outputs.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager, suppress
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar

from noduslocal.daemon.accounts import account
from noduslocal.daemon.config.live import LiveSettings
from noduslocal.daemon.events import EventHub, job_topic
from noduslocal.daemon.files.layout import JobLayout
from noduslocal.daemon.jobs import gang_view
from noduslocal.daemon.jobs.accounting import GpuAccounting
from noduslocal.daemon.jobs.admission import Admission
from noduslocal.daemon.jobs.attempt import Board
from noduslocal.daemon.jobs.dispatch import Dispatch
from noduslocal.daemon.jobs.gang_logs import merged_path
from noduslocal.daemon.jobs.indexed_run import (
    attempt_of_index,
    attempts_of_indexes,
    index_dir,
    index_view,
    running_index_launch,
)
from noduslocal.daemon.jobs.runner import AttemptRunner
from noduslocal.daemon.jobs.stops import Stopper
from noduslocal.daemon.runtime.base import ExecResult, Launch, Queued, Runtime, Terminal
from noduslocal.daemon.scheduler.capacity import Request
from noduslocal.daemon.scheduler.estimate import estimate_start
from noduslocal.daemon.scheduler.gang_estimate import gang_topology
from noduslocal.daemon.scheduler.queue import Queue
from noduslocal.daemon.store import Store, job_writes
from noduslocal.domain import errors
from noduslocal.domain.jobs import (
    AttemptRecord,
    CreateRequest,
    Event,
    Handle,
    JobRecord,
    Owner,
)
from noduslocal.domain.states import TERMINAL, Phase, Reason
from noduslocal.domain.timefmt import iso

JobAction = Literal["cancel", "suspend", "resume"]


class Owned(Protocol):
    owner_uid: int
    owner: str


OwnedT = TypeVar("OwnedT", bound=Owned)


def found(kind: str, record: OwnedT | None, project: str, name: str, caller_uid: int,
          implicit: bool) -> OwnedT:
    """The job or sweep looked up by name, or NotFound. `implicit`: the caller did not
    name the project (their own was taken): one of another owner there (made in it before
    the caller's account existed) is never resolved by accident."""
    if record is None:
        raise errors.NotFound(f"{kind} {name!r} not found in project {project!r}")
    if implicit and record.owner_uid != caller_uid:
        raise errors.NotFound(
            f"{kind} {name!r} not found among yours in project {project!r}; the {kind} of "
            f"that name there is {record.owner}'s (pass --project {project} to look at it)")
    return record


class Room(Protocol):
    """The disk's say on new work (disk/room.py): refused below the reserve or over quota."""

    async def require_unless_made(self, what: str, uid: int, user: str, table: str,
                                  idempotency_key: str | None) -> None: ...


class DiskUse(Protocol):
    """Each user's measured disk use (disk/usage.py), measured again soon on request."""

    def refresh_soon(self) -> None: ...


def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


# What owners ask of a job once it exists, whichever phase it is in when they ask:
# cancel, suspend (stop it and keep it aside), resume (queue it again at its old place),
# and remove an ended one (its name free again).
class OwnerControls:
    def __init__(self, store: Store, layout: JobLayout, dispatch: Dispatch, board: Board,
                 stopper: Stopper, withdraw: Callable[[int], bool],
                 return_to_unreleased: Callable[[JobRecord], bool]) -> None:
        """`withdraw(job_id)`: takes back a sweep's cell that was never queued; False when
        the job is not such a cell. `return_to_unreleased(job)`: a resumed cell goes back
        among its sweep's unreleased cells; False when it is no cell of a running sweep."""
        self.store = store
        self.layout = layout
        self.dispatch = dispatch
        self.board = board
        self.stopper = stopper
        self._withdraw = withdraw
        self._return_to_unreleased = return_to_unreleased

    def _take_back(self, job_id: int) -> bool:
        """Out of the queue, or out of its sweep's held cells: it never started."""
        return self.dispatch.remove(job_id) or self._withdraw(job_id)

    async def cancel(self, job: JobRecord) -> None:
        if job.phase == Phase.CANCELLED:
            return
        if job.phase in TERMINAL:
            raise errors.Conflict(f"job {job.name!r} has already ended ({job.phase})")
        if self._take_back(job.id):
            await self.store.write(lambda c: job_writes.cancel_pending(
                c, job.id, time.time(), "cancelled before it started"))
            self.dispatch.kick()
            return
        attempt = self.board.active.get(job.id)
        if attempt is not None:
            await self.stopper.request_stop(attempt, Reason.CANCELLED)
            return
        if (recorded := self.board.finishing.get(job.id)) is not None:
            # Its end is being recorded right now; if that end leaves it suspended or
            # queued again, the cancel applies to what it became. Its processes are gone:
            # while a full disk holds the end back, the caller is answered meanwhile.
            await self.stopper.settle(self.stopper.aside(self._cancel_after(job.id,
                                                                            recorded)))
            return
        if job.phase == Phase.SUSPENDED:
            await self.store.write(lambda c: job_writes.set_phase(
                c, job.id, Phase.CANCELLED, time.time(), Reason.CANCELLED,
                "cancelled while suspended", expect=Phase.SUSPENDED))
            return
        raise errors.Conflict(f"job {job.name!r} is {job.phase} and cannot be cancelled now")

    async def _cancel_after(self, job_id: int, recorded: asyncio.Future[None]) -> None:
        await asyncio.shield(recorded)
        fresh = await self.store.job_by_id(job_id)
        if fresh is not None and fresh.phase not in TERMINAL:
            await self.cancel(fresh)

    async def suspend(self, job: JobRecord) -> None:
        """Stop the job as a cancel would, and keep it aside until resume()."""
        if job.phase == Phase.SUSPENDED:
            return
        if job.phase in TERMINAL:
            raise errors.Conflict(f"job {job.name!r} has already ended ({job.phase})")
        if self._take_back(job.id):
            await self.store.write(lambda c: job_writes.set_phase(
                c, job.id, Phase.SUSPENDED, time.time(), Reason.SUSPENDED,
                "suspended before it started; `job resume` queues it again"))
            self.dispatch.kick()
            return
        attempt = self.board.active.get(job.id)
        if attempt is None:
            raise errors.Conflict(f"job {job.name!r} is {job.phase} and cannot be suspended "
                                  "now")
        await self.stopper.request_stop(attempt, Reason.SUSPENDED)

    async def remove(self, job: JobRecord, by: str) -> None:
        """An ended job out of listings, its name free, its directory gone; its attempts
        stay (fair share, cost history)."""
        if job.sweep_id is not None:
            raise errors.Conflict(f"job {job.name!r} is a cell of a sweep; `sweep rm` "
                                  "removes a sweep with its cells, `sweep gc` frees them")
        if job.phase not in TERMINAL or job.id in self.board.active:
            raise errors.Conflict(f"job {job.name!r} is {job.phase}; cancel it first "
                                  "(`job kill`), or `job run --replace`")
        await self.store.write(lambda c: job_writes.remove_job(c, job.id, time.time(), by))
        await asyncio.to_thread(self.layout.remove, job.id)

    async def resume(self, job: JobRecord) -> None:
        if job.phase != Phase.SUSPENDED:
            raise errors.Conflict(f"job {job.name!r} is {job.phase}; only a suspended job "
                                  "can be resumed")
        await self.store.write(lambda c: job_writes.set_phase(
            c, job.id, Phase.PENDING, time.time(), Reason.RESUMED,
            "resumed; queued again at its old place", expect=Phase.SUSPENDED))
        resumed = replace(job, phase=Phase.PENDING.value, reason=Reason.RESUMED)
        if not self._return_to_unreleased(resumed):
            self.dispatch.enqueue(resumed)


class JobService:
    def __init__(self, live: LiveSettings, store: Store, hub: EventHub, layout: JobLayout,
                 runtimes: Mapping[str, Runtime], board: Board, queue: Queue,
                 dispatch: Dispatch, admission: Admission, controls: OwnerControls,
                 runner: AttemptRunner, accounting: GpuAccounting, room: Room,
                 usage: DiskUse, is_cell: Callable[[int], bool],
                 sweep_wait_reason: Callable[[int], str | None]) -> None:
        """`is_cell`, `sweep_wait_reason`: the sweep controller's say on a job (whether a
        sweep released it, why its sweep keeps it back)."""
        self.live = live
        self.store = store
        self.hub = hub
        self.layout = layout
        self.runtimes = runtimes
        self.board = board
        self.queue = queue
        self.dispatch = dispatch
        self.admission = admission
        self.controls = controls
        self.runner = runner
        self.accounting = accounting
        self.room = room
        self.usage = usage
        self._is_cell = is_cell
        self._sweep_wait_reason = sweep_wait_reason
        self._execs: Counter[int] = Counter()  # execs running, by the job owner's uid

    # --- finding and listing --------------------------------------------------------------

    async def find(self, project: str, name: str, caller_uid: int, implicit: bool
                   ) -> JobRecord:
        """The job NAME in PROJECT. `implicit`: the caller did not name the project (their
        own was taken), so a job there of another owner is not theirs to find."""
        return found("job", await self.store.job(project, name), project, name, caller_uid,
                     implicit)

    async def by_id(self, job_id: int) -> JobRecord:
        job = await self.store.job_by_id(job_id)
        assert job is not None  # jobs are removed from listings, never from the table
        return job

    async def list(self, *, phases: list[str] | None, owner: str | None,
                   project: str | None, labels: dict[str, str], active_only: bool,
                   limit: int, before: int | None, sweep_id: int | None
                   ) -> list[JobRecord]:
        return await self.store.jobs(phases=phases, owner=owner, project=project,
                                     labels=labels, active_only=active_only, limit=limit,
                                     before=before, sweep_id=sweep_id)

    async def attempts(self, job: JobRecord) -> list[AttemptRecord]:
        return await self.store.attempts(job.id)

    async def events(self, *, since: int, job_id: int | None, project: str | None,
                     limit: int) -> list[Event]:
        """A page of the event log after `since`, of one job or project if named."""
        return await self.store.events(since=since, job_id=job_id, project=project,
                                       limit=limit)

    @contextmanager
    def live_events(self) -> Iterator[asyncio.Queue[Event | None]]:
        """Every event committed from now on, until the block ends (None: cut off)."""
        with self.hub.stream() as queue:
            yield queue

    async def next_event(self, job: JobRecord, timeout: float) -> None:
        """Return at the job's next committed event, or after `timeout` seconds."""
        await self.hub.next_change(job_topic(job.id), timeout)

    # --- what a job is now ----------------------------------------------------------------

    def document(self, job: JobRecord, redact: bool, detail: bool = True) -> dict[str, Any]:
        """The job as the API shows it; a listing (`detail` false) reads no file per job."""
        doc = job.to_wire(self.wait_reason(job.id), redact=redact,
                          running_cost=self.running_cost(job.id),
                          live_metrics=self.running_metrics(job.id))
        if not detail:
            return doc
        if (ranks := self.rank_view(job)) is not None:
            doc["ranks"] = ranks
        if (indexes := self.index_view(job)) is not None:
            doc["indexes"] = indexes
        return doc

    def wait_reason(self, job_id: int) -> str | None:
        if (pause := self.dispatch.retry_hold(job_id)) is not None:
            return pause
        if (queued := self._queued(job_id)) is not None:
            return queued.why
        if (why := self.queue.wait_reason(job_id)) is not None and self._is_cell(job_id):
            return f"blocked on capacity: {why}"  # released by its sweep, waiting its turn
        return why or self._sweep_wait_reason(job_id)

    def _queued(self, job_id: int) -> Queued | None:
        """A launched attempt waiting in its runtime's own queue (a cluster's), as it says."""
        if (attempt := self.board.active.get(job_id)) is None:
            return None
        runtime = self.runtimes.get(attempt.job.spec.runtime)
        return None if runtime is None else runtime.queue_reason(attempt.handles)

    def job_label(self, job_id: int) -> str | None:
        """`project/name` of a job that runs or waits, for messages about it."""
        job = self.board.running_job(job_id) or self.dispatch.pending.get(job_id)
        return None if job is None else f"{job.project}/{job.name}"

    def running_metrics(self, job_id: int) -> dict[str, float] | None:
        """What a running job has reported so far (None when it does not run)."""
        attempt = self.board.active.get(job_id)
        return None if attempt is None else attempt.metrics

    def running_cost(self, job_id: int) -> float:
        attempt = self.board.active.get(job_id)
        return 0.0 if attempt is None else self.accounting.attempt_cost(attempt)

    def rank_view(self, job: JobRecord) -> list[dict[str, Any]] | None:
        """A gang's ranks: state, exit code and GPUs; None for a job that is no gang, or
        whose directory (where they are recorded) retention removed."""
        if job.spec.gang is None or job.collected_at is not None:
            return None
        directory = self.layout.attempt_dir(job.id, job.attempts) if job.attempts else None
        return gang_view.rank_view(job, self.board.active.get(job.id), directory,
                                   self.accounting.inventory)

    def index_view(self, job: JobRecord) -> dict[str, Any] | None:
        """An indexed job's indexes: succeeded, running, failed; None for any other job, or
        one whose directory (where they are recorded) retention removed."""
        if job.spec.indexed is None or job.collected_at is not None:
            return None
        return index_view(self.layout, job, self.board.active.get(job.id))

    def queue_page(self, limit: int) -> tuple[int, list[dict[str, Any]]]:
        """How many wait, and the first `limit` places of the last pass's order (what the
        wait reasons describe), not a fresh sort of everything; then the jobs that wait
        for a cluster region (in its lane here, or in the cluster's own queue), which
        have no place in this box's order."""
        waiting = [r for r in self.queue.last_order() if r.job_id in self.queue]
        entries = []
        for place, request in enumerate(waiting[:limit]):
            job = self.dispatch.pending.get(request.job_id)
            if job is not None:
                entries.append({**self._queue_entry(job), "place": place,
                                "eta": iso(self.queue.etas.get(job.id))})
        # (job, Slurm's start estimate): in a lane here, or in the cluster's queue.
        elsewhere: list[tuple[JobRecord, float | None]] = [
            (job, None) for job in self.dispatch.pending.values()
            if self.dispatch.lanes.waits(job.id)]
        # Waiting for their dependencies: no place in the order until those are met.
        elsewhere.extend((job, None) for job in self.dispatch.gate.waiting.values())
        for job_id, attempt in self.board.active.items():
            if (queued := self._queued(job_id)) is not None:
                elsewhere.append((attempt.job, queued.start_at))
        elsewhere.sort(key=lambda pair: pair[0].created_at)
        for job, start_at in elsewhere[:max(0, limit - len(entries))]:
            entries.append({**self._queue_entry(job), "place": None, "eta": iso(start_at)})
        return len(waiting) + len(elsewhere), entries

    def _queue_entry(self, job: JobRecord) -> dict[str, Any]:
        return {"name": job.name, "project": job.project, "owner": job.owner,
                "region": job.spec.region,
                "gpu": None if job.spec.gpu is None else job.spec.gpu.to_wire(),
                "cpu": job.spec.cpu_m / 1000, "priority": job.spec.priority,
                "expected_duration": job.spec.expected_duration,
                "hold": self.wait_reason(job.id), "created_at": iso(job.created_at)}

    async def estimate(self, job: JobRecord) -> dict[str, Any]:
        """When the job should start (a simulation of the queue), what it should cost (p50
        and p90, from its expected_duration, else from the owner's earlier runs of the same
        image and command), and why it waits now."""
        now = time.time()
        if job.phase == Phase.PENDING and (queued := self._queued(job.id)) is not None:
            start_at = queued.start_at  # Slurm's own estimate (squeue --start's)
            start_why = queued.why if start_at is not None else \
                f"{queued.why}; Slurm gives no start estimate yet"
        elif job.phase == Phase.PENDING and (
                after := self.dispatch.gate.wait_reason(job.id)) is not None:
            start_at = None  # its place in the queue comes once its dependencies are met
            start_why = (f"{after}; it is queued once its dependencies are met, so no start "
                         "can be estimated before")
        elif job.phase == Phase.PENDING:
            start = estimate_start(self.queue, job.id, now, self.job_label)
            start_at, start_why = start.at, start.why
        elif job.phase in (Phase.STARTING, Phase.RUNNING):
            start_at, start_why = job.started_at or now, "it started"
        else:  # Suspended (until resumed) or ended: it has no start ahead
            start_at, start_why = None, f"it is {job.phase}"
        spec = job.spec
        gpus = spec.gpu.count if spec.gpu else 0
        rate = self.accounting.gpu_hour_rate(spec.gpu.model if spec.gpu else None)
        costs: list[float] = []
        source = "no expected_duration and no earlier run of the same command"
        if spec.expected_duration is not None:
            costs = [gpus * spec.expected_duration / 3600 * rate]
            source = "expected_duration x the GPU-hour rate"
        else:
            same = []
            for stored, seconds, cost in await self.store.past_runs(job.owner_uid):
                other = json.loads(stored)
                if (other.get("command") == spec.command and other.get("args") == spec.args
                        and other.get("image") == spec.image):
                    same.append(cost or gpus * seconds / 3600 * rate)
            if same:
                costs, source = same, f"{len(same)} earlier runs of the same image and command"
        gang = None
        if spec.gang is not None:
            gang = gang_topology(self.queue.capacity.gpus,
                                 Request.of(job.id, spec, job.owner_uid),
                                 spec.gang.nodes, spec.gang.gpus_per_node,
                                 self.wait_reason(job.id) if job.phase == Phase.PENDING
                                 else None)
        return {
            "kind": "Estimate", "name": job.name, "phase": job.phase, "gang": gang,
            "start_at": iso(start_at), "start_in_s": None if start_at is None
            else round(max(0.0, start_at - now), 1), "start_basis": start_why,
            "cost_p50": round(_pct(costs, 50), 6) if costs else None,
            "cost_p90": round(_pct(costs, 90), 6) if costs else None, "cost_basis": source,
            "hold": self.wait_reason(job.id)}

    # --- what owners do -------------------------------------------------------------------

    async def create(self, req: CreateRequest, owner: Owner, idempotency_key: str | None,
                     request_hash: str | None) -> tuple[JobRecord, bool]:
        await self.room.require_unless_made("new jobs", owner.uid, owner.name, "jobs",
                                            idempotency_key)
        return await self.admission.create(req, owner, idempotency_key, request_hash)

    async def control(self, job: JobRecord, action: JobAction) -> JobRecord:
        """Cancel, suspend or resume, whichever phase the job is in; the job after."""
        act = {"cancel": self.controls.cancel, "suspend": self.controls.suspend,
               "resume": self.controls.resume}[action]
        await act(job)
        return await self.by_id(job.id)

    async def remove(self, job: JobRecord, by: str) -> None:
        """An ended job out of listings, its name free again; its record stays."""
        await self.controls.remove(job, by)
        self.usage.refresh_soon()

    async def wait(self, job: JobRecord, timeout: float) -> JobRecord:
        """The job once it has ended, or as it is after `timeout` seconds."""
        if job.phase in TERMINAL:
            return job
        return await self.hub.long_poll(job_topic(job.id), lambda: self.by_id(job.id),
                                        lambda now: now.phase in TERMINAL, timeout)

    async def exec(self, job: JobRecord, command: list[str], timeout: float,
                   rank: int = 0) -> ExecResult:
        """Run a command beside one of the job's running ranks, as its owner."""
        async with self._beside(job, rank) as (runtime, launch, handle, _):
            return await runtime.exec(launch, handle, command, timeout)

    @asynccontextmanager
    async def terminal(self, job: JobRecord, command: list[str] | None, rows: int, cols: int,
                       rank: int = 0) -> AsyncIterator[tuple[Terminal, asyncio.Future[Any]]]:
        """A command beside one of the job's running ranks on a pseudo-terminal, as its
        owner (None: the owner's login shell; /bin/sh in a container), and the rank's end
        (the terminal is closed with it); counted among the owner's execs until closed."""
        if not command:
            shell = "/bin/sh" if job.spec.image else \
                account(job.owner_uid, job.owner, job.owner_gid)[1]
            command = [shell, "-l"]
        async with self._beside(job, rank) as (runtime, launch, handle, end):
            terminal = await runtime.open_terminal(launch, handle, command, rows, cols)
            try:
                yield terminal, end
            finally:
                await terminal.close()

    @asynccontextmanager
    async def _beside(self, job: JobRecord, rank: int
                      ) -> AsyncIterator[tuple[Runtime, Launch, Handle, asyncio.Future[Any]]]:
        """A running rank of the job to exec beside, while one of the owner's
        `user_max_execs` places is taken."""
        attempt = self.board.active.get(job.id)
        phase = job.phase
        if phase == Phase.STARTING and attempt is not None and attempt.running is not None:
            # Launched, its Running committed lazily (within writer.LAZY_DELAY): what it
            # printed may be read already, and an exec must not be refused meanwhile.
            with suppress(Exception):
                await asyncio.shield(attempt.running)
                phase = Phase.RUNNING
        if phase != Phase.RUNNING or attempt is None or not attempt.launched:
            raise errors.Conflict(f"job {job.name!r} is {job.phase}; exec needs it Running")
        runtime = self.runtimes[job.spec.runtime]
        if not attempt.ends:
            why = runtime.wait_reason() or "the daemon has just restarted"
            raise errors.Conflict(f"job {job.name!r}: it is not adopted yet ({why}); try "
                                  "again shortly")
        owner, most = job.owner_uid, self.live.current.user_max_execs
        if self._execs[owner] >= most:
            raise errors.ResourceExhausted(
                f"exec: {job.owner} has {self._execs[owner]} execs running, the most one "
                f"user may (user_max_execs = {most}); wait for one to end")
        self._execs[owner] += 1
        try:
            launch = await self.runner.launch_of(attempt)
            if job.spec.indexed is not None:
                launch = running_index_launch(launch, rank)
            running = [(h, end) for h, end in zip(attempt.handles, attempt.ends, strict=True)
                       if h.rank == rank and not end.done()]
            if not running:
                what = "index" if job.spec.indexed is not None else "rank"
                raise errors.Conflict(f"job {job.name!r}: its {what} {rank} is not running "
                                      "now")
            handle, end = running[-1]
            yield runtime, launch, handle, end
        finally:
            self._execs[owner] -= 1

    # --- its logs -------------------------------------------------------------------------

    def log_path(self, job: JobRecord, number: int, stream: str, rank: int | None = 0
                 ) -> Path:
        """Where attempt `number`'s log is (stream "all" or "stderr"), of one rank or
        (None) of every rank of a gang merged."""
        directory = self.layout.attempt_dir(job.id, number)
        if rank is None:
            return merged_path(directory, stream)
        if job.spec.indexed is not None:  # `rank` is the index, in a directory of its own
            return self.runtimes[job.spec.runtime].log_path(index_dir(directory, rank),
                                                            stream)
        return self.runtimes[job.spec.runtime].log_path(directory, stream, rank)

    def index_logs(self, job: JobRecord, stream: str) -> list[tuple[int, int, Path]]:
        """An indexed job's logs as (index, attempt, path): of each index that ran, its
        last attempt's. Reads the attempts' journals: call it off the loop."""
        return [(index, number, self.log_path(job, number, stream, index))
                for index, number in attempts_of_indexes(self.layout, job).items()]

    def log_attempt(self, job: JobRecord, rank: int | None) -> int:
        """The attempt whose log a reader gets unless it names one: the last, or for an
        index, the last that ran it."""
        if job.spec.indexed is not None and rank is not None:
            return attempt_of_index(self.layout, job, rank)
        return job.attempts

    def writing_logs(self, job_id: int, number: int) -> bool:
        """Whether attempt `number` of the job may still add to its log."""
        attempt = self.board.active.get(job_id)
        return attempt is not None and number > 0 and attempt.number == number

    # --- its files ------------------------------------------------------------------------

    @asynccontextmanager
    async def workspace(self, job: JobRecord) -> AsyncIterator[Path]:
        """The job's kept workspace, showing what its task wrote over its code while in it
        (layout.reading), or NotFound saying why it has none."""
        root = await self._kept_workspace(job)
        view = self.layout.reading(job.id)
        await asyncio.to_thread(view.__enter__)
        try:
            yield root
        finally:
            await asyncio.to_thread(view.__exit__, None, None, None)

    async def _kept_workspace(self, job: JobRecord) -> Path:
        root = self.layout.workspace(job.id)
        if (note := job.collected_note()) is not None:
            raise errors.NotFound(note)
        if not root.exists():
            # Read again: retention may have collected it since it was looked up.
            job = await self.store.job_by_id(job.id) or job
            if (note := job.collected_note()) is not None:
                raise errors.NotFound(note)
            if job.phase in TERMINAL and job.attempts:
                why = ("it was discarded when the job ended (an ephemeral job)"
                       if job.spec.ephemeral else "it was freed (`sweep gc`)")
                raise errors.NotFound(f"job {job.name!r} has no workspace any more: {why}")
            raise errors.NotFound(f"job {job.name!r} has no workspace yet (it has not "
                                  "started)")
        return root

    async def outputs(self, job: JobRecord, index: int = -1) -> dict[str, dict[str, Any]]:
        """The rows of the job's (or one index's) collected outputs, by name."""
        return await self.store.outputs(job.id, index)

    def blob_path(self, sha256: str) -> Path:
        return self.layout.blobs.path(sha256)

    async def raise_if_collected(self, job: JobRecord) -> None:
        """Something of the job is missing: if retention collected it since it was looked
        up, say so (as the job read now has it) instead of what the older record says."""
        fresh = await self.store.job_by_id(job.id)
        if fresh is not None and (note := fresh.collected_note()) is not None:
            raise errors.NotFound(note)
