"""`noduslocal doctor`: one line per thing that must hold for the daemon to serve, OK or
what to do, and a non-zero exit when something is wrong. What only this side sees (the
socket, its mode and group, the groups and whether you are in them) is checked here; the
rest is the daemon's own view (GET /v1/doctor), and the database's full integrity check is
an admin's."""

from __future__ import annotations

import grp
import json
import os
import stat
from dataclasses import dataclass
from typing import Any

import click

from noduslocal.domain import errors
from noduslocal.sdk.api_client import ApiClient

# The daemon's defaults; a running daemon says the ones it was configured with.
USERS, ADMINS = "noduslocal", "noduslocal-admin"


@dataclass
class Check:
    name: str
    ok: bool | None  # None: not checked, or nothing to check (and why is in `detail`)
    detail: str


def socket_check(path: str, users: str) -> Check:
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return Check("socket", False, f"{path} does not exist: is the daemon (or "
                                      "noduslocal.socket) started?")
    except PermissionError:
        return Check("socket", False, f"{path}: its directory is closed to you")
    mode = stat.S_IMODE(info.st_mode)
    group = _group_name(info.st_gid)
    detail = f"{path} {mode:04o} {_user_name(info.st_uid)}:{group}"
    if info.st_uid == 0 and (mode & 0o006 or group != users or mode & 0o060 != 0o060):
        return Check("socket", False, f"{detail}: a shared daemon's socket is 0660 "
                                      f"root:{users} (check noduslocal.socket)")
    return Check("socket", True, detail)


def groups_check(users: str, admins: str) -> Check:
    missing = [name for name in (users, admins) if _gid(name) is None]
    if missing:
        return Check("groups", False, f"no group {', '.join(missing)}: run scripts/install.sh "
                                      "(or systemd-sysusers) to make them")
    mine = set(os.getgroups()) | {os.getgid()}
    if os.getuid() == 0:
        return Check("groups", True, f"{users} and {admins} exist; you are root")
    if _gid(users) not in mine:
        return Check("groups", False, f"you are not in {users}: an admin runs `usermod -aG "
                                      f"{users} {_user_name(os.getuid())}`, then log in again")
    if _gid(admins) in mine:
        return Check("groups", True, f"you are in {users} and {admins} (an admin)")
    return Check("groups", True, f"you are in {users}")


def _gid(name: str) -> int | None:
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        return None


def _group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def _user_name(uid: int) -> str:
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def sdk_check() -> Check:
    """Whether this user's own `python3` (first on their PATH) imports the SDK, and if not,
    how they install the client into their environment from the wheels install.sh left."""
    import shutil
    import subprocess
    import sys

    python = shutil.which("python3")
    wheels = os.path.join(sys.prefix, "wheels")
    how = (f"pip install --no-index --find-links {wheels} noduslocal" if os.path.isdir(wheels)
           else "pip install the noduslocal client into it (README: Installing it for a lab)")
    if python is None:
        return Check("your python", None, f"no python3 on your PATH; in your own venv or conda "
                                          f"env: {how}")
    try:
        # From /: `python -c` would find a noduslocal in the directory doctor ran in.
        found = subprocess.run([python, "-c", "import noduslocal; print(noduslocal.__version__)"],
                               capture_output=True, text=True, timeout=30, cwd="/")
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Check("your python", False, f"{python} does not run: {exc}")
    if found.returncode != 0:
        return Check("your python", None, f"{python} has no noduslocal SDK (`import noduslocal` "
                                          f"fails); to script jobs from it: {how}")
    return Check("your python", True, f"{python} imports noduslocal {found.stdout.strip()}")


def _checks(client: ApiClient) -> list[Check]:
    return [*_daemon_checks(client), sdk_check()]


