"""Review (session 40, tensor kinds): unusual kinds of tensors and memory layouts through every public op
(fusedops.softmax / log_softmax / layer_norm / rms_norm / matmul / scaled_dot_product_attention, the custom
operators torch.ops.fusedops.* and the fusedops.nn modules), judged by torch's behaviour for the same input: float64
torch values, torch's own error where torch raises. Both CPU routes (`route` fixture: the kernels in the NumPy
interpreter, FUSEDOPS_INTERPRET=1, what CUDA tensors take; and torch's fallback), forward and backward.
tests/test_review_session24_tensors.py covered the forward of most kinds (layouts, channels_last, aliasing inputs,
non-floating dtypes, subclasses with __torch_function__, neg-bit inputs, meta shapes, inference tensors); the
session 39 reviews covered autograd's contract, DTensor / nested tensors and fuzzed layouts. Not repeated here.

What was tried (peer report -> case), all right:
- executorch#21866 / pytorch#62594 (layer norm / batch norm kernels wrong on channels_last or other dim orders,
  "nothing errors"): the backward of every op with channels_last, permuted, column-sliced and odd-offset float16
  incoming gradients (the forward was session 24's).
- triton#1330 / triton#1320 (misaligned vector accesses from a pointer assumed 16-byte aligned): float16 / bfloat16
  inputs, weights, biases, masks and incoming gradients at element offsets 1 and 3 of their storage, forward and
  backward; and a layout first seen aligned (the launchers' fast path keeps known layouts) then given at an odd
  offset, as a negative-bit view or as `z.conj().imag` (negative bit) of the same shape and strides.
- Liger-Kernel (backward kernels that write dX into grad_output's memory): after a backward, grad_output, the
  forward's output and inputs are unchanged, also for an expanded (stride 0) or self-overlapping grad_output and a
  grad_output that is the output itself; gradients right.
- degenerate shapes a kernel might shortcut (a softmax over one element, K = 1, S = 1 so that O = V): the output
  never shares the inputs' memory and can be written in place, as torch's.
- conj / neg bits: complex inputs with the conj bit (x.conj()) through rms_norm and matmul (torch's complex ops) and
  conj incoming gradients; torch._neg_view incoming gradients and negative-bit inputs and weights in the backward of
  every op; the custom operators called directly with neg-bit, odd-offset, channels_last, permuted, stepped and
  expanded inputs, weights and gradients (norm_backward, softmax_backward, attention backward).
- sparse COO / CSR inputs: matmul (either operand) gives torch.matmul's values; softmax / log_softmax / the norms
  raise torch's own errors for sparse inputs (as torch does).
- meta tensors: forward + backward shapes, strides, dtypes and devices equal torch's for mixed dtypes (a float16
  softmax to float32, rms_norm with a bfloat16 weight of float32 input), transposed inputs, 1-D and broadcast
  batched matmul, out_dtype, GQA attention and a value head dim unlike the query's. (A float16 layer_norm with float32
  weight raises fusedops' documented error on meta too, as on CUDA.)
- zero-size dims in every position, with backward: norms over (0, 4) / (3, 0) normalized shapes, softmax over every
  dim, matmul with M / N / K / batch = 0 (bias, silu), attention with 0 heads, 0 batch, 0 keys (GQA) and 0 queries
  (causal), nn.Linear with 0 in / out features, LayerNorm / RMSNorm(0).
- float64 on the interpreter route: forward and backward within 1e-10 of torch for every op (no float32 step).
- inference tensors as keys / values / masks / weights / biases of a training step: the same outcome as torch (a
  value or torch's "Inference tensors cannot be saved for backward").
- tensor subclasses: plain and __torch_function__-logging subclasses through every nn module (MultiheadAttention
  too): the output and gradient types and values are torch's; __torch_dispatch__ wrapper subclasses
  (torch.testing's LoggingTensor, TwoTensor) get torch's op (logged; TwoTensor's two halves each right).
- modules built on the meta device (torch.device("meta") context, device= / dtype= arguments), then to_empty +
  reset_parameters, or load_state_dict(assign=True); float64 modules' values and gradients within 1e-10.

DEFECTS found: none in this area. Noted, judged not a defect: fusedops.matmul of a tensor subclass composes
torch ops (operands cast to the float32 accumulation dtype, torch.matmul, + bias, activation, cast back:
fusedops.autograd.matmul_reference.reference), so a subclass whose __torch_function__ returns a non-tensor for
torch.matmul fails inside that composition ("'str' object has no attribute 'to'") where torch.matmul returns it;
subclasses that return tensors (quantized-weight subclasses) get their override honoured.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

import fusedops
import fusedops.library  # noqa: F401  (registers torch.ops.fusedops.*)
import fusedops.nn as fnn

F64 = torch.float64

pytestmark = [pytest.mark.filterwarnings("ignore:Mismatch dtype between input and weight"),    # torch's rms_norm
              pytest.mark.filterwarnings("ignore:Initializing zero-element tensors is a no-op")]


def _close(actual, expected, atol=1e-4, rtol=1e-3):
    assert actual.shape == expected.shape
    torch.testing.assert_close(actual.double(), expected.double(), atol=atol, rtol=rtol, equal_nan=True)


def _ops(n=8):
    """(name, fusedops fn, torch fn) over leaves (x (..., n), w (n,))."""
    return [
        ("softmax", lambda x, w: fusedops.softmax(x, -1) * w, lambda x, w: torch.softmax(x, -1) * w),
        ("log_softmax", lambda x, w: fusedops.log_softmax(x, 0) * w, lambda x, w: torch.log_softmax(x, 0) * w),
        ("layer_norm", lambda x, w: fusedops.layer_norm(x, (n,), w, w), lambda x, w: F.layer_norm(x, (n,), w, w)),
        ("rms_norm", lambda x, w: fusedops.rms_norm(x, (n,), w), lambda x, w: F.rms_norm(x, (n,), w)),
        ("matmul", lambda x, w: fusedops.matmul(x, x.transpose(-1, -2), w[:x.shape[-2]], "gelu"),
         lambda x, w: F.gelu(x @ x.transpose(-1, -2) + w[:x.shape[-2]])),
        ("sdpa", lambda x, w: fusedops.scaled_dot_product_attention(x, x, x * w, is_causal=True),
         lambda x, w: F.scaled_dot_product_attention(x, x, x * w, is_causal=True)),
    ]


def _grad_check(fn, ref, leaves, grad=None, tol=1e-3):
    a = [t.detach().clone().requires_grad_() for t in leaves]
    b = [t.detach().double().requires_grad_() for t in leaves]
    y, z = fn(*a), ref(*b)
    _close(y, z, atol=tol, rtol=tol)
    g = torch.randn(z.shape, dtype=y.dtype) if grad is None else grad(tuple(y.shape), y.dtype)
    g_before = g.clone()
    got = torch.autograd.grad(y, a, g)
    want = torch.autograd.grad(z, b, g_before.double())
    assert torch.equal(g, g_before)                  # the incoming gradient is not written
    for u, v in zip(got, want):
        _close(u, v, atol=tol * max(1.0, v.abs().max().item() if v.numel() else 0.0), rtol=tol)


# ------------------------------------------------------------------------------------------------
# incoming gradients of unusual layouts and kinds
# ------------------------------------------------------------------------------------------------
def _grad_of_kind(kind):
    def make(shape, dtype):
        n = 1
        for s in shape:
            n *= s
        if kind == "channels_last":
            return torch.randn(shape, dtype=dtype).contiguous(memory_format=torch.channels_last)
        if kind == "permuted":
            return torch.randn(shape[::-1], dtype=dtype).permute(*reversed(range(len(shape))))
        if kind == "offset1":
            return torch.randn(n + 1, dtype=dtype)[1:].view(shape)
        if kind == "expanded":
            return torch.randn(1, dtype=dtype).expand(shape)
        if kind == "overlapping":
            return torch.randn(n + 8, dtype=dtype).as_strided(shape, (1,) * len(shape))
        if kind == "neg_view":
            return torch._neg_view(torch.randn(shape, dtype=dtype))
        raise AssertionError(kind)
    return make


@pytest.mark.parametrize("kind", ["channels_last", "permuted", "offset1", "expanded", "overlapping", "neg_view"])
def test_backward_with_incoming_gradient_kinds(route, kind):
    """executorch#21866 / Liger-Kernel: a backward reads grad_output by its strides, honours its neg bit and never
    writes into it (an expanded or self-overlapping gradient included)."""
    x = torch.randn(2, 3, 4, 8)
    w = torch.randn(8)
    for name, ours, theirs in _ops():
        if kind == "overlapping" and name == "matmul" and route == "fallback":
            continue    # torch's own CPU gelu(x @ x.T + b) backward rejects it ("could not construct a memory descriptor")
        _grad_check(ours, theirs, [x, w], _grad_of_kind(kind))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_odd_storage_offsets_forward_and_backward(route, dtype):
    """triton#1330: 16-bit tensors at element offsets 1 and 3 (not 16-byte aligned): inputs, weights, biases, keys."""
    base = torch.randn(400, dtype=dtype)
    x = base[1:1 + 6 * 13].view(6, 13)
    w, b = base[3:16], base[5:18]
    tol = 3e-2
    _grad_check(lambda x: fusedops.softmax(x, -1), lambda x: torch.softmax(x, -1), [x], tol=tol)
    _grad_check(lambda x, w, b: fusedops.layer_norm(x, (13,), w, b), lambda x, w, b: F.layer_norm(x, (13,), w, b),
                [x, w, b], tol=tol)
    _grad_check(lambda x, w: fusedops.rms_norm(x, (13,), w), lambda x, w: F.rms_norm(x, (13,), w), [x, w], tol=tol)
    a = base[1:1 + 8 * 16].view(8, 16)
    _grad_check(lambda a, c, bias: fusedops.matmul(a, c.t()[:, 1:], bias, "silu"),
                lambda a, c, bias: F.silu(a @ c.t()[:, 1:] + bias), [a, a[:5], base[7:11]], tol=tol)
    q = base[1:1 + 2 * 5 * 8].view(1, 2, 5, 8)
    kv = base[3:3 + 2 * 7 * 8].view(1, 2, 7, 8)
    _grad_check(lambda q, k: fusedops.scaled_dot_product_attention(q, k, k),
                lambda q, k: F.scaled_dot_product_attention(q, k, k), [q, kv], tol=tol)


