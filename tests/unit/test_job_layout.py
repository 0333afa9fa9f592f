"""The job layout's own files, written as the daemon does: from the runner and from the
thread that makes a sweep's next cells' directories ahead, possibly at the same moment."""

from __future__ import annotations

import errno
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from noduslocal.daemon.files.layout import RECORD, RECORD_XATTR, JobLayout
from noduslocal.daemon.files.overlay import OVERLAY_DIR
from noduslocal.domain.jobs import JobRecord, JobSpec


@pytest.fixture(autouse=True, params=["attribute", "file"])
def record_kind(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
                ) -> Iterator[str]:
    """Every test with the record as the directory's extended attribute, and as the file
    a file system without such attributes gets."""
    if request.param == "file":
        def unsupported(*_: object) -> None:
            raise OSError(errno.ENOTSUP, "Operation not supported")
        monkeypatch.setattr(os, "setxattr", unsupported)
    yield request.param


def listing(layout: JobLayout, job_id: int) -> list[str]:
    """What the job's directory holds, its record file aside."""
    return sorted(p.name for p in layout.job_dir(job_id).iterdir() if p.name != RECORD)


def job(job_id: int) -> JobRecord:
    return JobRecord(id=job_id, project="p", name=f"j{job_id}", owner_uid=0, owner_gid=0,
                     owner="root", spec=JobSpec(command=["true"]), phase="Pending", labels={},
                     created_at=1.0)


