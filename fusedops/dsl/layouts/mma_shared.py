"""Shared memory for mma.sync operands: the swizzled tile layout and the `ldmatrix` address plan.

A dot operand travels global memory -> shared memory (in the tile's contiguous order) -> registers
in the mma operand layout (`mma.mma_operand_a` / `mma_operand_b`), read with
`ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16` (PTX ISA 9.7.14.5.15 "ldmatrix"):
  - lanes 8q..8q+7 give the row addresses of 8x8 matrix q (16 contiguous, 16-byte aligned bytes each);
  - without .trans, lane t receives elements (row t/4, columns 2(t%4), 2(t%4)+1) of each matrix, one
    32-bit register per matrix; with .trans, elements (rows 2(t%4), 2(t%4)+1, column t/4).
In the mma fragments (PTX ISA 9.7.14.5.8) a thread's 32-bit operand register p holds two elements
that are adjacent along K (the *pair* dim: register bit 0, lane bits 0-1 = K steps 1, 2, 4), at the
row/column given by lane bits 2-4 (the *group* dim: M for A, N for B). So when the shared tile is
contiguous along the pair dim, each matrix row is 8 consecutive K values and no transpose is needed;
when it is contiguous along the group dim (A stored M-contiguous, or B stored N-contiguous, the
usual row-major B), `.trans` is used.

The shared tile layout is `swizzled_shared` with 16-byte chunks (vec = 8 16-bit elements): the 8
rows one matrix reads, and the rows a warp's 16-byte stores touch, land in distinct bank groups
(the "mma swizzle" of Triton's shared encoding for mma operands, derived here from the bank model).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from .linear import LANE, OFFSET, REGISTER, WARP, LinearLayout, log2_exact
from .shared import nvmma_shared, swizzled_shared

CHUNK_BYTES = 16          # one ldmatrix row, one cp.async / st.shared.v4
_WAVEFRONT_BYTES = 128    # 32 banks x 4 bytes


def mma_operand_shared(shape: Sequence[int], element_bits: int, contiguous_dim: int) -> LinearLayout:
    """The swizzled shared layout of a 2-D operand tile stored contiguous along `contiguous_dim`.

    Rows are cut into 16-byte chunks; the chunk index is XORed with the row's phase, where
    per_phase = max(1, 128 / row_bytes) rows share a phase and max_phase = min(8 / per_phase,
    chunks per row) phases exist. Any 8 consecutive rows then cover 8 distinct 16-byte bank groups.
    Raises ValueError for a rank other than 2 or a row narrower than one chunk.
    """
    shape = tuple(shape)
    if len(shape) != 2 or contiguous_dim not in (0, 1):
        raise ValueError(f"an mma operand tile is 2-D, got shape {shape} and contiguous dim {contiguous_dim}")
    vec = CHUNK_BYTES * 8 // element_bits
    cols = shape[contiguous_dim]
    log2_exact(cols, "tile dim")
    if cols < vec:
        raise ValueError(f"the contiguous dim of an mma operand tile needs at least {vec} elements, got {shape}")
    row_bytes = cols * element_bits // 8
    per_phase = max(1, _WAVEFRONT_BYTES // row_bytes)
    max_phase = max(1, min(8 // per_phase, cols // vec))
    order = (contiguous_dim, 1 - contiguous_dim)
    return swizzled_shared(shape, vec, per_phase, max_phase, order)


def shared_contiguous_dim(shared: LinearLayout) -> int:
    """The dim that offset bit 0 of a shared layout steps along."""
    first = shared.bases_of(OFFSET)[0]
    return next(d for d, c in enumerate(first) if c)


@dataclasses.dataclass(frozen=True)
class LdmatrixInstruction:
    """One ldmatrix: `offset` is lane 0 / warp 0's row offset (elements); word q of the result holds
    operand registers registers[q] (low half) and registers[q] + 1 (high half), all in the 16-wide
    K slice `k_slice` of the operand."""

    offset: int
    registers: tuple
    k_slice: int


@dataclasses.dataclass(frozen=True)
class LdmatrixPlan:
    """How a warp loads an mma operand tile from shared memory with ldmatrix.

    The row address (element offset) lane l of warp w gives to instruction i is
        instructions[i].offset ^ XOR(lane_offsets[b] for set bits b of l) ^ XOR(warp_offsets[b] ...).
    count: matrices per instruction (4, 2 or 1: `.x4`, `.x2`, `.x1`); trans: use `.trans`.
    Each instruction reads one 16-wide K slice, so a dot can load slice kk just before its mmas.
    """

    count: int
    trans: bool
    lane_offsets: tuple
    warp_offsets: tuple
    instructions: tuple

    def lane_offset(self, lane: int) -> int:
        return _xor_bits(self.lane_offsets, lane)

    def warp_offset(self, warp: int) -> int:
        return _xor_bits(self.warp_offsets, warp)

    def slice(self, k_slice: int) -> tuple:
        """The instructions that read K slice `k_slice`."""
        return tuple(i for i in self.instructions if i.k_slice == k_slice)


def _xor_bits(bases, index: int) -> int:
    out = 0
    for bit, basis in enumerate(bases):
        if index >> bit & 1:
            out ^= basis
    return out


def _scatter(value: int, positions) -> int:
    """Bit b of `value` moved to bit positions[b]."""
    return sum(1 << p for b, p in enumerate(positions) if value >> b & 1)


def _dim_of(basis) -> int:
    nonzero = [d for d, c in enumerate(basis) if c]
    return nonzero[0] if len(nonzero) == 1 else -1


def _check_fragment(operand: LinearLayout) -> tuple:
    """(pair dim, group dim) of an mma operand layout; ValueError when it is not one."""
    registers, lanes = operand.bases_of(REGISTER), operand.bases_of(LANE)
    if len(registers) < 2 or len(lanes) != 5:
        raise ValueError(f"not an mma operand layout: {operand!r}")
    pair, group = _dim_of(registers[0]), _dim_of(lanes[2])
    expected = [(pair, 1), (pair, 2), (pair, 4), (group, 1), (group, 2), (group, 4)]
    actual = [(_dim_of(v), v[_dim_of(v)] if _dim_of(v) >= 0 else 0)
              for v in (registers[0], lanes[0], lanes[1], lanes[2], lanes[3], lanes[4])]
    if pair < 0 or group < 0 or pair == group or actual != expected:
        raise ValueError(f"not an mma operand layout (pair dim K in register bit 0 and lane bits 0-1, "
                         f"rows in lane bits 2-4): {operand!r}")
    return pair, group


def _matrix_bits(operand: LinearLayout, pair: int) -> list:
    """The word bits (register bit - 1) whose matrices one instruction loads together: the K + 8 bit
    and the first bit along M/N (so an instruction stays inside one 16-wide K slice), at most 2."""
    chosen = []
    for word_bit, basis in enumerate(operand.bases_of(REGISTER)[1:]):
        along_pair = _dim_of(basis) == pair
        if (along_pair and basis[pair] == 8) or (not along_pair and not any(
                _dim_of(operand.bases_of(REGISTER)[1 + b]) != pair for b in chosen)):
            chosen.append(word_bit)
        if len(chosen) == 2:
            break
    return chosen


def ldmatrix_plan(operand: LinearLayout, shared: LinearLayout, element_bits: int = 16) -> LdmatrixPlan:
    """The ldmatrix plan that loads `operand` (an mma operand layout) from the tile `shared`.

    Works for A and B and either contiguous dim of the tile (see the module docstring). Raises
    ValueError when the element is not 16 bits, the layout is not an mma operand layout, or the
    tile does not keep each matrix row in one aligned 16-byte chunk.
    """
    if element_bits != 16:
        raise ValueError(f"ldmatrix moves 16-bit elements, got {element_bits}-bit")
    if operand.shape != shared.shape:
        raise ValueError(f"operand {operand.shape} and shared tile {shared.shape} differ")
    pair, group = _check_fragment(operand)
    trans = shared_contiguous_dim(shared) != pair
    inverse = shared.invert()
    word_bits = len(operand.bases_of(REGISTER)) - 1       # 32-bit words p: register = 2p + half
    matrix_bits = _matrix_bits(operand, pair)
    rest = [b for b in range(word_bits) if b not in matrix_bits]
    q_mask = (1 << len(matrix_bits)) - 1

    def offset(register=0, lane=0, warp=0) -> int:
        coords = operand.apply(register=register, lane=lane, warp=warp)
        return inverse.apply(**dict(zip(operand.out_dims, coords)))[0]

    def row_start(instruction_lane: int) -> int:
        r, q = instruction_lane & 7, (instruction_lane >> 3) & q_mask
        word = _scatter(q, matrix_bits)
        if trans:    # row r of the stored matrix is K = r: register half bit r & 1, lane bits 0-1 r >> 1
            return offset(register=(r & 1) | (word << 1), lane=r >> 1)
        return offset(register=word << 1, lane=r << 2)      # row r is group index r, pair index 0

    lane_offsets = tuple(row_start(1 << b) for b in range(5))
    warp_offsets = tuple(offset(warp=1 << b) for b in range(operand.in_dim_bits(WARP)))
    instructions = []
    for t in range(1 << len(rest)):
        base = _scatter(t, rest)
        instructions.append(LdmatrixInstruction(
            offset=offset(register=base << 1),
            registers=tuple((base | _scatter(q, matrix_bits)) << 1 for q in range(1 << len(matrix_bits))),
            k_slice=operand.apply(register=base << 1)[pair] // 16))
    plan = LdmatrixPlan(1 << len(matrix_bits), trans, lane_offsets, warp_offsets, tuple(instructions))
    _check_rows(plan, operand, shared)
    return plan


def _check_rows(plan: LdmatrixPlan, operand: LinearLayout, shared: LinearLayout) -> None:
    """Every row address is 16-byte aligned and its 8 elements are the ones the fragment expects."""
    vec = 8
    lanes_used = 8 * plan.count
    for instruction in plan.instructions:
        for lane in range(lanes_used):
            start = instruction.offset ^ plan.lane_offset(lane)
            if start % vec:
                raise ValueError(f"ldmatrix row at element offset {start} is not 16-byte aligned")
    simulated = simulate_ldmatrix(plan, shared, warp=0)
    for (register, lane), coords in simulated.items():
        if operand.apply(register=register, lane=lane, warp=0) != coords:
            raise ValueError("ldmatrix plan does not reproduce the operand layout (internal error)")


def simulate_ldmatrix(plan: LdmatrixPlan, shared: LinearLayout, warp: int = 0) -> dict:
    """{(operand register, lane): coords} that warp `warp` receives by executing `plan` on a tile
    whose element at offset o is `shared.apply(offset=o)` (PTX ldmatrix semantics; for tests)."""
    out = {}
    for instruction in plan.instructions:
        for q, register in enumerate(instruction.registers):
            rows = [instruction.offset ^ plan.lane_offset(8 * q + r) ^ plan.warp_offset(warp) for r in range(8)]
            for lane in range(32):
                for half in range(2):
                    if plan.trans:
                        row, col = 2 * (lane % 4) + half, lane // 4
                    else:
                        row, col = lane // 4, 2 * (lane % 4) + half
                    out[(register + half, lane)] = shared.apply(offset=rows[row] + col)
    return out


# -- wgmma operand tiles (sm_90a) ------------------------------------------------------------------------

# Descriptor bits 62-63 per swizzle mode (PTX ISA 9.7.15.5.1.2.2 "Matrix Descriptor Format").
WGMMA_SWIZZLE_MODE = {128: 1, 64: 2, 32: 3}
WGMMA_K = 16                      # K of one wgmma.m64nNk16 (16-bit inputs)
_CORE_ROWS = 8                    # a core matrix is 8 rows of 16 bytes


def wgmma_swizzle_bytes(contiguous_bytes: int):
    """The widest wgmma swizzle mode (128, 64 or 32 bytes) a tile whose contiguous extent (the part
    one instruction reads, in bytes) is `contiguous_bytes` can use; None below 32 bytes."""
    fitting = [mode for mode in sorted(WGMMA_SWIZZLE_MODE, reverse=True) if mode <= contiguous_bytes]
    return fitting[0] if fitting else None


def wgmma_operand_shared(shape: Sequence[int], element_bits: int, contiguous_dim: int,
                         swizzle_bytes: int) -> LinearLayout:
    """The canonical wgmma layout of a 2-D operand tile stored contiguous along `contiguous_dim`
    with a 32/64/128-byte swizzle (`shared.nvmma_shared`): atoms `swizzle_bytes` wide along the
    contiguous dim, each atom column a run of rows `swizzle_bytes` apart, atoms one after the other.

    This is the "canonical layout" of PTX ISA 9.7.15.5.1.2.1.3 (T = 128 / element bits):
      K-major  ((8,m),(T,2k)) : ((S/16*T, SBO), (1, T))      rows (M or N) 8 at a time, K contiguous
      MN-major ((T,S/16,m),(8,k)) : ((1, T, LBO), (S/16*T, SBO))   M/N contiguous, K rows
    with S = swizzle_bytes, SBO = 8 * S bytes and (MN-major) LBO = rows * S bytes, then the
    Swizzle<log2(S/16), 4, 3> XOR on byte addresses; see `WgmmaOperandTile`.
    """
    return nvmma_shared(shape, element_bits, swizzle_bytes, (contiguous_dim, 1 - contiguous_dim))


@dataclasses.dataclass(frozen=True)
class WgmmaOperandTile:
    """How `wgmma.mma_async` reads operand A (M x K, operand=0) or B (K x N, operand=1) from a
    shared tile laid out by `wgmma_operand_shared`, through a matrix descriptor.

    mn_major: the tile is contiguous along M (A) or N (B): the instruction's imm-trans-a/b = 1
        (allowed for 16-bit inputs); else K-major (imm-trans 0).
    leading_byte_offset, stride_byte_offset: the descriptor's LBO and SBO in bytes (PTX ISA
        9.7.15.5.1.2.1): K-major: SBO = bytes between groups of 8 rows (8 * S), LBO unused (1 is
        encoded, "assumed 1"); MN-major: LBO = bytes between swizzle atoms along M/N (rows * S),
        SBO = bytes between groups of 8 K rows (8 * S).
    The pattern repeats every 8 * swizzle_bytes bytes; tiles start on such a boundary so the
    descriptor's base offset is 0.
    """

    shared: LinearLayout
    operand: int
    element_bits: int
    swizzle_bytes: int
    mn_major: bool
    leading_byte_offset: int
    stride_byte_offset: int

    @property
    def k_dim(self) -> int:
        return 1 - self.operand

    @property
    def pattern_bytes(self) -> int:
        """The swizzle's repeating pattern: the alignment a tile (and every sub-tile start) needs."""
        return _CORE_ROWS * self.swizzle_bytes

    @property
    def tile_bytes(self) -> int:
        return self.shared.numel * self.element_bits // 8

    def descriptor_fields(self) -> int:
        """The descriptor without its start address: LBO, SBO and swizzle mode (base offset 0)."""
        return encode_wgmma_descriptor(0, self.leading_byte_offset, self.stride_byte_offset, self.swizzle_bytes)

    def byte_offset(self, coords: Sequence[int]) -> int:
        """The byte offset in the tile of a sub-tile whose first element is at `coords` ((m, k) for
        A, (k, n) for B): the start address (minus the tile's) of an instruction's descriptor.

        Raises ValueError when the sub-tile does not start at a swizzle pattern boundary along the
        rows (8 rows for K-major, 8 K rows for MN-major) and an atom boundary along the contiguous
        dim (MN-major) or a 16-element step along K (K-major), where the descriptor cannot
        describe it.
        """
        coords = tuple(coords)
        contiguous = 1 - self.k_dim if self.mn_major else self.k_dim
        rows = 1 - contiguous
        atom = self.swizzle_bytes * 8 // self.element_bits
        step = atom if self.mn_major else WGMMA_K
        if coords[rows] % _CORE_ROWS or coords[contiguous] % step:
            raise ValueError(f"a wgmma sub-tile cannot start at {coords} of a {self.shared.shape} tile")
        offset = self.shared.invert().apply(**dict(zip(self.shared.out_dims, coords)))[0]
        return offset * self.element_bits // 8


