"""Session-38 review of the kernel language's scalar / elementwise numerics: integer division, modulo and shifts of
negative values and by out-of-range amounts, signed / unsigned promotion with literals, casts (float -> int of
NaN / inf / out of range, int -> float16 / bfloat16, float32 -> bfloat16 / float16 rounding and overflow),
bitcasts, `where` over mixed dtypes, minimum / maximum / clamp with NaN and signed zeros, fma, the math functions
at special values, abs of INT_MIN, floor / ceil, cdiv, and integer reductions / cumsum of every integer type.
Each case runs in the interpreter against a reference of the documented rule (language/numerics/__init__.py,
promotion.py, README) or torch, and where the host can run it (no 16-bit floats, no libdevice) also compiled for
sm_90a and run on the host (tests/host_jit.py through test_review_session35_dsl._run_compiled), bit for bit
against the interpreter.

Peer reports -> cases tried:
- triton #619 / #954 / #4676, FlagGems #204 (`//` truncation, cdiv of negatives, x // 0 and x % 0 together) ->
  int8 / uint16 / int64 division, modulo and cdiv against C's rules with the documented x // 0 = -1, x % 0 = x,
  MIN // -1 = MIN: right.
- "triton shift overflow" (LLVM poison for amounts >= the width) -> shifts of every sign by -1, the width, 255:
  right (0, or the sign fill for `>>` of signed types, compiled too).
- triton #10658 / #10692 (float -> int of NaN / inf / out of range differs between JIT and interpreter) ->
  float16 / bfloat16 / float32 / float64 to every integer type: saturating, NaN -> 0, compiled = interpreted: right.
- "triton bf16 rounding", tl.cast fp_downcast_rounding -> float32 -> bfloat16 / float16 on ties, overflow and NaN,
  int32 / int64 / uint64 -> float16 / bfloat16 against an exact round-to-nearest-even: right (tests/test_numerics.py
  checks the rule functions; this checks the kernels' casts).
- triton #2776 / #9840 (tl.maximum / tl.max NaN) -> minimum / maximum / clamp / Python max with NaN and +-0.0:
  NaN propagates, -0.0 < +0.0, as documented: right.
- triton #11153 (interpreter and compiled disagree; an fma kernel) -> fma rounding once, compiled and interpreted.
- triton #4613 / #4697 / #5466 (literal and scalar promotion) -> comparisons of uint32 / int8 / uint8 / int64 with
  literals that do not fit, int8 vs uint8, a float literal held in a variable; `where` of int8 / uint8 / float16
  / bfloat16 blocks with literals and scalars: as promotion.py documents.
- triton #10298 / #1813 style reductions over int1 / int8 / uint16 / uint32 / int64 (sums accumulate in 32 bits,
  max / min / argmin / reverse cumsum): right, compiled too.
- exp / log / sqrt / rsqrt / erf / tanh / sin / floor / ceil / sigmoid / abs at 0, -0, +-inf, NaN, subnormals and
  the overflow edges in float16 / bfloat16 / float32 / float64: within a few ulp of float64 torch, signs of zeros
  kept (float32 sigmoid below -88.7 is 0, as torch's own float32 sigmoid).

DEFECTS found (fixed in fusedops/dsl/language/: semantics.py, shape_ops.py, block_ops.py, descriptors.py):
1. A float literal converted to an integer type was rounded to float32 first (a lone float literal's type), so
   `dsl.full((B,), 123456789.0, dsl.int32)` filled 123456792, `dsl.store(int64_ptr, 2.0**40 + 1.0)` wrote 2**40,
   `other=123456789.0`, `dsl.cast(16777217.0, dsl.int32)`, `n: dsl.int32 = ...`, `dsl.atomic_add(int_ptr, ...)` and
   a descriptor store likewise, and `dsl.full((B,), 1e-50, dsl.int1)` was False; torch.full / setitem and Python's
   int() give the literal's own value (True). `Semantics.cast` now converts a float literal to an integer type from
   its float64 value (folded to a constant: no float64 reaches the PTX); full / store / other / atomics / descriptor
   stores go through it. tests/test_review_session37_dsl.py's specialization test observed 1.0 vs 1 through this
   rounding; it now observes it through the documented promotion (int64 + float literal is float32).
2. `dsl.full(shape, v, int dtype)` wrapped an int literal past 64 bits silently (2**64 -> 0, 10**30 -> 1073741824
   in int32), where every other use of such a literal is a CompilationError; it now is one too (literals within
   64 bits still wrap as `.to()` converts them: 300 -> 44 in int8). make_tensor_descriptor wrapped a literal size /
   stride past int64 the same way (2**63 -> -2**63); now a CompilationError naming it.

Noted, not changed (documented behaviour): equal-width signed / unsigned operands promote to the unsigned type at
every width (int8 -1 < uint8 5 is False; C would promote both to int first, torch to int16), as Triton does; an int64
compared with a literal in [2**63, 2**64) compares as uint64 (C's rule); dsl.cdiv is documented for positive
divisors only (runtime cdiv(7, -2) is -2, the constexpr one -3).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import fusedops.dsl as dsl
from fusedops.dsl import CompilationError
from fusedops.dsl.target import assemble, ptxas_available
from kernel_source import jit_from_source
from test_review_session35_dsl import _run_compiled, _same_bits

NAN, INF = float("nan"), float("inf")


@pytest.fixture(autouse=True)
def _own_cache(monkeypatch, tmp_path_factory):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "s38_numerics_cache"))


def _wrap(value: int, bits: int, signed: bool) -> int:
    value &= (1 << bits) - 1
    return value - (1 << bits) if signed and value >= 1 << (bits - 1) else value


# == defect 1: a float literal converted to an integer type converts from its exact value ==========================
@dsl.jit
def _float_literal_to_int_kernel(o_ptr, w_ptr, b_ptr, B: dsl.constexpr):
    offs = dsl.arange(0, B)
    dsl.store(o_ptr + offs, dsl.full((B,), 123456789.0, dsl.int32))
    dsl.store(o_ptr + B + offs, dsl.load(o_ptr + B + offs, mask=offs < 0, other=-2147483521.0))
    dsl.store(o_ptr + 2 * B + offs, 16777217.0)
    dsl.store(o_ptr + 3 * B + offs, dsl.cast(-16777219.0, dsl.int32) + offs * 0)
    n: dsl.int32 = 2147483000.75
    dsl.store(o_ptr + 4 * B + offs, n + offs * 0)
    dsl.store(o_ptr + 5 * B + offs, dsl.full((B,), 3e9, dsl.int32))          # saturates, as .to() does
    dsl.store(w_ptr + offs, 2.0 ** 40 + 1.0)
    dsl.store(w_ptr + B + offs, dsl.full((B,), -1e300, dsl.int64))
    dsl.store(b_ptr + offs, dsl.full((B,), 1e-50, dsl.int1))
    dsl.store(b_ptr + B + offs, dsl.full((B,), NAN, dsl.int1))


def test_defect_float_literals_convert_to_integers_from_their_exact_value():
    B = 4
    out = torch.full((6 * B,), -7, dtype=torch.int32)
    wide = torch.full((2 * B,), -7, dtype=torch.int64)
    flags = torch.zeros(2 * B, dtype=torch.bool)
    _float_literal_to_int_kernel[(1,)](out, wide, flags, B=B, interpret=True)
    expected = [123456789, -2147483521, 16777217, -16777219, 2147483000, 2**31 - 1]
    assert out.view(6, B).tolist() == [[v] * B for v in expected]
    assert wide.tolist() == [2**40 + 1] * B + [-2**63] * B
    assert flags.tolist() == [True] * (2 * B)
    # torch.full, setitem and Python agree
    assert torch.full((1,), 123456789.0, dtype=torch.int32).item() == 123456789 == int(123456789.0)
    assert torch.full((1,), 1e-50, dtype=torch.bool).item()
    compiled = (torch.full_like(out, -7), torch.full_like(wide, -7), torch.zeros_like(flags))
    _run_compiled(_float_literal_to_int_kernel, compiled, num_warps=1, B=B)
    assert torch.equal(compiled[0], out) and torch.equal(compiled[1], wide) and torch.equal(compiled[2], flags)
    ptx = _float_literal_to_int_kernel.compile(out, wide, flags, B=B, target="sm_90a").asm["ptx"]
    assert ".f64" not in ptx        # the conversions fold to constants
    if ptxas_available():
        assemble(ptx, "sm_90a")


@dsl.jit
def _float_literal_atomic_and_descriptor_kernel(o_ptr, d_ptr, B: dsl.constexpr):
    offs = dsl.arange(0, B)
    dsl.atomic_add(o_ptr + offs, 123456789.0)
    dsl.atomic_xchg(o_ptr + B + offs, -16777217.0)
    desc = dsl.make_tensor_descriptor(d_ptr, (B, B), (B, 1), (B, B))
    desc.store((0, 0), 123456789.0)


def test_defect_float_literals_in_atomics_and_descriptor_stores():
    out = torch.zeros(8, dtype=torch.int32)
    box = torch.zeros(4, 4, dtype=torch.int32)
    _float_literal_atomic_and_descriptor_kernel[(1,)](out, box, B=4, interpret=True)
    assert out.tolist() == [123456789] * 4 + [-16777217] * 4
    assert box.eq(123456789).all()


# == defect 2: an int literal past 64 bits in dsl.full / a descriptor is an error, not wrapped =====================
@pytest.mark.parametrize("body, message", [
    ("dsl.store(o_ptr + offs, dsl.full((B,), 2**64, dsl.int64))", "does not fit in 64 bits"),
    ("dsl.store(o_ptr + offs, dsl.full((B,), -2**64 - 5, dsl.int64))", "does not fit in 64 bits"),
    ("dsl.store(o_ptr + offs, dsl.full((B,), 10**30, dsl.int32))", "does not fit in 64 bits"),
    ("d = dsl.make_tensor_descriptor(o_ptr, (2**63, B), (B, 1), (B, B))\n    d.store((0, 0), 1)",
     "each size 9223372036854775808 does not fit in int64"),
    ("d = dsl.make_tensor_descriptor(o_ptr, (B, B), (2**64, 1), (B, B))\n    d.store((0, 0), 1)",
     "each stride 18446744073709551616 does not fit in int64"),
])
def test_defect_int_literals_past_64_bits_are_compilation_errors(body, message):
    kernel = jit_from_source(f"def k(o_ptr, B: dsl.constexpr):\n    offs = dsl.arange(0, B)\n    {body}\n",
                             f"<s38 wide literal {abs(hash(body))}>")
    with pytest.raises(CompilationError, match=message):
        kernel[(1,)](torch.zeros(16, dtype=torch.int64), B=4, interpret=True)


@dsl.jit
def _full_wraps_kernel(o_ptr, B: dsl.constexpr):
    offs = dsl.arange(0, B)
    dsl.store(o_ptr + offs, dsl.full((B,), 300, dsl.int8).to(dsl.int64))
    dsl.store(o_ptr + B + offs, dsl.full((B,), 2**63, dsl.int64))
    dsl.store(o_ptr + 2 * B + offs, dsl.full((B,), -1, dsl.uint8).to(dsl.int64))
    dsl.store(o_ptr + 3 * B + offs, dsl.full((B,), 2**64 - 1, dsl.uint64).to(dsl.int64))
    dsl.store(o_ptr + 4 * B + offs, dsl.full((B,), 2, dsl.int1).to(dsl.int64))


def test_full_of_literals_within_64_bits_converts_as_a_cast():
    out = torch.full((5 * 2,), 99, dtype=torch.int64)
    _full_wraps_kernel[(1,)](out, B=2, interpret=True)
    assert out.view(5, 2)[:, 0].tolist() == [44, -2**63, 255, -1, 1]
    compiled = torch.full_like(out, 99)
    _run_compiled(_full_wraps_kernel, (compiled,), num_warps=1, B=2)
    assert torch.equal(compiled, out)


# == integer division, modulo, shifts and cdiv (triton #619, #954, #4676; shift overflow) ==========================
@dsl.jit
def _int_rules_kernel(o_ptr, x_ptr, y_ptr, B: dsl.constexpr):
    offs = dsl.arange(0, B)
    x = dsl.load(x_ptr + offs)
    y = dsl.load(y_ptr + offs)
    dsl.store(o_ptr + offs, (x // y).to(dsl.int64))
    dsl.store(o_ptr + B + offs, (x % y).to(dsl.int64))
    dsl.store(o_ptr + 2 * B + offs, (x << y).to(dsl.int64))
    dsl.store(o_ptr + 3 * B + offs, (x >> y).to(dsl.int64))
    dsl.store(o_ptr + 4 * B + offs, dsl.cdiv(x, 3).to(dsl.int64))
    dsl.store(o_ptr + 5 * B + offs, dsl.abs(x).to(dsl.int64))
    dsl.store(o_ptr + 6 * B + offs, (-x).to(dsl.int64))


def _c_rules(a: int, b: int, bits: int, signed: bool):
    """(a // b, a % b, a << b, a >> b, cdiv(a, 3), |a|, -a) by the documented integer rules."""
    low = -(1 << (bits - 1)) if signed else 0
    if b == 0:
        quotient, remainder = (-1 if signed else (1 << bits) - 1), a
    elif signed and b == -1:
        quotient, remainder = _wrap(-a, bits, signed), 0
    else:
        quotient = abs(a) // abs(b) * (1 if (a < 0) == (b < 0) else -1)
        remainder = a - quotient * b
    amount = b % (1 << bits)            # negative amounts count as huge
    left = 0 if amount >= bits else _wrap(a << amount, bits, signed)
    right = ((-1 if a < 0 else 0) if amount >= bits else a >> amount)
    cdiv = abs(a) // 3 * (1 if a >= 0 else -1) + (1 if a > 0 and a % 3 else 0)
    return (quotient, remainder, left, right, cdiv, _wrap(abs(a), bits, signed) if a != low or not signed else low,
            _wrap(-a, bits, signed))


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint16, torch.int64], ids=str)
def test_integer_division_modulo_shifts_and_cdiv_follow_the_documented_rules(dtype, seed):
    bits = dtype.itemsize * 8
    signed = dtype.is_signed
    low, high = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    rng = np.random.default_rng(seed)
    edges = [low, high, 0, 1, 7, -7, -1, 3, -3, bits - 1, bits, bits + 1, 255, -128, low + 1]
    xs = [v for v in edges if low <= v <= high]
    ys = [v for v in [0, -1, 1, 2, -2, 3, -3, bits - 1, bits, bits + 1, -bits, 255, low, high] if low <= v <= high]
    pairs = [(a, b) for a in xs for b in ys]
    pairs += [(int(a), int(b)) for a, b in zip(rng.integers(low, high, 64, endpoint=True, dtype=np.int64
                                                            if high < 2**63 else np.uint64),
                                                rng.integers(-bits - 2, bits + 2, 64)) if low <= b <= high]
    n = 1 << (len(pairs) - 1).bit_length()
    pairs = (pairs * n)[:n]
    x = torch.tensor([a for a, _ in pairs], dtype=torch.int64).to(dtype)
    y = torch.tensor([b for _, b in pairs], dtype=torch.int64).to(dtype)
    out = torch.full((7 * n,), -12345, dtype=torch.int64)
    _int_rules_kernel[(1,)](out, x, y, B=n, interpret=True)
    got = out.view(7, n).t().tolist()
    for (a, b), row in zip(pairs, got):
        expected = [_wrap(v, 64, True) if not signed and bits == 64 else v for v in _c_rules(a, b, bits, signed)]
        assert row == expected, (a, b, row, expected)
    compiled = torch.full_like(out, -12345)
    _run_compiled(_int_rules_kernel, (compiled, x, y), B=n)
    assert torch.equal(compiled, out)


