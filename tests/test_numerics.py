"""The numeric rules (`fusedops.dsl.language.numerics`) against Python integers and torch."""

import math
import warnings
from fractions import Fraction

import hypothesis
import hypothesis.strategies as st
import numpy as np
import pytest
import torch

from fusedops.dsl.language import dtypes as dt
from fusedops.dsl.language.numerics import arithmetic, conversions, reductions

INT_TYPES = [dt.int8, dt.int16, dt.int32, dt.int64, dt.uint8, dt.uint16, dt.uint32, dt.uint64]


@pytest.fixture(autouse=True)
def _warnings_are_errors():
    """Integer rules must never warn; float rules run under errstate where IEEE specials are expected."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


def _range(dtype):
    info = np.iinfo(dtype.numpy_dtype)
    return int(info.min), int(info.max)


def _wrap(value: int, dtype) -> int:
    """Python int -> two's complement value of `dtype`."""
    value &= (1 << dtype.bits) - 1
    if dtype.is_signed and value >= 1 << (dtype.bits - 1):
        value -= 1 << dtype.bits
    return value


def _samples(dtype, seed: int, n: int = 300) -> np.ndarray:
    """Random values of `dtype` plus its edge values (0, +-1, MIN, MAX)."""
    low, high = _range(dtype)
    rng = np.random.default_rng(seed)
    edges = [v for v in (0, 1, -1, 2, -2, 7, low, high, low + 1, high - 1) if low <= v <= high]
    random = rng.integers(low, high, size=n, endpoint=True, dtype=dtype.numpy_dtype)
    small = rng.integers(max(low, -9), 10, size=n, dtype=np.int64).astype(dtype.numpy_dtype)
    return np.concatenate([np.array(edges, dtype=dtype.numpy_dtype), random, small])


def _pairs(dtype, seed):
    a = _samples(dtype, seed)
    b = _samples(dtype, seed + 1)
    # every edge value against every edge value, plus the random pairs
    edges = _samples(dtype, seed, n=0)
    ea, eb = np.meshgrid(edges, edges)
    return np.concatenate([a, ea.ravel()]), np.concatenate([b, eb.ravel()])


# -- integer arithmetic --------------------------------------------------------------------------------

def _c_divide(a: int, b: int, dtype):
    if b == 0:
        return _wrap(-1, dtype), a
    q = abs(a) // abs(b) * (1 if (a < 0) == (b < 0) else -1)
    return _wrap(q, dtype), _wrap(a - q * b, dtype)


@pytest.mark.parametrize("dtype", INT_TYPES, ids=str)
def test_integer_division_truncates_toward_zero(dtype):
    a, b = _pairs(dtype, seed=1)
    quotient = arithmetic.int_divide(a, b, dtype)
    remainder = arithmetic.remainder(a, b, dtype)
    assert quotient.dtype == dtype.numpy_dtype and remainder.dtype == dtype.numpy_dtype
    for x, y, q, r in zip(a.tolist(), b.tolist(), quotient.tolist(), remainder.tolist()):
        assert (q, r) == _c_divide(x, y, dtype), (x, y)


@pytest.mark.parametrize("dtype", [dt.int32, dt.int64], ids=str)
def test_integer_division_matches_torch_trunc_and_fmod(dtype):
    a, b = _pairs(dtype, seed=2)
    low, _ = _range(dtype)
    keep = (b != 0) & ~((a == low) & (b == -1))
    a, b = a[keep], b[keep]
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    np.testing.assert_array_equal(arithmetic.int_divide(a, b, dtype),
                                  torch.div(ta, tb, rounding_mode="trunc").numpy())
    np.testing.assert_array_equal(arithmetic.remainder(a, b, dtype), torch.fmod(ta, tb).numpy())


def test_division_by_zero_gives_all_ones_and_remainder_gives_dividend():
    a = np.array([5, -5, 0], dtype=np.int32)
    zero = np.zeros(3, dtype=np.int32)
    np.testing.assert_array_equal(arithmetic.int_divide(a, zero, dt.int32), [-1, -1, -1])
    np.testing.assert_array_equal(arithmetic.remainder(a, zero, dt.int32), a)
    u = np.array([5, 0], dtype=np.uint16)
    np.testing.assert_array_equal(arithmetic.int_divide(u, np.zeros(2, np.uint16), dt.uint16), [65535, 65535])
    np.testing.assert_array_equal(arithmetic.remainder(u, np.zeros(2, np.uint16), dt.uint16), u)


