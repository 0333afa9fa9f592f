"""DESIGN §6 with real Unix users: identity comes from SO_PEERCRED, everyone may list, only
the owner or an admin may read logs or cancel, and jobs run as their owner.

The module creates two users (nlalice, nlbob, in the socket group `noduslocal`), starts one
noduslocald as root, and runs the CLI as each user through `runuser`. The default python3
lives under /root (mode 0700), so the users run Debian's /usr/bin/python3 on a world-readable
copy of the `noduslocal` and `click` packages. Needs root; skipped otherwise, except under
CI (the CI variable set), where not being root is a failure.

Job commands are absolute paths (/bin/sh) except in the one test of the PATH lookup, which
is a known bug when the daemon's interpreter is private (see that test).
"""

from __future__ import annotations

import contextlib
import grp
import os
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from noduslocal import testing
from noduslocal.daemon.files.layout import JobLayout
from noduslocal.domain.sockets import SOCKET_ENV
from noduslocal.domain.states import TERMINAL, Phase
from noduslocal.sdk.api_client import ApiClient
from noduslocal.testing import wait_until
from tests.system.lab import (
    ADMIN_GROUP,
    ALICE,
    BOB,
    DEADLINE,
    SOCKET_GROUP,
    SYSTEM_PYTHON,
    Box,
    group_exists,
    open_box,
    open_up,
    run,
    user_exists,
)

pytestmark = pytest.mark.root

SMALL = "100m"  # CPU request of every test job, so that they all fit at once


@pytest.fixture(scope="module")
def box() -> Iterator[Box]:
    with open_box() as opened:
        yield opened


# --- helpers ----------------------------------------------------------------------------


def wait_phase(client: ApiClient, name: str, project: str, phases: set[str],
               timeout: float = DEADLINE) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        job = client.get_job(name, project)
        if job["phase"] in phases:
            return job
        if job["phase"] in TERMINAL or time.monotonic() > deadline:
            raise AssertionError(f"job {project}/{name} is {job['phase']}, wanted {phases}: "
                                 f"{job}")
        time.sleep(0.05)


def submit_sleep(client: ApiClient, name: str, project: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"name": name, "command": ["sleep", "60"], "cpu": SMALL}
    if project is not None:
        body["project"] = project
    job = client.create_job(body)
    return wait_phase(client, name, job["project"], {Phase.RUNNING})


def assert_denied(result: subprocess.CompletedProcess[str]) -> str:
    """A non-zero exit with exactly one line saying who may not do what."""
    assert result.returncode != 0, result.stdout
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "may not" in lines[0], lines[0]
    assert result.stdout == ""
    return lines[0]


def cancel_quietly(client: ApiClient, name: str, project: str) -> None:
    with contextlib.suppress(Exception):
        client.cancel_job(name, project)


# --- the socket -------------------------------------------------------------------------


