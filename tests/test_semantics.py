"""The kernel language's arithmetic rules: promotion, weak literals, broadcasting, C-style integer
division, int32 wrap-around, comparison types, and every math builtin against torch in float64
(through the interpreter)."""

from __future__ import annotations

import itertools

import pytest
import torch

import fusedops.dsl as dsl
from fusedops.dsl.errors import CompilationError
from fusedops.dsl.ir import Block, Builder, OpCode
from fusedops.dsl.language import promotion
from fusedops.dsl.language.dtypes import ALL_DTYPES
from fusedops.dsl.language.semantics import Semantics
from helpers import assert_close, poison, random_tensor

# -- promotion table --------------------------------------------------------------------------------
PROMOTIONS = [
    (dsl.int8, dsl.int16, dsl.int16),
    (dsl.int32, dsl.int64, dsl.int64),
    (dsl.int1, dsl.int8, dsl.int8),
    (dsl.int1, dsl.uint16, dsl.uint16),
    (dsl.int8, dsl.uint8, dsl.uint8),        # equal width: unsigned wins (C)
    (dsl.int32, dsl.uint32, dsl.uint32),
    (dsl.uint8, dsl.int16, dsl.int16),       # wider wins
    (dsl.int64, dsl.float16, dsl.float16),   # any float beats any integer
    (dsl.uint64, dsl.bfloat16, dsl.bfloat16),
    (dsl.float16, dsl.bfloat16, dsl.float32),
    (dsl.float16, dsl.float32, dsl.float32),
    (dsl.bfloat16, dsl.float64, dsl.float64),
    (dsl.float32, dsl.float64, dsl.float64),
    (dsl.float16, dsl.float16, dsl.float16),
]


@pytest.mark.parametrize("a, b, expected", PROMOTIONS, ids=lambda v: str(v))
def test_promotion_table(a, b, expected):
    assert promotion.promote(a, b) == expected
    assert promotion.promote(b, a) == expected


def test_promotion_is_symmetric_and_closed_over_all_pairs():
    for a, b in itertools.product(ALL_DTYPES, repeat=2):
        result = promotion.promote(a, b)
        assert result == promotion.promote(b, a)
        assert result in (a, b) or result == dsl.float32


def _argument(dtype, shape=()):
    type_ = dsl.BlockType(shape, dtype) if shape else dtype
    block = Block([type_])
    return Semantics(Builder(block)), block.args[0]


WEAK_LITERALS = [
    (dsl.int8, 1, dsl.int8),
    (dsl.int8, 1000, dsl.int32),      # does not fit: the literal is int32, which then wins
    (dsl.uint8, 255, dsl.uint8),
    (dsl.uint8, -1, dsl.int32),
    (dsl.int32, 2**40, dsl.int64),
    (dsl.int64, 1, dsl.int64),
    (dsl.int32, 1.5, dsl.float32),    # a float literal with an integer: float32
    (dsl.float16, 2.0, dsl.float16),  # a float literal adopts the float operand's type
    (dsl.bfloat16, 3, dsl.bfloat16),
    (dsl.float64, 0.1, dsl.float64),
    (dsl.int32, True, dsl.int32),
    (dsl.int1, True, dsl.int32),      # arithmetic of two int1 computes in int32 (C's promotion: True + True = 2)
]


@pytest.mark.parametrize("dtype, literal, expected", WEAK_LITERALS, ids=lambda v: str(v))
def test_literals_are_weakly_typed(dtype, literal, expected):
    semantic, x = _argument(dtype)
    assert semantic.binary("add", x, literal).type == expected
    assert semantic.binary("mul", literal, x).type == expected


def test_literal_alone_types():
    assert promotion.literal_dtype(3) == dsl.int32
    assert promotion.literal_dtype(2**31) == dsl.int64
    assert promotion.literal_dtype(2**63) == dsl.uint64
    assert promotion.literal_dtype(2.5) == dsl.float32
    assert promotion.literal_dtype(False) == dsl.int1


