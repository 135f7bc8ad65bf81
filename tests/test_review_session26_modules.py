"""Review (session 26, modules): a demanding PyTorch user tried to break fusedops.nn.MultiheadAttention,
fusedops.scaled_dot_product_attention and the fusedops.nn norm / Linear modules on the CPU, on both CPU routes
(`route`: the kernels in the NumPy interpreter, what CUDA tensors take, and torch's fallback), with torch 2.13
as the oracle (same weights through load_state_dict, float64 references where numerics matter).

Cases taken from PyTorch bug reports and their threads: the MultiheadAttention mask merge and mask dtypes
(pytorch#99092 / #97409 merge_masks, #64706 3-D mask layout, #136816 float key_padding_mask), float attention
biases on a half-precision model (ALiBi / relative-position style biases kept in float32), kdim/vdim inputs
(pytorch#95712, #60831), key/query batch mismatches, SDPA's enable_gqa with masks and broadcasting
(pytorch#132689), a float attn_mask that requires grad (pytorch#171707, #188302), special scales, norm modules
with elementwise_affine / bias off, frozen (requires_grad=False) parameters, normalized_shape as int / tuple /
list / torch.Size with eps None, degenerate shapes and eps, a patched encoder-decoder nn.Transformer, 16-bit
module gradients, deepcopy / pickle of kdim/vdim modules.

Defects (all fixed in session 26; their tests, strict xfails until then, now pass):
  1. fusedops.nn.MultiheadAttention (need_weights=False) on a float16 / bfloat16 module rounds a float32
     attn_mask / key_padding_mask to the module's dtype before adding it to the logits; torch keeps it float32
     (SDPA takes a float32 mask for 16-bit queries). A float32 additive bias (ALiBi, relative positions) is
     rounded to bfloat16's 8 bits: repro
         t = torch.nn.MultiheadAttention(4, 1, bias=False, batch_first=True)   # q, k projections 0, v and out
         ... in_proj_weight = [0; 0; I], out_proj.weight = I, .to(torch.bfloat16), fusedops copy by state_dict
         x = torch.arange(8.).view(1, 2, 4).bfloat16()
         m(x[:, :1], x, x, attn_mask=torch.tensor([[200.0, 200.6]]), need_weights=False)[0]
     exact 2.5826 (softmax([200, 200.6]) @ x), torch 2.578, fusedops 2.922 (200.6 -> 201 in bfloat16; max error 0.35 vs torch's 0.011); float16
     2.6055 vs torch's 2.5820. Both routes (the cast is in the module). Cause: fusedops/nn/attention.py
     `_additive(mask, q.dtype)` does `mask.to(dtype)` for every float mask (also the key_padding_mask merge); it
     should keep a float32 mask float32 (and add a bool one in float32 / the float mask's dtype), as torch's
     F.multi_head_attention_forward does. The module docstring documents a cast to the query's dtype "where
     torch's SDPA rejects some of those", but float32 masks are not among those.
  2. fusedops.nn.MultiheadAttention(kdim=..., vdim=...) given a key (or value) whose last dim is not kdim
     (vdim), need_weights=False: RuntimeError "mat1 and mat2 shapes cannot be multiplied" from F.linear, where
     torch raises AssertionError "expecting key weights shape of (8, 6), but got torch.Size([8, 5])"
     (F._in_projection); the module docstring promises torch's error types on the flash path. Cause:
     nn/attention._check_inputs does not check the separate projection weights' shapes against the inputs.
  3. fusedops.scaled_dot_product_attention on the kernel route (FUSEDOPS_INTERPRET=1), float64, with a scale past
     float32's range (scale=1e100) gives NaN everywhere; torch's float64 op gives the finite softmax. Cause:
     kernels/attention._float_pair passes scale * log2(e) as float32 (hi, lo) kernel arguments: past
     3.4e38 hi is inf and hi + lo NaN ("as torch's scaled scores give (inf - inf)" holds for float32 inputs,
     not float64). The README says a float argument beyond float32's range raises LaunchError; here it is a
     silent NaN. (Low severity: float64 runs the kernels only in the interpreter.)

Also seen and not flagged: torch's CPU SDPA returns 0 for a query row holding a NaN (and for scale=NaN) where the
kernel route propagates NaN; torch's SDPA raises IndexError for a 1-D or 0-d attn_mask and for enable_gqa with
2-D inputs, which fusedops broadcasts / accepts (the documented broadcasting rule); layer_norm of rows whose
squares overflow (|x| ~ 1e20 float32) gives 0 on the kernel route and NaN in torch (torch itself gives 0 at
1e19): both are garbage; torch's CPU layer_norm backward of a bfloat16 input with float32 weight rounds dweight
through bfloat16 (error 0.1) where the kernel route is exact to 1e-6.

Checked and matching torch (plain tests below): MultiheadAttention shape / rank / dtype errors (query-key batch
mismatch, mixed ranks, embed dim, unbatched 3-D mask, 1-D query, 1-D key_padding_mask, kdim sequence mismatch,
dtype mismatch); frozen parameters, no_grad, deepcopy / pickle / load_state_dict of kdim/vdim modules; 16-bit
MultiheadAttention values and gradients against float64 (errors as torch's); SDPA enable_gqa with float / bool /
broadcast masks, a float mask requiring grad, causal, batch and head broadcasting, 3-D query with 4-D key/value,
partial requires_grad (values and gradients); SDPA mask broadcast forms and 5-D mask errors; SDPA special scales
(inf, -inf, 0, -0) and inf/NaN in masks and values; LayerNorm / RMSNorm / Linear with frozen parameters, affine
and bias off (state_dict keys), every normalized_shape form with eps None; degenerate norm shapes / eps (0 columns,
eps 0 on constant rows, inf / NaN rows, negative eps, empty normalized_shape, integer inputs, wrong shapes); a
fusedops.nn.patch()ed encoder-decoder nn.Transformer (padding masks, causal hints, train and eval).
"""

