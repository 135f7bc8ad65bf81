"""Lowering of the math functions for float32 and float64 (16-bit floats are widened by the
language before they get here).

Fast and accurate variants: `exp` and `exp2` in float32 use the `ex2.approx.f32` instruction (PTX
ISA "ex2": max relative error 2^-22 on the full range, plus the rounding of x * log2(e) for `exp`), or
with the op's `ftz` attr `ex2.approx.ftz.f32` (subnormal results flushed to zero: ptxas then emits
MUFU.EX2 alone, without the subnormal-range fix-up of the other);
everything else goes to libdevice's correctly rounded or documented-ulp functions (CUDA Math API
accuracy tables), and float64 always goes to libdevice. sqrt is IEEE (`sqrt.rn`).
"""

from __future__ import annotations

from llvmlite import ir

from ..target import llvm_types as T

_LOG2_E = 1.4426950408889634

# name -> (float32 function, float64 function); "llvm." names are LLVM intrinsics, "__nv_" libdevice.
_FUNCTIONS = {
    "exp": (None, "__nv_exp"),
    "exp2": (None, "__nv_exp2"),
    "log": ("__nv_logf", "__nv_log"),
    "log2": ("__nv_log2f", "__nv_log2"),
    "sqrt": ("llvm.sqrt.f32", "llvm.sqrt.f64"),
    "rsqrt": ("__nv_rsqrtf", "__nv_rsqrt"),
    "sin": ("__nv_sinf", "__nv_sin"),
    "cos": ("__nv_cosf", "__nv_cos"),
    "erf": ("__nv_erff", "__nv_erf"),
    "tanh": ("__nv_tanhf", "__nv_tanh"),
    "floor": ("llvm.floor.f32", "llvm.floor.f64"),
    "ceil": ("llvm.ceil.f32", "llvm.ceil.f64"),
    "fmod": ("__nv_fmodf", "__nv_fmod"),
}


def _call(ctx, name: str, args):
    ty = args[0].type
    fn = T.declare_intrinsic(ctx.module, name, ty, [a.type for a in args])
    return ctx.builder.call(fn, list(args))


def lower_math(ctx, name: str, *args, ftz: bool = False):
    """`name(*args)` on LLVM float or double scalars; `ftz` (exp, exp2 in float32): `ex2.approx.ftz.f32`,
    which flushes subnormal results to zero (dsl.exp2's docstring)."""
    ty = args[0].type
    if ty not in (T.f32, T.f64):
        raise TypeError(f"math function {name} reached codegen with type {ty}; widen 16-bit floats first")
    f32_name, f64_name = _FUNCTIONS[name]
    if ty == T.f64:
        return _call(ctx, f64_name, args)
    ex2 = "llvm.nvvm.ex2.approx.ftz.f32" if ftz else "llvm.nvvm.ex2.approx.f32"
    if name == "exp":
        return _call(ctx, ex2, [ctx.builder.fmul(args[0], ir.Constant(T.f32, _LOG2_E))])
    if name == "exp2":
        return _call(ctx, ex2, args)
    return _call(ctx, f32_name, args)


def lower_libdevice(ctx, name: str, *args):
    """libdevice's `name` (a MATH / MATH2 op's fn: language/libdevice.py's SYMBOLS) on LLVM float or double
    scalars (powi: a float or double and an i32): a call of `__nv_<name>f` / `__nv_<name>`, linked and inlined
    with the rest of libdevice (target/ptx.py)."""
    from ..language.libdevice import SYMBOLS

    ty = args[0].type
    if ty not in (T.f32, T.f64):
        raise TypeError(f"libdevice function {name} reached codegen with type {ty}; widen 16-bit floats first")
    return _call(ctx, SYMBOLS[name][ty == T.f64], args)