def test_warm_layout_then_odd_offset_neg_bit_and_conj_imag(interpret):
    """The launchers keep the layouts they have launched (a fast path): the same shape and strides given next at an
    odd offset, as a negative-bit view, or as `z.conj().imag` (negative bit) must not take the aligned / plain
    launch."""
    base = torch.randn(80, dtype=torch.float16)
    plain, odd = base[:64].view(4, 16), base[1:65].view(4, 16)
    z = torch.randn(4, 16, dtype=torch.complex64)
    conj_imag = z.conj().imag                      # strides (32, 2), offset 1: a stepped view with the neg bit
    cases = [
        ("softmax", lambda t: fusedops.softmax(t, -1), lambda t: torch.softmax(t, -1)),
        ("layer_norm", lambda t: fusedops.layer_norm(t, (16,)), lambda t: F.layer_norm(t, (16,))),
        ("rms_norm", lambda t: fusedops.rms_norm(t, (16,)), lambda t: F.rms_norm(t, (16,))),
        ("matmul", lambda t: fusedops.matmul(t, t.t()), lambda t: t @ t.t()),
        ("sdpa", lambda t: fusedops.scaled_dot_product_attention(t[None], t[None], t[None]),
         lambda t: F.scaled_dot_product_attention(t[None], t[None], t[None])),
    ]
    for _, ours, theirs in cases:
        for t in (plain, odd, torch._neg_view(plain), torch._neg_view(odd)):
            _close(ours(t), theirs(t.resolve_neg().double()), atol=2e-2, rtol=2e-2)
        assert conj_imag.is_neg()
        for warm in (z.imag, conj_imag):           # the plain stepped layout first, then the neg-bit one
            _close(ours(warm), theirs(warm.resolve_neg().double()))


