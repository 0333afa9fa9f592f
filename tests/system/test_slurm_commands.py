"""runtime/slurm/commands.py against the two-node cluster of scripts/slurm-cluster.sh: sbatch,
squeue, scontrol and scancel run for real, as a second Unix user (nlslurmcmd) through runuser,
and what they print parsed. Needs root (it creates the user); skipped otherwise, except under
CI. Other tests share the cluster: every job here is small, tagged with a comment prefix of its
test's own, and cancelled when the test ends."""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import pytest

from noduslocal.daemon.runtime.slurm import commands
from noduslocal.daemon.runtime.slurm.commands import ExitCode, QueueEntry, SlurmError
from tests.conftest import SlurmCluster

pytestmark = [pytest.mark.root, pytest.mark.slurm]

OWNER = "nlslurmcmd"
# Beside other tests' jobs: a CPU and 100 MB each (without --mem a job takes a whole node's
# memory here), and a limit that ends a job a failed cleanup left behind.
SMALL = ("--cpus-per-task=1", "--mem=100", "--time=2")
LATER = "--begin=now+1hour"  # pending (BeginTime) for as long as the test needs
DEADLINE = 90.0  # seconds; generous, as other tests' jobs may hold the nodes for a while
T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def _unavailable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"the Slurm command tests cannot run under CI: {reason}")
    pytest.skip(reason)


@dataclass
class Owner:
    name: str
    uid: int
    gid: int
    home: str
    scratch: Path  # the owner's own directory (0700): job output, scripts, trap records


@pytest.fixture(scope="module")
def owner(slurm_cluster: SlurmCluster) -> Iterator[Owner]:
    if os.geteuid() != 0:
        _unavailable("needs root: creates a Unix user and runs Slurm's tools as it")
    for tool in ("useradd", "userdel", "runuser"):
        if shutil.which(tool) is None:
            _unavailable(f"{tool} is not installed")
    with contextlib.suppress(KeyError):  # left over from an interrupted run
        pwd.getpwnam(OWNER)
        subprocess.run(["userdel", "-r", OWNER], capture_output=True, check=False)
    subprocess.run(["useradd", "-m", OWNER], capture_output=True, check=True)
    scratch: Path | None = None
    try:
        entry = pwd.getpwnam(OWNER)
        scratch = Path(tempfile.mkdtemp(prefix="nl-slurmcmd-", dir="/tmp"))
        os.chown(scratch, entry.pw_uid, entry.pw_gid)
        yield Owner(OWNER, entry.pw_uid, entry.pw_gid, entry.pw_dir, scratch)
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
        subprocess.run(["userdel", "-r", OWNER], capture_output=True, check=False)


@dataclass
class Jobs:
    """The test's submissions as OWNER, each tagged with PREFIX and recorded for cleanup."""

    owner: Owner
    prefix: str
    ids: list[int] = field(default_factory=list)

    def submit(self, script: str | Path, *options: str, tag: str = "",
               env: dict[str, str] | None = None, comment: str | None = None) -> int:
        comment = self.prefix + tag if comment is None else comment
        job_id = run(commands.submit(
            self.owner.name, script,
            [f"--comment={comment}", f"--output={self.owner.scratch}/%j.out", *SMALL,
             *options], env=env))
        self.ids.append(job_id)
        return job_id

    def output(self, job_id: int) -> str:
        return (self.owner.scratch / f"{job_id}.out").read_text()

    def wait(self, job_id: int, done: Callable[[QueueEntry], bool], what: str,
             prefix: str | None = None) -> QueueEntry:
        deadline = time.monotonic() + DEADLINE
        while True:
            entry = run(commands.queue(self.prefix if prefix is None else prefix)).get(job_id)
            if entry is not None and done(entry):
                return entry
            if time.monotonic() > deadline:
                raise AssertionError(f"job {job_id}: timed out waiting for {what}; "
                                     f"last seen {entry}")
            time.sleep(0.2)

    def ended(self, job_id: int) -> QueueEntry:
        return self.wait(job_id, lambda e: e.ended, "its end")

    def running(self, job_id: int) -> QueueEntry:
        return self.wait(job_id, lambda e: e.state == "RUNNING", "it to run")