def test_socket_belongs_to_the_socket_group(box: Box) -> None:
    st = box.daemon.socket.stat()
    assert stat.S_ISSOCK(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o660
    assert st.st_uid == 0
    assert st.st_gid == grp.getgrnam(SOCKET_GROUP).gr_gid


def test_a_user_outside_the_socket_group_is_told_which_group_lets_them_in(
        box: Box) -> None:
    """The socket refuses whoever is not in its group (EACCES): the CLI says so in one
    line naming the group and the command that adds them, where it printed a traceback."""
    env = ["PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/nonexistent", "LANG=C.UTF-8",
           f"{SOCKET_ENV}={box.daemon.socket}", f"PYTHONPATH={box.lib}",
           "PYTHONDONTWRITEBYTECODE=1"]
    for args in (["job", "list"], ["job", "run", "--detach", "--", "true"], ["ls", "x"]):
        seen = subprocess.run(["runuser", "-u", "nobody", "--", "env", "-i", *env,
                               SYSTEM_PYTHON, "-m", "noduslocal.cli", *args],
                              capture_output=True, text=True, timeout=60, cwd=box.lib)
        assert seen.returncode == 1, (args, seen.stderr)
        assert seen.stderr == (
            f"noduslocal: permission denied on {box.daemon.socket}: this daemon's users are "
            f"the members of the group {SOCKET_GROUP}; ask its admin to add you (usermod "
            f"-aG {SOCKET_GROUP} nobody), then log in again\n"), (args, seen.stderr)
    # A member whose session began before they joined (here: started without the group).
    stale = subprocess.run(["setpriv", f"--reuid={box.alice.uid}", f"--regid={box.alice.gid}",
                            "--clear-groups", "--", "env", "-i", *env, SYSTEM_PYTHON, "-m",
                            "noduslocal.cli", "job", "list"],
                           capture_output=True, text=True, timeout=60, cwd=box.lib)
    assert stale.returncode == 1 and stale.stderr == (
        f"noduslocal: permission denied on {box.daemon.socket}: you were added to its group "
        f"{SOCKET_GROUP} after this session began; log in again (or run `newgrp "
        f"{SOCKET_GROUP}`)\n"), stale.stderr


@pytest.mark.parametrize("who", [ALICE, BOB])
def test_identity_is_the_kernels_not_the_clients(box: Box, who: str) -> None:
    """/v1/info reports the caller from SO_PEERCRED; headers cannot change it."""
    user = box.user(who)
    status, body = box.raw(who, "GET", "/v1/info",
                           headers={"X-Remote-User": "root", "X-Nodus-User": "root",
                                    "Authorization": "Basic cm9vdDpyb290"})
    assert status == 200, body
    assert body["caller"] == {"uid": user.uid, "gid": user.gid, "name": who, "admin": False}


# --- a root job, seen by another user ------------------------------------------------------


def test_other_user_may_list_but_not_control_a_root_job(box: Box) -> None:
    root = box.daemon.client()
    submit_sleep(root, "root-sleep")
    try:
        denied = assert_denied(box.cli(BOB, "job", "kill", "root-sleep", "--project", "root"))
        assert BOB in denied and "cancel" in denied
        assert root.get_job("root-sleep", "root")["phase"] == Phase.RUNNING

        denied = assert_denied(box.cli(BOB, "job", "logs", "root-sleep", "--project", "root"))
        assert "log" in denied
        assert_denied(box.cli(BOB, "job", "logs", "root-sleep", "--project", "root",
                              "--follow"))
        assert root.get_job("root-sleep", "root")["phase"] == Phase.RUNNING

        listed = box.cli_json(BOB, "job", "list", "--json", "--all")
        mine = [j for j in listed if j["name"] == "root-sleep" and j["project"] == "root"]
        assert len(mine) == 1
        assert mine[0]["owner"] == "root" and mine[0]["uid"] == 0
        assert mine[0]["phase"] == Phase.RUNNING
        # Status is a listing too (like squeue): readable by everyone.
        doc = box.cli_json(BOB, "job", "status", "root-sleep", "--project", "root", "--json")
        assert doc["owner"] == "root"
    finally:
        cancel_quietly(root, "root-sleep", "root")
    assert root.wait_job("root-sleep", "root", DEADLINE)["phase"] == Phase.CANCELLED


# --- jobs run as their owner --------------------------------------------------------------


def test_job_runs_as_the_submitter(box: Box) -> None:
    alice = box.alice
    run = box.cli(ALICE, "job", "run", "--name", "alice-id", "--cpu", SMALL, "--",
                  "/bin/sh", "-c", "id -u; id -g")
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == [str(alice.uid), str(alice.gid)]

    doc = box.cli_json(ALICE, "job", "status", "alice-id", "--json")
    assert doc["owner"] == ALICE
    assert doc["uid"] == alice.uid
    assert doc["project"] == ALICE
    assert doc["phase"] == Phase.SUCCEEDED

    assert "may not" in assert_denied(
        box.cli(BOB, "job", "logs", "alice-id", "--project", ALICE))
    admin = box.cli("root", "job", "logs", "alice-id", "--project", ALICE)
    assert admin.returncode == 0, admin.stderr
    assert admin.stdout.split() == [str(alice.uid), str(alice.gid)]
    own = box.cli(ALICE, "job", "logs", "alice-id")
    assert own.returncode == 0, own.stderr
    assert own.stdout == admin.stdout


def test_job_gets_the_owners_groups_and_home(box: Box) -> None:
    alice = box.alice
    run = box.cli(ALICE, "job", "run", "--cpu", SMALL, "--",
                  "/bin/sh", "-c", 'id -G; echo "$HOME"; echo "$USER"')
    assert run.returncode == 0, run.stderr
    groups, home, user = run.stdout.splitlines()
    gids = {int(g) for g in groups.split()}
    assert gids == set(os.getgrouplist(ALICE, alice.gid))
    assert grp.getgrnam(SOCKET_GROUP).gr_gid in gids
    assert 0 not in gids  # nothing of root's groups leaks into the job
    assert home == alice.home
    assert user == ALICE


def test_command_is_found_on_path_for_another_user(box: Box) -> None:
    """`job run -- sh ...`, not /bin/sh: the PATH lookup happens as the job's user too."""
    alice = box.alice
    run = box.cli(ALICE, "job", "run", "--cpu", SMALL, "--", "sh", "-c", "id -u; id -g")
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.split() == [str(alice.uid), str(alice.gid)]


def test_other_user_cannot_cancel_but_admin_can(box: Box) -> None:
    root = box.daemon.client()
    created = box.cli_json(ALICE, "job", "run", "--name", "alice-sleep", "--cpu", SMALL,
                           "--detach", "--json", "--", "/bin/sleep", "60")
    assert created["owner"] == ALICE
    try:
        wait_phase(root, "alice-sleep", ALICE, {Phase.RUNNING})
        denied = assert_denied(box.cli(BOB, "job", "kill", "alice-sleep", "--project", ALICE))
        assert ALICE in denied
        assert root.get_job("alice-sleep", ALICE)["phase"] == Phase.RUNNING

        killed = box.cli("root", "job", "kill", "alice-sleep", "--project", ALICE, "--json")
        assert killed.returncode == 0, killed.stderr
        final = root.wait_job("alice-sleep", ALICE, DEADLINE)
        assert final["phase"] == Phase.CANCELLED
        assert final["owner"] == ALICE
    finally:
        cancel_quietly(root, "alice-sleep", ALICE)


# --- files ------------------------------------------------------------------------------


def test_workspace_is_private_to_its_owner(box: Box) -> None:
    alice = box.alice
    run = box.cli(ALICE, "job", "run", "--name", "alice-ws", "--cpu", SMALL, "--",
                  "/bin/sh", "-c", 'echo "$NODUS_WORKSPACE"; pwd; echo s3cret > secret.txt')
    assert run.returncode == 0, run.stderr
    # In its own mount namespace the job's workspace is /workspace, as in a container
    # (issue 25; it was the host's path, which it named and started in).
    assert run.stdout.splitlines() == ["/workspace", "/workspace"]
    layout = JobLayout(box.daemon.data_dir)
    (workspace,) = [layout.workspace(job_id) for job_id in layout.job_ids_on_disk()
                    if (layout.read_record(job_id) or {}).get("name") == "alice-ws"]

    st = workspace.stat()
    assert (st.st_uid, st.st_gid) == (alice.uid, alice.gid)
    assert stat.S_IMODE(st.st_mode) & 0o077 == 0, oct(st.st_mode)
    secret = workspace / "secret.txt"
    assert secret.stat().st_uid == alice.uid  # written by the job, as alice
    assert secret.read_text() == "s3cret\n"

    assert box.as_user(BOB, "ls", str(workspace)).returncode != 0
    assert box.as_user(BOB, "cat", str(secret)).returncode != 0
    # Nor through the API: the daemon reads workspaces as root, for their owners only.
    assert_denied(box.cli(BOB, "ls", "alice-ws", "--project", ALICE))
    assert_denied(box.cli(BOB, "download", "alice-ws", "secret.txt", "/tmp/nl-bob-loot",
                          "--project", ALICE))
    assert not Path("/tmp/nl-bob-loot").exists()
    listed = box.cli_json(ALICE, "ls", "alice-ws", "--json")
    assert [e["name"] for e in listed] == ["secret.txt"]
    # The log on disk is no back door around the API's check.
    log = workspace.parent / "attempt-1" / "output.log"
    assert log.exists()
    assert box.as_user(BOB, "cat", str(log)).returncode != 0
    assert box.as_user(ALICE, "cat", str(secret)).stdout == "s3cret\n"

    # Bob's jobs run as bob, so they cannot read it either, nor start inside it.
    peek = box.cli(BOB, "job", "run", "--cpu", SMALL, "--", "/bin/cat", str(secret))
    assert peek.returncode != 0
    assert "s3cret" not in peek.stdout + peek.stderr
    inside = box.cli(BOB, "job", "run", "--cpu", SMALL, "--workdir", str(workspace), "--",
                     "/bin/ls")
    assert inside.returncode != 0
    assert "secret.txt" not in inside.stdout
    assert "cannot enter workdir" in inside.stdout and "Permission denied" in inside.stdout


# --- nothing the client sends claims an identity -----------------------------------------


@pytest.mark.parametrize("field", ["uid", "gid", "owner", "owner_uid", "user"])
def test_create_rejects_identity_fields(box: Box, field: str) -> None:
    value: Any = 0 if "uid" in field or field == "gid" else "root"
    status, body = box.raw(BOB, "POST", "/v1/jobs",
                           {"command": ["id", "-u"], "cpu": SMALL, field: value})
    assert status == 400, body
    assert body["error"]["code"] == "InvalidArgument"
    assert body["error"]["field"] == field
    assert "unknown field" in body["error"]["message"]


def test_job_cannot_claim_another_identity(box: Box) -> None:
    """Env, labels, headers and a project named after root change nothing about who runs
    the job or owns it."""
    bob = box.bob
    root = box.daemon.client()
    status, body = box.raw(
        BOB, "POST", "/v1/jobs",
        {"name": "bob-env", "command": ["/bin/sh", "-c", 'id -u; echo "$FOO"'], "cpu": SMALL,
         "env": {"FOO": "bar"}, "labels": {"owner": "root", "uid": "0"}},
        headers={"X-Remote-User": "root", "X-Nodus-Uid": "0"})
    assert status == 201, body
    assert body["owner"] == BOB and body["uid"] == bob.uid
    assert body["labels"] == {"owner": "root", "uid": "0"}
    final = root.wait_job("bob-env", BOB, DEADLINE)
    assert final["phase"] == Phase.SUCCEEDED, final
    assert final["owner"] == BOB
    out = box.cli(BOB, "job", "logs", "bob-env")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(bob.uid), "bar"]

    # A project named after a user is that user's: bob may not take names in root's.
    squat = box.cli(BOB, "job", "run", "--project", "root", "--name", "bob-in-root",
                    "--cpu", SMALL, "--detach", "--", "/usr/bin/id", "-u")
    assert squat.returncode == 1
    assert "belongs to the user" in squat.stderr and len(squat.stderr.splitlines()) == 1
    # A job in a shared project is still bob's, and gives bob nothing of root's there.
    submit_sleep(root, "root-owned", "shared")
    try:
        created = box.cli_json(BOB, "job", "run", "--project", "shared", "--name",
                               "bob-in-shared", "--cpu", SMALL, "--label", "owner=root",
                               "--detach", "--json", "--", "/usr/bin/id", "-u")
        assert created["owner"] == BOB and created["uid"] == bob.uid
        assert created["project"] == "shared"
        final = root.wait_job("bob-in-shared", "shared", DEADLINE)
        assert final["owner"] == BOB and final["phase"] == Phase.SUCCEEDED
        logs = box.cli(BOB, "job", "logs", "bob-in-shared", "--project", "shared")
        assert logs.stdout.split() == [str(bob.uid)]
        assert_denied(box.cli(BOB, "job", "kill", "root-owned", "--project", "shared"))
        assert root.get_job("root-owned", "shared")["phase"] == Phase.RUNNING
    finally:
        cancel_quietly(root, "root-owned", "shared")


