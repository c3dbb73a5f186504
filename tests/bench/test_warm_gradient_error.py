"""The warm screen's yardstick against the minibatch's own noise (benchmarks/warm_gradient_error.py)."""

import pytest
import torch

from benchmarks.warm_gradient_error import added_variance, elements_above, variance_shares


def test_variance_added_is_a_share_of_the_minibatch_variance_per_tensor_and_overall():
    exact = torch.zeros(6)
    noise = torch.tensor([1.0, 1.0, 1.0, 4.0, 4.0, 4.0])  # two tensors of three elements
    # draws whose mean squared deviation is 0.25 an element on the first tensor, 4 on the second
    draws = [torch.tensor([0.5, -0.5, 0.5, 2.0, -2.0, 2.0]), torch.tensor([-0.5, 0.5, -0.5, -2.0, 2.0, -2.0])]
    share, (largest, where) = variance_shares(added_variance(draws, exact), noise, {"a": 3, "b": 3})
    assert share == pytest.approx((3 * 0.25 + 3 * 4.0) / 15.0)
    assert (largest, where) == (pytest.approx(1.0), "b")  # 4 against 4


def test_elements_above_counts_where_the_added_variance_exceeds_the_minibatchs():
    exact = torch.zeros(4)
    noise = torch.tensor([1.0, 1.0, 4.0, 0.0])  # the last element: no minibatch noise measured
    draws = [torch.tensor([2.0, 0.5, 1.0, 3.0]), torch.tensor([-2.0, -0.5, -1.0, -3.0])]
    assert elements_above(added_variance(draws, exact), noise) == pytest.approx(1 / 3)  # 4 > 1; 0.25 < 1; 1 < 4
