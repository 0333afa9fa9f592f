"""Typed daemon settings, loaded from a TOML file and command-line overrides, and the rules
for where the socket and the data directory live (shared with every client).
"""

from __future__ import annotations

import ipaddress
import os
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from noduslocal.daemon.config import values as check
from noduslocal.daemon.config.regions import SlurmRegion, parse_regions
from noduslocal.daemon.config.trust import read_trusted
from noduslocal.domain.errors import InvalidArgument
from noduslocal.domain.sockets import default_socket_path
from noduslocal.domain.units import parse_cpu, parse_duration, parse_size

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
    host_pids_max: int = 4096  # processes and threads one host job's rank may hold (cgroup)
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
    max_log_bytes: int = 2**30  # each log file of an attempt: past it, head + marker + tail
    disk_poll: float = 2.0  # seconds between readings of the data dir's free space
    energy_price_per_kwh: float = 0.0  # what a kWh of GPU energy costs
    gpu_hour_rates: dict[str, float] = field(default_factory=dict)  # model -> per GPU-hour
    host_shim: str = "auto"  # "auto": the compiled shim when it is there or can be built
    # A source unpacked once per owner and content, each task's workspace an overlay on it;
    # false (or no overlayfs, or not root): the source is copied into each workspace.
    overlay_workspaces: bool = True
    metrics_port: int | None = None  # /metrics also on 127.0.0.1:PORT for a scraper
    # The TCP port's /metrics has each user's queue and disk use (any local user reads it).
    metrics_port_per_user: bool = True
    # Addresses of this host (loopback, link-local, its interfaces') that a sweep's webhook
    # may reach, and registries there that images may be pulled from: none by default.
    webhook_local_networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()
    local_registries: tuple[str, ...] = ()  # "host" or "host:port", lower case
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
    # The regions beyond this box ([regions.NAME] tables): Slurm clusters (config/regions.py).
    regions: dict[str, SlurmRegion] = field(default_factory=dict)

    @property
    def region_names(self) -> tuple[str, ...]:
        """Every region a job may name: this box's first, then the configured ones."""
        return (self.region, *sorted(self.regions))

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
    "socket": ("socket", lambda v: Path(check.text(v, "socket"))),
    "data_dir": ("data_dir", lambda v: Path(check.text(v, "data_dir"))),
    "region": ("region", lambda v: check.text(v, "region")),
    "cpus": ("cpus_m", lambda v: parse_cpu(v, "cpus")),
    "memory": ("memory", lambda v: parse_size(v, "memory")),
    "kill_grace": ("kill_grace", lambda v: parse_duration(v, "kill_grace")),
    "admin_group": ("admin_group", lambda v: check.text(v, "admin_group")),
    "socket_group": ("socket_group", lambda v: check.text(v, "socket_group")),
    "max_wait_poll": ("max_wait_poll", lambda v: parse_duration(v, "max_wait_poll")),
    "docker_host": ("docker_host", lambda v: check.text(v, "docker_host")),
    "shm_size": ("shm_size", lambda v: parse_size(v, "shm_size")),
    "pids_limit": ("pids_limit", lambda v: check.positive(v, "pids_limit")),
    "host_pids_max": ("host_pids_max", lambda v: check.positive(v, "host_pids_max")),
    "image_pull": ("image_pull", lambda v: check.flag(v, "image_pull")),
    "simulate_gpus": ("simulate_gpus", lambda v: check.simulated_spec(v)),
    "nvml_library": ("nvml_library", lambda v: check.text(v, "nvml_library")),
    "gpu_busy_memory": ("gpu_busy_memory", lambda v: parse_size(v, "gpu_busy_memory")),
    "gpu_poll": ("gpu_poll", lambda v: parse_duration(v, "gpu_poll")),
    "max_user_priority": ("max_user_priority",
                          lambda v: check.whole(v, "max_user_priority", -1000)),
    "fair_share_half_life": ("fair_share_half_life",
                             lambda v: parse_duration(v, "fair_share_half_life")),
    "user_max_gpus": ("user_max_gpus", lambda v: check.whole(v, "user_max_gpus", 0)),
    "user_max_jobs": ("user_max_jobs", lambda v: check.whole(v, "user_max_jobs", 0)),
    "user_max_execs": ("user_max_execs", lambda v: check.positive(v, "user_max_execs")),
    "user_max_connections": ("user_max_connections",
                             lambda v: check.positive(v, "user_max_connections")),
    "idle_timeout": ("idle_timeout", lambda v: parse_duration(v, "idle_timeout")),
    "body_timeout": ("body_timeout", lambda v: parse_duration(v, "body_timeout")),
    "max_open_files": ("max_open_files", lambda v: check.positive(v, "max_open_files")),
    "max_output_size": ("max_output_size", lambda v: parse_size(v, "max_output_size")),
    "max_job_outputs": ("max_job_outputs", lambda v: parse_size(v, "max_job_outputs")),
    "disk_reserve": ("disk_reserve", lambda v: parse_size(v, "disk_reserve")),
    "max_log_bytes": ("max_log_bytes",
                      lambda v: check.size_from(v, "max_log_bytes", 64 * 1024, "64KiB")),
    "disk_poll": ("disk_poll", lambda v: parse_duration(v, "disk_poll")),
    "energy_price_per_kwh": ("energy_price_per_kwh",
                             lambda v: check.price(v, "energy_price_per_kwh")),
    "gpu_hour_rates": ("gpu_hour_rates", lambda v: check.rates(v)),
    "overlay_workspaces": ("overlay_workspaces",
                           lambda v: check.flag(v, "overlay_workspaces")),
    "host_shim": ("host_shim", lambda v: check.choice(v, "host_shim", ("auto", "python"))),
    "profiles": ("profiles", lambda v: check.profiles(v)),
    "max_body": ("max_body", lambda v: check.positive(v, "max_body")),
    "commit_batch": ("commit_batch", lambda v: check.positive(v, "commit_batch")),
    "metrics_port": ("metrics_port", lambda v: check.port(v, "metrics_port")),
    "metrics_port_per_user": ("metrics_port_per_user",
                              lambda v: check.flag(v, "metrics_port_per_user")),
    "webhook_local_networks": ("webhook_local_networks",
                               lambda v: check.networks(v, "webhook_local_networks")),
    "local_registries": ("local_registries",
                         lambda v: check.registries(v, "local_registries")),
    "keep_ended": ("keep_ended", lambda v: check.keep(v, "keep_ended")),
    "keep_ended_users": ("keep_ended_users",
                         lambda v: check.per_user(v, "keep_ended_users", check.keep,
                                                   _TOML_KEYS)),
    "gc_every": ("gc_every", lambda v: check.interval(v, "gc_every")),
    "user_disk_quota": ("user_disk_quota", lambda v: check.quota(v, "user_disk_quota")),
    "user_disk_quotas": ("user_disk_quotas",
                         lambda v: check.per_user(v, "user_disk_quotas", check.quota,
                                                   _TOML_KEYS)),
    "du_every": ("du_every", lambda v: check.interval(v, "du_every")),
    # Checked against this box's region name once the file is read (load_settings).
    "regions": ("regions", lambda v: v),
}
# The settings a reload applies to the running daemon (through config/live.py's holder,
# which every part reads); any other change waits for a restart, and the daemon says so.
LIVE = frozenset({
    "kill_grace", "admin_group", "max_wait_poll", "pids_limit", "host_pids_max", "shm_size",
    "gpu_busy_memory", "gpu_poll", "max_user_priority", "user_max_gpus", "user_max_jobs",
    "user_max_execs", "disk_reserve", "max_log_bytes", "energy_price_per_kwh",
    "gpu_hour_rates", "profiles", "keep_ended", "keep_ended_users", "gc_every",
    "user_disk_quota", "user_disk_quotas", "du_every", "webhook_local_networks",
    "metrics_port_per_user", "regions",
})
TOML_NAME = {attr: key for key, (attr, _) in _TOML_KEYS.items()}  # cpus_m -> cpus


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
            # A file only root and the daemon's own user can change (config_trust).
            raw = tomllib.loads(read_trusted(Path(path)))
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
    raw_regions = values.pop("regions", {})
    known = {f.name for f in fields(Settings)}
    settings = replace(settings, **{k: v for k, v in values.items() if k in known})
    settings = replace(settings, regions=parse_regions(raw_regions, settings.region,
                                                        settings.data_dir))
    if not settings.cpus_m:
        settings = replace(settings, cpus_m=(os.cpu_count() or 1) * 1000)
    if not settings.memory:
        settings = replace(settings, memory=_host_memory())
    for name, preset in settings.profiles.items():
        if preset.get("region", settings.region) not in settings.region_names:
            raise InvalidArgument(f"config: profiles.{name}.region: {preset['region']!r} is "
                                  f"not a region of this host; valid: "
                                  f"{', '.join(settings.region_names)}",
                                  field=f"profiles.{name}.region")
    return settings
