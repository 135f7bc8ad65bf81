"""The autograd Functions' backward under vmap (function_host.vmapped): torch.autograd.grad(...,
is_grads_batched=True), jacobian(vectorize=True) and torch.func.vmap over autograd.grad give the backward
batched gradients, which the kernels cannot read; the backward then computes the same gradients with torch
ops. Each case compares the batched gradients with the kernel backward's, one incoming gradient at a time
(float64 through the interpreter), for softmax / log_softmax, layer_norm / rms_norm (weight and bias
combinations), matmul (bias, activations, 1-D and broadcast operands) and attention (masks, causal, GQA).
"""

from __future__ import annotations

import math

import pytest
import torch

import fusedops

D = torch.float64
TOLERANCE = {torch.float64: dict(atol=1e-12, rtol=1e-10), torch.float32: dict(atol=1e-5, rtol=1e-5)}
COUNT = 3       # incoming gradients per batch


def _check(y, inputs, function: str):
    """The gradients of y with respect to `inputs` (those that require grad) for COUNT random incoming
    gradients: batched (is_grads_batched, the torch-op backward) against one at a time (the kernels)."""
    assert type(y.grad_fn).__name__ == f"{function}Backward", type(y.grad_fn).__name__    # the kernel path
    inputs = [t for t in inputs if t.requires_grad]
    grads = torch.randn(COUNT, *y.shape, dtype=y.dtype)
    batched = torch.autograd.grad(y, inputs, grads, is_grads_batched=True, retain_graph=True)
    rows = [torch.autograd.grad(y, inputs, g, retain_graph=True) for g in grads]
    for position, (t, gradient) in enumerate(zip(inputs, batched)):
        expected = torch.stack([row[position] for row in rows])
        assert gradient.dtype == t.dtype, (gradient.dtype, t.dtype)
        torch.testing.assert_close(gradient, expected, **TOLERANCE[t.dtype])


def _tensor(*shape, dtype=D, grad=True):
    return torch.randn(*shape, dtype=dtype).requires_grad_(grad)


# -- softmax, log_softmax ---------------------------------------------------------------------------
@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("shape, dim", [((3, 7), -1), ((2, 5, 3), 1), ((4,), 0), ((2, 3, 6), 0)])
def test_softmax(interpret, log, shape, dim):
    x = _tensor(*shape)
    op = fusedops.log_softmax if log else fusedops.softmax
    _check(op(x, dim), [x], "SoftmaxFunction")


@pytest.mark.parametrize("log", [False, True])
def test_softmax_upcast_output(interpret, log):
    x = _tensor(3, 5, dtype=torch.float32)      # float64 output, float32 gradient
    y = (fusedops.log_softmax if log else fusedops.softmax)(x, -1, dtype=D)
    assert y.dtype == D
    _check(y, [x], "SoftmaxFunction")


def test_softmax_transposed_input(interpret):
    x = _tensor(6, 4).t()
    _check(fusedops.softmax(x, 1), [x], "SoftmaxFunction")


# -- layer_norm, rms_norm -----------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [D, torch.float32])
@pytest.mark.parametrize("affine", ["none", "weight", "bias", "both"])
@pytest.mark.parametrize("normalized_shape", [(6,), (2, 3)])
def test_layer_norm(interpret, dtype, affine, normalized_shape):
    x = _tensor(4, *normalized_shape, dtype=dtype) * 3 + 1
    x.retain_grad()
    weight = _tensor(*normalized_shape, dtype=dtype) if affine in ("weight", "both") else None
    bias = _tensor(*normalized_shape, dtype=dtype) if affine in ("bias", "both") else None
    y = fusedops.layer_norm(x, normalized_shape, weight, bias)
    _check(y, [t for t in (x, weight, bias) if t is not None], "NormFunction")


@pytest.mark.parametrize("dtype", [D, torch.float32])
@pytest.mark.parametrize("with_weight", [False, True])
@pytest.mark.parametrize("normalized_shape", [(5,), (2, 3)])
def test_rms_norm(interpret, dtype, with_weight, normalized_shape):
    x = _tensor(2, 3, *normalized_shape, dtype=dtype)
    weight = _tensor(*normalized_shape, dtype=dtype) if with_weight else None
    y = fusedops.rms_norm(x, normalized_shape, weight)
    _check(y, [t for t in (x, weight) if t is not None], "NormFunction")


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_norm_parameters_alone(interpret, op):
    # x does not require grad: only dweight (and dbias) are asked for
    x, weight, bias = _tensor(5, 6, grad=False), _tensor(6), _tensor(6)
    if op == "layer_norm":
        y, inputs = fusedops.layer_norm(x, (6,), weight, bias), [weight, bias]
    else:
        y, inputs = fusedops.rms_norm(x, (6,), weight), [weight]
    _check(y, inputs, "NormFunction")


def test_norm_strided_input(interpret):
    x = _tensor(8, 5)[::2]
    weight, bias = _tensor(5), _tensor(5)
    _check(fusedops.layer_norm(x, (5,), weight, bias), [x, weight, bias], "NormFunction")


# -- matmul ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("activation", [None, "relu", "gelu", "gelu_tanh", "silu"])
@pytest.mark.parametrize("with_bias", [False, True])
def test_matmul_activation_and_bias(interpret, activation, with_bias):
    a, b = _tensor(3, 5), _tensor(5, 4)
    bias = _tensor(4) if with_bias else None
    y = fusedops.matmul(a, b, bias, activation)
    _check(y, [t for t in (a, b, bias) if t is not None], "MatmulFunction")


@pytest.mark.parametrize("shapes", [((5,), (5, 4)), ((3, 5), (5,)), ((5,), (5,)), ((2, 3, 5), (5, 4)),
                                    ((3, 5), (2, 5, 4)), ((2, 1, 3, 5), (3, 5, 4))])