@pytest.mark.parametrize("dtype", INT_TYPES, ids=str)
@pytest.mark.parametrize("name, python", [("add", lambda x, y: x + y), ("sub", lambda x, y: x - y),
                                          ("mul", lambda x, y: x * y)])
def test_integer_arithmetic_wraps_around_silently(dtype, name, python):
    a, b = _pairs(dtype, seed=3)
    result = getattr(arithmetic, name)(a, b, dtype)
    assert result.dtype == dtype.numpy_dtype
    assert result.tolist() == [_wrap(python(x, y), dtype) for x, y in zip(a.tolist(), b.tolist())]
    # 0-d operands (scalars in kernels) take the same path without NumPy's scalar overflow warnings
    low, high = _range(dtype)
    assert int(arithmetic.add(np.asarray(high, dtype.numpy_dtype), np.asarray(1, dtype.numpy_dtype),
                            dtype)) == low


@pytest.mark.parametrize("dtype", INT_TYPES, ids=str)
def test_negative_and_absolute_wrap(dtype):
    x = _samples(dtype, seed=4)
    assert arithmetic.negative(x, dtype).tolist() == [_wrap(-v, dtype) for v in x.tolist()]
    expected = [_wrap(abs(v), dtype) for v in x.tolist()]
    assert arithmetic.absolute(x, dtype).tolist() == expected


def test_int1_arithmetic_is_modulo_two():
    a = np.array([False, False, True, True])
    b = np.array([False, True, False, True])
    assert arithmetic.add(a, b, dt.int1).tolist() == [False, True, True, False]
    assert arithmetic.mul(a, b, dt.int1).tolist() == [False, False, False, True]
    assert arithmetic.sub(a, b, dt.int1).tolist() == [False, True, True, False]
    assert arithmetic.add(a, b, dt.int1).dtype == np.bool_
    assert reductions.reduce(np.array([True, True, True]), "sum", 0, dt.int1).item() is True
    assert arithmetic.invert(a, dt.int1).tolist() == [True, True, False, False]


# -- shifts --------------------------------------------------------------------------------------------

def _python_shift(a: int, amount: int, dtype, left: bool) -> int:
    if amount < 0 or amount >= dtype.bits:
        return 0 if left or a >= 0 else -1
    if left:
        return _wrap(a << amount, dtype)
    return a >> amount       # Python's >> is arithmetic for negative ints, logical for unsigned values


@pytest.mark.parametrize("dtype", INT_TYPES, ids=str)
@pytest.mark.parametrize("left", [True, False], ids=["shl", "shr"])
def test_shifts_clamp_large_and_negative_amounts(dtype, left):
    rng = np.random.default_rng(5)
    a = _samples(dtype, seed=5, n=100)
    low, high = _range(dtype)
    amounts = rng.integers(max(low, -3), min(high, dtype.bits + 3), size=a.size, endpoint=True)
    amounts = np.concatenate([amounts[:-4], [0, dtype.bits - 1, dtype.bits, min(high, 200)]])
    amounts = amounts.astype(dtype.numpy_dtype)
    function = arithmetic.shift_left if left else arithmetic.shift_right
    result = function(a, amounts, dtype)
    assert result.dtype == dtype.numpy_dtype
    expected = [_python_shift(x, s, dtype, left) for x, s in zip(a.tolist(), amounts.tolist())]
    assert result.tolist() == expected


# -- floats --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [dt.float16, dt.bfloat16, dt.float32, dt.float64], ids=str)
def test_float_remainder_is_fmod(dtype):
    rng = np.random.default_rng(6)
    a = conversions.round_to_type(rng.standard_normal(200) * 10, dtype)
    b = conversions.round_to_type(rng.standard_normal(200) * 3, dtype)
    result = arithmetic.remainder(a, b, dtype)
    expected = [math.fmod(x, y) for x, y in zip(a.astype(np.float64), b.astype(np.float64))]
    np.testing.assert_array_equal(result.astype(np.float64),
                                  conversions.round_to_type(np.array(expected), dtype).astype(np.float64))


@pytest.mark.parametrize("dtype, torch_dtype", [(dt.float16, torch.float16), (dt.bfloat16, torch.bfloat16)],
                         ids=["float16", "bfloat16"])