# == comparisons and literal promotion (triton #4613; the documented C rules) ======================================
@dsl.jit
def _compare_kernel(o_ptr, i32_ptr, i8_ptr, u8_ptr, B: dsl.constexpr):
    offs = dsl.arange(0, B)
    i32 = dsl.load(i32_ptr + offs)
    i8 = dsl.load(i8_ptr + offs)
    u8 = dsl.load(u8_ptr + offs)
    u32 = i32.to(dsl.uint32)
    i64 = i32.to(dsl.int64)
    dsl.store(o_ptr + offs, u32 > -1)                 # -1 -> uint32 max: never true (C)
    dsl.store(o_ptr + B + offs, i32 < 2**31)           # int64 literal: always true
    dsl.store(o_ptr + 2 * B + offs, i8 < 200)          # int32 literal: always true
    dsl.store(o_ptr + 3 * B + offs, u8 > -1)           # int32: always true
    dsl.store(o_ptr + 4 * B + offs, i64 < 2**63)       # uint64 literal: compared as uint64 (C)
    dsl.store(o_ptr + 5 * B + offs, i8 < u8)           # equal widths: the unsigned type
    dsl.store(o_ptr + 6 * B + offs, u32 < i64 + 2**32)  # uint32 with int64: int64
    dsl.store(o_ptr + 7 * B + offs, (i8 & 0xFF) == u8.to(dsl.int32))   # 0xFF: int32, sign-extended i8


