"""`noduslocal profiles`: the daemon's named presets of Job.create arguments, which
`job run --profile NAME` (and `profile=` in the SDK) takes for every argument left unset."""

from __future__ import annotations

import json

import click

from noduslocal.cli.job import json_option
from noduslocal.sdk.api_client import ApiClient


@click.command("profiles")
@json_option
def profiles(as_json: bool) -> None:
    """List the daemon's profiles and what each sets."""
    found = ApiClient().transport.request("GET", "/v1/profiles")["profiles"]
    if as_json:
        click.echo(json.dumps(found, indent=2))
        return
    if not found:
        click.echo("no profiles; an admin adds [profiles.NAME] tables to the daemon's config")
        return
    for name in sorted(found):
        values = ", ".join(f"{key}={json.dumps(value)}" for key, value in
                           sorted(found[name].items()))
        click.echo(f"{name}: {values}")
