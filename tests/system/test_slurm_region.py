"""Issue 26: a Slurm cluster as a region, against the real two-node cluster of
scripts/slurm-cluster.sh (n1, n2, two fake GPUs each): jobs and sweeps run there as their
owner with the same CLI, phases, logs and exit codes; a job waiting in Slurm's queue says
Slurm's reason; kills leave nothing in Slurm; a daemon killed -9 adopts its Slurm jobs.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from noduslocal import testing
from noduslocal.daemon.runtime.slurm.runtime import TAG, daemon_tag
from noduslocal.domain.sockets import SOCKET_ENV
from noduslocal.domain.states import TERMINAL
from noduslocal.testing import wait_until
from tests.conftest import SlurmCluster
from tests.system.lab import DEADLINE, Box, open_box

pytestmark = [pytest.mark.root, pytest.mark.slurm]

# Users of their own: scripts/test.sh runs this module beside the other system tests,
# whose multi-user box has nlalice and nlbob.
ALICE, BOB = "nlsalice", "nlsbob"


@pytest.fixture(scope="module")
def lab(slurm_cluster: SlurmCluster) -> Iterator[Box]:
    # A long kill grace: a stop's TERM must end a job by itself, not the KILL after it.
    with open_box(config='kill_grace = "120s"\n' + slurm_cluster.config, names=(ALICE, BOB),
                  keep_group=True) as box:
        yield box


@pytest.fixture(autouse=True)
def _daemon_back(request: pytest.FixtureRequest) -> Iterator[None]:
    """The module's daemon running again after a test that killed it and failed before
    starting it: else every test after that one fails too, for no fault of its own."""
    box: Box | None = request.getfixturevalue("lab") if "lab" in request.fixturenames else None
    yield
    if box is not None and box.daemon.proc is None:
        box.daemon.start()


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"exit {result.returncode}:\n{result.stdout}{result.stderr}"
    return result.stdout


def status(lab: Box, user: str, name: str) -> dict[str, Any]:
    return json.loads(ok(lab.cli(user, "job", "status", name, "--json")))


def wait_phase(lab: Box, user: str, name: str, phases: set[str],
               timeout: float = DEADLINE) -> dict[str, Any]:
    found: dict[str, Any] = {}

    def reached() -> bool:
        found.update(status(lab, user, name))
        return found["phase"] in phases

    wait_until(reached, f"{name} never reached {phases}: {found}", timeout)
    return found


def ours(lab: Box, cluster: SlurmCluster) -> list[list[str]]:
    """The Slurm jobs this test's daemon submitted that squeue still lists as not ended."""
    prefix = f"{TAG}:{daemon_tag(lab.daemon.data_dir)}:"
    return [row for row in cluster.queue() if row[3].startswith(prefix)
            and row[1] not in ("COMPLETED", "CANCELLED", "FAILED", "TIMEOUT")]


def fill_cluster(cluster: SlurmCluster) -> list[str]:
    """Both nodes taken by exclusive sleeping jobs submitted with sbatch directly."""
    ids = [ok(subprocess.run(["sbatch", "--parsable", "--exclusive", "--nodes=1",
                              "--output=/dev/null", "--comment=filler", "--wrap", "sleep 300"],
                             capture_output=True, text=True, timeout=60)).strip()
           for _ in range(2)]
    wait_until(lambda: all(row[1] == "RUNNING" for row in cluster.queue()
                           if row[0] in ids), "the fillers never ran", DEADLINE)
    return ids


def test_a_job_runs_on_a_node_and_streams_its_output(lab: Box) -> None:
    done = lab.cli("root", "job", "run", "--region", "cluster", "--name", "where",
                   "--", "sh", "-c", "echo on $SLURMD_NODENAME")
    assert re.search(r"^on n[12]$", ok(done), re.M), done.stdout
    final = status(lab, "root", "where")
    assert final["phase"] == "Succeeded"
    assert final["spec"]["region"] == "cluster"