def test_comparisons_with_literals_and_mixed_signedness_promote_as_documented():
    n = 8
    i32 = torch.tensor([0, 1, -1, 2**31 - 1, -2**31, 200, -200, 7], dtype=torch.int32)
    i8 = torch.tensor([0, 1, -1, 127, -128, 100, -100, 7], dtype=torch.int8)
    u8 = torch.tensor([0, 2, 5, 255, 128, 99, 156, 7], dtype=torch.uint8)
    out = torch.zeros(8 * n, dtype=torch.bool)
    _compare_kernel[(1,)](out, i32, i8, u8, B=n, interpret=True)
    rows = out.view(8, n).tolist()
    assert rows[0] == [False] * n
    assert rows[1] == [True] * n and rows[2] == [True] * n and rows[3] == [True] * n
    assert rows[4] == [v % 2**64 < 2**63 for v in i32.tolist()]
    assert rows[5] == [a % 256 < b for a, b in zip(i8.tolist(), u8.tolist())]
    assert rows[6] == [a % 2**32 < b + 2**32 for a, b in zip(i32.tolist(), i32.tolist())]
    assert rows[7] == [(a & 0xFF) == b for a, b in zip(i8.tolist(), u8.tolist())]
    compiled = torch.zeros_like(out)
    _run_compiled(_compare_kernel, (compiled, i32, i8, u8), num_warps=1, B=n)
    assert torch.equal(compiled, out)


