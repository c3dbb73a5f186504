"""A pytest plugin that keeps one shard of the collected tests: ``GACT_TEST_SHARD=i/k``
keeps every k-th test from the i-th (0-based) and deselects the rest.

The GPU suite runs its tests part as k pytest processes at once, one shard each
(``-p gact_fx.bench.pytest_shards``): a GPU test's time is mostly Triton and Inductor
compiling on one CPU core, and the GPU machine has many. Without the variable the plugin
changes nothing.
"""

from __future__ import annotations

import os

VARIABLE = "GACT_TEST_SHARD"


def parse(value: str) -> tuple[int, int]:
    """``"i/k"`` as (i, k), refused unless 0 <= i < k."""
    try:
        index, count = (int(part) for part in value.split("/"))
    except ValueError:
        raise ValueError(f"{VARIABLE} must be 'i/k' (shard i of k, from 0), not {value!r}") from None
    if not 0 <= index < count:
        raise ValueError(f"{VARIABLE}={value!r}: the shard must be from 0 to {count - 1}")
    return index, count


def pytest_collection_modifyitems(config, items):
    value = os.environ.get(VARIABLE)
    if not value:
        return
    index, count = parse(value)
    kept = [item for position, item in enumerate(items) if position % count == index]
    dropped = [item for position, item in enumerate(items) if position % count != index]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
