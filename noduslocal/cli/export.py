"""A job's environment from the command line: `KEY=VALUE` options, and `--export`, which
of the caller's variables it gets as `sbatch --export` has it: ALL (the default for a host
job, so a venv's `python` is found), NONE (the default with `--image`: an image has its
own PATH), or the named ones.
"""

from __future__ import annotations

import os

from noduslocal.cli.usage import Usage

# What describes the submitting shell or reaches the daemon, never the job.
LEFT_OUT = frozenset({"PWD", "OLDPWD", "SHLVL", "_", "PS1", "PROMPT_COMMAND"})
LEFT_OUT_PREFIXES = ("NODUS_", "NODUSLOCAL_", "BASH_FUNC_")


def exported(spec: str | None, image: bool) -> dict[str, str]:
    mode = spec if spec is not None else ("NONE" if image else "ALL")
    if mode.upper() == "NONE":
        return {}
    if mode.upper() == "ALL":
        return {key: value for key, value in os.environ.items()
                if key.isascii() and key.isidentifier() and key not in LEFT_OUT
                and not key.startswith(LEFT_OUT_PREFIXES)}
    names = [name.strip() for name in mode.split(",") if name.strip()]
    missing = [name for name in names if name not in os.environ]
    if missing or not names:
        what = ", ".join(missing) if missing else repr(mode)
        raise Usage(f"{what} is not set in your environment; use ALL, NONE or a "
                    "comma-separated list of your variables", "--export")
    return {name: os.environ[name] for name in names}


def pairs(values: tuple[str, ...], flag: str) -> dict[str, str]:
    """`--env K=V` (or `--label`, `--output`) options as a mapping."""
    found = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise Usage(f"{item!r} is not KEY=VALUE", flag)
        found[key] = value
    return found
