"""`noduslocal doctor`: one line per thing that must hold for the daemon to serve, OK or
what to do, and a non-zero exit when something is wrong. The database's full integrity
check is an admin's (the daemon runs it on its own connection)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import click

from noduslocal import errors
from noduslocal.client.api import Client


@dataclass
class Check:
    name: str
    ok: bool | None  # None: not checked (and why is in `detail`)
    detail: str


def _checks(client: Client) -> list[Check]:
    checks = []
    try:
        info = client.transport.request("GET", "/v1/info", timeout=10)
    except errors.NodusError as exc:
        return [Check("daemon", False, exc.message)]
    checks.append(Check("daemon", True, f"noduslocald {info['version']} (pid {info['pid']}) "
                                        f"on {info['socket']}"))
    checks.append(_config_check(info.get("config")))
    health = client.transport.request("GET", "/v1/health", timeout=10)
    checks.append(Check("health", health["ok"],
                        "; ".join(health.get("problems", [])) or "serving, disk has room"))
    if info["caller"]["admin"]:
        found = client.transport.request("GET", "/v1/admin/integrity", timeout=3600)
        checks.append(Check("database", found["ok"], "integrity_check: ok" if found["ok"] else
                            "; ".join(found["problems"]) + " (restore a `noduslocal admin "
                            "backup`, or `sqlite3 OLD .recover`; see docs/decisions.md)"))
    else:
        checks.append(Check("database", None, "not checked: the integrity check is for "
                                              "admins (root or the admin group)"))
    orphans = info.get("orphans", [])
    if orphans:
        names = ", ".join(str(o.get("path", o)) for o in orphans[:5])
        checks.append(Check("orphans", False, f"{len(orphans)} job directories the database "
                                              f"does not know: {names} (their processes "
                                              "were killed; look, then remove them)"))
    return checks


def _config_check(config: dict[str, Any] | None) -> Check:
    if config is None:
        return Check("config", None, "not followed by this daemon")
    if config["error"]:
        return Check("config", False, f"{config['error']}; the daemon keeps the settings it "
                                      "had: fix the file (it is read again when saved)")
    detail = f"{config['path']}: in force"
    if config["restart_pending"]:
        detail += (f"; {', '.join(config['restart_pending'])} changed and take effect when "
                   "the daemon restarts (systemctl restart noduslocal)")
    return Check("config", True, detail)


@click.command("doctor")
@click.option("--json", "as_json", is_flag=True, help="print the checks as JSON")
def doctor(as_json: bool) -> None:
    """Check the daemon: that it answers, its health (disk, commits), the integrity of its
    database (admins), job directories it does not know."""
    checks = _checks(Client())
    if as_json:
        click.echo(json.dumps([c.__dict__ for c in checks], indent=2))
    else:
        for check in checks:
            mark = {True: "OK  ", False: "FAIL", None: "--  "}[check.ok]
            click.echo(f"{mark} {check.name}: {check.detail}")
    if any(check.ok is False for check in checks):
        raise click.exceptions.Exit(1)
