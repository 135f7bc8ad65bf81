"""The flash-attention backward kernels: delta = rowsum(dO * O), dK / dV (which may also add dQ with atomic
reductions), dQ, and the conversion of those atomic dQ sums.

What each computes and when which runs: the "Backward" paragraph of fusedops/kernels/attention.py's module
docstring; their launches: attention.attention_backward.
"""

from __future__ import annotations

import fusedops.dsl as dsl
from fusedops.kernels.attention_grid import head_major_program, query_program, row_tile
from fusedops.kernels.attention_logits import apply_masks, base2_logits, unmasked_key_end


@dsl.jit
def attention_backward_preprocess_kernel(
        delta_ptr, o_ptr, do_ptr,
        stride_ob, stride_oh, stride_om, stride_oe,
        stride_dob, stride_doh, stride_dom, stride_doe,
        H, L, EV, BLOCK_M: dsl.constexpr, BLOCK_EV: dsl.constexpr, ACC: dsl.constexpr):
    # delta_ptr: (B * H, L) contiguous ACC; o_ptr, do_ptr: (B, H, L, EV). Grid: (B * H, cdiv(L, BLOCK_M)).
    bh, b, h, rm, rev, mask = row_tile(H, L, EV, BLOCK_M, BLOCK_EV)
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
    st = base2_logits(st, qk_scale, qt_base.dtype.element)
    if MASK_KIND != 0:
        st = apply_masks(st, rm[None, :], rn[:, None], L, S, mask_base, stride_mm, stride_mn, MASK_KIND, CAUSAL, False)
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
    # launch order (head_major_program).
    # Query blocks: without causal or attn_mask no block needs a mask; under a causal mask the loops
    # start at the first block that reaches the diagonal, and (without attn_mask) the blocks that cross it
    # take the mask in a first loop, the rest none in a second.
    qk_scale = qk_scale_hi.to(ACC) + qk_scale_lo.to(ACC)
    if HEAD_MAJOR:
        bhk, pid_n = head_major_program()
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
    s = base2_logits(s, qk_scale, kt_base.dtype.element)
    if MASKED:
        s = apply_masks(s, rm[:, None], rn[None, :], L, S, mask_base, stride_mm, stride_mn, MASK_KIND, CAUSAL, True)
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
    bh, b, h, kvh, pid_m = query_program(H, GROUP, HEAD_MAJOR)
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
    unmasked_end = unmasked_key_end(pid_m, S, BLOCK_M, BLOCK_N, MASK_KIND, CAUSAL)
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
    bh, b, h, rm, re, mask = row_tile(H, L, E, BLOCK_M, BLOCK_E)
    acc = dsl.load(acc_ptr + bh.to(dsl.int64) * ROWS * BLOCK_E + rm.to(dsl.int64)[:, None] * BLOCK_E + re[None, :],
                   mask=mask, other=0.0)
    dq = acc * (scale_hi.to(ACC) + scale_lo.to(ACC))
    dsl.store(dq_ptr + b * stride_dqb + h * stride_dqh + rm.to(dsl.int64)[:, None] * stride_dqm
              + re.to(dsl.int64)[None, :] * stride_dqe, dq.to(dq_ptr.dtype.element), mask=mask)

