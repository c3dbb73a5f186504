"""CPU step time and compile time of the gact backend against the same path without it.

One thread, median of several steps after warm-up, ratios against a baseline measured
in the same run. Prints a Markdown table (and writes JSON with --json).

    python benchmarks/cpu_step_time.py                     # all models, both compilers
    python benchmarks/cpu_step_time.py --models fashion-cnn char-gpt --compilers eager --bits 2
    python benchmarks/cpu_step_time.py --models block --compilers eager
    python benchmarks/cpu_step_time.py --models char-gpt --bits 2 --feature-groups --name cpu_step_time_feature_groups
    python benchmarks/cpu_step_time.py --models char-gpt block --compilers inductor --bits 3 --rotation 32 --name cpu_step_time_rotation
    python benchmarks/cpu_step_time.py --models char-gpt block --compilers inductor --bits 3 --dithered --name cpu_step_time_dithered
    python benchmarks/cpu_step_time.py --models char-gpt block --compilers inductor --bits 3 --dithered --debiased --name cpu_step_time_debiased
    python benchmarks/cpu_step_time.py --models char-gpt block --compilers inductor --bits 3 --dithered --projections --name cpu_step_time_projections
"""

from __future__ import annotations

import argparse
import copy
import pathlib
import statistics
import sys
import time

import torch
import torch.nn as nn

import gact_fx
from gact_fx.bench.methods import PLAIN_FORMAT
from gact_fx.bench.tasks import CharGPT

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from benchmarks._results import save_table  # noqa: E402
from tests.helpers import ConvBlock, MLP, TransformerBlock, projection_loss, tiny_bert  # noqa: E402


def fashion_cnn() -> nn.Module:
    """A small CNN for 28x28 grey images (Fashion-MNIST-like), as in the issue's measurement."""
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10),
    )


def cases():
    torch.manual_seed(0)
    return {
        "mlp": (MLP(width=1024), (torch.randn(256, 64),)),
        "block": (TransformerBlock(dim=128), (torch.randn(16, 64, 128),)),
        "conv": (ConvBlock(channels=32), (torch.randn(32, 3, 32, 32),)),
        "bert": (tiny_bert(), (torch.randint(0, 128, (16, 64)),)),
        "fashion-cnn": (fashion_cnn(), (torch.randn(128, 1, 28, 28),)),  # batch 128
        "char-gpt": (CharGPT(), (torch.randint(0, 256, (32, 128)),)),  # the char LM task's model and batch
    }