def test_exit_codes_and_slurm_s_gpus(lab: Box) -> None:
    failed = lab.cli("root", "job", "run", "--region", "cluster", "--", "sh", "-c", "exit 3")
    assert failed.returncode == 3, failed.stderr
    assert "exited with code 3" in failed.stderr
    gpus = ok(lab.cli("root", "job", "run", "--region", "cluster", "--gpus", "1", "--",
                      "sh", "-c", "echo visible=$CUDA_VISIBLE_DEVICES"))
    assert re.search(r"^visible=[0-9]$", gpus, re.M), gpus


def test_a_second_user_s_job_runs_as_them_and_leaves_no_request(lab: Box) -> None:
    """runuser -u OWNER -- sbatch: the job has the owner's uid, group and HOME; the shim's
    request (which could hold secrets) is gone once it ran; another user cannot read the
    job's logs."""
    alice = lab.user(ALICE)
    out = ok(lab.cli(ALICE, "job", "run", "--region", "cluster", "--name", "who", "--",
                     "sh", "-c", "echo uid=$(id -u) gid=$(id -g) home=$HOME"))
    assert f"uid={alice.uid} gid={alice.gid} home={alice.home}" in out, out
    attempts = list(lab.daemon.data_dir.glob("jobs/*/cluster-*/request.json"))
    assert attempts == [], attempts
    denied = lab.cli(BOB, "job", "logs", "who", "-p", ALICE)
    assert denied.returncode != 0 and "who" not in denied.stdout


def test_a_gang_runs_one_rank_on_each_node(lab: Box) -> None:
    """One Slurm job over two nodes, a rank on each started by srun: MASTER_ADDR is the
    first node with a port chosen there, each rank's exit is recorded, logs by rank."""
    out = ok(lab.cli(ALICE, "job", "run", "--region", "cluster", "--name", "gang",
                     "--nodes", "2", "--gpus-per-node", "1", "--", "sh", "-c",
                     "echo rank $RANK of $WORLD_SIZE on $SLURMD_NODENAME at "
                     "$MASTER_ADDR:$MASTER_PORT gpu $CUDA_VISIBLE_DEVICES"))
    ranks = re.findall(r"^\[r(\d)\] rank (\d) of 2 on (n[12]) at (\S+):(\d+) gpu (\d)$",
                       out, re.M)
    assert sorted(r[0] for r in ranks) == ["0", "1"], out
    assert all(r[0] == r[1] for r in ranks), out
    assert {r[2] for r in ranks} == {"n1", "n2"}, out  # one rank on each node
    assert len({(r[3], r[4]) for r in ranks}) == 1, out  # one rendezvous for both
    both = ok(lab.cli(ALICE, "job", "logs", "gang", "--rank", "all"))
    assert "[r0] rank 0" in both and "[r1] rank 1" in both, both
    assert "rank 1 of 2" in ok(lab.cli(ALICE, "job", "logs", "gang", "--rank", "1"))

    failed = lab.cli(ALICE, "job", "run", "--region", "cluster", "--name", "gang-fails",
                     "--nodes", "2", "--", "sh", "-c", "[ $RANK = 1 ] && exit 3; sleep 300")
    assert failed.returncode == 3, failed.stderr  # rank 1's end stops rank 0
    doc = status(lab, ALICE, "gang-fails")
    assert doc["phase"] == "Failed" and doc["exit_code"] == 3, doc


def test_exec_runs_beside_a_rank_on_its_node_as_the_owner(lab: Box) -> None:
    alice = lab.user(ALICE)
    ok(lab.cli(ALICE, "job", "run", "--region", "cluster", "--name", "beside", "-d",
               "--nodes", "2", "--", "sleep", "300"))
    try:
        wait_phase(lab, ALICE, "beside", {"Running"})
        where = {}
        for rank in ("0", "1"):
            done = lab.cli(ALICE, "job", "exec", "beside", "--rank", rank, "--", "sh", "-c",
                           "echo $SLURMD_NODENAME $(id -u) $NODUS_JOB; exit 4")
            assert done.returncode == 4, done.stderr
            node, uid, job = done.stdout.split()
            assert (uid, job) == (str(alice.uid), "beside")
            where[rank] = node
        assert sorted(where.values()) == ["n1", "n2"], where
        denied = lab.cli(BOB, "job", "exec", "beside", "-p", ALICE, "--", "true")
        assert denied.returncode != 0 and "may not exec" in denied.stderr
    finally:
        lab.cli(ALICE, "job", "kill", "beside")


