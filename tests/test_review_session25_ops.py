"""Review (session 25, ops): a demanding PyTorch user tried to break the public ops (fusedops.softmax,
log_softmax, layer_norm, rms_norm, matmul, scaled_dot_product_attention) and the fusedops.nn modules
(Softmax, LayerNorm, RMSNorm, Linear, MultiheadAttention, patch) on the CPU, with cases taken from real
PyTorch bug reports (fully masked SDPA rows, is_causal with L != S, float key_padding_mask with positive
values (pytorch#136816), fully masked heads (pytorch#160064), rms_norm's default eps, layer_norm's mixed
CPU dtypes, matmul's 1-D broadcasting, expanded/transposed/offset inputs, empty tensors, CPU autocast, ...).
torch is the oracle: same arguments, values against a float64 reference, output dtype and shape, the error
raised, gradients. Most tests run on both CPU routes (`route`: the kernels in the NumPy interpreter, what
CUDA tensors take, and torch's fallback).

Defect found (fixed: a bias of another shape than (out_features,) runs F.linear; its tests now pass):
- fusedops.nn.Linear (and fusedops.nn.patch()ed torch.nn.Linear) rejects a bias that torch.nn.Linear /
  F.linear broadcast onto the output (a (1,) or 0-d bias, e.g. after `lin.bias = nn.Parameter(torch.zeros(1))`):
  ValueError "fusedops.matmul(): bias must be a 1-D tensor of 4 elements, got (1,)" (naming fusedops.matmul,
  and a ValueError where the module documents torch's RuntimeError), where torch returns x @ W^T + b; the
  same after fusedops.nn.patch() of a torch.nn.Linear (patch is documented as keeping the outputs).

Checked and matching torch (plain tests below); also seen and not flagged: torch's own eval/no_grad fast
path of nn.MultiheadAttention gives NaN for fully padded rows and ignores `is_causal` without a mask, where
its regular path (and fusedops, always) gives 0 / raises; torch accepts SDPA inputs with mismatched head
counts when the batch or L is 0 (fusedops raises the broadcasting error); fusedops.matmul keeps its own
argument names (a, b), not torch.matmul's (input, other); after SDPA's forward an in-place change of q or k
makes fusedops' backward raise (it saves them, like torch's CUDA flash/cuDNN backends) where torch's CPU math
backend, which does not save them, backpropagates (both raise for v).
"""

from __future__ import annotations

import copy
import math
import warnings

import pytest
import torch
import torch.nn.functional as F

import fusedops
import fusedops.nn as fnn

D = torch.float64
DTYPES = [torch.float64, torch.float32, torch.bfloat16, torch.float16]
# tolerance on |fusedops - torch| relative to (1 + max |reference|), per output dtype
TOL = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}
INF = float("inf")


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _randn(g, *shape, dtype=torch.float32):
    return torch.randn(tuple(shape), generator=g, dtype=torch.float64).to(dtype)


def assert_like(ours, theirs, tol=None):
    """Same shape and dtype, same NaN positions, values within the dtype's tolerance."""
    assert isinstance(ours, torch.Tensor), type(ours)
    assert ours.shape == theirs.shape, (ours.shape, theirs.shape)
    assert ours.dtype == theirs.dtype, (ours.dtype, theirs.dtype)
    if ours.numel() == 0:
        return
    a, b = ours.double(), theirs.double()
    assert torch.equal(a.isnan(), b.isnan()), "NaN positions differ"
    finite = b.isfinite() & a.isfinite()
    assert torch.equal(a[~finite & ~a.isnan()], b[~finite & ~b.isnan()]), "inf positions differ"
    tol = TOL[theirs.dtype] if tol is None else tol
    scale = 1 + (b[finite].abs().max().item() if finite.any() else 0)
    diff = (a[finite] - b[finite]).abs().max().item() if finite.any() else 0.0
    assert diff <= tol * scale, (diff, tol * scale)


def same_error(ours_call, torch_call):
    """Both raise (fusedops may use a more specific type); returns fusedops' exception."""
    with pytest.raises(Exception) as theirs:
        torch_call()
    with pytest.raises(Exception) as ours:
        ours_call()
    return ours.value, theirs.value


def grads(fn, inputs, grad_out=None):
    inputs = [t.detach().clone().requires_grad_(t.is_floating_point()) for t in inputs]
    y = fn(*inputs)
    g = torch.ones_like(y) if grad_out is None else grad_out.to(y.dtype)
    wanted = [t for t in inputs if t.requires_grad]
    return y, torch.autograd.grad(y, wanted, g, allow_unused=True) if y.numel() else [torch.zeros_like(t) for t in wanted]


# ------------------------------------------------------------------------------------------------
# softmax / log_softmax
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("log", [False, True])
def test_softmax_values_dims_and_layouts(route, dtype, log, seed):
    g = _gen(seed)
    ours_op, torch_op = (fusedops.log_softmax, torch.log_softmax) if log else (fusedops.softmax, torch.softmax)
    x = _randn(g, 3, 5, 7, dtype=dtype) * 4
    views = [x, x.transpose(0, 2), x[:1, ::2].expand(4, 3, 7)[..., 1:]]
    for v in views:
        for dim in (-3, -2, -1, 0, 2):
            assert_like(ours_op(v, dim), torch_op(v, dim))
    assert_like(ours_op(input=x, dim=-1), torch_op(input=x, dim=-1))      # keywords as torch's


@pytest.mark.parametrize("in_dtype", DTYPES)
@pytest.mark.parametrize("out_dtype", DTYPES)
def test_softmax_dtype_argument(route, in_dtype, out_dtype, seed):
    """torch casts the input to `dtype` first (also a lossy downcast), result in `dtype`; the gradient is in
    the input's dtype."""
    g = _gen(seed)
    x = _randn(g, 4, 9, dtype=in_dtype) * 3
    for log, ours_op, torch_op in ((False, fusedops.softmax, torch.softmax),
                                   (True, fusedops.log_softmax, torch.log_softmax)):
        assert_like(ours_op(x, 1, dtype=out_dtype), torch_op(x, 1, dtype=out_dtype))
        assert_like(ours_op(x, 0, out_dtype), torch_op(x, 0, out_dtype))    # positional dtype
        gy = _randn(g, 4, 9, dtype=out_dtype)
        y1, (g1,) = grads(lambda t: ours_op(t, 1, dtype=out_dtype), [x], gy)
        y2, (g2,) = grads(lambda t: torch_op(t, 1, dtype=out_dtype), [x], gy)
        assert g1.dtype == g2.dtype == in_dtype
        assert_like(g1, g2, tol=max(TOL[in_dtype], TOL[out_dtype]) * 4)   # dy flows through out_dtype


