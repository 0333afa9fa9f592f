"""`noduslocal job kill (or cancel)|suspend|resume|exec`: what an owner (or admin) does to a
job that exists, as opposed to submitting one or reading about it."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import click

from noduslocal.cli import output
from noduslocal.cli.job import job, json_option, project_option
from noduslocal.domain import errors
from noduslocal.domain.states import TERMINAL, Phase
from noduslocal.domain.units import parse_duration
from noduslocal.sdk.api_client import ApiClient


def _act(doc: dict[str, Any], as_json: bool, said: Callable[[dict[str, Any]], str]) -> None:
    if as_json:
        output.print_json(doc)
    else:
        click.echo(said(doc))


@job.command("kill")
@click.argument("name")
@project_option
@json_option
def kill(name: str, project: str | None, as_json: bool) -> None:
    """Cancel a job: SIGTERM to its process group, SIGKILL after the grace period."""
    _act(ApiClient().cancel_job(name, project), as_json, lambda doc: (
        output.summary(doc) if doc["phase"] in TERMINAL
        else f"{doc['name']}: stopping (SIGTERM sent; SIGKILL after the grace period)"))


# The reference's verb is `kill`; the API's word is `cancel`: a user may type either.
job.add_command(click.Command(
    "cancel", callback=kill.callback, params=kill.params,
    help="The same as `job kill` (cancel is the API's word): SIGTERM to the job's process "
         "group, SIGKILL after the grace period.",
    short_help="The same as `job kill`."))


@job.command("suspend")
@click.argument("name")
@project_option
@json_option
def suspend(name: str, project: str | None, as_json: bool) -> None:
    """Stop a job and keep it aside (workspace and checkpoint kept) until `job resume`."""
    _act(ApiClient().suspend_job(name, project), as_json, lambda doc: f"{doc['name']}: " + (
        "suspended" if doc["phase"] == Phase.SUSPENDED
        else "suspending (SIGTERM sent; SIGKILL after the grace)"))


@job.command("resume")
@click.argument("name")
@project_option
@json_option
def resume(name: str, project: str | None, as_json: bool) -> None:
    """Queue a suspended job again, at its old place."""
    _act(ApiClient().resume_job(name, project), as_json,
         lambda doc: f"{doc['name']}: queued again ({doc.get('hold') or doc['phase']})")


@job.command("exec")
@click.argument("name")
@project_option
@click.option("--timeout", default="5m", show_default=True, help="Kill it after this long.")
@click.option("--rank", type=click.IntRange(0), help="Beside this rank of a gang (default 0).")
@click.option("--index", type=click.IntRange(0), help="Beside this index of an indexed job.")
@click.option("-i", "--interactive", is_flag=True,
              help="Keep stdin open to it (with -t: a terminal session, `-it`).")
@click.option("-t", "--tty", is_flag=True,
              help="On a pseudo-terminal: a shell, Ctrl-C, window size (default command: "
                   "your login shell; no --timeout).")
@click.argument("command", nargs=-1)
def exec_(name: str, project: str | None, timeout: str, rank: int | None,
          index: int | None, interactive: bool, tty: bool, command: tuple[str, ...]) -> None:
    """Run COMMAND beside the running job NAME, as its owner, in its workdir:
    noduslocal job exec NAME [--project P] -- CMD ARGS...; with -it, interactively on a
    terminal (noduslocal job exec -it NAME [-- CMD], by default your login shell)."""
    argv = list(command[1:] if command[:1] == ("--",) else command)
    if interactive or tty:
        sys.exit(_interactive(name, project, argv, rank, index))
    try:
        seconds = parse_duration(timeout, "timeout")
    except errors.InvalidArgument as exc:
        raise click.BadParameter(exc.message, param_hint="--timeout") from None
    if not argv:
        raise click.UsageError("give the command to run after NAME (or use -it for a shell)")
    result = ApiClient().exec_job(name, project, argv, seconds, rank=rank, index=index)
    sys.stdout.write(result["stdout"])
    sys.stderr.write(result["stderr"])
    if result["truncated"]:
        click.echo("noduslocal: output truncated at 16 MiB", err=True)
    sys.exit(result["returncode"] if 0 <= result["returncode"] < 256 else 1)


def _interactive(name: str, project: str | None, argv: list[str], rank: int | None,
                 index: int | None) -> int:
    """`job exec -it`: this terminal put in raw mode and joined to one in the daemon (keys
    to it, its output here, the window's size followed), restored at the end; its exit
    status."""
    import os
    import signal
    import termios
    import threading
    import tty

    from noduslocal.sdk.terminal import TerminalProcess

    fd = sys.stdin.fileno()
    if not os.isatty(fd):
        raise click.UsageError("-it needs a terminal on stdin; without one, run the "
                               "command with `job exec NAME -- CMD`")
    size = os.get_terminal_size(fd)
    proc = TerminalProcess(ApiClient().transport.socket_path, name, project, argv or None,
                           rank, index, size.lines, size.columns)
    saved = termios.tcgetattr(fd)
    # The keys go out on a thread of their own, the SIGWINCH handler runs on this one when
    # it gets to it: keys typed right after a resize overtook it and met the old size.
    # So each send first follows the window's size, whichever thread sends.
    sent = [(size.lines, size.columns)]
    sizing = threading.RLock()  # the handler may interrupt this thread inside it

    def follow_size() -> None:
        try:
            now = os.get_terminal_size(fd)
        except OSError:  # the terminal went away: its keys end too, and nothing to follow
            return
        with sizing:
            if (now.lines, now.columns) != sent[0]:
                sent[0] = (now.lines, now.columns)
                proc.resize(now.lines, now.columns)

    def keys() -> None:
        while data := os.read(fd, 4096):
            follow_size()
            proc.stdin.write(data)

    def resized(*_: object) -> None:
        follow_size()

    try:
        tty.setraw(fd)
        signal.signal(signal.SIGWINCH, resized)
        threading.Thread(target=keys, name="keys", daemon=True).start()
        while data := proc.stdout.read1():
            os.write(sys.stdout.fileno(), data)
        return proc.wait()
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)
        signal.signal(signal.SIGWINCH, signal.SIG_DFL)
        proc.close()


@job.command("rm")
@click.argument("names", nargs=-1, required=True)
@project_option
def rm(names: tuple[str, ...], project: str | None) -> None:
    """Remove ended jobs: out of listings, their workspace and logs gone, their names free
    again (their cost stays in fair share)."""
    client = ApiClient()
    for name in names:
        client.remove_job(name, project)
        click.echo(f"{name}: removed")
