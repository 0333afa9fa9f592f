"""noduslocal: the Nodus Job API on one shared multi-GPU workstation.

`import noduslocal as nodus`, then `nodus.Job.run(command=[...]).wait()`. The SDK talks to
the local daemon, noduslocald, over its Unix socket.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:  # for type checkers; at run time each is imported when first used
    from typing import Any

    from noduslocal.domain import errors
    from noduslocal.domain.metrics import report
    from noduslocal.sdk.client import Client
    from noduslocal.sdk.job import Distributed, Job
    from noduslocal.sdk.sweep import Sweep
    from noduslocal.sdk.view import View

__version__ = "0.1.0"
__all__ = ["Client", "Distributed", "Job", "Sweep", "View", "__version__", "errors",
           "report"]
# Imported on first use: `import noduslocal` (and every CLI command, which lives in this
# package) pays for none of the SDK's modules it does not touch.
_LAZY = {"Client": "noduslocal.sdk.client", "Distributed": "noduslocal.sdk.job",
         "Job": "noduslocal.sdk.job", "Sweep": "noduslocal.sdk.sweep",
         "View": "noduslocal.sdk.view", "errors": "noduslocal.domain.errors",
         "report": "noduslocal.domain.metrics"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'noduslocal' has no attribute {name!r}")
    loaded = __import__(module, fromlist=["_"])  # importlib's own import costs 1 ms
    value = loaded if name == "errors" else getattr(loaded, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
