"""What gact did to each compiled graph: one row per saved value, and the totals.

A ``GraphRecord`` is written by the partitioner for every graph it rewrites; a
``Report`` gathers the records of one backend. Byte counts come from the graphs'
metadata (``meta["val"]``, at the sizes of the first compile when shapes are dynamic),
deduplicated by storage root, so an alias never counts twice. Only activations
(intermediates and graph inputs) enter the totals: parameters and outputs are saved
by reference and cost no extra memory.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from ._compat import hint
from .config import GactConfig
from .passes.plan import COMPRESSIBLE_KINDS, CompressionPlan, activation_nbytes, layout_of
from .passes.memory import Timeline
from .passes.saved import SavedGraph, SavedKind
from .passes.snapshot import GraphView
from .runtime.ops import blob_nbytes
from .runtime.table import RUNTIME_BITS, TABLE

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

    @property
    def is_activation(self) -> bool:
        return self.kind in {k.value for k in COMPRESSIBLE_KINDS}


def _producer(node) -> str:
    if node.op == "placeholder":
        return "input"
    return getattr(node.target, "__name__", str(node.target))


def _current_bits(compression) -> tuple[int, int]:
    """Bits and blob bytes now: run-time-bits slots are read from the slot table."""
    if compression.bits != RUNTIME_BITS:
        return compression.bits, compression.bytes_after
    bits = TABLE.bits.get(compression.slot)
    if bits is None:
        return compression.bits, compression.bytes_after
    val = compression.source.meta["val"]
    return bits, hint(blob_nbytes(layout_of(val).numel, val.dtype, bits, compression.group_size))


def _rows(index: int, saved: SavedGraph, plan: CompressionPlan) -> list[SavedTensorRow]:
    rows = []
    for value in saved.values:
        val = value.val
        shape = tuple(layout_of(val).shape) if hasattr(val, "shape") else ()
        dtype = str(val.dtype).replace("torch.", "") if hasattr(val, "dtype") else type(val).__name__
        common = dict(graph=index, name=value.node.name, kind=str(value.kind), shape=shape, dtype=dtype)
        compression = plan.compression_for(value.position)
        if compression is not None:
            first = compression.members[0].position == value.position
            stored = "compressed" if first else f"alias of {compression.name}"
            bits, after = _current_bits(compression)
            rows.append(
                SavedTensorRow(
                    **common,
                    bits=bits,
                    stored=stored,
                    bytes_before=compression.bytes_before if first else 0,
                    bytes_after=after if first else 0,
                    producer=_producer(compression.source),
                    source=compression.name,
                    stored_numel=layout_of(compression.source.meta["val"]).numel if first else 0,
                    slot=compression.slot,
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
            )
        )
    return rows


@dataclass
class GraphRecord:
    """One compiled graph: its saved values, the plan applied, and the code around it."""

    index: int
    compiler: str
    config: GactConfig
    saved: SavedGraph
    plan: CompressionPlan
    baseline_activation_bytes: int  # what the stock partition saved, before any gact pass
    code_before: tuple[str, str] = ("", "")
    code_after: tuple[str, str] = ("", "")
    pass_seconds: float = 0.0
    parameters: list = field(default_factory=list)  # weak references to the graph's parameters
    forward_view: GraphView | None = None  # the graphs as gact left them (plain data)
    backward_view: GraphView | None = None
    baseline_timeline: Timeline | None = None  # bytes held for backward, node by node
    timeline: Timeline | None = None

    @classmethod
    def build(cls, *, index, compiler, config, baseline, saved, plan) -> GraphRecord:
        """``baseline``: the stock partition's saved values; ``saved``: after gact's own passes."""
        return cls(index, compiler, config, saved, plan, activation_nbytes(baseline))

    @property
    def rows(self) -> list[SavedTensorRow]:
        """One row per saved value, with the bits in force now."""
        return _rows(self.index, self.saved, self.plan)

    def attach_code(self, *, before: tuple[str, str], after: tuple[str, str]) -> None:
        self.code_before, self.code_after = before, after

    def attach_views(self, *, forward: GraphView, backward: GraphView, baseline_timeline: Timeline, timeline: Timeline) -> None:
        self.forward_view, self.backward_view = forward, backward
        self.baseline_timeline, self.timeline = baseline_timeline, timeline

    @property
    def activation_bytes_before(self) -> int:
        return self.baseline_activation_bytes

    @property
    def activation_bytes_after(self) -> int:
        return sum(r.bytes_after for r in self.rows if r.is_activation)

    def summary(self) -> str:
        compressed = [r for r in self.rows if r.stored == "compressed"]
        line = (
            f"gact graph {self.index} ({self.compiler}): {len(self.rows)} saved values, "
            f"{len(compressed)} compressed; activations {format_bytes(self.activation_bytes_before)}"
            f" -> {format_bytes(self.activation_bytes_after)}"
        )
        if compressed:
            return line + f" ({_ratio(self.activation_bytes_before, self.activation_bytes_after)})"
        reasons = sorted({r.stored for r in self.rows})
        return line + "; nothing compressed: " + "; ".join(reasons)


@dataclass
class Report:
    """All graphs one backend compiled, with totals over them."""

    records: list[GraphRecord] = field(default_factory=list)

    @property
    def rows(self) -> list[SavedTensorRow]:
        return [row for record in self.records for row in record.rows]

    @property
    def activation_bytes_before(self) -> int:
        return sum(r.activation_bytes_before for r in self.records)

    @property
    def activation_bytes_after(self) -> int:
        return sum(r.activation_bytes_after for r in self.records)

    @property
    def num_compressed(self) -> int:
        return sum(1 for r in self.rows if r.stored == "compressed")

    def table(self) -> str:
        header = f"{'graph':>5} {'saved':<28} {'kind':<18} {'shape':<20} {'dtype':<9} {'bits':>4} {'before':>10} {'after':>10}  stored"
        lines = [header]
        for r in self.rows:
            bits = "-" if r.bits is None else str(r.bits)
            lines.append(
                f"{r.graph:>5} {r.name[:28]:<28} {r.kind:<18} {str(list(r.shape))[:20]:<20} {r.dtype:<9} "
                f"{bits:>4} {format_bytes(r.bytes_before):>10} {format_bytes(r.bytes_after):>10}  {r.stored}"
            )
        lines.append(
            f"total activations: {format_bytes(self.activation_bytes_before)} -> "
            f"{format_bytes(self.activation_bytes_after)} ({_ratio(self.activation_bytes_before, self.activation_bytes_after)})"
        )
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def format_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _ratio(before: int, after: int) -> str:
    return f"{before / after:.1f}x smaller" if after else "n/a"


def log_record(record: GraphRecord) -> None:
    log.info(record.summary())
    if log.isEnabledFor(logging.DEBUG):
        log.debug("\n%s", Report([record]).table())


__all__ = ["GraphRecord", "Report", "SavedTensorRow", "SavedKind", "log_record"]