from __future__ import annotations

import copy
import math
import pickle
import warnings

import pytest
import torch
import torch.nn.functional as F

import fusedops
import fusedops.nn as fnn

D = torch.float64
# torch warns about a bool key_padding_mask with a float attn_mask (the merge these tests exercise)
pytestmark = [pytest.mark.filterwarnings("ignore:Support for mismatched key_padding_mask"),
              pytest.mark.filterwarnings("ignore:Mismatch dtype between input and weight")]


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _randn(g, *shape, dtype=D):
    return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)


def _diff(a, b):
    """max |a - b| (NaN positions must agree; NaN/inf compared by position)."""
    assert a.shape == b.shape, (a.shape, b.shape)
    assert a.dtype == b.dtype, (a.dtype, b.dtype)
    if a.numel() == 0:
        return 0.0
    a, b = a.double(), b.double()
    assert torch.equal(a.isnan(), b.isnan()), "NaN positions differ"
    finite = a.isfinite() & b.isfinite()
    assert torch.equal(a[~finite & ~a.isnan()], b[~finite & ~b.isnan()]), "inf positions differ"
    return (a[finite] - b[finite]).abs().max().item() if finite.any() else 0.0


def _mha_pair(*args, dtype=D, **kwargs):
    torch.manual_seed(0)
    theirs = torch.nn.MultiheadAttention(*args, dtype=dtype, **kwargs)
    ours = fnn.MultiheadAttention(*args, dtype=dtype, **kwargs)
    ours.load_state_dict(theirs.state_dict(), strict=True)
    return ours, theirs


def _raises_like_torch(ours_call, torch_call):
    with pytest.raises(Exception) as theirs:
        torch_call()
    with pytest.raises(Exception) as ours:
        ours_call()
    assert type(ours.value) is type(theirs.value), (type(ours.value), ours.value, type(theirs.value), theirs.value)


# =================================================================================================
# Defect 1: a float32 mask on a 16-bit MultiheadAttention is rounded to 16 bits
# =================================================================================================
def _value_passthrough_pair(dtype):
    """One head, no bias: q and k projections zero (logits = the mask alone), v and out projections the
    identity, so the output is softmax(mask) @ value exactly."""
    torch.manual_seed(0)
    theirs = torch.nn.MultiheadAttention(4, 1, bias=False, batch_first=True)
    with torch.no_grad():
        theirs.in_proj_weight.copy_(torch.cat([torch.zeros(4, 4), torch.zeros(4, 4), torch.eye(4)]))
        theirs.out_proj.weight.copy_(torch.eye(4))
    theirs = theirs.to(dtype)
    ours = fnn.MultiheadAttention(4, 1, bias=False, batch_first=True).to(dtype)
    ours.load_state_dict(theirs.state_dict(), strict=True)
    return ours, theirs


