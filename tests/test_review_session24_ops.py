"""Review (session 24): a demanding new user tried to break the public ops (fusedops.matmul, softmax,
log_softmax, the norms) and fusedops.nn on the CPU, with torch itself as the oracle (float64 references),
on both CPU routes: the kernels in the NumPy interpreter (`interpret`, FUSEDOPS_INTERPRET=1, what CUDA
tensors take) and the torch fallback (`fallback`, what a CPU user gets by default).

Defects found (fixed in the same session; the tests assert torch's behaviour):
- the fake (meta) kernel of the custom op fusedops::matmul gives a 1-D @ 1-D product with a (1,) bias the
  shape () where the op returns (1,) (torch.library.opcheck's test_faketensor fails; under torch.compile on
  the kernel path the traced shape is wrong, e.g. `.shape[0]` raises IndexError).
- fusedops.matmul on the kernel path saves both operands for the backward whatever needs a gradient: an
  in-place change of an operand whose gradient is not needed (the activations of a frozen Linear, e.g. with
  LoRA adapters; a weight-like operand whose partner is a constant) then makes backward raise, where
  torch.matmul / F.linear save an operand only for the other's gradient and backpropagate fine.

The other tests pin tricky cases that were checked and match torch.
"""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
import torch.nn.functional as F

import fusedops
import fusedops.library  # noqa: F401  (registers torch.ops.fusedops.*)
import fusedops.nn as fnn

D = torch.float64


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return 0.0 if a.numel() == 0 else (a.double() - b.double()).abs().max().item()


# ------------------------------------------------------------------------------------------------
# Defect 1: the fake kernel of fusedops::matmul and a 1-D @ 1-D product with a bias
# ------------------------------------------------------------------------------------------------
def test_matmul_fake_kernel_shape_of_dot_with_bias(seed):
    from torch._subclasses.fake_tensor import FakeTensorMode

    g = torch.Generator().manual_seed(seed)
    a, b, bias = (torch.randn(n, generator=g) for n in (4, 4, 1))
    real = torch.ops.fusedops.matmul(a, b, bias)
    assert real.shape == (1,) == torch.matmul(a, b).add(bias).shape
    with FakeTensorMode() as mode:
        fake = torch.ops.fusedops.matmul(*(mode.from_tensor(t) for t in (a, b, bias)))
    assert fake.shape == real.shape


def test_matmul_compiled_dot_with_bias_shape(interpret, seed):
    g = torch.Generator().manual_seed(seed)
    a, b, bias = (torch.randn(n, generator=g) for n in (4, 4, 1))
    fn = lambda a, b, bias: fusedops.matmul(a, b, bias).shape[0]  # noqa: E731
    assert fn(a, b, bias) == 1
    torch._dynamo.reset()
    try:
        assert torch.compile(fn, backend="eager", fullgraph=True)(a, b, bias) == 1
    finally:
        torch._dynamo.reset()


