"""Review (session 38, attention): a fresh reviewer tried to break fusedops.scaled_dot_product_attention,
fusedops.softmax / log_softmax, fusedops.nn.MultiheadAttention and fusedops.nn.Softmax against torch 2.13's
semantics, on both CPU routes (`interpret`: the kernels in the NumPy interpreter, FUSEDOPS_INTERPRET=1, the route
CUDA tensors take; `fallback`: torch's op, what a CPU user gets by default). The oracle is a float64 math
reference with fusedops' documented semantics (top-left causal mask, attn_mask and is_causal both applied, fully
masked rows 0).

What was tried (peer report -> case), right unless listed under DEFECTS:
- cudnn-frontend#804's review (a causal mask applied before the softmax scale: scale 0 gives NaN, a negative
  scale +inf) and pytorch#105202 (math backend, negative scale): is_causal with scale 0, -0.0, negative, a 0-d
  tensor, L < S and L > S, values and float64 gradients: right on the kernel route; DEFECT 1 on the fallback.
  A sweep of torch's CPU kernel against its math backend (L, S in 1..70, causal, bool / float / finfo.min /
  fully masked masks, GQA, fp16 / bf16 / fp32 / fp64, scales None / 1e-30 / 3) found no other difference that the
  fallback route would inherit.
- flash-attention's bottom-right causal alignment debate (pytorch#108108): fusedops documents top-left and does
  it, eagerly, through the custom operator (direct calls, both routes) and under torch.compile (aot_eager).
- A randomized sweep (several hundred cases, not kept; a few kept below) of dtypes fp16 / bf16 / fp32 / fp64, head dims
  1, 3, 8, 16, 24, 40, 72, 112 with Ev != E, L and S in 1..40, GQA groups 1-3, causal, masks (L, S) bool,
  (B, 1, 1, S) bool, (B, H, L, S) float, float32 masks of 16-bit queries, rows of -inf (fully masked) and -inf
  columns, BSHD views of a packed projection and stride-0 expands, scales None / 0 / negative, requires_grad on
  each subset of q, k, v: values and gradients within 4x torch's own error in the same dtype (16-bit gradients a
  few times torch's CPU error: P is rounded to 16 bits before P @ V, as FlashAttention does, documented).
- Online-softmax rescaling across key blocks (flash-attention#443-style NaN backward): rows whose first key blocks
  are -inf or finfo.min, rows masked everywhere by -inf or by finfo.min, fp16 / bf16 / fp32 / fp64, gradients.
- xformers / pytorch#120810 mixed ranks: 2-D .. 5-D query against 2-D .. 5-D key / value, with and without
  enable_gqa and 1-D / 2-D / 3-D masks, against torch's math backend: DEFECT 2 for 2-D inputs under enable_gqa.
- pytorch#148476 (only attn_mask requires grad), a learned mask through the operator called directly (its
  recomputed gradients with causal and GQA), torch.library.opcheck of that call.
- nn.MultiheadAttention (pytorch#97409, #97128, #107641, #27968): several hundred random configurations (kdim / vdim,
  bias, batch_first, unbatched, self-attention by identity, bool / float key_padding_mask, 2-D / 3-D bool / float
  attn_mask, the is_causal hint, train / eval) against torch's module with the same state_dict: outputs and the
  gradients of inputs and parameters equal to 1e-9; CPU autocast bf16 and a float16 module equal to torch's.
- softmax / log_softmax: a randomized sweep (600 cases: ranks 0-4, sizes 0-130, every dim, fp16 / bf16 / fp32 /
  fp64 inputs with dtype= None / up / down, -inf / +inf / NaN entries, transposed / strided / expanded inputs,
  gradients); dim=None (TypeError as torch.softmax), nn.Softmax(dim=None)'s deprecation warning (it points at the
  caller's line, where torch.nn.Softmax's points into torch's module.py).
Not changed (documented): on the fallback route a NaN key that a boolean or causal mask leaves out still gives NaN
with 3-D inputs (torch's math backend, pytorch#101967); MultiheadAttention's flash path gives no "mismatched
key_padding_mask and attn_mask" deprecation warning (torch's forward does).

DEFECTS (fixed this session, fusedops/autograd/attention.py; their tests below):
1. On the fallback route (CPU tensors by default; also every call torch's op runs: float32 / float64 CUDA inputs,
   head dims over 256, a mask that requires grad, vmap), is_causal=True with a scale of 0, -0.0 or a negative scale
   gave NaN rows, forward and backward, where the kernel route (and torch's math backend) give the softmax of the
   scaled, causally masked logits. Repro: `fusedops.scaled_dot_product_attention(q, k, v, is_causal=True,
   scale=-0.5)` with float64 q (1, 1, 2, 8), k and v (1, 1, 3, 8): all NaN. Cause: torch_attention passed
   is_causal to torch's op, whose CPU flash kernel masks the logits with -inf before scaling them. Fix: for a
   scale <= 0, torch_attention folds the causal mask into a boolean attn_mask (as it already does for
   attn_mask + is_causal).
2. enable_gqa=True with a 2-D key or value (no heads dim) raised a raw IndexError ("Dimension out of range
   (expected to be in range of [-2, 1], but got -3)") from check_arguments / gqa_heads_differ on both routes, and
   2-D inputs throughout gave a result on the kernel route but torch's IndexError on the fallback route. Cause:
   `key.size(-3)` where the kernel route's _as_4d takes a missing heads dim as 1. Fix: `_heads` (1 for 2-D) in
   the checks and the routing; torch_attention gives 2-D inputs a heads dim of 1 under enable_gqa.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn.functional as F

import fusedops
import fusedops.nn as fnn
from helpers import assert_close

D = torch.float64
sdpa = fusedops.scaled_dot_product_attention


def _randn(shape, seed: int, dtype=D, scale: float = 1.0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=gen, dtype=D) * scale).to(dtype)


def _reference(q, k, v, attn_mask=None, is_causal=False, scale=None, enable_gqa=False):
    """float64 attention with fusedops' semantics: GQA by repeating key / value heads, a boolean mask keeps True,
    a float one is added, is_causal is top-left aligned (with a mask too), fully masked rows give 0."""
    q, k, v = (t.to(D) for t in (q, k, v))
    if enable_gqa and q.dim() >= 3 and k.dim() >= 3 and k.size(-3) != q.size(-3):
        k, v = (t.repeat_interleave(q.size(-3) // t.size(-3), -3) for t in (k, v))
    scale = 1.0 / math.sqrt(q.size(-1)) if scale is None else float(scale)
    s = (q @ k.transpose(-1, -2)) * scale
    if attn_mask is not None:
        s = s.masked_fill(~attn_mask, -math.inf) if attn_mask.dtype == torch.bool else s + attn_mask.to(D)
    if is_causal:
        s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool).tril(), -math.inf)
    dead = (s == -math.inf).all(-1, keepdim=True)
    return torch.softmax(s.masked_fill(dead, 0.0), -1).masked_fill(dead, 0.0) @ v


def _values_and_grads(fn, tensors, needs, grad_seed: int = 99):
    leaves = [t.detach().clone().requires_grad_(need) for t, need in zip(tensors, needs)]
    out = fn(*leaves)
    wanted = [t for t in leaves if t.requires_grad]
    grad_out = _randn(out.shape, grad_seed, out.dtype)
    grads = torch.autograd.grad(out, wanted, grad_out) if wanted else ()
    return out.detach(), grads


def _assert_like_reference(q, k, v, needs=(True, True, True), dtype=D, tol=None, **kwargs):
    ours, ours_grads = _values_and_grads(lambda q, k, v: sdpa(q, k, v, **kwargs), (q, k, v), needs)
    ref, ref_grads = _values_and_grads(lambda q, k, v: _reference(q, k, v, **kwargs), (q, k, v), needs)
    assert ours.dtype == q.dtype and ours.shape == ref.shape
    assert_close(ours, ref, dtype)
    for got, want, t in zip(ours_grads, ref_grads, [t for t, need in zip((q, k, v), needs) if need]):
        assert got.dtype == t.dtype and got.shape == t.shape
        assert_close(got, want, dtype, tol=tol)


# ------------------------------------------------------------------------------------------------------------
# DEFECT 1: is_causal with a scale <= 0 on torch's route
# ------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("scale", [0.0, -0.0, -0.5, torch.tensor(-1.25, dtype=D)], ids=["0", "-0", "-0.5", "tensor"])
def test_defect1_causal_with_nonpositive_scale(route, scale):
    """Both routes give the softmax of the scaled, causally masked logits (torch's CPU flash kernel gave NaN)."""
    for shapes in (((1, 2, 3, 8), (1, 2, 5, 8), (1, 2, 5, 6)), ((2, 1, 6, 8), (2, 1, 4, 8), (2, 1, 4, 8))):
        q, k, v = (_randn(shape, seed) for seed, shape in enumerate(shapes))
        _assert_like_reference(q, k, v, is_causal=True, scale=scale)
    # float32 too, and a mask beside is_causal (which the fold keeps)
    q, k, v = _randn((1, 1, 4, 8), 5, torch.float32), _randn((1, 1, 6, 8), 6, torch.float32), \
        _randn((1, 1, 6, 8), 7, torch.float32)
    mask = torch.tensor([True, False, True, True, True, True])
    for kwargs in (dict(is_causal=True, scale=scale), dict(is_causal=True, scale=scale, attn_mask=mask)):
        got = sdpa(q, k, v, **kwargs)
        assert not got.isnan().any()
        assert_close(got, _reference(q, k, v, attn_mask=kwargs.get("attn_mask"), is_causal=True, scale=scale),
                     torch.float32)


def test_defect1_compiled_fallback_with_nonpositive_scale(fallback, reset_dynamo):
    """Under torch.compile the fallback route (fusedops.library's torch_attention) gives the same values."""
    q, k, v = _randn((1, 2, 3, 8), 1), _randn((1, 2, 5, 8), 2), _randn((1, 2, 5, 8), 3)
    compiled = torch.compile(lambda q, k, v: sdpa(q, k, v, is_causal=True, scale=-0.5), backend="aot_eager",
                             fullgraph=True)
    assert_close(compiled(q, k, v), _reference(q, k, v, is_causal=True, scale=-0.5), D)


# ------------------------------------------------------------------------------------------------------------
# DEFECT 2: enable_gqa with 2-D inputs
# ------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shapes", [
    ((2, 4, 3, 8), (5, 8), (5, 6)),          # 2-D key / value: one head, shared by the 4 query heads
    ((3, 8), (5, 8), (5, 6)),                # all 2-D: output 2-D
    ((2, 3, 8), (5, 8), (5, 6)),
    ((3, 8), (2, 1, 1, 5, 8), (2, 1, 1, 5, 6)),
], ids=["4d-2d", "2d-2d", "3d-2d", "2d-5d"])
def test_defect2_gqa_with_two_dim_inputs(route, shapes):
    """A 2-D input under enable_gqa has one head (what the kernel route took it as): values and gradients equal
    the broadcast attention without enable_gqa, on both routes (was IndexError naming no argument)."""
    q, k, v = (_randn(shape, seed) for seed, shape in enumerate(shapes))
    mask = _randn((shapes[0][-2], 5), 4) > -0.5
    for kwargs in (dict(), dict(is_causal=True), dict(attn_mask=mask)):
        ours, ours_grads = _values_and_grads(lambda q, k, v: sdpa(q, k, v, enable_gqa=True, **kwargs), (q, k, v),
                                             (True, True, True))
        ref, ref_grads = _values_and_grads(lambda q, k, v: _reference(q, k, v, **kwargs), (q, k, v),
                                           (True, True, True))
        assert ours.shape == ref.shape == F.scaled_dot_product_attention(q, k, v, **kwargs).shape
        assert_close(ours, ref, D)
        for got, want in zip(ours_grads, ref_grads):
            assert_close(got, want, D)


