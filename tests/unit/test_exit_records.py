"""An attempt's exit record as the daemon reads it: a cluster job's owner can write their
node directory, so a record that is not what a shim writes (missing fields, wrong types,
a link) reads as no record, never as an exception in the runtime's poll (which stopped
every user's cluster jobs from being seen to end)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from noduslocal.daemon.runtime.attempt_dir import read_exit
from noduslocal.daemon.runtime.base import Exited
from noduslocal.daemon.runtime.shim import EXIT

GOOD = {"exit_code": 3, "signal": None, "started_at": 10.0, "ended_at": 12.5}


def write(directory: Path, record: Any) -> Path:
    (directory / EXIT).write_text(json.dumps(record))
    return directory


def test_a_record_a_shim_wrote_is_its_exit(tmp_path: Path) -> None:
    assert read_exit(write(tmp_path, GOOD)) == Exited(3, None, 10.0, 12.5, oom_killed=False)
    killed = {**GOOD, "exit_code": 0, "signal": 9, "started_at": 10}
    assert read_exit(write(tmp_path, killed)) == Exited(0, 9, 10.0, 12.5, oom_killed=False)


@pytest.mark.parametrize("record", [
    {}, [], "3", {**GOOD, "exit_code": "3"}, {**GOOD, "exit_code": True},
    {**GOOD, "signal": "KILL"}, {**GOOD, "started_at": None}, {**GOOD, "ended_at": "soon"},
    {**GOOD, "started_at": float("nan")}, {**GOOD, "ended_at": float("inf")},
    {"exit_code": 0},
])
def test_a_record_that_is_not_a_shims_is_no_record(tmp_path: Path, record: Any) -> None:
    assert read_exit(write(tmp_path, record)) is None


def test_a_link_or_a_directory_in_its_place_is_no_record(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.json"
    target.write_text(json.dumps(GOOD))
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / EXIT).symlink_to(target)
    assert read_exit(linked) is None
    dirred = tmp_path / "dirred"
    (dirred / EXIT).mkdir(parents=True)
    assert read_exit(dirred) is None
