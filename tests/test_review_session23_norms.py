"""Review (session 23, norms and softmax): a demanding PyTorch user tried to break fusedops.softmax,
fusedops.log_softmax, fusedops.layer_norm, fusedops.rms_norm and fusedops.nn.LayerNorm / RMSNorm / Softmax /
LogSoftmax on the CPU, with torch itself as the oracle (float64 where numerics matter), on both CPU routes: the
kernels in the NumPy interpreter (FUSEDOPS_INTERPRET=1, the kernel path CUDA tensors take) and the torch fallback.

Cases were replayed from peer projects' bug reports (Liger-Kernel RMSNorm gradients and casting modes, Apex
FusedLayerNorm with >= 2**16 rows and non-contiguous inputs, Transformer-Engine's non-contiguous LayerNorm,
Triton / flash-attention style online softmax with rows whose first blocks are all -inf): mixed input / weight
dtypes, eps edge cases (0, negative, huge, int, bool, 0-d tensors, inf, nan), normalized_shape spellings,
partial requires_grad, double backward, torch.func (vmap, grad, jvp, jacfwd), forward AD, is_grads_batched,
checkpointing and saved-tensor hooks, in-place modification after the forward, CPU autocast, torch.compile,
module state_dict / deepcopy / pickle / meta device / to_empty + reset_parameters / .to(dtype), non-finite
inputs, all -inf softmax rows on every dim, 0-d, 1-d and zero-size inputs, rows of 70000 columns, 70000 rows,
transposed / expanded / overlapping inputs and gradients, and the errors for bad arguments.

Two defects were found, both on the kernel path (the interpreter; on CUDA these dtype combinations run torch's
op): they are xfail(strict=True) and assert torch's behaviour. The other tests pin what was checked and matches.
"""

from __future__ import annotations

import copy
import pickle
import warnings

import pytest
import torch
import torch.nn.functional as F

import fusedops
import fusedops.nn as fnn

D = torch.float64
NINF, INF, NAN = float("-inf"), float("inf"), float("nan")


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    assert a.dtype == b.dtype, (a.dtype, b.dtype)
    return 0.0 if a.numel() == 0 else (a.double() - b.double()).abs().max().item()


def _same_nonfinite(a: torch.Tensor, b: torch.Tensor) -> None:
    assert torch.equal(a.isnan(), b.isnan()), (a, b)
    assert torch.equal(a.isinf(), b.isinf()) and torch.equal(a[a.isinf()], b[b.isinf()]), (a, b)


def _close(a: torch.Tensor, b: torch.Tensor, tol: float) -> None:
    """Same shape, dtype, NaN/inf pattern; finite entries within tol (absolute, scaled by 1 + |b|max)."""
    assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, a.dtype, b.shape, b.dtype)
    _same_nonfinite(a, b)
    finite = torch.isfinite(b)
    if finite.any():
        scale = 1.0 + b[finite].double().abs().max().item()
        assert _max_diff(a[finite], b[finite]) <= tol * scale


def _no_worse_than_torch(ours: torch.Tensor, same: torch.Tensor, exact: torch.Tensor) -> None:
    """The repo's bar (tests/test_norms.py): torch's same-dtype NaN/inf pattern, and finite entries within twice
    torch's own error against the float64 result plus one unit in the last place of its largest entry."""
    assert ours.shape == same.shape and ours.dtype == same.dtype, (ours.shape, ours.dtype, same.shape, same.dtype)
    _same_nonfinite(ours, same)
    finite = torch.isfinite(exact) & torch.isfinite(same)
    if finite.any():
        ulp = torch.finfo(same.dtype).eps * exact[finite].abs().max().item()
        assert (_max_diff(ours[finite].double(), exact[finite])
                <= 2 * _max_diff(same[finite].double(), exact[finite]) + ulp)


TOL = {D: 1e-12, torch.float32: 2e-6, torch.float16: 4e-3, torch.bfloat16: 3e-2}


def _grads(fn, tensors, dy, wanted):
    """(y, *gradients of the tensors whose flag in `wanted` is set) of fn(*tensors) against dy."""
    leaves = [None if t is None else t.detach().clone().requires_grad_(bool(w)) for t, w in zip(tensors, wanted)]
    y = fn(*leaves)
    needed = [t for t in leaves if t is not None and t.requires_grad]
    return (y, *torch.autograd.grad(y, needed, dy)) if needed else (y,)


def _ln(m):
    return lambda x, w, b, shape=None: (m.layer_norm(x, shape or tuple(w.shape), w, b) if m is not F
                                        else F.layer_norm(x, shape or tuple(w.shape), w, b))


# -------------------------------------------------------------------------------------------------
# Defects
# -------------------------------------------------------------------------------------------------
# Fixed in session 23 (was: float64 LayerNorm rows of > 8192 columns (forward_looped_kernel) lose ...).
@pytest.mark.parametrize("n", [8193, 20000])
def test_float64_layer_norm_of_long_rows_keeps_float64_precision(interpret, n):
    # norm_forward_kernels._normalize_row_looped: `delta * (1.0 / (chunk + 1.0))` with an int32 `chunk` is a float32
    # scalar, so every lane mean is updated with a reciprocal rounded to float32 (1/3, 1/5, ... are inexact);
    # the statistics are then only float32-accurate: y off by ~1e-8 for rows offset by 5 (torch: 1e-15).
    x = torch.randn(2, n, dtype=D) * 3 + 5
    w, b, dy = torch.randn(n, dtype=D), torch.randn(n, dtype=D), torch.randn(2, n, dtype=D)
    got = _grads(lambda x, w, b: fusedops.layer_norm(x, (n,), w, b), (x, w, b), dy, (1, 1, 0))
    want = _grads(lambda x, w, b: F.layer_norm(x, (n,), w, b), (x, w, b), dy, (1, 1, 0))
    for g, t in zip(got, want):
        _close(g, t, 1e-12)


