"""Decide what to compress: from classified saved values to an immutable plan.

The plan says, per storage root, which forward node gets quantized (the root, with
the saved views replayed from it in backward, or each saved view on its own), at how
many bits and in which slot, how the backward uses it (``passes.uses``) and why it has
its bits; and, per saved value left alone, why. Views of one root that the backward
uses differently (attention's query and key through an exponential, its value
linearly) are compressed apart, so each gets the bits its use needs. Nothing here
touches a graph: ``rewrite.apply_plan`` does that.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.fx as fx

from .._compat import hint
from ..runtime.ops import blob_nbytes
from ..runtime.reference import FLOAT_DTYPES
from ..runtime.format import PASS_THROUGH_BITS, RUNTIME_BITS
from ..runtime.rotation import rotates
from .names import unique_names
from .saved import SavedGraph, SavedKind, SavedValue
from .statistics import row_statistics
from .uses import Use, UseClass
from .views import AliasPath, foreign_inputs, is_symint_node

if TYPE_CHECKING:  # the planner reads the config's core section; it does not import the config
    from ..config import CoreConfig

# What the backward holds for activations: compressible, and counted in the totals.
COMPRESSIBLE_KINDS = (SavedKind.INTERMEDIATE, SavedKind.GRAPH_INPUT, SavedKind.VIEW_OF_INPUT,
                      SavedKind.MODEL_OUTPUT, SavedKind.VIEW_OF_OUTPUT)
INPUT_KINDS = (SavedKind.GRAPH_INPUT, SavedKind.VIEW_OF_INPUT)
OUTPUT_KINDS = (SavedKind.MODEL_OUTPUT, SavedKind.VIEW_OF_OUTPUT)
_SKIP_REASONS = {
    SavedKind.PARAMETER: "parameter or buffer: held by the model anyway",
    SavedKind.VIEW_OF_PARAMETER: "view of a parameter: held by the model anyway",
    SavedKind.PARAMETER_COPY: "computed from parameters only (a weight copy): kept as it is, counted apart",
    SavedKind.SYMINT: "symbolic integer",
    SavedKind.OPAQUE: "not a tensor",
}


# Keys of a forward node's ``meta["gact"]`` left by ``passes.affine``: on a carrier, the
# elements of the saved tensors rebuilt from it; on a tensor no longer saved, the name of
# its carrier.
CARRIES = "carries"
REBUILT_FROM = "rebuilt_from"


def gact_meta(node: fx.Node) -> dict:
    """The node's ``meta["gact"]``: what gact's passes record about it (empty if nothing)."""
    return node.meta.get("gact", {})


@dataclass(frozen=True)
class Layout:
    """Hinted sizes and strides of a tensor, and the dimension order that makes it dense."""

    shape: tuple[int, ...]
    perm: tuple[int, ...]
    dense: bool  # non-overlapping and without gaps in the order ``perm``
    overlapping: bool  # some element is reachable twice (stride 0 on a dim > 1)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def layout_of(val: torch.Tensor) -> Layout:
    shape = tuple(hint(s) for s in val.shape)
    strides = tuple(hint(s) for s in val.stride())
    perm = tuple(sorted(range(len(shape)), key=lambda d: (-strides[d], d)))
    expected, dense = 1, True
    for dim in reversed(perm):
        if shape[dim] != 1 and strides[dim] != expected:
            dense = False
        expected *= shape[dim]
    overlapping = any(stride == 0 and size > 1 for size, stride in zip(shape, strides))
    return Layout(shape, perm, dense, overlapping)


def feature_order(layout: Layout, group_size: int) -> tuple[int, ...]:
    """The order that puts ``layout``'s innermost dimension (a linear layer's features)
    outermost, so that each group holds ``group_size`` tokens of one feature instead of
    the features of a few tokens; the layout's own order where that would not help
    (fewer than two dimensions, fewer than 8 features, or fewer tokens than a group)."""
    if len(layout.perm) < 2:
        return layout.perm
    inner = layout.perm[-1]
    features = layout.shape[inner]
    if features < 8 or layout.numel // features < group_size:
        return layout.perm
    return (inner, *layout.perm[:-1])


def encoding_order(layout: Layout, dtype: torch.dtype, group_size: int, feature_groups: bool) -> tuple[int, ...]:
    """The order a tensor's elements are encoded in: its own, or with ``feature_groups``
    the ``feature_order`` (bool masks are lossless: their order does not matter)."""
    if feature_groups and dtype != torch.bool:
        return feature_order(layout, group_size)
    return layout.perm


CHANNELS_LAST = (0, 2, 3, 1)  # the dense dimension order of a channels-last 4-D tensor


def nbytes_of(val: torch.Tensor) -> int:
    return layout_of(val).numel * val.element_size()


def node_nbytes(node: fx.Node) -> int:
    """Bytes of a graph value: a blob's from the plan, whose shape may be unbacked."""
    return gact_meta(node).get("nbytes") or nbytes_of(node.meta["val"])


