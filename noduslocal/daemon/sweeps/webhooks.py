"""A sweep's webhook: its status document POSTed on canary pass, canary failure and its
end, tried a few times with a timeout each; a failing webhook is logged and never changes
the sweep. Redirects are not followed, and no address of this host is reached unless the
admin allows it (webhook_local_networks), checked at create and at each post after DNS
resolution. Not kept across a daemon restart."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Iterable
from typing import Any

import aiohttp
from aiohttp.abc import ResolveResult
from aiohttp.resolver import ThreadedResolver
from yarl import URL

from noduslocal.daemon import local_addresses
from noduslocal.daemon.config.live import LiveSettings
from noduslocal.daemon.jobs.background import Background
from noduslocal.daemon.sweeps.reports import SweepReports
from noduslocal.domain.errors import InvalidArgument
from noduslocal.domain.sweeps import SweepRecord

log = logging.getLogger(__name__)
TRIES = 4
TIMEOUT = 10.0  # seconds for one POST, connect to answer; and for the lookup at create
FIRST_PAUSE = 1.0  # seconds before the second try; doubled for each further one
EVENT_HEADER = "X-Nodus-Event"
SETTING = "webhook_local_networks"


class Refused(Exception):
    """The webhook's host is, or resolves to, an address of this host's the admin did not
    allow. Not an OSError: aiohttp would take it for a failed lookup worth retrying."""


def _check(host: str, address: str, allowed: Iterable[local_addresses.IPNetwork]) -> None:
    parsed = local_addresses.parse(address)
    why = None if parsed is None else local_addresses.refused(parsed, allowed)
    if why is not None:
        where = f"{host} is" if address == host else f"{host} resolves to {address},"
        raise Refused(f"{where} {why}; webhooks reach this host only where the admin allows "
                      f"it ({SETTING})")


class CheckedResolver(ThreadedResolver):
    """aiohttp's lookup, then every address it found checked: the connection goes to the
    addresses checked here, never to those of a second lookup that might differ."""

    def __init__(self, allowed: Iterable[local_addresses.IPNetwork]) -> None:
        super().__init__()
        self.allowed = tuple(allowed)

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        found = await super().resolve(host, port, family)
        for each in found:
            _check(host, each["host"], self.allowed)
        return found


def _target(url: str) -> tuple[str, int]:
    """The host and port a POST to `url` connects to, parsed as aiohttp parses it; raises
    ValueError where aiohttp could not post to it (a port past 65535)."""
    parsed = URL(url)
    if not parsed.raw_host:
        raise ValueError(f"{url!r} has no host")
    return parsed.raw_host, parsed.port or 80


class Webhooks:
    def __init__(self, live: LiveSettings, background: Background,
                 reports: SweepReports) -> None:
        self.live = live  # webhook_local_networks is live: read at each use
        self.background = background
        self.reports = reports

    async def check(self, url: str | None) -> None:
        """At create: a webhook whose host is, or resolves to, an address of this host's
        the admin did not allow, or that does not resolve, is refused naming the field."""
        if url is None:
            return
        try:
            host, port = _target(url)
        except ValueError as exc:
            raise InvalidArgument(f"webhook: not a URL a POST can be sent to ({exc})",
                                  field="webhook") from None
        try:
            await asyncio.wait_for(self._resolve(host, port), TIMEOUT)
        except Refused as exc:
            raise InvalidArgument(f"webhook: {exc}", field="webhook") from None
        except TimeoutError:
            raise InvalidArgument(f"webhook: looking up {host} took over {TIMEOUT:g} s",
                                  field="webhook") from None
        except (OSError, UnicodeError) as exc:  # UnicodeError: a name IDNA refuses, "a..b"
            raise InvalidArgument(f"webhook: {host} does not resolve "
                                  f"({getattr(exc, 'strerror', None) or exc})",
                                  field="webhook") from None

    async def _resolve(self, host: str, port: int) -> None:
        """Refused unless every address `host` has now may be reached."""
        allowed = self.live.current.webhook_local_networks
        if local_addresses.parse(host) is not None:
            _check(host, host, allowed)  # aiohttp connects to a literal without a lookup
        else:
            await CheckedResolver(allowed).resolve(host, port, socket.AF_UNSPEC)

    def send(self, sweep: SweepRecord, *events: str) -> None:
        """POST the sweep's status once per event (canary-passed, canary-failed,
        completed), in that order, on a task of its own, when the sweep has a webhook."""
        url = sweep.spec.webhook
        if url and events:
            self.background.spawn(self._post_all(url, sweep, events))

    async def _post_all(self, url: str, sweep: SweepRecord, events: tuple[str, ...]) -> None:
        for event in events:
            await self._post(url, sweep, event)

    async def _document(self, sweep: SweepRecord, event: str) -> dict[str, Any]:
        """The status of the sweep as committed: the controller's record of an active
        sweep is not kept whole (its ended_at, for one)."""
        stored = await self.reports.store.sweep(sweep.project, sweep.name)
        record = stored if stored is not None and stored.id == sweep.id else sweep
        return {**await self.reports.status(record, redact=False), "event": event}

    def _session(self) -> aiohttp.ClientSession:
        # No cache: each post looks the name up again and checks what it found.
        connector = aiohttp.TCPConnector(
            resolver=CheckedResolver(self.live.current.webhook_local_networks),
            use_dns_cache=False)
        return aiohttp.ClientSession(connector=connector, trust_env=False,
                                     timeout=aiohttp.ClientTimeout(total=TIMEOUT))

    async def _post(self, url: str, sweep: SweepRecord, event: str) -> None:
        doc = await self._document(sweep, event)
        try:
            host, _ = _target(url)
        except ValueError as exc:  # made before create checked it, by an older version
            log.warning("sweep %s: webhook %s not posted: %s", sweep.name, url, exc)
            return
        pause = FIRST_PAUSE
        for attempt in range(1, TRIES + 1):
            try:
                if local_addresses.parse(host) is not None:
                    _check(host, host, self.live.current.webhook_local_networks)
                async with self._session() as session, \
                        session.post(url, json=doc, headers={EVENT_HEADER: event},
                                     allow_redirects=False) as answer:
                    if 300 <= answer.status < 400:
                        log.warning("sweep %s: webhook %s answered %d to %s; redirects are "
                                    "not followed", sweep.name, url, answer.status, event)
                        return
                    if answer.status < 500 and answer.status not in (408, 429):
                        if answer.status >= 400:
                            log.warning("sweep %s: webhook %s answered %d to %s; not "
                                        "tried again", sweep.name, url, answer.status, event)
                        return
                    why = f"HTTP {answer.status}"
            except Refused as exc:
                log.warning("sweep %s: webhook %s refused for %s: %s", sweep.name, url,
                            event, exc)
                return
            except (aiohttp.ClientError, TimeoutError, OSError, UnicodeError) as exc:
                why = f"{type(exc).__name__}: {exc}"
            log.info("sweep %s: webhook %s (%s) try %d failed: %s", sweep.name, url, event,
                     attempt, why)
            if attempt < TRIES:
                await asyncio.sleep(pause)
                pause *= 2
        log.warning("sweep %s: webhook %s gave up on %s after %d tries", sweep.name, url,
                    event, TRIES)