def test_a_float_literal_held_in_a_variable_stays_weakly_typed():
    # triton #5466: `s = 1.44269504; x + s` must equal `x + 1.44269504` for float64 x
    kernel = jit_from_source(
        "def k(o_ptr, x_ptr):\n    x = dsl.load(x_ptr)\n    s = 1.44269504\n"
        "    dsl.store(o_ptr, x + s)\n    dsl.store(o_ptr + 1, x + 1.44269504)\n", "<s38 weak variable>")
    x = torch.tensor([0.1], dtype=torch.float64)
    out = torch.zeros(2, dtype=torch.float64)
    kernel[(1,)](out, x, interpret=True)
    assert out.tolist() == [0.1 + 1.44269504] * 2


# == float -> int casts: truncating, saturating, NaN -> 0 (triton #10658 / #10692) ================================
_INT_TARGETS = [(dsl.int8, torch.int8), (dsl.uint8, torch.uint8), (dsl.int16, torch.int16), (dsl.uint16, torch.uint16),
                (dsl.int32, torch.int32), (dsl.uint32, torch.uint32), (dsl.int64, torch.int64),
                (dsl.uint64, torch.uint64)]


@dsl.jit
def _float_to_int_kernel(o8, ou8, o16, ou16, o32, ou32, o64, ou64, x_ptr, B: dsl.constexpr):
    offs = dsl.arange(0, B)
    x = dsl.load(x_ptr + offs)
    dsl.store(o8 + offs, x.to(dsl.int8))
    dsl.store(ou8 + offs, x.to(dsl.uint8))
    dsl.store(o16 + offs, x.to(dsl.int16))
    dsl.store(ou16 + offs, x.to(dsl.uint16))
    dsl.store(o32 + offs, x.to(dsl.int32))
    dsl.store(ou32 + offs, x.to(dsl.uint32))
    dsl.store(o64 + offs, x.to(dsl.int64))
    dsl.store(ou64 + offs, x.to(dsl.uint64))


