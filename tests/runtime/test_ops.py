"""The gact:: custom ops: opcheck, layouts and strides, rounding noise, run-time bit widths."""

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from gact_fx.runtime import format as fmt
from gact_fx.runtime import ops  # noqa: F401  (registers torch.ops.gact)
from gact_fx.runtime.kernels import encode
from gact_fx.runtime.layout import arrange
from gact_fx.runtime.registry import DIRECTORY, SlotRegistry, manual_seed, next_keys

from .sites import SLOT, new_slot

quantize = torch.ops.gact.quantize.default
dequantize = torch.ops.gact.dequantize.default
unpack_mask = torch.ops.gact.unpack_mask.default
FLOATS = [torch.float32, torch.float16, torch.bfloat16]


@pytest.fixture
def pinned_slot():
    return new_slot(pinned=True)  # opcheck compares several calls: the same noise in each


@pytest.mark.compat
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("bits", fmt.SUPPORTED_BITS)
def test_opcheck(dtype, bits, pinned_slot):
    x = torch.randn(6, 50, dtype=dtype)
    torch.library.opcheck(quantize, (x, bits, 64, [0, 1], pinned_slot))
    blob = quantize(x, bits, 64, [0, 1], pinned_slot)
    torch.library.opcheck(dequantize, (blob, [6, 50], dtype, 64, [0, 1], pinned_slot))


@pytest.mark.compat
def test_opcheck_bool(pinned_slot):
    mask = torch.rand(3, 70) > 0.3
    torch.library.opcheck(quantize, (mask, 2, 64, [0, 1], pinned_slot))
    blob = quantize(mask, 2, 64, [0, 1], pinned_slot)
    torch.library.opcheck(dequantize, (blob, [3, 70], torch.bool, 64, [0, 1], pinned_slot))
    assert torch.equal(dequantize(blob, [3, 70], torch.bool, 64, [0, 1], pinned_slot), mask)


@pytest.mark.compat
def test_a_mask_as_bytes_packs_as_the_bool_and_unpacks_to_floats(pinned_slot):
    mask = torch.rand(5, 70, generator=torch.Generator().manual_seed(1)) > 0.3
    as_bytes = mask.to(torch.int32).to(torch.uint8)
    torch.library.opcheck(quantize, (as_bytes, 1, 64, [0, 1], pinned_slot))
    blob = quantize(as_bytes, 1, 64, [0, 1], pinned_slot)
    assert torch.equal(blob, quantize(mask, 1, 64, [0, 1], pinned_slot))
    assert blob.numel() == fmt.bool_blob_nbytes(mask.numel())
    torch.library.opcheck(unpack_mask, (blob, [5, 70], torch.float32, [0, 1]))
    floats = unpack_mask(blob, [5, 70], torch.float32, [0, 1])
    assert floats.dtype == torch.float32 and torch.equal(floats, mask.float())
    assert torch.equal(unpack_mask(blob, [5, 70], torch.bfloat16, [0, 1]), mask.to(torch.bfloat16))


def test_an_unpacked_mask_is_arranged_as_dequantize_arranges():
    mask = torch.rand(4, 6, 8) > 0.5
    perm, layout = [0, 2, 1], [0, 2, 1]
    blob = quantize(mask.permute(perm).contiguous().permute([0, 2, 1]), 1, 64, perm, SLOT)
    floats = unpack_mask(blob, [4, 6, 8], torch.float32, perm, layout)
    expected = dequantize(blob, [4, 6, 8], torch.bool, 64, perm, SLOT, layout)
    assert torch.equal(floats, expected.float()) and floats.stride() == expected.stride()


@pytest.mark.parametrize("bits", fmt.SUPPORTED_BITS)
def test_dequantize_reads_the_bits_from_the_blob(bits):
    x = torch.randn(300)
    blob = quantize(x, bits, 64, [0], SLOT)
    y = dequantize(blob, [300], torch.float32, 64, [0], SLOT)
    assert blob.numel() == fmt.float_blob_nbytes(300, bits, 64, 4)
    assert (y - x).abs().max() <= (x.max() - x.min()) / (2**bits - 1) + 1e-6


def test_channels_last_layout_is_restored_exactly():
    x = torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)
    perm = [0, 2, 3, 1]  # dense order of channels_last
    y = dequantize(quantize(x, 32, 64, perm, SLOT), list(x.shape), x.dtype, 64, perm, SLOT)
    assert torch.equal(x, y) and y.stride() == x.stride()


