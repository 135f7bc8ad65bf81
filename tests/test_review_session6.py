"""Review of session 6 (a fresh reviewer tried the public API as a demanding user, on the CPU through the
interpreter, against torch in float64): the inputs that broke it, kept as regression tests.

- fusedops.matmul of two 1-D tensors (a dot product): its backward reshaped a 0-d gradient as a row.
- fusedops.matmul of an empty batch against a 2-D operand: the batch of 0 broadcast against 1 was taken as 1.
- fusedops.matmul(..., out_dtype=torch.float64) of narrower operands: the kernel asked for a float64 dot.
- fusedops.nn.Linear with in_features=0: reshape(-1, 0) cannot infer the row count.
- fusedops.scaled_dot_product_attention with a head dim of 0: 1 / sqrt(0).
- fusedops.softmax of an expanded input (stride 0): the result came back strided, not contiguous as
  torch's, so `.view(-1)` failed.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import fusedops
import fusedops.nn
from helpers import assert_close


@pytest.fixture(autouse=True)
def interpret(monkeypatch):
    monkeypatch.setenv("FUSEDOPS_INTERPRET", "1")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_matmul_of_two_vectors_backward(dtype):
    a = torch.randn(7, dtype=dtype, requires_grad=True)
    b = torch.randn(7, dtype=dtype, requires_grad=True)
    out = fusedops.matmul(a, b)
    assert out.shape == ()
    out.backward(torch.tensor(3.0, dtype=dtype))
    assert_close(a.grad, 3 * b.detach().double(), dtype)
    assert_close(b.grad, 3 * a.detach().double(), dtype)


@pytest.mark.parametrize("a_shape, b_shape", [((0, 4, 5), (5, 3)), ((2, 0, 4, 5), (5, 3)), ((4, 5), (0, 5, 3)),
                                              ((1, 4, 5), (0, 5, 3))])
def test_matmul_empty_batch_broadcast_against_one(a_shape, b_shape):
    a = torch.randn(a_shape, requires_grad=True)
    b = torch.randn(b_shape, requires_grad=True)
    out = fusedops.matmul(a, b)
    expected = torch.matmul(a.detach(), b.detach())
    assert out.shape == expected.shape
    out.sum().backward()
    assert a.grad.shape == a.shape and b.grad.shape == b.shape
    assert torch.equal(b.grad, torch.zeros_like(b))        # nothing multiplied it


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_matmul_float64_output_of_narrower_operands(dtype):
    a, b = torch.randn(5, 33, dtype=dtype), torch.randn(33, 3, dtype=dtype)
    out = fusedops.matmul(a, b, out_dtype=torch.float64)
    assert out.dtype == torch.float64
    assert_close(out, a.double() @ b.double(), torch.float32)     # float32 sums, stored in float64


def test_linear_without_input_features():
    layer = fusedops.nn.Linear(0, 5)
    with torch.no_grad():
        layer.bias.copy_(torch.randn(5))
    x = torch.ones(3, 0, requires_grad=True)
    out = layer(x)
    assert torch.equal(out, layer.bias.detach().expand(3, 5))
    out.sum().backward()
    assert torch.equal(layer.bias.grad, torch.full((5,), 3.0)) and x.grad.shape == (3, 0)


def test_attention_with_head_dim_0_is_torch_s():
    q, k, v = torch.randn(1, 2, 4, 0), torch.randn(1, 2, 5, 0), torch.randn(1, 2, 5, 8)
    out = fusedops.scaled_dot_product_attention(q, k, v)
    assert torch.equal(out, F.scaled_dot_product_attention(q, k, v))


@pytest.mark.parametrize("shape, expanded, dim", [((1, 4), (3, 4), -1), ((3, 1, 5), (3, 4, 5), 1),
                                                  ((3, 1, 5), (3, 4, 5), -1), ((1, 1), (6, 9), 0)])
@pytest.mark.parametrize("log", [False, True])
def test_softmax_of_expanded_input_is_contiguous(shape, expanded, dim, log):
    x = torch.randn(shape, dtype=torch.float32).expand(expanded)
    y = (fusedops.log_softmax if log else fusedops.softmax)(x, dim)
    assert y.is_contiguous()
    assert_close(y.view(-1), (torch.log_softmax if log else torch.softmax)(x.double(), dim).view(-1), torch.float32)


# Second-order gradients: with create_graph=True and a grad output that does not require grad, the gradients
# came back as constants, so a gradient penalty lost its terms through x (torch's once_differentiable only
# guards grad outputs that require grad). Now differentiating them raises; first-order results are unchanged.
def _ops():
    w = torch.randn(8, dtype=torch.float64)
    m = torch.randn(8, 5, dtype=torch.float64)
    return {
        "softmax": (lambda x: fusedops.softmax(x, -1), lambda x: torch.softmax(x, -1)),
        "log_softmax": (lambda x: fusedops.log_softmax(x, -1), lambda x: torch.log_softmax(x, -1)),
        "layer_norm": (lambda x: fusedops.layer_norm(x, (8,), w), lambda x: F.layer_norm(x, (8,), w)),
        "rms_norm": (lambda x: fusedops.rms_norm(x, (8,), w), lambda x: F.rms_norm(x, (8,), w)),
        "matmul": (lambda x: fusedops.matmul(x, m), lambda x: x @ m),
        "sdpa": (lambda x: fusedops.scaled_dot_product_attention(x[None, None], x[None, None], x[None, None])[0, 0],
                 lambda x: F.scaled_dot_product_attention(x[None, None], x[None, None], x[None, None])[0, 0]),
    }


@pytest.mark.parametrize("name", list(_ops()))
def test_create_graph_gradients_raise_when_differentiated_again(name):
    ours, theirs = _ops()[name]
    x0 = torch.randn(3, 8, dtype=torch.float64)
    x = x0.clone().requires_grad_()
    y = ours(x)
    r = torch.randn_like(y)
    (gx,) = torch.autograd.grad((y * r).sum(), x, create_graph=True)
    xr = x0.clone().requires_grad_()
    (expected,) = torch.autograd.grad((theirs(xr) * r).sum(), xr)
    assert_close(gx.detach(), expected, torch.float64)         # first order: as before
    with pytest.raises(RuntimeError, match="differentiate twice a fusedops op"):
        gx.pow(2).sum().backward()


# torch.func transforms pass wrapped tensors without storage: the ops ran the kernels on them and failed
# with "Cannot access data pointer". Under a transform every op now runs torch's.
@pytest.mark.parametrize("name", list(_ops()))
def test_torch_func_transforms_run_torch_s_op(name):
    ours, theirs = _ops()[name]
    x = torch.randn(4, 3, 8, dtype=torch.float64)
    assert_close(torch.vmap(ours)(x), torch.vmap(theirs)(x), torch.float64)
    grad = torch.func.grad(lambda t: ours(t).pow(2).sum())(x[0])
    assert_close(grad, torch.func.grad(lambda t: theirs(t).pow(2).sum())(x[0]), torch.float64)


@pytest.mark.parametrize("eps", ["a", None, [1e-5]])
def test_layer_norm_eps_that_is_not_a_number_is_a_type_error(eps):
    x = torch.randn(2, 8)
    with pytest.raises(TypeError, match="argument 'eps' must be a number"):
        fusedops.layer_norm(x, (8,), eps=eps)
    with pytest.raises(TypeError):
        F.layer_norm(x, (8,), eps=eps)          # torch's type too
