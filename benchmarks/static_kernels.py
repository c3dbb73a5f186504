"""The GPU kernels' machine code against the memory-speed budget, read on any machine.

Compiles every kernel variant the CUDA path launches for sm_90 (``gact_fx.bench.static_kernels``)
and writes the table to ``benchmarks/results/static_kernels.json``, which the report folds
into BENCHMARKS.md beside the GPU suite's measured kernel table.

    python benchmarks/static_kernels.py
    python benchmarks/static_kernels.py --block-sizes 2048 4096 8192 16384   # static_kernels_block_sizes.json
"""

from __future__ import annotations

import argparse
import sys

import torch
import triton

from gact_fx.bench.static_kernels import as_json, block_size_markdown, block_size_table, static_markdown, static_table

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent.parent))
from benchmarks._results import save_table  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--block-sizes", type=int, nargs="+", metavar="N",
                        help="instead: 16-bit and fp32 kernels at 2 and 4 bits, at each of these elements a program")
    args = parser.parse_args(argv)
    if args.block_sizes:
        rows = block_size_table(args.block_sizes, dtypes=(torch.bfloat16, torch.float32), widths=(2, 4))
        text = block_size_markdown(rows)
        path = save_table("static_kernels_block_sizes", text, triton=triton.__version__, rows=as_json(rows))
    else:
        rows = static_table()
        text = static_markdown(rows)
        path = save_table("static_kernels", text, triton=triton.__version__, rows=as_json(rows))
    print(text)
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