@dataclass(frozen=True)
class Member:
    """A saved value served by a compression: rebuilt by replaying ``chain`` on the source."""

    position: int
    chain: tuple[fx.Node, ...]


@dataclass(frozen=True)
class Compression:
    source: fx.Node  # forward node to quantize
    members: tuple[Member, ...]
    bits: int  # 1 for bool (lossless); RUNTIME_BITS: read from the slot table at run time
    group_size: int
    perm: tuple[int, ...]  # the order its elements are encoded in: groups run along perm[-1]
    slot: int
    bytes_before: int  # full-precision bytes that saving kept alive (aliases once)
    bytes_after: int  # blob bytes
    label: str = ""  # unique human name (``passes.names``): what overrides and the controller use
    use: UseClass = UseClass(Use.LINEAR, "")  # how the backward consumes it (the worst of its members)
    floor: int = 1  # the fewest bits its use allows (``CoreConfig.nonlinear_bits`` for exponential uses)
    bits_reason: str = ""  # why it has its bits (``assign_bits``)
    bits_source: BitsSource | None = None  # where they came from (``assign_bits``)
    dense_perm: tuple[int, ...] | None = None  # the source's dense order (decoded into), where ``perm`` differs from it
    channels_last: bool = False  # the source is laid out channels-last at run time (``PlanOptions.channels_last``)
    carried_numel: int = 0  # elements of saved tensors the backward rebuilds from it (``passes.affine``)
    rotation: int = 0  # the Hadamard block it is rotated by below 32 bits (``runtime.rotation``); 0: none
    dithered: bool = False  # its blob keeps its key for a dithered decode (``CoreConfig.rounding``)

    @property
    def name(self) -> str:
        return self.source.name

    @property
    def is_float(self) -> bool:
        return self.source.meta["val"].dtype != torch.bool

    @property
    def groups(self) -> str:
        """What a group holds: ``"contiguous"`` elements, or tokens of one ``"feature"``."""
        return "contiguous" if self.dense_perm is None else "feature"


@dataclass(frozen=True)
class Skip:
    position: int
    reason: str
    bytes: int  # full-precision bytes kept; 0 for an alias already counted


@dataclass(frozen=True)
class CompressionPlan:
    compressions: tuple[Compression, ...]
    skips: tuple[Skip, ...]

    def compression_for(self, position: int) -> Compression | None:
        for compression in self.compressions:
            if any(m.position == position for m in compression.members):
                return compression
        return None

    def skip_for(self, position: int) -> Skip | None:
        return next((s for s in self.skips if s.position == position), None)


@dataclass(frozen=True)
class PlanOptions:
    """What the planner needs: the config's core section, and what one graph adds to it."""

    core: CoreConfig
    bits: int  # every float compression's width before any allocation (``GactConfig.initial_bits``)
    label_prefix: str = ""  # e.g. "g1/" for the second graph of a model
    # 4-D float intermediates are laid out channels-last, as Inductor's layout optimisation
    # leaves a convolutional graph's on the CPU: encode them in that order and decode them
    # into it, so that neither side needs a copy and the backward's convolutions get the
    # layout they were fast in (NCHW decodes made the tiny ResNet's backward 2x slower)
    channels_last: bool = False


class BitsSource(str, enum.Enum):
    """Where a compression's bits came from."""

    OVERRIDE = "override"  # the user's choice for that tensor: the floor of its use does not apply
    ADAPTIVE = "adaptive"  # run-time bits from the controller
    UNIFORM = "uniform"  # the config's ``bits``
    FLOOR = "floor"  # raised to the floor of its use
    MASK = "mask"  # a bool mask, lossless at 1 bit


@dataclass(frozen=True)
class BitsChoice:
    bits: int
    reason: str  # for people: the report's and the viewer's "why"
    source: BitsSource


# Chooses the bits of one (float) compression, and says why and from where.
BitsChooser = Callable[[Compression], BitsChoice]


def _replayable(path: AliasPath) -> bool:
    return all(is_symint_node(node) for node in foreign_inputs(path))


def _group_by_root(values) -> dict[fx.Node, list[SavedValue]]:
    groups: dict[fx.Node, list[SavedValue]] = {}
    for value in values:
        groups.setdefault(value.path.root, []).append(value)
    return groups


def _dtype_reason(val: torch.Tensor) -> str | None:
    if val.dtype == torch.bool or val.dtype in FLOAT_DTYPES:
        return None
    return f"dtype {val.dtype} passes through"