def encode_wgmma_descriptor(start_address: int, leading_byte_offset: int, stride_byte_offset: int,
                            swizzle_bytes, base_offset: int = 0) -> int:
    """The 64-bit wgmma matrix descriptor (PTX ISA 9.7.15.5.1.2.2): bits 0-13 start address,
    16-29 leading dimension byte offset, 32-45 stride dimension byte offset (each
    `(x & 0x3FFFF) >> 4`), 49-51 base offset, 62-63 swizzle mode (0 none, 1 128B, 2 64B, 3 32B).
    swizzle_bytes: 128, 64, 32 or None (no swizzle). Raises ValueError for a byte offset that is not
    a multiple of 16 or does not fit."""
    def encode(value: int, what: str) -> int:
        if value % 16 or not 0 <= value < 1 << 18:
            raise ValueError(f"{what} {value} must be a multiple of 16 below 2**18")
        return (value & 0x3FFFF) >> 4
    mode = 0 if swizzle_bytes is None else WGMMA_SWIZZLE_MODE[swizzle_bytes]
    return (encode(start_address, "start address") | encode(leading_byte_offset, "leading byte offset") << 16
            | encode(stride_byte_offset, "stride byte offset") << 32 | (base_offset & 7) << 49 | mode << 62)


def wgmma_operand_tile(shared: LinearLayout, operand: int, element_bits: int = 16) -> WgmmaOperandTile:
    """Recognize `shared` as a canonical wgmma tile of operand A (0) or B (1) and give its
    descriptor parameters. Raises ValueError when it is not `wgmma_operand_shared` of its shape
    for some contiguous dim and swizzle mode, or the element is not 16 bits."""
    if element_bits != 16:
        raise ValueError(f"the wgmma path here takes 16-bit inputs, got {element_bits}-bit")
    shape = tuple(shared.shape)
    if len(shape) != 2 or shared.in_dims != (OFFSET,):
        raise ValueError(f"not a shared tile layout: {shared!r}")
    contiguous = shared_contiguous_dim(shared)
    rows = 1 - contiguous
    element_bytes = element_bits // 8
    for swizzle in sorted(WGMMA_SWIZZLE_MODE, reverse=True):
        if shape[contiguous] * element_bytes < swizzle:
            continue
        if wgmma_operand_shared(shape, element_bits, contiguous, swizzle) == shared:
            break
    else:
        raise ValueError(f"not a canonical wgmma tile layout: {shared!r}")
    if shape[rows] % _CORE_ROWS:
        raise ValueError(f"a wgmma tile needs a multiple of 8 rows, got shape {shape}")
    mn_major = contiguous != 1 - operand
    stride = _CORE_ROWS * swizzle
    leading = shape[rows] * swizzle if mn_major else 16
    return WgmmaOperandTile(shared, operand, element_bits, swizzle, mn_major, leading, stride)


def is_shared_layout(layout) -> bool:
    """Whether `layout` is a shared-memory layout (input dim "offset") rather than a distributed one."""
    return isinstance(layout, LinearLayout) and layout.in_dims == (OFFSET,)


def operand_tile_layout(shape: Sequence[int], element_bits: int, contiguous_dim: int,
                        swizzle_bytes=None) -> LinearLayout:
    """The shared layout of one tile of a pipelining ring (`local_alloc`): the canonical wgmma tile
    when `swizzle_bytes` is given (a wgmma operand), else the mma.sync/ldmatrix tile."""
    if swizzle_bytes is None:
        return mma_operand_shared(shape, element_bits, contiguous_dim)
    return wgmma_operand_shared(shape, element_bits, contiguous_dim, swizzle_bytes)