# ------------------------------------------------------------------------------------------------
# outputs never alias inputs; degenerate shapes
# ------------------------------------------------------------------------------------------------
def test_degenerate_shapes_outputs_are_fresh_and_writable(route):
    """A softmax over one element, K = 1, one key (O = V): the result is new memory, writable, as torch's."""
    def fresh(y, *inputs):
        assert all(y.untyped_storage().data_ptr() != t.untyped_storage().data_ptr() for t in inputs)
        y.add_(1)                                   # an expanded result would refuse this
    x = torch.randn(3, 1)
    for dim in (0, 1):
        fresh(fusedops.softmax(x, dim), x)
        fresh(fusedops.log_softmax(x, dim, dtype=torch.float32), x)
    fresh(fusedops.layer_norm(x, (1,)), x)
    fresh(fusedops.rms_norm(x, (1,)), x)
    a, b = torch.randn(3, 1), torch.randn(1, 4)
    fresh(fusedops.matmul(a, b), a, b)
    fresh(fusedops.matmul(a[0], b[:, 0]), a, b)
    q, k = torch.randn(1, 4, 3, 8), torch.randn(1, 1, 1, 8)
    v = torch.randn(1, 1, 1, 8)
    o = fusedops.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    _close(o, v.double().expand(1, 4, 3, 8))
    fresh(o, q, k, v)


