"""Review (session 39, attention as a torch.nn user sees it): a fresh reviewer tried to break
fusedops.nn.MultiheadAttention against torch 2.13's torch.nn.MultiheadAttention (same state_dict), and the functional
attention on the shapes and layouts that modules feed it, on both CPU routes (`interpret`: the kernels in the NumPy
interpreter, FUSEDOPS_INTERPRET=1, the route CUDA tensors take; `fallback`: torch's op). Oracles: torch's module
with the same parameters, and float64 math with fusedops' documented semantics (top-left causal, fully masked rows 0).
Sessions 23 / 24 / 26 / 27 / 37 / 38 already cover the masks' dtypes and shapes, batch_first, kdim / vdim, bias=False,
add_bias_kv / add_zero_attn, need_weights / average_attn_weights, dropout in train and eval, the is_causal hint with
bool masks, nested tensors, empty dims, .to(dtype), deepcopy / pickle, vmap, jit.script and training loops; this file
adds what they did not.

What was tried (peer report -> case), right unless listed under DEFECTS:
- pytorch#137887 / #136816 (a user calls MultiheadAttention with is_causal=None, float key_padding_mask), #100709
  (key_padding_mask with is_causal): the is_causal hint given as None, 0, 1, numpy.bool_, a 0-d tensor, a string,
  with and without attn_mask / key_padding_mask, need_weights=False: DEFECT 1.
- The is_causal hint with L != S (cross-attention, torch's top-left SDPA alignment once the mask is dropped), with and
  without key_padding_mask (which turns the hint off in torch).
- Head dims that are not powers of two (embed 9 / 3 heads, 10 / 5 heads, 6 / 1 head) in train mode (gradients of
  inputs and parameters, float64) and in eval under no_grad with batch_first self-attention (where torch's module
  takes its fast path, torch._native_multi_head_attention): torch's values.
- pytorch#160064, #27968, #152028 (fully masked rows / heads: NaN or 0 by version and path): torch 2.13 gives 0 for a
  fully masked row in SDPA on every CPU backend (default and math), float32 / float64 / float16 / bfloat16, boolean
  and -inf masks; fusedops' functional op and the module's flash path (need_weights=False) give the same 0, with a
  3-D mask that masks one head entirely too (need_weights=True runs torch's forward: NaN there, as torch).
- A float key_padding_mask and a float attn_mask that require grad (learned biases) through the module: their
  gradients and the parameters' equal torch's; torch.utils.checkpoint (reentrant and not) around the module.
- torch.export.export and torch.jit.trace of a module holding it (the custom operator in the exported graph; the
  trace run at other lengths), torch.func.functional_call with other parameters, a parametrization on in_proj_weight
  (torch.nn.utils.parametrize, gradients through it), weight_norm on out_proj, load_state_dict(assign=True) of a
  torch kdim / vdim module into a meta-device one: torch's values (not all kept: time).
- Output layouts: the flash path's output has torch's regular-path strides ((N, L, E) batch_first is a transposed
  (L, N, E) tensor); torch's eval fast path returns it contiguous. Not a finding (strides are not promised, and torch's
  own two paths differ); noted.
- Masks of other float dtypes (float64 / float16 / bfloat16 masks on float32 / 16-bit modules): torch's SDPA raises,
  fusedops casts them (documented in fusedops/nn/attention.py); not changed.
- Functional SDPA on the layouts modules produce: q, k, v unbound from one fused projection laid out (B, L, H, 3, E)
  (heads interleaved with q / k / v) and (B, L, 3, H, E) through a permute, GQA from a (B, L, H_kv, group + 2, E)
  projection; pytorch#191937 (stride-0 broadcast key / value with S = 1 mod the key block, bf16, 4-D boolean mask);
  grad_output of .sum() (stride 0 everywhere); head dims 129 / 131 / 160 / 256 with Ev != E; masks sliced out of a
  padded buffer and a mask expanded along S; MQA with L > S causal, L = 1 GQA decoding: values and gradients.
- torch.compile (aot_eager, fullgraph) of the module with masks, causal hint and need_weights=True; inductor over the
  functional op with size-1 batch / head / length dims (fake and real strides agree): right, not kept (time).

DEFECTS found (fixed this session):
1. fusedops.nn.MultiheadAttention's flash path (need_weights=False) took the is_causal hint for its truth value:
   `causal = is_causal and key_padding_mask is None`. With a key_padding_mask, an is_causal of None (pytorch#137887's
   call) or 0 gave `None` / `0`, which fusedops.scaled_dot_product_attention refuses: TypeError "argument 'is_causal'
   must be bool, not NoneType", where torch's module (F.multi_head_attention_forward sets is_causal = False once a
   key_padding_mask is merged) returns the attention. Without a key_padding_mask, a truthy non-bool (1, numpy.True_,
   torch.tensor(True), "yes") turned causal masking on and dropped attn_mask, where torch's SDPA raises TypeError.
   Repro: `fusedops.nn.MultiheadAttention(8, 2)(x, x, x, key_padding_mask=kpm, attn_mask=m, need_weights=False,
   is_causal=None)`. Fix (fusedops/nn/attention.py, `_attention_forward`): torch's rule, the hint is off where a
   key_padding_mask is given and otherwise reaches the attention as given (drops attn_mask when truthy).
"""

