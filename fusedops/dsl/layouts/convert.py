"""What codegen needs to move a block between layouts: the conversion plans.

A conversion from layout `src` to layout `dst` (same block, or `src` with size-1 dims that `dst`
broadcasts) is, cheapest first:
  1. a register relabeling (`register_permutation`): the lane and warp bases agree, so every thread
     already holds its `dst` elements; codegen only reorders its list of registers;
  2. warp shuffles (`lane_shuffle_plan`): the warp bases agree, so data moves only inside a warp;
     one `shfl.sync.idx` per `dst` register;
  3. otherwise through shared memory (`needs_shared_memory`), with a swizzle from
     `swizzle.choose_swizzle`.
Each test is a linear-algebra question about the bases ("Linear Layouts", arXiv 2505.23819:
layout conversion).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from .gf2 import Span, xor_combination
from .linear import LANE, LANE_BITS, REGISTER, WARP, LinearLayout


def _projector(src: LinearLayout, dst: LinearLayout):
    """Maps dst coordinates to src coordinates: dims where src has size 1 are broadcast (zeroed)."""
    if src.out_dims != dst.out_dims or any(s not in (1, d) for s, d in zip(src.shape, dst.shape)):
        raise ValueError(f"cannot convert a block of shape {src.shape} to shape {dst.shape}")
    keep = tuple(s != 1 for s in src.shape)
    return lambda v: tuple(c if k else 0 for c, k in zip(v, keep))


def _same_bases(src: LinearLayout, dst: LinearLayout, dims: tuple, project) -> bool:
    return all(tuple(project(v) for v in dst.bases_of(d)) == src.bases_of(d) for d in dims)


def register_permutation(src: LinearLayout, dst: LinearLayout) -> Optional[tuple]:
    """`perm` with dst register i = src register perm[i] in every thread, or None.

    Exists when the lane and warp bases agree (after zeroing dims that dst broadcasts) and every dst
    register basis is a combination of src register bases. A permutation when both hold the same
    elements once; entries repeat when dst duplicates or broadcasts src registers.
    ValueError if the shapes are not the same (or src's size-1 dims broadcast to dst's).
    """
    project = _projector(src, dst)
    if not _same_bases(src, dst, (LANE, WARP), project):
        return None
    span = Span(src.flat_bases(REGISTER))
    bits = []
    for v in dst.bases_of(REGISTER):
        combination = span.solve(src.flatten_coords(project(v)))
        if combination is None:
            return None
        bits.append(combination)
    return tuple(xor_combination(bits, r) for r in range(dst.num_registers))


@dataclasses.dataclass(frozen=True)
class LaneShufflePlan:
    """A conversion inside each warp: one `shfl.sync.idx` per dst register.

    For dst register r, every lane sends its src register `src_registers[r]` and lane l receives from
    lane `source_lane(l, r)` = (XOR of lane_matrix[b] over the set bits b of l) ^ lane_xor[r].
    """

    lane_matrix: tuple
    src_registers: tuple
    lane_xor: tuple

    def source_lane(self, lane: int, dst_register: int) -> int:
        return xor_combination(list(self.lane_matrix), lane) ^ self.lane_xor[dst_register]

    @property
    def lane_matrix_is_identity(self) -> bool:
        """True when source_lane(l, r) == l ^ lane_xor[r] (codegen can skip the matrix product)."""
        return self.lane_matrix == tuple(1 << b for b in range(len(self.lane_matrix)))


def lane_shuffle_plan(src: LinearLayout, dst: LinearLayout) -> Optional[LaneShufflePlan]:
    """A warp-shuffle plan for converting `src` to `dst`, or None if data must cross warps or a
    shuffle cannot do it with a register choice that is the same in every lane."""
    project = _projector(src, dst)
    if not _same_bases(src, dst, (WARP,), project):
        return None
    if src.in_dim_bits(LANE) != LANE_BITS or dst.in_dim_bits(LANE) != LANE_BITS:
        return None
    src_registers = src.flat_bases(REGISTER)
    src_lanes = src.flat_bases(LANE)
    lanes_only = Span(src_lanes)
    lane_matrix = []
    for v in dst.bases_of(LANE):
        combination = lanes_only.solve(src.flatten_coords(project(v)))
        if combination is None:
            return None
        lane_matrix.append(combination)
    both = Span()
    for bit, vector in enumerate(src_registers):
        both.add(vector, 1 << bit)
    shift = len(src_registers)
    for bit, vector in enumerate(src_lanes):
        both.add(vector, 1 << (shift + bit))
    register_bits, lane_bits = [], []
    for v in dst.bases_of(REGISTER):
        combination = both.solve(src.flatten_coords(project(v)))
        if combination is None:
            return None
        register_bits.append(combination & ((1 << shift) - 1))
        lane_bits.append(combination >> shift)
    count = dst.num_registers
    return LaneShufflePlan(
        lane_matrix=tuple(lane_matrix),
        src_registers=tuple(xor_combination(register_bits, r) for r in range(count)),
        lane_xor=tuple(xor_combination(lane_bits, r) for r in range(count)))


def needs_shared_memory(src: LinearLayout, dst: LinearLayout) -> bool:
    """True unless the conversion is a register relabeling or a warp-shuffle plan exists."""
    return register_permutation(src, dst) is None and lane_shuffle_plan(src, dst) is None