def test_env_values_are_hidden_from_other_users(box: Box) -> None:
    # --export NONE: only the one variable, so the assertions below name all of it.
    created = box.cli_json(ALICE, "job", "run", "--cpu", SMALL, "--env", "TOKEN=s3cret",
                           "--export", "NONE", "--detach", "--json", "--", "/bin/true")
    name = created["name"]
    assert created["spec"]["env"] == {"TOKEN": "s3cret"}  # the owner sees her own
    seen_by_bob = box.cli_json(BOB, "job", "status", name, "--project", ALICE, "--json")
    assert seen_by_bob["spec"]["env"] == {"TOKEN": "***"}
    listed = box.cli_json(BOB, "job", "list", "--all", "--json")
    others = [j for j in listed if j["owner"] != BOB]
    assert others and all(set(j["spec"]["env"].values()) <= {"***"} for j in others)
    root = box.daemon.client()
    assert root.get_job(name, ALICE)["spec"]["env"] == {"TOKEN": "s3cret"}  # an admin


def test_client_refuses_a_socket_served_by_another_user(box: Box, tmp_path: Path) -> None:
    """A socket on a path alice would trust (say /tmp/noduslocal-<uid>) but served by bob:
    her client must not send it a job, nor believe its answers."""
    trap_dir = Path(tempfile.mkdtemp(prefix="nl-trap-", dir="/tmp"))
    os.chmod(trap_dir, 0o777)
    trap = trap_dir / "api.sock"
    server = subprocess.Popen(
        ["runuser", "-u", BOB, "--", SYSTEM_PYTHON, "-c",
         "import socket, sys\n"
         "s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen()\n"
         "import os; os.chmod(sys.argv[1], 0o777)\n"
         "c, _ = s.accept(); c.recv(65536)\n"
         "c.sendall(b'HTTP/1.1 201 Created\\r\\nContent-Length: 2\\r\\n\\r\\n{}')\n",
         str(trap)])
    try:
        wait_until(trap.exists, "bob's fake socket")
        run = box.cli(ALICE, "job", "run", "--detach", "--env", "TOKEN=s3cret", "--",
                      "/bin/true", socket=trap)
        assert run.returncode == 1
        assert f"served by uid {box.bob.uid}" in run.stderr, run.stderr
    finally:
        server.kill()
        server.wait()
        shutil.rmtree(trap_dir, ignore_errors=True)


