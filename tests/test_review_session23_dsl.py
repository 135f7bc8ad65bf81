"""Review (session 23, the DSL): a fresh reviewer replayed bug reports against Triton (and peers such as
FlagGems, PyTorch Inductor) as small `fusedops.dsl` kernels on the CPU, each run in the interpreter against
an exact / NumPy / torch reference and, where the interpreter and the compiler could disagree, compiled for
sm_90a (PTX grepped for the instruction that carries the rule, assembled by ptxas when installed) or
JIT-compiled on the host from its LLVM IR (tests/host_jit.py) for scalar kernels.

Checked: C-style `//` / `%` of mixed signs with `x // 0` and `x % 0` in one kernel (FlagGems #204), the
PTX signedness of div / rem / shr / setp / min for every integer width, Python ints in [2**31, 2**64)
as arguments (Triton #10435), unsigned `~` (Triton #11210), a bool sum of 256 stored to a bool tensor
(Triton #9991), cumsum of bools (Triton #5897), argmax / max with NaN and inf (Triton #9022, #10291,
#7349), float -> int8 saturation of inf / 510 / -200 / NaN (Triton #10658), IEEE `/` (div.rn.f32,
Triton #10661: 4.6875 / 0.9375 == 5), runtime `range` steps of either sign, loop-carried promotion,
signed zeros in min / max reductions, float `//` (PyTorch #177926: floor of a rounded quotient), dtype
annotations of scalar parameters (Triton test_annotations), and error messages for bad programs and launch
arguments (non-power-of-two / runtime arange, mismatched shapes, runtime values where a constexpr is
needed, wrong argument kinds, bad grids).

Confirmed defects (strict xfails, each asserts the correct behaviour):
- The interpreter's `dsl.min` / `dsl.max` reductions do not order signed zeros: min of [+0.0, -0.0, +0.0,
  +0.0] is +0.0 (float32 / float64 / float16), max of [-0.0, +0.0, ...] in float16 is -0.0, and the result
  depends on the element order and the dtype. The compiled reductions combine with llvm.minimum /
  llvm.maximum (`min.NaN.f32`; for float64 the compare chain of `_float_min_max`), for which -0.0 < +0.0
  whatever the order, as the elementwise `dsl.minimum` / `dsl.maximum` rules (numerics.arithmetic._ordered_zeros)
  already do in the interpreter. Location: language/numerics/reductions.py `reduce` ("max" / "min" use np.max /
  np.min).
- Float `//` is floor(x / y) of the *rounded* quotient (language/semantics.py `binary`, op "floordiv" on a
  floating type): 1.0 // 0.1 gives 10.0 and 7.0 // 0.1 gives 70.0, where Python, NumPy, torch (and the same
  expression folded as a constexpr in the kernel) give 9.0 and 69.0; the compiled code does the same
  (div.rn then cvt.rmi).
- A dtype annotation on a scalar parameter (`n: dsl.int64`, `x: dsl.float16`) is silently ignored
  (runtime/jit.py only looks for constexpr annotations): `n * n` with n = 100000 wraps in int32
  (1410065408) although the user asked for int64, as Triton's typed parameters give.
- Errors for a runtime value where a compile-time one is needed print the internal IR value
  ("got 0, Value(n: int32)"), and a runtime reduction axis is reported as "out of range".
"""

from __future__ import annotations

import math
import re

import pytest
import torch

import fusedops.dsl as dsl
from fusedops.dsl.target import assemble, ptxas_available
from host_jit import run_on_host
from kernel_source import jit_from_source

NAN, INF = float("nan"), float("inf")
needs_ptxas = pytest.mark.skipif(not ptxas_available(), reason="ptxas is not installed")


def _kernel(source: str, tag: str):
    return jit_from_source(source, f"<review23 {tag}>")


def _assemble(compiled, arch="sm_90a"):
    if ptxas_available():
        assemble(compiled.asm["ptx"], arch)


