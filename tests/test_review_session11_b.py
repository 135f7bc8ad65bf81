"""Review (session 11, part b): a demanding new user tried the public ops and modules against PyTorch's
semantics, on the CPU through the interpreter (FUSEDOPS_INTERPRET=1) and the CPU fallback, in float64 where
sensible. CPU only, small inputs.

The defects found were fixed the same session (their strict xfail marks dropped); each test asserts
torch's behaviour.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import fusedops
import fusedops.library  # noqa: F401  (registers torch.ops.fusedops.*)
import fusedops.nn
import fusedops.dsl as dsl


# ------------------------------------------------------------------------------------------------
# matmul / Linear: the output of the autograd Function is a view, so in-place ops on it are refused
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("a_shape, b_shape", [((3, 5), (5, 4)), ((2, 3, 5), (5, 4)), ((2, 3, 5), (2, 5, 4))])
def test_matmul_output_can_be_modified_in_place_before_backward(interpret, a_shape, b_shape):
    torch.manual_seed(0)
    a, b = torch.randn(a_shape, dtype=torch.float64), torch.randn(b_shape, dtype=torch.float64)
    a1, b1 = a.clone().requires_grad_(), b.clone().requires_grad_()
    a2, b2 = a.clone().requires_grad_(), b.clone().requires_grad_()
    y1 = fusedops.matmul(a1, b1)
    y1.mul_(2.0).add_(1.0)
    y2 = torch.matmul(a2, b2)
    y2.mul_(2.0).add_(1.0)
    g = torch.randn(y2.shape, dtype=torch.float64)
    y1.backward(g)
    y2.backward(g)
    torch.testing.assert_close(y1, y2)
    torch.testing.assert_close(a1.grad, a2.grad)
    torch.testing.assert_close(b1.grad, b2.grad)


def test_linear_followed_by_inplace_relu_trains(interpret):
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.ReLU(inplace=True)).double()
    ours = torch.nn.Sequential(fusedops.nn.Linear(5, 4), torch.nn.ReLU(inplace=True)).double()
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(2, 3, 5, dtype=torch.float64)
    ours(x).sum().backward()
    ref(x).sum().backward()
    torch.testing.assert_close(ours[0].weight.grad, ref[0].weight.grad)
    torch.testing.assert_close(ours[0].bias.grad, ref[0].bias.grad)


# ------------------------------------------------------------------------------------------------
# layer_norm / rms_norm in float64: eps goes to the kernel as a float32 scalar
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_float64_norm_uses_eps_in_float64(interpret, op):
    torch.manual_seed(0)
    x = torch.randn(4, 64, dtype=torch.float64) * 1e-3      # variance ~1e-6, of eps's order
    w = torch.randn(64, dtype=torch.float64)
    g = torch.randn(4, 64, dtype=torch.float64)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    if op == "layer_norm":
        y1, y2 = fusedops.layer_norm(x1, 64, w, None, 1e-5), F.layer_norm(x2, (64,), w, None, 1e-5)
    else:
        y1, y2 = fusedops.rms_norm(x1, 64, w, 1e-5), F.rms_norm(x2, (64,), w, 1e-5)
    y1.backward(g)
    y2.backward(g)
    torch.testing.assert_close(y1, y2, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(x1.grad, x2.grad, rtol=1e-12, atol=1e-9)


def test_float64_layer_norm_module_constant_rows_gradient(interpret):
    torch.manual_seed(0)
    ref = torch.nn.LayerNorm(6).double()
    ours = fusedops.nn.LayerNorm(6).double()
    with torch.no_grad():
        ref.weight.normal_()
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(4, 5, 1, dtype=torch.float64).expand(4, 5, 6)
    g = torch.randn(4, 5, 6, dtype=torch.float64)
    x1, x2 = x.detach().requires_grad_(), x.detach().requires_grad_()
    ours(x1).backward(g)
    ref(x2).backward(g)
    torch.testing.assert_close(x1.grad, x2.grad, rtol=1e-12, atol=1e-10)


# ------------------------------------------------------------------------------------------------
# torch.ops.fusedops.scaled_dot_product_attention (what torch.compile traces): empty dims
# ------------------------------------------------------------------------------------------------
def _attention_op_gradients(q_shape, k_shape, v_shape, enable_gqa=False):
    torch.manual_seed(0)
    q, k, v = (torch.randn(s).requires_grad_() for s in (q_shape, k_shape, v_shape))
    out, _ = torch.ops.fusedops.scaled_dot_product_attention(q, k, v, None, False, None, enable_gqa)
    q2, k2, v2 = (t.detach().clone().requires_grad_() for t in (q, k, v))
    ref = F.scaled_dot_product_attention(q2, k2, v2, enable_gqa=enable_gqa)
    assert out.shape == ref.shape
    g = torch.randn(ref.shape)
    out.backward(g)
    ref.backward(g)
    for ours, theirs in ((q, q2), (k, k2), (v, v2)):
        torch.testing.assert_close(ours.grad, theirs.grad)


@pytest.mark.parametrize("q_shape, kv_shape", [((1, 2, 0, 8), (1, 2, 3, 8)), ((0, 2, 3, 4), (0, 2, 3, 4)),
                                               ((2, 0, 5, 8), (2, 0, 3, 8))])
def test_attention_op_backward_with_empty_queries_interpreted(interpret, q_shape, kv_shape):
    _attention_op_gradients(q_shape, kv_shape, kv_shape)


@pytest.mark.parametrize("q_shape, k_shape, v_shape, gqa", [
    ((1, 2, 5, 8), (1, 2, 0, 8), (1, 2, 0, 8), False),
    ((1, 2, 3, 4), (1, 2, 3, 4), (1, 2, 3, 0), False),
    ((1, 4, 3, 4), (1, 2, 0, 4), (1, 2, 0, 4), True),
])
def test_attention_op_backward_with_empty_keys_on_the_fallback(fallback, q_shape, k_shape, v_shape, gqa):
    _attention_op_gradients(q_shape, k_shape, v_shape, gqa)


def test_attention_op_head_dim_0(interpret):
    q, k, v = torch.randn(1, 2, 3, 0), torch.randn(1, 2, 4, 0), torch.randn(1, 2, 4, 5)
    out, _ = torch.ops.fusedops.scaled_dot_product_attention(q, k, v, None, False, None, False)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v))


# ------------------------------------------------------------------------------------------------
# rms_norm of an inference tensor with a trainable weight
# ------------------------------------------------------------------------------------------------
def test_rms_norm_of_an_inference_tensor_trains_the_weight(interpret):
    torch.manual_seed(0)
    with torch.inference_mode():
        x = torch.randn(3, 8, dtype=torch.float64)
    ref = torch.nn.RMSNorm(8).double()
    ours = fusedops.nn.RMSNorm(8).double()
    g = torch.randn(3, 8, dtype=torch.float64)
    ref(x).backward(g)
    ours(x).backward(g)
    torch.testing.assert_close(ours.weight.grad, ref.weight.grad)


# ------------------------------------------------------------------------------------------------
# the DSL: a numpy.float64 scalar argument is a float64 (how the norms pass eps for float64 rows)
# ------------------------------------------------------------------------------------------------
@dsl.jit
def _add_scalar_kernel(y_ptr, x_ptr, value, N: dsl.constexpr):
    i = dsl.arange(0, N)
    dsl.store(y_ptr + i, dsl.load(x_ptr + i) + value)


def test_numpy_float64_scalar_argument_keeps_float64():
    x = torch.zeros(4, dtype=torch.float64)
    for value, expected in ((np.float64(1e-5), 1e-5), (1e-5, float(np.float32(1e-5)))):
        y = torch.empty(4, dtype=torch.float64)
        _add_scalar_kernel[(1,)](y, x, value, N=4, interpret=True)
        assert y.tolist() == [expected] * 4, (type(value), y)
    ptx = _add_scalar_kernel.compile(x, x, np.float64(1e-5), N=4, target="sm_80").asm["ptx"]
    assert ".param .f64" in ptx
