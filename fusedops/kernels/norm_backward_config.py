"""The LayerNorm/RMSNorm backward's tilings: BackwardConfig, backward_config's choice of one by row size, dtype
and op, and column_sum_tiling's of the column sums, with the measurements behind them.
"""

from __future__ import annotations

import dataclasses

import torch

import fusedops.dsl as dsl
from fusedops.dsl.ir.ops import MAX_CLUSTER_SIZE
from fusedops.kernels.norm_rows import accumulation_dtype
from fusedops.kernels.sizes import next_power_of_2


@dataclasses.dataclass(frozen=True)
class BackwardConfig:
    """Tiling of the backward.

    split=False: norm_backward_kernels.backward_fused_kernel over (block_rows, block_n) tiles of whole rows
    (block_n >= N), programs_per_sm programs per SM, each owning a contiguous group of rows.
    split=True: norm_backward_kernels.backward_partials_kernel over (block_rows, block_n) tiles of (row
    group, column chunk) with programs_per_sm programs per SM, then norm_backward_kernels.backward_input_kernel
    over (input_block_rows, input_block_n) tiles with input_num_warps.
    prefetch: the row loop loads the next row block before reducing the current one (twice the bytes
    in flight, more registers).
    persistent=True (split ignored): norm_backward_kernels.backward_persistent_kernel, programs_per_sm
    programs per SM, each walking the row tiles g, g + G, ... over a block_n-column part of the row (the
    parts of a long row go to neighbouring programs): whole rows in one pass when they fit block_n, else a
    first pass in chunk-column pieces for the row sums and a second that reads the part again (from L2) for
    dx (two_pass=True: that also for rows that fit block_n: fewer registers).
    aligned_window: as norm_forward_config.ForwardConfig's, for x, dy and dx (all of row stride N, unit
    column stride; persistent only).
    split_window=True (block_rows, block_n >= N - 1, num_warps, programs_per_sm, prefetch; the rest ignored):
    norm_split_window.backward_split_kernel, rows off 16-byte boundaries through the split window, as the
    persistent backward walks its row tiles, where it applies (x and dy of row stride N, unit column stride;
    elsewhere the launcher takes backward_config's choice without it).
    cluster=True (persistent, rows of 2 to 8 parts): the parts of a row tile go to the programs of one
    thread block cluster, which add their row sums through distributed shared memory (`dsl.cluster_sum`):
    one pass over x and dy. Needs sm_90 (elsewhere the launcher takes the two-pass persistent kernel).
    min_blocks_per_sm > 0 (persistent): launch bounds for that many CTAs per SM (ptxas caps the registers).
    """

    split: bool
    block_rows: int
    block_n: int
    num_warps: int
    programs_per_sm: int
    prefetch: bool = False
    input_block_rows: int = 1
    input_block_n: int = 1
    input_num_warps: int = 4
    persistent: bool = False
    aligned_window: bool = False
    chunk: int = 4096
    two_pass: bool = False
    split_window: bool = False
    cluster: bool = False
    min_blocks_per_sm: int = 0


# 16-bit rows of the fused backward, (block_rows, num_warps) by padded row size, over the formula of
# backward_config (1 row of 4 warps at both). H200, fp16, M=8192, kernels alone, x torch's backward kernels
# (session 6, two runs): 1024: LayerNorm 1.96x -> 2.13x, RMSNorm 1.99x -> 2.33x; 2048: 1.87x -> 1.94x,
# 2.00x -> 2.02x (the programs per SM and the prefetch follow the warps as in the formula).
_HALF_BACKWARD_TILES = {1024: (2, 4), 2048: (2, 8)}