def test_softmax_integer_input_with_dtype_and_python_float(route):
    x = torch.arange(12).view(3, 4)
    assert_like(fusedops.softmax(x, 1, dtype=torch.float32), torch.softmax(x, 1, dtype=torch.float32))
    assert_like(fusedops.log_softmax(x, 0, dtype=torch.float16), torch.log_softmax(x, 0, dtype=torch.float16))
    b = torch.ones(2, 3, dtype=torch.bool)
    assert_like(fusedops.softmax(b, 1, dtype=torch.float32), torch.softmax(b, 1, dtype=torch.float32))
    xf = torch.randn(3, 4)
    assert_like(fusedops.softmax(xf, 1, dtype=float), torch.softmax(xf, 1, dtype=float))   # float -> float64


@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_special_rows(route, dtype):
    """All -inf rows give NaN (pytorch 'softmax all -inf row nan'), +inf / NaN propagate as torch's."""
    x = torch.tensor([[-INF] * 4, [0, 1, 2, 3.], [INF, 1, 2, 3], [float("nan"), 1, 2, 3], [INF, INF, 1, 1],
                      [-INF, 0, -INF, 1], [-3e38, -3e38, -INF, 5]]).to(dtype)
    for ours_op, torch_op in ((fusedops.softmax, torch.softmax), (fusedops.log_softmax, torch.log_softmax)):
        assert_like(ours_op(x, 1), torch_op(x, 1))
        assert_like(ours_op(x.t(), 0), torch_op(x.t(), 0))


def test_softmax_degenerate_shapes(route):
    for x, dim in ((torch.tensor(2.5), 0), (torch.tensor(2.5), -1), (torch.randn(0, 3), 0), (torch.randn(0, 3), 1),
                   (torch.randn(3, 0), 1), (torch.randn(3, 1), 1), (torch.randn(1, 5), 0)):
        assert_like(fusedops.softmax(x, dim), torch.softmax(x, dim))
        assert_like(fusedops.log_softmax(x, dim), torch.log_softmax(x, dim))


def test_softmax_argument_errors(route):
    import numpy as np

    x = torch.randn(3, 4)
    for dim in (2, -3):
        err, _ = same_error(lambda: fusedops.softmax(x, dim), lambda: torch.softmax(x, dim))
        assert isinstance(err, IndexError) and "Dimension out of range" in str(err)
    for dim in (True, 1.0, None):
        err, _ = same_error(lambda: fusedops.softmax(x, dim), lambda: torch.softmax(x, dim))
        assert isinstance(err, TypeError) and "dim" in str(err)
    same_error(lambda: fusedops.softmax(torch.arange(4), 0), lambda: torch.softmax(torch.arange(4), 0))
    same_error(lambda: fusedops.softmax(x, 1, dtype="float32"), lambda: torch.softmax(x, 1, dtype="float32"))
    # integer-like dims torch takes
    assert_like(fusedops.softmax(x, np.int64(1)), torch.softmax(x, np.int64(1)))
    assert_like(fusedops.softmax(x, torch.tensor(0)), torch.softmax(x, torch.tensor(0)))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_softmax_long_rows_and_columns(interpret, dtype, seed):
    """Row sweeps past the one-pass blocks and column tiles, forward and backward."""
    g = _gen(seed)
    for shape, dim in (((2, 1030, 3), 1), ((3, 5000), 1), ((5000, 3), 0), ((2, 4097, 2), 1)):
        x = _randn(g, *shape, dtype=dtype) * 3
        x.view(-1)[7] = -INF
        gy = _randn(g, *shape, dtype=dtype)
        for ours_op, torch_op in ((fusedops.softmax, torch.softmax), (fusedops.log_softmax, torch.log_softmax)):
            y1, (g1,) = grads(lambda t: ours_op(t, dim), [x], gy)
            y2, (g2,) = grads(lambda t: torch_op(t, dim), [x], gy)
            assert_like(y1, y2, tol=TOL[dtype] * 2)
            assert_like(g1, g2, tol=TOL[dtype] * 4)


# ------------------------------------------------------------------------------------------------
# layer_norm / rms_norm
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
def test_layer_norm_argument_forms(route, dtype, seed):
    g = _gen(seed)
    x = _randn(g, 4, 6, 10, dtype=dtype) + 3
    w, b = _randn(g, 10, dtype=dtype), _randn(g, 10, dtype=dtype)
    w2 = _randn(g, 6, 10, dtype=dtype)
    assert_like(fusedops.layer_norm(x, (10,), w, b), F.layer_norm(x, (10,), w, b))
    assert_like(fusedops.layer_norm(x, [10], None, b), F.layer_norm(x, [10], None, b))        # bias only
    assert_like(fusedops.layer_norm(x, torch.Size([10]), w), F.layer_norm(x, torch.Size([10]), w))
    assert_like(fusedops.layer_norm(x, (6, 10), w2, eps=1e-3), F.layer_norm(x, (6, 10), w2, eps=1e-3))
    assert_like(fusedops.layer_norm(input=x, normalized_shape=(10,), weight=w, bias=b, eps=0.1),
                F.layer_norm(input=x, normalized_shape=(10,), weight=w, bias=b, eps=0.1))
    # the int form torch.nn.LayerNorm takes (F.layer_norm wants a tuple; fusedops takes both)
    assert_like(fusedops.layer_norm(x, 10), F.layer_norm(x, (10,)))
    for v in (x.transpose(0, 1), x[:1].expand(5, 6, 10), x[..., ::1][:, 1:]):
        assert_like(fusedops.layer_norm(v, (10,), w, b), F.layer_norm(v, (10,), w, b))
    xt = x.transpose(0, 2)
    assert_like(fusedops.layer_norm(xt, (6, 4)), F.layer_norm(xt, (6, 4)))
    # a constant row (variance 0) and a large offset
    c = torch.full((3, 4), 7.0, dtype=dtype)
    assert_like(fusedops.layer_norm(c, (4,)), F.layer_norm(c, (4,)))
    # a large offset (catastrophic cancellation): fusedops no less accurate than torch (float64 reference of
    # the same rounded input; torch's float32 CPU kernel is the less accurate one here)
    shifted = x + 1000
    reference = F.layer_norm(shifted.double(), (10,))
    ours_err = (fusedops.layer_norm(shifted, (10,)).double() - reference).abs().max().item()
    torch_err = (F.layer_norm(shifted, (10,)).double() - reference).abs().max().item()
    assert ours_err <= max(torch_err, TOL[dtype] * 10), (ours_err, torch_err)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_layer_norm_mixed_cpu_dtypes(route, dtype, seed):
    """torch's CPU kernel takes a 16-bit input with float32 weight and bias (what CPU autocast hands a LayerNorm);
    a float32 weight with a 16-bit bias, or a float64 weight, raises in both."""
    g = _gen(seed)
    x = _randn(g, 3, 7, 5, dtype=dtype)
    w, b = _randn(g, 5), _randn(g, 5)
    gy = _randn(g, 3, 7, 5, dtype=dtype)
    y1, g1 = grads(lambda t, w, b: fusedops.layer_norm(t, (5,), w, b), [x, w, b], gy)
    y2, g2 = grads(lambda t, w, b: F.layer_norm(t, (5,), w, b), [x, w, b], gy)
    assert_like(y1, y2)
    for a, r in zip(g1, g2):
        assert a.dtype == r.dtype
        assert_like(a, r, tol=TOL[dtype] * 2)
    same_error(lambda: fusedops.layer_norm(x, (5,), w, b.to(dtype)), lambda: F.layer_norm(x, (5,), w, b.to(dtype)))
    same_error(lambda: fusedops.layer_norm(x, (5,), w.double()), lambda: F.layer_norm(x, (5,), w.double()))


