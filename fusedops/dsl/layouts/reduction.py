"""How a reduction along one axis runs on a distributed layout.

Reducing a block with layout L along `axis` combines, for every element of the result, the
elements that differ only in their `axis` coordinate. With L linear, the input bits that move an
element along `axis` only are exactly the bits to combine over, in three steps (DESIGN.md, "From
block IR to per-thread code"):
  1. registers: each thread combines its registers that differ in `register_bits`;
  2. lanes: a butterfly of `shfl.sync.bfly` (xor) over `lane_bits` (offset 1 << bit each);
  3. warps: partial results go through shared memory and are combined over `warp_bits`.
Bits whose basis is zero (broadcast: threads or registers holding duplicates) are never combined,
so sums do not count duplicates twice. The result has layout `slice_layout(L, axis)`.
"""

from __future__ import annotations

import dataclasses

from ..errors import UnsupportedError
from .gf2 import Span
from .linear import LANE, REGISTER, WARP, LinearLayout
from .shape_ops import axis_bits, normalize_axis, slice_layout


def _bit_positions(mask: int) -> tuple:
    return tuple(b for b in range(mask.bit_length()) if mask >> b & 1)


@dataclasses.dataclass(frozen=True)
class ReductionPlan:
    """The bits a reduction combines over, per input dim, and the layout of its result.

    register_bits:      parent register bit positions combined inside a thread.
    kept_register_bits: parent register bit positions that form the result register index, lowest
                        first (result register j has bit i = parent bit kept_register_bits[i]).
    lane_bits:          lane bit positions combined with shfl.sync.bfly (xor offset 1 << bit).
    warp_bits:          warp bit positions combined through shared memory.
    result_layout:      slice_layout(parent, axis).
    """

    axis: int
    register_bits: tuple
    kept_register_bits: tuple
    lane_bits: tuple
    warp_bits: tuple
    result_layout: LinearLayout

    @property
    def lane_xor_offsets(self) -> tuple:
        """The shfl.sync.bfly lane offsets, one per butterfly step."""
        return tuple(1 << b for b in self.lane_bits)

    def _parent_base(self, result_register: int) -> int:
        base = 0
        for i, bit in enumerate(self.kept_register_bits):
            if result_register >> i & 1:
                base |= 1 << bit
        return base

    def parent_registers(self, result_register: int) -> tuple:
        """The parent registers a thread combines into result register `result_register`."""
        base = self._parent_base(result_register)
        out = []
        for combo in range(1 << len(self.register_bits)):
            r = base
            for i, bit in enumerate(self.register_bits):
                if combo >> i & 1:
                    r |= 1 << bit
            out.append(r)
        return tuple(out)

    def result_register(self, parent_register: int) -> int:
        """The result register that parent register `parent_register` contributes to."""
        return sum(1 << i for i, bit in enumerate(self.kept_register_bits)
                   if parent_register >> bit & 1)


def reduction_plan(layout: LinearLayout, axis: int) -> ReductionPlan:
    """The plan for reducing a block with distributed `layout` along `axis`.

    Raises UnsupportedError when the layout holds duplicates other than broadcast bits, or when
    some bases mix `axis` with other dims in a way that xor steps over single bits cannot combine
    (the other dims' parts of the non-axis bases are linearly dependent); convert the operand to a
    blocked layout first.
    """
    axis = normalize_axis(axis, layout.rank)
    if not layout.is_injective_up_to_broadcast():
        raise UnsupportedError(f"cannot reduce a layout that duplicates data other than by broadcast: "
                               f"{layout!r}")
    masks = axis_bits(layout, axis)
    result = slice_layout(layout, axis)
    remaining = Span()
    for name in layout.in_dims:
        for bit, v in enumerate(layout.bases_of(name)):
            if masks[name] >> bit & 1 or not any(v):
                continue
            reduced = v[:axis] + v[axis + 1:]
            if not remaining.add(result.flatten_coords(reduced), 0):
                raise UnsupportedError(
                    f"cannot reduce along axis {axis}: the {name} bit {bit} (basis {v}) mixes the "
                    f"reduced axis with other dims; convert to a blocked layout first: {layout!r}")
    register_mask = masks.get(REGISTER, 0)
    kept = tuple(b for b in range(layout.in_dim_bits(REGISTER)) if not register_mask >> b & 1)
    return ReductionPlan(axis=axis, register_bits=_bit_positions(register_mask), kept_register_bits=kept,
                         lane_bits=_bit_positions(masks.get(LANE, 0)),
                         warp_bits=_bit_positions(masks.get(WARP, 0)), result_layout=result)