class _Planner:
    def __init__(self, options: PlanOptions, allocate_slot: Callable[[], int], uses: Mapping[int, UseClass],
                 statistics: Mapping[fx.Node, str]):
        self.options = options
        self.allocate_slot = allocate_slot
        self.uses = uses
        self.statistics = statistics  # forward nodes kept exact as row statistics -> their reduction
        self.compressions: list[Compression] = []
        self.skips: list[Skip] = []

    def use_of(self, positions) -> UseClass:
        found = [self.uses.get(p, UseClass(Use.LINEAR, "")) for p in positions]
        return max(found, key=lambda u: u.use)

    def skip_group(self, members: list[SavedValue], reason: str, held_bytes: int) -> None:
        for index, value in enumerate(members):
            self.skips.append(Skip(value.position, reason, held_bytes if index == 0 else 0))

    def compress(self, source: fx.Node, members: list[tuple[SavedValue, tuple]], held: int) -> None:
        val = source.meta["val"]
        if source.meta.get("gact", {}).get("role") in ("hoisted_mask", "hoisted_exp"):
            held = 0  # added by gact: not part of what the uncompressed graph saved
        layout = layout_of(val)
        channels_last = self._channels_last(source, layout, members)
        if channels_last:
            layout = dataclasses.replace(layout, perm=CHANNELS_LAST)
        perm = encoding_order(layout, val.dtype, self.options.core.group_size, self.options.core.feature_groups)
        bits = 1 if val.dtype == torch.bool else self.options.bits
        dithered = self.options.core.rounding == "dithered" and val.dtype != torch.bool
        after = hint(blob_nbytes(layout.numel, val.dtype, bits, self.options.core.group_size, dithered))
        use = self.use_of(value.position for value, _ in members)
        floor = self.options.core.nonlinear_bits if use.use is Use.EXPONENTIAL and val.dtype != torch.bool else 1
        self.compressions.append(
            Compression(
                source=source,
                members=tuple(Member(value.position, chain) for value, chain in members),
                bits=bits,
                group_size=self.options.core.group_size,
                perm=perm,
                dense_perm=None if perm == layout.perm else layout.perm,
                channels_last=channels_last,
                slot=self.allocate_slot(),
                bytes_before=held,
                bytes_after=after,
                use=use,
                floor=floor,
                carried_numel=sum(gact_meta(value.node).get(CARRIES, 0) for value, _ in members),
                rotation=self._rotation(val, bits, use),
                dithered=dithered,
            )
        )

    def _rotation(self, val: torch.Tensor, bits: int, use: UseClass) -> int:
        """The Hadamard block to rotate ``val`` by (0: none): ``rotation`` for every tensor,
        else ``nonlinear_rotation`` for those read through an exponential."""
        shape = [hint(s) for s in val.shape]
        core = self.options.core
        if rotates(shape, val.dtype, bits, core.rotation):
            return core.rotation
        if use.use is Use.EXPONENTIAL and rotates(shape, val.dtype, bits, core.nonlinear_rotation):
            return core.nonlinear_rotation
        return 0

    def _channels_last(self, source: fx.Node, layout: Layout, members) -> bool:
        """Whether to take ``source`` as channels-last: a 4-D float tensor the compiler lays out
        (not a graph input), traced contiguous, saved without views (which the traced
        strides would have to survive)."""
        val = source.meta["val"]
        return (
            self.options.channels_last and val.dim() == 4 and val.dtype in FLOAT_DTYPES and val.device.type == "cpu"
            and source.op != "placeholder" and layout.dense and layout.perm == (0, 1, 2, 3)
            and all(not chain for _, chain in members)
        )

    def plan_group(self, root: fx.Node, members: list[SavedValue]) -> None:
        root_val = root.meta["val"]
        held = nbytes_of(root_val)
        kind = members[0].kind
        if not self.options.core.enabled:
            self.skip_group(members, "gact disabled (baseline)", held)
            return
        if kind in INPUT_KINDS and not self.options.core.compress_inputs:
            self.skip_group(members, "graph input (compress_inputs=False)", held)
            return
        if kind in OUTPUT_KINDS and not self.options.core.compress_outputs:
            self.skip_group(members, "model output (compress_outputs=False): saved as the caller's copy", held)
            return
        root_saved = any(not v.path.is_view for v in members)
        replay_ok = layout_of(root_val).dense and all(_replayable(v.path) for v in members)
        separate_ok = all(not layout_of(v.val).overlapping for v in members)
        separate_numel = sum(layout_of(v.val).numel for v in members)
        uses_differ = len({self.use_of([v.position]).use for v in members}) > 1
        use_root = replay_ok and (
            root_saved or not separate_ok or (layout_of(root_val).numel <= separate_numel and not uses_differ)
        )
        if not use_root and not separate_ok:
            self.skip_group(members, "overlapping view whose view chain cannot be replayed", held)
            return
        sources = [(root, [(v, v.path.chain) for v in members])] if use_root else [
            (v.node, [(v, ())]) for v in members
        ]
        for index, (source, served) in enumerate(sources):
            val = source.meta["val"]
            reason = _dtype_reason(val)
            numel = layout_of(val).numel
            if reason is None and numel < max(self.options.core.min_numel, 1):
                reason = f"{numel} elements < min_numel={self.options.core.min_numel}"
            if reason is None and source in self.statistics and val.dtype != torch.bool:
                reason = f"row statistic of {self.statistics[source]}: kept exact (exact_statistics)"
            share = held if index == 0 else 0
            if reason is not None:
                self.skip_group([v for v, _ in served], reason, share)
            else:
                self.compress(source, served, share)


