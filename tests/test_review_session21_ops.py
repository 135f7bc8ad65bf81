"""Review (session 21): the public ops and drop-in modules against torch, on the CPU.

Every test compares with torch itself (float64 references or torch's own op on the same inputs). The
`interpret` fixture (tests/conftest.py) runs the fusedops kernels in the NumPy interpreter; `fallback`
takes the ops' torch path. The four defects found (an int normalized_shape under torch.func/jit, attn_mask with
is_causal on torch's routes, a 1-D @ 1-D matmul with a (1,) bias, an integer rms_norm weight) are fixed; their
tests were strict xfails until then.
"""

from __future__ import annotations

import copy
import io
import pickle

import pytest
import torch
import torch.nn.functional as F

import fusedops
import fusedops.nn as fnn

D = torch.float64


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return 0.0 if a.numel() == 0 else (a.double() - b.double()).abs().max().item()


# -------------------------------------------------------------------------------------------------
# Defects
# -------------------------------------------------------------------------------------------------
_INT_SHAPE_OPS = {
    "layer_norm": (lambda t, w: fusedops.layer_norm(t, 4, w, None), lambda t, w: F.layer_norm(t, (4,), w, None)),
    "rms_norm": (lambda t, w: fusedops.rms_norm(t, 4, w), lambda t, w: F.rms_norm(t, (4,), w)),
}


@pytest.mark.parametrize("op", sorted(_INT_SHAPE_OPS))
def test_int_normalized_shape_works_eagerly(op, interpret):
    # the documented API: normalized_shape may be an int (as for torch.nn.LayerNorm(4))
    x, w = torch.randn(3, 4, dtype=D), torch.randn(4, dtype=D)
    ours, ref = _INT_SHAPE_OPS[op]
    assert _max_diff(ours(x, w), ref(x, w)) < 1e-12


@pytest.mark.parametrize("op", sorted(_INT_SHAPE_OPS))
@pytest.mark.parametrize("transform", ["vmap", "grad", "jit_trace", "forward_ad"])
def test_int_normalized_shape_under_transforms(op, transform, fallback):
    ours, ref = _INT_SHAPE_OPS[op]
    x, w = torch.randn(3, 4, dtype=D), torch.randn(4, dtype=D)
    if transform == "vmap":
        xs = torch.randn(2, 3, 4, dtype=D)
        got = torch.vmap(lambda t: ours(t, w))(xs)
        want = torch.vmap(lambda t: ref(t, w))(xs)
    elif transform == "grad":
        got = torch.func.grad(lambda t: ours(t, w).pow(2).sum())(x)
        want = torch.func.grad(lambda t: ref(t, w).pow(2).sum())(x)
    elif transform == "jit_trace":
        traced = torch.jit.trace(lambda t: ours(t, w), (x,))
        x2 = torch.randn(3, 4, dtype=D)
        got, want = traced(x2), ref(x2, w)
    else:
        import torch.autograd.forward_ad as fwAD
        tangent = torch.randn_like(x)
        with fwAD.dual_level():
            got = fwAD.unpack_dual(ours(fwAD.make_dual(x, tangent), w)).tangent
            want = fwAD.unpack_dual(ref(fwAD.make_dual(x, tangent), w)).tangent
    assert _max_diff(got, want) < 1e-12


def test_matmul_vector_dot_with_bias_shape(interpret):
    a, b, bias = torch.randn(5, dtype=D), torch.randn(5, dtype=D), torch.randn(1, dtype=D)
    got, want = fusedops.matmul(a, b, bias), torch.matmul(a, b) + bias
    assert got.shape == want.shape
    assert _max_diff(got, want) < 1e-12


def test_matmul_vector_dot_with_bias_shape_fallback(fallback):
    a, b, bias = torch.randn(5, dtype=D), torch.randn(5, dtype=D), torch.randn(1, dtype=D)
    assert fusedops.matmul(a, b, bias).shape == (torch.matmul(a, b) + bias).shape


def _causal_plus_mask_reference(q, k, v, mask):
    length_q, length_k = q.size(-2), k.size(-2)
    causal = torch.zeros(length_q, length_k, dtype=q.dtype).masked_fill(
        ~torch.ones(length_q, length_k, dtype=torch.bool).tril(), -float("inf"))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask + causal)


