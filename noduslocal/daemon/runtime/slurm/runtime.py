"""The Slurm runtime: each attempt of a job in a cluster region is one batch job, submitted
with sbatch as the job's owner and tagged with a comment that names this daemon, the job
and the attempt (so a restarted daemon finds it); its payload is the shim (`shim.py --run`)
on the node, which writes logs and the exit record into its node directory
(`cluster-N-R/` beside the attempt directory, the only place there the owner may write: the
attempt directory stays the daemon's own, where it writes a gang's merged log) on the file
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
import shlex
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
    Preempted,
    Queued,
    Rank,
    Terminal,
    Vanished,
)
from noduslocal.daemon.runtime.exec_output import supervise
from noduslocal.daemon.runtime.launchers import RankPlan
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
STOPPED_GRACE = 1.0  # the same for a job we cancelled or killed
ADOPT_RETRY = 5.0  # seconds between tries to reach slurmctld while adopting
SUBMITTING = 8  # sbatch processes at once
PROBE_EVERY = 60.0  # seconds a doctor's probe job result stands for its region
SIGNAL_ONCE = 2.0  # seconds in which a signal for one more rank of a gang is not sent again
# Slurm's states in which the batch script runs, or its node is being set up for it.
RUNS = frozenset({"RUNNING", "COMPLETING", "CONFIGURING", "STOPPED", "SIGNALING",
                  "STAGE_OUT"})
# sbatch's complaints that will not go away by trying again (the job asks for what the
# cluster does not have or allow): the job fails StartFailed with Slurm's words.
TOOLS = ("sbatch", "squeue", "scancel", "scontrol", "sinfo", "srun", "runuser")
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
    comment: str  # the attempt's tag: a record under the id without it is not ours
    directory: Path
    running: asyncio.Future[float]
    ends: dict[int, asyncio.Future[AttemptState]]  # by rank: one, or a gang's
    entry: QueueEntry | None = None
    stopping: bool = False  # we cancelled or signalled it
    ended_at: float | None = None  # when Slurm first said it ended without an exit record
    sent: dict[int, float] = field(default_factory=dict)  # signal -> when we sent it
    # A job array (an indexed job's attempt): `ends` by index; each task's own job id once
    # it started, and since when each ended one has had no exit record.
    array: bool = False
    tasks: dict[int, int] = field(default_factory=dict)
    gone_since: dict[int, float] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        return all(end.done() for end in self.ends.values())


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
        self._probe_lock = asyncio.Lock()
        self._submitting = asyncio.Semaphore(SUBMITTING)
        self._probes: dict[str, tuple[float, Diagnosis]] = {}  # region -> (when, result)

    # --- the protocol ------------------------------------------------------------------

    def wait_reason(self) -> str | None:
        return None if self.unreachable is None else f"Slurm unreachable: {self.unreachable}"

    def queue_reason(self, handles: list[Handle]) -> Queued | None:
        for handle in handles:
            watch = self._watches.get(int(handle.ref))
            if watch is None or watch.running.done():
                continue
            entry = watch.entry
            if entry is None:
                return Queued(f"submitted to Slurm as job {watch.job_id}")
            why = f"queued in Slurm ({entry.reason or entry.state}), job {watch.job_id} on " \
                  f"partition {entry.partition}"
            start = entry.start.timestamp() if entry.start is not None else None
            if start is not None:
                why += f", expected to start by {iso(start)}"
            return Queued(why, start)
        return None

    async def launch(self, launch: Launch) -> list[Rank]:
        job = launch.ref.job
        if job.spec.indexed is not None:  # IndexedRun submits those with launch_array
            raise LaunchFailed("an indexed job runs in a Slurm region as one job array")
        region = self._region(job)
        ranks = list(_ranks(job))
        await asyncio.to_thread(self._prepare, launch, ranks)
        script = self._script(region, launch.ref.directory, job)
        options = self._options(job, region, self._comment(job.id, launch.ref.number),
                                launch.ref.directory)
        job_id = await self._submit(launch.ref, script, options, ranks)
        return self._watch(launch.ref, job_id, ranks)

    async def launch_array(self, launch: Launch, indexes: list[int]) -> list[Rank]:
        """An indexed job's attempt as one job array of INDEXES (the rest succeeded in an
        earlier attempt), at most `parallelism` running: each task is one index, which it
        learns from SLURM_ARRAY_TASK_ID; its rank is its index."""
        job = launch.ref.job
        indexed = job.spec.indexed
        assert indexed is not None
        region = self._region(job)
        directory = launch.ref.directory
        await asyncio.to_thread(self._prepare, launch, indexes)
        script = self._script(region, directory, job)
        options = self._options(job, region, self._comment(job.id, launch.ref.number),
                                directory)
        options.append(f"--array={commands.array_spec(indexes, indexed.parallelism)}")
        job_id = await self._submit(launch.ref, script, options, indexes)
        return self._watch(launch.ref, job_id, indexes, array=True)

    async def adopt_array(self, launch: Launch, indexes: list[int], recorded: list[Handle],
                          stopping: bool) -> list[Rank] | AttemptState:
        """After a restart: the job array of the attempt, watched for INDEXES (those whose
        end the journal lacks); NeverStarted when it was never submitted."""
        ref = launch.ref
        job = ref.job
        ids = [int(h.ref) for h in recorded if h.runtime == KIND]
        job_id = ids[0] if ids else await self._find_patiently(
            self._comment(job.id, ref.number), job.owner, job.name)
        if job_id is None:
            return NeverStarted()
        ranks = self._watch(ref, job_id, indexes, array=True)
        self._watches[job_id].stopping = stopping
        return ranks

    async def _submit(self, ref: AttemptRef, script: str, options: list[str],
                      ranks: list[int]) -> int:
        """The Slurm job id of the attempt submitted, or LaunchFailed, NotLaunched."""
        job = ref.job
        comment = self._comment(job.id, ref.number)
        try:
            # A few sbatch at once: one user's thousand released cells must not hold up
            # another's submission, nor flood slurmctld.
            async with self._submitting:
                job_id = await commands.submit(job.owner, script, options,
                                               env=self._tool_env(job))
        except SlurmError as exc:
            if not self._transient(exc):
                await asyncio.to_thread(self._forget_requests, ref.directory, ranks)
                said = exc.stderr.strip() or str(exc)
                if "array specification" in said:
                    said += " (an indexed job's indexes are array task ids: each must be " \
                            "below the cluster's MaxArraySize, `scontrol show config`)"
                raise LaunchFailed(f"Slurm refused the job: {said}") from None
            # sbatch may have reached slurmctld all the same: never twice, so look first,
            # for as long as Slurm does not answer (a job it took must not run unwatched).
            found = await self._find_patiently(comment, job.owner, job.name)
            if found is None:
                await asyncio.to_thread(self._forget_requests, ref.directory, ranks)
                raise NotLaunched(NeverStarted(f"Slurm did not answer ({exc})",
                                               certain=True)) from None
            job_id = found
        log.info("job %s: attempt %d submitted to region %s as Slurm job %d", job.name,
                 ref.number, job.spec.region, job_id)
        return job_id

    async def adopt(self, launch: Launch, recorded: list[Handle], recorded_running: bool,
                    stopping: bool) -> list[Rank] | AttemptState:
        ref = launch.ref
        job = ref.job
        ids = [int(h.ref) for h in recorded if h.runtime == KIND]
        job_id = ids[0] if ids else await self._find_patiently(
            self._comment(job.id, ref.number), job.owner, job.name)
        if job_id is None:  # never submitted (the daemon died before sbatch answered)
            exited = await asyncio.to_thread(read_exit, node_dir(ref.directory, 0))
            return exited if exited is not None else NeverStarted()
        ranks = self._watch(ref, job_id, list(_ranks(job)))
        self._watches[job_id].stopping = stopping
        return ranks

    async def signal(self, ref: AttemptRef, handle: Handle, sig: int) -> bool:
        job_id = int(handle.ref)
        watch = self._watches.get(job_id)
        if watch is not None:
            watch.stopping = True
            # A gang's ranks are one Slurm job: the signal for each rank is sent once
            # (once it was: a failed scancel is tried again at the next ask).
            if time.monotonic() - watch.sent.get(sig, -SIGNAL_ONCE) < SIGNAL_ONCE:
                return True
        queued = watch is None or not watch.running.done()
        try:
            if queued:  # nothing to signal: it leaves the queue
                await commands.cancel(ref.job.owner, job_id)
                return self._sent(watch, sig)
            if watch is not None and watch.array:
                # An array's tasks not started yet leave the queue, and the running ones
                # get the signal (one for the whole array would reach each waiting task
                # as it starts).
                await commands.cancel(ref.job.owner, job_id, pending=True)
            if sig == signals.SIGKILL:
                # KILL to every process at once (the shims ignore the TERM a plain scancel
                # sends first, and would hold the job for KillWait), then the job's end.
                await commands.cancel(ref.job.owner, job_id, signal="KILL", full=True)
                await commands.cancel(ref.job.owner, job_id)
            else:
                await commands.cancel(ref.job.owner, job_id,
                                      signal=signals.Signals(sig).name.removeprefix("SIG"),
                                      full=True)
        except SlurmError as exc:
            log.warning("job %s: scancel of Slurm job %d failed: %s", ref.job.name, job_id,
                        exc)
            return False
        return self._sent(watch, sig)

    def _sent(self, watch: Watch | None, sig: int) -> bool:
        if watch is not None:
            watch.sent[sig] = time.monotonic()
        self._wake.set()
        return True

    async def clear_lost(self, ref: AttemptRef, handles: list[Handle]) -> None:
        for handle in handles:
            with contextlib.suppress(SlurmError):
                await commands.cancel(ref.job.owner, int(handle.ref))

    async def release(self, ref: AttemptRef, handles: list[Handle]) -> None:
        for handle in handles:
            self._watches.pop(int(handle.ref), None)
        self._forget_requests(ref.directory, sorted({h.rank for h in handles}))

    @staticmethod
    def _forget_requests(directory: Path, ranks: list[int]) -> None:
        """The requests of ranks (indexes) that never started, with the secrets they hold."""
        for rank in ranks:
            with contextlib.suppress(FileNotFoundError):
                (node_dir(directory, rank) / shim.REQUEST).unlink()

    async def exec(self, launch: Launch, handle: Handle, command: list[str],
                   timeout: float) -> ExecResult:
        """Beside the rank on its node, as the owner, with the job's environment and
        workdir (secrets masked in what comes back). Not recorded for a later daemon as a
        host exec is: srun's step ends with its srun, and with the job."""
        job = launch.ref.job
        job_id = int(handle.ref)
        watch = self._watches.get(job_id)
        if watch is None or not watch.running.done() or watch.done:
            raise errors.Conflict(f"job {job.name!r} does not run in Slurm now; nothing to "
                                  f"exec beside")
        request = launch_request(self.layout, job, launch.ref.number, launch.secrets,
                                 directory=node_dir(launch.ref.directory, handle.rank),
                                 rank_env=launch.index_env())
        # An array's task is a job of its own, of one node.
        target, node = (watch.tasks.get(handle.rank), 0) if watch.array else \
            (job_id, handle.rank)
        if target is None:
            raise errors.Conflict(f"job {job.name!r}: its index {handle.rank} does not run "
                                  f"in Slurm now; nothing to exec beside")
        try:
            argv = commands.exec_argv(job.owner, target, node, request["cwd"], command)
            proc = await asyncio.create_subprocess_exec(
                *argv, env=commands.exec_environment(request["env"]), cwd="/",
                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, start_new_session=True)
        except (SlurmError, OSError) as exc:
            return ExecResult(126, "", f"noduslocal: cannot run srun: {exc}\n", False)
        return await supervise(proc, request["mask"], timeout)

    async def open_terminal(self, launch: Launch, handle: Handle, command: list[str],
                            rows: int, cols: int) -> Terminal:
        raise errors.Unsupported("pty", message="pty: `job exec -it` into a job in a Slurm "
                                                "region is not supported yet; run `job exec` "
                                                "without -it, or `srun --jobid --overlap "
                                                "--pty` as the job's owner")

    def log_path(self, directory: Path, stream: str, rank: int = 0) -> Path:
        if not directory.name.startswith("attempt-"):  # an index's own (index_place)
            return directory / LOG_FILES[stream]
        return node_dir(directory, rank) / LOG_FILES[stream]

    @staticmethod
    def index_place(directory: Path, index: int) -> str:
        """Where an index of the attempt in DIRECTORY runs, relative to it: its node
        directory beside it."""
        return os.path.relpath(node_dir(directory, index), directory)

    async def diagnose(self, gpus: bool) -> list[Diagnosis]:
        """Per region: Slurm's tools here, slurmctld answering, and a probe job on a node
        writing a file into the data dir that this host then reads (the nodes share it)."""
        del gpus
        found = []
        for name, region in sorted(self.live.current.regions.items()):
            missing = [tool for tool in TOOLS if shutil.which(commands.tool_path(tool)) is None]
            if missing:
                found.append(Diagnosis(f"region {name}", False, f"Slurm's tools are missing "
                                       f"here: {', '.join(missing)} (install slurm-client; "
                                       f"this host must be a submit host)"))
                continue
            if not await commands.ping():
                found.append(Diagnosis(f"region {name}", False, "slurmctld does not answer "
                                       "`scontrol ping`: jobs of this region wait"))
                continue
            found.append(await self._probe_once(name, region))
        return found

    async def _probe_once(self, name: str, region: SlurmRegion) -> Diagnosis:
        """A probe job at most once a PROBE_EVERY per region, one at a time: anyone may
        run doctor, and each probe is a job in the cluster submitted as the daemon's user."""
        async with self._probe_lock:
            last = self._probes.get(name)
            if last is not None and time.monotonic() - last[0] < PROBE_EVERY:
                return last[1]
            found = await self._probe(name, region)
            self._probes[name] = (time.monotonic(), found)
            return found

    async def _probe(self, name: str, region: SlurmRegion) -> Diagnosis:
        what = f"region {name}"
        self._shim_dir.mkdir(mode=0o755, exist_ok=True)
        path = self._shim_dir / f"probe-{os.getpid()}-{time.monotonic_ns()}"
        options = [f"--{flag}={value}" for flag, value in (
            ("partition", region.partition), ("account", region.account),
            ("qos", region.qos)) if value]
        try:
            node = await commands.probe(path, options)
        except SlurmError as exc:
            return Diagnosis(what, False, f"Slurm answers, but a probe job did not run "
                                          f"within {commands.PROBE_WAIT} s: {exc}")
        except OSError:
            return Diagnosis(what, False, f"a probe job ran, but its file {path} is not "
                             f"seen here: the nodes must share the data dir at this path")
        finally:
            with contextlib.suppress(OSError):
                path.unlink()
        return Diagnosis(what, True, f"Slurm answers, and a probe job on {node} wrote a file "
                                     f"this host read{self._where(region)}")

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

    def _prepare(self, launch: Launch, ranks: list[int]) -> None:
        """Each rank's node directory (an array's: each index's), the owner's, with its
        request in it, readable by the owner alone: a gang rank's rendezvous left for the
        nodes to fill in, an index told its index."""
        self._install_shim()
        job, number, directory = launch.ref.job, launch.ref.number, launch.ref.directory
        indexed = job.spec.indexed
        places = [node_dir(directory, rank) for rank in ranks]
        for rank, where in zip(ranks, places, strict=True):
            where.mkdir(mode=0o700, exist_ok=True)
            plan = None if job.spec.gang is None else RankPlan(
                job.spec.gang, rank, shim.MASTER_ADDR_TOKEN, shim.MASTER_PORT_TOKEN,
                shim.RANK_ADDR_TOKEN, job.id, number, one_host=False)
            request = launch_request(self.layout, job, number, launch.secrets, plan=plan,
                                     directory=where,
                                     rank_env=indexed.env(rank) if indexed else None)
            for key in ("uid", "gid", "groups"):
                request.pop(key, None)
            request["max_log"] = self._max_log()
            self._write_request(job, where / shim.REQUEST, request)
        if os.geteuid() == 0:  # each node directory once its request is in
            for where in places:
                os.chown(where, job.owner_uid, job.owner_gid)

    @staticmethod
    def _write_request(job: JobRecord, path: Path, request: dict[str, Any]) -> None:
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

    def _script(self, region: SlurmRegion, directory: Path, job: JobRecord) -> str:
        assert self._shim is not None
        head = (f"#!/bin/sh\n# noduslocal: the attempt's shim runs the job and records its "
                f"exit in {directory}\n")
        gang = job.spec.gang
        python, payload = shlex.quote(region.python), shlex.quote(str(self._shim))
        if job.spec.indexed is not None:  # a task of the array: its index's directory
            before, after = _node_template(directory).split("{rank}", 1)
            where = f'{shlex.quote(before)}"$SLURM_ARRAY_TASK_ID"{shlex.quote(after)}'
            return f"{head}exec {python} -I -S {payload} --run {where}\n"
        if gang is None:
            return (f"{head}exec {python} -I -S {payload} --run "
                    f"{shlex.quote(str(node_dir(directory, 0)))}\n")
        srun = shlex.quote(commands.tool_path("srun"))
        return (f"{head}exec {python} -I -S {payload} --gang "
                f"{shlex.quote(_node_template(directory))} {srun} {gang.nodes}\n")

    def _options(self, job: JobRecord, region: SlurmRegion, comment: str,
                 directory: Path) -> list[str]:
        spec = job.spec
        nodes = 1 if spec.gang is None else spec.gang.nodes
        options = [f"--job-name={job.name}", f"--comment={comment}", "--output=/dev/null",
                   "--error=/dev/null", f"--chdir={node_dir(directory, 0)}",
                   # ALL of sbatch's few variables (_tool_env), never NONE: in 22.05 NONE
                   # makes slurmd run the owner's login shell on the node before each job
                   # (up to 2 s; scripts/bench/slurm_region.py), and the shim builds the
                   # job's environment from its request anyway.
                   "--export=ALL",
                   f"--nodes={nodes}", "--ntasks-per-node=1",
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
        # An indexed job's GPUs are its `parallelism` indexes' together: a task gets one's.
        per_node = spec.gang.gpus_per_node if spec.gang is not None else \
            (spec.gpu.count // (spec.indexed.parallelism if spec.indexed else 1)
             if spec.gpu is not None else 0)
        if per_node:
            gres = region.gres_type(spec.gpu.model if spec.gpu is not None else None)
            options.append(f"--gpus-per-node={gres + ':' if gres else ''}{per_node}")
        for flag, value in (("partition", region.partition), ("account", region.account),
                            ("qos", region.qos)):
            if value:
                options.append(f"--{flag}={value}")
        return options

    @staticmethod
    def _tool_env(job: JobRecord) -> dict[str, str]:
        """What sbatch runs with, and so the batch script's environment (--export=ALL):
        the job gets none of it (its own comes from its request, Slurm's from the node)."""
        return {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8",
                "USER": job.owner, "LOGNAME": job.owner}

    @staticmethod
    def _transient(exc: SlurmError) -> bool:
        return exc.returncode is None or any(word in exc.stderr for word in TRANSIENT)

    async def _find_patiently(self, comment: str, owner: str, name: str) -> int | None:
        """_find, tried again while slurmctld is away (the attempt waits for it)."""
        while True:
            try:
                return await self._find(comment, owner)
            except SlurmError as exc:
                self.unreachable = str(exc)
                log.warning("job %s: cannot ask Slurm about its attempt (%s); trying again",
                            name, exc)
                await asyncio.sleep(ADOPT_RETRY)

    async def _find(self, comment: str, owner: str) -> int | None:
        """The owner's job with this comment: any user may set their own job's comment to
        another's tag (scontrol update), so the comment alone names nobody's attempt."""
        entries = await commands.queue(comment)
        return next((e.array_job_id or e.job_id for e in entries.values()
                     if e.comment == comment and e.user == owner), None)

    # --- watching ------------------------------------------------------------------------

    def _watch(self, ref: AttemptRef, job_id: int, ranks: list[int],
               array: bool = False) -> list[Rank]:
        loop = asyncio.get_running_loop()
        job = ref.job
        watch = self._watches.get(job_id)
        if watch is None:
            watch = Watch(job_id, job.owner, self._comment(job.id, ref.number),
                          ref.directory, loop.create_future(),
                          {rank: loop.create_future() for rank in ranks}, array=array)
            self._watches[job_id] = watch
        if self._poller is None or self._poller.done():
            self._poller = asyncio.create_task(self._poll(), name="slurm-poll")
        self._wake.set()
        now = time.time()
        return [Rank(Handle(KIND, str(job_id), rank, job.spec.region), now, end,
                     watch.running) for rank, end in watch.ends.items()]

    def _interval(self) -> float:
        regions = self.live.current.regions.values()
        return min((r.poll for r in regions), default=1.0)

    async def _poll(self) -> None:
        while not self._closing:
            if self._watches:
                watched = list(self._watches.values())  # a later one may not be listed yet
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
                    tasks = _array_tasks(entries)
                    for watch in watched:
                        entry = entries.get(watch.job_id)
                        if entry is not None and not _ours(watch, entry):
                            entry = None  # a reused id (slurmctld's state reset): not ours
                        try:
                            if watch.array:
                                await self._update_array(watch, entry, {
                                    index: task for index, task in tasks.get(
                                        watch.job_id, {}).items() if _ours(watch, task)})
                            else:
                                await self._update(watch, entry)
                        except Exception:  # one job's trouble never stops the others' poll
                            log.exception("Slurm job %d: reading its state failed",
                                          watch.job_id)
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._interval())
            if not self._watches:
                await self._wake.wait()

    async def _update(self, watch: Watch, entry: QueueEntry | None) -> None:
        if watch.done:
            return
        if entry is not None:
            watch.entry = entry
        if entry is not None and not entry.ended:
            watch.ended_at = None  # listed as live: any grace for its record starts over
            if entry.state in RUNS and not watch.running.done():
                started = entry.start.timestamp() if entry.start else time.time()
                watch.running.set_result(started)
            if len(watch.ends) > 1 and watch.running.done():
                # A gang's rank may end before the others: its record says so.
                for rank, end in watch.ends.items():
                    if not end.done() and (exited := await asyncio.to_thread(
                            read_exit, node_dir(watch.directory, rank))) is not None:
                        end.set_result(exited)
            return
        left = {rank: end for rank, end in watch.ends.items() if not end.done()}
        records = {rank: await asyncio.to_thread(read_exit, node_dir(watch.directory, rank))
                   for rank in left}
        fallback: AttemptState | None = None
        if any(record is None for record in records.values()):
            # On a shared file system a record may show a moment after Slurm's end.
            now = time.time()
            if watch.ended_at is None:
                watch.ended_at = now
            # One we stopped was most likely killed with its shim (scancel's SIGKILL), or
            # never ran: no record is coming, and a cancel should not take 10 s to show.
            if now - watch.ended_at < (STOPPED_GRACE if watch.stopping else RECORD_GRACE):
                return
            if entry is None:
                try:
                    shown = _shown_ours(watch, await commands.show_job(watch.job_id))
                except SlurmError:
                    return  # Slurm did not answer: asked again at the next poll
            else:
                shown = {"JobState": entry.state, "NodeList": entry.nodes}
            fallback = self._without_record(watch, shown, watch.running.done())
        state_now = entry.state if entry is not None else None
        for rank, end in left.items():
            record = records[rank]
            state: AttemptState
            if record is None:
                assert fallback is not None
                state = fallback
            else:
                state = self._with_record(watch, record, state_now)
            if not watch.running.done() and isinstance(state, Exited):
                watch.running.set_result(state.started_at)
            end.set_result(state)

    async def _update_array(self, watch: Watch, entry: QueueEntry | None,
                            tasks: dict[int, QueueEntry]) -> None:
        """A job array's indexes: TASKS, the records of the ones that started (by index);
        ENTRY, the array's own record, which stands for the tasks not started (pending, or
        cancelled before their start) unless it is itself one started task."""
        rest = entry if entry is not None and entry.array_task_id is None else None
        waiting = [t for t in tasks.values() if not t.ended]
        if rest is not None and not rest.ended:
            waiting.append(rest)
        queued = [t for t in waiting if t.state not in RUNS]
        watch.entry = queued[0] if queued else watch.entry
        now = time.time()
        for index, end in watch.ends.items():
            if end.done():
                continue
            task = tasks.get(index)
            if task is None and rest is not None and index in commands.array_tasks(
                    rest.array_task or ""):
                task = rest  # one of the tasks still waiting
            elif task is None and rest is not None and rest.ended and rest.array_task is None:
                task = rest  # the waiting ones were cancelled together (ArrayTaskID N/A)
            if task is not None and not task.ended:
                watch.gone_since.pop(index, None)
                if task.state in RUNS:
                    watch.tasks[index] = task.job_id
                    if not watch.running.done():
                        watch.running.set_result(task.start.timestamp() if task.start
                                                 else now)
                continue
            record = await asyncio.to_thread(read_exit, node_dir(watch.directory, index))
            if record is not None:
                state = self._with_record(watch, record, task.state if task else None)
            else:
                since = watch.gone_since.setdefault(index, now)
                if now - since < (STOPPED_GRACE if watch.stopping else RECORD_GRACE):
                    continue
                if task is not None:
                    shown: dict[str, str] | None = {"JobState": task.state,
                                                    "NodeList": task.nodes}
                else:
                    try:
                        shown = _shown_ours(watch, await commands.show_job(watch.job_id,
                                                                           index))
                    except SlurmError:
                        continue  # Slurm did not answer: asked again at the next poll
                state = self._without_record(watch, shown, index in watch.tasks, f"task "
                                             f"{index} of ")
            if not watch.running.done() and isinstance(state, Exited):
                watch.running.set_result(state.started_at)
            end.set_result(state)

    @staticmethod
    def _with_record(watch: Watch, exited: Exited, slurm_state: str | None) -> AttemptState:
        """A recorded exit, as Slurm's end state qualifies it (an exit 0 stands as it is)."""
        if exited.exit_code == 0 and exited.signal is None:
            return exited
        if slurm_state == "OUT_OF_MEMORY":
            return Exited(exited.exit_code, exited.signal, exited.started_at,
                          exited.ended_at, oom_killed=True)
        if slurm_state == "PREEMPTED":
            # Slurm took its nodes for other work: the command's signal is no failure of
            # its own (queued again, no retry spent).
            return Preempted(f"Slurm preempted job {watch.job_id}")
        if slurm_state == "CANCELLED" and not watch.stopping:
            # scancel by its owner or an admin, past noduslocal: the command's signal
            # alone would read as the job's own failure.
            how = f"killed by signal {exited.signal}" if exited.signal else \
                f"exit code {exited.exit_code}"
            return Vanished(f"Slurm job {watch.job_id} was cancelled outside noduslocal "
                            f"(scancel); its command ended with {how}")
        return exited

    @staticmethod
    def _without_record(watch: Watch, shown: dict[str, str] | None, ran: bool,
                        what: str = "") -> AttemptState:
        """What the attempt (WHAT: "task 3 of ", an array's index) became when its shim
        recorded no exit, Slurm's word for it; RAN: Slurm was seen to run it."""
        job = f"{what}job {watch.job_id}"
        if shown is None:
            return Vanished(f"Slurm has no record of {job} any more, and its shim recorded "
                            f"no exit")
        state = shown.get("JobState", "UNKNOWN").split()[0]
        now = time.time()
        started = watch.running.result() if watch.running.done() else now
        if state == "OUT_OF_MEMORY":
            return Exited(137, 9, started, now, oom_killed=True)
        if state == "PREEMPTED":
            return Preempted(f"Slurm preempted {job}") if ran else NeverStarted(
                f"Slurm preempted {job} before it started", certain=True)
        if state == "CANCELLED":
            if watch.stopping:
                return Exited(137, 9, started, now) if ran else NeverStarted(
                    f"Slurm {job} cancelled before it started", certain=True)
            return Vanished(f"Slurm {job} was cancelled outside noduslocal")
        if state in ("NODE_FAIL", "BOOT_FAIL"):
            return Vanished(f"Slurm lost node {shown.get('NodeList') or '?'} of {job} "
                            f"({state})")
        if state == "TIMEOUT":
            return Exited(143, 15, started, now)
        return Vanished(f"Slurm says {job} ended {state}, but its shim recorded "
                        f"no exit (does every node see {watch.directory}?)")


