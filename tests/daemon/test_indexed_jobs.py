"""Indexed jobs (`completions` indexes, at most `parallelism` at once) through a real daemon:
concurrency and GPU slots, per-index env, logs, outputs and exec, the first failing index
stopping the rest, kill -9 adoption, a lost attempt's retry, cancel, refusals. Indexes of
containers: tests/system/test_container_indexes.py.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import noduslocal as nodus
from noduslocal import testing
from noduslocal.domain import errors
from noduslocal.domain.states import TERMINAL
from noduslocal.sdk.api_client import ApiClient
from noduslocal.testing import process_gone, wait_until
from tests.conftest import run_cli

FOUR_GPUS = 'simulate_gpus = "4xH100"\n'
PY = sys.executable

# Each index notes "start I GPUS" and "end I GPUS" in the workspace's events.log under an
# flock; the first three wait (at most 30s) until three starts are noted, so the first
# three are known to run at once; then each writes out-I.txt.
RECORDER = r'''
import fcntl, os, time
i = os.environ["NODUS_INDEX"]
assert os.environ["JOB_COMPLETION_INDEX"] == i and os.environ["NODUS_COMPLETIONS"] == "10"
def note(word):
    with open("events.log", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.write(f"{word} {i} {os.environ.get('CUDA_VISIBLE_DEVICES', '')}\n")
        f.flush()
        fcntl.flock(f, fcntl.LOCK_UN)
def starts():
    with open("events.log") as f:
        return sum(line.startswith("start ") for line in f)
note("start")
deadline = time.monotonic() + 30
while int(i) < 3 and starts() < 3 and time.monotonic() < deadline:
    time.sleep(0.02)
time.sleep(0.05)
with open(f"out-{i}.txt", "w") as f:
    f.write(f"index {i}\n")
print("index", i, "done", flush=True)
note("end")
'''

# A marker per run ($MARKS/run-ATTEMPT-INDEX-PID) and out-INDEX.txt; indexes from $FROM
# on (in attempt 1 only, with $ONLY1 set) wait for $GATE.
GATED = ('touch "$MARKS/run-$NODUS_ATTEMPT-$NODUS_INDEX-$$"; '
         'echo "index $NODUS_INDEX up gpus=$CUDA_VISIBLE_DEVICES"; '
         'echo "i$NODUS_INDEX a$NODUS_ATTEMPT" > "out-$NODUS_INDEX.txt"; '
         'if [ "$NODUS_INDEX" -ge "$FROM" ] && { [ -z "$ONLY1" ] || [ "$NODUS_ATTEMPT" = 1 ]; };'
         ' then while [ ! -e "$GATE" ]; do sleep 0.05; done; fi; echo "index $NODUS_INDEX done"')


@pytest.fixture
def gpu_daemon() -> Iterator[testing.Daemon]:
    with testing.daemon(config=FOUR_GPUS) as d:
        yield d


def the_workspace(d: testing.Daemon) -> Path:
    """The workspace of the daemon's one job."""
    (found,) = d.data_dir.glob("jobs/*/workspace")
    return found


def attempt_dir(d: testing.Daemon, number: int) -> Path:
    """Attempt `number`'s directory of the daemon's one job."""
    (found,) = d.data_dir.glob(f"jobs/*/attempt-{number}")
    return found


def journal(d: testing.Daemon, number: int = 1) -> dict[str, dict[int, Any]]:
    """The attempt's indexes.json: which index started in which slot and how each ended."""
    path = attempt_dir(d, number) / "indexes.json"
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {"slots": {}, "ends": {}, "dirs": {}}
    return {key: {int(k): v for k, v in data.get(key, {}).items()}
            for key in ("slots", "ends", "dirs")}


def runs(marks: Path) -> list[tuple[int, int]]:
    """(attempt, index) of every run noted in `marks`."""
    found = []
    for path in marks.glob("run-*"):
        _, attempt, index, _ = path.name.split("-")
        found.append((int(attempt), int(index)))
    return sorted(found)


def gated_env(tmp_path: Path, start: int = 0, only_first_attempt: bool = False
              ) -> tuple[dict[str, str], Path, Path]:
    marks = tmp_path / "marks"
    marks.mkdir()
    gate = tmp_path / "gate"
    env = {"MARKS": str(marks), "GATE": str(gate), "FROM": str(start),
           **({"ONLY1": "1"} if only_first_attempt else {})}
    return env, marks, gate


