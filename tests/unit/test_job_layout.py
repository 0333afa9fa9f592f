"""The job layout's own files, written as the daemon does: from the runner and from the
thread that makes a sweep's next cells' directories ahead, possibly at the same moment."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from noduslocal.daemon.files.layout import RECORD, JobLayout
from noduslocal.domain.jobs import JobRecord, JobSpec


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
        assert json.loads((layout.job_dir(job_id) / RECORD).read_text())["id"] == job_id
    assert failures == []
    assert not [p for p in tmp_path.rglob("*.tmp")]