# ------------------------------------------------------------------------------------------------
# conj and neg bits
# ------------------------------------------------------------------------------------------------
def test_conj_bit_complex_rms_norm_and_matmul(route):
    c = torch.randn(3, 8, dtype=torch.complex64)
    for conj_input, conj_grad in [(True, False), (False, True), (True, True)]:
        g = torch.randn(3, 8, dtype=torch.complex64)
        gin = g.conj() if conj_grad else g
        a, b = c.clone().requires_grad_(), c.clone().requires_grad_()
        ia, ib = (a.conj(), b.conj()) if conj_input else (a, b)
        y, z = fusedops.rms_norm(ia, (8,), ia[0]), F.rms_norm(ib, (8,), ib[0])
        torch.testing.assert_close(y, z)
        torch.testing.assert_close(torch.autograd.grad(y, a, gin)[0], torch.autograd.grad(z, b, gin)[0])
        a, b = c.clone().requires_grad_(), c.clone().requires_grad_()
        ia, ib = (a.conj(), b.conj()) if conj_input else (a, b)
        y, z = fusedops.matmul(ia, ib.detach().t()), ib @ ib.detach().t()
        torch.testing.assert_close(y, z)
        gm = torch.randn(3, 3, dtype=torch.complex64)
        gm = gm.conj() if conj_grad else gm
        torch.testing.assert_close(torch.autograd.grad(y, a, gm)[0], torch.autograd.grad(z, b, gm)[0])


def test_neg_bit_inputs_and_weights_in_backward(route):
    x, w = torch.randn(2, 3, 4, 8), torch.randn(8)
    for name, ours, theirs in _ops():
        _grad_check(lambda x, w: ours(torch._neg_view(x), w), lambda x, w: theirs(-x, w), [x, w])
        _grad_check(lambda x, w: ours(x, torch._neg_view(w)), lambda x, w: theirs(x, -w), [x, w])


def _kinds(t):
    """(name, tensor of t's values in an unusual layout or kind)."""
    yield "neg", torch._neg_view(-t)
    off = torch.empty(t.numel() + 3, dtype=t.dtype)[3:].view(t.shape)
    yield "offset3", off.copy_(t)
    if t.dim() == 4:
        yield "channels_last", t.contiguous(memory_format=torch.channels_last)
    if t.dim() >= 2:
        yield "permuted", t.mT.contiguous().mT
    else:
        yield "stepped", torch.empty(2 * t.numel(), dtype=t.dtype)[::2].copy_(t)