# -- broadcasting -----------------------------------------------------------------------------------
@pytest.mark.parametrize("a, b, expected", [
    ((4, 1), (1, 8), (4, 8)), ((8,), (4, 8), (4, 8)), ((), (4,), (4,)), ((2, 1, 4), (8, 1), (2, 8, 4)),
])
def test_broadcast_shapes(a, b, expected):
    assert promotion.broadcast_shapes(a, b) == expected
    assert promotion.broadcast_shapes(b, a) == expected


def test_incompatible_shapes_are_a_compilation_error():
    semantic, x = _argument(dsl.float32, (4,))
    _, y = _argument(dsl.float32, (8,))
    with pytest.raises(CompilationError, match="do not broadcast"):
        semantic.binary("add", x, y)


@dsl.jit
def outer_sum_kernel(out_ptr, a_ptr, b_ptr, M: dsl.constexpr, N: dsl.constexpr):
    rows = dsl.arange(0, M)
    cols = dsl.arange(0, N)
    a = dsl.load(a_ptr + rows)
    b = dsl.load(b_ptr + cols)
    dsl.store(out_ptr + rows[:, None] * N + cols[None, :], a[:, None] + b[None, :] * 2)


def test_broadcasting_in_a_kernel(seed):
    a = random_tensor((4,), torch.float32, seed=seed)
    b = random_tensor((8,), torch.float32, seed=seed + 1)
    out = poison(torch.empty(4, 8))
    outer_sum_kernel[(1,)](out, a, b, M=4, N=8, interpret=True)
    assert_close(out, a.double()[:, None] + 2 * b.double()[None, :], torch.float32)


# -- integer division, modulo, wrap-around, comparisons ---------------------------------------------
@dsl.jit
def divmod_kernel(a_ptr, b_ptr, q_ptr, r_ptr, n, BLOCK: dsl.constexpr):
    offsets = dsl.arange(0, BLOCK)
    mask = offsets < n
    a = dsl.load(a_ptr + offsets, mask=mask, other=1)
    b = dsl.load(b_ptr + offsets, mask=mask, other=1)
    dsl.store(q_ptr + offsets, a // b, mask=mask)
    dsl.store(r_ptr + offsets, a % b, mask=mask)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.int8])
def test_integer_division_truncates_toward_zero_like_c(dtype):
    values = [7, -7, 7, -7, 0, 1, -1, 13, -13, 100]
    divisors = [2, 2, -2, -2, 3, -5, 5, 4, 4, -7]
    a = torch.tensor(values, dtype=dtype)
    b = torch.tensor(divisors, dtype=dtype)
    q, r = poison(torch.empty_like(a)), poison(torch.empty_like(a))
    divmod_kernel[(1,)](a, b, q, r, len(values), BLOCK=16, interpret=True)
    assert q.tolist() == torch.div(a, b, rounding_mode="trunc").tolist()     # -7 // 2 == -3
    assert r.tolist() == torch.fmod(a, b).tolist()                           # -7 % 2 == -1
    assert q.tolist()[1] == -3 and r.tolist()[1] == -1


def test_float_floordiv_floors_and_mod_is_fmod():
    a = torch.tensor([7.5, -7.5, 7.5, -7.5], dtype=torch.float64)
    b = torch.tensor([2.0, 2.0, -2.0, -2.0], dtype=torch.float64)
    q, r = poison(torch.empty_like(a)), poison(torch.empty_like(a))
    divmod_kernel[(1,)](a, b, q, r, 4, BLOCK=4, interpret=True)
    assert q.tolist() == torch.floor(a / b).tolist()
    assert r.tolist() == torch.fmod(a, b).tolist()


