"""The rounding noise's statistics: uniform, and independent across elements and keys."""

import pytest
import torch

from gact_fx.runtime import noise

COUNT = 1 << 16


def draws(key) -> torch.Tensor:
    return noise.uniform(key, torch.arange(COUNT, dtype=torch.int64))


def correlation(a: torch.Tensor, b: torch.Tensor) -> float:
    return torch.corrcoef(torch.stack([a.double(), b.double()]))[0, 1].item()


def test_the_noise_is_uniform_on_the_open_unit_interval():
    u = draws(noise.key_of(11, 22))
    assert 0.0 < u.min().item() and u.max().item() < 1.0
    # chi-square over 64 bins: 63 degrees of freedom, 0.1% quantile about 103
    counts = torch.histc(u, bins=64, min=0.0, max=1.0)
    expected = COUNT / 64
    assert ((counts - expected) ** 2 / expected).sum().item() < 103


@pytest.mark.parametrize("step", [1, 8, 16])
def test_elements_near_each_other_draw_uncorrelated_noise(step):
    # step 8: the two halves of one hash
    u = draws(noise.key_of(5, 6))
    assert abs(correlation(u[:-step], u[step:])) < 0.02


def test_keys_that_differ_in_one_word_draw_uncorrelated_noise():
    # the tests' and the probe's keys vary k0 or k1 alone, by small integers
    base = draws(noise.key_of(0, 977))
    for other in (noise.key_of(1, 977), noise.key_of(2, 977), noise.key_of(0, 978)):
        assert abs(correlation(base, draws(other))) < 0.02


def test_rounding_over_every_sixteen_bit_value_is_biased_by_at_most_two_to_the_minus_17():
    # every value the noise takes, as the kernels compute it: floor(t + u) in float32
    u = (torch.arange(1 << 16, dtype=torch.int64) * 2 + 1).float() * (1.0 / (1 << 17))
    fractions = torch.rand(200, generator=torch.Generator().manual_seed(0)) + 3.0  # t in [3, 4)
    expectation = torch.floor(fractions[:, None] + u[None, :]).double().mean(dim=1)
    assert (expectation - fractions.double()).abs().max().item() <= 2.0**-17 + 2.0**-21  # + t's float32 ulp