def _saturated(value: float, bits: int, signed: bool) -> int:
    low, high = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    if math.isnan(value):
        return 0
    if math.isinf(value):
        return high if value > 0 else low
    return min(max(math.trunc(value), low), high)


@pytest.mark.parametrize("source", [torch.float16, torch.bfloat16, torch.float32, torch.float64], ids=str)
def test_float_to_int_casts_truncate_saturate_and_send_nan_to_zero(source):
    values = [NAN, INF, -INF, 0.0, -0.0, 0.99, -0.99, 127.5, 128.0, -128.9, -129.0, 255.5, 256.0, 510.0, -200.0,
              32767.0, 32768.0, 65504.0, -65504.0, 2.0**31, -2.0**31 - 4096, 2.0**32, 2.0**63, -2.0**63, 2.0**64,
              1e30, -1e30, 3.4e38, 1e300, -1e300, 0.5, 65535.0]
    x = torch.tensor(values, dtype=torch.float64).to(source)     # (rounded / overflowed to the source type)
    outs = [torch.full((32,), 99, dtype=t) for _, t in _INT_TARGETS]
    _float_to_int_kernel[(1,)](*outs, x, B=32, interpret=True)
    for (target, torch_type), out in zip(_INT_TARGETS, outs):
        bits = torch_type.itemsize * 8
        expected = [_saturated(v, bits, torch_type.is_signed) for v in x.double().tolist()]
        got = out.tolist() if torch_type != torch.uint64 else [v % 2**64 for v in out.view(torch.int64).tolist()]
        assert got == expected, (target, list(zip(x.tolist(), got, expected)))
    if source in (torch.float32, torch.float64):
        compiled = [torch.full_like(o, 99) for o in outs]
        _run_compiled(_float_to_int_kernel, (*compiled, x), B=32)
        assert all(torch.equal(a.view(torch.int8), b.view(torch.int8)) for a, b in zip(compiled, outs))


# == narrowing float casts, int -> 16-bit floats, bitcasts ========================================================
@dsl.jit
def _narrowing_kernel(bf_ptr, h_ptr, hb_ptr, bits_ptr, hbits_ptr, x_ptr, B: dsl.constexpr):
    offs = dsl.arange(0, B)
    x = dsl.load(x_ptr + offs)
    bf = x.to(dsl.bfloat16)
    dsl.store(bf_ptr + offs, bf)
    dsl.store(h_ptr + offs, x.to(dsl.float16))
    dsl.store(hb_ptr + offs, x.to(dsl.float16).to(dsl.bfloat16))
    dsl.store(bits_ptr + offs, bf.to(dsl.int16, bitcast=True))
    dsl.store(hbits_ptr + offs, x.to(dsl.uint32, bitcast=True))


def test_float32_to_bfloat16_and_float16_round_to_nearest_even_like_torch(seed):
    rng = np.random.default_rng(seed)
    bits = rng.integers(0, 2**32, 192, dtype=np.uint64).astype(np.uint32)
    bits = np.concatenate([bits, np.array([0x3F808000, 0x3F818000, 0x3F80C000, 0x7F7FFFFF, 0xFF7FFFFF, 0x7F7F8000,
                                           0x00008000, 0x80018000, 0x7F800000, 0xFF800000, 0x477FE000, 0x477FEFFF,
                                           0x477FF000, 0x33000000, 0x33000001, 0xB3800000], dtype=np.uint32)])
    bits = np.concatenate([bits, np.zeros(256 - bits.size, dtype=np.uint32)])
    x = torch.from_numpy(bits.view(np.float32).copy())
    x[~torch.isfinite(x) & ~torch.isinf(x)] = 1.5      # NaN: checked below
    x[-1] = NAN
    n = x.numel()
    bf, h, hb = torch.zeros(n, dtype=torch.bfloat16), torch.zeros(n, dtype=torch.float16), torch.zeros(n, dtype=torch.bfloat16)
    b16, b32 = torch.zeros(n, dtype=torch.int16), torch.zeros(n, dtype=torch.int64).to(torch.uint32)
    _narrowing_kernel[(1,)](bf, h, hb, b16, b32, x, B=n, interpret=True)
    assert _same_bits(bf, x.to(torch.bfloat16)) and _same_bits(h, x.to(torch.float16))
    assert _same_bits(hb, x.to(torch.float16).to(torch.bfloat16))
    assert torch.equal(b16[:-1], x.to(torch.bfloat16).view(torch.int16)[:-1]) and torch.isnan(bf[-1])
    assert torch.equal(b32[:-1].view(torch.int32), x[:-1].view(torch.int32))
    assert h[x.abs() >= 65520].isinf().all() and h[(x.abs() < 65520) & (x.abs() > 65504)].abs().eq(65504).all()


