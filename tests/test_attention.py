"""fusedops.scaled_dot_product_attention: the flash-attention kernels in the interpreter against float64
math attention (odd L, S, padded head dims, causal with L < S and L > S, boolean and additive masks with
fully masked rows, GQA, strided and broadcast inputs), gradients (gradcheck in float64, and against
float64 autograd), torch's argument errors, the PTX of the shipped configs (mma.sync, 0 spills), and
the GPU tier (`-m cuda`): realistic sizes, long sequences, batch * heads >= 65536, with an error at most
twice torch's own same-dtype error. On sm_90a the forward's key loop is checked in its PTX: wgmma with
A from registers, one barrier per key block.
"""

from __future__ import annotations

import dataclasses
import math
import re

import pytest
import torch

import fusedops
import fusedops.nn
import fusedops.dsl as dsl
from fusedops.autograd.attention import AttentionFunction
from fusedops.dsl.ir import OpCode
from fusedops.dsl.passes import dot_layouts
from fusedops.dsl.target import assemble, ptxas_available
from fusedops.kernels import attention as at
from fusedops.kernels.attention_backward_kernels import attention_backward_dkdv_kernel, attention_backward_dq_kernel
from fusedops.kernels.attention_configs import (
    FORWARD_CONFIGS, INTERPRETER_CONFIG, TWO_CTA_FORWARD_CONFIGS, TWO_CTA_MAX_KEYS, AttentionConfig, backward_configs,
    forward_config, head_block, sweep_configs)
from fusedops.kernels.attention_forward_kernels import attention_forward_kernel
from fusedops.kernels.attention_logits import ADDITIVE_MASK, BOOL_MASK, NO_MASK
from helpers import assert_close, random_tensor

needs_ptxas = pytest.mark.skipif(not ptxas_available(), reason="ptxas is not on the PATH")


@pytest.fixture
def interpret(monkeypatch):
    monkeypatch.setenv("FUSEDOPS_INTERPRET", "1")


def reference(q, k, v, mask=None, causal=False, scale=None, enable_gqa=False):
    """Math attention in float64 (any rank, broadcast batch dims); fully masked rows give 0."""
    q, k, v = q.double(), k.double(), v.double()
    if enable_gqa and q.dim() >= 3:
        group = q.size(-3) // k.size(-3)
        k, v = k.repeat_interleave(group, -3), v.repeat_interleave(group, -3)
    scale = 1.0 / math.sqrt(q.size(-1)) if scale is None else scale
    s = q @ k.transpose(-1, -2) * scale
    length_q, length_k = s.shape[-2:]
    if causal:
        s = s.masked_fill(~torch.ones(length_q, length_k, dtype=torch.bool, device=s.device).tril(), -math.inf)
    if mask is not None:
        s = s.masked_fill(~mask, -math.inf) if mask.dtype == torch.bool else s + mask.double()
    dead = (s == -math.inf).all(-1, keepdim=True)          # fully masked rows: 0, with zero gradients
    p = torch.softmax(s.masked_fill(dead, 0.0), -1).masked_fill(dead, 0.0)
    return p @ v


def _qkv(shape_q, shape_k, shape_v, dtype, seed, device="cpu", requires_grad=False):
    tensors = [random_tensor(shape, dtype, device, seed + i) for i, shape in enumerate((shape_q, shape_k, shape_v))]
    return [t.requires_grad_(requires_grad) for t in tensors]


def _mask_with_dead_rows(kind, shape, seed, dtype=torch.float32, device="cpu"):
    """A random mask over (..., L, S) with row 0 (and every third row) fully masked."""
    generator = torch.Generator().manual_seed(seed)
    keep = torch.rand(shape, generator=generator) > 0.3
    keep[..., ::3, :] = False
    if kind == "bool":
        return keep.to(device)
    bias = torch.randn(shape, generator=generator).masked_fill(~keep, -math.inf)
    return bias.to(device=device, dtype=dtype)


# -- forward in the interpreter ----------------------------------------------------------------------------

@pytest.mark.parametrize("length_q,length_k", [(1, 17), (17, 1), (17, 100), (100, 17), (17, 17)])
@pytest.mark.parametrize("dim", [16, 80])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("causal", [False, True])
def test_forward_matches_float64(length_q, length_k, dim, dtype, causal, seed, interpret):
    q, k, v = _qkv((1, 2, length_q, dim), (1, 2, length_k, dim), (1, 2, length_k, dim), dtype, seed)
    out = fusedops.scaled_dot_product_attention(q, k, v, is_causal=causal)
    assert out.dtype == dtype and out.shape == (1, 2, length_q, dim)
    assert_close(out, reference(q, k, v, causal=causal), dtype)


@pytest.mark.parametrize("kind", ["bool", "float"])
@pytest.mark.parametrize("mask_shape", [(17, 20), (2, 1, 17, 20), (2, 3, 17, 20)])
def test_masks_broadcast_and_fully_masked_rows_give_zero(kind, mask_shape, seed, interpret):
    q, k, v = _qkv((2, 3, 17, 16), (2, 3, 20, 16), (2, 3, 20, 24), torch.float32, seed)
    mask = _mask_with_dead_rows(kind, mask_shape, seed)
    out = fusedops.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert_close(out, reference(q, k, v, mask), torch.float32)
    assert (out[..., 0, :] == 0).all()
    torch_out = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(),
                                                                 attn_mask=mask if kind == "bool" else mask.double())
    assert_close(out, torch_out, torch.float32)         # torch also gives 0 for a fully masked row


def test_fp16_query_with_float32_mask_and_causal_combined(seed, interpret):
    q, k, v = _qkv((1, 2, 33, 16), (1, 2, 40, 16), (1, 2, 40, 16), torch.float16, seed)
    mask = torch.randn(33, 40)
    out = fusedops.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=True, scale=0.3)
    assert_close(out, reference(q, k, v, mask, causal=True, scale=0.3), torch.float16)


@pytest.mark.parametrize("heads,heads_kv", [(4, 2), (3, 1)])
def test_grouped_query_attention(heads, heads_kv, seed, interpret):
    q, k, v = _qkv((2, heads, 17, 16), (2, heads_kv, 33, 16), (2, heads_kv, 33, 16), torch.float32, seed)
    out = fusedops.scaled_dot_product_attention(q, k, v, enable_gqa=True, is_causal=True)
    assert_close(out, reference(q, k, v, causal=True, enable_gqa=True), torch.float32)


def test_strided_broadcast_and_any_rank_inputs(seed, interpret):
    # (B, L, H, E) storage seen as (B, H, L, E); key/value shared by the batch (stride 0); 3-D and 5-D
    q = random_tensor((2, 19, 3, 16), torch.float32, seed=seed).transpose(1, 2)
    k = random_tensor((1, 3, 16, 21), torch.float32, seed=seed + 1).transpose(-1, -2)
    v = random_tensor((3, 21, 40), torch.float32, seed=seed + 2)[..., ::2]
    out = fusedops.scaled_dot_product_attention(q, k, v)
    assert_close(out, reference(q, k, v), torch.float32)
    q3, k3, v3 = _qkv((3, 5, 16), (3, 7, 16), (3, 7, 16), torch.float32, seed)
    assert_close(fusedops.scaled_dot_product_attention(q3, k3, v3), reference(q3, k3, v3), torch.float32)
    q5, k5, v5 = _qkv((2, 1, 2, 5, 16), (1, 2, 2, 7, 16), (1, 2, 2, 7, 16), torch.float32, seed)
    out5 = fusedops.scaled_dot_product_attention(q5, k5, v5)
    assert out5.shape == (2, 2, 2, 5, 16)
    assert_close(out5, reference(q5, k5, v5), torch.float32)