def test_sdpa_causal_plus_mask_kernel_path(interpret):
    # documented extension: attn_mask and is_causal may be combined (both apply); torch itself raises
    q, k, v = torch.randn(1, 2, 4, 8, dtype=D), torch.randn(1, 2, 6, 8, dtype=D), torch.randn(1, 2, 6, 5, dtype=D)
    mask = torch.randn(4, 6, dtype=D)
    got = fusedops.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=True)
    assert _max_diff(got, _causal_plus_mask_reference(q, k, v, mask)) < 1e-12


@pytest.mark.parametrize("route", ["cpu_fallback", "mask_requires_grad", "large_head_dim"])
def test_sdpa_causal_plus_mask_on_torch_routes(route, monkeypatch):
    if route == "cpu_fallback":
        monkeypatch.delenv("FUSEDOPS_INTERPRET", raising=False)
    else:
        monkeypatch.setenv("FUSEDOPS_INTERPRET", "1")
    e = 264 if route == "large_head_dim" else 8
    q, k, v = torch.randn(1, 2, 4, e, dtype=D), torch.randn(1, 2, 6, e, dtype=D), torch.randn(1, 2, 6, 5, dtype=D)
    mask = torch.randn(4, 6, dtype=D, requires_grad=route == "mask_requires_grad")
    got = fusedops.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=True)
    assert _max_diff(got, _causal_plus_mask_reference(q, k, v, mask.detach())) < 1e-12


def test_rms_norm_integer_weight_like_torch(fallback):
    x, w = torch.randn(3, 4, dtype=D), torch.tensor([1, 2, 3, 4])
    assert _max_diff(fusedops.rms_norm(x, (4,), w), F.rms_norm(x, (4,), w)) < 1e-12


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("weight", [[1, -2, 3, 4], [True, False, True, True]])
def test_rms_norm_integer_and_bool_weights_on_the_kernel_path(weight, dtype, interpret):
    x, w = torch.randn(3, 4, dtype=dtype), torch.tensor(weight)
    got, expected = fusedops.rms_norm(x, 4, w), F.rms_norm(x.double(), (4,), w.double())
    assert got.dtype == dtype and _max_diff(got, expected) < (1e-12 if dtype == torch.float64 else 1e-5)


# -------------------------------------------------------------------------------------------------
# What held up (kernel path in the interpreter)
# -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("log", [False, True])
def test_softmax_layouts_and_specials(log, interpret):
    ours = fusedops.log_softmax if log else fusedops.softmax
    ref = torch.log_softmax if log else torch.softmax
    x = torch.randn(3, 4, 5, dtype=D)
    for t, dim in [(x, -1), (x, 0), (x.transpose(0, 2), 1), (x[:, ::2], -2),
                   (torch.randn(1, 5, dtype=D).expand(4, 5), 0),
                   (torch.randn(2, 3, 4, 5, dtype=D).to(memory_format=torch.channels_last), 1),
                   (torch.tensor(2.0, dtype=D), -1)]:
        got, want = ours(t, dim), ref(t, dim)
        assert got.shape == want.shape and got.dtype == want.dtype
        assert _max_diff(got, want) < 1e-12
    special = torch.tensor([[-float("inf"), 1.0, 2.0], [float("inf"), 0.0, 1.0], [-float("inf")] * 3], dtype=D)
    torch.testing.assert_close(ours(special, 1), ref(special, 1), equal_nan=True)
    assert ours(torch.randn(0, 5), 1).shape == (0, 5) and ours(torch.randn(3, 0), 1).shape == (3, 0)
    with pytest.raises(IndexError):
        ours(x, 3)
    with pytest.raises(TypeError):
        ours(torch.arange(4), 0)
    ints = torch.arange(4)
    assert _max_diff(ours(ints, 0, dtype=torch.float32), ref(ints, 0, dtype=torch.float32)) < 1e-6
    got = ours(x.float(), 1, dtype=torch.float16)
    assert got.dtype == torch.float16 and _max_diff(got, ref(x.float(), 1, dtype=torch.float16)) < 2e-3


def test_softmax_gradcheck_and_half_dtype_grad(interpret):
    x = torch.randn(3, 4, 5, dtype=D, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: fusedops.softmax(t, 1), (x,))
    assert torch.autograd.gradcheck(lambda t: fusedops.log_softmax(t, -1), (x,))
    xh = torch.randn(3, 5, dtype=torch.float16, requires_grad=True)
    g = torch.autograd.grad(fusedops.softmax(xh, 1, dtype=torch.float32).pow(2).sum(), xh)[0]
    gr = torch.autograd.grad(torch.softmax(xh, 1, dtype=torch.float32).pow(2).sum(), xh)[0]
    assert g.dtype == torch.float16 and _max_diff(g, gr) < 1e-3