def log_of(c: ApiClient, name: str, index: int | None = None) -> str:
    return b"".join(c.logs(name, index=index)).decode(errors="replace")


def running_indexes(c: ApiClient, name: str) -> list[int]:
    doc = c.get_job(name)
    return doc["indexes"]["running"] if doc["phase"] == "Running" else []


def test_parallelism_bounds_concurrency_and_each_index_has_its_gpu_and_output(
        gpu_daemon: testing.Daemon, tmp_path: Path) -> None:
    d = gpu_daemon
    c = d.client()
    uuids = {g["uuid"] for g in c.gpus()["gpus"]}
    assert len(uuids) == 4
    job = nodus.Job.create(name="ix", command=[PY, "-c", RECORDER], gpu=1, cpu="100m",
                           completions=10, parallelism=3, outputs={"o": "out-{index}.txt"})
    done = c.wait_job("ix", timeout=90)
    assert (done["phase"], done["exit_code"], done["attempts"]) == ("Succeeded", 0, 1), (
        done, d.log()[-3000:])
    assert done["spec"]["gpu"]["count"] == 3, done["spec"]
    assert (done["spec"]["completions"], done["spec"]["parallelism"]) == (10, 3)
    assert done["indexes"] == {"completions": 10, "parallelism": 3, "succeeded": 10,
                               "running": [], "failed": []}, done["indexes"]

    events = [line.split() for line in
              (the_workspace(d) / "events.log").read_text().splitlines()]
    running: dict[int, str] = {}
    most = 0
    for event in events:
        word, index, gpus = event[0], int(event[1]), event[2] if len(event) > 2 else ""
        assert len(gpus.split(",")) == 1 and gpus in uuids, event  # exactly one GPU
        if word == "start":
            assert index not in running, events
            assert gpus not in running.values(), (event, running)  # its own GPU (slot)
            running[index] = gpus
            most = max(most, len(running))
        else:
            assert running.pop(index) == gpus, events
    assert not running, events
    assert most == 3, events
    starts = [int(e[1]) for e in events if e[0] == "start"]
    assert sorted(starts) == list(range(10)), starts  # every index ran, once
    (attempt,) = c.attempts("ix")
    assert set(attempt["gpus"]) <= uuids and len(attempt["gpus"]) == 3, attempt
    assert {e[2] for e in events} <= set(attempt["gpus"]), (events, attempt)

    ends = journal(d)
    assert ends["ends"] == dict.fromkeys(range(10), 0), ends
    assert set(ends["slots"]) == set(range(10)) and set(ends["slots"].values()) == {0, 1, 2}

    listed = c.list_outputs("ix")
    assert sorted((o["name"], o["index"], o["path"], o["collected"]) for o in listed) == [
        ("o", i, f"out-{i}.txt", True) for i in range(10)], listed
    for index in range(10):
        got = job.outputs["o"].download(tmp_path / f"sdk-{index}.txt", index=index)
        assert got.read_text() == f"index {index}\n"
        assert f"index {index} done" in log_of(c, "ix", index)
    other = c.download_output("ix", None, "o", tmp_path / "client-7.txt", index=7)
    assert other.read_text() == "index 7\n"
    assert log_of(c, "ix") == log_of(c, "ix", 0)  # the default: index 0's
    with pytest.raises(errors.InvalidArgument) as info:
        log_of(c, "ix", 10)
    assert info.value.field == "index"


def test_the_first_failing_index_stops_the_rest_and_decides_the_end(
        tmp_path: Path) -> None:
    env, marks, _ = gated_env(tmp_path)
    # 0-3 succeed; 4 waits until 5 runs beside it, then exits 5; 5 and on wait forever.
    script = ('touch "$MARKS/run-$NODUS_ATTEMPT-$NODUS_INDEX-$$"; i=$NODUS_INDEX; '
              'if [ "$i" -lt 4 ]; then exit 0; fi; '
              'if [ "$i" = 4 ]; then while ! ls "$MARKS" | grep -q "^run-1-5-"; do sleep 0.02;'
              ' done; echo index 4 fails; exit 5; fi; '
              'echo index $i waits; while true; do sleep 0.05; done')
    with testing.daemon(config=None) as d:
        c = d.client()
        c.create_job({"name": "f", "command": ["sh", "-c", script], "cpu": "100m",
                      "env": env, "completions": 10, "parallelism": 2})
        done = c.wait_job("f", timeout=60)
        assert (done["phase"], done["exit_code"]) == ("Failed", 5), (done, d.log()[-3000:])
        assert [(a["number"], a["exit_code"]) for a in c.attempts("f")] == [(1, 5)]
        assert runs(marks) == [(1, i) for i in range(6)], runs(marks)  # 6-9 never started
        book = journal(d)
        assert set(book["slots"]) == set(range(6)), book
        assert book["ends"][4] == 5 and all(book["ends"][i] == 0 for i in range(4)), book
        assert book["ends"][5] in (143, -15), book  # stopped by SIGTERM
        assert "index 4 fails" in log_of(c, "f", 4)
        assert "index 5 waits" in log_of(c, "f", 5)
        assert done["indexes"]["running"] == [] and done["indexes"]["succeeded"] == 4, done
        # Index 5 was stopped because 4 failed: it did not fail itself.
        assert done["indexes"]["failed"] == [4], done["indexes"]