def test_an_indexed_job_is_one_job_array(lab: Box, slurm_cluster: SlurmCluster) -> None:
    """completions=4, parallelism=2: one sbatch --array=0-3%2; each task is told its index
    (NODUS_INDEX is SLURM_ARRAY_TASK_ID) and gets one index's GPU; logs and status by
    index; exec beside an index runs in its task."""
    ok(lab.cli(ALICE, "job", "run", "--region", "cluster", "--name", "array", "-d",
               "--completions", "4", "--parallelism", "2", "--gpus", "1", "--", "sh", "-c",
               "echo index $NODUS_INDEX task $SLURM_ARRAY_TASK_ID of $NODUS_COMPLETIONS "
               "gpus=$CUDA_VISIBLE_DEVICES; sleep 3"))
    wait_phase(lab, ALICE, "array", {"Running"})
    rows = ours(lab, slurm_cluster)
    ids = {row[0].split("_", 1)[0] for row in rows}
    assert len(ids) == 1, rows  # one Slurm job: the array
    running = [row for row in rows if row[1] == "RUNNING"]
    assert 1 <= len(running) <= 2, rows
    task = running[0][0].split("_", 1)[1]
    beside = lab.cli(ALICE, "job", "exec", "array", "--index", task, "--", "sh", "-c",
                     "echo $NODUS_INDEX $SLURM_JOB_ID $(id -u)")
    own = ok(subprocess.run(["squeue", "-h", "-j", running[0][0], "-o", "%A"],
                            capture_output=True, text=True, timeout=60)).strip()
    assert beside.stdout.split() == [task, own, str(lab.user(ALICE).uid)], \
        (beside.stdout, beside.stderr)
    final = wait_phase(lab, ALICE, "array", set(TERMINAL))
    assert final["phase"] == "Succeeded", final
    assert final["indexes"]["succeeded"] == 4, final["indexes"]
    for index in range(4):
        out = ok(lab.cli(ALICE, "job", "logs", "array", "--index", str(index)))
        assert re.search(rf"^index {index} task {index} of 4 gpus=[0-9]$", out, re.M), out
    assert ours(lab, slurm_cluster) == []


def test_an_index_that_fails_ends_the_array_and_stops_the_rest(
        lab: Box, slurm_cluster: SlurmCluster) -> None:
    """Index 1 exits 7: the job fails with its code, the array's running task is stopped
    and the waiting ones leave Slurm's queue."""
    ok(lab.cli(ALICE, "job", "run", "--region", "cluster", "--name", "array-fails", "-d",
               "--completions", "6", "--parallelism", "2", "--", "sh", "-c",
               "echo ran $NODUS_INDEX; [ $NODUS_INDEX = 1 ] && exit 7; sleep 300"))
    final = wait_phase(lab, ALICE, "array-fails", set(TERMINAL))
    assert (final["phase"], final["exit_code"]) == ("Failed", 7), final
    assert final["indexes"]["failed"] == [1], final["indexes"]
    wait_until(lambda: ours(lab, slurm_cluster) == [], "the array is still in squeue",
               DEADLINE)
    assert "ran 1" in ok(lab.cli(ALICE, "job", "logs", "array-fails", "--index", "1"))


