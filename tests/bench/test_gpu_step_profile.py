"""benchmarks/gpu_step_profile.py on the CPU: the same code as on a GPU, small."""

import json
import pathlib
import subprocess
import sys

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_step_profile.py"


@pytest.mark.slow
def test_a_dry_run_profiles_each_method_and_runs_the_planned_rows(tmp_path):
    subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path), "--device", "cpu",
                    "--plan", "llama-like:gact 4 bit"], check=True, capture_output=True, timeout=600)
    result = json.loads((tmp_path / "gpu_step_profile.json").read_text())
    profile = result["profile"]
    assert set(profile) == {"torch.compile", "gact 2 bit", "gact 2 bit, Triton lowering"}
    # the Triton lowering needs the Triton kernels: on the CPU its row says so, and the rest run
    assert "lowering='triton' launches gact's Triton kernels" in profile.pop("gact 2 bit, Triton lowering")["error"]
    assert all(row["step_ms"] > 0 and row["host_ms"] > 0 for row in profile.values())
    assert "step_ms_own_program" in profile["gact 2 bit"] and "step_ms_own_program" not in profile["torch.compile"]
    (row,) = result["models"]["rows"]
    assert (row["model"], row["method"], row["error"]) == ("llama-like", "gact 4 bit", None)
    assert "| gact 2 bit |" in result["markdown"] and "| llama-like | gact 4 bit |" in result["markdown"]
    assert (tmp_path / "profile_gact_2_bit_by_host_time.txt").read_text().count("gact::quantize") == 1