@dsl.jit
def _int_to_half_kernel(h_ptr, b_ptr, x_ptr, B: dsl.constexpr):
    offs = dsl.arange(0, B)
    x = dsl.load(x_ptr + offs)
    dsl.store(h_ptr + offs, x.to(dsl.float16))
    dsl.store(b_ptr + offs, x.to(dsl.bfloat16))


def _round_int(value: int, significand: int, max_exponent: int) -> float:
    """`value` rounded to nearest even with `significand` bits; past 2**(max_exponent + 1): inf."""
    magnitude = abs(value)
    extra = max(magnitude.bit_length() - significand, 0)
    quotient, remainder = divmod(magnitude, 1 << extra) if extra else (magnitude, 0)
    half = 1 << (extra - 1) if extra else 1
    if extra and (remainder > half or (remainder == half and quotient & 1)):
        quotient += 1
    rounded = quotient << extra
    if rounded >= 1 << (max_exponent + 1):
        return math.copysign(INF, value)
    return math.copysign(float(rounded), value) if value else 0.0


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint64], ids=str)
def test_integers_to_float16_and_bfloat16_round_once_to_nearest_even(dtype, seed):
    bits = dtype.itemsize * 8
    signed = dtype.is_signed
    rng = np.random.default_rng(seed)
    values = [0, 1, 2049, 2051, 65504, 65519, 65520, 65535, 257, 259, (1 << 24) + 1]
    values += [(1 << k) + (1 << (k - 8)) + c for k in range(9, bits - 1, 5) for c in (0, 1)]
    values += [int(v) >> int(s) for v, s in zip(rng.integers(0, 2**62, 48), rng.integers(0, 60, 48))]
    values += [-v for v in values] if signed else [(1 << bits) - 1, 1 << (bits - 1)]
    values += [-(1 << (bits - 1)), (1 << (bits - 1)) - 1]
    values = [v for v in values if (-(1 << (bits - 1)) if signed else 0) <= v < (1 << bits if not signed else 1 << (bits - 1))]
    n = 1 << (len(values) - 1).bit_length()
    values = (values * n)[:n]
    x = torch.tensor([v if v < 2**63 else v - 2**64 for v in values], dtype=torch.int64)
    x = x.view(dtype) if dtype == torch.uint64 else x.to(dtype)
    h, b = torch.zeros(n, dtype=torch.float16), torch.zeros(n, dtype=torch.bfloat16)
    _int_to_half_kernel[(1,)](h, b, x, B=n, interpret=True)
    assert h.tolist() == [_round_int(v, 11, 15) for v in values]
    assert b.tolist() == [_round_int(v, 8, 127) for v in values]


# == where over mixed scalar / block dtypes =======================================================================
@dsl.jit
def _where_kernel(o_ptr, i8_ptr, u8_ptr, h_ptr, bf_ptr, i32_ptr, B: dsl.constexpr):
    offs = dsl.arange(0, B)
    c = (offs % 2) == 0
    i8 = dsl.load(i8_ptr + offs)
    u8 = dsl.load(u8_ptr + offs)
    h = dsl.load(h_ptr + offs)
    bf = dsl.load(bf_ptr + offs)
    s = dsl.load(i32_ptr)                        # a runtime scalar
    dsl.store(o_ptr + offs, dsl.where(c, i8, 1000).to(dsl.float64))            # int32: 1000 stays
    dsl.store(o_ptr + B + offs, dsl.where(c, u8, -1).to(dsl.float64))          # int32: -1 stays
    dsl.store(o_ptr + 2 * B + offs, dsl.where(s > 0, u8, i8).to(dsl.float64))  # uint8: i8 wraps (C)
    dsl.store(o_ptr + 3 * B + offs, dsl.where(c, h, bf).to(dsl.float64))       # float32: both exact
    dsl.store(o_ptr + 4 * B + offs, dsl.where(c, s, 0.5).to(dsl.float64))      # float32 block
    dsl.store(o_ptr + 5 * B + offs, dsl.where(c, h, 1e5).to(dsl.float64))      # float16: the literal is inf
    dsl.store(o_ptr + 6 * B + offs, dsl.where(c, True, i8 > 0).to(dsl.float64))


def test_where_with_mixed_scalar_and_block_dtypes_promotes_as_documented():
    n = 4
    i8 = torch.tensor([-5, 100, -128, 127], dtype=torch.int8)
    u8 = torch.tensor([200, 3, 255, 0], dtype=torch.uint8)
    h = torch.tensor([0.1, 65504.0, -2.5, NAN], dtype=torch.float16)
    bf = torch.tensor([3e38, 0.1, -1e-38, 7.0], dtype=torch.bfloat16)
    s = torch.tensor([16777217], dtype=torch.int32)
    out = torch.full((7 * n,), -1.0, dtype=torch.float64)
    _where_kernel[(1,)](out, i8, u8, h, bf, s, B=n, interpret=True)
    rows = out.view(7, n).tolist()
    even = [k % 2 == 0 for k in range(n)]
    assert rows[0] == [float(i8[k]) if even[k] else 1000.0 for k in range(n)]
    assert rows[1] == [float(u8[k]) if even[k] else -1.0 for k in range(n)]
    assert rows[2] == [float(v) for v in u8.tolist()]
    assert _same_bits(torch.tensor(rows[3], dtype=torch.float64), torch.where(torch.tensor(even), h.double(), bf.double()))
    assert rows[4] == [16777216.0 if even[k] else 0.5 for k in range(n)]        # float32(16777217)
    assert rows[5] == [float(h[0]), INF, float(h[2]), INF]
    assert rows[6] == [1.0, float(i8[1] > 0), 1.0, float(i8[3] > 0)]