# 16-bit rows off 16-byte boundaries whose split-window main tile (the power of two at or above N - 1) is a
# key here take the split-window backward (BackwardConfig.split_window): (num_warps, programs_per_sm,
# prefetch) by op (subtract_mean). H200, fp16, M=8192, kernels alone, x torch's backward (session 14,
# .scratch/split_probe.py), before (the fused backward, 2-byte accesses, a 2 * N-column tile past 2048) ->
# this: LayerNorm 777 1.16x -> 1.82x, 1023 1.02x -> 1.84x, 1025 0.96x -> 1.87x, 2049 0.74x -> 1.66x, 3001
# 0.76x -> 1.38x, 4097 0.53x -> 1.55x; RMSNorm 777 2.73x -> 3.67x, 1023 2.30x -> 3.48x (4 warps; 2 warps
# spilled in bfloat16), 2049 0.96x -> 1.65x, 3001 0.84x -> 1.55x, 4097 0.66x -> 1.77x (bench/layernorm.py,
# CUDA graphs: LayerNorm 2049 1.66x, 4097 1.55x; RMSNorm 4097 1.76x).
_HALF_SPLIT_WINDOW_BACKWARD = {
    True: {1024: (2, 4, True), 2048: (8, 2, True), 4096: (4, 2, False)},
    False: {1024: (4, 4, True), 2048: (8, 2, True), 4096: (4, 2, False)},
}