def test_layer_norm_errors_name_the_argument(route):
    x = torch.randn(4, 6, 10)
    err, _ = same_error(lambda: fusedops.layer_norm(x, (6,)), lambda: F.layer_norm(x, (6,)))
    assert "normalized_shape" in str(err)
    err, _ = same_error(lambda: fusedops.layer_norm(x, (10,), torch.randn(9)), lambda: F.layer_norm(x, (10,), torch.randn(9)))
    assert "weight" in str(err)
    err, _ = same_error(lambda: fusedops.layer_norm(x, (10,), None, torch.randn(9)),
                        lambda: F.layer_norm(x, (10,), None, torch.randn(9)))
    assert "bias" in str(err)
    err, _ = same_error(lambda: fusedops.layer_norm(x.double(), (10,), torch.randn(10)),
                        lambda: F.layer_norm(x.double(), (10,), torch.randn(10)))
    assert "weight" in str(err)
    same_error(lambda: fusedops.layer_norm(x, ()), lambda: F.layer_norm(x, ()))
    same_error(lambda: fusedops.layer_norm(x.long(), (10,)), lambda: F.layer_norm(x.long(), (10,)))
    same_error(lambda: fusedops.layer_norm(x, 10.0), lambda: F.layer_norm(x, 10.0))


def test_norms_empty_and_size_one(route):
    for x, ns in ((torch.randn(0, 5), (5,)), (torch.randn(3, 0), (0,)), (torch.randn(3, 1), (1,)),
                  (torch.arange(5.), (5,))):
        assert_like(fusedops.layer_norm(x, ns), F.layer_norm(x, ns))
        assert_like(fusedops.rms_norm(x, ns), F.rms_norm(x, ns))
    w = torch.randn(4, requires_grad=True)
    for ours_op, torch_op in ((fusedops.layer_norm, F.layer_norm), (fusedops.rms_norm, F.rms_norm)):
        x = torch.randn(0, 4)
        y1, (gx1, gw1) = grads(lambda t, w: ours_op(t, (4,), w), [x, w])
        y2, (gx2, gw2) = grads(lambda t, w: torch_op(t, (4,), w), [x, w])
        assert_like(y1, y2)
        assert gx1.shape == gx2.shape


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_default_eps_and_weight_dtypes(route, dtype, seed):
    """eps=None is the accumulation dtype's epsilon (pytorch 'rms_norm eps default'); tiny rows show it."""
    g = _gen(seed)
    x = _randn(g, 4, 6, 10, dtype=dtype)
    tiny = (x.double() * (1e-4 if dtype.itemsize < 8 else 1e-9)).to(dtype)
    assert_like(fusedops.rms_norm(tiny, (10,)), F.rms_norm(tiny, (10,)))
    assert_like(fusedops.rms_norm(tiny, (10,), eps=None), F.rms_norm(tiny, (10,), eps=None))
    assert_like(fusedops.rms_norm(x, (10,), None, 1), F.rms_norm(x, (10,), None, 1))
    for wd in DTYPES:
        w = _randn(g, 10, dtype=wd)
        assert_like(fusedops.rms_norm(x, (10,), w), F.rms_norm(x, (10,), w))          # output: input's dtype
    assert_like(fusedops.rms_norm(x, [6, 10]), F.rms_norm(x, [6, 10]))
    zeros = torch.zeros(3, 4, dtype=dtype)
    assert_like(fusedops.rms_norm(zeros, (4,)), F.rms_norm(zeros, (4,)))


def test_rms_norm_integer_and_bool_weight(route):
    x = torch.randn(4, 10)
    assert_like(fusedops.rms_norm(x, (10,), torch.arange(10)), F.rms_norm(x, (10,), torch.arange(10)))
    ones = torch.ones(10, dtype=torch.bool)
    assert_like(fusedops.rms_norm(x, (10,), ones), F.rms_norm(x, (10,), ones))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_norms_long_rows_forward_backward(interpret, dtype, seed):
    g = _gen(seed)
    for n in (513, 2049, 4097, 12289):
        x = _randn(g, 3, n, dtype=dtype) + 5
        w, b = _randn(g, n, dtype=dtype), _randn(g, n, dtype=dtype)
        gy = _randn(g, 3, n, dtype=dtype)
        xt = _randn(g, n, 3, dtype=dtype).t()
        for v in (x, xt):
            y1, g1 = grads(lambda t, w, b: fusedops.layer_norm(t, (n,), w, b), [v, w, b], gy)
            r, gr = grads(lambda t, w, b: F.layer_norm(t, (n,), w, b), [v.double(), w.double(), b.double()], gy)
            assert_like(y1.double(), r, tol=TOL[dtype])
            for a, ref in zip(g1, gr):
                assert_like(a.double(), ref, tol=TOL[dtype] * 2)
        y1, g1 = grads(lambda t, w: fusedops.rms_norm(t, (n,), w), [x, w], gy)
        r, gr = grads(lambda t, w: F.rms_norm(t, (n,), w), [x.double(), w.double()], gy)
        assert_like(y1.double(), r, tol=TOL[dtype])
        for a, ref in zip(g1, gr):
            assert_like(a.double(), ref, tol=TOL[dtype] * 2)


