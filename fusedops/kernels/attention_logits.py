"""The base-2 logits of the flash-attention kernels: q . k times the base-2 scale, held in range, with the
masks applied (attn_mask, causal, ragged keys), and which key blocks need no mask.

Shared by the forward kernel (attention_forward_kernels.py) and the backward kernels
(attention_backward_kernels.py); the numerics and the masks' rules: fusedops/kernels/attention.py's module
docstring.
"""

from __future__ import annotations

import fusedops.dsl as dsl

# attn_mask kinds (the MASK_KIND constexpr)
NO_MASK, BOOL_MASK, ADDITIVE_MASK = 0, 1, 2


@dsl.jit
def _held_in_range(s, source):
    # s: base-2 logits computed from `source` (a block of s's shape or one that broadcasts to it); where s
    # overflowed to +-inf but source is finite, the accumulation dtype's maximum / minimum instead
    highest = 1.7976931348623157e308 if s.dtype == dsl.float64 else 3.4028234663852886e38
    s = dsl.where((s == -float("inf")) & (source > -float("inf")), -highest, s)
    return dsl.where((s == float("inf")) & (source < float("inf")), highest, s)


@dsl.jit
def base2_logits(qk, qk_scale, IN_DTYPE: dsl.constexpr):
    # (q . k) * qk_scale for inputs of IN_DTYPE. float32 / float64 inputs can give q . k past finfo.max /
    # log2(e): held in range (as a mask's, `apply_masks`), not +-inf (NaN). 16-bit inputs cannot (|q . k|
    # <= E * 65504^2 in fp16; bfloat16 products past float32's range are inf in q . k itself, as in
    # torch): no instruction added to their kernels.
    s = qk * qk_scale
    if IN_DTYPE == dsl.float32 or IN_DTYPE == dsl.float64:
        s = _held_in_range(s, qk)
    return s


@dsl.jit
def apply_masks(s, qi, kj, L, S, mask_ptr, stride_mm, stride_mn,
                MASK_KIND: dsl.constexpr, CAUSAL: dsl.constexpr, CHECK_KEYS: dsl.constexpr):
    # s: base-2 logits block; qi / kj: query / key index blocks that broadcast to s's shape (either
    # orientation: s or s^T). mask_ptr is already offset to this (batch, head). With MASK_KIND = 0 and
    # CAUSAL, CHECK_KEYS False this is the identity and compiles to nothing (an interior block).
    if MASK_KIND == 1:
        keep = dsl.load(mask_ptr + qi.to(dsl.int64) * stride_mm + kj.to(dsl.int64) * stride_mn,
                        mask=(qi < L) & (kj < S), other=0)
        s = dsl.where(keep != 0, s, -float("inf"))
    elif MASK_KIND == 2:
        bias = dsl.load(mask_ptr + qi.to(dsl.int64) * stride_mm + kj.to(dsl.int64) * stride_mn,
                        mask=(qi < L) & (kj < S), other=0.0).to(s.dtype)
        # a finite mask whose base-2 logit overflows (torch.finfo(float32).min * log2(e)) is held at the
        # accumulation dtype's minimum (maximum: finfo.max), where torch's sum stays; a -inf mask keeps the
        # key out (a +inf one gives NaN, as in torch)
        s = _held_in_range(s + bias * 1.4426950408889634, bias)
    if CAUSAL:
        s = dsl.where(kj <= qi, s, -float("inf"))
    if CHECK_KEYS:
        s = dsl.where(kj < S, s, -float("inf"))
    return s


@dsl.jit
def unmasked_key_end(pid_m, S, BLOCK_M: dsl.constexpr, BLOCK_N: dsl.constexpr, MASK_KIND: dsl.constexpr,
                     CAUSAL: dsl.constexpr):
    """Key blocks starting below this index need no mask for query block pid_m: they lie entirely
    inside S and (causal) entirely at or below the diagonal of the block's first query row
    (start_n + BLOCK_N - 1 <= pid_m * BLOCK_M); with an attn_mask every block is masked."""
    end = 0
    if MASK_KIND == 0:
        end = S // BLOCK_N * BLOCK_N
        if CAUSAL:
            end = dsl.minimum(end, (pid_m * BLOCK_M + 1) // BLOCK_N * BLOCK_N)
    return end