def test_norms_layouts_params_and_errors(interpret):
    x = torch.randn(3, 4, 5, dtype=D)
    w, b = torch.randn(5, dtype=D), torch.randn(5, dtype=D)
    w2 = torch.randn(4, 5, dtype=D).t()     # (5, 4), transposed
    cases = [((x, 5, w, b), (x, (5,), w, b)), ((x, [5], w, None), (x, [5], w, None)),
             ((x, torch.Size([5]), None, b), (x, (5,), None, b)),
             ((x.transpose(1, 2), (5, 4), w2, w2), (x.transpose(1, 2), (5, 4), w2, w2)),
             ((torch.randn(4, 1, dtype=D).expand(4, 5), 5, torch.randn(10, dtype=D)[::2], None),
              None)]
    for args, ref_args in cases:
        ref_args = ref_args or (args[0], (5,), args[2], args[3])
        assert _max_diff(fusedops.layer_norm(*args, eps=0.1), F.layer_norm(*ref_args, eps=0.1)) < 1e-12
    assert _max_diff(fusedops.rms_norm(x, (4, 5), w2.t()), F.rms_norm(x, (4, 5), w2.t())) < 1e-12
    const = torch.ones(2, 5, dtype=D)
    torch.testing.assert_close(fusedops.layer_norm(const, 5, eps=0.0), F.layer_norm(const, (5,), eps=0.0),
                               equal_nan=True)
    assert fusedops.layer_norm(torch.randn(3, 0), 0).shape == (3, 0)
    for bad in [lambda: fusedops.layer_norm(x, 4), lambda: fusedops.layer_norm(x, ()),
                lambda: fusedops.layer_norm(x, 5, torch.randn(1, 5, dtype=D)),
                lambda: fusedops.layer_norm(torch.ones(2, 5, dtype=torch.long), 5),
                lambda: fusedops.layer_norm(x.float(), 5, w)]:
        with pytest.raises((ValueError, TypeError)):
            bad()
    # the CPU's mixed case: a bfloat16 input with float32 parameters (fusedops is at least as exact as torch)
    xb = torch.randn(3, 8).bfloat16()
    wf, bf = torch.randn(8), torch.randn(8)
    got, want = fusedops.layer_norm(xb, (8,), wf, bf), F.layer_norm(xb, (8,), wf, bf)
    assert got.dtype == want.dtype == torch.bfloat16 and _max_diff(got, want) < 2e-2


def test_norms_gradcheck(interpret):
    x = torch.randn(2, 3, 4, dtype=D, requires_grad=True)
    w = torch.randn(3, 4, dtype=D, requires_grad=True)
    b = torch.randn(3, 4, dtype=D, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, c, d: fusedops.layer_norm(a, (3, 4), c, d), (x, w, b))
    assert torch.autograd.gradcheck(lambda c: fusedops.layer_norm(x.detach(), (3, 4), c, None), (w,))
    assert torch.autograd.gradcheck(lambda a, c: fusedops.rms_norm(a, (3, 4), c, eps=0.5), (x, w))


def _sdpa_cmp(*args, **kwargs):
    got = fusedops.scaled_dot_product_attention(*args, **kwargs)
    want = F.scaled_dot_product_attention(*args, **kwargs)
    assert got.shape == want.shape and got.dtype == want.dtype
    return _max_diff(got, want)


