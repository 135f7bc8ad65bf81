"""Review (session 35, API): a fresh reviewer tried to break the public ops (softmax / log_softmax, layer_norm /
rms_norm, matmul, scaled_dot_product_attention), their autograd and the nn modules / fusedops.nn.patch on the CPU,
with cases drawn from real bug reports of peer projects. The kernels run in the NumPy interpreter
(FUSEDOPS_INTERPRET=1, the path CUDA tensors take); the oracle is torch in float64 (or an explicit float64 formula).

What was tried (peer report -> case), all plain tests that pass unless marked as a defect:
- flash-attention qkv-packed inputs / nanoGPT's split-and-transpose (pytorch#138340): q, k, v as strided views of
  one packed projection, causal, fully masked rows, expanded masks; values and the gradient of the packed base.
- KV-cache decoding (pytorch#103082, top-left `is_causal` when L != S): q of one or three tokens against slices of
  a longer cache.
- causal L != S across the interpreter's 16-row blocks, forward and backward (flash-attention#1778,
  flash-attention#443, ffpa-attn#300, triton#5660): L = 40 / S = 17 and the reverse, one query or one key.
- attention masks read in place (xformers' attn_bias alignment reports): storage offsets, stepped and overlapping
  (as_strided) masks, boolean and additive; GQA with broadcast batch dims and a broadcast mask.
- aliased operands (x @ x, x @ x.T, sdpa(x, x, x)): gradients summed as torch's.
- backward must not write into its incoming gradient or its inputs (Liger-Kernel#370 / PR #376: Gemma2's in-place
  RMSNorm backward clobbered a dY still needed by the residual branch), and the Gemma2 double-norm-with-residual
  graph's gradients.
- in-place changes after the forward and inference-mode inputs: caught as torch catches them.
- fusedops.nn.patch on torch's TransformerEncoderLayer / TransformerDecoderLayer (train mode, padding and causal
  masks, both batch layouts, pre- and post-norm) and on Linear layers under weight_norm / spectral_norm / pruning.
- MultiheadAttention with unbatched inputs and 3-D float / boolean masks plus key_padding_mask.
- fusedops.nn.attention.transformers_attention_forward against Hugging Face's "sdpa" rules (GQA, decoding, a
  4-D mask built for a longer cache).
- non-finite eps (NaN, +-inf) in layer_norm / rms_norm; concurrent calls from threads (Triton's thread-safety
  reports); matmul with 1-D operands, out_dtype, bias and every epilogue, gradients in float16.
- seeded random configurations: attention (ragged L / S, odd head dims, Ev != E, transposed layouts, GQA, boolean
  / additive / broadcast masks, causal, scales; values and every gradient in float64) and the norms (one-block and
  split-window widths, 2-D normalized shapes, strided inputs, every dtype, with / without parameters).

DEFECTS found (fixed the same session; their tests below now pass):
1. fusedops.scaled_dot_product_attention (kernel route) always returns a contiguous (..., H, L, Ev) tensor, where
   torch returns the query's stride order (CPU and CUDA backends; pytorch#138340 made cuDNN do the same, and
   pytorch#153903 reports the XPU backend's contiguous output breaking torchao's GPTQ with "view size is not
   compatible"). So the nanoGPT pattern `sdpa(q, k, v).transpose(1, 2).view(B, T, C)` on q, k, v made by
   `.view(B, T, H, E).transpose(1, 2)` works on the CPU fallback route and with torch, and raises on the kernel
   route (a model that runs on the CPU fails on the GPU).
2. fusedops.nn.patch's replacement of Hugging Face's LlamaRMSNorm (and Mistral / Qwen2) rounds weight * x_hat to
   the *input* dtype before converting to the module's result dtype. The original returns
   `weight * x_hat.to(input_dtype)`, i.e. float32 for float16 activations with a float32 weight (PEFT's
   prepare_model_for_kbit_training keeps norms in float32): values past 65504 become inf (the original stays
   finite) and values below float16's normal range lose their digits (2% off for a weight of 1e-6).
   (huggingface/transformers#30236, NVIDIA/TransformerEngine#1132: RMSNorm results must follow HF's casting.)
3. The patched Hugging Face Conv1D (GPT-2) does not check the input's width: an empty batch of the wrong width
   returns an empty result where the original raises, and a non-empty one raises "shape '[2, 4]' is invalid for
   input of size 10", naming neither the expected width (nx) nor the one given (candle#3756: zero-sized matmul
   skipped the shape validation).
"""

from __future__ import annotations

import copy
import math
import random
import types
import warnings
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
import torch.nn.functional as F

import fusedops
import fusedops.nn
from fusedops.nn.attention import transformers_attention_forward
from helpers import assert_close
from hf_standins import Conv1D as _Conv1D, LlamaRMSNorm as _LlamaRMSNorm