# ================================================================================================
# DEFECT: min / max reductions of signed zeros in the interpreter
# ================================================================================================
@dsl.jit
def _min_max_reduce(o_ptr, x_ptr, B: dsl.constexpr):
    i = dsl.arange(0, B)
    x = dsl.load(x_ptr + i)
    dsl.store(o_ptr, dsl.min(x, axis=0))
    dsl.store(o_ptr + 1, dsl.max(x, axis=0))


_ZERO_ROWS = [[0.0, -0.0, 0.0, 0.0], [-0.0, 0.0, 0.0, 0.0], [0.0, 0.0, -0.0, 0.0], [-0.0, -0.0, 0.0, -0.0]]


# Fixed in session 23 (language/numerics/reductions.py _order_zeros; scans too).
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
def test_min_max_reductions_order_signed_zeros(dtype):
    for row in _ZERO_ROWS:
        x = torch.tensor(row, dtype=dtype)
        out = torch.full((2,), NAN, dtype=dtype)
        _min_max_reduce[(1,)](out, x, B=4, interpret=True)
        has_negative, has_positive = any(math.copysign(1, v) < 0 for v in row), any(math.copysign(1, v) > 0 for v in row)
        # IEEE 754-2019 minimum / maximum: -0.0 < +0.0, so min is -0.0 when any -0.0 is there, max +0.0 when any +0.0
        assert torch.signbit(out[0]).item() == has_negative, (row, out.tolist())
        assert torch.signbit(out[1]).item() == (not has_positive), (row, out.tolist())


def test_compiled_min_max_reductions_use_the_nan_propagating_ordered_instructions():
    """The compiled side of the rule above: float32 reductions combine with min.NaN / max.NaN (ordered zeros)."""
    compiled = _min_max_reduce.compile(torch.zeros(2), torch.zeros(64), target="sm_90a", B=64)
    ptx = compiled.asm["ptx"]
    assert "min.NaN.f32" in ptx and "max.NaN.f32" in ptx
    _assemble(compiled)


def test_min_max_reductions_propagate_nan_and_elementwise_minimum_orders_zeros():
    # NaN anywhere wins a max / min reduction (torch.max semantics; Triton #7349)
    x = torch.tensor([NAN, INF, INF, 1.0])
    out = torch.zeros(2)
    _min_max_reduce[(1,)](out, x, B=4, interpret=True)
    assert math.isnan(out[0].item()) and math.isnan(out[1].item())
    kernel = _kernel("def k(o_ptr, x_ptr, y_ptr):\n    i = dsl.arange(0, 4)\n"
                     "    x = dsl.load(x_ptr + i)\n    y = dsl.load(y_ptr + i)\n"
                     "    dsl.store(o_ptr + i, dsl.minimum(x, y))\n    dsl.store(o_ptr + 4 + i, dsl.maximum(x, y))\n",
                     "minimum_zeros")
    x, y = torch.tensor([0.0, -0.0, NAN, 1.0]), torch.tensor([-0.0, 0.0, 1.0, NAN])
    out = torch.zeros(8)
    kernel[(1,)](out, x, y, interpret=True)
    assert torch.signbit(out[:2]).tolist() == [True, True] and torch.signbit(out[4:6]).tolist() == [False, False]
    assert all(math.isnan(v) for v in out[[2, 3, 6, 7]].tolist())


