"""The API's one time format: RFC 3339 UTC with milliseconds, written and read."""

from __future__ import annotations

import time


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
    # By position, not strptime: its locale machinery costs a CLI call milliseconds.
    whole, _, frac = text.removesuffix("Z").partition(".")
    if not text.endswith("Z") or len(whole) != 19 or whole[10] != "T" \
            or (not frac.isdigit() and frac):
        raise ValueError(f"not an RFC 3339 UTC time: {text!r}")
    days = _days_from_civil(int(whole[0:4]), int(whole[5:7]), int(whole[8:10]))
    seconds = days * 86400 + int(whole[11:13]) * 3600 + int(whole[14:16]) * 60 \
        + int(whole[17:19])
    return seconds + (int(frac) / 10 ** len(frac) if frac else 0.0)


def _days_from_civil(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm): the
    CLI reads every job's times, and datetime's import would cost it a millisecond more."""
    year -= month <= 2
    era = year // 400
    year_of_era = year - era * 400
    day_of_year = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    day_of_era = year_of_era * 365 + year_of_era // 4 - year_of_era // 100 + day_of_year
    return era * 146097 + day_of_era - 719468