# == minimum / maximum / clamp with NaN and signed zeros, fma (triton #2776, #9840, #11153) =======================
@dsl.jit
def _min_max_kernel(o_ptr, x_ptr, y_ptr, B: dsl.constexpr):
    offs = dsl.arange(0, B)
    x = dsl.load(x_ptr + offs)
    y = dsl.load(y_ptr + offs)
    dsl.store(o_ptr + offs, dsl.minimum(x, y))
    dsl.store(o_ptr + B + offs, dsl.maximum(x, y))
    dsl.store(o_ptr + 2 * B + offs, dsl.clamp(x, -1.0, y))
    dsl.store(o_ptr + 3 * B + offs, max(x, 0.0, y))
    dsl.store(o_ptr + 4 * B + offs, dsl.fma(x, y, -1.0))
    dsl.store(o_ptr + 5 * B + offs, dsl.floor(x) + dsl.ceil(y) * 0.0)
    dsl.store(o_ptr + 6 * B + offs, dsl.ceil(x))


def _ieee_minimum(a, b):
    """torch.minimum (NaN propagates) with -0.0 below +0.0, as documented (IEEE 754-2019 minimum); torch's CPU op
    returns either zero."""
    zeros = (a == 0) & (b == 0)
    return torch.where(zeros, torch.where(torch.signbit(a) | torch.signbit(b), -0.0, 0.0), torch.minimum(a, b))


def _ieee_maximum(a, b):
    zeros = (a == 0) & (b == 0)
    return torch.where(zeros, torch.where(torch.signbit(a) & torch.signbit(b), -0.0, 0.0), torch.maximum(a, b))


def test_minimum_maximum_clamp_propagate_nan_order_zeros_and_fma_rounds_once():
    one_up, one_down = 1.0 + 2.0**-23, 1.0 - 2.0**-23
    x = torch.tensor([NAN, 1.0, -0.0, 0.0, -0.0, INF, -INF, 2.0, -0.5, one_up, -3.0, 0.4], dtype=torch.float32)
    y = torch.tensor([1.0, NAN, 0.0, -0.0, -0.0, NAN, 5.0, -2.0, 3.0, one_down, -5.0, -0.0], dtype=torch.float32)
    x = torch.cat([x, x[:4]])
    y = torch.cat([y, y[:4]])
    n = x.numel()
    out = torch.full((7 * n,), 99.0)
    _min_max_kernel[(1,)](out, x, y, B=n, interpret=True)
    rows = out.view(7, n)
    assert _same_bits(rows[0], _ieee_minimum(x, y)) and _same_bits(rows[1], _ieee_maximum(x, y))
    assert _same_bits(rows[2], _ieee_minimum(_ieee_maximum(x, torch.full_like(x, -1.0)), y))
    assert _same_bits(rows[3], _ieee_maximum(_ieee_maximum(x, torch.zeros_like(x)), y))
    exact = torch.tensor([float(a) * float(b) - 1.0 for a, b in zip(x.double().tolist(), y.double().tolist())])
    assert _same_bits(rows[4], exact.float())         # a float64 product of float32s is exact: one rounding
    assert rows[4][9].item() == -2.0**-46              # two roundings would give 0
    assert _same_bits(rows[5], torch.floor(x) + torch.ceil(y) * 0.0) and _same_bits(rows[6], torch.ceil(x))
    assert torch.signbit(rows[6][8]) and rows[6][8] == 0     # ceil(-0.5) is -0.0
    compiled = torch.full_like(out, 99.0)
    _run_compiled(_min_max_kernel, (compiled, x, y), B=n)
    assert _same_bits(compiled, out)


# == math at special values ======================================================================================
@dsl.jit
def _math_kernel(o_ptr, x_ptr, B: dsl.constexpr):
    offs = dsl.arange(0, B)
    x = dsl.load(x_ptr + offs)
    dsl.store(o_ptr + offs, dsl.exp(x))
    dsl.store(o_ptr + B + offs, dsl.exp2(x))
    dsl.store(o_ptr + 2 * B + offs, dsl.log(x))
    dsl.store(o_ptr + 3 * B + offs, dsl.log2(x))
    dsl.store(o_ptr + 4 * B + offs, dsl.sqrt(x))
    dsl.store(o_ptr + 5 * B + offs, dsl.rsqrt(x))
    dsl.store(o_ptr + 6 * B + offs, dsl.erf(x))
    dsl.store(o_ptr + 7 * B + offs, dsl.tanh(x))
    dsl.store(o_ptr + 8 * B + offs, dsl.sin(x))
    dsl.store(o_ptr + 9 * B + offs, dsl.sigmoid(x))
    dsl.store(o_ptr + 10 * B + offs, dsl.abs(x))
    dsl.store(o_ptr + 11 * B + offs, dsl.floor(x))