def gpus_of(log: str) -> set[str]:
    """The GPUs an index's `up` line named."""
    line = next(x for x in log.splitlines() if " up gpus=" in x)
    return set(filter(None, line.partition("gpus=")[2].split(",")))


@pytest.mark.parametrize("ended_while_down", [False, True], ids=["adopted", "ended-while-down"])
def test_kill9_mid_job_adopts_the_running_indexes_and_the_rest_go_on(
        gpu_daemon: testing.Daemon, tmp_path: Path, ended_while_down: bool) -> None:
    d = gpu_daemon
    c = d.client()
    env, marks, gate = gated_env(tmp_path, start=2)
    c.create_job({"name": "k", "command": ["sh", "-c", GATED], "cpu": "100m", "gpu": 2,
                  "env": env, "completions": 6, "parallelism": 2,
                  "outputs": {"o": "out-{index}.txt"}})
    wait_until(lambda: running_indexes(c, "k") == [2, 3] and len(runs(marks)) == 4,
               "indexes 2 and 3 running, 0 and 1 done")
    assert journal(d)["ends"] == {0: 0, 1: 0}
    d.kill()
    if ended_while_down:  # 2 and 3 end while no daemon watches: their shims record it
        pids = [json.loads((attempt_dir(d, 1) / f"index-{i}" / "pid.json").read_text())
                for i in (2, 3)]
        gate.touch()
        wait_until(lambda: all(process_gone(p["shim_pid"]) for p in pids),
                   "indexes 2 and 3 to end")
        d.start()
    else:
        d.start()
        wait_until(lambda: running_indexes(c, "k") == [2, 3],
                   "2 and 3 running after the restart")
        for index in (2, 3):
            assert f"adopting job k attempt 1 rank {index}" in d.log(), d.log()[-3000:]
        gate.touch()
    done = c.wait_job("k", timeout=60)
    assert (done["phase"], done["exit_code"], done["attempts"]) == ("Succeeded", 0, 1), (
        done, d.log()[-3000:])
    assert runs(marks) == [(1, i) for i in range(6)], runs(marks)  # each index once
    book = journal(d)
    assert book["ends"] == dict.fromkeys(range(6), 0), book
    assert [(a["number"], a["phase"], a["exit_code"]) for a in c.attempts("k")] == [
        (1, "Exited", 0)]
    assert done["indexes"]["succeeded"] == 6, done["indexes"]
    # Each slot's share of the job's 4 GPUs: 2 each, the same before and after the kill,
    # and never another slot's.
    (attempt,) = c.attempts("k")
    by_slot: dict[int, set[str]] = {}
    for index in range(6):
        log = log_of(c, "k", index)
        assert f"index {index} done" in log, log
        gpus = gpus_of(log)
        assert len(gpus) == 2 and gpus <= set(attempt["gpus"]), (index, gpus, attempt)
        assert by_slot.setdefault(book["slots"][index], gpus) == gpus, (index, by_slot)
    assert len(by_slot) == 2 and not by_slot[0] & by_slot[1], by_slot
    # Outputs of the indexes that ended before the kill (0, 1) as well as after it.
    listed = {o["index"]: o["collected"] for o in c.list_outputs("k")}
    assert listed == dict.fromkeys(range(6), True), listed
    for index in range(6):
        got = c.download_output("k", None, "o", tmp_path / f"o-{index}", index=index)
        assert got.read_text() == f"i{index} a1\n"


