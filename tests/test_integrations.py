"""Where users bring gact-fx: any module, an outer torch.compile around compress(), the
reports they read, and the training frameworks (the README's recipes, run as written).

Each of the first five tests here failed before this file existed: compress() of an
``nn.Sequential`` on torch 2.13, ``torch.compile(compress(m))`` of a model with a graph
break, and three reports that raised "run one step first" after steps had run or spoke
only in FX node names.
"""

import copy
import importlib.util
import logging
import os
import pathlib
import re
import subprocess
import sys

import pytest
import torch
import torch.nn as nn

import gact_fx

from .helpers import flat_grad, projection_loss, relative_error

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
log = logging.getLogger("tests.integrations")


def plain_grad(model, x):
    model = copy.deepcopy(model)
    projection_loss(model(x)).backward()
    return flat_grad(model)


@pytest.mark.compat
@pytest.mark.parametrize("build", [
    lambda: nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 10)),
    lambda: nn.Linear(64, 256),
    lambda: nn.ModuleList([nn.Linear(64, 64)])[0],
], ids=["sequential", "linear", "from-a-container"])
def test_compress_trains_any_module_on_every_supported_torch(build):
    torch.manual_seed(0)
    model, x = build(), torch.randn(64, 64)
    expected = plain_grad(model, x)
    compressed = gact_fx.compress(copy.deepcopy(model), bits=8, min_numel=0)
    projection_loss(compressed(x)).backward()
    assert compressed.gact.mode == "compiled"
    assert gact_fx.report(compressed).num_compressed >= 1
    assert 0 < relative_error(flat_grad(compressed), expected) < 2e-2