def test_norm_gradients_of_strided_and_expanded_parameters(route):
    """weight and bias as strided views of one parameter, the input expanded (stride 0): gradients land
    in the shared parameter as torch's."""
    base = torch.randn(3, 10, dtype=D)
    for ours_op, torch_op in ((lambda x, w, b: fusedops.layer_norm(x, (5,), w, b),
                               lambda x, w, b: F.layer_norm(x, (5,), w, b)),
                              (lambda x, w, b: fusedops.rms_norm(x, (5,), w) + 0 * b.sum(),
                               lambda x, w, b: F.rms_norm(x, (5,), w) + 0 * b.sum())):
        results = []
        for op in (ours_op, torch_op):
            p = base.clone().requires_grad_()
            y = op(p[2:].expand(4, 1, 10)[..., ::2], p[0, ::2], p[1, 1::2])
            (y * torch.arange(y.numel(), dtype=D).view(y.shape)).sum().backward()
            results.append(p.grad)
        assert_like(results[0], results[1])


# ------------------------------------------------------------------------------------------------
# gradients: grad_output layouts (y.sum() gives a stride-0 dy), version counters, double backward
# ------------------------------------------------------------------------------------------------
_GRAD_CASES = {
    "softmax": (lambda x: fusedops.softmax(x, 1), lambda x: torch.softmax(x, 1), [(3, 4, 5)]),
    "log_softmax": (lambda x: fusedops.log_softmax(x, 0), lambda x: torch.log_softmax(x, 0), [(3, 4, 5)]),
    "softmax_dtype": (lambda x: fusedops.softmax(x, 1, dtype=D), lambda x: torch.softmax(x, 1, dtype=D),
                      [(3, 4, 5)]),
    "layer_norm": (lambda x, w, b: fusedops.layer_norm(x, (5,), w, b), lambda x, w, b: F.layer_norm(x, (5,), w, b),
                   [(3, 4, 5), (5,), (5,)]),
    "rms_norm": (lambda x, w: fusedops.rms_norm(x, (5,), w), lambda x, w: F.rms_norm(x, (5,), w), [(3, 4, 5), (5,)]),
    "matmul": (lambda a, b: fusedops.matmul(a, b), lambda a, b: a @ b, [(3, 4, 5), (5, 6)]),
    "matmul_silu": (lambda a, b, c: fusedops.matmul(a, b, c, "silu"), lambda a, b, c: F.silu(a @ b + c),
                    [(3, 4, 5), (5, 6), (6,)]),
    "sdpa": (lambda q, k, v: fusedops.scaled_dot_product_attention(q, k, v, is_causal=True),
             lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), [(2, 2, 5, 4), (2, 2, 6, 4),
                                                                                        (2, 2, 6, 3)]),
}


@pytest.mark.parametrize("case", sorted(_GRAD_CASES))
@pytest.mark.parametrize("loss", ["sum", "transposed", "broadcast_row", "expanded_scalar"])
def test_gradients_with_strided_grad_outputs(route, case, loss, seed):
    ours, theirs, shapes = _GRAD_CASES[case]
    g = _gen(seed)
    inputs = [_randn(g, *s) for s in shapes]
    row = _randn(g, 16)
    scalar = _randn(g, 1)

    def reduce(y):
        y = y.double()
        if loss == "sum":
            return y.sum()
        if loss == "transposed":
            return (y.transpose(0, -1) * torch.arange(y.shape[0], dtype=D)).sum()
        if loss == "broadcast_row":
            return (y * row[:y.shape[-1]]).mean()
        return (y * scalar.expand(y.shape[-1])).sum()

    results = []
    for op in (ours, theirs):
        leaves = [t.clone().requires_grad_() for t in inputs]
        results.append(torch.autograd.grad(reduce(op(*leaves)), leaves))
    for a, b in zip(*results):
        assert_like(a, b, tol=1e-4)


@pytest.mark.parametrize("case", ["softmax", "log_softmax"])
def test_inplace_change_of_saved_output_is_detected(route, case):
    ours, theirs, _ = _GRAD_CASES[case]
    for op in (ours, theirs):
        y = op(torch.randn(3, 4, 5, requires_grad=True) * 1)
        y.mul_(2)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.sum().backward()


@pytest.mark.parametrize("case", ["layer_norm", "rms_norm", "matmul", "sdpa"])
def test_inplace_change_of_saved_input_is_detected(route, case):
    ours, theirs, shapes = _GRAD_CASES[case]
    for op in (ours, theirs):
        leaves = [torch.randn(s, requires_grad=True) for s in shapes]
        inputs = [t * 1 for t in leaves]
        y = op(*inputs)
        # (attention: torch's CPU math backend does not save q and k themselves; both save v)
        inputs[2 if case == "sdpa" else 0].mul_(2)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.pow(2).sum().backward()


def test_double_backward_raises_only_when_reached(interpret):
    """once_differentiable semantics: create_graph=True works, a second backward through the op raises."""
    x = torch.randn(3, 4, dtype=D, requires_grad=True)
    w = torch.randn(4, dtype=D, requires_grad=True)
    loss = (fusedops.softmax(x, 1) * w).sum()
    (gw,) = torch.autograd.grad(loss, w, create_graph=True, retain_graph=True)
    assert gw.requires_grad
    (gx,) = torch.autograd.grad(loss, x, create_graph=True)
    with pytest.raises(RuntimeError):
        torch.autograd.grad(gx.pow(2).sum(), x)


def test_requires_grad_flags(route):
    x = torch.randn(3, 4)
    w = torch.randn(4, requires_grad=True)
    assert fusedops.layer_norm(x, (4,), w).requires_grad
    assert fusedops.rms_norm(x, (4,), w).requires_grad
    g1 = torch.autograd.grad(fusedops.rms_norm(x, (4,), w).sum(), w)[0]
    g2 = torch.autograd.grad(F.rms_norm(x, (4,), w).sum(), w)[0]
    assert_like(g1, g2)
    with torch.no_grad():
        xr = torch.randn(3, 4, requires_grad=True)
        assert not fusedops.softmax(xr, 1).requires_grad
        assert not fusedops.layer_norm(xr, (4,)).requires_grad
    with torch.inference_mode():
        xi = torch.randn(3, 4)
        assert fusedops.softmax(xi, 1).is_inference() == torch.softmax(xi, 1).is_inference()