def test_an_index_output_is_listed_and_downloads_as_soon_as_that_index_ends(
        tmp_path: Path) -> None:
    env, _, gate = gated_env(tmp_path, start=1)
    with testing.daemon(config=None) as d:
        c = d.client()
        made = c.create_job({"name": "e", "command": ["sh", "-c", GATED], "cpu": "100m",
                             "env": env, "completions": 3,
                             "outputs": {"o": "out-{index}.txt"}})
        assert made["spec"]["parallelism"] == 1, made["spec"]  # the default
        wait_until(lambda: running_indexes(c, "e") == [1], "index 1 running, 0 done")
        assert journal(d)["ends"] == {0: 0}
        listed = {o["index"]: o["collected"] for o in c.list_outputs("e")}
        early = tmp_path / "early-0"
        try:
            assert listed == {0: True, 1: False, 2: False}, listed
            got = c.download_output("e", None, "o", early, index=0)
            assert got.read_text() == "i0 a1\n"
        finally:
            gate.touch()
            assert c.wait_job("e", timeout=60)["phase"] == "Succeeded"


def test_a_lost_attempt_is_retried_running_only_the_indexes_that_did_not_succeed(
        tmp_path: Path) -> None:
    env, marks, _ = gated_env(tmp_path, start=2, only_first_attempt=True)
    with testing.daemon(config=None) as d:
        c = d.client()
        c.create_job({"name": "r", "command": ["sh", "-c", GATED], "cpu": "100m",
                      "env": env, "completions": 6, "parallelism": 2, "retries": 1,
                      "outputs": {"o": "out-{index}.txt"}})
        wait_until(lambda: running_indexes(c, "r") == [2, 3] and len(runs(marks)) == 4,
                   "indexes 2 and 3 running, 0 and 1 done")
        d.kill()
        # Index 2 dies with the daemon, its shim too: nobody records its end.
        pid = json.loads((attempt_dir(d, 1) / "index-2" / "pid.json").read_text())
        os.kill(pid["shim_pid"], signal.SIGKILL)
        os.killpg(pid["pgid"], signal.SIGKILL)
        wait_until(lambda: process_gone(pid["shim_pid"]) and process_gone(pid["pgid"]),
                   "index 2 and its shim gone")
        d.start()
        done = c.wait_job("r", timeout=60)
        assert (done["phase"], done["exit_code"]) == ("Succeeded", 0), (done,
                                                                      d.log()[-3000:])
        attempts = c.attempts("r")
        assert [a["number"] for a in attempts] == [1, 2], attempts
        assert attempts[0]["phase"] == "Lost", attempts
        first = journal(d, 1)
        assert {i for i, code in first["ends"].items() if code == 0} == {0, 1}, first
        assert first["ends"].get(2) != 0, first
        assert set(first["slots"]) == {0, 1, 2, 3}, first
        second = journal(d, 2)
        assert set(second["slots"]) == {2, 3, 4, 5}, second
        assert second["ends"] == dict.fromkeys((2, 3, 4, 5), 0), second
        assert runs(marks) == [(1, 0), (1, 1), (1, 2), (1, 3),
                               (2, 2), (2, 3), (2, 4), (2, 5)], runs(marks)
        assert done["indexes"]["succeeded"] == 6 and done["indexes"]["failed"] == [], done
        # Index 0 ran in attempt 1 only, so its log is that attempt's unless one is named;
        # 2 ran in both, and finished in attempt 2.
        assert "index 0 done" in log_of(c, "r", 0)
        assert b"".join(c.logs("r", index=0, attempt=2)) == b""
        assert "index 0 done" in b"".join(c.logs("r", index=0, attempt=1)).decode()
        assert "index 2 done" not in b"".join(c.logs("r", index=2, attempt=1)).decode()
        assert "index 2 done" in log_of(c, "r", 2)
        # Each index's output is its last run's: 0 and 1 from attempt 1, the rest from 2.
        listed = {o["index"]: o for o in c.list_outputs("r")}
        assert {i: (o["collected"], o.get("attempt")) for i, o in listed.items()} == {
            0: (True, 1), 1: (True, 1), 2: (True, 2), 3: (True, 2), 4: (True, 2),
            5: (True, 2)}, listed
        for index in range(6):
            got = c.download_output("r", None, "o", tmp_path / f"o-{index}", index=index)
            assert got.read_text() == f"i{index} a{1 if index < 2 else 2}\n"