@pytest.mark.parametrize("name, torch_op", [("add", torch.add), ("sub", torch.sub), ("mul", torch.mul),
                                            ("true_divide", torch.div)])
def test_half_arithmetic_rounds_once_like_torch(dtype, torch_dtype, name, torch_op):
    rng = np.random.default_rng(7)
    ta = torch.from_numpy(rng.standard_normal(500) * 100).to(torch_dtype)
    tb = torch.from_numpy(rng.standard_normal(500)).to(torch_dtype)
    a, b = ta.float().numpy(), tb.float().numpy()
    if dtype == dt.float16:
        a, b = a.astype(np.float16), b.astype(np.float16)
    result = getattr(arithmetic, name)(a, b, dtype)
    np.testing.assert_array_equal(np.asarray(result, dtype=np.float32), torch_op(ta, tb).float().numpy())


@pytest.mark.parametrize("name", ["exp", "exp2", "log", "log2", "sqrt", "rsqrt", "sin", "cos", "erf",
                                  "tanh", "floor", "ceil"])
@pytest.mark.parametrize("dtype", [dt.float16, dt.bfloat16, dt.float32, dt.float64], ids=str)
def test_unary_math_accuracy_against_float64(name, dtype):
    rng = np.random.default_rng(8)
    x = rng.uniform(0.1, 4.0, 300) * (1 if name in ("log", "log2", "sqrt", "rsqrt") else rng.choice([-1, 1], 300))
    x = conversions.round_to_type(x, dtype)
    result = arithmetic.unary_math(name, x, dtype)
    assert result.dtype == dtype.numpy_dtype
    reference = {"exp": np.exp, "exp2": np.exp2, "log": np.log, "log2": np.log2, "sqrt": np.sqrt,
                 "rsqrt": lambda v: 1 / np.sqrt(v), "sin": np.sin, "cos": np.cos,
                 "erf": lambda v: torch.special.erf(torch.from_numpy(v)).numpy(), "tanh": np.tanh,
                 "floor": np.floor, "ceil": np.ceil}[name](x.astype(np.float64))
    # one rounding to the type (plus float32's own few-ulp error): 1 ulp of the type, relative
    ulp = {"float16": 2.0 ** -10, "bfloat16": 2.0 ** -7, "float32": 2.0 ** -21, "float64": 2.0 ** -50}
    scale = np.maximum(np.abs(reference), 2.0 ** -10)
    assert np.all(np.abs(result.astype(np.float64) - reference) <= ulp[dtype.name] * scale)


def test_fma_rounds_once_for_float32():
    a = np.float32(1 + 2 ** -12)
    c = np.float32(-(1 + 2 ** -11))
    # a*a = 1 + 2**-11 + 2**-24: the unfused float32 product rounds the 2**-24 away
    assert arithmetic.fma(a, a, c, dt.float32) == np.float32(2 ** -24)


@pytest.mark.parametrize("name, torch_op", [("minimum", torch.minimum), ("maximum", torch.maximum)])
def test_minimum_maximum_propagate_nan(name, torch_op):
    a = np.array([1.0, np.nan, 3.0, np.nan, -np.inf], dtype=np.float32)
    b = np.array([np.nan, 2.0, 1.0, np.nan, 0.0], dtype=np.float32)
    result = getattr(arithmetic, name)(a, b, dt.float32)
    np.testing.assert_array_equal(result, torch_op(torch.from_numpy(a), torch.from_numpy(b)).numpy())
    assert np.isnan(result[:2]).all()


# -- casts and rounding --------------------------------------------------------------------------------

def _python_float_to_int(value: float, dtype) -> int:
    low, high = _range(dtype)
    if math.isnan(value):
        return 0
    if math.isinf(value):
        return high if value > 0 else low
    return min(max(math.trunc(value), low), high)