def test_secrets_are_per_user(box: Box) -> None:
    made = box.as_user(ALICE, SYSTEM_PYTHON, "-m", "noduslocal.cli", "secret", "set",
                       "ALICE_TOKEN", input="alice-only-value")
    assert made.returncode == 0, made.stderr
    assert box.cli_json(BOB, "secret", "ls", "--json") == []
    used = box.cli(BOB, "job", "run", "--cpu", SMALL, "--secret", "ALICE_TOKEN", "--",
                   "/bin/true")
    assert used.returncode == 2 and "no secret named 'ALICE_TOKEN'" in used.stderr
    mine = box.cli(ALICE, "job", "run", "--cpu", SMALL, "--secret", "ALICE_TOKEN", "--",
                   "/bin/sh", "-c", 'echo "got $ALICE_TOKEN"')
    assert (mine.returncode, mine.stdout) == (0, "got ***\n")


def test_exec_runs_as_the_owner_and_only_for_owner_or_admin(box: Box) -> None:
    created = box.cli_json(ALICE, "job", "run", "--cpu", SMALL, "--detach", "--json", "--",
                           "/bin/sleep", "60")
    name = created["name"]
    root = box.daemon.client()
    wait_phase(root, name, ALICE, {Phase.RUNNING})
    try:
        as_admin = root.exec_job(name, ALICE, ["id", "-u"])  # root asks; alice runs it
        assert as_admin["stdout"].split() == [str(box.alice.uid)], as_admin
        assert_denied(box.cli(BOB, "job", "exec", name, "--project", ALICE, "--", "id"))
        # Nor a terminal (`job exec -it`): the upgrade is refused before any is opened.
        status, body = box.raw(BOB, "GET", f"/v1/jobs/{name}/terminal?project={ALICE}",
                               headers={"Upgrade": "websocket", "Connection": "Upgrade",
                                        "Sec-WebSocket-Version": "13",
                                        "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="})
        assert status == 403 and "may not" in body["error"]["message"], (status, body)
        mine = box.cli(ALICE, "job", "exec", name, "--", "id", "-u")
        assert (mine.returncode, mine.stdout.split()) == (0, [str(box.alice.uid)])
    finally:
        cancel_quietly(root, name, ALICE)