def test_matmul_fake_kernel_shapes_that_work(seed):
    """The fake kernel agrees with the op for the other 1-D cases (with a bias) and broadcast batches."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    g = torch.Generator().manual_seed(seed)
    cases = [((3, 4), (4,), (1,)), ((4,), (4, 5), (5,)), ((2, 1, 3, 4), (5, 4, 2), (2,)), ((4,), (4,), None)]
    for a_shape, b_shape, bias_shape in cases:
        a, b = torch.randn(a_shape, generator=g), torch.randn(b_shape, generator=g)
        bias = None if bias_shape is None else torch.randn(bias_shape, generator=g)
        real = torch.ops.fusedops.matmul(a, b, bias)
        with FakeTensorMode(allow_non_fake_inputs=False) as mode:
            fake = torch.ops.fusedops.matmul(mode.from_tensor(a), mode.from_tensor(b),
                                             None if bias is None else mode.from_tensor(bias))
        assert fake.shape == real.shape, (a_shape, b_shape, bias_shape)


# ------------------------------------------------------------------------------------------------
# Defect 2: operands saved for the backward although their partner needs no gradient
# ------------------------------------------------------------------------------------------------
def _grad_after_inplace_change_of_a(matmul, w: torch.Tensor, x0: torch.Tensor) -> torch.Tensor:
    x = x0.clone().requires_grad_()
    h = x * 2
    y = matmul(h, w)     # w needs no gradient: dA = dY @ W^T does not read h
    h.add_(1)            # e.g. a residual added in place after the frozen layer read its input
    y.sum().backward()
    return x.grad


def test_matmul_inplace_change_of_input_of_frozen_weight(route, seed):
    g = torch.Generator().manual_seed(seed)
    w, x0 = torch.randn(4, 5, generator=g), torch.randn(3, 4, generator=g)
    expected = _grad_after_inplace_change_of_a(torch.matmul, w.double(), x0.double())
    got = _grad_after_inplace_change_of_a(fusedops.matmul, w, x0)
    assert _max_diff(got, expected) < 1e-5


def test_matmul_inplace_change_of_b_with_constant_a(interpret, seed):
    g = torch.Generator().manual_seed(seed)
    a, w0 = torch.randn(3, 4, generator=g), torch.randn(4, 5, generator=g)

    def grad(matmul, a, w0):
        w = w0.clone().requires_grad_()
        wv = w * 1
        y = matmul(a, wv)    # dB = A^T @ dY does not read wv
        wv.mul_(3)
        y.sum().backward()
        return w.grad

    assert _max_diff(grad(fusedops.matmul, a, w0), grad(torch.matmul, a.double(), w0.double())) < 1e-5


def test_frozen_linear_inplace_change_of_input(interpret, seed):
    ref = torch.nn.Linear(4, 5, dtype=D).requires_grad_(False)
    ours = fnn.Linear(4, 5).requires_grad_(False)
    ours.load_state_dict({k: v.float() for k, v in ref.state_dict().items()}, strict=True)
    x0 = torch.randn(3, 4, generator=torch.Generator().manual_seed(seed))
    expected = _grad_after_inplace_change_of_a(lambda h, m: m(h), ref, x0.double())
    got = _grad_after_inplace_change_of_a(lambda h, m: m(h), ours, x0)
    assert _max_diff(got, expected) < 1e-5


# ------------------------------------------------------------------------------------------------
# Tricky cases that match torch (regression guards)
# ------------------------------------------------------------------------------------------------
_ACTIVATIONS = {None: lambda z: z, "relu": torch.relu, "gelu": F.gelu,
                "gelu_tanh": lambda z: F.gelu(z, approximate="tanh"), "silu": F.silu}


@pytest.mark.parametrize("a_shape,b_shape,bias_n,activation", [
    ((4,), (4,), 1, None),              # dot product with a bias: (1,)
    ((4,), (2, 4, 5), 5, "gelu"),       # 1-D @ batched
    ((2, 3, 4), (4,), 1, "relu"),       # batched @ 1-D
    ((2, 1, 3, 4), (5, 4, 2), 2, "silu"),   # broadcast batch dims, gradients summed back
    ((3, 0), (0, 5), 5, "gelu_tanh"),   # K = 0: activation(bias)
    ((0, 4), (4, 5), 5, None),          # M = 0
])
def test_matmul_shapes_and_gradients_match_torch(route, seed, a_shape, b_shape, bias_n, activation):
    g = torch.Generator().manual_seed(seed)
    a, b, bias = torch.randn(a_shape, generator=g), torch.randn(b_shape, generator=g), torch.randn(bias_n, generator=g)
    leaves = [t.clone().requires_grad_() for t in (a, b, bias)]
    y = fusedops.matmul(*leaves, activation=activation)
    ref_leaves = [t.double().requires_grad_() for t in (a, b, bias)]
    y_ref = _ACTIVATIONS[activation](torch.matmul(ref_leaves[0], ref_leaves[1]) + ref_leaves[2])
    assert y.shape == y_ref.shape and y.dtype == torch.float32
    assert _max_diff(y, y_ref) < 1e-5
    dy = torch.randn(y.shape, generator=g)
    grads = torch.autograd.grad(y, leaves, dy)
    ref_grads = torch.autograd.grad(y_ref, ref_leaves, dy.double())
    for got, expected, leaf in zip(grads, ref_grads, leaves):
        assert got.dtype == leaf.dtype
        assert _max_diff(got, expected) < 1e-4


def test_matmul_out_dtype_and_mixed_bias_dtype_gradients(route, seed):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(3, 4, generator=g).half().requires_grad_()
    b = torch.randn(4, 5, generator=g).half().requires_grad_()
    bias = torch.randn(5, generator=g, dtype=D).requires_grad_()
    y = fusedops.matmul(a, b, bias, "silu", out_dtype=torch.float32)
    assert y.dtype == torch.float32
    ad, bd, biasd = (t.detach().double().requires_grad_() for t in (a, b, bias))
    y_ref = F.silu(ad @ bd + biasd)
    assert _max_diff(y, y_ref) < 1e-5
    dy = torch.randn(y.shape, generator=g)
    grads = torch.autograd.grad(y, (a, b, bias), dy)
    ref = torch.autograd.grad(y_ref, (ad, bd, biasd), dy.double())
    assert [t.dtype for t in grads] == [torch.float16, torch.float16, D]
    for got, expected in zip(grads, ref):
        assert _max_diff(got, expected) < 5e-3


@pytest.mark.parametrize("call,error", [
    (lambda a, b: fusedops.matmul(a, b.half()), TypeError),
    (lambda a, b: fusedops.matmul(a.long(), b.long(), activation="relu"), TypeError),   # (int alone: torch's)
    (lambda a, b: fusedops.matmul(a, b.to("meta")), ValueError),
    (lambda a, b: fusedops.matmul(a, b, bias=torch.zeros(1, 5)), ValueError),
    (lambda a, b: fusedops.matmul(a, b, bias=torch.arange(5)), TypeError),      # (ValueError until session 26)
    (lambda a, b: fusedops.matmul(a, b, activation="tanh"), ValueError),
    (lambda a, b: fusedops.matmul(a, b, out_dtype=torch.int32), TypeError),
    (lambda a, b: fusedops.matmul(torch.tensor(1.0), b), ValueError),
])
def test_matmul_bad_arguments_raise_clear_errors(route, call, error):
    with pytest.raises(error, match="fusedops.matmul"):
        call(torch.randn(3, 4), torch.randn(4, 5))


@pytest.mark.parametrize("log", [False, True])
def test_softmax_edge_inputs_match_torch(route, log):
    ours, theirs = (fusedops.log_softmax, torch.log_softmax) if log else (fusedops.softmax, torch.softmax)
    inf, nan = float("inf"), float("nan")
    cases = [
        (torch.tensor(2.0), -1),
        (torch.full((2, 4), -inf), -1),                            # all -inf rows: NaN
        (torch.tensor([[1.0, inf, 2.0], [inf, inf, 1.0]]), -1),    # +inf
        (torch.tensor([[1.0, nan, 2.0], [1.0, -inf, 3.0]]), -1),   # NaN, a partly -inf row
        (torch.randn(3, 0), 0),
        (torch.randn(0, 5), -1),
        (torch.randn(5, 3).t(), -1),                               # transposed
        (torch.randn(1, 5).expand(3, 5), 0),                       # expanded
    ]
    for x, dim in cases:
        y = ours(x, dim)
        expected = theirs(x.double(), dim)
        assert y.shape == expected.shape and y.dtype == x.dtype
        torch.testing.assert_close(y.double(), expected, atol=1e-6, rtol=1e-5, equal_nan=True)


@pytest.mark.parametrize("log", [False, True])
def test_softmax_half_input_float32_output_gradient_dtype(route, seed, log):
    ours, theirs = (fusedops.log_softmax, torch.log_softmax) if log else (fusedops.softmax, torch.softmax)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(3, 7, generator=g).half().requires_grad_()
    y = ours(x, 0, dtype=torch.float32)
    assert y.dtype == torch.float32
    xd = x.detach().double().requires_grad_()
    y_ref = theirs(xd, 0)
    dy = torch.randn(y.shape, generator=g)
    (dx,) = torch.autograd.grad(y, x, dy)
    (dx_ref,) = torch.autograd.grad(y_ref, xd, dy.double())
    assert dx.dtype == torch.float16
    assert _max_diff(y, y_ref) < 1e-3 and _max_diff(dx, dx_ref) < 5e-3


@pytest.mark.parametrize("dim,error", [(2, IndexError), (-3, IndexError), (None, TypeError), (1.0, TypeError),
                                       (True, TypeError)])
def test_softmax_bad_dims_raise(route, dim, error):
    with pytest.raises(error):
        fusedops.softmax(torch.randn(3, 5), dim)


def test_softmax_double_backward_works_or_raises_clearly(route, seed):
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(seed), requires_grad=True)
    (gx,) = torch.autograd.grad(fusedops.softmax(x, -1).pow(2).sum(), x, create_graph=True)
    xd = x.detach().double().requires_grad_()
    (gxd,) = torch.autograd.grad(torch.softmax(xd, -1).pow(2).sum(), xd, create_graph=True)
    (ggd,) = torch.autograd.grad(gxd.sum(), xd)
    if route == "interpret":
        with pytest.raises(RuntimeError, match="differentiate twice"):
            torch.autograd.grad(gx.sum(), x)
    else:
        (gg,) = torch.autograd.grad(gx.sum(), x)
        assert _max_diff(gg, ggd) < 1e-4


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cpu_autocast_dtypes_match_torch(route, dtype):
    a, b, bias = torch.randn(3, 4), torch.randn(4, 5), torch.randn(5)
    with torch.autocast("cpu", dtype=dtype):
        pairs = [
            (fusedops.matmul(a, b, bias), F.linear(a, b.t(), bias)),
            (fusedops.matmul(a, b), torch.matmul(a, b)),
            (fusedops.softmax(a, -1), torch.softmax(a, -1)),
            (fusedops.layer_norm(a.to(dtype), (4,)), F.layer_norm(a.to(dtype), (4,))),
            (fusedops.matmul(a.double(), b.double()), torch.matmul(a.double(), b.double())),
        ]
    for ours, theirs in pairs:
        assert ours.dtype == theirs.dtype


def test_inference_mode_and_no_grad(route):
    with torch.inference_mode():
        x, w = torch.randn(3, 4), torch.randn(4, 5)
    assert not fusedops.matmul(x, w).is_inference()      # inference tensors read outside inference mode
    x = torch.randn(3, 4, requires_grad=True)
    with torch.no_grad():
        outs = [fusedops.matmul(x, w), fusedops.softmax(x, 0), fusedops.layer_norm(x, (4,)), fusedops.rms_norm(x, (4,))]
    assert not any(t.requires_grad for t in outs)
    with torch.inference_mode():
        y = fusedops.matmul(x, w)
    assert y.is_inference() and not y.requires_grad


@pytest.mark.parametrize("make", [
    lambda: (fnn.LayerNorm(6, bias=False), torch.nn.LayerNorm(6, bias=False)),
    lambda: (fnn.RMSNorm(6, eps=1e-3), torch.nn.RMSNorm(6, eps=1e-3)),
    lambda: (fnn.Linear(6, 4), torch.nn.Linear(6, 4)),
])
def test_modules_state_dict_dtype_pickle_round_trip(route, seed, make):
    ours, ref = make()
    with torch.no_grad():
        for p in ref.parameters():
            p.normal_(generator=torch.Generator().manual_seed(seed))
    ours.load_state_dict(ref.state_dict(), strict=True)
    ref.load_state_dict(ours.state_dict(), strict=True)
    assert repr(ours) == repr(ref)
    x = torch.randn(3, 6, generator=torch.Generator().manual_seed(seed))
    expected = copy.deepcopy(ref).double()(x.double())
    for dtype, tol in ((torch.float32, 1e-5), (torch.float16, 5e-2), (torch.bfloat16, 5e-2)):
        y = copy.deepcopy(ours).to(dtype)(x.to(dtype))
        assert y.dtype == dtype and _max_diff(y, expected) < tol
    clone = pickle.loads(pickle.dumps(ours))
    assert type(clone) is type(ours)
    torch.testing.assert_close(clone(x), ours(x))


def test_multihead_attention_masks_match_torch(route, seed):
    torch.manual_seed(seed)
    ref = torch.nn.MultiheadAttention(8, 2, dtype=D).eval()
    ours = fnn.MultiheadAttention(8, 2, dtype=D).eval()
    ours.load_state_dict(ref.state_dict(), strict=True)
    q, k = torch.randn(4, 2, 8, dtype=D), torch.randn(3, 2, 8, dtype=D)
    attn_mask = torch.tensor([[False, True, False]] * 4)
    padding = torch.randn(2, 3, dtype=D)             # a float key_padding_mask with a bool attn_mask
    out, weights = ours(q, k, k, attn_mask=attn_mask, key_padding_mask=padding, need_weights=False)
    expected, _ = ref(q, k, k, attn_mask=attn_mask, key_padding_mask=padding, need_weights=False)
    assert weights is None and _max_diff(out, expected) < 1e-10
