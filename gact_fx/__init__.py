"""gact-fx: activation-compressed training as a torch.compile pass.

Public names only. ``torch.compile(model, backend="gact")`` works once the package is
installed (entry point ``torch_dynamo_backends``); the rest is reached from here.
Importing this package starts neither CUDA nor Triton nor Dynamo.
"""

from .api import GactHandle, compress, decompress, report, visualize
from .config import LEVELS, GactConfig
from .controller import GactController
from .dynamo_backend import GactBackend, GactCompileError, backend_of, last_report
from .report import CompressionRecord, GraphRecord, HookStep, Report, SavedTensorRow
from .runtime.registry import manual_seed

__version__ = "0.1.0"


def backend(config: GactConfig | None = None, **options) -> GactBackend:
    """A gact backend object to pass as ``torch.compile(model, backend=...)``.

    Takes the same options as ``torch.compile(..., options={...})``; the object keeps
    the records of every graph it compiles (``.report()``).
    """
    return GactBackend(config, **options)


def controller(model) -> GactController:
    """The adaptive-bits controller of ``model``: bits and sensitivities per saved tensor,
    ``state_dict()`` / ``load_state_dict()``. Raises if ``model`` was compiled with uniform bits."""
    found = backend_of(model).controller
    if found is None:
        raise LookupError("this model was compiled with uniform bits: there is no controller (use avg_bits or level L2.x)")
    return found


__all__ = [
    "GactBackend",
    "GactCompileError",
    "GactConfig",
    "GactController",
    "CompressionRecord",
    "GactHandle",
    "LEVELS",
    "GraphRecord",
    "HookStep",
    "Report",
    "SavedTensorRow",
    "backend",
    "compress",
    "controller",
    "decompress",
    "last_report",
    "manual_seed",
    "report",
    "visualize",
]