@pytest.mark.parametrize("which", ["attn_mask", "key_padding_mask"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_mha_16bit_module_keeps_a_float32_mask(route, dtype, which):
    ours, theirs = _value_passthrough_pair(dtype)
    x = torch.arange(8.0).view(1, 2, 4).to(dtype)
    bias = torch.tensor([[200.0, 200.6]])          # a float32 additive bias (one query, two keys)
    exact = torch.softmax(bias.double(), -1) @ x[0].double()
    kwargs = {which: bias, "need_weights": False}
    got = ours(x[:, :1], x, x, **kwargs)[0]
    want = theirs(x[:, :1], x, x, **kwargs)[0]
    tol = {torch.bfloat16: 2e-2, torch.float16: 3e-3}[dtype]
    assert got.dtype == want.dtype == dtype
    assert (want.double()[0] - exact).abs().max().item() < tol          # torch: within the dtype's rounding
    assert (got.double()[0] - exact).abs().max().item() < tol           # fusedops: 0.35 (bf16), 0.023 (fp16) off


def test_mha_16bit_module_masks_held_exactly_match_torch(route):
    """Masks whose values every dtype holds exactly (0 / -inf from a bool mask, small integers) give torch's
    result on a bfloat16 module."""
    ours, theirs = _value_passthrough_pair(torch.bfloat16)
    x = torch.arange(8.0).view(1, 2, 4).bfloat16()
    for kwargs in (dict(attn_mask=torch.tensor([[False, True]])), dict(key_padding_mask=torch.tensor([[True, False]])),
                   dict(attn_mask=torch.tensor([[0.0, 1.0]]), key_padding_mask=torch.tensor([[False, False]]))):
        assert _diff(ours(x[:, :1], x, x, need_weights=False, **kwargs)[0],
                     theirs(x[:, :1], x, x, need_weights=False, **kwargs)[0]) == 0.0


# =================================================================================================
# Defect 2: kdim / vdim mismatches raise F.linear's RuntimeError instead of torch's AssertionError
# =================================================================================================
@pytest.mark.parametrize("which", ["key", "value"])
def test_mha_kdim_vdim_mismatch_is_torchs_assertion(route, which):
    ours, theirs = _mha_pair(8, 2, kdim=5, vdim=3)
    g = _gen(1)
    q, k, v = _randn(g, 3, 2, 8), _randn(g, 4, 2, 5), _randn(g, 4, 2, 3)
    if which == "key":
        k = _randn(g, 4, 2, 6)
    else:
        v = _randn(g, 4, 2, 7)
    with pytest.raises(AssertionError, match="weights shape"):
        theirs(q, k, v, need_weights=False)
    with pytest.raises(AssertionError):
        ours(q, k, v, need_weights=False)


def test_mha_kdim_vdim_mismatch_with_weights_is_torchs(route):
    """need_weights=True runs torch's forward: its AssertionError."""
    ours, theirs = _mha_pair(8, 2, kdim=5, vdim=3)
    g = _gen(2)
    q, k, v = _randn(g, 3, 2, 8), _randn(g, 4, 2, 6), _randn(g, 4, 2, 3)
    _raises_like_torch(lambda: ours(q, k, v), lambda: theirs(q, k, v))


# =================================================================================================
# Defect 3: float64 SDPA with a scale past float32's range gives NaN on the kernel route
# =================================================================================================
def test_sdpa_float64_scale_past_float32_range(interpret):
    g = _gen(3)
    q, k, v = _randn(g, 1, 1, 3, 4), _randn(g, 1, 1, 5, 4), _randn(g, 1, 1, 5, 4)
    want = F.scaled_dot_product_attention(q, k, v, scale=1e100)
    assert want.isfinite().all()
    got = fusedops.scaled_dot_product_attention(q, k, v, scale=1e100)
    assert _diff(got, want) < 1e-12


def test_sdpa_float64_large_scales_within_float32_range(route):
    g = _gen(4)
    q, k, v = _randn(g, 1, 2, 3, 4), _randn(g, 1, 2, 5, 4), _randn(g, 1, 2, 5, 4)
    for scale in (1e10, 1e30, 1e38, 0.1, 1 / 3):
        assert _diff(fusedops.scaled_dot_product_attention(q, k, v, scale=scale),
                     F.scaled_dot_product_attention(q, k, v, scale=scale)) < 1e-12


# =================================================================================================
# MultiheadAttention: errors, frozen parameters, no_grad, copies (checked, match torch)
# =================================================================================================
def test_mha_shape_rank_and_dtype_errors_like_torch(route):
    ours, theirs = _mha_pair(8, 2)
    g = _gen(5)
    q = _randn(g, 3, 2, 8)
    cases = [
        (q, _randn(g, 4, 1, 8), None, {}),                     # key batch 1, query batch 2
        (q, _randn(g, 4, 4, 8), None, {}),                     # key batch 4
        (_randn(g, 3, 4, 8), _randn(g, 4, 2, 8), None, {}),    # lengths and batches swapped
        (q, q[:, 0], None, {}),                                # 3-D query, 2-D key / value
        (q[..., :6], q[..., :6], None, {}),                    # embed dim
        (q[:, 0], q[:, 0], None, dict(attn_mask=torch.zeros(4, 3, 3, dtype=D))),   # unbatched 3-D mask
        (q[0, 0], q[0, 0], None, {}),                          # 1-D query
        (q, q, None, dict(key_padding_mask=torch.zeros(3, dtype=torch.bool))),     # 1-D kpm, batched
        (q.float(), q.float(), None, {}),                      # float32 inputs, float64 module
        (q, q.float(), None, {}),                              # mixed input dtypes
        (q, q, q[:2], {}),                                     # value length differs
    ]
    for query, key, value, kwargs in cases:
        value = key if value is None else value
        for need_weights in (False, True):
            _raises_like_torch(lambda: ours(query, key, value, need_weights=need_weights, **kwargs),
                               lambda: theirs(query, key, value, need_weights=need_weights, **kwargs))
    ours_kv, theirs_kv = _mha_pair(8, 2, kdim=5, vdim=3)
    k5, v3 = _randn(g, 4, 2, 5), _randn(g, 5, 2, 3)
    _raises_like_torch(lambda: ours_kv(q, k5, v3, need_weights=False), lambda: theirs_kv(q, k5, v3, need_weights=False))


@pytest.mark.parametrize("frozen", ["in_proj_weight", "out_proj.weight", "all"])
def test_mha_frozen_parameters_and_no_grad(route, frozen):
    ours, theirs = _mha_pair(8, 2, batch_first=True)
    g = _gen(6)
    x, y = _randn(g, 2, 3, 8), _randn(g, 2, 5, 8)
    kpm = torch.tensor([[False, True, False, False, True], [True, True, True, True, False]])
    mask = _randn(g, 3, 5)
    gy = _randn(g, 2, 3, 8)
    results = []
    for module in (ours, theirs):
        for name, p in module.named_parameters():
            p.requires_grad_(not (frozen == "all" or name == frozen))
        xx, yy = x.clone().requires_grad_(), y.clone().requires_grad_()
        out = module(xx, yy, yy, key_padding_mask=kpm, attn_mask=mask, need_weights=False)[0]
        out.backward(gy)
        grads = {n: p.grad for n, p in module.named_parameters()}
        with torch.no_grad():
            plain = module(x, y, y, key_padding_mask=kpm, attn_mask=mask, need_weights=False)[0]
        assert plain.grad_fn is None and not plain.requires_grad
        results.append((out, xx.grad, yy.grad, grads, plain))
    (o1, gx1, gy1, p1, n1), (o2, gx2, gy2, p2, n2) = results
    assert _diff(o1, o2) < 1e-12 and _diff(n1, n2) < 1e-12
    assert _diff(gx1, gx2) < 1e-12 and _diff(gy1, gy2) < 1e-12
    for name in p2:
        assert (p1[name] is None) == (p2[name] is None), name
        if p2[name] is not None:
            assert _diff(p1[name], p2[name]) < 1e-12, name


def test_mha_kdim_vdim_copies_pickle_and_state_dict(route):
    torch.manual_seed(7)
    theirs = torch.nn.MultiheadAttention(8, 2, kdim=5, vdim=3, add_bias_kv=False, dtype=D)
    ours = fnn.MultiheadAttention(8, 2, kdim=5, vdim=3, dtype=D)
    ours.load_state_dict(theirs.state_dict(), strict=True)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert ours.in_proj_weight is None and ours.q_proj_weight.shape == (8, 8) and ours.k_proj_weight.shape == (8, 5)
    g = _gen(7)
    q, k, v = _randn(g, 3, 2, 8), _randn(g, 4, 2, 5), _randn(g, 4, 2, 3)
    kpm = torch.tensor([[False, False, True, False], [True, False, False, False]])
    want = theirs(q, k, v, key_padding_mask=kpm, need_weights=False)[0]
    for clone in (ours, copy.deepcopy(ours), pickle.loads(pickle.dumps(ours))):
        assert type(clone) is fnn.MultiheadAttention
        assert _diff(clone(q, k, v, key_padding_mask=kpm, need_weights=False)[0], want) < 1e-12
    back = torch.nn.MultiheadAttention(8, 2, kdim=5, vdim=3, dtype=D)
    back.load_state_dict(ours.state_dict(), strict=True)           # and back into torch's module
    assert _diff(back(q, k, v, key_padding_mask=kpm, need_weights=False)[0], want) == 0.0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_mha_16bit_values_and_gradients_against_float64(interpret, dtype):
    torch.manual_seed(0)
    theirs = torch.nn.MultiheadAttention(8, 2, batch_first=True).to(dtype)
    ours = fnn.MultiheadAttention(8, 2, batch_first=True).to(dtype)
    ours.load_state_dict(theirs.state_dict())
    ref = torch.nn.MultiheadAttention(8, 2, batch_first=True).double()
    ref.load_state_dict(theirs.state_dict())
    g = _gen(8)
    x, y, gy = _randn(g, 2, 5, 8), _randn(g, 2, 7, 8), _randn(g, 2, 5, 8)
    kpm = torch.rand(2, 7, generator=g) > 0.6
    kpm[:, 0] = False
    res = []
    for module, dt in ((ref, D), (theirs, dtype), (ours, dtype)):
        xx, yy = (t.detach().to(dt).clone().requires_grad_() for t in (x, y))
        out = module(xx, yy, yy, key_padding_mask=kpm, need_weights=False)[0]
        out.backward(gy.to(dt))
        res.append([out, xx.grad, yy.grad] + [p.grad for p in module.parameters()])
    exact, torch_res, ours_res = res
    for r, t, o in zip(exact, torch_res, ours_res):
        assert o.dtype == t.dtype == dtype
        scale = 1 + r.abs().max().item()
        torch_err = (t.double() - r).abs().max().item() / scale
        ours_err = (o.double() - r).abs().max().item() / scale
        assert ours_err <= 2 * torch_err + {torch.bfloat16: 4e-3, torch.float16: 5e-4}[dtype], (ours_err, torch_err)


# =================================================================================================
# scaled_dot_product_attention: GQA, masks, gradients, special values (checked, match torch)
# =================================================================================================
def _sdpa_grads(fn, tensors, mask=None, which=None):
    which = range(len(tensors)) if which is None else which
    ts = [t.detach().clone().requires_grad_(i in which) for i, t in enumerate(tensors)]
    m = None if mask is None else (mask.detach().clone().requires_grad_() if mask.is_floating_point() else mask)
    out = fn(*ts, m)
    gy = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view(out.shape)
    wanted = [ts[i] for i in which] + ([m] if m is not None and m.requires_grad else [])
    return out, torch.autograd.grad(out, wanted, gy)


def _sdpa_cases(g):
    q4, k2, v2 = _randn(g, 2, 4, 3, 4), _randn(g, 2, 2, 5, 4), _randn(g, 2, 2, 5, 4)
    return {
        "gqa_float_mask": ((q4, k2, v2), _randn(g, 2, 4, 3, 5), dict(enable_gqa=True)),
        "gqa_broadcast_float_mask": ((q4, k2, v2), _randn(g, 3, 5), dict(enable_gqa=True)),
        "gqa_bool_mask": ((q4, k2, v2), torch.rand(2, 1, 3, 5, generator=g) > 0.3, dict(enable_gqa=True)),
        "gqa_causal": ((q4, k2, v2), None, dict(enable_gqa=True, is_causal=True)),
        "gqa_batch_broadcast": ((q4, k2[:1], v2[:1]), None, dict(enable_gqa=True)),
        "mqa_gqa": ((q4, k2[:, :1], v2[:, :1]), None, dict(enable_gqa=True)),
        "heads_broadcast": ((q4, k2[:, :1], v2[:, :1]), None, {}),
        "query_3d_kv_4d": ((q4[0], k2[:, :1], v2[:, :1]), None, {}),
        "gqa_3d": ((_randn(g, 4, 3, 4), _randn(g, 2, 5, 4), _randn(g, 2, 5, 4)), None, dict(enable_gqa=True)),
        "gqa_5d": ((_randn(g, 2, 2, 4, 3, 4), _randn(g, 2, 2, 2, 5, 4), _randn(g, 2, 2, 2, 5, 4)), None,
                   dict(enable_gqa=True)),
        "fully_masked_row_float": ((q4, k2.repeat(1, 2, 1, 1), v2.repeat(1, 2, 1, 1)),
                                   torch.zeros(2, 4, 3, 5, dtype=D).index_fill_(2, torch.tensor([1]), -math.inf), {}),
        "scale_and_mask": ((q4, k2.repeat(1, 2, 1, 1), v2.repeat(1, 2, 1, 1)), _randn(g, 1, 4, 1, 5),
                           dict(scale=2.5)),
        "mask_1xS_bool": ((q4, k2.repeat(1, 2, 1, 1), v2.repeat(1, 2, 1, 1)),
                          torch.tensor([[True, False, True, True, True]]), {}),
        "mask_Lx1": ((q4, k2.repeat(1, 2, 1, 1), v2.repeat(1, 2, 1, 1)), _randn(g, 3, 1), {}),
        "query_2d_causal": ((q4[0, 0], k2[0, 0], v2[0, 0]), None, dict(is_causal=True)),
    }


@pytest.mark.parametrize("case", ["gqa_float_mask", "gqa_broadcast_float_mask", "gqa_bool_mask", "gqa_causal",
                                  "gqa_batch_broadcast", "mqa_gqa", "heads_broadcast", "query_3d_kv_4d", "gqa_3d",
                                  "gqa_5d", "fully_masked_row_float", "scale_and_mask", "mask_1xS_bool", "mask_Lx1",
                                  "query_2d_causal"])
def test_sdpa_gqa_masks_broadcasting_and_gradients(route, case):
    tensors, mask, kwargs = _sdpa_cases(_gen(9))[case]
    o1, g1 = _sdpa_grads(lambda q, k, v, m: fusedops.scaled_dot_product_attention(q, k, v, attn_mask=m, **kwargs),
                         tensors, mask)
    o2, g2 = _sdpa_grads(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m, **kwargs),
                         tensors, mask)
    assert _diff(o1, o2) < 1e-12
    assert len(g1) == len(g2)
    for a, b in zip(g1, g2):             # q, k, v and, for a float mask, the mask (which requires grad)
        assert _diff(a, b) < 1e-12


@pytest.mark.parametrize("which", [[0], [1], [2], [1, 2]])
def test_sdpa_partial_requires_grad(route, which):
    g = _gen(10)
    tensors = (_randn(g, 1, 2, 3, 4), _randn(g, 1, 2, 5, 4), _randn(g, 1, 2, 5, 4))
    kwargs = dict(is_causal=True)
    o1, g1 = _sdpa_grads(lambda q, k, v, m: fusedops.scaled_dot_product_attention(q, k, v, **kwargs), tensors,
                         which=which)
    o2, g2 = _sdpa_grads(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, **kwargs), tensors, which=which)
    assert _diff(o1, o2) < 1e-12
    for a, b in zip(g1, g2):
        assert _diff(a, b) < 1e-12