def test_non_dense_input_comes_back_compact_in_the_same_order():
    x = torch.randn(10, 8)[:, :5]  # strides (8, 1): a gap after each row
    y = dequantize(quantize(x, 32, 64, [0, 1], SLOT), [10, 5], x.dtype, 64, [0, 1], SLOT)
    assert torch.equal(x, y) and y.stride() == (5, 1)


def test_result_does_not_depend_on_the_input_strides():
    x = torch.randn(16, 32)
    manual_seed(5)
    contiguous = quantize(x, 2, 64, [0, 1], SLOT)
    manual_seed(5)
    transposed_storage = quantize(x.t().contiguous().t(), 2, 64, [0, 1], SLOT)
    assert torch.equal(contiguous, transposed_storage)


def test_quantize_leaves_torch_rng_alone():
    x = torch.randn(1000)
    state = torch.get_rng_state()
    quantize(x, 2, 64, [0], SLOT)
    assert torch.equal(state, torch.get_rng_state())


def test_manual_seed_makes_rounding_reproducible():
    x = torch.randn(1000)
    manual_seed(7)
    first = [quantize(x, 2, 64, [0], SLOT) for _ in range(2)]
    manual_seed(7)
    again = [quantize(x, 2, 64, [0], SLOT) for _ in range(2)]
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
    assert not torch.equal(first[0], first[1])  # every call draws fresh noise


def test_the_noise_state_lives_on_the_tensors_device_and_advances_there():
    slot = new_slot()
    site = DIRECTORY.site(slot)
    x = torch.randn(1000)
    quantize(x, 2, 64, [0], slot)
    state = site.rng_state(x.device)
    assert state.device == x.device and state.dtype == torch.int64 and state[1].item() == 1
    quantize(x, 2, 64, [0], slot)
    assert state[1].item() == 2  # the same tensor, advanced in place: what a CUDA graph replay reads


def test_a_replayed_trace_of_the_device_work_draws_fresh_noise(monkeypatch):
    # A CUDA graph records a call's device work once and replays it without Python: the
    # noise must come from state that the replayed work itself reads and advances. A seed
    # passed from Python (gact-fx before this) is a constant of the trace: every replay
    # would draw the same noise, and the gradient would no longer be unbiased. (Traced
    # through the torch reference: make_fx cannot see inside a compiled kernel.)
    monkeypatch.setenv("GACT_FX_KERNELS", "reference")
    site = DIRECTORY.site(new_slot())
    x = torch.randn(1000)
    state = site.rng_state(x.device)

    def device_work(t):
        blob = encode(t, 2, 64, state=state)
        site.advance(state)
        return blob

    replay = make_fx(device_work)(x)  # the trace advanced the counter once
    blobs = [replay(x) for _ in range(3)]
    assert not torch.equal(blobs[0], blobs[1]) and not torch.equal(blobs[1], blobs[2])
    state[1] = 1  # the counter as the first replay read it
    assert torch.equal(device_work(x), blobs[0])  # the same noise as eager code with that state


def test_two_registries_number_their_sites_apart_and_key_their_noise_by_index():
    first, second = SlotRegistry(), SlotRegistry()
    a, b = first.new_site(), second.new_site()
    assert a.slot != b.slot and a.index == b.index == 0
    x = torch.randn(1000)
    manual_seed(3)
    # the same position in two backends compiled alike: the same noise, so runs compare
    assert torch.equal(quantize(x, 2, 64, [0], a.slot), quantize(x, 2, 64, [0], b.slot))


@pytest.mark.parametrize("fused", [False, True])
def test_the_keys_op_gives_each_site_its_next_key_and_advances_each_once(fused):
    # gact::keys (the aten lowering's) hashes every site's key at once; one site at a time
    # is the reference. A pinned site keeps its count; a slot named twice draws two keys.
    batched, one_by_one = SlotRegistry(), SlotRegistry()
    sites = [batched.new_site() for _ in range(6)]
    twins = [one_by_one.new_site() for _ in range(6)]
    sites[2].pinned = twins[2].pinned = True
    cpu = torch.device("cpu")
    for _ in range(3):
        keys = next_keys(sites, cpu, fused=fused)
        assert torch.equal(keys, torch.stack([twin.next_key(cpu) for twin in twins]))
    assert [site.rng_state(cpu)[1].item() for site in sites] == [3, 3, 0, 3, 3, 3]
    twice = torch.ops.gact.keys([sites[0].slot, sites[0].slot], cpu)
    assert not torch.equal(twice[0], twice[1]) and sites[0].rng_state(cpu)[1].item() == 5
    assert torch.equal(next_keys([sites[2]], cpu, fused=fused), next_keys([sites[2]], cpu, fused=fused))  # pinned alone


