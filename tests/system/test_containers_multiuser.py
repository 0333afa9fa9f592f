"""DESIGN §6 for container jobs, with real Unix users and real docker containers: a
container runs as its owner (uid, gid and groups) and writes her files; volumes, logs,
outputs and files of a container job are its owner's alone; a secret reaches the container
but never the API, the event stream or the stored log; nothing in the container can gain
privileges.

Reuses the users, the world-readable library copy and the daemon of test_multiuser (its
module-scoped `box` fixture makes a fresh set for this module). Needs root and dockerd
with the test images (scripts/build-test-images.sh); skipped otherwise, failed under CI.
"""

from __future__ import annotations

import grp
import hashlib
import json
import os
import pwd
import secrets
import stat
from pathlib import Path
from typing import Any

import pytest

from noduslocal.daemon.runtime.docker.spec import LABEL, instance_id, job_filter
from noduslocal.domain.states import Phase
from tests.conftest import BUSYBOX
from tests.system.test_multiuser import (
    ALICE,
    BOB,
    DEADLINE,
    SMALL,
    SOCKET_GROUP,
    SYSTEM_PYTHON,
    Box,
    assert_denied,
    box,
    cancel_quietly,
    wait_phase,
)

__all__ = ["box"]  # the fixture, imported so that pytest finds it in this module

pytestmark = [pytest.mark.root, pytest.mark.usefixtures("docker_client")]

# A job created through the SDK as another user; prints {"error", "message"} as JSON.
# argv = JSON keyword arguments of Job.create; with "wait" in argv[2], waits for the end.
SDK_CREATE = """\
import json, sys
import noduslocal as nodus
from noduslocal import errors
try:
    job = nodus.Job.create(**json.loads(sys.argv[1]))
    if sys.argv[2:] == ["wait"]:
        job.wait(timeout=60)
except errors.NodusError as exc:
    print(json.dumps({"error": type(exc).__name__, "message": exc.message}))
else:
    print(json.dumps({"error": None, "name": job.name}))
"""


def user_ids(name: str) -> tuple[int, int]:
    entry = pwd.getpwnam(name)
    return entry.pw_uid, entry.pw_gid


def sdk_create(box: Box, user: str, wait: bool = False, **kwargs: Any) -> dict[str, Any]:
    result = box.as_user(user, SYSTEM_PYTHON, "-c", SDK_CREATE, json.dumps(kwargs),
                         *(["wait"] if wait else []))
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout)


def run_container(box: Box, user: str, *args: str) -> Any:
    """`noduslocal job run --image BUSYBOX --cpu SMALL ARGS...` as USER."""
    return box.cli(user, "job", "run", "--image", BUSYBOX, "--cpu", SMALL, *args)


def job_dir_with(box: Box, marker: str) -> Path:
    """The host directory (jobs/<id>) of the one job whose workspace holds MARKER."""
    found = list(box.daemon.data_dir.glob(f"jobs/*/workspace/{marker}"))
    assert len(found) == 1, found
    return found[0].parent.parent


def last_attempt_dir(box: Box, job_dir: Path, name: str) -> Path:
    """jobs/<id>/attempt-N of the job's latest attempt (an attempt that never started, say
    while dockerd was away, leaves no log; the job then runs as attempt 2)."""
    number = box.cli_json(ALICE, "job", "status", name, "--json")["attempts"]
    return job_dir / f"attempt-{number}"


def our_containers(box: Box, docker_client: Any) -> list[Any]:
    return docker_client.containers.list(
        all=True, filters=job_filter(instance_id(box.daemon.data_dir)))


# --- 1. identity and file ownership -----------------------------------------------------