def test_custom_operators_with_unusual_kinds(route):
    """torch.ops.fusedops.* called directly (an exported program run eagerly calls them): neg-bit, odd-offset,
    channels_last and permuted inputs, weights and incoming gradients, forward and backward operators."""
    ops = torch.ops.fusedops
    x, w = torch.randn(2, 3, 4, 6), torch.randn(6)
    go = torch.randn_like(x)
    y = torch.softmax(x, 1)
    _, mean, rstd = ops.layer_norm(x, [6], w, w, 1e-5)
    xr, wr, br = (t.double().requires_grad_() for t in (x, w, w))
    want_ln = torch.autograd.grad(F.layer_norm(xr, (6,), wr, br), (xr, wr, br), go.double())
    o, lse = ops.scaled_dot_product_attention(x, x, x, None, True, None, False)
    qr = x.double().requires_grad_()
    want_attn = torch.autograd.grad(F.scaled_dot_product_attention(qr, qr, qr, is_causal=True), qr, go.double())[0]
    for kind, t in _kinds(x):
        _close(ops.softmax(t, 1), torch.softmax(x.double(), 1))
        _close(ops.log_softmax(t, -1), torch.log_softmax(x.double(), -1))
        _close(ops.layer_norm(t, [6], w, w, 1e-5)[0], F.layer_norm(x.double(), (6,), w.double(), w.double()))
        _close(ops.rms_norm(t, [6], w, 1e-5)[0], F.rms_norm(x.double(), (6,), w.double(), 1e-5))
        _close(ops.matmul(t, t.mT, t[0, 0, 0, :4], "gelu"),
               F.gelu(x.double() @ x.double().mT + x[0, 0, 0, :4].double()))
        _close(ops.scaled_dot_product_attention(t, t, t, None, True, None, False)[0],
               F.scaled_dot_product_attention(*(x.double(),) * 3, is_causal=True))
        for _, wt in _kinds(w):
            _close(ops.layer_norm(x, [6], wt, wt, 1e-5)[0], F.layer_norm(x.double(), (6,), w.double(), w.double()))
        for gkind, g in _kinds(go):
            _close(ops.softmax_backward(g, y, 1, False, torch.float32),
                   torch._softmax_backward_data(go.double(), y.double(), 1, F64))
            got = ops.norm_backward(g, t, [6], w, mean, rstd, True, True, True, torch.float32)
            for u, v in zip(got, want_ln):
                _close(u, v, atol=1e-3)
            dq, dk, dv = ops.scaled_dot_product_attention_backward(g, t, t, t, o, lse, None, True, None, False)
            _close(dq + dk + dv, want_attn, atol=1e-3)


