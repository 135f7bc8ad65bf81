"""Lowering of `dot` through the FMA path (CUDA cores): exact float32 (or float64, or int32 for
int8) multiply-adds in k order.

The layout pass gives A and B the layouts of `passes.layout_assignment.fma_operand_layout`: A's
register k + (r << log2 K) holds A[m(r), k] for accumulator register r, and B's the matching B[k,
n(r)], so each accumulator register is a chain of K fused multiply-adds on the thread's own registers.
A dot that the layout pass put on tensor cores lowers in `mma.py` (attr engine = "mma") or
`wgmma.py` (engine = "wgmma", sm_90a).
"""

from __future__ import annotations

from llvmlite import ir

from ..ir import OpCode
from ..target import llvm_types as T
from .elementwise import convert
from .mma import lower_mma_dot
from .wgmma import lower_wgmma_dot
from .registry import lowering


@lowering(OpCode.DOT)
def _dot(ctx, op):
    if op.attrs.get("engine") == "mma":
        lower_mma_dot(ctx, op)
        return
    if op.attrs.get("engine") == "wgmma":
        lower_wgmma_dot(ctx, op)
        return
    a, b, acc = op.operands
    k = a.type.shape[1]
    k_bits = k.bit_length() - 1
    input_type, acc_type = a.type.element, acc.type.element
    a_regs, b_regs, acc_regs = ctx.get(a), ctx.get(b), ctx.get(acc)
    bld = ctx.builder
    floating = acc_type.is_floating
    if floating:
        ty = T.llvm_type(acc_type)
        fma = T.declare_intrinsic(ctx.module, f"llvm.fma.{'f64' if ty == T.f64 else 'f32'}", ty, [ty, ty, ty])
    tf32 = op.attrs.get("input_precision") == "tf32"
    cache = {}

    def widen(value, key):
        if key not in cache:
            wide = convert(ctx, value, input_type, acc_type) if input_type != acc_type else value
            if tf32:
                wide = _round_to_tf32(bld, wide)
            cache[key] = wide
        return cache[key]

    out = []
    for r, total in enumerate(acc_regs):
        for kk in range(k):
            index = kk + (r << k_bits)
            x = widen(a_regs[index], ("a", index))
            y = widen(b_regs[index], ("b", index))
            total = bld.call(fma, [x, y, total]) if floating else bld.add(bld.mul(x, y), total)
        out.append(total)
    ctx.set(op.result, out)


def _round_to_tf32(bld, value):
    """Round a float32 to tf32 (10 mantissa bits), to nearest, ties away (the `cvt.rna.tf32.f32`
    rounding), by integer arithmetic on the bits."""
    bits = bld.bitcast(value, T.i32)
    rounded = bld.and_(bld.add(bits, ir.Constant(T.i32, 0x1000)), ir.Constant(T.i32, -0x2000))
    return bld.bitcast(rounded, T.f32)