# ------------------------------------------------------------------------------------------------
# matmul
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
def test_matmul_shape_rules_and_layouts(route, dtype, seed):
    g = _gen(seed)
    A, B = _randn(g, 3, 5, dtype=dtype), _randn(g, 5, 4, dtype=dtype)
    A4, B3 = _randn(g, 2, 1, 3, 5, dtype=dtype), _randn(g, 4, 5, 4, dtype=dtype)
    cases = [(A, B), (A[0], B[:, 0]), (A[0], B), (A, B[:, 0]), (A4, B3), (A[0], B3), (A4, B[:, 0]),
             (B.t(), A.t()), (A[:, :0], B[:0]), (A[:0], B), (A[:1].expand(6, 5), B),
             (torch.ones((), dtype=dtype).expand(3, 5), B), (A[:, ::2], B[::2]), (A[0, :0], B[:0, 0])]
    for a, b in cases:
        assert_like(fusedops.matmul(a, b), torch.matmul(a, b), tol=TOL[dtype] * 2)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_matmul_gradients_broadcast_and_1d(route, dtype, seed):
    g = _gen(seed)
    for sa, sb in (((2, 3, 4), (4, 5)), ((4,), (2, 4, 5)), ((4,), (4,)), ((2, 1, 3, 4), (3, 4, 5)), ((3, 4), (4,))):
        a, b = _randn(g, *sa, dtype=dtype), _randn(g, *sb, dtype=dtype)
        gy = _randn(g, *torch.matmul(a, b).shape, dtype=dtype)
        y1, g1 = grads(fusedops.matmul, [a, b], gy)
        y2, g2 = grads(torch.matmul, [a, b], gy)
        assert_like(y1, y2, tol=TOL[dtype] * 2)
        for x, y in zip(g1, g2):
            assert_like(x, y, tol=TOL[dtype] * 4)


def test_matmul_k0_bias_result_is_a_fresh_tensor(route):
    bias = torch.randn(4)
    y = fusedops.matmul(torch.randn(3, 0), torch.randn(0, 4), bias)
    assert_like(y, torch.matmul(torch.randn(3, 0), torch.randn(0, 4)) + bias)
    assert y.data_ptr() != bias.data_ptr() and y.is_contiguous()
    y.add_(1)
    assert not torch.equal(y[0], bias)


def test_matmul_errors(route):
    A = torch.randn(3, 5)
    for a, b in ((torch.tensor(2.0), A), (A, A), (A, A.double().t())):
        same_error(lambda: fusedops.matmul(a, b), lambda: torch.matmul(a, b))


# ------------------------------------------------------------------------------------------------
# scaled_dot_product_attention
# ------------------------------------------------------------------------------------------------
def _sdpa_both(*args, tol=None, **kwargs):
    assert_like(fusedops.scaled_dot_product_attention(*args, **kwargs),
                F.scaled_dot_product_attention(*args, **kwargs), tol=tol)


@pytest.mark.parametrize("dtype", DTYPES)
def test_sdpa_masks_causal_scale_gqa(route, dtype, seed):
    g = _gen(seed)
    tol = TOL[dtype] * 2
    q, k, v = _randn(g, 2, 3, 5, 8, dtype=dtype), _randn(g, 2, 3, 7, 8, dtype=dtype), _randn(g, 2, 3, 7, 6, dtype=dtype)
    _sdpa_both(q, k, v, tol=tol)
    _sdpa_both(q, k, v, is_causal=True, tol=tol)                            # L < S, top-left aligned
    _sdpa_both(k, q, q[..., :6], is_causal=True, tol=tol)                   # L > S
    for scale in (0.3, 0.0, -2.0, 2):
        _sdpa_both(q, k, v, scale=scale, tol=tol)
    keep = torch.rand(5, 7, generator=g) > 0.5
    _sdpa_both(q, k, v, attn_mask=keep, tol=tol)
    _sdpa_both(q, k, v, attn_mask=torch.rand(1, 1, 1, 7, generator=g) > 0.3, tol=tol)   # broadcast over L
    _sdpa_both(q, k, v, attn_mask=_randn(g, 2, 1, 5, 7, dtype=dtype), tol=tol)
    _sdpa_both(q, k, v, attn_mask=_randn(g, 1, 7), tol=tol)                              # float32 mask
    qg = _randn(g, 2, 6, 5, 8, dtype=dtype)
    _sdpa_both(qg, k, v, enable_gqa=True, tol=tol)
    _sdpa_both(qg, k, v, enable_gqa=True, is_causal=True, tol=tol)
    _sdpa_both(qg[0], k[0], v[0], enable_gqa=True, tol=tol)                              # 3-D GQA
    _sdpa_both(qg, k[:1], v[:1], enable_gqa=True, tol=tol)                               # kv batch 1
    _sdpa_both(q, k[:, :1], v[:, :1], tol=tol)                                           # broadcast heads
    _sdpa_both(q[0], k[0], v[0], tol=tol)
    _sdpa_both(q[0, 0], k[0, 0], v[0, 0], tol=tol)
    _sdpa_both(q.unsqueeze(0).expand(2, 2, 3, 5, 8), k, v, tol=tol)                      # 5-D, expanded
    _sdpa_both(q.transpose(1, 2).contiguous().transpose(1, 2), k.transpose(-1, -2).contiguous().transpose(-1, -2),
               v, tol=tol)
    _sdpa_both(q, k[:, :, :0], v[:, :, :0], tol=tol)                                     # S = 0
    _sdpa_both(q[:, :, :0], k, v, tol=tol)                                               # L = 0
    _sdpa_both(q, k, v[..., :0], tol=tol)                                                # Ev = 0
    _sdpa_both(q[..., :0], k[..., :0], v, tol=tol)                                       # E = 0


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_sdpa_fully_masked_rows_values_and_gradients(route, dtype, seed):
    """Rows whose every key is masked (pytorch#103963 style): a boolean and an additive -inf mask."""
    g = _gen(seed)
    q, k, v = _randn(g, 2, 2, 5, 4, dtype=dtype), _randn(g, 2, 2, 6, 4, dtype=dtype), _randn(g, 2, 2, 6, 3, dtype=dtype)
    keep = torch.rand(5, 6, generator=g) > 0.4
    keep[1] = False
    additive = torch.zeros(5, 6, dtype=dtype).masked_fill(~keep, -INF)
    gy = _randn(g, 2, 2, 5, 3, dtype=dtype)
    for mask in (keep, additive):
        call = lambda f: lambda q, k, v: f(q, k, v, attn_mask=mask)  # noqa: E731
        y1, g1 = grads(call(fusedops.scaled_dot_product_attention), [q, k, v], gy)
        y2, g2 = grads(call(F.scaled_dot_product_attention), [q, k, v], gy)
        assert_like(y1, y2, tol=TOL[dtype] * 2)
        assert torch.equal(y1[:, :, 1], torch.zeros_like(y1[:, :, 1]))
        for a, b in zip(g1, g2):
            assert a.isfinite().all()
            assert_like(a, b, tol=TOL[dtype] * 4)


