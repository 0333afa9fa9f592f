"""A sweep's webhook: its status document POSTed on canary pass, canary failure and its
end, tried a few times with a timeout each; a failing webhook is logged and never changes
the sweep. Not kept across a daemon restart."""

from __future__ import annotations

import asyncio
import logging

import aiohttp

from noduslocal.lifecycle.background import Background
from noduslocal.lifecycle.sweep_reports import SweepReports
from noduslocal.models import SweepRecord

log = logging.getLogger(__name__)
TRIES = 4
TIMEOUT = 10.0  # seconds for one POST, connect to answer
FIRST_PAUSE = 1.0  # seconds before the second try; doubled for each further one
EVENT_HEADER = "X-Nodus-Event"


class Webhooks:
    def __init__(self, background: Background, reports: SweepReports) -> None:
        self.background = background
        self.reports = reports

    def send(self, sweep: SweepRecord, *events: str) -> None:
        """POST the sweep's status once per event (canary-passed, canary-failed,
        completed), in that order, on a task of its own, when the sweep has a webhook."""
        url = sweep.spec.get("webhook")
        if url and events:
            self.background.spawn(self._post_all(url, sweep, events))

    async def _post_all(self, url: str, sweep: SweepRecord, events: tuple[str, ...]) -> None:
        for event in events:
            await self._post(url, sweep, event)

    async def _post(self, url: str, sweep: SweepRecord, event: str) -> None:
        doc = {**await self.reports.status(sweep, redact=False), "event": event}
        pause = FIRST_PAUSE
        for attempt in range(1, TRIES + 1):
            try:
                async with aiohttp.ClientSession(
                        timeout=aiohttp.ClientTimeout(total=TIMEOUT)) as session, \
                        session.post(url, json=doc, headers={EVENT_HEADER: event}) as answer:
                    if answer.status < 500 and answer.status not in (408, 429):
                        if answer.status >= 400:
                            log.warning("sweep %s: webhook %s answered %d to %s; not "
                                        "tried again", sweep.name, url, answer.status, event)
                        return
                    why = f"HTTP {answer.status}"
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                why = f"{type(exc).__name__}: {exc}"
            log.info("sweep %s: webhook %s (%s) try %d failed: %s", sweep.name, url, event,
                     attempt, why)
            if attempt < TRIES:
                await asyncio.sleep(pause)
                pause *= 2
        log.warning("sweep %s: webhook %s gave up on %s after %d tries", sweep.name, url,
                    event, TRIES)
