"""Profiles: named presets of Job.create arguments in the daemon's config. Which arguments a
profile may set, and a create body with its profile's values in what it left unset (its
`env` variable by variable).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from noduslocal.domain.errors import InvalidArgument

# What a profile (a named preset in the daemon's config) may fill: the job's resources and
# how it runs, never what it runs or who it is.
PROFILE_FIELDS = frozenset(
    {"image", "cpu", "memory", "gpu", "timeout", "env", "region", "expected_duration",
     "max_cost", "interruptible", "retries", "network", "labels", "workdir", "priority",
     "disk"})


def with_profile(body: Mapping[str, Any],
                 profiles: Mapping[str, Mapping[str, Any]]) -> tuple[dict[str, Any], str | None]:
    """The body with its profile's values in every field it left unset (or null), and the
    profile's name; a profile the daemon does not have is refused naming those it has."""
    name = body.get("profile")
    rest = {key: value for key, value in body.items() if key != "profile"}
    if name is None:
        return rest, None
    if not isinstance(name, str) or name not in profiles:
        there = (f"there are: {', '.join(sorted(profiles))}" if profiles else
                 "this daemon has none (a [profiles.NAME] table in its config makes one)")
        raise InvalidArgument(f"profile: {name!r} is not a profile here; {there}",
                              field="profile")
    filled = {**profiles[name], **{k: v for k, v in rest.items() if v is not None}}
    preset, given = profiles[name].get("env"), rest.get("env")
    if isinstance(preset, Mapping) and isinstance(given, Mapping):
        # Key by key: the CLI and the SDK send the caller's environment with every host
        # job, so a profile's variables would otherwise never reach one.
        filled["env"] = {**preset, **given}
    return filled, name