def test_container_runs_as_the_submitter_and_her_files_are_hers(box: Box) -> None:
    uid, gid = user_ids(ALICE)
    run = run_container(box, ALICE, "--name", "c-alice-id", "--checkpoint", "/ckpt", "--",
                        "sh", "-c",
                        "id -u; id -g; id -G | tr ' ' ,; pwd; "
                        "echo made > made-by-alice.txt; mkdir sub && echo deep > sub/f.txt; "
                        'echo state > "$NODUS_CHECKPOINT_DIR/state"')
    assert run.returncode == 0, run.stdout + run.stderr
    inside_uid, inside_gid, groups, cwd = run.stdout.split()
    assert (inside_uid, inside_gid) == (str(uid), str(gid))
    assert {int(g) for g in groups.split(",")} == set(os.getgrouplist(ALICE, gid))
    assert grp.getgrnam(SOCKET_GROUP).gr_gid in {int(g) for g in groups.split(",")}
    assert cwd == "/workspace"

    doc = box.cli_json(ALICE, "job", "status", "c-alice-id", "--json")
    assert (doc["owner"], doc["uid"], doc["phase"]) == (ALICE, uid, Phase.SUCCEEDED)
    assert doc["spec"]["image"] == BUSYBOX

    job_dir = job_dir_with(box, "made-by-alice.txt")
    assert job_dir.parent == box.daemon.data_dir / "jobs"
    workspace = job_dir / "workspace"
    st = workspace.stat()
    assert (st.st_uid, st.st_gid) == (uid, gid)
    assert stat.S_IMODE(st.st_mode) & 0o077 == 0, oct(st.st_mode)
    for path in (workspace / "made-by-alice.txt", workspace / "sub",
                 workspace / "sub" / "f.txt", job_dir / "checkpoint",
                 job_dir / "checkpoint" / "state"):
        st = path.stat()
        assert (st.st_uid, st.st_gid) == (uid, gid), f"{path}: {st.st_uid}:{st.st_gid}"
    assert (workspace / "made-by-alice.txt").read_text() == "made\n"
    assert (job_dir / "checkpoint" / "state").read_text() == "state\n"
    # Written as alice, so bob's account cannot read them on the host either.
    assert box.as_user(BOB, "cat", str(workspace / "made-by-alice.txt")).returncode != 0
    assert box.as_user(BOB, "ls", str(job_dir / "checkpoint")).returncode != 0


# --- 2. volumes, logs, outputs and files belong to the owner -------------------------------


def test_other_user_gets_nothing_of_a_container_jobs_volume_logs_outputs_files(
        box: Box, docker_client: Any) -> None:
    uid, _ = user_ids(ALICE)
    made = box.cli(ALICE, "volume", "create", "c-alice-vol")
    assert made.returncode == 0, made.stderr
    wrote = run_container(box, ALICE, "--name", "c-alice-data", "--volume", "c-alice-vol:/data",
                          "--output", "result=/workspace/result.txt", "--",
                          "sh", "-c", "echo in-volume > /data/v.txt; "
                          "echo in-output > /workspace/result.txt; echo in-log")
    assert (wrote.returncode, wrote.stdout) == (0, "in-log\n"), wrote.stderr
    volume_file = box.daemon.data_dir / "volumes" / "c-alice-vol" / "v.txt"
    assert volume_file.read_text() == "in-volume\n"
    assert volume_file.stat().st_uid == uid

    # Bob's container may not mount her volume: refused at creation, nothing made.
    jobs_before = sorted(p.name for p in (box.daemon.data_dir / "jobs").iterdir())
    refused = run_container(box, BOB, "--name", "c-bob-steal", "--volume", "c-alice-vol:/data",
                            "--", "cat", "/data/v.txt")
    # PermissionDenied exits 1 (errors.py), as the same refusal of a host job does in
    # test_multiuser; 2 is for invalid arguments.
    assert refused.returncode == 1, (refused.returncode, refused.stdout + refused.stderr)
    assert "Traceback" not in refused.stderr
    assert refused.stderr.count("\n") == 1, refused.stderr
    assert "c-alice-vol" in refused.stderr and f"belongs to {ALICE}" in refused.stderr
    assert "in-volume" not in refused.stdout + refused.stderr
    via_sdk = sdk_create(box, BOB, name="c-bob-steal-sdk", image=BUSYBOX, cpu=SMALL,
                         command=["cat", "/data/v.txt"], volumes={"/data": "c-alice-vol"})
    assert via_sdk["error"] == "PermissionDenied", via_sdk
    assert f"belongs to {ALICE}" in via_sdk["message"]
    listed = box.cli_json(BOB, "job", "list", "--all", "--json")
    assert not [j for j in listed if j["name"].startswith("c-bob-steal")], listed
    assert box.cli(BOB, "job", "status", "c-bob-steal").returncode != 0
    assert sorted(p.name for p in (box.daemon.data_dir / "jobs").iterdir()) == jobs_before
    assert not [c for c in our_containers(box, docker_client)
                if c.labels.get(f"{LABEL}.owner") == BOB]

    # Nor read the volume through the API.
    assert_denied(box.cli(BOB, "volume", "files", "c-alice-vol"))
    assert_denied(box.cli(BOB, "volume", "download", "c-alice-vol", "v.txt", "/tmp/nl-bob-cv"))
    assert not Path("/tmp/nl-bob-cv").exists()

    # Her container job: logs, outputs and files are hers (and an admin's) only.
    project = ["--project", ALICE]
    assert "log" in assert_denied(box.cli(BOB, "job", "logs", "c-alice-data", *project))
    assert_denied(box.cli(BOB, "job", "logs", "c-alice-data", "--follow", *project))
    assert_denied(box.cli(BOB, "job", "outputs", "c-alice-data", *project))
    assert_denied(box.cli(BOB, "job", "download-output", "c-alice-data", "result",
                          "/tmp/nl-bob-co", *project))
    assert_denied(box.cli(BOB, "ls", "c-alice-data", *project))
    assert_denied(box.cli(BOB, "download", "c-alice-data", "result.txt", "/tmp/nl-bob-cf",
                          *project))
    for loot in ("/tmp/nl-bob-co", "/tmp/nl-bob-cf"):
        assert not Path(loot).exists(), loot
    log = last_attempt_dir(box, job_dir_with(box, "result.txt"), "c-alice-data") / "output.log"
    assert log.read_text() == "in-log\n"
    assert box.as_user(BOB, "cat", str(log)).returncode != 0

    # The same requests succeed for her: the refusals above are about who asks.
    logs = box.cli(ALICE, "job", "logs", "c-alice-data")
    assert (logs.returncode, logs.stdout) == (0, "in-log\n"), logs.stderr
    outputs = box.cli_json(ALICE, "job", "outputs", "c-alice-data", "--json")
    assert [o["name"] for o in outputs] == ["result"]
    assert outputs[0]["sha256"] == hashlib.sha256(b"in-output\n").hexdigest()
    files = box.cli_json(ALICE, "ls", "c-alice-data", "--json")
    assert "result.txt" in [e["name"] for e in files]
    assert [e["name"] for e in box.cli_json(ALICE, "volume", "files", "c-alice-vol",
                                            "--json")] == ["v.txt"]