def _query_layouts():
    """(name, q) of many layouts: contiguous, transposed from (B, L, H, E), split from a packed projection,
    permuted, sliced, expanded, size-1 dims, head dim not innermost."""
    packed = torch.randn(2, 5, 48)
    return [("contiguous", torch.randn(2, 3, 5, 16)),
            ("blhe", torch.randn(2, 5, 3, 16).transpose(1, 2)),
            ("packed_qkv", packed[..., :16].view(2, 5, 1, 16).transpose(1, 2)),
            ("packed_heads", torch.randn(2, 5, 96).split(32, dim=2)[1].view(2, 5, 2, 16).transpose(1, 2)),
            ("hb", torch.randn(3, 2, 5, 16).transpose(0, 1)),
            ("e_outer", torch.randn(16, 2, 3, 5).permute(1, 2, 3, 0)),
            ("l_inner", torch.randn(2, 3, 16, 5).transpose(2, 3)),
            ("sliced_e", torch.randn(2, 3, 5, 32)[..., :16]),
            ("stepped_l", torch.randn(2, 3, 10, 16)[:, :, ::2]),
            ("expanded_b", torch.randn(1, 3, 5, 16).expand(2, 3, 5, 16)),
            ("expanded_h", torch.randn(2, 1, 5, 16).expand(2, 3, 5, 16)),
            ("one_head_blhe", torch.randn(2, 5, 1, 16).transpose(1, 2)),
            ("one_row", torch.randn(2, 3, 1, 16)),
            ("3d", torch.randn(3, 5, 16))]


@pytest.mark.parametrize("name, q", _query_layouts(), ids=[name for name, _ in _query_layouts()])
def test_output_is_laid_out_as_torchs(name, q, interpret):
    # torch gives its output the query's memory order (head dim innermost): nanoGPT's
    # sdpa(q, k, v).transpose(1, 2).view(B, T, C) needs it (kernels/attention.py output_order)
    expected = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
    out = fusedops.scaled_dot_product_attention(q, q, q, is_causal=True)
    assert out.stride() == expected.stride()
    assert_close(out, reference(q, q, q, causal=True), torch.float32)


def test_nanogpt_merge_of_heads_views_and_backpropagates(seed, interpret):
    x = random_tensor((2, 7, 3 * 32), torch.float64, seed=seed).requires_grad_()
    q, k, v = (t.view(2, 7, 2, 16).transpose(1, 2) for t in x.split(32, dim=2))
    merged = fusedops.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).view(2, 7, 32)
    (merged * torch.arange(32, dtype=torch.float64)).sum().backward()
    grad, x.grad = x.grad, None
    q, k, v = (t.view(2, 7, 2, 16).transpose(1, 2) for t in x.split(32, dim=2))
    expected = reference(q, k, v, causal=True).transpose(1, 2).reshape(2, 7, 32)
    (expected * torch.arange(32, dtype=torch.float64)).sum().backward()
    torch.testing.assert_close(merged, expected)
    torch.testing.assert_close(grad, x.grad)


@pytest.mark.parametrize("shape_q,shape_k", [((0, 2, 5, 16), (0, 2, 7, 16)), ((1, 2, 0, 16), (1, 2, 7, 16)),
                                             ((1, 2, 5, 16), (1, 2, 0, 16))])
def test_empty_batch_and_sequences(shape_q, shape_k, interpret):
    q = torch.randn(shape_q, requires_grad=True)
    k, v = torch.randn(shape_k, requires_grad=True), torch.randn(shape_k, requires_grad=True)
    out = fusedops.scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(out, torch.nn.functional.scaled_dot_product_attention(q, k, v))
    out.sum().backward()
    assert all((t.grad == 0).all() for t in (q, k, v))


def test_lse_is_the_base_2_log_sum_exp(seed):
    q, k, v = _qkv((1, 1, 20, 16), (1, 1, 30, 16), (1, 1, 30, 16), torch.float64, seed)
    mask = _mask_with_dead_rows("bool", (1, 1, 20, 30), seed)
    _, pair = at.attention_forward(q, k, v, mask, False, 0.25, interpret=True)
    assert pair.shape == (1, 1, 2, 20)
    hi, lo = pair[:, :, 0], pair[:, :, 1]
    s = (q @ k.transpose(-1, -2) * 0.25).masked_fill(~mask, -math.inf)
    expected = torch.logsumexp(s, -1) / math.log(2)
    assert torch.isinf(hi[..., ::3]).all() and (hi[..., ::3] > 0).all() and (lo[..., ::3] == 0).all()  # fully masked
    torch.testing.assert_close(hi[..., 1::3] + lo[..., 1::3], expected[..., 1::3], rtol=1e-12, atol=1e-12)
    assert (hi[..., 1::3] + lo[..., 1::3] == hi[..., 1::3]).all()      # lo: below hi's rounding


def _math_attention(q, k, v, mask):
    """softmax(q k^T / sqrt(E) + mask) v with P materialized (autograd through softmax): the reference for
    huge additive masks, where torch's fused CPU kernels recompute P from a log-sum-exp that has rounded
    to the mask (their gradients come out S times too large)."""
    s = q @ k.transpose(-1, -2) / math.sqrt(q.size(-1)) + mask
    return torch.softmax(s, -1) @ v


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_finfo_min_masks_forward_and_gradients_are_torchs(dtype, seed):
    # Hugging Face's additive masks: torch.finfo(dtype).min on masked keys. A row masked on every key by
    # a value whose base-2 logit overflows attends to all its keys equally, as in torch (finfo.min + q.k
    # rounds to finfo.min), gradients included; float16's min (-65504) does not overflow: softmax(q.k).
    # Rows: every key at finfo.min, some keys, one key, half finfo.min, -1e9 (float16: its min)
    # everywhere, -inf on some. Reference: the math in float64 (float64 inputs) or float32 (the kernel's
    # logits; the sums with -1e9 keep q.k to float32's precision there).
    q, k, v = _qkv((1, 2, 6, 16), (1, 2, 9, 16), (1, 2, 9, 16), dtype, seed, requires_grad=True)
    low = torch.finfo(dtype).min
    mask = torch.zeros(6, 9, dtype=dtype)
    mask[0] = low
    mask[1, :5] = low
    mask[2, 3] = low
    mask[3, ::2] = low / 2
    mask[4] = -1e9 if dtype != torch.float16 else low
    mask[5, 1:] = -math.inf
    dout = random_tensor((1, 2, 6, 16), dtype, seed=seed + 7)
    wide = torch.float64 if dtype == torch.float64 else torch.float32
    leaves = [t.detach().to(wide).requires_grad_() for t in (q, k, v)]
    expected = _math_attention(*leaves, mask.to(wide))
    expected.backward(dout.to(wide))
    if dtype != torch.float16:
        torch.testing.assert_close(expected[:, :, 0], leaves[2].mean(2), rtol=1e-6, atol=1e-6)     # uniform
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FUSEDOPS_INTERPRET", "1")
        out = fusedops.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        out.backward(dout)
    # (float64: -1e9 * log2(e) + q.k keeps q.k to ~2e-7)
    tolerance = {torch.float64: 1e-6, torch.float32: 1e-5}.get(dtype, 3e-2)
    torch.testing.assert_close(out.to(wide), expected, rtol=tolerance, atol=tolerance)
    for ours, reference in zip((q, k, v), leaves):
        torch.testing.assert_close(ours.grad.to(wide), reference.grad, rtol=tolerance, atol=tolerance)