@pytest.mark.parametrize("dtype", INT_TYPES, ids=str)
@pytest.mark.parametrize("source", [dt.float16, dt.float32, dt.float64], ids=str)
def test_float_to_int_truncates_and_saturates(dtype, source):
    rng = np.random.default_rng(9)
    specials = [0.0, -0.0, 0.5, -0.5, 1.99, -1.99, np.nan, np.inf, -np.inf, 127.5, 128.0, -129.0,
                255.9, 256.0, 65535.5, 2.0 ** 31, -2.0 ** 31 - 2048, 2.0 ** 63, 2.0 ** 64, -2.0 ** 63, 1e30]
    x = np.concatenate([specials, rng.standard_normal(200) * 10.0 ** rng.integers(0, 20, 200)])
    with np.errstate(over="ignore"):
        x = x.astype(source.numpy_dtype)
    result = conversions.cast(x, source, dtype)
    assert result.dtype == dtype.numpy_dtype
    assert result.tolist() == [_python_float_to_int(float(v), dtype) for v in x]


def test_round_to_bfloat16_matches_torch_on_random_bit_patterns():
    rng = np.random.default_rng(10)
    bits = rng.integers(0, 2 ** 32, size=20000, dtype=np.uint64).astype(np.uint32)
    bits[:6] = [0x3F808000, 0x3F818000, 0x7F7FFFFF, 0xFF7FFFFF, 0x00008000, 0x7F800001]  # ties, max, NaN
    x = bits.view(np.float32)
    ours = conversions.round_to_bfloat16(x)
    theirs = torch.from_numpy(x).to(torch.bfloat16).float().numpy()
    nan = np.isnan(x)
    assert np.isnan(ours[nan]).all()
    np.testing.assert_array_equal(ours[~nan].view(np.uint32), theirs[~nan].view(np.uint32))
    assert (ours.view(np.uint32) & 0xFFFF == 0).all()


def test_float64_to_bfloat16_rounds_once():
    # 1 + 2**-8 is halfway between the bfloat16 values 1 and 1 + 2**-7; x is just above it, but its
    # float32 rounding lands exactly on the halfway point, where a second rounding goes to even (1.0).
    x = np.array([1 + 2 ** -8 + 2 ** -30, 1 + 2 ** -8, -(1 + 2 ** -8 + 2 ** -30)])
    result = conversions.cast(x, dt.float64, dt.bfloat16)
    assert result.tolist() == [1 + 2 ** -7, 1.0, -(1 + 2 ** -7)]


@pytest.mark.parametrize("target, torch_dtype", [(dt.float16, torch.float16), (dt.bfloat16, torch.bfloat16),
                                                 (dt.float32, torch.float32)], ids=["f16", "bf16", "f32"])
def test_float32_and_int_to_float_round_to_nearest_even(target, torch_dtype):
    rng = np.random.default_rng(11)
    x = (rng.standard_normal(5000) * 10.0 ** rng.integers(-8, 8, 5000)).astype(np.float32)
    with np.errstate(over="ignore"):
        result = conversions.cast(x, dt.float32, target)
    np.testing.assert_array_equal(np.asarray(result, np.float32),
                                  torch.from_numpy(x).to(torch_dtype).float().numpy())
    ints = rng.integers(-2 ** 31, 2 ** 31, 5000, dtype=np.int64).astype(np.int32)
    with np.errstate(over="ignore"):
        result = conversions.cast(ints, dt.int32, target)
    np.testing.assert_array_equal(np.asarray(result, np.float32),
                                  torch.from_numpy(ints).to(torch_dtype).float().numpy())


@pytest.mark.parametrize("source", INT_TYPES, ids=str)
@pytest.mark.parametrize("target", INT_TYPES, ids=str)
def test_int_to_int_truncates_or_extends_by_source_signedness(source, target):
    x = _samples(source, seed=12, n=50)
    assert conversions.cast(x, source, target).tolist() == [_wrap(v, target) for v in x.tolist()]


def test_casts_to_and_from_int1():
    x = np.array([0.0, -0.0, 0.5, np.nan, -np.inf], dtype=np.float32)
    assert conversions.cast(x, dt.float32, dt.int1).tolist() == torch.from_numpy(x).bool().tolist()
    assert conversions.cast(np.array([0, 256, -1], np.int32), dt.int32, dt.int1).tolist() == [False, True, True]
    flags = np.array([True, False])
    assert conversions.cast(flags, dt.int1, dt.int32).tolist() == [1, 0]
    assert conversions.cast(flags, dt.int1, dt.bfloat16).tolist() == [1.0, 0.0]
    assert conversions.cast(flags, dt.int1, dt.uint8).dtype == np.uint8


