"""Peak step memory on the CPU for the zoo's transformers at base width: gact against torch.compile.

Each model (BERT, GPT-2, Llama from transformers configs, hidden 768, 12 heads) trains one
step per method while the caller keeps only the loss. Peak: the largest sum of live
allocations during the step above what was live before it (the CPU profiler's memory
events), so the parameters are left out and their gradients are in. Saved: what autograd
holds for the backward after the forward (saved-tensor hooks, parameters and buffers
left out). The gradients (4 bytes per parameter) are a floor no activation method lowers,
so the peak is also shown without them. Step time: median of the timed steps, as a ratio to torch.compile in the same
run. Every method uses the same compiler (``--compiler``; ``eager`` runs the partitioned
graphs as Python, minutes instead of an hour on two cores).

    python benchmarks/cpu_peak_memory.py                      # 4 layers, batch 4 x 256 tokens
    python benchmarks/cpu_peak_memory.py --batch 8 --methods torch.compile "gact 2 bit" --name cpu_peak_memory_batch8
    python benchmarks/cpu_peak_memory.py --layers 12 --sequence 512 --batch 16 --steps 1 \
        --methods torch.compile "gact 2 bit" --name cpu_peak_memory_base   # the zoo's base size: 40 minutes

Fewer layers than the 12 of base size keep the ratio of saved activations to gradients
but not the part of the peak that is one layer's backward working set, which does not
grow with depth: 4 layers understate the whole-peak ratio a 12-layer model would show
(4.6-5.9x at the zoo's full base size, against 2.0-2.6x at 4 layers and batch 4).
"""

from __future__ import annotations

import argparse
import gc
import pathlib
import sys

import torch

from gact_fx.bench import measure as bench_measure
from gact_fx.bench.methods import ALL
from gact_fx.bench.zoo import TEXT_VOCAB, checkpoint_blocks, text_model
from gact_fx.measure import saved_activation_bytes

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from benchmarks._results import save_table  # noqa: E402

METHODS = ("torch.compile", "gact 8 bit", "gact 4 bit", "gact 2 bit", "budget 0.0", "checkpoint")


def run(kind: str, method_name: str, args) -> dict:
    method = ALL[method_name]
    torch.manual_seed(0)
    model = text_model(kind, args.layers, hidden=768, heads=12, sequence=args.sequence)
    if method.checkpoint:
        checkpoint_blocks(model)
    model.train()
    ids = torch.randint(0, TEXT_VOCAB, (args.batch, args.sequence), generator=torch.Generator().manual_seed(0))
    row = dict(model=kind, method=method_name, gradient_bytes=sum(p.numel() * p.element_size() for p in model.parameters()))
    with method.patches():
        backend = method.backend(args.compiler)
        compiled = torch.compile(model, backend=backend)

        def step():
            model.zero_grad(set_to_none=True)
            compiled(ids).float().square().mean().backward()

        row["first_step_s"], row["step_ms"] = bench_measure.time_training(
            step, device="cpu", steps=args.steps, warming=lambda: bench_measure.probing(backend))
        model.zero_grad(set_to_none=True)
        row["saved_bytes"] = saved_activation_bytes(compiled, ids)
        row["peak_bytes"] = bench_measure._cpu_step_peak(step)
    del model, compiled
    gc.collect()
    torch._dynamo.reset()
    return row


def markdown(rows: list[dict], args) -> str:
    lines = [
        f"Base width (hidden 768, 12 heads), {args.layers} layers, batch {args.batch} x {args.sequence} tokens, compiler "
        f"{args.compiler}, one thread, median of {args.steps} steps.\n",
        "| model | method | saved for backward | peak step memory | peak vs torch.compile | peak less the gradients | "
        "that vs torch.compile | step ms | step vs torch.compile |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for kind in dict.fromkeys(r["model"] for r in rows):
        group = [r for r in rows if r["model"] == kind]
        base = next((r for r in group if r["method"] == "torch.compile" and "error" not in r), None)
        for r in group:
            if "error" in r:
                lines.append(f"| {kind} | {r['method']} | failed: {r['error']} | | | | | | |")
                continue
            peak_ratio = f"{base['peak_bytes'] / r['peak_bytes']:.2f}x smaller" if base else "-"
            rest, base_rest = r["peak_bytes"] - r["gradient_bytes"], base["peak_bytes"] - base["gradient_bytes"] if base else None
            rest_ratio = f"{base_rest / rest:.2f}x smaller" if base else "-"
            time_ratio = f"{r['step_ms'] / base['step_ms']:.2f}x" if base else "-"
            lines.append(f"| {kind} | {r['method']} | {r['saved_bytes'] / 2**20:.1f} MiB | {r['peak_bytes'] / 2**20:.1f} MiB | "
                         f"{peak_ratio} | {rest / 2**20:.1f} MiB | {rest_ratio} | {r['step_ms']:.0f} | {time_ratio} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["bert", "gpt2", "llama"], choices=["bert", "gpt2", "llama"])
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(ALL))
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--sequence", type=int, default=256)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--compiler", default="eager", choices=["eager", "inductor"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--name", default="cpu_peak_memory", help="results file: benchmarks/results/NAME.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = []
    for kind in args.models:
        for name in args.methods:
            print(f"{kind}: {name}", file=sys.stderr, flush=True)
            try:
                rows.append(run(kind, name, args))
            except Exception as error:  # recorded in the table; the others go on
                rows.append(dict(model=kind, method=name, error=f"{type(error).__name__}: {error}".splitlines()[0][:160]))
            print(f"  {rows[-1]}", file=sys.stderr, flush=True)
    table = markdown(rows, args)
    print(table)
    save_table(args.name, table, rows=rows, options=vars(args))


if __name__ == "__main__":
    main()
