"""Layouts of shape operations: slice (reduction result), expand_dims, broadcast, transpose, reshape.

Each function maps the layout of an operand to a layout of the result such that the result is a
relabeling of the operand's registers (no data moves between threads): transpose and reshape keep
every register where it is; expand_dims and slice_layout drop or add a coordinate; broadcast reuses
threads that held duplicates and adds registers. The output dims of the layouts given here must be
the positional names dim0, dim1, ... (as every block layout's are).
"""

from __future__ import annotations

from typing import Sequence

from .linear import LANE, REGISTER, WARP, LinearLayout, dim_names, log2_exact, unit


def _check_block_layout(layout: LinearLayout) -> None:
    if layout.out_dims != dim_names(layout.rank):
        raise ValueError(f"expected a block layout with output dims dim0, dim1, ...; got {layout!r}")


def normalize_axis(axis: int, rank: int) -> int:
    """axis in range(rank), negative axes counting from the end; ValueError otherwise."""
    if not -rank <= axis < rank:
        raise ValueError(f"axis {axis} is out of range for a rank-{rank} block")
    return axis % rank


def axis_bits(layout: LinearLayout, axis: int) -> dict:
    """{input dim: bit mask} of the input bits that move along `axis` only (nonzero basis, zero
    coordinates on every other dim): the bits a reduction along `axis` combines over."""
    _check_block_layout(layout)
    axis = normalize_axis(axis, layout.rank)
    masks = {}
    for name in layout.in_dims:
        mask = 0
        for bit, v in enumerate(layout.bases_of(name)):
            if v[axis] and not any(c for d, c in enumerate(v) if d != axis):
                mask |= 1 << bit
        masks[name] = mask
    return masks


def slice_layout(layout: LinearLayout, axis: int) -> LinearLayout:
    """The layout of the result of reducing a block with `layout` along `axis` (axis removed).

    Register bits that moved along `axis` only are dropped (the thread combines those registers into
    one); lane and warp bits that did become zero bases (after the reduction every thread of such a
    group holds the result: a broadcast). Other bases lose their `axis` coordinate. The result
    register index is the parent's with the dropped bits removed (see reduction.reduction_plan).
    """
    _check_block_layout(layout)
    axis = normalize_axis(axis, layout.rank)
    masks = axis_bits(layout, axis)
    bases = {}
    for name in layout.in_dims:
        kept = []
        for bit, v in enumerate(layout.bases_of(name)):
            if name == REGISTER and masks[name] >> bit & 1:
                continue
            kept.append(v[:axis] + v[axis + 1:])
        bases[name] = kept
    return LinearLayout(bases, layout.shape[:axis] + layout.shape[axis + 1:])


def expand_dims(layout: LinearLayout, axis: int) -> LinearLayout:
    """Insert a size-1 dim at position `axis` (0..rank; negative counts from the end, like NumPy)."""
    _check_block_layout(layout)
    axis = normalize_axis(axis, layout.rank + 1)
    bases = {name: [v[:axis] + (0,) + v[axis:] for v in layout.bases_of(name)]
             for name in layout.in_dims}
    return LinearLayout(bases, layout.shape[:axis] + (1,) + layout.shape[axis:])


def broadcast(layout: LinearLayout, axis: int, size: int) -> LinearLayout:
    """Grow a size-1 dim `axis` to `size` without moving data.

    The new coordinate bits go, lowest first, to the lane bits, then the warp bits, whose basis was
    zero (threads that held duplicates now hold different columns of the same value), and the rest
    to new register bits appended after the existing ones. When the result layout is already chosen
    (say R), use `expand_dims(slice_layout(R, axis), axis)` as the operand layout instead; either
    way `convert.register_permutation(operand, result)` gives the register relabeling.
    """
    _check_block_layout(layout)
    axis = normalize_axis(axis, layout.rank)
    if layout.shape[axis] != 1:
        raise ValueError(f"broadcast needs a size-1 dim {axis}, layout has shape {layout.shape}")
    bits = log2_exact(size, "broadcast size")
    rank = layout.rank
    bases = {name: list(layout.bases_of(name)) for name in layout.in_dims}
    bases.setdefault(REGISTER, [])
    placed = 0
    for name in (LANE, WARP):
        for bit, v in enumerate(bases.get(name, [])):
            if placed < bits and not any(v):
                bases[name][bit] = unit(rank, axis, 1 << placed)
                placed += 1
    while placed < bits:
        bases[REGISTER].append(unit(rank, axis, 1 << placed))
        placed += 1
    shape = list(layout.shape)
    shape[axis] = size
    return LinearLayout(bases, tuple(shape))


def broadcast_to(layout: LinearLayout, shape: Sequence[int]) -> LinearLayout:
    """`broadcast` every size-1 dim of the layout that `shape` makes larger (same rank)."""
    _check_block_layout(layout)
    shape = tuple(shape)
    if len(shape) != layout.rank:
        raise ValueError(f"cannot broadcast shape {layout.shape} to {shape}: ranks differ")
    for d, (have, want) in enumerate(zip(layout.shape, shape)):
        if have != want:
            if have != 1:
                raise ValueError(f"cannot broadcast shape {layout.shape} to {shape} along dim {d}")
            layout = broadcast(layout, d, want)
    return layout


def transpose(layout: LinearLayout, order: Sequence[int]) -> LinearLayout:
    """Permute the dims like numpy.transpose(x, order): result dim i is operand dim order[i]."""
    _check_block_layout(layout)
    order = tuple(order)
    if sorted(order) != list(range(layout.rank)):
        raise ValueError(f"order {order} is not a permutation of range({layout.rank})")
    bases = {name: [tuple(v[d] for d in order) for v in layout.bases_of(name)]
             for name in layout.in_dims}
    return LinearLayout(bases, tuple(layout.shape[d] for d in order))


def _row_major_bits(shape: Sequence[int]) -> list:
    """Bit offset of each dim's coordinate in the row-major linear index (last dim lowest)."""
    offsets, offset = [0] * len(shape), 0
    for d in reversed(range(len(shape))):
        offsets[d] = offset
        offset += log2_exact(shape[d], "block dim")
    return offsets


def reshape(layout: LinearLayout, shape: Sequence[int]) -> LinearLayout:
    """The same elements viewed with another shape (row-major order, like numpy.reshape).

    With power-of-two dims the row-major index is a concatenation of coordinate bits, so the
    reshape is linear and every register stays where it is. ValueError if the sizes differ.
    """
    _check_block_layout(layout)
    shape = tuple(shape)
    numel = 1
    for s in shape:
        numel *= s
    if numel != layout.numel:
        raise ValueError(f"cannot reshape a block of shape {layout.shape} to {shape}")
    old_bits, new_bits = _row_major_bits(layout.shape), _row_major_bits(shape)

    def relabel(v):
        flat = sum(c << b for c, b in zip(v, old_bits))
        return tuple((flat >> b) & (s - 1) for b, s in zip(new_bits, shape))

    bases = {name: [relabel(v) for v in layout.bases_of(name)] for name in layout.in_dims}
    return LinearLayout(bases, shape)
