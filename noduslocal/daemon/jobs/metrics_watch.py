"""Following what a running attempt reports: its metrics file watched with watchfiles
(inotify), read again on each change, so status and a sweep's report show live values.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

import watchfiles

from noduslocal.daemon.jobs.attempt import Attempt
from noduslocal.domain import metrics

log = logging.getLogger(__name__)
DEBOUNCE_MS = 200
FOLLOW_AFTER = 1.0  # seconds an attempt runs before its metrics file is watched


async def read(attempt: Attempt, workspace: Path) -> None:
    attempt.metrics = await asyncio.to_thread(metrics.read, workspace, attempt.job.owner_uid)


def read_final(attempt: Attempt, workspace: Path) -> dict[str, float]:
    """The attempt's metrics once it has ended (a watcher still stopping may lag)."""
    return metrics.read(workspace, attempt.job.owner_uid)


async def follow(attempt: Attempt, workspace: Path, stop: asyncio.Event) -> None:
    """Until `stop` is set: the attempt's metrics, read again whenever the file changes.
    Only once the attempt has run FOLLOW_AFTER seconds: a watcher costs a thread and an
    inotify instance, which short tasks (a sweep of `true`) would pay for nothing; their
    metrics are read at their end."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), FOLLOW_AFTER)
        return
    try:
        await read(attempt, workspace)
        async for _ in watchfiles.awatch(
                workspace, stop_event=stop, recursive=False, debounce=DEBOUNCE_MS,
                watch_filter=lambda _, path: path.endswith(metrics.METRICS_FILE)):
            await read(attempt, workspace)
    except asyncio.CancelledError:
        raise
    except Exception:  # a workspace gone or unreadable: the end's own read still counts
        log.exception("following the metrics of job %s failed", attempt.job.name)
