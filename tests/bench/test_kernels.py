"""The codec bandwidth table: every share is against the faster of the copies, timed twice."""

import torch

from gact_fx.bench import kernels


def test_shares_are_against_the_fastest_copy_of_either_timing(monkeypatch):
    copy_times = iter([4.0, 2.0, 1.0, 3.0])  # new tensor, buffer; then the same again after the codec rows
    real_median = kernels.median_seconds

    def timed(fn, device, repeats, warmup=3):
        if {"clone", "copy_"} & set(fn.__code__.co_names):  # one of the two copies
            return next(copy_times)
        return real_median(fn, device, repeats, warmup=0)

    monkeypatch.setattr(kernels, "median_seconds", timed)
    rows = kernels.kernel_table("cpu", 4096, 1, dtypes=(torch.float32,), widths=(2,), lowerings=("op",))
    raw = 4096 * 4
    copies = {r["op"]: r for r in rows if r["bits"] == "copy"}
    assert copies["copy, new tensor"]["gbps"] == 2 * raw / 1.0 / 1e9  # its second timing, the faster
    assert copies["copy, into a buffer"]["gbps"] == 2 * raw / 2.0 / 1e9  # its first
    ceiling = 2 * raw / 1.0 / 1e9
    assert copies["copy, new tensor"]["of_copy"] == 1.0
    codec = [r for r in rows if r["bits"] == 2]
    assert {"quantize", "dequantize"} <= {r["op"] for r in codec}
    for r in codec:
        assert r["of_copy"] == r["gbps"] / ceiling
