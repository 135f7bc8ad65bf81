"""Lowering of elementwise ops: arithmetic, comparisons, bit ops, select, fma, casts, addptr.

Integer rules follow fusedops/dsl/language/numerics/ (the interpreter's): division truncates,
x / 0 is -1 (all ones), x % 0 is x, MIN / -1 wraps; shift amounts at or past the bit width give 0
(sign fill for arithmetic right shifts). LLVM leaves those cases undefined, so they are guarded
with selects here. Float minimum/maximum propagate NaN, as torch does.
"""

from __future__ import annotations

from llvmlite import ir

from ..ir import OpCode
from ..language.dtypes import BlockType, DType, PointerType, float32
from ..target import llvm_types as T
from .math import lower_libdevice, lower_math
from .memory import constant_run
from .registry import lowering


def scalar_type(value):
    return value.type.element if isinstance(value.type, BlockType) else value.type


def map_registers(ctx, op, fn) -> None:
    """Lower an elementwise op by applying `fn(*llvm_scalars)` register by register."""
    args = [ctx.get(v) for v in op.operands]
    if isinstance(op.results[0].type, BlockType):
        ctx.set(op.result, [fn(*regs) for regs in zip(*args)])
    else:
        ctx.set(op.result, fn(*args))


def _const(ty, value):
    return ir.Constant(ty, value)


def _int_div(b, dtype: DType, a, d, remainder: bool):
    ty = a.type
    zero = _const(ty, 0)
    is_zero = b.icmp_unsigned("==", d, zero)
    safe = b.select(is_zero, _const(ty, 1), d)
    if dtype.is_signed:
        minus_one = _const(ty, -1)
        is_minus_one = b.icmp_signed("==", d, minus_one)
        safe = b.select(is_minus_one, _const(ty, 1), safe)
        if remainder:
            value = b.srem(a, safe)
            value = b.select(is_minus_one, zero, value)
            return b.select(is_zero, a, value)
        value = b.sdiv(a, safe)
        value = b.select(is_minus_one, b.sub(zero, a), value)
        return b.select(is_zero, minus_one, value)
    if remainder:
        return b.select(is_zero, a, b.urem(a, safe))
    return b.select(is_zero, _const(ty, -1), b.udiv(a, safe))


def _shift(b, dtype: DType, a, amount, left: bool):
    ty = a.type
    width = _const(ty, ty.width)
    too_far = b.icmp_unsigned(">=", amount, width)
    safe = b.select(too_far, _const(ty, 0), amount)
    if left:
        return b.select(too_far, _const(ty, 0), b.shl(a, safe))
    if dtype.is_signed:
        return b.ashr(a, b.select(too_far, _const(ty, ty.width - 1), safe))
    return b.select(too_far, _const(ty, 0), b.lshr(a, safe))


def float_min_max(ctx, b, a, c, maximum: bool):
    """max(a, c) (maximum) or min(a, c) of two float registers: NaN from either side wins, -0.0 < +0.0
    (IEEE 754-2019 maximum / minimum; what dsl.maximum, reductions and atomics compute)."""
    name = "llvm.maximum" if maximum else "llvm.minimum"
    if a.type in (T.f32, T.f16, T.bf16) and ctx.arch_at_least(80):
        fn = T.declare_intrinsic(ctx.module, f"{name}.{_suffix(a.type)}", a.type, [a.type, a.type])
        return b.call(fn, [a, c])
    # No min.NaN instruction for this type: pick with compares, NaN from either side wins; equal operands
    # (+0.0 / -0.0) combine their bits (AND for max, OR for min: -0.0 < +0.0, IEEE 754-2019 maximum/minimum).
    pick = b.fcmp_ordered(">" if maximum else "<", a, c)
    chosen = b.select(pick, a, c)
    integer = ir.IntType({id(T.f64): 64, id(T.f32): 32}.get(id(a.type), 16))
    bits = [b.bitcast(v, integer) for v in (a, c)]
    tie = b.bitcast((b.and_ if maximum else b.or_)(*bits), a.type)
    chosen = b.select(b.fcmp_ordered("==", a, c), tie, chosen)
    a_nan = b.fcmp_unordered("uno", a, a)
    chosen = b.select(a_nan, a, chosen)
    c_nan = b.fcmp_unordered("uno", c, c)
    return b.select(c_nan, c, chosen)