def test_volumes_belong_to_their_creator(box: Box) -> None:
    assert box.cli(ALICE, "volume", "create", "alice-vol").returncode == 0
    wrote = box.cli(ALICE, "job", "run", "--cpu", SMALL, "--volume", "alice-vol", "--",
                    "/bin/sh", "-c", "echo mine > alice-vol/f.txt")
    assert wrote.returncode == 0, wrote.stderr
    mount = box.cli(BOB, "job", "run", "--cpu", SMALL, "--volume", "alice-vol", "--",
                    "/bin/true")
    assert mount.returncode == 1 and "belongs to nlalice" in mount.stderr
    assert_denied(box.cli(BOB, "volume", "files", "alice-vol"))
    assert_denied(box.cli(BOB, "volume", "download", "alice-vol", "f.txt", "/tmp/nl-bob-v"))
    assert_denied(box.cli(BOB, "volume", "rm", "alice-vol"))
    assert not Path("/tmp/nl-bob-v").exists()
    volume_dir = box.daemon.data_dir / "volumes" / "alice-vol"
    assert box.as_user(BOB, "ls", str(volume_dir)).returncode != 0
    assert (volume_dir / "f.txt").stat().st_uid == box.alice.uid
    assert box.cli(ALICE, "volume", "rm", "alice-vol").returncode == 0


