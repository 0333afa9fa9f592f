"""The daemon's job lifecycle: admission at create, the queue pass, one task per attempt
(launch, watch, timeout, stop, record the end), retries of lost attempts, and the
reconcile after a restart that adopts what still runs and records what ended meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import signal
import time
from collections.abc import Coroutine
from dataclasses import replace
from pathlib import Path
from typing import Any

from noduslocal import errors
from noduslocal.config import Settings
from noduslocal.container_attempts import ContainerAttempts
from noduslocal.gpu.cost import Meter
from noduslocal.gpu.model import Inventory
from noduslocal.gpu_attempts import GpuAttempts
from noduslocal.job_controls import JobControls
from noduslocal.models import CreateRequest, JobRecord
from noduslocal.outcomes import Attempt, outcome_of, settled_inspect
from noduslocal.outputs import Collected
from noduslocal.recovery import Recovery
from noduslocal.runtime.attempts import (
    Alive,
    AttemptState,
    Exited,
    NeverStarted,
    Vanished,
    kill_leftovers,
)
from noduslocal.runtime.containers import ContainerRuntime
from noduslocal.runtime.layout import JobLayout
from noduslocal.runtime.process import ProcessRuntime, SpawnError
from noduslocal.scheduler.fairshare import Ledger
from noduslocal.scheduler.gpus import GpuPool
from noduslocal.scheduler.queue import Capacity, Limits, Queue, Request
from noduslocal.states import TERMINAL, AttemptPhase, Phase, Reason
from noduslocal.stops import Stops
from noduslocal.store import Store, ops

log = logging.getLogger(__name__)


class Supervisor(JobControls, Stops, Recovery, ContainerAttempts, GpuAttempts):
    def __init__(self, settings: Settings, store: Store, runtime: ProcessRuntime,
                 containers: ContainerRuntime | None = None,
                 inventory: Inventory | None = None) -> None:
        self.settings = settings
        self.store = store
        self.runtime = runtime
        self.containers = containers
        self._background = set()
        self._cancel_after: set[int] = set()  # cancels that came while an end was recorded
        self.layout = JobLayout(settings.data_dir)
        self.blobs = self.layout.blobs
        self.inventory = inventory or Inventory([], "none", "no GPU inventory")
        self.ledger = Ledger(settings.fair_share_half_life)
        self.queue = Queue(Capacity(settings.cpus_m, settings.memory,
                                    gpus=GpuPool(self.inventory, settings.gpu_busy_memory)),
                           limits=Limits(settings.user_max_gpus, settings.user_max_jobs),
                           usage=self._usage, describe=self._job_name)
        self.active: dict[int, Attempt] = {}
        self._pending_jobs: dict[int, JobRecord] = {}
        self._finishing: set[int] = set()  # ended, end not committed yet
        self._pass_scheduled = False
        self._ready = False  # set once reconcile has given running jobs their CPUs back
        self._stopping = False

    def attempt_dir(self, job_id: int, number: int) -> Path:
        return self.layout.attempt_dir(job_id, number)

    # --- API-facing ---------------------------------------------------------------------

    def hold(self, job_id: int) -> str | None:
        return self.queue.hold(job_id)

    def _job_name(self, job_id: int) -> str | None:
        attempt = self.active.get(job_id)
        return attempt.job.name if attempt is not None else None

    def pending_job(self, job_id: int) -> JobRecord | None:
        return self._pending_jobs.get(job_id)

    async def create(self, req: CreateRequest, owner: ops.Owner, idempotency_key: str | None,
                     request_hash: str | None) -> tuple[JobRecord, bool]:
        if self._stopping:
            raise errors.Conflict("the daemon is shutting down; submit again once it is back")
        if req.spec.priority > self.settings.max_user_priority and not owner.admin:
            raise errors.InvalidArgument(
                f"priority: at most {self.settings.max_user_priority} for users; admins may "
                "go higher", field="priority")
        request = Request.of(0, req.spec, owner.uid)
        limit = self.settings.user_max_gpus
        if limit is not None and request.gpu_count > limit:
            raise errors.InvalidArgument(f"gpu: {request.gpu_count} GPUs requested; a user may "
                                         f"hold at most {limit} at once here", field="gpu")
        if (why := self.queue.capacity.refusal(request)) is not None:
            raise errors.InvalidArgument(why, field=why.split(":")[0])
        project = req.project or owner.name
        for _ in range(5):
            name = req.name or f"job-{secrets.token_hex(4)}"
            now = time.time()
            try:
                created: ops.Created = await self.store.write(
                    lambda c, n=name, t=now: ops.insert_job(
                        c, req, owner, n, project, t, idempotency_key, request_hash))
                break
            except errors.AlreadyExists:
                if req.name:
                    raise
        else:
            raise errors.Internal("could not generate a free job name")
        if created.created:
            self._enqueue(created.job)
        return created.job, created.created

    # --- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        self.layout.create_root()
        if self.queue.capacity.gpus is not None:
            self.queue.capacity.gpus.drained = await self.store.drained_gpus()
        horizon = time.time() - 10 * self.settings.fair_share_half_life
        for uid, gpus, started, ended in await self.store.gpu_usage(horizon):
            self.ledger.charge(uid, gpus * max(0.0, ended - started) / 3600, ended)
        jobs = await self.store.active_jobs()
        # Everything that may still run takes its CPUs back before any pass can start a
        # pending job; the pass is held until the last attempt is reconciled.
        for job in jobs:
            if job.phase in (Phase.STARTING, Phase.RUNNING):
                await self._reconcile(job)
        for job in jobs:
            if job.phase == Phase.PENDING:
                self._enqueue(job)
        self._ready = True
        self._kick()
        self._spawn(self.watch_costs())

    async def stop(self) -> None:
        """Stop supervising; jobs keep running and are adopted by the next daemon."""
        self._stopping = True
        for task in list(self._background):
            task.cancel()
        tasks = [a.task for a in self.active.values() if a.task is not None]
        for attempt in self.active.values():
            for timer in attempt.timers:
                timer.cancel()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _enqueue(self, job: JobRecord) -> None:
        request = Request.of(job.id, job.spec, job.owner_uid)
        if (why := self.queue.capacity.refusal(request)) is not None:
            # Admitted by a daemon with more CPUs or memory than this one: it would wait
            # at the head of the queue forever, and everything behind it too.
            self.store.write(lambda c: ops.fail_job(
                c, job.id, time.time(), Reason.UNSCHEDULABLE, f"{why} (after a restart)"))
            return
        self._pending_jobs[job.id] = job
        self.queue.push(request)
        self._kick()

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run `coro` on its own, held so it is not collected, cancelled by stop()."""
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _kick(self) -> None:
        if not self._pass_scheduled and not self._stopping:
            self._pass_scheduled = True
            asyncio.get_running_loop().call_soon(self._pass)

    def _pass(self) -> None:
        self._pass_scheduled = False
        if self._stopping or not self._ready:
            return
        started = self.queue.schedule()
        for job_id in self.queue.preempt:
            victim = self.active.get(job_id)
            if victim is not None and victim.stop_reason is None and victim.running:
                self.queue.stopping.add(job_id)
                log.info("preempting job %s (interruptible) for a waiting job",
                         victim.job.name)
                self._spawn(self._request_stop(victim, Reason.PREEMPTED))
        for request in started:
            job = self._pending_jobs.pop(request.job_id)
            attempt = Attempt(job, request)
            if self.queue.capacity.gpus is not None:
                attempt.gpus = list(self.queue.capacity.gpus.by_job.get(job.id, []))
            if attempt.gpus:
                attempt.meter = Meter.start(attempt.gpus, self.inventory, time.time())
            self.active[job.id] = attempt
            # Queued now, so it joins the commit of whatever freed the capacity.
            attempt.started = self.store.write(
                lambda c, job_id=job.id, gpus=attempt.gpus: ops.start_attempt(
                    c, job_id, time.time(), gpus))
            attempt.task = asyncio.create_task(self._run_attempt(attempt))

    def _release(self, attempt: Attempt) -> None:
        for timer in attempt.timers:
            timer.cancel()
        if self.active.get(attempt.job.id) is attempt:
            del self.active[attempt.job.id]
            self.queue.stopping.discard(attempt.job.id)
            self._charge(attempt.request)
            self.queue.capacity.give(attempt.request)
            self._pass()

    async def _run_attempt(self, attempt: Attempt) -> None:
        job = attempt.job
        assert attempt.started is not None
        try:
            attempt.number = await attempt.started
            if attempt.stop_reason is not None:
                await self._finish(attempt, NeverStarted())
                return
            if attempt.lost is not None:  # its GPU broke before it was launched
                await self._finish(attempt, NeverStarted(attempt.lost))
                return
            if job.spec.source and attempt.number == 1:  # unpacking may take a while
                attempt.directory = await asyncio.to_thread(self.layout.prepare, job, 1)
            else:
                attempt.directory = self.layout.prepare(job, attempt.number)
            secret_values = (await self.store.job_secret_values(job.id)
                             if job.spec.secrets else {})
            if job.spec.image is not None:
                await self._run_container(attempt, secret_values)
                return
            try:
                attempt.shim_pid = await self.runtime.launch(
                    self.layout.launch_request(job, attempt.number, secret_values,
                                               self.gpu_env(attempt.gpus, False)))
            except SpawnError:
                log.exception("spawning job %s failed", job.name)
                state = await settled_inspect(attempt.directory)
                if not isinstance(state, Alive):
                    await self._finish(attempt, state)
                    return
                attempt.shim_pid = state.shim_pid
            attempt.running = True
            attempt.boot_id = self.runtime.boot_id
            now = time.time()
            # Not awaited here: the writer keeps order, so this commits before the end does.
            running = self.store.write(lambda c: ops.attempt_running(
                c, job.id, attempt.number, now, attempt.shim_pid, attempt.boot_id))
            await self._watch(attempt, now, running)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("supervising job %s failed", job.name)
            await self._give_up(attempt, f"the daemon could not run it: {exc}")

    async def _signal(self, attempt: Attempt, sig: int) -> bool:
        if attempt.job.spec.image is not None:
            if attempt.container_id is None or self.containers is None:
                return False  # not launched or not adopted yet
            return await self.containers.signal(attempt.container_id, sig)
        assert attempt.directory is not None
        return await self.runtime.signal_group(attempt.directory, sig)

    async def _give_up(self, attempt: Attempt, message: str) -> None:
        """End a job whose attempt broke in the daemon itself, so it is never left
        Starting or Running with nobody watching it."""
        job = attempt.job
        try:
            if attempt.running and attempt.directory is not None:
                await self._signal(attempt, signal.SIGKILL)
            if attempt.number:
                phase = AttemptPhase.LOST if attempt.running else AttemptPhase.NOT_STARTED
                outcome = ops.Outcome(phase, Phase.FAILED, Reason.START_FAILED, message)
                await self.store.write(lambda c: ops.finish_attempt(
                    c, job.id, attempt.number, outcome, time.time()))
            else:
                await self.store.write(lambda c: ops.fail_job(
                    c, job.id, time.time(), Reason.START_FAILED, message))
            if attempt.container_id is not None and self.containers is not None:
                await self.containers.remove(attempt.container_id)  # a kill may have failed
        except Exception:
            log.exception("recording the failure of job %s failed", job.name)
        finally:
            self._release(attempt)

    async def _watch(self, attempt: Attempt, started_at: float,
                     running: asyncio.Future[Any] | None = None) -> None:
        assert attempt.directory is not None
        if attempt.ended is not None:
            exited = attempt.ended
        else:
            assert attempt.shim_pid is not None
            exited = self.runtime.watch(attempt.directory, attempt.shim_pid)
        timeout = attempt.job.spec.timeout
        if attempt.lost is not None:  # its GPU broke while it was being launched
            await self._signal(attempt, signal.SIGKILL)
        if attempt.stop_reason is not None:
            await self._send_stop(attempt)
        elif timeout is not None:
            delay = max(0.0, started_at + timeout - time.time())
            attempt.timers.append(asyncio.get_running_loop().call_later(
                delay, lambda: asyncio.ensure_future(
                    self._request_stop(attempt, Reason.TIMEOUT))))
        await self._finish(attempt, await exited, running)

    async def _finish(self, attempt: Attempt, state: AttemptState,
                      running: asyncio.Future[Any] | None = None) -> None:
        job = attempt.job
        if attempt.lost is not None and not isinstance(state, NeverStarted):
            state = Vanished(attempt.lost)
        outcome = replace(outcome_of(state, attempt), cost=self.attempt_cost(attempt))
        if (outcome.attempt_phase == AttemptPhase.LOST and attempt.directory is not None
                and attempt.container_id is None):  # a container's go with its next attempt
            kill_leftovers(attempt.directory, attempt.shim_pid, attempt.boot_id)
        collected = []
        if isinstance(state, Exited) and job.spec.outputs:
            # Before the end is committed, so a wait() that returns finds them.
            collected = await asyncio.to_thread(self._collect, job)
        ended = self.store.write(lambda c: ops.finish_attempt(
            c, job.id, attempt.number, outcome, time.time(), collected))
        if outcome.job_phase == Phase.PENDING:
            # Back in the queue at its old place before its CPUs are handed on; any start
            # this allows is committed after the end above (the writer keeps order).
            self._enqueue(replace(job, phase=Phase.PENDING.value, reason=outcome.reason,
                                  attempts=attempt.number, cost=job.cost + outcome.cost,
                                  retries_used=job.retries_used + outcome.spend_retry))
        # The process is gone, so its CPUs go to the next job now: that job's start and this
        # end share one commit instead of waiting for each other.
        self._finishing.add(job.id)
        self._release(attempt)
        try:
            if running is not None:
                await running
            await ended
        finally:
            self._finishing.discard(job.id)
        if job.id in self._cancel_after:
            self._cancel_after.discard(job.id)
            try:
                fresh = await self.store.job_by_id(job.id)
                if fresh is not None and fresh.phase not in TERMINAL:
                    await self.cancel(fresh)
            except Exception:  # the end is recorded; only the late cancel failed
                log.exception("cancelling job %s after its end failed", job.name)
        if attempt.container_id is not None and self.containers is not None:
            await self.containers.remove(attempt.container_id)

    def _collect(self, job: JobRecord) -> list[Collected]:
        workspace = self.layout.workspace(job.id)
        collected = []
        for name, path in job.spec.outputs.items():
            try:
                out = self.blobs.collect(workspace, name, path, job.owner_uid)
            except Exception:  # one bad output never fails the job or the others
                log.exception("collecting output %s of job %s failed", name, job.name)
                continue
            if out is not None:
                collected.append(out)
        return collected
