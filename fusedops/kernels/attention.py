"""Flash attention (FlashAttention-2, Dao 2023, arXiv:2307.08691): the DSL kernels for the forward
pass and the backward pass, and their launchers.

    q: (B, H, L, E)    k: (B, H_kv, S, E)    v: (B, H_kv, S, Ev)    o: (B, H, L, Ev)
    lse: (B, H, 2, L) float32     mask (optional): broadcastable to (B, H, L, S)

Every tensor is read with its own strides (int64 offsets), so transposed, sliced and expanded
(stride 0) views are read in place. H is a multiple of H_kv: query head h reads key/value head
h // (H // H_kv) (grouped-query attention; H_kv = H is plain multi-head attention).

Numerics. Logits are computed in the base-2 domain: s2 = (q . k) * qk_scale with
qk_scale = scale * log2(e), so that softmax(scale * q k^T) = exp2(s2 - max) / sum(...) uses the
`ex2` instruction directly (an additive float mask is multiplied by log2(e) too), flushing subnormal
results (`dsl.exp2(..., ftz=True)`: `ex2.approx.ftz.f32`, as FlashAttention's fast-math exp2f): a weight
below 2^-126 beside the row maximum's weight of 1 becomes 0, 2^-126 of the row sum at most, and ptxas
drops ex2's subnormal fix-up (a compare and two multiplies per element: 13% of the dK/dV kernel's and 19% of
the dQ kernel's instructions at E = 128; session 34, H200, x torch's flash, fp16, S = 2k / 16k, forward
1.01-1.35 -> 1.12-1.49, backward 0.99-1.10 -> 1.07-1.24). The running
maximum m_i and sum l_i are kept in float32 (float64 for float64 inputs in the interpreter); P is
cast to the input dtype before the P @ V tensor-core dot, as FlashAttention does. The backward
recomputes P from logits it rounds afresh (the dK/dV kernel in the transposed dot K Q^T): with float32
inputs (the interpreter's; CUDA runs torch's op) and logits in the thousands, the recomputed rows of P
are off from summing to 1 by ~ulp(|s2|) (3e-4 at |logits| ~ 1.5e3) and dV inherits it (8-16x torch's
error there; tests/test_review_session16_numerics.py, a strict xfail). 16-bit inputs round P to 16
bits first, which hides it.
The scales are passed as float32 pairs (hi, lo) summed in the kernel's accumulation dtype: float
kernel arguments are float32, and the float64 interpreter runs (gradcheck) need more precision.

Saved statistics. `lse[b, h, 0, i] + lse[b, h, 1, i] = m_i + log2(l_i)` is the log-sum-exp of row i
*in base 2* (log2(sum_j exp2(s2_ij))), as an unevaluated sum: lse[.., 0, i] is m_i + log2(l_i) rounded
to float32 and lse[.., 1, i] its rounding error (Knuth's TwoSum), so that a row of huge logits (m_i =
-3.4e38 under a finfo.min mask) keeps its log2(l_i). The natural-log LSE is lse[.., 0, :] * ln(2). The
backward pass recomputes P = exp2((s2 - lse[.., 0, i]) - lse[.., 1, i]) from it; without an additive
mask the logits stay far from float32's range, lo is below hi's last bit's weight in P, and the backward
reads hi alone, P = exp2(s2 - lse[.., 0, i]).

Masks.
  - causal: top-left aligned, as torch's `is_causal` (torch.ones(L, S).tril()): query i sees keys
    j <= i, also when L != S. Key blocks entirely past the diagonal are skipped.
  - attn_mask: boolean (True = keep) or additive float, loaded block by block with its broadcast
    strides (0 for broadcast dims). Causal and attn_mask may be combined (logical and).
    Additive masks of huge finite values (torch.finfo(dtype).min, Hugging Face's convention) work as in
    torch: a logit whose base-2 value overflows is held at the accumulation dtype's minimum (a -inf mask
    value keeps its key out; likewise a finfo.max mask or, with float32 / float64 inputs, a q . k past
    finfo.max / log2(e) is held at the maximum: that key takes the row's weight, as in torch, where two
    such keys share it here), so a row masked everywhere by finfo.min attends to all its keys equally,
    as torch's finfo.min + q.k (which rounds to finfo.min) does; the lse pair below keeps that row's
    log2(l). (So finite logits below finfo(float32).min / log2(e) = -2.36e38 all weigh the same, where
    torch still orders them: a row of -2.5e38 and finfo.min attends to the -2.5e38 keys alone in torch,
    to all of them here.)
  - ragged edges: keys >= S get -inf; rows >= L and head-dim columns >= E are masked loads/stores,
    so any L, S, E <= 256 work (E is padded to the next power of two, BLOCK_E).
  - fully masked rows (every key masked by attn_mask): the output row is 0 (torch's behaviour) and
    lse = (+inf, 0), which makes the recomputed P of that row 0, so its gradients are 0 and finite.

Backward. Three kernels:
  1. `attention_backward_preprocess_kernel`: delta_i = rowsum(dO * O) (float32).
  2. `attention_backward_dkdv_kernel`: one program per (key block, batch, kv head); loops over the
     query heads of its group and over the query blocks, recomputing P^T from K, Q and lse:
     dV += P^T dO, dP^T = V dO^T, dS^T = P^T * (dP^T - delta), dK += dS^T Q.
  3. `attention_backward_dq_kernel`: one program per (query block, batch, head); loops over the key
     blocks: dQ += dS K.
  (dK and dQ are multiplied by `scale` at the end; ds is the gradient of the natural-log logits.)
  Deterministic: dK/dV of a key/value head are summed over the query heads of its group inside one
  program, and dQ over the key blocks inside one program. Where ATOMIC_DKDV_CONFIGS has an entry (head
  dims <= 64), without an attn_mask and unless torch.use_deterministic_algorithms(True) is in force,
  kernel 2 also adds each step's dQ[rows] += dS K into a zeroed float32 buffer with atomic reductions
  (FlashAttention-2's default), whose order differs run to run (the result by float32 rounding, ~1e-7
  relative), and `attention_backward_dq_convert_kernel` scales it into dQ instead of kernel 3.

Grids put batch * heads on axis 0 (up to 2**31 - 1 programs) and the query (or key) blocks on axis
1 (at most 65535, i.e. sequences up to 65535 * BLOCK_M). The E = 64 dK/dV kernel maps its programs head by
head in launch order instead (`_head_major_program`), so that the programs running at once share one
head's Q / dO in L2, and so does the dQ kernel of a batch of many heads, sharing K / V (`backward_configs`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Callable, Optional

import torch

import fusedops.dsl as dsl
from fusedops.dsl.language.dtypes import to_torch
from fusedops.dsl.runtime.bounded_cache import BoundedCache
from fusedops.dsl.runtime.knobs import interpret_enabled as _interpret_enabled
from fusedops.kernels.allocation import contiguous_allocator, ordered_allocator, stride_order
from fusedops.kernels.device_info import max_shared_memory, sm_count, wgmma_target

LOG2E = 1.4426950408889634
MAX_HEAD_DIM = 256
MAX_GRID_Y = 65535

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
def _base2_logits(qk, qk_scale, IN_DTYPE: dsl.constexpr):
    # (q . k) * qk_scale for inputs of IN_DTYPE. float32 / float64 inputs can give q . k past finfo.max /
    # log2(e): held in range (as a mask's, `_apply_masks`), not +-inf (NaN). 16-bit inputs cannot (|q . k|
    # <= E * 65504^2 in fp16; bfloat16 products past float32's range are inf in q . k itself, as in
    # torch): no instruction added to their kernels.
    s = qk * qk_scale
    if IN_DTYPE == dsl.float32 or IN_DTYPE == dsl.float64:
        s = _held_in_range(s, qk)
    return s


@dsl.jit
def _apply_masks(s, qi, kj, L, S, mask_ptr, stride_mm, stride_mn,
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
def _head_major_program():
    """(batch * heads index, block index) of a program on a grid (batch * heads, blocks), taking the
    programs in launch order (axis 0 fastest) head by head: the programs running at once share their
    head's Q / dO stream in L2, instead of each reading another head's (the dK/dV kernel's HEAD_MAJOR)."""
    blocks = dsl.num_programs(1)
    launched = dsl.program_id(1).to(dsl.int64) * dsl.num_programs(0) + dsl.program_id(0)
    return (launched // blocks).to(dsl.int32), (launched % blocks).to(dsl.int32)


@dsl.jit
def _query_program(H, GROUP, HEAD_MAJOR: dsl.constexpr):
    """(batch * heads index, batch, head, kv head, query block) of a program on the grid
    (B * H, cdiv(L, BLOCK_M)); batch and heads as int64 offsets. The last query blocks have the most keys
    under a causal mask: they run first (HEAD_MAJOR: the blocks of a head one after the other in launch
    order, `_head_major_program`, the last first; else every head's last block first)."""
    if HEAD_MAJOR:
        bh, block = _head_major_program()
    else:
        bh = dsl.program_id(0)
        block = dsl.program_id(1)
    pid_m = dsl.num_programs(1) - 1 - block
    b = (bh // H).to(dsl.int64)
    h = bh % H
    kvh = (h // GROUP).to(dsl.int64)
    return bh, b, h.to(dsl.int64), kvh, pid_m


@dsl.jit
def _unmasked_key_end(pid_m, S, BLOCK_M: dsl.constexpr, BLOCK_N: dsl.constexpr, MASK_KIND: dsl.constexpr,
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


@dsl.jit
def _online_softmax(s, m_i, l_i, rm, rn, L, S, mask_base, stride_mm, stride_mn, qk_scale,
                    IN_DTYPE: dsl.constexpr, MASK_KIND: dsl.constexpr, CAUSAL: dsl.constexpr, MASKED: dsl.constexpr):
    """(P, alpha, m_new, l_new) of the key block whose q . k are `s` (the rows' running max m_i and sum l_i
    before it): P = exp2(s2 - m_new) of the base-2 logits s2, alpha = exp2(m_i - m_new) the factor of the
    earlier blocks. MASKED = False (an interior block, see `_unmasked_key_end`): no mask is computed."""
    s = _base2_logits(s, qk_scale, IN_DTYPE)
    if MASKED:
        s = _apply_masks(s, rm[:, None], rn[None, :], L, S, mask_base, stride_mm, stride_mn,
                         MASK_KIND, CAUSAL, True)
    m_new = dsl.maximum(m_i, dsl.max(s, axis=1))
    m_safe = m_new
    if MASKED:
        # a row with every key so far masked has m_new = -inf: subtract 0 instead (p = 0, no NaN)
        m_safe = dsl.where(m_new == -float("inf"), 0.0, m_new)
    p = dsl.exp2(s - m_safe[:, None], ftz=True)
    alpha = dsl.exp2(m_i - m_safe, ftz=True)
    return p, alpha, m_new, l_i * alpha + dsl.sum(p, axis=1)


@dsl.jit
def _forward_step(acc, p, m_i, l_i, q, k_base, v_base, mask_base, start_n, rm, rn0, re, rev,
                  L, S, E, EV, stride_kn, stride_vn, stride_mm, stride_mn, qk_scale,
                  BLOCK_M: dsl.constexpr, BLOCK_N: dsl.constexpr, ACC: dsl.constexpr,
                  MASK_KIND: dsl.constexpr, CAUSAL: dsl.constexpr, MASKED: dsl.constexpr):
    """One key block of the online softmax, software-pipelined by one block: S = Q K^T of the block at
    start_n is issued, then acc += P V of the previous block (P: its probabilities, 16-bit), and the
    softmax of this block runs while both dots are in flight (on sm_90a: passes/wgmma_waits.py; the
    FlashAttention-3 paper's intra-warpgroup overlap, arXiv:2407.08608, section 3.2). Returns
    (acc rescaled to this block's row max, this block's P, m_new, l_new). MASKED = False: an interior
    block, whose key loads drop `rn < S`."""
    rn = start_n + rn0
    kt = dsl.load(k_base + rn.to(dsl.int64)[None, :] * stride_kn, mask=(re[:, None] < E) & (rn[None, :] < S),
                  other=0.0)
    s = dsl.dot(q, kt, dsl.zeros((BLOCK_M, BLOCK_N), ACC))
    acc = _accumulate_values(acc, p, v_base, start_n - BLOCK_N, rn0, rev, S, EV, stride_vn)
    p, alpha, m_i, l_i = _online_softmax(s, m_i, l_i, rm, rn, L, S, mask_base, stride_mm, stride_mn, qk_scale,
                                         k_base.dtype.element, MASK_KIND, CAUSAL, MASKED)
    return acc * alpha[:, None], p.to(v_base.dtype.element), m_i, l_i


@dsl.jit
def _accumulate_values(acc, p, v_base, start_n, rn0, rev, S, EV, stride_vn):
    """acc + P V over the key block at start_n (P: its 16-bit probabilities)."""
    rn = start_n + rn0
    v = dsl.load(v_base + rn.to(dsl.int64)[:, None] * stride_vn, mask=(rn[:, None] < S) & (rev[None, :] < EV),
                 other=0.0)
    return dsl.dot(p, v, acc)


@dsl.jit
def attention_forward_kernel(
        o_ptr, lse_ptr, q_ptr, k_ptr, v_ptr, mask_ptr,
        stride_qb, stride_qh, stride_qm, stride_qe,
        stride_kb, stride_kh, stride_kn, stride_ke,
        stride_vb, stride_vh, stride_vn, stride_ve,
        stride_ob, stride_oh, stride_om, stride_oe,
        stride_mb, stride_mh, stride_mm, stride_mn,
        H, GROUP, L, S, E, EV, qk_scale_hi, qk_scale_lo,
        BLOCK_M: dsl.constexpr, BLOCK_N: dsl.constexpr, BLOCK_E: dsl.constexpr, BLOCK_EV: dsl.constexpr,
        CAUSAL: dsl.constexpr, MASK_KIND: dsl.constexpr, ACC: dsl.constexpr, HEAD_MAJOR: dsl.constexpr = False,
        MIN_BLOCKS: dsl.constexpr = 0):
    # o_ptr: (B, H, L, EV); lse_ptr: (B * H, 2, L) contiguous ACC; q_ptr: (B, H, L, E);
    # k_ptr: (B, H // GROUP, S, E); v_ptr: (B, H // GROUP, S, EV); mask_ptr: (B, H, L, S) strides
    # (0 on broadcast dims) or unused. Grid: (B * H, cdiv(L, BLOCK_M)).
    # Key blocks: the first one (masked) is peeled so that the running statistics enter the loops in
    # the layout of the logits' row reductions (a loop carries its initial value's layout); then the
    # interior blocks without any mask; then the ragged / diagonal tail blocks with the masks.
    # MIN_BLOCKS > 0: dsl.launch_bounds (registers capped for that many CTAs per SM).
    if MIN_BLOCKS > 0:
        dsl.launch_bounds(MIN_BLOCKS)
    qk_scale = qk_scale_hi.to(ACC) + qk_scale_lo.to(ACC)
    bh, b, h, kvh, pid_m = _query_program(H, GROUP, HEAD_MAJOR)

    rm = pid_m * BLOCK_M + dsl.arange(0, BLOCK_M)
    rn0 = dsl.arange(0, BLOCK_N)
    re = dsl.arange(0, BLOCK_E)
    rev = dsl.arange(0, BLOCK_EV)
    q = dsl.load(q_ptr + b * stride_qb + h * stride_qh + rm.to(dsl.int64)[:, None] * stride_qm
                 + re.to(dsl.int64)[None, :] * stride_qe,
                 mask=(rm[:, None] < L) & (re[None, :] < E), other=0.0)
    k_base = k_ptr + b * stride_kb + kvh * stride_kh + re.to(dsl.int64)[:, None] * stride_ke
    v_base = v_ptr + b * stride_vb + kvh * stride_vh + rev.to(dsl.int64)[None, :] * stride_ve
    mask_base = mask_ptr + b * stride_mb + h * stride_mh

    end_n = S
    if CAUSAL:
        end_n = dsl.minimum(S, (pid_m + 1) * BLOCK_M)      # keys past the diagonal: skipped
    kt = dsl.load(k_base + rn0.to(dsl.int64)[None, :] * stride_kn, mask=(re[:, None] < E) & (rn0[None, :] < S),
                  other=0.0)
    p, alpha, m_i, l_i = _online_softmax(
        dsl.dot(q, kt, dsl.zeros((BLOCK_M, BLOCK_N), ACC)), dsl.full((BLOCK_M,), -float("inf"), ACC),
        dsl.zeros((BLOCK_M,), ACC), rm, rn0, L, S, mask_base, stride_mm, stride_mn, qk_scale, k_ptr.dtype.element,
        MASK_KIND, CAUSAL, True)
    p = p.to(v_ptr.dtype.element)
    acc = dsl.zeros((BLOCK_M, BLOCK_EV), ACC)
    unmasked_end = _unmasked_key_end(pid_m, S, BLOCK_M, BLOCK_N, MASK_KIND, CAUSAL)
    for start_n in range(BLOCK_N, unmasked_end, BLOCK_N):
        acc, p, m_i, l_i = _forward_step(
            acc, p, m_i, l_i, q, k_base, v_base, mask_base, start_n, rm, rn0, re, rev, L, S, E, EV, stride_kn,
            stride_vn, stride_mm, stride_mn, qk_scale, BLOCK_M, BLOCK_N, ACC, MASK_KIND, CAUSAL, False)
    for start_n in range(dsl.maximum(BLOCK_N, unmasked_end), end_n, BLOCK_N):
        acc, p, m_i, l_i = _forward_step(
            acc, p, m_i, l_i, q, k_base, v_base, mask_base, start_n, rm, rn0, re, rev, L, S, E, EV, stride_kn,
            stride_vn, stride_mm, stride_mn, qk_scale, BLOCK_M, BLOCK_N, ACC, MASK_KIND, CAUSAL, True)
    # the last key block's P V (the loops add each block's one block later)
    last_n = dsl.maximum(dsl.cdiv(end_n, BLOCK_N) - 1, 0) * BLOCK_N
    acc = _accumulate_values(acc, p, v_base, last_n, rn0, rev, S, EV, stride_vn)

    empty = l_i == 0.0                                       # fully masked row (or S = 0)
    acc = acc * (1.0 / dsl.where(empty, 1.0, l_i))[:, None]     # one division per row, not per element
    # lse as the unevaluated sum hi + lo of m_i and log2(l_i) (TwoSum, Knuth TAOCP vol. 2, 4.2.2)
    log_l = dsl.log2(dsl.where(empty, 1.0, l_i))
    hi = m_i + log_l
    rounded = hi - m_i
    lo = (m_i - (hi - rounded)) + (log_l - rounded)
    lse_row = lse_ptr + bh.to(dsl.int64) * (2 * L) + rm
    dsl.store(lse_row, dsl.where(empty, float("inf"), hi), mask=rm < L)
    dsl.store(lse_row + L, dsl.where(empty, 0.0, lo), mask=rm < L)
    o = (o_ptr + b * stride_ob + h * stride_oh + rm.to(dsl.int64)[:, None] * stride_om
         + rev.to(dsl.int64)[None, :] * stride_oe)
    dsl.store(o, acc.to(o_ptr.dtype.element), mask=(rm[:, None] < L) & (rev[None, :] < EV))


@dsl.jit
def _row_tile(H, L, COLS, BLOCK_M: dsl.constexpr, BLOCK_C: dsl.constexpr):
    """(bh, b, h, rows, cols, mask) of a program on the grid (B * H, cdiv(L, BLOCK_M)) over the (L, COLS) rows
    of head bh = b * H + h (b and h as int64 offsets), its block of BLOCK_M rows and BLOCK_C columns and
    their bounds mask."""
    bh = dsl.program_id(0)
    b = (bh // H).to(dsl.int64)
    h = (bh % H).to(dsl.int64)
    rm = dsl.program_id(1) * BLOCK_M + dsl.arange(0, BLOCK_M)
    rc = dsl.arange(0, BLOCK_C)
    return bh, b, h, rm, rc, (rm[:, None] < L) & (rc[None, :] < COLS)


@dsl.jit
def attention_backward_preprocess_kernel(
        delta_ptr, o_ptr, do_ptr,
        stride_ob, stride_oh, stride_om, stride_oe,
        stride_dob, stride_doh, stride_dom, stride_doe,
        H, L, EV, BLOCK_M: dsl.constexpr, BLOCK_EV: dsl.constexpr, ACC: dsl.constexpr):
    # delta_ptr: (B * H, L) contiguous ACC; o_ptr, do_ptr: (B, H, L, EV). Grid: (B * H, cdiv(L, BLOCK_M)).
    bh, b, h, rm, rev, mask = _row_tile(H, L, EV, BLOCK_M, BLOCK_EV)
    rows = rm.to(dsl.int64)[:, None]
    o = dsl.load(o_ptr + b * stride_ob + h * stride_oh + rows * stride_om + rev.to(dsl.int64)[None, :] * stride_oe,
                 mask=mask, other=0.0)
    do = dsl.load(do_ptr + b * stride_dob + h * stride_doh + rows * stride_dom
                  + rev.to(dsl.int64)[None, :] * stride_doe,
                  mask=mask, other=0.0)
    delta = dsl.sum(o.to(ACC) * do.to(ACC), axis=1)
    dsl.store(delta_ptr + bh.to(dsl.int64) * L + rm, delta, mask=rm < L)


@dsl.jit
def _dkdv_step(dk, dv, k, v, qt_base, q_base, do_base, dot_base, mask_base, lse_row, delta_row, m0, rm0, rn, re,
               rev, L, S, E, EV, stride_qm, stride_dom, stride_mm, stride_mn, qk_scale, k_tile, dq_base,
               BLOCK_M: dsl.constexpr, BLOCK_N: dsl.constexpr, BLOCK_E: dsl.constexpr, ACC: dsl.constexpr,
               MASK_KIND: dsl.constexpr, CAUSAL: dsl.constexpr, KV_RING: dsl.constexpr, EARLY_DP: dsl.constexpr,
               DQ_ATOMIC: dsl.constexpr):
    """dK, dV += the contributions of the query block at m0 (P^T recomputed from lse). EARLY_DP: dP^T = V dO^T
    is issued right after S^T (head dims <= 128, where sm_90a runs the dots on wgmma, without attn_mask: with
    both logit tiles live at once the mma.sync tiles of E = 256 spill 44 bytes, the masked E = 64 tiles 4).
    KV_RING: k and v are the pointer blocks of the program's K and V tiles, loaded here, each use by its dot
    alone, so that on sm_90a they come through the cp.async ring (L2 hits after the first block) and the dots
    read them from shared memory (no register A fragments beside the dk and dv accumulators). Rows past L
    need no mask on the logits: their lse loads as +inf (P = 0) and their dO as 0. Without attn_mask
    the causal mask (CAUSAL) is a `where` on the blocks of the kernel's first query-block loop, those that
    cross the diagonal; a second loop takes the rest without it (CAUSAL False) rather than a branch in one
    loop on whether the block crosses it: on the H200 that branch inside the pipelined wgmma loop gave
    wrong dK/dV (E = 64, L = 1000, causal; the cause in the compiler is not found yet). Session 33 (H200,
    .scratch/s33/bwd_probe2.py, interleaved, whole backward x flash, causal, the mask on every block ->
    two loops): E = 64 S = 2k / 4k / 16k 1.007 / 0.959 / 0.915 -> 1.060 / 1.039 / 1.018, E = 128 S = 4k / 16k
    1.03 / 0.93 -> 1.05 / 0.96 (the E = 64 dQ-adding kernel spills 144 bytes, 3 accesses inside the
    first loop, none in the second; E = 128: 40 bytes, none inside the loops).
    Q and dO are each loaded in both orientations (Q^T and Q, dO and dO^T) rather than loaded once
    and `trans`-ed: each load then has the dot as its only use, so on sm_90a every one goes through
    the cp.async ring straight into the wgmma tile its dot reads (the second copy hits L2), and the
    four dots take A from registers (K, V before the loop; P^T and dS^T from the accumulators)."""
    rm = m0 + rm0
    rows_ok = rm < L
    if KV_RING:
        k = dsl.load(k, mask=(rn[:, None] < S) & (re[None, :] < E), other=0.0)
        v = dsl.load(v, mask=(rn[:, None] < S) & (rev[None, :] < EV), other=0.0)
    qt = dsl.load(qt_base + rm.to(dsl.int64)[None, :] * stride_qm, mask=(re[:, None] < E) & rows_ok[None, :],
                  other=0.0)
    st = dsl.dot(k, qt, dsl.zeros((BLOCK_N, BLOCK_M), ACC))
    if EARLY_DP:
        # dP^T issued right after S^T: on sm_90a both wgmmas run while P^T is computed (passes/wgmma_waits.py)
        dpt = _transposed_dp(v, dot_base, rm, rows_ok, rev, EV, stride_dom, BLOCK_N, BLOCK_M, ACC)
    st = _base2_logits(st, qk_scale, qt_base.dtype.element)
    if MASK_KIND != 0:
        st = _apply_masks(st, rm[None, :], rn[:, None], L, S, mask_base, stride_mm, stride_mn, MASK_KIND, CAUSAL, False)
    elif CAUSAL:
        st = dsl.where(rn[:, None] <= rm[None, :], st, -float("inf"))
    # rows past L (and fully masked rows) have lse = (+inf, 0): their P is 0
    lse_hi = dsl.load(lse_row + rm, mask=rows_ok, other=float("inf"))
    if MASK_KIND == 2:      # (only additive masks make logits so large that lo matters)
        pt = dsl.exp2((st - lse_hi[None, :]) - dsl.load(lse_row + L + rm, mask=rows_ok, other=0.0)[None, :], ftz=True)
    else:
        pt = dsl.exp2(st - lse_hi[None, :], ftz=True)
    do = dsl.load(do_base + rm.to(dsl.int64)[:, None] * stride_dom, mask=rows_ok[:, None] & (rev[None, :] < EV),
                  other=0.0)
    dv = dsl.dot(pt.to(do_base.dtype.element), do, dv)
    if not EARLY_DP:
        dpt = _transposed_dp(v, dot_base, rm, rows_ok, rev, EV, stride_dom, BLOCK_N, BLOCK_M, ACC)
    delta = dsl.load(delta_row + rm, mask=rows_ok, other=0.0)
    dst = pt * (dpt - delta[None, :])
    if DQ_ATOMIC:
        # dQ[rows] += dS K, issued before dK's dot so that both run while the reductions wait for dQ's
        kb = dsl.load(k_tile, mask=(rn[:, None] < S) & (re[None, :] < E), other=0.0)
        dq = dsl.dot(dsl.trans(dst.to(qt_base.dtype.element)), kb, dsl.zeros((BLOCK_M, BLOCK_E), ACC))
    q = dsl.load(q_base + rm.to(dsl.int64)[:, None] * stride_qm, mask=rows_ok[:, None] & (re[None, :] < E), other=0.0)
    dk = dsl.dot(dst.to(qt_base.dtype.element), q, dk)
    if DQ_ATOMIC:
        # into the float32 sums at dq_base (rows padded to BLOCK_M, columns to BLOCK_E: no mask)
        dsl.atomic_add(dq_base + m0 * BLOCK_E, dq, sem="relaxed")
    return dk, dv


@dsl.jit
def _transposed_dp(v, dot_base, rm, rows_ok, rev, EV, stride_dom, BLOCK_N: dsl.constexpr, BLOCK_M: dsl.constexpr,
                   ACC: dsl.constexpr):
    """dP^T = V dO^T of the query rows rm (dot_base: dO^T's pointers at row 0)."""
    dot = dsl.load(dot_base + rm.to(dsl.int64)[None, :] * stride_dom, mask=(rev[:, None] < EV) & rows_ok[None, :],
                   other=0.0)
    return dsl.dot(v, dot, dsl.zeros((BLOCK_N, BLOCK_M), ACC))


@dsl.jit
def attention_backward_dkdv_kernel(
        dk_ptr, dv_ptr, q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, mask_ptr,
        stride_qb, stride_qh, stride_qm, stride_qe,
        stride_kb, stride_kh, stride_kn, stride_ke,
        stride_vb, stride_vh, stride_vn, stride_ve,
        stride_dob, stride_doh, stride_dom, stride_doe,
        stride_dkb, stride_dkh, stride_dkn, stride_dke,
        stride_dvb, stride_dvh, stride_dvn, stride_dve,
        stride_mb, stride_mh, stride_mm, stride_mn,
        H_KV, GROUP, L, S, E, EV, qk_scale_hi, qk_scale_lo, scale_hi, scale_lo,
        BLOCK_M: dsl.constexpr, BLOCK_N: dsl.constexpr, BLOCK_E: dsl.constexpr, BLOCK_EV: dsl.constexpr,
        CAUSAL: dsl.constexpr, MASK_KIND: dsl.constexpr, ACC: dsl.constexpr, KV_RING: dsl.constexpr = False,
        EARLY_DP: dsl.constexpr = True, HEAD_MAJOR: dsl.constexpr = False, DQ_ATOMIC: dsl.constexpr = False,
        dq_ptr=None):
    # dk_ptr, k_ptr: (B, H_KV, S, E); dv_ptr, v_ptr: (B, H_KV, S, EV); q_ptr: (B, H, L, E);
    # DQ_ATOMIC: dq_ptr is a zeroed ACC (B * H, cdiv(L, BLOCK_M) * BLOCK_M, BLOCK_E) buffer to which every
    # query block's step adds its dS K (unscaled); else dq_ptr is not read (None);
    # do_ptr: (B, H, L, EV); lse_ptr: (B * H, 2, L), delta_ptr: (B * H, L) contiguous ACC. H = H_KV * GROUP.
    # Grid: (B * H_KV, cdiv(S, BLOCK_N)). The program sums the contributions of the GROUP query heads.
    # KV_RING: K and V are loaded in every query block's step instead of once; EARLY_DP: dP^T issued right
    # after S^T where that assembles without spills (_dkdv_step); HEAD_MAJOR: programs taken head by head in
    # launch order (_head_major_program).
    # Query blocks: without causal or attn_mask no block needs a mask; under a causal mask the loops
    # start at the first block that reaches the diagonal, and (without attn_mask) the blocks that cross it
    # take the mask in a first loop, the rest none in a second.
    qk_scale = qk_scale_hi.to(ACC) + qk_scale_lo.to(ACC)
    if HEAD_MAJOR:
        bhk, pid_n = _head_major_program()
    else:
        bhk = dsl.program_id(0)
        pid_n = dsl.program_id(1)
    b = (bhk // H_KV).to(dsl.int64)
    kvh = bhk % H_KV
    rn = pid_n * BLOCK_N + dsl.arange(0, BLOCK_N)
    rm0 = dsl.arange(0, BLOCK_M)
    re = dsl.arange(0, BLOCK_E)
    rev = dsl.arange(0, BLOCK_EV)
    rows_n = rn.to(dsl.int64)[:, None]
    k_tile = (k_ptr + b * stride_kb + kvh.to(dsl.int64) * stride_kh + rows_n * stride_kn
              + re.to(dsl.int64)[None, :] * stride_ke)
    k = k_tile
    v = (v_ptr + b * stride_vb + kvh.to(dsl.int64) * stride_vh + rows_n * stride_vn
         + rev.to(dsl.int64)[None, :] * stride_ve)
    if not KV_RING:
        k = dsl.load(k, mask=(rn[:, None] < S) & (re[None, :] < E), other=0.0)
        v = dsl.load(v, mask=(rn[:, None] < S) & (rev[None, :] < EV), other=0.0)
    dk = dsl.zeros((BLOCK_N, BLOCK_E), ACC)
    dv = dsl.zeros((BLOCK_N, BLOCK_EV), ACC)
    start_m = 0
    if CAUSAL:
        start_m = (pid_n * BLOCK_N) // BLOCK_M * BLOCK_M    # earlier queries see none of these keys
    for g in range(0, GROUP):
        h = (kvh * GROUP + g).to(dsl.int64)
        bh = b * (H_KV * GROUP) + h
        q_head = q_ptr + b * stride_qb + h * stride_qh
        do_head = do_ptr + b * stride_dob + h * stride_doh
        qt_base = q_head + re.to(dsl.int64)[:, None] * stride_qe
        q_base = q_head + re.to(dsl.int64)[None, :] * stride_qe
        do_base = do_head + rev.to(dsl.int64)[None, :] * stride_doe
        dot_base = do_head + rev.to(dsl.int64)[:, None] * stride_doe
        mask_base = mask_ptr + b * stride_mb + h * stride_mh
        dq_base = dq_ptr
        if DQ_ATOMIC:
            dq_base = dq_ptr + bh * (dsl.cdiv(L, BLOCK_M) * BLOCK_M * BLOCK_E) + rm0.to(dsl.int64)[:, None] * BLOCK_E \
                + re[None, :]
        early_dp = EARLY_DP and MASK_KIND == 0 and BLOCK_E <= 128 and BLOCK_EV <= 128
        lse_row, delta_row = lse_ptr + bh * (2 * L), delta_ptr + bh * L
        first_m = start_m
        if CAUSAL and MASK_KIND == 0:
            # the query blocks that cross the diagonal take the causal mask; the later ones, every row at or
            # past the block's last key, take none (a second loop, not a branch in the loop: see _dkdv_step)
            first_m = dsl.minimum(L, dsl.maximum(start_m, dsl.cdiv((pid_n + 1) * BLOCK_N - 1, BLOCK_M) * BLOCK_M))
            for m0 in range(start_m, first_m, BLOCK_M):
                dk, dv = _dkdv_step(dk, dv, k, v, qt_base, q_base, do_base, dot_base, mask_base, lse_row, delta_row,
                                    m0, rm0, rn, re, rev, L, S, E, EV, stride_qm, stride_dom, stride_mm, stride_mn,
                                    qk_scale, k_tile, dq_base, BLOCK_M, BLOCK_N, BLOCK_E, ACC, MASK_KIND, True,
                                    KV_RING, early_dp, DQ_ATOMIC)
        for m0 in range(first_m, L, BLOCK_M):
            dk, dv = _dkdv_step(dk, dv, k, v, qt_base, q_base, do_base, dot_base, mask_base, lse_row, delta_row, m0,
                                rm0, rn, re, rev, L, S, E, EV, stride_qm, stride_dom, stride_mm, stride_mn, qk_scale,
                                k_tile, dq_base, BLOCK_M, BLOCK_N, BLOCK_E, ACC, MASK_KIND, CAUSAL and MASK_KIND != 0,
                                KV_RING, early_dp, DQ_ATOMIC)
    dk = dk * (scale_hi.to(ACC) + scale_lo.to(ACC))
    dsl.store(dk_ptr + b * stride_dkb + kvh.to(dsl.int64) * stride_dkh + rows_n * stride_dkn
              + re.to(dsl.int64)[None, :] * stride_dke,
              dk.to(dk_ptr.dtype.element), mask=(rn[:, None] < S) & (re[None, :] < E))
    dsl.store(dv_ptr + b * stride_dvb + kvh.to(dsl.int64) * stride_dvh + rows_n * stride_dvn
              + rev.to(dsl.int64)[None, :] * stride_dve,
              dv.to(dv_ptr.dtype.element), mask=(rn[:, None] < S) & (rev[None, :] < EV))


@dsl.jit
def _dq_step(dq, q, do, lse_row, delta_row, kt_base, k_base, vt_base, mask_base, start_n, rm, rn0, re, rev,
             L, S, E, EV, stride_kn, stride_vn, stride_mm, stride_mn, qk_scale,
             BLOCK_M: dsl.constexpr, BLOCK_N: dsl.constexpr, ACC: dsl.constexpr,
             MASK_KIND: dsl.constexpr, CAUSAL: dsl.constexpr, MASKED: dsl.constexpr):
    """dQ += dS K over the key block at start_n; MASKED = False: an interior block, whose scores take
    no mask (the key/value loads keep their bounds masks: dropping them spilled at E = 128). K is
    loaded in both orientations (K^T for S, K for dS K), each load used by its dot alone: on sm_90a
    both go through the cp.async ring into the wgmma tiles (see `_dkdv_step`)."""
    rn = start_n + rn0
    keys_ok = rn < S
    cols = rn.to(dsl.int64)[None, :]
    kt = dsl.load(kt_base + cols * stride_kn, mask=(re[:, None] < E) & keys_ok[None, :], other=0.0)
    s = dsl.dot(q, kt, dsl.zeros((BLOCK_M, BLOCK_N), ACC))
    if MASK_KIND == 0:
        # dP = dO V^T issued right after S: both in flight while P is computed (see _dkdv_step; with an
        # attn_mask the two logit tiles live at once spill 8-60 bytes more, tests/test_review_session4.py)
        dp = _values_dp(do, vt_base, cols, rev, EV, keys_ok, stride_vn, BLOCK_M, BLOCK_N, ACC)
    s = _base2_logits(s, qk_scale, kt_base.dtype.element)
    if MASKED:
        s = _apply_masks(s, rm[:, None], rn[None, :], L, S, mask_base, stride_mm, stride_mn, MASK_KIND, CAUSAL, True)
    # lse and delta are loaded here, not once before the loops: a load used only by a broadcast is read
    # straight in the accumulator's row layout (L1 hits), where a loop-invariant vector would move to
    # that layout through shared memory (2 barriers) every iteration
    lse_hi = dsl.load(lse_row, mask=rm < L, other=float("inf"))
    if MASK_KIND == 2:      # (see _dkdv_step)
        p = dsl.exp2((s - lse_hi[:, None]) - dsl.load(lse_row + L, mask=rm < L, other=0.0)[:, None], ftz=True)
    else:
        p = dsl.exp2(s - lse_hi[:, None], ftz=True)
    if MASK_KIND != 0:
        dp = _values_dp(do, vt_base, cols, rev, EV, keys_ok, stride_vn, BLOCK_M, BLOCK_N, ACC)
    delta = dsl.load(delta_row, mask=rm < L, other=0.0)
    ds = p * (dp - delta[:, None])
    k = dsl.load(k_base + rn.to(dsl.int64)[:, None] * stride_kn, mask=keys_ok[:, None] & (re[None, :] < E), other=0.0)
    return dsl.dot(ds.to(kt_base.dtype.element), k, dq)


@dsl.jit
def _values_dp(do, vt_base, cols, rev, EV, keys_ok, stride_vn, BLOCK_M: dsl.constexpr, BLOCK_N: dsl.constexpr,
               ACC: dsl.constexpr):
    """dP = dO V^T over the keys `cols` (vt_base: V^T's pointers at key 0)."""
    vt = dsl.load(vt_base + cols * stride_vn, mask=(rev[:, None] < EV) & keys_ok[None, :], other=0.0)
    return dsl.dot(do, vt, dsl.zeros((BLOCK_M, BLOCK_N), ACC))


@dsl.jit
def attention_backward_dq_kernel(
        dq_ptr, q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, mask_ptr,
        stride_qb, stride_qh, stride_qm, stride_qe,
        stride_kb, stride_kh, stride_kn, stride_ke,
        stride_vb, stride_vh, stride_vn, stride_ve,
        stride_dob, stride_doh, stride_dom, stride_doe,
        stride_dqb, stride_dqh, stride_dqm, stride_dqe,
        stride_mb, stride_mh, stride_mm, stride_mn,
        H, GROUP, L, S, E, EV, qk_scale_hi, qk_scale_lo, scale_hi, scale_lo,
        BLOCK_M: dsl.constexpr, BLOCK_N: dsl.constexpr, BLOCK_E: dsl.constexpr, BLOCK_EV: dsl.constexpr,
        CAUSAL: dsl.constexpr, MASK_KIND: dsl.constexpr, ACC: dsl.constexpr, HEAD_MAJOR: dsl.constexpr = False):
    # dq_ptr, q_ptr: (B, H, L, E); k_ptr: (B, H // GROUP, S, E); v_ptr: (B, H // GROUP, S, EV);
    # do_ptr: (B, H, L, EV); lse_ptr: (B * H, 2, L), delta_ptr: (B * H, L) contiguous ACC. Grid: (B * H,
    # cdiv(L, BLOCK_M)).
    # Key blocks: the interior ones without any mask, then the ragged / diagonal tail with the masks.
    qk_scale = qk_scale_hi.to(ACC) + qk_scale_lo.to(ACC)
    bh, b, h, kvh, pid_m = _query_program(H, GROUP, HEAD_MAJOR)
    rm = pid_m * BLOCK_M + dsl.arange(0, BLOCK_M)
    rn0 = dsl.arange(0, BLOCK_N)
    re = dsl.arange(0, BLOCK_E)
    rev = dsl.arange(0, BLOCK_EV)
    rows_m = rm.to(dsl.int64)[:, None]
    q = dsl.load(q_ptr + b * stride_qb + h * stride_qh + rows_m * stride_qm + re.to(dsl.int64)[None, :] * stride_qe,
                 mask=(rm[:, None] < L) & (re[None, :] < E), other=0.0)
    do = dsl.load(do_ptr + b * stride_dob + h * stride_doh + rows_m * stride_dom
                  + rev.to(dsl.int64)[None, :] * stride_doe,
                  mask=(rm[:, None] < L) & (rev[None, :] < EV), other=0.0)
    lse_row = lse_ptr + bh.to(dsl.int64) * (2 * L) + rm
    delta_row = delta_ptr + bh.to(dsl.int64) * L + rm
    kt_base = k_ptr + b * stride_kb + kvh * stride_kh + re.to(dsl.int64)[:, None] * stride_ke
    k_base = k_ptr + b * stride_kb + kvh * stride_kh + re.to(dsl.int64)[None, :] * stride_ke
    vt_base = v_ptr + b * stride_vb + kvh * stride_vh + rev.to(dsl.int64)[:, None] * stride_ve
    mask_base = mask_ptr + b * stride_mb + h * stride_mh
    dq = dsl.zeros((BLOCK_M, BLOCK_E), ACC)
    end_n = S
    if CAUSAL:
        end_n = dsl.minimum(S, (pid_m + 1) * BLOCK_M)
    unmasked_end = _unmasked_key_end(pid_m, S, BLOCK_M, BLOCK_N, MASK_KIND, CAUSAL)
    for start_n in range(0, unmasked_end, BLOCK_N):
        dq = _dq_step(dq, q, do, lse_row, delta_row, kt_base, k_base, vt_base, mask_base, start_n, rm, rn0, re, rev, L, S,
                      E, EV, stride_kn, stride_vn, stride_mm, stride_mn, qk_scale, BLOCK_M, BLOCK_N, ACC, MASK_KIND, CAUSAL,
                      False)
    for start_n in range(unmasked_end, end_n, BLOCK_N):
        dq = _dq_step(dq, q, do, lse_row, delta_row, kt_base, k_base, vt_base, mask_base, start_n, rm, rn0, re, rev, L, S,
                      E, EV, stride_kn, stride_vn, stride_mm, stride_mn, qk_scale, BLOCK_M, BLOCK_N, ACC, MASK_KIND, CAUSAL,
                      True)
    dq = dq * (scale_hi.to(ACC) + scale_lo.to(ACC))
    dsl.store(dq_ptr + b * stride_dqb + h * stride_dqh + rows_m * stride_dqm + re.to(dsl.int64)[None, :] * stride_dqe,
              dq.to(dq_ptr.dtype.element), mask=(rm[:, None] < L) & (re[None, :] < E))


@dsl.jit
def attention_backward_dq_convert_kernel(
        dq_ptr, acc_ptr, stride_dqb, stride_dqh, stride_dqm, stride_dqe, H, L, E, ROWS, scale_hi, scale_lo,
        BLOCK_M: dsl.constexpr, BLOCK_E: dsl.constexpr, ACC: dsl.constexpr):
    # dq = acc * scale in dq's dtype. dq_ptr: (B, H, L, E); acc_ptr: (B * H, ROWS, BLOCK_E) contiguous ACC,
    # the dK/dV kernel's DQ_ATOMIC sums (ROWS >= L). Grid: (B * H, cdiv(L, BLOCK_M)).
    bh, b, h, rm, re, mask = _row_tile(H, L, E, BLOCK_M, BLOCK_E)
    acc = dsl.load(acc_ptr + bh.to(dsl.int64) * ROWS * BLOCK_E + rm.to(dsl.int64)[:, None] * BLOCK_E + re[None, :],
                   mask=mask, other=0.0)
    dq = acc * (scale_hi.to(ACC) + scale_lo.to(ACC))
    dsl.store(dq_ptr + b * stride_dqb + h * stride_dqh + rm.to(dsl.int64)[:, None] * stride_dqm
              + re.to(dsl.int64)[None, :] * stride_dqe, dq.to(dq_ptr.dtype.element), mask=mask)


# ------------------------------------------------------------------------------------------------
# launchers
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class AttentionConfig:
    """Tile sizes and launch parameters of one attention kernel; kv_ring, early_dp, head_major: the dK/dV
    kernel's KV_RING, EARLY_DP and HEAD_MAJOR; min_blocks_per_sm > 0: the forward's dsl.launch_bounds (its
    registers capped for that many CTAs per SM)."""
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    kv_ring: bool = False
    early_dp: bool = True
    head_major: bool = False
    dq_atomic: bool = False
    min_blocks_per_sm: int = 0


# Interpreter: small tiles keep the per-program op count (and so CPU test time) low.
INTERPRETER_CONFIG = AttentionConfig(16, 16, 4, 1)


def head_block(dim: int) -> int:
    """The padded head-dim block: the next power of two >= dim, at least 16 (one mma k-step)."""
    return max(16, 1 << max(0, dim - 1).bit_length())


# The launch configs on sm_80/sm_90a, by padded head dim (the wider of BLOCK_E, BLOCK_EV): a table that
# `python bench/attention.py --sweep` (and .scratch/attn_sweep.py) times against the alternatives below,
# so that one GPU run picks it. Every entry and alternative assembles for sm_90a without spills at
# E = 64 / 128 / 256, causal or not, with or without attn_mask (tests/test_attention.py).
# sm_90a forward (E <= 128): both dots of a key block run on wgmma with A from registers (Q converted
# to the A fragment once, before the key loops; P = exp2(S - m) is the S accumulator itself), K and V
# come through the cp.async ring, and each warpgroup owns 64 rows (BLOCK_M = 64 x warpgroups), so the
# row max/sum are 2 shuffles over the 4 lanes of a row: 1 barrier per key block (the ring's), no
# st.shared (the mma.sync lowering had 27 barriers and 46 st.shared per key block at 128x64 on 8 warps).
# With an attn_mask the mask tile still moves to the logits' layout through shared memory (7 barriers).
# E = 256 (64 x 32 on 8 warps: warpgroups split N) and sm_80 keep mma.sync.
# H200 (B*S = 16k tokens, H*E = 2048, fp16, TFLOP/s, S = 1k / 4k / 16k, not causal | causal): E = 64:
# 128x32 w8 s3 229 / 277 / 289 | 146 / 269 / 304 against 128x64 w8 s3 204 / 265 / 287 | 138 / 225 / 274;
# E = 128: 128x64 w8 s3 250 / 356 / 389 | 183 / 310 / 366 (the best or within 10% of it).
# Session 17 (the key loop pipelined by one block, S and P V in flight during the softmax: 4-11% faster than
# the loop without it in one process, every (E, S, causal) of E 64 / 128 x S 1k / 4k): the sweep (S = 1k / 4k,
# not causal | causal, x flash) keeps these entries: E = 64 128x32 0.79 / 0.93 | 0.67 / 0.98 (the
# alternatives within 3%, except 128x64 s3 causal at 4k: 0.86); E = 128 128x64 s3 0.88 / 1.07 | 0.41 / 1.16
# (s2 within 1%). Until session 18 a forced config was prepared anew at every call, so those S = 1k
# figures include the preparation (0.82-0.89 with prepared launches).
# Session 20: what a program costs besides its key blocks (L = 1024, B * H as at S = 1k, one key block:
# Q's load and conversion, the peeled block, the epilogue): E = 64 107 us, E = 128 162 us against flash's
# 109 / 69 us (2.3x at E = 128). The first K^T block took one 2-byte load per element and Q went into the wgmma A
# fragment through 2-byte st.shared / ld.shared with bank conflicts; with 16-byte accesses along a transposed
# view's contiguous dim (codegen/memory.py) and tile conversions through a swizzled tile (codegen/
# swizzled_exchange.py): 88 / 139 us. x flash, S = 1k / 2k, not causal | causal (interleaved, one process):
# E = 64 0.87 / 1.01 | 0.94 / 0.96, E = 128 0.93 / 1.08 | 0.89 / 1.07 (before: 0.89 / 1.02 | 0.89 / 0.93,
# 0.88 / 1.01 | 0.83 / 1.01). The 1-warpgroup tiles (2-3 CTAs per SM) stayed 4-20% slower at S = 1k.
# Session 21 (x flash, interleaved, S = 1k / 2k / 4k / 8k / 16k, not causal | causal), whether a config by S
# would pay: E = 64 128x32 s3 0.92 / 1.02 / 1.05 / 0.99 / 0.98 | 0.93 / 0.97 / 1.05 / 1.06 / 1.04, 64x64 w4 s3
# 0.89 / 1.02 / 0.99 / 0.90 / 0.90 | 0.89 / 0.98 / 1.09 / 1.09 / 1.02; E = 128 128x64 s3 0.92 / 1.08 / 1.16 /
# 1.18 / 1.14 | 0.89 / 1.07 / 1.26 / 1.38 / 1.41, s2 0.96 / 1.10 / 1.10 / 1.10 / 1.14 | 0.88 / 1.09 / 1.24 /
# 1.25 / 1.26, 64x64 w4 s2 0.76 / 1.06 / 1.13 / 1.06 / 1.02 | 0.80 / 1.12 / 1.27 / 1.36 / 1.28: no other
# config wins anywhere by more than 4% (E = 128: s2 at 1k, 64x64 w4 causal at 2k; E = 64: 64x64 w4 causal at
# 4k-8k, 2-3%), about the spread between runs, so the table stays.
FORWARD_CONFIGS = {
    64: AttentionConfig(128, 32, 8, 3),
    128: AttentionConfig(128, 64, 8, 3),
    256: AttentionConfig(64, 32, 8, 2),
}
# Session 33: on sm_90a without an attn_mask, two CTAs per SM (min_blocks_per_sm = 2: dsl.launch_bounds caps
# the registers at 128, under which the invariant Q is read by wgmma from shared memory instead of a register
# fragment, dot_layouts.register_cap) hide one CTA's Q load, first key block and epilogue behind the other's
# key loop: with one CTA of 8 warps per SM those ran alone (per program, besides its key blocks: 88 / 139 us
# at E = 64 / 128, against ~500 us for the whole S = 1k forward). H200 (.scratch/s33/attn_probe.py, fp16,
# interleaved, x flash, S = 1k / 2k / 4k / 8k / 16k, not causal | causal): E = 64 128x64 s2 on 2 CTAs 1.01-1.04
# / 1.10 / 1.16 / 1.12-1.18 / 1.11-1.12 | 1.00 / 1.04 / 1.13-1.14 / 1.17-1.20 / 1.20-1.21 against the one-CTA
# 128x32 s3's 0.90 / 0.94 / 0.98-1.02 / 1.01-1.02 / 0.99 | 0.94 / 0.95 / 1.00 / 1.04-1.06 / 1.08-1.09; E = 128
# 128x32 s3 on 2 CTAs 0.96-1.03 / 1.10-1.11 / 1.13-1.17 / 1.11-1.15 / 1.12-1.14 | 1.02-1.03 / 1.11-1.13 /
# 1.17-1.19 / 1.22-1.24 / 1.25 against 128x64 s3 on one CTA 0.87-0.95 / 1.04-1.05 / 1.12-1.14 / 1.16-1.17 /
# 1.16-1.17 | 0.89 / 1.04-1.05 / 1.18 / 1.27-1.28 / 1.35, which therefore keeps rows of more than
# TWO_CTA_MAX_KEYS[128] keys. The E = 128 tile spills 8 (causal: 36) bytes: values live across the key loops,
# stored before them and reloaded after (its SASS: no local memory access inside the loops). With an
# attn_mask the 128-register cap spills 8-130 bytes, and on sm_80 (mma.sync, Q in registers) 250-630, so
# those keep FORWARD_CONFIGS.
TWO_CTA_FORWARD_CONFIGS = {
    64: AttentionConfig(128, 64, 8, 2, min_blocks_per_sm=2),
    128: AttentionConfig(128, 32, 8, 3, min_blocks_per_sm=2),
}
TWO_CTA_MAX_KEYS = {128: 4096}
# (dK/dV kernel config, dQ kernel config); the preprocessing kernel uses the dQ kernel's BLOCK_M.
# sm_90a backward: every tile the loops read is loaded in the orientation its dot wants (Q^T and Q, dO and
# dO^T, K^T and K), each load used by its dot alone, so all of them come through the cp.async ring (1
# barrier per block with no attn_mask). Where the dot's M (BLOCK_N for dK/dV, BLOCK_M for dQ) is 64 per
# warpgroup, all dots of the loop run on wgmma with A from registers (K, V, Q, dO converted once before
# the loops; P^T, dS^T, dS straight from the accumulators): E = 64 dK/dV 64x128 on 8 warps (was 12
# barriers, 30 st.shared, 64 mma.sync per query block), dQ 64x64 on 4 warps and E = 128 dQ 128x64 on 8
# warps (11 barriers -> 1). E = 128 dK/dV: K and V as register A fragments beside the dk and dv
# accumulators would take 192 of 255 registers before the per-block tiles, so the compiler keeps K in
# registers and reads V from shared memory, copied there once before the loops (dot_layouts.
# REGISTER_A_HEADROOM, passes/invariant_operands.py): 32 x 128 on 8 warps, all four dots on wgmma, 0
# spills. Session 18 (H200, one process, x torch's flash backward, S = 1k / 4k / 16k, not causal |
# causal): 1.17 / 1.07 / 1.02 | 1.20-1.27 / 1.08-1.10 / 1.00; with K copied too 1.11 / 1.05 / 0.98 |
# 1.25 / 1.14 / 1.01; K and V through the ring every query block (kv_ring, sessions 9-17: 64 KiB more
# from L2 per block) 0.99 / 0.80 / 0.78 | 1.18 / 0.97 / 0.83. 64 x 128 spills 52-84 bytes. A masked
# backward keeps the mma.sync 32 x 64 (MASKED_DKDV_CONFIGS: the wgmma tiles spill 40-64 bytes with an
# attn_mask).
# E = 256 keeps mma.sync. Spill-free otherwise, per tests/test_attention.py.
# E = 64 dK/dV takes its programs head by head (head_major, _head_major_program): in launch order the
# programs running at once were one key block of 132 different heads, each streaming its own head's Q and
# dO (B * H * L * E * 4 bytes for one key block of every head, past the 50 MB L2); head by head they share one head's
# stream. Session 19 (H200, one process, dK/dV kernel ms, launch order -> head major, S = 4k / 16k): not
# causal 3.78 -> 3.25 / 14.14 -> 12.34, causal 2.14 -> 2.02 / 7.70 -> 7.19 (whole backward x flash 0.86 ->
# 0.95 / 0.83 -> 0.89 not causal). At E = 128 it was within -4 / +4% (mixed), and taken by the forward
# and dQ kernels it lost 3-9% on causal masks (their last query blocks, with the most keys, no longer all
# run first), so those keep the launch order.
# E = 64 dQ: 64 x 32 on 4 warps, 4-9% faster than 64 x 64 in three sweeps (sessions 5 and 9, runs 54 and 57:
# S = 1k / 4k, causal or not).
BACKWARD_CONFIGS = {
    64: (AttentionConfig(64, 128, 8, 2, head_major=True), AttentionConfig(64, 32, 4, 2)),
    128: (AttentionConfig(32, 128, 8, 2), AttentionConfig(128, 64, 8, 2)),
    256: (AttentionConfig(32, 32, 8, 1), AttentionConfig(32, 32, 8, 1)),
}
# The dQ kernel reads every key block of its head for each query block. In launch order (heads fastest) the
# programs in flight at once are one query block of as many heads, each streaming its own head's K and V
# (past the L2 at B * S = 16k tokens); head by head (`_query_program`'s HEAD_MAJOR) they are the query blocks
# of a few heads, sharing them. That pays where the batch has at least two query heads per SM. Session 27 (H200,
# .scratch/hm_probe.py, interleaved, whole backward x torch's flash, fp16, launch order -> head major), E = 64:
# S = 1k (B * H = 512) 0.926 -> 0.963, causal 1.016 -> 1.052; S = 2k (256) 0.895 -> 0.895, causal 0.961 ->
# 0.961; S = 4k / 8k 0.88 / 0.87 -> 0.88 / 0.865, causal 0.93 / 0.89 -> 0.92 / 0.87; E = 128: S = 1k (256)
# 1.094 -> 1.099, causal 1.100 -> 1.110; S = 4k / 8k 1.05 / 1.01 -> 1.01 / 1.00, causal 1.04 / 1.03 -> 1.01 /
# 0.99. The forward, head major: E = 64 S = 1k 0.902 -> 0.919, slower elsewhere (by up to 9% with causal).
DQ_HEAD_MAJOR_PER_SM = 2
# The dK/dV kernel that also adds each step's dS K into a float32 dQ (DQ_ATOMIC: `red.global.add.v2.f32`, run
# to run the sums' order differs), where it pays: 5 dots per block pair instead of the two kernels' 7 (the
# dQ kernel recomputes S and dP), as FlashAttention-2's default backward does. Not under
# torch.use_deterministic_algorithms(True), nor with an attn_mask (the masked tiles keep mma.sync). Its
# dQ dot (64 x 64 on 2 warpgroups, which split N) reads dS from shared memory, staged each step
# (dot_layouts.wgmma_staged_computed_a), issued before dK's dot so that both run while the reductions wait
# (passes/wgmma_waits.py), and the reductions run from the accumulator's registers, pairs of floats per
# instruction (codegen/atomics.py). Session 28 (H200, interleaved, whole backward x torch's flash, E = 64,
# S = 1k / 4k, not causal | causal): the two kernels 0.964 / 0.882 | 1.053 / 0.916; one kernel with its
# reductions converted to a blocked layout (4 floats per thread: every lane on another 32-byte sector)
# 0.46 / 0.40 | 0.58 / 0.45, from the accumulator's registers 0.835 / 0.746 | 0.900 / 0.770, as pairs
# 0.982 / 0.903 | 1.037 / 0.908, dQ's dot issued first and left in flight 1.024 / 0.952 | 1.054 / 0.918,
# 3 stages 1.016 / 0.947 | 1.071 / 0.948.
# Session 33: its three dots on zero accumulators (S^T, dP^T, dQ) no longer zero 96 registers first (wgmma's scale-d
# false, codegen/wgmma.py): at 255 registers ptxas had made room by waiting for the in-flight wgmma (C7517); it now
# spills 24 bytes, values live across the query-block loop (the SASS: stored before it, reloaded after; causal, with
# its two loops: 144 bytes, see _dkdv_step). Whole backward x flash (.scratch/s33/bwd_probe.py, interleaved, S = 2k
# / 4k, not causal | causal): 0.972 / 0.945 | 0.998 / 0.947 -> 1.038 / 1.016 | 1.011 / 0.958 (E = 128, S = 4k: 1.03
# | 1.03 -> 1.06 | 1.03).
ATOMIC_DKDV_CONFIGS = {64: AttentionConfig(64, 128, 8, 3, head_major=True, dq_atomic=True)}
# Its shared memory (sm_80 / sm_90a, any head dims <= 64): a GPU that grants a CTA less (compute capability
# 8.6 / 8.9: 99 KiB) runs the deterministic kernels (80 KiB).
ATOMIC_DKDV_SHARED_BYTES = 160 * 1024
# The dK/dV config of a backward with an attn_mask, where it differs from BACKWARD_CONFIGS'.
MASKED_DKDV_CONFIGS = {128: AttentionConfig(32, 64, 8, 2)}
# Alternatives the sweep times (besides the table's entry), by padded head dim. (E = 128 dK/dV with kv_ring,
# 0.78-0.99x the table's in session 18, spills 120 bytes with the causal kernel's two loops: dropped.)
FORWARD_ALTERNATIVES = {
    64: (AttentionConfig(128, 128, 8, 2), AttentionConfig(128, 64, 8, 3), AttentionConfig(64, 64, 4, 3)),
    128: (AttentionConfig(128, 64, 8, 2), AttentionConfig(128, 32, 8, 2), AttentionConfig(64, 64, 4, 3)),
    256: (),
}
DKDV_ALTERNATIVES = {
    64: (AttentionConfig(64, 128, 8, 2), AttentionConfig(64, 64, 4, 2, head_major=True), AttentionConfig(64, 64, 8, 2),
         AttentionConfig(64, 64, 4, 2, kv_ring=True),
         AttentionConfig(64, 128, 8, 2, kv_ring=True), AttentionConfig(32, 128, 8, 2, kv_ring=True)),
    128: (AttentionConfig(32, 128, 8, 2, head_major=True), AttentionConfig(32, 128, 8, 3),
          AttentionConfig(32, 64, 8, 2), AttentionConfig(16, 128, 8, 2)),
    256: (),
}
# 128x32 on 8 warps (128 class): spill-free under ptxas with an additive attn_mask and for head dims below
# their block, where the table's 128x64 spills 12-356 bytes (tests/test_review_session4.py); not yet run
# on a GPU, so not in the table.
DQ_ALTERNATIVES = {
    64: (AttentionConfig(128, 64, 8, 2), AttentionConfig(64, 64, 4, 2)),
    128: (AttentionConfig(64, 64, 8, 2), AttentionConfig(128, 32, 8, 2)),
    256: (),
}


def _table_key(block_e: int, block_ev: int) -> int:
    widest = max(block_e, block_ev)
    return 64 if widest <= 64 else 128 if widest <= 128 else 256


def forward_config(block_e: int, block_ev: int, masked: bool = False, length_k: int = 0,
                   wgmma: bool = True, vector_rows: bool = True) -> AttentionConfig:
    """The forward tile for padded head dims (BLOCK_E, BLOCK_EV): TWO_CTA_FORWARD_CONFIGS where the dots run
    on wgmma (`wgmma`: sm_90a), without an attn_mask (`masked`), for at most TWO_CTA_MAX_KEYS keys per row
    (`length_k`) and where q, k and v rows are read in 16-byte vectors (`vector_rows`, `_vector_rows`: the
    cp.async ring; else their tiles go through registers, which the two-CTA tiles' 128-register cap spills:
    132-468 bytes at E = 36-124 off 16-byte rows), else FORWARD_CONFIGS."""
    key = _table_key(block_e, block_ev)
    two_cta = TWO_CTA_FORWARD_CONFIGS.get(key)
    if two_cta is None or masked or not wgmma or not vector_rows or length_k > TWO_CTA_MAX_KEYS.get(key, length_k):
        return FORWARD_CONFIGS[key]
    return two_cta


def _vector_rows(t: torch.Tensor) -> bool:
    """Whether `t`'s rows (its last dim) are read in 16-byte vectors: unit column stride, the other strides
    and the row length multiples of 16 bytes, and its data (now: a launch prepared for these strides may see
    other offsets, which only cost speed) at a 16-byte boundary."""
    elements = max(1, 16 // t.element_size())
    return (t.stride(-1) == 1 and t.shape[-1] % elements == 0 and all(s % elements == 0 for s in t.stride()[:-1])
            and t.data_ptr() % 16 == 0)


def backward_configs(block_e: int, block_ev: int, masked: bool = False, query_heads: int = 0, sms: int = 1,
                     deterministic: bool = False, shared_memory: int = ATOMIC_DKDV_SHARED_BYTES) -> tuple:
    """(dK/dV kernel config, dQ kernel config) for padded head dims (BACKWARD_CONFIGS), with an attn_mask
    where `masked` (MASKED_DKDV_CONFIGS); the dQ kernel takes its programs head by head where the batch
    has at least DQ_HEAD_MAJOR_PER_SM query heads (B * H, `query_heads`) per SM (`sms`). Without a mask,
    unless `deterministic` and where a CTA may take ATOMIC_DKDV_SHARED_BYTES of shared memory
    (`shared_memory`, bytes), the dK/dV kernel of ATOMIC_DKDV_CONFIGS adds dQ itself where there is one
    (the dQ kernel's config then gives only the preprocessing's and dQ conversion's BLOCK_M)."""
    key = _table_key(block_e, block_ev)
    kv, q = BACKWARD_CONFIGS[key]
    if query_heads >= DQ_HEAD_MAJOR_PER_SM * sms:
        q = replace(q, head_major=True)
    if masked:
        return MASKED_DKDV_CONFIGS.get(key, kv), q
    if deterministic or shared_memory < ATOMIC_DKDV_SHARED_BYTES:
        return kv, q
    return ATOMIC_DKDV_CONFIGS.get(key, kv), q


def sweep_configs(block_e: int, block_ev: int) -> tuple:
    """(forward configs, backward config pairs) that `bench/attention.py --sweep` times: the table's
    entries first (sm_90a's, without an attn_mask), then each alternative (the forward's: FORWARD_CONFIGS
    too) with the other backward kernel's table entry."""
    key = _table_key(block_e, block_ev)
    kv, q = backward_configs(block_e, block_ev)
    deterministic = BACKWARD_CONFIGS[key][0]
    alternatives = DKDV_ALTERNATIVES[key] + ((deterministic,) if deterministic != kv else ())
    table = forward_config(block_e, block_ev)
    forward = (table,) + tuple(c for c in dict.fromkeys((FORWARD_CONFIGS[key],) + FORWARD_ALTERNATIVES[key])
                               if c != table)
    backward = ((kv, q),) + tuple((a, q) for a in alternatives) + tuple(
        (deterministic, a) for a in DQ_ALTERNATIVES[key])
    return forward, backward


def _interpret(interpret: Optional[bool]) -> bool:
    return _interpret_enabled() if interpret is None else interpret


def _acc_dtype(q: torch.Tensor):
    return dsl.float64 if q.dtype == torch.float64 else dsl.float32


def _mask_arguments(mask: Optional[torch.Tensor], like: torch.Tensor) -> tuple:
    """(tensor, 4 strides, MASK_KIND) for a mask already expanded to (B, H, L, S), or no mask."""
    if mask is None:
        return like, (0, 0, 0, 0), NO_MASK
    if mask.dtype == torch.bool:       # read as bytes (0 = masked): one byte per element either way
        return mask.view(torch.uint8), _strides(mask), BOOL_MASK
    return mask, _strides(mask), ADDITIVE_MASK


def _mask_argument(mask: Optional[torch.Tensor]):
    """`argument(q, mask)`: the tensor a launch passes for `mask` (as `_mask_arguments`), for masks like this."""
    if mask is None:
        return lambda q, mask: q
    if mask.dtype == torch.bool:
        return lambda q, mask: mask.view(torch.uint8)
    return lambda q, mask: mask


def _strides(t: torch.Tensor) -> tuple:
    # a dim of size 1 is never stepped over; 0 keeps int arguments small and specializable
    return tuple(st if n > 1 else 0 for st, n in zip(t.stride(), t.shape))


@functools.lru_cache(maxsize=256)
def _float_pair(x: float) -> tuple:
    """(hi, lo) float32 values with hi + lo = x to ~48 bits: float kernel arguments are float32, and
    the float64 interpreter runs (gradcheck) need the scale to more than float32 precision."""
    import numpy as np
    with np.errstate(over="ignore", invalid="ignore"):     # past float32's range: hi + lo is NaN, as torch's
        hi = float(np.float32(x))                           # scaled scores give (inf - inf)
        return hi, float(np.float32(x - hi))


def _check_grid(blocks: int, what: str) -> None:
    if blocks > MAX_GRID_Y:
        raise ValueError(f"{what} needs {blocks} blocks, over CUDA's grid limit of {MAX_GRID_Y}")


def _layout_key(t: Optional[torch.Tensor]):
    return None if t is None else (t.shape, t.stride(), t.dtype, t.get_device())


# AttentionLaunches per everything attention_forward derives from its tensors but the addresses (shapes,
# strides, dtypes, devices, causal, scale, the interpreter flag), made by attention_launches; the launches
# of attention_backward with the default options per the same of its tensors: closures over prepared
# kernels (JITFunction.prepare).
_FORWARD_LAUNCHES = BoundedCache(1024)
_BACKWARD_LAUNCHES = BoundedCache(1024)


def attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor],
                      causal: bool, scale: float, *, interpret: Optional[bool] = None,
                      config: Optional[AttentionConfig] = None,
                      launches: Optional["AttentionLaunches"] = None) -> tuple:
    """Flash attention forward: returns (o, lse).

    q: (B, H, L, E); k: (B, H_kv, S, E); v: (B, H_kv, S, Ev), one dtype (float16/bfloat16 on the GPU;
    the interpreter also runs float32/float64), H a multiple of H_kv, any strides. mask: None or a
    bool / float tensor *expanded* to (B, H, L, S) (stride 0 on broadcast dims). scale multiplies
    q . k. Returns o: (B, H, L, Ev) in q's dtype, laid out as torch's attention lays out its output
    (`output_order`: (B, L, H, Ev) in memory for a q transposed from (B, L, H, E)), and lse: (B, H, 2, L)
    float32 (float64 for
    float64 inputs), the base-2 log-sum-exp of each row's logits as the unevaluated sum lse[:, :, 0] +
    lse[:, :, 1] (+inf and 0 for fully masked rows; the module docstring's "Saved statistics").
    With the default interpret the launch is prepared once per layouts and config (`attention_launches`:
    timing a forced config times the kernel, not its preparation); `launches`: that AttentionLaunches
    (attention_launches(q, k, v, mask, causal, scale)) when the caller has it, which saves finding it.
    """
    if launches is not None:
        return launches.forward(q, k, v, mask)
    if interpret is None:
        return attention_launches(q, k, v, mask, causal, scale, config=config).forward(q, k, v, mask)
    return _forward_launcher(q, k, v, mask, causal, scale, interpret, config)(q, k, v, mask)


def attention_launches(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor],
                       causal: bool, scale: float, *, config: Optional[AttentionConfig] = None) -> "AttentionLaunches":
    """The AttentionLaunches of tensors like these (arguments as for attention_forward; `config`: the
    forward's, None for the table's), made once per layout and config."""
    key = (_layout_key(q), _layout_key(k), _layout_key(v), _layout_key(mask), causal, scale, _interpret_enabled(),
           config)
    launches = _FORWARD_LAUNCHES.get(key)
    if launches is None:
        launches = _FORWARD_LAUNCHES.put(key, AttentionLaunches(
            _forward_launcher(q, k, v, mask, causal, scale, None, config), causal, scale))
    return launches


class AttentionLaunches:
    """The prepared launches of attention_forward for one layout of q, k, v and mask (with causal,
    scale and the interpreter flag), and of the backward of its results: what the autograd Function
    keeps from its forward to its backward, which then finds its launches by the strides of its tensors
    alone (attention_backward's key covers seven tensors' shapes, strides, dtypes and devices).

    forward(q, k, v, mask) -> (o, lse), as attention_forward, for tensors of this layout.
    backward(do, q, k, v, o, lse, mask) -> (dq, dk, dv), as attention_backward, for q, k, v and mask of
    this layout and the o and lse of their forward, prepared in that forward's mode (GPU or
    interpreter: FUSEDOPS_INTERPRET then).
    """

    __slots__ = ("forward", "_causal", "_scale", "_backward")

    def __init__(self, forward: Callable, causal: bool, scale: float):
        self.forward, self._causal, self._scale = forward, causal, scale
        self._backward = BoundedCache(16)   # per layouts of do and the saved tensors

    def backward(self, do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                 lse: torch.Tensor, mask: Optional[torch.Tensor]) -> tuple:
        # the saved tensors' strides too: a saved-tensor hook (torch.autograd.graph.save_on_cpu) may lay
        # them out anew (it makes an expanded mask contiguous)
        key = (do.stride(), do.dtype, q.stride(), k.stride(), v.stride(), o.stride(), lse.stride(),
               None if mask is None else mask.stride(), torch.are_deterministic_algorithms_enabled())
        launch = self._backward.get(key)
        if launch is None:
            launch = self._backward.put(key, _backward_launcher(do, q, k, v, o, lse, mask, self._causal, self._scale,
                                                                None, None))
        return launch(do, q, k, v, o, lse, mask)


def output_order(q: torch.Tensor) -> tuple:
    """The memory order of the output's dims (B, H, L, Ev), outermost first: q's (allocation.stride_order) where
    q's last dim is its innermost with unit stride, else contiguous; torch's attention does the same, so
    nanoGPT's `sdpa(q, k, v).transpose(1, 2).view(B, T, C)` of q, k, v viewed from (B, T, H, E) works."""
    order = stride_order(q)
    return order if order[-1] == 3 and bool(q.stride(3) == 1) else (0, 1, 2, 3)


def _forward_launcher(q, k, v, mask, causal, scale, interpret, config):
    """`launch(q, k, v, mask) -> (o, lse)` for tensors like these (see attention_forward)."""
    batch, heads, length_q, dim = q.shape
    heads_kv, length_k, dim_v = k.shape[1], k.shape[2], v.shape[3]
    interpret = _interpret(interpret)
    acc = _acc_dtype(q)
    new_o = ordered_allocator((batch, heads, length_q, dim_v), output_order(q), q.dtype, q.device)
    new_lse = contiguous_allocator((batch, heads, 2, length_q), to_torch(acc), q.device)
    if batch * heads * length_q == 0:     # no rows (then no outputs either)
        return lambda q, k, v, mask: (new_o(), new_lse())
    block_e, block_ev = head_block(dim), head_block(dim_v)
    config = config or (INTERPRETER_CONFIG if interpret else forward_config(
        block_e, block_ev, mask is not None, length_k, wgmma_target(q.device), all(map(_vector_rows, (q, k, v)))))
    blocks = -(-length_q // config.block_m)
    _check_grid(blocks, f"a query length of {length_q}")
    o, lse = new_o(), new_lse()
    mask_arg, mask_strides, mask_kind = _mask_arguments(mask, q)
    prepared = attention_forward_kernel.prepare(
        (batch * heads, blocks), o, lse, q, k, v, mask_arg, *_strides(q), *_strides(k), *_strides(v), *_strides(o),
        *mask_strides, heads, heads // heads_kv, length_q, length_k, dim, dim_v, *_float_pair(float(scale) * LOG2E),
        BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_E=block_e, BLOCK_EV=block_ev,
        CAUSAL=bool(causal), MASK_KIND=mask_kind, ACC=acc, HEAD_MAJOR=config.head_major,
        MIN_BLOCKS=config.min_blocks_per_sm, num_warps=config.num_warps, num_stages=config.num_stages,
        interpret=interpret)
    mask_argument = _mask_argument(mask)

    def launch(q, k, v, mask):
        o, lse = new_o(), new_lse()
        prepared(o, lse, q, k, v, mask_argument(q, mask))
        return o, lse

    return launch


def attention_backward(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                       lse: torch.Tensor, mask: Optional[torch.Tensor], causal: bool, scale: float, *,
                       interpret: Optional[bool] = None, configs: Optional[tuple] = None,
                       launches: Optional[AttentionLaunches] = None) -> tuple:
    """Flash attention backward: returns (dq, dk, dv), contiguous, shaped and typed like q, k, v.

    do: (B, H, L, Ev), any strides; q, k, v, mask, causal, scale as given to `attention_forward`;
    o and lse are its results. dK and dV are deterministic; so is dQ where the backward runs the dQ kernel
    (see the module docstring: head dims > 64, an attn_mask, torch.use_deterministic_algorithms(True) or
    a forced config without dq_atomic), else its float32 sums take atomic reductions in a varying order.
    `configs`: (dK/dV config, dQ config) to force.
    With the default interpret the launches are prepared once per layouts and configs; `launches`: the
    AttentionLaunches of the forward that gave o and lse, whose backward launches are found by the
    tensors' strides alone (see there).
    """
    if launches is not None:
        return launches.backward(do, q, k, v, o, lse, mask)
    cached = interpret is None
    if cached:
        key = (_layout_key(do), _layout_key(q), _layout_key(k), _layout_key(v), _layout_key(o), _layout_key(lse),
               _layout_key(mask), causal, scale, _interpret_enabled(), configs,
               torch.are_deterministic_algorithms_enabled())
        launch = _BACKWARD_LAUNCHES.get(key)
        if launch is not None:
            return launch(do, q, k, v, o, lse, mask)
    launch = _backward_launcher(do, q, k, v, o, lse, mask, causal, scale, interpret, configs)
    if cached:
        _BACKWARD_LAUNCHES.put(key, launch)
    return launch(do, q, k, v, o, lse, mask)


def _backward_launcher(do, q, k, v, o, lse, mask, causal, scale, interpret, configs):
    """`launch(do, q, k, v, o, lse, mask) -> (dq, dk, dv)` for tensors like these (see
    attention_backward)."""
    batch, heads, length_q, dim = q.shape
    heads_kv, length_k, dim_v = k.shape[1], k.shape[2], v.shape[3]
    interpret = _interpret(interpret)
    acc = _acc_dtype(q)
    new_dq, new_dk, new_dv = (contiguous_allocator(tuple(t.shape), t.dtype, t.device) for t in (q, k, v))
    if batch * heads * length_q == 0 or length_k == 0:   # nothing attends: every gradient is 0
        return lambda do, q, k, v, o, lse, mask: (new_dq().zero_(), new_dk().zero_(), new_dv().zero_())
    block_e, block_ev = head_block(dim), head_block(dim_v)
    if configs is None:
        configs = (INTERPRETER_CONFIG,) * 2 if interpret else backward_configs(
            block_e, block_ev, mask is not None, batch * heads, sm_count(q.device),
            torch.are_deterministic_algorithms_enabled(), max_shared_memory(q.device))
    kv_config, q_config = configs
    blocks_m, blocks_n = -(-length_q // q_config.block_m), -(-length_k // kv_config.block_n)
    _check_grid(max(blocks_m, blocks_n), f"sequence lengths ({length_q}, {length_k})")
    new_delta = contiguous_allocator((batch, heads, length_q), to_torch(acc), q.device)
    # the kernels read lse as contiguous (B * H, 2, L) rows
    lse_contiguous = lse.is_contiguous()
    lse = lse if lse_contiguous else lse.contiguous()
    dq, dk, dv, delta = new_dq(), new_dk(), new_dv(), new_delta()
    mask_arg, mask_strides, mask_kind = _mask_arguments(mask, q)
    common = dict(BLOCK_E=block_e, BLOCK_EV=block_ev, CAUSAL=bool(causal), MASK_KIND=mask_kind, ACC=acc,
                  interpret=interpret)
    preprocess = attention_backward_preprocess_kernel.prepare(
        (batch * heads, blocks_m), delta, o, do, *_strides(o), *_strides(do), heads, length_q, dim_v,
        BLOCK_M=q_config.block_m, BLOCK_EV=block_ev, ACC=acc, num_warps=4, interpret=interpret)
    scales = (*_float_pair(float(scale) * LOG2E), *_float_pair(float(scale)))
    dq_rows = -(-length_q // kv_config.block_m) * kv_config.block_m
    dq_atomic = kv_config.dq_atomic and mask_kind == NO_MASK
    new_dq_acc = contiguous_allocator((batch * heads, dq_rows, block_e), to_torch(acc), q.device)
    dq_acc = new_dq_acc() if dq_atomic else None
    dkdv = attention_backward_dkdv_kernel.prepare(
        (batch * heads_kv, blocks_n), dk, dv, q, k, v, do, lse, delta, mask_arg,
        *_strides(q), *_strides(k), *_strides(v), *_strides(do), *_strides(dk), *_strides(dv), *mask_strides,
        heads_kv, heads // heads_kv, length_q, length_k, dim, dim_v, *scales,
        BLOCK_M=kv_config.block_m, BLOCK_N=kv_config.block_n, num_warps=kv_config.num_warps,
        num_stages=kv_config.num_stages, KV_RING=kv_config.kv_ring, EARLY_DP=kv_config.early_dp,
        HEAD_MAJOR=kv_config.head_major, DQ_ATOMIC=dq_atomic, dq_ptr=dq_acc, **common)
    if dq_atomic:
        dq_kernel = attention_backward_dq_convert_kernel.prepare(
            (batch * heads, blocks_m), dq, dq_acc, *_strides(dq), heads, length_q, dim, dq_rows, *scales[2:],
            BLOCK_M=q_config.block_m, BLOCK_E=block_e, ACC=acc, num_warps=4, interpret=interpret)
    else:
        dq_kernel = attention_backward_dq_kernel.prepare(
            (batch * heads, blocks_m), dq, q, k, v, do, lse, delta, mask_arg,
            *_strides(q), *_strides(k), *_strides(v), *_strides(do), *_strides(dq), *mask_strides,
            heads, heads // heads_kv, length_q, length_k, dim, dim_v, *scales,
            BLOCK_M=q_config.block_m, BLOCK_N=q_config.block_n, num_warps=q_config.num_warps,
            num_stages=q_config.num_stages, HEAD_MAJOR=q_config.head_major, **common)
    mask_argument = _mask_argument(mask)

    def launch(do, q, k, v, o, lse, mask):
        dq, dk, dv, delta = new_dq(), new_dk(), new_dv(), new_delta()
        if not lse_contiguous:      # (a saved-tensor hook may lay the saved lse out anew)
            lse = lse.contiguous()
        mask_arg = mask_argument(q, mask)
        preprocess(delta, o, do)
        if dq_atomic:
            dq_acc = new_dq_acc().zero_()
            dkdv(dk, dv, q, k, v, do, lse, delta, mask_arg, dq_acc)
            dq_kernel(dq, dq_acc)
        else:
            dkdv(dk, dv, q, k, v, do, lse, delta, mask_arg, None)
            dq_kernel(dq, q, k, v, do, lse, delta, mask_arg)
        return dq, dk, dv

    return launch