def test_bitcast_bfloat16_and_float32():
    x = np.array([1.0, -2.5, np.inf], dtype=np.float32)
    bits = conversions.bitcast(x, dt.float32, dt.int32)
    np.testing.assert_array_equal(bits, x.view(np.int32))
    half_bits = conversions.bitcast(x, dt.bfloat16, dt.int16)
    np.testing.assert_array_equal(half_bits, torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy())
    np.testing.assert_array_equal(conversions.bitcast(half_bits, dt.int16, dt.bfloat16), x)
    with pytest.raises(ValueError, match="bit widths"):
        conversions.bitcast(x, dt.float32, dt.int16)


def test_from_python_scalars():
    assert conversions.from_python(2 ** 32 + 5, dt.int32).item() == 5
    assert conversions.from_python(0.1, dt.float32).item() == np.float32(0.1)
    assert conversions.from_python(True, dt.float32).item() == 1.0
    assert conversions.from_python(2 ** 64 - 1, dt.uint64).item() == 2 ** 64 - 1
    assert conversions.from_python(float("inf"), dt.bfloat16).item() == float("inf")
    with pytest.raises(TypeError):
        conversions.from_python("1", dt.int32)


# -- reductions, scans, dot ----------------------------------------------------------------------------

@pytest.mark.parametrize("axis", [0, 1, None])
def test_reductions_match_torch_and_propagate_nan(axis):
    rng = np.random.default_rng(13)
    x = rng.standard_normal((8, 16)).astype(np.float32)
    x[2, 3] = np.nan
    t = torch.from_numpy(x)
    dims = {"dim": axis} if axis is not None else {}
    for kind, reference in [("max", torch.amax), ("min", torch.amin)]:
        np.testing.assert_array_equal(reductions.reduce(x, kind, axis, dt.float32), reference(t, **dims).numpy())
    clean = np.nan_to_num(x)
    np.testing.assert_allclose(reductions.reduce(clean, "sum", axis, dt.float32),
                               torch.from_numpy(clean).double().sum(**dims).numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["argmax", "argmin"])
def test_argreduce_first_index_and_nan_like_torch(kind):
    rng = np.random.default_rng(14)
    x = rng.integers(-3, 4, (16, 32)).astype(np.float32)       # many ties
    x[3, [5, 9]] = np.nan
    x[7, 30] = np.nan
    t = torch.from_numpy(x)
    torch_op = torch.argmax if kind == "argmax" else torch.argmin
    for axis in (0, 1):
        result = reductions.argreduce(x, kind, axis)
        assert result.dtype == np.int32
        np.testing.assert_array_equal(result, torch_op(t, dim=axis).numpy())
    assert reductions.argreduce(x, kind, None) == torch_op(t).item()


def test_integer_sum_wraps_and_half_sum_accumulates_in_float32():
    x = np.full(4, 2 ** 30, dtype=np.int32)
    assert reductions.reduce(x, "sum", 0, dt.int32) == 0
    halves = np.full(4096, 1.0, dtype=np.float16)   # 2048 + 1 is not a float16: needs float32 accumulation
    assert reductions.reduce(halves, "sum", 0, dt.float16) == 4096.0


@pytest.mark.parametrize("reverse", [False, True])
def test_scan_sum_matches_torch_cumsum(reverse):
    rng = np.random.default_rng(15)
    x = rng.integers(-100, 100, (4, 8)).astype(np.int32)
    x[0, 0] = 2 ** 31 - 1
    t = torch.from_numpy(x).long()
    expected = torch.cumsum(t.flip(1), 1).flip(1) if reverse else torch.cumsum(t, 1)
    result = reductions.scan(x, "sum", 1, reverse, dt.int32)
    assert result.tolist() == [[_wrap(v, dt.int32) for v in row] for row in expected.tolist()]


def test_dot_float16_and_int8():
    rng = np.random.default_rng(16)
    a = rng.standard_normal((16, 32)).astype(np.float16)
    b = rng.standard_normal((32, 8)).astype(np.float16)
    acc = rng.standard_normal((16, 8)).astype(np.float32)
    result = reductions.dot(a, b, acc, dt.float16, dt.float32)
    assert result.dtype == np.float32
    reference = a.astype(np.float64) @ b.astype(np.float64) + acc
    np.testing.assert_allclose(result, reference, rtol=1e-5, atol=1e-5)
    ia = rng.integers(-128, 128, (16, 64)).astype(np.int8)
    ib = rng.integers(-128, 128, (64, 16)).astype(np.int8)
    iacc = np.zeros((16, 16), np.int32)
    expected = (torch.from_numpy(ia).int() @ torch.from_numpy(ib).int()).numpy()
    np.testing.assert_array_equal(reductions.dot(ia, ib, iacc, dt.int8, dt.int32), expected)



