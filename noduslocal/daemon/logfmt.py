"""The daemon's log lines on stderr: `LEVEL logger: message key=value ...`, where the keys
are what a record names (the job, the user, a request's route), so `journalctl -u noduslocal
| grep job=alice/train` finds a job's story. Under systemd (JOURNAL_STREAM) each line starts
with its syslog priority (`<3>`) for journald, and carries no time of its own. The same
warning said over and over is written a few times a minute (RepeatLimit).
"""

from __future__ import annotations

import logging
import os
import re
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from noduslocal.domain.jobs import Event

FIELDS = ("job", "user", "method", "route", "status", "ms")  # the extras a line may carry
PRIORITY = {logging.CRITICAL: 2, logging.ERROR: 3, logging.WARNING: 4, logging.INFO: 6,
            logging.DEBUG: 7}
_DIGITS = re.compile(r"\d+")


def _value(value: object) -> str:
    text = str(value)
    if not text or any(c.isspace() or c in '"=' for c in text):
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return text


class LineFormatter(logging.Formatter):
    def __init__(self, journald: bool) -> None:
        super().__init__("%(levelname)s %(name)s: %(message)s" if journald
                         else "%(asctime)s %(levelname)s %(name)s: %(message)s")
        self.journald = journald

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        extras = [f"{key}={_value(getattr(record, key))}" for key in FIELDS
                  if getattr(record, key, None) is not None]
        if extras:
            first, sep, rest = text.partition("\n")  # a traceback stays below the line
            text = f"{first} {' '.join(extras)}{sep}{rest}"
        if self.journald:
            prefix = f"<{PRIORITY.get(record.levelno, 6)}>"
            text = "\n".join(prefix + part for part in text.split("\n"))
        return text


def log_job_events(events: list[Event]) -> None:
    """Each committed phase change as one line naming its job (the event log's own copy is
    `noduslocal events`)."""
    jobs = logging.getLogger("noduslocal.jobs")
    if not jobs.isEnabledFor(logging.INFO):
        return
    for event in events:
        detail = f" ({event.reason})" if event.reason else ""
        if event.message:
            detail += f": {event.message}"
        jobs.info("%s%s", event.phase, detail,
                  extra={"job": f"{event.project}/{event.name}"})


def install(level: str) -> logging.Handler:
    """The root logger's one handler, on stderr, its floods cut by RepeatLimit."""
    handler = logging.StreamHandler()
    handler.setFormatter(LineFormatter(journald=bool(os.environ.get("JOURNAL_STREAM"))))
    handler.addFilter(RepeatLimit())
    logging.basicConfig(level=level.upper(), handlers=[handler])
    return handler


# A rate limit on the daemon's log: the same warning or error, said over and over (an accept
# loop out of descriptors, a client that keeps failing), is written a few times a minute with
# a count of what was left out, so a flood can neither fill the disk nor the journal.

class RepeatLimit(logging.Filter):
    """At most `burst` records of one kind per `window` seconds; INFO and below pass."""

    def __init__(self, burst: int = 5, window: float = 60.0) -> None:
        super().__init__()
        self.burst = burst
        self.window = window
        self._seen: dict[tuple[str, int, str], tuple[float, int, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        # A kind is the message with its numbers taken out (fds, pids, counts differ).
        key = (record.name, record.levelno, _DIGITS.sub("#", str(record.msg))[:120])
        now = time.monotonic()
        start, count, dropped = self._seen.get(key, (now, 0, 0))
        if now - start >= self.window:
            if dropped:
                record.msg = f"{record.msg} (and {dropped} more like it in the last " \
                             f"{now - start:.0f}s, not logged)"
            start, count, dropped = now, 0, 0
        if count >= self.burst:
            self._seen[key] = (start, count, dropped + 1)
            return False
        self._seen[key] = (start, count + 1, dropped)
        if len(self._seen) > 10_000:  # kinds are few; a flood of distinct ones is dropped
            self._seen.clear()
        return True