from __future__ import annotations

import copy
import math
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import fusedops
import fusedops.nn as fnn
from fusedops.kernels import attention as kernels_attention
from helpers import assert_close

D = torch.float64
sdpa = fusedops.scaled_dot_product_attention


def _randn(shape, seed: int, dtype=D, scale: float = 1.0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=gen, dtype=D) * scale).to(dtype)


def _reference(q, k, v, attn_mask=None, is_causal=False, scale=None):
    """float64 attention with fusedops' semantics: GQA by repeating key / value heads, a boolean mask keeps True, a
    float one is added, is_causal top-left aligned, fully masked rows 0."""
    q, k, v = (t.to(D) for t in (q, k, v))
    if k.size(-3) != q.size(-3):
        k, v = (t.repeat_interleave(q.size(-3) // t.size(-3), -3) for t in (k, v))
    scale = 1.0 / math.sqrt(q.size(-1)) if scale is None else scale
    s = (q @ k.transpose(-1, -2)) * scale
    if attn_mask is not None:
        s = s.masked_fill(~attn_mask, -math.inf) if attn_mask.dtype == torch.bool else s + attn_mask.to(D)
    if is_causal:
        s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool).tril(), -math.inf)
    dead = (s == -math.inf).all(-1, keepdim=True)
    return torch.softmax(s.masked_fill(dead, 0.0), -1).masked_fill(dead, 0.0) @ v


def _pair(embed=8, heads=2, dtype=D, **kwargs):
    """torch's module and fusedops' with the same parameters (state_dict loaded strictly)."""
    theirs = torch.nn.MultiheadAttention(embed, heads, dtype=dtype, **kwargs)
    ours = fnn.MultiheadAttention(embed, heads, dtype=dtype, **kwargs)
    ours.load_state_dict(theirs.state_dict(), strict=True)
    return ours, theirs


def _outcome(fn):
    """('ok', value) or (exception type, message) of fn()."""
    try:
        return "ok", fn()
    except Exception as error:      # noqa: BLE001 - the outcome is compared with torch's
        return type(error), str(error)


@pytest.fixture
def launched(monkeypatch):
    """Counts the forward kernel launches (the kernel route ran, not torch's op)."""
    calls = []
    original = kernels_attention.attention_forward

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(kernels_attention, "attention_forward", counted)
    return calls