def test_an_uploaded_source_becomes_the_owners_files(box: Box, tmp_path: Path) -> None:
    src = Path(tempfile.mkdtemp(prefix="nl-src-", dir="/tmp"))
    try:
        (src / "train.py").write_text("print('hi')\n")
        os.chmod(src, 0o755)
        os.chmod(src / "train.py", 0o644)
        run = box.cli(ALICE, "job", "run", "--cpu", SMALL, "--upload", str(src / "train.py"),
                      "--", "/usr/bin/stat", "-c", "%U %a", "train.py")
        assert run.returncode == 0, run.stderr
        assert run.stdout.split()[0] == ALICE
    finally:
        shutil.rmtree(src, ignore_errors=True)


def test_map_from_copies_a_workspace_as_its_owner_for_its_owner_only(box: Box) -> None:
    done = box.cli(ALICE, "job", "run", "--name", "prep", "--cpu", SMALL, "--", "sh", "-c",
                   "echo model > w.bin")
    assert done.returncode == 0, done.stderr
    assert_denied(box.cli(BOB, "map", "--from", "prep", "--project", ALICE, "--no-canary",
                          "--", "true", ":::", "a"))
    # A file alice may not read, put in her workspace by root: her tar cannot copy it,
    # where root's could.
    secret = next(box.daemon.data_dir.glob("jobs/*/workspace/w.bin")).parent / "root-only"
    secret.write_text("not alice's\n")
    os.chmod(secret, 0o600)
    refused = box.cli(ALICE, "map", "--from", "prep", "--no-canary", "--", "true", ":::", "a")
    assert refused.returncode == 1, refused.stdout
    assert "could not be copied" in refused.stderr and "Permission denied" in refused.stderr
    secret.unlink()
    forked = box.cli(ALICE, "map", "--from", "prep", "--name", "fork", "--no-canary", "--cpu",
                     SMALL, "--", "sh", "-c", "/usr/bin/stat -c %U w.bin", ":::", "x")
    assert forked.returncode == 0, forked.stderr
    final = box.daemon.client().wait_sweep("fork", ALICE, timeout=DEADLINE)
    log = box.cli(ALICE, "job", "logs", "fork-0")
    assert final["phase"] == "Succeeded", (final["message"], log.stdout, log.stderr)
    assert log.stdout.split() == [ALICE], log.stdout


def test_a_project_squatted_before_its_user_existed_never_resolves_implicitly(
        box: Box) -> None:
    late = "nlcarol"
    if user_exists(late):
        run("userdel", "-r", late, check=False)
    made = box.cli(ALICE, "job", "run", "--detach", "--name", "train", "--project", late,
                   "--cpu", SMALL, "--", "true")
    assert made.returncode == 0, made.stderr
    run("useradd", "-m", "-G", SOCKET_GROUP, late)
    try:
        env = ["PATH=/usr/local/bin:/usr/bin:/bin", f"HOME=/home/{late}", "LANG=C.UTF-8",
               f"{SOCKET_ENV}={box.daemon.socket}", f"PYTHONPATH={box.lib}"]
        seen = subprocess.run(["runuser", "-u", late, "--", "env", "-i", *env, SYSTEM_PYTHON,
                               "-m", "noduslocal.cli", "job", "status", "train"],
                              capture_output=True, text=True, timeout=DEADLINE, cwd=box.lib)
        assert seen.returncode != 0 and "Traceback" not in seen.stderr
        assert "is nlalice's (pass --project nlcarol to look at it)" in seen.stderr
        again = box.cli(ALICE, "job", "run", "--detach", "--name", "other", "--project",
                        late, "--cpu", SMALL, "--", "true")
        assert again.returncode != 0
        assert "belongs to the user of that name" in again.stderr
    finally:
        run("userdel", "-r", late, check=False)


# --- the admin group (last: it changes alice's groups) ------------------------------------