def test_a_lost_index_is_retried_without_the_ones_that_succeeded(
        lab: Box, slurm_cluster: SlurmCluster) -> None:
    """Index 3's task is cancelled in Slurm behind the daemon's back: the attempt is lost,
    and its retry is an array of index 3 alone."""
    ok(lab.cli(ALICE, "job", "run", "--region", "cluster", "--name", "array-retry", "-d",
               "--completions", "4", "--parallelism", "2", "--retries", "1", "--", "sh", "-c",
               "echo ran $NODUS_INDEX in $NODUS_ATTEMPT; "
               "if [ $NODUS_INDEX = 3 ] && [ $NODUS_ATTEMPT = 1 ]; then sleep 300; fi"))

    def index_3_runs() -> bool:
        return any(row[0].endswith("_3") and row[1] == "RUNNING"
                   for row in ours(lab, slurm_cluster))

    wait_until(index_3_runs, "index 3 never ran", DEADLINE)
    task = next(row[0] for row in ours(lab, slurm_cluster) if row[0].endswith("_3"))
    subprocess.run(["scancel", task], check=True, timeout=60)
    final = wait_phase(lab, ALICE, "array-retry", set(TERMINAL))
    assert final["phase"] == "Succeeded" and final["attempts"] == 2, final
    assert final["indexes"]["succeeded"] == 4, final["indexes"]
    # The only indexed job of this module with a second attempt: which indexes each ran.
    [second] = lab.daemon.data_dir.glob("jobs/*/attempt-2/indexes.json")
    first = second.parent.parent / "attempt-1" / "indexes.json"
    assert [sorted(json.loads(j.read_text())["slots"]) for j in (first, second)] == [
        ["0", "1", "2", "3"], ["3"]]
    assert "ran 3 in 2" in ok(lab.cli(ALICE, "job", "logs", "array-retry", "--index", "3"))
    assert "ran 0 in 1" in ok(lab.cli(ALICE, "job", "logs", "array-retry", "--index", "0"))


def test_killing_an_array_leaves_nothing_in_slurm(lab: Box, slurm_cluster: SlurmCluster
                                                   ) -> None:
    ok(lab.cli(BOB, "job", "run", "--region", "cluster", "--name", "array-kill", "-d",
               "--completions", "5", "--parallelism", "1", "--", "sleep", "300"))
    wait_phase(lab, BOB, "array-kill", {"Running"})
    ok(lab.cli(BOB, "job", "kill", "array-kill"))
    final = wait_phase(lab, BOB, "array-kill", set(TERMINAL))
    assert final["phase"] in ("Cancelled", "Failed"), final
    wait_until(lambda: ours(lab, slurm_cluster) == [], "the array is still in squeue",
               DEADLINE)


def test_a_daemon_killed_during_an_array_adopts_it(lab: Box) -> None:
    ok(lab.cli(ALICE, "job", "run", "--region", "cluster", "--name", "array-adopt", "-d",
               "--completions", "4", "--parallelism", "2", "--", "sh", "-c",
               "sleep 2; echo done $NODUS_INDEX"))
    wait_phase(lab, ALICE, "array-adopt", {"Running"})
    lab.daemon.kill()
    time.sleep(3)  # the first two end while no daemon watches
    lab.daemon.start()
    final = wait_phase(lab, ALICE, "array-adopt", set(TERMINAL))
    assert final["phase"] == "Succeeded" and final["attempts"] == 1, final
    assert final["indexes"]["succeeded"] == 4, final["indexes"]
    assert len(end_events(lab, "array-adopt", ALICE)) == 1
    assert "done 3" in ok(lab.cli(ALICE, "job", "logs", "array-adopt", "--index", "3"))