# ------------------------------------------------------------------------------------------------
# sparse, meta
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", ["coo", "csr"])
def test_sparse_inputs_like_torch(route, layout):
    x = torch.randn(3, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")            # torch: sparse CSR support is in beta
        s = x.relu().to_sparse() if layout == "coo" else x.relu().to_sparse_csr()
    dense = x.relu().double()
    _close(fusedops.matmul(s, x.t()), dense @ x.double().t())
    _close(fusedops.matmul(x.t(), s), x.double().t() @ dense)
    _close(fusedops.matmul(x, s.t()), x.double() @ dense.t())
    for ours, theirs in [(lambda: fusedops.softmax(s, -1), lambda: torch.softmax(s, -1)),
                         (lambda: fusedops.log_softmax(s, -1), lambda: torch.log_softmax(s, -1)),
                         (lambda: fusedops.layer_norm(s, (8,)), lambda: F.layer_norm(s, (8,))),
                         (lambda: fusedops.rms_norm(s, (8,)), lambda: F.rms_norm(s, (8,)))]:
        with pytest.raises(Exception) as theirs_error:
            theirs()
        with pytest.raises(type(theirs_error.value)) as ours_error:
            ours()
        assert str(ours_error.value).split("\n")[0] == str(theirs_error.value).split("\n")[0]


def _meta_signature(fn, leaves):
    ls = [t.to("meta").requires_grad_() for t in leaves]
    y = fn(*ls)
    grads = torch.autograd.grad(y, ls, torch.empty_like(y))
    return [(tuple(t.shape), t.stride(), t.dtype, t.device.type) for t in (y, *grads)]


@pytest.mark.parametrize("case", ["softmax_f16_to_f32", "log_softmax_t", "rms_bf16_weight", "layer_norm_t",
                                  "matmul_1d", "matmul_batched", "matmul_t", "matmul_out_dtype", "sdpa_gqa",
                                  "sdpa_dv", "sdpa_3d_mask"])
def test_meta_forward_and_backward_like_torch(route, case):
    h, x = torch.randn(4, 8, dtype=torch.float16), torch.randn(4, 8)
    q, k = torch.randn(1, 4, 3, 8), torch.randn(1, 2, 5, 8)
    ours, theirs, leaves = {
        "softmax_f16_to_f32": (lambda t: fusedops.softmax(t, -1, dtype=torch.float32),
                               lambda t: torch.softmax(t, -1, dtype=torch.float32), [h]),
        "log_softmax_t": (lambda t: fusedops.log_softmax(t.t(), 0), lambda t: torch.log_softmax(t.t(), 0), [x]),
        "rms_bf16_weight": (lambda t, w: fusedops.rms_norm(t, (8,), w), lambda t, w: F.rms_norm(t, (8,), w),
                            [x, torch.randn(8, dtype=torch.bfloat16)]),
        "layer_norm_t": (lambda t, w: fusedops.layer_norm(t.t(), (4,), w), lambda t, w: F.layer_norm(t.t(), (4,), w),
                         [x, torch.randn(4)]),
        "matmul_1d": (lambda t, w: fusedops.matmul(w, t.t()), lambda t, w: w @ t.t(), [x, torch.randn(8)]),
        "matmul_batched": (lambda a, b: fusedops.matmul(a, b), lambda a, b: a @ b,
                           [torch.randn(2, 1, 3, 4), torch.randn(5, 4, 6)]),
        "matmul_t": (lambda a: fusedops.matmul(a.t(), a), lambda a: a.t() @ a, [x]),
        "matmul_out_dtype": (lambda a: fusedops.matmul(a, a.t(), out_dtype=torch.float32),
                             lambda a: (a @ a.t()).float(), [h]),
        "sdpa_gqa": (lambda q, k: fusedops.scaled_dot_product_attention(q, k, k, enable_gqa=True),
                     lambda q, k: F.scaled_dot_product_attention(q, k, k, enable_gqa=True), [q, k]),
        "sdpa_dv": (lambda q, k: fusedops.scaled_dot_product_attention(q[:, :2], k, k[..., :6]),
                    lambda q, k: F.scaled_dot_product_attention(q[:, :2], k, k[..., :6]), [q, k]),
        "sdpa_3d_mask": (lambda q, m: fusedops.scaled_dot_product_attention(q, q, q, attn_mask=m),
                         lambda q, m: F.scaled_dot_product_attention(q, q, q, attn_mask=m),
                         [torch.randn(2, 3, 8), torch.randn(3, 3)]),
    }[case]
    assert _meta_signature(ours, leaves) == _meta_signature(theirs, leaves)


# ------------------------------------------------------------------------------------------------
# zero-size dims everywhere, with backward
# ------------------------------------------------------------------------------------------------
def test_zero_size_dims_with_backward(route):
    for shape, normalized in [((0, 3, 4), (3, 4)), ((2, 0, 4), (0, 4)), ((2, 3, 0), (3, 0)), ((2, 0, 4), (4,))]:
        x, w = torch.randn(shape), torch.randn(normalized)
        _grad_check(lambda x, w: fusedops.layer_norm(x, normalized, w, w), lambda x, w: F.layer_norm(x, normalized, w, w),
                    [x, w])
        _grad_check(lambda x, w: fusedops.rms_norm(x, normalized, w), lambda x, w: F.rms_norm(x, normalized, w), [x, w])
        for d in range(3):
            _grad_check(lambda x: fusedops.softmax(x, d), lambda x: torch.softmax(x, d), [x])
    for a_shape, b_shape in [((0, 2, 3), (3, 4)), ((2, 0, 3), (3, 4)), ((2, 3, 0), (0, 4)), ((2, 3, 3), (3, 0)),
                             ((0,), (0,)), ((3,), (0, 3, 2))]:
        a, b = torch.randn(a_shape), torch.randn(b_shape)
        _grad_check(lambda a, b: fusedops.matmul(a, b), lambda a, b: a @ b, [a, b])
        if b.dim() >= 2:
            c = torch.randn(b_shape[-1])
            _grad_check(lambda a, b, c: fusedops.matmul(a, b, c, "silu"), lambda a, b, c: F.silu(a @ b + c), [a, b, c])
    for q_shape, k_shape, causal in [((1, 0, 3, 4), (1, 0, 5, 4), False), ((0, 2, 3, 4), (0, 2, 5, 4), True),
                                     ((1, 4, 3, 4), (1, 2, 0, 4), False), ((1, 4, 0, 4), (1, 2, 5, 4), True)]:
        gqa = q_shape[1] != k_shape[1]
        _grad_check(lambda q, k: fusedops.scaled_dot_product_attention(q, k, k, is_causal=causal, enable_gqa=gqa),
                    lambda q, k: F.scaled_dot_product_attention(q, k, k, is_causal=causal, enable_gqa=gqa),
                    [torch.randn(q_shape), torch.randn(k_shape)])
    for ours, theirs, shape in [(fnn.Linear(0, 3), torch.nn.Linear(0, 3), (4, 0)),
                                (fnn.Linear(3, 0), torch.nn.Linear(3, 0), (4, 3)),
                                (fnn.LayerNorm(0), torch.nn.LayerNorm(0), (4, 0)), (fnn.RMSNorm(0), torch.nn.RMSNorm(0), (4, 0))]:
        theirs.load_state_dict(ours.state_dict())
        x = torch.randn(shape)
        _close(ours(x), theirs(x))
        ours(x).sum().backward()


# ------------------------------------------------------------------------------------------------
# float64 on the interpreter route, inference tensors in training
# ------------------------------------------------------------------------------------------------
def test_float64_forward_and_backward_exact(route):
    x, w = torch.randn(2, 3, 5, 8, dtype=F64), torch.randn(8, dtype=F64)
    for name, ours, theirs in _ops():
        a = [t.clone().requires_grad_() for t in (x, w)]
        b = [t.clone().requires_grad_() for t in (x, w)]
        y, z = ours(*a), theirs(*b)
        assert y.dtype == F64
        torch.testing.assert_close(y, z, atol=1e-10, rtol=1e-10)
        g = torch.randn_like(z)
        for u, v in zip(torch.autograd.grad(y, a, g), torch.autograd.grad(z, b, g)):
            torch.testing.assert_close(u, v, atol=1e-10, rtol=1e-10)


def test_inference_tensors_as_parameters_of_a_training_step(route):
    with torch.inference_mode():
        k_inf, w_inf, mask_inf, b_inf = torch.randn(1, 2, 5, 8), torch.randn(8), torch.randn(4, 5), torch.randn(3)
    q = torch.randn(1, 2, 4, 8, requires_grad=True)
    x = torch.randn(3, 8, requires_grad=True)

    def mm(a, b, bias=None, act=None):
        y = a @ b if bias is None else a @ b + bias
        return F.gelu(y) if act else y
    cases = [
        (lambda: fusedops.scaled_dot_product_attention(q, k_inf, k_inf), lambda: F.scaled_dot_product_attention(q, k_inf, k_inf)),
        (lambda: fusedops.scaled_dot_product_attention(q, q, k_inf[:, :, :4]),
         lambda: F.scaled_dot_product_attention(q, q, k_inf[:, :, :4])),
        (lambda: fusedops.scaled_dot_product_attention(q, k_inf.clone(), k_inf.clone(), attn_mask=mask_inf),
         lambda: F.scaled_dot_product_attention(q, k_inf.clone(), k_inf.clone(), attn_mask=mask_inf)),
        (lambda: fusedops.layer_norm(x, (8,), w_inf, w_inf), lambda: F.layer_norm(x, (8,), w_inf, w_inf)),
        (lambda: fusedops.rms_norm(x, (8,), w_inf), lambda: F.rms_norm(x, (8,), w_inf)),
        (lambda: fusedops.matmul(x, x.t(), b_inf, "gelu"), lambda: mm(x, x.t(), b_inf, "gelu")),
        (lambda: fusedops.matmul(x, k_inf[0, 0].t()), lambda: mm(x, k_inf[0, 0].t())),
    ]
    for ours, theirs in cases:
        try:
            z = theirs()
            (gz,) = torch.autograd.grad(z.sum(), [q if z.dim() == 4 else x])
        except RuntimeError as e:
            with pytest.raises(RuntimeError, match="Inference tensors"):
                y = ours()
                torch.autograd.grad(y.sum(), [q if y.dim() == 4 else x])
            assert "Inference tensors" in str(e)
            continue
        y = ours()
        (gy,) = torch.autograd.grad(y.sum(), [q if y.dim() == 4 else x])
        _close(y, z)
        _close(gy, gz, atol=1e-3)


# ------------------------------------------------------------------------------------------------
# tensor subclasses through the modules; __torch_dispatch__ wrapper subclasses
# ------------------------------------------------------------------------------------------------
# (_Logging: a __torch_function__ subclass that logs the calls; _Plain: `class _Plain(torch.Tensor): pass`)
from test_review_session24_tensors import _Logging, _Plain  # noqa: E402


@pytest.mark.parametrize("cls", [_Logging, _Plain])
def test_subclass_inputs_through_modules(route, cls):
    pairs = [(fnn.LayerNorm(8), torch.nn.LayerNorm(8)), (fnn.RMSNorm(8), torch.nn.RMSNorm(8)),
             (fnn.Linear(8, 3), torch.nn.Linear(8, 3)), (fnn.Softmax(-1), torch.nn.Softmax(-1)),
             (fnn.LogSoftmax(0), torch.nn.LogSoftmax(0)),
             (fnn.MultiheadAttention(8, 2, batch_first=True), torch.nn.MultiheadAttention(8, 2, batch_first=True))]
    for ours, theirs in pairs:
        theirs.load_state_dict(ours.state_dict())
        x = torch.randn(2, 4, 8)
        a, b = (x.clone().as_subclass(cls).requires_grad_() for _ in range(2))
        if isinstance(ours, fnn.MultiheadAttention):
            y, z = ours(a, a, a)[0], theirs(b, b, b)[0]
        else:
            y, z = ours(a), theirs(b)
        assert type(y) is type(z) is cls
        _close(y.as_subclass(torch.Tensor), z.as_subclass(torch.Tensor), atol=1e-5)
        y.sum().backward()
        z.sum().backward()
        assert type(a.grad) is type(b.grad)
        _close(a.grad.as_subclass(torch.Tensor), b.grad.as_subclass(torch.Tensor), atol=1e-4)
        for p, r in zip(ours.parameters(), theirs.parameters()):
            _close(p.grad, r.grad, atol=1e-4)


def test_dispatch_wrapper_subclasses_get_torch_ops(route):
    from torch.testing._internal.logging_tensor import LoggingTensor, capture_logs
    from torch.testing._internal.two_tensor import TwoTensor

    x, q = torch.randn(3, 8), torch.randn(1, 2, 4, 8)
    cases = [(lambda t: fusedops.softmax(t, -1), lambda t: torch.softmax(t, -1), x),
             (lambda t: fusedops.layer_norm(t, (8,)), lambda t: F.layer_norm(t, (8,)), x),
             (lambda t: fusedops.rms_norm(t, (8,)), lambda t: F.rms_norm(t, (8,)), x),
             (lambda t: fusedops.matmul(t, t.transpose(-1, -2)), lambda t: t @ t.transpose(-1, -2), x),
             (lambda t: fusedops.scaled_dot_product_attention(t, t, t), lambda t: F.scaled_dot_product_attention(t, t, t), q)]
    for ours, theirs, value in cases:
        with capture_logs() as logs:
            y = ours(LoggingTensor(value.clone()))
        assert type(y) is LoggingTensor and logs          # the subclass saw torch's ops
        two = TwoTensor(value.clone(), value * 2)
        y, z = ours(two), theirs(two)
        assert type(y) is TwoTensor
        _close(y.a, z.a, atol=1e-5)
        _close(y.b, z.b, atol=1e-5)


# ------------------------------------------------------------------------------------------------
# modules on the meta device, float64 modules
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["LayerNorm", "RMSNorm", "Linear", "MultiheadAttention"])
def test_meta_built_modules_and_float64_modules(route, kind):
    args = {"LayerNorm": (8,), "RMSNorm": (8,), "Linear": (8, 4), "MultiheadAttention": (8, 2)}[kind]
    ours_cls, torch_cls = getattr(fnn, kind), getattr(torch.nn, kind)

    def call(m, x):
        return m(x, x, x)[0] if kind == "MultiheadAttention" else m(x)
    with torch.device("meta"):
        m = ours_cls(*args)
    assert all(p.device.type == "meta" for p in m.parameters())
    assert all(p.dtype == F64 for p in ours_cls(*args, device="meta", dtype=F64).parameters())
    m.to_empty(device="cpu")
    getattr(m, "reset_parameters", getattr(m, "_reset_parameters", None))()
    ref = torch_cls(*args)
    ref.load_state_dict(m.state_dict())
    x = torch.randn(3, 8)
    _close(call(m, x), call(ref, x), atol=1e-5)
    assigned = ours_cls(*args, device="meta")
    assigned.load_state_dict(ref.state_dict(), assign=True)
    _close(call(assigned, x), call(ref, x), atol=1e-5)

    m64, r64 = ours_cls(*args, dtype=F64), torch_cls(*args, dtype=F64)
    r64.load_state_dict(m64.state_dict())
    a, b = (x.double().requires_grad_() for _ in range(2))
    y, z = call(m64, a), call(r64, b)
    torch.testing.assert_close(y, z, atol=1e-10, rtol=1e-10)
    y.sum().backward()
    z.sum().backward()
    torch.testing.assert_close(a.grad, b.grad, atol=1e-10, rtol=1e-10)
    for p, r in zip(m64.parameters(), r64.parameters()):
        torch.testing.assert_close(p.grad, r.grad, atol=1e-9, rtol=1e-9)
