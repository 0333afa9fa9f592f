"""`noduslocal events`: the daemon's event log (every job's phase changes, in order), as
lines for people or JSON lines for scripts; `--follow` keeps streaming, and picks up where
it was when the daemon ends a stream it fell behind on, or restarts."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import click

from noduslocal.cli.job import project_option
from noduslocal.domain import errors
from noduslocal.sdk.api_client import ApiClient

RESUME_WAIT = 1.0  # seconds before a followed stream that ended is opened again


def line(event: dict[str, Any]) -> str:
    """One event for people: when, which job, what it became and why."""
    text = f"{event['at']}  #{event['seq']}  {event['project']}/{event['job']}  {event['phase']}"
    if event.get("attempt"):
        text += f" (attempt {event['attempt']})"
    if event.get("reason"):
        text += f"  {event['reason']}"
    if event.get("message"):
        text += f": {event['message']}"
    return text


@click.command("events")
@click.option("--follow", "-f", is_flag=True, help="Keep streaming new events.")
@click.option("--since", type=click.IntRange(0), default=0, show_default=True,
              help="Only events after this sequence number.")
@click.option("--job", metavar="NAME", help="Only this job's events.")
@project_option
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
def events(follow: bool, since: int, job: str | None, project: str | None,
           as_json: bool) -> None:
    """The event log: every job's phase changes, oldest first (everyone's, as `job list`)."""
    client = ApiClient()
    last = since
    while True:
        try:
            for raw in _lines(client.events(since=last, job=job, project=project,
                                            follow=follow)):
                event = json.loads(raw)
                last = event["seq"]
                sys.stdout.write((raw if as_json else line(event)) + "\n")
                sys.stdout.flush()
        except errors.DaemonUnavailable:
            if not follow:
                raise
        except KeyboardInterrupt:
            sys.exit(130)
        if not follow:
            return
        time.sleep(RESUME_WAIT)  # the stream ended (a restart, or we fell behind): again


def _lines(chunks: Any) -> Any:
    """Whole lines out of a stream of chunks."""
    pending = b""
    for chunk in chunks:
        pending += chunk
        *whole, pending = pending.split(b"\n")
        for raw in whole:
            if raw.strip():
                yield raw.decode()
    if pending.strip():
        yield pending.decode()
