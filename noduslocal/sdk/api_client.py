"""The synchronous API client: one method per route of /v1, used by the SDK and the CLI."""

from __future__ import annotations

import os
import time

from noduslocal.domain import errors
from noduslocal.sdk import wire
from noduslocal.sdk.transport import Transport

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only; pathlib, tarfile and the rest load where used
    from collections.abc import Callable, Container, Iterator, Mapping
    from pathlib import Path
    from typing import Any

# Long enough to ride out a daemon restart (kill -9, then systemd starting it again).
RESTART_GRACE = 30.0


def _quote(name: str) -> str:
    return wire.quote(name)


CELLS_PAGE = 1000  # a sweep's cells per request
JOBS_PAGE = 1000  # jobs per request (the daemon's page)


class ApiClient:
    def __init__(self, socket_path: str | Path | None = None) -> None:
        self.transport = Transport(socket_path)

    def queue(self) -> dict[str, Any]:
        return self.transport.request("GET", "/v1/queue")

    def gpus(self) -> dict[str, Any]:
        return self.transport.request("GET", "/v1/gpus")

    def drain_gpu(self, index: str, drained: bool = True) -> dict[str, Any]:
        action = "drain" if drained else "undrain"
        return self.transport.request("POST", f"/v1/gpus/{_quote(index)}/{action}")

    def info(self) -> dict[str, Any]:
        return self.transport.request("GET", "/v1/info")

    def create_job(self, body: Mapping[str, Any], *, idempotency_key: str | None = None,
                   retry: bool = True) -> dict[str, Any]:
        """Create a job. With `retry`, a connection lost mid-request is retried with the same
        idempotency key, so the job is created exactly once."""
        key = idempotency_key or (os.urandom(16).hex() if retry else None)
        headers = {"Idempotency-Key": key} if key else None
        return self.transport.request("POST", "/v1/jobs", body=dict(body), headers=headers,
                                      retry_for=RESTART_GRACE if retry else 0.0)

    def get_job(self, name: str, project: str | None = None) -> dict[str, Any]:
        return self.transport.request("GET", f"/v1/jobs/{_quote(name)}",
                                      query={"project": project})

    def list_jobs(self, *, phases: list[str] | None = None, owner: str | None = None,
                  project: str | None = None, labels: Mapping[str, str] | None = None,
                  all: bool = False, limit: int | None = None,
                  sweep: str | None = None) -> list[dict[str, Any]]:
        """The newest `limit` jobs that match (default 1000), oldest first; the daemon
        answers a page at a time and this follows its cursor. `sweep`: that sweep's jobs."""
        query: dict[str, Any] = {
            "phase": ",".join(phases) if phases else None,
            "owner": owner,
            "project": project,
            "label": [f"{k}={v}" for k, v in (labels or {}).items()] or None,
            "all": "1" if all else None,
            "sweep": sweep,
        }
        wanted = JOBS_PAGE if limit is None else limit
        pages: list[list[dict[str, Any]]] = []
        got, before = 0, None
        while got < wanted:
            page = self.transport.request("GET", "/v1/jobs", query={
                **query, "limit": min(wanted - got, JOBS_PAGE), "before": before})
            pages.append(page["jobs"])
            got += len(page["jobs"])
            if not (before := page.get("next")):
                break
        return [job for page in reversed(pages) for job in page]

    def remove_job(self, name: str, project: str | None = None) -> dict[str, Any]:
        """An ended job out of listings, its name free; its history stays for fair share."""
        return self.transport.request("DELETE", f"/v1/jobs/{_quote(name)}",
                                      query={"project": project})

    def cancel_job(self, name: str, project: str | None = None) -> dict[str, Any]:
        return self.transport.request("POST", f"/v1/jobs/{_quote(name)}/cancel",
                                      query={"project": project})

    def estimate_job(self, name: str, project: str | None = None) -> dict[str, Any]:
        return self.transport.request("GET", f"/v1/jobs/{_quote(name)}/estimate",
                                      query={"project": project})

    def suspend_job(self, name: str, project: str | None = None) -> dict[str, Any]:
        return self.transport.request("POST", f"/v1/jobs/{_quote(name)}/suspend",
                                      query={"project": project})

    def resume_job(self, name: str, project: str | None = None) -> dict[str, Any]:
        return self.transport.request("POST", f"/v1/jobs/{_quote(name)}/resume",
                                      query={"project": project})

    def wait_job(self, name: str, project: str | None = None,
                 timeout: float | None = None) -> dict[str, Any]:
        """Block until the job is terminal, in server-side long polls; riding out a daemon
        restart. Raises WaitTimeout after `timeout` seconds."""
        from noduslocal.domain.states import TERMINAL

        return self._long_poll(f"/v1/jobs/{_quote(name)}/wait", project, timeout,
                               TERMINAL, f"job {name!r}")

    def _long_poll(self, path: str, project: str | None, timeout: float | None,
                   terminal: Container[str], what: str) -> dict[str, Any]:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            poll = 60.0 if deadline is None else max(0.0, deadline - time.monotonic())
            doc: dict[str, Any] = self.transport.request(
                "GET", path, query={"project": project, "timeout": f"{min(poll, 60.0):.3f}"},
                timeout=min(poll, 60.0) + 30.0, retry_for=RESTART_GRACE)
            if doc["phase"] in terminal:
                return doc
            if deadline is not None and time.monotonic() >= deadline:
                raise errors.WaitTimeout(f"{what} is still {doc['phase']} after {timeout:g}s")

    def create_sweep(self, body: Mapping[str, Any], *,
                     idempotency_key: str | None = None) -> dict[str, Any]:
        """Create a sweep and every cell in one call, exactly once (as create_job)."""
        key = idempotency_key or os.urandom(16).hex()
        return self.transport.request("POST", "/v1/sweeps", body=dict(body),
                                      headers={"Idempotency-Key": key},
                                      retry_for=RESTART_GRACE, timeout=600.0)

    def get_sweep(self, name: str, project: str | None = None) -> dict[str, Any]:
        return self.transport.request("GET", f"/v1/sweeps/{_quote(name)}",
                                      query={"project": project})

    def list_sweeps(self, *, project: str | None = None, running: bool = False,
                    all: bool = True) -> list[dict[str, Any]]:
        """Every sweep that matches, oldest first, ended ones too unless `running` (the
        daemon answers a page at a time). `all` is kept for old callers; it changes
        nothing."""
        pages: list[list[dict[str, Any]]] = []
        before = None
        while True:
            page = self.transport.request("GET", "/v1/sweeps", query={
                "project": project, "running": "1" if running else None, "before": before})
            pages.append(page["sweeps"])
            if not (before := page.get("next")):
                return [sweep for page in reversed(pages) for sweep in page]

    def sweep_cells(self, name: str, project: str | None = None) -> list[dict[str, Any]]:
        cells: list[dict[str, Any]] = []
        while True:
            page = self.transport.request(
                "GET", f"/v1/sweeps/{_quote(name)}/cells",
                query={"project": project, "offset": len(cells), "limit": CELLS_PAGE})
            cells += page["cells"]
            if not page["cells"] or page.get("next") is None:
                return cells

    def wait_sweep(self, name: str, project: str | None = None,
                   timeout: float | None = None) -> dict[str, Any]:
        """Block until the sweep is terminal (long polls that ride out a restart)."""
        from noduslocal.domain.states import SWEEP_TERMINAL

        return self._long_poll(f"/v1/sweeps/{_quote(name)}/wait", project, timeout,
                               SWEEP_TERMINAL, f"sweep {name!r}")

    def cancel_sweep(self, name: str, project: str | None = None,
                     remaining: bool = False) -> dict[str, Any]:
        return self.transport.request("POST", f"/v1/sweeps/{_quote(name)}/cancel", query={
            "project": project, "remaining": "1" if remaining else None})

    def suspend_sweep(self, name: str, project: str | None = None) -> dict[str, Any]:
        return self.transport.request("POST", f"/v1/sweeps/{_quote(name)}/suspend",
                                      query={"project": project})

    def resume_sweep(self, name: str, project: str | None = None) -> dict[str, Any]:
        return self.transport.request("POST", f"/v1/sweeps/{_quote(name)}/resume",
                                      query={"project": project})

    def retry_sweep(self, name: str, project: str | None = None,
                    all: bool = False) -> dict[str, Any]:
        return self.transport.request("POST", f"/v1/sweeps/{_quote(name)}/retry",
                                      query={"project": project, "all": "1" if all else None})

    def gc_sweep(self, name: str, project: str | None = None) -> dict[str, Any]:
        return self.transport.request("POST", f"/v1/sweeps/{_quote(name)}/gc",
                                      query={"project": project}, timeout=600.0)

    def remove_sweep(self, name: str, project: str | None = None) -> dict[str, Any]:
        """`sweep rm`: an ended sweep out of listings, its name free for a new sweep."""
        return self.transport.request("DELETE", f"/v1/sweeps/{_quote(name)}",
                                      query={"project": project}, timeout=600.0)

    def replace_sweep(self, name: str, project: str | None = None) -> None:
        """Make the name free for a new sweep, as `job run --replace` does for a job: the
        sweep that has it is cancelled (and its jobs waited for) if it has not ended, then
        removed. Nothing happens when no sweep has the name."""
        from noduslocal.domain.states import SWEEP_TERMINAL, TERMINAL

        try:
            old = self.get_sweep(name, project)
        except errors.NotFound:
            return
        project = old["project"]
        if old["phase"] not in SWEEP_TERMINAL:
            self.cancel_sweep(name, project)
        # A cancelled sweep has ended before its running cells have: wait for each.
        for job in self.list_jobs(sweep=name, project=project, limit=1 << 62):
            if job["phase"] not in TERMINAL:
                self.wait_job(job["name"], project)
        self.remove_sweep(name, project)

    def set_sweep(self, name: str, project: str | None = None, *,
                  max_parallel: int) -> dict[str, Any]:
        return self.transport.request("POST", f"/v1/sweeps/{_quote(name)}/set",
                                      query={"project": project},
                                      body={"max_parallel": max_parallel})

    def attempts(self, name: str, project: str | None = None) -> list[dict[str, Any]]:
        return self.transport.request("GET", f"/v1/jobs/{_quote(name)}/attempts",
                                      query={"project": project})["attempts"]

    def logs(self, name: str, project: str | None = None, *, follow: bool = False,
             tail: int | None = None, attempt: int | None = None,
             stream: str | None = None, rank: int | str | None = None,
             index: int | str | None = None) -> Iterator[bytes]:
        return self.transport.stream(
            f"/v1/jobs/{_quote(name)}/logs",
            query={"project": project, "follow": "1" if follow else None, "tail": tail,
                   "attempt": attempt, "stream": stream, "rank": rank, "index": index},
            timeout=None if follow else 120.0)

    def set_secret(self, name: str, value: str) -> bool:
        """Create or replace one of your secrets; True when it is new."""
        return self.transport.request("PUT", f"/v1/secrets/{_quote(name)}",
                                      body={"value": value})["created"]

    def list_secrets(self) -> list[dict[str, Any]]:
        return self.transport.request("GET", "/v1/secrets")["secrets"]

    def delete_secret(self, name: str) -> None:
        self.transport.request("DELETE", f"/v1/secrets/{_quote(name)}")

    def upload_source(self, paths: list[Path], *, contents_of_single_dir: bool,
                      allow_large: bool = False,
                      say: Callable[[int, str], None] | None = None) -> dict[str, str]:
        """Pack PATHS (sdk/source.py) and send them unless the daemon has them from us
        already; returns the `source` value for a job create. What was packed (size, file
        count, and over a threshold the biggest entries) goes to SAY(level, text), by
        default the "noduslocal" logger."""
        from noduslocal.sdk import source

        packed = source.pack(paths, contents_of_single_dir=contents_of_single_dir,
                             allow_large=allow_large)
        try:
            if say is None:
                source.log(packed)
            else:
                say(*source.report(packed))
            try:
                self.transport.request("GET", f"/v1/sources/{packed.sha256}")
            except errors.NotFound:
                self.transport.upload(
                    f"/v1/sources/{packed.sha256}", packed.path, packed.size,
                    {"X-Nodus-Allow-Large": "true"} if allow_large else None)
        finally:
            packed.path.unlink(missing_ok=True)
        return {"sha256": packed.sha256}

    def snapshot_job(self, name: str, project: str | None = None, *,
                     allow_large: bool = False) -> dict[str, Any]:
        """A finished job's workspace as a source of ours: {"sha256", "size", "job",
        "image", "runtime"}."""
        return self.transport.request(
            "POST", f"/v1/jobs/{_quote(name)}/snapshot", query={"project": project},
            headers={"X-Nodus-Allow-Large": "true"} if allow_large else None, timeout=660.0)

    def create_volume(self, name: str) -> dict[str, Any]:
        return self.transport.request("POST", "/v1/volumes", body={"name": name})

    def list_volumes(self) -> list[dict[str, Any]]:
        return self.transport.request("GET", "/v1/volumes")["volumes"]

    def delete_volume(self, name: str) -> None:
        self.transport.request("DELETE", f"/v1/volumes/{_quote(name)}")

    def volume_files(self, name: str, path: str = "") -> list[dict[str, Any]]:
        return self.transport.request("GET", f"/v1/volumes/{_quote(name)}/files",
                                      query={"path": path})["entries"]

    def download_volume_file(self, name: str, path: str,
                             dest: str | os.PathLike[str]) -> Path:
        from pathlib import Path

        target = Path(dest)
        if target.is_dir():
            target = target / (path.rstrip("/").rsplit("/", 1)[-1] or "download")
        return self.transport.download(f"/v1/volumes/{_quote(name)}/files/content", target,
                                       query={"path": path})

    def list_files(self, name: str, project: str | None = None,
                   path: str = "") -> list[dict[str, Any]]:
        return self.transport.request("GET", f"/v1/jobs/{_quote(name)}/files",
                                      query={"project": project, "path": path})["entries"]

    def download_file(self, name: str, project: str | None, path: str,
                      dest: str | os.PathLike[str]) -> Path:
        """Save a workspace file at DEST (into it, when DEST is a directory): written to a
        temporary file beside it, checked against X-Nodus-SHA256, then renamed in. A
        mismatch leaves nothing behind and raises ChecksumMismatch."""
        from pathlib import Path

        target = Path(dest)
        if target.is_dir():
            target = target / (path.rstrip("/").rsplit("/", 1)[-1] or "download")
        return self.transport.download(
            f"/v1/jobs/{_quote(name)}/files/content", target,
            query={"project": project, "path": path})

    def exec_job(self, name: str, project: str | None, command: list[str],
                 timeout: float = 300.0, rank: int | None = None,
                 index: int | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"command": command, "timeout": timeout}
        if rank is not None:
            body["rank"] = rank
        if index is not None:
            body["index"] = index
        return self.transport.request(
            "POST", f"/v1/jobs/{_quote(name)}/exec", query={"project": project},
            body=body, timeout=timeout + 30)

    def list_outputs(self, name: str, project: str | None = None) -> list[dict[str, Any]]:
        return self.transport.request("GET", f"/v1/jobs/{_quote(name)}/outputs",
                                      query={"project": project})["outputs"]

    def download_output(self, name: str, project: str | None, output: str,
                        dest: str | os.PathLike[str], index: int | None = None) -> Path:
        """Save an output at DEST, verified by sha256: a file as a file (into DEST when it
        is a directory), a directory output as a directory at DEST (extracted from its tar
        beside DEST, then renamed into place). Nothing is left behind on a mismatch. An
        indexed job's outputs are each index's: `index` says whose."""
        rows = self.list_outputs(name, project)
        if index is None and any("index" in o for o in rows):
            raise errors.InvalidArgument(f"index: job {name!r} is indexed; say whose output "
                                         f"{output!r} to download", field="index")
        listed = {o["name"]: o for o in rows if o.get("index") == index}
        if output not in listed:
            raise errors.NotFound(f"output: job {name!r} declares no output {output!r}"
                                  + ("" if index is None else f" of index {index}"))
        from pathlib import Path

        target = Path(dest)
        query = {"project": project, "output": output, "index": index}
        url = f"/v1/jobs/{_quote(name)}/outputs/content"
        if listed[output].get("kind") != "dir":
            if target.is_dir():
                target = target / output.rsplit("/", 1)[-1]
            return self.transport.download(url, target, query=query)
        if target.exists() and (not target.is_dir() or any(target.iterdir())):
            raise errors.Conflict(f"{target} exists and is not an empty directory")
        import tarfile
        import tempfile

        from noduslocal.sdk.extract import extract

        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=f".{target.name}.", dir=target.parent) as tmp:
            archive = self.transport.download(url, Path(tmp) / "output.tar", query=query)
            unpacked = Path(tmp) / "tree"
            unpacked.mkdir()  # an empty directory output is an empty tar
            with tarfile.open(archive) as tar:
                # Nothing outside the target, no devices, no setuid; a member refused (a
                # link to an absolute path, say) is left out with a warning.
                extract(tar, str(unpacked))
            if target.exists():
                target.rmdir()
            os.replace(unpacked, target)
        return target

    def events(self, *, since: int = 0, job: str | None = None, project: str | None = None,
               follow: bool = False) -> Iterator[bytes]:
        return self.transport.stream(
            "/v1/events",
            query={"since": since, "job": job, "project": project,
                   "follow": "1" if follow else None},
            timeout=None if follow else 120.0)
