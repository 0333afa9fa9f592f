"""`noduslocal dashboard`: the box at a glance in a browser, as yourself: a server on
127.0.0.1 that asks the daemon with your own connection, signed in by a one-time link."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import webbrowser
from collections.abc import Coroutine
from typing import Any

import click

from noduslocal.domain.sockets import client_socket_candidates


def _socket() -> str:
    candidates = client_socket_candidates()
    return next((path for path in candidates if os.path.exists(path)), candidates[0])


@click.command()
@click.option("--port", type=click.IntRange(0, 65535), default=0, show_default=True,
              help="Port on 127.0.0.1 (0: any free one).")
@click.option("--no-browser", is_flag=True, help="Print the link only; open no browser.")
def dashboard(port: int, no_browser: bool) -> None:
    """Serve a dashboard of jobs, sweeps, GPUs and the queue on 127.0.0.1, until Ctrl-C.

    It talks to the daemon as you, so it shows what `noduslocal` shows you and lets you
    cancel only what you may. Open the printed link; it works once (it sets a cookie)."""
    from noduslocal.dashboard.server import serve

    def ready(link: str) -> None:
        click.echo(f"noduslocal dashboard for you at:\n\n    {link}\n")
        click.echo("The link signs in one browser, once; keep it to yourself. "
                   "Ctrl-C stops the dashboard.")
        if not no_browser:
            with contextlib.suppress(Exception):
                webbrowser.open(link)

    try:
        asyncio.run(_until_stopped(serve(_socket(), port, ready)))
        click.echo("\nnoduslocal dashboard stopped.")
    except OSError as exc:
        raise click.ClickException(
            f"cannot serve on 127.0.0.1:{port}: {exc.strerror or exc}") from None


async def _until_stopped(server: Coroutine[Any, Any, None]) -> None:
    """SERVER until Ctrl-C or SIGTERM (handled here: a shell that started us in the
    background may have left SIGINT ignored, which Python would keep)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    serving = asyncio.ensure_future(server)
    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait([serving, stopping], return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    if not serving.done():
        serving.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await serving  # its error (a port taken, no daemon), if it ended on its own