@pytest.fixture
def jobs(owner: Owner) -> Iterator[Jobs]:
    submitted = Jobs(owner, f"nlcmd-{secrets.token_hex(4)}-")
    try:
        yield submitted
    finally:
        # Root cancels what it recorded and whatever else carries the test's prefix (a
        # submission that failed after sbatch had reached slurmctld).
        ids = set(submitted.ids)
        with contextlib.suppress(SlurmError):
            ids |= set(run(commands.queue(submitted.prefix, ended=False)))
        if ids:
            subprocess.run(["scancel", *map(str, sorted(ids))], capture_output=True,
                           timeout=60, check=False)


def script(*lines: str) -> str:
    return "\n".join(["#!/bin/sh", *lines, ""])


# --- identity, queue, exit ------------------------------------------------------------------


def test_a_job_runs_as_its_owner_with_their_group_and_home(jobs: Jobs) -> None:
    me = jobs.owner
    report = 'echo "$(id -u) $(id -g) $HOME"'
    from_text = jobs.submit(script(report), tag="text")
    # A script file is read by sbatch as the owner.
    path = me.scratch / "report.sh"
    path.write_text(script(report))
    os.chown(path, me.uid, me.gid)
    os.chmod(path, 0o700)
    from_file = jobs.submit(path, tag="file")
    for job_id in (from_text, from_file):
        entry = jobs.ended(job_id)
        assert (entry.state, entry.exit, entry.user) == ("COMPLETED", ExitCode(0, 0), OWNER)
        # The test runs with root's HOME; the job has its owner's.
        assert jobs.output(job_id) == f"{me.uid} {me.gid} {me.home}\n"


def test_queue_filtered_by_a_comment_prefix_returns_only_ours(jobs: Jobs) -> None:
    others = f"nlcmd-{secrets.token_hex(4)}-"
    # A comment holding squeue's field separator and a line break stays one record.
    odd = "b\x1f1\x1fFAILED\nsecond line"
    first = jobs.submit(script("true"), LATER, tag="a")
    second = jobs.submit(script("true"), LATER, tag=odd)
    foreign = jobs.submit(script("true"), LATER, comment=others + "c")

    ours = run(commands.queue(jobs.prefix))
    assert sorted(ours) == sorted([first, second])
    assert ours[first].comment == jobs.prefix + "a"
    assert ours[second].comment == jobs.prefix + odd
    for entry in ours.values():
        assert (entry.state, entry.reason, entry.user) == ("PENDING", "BeginTime", OWNER)
        assert entry.partition == "debug" and entry.nodes == "" and entry.exit is None
        assert isinstance(entry.start, datetime)  # the --begin time
    assert sorted(run(commands.queue(others))) == [foreign]
    everyone = run(commands.queue())
    assert {first, second, foreign} <= set(everyone)


def test_an_exit_status_and_a_signal_after_the_job_ends(jobs: Jobs) -> None:
    exited = jobs.submit(script("exit 3"), tag="exit")
    killed = jobs.submit(script("kill -KILL $$"), tag="signal")

    entry = jobs.ended(exited)
    assert (entry.state, entry.reason, entry.exit) == ("FAILED", "NonZeroExitCode",
                                                       ExitCode(3, 0))
    assert entry.nodes in ("n1", "n2")
    signalled = jobs.ended(killed)
    assert signalled.state == "FAILED" and signalled.exit == ExitCode(0, 9)

    # Ended jobs are listed only when asked for.
    assert not {exited, killed} & set(run(commands.queue(jobs.prefix, ended=False)))

    # scontrol keeps them too (for MinJobAge).
    shown = run(commands.show_job(exited))
    assert shown is not None
    assert shown["JobId"] == str(exited) and shown["JobState"] == "FAILED"
    assert commands.parse_exit_code(shown["ExitCode"]) == ExitCode(3, 0)
    assert shown["UserId"] == f"{OWNER}({jobs.owner.uid})"
    assert shown["Comment"] == jobs.prefix + "exit"
    assert shown["NodeList"] == entry.nodes
    shown = run(commands.show_job(killed))
    assert shown is not None and shown["ExitCode"] == "0:9"
    assert run(commands.show_job(67_000_000)) is None  # an id Slurm never gave

    # Cancelling an ended job, with a signal or without, is quiet.
    run(commands.cancel(OWNER, exited))
    run(commands.cancel(OWNER, exited, signal="TERM", full=True))


