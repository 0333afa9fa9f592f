"""Running Slurm's tools (sbatch, squeue, scontrol, scancel) as a job's owner, and parsing
their text output: the one place that knows their flags and formats. Text, never --json: in
22.05 `sacct --json` reports exit 0 for a job that exited 3 and `squeue --json` ignores filters.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import re
import secrets
import shutil
import signal as signals
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import NamedTuple

TIMEOUT = 60.0  # seconds; with slurmctld down a tool retries for 9-18 s before it says so

# Where the tools and runuser are looked for besides PATH (a daemon's PATH may lack sbin).
_SEARCH = ("/usr/local/bin", "/usr/bin", "/bin", "/usr/local/sbin", "/usr/sbin", "/sbin")

# Variables that change what the tools do: SBATCH_* set options, SQUEUE_FORMAT the output,
# SLURM_JOB_ID the job srun acts on, SLURM_TIME_FORMAT the timestamps. Never passed on.
_TOOL_VARIABLES = ("SLURM_", "SBATCH_", "SQUEUE_", "SINFO_", "SCANCEL_", "SCONTROL_",
                   "SALLOC_", "SRUN_")

# Between squeue's fields. Only the last field (the comment) is the user's free text, so
# only it could hold one; it is split off last and ends at a per-call random marker.
FIELD = "\x1f"

# Job states after which the job runs no more (COMPLETING still has processes to end).
ENDED = frozenset({"BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL",
                   "OUT_OF_MEMORY", "PREEMPTED", "TIMEOUT"})

# Node states and flags (scontrol's State=BASE+FLAG+...; a trailing * is "not responding")
# under which a node takes no new work.
_NODE_WORKS = frozenset({"IDLE", "MIXED", "ALLOCATED", "COMPLETING"})
_NODE_HALTS = frozenset({"DRAIN", "FAIL", "NOT_RESPONDING", "MAINT", "POWERED_DOWN",
                         "POWERING_DOWN", "REBOOT_ISSUED", "INVALID_REG"})


class SlurmError(Exception):
    """A Slurm tool failed, could not be run, or did not answer in time. `stderr` is what
    the tool said; the message names the tool and includes it."""

    def __init__(self, argv: Sequence[str], message: str, *, returncode: int | None = None,
                 stderr: str = "") -> None:
        super().__init__(message)
        self.argv = list(argv)
        self.returncode = returncode
        self.stderr = stderr


class ExitCode(NamedTuple):
    """A batch script's end: its exit status, or the signal that ended it (then code 0)."""

    code: int
    signal: int


@dataclass(frozen=True)
class QueueEntry:
    """One record of squeue: a job, an array task, or an array's tasks still pending."""

    job_id: int  # this record's own id (an array task gets one when it starts)
    array_job_id: int | None  # the array's id, for an array's records
    array_task: str | None  # "3" for one task; "4-9%2" for the tasks still pending together
    state: str  # PENDING, RUNNING, COMPLETING, COMPLETED, FAILED, TIMEOUT, ...
    reason: str | None  # why it waits or how it ended (Resources, Priority, NonZeroExitCode)
    nodes: str  # a hostlist expression ("n[1-2]"); "" while pending
    start: datetime | None  # when it started, or Slurm's estimate while pending
    exit: ExitCode | None  # once ended
    user: str
    partition: str
    comment: str

    @property
    def ended(self) -> bool:
        return self.state in ENDED

    @property
    def array_task_id(self) -> int | None:
        return int(self.array_task) if self.array_task and self.array_task.isdigit() else None


@dataclass(frozen=True)
class GpuCount:
    """GPUs of one gres type. `free` is total - used on a node that takes work, 0 on one
    that does not (down, drained, not responding); summed as such over a partition."""

    total: int
    used: int
    free: int


@dataclass(frozen=True)
class NodeInfo:
    name: str
    state: str  # as scontrol says it: IDLE, MIXED, ALLOCATED, DOWN*, IDLE+DRAIN, ...
    usable: bool  # takes new work
    partitions: tuple[str, ...]
    cpus: int
    cpus_used: int
    memory_mb: int
    memory_used_mb: int
    gpus: dict[str, GpuCount]  # by gres type ("" for GPUs configured without one)
    reason: str | None  # why it is down or drained, as the admin or Slurm wrote it


