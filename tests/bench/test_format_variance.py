"""The closed forms the format comparison rests on (benchmarks/format_variance.py)."""

import pytest
import torch

from benchmarks.format_variance import (
    GROUP, dithered_error, feature_groups, levels_at, per_group_widths, rotated_error, stochastic_variance,
)


def test_stochastic_variance_is_the_mean_squared_error_of_unbiased_rounding():
    generator = torch.Generator().manual_seed(0)
    groups = torch.rand(4, 64, generator=generator, dtype=torch.float64)
    levels = levels_at(groups.amin(1, keepdim=True), groups.amax(1, keepdim=True), (0, 0.35, 0.65, 1))
    at = torch.searchsorted(levels.contiguous(), groups.contiguous(), right=True).clamp(1, 3)
    low, high = levels.gather(1, at - 1), levels.gather(1, at)
    up = (groups - low) / (high - low)
    draws = torch.rand(20000, *groups.shape, generator=generator, dtype=torch.float64) < up
    rounded = torch.where(draws, high, low)
    assert rounded.mean(0).sub(groups).abs().max() < 0.01  # unbiased
    expected = float(((rounded - groups) ** 2).mean(0).sum())
    assert stochastic_variance(groups, levels) == pytest.approx(expected, rel=0.02)


def test_widths_chosen_per_group_of_equal_ranges_are_uniform_dithered():
    ranges = torch.full((10,), 3.0, dtype=torch.float64) ** 2
    assert per_group_widths(ranges, 2) == pytest.approx(10 * GROUP * (3.0 / 3) ** 2 / 12)
    uneven = torch.tensor([100.0, 1.0] * 5, dtype=torch.float64) ** 2
    uniform = float((uneven / 9).sum()) * GROUP / 12
    assert per_group_widths(uneven, 2) < 0.5 * uniform  # the wide groups take the bits


def test_feature_groups_hold_one_feature_over_whole_blocks_of_tokens():
    x = torch.arange(2 * GROUP + 5, dtype=torch.float64)[:, None] * torch.tensor([1.0, -1.0, 10.0], dtype=torch.float64)
    groups = feature_groups(x)
    assert groups.shape == (2 * 3, GROUP)  # the 5 tokens past the last whole block are left out
    assert torch.equal(groups[1], -torch.arange(GROUP, dtype=torch.float64))
    assert feature_groups(x[:GROUP - 1]).shape == (0, GROUP)


def test_dithered_error_is_the_mean_squared_error_of_dithered_rounding():
    generator = torch.Generator().manual_seed(1)
    groups = torch.randn(3, 64, generator=generator, dtype=torch.float64)
    low, step = groups.amin(1, keepdim=True), (groups.amax(1, keepdim=True) - groups.amin(1, keepdim=True)) / 3
    noise = torch.rand(20000, *groups.shape, generator=generator, dtype=torch.float64)
    rounded = low + (torch.floor((groups - low) / step + noise) + 0.5 - noise) * step  # subtractive dither
    expected = float(((rounded - groups) ** 2).mean(0).sum())
    assert float(dithered_error(groups)) == pytest.approx(expected, rel=0.02)


def test_a_rotation_lowers_the_error_of_heavy_tailed_features_and_not_of_gaussian_ones():
    """Feature groups already give an outlier feature a group of its own; what a rotation along
    the features narrows is each feature's tail against its spread (rare spikes, here one a
    feature, at different tokens)."""
    generator = torch.Generator().manual_seed(2)
    gaussian = torch.randn(GROUP, 32, generator=generator, dtype=torch.float64)
    spiky = 0.01 * gaussian.clone()
    spiky[torch.randperm(GROUP, generator=generator)[:32], torch.arange(32)] = 10.0
    plain = lambda x: float(dithered_error(feature_groups(x)))  # noqa: E731
    assert float(rotated_error(spiky, 32)) < 0.3 * plain(spiky)
    assert float(rotated_error(gaussian, 32)) == pytest.approx(plain(gaussian), rel=0.3)
    assert rotated_error(gaussian[:, :31], 32) is None  # features short of a block
