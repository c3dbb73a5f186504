"""Every private torch contract of ``gact_fx._compat`` resolves on the installed torch.

A torch upgrade that renames or drops one of them fails here, by name, instead of
quietly compressing nothing. Also: no module of the package reaches a private torch
name or a torch meta key except through ``_compat``.
"""

import pathlib
import re

import pytest
import torch

from gact_fx import _compat

pytestmark = pytest.mark.compat

PACKAGE = pathlib.Path(_compat.__file__).parent


@pytest.mark.parametrize("contract", _compat.CONTRACTS, ids=lambda c: c.name)
def test_contract_resolves(contract):
    assert contract.resolve() is not None, f"{contract.name} is gone in torch {torch.__version__}"


def test_hint_gives_a_concrete_int_without_a_guard():
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    shape_env = ShapeEnv()
    size = shape_env.create_unbacked_symint()
    hinted = _compat.hint(size)  # unbacked: a fallback (its value varies between releases)
    assert isinstance(hinted, int) and hinted > 0
    assert _compat.hint(7) == 7
    assert not shape_env.guards


PRIVATE = re.compile(
    r"torch\._(?!_|dynamo\.(?:reset|mark_dynamic)\b)\w+|\._call_impl\b|\._compiled_call_impl\b|\._version\b|\._rename\b|"
    r"CompiledFunction|[\"'](?:saved_tensor_with_no_vc_check|eager_input_vals|unbacked_bindings|should_offload|desc|"
    r"nn_module_stack|source_fn_stack)[\"']|L\\\['self"
)


def _library_sources():
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name != "_compat.py":
            yield path


@pytest.mark.parametrize("path", list(_library_sources()), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_private_torch_is_reached_only_through_compat(path):
    code = "\n".join(line for line in path.read_text().splitlines() if not line.lstrip().startswith("#"))
    code = re.sub(r'"""[\s\S]*?"""', "", code)  # docstrings may name what they describe
    found = sorted(set(PRIVATE.findall(code)))
    assert not found, f"{path.name} uses {found}: go through gact_fx._compat"