@dsl.jit
def constexpr_divmod_kernel(out_ptr, A: dsl.constexpr, B: dsl.constexpr):
    # Compile-time arithmetic is Python's: -7 // 2 == -4 and -7 % 2 == 1.
    dsl.store(out_ptr, A // B)
    dsl.store(out_ptr + 1, A % B)


def test_constexpr_arithmetic_follows_python():
    out = poison(torch.empty(2, dtype=torch.int32))
    constexpr_divmod_kernel[(1,)](out, A=-7, B=2, interpret=True)
    assert out.tolist() == [-4, 1]


@dsl.jit
def wrap_kernel(x_ptr, sum_ptr, product_ptr, n, BLOCK: dsl.constexpr):
    offsets = dsl.arange(0, BLOCK)
    mask = offsets < n
    x = dsl.load(x_ptr + offsets, mask=mask)
    dsl.store(sum_ptr + offsets, x + 1, mask=mask)
    dsl.store(product_ptr + offsets, x * 3, mask=mask)


def _wrap32(values):
    return [((v + 2**31) % 2**32) - 2**31 for v in values]


def test_int32_wraps_around():
    values = [2**31 - 1, -2**31, 123456789, -5, 0]
    x = torch.tensor(values, dtype=torch.int32)
    total, product = poison(torch.empty_like(x)), poison(torch.empty_like(x))
    wrap_kernel[(1,)](x, total, product, len(values), BLOCK=8, interpret=True)
    assert total.tolist() == _wrap32([v + 1 for v in values])
    assert product.tolist() == _wrap32([v * 3 for v in values])
    assert total.tolist()[0] == -2**31


@dsl.jit
def compare_kernel(x_ptr, y_ptr, lt_ptr, count_ptr, n, BLOCK: dsl.constexpr):
    offsets = dsl.arange(0, BLOCK)
    mask = offsets < n
    x = dsl.load(x_ptr + offsets, mask=mask)
    y = dsl.load(y_ptr + offsets, mask=mask)
    less = x < y
    dsl.store(lt_ptr + offsets, less, mask=mask)
    dsl.store(count_ptr, dsl.sum(dsl.where(mask, less, False), axis=0))


def test_comparisons_give_int1(seed):
    x = random_tensor((10,), torch.float32, seed=seed)
    y = random_tensor((10,), torch.float32, seed=seed + 1)
    less = poison(torch.empty(10, dtype=torch.bool))
    count = poison(torch.empty(1, dtype=torch.int32))
    compare_kernel[(1,)](x, y, less, count, 10, BLOCK=16, interpret=True)
    assert less.tolist() == (x < y).tolist()
    assert count.item() == int((x < y).sum())
    function = compare_kernel.ir(x, y, less, count, 10, BLOCK=16)
    comparisons = [op for op in function.walk() if op.opcode == OpCode.LT]
    assert comparisons and all(op.result.type.element == dsl.int1 for op in comparisons)
    sums = [op for op in function.walk() if op.opcode == OpCode.REDUCE]
    assert sums[0].result.type == dsl.int32      # int1 sums accumulate in int32


# -- math builtins against torch float64 ------------------------------------------------------------
@dsl.jit
def unary_kernel(x_ptr, y_ptr, n, FN: dsl.constexpr, BLOCK: dsl.constexpr):
    offsets = dsl.program_id(0) * BLOCK + dsl.arange(0, BLOCK)
    mask = offsets < n
    x = dsl.load(x_ptr + offsets, mask=mask, other=1.0)
    dsl.store(y_ptr + offsets, FN(x), mask=mask)


UNARY = [
    (dsl.exp, torch.exp, False), (dsl.exp2, torch.exp2, False), (dsl.log, torch.log, True),
    (dsl.log2, torch.log2, True), (dsl.sqrt, torch.sqrt, True), (dsl.rsqrt, torch.rsqrt, True),
    (dsl.abs, torch.abs, False), (dsl.sin, torch.sin, False), (dsl.cos, torch.cos, False),
    (dsl.sigmoid, torch.sigmoid, False), (dsl.erf, torch.erf, False), (dsl.tanh, torch.tanh, False),
    (dsl.floor, torch.floor, False), (dsl.ceil, torch.ceil, False),
]


@pytest.mark.parametrize("fn, reference, positive", UNARY, ids=[u[0].__name__ for u in UNARY])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_unary_math(fn, reference, positive, dtype, seed):
    x = random_tensor((300,), torch.float64, seed=seed, scale=3.0)
    if positive:
        x = x.abs() + 0.05
    x = x.to(dtype)
    y = poison(torch.empty_like(x))
    unary_kernel[(3,)](x, y, 300, FN=fn, BLOCK=128, interpret=True)
    assert y.dtype == dtype
    assert_close(y, reference(x.double()), dtype)


@dsl.jit
def ternary_kernel(x_ptr, y_ptr, z_ptr, out_ptr, n, OP: dsl.constexpr, BLOCK: dsl.constexpr):
    offsets = dsl.arange(0, BLOCK)
    mask = offsets < n
    x = dsl.load(x_ptr + offsets, mask=mask)
    y = dsl.load(y_ptr + offsets, mask=mask)
    z = dsl.load(z_ptr + offsets, mask=mask)
    if OP == "minimum":
        result = dsl.minimum(x, y)
    elif OP == "maximum":
        result = dsl.maximum(x, y)
    elif OP == "fma":
        result = dsl.fma(x, y, z)
    else:
        result = dsl.where(x > y, z, x - y)
    dsl.store(out_ptr + offsets, result, mask=mask)


TERNARY = {
    "minimum": lambda x, y, z: torch.minimum(x, y), "maximum": lambda x, y, z: torch.maximum(x, y),
    "fma": lambda x, y, z: x * y + z, "where": lambda x, y, z: torch.where(x > y, z, x - y),
}


@pytest.mark.parametrize("op", sorted(TERNARY))
def test_binary_and_ternary_math(op, seed):
    x, y, z = (random_tensor((50,), torch.float32, seed=seed + i) for i in range(3))
    out = poison(torch.empty_like(x))
    ternary_kernel[(1,)](x, y, z, out, 50, OP=op, BLOCK=64, interpret=True)
    assert_close(out, TERNARY[op](x.double(), y.double(), z.double()), torch.float32)


def test_math_on_integers_is_computed_in_float32():
    semantic, x = _argument(dsl.int32, (16,))
    assert semantic.unary("exp", x).type.element == dsl.float32
    semantic, h = _argument(dsl.float16, (16,))
    assert semantic.unary("sqrt", h).type.element == dsl.float16


# -- block methods and compile-time Python -----------------------------------------------------------
@dsl.jit
def shapes_kernel(out_ptr, x_ptr, M: dsl.constexpr, N: dsl.constexpr):
    rows = dsl.arange(0, M)
    cols = dsl.arange(0, N)
    x = dsl.load(x_ptr + rows[:, None] * N + cols[None, :])      # (M, N)
    flat = x.trans().reshape((M * N,))                          # column-major order of x
    BIGGEST: dsl.constexpr = max(M, N)
    factor = len(x.shape) + dsl.cdiv(BIGGEST, 3)                 # compile-time arithmetic
    if isinstance(M, dsl.constexpr) and x.dtype == dsl.float32 and x.shape == (M, N):
        flat = flat.to(dsl.float64) * factor
    print("flat", flat)
    dsl.store(out_ptr + dsl.arange(0, M * N), flat)


def test_block_methods_and_compile_time_python(seed, capsys):
    x = random_tensor((4, 8), torch.float32, seed=seed)
    out = poison(torch.empty(32, dtype=torch.float64))
    shapes_kernel[(1,)](out, x, M=4, N=8, interpret=True)
    assert_close(out, x.double().t().reshape(-1) * (2 + 3), torch.float64)
    assert "flat" in capsys.readouterr().out
    opcodes = [op.opcode for op in shapes_kernel.ir(out, x, M=4, N=8).walk()]
    assert OpCode.TRANS in opcodes and OpCode.RESHAPE in opcodes and OpCode.PRINT in opcodes