# --- 3. secrets ---------------------------------------------------------------------------


def test_container_secret_never_leaves_the_container_unmasked(box: Box) -> None:
    value = f"ctok-{secrets.token_hex(12)}"
    made = box.as_user(ALICE, SYSTEM_PYTHON, "-m", "noduslocal.cli", "secret", "set",
                       "C_TOKEN", input=value)
    assert made.returncode == 0, made.stderr
    ended = sdk_create(
        box, ALICE, wait=True, name="c-secret", image=BUSYBOX, cpu=SMALL, secrets=["C_TOKEN"],
        command=["sh", "-c",
                 'touch /workspace/c-secret.marker; echo "out=$C_TOKEN"; '
                 'echo "err=$C_TOKEN" >&2; printf %s "$C_TOKEN" | sha256sum'])
    assert ended == {"error": None, "name": "c-secret"}, ended
    leaks: list[str] = []

    def check(where: str, text: str) -> None:
        if value in text:
            leaks.append(where)

    # The value did reach the container (its hash is printed), and the log masks it.
    logs = box.cli(ALICE, "job", "logs", "c-secret")
    assert logs.returncode == 0, logs.stderr
    lines = logs.stdout.splitlines()
    assert "out=***" in lines and "err=***" in lines, logs.stdout
    assert f"{hashlib.sha256(value.encode()).hexdigest()}  -" in lines, logs.stdout
    check("job logs", logs.stdout)

    attempt_dir = last_attempt_dir(box, job_dir_with(box, "c-secret.marker"), "c-secret")
    stored = (attempt_dir / "output.log").read_text()
    assert "out=***" in stored.splitlines() and "err=***" in stored.splitlines(), stored
    check("output.log", stored)
    err_log = (attempt_dir / "stderr.log").read_text()
    assert err_log == "err=***\n"
    check("stderr.log", err_log)
    for path in sorted(attempt_dir.parent.glob("attempt-*/*")):  # whatever else is stored
        if path.is_file():
            check(str(path.relative_to(attempt_dir.parent)), path.read_text(errors="replace"))

    for user in (ALICE, BOB, "root"):
        status = box.cli(user, "job", "status", "c-secret", "--project", ALICE, "--json")
        assert status.returncode == 0, status.stderr
        assert json.loads(status.stdout)["phase"] == Phase.SUCCEEDED
        check(f"job status --json ({user})", status.stdout)
        listed = box.cli(user, "job", "list", "--all", "--json")
        assert listed.returncode == 0 and "c-secret" in listed.stdout, listed.stderr
        check(f"job list --json ({user})", listed.stdout)
    attempts = box.cli(ALICE, "job", "attempts", "c-secret", "--json")
    assert attempts.returncode == 0, attempts.stderr
    check("job attempts --json", attempts.stdout)
    secret_list = box.cli(ALICE, "secret", "ls", "--json")
    assert secret_list.returncode == 0 and "C_TOKEN" in secret_list.stdout
    check("secret ls --json", secret_list.stdout)

    # The event stream, as the root SDK client and as each user over raw HTTP.
    events = b"".join(box.daemon.client().events()).decode()
    assert "c-secret" in events and Phase.SUCCEEDED in events
    check("/v1/events (root client)", events)
    for user in (ALICE, BOB):
        code, body = box.raw(user, "GET", "/v1/events?job=c-secret&project=" + ALICE)
        assert code == 200, body
        assert "c-secret" in json.dumps(body)
        check(f"/v1/events ({user})", json.dumps(body))
    check("daemon.log", box.daemon.log())
    assert leaks == [], f"secret value leaked into: {leaks}"


