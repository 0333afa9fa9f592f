"""The SDK's Job: the reference `nodus.Job` API (create, run, from_name, status, wait,
logs, cancel, attempts) over the daemon. Methods of the reference that this version does
not implement yet raise `errors.Unsupported` naming themselves.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from pathlib import Path
from typing import Any

from noduslocal.domain import errors
from noduslocal.domain.environment import job_env
from noduslocal.domain.sockets import SOCKET_ENV
from noduslocal.domain.states import TERMINAL, Phase
from noduslocal.sdk.api_client import ApiClient
from noduslocal.sdk.view import View

_clients: dict[str | None, ApiClient] = {}
LOG_PARAMS = frozenset({"tail", "attempt", "stream", "rank", "index"})
SUSPEND_POLL = 0.1  # seconds between looks at a job being suspended


def default_client() -> ApiClient:
    """One client per socket override, so `noduslocal.testing` can point the SDK at a
    daemon of its own by setting NODUSLOCAL_SOCKET."""
    key = os.environ.get(SOCKET_ENV)
    if key not in _clients:
        _clients[key] = ApiClient(key)
    return _clients[key]


class Distributed:
    """A gang on this host: `nodes` ranks (or `total_gpus` split `gpus_per_node` to a
    rank), each a container or host process group with its GPUs, started all or none;
    `launcher` Plain, Torchrun, Ray or Verl; `transport` auto, nvlink, pcie, shm or tcp."""

    def __init__(self, nodes: int | None = None, total_gpus: int | None = None,
                 gpus_per_node: int | None = None, launcher: str | None = None,
                 network: str | None = None, transport: str | None = None,
                 startup_timeout: Any = None) -> None:
        self.nodes = nodes
        self.total_gpus = total_gpus
        self.gpus_per_node = gpus_per_node
        self.launcher = launcher
        self.network = network
        self.transport = transport
        self.startup_timeout = startup_timeout

    def spec(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items() if v is not None}


def sent_env(export: str | None, image: Any, env: Any, secrets: Any) -> Any:
    """The `env` a create sends: the caller's environment as the CLI's `--export` hands it
    (`export` None: ALL for a host job, NONE with an image; the same variables left out),
    less the names a secret passes, then `env`, which wins key by key."""
    if env is not None and not isinstance(env, Mapping):
        return env  # _wire names the field
    names = {s if isinstance(s, str) else (s.get("env") or s.get("name"))
             if isinstance(s, Mapping) else None for s in (secrets or ())} - {None}
    return job_env(export, image is not None, env, names) or None


def _wire(value: Any, field: str) -> Any:
    """VALUE as JSON for the argument FIELD; what JSON cannot say (bytes, an object) is
    the SDK's InvalidArgument naming the field, never json's TypeError."""
    if isinstance(value, Distributed):
        return _wire(value.spec(), field)
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if isinstance(value, Mapping):
        wired = {}
        for key, item in value.items():
            key = os.fspath(key) if isinstance(key, os.PathLike) else key
            if not isinstance(key, str):
                raise errors.InvalidArgument(f"{field}: its keys are strings, not "
                                             f"{type(key).__name__} ({_short(key)})",
                                             field=field)
            wired[key] = _wire(item, field)
        return wired
    if isinstance(value, list | tuple):
        return [_wire(item, field) for item in value]
    if value is None or isinstance(value, str | int | float):  # bool is an int
        return value
    hint = "; decode it to a str" if isinstance(value, bytes | bytearray) else ""
    raise errors.InvalidArgument(f"{field}: a {type(value).__name__} ({_short(value)}) is not "
                                 f"a value it takes{hint}", field=field)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def text_argument(value: Any, field: str, optional: bool = False) -> Any:
    """VALUE when it is a str (or None where OPTIONAL), else InvalidArgument naming FIELD."""
    if isinstance(value, str) or (optional and value is None):
        return value
    raise errors.InvalidArgument(f"{field}: expected a string, not {type(value).__name__} "
                                 f"({_short(value)})", field=field)


def timeout_argument(value: Any, field: str = "timeout") -> float | None:
    """Seconds to wait (None: for ever), else InvalidArgument naming FIELD."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise errors.InvalidArgument(f"{field}: expected seconds (a number of at least 0) or "
                                     f"None, not {_short(value)}", field=field)
    return float(value)