def test_sdpa_gradients_gqa_broadcast_and_mask_grad(route, seed):
    g = _gen(seed)
    gy = _randn(g, 2, 6, 5, 3, dtype=D)
    for q_shape, k_shape, kw in (((2, 6, 5, 8), (2, 3, 7, 8), dict(enable_gqa=True)),
                                 ((2, 6, 5, 8), (1, 1, 7, 8), {}),
                                 ((2, 6, 5, 8), (2, 6, 7, 8), dict(is_causal=True, scale=0.7))):
        q, k = _randn(g, *q_shape, dtype=D), _randn(g, *k_shape, dtype=D)
        v = _randn(g, *k_shape[:-1], 3, dtype=D)
        y1, g1 = grads(lambda q, k, v: fusedops.scaled_dot_product_attention(q, k, v, **kw), [q, k, v], gy)
        y2, g2 = grads(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, **kw), [q, k, v], gy)
        assert_like(y1, y2)
        for a, b in zip(g1, g2):
            assert_like(a, b)
    # a float mask that requires grad gets torch's gradient
    q, k, v = _randn(g, 2, 2, 5, 4, dtype=D), _randn(g, 2, 2, 6, 4, dtype=D), _randn(g, 2, 2, 6, 3, dtype=D)
    m = _randn(g, 2, 1, 5, 6, dtype=D)
    _, g1 = grads(lambda q, k, v, m: fusedops.scaled_dot_product_attention(q, k, v, attn_mask=m), [q, k, v, m])
    _, g2 = grads(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m), [q, k, v, m])
    for a, b in zip(g1, g2):
        assert_like(a, b)


def test_sdpa_argument_errors(route):
    import numpy as np

    q = torch.randn(6, 5, 8)
    k, v = torch.randn(3, 7, 8), torch.randn(3, 7, 4)
    calls = [dict(attn_mask=torch.ones(5, 5, dtype=torch.int64)), dict(attn_mask=torch.ones(5, 5, dtype=torch.uint8)),
             dict(attn_mask=torch.ones(5, 5, dtype=torch.float64)), dict(attn_mask=torch.ones(5, 5, dtype=torch.float16)),
             dict(is_causal=1)]
    for kw in calls:
        err, _ = same_error(lambda: fusedops.scaled_dot_product_attention(q, q, q, **kw),
                            lambda: F.scaled_dot_product_attention(q, q, q, **kw))
        assert ("attn_mask" in str(err)) or ("is_causal" in str(err))
    same_error(lambda: fusedops.scaled_dot_product_attention(q[:5], k, v, enable_gqa=True),
               lambda: F.scaled_dot_product_attention(q[:5], k, v, enable_gqa=True))
    same_error(lambda: fusedops.scaled_dot_product_attention(q, k, v), lambda: F.scaled_dot_product_attention(q, k, v))
    same_error(lambda: fusedops.scaled_dot_product_attention(q, q.double(), q),
               lambda: F.scaled_dot_product_attention(q, q.double(), q))
    same_error(lambda: fusedops.scaled_dot_product_attention(q[0, 0], q[0, 0], q[0, 0]),
               lambda: F.scaled_dot_product_attention(q[0, 0], q[0, 0], q[0, 0]))
    same_error(lambda: fusedops.scaled_dot_product_attention(q, k, v, attn_mask=torch.rand(5, 6) > 0.5, enable_gqa=True),
               lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=torch.rand(5, 6) > 0.5, enable_gqa=True))
    # scalar forms torch takes
    for scale in (torch.tensor(0.5), np.float32(0.5)):
        _sdpa_both(q, q, q, scale=scale)
    _sdpa_both(q, q, q, None, 0, False)


def test_views_with_storage_offsets_after_cached_launches(route):
    """Arguments laid out alike (same shape and strides) but at other storage offsets reuse remembered
    launches: the values must follow each view."""
    base = torch.randn(40, 7)
    for off in (0, 1, 3, 0, 5):
        x = base[off:off + 6]
        w, b = base[off + 10], base[off + 20]
        assert_like(fusedops.softmax(x, 1), torch.softmax(x, 1))
        assert_like(fusedops.softmax(x, 0), torch.softmax(x, 0))
        assert_like(fusedops.layer_norm(x, (7,), w, b), F.layer_norm(x, (7,), w, b))
        assert_like(fusedops.rms_norm(x, (7,), w), F.rms_norm(x, (7,), w))
        assert_like(fusedops.matmul(x, base[off:off + 7].t()), torch.matmul(x, base[off:off + 7].t()))
        q = base[off:off + 24].view(2, 3, 4, 7)
        assert_like(fusedops.scaled_dot_product_attention(q, q, q), F.scaled_dot_product_attention(q, q, q))


def test_meta_tensors_infer_like_torch(route):
    x = torch.empty(3, 4, device="meta")
    q = torch.empty(2, 3, 5, 4, device="meta")
    pairs = [(fusedops.softmax(x, 1), torch.softmax(x, 1)), (fusedops.layer_norm(x, (4,)), F.layer_norm(x, (4,))),
             (fusedops.rms_norm(x, (4,)), F.rms_norm(x, (4,))), (fusedops.matmul(x, x.t()), torch.matmul(x, x.t())),
             (fusedops.scaled_dot_product_attention(q, q, q, is_causal=True),
              F.scaled_dot_product_attention(q, q, q, is_causal=True))]
    for ours, theirs in pairs:
        assert (ours.shape, ours.dtype, ours.device) == (theirs.shape, theirs.dtype, theirs.device)


