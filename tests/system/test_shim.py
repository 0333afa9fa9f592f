"""The host-process runtime without the daemon: a real spawner, real shims, real jobs, and
the files a shim leaves in its attempt directory."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from noduslocal.daemon.runtime import compiled_shim, shim
from noduslocal.daemon.runtime.attempt_dir import (
    NO_ROOM_DETAIL,
    inspect,
    locked,
    read_exit,
    read_pid,
)
from noduslocal.daemon.runtime.base import Alive, AttemptState, Exited, NeverStarted, Vanished
from noduslocal.daemon.runtime.host import spawner as spawner_module
from noduslocal.daemon.runtime.host.runtime import signal_group
from noduslocal.daemon.runtime.host.spawner import Spawner, SpawnError
from noduslocal.testing import process_gone as gone
from tests.system.test_disk_full import fill_disk as fill
from tests.system.test_disk_full import tmpfs

T = TypeVar("T")
SHIM: list[Path | None] = [None]  # the compiled shim the spawner starts, None: Python's

PATH = "/usr/local/bin:/usr/bin:/bin"
DEADLINE = 15.0  # seconds to wait for something that should happen at once


# --- helpers -----------------------------------------------------------------------------


@pytest.fixture(autouse=True, params=["python", "compiled"])
def which_shim(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
               ) -> Iterator[None]:
    """Every test runs with each shim: they speak one protocol."""
    binary = None
    if request.param == "compiled":
        binary = compiled_shim.find(tmp_path_factory.getbasetemp() / "shim-data")
        if binary is None:
            if os.environ.get("CI"):
                pytest.fail("no compiled shim: scripts/test.sh builds it (needs gcc)")
            pytest.skip("no C compiler for the compiled shim")
    SHIM[0] = binary
    yield
    SHIM[0] = None


def spawner() -> Spawner:
    return Spawner(SHIM[0])


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


async def with_runtime(body: Callable[[Spawner], Awaitable[T]]) -> T:
    runtime = spawner()
    await runtime.start()
    try:
        return await body(runtime)
    finally:
        await runtime.close()


def request(directory: Path, argv: list[str], *, env: dict[str, str] | None = None,
            cwd: Path | None = None, cgroups: list[str] | None = None) -> dict[str, Any]:
    return {"dir": str(directory), "argv": argv, "env": {"PATH": PATH} if env is None else env,
            "cwd": str(cwd or directory), "uid": None,
            **({"cgroups": cgroups} if cgroups else {})}


def new_dir(base: Path, name: str = "attempt") -> Path:
    directory = base / name
    directory.mkdir()
    return directory


async def run_job(runtime: Spawner, directory: Path, argv: list[str],
                  **kwargs: Any) -> AttemptState:
    shim_pid = await runtime.launch(request(directory, argv, **kwargs))
    return await asyncio.wait_for(runtime.watch(directory, shim_pid), DEADLINE)


async def until(predicate: Callable[[], bool], what: str, timeout: float = DEADLINE) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)




def group_ready(directory: Path) -> bool:
    """pid.json names the job, and the job leads its own process group."""
    pid = read_pid(directory)
    if pid is None:
        return False
    try:
        return os.getpgid(pid["pid"]) == pid["pgid"]
    except ProcessLookupError:
        return False


async def running_job(directory: Path) -> dict[str, Any]:
    await until(lambda: group_ready(directory), "the job's process group")
    data = read_pid(directory)
    assert data is not None
    return data


@pytest.fixture
def cleanup() -> Iterator[list[int]]:
    """Process groups to SIGKILL when the test ends, whatever happened."""
    groups: list[int] = []
    yield groups
    for pgid in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)


# --- running a job -----------------------------------------------------------------------


def test_exit_status_and_the_files_a_shim_leaves(tmp_path: Path) -> None:
    directory = new_dir(tmp_path)

    async def body(runtime: Spawner) -> tuple[int, AttemptState]:
        shim_pid = await runtime.launch(request(directory, ["sh", "-c", "exit 7"]))
        return shim_pid, await asyncio.wait_for(runtime.watch(directory, shim_pid), DEADLINE)

    shim_pid, state = run(with_runtime(body))
    assert isinstance(state, Exited)
    assert (state.exit_code, state.signal) == (7, None)
    assert state.started_at <= state.ended_at
    exit_data = json.loads((directory / shim.EXIT).read_text())
    assert exit_data["exit_code"] == 7 and exit_data["signal"] is None
    pid_data = json.loads((directory / shim.PID).read_text())
    assert pid_data["shim_pid"] == shim_pid
    assert pid_data["pgid"] == pid_data["pid"] != shim_pid
    # Logs are made on the first output: this job wrote none.
    assert not (directory / shim.OUTPUT_LOG).exists()
    assert not (directory / shim.STDERR_LOG).exists()
    assert not (directory / shim.ABANDONED).exists()
    assert not [p.name for p in directory.iterdir() if p.name.endswith(".tmp")]
    assert inspect(directory) == state


def test_the_compiled_shim_keeps_both_records_in_one_file(tmp_path: Path) -> None:
    """An inode a task fewer (issue 25 part 5): pid.json is a link to the file the exit
    record later rewrites in place and renames exit.json; the exit record repeats the pid
    record's fields, so pid.json still names the job's pids after the end, and both read
    as JSON whatever their padding. (The Python shim writes two files.)"""
    directory = new_dir(tmp_path)

    async def body(runtime: Spawner) -> tuple[int, AttemptState, dict[str, Any] | None]:
        shim_pid = await runtime.launch(request(directory, ["sh", "-c", "sleep 0.3"]))
        while (running := read_pid(directory)) is None:
            await asyncio.sleep(0.01)
        assert not (directory / shim.EXIT).exists()
        state = await asyncio.wait_for(runtime.watch(directory, shim_pid), DEADLINE)
        return shim_pid, state, running

    shim_pid, state, running = run(with_runtime(body))
    assert isinstance(state, Exited) and state.exit_code == 0
    assert running is not None and running["shim_pid"] == shim_pid
    pid_file, exit_file = directory / shim.PID, directory / shim.EXIT
    assert os.path.samefile(pid_file, exit_file) == (SHIM[0] is not None)
    if SHIM[0] is not None:
        ended = json.loads(exit_file.read_text())
        assert {k: ended[k] for k in running} == running
    else:
        assert read_pid(directory) == running
    assert not [p.name for p in directory.iterdir() if p.name.endswith(".tmp")]


def test_output_log_interleaves_stdout_and_stderr_in_order(tmp_path: Path,
                                                           cleanup: list[int]) -> None:
    directory = new_dir(tmp_path)
    # each line waits until the shim has logged it, so the order of arrival is fixed
    script = (
        'emit() { if [ "$2" = err ]; then echo "$1" >&2; else echo "$1"; fi\n'
        '  n=0; until grep -qx "$1" output.log 2>/dev/null; do\n'
        '    n=$((n+1)); [ "$n" -gt 1000 ] && exit 99; sleep 0.01; done; }\n'
        "emit out-1 out; emit err-1 err; emit out-2 out; emit err-2 err; emit out-3 out\n"
    )

    async def body(runtime: Spawner) -> AttemptState:
        shim_pid = await runtime.launch(request(directory, ["sh", "-c", script]))
        await until(lambda: read_pid(directory) is not None, "pid.json")
        pid = read_pid(directory)
        assert pid is not None
        cleanup.append(pid["pgid"])
        return await asyncio.wait_for(runtime.watch(directory, shim_pid), DEADLINE)

    state = run(with_runtime(body))
    assert isinstance(state, Exited) and state.exit_code == 0
    assert (directory / shim.OUTPUT_LOG).read_text() == "out-1\nerr-1\nout-2\nerr-2\nout-3\n"
    assert (directory / shim.STDERR_LOG).read_text() == "err-1\nerr-2\n"


def test_a_job_enters_a_v1_cgroup_as_one_thread(tmp_path: Path) -> None:
    """On v1 the job's process moves itself, "0" in `tasks`, not its pid in cgroup.procs:
    a thread group's move takes the kernel's threadgroup lock for writing, whose first
    writer after a quiet spell waits for an RCU grace period (5 to 30 ms here: the first
    task of every sweep paid it, issue 25 part 5). A directory laid out as v1's is (both
    files) shows which file each shim wrote."""
    directory = new_dir(tmp_path)
    cgroup = new_dir(tmp_path, "v1-cgroup")
    for name in ("tasks", "cgroup.procs"):
        (cgroup / name).write_text("")
    state = run(with_runtime(lambda runtime: run_job(
        runtime, directory, ["true"], cgroups=[str(cgroup)])))
    assert isinstance(state, Exited) and state.exit_code == 0, state
    assert (cgroup / "tasks").read_text() == "0"
    assert (cgroup / "cgroup.procs").read_text() == ""


def test_the_exit_record_says_when_the_cgroups_were_seen_empty(tmp_path: Path) -> None:
    """After its job's end a shim reads the rank's cgroups to kill what the job left; its
    exit record says it saw them empty, so the daemon's release need not read them again.
    Without cgroups it says nothing of them, nor when a cgroup could not be read (here a
    directory where cgroup.procs should be): an unread cgroup may hold a process, which
    the daemon's pool would hand to the next rank."""
    cgroup, unreadable = new_dir(tmp_path, "v1-cgroup"), new_dir(tmp_path, "unreadable")
    for name in ("tasks", "cgroup.procs"):
        (cgroup / name).write_text("")
    (unreadable / "tasks").write_text("")
    (unreadable / "cgroup.procs").mkdir()
    with_cgroups, without, unread = (new_dir(tmp_path, name)
                                     for name in ("with", "without", "unread"))

    async def each(runtime: Spawner) -> list[AttemptState]:
        return [await run_job(runtime, with_cgroups, ["true"], cgroups=[str(cgroup)]),
                await run_job(runtime, without, ["true"]),
                await run_job(runtime, unread, ["true"],
                              cgroups=[str(cgroup), str(unreadable)])]

    seen, unseen, not_read = run(with_runtime(each))
    assert isinstance(seen, Exited) and seen.cgroups_empty, seen
    assert json.loads((with_cgroups / shim.EXIT).read_text())["cgroups_empty"] is True
    assert isinstance(unseen, Exited) and not unseen.cgroups_empty, unseen
    assert "cgroups_empty" not in json.loads((without / shim.EXIT).read_text())
    assert isinstance(not_read, Exited) and not_read.exit_code == 0, not_read
    assert not not_read.cgroups_empty
    assert "cgroups_empty" not in json.loads((unread / shim.EXIT).read_text())


