"""`noduslocal secret set|ls|rm`: your secrets, injected into jobs as environment variables
and masked as *** in their stored logs."""

from __future__ import annotations

import sys

import click

from noduslocal.cli import output
from noduslocal.cli.job import json_option
from noduslocal.sdk.api_client import ApiClient


@click.group()
def secret() -> None:
    """Your secrets (values are never shown again)."""


@secret.command("set")
@click.argument("name")
def set_(name: str) -> None:
    """Set NAME from standard input (prompted for, hidden, on a terminal)."""
    if sys.stdin.isatty():
        value = click.prompt(f"value of {name}", hide_input=True)
    else:
        value = sys.stdin.read()
        value = value[:-1] if value.endswith("\n") else value
    if not value:
        raise click.UsageError("the value is empty; pipe it in or type it at the prompt")
    created = ApiClient().set_secret(name, value)
    click.echo(f"{name}: {'created' if created else 'replaced'}")


@secret.command("ls")
@json_option
def ls(as_json: bool) -> None:
    """List your secrets' names."""
    rows = ApiClient().list_secrets()
    if as_json:
        output.print_json(rows)
        return
    output.print_table(("NAME", "UPDATED"), [(r["name"], r["updated_at"]) for r in rows])


@secret.command("rm")
@click.argument("name")
def rm(name: str) -> None:
    """Remove NAME (jobs created before keep the value they were given)."""
    ApiClient().delete_secret(name)
    click.echo(f"{name}: removed")