# -- gradients ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("causal,kind", [(False, None), (True, None), (False, "bool"), (True, "float")])
def test_gradcheck_in_float64(causal, kind, seed, interpret):
    q, k, v = _qkv((1, 2, 3, 3), (1, 1, 4, 3), (1, 1, 4, 5), torch.float64, seed, requires_grad=True)
    mask = None if kind is None else _mask_with_dead_rows(kind, (3, 4), seed, torch.float64)
    if mask is not None:
        mask[0, 0] = True if kind == "bool" else 0.5          # row 0 keeps one key: no dead row in gradcheck

    def attention(q, k, v):
        return fusedops.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=True)

    assert torch.autograd.gradcheck(attention, (q, k, v), eps=1e-6, atol=1e-7)


@pytest.mark.parametrize("kind", ["bool", "float"])
def test_gradients_match_float64_with_gqa_masks_and_dead_rows(kind, seed, interpret):
    q, k, v = _qkv((1, 4, 33, 16), (1, 2, 20, 16), (1, 2, 20, 16), torch.float32, seed, requires_grad=True)
    mask = _mask_with_dead_rows(kind, (33, 20), seed)
    grad_out = random_tensor((1, 4, 16, 33), torch.float32, seed=seed + 5).transpose(-1, -2)   # strided dO
    out = fusedops.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    grads = torch.autograd.grad(out, (q, k, v), grad_out)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    expected = torch.autograd.grad(reference(q64, k64, v64, mask, enable_gqa=True), (q64, k64, v64), grad_out.double())
    for grad, want in zip(grads, expected):
        assert torch.isfinite(grad).all()
        assert_close(grad, want, torch.float32)
    assert (grads[0][..., ::3, :] == 0).all()             # fully masked rows: zero gradient


@pytest.mark.parametrize("length_q,length_k", [(17, 40), (40, 17)])
def test_causal_gradients_in_float16(length_q, length_k, seed, interpret):
    q, k, v = _qkv((1, 2, length_q, 16), (1, 2, length_k, 16), (1, 2, length_k, 16), torch.float16, seed,
                   requires_grad=True)
    grad_out = random_tensor((1, 2, length_q, 16), torch.float16, seed=seed + 5)
    grads = torch.autograd.grad(fusedops.scaled_dot_product_attention(q, k, v, is_causal=True), (q, k, v), grad_out)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    expected = torch.autograd.grad(reference(q64, k64, v64, causal=True), (q64, k64, v64), grad_out.double())
    for grad, want in zip(grads, expected):
        assert grad.dtype == torch.float16
        assert_close(grad, want, torch.float16, tol=5e-3)



# -- interior (mask-free) blocks and ragged / diagonal tails ----------------------------------------------
# Small tiles with BLOCK_M != BLOCK_N so that the forward and dQ kernels run interior key blocks without
# masks, the peeled first block and the masked tail, and dK/dV takes the causal mask only across the
# diagonal: even and ragged lengths, causal with L < S and L > S.

_SPLIT_CONFIGS = [AttentionConfig(16, 16, 4, 1), AttentionConfig(32, 16, 4, 1), AttentionConfig(16, 32, 4, 1),
                  AttentionConfig(16, 32, 4, 1, kv_ring=True)]     # dK/dV loading K and V per query block


def _forward_and_backward(q, k, v, grad_out, mask, causal, scale, config):
    out, lse = at.attention_forward(q, k, v, mask, causal, scale, interpret=True, config=config)
    grads = at.attention_backward(grad_out, q, k, v, out, lse, mask, causal, scale, interpret=True,
                                  configs=(config, config))
    return out, grads


def _float64_forward_and_backward(q, k, v, grad_out, mask, causal, scale):
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    expected = reference(q64, k64, v64, mask, causal=causal, scale=scale)
    return expected.detach(), torch.autograd.grad(expected, (q64, k64, v64), grad_out.double())


@pytest.mark.parametrize("length_q,length_k", [(48, 48), (32, 48), (48, 32), (40, 37)])
@pytest.mark.parametrize("config", _SPLIT_CONFIGS, ids=lambda c: f"{c.block_m}x{c.block_n}{'kvring' if c.kv_ring else ''}")
@pytest.mark.parametrize("causal", [False, True])
def test_interior_and_tail_key_blocks(length_q, length_k, config, causal, seed):
    q, k, v = _qkv((1, 1, length_q, 16), (1, 1, length_k, 16), (1, 1, length_k, 16), torch.float32, seed)
    grad_out = random_tensor((1, 1, length_q, 16), torch.float32, seed=seed + 5)
    out, grads = _forward_and_backward(q, k, v, grad_out, None, causal, 0.3, config)
    expected, expected_grads = _float64_forward_and_backward(q, k, v, grad_out, None, causal, 0.3)
    assert_close(out, expected, torch.float32)
    for grad, want in zip(grads, expected_grads):
        assert_close(grad, want, torch.float32)


_DKDV_VARIANTS = [AttentionConfig(16, 32, 4, 1, kv_ring=True), AttentionConfig(16, 16, 4, 1, head_major=True)]


@pytest.mark.parametrize("config", _DKDV_VARIANTS, ids=["kv_ring", "head_major"])
@pytest.mark.parametrize("causal", [False, True])
def test_dkdv_variants_with_gqa_and_ragged_lengths(causal, config, seed):
    """The dK/dV kernel loading K and V per query block (kv_ring), or taking its programs head by head
    (head_major: program (x, y) -> the launch index y * (B * H_KV) + x split as head, key block; a mapping
    that skipped or repeated a (head, key block) leaves NaN or a wrong block), summing 3 query heads per
    key/value head over 2 x 2 key/value heads, at ragged lengths and a head dim below its block, against
    float64."""
    q, k, v = _qkv((2, 6, 37, 12), (2, 2, 41, 12), (2, 2, 41, 12), torch.float32, seed)
    grad_out = random_tensor((2, 6, 37, 12), torch.float32, seed=seed + 5)
    out, lse = at.attention_forward(q, k, v, None, causal, 0.3, interpret=True, config=_SPLIT_CONFIGS[0])
    grads = at.attention_backward(grad_out, q, k, v, out, lse, None, causal, 0.3, interpret=True,
                                  configs=(config, _SPLIT_CONFIGS[0]))
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    expected = reference(q64, k64, v64, causal=causal, scale=0.3, enable_gqa=True)
    for grad, want in zip(grads, torch.autograd.grad(expected, (q64, k64, v64), grad_out.double())):
        assert_close(grad, want, torch.float32)


@pytest.mark.parametrize("kind,causal,config", [("bool", True, _SPLIT_CONFIGS[1]), ("float", False, _SPLIT_CONFIGS[1]),
                                                 ("bool", False, _SPLIT_CONFIGS[3]), ("float", True, _SPLIT_CONFIGS[3])],
                         ids=str)
def test_masks_on_even_lengths_take_the_masked_path(kind, causal, config, seed):
    # with an attn_mask every key block is masked, also the ones a mask-free shape would treat as interior
    q, k, v = _qkv((1, 1, 32, 16), (1, 1, 48, 16), (1, 1, 48, 16), torch.float32, seed)
    grad_out = random_tensor((1, 1, 32, 16), torch.float32, seed=seed + 5)
    mask = _mask_with_dead_rows(kind, (1, 1, 32, 48), seed).expand(1, 1, 32, 48)
    out, grads = _forward_and_backward(q, k, v, grad_out, mask, causal, 0.3, config)
    expected, expected_grads = _float64_forward_and_backward(q, k, v, grad_out, mask, causal, 0.3)
    assert_close(out, expected, torch.float32)
    assert (out[..., ::3, :] == 0).all()
    for grad, want in zip(grads, expected_grads):
        assert torch.isfinite(grad).all()
        assert_close(grad, want, torch.float32)