def plan_compression(
    saved: SavedGraph,
    options: PlanOptions,
    *,
    allocate_slot: Callable[[], int],
    uses: Mapping[int, UseClass] | None = None,
) -> CompressionPlan:
    """Decide, for every saved value, whether and how it is compressed, at ``options.bits``.

    ``allocate_slot`` numbers each compression (a backend's registry; a plain counter in
    tests). ``uses``: how the backward consumes the saved value at each position
    (``passes.uses.classify_uses``; default: linearly). Row statistics stay exact
    (``passes.statistics``, ``CoreConfig.exact_statistics``). Each compression is labelled
    with a unique name; ``assign_bits`` then sets per-tensor widths.
    """
    compressible = [v for v in saved.values if v.kind in COMPRESSIBLE_KINDS]
    statistics = (row_statistics(compressible[0].path.root.graph)
                  if compressible and options.core.enabled and options.core.exact_statistics else {})
    planner = _Planner(options, allocate_slot, uses or {}, statistics)
    copies_counted: set[fx.Node] = set()
    for value in saved.values:
        if value.kind not in COMPRESSIBLE_KINDS:
            held = 0
            if value.kind is SavedKind.PARAMETER_COPY and value.path.root not in copies_counted:
                copies_counted.add(value.path.root)
                held = nbytes_of(value.path.root.meta["val"])  # held for the backward, apart from activations
            planner.skips.append(Skip(value.position, _SKIP_REASONS[value.kind], held))
    for root, members in _group_by_root(compressible).items():
        planner.plan_group(root, members)
    labels = unique_names([c.source for c in planner.compressions], options.label_prefix)
    compressions = tuple(dataclasses.replace(c, label=labels[c.source]) for c in planner.compressions)
    return CompressionPlan(compressions, tuple(sorted(planner.skips, key=lambda s: s.position)))


def assign_bits(plan: CompressionPlan, choose: BitsChooser, estimate_bits: int | None = None) -> CompressionPlan:
    """A new plan with each float compression's bits set by ``choose`` (bools stay 1),
    raised to the floor of its use unless the user chose that tensor's bits.

    ``RUNTIME_BITS`` leaves the width to the site at run time (the controller keeps the
    floor); its bytes are then estimated at ``max(estimate_bits, floor)``.
    """
    updated = []
    for compression in plan.compressions:
        if not compression.is_float:
            updated.append(dataclasses.replace(compression, bits_reason="bool mask: lossless at 1 bit",
                                               bits_source=BitsSource.MASK))
            continue
        choice = choose(compression)
        bits, reason, source = choice.bits, choice.reason, choice.source
        floor = compression.floor if source != BitsSource.OVERRIDE else 1
        if floor > 1 and bits != RUNTIME_BITS and bits < floor:
            bits, source = floor, BitsSource.FLOOR
            reason = f"at least {floor} bits: {compression.use.use} use, {compression.use.reason}"
        elif floor > 1 and bits == RUNTIME_BITS:
            reason = f"{reason}, at least {floor} bits: {compression.use.use} use, {compression.use.reason}"
        val = compression.source.meta["val"]
        shown = max(estimate_bits or 1, floor) if bits == RUNTIME_BITS else bits
        after = hint(blob_nbytes(layout_of(val).numel, val.dtype, shown, compression.group_size, compression.dithered))
        rotation = 0 if bits == PASS_THROUGH_BITS else compression.rotation
        updated.append(dataclasses.replace(compression, bits=bits, bytes_after=after, floor=floor, bits_reason=reason,
                                           bits_source=source, rotation=rotation))
    return dataclasses.replace(plan, compressions=tuple(updated))


def activation_nbytes(saved: SavedGraph, kinds=COMPRESSIBLE_KINDS) -> int:
    """Bytes the saved values of ``kinds`` keep alive uncompressed, each storage root once."""
    roots = {v.path.root for v in saved.values if v.kind in kinds}
    return sum(nbytes_of(root.meta["val"]) for root in roots)
