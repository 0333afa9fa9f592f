"""Gangs (`distributed` jobs) through a real daemon: ranks that find each other on the host,
per-rank env, GPUs, logs, status and exec, the first failing rank stopping the rest, fair
queueing of gangs, adoption after kill -9, Ray, and refusals. Gangs of containers:
tests/system/test_container_gangs.py.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import noduslocal as nodus
from noduslocal import testing
from noduslocal.domain import errors
from noduslocal.domain.states import TERMINAL
from noduslocal.sdk.api_client import ApiClient
from noduslocal.testing import wait_until
from tests.conftest import PYTHON_IMAGE, run_cli

FOUR_GPUS = 'simulate_gpus = "4xH100"\n'
PY = sys.executable
VENV_BIN = os.path.dirname(sys.executable)

# Rank 0 listens on MASTER_PORT and prints what rank 1 sends it; rank 1 connects to
# MASTER_ADDR:MASTER_PORT (rank 0 may not listen yet). Then both wait for the file named
# by $GATE, when that is set.
RENDEZVOUS = r'''
import os, socket, sys, time
addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
if os.environ["RANK"] == "0":
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((sys.argv[1], port))
    server.listen(1)
    conn, _ = server.accept()
    print("rank 0 got:", conn.recv(100).decode(), flush=True)
else:
    for _ in range(600):
        try:
            conn = socket.create_connection((addr, port), timeout=5)
            break
        except OSError:
            time.sleep(0.1)
    else:
        sys.exit("rank 1 never reached rank 0")
    conn.sendall(b"hello from rank " + os.environ["RANK"].encode())
    print("rank 1 sent", flush=True)
gate = os.environ.get("GATE")
while gate and not os.path.exists(gate):
    time.sleep(0.05)
'''
ENV_LINE = ('print("env", " ".join(f"{k}={os.environ.get(k)}" for k in ("RANK", "WORLD_SIZE", '
            '"LOCAL_RANK", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "NODUS_RANK", '
            '"NODUS_WORLD_SIZE", "NODUS_GANG", "CUDA_VISIBLE_DEVICES")), flush=True)\n')


def gang_daemon(config: str | None = FOUR_GPUS, **kwargs: Any) -> Any:
    return testing.daemon(config=config, **kwargs)


@pytest.fixture(scope="module")
def four_gpus() -> Iterator[testing.Daemon]:
    """A daemon with 4 simulated H100s, shared by the refusals (which make nothing)."""
    with gang_daemon() as d:
        yield d


def start_gated(c: ApiClient, name: str, gate: Path, gpu: str) -> None:
    """A 2-rank gang whose ranks run until `gate` exists; returns once both run."""
    c.create_job({"name": name, "gpu": gpu, "cpu": "100m", "distributed": {"nodes": 2},
                  "command": ["sh", "-c", f"while [ ! -e '{gate}' ]; do sleep 0.05; done"]})
    wait_until(lambda: all_running(c, name), "both ranks running")


def log_of(c: ApiClient, name: str, rank: int | str | None = None) -> str:
    return b"".join(c.logs(name, rank=rank)).decode(errors="replace")


def env_of(log: str) -> dict[str, str]:
    line = next(line for line in log.splitlines() if line.startswith("env "))
    return dict(item.split("=", 1) for item in line.split()[1:])


def ranks_of(c: ApiClient, name: str) -> list[dict[str, Any]]:
    ranks: list[dict[str, Any]] = c.get_job(name)["ranks"]
    return ranks


def all_running(c: ApiClient, name: str) -> bool:
    job = c.get_job(name)
    return job["phase"] == "Running" and all(r["state"] == "Running" for r in job["ranks"])


def job_events(c: ApiClient, name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in b"".join(c.events(job=name)).splitlines() if line]


def gang_id(c: ApiClient, name: str) -> tuple[int, int]:
    """(job id, attempt) from the NODUS_GANG a rank printed in its `env` line."""
    log = wait_until(lambda: (text := log_of(c, name, 0)) and "env " in text and text,
                     f"{name} rank 0's env line")
    job_id, _, number = env_of(log)["NODUS_GANG"].partition("-")
    return int(job_id), int(number)


def test_plain_host_gang_ranks_meet_and_show_by_rank(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    script = "import os\n" + ENV_LINE + RENDEZVOUS
    with gang_daemon() as d:
        c = d.client()
        uuids = {g["uuid"] for g in c.gpus()["gpus"]}
        assert len(uuids) == 4
        nodus.Job.create(name="g", command=[PY, "-c", script, "127.0.0.1"], gpu="H100:2",
                         cpu="100m", env={"GATE": str(gate)},
                         distributed=nodus.Distributed(nodes=2))
        wait_until(lambda: "rank 0 got" in log_of(c, "g", 0), "rank 1 to reach rank 0",
                   timeout=30)
        wait_until(lambda: all_running(c, "g"), "both ranks running")

        running = ranks_of(c, "g")
        assert [r["rank"] for r in running] == [0, 1]
        held = [set(r["gpus"]) for r in running]
        assert all(len(h) == 2 for h in held) and not held[0] & held[1], running
        assert held[0] | held[1] == {0, 1, 2, 3}
        status = run_cli(d, "job", "status", "g")
        assert status.returncode == 0, status.stderr
        assert "2 ranks x 2 GPUs, Plain" in status.stdout, status.stdout
        rank_lines = [line.split() for line in status.stdout.splitlines()
                      if line.strip().startswith("rank ")]
        assert [(w[1], w[2]) for w in rank_lines] == [("0", "Running"), ("1", "Running")], \
            status.stdout
        for words, gpus in zip(rank_lines, held, strict=True):
            assert words[-1] == ",".join(map(str, sorted(gpus))), status.stdout

        gate.touch()
        done = c.wait_job("g", timeout=30)
        assert (done["phase"], done["exit_code"]) == ("Succeeded", 0), done

        logs = {rank: log_of(c, "g", rank) for rank in (0, 1)}
        assert "rank 0 got: hello from rank 1" in logs[0], logs
        assert "rank 1 sent" in logs[1] and "rank 0 got" not in logs[1], logs
        envs = {rank: env_of(logs[rank]) for rank in (0, 1)}
        visible = []
        for rank, env in envs.items():
            assert env["RANK"] == env["NODE_RANK"] == env["NODUS_RANK"] == str(rank), env
            assert env["WORLD_SIZE"] == env["NODUS_WORLD_SIZE"] == "2", env
            assert env["LOCAL_RANK"] == "0", env
            assert env["MASTER_ADDR"] == "127.0.0.1", env
            visible.append(set(env["CUDA_VISIBLE_DEVICES"].split(",")))
        assert envs[0]["MASTER_PORT"] == envs[1]["MASTER_PORT"]
        assert all(len(v) == 2 and v <= uuids for v in visible), visible
        assert not visible[0] & visible[1]

        merged = log_of(c, "g", "all").splitlines()
        assert "[r0] rank 0 got: hello from rank 1" in merged, merged
        assert "[r1] rank 1 sent" in merged, merged
        assert all(line.startswith(("[r0] ", "[r1] ")) for line in merged), merged
        assert sorted(line[5:] for line in merged if line.startswith("[r1] ")) == sorted(
            logs[1].splitlines())

        cli_logs = run_cli(d, "job", "logs", "g", "--rank", "1")
        assert cli_logs.returncode == 0, cli_logs.stderr
        assert cli_logs.stdout == logs[1]
        cli_all = run_cli(d, "job", "logs", "g", "--rank", "all")
        assert cli_all.returncode == 0 and cli_all.stdout.splitlines() == merged, cli_all
        ended = run_cli(d, "job", "status", "g").stdout
        assert "rank 0   Exited (exit 0)" in ended and "rank 1   Exited (exit 0)" in ended, \
            ended


def test_a_failing_rank_stops_the_rest_and_decides_the_end(tmp_path: Path) -> None:
    # Rank 1 fails once rank 0 has said it sleeps: under load rank 0's shell may start after
    # rank 1 has already failed, and then rank 0 is stopped before it says anything.
    said = tmp_path / "rank-0-said-it"
    script = (f'if [ "$RANK" = 1 ]; then while [ ! -e {said} ]; do sleep 0.05; done; '
              'echo rank 1 fails; exit 3; fi; '
              f'echo rank 0 sleeps; touch {said}; sleep 60; echo rank 0 slept')
    with gang_daemon(config=None) as d:
        c = d.client()
        c.create_job({"name": "f", "command": ["sh", "-c", script], "cpu": "100m",
                      "distributed": {"nodes": 2}})
        done = c.wait_job("f", timeout=30)
        assert (done["phase"], done["exit_code"]) == ("Failed", 3), done
        ranks = done["ranks"]
        assert (ranks[1]["state"], ranks[1]["exit_code"]) == ("Exited", 3), ranks
        assert ranks[0]["state"] == "Exited" and ranks[0]["exit_code"] in (143, -15), ranks
        assert [(a["number"], a["exit_code"]) for a in c.attempts("f")] == [(1, 3)]
        log0 = log_of(c, "f", 0)
        assert "rank 0 sleeps" in log0 and "rank 0 slept" not in log0, log0
        assert "rank 1 fails" in log_of(c, "f", 1)


def test_a_waiting_gang_is_not_starved_by_small_jobs(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    gang = {"nodes": 3, "gpus_per_node": 1}
    with gang_daemon() as d:
        c = d.client()
        c.create_job({"name": "a", "gpu": "H100", "cpu": "100m", "distributed": gang,
                      "command": ["sh", "-c", f"while [ ! -e '{gate}' ]; do sleep 0.05; done"]})
        wait_until(lambda: all_running(c, "a"), "gang a running")
        c.create_job({"name": "b", "gpu": "H100", "cpu": "100m", "distributed": gang,
                      "command": ["sleep", "1"]})
        wait_until(lambda: c.get_job("b").get("hold"), "gang b to wait with a hold")
        small = [f"s{n}" for n in range(6)]
        for name in small:
            c.create_job({"name": name, "gpu": 1, "cpu": "100m", "command": ["sleep", "1"]})
            time.sleep(0.2)  # a stream over time, not a batch
            b = c.get_job("b")
            assert (b["phase"], c.get_job("a")["phase"]) == ("Pending", "Running"), b
            assert b["hold"], b
        # The fourth GPU is free, but b waits for it: nothing behind b takes it.
        assert {j["name"]: j["phase"] for j in c.list_jobs()} == {
            "a": "Running", "b": "Pending", **dict.fromkeys(small, "Pending")}
        gate.touch()
        docs = {name: c.wait_job(name, timeout=60) for name in ["a", "b", *small]}
        assert all(doc["phase"] == "Succeeded" for doc in docs.values()), docs
        order = sorted(["b", *small], key=lambda n: docs[n]["started_at"])
        # b first, or beside the one small job that fits on the fourth GPU with it.
        after_b = [n for n in small if docs[n]["started_at"] >= docs["b"]["started_at"]]
        assert len(after_b) >= 5, order
        # b's GPUs were a's: it started once a's end was recorded, not beside it.
        assert docs["b"]["started_at"] >= docs["a"]["ended_at"], docs


def test_kill9_mid_gang_adopts_both_ranks_and_records_one_end(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    with gang_daemon() as d:
        c = d.client()
        c.create_job({"name": "k", "gpu": "H100", "cpu": "100m",
                      "distributed": {"nodes": 2},
                      "command": ["sh", "-c", f"echo rank $RANK up; while [ ! -e '{gate}' ]; "
                                  "do sleep 0.05; done; echo rank $RANK done"]})
        wait_until(lambda: all_running(c, "k"), "both ranks running")
        d.kill()
        d.start()
        wait_until(lambda: all_running(c, "k"), "both ranks running after the restart")
        for rank in (0, 1):
            assert f"adopting job k attempt 1 rank {rank}" in d.log(), d.log()[-3000:]
        gate.touch()
        done = c.wait_job("k", timeout=30)
        assert (done["phase"], done["exit_code"], done["attempts"]) == ("Succeeded", 0, 1), done
        assert [(r["state"], r["exit_code"]) for r in done["ranks"]] == [("Exited", 0)] * 2
        assert [(a["number"], a["phase"], a["exit_code"]) for a in c.attempts("k")] == [
            (1, "Exited", 0)]
        mine = job_events(c, "k")
        assert [e["phase"] for e in mine if e["phase"] in TERMINAL] == ["Succeeded"], mine
        assert [e["phase"] for e in mine].count("Running") == 1, mine
        for rank in (0, 1):
            assert f"rank {rank} done" in log_of(c, "k", rank)


def test_ray_gang_forms_one_cluster_of_two_nodes() -> None:
    code = ("import ray; ray.init(); "
            "print('nodes', len([n for n in ray.nodes() if n['Alive']]), flush=True)")
    with gang_daemon(config=None) as d:
        c = d.client()
        c.create_job({"name": "ray", "command": ["python", "-c", code], "cpu": "500m",
                      "env": {"PATH": f"{VENV_BIN}:/usr/bin:/bin"},
                      "distributed": {"nodes": 2, "gpus_per_node": 0, "launcher": "Ray",
                                      "startup_timeout": "120s"}})
        done = c.wait_job("ray", timeout=150)
        log0 = log_of(c, "ray", 0)
        assert (done["phase"], done["exit_code"]) == ("Succeeded", 0), (done, log0,
                                                                        log_of(c, "ray", 1))
        assert "nodes 2" in log0.splitlines(), log0
        assert "nodus: all 2 Ray nodes joined" in log0
        assert [(r["state"], r["exit_code"]) for r in done["ranks"]] == [("Exited", 0)] * 2


def test_torchrun_gang_all_reduces_over_gloo() -> None:
    pytest.importorskip("torch")
    code = ("import torch, torch.distributed as dist; dist.init_process_group('gloo'); "
            "t = torch.ones(1) * (dist.get_rank() + 1); dist.all_reduce(t); "
            "print('sum', int(t.item()), flush=True)")
    with gang_daemon(config=None) as d:
        c = d.client()
        c.create_job({"name": "tr", "command": ["python", "-c", code], "cpu": "500m",
                      "env": {"PATH": f"{VENV_BIN}:/usr/bin:/bin"},
                      "distributed": {"nodes": 2, "gpus_per_node": 0,
                                      "launcher": "Torchrun"}})
        done = c.wait_job("tr", timeout=120)
        assert done["phase"] == "Succeeded", (done, log_of(c, "tr", "all"))
        assert "sum 3" in log_of(c, "tr", 0)


@pytest.mark.parametrize(("body", "field", "words"), [
    ({"distributed": {"nodes": 2, "launcher": "Slurm"}}, "distributed.launcher",
     "Plain, Torchrun, Ray, Verl"),
    ({"distributed": {"nodes": 2, "transport": "infiniband"}}, "distributed.transport",
     "'infiniband' is not one of"),
    ({"gpu": "H100", "distributed": {"total_gpus": 3, "gpus_per_node": 2}},
     "distributed.total_gpus", "not a multiple"),
    ({"gpu": "H100", "distributed": {"nodes": 2, "total_gpus": 6, "gpus_per_node": 2}},
     "distributed.total_gpus", "2 nodes of 2 GPUs are 4"),
    ({"gpu": "H100:2", "distributed": {"nodes": 2, "gpus_per_node": 3}},
     "distributed.gpus_per_node", "gpu asks for 2 per rank"),
    ({"image": PYTHON_IMAGE, "command": None, "distributed": {"nodes": 2, "launcher": "Ray"}},
     "command", "the Ray launcher runs the job's command"),
    ({"distributed": {"nodes": 2, "bogus": 1}}, "distributed.bogus", "unknown field"),
    ({"distributed": {}}, "distributed.nodes", "give nodes or total_gpus"),
])
def test_bad_gangs_are_refused_naming_the_field(four_gpus: testing.Daemon, body: dict[str, Any],
                                                field: str, words: str) -> None:
    d = four_gpus
    full = {"name": "bad", "command": ["true"], **body}
    if full["command"] is None:
        del full["command"]
    with pytest.raises(errors.InvalidArgument) as info:
        d.client().create_job(full)
    assert info.value.http_status == 400
    assert info.value.field == field, info.value
    assert words in info.value.message and "\n" not in info.value.message, info.value
    named = info.value.message.partition(":")[0]
    assert field.startswith(named), info.value.message
    with pytest.raises(errors.NotFound):
        d.client().get_job("bad")


def test_cli_gang_flags_need_nodes(daemon: testing.Daemon) -> None:
    refused = run_cli(daemon, "job", "run", "--launcher", "Ray", "--", "true")
    assert refused.returncode == 2, refused
    assert "--launcher needs --nodes" in refused.stderr, refused.stderr
    bad = run_cli(daemon, "job", "run", "--nodes", "2", "--launcher", "Slurm", "--", "true")
    assert bad.returncode == 2, bad
    made = run_cli(daemon, "job", "run", "--name", "two", "--nodes", "2", "--cpu", "100m",
                   "--", "sh", "-c", "echo rank $RANK")
    assert made.returncode == 0, made.stderr
    assert sorted(made.stdout.splitlines()) == ["[r0] rank 0", "[r1] rank 1"], made.stdout


def test_gpus_json_shows_each_ranks_gpus(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    with gang_daemon() as d:
        c = d.client()
        start_gated(c, "gp", gate, "H100:2")
        shown = run_cli(d, "gpus", "--json")
        assert shown.returncode == 0, shown.stderr
        gpus = json.loads(shown.stdout)["gpus"]
        assert all(g["job"] and g["job"]["name"] == "gp" for g in gpus), gpus
        by_rank: dict[int, set[int]] = {}
        for g in gpus:
            by_rank.setdefault(g["job"]["rank"], set()).add(g["index"])
        assert sorted(by_rank) == [0, 1] and all(len(s) == 2 for s in by_rank.values()), gpus
        assert {r["rank"]: set(r["gpus"]) for r in ranks_of(c, "gp")} == by_rank
        gate.touch()
        assert c.wait_job("gp", timeout=30)["phase"] == "Succeeded"


def test_exec_beside_a_rank(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    with gang_daemon() as d:
        c = d.client()
        start_gated(c, "ex", gate, "H100")
        result = c.exec_job("ex", None, ["sh", "-c", "echo $RANK"], rank=1)
        assert (result["returncode"], result["stdout"].strip()) == (0, "1"), result
        head = c.exec_job("ex", None, ["sh", "-c", "echo $RANK $WORLD_SIZE"])
        assert head["stdout"].strip() == "0 2", head
        cli = run_cli(d, "job", "exec", "ex", "--rank", "1", "--", "sh", "-c", "echo $RANK")
        assert (cli.returncode, cli.stdout.strip()) == (0, "1"), cli
        with pytest.raises(errors.InvalidArgument) as info:
            c.exec_job("ex", None, ["true"], rank=2)
        assert info.value.field == "rank"
        gate.touch()
        assert c.wait_job("ex", timeout=30)["phase"] == "Succeeded"


def test_ranks_that_do_not_all_start_in_time_are_killed_and_the_attempt_lost() -> None:
    marker = f"gang-late-{os.getpid()}"
    with gang_daemon(config=None) as d:
        c = d.client()
        c.create_job({"name": "late", "cpu": "10m",
                      "command": ["sh", "-c", f"exec sleep 60 # {marker}"],
                      "distributed": {"nodes": 8, "startup_timeout": 0.001}})
        ended = c.wait_job("late", timeout=60)
        assert (ended["phase"], ended["reason"]) == ("Failed", "Lost"), ended
        assert "did not start within its startup_timeout of 0.001s" in ended["message"]
        assert not [p for p in Path("/proc").glob("[0-9]*/cmdline")
                    if marker.encode() in _read(p)], "a rank outlived its attempt"


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:  # the process ended meanwhile
        return b""