# ------------------------------------------------------------------------------------------------------------
# DEFECT 1: the is_causal hint taken for its truth value on the flash path
# ------------------------------------------------------------------------------------------------------------
_HINTS = [None, 0, 1, np.bool_(True), torch.tensor(True), "yes"]


@pytest.mark.parametrize("hint", _HINTS, ids=["None", "0", "1", "numpy-True", "tensor-True", "str"])
def test_defect1_non_bool_is_causal_hint_like_torch(route, hint):
    """need_weights=False: with a key_padding_mask the hint is off whatever it is (torch returns the attention; ours
    raised TypeError for None / 0); without one, a non-bool reaches SDPA, which raises TypeError as torch's does (ours
    took a truthy one as True and dropped attn_mask)."""
    ours, theirs = _pair(batch_first=True)
    x = _randn((2, 4, 8), 1)
    mask = torch.nn.Transformer.generate_square_subsequent_mask(4, dtype=D)
    padding = torch.tensor([[False] * 4, [False, False, True, True]])
    for kwargs in (dict(attn_mask=mask), dict(attn_mask=mask, key_padding_mask=padding),
                   dict(attn_mask=mask > -1, key_padding_mask=_randn((2, 4), 2))):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")         # torch's mismatched-mask-types deprecation warning
            want = _outcome(lambda: theirs(x, x, x, need_weights=False, is_causal=hint, **kwargs)[0])
            got = _outcome(lambda: ours(x, x, x, need_weights=False, is_causal=hint, **kwargs)[0])
        assert got[0] is want[0], (kwargs.keys(), got, want)
        if want[0] == "ok":
            assert_close(got[1], want[1], D)
        else:
            assert want[0] is TypeError and "is_causal" in got[1] and "must be bool" in got[1]


def test_defect1_is_causal_false_and_true_still_like_torch(route):
    """The bool hints: False keeps attn_mask, True drops it for SDPA's causal mask (no key_padding_mask) or merges
    the mask (with one), as torch's forward; gradients of inputs and parameters too."""
    ours, theirs = _pair()
    x = _randn((5, 2, 8), 3)
    mask = torch.nn.Transformer.generate_square_subsequent_mask(5, dtype=D)
    padding = torch.tensor([[False] * 5, [False, True, False, True, True]])
    for hint in (False, True):
        for kwargs in (dict(attn_mask=mask), dict(attn_mask=mask, key_padding_mask=padding)):
            results = []
            for module in (ours, theirs):
                leaf = x.clone().requires_grad_()
                out = module(leaf, leaf, leaf, need_weights=False, is_causal=hint, **kwargs)[0]
                results.append((out, torch.autograd.grad(out, [leaf, *module.parameters()], _randn(out.shape, 4))))
            assert_close(results[0][0], results[1][0], D)
            for a, b in zip(results[0][1], results[1][1]):
                assert_close(a, b, D)


