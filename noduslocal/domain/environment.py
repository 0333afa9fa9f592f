"""Which of the caller's environment variables a job gets, as `sbatch --export` has it: ALL
(the default for a host job, so a venv's `python` is found), NONE (the default for an
image: it has its own PATH), or the named ones. The CLI and the SDK both ask here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from noduslocal.domain import errors

# What describes the submitting shell or reaches the daemon, never the job.
LEFT_OUT = frozenset({"PWD", "OLDPWD", "SHLVL", "_", "PS1", "PROMPT_COMMAND"})
LEFT_OUT_PREFIXES = ("NODUS_", "NODUSLOCAL_", "BASH_FUNC_")


def exported(spec: str | None, image: bool,
             environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables of `environ` (default: this process's) that `spec` (ALL, NONE or
    NAME,NAME...; None: ALL for a host job, NONE for an `image` job) hands the job."""
    env = os.environ if environ is None else environ
    mode = spec if spec is not None else ("NONE" if image else "ALL")
    if not isinstance(mode, str):
        raise errors.InvalidArgument("export: expected ALL, NONE or a comma-separated list "
                                     "of your variables", field="export")
    if mode.upper() == "NONE":
        return {}
    if mode.upper() == "ALL":
        return {key: value for key, value in env.items()
                if key.isascii() and key.isidentifier() and key not in LEFT_OUT
                and not key.startswith(LEFT_OUT_PREFIXES)}
    names = [name.strip() for name in mode.split(",") if name.strip()]
    missing = [name for name in names if name not in env]
    if missing or not names:
        what = ", ".join(missing) if missing else repr(mode)
        raise errors.InvalidArgument(f"export: {what} is not set in your environment; use "
                                     "ALL, NONE or a comma-separated list of your variables",
                                     field="export")
    return {name: env[name] for name in names}


def job_env(export: str | None, image: bool, given: Mapping[str, str] | None,
            secrets: set[str] | frozenset[str] = frozenset()) -> dict[str, str]:
    """A job's environment as sent: the exported variables (less those a secret of the
    same name passes), then `given`, which wins key by key."""
    return {**{k: v for k, v in exported(export, image).items() if k not in secrets},
            **(given or {})}
