"""Review session 29: reductions and scans of the kernel language (dsl.sum / max / min / argmax / argmin /
cumsum), probed on the CPU as a demanding Triton user would, from bug reports of peer projects:

- triton-lang/triton#10298 / #10291 (argmax / argmin with NaN: interpreter vs JIT), ml-explore/mlx#4274
  (argmax must point at the first NaN when max propagates it), vllm-project/vllm#50183 (argmax of an
  all-NaN / all -inf masked block must stay in range);
- triton-lang/triton#6927 / #5897 (cumsum of bool computed as xor), pytorch/pytorch#53358 (cumsum of int8
  must not wrap at 8 bits), tensorflow/tensorflow#4593 and triton-lang/triton#4362 (reverse scans);
- triton-lang/triton#429 and #4379 (a sum of a sum, reductions of 3-D blocks twice), #1883 (axis 0 vs 1
  of non-square blocks), #3804 (keep_dims);
- signed zeros, infinities, ties and all-equal rows, unsigned and 64-bit integer extremes, 16-bit float
  accumulation, reductions of broadcast / transposed / reshaped blocks and of dot results, reductions
  in a loop with loop-carried accumulators (online argmax), sibling reductions sharing one exchange
  (the pass's reordered IR run by the interpreter, bit for bit).

The interpreter is compared with NumPy / float64 references built here (the documented semantics:
accumulation dtypes, NaN propagation, -0.0 < +0.0 for max / min, first index on ties, first NaN for
argmax / argmin). A representative subset is compiled for sm_90a with num_warps 1, 4, 8 and assembled
with ptxas (no errors; no spills for the small kernels).

Defect found and fixed (session 29):
- test_sum_of_negative_zeros_is_negative_zero: the interpreter's dsl.sum of a block of -0.0 returned
  +0.0 (NumPy's np.sum starts from a +0.0 identity), while the compiled code adds the elements only
  (no identity: `fadd x0, x1`, then shuffles) and returns -0.0; the interpreter's own cumsum of the same
  block ended in -0.0 (language/numerics/reductions.py `reduce` now keeps the sign).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import fusedops.dsl as dsl
from fusedops.dsl.target import assemble, ptxas_available
from codegen_helpers import exchange_groups, interpret_ir, pipelined_ir

_ACC = {torch.bool: torch.int32, torch.int8: torch.int32, torch.int16: torch.int32, torch.uint8: torch.uint32,
        torch.uint16: torch.uint32, torch.int32: torch.int32, torch.uint32: torch.uint32, torch.int64: torch.int64,
        torch.float16: torch.float32, torch.bfloat16: torch.float32, torch.float32: torch.float32,
        torch.float64: torch.float64}
_DSL = {torch.int32: dsl.int32, torch.uint32: dsl.uint32, torch.int64: dsl.int64, torch.float32: dsl.float32,
        torch.float64: dsl.float64}
_NP_ACC = {torch.int32: np.int32, torch.uint32: np.uint32, torch.int64: np.int64}


def _inputs(shape, dtype, rng):
    """Random values with ties, signed zeros, NaN and +-inf (floats), extremes (ints), one all-equal row."""
    if dtype == torch.bool:
        return torch.from_numpy(rng.random(shape) < 0.5)
    if dtype.is_floating_point:
        x = np.round(rng.standard_normal(shape) * 3) / 2           # many ties; np.round(-0.2) is -0.0
        special = rng.random(shape)
        x[special < 0.04] = np.nan
        x[(special >= 0.04) & (special < 0.07)] = np.inf
        x[(special >= 0.07) & (special < 0.10)] = -np.inf
        x[(special >= 0.10) & (special < 0.15)] = -0.0
        t = torch.from_numpy(x).to(dtype)
    else:
        info = torch.iinfo(dtype)
        wide = rng.integers(info.min, info.max, size=shape, dtype=np.int64, endpoint=True) if info.bits < 64 \
            else rng.integers(-2**63, 2**63 - 1, size=shape, dtype=np.int64)
        small = rng.integers(max(info.min, -3), 4, size=shape)
        x = np.where(rng.random(shape) < 0.5, small, wide)
        x.flat[0], x.flat[-1] = info.max, info.min
        t = torch.from_numpy(x.astype(np.int64)).to(dtype) if info.bits < 64 else torch.from_numpy(x).to(dtype)
    if shape[0] > 1:
        t[-1] = t[-1, :1].clone()                                  # an all-equal row
    return t


def _np(t):
    return t.float().numpy() if t.dtype == torch.bfloat16 else t.numpy()


def _ref_extreme(x, axis, kind):
    """max / min propagating NaN, with -0.0 < +0.0."""
    with np.errstate(invalid="ignore"):
        out = (np.max if kind == "max" else np.min)(x, axis=axis)
    if x.dtype.kind == "f":
        zero, neg = x == 0, np.signbit(x)
        has = np.any(zero & (~neg if kind == "max" else neg), axis=axis)
        out = np.where(out == 0, np.where(has, 0.0, -0.0) if kind == "max" else np.where(has, -0.0, 0.0), out)
        out = np.where(np.any(np.isnan(x), axis=axis), np.nan, out)
    return out


def _ref_arg(x, axis, kind):
    """First NaN, else first extreme (ties and -0.0 == +0.0 give the first index)."""
    x = np.moveaxis(x, axis, -1)
    out = np.empty(x.shape[:-1], dtype=np.int32)
    for index in np.ndindex(*x.shape[:-1]):
        row = x[index]
        nan = np.isnan(row) if row.dtype.kind == "f" else np.zeros(row.shape, bool)
        if nan.any():
            out[index] = np.argmax(nan)
        else:
            out[index] = np.flatnonzero(row == (row.max() if kind == "argmax" else row.min()))[0]
    return out


def _ref_sum(x, axis, dtype, scan=False, reverse=False):
    acc = _ACC[dtype]
    if reverse:
        x = np.flip(x, axis)
    if acc.is_floating_point:
        x = x.astype(np.float64)
        with np.errstate(invalid="ignore"):
            out = (np.cumsum(x, axis=axis) if scan else np.sum(x, axis=axis))
            bound = np.cumsum(np.abs(x), axis=axis) if scan else np.sum(np.abs(x), axis=axis)
    else:
        x = x.astype(np.int64) if x.dtype != np.uint64 else x
        out = (np.cumsum(x, axis=axis) if scan else np.sum(x, axis=axis)).astype(_NP_ACC[acc])   # wraps
        bound = None
    if reverse:
        out = np.flip(out, axis)
        bound = None if bound is None else np.flip(bound, axis)
    return out, bound


def _assert_sum(actual, expected, bound, dtype):
    actual = _np(actual).astype(np.float64) if _ACC[dtype].is_floating_point else _np(actual)
    if bound is None:
        np.testing.assert_array_equal(actual, expected)
        return
    tol = 1e-6 * np.nan_to_num(bound, posinf=0.0) + 1e-12
    finite = np.isfinite(expected)
    assert np.array_equal(np.isnan(actual), np.isnan(expected))
    assert np.array_equal(actual[~finite & ~np.isnan(expected)], expected[~finite & ~np.isnan(expected)])
    assert np.all(np.abs(actual[finite] - expected[finite]) <= tol[finite])


# -- sum / max / min / argmax / argmin of 2-D blocks, along each axis, with and without keep_dims ----

@dsl.jit
def _reduce_all(s_ptr, mx_ptr, mn_ptr, am_ptr, an_ptr, x_ptr, M: dsl.constexpr, N: dsl.constexpr,
                AXIS: dsl.constexpr, KEEP: dsl.constexpr, SUM_DT: dsl.constexpr):
    r = dsl.arange(0, M)[:, None]
    c = dsl.arange(0, N)[None, :]
    x = dsl.load(x_ptr + r * N + c)
    s = dsl.sum(x, axis=AXIS, keep_dims=KEEP)
    mx = x.max(AXIS, KEEP)
    mn = dsl.min(x, AXIS, keep_dims=KEEP)
    am = dsl.argmax(x, axis=AXIS, keep_dims=KEEP)
    an = x.argmin(AXIS, keep_dims=KEEP)
    dsl.static_assert(s.dtype == SUM_DT, "sum dtype")
    dsl.static_assert(am.dtype == dsl.int32, "argmax dtype")
    if AXIS == 0:
        i = c if KEEP else dsl.arange(0, N)
    else:
        i = r if KEEP else dsl.arange(0, M)
    dsl.store(s_ptr + i, s)
    dsl.store(mx_ptr + i, mx)
    dsl.store(mn_ptr + i, mn)
    dsl.store(am_ptr + i, am)
    dsl.store(an_ptr + i, an)


_SHAPES = [(1, 1), (1, 16), (16, 1), (4, 8), (8, 4), (2, 128), (128, 2)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int8,
                                   torch.uint8, torch.int16, torch.int32, torch.uint32, torch.int64, torch.bool])
@pytest.mark.parametrize("shape", _SHAPES + [(128, 256)])
def test_reductions_match_numpy(dtype, shape, seed):
    if shape == (128, 256) and dtype not in (torch.float32, torch.int8, torch.float16):
        pytest.skip("the largest block for three dtypes only (time)")
    rng = np.random.default_rng(seed)
    x = _inputs(shape, dtype, rng)
    xn = _np(x)
    for axis in (0, 1):
        keep = bool(rng.integers(2))
        n = shape[1 - axis]
        outs = [torch.full((n,), 7, dtype=_ACC[dtype]), torch.zeros(n, dtype=dtype), torch.zeros(n, dtype=dtype),
                torch.full((n,), -1, dtype=torch.int32), torch.full((n,), -1, dtype=torch.int32)]
        _reduce_all[(1,)](*outs, x, *shape, axis, keep, _DSL[_ACC[dtype]], interpret=True)
        _assert_sum(outs[0], *_ref_sum(xn, axis, dtype), dtype)
        for out, kind in zip(outs[1:3], ("max", "min")):
            expected = _ref_extreme(xn, axis, kind)
            got = _np(out)
            np.testing.assert_array_equal(got, expected.astype(got.dtype), err_msg=f"{kind} axis {axis}")
            if got.dtype.kind == "f":
                assert np.array_equal(np.signbit(got[got == 0]), np.signbit(expected[expected == 0])), kind
        for out, kind in zip(outs[3:], ("argmax", "argmin")):
            np.testing.assert_array_equal(out.numpy(), _ref_arg(xn, axis, kind), err_msg=f"{kind} axis {axis}")


# -- cumsum ------------------------------------------------------------------------------------------

@dsl.jit
def _cumsum2d(o_ptr, x_ptr, M: dsl.constexpr, N: dsl.constexpr, AXIS: dsl.constexpr, REV: dsl.constexpr,
              ACC_DT: dsl.constexpr):
    offsets = dsl.arange(0, M)[:, None] * N + dsl.arange(0, N)[None, :]
    y = dsl.cumsum(dsl.load(x_ptr + offsets), axis=AXIS, reverse=REV)
    dsl.static_assert(y.dtype == ACC_DT, "cumsum dtype")
    dsl.store(o_ptr + offsets, y)


@pytest.mark.parametrize("dtype", [torch.bool, torch.int8, torch.uint8, torch.int16, torch.int32, torch.uint32,
                                   torch.int64, torch.float16, torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(1, 1), (1, 64), (64, 1), (4, 8), (128, 2), (2, 128), (32, 256)])
def test_cumsum_matches_numpy(dtype, shape, seed):
    rng = np.random.default_rng(seed)
    x = _inputs(shape, dtype, rng)
    for axis, reverse in ((0, False), (1, True), (-1, False), (-2, True)):
        out = torch.full(shape, 5, dtype=_ACC[dtype])
        _cumsum2d[(1,)](out, x, *shape, axis, reverse, _DSL[_ACC[dtype]], interpret=True)
        _assert_sum(out, *_ref_sum(_np(x), axis % 2, dtype, scan=True, reverse=reverse), dtype)


def test_cumsum_of_bool_and_int8_counts_and_does_not_wrap():
    # triton-lang/triton#6927 (bool scans as xor), pytorch/pytorch#53358 (int8 cumsum wraps at 8 bits)
    out = torch.zeros(1, 8, dtype=torch.int32)
    _cumsum2d[(1,)](out, torch.tensor([[True] * 8]), 1, 8, 1, False, dsl.int32, interpret=True)
    assert out.tolist() == [[1, 2, 3, 4, 5, 6, 7, 8]]
    _cumsum2d[(1,)](out, torch.full((1, 8), 120, dtype=torch.int8), 1, 8, 1, True, dsl.int32, interpret=True)
    assert out.tolist() == [[960, 840, 720, 600, 480, 360, 240, 120]]
    out = torch.zeros(1, 8)
    _cumsum2d[(1,)](out, torch.full((1, 8), 2048.0, dtype=torch.float16), 1, 8, 1, False, dsl.float32, interpret=True)
    assert out.tolist() == [[2048.0 * k for k in range(1, 9)]]      # float32 accumulation, not fp16's 2048 + 1


# -- signed zeros, NaN and ties in small hand-made cases -----------------------------------------------

@dsl.jit
def _row(o_ptr, x_ptr, N: dsl.constexpr):
    i = dsl.arange(0, N)
    x = dsl.load(x_ptr + i)
    dsl.store(o_ptr, dsl.sum(x))
    dsl.store(o_ptr + 1, dsl.max(x, 0))
    dsl.store(o_ptr + 2, dsl.min(x))
    dsl.store(o_ptr + 3, dsl.argmax(x, 0).to(dsl.float32))
    dsl.store(o_ptr + 4, dsl.argmin(x, 0).to(dsl.float32))
    dsl.store(o_ptr + 5 + i, dsl.cumsum(x))


def _row_results(values, dtype=torch.float32):
    x = torch.tensor(values, dtype=dtype)
    out = torch.full((5 + len(values),), 9.0, dtype=torch.float32 if dtype != torch.float64 else dtype)
    _row[(1,)](out, x, len(values), interpret=True)
    return out


@pytest.mark.parametrize("values, expected", [
    ([-0.0, 0.0, -0.0, 0.0], [0.0, 0.0, -0.0, 0, 0]),                     # zeros tie for argmax / argmin
    ([1.0, float("nan"), 5.0, float("nan")], [float("nan")] * 3 + [1, 1]),  # first NaN (mlx#4274, triton#10298)
    ([float("-inf")] * 4, [float("-inf")] * 3 + [0, 0]),                  # masked row (vllm#50183): index 0
    ([float("inf"), float("-inf"), float("inf"), 1.0], [float("nan"), float("inf"), float("-inf"), 0, 1]),
    ([2.0, 3.0, 3.0, 2.0], [10.0, 3.0, 2.0, 1, 0]),
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64])
def test_special_values(values, expected, dtype):
    out = _row_results(values, dtype)
    got = out[:5].tolist()
    np.testing.assert_array_equal(np.array(got), np.array(expected, dtype=np.float64))
    assert [np.signbit(v) for v in got[:3] if v == 0] == [np.signbit(v) for v in expected[:3] if v == 0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64])
def test_sum_of_negative_zeros_is_negative_zero(dtype):
    out = _row_results([-0.0] * 4, dtype)
    assert np.signbit(out[5 + 3].item())          # the scan's last element: -0.0 (IEEE -0 + -0 = -0)
    assert np.signbit(out[0].item())              # the sum of the same block must agree


def test_unsigned_and_int64_extremes():
    def run(x, sum_dtype):
        outs = [torch.zeros(1, dtype=_ACC[x.dtype] if x.dtype in _ACC else x.dtype), torch.zeros(1, dtype=x.dtype),
                torch.zeros(1, dtype=x.dtype), torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)]
        _reduce_all[(1,)](*outs, x, 1, x.shape[1], 1, False, sum_dtype, interpret=True)
        return [int(o.numpy()[0]) for o in outs]

    # unsigned order (not the signed bits): 2**64 - 1 is the largest, sums wrap modulo 2**64
    assert run(torch.tensor([[2**63, 1, 2**64 - 1, 5]], dtype=torch.uint64), dsl.uint64) == \
        [2**63 + 5, 2**64 - 1, 1, 2, 1]
    assert run(torch.tensor([[2**31, 1, 2**32 - 1, 2**32 - 1]], dtype=torch.uint32), dsl.uint32) == \
        [2**31 - 1, 2**32 - 1, 1, 2, 1]
    assert run(torch.tensor([[2**62, 2**62, 2**62, 5]], dtype=torch.int64), dsl.int64) == \
        [3 * 2**62 + 5 - 2**64, 2**62, 5, 0, 3]
    assert run(torch.tensor([[127] * 4 + [-128] * 4], dtype=torch.int8), dsl.int32) == [-4, 127, -128, 0, 4]
    assert run(torch.tensor([[255] * 8], dtype=torch.uint8), dsl.uint32) == [2040, 255, 255, 0, 0]
    assert run(torch.tensor([[False, True, True, False]]), dsl.int32) == [2, 1, 0, 1, 0]


# -- 3-D blocks, axis=None, sum of a sum, broadcast / transposed / reshaped operands ---------------------

@dsl.jit
def _three_d(o_ptr, x_ptr, A: dsl.constexpr, B: dsl.constexpr, C: dsl.constexpr):
    a = dsl.arange(0, A)[:, None, None]
    b = dsl.arange(0, B)[None, :, None]
    c = dsl.arange(0, C)[None, None, :]
    x = dsl.load(x_ptr + a * B * C + b * C + c)
    bc = dsl.arange(0, B)[:, None] * C + dsl.arange(0, C)[None, :]
    dsl.store(o_ptr + bc, dsl.sum(x, axis=0))
    o = o_ptr + B * C
    dsl.store(o + dsl.arange(0, A)[:, None] * C + dsl.arange(0, C)[None, :], x.sum(1))
    o = o + A * C
    dsl.store(o + a * B + b, dsl.sum(x, -1, True))
    o = o + A * B
    m = dsl.max(x, axis=None, keep_dims=True)
    dsl.store(o + a * 0 + b * 0 + c * 0, m + dsl.zeros((A, B, C), dsl.float32), mask=(a + b + c) == 0)
    dsl.store(o + 1, dsl.argmax(x, None).to(dsl.float32))
    o = o + 2
    dsl.store(o + dsl.arange(0, A), dsl.sum(dsl.sum(x, 2), 1))                # triton-lang/triton#4379
    o = o + A
    dsl.store(o + a * B * C + b * C + c, x.cumsum(1, reverse=True))
    o = o + A * B * C
    dsl.store(o + bc, dsl.argmin(x, 0))


@pytest.mark.parametrize("shape", [(2, 4, 8), (1, 1, 1), (4, 1, 2), (8, 2, 1), (2, 32, 4)])
def test_three_d_blocks(shape, seed):
    A, B, C = shape
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed))
    x.view(-1)[seed % x.numel()] = 10.0
    out = torch.zeros(2 * B * C + A * C + A * B + 2 + A + A * B * C)
    _three_d[(1,)](out, x, A, B, C, interpret=True)
    xd = x.double()
    expected = torch.cat([xd.sum(0).flatten(), xd.sum(1).flatten(), xd.sum(2).flatten(), xd.max().view(1),
                          xd.flatten().argmax().double().view(1), xd.sum((1, 2)), xd.flip(1).cumsum(1).flip(1).flatten(),
                          xd.argmin(0).double().flatten()])
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)


@dsl.jit
def _shapes(o_ptr, x_ptr, v_ptr, M: dsl.constexpr, N: dsl.constexpr):
    r = dsl.arange(0, M)
    c = dsl.arange(0, N)
    x = dsl.load(x_ptr + r[:, None] * N + c[None, :])
    v = dsl.broadcast_to(dsl.load(v_ptr + c)[None, :], (M, N))
    dsl.store(o_ptr, dsl.sum(dsl.sum(x, axis=1), axis=0))                      # triton-lang/triton#429
    dsl.store(o_ptr + 1 + r, dsl.sum(dsl.trans(x), axis=0))
    dsl.store(o_ptr + 1 + M + c, dsl.argmax(dsl.trans(x), axis=1).to(dsl.float32))
    dsl.store(o_ptr + 1 + M + N + c, dsl.max(dsl.reshape(x, (N, M)), axis=1))
    o = o_ptr + 1 + M + 2 * N
    dsl.store(o + c, dsl.sum(v, axis=0))                                      # broadcast: M copies each
    dsl.store(o + N + c, dsl.argmax(v, axis=0).to(dsl.float32))               # all tie: the first row
    dsl.store(o + 2 * N + r[:, None] * N + c[None, :], dsl.cumsum(v, axis=0))
    dsl.store(o + 2 * N + M * N + r, x.max(1) - dsl.max(x - x.max(1, keep_dims=True), axis=1))


@pytest.mark.parametrize("M, N", [(4, 8), (1, 16), (16, 1), (64, 128)])
def test_sum_of_sum_broadcast_trans_reshape(M, N, seed):
    g = torch.Generator().manual_seed(seed)
    x, v = torch.randn(M, N, generator=g), torch.randn(N, generator=g)
    out = torch.zeros(1 + M + 2 * N + 2 * N + M * N + M)
    _shapes[(1,)](out, x, v, M, N, interpret=True)
    xd, vd = x.double(), v.double()
    expected = torch.cat([xd.sum().view(1), xd.sum(1), xd.argmax(0).double(), xd.flatten().view(N, M).max(1).values,
                          M * vd, torch.zeros(N, dtype=torch.float64),
                          (torch.arange(1, M + 1)[:, None] * vd[None, :]).flatten(), xd.max(1).values])
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)


# -- loop-carried accumulators: an online argmax over masked chunks -------------------------------------

@dsl.jit
def _online_argmax(o_ptr, x_ptr, n, BLOCK: dsl.constexpr):
    row = dsl.program_id(0)
    best = -float("inf")
    best_i = 0
    total = 0.0
    for start in range(0, n, BLOCK):
        cols = start + dsl.arange(0, BLOCK)
        x = dsl.load(x_ptr + row * n + cols, mask=cols < n, other=-float("inf"))
        m = dsl.max(x, axis=0)
        i = dsl.argmax(x, axis=0) + start
        best_i = dsl.where(m > best, i, best_i)
        best = dsl.maximum(best, m)
        total += dsl.sum(dsl.where(cols < n, x, 0.0), axis=0)
    dsl.store(o_ptr + row * 3, best)
    dsl.store(o_ptr + row * 3 + 1, best_i.to(dsl.float32))
    dsl.store(o_ptr + row * 3 + 2, total)


@pytest.mark.parametrize("n, block", [(1000, 128), (5, 64), (256, 256), (7, 8), (300, 16)])
def test_online_argmax_in_a_loop(n, block, seed):
    x = torch.randn(3, n, generator=torch.Generator().manual_seed(seed))
    x[1, n // 2] = x[1, n - 1] = 100.0                              # a tie across chunks: the first wins
    if n < 10:
        x[2] = float("-inf")
    out = torch.zeros(9)
    _online_argmax[(3,)](out, x, n, BLOCK=block, interpret=True)
    out = out.view(3, 3).double()
    assert out[:, 0].tolist() == x.max(1).values.double().tolist()
    assert out[:, 1].tolist() == x.argmax(1).double().tolist()
    finite = torch.isfinite(x).all(1)
    torch.testing.assert_close(out[finite, 2], x.double().sum(1)[finite], rtol=1e-5, atol=1e-4)


# -- sibling reductions: the grouped IR runs bit for bit like the frontend's ----------------------------

@dsl.jit
def _siblings(o_ptr, x_ptr, n_cols, BLOCK_N: dsl.constexpr):
    rows = dsl.program_id(0) * 2 + dsl.arange(0, 2)
    cols = dsl.arange(0, BLOCK_N)
    mask = cols[None, :] < n_cols
    x = dsl.load(x_ptr + rows[:, None] * n_cols + cols[None, :], mask=mask, other=0).to(dsl.int32)
    s1 = dsl.sum(x, axis=1)
    dsl.store(o_ptr + rows * 8, s1)
    m1 = dsl.max(dsl.where(mask, x, -1000), axis=1)
    s2 = dsl.sum(x * x, axis=1)
    d = dsl.sum(x - s1[:, None], axis=1)                            # depends on s1: not in its group
    m2 = dsl.max(dsl.where(mask, -x, -1000), axis=1)
    s3 = dsl.sum(x * 3 + 1, axis=1)
    s4 = dsl.sum((x & 7) << 2, axis=1)
    s5 = dsl.sum(x ^ 5, axis=1)                                     # a fifth sum: past MAX_GROUP
    dsl.store(o_ptr + rows * 8 + 1, m1)
    dsl.store(o_ptr + rows * 8 + 2, s2)
    dsl.store(o_ptr + rows * 8 + 3, d)
    dsl.store(o_ptr + rows * 8 + 4, m2)
    dsl.store(o_ptr + rows * 8 + 5, s3)
    dsl.store(o_ptr + rows * 8 + 6, s4)
    dsl.store(o_ptr + rows * 8 + 7, s5)


@pytest.mark.parametrize("n_cols, block_n, num_warps", [(1000, 1024, 4), (100, 128, 8), (1, 512, 4), (17, 4096, 16)])
def test_sibling_reductions_keep_results(n_cols, block_n, num_warps, seed):
    x = torch.randint(-100, 100, (4, n_cols), dtype=torch.int8, generator=torch.Generator().manual_seed(seed))
    args, kwargs = (torch.zeros(4, 8, dtype=torch.int32), x, n_cols), dict(BLOCK_N=block_n)
    function = pipelined_ir(_siblings, args, kwargs, num_warps)[0]
    assert sorted(exchange_groups(function)) == [2, 2, 4]       # {s1..s4}, {m1, m2}, {d, s5}
    interpret_ir(_siblings, function, (2,), args, kwargs)
    plain = torch.zeros(4, 8, dtype=torch.int32)
    _siblings[(2,)](plain, x, n_cols, interpret=True, **kwargs)
    assert torch.equal(args[0], plain)
    xi = torch.nn.functional.pad(x.long(), (0, block_n - n_cols))          # the masked lanes load 0
    s1 = xi.sum(1)
    expected = torch.stack([s1, x.long().max(1).values, (xi * xi).sum(1), (xi - s1[:, None]).sum(1), (-x.long()).max(1).values,
                            (xi * 3 + 1).sum(1), ((xi & 7) << 2).sum(1), (xi ^ 5).sum(1)], 1)
    assert torch.equal(plain.long(), expected)


# -- PTX: representative kernels assembled with ptxas for sm_90a -----------------------------------------

_PTX = pytest.mark.skipif(not ptxas_available(), reason="ptxas is not on the PATH")


@_PTX
@pytest.mark.parametrize("num_warps", [1, 4, 8])
@pytest.mark.parametrize("dtype, shape, axis", [
    (torch.float32, (16, 64), 0), (torch.float16, (2, 128), 1), (torch.bfloat16, (8, 4), 0),
    (torch.float64, (4, 8), 1), (torch.int8, (128, 2), 0), (torch.uint32, (1, 16), 1), (torch.int64, (16, 1), 0),
    (torch.bool, (4, 8), 1)])
def test_ptx_reductions_assemble(dtype, shape, axis, num_warps):
    n = shape[1 - axis]
    outs = [torch.empty(n, dtype=_ACC[dtype]), torch.empty(n, dtype=dtype), torch.empty(n, dtype=dtype),
            torch.empty(n, dtype=torch.int32), torch.empty(n, dtype=torch.int32)]
    compiled = _reduce_all.compile(*outs, torch.empty(shape, dtype=dtype), *shape, axis, True, _DSL[_ACC[dtype]],
                                   target="sm_90a", num_warps=num_warps)
    result = assemble(compiled.asm["ptx"], "sm_90a")
    assert result.spill_bytes == 0
    scan = _cumsum2d.compile(torch.empty(shape, dtype=_ACC[dtype]), torch.empty(shape, dtype=dtype), *shape, axis,
                             axis == 1, _DSL[_ACC[dtype]], target="sm_90a", num_warps=num_warps)
    assert assemble(scan.asm["ptx"], "sm_90a").spill_bytes == 0


@_PTX
@pytest.mark.parametrize("num_warps", [1, 4, 8])
def test_ptx_loops_3d_and_nan_propagating_max(num_warps):
    for kernel, args, kwargs in [(_online_argmax, (torch.empty(9), torch.empty(3, 1000), 1000), dict(BLOCK=128)),
                                 (_three_d, (torch.empty(1), torch.empty(1), 2, 4, 8), {}),
                                 (_shapes, (torch.empty(1), torch.empty(1), torch.empty(1), 4, 8), {})]:
        compiled = kernel.compile(*args, target="sm_90a", num_warps=num_warps, **kwargs)
        assert assemble(compiled.asm["ptx"], "sm_90a").spill_bytes == 0
    for dtype, instruction in [(torch.float32, "max.NaN.f32"), (torch.float16, "max.NaN.f16"),
                               (torch.bfloat16, "max.NaN.bf16")]:
        ptx = _row.compile(torch.empty(1), torch.empty(1, dtype=dtype), 64, target="sm_90a",
                           num_warps=num_warps).asm["ptx"]
        assert instruction in ptx and ".ftz" not in ptx
        assemble(ptx, "sm_90a")
