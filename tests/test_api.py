"""The model-rewrite API: compress() / decompress() on the models users bring."""

import copy
import logging

import pytest
import torch
from torch._dynamo.utils import counters

import gact_fx
from gact_fx.measure import saved_activation_bytes
from gact_fx.runtime.format import ideal_ratio

from .helpers import flat_grad, projection_loss, relative_error
from .models.families import family

FAMILIES = ["bert", "gpt2", "llama", "vit", "gcn", "conv", "function", "custom_op"]


def step(model, inputs):
    gact_fx.manual_seed(0)
    torch.manual_seed(0)
    model.zero_grad(set_to_none=True)
    projection_loss(model(*inputs)).backward()
    return flat_grad(model)


@pytest.mark.parametrize("name", FAMILIES)
def test_compress_matches_the_backend_path(name):
    model, inputs = family(name)
    options = dict(bits=8, min_numel=256)
    compressed = gact_fx.compress(copy.deepcopy(model), **options)
    got = step(compressed, inputs)
    torch._dynamo.reset()
    reference = copy.deepcopy(model)
    expected = step(torch.compile(reference, backend=gact_fx.backend(**options)), inputs)
    assert torch.equal(got, expected)
    assert compressed.gact.mode == "compiled" and compressed.gact.report().num_compressed > 0
    assert relative_error(got, step(copy.deepcopy(model), inputs)) < 3e-2  # and close to eager


def test_the_module_keeps_its_identity_parameters_and_keys():
    model, inputs = family("conv")
    keys, parameters = list(model.state_dict()), list(model.parameters())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    assert gact_fx.compress(model, level="L1.1") is model
    assert list(model.state_dict()) == keys and list(model.parameters()) == parameters
    before = [p.detach().clone() for p in parameters]
    step(model, inputs)
    optimizer.step()
    assert all(not torch.equal(a, p) for a, p in zip(before, parameters))  # the optimizer it had still works


def test_state_dict_round_trips_both_ways():
    model, inputs = family("bert")
    plain = copy.deepcopy(model)
    compressed = gact_fx.compress(copy.deepcopy(model), bits=4)
    step(compressed, inputs)
    plain.load_state_dict(compressed.state_dict())
    fresh = gact_fx.compress(family("bert")[0], bits=4)
    fresh.load_state_dict(plain.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), compressed.state_dict().values()))


@pytest.mark.parametrize("mode", ["eval", "no_grad", "inference_mode"])
def test_eval_and_no_grad_pay_nothing(mode):
    model, inputs = family("conv")
    compressed = gact_fx.compress(model, bits=2)
    counters.clear()
    if mode == "eval":
        compressed.eval()
        output = compressed(*inputs)
    else:
        with torch.no_grad() if mode == "no_grad" else torch.inference_mode():
            output = compressed(*inputs)
    assert counters["stats"]["unique_graphs"] == 0  # the plain forward: not even compiled
    assert compressed.gact.backend.records == []
    assert output.shape == (8, 10)


def test_decompress_gives_back_the_plain_module():
    model, inputs = family("function")
    expected = step(copy.deepcopy(model), inputs)
    gact_fx.decompress(gact_fx.compress(model, bits=2))
    assert not hasattr(model, "gact")
    assert torch.equal(step(model, inputs), expected)
    with pytest.raises(ValueError, match="was not compressed"):
        gact_fx.decompress(model)


def test_models_compressed_in_one_process_do_not_share_a_compile_cache():
    # Dynamo counts recompiles per code object; models sharing one ran out at the limit
    # (the ninth model compressed in a process, at the default of 8)
    x = torch.randn(64, 16)
    with torch._dynamo.config.patch(recompile_limit=2):
        for _ in range(4):
            model = gact_fx.compress(torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.GELU()), bits=4, min_numel=0)
            model(x).sum().backward()
            assert model.gact.mode == "compiled" and len(model.gact.backend.records) == 1


def test_an_untraceable_model_is_an_error_by_default():
    model, inputs = family("untraceable")
    compressed = gact_fx.compress(model, bits=8)
    with pytest.raises(gact_fx.GactCompileError, match="captured no training graph"):
        step(compressed, inputs)


def test_an_untraceable_model_can_fall_back_to_saved_tensor_hooks(caplog):
    model, inputs = family("untraceable")
    expected = step(copy.deepcopy(model), inputs)
    uncompressed = saved_activation_bytes(copy.deepcopy(model), *inputs)
    compressed = gact_fx.compress(model, bits=8, min_numel=256, fallback="hooks")
    with caplog.at_level(logging.WARNING, logger="gact_fx"):
        step(compressed, inputs)  # the first step finds out, uncompressed, and says so
    assert compressed.gact.mode == "hooks" and any("saved-tensor hooks" in m for m in caplog.messages)
    assert relative_error(step(compressed, inputs), expected) < 2e-2
    # At 8 bits a float tensor keeps (8 + 0.125) / 32 of its bytes; tensors under min_numel stay.
    compressed_bytes = saved_activation_bytes(compressed, *inputs)
    assert uncompressed * ideal_ratio(8) <= compressed_bytes < uncompressed / 3


def test_the_hook_fallback_respects_level_l0_and_says_adaptive_becomes_uniform(caplog):
    model, inputs = family("untraceable")
    expected = step(copy.deepcopy(model), inputs)
    off = gact_fx.compress(copy.deepcopy(model), level="L0", fallback="hooks")
    step(off, inputs)
    assert off.gact.mode == "hooks" and off.gact.hooks is None
    assert torch.equal(step(off, inputs), expected)
    adaptive = gact_fx.compress(model, level="L2", min_numel=256, fallback="hooks")
    with caplog.at_level(logging.WARNING, logger="gact_fx"):
        step(adaptive, inputs)
    assert adaptive.gact.hooks.bits == 4 and any("same width" in m for m in caplog.messages)


def test_the_hook_fallback_takes_the_passes_it_has_a_counterpart_of():
    model, inputs = family("untraceable")  # a tanh between two linears
    for save in (True, False):
        compressed = gact_fx.compress(copy.deepcopy(model), bits=2, min_numel=256, fallback="hooks",
                                      save_derivatives=save)
        step(compressed, inputs)  # finds out: no graph
        step(compressed, inputs)  # through the hooks
        report = str(gact_fx.report(compressed))
        assert ("derivatives saved in place of what GELU, SiLU, tanh or sigmoid saves: 1" in report) is save


def test_graph_breaks_are_logged(caplog):
    model, inputs = family("gcn")
    compressed = gact_fx.compress(model, bits=8, min_numel=64)
    with caplog.at_level(logging.WARNING, logger="gact_fx"):
        step(compressed, inputs)
    assert any("graph break" in m and "not compressed" in m for m in caplog.messages)
    assert len(compressed.gact.backend.records) >= 2


def test_bad_arguments():
    with pytest.raises(TypeError, match="takes an nn.Module"):
        gact_fx.compress(lambda x: x)
    with pytest.raises(ValueError, match="fallback must be one of"):
        gact_fx.compress(torch.nn.Linear(2, 2), fallback="eager")
    model = gact_fx.compress(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="compressed twice"):
        gact_fx.compress(model)