def test_two_writers_of_one_record_at_once_both_succeed(tmp_path: Path) -> None:
    """prepare() and prepare_ahead() both wrote the record through one temporary name:
    the first rename took the file from under the second (FileNotFoundError), and the
    sweep's cell failed to start (seen in a 1,000-task map, 3 runs in 5)."""
    layout = JobLayout(tmp_path)
    layout.create_root()
    failures: list[BaseException] = []
    for job_id in range(1, 301):
        record = job(job_id)
        layout.job_dir(job_id).mkdir()
        start = threading.Barrier(2)

        def write(record: JobRecord = record, start: threading.Barrier = start) -> None:
            start.wait()
            try:
                layout.write_record(record)
            except BaseException as exc:  # collected for the assertion
                failures.append(exc)

        threads = [threading.Thread(target=write) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert (layout.read_record(job_id) or {})["id"] == job_id
    assert failures == []
    assert not [p for p in tmp_path.rglob("*.tmp")]


def killed_while_made_ahead(layout: JobLayout, record: JobRecord, left: str) -> None:
    """What a daemon killed in the middle of prepare_ahead() leaves behind."""
    layout.job_dir(record.id).mkdir(mode=0o711)
    if left == "a record never renamed into place":
        (layout.job_dir(record.id) / f".{RECORD}.1234.tmp").write_text('{"id": ')
    elif left == "the record, no workspace":
        layout.write_record(record)
    elif left.startswith("an overlay's directory"):  # a cell with code, killed in attach()
        layout.write_record(record)
        layout.workspace(record.id).mkdir(mode=0o700)
        (layout.job_dir(record.id) / OVERLAY_DIR).mkdir(mode=0o700)
        if left == "an overlay's directory with its upper, no work":
            (layout.job_dir(record.id) / OVERLAY_DIR / "upper").mkdir(mode=0o700)


@pytest.mark.parametrize("left", [
    "the directory alone", "a record never renamed into place", "the record, no workspace",
    "an overlay's directory without its upper",
    "an overlay's directory with its upper, no work"])
def test_a_next_daemon_starts_a_job_whose_directories_were_made_in_part(
        tmp_path: Path, left: str) -> None:
    """A sweep's cell failed with StartFailed "File exists: .../jobs/13" after a kill -9
    caught the thread making its directories ahead (CI, five kill -9s, 2 cells in 50). And
    again where the thread had made a cell's overlay directory and not yet its upper (CI,
    test_200_tasks_with_code_across_three_kill_9s; about 1 run in 6 under load here)."""
    record = job(13)
    first = JobLayout(tmp_path)
    first.create_root()
    killed_while_made_ahead(first, record, left)
    attempt = JobLayout(tmp_path).prepare(record, 1)
    assert attempt.is_dir() and layout_record(first, 13)["created_at"] == 1.0
    assert not list(first.job_dir(13).glob(".*.tmp"))


def layout_record(layout: JobLayout, job_id: int) -> dict:
    record = layout.read_record(job_id)
    assert record is not None
    return record


@pytest.mark.parametrize("other", ["another database's record", "a workspace with files"])
def test_a_job_directory_with_anything_else_in_it_is_still_refused(
        tmp_path: Path, other: str) -> None:
    layout = JobLayout(tmp_path)
    layout.create_root()
    layout.job_dir(13).mkdir(mode=0o711)
    if other == "another database's record":
        stranger = job(13)
        stranger.created_at = 2.0
        layout.write_record(stranger)
    else:
        layout.workspace(13).mkdir()
        (layout.workspace(13) / "model.pt").write_text("someone's")
    with pytest.raises(FileExistsError):
        layout.prepare(job(13), 1)


def test_an_attempt_takes_what_was_made_ahead_as_it_is(tmp_path: Path) -> None:
    """A sweep's next cell whose directories were all made ahead starts without a system
    call on the loop, and finds the same tree the long way makes: the record, an empty
    workspace and its attempt's directory."""
    layout = JobLayout(tmp_path)
    layout.create_root()
    ahead, slow = job(1), job(2)
    layout.prepare_ahead(ahead)
    assert layout.prepare(ahead, 1) == layout.attempt_dir(1, 1)
    assert layout.prepare(slow, 1) == layout.attempt_dir(2, 1)
    for job_id in (1, 2):
        assert (layout.read_record(job_id) or {})["id"] == job_id
        assert listing(layout, job_id) == ["attempt-1", "workspace"]
        assert not any(layout.workspace(job_id).iterdir())


def test_a_start_before_the_thread_gets_to_its_cell_keeps_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A sweep hands 32 cells at once to the thread that makes directories ahead; the loop
    may start one the thread has not begun. The thread used to begin it just then (between
    the loop's look and its mkdir): the loop's mkdir found the job's directory made and the
    cell failed. Now the loop claims it first and the thread leaves it alone."""
    layout = JobLayout(tmp_path)
    layout.create_root()
    record = job(7)
    layout.expect_ahead([7])
    look = layout._made_ahead

    def thread_begins_meanwhile(j: JobRecord) -> bool:
        seen = look(j)  # nothing there yet
        layout.prepare_ahead(j)  # as the thread would, between the look and the mkdir
        return seen

    monkeypatch.setattr(layout, "_made_ahead", thread_begins_meanwhile)
    assert layout.prepare(record, 1) == layout.attempt_dir(7, 1)
    assert listing(layout, 7) == ["attempt-1", "workspace"]
    assert not layout.ahead_unused(7)


def test_the_record_is_the_directory_s_attribute_where_it_can_be(
        tmp_path: Path, record_kind: str) -> None:
    """No inode a job for its record where the file system takes extended attributes (a
    map of `true` made six a task, each dearer after deletions on a file system without a
    journal); a file where it does not. Either way only root reads it."""
    layout = JobLayout(tmp_path)
    layout.create_root()
    layout.prepare(job(5), 1)
    record = layout.read_record(5)
    assert record is not None and record["spec"]["command"] == ["true"]
    assert (layout.job_dir(5) / RECORD).exists() == (record_kind == "file")
    if record_kind == "attribute":
        assert json.loads(os.getxattr(layout.job_dir(5), RECORD_XATTR))["id"] == 5
    assert layout.has_record(5) and not layout.has_record(6)


def test_a_release_where_overlays_are_off_leaves_a_snapshot_others_use(
        tmp_path: Path) -> None:
    """A daemon started with overlays off (overlay_workspaces = false, or no overlayfs
    this time) still counts who uses each snapshot: removing one job must not take the
    snapshot that other kept workspaces are made of."""
    layout = JobLayout(tmp_path, overlay=False)
    snapshot = tmp_path / "snapshots" / "0-abc"
    snapshot.mkdir(parents=True)
    for job_id in (1, 2):
        top = layout.job_dir(job_id) / OVERLAY_DIR
        top.mkdir(parents=True)
        (top / "lower").write_text("0-abc")
    layout.create_root()  # the daemon's start finds them
    layout.remove(1)
    assert not layout.job_dir(1).exists()
    assert snapshot.is_dir()