# Fixed in session 23 (was: rms_norm's dweight of a float64 weight on a float32 input is summed in ...).
def test_rms_norm_float64_weight_gradient_is_accumulated_like_torch(interpret):
    # torch: y = (x_normed (fp32) * w (fp64)).to(fp32), so dweight = sum(dy * x_normed) is a float64 sum.
    # kernels/norm_backward_launcher.py backward_launcher allocates the dweight partials in `acc = rstd.dtype`
    # (float32).
    m, n = 16384, 2
    x, w, dy = torch.randn(m, n), torch.randn(n, dtype=D), torch.randn(m, n)
    ours = _grads(lambda x, w: fusedops.rms_norm(x, (n,), w, 1e-6), (x, w), dy, (0, 1))[1]
    same = _grads(lambda x, w: F.rms_norm(x, (n,), w, 1e-6), (x, w), dy, (0, 1))[1]
    exact = _grads(lambda x, w: F.rms_norm(x, (n,), w, 1e-6), (x.double(), w), dy.double(), (0, 1))[1]
    assert ours.dtype == same.dtype == D
    ulp = torch.finfo(D).eps * exact.abs().max().item()
    assert _max_diff(ours, exact) <= 2 * _max_diff(same, exact) + ulp


# -------------------------------------------------------------------------------------------------
# Checked and matching: the contrast cases of the defects
# -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [4096, 8192])
def test_float64_layer_norm_of_rows_in_one_block_keeps_float64_precision(interpret, n):
    x = torch.randn(2, n, dtype=D) * 3 + 5
    w, b, dy = torch.randn(n, dtype=D), torch.randn(n, dtype=D), torch.randn(2, n, dtype=D)
    got = _grads(lambda x, w, b: fusedops.layer_norm(x, (n,), w, b), (x, w, b), dy, (1, 1, 1))
    want = _grads(lambda x, w, b: F.layer_norm(x, (n,), w, b), (x, w, b), dy, (1, 1, 1))
    for g, t in zip(got, want):
        _close(g, t, 1e-12)


@pytest.mark.parametrize("n", [8193, 20000])
def test_float64_rms_norm_of_long_rows_keeps_float64_precision(interpret, n):
    x = torch.randn(2, n, dtype=D) * 3 + 5
    w, dy = torch.randn(n, dtype=D), torch.randn(2, n, dtype=D)
    got = _grads(lambda x, w: fusedops.rms_norm(x, (n,), w), (x, w), dy, (1, 1))
    want = _grads(lambda x, w: F.rms_norm(x, (n,), w), (x, w), dy, (1, 1))
    for g, t in zip(got, want):
        _close(g, t, 1e-12)


@pytest.mark.parametrize("weight_dtype", [torch.float16, torch.float32])
def test_rms_norm_weight_gradient_of_float32_or_narrower_weight_matches_torch(interpret, weight_dtype):
    m, n = 4096, 4
    x, w, dy = torch.randn(m, n), torch.randn(n).to(weight_dtype), torch.randn(m, n)
    ours = _grads(lambda x, w: fusedops.rms_norm(x, (n,), w, 1e-6), (x, w), dy, (0, 1))[1]
    same = _grads(lambda x, w: F.rms_norm(x, (n,), w, 1e-6), (x, w), dy, (0, 1))[1]
    exact = _grads(lambda x, w: F.rms_norm(x, (n,), w, 1e-6), (x.double(), w.double()), dy.double(), (0, 1))[1]
    assert ours.dtype == weight_dtype
    ulp = torch.finfo(weight_dtype).eps * exact.abs().max().item()
    assert _max_diff(ours, exact.to(weight_dtype)) <= 2 * _max_diff(same, exact.to(weight_dtype)) + ulp


# -------------------------------------------------------------------------------------------------
# dtypes: mixed weights (Liger "casting modes"), CPU autocast
# -------------------------------------------------------------------------------------------------
FLOATS = [torch.float16, torch.bfloat16, torch.float32, D]