@dataclass(frozen=True)
class PartitionInfo:
    name: str
    default: bool
    state: str  # UP, DOWN, DRAIN, INACTIVE
    nodes: tuple[NodeInfo, ...]

    @property
    def gpus(self) -> dict[str, GpuCount]:
        return sum_gpus(node.gpus for node in self.nodes)


# --- the calls ----------------------------------------------------------------------------


async def submit(owner: str, script: Path | str, options: Sequence[str] = (), *,
                 env: Mapping[str, str] | None = None, timeout: float = TIMEOUT) -> int:
    """The job id of a batch job submitted by OWNER (a user name) with `sbatch --parsable
    OPTIONS`. SCRIPT is a file (a Path, which the owner must be able to read) or the script's
    text (a str, starting with #!). sbatch runs in /, so a job without --chdir starts there
    and one without --output writes slurm-<id>.out there. ENV is what sbatch runs with (and,
    under its default --export=ALL, what the job gets): the daemon's when None; Slurm's own
    variables are dropped from either."""
    args = ["--parsable", *options]
    text = None
    if isinstance(script, Path):
        args.append(str(script))
    elif script.startswith("#!"):
        text = script
    else:
        raise ValueError("a batch script's text starts with #! and an interpreter; "
                         "pass a file as a Path")
    out = await _run("sbatch", args, owner=owner, stdin=text, env=env, timeout=timeout)
    try:
        return parse_sbatch(out)
    except ValueError:
        raise SlurmError(["sbatch", *args], f"sbatch printed no job id: {out.strip()!r}",
                         returncode=0, stderr="") from None


async def queue(comment_prefix: str = "", *, ended: bool = True,
                timeout: float = TIMEOUT) -> dict[int, QueueEntry]:
    """Every job Slurm holds whose comment starts with COMMENT_PREFIX, by job id, from one
    squeue call over all users and partitions. With ENDED, also the jobs ended within
    MinJobAge, with their exit status (squeue's default lists only the live ones)."""
    end = _marker()
    args = ["--all", "--noheader", f"--Format={_queue_format(end)}"]
    if ended:
        args.append("--states=all")
    out = await _run("squeue", args, timeout=timeout)
    return parse_queue(out, end, comment_prefix)


async def show_job(job_id: int, task: int | None = None, *,
                   timeout: float = TIMEOUT) -> dict[str, str] | None:
    """`scontrol show job` of one job (or of task TASK of the array JOB_ID) as its keys and
    values (JobState, ExitCode "3:0", Reason, NodeList, BatchHost, ...); None once Slurm no
    longer knows it."""
    name = str(job_id) if task is None else f"{job_id}_{task}"
    try:
        out = await _run("scontrol", ["--oneliner", "show", "job", name], timeout=timeout)
    except SlurmError as exc:
        if "Invalid job id" in exc.stderr:
            return None
        raise
    return parse_show_job(out, job_id, task)


async def cancel(owner: str, job_id: int, signal: str | None = None, full: bool = False, *,
                 pending: bool = False, timeout: float = TIMEOUT) -> None:
    """scancel as OWNER: the job ends (SIGTERM, SIGKILL after KillWait) or, with SIGNAL, is
    sent that signal only (`--full`: the batch script too, not only its steps). PENDING:
    only what still waits in the queue ends (an array's tasks not started yet). Quiet for a
    job that has already ended."""
    args = [f"--signal={signal}"] if signal else []
    if full:
        args.append("--full")
    if pending:
        args.append("--state=PENDING")
    try:
        await _run("scancel", [*args, str(job_id)], owner=owner, timeout=timeout)
    except SlurmError as exc:
        # Without a signal scancel is quiet about an ended job; with one it fails, saying
        # so, or silently with exit 229 (ESLURM_ALREADY_DONE, 2021, as an exit status).
        if not (exc.returncode == _ALREADY_DONE or any(
                phrase in exc.stderr for phrase in _GONE)):
            raise


_ALREADY_DONE = 2021 & 0xFF
_GONE = ("Invalid job id specified", "already completing or completed")