def test_the_keys_op_launches_a_fixed_number_of_kernels_whatever_the_sites():
    registry = SlotRegistry()
    sites = [registry.new_site() for _ in range(16)]
    meta = torch.device("meta")  # the device path (fused counters), counted without a GPU
    next_keys(sites, meta)  # each site's state made once, as on its first step
    views = ("aten::slice", "aten::select", "aten::view", "aten::unsqueeze", "aten::as_strided")

    def ops_in(call) -> list[str]:
        """The ops called, not inside another (meta runs a foreach as one op per tensor)."""
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
            call()
        return sorted(event.name for event in profile.events()
                      if event.name.startswith("aten::") and event.cpu_parent is None and event.name not in views)

    batched = ops_in(lambda: next_keys(sites, meta))
    assert batched == ops_in(lambda: next_keys(sites[:2], meta)) and "aten::_foreach_add_" in batched
    # sixteen sites at once take fewer ops than two sites one at a time
    assert len(batched) < len(ops_in(lambda: [site.next_key(meta) for site in sites[:2]]))


def test_a_slot_without_a_live_site_is_a_clear_error():
    with pytest.raises(RuntimeError, match="no live site has slot"):
        quantize(torch.randn(10), 2, 64, [0], 10**9)


def test_fake_blob_size_is_symbolic_under_dynamic_shapes():
    def encode_symbolic(x):
        return quantize(x, 4, 64, [0, 1], SLOT)

    graph = make_fx(encode_symbolic, tracing_mode="symbolic")(torch.randn(10, 7))
    blob_val = graph.graph.find_nodes(op="output")[0].args[0].meta["val"]
    size = blob_val.shape[0]
    assert isinstance(size, torch.SymInt)
    hinted = fmt.float_blob_nbytes(70, 4, 64, 4)
    assert size.node.hint == hinted


@pytest.mark.parametrize("shape", [(512, 64), (2, 256, 24), (3, 100, 64)], ids=["transposable", "3-d", "copied"])
def test_feature_major_encoding_reads_the_source_in_place_and_decodes_to_its_layout(monkeypatch, shape):
    from gact_fx.runtime import cpu_kernels, kernels

    if not cpu_kernels.available():
        pytest.skip("no C++ codec here")
    calls = []
    for name in ("quantize_transposed", "dequantize_transposed"):
        original = getattr(cpu_kernels, name)
        monkeypatch.setattr(cpu_kernels, name, lambda *a, _f=original, _n=name, **k: calls.append(_n) or _f(*a, **k))
    x = torch.randn(shape)
    layout = list(range(x.dim()))
    perm = [layout[-1], *layout[:-1]]  # feature-major: the innermost dimension outermost
    key = torch.tensor([5, 6])
    blob = kernels.encode_permuted(x, perm, 4, 256, key=key)
    assert torch.equal(blob, encode(x.permute(perm).reshape(-1), 4, 256, key=key))
    y = kernels.decode_permuted(blob, list(shape), x.dtype, 256, perm, layout)
    assert y.stride() == x.stride() and torch.equal(y, arrange(kernels.decode(blob, x.numel(), x.dtype, 256), shape, perm, None))
    assert calls == ([] if shape == (3, 100, 64) else ["quantize_transposed", "dequantize_transposed"])


@pytest.mark.compat
def test_opcheck_with_a_layout(pinned_slot):
    x = torch.randn(256, 16)
    blob = quantize(x, 4, 64, [1, 0], pinned_slot)
    torch.library.opcheck(dequantize, (blob, [256, 16], torch.float32, 64, [1, 0], pinned_slot, [0, 1]))
    y = dequantize(blob, [256, 16], torch.float32, 64, [1, 0], pinned_slot, [0, 1])
    assert y.stride() == (16, 1) and (y - x).abs().max() <= (x.max() - x.min()) / 15
