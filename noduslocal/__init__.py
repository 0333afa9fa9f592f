"""noduslocal: the Nodus Job API on one shared multi-GPU workstation.

`import noduslocal as nodus`, then `nodus.Job.run(command=[...]).wait()`. The SDK talks to
the local daemon, noduslocald, over its Unix socket.
"""

from __future__ import annotations

from noduslocal import errors
from noduslocal.client.job import Distributed, Job
from noduslocal.client.mirrors import Client
from noduslocal.client.sweep import Sweep
from noduslocal.client.view import View
from noduslocal.metrics import report

__version__ = "0.1.0"
__all__ = ["Client", "Distributed", "Job", "Sweep", "View", "__version__", "errors",
           "report"]