D = torch.float64


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(shape, gen, dtype=D, scale=1.0):
    return (torch.randn(shape, generator=gen, dtype=torch.float64) * scale).to(dtype)


def _reference_attention(q, k, v, mask=None, causal=False, scale=None, gqa=False):
    """softmax(scale q k^T + mask) v in float64 with torch ops (differentiable): a boolean mask keeps True, an
    additive one is added, causal is top-left aligned, a fully masked row gives 0."""
    q, k, v = (t.to(D) for t in (q, k, v))
    if gqa:
        group = q.size(-3) // k.size(-3)
        k, v = k.repeat_interleave(group, -3), v.repeat_interleave(group, -3)
    scale = 1.0 / math.sqrt(q.size(-1)) if scale is None else scale
    s = (q @ k.transpose(-1, -2)) * scale
    if mask is not None:
        s = s.masked_fill(~mask, -math.inf) if mask.dtype == torch.bool else s + mask.to(D)
    if causal:
        keep = torch.ones(q.size(-2), k.size(-2), dtype=torch.bool).tril()
        s = s.masked_fill(~keep, -math.inf)
    empty = (s == -math.inf).all(-1, keepdim=True)
    p = torch.softmax(s.masked_fill(empty, 0.0), -1).masked_fill(empty, 0.0)
    return p @ v


def _values_and_grads(fn, inputs, grad_seed=99):
    """fn(*leaves) and the leaves' gradients for a fixed random output gradient (float64 for the reference)."""
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    out = fn(*leaves)
    go = _randn(out.shape, _gen(grad_seed)).to(out.dtype)
    grads = torch.autograd.grad(out, leaves, go)
    return out.detach(), grads


# ------------------------------------------------------------------------------------------------
# attention: layouts and lengths from peer reports
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mask_kind", [None, "rows_off", "float_cols"])
def test_sdpa_packed_qkv_views_values_and_base_gradient(interpret, seed, causal, mask_kind):
    B, L, H, E = 2, 5, 3, 4
    packed = _randn((B, L, 3, H, E), _gen(seed))
    mask = None
    if mask_kind == "rows_off":     # every other query row fully masked (expanded, stride 0 over keys)
        mask = (torch.arange(L) % 2 == 0)[:, None].expand(L, L)
    elif mask_kind == "float_cols":
        mask = (torch.arange(L, dtype=D)[:, None] * 0.3).expand(L, L)

    def run(attend):
        base = packed.clone().requires_grad_()
        q, k, v = (base[:, :, i].transpose(1, 2) for i in range(3))
        o = attend(q, k, v, mask, causal)
        o.backward(_randn(o.shape, _gen(seed + 1)))
        return o.detach(), base.grad

    ours = run(lambda q, k, v, m, c: fusedops.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=c))
    ref = run(lambda q, k, v, m, c: _reference_attention(q, k, v, m, c))
    assert_close(ours[0], ref[0], D)
    assert_close(ours[1], ref[1], D)


@pytest.mark.parametrize("length_q", [1, 3])
@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_decoding_against_kv_cache_slices(interpret, seed, length_q, causal):
    gen = _gen(seed)
    cache_k, cache_v = _randn((2, 3, 10, 8), gen, torch.float32), _randn((2, 3, 10, 8), gen, torch.float32)
    q = _randn((2, 3, length_q, 8), gen, torch.float32)
    k, v = cache_k[:, :, :7], cache_v[:, :, :7]      # the filled part of the cache: strided views
    out = fusedops.scaled_dot_product_attention(q, k, v, is_causal=causal)
    # torch's is_causal is top-left aligned: query i sees keys j <= i, also when L != S (pytorch#103082)
    assert_close(out, _reference_attention(q, k, v, causal=causal), torch.float32)


@pytest.mark.parametrize("lengths", [(40, 17), (17, 40), (33, 1), (1, 33)])
def test_sdpa_causal_unequal_lengths_across_blocks(interpret, seed, lengths):
    length_q, length_k = lengths
    gen = _gen(seed)
    q, k, v = _randn((1, 2, length_q, 8), gen), _randn((1, 2, length_k, 8), gen), _randn((1, 2, length_k, 6), gen)
    ours = _values_and_grads(lambda *t: fusedops.scaled_dot_product_attention(*t, is_causal=True), (q, k, v))
    ref = _values_and_grads(lambda *t: _reference_attention(*t, causal=True), (q, k, v))
    assert_close(ours[0], ref[0], D)
    for got, want in zip(ours[1], ref[1]):
        assert torch.isfinite(got).all()
        assert_close(got, want, D)