class LogsInForward(nn.Module):
    """A graph break in the middle: a logging call Dynamo does not trace."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(64, 256), nn.Linear(256, 10)

    def forward(self, x):
        hidden = torch.relu(self.a(x))
        log.warning("a graph break: %s", "print-like side effect")
        print("", end="")
        return self.b(hidden)


@pytest.mark.compat
@pytest.mark.parametrize("outer", ["inductor", "eager", "gact"])
def test_an_outer_torch_compile_around_compress_keeps_gacts_compile(outer):
    # What the HF Trainer's and Lightning's torch_compile options do to a compressed model:
    # the outer compile must neither crash (it did, in the graph-break accounting) nor take
    # the model over with its own backend (it would compress nothing).
    torch.manual_seed(0)
    model, x = LogsInForward(), torch.randn(32, 64)
    expected = plain_grad(model, x)
    compressed = gact_fx.compress(copy.deepcopy(model), bits=8, min_numel=0)
    outer_backend = "inductor" if outer == "inductor" else outer
    compiled = torch.compile(compressed, backend=outer_backend)
    for _ in range(2):
        compressed.zero_grad(set_to_none=True)
        projection_loss(compiled(x)).backward()
    assert compressed.gact.mode == "compiled"
    records = gact_fx.report(compiled).records
    assert len(records) == 2 and all(r.compressions for r in records)  # both sides of the break, by gact
    assert 0 < relative_error(flat_grad(compressed), expected) < 2e-2


def test_graph_break_accounting_never_fails_a_step(monkeypatch):
    from gact_fx import _compat

    class Broken(dict):
        def __getitem__(self, key):
            raise RuntimeError("a torch that keeps its counters elsewhere")

    utils = sys.modules["torch._dynamo.utils"] if "torch._dynamo.utils" in sys.modules else None
    if utils is None:
        import torch._dynamo.utils as utils
    monkeypatch.setattr(utils, "counters", Broken())
    assert _compat.graph_break_counts() == {}


class Untraceable(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))

    @torch.compiler.disable
    def forward(self, x):
        return self.net(x)


def test_a_model_that_trained_uncompressed_gets_a_report_that_says_so_and_why():
    torch._dynamo.utils.counters.clear()  # the report quotes the process's graph breaks: only this test's
    model = Untraceable()
    compiled = torch.compile(model, backend="gact")
    projection_loss(compiled(torch.randn(8, 64))).backward()
    report = gact_fx.report(compiled)
    assert not report.records and not report.compressed_anything
    text = str(report)
    assert "nothing compressed" in text and "Untraceable" in text and "trained uncompressed" in text
    assert "torch.compiler.disable" in text  # Dynamo's own reason
    with pytest.raises(LookupError, match="report\\(\\) of the module torch.compile returned says why"):
        gact_fx.report(model)  # the original module cannot tell: it points at the compiled one


def test_the_hooks_fallback_has_a_report_of_its_own():
    model = gact_fx.compress(Untraceable(), bits=2, min_numel=0, fallback="hooks")
    with pytest.raises(LookupError, match="run one first"):
        gact_fx.report(model)
    for _ in range(2):
        projection_loss(model(torch.randn(8, 64))).backward()
    report = gact_fx.report(model)
    assert report.hooks is not None and report.compressed_anything
    step = report.hooks
    # the last step packed the two activations (input and GELU input, fp32) at 2 bits
    assert step.packed >= 2 and step.bytes_after < step.bytes_before / 8
    assert report.activation_bytes_before == step.bytes_before
    assert "saved-tensor hooks at 2 bits" in str(report)


def test_reports_and_the_viewer_name_tensors_by_module_path_and_the_users_class(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64), nn.ReLU())
    compiled = torch.compile(model, backend=gact_fx.backend(bits=4, min_numel=0))
    projection_loss(compiled(torch.randn(64, 64))).backward()
    report = gact_fx.report(compiled)
    text = report.table()
    labels = {r.label: r for r in report.rows if r.stored == "compressed"}
    # the GELU's input (or its derivative, ``save_derivatives``), and ReLU's mask, named in its module
    assert {"1:gelu", "0:linear'"} & set(labels), labels
    assert [label for label, row in labels.items() if row.dtype == "bool"] == ["3:le"], labels
    for label in labels:
        assert label in text
    assert not any(r.kind == "parameter" and r.name in text for r in report.rows)  # parameters folded...
    assert "also saved, held by the model or not a tensor: " in text.splitlines()[-2]  # ...into one line
    page = gact_fx.visualize(compiled, path=tmp_path / "v.html")
    assert "<title>gact-fx: Sequential</title>" in page  # the user's class, not OptimizedModule
    assert '"label":"3:le"' in page


def test_the_first_compile_says_so_once_at_info(caplog):
    model = nn.Sequential(nn.Linear(64, 64), nn.GELU())
    compiled = torch.compile(model, backend=gact_fx.backend(bits=4))
    with caplog.at_level(logging.INFO, logger="gact_fx"):
        for _ in range(2):
            compiled(torch.randn(8, 64)).sum().backward()
    starts = [m for m in caplog.messages if "the first step takes longer" in m]
    assert len(starts) == 1 and "4 bits" in starts[0]


# -- the README's integration recipes, run as written ---------------------------------------------


def readme_recipes() -> dict[str, str]:
    """The ```python blocks of the README's integrations section, by their first comment."""
    text = README.read_text()
    section = text.split("## Use it where you train", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    return {block.splitlines()[0].lstrip("# ").strip(): block for block in blocks}


RECIPES = readme_recipes()
NEEDS = {"Hugging Face Trainer": "accelerate", "accelerate": "accelerate", "Lightning": "lightning"}


def test_the_readme_has_a_recipe_for_every_route():
    assert set(RECIPES) == {"a plain loop", "Hugging Face Trainer", "accelerate", "Lightning", "regional compilation"}


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_each_readme_recipe_runs_as_written_and_compresses(name, tmp_path):
    needed = NEEDS.get(name)
    if needed and importlib.util.find_spec(needed) is None:
        pytest.skip(f"{needed} is not installed (pip install -e '.[test]')")
    script = tmp_path / "recipe.py"
    script.write_text(RECIPES[name])
    environment = {**os.environ, "PYTHONWARNINGS": "ignore"}
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=600, env=environment)
    assert done.returncode == 0, done.stderr[-3000:]
    # every recipe ends by printing its report, whose last line is the total
    total = [line for line in done.stdout.splitlines() if line.startswith("total activations")]
    assert total, done.stdout[-2000:]
    ratio = float(re.search(r"\(([\d.]+)x smaller\)", total[-1]).group(1))
    assert ratio > 3, total[-1]


def test_the_trainer_refuses_gact_as_a_backend_name():
    # Why the README's Trainer recipe compresses the model first: accelerate accepts only
    # the backend names on its own list. If this starts to pass, the README can say more.
    pytest.importorskip("accelerate")
    transformers = pytest.importorskip("transformers")
    with pytest.raises(ValueError, match="not a valid DynamoBackend"):
        args = transformers.TrainingArguments("out", torch_compile=True, torch_compile_backend="gact", report_to=[])
        transformers.Trainer(model=nn.Linear(2, 2), args=args)