# --- cancel ---------------------------------------------------------------------------------


def _gone_or_cancelled(jobs: Jobs, job_id: int) -> None:
    deadline = time.monotonic() + DEADLINE
    while True:
        entry = run(commands.queue(jobs.prefix)).get(job_id)
        if entry is None or entry.state == "CANCELLED":
            return
        assert time.monotonic() < deadline, f"job {job_id} not cancelled: {entry}"
        time.sleep(0.2)


def test_cancel_a_pending_and_a_running_job(jobs: Jobs) -> None:
    pending = jobs.submit(script("true"), LATER, tag="pending")
    running = jobs.submit(script("sleep 300"), tag="running")
    jobs.running(running)
    assert run(commands.queue(jobs.prefix))[pending].state == "PENDING"

    # Another user may not cancel them.
    with pytest.raises(SlurmError) as refused:
        run(commands.cancel("nobody", running))
    assert "scancel as nobody" in str(refused.value)

    run(commands.cancel(OWNER, pending))
    run(commands.cancel(OWNER, running))
    _gone_or_cancelled(jobs, pending)
    _gone_or_cancelled(jobs, running)
    run(commands.cancel(OWNER, running))  # again: quiet


def test_a_signal_with_full_reaches_the_batch_scripts_trap(jobs: Jobs) -> None:
    scratch = jobs.owner.scratch
    job_id = jobs.submit(script(
        f"trap 'echo trapped > {scratch}/trap-$SLURM_JOB_ID; exit 7' TERM",
        f"touch {scratch}/ready-$SLURM_JOB_ID",
        "while :; do sleep 0.1; done"), tag="trap")
    jobs.running(job_id)
    deadline = time.monotonic() + DEADLINE
    while not (scratch / f"ready-{job_id}").exists():  # the trap is set
        assert time.monotonic() < deadline, "the batch script did not start"
        time.sleep(0.05)

    run(commands.cancel(OWNER, job_id, signal="TERM", full=True))
    entry = jobs.ended(job_id)
    assert (entry.state, entry.exit) == ("FAILED", ExitCode(7, 0))
    assert (scratch / f"trap-{job_id}").read_text() == "trapped\n"


# --- the cluster ----------------------------------------------------------------------------


def test_cluster_info_and_ping() -> None:
    assert run(commands.ping()) is True
    partitions = {p.name: p for p in run(commands.cluster_info())}
    debug = partitions["debug"]
    assert debug.default and debug.state == "UP"
    assert [n.name for n in debug.nodes] == ["n1", "n2"]
    for node in debug.nodes:
        assert (node.cpus, node.memory_mb, node.partitions) == (4, 8000, ("debug", "urgent"))
        assert node.usable, node.state
        gpus = node.gpus["fake"]
        assert gpus.total == 2 and 0 <= gpus.used <= 2 and gpus.free == 2 - gpus.used
    assert debug.gpus["fake"].total == 4

    (only,) = run(commands.cluster_info("debug"))
    assert only.name == "debug" and [n.name for n in only.nodes] == ["n1", "n2"]
    with pytest.raises(SlurmError, match="scontrol"):
        run(commands.cluster_info("nonexistent"))