def test_a_job_cannot_make_the_daemon_read_through_a_link(lab: Box) -> None:
    """The job's owner can write its node directory (the shim on the node writes there as
    them): its logs swapped for links to a root-only file are not followed by the daemon,
    and the attempt directory beside it, where the daemon itself writes, is not theirs."""
    # The shim makes output.log on the job's first output and reads that output when it
    # is scheduled: made between the job's rm and its ln, the log stayed a file (the ln
    # failed) and the test failed once under load. So the swap waits for the log first.
    script = ("echo swapping; cd ../cluster-$NODUS_ATTEMPT-0 && i=0; "
              "while [ ! -e output.log ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done; "
              "for f in output.log stderr.log stdout.log; "
              "do rm -f $f; ln -s /etc/shadow $f; done; "
              "ln -s /etc/passwd ../attempt-$NODUS_ATTEMPT/merged.log 2>/dev/null "
              "&& echo PLANTED >&2; true")
    ok(lab.cli(BOB, "job", "run", "--region", "cluster", "--name", "links", "--",
               "sh", "-c", script))
    swapped = lab.daemon.data_dir.glob("jobs/*/cluster-*-0/output.log")
    assert any(p.is_symlink() for p in swapped), "the job did not swap its log"
    assert not any(p.is_symlink() for p in lab.daemon.data_dir.glob("jobs/*/attempt-*/*"))
    for extra in ((), ("--stderr",), ("--tail", "5")):
        logs = lab.cli(BOB, "job", "logs", "links", *extra)
        assert "root:" not in logs.stdout + logs.stderr, extra


def test_a_job_waiting_in_slurm_says_slurm_s_reason(lab: Box,
                                                    slurm_cluster: SlurmCluster) -> None:
    fillers = fill_cluster(slurm_cluster)
    try:
        ok(lab.cli("root", "job", "run", "--region", "cluster", "--name", "behind", "-d",
                   "--", "true"))
        seen: dict[str, Any] = {}

        def says_why() -> bool:
            seen.update(status(lab, "root", "behind"))
            return "queued in Slurm (" in (seen.get("hold") or "")

        wait_until(says_why, "Slurm's reason in the job's hold", DEADLINE)
        assert seen["phase"] == "Pending", seen
        assert re.search(r"queued in Slurm \((Resources|Priority)\), job \d+ on partition "
                         r"debug", seen["hold"]), seen["hold"]
        listed = ok(lab.cli("root", "job", "list"))
        assert re.search(r"behind .*queued in Slurm", listed), listed
        queue = ok(lab.cli("root", "queue"))
        assert re.search(r"cluster +behind .*queued in Slurm", queue), queue
        estimate = lab.daemon.client().estimate_job("behind", "root")
        assert "queued in Slurm" in estimate["start_basis"], estimate  # Slurm's, not ours
    finally:
        subprocess.run(["scancel", *fillers], check=False)
    assert wait_phase(lab, "root", "behind", set(TERMINAL))["phase"] == "Succeeded"


def test_kill_and_cancel_leave_nothing_in_slurm(lab: Box,
                                               slurm_cluster: SlurmCluster) -> None:
    # The job runs in a session of its own: the TERM of a cancel reaches it all the same
    # (it used to wait out the kill grace, then die by SIGKILL, its trap never run).
    ok(lab.cli(ALICE, "job", "run", "--region", "cluster", "--name", "graceful", "-d", "--",
               "sh", "-c", "trap 'echo got TERM; exit 0' TERM; echo ready; "
               "sleep 300 & wait"))
    wait_until(lambda: "ready" in lab.cli(ALICE, "job", "logs", "graceful").stdout,
               "the job's trap set", DEADLINE)
    # Running as the daemon sees it (a job it has not yet seen start is cancelled as a
    # queued one: scancel, whose TERM Slurm follows with KILL after KillWait).
    wait_phase(lab, ALICE, "graceful", {"Running"})
    ok(lab.cli(ALICE, "job", "cancel", "graceful"))
    assert wait_phase(lab, ALICE, "graceful", set(TERMINAL))["phase"] == "Cancelled"
    assert "got TERM" in ok(lab.cli(ALICE, "job", "logs", "graceful"))

    ok(lab.cli(ALICE, "job", "run", "--region", "cluster", "--name", "long", "-d", "--",
               "sleep", "300"))
    wait_phase(lab, ALICE, "long", {"Running"})
    assert ours(lab, slurm_cluster), "the running job is not in squeue"
    ok(lab.cli(ALICE, "job", "kill", "long"))
    assert wait_phase(lab, ALICE, "long", set(TERMINAL))["phase"] == "Cancelled"
    wait_until(lambda: not ours(lab, slurm_cluster), "the killed job is still in squeue",
               DEADLINE)

    fillers = fill_cluster(slurm_cluster)
    try:
        ok(lab.cli(ALICE, "job", "run", "--region", "cluster", "--name", "queued", "-d",
                   "--", "true"))
        wait_until(lambda: bool(ours(lab, slurm_cluster)), "never submitted", DEADLINE)
        ok(lab.cli(ALICE, "job", "cancel", "queued"))
        assert wait_phase(lab, ALICE, "queued", set(TERMINAL))["phase"] == "Cancelled"
        wait_until(lambda: not ours(lab, slurm_cluster),
                   "the cancelled queued job is still in squeue", DEADLINE)
    finally:
        subprocess.run(["scancel", *fillers], check=False)


