"""Durations, sizes and CPU counts as people write them ("15m", "4GiB", "500m"), turned
into seconds, bytes and millicores, with one-line errors that name the field.
"""

from __future__ import annotations

import math
import re

from noduslocal.domain.errors import InvalidArgument

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: the CLI's submit path reads this module
    from typing import Any

MAX_DURATION = 10 * 365 * 86400.0
# Bytes: what a 64-bit SQLite column holds (8 EiB, more than any disk or memory).
MAX_SIZE = 2**63 - 1
MAX_CPU_M = 10**9  # a million CPUs, in millicores
# ASCII digits only: \d would take other scripts' digits, which float() reads too.
_DURATION_RE = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*(ms|s|m|h|d)?", re.IGNORECASE | re.ASCII)
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_SIZE_RE = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([kmgtp]?)(i?)(b?)\s*",
                      re.IGNORECASE | re.ASCII)
_CPU_RE = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)(m?)\s*", re.ASCII)
_SIZE_POWERS = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4, "p": 5}


def parse_duration(value: Any, field_name: str) -> float:
    """Seconds from 90, "90", "90s", "15m", "2h", "1h30m" or "1d"."""
    if isinstance(value, bool):
        raise InvalidArgument(f"{field_name}: expected a duration like 90, 90s, 15m, 2h",
                              field=field_name)
    if isinstance(value, int | float):
        try:
            seconds = float(value)
        except OverflowError:
            seconds = math.inf
    elif isinstance(value, str) and value.strip():
        text = value.strip().replace(" ", "")
        pos, seconds = 0, 0.0
        for match in _DURATION_RE.finditer(text):
            if match.start() != pos:
                break
            seconds += float(match.group(1)) * _DURATION_UNITS[(match.group(2) or "s").lower()]
            pos = match.end()
        if pos != len(text) or pos == 0:
            raise InvalidArgument(
                f"{field_name}: {_shown(value)} is not a duration; use 90, 90s, 15m, 2h or "
                "1h30m",
                field=field_name,
            )
    else:
        raise InvalidArgument(f"{field_name}: expected a duration like 90, 90s, 15m, 2h",
                              field=field_name)
    if not math.isfinite(seconds) or seconds <= 0 or seconds > MAX_DURATION:
        raise InvalidArgument(f"{field_name}: must be a positive duration of at most 10 years",
                              field=field_name)
    return seconds


def parse_size(value: Any, field_name: str) -> int:
    """Bytes from 1048576, "512M", "512MiB", "4G", "4GiB" or "100B" (binary units, as
    docker); a string needs its unit."""
    if isinstance(value, bool):
        raise InvalidArgument(f"{field_name}: expected a size like 512M or 4GiB",
                              field=field_name)
    size: int | float
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        size = value
    elif isinstance(value, str) and (match := _SIZE_RE.fullmatch(value)):
        number, unit, binary, byte = match.groups()
        if binary and not unit:
            raise InvalidArgument(f"{field_name}: {_shown(value)} is not a size",
                                  field=field_name)
        if not unit and not byte:  # `--memory 16` is never 16 bytes by accident
            n = number if len(number) <= 20 else "N"
            raise InvalidArgument(
                f"{field_name}: {_shown(value)} has no unit; write {n}G, {n}GiB or {n}M (a "
                "bare number would be bytes)", field=field_name)
        # A float of 400 digits is inf: refused below as too large, never int(inf).
        size = float(number) * 1024 ** _SIZE_POWERS[unit.lower()]
        del byte
    else:
        raise InvalidArgument(
            f"{field_name}: {_shown(value)} is not a size; use bytes or 512M, 4G, 4GiB",
            field=field_name,
        )
    if size > MAX_SIZE:
        raise InvalidArgument(f"{field_name}: larger than the most a size may be "
                              f"({MAX_SIZE} bytes, 8EiB)", field=field_name)
    if size <= 0 or int(size) <= 0:
        raise InvalidArgument(f"{field_name}: must be a positive size", field=field_name)
    return int(size)


def parse_cpu(value: Any, field_name: str = "cpu") -> int:
    """Millicores from 2, 0.5, "2" or "500m"."""
    if isinstance(value, bool):
        raise InvalidArgument(f"{field_name}: expected a CPU count like 2, 0.5 or 500m",
                              field=field_name)
    millis: float
    match = _CPU_RE.fullmatch(value) if isinstance(value, str) else None
    try:
        if isinstance(value, int | float):
            millis = float(value) * 1000
        elif match is not None and not (match.group(2) and "." in match.group(1)):
            millis = float(match.group(1)) * (1 if match.group(2) else 1000)
        else:
            raise InvalidArgument(f"{field_name}: {_shown(value)} is not a CPU count; use 2, "
                                  "0.5 or 500m", field=field_name)
    except OverflowError:  # an integer of 400 digits is past what a float holds
        millis = math.inf
    if math.isnan(millis) or millis < 1:
        raise InvalidArgument(f"{field_name}: must be at least 1m (0.001 CPU)", field=field_name)
    if millis > MAX_CPU_M:
        raise InvalidArgument(f"{field_name}: at most {MAX_CPU_M // 1000} CPUs",
                              field=field_name)
    return round(millis)


def _shown(value: Any) -> str:
    """VALUE for an error message, cut short: a 400-digit number is not repeated whole."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:30]}... ({len(text)} characters)"


def fmt_bytes(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"


def fmt_duration(seconds: float | None) -> str:
    """A duration as config takes it back ("14d", "36h", "90s"); None is "forever"."""
    if seconds is None:
        return "forever"
    whole = int(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if whole >= size and whole % size == 0:
            return f"{whole // size}{unit}"
    return f"{whole}s" if whole == seconds else f"{seconds:g}s"
