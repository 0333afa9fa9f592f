"""What jobs report ($NODUS_METRICS_FILE, noduslocal.report): folded to the last value of
each number, read without following links or trusting files the owner does not own, live
while a job runs, kept when it ends, and a sweep's best cell."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import noduslocal as nodus
from noduslocal import testing
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


def test_a_job_reports_live_and_keeps_its_last_values(daemon: testing.Daemon,
                                                      tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    script = ("import os, time, noduslocal\n"
              "noduslocal.report(throughput=100.0, loss=1.0)\n"
              f"while not os.path.exists({str(gate)!r}): time.sleep(0.05)\n"
              "noduslocal.report(throughput=250.0)\n")
    job = nodus.Job.run(command=[sys.executable, "-c", script])
    testing.wait_until(lambda: job.status()["metrics"] == {"throughput": 100.0, "loss": 1.0},
                       "the first report to show while the job runs")
    gate.touch()
    done = job.wait(timeout=60)
    assert done["metrics"] == {"throughput": 250.0, "loss": 1.0}
    again = nodus.Job.from_name(job.name).status()
    assert again["metrics"] == {"throughput": 250.0, "loss": 1.0}


def test_the_best_cell_has_the_highest_throughput(daemon: testing.Daemon) -> None:
    sweep = nodus.Sweep({"command": [
        "sh", "-c", 'echo "{\\"throughput\\": $((X % 3))}" >> "$NODUS_METRICS_FILE"']},
        grid={"X": [1, 2, 4, 5, 3]}, name="fastest").run()
    status = sweep.wait(timeout=60)
    assert status["phase"] == "Succeeded"
    assert [c["throughput"] for c in sweep.cells()] == [1.0, 2.0, 1.0, 2.0, 0.0]
    # cells 1 and 3 tie at 2.0 with the same cost: the lower index wins.
    assert (status["best"]["index"], status["best"]["params"]) == (1, {"X": "2"})
    out = subprocess.run([sys.executable, "-m", "noduslocal.cli", "sweep", "status",
                          "fastest"], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "NODUSLOCAL_SOCKET": str(daemon.socket)})
    assert "best   cell 1 (X=2): throughput 2" in out.stdout


def test_a_sweep_without_reports_has_no_best(daemon: testing.Daemon) -> None:
    sweep = nodus.Sweep({"command": ["true"]}, grid={"X": [1, 2]}, name="quiet").run()
    assert sweep.wait(timeout=60)["best"] is None