async def start_estimates(*, timeout: float = TIMEOUT) -> dict[int, datetime | None]:
    """When Slurm expects each pending job to start (squeue --start; None while it has no
    estimate): the backfill pass sets them."""
    out = await _run("squeue", ["--start", "--all", "--noheader", f"--format=%A{FIELD}%S"],
                     timeout=timeout)
    return parse_start_estimates(out)


async def cluster_info(partition: str | None = None, *,
                       timeout: float = TIMEOUT) -> list[PartitionInfo]:
    """Each partition (or only PARTITION; an unknown one is a SlurmError) with its nodes,
    their state, CPUs, memory and GPUs by gres type, from two scontrol calls at once."""
    part_args = ["--oneliner", "show", "partition"] + ([partition] if partition else [])
    parts, nodes = await asyncio.gather(
        _run("scontrol", part_args, timeout=timeout),
        _run("scontrol", ["--oneliner", "--details", "show", "node"], timeout=timeout))
    return parse_cluster(parts, nodes)


async def ping(*, timeout: float = 15.0) -> bool:
    """Whether slurmctld answers (`scontrol ping`); False too when the tools are missing."""
    try:
        out = await _run("scontrol", ["ping"], timeout=timeout)
    except SlurmError:
        return False
    return " is UP" in out


# --- parsers (pure; tested against text captured from a real 22.05 cluster) ---------------


def parse_sbatch(text: str) -> int:
    """`sbatch --parsable`: "123", or "123;cluster" on a multi-cluster setup."""
    for line in text.splitlines():
        if line.strip():
            return int(line.strip().split(";", 1)[0])
    raise ValueError(f"no job id in {text!r}")


_QUEUE_FIELDS = ("JobID", "ArrayJobID", "ArrayTaskID", "State", "Reason", "NodeList",
                 "StartTime", "exit_code", "UserName", "Partition", "Comment")


def _queue_format(end: str) -> str:
    """squeue --Format: each field unpadded (size 0) and followed by FIELD, the last by END."""
    last = len(_QUEUE_FIELDS) - 1
    return ",".join(f"{name}:0{end if i == last else FIELD}"
                    for i, name in enumerate(_QUEUE_FIELDS))


def _marker() -> str:
    # A record separator nobody can put into a comment ahead of time: a job's comment is
    # its owner's text, and a forged record in it could speak for another user's job. It
    # starts with a control character: after a field's size, a digit would be read as size.
    return "\x1e" + secrets.token_hex(8)


def parse_queue(text: str, end: str, comment_prefix: str = "") -> dict[int, QueueEntry]:
    """squeue output in _queue_format(END): records end with END and a newline."""
    entries: dict[int, QueueEntry] = {}
    chunks = text.split(end)[:-1]  # the last is what follows the last record: its newline
    for i, chunk in enumerate(chunks):
        parts = (chunk.removeprefix("\n") if i else chunk).split(FIELD, len(_QUEUE_FIELDS) - 1)
        if len(parts) != len(_QUEUE_FIELDS):
            continue
        (job_id, array_job, array_task, state, reason, nodes, start, status, user,
         partition, comment) = parts
        comment = "" if comment == "(null)" else comment
        if not comment.startswith(comment_prefix) or not job_id.isdigit():
            continue
        in_array = array_task not in ("N/A", "")
        entries[int(job_id)] = QueueEntry(
            job_id=int(job_id),
            array_job_id=int(array_job) if in_array and array_job.isdigit() else None,
            array_task=array_task if in_array else None,
            state=state,
            reason=None if reason in ("None", "") else reason,
            nodes="" if nodes == "(null)" else nodes,
            start=parse_time(start),
            exit=decode_wait_status(status) if state in ENDED else None,
            user=user,
            partition=partition,
            comment=comment)
    return entries


def decode_wait_status(text: str) -> ExitCode | None:
    """squeue's exit_code: the batch script's raw wait status (768 = exit 3, 15 = SIGTERM)."""
    try:
        status = int(text)
    except ValueError:
        return None
    if os.WIFSIGNALED(status):
        return ExitCode(0, os.WTERMSIG(status))
    return ExitCode(os.WEXITSTATUS(status), 0)


def parse_exit_code(text: str) -> ExitCode | None:
    """scontrol's ExitCode "3:0" (exit status : signal)."""
    code, _, sig = text.partition(":")
    try:
        return ExitCode(int(code), int(sig or 0))
    except ValueError:
        return None


