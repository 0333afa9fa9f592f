"""The SDK mirrors of `super` (the reference's "SDK mirrors"): `Client().map(cmd, args=...)`,
where the type of `args` picks the combinator, and `Client().project().job(cmd, ...)`, an
ephemeral job whose workspace is discarded when it ends; its `wait()` gives the log.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from noduslocal.domain import errors
from noduslocal.domain.states import SweepPhase
from noduslocal.sdk.api_client import ApiClient
from noduslocal.sdk.job import after_argument, sent_env
from noduslocal.sdk.sweep import Sweep
from noduslocal.sdk.view import View

CANARY_POLL = 0.5


@dataclass(frozen=True)
class ProcessLog:
    exit_code: int | None
    output: str


def _argv(cmd: str | Sequence[str]) -> list[str]:
    return shlex.split(cmd) if isinstance(cmd, str) else list(cmd)


def _volumes(mounts: Sequence[Mapping[str, str]] | None) -> dict[str, str] | None:
    if not mounts:
        return None
    try:
        return {m["mount_path"]: m["name"] for m in mounts}
    except (KeyError, TypeError):
        raise errors.InvalidArgument('volume_mounts: expected [{"name": VOLUME, '
                                     '"mount_path": PATH}, ...]', field="volume_mounts") from None


def _map_body(argv: list[str], args: Any) -> dict[str, Any]:
    """The type of `args` picks the combinator: a mapping of lists is the cartesian product
    of named groups, a list binds one value per task to `{}`, a list of mappings is one
    task per mapping."""
    if isinstance(args, Mapping):
        return {"command": argv, "groups": [[str(k), [str(v) for v in values]]
                                            for k, values in args.items()]}
    if isinstance(args, Sequence) and not isinstance(args, str | bytes):
        if args and all(isinstance(a, Mapping) for a in args):
            names = list(args[0])
            if any(list(a) != names for a in args):
                raise errors.InvalidArgument("args: every mapping needs the same keys, in "
                                             "the same order", field="args")
            return {"command": argv, "rows": {"names": [str(n) for n in names], "values": [
                [str(a[n]) for n in names] for a in args]}}
        return {"command": argv, "groups": [[None, [str(a) for a in args]]]}
    raise errors.InvalidArgument("args: a mapping of lists, a list, or a list of mappings",
                                 field="args")


class MapSweep(Sweep):
    """A sweep made by Client.map: `wait_canary()`, then `wait()` for the rest."""

    def wait_canary(self, timeout: float | None = None) -> View:
        """Block until the canary has passed (the sweep runs the rest) or failed (the sweep
        ended Failed with reason CanaryFailed); returns the status either way."""
        import time

        deadline = None if timeout is None else time.monotonic() + timeout
        status = self.status()
        while status["phase"] in (SweepPhase.PENDING, SweepPhase.CANARY):
            if deadline is not None and time.monotonic() > deadline:
                raise errors.WaitTimeout(f"the canary of sweep {self.name!r} has not ended "
                                         f"after {timeout:g}s")
            time.sleep(CANARY_POLL)
            status = self.status()
        return status


class Client:
    """`nodus.Client()`: the daemon's SDK mirrors of `super map` and `super job`."""

    def __init__(self, socket_path: str | Path | None = None) -> None:
        self.api = ApiClient(socket_path)

    def map(self, cmd: str | Sequence[str], args: Any, *, name: str | None = None,
            sku: str | None = None, gpu: Any = None, image: str | None = None,
            code_dir: str | Path | None = None, include: Sequence[str] | None = None,
            env: Mapping[str, str] | None = None, secrets: Sequence[str] | None = None,
            volume_mounts: Sequence[Mapping[str, str]] | None = None,
            max_parallel: int | None = None, retries: int | None = None,
            canary: bool = True, cpu: Any = None, memory: Any = None, timeout: Any = None,
            project: str | None = None, region: str | None = None,
            export: str | None = None, replace: bool = False, after: Any = None
            ) -> MapSweep:
        """`cmd` run once per task of `args`, with `{name}` / `{}` placeholders.

        `name`: a sweep of that name already in the project is refused (AlreadyExists),
        even an ended one, until it is removed (`sweep rm`); `replace=True` removes it
        first, as `map --replace`: cancelled if it still runs (its tasks waited for),
        then removed, its history and cost kept. `export`: which of your environment
        variables every task gets, as `map --export` and Job.create: "ALL" (the default
        without an image), "NONE" (the default with one) or "NAME,NAME"; `env` wins key
        by key. `after`: jobs or sweeps the whole sweep waits for, as Job.create's."""
        if code_dir is not None and include:
            raise errors.InvalidArgument("include: give code_dir or include, not both",
                                         field="include")
        if replace and name is None:
            raise errors.InvalidArgument("replace: needs a name", field="replace")
        template: dict[str, Any] = {k: v for k, v in (
            ("gpu", gpu or sku), ("image", image), ("env", sent_env(export, image, env, secrets)),
            ("secrets", list(secrets) if secrets else None), ("volumes", _volumes(volume_mounts)),
            ("retries", retries), ("cpu", cpu), ("memory", memory), ("timeout", timeout),
            ("region", region)) if v is not None}
        if code_dir is not None:
            template["source"] = self.api.upload_source([Path(code_dir)],
                                                        contents_of_single_dir=True)
        elif include:
            template["source"] = self.api.upload_source([Path(p) for p in include],
                                                        contents_of_single_dir=False)
        body = {"template": template, "map": _map_body(_argv(cmd), args),
                "canary": "cell" if canary else "none", "name": name, "project": project,
                "max_parallel": max_parallel,
                "after": None if after is None else after_argument(after)}
        if replace:
            assert name is not None
            self.api.replace_sweep(name, project)
        doc = self.api.create_sweep({k: v for k, v in body.items() if v is not None})
        sweep = MapSweep(name=doc["name"], project=doc["project"])
        sweep._client = self.api
        sweep._take(doc)
        return sweep

    def project(self, name: str | None = None) -> Project:
        """Jobs of project `name` (default: your user name)."""
        return Project(self.api, name)


