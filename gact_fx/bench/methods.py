"""The memory-saving methods ``gact-fx bench`` puts side by side.

Each is a ``torch.compile`` backend plus the config patches it needs, all scoped
(``config.patch`` contexts held while the method compiles and runs):

* torch.compile: the baseline every ratio is taken against;
* gact 8/4/2 bit (stochastic rounding, the value stored), the default (3 bits dithered,
  attention's value rebuilt), gact L2 (adaptive 4) and L2.2 (adaptive 2);
* fp8 activations: torch's own ``activation_quantization_aten_pass`` (e5m2, per-tensor
  scale), opened to fp32 tensors of any size so that it competes on the same tensors;
* budget 0.5 / 0.0: ``activation_memory_budget`` (recompute instead of save);
* checkpoint: ``torch.utils.checkpoint`` per block (transformers models that support it);
* gact 2 bit + budget 0.5: recompute what is cheap, compress what is still saved.

``GPU_METHODS`` adds, for the GPU suite, gact at 2 bits with ``lowering="triton"`` (its
kernels launched by Inductor), torch.compile and gact at 2 bits under CUDA graphs
(``mode="reduce-overhead"``: replays that launch a step's kernels without its Python), the
two together, and
gact at 3 bits with ``rounding="dithered"``, also with query and key at 4 bits and
``debias_attention``, and the default with ``lowering="triton"``.

``compiler="inductor"`` compiles everything with Inductor (a fair step-time comparison);
``"eager"`` runs the same partitioned graphs as Python (``--quick``: seconds, not minutes).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import gact_fx
from gact_fx import _compat

FP8_PASS = {
    "activation_quantization_aten_pass": {
        "allowed_dtypes": "torch.float32;torch.bfloat16;torch.float16",
        "size_in_mb": 0.0,
        "use_scaling": True,
        "exclude_primals": True,
    }
}


# What a method's name assumes where it does not say otherwise: stochastic rounding, and
# attention's value stored (the defaults before 3 bits dithered with the value rebuilt), so
# that a name keeps one meaning across result files.
PLAIN_FORMAT = {"rounding": "stochastic", "recompute_projections": False}


@dataclass(frozen=True)
class Method:
    name: str
    gact: dict | None = None  # gact options; None: gact off (stock partitioning)
    inductor_patches: dict = field(default_factory=dict)
    functorch_patches: dict = field(default_factory=dict)
    checkpoint: bool = False
    bits: int | None = None  # uniform bits, for the physical limit
    mode: str | None = None  # torch.compile's mode ("reduce-overhead": CUDA graphs)
    baseline: str = "torch.compile"  # the method its step and bytes are compared with

    def backend(self, compiler: str):
        options = {**PLAIN_FORMAT, **self.gact} if self.gact is not None else {"enabled": False}
        return gact_fx.backend(compiler=compiler, **options)

    def patches(self) -> contextlib.AbstractContextManager:
        stack = contextlib.ExitStack()
        if self.inductor_patches:
            stack.enter_context(_compat.inductor_config().patch(self.inductor_patches))
        if self.functorch_patches:
            stack.enter_context(_compat.functorch_config().patch(self.functorch_patches))
        return stack


# The baseline runs through gact's backend with gact disabled: the same partitioner and
# compiler as every other method, so differences are the methods' own.
ALL: dict[str, Method] = {
    m.name: m
    for m in (
        Method("torch.compile"),
        Method("gact 8 bit", gact={"bits": 8}, bits=8),
        Method("gact 4 bit", gact={"bits": 4}, bits=4),
        Method("gact 2 bit", gact={"bits": 2}, bits=2),
        # the default
        Method("gact 3 bit, dithered, projections rebuilt", gact={"bits": 3, "rounding": "dithered",
                                                                   "recompute_projections": True}, bits=3),
        Method("gact L2 (adaptive 4)", gact={"level": "L2"}),
        Method("gact L2.2 (adaptive 2)", gact={"level": "L2.2"}),
        Method("fp8 activations (torch)", inductor_patches={"post_grad_fusion_options": FP8_PASS}),
        Method("budget 0.5", functorch_patches={"activation_memory_budget": 0.5}),
        Method("budget 0.0", functorch_patches={"activation_memory_budget": 0.0}),
        Method("checkpoint", checkpoint=True),
        Method("gact 2 bit + budget 0.5", gact={"bits": 2}, functorch_patches={"activation_memory_budget": 0.5}, bits=2),
    )
}
# Only the GPU suite runs these: on the CPU torch skips CUDA graphs, and the Triton lowering
# needs the Triton kernels.
GPU_METHODS: dict[str, Method] = {
    **ALL,
    **{m.name: m for m in (
        Method("gact 2 bit, Triton lowering", gact={"bits": 2, "lowering": "triton"}, bits=2),
        Method("torch.compile, CUDA graphs", mode="reduce-overhead", baseline="torch.compile, CUDA graphs"),
        Method("gact 2 bit, CUDA graphs", gact={"bits": 2}, bits=2, mode="reduce-overhead",
               baseline="torch.compile, CUDA graphs"),
        Method("gact 2 bit, Triton lowering, CUDA graphs", gact={"bits": 2, "lowering": "triton"}, bits=2,
               mode="reduce-overhead", baseline="torch.compile, CUDA graphs"),
        Method("gact 3 bit, dithered", gact={"bits": 3, "rounding": "dithered"}, bits=3),
        Method("gact 3 bit, dithered, q/k 4 debiased", gact={"bits": 3, "rounding": "dithered", "nonlinear_bits": 4,
                                                             "debias_attention": True}, bits=3),
        Method("gact 3 bit, dithered, projections rebuilt, Triton lowering",
               gact={"bits": 3, "rounding": "dithered", "recompute_projections": True, "lowering": "triton"}, bits=3),
    )},
}
QUICK = ("torch.compile", "gact 8 bit", "gact 2 bit", "gact L2.2 (adaptive 2)", "budget 0.5", "fp8 activations (torch)")


def select(names: list[str] | None, quick: bool) -> list[Method]:
    chosen = names or (list(QUICK) if quick else list(ALL))
    unknown = sorted(set(chosen) - set(ALL))
    if unknown:
        raise ValueError(f"unknown method(s) {unknown}; known: {list(ALL)}")
    if "torch.compile" not in chosen:
        chosen = ["torch.compile", *chosen]  # every ratio needs the baseline
    return [ALL[name] for name in chosen]

