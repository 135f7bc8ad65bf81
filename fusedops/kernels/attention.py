"""Flash attention (FlashAttention-2, Dao 2023, arXiv:2307.08691): the DSL kernels for the forward
pass and the backward pass, and their launchers.

    q: (B, H, L, E)    k: (B, H_kv, S, E)    v: (B, H_kv, S, Ev)    o: (B, H, L, Ev)
    lse: (B, H, L) float32        mask (optional): broadcastable to (B, H, L, S)

Every tensor is read with its own strides (int64 offsets), so transposed, sliced and expanded
(stride 0) views are read in place. H is a multiple of H_kv: query head h reads key/value head
h // (H // H_kv) (grouped-query attention; H_kv = H is plain multi-head attention).

Numerics. Logits are computed in the base-2 domain: s2 = (q . k) * qk_scale with
qk_scale = scale * log2(e), so that softmax(scale * q k^T) = exp2(s2 - max) / sum(...) uses the
`ex2` instruction directly (an additive float mask is multiplied by log2(e) too). The running
maximum m_i and sum l_i are kept in float32 (float64 for float64 inputs in the interpreter); P is
cast to the input dtype before the P @ V tensor-core dot, as FlashAttention does.
The scales are passed as float32 pairs (hi, lo) summed in the kernel's accumulation dtype: float
kernel arguments are float32, and the float64 interpreter runs (gradcheck) need more precision.

Saved statistics. `lse[b, h, i] = m_i + log2(l_i)` is the log-sum-exp of row i *in base 2*
(log2(sum_j exp2(s2_ij))); the natural-log LSE is lse * ln(2). The backward pass recomputes
P = exp2(s2 - lse) from it.

Masks.
  - causal: top-left aligned, as torch's `is_causal` (torch.ones(L, S).tril()): query i sees keys
    j <= i, also when L != S. Key blocks entirely past the diagonal are skipped.
  - attn_mask: boolean (True = keep) or additive float, loaded block by block with its broadcast
    strides (0 for broadcast dims). Causal and attn_mask may be combined (logical and).
  - ragged edges: keys >= S get -inf; rows >= L and head-dim columns >= E are masked loads/stores,
    so any L, S, E <= 256 work (E is padded to the next power of two, BLOCK_E).
  - fully masked rows (every key masked by attn_mask): the output row is 0 (torch's behaviour) and
    lse = +inf, which makes the recomputed P of that row 0, so its gradients are 0 and finite.

Backward. Three kernels, no atomics, deterministic:
  1. `attention_backward_preprocess_kernel`: delta_i = rowsum(dO * O) (float32).
  2. `attention_backward_dkdv_kernel`: one program per (key block, batch, kv head); loops over the
     query heads of its group and over the query blocks, recomputing P^T from K, Q and lse:
     dV += P^T dO, dP^T = V dO^T, dS^T = P^T * (dP^T - delta), dK += dS^T Q.
  3. `attention_backward_dq_kernel`: one program per (query block, batch, head); loops over the key
     blocks: dQ += dS K.
  (dK and dQ are multiplied by `scale` at the end; ds is the gradient of the natural-log logits.)

Grids put batch * heads on axis 0 (up to 2**31 - 1 programs) and the query (or key) blocks on axis
1 (at most 65535, i.e. sequences up to 65535 * BLOCK_M).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

import fusedops.dsl as dsl
from fusedops.dsl.language.dtypes import to_torch

LOG2E = 1.4426950408889634
MAX_HEAD_DIM = 256
MAX_GRID_Y = 65535

# attn_mask kinds (the MASK_KIND constexpr)
NO_MASK, BOOL_MASK, ADDITIVE_MASK = 0, 1, 2


@dsl.jit
def _apply_masks(s, qi, kj, L, S, mask_ptr, stride_mm, stride_mn,
                 MASK_KIND: dsl.constexpr, CAUSAL: dsl.constexpr, CHECK_KEYS: dsl.constexpr):
    # s: base-2 logits block; qi / kj: query / key index blocks that broadcast to s's shape (either
    # orientation: s or s^T). mask_ptr is already offset to this (batch, head).
    if MASK_KIND == 1:
        keep = dsl.load(mask_ptr + qi.to(dsl.int64) * stride_mm + kj.to(dsl.int64) * stride_mn,
                        mask=(qi < L) & (kj < S), other=0)
        s = dsl.where(keep != 0, s, -float("inf"))
    elif MASK_KIND == 2:
        bias = dsl.load(mask_ptr + qi.to(dsl.int64) * stride_mm + kj.to(dsl.int64) * stride_mn,
                        mask=(qi < L) & (kj < S), other=0.0)
        s = s + bias.to(s.dtype) * 1.4426950408889634
    if CAUSAL:
        s = dsl.where(kj <= qi, s, -float("inf"))
    if CHECK_KEYS:
        s = dsl.where(kj < S, s, -float("inf"))
    return s


@dsl.jit
def _query_program(H, GROUP):
    """(batch * heads index, batch, head, kv head, query block) of a program on the grid
    (B * H, cdiv(L, BLOCK_M)); batch and heads as int64 offsets. The last query blocks have the most keys under a causal mask: they run first."""
    bh = dsl.program_id(0)
    pid_m = dsl.num_programs(1) - 1 - dsl.program_id(1)
    b = (bh // H).to(dsl.int64)
    h = bh % H
    kvh = (h // GROUP).to(dsl.int64)
    return bh, b, h.to(dsl.int64), kvh, pid_m


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
        CAUSAL: dsl.constexpr, MASK_KIND: dsl.constexpr, ACC: dsl.constexpr):
    # o_ptr: (B, H, L, EV); lse_ptr: (B * H, L) contiguous ACC; q_ptr: (B, H, L, E);
    # k_ptr: (B, H // GROUP, S, E); v_ptr: (B, H // GROUP, S, EV); mask_ptr: (B, H, L, S) strides
    # (0 on broadcast dims) or unused. Grid: (B * H, cdiv(L, BLOCK_M)).
    qk_scale = qk_scale_hi.to(ACC) + qk_scale_lo.to(ACC)
    bh, b, h, kvh, pid_m = _query_program(H, GROUP)

    rm = pid_m * BLOCK_M + dsl.arange(0, BLOCK_M)
    rn0 = dsl.arange(0, BLOCK_N)
    re = dsl.arange(0, BLOCK_E)
    rev = dsl.arange(0, BLOCK_EV)
    q = dsl.load(q_ptr + b * stride_qb + h * stride_qh + rm.to(dsl.int64)[:, None] * stride_qm + re[None, :] * stride_qe,
                 mask=(rm[:, None] < L) & (re[None, :] < E), other=0.0)
    k_base = k_ptr + b * stride_kb + kvh * stride_kh + re[:, None] * stride_ke
    v_base = v_ptr + b * stride_vb + kvh * stride_vh + rev[None, :] * stride_ve
    mask_base = mask_ptr + b * stride_mb + h * stride_mh

    m_i = dsl.full((BLOCK_M,), -float("inf"), ACC)
    l_i = dsl.zeros((BLOCK_M,), ACC)
    acc = dsl.zeros((BLOCK_M, BLOCK_EV), ACC)
    end_n = S
    if CAUSAL:
        end_n = dsl.minimum(S, (pid_m + 1) * BLOCK_M)      # keys past the diagonal: skipped
    for start_n in range(0, end_n, BLOCK_N):
        rn = start_n + rn0
        kt = dsl.load(k_base + rn.to(dsl.int64)[None, :] * stride_kn, mask=(re[:, None] < E) & (rn[None, :] < S),
                      other=0.0)
        s = dsl.dot(q, kt, dsl.zeros((BLOCK_M, BLOCK_N), ACC)) * qk_scale
        s = _apply_masks(s, rm[:, None], rn[None, :], L, S, mask_base, stride_mm, stride_mn,
                         MASK_KIND, CAUSAL, True)
        m_new = dsl.maximum(m_i, dsl.max(s, axis=1))
        # a row with every key so far masked has m_new = -inf: subtract 0 instead (p = 0, no NaN)
        m_safe = dsl.where(m_new == -float("inf"), 0.0, m_new)
        p = dsl.exp2(s - m_safe[:, None])
        alpha = dsl.exp2(m_i - m_safe)
        l_i = l_i * alpha + dsl.sum(p, axis=1)
        v = dsl.load(v_base + rn.to(dsl.int64)[:, None] * stride_vn, mask=(rn[:, None] < S) & (rev[None, :] < EV),
                     other=0.0)
        acc = dsl.dot(p.to(v_ptr.dtype.element), v, acc * alpha[:, None])
        m_i = m_new

    empty = l_i == 0.0                                       # fully masked row (or S = 0)
    acc = acc / dsl.where(empty, 1.0, l_i)[:, None]
    lse = dsl.where(empty, float("inf"), m_i + dsl.log2(dsl.where(empty, 1.0, l_i)))
    dsl.store(lse_ptr + bh.to(dsl.int64) * L + rm, lse, mask=rm < L)
    o = o_ptr + b * stride_ob + h * stride_oh + rm.to(dsl.int64)[:, None] * stride_om + rev[None, :] * stride_oe
    dsl.store(o, acc.to(o_ptr.dtype.element), mask=(rm[:, None] < L) & (rev[None, :] < EV))


@dsl.jit
def attention_backward_preprocess_kernel(
        delta_ptr, o_ptr, do_ptr,
        stride_ob, stride_oh, stride_om, stride_oe,
        stride_dob, stride_doh, stride_dom, stride_doe,
        H, L, EV, BLOCK_M: dsl.constexpr, BLOCK_EV: dsl.constexpr, ACC: dsl.constexpr):
    # delta_ptr: (B * H, L) contiguous ACC; o_ptr, do_ptr: (B, H, L, EV). Grid: (B * H, cdiv(L, BLOCK_M)).
    bh = dsl.program_id(0)
    b = (bh // H).to(dsl.int64)
    h = (bh % H).to(dsl.int64)
    rm = dsl.program_id(1) * BLOCK_M + dsl.arange(0, BLOCK_M)
    rev = dsl.arange(0, BLOCK_EV)
    mask = (rm[:, None] < L) & (rev[None, :] < EV)
    rows = rm.to(dsl.int64)[:, None]
    o = dsl.load(o_ptr + b * stride_ob + h * stride_oh + rows * stride_om + rev[None, :] * stride_oe,
                 mask=mask, other=0.0)
    do = dsl.load(do_ptr + b * stride_dob + h * stride_doh + rows * stride_dom + rev[None, :] * stride_doe,
                  mask=mask, other=0.0)
    delta = dsl.sum(o.to(ACC) * do.to(ACC), axis=1)
    dsl.store(delta_ptr + bh.to(dsl.int64) * L + rm, delta, mask=rm < L)


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
        CAUSAL: dsl.constexpr, MASK_KIND: dsl.constexpr, ACC: dsl.constexpr):
    # dk_ptr, k_ptr: (B, H_KV, S, E); dv_ptr, v_ptr: (B, H_KV, S, EV); q_ptr: (B, H, L, E);
    # do_ptr: (B, H, L, EV); lse_ptr, delta_ptr: (B * H, L) contiguous ACC. H = H_KV * GROUP.
    # Grid: (B * H_KV, cdiv(S, BLOCK_N)). The program sums the contributions of the GROUP query heads.
    qk_scale = qk_scale_hi.to(ACC) + qk_scale_lo.to(ACC)
    bhk = dsl.program_id(0)
    pid_n = dsl.program_id(1)
    b = (bhk // H_KV).to(dsl.int64)
    kvh = bhk % H_KV
    rn = pid_n * BLOCK_N + dsl.arange(0, BLOCK_N)
    rm0 = dsl.arange(0, BLOCK_M)
    re = dsl.arange(0, BLOCK_E)
    rev = dsl.arange(0, BLOCK_EV)
    rows_n = rn.to(dsl.int64)[:, None]
    k = dsl.load(k_ptr + b * stride_kb + kvh.to(dsl.int64) * stride_kh + rows_n * stride_kn + re[None, :] * stride_ke,
                 mask=(rn[:, None] < S) & (re[None, :] < E), other=0.0)
    v = dsl.load(v_ptr + b * stride_vb + kvh.to(dsl.int64) * stride_vh + rows_n * stride_vn + rev[None, :] * stride_ve,
                 mask=(rn[:, None] < S) & (rev[None, :] < EV), other=0.0)
    dk = dsl.zeros((BLOCK_N, BLOCK_E), ACC)
    dv = dsl.zeros((BLOCK_N, BLOCK_EV), ACC)
    start_m = 0
    if CAUSAL:
        start_m = (pid_n * BLOCK_N) // BLOCK_M * BLOCK_M    # earlier queries see none of these keys
    for g in range(0, GROUP):
        h = (kvh * GROUP + g).to(dsl.int64)
        bh = b * (H_KV * GROUP) + h
        qt_base = q_ptr + b * stride_qb + h * stride_qh + re[:, None] * stride_qe
        do_base = do_ptr + b * stride_dob + h * stride_doh + rev[None, :] * stride_doe
        mask_base = mask_ptr + b * stride_mb + h * stride_mh
        for m0 in range(start_m, L, BLOCK_M):
            rm = m0 + rm0
            qt = dsl.load(qt_base + rm.to(dsl.int64)[None, :] * stride_qm, mask=(re[:, None] < E) & (rm[None, :] < L),
                          other=0.0)
            st = dsl.dot(k, qt, dsl.zeros((BLOCK_N, BLOCK_M), ACC)) * qk_scale
            st = _apply_masks(st, rm[None, :], rn[:, None], L, S, mask_base, stride_mm, stride_mn,
                              MASK_KIND, CAUSAL, False)
            # rows past L (and fully masked rows) have lse = +inf: their P is 0
            lse = dsl.load(lse_ptr + bh * L + rm, mask=rm < L, other=float("inf"))
            pt = dsl.exp2(st - lse[None, :])
            do = dsl.load(do_base + rm.to(dsl.int64)[:, None] * stride_dom, mask=(rm[:, None] < L) & (rev[None, :] < EV),
                          other=0.0)
            dv = dsl.dot(pt.to(do_ptr.dtype.element), do, dv)
            dpt = dsl.dot(v, dsl.trans(do), dsl.zeros((BLOCK_N, BLOCK_M), ACC))
            delta = dsl.load(delta_ptr + bh * L + rm, mask=rm < L, other=0.0)
            dst = pt * (dpt - delta[None, :])
            dk = dsl.dot(dst.to(q_ptr.dtype.element), dsl.trans(qt), dk)
    dk = dk * (scale_hi.to(ACC) + scale_lo.to(ACC))
    dsl.store(dk_ptr + b * stride_dkb + kvh.to(dsl.int64) * stride_dkh + rows_n * stride_dkn + re[None, :] * stride_dke,
              dk.to(dk_ptr.dtype.element), mask=(rn[:, None] < S) & (re[None, :] < E))
    dsl.store(dv_ptr + b * stride_dvb + kvh.to(dsl.int64) * stride_dvh + rows_n * stride_dvn + rev[None, :] * stride_dve,
              dv.to(dv_ptr.dtype.element), mask=(rn[:, None] < S) & (rev[None, :] < EV))


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
        CAUSAL: dsl.constexpr, MASK_KIND: dsl.constexpr, ACC: dsl.constexpr):
    # dq_ptr, q_ptr: (B, H, L, E); k_ptr: (B, H // GROUP, S, E); v_ptr: (B, H // GROUP, S, EV);
    # do_ptr: (B, H, L, EV); lse_ptr, delta_ptr: (B * H, L) contiguous ACC. Grid: (B * H, cdiv(L, BLOCK_M)).
    qk_scale = qk_scale_hi.to(ACC) + qk_scale_lo.to(ACC)
    bh, b, h, kvh, pid_m = _query_program(H, GROUP)
    rm = pid_m * BLOCK_M + dsl.arange(0, BLOCK_M)
    rn0 = dsl.arange(0, BLOCK_N)
    re = dsl.arange(0, BLOCK_E)
    rev = dsl.arange(0, BLOCK_EV)
    rows_m = rm.to(dsl.int64)[:, None]
    q = dsl.load(q_ptr + b * stride_qb + h * stride_qh + rows_m * stride_qm + re[None, :] * stride_qe,
                 mask=(rm[:, None] < L) & (re[None, :] < E), other=0.0)
    do = dsl.load(do_ptr + b * stride_dob + h * stride_doh + rows_m * stride_dom + rev[None, :] * stride_doe,
                  mask=(rm[:, None] < L) & (rev[None, :] < EV), other=0.0)
    lse = dsl.load(lse_ptr + bh.to(dsl.int64) * L + rm, mask=rm < L, other=float("inf"))
    delta = dsl.load(delta_ptr + bh.to(dsl.int64) * L + rm, mask=rm < L, other=0.0)
    kt_base = k_ptr + b * stride_kb + kvh * stride_kh + re[:, None] * stride_ke
    vt_base = v_ptr + b * stride_vb + kvh * stride_vh + rev[:, None] * stride_ve
    mask_base = mask_ptr + b * stride_mb + h * stride_mh
    dq = dsl.zeros((BLOCK_M, BLOCK_E), ACC)
    end_n = S
    if CAUSAL:
        end_n = dsl.minimum(S, (pid_m + 1) * BLOCK_M)
    for start_n in range(0, end_n, BLOCK_N):
        rn = start_n + rn0
        cols = rn.to(dsl.int64)[None, :]
        kt = dsl.load(kt_base + cols * stride_kn, mask=(re[:, None] < E) & (rn[None, :] < S), other=0.0)
        s = dsl.dot(q, kt, dsl.zeros((BLOCK_M, BLOCK_N), ACC)) * qk_scale
        s = _apply_masks(s, rm[:, None], rn[None, :], L, S, mask_base, stride_mm, stride_mn,
                         MASK_KIND, CAUSAL, True)
        p = dsl.exp2(s - lse[:, None])
        vt = dsl.load(vt_base + cols * stride_vn, mask=(rev[:, None] < EV) & (rn[None, :] < S), other=0.0)
        dp = dsl.dot(do, vt, dsl.zeros((BLOCK_M, BLOCK_N), ACC))
        ds = p * (dp - delta[:, None])
        dq = dsl.dot(ds.to(k_ptr.dtype.element), dsl.trans(kt), dq)
    dq = dq * (scale_hi.to(ACC) + scale_lo.to(ACC))
    dsl.store(dq_ptr + b * stride_dqb + h * stride_dqh + rows_m * stride_dqm + re[None, :] * stride_dqe,
              dq.to(dq_ptr.dtype.element), mask=(rm[:, None] < L) & (re[None, :] < E))


# ------------------------------------------------------------------------------------------------
# launchers
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class AttentionConfig:
    """Tile sizes and launch parameters of one attention kernel."""
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


# Interpreter: small tiles keep the per-program op count (and so CPU test time) low.
INTERPRETER_CONFIG = AttentionConfig(16, 16, 4, 1)


def head_block(dim: int) -> int:
    """The padded head-dim block: the next power of two >= dim, at least 16 (one mma k-step)."""
    return max(16, 1 << max(0, dim - 1).bit_length())


def forward_config(block_e: int, block_ev: int) -> AttentionConfig:
    """The forward tile for padded head dims (BLOCK_E, BLOCK_EV) on sm_80/sm_90 (mma.sync)."""
    widest = max(block_e, block_ev)
    if widest <= 128:
        return AttentionConfig(128, 64, 8, 3)
    return AttentionConfig(64, 32, 8, 2)


def backward_configs(block_e: int, block_ev: int) -> tuple:
    """(dK/dV kernel config, dQ kernel config) for padded head dims; the preprocessing kernel uses
    the dQ kernel's BLOCK_M. Every pair assembles for sm_90a without spills (tests/test_attention.py)."""
    widest = max(block_e, block_ev)
    if widest <= 64:
        return AttentionConfig(64, 64, 8, 2), AttentionConfig(64, 64, 4, 2)
    if widest <= 128:
        return AttentionConfig(32, 64, 8, 2), AttentionConfig(64, 64, 8, 2)
    return AttentionConfig(32, 32, 8, 1), AttentionConfig(32, 32, 8, 1)


