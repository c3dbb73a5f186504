"""Run-time state of the compressed saved-tensor sites ("slots"), owned by each backend.

A ``SlotRegistry`` belongs to one backend. It numbers that backend's sites and holds,
per site: its run-time bit width (sites compiled with ``RUNTIME_BITS``), its
rounding-noise state on each device (``runtime.noise``), and, during a sensitivity
probe, its ``runtime.probe.SiteProbe``.

The ``gact::`` ops are called from compiled code with nothing but a slot number, so
one process-wide ``DIRECTORY`` maps numbers to sites (weakly: a site lives as long as
its registry, and the registry as long as its backend). Slot numbers are unique in
the process and handed out in compile order, so a program numbers its sites the same
way in every process (which keeps Inductor's FX graph cache effective). The directory
also holds the base seed of ``manual_seed``, the one knob that is process-wide by
design, like ``torch.manual_seed``.
"""

from __future__ import annotations

import ctypes
import itertools
import threading
import weakref

import torch

from .. import _compat
from .noise import call_key, call_keys, mix64, slot_key
from .probe import SiteProbe


class Site:
    """One compressed saved tensor of a compiled graph."""

    def __init__(self, registry: SlotRegistry, slot: int, index: int) -> None:
        self.slot = slot
        self.index = index  # position in its registry: keys the rounding noise
        self._registry = weakref.ref(registry)
        self.bits: int | None = None  # run-time width of a RUNTIME_BITS site
        self.pinned = False  # the same noise on every call (opcheck compares calls)
        self.probe = SiteProbe()  # its part in a sensitivity probe (``runtime.probe``)
        self.rotation = 0  # the Hadamard block of its lossy blobs (``runtime.rotation``); 0: none
        self.dithered = False  # its float blobs keep their key for a dithered decode (``runtime.format``)
        self._states: dict[torch.device, torch.Tensor] = {}
        self._host_count: ctypes.c_int64 | None = None  # the CPU state's count, written in place

    def __repr__(self) -> str:
        return f"Site(slot={self.slot}, index={self.index}, bits={self.bits})"

    @property
    def registry(self) -> SlotRegistry:
        registry = self._registry()
        if registry is None:
            raise RuntimeError(f"gact: the backend that owned slot {self.slot} is gone")
        return registry

    def runtime_bits(self) -> int:
        if self.bits is None:
            raise RuntimeError(f"gact: slot {self.slot} has no run-time bits (was it compiled with adaptive bits?)")
        return self.bits

    def rng_state(self, device: torch.device) -> torch.Tensor:
        """``[slot_key, count, ticket]`` (int64) on ``device``: read and advanced there, never on
        the host (``ticket``: the Triton kernels' count of programs done, 0 between calls)."""
        state = self._states.get(device)
        if state is None:
            key = slot_key(DIRECTORY.process_seed(), self.index)
            state = self._states[device] = torch.tensor([key, 0, 0], dtype=torch.int64, device=device)
            if state.is_cpu:  # lives as long as the state it points into, which this site keeps
                self._host_count = ctypes.c_int64.from_address(state.data_ptr() + state.element_size())
        return state

    def advance(self, state: torch.Tensor) -> None:
        """Count one call (on the device): the next call draws other noise."""
        if self.pinned:
            return
        if state.is_cpu and self._host_count is not None and not _compat.dispatch_mode_active():
            # 0.1 us against 2 us for the torch op, once per saved tensor and step; on the CPU
            # nothing replays device work, and a tracer that records it (make_fx) gets the op
            self._host_count.value += 1
        else:
            state[1:2].add_(1)

    def next_key(self, device: torch.device) -> torch.Tensor:
        state = self.rng_state(device)
        key = call_key(state)
        self.advance(state)
        return key

    def reseed(self, process_seed: int) -> None:
        key = slot_key(process_seed, self.index)
        for state in self._states.values():
            state.copy_(torch.tensor([key, 0, 0], dtype=torch.int64))

    def release_probe(self) -> None:
        self.probe.release()