def parse_time(text: str) -> datetime | None:
    """A Slurm timestamp (local time, "2026-12-06T07:25:28") as an aware datetime; None for
    N/A, Unknown, None and the like."""
    try:
        return datetime.fromisoformat(text.strip()).astimezone()
    except ValueError:
        return None


# A key of scontrol's one-line records: a capitalised word after a space, which may hold
# "/", ":" and "_" (Socks/Node, AllocNode:Sid, ReqB:S:C:T). Values may hold spaces (OS=,
# Reason=, Command=) and "=" (TRES=cpu=1,mem=1000M); one with " Key=" in it would be cut
# there, so the first value of each key wins: the job's later free-text fields (Comment,
# Command, WorkDir, StdOut) cannot forge the state. JobName, before it, can (its owner may
# rename the job): only the owner's own job is fooled so, whose exit record the owner
# writes anyway; the runtime reads states from squeue's marked fields first.
_KEY = re.compile(r"(?:^|(?<=\s))([A-Z][A-Za-z0-9_/:]*)=")


def parse_keyvalues(line: str) -> dict[str, str]:
    """One record of `scontrol --oneliner show ...` as its keys and values."""
    found: dict[str, str] = {}
    matches = list(_KEY.finditer(line))
    for i, match in enumerate(matches):
        stop = matches[i + 1].start() if i + 1 < len(matches) else len(line)
        found.setdefault(match.group(1), line[match.end():stop].strip())
    return found


def _records(text: str, first_key: str) -> list[str]:
    """The records of a --oneliner listing: a line break counts only before FIRST_KEY=, so
    that a free-text value holding one stays in its record."""
    return [r for r in re.split(rf"\n(?={first_key}=)", text.strip()) if r.strip()]


def parse_show_job(text: str, job_id: int, task: int | None = None) -> dict[str, str] | None:
    """The record of JOB_ID in `scontrol --oneliner show job J` (an array's id lists all
    its tasks; its own record is the one with its id), or of task TASK of the array JOB_ID:
    the task's own record, or the array's record of the tasks that never started, whose
    ArrayTaskId is a range holding TASK."""
    for record in _records(text, "JobId"):
        fields = parse_keyvalues(record)
        if task is None:
            if fields.get("JobId") == str(job_id):
                return fields
        elif fields.get("ArrayJobId") == str(job_id) and task in array_tasks(
                fields.get("ArrayTaskId", "")):
            return fields
    return None


def array_tasks(text: str) -> set[int]:
    """The task ids of an array range as Slurm writes it ("3", "2-5%2", "[0,4-6:2]")."""
    tasks: set[int] = set()
    for part in text.strip("[]").split("%", 1)[0].split(","):
        span, _, step = part.partition(":")
        first, _, last = span.partition("-")
        try:
            tasks.update(range(int(first), int(last or first) + 1, int(step or 1)))
        except ValueError:
            continue
    return tasks


def array_spec(tasks: Iterable[int], at_once: int) -> str:
    """sbatch's --array for TASKS, at most AT_ONCE running: runs of ids as ranges
    ("0-3,7,9-12%2")."""
    ordered = sorted(set(tasks))
    runs: list[str] = []
    start = prev = ordered[0]
    for task in [*ordered[1:], None]:
        if task is not None and task == prev + 1:
            prev = task
            continue
        runs.append(str(start) if start == prev else f"{start}-{prev}")
        if task is not None:
            start = prev = task
    return f"{','.join(runs)}%{at_once}"


def parse_start_estimates(text: str) -> dict[int, datetime | None]:
    estimates: dict[int, datetime | None] = {}
    for line in text.splitlines():
        job_id, _, start = line.strip().partition(FIELD)
        if job_id.isdigit():
            estimates[int(job_id)] = parse_time(start)
    return estimates


def _split_gres(text: str) -> list[str]:
    """A gres list split at its top-level commas: "gpu:a:2(IDX:0,2),gpu:b:1"."""
    items, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char == "(":
            depth += 1
        elif char == ")":
            depth = max(depth - 1, 0)
        elif char == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    return [item.strip() for item in items if item.strip()]


