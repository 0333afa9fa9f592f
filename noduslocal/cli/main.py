"""The `noduslocal` command: the click group, and one place that turns API errors into a
one-line message and the exit code errors.py gives them."""

from __future__ import annotations

import click

from noduslocal import errors
from noduslocal.cli.daemon import daemon
from noduslocal.cli.files import download, ls
from noduslocal.cli.gpus import gpus
from noduslocal.cli.job import job
from noduslocal.cli.job_control import kill  # noqa: F401 (registers kill, suspend, resume, exec)
from noduslocal.cli.outputs import download_output, outputs
from noduslocal.cli.queue import queue
from noduslocal.cli.secrets import secret
from noduslocal.cli.volumes import volume


class Root(click.Group):
    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except errors.NodusError as exc:
            click.echo(f"noduslocal: {exc.message}", err=True)
            ctx.exit(exc.cli_exit)


@click.group(cls=Root, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="noduslocal")
def cli() -> None:
    """noduslocal: one shared multi-GPU workstation as a durable job runner."""


cli.add_command(daemon)
cli.add_command(job)
job.add_command(outputs)
job.add_command(download_output)
cli.add_command(ls)
cli.add_command(download)
cli.add_command(secret)
cli.add_command(volume)
cli.add_command(gpus)
cli.add_command(queue)


def main() -> None:
    cli(prog_name="noduslocal")


if __name__ == "__main__":
    main()
