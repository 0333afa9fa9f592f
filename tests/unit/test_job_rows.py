"""`job list`'s rows: a sweep's listed cells as one line at its first's place, unless
--cells (issue 28: a 500-task sweep was 500 lines)."""

from __future__ import annotations

from typing import Any

from noduslocal.cli.job_rows import rows


def job(name: str, phase: str, sweep: str | None = None, cell: int | None = None,
        project: str = "u") -> dict[str, Any]:
    return {"name": name, "project": project, "owner": "u", "phase": phase,
            "created_at": "2026-12-07T00:00:00.000Z", "labels": {"sweep": sweep} if sweep else {},
            "cell": cell}


JOBS = [job("a", "Running"), job("s-0", "Succeeded", "s", 0), job("s-1", "Running", "s", 1),
        job("b", "Pending", "s"),  # a label alone makes no cell (a user's own job)
        job("s-2", "Pending", "s", 2), job("s-0", "Failed", "s", 0, project="other")]


def test_a_sweep_is_one_line_at_its_first_cells_place() -> None:
    got = rows(JOBS, cells=False)
    assert [(r[0], r[1], r[3]) for r in got] == [
        ("a", "u", "Running"), ("s", "u", "Running"), ("b", "u", "Pending"),
        ("s", "other", "Failed")]
    assert got[1][4] == "sweep: 3 tasks listed (1 running, 1 pending, 1 succeeded); " \
                        "--cells lists them"


def test_cells_lists_every_job() -> None:
    assert [r[0] for r in rows(JOBS, cells=True)] == [j["name"] for j in JOBS]