def test_config_table_and_sweep_alternatives():
    for dim in (64, 128, 256):
        forward, backward = sweep_configs(dim, dim)
        assert forward[0] == forward_config(dim, dim) and backward[0] == backward_configs(dim, dim)
        assert len(set(forward)) == len(forward) and len(set(backward)) == len(backward)
    assert forward_config(80, 96) == TWO_CTA_FORWARD_CONFIGS[128]


def test_forward_config_choice():
    # two CTAs per SM on sm_90a without an attn_mask; E = 128 rows past TWO_CTA_MAX_KEYS keys, masked
    # forwards and mma.sync targets keep the one-CTA tiles (their 128-register cap would spill)
    limit = TWO_CTA_MAX_KEYS[128]
    assert forward_config(128, 128, length_k=limit) == TWO_CTA_FORWARD_CONFIGS[128]
    assert forward_config(128, 128, length_k=limit + 1) == FORWARD_CONFIGS[128]
    assert forward_config(64, 64, length_k=1 << 20) == TWO_CTA_FORWARD_CONFIGS[64]
    for dim in (64, 128):
        assert forward_config(dim, dim, masked=True) == FORWARD_CONFIGS[dim]
        assert forward_config(dim, dim, wgmma=False) == FORWARD_CONFIGS[dim]
        assert forward_config(dim, dim, vector_rows=False) == FORWARD_CONFIGS[dim]
        assert TWO_CTA_FORWARD_CONFIGS[dim].min_blocks_per_sm == 2
        assert FORWARD_CONFIGS[dim].min_blocks_per_sm == 0
    assert forward_config(256, 256) == FORWARD_CONFIGS[256]

# -- routing and errors ------------------------------------------------------------------------------------

def test_cpu_without_interpreter_runs_torch(seed, monkeypatch):
    monkeypatch.delenv("FUSEDOPS_INTERPRET", raising=False)
    q, k, v = _qkv((1, 2, 5, 8), (1, 2, 7, 8), (1, 2, 7, 8), torch.float32, seed)

    def fail(*args, **kwargs):
        raise AssertionError("the kernels ran")

    monkeypatch.setattr(at, "attention_forward", fail)
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(fusedops.scaled_dot_product_attention(q, k, v), expected)


def test_dropout_is_refused_not_ignored(interpret):
    q = torch.randn(1, 1, 4, 8)
    with pytest.raises(NotImplementedError, match="dropout_p"):
        fusedops.scaled_dot_product_attention(q, q, q, dropout_p=0.1)


def test_mask_requiring_grad_runs_torch(seed, interpret):
    q, k, v = _qkv((1, 1, 4, 8), (1, 1, 5, 8), (1, 1, 5, 8), torch.float64, seed)
    mask = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)
    fusedops.scaled_dot_product_attention(q, k, v, attn_mask=mask).sum().backward()
    assert mask.grad is not None


@pytest.mark.parametrize("case,message", [
    (lambda: (torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4, dtype=torch.float64), torch.randn(1, 2, 3, 4)),
     "same dtype"),
    (lambda: (torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 5), torch.randn(1, 2, 3, 4)), "head dim"),
    (lambda: (torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4), torch.randn(1, 2, 6, 4)), "sequence length"),
    (lambda: (torch.randn(4), torch.randn(4), torch.randn(4)), "at least 2 dimensional"),
])
def test_argument_errors_match_torch(case, message, interpret):
    with pytest.raises(RuntimeError, match=message):
        fusedops.scaled_dot_product_attention(*case())


def test_mask_and_head_errors(interpret):
    q, kv = torch.randn(1, 3, 4, 8), torch.randn(1, 2, 4, 8)
    with pytest.raises(RuntimeError, match="must divide"):
        fusedops.scaled_dot_product_attention(q, kv, kv, enable_gqa=True)
    with pytest.raises(RuntimeError):
        fusedops.scaled_dot_product_attention(q, kv, kv)                      # heads do not broadcast
    with pytest.raises(RuntimeError, match="attn_mask dtype"):
        fusedops.scaled_dot_product_attention(q, q, q, attn_mask=torch.ones(4, 4, dtype=torch.int32))
    with pytest.raises(RuntimeError):
        fusedops.scaled_dot_product_attention(q, q, q, attn_mask=torch.ones(4, 5, dtype=torch.bool))


def test_autograd_function_is_exported():
    assert "scaled_dot_product_attention" in dir(fusedops)
    assert issubclass(AttentionFunction, torch.autograd.Function)


# -- fusedops.nn.MultiheadAttention ------------------------------------------------------------------------

def _mha_pair(seed, **kwargs):
    torch.manual_seed(seed)
    theirs = torch.nn.MultiheadAttention(32, 2, **kwargs).double().eval()
    ours = fusedops.nn.MultiheadAttention(32, 2, **kwargs).double().eval()
    ours.load_state_dict(theirs.state_dict())
    assert list(ours.state_dict()) == list(theirs.state_dict())
    return ours, theirs


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("masks", ["none", "bool", "float"])
def test_multihead_attention_matches_torch(batch_first, masks, seed, interpret):
    ours, theirs = _mha_pair(seed, batch_first=batch_first, kdim=24, vdim=40)
    n, length_q, length_k = 2, 9, 11
    shape = (lambda length, dim: (n, length, dim)) if batch_first else (lambda length, dim: (length, n, dim))
    query = random_tensor(shape(length_q, 32), torch.float64, seed=seed)
    key = random_tensor(shape(length_k, 24), torch.float64, seed=seed + 1)
    value = random_tensor(shape(length_k, 40), torch.float64, seed=seed + 2)
    kwargs = {}
    if masks != "none":
        padding = torch.zeros(n, length_k, dtype=torch.bool)
        padding[:, -3:] = True
        attn = torch.rand(n * 2, length_q, length_k, generator=torch.Generator().manual_seed(seed)) > 0.8
        attn[..., 0] = False                   # every row keeps key 0: torch gives NaN for fully masked rows
        if masks == "float":
            padding, attn = _additive_float(padding), _additive_float(attn)
        kwargs = dict(key_padding_mask=padding, attn_mask=attn)
    out, weights = ours(query, key, value, need_weights=False, **kwargs)
    expected, _ = theirs(query, key, value, need_weights=False, **kwargs)
    assert weights is None
    assert_close(out, expected, torch.float64, tol=1e-10)
    out_w, weights = ours(query, key, value, **kwargs)          # need_weights: torch's exact path
    expected_w, expected_weights = theirs(query, key, value, **kwargs)
    torch.testing.assert_close(out_w, expected_w)
    torch.testing.assert_close(weights, expected_weights)


def _additive_float(mask):
    return torch.zeros(mask.shape, dtype=torch.float64).masked_fill(mask, -math.inf)


def test_multihead_attention_causal_unbatched_and_gradients(seed, interpret):
    ours, theirs = _mha_pair(seed)
    x = random_tensor((7, 32), torch.float64, seed=seed).requires_grad_()
    causal = torch.nn.Transformer.generate_square_subsequent_mask(7, dtype=torch.float64)
    out, _ = ours(x, x, x, need_weights=False, attn_mask=causal, is_causal=True)
    expected, _ = theirs(x, x, x, need_weights=False, attn_mask=causal, is_causal=True)
    assert_close(out, expected, torch.float64, tol=1e-10)
    grad = torch.autograd.grad(out.sum(), (x, ours.in_proj_weight))
    expected_grad = torch.autograd.grad(expected.sum(), (x, theirs.in_proj_weight))
    for g, e in zip(grad, expected_grad):
        assert_close(g, e, torch.float64, tol=1e-10)