def test_the_cluster_script_leaves_a_config_it_would_not_change_untouched(
        slurm_cluster: SlurmCluster) -> None:
    """`slurm-cluster.sh up` on a running cluster rewrites no config file: a slurmctld
    started meanwhile (the tests' `slurmctld -c`, which forks and reads its config while
    `up` runs) once read slurm.conf truncated for rewriting, and died of an empty file."""
    files = [Path("/etc/slurm/slurm.conf"), Path("/etc/slurm/gres.conf")]
    before = [(f.stat().st_ino, f.stat().st_mtime_ns) for f in files]
    slurm_cluster.up()
    assert [(f.stat().st_ino, f.stat().st_mtime_ns) for f in files] == before
    assert not list(Path("/etc/slurm").glob(".*.new"))


def test_start_estimates_for_a_job_pending_behind_others(jobs: Jobs) -> None:
    # Both nodes taken whole for a minute at most; Slurm's backfill pass (every 30 s here)
    # then says when the job behind them starts.
    fill = [jobs.submit(script("sleep 120"), "--exclusive", "--time=1", tag=f"fill{i}")
            for i in range(2)]
    behind = jobs.submit(script("true"), "--time=1", tag="behind")
    deadline = time.monotonic() + DEADLINE
    while True:
        estimates = run(commands.start_estimates())
        if estimates.get(behind) is not None:
            break
        assert time.monotonic() < deadline, f"no start estimate for job {behind}: {estimates}"
        time.sleep(0.5)

    entry = run(commands.queue(jobs.prefix))[behind]
    assert entry.state == "PENDING"
    estimate = estimates[behind]
    assert estimate is not None and estimate.tzinfo is not None
    # squeue --start lists pending jobs only.
    queued = run(commands.queue(jobs.prefix))
    assert not {j for j in fill if queued[j].state == "RUNNING"} & set(estimates)


# --- the daemon's environment -------------------------------------------------------------


def test_the_daemons_slurm_variables_do_not_reach_the_tools(
        jobs: Jobs, monkeypatch: pytest.MonkeyPatch) -> None:
    polluted = {
        "SBATCH_PARTITION": "nonexistent",  # sbatch would refuse every job
        "SQUEUE_USERS": "root",  # squeue would hide the owner's jobs
        "SLURM_TIME_FORMAT": "relative",  # timestamps squeue prints would not parse
        "SLURM_JOB_ID": "1",  # as if the daemon had been started inside a Slurm job
        "SLURM_NODUSLOCAL_PROBE": "leaked",
    }
    # Each does what it says when a tool sees it (the test could not fail otherwise).
    control = subprocess.run(
        ["runuser", "-u", OWNER, "--", "sbatch", "--parsable", *SMALL, "--output=/dev/null",
         "--wrap=true"], env={**os.environ, **polluted}, capture_output=True, text=True,
        timeout=60, cwd="/")
    assert control.returncode != 0 and "invalid partition" in control.stderr.lower(), \
        control.stdout

    for name, value in {**polluted, "NODUSLOCAL_PROBE": "kept"}.items():
        monkeypatch.setenv(name, value)
    show = script("env | grep -E '^(SLURM_JOB_ID|SLURM_NODUSLOCAL_PROBE|NODUSLOCAL_PROBE"
                  "|SBATCH_PARTITION)=' | sort")
    inherited = jobs.submit(show, tag="inherited")  # sbatch gets the daemon's environment
    given = jobs.submit(show, tag="given", env={
        "PATH": "/usr/bin:/bin", "SBATCH_PARTITION": "nonexistent",
        "NODUSLOCAL_PROBE": "given"})

    listing = subprocess.run(["squeue", "--noheader", "--format=%i", "--states=all"],
                             env=dict(os.environ), capture_output=True, text=True, timeout=60)
    assert str(inherited) not in listing.stdout.split()  # SQUEUE_USERS at work

    for job_id, probe in ((inherited, "kept"), (given, "given")):
        entry = jobs.ended(job_id)
        assert (entry.state, entry.partition, entry.user) == ("COMPLETED", "debug", OWNER)
        assert isinstance(entry.start, datetime)
        assert jobs.output(job_id) == f"NODUSLOCAL_PROBE={probe}\nSLURM_JOB_ID={job_id}\n"
        shown = run(commands.show_job(job_id))
        assert shown is not None and shown["JobId"] == str(job_id)
    assert run(commands.ping()) is True
