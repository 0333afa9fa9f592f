"""Host jobs' cgroups against a scratch directory tree shaped as cgroupfs (issue 25): the
hierarchy found (v2, v1, none), the limits written in each one's files, the OOM killer's
count read from either, v2's one-write kill, and what exit.json's oom_killed becomes."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
from pathlib import Path

import pytest

from noduslocal.daemon.config.settings import LIVE, load_settings
from noduslocal.daemon.files.layout import JobLayout
from noduslocal.daemon.runtime import compiled_shim, shim
from noduslocal.daemon.runtime.attempt_dir import may_still_start, read_exit
from noduslocal.daemon.runtime.host.cgroups import (
    SYSTEM_PARENT,
    Cgroups,
    Limits,
    cgroup_name,
    parent_name,
    parse_cgroup_name,
)
from noduslocal.daemon.runtime.host.runtime import HostRuntime
from noduslocal.daemon.runtime.host.spawner import Spawner

V2_JOB_FILES = ("cgroup.procs", "cgroup.kill", "memory.max", "memory.swap.max", "cpu.max",
                "pids.max", "memory.events")
V1_JOB_FILES = {"memory": ("cgroup.procs", "memory.limit_in_bytes", "memory.oom_control"),
                "cpu": ("cgroup.procs", "cpu.cfs_period_us", "cpu.cfs_quota_us"),
                "pids": ("cgroup.procs", "pids.max"),
                "freezer": ("cgroup.procs", "freezer.state")}


def touch(directory: Path, *names: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name in names:
        (directory / name).touch()


def v2_tree(root: Path, parent: str, job: str) -> None:
    """What the kernel makes: the files of each cgroup appear with its mkdir."""
    touch(root, "cgroup.controllers", "cgroup.subtree_control", "cgroup.procs")
    (root / "cgroup.controllers").write_text("cpuset cpu io memory hugetlb pids rdma\n")
    touch(root / parent, "cgroup.subtree_control", "cgroup.procs")
    touch(root / parent / job, *V2_JOB_FILES)


def v1_tree(root: Path, parent: str, job: str) -> None:
    for controller, files in V1_JOB_FILES.items():
        touch(root / controller, "cgroup.procs")
        touch(root / controller / parent / job, *files)


def test_v2_is_found_and_its_controllers_handed_down(tmp_path: Path) -> None:
    v2_tree(tmp_path, "nl", "job-1-1-r0")
    cgroups = Cgroups.detect("nl", tmp_path)
    assert cgroups.enabled and cgroups.version == 2
    assert cgroups.controllers == ["memory", "cpu", "pids"]
    assert cgroups.parents == [tmp_path / "nl"]
    for where in (tmp_path, tmp_path / "nl"):
        assert (where / "cgroup.subtree_control").read_text() == "+memory +cpu +pids"


def test_v2_limits_are_written(tmp_path: Path) -> None:
    name = cgroup_name(7, 2, 1)
    assert name == "job-7-2-r1"
    v2_tree(tmp_path, "nl", name)
    cgroups = Cgroups.detect("nl", tmp_path)
    paths = cgroups.make(name, Limits(memory=64 * 2**20, cpu_m=1500, pids_max=100))
    job = tmp_path / "nl" / name
    assert paths == [str(job)]
    assert (job / "memory.max").read_text() == str(64 * 2**20)
    assert (job / "memory.swap.max").read_text() == "0"
    assert (job / "cpu.max").read_text() == "150000 100000"
    assert (job / "pids.max").read_text() == "100"
    cgroups.make(name, Limits(memory=None, cpu_m=250, pids_max=5))
    assert (job / "memory.max").read_text() == "max"
    assert (job / "cpu.max").read_text() == "25000 100000"


def test_v1_limits_are_written_in_each_hierarchy(tmp_path: Path) -> None:
    name = cgroup_name(3, 1, 0)
    v1_tree(tmp_path, "nl", name)
    (tmp_path / "unified").mkdir()  # a v2 tree without controllers beside v1 (this box)
    cgroups = Cgroups.detect("nl", tmp_path)
    assert cgroups.enabled and cgroups.version == 1
    assert cgroups.controllers == ["memory", "cpu", "pids", "freezer"]
    paths = cgroups.make(name, Limits(memory=2**30, cpu_m=500, pids_max=4096))
    # No freezer cgroup beside a pids one: a kill reads and kills the pids cgroup's
    # processes until it is empty (a task saves the freezer's mkdir, attach, rmdir).
    assert paths == [str(tmp_path / c / "nl" / name) for c in V1_JOB_FILES
                     if c != "freezer"]
    memory, cpu, pids = (tmp_path / c / "nl" / name for c in ("memory", "cpu", "pids"))
    assert (memory / "memory.limit_in_bytes").read_text() == str(2**30)
    assert (memory / "memory.oom_control").read_text() == "0"  # the OOM killer acts
    assert (cpu / "cpu.cfs_period_us").read_text() == ""  # the kernel's 100000, untouched
    assert (cpu / "cpu.cfs_quota_us").read_text() == "50000"
    assert (pids / "pids.max").read_text() == "4096"


def test_v1_with_some_hierarchies_uses_those(tmp_path: Path) -> None:
    touch(tmp_path / "pids", "cgroup.procs")
    cgroups = Cgroups.detect("nl", tmp_path)
    assert cgroups.enabled and cgroups.controllers == ["pids"]


def test_no_usable_hierarchy_says_why(tmp_path: Path) -> None:
    touch(tmp_path / "freezer", "cgroup.procs")  # a freezer alone limits nothing
    cgroups = Cgroups.detect("nl", tmp_path)
    assert not cgroups.enabled
    assert "not enforced" in cgroups.describe() and "memory" in cgroups.why
    v2 = tmp_path / "v2"
    touch(v2, "cgroup.controllers", "cgroup.subtree_control")
    (v2 / "cgroup.controllers").write_text("hugetlb\n")  # the unified tree here
    assert not Cgroups.detect("nl", v2).enabled


def test_unwritable_tree_is_no_cgroups(tmp_path: Path) -> None:
    touch(tmp_path, "cgroup.controllers")  # subtree_control missing: the write fails
    (tmp_path / "cgroup.controllers").write_text("memory pids\n")
    cgroups = Cgroups.detect("nl", tmp_path)
    assert not cgroups.enabled and "not writable" in cgroups.why


def test_oom_kills_are_read_from_either_version(tmp_path: Path) -> None:
    v1, v2, none = tmp_path / "v1", tmp_path / "v2", tmp_path / "none"
    touch(v1, "memory.oom_control")
    touch(v2, "memory.events")
    touch(none)
    (v1 / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    (v2 / "memory.events").write_text(
        "low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\noom_group_kill 0\n")
    assert shim.oom_kills([str(v1)]) == 2
    assert shim.oom_kills([str(v2)]) == 1
    assert shim.oom_kills([str(none), str(v1), str(v2)]) == 3
    (v2 / "memory.events").write_text("low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n")
    assert shim.oom_kills([str(v2)]) == 0


def test_v2_kill_writes_cgroup_kill(tmp_path: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    name = "job-1-1-r0"
    v2_tree(tmp_path, "nl", name)
    cgroups = Cgroups.detect("nl", tmp_path)
    assert cgroups.kill(name)  # no process listed: empty at once
    assert (tmp_path / "nl" / name / "cgroup.kill").read_text() == "1"
    kill = tmp_path / "nl" / name / "cgroup.kill"
    kill.write_text("")
    # The shim leaves an empty cgroup as it is (most jobs'), and says it saw it empty.
    assert shim.kill_cgroups([str(tmp_path / "nl" / name)]) is True
    assert kill.read_text() == ""
    # One with a process listed (no such pid: nothing real is killed), one round: never
    # seen empty, so the exit record does not say it was.
    (tmp_path / "nl" / name / "cgroup.procs").write_text(f"{2**22 + 1}\n")
    monkeypatch.setattr(shim, "CGROUP_KILL_ROUNDS", 1)
    assert shim.kill_cgroups([str(tmp_path / "nl" / name)]) is False
    assert kill.read_text() == "1"
    # One that cannot be read is not claimed empty either, and a gone one is empty.
    (tmp_path / "nl" / name / "cgroup.procs").unlink()
    (tmp_path / "nl" / name / "cgroup.procs").mkdir()
    assert shim.kill_cgroups([str(tmp_path / "nl" / name)]) is False
    assert shim.kill_cgroups([str(tmp_path / "nl" / "gone")]) is True


def test_v1_kill_freezes_and_thaws(tmp_path: Path) -> None:
    name = "job-1-1-r0"
    v1_tree(tmp_path, "nl", name)
    cgroups = Cgroups.detect("nl", tmp_path)
    assert cgroups.kill(name)
    assert (tmp_path / "freezer" / "nl" / name / "freezer.state").read_text() == "THAWED"


def test_release_removes_an_empty_cgroup_at_once_and_leaves_a_busy_one(
        tmp_path: Path) -> None:
    """remove_empty() is the release's cheap path on the event loop: an empty cgroup goes
    in every hierarchy; one the kernel refuses (a file here stands for a process, as the
    kernel's EBUSY) is left for remove(), which kills what is in it."""
    v1_tree(tmp_path, "nl", "x")
    cgroups = Cgroups.detect("nl", tmp_path)
    name = cgroup_name(5, 1, 0)
    for controller in V1_JOB_FILES:
        (tmp_path / controller / "nl" / name).mkdir()
    (tmp_path / "memory" / "nl" / name).rmdir()  # not made: no memory limit
    assert cgroups.remove_empty(name)
    assert not any((tmp_path / c / "nl" / name).exists() for c in V1_JOB_FILES)
    touch(tmp_path / "pids" / "nl" / name, "cgroup.procs")
    assert not cgroups.remove_empty(name)
    assert (tmp_path / "pids" / "nl" / name).exists()


def test_parent_is_per_data_dir(tmp_path: Path) -> None:
    system = Path("/var/lib/noduslocal")
    assert parent_name(system, system) == SYSTEM_PARENT
    mine, other = parent_name(tmp_path / "a", system), parent_name(tmp_path / "b", system)
    assert mine != other and mine.startswith(SYSTEM_PARENT + "-")


def test_exit_json_oom_killed_becomes_exited_oom(tmp_path: Path) -> None:
    def exited(**fields: object) -> object:
        (tmp_path / shim.EXIT).write_text(json.dumps(
            {"started_at": 1.0, "ended_at": 2.0, "signal": 9, **fields}))
        return read_exit(tmp_path)

    assert exited(exit_code=137, oom_killed=True).oom_killed is True  # type: ignore[attr-defined]
    assert exited(exit_code=137, oom_killed=False).oom_killed is False  # type: ignore[attr-defined]
    assert exited(exit_code=137).oom_killed is False  # type: ignore[attr-defined]
    # A child killed for memory while the job went on to exit 0: it succeeded.
    assert exited(exit_code=0, oom_killed=True).oom_killed is False  # type: ignore[attr-defined]


def test_compiled_request_carries_the_cgroups() -> None:
    req = {"dir": "/d", "cwd": "/w", "argv": ["true"], "env": {}, "boot_id": "b",
           "cgroups": ["/sys/fs/cgroup/memory/nl/job-1-1-r0", "/sys/fs/cgroup/pids/nl/x"]}
    body = compiled_shim.encode_request(req, 1)[4:].split(b"\0")
    # The cgroups, then the mount namespace's fields (none here: no mounts, no hides), then
    # the hold (none: not armed) and the go mark (none).
    assert body[-10:] == [b"2", b"/sys/fs/cgroup/memory/nl/job-1-1-r0",
                          b"/sys/fs/cgroup/pids/nl/x", b"0", b"0", b"", b"0", b"0", b"", b""]
    assert compiled_shim.encode_request({**req, "cgroups": []}, 1)[4:].split(b"\0")[-8] == b"0"
    armed = compiled_shim.encode_request({**req, "hold": 600, "mark": "ab12-3"}, 1)
    assert armed[4:].split(b"\0")[-3:] == [b"600", b"ab12-3", b""]


def test_compiled_request_carries_the_mounts() -> None:
    req = {"dir": "/d", "cwd": "/workspace", "argv": ["true"], "env": {}, "boot_id": "b",
           "mounts": [["/data/jobs/1/workspace", "/workspace"], ["/data/volumes/r", "/results"]],
           "hide": ["/dev/nvidia1"], "hide_with": "/data/hidden-device", "no_new_privs": True}
    body = compiled_shim.encode_request(req, 1)[4:].split(b"\0")
    assert body[-13:] == [b"0", b"4", b"/data/jobs/1/workspace", b"/workspace",
                          b"/data/volumes/r", b"/results", b"1", b"/dev/nvidia1",
                          b"/data/hidden-device", b"1", b"0", b"", b""]


def test_host_pids_max_is_a_live_setting(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text("host_pids_max = 64\n")
    config.chmod(0o600)
    assert load_settings(config, data_dir=tmp_path).host_pids_max == 64
    assert load_settings(data_dir=tmp_path).host_pids_max == 4096
    assert "host_pids_max" in LIVE


def test_an_empty_cgroup_is_removed_without_a_freeze(tmp_path: Path) -> None:
    """Its shim killed what was left at the end: freezing an empty v1 cgroup cost more than
    the rest of its removal, a thousand times in a thousand-task map."""
    name = "job-1-1-r0"
    v1_tree(tmp_path, "nl", name)
    cgroups = Cgroups.detect("nl", tmp_path)
    for controller in V1_JOB_FILES:  # a scratch tree's files would keep rmdir() out
        for child in (tmp_path / controller / "nl" / name).iterdir():
            if controller != "freezer" or child.name != "freezer.state":
                child.unlink()
    state = tmp_path / "freezer" / "nl" / name / "freezer.state"
    cgroups.remove(name)
    assert state.read_text() == ""  # never frozen
    for controller in ("memory", "cpu", "pids"):
        assert not (tmp_path / controller / "nl" / name).exists()


def test_release_removes_only_the_hierarchies_make_made(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A v1 box has five hierarchies and a rank without a memory limit or denied GPUs is
    made in two (cpu, pids): its release looks at those two, not five (three rmdirs of
    missing directories per task, issue 25 part 5), and keeps them for the next rank; a
    daemon that did not make it (after a restart) tries every hierarchy."""
    name = cgroup_name(7, 1, 0)
    v1_tree(tmp_path, "nl", name)  # its files, as the kernel makes them with the mkdir
    cgroups = Cgroups.detect("nl", tmp_path)
    made = cgroups.make(name, Limits(None, 1000, 100))
    assert made == [str(tmp_path / c / "nl" / name) for c in ("cpu", "pids")]
    tried: list[str] = []
    monkeypatch.setattr("os.rmdir", lambda path: tried.append(str(path)))
    assert cgroups.remove_empty(name)
    assert tried == [] and not any(Path(path).exists() for path in made)
    assert Cgroups.detect("nl", tmp_path).remove_empty(name)
    assert tried == [str(p) for p in cgroups.paths(name)]


def test_an_empty_cpu_and_pids_cgroup_is_kept_for_the_next_rank(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """v1's cpu and pids cgroups are renamed for the next rank instead of removed and made
    again; a limit is written only where its value differs; one with a process left in it
    is not kept; memory's is never kept; the kept ones go at the daemon's end."""
    rmdir = os.rmdir

    def as_the_kernel(path: str) -> None:  # a cgroup's own files go with it
        procs = Path(path) / "cgroup.procs"
        if procs.exists() and procs.read_text():
            raise OSError(errno.EBUSY, "busy", path)
        for entry in os.scandir(path):
            if entry.is_file():
                os.unlink(entry.path)
        rmdir(path)

    monkeypatch.setattr("os.rmdir", as_the_kernel)
    first = cgroup_name(1, 1, 0)
    v1_tree(tmp_path, "nl", first)
    cgroups = Cgroups.detect("nl", tmp_path)
    cgroups.make(first, Limits(1 << 30, 1000, 100))
    cpu, pids = (tmp_path / c / "nl" for c in ("cpu", "pids"))
    (cpu / first / "cpu.cfs_quota_us").write_text("100000")  # what the kernel would show
    assert (pids / first / "pids.max").read_text() == "100"
    assert cgroups.remove_empty(first)
    assert not (tmp_path / "memory" / "nl" / first).exists()
    (idle_cpu,) = [p for p in cpu.iterdir() if p.name.startswith("idle-")]
    (idle_pids,) = [p for p in pids.iterdir() if p.name.startswith("idle-")]
    assert (idle_cpu / "cpu.cfs_quota_us").exists()

    second = cgroup_name(2, 1, 0)
    (idle_pids / "pids.max").write_text("untouched")
    cgroups.make(second, Limits(None, 1000, 100))
    assert not idle_cpu.exists() and (cpu / second / "cpu.cfs_quota_us").exists()
    assert (pids / second / "pids.max").read_text() == "untouched"  # the same value
    (pids / second / "cgroup.procs").write_text("4242\n")  # a process left behind
    assert not cgroups.remove_empty(second)
    assert (pids / second).exists()
    (pids / second / "cgroup.procs").write_text("")
    assert cgroups.remove_empty(second)

    third = cgroup_name(3, 1, 0)
    cgroups.make(third, Limits(None, 0, 200))  # no CPU limit, another pids limit
    assert (cpu / third / "cpu.cfs_quota_us").read_text() == "-1"
    assert (pids / third / "pids.max").read_text() == "200"
    assert cgroups.remove_empty(third)
    cgroups.remove_parents()
    assert not list(tmp_path.glob("*/nl/idle-*")) and not cpu.exists()


def test_a_rank_its_shim_saw_empty_is_kept_without_a_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The shim reads a rank's cgroups after its end (to kill what its job left) and its
    exit record says when it saw them empty: the release then keeps them for the next rank
    without reading each cgroup.procs again (two opens a task on the loop, issue 25 part
    5). A rank without that word, or one an exec was sent into, is read as before."""
    first, second, third = (cgroup_name(n, 1, 0) for n in (1, 2, 3))
    for name in (first, second, third):
        v1_tree(tmp_path, "nl", name)
    cgroups = Cgroups.detect("nl", tmp_path)
    cpu, pids = (tmp_path / c / "nl" for c in ("cpu", "pids"))
    for name in (first, second, third):
        cgroups.make(name, Limits(None, 1000, 100))
    opened: list[str] = []
    real_open = os.open

    def counting(path: str, *args: int) -> int:
        opened.append(str(path))
        return real_open(path, *args)

    monkeypatch.setattr("os.open", counting)
    cgroups.ended_empty(first)
    assert cgroups.remove_empty(first)
    assert not (cpu / first).exists() and not (pids / first).exists()
    assert len(list(tmp_path.glob("*/nl/idle-*"))) == 2 and opened == []
    # No such word: each cgroup.procs is read, and one that lists a process is not kept.
    (pids / second / "cgroup.procs").write_text("4242\n")
    assert cgroups.remove_empty(second) is False
    assert opened == [str(cpu / second / "cgroup.procs"), str(pids / second / "cgroup.procs")]
    # An exec was sent in: the word does not keep it out of the removal.
    rmdirs: list[str] = []
    monkeypatch.setattr("os.rmdir", lambda path: rmdirs.append(str(path)))
    cgroups.admit(third)
    cgroups.ended_empty(third)
    assert cgroups.remove_empty(third)
    assert rmdirs == [str(cpu / third), str(pids / third)]
    # A name the daemon did not make (a restart's) is not remembered.
    cgroups.ended_empty(cgroup_name(9, 1, 0))
    assert not cgroups._emptied


def test_v2_keeps_no_cgroup(tmp_path: Path) -> None:
    """v2's one cgroup holds the memory controller too, and v2 refuses a rename."""
    name = cgroup_name(1, 1, 0)
    v2_tree(tmp_path, "nl", name)
    cgroups = Cgroups.detect("nl", tmp_path)
    cgroups.make(name, Limits(None, 1000, 100))
    for entry in (tmp_path / "nl" / name).iterdir():
        entry.unlink()
    assert cgroups.remove_empty(name)
    assert [p.name for p in (tmp_path / "nl").iterdir() if p.is_dir()] == []


def test_a_full_pool_removes_and_a_vanished_idle_cgroup_is_made_anew(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past IDLE_MAX an empty cgroup is removed as before (and forgotten: a daemon that
    runs for months keeps nothing per rank); an idle one removed behind the daemon's back
    (an admin's cleanup) is made again rather than failing the rank's start."""
    from noduslocal.daemon.runtime.host import cgroups as module

    name, again = cgroup_name(1, 1, 0), cgroup_name(2, 1, 0)
    full = tmp_path / "full"
    v1_tree(full, "nl", name)  # the files the kernel makes with each mkdir
    cgroups = Cgroups.detect("nl", full)
    made = cgroups.make(name, Limits(None, 0, 100))
    monkeypatch.setattr(module, "IDLE_MAX", 0)
    removed: list[str] = []
    monkeypatch.setattr("os.rmdir", lambda path: removed.append(str(path)))
    assert cgroups.remove_empty(name)
    assert removed == made and not cgroups._limits
    monkeypatch.undo()

    root = tmp_path / "vanished"
    v1_tree(root, "nl", name)
    cgroups = Cgroups.detect("nl", root)
    cgroups.make(name, Limits(None, 0, 100))
    assert cgroups.remove_empty(name)
    for idle in root.glob("*/nl/idle-*"):
        shutil.rmtree(idle)
    v1_tree(root, "nl", again)
    assert cgroups.make(again, Limits(None, 0, 100)) == [
        str(root / c / "nl" / again) for c in ("cpu", "pids")]
    assert (root / "pids" / "nl" / again / "pids.max").read_text() == "100"


def test_a_restart_removes_ended_ranks_cgroups_without_warning_of_missing_ones(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A rank is made in the hierarchies it needs (v1: cpu and pids, no memory limit): the
    restarted daemon's sweep of ended ranks warned "removing cgroup .../memory/... failed:
    No such file or directory" for each hierarchy it had never been made in (three lines a
    rank in the 200-task kill -9 test's log)."""
    name = cgroup_name(7, 1, 0)
    for controller in V1_JOB_FILES:
        touch(tmp_path / controller, "cgroup.procs")
        touch(tmp_path / controller / "nl", "cgroup.procs")
    for controller in ("cpu", "pids"):  # empty: the kernel's files go with the rmdir
        (tmp_path / controller / "nl" / name).mkdir()
    cgroups = Cgroups.detect("nl", tmp_path)
    with caplog.at_level("WARNING"):
        assert cgroups.remove_unheld() == 1
    assert [r.getMessage() for r in caplog.records] == []
    assert not any((tmp_path / c / "nl" / name).exists() for c in V1_JOB_FILES)



def test_a_rank_an_exec_was_sent_into_is_not_kept_for_the_next(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An exec enters a rank's cgroups by path while the rank may be ending; one that
    entered right after the release's emptiness check would have gone into the pool with
    the cgroup, and on into the next rank's (another user's perhaps). A rank admit()
    handed out is removed at its release, not kept; the others still are."""
    rmdir = os.rmdir

    def as_the_kernel(path: str) -> None:  # a cgroup's own files go with it
        for entry in os.scandir(path):
            if entry.is_file():
                os.unlink(entry.path)
        rmdir(path)

    monkeypatch.setattr("os.rmdir", as_the_kernel)
    first, second = cgroup_name(1, 1, 0), cgroup_name(2, 1, 0)
    for name in (first, second):
        v1_tree(tmp_path, "nl", name)  # with the files the kernel gives a new cgroup
    cgroups = Cgroups.detect("nl", tmp_path)
    cpu, pids = (tmp_path / c / "nl" for c in ("cpu", "pids"))
    for name in (first, second):
        cgroups.make(name, Limits(None, 1000, 100))
    assert {str(cpu / first), str(pids / first)} <= set(cgroups.admit(first))
    assert cgroups.remove_empty(first)
    assert not (cpu / first).exists() and not (pids / first).exists()
    assert not list(tmp_path.glob("*/nl/idle-*"))  # before: kept, and the exec with them
    assert cgroups.remove_empty(second)
    assert len(list(tmp_path.glob("*/nl/idle-*"))) == 2  # no exec: kept


def test_a_restart_keeps_the_cgroup_of_a_rank_whose_shim_may_still_start(
        tmp_path: Path) -> None:
    """A shim the last daemon let go just before it died may not have reached its lock
    when the next daemon starts: the restart's sweep removed its empty cgroup, and the job
    then failed 126 ("cannot enter its cgroup") without running."""
    jobs = tmp_path / "jobs"
    states = {  # job id: what its attempt 1 directory holds
        1: "a let-go shim on its way (nothing yet)", 2: "a shim holding its lock",
        3: "the exit record", 4: "given up (abandoned)", 5: "a pid record, its shim gone",
        6: "no directory", 7: "the Python shim holding its lock file"}
    for job_id in states:
        if job_id != 6:
            (jobs / str(job_id) / "attempt-1").mkdir(parents=True)
    attempt = {job_id: jobs / str(job_id) / "attempt-1" for job_id in states}
    (attempt[3] / shim.EXIT).write_text('{"exit_code": 0}')
    (attempt[4] / shim.ABANDONED).touch()
    (attempt[5] / shim.PID).write_text('{"pid": 1, "shim_pid": 1}')
    held = os.open(attempt[2], os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(held, fcntl.LOCK_EX)
    python_held = os.open(attempt[7] / shim.LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(python_held, fcntl.LOCK_EX)
    try:
        assert {job_id: may_still_start(attempt[job_id]) for job_id in states} == {
            1: True, 2: True, 3: False, 4: False, 5: False, 6: False, 7: True}
        for controller in V1_JOB_FILES:
            touch(tmp_path / "cg" / controller, "cgroup.procs")
            touch(tmp_path / "cg" / controller / "nl", "cgroup.procs")
        for controller in ("cpu", "pids"):  # empty: the kernel's files go with the rmdir
            for job_id in states:
                (tmp_path / "cg" / controller / "nl" / cgroup_name(job_id, 1, 0)).mkdir()
        cgroups = Cgroups.detect("nl", tmp_path / "cg")

        def may_start(name: str) -> bool:
            parsed = parse_cgroup_name(name)
            assert parsed is not None and parsed[1:] == (1, 0), name
            return may_still_start(attempt[parsed[0]])
        assert cgroups.remove_unheld(may_start) == 4
        assert sorted(cgroups.names()) == [cgroup_name(j, 1, 0) for j in (1, 2, 7)]
    finally:
        os.close(held)
        os.close(python_held)
    # The look leaves the directories as they were: a made-ahead first attempt with a lock
    # file in it read as more than prepare_ahead() makes, and its cell spent attempt 1.
    assert list(attempt[1].iterdir()) == [] and list(attempt[2].iterdir()) == []
    assert parse_cgroup_name("idle-3") is None


def test_the_restart_looks_at_an_index_s_directory_for_an_indexed_job_s_cgroup(
        tmp_path: Path) -> None:
    """An indexed job's rank cgroup is named for the index, whose files are in index-N: the
    look at the attempt directory itself (no records ever) kept index 0's forever."""
    layout = JobLayout(tmp_path)
    runtime = HostRuntime(layout, Spawner(None))
    indexed, plain = layout.attempt_dir(1, 1), layout.attempt_dir(2, 1)
    for directory in (indexed / "index-0", indexed / "index-1", plain / "rank-1"):
        directory.mkdir(parents=True)
    (indexed / "index-0" / shim.EXIT).write_text('{"exit_code": 0}')
    (plain / shim.EXIT).write_text('{"exit_code": 0}')
    assert [runtime._may_start(cgroup_name(*key)) for key in (
        (1, 1, 0), (1, 1, 1), (2, 1, 0), (2, 1, 1), (2, 1, 2), (3, 1, 0))] == [
        False, True, False, True, False, False]