def parse_gpus(text: str) -> dict[str, int]:
    """GPUs by gres type from a node's Gres= or GresUsed= ("gpu:fake:2", "gpu:2(S:0-1)",
    "gpu:fake:1(IDX:0)", "gpu:a100:2(IDX:0,2),shard:8"); other gres are left out."""
    counts: dict[str, int] = {}
    if text in ("", "(null)", "N/A"):
        return counts
    for item in _split_gres(text):
        parts = item.split("(", 1)[0].split(":")
        if parts[0] != "gpu":
            continue
        if len(parts) >= 3:
            kind, count = parts[1], parts[2]
        elif len(parts) == 2 and parts[1].isdigit():
            kind, count = "", parts[1]
        else:  # "gpu" or "gpu:TYPE": one
            kind, count = (parts[1] if len(parts) == 2 else ""), "1"
        try:
            counts[kind] = counts.get(kind, 0) + int(count)
        except ValueError:
            continue
    return counts


def node_usable(state: str) -> bool:
    """Whether a node in scontrol's STATE takes new work."""
    if state.endswith("*"):
        return False
    base, *flags = state.split("+")
    return base in _NODE_WORKS and not _NODE_HALTS.intersection(flags)


def _int(text: str | None) -> int:
    try:
        return int(text or 0)
    except ValueError:
        return 0


def parse_nodes(text: str) -> list[NodeInfo]:
    """`scontrol --oneliner --details show node` (--details adds GresUsed)."""
    nodes = []
    for record in _records(text, "NodeName"):
        f = parse_keyvalues(record)
        state = f.get("State", "UNKNOWN")
        usable = node_usable(state)
        total, used = parse_gpus(f.get("Gres", "")), parse_gpus(f.get("GresUsed", ""))
        gpus = {kind: GpuCount(count, used.get(kind, 0),
                               max(count - used.get(kind, 0), 0) if usable else 0)
                for kind, count in total.items()}
        partitions = f.get("Partitions", "")
        nodes.append(NodeInfo(
            name=f.get("NodeName", ""), state=state, usable=usable,
            partitions=tuple(p for p in partitions.split(",") if p),
            cpus=_int(f.get("CPUTot")), cpus_used=_int(f.get("CPUAlloc")),
            memory_mb=_int(f.get("RealMemory")), memory_used_mb=_int(f.get("AllocMem")),
            gpus=gpus, reason=f.get("Reason") or None))
    return nodes


def parse_cluster(partitions_text: str, nodes_text: str) -> list[PartitionInfo]:
    """`scontrol --oneliner show partition` joined with the nodes by each node's
    Partitions= (which spares expanding the partition's hostlist)."""
    nodes = parse_nodes(nodes_text)
    result = []
    for record in _records(partitions_text, "PartitionName"):
        f = parse_keyvalues(record)
        name = f.get("PartitionName", "")
        result.append(PartitionInfo(
            name=name, default=f.get("Default") == "YES", state=f.get("State", "UNKNOWN"),
            nodes=tuple(node for node in nodes if name in node.partitions)))
    return result


def sum_gpus(counts: Iterable[dict[str, GpuCount]]) -> dict[str, GpuCount]:
    total: dict[str, GpuCount] = {}
    for by_kind in counts:
        for kind, count in by_kind.items():
            before = total.get(kind, GpuCount(0, 0, 0))
            total[kind] = GpuCount(before.total + count.total, before.used + count.used,
                                   before.free + count.free)
    return total


# --- running a tool -----------------------------------------------------------------------


def _find(tool: str) -> str | None:
    path = os.pathsep.join([os.environ.get("PATH", ""), *_SEARCH])
    return shutil.which(tool, path=path)


PROBE_WAIT = 20  # seconds a doctor's probe may wait for a node before it says so


async def probe(path: Path, options: Sequence[str] = ()) -> str:
    """A one-task job (srun, as this daemon's user) that writes its node's name into PATH,
    which the caller then reads here: whether the nodes see this host's files. Waits at
    most PROBE_WAIT seconds for a node (--immediate). The node's name; SlurmError when it
    did not run."""
    await _run("srun", ["--immediate=" + str(PROBE_WAIT), "--nodes=1", "--ntasks=1",
                        "--time=1", "--mem=16", "--quiet", "--export=NONE",
                        "--job-name=noduslocal-probe", *options, "/bin/sh", "-c",
                        f'echo "$SLURMD_NODENAME" > "{path}"'],
               timeout=PROBE_WAIT + TIMEOUT)
    return path.read_text().strip()


