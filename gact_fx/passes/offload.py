"""GACT's L3: the compressed blobs wait in CPU memory between forward and backward.

Marks every blob gact saves (``meta["should_offload"]``) and runs torch's activation
offloading pass over the rewritten graphs, which moves each to the CPU after its last
forward use and back before its first backward use. Only blobs: what is still saved
uncompressed stays where it is.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch.fx as fx

from .._compat import mark_for_offload, offload_marked_activations
from .saved import output_node, static_placeholders
from .section import finish


def offload_blobs(fw: fx.GraphModule, bw: fx.GraphModule, num_fwd_outputs: int, static_indices: Sequence[int]) -> int:
    """Rewrite in place; returns how many blobs were marked for offloading."""
    saved = list(output_node(fw).args[0])[num_fwd_outputs:]
    blobs = [n for n in saved if isinstance(n, fx.Node) and n.meta.get("gact", {}).get("role") == "quantize"]
    for blob in blobs:
        mark_for_offload(blob)
    if blobs:
        offload_marked_activations(fw, bw, num_fwd_outputs, static_placeholders(fw, static_indices))
        finish(fw, bw, num_fwd_outputs)
    return len(blobs)