@pytest.mark.parametrize("ac_dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float32])
def test_cpu_autocast_dtypes(route, ac_dtype, x_dtype, seed):
    g = _gen(seed)
    x = _randn(g, 4, 6, dtype=x_dtype)
    q = _randn(g, 2, 3, 4, dtype=x_dtype)
    with torch.autocast("cpu", dtype=ac_dtype):
        assert_like(fusedops.softmax(x, 1), torch.softmax(x, 1))
        assert_like(fusedops.log_softmax(x, 1), torch.log_softmax(x, 1))
        assert_like(fusedops.softmax(x, 1, dtype=torch.float32), torch.softmax(x, 1, dtype=torch.float32))
        assert_like(fusedops.layer_norm(x, (6,)), F.layer_norm(x, (6,)))
        assert_like(fusedops.rms_norm(x, (6,)), F.rms_norm(x, (6,)))
        assert_like(fusedops.matmul(x, x.t()), torch.matmul(x, x.t()))
        assert_like(fusedops.matmul(x, x.t().float()), torch.matmul(x, x.t().float()))
        assert_like(fusedops.matmul(x.double(), x.t().double()), torch.matmul(x.double(), x.t().double()))
        assert_like(fusedops.scaled_dot_product_attention(q, q, q), F.scaled_dot_product_attention(q, q, q))
        m = _randn(g, 3, 3)
        assert_like(fusedops.scaled_dot_product_attention(q, q.float(), q, attn_mask=m),
                    F.scaled_dot_product_attention(q, q.float(), q, attn_mask=m))


# ------------------------------------------------------------------------------------------------
# fusedops.nn modules
# ------------------------------------------------------------------------------------------------
def _pair(torch_cls, ours_cls, *args, **kwargs):
    torch.manual_seed(1)
    theirs = torch_cls(*args, **kwargs)
    ours = ours_cls(*args, **kwargs)
    ours.load_state_dict(theirs.state_dict())
    return theirs, ours


def _out(result):
    return result[0] if isinstance(result, tuple) else result


@pytest.mark.parametrize("dim", [None, 0, 1, -1])
def test_softmax_modules_including_legacy_dim(route, dim):
    x = torch.randn(2, 3, 5)
    for torch_cls, ours_cls in ((torch.nn.Softmax, fnn.Softmax), (torch.nn.LogSoftmax, fnn.LogSoftmax)):
        theirs, ours = _pair(torch_cls, ours_cls, dim=dim)
        for v in (x, x[0], x[0, 0], x.unsqueeze(0)):
            if dim == 1 and v.dim() < 2:
                continue
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                assert_like(ours(v), theirs(v))


@pytest.mark.parametrize("kwargs", [{}, dict(elementwise_affine=False), dict(bias=False), dict(eps=0.1)])
def test_layer_norm_and_rms_norm_modules(route, kwargs):
    x = torch.randn(2, 3, 5)
    for shape in (5, (5,), [3, 5]):
        theirs, ours = _pair(torch.nn.LayerNorm, fnn.LayerNorm, shape, **kwargs)
        with torch.no_grad():
            for p in theirs.parameters():
                p.normal_()
        ours.load_state_dict(theirs.state_dict())
        for v in (x, x.half(), x.bfloat16()):
            assert_like(ours(v), theirs(v))
        err, _ = same_error(lambda: ours(x.double()) if kwargs.get("elementwise_affine", True) else ours(x[..., :4]),
                            lambda: theirs(x.double()) if kwargs.get("elementwise_affine", True) else theirs(x[..., :4]))
        assert isinstance(err, RuntimeError)
        rms_kwargs = {k: v for k, v in kwargs.items() if k != "bias"}
        theirs, ours = _pair(torch.nn.RMSNorm, fnn.RMSNorm, shape, **rms_kwargs)
        for v in (x, x.half() * 1e-3, x.double() * 1e-9):
            assert_like(ours(v), theirs(v))
    theirs, ours = _pair(torch.nn.RMSNorm, fnn.RMSNorm, 5, eps=None, dtype=torch.bfloat16)
    assert_like(ours(x), theirs(x))
    assert_like(ours(x.half()), theirs(x.half()))


def test_linear_module_shapes_dtypes_and_errors(route):
    x = torch.randn(2, 3, 5)
    for bias in (True, False):
        theirs, ours = _pair(torch.nn.Linear, fnn.Linear, 5, 4, bias=bias)
        for v in (x, x[0, 0], x[:0], x.transpose(0, 1), x[:, :1].expand(2, 7, 5)):
            assert_like(ours(v), theirs(v))
        for v in (torch.tensor(1.0), x[..., :4], x.double(), x.long()):
            err, _ = same_error(lambda: ours(v), lambda: theirs(v))
            assert isinstance(err, RuntimeError)
    for n_in, n_out, v in ((0, 4, torch.randn(3, 0)), (5, 0, x)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            theirs, ours = _pair(torch.nn.Linear, fnn.Linear, n_in, n_out)
        assert_like(ours(v), theirs(v))


def test_linear_module_with_parametrized_and_transposed_weights(route):
    """weight_norm / spectral_norm / orthogonal parametrizations (a computed, non-leaf weight) and a
    non-contiguous Parameter: outputs and gradients as torch's."""
    from torch.nn.utils import parametrizations

    x = torch.randn(3, 5)
    for wrap in (parametrizations.weight_norm, parametrizations.spectral_norm, parametrizations.orthogonal):
        theirs, ours = _pair(torch.nn.Linear, fnn.Linear, 5, 5)
        theirs, ours = wrap(theirs), wrap(ours)
        ours.load_state_dict(theirs.state_dict())
        theirs.eval()
        ours.eval()
        xt, xo = x.clone().requires_grad_(), x.clone().requires_grad_()
        yt, yo = theirs(xt), ours(xo)
        assert_like(yo, yt)
        yt.pow(2).sum().backward()
        yo.pow(2).sum().backward()
        assert_like(xo.grad, xt.grad)
        for pt, po in zip(theirs.parameters(), ours.parameters()):
            if pt.grad is not None:
                assert_like(po.grad, pt.grad, tol=1e-5)
    theirs, ours = _pair(torch.nn.Linear, fnn.Linear, 5, 4)
    w = torch.randn(5, 4)
    theirs.weight, ours.weight = torch.nn.Parameter(w.t()), torch.nn.Parameter(w.t())
    assert_like(ours(x), theirs(x))


@pytest.mark.parametrize("bias_shape", [(1,), ()])
def test_linear_module_broadcast_bias(route, bias_shape):
    x = torch.randn(3, 5)
    theirs, ours = _pair(torch.nn.Linear, fnn.Linear, 5, 4)
    b = torch.randn(bias_shape)
    theirs.bias, ours.bias = torch.nn.Parameter(b.clone()), torch.nn.Parameter(b.clone())
    expected = theirs(x)
    assert expected.shape == (3, 4)
    assert_like(ours(x), expected)


def test_linear_module_broadcast_bias_after_patch(route):
    model = torch.nn.Sequential(torch.nn.Linear(5, 4))
    model[0].bias = torch.nn.Parameter(torch.randn(1))
    x = torch.randn(3, 5)
    expected = model(x)
    fnn.patch(model)
    assert_like(model(x), expected)


# -- MultiheadAttention ----------------------------------------------------------------------------
def _mha_pair(*args, **kwargs):
    return _pair(torch.nn.MultiheadAttention, fnn.MultiheadAttention, *args, **kwargs)


@pytest.mark.parametrize("training", [False, True])
def test_mha_masks_and_layouts_match_torch(route, training, seed):
    g = _gen(seed)
    E, H = 8, 2
    theirs, ours = _mha_pair(E, H, dtype=D)
    theirs.train(training)
    ours.train(training)
    q, k = _randn(g, 5, 3, E, dtype=D), _randn(g, 7, 3, E, dtype=D)
    kpm = torch.rand(3, 7, generator=g) > 0.5
    kpm[:, 0] = False
    kpm_full = kpm.clone()
    kpm_full[1] = True                                            # a fully padded sequence
    am = torch.rand(5, 7, generator=g) > 0.7
    am3 = torch.rand(6, 5, 7, generator=g) > 0.7
    causal = torch.nn.Transformer.generate_square_subsequent_mask(5, dtype=D)
    calls = [((q, k, k), {}), ((q, k, k), dict(key_padding_mask=kpm)),
             ((q, k, k), dict(key_padding_mask=torch.zeros(3, 7, dtype=D).masked_fill(kpm, -INF))),
             ((q, k, k), dict(key_padding_mask=kpm_full)), ((q, k, k), dict(attn_mask=am)),
             ((q, k, k), dict(attn_mask=am3)), ((q, k, k), dict(attn_mask=am, key_padding_mask=kpm)),
             ((q, q, q), dict(attn_mask=causal, is_causal=True)),
             ((q, q, q), dict(attn_mask=causal, is_causal=True, key_padding_mask=kpm[:, :5])),
             ((q[:, 0], k[:, 0], k[:, 0]), {}), ((q[:, 0], k[:, 0], k[:, 0]), dict(key_padding_mask=kpm[0])),
             ((q[:, 0], k[:, 0], k[:, 0]), dict(attn_mask=am3[:2]))]
    for args, kwargs in calls:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out_t, w_t = theirs(*args, need_weights=False, **kwargs)
            out_o, w_o = ours(*args, need_weights=False, **kwargs)
        assert w_t is None and w_o is None
        assert_like(out_o, out_t)
    for avg in (True, False):                                     # need_weights: torch's forward
        out_t, w_t = theirs(q, k, k, key_padding_mask=kpm, average_attn_weights=avg)
        out_o, w_o = ours(q, k, k, key_padding_mask=kpm, average_attn_weights=avg)
        assert_like(out_o, out_t)
        assert_like(w_o, w_t)


def test_mha_float_key_padding_mask_with_positive_values(route):
    """pytorch#136816 / #137887: a float key_padding_mask is added to the logits, positive values too;
    batched and unbatched."""
    theirs, ours = _mha_pair(1, 1, bias=False, batch_first=True)
    with torch.no_grad():
        theirs.in_proj_weight.copy_(torch.tensor([[1.0], [3.0], [2.0]]))
        theirs.out_proj.weight.fill_(2.0)
    ours.load_state_dict(theirs.state_dict())
    x = torch.tensor([[[1.0], [2.0]]])
    for kpm in (torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 1.0]]), torch.tensor([[0.0, -1e9]])):
        assert_like(ours(x, x, x, key_padding_mask=kpm, need_weights=False)[0],
                    theirs(x, x, x, key_padding_mask=kpm, need_weights=False)[0])
        assert_like(ours(x[0], x[0], x[0], key_padding_mask=kpm[0], need_weights=False)[0],
                    theirs(x[0], x[0], x[0], key_padding_mask=kpm[0], need_weights=False)[0])