# ------------------------------------------------------------------------------------------------------------
# Kept checks that were right
# ------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("with_padding", [False, True], ids=["hint", "hint+padding"])
def test_causal_hint_with_more_keys_than_queries_is_top_left(interpret, launched, with_padding):
    """Cross-attention with L = 3 queries and S = 6 keys and the is_causal hint: torch drops attn_mask for SDPA's
    top-left causal mask (query i sees keys j <= i) unless a key_padding_mask is given; ours the same, on the kernels,
    and equal to the float64 reference of the projected heads."""
    ours, theirs = _pair(batch_first=True)
    q, kv = _randn((2, 3, 8), 5), _randn((2, 6, 8), 6)
    mask = torch.triu(torch.full((3, 6), -math.inf, dtype=D), 4)     # not the top-left causal pattern
    padding = torch.tensor([[False] * 6, [False, False, True, False, True, True]]) if with_padding else None
    got = ours(q, kv, kv, attn_mask=mask, key_padding_mask=padding, need_weights=False, is_causal=True)[0]
    want = theirs(q, kv, kv, attn_mask=mask, key_padding_mask=padding, need_weights=False, is_causal=True)[0]
    assert launched and got.shape == (2, 3, 8)
    assert_close(got, want, D)
    # the reference: project, attend per head, project out
    w_q, w_k, w_v = theirs.in_proj_weight.chunk(3)
    b_q, b_k, b_v = theirs.in_proj_bias.chunk(3)

    def heads(x, w, b):
        return F.linear(x, w, b).view(2, x.size(1), 2, 4).transpose(1, 2)

    ref_mask = None
    if with_padding:
        ref_mask = mask.view(1, 1, 3, 6) + torch.zeros(2, 1, 1, 6, dtype=D).masked_fill(padding.view(2, 1, 1, 6),
                                                                                         -math.inf)
    attended = _reference(heads(q, w_q, b_q), heads(kv, w_k, b_k), heads(kv, w_v, b_v), attn_mask=ref_mask,
                          is_causal=not with_padding)
    expected = F.linear(attended.transpose(1, 2).reshape(2, 3, 8), theirs.out_proj.weight, theirs.out_proj.bias)
    assert_close(got, expected.detach(), D)


@pytest.mark.parametrize("embed,heads", [(9, 3), (10, 5), (6, 1)])
def test_head_dims_not_powers_of_two_in_train_and_fast_path_eval(interpret, launched, embed, heads):
    """Head dims 3 / 2 / 6 and odd head counts: in train mode (gradients of inputs and parameters, float64) and in
    eval under no_grad with batch_first self-attention, where torch's module runs its fast path."""
    ours, theirs = _pair(embed, heads, batch_first=True)
    x = _randn((2, 5, embed), embed)
    padding = torch.tensor([[False] * 5, [False, False, False, True, True]])
    results = []
    for module in (ours, theirs):
        leaf = x.clone().requires_grad_()
        out = module(leaf, leaf, leaf, key_padding_mask=padding, need_weights=False)[0]
        results.append((out, torch.autograd.grad(out, [leaf, *module.parameters()], _randn(out.shape, 7))))
    assert launched
    assert_close(results[0][0], results[1][0], D)
    for a, b in zip(results[0][1], results[1][1]):
        assert_close(a, b, D)
    for module in (ours, theirs):
        module.eval()
    with torch.no_grad():
        got = ours(x, x, x, key_padding_mask=padding, need_weights=False)[0]
        want = theirs(x, x, x, key_padding_mask=padding, need_weights=False)[0]   # torch's fast path
    assert_close(got, want, D)


def test_fully_masked_rows_and_heads_give_zero_as_installed_torch(interpret):
    """torch 2.13 gives 0 for a fully masked row (boolean and -inf masks, every CPU backend); so do fusedops' op and
    the module's flash path, also for a 3-D mask that masks one head of one batch entirely (pytorch#160064); with
    need_weights=True torch's forward runs and gives NaN there, as torch's module does."""
    q, k, v = _randn((1, 2, 3, 8), 1), _randn((1, 2, 5, 8), 2), _randn((1, 2, 5, 8), 3)
    keep = torch.ones(3, 5, dtype=torch.bool)
    keep[1] = False
    additive = torch.zeros(3, 5, dtype=D).masked_fill(~keep, -math.inf)
    for mask in (keep, additive):
        torch_out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
            math_out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        assert torch.equal(torch_out[:, :, 1], torch.zeros(1, 2, 8, dtype=D))
        assert torch.equal(math_out[:, :, 1], torch.zeros(1, 2, 8, dtype=D))
        ours = sdpa(q, k, v, attn_mask=mask)
        assert torch.equal(ours[:, :, 1], torch.zeros(1, 2, 8, dtype=D))
        assert_close(ours, _reference(q, k, v, attn_mask=mask), D)
    module, theirs = _pair(6, 3, batch_first=True)
    x = _randn((2, 5, 6), 4)
    head_mask = torch.zeros(2 * 3, 5, 5, dtype=torch.bool)
    head_mask[4] = True                       # batch 1, head 1: every key masked (True = masked in MHA)
    for need_weights in (False, True):
        got = module(x, x, x, attn_mask=head_mask, need_weights=need_weights, average_attn_weights=False)
        want = theirs(x, x, x, attn_mask=head_mask, need_weights=need_weights, average_attn_weights=False)
        assert torch.equal(got[0].isnan(), want[0].isnan())
        assert got[0].isnan().any() == need_weights
        finite = ~want[0].isnan()
        assert_close(got[0][finite], want[0][finite], D)


