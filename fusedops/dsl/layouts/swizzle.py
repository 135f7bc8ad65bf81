"""Choosing the shared-memory swizzle for a layout conversion through shared memory.

Threads store a block from layout A and load it into layout B. The swizzle (vec, per_phase,
max_phase, order of `shared.swizzled_shared`) decides both accesses' vector widths and bank
conflicts. The candidates are few (powers of two bounded by the block), so we evaluate each with
the bank model of `banks` and keep the one with the fewest total wavefronts (store + load) for a
warp: that favours wide vectors and no conflicts together, the quantity the hardware pays for.
Ties go to the simplest swizzle (smaller max_phase, then per_phase), then the widest vec.
"""

from __future__ import annotations

import dataclasses

from .banks import SharedAccessCost, group_wavefronts, shared_access_cost
from .linear import LinearLayout, log2_exact
from .shared import shared_offsets, swizzled_shared
from .vectorize import vector_width


@dataclasses.dataclass(frozen=True)
class SwizzleChoice:
    """The chosen shared layout and what it costs.

    layout: the shared layout (offset -> coords) = swizzled_shared(shape, vec, per_phase, max_phase, order).
    store, load: SharedAccessCost of the two accesses for warp 0 (vector width, wavefronts, conflicts).
    """

    layout: LinearLayout
    vec: int
    per_phase: int
    max_phase: int
    order: tuple
    store: SharedAccessCost
    load: SharedAccessCost


def contiguous_dim(layout: LinearLayout, element_bits: int) -> int:
    """The dim along which `layout`'s threads hold the widest vectors (the last dim on ties)."""
    widths = [vector_width(layout, d, element_bits) for d in range(layout.rank)]
    best = max(widths)
    return max(d for d, w in enumerate(widths) if w == best)


def _order_with_contiguous(rank: int, dim: int) -> tuple:
    return (dim,) + tuple(d for d in reversed(range(rank)) if d != dim)


def _powers(limit: int) -> list:
    """1, 2, 4, ... up to limit."""
    return [1 << k for k in range(max(0, limit).bit_length())]


def _estimate(layout: LinearLayout, shared: LinearLayout, element_bits: int) -> int:
    """Total wavefronts of warp 0 (one group counted, times the groups: see banks' docstring)."""
    offsets = shared_offsets(layout, shared)
    width = vector_width(offsets, 0, element_bits)
    wavefronts, _ = group_wavefronts(offsets, width, element_bits)
    return wavefronts * max(1, layout.num_registers // width)


def _candidates(shape: tuple, orders: list):
    # vec is the swizzle's granularity, not an access width: it may exceed 16 bytes.
    for order in orders:
        yield order, 1, 1, 1
        if len(shape) < 2:
            continue
        cols, rows = shape[order[0]], shape[order[1]]
        for vec in _powers(cols):
            for per_phase in _powers(rows):
                for max_phase in _powers(min(cols // vec, rows // per_phase)):
                    if max_phase > 1:
                        yield order, vec, per_phase, max_phase


def choose_swizzle(store_layout: LinearLayout, load_layout: LinearLayout, element_bits: int) -> SwizzleChoice:
    """The swizzled shared layout for storing from `store_layout` and loading into `load_layout`.

    Both are distributed layouts of the same block; element_bits is the element width. Tries the
    contiguous dim of either layout as the shared layout's contiguous dim and every swizzle that fits.
    Raises ValueError if the layouts' shapes differ.
    """
    if store_layout.shape != load_layout.shape:
        raise ValueError(f"store and load layouts have different shapes: {store_layout.shape} vs "
                         f"{load_layout.shape}")
    shape = store_layout.shape
    for s in shape:
        log2_exact(s, "block dim")
    orders = []
    for layout in (store_layout, load_layout):
        order = _order_with_contiguous(len(shape), contiguous_dim(layout, element_bits)) if shape else ()
        if order not in orders:
            orders.append(order)
    best_key, best = None, None
    for index, (order, vec, per_phase, max_phase) in enumerate(_candidates(shape, orders)):
        shared = swizzled_shared(shape, vec, per_phase, max_phase, order)
        total = _estimate(store_layout, shared, element_bits) + _estimate(load_layout, shared, element_bits)
        key = (total, max_phase, per_phase, -vec, index)
        if best_key is None or key < best_key:
            best_key, best = key, (shared, vec, per_phase, max_phase, order)
    shared, vec, per_phase, max_phase, order = best
    return SwizzleChoice(layout=shared, vec=vec, per_phase=per_phase, max_phase=max_phase, order=order,
                         store=shared_access_cost(store_layout, shared, element_bits),
                         load=shared_access_cost(load_layout, shared, element_bits))
