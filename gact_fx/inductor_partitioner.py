"""Inductor's view of the gact partitioner (imported only on the Inductor path).

Inductor accepts a custom partitioner through ``config.custom_partitioner_fn``; it must
subclass ``CustomPartitionerFn`` and give a ``uuid()`` that changes whenever the
partitioner's behaviour can (gact's code and config), or Inductor's caches would
return graphs compressed under other settings. ``__reduce__`` keeps the object
picklable for cache keys: a reduced copy keeps only its uuid.
"""

from __future__ import annotations

import functools
import pathlib

from ._compat import custom_partitioner_base, hash_files
from .partitioner import GactPartitioner


@functools.cache
def _code_hash() -> str:
    package = pathlib.Path(__file__).parent
    return hash_files(sorted(str(p) for p in package.rglob("*.py"))).hex()


class InductorGactPartitioner(custom_partitioner_base()):
    def __init__(self, partitioner: GactPartitioner | None, uuid: str | None = None) -> None:
        self.partitioner = partitioner
        self._uuid = uuid or f"gact-{_code_hash()}-{partitioner.config!r}"

    def __call__(self, gm, joint_inputs, **kwargs):
        if self.partitioner is None:
            raise RuntimeError("a reduced gact partitioner only carries a cache key and cannot partition")
        return self.partitioner(gm, joint_inputs, **kwargs)

    def uuid(self) -> str:
        return self._uuid

    def __reduce__(self):
        return (InductorGactPartitioner, (None, self._uuid))