def _suffix(ty) -> str:
    return {id(T.f16): "f16", id(T.bf16): "bf16", id(T.f32): "f32", id(T.f64): "f64"}.get(id(ty)) \
        or f"i{ty.width}"


_INT_CMP = {OpCode.EQ: "==", OpCode.NE: "!=", OpCode.LT: "<", OpCode.LE: "<=", OpCode.GT: ">", OpCode.GE: ">="}


@lowering(*_INT_CMP)
def _compare(ctx, op):
    dtype = scalar_type(op.operands[0])
    pred = _INT_CMP[op.opcode]
    b = ctx.builder

    def fn(x, y):
        if isinstance(dtype, PointerType):
            x, y = b.ptrtoint(x, T.i64), b.ptrtoint(y, T.i64)
            return b.icmp_unsigned(pred, x, y)
        if dtype.is_floating:
            # Every comparison with NaN is false except `!=`, as in Python and torch.
            return b.fcmp_unordered(pred, x, y) if op.opcode == OpCode.NE else b.fcmp_ordered(pred, x, y)
        if dtype.is_signed:
            return b.icmp_signed(pred, x, y)
        return b.icmp_unsigned(pred, x, y)
    map_registers(ctx, op, fn)


def _fmod(ctx, x, y):
    """C fmod of two float scalars; 16-bit floats through float32 (fmod is exact, so narrowing the float32
    result back rounds nothing: it is the 16-bit operands' own remainder)."""
    if x.type in (T.f32, T.f64):
        return lower_math(ctx, "fmod", x, y)
    b = ctx.builder
    return b.fptrunc(lower_math(ctx, "fmod", b.fpext(x, T.f32), b.fpext(y, T.f32)), x.type)


def _int_to_bfloat16(ctx, x, source):
    """An integer of more than 24 bits to bfloat16, rounded once (to nearest even) where the target has no
    direct conversion (before sm_90 LLVM goes through float32: two roundings). The float32 step rounds to
    odd -- toward zero, then the last bit set where that was inexact -- which float32's 16 bits more than
    bfloat16 make exact for the second rounding (S. Boldo and G. Melquiond, "When double rounding is odd",
    2005)."""
    b = ctx.builder
    name = {(True, 32): "i2f", (False, 32): "ui2f", (True, 64): "ll2f", (False, 64): "ull2f"}[
        (source.is_signed, x.type.width)]
    toward_zero = b.call(T.declare_intrinsic(ctx.module, f"llvm.nvvm.{name}.rz", T.f32, [x.type]), [x])
    back = b.fptosi(toward_zero, x.type) if source.is_signed else b.fptoui(toward_zero, x.type)
    inexact = b.zext(b.icmp_unsigned("!=", back, x), T.i32)
    odd = b.bitcast(b.or_(b.bitcast(toward_zero, T.i32), inexact), T.f32)
    return b.fptrunc(odd, T.bf16)


@lowering(OpCode.ADD, OpCode.SUB, OpCode.MUL, OpCode.DIV, OpCode.IDIV, OpCode.MOD, OpCode.AND, OpCode.OR,
          OpCode.XOR, OpCode.SHL, OpCode.SHR, OpCode.MINIMUM, OpCode.MAXIMUM)
