"""Lowering of `dot` through the FMA path (CUDA cores): exact float32 (or float64, or int32 for
int8) multiply-adds in k order.

A and B keep the layouts they have (the layout pass converts neither); the accumulator has the
default blocked layout. The CTA writes A (M x K, rows padded to K + 1 elements) and B (K x N) into
shared scratch, then each thread walks k = 0 .. K-1: it reads A[m, k] for each row m and B[k, n]
for each column n among its accumulator's elements, and adds A[m, k] * B[k, n] into every
accumulator register of (m, n). Only those rows and columns of one k are live at a time (the
operands held all of K per accumulator register before, which spilled from 64 x 64 x 32 float32
tiles on). The row padding puts the rows a warp reads at one k in different banks; the columns a
warp reads are consecutive words. Scratch protocol of shared.py (barrier, write, barrier, read).

A dot that the layout pass put on tensor cores lowers in `mma.py` (attr engine = "mma": 16-bit inputs, or
float32 ones with input_precision "tf32", `mma_tf32.py`) or `wgmma.py` (engine = "wgmma", sm_90a). A tf32
dot too small for them (M < 16, N < 8, K < 8, or before sm_80) stays here, its operands rounded to tf32.
"""

from __future__ import annotations

from llvmlite import ir

from ..ir import OpCode
from ..target import llvm_types as T
from . import layout_access
from .elementwise import convert
from .mma import lower_mma_dot
from .wgmma import lower_wgmma_dot
from .registry import lowering
from .shared import _from_storage, _to_storage, barrier, reserve, scratch_base, storage_bytes, storage_type

# Elements of padding after each row of A in shared memory (an odd row stride in words for 4-byte
# elements: the rows of one k fall in different banks).
A_ROW_PADDING = 1


@lowering(OpCode.DOT)
def _dot(ctx, op):
    if op.attrs.get("engine") == "mma":
        lower_mma_dot(ctx, op)
        return
    if op.attrs.get("engine") == "wgmma":
        lower_wgmma_dot(ctx, op)
        return
    a, b, acc = op.operands
    (m, k), n = a.type.shape, b.type.shape[1]
    acc_type = acc.type.element
    a_base, b_base = _stage_operands(ctx, a, b, m, k, n)
    bld = ctx.builder
    floating = acc_type.is_floating
    if floating:
        ty = T.llvm_type(acc_type)
        fma = T.declare_intrinsic(ctx.module, f"llvm.fma.{'f64' if ty == T.f64 else 'f32'}", ty, [ty, ty, ty])
    tf32 = op.attrs.get("input_precision") == "tf32"

    def operand(base, index, element):
        storage = storage_type(element)
        value = _from_storage(bld, bld.load(bld.gep(base, [index], source_etype=storage), typ=storage), element)
        wide = convert(ctx, value, element, acc_type) if element != acc_type else value
        return _round_to_tf32(bld, wide) if tf32 else wide

    # each accumulator register's row and column: the rows (columns) of a thread differ only in their
    # compile-time register part, so registers sharing it share the operand read
    layout = acc.layout
    rows, columns, places = {}, {}, []
    for r in range(layout_access.num_registers(layout)):
        constant_m, constant_n = layout_access.register_coordinates(layout, r)
        if constant_m not in rows or constant_n not in columns:
            coordinate_m, coordinate_n = ctx.element_coordinates(layout, r)
            rows.setdefault(constant_m, bld.mul(coordinate_m, ir.Constant(T.i32, k + A_ROW_PADDING)))
            columns.setdefault(constant_n, coordinate_n)
        places.append((constant_m, constant_n))
    out = list(ctx.get(acc))
    for kk in range(k):
        step = ir.Constant(T.i32, kk)
        a_values = {key: operand(a_base, bld.add(row, step), a.type.element) for key, row in rows.items()}
        b_values = {key: operand(b_base, bld.add(column, ir.Constant(T.i32, kk * n)), b.type.element)
                    for key, column in columns.items()}
        for r, (key_m, key_n) in enumerate(places):
            x, y = a_values[key_m], b_values[key_n]
            out[r] = bld.call(fma, [x, y, out[r]]) if floating else bld.add(bld.mul(x, y), out[r])
    ctx.set(op.result, out)


def _stage_operands(ctx, a, b, m: int, k: int, n: int) -> tuple:
    """Write A and B from their layouts into scratch (A row-major with rows of k + A_ROW_PADDING
    elements, then B row-major from the next 16-byte boundary); returns the `ptr addrspace(3)` of each."""
    bld = ctx.builder
    a_bytes = m * (k + A_ROW_PADDING) * storage_bytes(a.type.element)
    b_offset = (a_bytes + 15) // 16 * 16
    reserve(ctx, b_offset + k * n * storage_bytes(b.type.element))
    a_base = scratch_base(ctx)
    b_base = bld.gep(a_base, [ir.Constant(T.i32, b_offset)], source_etype=T.i8)
    barrier(ctx)
    for value, pointer, row_stride in ((a, a_base, k + A_ROW_PADDING), (b, b_base, n)):
        element = value.type.element
        for r, register in enumerate(ctx.get(value)):
            row, column = ctx.element_coordinates(value.layout, r)
            index = bld.add(bld.mul(row, ir.Constant(T.i32, row_stride)), column)
            stored, _ = _to_storage(bld, register, element)
            bld.store(stored, bld.gep(pointer, [index], source_etype=storage_type(element)))
    barrier(ctx)
    return a_base, b_base


def _round_to_tf32(bld, value):
    """Round a float32 to tf32 (10 mantissa bits), to nearest, ties away (the `cvt.rna.tf32.f32`
    rounding), by integer arithmetic on the bits. A NaN is kept as it is: the rounding carry of a NaN
    whose mantissa bits 12.. are all set runs into the exponent and the sign (0x7FFFFFFF, the GPU's
    canonical NaN, became -0.0) and one with only low payload bits lost them (0x7F800001 became inf)."""
    bits = bld.bitcast(value, T.i32)
    rounded = bld.and_(bld.add(bits, ir.Constant(T.i32, 0x1000)), ir.Constant(T.i32, -0x2000))
    return bld.select(bld.fcmp_unordered("uno", value, value), value, bld.bitcast(rounded, T.f32))