def test_learned_masks_and_checkpoint_gradients_like_torch(interpret):
    """A float key_padding_mask and a float attn_mask that require grad (learned biases: torch's op runs them) and the
    module under torch.utils.checkpoint (reentrant and not): outputs and the gradients of inputs, masks and
    parameters equal torch's."""
    ours, theirs = _pair()
    x, y = _randn((5, 2, 8), 1), _randn((3, 2, 8), 2)
    padding, bias = _randn((2, 3), 3), _randn((5, 3), 4)
    results = []
    for module in (ours, theirs):
        leaves = [t.clone().requires_grad_() for t in (x, y, padding, bias)]
        out = module(leaves[0], leaves[1], leaves[1], key_padding_mask=leaves[2], attn_mask=leaves[3],
                     need_weights=False)[0]
        results.append([out, *torch.autograd.grad(out.square().sum(), [*leaves, *module.parameters()])])
    for a, b in zip(*results):
        assert_close(a, b, D)
    boolean = torch.tensor([[False] * 3, [False, True, True]])
    for reentrant in (False, True):
        grads = []
        for module in (ours, theirs):
            module.zero_grad()
            leaf = x.clone().requires_grad_()
            out = torch.utils.checkpoint.checkpoint(
                lambda a: module(a, y, y, key_padding_mask=boolean, need_weights=False)[0], leaf,
                use_reentrant=reentrant)
            out.square().sum().backward()
            grads.append([leaf.grad, *(p.grad for p in module.parameters())])
        for a, b in zip(*grads):
            assert_close(a, b, D)


def test_export_and_parametrized_weights_like_torch(interpret):
    """torch.export of a module holding it (the custom operator in the graph), a parametrization on in_proj_weight
    (gradients reach the original), load_state_dict(assign=True) of a torch kdim / vdim module into a meta one."""
    ours, theirs = _pair(batch_first=True)

    class Cross(torch.nn.Module):
        def __init__(self, attention):
            super().__init__()
            self.attention = attention

        def forward(self, x, memory, padding):
            return self.attention(x, memory, memory, key_padding_mask=padding, need_weights=False)[0]

    x, memory = _randn((2, 5, 8), 1), _randn((2, 3, 8), 2)
    padding = torch.tensor([[False] * 3, [False, True, True]])
    exported = torch.export.export(Cross(ours), (x, memory, padding))
    assert any("fusedops.scaled_dot_product_attention" in str(node.target) for node in exported.graph.nodes)
    assert_close(exported.module()(x, memory, padding), Cross(theirs)(x, memory, padding), D)

    class Doubled(torch.nn.Module):
        def forward(self, weight):
            return weight * 2.0

    results = []
    for module in (copy.deepcopy(ours), copy.deepcopy(theirs)):
        torch.nn.utils.parametrize.register_parametrization(module, "in_proj_weight", Doubled())
        out = module(x, memory, memory, need_weights=False)[0]
        out.square().sum().backward()
        results.append((out, module.parametrizations.in_proj_weight.original.grad))
    for a, b in zip(*results):
        assert_close(a, b, D)

    source = torch.nn.MultiheadAttention(8, 2, dtype=D, batch_first=True, kdim=5, vdim=3)
    target = fnn.MultiheadAttention(8, 2, dtype=D, batch_first=True, kdim=5, vdim=3, device="meta")
    target.load_state_dict(source.state_dict(), assign=True)
    key, value = _randn((2, 4, 5), 3), _randn((2, 4, 3), 4)
    assert_close(target(x, key, value, need_weights=False)[0], source(x, key, value, need_weights=False)[0], D)