def test_sdpa_masks_read_in_place(interpret, seed):
    gen = _gen(seed)
    q, k, v = _randn((2, 3, 7, 5), gen), _randn((2, 3, 9, 5), gen), _randn((2, 3, 9, 6), gen)
    big = _randn((2, 3, 11, 13), gen)
    masks = {
        "offset slice": big[:, :, 2:9, 3:12],
        "offset slice bool": big[:, :, 2:9, 3:12] > 0,
        "stepped": _randn((7, 18), gen)[:, ::2],
        "stepped bool": (_randn((7, 18), gen) > 0)[:, 1::2],
        "heads broadcast": big[:, :1, 1:8, 1:10],
        "overlapping": _randn((40,), gen).as_strided((7, 9), (1, 2)),
        "transposed bool": (_randn((9, 7), gen) > -0.3).t(),
    }
    for name, mask in masks.items():
        ours = fusedops.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        assert_close(ours, _reference_attention(q, k, v, mask), D), name


def test_sdpa_gqa_with_broadcast_batch_and_mask(interpret, seed):
    gen = _gen(seed)
    q, k, v = _randn((2, 4, 3, 5), gen), _randn((1, 2, 6, 5), gen), _randn((1, 2, 6, 7), gen)
    mask = _randn((2, 1, 3, 6), gen)
    ours = _values_and_grads(lambda *t: fusedops.scaled_dot_product_attention(*t, attn_mask=mask, enable_gqa=True),
                             (q, k, v))
    ref = _values_and_grads(lambda a, b, c: _reference_attention(a, b.expand(2, 2, 6, 5), c.expand(2, 2, 6, 7),
                                                                 mask, gqa=True), (q, k, v))
    assert_close(ours[0], ref[0], D)
    for got, want in zip(ours[1], ref[1]):
        assert got.shape == want.shape
        assert_close(got, want, D)


@pytest.mark.parametrize("case", range(12))
def test_sdpa_random_configurations_forward_and_backward(interpret, seed, case):
    """Random shapes (ragged L, S, odd head dims, Ev != E), layouts, GQA, masks, causal and scales, float64
    against the reference, with every input's gradient."""
    rng = random.Random(seed)
    gen = _gen(seed)
    heads_kv, group = rng.choice([1, 2]), rng.choice([1, 2, 3])
    heads, batch = heads_kv * group, rng.choice([1, 2])
    length_q, length_k = rng.randint(1, 37), rng.randint(1, 37)
    dim, dim_v = rng.choice([1, 3, 8, 17, 33]), rng.choice([1, 4, 19, 40])
    q = _randn((batch, heads, length_q, dim), gen)
    if rng.random() < 0.5:
        q = _randn((batch, length_q, heads, dim), gen).transpose(1, 2)
    k = _randn((batch, heads_kv, length_k, dim), gen)
    if rng.random() < 0.5:
        k = _randn((batch, length_k, heads_kv, dim), gen).transpose(1, 2)
    v = _randn((length_k, batch, heads_kv, dim_v), gen).permute(1, 2, 0, 3)
    mask = rng.choice([None, "bool", "float", "bool keys", "float 2-d"])
    mask = {None: None, "bool": torch.rand(batch, heads, length_q, length_k, generator=gen) > 0.3,
            "float": _randn((batch, heads, length_q, length_k), gen),
            "bool keys": torch.rand(batch, 1, 1, length_k, generator=gen) > 0.3,
            "float 2-d": _randn((length_q, length_k), gen)}[mask]
    causal, scale = rng.random() < 0.4, rng.choice([None, 0.1, 1.7])
    kwargs = dict(attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=group > 1)
    ours = _values_and_grads(lambda *t: fusedops.scaled_dot_product_attention(*t, **kwargs), (q, k, v))
    ref = _values_and_grads(lambda *t: _reference_attention(*t, mask, causal, scale, group > 1), (q, k, v))
    assert_close(ours[0], ref[0], D)
    for got, want in zip(ours[1], ref[1]):
        assert torch.isfinite(got).all()
        assert_close(got, want, D)