def test_admin_group_member_may_control_other_users_jobs(box: Box) -> None:
    made_admin_group = not group_exists(ADMIN_GROUP)
    if made_admin_group:
        run("groupadd", ADMIN_GROUP)
    fresh: testing.Daemon | None = None
    try:
        run("usermod", "-aG", ADMIN_GROUP, ALICE)
        # Group membership is cached per daemon process: a fresh daemon sees it.
        fresh = testing.Daemon(cpus=4, memory="8GiB")
        fresh.start()
        sock = fresh.socket
        status, body = box.raw(ALICE, "GET", "/v1/info", socket=sock)
        assert status == 200 and body["caller"]["admin"] is True, body
        status, body = box.raw(BOB, "GET", "/v1/info", socket=sock)
        assert status == 200 and body["caller"]["admin"] is False, body

        root = fresh.client()
        submit_sleep(root, "root-job")
        assert_denied(box.cli(BOB, "job", "kill", "root-job", "--project", "root",
                              socket=sock))
        logs = box.cli(ALICE, "job", "logs", "root-job", "--project", "root", socket=sock)
        assert logs.returncode == 0, logs.stderr
        killed = box.cli(ALICE, "job", "kill", "root-job", "--project", "root", "--json",
                         socket=sock)
        assert killed.returncode == 0, killed.stderr
        final = root.wait_job("root-job", "root", DEADLINE)
        assert final["phase"] == Phase.CANCELLED
        assert final["owner"] == "root"
    finally:
        if fresh is not None:
            fresh.close()
        run("gpasswd", "-d", ALICE, ADMIN_GROUP, check=False)
        if made_admin_group:
            run("groupdel", ADMIN_GROUP, check=False)


def test_disk_use_is_per_user_and_a_quota_refuses_only_its_user(box: Box) -> None:
    """Issue 13, item 4: `du` shows each user's own use to anyone; bob's quota refuses
    bob's new work and not alice's; only admins run the retention pass."""
    quotas = testing.Daemon(cpus=2, memory="4GiB",
                            config='gc_every = "7d"\n[user_disk_quotas]\nnlbob = "128KiB"\n')
    quotas.start()
    try:
        sock = quotas.socket
        for user in (ALICE, BOB):
            wrote = box.cli(user, "job", "run", "--cpu", SMALL, "--", "/bin/sh", "-c",
                            "head -c 300000 /dev/urandom > f", socket=sock)
            assert wrote.returncode == 0, wrote.stderr
        use = {u["user"]: u for u in box.cli_json(BOB, "du", "--json", socket=sock)["users"]}
        assert set(use) == {ALICE, BOB}
        assert use[ALICE]["uid"] == box.alice.uid and use[BOB]["uid"] == box.bob.uid
        assert use[ALICE]["workspaces"] >= 300_000 and use[BOB]["workspaces"] >= 300_000
        assert use[ALICE]["quota"] is None and use[BOB]["quota"] == 128 * 1024
        refused = box.cli(BOB, "job", "run", "--cpu", SMALL, "--", "/bin/true", socket=sock)
        assert refused.returncode != 0 and "disk quota: new jobs of nlbob" in refused.stderr
        assert box.cli(ALICE, "job", "run", "--cpu", SMALL, "--", "/bin/true",
                       socket=sock).returncode == 0
        assert_denied(box.cli(ALICE, "gc", "--dry-run", socket=sock))
        assert box.cli("root", "gc", "--dry-run", socket=sock).returncode == 0
    finally:
        quotas.close()


def test_another_users_host_job_writes_its_own_workspace(box: Box, tmp_path: Path) -> None:
    """Issue 25: /workspace is the job's workspace in its own mount namespace, for a job
    that runs as its owner too; nothing lands in the host's /workspace."""
    run = box.cli(ALICE, "job", "run", "--name", "alice-out", "--cpu", SMALL, "--",
                  "/bin/sh", "-c", "echo hi > /workspace/out.txt; id -u")
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == [str(box.alice.uid)]
    listed = box.cli_json(ALICE, "ls", "alice-out", "--json")
    assert [e["name"] for e in listed] == ["out.txt"]
    target = f"/tmp/nl-alice-out-{os.getpid()}"
    try:
        got = box.cli(ALICE, "download", "alice-out", "/workspace/out.txt", target)
        assert got.returncode == 0, got.stderr
        assert Path(target).read_text() == "hi\n"
    finally:
        Path(target).unlink(missing_ok=True)
    assert not Path("/workspace/out.txt").exists()
    assert not any(Path("/workspace").iterdir())


