"""Triton's smaller language names (fusedops/dsl/language/triton_compat.py, triton_math.py): `dsl.range`,
`debug_barrier`, `static_print`, `assume`, `zeros_like` / `full_like`, `ravel`, `view`, `permute`, `broadcast`,
`div_rn` / `fdiv` / `sqrt_rn`, `cumprod`, `xor_sum`, `flip`, `join` / `split` / `interleave`, `swizzle2d` and the
`dsl.math` namespace.

References are NumPy on float64 or exact integers / bits: the data movement ops (flip, join, split, interleave)
must give the same bits (-0.0 and NaN included), the integer scans and reductions wrap exactly, float cumprod is
within float32 rounding of float64. Inputs are fresh random values loaded under masks (odd sizes, size-1 dims),
outputs poisoned. The PTX of the kernels is assembled by ptxas for sm_80 and sm_90a; the cuda-marked tests run
the compiled kernels against the same references and the interpreter.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import fusedops.dsl as dsl
from fusedops.dsl import CompilationError
from fusedops.dsl.target import assemble, ptxas_available
from helpers import poison
from kernel_source import jit_from_source

needs_ptxas = pytest.mark.skipif(not ptxas_available(), reason="ptxas is not on the PATH")


# -- kernels ----------------------------------------------------------------------------------------------------
@dsl.jit
def _movement_kernel(o_ptr, x_ptr, nr, nc, R: dsl.constexpr, C: dsl.constexpr):
    # eight regions of R * C: flip along 0, flip (last dim), split of (R, C/2, 2), join(x, flip(x)) (two regions),
    # interleave(x, flip(x, 0)) (two regions), flip of the booleans x > 0 along 1
    r = dsl.arange(0, R)[:, None]
    c = dsl.arange(0, C)[None, :]
    x = dsl.load(x_ptr + r * nc + c, mask=(r < nr) & (c < nc), other=0)
    RC: dsl.constexpr = R * C
    dsl.store(o_ptr + r * C + c, dsl.flip(x, 0))
    dsl.store(o_ptr + RC + r * C + c, dsl.flip(x))
    a, b = dsl.split(dsl.reshape(x, (R, C // 2, 2)))
    h = dsl.arange(0, C // 2)[None, :]
    dsl.store(o_ptr + 2 * RC + r * (C // 2) + h, a)
    dsl.store(o_ptr + 2 * RC + RC // 2 + r * (C // 2) + h, b)
    k = dsl.arange(0, 2)[None, None, :]
    dsl.store(o_ptr + 3 * RC + r[:, :, None] * (2 * C) + c[:, :, None] * 2 + k, dsl.join(x, dsl.flip(x)))
    w = dsl.arange(0, 2 * C)[None, :]
    dsl.store(o_ptr + 5 * RC + r * (2 * C) + w, dsl.interleave(x, dsl.flip(x, 0)))
    dsl.store(o_ptr + 7 * RC + r * C + c, dsl.flip(x > 0, 1).to(x.dtype))


@dsl.jit
def _cumprod_kernel(o_ptr, x_ptr, nr, nc, R: dsl.constexpr, C: dsl.constexpr):
    r = dsl.arange(0, R)[:, None]
    c = dsl.arange(0, C)[None, :]
    x = dsl.load(x_ptr + r * nc + c, mask=(r < nr) & (c < nc), other=1)
    dsl.store(o_ptr + r * C + c, dsl.cumprod(x, 0))
    dsl.store(o_ptr + R * C + r * C + c, dsl.cumprod(x, axis=1, reverse=True))


@dsl.jit
def _xor_kernel(o_ptr, x_ptr, nr, nc, R: dsl.constexpr, C: dsl.constexpr):
    # xor_sum along 0 (C values), along 1 kept (R values), of all (1 value), and the parity of x's low bits
    r = dsl.arange(0, R)[:, None]
    c = dsl.arange(0, C)[None, :]
    x = dsl.load(x_ptr + r * nc + c, mask=(r < nr) & (c < nc), other=0)
    dsl.store(o_ptr + dsl.arange(0, C), dsl.xor_sum(x, 0))
    dsl.store(o_ptr + C + r, dsl.xor_sum(x, 1, keep_dims=True))
    dsl.store(o_ptr + C + R, dsl.xor_sum(x))
    dsl.store(o_ptr + C + R + 1, dsl.xor_sum((x & 1) == 1).to(x.dtype))


@dsl.jit
def _swizzle_kernel(o_ptr, size_i, size_j, size_g, BI: dsl.constexpr, BJ: dsl.constexpr):
    i = dsl.arange(0, BI)[:, None]
    j = dsl.arange(0, BJ)[None, :]
    new_i, new_j = dsl.swizzle2d(i, j, size_i, size_j, size_g)
    mask = (i < size_i) & (j < size_j)
    dsl.store(o_ptr + i * size_j + j, new_i, mask=mask)
    dsl.store(o_ptr + size_i * size_j + i * size_j + j, new_j, mask=mask)


@dsl.jit
def _range_kernel(o_ptr, lo, hi, step):
    total = 0
    count = 0
    for j in dsl.range(lo, hi, step, num_stages=3, loop_unroll_factor=2, disallow_acc_multi_buffer=True,
                       flatten=True, warp_specialize=False, disable_licm=True):
        total += j
        count += 1
    one_argument = 0
    for j in dsl.range(hi):
        one_argument += j * j
    dsl.store(o_ptr, total)
    dsl.store(o_ptr + 1, count)
    dsl.store(o_ptr + 2, one_argument)


@dsl.jit
def _small_kernel(o_ptr, x_ptr, y_ptr, nr, nc, R: dsl.constexpr, C: dsl.constexpr):
    r = dsl.arange(0, R)[:, None]
    c = dsl.arange(0, C)[None, :]
    mask = (r < nr) & (c < nc)
    x = dsl.load(x_ptr + r * nc + c, mask=mask, other=0.0)
    y = dsl.load(y_ptr + r * nc + c, mask=mask, other=1.0)
    dsl.assume(nr > 0)
    dsl.assume(x == x)
    RC: dsl.constexpr = R * C
    flat = dsl.arange(0, RC)
    dsl.store(o_ptr + r * C + c, dsl.zeros_like(x) + 1.0)
    dsl.store(o_ptr + RC + r * C + c, dsl.full_like(x, nr))
    dsl.store(o_ptr + 2 * RC + flat, dsl.ravel(x))
    dsl.store(o_ptr + 3 * RC + flat, dsl.view(x, RC))
    tr = dsl.arange(0, C)[:, None]
    tc = dsl.arange(0, R)[None, :]
    dsl.store(o_ptr + 4 * RC + tr * R + tc, dsl.permute(x, (1, 0)))
    dsl.store(o_ptr + 5 * RC + r * C + c, dsl.div_rn(x, y))
    dsl.store(o_ptr + 6 * RC + r * C + c, dsl.fdiv(x, y) + dsl.fdiv(x, y, ieee_rounding=True))
    dsl.store(o_ptr + 7 * RC + r * C + c, dsl.sqrt_rn(y))
    rows, full = dsl.broadcast(dsl.sum(x, 1, keep_dims=True), y)
    dsl.store(o_ptr + 8 * RC + r * C + c, rows)
    dsl.store(o_ptr + 9 * RC + r * C + c, full)
    dsl.debug_barrier()
    dsl.store(o_ptr + 10 * RC + r * C + c, dsl.math.fma(dsl.math.sqrt(y), dsl.math.abs(x), dsl.math.floor(x)))
    dsl.store(o_ptr + 11 * RC + r * C + c, dsl.math.exp2(x) + dsl.math.log(y))


_DTYPES = {torch.float32: np.float32, torch.float16: np.float16, torch.int32: np.int32, torch.int8: np.int8,
           torch.uint8: np.uint8, torch.int64: np.int64}


def _run(kernel, grid, *args, device="cpu", **constexprs):
    kernel[grid](*args, interpret=device == "cpu", **constexprs)


def _padded(x: torch.Tensor, R: int, C: int, fill) -> np.ndarray:
    out = np.full((R, C), fill, dtype=_DTYPES[x.dtype])
    out[:x.shape[0], :x.shape[1]] = x.numpy()
    return out


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view(f"u{a.dtype.itemsize}") if a.dtype.kind == "f" else a


def _random(shape, torch_dtype, generator):
    if torch_dtype.is_floating_point:
        x = torch.randn(shape, generator=generator).to(torch_dtype)
        flat = x.view(-1)
        if flat.numel() >= 3:               # -0.0 and a NaN with a payload must move unchanged
            flat[0] = -0.0
            flat[-1] = float("nan")
        return x
    info = torch.iinfo(torch_dtype)
    return torch.randint(max(info.min, -1000), min(info.max, 1000) + 1, shape, generator=generator, dtype=torch_dtype)


# -- data movement --------------------------------------------------------------------------------------------
def _movement_expected(p: np.ndarray) -> np.ndarray:
    R, C = p.shape
    flipped = p[:, ::-1]
    regions = [p[::-1, :], flipped, p.reshape(R, C // 2, 2)[..., 0], p.reshape(R, C // 2, 2)[..., 1],
               np.stack([p, flipped], axis=-1), np.stack([p, p[::-1, :]], axis=-1).reshape(R, 2 * C),
               (p > 0)[:, ::-1].astype(p.dtype)]
    return np.concatenate([np.ascontiguousarray(a).reshape(-1) for a in regions])


def _movement(torch_dtype, R, C, nr, nc, seed, device="cpu"):
    x = _random((nr, nc), torch_dtype, torch.Generator().manual_seed(seed))
    out = poison(torch.empty(8 * R * C, dtype=torch_dtype, device=device))
    _run(_movement_kernel, (1,), out, x.to(device), nr, nc, device=device, R=R, C=C)
    return out.cpu().numpy(), _movement_expected(_padded(x, R, C, 0))


_SHAPES = [(4, 8, 3, 7), (1, 16, 1, 13), (8, 2, 5, 2)]       # (R, C, rows, cols loaded): masked tails, size 1


@pytest.mark.parametrize("torch_dtype", [torch.float32, torch.float16, torch.int8])
@pytest.mark.parametrize("R, C, nr, nc", _SHAPES)
def test_flip_join_split_interleave_move_every_bit(torch_dtype, R, C, nr, nc):
    got, want = _movement(torch_dtype, R, C, nr, nc, seed=R * 100 + C)
    np.testing.assert_array_equal(_bits(got), _bits(want))


def test_join_and_split_of_scalars_and_flip_of_size_one():
    kernel = jit_from_source(
        "def k(o_ptr, a, b):\n"
        "    pair = dsl.join(a, b)\n"                                   # two scalars: shape (2,)
        "    first, second = dsl.split(pair)\n"                         # back to two scalars
        "    dsl.store(o_ptr + dsl.arange(0, 2), pair)\n"
        "    dsl.store(o_ptr + 2, second)\n    dsl.store(o_ptr + 3, first)\n"
        "    dsl.store(o_ptr + 4 + dsl.arange(0, 2), dsl.interleave(b, a))\n"
        "    one = dsl.full((1, 4), a, dsl.float32)\n"
        "    dsl.store(o_ptr + 6 + dsl.arange(0, 4)[None, :], dsl.flip(one, 0) + dsl.flip(one, -1))\n",
        "<triton builtins scalars>")
    out = poison(torch.empty(10))
    kernel[(1,)](out, 1.5, -2.25, interpret=True)
    assert out.tolist() == [1.5, -2.25, -2.25, 1.5, -2.25, 1.5, 3.0, 3.0, 3.0, 3.0]


def test_tensor_methods_of_the_new_names():
    kernel = jit_from_source(
        "def k(o_ptr, x_ptr):\n"
        "    x = dsl.load(x_ptr + dsl.arange(0, 8))\n"
        "    m = x.view(4, 2)\n"
        "    a, b = m.split()\n"
        "    dsl.store(o_ptr + dsl.arange(0, 8), x.flip(0))\n"
        "    dsl.store(o_ptr + 8 + dsl.arange(0, 8), b.join(a).ravel())\n"
        "    dsl.store(o_ptr + 16 + dsl.arange(0, 8), a.interleave(b))\n"
        "    dsl.store(o_ptr + 24 + dsl.arange(0, 8), m.permute(1, 0).reshape(8))\n"
        "    dsl.store(o_ptr + 32 + dsl.arange(0, 8), x.cumprod(0))\n"
        "    dsl.store(o_ptr + 40, x.xor_sum(0))\n", "<triton builtins methods>")
    x = torch.randint(-50, 50, (8,), dtype=torch.int32, generator=torch.Generator().manual_seed(8))
    out = poison(torch.empty(41, dtype=torch.int32))
    kernel[(1,)](out, x, interpret=True)
    v = x.numpy().astype(np.int64)
    pairs = v.reshape(4, 2)
    want = np.concatenate([v[::-1], pairs[:, ::-1].ravel(), v, pairs.T.ravel(), np.cumprod(v).astype(np.int32),
                           [np.bitwise_xor.reduce(v)]]).astype(np.int32)
    np.testing.assert_array_equal(out.numpy(), want)


# -- scans and reductions ---------------------------------------------------------------------------------------
def _cumprod_case(torch_dtype, R, C, nr, nc, seed, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    if torch_dtype.is_floating_point:
        x = ((torch.rand((nr, nc), generator=g) + 0.5) * torch.where(torch.rand((nr, nc), generator=g) < 0.3, -1, 1))
    else:
        x = torch.randint(-9, 10, (nr, nc), generator=g)
    x = x.to(torch_dtype)
    out = poison(torch.empty(2 * R * C, dtype=torch_dtype, device=device))
    _run(_cumprod_kernel, (1,), out, x.to(device), nr, nc, device=device, R=R, C=C)
    p = _padded(x, R, C, 1)
    if torch_dtype.is_floating_point:
        wide = p.astype(np.float64)
        want = np.concatenate([np.cumprod(wide, 0).ravel(), np.cumprod(wide[:, ::-1], 1)[:, ::-1].ravel()])
    else:       # int64 products wrap mod 2**64, so mod 2**bits too
        wide = p.astype(np.int64)
        want = np.concatenate([np.cumprod(wide, 0).ravel(), np.cumprod(wide[:, ::-1], 1)[:, ::-1].ravel()])
        want = want.astype(p.dtype)
    return out.cpu().numpy(), want


@pytest.mark.parametrize("torch_dtype", [torch.float32, torch.int32, torch.int8])
@pytest.mark.parametrize("R, C, nr, nc", [(16, 8, 13, 7), (1, 32, 1, 29)])
def test_cumprod_matches_the_reference(torch_dtype, R, C, nr, nc):
    got, want = _cumprod_case(torch_dtype, R, C, nr, nc, seed=R + C)
    if torch_dtype.is_floating_point:       # up to 16 float32 products: well within 4e-6 of float64
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=4e-6, atol=0)
    else:
        np.testing.assert_array_equal(got, want)


def _xor_case(torch_dtype, R, C, nr, nc, seed, device="cpu"):
    info = torch.iinfo(torch_dtype)
    x = torch.randint(info.min, info.max, (nr, nc), generator=torch.Generator().manual_seed(seed), dtype=torch_dtype)
    out = poison(torch.empty(C + R + 2, dtype=torch_dtype, device=device))
    _run(_xor_kernel, (1,), out, x.to(device), nr, nc, device=device, R=R, C=C)
    p = _padded(x, R, C, 0)
    want = np.concatenate([np.bitwise_xor.reduce(p, 0), np.bitwise_xor.reduce(p, 1),
                           [np.bitwise_xor.reduce(p, None)], [np.sum(p & 1) % 2]]).astype(p.dtype)
    return out.cpu().numpy(), want


@pytest.mark.parametrize("torch_dtype", [torch.int32, torch.uint8, torch.int64])
@pytest.mark.parametrize("R, C, nr, nc", [(8, 16, 7, 11), (1, 4, 1, 3)])
def test_xor_sum_matches_the_reference(torch_dtype, R, C, nr, nc):
    got, want = _xor_case(torch_dtype, R, C, nr, nc, seed=R * C)
    np.testing.assert_array_equal(got, want)


# -- swizzle2d, range -----------------------------------------------------------------------------------------
def _swizzle_reference(size_i, size_j, size_g):
    """The grouped order written from its definition: walk the row-major ranks down columns of groups of size_g
    rows (the last group shorter)."""
    new = {}
    rank = 0
    for first in range(0, size_i, size_g):
        rows = min(size_g, size_i - first)
        for col in range(size_j):
            for row in range(first, first + rows):
                new[divmod(rank, size_j)] = (row, col)
                rank += 1
    return (np.array([[new[i, j][0] for j in range(size_j)] for i in range(size_i)]),
            np.array([[new[i, j][1] for j in range(size_j)] for i in range(size_i)]))


_SWIZZLES = [(4, 4, 2), (5, 3, 2), (7, 6, 3), (1, 5, 4), (6, 1, 8)]


def _swizzle(size_i, size_j, size_g, device="cpu"):
    out = poison(torch.empty(2 * size_i * size_j, dtype=torch.int32, device=device))
    _run(_swizzle_kernel, (1,), out, size_i, size_j, size_g, device=device, BI=8, BJ=8)
    return out.cpu().numpy().reshape(2, size_i, size_j)


@pytest.mark.parametrize("size_i, size_j, size_g", _SWIZZLES)
def test_swizzle2d_is_the_grouped_ordering(size_i, size_j, size_g):
    got = _swizzle(size_i, size_j, size_g)
    want_i, want_j = _swizzle_reference(size_i, size_j, size_g)
    np.testing.assert_array_equal(got[0], want_i)
    np.testing.assert_array_equal(got[1], want_j)
    assert len({(a, b) for a, b in zip(got[0].ravel(), got[1].ravel())}) == size_i * size_j     # a bijection


def test_swizzle2d_example_of_the_triton_docs():
    # size 4 x 4, groups of 2 rows: rank r lands where the docs' matrix holds r
    got = _swizzle(4, 4, 2)
    placed = np.empty((4, 4), dtype=int)
    placed[got[0], got[1]] = np.arange(16).reshape(4, 4)
    assert placed.tolist() == [[0, 2, 4, 6], [1, 3, 5, 7], [8, 10, 12, 14], [9, 11, 13, 15]]


_RANGES = [(3, 20, 4), (10, 0, -3), (5, 5, 1), (-7, 9, 2)]


@pytest.mark.parametrize("lo, hi, step", _RANGES)
def test_dsl_range_loops_as_python_range(lo, hi, step, device="cpu"):
    out = poison(torch.empty(3, dtype=torch.int32, device=device))
    _run(_range_kernel, (1,), out, lo, hi, step, device=device)
    assert out.tolist() == [sum(range(lo, hi, step)), len(range(lo, hi, step)), sum(j * j for j in range(hi))]


def _dot_loop(loop: str, name: str):
    return jit_from_source(
        "def k(c_ptr, a_ptr, b_ptr, K, BM: dsl.constexpr, BN: dsl.constexpr, BK: dsl.constexpr):\n"
        "    m = dsl.arange(0, BM)[:, None]\n    n = dsl.arange(0, BN)[None, :]\n    kk = dsl.arange(0, BK)\n"
        "    acc = dsl.zeros((BM, BN), dsl.float32)\n"
        f"    for k0 in {loop}:\n"
        "        a = dsl.load(a_ptr + m * K + k0 + kk[None, :])\n"
        "        b = dsl.load(b_ptr + (k0 + kk[:, None]) * BN + n)\n"
        "        acc = dsl.dot(a, b, acc)\n"
        "    dsl.store(c_ptr + m * BN + n, acc)\n", name)


def _code(ptx: str) -> str:
    return "\n".join(l for l in ptx.splitlines() if not re.match(r"\s*(\.loc|\.file|//)", l))


def test_dsl_range_hints_compile_as_range_with_the_launch_num_stages():
    f16, f32 = dsl.pointer_type(dsl.float16), dsl.pointer_type(dsl.float32)
    plain = _dot_loop("range(0, K, BK)", "<range plain>")
    hinted = _dot_loop("dsl.range(0, K, BK, num_stages=4, loop_unroll_factor=8, flatten=True)", "<range hinted>")
    ptx = [kernel.compile(f32, f16, f16, 256, BM=32, BN=32, BK=16, target="sm_90a", num_stages=3).asm["ptx"]
           for kernel in (plain, hinted)]
    assert _code(ptx[0]) == _code(ptx[1])


# -- the small builtins -----------------------------------------------------------------------------------------
def _small(R, C, nr, nc, seed, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn((nr, nc), generator=g)
    y = torch.rand((nr, nc), generator=g) * 4 + 0.25
    out = poison(torch.empty(12 * R * C, device=device))
    _run(_small_kernel, (1,), out, x.to(device), y.to(device), nr, nc, device=device, R=R, C=C)
    return out.cpu().numpy().reshape(12, R, C), _padded(x, R, C, 0.0), _padded(y, R, C, 1.0), nr


@pytest.mark.parametrize("R, C, nr, nc", [(4, 8, 3, 5), (2, 2, 1, 2)])
def test_small_builtins_match_the_reference(R, C, nr, nc):
    got, x, y, rows = _small(R, C, nr, nc, seed=R * C + nr)
    _check_small(got, x, y, rows)


def _check_small(got, x, y, rows):
    R, C = x.shape
    np.testing.assert_array_equal(got[0], np.ones((R, C), np.float32))
    np.testing.assert_array_equal(got[1], np.full((R, C), rows, np.float32))
    np.testing.assert_array_equal(got[2], x)
    np.testing.assert_array_equal(got[3], x)
    np.testing.assert_array_equal(got[4].reshape(-1), x.T.reshape(-1))
    np.testing.assert_array_equal(got[5], x / y)                                # IEEE float32 division
    np.testing.assert_array_equal(got[6], x / y + x / y)
    np.testing.assert_array_equal(got[7], np.sqrt(y))                           # IEEE float32 sqrt
    np.testing.assert_allclose(got[8], np.broadcast_to(x.astype(np.float64).sum(1, keepdims=True), (R, C)),
                               rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(got[9], y)
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    np.testing.assert_allclose(got[10], np.sqrt(y64) * np.abs(x64) + np.floor(x64), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got[11], np.exp2(x64) + np.log(y64), rtol=2e-6, atol=2e-6)


def test_static_print_prints_at_compile_time(capsys):
    kernel = jit_from_source("def k(o_ptr, n, BLOCK: dsl.constexpr):\n"
                             "    x = dsl.arange(0, BLOCK)\n"
                             "    dsl.static_print('block', BLOCK, x, n, dsl.float16, sep='|')\n"
                             "    dsl.store(o_ptr + x, x)\n", "<static print>")
    kernel[(1,)](torch.empty(8, dtype=torch.int32), 5, BLOCK=8, interpret=True)
    assert capsys.readouterr().out == "block|8|<runtime <8xint32>>|<runtime int32>|float16\n"


def test_math_namespace_is_the_builtins():
    for name in ("exp", "exp2", "log", "log2", "sqrt", "rsqrt", "sin", "cos", "abs", "floor", "ceil", "erf", "fma",
                 "sigmoid", "tanh", "cdiv", "clamp", "maximum", "minimum", "umulhi"):
        assert getattr(dsl.math, name) is getattr(dsl, name)
    assert dsl.math.div_rn is dsl.div_rn and dsl.math.sqrt_rn is dsl.sqrt_rn
    with pytest.raises(AttributeError, match=r"'erfinv'.*dsl.math has abs, cdiv"):
        dsl.math.erfinv


# -- errors -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("statement, message", [
    ("v = dsl.flip(v, 1)", r"flip: dim must be a constexpr int in range for a block of shape \(16,\), got 1"),
    ("v = dsl.flip(x_ptr + o)", r"flip: blocks of pointers are not supported"),
    ("v = dsl.split(v)[0]", r"split: a must be a block whose last dim is 2, got shape \(16,\)"),
    ("v = dsl.xor_sum(v)", r"xor_sum: input must be a block of integers, got float32"),
    ("v = dsl.cumprod(n)", r"cumprod: input must be a block, got a scalar of type int32"),
    ("v = dsl.cumprod(v, 2)", r"cumprod axis 2 is out of range"),
    ("v = dsl.permute(v)", r"permute needs the new order of the dims"),
    ("v = dsl.div_rn(o, o)", r"div_rn: x must be a floating-point scalar or block, got int32"),
    ("v = dsl.fdiv(v, v, ieee_rounding=1)", r"fdiv: ieee_rounding must be"),
    ("v = dsl.sqrt_rn(o)", r"sqrt_rn: x must be a floating-point scalar or block, got int32"),
    ("dsl.assume(o)", r"assume: cond must be a boolean .*got int32"),
    ("dsl.assume(False)", r"assume: the condition is False at compile time"),
    ("v = dsl.zeros_like(x_ptr)", r"zeros_like: dtype must be a dsl dtype .*got ptr<float32>"),
    ("v = dsl.view(v, 8)", r"cannot reshape a block of shape \(16,\) into \(8,\)"),
    ("v = dsl.broadcast(v, dsl.arange(0, 8))[0]", r"shapes \(16,\) and \(8,\) do not broadcast"),
    ("v = v + dsl.swizzle2d(o, 1.5, 4, 4, 2)[0]", r"swizzle2d: j must be an integer scalar or block, got 1\.5"),
    ("v = v + dsl.swizzle2d(o, o, 4, 4, 0)[0]", r"swizzle2d: size_g must be >= 1, got 0"),
    ("v = dsl.math.lgamma(v)", r"has no attribute `lgamma` \(Triton's tl.math.lgamma: dsl.math has abs, cdiv"),
    ("r = dsl.range(0, 4)", r"dsl.range\(\) can only be used as the iterable of a `for` loop"),
    ("for i in dsl.range(0, n, num_stages=0):\n        v = v + 1", r"dsl.range: num_stages must be None or a "
                                                                   r"constexpr int >= 1, got 0"),
    ("for i in dsl.range(0, n, flatten=n):\n        v = v + 1", r"dsl.range: flatten must be"),
    ("for i in dsl.range(0, n, stages=2):\n        v = v + 1", r"bad arguments to dsl.range\(\).*stages"),
    ("for i in dsl.range(0.5, n):\n        v = v + 1", r"range\(\) bounds must be integers"),
])
def test_bad_arguments_are_clear_errors(statement, message):
    source = (f"def k(y_ptr, x_ptr, n):\n    o = dsl.arange(0, 16)\n    v = dsl.load(x_ptr + o)\n    {statement}\n"
              "    dsl.store(y_ptr + o, v)\n")
    kernel = jit_from_source(source, f"<triton builtins errors {abs(hash(statement))}>")
    with pytest.raises(CompilationError, match=message):
        kernel[(1,)](torch.empty(16), torch.randn(16), 3, interpret=True)


def test_dsl_range_outside_the_kernel_is_refused_and_a_star_import_keeps_pythons_range():
    with pytest.raises(RuntimeError, match="inside a @dsl.jit kernel"):
        dsl.range(4)
    namespace: dict = {}
    exec("from fusedops.dsl import *", namespace)
    assert "range" not in namespace and "math" not in namespace and "flip" in namespace


# -- the compiled code (no GPU needed) ---------------------------------------------------------------------------
@needs_ptxas
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_ptx_assembles_with_the_expected_instructions(arch):
    def ptx(kernel, element, *args, **constexprs):
        pointer = dsl.pointer_type(element)
        return kernel.compile(pointer, pointer, *args, target=arch, **constexprs).asm["ptx"]

    movement = ptx(_movement_kernel, dsl.float16, 5, 7, R=4, C=8)
    scans = ptx(_cumprod_kernel, dsl.float32, 13, 7, R=16, C=8)
    products = ptx(_cumprod_kernel, dsl.int32, 13, 7, R=16, C=8)
    xors = ptx(_xor_kernel, dsl.int64, 7, 11, R=8, C=16)
    swizzle = _swizzle_kernel.compile(dsl.pointer_type(dsl.int32), 5, 3, 2, BI=8, BJ=8, target=arch).asm["ptx"]
    small = _small_kernel.compile(*[dsl.pointer_type(dsl.float32)] * 3, 3, 5, R=4, C=8, target=arch).asm["ptx"]
    assert re.search(r"mul(\.rn)?\.f32", scans) and "mul.lo.s32" in products
    assert "xor.b64" in xors and "shfl.sync.bfly" in xors
    assert "bar.sync" in small and "div.rn.f32" in small and "sqrt.rn.f32" in small
    for code in (movement, scans, products, xors, swizzle, small):
        assert assemble(code, arch).spill_bytes == 0


# -- on the GPU: the same references, and the interpreter's values ---------------------------------------------
@pytest.mark.cuda
@pytest.mark.parametrize("torch_dtype", [torch.float32, torch.float16, torch.int8])
@pytest.mark.parametrize("R, C, nr, nc", _SHAPES)
def test_gpu_movement(torch_dtype, R, C, nr, nc):
    got, want = _movement(torch_dtype, R, C, nr, nc, seed=R * 100 + C, device="cuda")
    np.testing.assert_array_equal(_bits(got), _bits(want))


@pytest.mark.cuda
@pytest.mark.parametrize("torch_dtype", [torch.float32, torch.int32, torch.int8])
@pytest.mark.parametrize("R, C, nr, nc", [(16, 8, 13, 7), (1, 32, 1, 29), (64, 4, 64, 3)])
def test_gpu_cumprod(torch_dtype, R, C, nr, nc):
    got, want = _cumprod_case(torch_dtype, R, C, nr, nc, seed=R + C, device="cuda")
    interpreted, _ = _cumprod_case(torch_dtype, R, C, nr, nc, seed=R + C)
    if torch_dtype.is_floating_point:
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=1e-5, atol=0)    # up to 64 products
        np.testing.assert_allclose(got, interpreted, rtol=1e-5, atol=0)
    else:
        np.testing.assert_array_equal(got, want)


@pytest.mark.cuda
@pytest.mark.parametrize("torch_dtype", [torch.int32, torch.uint8, torch.int64])
@pytest.mark.parametrize("R, C, nr, nc", [(8, 16, 7, 11), (1, 4, 1, 3), (32, 64, 31, 60)])
def test_gpu_xor_sum(torch_dtype, R, C, nr, nc):
    got, want = _xor_case(torch_dtype, R, C, nr, nc, seed=R * C, device="cuda")
    np.testing.assert_array_equal(got, want)


@pytest.mark.cuda
@pytest.mark.parametrize("size_i, size_j, size_g", _SWIZZLES)
def test_gpu_swizzle2d(size_i, size_j, size_g):
    got = _swizzle(size_i, size_j, size_g, device="cuda")
    want_i, want_j = _swizzle_reference(size_i, size_j, size_g)
    np.testing.assert_array_equal(got[0], want_i)
    np.testing.assert_array_equal(got[1], want_j)


@pytest.mark.cuda
@pytest.mark.parametrize("lo, hi, step", _RANGES)
def test_gpu_range(lo, hi, step):
    test_dsl_range_loops_as_python_range(lo, hi, step, device="cuda")


@pytest.mark.cuda
@pytest.mark.parametrize("R, C, nr, nc", [(4, 8, 3, 5), (2, 2, 1, 2)])
def test_gpu_small_builtins(R, C, nr, nc):
    got, x, y, rows = _small(R, C, nr, nc, seed=R * C + nr, device="cuda")
    _check_small(got, x, y, rows)
