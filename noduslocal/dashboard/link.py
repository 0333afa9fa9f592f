"""The dashboard's one connection to the daemon: the user's own, over the Unix socket, so
the daemon sees this process's uid (SO_PEERCRED) and applies that user's permissions as it
does for the CLI. JSON calls, raw bodies for downloads, and line streams for follows.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from typing import Any
from urllib.parse import quote

import aiohttp

from noduslocal.domain import errors
from noduslocal.sdk.aio import TrustedConnector

Params = Mapping[str, str | int] | list[tuple[str, str | int]] | None


def path_of(*parts: str) -> str:
    """A daemon URL path from its segments, each quoted (a job's name is the user's text)."""
    return "/" + "/".join(quote(part, safe="") for part in parts)


class DaemonLink:
    def __init__(self, socket_path: str) -> None:
        self.socket_path = socket_path
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                base_url="http://localhost",
                connector=TrustedConnector(path=self.socket_path),
                # Streams (logs, events) stay open as long as the page follows them.
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=10))
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def get(self, path: str, params: Params = None) -> Any:
        """The daemon's JSON answer; its error (a NodusError with its HTTP status) raised."""
        async with self._client().get(path, params=params) as resp:
            return await self._json(resp)

    async def post(self, path: str, params: Params = None,
                   body: Mapping[str, Any] | None = None) -> Any:
        async with self._client().post(path, params=params, json=body or {}) as resp:
            return await self._json(resp)

    async def lines(self, path: str, params: Params = None) -> AsyncIterator[bytes]:
        """A streamed answer line by line (a followed log or the event stream); ends with
        the daemon's stream."""
        async with self._client().get(path, params=params) as resp:
            if resp.status >= 400:
                await self._json(resp)
            async for line in resp.content:
                yield line

    async def body(self, path: str, params: Params = None, limit: int | None = None) -> bytes:
        """A whole answer's bytes (a file's content), at most LIMIT bytes."""
        async with self._client().get(path, params=params) as resp:
            if resp.status >= 400:
                await self._json(resp)
            return await (resp.content.read(limit) if limit is not None else resp.read())

    @staticmethod
    async def _json(resp: aiohttp.ClientResponse) -> Any:
        text = await resp.text()
        try:
            body = json.loads(text) if text else None
        except ValueError:
            body = None
        if resp.status >= 400:
            raise errors.from_wire(resp.status, body)
        return body
