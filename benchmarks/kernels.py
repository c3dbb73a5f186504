"""Kernel bandwidth and training-step time of gact's two lowerings, on CUDA or on the CPU.

1. GB/s of quantize and dequantize per bit width and dtype, against a device-to-device
   copy of the same tensor (the bandwidth ceiling), for the opaque ``gact::`` ops
   (Triton kernels on CUDA, the torch reference on the CPU) and for the aten lowering
   compiled by Inductor. Bytes counted: what each must read and write.
2. Step time of a BERT-like and a ResNet-50-like training step: ``torch.compile``
   (Inductor) against gact at 2 bits with each lowering, measured in the same run.

    python benchmarks/kernels.py                 # on whatever device is there
    python benchmarks/kernels.py --device cuda --numel 67108864
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time

import torch

import gact_fx
from gact_fx.runtime import format as fmt

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent.parent))
from benchmarks._results import save_table  # noqa: E402
from gact_fx.runtime import ops  # noqa: F401  (registers torch.ops.gact)


def timer(device: str):
    """Median seconds of ``fn()`` over ``repeats`` runs, after warm-up."""

    def measure(fn, repeats: int) -> float:
        for _ in range(3):
            fn()
        times = []
        for _ in range(repeats):
            if device == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(end) / 1e3)
            else:
                started = time.perf_counter()
                fn()
                times.append(time.perf_counter() - started)
        return statistics.median(times)

    return measure


def kernel_table(device: str, numel: int, repeats: int) -> list[dict]:
    from gact_fx.runtime import aten_codec

    measure = timer(device)
    rows = []
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        x = torch.randn(numel, device=device).to(dtype)
        raw = numel * x.element_size()
        copy_gbps = 2 * raw / measure(lambda: x.clone(), repeats) / 1e9
        rows.append(dict(dtype=str(dtype)[6:], bits="copy", lowering="-", op="copy", gbps=copy_gbps, of_copy=1.0))
        for bits in (1, 2, 4, 8):
            torch._dynamo.reset()  # one code object, recompiled for each width: stay under the limit
            blob_bytes = fmt.float_blob_nbytes(numel, bits, 256, x.element_size())
            seed = torch.tensor(1, device=device)
            encode_aten = torch.compile(lambda t: aten_codec.encode(t, [0], bits, 256, seed), fullgraph=True)
            blob = torch.ops.gact.quantize(x, bits, 256, [0], 0)
            decode_aten = torch.compile(lambda b: aten_codec.decode(b, [numel], dtype, 256, [0], bits), fullgraph=True)
            candidates = {
                ("op", "quantize"): lambda: torch.ops.gact.quantize(x, bits, 256, [0], 0),
                ("op", "dequantize"): lambda: torch.ops.gact.dequantize(blob, [numel], dtype, 256, [0], 0),
                ("aten", "quantize"): lambda: encode_aten(x),
                ("aten", "dequantize"): lambda: decode_aten(blob),
            }
            for (lowering, op), fn in candidates.items():
                seconds = measure(fn, repeats)
                gbps = (raw + blob_bytes) / seconds / 1e9
                rows.append(dict(dtype=str(dtype)[6:], bits=bits, lowering=lowering, op=op, gbps=gbps, of_copy=gbps / copy_gbps))
                print(f"  {rows[-1]}", file=sys.stderr, flush=True)
    return rows


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
            "gact 2 bit, op": gact_fx.backend(bits=2, compiler="inductor", lowering="op"),
            "gact 2 bit, aten": gact_fx.backend(bits=2, compiler="inductor", lowering="aten"),
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
    args = parser.parse_args(argv)
    on_cuda = args.device == "cuda"
    numel = args.numel or (1 << 26 if on_cuda else 1 << 22)
    repeats = args.repeats or (20 if on_cuda else 5)
    if not on_cuda:
        torch.set_num_threads(1)
    lines = [f"{numel} elements per tensor, median of {repeats}.\n", "| dtype | bits | lowering | op | GB/s | of copy bandwidth |", "| --- | --- | --- | --- | --- | --- |"]
    for r in kernel_table(args.device, numel, repeats):
        lines.append(f"| {r['dtype']} | {r['bits']} | {r['lowering']} | {r['op']} | {r['gbps']:.2f} | {100 * r['of_copy']:.1f}% |")
    if not args.skip_steps:
        lines += ["", "| model | method | step ms | vs torch.compile |", "| --- | --- | --- | --- |"]
        for r in step_table(args.device, "full" if on_cuda else "small", repeats):
            lines.append(f"| {r['model']} | {r['method']} | {r['step_ms']:.1f} | {r['vs_compile']:.2f}x |")
    print("\n".join(lines))
    save_table("kernels", "\n".join(lines), device=args.device)


if __name__ == "__main__":
    main()
