"""The whole `noduslocal job` group: submitting and reading (cli/job.py, its status in
cli/job_status.py), acting on a job (cli/job_control.py), and its outputs
(cli/outputs.py), assembled in one place."""

from __future__ import annotations

from noduslocal.cli import job_control
from noduslocal.cli.job import job
from noduslocal.cli.job_status import status
from noduslocal.cli.outputs import download_output, outputs

job.add_command(status)
job.add_command(outputs)
job.add_command(download_output)

__all__ = ["job", "job_control"]
