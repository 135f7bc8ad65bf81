"""Review (session 24): fusedops.nn.MultiheadAttention (and fusedops.nn.Linear) against torch 2.13's
torch.nn.MultiheadAttention / torch.nn.Linear with identical weights (load_state_dict(strict=True)), float64,
on both CPU routes (`route`: the kernels in the interpreter, what CUDA tensors take, and the torch fallback).

Complements tests/test_review_session23_attention.py (which covers the flash path's masks, the is_causal
hint, batch_first, unbatched inputs, kdim/vdim, bias=False and torch's errors for one module size). Here:
constructor/state/repr/init parity, module.to(dtype), head counts and head sizes, strided / expanded /
self-attention-by-identity inputs, empty dims, 3-D masks with key_padding_mask, the is_causal hint with a
non-causal mask (what torch's own paths do with it), need_weights x average_attn_weights x add_bias_kv /
add_zero_attn / dropout (train and eval), fully masked rows on each of torch's paths (slow path, weights
path, eval fast path), torch's errors with need_weights True and False, torch.func (vmap, grad),
inference_mode, and a few nn.Linear edge shapes.

Fully masked rows, what we do (documented by passing tests below):
  - need_weights=False (the flash path): output 0 and finite gradients, as torch's slow path (SDPA) does;
    torch's eval-mode fast path (torch._native_multi_head_attention, no grad, batch_first self-attention)
    gives NaN there instead: ours gives 0 in that mode too.
  - need_weights=True: torch's forward runs, so output and weights are NaN in those rows, as torch.

Where ours and torch's fast path differ otherwise: with is_causal=True and a non-causal attn_mask (torch's
docs: the mask must then be causal), torch's slow path (and ours) applies a causal mask and ignores
attn_mask when need_weights=False and there is no key_padding_mask, while torch's fast path applies
attn_mask. We match the slow path (what torch gives with grad enabled / in training).

Defect found (fixed in the same session: nested inputs take torch's forward, its fast path or its error):
  1. nested-tensor inputs. torch's MultiheadAttention takes a NestedTensor query=key=value in its eval-mode
     fast path (batch_first, no grad, need_weights=False) and returns a nested output; ours (flash path)
     crashes with RuntimeError "Nested tensor dimension 0 cannot be transposed". Outside the fast path
     (training mode, or batch_first=False) torch raises a clear AssertionError ("MultiheadAttention does not
     support NestedTensor outside of its fast path ..."); ours raises RuntimeError "Nested tensor dimension 0
     cannot be transposed" or "Internal error: NestedTensorImpl doesn't support sizes. Please file an issue.".
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch

import fusedops.nn as fnn

D = torch.float64
E = 8


def _pair(embed=E, heads=2, dtype=D, **kwargs):
    ref = torch.nn.MultiheadAttention(embed, heads, dtype=dtype, **kwargs)
    ours = fnn.MultiheadAttention(embed, heads, dtype=dtype, **kwargs)
    ours.load_state_dict(ref.state_dict(), strict=True)
    return ours, ref


def _diff(a, b):
    assert a.shape == b.shape, (a.shape, b.shape)
    assert a.dtype == b.dtype, (a.dtype, b.dtype)
    if a.numel() == 0:
        return 0.0
    assert torch.equal(a.isnan(), b.isnan()), "NaN in different places"
    return (a.double() - b.double()).nan_to_num(0.0).abs().max().item()


def _forward_backward(module, inputs, kwargs, grad=True):
    """(output, weights, grads w.r.t. the distinct inputs and all parameters); the identity of inputs given
    as the same tensor is kept (torch's self-attention checks use `is`)."""
    leaves, seen = [], {}
    for t in inputs:
        if id(t) not in seen:
            seen[id(t)] = t.detach().clone().requires_grad_(grad)
        leaves.append(seen[id(t)])
    out, weights = module(*leaves, **kwargs)
    grads = None
    if grad:
        torch.manual_seed(5)
        distinct = list(seen.values())
        grads = torch.autograd.grad(out, distinct + list(module.parameters()), torch.randn_like(out),
                                    allow_unused=True)
    return out, weights, grads


def _compare(ours, ref, inputs, kwargs, grad=True, tol=1e-12):
    o1, w1, g1 = _forward_backward(ours, inputs, kwargs, grad)
    o2, w2, g2 = _forward_backward(ref, inputs, kwargs, grad)
    assert _diff(o1, o2) <= tol
    assert (w1 is None) == (w2 is None)
    if w1 is not None:
        assert _diff(w1, w2) <= tol
    if grad:
        for a, b in zip(g1, g2):
            assert (a is None) == (b is None)
            if a is not None:
                assert _diff(a, b) <= tol
    return o1, w1


def _qkv(length_q=3, length_k=4, batch=2, embed=E, kdim=None, vdim=None):
    g = torch.Generator().manual_seed(1)
    return (torch.randn(length_q, batch, embed, dtype=D, generator=g),
            torch.randn(length_k, batch, kdim or embed, dtype=D, generator=g),
            torch.randn(length_k, batch, vdim or embed, dtype=D, generator=g))


# =================================================================================================
# Construction, state, repr, initialization, module.to: inherited from torch, checked
# =================================================================================================
CONFIGS = [dict(), dict(bias=False), dict(add_bias_kv=True), dict(add_zero_attn=True), dict(kdim=5, vdim=3),
           dict(kdim=8, vdim=3, bias=False, add_bias_kv=True), dict(batch_first=True, dropout=0.25)]


@pytest.mark.parametrize("config", CONFIGS, ids=str)
def test_state_dict_repr_and_init_like_torch(config):
    torch.manual_seed(3)
    ref = torch.nn.MultiheadAttention(E, 2, **config)
    torch.manual_seed(3)
    ours = fnn.MultiheadAttention(E, 2, **config)
    assert isinstance(ours, torch.nn.MultiheadAttention)
    assert repr(ours) == repr(ref)
    assert list(ours.state_dict()) == list(ref.state_dict())
    for (n1, p1), (n2, p2) in zip(ours.named_parameters(), ref.named_parameters()):
        assert n1 == n2 and torch.equal(p1, p2)               # the same _reset_parameters, same RNG draws
    assert (ours.batch_first, ours.dropout, ours.head_dim, ours._qkv_same_embed_dim) == \
        (ref.batch_first, ref.dropout, ref.head_dim, ref._qkv_same_embed_dim)
    ours.load_state_dict(ref.state_dict(), strict=True)


def test_reset_parameters_statistics():
    torch.manual_seed(0)
    mha = fnn.MultiheadAttention(64, 4, kdim=32, vdim=16, add_bias_kv=True)
    # xavier_uniform_ on each (E, kdim) projection: U(-b, b), b = sqrt(6 / (fan_in + fan_out))
    for weight in (mha.q_proj_weight, mha.k_proj_weight, mha.v_proj_weight):
        bound = math.sqrt(6.0 / sum(weight.shape))
        assert weight.abs().max() <= bound
        assert abs(weight.var().item() - bound ** 2 / 3) < 0.25 * bound ** 2 / 3
    assert torch.count_nonzero(mha.in_proj_bias) == 0 and torch.count_nonzero(mha.out_proj.bias) == 0
    assert mha.in_proj_weight is None and mha.bias_k.shape == (1, 1, 64) and mha.bias_k.std() > 0
    packed = fnn.MultiheadAttention(64, 4)
    bound = math.sqrt(6.0 / (64 * 3 + 64))
    assert packed.in_proj_weight.abs().max() <= bound
    mha._reset_parameters()                                    # callable again, as torch's
    assert torch.count_nonzero(mha.in_proj_bias) == 0


def test_embed_dim_not_divisible_by_heads_is_torchs_error():
    with pytest.raises(AssertionError, match="divisible") as theirs:
        torch.nn.MultiheadAttention(10, 3)
    with pytest.raises(AssertionError, match="divisible") as ours:
        fnn.MultiheadAttention(10, 3)
    assert str(ours.value) == str(theirs.value)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_module_to_dtype(route, dtype):
    ours, ref = _pair()
    ours, ref = ours.to(dtype), ref.to(dtype)
    assert all(p.dtype == dtype for p in ours.parameters())
    q, k, v = (t.to(dtype) for t in _qkv())
    kpm = torch.tensor([[False, True, False, False], [True, False, False, False]])
    got = ours(q, k, v, key_padding_mask=kpm, need_weights=False)[0]
    want = ref(q, k, v, key_padding_mask=kpm, need_weights=False)[0]
    assert got.dtype == want.dtype == dtype and got.shape == want.shape
    assert _diff(got, want) < {torch.float32: 1e-5, torch.bfloat16: 3e-2, torch.float16: 3e-3}[dtype]


# =================================================================================================
# Values and gradients w.r.t. inputs and every parameter, need_weights=False (the flash path)
# =================================================================================================
_KPM = torch.tensor([[False, True, False, True], [True, False, False, False]])


def _flash_case(name):
    """(module kwargs, embed, heads, inputs, call kwargs)."""
    q, k, v = _qkv()
    g = torch.Generator().manual_seed(2)
    if name == "heads_1":
        return {}, E, 1, (q, k, v), {}
    if name == "heads_8_head_dim_1":
        return {}, E, 8, (q, k, v), dict(key_padding_mask=_KPM)
    if name == "heads_3_head_dim_odd":
        q, k, v = _qkv(embed=15)
        return {}, 15, 3, (q, k, v), dict(attn_mask=torch.randn(3, 4, dtype=D, generator=g))
    if name == "head_dim_260":                          # over the kernels' 256
        q, k, v = _qkv(embed=520, batch=1)
        return {}, 520, 2, (q, k, v), dict(key_padding_mask=_KPM[:1])
    if name == "self_attention_same_tensor_batch_first":
        x = torch.randn(2, 4, E, dtype=D, generator=g)
        return dict(batch_first=True), E, 2, (x, x, x), dict(key_padding_mask=_KPM,
                                                                attn_mask=torch.rand(4, 4, generator=g) < 0.3)
    if name == "key_is_value":
        return {}, E, 2, (q, k, k), dict(key_padding_mask=_KPM)
    if name == "strided_query":
        return {}, E, 2, (torch.randn(3, 2, 2 * E, dtype=D, generator=g)[..., ::2], k, v), {}
    if name == "expanded_inputs":
        return {}, E, 2, (q[:, :1].expand(3, 2, E), k[:, :1].expand(4, 2, E), v), dict(key_padding_mask=_KPM)
    if name == "permuted_query":
        return {}, E, 2, (torch.randn(2, E, 3, dtype=D, generator=g).permute(2, 0, 1), k, v), {}
    if name == "mask3d_bool_and_kpm_bool":
        return {}, E, 2, (q, k, v), dict(attn_mask=torch.rand(4, 3, 4, generator=g) < 0.3, key_padding_mask=_KPM)
    if name == "mask3d_float_and_kpm_bool":
        return {}, E, 2, (q, k, v), dict(attn_mask=torch.randn(4, 3, 4, dtype=D, generator=g),
                                         key_padding_mask=_KPM)
    if name == "mask3d_float_expanded_and_strided_kpm":
        return {}, E, 2, (q, k, v), dict(attn_mask=torch.randn(1, 3, 4, dtype=D, generator=g).expand(4, 3, 4),
                                         key_padding_mask=torch.randn(4, 2, dtype=D, generator=g).t())
    if name == "mask_transposed_float":
        return {}, E, 2, (q, k, v), dict(attn_mask=torch.randn(4, 3, dtype=D, generator=g).t())
    if name == "kpm_float_huge_negative_and_inf":
        kpm = torch.tensor([[0.0, -1e300, 5.0, -math.inf], [1.0, 2.0, 3.0, 4.0]], dtype=D)
        return {}, E, 2, (q, k, v), dict(key_padding_mask=kpm)
    if name == "kdim_vdim_batch_first":
        q, k, v = (t.transpose(0, 1) for t in _qkv(kdim=5, vdim=3))
        return dict(kdim=5, vdim=3, batch_first=True), E, 2, (q, k, v), dict(key_padding_mask=_KPM)
    if name == "kdim_vdim_unbatched_no_bias":
        q, k, v = (t[:, 0] for t in _qkv(kdim=5, vdim=3))
        return dict(kdim=5, vdim=3, bias=False), E, 2, (q, k, v), dict(key_padding_mask=_KPM[0])
    if name == "kdim_equal_embed_vdim_differs":
        q, k, v = _qkv(vdim=3)
        return dict(kdim=E, vdim=3), E, 2, (q, k, v), dict(attn_mask=torch.rand(3, 4, generator=g) < 0.3)
    if name == "long_sequences_causal_hint":
        x = torch.randn(70, 1, E, dtype=D, generator=g)
        causal = torch.ones(70, 70, dtype=torch.bool).triu(1)
        return {}, E, 2, (x, x, x), dict(attn_mask=causal, is_causal=True)
    raise KeyError(name)


FLASH_CASES = ["heads_1", "heads_8_head_dim_1", "heads_3_head_dim_odd", "head_dim_260",
               "self_attention_same_tensor_batch_first", "key_is_value", "strided_query", "expanded_inputs",
               "permuted_query", "mask3d_bool_and_kpm_bool", "mask3d_float_and_kpm_bool",
               "mask3d_float_expanded_and_strided_kpm", "mask_transposed_float", "kpm_float_huge_negative_and_inf",
               "kdim_vdim_batch_first", "kdim_vdim_unbatched_no_bias", "kdim_equal_embed_vdim_differs",
               "long_sequences_causal_hint"]


@pytest.mark.parametrize("case", FLASH_CASES)
def test_flash_path_values_and_gradients_like_torch(route, case):
    module_kwargs, embed, heads, inputs, call_kwargs = _flash_case(case)
    ours, ref = _pair(embed, heads, **module_kwargs)
    _compare(ours, ref, inputs, dict(need_weights=False, **call_kwargs))


@pytest.mark.parametrize("dims", ["batch_0", "query_0", "keys_0_with_weights"])
def test_empty_dims_like_torch(route, dims):
    ours, ref = _pair()
    q, k, v = _qkv()
    if dims == "batch_0":
        inputs, kwargs = (q[:, :0], k[:, :0], v[:, :0]), dict(need_weights=False)
    elif dims == "query_0":
        inputs, kwargs = (q[:0], k, v), dict(need_weights=False)
    else:
        inputs, kwargs = (q, k[:0], v[:0]), dict(need_weights=True)
    _compare(ours, ref, inputs, kwargs, grad=dims != "keys_0_with_weights")


# =================================================================================================
# The is_causal hint: torch's rules (a mask is required; the hint replaces attn_mask only when
# need_weights=False and there is no key_padding_mask)
# =================================================================================================
@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("with_kpm", [False, True])
def test_is_causal_hint_with_a_non_causal_mask_like_torchs_forward(route, need_weights, with_kpm):
    ours, ref = _pair()
    x = _qkv(length_q=4)[0]
    mask = torch.tensor([[False, True, True, False], [True, False, False, False],
                         [False, False, False, True], [True, False, False, False]])
    kwargs = dict(need_weights=need_weights, attn_mask=mask, is_causal=True)
    if with_kpm:
        kwargs["key_padding_mask"] = _KPM
    out, _ = _compare(ours, ref, (x, x, x), kwargs)
    if not need_weights and not with_kpm:     # torch's hint won: the mask was ignored, a causal mask applied
        causal = ref(x, x, x, need_weights=False, attn_mask=torch.ones(4, 4, dtype=torch.bool).triu(1))[0]
        assert _diff(out, causal) < 1e-12


@pytest.mark.parametrize("need_weights", [False, True])
def test_is_causal_without_mask_is_torchs_error(route, need_weights):
    ours, ref = _pair()
    x = _qkv()[0]
    for module in (ref, ours):
        with pytest.raises(RuntimeError, match="Need attn_mask if specifying the is_causal hint"):
            module(x, x, x, need_weights=need_weights, is_causal=True)


def test_is_causal_hint_drops_a_wrongly_shaped_mask_like_torch(route):
    ours, ref = _pair()
    x = _qkv(length_q=4)[0]
    kwargs = dict(need_weights=False, attn_mask=torch.ones(3, 4, dtype=torch.bool).triu(1), is_causal=True)
    _compare(ours, ref, (x, x, x), kwargs)


# =================================================================================================
# need_weights / average_attn_weights / bias_kv / zero_attn / dropout: torch's forward, checked
# =================================================================================================
@pytest.mark.parametrize("config", [dict(), dict(add_bias_kv=True), dict(add_zero_attn=True),
                                    dict(add_bias_kv=True, add_zero_attn=True, bias=False),
                                    dict(kdim=5, vdim=3)], ids=str)
@pytest.mark.parametrize("need_weights,average", [(True, True), (True, False), (False, True)])
def test_weights_and_features_outside_the_flash_path(route, config, need_weights, average):
    ours, ref = _pair(**config)
    q, k, v = _qkv(kdim=config.get("kdim"), vdim=config.get("vdim"))
    g = torch.Generator().manual_seed(4)
    kwargs = dict(need_weights=need_weights, average_attn_weights=average, key_padding_mask=_KPM,
                  attn_mask=torch.randn(3, 4, dtype=D, generator=g))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")        # torch's "mismatched key_padding_mask and attn_mask" warning
        _, weights = _compare(ours, ref, (q, k, v), kwargs)
    if need_weights:
        extra = int(config.get("add_bias_kv", False)) + int(config.get("add_zero_attn", False))
        assert weights.shape == ((2, 3, 4 + extra) if average else (2, 2, 3, 4 + extra))
    else:
        assert weights is None


@pytest.mark.parametrize("need_weights", [False, True])
def test_attention_dropout_in_training_is_torchs(route, need_weights):
    ours, ref = _pair(dropout=0.5)
    q, k, v = _qkv()
    torch.manual_seed(7)
    got = ours(q, k, v, need_weights=need_weights)
    torch.manual_seed(7)
    want = ref(q, k, v, need_weights=need_weights)
    assert torch.equal(got[0], want[0])
    assert (got[1] is None) == (want[1] is None)
    torch.manual_seed(8)
    assert not torch.equal(ours(q, k, v, need_weights=need_weights)[0], got[0])    # dropout is applied


def test_attention_dropout_off_in_eval(route):
    ours, ref = _pair(dropout=0.5)
    ours.eval(), ref.eval()
    q, k, v = _qkv()
    _compare(ours, ref, (q, k, v), dict(need_weights=False, key_padding_mask=_KPM))
    assert torch.equal(ours(q, k, v, need_weights=False)[0], ours(q, k, v, need_weights=False)[0])


# =================================================================================================
# Fully masked rows: 0 on the flash path (as torch's slow path), NaN with need_weights=True (as torch);
# torch's eval fast path gives NaN where ours gives 0
# =================================================================================================
def _fully_masked_kwargs():
    kpm = torch.zeros(2, 4, dtype=torch.bool)
    kpm[0] = True                                  # batch 0: every key masked
    am = torch.zeros(4, 4, dtype=torch.bool)
    am[1] = True                                   # query 1: every key masked
    return [dict(key_padding_mask=kpm), dict(attn_mask=am), dict(attn_mask=am, key_padding_mask=kpm)]


@pytest.mark.parametrize("which", [0, 1, 2])
def test_fully_masked_rows_flash_path_gives_zero_like_torchs_slow_path(route, which):
    ours, ref = _pair()
    x = _qkv(length_q=4)[0]
    out, _ = _compare(ours, ref, (x, x, x), dict(need_weights=False, **_fully_masked_kwargs()[which]))
    assert not out.isnan().any()


@pytest.mark.parametrize("which", [0, 1])
def test_fully_masked_rows_with_weights_are_nan_like_torch(route, which):
    ours, ref = _pair()
    x = _qkv(length_q=4)[0]
    out, weights = _compare(ours, ref, (x, x, x), dict(need_weights=True, **_fully_masked_kwargs()[which]),
                            grad=False)
    assert out.isnan().any() and weights.isnan().any()


@pytest.mark.parametrize("which", [0, 1])
def test_eval_fast_path_fully_masked_rows_ours_zero_torchs_nan(route, which):
    ours, ref = _pair(batch_first=True)
    ours.eval(), ref.eval()
    x = _qkv(length_q=4)[0].transpose(0, 1).contiguous()
    kwargs = dict(need_weights=False, **_fully_masked_kwargs()[which])
    with torch.no_grad():
        got = ours(x, x, x, **kwargs)[0]
        fast = ref(x, x, x, **kwargs)[0]            # torch._native_multi_head_attention
    slow = ref(x, x, x, **kwargs)[0].detach()       # grad enabled and parameters require grad: the slow path
    assert fast.isnan().any() and not got.isnan().any()
    assert _diff(got, slow) < 1e-12
    rows = ~fast.isnan()
    assert (got[rows] - fast[rows]).abs().max() < 1e-12   # elsewhere the fast path agrees


@pytest.mark.parametrize("kwargs", [dict(), dict(key_padding_mask=_KPM),
                                    dict(attn_mask=torch.tensor([[False, True, False, False]] * 4)),
                                    dict(need_weights=True, average_attn_weights=False)], ids=str)
def test_eval_fast_path_values_like_torch(route, kwargs):
    ours, ref = _pair(batch_first=True)
    ours.eval(), ref.eval()
    x = _qkv(length_q=4)[0].transpose(0, 1).contiguous()
    kwargs = {"need_weights": False, **kwargs}
    with torch.no_grad():
        got, want = ours(x, x, x, **kwargs), ref(x, x, x, **kwargs)
    assert _diff(got[0], want[0]) < 1e-12
    assert (got[1] is None) == (want[1] is None)
    if got[1] is not None:
        assert _diff(got[1], want[1]) < 1e-12
    with torch.inference_mode():
        assert _diff(ours(x, x, x, **kwargs)[0], want[0]) < 1e-12


# =================================================================================================
# Nested tensors (defect 1)
# =================================================================================================
def _nested():
    g = torch.Generator().manual_seed(6)
    return torch.nested.nested_tensor([torch.randn(3, E, dtype=D, generator=g),
                                       torch.randn(2, E, dtype=D, generator=g)])


def test_nested_tensor_in_eval_fast_path_like_torch(route):
    ours, ref = _pair(batch_first=True)
    ours.eval(), ref.eval()
    nt = _nested()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = ref(nt, nt, nt, need_weights=False)[0]
        got = ours(nt, nt, nt, need_weights=False)[0]
    assert want.is_nested and got.is_nested
    for a, b in zip(got.unbind(), want.unbind()):
        assert _diff(a, b) < 1e-12


@pytest.mark.parametrize("mode", ["training", "not_batch_first"])
def test_nested_tensor_outside_fast_path_is_torchs_error(route, mode):
    ours, ref = _pair(batch_first=mode == "training")
    if mode != "training":
        ours.eval(), ref.eval()
    nt = _nested()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(AssertionError, match="does not support NestedTensor"):
            ref(nt, nt, nt, need_weights=False)
        with pytest.raises(AssertionError, match="does not support NestedTensor"):
            ours(nt, nt, nt, need_weights=False)


# =================================================================================================
# Errors: torch's types (and messages, where ours checks before torch would) for both need_weights
# =================================================================================================
def _error_case(name):
    q, k, v = _qkv()
    cases = {
        "query_4d": ((q[None], k[None], v[None]), {}),
        "query_1d": ((q[0, 0], k[0, 0], v[0, 0]), {}),
        "unbatched_query_batched_key": ((q[:, 0], k, v), {}),
        "unbatched_kpm_2d": ((q[:, 0], k[:, 0], v[:, 0]), dict(key_padding_mask=_KPM[:1])),
        "unbatched_mask3d_wrong_heads": ((q[:, 0], k[:, 0], v[:, 0]),
                                         dict(attn_mask=torch.zeros(4, 3, 4, dtype=torch.bool))),
        "batched_kpm_1d": ((q, k, v), dict(key_padding_mask=_KPM[0])),
        "embed_mismatch": ((q[..., :4], k, v), {}),
        "key_embed_mismatch": ((q, k[..., :4], v), {}),
        "value_length_mismatch": ((q, k, v[:3]), {}),
        "mask_1d": ((q, k, v), dict(attn_mask=torch.zeros(4, dtype=torch.bool))),
        "mask_int64": ((q, k, v), dict(attn_mask=torch.zeros(3, 4, dtype=torch.int64))),
        "mask_complex": ((q, k, v), dict(attn_mask=torch.zeros(3, 4, dtype=torch.complex128))),
        "mask3d_per_head_not_per_batch_head": ((q, k, v), dict(attn_mask=torch.zeros(2, 3, 4, dtype=D))),
        "mask_broadcastable_1LS": ((q, k, v), dict(attn_mask=torch.zeros(1, 3, 4, dtype=D))),
        "mask_broadcastable_L1": ((q, k, v), dict(attn_mask=torch.zeros(3, 1, dtype=D))),
        "kpm_broadcastable_1S": ((q, k, v), dict(key_padding_mask=torch.zeros(1, 4, dtype=D))),
        "query_float32": ((q.float(), k.float(), v.float()), {}),
        "value_float32": ((q, k, v.float()), {}),
    }
    return cases[name]


ERROR_CASES = ["query_4d", "query_1d", "unbatched_query_batched_key", "unbatched_kpm_2d",
               "unbatched_mask3d_wrong_heads", "batched_kpm_1d", "embed_mismatch", "key_embed_mismatch",
               "value_length_mismatch", "mask_1d", "mask_int64", "mask_complex",
               "mask3d_per_head_not_per_batch_head", "mask_broadcastable_1LS", "mask_broadcastable_L1",
               "kpm_broadcastable_1S", "query_float32", "value_float32"]


@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("case", ERROR_CASES)
def test_errors_like_torch(route, case, need_weights):
    ours, ref = _pair()
    args, kwargs = _error_case(case)
    with pytest.raises((AssertionError, RuntimeError)) as theirs:
        ref(*args, need_weights=need_weights, **kwargs)
    with pytest.raises(type(theirs.value)):
        ours(*args, need_weights=need_weights, **kwargs)


def test_float16_mask_on_a_float64_query_is_cast_as_documented(route):
    """torch's SDPA rejects a float16 mask on a float64 query; the module docstring documents that the flash
    path casts a float mask to the query's dtype instead. The result is torch's with the cast mask."""
    ours, ref = _pair()
    q, k, v = _qkv()
    mask = torch.linspace(-1, 1, 12).view(3, 4).half()
    with pytest.raises(RuntimeError, match="attn_mask dtype"):
        ref(q, k, v, need_weights=False, attn_mask=mask)
    got = ours(q, k, v, need_weights=False, attn_mask=mask)[0]
    want = ref(q, k, v, need_weights=False, attn_mask=mask.double())[0]
    assert _diff(got, want) < 1e-12


# =================================================================================================
# torch.func
# =================================================================================================
def test_vmap_and_func_grad_like_torch(route):
    from torch.func import functional_call, grad, vmap

    ours, ref = _pair()
    g = torch.Generator().manual_seed(9)
    qs, ks = torch.randn(3, 3, 2, E, dtype=D, generator=g), torch.randn(3, 4, 2, E, dtype=D, generator=g)
    kpms = torch.rand(3, 2, 4, generator=g) < 0.3
    got, want = (vmap(lambda a, b, c, m=m: m(a, b, b, key_padding_mask=c, need_weights=False)[0])(qs, ks, kpms)
                 for m in (ours, ref))
    assert _diff(got, want) < 1e-12
    params = {n: p.detach() for n, p in ref.named_parameters()}
    grads = [grad(lambda p, m=m: functional_call(m, p, (qs[0], ks[0], ks[0]), dict(need_weights=False))[0]
                  .pow(2).sum())(params) for m in (ours, ref)]
    for name in params:
        assert _diff(grads[0][name], grads[1][name]) < 1e-12


# =================================================================================================
# fusedops.nn.Linear edge shapes
# =================================================================================================
@pytest.mark.parametrize("shape,in_f,out_f,bias", [((5,), 5, 3, True), ((0, 5), 5, 3, True), ((2, 0), 0, 3, True),
                                                   ((2, 5), 5, 0, True), ((2, 1, 3, 5), 5, 3, True),
                                                   ((4, 5), 5, 3, False)], ids=str)
def test_linear_edge_shapes_like_torch(route, shape, in_f, out_f, bias):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")        # torch's init warns on a zero-element weight
        ref = torch.nn.Linear(in_f, out_f, bias=bias, dtype=D)
        ours = fnn.Linear(in_f, out_f, bias=bias, dtype=D)
    ours.load_state_dict(ref.state_dict(), strict=True)
    assert repr(ours) == repr(ref)
    x = torch.randn(shape, dtype=D)
    results = []
    for module in (ours, ref):
        leaf = x.clone().requires_grad_()
        y = module(leaf)
        results.append((y, torch.autograd.grad(y, [leaf] + list(module.parameters()), torch.ones_like(y))))
    (y1, g1), (y2, g2) = results
    assert _diff(y1, y2) < 1e-12
    for a, b in zip(g1, g2):
        assert _diff(a, b) < 1e-12


@pytest.mark.parametrize("x", [torch.randn(2, 4, dtype=D), torch.tensor(1.0, dtype=D), torch.randn(2, 5),
                               torch.ones(2, 5, dtype=torch.int64)], ids=["in_features", "0d", "float32", "int64"])
def test_linear_errors_are_runtime_errors_like_torch(route, x):
    ref = torch.nn.Linear(5, 3, dtype=D)
    ours = fnn.Linear(5, 3, dtype=D)
    for module in (ref, ours):
        with pytest.raises(RuntimeError):
            module(x)