def test_sdpa_mask_of_higher_rank_than_the_output_raises_like_torch(route):
    g = _gen(11)
    q, k, v = _randn(g, 2, 2, 3, 4), _randn(g, 2, 2, 5, 4), _randn(g, 2, 2, 5, 4)
    for mask in (torch.zeros(1, 2, 2, 3, 5, dtype=D), _randn(g, 3, 2, 2, 3, 5)):
        _raises_like_torch(lambda: fusedops.scaled_dot_product_attention(q, k, v, attn_mask=mask),
                           lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    mask = _randn(g, 2, 2, 3, 5)         # 4-D mask, 3-D query and key / value
    _raises_like_torch(lambda: fusedops.scaled_dot_product_attention(q[0], k[0], v[0], attn_mask=mask),
                       lambda: F.scaled_dot_product_attention(q[0], k[0], v[0], attn_mask=mask))
    for hk in (4, 3):                    # key heads that do not divide the query's
        kk = _randn(g, 2, hk, 5, 4) if hk == 4 else _randn(g, 2, 3, 5, 4)
        qq = q if hk == 4 else _randn(g, 2, 4, 3, 4)
        _raises_like_torch(lambda: fusedops.scaled_dot_product_attention(qq, kk, kk, enable_gqa=True),
                           lambda: F.scaled_dot_product_attention(qq, kk, kk, enable_gqa=True))


def test_sdpa_special_scales_and_values(route):
    g = _gen(12)
    q, k, v = _randn(g, 1, 2, 3, 4), _randn(g, 1, 2, 5, 4), _randn(g, 1, 2, 5, 4)
    sdpa, ref = fusedops.scaled_dot_product_attention, F.scaled_dot_product_attention
    for scale in (math.inf, 0.0, -0.0):
        assert _diff(sdpa(q, k, v, scale=scale), ref(q, k, v, scale=scale)) < 1e-12
    assert sdpa(q, k, v, scale=-math.inf).isnan().all() and ref(q, k, v, scale=-math.inf).isnan().all()
    v_inf = v.clone()
    v_inf[0, 1, 4, 0] = math.inf
    for causal in (False, True):
        assert _diff(sdpa(q, k, v_inf, is_causal=causal), ref(q, k, v_inf, is_causal=causal)) < 1e-12
    for special in (math.inf, math.nan):
        mask = torch.zeros(3, 5, dtype=D)
        mask[0, 1] = special
        assert _diff(sdpa(q, k, v, attn_mask=mask), ref(q, k, v, attn_mask=mask)) < 1e-12


# =================================================================================================
# LayerNorm / RMSNorm / Linear modules (checked, match torch)
# =================================================================================================
def _module_pair(torch_cls, ours_cls, *args, seed=13, **kwargs):
    g = _gen(seed)
    theirs = torch_cls(*args, **kwargs)
    ours = ours_cls(*args, **kwargs)
    with torch.no_grad():
        for p in theirs.parameters():
            p.copy_(_randn(g, *p.shape, dtype=p.dtype))
    ours.load_state_dict(theirs.state_dict(), strict=True)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    return ours, theirs


def _module_grads(module, x, frozen=()):
    for name, p in module.named_parameters():
        p.requires_grad_(name not in frozen)
        p.grad = None
    xx = x.detach().clone().requires_grad_()
    y = module(xx)
    y.backward(torch.linspace(-1, 1, y.numel(), dtype=y.dtype).view(y.shape))
    return y, xx.grad, {n: p.grad for n, p in module.named_parameters()}


def _compare_modules(ours, theirs, x, frozen=(), tol=1e-12):
    (y1, gx1, p1), (y2, gx2, p2) = _module_grads(ours, x, frozen), _module_grads(theirs, x, frozen)
    assert _diff(y1, y2) <= tol and _diff(gx1, gx2) <= tol
    assert p1.keys() == p2.keys()
    for name in p2:
        assert (p1[name] is None) == (p2[name] is None), name
        if p2[name] is not None:
            assert _diff(p1[name], p2[name]) <= tol, name


@pytest.mark.parametrize("kwargs", [{}, dict(elementwise_affine=False), dict(bias=False),
                                    dict(elementwise_affine=False, bias=False)], ids=str)
def test_layer_norm_module_affine_bias_and_frozen_parameters(route, kwargs):
    x = _randn(_gen(14), 2, 3, 6)
    for shape in (6, (3, 6), [2, 3, 6], torch.Size([6])):
        ours, theirs = _module_pair(torch.nn.LayerNorm, fnn.LayerNorm, shape, dtype=D, **kwargs)
        names = [n for n, _ in theirs.named_parameters()]
        for frozen in ((), *[(n,) for n in names], tuple(names)):
            _compare_modules(ours, theirs, x, frozen)


@pytest.mark.parametrize("eps", [None, 1e-3, 0.0])
def test_rms_norm_module_shapes_eps_and_frozen_weight(route, eps):
    x = _randn(_gen(15), 2, 3, 6)
    for shape in (6, (3, 6), [6], torch.Size([3, 6])):
        for affine in (True, False):
            ours, theirs = _module_pair(torch.nn.RMSNorm, fnn.RMSNorm, shape, eps=eps, elementwise_affine=affine,
                                        dtype=D)
            assert ours.eps == theirs.eps and ours.normalized_shape == theirs.normalized_shape
            _compare_modules(ours, theirs, x)
            if affine:
                _compare_modules(ours, theirs, x, frozen=("weight",))


def test_mixed_dtype_norm_modules_like_torch(route):
    g = _gen(16)
    x = _randn(g, 2, 3, 6)
    ours, theirs = _module_pair(torch.nn.RMSNorm, fnn.RMSNorm, 6, dtype=torch.float32)
    for v in (x.bfloat16(), x.half(), x):                   # any input dtype: the output is the input's
        y1, y2 = ours(v), theirs(v)
        assert y1.dtype == y2.dtype == v.dtype and _diff(y1, y2) <= 1e-6 * (1 + y2.abs().max().item())
    ours, theirs = _module_pair(torch.nn.RMSNorm, fnn.RMSNorm, 6, dtype=torch.bfloat16)
    assert _diff(ours(x.float()), theirs(x.float())) < 1e-6
    ours, theirs = _module_pair(torch.nn.LayerNorm, fnn.LayerNorm, 6, dtype=torch.float32)
    _raises_like_torch(lambda: ours(x), lambda: theirs(x))                     # float64 input, float32 weight
    ours, theirs = _module_pair(torch.nn.LayerNorm, fnn.LayerNorm, 6, dtype=torch.bfloat16)
    _raises_like_torch(lambda: ours(x.float()), lambda: theirs(x.float()))


def test_norm_modules_degenerate_shapes_and_eps(route):
    for dt in (D, torch.float32):
        const = torch.full((2, 4), 3.0, dtype=dt)
        zeros = torch.zeros(2, 4, dtype=dt)
        special = torch.tensor([[math.inf, 1.0, 2.0, 3.0], [math.nan, 1, 2, 3], [0.5, -1, 2, 1]], dtype=dt)
        x = _randn(_gen(17), 3, 4, dtype=dt)
        pairs = [(fnn.LayerNorm(4, eps=0.0, dtype=dt), torch.nn.LayerNorm(4, eps=0.0, dtype=dt), const),   # NaN rows
                 (fnn.RMSNorm(4, eps=0.0, dtype=dt), torch.nn.RMSNorm(4, eps=0.0, dtype=dt), zeros),
                 (fnn.LayerNorm(0, dtype=dt), torch.nn.LayerNorm(0, dtype=dt), torch.zeros(2, 0, dtype=dt)),
                 (fnn.RMSNorm(0, dtype=dt), torch.nn.RMSNorm(0, dtype=dt), torch.zeros(2, 0, dtype=dt)),
                 (fnn.LayerNorm(4, dtype=dt), torch.nn.LayerNorm(4, dtype=dt), special),
                 (fnn.RMSNorm(4, dtype=dt), torch.nn.RMSNorm(4, dtype=dt), special),
                 (fnn.LayerNorm(4, eps=-0.5, dtype=dt), torch.nn.LayerNorm(4, eps=-0.5, dtype=dt), x)]
        for ours, theirs, v in pairs:
            want = theirs(v)
            scale = 1 + (want[want.isfinite()].abs().max().item() if want.isfinite().any() else 0.0)
            assert _diff(ours(v), want) <= (1e-12 if dt == D else 1e-5) * scale
    for ours, theirs, v in ((fnn.LayerNorm([]), torch.nn.LayerNorm([]), torch.ones(2, 4)),
                            (fnn.RMSNorm([]), torch.nn.RMSNorm([]), torch.ones(2, 4)),
                            (fnn.LayerNorm(4), torch.nn.LayerNorm(4), torch.ones(2, 4, dtype=torch.long)),
                            (fnn.RMSNorm(4), torch.nn.RMSNorm(4), torch.ones(2, 4, dtype=torch.long)),
                            (fnn.LayerNorm(4), torch.nn.LayerNorm(4), torch.ones(2, 5)),
                            (fnn.RMSNorm(4), torch.nn.RMSNorm(4), torch.ones(2, 5))):
        with pytest.raises(RuntimeError):     # torch: RuntimeError or its subclass NotImplementedError
            theirs(v)
        with pytest.raises(RuntimeError):
            ours(v)


@pytest.mark.parametrize("bias", [True, False])
def test_linear_module_frozen_weight_and_dtypes(route, bias):
    g = _gen(18)
    x = _randn(g, 2, 3, 6)
    ours, theirs = _module_pair(torch.nn.Linear, fnn.Linear, 6, 4, bias=bias, dtype=D)
    _compare_modules(ours, theirs, x)
    _compare_modules(ours, theirs, x, frozen=("weight",))
    if bias:
        _compare_modules(ours, theirs, x, frozen=("bias",))
    for dt in (torch.bfloat16, torch.float16):
        o16, t16 = _module_pair(torch.nn.Linear, fnn.Linear, 6, 4, bias=bias, dtype=dt)
        y1, y2 = o16(x.to(dt)), t16(x.to(dt))
        assert y1.dtype == y2.dtype == dt and _diff(y1, y2) <= 1e-2 * (1 + y2.abs().max().item())
    o32, t32 = _module_pair(torch.nn.Linear, fnn.Linear, 6, 4, bias=bias, dtype=torch.float32)
    for v in (x, x.bfloat16()):
        _raises_like_torch(lambda: o32(v), lambda: t32(v))


# =================================================================================================
# A patched encoder-decoder nn.Transformer (checked, matches torch)
# =================================================================================================
@pytest.mark.parametrize("training", [True, False])
def test_patched_encoder_decoder_transformer(interpret, training):
    torch.manual_seed(0)
    theirs = torch.nn.Transformer(8, 2, 1, 1, 16, dropout=0.0, batch_first=True, dtype=D)
    ours = copy.deepcopy(theirs)
    report = fnn.patch(ours)
    assert report.counts()["fusedops.nn.attention.MultiheadAttention"] == 3
    theirs.train(training)
    ours.train(training)
    g = _gen(19)
    src, tgt = _randn(g, 2, 5, 8), _randn(g, 2, 4, 8)
    skpm = torch.tensor([[False] * 5, [False, False, True, True, True]])
    tkpm = torch.tensor([[False] * 4, [False, False, False, True]])
    causal = torch.nn.Transformer.generate_square_subsequent_mask(4, dtype=D)
    for kwargs in (dict(src_key_padding_mask=skpm, memory_key_padding_mask=skpm, tgt_key_padding_mask=tkpm),
                   dict(tgt_mask=causal, tgt_is_causal=True, memory_key_padding_mask=skpm)):
        results = []
        for model in (ours, theirs):
            s, t = src.clone().requires_grad_(), tgt.clone().requires_grad_()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                y = model(s, t, **kwargs)
            y.pow(2).sum().backward()
            results.append((y, s.grad, t.grad))
        for a, b in zip(*results):
            assert _diff(a, b) < 1e-12