@pytest.mark.parametrize("case", range(10))
def test_norms_random_configurations_forward_and_backward(interpret, seed, case):
    """Random normalized shapes (across the one-block and split-window sizes), leading dims, layouts, dtypes,
    parameters and eps: values and every gradient against float64 torch, within the dtype's tolerance or
    twice torch's own error in that dtype, whichever is larger."""
    rng = random.Random(seed)
    gen = _gen(seed)
    op = rng.choice(["layer_norm", "rms_norm"])
    normalized = (rng.choice([3, 16, 33, 130, 600, 1030, 2100]),)
    if rng.random() < 0.3:
        normalized = (rng.choice([2, 5]), rng.choice([7, 16]))
    lead = tuple(rng.choice([1, 2, 3]) for _ in range(rng.randint(0, 2)))
    dtype = rng.choice([D, torch.float32, torch.float16, torch.bfloat16])
    shape = lead + normalized
    x = (_randn(shape, gen) * rng.choice([1.0, 1e-3, 100.0]) + rng.choice([0.0, 5.0])).to(dtype)
    if rng.random() < 0.5:      # a column-strided view
        wide = torch.zeros(*shape[:-1], 2 * shape[-1], dtype=dtype)
        wide[..., ::2] = x
        x = wide[..., ::2]
    weight = _randn(normalized, gen, dtype) if rng.random() < 0.7 else None
    bias = _randn(normalized, gen, dtype) if op == "layer_norm" and rng.random() < 0.7 else None
    eps = rng.choice([1e-5, 0.1] if op == "layer_norm" else [None, 1e-6, 0.1])
    inputs = [t for t in (x, weight, bias) if t is not None]

    def call(fn, *tensors):
        it = iter(tensors)
        x_, w_, b_ = next(it), next(it) if weight is not None else None, next(it) if bias is not None else None
        if op == "layer_norm":
            return fn[0](x_, normalized, w_, b_, eps)
        return fn[1](x_, normalized, w_, eps)

    torch_eps = None if eps is not None else torch.finfo(D if dtype == D else torch.float32).eps
    ours = _values_and_grads(lambda *t: call((fusedops.layer_norm, fusedops.rms_norm), *t), inputs)
    low = _values_and_grads(lambda *t: call((F.layer_norm, F.rms_norm), *t), inputs)
    ref = _values_and_grads(lambda *t: call((F.layer_norm, lambda a, s, w, e: F.rms_norm(a, s, w, e or torch_eps)),
                                            *(u.double() for u in t)), inputs)
    tol = {D: 1e-10, torch.float32: 1e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2}[dtype]
    for got, torchs, want in zip((ours[0], *ours[1]), (low[0], *low[1]), (ref[0], *ref[1])):
        scale = max(float(want.norm()), 1e-6)
        torch_error = float((torchs.double() - want).norm()) / scale
        assert float((got.double() - want).norm()) / scale <= max(tol, 2 * torch_error)
        assert got.dtype == torchs.dtype and got.shape == want.shape


# ------------------------------------------------------------------------------------------------
# DEFECT 1: the output layout of scaled_dot_product_attention
# ------------------------------------------------------------------------------------------------
def _nanogpt_qkv(seed, B=2, T=5, H=3, E=4):
    """q, k, v as nanoGPT makes them: one projection split and viewed (B, T, H, E).transpose(1, 2)."""
    x = _randn((B, T, 3 * H * E), _gen(seed), torch.float32)
    return tuple(t.view(B, T, H, E).transpose(1, 2) for t in x.split(H * E, dim=2))


def test_sdpa_output_layout_on_the_fallback_route_is_torchs(fallback, seed):
    q, k, v = _nanogpt_qkv(seed)
    out = fusedops.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert out.stride() == F.scaled_dot_product_attention(q, k, v, is_causal=True).stride()
    out.transpose(1, 2).view(2, 5, 12)      # nanoGPT's merge of the heads


def test_sdpa_output_of_contiguous_query_is_contiguous_like_torch(interpret, seed):
    q = _randn((2, 3, 5, 4), _gen(seed), torch.float32)
    out = fusedops.scaled_dot_product_attention(q, q, q)
    assert out.is_contiguous() and F.scaled_dot_product_attention(q, q, q).is_contiguous()


def test_defect1_sdpa_output_keeps_the_querys_layout(interpret, seed):
    q, k, v = _nanogpt_qkv(seed)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    out = fusedops.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert_close(out, _reference_attention(q, k, v, causal=True), torch.float32)
    assert out.stride() == expected.stride()
    merged = out.transpose(1, 2).view(2, 5, 12)       # raises "view size is not compatible" today
    assert_close(merged, expected.transpose(1, 2).reshape(2, 5, 12).double(), torch.float32)


# ------------------------------------------------------------------------------------------------
# autograd: aliasing, untouched buffers, in-place changes, inference tensors
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", ["x@x", "x@x.T", "x.T@x", "x@x+x[0]", "sdpa(x,x,x)", "sdpa(x,flip,flip)"])
def test_aliased_operands_gradients(interpret, seed, case):
    gen = _gen(seed)
    if case.startswith("sdpa"):
        base = _randn((1, 2, 3, 4), gen)
        ops = {"sdpa(x,x,x)": lambda f, x: f(x, x, x), "sdpa(x,flip,flip)": lambda f, x: f(x, x.flip(2), x.flip(2))}
        ours = _values_and_grads(lambda x: ops[case](fusedops.scaled_dot_product_attention, x), (base,))
        ref = _values_and_grads(lambda x: ops[case](_reference_attention, x), (base,))
    else:
        base = _randn((4, 4), gen)
        ops = {"x@x": lambda f, x: f(x, x), "x@x.T": lambda f, x: f(x, x.t()), "x.T@x": lambda f, x: f(x.t(), x),
               "x@x+x[0]": lambda f, x: f(x, x, x[0])}
        ours = _values_and_grads(lambda x: ops[case](fusedops.matmul, x), (base,))
        ref = _values_and_grads(lambda x: ops[case](lambda a, b, c=None: a @ b + (0 if c is None else c), x), (base,))
    assert_close(ours[0], ref[0], D)
    assert_close(ours[1][0], ref[1][0], D)