def exec_argv(owner: str, job_id: int, node: int, cwd: str,
              command: Sequence[str]) -> list[str]:
    """A command run beside a running job, on its NODE-th node (a gang's rank), as OWNER:
    `srun --jobid --overlap` (one more step in the job's allocation, sharing its CPUs and
    GPUs rather than waiting for free ones), with the caller's environment exported."""
    srun = _find("srun")
    if srun is None:
        raise SlurmError(["srun"], "srun is not installed (Slurm's client tools are needed "
                                   "on this host)")
    return [*_as_owner(owner, "srun"), srun, f"--jobid={job_id}", "--overlap", "--nodes=1",
            "--ntasks=1", f"--relative={node}", "--export=ALL", f"--chdir={cwd}", "--quiet",
            "--", *command]


def exec_environment(env: Mapping[str, str]) -> dict[str, str]:
    """ENV without what would change what srun does (see _TOOL_VARIABLES)."""
    return _environment(env)


def tool_path(tool: str) -> str:
    """Where TOOL is on this submit host: the path a batch script uses on the nodes (a
    batch job's PATH is not the user's), which are taken to have Slurm where it is here."""
    return _find(tool) or tool


def _user_name() -> str:
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())


def _as_owner(owner: str | None, tool: str) -> list[str]:
    """The prefix that runs a tool as OWNER: runuser from root, nothing for ourselves. Never
    `sbatch --uid`, which keeps root's group and HOME."""
    me = _user_name()
    if owner is None or owner == me:
        return []
    if os.geteuid() != 0:
        raise SlurmError([tool], f"cannot run {tool} as {owner}: the daemon runs as {me}, "
                                 "not root")
    runuser = _find("runuser")
    if runuser is None:
        raise SlurmError([tool], f"cannot run {tool} as {owner}: runuser is not installed")
    return [runuser, "-u", owner, "--"]


def _environment(env: Mapping[str, str] | None) -> dict[str, str]:
    base = os.environ if env is None else env
    found = {k: v for k, v in base.items() if not k.startswith(_TOOL_VARIABLES)}
    # SLURM_CONF only says where the cluster's config is: a site may point the daemon
    # there, and every tool it runs (as whoever, with whatever env) must read that one.
    if conf := os.environ.get("SLURM_CONF"):
        found["SLURM_CONF"] = conf
    return found


async def _run(tool: str, args: Sequence[str], *, owner: str | None = None,
               stdin: str | None = None, env: Mapping[str, str] | None = None,
               timeout: float = TIMEOUT) -> str:
    """TOOL's stdout; a SlurmError carrying its stderr when it fails or takes too long."""
    path = _find(tool)
    if path is None:
        raise SlurmError([tool, *args], f"{tool} is not installed (Slurm's client tools are "
                                        "needed on this host)")
    argv = [*_as_owner(owner, tool), path, *args]
    who = f" as {owner}" if owner and owner != _user_name() else ""
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL if stdin is None else asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env=_environment(env), cwd="/", start_new_session=True)
    except OSError as exc:
        raise SlurmError(argv, f"cannot run {tool}{who}: {exc.strerror}") from exc
    try:
        out, err = await asyncio.wait_for(
            proc.communicate(None if stdin is None else stdin.encode()), timeout)
    except TimeoutError:
        raise SlurmError(argv, f"{tool}{who} did not answer within {timeout:g} s "
                               "(is slurmctld up?)") from None
    finally:
        if proc.returncode is None:  # timed out or cancelled: runuser and the tool with it
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signals.SIGKILL)
            await proc.wait()
    stdout, stderr = out.decode(errors="replace"), err.decode(errors="replace")
    if proc.returncode != 0:
        said = stderr.strip() or stdout.strip() or "no message"
        raise SlurmError(argv, f"{tool}{who} failed (exit {proc.returncode}): {said}",
                         returncode=proc.returncode, stderr=stderr)
    return stdout