def path_argument(value: Any, field: str) -> str | os.PathLike[str]:
    if isinstance(value, str | os.PathLike) and isinstance(os.fspath(value), str):
        return value  # type: ignore[no-any-return]
    raise errors.InvalidArgument(f"{field}: expected a path (str or pathlib.Path), not "
                                 f"{type(value).__name__} ({_short(value)})", field=field)


def after_argument(value: Any) -> list[Any]:
    """`after` as the API takes it: a handle (Job, Sweep) becomes `[sweep:]PROJECT/NAME`,
    a string or a {"job"|"sweep": ...} object goes as it is."""
    items = value if isinstance(value, list | tuple) else [value]
    wired: list[Any] = []
    for item in items:
        if isinstance(item, str | Mapping):
            wired.append(item)
            continue
        name = getattr(item, "name", None)
        project = getattr(item, "project", None) or getattr(item, "_project", None)
        if not isinstance(name, str) or not isinstance(project, str):
            raise errors.InvalidArgument(f"after: expected a Job, a Sweep or a name, not "
                                         f"{type(item).__name__} ({_short(item)})",
                                         field="after")
        # Sweep or a kind of it (client.map's MapSweep); sdk.sweep imports this module.
        sweep = "sweep:" if any(c.__name__ == "Sweep" for c in type(item).__mro__) else ""
        wired.append(f"{sweep}{project}/{name}")
    return wired


