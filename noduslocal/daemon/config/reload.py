"""The config file followed while the daemon runs: loaded again when it changes (watchfiles,
on its directory, since editors replace files by renaming) and on SIGHUP. A file that does
not load is refused whole, naming its line, and the daemon keeps what it had; a change that
cannot apply live is said, and waits for the next start.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from noduslocal.daemon.config.settings import LIVE, TOML_NAME, Settings
from noduslocal.domain.errors import InvalidArgument

log = logging.getLogger("noduslocald")
DIRECTORY_POLL = 5.0  # seconds between looks for a config directory that is not there yet
SETTLE = 0.2  # seconds of quiet after a change before the file is read (an editor's writes)


@dataclass
class ConfigStatus:
    """What `noduslocal doctor` shows of the config (GET /v1/info)."""

    path: str
    loaded_at: float
    error: str | None = None  # why the file on disk is not in force, with its line
    restart_pending: list[str] = field(default_factory=list)  # changed, applied at start

    def to_wire(self) -> dict[str, Any]:
        return {"path": self.path, "loaded_at": self.loaded_at, "error": self.error,
                "restart_pending": self.restart_pending}


def located(exc: InvalidArgument, path: Path) -> str:
    """The refusal with the line of the file it is about: TOML's own errors carry it; a
    value refused by its setting's check is found by the setting's name."""
    if "(at line " in exc.message or not exc.field:
        return exc.message
    line = _line_of(path, exc.field)
    return f"{exc.message} (at line {line} of {path})" if line else exc.message


def _line_of(path: Path, dotted: str) -> int | None:
    """The line that sets DOTTED (`user_max_jobs`, `profiles.small.cpu`), or the header of
    the table it names (`gpu_hour_rates`)."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    *tables, key = dotted.split(".")
    table, current, header = ".".join(tables), "", None
    for number, raw in enumerate(lines, 1):
        text = raw.split("#", 1)[0].strip()
        if text.startswith("["):
            current = text.strip("[] ")
            header = number if current == dotted else header
        elif current == table and re.match(rf"{re.escape(key)}\s*=", text):
            return number
    return header


class ConfigReloader:
    """Loads the config again on a change or SIGHUP and hands the live part of what changed
    to `apply`; `status` is what it did last."""

    def __init__(self, path: Path, load: Callable[[], Settings], loaded: Settings,
                 running: Settings, apply: Callable[[Settings], None]) -> None:
        """LOADED: what LOAD gave at start; RUNNING: that as the daemon runs it (a socket
        passed by systemd in place of the configured one)."""
        self.path = path
        self._load = load
        self._loaded = loaded
        self._at_start = self._loaded  # what the settings that wait for a restart came from
        self._running = running
        self._apply = apply
        self._wake = asyncio.Event()
        self.status = ConfigStatus(str(path), time.time())

    def request(self) -> None:
        """SIGHUP: read the file again now."""
        self._wake.set()

    async def run(self) -> None:
        watcher = asyncio.create_task(self._watch())
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                await asyncio.sleep(SETTLE)
                self._wake.clear()
                self.reload()
        finally:
            watcher.cancel()

    async def _watch(self) -> None:
        import watchfiles

        directory = self.path.parent
        if not directory.is_dir():  # /etc/noduslocal made after the daemon started
            while not directory.is_dir():
                await asyncio.sleep(DIRECTORY_POLL)
            self._wake.set()  # the file may be there already: written before the watch
        async for changes in watchfiles.awatch(directory, debounce=100, step=50,
                                               recursive=False):
            if any(Path(changed).name == self.path.name for _, changed in changes):
                self._wake.set()

    def reload(self) -> None:
        try:
            loaded = self._load()
        except InvalidArgument as exc:
            self.status.error = located(exc, self.path)
            log.error("%s; the daemon keeps its previous settings", self.status.error)
            return
        except Exception as exc:  # a file the checks missed must not end the following
            log.debug("reading %s failed", self.path, exc_info=True)
            self.status.error = f"config: {self.path}: {type(exc).__name__}: {exc}"
            log.error("%s; the daemon keeps its previous settings", self.status.error)
            return
        changed = [f.name for f in fields(Settings)
                   if getattr(loaded, f.name) != getattr(self._loaded, f.name)]
        self._loaded = loaded
        live = {name: getattr(loaded, name) for name in changed if name in LIVE}
        # Against the start, not the last reload: a change undone waits for nothing.
        waiting = sorted(TOML_NAME.get(f.name, f.name) for f in fields(Settings)
                         if f.name not in LIVE
                         and getattr(loaded, f.name) != getattr(self._at_start, f.name))
        self.status = ConfigStatus(str(self.path), time.time(), None, waiting)
        if live:
            self._running = replace(self._running, **live)
            self._apply(self._running)
            log.info("config %s reloaded: %s applied", self.path,
                     ", ".join(TOML_NAME.get(n, n) for n in live))
        if waiting and any(n not in LIVE for n in changed):
            log.warning("config %s: %s changed; that takes effect when the daemon restarts",
                        self.path, ", ".join(waiting))