class Project:
    def __init__(self, api: ApiClient, name: str | None) -> None:
        self.api = api
        self.name = name

    def job(self, cmd: str | Sequence[str], *, sku: str | None = None, gpu: Any = None,
            image: str | None = None, volume_mounts: Sequence[Mapping[str, str]] | None = None,
            include: Sequence[str] | None = None, retries: int | None = None,
            env: Mapping[str, str] | None = None, secrets: Sequence[str] | None = None,
            cpu: Any = None, memory: Any = None, timeout: Any = None,
            name: str | None = None, region: str | None = None,
            export: str | None = None, after: Any = None) -> EphemeralJob:
        """Start `cmd` as an ephemeral job: its workspace is discarded when it ends, so its
        volumes and its log are what stays. It gets your environment as `job run` gives
        it (`export`: "ALL", the default without an image, so `python` is yours; "NONE",
        the default with one; or "NAME,NAME"); `env` wins key by key. `after`: what it
        waits for first, as Job.create's."""
        body: dict[str, Any] = {k: v for k, v in (
            ("name", name), ("project", self.name), ("gpu", gpu or sku), ("image", image),
            ("volumes", _volumes(volume_mounts)), ("retries", retries),
            ("env", sent_env(export, image, env, secrets)),
            ("secrets", list(secrets) if secrets else None),
            ("cpu", cpu), ("memory", memory), ("timeout", timeout), ("region", region))
            if v is not None}
        body["command"] = _argv(cmd)
        body["ephemeral"] = True
        if after is not None:
            body["after"] = after_argument(after)
        if include:
            body["source"] = self.api.upload_source([Path(p) for p in include],
                                                    contents_of_single_dir=False)
        return EphemeralJob(self.api, self.api.create_job(body))


class EphemeralJob:
    def __init__(self, api: ApiClient, doc: Mapping[str, Any]) -> None:
        self.api = api
        self.name: str = doc["name"]
        self.project: str = doc["project"]

    def __repr__(self) -> str:
        return f"EphemeralJob({self.name!r}, project={self.project!r})"

    def wait(self, timeout: float | None = None) -> ProcessLog:
        """Block until it ends; its exit code and whole log (a failure does not raise)."""
        doc = self.api.wait_job(self.name, self.project, timeout)
        output = b"".join(self.api.logs(self.name, self.project)).decode("utf-8", "replace")
        return ProcessLog(doc.get("exit_code"), output)

    def status(self) -> View:
        return View(self.api.get_job(self.name, self.project))

    def kill(self) -> None:
        self.api.cancel_job(self.name, self.project)
