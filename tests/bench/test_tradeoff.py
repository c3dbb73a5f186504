"""Loss against bytes (bench.tradeoff): every convergence run a point against its own file's fp32 run."""

import json

import pytest

from gact_fx.bench import tradeoff
from gact_fx.bench.markdown import write_markdown


def _run(method, final, ratio=None, norms=(1.0, 1.0), task="char-lm"):
    return {"task": task, "method": method, "metric": "validation loss", "curve": [[10, 9.9], [20, final]], "grad_norms": list(norms),
            "activation_ratio": ratio, "diverged": False}


def _file(seed, runs, clip=None, warm=None):
    meta = {"seed": seed, "device": "CPU", "torch": "2.13", "date": "now", "command": "c"}
    if clip:
        meta["clip_grad_norm"] = clip
    if warm:
        meta["warm_steps"] = warm
    return {"meta": meta, "results": [_run("fp32", 2.0), *runs]}


@pytest.mark.parametrize("method, expected", [
    ("L1 (4 bit)", "uniform"), ("3 bit", "uniform"), ("L1.2", "uniform"), ("L1.2 (2 bit)", "uniform"),
    ("3 bit, rotation 32", "uniform, rotation 32"), ("L1.2, rotation 32, groups of 128", "uniform, rotation 32, groups of 128"),
    ("3 bit, rotation 32 (other signs)", "uniform, rotation 32"), ("L2.2 (adaptive 2)", "adaptive"),
    ("L2.1, feature groups", "adaptive, feature groups"), ("fp8", "fp8"),
])
def test_a_methods_format_is_its_name_without_the_width(method, expected):
    assert tradeoff.format_of(method) == expected


def test_each_run_is_measured_against_the_fp32_run_of_its_own_file():
    files = [_file(0, [_run("3 bit", 2.02, 9.4, norms=(3.0, 1.0))]),
             _file(1, [_run("3 bit", 1.98, 9.4)]),
             _file(0, [_run("3 bit", 2.1, 9.4)], clip=1.0),
             _file(0, [_run("3 bit", 2.04, 9.4)], warm=300),
             {"meta": {}, "results": [_run("3 bit", 5.0, 9.4)]}]  # no fp32 run: no point
    longer = _file(0, [_run("3 bit", 2.06, 9.4)])
    for run in longer["results"]:
        run["curve"] = [[40, run["curve"][-1][1]]]  # twice as many steps as the task's other runs
    points = tradeoff.run_points([*files, longer], {"char-lm": False})
    assert [(p.task, p.seed, round(p.delta, 6), p.norm_ratio) for p in points] == [
        ("char-lm", 0, 1.0, 3.0), ("char-lm", 1, -1.0, 1.0), ("char-lm, clipped at 1", 0, 5.0, 1.0),
        ("char-lm, after 300 fp32 steps", 0, 2.0, 1.0), ("char-lm, 40 steps", 0, 3.0, 1.0)]


def test_accuracies_differ_in_points_and_count_as_within_when_at_most_one_point_lower():
    files = [{"meta": {"seed": 0}, "results": [_run("fp32", 0.95, task="digits-mlp"),
                                               _run("L1.2 (2 bit)", 0.935, 12.0, task="digits-mlp"),
                                               _run("L1 (4 bit)", 0.94, 7.0, task="digits-mlp")]}]
    points = tradeoff.run_points(files, {"digits-mlp": True})
    assert [round(p.delta, 6) for p in points] == [-1.5, -1.0]
    shortfalls = tradeoff.curves(points, {"digits-mlp": True})["digits-mlp"]["uniform"]
    assert [(r, round(m, 6)) for r, m, _, _ in shortfalls] == [(7.0, 1.0), (12.0, 1.5)]  # points less accuracy
    text = tradeoff.section(points, {"digits-mlp": True})
    assert "| L1 (4 bit) | 7.0x smaller | 1 (0) | -1.00 pp | -1.00 pp | 1 of 1 |" in text
    assert "| L1.2 (2 bit) | 12.0x smaller | 1 (0) | -1.50 pp | -1.50 pp | 0 of 1 |" in text


def test_a_method_whose_bytes_changed_is_a_row_per_ratio_and_formats_are_curves_by_bytes():
    files = [_file(0, [_run("L1 (4 bit)", 2.0, 6.8), _run("L1.2 (2 bit)", 2.1, 12.0), _run("3 bit", 2.04, 9.4)]),
             _file(1, [_run("L1 (4 bit)", 2.02, 7.7), _run("3 bit", 2.0, 9.4)])]
    points = tradeoff.run_points(files, {"char-lm": False})
    text = tradeoff.section(points, {"char-lm": False})
    rows = [line for line in text.splitlines() if line.startswith("| L1 (4 bit)") or line.startswith("| 3 bit")]
    assert rows[0].startswith("| L1 (4 bit) | 6.8x") and rows[1].startswith("| L1 (4 bit) | 7.7x")
    assert "| 3 bit | 9.4x smaller | 2 (0, 1) | +2.00, +0.00% | +1.00% | 1 of 2 |" in text
    curve = tradeoff.curves(points, {"char-lm": False})["char-lm"]["uniform"]
    assert [(r, round(m, 6), round(lo, 6), round(hi, 6)) for r, m, lo, hi in curve] == [
        (6.8, 0.0, 0.0, 0.0), (7.7, 1.0, 1.0, 1.0), (9.4, 1.0, 0.0, 2.0), (12.0, 5.0, 5.0, 5.0)]


def test_the_report_has_the_section_when_convergence_files_exist(tmp_path):
    (tmp_path / "convergence_charlm.json").write_text(json.dumps(_file(0, [_run("3 bit", 2.02, 9.4)])))
    (tmp_path / "convergence_charlm.part.json").write_text(json.dumps(_file(0, [_run("L1", 9.0, 7.0)])))
    text = write_markdown(tmp_path, tmp_path / "B.md").read_text()
    section = text[text.index("## Loss against bytes held"):]
    assert "| 3 bit | 9.4x smaller | 1 (0) | +1.00% | +1.00% | 1 of 1 |" in section
    assert "| L1 |" not in section  # a part file is not a run of its own
