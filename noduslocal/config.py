"""Typed daemon settings, loaded from a TOML file and command-line overrides, and the rules
for where the socket and the data directory live (shared with every client).
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from noduslocal.errors import InvalidArgument
from noduslocal.sockets import default_socket_path
from noduslocal.units import parse_cpu, parse_duration, parse_size

SYSTEM_DATA_DIR = Path("/var/lib/noduslocal")
SYSTEM_CONFIG = Path("/etc/noduslocal/config.toml")


def default_config_path() -> Path:
    """Where the daemon looks for its config when none is named: /etc/noduslocal as root,
    ~/.config/noduslocal for a user's own daemon. It need not exist."""
    if os.getuid() == 0:
        return SYSTEM_CONFIG
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "noduslocal" / "config.toml"


def default_data_dir() -> Path:
    if os.getuid() == 0:
        return SYSTEM_DATA_DIR
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "noduslocal"


def _host_memory() -> int:
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


@dataclass(frozen=True)
class Settings:
    socket: Path
    data_dir: Path
    region: str = "local"
    cpus_m: int = 0  # millicores of job requests that may run at once
    memory: int = 0  # bytes of job requests that may run at once
    kill_grace: float = 10.0  # seconds between SIGTERM and SIGKILL
    admin_group: str = "noduslocal-admin"
    socket_group: str = "noduslocal"
    max_body: int = 1024 * 1024
    max_wait_poll: float = 60.0  # longest a single wait long-poll is held
    commit_batch: int = 256  # most operations grouped into one commit
    docker_host: str | None = None  # None: $DOCKER_HOST, else unix:///var/run/docker.sock
    shm_size: int | None = None  # a container's /dev/shm; None: half its memory, else 8 GiB
    pids_limit: int = 8192  # processes and threads one container may hold
    image_pull: bool = True  # try `docker pull` for an image dockerd does not have
    simulate_gpus: str | None = None  # e.g. "4xH100-80GB,2xL4": no NVML, a simulated box
    nvml_library: str | None = None  # a libnvidia-ml.so.1 to load instead of the system's
    gpu_busy_memory: int = 2**30  # used memory that makes a GPU nobody here holds busy
    gpu_poll: float = 2.0  # seconds between readings of the GPUs
    max_user_priority: int = 0  # highest priority a user who is not an admin may ask for
    fair_share_half_life: float = 7 * 24 * 3600.0  # seconds for GPU-hours to count half
    user_max_gpus: int | None = None  # GPUs one user may hold at once (None: no limit)
    user_max_jobs: int | None = None  # jobs one user may run at once (None: no limit)
    user_max_execs: int = 8  # `job exec` commands one user may have running at once
    user_max_connections: int = 128  # connections to the socket one uid may hold open
    idle_timeout: float = 30.0  # seconds a connection may wait for a whole request's headers
    body_timeout: float = 30.0  # seconds a request body may go without a new byte
    max_open_files: int | None = None  # the daemon's RLIMIT_NOFILE (None: the hard limit)
    max_output_size: int = 16 * 2**30  # bytes of one collected output (a tar for a dir)
    max_job_outputs: int = 64 * 2**30  # bytes of all the outputs of one attempt
    disk_reserve: int = 2 * 2**30  # free bytes below which the data dir refuses new work
    disk_poll: float = 2.0  # seconds between readings of the data dir's free space
    energy_price_per_kwh: float = 0.0  # what a kWh of GPU energy costs
    gpu_hour_rates: dict[str, float] = field(default_factory=dict)  # model -> per GPU-hour
    host_shim: str = "auto"  # "auto": the compiled shim when it is there or can be built
    metrics_port: int | None = None  # /metrics also on 127.0.0.1:PORT for a scraper
    # Retention: an ended job's directory (workspace, logs) and outputs are kept this long
    # after it (or its sweep) ended; None keeps them forever. Per user: keep_ended_users.
    keep_ended: float | None = 14 * 24 * 3600.0
    keep_ended_users: dict[str, float | None] = field(default_factory=dict)
    gc_every: float = 3600.0  # seconds between retention passes
    # Bytes of workspaces, logs, volumes and blobs a user may hold before new work is
    # refused (None: no quota); per user: user_disk_quotas. Measured every du_every.
    user_disk_quota: int | None = None
    user_disk_quotas: dict[str, int | None] = field(default_factory=dict)
    du_every: float = 300.0
    # Named presets of Job.create arguments ([profiles.NAME] tables): a job naming one gets
    # its values in every argument it left unset.
    profiles: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def user_mode(self) -> bool:
        return os.getuid() != 0

    def keep_for(self, user: str) -> float | None:
        """How long `user`'s ended jobs keep their files (None: forever)."""
        return self.keep_ended_users.get(user, self.keep_ended)

    def quota_for(self, user: str) -> int | None:
        """The bytes `user` may hold on the data dir (None: no quota)."""
        return self.user_disk_quotas.get(user, self.user_disk_quota)