def test_defect2_gqa_head_counts_that_do_not_divide_still_raise(route):
    """A 2-D key (one head) beside a value of 3 heads under 4 query heads: torch's RuntimeError, not IndexError."""
    q, k, v = _randn((1, 4, 3, 8), 1), _randn((5, 8), 2), _randn((1, 3, 5, 8), 3)
    with pytest.raises(RuntimeError, match="Number of heads in key and value must divide"):
        sdpa(q, k, v, enable_gqa=True)
    with pytest.raises(RuntimeError, match="Number of heads in key and value must divide"):
        sdpa(q, _randn((1, 3, 5, 8), 4), v, enable_gqa=True)


# ------------------------------------------------------------------------------------------------------------
# Kept checks that were right
# ------------------------------------------------------------------------------------------------------------
def _bshd(shape, seed, dtype):
    """A (B, H, L, E) view of a (B, L, H, E) tensor (heads split from a packed projection)."""
    b, h, length, e = shape
    return _randn((b, length, h, e), seed, dtype).transpose(1, 2)


_SWEEP = [
    # dtype, (B, H, H_kv, L, S, E, Ev), causal, mask kind, layout, scale, needs
    (D, (2, 4, 2, 5, 17, 72, 40), True, "bool2d", "bshd", None, (True, False, True)),
    (D, (1, 3, 1, 17, 5, 112, 112), True, "float4d", "contiguous", 0.3, (False, True, False)),
    (D, (2, 2, 2, 1, 33, 40, 33), False, "padding", "expand", None, (True, True, True)),
    (D, (1, 2, 1, 9, 9, 24, 24), False, "dead_rows", "bshd", -0.5, (True, True, False)),
    (torch.float32, (1, 2, 2, 16, 3, 8, 5), True, None, "contiguous", 0.0, (True, True, True)),
    (torch.float16, (1, 4, 2, 17, 20, 16, 16), True, "float32_mask", "bshd", None, (True, True, True)),
    (torch.bfloat16, (1, 2, 2, 5, 18, 80, 80), False, "dead_rows", "contiguous", None, (False, True, True)),
]


