"""Where a host gang's Ray cluster keeps its files, through a real daemon and a real Ray:
in a directory the rank made itself (mode 0700, its owner's, a name nobody can guess),
never in a /tmp path another user could make first."""

from __future__ import annotations

import os
import shutil
import stat
import sys
from pathlib import Path

from noduslocal import testing

VENV_BIN = os.path.dirname(sys.executable)
PRINT_TEMP_DIR = ("import os, ray; ray.init(); print('gang', os.environ['NODUS_GANG']); "
                  "print('temp-dir', ray._private.worker.global_worker.node.get_temp_dir_path(),"
                  " flush=True)")


def test_a_ray_gang_uses_no_temp_dir_another_user_made_first() -> None:
    with testing.daemon(cpus=2, memory="8GiB") as d:
        c = d.client()
        # What a rank used to name its Ray temp dir (the daemon's first job, its first
        # attempt): another user makes it first, open to all.
        planted = Path(f"/tmp/nodus-ray-{os.getuid()}-1-1")
        planted.mkdir()
        planted.chmod(0o777)
        used: Path | None = None
        try:
            c.create_job({
                "name": "ray", "command": ["python", "-c", PRINT_TEMP_DIR], "cpu": "500m",
                "env": {"PATH": f"{VENV_BIN}:/usr/bin:/bin"},
                "distributed": {"nodes": 1, "gpus_per_node": 0, "launcher": "Ray",
                                "startup_timeout": "120s"}})
            done = c.wait_job("ray", timeout=180)
            log = b"".join(c.logs("ray", rank=0)).decode(errors="replace")
            assert (done["phase"], done["exit_code"]) == ("Succeeded", 0), (done, log)
            printed = [line.split(" ", 1)[1] for line in log.splitlines()
                       if line.startswith("temp-dir ")]
            assert len(printed) == 1 and "gang 1-1" in log.splitlines(), log
            used = Path(printed[0])
            assert list(planted.iterdir()) == [], "the gang wrote into the planted directory"
            own = used.parent  # Ray opens its own temp dir to everyone; its parent is ours
            assert own != planted and planted not in used.parents, used
            info = own.stat()
            assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (os.getuid(), 0o700), own
            assert own.name.startswith("nodus-ray-"), own
        finally:
            shutil.rmtree(planted, ignore_errors=True)
            if used is not None and used.parent.name.startswith("nodus-ray-"):
                shutil.rmtree(used.parent, ignore_errors=True)
