"""The renderers and visualize(): what they contain, not how they look."""

import json
import re
import subprocess
import sys

import pytest
import torch

import gact_fx

from ..helpers import compiled_grads, model_case

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def block_backend():
    torch._dynamo.reset()
    model, inputs = model_case("block")
    backend = gact_fx.backend(bits=2)
    compiled_grads(model, inputs, backend)
    return backend


def embedded_data(html: str) -> dict:
    match = re.search(r'<script type="application/json" id="gact-data">(.*?)</script>', html, re.S)
    return json.loads(match.group(1))


def test_html_is_self_contained_and_carries_every_saved_tensor(block_backend):
    html = gact_fx.visualize(block_backend, format="html")
    assert not re.search(r"<(script|link|img)[^>]+(src|href)=", html)  # nothing fetched
    data = embedded_data(html)
    (graph,) = data["graphs"]
    report = block_backend.report()
    assert len(graph["rows"]) == len(report.rows)
    compressed = [r for r in graph["rows"] if r["stored"] == "compressed"]
    assert {r["bits"] for r in compressed if r["use"] != "exponential"} == {2}
    assert {r["bits"] for r in compressed if r["use"] == "exponential"} == {8}  # attention's query and key
    assert all(r["why"] for r in compressed)
    assert [r["before"] for r in graph["rows"]] == sorted((r["before"] for r in graph["rows"]), reverse=True)
    assert data["before"] == report.activation_bytes_before and data["after"] == report.activation_bytes_after
    timeline = graph["timeline"]
    assert timeline["baseline"][timeline["forwardNodes"] - 1] == report.activation_bytes_before
    assert timeline["gact"][timeline["forwardNodes"] - 1] == report.activation_bytes_after
    ids = {n["id"] for n in graph["nodes"]}
    assert graph["savedEdges"] and all(e["from"] in ids and e["to"] in ids for e in graph["savedEdges"])
    assert {"quantize", "dequantize", "blob"} <= {n["role"] for n in graph["nodes"]}


def test_dot_has_clusters_and_highlighted_saved_edges(block_backend):
    dot = gact_fx.visualize(block_backend, format="dot")
    assert dot.startswith("digraph gact {") and dot.rstrip().endswith("}")
    assert "subgraph cluster_g0_forward" in dot and "subgraph cluster_g0_backward" in dot
    assert dot.count('color="#e0245e"') == len(embedded_data(gact_fx.visualize(block_backend, format="html"))["graphs"][0]["savedEdges"])


def test_text_summary(block_backend):
    text = gact_fx.visualize(block_backend)
    assert "total activations" in text and "peak held for backward" in text


def test_visualize_a_plain_module_and_write_a_file(tmp_path):
    model, inputs = model_case("mlp")
    target = tmp_path / "mlp.html"
    gact_fx.visualize(model, *inputs, path=target, bits=4)
    assert embedded_data(target.read_text())["graphs"][0]["rows"]
    assert all(p.grad is None for p in model.parameters())  # it ran a copy


def test_visualize_a_compressed_model_after_a_step():
    model, inputs = model_case("mlp")
    compressed = gact_fx.compress(model, level="L2.2")
    compressed(*inputs).sum().backward()
    data = embedded_data(gact_fx.visualize(compressed, format="html"))
    sensitivities = [r["sensitivity"] for r in data["graphs"][0]["rows"] if r["stored"] == "compressed" and r["dtype"] != "bool"]
    assert sensitivities and all(s is not None and s > 0 for s in sensitivities)


def test_visualize_errors():
    with pytest.raises(LookupError, match="run a training step first|no gact backend"):
        gact_fx.visualize(gact_fx.compress(torch.nn.Linear(4, 4)))
    with pytest.raises(ValueError, match="format must be one of"):
        gact_fx.visualize(torch.nn.Linear(4, 4), torch.randn(2, 4), format="svg")


def test_the_cli(tmp_path):
    out = tmp_path / "block.dot"
    spec = f"{ROOT / 'examples' / 'viz_models.py'}:transformer_block"
    done = subprocess.run([sys.executable, "-m", "gact_fx.cli", "viz", spec, "--out", str(out), "--option", "bits=4"],
                          capture_output=True, text=True, check=True)
    assert "wrote" in done.stdout and out.read_text().startswith("digraph")
    done = subprocess.run([sys.executable, "-m", "gact_fx.cli", "viz", spec], capture_output=True, text=True, check=True)
    assert "total activations" in done.stdout
    bad = subprocess.run([sys.executable, "-m", "gact_fx.cli", "viz", "nope.py:f"], capture_output=True, text=True)
    assert bad.returncode != 0 and "no such file" in bad.stderr


def test_non_finite_numbers_reach_the_viewer_as_null(block_backend):
    from gact_fx.viz.render import render_html

    report = block_backend.report()
    slots = {row.slot for row in report.rows if row.slot is not None}
    sensitivities = dict.fromkeys(slots, float("inf")) | {min(slots): float("nan")}
    html = render_html(report, sensitivities=sensitivities)
    match = re.search(r'<script type="application/json" id="gact-data">(.*?)</script>', html, re.S)

    def reject(constant):  # what JSON.parse rejects: Infinity, -Infinity, NaN
        raise ValueError(f"not JSON: {constant}")

    data = json.loads(match.group(1), parse_constant=reject)
    rows = data["graphs"][0]["rows"]
    assert rows and all(r["sensitivity"] is None for r in rows)


def test_dot_edges_join_declared_nodes(block_backend):
    dot = gact_fx.visualize(block_backend, format="dot")
    declared = set(re.findall(r'^\s*("[^"]*") \[label=', dot, re.M))
    edges = re.findall(r'^\s*("[^"]*") -> ("[^"]*")', dot, re.M)
    assert edges and all(a in declared and b in declared for a, b in edges)


def test_a_factory_file_with_a_dataclass_loads(tmp_path):
    from gact_fx.cli import load_factory

    source = tmp_path / "factory_with_dataclass.py"
    source.write_text(
        "from __future__ import annotations\n"
        "import dataclasses, pickle\n"
        "@dataclasses.dataclass\n"
        "class Config:\n"
        "    width: int = 4\n"
        "def build():\n"
        "    config = pickle.loads(pickle.dumps(Config()))\n"
        "    import torch\n"
        "    return torch.nn.Linear(config.width, 2), torch.randn(3, config.width)\n"
    )
    try:
        model, inputs = load_factory(f"{source}:build")()
        assert model(inputs).shape == (3, 2)
    finally:
        sys.modules.pop("factory_with_dataclass", None)
        sys.path.remove(str(tmp_path.resolve()))