class Job:
    """A run-to-completion job on this box: `nodus.Job.run(command=[...], gpu="H100:2")`,
    then `.wait()`, `.logs()`, `.files`, `.outputs`. A handle holds the job's document as
    last read; `.status()` reads it again."""

    def __init__(self, obj: Mapping[str, Any]) -> None:
        self._obj = View(obj)
        self._client = default_client()

    def __repr__(self) -> str:
        return f"Job({self.name!r}, project={self._obj.get('project')!r})"

    @property
    def name(self) -> str:
        return str(self._obj["name"])

    @property
    def project(self) -> str:
        return str(self._obj["project"])

    @classmethod
    def create(cls, *, name: str | None = None, image: Any = None,
               command: list[str] | None = None, args: list[str] | None = None,
               source: str | os.PathLike[str] | Mapping[str, Any] | None = None,
               gpu: Any = None, cpu: Any = None, memory: Any = None, disk: Any = None,
               env: dict[str, str] | None = None, secrets: list[Any] | None = None,
               volumes: Mapping[str, Any] | None = None, workdir: str | None = None,
               network: Any = None, checkpoint: Any = None, timeout: Any = None,
               expected_duration: Any = None, interruptible: Any = None, region: Any = None,
               profile: Any = None, max_cost: Any = None, completions: int | None = None,
               parallelism: int | None = None, distributed: Distributed | None = None,
               outputs: Mapping[str, str] | None = None, labels: dict[str, str] | None = None,
               allow_large_source: bool = False, project: str | None = None,
               export: str | None = None, after: Any = None) -> Job:
        """Submit a job and return its handle at once (it may wait in the queue). `source`:
        a directory packed and uploaded (no `.git`; `.gitignore` and `.nodusignore` honoured;
        its size is logged to the "noduslocal" logger); `gpu`: "H100:2", 2, or {"count",
        "type", "min_memory"}; `cpu`, `memory`, `disk`, `timeout` as "4", "16GiB", "2h";
        `export` which of your environment variables the job gets, as the CLI's
        `--export` (sbatch's): "ALL" (the default for a host job, so your `python` and
        tools are found; PWD, SHLVL, NODUS_* and the like are never sent), "NONE" (the
        default with an `image`, which has its own PATH) or "NAME,NAME"; `env` adds to
        it and wins key by key. `after`: jobs (or sweeps) to wait for first, each a Job
        or Sweep handle or a string `[afterok:|afterany:|afternotok:][sweep:]
        [PROJECT/]NAME` (afterok, the default: it succeeded; afterany: it ended;
        afternotok: it failed or was cancelled); one that can no longer be met ends this
        job Cancelled (DependencyNeverSatisfied). The arguments are the Nodus SDK's
        (`export` and `after` are noduslocal's)."""
        given = dict(locals())
        del given["cls"], given["export"]
        given["env"] = sent_env(export, image, env, secrets)
        if after is not None:
            given["after"] = after_argument(after)
        client = default_client()
        # Every argument checked before anything is uploaded or created.
        body = {key: _wire(value, key) for key, value in given.items()
                if value is not None and not (key == "allow_large_source" and value is False)}
        if isinstance(source, str | os.PathLike):
            # A path is packed and uploaded here; the daemon receives its sha256.
            body["source"] = client.upload_source(
                [Path(source)], contents_of_single_dir=True, allow_large=allow_large_source)
        return cls(client.create_job(body))

    @classmethod
    def run(cls, **kwargs: Any) -> Job:
        """Create the Job and return its handle; `.wait()` blocks until it finishes."""
        return cls.create(**kwargs)

    @classmethod
    def from_name(cls, name: str, project: str | None = None) -> Job:
        """The handle of an existing job (project: default your user name)."""
        return cls(default_client().get_job(text_argument(name, "name"),
                                            text_argument(project, "project", optional=True)))

    def status(self) -> View:
        """The job's document, read now: phase, reason, hold, exit code, cost, spec."""
        self._obj = View(self._client.get_job(self.name, self.project))
        return self._obj

    def wait(self, timeout: float | None = None) -> View:
        """Block until the Job finishes; raises JobFailed with the exit code and log tail
        when it fails, JobCancelled when it was cancelled, WaitTimeout on `timeout`."""
        doc = self._client.wait_job(self.name, self.project, timeout_argument(timeout))
        self._obj = View(doc)
        if doc["phase"] == Phase.SUCCEEDED:
            return self._obj
        tail = self._log_tail()
        cls = errors.JobCancelled if doc["phase"] == Phase.CANCELLED else errors.JobFailed
        detail = doc.get("message") or doc.get("reason") or doc["phase"]
        raise cls(f"job {self.name!r} {doc['phase'].lower()}: {detail}", name=self.name,
                  phase=doc["phase"], reason=doc.get("reason"), exit_code=doc.get("exit_code"),
                  log_tail=tail)

    def _log_tail(self, lines: int = 20) -> str:
        try:
            return b"".join(self._client.logs(self.name, self.project, tail=lines)).decode(
                "utf-8", "replace")
        except errors.NodusError:
            return ""

    def iter_logs(self, follow: bool = False, **params: Any) -> Iterator[str]:
        """The log as lines (without their newline), synchronously."""
        _check_log_params(params)
        pending = b""
        for chunk in self._client.logs(self.name, self.project, follow=follow, **params):
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                yield line.decode("utf-8", "replace")
        if pending:
            yield pending.decode("utf-8", "replace")

    async def logs(self, follow: bool = False, rank: int | str | None = None,
                   index: int | None = None, **params: Any) -> AsyncIterator[str]:
        """The log as lines (without their newline); of a gang, rank 0's unless `rank` names
        another, or "all" (every rank's, prefixed [r<n>])."""
        _check_log_params(params)
        if rank is not None:
            params["rank"] = rank
        if index is not None:
            params["index"] = index
        import aiohttp  # only async users pay for it

        socket_path = str(self._client.transport.socket_path)
        query = {k: str(v) for k, v in params.items() if v is not None}
        query["project"] = self.project
        if follow:
            query["follow"] = "1"
        timeout = aiohttp.ClientTimeout(total=None, sock_read=None)
        async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=socket_path),
                                         timeout=timeout) as session, \
                session.get(f"http://localhost/v1/jobs/{self.name}/logs",
                            params=query) as resp:
            if resp.status >= 400:
                raise errors.from_wire(resp.status, await resp.json())
            pending = b""
            async for chunk in resp.content.iter_any():
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    yield line.decode("utf-8", "replace")
            if pending:
                yield pending.decode("utf-8", "replace")

    def cancel(self) -> None:
        """SIGTERM to its processes, SIGKILL after the daemon's kill_grace; ends Cancelled."""
        self._obj = View(self._client.cancel_job(self.name, self.project))

    def attempts(self) -> list[View]:
        """Each attempt: its start, end, exit code, signal and reason."""
        return [View(a) for a in self._client.attempts(self.name, self.project)]

    # --- estimates, exec, suspend and resume ----------------------------------------------

    def estimate(self) -> View:
        """When it should start (a simulation of the queue), what it should cost (p50/p90)
        and why it waits now."""
        return View(self._client.estimate_job(self.name, self.project))

    def exec(self, *command: str, pty: bool = False, rank: int | None = None,
             index: int | None = None) -> Any:
        """Run COMMAND beside the running job, as its owner, with its environment and
        workdir; returns a Process with stdout, stderr and returncode. With `pty=True` it
        runs on a pseudo-terminal (COMMAND may be empty: the owner's login shell) and this
        returns at once a TerminalProcess: `stdin.write()`, `stdout.read1()`,
        `resize(rows, cols)`, `wait()` and `close()`."""
        if pty:
            from noduslocal.sdk.terminal import TerminalProcess

            return TerminalProcess(self._client.transport.socket_path, self.name,
                                   self.project, list(command) or None, rank, index)
        if not command:
            raise errors.InvalidArgument("command: give the command to run", field="command")
        return View(self._client.exec_job(self.name, self.project, list(command),
                                          rank=rank, index=index))

    def suspend(self) -> None:
        """Stop the job like a cancel (SIGTERM, grace, SIGKILL) and keep it Suspended, with
        its workspace and checkpoint, until resume(). Returns once the job is Suspended
        (or ended meanwhile): `status().phase` then says so."""
        doc = self._client.suspend_job(self.name, self.project)
        while doc["phase"] not in (*TERMINAL, Phase.SUSPENDED):
            time.sleep(SUSPEND_POLL)  # its stop takes at most the daemon's kill grace
            doc = self._client.get_job(self.name, self.project)
        self._obj = View(doc)

    def resume(self) -> None:
        """Queue a suspended job again, at its old place."""
        self._obj = View(self._client.resume_job(self.name, self.project))

    @property
    def files(self) -> Files:
        """The job's kept workspace: `list(path)`, `read(path)`, `download(path, dest)`."""
        return Files(self)

    @property
    def outputs(self) -> Outputs:
        """`job.outputs["model"].download("./model")`, `outputs.list()`,
        `outputs.download(dir, prefix=...)`."""
        return Outputs(self)