def test_a_job_slurm_preempts_runs_again_without_spending_a_retry(lab: Box) -> None:
    """A job of the higher-priority partition "urgent" takes both nodes: ours, in "debug",
    is cancelled by Slurm (PREEMPTED) and queued again by the daemon, no retry spent."""
    ok(lab.cli(ALICE, "job", "run", "--region", "cluster", "--name", "preempted", "-d",
               "--", "sh", "-c", "echo attempt $NODUS_ATTEMPT; sleep 6"))
    wait_phase(lab, ALICE, "preempted", {"Running"})
    urgent = ok(subprocess.run(
        ["sbatch", "--parsable", "--partition=urgent", "--exclusive", "--nodes=2",
         "--output=/dev/null", "--wrap", "sleep 2"], capture_output=True, text=True,
        timeout=60)).strip()
    try:
        final = wait_phase(lab, ALICE, "preempted", set(TERMINAL), timeout=90)
    finally:
        subprocess.run(["scancel", urgent], check=False)
    assert final["phase"] == "Succeeded", final
    assert (final["attempts"], final["retries_used"]) == (2, 0), final
    attempts = json.loads(ok(lab.cli(ALICE, "job", "attempts", "preempted", "--json")))
    assert "preempted" in json.dumps(attempts[0] if isinstance(attempts, list) else attempts)
    assert "attempt 2" in ok(lab.cli(ALICE, "job", "logs", "preempted"))


def end_events(lab: Box, name: str, project: str) -> list[dict[str, Any]]:
    lines = ok(lab.cli("root", "events", "--job", name, "-p", project, "--json"))
    events = [json.loads(line) for line in lines.splitlines() if line.strip()]
    return [e for e in events if e.get("phase") in TERMINAL]


def test_a_daemon_killed_mid_job_adopts_it_and_records_its_end_once(lab: Box) -> None:
    ok(lab.cli(ALICE, "job", "run", "--region", "cluster", "--name", "adopted", "-d", "--",
               "sh", "-c", "sleep 2; echo finished; exit 5"))
    wait_phase(lab, ALICE, "adopted", {"Running"})
    lab.daemon.kill()
    time.sleep(3)  # the job ends while no daemon watches it
    lab.daemon.start()
    final = wait_phase(lab, ALICE, "adopted", set(TERMINAL))
    assert final["phase"] == "Failed" and final["exit_code"] == 5, final
    assert "finished" in ok(lab.cli(ALICE, "job", "logs", "adopted"))
    assert len(end_events(lab, "adopted", ALICE)) == 1

    ok(lab.cli(ALICE, "job", "run", "--region", "cluster", "--name", "adopted-running",
               "-d", "--", "sh", "-c", "sleep 4"))
    wait_phase(lab, ALICE, "adopted-running", {"Running"})
    lab.daemon.kill()
    lab.daemon.start()  # while the job still runs: watched again, ends once
    final = wait_phase(lab, ALICE, "adopted-running", set(TERMINAL))
    assert final["phase"] == "Succeeded", final
    assert len(end_events(lab, "adopted-running", ALICE)) == 1