def _untouched_cases(dtype, gen):
    x, w, b = _randn((3, 8), gen, dtype), _randn((8,), gen, dtype), _randn((8,), gen, dtype)
    q = _randn((1, 2, 3, 8), gen, dtype)
    return {
        "layer_norm": (lambda x, w, b: fusedops.layer_norm(x, (8,), w, b), (x, w, b)),
        "rms_norm": (lambda x, w: fusedops.rms_norm(x, (8,), w), (x, w)),
        "softmax": (lambda x: fusedops.softmax(x, 0), (x,)),
        "log_softmax": (lambda x: fusedops.log_softmax(x, -1), (x,)),
        "matmul_gelu": (lambda x, w, b: fusedops.matmul(x, w[:, None].expand(8, 3).contiguous(), b[:3],
                                                         activation="gelu"), (x, w, b)),
        "attention": (lambda q, k, v: fusedops.scaled_dot_product_attention(q, k, v, is_causal=True),
                      (q, q.flip(2), q * 2)),
    }


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_backward_leaves_its_gradient_inputs_and_output_untouched(interpret, seed, dtype):
    for name, (fn, inputs) in _untouched_cases(dtype, _gen(seed)).items():
        leaves = [t.clone().requires_grad_() for t in inputs]
        before = [t.detach().clone() for t in leaves]
        out = fn(*leaves)
        out_before = out.detach().clone()
        go = _randn(out.shape, _gen(seed + 1), dtype)
        go_before = go.clone()
        torch.autograd.grad(out, leaves, go)
        assert torch.equal(go, go_before), name          # Liger-Kernel#370: an in-place dY broke Gemma2
        assert torch.equal(out.detach(), out_before), name
        assert all(torch.equal(t.detach(), t0) for t, t0 in zip(leaves, before)), name


def test_gemma2_double_norm_with_a_residual_between(interpret, seed):
    # Gemma2's block: the residual sits between two RMSNorms, so the first norm's dY is still needed after the
    # second norm's backward (the graph where Liger's in-place backward gave wrong gradients)
    gen = _gen(seed)
    x, w1, w2 = _randn((4, 16), gen, torch.float32), _randn((16,), gen, torch.float32), _randn((16,), gen,
                                                                                             torch.float32)

    def block(rms, x, w1, w2):
        h = rms(x, (16,), w1, 1e-6)
        r = h + x
        return rms(r, (16,), w2, 1e-6) * r

    ours = _values_and_grads(lambda *t: block(fusedops.rms_norm, *t), (x, w1, w2))
    ref = _values_and_grads(lambda *t: block(F.rms_norm, *(u.double() for u in t)), (x, w1, w2))
    assert_close(ours[0], ref[0], torch.float32)
    for got, want in zip(ours[1], ref[1]):
        assert_close(got, want, torch.float32)


def test_in_place_changes_after_the_forward_are_caught_like_torch(interpret, seed):
    gen = _gen(seed)
    x = _randn((3, 4), gen, torch.float32).requires_grad_()
    y = x * 1
    out = fusedops.layer_norm(y, (4,))
    y.mul_(2.0)                     # the saved input changed: torch's layer_norm raises too
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()
    q = _randn((1, 2, 3, 4), gen, torch.float32).requires_grad_()
    o = fusedops.scaled_dot_product_attention(q, q, q)
    torch_o = F.scaled_dot_product_attention(q, q, q)
    o.add_(1.0)                     # the saved output changed (torch's CPU attention saves its output too)
    torch_o.add_(1.0)
    for t in (o, torch_o):
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            t.sum().backward()


def test_inference_mode_inputs_are_refused_like_torch(interpret, seed):
    gen = _gen(seed)
    with torch.inference_mode():
        xi, qi = _randn((3, 4), gen, torch.float32), _randn((1, 1, 3, 4), gen, torch.float32)
    w = _randn((4, 2), gen, torch.float32).requires_grad_()
    q = _randn((1, 1, 3, 4), gen, torch.float32).requires_grad_()
    for ours, theirs in ((lambda: fusedops.matmul(xi, w), lambda: torch.matmul(xi, w)),
                         (lambda: fusedops.scaled_dot_product_attention(q, qi, qi),
                          lambda: F.scaled_dot_product_attention(q, qi, qi))):
        for call in (ours, theirs):
            with pytest.raises(RuntimeError, match="Inference tensors cannot be saved for backward"):
                call().sum().backward()


