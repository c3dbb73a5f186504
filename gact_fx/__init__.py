"""gact-fx: activation-compressed training as a torch.compile pass.

Public names only. ``torch.compile(model, backend="gact")`` works once the package is
installed (entry point ``torch_dynamo_backends``); the rest is reached from here.
Importing this package starts neither CUDA nor Triton nor Dynamo.
"""

from .config import GactConfig
from .dynamo_backend import GactBackend, GactCompileError, last_report
from .report import GraphRecord, Report, SavedTensorRow
from .runtime.seeds import manual_seed

__version__ = "0.1.0"


def backend(config: GactConfig | None = None, **options) -> GactBackend:
    """A gact backend object to pass as ``torch.compile(model, backend=...)``.

    Takes the same options as ``torch.compile(..., options={...})``; the object keeps
    the records of every graph it compiles (``.report()``).
    """
    return GactBackend(config, **options)


__all__ = [
    "GactBackend",
    "GactCompileError",
    "GactConfig",
    "GraphRecord",
    "Report",
    "SavedTensorRow",
    "backend",
    "last_report",
    "manual_seed",
]