def test_mha_fully_masked_head(route):
    """pytorch#160064: a 3-D boolean attn_mask that masks every key of one head; need_weights=False."""
    theirs, ours = _mha_pair(3, 3, batch_first=True)
    x = torch.randn(1, 5, 3)
    mask = torch.tensor([False, False, True]).view(-1, 1, 1).expand(-1, 5, 5)
    assert_like(ours(x, x, x, attn_mask=mask, need_weights=False)[0],
                theirs(x, x, x, attn_mask=mask, need_weights=False)[0])


@pytest.mark.parametrize("batch_first", [False, True])
def test_mha_gradients(route, batch_first, seed):
    g = _gen(seed)
    E, H = 8, 2
    q, k = _randn(g, 3, 5, E, dtype=D), _randn(g, 3, 7, E, dtype=D)
    if not batch_first:
        q, k = q.transpose(0, 1), k.transpose(0, 1)
    kpm = torch.rand(3, 7, generator=g) > 0.5
    kpm[:, 0] = False
    kpm[1] = True
    for kwargs, extra in ((dict(key_padding_mask=kpm), {}), (dict(attn_mask=_randn(g, 5, 7, dtype=D)), {}),
                          ({}, dict(kdim=3, vdim=5))):
        theirs, ours = _mha_pair(E, H, dtype=D, batch_first=batch_first, **extra)
        kk = k if not extra else _randn(g, *k.shape[:-1], 3, dtype=D)
        vv = k if not extra else _randn(g, *k.shape[:-1], 5, dtype=D)
        gy = _randn(g, *q.shape, dtype=D)
        results = []
        for module in (ours, theirs):
            module.zero_grad()
            leaves = [t.clone().requires_grad_() for t in (q, kk, vv)]
            module(*leaves, need_weights=False, **kwargs)[0].backward(gy)
            results.append([t.grad for t in leaves] + [p.grad for p in module.parameters()])
        for a, b in zip(*results):
            assert_like(a, b)


@pytest.mark.parametrize("ac_dtype", [torch.bfloat16, torch.float16])
def test_mha_and_linear_under_cpu_autocast(route, ac_dtype):
    theirs, ours = _mha_pair(8, 2, batch_first=True)
    lin_t, lin_o = _pair(torch.nn.Linear, fnn.Linear, 8, 3)
    x = torch.randn(2, 5, 8)
    with torch.autocast("cpu", dtype=ac_dtype):
        for kwargs in ({}, dict(key_padding_mask=torch.rand(2, 5) > 0.5), dict(attn_mask=torch.randn(5, 5))):
            assert_like(ours(x, x, x, need_weights=False, **kwargs)[0], theirs(x, x, x, need_weights=False, **kwargs)[0])
        assert_like(lin_o(x), lin_t(x))


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("norm_first", [False, True])
def test_patched_transformer_encoder_matches(route, batch_first, norm_first):
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0, batch_first=batch_first,
                                             norm_first=norm_first)
    theirs = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    ours = copy.deepcopy(theirs)
    report = fnn.patch(ours)
    assert report.counts()["fusedops.nn.attention.MultiheadAttention"] == 2
    x = torch.randn(3, 5, 8)
    if not batch_first:
        x = x.transpose(0, 1)
    kpm = torch.zeros(3, 5, dtype=torch.bool)
    kpm[0, 3:] = True
    kpm[2, 1:] = True
    causal = torch.nn.Transformer.generate_square_subsequent_mask(5)
    for training in (True, False):
        theirs.train(training)
        ours.train(training)
        for kwargs in ({}, dict(src_key_padding_mask=kpm), dict(mask=causal, is_causal=True),
                       dict(mask=causal, src_key_padding_mask=kpm, is_causal=True)):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                assert_like(ours(x, **kwargs), theirs(x, **kwargs))
