"""`noduslocal daemon`: noduslocald in the foreground."""

from __future__ import annotations

import sys
from pathlib import Path

import click


@click.command()
@click.option("--config", type=click.Path(path_type=Path), help="TOML settings file.")
@click.option("--socket", type=click.Path(path_type=Path), help="Unix socket to serve on.")
@click.option("--data-dir", type=click.Path(path_type=Path), help="Jobs and database.")
@click.option("--cpus", help="CPUs of job requests that may run at once.")
@click.option("--memory", help="Memory of job requests that may run at once, e.g. 64GiB.")
@click.option("--simulate-gpus", metavar="SPEC",
              help='Simulated GPUs for a machine without them, e.g. "4xH100-80GB,2xL4".')
@click.option("--nvml-library", metavar="PATH", help="A libnvidia-ml.so.1 to load.")
@click.option("--log-level", default="INFO", show_default=True)
def daemon(config: Path | None, socket: Path | None, data_dir: Path | None, cpus: str | None,
           memory: str | None, simulate_gpus: str | None, nvml_library: str | None,
           log_level: str) -> None:
    """Run noduslocald in the foreground."""
    from noduslocal.daemon.main import main as daemon_main

    argv = ["--log-level", log_level]
    for flag, value in (("--config", config), ("--socket", socket), ("--data-dir", data_dir),
                        ("--cpus", cpus), ("--memory", memory),
                        ("--simulate-gpus", simulate_gpus), ("--nvml-library", nvml_library)):
        if value is not None:
            argv += [flag, str(value)]
    sys.exit(daemon_main(argv))
