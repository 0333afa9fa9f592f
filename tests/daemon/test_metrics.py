"""What jobs report ($NODUS_METRICS_FILE, noduslocal.report) through a real daemon: live while
a job runs, kept when it ends, and a sweep's best cell. How the file is read is tested
without a daemon in tests/unit/test_metrics_file.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import noduslocal as nodus
from noduslocal import testing


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
    # Issue 28: `job status` shows them without --json too.
    shown = subprocess.run([sys.executable, "-m", "noduslocal.cli", "job", "status", job.name],
                           capture_output=True, text=True, timeout=60,
                           env={**os.environ, "NODUSLOCAL_SOCKET": str(daemon.socket)})
    assert "metrics:    throughput=250, loss=1" in shown.stdout, shown.stdout + shown.stderr


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