# -- PTX of the shipped configs ----------------------------------------------------------------------------

def _strides(dim, heads=16, length=4096):
    return (heads * length * dim, length * dim, dim, 1)


def compile_forward(dim, causal=False, mask_kind=NO_MASK, dtype=torch.float16, arch="sm_90a", config=None):
    x, stats = torch.empty(16, dtype=dtype), torch.empty(16, dtype=torch.float32)
    mask = torch.empty(16, dtype=torch.uint8) if mask_kind == BOOL_MASK else x
    block = head_block(dim)
    config = config or forward_config(block, block, mask_kind != NO_MASK)
    return dsl.jit(attention_forward_kernel.fn).compile(
        x, stats, x, x, x, mask, *_strides(dim) * 4, *((0, 0, 4096, 1) if mask_kind else (0,) * 4),
        16, 1, 4096, 4096, dim, dim, 0.18, 0.0, target=arch, num_warps=config.num_warps, num_stages=config.num_stages,
        BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_E=block, BLOCK_EV=block, CAUSAL=causal,
        MASK_KIND=mask_kind, ACC=dsl.float32, MIN_BLOCKS=config.min_blocks_per_sm)


def compile_backward(kernel, dim, causal=False, mask_kind=NO_MASK, dtype=torch.float16, arch="sm_90a",
                     config=None, deterministic=False):
    x, stats = torch.empty(16, dtype=dtype), torch.empty(16, dtype=torch.float32)
    mask = torch.empty(16, dtype=torch.uint8) if mask_kind == BOOL_MASK else x
    block = head_block(dim)
    kv_config, q_config = backward_configs(block, block, mask_kind != NO_MASK, deterministic=deterministic)
    config = config or (kv_config if kernel == "dkdv" else q_config)
    options = dict(target=arch, num_warps=config.num_warps, num_stages=config.num_stages, BLOCK_M=config.block_m,
                   BLOCK_N=config.block_n, BLOCK_E=block, BLOCK_EV=block, CAUSAL=causal, MASK_KIND=mask_kind,
                   ACC=dsl.float32)
    mask_strides = (0, 0, 4096, 1) if mask_kind else (0,) * 4
    if kernel == "dkdv":
        return dsl.jit(attention_backward_dkdv_kernel.fn).compile(
            x, x, x, x, x, x, stats, stats, mask, *_strides(dim) * 6, *mask_strides,
            16, 1, 4096, 4096, dim, dim, 0.18, 0.0, 0.125, 0.0, KV_RING=config.kv_ring, EARLY_DP=config.early_dp,
            HEAD_MAJOR=config.head_major, DQ_ATOMIC=config.dq_atomic, dq_ptr=stats if config.dq_atomic else None,
            **options)
    return dsl.jit(attention_backward_dq_kernel.fn).compile(
        x, x, x, x, x, stats, stats, mask, *_strides(dim) * 5, *mask_strides,
        16, 1, 4096, 4096, dim, dim, 0.18, 0.0, 0.125, 0.0, HEAD_MAJOR=config.head_major, **options)


def _loop_bodies(ptx: str) -> list:
    """The text of each outermost loop of `ptx` (a label up to the last backward branch to it)."""
    lines = ptx.splitlines()
    labels = {m.group(1): i for i, line in enumerate(lines) if (m := re.match(r"\s*(\$L__\w+):", line))}
    spans = [(labels[m.group(1)], j) for j, line in enumerate(lines)
             if (m := re.search(r"\bbra(?:\.uni)?\s+(\$L__\w+);", line)) and labels.get(m.group(1), j) < j]
    outer = [s for s in spans if not any(o != s and o[0] <= s[0] and s[1] <= o[1] for o in spans)]
    return ["\n".join(lines[a:b + 1]) for a, b in sorted(outer)]


