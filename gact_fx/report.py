"""What gact did to each compiled graph: one row per saved value, and the totals.

A ``GraphRecord`` is written by the partitioner for every graph it rewrites, as plain
data (Inductor goes on to rewrite the FX graphs in place, so none of their nodes are
kept): a row per saved value and a ``CompressionRecord`` per compressed tensor. A
``Report`` is a snapshot of one backend's records with the bit widths in force when it
was taken (adaptive sites change theirs at run time). Byte counts come from the graphs'
metadata (``meta["val"]``, at the sizes of the first compile when shapes are dynamic),
deduplicated by storage root, so an alias never counts twice. The totals count what
the backward holds when the caller keeps only the loss: activations (intermediates,
graph inputs, and the model outputs the backward saves). Parameters cost nothing extra;
copies of weights (computed from parameters only) are counted apart.

Rows are named as a user knows them: by module path and function (``blocks.0.fc1:linear``,
``passes.names``), the FX node beside it. A report can also say that nothing was compiled
and why (``note``), or describe the saved-tensor hooks of ``compress(..., fallback="hooks")``
(``HookStep``), which compress without any graph.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from ._compat import hint
from .config import GactConfig
from .passes.memory import Timeline
from .passes.names import tensor_name
from .passes.plan import (COMPRESSIBLE_KINDS, REBUILT_FROM, CompressionPlan, activation_nbytes, gact_meta, layout_of,
                          nbytes_of)
from .passes.saved import SavedGraph, SavedKind
from .passes.snapshot import GraphView
from .runtime.format import RUNTIME_BITS
from .runtime.ops import blob_nbytes

log = logging.getLogger("gact_fx")


@dataclass(frozen=True)
class SavedTensorRow:
    graph: int
    name: str  # forward node saved
    kind: str
    shape: tuple[int, ...]
    dtype: str
    bits: int | None  # None: kept as is
    stored: str  # "compressed", "alias of X", or the reason it was kept
    bytes_before: int  # full-precision bytes held (0 for an alias counted elsewhere)
    bytes_after: int
    producer: str  # the op that produced the stored value
    source: str  # the forward node actually stored (the storage root when views are replayed)
    stored_numel: int  # elements of ``source`` (0 on an alias row: counted on another row)
    slot: int | None = None
    group_size: int | None = None  # compressed rows
    use: str = ""  # how the backward consumes it: linear, smooth, exponential (``passes.uses``)
    bits_reason: str = ""  # why it has its bits
    bits_source: str = ""  # where they came from: override, adaptive, uniform, floor, mask (``passes.plan.BitsSource``)
    groups: str = ""  # compressed rows: "contiguous" elements or tokens of one "feature" per group, and the rotation
    label: str = ""  # the name a user knows: module path and function (``passes.names``)
    dithered: bool = False  # compressed rows: its blob keeps its key for a dithered decode

    @property
    def is_activation(self) -> bool:
        return self.kind in {k.value for k in COMPRESSIBLE_KINDS}

    @property
    def is_parameter_copy(self) -> bool:
        return self.kind == SavedKind.PARAMETER_COPY.value


@dataclass(frozen=True)
class CompressionRecord:
    """A compressed tensor of a graph, as plain data (a ``passes.plan.Compression`` without nodes)."""

    slot: int
    label: str  # unique human name: what overrides and the controller use
    source: str  # the forward node quantized
    dtype: str
    numel: int
    itemsize: int
    bits: int  # RUNTIME_BITS: the site's width is set at run time
    group_size: int
    bytes_before: int
    bytes_after: int
    use: str = "linear"  # how the backward consumes it (``passes.uses``)
    use_reason: str = ""
    floor: int = 1  # the fewest bits its use allows
    bits_reason: str = ""
    bits_source: str = ""  # override, adaptive, uniform, floor or mask (``passes.plan.BitsSource``)
    groups: str = "contiguous"  # or "feature": tokens of one feature per group (``feature_groups``)
    carried_numel: int = 0  # elements of saved tensors the backward rebuilds from it (``passes.affine``)
    device: str = "cpu"  # where the tensor lives: its site's noise state is made there at compile time
    rotation: int = 0  # the Hadamard block it is rotated by below 32 bits (``runtime.rotation``); 0: none
    dithered: bool = False  # its blob keeps its key for a dithered decode (``CoreConfig.rounding``)

    @property
    def is_float(self) -> bool:
        return self.dtype != "bool"


def _source_name(compression) -> str:
    return compression.bits_source.value if compression.bits_source is not None else ""


def _producer(node) -> str:
    if node.op == "placeholder":
        return "input"
    return getattr(node.target, "__name__", str(node.target))


def _dtype_name(val) -> str:
    return str(val.dtype).replace("torch.", "") if hasattr(val, "dtype") else type(val).__name__


def _rebuilt_rows(index: int, baseline: SavedGraph, saved: SavedGraph) -> list[SavedTensorRow]:
    """Rows for the stock partition's saved tensors that the backward now rebuilds
    (``passes.affine``): held by nothing, so no bytes after."""
    still_saved = {v.node for v in saved.values}
    counted = {v.path.root for v in saved.values if v.path is not None}  # each storage on one row
    rows = []
    for value in baseline.tensors:
        carrier = gact_meta(value.node).get(REBUILT_FROM)
        if carrier is None or value.node in still_saved:
            continue
        val = value.val
        root = value.path.root if value.path is not None else value.node
        before = 0 if root in counted else nbytes_of(root.meta["val"])
        counted.add(root)
        rows.append(SavedTensorRow(
            graph=index, name=value.node.name, kind=str(value.kind), shape=tuple(layout_of(val).shape),
            dtype=_dtype_name(val), bits=None, stored=f"rebuilt in the backward from {carrier}",
            bytes_before=before, bytes_after=0, producer=_producer(value.node), source=value.node.name,
            stored_numel=0, label=_label(value.node, index),
        ))
    return rows


def _rows(index: int, saved: SavedGraph, plan: CompressionPlan) -> list[SavedTensorRow]:
    rows = []
    for value in saved.values:
        val = value.val
        shape = tuple(layout_of(val).shape) if hasattr(val, "shape") else ()
        common = dict(graph=index, name=value.node.name, kind=str(value.kind), shape=shape, dtype=_dtype_name(val))
        compression = plan.compression_for(value.position)
        if compression is not None:
            first = compression.members[0].position == value.position
            rows.append(
                SavedTensorRow(
                    **common,
                    bits=compression.bits,
                    stored="compressed" if first else f"alias of {compression.name}",
                    bytes_before=compression.bytes_before if first else 0,
                    bytes_after=compression.bytes_after if first else 0,
                    producer=_producer(compression.source),
                    source=compression.name,
                    stored_numel=layout_of(compression.source.meta["val"]).numel if first else 0,
                    slot=compression.slot,
                    group_size=compression.group_size,
                    use=str(compression.use.use),
                    bits_reason=compression.bits_reason,
                    bits_source=_source_name(compression),
                    groups=compression.groups + (f", Hadamard {compression.rotation}" if compression.rotation else ""),
                    label=compression.label,
                    dithered=compression.dithered,
                )
            )
            continue
        skip = plan.skip_for(value.position)
        root = value.path.root if value.path else value.node
        rows.append(
            SavedTensorRow(
                **common,
                bits=None,
                stored=skip.reason,
                bytes_before=skip.bytes,
                bytes_after=skip.bytes,
                producer=_producer(root),
                source=root.name,
                stored_numel=layout_of(root.meta["val"]).numel if skip.bytes else 0,
                label=_label(value.node, index),
            )
        )
    return rows


def _label(node, graph_index: int) -> str:
    prefix = f"g{graph_index}/" if graph_index else ""
    try:
        return prefix + tensor_name(node)
    except Exception:  # noqa: BLE001  (a name is a courtesy: never fail a compile over it)
        return prefix + node.name


def _compression_records(plan: CompressionPlan) -> tuple[CompressionRecord, ...]:
    return tuple(
        CompressionRecord(
            slot=c.slot,
            label=c.label,
            source=c.name,
            dtype=_dtype_name(c.source.meta["val"]),
            numel=layout_of(c.source.meta["val"]).numel,
            itemsize=c.source.meta["val"].element_size(),
            bits=c.bits,
            group_size=c.group_size,
            bytes_before=c.bytes_before,
            bytes_after=c.bytes_after,
            use=str(c.use.use),
            use_reason=c.use.reason,
            floor=c.floor,
            bits_reason=c.bits_reason,
            bits_source=_source_name(c),
            groups=c.groups,
            carried_numel=c.carried_numel,
            device=str(c.source.meta["val"].device),
            rotation=c.rotation,
            dithered=c.dithered,
        )
        for c in plan.compressions
    )


@dataclass
class GraphRecord:
    """One compiled graph: its saved values, what was compressed, and the code around it."""

    index: int
    compiler: str
    config: GactConfig
    rows: tuple[SavedTensorRow, ...]  # the bits of adaptive sites as compiled (RUNTIME_BITS)
    compressions: tuple[CompressionRecord, ...]
    baseline_activation_bytes: int  # what the stock partition saved, before any gact pass
    parameter_copy_bytes: int = 0  # weights' copies the backward holds (not activations; not compressed)
    code_before: tuple[str, str] = ("", "")
    code_after: tuple[str, str] = ("", "")
    pass_seconds: float = 0.0  # all of gact's work on the graph, after the stock partitioner
    passes: tuple = ()  # ``passes.pipeline.PassRun``: each pass and stage in order, its time and what it changed
    debiased_slots: frozenset = frozenset()  # sites whose attention bias ``passes.debias`` cancels
    parameters: list = field(default_factory=list)  # weak references to the graph's parameters
    forward_view: GraphView | None = None  # the graphs as gact left them (plain data)
    backward_view: GraphView | None = None
    baseline_timeline: Timeline | None = None  # bytes held for backward, node by node
    timeline: Timeline | None = None

    @classmethod
    def build(cls, *, index, compiler, config, baseline: SavedGraph, saved: SavedGraph, plan: CompressionPlan) -> GraphRecord:
        """``baseline``: the stock partition's saved values; ``saved``: after gact's own passes."""
        rows = _rows(index, saved, plan) + _rebuilt_rows(index, baseline, saved)
        return cls(index, compiler, config, tuple(rows), _compression_records(plan),
                   activation_nbytes(baseline), activation_nbytes(saved, (SavedKind.PARAMETER_COPY,)))

    @property
    def activation_bytes_before(self) -> int:
        return self.baseline_activation_bytes

    @property
    def activation_bytes_after(self) -> int:
        """At the widths the graph was compiled with (a ``Report`` gives those in force)."""
        return sum(r.bytes_after for r in self.rows if r.is_activation)

    def attach_code(self, *, before: tuple[str, str], after: tuple[str, str]) -> None:
        self.code_before, self.code_after = before, after

    def attach_views(self, *, forward: GraphView, backward: GraphView, baseline_timeline: Timeline, timeline: Timeline) -> None:
        self.forward_view, self.backward_view = forward, backward
        self.baseline_timeline, self.timeline = baseline_timeline, timeline


def _in_force(row: SavedTensorRow, bits: Mapping[int, int]) -> SavedTensorRow:
    """``row`` with the bits its site runs at now, and the bytes that gives."""
    if row.bits != RUNTIME_BITS or row.slot not in bits:
        return row
    width = bits[row.slot]
    after = row.bytes_after
    if row.stored == "compressed":
        after = hint(blob_nbytes(row.stored_numel, getattr(torch, row.dtype), width, row.group_size, row.dithered))
    return dataclasses.replace(row, bits=width, bytes_after=after)


@dataclass
class HookStep:
    """What the saved-tensor hooks of ``compress(..., fallback="hooks")`` did in the last training step."""

    bits: int
    packed: int = 0  # tensors compressed
    kept: int = 0  # saved as they are: parameters and buffers, integer tensors, tensors under min_numel
    derivatives: int = 0  # GELU, SiLU, tanh or sigmoid calls that saved their derivative instead (``local_derivatives``)
    bytes_before: int = 0  # the packed tensors in full precision
    bytes_after: int = 0  # their blobs


@dataclass
class Report:
    """A snapshot of the graphs one backend compiled, with the bits in force when it was taken;
    or of the hooks that compress a model torch.compile could not capture (``hooks``); or,
    with no records, why nothing was compressed (``note``)."""

    records: list[GraphRecord] = field(default_factory=list)
    bits_in_force: dict[int, int] = field(default_factory=dict)  # slot -> width, adaptive sites
    hooks: HookStep | None = None
    note: str = ""

    @property
    def compressed_anything(self) -> bool:
        return self.num_compressed > 0 or (self.hooks is not None and self.hooks.packed > 0)

    def rows_of(self, record: GraphRecord) -> list[SavedTensorRow]:
        return [_in_force(row, self.bits_in_force) for row in record.rows]

    @property
    def rows(self) -> list[SavedTensorRow]:
        return [row for record in self.records for row in self.rows_of(record)]

    def activation_bytes_after_of(self, record: GraphRecord) -> int:
        return sum(r.bytes_after for r in self.rows_of(record) if r.is_activation)

    @property
    def activation_bytes_before(self) -> int:
        if self.hooks is not None:
            return self.hooks.bytes_before
        return sum(r.baseline_activation_bytes for r in self.records)

    @property
    def activation_bytes_after(self) -> int:
        if self.hooks is not None:
            return self.hooks.bytes_after
        return sum(self.activation_bytes_after_of(r) for r in self.records)

    @property
    def parameter_copy_bytes(self) -> int:
        """Copies of weights the backward holds (Inductor's conv weight layouts on the CPU): apart."""
        return sum(r.parameter_copy_bytes for r in self.records)

    @property
    def num_compressed(self) -> int:
        return sum(1 for r in self.rows if r.stored == "compressed")

    def summary_of(self, record: GraphRecord) -> str:
        rows = self.rows_of(record)
        compressed = [r for r in rows if r.stored == "compressed"]
        before, after = record.baseline_activation_bytes, self.activation_bytes_after_of(record)
        line = (
            f"gact graph {record.index} ({record.compiler}): {len(rows)} saved values, "
            f"{len(compressed)} compressed; activations {format_bytes(before)} -> {format_bytes(after)}"
        )
        if compressed:
            return line + f" ({_ratio(before, after)})"
        reasons = sorted({r.stored for r in rows})
        return line + "; nothing compressed: " + "; ".join(reasons)

    def _hooks_table(self) -> str:
        step = self.hooks
        return (
            f"compressed through saved-tensor hooks at {step.bits} bits (fallback='hooks': torch.compile captured "
            f"no training graph), in the last step:\n"
            f"  {step.packed} tensors packed: {format_bytes(step.bytes_before)} -> {format_bytes(step.bytes_after)} "
            f"({_ratio(step.bytes_before, step.bytes_after)})\n"
            f"  {step.kept} kept as they are (parameters and buffers, integer tensors, tensors under min_numel)"
            + (f"\n  derivatives saved in place of what GELU, SiLU, tanh or sigmoid saves: {step.derivatives}"
               if step.derivatives else "")
        )

    def table(self) -> str:
        """One line per saved activation, named by module path; parameters folded into one line."""
        if self.hooks is not None:
            return self._hooks_table()
        if not self.records:
            return self.note or "no training graph was compiled"
        header = f"{'graph':>5} {'tensor':<40} {'FX node':<16} {'shape':<20} {'dtype':<9} {'bits':>4} {'before':>10} {'after':>10}  stored"
        lines = [header]
        folded = Counter()
        for r in self.rows:
            if not r.is_activation and not r.is_parameter_copy:
                folded[r.kind] += 1
                continue
            bits = "-" if r.bits is None else str(r.bits)
            lines.append(
                f"{r.graph:>5} {_clip(r.label or r.name, 40):<40} {r.name[:16]:<16} {str(list(r.shape))[:20]:<20} {r.dtype:<9} "
                f"{bits:>4} {format_bytes(r.bytes_before):>10} {format_bytes(r.bytes_after):>10}  {r.stored}"
            )
        if folded:
            lines.append("also saved, held by the model or not a tensor: "
                         + ", ".join(f"{count} {kind}" for kind, count in sorted(folded.items())))
        lines.append(
            f"total activations: {format_bytes(self.activation_bytes_before)} -> "
            f"{format_bytes(self.activation_bytes_after)} ({_ratio(self.activation_bytes_before, self.activation_bytes_after)})"
        )
        if self.parameter_copy_bytes:
            lines.append(f"weight copies held for the backward (not activations): {format_bytes(self.parameter_copy_bytes)}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def _clip(text: str, width: int) -> str:
    """``text`` in ``width`` characters, keeping its end (a module path's last parts and the function)."""
    return text if len(text) <= width else "..." + text[-(width - 3):]


def format_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _ratio(before: int, after: int) -> str:
    return f"{before / after:.1f}x smaller" if after else "n/a"


# Below this many bits the rounding of a tensor the backward reads through an exponential
# biases the gradient measurably (``tests/test_low_bits.py``): ``CoreConfig.nonlinear_bits``'s default.
UNBIASED_EXPONENTIAL_BITS = 8


def biased_exponentials(record: GraphRecord) -> list[CompressionRecord]:
    """The graph's tensors read through an exponential that are, or may be set (adaptive bits
    above their floor), stored below ``UNBIASED_EXPONENTIAL_BITS``, less those whose bias
    ``passes.debias`` cancels."""
    return [c for c in record.compressions if c.use == "exponential" and c.is_float
            and (c.floor if c.bits == RUNTIME_BITS else c.bits) < UNBIASED_EXPONENTIAL_BITS
            and c.slot not in record.debiased_slots]


def log_record(record: GraphRecord) -> None:
    report = Report([record])
    log.info(report.summary_of(record))
    biased = biased_exponentials(record)
    if biased:
        log.warning(
            "gact: graph %d may store %d tensors the backward reads through an exponential (%s) below %d bits "
            "(nonlinear_bits or overrides): their rounding biases the gradient, which the default floor of %d "
            "bits keeps near the averaging floor", record.index, len(biased), ", ".join(c.label for c in biased[:3])
            + (", ..." if len(biased) > 3 else ""), UNBIASED_EXPONENTIAL_BITS, UNBIASED_EXPONENTIAL_BITS)
    if log.isEnabledFor(logging.DEBUG):
        log.debug("\n%s", report.table())


__all__ = ["CompressionRecord", "GraphRecord", "HookStep", "Report", "SavedTensorRow", "SavedKind", "log_record"]