def next_keys(sites: list[Site], device: torch.device, *, fused: bool | None = None) -> torch.Tensor:
    """``next_key`` of each site (``len(sites) x 2``) in about 30 kernels however many sites
    there are, where one site at a time took about 28 each: the states stacked, the keys
    hashed together, the counters advanced by one fused add (``fused``; by default off the
    CPU, whose counters are bumped on the host)."""
    if len({site.slot for site in sites}) < len(sites):  # a site twice: its second key follows its first
        return torch.stack([site.next_key(device) for site in sites])
    states = [site.rng_state(device) for site in sites]
    keys = call_keys(torch.stack(states))
    counted = [(site, state) for site, state in zip(sites, states) if not site.pinned]
    if fused is None:
        fused = device.type != "cpu"
    if fused and counted:
        _compat.add_one_([state[1:2] for _, state in counted])
    else:
        for site, state in counted:
            site.advance(state)
    return keys


class SlotRegistry:
    """The sites of one backend."""

    def __init__(self) -> None:
        self.sites: dict[int, Site] = {}
        self._tokens = itertools.count(1)
        DIRECTORY.adopt(self)

    def new_site(self) -> Site:
        site = Site(self, DIRECTORY.next_slot(), len(self.sites))
        self.sites[site.slot] = site
        DIRECTORY.register(site)
        return site

    def new_token(self) -> int:
        return next(self._tokens)

    def bits(self, slot: int) -> int | None:
        site = self.sites.get(slot)
        return site.bits if site is not None else None

    def reseed(self, process_seed: int) -> None:
        for site in self.sites.values():
            site.reseed(process_seed)


class Directory:
    """Slot number -> site, for the ops; the live registries; the base seed."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._numbers = itertools.count()
        self._sites: weakref.WeakValueDictionary[int, Site] = weakref.WeakValueDictionary()
        self._registries: weakref.WeakSet[SlotRegistry] = weakref.WeakSet()
        self.base_seed = mix64(0)

    def next_slot(self) -> int:
        with self._lock:
            return next(self._numbers)

    def register(self, site: Site) -> None:
        self._sites[site.slot] = site

    def adopt(self, registry: SlotRegistry) -> None:
        self._registries.add(registry)

    def dithers(self, slot: int) -> bool:
        """Whether the site of ``slot`` writes dithered blobs (False for a slot with no live
        site: a pass traced without a backend)."""
        site = self._sites.get(slot)
        return site is not None and site.dithered

    def site(self, slot: int) -> Site:
        site = self._sites.get(slot)
        if site is None:
            raise RuntimeError(
                f"gact: no live site has slot {slot}: the backend that compiled this graph was garbage-collected, "
                "or the graph was not compiled by gact"
            )
        return site

    def process_seed(self) -> int:
        """The base seed mixed with this process's rank under torch.distributed (rank 0 and a
        single process: the base seed itself). Ranks that drew the same noise would round
        alike wherever their values sit alike, so averaging their gradients would not average
        the rounding error away as it does the minibatch's."""
        return rank_seed(self.base_seed, _distributed_rank())

    def manual_seed(self, seed: int) -> None:
        self.base_seed = mix64(int(seed))
        for registry in list(self._registries):
            registry.reseed(self.process_seed())


def rank_seed(base_seed: int, rank: int) -> int:
    """The seed rank ``rank`` draws its noise from (rank 0: ``base_seed`` itself)."""
    return base_seed if rank == 0 else mix64(base_seed ^ mix64(rank))


def _distributed_rank() -> int:
    distributed = torch.distributed
    return distributed.get_rank() if distributed.is_available() and distributed.is_initialized() else 0


DIRECTORY = Directory()

def manual_seed(seed: int) -> None:
    """Make gact's stochastic rounding reproducible (independent of ``torch.manual_seed``).

    Every site of every backend starts its noise sequence again from ``seed``. Under
    torch.distributed each rank mixes its rank into ``seed`` (rank 0 keeps it as it is),
    so that ranks round independently.
    """
    DIRECTORY.manual_seed(seed)