def _interpret(interpret: Optional[bool]) -> bool:
    if interpret is None:
        from fusedops.dsl.runtime import knobs
        return knobs.interpret_enabled()
    return interpret


def _acc_dtype(q: torch.Tensor):
    return dsl.float64 if q.dtype == torch.float64 else dsl.float32


def _mask_arguments(mask: Optional[torch.Tensor], like: torch.Tensor) -> tuple:
    """(tensor, 4 strides, MASK_KIND) for a mask already expanded to (B, H, L, S), or no mask."""
    if mask is None:
        return like, (0, 0, 0, 0), NO_MASK
    if mask.dtype == torch.bool:       # read as bytes (0 = masked): one byte per element either way
        return mask.view(torch.uint8), _strides(mask), BOOL_MASK
    return mask, _strides(mask), ADDITIVE_MASK


def _strides(t: torch.Tensor) -> tuple:
    # a dim of size 1 is never stepped over; 0 keeps int arguments small and specializable
    return tuple(st if n > 1 else 0 for st, n in zip(t.stride(), t.shape))


def _float_pair(x: float) -> tuple:
    """(hi, lo) float32 values with hi + lo = x to ~48 bits: float kernel arguments are float32, and
    the float64 interpreter runs (gradcheck) need the scale to more than float32 precision."""
    import numpy as np
    hi = float(np.float32(x))
    return hi, float(np.float32(x - hi))


