"""A host rank's pid.json is written once the job's process has started, a moment after its
launch is answered (the shim's clone returns at the job's exec): a signal or an exec sent
at once waits for it (runtime/host/runtime.py's recorded_pid). Before, an exec right after
an index started ran into "the job's process has ended" (test_indexed_jobs, under load)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from noduslocal.daemon.runtime import shim
from noduslocal.daemon.runtime.host.runtime import recorded_pid

PID = {"shim_pid": 10, "pid": 11, "pgid": 11, "started_at": 1.0, "boot_id": "b",
       "start_ticks": 5}


def test_a_pid_record_written_a_moment_later_is_waited_for(tmp_path: Path) -> None:
    async def body() -> object:
        loop = asyncio.get_running_loop()
        loop.call_later(0.2, lambda: (tmp_path / shim.PID).write_text(json.dumps(PID)))
        return await recorded_pid(tmp_path)

    assert asyncio.run(body()) == PID


def test_an_exit_first_means_there_is_no_process_to_wait_for(tmp_path: Path) -> None:
    (tmp_path / shim.EXIT).write_text(json.dumps(
        {"started_at": 1.0, "ended_at": 2.0, "exit_code": 0, "signal": None}))
    assert asyncio.run(recorded_pid(tmp_path)) is None