def test_a_job_cancelled_in_slurm_while_the_daemon_was_away_ends_lost(
        lab: Box, slurm_cluster: SlurmCluster) -> None:
    ok(lab.cli(ALICE, "job", "run", "--region", "cluster", "--name", "gone", "-d", "--",
               "sleep", "300"))
    wait_phase(lab, ALICE, "gone", {"Running"})
    lab.daemon.kill()
    for row in ours(lab, slurm_cluster):
        subprocess.run(["scancel", row[0]], check=True)
    lab.daemon.start()
    final = wait_phase(lab, ALICE, "gone", set(TERMINAL), timeout=DEADLINE)
    assert (final["phase"], final["reason"]) == ("Failed", "Lost"), \
        (final["phase"], final["reason"], final["message"])
    assert "cancelled outside noduslocal" in (final.get("message") or ""), final["message"]


def test_a_job_slurm_forgot_while_the_daemon_was_away_ends_lost_saying_so(
        lab: Box, slurm_cluster: SlurmCluster) -> None:
    """The daemon is killed, and slurmctld loses its state (started with -c): the job's
    record is gone, and slurmd ends what ran without one. The restarted daemon says so."""
    ok(lab.cli(BOB, "job", "run", "--region", "cluster", "--name", "forgotten", "-d", "--",
               "sleep", "300"))
    wait_phase(lab, BOB, "forgotten", {"Running"})
    lab.daemon.kill()
    slurm_cluster.restart_controller(forget=True)
    lab.daemon.start()
    final = wait_phase(lab, BOB, "forgotten", set(TERMINAL))
    # slurmd kills every process of a step its controller forgot: the shim goes with its
    # job, and no exit is recorded (Lost, said so); or, on a loaded box, the shim outlives
    # the job by the instant it takes to record the kill's signal (seen once in CI), and
    # that record, the one truth left, is what the job ended with.
    if final["reason"] == "Signaled":
        assert final["phase"] == "Failed", final
        assert re.fullmatch(r"killed by signal (9|15) \(SIG(KILL|TERM)\)",
                            final.get("message") or ""), final
        return
    assert (final["phase"], final["reason"]) == ("Failed", "Lost"), final
    assert "no record of job" in (final.get("message") or ""), final["message"]


def test_a_restart_of_slurmctld_loses_nothing(lab: Box, slurm_cluster: SlurmCluster) -> None:
    ok(lab.cli(BOB, "job", "run", "--region", "cluster", "--name", "through", "-d", "--",
               "sh", "-c", "sleep 5; echo through"))
    wait_phase(lab, BOB, "through", {"Running"})
    slurm_cluster.restart_controller(down_for=3)
    final = wait_phase(lab, BOB, "through", set(TERMINAL))
    assert final["phase"] == "Succeeded", final
    assert "through" in ok(lab.cli(BOB, "job", "logs", "through"))


