"""Host jobs' mount namespaces, daemon side: whether this daemon can give each host job one
(root, and the host's /workspace an empty root-owned directory to bind over, made at start)
and what a job's holds: its workspace at /workspace, its volumes and a checkpoint outside the
workspace at their paths, other grants' GPU nodes hidden where no devices cgroup denies them.
The shim (shim.py, shim.c) makes it in the job's child; runtime.py puts it in the request.
"""

from __future__ import annotations

import contextlib
import os
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from noduslocal.daemon.files.layout import JobLayout
from noduslocal.domain.job_paths import CONTAINER_ROOT, in_workspace
from noduslocal.domain.jobs import JobRecord

HOST_ROOT = Path(CONTAINER_ROOT)  # the mount point on the host: made empty, root's, 0755
HIDDEN_NODE = "hidden-device"  # in the data dir: the empty 0000 file bound over a GPU node
GPU_NODE = "/dev/nvidia{minor}"  # the node of the GPU of that minor number (major 195)


@dataclass(frozen=True)
class Namespaces:
    """`enabled`: each host job gets a mount namespace of its own; else `why` says why not
    (host jobs then see the host's paths: their workspace where it lies, volumes as links
    in it). `hide_with`: the empty file bound over device nodes a job may not open."""

    enabled: bool
    why: str = ""
    hide_with: str = ""

    @classmethod
    def prepare(cls, data_dir: Path, root: Path = HOST_ROOT) -> Namespaces:
        """At the daemon's start: probe that a namespace can be made, and make the host's
        /workspace (empty, root's, 0755) to bind each job's workspace over, or find it so.
        Never writes into it, and refuses one that holds anything or is not root's."""
        if os.geteuid() != 0:
            return cls(False, "the daemon is not root, so it cannot make mount namespaces "
                              "(CAP_SYS_ADMIN)")
        try:
            probe = subprocess.run(["unshare", "--mount", "true"], capture_output=True,
                                   text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return cls(False, f"util-linux's unshare could not be run ({exc}); install "
                              "util-linux")
        if probe.returncode != 0:
            return cls(False, "this box refuses a new mount namespace: "
                              f"{probe.stderr.strip() or probe.returncode}")
        if why := _claim(root):
            return cls(False, why)
        hidden = data_dir / HIDDEN_NODE
        with contextlib.suppress(FileExistsError):
            os.close(os.open(hidden, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0))
        os.chown(hidden, 0, 0)
        os.chmod(hidden, 0)
        return cls(True, hide_with=str(hidden))

    def describe(self) -> str:
        if not self.enabled:
            return (f"host jobs run without a mount namespace ({self.why}): they see the "
                    "host's paths, /workspace is not theirs, and a volume or checkpoint "
                    "outside /workspace is refused at their start")
        return (f"each host job has a mount namespace of its own: its workspace bound at "
                f"{HOST_ROOT} (an empty root-owned directory on the host), its volumes and "
                "checkpoint at their paths")

    def request(self, layout: JobLayout, job: JobRecord,
                hidden_minors: list[int]) -> dict[str, Any]:
        """The shim's request fields for the job's namespace: what to bind where (parents
        first), the GPU nodes to hide, and whether setuid programs may raise privileges."""
        mounts = [[str(layout.workspace(job.id)), str(HOST_ROOT)]]
        spec = job.spec
        outside: list[list[str]] = []
        checkpoint = layout.checkpoint_dir(job)
        if checkpoint is not None and spec.checkpoint and in_workspace(spec.checkpoint) is None:
            outside.append([str(checkpoint), spec.checkpoint])
        for path, name in spec.volumes.items():
            if in_workspace(path) is None:  # those under /workspace are links in it
                outside.append([str(layout.volume_dir(name)), path])
        hide = [node for minor in hidden_minors
                if os.path.exists(node := GPU_NODE.format(minor=minor))]
        return {
            "mounts": mounts + sorted(outside, key=lambda m: m[1]),
            "hide": hide, "hide_with": self.hide_with if hide else "",
            # A job's own directory over a host path (/etc, say) must not feed a setuid
            # program its files: with one, setuid and file capabilities grant nothing.
            "no_new_privs": bool(outside) and job.owner_uid != 0,
        }


def _claim(root: Path) -> str:
    """Make `root` empty, root's and 0755, or say why an existing one is not used."""
    try:
        root.mkdir(mode=0o755)
        os.chmod(root, 0o755)  # not narrowed by the umask: every owner's job enters it
        return ""
    except FileExistsError:
        pass
    except OSError as exc:
        return f"{root} could not be made on the host: {exc.strerror}"
    try:
        info = root.lstat()
        empty = not any(os.scandir(root)) if stat.S_ISDIR(info.st_mode) else False
    except OSError as exc:
        return f"{root} on the host cannot be read: {exc.strerror}"
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != 0 or not empty:
        return (f"{root} on the host exists and is not an empty root-owned directory; "
                "host jobs' workspaces are bound over it, so move what it holds away "
                f"(or remove it) and restart the daemon")
    return ""