def backward_config(n_cols: int, dtype: torch.dtype, *, subtract_mean: bool = True,
                    split_window: bool = True, clusters: bool = True) -> BackwardConfig:
    """The fused backward while the padded row is at most 16 KiB of input (8192 16-bit, 4096 float32,
    2048 float64 columns) at 16 columns per thread (8 for float64): it keeps about eight registers per
    column (x, dy, their products and the two column sums). Longer rows take the split backward.

    16-bit rows of 514 to 4097 columns that are not a multiple of 8 take the split-window backward
    (`_HALF_SPLIT_WINDOW_BACKWARD`). 16-bit rows of 4097 to 8192 columns, a multiple of 8, take the
    persistent backward (whole rows, programs walking strided row tiles), shorter ones the fused
    backward. H200, fp16, M=8192, the kernels alone (CUDA events, L2 flushed; 2026-11-30, two runs), ms,
    fused vs persistent: LayerNorm N=1024 0.032 vs 0.038, 2048 0.045 vs 0.059, 4096 0.069 vs 0.079, 8192
    0.189 vs 0.161; RMSNorm 1024 0.028 vs 0.034, 2048 0.038 vs 0.043, 4096 0.064 vs 0.075, 8192 0.139 vs
    0.141 (equal: one path for both ops, the persistent). Odd N past 4097 stays fused (at 4097 an earlier run, not on this footing, had
    the persistent slower), and so do longer rows (the two-pass persistent variants were slower than the
    split backward).
    Session 6 (.scratch/ln_bwd_sweep.py, same footing, x torch's backward kernels): 16-bit rows of 1024
    and 2048 take 2 rows per tile (`_HALF_BACKWARD_TILES`); the persistent backward at 8192 prefetches the
    next row (LayerNorm 1.65x -> 1.91x, RMSNorm 1.93x -> 2.42x); at 4096 no candidate beat the formula. The persistent
    backward through the aligned window was 1.2-5x slower than the shipped kernels at 4097 and 12289, and
    the persistent kernel over column parts 1.1-2x slower than the split backward at 16384 and 32768.
    Session 15 (.scratch/cluster_probe*.py, x torch's, interleaved CUDA events): 16-bit rows of 8193..32768
    columns, a multiple of 8 and where the GPU has clusters (`clusters`), take the persistent backward
    in clusters (BackwardConfig.cluster), one pass over x and dy: 4096-column parts, 8 warps, 2 CTAs per
    SM (launch bounds), RMSNorm with the next row prefetched; LayerNorm's 16384 columns in two 8192-column
    halves of 16 warps with the prefetch (its 4096-column parts 1.67x; prefetching there spilled). Split
    backward -> clusters, fp16 (bf16 alike): LayerNorm 16384 1.14x -> 1.76x, 32768 1.20x -> 1.67x;
    RMSNorm 1.63x -> 2.09-2.16x, 1.70x -> 2.12-2.20x. Rows of 8193..32761 columns off 16-byte boundaries
    (N % 8 != 0) take 4096-column parts of the aligned window (N + 7 window positions at most), the next
    row prefetched: 12289 LayerNorm 0.76x -> 1.17x, RMSNorm 0.78x -> 1.41x (8192-column halves 0.92x /
    1.18x; before the loop-carried 16-bit pairs of codegen/control.py they were 0.43-0.55x). Session 25
    (.scratch/ln_probe.py, graphs, interleaved): those of up to 8 * 2048 - 7 columns now take 2048-column
    parts of 4 warps, 4 CTAs per SM (LayerNorm 12289 1.25x -> 1.35x; session 15 had measured them slower,
    before the kernels' later changes). Not taken: 2-row tiles, a weight reloaded per row, and clusters for rows of
    up to 8192 columns (1024..8192: 0.7-0.95 of the shipped kernels' speed).
    Session 22 (.scratch/probe_c.py, interleaved CUDA events, x torch's backward kernels), with dx computed
    from x and dy (norm_backward_kernels._input_gradient): 16-bit rows of 16384 columns, both ops, take
    2048-column parts (8 per cluster, 4 warps, 4 CTAs per SM, prefetch): LayerNorm 1.60x (8192-column halves) /
    1.73x (4096-column parts) -> 1.78x, RMSNorm 2.11x -> 2.19x; LayerNorm's 32768 prefetches too (1.64x -> 1.71x,
    20 bytes spilled). dx re-read from L1/L2 after the row sums instead of kept (no spill) was 5-15% slower.
    Session 29 (bench/layernorm.py, graphs, fp16 / bf16): the aligned window's per-element masks computed once
    per program instead of per tile (norm_backward_kernels._placed_window_loads; ptxas spill 120 -> 72 bytes at
    12289): 12289 LayerNorm 1.35x / 1.30x -> 1.42x / 1.40x, RMSNorm 1.58x / 1.53x -> 1.71x / 1.66x; still 0.42 of a
    copy's bandwidth against 0.64 for 12288 columns (6 parts, no window): the window's partial vectors are
    per-element predicated loads (codegen/memory.py) that ptxas cannot keep in 128 registers. Not taken
    (same run): those partial loads behind a branch (12289 LayerNorm 1.34x -> 1.17x), 3 CTAs per SM or no
    launch bounds (0.33-0.34 of a copy against 0.41). At 4096 columns (fp16 LayerNorm, interleaved with a copy)
    none of 34 other fused / persistent configs (1 or 2 rows, 4-16 warps, 1-4 programs per SM, prefetch or
    not) beat this one (67.8 us; the next 69.0 us); its dweight / dbias partials and their column sums cost
    8.3 of its 67.5 us (dx alone 59.2 us, 0.89 of a copy): the lead for the last 5% to 2x torch's there.
    Session 42 (H100, fp16, M=8192, CUDA graph, x torch's backward, .scratch/s42/probe_bwd.py): the clusters'
    rows off 16-byte boundaries read whole 16-byte vectors in cdiv(N - 1, block_n) parts and the window's edges in
    part 0 (norm_backward_kernels.backward_persistent_kernel's EDGES) instead of per-element masked window parts:
    12289 LayerNorm 1.67x -> 2.11x (364 -> 289 us; 12288 columns, no window: 249 us), RMSNorm 1.91x -> 2.25x;
    10001 2.14x / 2.27x; 16383 2.06x / 2.22x."""
    if split_window and dtype.itemsize == 2 and n_cols % 8 != 0 and n_cols > 1:
        choice = _HALF_SPLIT_WINDOW_BACKWARD[subtract_mean].get(next_power_of_2(n_cols - 1))
        if choice is not None:
            num_warps, per_sm, prefetch = choice
            return BackwardConfig(split=False, block_rows=1, block_n=next_power_of_2(n_cols - 1),
                                  num_warps=num_warps, programs_per_sm=per_sm, prefetch=prefetch, split_window=True)
    block_n = next_power_of_2(n_cols)
    acc_bytes = accumulation_dtype(dtype).itemsize
    if clusters and dtype.itemsize == 2 and block_n in (16384, 32768) and n_cols % 8 and n_cols + 7 <= 32768:
        # through the aligned window (x and dy of row stride N and unit column stride; elsewhere unaligned)
        if n_cols + 7 <= MAX_CLUSTER_SIZE * 2048:
            return BackwardConfig(split=False, block_rows=1, block_n=2048, num_warps=4, programs_per_sm=4,
                                  persistent=True, prefetch=True, cluster=True, min_blocks_per_sm=4,
                                  aligned_window=True)
        return BackwardConfig(split=False, block_rows=1, block_n=4096, num_warps=8, programs_per_sm=2,
                              persistent=True, prefetch=True, cluster=True, min_blocks_per_sm=2, aligned_window=True)
    if clusters and dtype.itemsize == 2 and block_n in (16384, 32768) and n_cols % 8 == 0:
        if block_n == 16384:
            return BackwardConfig(split=False, block_rows=1, block_n=2048, num_warps=4, programs_per_sm=4,
                                  persistent=True, prefetch=True, cluster=True, min_blocks_per_sm=4)
        return BackwardConfig(split=False, block_rows=1, block_n=4096, num_warps=8, programs_per_sm=2,
                              persistent=True, prefetch=True, cluster=True, min_blocks_per_sm=2)
    if dtype.itemsize == 2 and block_n == 8192 and n_cols % 8 == 0:
        return BackwardConfig(split=False, block_rows=1, block_n=block_n, num_warps=16, programs_per_sm=1,
                              persistent=True, prefetch=True)
    if block_n * dtype.itemsize <= 16 * 1024:
        rows, num_warps = max(1, 1024 // block_n), min(16, max(4, block_n * acc_bytes // 2048))
        if dtype.itemsize == 2:
            rows, num_warps = _HALF_BACKWARD_TILES.get(block_n, (rows, num_warps))
        return BackwardConfig(split=False, block_rows=rows, block_n=block_n, num_warps=num_warps,
                              programs_per_sm=max(1, 16 // num_warps), prefetch=num_warps <= 8)
    return BackwardConfig(split=True, block_rows=8 // acc_bytes, block_n=1024, num_warps=4, programs_per_sm=4,
                          prefetch=True, input_block_rows=1, input_block_n=4096, input_num_warps=8)


def column_sum_tiling(n_partials: int, n_cols: int, element_size: int = 4) -> tuple:
    """(BLOCK_P, BLOCK_N, num_warps) of column_sum_kernel over (n_partials, n_cols) partials of
    `element_size` bytes (a tile of at most 16 KiB per partial tensor: no spills).

    The kernel runs right after the backward, its partials in L2, and is latency-bound: up to 256 partial
    rows a step (the largest power of two not above n_partials: no step of mostly masked rows), 8- to
    32-column blocks (32-128 bytes of a row, whole sectors) for about 256 programs, and 8 warps for
    8-column blocks (more rows in flight), else 4. H200, LayerNorm fp16 M=8192, the kernel in a CUDA graph
    at its backward's partials (.scratch/colsum_probe.py, session 16, two runs), the former (128-row steps,
    ~2048-element tiles, 4 warps) -> this: 512 x 1024 partials 6.9 -> 3.0 us, 256 x 2048 4.2 -> 3.0,
    256 x 4096 4.2 -> 2.8, 132 x 8192 3.6 -> 3.2; the whole LayerNorm backward (bench/layernorm.py, CUDA
    graphs, x torch's): 1024 1.97x -> 2.40x, 2048 1.89x -> 2.01x, 4096 1.84x -> 1.88x."""
    block_n = min(max(next_power_of_2(dsl.cdiv(n_cols, 256)), 8), 32, next_power_of_2(n_cols))
    block_p = min(256, 1 << (max(n_partials, 1).bit_length() - 1), 16384 // (block_n * element_size))
    return block_p, block_n, 8 if block_n == 8 and block_p >= 256 else 4