# ================================================================================================
# DEFECT: float `//` is floor of the rounded quotient
# ================================================================================================
@dsl.jit
def _float_floordiv(o_ptr, x_ptr, y_ptr):
    dsl.store(o_ptr, dsl.load(x_ptr) // dsl.load(y_ptr))
    dsl.store(o_ptr + 1, 1.0 // 0.1)       # folded at compile time: Python's floor division


# Fixed in session 23 (language/semantics.py _float_floor_divide).
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("a,b", [(1.0, 0.1), (7.0, 0.1)])
def test_float_floor_division_is_floor_division(dtype, a, b):
    x, y = torch.tensor([a], dtype=dtype), torch.tensor([b], dtype=dtype)
    out = torch.full((2,), NAN, dtype=dtype)
    _float_floordiv[(1,)](out, x, y, interpret=True)
    assert out[1].item() == 9.0          # the constexpr fold already follows Python
    assert out[0].item() == torch.floor_divide(x, y).item() == (x.numpy() // y.numpy()).item()


def test_float_floor_division_where_rounding_does_not_matter():
    x = torch.tensor([-0.5, 7.5, -7.5, 5.0])
    y = torch.tensor([3.0, 2.0, 2.0, -0.0])
    kernel = _kernel("def k(o_ptr, x_ptr, y_ptr):\n    i = dsl.arange(0, 4)\n"
                     "    dsl.store(o_ptr + i, dsl.load(x_ptr + i) // dsl.load(y_ptr + i))\n", "floordiv_plain")
    out = torch.zeros(4)
    kernel[(1,)](out, x, y, interpret=True)
    assert out.tolist() == [-1.0, 3.0, -4.0, -INF]


# ================================================================================================
# DEFECT: dtype annotations of scalar parameters are silently ignored
# ================================================================================================
@dsl.jit
def _annotated(o_ptr, n: dsl.int64):
    dsl.store(o_ptr, n * n)


# Fixed in session 23 (runtime/signature.py _annotated_scalar).
def test_integer_annotation_of_a_scalar_parameter_is_honoured_or_refused():
    out = torch.zeros(1, dtype=torch.int64)
    try:
        _annotated[(1,)](out, 100000, interpret=True)
    except (TypeError, dsl.CompilationError) as error:      # refusing the annotation clearly is fine too
        assert "n" in str(error) and "annot" in str(error)
        return
    assert out.item() == 10**10


# ================================================================================================
# DEFECT (messages): runtime values where a compile-time value is needed print IR internals
# ================================================================================================
_NEEDS_CONSTEXPR = {
    "arange": "dsl.store(o_ptr + dsl.arange(0, n), 1.0)",
    "reduction_axis": "dsl.store(o_ptr, dsl.sum(dsl.load(o_ptr + dsl.arange(0, 4)), axis=n))",
    "program_id": "dsl.store(o_ptr, dsl.program_id(n))",
}


# Fixed in session 23 (language/shape_ops.py `shown`).
@pytest.mark.parametrize("what", sorted(_NEEDS_CONSTEXPR))
def test_runtime_value_where_a_constexpr_is_needed_is_named_plainly(what):
    kernel = _kernel(f"def k(o_ptr, n):\n    {_NEEDS_CONSTEXPR[what]}\n", f"constexpr_{what}")
    with pytest.raises(dsl.CompilationError, match=f"<review23 constexpr_{what}>:2:") as info:
        kernel[(1,)](torch.zeros(8), 2, interpret=True)
    message = str(info.value)
    assert "Value(" not in message
    assert "constexpr" in message or "compile-time" in message or "compile time" in message


# ================================================================================================
# Passing: integer division / modulo of mixed signs with zero divisors (FlagGems #204), on the host too
# ================================================================================================
@dsl.jit
def _div_mod(o_ptr, x_ptr, y_ptr):
    x = dsl.load(x_ptr)
    y = dsl.load(y_ptr)
    dsl.store(o_ptr, x // y)
    dsl.store(o_ptr + 1, x % y)


def _c_div_mod(x, y, bits):
    if y == 0:
        return -1, x
    if y == -1:
        q = -x
        q = (q + 2**(bits - 1)) % 2**bits - 2**(bits - 1)
        return q, 0
    q = abs(x) // abs(y) * (1 if (x < 0) == (y < 0) else -1)
    return q, x - q * y


@pytest.mark.parametrize("dtype,bits", [(torch.int32, 32), (torch.int64, 64), (torch.int16, 16)])
def test_c_division_and_remainder_with_zero_divisors_interpreted_and_compiled(dtype, bits):
    low = -2**(bits - 1)
    cases = [(2, 0), (-2, 0), (0, 0), (-7, 2), (7, -2), (-7, -2), (low, -1), (low, 3), (5, -1)]
    for x, y in cases:
        xt, yt = torch.tensor([x], dtype=dtype), torch.tensor([y], dtype=dtype)
        interpreted, host = torch.zeros(2, dtype=dtype), torch.zeros(2, dtype=dtype)
        _div_mod[(1,)](interpreted, xt, yt, interpret=True)
        run_on_host(_div_mod, host, xt, yt)
        assert interpreted.tolist() == host.tolist() == list(_c_div_mod(x, y, bits)), (x, y)


@needs_ptxas
@pytest.mark.parametrize("dtype,signed,width", [(torch.int32, True, 32), (torch.uint32, False, 32),
                                                (torch.int64, True, 64), (torch.uint64, False, 64),
                                                (torch.int16, True, 16), (torch.uint8, False, 16)])
def test_integer_ops_lower_to_instructions_of_the_operands_signedness(dtype, signed, width):
    kernel = _kernel("def k(o_ptr, x_ptr, y_ptr, OP: dsl.constexpr):\n    i = dsl.arange(0, 128)\n"
                     "    x = dsl.load(x_ptr + i)\n    y = dsl.load(y_ptr + i)\n"
                     "    if OP == 'div':\n        r = x // y\n    elif OP == 'rem':\n        r = x % y\n"
                     "    elif OP == 'shr':\n        r = x >> y\n    elif OP == 'min':\n        r = dsl.minimum(x, y)\n"
                     "    else:\n        r = (x < y).to(x.dtype)\n"
                     "    dsl.store(o_ptr + i, r)\n", "signedness")
    s, other = ("s", "u") if signed else ("u", "s")
    for op, instruction in (("div", "div"), ("rem", "rem"), ("shr", "shr"), ("min", "min"), ("lt", "setp.lt")):
        compiled = kernel.compile(*(torch.zeros(128, dtype=dtype) for _ in range(3)), target="sm_90a", OP=op)
        ptx = compiled.asm["ptx"]
        assert f"{instruction}.{s}{width}" in ptx, (op, dtype)
        if op in ("shr", "min", "lt"):      # div / rem of 64 bits may add a 32-bit unsigned fast path
            assert f"{instruction}.{other}{width}" not in ptx, (op, dtype)
        _assemble(compiled)


# ================================================================================================
# Passing: arguments, unsigned invert, bool stores and cumsum (Triton #10435, #11210, #9991, #5897)
# ================================================================================================
@dsl.jit
def _plus_one(o_ptr, x):
    dsl.store(o_ptr, x + 1)


@pytest.mark.parametrize("value", [2**31 - 1, 2**31, 3_000_000_000, 2**32 - 1, 2**32, -2**31 - 1, 2**62])
def test_python_int_arguments_in_every_range_keep_their_value(value):
    interpreted, host = torch.zeros(1, dtype=torch.int64), torch.zeros(1, dtype=torch.int64)
    _plus_one[(1,)](interpreted, value, interpret=True)
    run_on_host(_plus_one, host, value)
    # int32 arguments wrap in int32 (2**31 - 1 + 1); the others are int64
    expected = value + 1 if not -2**31 <= value < 2**31 else (value + 1 + 2**31) % 2**32 - 2**31
    assert interpreted.item() == host.item() == expected


@pytest.mark.parametrize("dtype", [torch.uint8, torch.uint16, torch.uint32, torch.uint64, torch.int8, torch.bool])
def test_bitwise_invert_of_unsigned_and_bool(dtype):
    kernel = _kernel("def k(o_ptr, x_ptr):\n    i = dsl.arange(0, 4)\n    dsl.store(o_ptr + i, ~dsl.load(x_ptr + i))\n",
                     "invert")
    values = [0, 1, 5, 7]
    x = torch.tensor(values).to(dtype)
    out = torch.zeros(4, dtype=dtype)
    kernel[(1,)](out, x, interpret=True)
    if dtype == torch.bool:
        expected = [not bool(v) for v in values]
    elif dtype.is_signed:
        expected = [~v for v in values]
    else:
        expected = [~v & (2**(8 * x.element_size()) - 1) for v in values]
    assert out.tolist() == expected


def test_a_sum_of_256_trues_stored_to_a_bool_tensor_is_true_and_cumsum_counts():
    kernel = _kernel("def k(o_ptr, c_ptr, x_ptr):\n    i = dsl.arange(0, 256)\n    x = dsl.load(x_ptr + i)\n"
                     "    dsl.store(o_ptr, dsl.sum(x, axis=0))\n    dsl.store(o_ptr + 1 + i, x.to(dsl.int32) * 256)\n"
                     "    dsl.store(c_ptr + i, dsl.cumsum(x, axis=0) - 1)\n", "bool_sum")
    x = torch.ones(256, dtype=torch.bool)
    x[::3] = False
    out, counts = torch.zeros(257, dtype=torch.bool), torch.zeros(256, dtype=torch.int32)
    kernel[(1,)](out, counts, x, interpret=True)
    assert out[0].item() is True                       # 170, not truncated to a byte
    assert out[1:].tolist() == x.tolist()              # 256 stored to bool is True, not 256 & 0xff == 0
    assert counts.tolist() == (x.to(torch.int32).cumsum(0) - 1).tolist()
    _assemble(kernel.compile(out, counts, x, target="sm_90a"))


# ================================================================================================
# Passing: argmax with NaN / inf (Triton #9022, #10291), float -> int8 saturation (Triton #10658)
# ================================================================================================
@dsl.jit
def _max_argmax(v_ptr, i_ptr, x_ptr, N: dsl.constexpr, B: dsl.constexpr):
    offsets = dsl.arange(0, B)
    x = dsl.load(x_ptr + offsets, mask=offsets < N, other=-float("inf"))
    dsl.store(v_ptr, dsl.max(x, axis=0))
    dsl.store(i_ptr, dsl.argmax(x, axis=0))
    dsl.store(i_ptr + 1, dsl.argmin(x, axis=0))


@pytest.mark.parametrize("values", [[NAN, 6.0, 8.0], [INF, NAN], [NAN, INF], [-INF, -INF, -INF], [1.0, NAN, NAN]])
def test_argmax_and_max_with_nan_follow_torch(values):
    x = torch.tensor(values)
    value, index = torch.zeros(1), torch.zeros(2, dtype=torch.int32)
    _max_argmax[(1,)](value, index, x, N=len(values), B=4, interpret=True)
    reference = x.max().item()
    assert (math.isnan(value.item()) and math.isnan(reference)) or value.item() == reference
    assert index.tolist() == [x.argmax().item(), x.argmin().item()]
    _assemble(_max_argmax.compile(value, index, x, target="sm_90a", N=len(values), B=4))


@pytest.mark.parametrize("src", [torch.float16, torch.float32, torch.float64])
def test_float_to_int8_saturates_and_nan_is_zero(src):
    kernel = _kernel("def k(o_ptr, x_ptr):\n    i = dsl.arange(0, 8)\n    dsl.store(o_ptr + i, dsl.load(x_ptr + i).to(dsl.int8))\n",
                     "to_int8")
    x = torch.tensor([INF, 510.0, -200.0, NAN, -INF, 127.9, -128.9, -0.5], dtype=src)
    out = torch.zeros(8, dtype=torch.int8)
    kernel[(1,)](out, x, interpret=True)
    assert out.tolist() == [127, 127, -128, 0, -128, 127, -128, 0]
    compiled = kernel.compile(out, x, target="sm_90a")
    assert re.search(r"cvt\.rzi\.s16\.f(16|32|64)", compiled.asm["ptx"])   # saturating, NaN -> 0 in PTX
    _assemble(compiled)


def test_float32_division_is_ieee_rounded():
    kernel = _kernel("def k(o_ptr, x_ptr, y_ptr):\n    i = dsl.arange(0, 4)\n"
                     "    dsl.store(o_ptr + i, dsl.load(x_ptr + i) / dsl.load(y_ptr + i))\n", "fdiv")
    x = torch.tensor([4.6875, 1.0, 3.0, 1e-38])
    y = torch.tensor([0.9375, 3.0, 7.0, 3.0])
    out = torch.zeros(4)
    kernel[(1,)](out, x, y, interpret=True)
    assert torch.equal(out, x / y) and out[0].item() == 5.0
    ptx = kernel.compile(out, x, y, target="sm_90a").asm["ptx"]
    assert "div.rn.f32" in ptx and "div.full" not in ptx and "div.approx" not in ptx


# ================================================================================================
# Passing: runtime `range` steps of either sign, loop-carried promotion
# ================================================================================================
@dsl.jit
def _range_sum(o_ptr, a, b, s):
    acc = 0
    count = 0
    for i in range(a, b, s):
        acc += i
        count += 1
    dsl.store(o_ptr, acc)
    dsl.store(o_ptr + 1, count)


@pytest.mark.parametrize("a,b,s", [(10, 0, -2), (0, 10, 3), (0, 10, -1), (5, 5, 1), (7, -8, -5),
                                   (-2**31, 2**31 - 1, 2**30), (2**31 - 1, -2**31, -2**31)])
def test_runtime_range_step_of_either_sign(a, b, s):
    interpreted, host = torch.zeros(2, dtype=torch.int64), torch.zeros(2, dtype=torch.int64)
    _range_sum[(1,)](interpreted, a, b, s, interpret=True)
    run_on_host(_range_sum, host, a, b, s)
    r = range(a, b, s)
    expected = [(sum(r) + 2**31) % 2**32 - 2**31, len(r)]       # acc is int32 (0 + int32 i)
    assert interpreted.tolist() == host.tolist() == expected


def test_loop_carried_int_promoted_by_a_float_and_int64_literal():
    kernel = _kernel("def k(o_ptr, x_ptr, n):\n    acc = 0\n    for i in range(n):\n        acc += dsl.load(x_ptr + i)\n"
                     "    big = 1\n    for i in range(n):\n        big = big * 3000000000\n"
                     "    dsl.store(o_ptr, acc)\n    dsl.store(o_ptr + 1, big.to(dsl.float64))\n", "carry_promotion")
    x = torch.tensor([0.25, 1.5, 2.0, 8.0], dtype=torch.float64)
    out = torch.zeros(2, dtype=torch.float64)
    kernel[(1,)](out, x, 3, interpret=True)
    assert out[0].item() == 3.75
    assert out[1].item() == float((3000000000**3 + 2**63) % 2**64 - 2**63)


# ================================================================================================
# Passing: errors for bad programs and bad launches name the line / the argument
# ================================================================================================
_BAD_PROGRAMS = [
    ("i = dsl.arange(0, 6)\n    dsl.store(o_ptr + i, 1.0)", "power of two"),
    ("i = dsl.arange(4, 2)\n    dsl.store(o_ptr + i, 1.0)", "power of two"),
    ("i = dsl.arange(0, 4) + dsl.arange(0, 8)\n    dsl.store(o_ptr + i, 1.0)", "do not broadcast"),
    ("z = dsl.zeros((n,), dsl.float32)\n    dsl.store(o_ptr, dsl.sum(z))", "compile time"),
    ("z = dsl.zeros((3,), dsl.float32)\n    dsl.store(o_ptr, dsl.sum(z))", "powers of two"),
    ("for i in dsl.static_range(n):\n        dsl.store(o_ptr + i, 1.0)", "constexpr"),
    ("v = dsl.load(o_ptr + dsl.arange(0, 4))\n    if v > 0:\n        dsl.store(o_ptr, 1.0)", "dsl.where"),
    ("v = dsl.arange(0, 4)\n    dsl.store(o_ptr, v ** v)", "compile-time int exponent"),   # (float ** : session 43)
    ("v = dsl.arange(0, 4)\n    dsl.store(o_ptr, v[1])", "indexed"),
    ("dsl.store(o_ptr, dsl.arange(0, 4))", "pointer's shape"),
    ("a = dsl.zeros((16, 16), dsl.float16)\n    dsl.store(o_ptr, dsl.sum(dsl.sum(dsl.dot(a, a.to(dsl.float32)), 0)))",
     "one dtype"),
    ("v = dsl.load(o_ptr)\n    dsl.store(o_ptr, v & 1)", "integer operands"),
    ("dsl.store(o_ptr, dsl.sum(dsl.load(o_ptr + dsl.arange(0, 4)), 0, keepdims=True))", "keepdims"),
    ("if n > 2:\n        a = 1.0\n    dsl.store(o_ptr, a)", "only one branch"),
]


@pytest.mark.parametrize("index", range(len(_BAD_PROGRAMS)))
def test_bad_programs_give_located_compilation_errors(index):
    body, fragment = _BAD_PROGRAMS[index]
    kernel = _kernel(f"def k(o_ptr, n):\n    {body}\n", f"bad{index}")
    with pytest.raises(dsl.CompilationError, match=re.escape(f"<review23 bad{index}>:")) as info:
        kernel[(1,)](torch.zeros(16), 3, interpret=True)
    assert fragment in str(info.value)


@dsl.jit
def _copy(o_ptr, x_ptr, n, B: dsl.constexpr):
    i = dsl.arange(0, B)
    dsl.store(o_ptr + i, dsl.load(x_ptr + i, mask=i < n))


_BAD_LAUNCHES = [
    (lambda o: _copy[(1,)](o, torch.zeros(4, dtype=torch.complex64), 4, B=4, interpret=True), TypeError, "x_ptr"),
    (lambda o: _copy[(1,)](o, [1.0, 2.0], 4, B=4, interpret=True), TypeError, "x_ptr"),
    (lambda o: _copy[(1,)](o, torch.ones(4), 4, interpret=True), TypeError, "`B`"),
    (lambda o: _copy[(1,)](o, torch.ones(4), 4, B=torch.tensor(4), interpret=True), TypeError, "`B`"),
    (lambda o: _copy[(1,)](o, torch.ones(4), B=4, interpret=True), TypeError, "`n`"),
    (lambda o: _copy[(1,)](o, torch.ones(4), 4, B=4, C=1, interpret=True), TypeError, "`C`"),
    (lambda o: _copy[(-1,)](o, torch.ones(4), 4, B=4, interpret=True), dsl.LaunchError, "grid"),
    (lambda o: _copy[(1.0,)](o, torch.ones(4), 4, B=4, interpret=True), dsl.LaunchError, "grid"),
    (lambda o: _copy[(1, 1, 1, 1)](o, torch.ones(4), 4, B=4, interpret=True), dsl.LaunchError, "grid"),
    (lambda o: _copy[(1,)](o, torch.ones(4), 4, B=4, num_warps=3, interpret=True), dsl.LaunchError, "num_warps"),
    (lambda o: _copy[(1,)](o, torch.ones(4), torch.tensor(4), B=4, interpret=True), dsl.CompilationError, "pointer"),
    (lambda o: _copy[(1,)](o, torch.ones(4).to_sparse(), 4, B=4, interpret=True), TypeError, "x_ptr"),
]


@pytest.mark.parametrize("index", range(len(_BAD_LAUNCHES)))
def test_bad_launch_arguments_give_clear_errors(index):
    launch, error, fragment = _BAD_LAUNCHES[index]
    with pytest.raises(error) as info:
        launch(torch.zeros(4))
    assert fragment in str(info.value)


def test_out_of_bounds_load_names_the_argument_and_the_line():
    with pytest.raises(dsl.InterpreterError, match="x_ptr") as info:
        _copy[(1,)](torch.zeros(4), torch.ones(2), 4, B=4, interpret=True)
    assert "out-of-bounds load" in str(info.value)