# --- 4. no privileges ---------------------------------------------------------------------


def test_container_job_cannot_gain_privileges(box: Box, docker_client: Any) -> None:
    uid, gid = user_ids(ALICE)
    run = run_container(box, ALICE, "--", "sh", "-c",
                        "grep -E '^(Cap|NoNewPrivs|Uid|Gid)' /proc/self/status; "
                        "chown 0:0 /workspace 2>/dev/null && echo chown-worked; "
                        "touch /etc/escalated 2>/dev/null && echo root-fs-writable; true")
    assert run.returncode == 0, run.stdout + run.stderr
    fields = dict(line.split(":", 1) for line in run.stdout.splitlines() if ":" in line)
    fields = {k: v.strip() for k, v in fields.items()}
    for cap in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert fields.get(cap) == "0000000000000000", (cap, run.stdout)
    assert fields.get("NoNewPrivs") == "1", run.stdout
    assert fields["Uid"].split() == [str(uid)] * 4
    assert fields["Gid"].split() == [str(gid)] * 4
    assert "chown-worked" not in run.stdout
    assert "root-fs-writable" not in run.stdout

    # The container itself, while it runs: no privileged mode, host network or docker socket.
    created = box.cli_json(ALICE, "job", "run", "--image", BUSYBOX, "--cpu", SMALL, "--detach",
                           "--json", "--name", "c-alice-sleep", "--", "sleep", "30")
    root = box.daemon.client()
    try:
        wait_phase(root, created["name"], ALICE, {Phase.RUNNING})
        mine = [c for c in our_containers(box, docker_client)
                if c.labels.get(f"{LABEL}.job") == "c-alice-sleep"]
        assert len(mine) == 1, mine
        attrs = mine[0].attrs
        host = attrs["HostConfig"]
        assert attrs["Config"]["User"] == f"{uid}:{gid}"
        assert host["Privileged"] is False
        assert host["CapDrop"] == ["ALL"] and not host.get("CapAdd")
        assert "no-new-privileges" in (host.get("SecurityOpt") or [])
        assert host["NetworkMode"] != "host" and host.get("PidMode") in ("", None)
        assert host.get("IpcMode") != "host" and host.get("UsernsMode") in ("", None)
        assert not host.get("Devices")
        sources = [m["Source"] for m in attrs["Mounts"]]
        assert sources and all(Path(s).is_relative_to(box.daemon.data_dir) for s in sources), \
            sources
    finally:
        cancel_quietly(root, created["name"], ALICE)
    assert root.wait_job(created["name"], ALICE, DEADLINE)["phase"] == Phase.CANCELLED