# ------------------------------------------------------------------------------------------------
# matmul: vector operands, out_dtype and epilogues, gradients in float16
# ------------------------------------------------------------------------------------------------
_ACT = {None: lambda z: z, "relu": F.relu, "gelu": F.gelu, "gelu_tanh": lambda z: F.gelu(z, approximate="tanh"),
        "silu": F.silu}


@pytest.mark.parametrize("shapes", [((7,), (7, 5)), ((3, 7), (7,)), ((7,), (7,)), ((2, 3, 7), (7,)),
                                    ((7,), (2, 7, 5)), ((2, 1, 3, 7), (4, 7, 5))])
@pytest.mark.parametrize("out_dtype", [None, torch.float32])
def test_matmul_vector_operands_out_dtype_and_epilogues(interpret, seed, shapes, out_dtype):
    gen = _gen(seed)
    shape_a, shape_b = shapes
    n = 1 if len(shape_b) == 1 else shape_b[-1]
    a, b, bias = _randn(shape_a, gen, torch.float16), _randn(shape_b, gen, torch.float16), _randn((n,), gen,
                                                                                                   torch.float16)
    for act in _ACT:
        ours = _values_and_grads(lambda *t: fusedops.matmul(*t, activation=act, out_dtype=out_dtype), (a, b, bias))
        ref = _values_and_grads(lambda x, y, c: _ACT[act](torch.matmul(x.double(), y.double()) + c.double()),
                                (a, b, bias))
        assert ours[0].dtype == (out_dtype or torch.float16)
        assert ours[0].shape == ref[0].shape
        assert_close(ours[0], ref[0], torch.float16)
        for got, want, leaf in zip(ours[1], ref[1], (a, b, bias)):
            assert got.dtype == leaf.dtype and got.shape == leaf.shape
            assert_close(got, want, torch.float16, tol=5e-3)


# ------------------------------------------------------------------------------------------------
# norms: non-finite eps
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("eps", [float("nan"), float("inf"), -float("inf"), -1e30])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_non_finite_and_negative_eps_like_torch(interpret, seed, eps, dtype):
    gen = _gen(seed)
    x, w, b = _randn((3, 6), gen, dtype), _randn((6,), gen, dtype), _randn((6,), gen, dtype)
    assert_close(fusedops.layer_norm(x, (6,), w, b, eps), F.layer_norm(x.double(), (6,), w.double(), b.double(), eps),
                 dtype)
    assert_close(fusedops.rms_norm(x, (6,), w, eps), F.rms_norm(x.double(), (6,), w.double(), eps), dtype)


# ------------------------------------------------------------------------------------------------
# threads
# ------------------------------------------------------------------------------------------------
def test_concurrent_calls_from_threads(interpret):
    def job(i):
        gen = _gen(1000 + i)
        n, m = 3 + i % 5, 5 + i % 7
        x, w = _randn((n, m), gen), _randn((m,), gen)
        q = x[None, None]
        pairs = [(fusedops.softmax(x, i % 2), torch.softmax(x, i % 2)),
                 (fusedops.layer_norm(x, (m,), w), F.layer_norm(x, (m,), w)),
                 (fusedops.rms_norm(x, (m,), w, 1e-6), F.rms_norm(x, (m,), w, 1e-6)),
                 (fusedops.matmul(x, x.t()), x @ x.t()),
                 (fusedops.scaled_dot_product_attention(q, q, q, is_causal=bool(i % 2)),
                  _reference_attention(q, q, q, causal=bool(i % 2)))]
        return max(float((a - b).abs().max()) for a, b in pairs)

    with ThreadPoolExecutor(6) as pool:
        errors = list(pool.map(job, range(24)))
    assert max(errors) < 1e-12


