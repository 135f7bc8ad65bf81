"""The flash-attention forward kernel: one program per (query block, batch, head), an online softmax over the
key blocks, software-pipelined by one block.

Shapes, numerics, the saved statistics (lse) and masks: fusedops/kernels/attention.py's module docstring; the
kernel's launch: attention.attention_forward.
"""

from __future__ import annotations

import fusedops.dsl as dsl
from fusedops.kernels.attention_grid import query_program
from fusedops.kernels.attention_logits import apply_masks, base2_logits, unmasked_key_end


@dsl.jit
def _online_softmax(s, m_i, l_i, rm, rn, L, S, mask_base, stride_mm, stride_mn, qk_scale,
                    IN_DTYPE: dsl.constexpr, MASK_KIND: dsl.constexpr, CAUSAL: dsl.constexpr, MASKED: dsl.constexpr):
    """(P, alpha, m_new, l_new) of the key block whose q . k are `s` (the rows' running max m_i and sum l_i
    before it): P = exp2(s2 - m_new) of the base-2 logits s2, alpha = exp2(m_i - m_new) the factor of the
    earlier blocks. MASKED = False (an interior block, see `unmasked_key_end`): no mask is computed."""
    s = base2_logits(s, qk_scale, IN_DTYPE)
    if MASKED:
        s = apply_masks(s, rm[:, None], rn[None, :], L, S, mask_base, stride_mm, stride_mn,
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
    bh, b, h, kvh, pid_m = query_program(H, GROUP, HEAD_MAJOR)

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
    unmasked_end = unmasked_key_end(pid_m, S, BLOCK_M, BLOCK_N, MASK_KIND, CAUSAL)
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
