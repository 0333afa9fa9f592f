"""Creating a sweep: its plan checked against what this box and the user's limits can ever
give (each distinct GPU request of the grid once), then the sweep and every cell stored in
one transaction, and handed to the sweep controller.
"""

from __future__ import annotations

from dataclasses import replace

from noduslocal.daemon.jobs.admission import Admission, under_a_free_name
from noduslocal.daemon.store import Store, job_writes
from noduslocal.daemon.store import sweeps as sweep_ops
from noduslocal.daemon.sweeps.controller import SweepController
from noduslocal.domain.sweep_plan import Plan
from noduslocal.domain.sweeps import SweepRecord


class SweepAdmission:
    def __init__(self, store: Store, admission: Admission,
                 controller: SweepController) -> None:
        self.store = store
        self.admission = admission
        self.controller = controller

    def check(self, plan: Plan, owner: job_writes.Owner) -> None:
        template = plan.template
        for region in plan.cell_regions():
            for gpu in plan.gpus.values() or [template.spec.gpu]:
                self.admission.check(replace(template, spec=replace(
                    template.spec, gpu=gpu, region=region)), owner)

    async def create(self, plan: Plan, owner: job_writes.Owner, idempotency_key: str | None,
                     request_hash: str | None) -> tuple[SweepRecord, bool]:
        self.check(plan, owner)
        project = plan.project or owner.name
        cells = len(plan)
        template = plan.template.spec.to_wire()  # each cell's wire form is made from it
        created: sweep_ops.CreatedSweep = await under_a_free_name(
            self.store, plan.name, "sweep", lambda c, name, now: sweep_ops.insert_sweep(
                c, plan.template, plan.stored(), cells,
                lambda i: plan.cell_wire(i, name, template),
                plan.max_parallel, owner, name, project, now, idempotency_key, request_hash,
                plan.smoke_spec()))
        if created.created:
            first = created.first_job
            await self.controller.add(created.sweep, list(range(first, first + cells)))
        return created.sweep, created.created