def _binary(ctx, op):
    dtype = scalar_type(op.operands[0])
    b = ctx.builder
    code = op.opcode
    if dtype.is_floating:
        if code == OpCode.DIV and op.attrs.get("approx") and dtype == float32:
            # `fdiv afn`: rcp.approx.f32 for 1 / x, else div.approx.f32 (the denormal-preserving forms)
            return map_registers(ctx, op, lambda x, y: b.fdiv(x, y, flags=("afn",)))
        simple = {OpCode.ADD: b.fadd, OpCode.SUB: b.fsub, OpCode.MUL: b.fmul, OpCode.DIV: b.fdiv}
        if ctx.fp_fusion and code in simple and code != OpCode.DIV:
            # `contract` (CompileOptions.fp_fusion): NVPTX forms fma.rn where a product feeds an add, and leaves the
            # rest without .rn, which ptxas may fuse too (TOOLCHAIN.md: plain ops get `.rn`, which forbids it)
            return map_registers(ctx, op, lambda x, y: simple[code](x, y, flags=("contract",)))
        if code in simple:
            return map_registers(ctx, op, simple[code])
        if code == OpCode.MOD:
            return map_registers(ctx, op, lambda x, y: _fmod(ctx, x, y))
        if code in (OpCode.MINIMUM, OpCode.MAXIMUM):
            return map_registers(ctx, op, lambda x, y: float_min_max(ctx, b, x, y, code == OpCode.MAXIMUM))
        raise AssertionError(code)
    simple = {OpCode.ADD: b.add, OpCode.SUB: b.sub, OpCode.MUL: b.mul, OpCode.AND: b.and_, OpCode.OR: b.or_,
              OpCode.XOR: b.xor}
    if code in simple:
        return map_registers(ctx, op, simple[code])
    if code in (OpCode.IDIV, OpCode.MOD):
        return map_registers(ctx, op, lambda x, y: _int_div(b, dtype, x, y, code == OpCode.MOD))
    if code in (OpCode.SHL, OpCode.SHR):
        return map_registers(ctx, op, lambda x, y: _shift(b, dtype, x, y, code == OpCode.SHL))
    if code in (OpCode.MINIMUM, OpCode.MAXIMUM):
        signed = "s" if dtype.is_signed else "u"
        name = f"llvm.{signed}{'max' if code == OpCode.MAXIMUM else 'min'}.i{T.llvm_type(dtype).width}"
        fn = T.declare_intrinsic(ctx.module, name, T.llvm_type(dtype), [T.llvm_type(dtype)] * 2)
        return map_registers(ctx, op, lambda x, y: b.call(fn, [x, y]))
    raise AssertionError(code)


@lowering(OpCode.UMULHI)
def _multiply_high_unsigned(ctx, op):
    """UMULHI: both operands zero-extended to 2N bits, multiplied, shifted right by N and truncated, the
    pattern NVPTX selects `mul.hi.u32` / `mul.hi.u64` for (`mul.hi.u16` for 16 bits)."""
    b = ctx.builder

    def fn(x, y):
        width = x.type.width
        wide = ir.IntType(2 * width)
        product = b.mul(b.zext(x, wide), b.zext(y, wide))
        return b.trunc(b.lshr(product, _const(wide, width)), x.type)
    map_registers(ctx, op, fn)


@lowering(OpCode.NEG, OpCode.INVERT, OpCode.ABS)
def _unary(ctx, op):
    dtype = scalar_type(op.operands[0])
    b = ctx.builder
    ty = T.llvm_type(dtype)
    if op.opcode == OpCode.NEG:
        fn = b.fneg if dtype.is_floating else (lambda x: b.sub(_const(ty, 0), x))
    elif op.opcode == OpCode.INVERT:
        fn = lambda x: b.xor(x, _const(ty, -1 if ty.width > 1 else 1))  # noqa: E731
    elif dtype.is_floating:
        fabs = T.declare_intrinsic(ctx.module, f"llvm.fabs.{_suffix(ty)}", ty, [ty])
        fn = lambda x: b.call(fabs, [x])  # noqa: E731
    else:
        iabs = T.declare_intrinsic(ctx.module, f"llvm.abs.i{ty.width}", ty, [ty, T.i1])
        fn = lambda x: b.call(iabs, [x, _const(T.i1, 0)])  # noqa: E731
    map_registers(ctx, op, fn)


_MATH_NAMES = {OpCode.EXP: "exp", OpCode.EXP2: "exp2", OpCode.LOG: "log", OpCode.LOG2: "log2",
               OpCode.SQRT: "sqrt", OpCode.RSQRT: "rsqrt", OpCode.SIN: "sin", OpCode.COS: "cos",
               OpCode.ERF: "erf", OpCode.TANH: "tanh", OpCode.FLOOR: "floor", OpCode.CEIL: "ceil"}


@lowering(*_MATH_NAMES)
def _math(ctx, op):
    name = _MATH_NAMES[op.opcode]
    ftz = op.attrs.get("ftz", False)
    map_registers(ctx, op, lambda x: lower_math(ctx, name, x, ftz=ftz))


@lowering(OpCode.MATH, OpCode.MATH2)
def _libdevice(ctx, op):
    name = op.attrs["fn"]
    map_registers(ctx, op, lambda *xs: lower_libdevice(ctx, name, *xs))


@lowering(OpCode.FMA)
def _fma(ctx, op):
    ty = T.llvm_type(scalar_type(op.operands[0]))
    fn = T.declare_intrinsic(ctx.module, f"llvm.fma.{_suffix(ty)}", ty, [ty, ty, ty])
    map_registers(ctx, op, lambda x, y, z: ctx.builder.call(fn, [x, y, z]))


