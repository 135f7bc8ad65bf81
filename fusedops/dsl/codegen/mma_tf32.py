"""The tf32 parts of the mma.sync lowering (`mma.py`): float32 `dot`s with input_precision "tf32" on
`mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32` (sm_80+).

Layouts: `layouts.mma_tf32` (A 16x8 and B 8x8 fragments of one .b32 register per element, PTX ISA
9.7.14.5 "Matrix Fragments for mma.m16n8k8"), the accumulator as for m16n8k16.

Operands reach the dot as for 16-bit ones (`mma.StagedOperand`): stored from their own layouts into the
swizzled tile of `layouts.mma_shared.mma_operand_shared` (16-byte chunks of 4 floats), or copied there by
the cp.async ring. ldmatrix moves 16-bit elements (its `.trans` would swap the halves of a float), so
`Tf32OperandLoader` reads each fragment register with one `ld.shared.f32`: the offset of register r of
the thread is (the XOR of its lane and warp bits' offsets, once per thread) XOR (r's constant offset),
from `layouts.shared.shared_offsets`. For a tile contiguous along K (row-major A, column-major B) the 32
lanes of one such load read 8 rows of 16 bytes, which the swizzle puts in 8 distinct bank groups; a tile
contiguous along M (A) or N (B, the usual row-major B) has them read 4 rows of 32 bytes (a 2-way bank
conflict at most).

Each operand register is rounded to tf32 with `cvt.rna.tf32.f32` (round to nearest, ties away from zero:
PTX ISA "cvt", .tf32 destination) right before its first mma: the tensor cores ignore the low 13 mantissa
bits of a .tf32 operand, which would truncate. The products are exact and the tensor cores accumulate in
float32.
"""

from __future__ import annotations

from llvmlite import ir

from ..layouts.linear import LANE, WARP
from ..layouts.mma_tf32 import MMA_TF32_K
from ..layouts.shared import shared_offsets
from ..passes.dot_layouts import mma_warps
from ..target import llvm_types as T

MMA_TF32_INTRINSIC = "llvm.nvvm.mma.m16n8k8.row.col.tf32"
_ROUND_INTRINSIC = "llvm.nvvm.f2tf32.rna"


def _k_dim(operand) -> int:
    """The K dim of a tf32 operand layout: the one lane bit 0 steps (A: columns, B: rows)."""
    first = operand.bases_of(LANE)[0]
    return next(d for d, c in enumerate(first) if c)


class Tf32OperandLoader:
    """Reads a float32 mma operand (layout `operand`, `layouts.mma_tf32`) from a shared tile laid out as
    `shared`, one ld.shared.f32 per register, one 8-wide K slice at a time (the interface of
    `mma.OperandLoader`)."""

    def __init__(self, operand, shared, element):
        self.operand = operand
        self.shared = shared
        self.element = element
        offsets = shared_offsets(operand, shared)
        size = element.bits // 8
        k_dim = _k_dim(operand)
        self.lane_bytes = tuple(offsets.apply(lane=1 << b)[0] * size for b in range(operand.in_dim_bits(LANE)))
        self.warp_bytes = tuple(offsets.apply(warp=1 << b)[0] * size for b in range(operand.in_dim_bits(WARP)))
        self.slices: dict = {}
        for r in range(operand.num_registers):
            k_slice = operand.apply(register=r)[k_dim] // MMA_TF32_K
            self.slices.setdefault(k_slice, []).append((r, offsets.apply(register=r)[0] * size))

    @property
    def tile_bytes(self) -> int:
        return self.operand.numel * self.element.bits // 8

    def load(self, ctx, base, registers: list, k_slice: int) -> None:
        from .mma import byte_pointer, combine_offset, thread_offset
        thread = thread_offset(ctx, self.lane_bytes, self.warp_bytes)
        for register, constant in self.slices.get(k_slice, ()):
            pointer = byte_pointer(ctx, base, combine_offset(ctx, thread, constant))
            registers[register] = ctx.builder.load(pointer, typ=T.f32, align=4)


# A NaN operand's word: the canonical NaN (its high mantissa bits survive the tf32 read).
_NAN_WORD = 0x7FFFFFFF


def round_to_tf32(ctx, value):
    """The .b32 tf32 operand (an i32) of a float32: `cvt.rna.tf32.f32`, but a NaN becomes the canonical NaN.
    (cvt clears a NaN's 13 low bits as any value's: sm_8x's SASS adds the rounding carry to finite values
    only, then masks; a NaN with only low payload bits, 0x7F800001, would become infinity.)"""
    fn = T.declare_intrinsic(ctx.module, _ROUND_INTRINSIC, T.i32, [T.f32])
    b = ctx.builder
    return b.select(b.fcmp_unordered("uno", value, value), ir.Constant(T.i32, _NAN_WORD), b.call(fn, [value]))


def declare_mma_tf32(ctx):
    """`{f32 x 4} mma.m16n8k8.row.col.tf32(i32 a0..a3, i32 b0, b1, f32 c0..c3)`."""
    return T.declare_intrinsic(ctx.module, MMA_TF32_INTRINSIC, ir.LiteralStructType([T.f32] * 4),
                               [T.i32] * 6 + [T.f32] * 4)


def mma_tf32_schedule(m: int, n: int, k: int, num_warps: int) -> list:
    """The m16n8k8 mma.sync instructions of an (M, N, K) tf32 dot, in issue order: tuples (kk, a_registers
    (4), b_registers (2), acc_registers (4)) of thread-local register indices (a0..a3, b0, b1, c0..c3),
    K slice (8 wide) by K slice."""
    wm, wn = mma_warps((m, n), num_warps)
    rep_m, rep_n, rep_k = max(1, m // (16 * wm)), max(1, n // (8 * wn)), k // MMA_TF32_K
    out = []
    for kk in range(rep_k):
        for i in range(rep_m):
            for j in range(rep_n):
                out.append((kk, tuple(e + 4 * (kk + rep_k * i) for e in range(4)),
                            tuple(e + 2 * (kk + rep_k * j) for e in range(2)),
                            tuple(c + 4 * (j + rep_n * i) for c in range(4))))
    return out