def test_matmul_shapes(interpret, shapes):
    a, b = _tensor(*shapes[0]), _tensor(*shapes[1])
    _check(fusedops.matmul(a, b), [a, b], "MatmulFunction")


def test_matmul_one_operand_and_float32(interpret):
    a, b = _tensor(3, 5, dtype=torch.float32, grad=False), _tensor(5, 4, dtype=torch.float32)
    bias = _tensor(4, dtype=torch.float32)
    _check(fusedops.matmul(a, b, bias, "silu"), [b, bias], "MatmulFunction")


# -- scaled_dot_product_attention ---------------------------------------------------------------------
def _attention_inputs(batch=1, heads=2, heads_kv=2, length_q=5, length_k=6, dim=4, dim_v=3, dtype=D):
    return (_tensor(batch, heads, length_q, dim, dtype=dtype), _tensor(batch, heads_kv, length_k, dim, dtype=dtype),
            _tensor(batch, heads_kv, length_k, dim_v, dtype=dtype))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("lengths", [(5, 6), (6, 4), (1, 3)])
def test_attention(interpret, causal, lengths):
    q, k, v = _attention_inputs(length_q=lengths[0], length_k=lengths[1])
    y = fusedops.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=0.7)
    _check(y, [q, k, v], "AttentionFunction")


@pytest.mark.parametrize("dtype", [D, torch.float32])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_gqa(interpret, causal, dtype):
    q, k, v = _attention_inputs(heads=4, heads_kv=2, dtype=dtype)
    y = fusedops.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    _check(y, [q, k, v], "AttentionFunction")


def test_attention_boolean_mask(interpret):
    q, k, v = _attention_inputs(heads=4, heads_kv=2)
    mask = torch.rand(5, 6) > 0.4
    mask[1] = False     # a fully masked row: output 0, gradients 0
    mask[2, 0] = True
    y = fusedops.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    _check(y, [q, k, v], "AttentionFunction")


@pytest.mark.parametrize("causal", [False, True])
def test_attention_additive_mask(interpret, causal):
    q, k, v = _attention_inputs(batch=2)
    mask = torch.randn(2, 1, 5, 6, dtype=D)
    mask[0, 0, 1, 2] = -math.inf
    mask[1, 0, 3] = torch.finfo(D).min      # a row held at the additive-mask floor: uniform weights
    y = fusedops.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
    _check(y, [q, k, v], "AttentionFunction")


def test_attention_value_alone(interpret):
    q, k, v = _attention_inputs()
    q.requires_grad_(False)
    _check(fusedops.scaled_dot_product_attention(q, k, v), [k, v], "AttentionFunction")


# -- the other ways into a vmapped backward ---------------------------------------------------------
def _ops():
    w, m = torch.randn(6, dtype=D), torch.randn(6, 4, dtype=D)
    return {
        "log_softmax": lambda x: fusedops.log_softmax(x, -1),
        "layer_norm": lambda x: fusedops.layer_norm(x, (6,), w, w),
        "rms_norm": lambda x: fusedops.rms_norm(x, (6,), w),
        "matmul": lambda x: fusedops.matmul(x, m, w[:4], "gelu_tanh"),
        "attention": lambda x: fusedops.scaled_dot_product_attention(x[None], x[None] * 2, x[None], is_causal=True),
    }


@pytest.mark.parametrize("op", list(_ops()))
def test_vectorized_jacobian(interpret, op):
    x = torch.randn(3, 6, dtype=D)
    function = _ops()[op]
    expected = torch.autograd.functional.jacobian(function, x)      # row by row, the kernel backward
    torch.testing.assert_close(torch.autograd.functional.jacobian(function, x, vectorize=True), expected,
                               **TOLERANCE[D])


@pytest.mark.parametrize("op", list(_ops()))
def test_functorch_vmap_over_grad(interpret, op):
    # the graph is recorded outside vmap (kernel forward), its backward runs under torch.func.vmap
    x = torch.randn(3, 6, dtype=D, requires_grad=True)
    y = _ops()[op](x)
    grads = torch.randn(COUNT, *y.shape, dtype=D)
    batched = torch.func.vmap(lambda g: torch.autograd.grad(y, x, g, retain_graph=True)[0])(grads)
    expected = torch.stack([torch.autograd.grad(y, x, g, retain_graph=True)[0] for g in grads])
    torch.testing.assert_close(batched, expected, **TOLERANCE[D])


def test_gradcheck_with_batched_grad(interpret):
    x = torch.randn(2, 5, dtype=D, requires_grad=True)
    weight = torch.randn(5, dtype=D, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w: fusedops.layer_norm(x, (5,), w, w), (x, weight),
                                    check_batched_grad=True)
    assert torch.autograd.gradcheck(lambda x, w: fusedops.matmul(x, w[:, None], activation="silu"), (x, weight),
                                    check_batched_grad=True)


def test_plain_backward_runs_the_kernels(interpret, monkeypatch):
    # without vmap the backward never takes the torch ops (else the comparisons above would compare them
    # with themselves)
    from fusedops.autograd import attention, function_host, matmul, norms, softmax

    def fail(*args, **kwargs):
        raise AssertionError("the torch-op backward ran outside vmap")

    for module, name in ((softmax, "_torch_backward"), (norms, "_torch_backward"), (attention, "_torch_backward"),
                         (matmul, "reference")):
        monkeypatch.setattr(module, name, fail)
    assert not function_host.vmapped(torch.randn(3))
    x = torch.randn(3, 6, dtype=D, requires_grad=True)
    for op in _ops().values():
        y = op(x)
        torch.autograd.grad(y, x, torch.randn_like(y))
