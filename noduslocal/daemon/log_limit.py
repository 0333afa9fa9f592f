"""A rate limit on the daemon's log: the same warning or error, said over and over (an accept
loop out of descriptors, a client that keeps failing), is written a few times a minute with
a count of what was left out, so a flood can neither fill the disk nor the journal.
"""

from __future__ import annotations

import logging
import re
import time

_DIGITS = re.compile(r"\d+")


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


def install(handler: logging.Handler) -> None:
    handler.addFilter(RepeatLimit())