def test_a_job_runs_in_real_v1_and_v2_cgroups(tmp_path: Path) -> None:
    """The same, against the kernel: the job's process is in a v1 hierarchy's cgroup (by
    `tasks`) and in a v2 one's (by cgroup.procs, v2 having no `tasks`) when it runs."""
    made = []
    v1 = Path("/sys/fs/cgroup/pids")
    v2 = next((p for p in (Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup"))
               if (p / "cgroup.controllers").exists()), None)
    if not (v1 / "tasks").exists() or v2 is None:
        pytest.skip("needs a v1 pids hierarchy and a v2 one (this CI box has both)")
    try:
        for root in (v1, v2):
            path = root / f"nl-shim-test-{os.getpid()}"
            path.mkdir()
            made.append(path)
        directory = new_dir(tmp_path)
        state = run(with_runtime(lambda runtime: run_job(
            runtime, directory, ["cat", "/proc/self/cgroup"],
            cgroups=[str(p) for p in made])))
        assert isinstance(state, Exited) and state.exit_code == 0, state
        lines = (directory / shim.OUTPUT_LOG).read_text().splitlines()
        name = made[0].name
        assert any(line.split(":")[1] == "pids" and line.endswith(f"/{name}")
                   for line in lines), lines
        assert any(line.startswith("0::") and line.endswith(f"/{name}")
                   for line in lines), lines
    finally:
        for path in made:
            with contextlib.suppress(OSError):
                path.rmdir()


def test_job_stdin_is_empty(tmp_path: Path) -> None:
    directory = new_dir(tmp_path)
    state = run(with_runtime(lambda rt: run_job(rt, directory,
                                                ["sh", "-c", "cat; echo read-all"])))
    assert isinstance(state, Exited) and state.exit_code == 0
    assert (directory / shim.OUTPUT_LOG).read_text() == "read-all\n"


def test_missing_command_exits_127(tmp_path: Path) -> None:
    directory = new_dir(tmp_path)
    state = run(with_runtime(lambda rt: run_job(rt, directory, ["no-such-command-x1"])))
    assert isinstance(state, Exited)
    assert (state.exit_code, state.signal) == (127, None)
    output = (directory / shim.OUTPUT_LOG).read_text()
    assert "cannot execute 'no-such-command-x1'" in output
    assert output == (directory / shim.STDERR_LOG).read_text()


def test_command_that_is_not_executable_exits_126(tmp_path: Path) -> None:
    directory = new_dir(tmp_path)
    script = tmp_path / "script.sh"
    script.write_text("#!/bin/sh\necho ran\n")
    script.chmod(0o644)
    state = run(with_runtime(lambda rt: run_job(rt, directory, [str(script)])))
    assert isinstance(state, Exited) and state.exit_code == 126
    output = (directory / shim.OUTPUT_LOG).read_text()
    assert "cannot execute" in output and "ran" not in output


def test_missing_workdir_exits_126(tmp_path: Path) -> None:
    directory = new_dir(tmp_path)
    missing = tmp_path / "no" / "such" / "dir"
    state = run(with_runtime(lambda rt: run_job(
        rt, directory, ["sh", "-c", "touch ran"], cwd=missing)))
    assert isinstance(state, Exited)
    assert (state.exit_code, state.signal) == (126, None)
    assert f"cannot enter workdir {missing}" in (directory / shim.OUTPUT_LOG).read_text()
    assert not missing.exists()


def test_job_killed_from_outside_reports_the_signal(tmp_path: Path,
                                                    cleanup: list[int]) -> None:
    directory = new_dir(tmp_path)

    async def body(runtime: Spawner) -> AttemptState:
        shim_pid = await runtime.launch(request(directory, ["sleep", "300"]))
        job = await running_job(directory)
        cleanup.append(job["pgid"])
        os.killpg(job["pgid"], signal.SIGKILL)
        return await asyncio.wait_for(runtime.watch(directory, shim_pid), DEADLINE)

    state = run(with_runtime(body))
    assert isinstance(state, Exited)
    assert (state.exit_code, state.signal) == (137, signal.SIGKILL)
    assert read_exit(directory) == state


def test_signal_group_reaches_the_job(tmp_path: Path, cleanup: list[int]) -> None:
    directory = new_dir(tmp_path)

    async def body(runtime: Spawner) -> tuple[bool, AttemptState, bool]:
        shim_pid = await runtime.launch(request(directory, ["sleep", "300"]))
        cleanup.append((await running_job(directory))["pgid"])
        sent = await signal_group(directory, signal.SIGTERM)
        state = await asyncio.wait_for(runtime.watch(directory, shim_pid), DEADLINE)
        return sent, state, await signal_group(directory, signal.SIGTERM)

    sent, state, sent_after_exit = run(with_runtime(body))
    assert sent
    assert isinstance(state, Exited)
    assert (state.exit_code, state.signal) == (143, signal.SIGTERM)
    assert not sent_after_exit


def test_background_children_die_with_the_main_process(tmp_path: Path,
                                                       cleanup: list[int]) -> None:
    directory = new_dir(tmp_path)
    # First make sure the shim is already pumping output, then
    # leave a child behind that holds stdout and stderr open.
    script = (
        "echo ready; until grep -q ready output.log; do sleep 0.01; done\n"
        "sleep 300 & echo $! > bg.pid\n"
    )

    async def body(runtime: Spawner) -> tuple[AttemptState, int]:
        shim_pid = await runtime.launch(request(directory, ["sh", "-c", script]))
        await until(lambda: read_pid(directory) is not None, "pid.json")
        pid = read_pid(directory)
        assert pid is not None
        cleanup.append(pid["pgid"])
        state = await asyncio.wait_for(runtime.watch(directory, shim_pid), DEADLINE)
        background = int((directory / "bg.pid").read_text())
        await until(lambda: gone(background), f"background child {background} to go")
        return state, background

    state, background = run(with_runtime(body))
    assert isinstance(state, Exited) and state.exit_code == 0
    assert gone(background)


def test_env_is_exactly_the_requested_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          ) -> None:
    directory = new_dir(tmp_path)
    monkeypatch.setenv("NODUS_TEST_LEAK", "from-the-test-process")
    env = {"FOO": "bar", "PATH": PATH, "WITH_SPACE": "a b=c"}
    state = run(with_runtime(lambda rt: run_job(rt, directory, ["env"], env=env)))
    assert isinstance(state, Exited) and state.exit_code == 0
    lines = (directory / shim.OUTPUT_LOG).read_text().splitlines()
    assert sorted(lines) == sorted(f"{k}={v}" for k, v in env.items())
    assert "PYTEST_CURRENT_TEST" in os.environ
    assert not [line for line in lines if line.startswith(("PYTEST_CURRENT_TEST=",
                                                           "NODUS_TEST_LEAK="))]


