"""The flash-attention kernels' launch configs: AttentionConfig, the tables by padded head dim (measured on
the H200), the choice of a launch's forward and backward configs, and the alternatives the sweep times.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch


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
# E = 64 dK/dV takes its programs head by head (head_major, attention_grid.head_major_program): in launch
# order the programs running at once were one key block of 132 different heads, each streaming its own head's Q and
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
# (past the L2 at B * S = 16k tokens); head by head (`attention_grid.query_program`'s HEAD_MAJOR) they are the query
# blocks of a few heads, sharing them. That pays where the batch has at least two query heads per SM. Session 27
# (H200, .scratch/hm_probe.py, interleaved, whole backward x torch's flash, fp16, launch order -> head major), E =
# 64: S = 1k (B * H = 512) 0.926 -> 0.963, causal 1.016 -> 1.052; S = 2k (256) 0.895 -> 0.895, causal 0.961 ->
# 0.961; S = 4k / 8k 0.88 / 0.87 -> 0.88 / 0.865, causal 0.93 / 0.89 -> 0.92 / 0.87; E = 128: S = 1k (256) 1.094 ->
# 1.099, causal 1.100 -> 1.110; S = 4k / 8k 1.05 / 1.01 -> 1.01 / 1.00, causal 1.04 / 1.03 -> 1.01 / 0.99. The
# forward, head major: E = 64 S = 1k 0.902 -> 0.919, slower elsewhere (by up to 9% with causal).
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
# its two loops: 144 bytes, see attention_backward_kernels._dkdv_step). Whole backward x flash
# (.scratch/s33/bwd_probe.py, interleaved, S = 2k / 4k, not causal | causal): 0.972 / 0.945 | 0.998 / 0.947 -> 1.038
# / 1.016 | 1.011 / 0.958 (E = 128, S = 4k: 1.03 | 1.03 -> 1.06 | 1.03).
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
    (`length_k`) and where q, k and v rows are read in 16-byte vectors (`vector_rows`: the launcher passes the
    function `reads_vector_rows` of each; the cp.async ring; else their tiles go through registers, which the two-CTA
    tiles' 128-register cap spills: 132-468 bytes at E = 36-124 off 16-byte rows), else FORWARD_CONFIGS."""
    key = _table_key(block_e, block_ev)
    two_cta = TWO_CTA_FORWARD_CONFIGS.get(key)
    if two_cta is None or masked or not wgmma or not vector_rows or length_k > TWO_CTA_MAX_KEYS.get(key, length_k):
        return FORWARD_CONFIGS[key]
    return two_cta


def reads_vector_rows(t: torch.Tensor) -> bool:
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