# ------------------------------------------------------------------------------------------------
# modules: patched transformer layers, reparametrized weights, MHA unbatched
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("batch_first,norm_first", [(True, False), (False, True)])
def test_patched_encoder_layer_matches_torch_in_training(interpret, seed, batch_first, norm_first):
    torch.manual_seed(seed)
    ref = torch.nn.TransformerEncoderLayer(16, 4, dim_feedforward=32, dropout=0.0, batch_first=batch_first,
                                           norm_first=norm_first).double().train()
    ours = copy.deepcopy(ref)
    report = fusedops.nn.patch(ours)
    assert {type(m).__name__ for m in ours.modules()} >= {"MultiheadAttention", "LayerNorm", "Linear"}
    assert len(report.replaced) == 5
    x = _randn((2, 5, 16) if batch_first else (5, 2, 16), _gen(seed))
    padding = torch.tensor([[False] * 5, [False, False, False, True, True]])
    causal = torch.nn.Transformer.generate_square_subsequent_mask(5, dtype=D)
    for kwargs in ({}, dict(src_key_padding_mask=padding), dict(src_mask=causal, is_causal=True),
                   dict(src_mask=causal, src_key_padding_mask=padding)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")     # torch's warning about mismatched mask types
            got = _values_and_grads(lambda t: ours(t, **kwargs), (x,))
            want = _values_and_grads(lambda t: ref(t, **kwargs), (x,))
        assert_close(got[0], want[0], D)
        assert_close(got[1][0], want[1][0], D)


def test_patched_decoder_layer_with_memory_masks(interpret, seed):
    torch.manual_seed(seed)
    ref = torch.nn.TransformerDecoderLayer(16, 4, 32, dropout=0.0, batch_first=True).double().train()
    ours = copy.deepcopy(ref)
    fusedops.nn.patch(ours)
    gen = _gen(seed)
    tgt, memory = _randn((3, 6, 16), gen), _randn((3, 5, 16), gen)
    tgt_padding = torch.zeros(3, 6, dtype=torch.bool)
    tgt_padding[1, 4:] = True
    memory_padding = torch.zeros(3, 5, dtype=torch.bool)
    memory_padding[0, 3:] = True
    causal = torch.nn.Transformer.generate_square_subsequent_mask(6, dtype=D)
    kwargs = dict(tgt_mask=causal, tgt_is_causal=True, tgt_key_padding_mask=tgt_padding,
                  memory_key_padding_mask=memory_padding)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = _values_and_grads(lambda t, m: ours(t, m, **kwargs), (tgt, memory))
        want = _values_and_grads(lambda t, m: ref(t, m, **kwargs), (tgt, memory))
    assert_close(got[0], want[0], D)
    for a, b in zip(got[1], want[1]):
        assert_close(a, b, D)


@pytest.mark.parametrize("kind", ["weight_norm", "spectral_norm", "prune"])
def test_patched_linear_under_weight_reparametrizations(interpret, seed, kind):
    import torch.nn.utils as U
    import torch.nn.utils.prune as prune

    wrap = {"weight_norm": U.weight_norm, "spectral_norm": U.spectral_norm,
            "prune": lambda m: prune.l1_unstructured(m, "weight", 0.5)}[kind]
    torch.manual_seed(seed)
    ref = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.LayerNorm(4)).double()
    ours = copy.deepcopy(ref)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")     # weight_norm's deprecation warning
        torch.manual_seed(seed + 1)
        wrap(ref[0])
        torch.manual_seed(seed + 1)
        wrap(ours[0])
    report = fusedops.nn.patch(ours)
    assert [entry.path for entry in report.replaced] == ["0", "1"]
    ref.eval()
    ours.eval()
    x = _randn((3, 5), _gen(seed))
    got, want = _values_and_grads(ours, (x,)), _values_and_grads(ref, (x,))
    assert_close(got[0], want[0], D)
    assert_close(got[1][0], want[1][0], D)


@pytest.mark.parametrize("batch_first", [True, False])
def test_multihead_attention_unbatched_with_masks(interpret, seed, batch_first):
    torch.manual_seed(seed)
    ref = torch.nn.MultiheadAttention(4, 2, batch_first=batch_first).double()
    ours = fusedops.nn.MultiheadAttention(4, 2, batch_first=batch_first).double()
    ours.load_state_dict(ref.state_dict())
    gen = _gen(seed)
    query, key = _randn((3, 4), gen), _randn((5, 4), gen)
    attn_mask = _randn((2, 3, 5), gen)
    padding = torch.tensor([False, False, True, False, True])
    for kwargs in ({}, dict(attn_mask=attn_mask), dict(key_padding_mask=padding),
                   dict(attn_mask=attn_mask[0] > 0, key_padding_mask=padding),
                   dict(attn_mask=attn_mask, key_padding_mask=padding.double() * -3)):
        got = _values_and_grads(lambda q, k: ours(q, k, k, need_weights=False, **kwargs)[0], (query, key))
        want = _values_and_grads(lambda q, k: ref(q, k, k, need_weights=False, **kwargs)[0], (query, key))
        assert got[0].shape == (3, 4)
        assert_close(got[0], want[0], D)
        for a, b in zip(got[1], want[1]):
            assert_close(a, b, D)


# ------------------------------------------------------------------------------------------------
# Hugging Face adapters (transformers is not installed here: classes stand in under their qualified names,
# which is how fusedops.nn.patch recognizes them)
# ------------------------------------------------------------------------------------------------
def _hf_sdpa_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None):
    # transformers/integrations/sdpa_attention.py's rules, written out
    group = getattr(module, "num_key_value_groups", 1)
    key, value = key.repeat_interleave(group, 1), value.repeat_interleave(group, 1)
    if attention_mask is not None and attention_mask.ndim == 4:
        attention_mask = attention_mask[:, :, :, :key.shape[-2]]
    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    is_causal = query.shape[2] > 1 and attention_mask is None and is_causal
    out = _reference_attention(query, key, value, attention_mask, is_causal, scaling)
    return out.transpose(1, 2).contiguous(), None