def test_a_signal_the_daemon_ignores_is_at_its_default_in_the_job(tmp_path: Path) -> None:
    """A daemon started under nohup ignores SIGHUP, and its spawner inherits that; the job
    must not (the compiled spawner now resets every signal once at its start, no longer in
    each job's process)."""
    directory = new_dir(tmp_path)
    ignored = [signal.SIGHUP, signal.SIGUSR1, signal.SIGTERM]
    before = [signal.signal(sig, signal.SIG_IGN) for sig in ignored]
    try:
        state = run(with_runtime(lambda rt: run_job(
            rt, directory, ["cat", "/proc/self/status"])))
    finally:
        for sig, handler in zip(ignored, before, strict=True):
            signal.signal(sig, handler)
    assert isinstance(state, Exited) and state.exit_code == 0
    (line,) = [x for x in (directory / shim.OUTPUT_LOG).read_text().splitlines()
               if x.startswith("SigIgn:")]
    mask = int(line.split()[1], 16)
    assert not [sig for sig in ignored if mask & (1 << (sig - 1))], line


def test_launch_needs_a_started_runtime(tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # A launch waits this long for a spawner that is (re)starting; none ever starts here.
    monkeypatch.setattr(spawner_module, "SPAWNER_WAIT", 0.2)

    async def body() -> None:
        with pytest.raises(SpawnError):
            await spawner().launch(request(new_dir(tmp_path), ["true"]))

    run(body())


# --- inspect: what became of an attempt --------------------------------------------------


def test_inspect_a_directory_no_shim_ever_used(tmp_path: Path) -> None:
    directory = new_dir(tmp_path)
    assert isinstance(inspect(directory), NeverStarted)
    assert (directory / shim.ABANDONED).exists()
    # and a directory that was never made stays unmade
    missing = tmp_path / "never-made"
    assert isinstance(inspect(missing), NeverStarted)
    assert not missing.exists()


def test_a_shim_that_starts_under_the_verdict_never_runs_its_job(tmp_path: Path) -> None:
    """The daemon judges an attempt under both locks a shim may take (the compiled one's
    directory, the Python one's file): a shim that starts meanwhile waits for them, finds
    the attempt abandoned and never runs its job, so the job cannot run beside its retry."""
    directory = new_dir(tmp_path)
    ran = tmp_path / "ran"

    async def body(runtime: Spawner) -> AttemptState:
        with locked(directory) as free:
            assert free
            shim_pid = await runtime.launch(request(directory, ["touch", str(ran)]))
            await asyncio.sleep(0.3)
            assert not (directory / f".{shim.PID}.tmp").exists()  # waiting for our lock
            (directory / shim.ABANDONED).touch()
        return await asyncio.wait_for(runtime.watch(directory, shim_pid), DEADLINE)

    assert isinstance(run(with_runtime(body)), NeverStarted)
    assert not ran.exists() and not (directory / shim.PID).exists()


def test_inspect_a_running_then_finished_shim(tmp_path: Path, cleanup: list[int]) -> None:
    directory = new_dir(tmp_path)

    async def body(runtime: Spawner) -> tuple[int, AttemptState, AttemptState]:
        shim_pid = await runtime.launch(request(directory, ["sleep", "300"]))
        job = await running_job(directory)
        cleanup.append(job["pgid"])
        alive = inspect(directory)
        # the shim leads a session of its own; the job runs in its own group inside it
        assert os.getsid(shim_pid) == shim_pid
        assert os.getsid(job["pid"]) == shim_pid
        assert os.getpgid(shim_pid) == shim_pid != job["pgid"]
        os.killpg(job["pgid"], signal.SIGTERM)
        return shim_pid, alive, await asyncio.wait_for(runtime.watch(directory, shim_pid),
                                                       DEADLINE)

    shim_pid, alive, exited = run(with_runtime(body))
    assert alive == Alive(shim_pid)
    assert not (directory / shim.ABANDONED).exists()
    assert isinstance(exited, Exited) and exited.signal == signal.SIGTERM
    assert inspect(directory) == exited
    assert not (directory / shim.ABANDONED).exists()


def test_inspect_a_shim_killed_under_its_job(tmp_path: Path, cleanup: list[int]) -> None:
    directory = new_dir(tmp_path)

    async def body(runtime: Spawner) -> tuple[AttemptState, AttemptState]:
        shim_pid = await runtime.launch(request(directory, ["sleep", "300"]))
        job = await running_job(directory)
        cleanup.append(job["pgid"])
        os.kill(shim_pid, signal.SIGKILL)
        watched = await asyncio.wait_for(runtime.watch(directory, shim_pid), DEADLINE)
        os.killpg(job["pgid"], signal.SIGKILL)
        await until(lambda: gone(job["pid"]), "the orphaned job to go")
        return watched, inspect(directory)

    watched, inspected = run(with_runtime(body))
    assert isinstance(watched, Vanished)
    assert isinstance(inspected, Vanished)
    assert read_exit(directory) is None
    assert not (directory / shim.ABANDONED).exists()


def test_abandoned_marker_stops_a_late_shim(tmp_path: Path) -> None:
    directory = new_dir(tmp_path)
    workdir = new_dir(tmp_path, "work")
    (directory / shim.ABANDONED).touch()

    state = run(with_runtime(lambda rt: run_job(
        rt, directory, ["sh", "-c", "touch marker"], cwd=workdir)))
    assert isinstance(state, NeverStarted)
    assert not (workdir / "marker").exists()
    assert not (directory / shim.PID).exists()
    assert not (directory / shim.EXIT).exists()
    assert not (directory / shim.OUTPUT_LOG).exists()


def test_shims_outlive_the_spawner(tmp_path: Path, cleanup: list[int]) -> None:
    directory = new_dir(tmp_path)
    script = "until [ -e go ]; do sleep 0.02; done; echo finished"

    async def body() -> tuple[int, int, AttemptState]:
        runtime = spawner()
        await runtime.start()
        try:
            assert runtime._proc is not None
            spawner_pid = runtime._proc.pid
            shim_pid = await runtime.launch(request(directory, ["sh", "-c", script]))
            cleanup.append((await running_job(directory))["pgid"])
        finally:
            await runtime.close()
        return spawner_pid, shim_pid, inspect(directory)

    spawner_pid, shim_pid, after_close = run(body())
    assert gone(spawner_pid)
    assert after_close == Alive(shim_pid)  # still running its job with the spawner gone
    (directory / "go").touch()
    deadline = time.monotonic() + DEADLINE
    while read_exit(directory) is None:
        assert time.monotonic() < deadline, "the orphaned shim never wrote exit.json"
        time.sleep(0.02)
    exited = read_exit(directory)
    assert exited is not None and (exited.exit_code, exited.signal) == (0, None)
    assert (directory / shim.OUTPUT_LOG).read_text() == "finished\n"


# --- known bugs --------------------------------------------------------------------------


def test_process_group_exists_once_pid_json_names_it(tmp_path: Path,
                                                     cleanup: list[int]) -> None:
    async def body(runtime: Spawner) -> int:
        launched: list[tuple[Path, int]] = []
        missed = 0
        for i in range(40):
            directory = new_dir(tmp_path, f"attempt-{i}")
            launched.append((directory, await runtime.launch(
                request(directory, ["sleep", "300"]))))
            deadline = time.monotonic() + DEADLINE
            while (pid := read_pid(directory)) is None:  # no sleep: read it the moment it lands
                assert time.monotonic() < deadline, "no pid.json"
            cleanup.append(pid["pgid"])
            try:
                os.killpg(pid["pgid"], signal.SIGKILL)
            except ProcessLookupError:
                missed += 1
                os.kill(pid["pid"], signal.SIGKILL)
                break
        for directory, shim_pid in launched:
            await asyncio.wait_for(runtime.watch(directory, shim_pid), DEADLINE)
        return missed

    assert run(with_runtime(body)) == 0, "killpg found no process group for a running job"


def test_shim_notices_a_main_process_that_exited_before_pumping(tmp_path: Path,
                                                                cleanup: list[int]) -> None:
    directory = new_dir(tmp_path)
    # A FIFO as output.log holds the shim in _pump's first open() until we read it: the job
    # runs and exits inside the window between its release and the SIGCHLD handler.
    os.mkfifo(directory / shim.OUTPUT_LOG)
    script = "sleep 300 & echo $! > bg.pid; exit 0"

    async def body(runtime: Spawner) -> AttemptState | None:
        shim_pid = await runtime.launch(request(directory, ["sh", "-c", script]))
        await until(lambda: read_pid(directory) is not None
                    and (directory / "bg.pid").exists()
                    and bool((directory / "bg.pid").read_text().strip()), "the job to start")
        job = read_pid(directory)
        assert job is not None
        cleanup.append(job["pgid"])
        await until(lambda: gone(job["pid"]), "the job's main process to exit")
        reader = os.open(directory / shim.OUTPUT_LOG, os.O_RDONLY | os.O_NONBLOCK)
        try:
            try:
                return await asyncio.wait_for(runtime.watch(directory, shim_pid), 3)
            except TimeoutError:
                return None
            finally:
                # let a stuck shim go: its pipes close with the background child
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(job["pgid"], signal.SIGKILL)
                await asyncio.wait_for(runtime.watch(directory, shim_pid), DEADLINE)
        finally:
            os.close(reader)

    state = run(with_runtime(body))
    assert state is not None, "the shim kept waiting for a background child"
    assert isinstance(state, Exited) and state.exit_code == 0


@pytest.mark.parametrize(("secrets", "chunks", "expected"), [
    ([b"secret"], [b"a secret b"], b"a *** b"),
    ([b"secret"], [b"a sec", b"ret b"], b"a *** b"),
    ([b"secret"], [b"a s", b"e", b"c", b"r", b"e", b"t"], b"a ***"),
    ([b"secret"], [b"a sec", b"onds"], b"a seconds"),
    ([b"abc", b"abcdef"], [b"xabcdefx"], b"x***x"),
    ([b"abc", b"abcdef"], [b"xab", b"cx"], b"x***x"),
    ([b"secret"], [b"sec"], b"sec"),  # the end of the stream flushes what was held
    ([], [b"plain"], b"plain"),
])
def test_masker(secrets: list[bytes], chunks: list[bytes], expected: bytes) -> None:
    masker = shim.Masker(secrets)
    out = b"".join(masker.feed(chunk) for chunk in chunks) + masker.feed(b"", final=True)
    assert out == expected


def test_masker_holds_back_only_a_possible_start() -> None:
    masker = shim.Masker([b"secret"])
    assert masker.feed(b"line one\n") == b"line one\n"  # nothing held: no secret starts here
    assert masker.feed(b"tail se") == b"tail "


def test_masker_merges_overlapping_secrets() -> None:
    masker = shim.Masker([b"ab", b"bSECRETVALUE"])
    assert masker.feed(b"xabSECRETVALUEy", final=True) == b"x***y"
    assert shim.Masker([b"aa"]).feed(b"aaaa-aaa", final=True) == b"***-***"


def test_secrets_are_masked_across_writes_and_streams(tmp_path: Path) -> None:
    directory = new_dir(tmp_path)
    script = "printf 'a sec'; sleep 0.2; printf 'ret b\\n'; echo 'hunter2!' >&2"

    async def body(runtime: Spawner) -> AttemptState:
        req = {**request(directory, ["sh", "-c", script]), "mask": ["secret", "hunter2", ""]}
        shim_pid = await runtime.launch(req)
        return await asyncio.wait_for(runtime.watch(directory, shim_pid), DEADLINE)

    state = run(with_runtime(body))
    assert isinstance(state, Exited) and state.exit_code == 0
    assert (directory / shim.OUTPUT_LOG).read_text() == "a *** b\n***!\n"
    assert (directory / shim.STDERR_LOG).read_text() == "***!\n"


def test_a_missing_command_names_the_path_searched(tmp_path: Path) -> None:
    state = run(with_runtime(lambda r: run_job(r, new_dir(tmp_path), ["nope-x2"],
                                               env={"PATH": "/nowhere:/bin"})))
    assert isinstance(state, Exited) and state.exit_code == 127
    assert ("cannot execute 'nope-x2': not found in PATH (/nowhere:/bin)"
            in (tmp_path / "attempt" / shim.OUTPUT_LOG).read_text())


# --- logs and records on a bounded disk -----------------------------------------------------


def test_a_log_past_its_cap_keeps_its_head_a_marker_and_its_end(tmp_path: Path) -> None:
    directory = new_dir(tmp_path)
    cap = 64 * 1024
    script = "seq 1 40000; echo 'the end'; echo 'an error' >&2"
    printed = "".join(f"{i}\n" for i in range(1, 40001)) + "the end\nan error\n"

    async def body(runtime: Spawner) -> AttemptState:
        shim_pid = await runtime.launch({**request(directory, ["sh", "-c", script]),
                                         "max_log": cap})
        return await asyncio.wait_for(runtime.watch(directory, shim_pid), DEADLINE)

    state = run(with_runtime(body))
    assert isinstance(state, Exited) and state.exit_code == 0
    log = (directory / shim.OUTPUT_LOG).read_text()
    assert len(log.encode()) <= cap
    head, marker, rest = log.partition(
        f"[noduslocal] this log reached max_log_bytes ({cap} bytes): what follows is left "
        "out, except its last 16384 bytes, added at the end\n")
    assert marker, log[-3000:]
    assert printed.startswith(head.removesuffix("\n")) and len(head) > cap // 2
    note, _, tail = rest.partition("\n")
    left_out, shown = (int(n) for n in re.findall(r"\d+", note))
    assert note == (f"[noduslocal] {left_out} bytes were left out here; the last {shown} "
                    "bytes follow")
    # The end as printed, from the start of a line; nothing else is missing.
    assert printed.endswith(tail) and tail.endswith("the end\nan error\n")
    assert tail[0] != "\n" and printed[-len(tail) - 1] == "\n"
    assert len(tail) == shown and len(head.removesuffix("\n")) + left_out + shown == len(printed)
    # stderr's own log is under the cap: whole.
    assert (directory / shim.STDERR_LOG).read_text() == "an error\n"


def test_a_full_disk_costs_log_output_but_neither_the_shim_nor_the_exit(
        tmp_path: Path) -> None:
    """The Python shim died of ENOSPC writing the log (its job lived on, unwatched), and
    either shim lost the exit of a job that ended while the disk was full."""
    gates = [tmp_path / f"gate{i}" for i in range(3)]
    printed = tmp_path / "printed"
    wait = 'while [ ! -e "{}" ]; do sleep 0.01; done'
    # A whole page first: a page the log has already holds the next bytes on any disk.
    script = "; ".join([
        "printf '%4095s\\n' before", wait.format(gates[0]), "seq 1 1000", f"touch {printed}",
        wait.format(gates[1]), "echo after", wait.format(gates[2]), "exit 7"])
    lost = sum(len(f"{i}\n") for i in range(1, 1001))
    with tmpfs(tmp_path / "disk", "1m") as disk:
        directory = new_dir(disk)
        filler = disk / "filler"

        async def body(runtime: Spawner) -> AttemptState:
            shim_pid = await runtime.launch(request(directory, ["sh", "-c", script],
                                                    cwd=tmp_path))
            await until(lambda: (directory / shim.OUTPUT_LOG).exists(), "the first line")
            ended = runtime.watch(directory, shim_pid)
            fill(filler)
            gates[0].touch()
            await until(printed.exists, "the lines the disk has no room for")
            filler.unlink()
            gates[1].touch()
            await until(lambda: b"after" in (directory / shim.OUTPUT_LOG).read_bytes(),
                        "the line after")
            fill(filler)
            gates[2].touch()  # it exits while the disk is full
            return await asyncio.wait_for(ended, DEADLINE)

        state = run(with_runtime(body))
        assert isinstance(state, Exited) and state.exit_code == 7, state
        assert (directory / shim.OUTPUT_LOG).read_text() == (
            f"{'before':>4095}\n[noduslocal] {lost} bytes of output were lost here "
            "(No space left on device)\nafter\n")
        # The compiled shim's lock is its directory: a file fewer for each task.
        assert sorted(p.name for p in directory.iterdir()) == [
            *([shim.LOCK] if SHIM[0] is None else []), shim.EXIT, shim.OUTPUT_LOG, shim.PID]


def test_no_room_for_its_records_means_the_job_never_starts(tmp_path: Path) -> None:
    """With no room on the attempt's disk for pid.json and exit.json, the shim ran the
    job anyway and could record neither: a restarted daemon then judged an attempt that had
    run as never started (and ran it again). Now the job is not started at all."""
    ran = tmp_path / "ran"
    with tmpfs(tmp_path / "disk", "1m") as disk:
        directory = new_dir(disk)
        fill(disk / "filler")

        async def body(runtime: Spawner) -> AttemptState:
            return await run_job(runtime, directory, ["touch", str(ran)], cwd=tmp_path)

        state = run(with_runtime(body))
        assert state == NeverStarted(NO_ROOM_DETAIL, certain=True), state
        assert not ran.exists()
        assert read_pid(directory) is None
