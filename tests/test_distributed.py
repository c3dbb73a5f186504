"""DDP and FSDP2 on CPU: two gloo processes on loopback against the single-process run."""

import pathlib
import subprocess
import sys

import pytest
import torch
import torch.nn as nn

from gact_fx.runtime.noise import mix64, slot_key

from .distributed_worker import data, model_fn

if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

WORKER = pathlib.Path(__file__).with_name("distributed_worker.py")


def single_process():
    model = model_fn()
    x, y = data()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    return loss.detach(), torch.cat([p.grad.flatten() for p in model.parameters()])


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_two_processes_match_one(mode, tmp_path):
    out = tmp_path / f"{mode}.pt"
    done = subprocess.run([sys.executable, str(WORKER), mode, str(out)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    results = torch.load(out)
    loss, grad = single_process()
    for bits in (32, 8):
        result = results[bits]
        assert result["graphs"] >= 1 and result["compressed"] >= 1  # compiled and compressed, not skipped
        torch.testing.assert_close(result["loss"], loss, rtol=1e-6, atol=1e-6)
        error = ((result["grad"] - grad).norm() / grad.norm()).item()
        assert error < (1e-5 if bits == 32 else 2e-2), (bits, error)
    # each rank rounds with its own noise (rank 0 with a single process's), so that averaging
    # the ranks' gradients averages their rounding errors too
    rank0, rank1 = results[8]["keys"]
    assert len(rank0) == len(rank1) == results[8]["compressed"]
    assert rank0 == [slot_key(mix64(0), index) for index in range(len(rank0))]
    assert not set(rank0) & set(rank1)
