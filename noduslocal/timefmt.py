"""The API's one time format: RFC 3339 UTC with milliseconds, written and read."""

from __future__ import annotations

import time
from datetime import UTC, datetime


def iso(ts: float | None) -> str | None:
    """RFC 3339 UTC with milliseconds, the API's one time format."""
    if ts is None:
        return None
    seconds = int(ts)
    # time.strftime over gmtime: a third of datetime's cost, and this runs for every
    # timestamp of every job document the API sends.
    return (time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
            + f".{int((ts - seconds) * 1000):03d}Z")


def parse_iso(text: str | None) -> float | None:
    if not text:
        return None
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC).timestamp()