@pytest.mark.parametrize("x_dtype", FLOATS)
@pytest.mark.parametrize("w_dtype", FLOATS)
def test_rms_norm_any_weight_dtype_matches_torch(route, x_dtype, w_dtype):
    x, w, dy = torch.randn(3, 8).to(x_dtype), torch.randn(8).to(w_dtype), torch.randn(3, 8).to(x_dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")     # torch: "Mismatch dtype between input and weight"
        got = _grads(lambda x, w: fusedops.rms_norm(x, (8,), w), (x, w), dy, (1, 1))
        want = _grads(lambda x, w: F.rms_norm(x, (8,), w), (x, w), dy, (1, 1))
    for g, t in zip(got, want):
        _close(g, t, max(TOL[x_dtype], TOL[w_dtype]))


@pytest.mark.parametrize("x_dtype", [torch.float16, torch.bfloat16])
def test_layer_norm_half_input_with_float32_parameters_matches_torch_cpu(route, x_dtype):
    x, dy = torch.randn(3, 8).to(x_dtype), torch.randn(3, 8).to(x_dtype)
    w, b = torch.randn(8), torch.randn(8)
    got = _grads(_ln(fusedops), (x, w, b), dy, (1, 1, 1))
    want = _grads(_ln(F), (x, w, b), dy, (1, 1, 1))
    assert [t.dtype for t in got] == [x_dtype, x_dtype, torch.float32, torch.float32]
    for g, t in zip(got, want):
        _close(g, t, TOL[x_dtype])


@pytest.mark.parametrize("x_dtype, p_dtype", [(torch.float32, torch.float16), (torch.float32, D),
                                              (D, torch.float32), (torch.float16, torch.bfloat16)])
def test_layer_norm_other_mixed_parameters_raise(route, x_dtype, p_dtype):
    x, w = torch.randn(3, 8, dtype=x_dtype), torch.randn(8, dtype=p_dtype)
    with pytest.raises(RuntimeError):
        F.layer_norm(x, (8,), w, w)
    with pytest.raises(TypeError, match="weight"):
        fusedops.layer_norm(x, (8,), w, w)
    with pytest.raises(RuntimeError, match="weight"):
        module = fnn.LayerNorm(8, dtype=p_dtype)
        module(x)


@pytest.mark.parametrize("autocast_dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("x_dtype", [torch.float32, torch.bfloat16])
def test_cpu_autocast_matches_torch(route, autocast_dtype, x_dtype):
    x, w, b = torch.randn(3, 8, dtype=x_dtype), torch.randn(8), torch.randn(8)
    cases = [(lambda m: m.softmax(x, -1), lambda: torch.softmax(x, -1)),
             (lambda m: m.log_softmax(x, 0, dtype=D), lambda: torch.log_softmax(x, 0, dtype=D)),
             (lambda m: m.layer_norm(x, (8,), w, b), lambda: F.layer_norm(x, (8,), w, b)),
             (lambda m: m.rms_norm(x, (8,), w), lambda: F.rms_norm(x, (8,), w))]
    with torch.autocast("cpu", dtype=autocast_dtype):
        for ours, theirs in cases:
            _close(ours(fusedops), theirs(), TOL[x_dtype])
        _close(fnn.LayerNorm(8)(x), torch.nn.LayerNorm(8)(x), TOL[x_dtype])
        _close(fnn.RMSNorm(8)(x), torch.nn.RMSNorm(8)(x), TOL[x_dtype])


# -------------------------------------------------------------------------------------------------
# eps and normalized_shape
# -------------------------------------------------------------------------------------------------
EPS_VALUES = [0, 0.0, -1e-3, 1, True, 1e30, INF, NAN, torch.tensor(1e-3), torch.tensor(1e-3, dtype=torch.float16)]


@pytest.mark.parametrize("eps", EPS_VALUES, ids=repr)
@pytest.mark.parametrize("dtype", [torch.float32, D])
def test_eps_spellings_and_extremes_match_torch(route, eps, dtype):
    x, w, b, dy = (torch.randn(4, 6, dtype=dtype), torch.randn(6, dtype=dtype), torch.randn(6, dtype=dtype),
                   torch.randn(4, 6, dtype=dtype))
    got = _grads(lambda x, w, b: fusedops.layer_norm(x, (6,), w, b, eps), (x, w, b), dy, (1, 1, 1))
    want = _grads(lambda x, w, b: F.layer_norm(x, (6,), w, b, eps), (x, w, b), dy, (1, 1, 1))
    for g, t in zip(got, want):
        _close(g, t, TOL[dtype])
    got = _grads(lambda x, w: fusedops.rms_norm(x, (6,), w, eps), (x, w), dy, (1, 1))
    want = _grads(lambda x, w: F.rms_norm(x, (6,), w, eps), (x, w), dy, (1, 1))
    for g, t in zip(got, want):
        _close(g, t, TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("eps", [1e39, 1e300, -1e39, 1e-50])
def test_eps_beyond_the_accumulation_dtype_matches_torch(interpret, dtype, eps):
    x, w, b = torch.randn(3, 6, dtype=dtype), torch.randn(6, dtype=dtype), torch.randn(6, dtype=dtype)
    dy = torch.randn(3, 6, dtype=dtype)
    got = _grads(lambda x: fusedops.layer_norm(x, (6,), w, b, eps), (x,), dy, (1,))
    want = _grads(lambda x: F.layer_norm(x, (6,), w, b, eps), (x,), dy, (1,))
    for g, t in zip(got, want):
        _close(g, t, TOL[dtype])
    got = _grads(lambda x: fusedops.rms_norm(x, (6,), w, eps), (x,), dy, (1,))
    want = _grads(lambda x: F.rms_norm(x, (6,), w, eps), (x,), dy, (1,))
    for g, t in zip(got, want):
        _close(g, t, TOL[dtype])


def test_zero_and_constant_rows_with_eps_zero_match_torch(route):
    for x in (torch.zeros(2, 4, dtype=D), torch.ones(2, 4, dtype=D)):
        dy = torch.randn(2, 4, dtype=D)
        for ours, theirs in ((fusedops.layer_norm, F.layer_norm), (fusedops.rms_norm, F.rms_norm)):
            got = _grads(lambda x: ours(x, (4,), None, *((None,) if ours is fusedops.layer_norm else ()), 0.0),
                         (x,), dy, (1,))
            want = _grads(lambda x: theirs(x, (4,), None, *((None,) if theirs is F.layer_norm else ()), 0.0),
                          (x,), dy, (1,))
            for g, t in zip(got, want):
                _close(g, t, 1e-12)


@pytest.mark.parametrize("shape", [(4,), [4], torch.Size([4]), (3, 4), [3, 4], torch.Size([3, 4]), (2, 3, 4),
                                   (torch.tensor(3), 4)], ids=repr)
def test_normalized_shape_spellings_match_torch(route, shape):
    x, dy = torch.randn(2, 3, 4, dtype=D), torch.randn(2, 3, 4, dtype=D)
    tail = tuple(int(s) for s in shape)
    w, b = torch.randn(tail, dtype=D), torch.randn(tail, dtype=D)
    got = _grads(lambda x, w, b: fusedops.layer_norm(x, shape, w, b), (x, w, b), dy, (1, 1, 1))
    want = _grads(lambda x, w, b: F.layer_norm(x, tail, w, b), (x, w, b), dy, (1, 1, 1))
    for g, t in zip(got, want):
        _close(g, t, 1e-12)
    got = _grads(lambda x, w: fusedops.rms_norm(x, shape, w), (x, w), dy, (1, 1))
    want = _grads(lambda x, w: F.rms_norm(x, tail, w), (x, w), dy, (1, 1))
    for g, t in zip(got, want):
        _close(g, t, 1e-12)


@pytest.mark.parametrize("shape, error", [((), ValueError), ([], ValueError), ((5,), ValueError), ((4, 3), ValueError),
                                          ((1, 4), ValueError), ((0,), ValueError), (4.0, TypeError),
                                          ((4.0,), TypeError), (None, TypeError), ("4", TypeError),
                                          ((True,), TypeError), (torch.tensor(4), TypeError)], ids=repr)
def test_bad_normalized_shape_raises_a_python_error(route, shape, error):
    x = torch.randn(2, 3, 4)
    for op in (fusedops.layer_norm, fusedops.rms_norm):
        with pytest.raises(error, match="normalized_shape"):
            op(x, shape)
    with pytest.raises((RuntimeError, TypeError)):
        F.layer_norm(x, shape)


# -------------------------------------------------------------------------------------------------
# Layouts, sizes, partial requires_grad
# -------------------------------------------------------------------------------------------------
def _layouts(dtype):
    x = torch.randn(5, 7, dtype=dtype)
    w, b, dy = torch.randn(7, dtype=dtype), torch.randn(7, dtype=dtype), torch.randn(5, 7, dtype=dtype)
    return {
        "plain": (x, w, b, dy),
        "transposed": (torch.randn(7, 5, dtype=dtype).t(), w, b, torch.randn(7, 5, dtype=dtype).t()),
        "expanded": (torch.randn(1, 7, dtype=dtype).expand(5, 7), w, b, torch.randn(7, dtype=dtype).expand(5, 7)),
        "expanded params": (x, torch.randn(1, dtype=dtype).expand(7), torch.randn(1, dtype=dtype).expand(7), dy),
        "strided params": (x, torch.randn(14, dtype=dtype)[::2], torch.randn(14, dtype=dtype)[1::2], dy),
        "overlapping rows": (torch.randn(40, dtype=dtype).as_strided((5, 7), (3, 1)), w, b, dy),
        "sliced": (torch.randn(7, 11, dtype=dtype)[1:6, 2:9], w, b, torch.randn(6, 9, dtype=dtype)[:5, 1:8]),
    }


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("layout", list(_layouts(torch.float32)))
@pytest.mark.parametrize("wanted", [(1, 1, 1), (0, 1, 0), (0, 0, 1)], ids=str)
def test_norm_layouts_and_partial_requires_grad_match_torch(route, dtype, layout, wanted):
    x, w, b, dy = _layouts(dtype)[layout]
    got = _grads(_ln(fusedops), (x, w, b), dy, wanted)
    want = _grads(_ln(F), (x, w, b), dy, wanted)
    for g, t in zip(got, want):
        _close(g, t, TOL[dtype])
    got = _grads(lambda x, w: fusedops.rms_norm(x, (7,), w), (x, w), dy, wanted[:2])
    want = _grads(lambda x, w: F.rms_norm(x, (7,), w), (x, w), dy, wanted[:2])
    for g, t in zip(got, want):
        _close(g, t, TOL[dtype])


@pytest.mark.parametrize("dtype", [D, torch.float16])
def test_permuted_input_with_multi_dim_normalized_shape(route, dtype):
    x = torch.randn(3, 4, 2, 5, dtype=dtype).permute(0, 3, 1, 2)       # (3, 5, 4, 2), rows not one stride
    w, b = torch.randn(2, 4, dtype=dtype).t(), torch.randn(4, 2, dtype=dtype)
    dy = torch.randn(3, 2, 4, 5, dtype=dtype).transpose(1, 3)
    got = _grads(_ln(fusedops), (x, w, b), dy, (1, 1, 1))
    want = _grads(_ln(F), (x, w, b), dy, (1, 1, 1))
    assert got[0].is_contiguous() and got[1].stride() == want[1].stride()
    for g, t in zip(got, want):
        _close(g, t, TOL[dtype])


@pytest.mark.parametrize("shape, normalized", [((0, 7), (7,)), ((3, 0, 7), (7,)), ((3, 0), (0,)), ((7,), (7,)),
                                               ((4, 1), (1,))], ids=str)
def test_norm_degenerate_sizes_match_torch(route, shape, normalized):
    x, dy = torch.randn(shape, dtype=D), torch.randn(shape, dtype=D)
    w, b = torch.randn(normalized, dtype=D), torch.randn(normalized, dtype=D)
    got = _grads(lambda x, w, b: fusedops.layer_norm(x, normalized, w, b), (x, w, b), dy, (1, 1, 1))
    want = _grads(lambda x, w, b: F.layer_norm(x, normalized, w, b), (x, w, b), dy, (1, 1, 1))
    for g, t in zip(got, want):
        _close(g, t, 1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_more_than_65535_rows(interpret, dtype):
    # Apex FusedLayerNorm (NVIDIA/apex#411): wrong results from 2**16 rows on.
    m = 70000
    x, w, b, dy = (torch.randn(m, 3, dtype=dtype), torch.randn(3, dtype=dtype), torch.randn(3, dtype=dtype),
                   torch.randn(m, 3, dtype=dtype))
    got = _grads(_ln(fusedops), (x, w, b), dy, (1, 1, 1))
    want = [t.to(dtype) for t in _grads(_ln(F), (x.double(), w.double(), b.double()), dy.double(), (1, 1, 1))]
    for g, t in zip(got, want):
        _close(g, t, 4 * TOL[dtype])
    for dim in (0, -1):
        got = _grads(lambda x: fusedops.softmax(x, dim), (x,), dy, (1,))
        want = [t.to(dtype) for t in _grads(lambda x: torch.softmax(x, dim), (x.double(),), dy.double(), (1,))]
        for g, t in zip(got, want):
            _close(g, t, 2 * TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, D])
def test_rows_of_70000_columns(interpret, dtype):
    n = 70000
    x = (torch.randn(2, n, dtype=D) * 3 + 5).to(dtype)
    w, b, dy = torch.randn(n, dtype=dtype), torch.randn(n, dtype=dtype), torch.randn(2, n, dtype=dtype)
    tol = {D: 1e-6, torch.float32: 1e-5, torch.bfloat16: 3e-2}[dtype]     # float64: see the defect above
    got = _grads(_ln(fusedops), (x, w, b), dy, (1, 1, 1))
    want = [t.to(dtype) for t in _grads(_ln(F), (x.double(), w.double(), b.double()), dy.double(), (1, 1, 1))]
    for g, t in zip(got, want):
        _close(g, t, tol)
    got = _grads(lambda x, w: fusedops.rms_norm(x, (n,), w), (x, w), dy, (1, 1))
    want = [t.to(dtype) for t in _grads(lambda x, w: F.rms_norm(x, (n,), w, torch.finfo(dtype).eps if dtype != D
                                                                 else None), (x.double(), w.double()), dy.double(),
                                        (1, 1))]
    for g, t in zip(got, want):
        _close(g, t, max(tol, 1e-12 if dtype == D else tol))


# -------------------------------------------------------------------------------------------------
# Softmax / log_softmax
# -------------------------------------------------------------------------------------------------
SOFTMAXES = [(fusedops.softmax, torch.softmax), (fusedops.log_softmax, torch.log_softmax)]


def _special_rows(dtype):
    return torch.tensor([[NINF] * 6, [0, NINF, 1, NINF, 2, 3], [INF, 0, 0, 0, 0, 0], [NAN, 0, 0, 0, 0, 0],
                         [INF, INF, 0, 0, 0, 0], [NINF, INF, 0, 1, 2, 3]], dtype=D).to(dtype)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("dim", [0, 1, -1, -2])
@pytest.mark.parametrize("ops", SOFTMAXES, ids=["softmax", "log_softmax"])
def test_softmax_special_rows_on_every_dim_match_torch(route, dtype, dim, ops):
    ours, theirs = ops
    x, dy = _special_rows(dtype), torch.randn(6, 6, dtype=dtype)
    got = _grads(lambda x: ours(x, dim), (x,), dy, (1,))
    want = _grads(lambda x: theirs(x, dim), (x,), dy, (1,))
    for g, t in zip(got, want):
        _close(g, t, TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, D])
@pytest.mark.parametrize("n", [1500, 70000])
@pytest.mark.parametrize("ops", SOFTMAXES, ids=["softmax", "log_softmax"])
def test_softmax_long_rows_whose_first_blocks_are_all_minus_inf(interpret, dtype, n, ops):
    # online softmax: a running max of -inf must not turn into exp(-inf - -inf) = NaN
    ours, theirs = ops
    x = torch.randn(3, n, dtype=D)
    x[0, :n - 3] = NINF
    x[1, :] = NINF
    x[1, n // 2] = 0.5
    x[2, n // 3:] = NINF
    x, dy = x.to(dtype), torch.randn(3, n, dtype=dtype)
    for dim, xs, dys in ((-1, x, dy), (0, x.t().contiguous(), dy.t().contiguous())):
        got = _grads(lambda t: ours(t, dim), (xs,), dys, (1,))
        same = _grads(lambda t: theirs(t, dim), (xs,), dys, (1,))
        exact = _grads(lambda t: theirs(t, dim), (xs.double(),), dys.double(), (1,))
        for g, t, e in zip(got, same, exact):
            if dtype == D:      # torch's float64 is the reference: only the summation order differs
                _close(g, t, 1e-11)
            else:
                _no_worse_than_torch(g, t, e)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("ops", SOFTMAXES, ids=["softmax", "log_softmax"])
def test_softmax_shapes_and_layouts_match_torch(route, dtype, ops):
    ours, theirs = ops
    cases = [(torch.tensor(2.0, dtype=dtype), 0, torch.tensor(1.0, dtype=dtype)),
             (torch.tensor(2.0, dtype=dtype), -1, torch.tensor(1.0, dtype=dtype)),
             (torch.randn(5, dtype=dtype), 0, torch.randn(5, dtype=dtype)),
             (torch.randn(2, 5, 3, dtype=dtype), 1, torch.randn(2, 5, 3, dtype=dtype)),
             (torch.randn(2, 3, 5, dtype=dtype).transpose(1, 2), 1, torch.randn(2, 3, 5, dtype=dtype).transpose(1, 2)),
             (torch.randn(1, 5, dtype=dtype).expand(3, 5), -1, torch.randn(5, dtype=dtype).expand(3, 5)),
             (torch.randn(1, 5, dtype=dtype).expand(3, 5), 0, torch.randn(5, dtype=dtype).expand(3, 5)),
             (torch.randn(40, dtype=dtype).as_strided((4, 8), (3, 1)), -1, torch.randn(4, 8, dtype=dtype)),
             (torch.randn(0, 5, dtype=dtype), -1, torch.randn(0, 5, dtype=dtype)),
             (torch.randn(3, 0, dtype=dtype), 0, torch.randn(3, 0, dtype=dtype)),
             (torch.randn(2, 3, 4, 5, dtype=dtype).permute(0, 2, 3, 1), 3, torch.randn(2, 4, 5, 3, dtype=dtype))]
    for x, dim, dy in cases:
        got = _grads(lambda t: ours(t, dim), (x,), dy, (1,))
        want = _grads(lambda t: theirs(t, dim), (x,), dy, (1,))
        assert got[0].stride() == want[0].stride()
        for g, t in zip(got, want):
            _close(g, t, TOL[dtype])


@pytest.mark.parametrize("x_dtype", FLOATS)
@pytest.mark.parametrize("out_dtype", FLOATS)
@pytest.mark.parametrize("ops", SOFTMAXES, ids=["softmax", "log_softmax"])
def test_softmax_dtype_argument_matches_torch(route, x_dtype, out_dtype, ops):
    ours, theirs = ops
    x, dy = torch.randn(4, 6, dtype=x_dtype), torch.randn(4, 6, dtype=out_dtype)
    got = _grads(lambda t: ours(t, -1, dtype=out_dtype), (x,), dy, (1,))
    want = _grads(lambda t: theirs(t, -1, dtype=out_dtype), (x,), dy, (1,))
    assert got[0].dtype == out_dtype and got[1].dtype == x_dtype
    for g, t in zip(got, want):
        _close(g, t, max(TOL[x_dtype], TOL[out_dtype]))


def test_softmax_integer_and_bool_inputs_need_a_dtype(route):
    xi = torch.randint(0, 5, (3, 4))
    _close(fusedops.softmax(xi, -1, dtype=torch.float32), torch.softmax(xi, -1, dtype=torch.float32), 1e-6)
    _close(fusedops.log_softmax(xi > 2, -1, dtype=torch.float16), torch.log_softmax(xi > 2, -1, dtype=torch.float16),
           4e-3)
    with pytest.raises(TypeError, match="input"):
        fusedops.softmax(xi, -1)
    for dtype in (torch.int64, torch.complex64, "float32"):
        with pytest.raises(TypeError, match="dtype"):
            fusedops.softmax(torch.randn(3, 4), -1, dtype=dtype)
    for dim in (1.0, None, True, torch.tensor([1])):
        with pytest.raises(TypeError, match="dim"):
            fusedops.softmax(torch.randn(3, 4), dim)
    with pytest.raises(IndexError, match="Dimension out of range"):
        fusedops.softmax(torch.randn(3, 4), 2)


# -------------------------------------------------------------------------------------------------
# Non-finite norm inputs
# -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("row", [[INF, 0, 1, 2, 3, 4], [NAN, 0, 1, 2, 3, 4], [NINF] * 6, [INF, NINF, 0, 0, 0, 0],
                                 [1e-30, 0, 0, 0, 0, 0], [0] * 6], ids=str)
def test_non_finite_and_tiny_norm_rows_match_torch(route, dtype, row):
    x = torch.tensor([row], dtype=D).to(dtype)
    w, b, dy = torch.randn(6, dtype=dtype), torch.randn(6, dtype=dtype), torch.randn(1, 6, dtype=dtype)
    got = _grads(_ln(fusedops), (x, w, b), dy, (1, 1, 1))
    want = _grads(_ln(F), (x, w, b), dy, (1, 1, 1))
    for g, t in zip(got, want):
        _close(g, t, TOL[dtype])
    got = _grads(lambda x, w: fusedops.rms_norm(x, (6,), w), (x, w), dy, (1, 1))
    want = _grads(lambda x, w: F.rms_norm(x, (6,), w), (x, w), dy, (1, 1))
    for g, t in zip(got, want):
        _close(g, t, TOL[dtype])


# -------------------------------------------------------------------------------------------------
# Autograd machinery
# -------------------------------------------------------------------------------------------------
def _ops(w, b):
    return {"layer_norm": (lambda t: fusedops.layer_norm(t, (5,), w, b), lambda t: F.layer_norm(t, (5,), w, b)),
            "rms_norm": (lambda t: fusedops.rms_norm(t, (5,), w), lambda t: F.rms_norm(t, (5,), w)),
            "softmax": (lambda t: fusedops.softmax(t, -1), lambda t: torch.softmax(t, -1)),
            "log_softmax": (lambda t: fusedops.log_softmax(t, 0), lambda t: torch.log_softmax(t, 0))}


@pytest.mark.parametrize("op", list(_ops(None, None)))
def test_double_backward_is_a_clear_error_not_a_silent_zero(interpret, op):
    w, b = torch.randn(5, dtype=D), torch.randn(5, dtype=D)
    ours, _ = _ops(w, b)[op]
    x = torch.randn(3, 5, dtype=D, requires_grad=True)
    y = ours(x)
    (g,) = torch.autograd.grad((y * torch.arange(15.0, dtype=D).view(3, 5)).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="twice"):
        torch.autograd.grad(g.pow(2).sum(), x)


@pytest.mark.parametrize("op", list(_ops(None, None)))
def test_gradcheck_and_torch_func_transforms(route, op):
    w, b = torch.randn(5, dtype=D), torch.randn(5, dtype=D)
    ours, theirs = _ops(w, b)[op]
    x = torch.randn(3, 5, dtype=D)
    assert torch.autograd.gradcheck(ours, (x.clone().requires_grad_(),))
    _close(torch.func.vmap(ours)(x), torch.func.vmap(theirs)(x), 1e-12)
    _close(torch.func.grad(lambda t: ours(t).pow(3).sum())(x), torch.func.grad(lambda t: theirs(t).pow(3).sum())(x),
           1e-12)
    for g, t in zip(torch.func.jvp(ours, (x,), (torch.ones_like(x),)),
                    torch.func.jvp(theirs, (x,), (torch.ones_like(x),))):
        _close(g, t, 1e-12)
    _close(torch.func.jacfwd(ours)(x), torch.func.jacfwd(theirs)(x), 1e-12)
    import torch.autograd.forward_ad as fwAD
    tangents = []
    for fn in (ours, theirs):
        with fwAD.dual_level():
            tangents.append(fwAD.unpack_dual(fn(fwAD.make_dual(x, torch.ones_like(x)))).tangent)
    _close(*tangents, 1e-12)


@pytest.mark.parametrize("x_dtype, p_dtype", [(D, D), (torch.float32, torch.float32), (torch.bfloat16, torch.float32)])
def test_is_grads_batched(route, x_dtype, p_dtype):
    x = torch.randn(2, 3, 4, dtype=x_dtype)
    w, b = torch.randn(3, 4, dtype=p_dtype), torch.randn(3, 4, dtype=p_dtype)
    dys = torch.randn(5, 2, 3, 4, dtype=x_dtype)
    for ours, theirs, n in [(lambda x, w, b: fusedops.layer_norm(x, (3, 4), w, b),
                             lambda x, w, b: F.layer_norm(x, (3, 4), w, b), 3),
                            (lambda x, w, b: fusedops.rms_norm(x, (3, 4), w), lambda x, w, b: F.rms_norm(x, (3, 4), w),
                             2),
                            (lambda x, w, b: fusedops.softmax(x, 1), lambda x, w, b: torch.softmax(x, 1), 1)]:
        results = []
        for fn in (ours, theirs):
            leaves = [t.clone().requires_grad_() for t in (x, w, b)]
            y = fn(*leaves)
            results.append(torch.autograd.grad(y, leaves[:n], dys, is_grads_batched=True))
        for g, t in zip(*results):
            _close(g, t, 2 * TOL[x_dtype])


@pytest.mark.parametrize("op", list(_ops(None, None)))
def test_checkpoint_and_saved_tensor_hooks(route, op):
    w, b = torch.randn(5, dtype=D), torch.randn(5, dtype=D)
    ours, theirs = _ops(w, b)[op]
    x, dy = torch.randn(3, 5, dtype=D), torch.randn(3, 5, dtype=D)

    def hooked(fn):
        def run(t):
            with torch.autograd.graph.saved_tensors_hooks(lambda s: s.detach().t().contiguous().t() if s.dim() == 2
                                                          else s.detach().clone(), lambda s: s):
                return fn(t)
        return run

    def offloaded(fn):
        def run(t):
            with torch.autograd.graph.save_on_cpu():
                return fn(t)
        return run

    for wrap in (lambda fn: (lambda t: torch.utils.checkpoint.checkpoint(fn, t, use_reentrant=False)), hooked,
                 offloaded):
        got = _grads(wrap(ours), (x,), dy, (1,))
        want = _grads(theirs, (x,), dy, (1,))
        for g, t in zip(got, want):
            _close(g, t, 1e-12)


@pytest.mark.parametrize("op", list(_ops(None, None)))
def test_in_place_changes_after_the_forward_are_caught(route, op):
    w = torch.randn(5, dtype=D, requires_grad=True)
    ours, _ = _ops(w, None)[op]
    x = torch.randn(3, 5, dtype=D, requires_grad=True)
    xi = x.clone()
    y = ours(xi)
    if op in ("softmax", "log_softmax"):
        y.mul_(2)                       # the saved output
    else:
        xi.add_(1)                      # the saved input
    with pytest.raises(RuntimeError, match="inplace"):
        y.sum().backward()


def test_input_that_is_also_the_weight(route):
    w = torch.randn(4, dtype=D)
    dy = torch.arange(12.0, dtype=D).view(3, 4)
    for ours, theirs in ((fusedops.layer_norm, F.layer_norm), (fusedops.rms_norm, F.rms_norm)):
        got = _grads(lambda w: ours(w.unsqueeze(0).expand(3, 4), (4,), w), (w,), dy, (1,))
        want = _grads(lambda w: theirs(w.unsqueeze(0).expand(3, 4), (4,), w), (w,), dy, (1,))
        for g, t in zip(got, want):
            _close(g, t, 1e-12)


def test_torch_compile_fullgraph(interpret):
    torch._dynamo.reset()
    x, w, dy = torch.randn(3, 5), torch.randn(5), torch.randn(3, 5)
    cases = [(lambda x, w: fusedops.layer_norm(x, (5,), w, w * 0.5), lambda x, w: F.layer_norm(x, (5,), w, w * 0.5)),
             (lambda x, w: fusedops.rms_norm(x, [5], w, None), lambda x, w: F.rms_norm(x, (5,), w, None)),
             (lambda x, w: fusedops.softmax(x * w, 0), lambda x, w: torch.softmax(x * w, 0)),
             (lambda x, w: fusedops.log_softmax(x * w, -1, dtype=D), lambda x, w: torch.log_softmax(x * w, -1, dtype=D))]
    for ours, theirs in cases:
        compiled = torch.compile(ours, backend="aot_eager", fullgraph=True)
        got = _grads(compiled, (x, w), dy.to(theirs(x, w).dtype), (1, 1))
        want = _grads(theirs, (x, w), dy.to(theirs(x, w).dtype), (1, 1))
        for g, t in zip(got, want):
            _close(g, t, 2e-6)
    torch._dynamo.reset()


# -------------------------------------------------------------------------------------------------
# Modules
# -------------------------------------------------------------------------------------------------
MODULES = [(fnn.LayerNorm, torch.nn.LayerNorm, {}), (fnn.LayerNorm, torch.nn.LayerNorm, dict(elementwise_affine=False)),
           (fnn.LayerNorm, torch.nn.LayerNorm, dict(bias=False)), (fnn.LayerNorm, torch.nn.LayerNorm, dict(eps=0)),
           (fnn.RMSNorm, torch.nn.RMSNorm, {}), (fnn.RMSNorm, torch.nn.RMSNorm, dict(elementwise_affine=False)),
           (fnn.RMSNorm, torch.nn.RMSNorm, dict(eps=0.1))]


@pytest.mark.parametrize("classes", MODULES, ids=lambda c: f"{c[0].__name__}-{c[2]}")
@pytest.mark.parametrize("shape", [8, [8], (2, 4), torch.Size([2, 4])], ids=repr)
def test_module_round_trips_match_torch(route, classes, shape):
    ours_cls, torch_cls, kwargs = classes
    reference = torch_cls(shape, dtype=D, **kwargs)
    with torch.no_grad():
        for p in reference.parameters():
            p.normal_()
    module = ours_cls(shape, dtype=D, **kwargs)
    assert str(module.load_state_dict(reference.state_dict(), strict=True)) == "<All keys matched successfully>"
    assert repr(module) == repr(reference) and isinstance(module, torch_cls)
    assert list(module.state_dict()) == list(reference.state_dict())
    tail = (shape,) if isinstance(shape, int) else tuple(shape)
    x = torch.randn(3, *tail, dtype=D)
    want = reference(x)
    for copy_ in (module, copy.deepcopy(module), pickle.loads(pickle.dumps(module))):
        _close(copy_(x), want, 1e-12)
    _close(copy.deepcopy(module).float()(x.float()), copy.deepcopy(reference).float()(x.float()), 2e-6)
    _close(copy.deepcopy(module).float()(x.bfloat16()), copy.deepcopy(reference).float()(x.bfloat16()), 3e-2)
    # meta device, then materialized with reset_parameters
    meta, meta_ref = ours_cls(shape, device="meta", **kwargs), torch_cls(shape, device="meta", **kwargs)
    y = meta(torch.empty(3, *tail, device="meta"))
    assert y.device.type == "meta" and y.shape == (3, *tail)
    meta, meta_ref = meta.to_empty(device="cpu"), meta_ref.to_empty(device="cpu")
    meta.reset_parameters()
    meta_ref.reset_parameters()
    _close(meta(x.float()), meta_ref(x.float()), 2e-6)


def test_rms_norm_module_of_another_dtype_than_its_input(route):
    reference = torch.nn.RMSNorm(8, dtype=torch.float16)
    with torch.no_grad():
        reference.weight.normal_()
    module = fnn.RMSNorm(8, dtype=torch.float16)
    module.load_state_dict(reference.state_dict())
    x = torch.randn(3, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = _grads(lambda x, w: torch.func.functional_call(module, {"weight": w}, (x,)), (x, module.weight),
                     x, (1, 1))
        want = _grads(lambda x, w: torch.func.functional_call(reference, {"weight": w}, (x,)), (x, reference.weight),
                      x, (1, 1))
    assert [t.dtype for t in got] == [torch.float32, torch.float32, torch.float16]
    for g, t in zip(got, want):
        _close(g, t, 4e-3)


def test_module_input_errors_are_runtime_errors_like_torch(route):
    for module in (fnn.LayerNorm(8), fnn.RMSNorm(8)):
        with pytest.raises(RuntimeError, match="normalized_shape"):
            module(torch.randn(3, 4))
        with pytest.raises(TypeError):
            module([1.0] * 8)


@pytest.mark.parametrize("ndim", [0, 1, 2, 3, 4])
@pytest.mark.parametrize("classes", [(fnn.Softmax, torch.nn.Softmax), (fnn.LogSoftmax, torch.nn.LogSoftmax)],
                         ids=["Softmax", "LogSoftmax"])
def test_softmax_modules_match_torch(route, ndim, classes):
    ours_cls, torch_cls = classes
    x = torch.randn([3] * ndim, dtype=D)
    for dim in (None, 0, -1):
        with warnings.catch_warnings(record=True) as ours_warnings:
            warnings.simplefilter("always")
            got = ours_cls(dim)(x)
        with warnings.catch_warnings(record=True) as torch_warnings:
            warnings.simplefilter("always")
            want = torch_cls(dim)(x)
        assert len(ours_warnings) == len(torch_warnings)
        assert repr(ours_cls(dim)) == repr(torch_cls(dim))
        _close(got, want, 1e-12)
    module = pickle.loads(pickle.dumps(ours_cls(-1)))
    _close(module(x), torch_cls(-1)(x), 1e-12)
    assert module.state_dict() == {}


# -------------------------------------------------------------------------------------------------
# Errors for bad arguments: Python errors naming the argument
# -------------------------------------------------------------------------------------------------
def test_bad_arguments_raise_python_errors_naming_the_argument(route):
    x = torch.randn(3, 4)
    cases = [(lambda: fusedops.softmax([1.0, 2.0], 0), TypeError, "input"),
             (lambda: fusedops.layer_norm([1.0, 2.0], (2,)), TypeError, "input"),
             (lambda: fusedops.layer_norm(torch.randint(0, 3, (3, 4)), (4,)), TypeError, "input"),
             (lambda: fusedops.rms_norm(torch.randint(0, 3, (3, 4)), (4,)), TypeError, "input"),
             (lambda: fusedops.rms_norm(x, (4,), [1.0] * 4), TypeError, "weight"),
             (lambda: fusedops.layer_norm(x, (4,), None, [1.0] * 4), TypeError, "bias"),
             (lambda: fusedops.layer_norm(x, (4,), torch.ones(3)), ValueError, "weight"),
             (lambda: fusedops.layer_norm(x, (4,), None, torch.ones(4, 1)), ValueError, "bias"),
             (lambda: fusedops.layer_norm(x, (4,), torch.ones(4, device="meta")), ValueError, "weight"),
             (lambda: fusedops.layer_norm(x, (4,), eps="1e-5"), TypeError, "eps"),
             (lambda: fusedops.layer_norm(x, (4,), eps=None), TypeError, "eps"),
             (lambda: fusedops.layer_norm(x, (4,), eps=torch.tensor([1e-5])), TypeError, "eps"),
             (lambda: fusedops.rms_norm(x, (4,), eps=1j), TypeError, "eps"),
             (lambda: fusedops.rms_norm(x, (4,), torch.ones(4, dtype=torch.complex64)), TypeError, "weight")]
    for call, error, name in cases:
        with pytest.raises(error, match=name):
            call()
    # integer and bool weights are converted, as torch takes them
    for w in (torch.arange(4), torch.tensor([True, False, True, True]), torch.tensor([2 ** 40 + 1, 3, 5, 7])):
        _close(fusedops.rms_norm(x, (4,), w), F.rms_norm(x, (4,), w), 2e-6)
        _close(fusedops.rms_norm(x.double(), (4,), w), F.rms_norm(x.double(), (4,), w), 1e-12)
