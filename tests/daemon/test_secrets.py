"""Secrets: set from stdin, injected as environment, never returned by any API call, and
masked as *** in stored logs, even when a job writes the value in pieces."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable

import pytest

import noduslocal as nodus
from noduslocal import testing
from noduslocal.domain import errors
from tests.daemon.conftest import job_names

Cli = Callable[..., subprocess.CompletedProcess[str]]
VALUE = "hf_Sup3rS3cretV4lue"


def stored_logs(d: testing.Daemon) -> str:
    return "".join(p.read_text(errors="replace")
                   for p in d.data_dir.glob("jobs/*/attempt-*/*.log"))


def everything_the_api_says(d: testing.Daemon) -> str:
    c = d.client()
    jobs = c.list_jobs(all=True)
    docs = [c.get_job(j["name"], j["project"]) for j in jobs]
    attempts = [c.attempts(j["name"], j["project"]) for j in jobs]
    events = b"".join(c.events()).decode()
    return json.dumps([jobs, docs, attempts, c.list_secrets()]) + events


def test_cli_set_ls_rm(own_cli: Cli) -> None:
    cli = own_cli  # its own daemon: `secret ls` lists every secret of the user
    made = cli("secret", "set", "HF_TOKEN", input=VALUE + "\n")
    assert (made.returncode, made.stdout) == (0, "HF_TOKEN: created\n")
    assert cli("secret", "set", "HF_TOKEN", input="other").stdout == "HF_TOKEN: replaced\n"
    listed = json.loads(cli("secret", "ls", "--json").stdout)
    assert [s["name"] for s in listed] == ["HF_TOKEN"]
    assert VALUE not in json.dumps(listed) and "other" not in json.dumps(listed)
    assert cli("secret", "rm", "HF_TOKEN").returncode == 0
    gone = cli("secret", "rm", "HF_TOKEN")
    assert gone.returncode == 1 and "no secret named" in gone.stderr
    bad = cli("secret", "set", "9lives", input="x")
    assert bad.returncode == 2 and "not a secret name" in bad.stderr


def test_injected_never_returned_and_masked(daemon: testing.Daemon, cli: Cli) -> None:
    cli("secret", "set", "HF_TOKEN", input=VALUE)
    job = nodus.Job.run(name="uses", command=["sh", "-c", 'echo "token=$HF_TOKEN"; '
                                              'echo "also $HF_TOKEN" >&2; echo done'],
                        secrets=["HF_TOKEN"])
    job.wait(timeout=30)
    assert sorted(job.iter_logs()) == ["also ***", "done", "token=***"]  # two pipes: any order
    assert job.status().spec.secrets == ["HF_TOKEN"]
    assert VALUE not in stored_logs(daemon)
    assert VALUE not in everything_the_api_says(daemon)
    shown = cli("job", "status", "uses", "--json").stdout + cli("job", "list", "-a").stdout
    assert VALUE not in shown


def test_a_value_written_in_pieces_is_masked(daemon: testing.Daemon) -> None:
    daemon.client().set_secret("PIECES", "abcdefghij")
    job = nodus.Job.run(command=["sh", "-c", "printf 'x abcde'; sleep 0.3; printf 'fghij y\\n'; "
                                 "printf abc; sleep 0.3; echo def"], secrets=["PIECES"])
    job.wait(timeout=30)
    assert list(job.iter_logs()) == ["x *** y", "abcdef"]


def test_inline_secret_from_the_cli(cli: Cli, daemon: testing.Daemon) -> None:
    run = cli("job", "run", "--secret", f"API_KEY={VALUE}", "--", "sh", "-c",
              f'test "${{#API_KEY}}" = {len(VALUE)} && echo "key $API_KEY ok"')
    assert (run.returncode, run.stdout) == (0, "key *** ok\n")
    assert VALUE not in everything_the_api_says(daemon) + stored_logs(daemon)


def test_value_is_snapshotted_at_create(daemon: testing.Daemon) -> None:
    c = daemon.client()
    c.set_secret("ROTATING", "first-value")
    hog = nodus.Job.run(command=["sleep", "30"], cpu=2)
    testing.wait_until(lambda: hog.status().phase == "Running", "the hog to run")
    job = nodus.Job.run(command=["sh", "-c", 'test "$ROTATING" = first-value && echo same'],
                        secrets=[{"name": "ROTATING"}])
    c.set_secret("ROTATING", "second-value")
    c.delete_secret("ROTATING")
    hog.cancel()
    job.wait(timeout=30)
    assert list(job.iter_logs()) == ["same"]


@pytest.mark.parametrize(("secrets", "message"), [
    (["MISSING"], "no secret named 'MISSING'"),
    ([{"name": "A", "value": "x"}], "each entry is"),
    ([{"env": "1BAD", "value": "x"}], "not a valid variable name"),
    (["DUP", {"env": "DUP", "value": "x"}], "set twice"),
    ([{"env": "K", "value": ""}], "non-empty string"),
])
def test_bad_secrets_are_400_and_create_nothing(daemon: testing.Daemon, secrets: list[object],
                                                message: str) -> None:
    daemon.client().set_secret("DUP", "v")
    before = job_names(daemon)
    with pytest.raises(errors.InvalidArgument, match=message) as info:
        nodus.Job.create(command=["true"], secrets=secrets)
    assert info.value.field == "secrets"
    assert job_names(daemon) == before


def test_env_and_secret_may_not_name_the_same_variable(daemon: testing.Daemon) -> None:
    daemon.client().set_secret("TOKEN", "v")
    with pytest.raises(errors.InvalidArgument, match="set twice"):
        nodus.Job.create(command=["true"], env={"TOKEN": "plain"}, secrets=["TOKEN"])