def test_cli_runs_shows_logs_status_outputs_and_execs_by_index(tmp_path: Path) -> None:
    env, marks, gate = gated_env(tmp_path)
    with testing.daemon(config=None) as d:
        c = d.client()
        made = run_cli(d, "job", "run", "--completions", "4", "--parallelism", "2",
                       "--name", "c", "--cpu", "100m", "--output", "o=out-{index}.txt",
                       "--", "sh", "-c",
                       "echo i=$NODUS_INDEX; echo n$NODUS_INDEX > out-$NODUS_INDEX.txt")
        assert made.returncode == 0, (made.stdout, made.stderr, d.log()[-3000:])
        # Attached, it streamed every index, each line prefixed (issue 28; was index 0's).
        assert sorted(made.stdout.splitlines()) == [f"[i{i}] i={i}" for i in range(4)], \
            made.stdout
        logs = run_cli(d, "job", "logs", "c", "--index", "3")
        assert (logs.returncode, logs.stdout) == (0, "i=3\n"), logs
        assert run_cli(d, "job", "logs", "c").stdout == "i=0\n"
        every = run_cli(d, "job", "logs", "c", "--index", "all")
        assert every.stdout == "".join(f"[i{i}] i={i}\n" for i in range(4)), every
        assert run_cli(d, "job", "logs", "c", "--index", "all", "--tail", "1").returncode == 2
        status = run_cli(d, "job", "status", "c")
        assert status.returncode == 0, status.stderr
        (line,) = [x for x in status.stdout.splitlines() if x.startswith("indexes:")]
        assert "4/4 succeeded" in line and "at most 2" in line, status.stdout
        dest = tmp_path / "o2.txt"
        got = run_cli(d, "job", "download-output", "c", "o", str(dest), "--index", "2")
        assert got.returncode == 0, got.stderr
        assert dest.read_text() == "n2\n"
        listed = json.loads(run_cli(d, "job", "outputs", "c", "--json").stdout)
        assert sorted((o["index"], o["collected"]) for o in listed) == [
            (i, True) for i in range(4)], listed

        c.create_job({"name": "g", "command": ["sh", "-c", GATED], "cpu": "100m",
                      "env": env, "completions": 3, "parallelism": 2})
        wait_until(lambda: running_indexes(c, "g") == [0, 1], "indexes 0 and 1 running")
        beside = c.exec_job("g", None, ["sh", "-c", "echo $NODUS_INDEX"], index=1)
        assert (beside["returncode"], beside["stdout"].strip()) == (0, "1"), beside
        cli = run_cli(d, "job", "exec", "g", "--index", "0", "--", "sh", "-c",
                      "echo $NODUS_INDEX $JOB_COMPLETION_INDEX $NODUS_COMPLETIONS")
        assert (cli.returncode, cli.stdout.strip()) == (0, "0 0 3"), cli
        with pytest.raises(errors.InvalidArgument) as info:
            c.exec_job("g", None, ["true"])
        assert (info.value.http_status, info.value.field) == (400, "index"), info.value
        assert info.value.message.startswith("index:"), info.value.message
        bare = run_cli(d, "job", "exec", "g", "--", "true")
        assert bare.returncode == 2 and "index" in bare.stderr, bare
        gate.touch()
        assert c.wait_job("g", timeout=60)["phase"] == "Succeeded"
        assert runs(marks) == [(1, 0), (1, 1), (1, 2)]


def test_an_indexed_output_downloaded_without_an_index_is_a_400_naming_index(
        tmp_path: Path) -> None:
    with testing.daemon(config=None) as d:
        job = nodus.Job.create(name="w", command=["sh", "-c", "echo $NODUS_INDEX > o-$NODUS_INDEX"],
                               cpu="100m", completions=2, outputs={"o": "o-{index}"})
        assert job.wait(timeout=60).phase == "Succeeded"
        with pytest.raises(errors.InvalidArgument) as info:
            job.outputs["o"].download(tmp_path / "x")
        assert (info.value.http_status, info.value.field) == (400, "index"), info.value
        bare = run_cli(d, "job", "download-output", "w", "o", str(tmp_path / "y"))
        assert bare.returncode == 2 and "index" in bare.stderr, bare
        assert list(tmp_path.iterdir()) == []


