"""How wide a cp.async copy of a loaded tile may be: what the layouts and the pointer analysis's proven
facts allow, and the narrowest copy cp.async takes (the pipelining rings, passes/invariant_operands.py and
the layout pass's choice of wgmma operands share these rules).
"""

from __future__ import annotations

from ..ir import Operation
from ..layouts.mma_shared import shared_contiguous_dim
from ..layouts.shared import shared_offsets
from ..layouts.vectorize import vector_width as register_vector_width
from ._axis_info import floor_pow2


MIN_COPY_BYTES = 4


def copy_width(analysis, load: Operation, tile) -> int:
    """Elements per cp.async along the tile's contiguous dim that the layout, the tile and the
    proven facts allow."""
    pointer = load.operands[0]
    element = pointer.type.element.element
    layout = pointer.layout
    dim = shared_contiguous_dim(tile)
    width = min(register_vector_width(layout, dim, element.bits),
                register_vector_width(shared_offsets(layout, tile), 0, element.bits))
    return floor_pow2(max(1, min(width, proven_copy_width(analysis, load, dim))))


def proven_copy_width(analysis, load: Operation, dim: int) -> int:
    """Elements per copy along `dim` that the pointer analysis proves for `load` (contiguous, aligned,
    and masked alike), whatever the layouts; 1 when nothing is known."""
    info = analysis.get(load.operands[0])
    if info is None:
        return 1
    width = min(info.contiguity[dim], info.divisibility[dim] // load.result.type.element.itemsize)
    if load.attrs.get("masked"):
        mask_info = analysis.get(load.operands[1])
        width = min(width, mask_info.constancy[dim] if mask_info is not None else 1)
    return width
