"""The `[regions.NAME]` tables of the daemon's config without a daemon: a whole Slurm region
is read into a SlurmRegion, each bad value is refused with one line naming its exact field
(a value that would become a second sbatch option most of all), and the settings list the
configured regions after this box's own, for jobs and for profiles."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from noduslocal.daemon.config.live import LiveSettings
from noduslocal.daemon.config.regions import SlurmRegion, parse_regions
from noduslocal.daemon.config.settings import LIVE, load_settings
from noduslocal.domain import errors

DATA = Path("/srv/noduslocal")


def parse(table: dict[str, Any], name: str = "cluster") -> SlurmRegion:
    return parse_regions({name: table}, "local", DATA)[name]


def refusal(value: Any, local: str = "local") -> errors.InvalidArgument:
    with pytest.raises(errors.InvalidArgument) as caught:
        parse_regions(value, local, DATA)
    assert "\n" not in caught.value.message
    return caught.value


def test_a_whole_region_is_read() -> None:
    region = parse({"runtime": "slurm", "partition": "debug", "account": "lab-a",
                    "qos": "normal", "gpu_types": {"h100": "h100_80g", "L4": "l4"},
                    "shared_dir": str(DATA), "max_submitted_per_user": 50, "poll": 2,
                    "python": "/opt/python3.11/bin/python3"})
    assert region == SlurmRegion("cluster", "debug", "lab-a", "normal",
                                 {"H100": "h100_80g", "L4": "l4"}, DATA, 50, 2.0,
                                 "/opt/python3.11/bin/python3")
    assert isinstance(region.poll, float)


def test_a_bare_region_takes_slurms_defaults() -> None:
    region = parse({"runtime": "slurm"})
    assert (region.partition, region.account, region.qos) == (None, None, None)
    assert region.gpu_types == {} and region.shared_dir is None
    assert region.max_submitted_per_user == 1000 and region.poll == 1.0
    assert region.python == "/usr/bin/python3"


def test_several_regions_and_none() -> None:
    regions = parse_regions({"cluster": {"runtime": "slurm"},
                             "big-gpu": {"runtime": "slurm", "partition": "gpu"}},
                            "local", DATA)
    assert sorted(regions) == ["big-gpu", "cluster"]
    assert regions["big-gpu"].name == "big-gpu" and regions["big-gpu"].partition == "gpu"
    assert parse_regions({}, "local", DATA) == {}


def test_gpu_models_map_to_gres_types_in_any_case() -> None:
    region = parse({"runtime": "slurm", "gpu_types": {"h100": "h100_80g"}})
    assert region.gres_type("H100") == "h100_80g"
    assert region.gres_type("h100") == "h100_80g"
    assert region.gres_type("L4") == "l4"  # unmapped: Slurm's usual lower-case name
    assert region.gres_type(None) is None


@pytest.mark.parametrize(("table", "field"), [
    ({"runtime": "slurm", "partiton": "debug"}, "regions.cluster.partiton"),
    ({"runtime": "slurm", "nodes": 2}, "regions.cluster.nodes"),
    ({}, "regions.cluster.runtime"),
    ({"runtime": "kubernetes"}, "regions.cluster.runtime"),
    ({"runtime": "Slurm"}, "regions.cluster.runtime"),
    ({"runtime": "slurm", "partition": "debug gpu"}, "regions.cluster.partition"),
    ({"runtime": "slurm", "partition": "debug,gpu"}, "regions.cluster.partition"),
    ({"runtime": "slurm", "partition": "debug --uid=0"}, "regions.cluster.partition"),
    ({"runtime": "slurm", "partition": ""}, "regions.cluster.partition"),
    ({"runtime": "slurm", "partition": 3}, "regions.cluster.partition"),
    ({"runtime": "slurm", "account": "lab;rm -rf /"}, "regions.cluster.account"),
    ({"runtime": "slurm", "account": "$(id)"}, "regions.cluster.account"),
    ({"runtime": "slurm", "qos": "high'"}, "regions.cluster.qos"),
    ({"runtime": "slurm", "qos": "a" * 65}, "regions.cluster.qos"),
    ({"runtime": "slurm", "gpu_types": "h100"}, "regions.cluster.gpu_types"),
    ({"runtime": "slurm", "gpu_types": ["h100"]}, "regions.cluster.gpu_types"),
    ({"runtime": "slurm", "gpu_types": {"H100": "h100:2"}}, "regions.cluster.gpu_types.H100"),
    ({"runtime": "slurm", "gpu_types": {"H100": 1}}, "regions.cluster.gpu_types.H100"),
    ({"runtime": "slurm", "shared_dir": "srv/noduslocal"}, "regions.cluster.shared_dir"),
    ({"runtime": "slurm", "shared_dir": 7}, "regions.cluster.shared_dir"),
    ({"runtime": "slurm", "max_submitted_per_user": 0},
     "regions.cluster.max_submitted_per_user"),
    ({"runtime": "slurm", "max_submitted_per_user": -5},
     "regions.cluster.max_submitted_per_user"),
    ({"runtime": "slurm", "max_submitted_per_user": 2.5},
     "regions.cluster.max_submitted_per_user"),
    ({"runtime": "slurm", "max_submitted_per_user": True},
     "regions.cluster.max_submitted_per_user"),
    ({"runtime": "slurm", "max_submitted_per_user": "10"},
     "regions.cluster.max_submitted_per_user"),
    ({"runtime": "slurm", "poll": 0}, "regions.cluster.poll"),
    ({"runtime": "slurm", "poll": -1}, "regions.cluster.poll"),
    ({"runtime": "slurm", "poll": 0.01}, "regions.cluster.poll"),
    ({"runtime": "slurm", "poll": 61}, "regions.cluster.poll"),
    ({"runtime": "slurm", "poll": "1s"}, "regions.cluster.poll"),
    ({"runtime": "slurm", "poll": True}, "regions.cluster.poll"),
    ({"runtime": "slurm", "python": "python3"}, "regions.cluster.python"),
    ({"runtime": "slurm", "python": "/usr/bin/python3 -c evil"}, "regions.cluster.python"),
    ({"runtime": "slurm", "python": "/usr/bin/python3;id"}, "regions.cluster.python"),
])
def test_each_bad_value_names_its_field(table: dict[str, Any], field: str) -> None:
    refused = refusal({"cluster": table})
    assert type(refused) is errors.InvalidArgument
    assert refused.field == field
    assert refused.message.startswith(f"{field}:"), refused.message


def test_an_unknown_key_lists_the_allowed_ones() -> None:
    refused = refusal({"cluster": {"runtime": "slurm", "partiton": "debug"}})
    for key in ("partition", "account", "qos", "gpu_types", "max_submitted_per_user"):
        assert key in refused.message


@pytest.mark.parametrize("name", ["Cluster", "my cluster", "c;ls", "-lead", "a" * 33, ""])
def test_a_bad_region_name_is_refused(name: str) -> None:
    refused = refusal({name: {"runtime": "slurm"}})
    assert refused.field == f"regions.{name}"


def test_the_local_regions_own_name_is_refused() -> None:
    refused = refusal({"local": {"runtime": "slurm"}})
    assert refused.field == "regions.local" and "this box's own region" in refused.message
    # Whatever this box's region is called.
    assert refusal({"box": {"runtime": "slurm"}}, local="box").field == "regions.box"
    assert parse_regions({"local": {"runtime": "slurm"}}, "box", DATA)["local"].name == "local"


def test_a_region_that_is_no_table_is_refused() -> None:
    assert refusal({"cluster": "slurm"}).field == "regions.cluster"
    assert refusal(["cluster"]).field == "regions"


def test_a_shared_dir_other_than_the_data_dir_is_unsupported() -> None:
    refused = refusal({"cluster": {"runtime": "slurm", "shared_dir": "/shared/nodus"}})
    assert type(refused) is errors.Unsupported
    assert refused.field == "regions.cluster.shared_dir"
    assert str(DATA) in refused.message
    # The same directory written another way is the data dir.
    assert parse({"runtime": "slurm", "shared_dir": f"{DATA}/"}).shared_dir == DATA


def write_config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return path


def settings_of(tmp_path: Path, text: str) -> Any:
    return load_settings(write_config(tmp_path, text), socket=tmp_path / "s",
                         data_dir=tmp_path / "d")


def test_the_settings_name_the_configured_regions_after_this_box(tmp_path: Path) -> None:
    settings = settings_of(tmp_path, '[regions.cluster]\nruntime = "slurm"\n'
                                     'partition = "debug"\ngpu_types = {"H100" = "h100"}\n'
                                     f'shared_dir = "{tmp_path / "d"}"\n')
    assert settings.region_names == ("local", "cluster")
    cluster = settings.regions["cluster"]
    assert cluster.partition == "debug" and cluster.gpu_types == {"H100": "h100"}
    assert cluster.shared_dir == tmp_path / "d"
    assert settings_of(tmp_path, "").region_names == ("local",)


def test_the_regions_follow_this_boxs_own_name_sorted(tmp_path: Path) -> None:
    settings = settings_of(tmp_path, 'region = "box"\n[regions.zeta]\nruntime = "slurm"\n'
                                     '[regions.alpha]\nruntime = "slurm"\n')
    assert settings.region_names == ("box", "alpha", "zeta")


@pytest.mark.parametrize(("text", "field"), [
    ('[regions.local]\nruntime = "slurm"\n', "regions.local"),
    ('region = "box"\n[regions.box]\nruntime = "slurm"\n', "regions.box"),
    ('[regions.cluster]\nruntime = "slurm"\npartition = "a b"\n',
     "regions.cluster.partition"),
    ('[regions.cluster]\nruntime = "slurm"\nshared_dir = "/elsewhere"\n',
     "regions.cluster.shared_dir"),
    ("regions = 3\n", "regions"),
])
def test_a_bad_region_in_the_file_is_refused(tmp_path: Path, text: str, field: str) -> None:
    with pytest.raises(errors.InvalidArgument) as caught:
        settings_of(tmp_path, text)
    assert caught.value.field == field


def test_a_profile_names_a_configured_region_only(tmp_path: Path) -> None:
    cluster = '[regions.cluster]\nruntime = "slurm"\n'
    settings = settings_of(tmp_path, cluster + '[profiles.big]\nregion = "cluster"\n')
    assert settings.profiles["big"]["region"] == "cluster"
    with pytest.raises(errors.InvalidArgument) as caught:
        settings_of(tmp_path, cluster + '[profiles.big]\nregion = "mars"\n')
    assert caught.value.field == "profiles.big.region"
    assert "'mars'" in caught.value.message and "local, cluster" in caught.value.message
    # A region that is no longer configured takes its profiles with it.
    with pytest.raises(errors.InvalidArgument, match=r"profiles\.big\.region"):
        settings_of(tmp_path, '[profiles.big]\nregion = "cluster"\n')


def test_the_regions_are_reloaded_live(tmp_path: Path) -> None:
    assert "regions" in LIVE
    live = LiveSettings(settings_of(tmp_path, ""))
    seen: list[tuple[str, ...]] = []
    live.subscribe(lambda new: seen.append(new.region_names))
    live.replace(settings_of(tmp_path, '[regions.cluster]\nruntime = "slurm"\n'
                                       "max_submitted_per_user = 3\n"))
    assert live.current.regions["cluster"].max_submitted_per_user == 3
    assert seen == [("local", "cluster")]