@pytest.mark.parametrize("case", range(len(_SWEEP)))
def test_kernel_route_sweep_like_reference(interpret, case):
    """Non-power-of-two head dims, Ev != E, GQA, top-left causal with L != S beside masks, BSHD views and stride-0
    expands, gradients of a subset of q, k, v: the float64 reference within the dtype's tolerance."""
    dtype, (b, h, h_kv, length_q, length_k, e, ev), causal, mask_kind, layout, scale, needs = _SWEEP[case]
    if layout == "bshd":
        q, k, v = _bshd((b, h, length_q, e), 1, dtype), _bshd((b, h_kv, length_k, e), 2, dtype), \
            _bshd((b, h_kv, length_k, ev), 3, dtype)
    elif layout == "expand":
        q, k, v = (_randn((1, *shape), seed, dtype).expand(b, *shape) for seed, shape in
                   ((1, (h, length_q, e)), (2, (h_kv, length_k, e)), (3, (h_kv, length_k, ev))))
    else:
        q, k, v = _randn((b, h, length_q, e), 1, dtype), _randn((b, h_kv, length_k, e), 2, dtype), \
            _randn((b, h_kv, length_k, ev), 3, dtype)
    mask = None
    if mask_kind == "bool2d":
        mask = _randn((length_q, length_k), 4) > -0.7
    elif mask_kind == "float4d":
        mask = _randn((b, h, length_q, length_k), 4, dtype)
    elif mask_kind == "padding":
        mask = (torch.arange(length_k) < torch.tensor([[length_k], [length_k // 2]])).view(b, 1, 1, length_k)
    elif mask_kind == "dead_rows":
        mask = torch.zeros(length_q, length_k, dtype=dtype)
        mask[0] = -math.inf                   # a fully masked row: 0, finite gradients
        mask[1:, -1] = -math.inf
    elif mask_kind == "float32_mask":
        mask = _randn((1, h, 1, length_k), 4, torch.float32)
    _assert_like_reference(q, k, v, needs, dtype, attn_mask=mask, is_causal=causal, scale=scale,
                           enable_gqa=h != h_kv)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_online_rescaling_across_key_blocks(interpret, dtype):
    """Rows whose first key blocks are -inf or finfo.min, rows masked everywhere by -inf (0) or by finfo.min
    (uniform over the keys, as torch), with 70 keys (5 interpreter key blocks): values and gradients."""
    length_q, length_k = 5, 70
    q, k, v = (_randn((1, 2, n, 16), seed, dtype, scale) for seed, n, scale in
               ((1, length_q, 4.0), (2, length_k, 4.0), (3, length_k, 1.0)))
    mask = torch.zeros(length_q, length_k, dtype=D)
    mask[0, :40] = -math.inf
    mask[1, :40] = torch.finfo(dtype).min
    mask[2] = -math.inf
    mask[3] = torch.finfo(dtype).min
    mask[4, ::2] = -1e4
    # fp16 dq / dk: 2.3e-3 / 2.7e-3 norm-relative (torch's CPU kernel 1.0e-3 / 1.2e-3): P is rounded to fp16
    # before its dots (documented, as FlashAttention), at logits up to ~30 here
    _assert_like_reference(q, k, v, dtype=dtype, tol=4e-3 if dtype == torch.float16 else None,
                           attn_mask=mask.to(dtype))


_MHA_CASES = [
    # kwargs of the module, inputs, masks
    dict(module=dict(kdim=5, vdim=7, batch_first=True), length=(3, 4), kpm="float", mask="bool3d"),
    dict(module=dict(bias=False), length=(4, 4), kpm="bool", mask="float2d", self_attention=True),
    dict(module=dict(batch_first=True), length=(4, 4), kpm=None, mask="causal", is_causal=True, unbatched=True),
    dict(module=dict(dropout=0.5), length=(3, 5), kpm="bool", mask="float3d", train=False),
]


@pytest.mark.parametrize("case", range(len(_MHA_CASES)))
def test_mha_flash_path_like_torch(interpret, case):
    """fusedops.nn.MultiheadAttention(need_weights=False) against torch.nn.MultiheadAttention with the same
    state_dict (which loads both ways, strict): outputs and the gradients of inputs and parameters."""
    c = _MHA_CASES[case]
    embed, heads, batch = 8, 2, 2
    torch.manual_seed(case)
    ref = torch.nn.MultiheadAttention(embed, heads, dtype=D, **c["module"])
    ours = fnn.MultiheadAttention(embed, heads, dtype=D, **c["module"])
    ours.load_state_dict(ref.state_dict(), strict=True)
    ref.load_state_dict(ours.state_dict(), strict=True)
    assert list(ours.state_dict()) == list(ref.state_dict())
    for m in (ref, ours):
        m.train(c.get("train", True))
    length_q, length_k = c["length"]
    unbatched = c.get("unbatched", False)
    batch_first = c["module"].get("batch_first", False)

    def shaped(length, width, seed):
        shape = (length, width) if unbatched else (batch, length, width) if batch_first else (length, batch, width)
        return _randn(shape, seed)

    q = shaped(length_q, embed, 1)
    k = shaped(length_k, c["module"].get("kdim", embed), 2)
    v = shaped(length_k, c["module"].get("vdim", embed), 3)
    kpm = None
    if c["kpm"] is not None:
        kpm = _randn((length_k,) if unbatched else (batch, length_k), 4)
        kpm = kpm > 0.8 if c["kpm"] == "bool" else kpm
    mask = {"bool3d": lambda: _randn((batch * heads, length_q, length_k), 5) > 0.8,
            "float2d": lambda: _randn((length_q, length_k), 5),
            "float3d": lambda: _randn((batch * heads, length_q, length_k), 5),
            "causal": lambda: torch.triu(torch.full((length_q, length_k), -math.inf, dtype=D), 1)}[c["mask"]]()

    def run(module):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        if c.get("self_attention"):
            leaves = [leaves[0]] * 3
        out, weights = module(*leaves, key_padding_mask=kpm, need_weights=False, attn_mask=mask,
                              is_causal=c.get("is_causal", False))
        assert weights is None
        grads = torch.autograd.grad(out, [leaves[0], leaves[1], leaves[2], *module.parameters()],
                                    _randn(out.shape, 9), allow_unused=True)
        return out.detach(), grads

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")     # torch's mismatched-mask-types deprecation warning
        want, want_grads = run(ref)
        got, got_grads = run(ours)
    assert_close(got, want, D)
    for a, b in zip(got_grads, want_grads):
        assert (a is None) == (b is None)
        if a is not None:
            assert_close(a, b, D)


def test_softmax_implicit_dim_warning_points_at_the_caller(interpret):
    """nn.Softmax(dim=None) / nn.LogSoftmax(): torch's deprecation warning and legacy dim, attributed to the line
    that calls the module (torch.nn.Softmax's _stacklevel attributes it to torch's module.py)."""
    x = _randn((2, 3, 4), 1)
    for module, fn in ((fnn.Softmax(), torch.softmax), (fnn.LogSoftmax(), torch.log_softmax)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            y = module(x)
        assert len(caught) == 1 and "Implicit dimension choice" in str(caught[0].message)
        assert caught[0].filename == __file__
        assert_close(y, fn(x, 0), D)


def test_softmax_dtype_and_special_rows_like_torch(interpret):
    """A half input with dtype=float32 over a non-last dim of a transposed view, rows of -inf, +inf and NaN:
    torch's values (float64 reference), NaN pattern, dtype and the gradient's dtype."""
    x = _randn((5, 6), 1, torch.float16).t()        # (6, 5), transposed
    x[0, :] = -math.inf
    x[1, 2] = math.inf
    x[2, 3] = math.nan
    for fn, ref_fn in ((fusedops.softmax, torch.softmax), (fusedops.log_softmax, torch.log_softmax)):
        leaf = x.detach().clone().requires_grad_()
        y = fn(leaf, 0, dtype=torch.float32)
        want = ref_fn(x.to(D), 0)
        assert y.dtype == torch.float32 and y.is_contiguous()
        assert torch.equal(y.isnan(), ref_fn(x, 0, dtype=torch.float32).isnan())
        finite = want.isfinite()
        assert_close(y[finite], want[finite], torch.float32)
        (grad,) = torch.autograd.grad(y, leaf, _randn(y.shape, 2, torch.float32))
        assert grad.dtype == torch.float16 and grad.shape == x.shape
