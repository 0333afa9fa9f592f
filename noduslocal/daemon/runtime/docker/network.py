"""A container gang's own docker network: made before its ranks, removed once the
attempt's end is committed, and swept after a restart like the containers; with the job's
`network="none"` it is internal (ranks reach each other, nothing else).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import docker

from noduslocal.daemon.runtime.docker import spec as container_spec
from noduslocal.daemon.runtime.docker.engine import DockerEngine, LaunchError
from noduslocal.daemon.runtime.docker.spec import LABEL
from noduslocal.domain.jobs import JobRecord

log = logging.getLogger(__name__)


class GangNetworks:
    def __init__(self, engine: DockerEngine) -> None:
        self.engine = engine

    def _labels(self, job: JobRecord, number: int) -> dict[str, str]:
        return {f"{LABEL}.instance": self.engine.instance, f"{LABEL}.job-id": str(job.id),
                f"{LABEL}.attempt": str(number), f"{LABEL}.owner": job.owner}

    def _find(self, job_id: int | None = None) -> list[dict[str, Any]]:
        wanted = [f"{LABEL}.instance={self.engine.instance}"]
        if job_id is not None:
            wanted.append(f"{LABEL}.job-id={job_id}")
        found: list[dict[str, Any]] = self.engine.client.api.networks(
            filters={"label": wanted})
        return found

    async def make(self, job: JobRecord, number: int) -> None:
        """The attempt's network, after removing what earlier attempts of the job left."""
        engine = self.engine
        for old in await engine.call(self._find, job.id):
            await self._remove(old["Id"])
        name = container_spec.network_name(engine.instance, job, number)
        try:
            await engine.call(lambda: engine.client.api.create_network(
                name, driver="bridge", internal=job.spec.network == "none",
                labels=self._labels(job, number), check_duplicate=True))
        except docker.errors.APIError as exc:
            raise LaunchError(f"creating the gang's network failed: {exc.explanation or exc}"
                              ) from None

    async def remove(self, job_id: int, number: int) -> None:
        for found in await self.engine.call(self._find, job_id):
            if found["Labels"].get(f"{LABEL}.attempt") == str(number):
                await self._remove(found["Id"])

    async def sweep(self, is_ended: Callable[[int, int], Awaitable[bool]]) -> None:
        """Remove networks whose attempt's end is committed (a removal that failed, or a
        daemon that died before it)."""
        for found in await self.engine.call(self._find):
            labels = found["Labels"]
            if await is_ended(int(labels[f"{LABEL}.job-id"]), int(labels[f"{LABEL}.attempt"])):
                await self._remove(found["Id"])

    async def _remove(self, network_id: str) -> None:
        try:
            await self.engine.call(lambda: self.engine.client.api.remove_network(network_id))
        except docker.errors.NotFound:
            pass
        except Exception as exc:  # still in use, or dockerd away: the next sweep tries again
            log.warning("removing network %s failed: %s", network_id[:12], exc)
