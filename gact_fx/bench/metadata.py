"""Where and how a benchmark result was produced: device, torch version, commit, date, command."""

from __future__ import annotations

import datetime
import os
import pathlib
import platform
import shlex
import subprocess
import sys

import torch

from ..runtime import format as fmt


def device_name(device: str) -> str:
    if device == "cuda":
        return torch.cuda.get_device_name()
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            model = next(line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"CPU: {model}, {os.cpu_count()} cores, {torch.get_num_threads()} torch thread(s)"


def commit() -> str | None:
    """The checkout's commit (``+dirty`` with uncommitted changes), or None outside a git checkout."""
    root = pathlib.Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                              text=True, timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return head.stdout.strip() + ("+dirty" if dirty else "")


def metadata(device: str = "cpu", command: list[str] | None = None) -> dict:
    return {
        "device": device_name(device),
        "torch": torch.__version__,
        "commit": commit(),
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": shlex.join(command if command is not None else [os.path.basename(sys.argv[0]), *sys.argv[1:]]),
        "metadata_bytes_per_group": fmt.METADATA_BYTES_PER_GROUP,  # the format's, for the limits of its tables
    }