def test_the_queue_reserves_parallelism_times_each_indexs_cpu_memory_and_gpus(
        tmp_path: Path) -> None:
    env, _, gate = gated_env(tmp_path)
    gib = 2**30
    with testing.daemon(cpus=2, memory="8GiB", config=FOUR_GPUS) as d:
        c = d.client()
        c.create_job({"name": "wide", "command": ["sh", "-c", GATED], "cpu": "1",
                      "memory": "3GiB", "gpu": 1, "env": env, "completions": 4,
                      "parallelism": 2})
        wait_until(lambda: running_indexes(c, "wide") == [0, 1], "indexes 0 and 1 running")
        capacity = c.info()["capacity"]
        c.create_job({"name": "cpu", "command": ["true"], "cpu": "1"})
        c.create_job({"name": "mem", "command": ["true"], "cpu": "10m", "memory": "3GiB"})
        c.create_job({"name": "gpus", "command": ["true"], "cpu": "10m", "gpu": 3})
        seen = {name: wait_until(lambda name=name: (doc := c.get_job(name))["hold"] or
                                 doc["phase"] != "Pending", f"{name} to start or be held")
                for name in ("cpu", "mem", "gpus")}
        phases = {name: c.get_job(name)["phase"] for name in seen}
        assert ((capacity["cpus_used"], capacity["memory_used"] / gib), phases) == (
            (2.0, 6.0), dict.fromkeys(seen, "Pending")), (capacity, phases, seen)
        gate.touch()
        for name in ("wide", "cpu", "mem", "gpus"):
            assert c.wait_job(name, timeout=60)["phase"] == "Succeeded", name


REFUSED: list[tuple[dict[str, Any], str]] = [
    ({"completions": 2, "parallelism": 3}, "parallelism"),
    ({"parallelism": 2}, "parallelism"),
    ({"completions": 1, "parallelism": 2}, "parallelism"),
    ({"completions": 3, "outputs": {"o": "out.txt"}}, "outputs.o"),
    ({"completions": 2, "distributed": {"nodes": 2}}, "completions"),
    ({"completions": 0}, "completions"),
    ({"completions": True}, "completions"),
    ({"completions": "3"}, "completions"),
    ({"completions": 3, "parallelism": 0}, "parallelism"),
]


def test_bad_indexed_jobs_are_refused_naming_the_field() -> None:
    with testing.daemon(config=None) as d:
        c = d.client()
        for extra, field in REFUSED:
            with pytest.raises(errors.InvalidArgument) as info:
                c.create_job({"name": "bad", "command": ["true"], **extra})
            error = info.value
            assert (error.http_status, error.field) == (400, field), (extra, error)
            assert "\n" not in error.message, error.message
            assert error.message.startswith(f"{field}:"), (extra, error.message)
        assert c.list_jobs(all=True) == []


def test_cancel_mid_job_stops_the_running_indexes_and_starts_no_more(
        tmp_path: Path) -> None:
    env, marks, _ = gated_env(tmp_path)
    with testing.daemon(config=None) as d:
        c = d.client()
        c.create_job({"name": "x", "command": ["sh", "-c", GATED], "cpu": "100m",
                      "env": env, "completions": 6, "parallelism": 2})
        wait_until(lambda: running_indexes(c, "x") == [0, 1], "indexes 0 and 1 running")
        # An index runs from its launch; its shim names its pids a moment after, and its
        # command starts once it entered its cgroups (a cancel before that leaves no mark:
        # failed in CI).
        named = [attempt_dir(d, 1) / f"index-{i}" / "pid.json" for i in (0, 1)]
        wait_until(lambda: all(p.exists() for p in named) and len(runs(marks)) == 2,
                   "the indexes' pids named and their commands started")
        pids = [json.loads(p.read_text()) for p in named]
        c.cancel_job("x")
        done = c.wait_job("x", timeout=60)
        assert done["phase"] == "Cancelled", (done, d.log()[-3000:])
        for pid in pids:
            wait_until(lambda pid=pid: process_gone(pid["pgid"]), "a cancelled index gone")
        book = journal(d)
        assert set(book["slots"]) == {0, 1} and set(book["ends"]) == {0, 1}, book
        assert all(code != 0 for code in book["ends"].values()), book
        assert runs(marks) == [(1, 0), (1, 1)], runs(marks)
        assert done["indexes"]["running"] == [] and done["indexes"]["succeeded"] == 0, done
        assert [e for e in events_of(c, "x") if e in TERMINAL] == ["Cancelled"]


def events_of(c: ApiClient, name: str) -> list[str]:
    """The phases the job's events recorded, in order."""
    return [json.loads(line)["phase"] for line in b"".join(c.events(job=name)).splitlines()
            if line]
