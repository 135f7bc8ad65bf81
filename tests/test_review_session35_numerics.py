"""Review session 35 (numerics): the library ops in the interpreter (FUSEDOPS_INTERPRET=1, the route CUDA
tensors take) at inputs taken from bug reports in peer projects, against float64 references and torch.

Inspirations: "softmax all -inf row NaN" (triton / flash-attention), "gelu/silu at large |x| NaN"
(pytorch), "attention fully masked row NaN / wrong gradients with finfo.min padding masks" (transformers'
_unmask_unattended, pytorch sdpa), "flash attention scale inf", "matmul bias fp16 overflow", empty dims.

No defect was found: every test passes. Where torch's CPU kernels themselves leave the float64 answer
(F.gelu(+inf) is NaN in float32 vectorized CPU code; the CPU flash sdpa's backward of a row masked by a
huge finite value; layer_norm of one float32 element near finfo.max), the tests compare with float64.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import fusedops
from fusedops.autograd.matmul_reference import apply_activation

INF = float("inf")
NAN = float("nan")
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
ACTIVATIONS = (None, "relu", "gelu", "gelu_tanh", "silu")


def _f64_activation(z: torch.Tensor, activation):
    return apply_activation(z.double(), activation)


def _assert_like(ours: torch.Tensor, ref: torch.Tensor, rtol: float, atol: float):
    """Same NaN and inf pattern (and signs of infinities); finite values close."""
    o, r = ours.double(), ref.double()
    assert torch.equal(o.isnan(), r.isnan()), (o, r)
    assert torch.equal(o.isinf(), r.isinf()), (o, r)
    assert torch.equal(o[o.isinf()], r[r.isinf()]), (o, r)
    fin = torch.isfinite(o)
    torch.testing.assert_close(o[fin], r[fin], rtol=rtol, atol=atol)


def _tol(dtype):
    return {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float64: 1e-12}[dtype]


# ------------------------------------------------------------------------------------------------
# matmul epilogues
# ------------------------------------------------------------------------------------------------
def _special_column(dtype):
    fi = torch.finfo(dtype)
    vals = [-INF, -fi.max, -1e4, -104.0, -100.0, -90.0, -88.0, -20.0, -10.0, -1.0, -fi.tiny, 0.0,
            fi.tiny, 1.0, 10.0, 20.0, 88.0, 90.0, 104.0, 1e4, fi.max, INF, NAN]
    if dtype != torch.float16:
        vals += [-1e30, -1e20, -1e13, 1e13, 1e20, 1e30]
    return torch.tensor(vals, dtype=torch.float64).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_matmul_epilogue_at_exp_limits_and_infinities(interpret, dtype, activation):
    # silu / gelu at +-inf and +-88..104 (float32 exp's limits): the epilogue in float32 then one rounding,
    # against the float64 activation of the same float32 pre-activation
    col = _special_column(dtype)
    a = col.reshape(-1, 1)
    b = torch.ones(1, 8, dtype=dtype)
    ours = fusedops.matmul(a, b, activation=activation)
    z = (a.float() @ b.float())
    ref = _f64_activation(z, activation).to(dtype)
    # gelu's 1 + erf(x / sqrt 2) cancels below x ~ -4 in float32 (torch's too): absolute tolerance there
    _assert_like(ours, ref, rtol=max(_tol(dtype), 2e-6) * 4, atol=1e-6 if dtype == torch.float32 else 1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_matmul_with_k_zero_is_the_activation_of_special_biases(interpret, dtype, activation):
    # torch's vectorized CPU F.gelu(+inf) is NaN in float32 (inf in float64, and mathematically): the
    # float64 activation is the reference
    a = torch.randn(3, 0, dtype=dtype)
    b = torch.randn(0, 6, dtype=dtype)
    bias = torch.tensor([-INF, -100.0, -0.0, 1.0, INF, NAN]).to(dtype)
    ours = fusedops.matmul(a, b, bias, activation)
    ref = _f64_activation(bias.double().expand(3, 6), activation).to(dtype)
    _assert_like(ours, ref, rtol=_tol(dtype), atol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("activation", ACTIVATIONS[1:])
def test_matmul_activation_gradients_at_extreme_pre_activations(interpret, dtype, activation):
    vals = [-INF, -1e20, -1e13, -200.0, -104.0, -90.0, -20.0, -5.0, -1e-30, 0.0, 5.0, 20.0, 90.0, 104.0,
            1e13, 1e20, INF]
    col = torch.tensor(vals).to(dtype)
    a = col.reshape(-1, 1).clone().requires_grad_()
    b = torch.ones(1, 2, dtype=dtype, requires_grad=True)
    out = fusedops.matmul(a, b, activation=activation)
    out.backward(torch.ones_like(out))
    a32 = col.float().reshape(-1, 1).clone().requires_grad_()
    b32 = torch.ones(1, 2, requires_grad=True)
    ref = apply_activation(a32 @ b32, activation)
    ref.backward(torch.ones_like(ref))
    _assert_like(a.grad, a32.grad.to(dtype), rtol=2e-2, atol=1e-2)
    _assert_like(out.detach(), ref.detach().to(dtype), rtol=2e-2, atol=1e-2)


@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16))
def test_matmul_bias_brings_an_overflowing_product_back_into_range(interpret, dtype):
    # the bias is added to the float32 accumulator before the one rounding (as Linear's addmm does):
    # 4 * (200 * 100) = 80000 overflows float16, 80000 - 40000 does not
    a = torch.full((2, 4), 200.0, dtype=dtype)
    b = torch.full((4, 3), 100.0, dtype=dtype)
    bias = torch.tensor([-40000.0, 0.0, -80000.0], dtype=torch.float32)
    ours = fusedops.matmul(a, b, bias)
    ref = (a.double() @ b.double() + bias.double()).to(dtype)
    _assert_like(ours, ref, rtol=_tol(dtype), atol=0)
    assert torch.isfinite(ours[:, 0]).all() and ours[0, 0].item() == torch.tensor(40000.0).to(dtype).item()


# ------------------------------------------------------------------------------------------------
# softmax / log_softmax
# ------------------------------------------------------------------------------------------------
ROWS = {
    "all_neg_inf": [-INF] * 5,
    "mixed_inf": [INF, -INF, 1.0, 2.0, 3.0],
    "two_pos_inf": [INF, INF, 0.0, 0.0, 0.0],
    "nan": [NAN, 1.0, 2.0, 3.0, 4.0],
    "huge_both_signs": [3e38, -3e38, 3e38, 0.0, 1.0],
    "subnormal": [1e-45, -1e-45, 0.0, 1e-40, 0.0],
    "constant": [7.0] * 5,
    "one_visible": [-INF, -INF, -INF, -INF, 5.0],
    "neg_max": [-3.4e38] * 5,
    "dominating": [0.0, -200.0, -100.0, -50.0, -30.0],
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("log", (False, True))
@pytest.mark.parametrize("width", (1, 5, 37))
def test_softmax_special_rows_with_dtype_argument_match_torch(interpret, dtype, log, width):
    ours_op, torch_op = (fusedops.log_softmax, torch.log_softmax) if log else (fusedops.softmax, torch.softmax)
    rows = []
    for r in ROWS.values():
        row = torch.tensor(r, dtype=torch.float64)
        row = row[:1] if width == 1 else torch.cat([row, torch.full((width - 5,), -INF, dtype=torch.float64)])
        rows.append(row)
    x = torch.stack(rows).to(dtype)
    for out_dtype in (None, torch.float32, torch.float64):
        for dim, inp in ((-1, x), (0, x.t())):
            ours = ours_op(inp, dim, dtype=out_dtype)
            ref = torch_op(inp, dim, dtype=out_dtype)
            assert ours.dtype == ref.dtype
            _assert_like(ours, ref, rtol=_tol(out_dtype or dtype) * 2, atol=_tol(out_dtype or dtype))


@pytest.mark.parametrize("dtype", (torch.float32, torch.float16))
def test_empty_dims_match_torch(interpret, dtype):
    x = torch.randn(3, 0, dtype=dtype)
    assert fusedops.softmax(x, 1).shape == (3, 0)
    assert fusedops.log_softmax(x, 0, dtype=torch.float64).dtype == torch.float64
    x0 = torch.randn(0, 5, dtype=dtype)
    assert fusedops.layer_norm(x0, (5,)).shape == (0, 5)
    assert fusedops.rms_norm(x0, (5,)).shape == (0, 5)
    q = torch.randn(1, 2, 3, 8, dtype=dtype)
    kv = torch.randn(1, 2, 0, 8, dtype=dtype)
    out = fusedops.scaled_dot_product_attention(q, kv, kv)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, kv, kv))
    x1 = torch.tensor([[3.0], [-INF], [NAN]], dtype=dtype)
    _assert_like(fusedops.softmax(x1, 1), torch.softmax(x1, 1), rtol=0, atol=0)
    _assert_like(fusedops.log_softmax(x1, 1), torch.log_softmax(x1, 1), rtol=0, atol=0)


# ------------------------------------------------------------------------------------------------
# layer_norm / rms_norm
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", (2, 127, 1025, 8193))
def test_norms_with_non_finite_and_subnormal_rows_forward_and_backward(interpret, dtype, n):
    x = torch.randn(5, n)
    x[0, -1] = INF
    x[1, -1] = NAN
    x[2, -1] = -INF
    x[3] = x[3] * (1e-30 if dtype != torch.float16 else 1e-6)
    x = x.to(dtype)
    w = torch.randn(n).to(dtype)
    b = torch.randn(n).to(dtype)
    g = torch.randn(5, n).to(dtype)
    cases = ((lambda x, w, b: fusedops.layer_norm(x, (n,), w, b), lambda x, w, b: F.layer_norm(x, (n,), w, b)),
             (lambda x, w, b: fusedops.rms_norm(x, (n,), w), lambda x, w, b: F.rms_norm(x, (n,), w, eps=torch.finfo(torch.float32).eps)))
    for ours_fn, ref_fn in cases:
        xs = [t.clone().requires_grad_() for t in (x, w, b)]
        out = ours_fn(*xs)
        out.backward(g)
        rs = [t.double().requires_grad_() for t in (x, w, b)]
        ref = ref_fn(*rs)
        ref.backward(g.double())
        tol = max(_tol(dtype), 1e-4) * 4
        _assert_like(out.detach(), ref.detach().to(dtype), rtol=tol, atol=tol)
        _assert_like(xs[0].grad[1:3], rs[0].grad[1:3].to(dtype), rtol=tol, atol=tol)
        finite_rows = [3, 4]
        _assert_like(xs[0].grad[finite_rows], rs[0].grad[finite_rows].to(dtype), rtol=tol * 10, atol=tol * 10)


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16))
def test_layer_norm_of_one_element_near_the_max_is_the_bias(interpret, dtype):
    # torch's CPU layer_norm gives NaN here (its E[x^2] overflows); the float64 answer is the bias
    x = torch.tensor([[3.0e38], [-3.0e38], [1.0]]).to(dtype)
    w = torch.tensor([2.0], dtype=dtype)
    b = torch.tensor([0.5], dtype=dtype)
    ours = fusedops.layer_norm(x, (1,), w, b)
    torch.testing.assert_close(ours, F.layer_norm(x.double(), (1,), w.double(), b.double()).to(dtype))


# ------------------------------------------------------------------------------------------------
# scaled_dot_product_attention
# ------------------------------------------------------------------------------------------------
def _math_f64(q, k, v, **kwargs):
    mask = kwargs.pop("attn_mask", None)
    with sdpa_kernel(SDPBackend.MATH):
        return F.scaled_dot_product_attention(q.double(), k.double(), v.double(),
                                              attn_mask=None if mask is None else (mask if mask.dtype == torch.bool
                                                                                   else mask.double()), **kwargs)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fill", ("finfo32_min", "-1e20", "-1e30", "dtype_min"))
def test_sdpa_rows_masked_by_huge_finite_values_gradients_follow_float64(interpret, dtype, fill):
    # transformers' padding masks use finfo.min: a padded query row sees only that value, so its softmax
    # is uniform and its gradients are those of softmax(q.k * scale) (the constant drops out). The forward
    # keeps log2(l) next to the huge row max (TwoSum): the recomputed P in the backward is 1/S, not 1.
    # (torch's CPU flash sdpa backward gets this wrong: its P is 1; the float64 math backend is the reference.)
    if dtype == torch.float16 and fill != "dtype_min":
        pytest.skip("not representable in a float16 mask")
    value = {"finfo32_min": torch.finfo(torch.float32).min, "-1e20": -1e20, "-1e30": -1e30,
             "dtype_min": torch.finfo(dtype).min}[fill]
    mask_dtype = torch.float32 if (fill == "finfo32_min" or dtype == torch.float32) else dtype
    L, S, E = 4, 70, 16
    q, k, v = (torch.randn(1, 2, n, E).to(dtype) for n in (L, S, S))
    mask = torch.zeros(1, 1, L, S, dtype=mask_dtype)
    mask[..., 1, :] = value
    mask[..., 2, 3:] = value
    ins = [t.clone().requires_grad_() for t in (q, k, v)]
    out = fusedops.scaled_dot_product_attention(*ins, attn_mask=mask)
    g = torch.randn_like(out)
    out.backward(g)
    refs = [t.double().requires_grad_() for t in (q, k, v)]
    ref = _math_f64(*refs, attn_mask=mask)
    ref.backward(g.double())
    tol = {torch.float32: 1e-5, torch.float16: 5e-3, torch.bfloat16: 3e-2}[dtype]
    torch.testing.assert_close(out.double(), ref.detach(), rtol=tol, atol=tol)
    for ours_t, ref_t in zip(ins, refs):
        torch.testing.assert_close(ours_t.grad.double(), ref_t.grad, rtol=tol * 4, atol=tol * 4)


@pytest.mark.parametrize("trial", range(15))
def test_sdpa_fuzzed_masks_of_inf_finfo_min_and_finite_values_match_torch(interpret, trial):
    dtype = DTYPES[trial % 3]
    L = (1, 3, 17, 70)[trial % 4]
    S = (1, 5, 64, 65, 130)[trial % 5]
    E = (8, 16, 64)[trial % 3]
    q, k, v = (torch.randn(1, 2, n, E).to(dtype) for n in (L, S, S))
    kind = trial % 4
    fmin = torch.finfo(dtype).min
    if kind == 0:
        mask = None
    elif kind == 1:
        mask = torch.rand(1, 1, L, S) < 0.3
    else:
        choices = torch.tensor([0.0, -INF, fmin, -1e4, 0.5, -30.0])
        mask = choices[torch.randint(0, len(choices), (1, 2, L, S))]
        if L > 1 and S > 64:
            mask[..., 0, :64] = -INF            # the first key block of a row all -inf, a later one not
        if L > 2:
            mask[..., 1, :] = -INF if kind == 3 else fmin
        mask = mask.to(dtype)
    causal = trial % 5 == 0 and mask is None
    scale = (None, 0.5, 10.0)[trial % 3]
    ours = fusedops.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale)
    tol = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 4e-2}[dtype]
    assert torch.equal(ours.isnan(), ref.isnan())
    torch.testing.assert_close(ours.double().nan_to_num(0), ref.double().nan_to_num(0), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scale", (1e30, 1e10, -1e30, 1e-45, 0.0))
@pytest.mark.parametrize("causal", (False, True))
def test_sdpa_extreme_scales_follow_float64(interpret, dtype, scale, causal):
    q, k, v = (torch.randn(1, 1, n, 8).to(dtype) for n in (5, 70, 70))
    ours = fusedops.scaled_dot_product_attention(q, k, v, scale=scale, is_causal=causal)
    ref = _math_f64(q, k, v, scale=scale, is_causal=causal)
    tol = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2}[dtype]
    assert not ours.isnan().any()
    torch.testing.assert_close(ours.double(), ref, rtol=tol, atol=tol)
