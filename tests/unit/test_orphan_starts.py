"""What an attempt directory found after a lost database says about a start: the files a
shim of either kind leaves from the moment it holds its lock, and the stop of one not
yet started; the boot the last daemon started in; a pending job's next attempt that an
armed start prepared and a kill left unstarted (abandoned, its number spent), and a first
attempt's directories a kill left half made (made again)."""

from __future__ import annotations

import fcntl
import os
import threading
from pathlib import Path

import pytest

from noduslocal.daemon.files.layout import JobLayout
from noduslocal.daemon.jobs import orphans
from noduslocal.daemon.jobs.orphans import _shows_start, _stop_attempt, lost_starts
from noduslocal.daemon.recovery import drop_torn_first
from noduslocal.daemon.runtime import shim
from noduslocal.domain.jobs import JobRecord, JobSpec
from noduslocal.domain.states import AttemptPhase


@pytest.mark.parametrize("left", [
    shim.LOCK,  # the Python shim's lock
    f".{shim.PID}.tmp",  # the Python shim, its pid record reserved
    f".{shim.EXIT}.tmp",  # the compiled shim, its one record file reserved (no LOCK)
    shim.NO_ROOM,  # the compiled shim, no room for its records: it said so and stopped
    shim.PID,
])
def test_a_shim_past_its_lock_shows_a_start(tmp_path: Path, left: str) -> None:
    (tmp_path / left).touch()
    assert _shows_start(tmp_path)


def test_an_attempt_directory_made_ahead_shows_none(tmp_path: Path) -> None:
    assert not _shows_start(tmp_path)


def test_stopping_where_no_shim_lives(tmp_path: Path) -> None:
    """None alive: a shim that starts there later finds the attempt abandoned; a missing
    directory is no shim either."""
    assert not _stop_attempt(tmp_path)
    assert (tmp_path / shim.ABANDONED).exists()
    assert not _stop_attempt(tmp_path / "never-made")


def test_the_boot_record_says_the_boot_the_last_daemon_started_in(tmp_path: Path) -> None:
    """A daemon that finds another boot recorded knows the machine stopped under the last
    one (its unsynced starts may be lost without damage); it records its own, durably."""
    record = tmp_path / orphans.BOOT_RECORD
    assert orphans.swap_boot_record(record) is None
    now = shim.boot_id()
    assert record.read_text() == f"{now}\n"
    assert orphans.swap_boot_record(record) == now  # a restart in the same boot
    record.write_text("another-boot\n")
    assert orphans.swap_boot_record(record) == "another-boot"
    assert record.read_text() == f"{now}\n"
    assert [p.name for p in tmp_path.iterdir()] == [orphans.BOOT_RECORD]


def test_a_boot_record_that_cannot_be_written_does_not_stop_the_start(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    record = tmp_path / "missing" / orphans.BOOT_RECORD  # its directory is not there
    assert orphans.swap_boot_record(record) is None
    assert "recording this boot" in caplog.text


def pending(job_id: int, attempts: int, created_at: float = 1.0) -> JobRecord:
    return JobRecord(id=job_id, project="p", name=f"j{job_id}", owner_uid=os.getuid(),
                     owner_gid=os.getgid(), owner="me", phase="Pending",
                     spec=JobSpec(command=["true"]), labels={}, created_at=created_at,
                     attempts=attempts)


def made(layout: JobLayout, job: JobRecord, link: bool) -> Path:
    """The job's directory and workspace as prepare() makes them (with a volume's link
    in the workspace when `link`)."""
    layout.job_dir(job.id).mkdir(parents=True)
    layout.write_record(job)
    layout.workspace(job.id).mkdir()
    if link:
        (layout.workspace(job.id) / "v").symlink_to("/nonexistent-volume")
    return layout.job_dir(job.id)


@pytest.mark.parametrize("number", [1, 2])
def test_a_next_attempt_prepared_and_never_started_is_abandoned_and_spent(
        tmp_path: Path, number: int) -> None:
    """Its directory is marked abandoned under its locks (a shim let go late runs
    nothing) and comes back as an attempt that did not start, no loss of the
    database's; read again (a recovery killed before its commit), it still is."""
    layout = JobLayout(tmp_path, overlay=False)
    job = pending(7, number - 1)
    made(layout, job, link=True)
    directory = layout.attempt_dir(job.id, number)
    directory.mkdir()
    for _ in range(2):
        current, later = lost_starts(layout, job)
        assert current is None and len(later) == 1
        [attempt] = later
        assert (attempt.number, attempt.phase, attempt.abandoned, attempt.armed) == (
            number, AttemptPhase.NOT_STARTED, True, True)
        assert (directory / shim.ABANDONED).exists()


def marked_ahead(tmp_path: Path) -> tuple[JobLayout, JobRecord, Path]:
    """A pending job's first attempt made ahead, with the go mark the last daemon put on
    it as it let the attempt's shim go."""
    layout = JobLayout(tmp_path, overlay=False)
    job = pending(7, 0)
    made(layout, job, link=False)
    directory = layout.attempt_dir(job.id, 1)
    directory.mkdir()
    os.setxattr(directory, shim.GO_MARK, b"the-last-daemon-1")
    return layout, job, directory


def test_the_empty_first_attempt_made_ahead_is_taken_as_it_is(tmp_path: Path) -> None:
    """Taken as it is, once the go mark the last daemon put there (it let a shim go) is
    gone: a shim still on its way to the lock then runs nothing (test_armed_shims.py)."""
    layout, job, directory = marked_ahead(tmp_path)
    assert lost_starts(layout, job) == (None, [])
    assert list(directory.iterdir()) == []  # not marked abandoned, no lock file made
    with pytest.raises(OSError):
        os.getxattr(directory, shim.GO_MARK)
    assert not drop_torn_first(layout, job)
    assert lost_starts(layout, job) == (None, [])  # read again: nothing to remove


def test_a_shim_at_the_lock_of_the_first_attempt_made_ahead_started(tmp_path: Path) -> None:
    """A shim holds the lock of the made-ahead directory, its records not yet reserved:
    it keeps its mark (it runs), and recovery waits for its records to read the start."""
    layout, job, directory = marked_ahead(tmp_path)
    lock = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)  # as the compiled shim holds it
        reserved = threading.Timer(0.3, (directory / f".{shim.EXIT}.tmp").touch)
        reserved.start()
        current, later = lost_starts(layout, job)
        reserved.join()
    finally:
        os.close(lock)
    assert current is None and [a.number for a in later] == [1]
    assert os.getxattr(directory, shim.GO_MARK) == b"the-last-daemon-1"


def test_a_first_attempt_half_made_is_dropped_to_be_made_again(tmp_path: Path) -> None:
    """More than prepare_ahead() makes and no attempt directory: the kill came while
    prepare() made them, before any shim was let go. Another database's job of that id
    is left alone."""
    layout = JobLayout(tmp_path, overlay=False)
    job = pending(7, 0)
    made(layout, job, link=True)
    assert drop_torn_first(layout, job)
    assert not layout.job_dir(job.id).exists()
    assert layout.first_look(job) == "absent"
    other = pending(8, 0, created_at=5.0)
    made(layout, other, link=True)
    assert not drop_torn_first(layout, pending(8, 0, created_at=9.0))
    assert layout.job_dir(other.id).exists()
