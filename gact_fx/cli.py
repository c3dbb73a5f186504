"""The ``gact-fx`` command: ``viz`` (the graph viewer) and ``bench`` (the benchmark suite).

    gact-fx viz examples/viz_models.py:transformer_block --out block.html
    gact-fx viz my_model.py:build --format dot --out graph.dot --option bits=2
    gact-fx bench --quick --out /tmp/bench
    gact-fx bench --gpu-suite --out /tmp/gpu
    gact-fx bench --markdown BENCHMARKS.md

A model spec is ``FILE.py:FUNCTION``; the function returns ``(model, example_inputs)`` or
``(model, example_inputs, loss_fn)``.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import logging
import pathlib
import sys
import tempfile

log = logging.getLogger("gact_fx")


def load_factory(spec: str):
    path, _, name = spec.rpartition(":")
    if not path or not name:
        raise SystemExit(f"gact-fx: expected FILE.py:FUNCTION, got {spec!r}")
    file = pathlib.Path(path)
    if not file.is_file():
        raise SystemExit(f"gact-fx: no such file {file}")
    module_spec = importlib.util.spec_from_file_location(file.stem, file)
    module = importlib.util.module_from_spec(module_spec)
    sys.path.insert(0, str(file.parent.resolve()))
    sys.modules[module_spec.name] = module  # dataclasses and pickle look the module up by name
    module_spec.loader.exec_module(module)
    try:
        return getattr(module, name)
    except AttributeError:
        raise SystemExit(f"gact-fx: {file} has no function {name!r}") from None


def parse_options(pairs: list[str]) -> dict:
    options = {}
    for pair in pairs:
        key, separator, value = pair.partition("=")
        if not separator:
            raise SystemExit(f"gact-fx: options are KEY=VALUE, got {pair!r}")
        try:
            options[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            options[key] = value
    return options


def viz(args) -> int:
    import gact_fx

    built = load_factory(args.model)()
    model, inputs, loss = (tuple(built) + (None,))[:3]
    inputs = inputs if isinstance(inputs, (tuple, list)) else (inputs,)
    log.info("gact-fx viz: compiling %s and running one training step", type(model).__name__)
    text = gact_fx.visualize(model, *inputs, path=args.out, format=args.format, title=args.title, loss=loss, **parse_options(args.option))
    if args.out is None:
        sys.stdout.write(text)
    else:
        print(f"wrote {args.out}")
    return 0


def bench(args) -> int:
    if args.out is None:
        if args.report_only:
            print("gact-fx bench: --report-only reads the result files of --out DIR: give it", file=sys.stderr)
            return 2
        args.out = tempfile.mkdtemp(prefix="gact-fx-bench-")  # never a checkout's committed results
        print(f"gact-fx bench: writing to {args.out}", file=sys.stderr)
    if args.gpu_suite:
        from .bench.gpu_suite import main as run_gpu_suite

        return run_gpu_suite(args)
    from .bench.suite import main as run_bench

    return run_bench(args)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="gact-fx", description="activation-compressed training for torch.compile")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress (INFO)")
    commands = parser.add_subparsers(dest="command", required=True)
    viz_parser = commands.add_parser("viz", help="render what gact does to a model (HTML, DOT or text)")
    viz_parser.add_argument("model", help="FILE.py:FUNCTION returning (model, example_inputs[, loss_fn])")
    viz_parser.add_argument("--out", help="output file (.html, .dot); text to stdout when omitted")
    viz_parser.add_argument("--format", choices=("html", "dot", "text"), help="default: from --out's suffix")
    viz_parser.add_argument("--title")
    viz_parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", help="a gact option, e.g. bits=2")
    viz_parser.set_defaults(run=viz)
    bench_parser = commands.add_parser("bench", help="memory, speed and accuracy of gact against the alternatives")
    bench_parser.add_argument("--quick", action="store_true", help="a minute-long smoke run (tiny models, eager path)")
    bench_parser.add_argument("--gpu-suite", action="store_true", help="every GPU measurement in one command, in 6 "
                              "minutes: the GPU tests, the kernel table, and step time, peak memory, activation bytes "
                              "and predicted max batch of a 0.4B Llama-like model and ResNet-50 (needs CUDA)")
    bench_parser.add_argument("--models", nargs="+", help="zoo entries (default: all; --quick: cnn gpt2)")
    bench_parser.add_argument("--sizes", nargs="+", help="tiny small base large (default: tiny on CPU)")
    bench_parser.add_argument("--methods", nargs="+", help="method names (default: all); the accuracy runs train those of "
                              "them among torch.compile, gact 8/4/2 bit, gact L2, gact L2.2 and fp8")
    bench_parser.add_argument("--tasks", nargs="+", help="accuracy tasks: mnist1d digits karate charlm (default: all; --quick: digits)")
    bench_parser.add_argument("--skip-accuracy", action="store_true")
    bench_parser.add_argument("--steps", type=int, help="timed steps per measurement")
    bench_parser.add_argument("--device", choices=("cpu", "cuda"))
    bench_parser.add_argument("--out", help="directory for JSON, CSV and figures (default: a new temporary one)")
    bench_parser.add_argument("--markdown", help="report to write (default: OUT/BENCHMARKS.md)")
    bench_parser.add_argument("--report-only", action="store_true", help="measure nothing: write the report from the "
                              "result files already in OUT (e.g. after --gpu-suite)")
    bench_parser.set_defaults(run=bench)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    return args.run(args)


if __name__ == "__main__":
    raise SystemExit(main())
