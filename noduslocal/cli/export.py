"""A job's environment from the command line: `KEY=VALUE` options, and `--export`, whose
meaning (ALL, NONE, the named variables, and what is never sent) is
noduslocal/domain/environment.py's, shared with the SDK.
"""

from __future__ import annotations

from noduslocal.cli.usage import Usage
from noduslocal.domain import environment, errors


def exported(spec: str | None, image: bool) -> dict[str, str]:
    try:
        return environment.exported(spec, image)
    except errors.InvalidArgument as exc:
        raise Usage(exc.message.removeprefix("export: "), "--export") from None


def pairs(values: tuple[str, ...], flag: str) -> dict[str, str]:
    """`--env K=V` (or `--label`, `--output`) options as a mapping."""
    found = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise Usage(f"{item!r} is not KEY=VALUE", flag)
        found[key] = value
    return found
