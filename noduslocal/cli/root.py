"""The `noduslocal` command under click: the group, and one place that turns API errors into a
one-line message and the exit code errors.py gives them."""

from __future__ import annotations

import importlib
import os
import sys

import click

from noduslocal.domain import errors

# Each command's module is imported only when that command runs: `job run` is on the
# submit path, and the others' imports cost it milliseconds (measured: 16 -> 21 ms).
COMMANDS = {
    "admin": "noduslocal.cli.admin:admin",
    "completion": "noduslocal.cli.completion:completion",
    "daemon": "noduslocal.cli.daemon:daemon",
    "dashboard": "noduslocal.cli.dashboard:dashboard",
    "doctor": "noduslocal.cli.doctor:doctor",
    "du": "noduslocal.cli.retention:du",
    "gc": "noduslocal.cli.retention:gc",
    "events": "noduslocal.cli.events:events",
    "job": "noduslocal.cli.jobs:job",
    "ls": "noduslocal.cli.files:ls",
    "download": "noduslocal.cli.files:download",
    "secret": "noduslocal.cli.secrets:secret",
    "volume": "noduslocal.cli.volumes:volume",
    "gpus": "noduslocal.cli.gpus:gpus",
    "profiles": "noduslocal.cli.profiles:profiles",
    "regions": "noduslocal.cli.regions:regions",
    "queue": "noduslocal.cli.queue:queue",
    "map": "noduslocal.cli.map:map_",
    "sweeps": "noduslocal.cli.sweeps:sweeps",
    "sweep": "noduslocal.cli.sweeps:sweep",
    "help": "noduslocal.cli.root:help_",
}


class Root(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        module, _, attr = target.partition(":")
        command: click.Command = getattr(importlib.import_module(module), attr)
        from noduslocal.cli.completion import attach

        return attach(command)

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


@click.command("help")
@click.argument("topic", required=False)
@click.pass_context
def help_(ctx: click.Context, topic: str | None) -> None:
    """Help on a command: `noduslocal help map` prints map's argument grammar."""
    root = ctx.find_root()
    command = cli.get_command(root, topic) if topic else cli
    if command is None:
        raise click.UsageError(f"no command {topic!r}; try `noduslocal --help`")
    with click.Context(command, info_name=topic or "noduslocal", parent=root) as sub:
        click.echo(command.get_help(sub))


def usage_message(exc: click.UsageError) -> str:
    """One style for every refusal, click's own included: `noduslocal: --flag: what`."""
    if isinstance(exc, click.BadParameter):
        hint = exc.param_hint or (exc.param.opts[0] if exc.param is not None
                                  and getattr(exc.param, "opts", None) else None)
        if isinstance(hint, list | tuple):
            hint = hint[0]
        message = exc.message
        name = (exc.param.name or "") if exc.param is not None else (hint or "").lstrip("-")
        for prefix in {f"{name}: ", f"{name.replace('-', '_')}: ", f"{name.replace('_', '-')}: "}:
            if name and message.startswith(prefix):  # our own one-liners name the field
                message = message[len(prefix):]
        return f"{hint}: {message}" if hint else message
    return exc.format_message()


def main() -> None:
    try:
        code = cli.main(prog_name="noduslocal", standalone_mode=False)
    except click.UsageError as exc:
        where = f" (see `{exc.ctx.command_path} --help`)" if exc.ctx is not None else ""
        click.echo(f"noduslocal: {usage_message(exc)}{where}", err=True)
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        click.echo(f"noduslocal: {exc.format_message()}", err=True)
        sys.exit(exc.exit_code)
    except click.Abort:
        click.echo("", err=True)
        sys.exit(130)
    except BrokenPipeError:
        # `| head` stopped reading: quietly, as a tool killed by SIGPIPE, with no traceback
        # (nor another one as the interpreter flushes stdout on its way out).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(141)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