_TOML_KEYS = {
    "socket": ("socket", lambda v: Path(_text(v, "socket"))),
    "data_dir": ("data_dir", lambda v: Path(_text(v, "data_dir"))),
    "region": ("region", lambda v: _text(v, "region")),
    "cpus": ("cpus_m", lambda v: parse_cpu(v, "cpus")),
    "memory": ("memory", lambda v: parse_size(v, "memory")),
    "kill_grace": ("kill_grace", lambda v: parse_duration(v, "kill_grace")),
    "admin_group": ("admin_group", lambda v: _text(v, "admin_group")),
    "socket_group": ("socket_group", lambda v: _text(v, "socket_group")),
    "max_wait_poll": ("max_wait_poll", lambda v: parse_duration(v, "max_wait_poll")),
    "docker_host": ("docker_host", lambda v: _text(v, "docker_host")),
    "shm_size": ("shm_size", lambda v: parse_size(v, "shm_size")),
    "pids_limit": ("pids_limit", lambda v: _positive(v, "pids_limit")),
    "image_pull": ("image_pull", lambda v: _flag(v, "image_pull")),
    "simulate_gpus": ("simulate_gpus", lambda v: _simulated_spec(v)),
    "nvml_library": ("nvml_library", lambda v: _text(v, "nvml_library")),
    "gpu_busy_memory": ("gpu_busy_memory", lambda v: parse_size(v, "gpu_busy_memory")),
    "gpu_poll": ("gpu_poll", lambda v: parse_duration(v, "gpu_poll")),
    "max_user_priority": ("max_user_priority",
                          lambda v: _whole(v, "max_user_priority", -1000)),
    "fair_share_half_life": ("fair_share_half_life",
                             lambda v: parse_duration(v, "fair_share_half_life")),
    "user_max_gpus": ("user_max_gpus", lambda v: _whole(v, "user_max_gpus", 0)),
    "user_max_jobs": ("user_max_jobs", lambda v: _whole(v, "user_max_jobs", 0)),
    "user_max_execs": ("user_max_execs", lambda v: _positive(v, "user_max_execs")),
    "user_max_connections": ("user_max_connections",
                             lambda v: _positive(v, "user_max_connections")),
    "idle_timeout": ("idle_timeout", lambda v: parse_duration(v, "idle_timeout")),
    "body_timeout": ("body_timeout", lambda v: parse_duration(v, "body_timeout")),
    "max_open_files": ("max_open_files", lambda v: _positive(v, "max_open_files")),
    "max_output_size": ("max_output_size", lambda v: parse_size(v, "max_output_size")),
    "max_job_outputs": ("max_job_outputs", lambda v: parse_size(v, "max_job_outputs")),
    "disk_reserve": ("disk_reserve", lambda v: parse_size(v, "disk_reserve")),
    "disk_poll": ("disk_poll", lambda v: parse_duration(v, "disk_poll")),
    "energy_price_per_kwh": ("energy_price_per_kwh",
                             lambda v: _price(v, "energy_price_per_kwh")),
    "gpu_hour_rates": ("gpu_hour_rates", lambda v: _rates(v)),
    "host_shim": ("host_shim", lambda v: _choice(v, "host_shim", ("auto", "python"))),
    "profiles": ("profiles", lambda v: _profiles(v)),
    "max_body": ("max_body", lambda v: _positive(v, "max_body")),
    "commit_batch": ("commit_batch", lambda v: _positive(v, "commit_batch")),
    "metrics_port": ("metrics_port", lambda v: _port(v, "metrics_port")),
    "keep_ended": ("keep_ended", lambda v: _keep(v, "keep_ended")),
    "keep_ended_users": ("keep_ended_users",
                         lambda v: _per_user(v, "keep_ended_users", _keep)),
    "gc_every": ("gc_every", lambda v: _interval(v, "gc_every")),
    "user_disk_quota": ("user_disk_quota", lambda v: _quota(v, "user_disk_quota")),
    "user_disk_quotas": ("user_disk_quotas",
                         lambda v: _per_user(v, "user_disk_quotas", _quota)),
    "du_every": ("du_every", lambda v: _interval(v, "du_every")),
}
# The settings a reload applies to the running daemon (lifecycle/coordinator.py's
# apply_settings and the daemon's own holders take them); any other change waits for a
# restart, and the daemon says so.
LIVE = frozenset({
    "kill_grace", "admin_group", "max_wait_poll", "pids_limit", "shm_size",
    "gpu_busy_memory", "gpu_poll", "max_user_priority", "user_max_gpus", "user_max_jobs",
    "user_max_execs", "disk_reserve", "energy_price_per_kwh", "gpu_hour_rates", "profiles",
    "keep_ended", "keep_ended_users", "gc_every", "user_disk_quota", "user_disk_quotas",
    "du_every",
})
TOML_NAME = {attr: key for key, (attr, _) in _TOML_KEYS.items()}  # cpus_m -> cpus


