"""The Slurm runtime: each attempt of a job in a cluster region is one batch job, submitted
with sbatch as the job's owner and tagged with a comment that names this daemon, the job
and the attempt (so a restarted daemon finds it); its payload is the shim (`shim.py --run`)
on the node, which writes logs and the exit record into the attempt directory on the file
system the nodes share. One squeue read a poll for every job says which are queued, which
run and which ended; Slurm's end state covers what no exit record says (a lost node, a
cancel before the start, the memory limit).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import math
import os
import shutil
import signal as signals
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from noduslocal.daemon.config.live import LiveSettings
from noduslocal.daemon.config.regions import SlurmRegion
from noduslocal.daemon.files.layout import JobLayout
from noduslocal.daemon.runtime import shim
from noduslocal.daemon.runtime.attempt_dir import read_exit
from noduslocal.daemon.runtime.base import (
    LOG_FILES,
    AttemptRef,
    AttemptState,
    ExecResult,
    Exited,
    Handle,
    Launch,
    LaunchFailed,
    NeverStarted,
    NotLaunched,
    Rank,
    Vanished,
    rank_dir,
)
from noduslocal.daemon.runtime.shim_request import launch_request
from noduslocal.daemon.runtime.slurm import commands
from noduslocal.daemon.runtime.slurm.commands import (
    GpuCount,
    PartitionInfo,
    QueueEntry,
    SlurmError,
    sum_gpus,
)
from noduslocal.domain import errors
from noduslocal.domain.jobs import Diagnosis, JobRecord
from noduslocal.domain.timefmt import iso

log = logging.getLogger(__name__)
KIND = "slurm"
TAG = "noduslocal"
RECORD_GRACE = 10.0  # seconds an ended job's exit record may take to show on a shared fs
ADOPT_RETRY = 5.0  # seconds between tries to reach slurmctld while adopting
# Slurm's states in which the batch script runs, or its node is being set up for it.
RUNS = frozenset({"RUNNING", "COMPLETING", "CONFIGURING", "STOPPED", "SIGNALING",
                  "STAGE_OUT"})
# sbatch's complaints that will not go away by trying again (the job asks for what the
# cluster does not have or allow): the job fails StartFailed with Slurm's words.
TRANSIENT = ("Unable to contact slurm controller", "Socket timed out", "Slurm temporarily",
             "Resource temporarily unavailable", "Connection refused")


def daemon_tag(data_dir: Path) -> str:
    """This daemon among all that may submit to one cluster: its host and data dir."""
    return hashlib.sha256(f"{socket.gethostname()}:{data_dir}".encode()).hexdigest()[:12]


@dataclass
class Watch:
    """A batch job this daemon waits on: what the last squeue said of it, and the futures
    the runner awaits (its start in Slurm, its end)."""

    job_id: int
    owner: str
    directory: Path
    running: asyncio.Future[float]
    ended: asyncio.Future[AttemptState]
    entry: QueueEntry | None = None
    stopping: bool = False  # we cancelled or signalled it
    ended_at: float | None = None  # when Slurm first said it ended without an exit record
    started: float | None = None
    notes: list[str] = field(default_factory=list)


class SlurmRuntime:
    kind = KIND

    def __init__(self, live: LiveSettings, layout: JobLayout, data_dir: Path,
                 max_log: Callable[[], int]) -> None:
        self.live = live
        self.layout = layout
        self.prefix = f"{TAG}:{daemon_tag(data_dir)}:"
        self._shim_dir = data_dir / "slurm"
        self._shim: Path | None = None
        self._max_log = max_log
        self._watches: dict[int, Watch] = {}
        self._poller: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self.unreachable: str | None = None  # why the last squeue failed, while it does
        self._closing = False

    # --- the protocol ------------------------------------------------------------------

    def wait_reason(self) -> str | None:
        return None if self.unreachable is None else f"Slurm unreachable: {self.unreachable}"

    def queue_reason(self, handles: list[Handle]) -> str | None:
        for handle in handles:
            watch = self._watches.get(int(handle.ref))
            if watch is None or watch.running.done():
                continue
            entry = watch.entry
            if entry is None:
                return f"submitted to Slurm as job {watch.job_id}"
            why = f"queued in Slurm ({entry.reason or entry.state}), job {watch.job_id} on " \
                  f"partition {entry.partition}"
            if entry.start is not None:
                why += f", expected to start by {iso(entry.start.timestamp())}"
            return why
        return None

    async def launch(self, launch: Launch) -> list[Rank]:
        ref = launch.ref
        job = ref.job
        region = self._region(job)
        if job.spec.gang is not None or job.spec.indexed is not None:
            raise LaunchFailed("gangs and indexed jobs do not run in a cluster region yet")
        directory = ref.directory
        comment = self._comment(job.id, ref.number)
        await asyncio.to_thread(self._prepare, job, launch, directory)
        script = self._script(region, directory)
        options = self._options(job, region, comment, directory)
        try:
            job_id = await commands.submit(job.owner, script, options,
                                           env=self._tool_env(job))
        except SlurmError as exc:
            if not self._transient(exc):
                raise LaunchFailed(f"Slurm refused the job: {exc.stderr.strip() or exc}") \
                    from None
            # sbatch may have reached slurmctld all the same: never twice, so look first.
            found = await self._find(comment)
            if found is None:
                raise NotLaunched(NeverStarted(f"Slurm did not answer ({exc})",
                                               certain=True)) from None
            job_id = found
        log.info("job %s: attempt %d submitted to region %s as Slurm job %d", job.name,
                 ref.number, region.name, job_id)
        return [self._watch(job, directory, job_id)]

    async def adopt(self, launch: Launch, recorded: list[Handle], recorded_running: bool,
                    stopping: bool) -> list[Rank] | AttemptState:
        ref = launch.ref
        job = ref.job
        ids = [int(h.ref) for h in recorded if h.runtime == KIND]
        while True:
            try:
                job_id = ids[0] if ids else await self._find(
                    self._comment(job.id, ref.number))
                break
            except SlurmError as exc:  # slurmctld away: the attempt waits for it
                self.unreachable = str(exc)
                log.warning("job %s: cannot ask Slurm about its attempt (%s); trying again",
                            job.name, exc)
                await asyncio.sleep(ADOPT_RETRY)
        if job_id is None:  # never submitted (the daemon died before sbatch answered)
            exited = await asyncio.to_thread(read_exit, ref.directory)
            return exited if exited is not None else NeverStarted()
        rank = self._watch(job, ref.directory, job_id)
        self._watches[job_id].stopping = stopping
        return [rank]

    async def signal(self, ref: AttemptRef, handle: Handle, sig: int) -> bool:
        job_id = int(handle.ref)
        watch = self._watches.get(job_id)
        if watch is not None:
            watch.stopping = True
        queued = watch is None or not watch.running.done()
        try:
            if sig == signals.SIGKILL or queued:  # a queued job has nothing to signal
                await commands.cancel(ref.job.owner, job_id)
            else:
                await commands.cancel(ref.job.owner, job_id,
                                      signal=signals.Signals(sig).name.removeprefix("SIG"),
                                      full=True)
        except SlurmError as exc:
            log.warning("job %s: scancel of Slurm job %d failed: %s", ref.job.name, job_id,
                        exc)
            return False
        self._wake.set()
        return True

    async def clear_lost(self, ref: AttemptRef, handles: list[Handle]) -> None:
        for handle in handles:
            with contextlib.suppress(SlurmError):
                await commands.cancel(ref.job.owner, int(handle.ref))

    async def release(self, ref: AttemptRef, handles: list[Handle]) -> None:
        for handle in handles:
            self._watches.pop(int(handle.ref), None)
        with contextlib.suppress(FileNotFoundError):  # never started: its secrets go
            (ref.directory / shim.REQUEST).unlink()

    async def exec(self, launch: Launch, handle: Handle, command: list[str],
                   timeout: float) -> ExecResult:
        raise errors.Unsupported("exec", "beside a job in a cluster region")

    def log_path(self, directory: Path, stream: str, rank: int = 0) -> Path:
        return rank_dir(directory, rank) / LOG_FILES[stream]

    async def diagnose(self, gpus: bool) -> list[Diagnosis]:
        del gpus
        found = []
        for name, region in sorted(self.live.current.regions.items()):
            ok = await commands.ping()
            found.append(Diagnosis(
                f"region {name}", ok,
                f"Slurm answers (scontrol ping){self._where(region)}" if ok else
                "slurmctld does not answer `scontrol ping` (or Slurm's tools are missing): "
                "jobs of this region wait"))
        return found

    async def regions(self) -> list[dict[str, Any]]:
        found = []
        for name, region in sorted(self.live.current.regions.items()):
            doc: dict[str, Any] = {
                "name": name, "runtime": KIND, "partition": region.partition,
                "account": region.account, "qos": region.qos,
                "max_submitted_per_user": region.max_submitted_per_user,
                "reachable": True, "error": None, "partitions": [], "gpus": {}}
            try:
                partitions = await commands.cluster_info(region.partition)
            except SlurmError as exc:
                doc.update(reachable=False, error=str(exc))
            else:
                doc["partitions"] = [_partition_doc(p) for p in partitions]
                doc["gpus"] = _gpus_doc(sum_gpus(p.gpus for p in partitions))
            found.append(doc)
        return found

    async def close(self) -> None:
        self._closing = True
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller

    # --- submitting ----------------------------------------------------------------------

    def _region(self, job: JobRecord) -> SlurmRegion:
        region = self.live.current.regions.get(job.spec.region or "")
        if region is None:
            raise LaunchFailed(f"region {job.spec.region!r} is not configured any more")
        return region

    def _comment(self, job_id: int, number: int) -> str:
        return f"{self.prefix}{job_id}:{number}"

    @staticmethod
    def _where(region: SlurmRegion) -> str:
        return f"; partition {region.partition}" if region.partition else ""

    def _prepare(self, job: JobRecord, launch: Launch, directory: Path) -> None:
        """The attempt directory handed to the owner (the shim writes there as them, on a
        node), and the shim's request in it, readable by the owner alone."""
        self._install_shim()
        request = launch_request(self.layout, job, launch.ref.number, launch.secrets,
                                 directory=directory)
        for key in ("uid", "gid", "groups"):
            request.pop(key, None)
        request["max_log"] = self._max_log()
        if os.geteuid() == 0:
            os.chown(directory, job.owner_uid, job.owner_gid)
        path = directory / shim.REQUEST
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600)
        try:
            if os.geteuid() == 0:
                os.fchown(fd, job.owner_uid, job.owner_gid)
            os.write(fd, json.dumps(request).encode())
            os.fsync(fd)
        finally:
            os.close(fd)

    def _install_shim(self) -> None:
        """shim.py where every node reads it: beside the jobs, named by its content."""
        if self._shim is not None and self._shim.exists():
            return
        source = Path(shim.__file__)
        digest = hashlib.sha256(source.read_bytes()).hexdigest()[:12]
        self._shim_dir.mkdir(mode=0o755, exist_ok=True)
        os.chmod(self._shim_dir, 0o755)
        target = self._shim_dir / f"shim-{digest}.py"
        if not target.exists():
            tmp = self._shim_dir / f".{target.name}.{os.getpid()}.tmp"
            shutil.copyfile(source, tmp)
            os.chmod(tmp, 0o644)
            os.rename(tmp, target)
        self._shim = target

    def _script(self, region: SlurmRegion, directory: Path) -> str:
        assert self._shim is not None
        return (f"#!/bin/sh\n# noduslocal: the attempt's shim runs the job and records its "
                f"exit in {directory}\nexec {region.python} -I -S {self._shim} --run "
                f"{directory}\n")

    def _options(self, job: JobRecord, region: SlurmRegion, comment: str,
                 directory: Path) -> list[str]:
        spec = job.spec
        options = [f"--job-name={job.name}", f"--comment={comment}", "--output=/dev/null",
                   "--error=/dev/null", f"--chdir={directory}", "--export=NONE",
                   "--nodes=1", "--ntasks=1",
                   # Slurm's own requeue (JobRequeue=1 by default, on a node's failure)
                   # would run the attempt a second time behind the daemon's back: a lost
                   # node is a lost attempt, retried by the job's `retries`.
                   "--no-requeue",
                   f"--cpus-per-task={max(1, math.ceil(spec.cpu_m / 1000))}"]
        if spec.memory:
            options.append(f"--mem={max(1, math.ceil(spec.memory / 2**20))}M")
        if spec.timeout is not None:
            # Slurm's limit is the backstop only: the daemon stops it at its timeout (and
            # says Timeout) before Slurm would, grace and a minute later.
            limit = spec.timeout + self.live.current.kill_grace + 60
            options.append(f"--time={math.ceil(limit / 60)}")
        if spec.gpu is not None:
            gres = region.gres_type(spec.gpu.model)
            options.append(f"--gpus-per-node={gres + ':' if gres else ''}{spec.gpu.count}")
        for flag, value in (("partition", region.partition), ("account", region.account),
                            ("qos", region.qos)):
            if value:
                options.append(f"--{flag}={value}")
        return options

    @staticmethod
    def _tool_env(job: JobRecord) -> dict[str, str]:
        """What sbatch runs with (the job gets none of it: --export=NONE)."""
        return {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8",
                "USER": job.owner, "LOGNAME": job.owner}

    @staticmethod
    def _transient(exc: SlurmError) -> bool:
        return exc.returncode is None or any(word in exc.stderr for word in TRANSIENT)

    async def _find(self, comment: str) -> int | None:
        entries = await commands.queue(comment)
        return next((e.job_id for e in entries.values() if e.comment == comment), None)

    # --- watching ------------------------------------------------------------------------

    def _watch(self, job: JobRecord, directory: Path, job_id: int) -> Rank:
        loop = asyncio.get_running_loop()
        watch = self._watches.get(job_id)
        if watch is None:
            watch = Watch(job_id, job.owner, directory, loop.create_future(),
                          loop.create_future())
            self._watches[job_id] = watch
        if self._poller is None or self._poller.done():
            self._poller = asyncio.create_task(self._poll(), name="slurm-poll")
        self._wake.set()
        return Rank(Handle(KIND, str(job_id), 0, job.spec.region), time.time(),
                    watch.ended, watch.running)

    def _interval(self) -> float:
        regions = self.live.current.regions.values()
        return min((r.poll for r in regions), default=1.0)

    async def _poll(self) -> None:
        while not self._closing:
            if self._watches:
                try:
                    entries = await commands.queue(self.prefix)
                except SlurmError as exc:
                    if self.unreachable is None:
                        log.warning("reading Slurm's queue failed (%s); its jobs are kept "
                                    "as they were until it answers", exc)
                    self.unreachable = str(exc)
                else:
                    if self.unreachable is not None:
                        log.info("Slurm answers again")
                    self.unreachable = None
                    for watch in list(self._watches.values()):
                        await self._update(watch, entries.get(watch.job_id))
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._interval())
            if not self._watches:
                await self._wake.wait()

    async def _update(self, watch: Watch, entry: QueueEntry | None) -> None:
        if watch.ended.done():
            return
        if entry is not None:
            watch.entry = entry
        if entry is not None and not entry.ended:
            if entry.state in RUNS and not watch.running.done():
                started = entry.start.timestamp() if entry.start else time.time()
                watch.running.set_result(started)
            return
        exited = await asyncio.to_thread(read_exit, watch.directory)
        state: AttemptState | None = exited
        if exited is not None:
            if entry is not None and entry.state == "OUT_OF_MEMORY":
                state = Exited(exited.exit_code, exited.signal, exited.started_at,
                               exited.ended_at, oom_killed=True)
            elif entry is not None and entry.state == "CANCELLED" and not watch.stopping:
                # scancel by its owner or an admin, past noduslocal: the command's signal
                # alone would read as the job's own failure.
                how = f"killed by signal {exited.signal}" if exited.signal else \
                    f"exit code {exited.exit_code}"
                state = Vanished(f"Slurm job {watch.job_id} was cancelled outside "
                                 f"noduslocal (scancel); its command ended with {how}")
        else:
            # On a shared file system the record may show a moment after Slurm's end.
            now = time.time()
            if watch.ended_at is None:
                watch.ended_at = now
            if now - watch.ended_at < RECORD_GRACE:
                return
            if entry is None:
                fallback = await self._show(watch.job_id)
                state = self._without_record(watch, fallback)
            else:
                state = self._without_record(watch, {"JobState": entry.state,
                                                     "NodeList": entry.nodes})
        if not watch.running.done() and isinstance(state, Exited):
            watch.running.set_result(state.started_at)
        watch.ended.set_result(state)

    async def _show(self, job_id: int) -> dict[str, str] | None:
        try:
            return await commands.show_job(job_id)
        except SlurmError:
            return None

    @staticmethod
    def _without_record(watch: Watch, shown: dict[str, str] | None) -> AttemptState:
        """What the attempt became when its shim recorded no exit: Slurm's word for it."""
        if shown is None:
            return Vanished(f"Slurm has no record of job {watch.job_id} any more, and its "
                            f"shim recorded no exit")
        state = shown.get("JobState", "UNKNOWN").split()[0]
        ran = watch.running.done()
        now = time.time()
        started = watch.running.result() if ran else now
        if state == "OUT_OF_MEMORY":
            return Exited(137, 9, started, now, oom_killed=True)
        if state == "PREEMPTED":
            return NeverStarted(f"Slurm preempted job {watch.job_id}; no retry is spent",
                                certain=True)
        if state == "CANCELLED":
            if watch.stopping:
                return Exited(137, 9, started, now) if ran else NeverStarted(
                    f"Slurm job {watch.job_id} cancelled before it started", certain=True)
            return Vanished(f"Slurm job {watch.job_id} was cancelled outside noduslocal")
        if state in ("NODE_FAIL", "BOOT_FAIL"):
            return Vanished(f"Slurm lost node {shown.get('NodeList') or '?'} of job "
                            f"{watch.job_id} ({state})")
        if state == "TIMEOUT":
            return Exited(143, 15, started, now)
        return Vanished(f"Slurm says job {watch.job_id} ended {state}, but its shim recorded "
                        f"no exit (does every node see {watch.directory}?)")


def _gpus_doc(gpus: dict[str, GpuCount]) -> dict[str, dict[str, int]]:
    return {kind or "any": {"total": c.total, "used": c.used, "free": c.free}
            for kind, c in sorted(gpus.items())}


def _partition_doc(partition: PartitionInfo) -> dict[str, Any]:
    return {
        "name": partition.name, "default": partition.default, "state": partition.state,
        "gpus": _gpus_doc(partition.gpus),
        "nodes": [{"name": n.name, "state": n.state, "usable": n.usable, "cpus": n.cpus,
                   "cpus_used": n.cpus_used, "memory": n.memory_mb * 2**20,
                   "memory_used": n.memory_used_mb * 2**20, "gpus": _gpus_doc(n.gpus),
                   "reason": n.reason} for n in partition.nodes]}
