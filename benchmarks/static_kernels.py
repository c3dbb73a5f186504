"""The GPU kernels' machine code against the memory-speed budget, read on any machine.

Compiles every kernel variant the CUDA path launches for sm_90 (``gact_fx.bench.static_kernels``)
and writes the table to ``benchmarks/results/static_kernels.json``, which the report folds
into BENCHMARKS.md beside the GPU suite's measured kernel table.

    python benchmarks/static_kernels.py
"""

from __future__ import annotations

import sys

import triton

from gact_fx.bench.static_kernels import as_json, static_markdown, static_table

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent.parent))
from benchmarks._results import save_table  # noqa: E402


def main() -> int:
    rows = static_table()
    path = save_table("static_kernels", static_markdown(rows), triton=triton.__version__, rows=as_json(rows))
    print(static_markdown(rows))
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