def _positive(value: Any, name: str) -> int:
    return _whole(value, name, 1)


def _whole(value: Any, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidArgument(f"{name}: expected a whole number from {minimum}", field=name)
    return value


def _port(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise InvalidArgument(f"{name}: expected a TCP port from 1 to 65535", field=name)
    return value


def _keep(value: Any, name: str) -> float | None:
    return _unless(value, name, "forever", parse_duration)


def _quota(value: Any, name: str) -> int | None:
    return _unless(value, name, "none", parse_size)


def _unless(value: Any, name: str, word: str, parse: Callable[[Any, str], Any]) -> Any:
    """`parse(value)`, or None for `word`, which means no limit ("forever", "none")."""
    if value == word:
        return None
    try:
        return parse(value, name)
    except InvalidArgument as exc:
        raise InvalidArgument(f'{exc.message}; or "{word}"', field=name) from None


def _interval(value: Any, name: str) -> float:
    seconds = parse_duration(value, name)
    if not 1 <= seconds <= 7 * 24 * 3600:
        raise InvalidArgument(f"{name}: expected a duration from 1s to 7d", field=name)
    return seconds


def _per_user(value: Any, name: str, convert: Any) -> dict[str, Any]:
    """A table of user name = value, each checked as the setting for everyone is."""
    if not isinstance(value, dict):
        raise InvalidArgument(f"{name}: expected a [{name}] table of user = value",
                              field=name)
    if misplaced := sorted(set(value) & set(_TOML_KEYS)):
        raise InvalidArgument(f"{name}.{misplaced[0]}: {misplaced[0]} is a setting, not a user; "
                              f"settings go above the first [table] of the file",
                              field=f"{name}.{misplaced[0]}")
    return {user: convert(each, f"{name}.{user}") for user, each in value.items()}


def _text(value: Any, name: str) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidArgument(f"{name}: expected a string in quotes", field=name)
    return value


def _flag(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidArgument(f"{name}: expected true or false", field=name)
    return value


def _price(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise InvalidArgument(f"{name}: expected a number from 0", field=name)
    return float(value)


def _profiles(value: Any) -> dict[str, dict[str, Any]]:
    """Each profile checked as a job's arguments are (a bad one stops the daemon at start,
    naming it), and only with the arguments a profile may fill."""
    from noduslocal.profiles import PROFILE_FIELDS
    from noduslocal.validation import parse_create, validate_name

    if not isinstance(value, dict):
        raise InvalidArgument("profiles: expected [profiles.NAME] tables", field="profiles")
    profiles: dict[str, dict[str, Any]] = {}
    for name, preset in value.items():
        where = f"profiles.{name}"
        try:
            validate_name(name, where)
            if not isinstance(preset, dict):
                raise InvalidArgument(f"{where}: expected a table of Job.create arguments",
                                      field=where)
            if unknown := sorted(set(preset) - PROFILE_FIELDS):
                raise InvalidArgument(f"{unknown[0]}: not for a profile; a profile may set "
                                      f"{', '.join(sorted(PROFILE_FIELDS))}", field=unknown[0])
            # Whether it parses as a job's; its region is checked against the daemon's own
            # when a job uses it.
            parse_create({"command": ["true"], **{k: v for k, v in preset.items()
                                                  if k != "region"}}, regions=("",))
        except InvalidArgument as exc:
            field_name = exc.field if (exc.field or "").startswith("profiles.") else \
                f"{where}.{exc.field}"
            message = exc.message.removeprefix(f"{exc.field}: ")
            raise InvalidArgument(f"config: {field_name}: {message}",
                                  field=field_name) from None
        profiles[name] = dict(preset)
    return profiles


def _choice(value: Any, name: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise InvalidArgument(f"{name}: expected one of {', '.join(allowed)}", field=name)
    return str(value)


def load_settings(
    config: Path | None = None,
    *,
    socket: Path | None = None,
    data_dir: Path | None = None,
    overrides: dict[str, Any] | None = None,
) -> Settings:
    """Defaults, then the TOML file, then explicit arguments (the command line)."""
    values: dict[str, Any] = {}
    path = config
    if path is None and default_config_path().exists():
        path = default_config_path()
    if path is not None:
        try:
            raw = tomllib.loads(Path(path).read_text())
        except FileNotFoundError:
            raise InvalidArgument(f"config: {path} does not exist", field="config") from None
        except tomllib.TOMLDecodeError as exc:
            raise InvalidArgument(f"config: {path}: {exc}", field="config") from None
        for key, value in raw.items():
            if key not in _TOML_KEYS:
                allowed = ", ".join(sorted(_TOML_KEYS))
                raise InvalidArgument(f"config: unknown key {key!r}; allowed: {allowed}",
                                      field=key)
            attr, convert = _TOML_KEYS[key]
            values[attr] = convert(value)
    for key, value in (overrides or {}).items():
        attr, convert = _TOML_KEYS[key]
        values[attr] = convert(value)
    if socket is not None:
        values["socket"] = socket
    if data_dir is not None:
        values["data_dir"] = data_dir
    # Absolute, so nothing the daemon or its shims open depends on a working directory.
    settings = Settings(
        socket=Path(os.path.abspath(values.pop("socket", default_socket_path()))),
        data_dir=Path(os.path.abspath(values.pop("data_dir", default_data_dir()))),
    )
    known = {f.name for f in fields(Settings)}
    settings = replace(settings, **{k: v for k, v in values.items() if k in known})
    if not settings.cpus_m:
        settings = replace(settings, cpus_m=(os.cpu_count() or 1) * 1000)
    if not settings.memory:
        settings = replace(settings, memory=_host_memory())
    for name, preset in settings.profiles.items():
        if preset.get("region", settings.region) != settings.region:
            raise InvalidArgument(f"config: profiles.{name}.region: {preset['region']!r} is "
                                  f"not this host's region ({settings.region!r})",
                                  field=f"profiles.{name}.region")
    return settings


def _simulated_spec(value: object) -> str:
    from noduslocal.gpu import simulated

    if not isinstance(value, str):
        raise InvalidArgument("simulate_gpus: expected a string like \"4xH100-80GB\"",
                              field="simulate_gpus")
    simulated.parse(value)  # refused here, with the field named, not at start-up
    return value


def _rates(value: object) -> dict[str, float]:
    """{"H100" = 2.5, "default" = 1.0}: a price per GPU-hour by model."""
    if not isinstance(value, dict) or not all(
            isinstance(k, str) and isinstance(v, int | float) and v >= 0
            for k, v in value.items()):
        raise InvalidArgument("gpu_hour_rates: expected a table of model = price per GPU-hour",
                              field="gpu_hour_rates")
    return {k if k == "default" else k.upper(): float(v) for k, v in value.items()}