class Output:
    """One declared output of a Job."""

    def __init__(self, parent: Any, name: str, kind: str = "Job") -> None:
        if kind != "Job":
            raise errors.Unsupported("kind", "outputs of Jobs only")
        self.parent = parent
        self.name = name

    def download(self, path: str | os.PathLike[str], index: int | None = None) -> Path:
        """Save the output at `path`: the sha256 from X-Nodus-SHA256 is verified, then the
        file (or, for a directory output, the directory) is renamed in; of an indexed job,
        index `index`'s."""
        job = self.parent
        return job._client.download_output(job.name, job.project, self.name,
                                           path_argument(path, "path"), index)


class Outputs:
    """Declared and collected outputs of a Job."""

    def __init__(self, parent: Any, kind: str = "Job") -> None:
        if kind != "Job":
            raise errors.Unsupported("kind", "outputs of Jobs only")
        self.parent = parent

    def __getitem__(self, name: str) -> Output:
        return Output(self.parent, name)

    def list(self) -> list[View]:
        return [View(o) for o in self.parent._client.list_outputs(self.parent.name,
                                                                  self.parent.project)]

    def download(self, path: str | os.PathLike[str], prefix: str = "") -> Path:
        """Save every collected output named under `prefix` into the directory `path`, each
        verified, at its name below `prefix`."""
        root = Path(path)
        for out in self.list():
            if out.collected and out.name.startswith(prefix):
                target = root / out.name[len(prefix):].lstrip("/")
                if out.get("index") is not None:  # an indexed job's: one per index
                    target = root / f"index-{out['index']}" / target.relative_to(root)
                target.parent.mkdir(parents=True, exist_ok=True)
                self[out.name].download(target, out.get("index"))
        return root


class Files:
    """A job's workspace, kept after it ends (paths are workspace-relative; a leading
    /workspace/ is accepted). Only the job's owner or an admin may read it."""

    def __init__(self, job: Job) -> None:
        self._job = job

    def list(self, path: str = "") -> list[View]:
        entries = self._job._client.list_files(self._job.name, self._job.project, path)
        return [View(e) for e in entries]

    def download(self, path: str, dest: str | os.PathLike[str]) -> Path:
        """Save a file at DEST (into it if DEST is a directory), verified by sha256."""
        return self._job._client.download_file(self._job.name, self._job.project,
                                               text_argument(path, "path"),
                                               path_argument(dest, "dest"))

    def read(self, path: str) -> bytes:
        with tempfile.TemporaryDirectory(prefix="noduslocal-") as tmp:
            return self.download(path, Path(tmp) / "file").read_bytes()


def _check_log_params(params: Mapping[str, Any]) -> None:
    unknown = sorted(set(params) - LOG_PARAMS)
    if unknown:
        raise errors.InvalidArgument(
            f"{unknown[0]}: unknown log parameter; allowed: {', '.join(sorted(LOG_PARAMS))}",
            field=unknown[0])
