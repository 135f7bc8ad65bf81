"""Shared-memory layouts: which element of a block each shared-memory offset holds, with swizzling.

A shared layout is a bijective LinearLayout from the input dim "offset" (the element offset in the
buffer, in elements, not bytes) to the block's coordinates; its inverse gives the offset of an
element. XOR swizzling keeps it linear: element (row, col) of a 2-D tile (col the contiguous dim) is
stored at
    offset = row * ncols + (col ^ (vec * phase(row))),   phase(row) = (row // per_phase) % max_phase,
i.e. the 16-byte-ish chunks of `vec` elements of a row are permuted by XOR with the row's phase so
that the rows of a column hit different banks. With power-of-two parameters phase(row) is linear in
the row bits (swizzled shared memory as a linear layout: "Linear Layouts", arXiv 2505.23819).

The wgmma/TMA swizzle modes (PTX ISA 9.7.15.5.1.2 "Shared Memory Matrix Layout", and the
CU_TENSOR_MAP_SWIZZLE_{32B,64B,128B} modes of cuTensorMapEncodeTiled) are the same XOR on byte
addresses: the 16-byte chunk index (address bits 4..) is XORed with address bits 7.., over 1, 2 or
3 bits for the 32, 64 and 128-byte modes. For a tile whose rows are `swizzle_bytes` wide that is
vec = 16 bytes, per_phase = 128 / swizzle_bytes, max_phase = swizzle_bytes / 16.
"""

from __future__ import annotations

from typing import Optional, Sequence

from .linear import OFFSET, LinearLayout, log2_exact, unit

SWIZZLE_MODES = (32, 64, 128)


def _default_order(rank: int, order: Optional[Sequence[int]]) -> tuple:
    order = tuple(reversed(range(rank))) if order is None else tuple(order)
    if sorted(order) != list(range(rank)):
        raise ValueError(f"order {order} is not a permutation of range({rank})")
    return order


def _identity_bits(shape: tuple, dim: int, first_bit: int = 0, last_bit: Optional[int] = None) -> list:
    last_bit = log2_exact(shape[dim], "block dim") if last_bit is None else last_bit
    return [unit(len(shape), dim, 1 << k) for k in range(first_bit, last_bit)]


def _swizzled_row_bits(shape: tuple, row_dim: int, col_dim: int, vec: int, per_phase: int,
                       max_phase: int) -> list:
    """The offset bases of the row bits: row 2**k is stored with its chunk XORed by its phase."""
    out = []
    for k in range(log2_exact(shape[row_dim], "block dim")):
        phase = ((1 << k) // per_phase) % max_phase
        basis = list(unit(len(shape), row_dim, 1 << k))
        basis[col_dim] = vec * phase
        out.append(tuple(basis))
    return out


def swizzled_shared(shape: Sequence[int], vec: int = 1, per_phase: int = 1, max_phase: int = 1,
                    order: Optional[Sequence[int]] = None) -> LinearLayout:
    """A (possibly XOR-swizzled) shared layout of a block of `shape`; see the module docstring.

    order: dims from contiguous to slowest (default: last dim contiguous, row-major). The swizzle
    acts on order[0] (columns) and order[1] (rows); further dims are stacked tiles. vec, per_phase,
    max_phase: powers of two, vec * max_phase <= shape[order[0]]. max_phase = 1 is no swizzle.
    Raises ValueError for invalid parameters.
    """
    shape = tuple(shape)
    order = _default_order(len(shape), order)
    for value, name in ((vec, "vec"), (per_phase, "per_phase"), (max_phase, "max_phase")):
        log2_exact(value, name)
    if max_phase > 1 and (len(shape) < 2 or vec * max_phase > shape[order[0]]):
        raise ValueError(f"swizzle vec={vec} max_phase={max_phase} does not fit shape {shape} "
                         f"with contiguous dim {order[0] if order else None}")
    bases = _identity_bits(shape, order[0]) if shape else []
    if len(shape) >= 2:
        bases += _swizzled_row_bits(shape, order[1], order[0], vec, per_phase, max_phase)
    for d in order[2:]:
        bases += _identity_bits(shape, d)
    return LinearLayout({OFFSET: bases}, shape)


def nvmma_shared(shape: Sequence[int], element_bits: int, swizzle_bytes: int,
                 order: Optional[Sequence[int]] = None) -> LinearLayout:
    """The shared layout that wgmma descriptors and TMA use with a 32/64/128-byte swizzle mode.

    The contiguous dim (order[0], default last) is cut into atoms `swizzle_bytes` wide; each atom
    column is a contiguous (rows x swizzle_bytes) region, swizzled as in the module docstring, and
    the atoms follow each other (then the outer dims). This is the layout a TMA load with box inner
    size swizzle_bytes / element size writes, one box per atom.
    Raises ValueError for an unknown mode or a contiguous dim narrower than one atom.
    """
    shape = tuple(shape)
    if swizzle_bytes not in SWIZZLE_MODES:
        raise ValueError(f"swizzle_bytes must be one of {SWIZZLE_MODES}, got {swizzle_bytes}")
    if len(shape) < 2:
        raise ValueError(f"an NVMMA shared layout needs a block of rank >= 2, got shape {shape}")
    order = _default_order(len(shape), order)
    atom = swizzle_bytes * 8 // element_bits
    cols, rows = order[0], order[1]
    if shape[cols] < atom:
        raise ValueError(f"contiguous dim of size {shape[cols]} is narrower than one {swizzle_bytes}-byte "
                         f"swizzle atom ({atom} elements of {element_bits} bits); use a smaller mode")
    atom_bits = log2_exact(atom, "swizzle atom")
    bases = _identity_bits(shape, cols, 0, atom_bits)
    bases += _swizzled_row_bits(shape, rows, cols, vec=128 // element_bits,
                                per_phase=128 // swizzle_bytes, max_phase=swizzle_bytes // 16)
    bases += _identity_bits(shape, cols, atom_bits)
    for d in order[2:]:
        bases += _identity_bits(shape, d)
    return LinearLayout({OFFSET: bases}, shape)


def shared_offsets(layout: LinearLayout, shared: LinearLayout) -> LinearLayout:
    """(register, lane, warp) -> element offset in shared memory of the element each holds.

    `layout` is a distributed layout and `shared` a shared layout of the same shape. The result has
    one output dim "offset"; codegen computes an address as XOR of the lane/warp part (once per
    thread) with the register part (a constant per register). ValueError if the shapes differ or
    `shared` is not bijective.
    """
    if layout.shape != shared.shape or layout.out_dims != shared.out_dims:
        raise ValueError(f"shapes differ: {layout.shape} vs shared {shared.shape}")
    return layout.compose(shared.invert())
