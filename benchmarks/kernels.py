"""Kernel bandwidth and training-step time of gact's two lowerings, on CUDA or on the CPU.

1. GB/s of quantize and dequantize per bit width and dtype, against a device-to-device
   copy of the same tensor (the bandwidth ceiling), for the opaque ``gact::`` ops
   (Triton kernels on CUDA, the torch reference on the CPU) and for the aten lowering
   compiled by Inductor. Bytes counted: what each must read and write.
2. Step time of a BERT-like and a ResNet-50-like training step: ``torch.compile``
   (Inductor) against gact at 2 bits with each lowering, measured in the same run.

    python benchmarks/kernels.py                 # on whatever device is there
    python benchmarks/kernels.py --device cuda --numel 67108864
    python benchmarks/kernels.py --skip-steps --numel 33554432 --name kernels_cpu_large
"""

from __future__ import annotations

import argparse
import copy
import sys

import torch

import gact_fx
from gact_fx.bench.methods import PLAIN_FORMAT
from gact_fx.bench.kernels import kernel_markdown, kernel_table, median_seconds

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent.parent))
from benchmarks._results import save_table  # noqa: E402


def timer(device: str):
    """Median seconds of ``fn()`` over ``repeats`` runs, after warm-up."""
    return lambda fn, repeats: median_seconds(fn, device, repeats)


def step_cases(device: str, scale: str):
    from transformers import BertConfig, BertModel, ResNetConfig, ResNetModel

    small = scale == "small"
    bert = BertModel(BertConfig(
        hidden_size=256 if small else 768, num_hidden_layers=2 if small else 12, num_attention_heads=4 if small else 12,
        intermediate_size=1024 if small else 3072, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    ))
    resnet = ResNetModel(ResNetConfig(
        layer_type="bottleneck", depths=[1, 1, 1, 1] if small else [3, 4, 6, 3],
        hidden_sizes=[256, 512, 1024, 2048], embedding_size=64,
    ))
    batch = 8 if small else 32
    ids = torch.randint(0, 1000, (batch, 128), device=device)
    images = torch.randn(batch if not small else 4, 3, 224 if not small else 96, 224 if not small else 96, device=device)
    return {
        "bert-like": (bert.to(device), lambda m: m(input_ids=ids).last_hidden_state),
        "resnet50-like": (resnet.to(device), lambda m: m(pixel_values=images).pooler_output),
    }


def step_table(device: str, scale: str, repeats: int) -> list[dict]:
    measure = timer(device)
    rows = []
    for name, (model, run) in step_cases(device, scale).items():
        methods = {
            "torch.compile": "inductor",
            "gact 2 bit, op": gact_fx.backend(bits=2, compiler="inductor", lowering="op", **PLAIN_FORMAT),
            "gact 2 bit, aten": gact_fx.backend(bits=2, compiler="inductor", lowering="aten", **PLAIN_FORMAT),
        }
        baseline = None
        for method, backend in methods.items():
            torch._dynamo.reset()
            compiled = torch.compile(copy.deepcopy(model), backend=backend)

            def step():
                out = run(compiled)
                out.float().square().mean().backward()

            seconds = measure(step, repeats)
            baseline = baseline or seconds
            rows.append(dict(model=name, method=method, step_ms=1e3 * seconds, vs_compile=seconds / baseline))
            print(f"  {rows[-1]}", file=sys.stderr, flush=True)
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--numel", type=int, default=None, help="elements per tensor (default: 64M on CUDA, 4M on CPU)")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--skip-steps", action="store_true")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads, for the codec and the copy alike")
    parser.add_argument("--name", default="kernels", help="results file: benchmarks/results/NAME.json")
    args = parser.parse_args(argv)
    on_cuda = args.device == "cuda"
    numel = args.numel or (1 << 26 if on_cuda else 1 << 22)
    repeats = args.repeats or (20 if on_cuda else 5)
    if not on_cuda:
        torch.set_num_threads(args.threads)
    rows = kernel_table(args.device, numel, repeats, progress=lambda row: print(f"  {row}", file=sys.stderr, flush=True))
    lines = [kernel_markdown(rows, numel, repeats)]
    if not args.skip_steps:
        lines += ["", "| model | method | step ms | vs torch.compile |", "| --- | --- | --- | --- |"]
        for r in step_table(args.device, "full" if on_cuda else "small", repeats):
            lines.append(f"| {r['model']} | {r['method']} | {r['step_ms']:.1f} | {r['vs_compile']:.2f}x |")
    print("\n".join(lines))
    save_table(args.name, "\n".join(lines), device=args.device)


if __name__ == "__main__":
    main()