def test_sdpa_against_torch(interpret):
    q, k, v = torch.randn(2, 3, 4, 8, dtype=D), torch.randn(2, 3, 6, 8, dtype=D), torch.randn(2, 3, 6, 5, dtype=D)
    mask = torch.zeros(4, 6, dtype=torch.bool)
    mask[0] = True
    mask[2, :3] = True
    for kwargs in [{}, {"is_causal": True}, {"scale": 0.3}, {"scale": 0.0}, {"attn_mask": mask},
                   {"attn_mask": torch.randn(2, 1, 4, 6, dtype=D)}, {"attn_mask": torch.randn(4, 6)},
                   {"attn_mask": torch.full((4, 6), -float("inf"), dtype=D)}]:
        assert _sdpa_cmp(q, k, v, **kwargs) < 1e-12, kwargs
    assert _sdpa_cmp(k, q, q[..., :5], is_causal=True) < 1e-12             # L > S
    assert _sdpa_cmp(torch.randn(2, 6, 4, 8, dtype=D), k, v, enable_gqa=True, is_causal=True) < 1e-12
    assert _sdpa_cmp(q[0, 0], k[0, 0], v[0, 0]) < 1e-12 and _sdpa_cmp(q[:, :1], k, v) < 1e-12
    assert _sdpa_cmp(q, k[:, :, :0], v[:, :, :0]) == 0.0 and _sdpa_cmp(q[..., :0], k[..., :0], v) < 1e-12
    with pytest.raises(NotImplementedError):
        fusedops.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    with pytest.raises(RuntimeError):
        fusedops.scaled_dot_product_attention(torch.randn(2, 4, 4, 8, dtype=D), k, v, enable_gqa=True)
    with pytest.raises(RuntimeError):
        fusedops.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(4, 6, dtype=torch.long))


def test_sdpa_gradcheck(interpret):
    q = torch.randn(1, 2, 3, 4, dtype=D, requires_grad=True)
    k = torch.randn(1, 1, 5, 4, dtype=D, requires_grad=True)
    v = torch.randn(1, 1, 5, 3, dtype=D, requires_grad=True)
    mask = torch.rand(3, 5) > 0.3
    mask[0] = False     # a fully masked row
    assert torch.autograd.gradcheck(
        lambda a, b, c: fusedops.scaled_dot_product_attention(a, b, c, attn_mask=mask, enable_gqa=True), (q, k, v))


def test_matmul_shapes_and_grads(interpret):
    a, b = torch.randn(3, 5, dtype=D), torch.randn(5, 4, dtype=D)
    for x, y in [(a, b), (a[0], b), (a, b[:, 0]), (a[0], torch.randn(2, 5, 4, dtype=D)), (torch.randn(2, 1, 3, 5, dtype=D), torch.randn(4, 5, 4, dtype=D)),
                 (a[:, :0], b[:0]), (torch.randn(5, 3, dtype=D).t(), torch.randn(5, 1, dtype=D).expand(5, 4))]:
        assert _max_diff(fusedops.matmul(x, y), torch.matmul(x, y)) < 1e-12
    bias = torch.randn(4)
    assert _max_diff(fusedops.matmul(a, b, bias, "gelu_tanh"), F.gelu(a @ b + bias.double(), approximate="tanh")) < 1e-12
    x = torch.randn(2, 3, 4, dtype=D, requires_grad=True)
    y = torch.randn(4, 2, dtype=D, requires_grad=True)
    z = torch.randn(2, dtype=D, requires_grad=True)
    assert torch.autograd.gradcheck(lambda p, q, r: fusedops.matmul(p, q, r, "silu"), (x, y, z))


def _mha_pair(**kwargs):
    ref = torch.nn.MultiheadAttention(8, 2, dtype=D, **kwargs)
    ours = fnn.MultiheadAttention(8, 2, dtype=D, **kwargs)
    ours.load_state_dict(ref.state_dict(), strict=True)
    return ours.eval(), ref.eval()


