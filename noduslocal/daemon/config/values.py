"""How each setting's TOML value is checked and turned into what Settings holds: one-line
errors that name the setting (config/settings.py's _TOML_KEYS says which converter each one uses).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Iterable
from typing import Any

from noduslocal.domain.errors import InvalidArgument
from noduslocal.domain.units import parse_duration, parse_size


def positive(value: Any, name: str) -> int:
    return whole(value, name, 1)


def whole(value: Any, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidArgument(f"{name}: expected a whole number from {minimum}", field=name)
    return value


def port(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise InvalidArgument(f"{name}: expected a TCP port from 1 to 65535", field=name)
    return value


def keep(value: Any, name: str) -> float | None:
    return unless(value, name, "forever", parse_duration)


def quota(value: Any, name: str) -> int | None:
    return unless(value, name, "none", parse_size)


def unless(value: Any, name: str, word: str, parse: Callable[[Any, str], Any]) -> Any:
    """`parse(value)`, or None for `word`, which means no limit ("forever", "none")."""
    if value == word:
        return None
    try:
        return parse(value, name)
    except InvalidArgument as exc:
        raise InvalidArgument(f'{exc.message}; or "{word}"', field=name) from None


def size_from(value: Any, name: str, minimum: int, shown: str) -> int:
    """A size of at least `minimum` bytes (`shown`, as a person writes it: "64KiB")."""
    size = parse_size(value, name)
    if size < minimum:
        raise InvalidArgument(f"{name}: expected a size from {shown}", field=name)
    return size


def interval(value: Any, name: str) -> float:
    seconds = parse_duration(value, name)
    if not 1 <= seconds <= 7 * 24 * 3600:
        raise InvalidArgument(f"{name}: expected a duration from 1s to 7d", field=name)
    return seconds


def per_user(value: Any, name: str, convert: Callable[[Any, str], Any],
             settings: Iterable[str]) -> dict[str, Any]:
    """A table of user name = value, each checked as the setting for everyone is; a user
    named as one of `settings` is a setting written below the table by mistake."""
    if not isinstance(value, dict):
        raise InvalidArgument(f"{name}: expected a [{name}] table of user = value",
                              field=name)
    if misplaced := sorted(set(value) & set(settings)):
        raise InvalidArgument(f"{name}.{misplaced[0]}: {misplaced[0]} is a setting, not a user; "
                              f"settings go above the first [table] of the file",
                              field=f"{name}.{misplaced[0]}")
    return {user: convert(each, f"{name}.{user}") for user, each in value.items()}


def networks(value: Any, name: str) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network,
                                             ...]:
    """["127.0.0.1/32", "::1"]: addresses or networks (an address alone is one address)."""
    expected = 'expected a list of addresses or networks, e.g. ["127.0.0.1/32", "::1"]'
    if not isinstance(value, list):
        raise InvalidArgument(f"{name}: {expected}", field=name)
    found = []
    for each in value:
        try:
            if not isinstance(each, str):  # ip_network takes 5 for 0.0.0.5
                raise ValueError(each)
            found.append(ipaddress.ip_network(each, strict=False))
        except ValueError:
            raise InvalidArgument(f"{name}: {each!r} is not an address or network; {expected}",
                                  field=name) from None
    return tuple(found)


REGISTRY = re.compile(r"[a-z0-9]([a-z0-9.-]*[a-z0-9])?(:[0-9]{1,5})?")


def registries(value: Any, name: str) -> tuple[str, ...]:
    """["localhost:5000", "10.0.0.5"]: registry hosts, as image references name them."""
    expected = 'expected a list of registries as images name them, HOST or HOST:PORT, ' \
        'e.g. ["localhost:5000"]'
    if not isinstance(value, list):
        raise InvalidArgument(f"{name}: {expected}", field=name)
    for each in value:
        if not isinstance(each, str) or not REGISTRY.fullmatch(each.lower()):
            raise InvalidArgument(f"{name}: {each!r} is not a registry; {expected}",
                                  field=name)
    return tuple(each.lower() for each in value)


def text(value: Any, name: str) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidArgument(f"{name}: expected a string in quotes", field=name)
    return value


def flag(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidArgument(f"{name}: expected true or false", field=name)
    return value


def price(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise InvalidArgument(f"{name}: expected a number from 0", field=name)
    return float(value)


def profiles(value: Any) -> dict[str, dict[str, Any]]:
    """Each profile checked as a job's arguments are (a bad one stops the daemon at start,
    naming it), and only with the arguments a profile may fill."""
    from noduslocal.domain.profiles import PROFILE_FIELDS
    from noduslocal.domain.validation import parse_create, validate_name

    if not isinstance(value, dict):
        raise InvalidArgument("profiles: expected [profiles.NAME] tables", field="profiles")
    profiles: dict[str, dict[str, Any]] = {}
    for name, preset in value.items():
        where = f"profiles.{name}"
        try:
            validate_name(name, where)
            if not isinstance(preset, dict):
                raise InvalidArgument(f"{where}: expected a table of Job.create arguments",
                                      field=where)
            if unknown := sorted(set(preset) - PROFILE_FIELDS):
                raise InvalidArgument(f"{unknown[0]}: not for a profile; a profile may set "
                                      f"{', '.join(sorted(PROFILE_FIELDS))}", field=unknown[0])
            # Whether it parses as a job's; its region is checked against the daemon's own
            # when a job uses it.
            parse_create({"command": ["true"], **{k: v for k, v in preset.items()
                                                  if k != "region"}}, regions=("",))
        except InvalidArgument as exc:
            field_name = exc.field if (exc.field or "").startswith("profiles.") else \
                f"{where}.{exc.field}"
            message = exc.message.removeprefix(f"{exc.field}: ")
            raise InvalidArgument(f"config: {field_name}: {message}",
                                  field=field_name) from None
        profiles[name] = dict(preset)
    return profiles


def choice(value: Any, name: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise InvalidArgument(f"{name}: expected one of {', '.join(allowed)}", field=name)
    return str(value)


# Memory of models when the spec does not say (GiB).
KNOWN_MEMORY = {"H100": 80, "H200": 141, "A100": 80, "L4": 24, "L40S": 48, "A10": 24,
                "T4": 16, "V100": 32, "RTX4090": 24, "B200": 192}
GPU_GROUP_RE = re.compile(r"(?:(\d+)\s*x\s*)?([A-Za-z][A-Za-z0-9]*)(?:-(\d+)\s*GB)?\Z", re.I)


def simulated_groups(spec: str) -> list[tuple[int, str, int]]:
    """`4xH100-80GB,2xL4` as (count, model, memory GiB) per group, at most 64 GPUs."""
    groups: list[tuple[int, str, int]] = []
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        match = GPU_GROUP_RE.match(part)
        if not match:
            raise InvalidArgument(
                f"simulate_gpus: {part!r} is not COUNTxMODEL[-MEMGB], e.g. 4xH100-80GB",
                field="simulate_gpus")
        count, model = int(match.group(1) or 1), match.group(2).upper()
        if not 1 <= count <= 64 or sum(c for c, _, _ in groups) + count > 64:
            raise InvalidArgument("simulate_gpus: at most 64 GPUs", field="simulate_gpus")
        groups.append((count, model, int(match.group(3) or KNOWN_MEMORY.get(model, 16))))
    if not groups:
        raise InvalidArgument("simulate_gpus: no GPUs in the spec", field="simulate_gpus")
    return groups


def simulated_spec(value: object) -> str:
    if not isinstance(value, str):
        raise InvalidArgument("simulate_gpus: expected a string like \"4xH100-80GB\"",
                              field="simulate_gpus")
    simulated_groups(value)  # refused here, with the field named, not at start-up
    return value


def rates(value: object) -> dict[str, float]:
    """{"H100" = 2.5, "default" = 1.0}: a price per GPU-hour by model."""
    if not isinstance(value, dict) or not all(
            isinstance(k, str) and isinstance(v, int | float) and v >= 0
            for k, v in value.items()):
        raise InvalidArgument("gpu_hour_rates: expected a table of model = price per GPU-hour",
                              field="gpu_hour_rates")
    return {k if k == "default" else k.upper(): float(v) for k, v in value.items()}