def _values_and_grads(fn, tensors, grad_out):
    leaves = [t.detach().clone().requires_grad_() for t in tensors]
    out = fn(*leaves)
    return out.detach(), torch.autograd.grad(out, leaves, grad_out)


@pytest.mark.parametrize("layout", ["heads-interleaved", "qkv-outer-permuted", "gqa-packed"])
def test_fused_projection_views_like_reference(interpret, launched, layout):
    """q, k, v unbound from one fused projection, read in place: (B, L, H, 3, E) (q / k / v interleaved per head),
    (B, L, 3, H, E) through a permute of (B, L, H, 3, E), and GQA from a (B, L, H_kv, group + 2, E) projection
    (Llama-style packing); causal with E = 10; values and gradients against float64 (the leaf is the projection)."""
    b, length, e = 2, 6, 10
    if layout == "heads-interleaved":
        packed = _randn((b, length, 3, 3, e), 1)

        def split(p):
            return [t.transpose(1, 2) for t in p.unbind(3)]
    elif layout == "qkv-outer-permuted":
        packed = _randn((b, length, 3, 3, e), 1).permute(0, 1, 3, 2, 4)

        def split(p):
            return [t.transpose(1, 2) for t in p.unbind(2)]
    else:
        packed = _randn((b, length, 2, 4, e), 1)        # 2 kv heads, group 2: (q0, q1, k, v) per kv head

        def split(p):
            q = p[:, :, :, :2].reshape(b, length, 4, e).transpose(1, 2)     # a copy: 4 query heads
            return q, p[:, :, :, 2].transpose(1, 2), p[:, :, :, 3].transpose(1, 2)
    gqa = layout == "gqa-packed"
    grad_out = _randn((b, 4 if gqa else 3, length, e), 2)
    got, got_grad = _values_and_grads(lambda p: sdpa(*split(p), is_causal=True, enable_gqa=gqa), (packed,), grad_out)
    want, want_grad = _values_and_grads(lambda p: _reference(*split(p), is_causal=True), (packed,), grad_out)
    assert launched
    assert_close(got, want, D)
    assert_close(got_grad[0], want_grad[0], D)


@pytest.mark.parametrize("length_k", [17, 33])
def test_broadcast_key_value_with_ragged_key_block(interpret, launched, length_k):
    """pytorch#191937: key / value broadcast over the batch (stride 0) with S = 1 mod the key block, bf16, a 4-D
    boolean mask; and broadcast over heads and batch in float64: values and gradients against float64."""
    for dtype, k_shape, q_shape in ((torch.bfloat16, (1, 2), (3, 2)), (D, (1, 1), (3, 4))):
        q = _randn((*q_shape, 5, 16), 1, dtype)
        k = _randn((*k_shape, length_k, 16), 2, dtype).expand(*q_shape, length_k, 16)
        v = _randn((*k_shape, length_k, 16), 3, dtype).expand(*q_shape, length_k, 16)
        mask = _randn((3, 1, 5, length_k), 4) > -0.3
        grad_out = _randn((*q_shape, 5, 16), 5, dtype)
        got, got_grads = _values_and_grads(lambda q, k, v: sdpa(q, k, v, attn_mask=mask), (q, k, v), grad_out)
        want, want_grads = _values_and_grads(lambda q, k, v: _reference(q, k, v, attn_mask=mask), (q, k, v),
                                             grad_out.to(D))
        assert_close(got, want, dtype)
        for a, b in zip(got_grads, want_grads):
            assert_close(a, b, dtype)
    assert launched
