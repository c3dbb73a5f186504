"""Elementwise nonlinearities that save their local derivative instead of their input, for the hooks.

The eager counterpart of ``passes.derivatives``. GELU's and SiLU's backward recompute
their derivative from the saved input, tanh's and sigmoid's from the saved output; from a
rounded value that derivative is biased (``E[f'(x + noise)] != f'(x)`` for a curved
``f'``). ``SavedDerivative`` computes the derivative in the forward from the exact value
and saves it instead, so the backward is linear in what was rounded and stochastic
rounding keeps the gradient unbiased. The derivative's own derivative is not kept: a
double backward through one raises, naming ``save_derivatives=False``, which leaves the
op to torch (whose double backward the hooks keep).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

aten = torch.ops.aten
F = torch.nn.functional


@dataclass(frozen=True)
class Curve:
    """An elementwise nonlinearity: the op, and its derivative from its input and output."""

    forward: Callable[..., torch.Tensor]
    derivative: Callable[[torch.Tensor, torch.Tensor, dict], torch.Tensor]
    keywords: frozenset[str]  # the keyword arguments it may be called with
    saves_output: bool  # torch's own backward saves the output, which the next op usually saves too


def _ones(x: torch.Tensor) -> torch.Tensor:
    return x.new_ones(()).expand_as(x)


_GELU = Curve(F.gelu, lambda x, y, kw: aten.gelu_backward(_ones(x), x, approximate=kw.get("approximate", "none")),
              frozenset({"approximate"}), saves_output=False)
_SILU = Curve(F.silu, lambda x, y, kw: aten.silu_backward(_ones(x), x), frozenset({"inplace"}), saves_output=False)
_TANH = Curve(torch.tanh, lambda x, y, kw: aten.tanh_backward(_ones(y), y), frozenset(), saves_output=True)
_SIGMOID = Curve(torch.sigmoid, lambda x, y, kw: aten.sigmoid_backward(_ones(y), y), frozenset(), saves_output=True)

# what a TorchFunctionMode sees for each spelling (F.tanh and F.sigmoid call the methods)
CURVES: dict[Callable, Curve] = {
    F.gelu: _GELU, F.silu: _SILU,
    torch.tanh: _TANH, torch.Tensor.tanh: _TANH,
    torch.sigmoid: _SIGMOID, torch.Tensor.sigmoid: _SIGMOID, torch.special.expit: _SIGMOID,
}


def curve_call(func: Callable, args: tuple, kwargs: dict) -> tuple[Curve, torch.Tensor, dict] | None:
    """The curve, its input and keywords, if ``func(*args, **kwargs)`` is an out-of-place
    call of one on a tensor; else None."""
    curve = CURVES.get(func)
    if curve is None:
        return None
    kwargs = dict(kwargs)
    x, rest = (args[0], args[1:]) if args else (kwargs.pop("input", None), ())
    if curve is _SILU and len(rest) == 1:
        kwargs["inplace"], rest = rest[0], ()
    if rest or not isinstance(x, torch.Tensor) or not set(kwargs) <= curve.keywords or kwargs.pop("inplace", False):
        return None
    return curve, x, kwargs


class SavedDerivative(torch.autograd.Function):
    """``curve.forward(x)``, saving ``curve.derivative`` for the backward instead of ``x`` or the output."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, curve: Curve, kwargs: dict) -> torch.Tensor:
        y = curve.forward(x, **kwargs)
        ctx.save_for_backward(curve.derivative(x, y, kwargs))
        return y

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (derivative,) = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph: a double backward may differentiate this
            return _FirstOrder.apply(grad, derivative), None, None
        return grad * derivative, None, None


class _FirstOrder(torch.autograd.Function):
    """``grad * derivative`` with no derivative of its own."""

    @staticmethod
    def forward(ctx, grad: torch.Tensor, derivative: torch.Tensor) -> torch.Tensor:
        return grad * derivative

    @staticmethod
    def backward(ctx, _):
        raise RuntimeError(
            "gact: a double backward through GELU, SiLU, tanh or sigmoid under compress(..., fallback='hooks'), "
            "which saved the activation's derivative instead of its input: pass save_derivatives=False "
            "to keep the input, whose derivatives torch has"
        )