def test_a_sweep_in_the_cluster_and_one_over_both_regions(lab: Box, tmp_path: Path) -> None:
    out = ok(lab.cli("root", "map", "--region", "cluster", "--name", "csweep", "--no-code",
                     "--max-parallel", "4", "--json", "--",
                     "sh", "-c", "echo task {} on $SLURMD_NODENAME", ":::",
                     *[str(i) for i in range(10)], timeout=180))
    assert json.loads(out)["name"] == "csweep"
    ok(lab.cli("root", "sweep", "wait", "csweep", "--timeout", "150", timeout=180))
    report = json.loads(ok(lab.cli("root", "sweep", "status", "csweep", "--cells", "--json")))
    assert report["phase"] == "Succeeded", report
    cells = report["cell_list"]
    assert len(cells) == 10 and all(c["region"] == "cluster" for c in cells), cells
    table = ok(lab.cli("root", "sweep", "status", "csweep", "--cells"))
    assert re.search(r"csweep-7 .* cluster +Succeeded", table), table
    logs = ok(lab.cli("root", "job", "logs", "csweep-7"))
    assert re.search(r"task 7 on n[12]", logs), logs

    program = tmp_path / "mixed.py"
    program.write_text(
        "import noduslocal as nodus\n"
        "sweep = nodus.Sweep({'command': ['sh', '-c', 'echo at ${SLURMD_NODENAME:-box}'],\n"
        "                     'cpu': '100m'},\n"
        "                    grid={'region': ['local', 'cluster'], 'N': [1, 2]}).run()\n"
        "print(sweep.wait().phase)\n"
        "for cell in sweep.cells():\n"
        "    print(cell.region, cell.phase)\n")
    result = subprocess.run([sys.executable, str(program)], capture_output=True, text=True,
                            timeout=180, env={**os.environ, SOCKET_ENV: str(lab.daemon.socket)})
    lines = ok(result).splitlines()
    assert lines[0] == "Succeeded", result.stdout
    assert sorted(lines[1:]) == ["cluster Succeeded", "cluster Succeeded",
                                 "local Succeeded", "local Succeeded"], result.stdout


def test_what_a_cluster_cannot_do_is_refused_naming_field_and_region(lab: Box) -> None:
    refused = lab.cli("root", "job", "run", "--region", "cluster", "--image", "busybox",
                      "--", "true")
    assert refused.returncode == 2
    assert "image" in refused.stderr and "'cluster'" in refused.stderr
    unknown = lab.cli("root", "job", "run", "--region", "mars", "--", "true")
    assert unknown.returncode == 2 and "region" in unknown.stderr
    checks = json.loads(lab.cli("root", "doctor", "--json").stdout)
    region = [c for c in checks if c["name"] == "region cluster"]
    assert region and region[0]["ok"] and "probe job on n" in region[0]["detail"], region
    listed = json.loads(ok(lab.cli("root", "regions", "--json")))
    cluster = next(r for r in listed if r["name"] == "cluster")
    assert cluster["reachable"] and cluster["gpus"]["fake"]["total"] == 4, cluster
    nodes = {n["name"] for p in cluster["partitions"] for n in p["nodes"]}
    assert nodes == {"n1", "n2"}


README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_readme_s_cluster_section_runs_as_written(slurm_cluster: SlurmCluster) -> None:
    """Its config block is the daemon's config, and its shell and Python blocks run."""
    del slurm_cluster
    text = README.read_text()
    section = text[text.index("## A Slurm cluster as a region"):]
    if (end := section.find("\n## ", 1)) >= 0:
        section = section[:end]
    blocks = re.findall(r"^```(toml|sh|python)\n(.*?)^```", section, re.S | re.M)
    assert [kind for kind, _ in blocks] == ["toml", "sh", "python"], blocks
    config, shell, python = (code for _, code in blocks)
    with testing.daemon(cpus=2, memory="8GiB", config=config) as d:
        env = {**os.environ, SOCKET_ENV: str(d.socket),
               "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
        ran = subprocess.run(["bash", "-euo", "pipefail", "-c", shell], env=env,
                             capture_output=True, text=True, timeout=300)
        assert ran.returncode == 0, f"{ran.stdout[-4000:]}\n---\n{ran.stderr[-4000:]}"
        assert re.search(r"^on n[12]$", ran.stdout, re.M), ran.stdout
        assert re.search(r"^gpu [0-9]$", ran.stdout, re.M), ran.stdout
        assert re.search(r"^shard 3 of 4$", ran.stdout, re.M), ran.stdout
        assert re.search(r"^cluster +slurm +debug", ran.stdout, re.M), ran.stdout
        sdk = subprocess.run([sys.executable, "-c", python], env=env, capture_output=True,
                             text=True, timeout=300)
        assert sdk.returncode == 0 and sdk.stdout.strip() == "Succeeded", \
            f"{sdk.stdout[-4000:]}\n---\n{sdk.stderr[-4000:]}"
