"""Which of the caller's variables a job gets (domain/environment.py), the one rule the
CLI's --export and the SDK's export= share, and what the SDK sends as `env`."""

from __future__ import annotations

import pytest

from noduslocal.domain import errors
from noduslocal.domain.environment import exported, job_env
from noduslocal.sdk.job import sent_env

CALLER = {"PATH": "/home/u/bin:/usr/bin", "MYVAR": "x", "PWD": "/home/u", "SHLVL": "2",
          "NODUSLOCAL_SOCKET": "/run/s", "NODUS_TOKEN": "t", "BASH_FUNC_f%%": "() {}",
          "not-an-identifier": "y"}


def test_all_for_a_host_job_none_for_an_image_and_the_same_left_out() -> None:
    assert exported(None, image=False, environ=CALLER) == {"PATH": "/home/u/bin:/usr/bin",
                                                           "MYVAR": "x"}
    assert exported(None, image=True, environ=CALLER) == {}
    assert exported("all", image=True, environ=CALLER) == exported(None, False, CALLER)
    assert exported("NONE", image=False, environ=CALLER) == {}
    assert exported("MYVAR, PATH", image=False, environ=CALLER) == {
        "MYVAR": "x", "PATH": "/home/u/bin:/usr/bin"}


@pytest.mark.parametrize("spec", ["NOPE", ",", "MYVAR,NOPE"])
def test_a_name_not_set_is_refused(spec: str) -> None:
    with pytest.raises(errors.InvalidArgument, match="is not set in your environment") as exc:
        exported(spec, image=False, environ=CALLER)
    assert exc.value.field == "export"


def test_given_wins_and_a_secret_name_is_not_exported(monkeypatch: pytest.MonkeyPatch
                                                      ) -> None:
    monkeypatch.setenv("MYVAR", "mine")
    monkeypatch.setenv("TOKEN", "plain")
    env = job_env(None, False, {"MYVAR": "given"}, {"TOKEN"})
    assert env["MYVAR"] == "given" and "TOKEN" not in env
    sent = sent_env(None, None, {"MYVAR": "given"}, ["TOKEN", {"name": "K", "env": "KEY"}])
    assert sent["MYVAR"] == "given" and "TOKEN" not in sent
    assert sent_env(None, "busybox", None, None) is None  # an image: nothing of ours
    assert sent_env(None, "busybox", {"A": "1"}, None) == {"A": "1"}
    assert sent_env(None, None, "not a mapping", None) == "not a mapping"  # _wire says so


def test_a_profiles_env_is_filled_variable_by_variable() -> None:
    from noduslocal.domain.profiles import with_profile

    profiles = {"p": {"env": {"STAGE": "small", "A": "profile"}, "cpu": "1"}}
    assert with_profile({"profile": "p", "env": {"A": "job", "PATH": "/bin"}}, profiles) == (
        {"env": {"STAGE": "small", "A": "job", "PATH": "/bin"}, "cpu": "1"}, "p")
    assert with_profile({"profile": "p"}, profiles)[0]["env"] == {"STAGE": "small",
                                                                  "A": "profile"}