def test_multihead_attention_against_torch(interpret):
    L, S, N = 4, 5, 2
    q, k, v = torch.randn(L, N, 8, dtype=D), torch.randn(S, N, 8, dtype=D), torch.randn(S, N, 8, dtype=D)
    kpm = torch.rand(N, S) > 0.6
    kpm[:, 0] = False
    am = torch.rand(L, S) > 0.6
    am[:, 0] = False
    causal = torch.nn.Transformer.generate_square_subsequent_mask(L, dtype=D)
    runs = [({}, (q, k, v), {}), ({"batch_first": True}, (q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)), {}),
            ({}, (q[:, 0], k[:, 0], v[:, 0]), {}), ({}, (q, k, v), {"key_padding_mask": kpm}),
            ({}, (q, k, v), {"key_padding_mask": torch.randn(N, S, dtype=D)}), ({}, (q, k, v), {"attn_mask": am}),
            ({}, (q, k, v), {"attn_mask": torch.randn(N * 2, L, S, dtype=D), "key_padding_mask": kpm}),
            ({}, (q, k[:L], v[:L]), {"attn_mask": causal, "is_causal": True}),
            ({"kdim": 6, "vdim": 3}, (q, torch.randn(S, N, 6, dtype=D), torch.randn(S, N, 3, dtype=D)), {}),
            ({"bias": False}, (q, k, v), {}), ({"add_bias_kv": True}, (q, k, v), {}),
            ({"add_zero_attn": True}, (q, k, v), {})]
    for ctor, inputs, kwargs in runs:
        ours, ref = _mha_pair(**ctor)
        for need_weights in (False, True):
            got, want = ours(*inputs, need_weights=need_weights, **kwargs), ref(*inputs, need_weights=need_weights,
                                                                               **kwargs)
            assert _max_diff(got[0], want[0]) < 1e-12, (ctor, kwargs)
            assert (got[1] is None) == (want[1] is None)
    ours, ref = _mha_pair()
    with pytest.raises(RuntimeError):
        ours(q, k, v, is_causal=True, need_weights=False)
    with pytest.raises(RuntimeError):
        ours(q, k, v, attn_mask=torch.zeros(L, L, dtype=torch.bool), need_weights=False)
    with pytest.raises(AssertionError):
        ours(q, k, v, key_padding_mask=kpm.long(), need_weights=False)


def test_modules_round_trips(interpret):
    for cls, tcls, shape, kwargs in [(fnn.LayerNorm, torch.nn.LayerNorm, (4,), {}),
                                     (fnn.LayerNorm, torch.nn.LayerNorm, 4, {"bias": False, "eps": 0.1}),
                                     (fnn.RMSNorm, torch.nn.RMSNorm, [2, 4], {"eps": 0.2})]:
        ref = tcls(shape, dtype=D, **kwargs)
        with torch.no_grad():
            for p in ref.parameters():
                p.normal_()
        ours = cls(shape, dtype=D, **kwargs)
        ours.load_state_dict(ref.state_dict(), strict=True)
        assert repr(ours) == repr(ref)
        x = torch.randn(3, 2, 4, dtype=D, requires_grad=True)
        y, yr = ours(x), ref(x)
        g = torch.randn_like(y)
        grads = torch.autograd.grad(y, [x, *ours.parameters()], g)
        grads_ref = torch.autograd.grad(yr, [x, *ref.parameters()], g)
        assert _max_diff(y, yr) < 1e-12 and max(map(_max_diff, grads, grads_ref)) < 1e-12
        for clone in (copy.deepcopy(ours), pickle.loads(pickle.dumps(ours))):
            assert _max_diff(clone(x), yr) < 1e-12
    mha, _ = _mha_pair()
    buffer = io.BytesIO()
    torch.save(mha, buffer)
    buffer.seek(0)
    assert type(torch.load(buffer, weights_only=False)) is fnn.MultiheadAttention
    with pytest.raises(RuntimeError):
        fnn.LayerNorm(4)(torch.randn(3, 5))


@pytest.mark.parametrize("op", ["softmax", "layer_norm", "rms_norm", "matmul"])
def test_tracing_and_transforms_with_tuple_shapes(op, interpret):
    w = torch.randn(4, dtype=D)
    ours, ref = {
        "softmax": (lambda t: fusedops.softmax(t, -1), lambda t: torch.softmax(t, -1)),
        "layer_norm": (lambda t: fusedops.layer_norm(t, (4,), w, w), lambda t: F.layer_norm(t, (4,), w, w)),
        "rms_norm": (lambda t: fusedops.rms_norm(t, (4,), w), lambda t: F.rms_norm(t, (4,), w)),
        "matmul": (lambda t: fusedops.matmul(t, t.t()), lambda t: t @ t.t()),
    }[op]
    x = torch.randn(3, 4, dtype=D)
    assert _max_diff(torch.compile(ours, backend="eager", fullgraph=True)(x), ref(x)) < 1e-12
    xs = torch.randn(2, 3, 4, dtype=D)
    assert _max_diff(torch.vmap(ours)(xs), torch.vmap(ref)(xs)) < 1e-12
    assert _max_diff(torch.func.grad(lambda t: ours(t).pow(2).sum())(x),
                     torch.func.grad(lambda t: ref(t).pow(2).sum())(x)) < 1e-12
    with torch.inference_mode():
        y = ours(x)
    assert y.is_inference() and _max_diff(y, ref(x)) < 1e-12