def test_another_users_volume_outside_the_workspace_and_exec_into_it(box: Box) -> None:
    mount = f"/nl-alice-results-{os.getpid()}"
    assert not Path(mount).exists()
    assert box.cli(ALICE, "volume", "create", "alice-res").returncode == 0
    created = box.cli_json(ALICE, "job", "run", "--cpu", SMALL, "--detach", "--json",
                           "--volume", f"alice-res:{mount}", "--", "/bin/sh", "-c",
                           f"echo mine > {mount}/f; echo ready; exec /bin/sleep 60")
    name = created["name"]
    root = box.daemon.client()
    try:
        wait_until(lambda: b"ready" in b"".join(root.logs(name, ALICE)), "the job",
                   timeout=DEADLINE)
        inside = box.cli(ALICE, "job", "exec", name, "--", "/bin/sh", "-c",
                         f"id -u; pwd; cat {mount}/f; grep NoNewPrivs /proc/self/status")
        assert inside.returncode == 0, inside.stderr
        # Its own mount over a host path: setuid programs grant nothing in there.
        assert inside.stdout.split() == [str(box.alice.uid), "/workspace", "mine",
                                         "NoNewPrivs:", "1"]
    finally:
        cancel_quietly(root, name, ALICE)
    assert not Path(mount).exists()
    volume = box.daemon.data_dir / "volumes" / "alice-res" / "f"
    assert volume.read_text() == "mine\n" and volume.stat().st_uid == box.alice.uid


def test_exec_into_a_job_runs_none_of_its_mounts_files_as_root(box: Box) -> None:
    """A volume over /usr/bin put the user's own `setpriv` and `env` where `job exec`, run
    as root in the job's namespace, took its tools from: the user's script ran as root.
    Found by review; exec now drops to the owner before it runs anything in there."""
    mount = "/usr/bin"
    assert box.cli(ALICE, "volume", "create", "alice-bin").returncode == 0
    tools = " ".join(f"/usr/bin/{t}" for t in ("sh", "dash", "sleep", "id", "cat"))
    fake = '#!/usr/bin/sh\n/usr/bin/id -u >> /usr/bin/ran-as; exec "$@"\n'
    fill = box.cli(ALICE, "job", "run", "--cpu", SMALL, "--volume", "alice-bin:/v", "--",
                   "/bin/sh", "-c", f"cp -L {tools} /v/ && for t in setpriv env nsenter; do "
                   f"printf '%s' '{fake}' > /v/$t; chmod 755 /v/$t; done")
    assert fill.returncode == 0, fill.stderr
    created = box.cli_json(ALICE, "job", "run", "--cpu", SMALL, "--detach", "--json",
                           "--volume", f"alice-bin:{mount}", "--", "/usr/bin/sh", "-c",
                           "echo ready; exec /usr/bin/sleep 60")
    name = created["name"]
    root = box.daemon.client()
    try:
        wait_until(lambda: b"ready" in b"".join(root.logs(name, ALICE)), "the job",
                   timeout=DEADLINE)
        inside = box.cli(ALICE, "job", "exec", name, "--", "/usr/bin/id", "-u")
        assert inside.returncode == 0, inside.stderr
        assert inside.stdout.split() == [str(box.alice.uid)]
    finally:
        cancel_quietly(root, name, ALICE)
    ran = box.daemon.data_dir / "volumes" / "alice-bin" / "ran-as"
    assert "0" not in (ran.read_text().split() if ran.exists() else []), ran.read_text()


def test_same_code_of_two_owners_gets_two_snapshots(box: Box) -> None:
    """Issue 25 part 1: alice's and bob's jobs of the same content share no snapshot (bob
    must never read alice's code through his); each task's code is its owner's, alice's job
    may rewrite it, and neither user can reach a snapshot outside a workspace."""
    code = Path(tempfile.mkdtemp(prefix="nl-code-", dir="/tmp"))
    (code / "train.py").write_text("print('v1')\n")
    open_up(code)
    before = {p.name for p in (box.daemon.data_dir / "snapshots").iterdir()}
    seen = {}
    for user in (ALICE, BOB):
        run = box.cli(user, "job", "run", "--cpu", SMALL, "--upload", str(code / "train.py"),
                      "--", "/bin/sh", "-c",
                      "stat -c %U train.py; echo v2 > train.py && cat train.py")
        assert run.returncode == 0, run.stderr
        seen[user] = run.stdout.split()
    assert seen == {ALICE: [ALICE, "v2"], BOB: [BOB, "v2"]}
    store = box.daemon.data_dir / "snapshots"
    made = {p.name for p in store.iterdir()} - before
    assert {name.split("-")[0] for name in made} == {str(box.alice.uid), str(box.bob.uid)}
    assert len({name.split("-", 1)[1] for name in made}) == 1  # the same content
    assert stat.S_IMODE(store.stat().st_mode) == 0o700 and store.stat().st_uid == 0
    for name in made:
        assert (store / name / "train.py").read_text() == "print('v1')\n"
    assert box.as_user(ALICE, "ls", str(store)).returncode != 0
    shutil.rmtree(code)
