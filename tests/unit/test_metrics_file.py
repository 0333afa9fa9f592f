"""The metrics file a job reports into ($NODUS_METRICS_FILE, noduslocal.report), read
without a daemon: folded to the last value of each number, only its recent tail and a
capped number of keys, never through a link, a FIFO or a file the job's owner does not own."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import noduslocal as nodus
from noduslocal.domain import metrics


def write(workspace: Path, *lines: object) -> None:
    with open(workspace / metrics.METRICS_FILE, "a") as file:
        for line in lines:
            file.write((line if isinstance(line, str) else json.dumps(line)) + "\n")


def test_last_value_of_each_number_wins(tmp_path: Path) -> None:
    write(tmp_path, {"throughput": 10, "loss": 2.5}, "not json", [1, 2],
          {"throughput": 12.5, "flag": True, "name": "x", "nan": float("nan")}, {"": 1})
    assert metrics.read(tmp_path, 0) == {"throughput": 12.5, "loss": 2.5}


def test_only_the_recent_tail_is_read_and_keys_are_capped(tmp_path: Path) -> None:
    write(tmp_path, *({"old": i} for i in range(20_000)), {"new": 1})
    assert metrics.read(tmp_path, 0) == {"new": 1.0, "old": 19_999.0}
    other = tmp_path / "many"
    other.mkdir()
    write(other, {f"k{i}": i for i in range(100)})
    assert len(metrics.read(other, 0)) == metrics.MAX_KEYS


def test_links_fifos_and_strangers_files_are_not_read(tmp_path: Path) -> None:
    secret = tmp_path / "secret.json"
    secret.write_text('{"password_digits": 1234}\n')
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / metrics.METRICS_FILE).symlink_to(secret)
    assert metrics.read(linked, 0) == {}
    fifo = tmp_path / "fifo"
    fifo.mkdir()
    os.mkfifo(fifo / metrics.METRICS_FILE)
    assert metrics.read(fifo, 0) == {}  # and does not block
    owned = tmp_path / "owned"
    owned.mkdir()
    write(owned, {"x": 1})
    assert metrics.read(owned, 0) == {"x": 1.0}
    assert metrics.read(owned, 4242) == {}, "a file the job's owner does not own was read"
    assert metrics.read(tmp_path / "missing", 0) == {}


def test_report_appends_a_line_and_warns_outside_a_job(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(metrics.ENV, raising=False)
    with pytest.warns(UserWarning, match="not inside a noduslocal job"):
        nodus.report(throughput=1.0)
    monkeypatch.setenv(metrics.ENV, str(tmp_path / metrics.METRICS_FILE))
    nodus.report(throughput=3, loss=0.25)
    assert metrics.read(tmp_path, 0) == {"throughput": 3.0, "loss": 0.25}
    with pytest.raises(TypeError, match="loss must be a finite number"):
        nodus.report(loss=float("inf"))