@pytest.mark.parametrize("lengths,mask_kind", [((5, 5), None), ((1, 7), None), ((3, 7), None), ((4, 4), "bool"),
                                               ((3, 6), "float"), ((3, 9), "longer bool")])
def test_transformers_attention_function_follows_sdpa_rules(interpret, seed, lengths, mask_kind):
    length_q, length_k = lengths
    gen = _gen(seed)
    module = types.SimpleNamespace(num_key_value_groups=2, is_causal=True)
    q, k, v = _randn((2, 4, length_q, 8), gen), _randn((2, 2, length_k, 8), gen), _randn((2, 2, length_k, 8), gen)
    mask = None
    if mask_kind == "bool":
        mask = _randn((2, 1, length_q, length_k), gen) > 0
    elif mask_kind == "float":
        mask = _randn((2, 1, length_q, length_k), gen)
    elif mask_kind == "longer bool":       # built for a longer (static) cache
        mask = _randn((2, 1, length_q, length_k + 4), gen) > -0.5
    out, weights = transformers_attention_forward(module, q, k, v, mask, scaling=0.3)
    want, _ = _hf_sdpa_attention(module, q, k, v, mask, scaling=0.3)
    assert weights is None and out.is_contiguous() and out.shape == (2, length_q, 4, 8)
    assert_close(out, want, D)




@pytest.mark.parametrize("x_dtype,w_dtype", [(torch.float32, torch.float32), (torch.float16, torch.float16),
                                             (torch.bfloat16, torch.bfloat16), (torch.float32, torch.bfloat16)])
def test_patched_llama_rmsnorm_matches_the_original(interpret, seed, x_dtype, w_dtype):
    original = _LlamaRMSNorm(8).to(w_dtype)
    with torch.no_grad():
        original.weight.copy_(_randn((8,), _gen(seed)))
    patched = copy.deepcopy(original)
    report = fusedops.nn.patch(patched)
    assert [entry.replacement for entry in report.replaced] == ["fusedops.nn.patch.FusedLlamaRMSNorm"]
    x = _randn((3, 8), _gen(seed + 1), x_dtype)
    got, want = patched(x), original(x)
    assert got.dtype == want.dtype
    truth = (x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-6)) * original.weight.double()
    low = x_dtype if x_dtype != torch.float32 else w_dtype
    assert_close(got, truth, low if low != torch.float32 else torch.float32)


def test_defect2_patched_llama_rmsnorm_float16_activations_float32_weight(interpret, seed):
    original = _LlamaRMSNorm(8)      # float32 weight (e.g. norms kept in float32 for k-bit training)
    with torch.no_grad():
        original.weight.copy_(torch.tensor([1e-6, 3e-5, 1.0, 2.0, 500.0, 2000.0, 6e4, 0.5]))
    patched = copy.deepcopy(original)
    fusedops.nn.patch(patched)
    x = _randn((4, 8), _gen(seed), torch.float16)
    x[:, 6] = 4.0 * x[:, 6].sign()          # x_hat ~ 2.4 in the heavy channel: ~1.4e5 after the weight
    want = original(x)
    got = patched(x)
    assert want.dtype == got.dtype == torch.float32
    assert torch.isfinite(want).all()
    assert torch.isfinite(got).all()        # inf today in the heavy channel
    truth = (x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-6)) * original.weight.double()
    relative = ((got.double() - truth).abs() / truth.abs()).max()
    assert relative <= 2e-3                 # the original: ~5e-4 (float16 x_hat times an exact weight)


def test_patched_conv1d_matches_the_original(interpret, seed):
    torch.manual_seed(seed)
    original = _Conv1D(6, 4).double()
    patched = copy.deepcopy(original)
    fusedops.nn.patch(patched)
    gen = _gen(seed)
    for x in (_randn((2, 3, 4), gen), _randn((4,), gen), _randn((0, 4), gen)):
        got, want = _values_and_grads(patched, (x,)), _values_and_grads(original, (x,))
        assert got[0].shape == want[0].shape
        if x.numel():
            assert_close(got[0], want[0], D)
            assert_close(got[1][0], want[1][0], D)


def test_defect3_patched_conv1d_checks_the_input_width(interpret, seed):
    original = _Conv1D(6, 4)
    patched = copy.deepcopy(original)
    fusedops.nn.patch(patched)
    gen = _gen(seed)
    wide = _randn((2, 5), gen, torch.float32)
    with pytest.raises(RuntimeError):
        original(wide)
    with pytest.raises(RuntimeError, match=r"\b5\b"):     # the width given (5) against nx = 4
        patched(wide)
    empty = _randn((0, 5), gen, torch.float32)
    with pytest.raises(RuntimeError):
        original(empty)
    with pytest.raises(RuntimeError):                      # returns a (0, 6) tensor today
        patched(empty)
