"""Shell completion (`noduslocal completion bash|zsh|fish`): the script a shell sources, on
click's completion protocol, and job and sweep names completed from the daemon (your own
and your projects', as `job list` shows them)."""

from __future__ import annotations

from typing import Any

import click
from click.shell_completion import CompletionItem, get_completion_class

PROG, VAR = "noduslocal", "_NODUSLOCAL_COMPLETE"
NAME_ARGUMENTS = ("name", "names")
LISTED = 500  # names offered at most (the newest)


@click.command("completion")
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
@click.pass_context
def completion(ctx: click.Context, shell: str) -> None:
    """Print the completion script for SHELL. In ~/.bashrc: eval "$(noduslocal completion
    bash)"; in ~/.zshrc: eval "$(noduslocal completion zsh)". Commands, options, and the
    names of your jobs and sweeps complete."""
    kind = get_completion_class(shell)
    assert kind is not None
    click.echo(kind(ctx.find_root().command, {}, PROG, VAR).source())


def attach(command: click.Command) -> click.Command:
    """Name arguments of COMMAND (and of its subcommands) complete from the daemon."""
    for param in command.params:
        if isinstance(param, click.Argument) and param.name in NAME_ARGUMENTS:
            # click keeps a parameter's completer here; set where the commands are loaded
            # (Root.get_command), so that no command module has to name it.
            param._custom_shell_complete = _names  # type: ignore[attr-defined]
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            attach(sub)
    return command


def _names(ctx: click.Context, param: click.Parameter, incomplete: str
           ) -> list[CompletionItem]:
    """Sweep names under `sweep ...`, job names elsewhere; nothing when the daemon is
    away (a completion must never print an error into the command line)."""
    from noduslocal.sdk.api_client import ApiClient

    del param
    project: Any = ctx.params.get("project")
    sweeps = ctx.parent is not None and ctx.parent.command.name == "sweep"
    try:
        client = ApiClient()
        if sweeps:
            names = [s["name"] for s in client.list_sweeps(project=project, all=True)]
        else:
            names = [j["name"] for j in client.list_jobs(project=project, all=True,
                                                         limit=LISTED)]
    except Exception:
        return []
    seen = dict.fromkeys(reversed(names))  # newest first, once each
    return [CompletionItem(name) for name in seen if name.startswith(incomplete)]
