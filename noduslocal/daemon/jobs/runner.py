"""Running one attempt: prepare its directory, launch its ranks through the job's runtime,
watch them (timeout, a stop asked for meanwhile, a GPU that broke) and follow what they
report in the metrics file, and record the end: outputs collected before it is committed,
the job queued again or ended, the share handed on in the same commit as the next start.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import watchfiles

from noduslocal.daemon.coarse_timer import CoarseTimer
from noduslocal.daemon.files.layout import JobLayout, WorkspaceFailed
from noduslocal.daemon.files.outputs import OutputLimits
from noduslocal.daemon.files.outputs import collect as collect_output
from noduslocal.daemon.jobs import gang_logs, gang_view
from noduslocal.daemon.jobs.accounting import GpuAccounting
from noduslocal.daemon.jobs.attempt import Attempt, Board, verdict
from noduslocal.daemon.jobs.dispatch import Dispatch
from noduslocal.daemon.jobs.gang_logs import LogMerger
from noduslocal.daemon.jobs.indexed_run import IndexedRun
from noduslocal.daemon.jobs.outcomes import NO_ROOM_PAUSE, outcome_of, retry_pause
from noduslocal.daemon.jobs.stops import Stopper
from noduslocal.daemon.runtime.base import (
    ArmingRuntime,
    AttemptRef,
    AttemptState,
    Exited,
    Launch,
    LaunchFailed,
    NeverStarted,
    NotLaunched,
    Rank,
    Runtime,
    Vanished,
)
from noduslocal.daemon.runtime.gang_launch import master_port
from noduslocal.daemon.store import Store, job_writes
from noduslocal.domain import metrics
from noduslocal.domain.indexes import output_path
from noduslocal.domain.jobs import Collected, JobRecord
from noduslocal.domain.states import TERMINAL, AttemptPhase, Phase, Reason

log = logging.getLogger(__name__)
COLLECT_THREADS = 2  # jobs whose outputs are collected at once
DEBOUNCE_MS = 200  # a metrics file's changes read at most this often
FOLLOW_AFTER = 1.0  # seconds (to twice that) an attempt runs before its metrics are watched


class AttemptRunner:
    def __init__(self, store: Store, layout: JobLayout, runtimes: Mapping[str, Runtime],
                 board: Board, dispatch: Dispatch, stopper: Stopper,
                 accounting: GpuAccounting, output_limits: OutputLimits,
                 disk_room: Callable[[], int],
                 on_end: Callable[[int, str], None] = lambda job_id, phase: None,
                 stderr_line: Callable[[JobRecord, int], str] | None = None,
                 on_launch: Callable[[int], None] = lambda job_id: None) -> None:
        """`on_end(job_id, phase)`: an attempt's end, before its commit (a sweep hands the
        room on). `on_launch(job_id)`: an attempt was launched (a sweep arms its next
        cells: after the launch, so that work never delays one). `stderr_line(job,
        number)`: the last line of an attempt's stderr, kept with the end of one that did
        not succeed, so that a sweep's failures are clustered without reading a file per
        cell (None: not kept, the clusters read the file)."""
        self.store = store
        self.layout = layout
        self.runtimes = runtimes
        self.board = board
        self.dispatch = dispatch
        self.stopper = stopper
        self.accounting = accounting
        self.output_limits = output_limits
        self.disk_room = disk_room
        self._on_end = on_end
        self._on_launch = on_launch
        self._can_arm: dict[int, bool] = {}  # by id(runtime): see _arming_runtime()
        self._stderr_line = stderr_line
        # Copying and hashing outputs (gigabytes, perhaps) has threads of its own: API reads
        # and everything else on the default pool never queue behind it.
        self._collect_pool = ThreadPoolExecutor(COLLECT_THREADS, "collect")
        self._ahead_pool = ThreadPoolExecutor(1, "prepare-ahead")
        self._follow_later = CoarseTimer(FOLLOW_AFTER)  # one timer for every attempt's
        self.indexed = IndexedRun(store, layout, stopper, runtimes, self.collect_index)

    def prepare_ahead(self, jobs: list[JobRecord]) -> None:
        """Make the jobs' first directories on a thread of their own before they start,
        in one trip there."""
        self.layout.expect_ahead([job.id for job in jobs])
        self._ahead_pool.submit(self._prepare_each, jobs)

    def _prepare_each(self, jobs: list[JobRecord]) -> None:
        for job in jobs:
            try:
                self.layout.prepare_ahead(job)
            except Exception:  # its start makes them itself; the next cells still go ahead
                log.exception("making the directories of job %s ahead failed", job.name)

    def arm_ahead(self, jobs: list[JobRecord]) -> None:
        """Pending jobs about to start (a sweep's next cells) launched ahead where their
        runtime can hold a launch (ArmingRuntime), so their start only lets them go.
        A job with secrets is not (they are read at its start), nor one that started
        meanwhile (its attempt would be launched twice)."""
        for job in jobs:
            runtime = self._arming_runtime(job)
            number = job.attempts + 1
            if (runtime is None or job.id in self.board.active or job.spec.secrets
                    or runtime.holds(job.id, number)):
                continue
            ref = AttemptRef(job, number, self.layout.attempt_dir(job.id, number))
            runtime.arm(Launch(ref, {}, self.accounting.grant([])))

    def _arming_runtime(self, job: JobRecord) -> ArmingRuntime | None:
        """The job's runtime where it can arm a launch. Known once per runtime: a check
        against a Protocol looks at each of its methods, 6 % of the loop's time in a map
        when it was made twice a task."""
        runtime = self.runtime_of(job)
        can = self._can_arm.get(id(runtime))
        if can is None:
            can = self._can_arm[id(runtime)] = isinstance(runtime, ArmingRuntime)
        return cast(ArmingRuntime, runtime) if can else None

    def runtime_of(self, job: JobRecord) -> Runtime:
        return self.runtimes[job.spec.runtime]

    async def launch_of(self, attempt: Attempt) -> Launch:
        """What the runtime needs for this attempt: its place, secrets and GPUs."""
        job = attempt.job
        secrets = await self.store.job_secret_values(job.id) if job.spec.secrets else {}
        port = 0 if job.spec.gang is None else master_port(attempt.ref.directory)
        return Launch(attempt.ref, secrets, self.accounting.grant(attempt.gpus), port)

    @staticmethod
    def take(attempt: Attempt, ranks: list[Rank]) -> None:
        attempt.handles = [rank.handle for rank in ranks]
        attempt.ends = [rank.ended for rank in ranks]
        attempt.mark_launched()

    async def run(self, attempt: Attempt) -> None:
        job = attempt.job
        assert attempt.started is not None
        try:
            armed = self._armed_runtime(attempt)
            launched = await (self._launch(attempt) if armed is None
                              else self._launch_armed(attempt, armed))
            if launched is None:
                return  # ended or failed before it was launched: that is recorded
            ranks, array = launched
            self._on_launch(job.id)
            now = await self.until_running(attempt, ranks)
            if not isinstance(now, float):  # it ended while it waited in a cluster's queue
                await self.finish(attempt, now)
                return
            # Not awaited here: the writer keeps order, so this commits before the end does,
            # with it for a short task. Lazily: after a crash before its commit, recovery
            # reads the attempt's records and adopts it all the same.
            attempt.running_at = now
            running = attempt.running = self.store.write_lazily(
                lambda c: job_writes.attempt_running(c, job.id, attempt.number, now,
                                                     attempt.handles),
                volatile=job.spec.region is None)
            await self.watch(attempt, now, running,
                             until=self.indexed.follow(attempt, ranks) if array else None)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("supervising job %s failed", job.name)
            await self.give_up(attempt, f"the daemon could not run it: {exc}")

    def _armed_runtime(self, attempt: Attempt) -> ArmingRuntime | None:
        """The runtime holding this attempt's shim armed (a sweep's cell launched ahead),
        whose start can let it go at once; None when it is launched the usual way."""
        job = attempt.job
        runtime = self._arming_runtime(job)
        if (runtime is None or attempt.gpus
                or attempt.stop_reason is not None or attempt.lost is not None
                or not runtime.armed(job.id, job.attempts + 1)
                or (job.spec.source and not self.layout.overlays.attached(job.id))):
            return None
        return runtime

    async def _launch_armed(self, attempt: Attempt,
                            runtime: ArmingRuntime) -> tuple[list[Rank], bool] | None:
        """Let the armed shim go as the start is queued, before its commit lands: the
        commit is work on the loop, and the job's process starts meanwhile. Nor is the
        commit waited for after: the writer keeps order, so the end commits after the
        start, and a writer held up (a checkpoint's sync, a few milliseconds every 64
        commits) holds up no task's end nor the next one's start. A kill -9 of the daemon
        before the commit leaves the shim's records to prove the start, which recovery
        puts back (the record says it was armed: no loss of the database's, orphans.py).
        A start that is not committed (never expected) stops the job, which fails (see
        _start_recorded). As _launch() answers (an armed one is never a job array)."""
        job = attempt.job
        attempt.number = job.attempts + 1
        # Whatever ends it from here is written after its start (the writer keeps order).
        try:
            attempt.directory = self.layout.prepare(job, attempt.number)
            ranks = await runtime.launch(Launch(attempt.ref, {}, self.accounting.grant([])))
        except (WorkspaceFailed, LaunchFailed) as exc:
            await self.give_up(attempt, str(exc))
            return None
        except NotLaunched as exc:
            await self.finish(attempt, exc.state)
            return None
        self.take(attempt, ranks)
        assert attempt.started is not None
        attempt.started.add_done_callback(lambda done: self._start_recorded(attempt, done))
        return ranks, False

    def _start_recorded(self, attempt: Attempt, started: asyncio.Future[int]) -> None:
        """An armed attempt's start committed, or not: then it is killed, and its end
        (whose write fails without the start's row) fails its job in give_up()."""
        if started.cancelled():
            return
        exc = started.exception()
        if exc is None and started.result() == attempt.number:
            return
        attempt.unrecorded = (f"{exc}" if exc is not None else
                              f"it was committed as attempt {started.result()}")
        log.error("job %s: the start of attempt %d was not recorded (%s); stopping it",
                  attempt.job.name, attempt.number, attempt.unrecorded)
        self.stopper.background.spawn(self.stopper.signal(attempt, signal.SIGKILL))

    async def _launch(self, attempt: Attempt) -> tuple[list[Rank], bool] | None:
        """Once its start is committed: its directory made and its ranks launched, and
        whether they are a cluster's job array; None when it ended or failed first."""
        job = attempt.job
        attempt.number = await attempt.started
        if attempt.stop_reason is not None:
            await self.finish(attempt, NeverStarted())
            return None
        if attempt.lost is not None:  # its GPU broke before it was launched
            await self.finish(attempt, NeverStarted(attempt.lost))
            return None
        try:
            # Unpacking may take a while: a source not yet attached as an overlay
            # (prepare_ahead() may be unpacking it still) is prepared off the loop.
            # Mounting one attached is a system call of a fraction of a millisecond, less
            # than the trip to a thread.
            if job.spec.source and not self.layout.overlays.attached(job.id):
                attempt.directory = await asyncio.to_thread(self.layout.prepare, job,
                                                            attempt.number)
            else:
                attempt.directory = self.layout.prepare(job, attempt.number)
        except WorkspaceFailed as exc:  # its input's fault: said to its owner, no trace
            log.info("job %s: %s", job.name, exc)
            await self.give_up(attempt, str(exc))
            return None
        launch = await self.launch_of(attempt)
        array = job.spec.indexed is not None and self.indexed.array_runtime(job) is not None
        if job.spec.indexed is not None and not array:
            try:
                await self.watch(attempt, time.time(),
                                 until=self.indexed.run(attempt, launch))
            except LaunchFailed as exc:
                await self.give_up(attempt, str(exc))
            return None
        try:
            ranks = await (self.indexed.submit(attempt, launch) if array
                           else self.runtime_of(job).launch(launch))
        except NotLaunched as exc:
            await self.finish(attempt, exc.state)
            return None
        except LaunchFailed as exc:
            await self.give_up(attempt, str(exc))
            return None
        self.take(attempt, ranks)
        return ranks, array

    async def until_running(self, attempt: Attempt, ranks: list[Rank],
                            adopted: bool = False) -> float | AttemptState:
        """When the attempt started. Ranks a cluster's scheduler queued (Slurm) leave the
        job Pending, its attempt open, until every one runs there; the end of one that
        ended before that without having run (cancelled, or lost, in the queue). A rank
        that ran and ended between two looks at the queue started when its exit says.
        `adopted`: after a restart (the job's record then says whether it was queued)."""
        waits = [rank.running for rank in ranks if rank.running is not None]
        if not waits:
            return float(min((rank.started_at for rank in ranks), default=time.time()))
        job = attempt.job
        # An adopted attempt whose job is Pending was recorded queued before the restart.
        if (not adopted or job.phase == Phase.STARTING) and not all(
                running.done() for running in waits):
            queued = self.runtime_of(job).queue_reason(attempt.handles)
            why = queued.why if queued is not None else "queued"
            await self.store.write(lambda c: job_writes.attempt_queued(
                c, job.id, attempt.number, time.time(), attempt.handles, why))
        if attempt.stop_reason is not None:
            # Asked for while it was being submitted (nothing to signal then): it may wait
            # in the cluster's queue for hours, so it is stopped there now, not once it runs.
            await self.stopper.send_stop(attempt)
        starts = []
        for rank in ranks:
            if rank.running is None:
                starts.append(rank.started_at)
                continue
            await asyncio.wait([rank.running, rank.ended],
                               return_when=asyncio.FIRST_COMPLETED)
            if rank.running.done():
                starts.append(rank.running.result())
                continue
            state = rank.ended.result()
            if not isinstance(state, Exited):
                return state
            starts.append(state.started_at)
        return float(min(starts))

    async def watch(self, attempt: Attempt, started_at: float,
                    running: asyncio.Future[Any] | None = None,
                    until: Awaitable[AttemptState] | None = None) -> None:
        """Until every rank has ended (or, for an indexed job, `until` said how it ended):
        the timeout, stops asked for meanwhile, and what it reports (its metrics)."""
        timeout = attempt.job.spec.timeout
        if attempt.lost is not None:  # its GPU broke while it was being launched
            await self.stopper.signal(attempt, signal.SIGKILL)
        if attempt.stop_reason is not None:
            await self.stopper.send_stop(attempt)
        elif timeout is not None:
            delay = max(0.0, started_at + timeout - time.time())
            attempt.timers.append(asyncio.get_running_loop().call_later(
                delay, self.stopper.stop_soon, attempt, Reason.TIMEOUT))
        stop = asyncio.Event()
        # Only once the attempt has run FOLLOW_AFTER seconds: a watcher costs a thread and
        # an inotify instance, and even a task waiting for that second cost the short
        # tasks of a sweep of `true` more than a timer; their metrics are read at their
        # end. Not awaited at the end: the watcher notices `stop` only at its next step,
        # and the end reads the file once more itself.
        follow = self._follow_later.add(lambda: self.stopper.background.spawn(
            follow_metrics(attempt, self.layout.workspace(attempt.job.id), stop)))
        merging = None
        if attempt.job.spec.gang is not None:  # its merged log is whole before the end
            merger = LogMerger(attempt.ref.directory, attempt.job.spec.gang.nodes,
                               self.runtime_of(attempt.job).log_path)
            merging = asyncio.ensure_future(gang_logs.follow(merger, stop))
        try:
            state = await (until or verdict(attempt, lambda: self.stopper.stop_ranks(attempt)))
        finally:
            self._follow_later.cancel(follow)
            stop.set()
        if merging is not None:
            try:
                await merging
                gang_view.record_ends(attempt, self.accounting.inventory)
            except Exception:  # a record that failed never keeps the end from its job
                log.exception("recording the ranks of job %s failed", attempt.job.name)
        await self.finish(attempt, state, running)

    async def finish(self, attempt: Attempt, state: AttemptState,
                     running: asyncio.Future[Any] | None = None) -> None:
        job = attempt.job
        if attempt.lost is not None and not isinstance(state, NeverStarted):
            state = Vanished(attempt.lost)
        outcome = replace(outcome_of(state, attempt),
                          cost=self.accounting.attempt_cost(attempt))
        runtime = self.runtime_of(job)
        if outcome.attempt_phase == AttemptPhase.LOST and attempt.directory is not None:
            await runtime.clear_lost(attempt.ref, attempt.handles)
        collected, reported = [], attempt.metrics
        if isinstance(state, Exited):
            # Before the end is committed, so a wait() that returns finds them.
            if job.spec.outputs and job.spec.indexed is None:
                collected = await asyncio.get_running_loop().run_in_executor(
                    self._collect_pool, self._collect, job)
            reported = read_final_metrics(attempt, self.layout.workspace(job.id))
        line = await self.last_error(attempt, outcome.job_phase)
        # A Running still waiting for a commit to ride with (a short task's) is written in
        # the end's own rows: its statements and event as before, fewer of them.
        started = (running is not None and not running.done()
                   and job_writes.may_end_running(outcome) and self.store.withdraw(running))
        # Quick unless it carries outputs (a row each, perhaps many); volatile on this box
        # (synced within a second: a power loss before that is judged to have ended it).
        ended = self.store.write(lambda c: job_writes.finish_attempt(
            c, job.id, attempt.number, outcome, time.time(), collected, reported,
            indexed=job.spec.indexed is not None, stderr_line=line,
            started=job_writes.Started(attempt.running_at, attempt.handles) if started
            else None), quick=not collected, volatile=job.spec.region is None)
        if started:
            assert running is not None
            ended.add_done_callback(lambda done: _answer_like(running, done))
        # Its outputs' blobs stay pinned until this commit lands, even if we are cancelled.
        ended.add_done_callback(
            lambda _: self.layout.blobs.release([out.sha256 for out in collected]))
        if outcome.job_phase == Phase.PENDING:
            # Back in the queue at its old place before its share is handed on; any start
            # this allows is committed after the end above (the writer keeps order).
            again = replace(job, phase=Phase.PENDING.value, reason=outcome.reason,
                            attempts=attempt.number, cost=job.cost + outcome.cost,
                            retries_used=job.retries_used + outcome.spend_retry)
            if outcome.reason == Reason.RETRYING:  # a failed task: after a growing pause
                self.dispatch.enqueue_later(again, retry_pause(job.retries_used))
            elif isinstance(state, NeverStarted) and state.certain:
                self.dispatch.enqueue_later(again, NO_ROOM_PAUSE)  # not at once, in a loop
            else:
                self.dispatch.enqueue(again)
        # The ranks are gone, so their share goes to the next job now: that job's start and
        # this end share one commit instead of waiting for each other.
        recorded: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.board.finishing[job.id] = recorded
        self.board.settling[job.id] += 1
        try:
            try:
                self._on_end(job.id, outcome.job_phase)
                self.dispatch.release(attempt)
                if running is not None:
                    try:
                        await running
                    except BaseException:
                        # The end's write fails the same way (no start row) or is moot:
                        # the caller handles this one, and an unread failure of the end
                        # logged "Future exception was never retrieved" at a random time.
                        ended.add_done_callback(_read_outcome)
                        raise
                await asyncio.shield(ended)
            finally:
                self.board.finishing.pop(job.id, None)
                recorded.set_result(None)
            if attempt.handles and attempt.directory is not None:
                await runtime.release(attempt.ref, attempt.handles)
            await self.end_mount(attempt)
            if job.spec.ephemeral and outcome.job_phase in TERMINAL:
                await asyncio.to_thread(self.layout.free, job.id)  # its volumes, log stay
        finally:
            self.board.settling[job.id] -= 1
            if not self.board.settling[job.id]:
                del self.board.settling[job.id]

    async def end_mount(self, attempt: Attempt) -> None:
        """Its processes are gone: its workspace's overlay goes (readers see it through a
        view from now on). A failure is logged, never the job's: doctor names the mount."""
        if not self.layout.overlays.holds(attempt.job.id):
            return
        try:
            await asyncio.to_thread(self.layout.end_attempt, attempt.job.id, attempt.number)
        except OSError:
            log.exception("unmounting the workspace of job %s failed", attempt.job.name)

    async def last_error(self, attempt: Attempt, phase: str) -> str | None:
        """The last line of the attempt's stderr, read off the loop, for an attempt after
        which its job is `phase`: read unless it succeeded or was cancelled (a job that
        waits again may still end Failed with no further attempt); None where not read."""
        if (self._stderr_line is None or not attempt.number
                or phase in (Phase.SUCCEEDED, Phase.CANCELLED)):
            return None
        try:
            return await asyncio.to_thread(self._stderr_line, attempt.job, attempt.number)
        except Exception:  # the end is recorded all the same; its clusters read the file
            log.exception("reading the stderr of job %s failed", attempt.job.name)
            return None

    async def give_up(self, attempt: Attempt, message: str) -> None:
        """End a job whose attempt broke in the daemon itself, so it is never left
        Starting or Running with nobody watching it."""
        job = attempt.job
        try:
            if attempt.launched and attempt.directory is not None:
                await self.stopper.signal(attempt, signal.SIGKILL)
            if attempt.unrecorded is not None:  # no attempt of it is recorded
                message = f"the daemon could not record its start: {attempt.unrecorded}"
                await self.store.write(lambda c: job_writes.fail_job(
                    c, job.id, time.time(), Reason.START_FAILED, message))
            elif attempt.number:
                phase = AttemptPhase.LOST if attempt.launched else AttemptPhase.NOT_STARTED
                outcome = job_writes.Outcome(phase, Phase.FAILED, Reason.START_FAILED, message)
                line = await self.last_error(attempt, Phase.FAILED)
                await self.store.write(lambda c: job_writes.finish_attempt(
                    c, job.id, attempt.number, outcome, time.time(), stderr_line=line))
            else:
                await self.store.write(lambda c: job_writes.fail_job(
                    c, job.id, time.time(), Reason.START_FAILED, message))
            if attempt.handles and attempt.directory is not None:  # a kill may have failed
                await self.runtime_of(job).release(attempt.ref, attempt.handles)
            await self.end_mount(attempt)
        except Exception:
            log.exception("recording the failure of job %s failed", job.name)
        finally:
            self.dispatch.release(attempt)

    async def collect_index(self, job: JobRecord, index: int) -> list[Collected]:
        """An indexed job's outputs of one index (their paths name it), as it ends."""
        collected = await asyncio.get_running_loop().run_in_executor(
            self._collect_pool, self._collect, job, index)
        return [replace(out, index=index) for out in collected]

    def _collect(self, job: JobRecord, index: int | None = None) -> list[Collected]:
        workspace = self.layout.workspace(job.id)
        collected: list[Collected] = []
        used = 0
        for name, path in job.spec.outputs.items():
            if index is not None:
                path = output_path(path, index)
            limit, cap = self.output_limits.for_next(used, self.disk_room())
            try:
                out = collect_output(self.layout.blobs, workspace, name, path,
                                     job.owner_uid, limit, cap)
            except Exception:  # one bad output never fails the job or the others
                log.exception("collecting output %s of job %s failed", name, job.name)
                continue
            if out is not None:
                collected.append(out)
                if out.skipped:
                    log.info("output %s of job %s left out: %s", name, job.name, out.skipped)
                else:
                    used += out.size
        return collected


# Following what a running attempt reports: its metrics file watched with watchfiles
# (inotify), read again on each change, so status and a sweep's report show live values.

async def read_metrics(attempt: Attempt, workspace: Path) -> None:
    attempt.metrics = await asyncio.to_thread(metrics.read, workspace, attempt.job.owner_uid)


def read_final_metrics(attempt: Attempt, workspace: Path) -> dict[str, float]:
    """The attempt's metrics once it has ended (a watcher still stopping may lag)."""
    return metrics.read(workspace, attempt.job.owner_uid)


async def follow_metrics(attempt: Attempt, workspace: Path, stop: asyncio.Event) -> None:
    """Until `stop` is set: the attempt's metrics, read again whenever the file changes."""
    if stop.is_set():
        return
    try:
        await read_metrics(attempt, workspace)
        async for _ in watchfiles.awatch(
                workspace, stop_event=stop, recursive=False, debounce=DEBOUNCE_MS,
                watch_filter=lambda _, path: path.endswith(metrics.METRICS_FILE)):
            await read_metrics(attempt, workspace)
    except asyncio.CancelledError:
        raise
    except Exception:  # a workspace gone or unreadable: the end's own read still counts
        log.exception("following the metrics of job %s failed", attempt.job.name)


def _read_outcome(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


def _answer_like(future: asyncio.Future[Any], done: asyncio.Future[Any]) -> None:
    """FUTURE answered as DONE was: an operation written with another one's."""
    if future.done():
        return
    if done.cancelled():
        future.cancel()
    elif (exc := done.exception()) is not None:
        future.set_exception(exc)
    else:
        future.set_result(None)
