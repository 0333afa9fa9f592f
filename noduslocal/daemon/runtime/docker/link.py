"""The daemon's connection to dockerd: one thread that keeps a docker-py client and the
container event stream open (reconnecting while dockerd is away), tells the loop when
dockerd comes and goes, and hands it every event of this daemon's containers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable
from typing import Any

import docker

log = logging.getLogger(__name__)
RETRY_EVERY = 1.0  # seconds between attempts to reach dockerd
API_TIMEOUT = 60  # seconds for one ordinary docker API call


class DockerLink:
    def __init__(self, base_url: str | None, event_filter: dict[str, Any],
                 on_event: Callable[[dict[str, Any]], None],
                 on_state: Callable[[bool, str], None]) -> None:
        self.base_url = base_url
        self.event_filter = event_filter
        self._on_event = on_event
        self._on_state = on_state
        self.client: docker.DockerClient | None = None
        self._stream: Any = None
        self._closing = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def new_client(self) -> docker.DockerClient:
        """A client of its own (for a long stream); the API version is asked only once."""
        kwargs: dict[str, Any] = {"timeout": API_TIMEOUT, "max_pool_size": 64}
        if self.client is not None:
            kwargs["version"] = self.client.api.api_version
        if self.base_url:
            return docker.DockerClient(base_url=self.base_url, **kwargs)
        return docker.from_env(**kwargs)

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="docker-events", daemon=True)
        self._thread.start()

    async def close(self) -> None:
        self._closing.set()
        stream = self._stream
        if stream is not None:
            with contextlib.suppress(Exception):
                stream.close()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 5)

    def reconnect(self) -> None:
        """Drop the event stream; the thread connects again and reports when it is up."""
        stream = self._stream
        if stream is not None:
            with contextlib.suppress(Exception):
                stream.close()

    def _post(self, callback: Callable[..., None], *args: Any) -> None:
        assert self._loop is not None
        with contextlib.suppress(RuntimeError):  # the loop closed under us
            self._loop.call_soon_threadsafe(callback, *args)

    def _run(self) -> None:
        reported: str | None = None
        while not self._closing.is_set():
            try:
                client = self.new_client()
                client.ping()
                # Subscribed before we say dockerd is up: nothing started after that point
                # can end unseen.
                self._stream = client.api.events(decode=True, filters={
                    "type": "container", **self.event_filter})
                self.client = client
                self._post(self._on_state, True, "")
                reported = None
                for event in self._stream:
                    self._post(self._on_event, event)
                if not self._closing.is_set():
                    raise ConnectionError("the event stream ended")
            except Exception as exc:
                if self._closing.is_set():
                    break
                why = _describe(exc)
                if why != reported:
                    log.warning("dockerd unreachable: %s", why)
                    reported = why
                self._post(self._on_state, False, why)
            finally:
                self._stream = None
            self._closing.wait(RETRY_EVERY)


def _describe(exc: Exception) -> str:
    text = str(exc)
    if "No such file or directory" in text or "Connection refused" in text:
        return "dockerd is not running (no answer on its socket)"
    if "Permission denied" in text:
        return "no permission to use dockerd's socket"
    return text.splitlines()[0][:200] if text else type(exc).__name__