_MATH_REFERENCES = [torch.exp, torch.exp2, torch.log, torch.log2, torch.sqrt, torch.rsqrt, torch.erf, torch.tanh,
                    torch.sin, torch.sigmoid, torch.abs, torch.floor]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64], ids=str)
def test_math_functions_at_special_values_follow_float64(dtype):
    values = [0.0, -0.0, INF, -INF, NAN, -0.5, 0.5, -1.0, 1e-40, -1e-40, 100.0, -100.0, 89.0, -104.0, 128.0, -150.0,
              1e30, -1e30, 3.0, 65504.0, 6e-8, -2.5, 1.0, 20.0, -20.0, 0.1, 1e-5, 88.7, -88.7, 1000.0, 1e-310, 710.0]
    x = torch.tensor(values, dtype=torch.float64).to(dtype)
    n = x.numel()
    out = torch.full((12 * n,), 7.0, dtype=dtype)
    _math_kernel[(1,)](out, x, B=n, interpret=True)
    ulp = {torch.float16: 2**-10, torch.bfloat16: 2**-7, torch.float32: 2**-22, torch.float64: 2**-50}[dtype]
    tiny = torch.finfo(dtype).tiny       # results below it: within a subnormal step (float32 sigmoid gives 0, as torch)
    for reference, got in zip(_MATH_REFERENCES, out.view(12, n)):
        expected = reference(x.double()).to(dtype).double()
        got = got.double()
        assert torch.equal(torch.isnan(got), torch.isnan(expected)), (reference, x, got, expected)
        finite = torch.isfinite(expected)
        assert torch.equal(got[~finite & ~torch.isnan(expected)], expected[~finite & ~torch.isnan(expected)])
        error = (got[finite] - expected[finite]).abs()
        assert (error <= 2 * ulp * expected[finite].abs() + tiny).all(), (reference, x[finite], got[finite])
        zeros = finite & (expected == 0) & (got == 0)
        assert torch.equal(torch.signbit(got[zeros]), torch.signbit(expected[zeros])), reference


# == integer reductions and cumsum over every integer type =======================================================
@dsl.jit
def _int_reductions_kernel(o_ptr, x_ptr, R: dsl.constexpr, C: dsl.constexpr):
    r = dsl.arange(0, R)[:, None]
    c = dsl.arange(0, C)[None, :]
    rows = dsl.arange(0, R)
    x = dsl.load(x_ptr + r * C + c)
    positive = x > 0
    dsl.store(o_ptr + rows, dsl.sum(positive, axis=1))
    dsl.store(o_ptr + R + rows, dsl.sum(x, axis=1).to(dsl.int64))
    dsl.store(o_ptr + 2 * R + rows, dsl.max(x, axis=1).to(dsl.int64))
    dsl.store(o_ptr + 3 * R + rows, dsl.min(x, axis=1).to(dsl.int64))
    dsl.store(o_ptr + 4 * R + rows, dsl.argmin(x, axis=1))
    dsl.store(o_ptr + 5 * R + rows, dsl.argmax(positive, axis=1))
    dsl.store(o_ptr + 6 * R + r * C + c, dsl.cumsum(x, axis=0, reverse=True).to(dsl.int64))
    dsl.store(o_ptr + 6 * R + R * C + r * C + c, dsl.cumsum(positive, axis=1))


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint16, torch.uint32, torch.int64], ids=str)
def test_integer_reductions_and_scans_accumulate_as_documented(dtype, seed):
    R, C = 4, 16
    bits = dtype.itemsize * 8
    signed = dtype.is_signed
    low, high = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(max(low, -2**62), min(high, 2**62), (R, C), generator=g, dtype=torch.int64)
    x[0] = min(high, 2**63 - 1)
    x[1, ::2] = low
    x[2, 3] = x[2, 9] = x[2].min()          # ties: the first index
    x = x.to(dtype)
    wide = x.to(torch.int64)
    n = 6 * R + 2 * R * C
    out = torch.full((n,), -7, dtype=torch.int64)
    _int_reductions_kernel[(1,)](out, x, R=R, C=C, interpret=True)
    accumulate = max(bits, 32)            # int8 / uint16 sums accumulate in (u)int32

    def wrap(v):
        return _wrap(int(v), accumulate, signed or accumulate == 64)

    positive = wide > 0
    expected = (positive.sum(1).tolist() + [wrap(v) for v in wide.sum(1)] + wide.max(1).values.tolist()
                + wide.min(1).values.tolist() + wide.argmin(1).tolist() + positive.int().argmax(1).tolist()
                + [wrap(v) for v in wide.flip(0).cumsum(0).flip(0).flatten()] + positive.long().cumsum(1).flatten().tolist())
    assert out.tolist() == expected
    compiled = torch.full_like(out, -7)
    _run_compiled(_int_reductions_kernel, (compiled, x), R=R, C=C)
    assert torch.equal(compiled, out)
