"""What an attempt directory found after a lost database says about a start: the files a
shim of either kind leaves from the moment it holds its lock, and the stop of one not
yet started; the boot the last daemon started in."""

from __future__ import annotations

from pathlib import Path

import pytest

from noduslocal.daemon.jobs import orphans
from noduslocal.daemon.jobs.orphans import _shows_start, _stop_attempt
from noduslocal.daemon.runtime import shim


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
