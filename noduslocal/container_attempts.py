"""The container side of the supervisor: launching an attempt's container, adopting one
after a restart (waiting for dockerd when it is away), the queue's view of dockerd, and
removing ended containers whose end is committed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from noduslocal.models import AttemptRecord
from noduslocal.outcomes import Attempt
from noduslocal.runtime import container_spec
from noduslocal.runtime.attempts import Alive, AttemptState, NeverStarted
from noduslocal.runtime.containers import ContainerRuntime, DockerUnavailable, LaunchError
from noduslocal.states import AttemptPhase
from noduslocal.store import ops

ENDED = frozenset({AttemptPhase.EXITED, AttemptPhase.LOST, AttemptPhase.NOT_STARTED})

if TYPE_CHECKING:
    from noduslocal.config import Settings
    from noduslocal.gpu.model import Inventory
    from noduslocal.runtime.layout import JobLayout
    from noduslocal.scheduler.queue import Queue
    from noduslocal.store import Store

log = logging.getLogger(__name__)


class ContainerAttempts:
    settings: Settings
    store: Store
    layout: JobLayout
    queue: Queue
    containers: ContainerRuntime | None
    active: dict[int, Attempt]
    inventory: Inventory

    if TYPE_CHECKING:  # provided by the Supervisor (stubs here would shadow it)
        def gpu_env(self, uuids: list[str], in_container: bool) -> dict[str, str]: ...
        def _kick(self) -> None: ...
        def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None: ...
        async def _finish(self, attempt: Attempt, state: AttemptState,
                          running: asyncio.Future[Any] | None = None) -> None: ...
        async def _give_up(self, attempt: Attempt, message: str) -> None: ...
        async def _watch(self, attempt: Attempt, started_at: float,
                         running: asyncio.Future[Any] | None = None) -> None: ...
        async def _adopt(self, attempt: Attempt, last: AttemptRecord,
                         started_at: float | None = None) -> None: ...

    def docker_changed(self) -> None:
        """dockerd came or went: container jobs wait (with the reason as their hold) or
        may start again."""
        if self.containers is not None and self.containers.available:
            self.queue.blocked.pop("docker", None)
            self._kick()
            self._spawn(self._sweep_containers())
        else:
            why = self.containers.unavailable_reason if self.containers else "not configured"
            self.queue.blocked["docker"] = f"dockerd unreachable: {why}"

    async def _run_container(self, attempt: Attempt, secret_values: dict[str, str]) -> None:
        job = attempt.job
        assert self.containers is not None and job.spec.image is not None
        assert attempt.directory is not None
        simulated = self.inventory.simulated
        kwargs = container_spec.create_kwargs(
            self.settings, self.layout, self.containers.instance, job, attempt.number,
            secret_values, self.gpu_env(attempt.gpus, True),
            None if simulated else attempt.gpus)
        try:
            attempt.container_id, attempt.ended = await self.containers.launch(
                job.spec.image, kwargs, job.id, attempt.number, attempt.directory,
                sorted(set(secret_values.values())))
        except DockerUnavailable as exc:  # queued again, no retry spent
            await self._finish(attempt, NeverStarted(f"dockerd went away ({exc})"))
            return
        except LaunchError as exc:
            await self._give_up(attempt, str(exc))
            return
        attempt.running = True
        now = time.time()
        running = self.store.write(lambda c: ops.attempt_running(
            c, job.id, attempt.number, now, container_id=attempt.container_id))
        await self._watch(attempt, now, running)

    async def _reconcile_container(self, attempt: Attempt, last: AttemptRecord) -> None:
        job = attempt.job
        assert self.containers is not None and attempt.directory is not None
        try:
            secret_values = (await self.store.job_secret_values(job.id)
                             if job.spec.secrets else {})
            while True:
                try:
                    state, container_id, started, ended = await self.containers.adopt(
                        job.id, last.number, attempt.directory,
                        sorted(set(secret_values.values())), recorded_running=attempt.running,
                        stopping=attempt.stop_reason is not None)
                    break
                except DockerUnavailable:
                    await asyncio.sleep(1)  # adopt() waits for dockerd to be back
            if not isinstance(state, Alive):
                await self._finish(attempt, state)
                return
            assert container_id is not None and ended is not None
            log.info("adopting job %s attempt %d (container %s)", job.name, last.number,
                     container_id[:12])
            attempt.container_id = container_id
            attempt.ended = ended
            await self._adopt(attempt, last, started)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("reconciling job %s failed", job.name)
            await self._give_up(attempt, f"the daemon could not adopt it: {exc}")

    async def _sweep_containers(self) -> None:
        """Remove containers whose attempt's end is committed: ones whose removal failed
        (dockerd away), or whose daemon died between the commit and the removal."""
        containers = self.containers
        assert containers is not None
        try:
            # Running ones too: a container whose attempt was judged lost (dockerd
            # restarted) may live on under live-restore, and its job has moved on.
            found = await containers.call(lambda: containers.client.api.containers(
                all=True, filters=container_spec.job_filter(containers.instance)))
            for container in found:
                labels = container["Labels"]
                job_id = int(labels[f"{container_spec.LABEL}.job-id"])
                number = int(labels[f"{container_spec.LABEL}.attempt"])
                records = {a.number: a for a in await self.store.attempts(job_id)}
                record = records.get(number)
                if record is not None and record.phase in ENDED:
                    await containers.remove(container["Id"])
        except Exception:
            log.exception("removing ended containers failed")