def _check_grid(blocks: int, what: str) -> None:
    if blocks > MAX_GRID_Y:
        raise ValueError(f"{what} needs {blocks} blocks, over CUDA's grid limit of {MAX_GRID_Y}")


def attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor],
                      causal: bool, scale: float, *, interpret: Optional[bool] = None,
                      config: Optional[AttentionConfig] = None) -> tuple:
    """Flash attention forward: returns (o, lse).

    q: (B, H, L, E); k: (B, H_kv, S, E); v: (B, H_kv, S, Ev), one dtype (float16/bfloat16 on the GPU;
    the interpreter also runs float32/float64), H a multiple of H_kv, any strides. mask: None or a
    bool / float tensor *expanded* to (B, H, L, S) (stride 0 on broadcast dims). scale multiplies
    q . k. Returns o: (B, H, L, Ev) contiguous in q's dtype, and lse: (B, H, L) float32 (float64 for
    float64 inputs), the base-2 log-sum-exp of each row's logits (+inf for fully masked rows).
    """
    batch, heads, length_q, dim = q.shape
    heads_kv, length_k, dim_v = k.shape[1], k.shape[2], v.shape[3]
    interpret = _interpret(interpret)
    acc = _acc_dtype(q)
    o = torch.empty((batch, heads, length_q, dim_v), dtype=q.dtype, device=q.device)
    lse = torch.empty((batch, heads, length_q), dtype=to_torch(acc), device=q.device)
    if o.numel() == 0 and lse.numel() == 0:
        return o, lse
    block_e, block_ev = head_block(dim), head_block(dim_v)
    config = config or (INTERPRETER_CONFIG if interpret else forward_config(block_e, block_ev))
    blocks = -(-length_q // config.block_m)
    _check_grid(blocks, f"a query length of {length_q}")
    mask_arg, mask_strides, mask_kind = _mask_arguments(mask, q)
    attention_forward_kernel[(batch * heads, blocks)](
        o, lse, q, k, v, mask_arg, *_strides(q), *_strides(k), *_strides(v), *_strides(o), *mask_strides,
        heads, heads // heads_kv, length_q, length_k, dim, dim_v, *_float_pair(float(scale) * LOG2E),
        BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_E=block_e, BLOCK_EV=block_ev,
        CAUSAL=bool(causal), MASK_KIND=mask_kind, ACC=acc,
        num_warps=config.num_warps, num_stages=config.num_stages, interpret=interpret)
    return o, lse


def attention_backward(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                       lse: torch.Tensor, mask: Optional[torch.Tensor], causal: bool, scale: float, *,
                       interpret: Optional[bool] = None, configs: Optional[tuple] = None) -> tuple:
    """Flash attention backward: returns (dq, dk, dv), contiguous, shaped and typed like q, k, v.

    do: (B, H, L, Ev), any strides; q, k, v, mask, causal, scale as given to `attention_forward`;
    o and lse are its results. Deterministic (no atomics): dK/dV of a key/value head are summed over
    the query heads of its group inside one program. `configs`: (dK/dV config, dQ config) to force.
    """
    batch, heads, length_q, dim = q.shape
    heads_kv, length_k, dim_v = k.shape[1], k.shape[2], v.shape[3]
    interpret = _interpret(interpret)
    acc = _acc_dtype(q)
    dq, dk, dv = (torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))
    if batch * heads * length_q == 0 or length_k == 0:   # nothing attends: every gradient is 0
        return dq.zero_(), dk.zero_(), dv.zero_()
    block_e, block_ev = head_block(dim), head_block(dim_v)
    configs = configs or ((INTERPRETER_CONFIG,) * 2 if interpret else backward_configs(block_e, block_ev))
    kv_config, q_config = configs
    blocks_m, blocks_n = -(-length_q // q_config.block_m), -(-length_k // kv_config.block_n)
    _check_grid(max(blocks_m, blocks_n), f"sequence lengths ({length_q}, {length_k})")
    delta = torch.empty((batch, heads, length_q), dtype=to_torch(acc), device=q.device)
    mask_arg, mask_strides, mask_kind = _mask_arguments(mask, q)
    common = dict(BLOCK_E=block_e, BLOCK_EV=block_ev, CAUSAL=bool(causal), MASK_KIND=mask_kind, ACC=acc,
                  interpret=interpret)
    attention_backward_preprocess_kernel[(batch * heads, blocks_m)](
        delta, o, do, *_strides(o), *_strides(do), heads, length_q, dim_v,
        BLOCK_M=q_config.block_m, BLOCK_EV=block_ev, ACC=acc, num_warps=4, interpret=interpret)
    scales = (*_float_pair(float(scale) * LOG2E), *_float_pair(float(scale)))
    attention_backward_dkdv_kernel[(batch * heads_kv, blocks_n)](
        dk, dv, q, k, v, do, lse, delta, mask_arg,
        *_strides(q), *_strides(k), *_strides(v), *_strides(do), *_strides(dk), *_strides(dv), *mask_strides,
        heads_kv, heads // heads_kv, length_q, length_k, dim, dim_v, *scales,
        BLOCK_M=kv_config.block_m, BLOCK_N=kv_config.block_n, num_warps=kv_config.num_warps,
        num_stages=kv_config.num_stages, **common)
    attention_backward_dq_kernel[(batch * heads, blocks_m)](
        dq, q, k, v, do, lse, delta, mask_arg,
        *_strides(q), *_strides(k), *_strides(v), *_strides(do), *_strides(dq), *mask_strides,
        heads, heads // heads_kv, length_q, length_k, dim, dim_v, *scales,
        BLOCK_M=q_config.block_m, BLOCK_N=q_config.block_n, num_warps=q_config.num_warps,
        num_stages=q_config.num_stages, **common)
    return dq, dk, dv