def measure(model, inputs, backend, steps):
    torch._dynamo.reset()
    model = copy.deepcopy(model)
    compiled = torch.compile(model, backend=backend)
    started = time.perf_counter()
    projection_loss(compiled(*inputs)).backward()
    compile_seconds = time.perf_counter() - started
    for _ in range(3):
        projection_loss(compiled(*inputs)).backward()
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        model.zero_grad(set_to_none=True)
        projection_loss(compiled(*inputs)).backward()
        times.append(time.perf_counter() - started)
    return compile_seconds, statistics.median(times)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["fashion-cnn", "char-gpt", "mlp", "block", "conv", "bert"])
    parser.add_argument("--compilers", nargs="+", default=["eager", "inductor"])
    parser.add_argument("--bits", nargs="+", type=int, default=[8, 2])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--lowering", default="op", choices=("op", "aten"), help="gact's lowering (aten: Inductor only)")
    parser.add_argument("--feature-groups", action="store_true", help="also measure each width with feature_groups=True")
    parser.add_argument("--rotation", type=int, default=0, help="also measure each width with this rotation block")
    parser.add_argument("--dithered", action="store_true", help="also measure each width with rounding='dithered'")
    parser.add_argument("--debiased", action="store_true", help="also measure each width dithered with query and key "
                        "at 4 bits, without and with debias_attention")
    parser.add_argument("--projections", action="store_true", help="also measure each width with "
                        "recompute_projections (dithered, with --dithered)")
    parser.add_argument("--name", default="cpu_step_time", help="results file stem")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows = []
    all_cases = cases()
    for name in args.models:
        model, inputs = all_cases[name]
        for compiler in args.compilers:
            if compiler == "eager" and args.lowering == "aten":
                continue
            base_compile, base_step = measure(model, inputs, gact_fx.backend(enabled=False, compiler=compiler), args.steps)
            rows.append(dict(model=name, compiler=compiler, bits="off", compile_s=base_compile, step_ms=1e3 * base_step, ratio=1.0))
            print(f"{name} {compiler} off: {1e3 * base_step:.1f} ms", file=sys.stderr, flush=True)
            variants = {"": {}}
            if args.feature_groups:
                variants[", feature groups"] = {"feature_groups": True}
            if args.rotation:
                variants[f", rotation {args.rotation}"] = {"rotation": args.rotation}
            if args.dithered:
                variants[", dithered"] = {"rounding": "dithered"}
            if args.debiased:
                floor4 = {"rounding": "dithered", "nonlinear_bits": 4}
                variants[", dithered, query and key at 4"] = floor4
                variants[", dithered, query and key at 4, debiased"] = floor4 | {"debias_attention": True}
            if args.projections:
                dithered = {"rounding": "dithered"} if args.dithered else {}
                variants[", dithered" * bool(dithered) + ", projections rebuilt"] = dithered | {"recompute_projections": True}
            for bits in args.bits:
                for suffix, options in variants.items():
                    backend = gact_fx.backend(bits=bits, compiler=compiler, lowering=args.lowering,
                                              **{**PLAIN_FORMAT, **options})
                    label = f"{bits}{suffix}" if suffix else bits
                    compile_s, step = measure(model, inputs, backend, args.steps)
                    rows.append(dict(model=name, compiler=compiler, bits=label, compile_s=compile_s, step_ms=1e3 * step,
                                     ratio=step / base_step))
                    print(f"{name} {compiler} {label}: {1e3 * step:.1f} ms", file=sys.stderr, flush=True)
    lines = [f"One thread, median of {args.steps} steps; lowering {args.lowering}.\n",
             "| model | compiler | gact bits | first call (compile) s | step ms | step vs gact off |", "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['compiler']} | {r['bits']} | {r['compile_s']:.1f} | {r['step_ms']:.1f} | {r['ratio']:.2f}x |")
    lines += break_even(rows)
    print("\n".join(lines))
    save_table(args.name, "\n".join(lines), rows=rows)


def break_even(rows: list[dict]) -> list[str]:
    """``compiler="auto"`` on the CPU: after how many steps gact under Inductor (slower to
    compile, faster per step) overtakes gact on the eager path, per model and width."""
    lines = ["", "compiler='auto' takes Inductor on the CPU (GACT_FX_COMPILER=eager, the eager path). Steps after which "
             "Inductor's longer compile pays off:", "",
             "| model | gact bits | eager: compile s, step ms | inductor: compile s, step ms | Inductor pays off after |",
             "| --- | --- | --- | --- | --- |"]
    by_key = {(r["model"], r["compiler"], r["bits"]): r for r in rows}
    for (model, compiler, bits), eager in by_key.items():
        inductor = by_key.get((model, "inductor", bits))
        if compiler != "eager" or bits == "off" or inductor is None:
            continue
        saved_ms = eager["step_ms"] - inductor["step_ms"]
        extra_s = inductor["compile_s"] - eager["compile_s"]
        verdict = "never (no faster per step)" if saved_ms <= 0 else f"{max(0, 1e3 * extra_s / saved_ms):.0f} steps"
        lines.append(f"| {model} | {bits} | {eager['compile_s']:.1f}, {eager['step_ms']:.1f} | "
                     f"{inductor['compile_s']:.1f}, {inductor['step_ms']:.1f} | {verdict} |")
    return lines


if __name__ == "__main__":
    main()