_REGISTER_A = re.compile(r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k16\.f32\.f16\.f16 \{[^}]*\}, \{%r")


# Bytes the two-CTA E = 128 forward (128 registers) may spill: values live across its key loops, stored
# before them and reloaded after (attention_configs.py's comment above TWO_CTA_FORWARD_CONFIGS; measured 8 / 36).
TWO_CTA_SPILL_BYTES = 64
# Bytes a causal dK/dV kernel (two query-block loops: the blocks that cross the diagonal, then the rest;
# 238-255 registers) may spill: values live across the loops (the shipped E = 128 tile's SASS: 40 bytes, no
# local memory access inside either loop; E = 64 deterministic: 0).
CAUSAL_DKDV_SPILL_BYTES = 64


@needs_ptxas
@pytest.mark.parametrize("dim,causal,mask_kind", [(64, False, NO_MASK), (64, True, NO_MASK),
                                                  (64, True, BOOL_MASK), (128, True, NO_MASK),
                                                  (128, False, NO_MASK), (128, False, ADDITIVE_MASK),
                                                  (256, True, BOOL_MASK), (256, False, NO_MASK)])
def test_forward_ptx_uses_tensor_cores_without_spills(dim, causal, mask_kind, tmp_path, monkeypatch):
    """sm_90a, E <= 128: both dots of every key block on wgmma, P V with A from registers (P straight from
    the logits' accumulator), Q K^T with Q converted to a register fragment once before the loops (the one-CTA
    tiles) or, under the two-CTA tiles' 128-register cap, read from shared memory filled once before them;
    K/V from the cp.async ring: one barrier per key block (the ring's), no st.shared or ld.shared, row
    statistics by shuffles within a warp. E = 256 (BLOCK_M = 64 on 8 warps: warpgroups split N) keeps
    mma.sync."""
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    compiled = compile_forward(dim, causal, mask_kind)
    config = forward_config(dim, dim, mask_kind != NO_MASK)
    ptx = compiled.asm["ptx"]
    assert "ex2.approx.ftz.f32" in ptx and "ex2.approx.f32" not in ptx     # P, alpha: subnormals flushed
    assert (".minnctapersm 2" in ptx) == (config.min_blocks_per_sm == 2)
    loops = _loop_bodies(ptx)
    # the interior key blocks and the masked tail (with an attn_mask every block is masked: one loop)
    assert len(loops) == (1 if mask_kind else 2)
    for body in loops:
        if dim == 256:
            assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in body
            continue
        assert "mma.sync" not in body and "ldmatrix" not in body
        # S = Q K^T: dim / 16 k-steps; P V: block_n / 16
        register_a = config.block_n // 16 + (0 if config.min_blocks_per_sm else dim // 16)
        assert len(re.findall(r"wgmma\.mma_async", body)) == dim // 16 + config.block_n // 16
        assert len(_REGISTER_A.findall(body)) == register_a
        assert "cp.async.cg.shared.global" in body
        barriers = len(re.findall(r"\bbar\.sync", body))
        if mask_kind:       # + the mask tile's move from its load layout to the logits' (through shared memory)
            assert barriers <= 7, barriers
            continue
        assert barriers == 1 and "st.shared" not in body and "ld.shared" not in body
        assert len(re.findall(r"\bshfl\.sync", body)) == 8     # max and sum of 2 row pairs, over 4 lanes each
    result = assemble(ptx, "sm_90a")
    two_cta_128 = config.min_blocks_per_sm and dim == 128
    assert result.spill_bytes <= (TWO_CTA_SPILL_BYTES if two_cta_128 else 0), result.log
    assert "warning" not in result.log.lower(), result.log
    assert compiled.shared_bytes * max(1, config.min_blocks_per_sm) <= 227 * 1024


@needs_ptxas
@pytest.mark.parametrize("kernel", ["dkdv", "dq"])
@pytest.mark.parametrize("dim,causal", [(64, True), (128, False), (128, True), (256, True)])
def test_backward_ptx_uses_tensor_cores_without_spills(kernel, dim, causal, tmp_path, monkeypatch):
    """Every tile the backward loops read comes through the cp.async ring (each loaded in the
    orientation its dot wants): 1 barrier per block and no st.shared without attn_mask. E = 64 (both
    kernels) and E = 128 dQ: all dots of the loop on wgmma with A from registers (was mma.sync with
    11-12 barriers and 26-34 st.shared per block); E = 128 dK/dV: all on wgmma too, V copied into
    shared memory once, before the loops (its fragment would not fit beside dk, dv and K's), K, P^T
    and dS^T from registers; E = 256 keeps mma.sync."""
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    compiled = compile_backward(kernel, dim, causal, deterministic=True)
    ptx = compiled.asm["ptx"]
    assert not re.search(r"\b(atom|red)\.", ptx)                   # deterministic: no atomics
    assert "ex2.approx.ftz.f32" in ptx and "ex2.approx.f32" not in ptx     # P: subnormals flushed
    on_wgmma = dim <= 128
    staged_v = kernel == "dkdv" and dim == 128
    assert not backward_configs(dim, dim)[0].kv_ring
    dots = (4 if kernel == "dkdv" else 3)
    bodies = _loop_bodies(ptx)
    for body in bodies:
        if dim <= 128:      # E = 256 runs one stage: no ring
            assert "cp.async.cg.shared.global" in body
        if on_wgmma:
            assert "mma.sync" not in body and "ldmatrix" not in body
            wgmmas = len(re.findall(r"wgmma\.mma_async", body))
            register_a = len(_REGISTER_A.findall(body))
            if staged_v:     # dP^T = V dO^T reads V from shared memory
                assert wgmmas >= dots and 0 < register_a < wgmmas
            else:
                assert wgmmas == register_a >= dots
            assert len(re.findall(r"\bbar\.sync", body)) == 1 and "st.shared" not in body
        else:
            assert "mma.sync.aligned.m16n8k16" in body
            assert len(re.findall(r"\bbar\.sync", body)) <= 9
    if staged_v and not causal:   # V (128 x 128: 8 16-byte copies per thread), once, before the loops, then
        # the ring's prologue: 4 tiles of 32 x 128 (2 copies each)
        before_loops = ptx.split(bodies[0])[0]
        assert before_loops.count("cp.async.cg.shared.global") == 8 + 4 * 2
        assert len(re.findall(r"cp\.async\.wait_group\s+0;", before_loops)) == 1
    if kernel == "dkdv" and on_wgmma:     # causal: the query blocks that cross the diagonal, then the rest
        assert len(bodies) == (2 if causal else 1)
    result = assemble(ptx, "sm_90a")
    allowed = CAUSAL_DKDV_SPILL_BYTES if kernel == "dkdv" and causal and dim == 128 else 0
    assert result.spill_bytes <= allowed, result.log
    assert compiled.shared_bytes <= 227 * 1024


@needs_ptxas
@pytest.mark.parametrize("kernel,dim,causal,mask_kind", [("dkdv", 64, False, BOOL_MASK),
                                                         ("dq", 64, True, ADDITIVE_MASK),
                                                         ("dkdv", 128, True, BOOL_MASK),
                                                         ("dq", 128, False, BOOL_MASK)])
def test_backward_ptx_with_attn_mask_without_spills(kernel, dim, causal, mask_kind, tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    compiled = compile_backward(kernel, dim, causal, mask_kind)
    result = assemble(compiled.asm["ptx"], "sm_90a")
    assert result.spill_bytes == 0, result.log
    if dim == 64 or kernel == "dq":
        assert "mma.sync" not in compiled.asm["ptx"].split(".entry")[-1]


@needs_ptxas
@pytest.mark.parametrize("dim", [64, 128])
def test_sweep_alternatives_assemble_without_spills(dim, tmp_path, monkeypatch):
    # causal: the kernels' largest variant (peeled block, interior and tail loops, diagonal branch)
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    forward, backward = sweep_configs(dim, dim)
    kernels = [("forward", c) for c in forward[1:]]
    kernels += [("dkdv", c) for c in dict.fromkeys(kv for kv, _ in backward[1:]) if c != backward[0][0]]
    kernels += [("dq", c) for c in dict.fromkeys(q for _, q in backward[1:]) if c != backward[0][1]]
    for kernel, config in kernels:
        compiled = (compile_forward(dim, True, config=config) if kernel == "forward"
                    else compile_backward(kernel, dim, True, config=config))
        result = assemble(compiled.asm["ptx"], "sm_90a")
        # (the E = 128 dK/dV alternative with 3 stages: 88 bytes, values live across the two causal loops)
        allowed = 2 * CAUSAL_DKDV_SPILL_BYTES if kernel == "dkdv" else 0
        assert result.spill_bytes <= allowed, f"{kernel} {config}: {result.log}"


@needs_ptxas
@pytest.mark.parametrize("dim,causal,mask_kind", [(64, False, NO_MASK), (64, True, ADDITIVE_MASK),
                                                  (128, True, NO_MASK)])
def test_head_major_dq_assembles_like_launch_order(dim, causal, mask_kind, tmp_path, monkeypatch):
    """The dQ kernel taking its programs head by head (a batch of many heads) differs from launch order
    only in its program index: the same wgmma loop, no spills."""
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    config = backward_configs(dim, dim, mask_kind != NO_MASK, query_heads=1 << 20, sms=132)[1]
    assert config.head_major
    head_major = compile_backward("dq", dim, causal, mask_kind, config=config)
    plain = compile_backward("dq", dim, causal, mask_kind, config=dataclasses.replace(config, head_major=False))
    result = assemble(head_major.asm["ptx"], "sm_90a")
    assert result.spill_bytes == 0, result.log
    count = lambda ptx, op: len(re.findall(op, ptx))                                   # noqa: E731
    for op in (r"wgmma\.mma_async", r"\bbar\.sync", r"cp\.async\.cg"):
        assert count(head_major.asm["ptx"], op) == count(plain.asm["ptx"], op), op


def test_dq_head_major_from_two_query_heads_per_sm():
    for dim in (64, 128):
        assert not backward_configs(dim, dim, query_heads=2 * 132 - 1, sms=132)[1].head_major
        kv, q = backward_configs(dim, dim, query_heads=2 * 132, sms=132)
        assert q.head_major and kv == backward_configs(dim, dim)[0]
        assert backward_configs(dim, dim, True, 1 << 20, 132)[0] == backward_configs(dim, dim, True)[0]


@pytest.mark.parametrize("causal", [False, True])
def test_head_major_forward_and_dq_in_the_interpreter(causal):
    """Head by head, the forward and dQ programs cover every (head, query block) once, GQA included, the
    last query block of each head first: results as in launch order, both against float64 torch."""
    generator = torch.Generator().manual_seed(27)
    q = torch.randn(2, 4, 37, 16, dtype=torch.float64, generator=generator)
    k, v = (torch.randn(2, 2, 29, 16, dtype=torch.float64, generator=generator) for _ in range(2))
    do = torch.randn(2, 4, 37, 16, dtype=torch.float64, generator=generator)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    expected = torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=causal, scale=0.3, enable_gqa=True)
    expected.backward(do)
    for head_major in (False, True):
        config = dataclasses.replace(INTERPRETER_CONFIG, head_major=head_major)
        o, lse = at.attention_forward(q, k, v, None, causal, 0.3, interpret=True, config=config)
        dq, dk, dv = at.attention_backward(do, q, k, v, o, lse, None, causal, 0.3, interpret=True,
                                           configs=(INTERPRETER_CONFIG, config))
        assert_close(o, expected.detach(), torch.float64, tol=1e-10)
        for got, leaf in zip((dq, dk, dv), leaves):
            assert_close(got, leaf.grad, torch.float64, tol=1e-10)


# -- GPU tier ----------------------------------------------------------------------------------------------

def _relative_error(actual, expected):
    return float(torch.linalg.vector_norm(actual.double() - expected) / torch.linalg.vector_norm(expected))


def _assert_within_twice_torch(ours, torch_low, expected, what):
    """Our error vs float64 at most 2x torch's same-dtype error (plus a floor for exact cases).

    An exactly-zero reference (dq when every query sees a single key: its softmax is constant) has no
    relative error; there the root-mean-square of our result must stay within the dtype's tolerance."""
    assert torch.isfinite(ours).all(), what
    if float(torch.linalg.vector_norm(expected)) == 0.0:
        tolerance = 5e-3 if ours.dtype == torch.float16 else 2e-2
        rms = float(ours.double().square().mean().sqrt())
        assert rms <= tolerance, f"{what}: the reference is exactly zero, ours has RMS {rms:.3e}"
        return
    ours_error, torch_error = _relative_error(ours, expected), _relative_error(torch_low, expected)
    if not math.isfinite(torch_error):       # some torch backends give NaN for fully masked rows
        torch_error = 0.5 * (5e-3 if ours.dtype == torch.float16 else 2e-2)
    assert ours_error <= 2 * torch_error + 1e-5, f"{what}: ours {ours_error:.3e} vs torch {torch_error:.3e}"


def _torch_sdpa(*args, **kwargs):
    return torch.nn.functional.scaled_dot_product_attention(*args, **kwargs)


_GPU_CASES = [  # (B, H, H_kv, L, S, E)
    (2, 16, 16, 1024, 1024, 64), (1, 8, 8, 2048, 2048, 128), (2, 8, 2, 1000, 1531, 128), (1, 4, 4, 777, 333, 80),
    (1, 4, 1, 513, 2047, 96), (1, 2, 2, 256, 256, 256), (3, 5, 5, 1, 129, 64), (2, 4, 4, 300, 1, 32),
    # E = 64, L not a multiple of the blocks: the H200 sweep caught wrong causal dK/dV here (session 4)
    (2, 8, 8, 1000, 1000, 64), (1, 4, 2, 1000, 700, 64),
    # E <= 64: dQ added by the dK/dV kernel (session 28), ragged in both lengths, GQA, small and odd E
    (1, 8, 2, 333, 2049, 64), (1, 6, 3, 777, 513, 48), (2, 4, 4, 129, 255, 16),
]


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("case", _GPU_CASES, ids=str)
def test_gpu_forward_and_backward_within_twice_torch_error(case, causal, dtype, seed):
    batch, heads, heads_kv, length_q, length_k, dim = case
    q, k, v = _qkv((batch, heads, length_q, dim), (batch, heads_kv, length_k, dim), (batch, heads_kv, length_k, dim),
                   dtype, seed, "cuda", requires_grad=True)
    gqa = heads != heads_kv
    grad_out = random_tensor((batch, heads, length_q, dim), dtype, "cuda", seed + 7)
    out = fusedops.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
    grads = torch.autograd.grad(out, (q, k, v), grad_out)
    torch_out = _torch_sdpa(q, k, v, is_causal=causal, enable_gqa=gqa)
    torch_grads = torch.autograd.grad(torch_out, (q, k, v), grad_out)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    expected = reference(q64, k64, v64, causal=causal, enable_gqa=gqa)
    expected_grads = torch.autograd.grad(expected, (q64, k64, v64), grad_out.double())
    _assert_within_twice_torch(out, torch_out, expected.detach(), "out")
    for name, ours, theirs, want in zip("qkv", grads, torch_grads, expected_grads):
        _assert_within_twice_torch(ours, theirs, want, f"d{name}")


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gpu_nanogpt_heads_merge_by_view(dtype, seed):
    # q, k, v split from one projection and viewed (B, T, H, E) -> (B, H, T, E): the output keeps that
    # layout, so merging the heads is a view; forward and gradients within twice torch's error
    x = random_tensor((2, 1000, 3 * 768), dtype, "cuda", seed).requires_grad_()
    grad_out = random_tensor((2, 1000, 768), dtype, "cuda", seed + 1)

    def heads(t):
        return (part.view(2, 1000, 12, 64).transpose(1, 2) for part in t.split(768, dim=2))

    out = fusedops.scaled_dot_product_attention(*heads(x), is_causal=True).transpose(1, 2).view(2, 1000, 768)
    grad = torch.autograd.grad(out, x, grad_out)[0]
    torch_out = _torch_sdpa(*heads(x), is_causal=True).transpose(1, 2).reshape(2, 1000, 768)
    torch_grad = torch.autograd.grad(torch_out, x, grad_out)[0]
    x64 = x.detach().double().requires_grad_()
    expected = reference(*heads(x64), causal=True).transpose(1, 2).reshape(2, 1000, 768)
    expected_grad = torch.autograd.grad(expected, x64, grad_out.double())[0]
    _assert_within_twice_torch(out, torch_out, expected.detach(), "out")
    _assert_within_twice_torch(grad, torch_grad, expected_grad, "dx")


@pytest.mark.cuda
@pytest.mark.parametrize("kind", ["bool", "float"])
def test_gpu_masks_with_dead_rows_and_non_contiguous_inputs(kind, seed):
    dtype = torch.float16
    q = random_tensor((2, 700, 8, 64), dtype, "cuda", seed).transpose(1, 2).requires_grad_()    # (B, L, H, E)
    k = random_tensor((1, 8, 900, 64), dtype, "cuda", seed + 1).expand(2, 8, 900, 64).detach().requires_grad_()
    v = random_tensor((2, 8, 64, 900), dtype, "cuda", seed + 2).transpose(-1, -2).detach().requires_grad_()
    mask = _mask_with_dead_rows(kind, (2, 1, 700, 900), seed, dtype, "cuda")
    grad_out = random_tensor((2, 8, 64, 700), dtype, "cuda", seed + 3).transpose(-1, -2)
    out = fusedops.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    grads = torch.autograd.grad(out, (q, k, v), grad_out)
    torch_out = _torch_sdpa(q, k, v, attn_mask=mask)
    torch_grads = torch.autograd.grad(torch_out, (q, k, v), grad_out)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    expected = reference(q64, k64, v64, mask)
    expected_grads = torch.autograd.grad(expected, (q64, k64, v64), grad_out.double())
    assert (out[..., ::3, :] == 0).all()
    _assert_within_twice_torch(out, torch_out, expected.detach(), "out")
    for name, ours, theirs, want in zip("qkv", grads, torch_grads, expected_grads):
        _assert_within_twice_torch(ours, theirs, want, f"d{name}")


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gpu_finfo_min_masks_forward_and_gradients(dtype, seed):
    # test_finfo_min_masks_forward_and_gradients_are_torchs on the H200's kernels at sizes that take
    # several key and query blocks: a (L, S) additive mask of finfo.min with rows masked everywhere,
    # partly, and not at all; reference: the math in float32 with P materialized.
    q, k, v = _qkv((2, 4, 300, 64), (2, 4, 500, 64), (2, 4, 500, 64), dtype, seed, "cuda", requires_grad=True)
    low = torch.finfo(dtype).min
    mask = torch.zeros(300, 500, dtype=dtype, device="cuda")
    mask[::5] = low                                    # every fifth query: all keys
    mask[1::5, 100:] = low
    mask[2::5, ::7] = low
    mask[3::5, 1:] = -math.inf
    dout = random_tensor((2, 4, 300, 64), dtype, "cuda", seed + 5)
    leaves = [t.detach().float().requires_grad_() for t in (q, k, v)]
    expected = _math_attention(*leaves, mask.float())
    expected.backward(dout.float())
    out = fusedops.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    out.backward(dout)
    if dtype == torch.bfloat16:     # its min overflows in base 2: those rows are the mean of v
        torch.testing.assert_close(expected[:, :, ::5], leaves[2].mean(2, keepdim=True).expand(-1, -1, 60, -1),
                                   rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out.float(), expected, rtol=2e-2, atol=2e-2)
    for ours, reference_leaf in zip((q, k, v), leaves):
        torch.testing.assert_close(ours.grad.float(), reference_leaf.grad, rtol=3e-2, atol=3e-2)


@pytest.mark.cuda
@pytest.mark.parametrize("length", [32769, 65537])
def test_gpu_long_sequences(length, seed):
    dtype = torch.float16
    q, k, v = _qkv((1, 2, length, 64), (1, 2, length, 64), (1, 2, length, 64), dtype, seed, "cuda")
    out = fusedops.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch_out = _torch_sdpa(q, k, v, is_causal=True)
    rows = torch.cat([torch.arange(0, 64), torch.arange(length // 2, length // 2 + 64), torch.arange(length - 65, length)])
    rows = rows.cuda()
    # the float64 reference of a few rows: row i attends to keys 0..i (top-left causal)
    s = (q[:, :, rows].double() @ k.double().transpose(-1, -2)) / 8.0
    s = s.masked_fill(torch.arange(length, device="cuda")[None, :] > rows[:, None], -math.inf)
    expected = torch.softmax(s, -1) @ v.double()
    _assert_within_twice_torch(out[:, :, rows], torch_out[:, :, rows], expected, f"L=S={length}")


@pytest.mark.cuda
def test_gpu_batch_times_heads_over_65535(seed):
    dtype = torch.bfloat16
    q, k, v = _qkv((1024, 72, 20, 32), (1024, 72, 33, 32), (1024, 72, 33, 32), dtype, seed, "cuda", requires_grad=True)
    out = fusedops.scaled_dot_product_attention(q, k, v)
    grads = torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
    torch_out = _torch_sdpa(q, k, v)
    torch_grads = torch.autograd.grad(torch_out, (q, k, v), torch.ones_like(out))
    expected = reference(q, k, v)
    _assert_within_twice_torch(out, torch_out, expected, "out")
    assert all(torch.isfinite(g).all() for g in grads)
    for ours, theirs in zip(grads, torch_grads):
        assert _relative_error(ours, theirs.double()) < 2e-2


@pytest.mark.cuda
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_head_major_dkdv_matches_launch_order_bit_for_bit(causal, seed):
    """E = 64's table dK/dV configs take their programs head by head (head_major); each (head, key block)
    computes the same sums either way, so dK and dV equal those of the launch-order mapping bit for bit
    (GQA, ragged lengths), and so does dQ with the deterministic config (the atomic one's dQ sums in a
    varying order: equal to rounding)."""
    q, k, v = _qkv((3, 8, 1000, 64), (3, 2, 777, 64), (3, 2, 777, 64), torch.float16, seed, "cuda")
    grad_out = random_tensor((3, 8, 1000, 64), torch.float16, seed=seed + 5, device="cuda")
    out, lse = at.attention_forward(q, k, v, None, causal, 0.125)
    for deterministic in (True, False):
        kv_config, q_config = backward_configs(64, 64, deterministic=deterministic)
        assert kv_config.head_major and kv_config.dq_atomic is not deterministic
        results = []
        for config in (kv_config, dataclasses.replace(kv_config, head_major=False)):
            grads = at.attention_backward(grad_out, q, k, v, out, lse, None, causal, 0.125, configs=(config, q_config))
            assert all(torch.isfinite(g).all() for g in grads)
            results.append(grads)
        (dq, dk, dv), (dq_launch_order, dk_launch_order, dv_launch_order) = results
        assert torch.equal(dk, dk_launch_order) and torch.equal(dv, dv_launch_order)
        if deterministic:
            assert torch.equal(dq, dq_launch_order)
        else:
            torch.testing.assert_close(dq, dq_launch_order, rtol=2e-3, atol=1e-4)


@pytest.mark.cuda
def test_gpu_backward_is_deterministic(seed):
    """dK and dV bit for bit run to run (dQ too under torch.use_deterministic_algorithms(True), where E <= 64
    otherwise adds it with atomic reductions: test_attention_dq_atomic.py)."""
    q, k, v = _qkv((2, 8, 1000, 64), (2, 2, 1000, 64), (2, 2, 1000, 64), torch.float16, seed, "cuda",
                   requires_grad=True)
    grad_out = torch.randn(2, 8, 1000, 64, device="cuda", dtype=torch.float16)
    first = torch.autograd.grad(fusedops.scaled_dot_product_attention(q, k, v, enable_gqa=True), (q, k, v), grad_out)
    second = torch.autograd.grad(fusedops.scaled_dot_product_attention(q, k, v, enable_gqa=True), (q, k, v), grad_out)
    assert all(torch.equal(a, b) for a, b in zip(first[1:], second[1:]))


def _forward_ir(dim, min_blocks):
    x, stats = torch.empty(16, dtype=torch.float16), torch.empty(16, dtype=torch.float32)
    return dsl.jit(attention_forward_kernel.fn).ir(
        x, stats, x, x, x, x, *_strides(dim) * 4, *(0,) * 4, 16, 1, 4096, 4096, dim, dim, 0.18, 0.0,
        BLOCK_M=128, BLOCK_N=32, BLOCK_E=dim, BLOCK_EV=dim, CAUSAL=False, MASK_KIND=NO_MASK, ACC=dsl.float32,
        MIN_BLOCKS=min_blocks)


@pytest.mark.parametrize("min_blocks,cap", [(0, 255), (1, 255), (2, 128), (3, 80), (4, 64)])
def test_register_cap_follows_launch_bounds(min_blocks, cap):
    # dot_layouts.register_cap: what dsl.launch_bounds(n) leaves each of 8 warps' threads (whole 8s), from
    # a dot nested in the key loops as from the top level; under 128 the forward's Q (a 32-register
    # fragment at E = 128 beside the 64-register accumulator) is read from shared memory instead
    function = _forward_ir(128, min_blocks)
    dots = [op for op in function.body.walk() if op.opcode == OpCode.DOT]
    assert len(dots) >= 3 and any(op.parent is not function.body for op in dots)
    assert {dot_layouts.register_cap(op, 8) for op in dots} == {cap}
    loop = next(op for op in function.body.ops if op.opcode == OpCode.FOR)
    q_kept = bool(dot_layouts._register_a_tiles(loop, 8))
    assert q_kept == (cap - dot_layouts.REGISTER_A_HEADROOM >= 64 + 32)
