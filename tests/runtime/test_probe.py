"""The probe protocol (runtime.probe): only the probed call's blob is replaced, by what the controller asked for."""

import torch

from gact_fx.runtime import probe
from gact_fx.runtime.kernels import decode, encode
from gact_fx.runtime.noise import key_of


def _blob(x, key=(1, 2)):
    return encode(x.reshape(-1), 2, 64, key=key_of(*key))


def test_the_kept_call_is_replaced_by_exact_or_requantized_values_and_others_decode():
    x = torch.randn(4, 64)
    site = probe.SiteProbe()
    plain = _blob(x)
    marked = site.keep(x.t(), (1, 0), plain, token=7)  # kept in the blob's order: x.t().permute(1, 0) is x
    assert marked.numel() == plain.numel() + 8 and marked.numel() % 8 == plain.numel() % 8  # the tag, so the bits, kept
    assert site.kept and site.replacement(marked, x.numel(), x.dtype, 64) is None  # nothing asked yet
    site.exact()
    assert torch.equal(site.replacement(marked, x.numel(), x.dtype, 64), x.reshape(-1))
    assert site.replacement(plain, x.numel(), x.dtype, 64) is None  # another call of the graph
    other = probe.SiteProbe()
    other.keep(x, (0, 1), plain, token=8)
    other.exact()
    assert other.replacement(marked, x.numel(), x.dtype, 64) is None  # a token of another call
    key = probe.fresh_key(9, 3)
    site.requantized(2, key)
    expected = decode(_blob(x, key), x.numel(), x.dtype, 64)
    assert torch.equal(site.replacement(marked, x.numel(), x.dtype, 64), expected)
    site.release()
    assert site.idle and site.replacement(marked, x.numel(), x.dtype, 64) is None


def test_stashing_is_scoped_to_the_block():
    assert not probe.is_stashing(5)
    with probe.stashing(frozenset({5})):
        assert probe.is_stashing(5) and not probe.is_stashing(6)
    assert not probe.is_stashing(5)


def test_fresh_keys_differ_by_token_and_site():
    keys = {probe.fresh_key(token, index) for token in range(1, 50) for index in range(8)}
    assert len(keys) == 49 * 8
