"""Review tests of the host fast paths (prepared launches, generated binders) and the new softmax
SHIFT / online / LayerNorm ALIGN paths, on the CPU (interpreter, or the CUDA driver mocked)."""

from __future__ import annotations

import math

import pytest
import torch

import fusedops
from fusedops.kernels import softmax as SK


@pytest.fixture
def interp(monkeypatch):
    monkeypatch.setenv("FUSEDOPS_INTERPRET", "1")


def _ref_softmax(x, dim, log):
    x64 = x.double()
    return torch.log_softmax(x64, dim) if log else torch.softmax(x64, dim)


def _special_rows(n, dtype):
    x = torch.randn(6, n, dtype=torch.float64) * 3
    x[1, :] = -math.inf                 # all -inf
    x[2, n // 2] = math.inf             # one +inf
    x[3, 3] = math.nan                  # one NaN
    x[4, ::2] = -math.inf               # half -inf
    x[5, 0] = 1e4                       # one dominating value
    return x.to(dtype)


@pytest.mark.parametrize("n,block", [(37, None), (37, 16), (13, 8)])
@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_softmax_odd_rows_special_values(interp, n, block, log, dtype):
    x = _special_rows(n, dtype)
    y = SK.softmax_forward(x, 1, log=log, max_one_pass_block=block)
    ref = _ref_softmax(x, 1, log)
    torch.testing.assert_close(y.double(), ref, atol=2e-3, rtol=2e-3, equal_nan=True)


@pytest.mark.parametrize("n,block", [(37, None), (37, 16)])
@pytest.mark.parametrize("log", [False, True])
def test_softmax_odd_rows_backward(interp, n, block, log):
    x = torch.randn(5, n, dtype=torch.float32)
    y = _ref_softmax(x, 1, log).float()
    dy = torch.randn(5, n)
    dx = SK.softmax_backward(dy, y, 1, log=log, max_one_pass_block=block)
    x64 = x.double().requires_grad_()
    (torch.log_softmax(x64, 1) if log else torch.softmax(x64, 1)).backward(dy.double())
    torch.testing.assert_close(dx.double(), x64.grad, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("block", [None, 16])
def test_softmax_outer_strides_differ(interp, block):
    # x's rows are 40 apart, y's 37: the SHIFT path needs one row stride, so it must not apply
    buf = torch.randn(4, 40, dtype=torch.float16)
    x = buf[:, :37]
    y = SK.softmax_forward(x, 1, log=False, max_one_pass_block=block)
    torch.testing.assert_close(y.double(), _ref_softmax(x, 1, False), atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("offset", [0, 1, 3, 8])
def test_softmax_storage_offsets_share_a_cached_launch(interp, offset):
    buf = torch.randn(4 * 37 + 16, dtype=torch.float16)
    x = buf[offset:offset + 4 * 37].view(4, 37)
    for _ in range(2):
        y = fusedops.softmax(x, -1)
        torch.testing.assert_close(y.double(), _ref_softmax(x, 1, False), atol=2e-3, rtol=2e-3)


def test_softmax_gradcheck_float64(interp):
    x = torch.randn(3, 7, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: fusedops.softmax(t, -1), (x,))
    assert torch.autograd.gradcheck(lambda t: fusedops.log_softmax(t, 0), (x,))


def test_layer_norm_gradcheck_float64(interp):
    x = torch.randn(3, 7, dtype=torch.float64, requires_grad=True)
    w = torch.randn(7, dtype=torch.float64, requires_grad=True)
    b = torch.randn(7, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda *t: fusedops.layer_norm(t[0], (7,), t[1], t[2], 1e-5), (x, w, b))


@pytest.mark.parametrize("make", [
    lambda: torch.randn(37).expand(4, 37),                       # rows stride 0
    lambda: torch.randn(4, 1).expand(4, 37),                     # columns stride 0
    lambda: torch.randn(4, 41)[:, 2:39],                         # sliced rows, odd N
    lambda: torch.randn(37, 4).t(),                              # transposed
    lambda: torch.randn(2, 3, 37)[:, 1:],                        # leading dims that do not merge
])
def test_layer_norm_strided_inputs(interp, make):
    x = make()
    w, b = torch.randn(37), torch.randn(37)
    for eps in (1e-5, 1e-1):        # eps is part of the cached launch's key
        for _ in range(2):
            xr = x.detach().clone().requires_grad_()
            wr, br = w.clone().requires_grad_(), b.clone().requires_grad_()
            y = fusedops.layer_norm(xr, (37,), wr, br, eps)
            ref = torch.nn.functional.layer_norm(x.double(), (37,), w.double(), b.double(), eps)
            torch.testing.assert_close(y.double(), ref, atol=1e-4, rtol=1e-4)
            dy = torch.randn_like(y)
            y.backward(dy)
            x64 = x.double().requires_grad_()
            w64, b64 = w.double().requires_grad_(), b.double().requires_grad_()
            torch.nn.functional.layer_norm(x64, (37,), w64, b64, eps).backward(dy.double())
            torch.testing.assert_close(xr.grad.double(), x64.grad, atol=1e-3, rtol=1e-3)
            torch.testing.assert_close(wr.grad.double(), w64.grad, atol=1e-3, rtol=1e-3)


def test_layer_norm_none_then_weight(interp):
    x = torch.randn(4, 37)
    w, b = torch.randn(37), torch.randn(37)
    for weight, bias in [(None, None), (w, b), (None, b), (w, None), (None, None)]:
        y = fusedops.layer_norm(x, (37,), weight, bias, 1e-5)
        ref = torch.nn.functional.layer_norm(x.double(), (37,), None if weight is None else weight.double(),
                                             None if bias is None else bias.double(), 1e-5)
        torch.testing.assert_close(y.double(), ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("block", [None, 4, 16])
def test_softmax_upcast_output_odd_rows(interp, block):
    x = _special_rows(37, torch.float16)
    y = SK.softmax_forward(x, 1, log=False, dtype=torch.float32, max_one_pass_block=block)
    assert y.dtype == torch.float32
    torch.testing.assert_close(y.double(), _ref_softmax(x, 1, False), atol=1e-3, rtol=1e-3, equal_nan=True)


@pytest.mark.parametrize("shape,dim", [((0, 5), 1), ((5, 0), 1), ((5, 0), 0), ((2, 37, 3), 1), ((3, 1), 1)])
def test_softmax_odd_shapes(interp, shape, dim):
    x = torch.randn(shape, requires_grad=True)
    y = fusedops.softmax(x, dim - x.dim())
    x64 = x.detach().double().requires_grad_()
    ref = torch.softmax(x64, dim)
    torch.testing.assert_close(y.double(), ref, atol=1e-5, rtol=1e-5)
    dy = torch.randn(shape)
    y.backward(dy)
    ref.backward(dy.double())
    torch.testing.assert_close(x.grad.double(), x64.grad, atol=1e-5, rtol=1e-5)


def test_layer_norm_zero_rows(interp):
    x = torch.randn(0, 37, requires_grad=True)
    w = torch.randn(37, requires_grad=True)
    y = fusedops.layer_norm(x, (37,), w, None, 1e-5)
    y.sum().backward()
    assert y.shape == (0, 37) and torch.equal(w.grad, torch.zeros(37))
