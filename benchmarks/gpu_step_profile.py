"""Where a training step's time goes on a GPU: gact against torch.compile on the GPU suite's
Llama-like model, under the CUDA profiler.

    python benchmarks/gpu_step_profile.py --out DIR [--program 16384/8192] [--seconds 340]
        [--plan resnet50:"gact 2 bit" ...]

For each method (``--methods``): the median of ``STEPS`` steps at ``--program`` elements a Triton
program (16-bit inputs/the others) and, for gact, at the kernels' own sizes in the same
process; then three steps under ``torch.profiler``: device time a step (every kernel's own
time, added up), host time a step (every op's own CPU time, added up), and kernel launches a
step, with the profiler's tables (by device time, by host time) written to DIR. A step whose
host time exceeds its device time waits on the CPU: its Python and launches, not its kernels.
Then, with the time left, the GPU suite's models part runs ``--plan``'s (model, method) rows,
at ``--program`` too.
Writes DIR/gpu_step_profile.json with a Markdown table. Needs CUDA; ``--device cpu`` runs the
same code small (tiny models), as its test does.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

STEPS = 8  # timed steps a median


def _profiled(runner, inputs, device: str, out: pathlib.Path, stem: str) -> dict:
    from gact_fx.bench.gpu_workloads import device_time_key, profiled_step

    device_ms, host_ms, launches, events = profiled_step(lambda: runner.step(inputs), device)
    (out / f"{stem}_by_device_time.txt").write_text(
        events.table(sort_by=device_time_key(events), row_limit=40, max_name_column_width=70))
    (out / f"{stem}_by_host_time.txt").write_text(
        events.table(sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=70))
    return {"device_ms": device_ms, "host_ms": host_ms, "launches": launches}


def stem(method: str) -> str:
    """The file name stem of a method's profiler tables."""
    return "profile_" + method.replace(", ", "_").replace(" ", "_")


def profile_methods(device: str, methods: list[str], program: tuple[int, int], out: pathlib.Path) -> tuple[int, dict]:
    """(the batch, each method's row)."""
    from gact_fx.bench.gpu_workloads import _Runner, median_step_ms, short_error, workloads
    from gact_fx.bench.kernels import at_program
    from gact_fx.bench.methods import GPU_METHODS

    workload = {w.name: w for w in workloads(device, "full" if device == "cuda" else "tiny")}["llama-like"]
    torch.manual_seed(0)
    base = workload.build()
    inputs = workload.batch(workload.default_batch)
    rows = {}
    for name in methods:
        method = GPU_METHODS[name]
        runner = None
        try:
            with method.patches(), at_program(program):
                runner = _Runner(workload, method, base, device, "inductor")
                for _ in range(3):
                    runner.step(inputs)
                row = {"step_ms": median_step_ms(runner, inputs, STEPS)}
                if method.gact is not None:
                    with at_program(None):
                        row["step_ms_own_program"] = median_step_ms(runner, inputs, STEPS)
                row.update(_profiled(runner, inputs, device, out, stem(name)))
        except Exception as error:  # recorded: one broken method must not cost a GPU run the rest
            row = {"error": short_error(error)}
        rows[name] = row
        del runner
        torch._dynamo.reset()
        if device == "cuda":
            torch.cuda.empty_cache()
    return workload.default_batch, rows


def markdown(result: dict) -> str:
    program = result["program"]
    own = result.get("own_elements", "-")
    lines = [f"The Llama-like model of the GPU suite, batch {result.get('batch', '?')}, bf16 autocast. Steps at "
             f"{program} elements a program (16-bit inputs/the others), and for gact also at the kernels' own "
             f"({own}; narrow/wide) in the same process; device and host time a step from the profiler (three steps).\n",
             f"| method | step ms at {program} | step ms at own | device ms a step | host ms a step "
             "| kernel launches a step |", "| --- | --- | --- | --- | --- | --- |"]
    for name, row in result["profile"].items():
        if "error" in row:
            lines.append(f"| {name} | {row['error']} | | | | |")
            continue
        own = row.get("step_ms_own_program")
        device_ms = row["device_ms"]
        lines.append(f"| {name} | {row['step_ms']:.1f} | {'-' if own is None else f'{own:.1f}'} | "
                     f"{'-' if device_ms is None else f'{device_ms:.1f}'} | {row['host_ms']:.1f} | {row['launches']:.0f} |")
    models = result.get("models", {}).get("rows")
    if models:
        from gact_fx.bench.gpu_suite import models_markdown

        lines += ["", "The GPU suite's models part, for these rows:\n", *models_markdown(result["models"])[1:]]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--methods", nargs="+", default=["torch.compile", "gact 2 bit", "gact 2 bit, Triton lowering"])
    parser.add_argument("--program", default="16384/8192",
                        help="elements a program, 16-bit inputs/the others (default: every kernel's size before each took its own)")
    parser.add_argument("--plan", nargs="*", default=[], help="model:method rows of the models part, after the profile")
    parser.add_argument("--seconds", type=float, default=340.0, help="when the models rows stop starting")
    args = parser.parse_args()
    deadline = time.monotonic() + args.seconds
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True  # as the GPU suite trains
        torch.backends.cudnn.allow_tf32 = True
    from gact_fx.bench import gpu_suite
    from gact_fx.bench.kernels import at_program
    from gact_fx.bench.metadata import metadata

    program = tuple(int(n) for n in args.program.split("/"))
    from gact_fx.runtime.program_sizes import own_sizes_text

    result = {"meta": metadata(args.device), "program": args.program, "own_elements": own_sizes_text()}
    result["meta"]["command"] = "python benchmarks/gpu_step_profile.py " + " ".join(sys.argv[1:])
    result["batch"], result["profile"] = profile_methods(args.device, args.methods, program, out)
    if args.plan:  # at --program too
        plan = [tuple(entry.split(":", 1)) for entry in args.plan]
        with at_program(program):
            result["models"] = gpu_suite._models_part(out, deadline, args.device,
                                                      "full" if args.device == "cuda" else "tiny", "inductor", program,
                                                      plan=plan)
    result["markdown"] = markdown(result)
    (out / "gpu_step_profile.json").write_text(json.dumps(result, indent=1))
    print(result["markdown"])


if __name__ == "__main__":
    main()
