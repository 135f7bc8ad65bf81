"""Review (session 17, the DSL): a demanding Triton user tried to break `fusedops.dsl` on the CPU with
kernels modelled on bug reports against Triton: C `//` and `%` of negative numbers, shifts past the bit
width, unsigned comparisons and mixed-sign promotion, int8 wrap-around, float -> int casts of NaN / inf /
out-of-range values, int -> fp16/bf16 rounding, NaN and signed zeros in minimum / maximum and reductions,
`where` with scalar arms, reductions over size-1 axes with keep_dims on 3-D blocks, cumsum along either
axis, argmax / argmin ties, reshape / trans / expand_dims / broadcast_to chains, helpers returning tuples,
early returns, `while` loops with data-dependent trip counts, constexpr defaults, masked loads with `other`
of another dtype, int64 pointer offsets, atomics' old values, math at the extremes, bool blocks stored to
int8 / bool tensors, conditional expressions, and unsupported constructs for their error type.

Each kernel runs in the interpreter against an exact NumPy / torch reference and is compiled for sm_80 and
sm_90a and assembled by ptxas. Scalar-only kernels (no thread ids, no inline PTX) are also JIT-compiled from
their sm_90a LLVM IR for the host with llvmlite and run (as tests/test_review_session7_b.py does), so the
compiler's integer / cast / min-max lowering is checked against the interpreter bit for bit without a GPU.

The eight defects found (marked "Defect n" below) were fixed in the same session: their tests assert the
correct behaviour and pass; the others document behaviour that held.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import fusedops.dsl as dsl
from fusedops.dsl.target import assemble, ptxas_available
from host_jit import run_on_host
from kernel_source import jit_from_source

NAN, INF = float("nan"), float("inf")
ARCHS = ("sm_80", "sm_90a")


# -- helpers ------------------------------------------------------------------------------------------

def _interpret(kernel, grid, *args, **constexprs):
    kernel[grid](*args, interpret=True, **constexprs)


def _assembles(kernel, *args, archs=ARCHS, **constexprs):
    """Compile for each arch without a GPU and assemble the PTX with ptxas (when installed)."""
    for arch in archs:
        compiled = kernel.compile(*args, target=arch, **constexprs)
        if ptxas_available():
            assemble(compiled.asm["ptx"], arch)


def _bits(t: torch.Tensor) -> list:
    """Bit patterns (so -0.0 and NaN payloads compare exactly)."""
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]).tolist()


# ================================================================================================
# Defect 1 (wrong results, side effects, out-of-bounds accesses): `a if c else b` with a runtime scalar
# condition is compiled as `dsl.where(c, a, b)` (frontend/expressions.py `visit_IfExp`): BOTH arms are
# evaluated, unconditionally. Python evaluates only the taken arm, and Triton builds a real conditional
# (scf.if) for a scalar condition. So `old = dsl.atomic_add(p, 1) if flag else -1` increments the counter
# even when flag is 0 (interpreter and compiled code alike: the LLVM IR runs the atomicrmw before the select),
# and the usual guard `v = dsl.load(p + k) if k < n else 0.0` loads out of bounds (an InterpreterError here,
# an illegal address on the GPU). Expected: only the taken arm runs (or a CompilationError for arms with
# side effects, never a silent double evaluation).
# ================================================================================================
@dsl.jit
def _ifexp_atomic_kernel(o_ptr, c_ptr, flag):
    old = dsl.atomic_add(c_ptr, 1) if flag != 0 else -1
    dsl.store(o_ptr, old)


@dsl.jit
def _ifexp_load_kernel(o_ptr, x_ptr, k, n):
    v = dsl.load(x_ptr + k) if k < n else -1.0
    dsl.store(o_ptr, v)


def test_conditional_expression_with_runtime_condition_compiles():
    _assembles(_ifexp_atomic_kernel, torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32), 0)
    _assembles(_ifexp_load_kernel, torch.zeros(1), torch.zeros(4), 100, 4)
    # the taken arm's value is right
    out, counter = torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
    _interpret(_ifexp_atomic_kernel, (1,), out, counter, 1)
    assert out.tolist() == [0] and counter.tolist() == [1]


@dsl.jit
def _ifexp_pure_kernel(o_ptr, x_ptr, flag):
    x = dsl.load(x_ptr)
    dsl.store(o_ptr, x * 2.0 if flag != 0 else x - 1)


def test_conditional_expression_branches_only_where_an_arm_touches_memory():
    # (fixed: frontend/expressions.py `visit_IfExp`) arms without memory accesses or side effects stay a select
    from fusedops.dsl.ir import OpCode
    x, out = torch.full((1,), 3.0), torch.zeros(1)
    pure = dsl.jit(_ifexp_pure_kernel.fn).ir(out, x, 1)
    assert not any(op.opcode == OpCode.IF for op in pure.walk())
    assert any(op.opcode == OpCode.WHERE for op in pure.walk())
    for flag, expected in ((1, 6.0), (0, 2.0)):
        _interpret(_ifexp_pure_kernel, (1,), out, x, flag)
        assert out.tolist() == [expected]
    branching = dsl.jit(_ifexp_load_kernel.fn).ir(out, x, 0, 1)
    assert sum(op.opcode == OpCode.IF for op in branching.walk()) == 1


def test_conditional_expression_does_not_run_the_untaken_atomic():
    out, counter = torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
    _interpret(_ifexp_atomic_kernel, (1,), out, counter, 0)
    assert out.tolist() == [-1]
    assert counter.tolist() == [0]


def test_conditional_expression_does_not_load_in_the_untaken_arm():
    x, out = torch.arange(4, dtype=torch.float32), torch.zeros(1)
    _interpret(_ifexp_load_kernel, (1,), out, x, 100, 4)     # InterpreterError: out-of-bounds load
    assert out.tolist() == [-1.0]


# ================================================================================================
# Defect 2 (interpreter and compiled code disagree; operand order changes the result): minimum / maximum of
# +0.0 and -0.0. The compiled code for float32/float16/bfloat16 uses llvm.minimum / llvm.maximum (min.NaN /
# max.NaN), for which -0.0 < +0.0: maximum(-0.0, +0.0) = +0.0 and minimum = -0.0 whatever the order (IEEE
# 754-2019 maximum / minimum). The interpreter (numerics.arithmetic.minimum / maximum = np.minimum / np.maximum) returns
# the second operand on ties: maximum(+0.0, -0.0) = -0.0 and minimum(-0.0, +0.0) = +0.0, and the compiled
# float64 path (codegen/elementwise.py `_float_min_max`'s compare-and-select fallback) does the same. So a
# ReLU written `dsl.maximum(0.0, x)` gives -0.0 for x = -0.0 in the interpreter and +0.0 on the GPU, and the
# float64 and float32 kernels differ. Expected: one rule for both, order-independent (-0.0 < +0.0).
# ================================================================================================
@dsl.jit
def _scalar_minmax_kernel(o_ptr, x_ptr, y_ptr, N: dsl.constexpr):
    for j in dsl.static_range(N):
        a = dsl.load(x_ptr + j)
        b = dsl.load(y_ptr + j)
        dsl.store(o_ptr + j, dsl.maximum(a, b))
        dsl.store(o_ptr + N + j, dsl.minimum(a, b))


def _signed_zero_operands(dtype):
    x = torch.tensor([-0.0, 0.0, NAN, 1.0], dtype=dtype)
    y = torch.tensor([0.0, -0.0, 1.0, NAN], dtype=dtype)
    return x, y


def _ieee_2019(dtype):
    # maximum: +0, +0, NaN, NaN; minimum: -0, -0, NaN, NaN
    return torch.tensor([0.0, 0.0, NAN, NAN, -0.0, -0.0, NAN, NAN], dtype=dtype)


def _same_bits_or_both_nan(a, b):
    return all((math.isnan(u) and math.isnan(v)) or (u == v and math.copysign(1, u) == math.copysign(1, v))
               for u, v in zip(a.tolist(), b.tolist()))


def test_compiled_float32_minimum_maximum_order_signed_zeros_and_propagate_nan():
    x, y = _signed_zero_operands(torch.float32)
    out = torch.zeros(8)
    run_on_host(_scalar_minmax_kernel, out, x, y, N=4)
    assert _same_bits_or_both_nan(out, _ieee_2019(torch.float32))
    _assembles(_scalar_minmax_kernel, out, x, y, N=4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64])
def test_interpreter_minimum_maximum_of_signed_zeros_match_the_compiled_rule(dtype):
    x, y = _signed_zero_operands(dtype)
    out = torch.zeros(8, dtype=dtype)
    _interpret(_scalar_minmax_kernel, (1,), out, x, y, N=4)
    assert _same_bits_or_both_nan(out, _ieee_2019(dtype))


def test_compiled_float64_minimum_maximum_of_signed_zeros_match_float32():
    x, y = _signed_zero_operands(torch.float64)
    out = torch.zeros(8, dtype=torch.float64)
    run_on_host(_scalar_minmax_kernel, out, x, y, N=4)
    assert _same_bits_or_both_nan(out, _ieee_2019(torch.float64))


# ================================================================================================
# Defect 3 (internal error instead of a CompilationError): `dsl.broadcast_to(x, shape)` with a dimension
# that is not a positive power of two -- (3, 8), (0, 8), (-1, 8) (NumPy's "-1 means keep") -- raises a bare
# `ValueError: block dimensions must be powers of two` from dtypes.BlockType, with no file, line or caret:
# shape_ops.py `broadcast_to` does not run `_check_shape` as `full`, `zeros` and `reshape` do (which give
# "shape must be powers of two" as a located CompilationError). Same for a scalar broadcast to (3,).
# ================================================================================================
@dsl.jit
def _broadcast_bad_kernel(o_ptr, x_ptr, SHAPE: dsl.constexpr):
    i = dsl.arange(0, 8)
    x = dsl.load(x_ptr + i)
    y = dsl.broadcast_to(x, SHAPE)
    dsl.store(o_ptr + i, dsl.max(dsl.reshape(y, (8 * 8,)), axis=0))


@pytest.mark.parametrize("shape", [(3, 8), (-1, 8)], ids=str)
def test_broadcast_to_a_non_power_of_two_shape_is_a_compilation_error(shape):
    x, out = torch.zeros(8), torch.zeros(8)
    with pytest.raises(dsl.CompilationError, match="broadcast|power"):
        _interpret(_broadcast_bad_kernel, (1,), out, x, SHAPE=shape)
    with pytest.raises(dsl.CompilationError, match="broadcast|power"):
        _broadcast_bad_kernel.compile(out, x, SHAPE=shape, target="sm_90a")


def test_reshape_and_full_with_bad_shapes_are_compilation_errors():
    x, out = torch.zeros(8), torch.zeros(8)

    @dsl.jit
    def bad(o_ptr, x_ptr, WHAT: dsl.constexpr):
        i = dsl.arange(0, 8)
        x = dsl.load(x_ptr + i)
        if WHAT == "reshape":
            x = dsl.sum(dsl.reshape(x, (-1,)), axis=0) + x
        else:
            x = dsl.sum(dsl.full((3,), 1.0, dsl.float32), axis=0) + x
        dsl.store(o_ptr + i, x)

    for what in ("reshape", "full"):
        with pytest.raises(dsl.CompilationError, match="powers of two"):
            _interpret(bad, (1,), out, x, WHAT=what)


# ================================================================================================
# Defect 4 (internal TypeErrors from the compiler and the interpreter): compile-time arguments that must be
# ints are checked with tests that a float passes -- `axis not in (0, 1, 2)` lets 1.0 through
# (`dsl.program_id(1.0)`), `sorted(perm) == list(range(n))` lets (1.0, 0) through (`dsl.trans(x, 1.0, 0)`),
# and `dsl.multiple_of(x, 16.0)` / `dsl.max_contiguous(x, 16.0)` call tuple() on the float -- and then crash
# with "TypeError: tuple indices must be integers or slices, not float" (interpreter) / "string indices must be
# integers" (compiler) / "'float' object is not iterable", without the kernel's file and line. The sibling
# checks (`dsl.expand_dims(x, 1.0)`, `dsl.sum(x, axis=1.0)`) do give CompilationErrors.
# ================================================================================================
@dsl.jit
def _float_axis_kernel(o_ptr, x_ptr, WHAT: dsl.constexpr):
    i = dsl.arange(0, 8)
    x = dsl.load(x_ptr + i)
    if WHAT == "program_id":
        y = x + dsl.program_id(1.0)
    elif WHAT == "trans":
        y = dsl.sum(dsl.trans(x[:, None], 1.0, 0), axis=0)
    elif WHAT == "multiple_of":
        y = dsl.multiple_of(x, 16.0)
    elif WHAT == "max_contiguous":
        y = dsl.max_contiguous(x, 16.0)
    elif WHAT == "expand_dims":
        y = dsl.sum(dsl.expand_dims(x, 1.0), axis=1)
    else:
        y = dsl.sum(x, axis=1.0) + x
    dsl.store(o_ptr + i, y)


def test_float_axis_of_expand_dims_and_sum_are_compilation_errors():
    x, out = torch.zeros(8), torch.zeros(8)
    for what in ("expand_dims", "sum"):
        with pytest.raises(dsl.CompilationError):
            _interpret(_float_axis_kernel, (1,), out, x, WHAT=what)


@pytest.mark.parametrize("what", ["program_id", "trans", "multiple_of", "max_contiguous"])
def test_float_axis_or_hint_values_are_compilation_errors(what):
    x, out = torch.zeros(8), torch.zeros(8)
    with pytest.raises(dsl.CompilationError):
        _interpret(_float_axis_kernel, (1,), out, x, WHAT=what)
    with pytest.raises(dsl.CompilationError):
        _float_axis_kernel.compile(out, x, WHAT=what, target="sm_90a")


# ================================================================================================
# Defect 5 (interpreter crashes where the compiler accepts): a `bool` in a shape -- `dsl.zeros((True, 8), ...)`,
# `dsl.reshape(x, (True, 8))`, `dsl.broadcast_to(x, (True, 8))` (a constexpr flag used as a dimension) --
# passes `_check_shape` (bool is an int subclass), compiles and assembles for sm_90a, but the interpreter dies
# with a bare "TypeError: an integer is required". Expected: the interpreter runs what the compiler compiles
# (True as 1), or both refuse it with a CompilationError.
# ================================================================================================
@dsl.jit
def _bool_dim_kernel(o_ptr, x_ptr, WHAT: dsl.constexpr):
    i = dsl.arange(0, 8)
    x = dsl.load(x_ptr + i)
    if WHAT == "zeros":
        y = dsl.sum(dsl.zeros((True, 8), dsl.float32), axis=0) + x
    else:
        y = dsl.sum(dsl.reshape(x, (True, 8)), axis=0)
    dsl.store(o_ptr + i, y)


@pytest.mark.parametrize("what", ["zeros", "reshape"])
def test_bool_shape_entries_behave_alike_in_interpreter_and_compiler(what):
    x, out = torch.arange(8, dtype=torch.float32), torch.zeros(8)
    try:
        _bool_dim_kernel.compile(out, x, WHAT=what, target="sm_90a")
    except dsl.CompilationError:
        with pytest.raises(dsl.CompilationError):
            _interpret(_bool_dim_kernel, (1,), out, x, WHAT=what)
        return
    _interpret(_bool_dim_kernel, (1,), out, x, WHAT=what)
    assert out.tolist() == x.tolist()


# ================================================================================================
# Defect 6 (interpreter breaks dsl.fma's contract): `dsl.fma` promises "x * y + z with a single rounding", and
# the compiled code is llvm.fma (fma.rn.f64), but the interpreter computes float64 fma unfused
# (numerics.arithmetic.fma: "float64 is computed unfused (NumPy has no fma)"): the product is rounded before the add.
# fma(1 + 2**-30, 1 - 2**-30, -1) is exactly -2**-60; the interpreter gives 0.0, so error-free transformations
# (TwoProduct, double-double accumulators, compensated dot products) validated in the interpreter lose their
# error term entirely. (float32/16 are computed exactly in float64 and rounded once: right.)
# ================================================================================================
@dsl.jit
def _fma_kernel(o_ptr, a_ptr, b_ptr, c_ptr, N: dsl.constexpr):
    i = dsl.arange(0, N)
    dsl.store(o_ptr + i, dsl.fma(dsl.load(a_ptr + i), dsl.load(b_ptr + i), dsl.load(c_ptr + i)))


def test_float32_fma_rounds_once():
    a = torch.tensor([1 + 2**-23, 1 + 2**-12, 3.0], dtype=torch.float32)
    b = torch.tensor([1 - 2**-23, 1 - 2**-12, 1 / 3], dtype=torch.float32)
    c = torch.tensor([-1.0, -1.0, -1.0], dtype=torch.float32)
    out = torch.zeros(4)
    a, b, c = (torch.cat([t, t[:1]]) for t in (a, b, c))
    _interpret(_fma_kernel, (1,), out, a, b, c, N=4)
    exact = (a.double() * b.double() + c.double()).float()      # the float64 product of float32s is exact
    assert torch.equal(out, exact)
    assert out[0].item() == -2.0**-46
    _assembles(_fma_kernel, out, a, b, c, N=4)


def test_float64_fma_rounds_once_in_the_interpreter():
    a = torch.tensor([1 + 2**-30, 1 + 2**-52], dtype=torch.float64)
    b = torch.tensor([1 - 2**-30, 1 - 2**-52], dtype=torch.float64)
    c = torch.tensor([-1.0, -1.0], dtype=torch.float64)
    out = torch.zeros(2, dtype=torch.float64)
    _interpret(_fma_kernel, (1,), out, a, b, c, N=2)
    assert out.tolist() == [-2.0**-60, -2.0**-104]


# ================================================================================================
# Defect 7 (result dtype contradicts the documentation): `dsl.max` / `dsl.min` say "in the input dtype", but
# of an int1 block (`dsl.max(mask, axis=0)`: "any lane set?") they return int32 (block_ops.py `reduce` casts
# int1 to int32 for every kind). A compile-time `assert r.dtype == dsl.int1` fails; `dsl.where(dsl.max(m, 0),
# ...)` works only because conditions accept any integer.
# ================================================================================================
@dsl.jit
def _bool_max_dtype_kernel(o_ptr, x_ptr, KIND: dsl.constexpr):
    i = dsl.arange(0, 8)
    m = dsl.load(x_ptr + i) > 0
    r = dsl.max(m, axis=0) if KIND == "max" else dsl.min(m, axis=0)
    assert r.dtype == dsl.int1, "the reduction changed the dtype"
    dsl.store(o_ptr, r)


def test_max_min_of_int1_values_are_right():
    @dsl.jit
    def values(o_ptr, x_ptr):
        i = dsl.arange(0, 8)
        m = dsl.load(x_ptr + i) > 0
        dsl.store(o_ptr, dsl.max(m, axis=0))
        dsl.store(o_ptr + 1, dsl.min(m, axis=0))

    for xs, expected in [([0] * 8, [0, 0]), ([0] * 7 + [1], [1, 0]), ([1] * 8, [1, 1])]:
        out = torch.full((2,), 7, dtype=torch.int32)
        _interpret(values, (1,), out, torch.tensor(xs, dtype=torch.float32))
        assert out.tolist() == expected


@pytest.mark.parametrize("kind", ["max", "min"])
def test_max_min_of_int1_keep_the_input_dtype(kind):
    out = torch.zeros(1, dtype=torch.bool)
    _interpret(_bool_max_dtype_kernel, (1,), out, torch.ones(8), KIND=kind)


# ================================================================================================
# Defect 8 (literal typing inconsistent with the written rule): Python literals are weak ("a literal adopts
# the other operand's type", promotion.py), so `x16 * y16 + 1.0` stays float16; but `dsl.fma(x16, y16, 1.0)`
# turns the literal into float32 first (semantics.py `fma` calls to_value without `like`) and the result is
# float32. Same for `dsl.fma(x16, 2.0, y16)`. Expected: float16, as for the unfused expression.
# ================================================================================================
@dsl.jit
def _fma_literal_kernel(o_ptr, x_ptr):
    i = dsl.arange(0, 8)
    x = dsl.load(x_ptr + i)
    unfused = x * x + 1.0
    assert unfused.dtype == dsl.float16
    fused = dsl.fma(x, x, 1.0)
    assert fused.dtype == dsl.float16, "dsl.fma with a float literal promoted float16 to float32"
    dsl.store(o_ptr + i, fused)


def test_fma_with_a_float_literal_keeps_float16():
    x, out = torch.ones(8, dtype=torch.float16), torch.zeros(8, dtype=torch.float16)
    _interpret(_fma_literal_kernel, (1,), out, x)
    assert out.tolist() == [2.0] * 8


# ================================================================================================
# What held
# ================================================================================================

# -- integers: C division, shifts, wrap-around; the compiled lowering run on the host ----------------------
@dsl.jit
def _scalar_binary_kernel(o_ptr, x_ptr, y_ptr, N: dsl.constexpr, OP: dsl.constexpr):
    for j in dsl.static_range(N):
        a = dsl.load(x_ptr + j)
        b = dsl.load(y_ptr + j)
        if OP == "div":
            r = a // b
        elif OP == "mod":
            r = a % b
        elif OP == "shl":
            r = a << b
        elif OP == "shr":
            r = a >> b
        elif OP == "add":
            r = a + b
        elif OP == "mul":
            r = a * b
        elif OP == "sub":
            r = a - b
        else:
            r = a < b
        dsl.store(o_ptr + j, r)


I32_MIN = -2**31
_INT_CASES = [
    # (dtype, op, x, y, expected)  -- C: truncation toward zero, x // 0 == -1, x % 0 == x, MIN // -1 == MIN
    (torch.int32, "div", [-7, 7, -7, 7, I32_MIN, 5, 0], [2, -2, -2, 0, -1, 0, 3], [-3, -3, 3, -1, I32_MIN, -1, 0]),
    (torch.int32, "mod", [-7, 7, -7, 7, I32_MIN, 5, 0], [2, -2, -2, 0, -1, 0, 3], [-1, 1, -1, 7, 0, 5, 0]),
    (torch.int8, "div", [-128, -7, 127, 5], [-1, 2, -1, 0], [-128, -3, -127, -1]),
    (torch.int8, "mod", [-128, -7, 127, 5], [-1, 2, -1, 0], [0, -1, 0, 5]),
    (torch.uint8, "div", [255, 200, 7, 9], [2, 0, 255, 3], [127, 255, 0, 3]),
    (torch.uint32, "mod", [2**32 - 1, 2**31, 5], [2, 3, 0], [1, 2, 5]),
    (torch.int32, "shl", [1, 1, 1, -1, 3], [31, 32, 33, -1, 0], [I32_MIN, 0, 0, 0, 3]),
    (torch.int32, "shr", [-8, -8, 8, -1, 2**30], [1, 32, 40, -3, 30], [-4, -1, 0, -1, 1]),
    (torch.uint8, "shr", [255, 128, 255, 1], [1, 8, 7, 255], [127, 0, 1, 0]),
    (torch.uint8, "shl", [255, 128, 255, 1], [1, 8, 7, 255], [254, 0, 128, 0]),
    (torch.int64, "shl", [1, 1, -1], [63, 64, 65], [-2**63, 0, 0]),
    (torch.int64, "shr", [-2**63, -1, 2**62], [63, 64, 62], [-1, -1, 1]),
    (torch.int8, "add", [127, -128, 100], [1, -1, 100], [-128, 127, -56]),
    (torch.int8, "mul", [127, -128, 16], [2, -1, 16], [-2, -128, 0]),
    (torch.uint16, "sub", [0, 1, 65535], [1, 2, 65535], [65535, 65535, 0]),
    (torch.int32, "mul", [2**30, I32_MIN, 65536], [4, -1, 65536], [0, I32_MIN, 0]),
    (torch.uint8, "lt", [0, 255, 128, 127], [255, 0, 127, 128], [True, False, False, True]),
    (torch.uint32, "lt", [0, 2**32 - 1, 2**31, 1], [2**32 - 1, 0, 2**31 - 1, 2**31], [True, False, False, True]),
]


@pytest.mark.parametrize("dtype,op,xs,ys,expected", _INT_CASES,
                         ids=[f"{str(c[0])[6:]}-{c[1]}-{i}" for i, c in enumerate(_INT_CASES)])
def test_integer_rules_interpreted_and_compiled_on_the_host(dtype, op, xs, ys, expected):
    x, y = torch.tensor(xs).to(dtype), torch.tensor(ys).to(dtype)
    out_dtype = torch.bool if op == "lt" else dtype
    interpreted = torch.zeros(len(xs), dtype=out_dtype)
    _interpret(_scalar_binary_kernel, (1,), interpreted, x, y, N=len(xs), OP=op)
    if op == "lt":
        assert interpreted.tolist() == [bool(v) for v in expected]
    else:
        assert interpreted.to(torch.int64).tolist() == expected
    compiled = torch.zeros(len(xs), dtype=out_dtype)
    run_on_host(_scalar_binary_kernel, compiled, x, y, N=len(xs), OP=op)
    assert torch.equal(compiled, interpreted)


def test_integer_rules_assemble():
    x = torch.tensor([-7, 7], dtype=torch.int8)
    for op in ("div", "mod", "shl", "shr"):
        _assembles(_scalar_binary_kernel, torch.zeros(2, dtype=torch.int8), x, x, N=2, OP=op)


# -- casts --------------------------------------------------------------------------------------------
@dsl.jit
def _scalar_cast_kernel(o_ptr, x_ptr, N: dsl.constexpr, DT: dsl.constexpr):
    for j in dsl.static_range(N):
        dsl.store(o_ptr + j, dsl.load(x_ptr + j).to(DT))


_F2I = [NAN, INF, -INF, 3e9, -3e9, 2.9, -2.9, 300.7, -129.5, 1e20]


@pytest.mark.parametrize("src,dst,dst_dsl", [
    (torch.float32, torch.int32, dsl.int32), (torch.float32, torch.int8, dsl.int8),
    (torch.float32, torch.uint8, dsl.uint8), (torch.float32, torch.int64, dsl.int64),
    (torch.float64, torch.int16, dsl.int16), (torch.float32, torch.bool, dsl.int1),
], ids=str)
def test_float_to_int_truncates_saturates_and_maps_nan_to_zero(src, dst, dst_dsl):
    x = torch.tensor(_F2I, dtype=torch.float64).to(src)
    if dst == torch.bool:
        expected = [True] * len(_F2I)          # x != 0, NaN included
    else:
        lo, hi = (torch.iinfo(dst).min, torch.iinfo(dst).max)
        expected = [0 if math.isnan(v) else int(min(max(math.trunc(v) if math.isfinite(v) else v, lo), hi))
                    for v in x.double().tolist()]
    interpreted = torch.zeros(len(_F2I), dtype=dst)
    _interpret(_scalar_cast_kernel, (1,), interpreted, x, N=len(_F2I), DT=dst_dsl)
    assert interpreted.tolist() == expected
    compiled = torch.zeros_like(interpreted)
    run_on_host(_scalar_cast_kernel, compiled, x, N=len(_F2I), DT=dst_dsl)
    assert torch.equal(compiled, interpreted)


def test_half_precision_to_int_casts_saturate():
    for src, dst_dsl, dst in [(torch.float16, dsl.int8, torch.int8), (torch.bfloat16, dsl.int16, torch.int16)]:
        x = torch.tensor([NAN, INF, -INF, 60000.0, -2.5, 300.0], dtype=src)
        out = torch.zeros(6, dtype=dst)
        _interpret(_scalar_cast_kernel, (1,), out, x, N=6, DT=dst_dsl)
        info = torch.iinfo(dst)
        assert out.tolist() == [0, info.max, info.min, info.max, -2, min(300, info.max)]
        _assembles(_scalar_cast_kernel, out, x, N=6, DT=dst_dsl)


def test_integer_to_narrow_float_rounds_once_to_nearest_even():
    # bfloat16 keeps 8 significant bits: 2**24 + 2**16 + 2**15 + 1 is above the midpoint (rounds up),
    # 2**24 + 2**15 + 1 below it; int64 -> float32 at 2**62 + 2**38 + 1 must not round twice through float64
    x32 = torch.tensor([0x01018001, 0x01008001, 2**24 + 1, 2**31 - 1], dtype=torch.int32)
    out = torch.zeros(4, dtype=torch.bfloat16)
    _interpret(_scalar_cast_kernel, (1,), out, x32, N=4, DT=dsl.bfloat16)
    assert out.double().tolist() == [2**24 + 2**17, 2**24, 2**24, 2**31]
    _assembles(_scalar_cast_kernel, out, x32, N=4, DT=dsl.bfloat16)
    x64 = torch.tensor([2**62 + 2**38 + 1, -(2**62 + 2**38 + 1), 2**62 + 2**38, 2**24 + 1], dtype=torch.int64)
    out32 = torch.zeros(4)
    _interpret(_scalar_cast_kernel, (1,), out32, x64, N=4, DT=dsl.float32)
    assert out32.double().tolist() == [2**62 + 2**39, -(2**62 + 2**39), 2**62, 2**24]
    host = torch.zeros(4)
    run_on_host(_scalar_cast_kernel, host, x64, N=4, DT=dsl.float32)
    assert torch.equal(host, out32)
    out16 = torch.zeros(4, dtype=torch.float16)
    _interpret(_scalar_cast_kernel, (1,), out16, torch.tensor([65519, 65520, 2049, -2051], dtype=torch.int32),
               N=4, DT=dsl.float16)
    assert out16.double().tolist() == [65504, INF, 2048, -2052]


def test_float_stores_to_integer_and_bool_tensors_convert_by_the_cast_rules():
    @dsl.jit
    def store3(ob_ptr, oi_ptr, ou_ptr, x_ptr):
        i = dsl.arange(0, 8)
        x = dsl.load(x_ptr + i)
        dsl.store(ob_ptr + i, x)
        dsl.store(oi_ptr + i, x)
        dsl.store(ou_ptr + i, x)

    x = torch.tensor([NAN, 0.0, -0.0, 0.5, -1.5, 300.0, -300.0, INF])
    ob, oi, ou = torch.zeros(8, dtype=torch.bool), torch.zeros(8, dtype=torch.int8), torch.zeros(8, dtype=torch.uint8)
    _interpret(store3, (1,), ob, oi, ou, x)
    assert ob.tolist() == [True, False, False, True, True, True, True, True]
    assert oi.tolist() == [0, 0, 0, 0, -1, 127, -128, 127]
    assert ou.tolist() == [0, 0, 0, 0, 0, 255, 0, 255]
    _assembles(store3, ob, oi, ou, x)


# -- promotion and literals ---------------------------------------------------------------------------------
@dsl.jit
def _promotion_kernel(o_ptr, u_ptr, s_ptr, N: dsl.constexpr, CASE: dsl.constexpr):
    for j in dsl.static_range(N):
        u = dsl.load(u_ptr + j)
        s = dsl.load(s_ptr + j)
        if CASE == "lt_minus_one":
            r = (u < -1).to(dsl.int64)          # -1 does not fit the unsigned type: C's promotion
        elif CASE == "mixed_add":
            r = (u + s).to(dsl.int64)
        else:
            r = (u < s).to(dsl.int64)
        dsl.store(o_ptr + j, r)


@pytest.mark.parametrize("udt,sdt,case,us,ss,expected", [
    (torch.uint32, torch.int32, "lt_minus_one", [0, 5, 2**32 - 1], [0, 0, 0], [1, 1, 0]),   # uint32: -1 is 2**32-1
    (torch.uint8, torch.int8, "lt_minus_one", [0, 5, 255], [0, 0, 0], [0, 0, 0]),          # int32: u < -1 never
    (torch.uint32, torch.int32, "mixed_cmp", [2**32 - 1, 0, 5], [-1, -1, -10], [0, 1, 1]),  # equal width: unsigned
    (torch.uint8, torch.int8, "mixed_add", [255, 0, 5], [-1, -1, -10], [254, 255, 251]),    # uint8 wraps
    (torch.uint8, torch.int16, "mixed_add", [200, 0, 5], [-1, -1, -10], [199, -1, -5]),      # wider signed wins
    (torch.uint32, torch.int64, "mixed_add", [2**32 - 1, 0, 5], [-1, -1, -10], [2**32 - 2, -1, -5]),
], ids=lambda v: str(v) if not isinstance(v, list) else None)
def test_unsigned_comparisons_and_mixed_sign_promotion(udt, sdt, case, us, ss, expected):
    u, s = torch.tensor(us).to(udt), torch.tensor(ss).to(sdt)
    out = torch.zeros(len(us), dtype=torch.int64)
    _interpret(_promotion_kernel, (1,), out, u, s, N=len(us), CASE=case)
    assert out.tolist() == expected
    host = torch.zeros_like(out)
    run_on_host(_promotion_kernel, host, u, s, N=len(us), CASE=case)
    assert torch.equal(host, out)


def test_literal_merges_in_if_and_loops_follow_python():
    @dsl.jit
    def merges(o_ptr, n, CASE: dsl.constexpr):
        if CASE == "int_then_float":
            y = 0
            if n > 0:
                y = 1.5
        elif CASE == "int_then_big":
            y = 1
            if n > 0:
                y = 2**40
        elif CASE == "ifexp":
            y = 1.5 if n > 0 else 2
        else:
            y = 0
            m = n
            while m > 0:
                y = y + 2**33
                m = m - 1
        dsl.store(o_ptr, y)

    expected = {"int_then_float": (0.0, 1.5), "int_then_big": (1.0, 2.0**40), "ifexp": (2.0, 1.5),
                "while": (0.0, 2.0 * 2**33)}
    for case, (at0, at2) in expected.items():
        for n, value in ((0, at0), (2, at2)):
            out = torch.zeros(1, dtype=torch.float64)
            _interpret(merges, (1,), out, n, CASE=case)
            assert out.item() == value, (case, n)
    _assembles(merges, torch.zeros(1, dtype=torch.float64), 2, CASE="while")


# -- where, reductions, scans, argmax -------------------------------------------------------------------------
@dsl.jit
def _where_kernel(o_ptr, x_ptr, s, M: dsl.constexpr, N: dsl.constexpr):
    r = dsl.arange(0, M)[:, None]
    c = dsl.arange(0, N)[None, :]
    x = dsl.load(x_ptr + r * N + c)
    y = dsl.where(x > 0, s, -1)          # scalar arms, block condition
    z = dsl.where(s > 2.0, x, 7)         # scalar condition, block and literal arms
    w = dsl.where(c > 1, r, c)           # (M, 1) and (1, N) arms under a (1, N) condition
    dsl.store(o_ptr + r * N + c, y + z + w)


def test_where_with_scalar_arms_and_broadcasting(seed):
    x = torch.randn(4, 8)
    for s in (3.5, 1.0):
        out = torch.zeros(4, 8)
        _interpret(_where_kernel, (1,), out, x, s, M=4, N=8)
        xd = x.double().numpy()
        r, c = np.arange(4)[:, None], np.arange(8)[None, :]
        ref = np.where(xd > 0, s, -1) + (xd if s > 2 else 7) + np.where(c > 1, r, c)
        assert np.abs(out.numpy() - ref).max() <= 1e-6
    _assembles(_where_kernel, out, x, 3.5, M=4, N=8)


@dsl.jit
def _reduce3_kernel(o_ptr, x_ptr, A: dsl.constexpr, B: dsl.constexpr, C: dsl.constexpr, AX: dsl.constexpr,
                    KIND: dsl.constexpr, KEEP: dsl.constexpr):
    a = dsl.arange(0, A)[:, None, None]
    b = dsl.arange(0, B)[None, :, None]
    c = dsl.arange(0, C)[None, None, :]
    off = a * B * C + b * C + c
    x = dsl.load(x_ptr + off)
    if KIND == "sum":
        r = dsl.sum(x, axis=AX, keep_dims=KEEP)
    elif KIND == "max":
        r = dsl.max(x, axis=AX, keep_dims=KEEP)
    elif KIND == "argmin":
        r = dsl.argmin(x, axis=AX, keep_dims=KEEP).to(x.dtype)
    else:
        r = dsl.cumsum(x, axis=AX, reverse=KEEP)
    if KIND != "cumsum" and not KEEP:
        r = dsl.expand_dims(r, AX)
    dsl.store(o_ptr + off, dsl.broadcast_to(r, (A, B, C)).to(x.dtype) + x)


@pytest.mark.parametrize("shape", [(2, 4, 8), (1, 8, 2), (8, 1, 1)], ids=str)
@pytest.mark.parametrize("kind", ["sum", "max", "argmin", "cumsum"])
def test_3d_reductions_and_scans_along_every_axis(shape, kind, seed):
    x = torch.randint(-5, 5, shape).to(torch.float32)
    t = x.double()
    for ax in (0, 1, 2):
        for keep in (False, True):
            out = torch.zeros(shape)
            _interpret(_reduce3_kernel, (1,), out, x, A=shape[0], B=shape[1], C=shape[2], AX=ax, KIND=kind, KEEP=keep)
            if kind == "sum":
                r = t.sum(ax, keepdim=True)
            elif kind == "max":
                r = t.amax(ax, keepdim=True)
            elif kind == "argmin":
                r = t.argmin(ax, keepdim=True).double()
            else:
                r = t.flip(ax).cumsum(ax).flip(ax) if keep else t.cumsum(ax)
            assert torch.equal(out.double(), r.expand(shape) + t), (ax, keep)
    _assembles(_reduce3_kernel, out, x, A=shape[0], B=shape[1], C=shape[2], AX=1, KIND=kind, KEEP=True,
               num_warps=2)


@dsl.jit
def _cumsum_kernel(o_ptr, x_ptr, M: dsl.constexpr, N: dsl.constexpr, AX: dsl.constexpr, REV: dsl.constexpr):
    r = dsl.arange(0, M)[:, None]
    c = dsl.arange(0, N)[None, :]
    dsl.store(o_ptr + r * N + c, dsl.cumsum(dsl.load(x_ptr + r * N + c), axis=AX, reverse=REV))


@pytest.mark.parametrize("dtype,out_dtype", [(torch.int8, torch.int32), (torch.bool, torch.int32),
                                             (torch.float16, torch.float32), (torch.int32, torch.int32)], ids=str)
def test_cumsum_along_either_axis_accumulates_wide(dtype, out_dtype, seed):
    x = torch.randint(-100, 100, (4, 8)).to(dtype)
    t = x.to(torch.float64) if dtype.is_floating_point else x.to(torch.int64)
    for ax in (0, 1):
        for rev in (False, True):
            out = torch.zeros(4, 8, dtype=out_dtype)
            _interpret(_cumsum_kernel, (1,), out, x, M=4, N=8, AX=ax, REV=rev)
            ref = t.flip(ax).cumsum(ax).flip(ax) if rev else t.cumsum(ax)
            assert torch.equal(out.to(ref.dtype), ref)     # int8 sums past 127 do not wrap: int32
    _assembles(_cumsum_kernel, out, x, M=4, N=8, AX=0, REV=True)


@dsl.jit
def _arg_kernel(o_ptr, x_ptr, M: dsl.constexpr, N: dsl.constexpr, AX: dsl.constexpr, KIND: dsl.constexpr):
    r = dsl.arange(0, M)[:, None]
    c = dsl.arange(0, N)[None, :]
    x = dsl.load(x_ptr + r * N + c)
    if KIND == "argmax":
        v = dsl.argmax(x, axis=AX)
    elif KIND == "argmin":
        v = dsl.argmin(x, axis=AX)
    elif KIND == "max":
        v = dsl.max(x, axis=AX).to(dsl.float32)
    else:
        v = dsl.min(x, axis=AX).to(dsl.float32)
    dsl.store(o_ptr + dsl.arange(0, M if AX == 1 else N), v)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int8, torch.bool], ids=str)
def test_argmax_first_index_on_ties_and_nan_propagation(dtype, seed):
    x = torch.randint(0, 3, (8, 16)).to(dtype)          # many ties
    if dtype.is_floating_point:
        x[2, 5] = x[2, 9] = x[6, 3] = NAN                   # the first NaN is the extreme
    t = x.double() if dtype.is_floating_point else x.long()
    for ax in (0, 1):
        for kind in ("argmax", "argmin", "max", "min"):
            is_arg = kind.startswith("arg")
            out = torch.zeros(8 if ax == 1 else 16, dtype=torch.int32 if is_arg else torch.float32)
            _interpret(_arg_kernel, (1,), out, x, M=8, N=16, AX=ax, KIND=kind)
            ref = {"argmax": t.argmax(ax), "argmin": t.argmin(ax), "max": t.amax(ax), "min": t.amin(ax)}[kind]
            assert torch.equal(out.nan_to_num(-7), ref.to(out.dtype).nan_to_num(-7)), (ax, kind)
    for kind in ("argmax", "max"):
        _assembles(_arg_kernel, out, x, M=8, N=16, AX=0, KIND=kind)


# -- shapes -------------------------------------------------------------------------------------------------
@dsl.jit
def _permute_kernel(o_ptr, x_ptr, P: dsl.constexpr):
    i = dsl.arange(0, 64)
    x3 = dsl.reshape(dsl.load(x_ptr + i), (2, 4, 8))
    dsl.store(o_ptr + i, dsl.reshape(dsl.trans(x3, P), (64,)))


@pytest.mark.parametrize("perm", [(0, 1, 2), (0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1), (2, 1, 0)], ids=str)
def test_reshape_and_3d_permutations_are_row_major(perm):
    x, out = torch.arange(64, dtype=torch.float32), torch.zeros(64)
    _interpret(_permute_kernel, (1,), out, x, P=perm)
    assert torch.equal(out, x.reshape(2, 4, 8).permute(perm).reshape(-1))
    if perm in ((1, 2, 0), (2, 1, 0)):
        _assembles(_permute_kernel, out, x, P=perm)


def test_expand_dims_broadcast_trans_chain():
    @dsl.jit
    def chain(o_ptr, x_ptr, N: dsl.constexpr):
        i = dsl.arange(0, N)
        x = dsl.load(x_ptr + i)
        a = dsl.expand_dims(x, 0)                                      # (1, N)
        b = dsl.expand_dims(x, -1)                                     # (N, 1)
        c = dsl.broadcast_to(a, (N, N)) - dsl.broadcast_to(b, (N, N))  # c[r, k] = x[k] - x[r]
        d = dsl.reshape(dsl.trans(c), (N * N,))
        e = dsl.sum(x[None, :, None] + x[:, None, None] * 0, axis=2)   # (N, N): e[r, k] = x[k]
        g = dsl.max(dsl.reshape(e, (N, N, 1, 1)), axis=3)              # size-1 axis
        dsl.store(o_ptr + dsl.arange(0, N * N), d + dsl.reshape(g, (N * N,)))

    x, out = torch.randn(8), torch.zeros(64)
    _interpret(chain, (1,), out, x, N=8)
    xd = x.double()
    ref = (xd[None, :] - xd[:, None]).t().reshape(-1) + xd[None, :].expand(8, 8).reshape(-1)
    assert (out.double() - ref).abs().max() <= 1e-6
    _assembles(chain, out, x, N=8)


# -- control flow, helpers, constexprs ----------------------------------------------------------------------------
@dsl.jit
def _pair_helper(x, y):
    if dsl.sum(x, axis=0) > 0:
        return x + y, x * y
    return x - y, y


@dsl.jit
def _default_helper(x, eps=1e-5, SCALE: dsl.constexpr = 2, OFF: dsl.constexpr = None, DT: dsl.constexpr = dsl.float16):
    y = x * SCALE + eps
    if OFF is not None:
        y = y + OFF
    return y.to(DT).to(dsl.float32)


@dsl.jit
def _control_kernel(o_ptr, x_ptr, n, N: dsl.constexpr):
    i = dsl.arange(0, N)
    x = dsl.load(x_ptr + i)
    a, b = _pair_helper(x, x + 1)
    acc = (dsl.zeros((N,), dsl.float32), 0)
    for k in dsl.static_range(3):              # a tuple carried through an unrolled loop
        acc = (acc[0] + a * k, acc[1] + k)
    m = n
    steps = 0
    while m > 1:                               # Collatz: data-dependent trip count
        m = dsl.where(m % 2 == 0, m // 2, 3 * m + 1)
        steps += 1
    extra = _default_helper(x) + _default_helper(x, 0.5, 3, OFF=1.5) + _default_helper(eps=1, x=x, DT=dsl.bfloat16)
    dsl.store(o_ptr + i, acc[0] + b + extra + steps + acc[1])


def _control_reference(x, n):
    y = x + 1
    a, b = (x + y, x * y) if x.sum() > 0 else (x - y, y)
    m, steps = n, 0
    while m > 1:
        m, steps = (m // 2 if m % 2 == 0 else 3 * m + 1), steps + 1

    def helper(eps, scale, off, dtype):
        v = x.float() * scale + torch.tensor(eps, dtype=torch.float32)
        return (v + off if off is not None else v).to(dtype).double()
    extra = (helper(1e-5, 2, None, torch.float16) + helper(0.5, 3, 1.5, torch.float16)
             + helper(1, 2, None, torch.bfloat16))
    return 3 * a.double() + b.double() + extra + steps + 3


def test_helpers_returning_tuples_static_range_tuples_while_and_defaults(seed):
    for sign in (1, -1):
        x = torch.rand(8) * sign
        for n in (1, 6, 27):
            out = torch.zeros(8)
            _interpret(_control_kernel, (1,), out, x, n, N=8)
            assert (out.double() - _control_reference(x, n)).abs().max() <= 1e-4, (sign, n)
    _assembles(_control_kernel, out, x, 6, N=8)


@dsl.jit
def _clamp_helper(x, lo, hi):
    if x < lo:
        return lo
    elif x > hi:
        return hi
    return x


@dsl.jit
def _nested_return_helper(x, n):
    y = x
    if n > 0:
        y = y + 1
        if n > 5:
            return y * 100
        y = y + 2
    return y


@dsl.jit
def _early_return_kernel(o_ptr, x_ptr, n):
    x = dsl.load(x_ptr)
    dsl.store(o_ptr, _clamp_helper(x, -1.0, 1.0))
    dsl.store(o_ptr + 1, _nested_return_helper(x, n))
    if n == 0:
        dsl.store(o_ptr + 2, 55.0)
        return
    dsl.store(o_ptr + 3, 66.0)
    while n > 100:
        n = n - 1
    if n < 0:
        return
    dsl.store(o_ptr + 4, n * 1.0)


def test_early_returns_in_helpers_and_kernels():
    for xv in (-3.0, 0.5, 2.0):
        for n in (0, 1, 7, 150, -1):
            out = torch.zeros(5)
            _interpret(_early_return_kernel, (1,), out, torch.tensor([xv]), n)
            y = xv + 1 if n > 0 else xv
            ref = [min(max(xv, -1.0), 1.0), y * 100 if n > 5 else (y + 2 if n > 0 else y), 0.0, 0.0, 0.0]
            if n == 0:
                ref[2] = 55.0
            else:
                ref[3] = 66.0
                if n >= 0:
                    ref[4] = float(min(n, 100))
            assert out.tolist() == ref, (xv, n)
    _assembles(_early_return_kernel, torch.zeros(5), torch.zeros(1), 3)


@dsl.jit
def _early_exit_kernel(o_ptr, n, N: dsl.constexpr):
    pid = dsl.program_id(0)
    i = dsl.arange(0, N)
    if pid * N >= n:
        return
    dsl.store(o_ptr + pid * N + i, pid + i, mask=pid * N + i < n)


def test_early_exit_of_whole_programs():
    out = torch.full((32,), -1, dtype=torch.int32)
    _interpret(_early_exit_kernel, (4,), out, 13, N=8)
    assert out.tolist() == list(range(8)) + [1, 2, 3, 4, 5] + [-1] * 19
    _assembles(_early_exit_kernel, out, 13, N=8)


def test_grid_of_three_axes():
    @dsl.jit
    def ids(o_ptr, BLOCK: dsl.constexpr):
        n0, n1, n2 = dsl.num_programs(0), dsl.num_programs(1), dsl.num_programs(2)
        lin = (dsl.program_id(2) * n1 + dsl.program_id(1)) * n0 + dsl.program_id(0)
        i = dsl.arange(0, BLOCK)
        dsl.store(o_ptr + lin * BLOCK + i, lin * 1000 + n0 * 100 + n1 * 10 + n2 + i * 0)

    out = torch.zeros(48, dtype=torch.int32)
    ids[lambda meta: (2, 3, 4)](out, BLOCK=2, interpret=True)
    assert out.tolist() == [lin * 1000 + 234 for lin in range(24) for _ in range(2)]
    _assembles(ids, out, BLOCK=2)


# -- memory -------------------------------------------------------------------------------------------------
@dsl.jit
def _other_kernel(o_ptr, x_ptr, n, OTHER: dsl.constexpr, N: dsl.constexpr):
    i = dsl.arange(0, N)
    dsl.store(o_ptr + i, dsl.load(x_ptr + i, mask=i < n, other=OTHER))


@pytest.mark.parametrize("dtype,other,expected", [
    (torch.int8, -1.7, -1),            # float -> int truncates
    (torch.uint8, -1, 255),            # wraps into the unsigned type
    (torch.float16, 1e6, INF),         # rounds to the pointee type
    (torch.int32, NAN, 0),             # NaN -> 0
    (torch.bool, 2, True),             # != 0
    (torch.int64, 2**40, 2**40),
], ids=str)
def test_masked_load_other_of_another_dtype_converts_to_the_pointee(dtype, other, expected):
    x, out = torch.ones(8, dtype=dtype), torch.zeros(8, dtype=dtype)
    _interpret(_other_kernel, (1,), out, x, 4, OTHER=other, N=8)
    one = True if dtype == torch.bool else 1
    assert out.tolist() == [one] * 4 + [expected] * 4
    _assembles(_other_kernel, out, x, 4, OTHER=other, N=8, archs=("sm_90a",))


def test_int64_offsets_and_masked_off_out_of_range_pointers():
    @dsl.jit
    def offsets(o_ptr, x_ptr, base, N: dsl.constexpr):
        i = dsl.arange(0, N)
        wide = i.to(dsl.int64)
        v = dsl.load(x_ptr + (base + wide) - base)                                 # int64 arithmetic
        w = dsl.load(x_ptr + wide * 2**40, mask=i < 1, other=-2.0)                 # masked-off: never touched
        u = dsl.load(x_ptr + i - 4, mask=i >= 4, other=-1.0)                       # negative, masked off
        dsl.store(o_ptr + i, v + w * 100 + u * 10000)

    x, out = torch.arange(8, dtype=torch.float32), torch.zeros(8)
    _interpret(offsets, (1,), out, x, 2**40, N=8)
    assert out.tolist() == [v + w * 100 + u * 10000 for v, w, u in
                            zip(range(8), [0] + [-2] * 7, [-1] * 4 + [0, 1, 2, 3])]
    _assembles(offsets, out, x, 2**40, N=8)


@dsl.jit
def _atomic_kernel(o_ptr, c_ptr, v_ptr, KIND: dsl.constexpr, N: dsl.constexpr):
    i = dsl.arange(0, N)
    v = dsl.load(v_ptr + i)
    if KIND == "max":
        old = dsl.atomic_max(c_ptr + i, v)
    elif KIND == "min":
        old = dsl.atomic_min(c_ptr + i, v)
    elif KIND == "xchg":
        old = dsl.atomic_xchg(c_ptr + i, v)
    elif KIND == "cas":
        old = dsl.atomic_cas(c_ptr + i, 0, v)
    else:
        old = dsl.atomic_add(c_ptr + i, v)
    dsl.store(o_ptr + i, old)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.int64, torch.float64], ids=str)
@pytest.mark.parametrize("kind", ["add", "max", "min", "xchg", "cas"])
def test_atomics_return_old_values_and_apply_the_rule(dtype, kind):
    if dtype.is_floating_point:
        c0 = torch.tensor([0, 1, -1, 5, 0, -0.0, NAN, 3], dtype=dtype)
        v = torch.tensor([1, -2, 2, 5, -0.0, 0.0, 1, NAN], dtype=dtype)
    else:
        c0 = torch.tensor([0, 1, -3, 5, 0, 7, 9, 3], dtype=dtype)
        v = torch.tensor([1, 2, 2, -5, 0, 9, 1, 1], dtype=dtype)
    c, out = c0.clone(), torch.zeros(8, dtype=dtype)
    _interpret(_atomic_kernel, (1,), out, c, v, KIND=kind, N=8)
    assert _bits(out) == _bits(c0)
    if kind == "add":
        ref = c0 + v
    elif kind == "max":
        ref = torch.maximum(c0, v)           # NaN propagates (fmaximum)
    elif kind == "min":
        ref = torch.minimum(c0, v)
    elif kind == "xchg":
        ref = v
    else:                                    # compare-and-swap compares bits: -0.0 is not 0, NaN never equal
        ref = torch.where(torch.tensor(_bits(c0)) == 0, v, c0)
    assert torch.equal(c.nan_to_num(123.0), ref.nan_to_num(123.0)) if kind in ("add", "xchg", "cas") \
        else torch.allclose(c, ref, equal_nan=True)
    if kind in ("max", "cas"):
        _assembles(_atomic_kernel, out, c, v, KIND=kind, N=8)


@dsl.jit
def _atomic_counter_kernel(o_ptr, c_ptr, N: dsl.constexpr):
    i = dsl.arange(0, N)
    dsl.store(o_ptr + i, dsl.atomic_add(c_ptr + i % 2, 1))


def test_atomic_old_values_on_shared_addresses_are_a_sequence():
    counter, out = torch.zeros(2, dtype=torch.int32), torch.zeros(8, dtype=torch.int32)
    _interpret(_atomic_counter_kernel, (1,), out, counter, N=8)
    assert counter.tolist() == [4, 4]
    assert sorted(out[0::2].tolist()) == [0, 1, 2, 3] and sorted(out[1::2].tolist()) == [0, 1, 2, 3]
    _assembles(_atomic_counter_kernel, out, counter, N=8)


def test_bool_blocks_store_to_int8_and_bool_tensors_and_compute_in_int32(seed):
    @dsl.jit
    def bools(o8_ptr, ob_ptr, oi_ptr, b_ptr, x_ptr, N: dsl.constexpr):
        i = dsl.arange(0, N)
        m = dsl.load(x_ptr + i) > 0
        bl = dsl.load(b_ptr + i)
        dsl.store(o8_ptr + i, m)
        dsl.store(ob_ptr + i, m ^ bl)
        dsl.store(oi_ptr + i, (bl + bl + m) * 10 + (~bl).to(dsl.int32) + dsl.sum(m, axis=0) * 100)

    x, b = torch.randn(16), torch.rand(16) > 0.5
    o8, ob = torch.zeros(16, dtype=torch.int8), torch.zeros(16, dtype=torch.bool)
    oi = torch.zeros(16, dtype=torch.int32)
    _interpret(bools, (1,), o8, ob, oi, b, x, N=16)
    m = x > 0
    assert torch.equal(o8, m.to(torch.int8)) and torch.equal(ob, m ^ b)
    assert torch.equal(oi, (b.int() * 2 + m.int()) * 10 + (~b).int() + m.sum().int() * 100)   # True + True == 2
    _assembles(bools, o8, ob, oi, b, x, N=16)


# -- math at the extremes ----------------------------------------------------------------------------------
@dsl.jit
def _math_kernel(o_ptr, x_ptr, FN: dsl.constexpr, N: dsl.constexpr):
    i = dsl.arange(0, N)
    x = dsl.load(x_ptr + i)
    if FN == "exp":
        r = dsl.exp(x)
    elif FN == "exp2":
        r = dsl.exp2(x)
    elif FN == "log":
        r = dsl.log(x)
    elif FN == "log2":
        r = dsl.log2(x)
    elif FN == "sqrt":
        r = dsl.sqrt(x)
    elif FN == "rsqrt":
        r = dsl.rsqrt(x)
    elif FN == "tanh":
        r = dsl.tanh(x)
    elif FN == "erf":
        r = dsl.erf(x)
    elif FN == "floor":
        r = dsl.floor(x)
    else:
        r = dsl.abs(x)
    dsl.store(o_ptr + i, r)


_EXTREMES = [NAN, INF, -INF, 0.0, -0.0, -1.0, 1e-45, 100.0, -100.0, 89.0, -104.0, 1e30, -1e30, 0.5, 2.5, -2.5]
_TORCH_MATH = {"exp": torch.exp, "exp2": torch.exp2, "log": torch.log, "log2": torch.log2, "sqrt": torch.sqrt,
               "rsqrt": torch.rsqrt, "tanh": torch.tanh, "erf": torch.erf, "floor": torch.floor, "abs": torch.abs}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64], ids=str)
def test_math_functions_at_special_values(dtype):
    x = torch.tensor(_EXTREMES, dtype=torch.float64).to(dtype)
    tolerance = {torch.float32: 4e-6, torch.float64: 1e-12}.get(dtype, 1e-2)
    for name, function in _TORCH_MATH.items():
        out = torch.zeros(16, dtype=dtype)
        _interpret(_math_kernel, (1,), out, x, FN=name, N=16)
        ref = function(x.double()).to(dtype)
        o, r = out.double(), ref.double()
        close = (o == r) | (o.isnan() & r.isnan()) | ((o - r).abs() <= tolerance * r.abs())
        assert close.all(), (name, x[~close].tolist(), o[~close].tolist(), r[~close].tolist())
        zeros = (o == 0) & (r == 0)
        assert torch.equal(torch.signbit(o[zeros]), torch.signbit(r[zeros])), name   # sqrt(-0) = -0, rsqrt(-0) = -inf
    if dtype in (torch.float16, torch.float64):
        for name in ("exp", "rsqrt", "log", "erf"):
            _assembles(_math_kernel, out, x, FN=name, N=16)


# -- unsupported constructs: CompilationErrors, never internal errors -------------------------------------------
_BAD_BODIES = {
    "pow": "y = n ** n",      # (x ** 2 works since session 43; an integer base to a runtime power does not)
    "subscript_int": "y = x[0]",
    "slice_step": "y = x[::2]",
    "reshape_runtime": "y = dsl.reshape(x, (n,))",
    "arange_runtime": "y = dsl.arange(0, n) + x",
    "block_if": "y = x\n    if x > 0:\n        y = x + 1",
    "block_while": "y = x\n    while y > 0:\n        y = y - 1",
    "block_ifexp": "y = x if x > 0 else x",
    # (a tuple reassigned in a loop is carried since session 22: tests/test_loop_carried_tuples.py)
    "loop_type_change": "y = n\n    for k in range(3):\n        y = y * 0.5 + x",
    "return_in_loop": "y = x\n    for k in range(n):\n        if k > 2:\n            return",
    "return_in_static_range": "y = x\n    for k in dsl.static_range(3):\n        if k == 2:\n            return",
    "break": "y = x\n    for k in range(n):\n        break",
    "bitwise_float": "y = x & 1",
    "in_runtime": "y = x if n in (1, 2) else x",
    "ptr_times_int": "y = dsl.load(x_ptr * 2)",
    "ptr_minus_ptr": "y = x + (x_ptr - x_ptr)",
    "ptr_plus_bool": "y = dsl.load(x_ptr + (n > 0))",
    "store_block_to_scalar_ptr": "dsl.store(o_ptr, x)\n    y = x",
    "dot_1d": "y = dsl.dot(x, x)",
    "static_range_runtime": "y = x\n    for k in dsl.static_range(n):\n        y = y + k",
    "cumsum_scalar": "y = dsl.cumsum(n) + x",
    "argmax_bad_axis": "y = dsl.argmax(x, axis=1) + x",
    "atomic_cas_mask": "y = dsl.atomic_cas(x_ptr + dsl.arange(0, 8), x, x, mask=x > 0)",
    "bitcast_width": "y = x.to(dsl.float16, bitcast=True)",
    "dict": "d = {'a': x}\n    y = d['a']",
    "lambda": "f = lambda v: v + 1\n    y = f(x)",
    "assign_subscript": "y = x\n    y[0] = 1",
}


def _bad_kernel(body: str):
    source = f"def bad(o_ptr, x_ptr, n):\n    x = dsl.load(x_ptr + dsl.arange(0, 8))\n    {body}\n" \
             "    dsl.store(o_ptr + dsl.arange(0, 8), y)\n"
    return jit_from_source(source, f"<review17 {body!r}>", name="bad")


@pytest.mark.parametrize("name", list(_BAD_BODIES))
def test_unsupported_constructs_are_compilation_errors(name):
    kernel = _bad_kernel(_BAD_BODIES[name])
    x, out = torch.zeros(8), torch.zeros(8)
    with pytest.raises(dsl.CompilationError):
        _interpret(kernel, (1,), out, x, 3)
    with pytest.raises(dsl.CompilationError):
        kernel.compile(out, x, 3, target="sm_90a")