def _daemon_checks(client: ApiClient) -> list[Check]:
    checks: list[Check] = []
    try:
        path = client.transport.socket_path
    except errors.DaemonUnavailable as exc:
        return [Check("daemon", False, exc.message)]
    try:
        info = client.transport.request("GET", "/v1/info", timeout=10)
    except errors.NodusError as exc:
        info, unreachable = None, exc.message
    groups = info["groups"] if info else {"users": USERS, "admins": ADMINS}
    if os.getuid() == 0 or not path.startswith(os.environ.get("XDG_RUNTIME_DIR") or "\0"):
        checks.append(socket_check(path, groups["users"]))  # a user's own is 0600, theirs
    if info is None:
        return [*checks, Check("daemon", False, unreachable)]
    checks.append(Check("daemon", True, f"noduslocald {info['version']} (pid {info['pid']}) "
                                        f"on {info['socket']}"))
    if not info["user_mode"]:
        checks.append(groups_check(groups["users"], groups["admins"]))
    found = client.transport.request("GET", "/v1/doctor", timeout=60)
    checks += [Check(c["name"], c["ok"], c["detail"]) for c in found["checks"]]
    health = client.transport.request("GET", "/v1/health", timeout=10)
    checks.append(Check("health", health["ok"],
                        "; ".join(health.get("problems", [])) or "serving, commits flowing"))
    if info["caller"]["admin"]:
        found = client.transport.request("GET", "/v1/admin/integrity", timeout=3600)
        checks.append(Check("database", found["ok"], "integrity_check: ok" if found["ok"] else
                            "; ".join(found["problems"]) + " (restore a `noduslocal admin "
                            "backup`, or `sqlite3 OLD .recover`; see docs/decisions.md)"))
    else:
        checks.append(Check("database", None, "not checked: the integrity check is for "
                                              "admins (root or the admin group)"))
    if "lost_jobs" in info:
        checks.append(lost_jobs_check(info["lost_jobs"], info["caller"]["admin"]))
    return checks


def _jobs(count: int) -> str:
    return f"{count} job" if count == 1 else f"{count} jobs"


def lost_jobs_check(lost: dict[str, Any], admin: bool) -> Check:
    """Job directories the database did not know at the daemon's start: it lost commits
    it had acknowledged. Everyone sees how many and their own; an admin each directory
    kept aside and how to restore it."""
    starts = lost.get("starts", 0)
    if not lost["found"] and not starts:
        if after_power_loss := lost.get("power_loss_starts", 0):
            return Check("lost jobs", True, (
                f"none; the machine had stopped while the daemon ran (a power loss or a "
                f"crash), and the starts of {_jobs(after_power_loss)} from its last second "
                "were put back from their directories"))
        return Check("lost jobs", True, "none: the database knew every job directory at the "
                                        "daemon's start")
    more = f", and the starts of {_jobs(starts)} it knows," if starts else ""
    parts = [f"the database had lost the records of {_jobs(lost['found'])}{more} at the "
             "daemon's start (a damaged or cut WAL: commits it had acknowledged are gone)"]
    if starts:
        parts.append("those starts were put back from the jobs' directories")
    if lost["recovered"]:
        parts.append(f"{lost['recovered']} were recovered from their directories (their "
                     "last event says 'recovered from its directory'; one that says 'run "
                     "it again' did not finish)")
    if lost["yours"]:
        parts.append(f"{'recovered' if admin else 'yours'}: {', '.join(lost['yours'])}")
    if lost["kept_aside"]:
        if admin:
            parts.append(
                f"{lost['kept_aside']} kept aside, unknown to the database: "
                f"{'; '.join(lost['kept_aside_paths'])}. To restore them: if a `noduslocal "
                "admin backup` newer than those jobs exists, stop the daemon and restore it; "
                "else copy what you need out of each directory (workspace/, attempt-N/"
                "output.log) and remove it (rm -rf DIR); see docs/admin.md, 'Lost jobs'")
        else:
            mine = lost["yours_kept_aside"]
            parts.append(f"{lost['kept_aside']} are kept aside ({mine} of them yours): an "
                         "admin restores them (`noduslocal doctor` as an admin lists them; "
                         "docs/admin.md, 'Lost jobs')")
    parts.append("look at the data dir's disk (dmesg) and take a fresh `noduslocal admin "
                 "backup`; restart the daemon to clear this once done" if admin else
                 "check your recent jobs (`noduslocal job list`) and tell an admin")
    return Check("lost jobs", False, "; ".join(parts))


@click.command("doctor")
@click.option("--json", "as_json", is_flag=True, help="print the checks as JSON")
def doctor(as_json: bool) -> None:
    """Check the socket, the groups, the daemon and what it needs (dockerd and the NVIDIA
    container runtime, NVML, disk, config, clock), its health and (admins) its database."""
    checks = _checks(ApiClient())
    if as_json:
        click.echo(json.dumps([c.__dict__ for c in checks], indent=2))
    else:
        for check in checks:
            mark = {True: "OK  ", False: "FAIL", None: "--  "}[check.ok]
            click.echo(f"{mark} {check.name}: {check.detail}")
    if any(check.ok is False for check in checks):
        raise click.exceptions.Exit(1)