@lowering(OpCode.WHERE)
def _where(ctx, op):
    """A condition proven constant over runs of registers (memory.constant_run: a mask of whole vectors,
    `cols < n` with n a multiple of the vector) selects with the run's first register: one predicate per
    run, not one per element, so that a mask used again later (after a loop, say) keeps few predicates
    live, as the vector loads and stores under it do."""
    conditions, on_true, on_false = (ctx.get(v) for v in op.operands)
    if not isinstance(op.result.type, BlockType):
        return ctx.set(op.result, ctx.builder.select(conditions, on_true, on_false))
    run = constant_run(ctx, op.operands[0])
    ctx.set(op.result, [ctx.builder.select(conditions[i - i % run], x, y)
                        for i, (x, y) in enumerate(zip(on_true, on_false))])


@lowering(OpCode.MULTIPLE_OF, OpCode.MAX_CONTIGUOUS)
def _hint(ctx, op):
    ctx.set(op.result, ctx.get(op.operands[0]))


@lowering(OpCode.ADDPTR)
def _addptr(ctx, op):
    pointee = T.llvm_memory_type(scalar_type(op.operands[0]).element)
    offset_type = scalar_type(op.operands[1])
    b = ctx.builder

    def fn(p, offset):
        if offset.type.width < 64:
            offset = b.sext(offset, T.i64) if offset_type.is_signed else b.zext(offset, T.i64)
        return b.gep(p, [offset], source_etype=pointee)
    map_registers(ctx, op, fn)


@lowering(OpCode.BITCAST)
def _bitcast(ctx, op):
    source, target = scalar_type(op.operands[0]), scalar_type(op.result)
    if isinstance(source, PointerType) and isinstance(target, PointerType):
        return ctx.set(op.result, ctx.get(op.operands[0]))
    b, ty, i64 = ctx.builder, T.llvm_type(target), ir.IntType(64)

    def bits(x):
        # a pointer's 64 bits are an address: ptrtoint / inttoptr (LLVM's bitcast takes no pointer)
        if isinstance(source, PointerType):
            x = b.ptrtoint(x, i64)
            return x if x.type == ty else b.bitcast(x, ty)
        if isinstance(target, PointerType):
            return b.inttoptr(x if x.type == i64 else b.bitcast(x, i64), ty)
        return b.bitcast(x, ty)
    map_registers(ctx, op, bits)


@lowering(OpCode.CAST)
def _cast(ctx, op):
    source, target = scalar_type(op.operands[0]), scalar_type(op.result)
    map_registers(ctx, op, lambda x: convert(ctx, x, source, target))


def convert(ctx, x, source, target):
    """Convert one LLVM scalar from dsl type `source` to `target` with the language's rules."""
    b = ctx.builder
    if isinstance(source, PointerType):
        return b.ptrtoint(x, T.llvm_type(target))
    ty = T.llvm_type(target)
    if isinstance(target, PointerType):
        return b.inttoptr(x, ty)
    if target.is_bool:
        if source.is_floating:
            return b.fcmp_unordered("!=", x, ir.Constant(x.type, 0.0))
        return b.icmp_unsigned("!=", x, ir.Constant(x.type, 0))
    if source.is_floating and target.is_floating:
        if source.bits == target.bits:       # float16 <-> bfloat16 through float32
            return b.fptrunc(b.fpext(x, T.f32), ty)
        return b.fpext(x, ty) if target.bits > source.bits else b.fptrunc(x, ty)
    if source.is_floating:
        # Saturating, NaN -> 0: the fptosi.sat / fptoui.sat intrinsics define every input.
        kind = "fptosi" if target.is_signed else "fptoui"
        fn = T.declare_intrinsic(ctx.module, f"llvm.{kind}.sat.i{ty.width}.{_suffix(x.type)}", ty, [x.type])
        return b.call(fn, [x])
    if target.is_floating:
        if ty == T.bf16 and source.bits > 24 and not ctx.arch_at_least(90):
            return _int_to_bfloat16(ctx, x, source)
        return b.sitofp(x, ty) if source.is_signed else b.uitofp(x, ty)
    if ty.width == x.type.width:
        return x
    if ty.width < x.type.width:
        return b.trunc(x, ty)
    return b.sext(x, ty) if source.is_signed else b.zext(x, ty)