@pytest.mark.parametrize("k", [64, 1000])
def test_float32_dot_is_rounded_once_whatever_the_orientation(k):
    # A float32 product and the same product computed transposed (as attention's backward recomputes Q K^T
    # as K Q^T) agree bitwise and equal the float64 product rounded once: the BLAS's float32 kernels add the
    # products in an order that depends on the CPU and the layout, which made the recomputed logits differ
    # from the forward's in their last bits (tests/test_review_session16_numerics.py, defect 1).
    rng = np.random.default_rng(k)
    a = (rng.standard_normal((16, k)) * 20).astype(np.float32)
    b = (rng.standard_normal((k, 40)) * 20).astype(np.float32)
    zeros = np.zeros((16, 40), np.float32)
    product = reductions.dot(a, b, zeros, dt.float32, dt.float32)
    transposed = reductions.dot(np.ascontiguousarray(b.T), np.ascontiguousarray(a.T), zeros.T, dt.float32, dt.float32)
    np.testing.assert_array_equal(product, transposed.T)
    np.testing.assert_array_equal(product, (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float32))

# -- fma: one rounding of the exact a * b + c, against rationals -------------------------------------------
# Each 16-bit and float32 type as (bits dtype, bits per step of the significand's last place, a rounding of
# float32 values to it): bfloat16 values are float32s whose low 16 bits are zero.
_FMA_TYPES = {"float16": (np.uint16, 1, lambda v: v.astype(np.float16)),
              "bfloat16": (np.uint32, 1 << 16, lambda v: conversions.round_to_bfloat16(v.astype(np.float32))),
              "float32": (np.uint32, 1, lambda v: v.astype(np.float32))}


def _rounded_once(exact: Fraction, approx: np.ndarray, name: str) -> float:
    """The value of type `name` nearest `exact`, ties to an even last place: among `approx` (one value of
    the type within a place of it) and its two neighbours."""
    bits_dtype, step, _ = _FMA_TYPES[name]
    bits = int(np.asarray(approx).reshape(1).view(bits_dtype)[0])
    candidates = []
    for offset in (-step, 0, step):
        pattern = np.array([(bits + offset) % (1 << (8 * np.dtype(bits_dtype).itemsize))], dtype=bits_dtype)
        value = float(pattern.view(approx.dtype)[0])
        if math.isfinite(value):
            candidates.append((abs(Fraction(value) - exact), (int(pattern[0]) // step) % 2, value))
    return min(candidates)[2]


@pytest.mark.parametrize("name", sorted(_FMA_TYPES))
@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(data=st.data())
def test_fma_rounds_the_exact_sum_once(name, data):
    # a * b often exactly halfway between two values of the type (a's significand odd, b = 1.5, 1.25 or
    # 1.75), and c far below it (where a * b + c through float64 rounds twice), or cancelling most of it
    significand = {"float16": 11, "bfloat16": 8, "float32": 24}[name]
    to_type = lambda v: float(_FMA_TYPES[name][2](np.array([v]))[0])
    a = (data.draw(st.integers(1 << (significand - 1), (1 << significand) - 1)) | 1) * 2.0 ** (1 - significand)
    a *= data.draw(st.sampled_from([1.0, -1.0])) * 2.0 ** data.draw(st.integers(-8, 6))
    b = data.draw(st.sampled_from([1.5, 1.25, 1.75, -1.5]))
    tiny = 2.0 ** (-24 if name == "float16" else data.draw(st.integers(-120, -40)))
    c = data.draw(st.sampled_from([tiny, -tiny, to_type(-a * b) + to_type(a * 2.0 ** -30)]))
    result = arithmetic.fma(np.array([a]), np.array([b]), np.array([c]), getattr(dt, name))
    exact = Fraction(a) * Fraction(b) + Fraction(c)
    assert float(result[0]) == _rounded_once(exact, result, name), (a, b, c)