def node_dir(directory: Path, rank: int) -> Path:
    """Where rank RANK of the attempt in DIRECTORY keeps its request, pid and exit records
    and logs: the owner's directory beside the attempt's (shim.NODE_DIR), in the job's
    directory, which only the daemon may write."""
    return Path(_node_template(directory).format(rank=rank))


def _node_template(directory: Path) -> str:
    number = directory.name.removeprefix("attempt-")
    return str(directory.parent / shim.NODE_DIR.format(attempt=number, rank="{rank}"))


def _ours(watch: Watch, entry: QueueEntry) -> bool:
    """Whether a record under the watched id is the attempt's: its owner's, with its tag
    (after slurmctld lost its state, ids are given again, to anyone's jobs)."""
    return entry.user == watch.owner and entry.comment == watch.comment


def _shown_ours(watch: Watch, shown: dict[str, str] | None) -> dict[str, str] | None:
    """scontrol's record, if it is the attempt's (see _ours); None as for no record."""
    if shown is None or shown.get("Comment") != watch.comment or \
            shown.get("UserId", "").split("(", 1)[0] != watch.owner:
        return None
    return shown


def _array_tasks(entries: dict[int, QueueEntry]) -> dict[int, dict[int, QueueEntry]]:
    """The records of started array tasks, by array and index."""
    found: dict[int, dict[int, QueueEntry]] = {}
    for entry in entries.values():
        if entry.array_job_id is not None and entry.array_task_id is not None:
            found.setdefault(entry.array_job_id, {})[entry.array_task_id] = entry
    return found


def _ranks(job: JobRecord) -> range:
    return range(1 if job.spec.gang is None else job.spec.gang.nodes)


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
