"""Launchers of the LayerNorm/RMSNorm kernels (norm_kernels.py; norm_split_window.py for 16-bit rows of 514
to 4097 columns off 16-byte boundaries): layouts, configurations, grids.

The tensors here are already flattened to (M, N) row matrices by `as_rows` (M rows, N normalized
columns); argument checking and torch's dtype rules live in fusedops.autograd.norms. Every function
takes `interpret` (None: follow FUSEDOPS_INTERPRET) and an optional config that overrides the
heuristics (tests use it to force the looped and split paths at small sizes; bench/layernorm.py to
sweep configurations).

Layouts: an input is passed to the kernels with its row and column strides, so transposed batches,
sliced columns and expanded (stride-0) tensors such as the gradient of `y.sum()` are read in place.
A copy is made only when the flattened (M, N) view has no single row stride and column stride (e.g.
normalized dims that are not collapsible, torch.Tensor.view would fail), or when column offsets
would not fit in int32. weight and bias are made contiguous (N elements, negligible). Outputs are
contiguous.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Callable, Optional

import numpy as np
import torch

import fusedops.dsl as dsl
from fusedops.dsl.ir.ops import MAX_CLUSTER_SIZE
from fusedops.dsl.runtime.bounded_cache import BoundedCache
from fusedops.dsl.runtime.knobs import interpret_enabled as _interpret_enabled
from fusedops.kernels import norm_kernels as K
from fusedops.kernels import norm_split_window as W
from fusedops.kernels.allocation import contiguous_allocator
from fusedops.kernels.device_info import sm_count as _sm_count

_INT32_LIMIT = 2**31


@dataclasses.dataclass(frozen=True)
class ForwardConfig:
    """Tiling of the forward. looped=False: forward_kernel, (block_rows, block_n) tiles of whole rows
    (block_n >= N). looped=True: forward_looped_kernel, one row per program in block_n-column chunks.

    Options of the whole-row kernels (looped=False):
    affine_first: weight and bias are loaded with x, before the reductions (else after them).
    aligned_window: rows that start off 16-byte boundaries (odd N) are read and written through a
        16-byte-aligned window (norm_kernels._row_window's SHIFT), where it applies: unit column stride,
        x's row stride N (y's), block_n >= N + 7 (fp16); else ignored.
    programs_per_sm > 0: forward_persistent_kernel on a grid of that many programs per SM, weight and
        bias loaded once per program; prefetch: it loads the next tile's x before reducing this one.
        With looped=True: the looped kernel on that grid (each program loops over its rows, whose second
        pass reads them from L2), else one program per row.
    reload: the variance and the output read x again (L1 hits; DRAM sees x once) instead of keeping it in
        registers: only the first read's 16-bit tile is live until the mean is taken, and weight and bias
        are read per output chunk (norm_kernels._normalize_rows_reloaded; affine_first ignored; with
        programs_per_sm, weight and bias are not kept per program). Fewer registers: more programs per SM,
        more bytes of x in flight.
    output_chunks: with reload, the output is written in this many column chunks (block_n divisible).
    cache_hints: weight and bias are loaded with eviction_policy="evict_last" (every row reads them);
        without reload x is loaded with "evict_first", with reload y is stored with "evict_first".
    shifted_sums (LayerNorm, not with reload or programs_per_sm; with row_sweeps too): the mean and
        variance from the sums of x - K and of its squares (K a median of three of the row's elements),
        which cross the warps in one exchange instead of two dependent ones (norm_kernels' comment above
        forward_kernel: the rounding).

    split_window=True (block_rows, block_n, num_warps, output_chunks, programs_per_sm, prefetch; the rest
    ignored): rows that start off 16-byte boundaries (N % 8 != 0 for 16-bit rows) through the split window
    of norm_split_window (a main tile of block_n >= N - 1 columns in whole 16-byte vectors plus 2 * 8 edge
    elements; LayerNorm with the shifted sums), where it applies: unit column stride, x's row stride N;
    elsewhere the launcher takes forward_config's choice without it. programs_per_sm > 0: a persistent
    grid whose programs gather weight and bias once (forward_split_persistent_kernel; output_chunks
    ignored), else one program per row tile gathering them per row.

    row_sweeps=True (looped, block_rows, affine_first, prefetch, reload and output_chunks ignored):
    forward_row_sweeps_kernel, one row per program (programs_per_sm > 0: that many programs per SM, each
    looping over rows) in two sweeps over block_n-column chunks (any N: the rest in masked pieces):
    per-thread statistics, one CTA reduction per row, then the row read again for y (norm_kernels'
    comment above _thread_sum). cache_hints: the first sweep loads x with "evict_last", the second with
    "evict_first", weight and bias "evict_last", y is stored ".cs". min_blocks_per_sm > 0:
    dsl.launch_bounds (ptxas caps the registers for that many CTAs per SM). aligned_window: rows off
    16-byte boundaries (odd N; unit column stride, x's row stride N) go through the aligned window
    (norm_kernels' comment above _window_moments: masked edges, unmasked 16-byte chunks, masked
    pieces; weight and bias read per element); else ignored. forward_config chooses it for odd 16-bit rows.
    shifted_affine (with aligned_window, where the window applies, and at least SHIFTED_AFFINE_MIN_ELEMENTS
    elements): each call copies weight and bias into shifted copies (`shifted_affine_copies`: two more
    small copy kernels) that the window reads in 16-byte vectors instead of per element.
    """

    looped: bool
    block_rows: int
    block_n: int
    num_warps: int
    affine_first: bool = False
    aligned_window: bool = False
    programs_per_sm: int = 0
    prefetch: bool = False
    reload: bool = False
    output_chunks: int = 1
    cache_hints: bool = False
    row_sweeps: bool = False
    min_blocks_per_sm: int = 0
    shifted_affine: bool = False
    shifted_sums: bool = False
    split_window: bool = False


@dataclasses.dataclass(frozen=True)
class BackwardConfig:
    """Tiling of the backward.

    split=False: backward_fused_kernel over (block_rows, block_n) tiles of whole rows (block_n >= N),
    programs_per_sm programs per SM, each owning a contiguous group of rows.
    split=True: backward_partials_kernel over (block_rows, block_n) tiles of (row group, column chunk)
    with programs_per_sm programs per SM, then backward_input_kernel over (input_block_rows,
    input_block_n) tiles with input_num_warps.
    prefetch: the row loop loads the next row block before reducing the current one (twice the bytes
    in flight, more registers).
    persistent=True (split ignored): backward_persistent_kernel, programs_per_sm programs per SM, each
    walking the row tiles g, g + G, ... over a block_n-column part of the row (the parts of a long row
    go to neighbouring programs): whole rows in one pass when they fit block_n, else a first pass in
    chunk-column pieces for the row sums and a second that reads the part again (from L2) for dx
    (two_pass=True: that also for rows that fit block_n: fewer registers).
    aligned_window: as ForwardConfig's, for x, dy and dx (all of row stride N, unit column stride;
    persistent only).
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


def _next_power_of_2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of statistics and sums: float64 for float64 inputs, float32 otherwise."""
    return torch.float64 if dtype == torch.float64 else torch.float32


# 16-bit LayerNorm forward options by padded row size (block_n), over the base whole-row tiles of
# forward_config (the warps and rows there). H200, fp16, M=8192. Session 13 (the launchers, kernel alone, L2 flushed, x a copy of the same bytes; .scratch/ln_check3.py): one
# row per program with the shifted sums (one exchange) against the 2-row tiles with cache hints (two
# dependent exchanges) they replace: 2048 0.863 -> 0.914 (2 warps), 4096 0.897 -> 0.960 (4 warps), 1024
# 0.902 -> 0.878 (2 warps; bench/layernorm.py, its copy timed apart: 0.97 at 1024, 0.87 at 2048, 0.92 at
# 4096); 2-row tiles with the shifted sums 4-20% slower (their per-row loads move between layouts).
# Session 22 (.scratch/probe_c.py, interleaved with a copy of the same bytes): these with cache_hints (x loaded
# evict_first, weight and bias evict_last): 1024 0.79 -> 0.85, 2048 0.86 -> 0.92, 4096 0.91 -> 0.92.
# Session 30 (.scratch/s30_probe5.py / s30_probe6.py, interleaved with a copy, fp16 / bf16): one whole row of 8192
# columns per program on 8 warps (63 registers, shifted sums, no hints) beat the row sweeps, 0.92 / 0.90 -> 0.95 /
# 0.92 of a copy (7168 columns 0.80 / 0.78 -> 0.89 / 0.84; 5120 and 6144 slower): taken from 6145 columns on
# (_HALF_LAYER_NORM_WHOLE_ROWS_FROM), now that the whole-row sums take the second sums of the sweeps
# (norm_kernels._second_sums) for rows whose scaled squares underflow or whose shift lies far from the mean.
# Session 31 (.scratch/s31_probe.py, the same method, with the second sums): 8192 0.917 / 0.892 -> 0.942 / 0.914,
# 7168 0.806 / 0.787 -> 0.899 / 0.853; 6144 0.810 / 0.791 -> 0.829 / 0.792 (within a run's noise: left to the sweeps).
_HALF_LAYER_NORM_FORWARD = {
    1024: dict(block_rows=1, num_warps=2, shifted_sums=True, cache_hints=True),
    2048: dict(block_rows=1, num_warps=2, shifted_sums=True, cache_hints=True),
    4096: dict(block_rows=1, num_warps=4, shifted_sums=True, cache_hints=True),
    8192: dict(block_rows=1, num_warps=8, shifted_sums=True),
}
# 16-bit LayerNorm rows of a multiple of 8 columns take the whole-row tiles of _HALF_LAYER_NORM_FORWARD instead of
# the row sweeps from this many columns on, by padded row size (below it, the sweeps were faster: session 30).
_HALF_LAYER_NORM_WHOLE_ROWS_FROM = {8192: 6145}
# 16-bit RMSNorm forward options by padded row size over the whole-row tiles (session 22, as above: cache_hints
# 1024 0.93 -> 0.99, 2048 0.955 -> 0.97 of a copy; 4096 equal, and slower past it, session 13).
_HALF_RMS_NORM_FORWARD = {1024: dict(cache_hints=True), 2048: dict(cache_hints=True)}
# (8192: hints, 0.826 -> 0.836, and 32768: reload in 8 output chunks, 0.608 -> 0.740, were dropped in session
# 6: 16-bit rows there take the row sweeps, aligned or through the window.)


# 16-bit rows whose padded block is a key here and N % 8 == 0 take the two-sweep kernel
# (ForwardConfig.row_sweeps) with these options, by op (subtract_mean). H200, fp16, M=8192, kernel
# alone, ms (whole-row config before -> this; .scratch/ln_fwd_probe.py LN_SWEEPS=1, session 5):
# LayerNorm 8192: 0.0805 -> 0.0748 (4096-column chunks, 4 warps, 8 CTAs per SM); 16384: 0.1553 -> 0.1457
# (8192, 8 warps, 4 CTAs); 32768: 0.3480 -> 0.2888 (16384, 16 warps, 2 CTAs, 2 programs per SM, each
# looping over rows); RMSNorm 8192: 0.0711 -> 0.0680 (8192, 8 warps, 4 CTAs); 32768: 0.2757 -> 0.2593
# (16384, 16 warps, 2 CTAs); RMSNorm 16384 was equal (0.1319 against 0.1309) and keeps its tiles.
# Whether LayerNorm's row sweeps take the shifted sums (ForwardConfig.shifted_sums; one exchange a row
# instead of Welford/Chan's two): session 14, .scratch/sweep_sums_probe.py, fraction of a copy, Welford ->
# sums: 8192 0.917 -> 0.937, 16384 0.873 -> 0.892, 32768 0.897 -> 0.902; through the aligned window 12289
# 0.652 -> 0.690, 20001 0.687 -> 0.707; session 15, with the sums' second pass for rows far from their
# shift (from a review; its hard-rows GPU test passed): 8192 0.915 -> 0.924, 16384 0.862 -> 0.903, 32768
# 0.895 -> 0.891, 12289 0.654 -> 0.692, 20001 0.689 -> 0.712. On (False: the Welford sweeps). Not taken
# (session 31, .scratch/s31_probe2.py / s31_probe3.py, fp16 / bf16, fraction of an interleaved copy): whole rows of
# 16384 / 32768 columns on 16 or 32 warps (LayerNorm 0.52-0.71 against the sweeps' 0.87-0.91; RMSNorm 0.89-0.96
# against 0.98-1.00; at 16384 also 2 CTAs per SM, 8 warps at 120 registers or 16 under launch bounds at 64 and 32
# bytes spilled: LayerNorm fp16 0.80-0.85 against 0.91, .scratch/s31_probe5.py), and persistent sweeps loading the
# next row's shift samples during this row (32768 0.899 / 0.871 -> 0.868 / 0.847, 16384 0.921 / 0.899 -> 0.876 /
# 0.870, slower at 12289 and 20001 too); LayerNorm programs per SM (.scratch/s31_probe4.py, all in one interleaved
# timing, twice): 16384 0, 2, 3, 4, 6 -> 0.91 / 0.90, 0.74 / 0.73, 0.86 / 0.84, 0.92 / 0.89, 0.80 / 0.82; 32768 0,
# 1, 2 -> 0.88 / 0.84, 0.69 / 0.65, 0.89 / 0.86.
ROW_SWEEP_SHIFTED_SUMS = True
_HALF_ROW_SWEEPS = {
    True: {8192: (4096, 4, 8, 0), 16384: (8192, 8, 4, 0), 32768: (16384, 16, 2, 2)},
    False: {8192: (8192, 8, 4, 0), 32768: (16384, 16, 2, 0)},
}


# 16-bit rows of more than 2048 columns that are not a multiple of 8 (rows off 16-byte boundaries) take the
# row sweeps through the aligned window (ForwardConfig.aligned_window): (chunk, num_warps, min_blocks_per_sm,
# shifted_affine) by the largest N each covers. H200, fp16, M=8192, kernel alone, fraction of a copy of the
# same bytes, the whole-row tiles (2-byte accesses; the aligned whole-row window at 12289) -> this (session
# 6, three runs), LayerNorm / RMSNorm: 3001 0.27 -> 0.57 / 0.27 -> 0.69; 4097 0.21 -> 0.57 / 0.32 -> 0.77;
# 6001 0.23 -> 0.57; 12289 0.25 -> 0.66 / 0.35 -> 0.80; 20001 0.14 -> 0.69 / 0.18 -> 0.78; 40001 0.32 ->
# 0.60 / 0.26 -> 0.76 (x torch 2.5-3.6). Chunks of 1024 were the fastest up to 6001 columns (4096: 0.41 /
# 0.58 at 4097), chunks of 4096 from 12289 on; the shifted weight and bias copies gained 10-20% there
# (LayerNorm 12289 0.58 -> 0.66, 20001 0.60 -> 0.69, 40001 0.50 -> 0.60) and nothing at 3001 and 4097.
# Session 25 (.scratch/ln_probe.py and ln_confirm.py, graphs, interleaved with a copy of the same bytes): from
# 8193 to 12289 columns chunks of 2048 on 4 warps (8 CTAs per SM) beat 4096 on 8 (4 CTAs), LayerNorm /
# RMSNorm: 9001 0.61 -> 0.68 / 0.70 -> 0.81, 12289 0.68 -> 0.70-0.72 / 0.78 -> 0.79; at 16377 and 20001 they
# were slower (LayerNorm 0.68 -> 0.64, 0.69 -> 0.62), so longer rows keep 4096. 8192- and 16384-column
# chunks, 16 warps and persistent programs (2 or 4 per SM) were slower everywhere at 12289 (0.33-0.69).
# (ncu at 12289: DRAM 60% of peak, L2 75%: the second sweep's x and the per-row weight and bias come from L2.)
_HALF_ODD_ROW_WINDOW = ((8192, (1024, 4, 8, False)), (12800, (2048, 4, 8, True)), (None, (4096, 8, 4, True)))


def _odd_row_window_config(n_cols: int, subtract_mean: bool) -> ForwardConfig:
    """The aligned-window row sweeps of a 16-bit row of n_cols > 2048 columns, n_cols % 8 != 0 (LayerNorm:
    the shifted sums with ROW_SWEEP_SHIFTED_SUMS)."""
    chunk, num_warps, min_blocks, shifted = next(choice for limit, choice in _HALF_ODD_ROW_WINDOW
                                                 if limit is None or n_cols <= limit)
    return ForwardConfig(looped=False, block_rows=1, block_n=chunk, num_warps=num_warps, cache_hints=True,
                         row_sweeps=True, aligned_window=True, min_blocks_per_sm=min_blocks, shifted_affine=shifted,
                         shifted_sums=subtract_mean and ROW_SWEEP_SHIFTED_SUMS)


def _row_sweeps_config(block_n: int, subtract_mean: bool) -> Optional[ForwardConfig]:
    """The two-sweep config of a 16-bit row of padded block `block_n` (None: the whole-row tiles)."""
    choice = _HALF_ROW_SWEEPS[subtract_mean].get(block_n)
    if choice is None:
        return None
    chunk, num_warps, min_blocks, per_sm = choice
    return ForwardConfig(looped=False, block_rows=1, block_n=chunk, num_warps=num_warps, programs_per_sm=per_sm,
                         cache_hints=True, row_sweeps=True, min_blocks_per_sm=min_blocks,
                         shifted_sums=subtract_mean and ROW_SWEEP_SHIFTED_SUMS)


# 16-bit rows off 16-byte boundaries (N % 8 != 0) whose split-window main tile (block_n = the power of two
# at or above N - 1) is a key here take the split window (ForwardConfig.split_window) with these
# (num_warps, output_chunks, programs_per_sm, prefetch), by op (subtract_mean). H200, fp16, M=8192, kernel
# alone, fraction of a copy of the same bytes (.scratch/split_probe.py, session 14, interleaved CUDA events),
# the shipped path before (whole-row tiles of 2-byte accesses; at 3001 and 4097 the aligned-window row sweeps)
# -> this: LayerNorm 777 0.39 -> 0.67, 1023 0.35 -> 0.71, 1025 0.40 -> 0.72, 2049 0.48 -> 0.79, 3001 0.52 ->
# 0.64, 4097 0.58 -> 0.78; RMSNorm 777 0.40 -> 0.78, 1023 0.35 -> 0.86, 1025 0.41 -> 0.84, 2049 0.66 -> 0.88,
# 3001 0.70 -> 0.78, 4097 0.76 -> 0.83 (bench/layernorm.py, LayerNorm fp16: 2049 0.82, 4097 0.82 of its copy,
# 3.9x and 3.6x torch). Persistent programs that gather weight and bias once and prefetch the next row won
# for LayerNorm (two gathered tensors), one program per row with the output in chunks (fewer registers) for
# RMSNorm at 1024 and 4096; at 12289 (a 16384 main tile) the split window was slower than the row sweeps
# (0.49 against 0.65). Session 30 (.scratch/s30_probe3.py, fp16 / bf16, interleaved with a copy): RMSNorm
# takes persistent programs at every block too, as many per SM as its registers let stay resident (2 warps:
# 111 registers, 9 CTAs; 4 warps at the 1024 block: 44, 10; at the 4096 block: 113, 4), before -> after:
# 1025 0.83 / 0.83 -> 0.85 / 0.85, 2049 0.81 / 0.81 -> 0.92 / 0.91, 3001 0.78 / 0.76 -> 0.88 / 0.87, 4097
# 0.83 / 0.81 -> 0.92 / 0.90. LayerNorm kept its choices: none of 2-8 warps, 4-8 programs per SM beat them
# (2049: 0.72-0.77 against 0.77), nor did its shift samples prefetched with the next row (0.77 -> 0.79 at 2049,
# slower at 3001 and 4097) or its variance from a second exchange of the centred row (0.74-0.78). Its registers
# (168 at 2 warps against RMSNorm's 111) hold weight and bias, gathered element by element (a register each):
# 6 programs of 2 warps fit an SM, against RMSNorm's 9.
_HALF_SPLIT_WINDOW = {
    True: {1024: (2, 1, 6, True), 2048: (4, 1, 4, True), 4096: (8, 1, 2, True)},
    False: {1024: (4, 1, 8, True), 2048: (2, 1, 8, True), 4096: (4, 1, 4, True)},
}


def _split_window_config(n_cols: int, dtype: torch.dtype, subtract_mean: bool) -> Optional[ForwardConfig]:
    """The split-window config of a row of n_cols columns of `dtype` (None: not one of its rows)."""
    if dtype.itemsize != 2 or n_cols % 8 == 0 or n_cols < 2:
        return None
    block_n = _next_power_of_2(n_cols - 1)
    choice = _HALF_SPLIT_WINDOW[subtract_mean].get(block_n)
    if choice is None:
        return None
    num_warps, chunks, per_sm, prefetch = choice
    return ForwardConfig(looped=False, block_rows=1, block_n=block_n, num_warps=num_warps, output_chunks=chunks,
                         programs_per_sm=per_sm, prefetch=prefetch, split_window=True)


def forward_config(n_cols: int, dtype: torch.dtype, *, subtract_mean: bool = False,
                   split_window: bool = True) -> ForwardConfig:
    """The forward's tiling for rows of n_cols columns of `dtype`, LayerNorm (subtract_mean=True) or
    RMSNorm (False).

    Whole rows in registers while the padded row is at most 64 KiB of input (32768 16-bit, 16384
    float32, 8192 float64 columns; ptxas keeps these without spills), else the looped kernel. About 64
    columns per thread and at least 4 warps: fewer, fuller warps made the cross-warp reductions
    cheaper and left room for more programs per SM (bench/layernorm.py --sweep on the H200: 4 warps
    up to 8192 columns, 8 at 16384, 16 at 32768 were the fastest). 16-bit rows of more than 2048
    columns, not a multiple of 8 (rows off 16-byte boundaries), take the row sweeps through the aligned
    window (`_HALF_ODD_ROW_WINDOW`; where the window does not apply, strided rows, the plain sweeps);
    those of 514 to 4097 columns take the split window instead (`_HALF_SPLIT_WINDOW`: whole rows, the
    main tile padded from N - 1, not N; where it does not apply, the choice without it).

    16-bit LayerNorm rows of 513 to 4096 columns (padded to 1024..4096; but the aligned-window rows), and
    those of 6145 to 8192 columns with N % 8 == 0 (`_HALF_LAYER_NORM_WHOLE_ROWS_FROM`), take one row per
    program with the shifted sums (ForwardConfig.shifted_sums: one cross-warp exchange
    for the statistics instead of two; `_HALF_LAYER_NORM_FORWARD`, measured at fp16 powers of two;
    bfloat16 has the same layout, other N take their padded row's options): 0.93-0.95 of a copy's
    bandwidth, against 0.86-0.91 for the 2-row tiles with cache hints that they replace. RMSNorm keeps
    the whole-row tiles (0.95-0.99 of a copy; the hints made it slower at 4096-32768 columns, 0.87-0.95
    against 0.93-0.99). float32 and float64 keep their tiles and the exact two-reduction statistics.

    16-bit rows of 4097 to 32768 columns with N % 8 == 0 take the two-sweep kernel instead where
    `_HALF_ROW_SWEEPS` has their padded block (faster there; LayerNorm 32768 0.74 -> 0.89 of a copy).
    Not taken (session 29, H200, fp16, interleaved with a copy): a row cut into 2-8 parts over the programs
    of a thread block cluster, each keeping its part in registers and the cluster adding the row sums
    through distributed shared memory (one DRAM read of x, no second sweep from L2; the kernel the
    backward's clusters use, written for the forward): 0.27-0.61 of a copy at 8192-32768 columns and
    0.14-0.37 at 2049-12289 against the shipped 0.74-0.92, for 1-4 rows a tile, 512-8192-column parts,
    2-16 warps, 1-8 programs per SM, prefetch or not."""
    block_n = _next_power_of_2(n_cols)
    split = _split_window_config(n_cols, dtype, subtract_mean) if split_window else None
    if split is not None:
        return split
    if dtype.itemsize == 2 and n_cols > 2048 and n_cols % 8 != 0:
        return _odd_row_window_config(n_cols, subtract_mean)
    whole_rows = subtract_mean and n_cols >= _HALF_LAYER_NORM_WHOLE_ROWS_FROM.get(block_n, math.inf)
    if dtype.itemsize == 2 and n_cols % 8 == 0 and not whole_rows:
        sweeps = _row_sweeps_config(block_n, subtract_mean)
        if sweeps is not None:
            return sweeps
    if block_n * dtype.itemsize <= 64 * 1024:
        num_warps = min(32, max(4, block_n // 2048))
        config = ForwardConfig(looped=False, block_rows=max(1, 2048 // block_n), block_n=block_n,
                               num_warps=num_warps)
        if dtype.itemsize == 2:
            options = (_HALF_LAYER_NORM_FORWARD if subtract_mean else _HALF_RMS_NORM_FORWARD).get(block_n, {})
            config = dataclasses.replace(config, **options)
        return config
    acc_bytes = accumulation_dtype(dtype).itemsize
    return ForwardConfig(looped=True, block_rows=1, block_n=16384 // acc_bytes, num_warps=8)


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
    from x and dy (norm_kernels._input_gradient): 16-bit rows of 16384 columns, both ops, take 2048-column
    parts (8 per cluster, 4 warps, 4 CTAs per SM, prefetch): LayerNorm 1.60x (8192-column halves) / 1.73x
    (4096-column parts) -> 1.78x, RMSNorm 2.11x -> 2.19x; LayerNorm's 32768 prefetches too (1.64x -> 1.71x,
    20 bytes spilled). dx re-read from L1/L2 after the row sums instead of kept (no spill) was 5-15% slower.
    Session 29 (bench/layernorm.py, graphs, fp16 / bf16): the aligned window's per-element masks computed once
    per program instead of per tile (norm_kernels._placed_window_loads; ptxas spill 120 -> 72 bytes at 12289):
    12289 LayerNorm 1.35x / 1.30x -> 1.42x / 1.40x, RMSNorm 1.58x / 1.53x -> 1.71x / 1.66x; still 0.42 of a
    copy's bandwidth against 0.64 for 12288 columns (6 parts, no window): the window's partial vectors are
    per-element predicated loads (codegen/memory.py) that ptxas cannot keep in 128 registers. Not taken
    (same run): those partial loads behind a branch (12289 LayerNorm 1.34x -> 1.17x), 3 CTAs per SM or no
    launch bounds (0.33-0.34 of a copy against 0.41). At 4096 columns (fp16 LayerNorm, interleaved with a copy)
    none of 34 other fused / persistent configs (1 or 2 rows, 4-16 warps, 1-4 programs per SM, prefetch or
    not) beat this one (67.8 us; the next 69.0 us); its dweight / dbias partials and their column sums cost
    8.3 of its 67.5 us (dx alone 59.2 us, 0.89 of a copy): the lead for the last 5% to 2x torch's there."""
    if split_window and dtype.itemsize == 2 and n_cols % 8 != 0 and n_cols > 1:
        choice = _HALF_SPLIT_WINDOW_BACKWARD[subtract_mean].get(_next_power_of_2(n_cols - 1))
        if choice is not None:
            num_warps, per_sm, prefetch = choice
            return BackwardConfig(split=False, block_rows=1, block_n=_next_power_of_2(n_cols - 1),
                                  num_warps=num_warps, programs_per_sm=per_sm, prefetch=prefetch, split_window=True)
    block_n = _next_power_of_2(n_cols)
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


def as_rows(t: torch.Tensor, n_rows: int, n_cols: int) -> torch.Tensor:
    """`t` (its trailing dims holding N = n_cols elements) as an (n_rows, n_cols) strided view,
    or as a contiguous copy when no such view exists (see the module docstring)."""
    try:
        rows = t.view(n_rows, n_cols)
    except RuntimeError:
        return t.reshape(n_rows, n_cols).contiguous()
    if (n_cols - 1) * rows.stride(1) >= _INT32_LIMIT:
        return rows.contiguous()
    return rows


def _contiguous_or_none(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    return None if t is None else t.reshape(-1).contiguous()


def _check_rows(n_rows: int) -> None:
    if n_rows >= _INT32_LIMIT:
        raise ValueError(f"{n_rows} rows: at most {_INT32_LIMIT - 1} rows are supported (row indices are int32)")


@functools.lru_cache(maxsize=1024)
def _row_geometry(shape: tuple, strides: tuple, n_cols: int) -> tuple:
    """(n_rows, row stride, column stride) of a tensor of `shape` and `strides` whose trailing dims hold
    n_cols elements, read as (n_rows, n_cols) rows in place: the strides of `as_rows`' view. The strides
    are None when as_rows copies (the leading or the trailing dims do not merge into one, as
    torch.Tensor.view requires, or column offsets would pass int32)."""
    split, count = len(shape), 1
    while split > 0 and (count != n_cols or split == len(shape)):
        split -= 1
        count *= shape[split]
    n_rows = math.prod(shape[:split])
    if count != n_cols:
        return n_rows, None, None

    def merged(dims) -> Optional[int]:      # the stride of `dims` viewed as one dim; 0: no dim of size > 1
        dims = [(size, stride) for size, stride in dims if size != 1]
        if any(outer != size * stride for (_, outer), (size, stride) in zip(dims, dims[1:])):
            return None
        return dims[-1][1] if dims else 0

    col_stride = merged(zip(shape[split:], strides[split:]))
    row_stride = merged(zip(shape[:split], strides[:split]))
    if col_stride is None or row_stride is None or (n_cols - 1) * col_stride >= _INT32_LIMIT:
        return n_rows, None, None
    col_stride = col_stride if n_cols > 1 else 1
    return n_rows, (row_stride if n_rows > 1 else n_cols * col_stride), col_stride


def norm_forward(x: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor], eps: float, *,
                 subtract_mean: bool, n_cols: Optional[int] = None, config: Optional[ForwardConfig] = None,
                 interpret: Optional[bool] = None, allocate: Callable = torch.empty):
    """LayerNorm (subtract_mean=True) or RMSNorm forward of the rows of `x`.

    Args:
        x: (M, N) float16/bfloat16/float32/float64, any strides; or any shape whose trailing dims hold
            n_cols = N elements (M rows: the product of the others), read as rows in place where a
            (M, N) view with one row and one column stride exists (else copied, see `as_rows`).
        weight, bias: N elements or None (any floating dtype; converted on load).
        eps: added to the variance (mean square) in the accumulation dtype.
        n_cols: N when x is not 2-D (default: x.shape[-1]).
        allocate: makes every output, called as torch.empty(shape, dtype=, device=) (tests poison them).

    Returns:
        (y, mean, rstd): y shaped like x, contiguous, in x's dtype; mean (M,) (None for RMSNorm) and rstd
        (M,) in the accumulation dtype (float32, float64 for float64 x).

    With the default config, interpret and allocate, the launch is prepared once per shapes, strides,
    dtypes, devices, flags and eps (`norm_launches`): a repeated call costs its allocations and one
    launch.
    """
    if config is None and interpret is None and allocate is torch.empty:
        return norm_launches(x, weight, bias, eps, subtract_mean=subtract_mean, n_cols=n_cols).forward(x, weight, bias)
    return _forward_launcher(x, weight, bias, eps, subtract_mean, n_cols, config, interpret, allocate)(x, weight, bias)


class NormLaunches:
    """The prepared launches of norm_forward for one layout (x's shape, strides, dtype and device, the
    dtypes, layouts and devices of weight and bias, eps, subtract_mean, the interpreter flag), and of
    the backward of its results: what the autograd Function keeps from its forward to its backward.

    forward(x, weight, bias) -> (y, mean, rstd), as norm_forward, for tensors of this layout.
    backward(dy, x, weight, mean, rstd, needs_input_grad) -> (dx, dweight, dbias), as norm_backward
    with input_grad, weight_grad, bias_grad = needs_input_grad[:3] (the autograd context's tuple), for
    x, weight and the mean and rstd of a forward of this layout (dbias in the bias's dtype), prepared in
    that forward's mode (GPU or interpreter: FUSEDOPS_INTERPRET then).

    The backward finds its launch by needs_input_grad alone when dy, x and weight are contiguous (a
    step's usual case: dy laid out like y), else by their strides too (norm_backward's key costs a few
    microseconds of host time per call).
    """

    __slots__ = ("forward", "_dtype", "_subtract_mean", "_bias_dtype", "_n_cols", "_backward", "_contiguous_backward")

    def __init__(self, forward: Callable, x: torch.Tensor, bias_dtype: Optional[torch.dtype], subtract_mean: bool,
                 n_cols: Optional[int]):
        self.forward = forward
        self._dtype, self._bias_dtype, self._subtract_mean, self._n_cols = x.dtype, bias_dtype, subtract_mean, n_cols
        self._backward = BoundedCache(16)   # per (dy's, x's and weight's strides, the gradients asked for)
        self._contiguous_backward = {}      # per needs_input_grad, for contiguous dy, x and weight

    @property
    def bias_dtype(self) -> Optional[torch.dtype]:
        """dbias's dtype (the bias's), None without a bias."""
        return self._bias_dtype

    def backward(self, dy: torch.Tensor, x: torch.Tensor, weight: Optional[torch.Tensor], mean: Optional[torch.Tensor],
                 rstd: torch.Tensor, needs_input_grad: tuple) -> tuple:
        # x's and weight's layouts too: a saved-tensor hook (torch.autograd.graph.save_on_cpu) may give them
        # back laid out anew (an expanded weight contiguous), and a launch reads a weight as it was prepared.
        # Contiguous tensors of one shape are read alike whatever the strides of their size-1 dims.
        if (dy.dtype is self._dtype and dy.is_contiguous() and x.is_contiguous()
                and (weight is None or weight.is_contiguous())):
            launch = self._contiguous_backward.get(needs_input_grad)
            if launch is None:
                launch = self._contiguous_backward[needs_input_grad] = self._launch(dy, x, weight, mean, rstd,
                                                                                   needs_input_grad)
            return launch(dy, x, weight, mean, rstd)
        return self._launch(dy, x, weight, mean, rstd, needs_input_grad)(dy, x, weight, mean, rstd)

    def _launch(self, dy, x, weight, mean, rstd, needs_input_grad) -> Callable:
        """The backward launch for tensors laid out like these (`_backward_launcher`'s)."""
        input_grad, weight_grad, bias_grad = needs_input_grad[0], needs_input_grad[1], needs_input_grad[2]
        if dy.dtype is not self._dtype:
            return functools.partial(norm_backward, subtract_mean=self._subtract_mean, input_grad=input_grad,
                                     weight_grad=weight_grad, bias_grad=bias_grad, bias_dtype=self._bias_dtype,
                                     n_cols=self._n_cols)
        key = (dy.stride(), x.stride(), None if weight is None else weight.stride(), input_grad, weight_grad,
               bias_grad)
        launch = self._backward.get(key)
        if launch is None:
            launch = self._backward.put(key, _backward_launcher(
                dy, x, weight, mean, rstd, self._subtract_mean, input_grad, weight_grad, bias_grad, self._bias_dtype,
                self._n_cols, None, None, torch.empty))
        return launch


# NormLaunches per layout (see there), made by norm_launches; norm_backward's launches per everything they
# derive from their tensors but the addresses (shapes, strides, dtypes, devices, flags, the interpreter flag):
# `_backward_launcher` closures whose kernels are prepared (JITFunction.prepare).
_FORWARD_LAUNCHES = BoundedCache(1024)
_BACKWARD_LAUNCHES = BoundedCache(1024)


def norm_launches(x: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor], eps: float, *,
                  subtract_mean: bool, n_cols: Optional[int] = None) -> NormLaunches:
    """The NormLaunches of tensors like these (arguments as for norm_forward), made once per layout."""
    interpret = _interpret_enabled()
    key = (x.shape, x.stride(), x.dtype, x.get_device(), n_cols,
           None if weight is None else (weight.dtype, weight.is_contiguous(), weight.get_device()),
           None if bias is None else (bias.dtype, bias.is_contiguous(), bias.get_device()),
           eps, subtract_mean, interpret)
    launches = _FORWARD_LAUNCHES.get(key)
    if launches is None:
        forward = _forward_launcher(x, weight, bias, eps, subtract_mean, n_cols, None, None, torch.empty)
        launches = _FORWARD_LAUNCHES.put(key, NormLaunches(forward, x, None if bias is None else bias.dtype,
                                                           subtract_mean, n_cols))
    return launches


def _output_allocator(x: torch.Tensor, allocate: Callable) -> Callable:
    """`new(x)`: an uninitialized contiguous tensor shaped and typed like x, on its device."""
    if allocate is torch.empty and x.is_contiguous():
        return torch.empty_like     # x's strides are contiguous
    new = contiguous_allocator(tuple(x.shape), x.dtype, x.device, allocate)
    return lambda x: new()


def _forward_launcher(x, weight, bias, eps, subtract_mean, n_cols, config, interpret, allocate) -> Callable:
    """`launch(x, weight, bias) -> (y, mean, rstd)` for tensors like these (see norm_forward)."""
    n_cols = x.shape[-1] if n_cols is None else n_cols
    n_rows, row_stride, col_stride = _row_geometry(tuple(x.shape), x.stride(), n_cols)
    _check_rows(n_rows)
    device, acc = x.device, accumulation_dtype(x.dtype)
    new_output = _output_allocator(x, allocate)
    in_place = row_stride is not None
    if not in_place:        # as_rows copies: contiguous rows
        row_stride, col_stride = n_cols, 1
    copy_weight = weight is not None and not weight.is_contiguous()
    copy_bias = bias is not None and not bias.is_contiguous()

    new_statistic = contiguous_allocator((n_rows,), acc, device, allocate)

    def allocate_outputs(x):
        return new_output(x), new_statistic() if subtract_mean else None, new_statistic()

    if n_rows == 0 or n_cols == 0:
        return lambda x, weight, bias: allocate_outputs(x)
    config = config or forward_config(n_cols, x.dtype, subtract_mean=subtract_mean)
    split_shift = 0
    if config.split_window:
        split_shift = _window_shift(True, None, n_cols, _stride_alignment(row_stride, n_cols, x.element_size()),
                                    x.element_size(), (row_stride, col_stride))
        if not split_shift:
            config = forward_config(n_cols, x.dtype, subtract_mean=subtract_mean, split_window=False)
    y, mean, rstd = allocate_outputs(x)
    rows = x if in_place else as_rows(x, n_rows, n_cols)
    weight, bias = _contiguous_or_none(weight), _contiguous_or_none(bias)
    # eps in the accumulation dtype: a float64 scalar for float64 rows, else rounded to float32 here, as torch
    # rounds it (1e39 becomes inf, where a kernel's float32 argument refuses a finite float past its range)
    with np.errstate(over="ignore", under="ignore"):
        eps = np.float64(eps) if x.dtype == torch.float64 else float(np.float32(eps))
    args = (y, mean, rstd, rows, weight, bias, n_rows, n_cols, row_stride, col_stride, n_cols, eps)
    shifted = 0         # with shifted_affine: the window's SHIFT (the number of shifted copies)
    if split_shift:
        if config.block_n < n_cols - 1 or config.block_n % config.output_chunks:
            raise ValueError(f"split window: block_n={config.block_n} is smaller than the row ({n_cols} columns) "
                             f"less one, or output_chunks={config.output_chunks} does not divide it")
        tiles = dict(SUBTRACT_MEAN=subtract_mean, BLOCK_ROWS=config.block_rows, BLOCK_N=config.block_n,
                     SHIFT=split_shift, num_warps=config.num_warps, interpret=interpret)
        n_tiles = dsl.cdiv(n_rows, config.block_rows)
        if config.programs_per_sm > 0:
            grid = (_round_up(min(n_tiles, _sm_count(device) * config.programs_per_sm), split_shift),)
            prepared = W.forward_split_persistent_kernel.prepare(grid, *args[:9], eps, PREFETCH=config.prefetch,
                                                                 **tiles)
        else:
            prepared = W.forward_split_kernel.prepare((n_tiles,), *args[:9], eps, CHUNKS=config.output_chunks, **tiles)
    elif config.row_sweeps:
        grid = (n_rows if config.programs_per_sm <= 0 else min(n_rows, _sm_count(device) * config.programs_per_sm),)
        constexprs = row_sweep_constexprs(config, x.dtype, weight, bias, row_stride, n_cols, subtract_mean,
                                          col_stride)
        if (config.shifted_affine and constexprs.get("SHIFT") and (weight is not None or bias is not None)
                and n_rows * n_cols >= SHIFTED_AFFINE_MIN_ELEMENTS):
            shifted = constexprs["AFFINE_SHIFTED"] = constexprs["SHIFT"]
            args = args[:4] + tuple(None if t is None else shifted_affine_copies(t, n_cols, shifted)
                                    for t in (weight, bias)) + args[6:]
        prepared = K.forward_row_sweeps_kernel.prepare(grid, *args, **constexprs, interpret=interpret)
    elif config.looped:
        grid = (n_rows if config.programs_per_sm <= 0 else min(n_rows, _sm_count(device) * config.programs_per_sm),)
        prepared = K.forward_looped_kernel.prepare(grid, *args, SUBTRACT_MEAN=subtract_mean,
                                                   BLOCK_N=config.block_n, num_warps=config.num_warps,
                                                   interpret=interpret)
    else:
        if config.block_n < n_cols:
            raise ValueError(f"block_n={config.block_n} is smaller than the row ({n_cols} columns)")
        align = _stride_alignment(row_stride, n_cols, x.element_size())
        shift = _window_shift(config.aligned_window, config.block_n, n_cols, align, x.element_size(),
                              (row_stride, col_stride), (n_cols, 1))
        tiles = dict(SUBTRACT_MEAN=subtract_mean, BLOCK_ROWS=config.block_rows, BLOCK_N=config.block_n, ALIGN=align,
                     SHIFT=shift, num_warps=config.num_warps, interpret=interpret)
        if config.reload or config.cache_hints:      # (else the kernels' defaults: the same PTX)
            if config.block_n % config.output_chunks:
                raise ValueError(f"output_chunks={config.output_chunks} does not divide block_n={config.block_n}")
            tiles.update(RELOAD=config.reload, CHUNKS=config.output_chunks, CACHE_HINTS=config.cache_hints)
        n_tiles = dsl.cdiv(n_rows, config.block_rows)
        if config.shifted_sums and (config.reload or config.programs_per_sm > 0):
            raise ValueError("shifted_sums is an option of the one-program-per-tile kernel without reload")
        if config.programs_per_sm > 0:
            grid = (_round_up(min(n_tiles, _sm_count(device) * config.programs_per_sm), max(shift, 1)),)
            prepared = K.forward_persistent_kernel.prepare(grid, *args, PREFETCH=config.prefetch, **tiles)
        else:
            if config.shifted_sums and subtract_mean:
                tiles.update(SHIFTED_SUMS=True)
            prepared = K.forward_kernel.prepare((n_tiles,), *args, AFFINE_FIRST=config.affine_first, **tiles)

    def launch(x, weight, bias):
        y, mean, rstd = allocate_outputs(x)
        if not in_place:
            x = as_rows(x, n_rows, n_cols)
        if shifted:         # the shifted copies read weight and bias in any layout: no contiguous copy first
            weight = None if weight is None else shifted_affine_copies(weight, n_cols, shifted)
            bias = None if bias is None else shifted_affine_copies(bias, n_cols, shifted)
        else:
            if copy_weight:
                weight = weight.reshape(-1).contiguous()
            if copy_bias:
                bias = bias.reshape(-1).contiguous()
        prepared(y, mean, rstd, x, weight, bias)
        return y, mean, rstd

    return launch


# ForwardConfig.shifted_affine applies from this many elements of x on: below it the two copies would cost
# about as much as the window's per-element weight and bias loads save.
SHIFTED_AFFINE_MIN_ELEMENTS = 1 << 22


def shifted_affine_copies(t: torch.Tensor, n_cols: int, shift: int) -> torch.Tensor:
    """`shift` copies of the n_cols-element weight or bias `t` in one new tensor, copy f holding t[c] at
    element f * stride + c + f (stride: norm_kernels.affine_copy_stride, a multiple of `shift`), so that
    the aligned window of a row starting f elements past a 16-byte boundary reads copy f in 16-byte
    vectors (the positions no copy writes are never read). One copy kernel."""
    stride = (n_cols + 2 * shift - 2) // shift * shift          # norm_kernels.affine_copy_stride
    copies = torch.empty(shift * stride, dtype=t.dtype, device=t.device)
    copies.as_strided((shift, n_cols), (stride + 1, 1)).copy_(t.reshape(1, n_cols).expand(shift, n_cols))
    return copies


# forward_row_sweeps_kernel's cache hints with ForwardConfig.cache_hints: x in the first sweep, x in the
# second, weight and bias, y's stores (softmax.py's L2_HINTS, plus the affine loads).
ROW_SWEEP_HINTS = dict(FIRST_EVICTION="evict_last", SECOND_EVICTION="evict_first", AFFINE_EVICTION="evict_last",
                       STORE_CACHE=".cs")


def row_sweep_constexprs(config: ForwardConfig, dtype: torch.dtype, weight: Optional[torch.Tensor],
                         bias: Optional[torch.Tensor], row_stride: int, n_cols: int, subtract_mean: bool,
                         col_stride: int = 1) -> dict:
    """The constexprs and num_warps of forward_row_sweeps_kernel for `config` (row_sweeps=True) and rows of
    n_cols columns of `dtype` at x's `row_stride` and `col_stride` (y's are n_cols and 1): the chunk's load
    layout (THREADS threads of VECTOR consecutive elements, as the default blocked layout lays out block_n
    elements of the narrowest dtype the kernel moves: 16-byte vectors), ALIGN, the hints, the register cap
    and, with config.aligned_window, SHIFT where the window applies (as for the whole-row tiles,
    `_window_shift`: rows off 16-byte boundaries, x's strides (n_cols, 1); only passed when non-zero, so
    that configs without it compile as before).

    Raises:
        ValueError: block_n is not a power of two.
    """
    chunk, threads = config.block_n, 32 * config.num_warps
    if chunk & (chunk - 1):
        raise ValueError(f"row sweeps: block_n={chunk} is not a power of two")
    itemsize = min([dtype.itemsize] + [t.element_size() for t in (weight, bias) if t is not None])
    vector = max(1, min(16 // itemsize, chunk // threads))
    constexprs = dict(SUBTRACT_MEAN=subtract_mean, CHUNK=chunk, THREADS=min(threads, chunk // vector), VECTOR=vector,
                      ALIGN=_stride_alignment(row_stride, n_cols, dtype.itemsize), num_warps=config.num_warps)
    if config.cache_hints:
        constexprs.update(ROW_SWEEP_HINTS)
    if config.min_blocks_per_sm:
        constexprs["MIN_BLOCKS"] = config.min_blocks_per_sm
    if config.shifted_sums and subtract_mean:
        constexprs["SHIFTED_SUMS"] = True
    shift = _window_shift(config.aligned_window, None, n_cols, constexprs["ALIGN"], dtype.itemsize,
                          (row_stride, col_stride), (n_cols, 1))
    if shift:
        constexprs["SHIFT"] = shift
    return constexprs


def _stride_alignment(x_row_stride: int, y_row_stride: int, element_size: int) -> int:
    """forward_kernel's ALIGN: the power of two, at most a 16-byte vector, dividing both row strides
    (in elements; element_size in bytes)."""
    strides = x_row_stride | y_row_stride | (16 // element_size)
    return strides & -strides


def _window_shift(requested: bool, block_n: Optional[int], n_cols: int, align: int, element_size: int,
                  *strides) -> int:
    """The SHIFT constexpr of norm_kernels._row_window: the elements of a 16-byte vector when an aligned
    window is requested and applies (rows start off 16-byte boundaries, every tensor's (row stride,
    column stride) is (n_cols, 1), the window fits block_n columns unless block_n is None), else 0.
    strides: (row, column) stride pairs of the tensors addressed through the window."""
    vector = 16 // element_size
    if not requested or align >= vector or (block_n is not None and block_n < n_cols + vector - 1):
        return 0
    if any(pair != (n_cols, 1) for pair in strides):
        return 0
    return vector


def _round_up(n: int, multiple: int) -> int:
    return dsl.cdiv(n, multiple) * multiple


def _row_groups(n_rows: int, block_rows: int, target_programs: int) -> tuple:
    """(rows_per_program, number of groups): about `target_programs` contiguous groups of rows, each a
    multiple of block_rows rows."""
    tiles = dsl.cdiv(n_rows, block_rows)
    tiles_per_group = dsl.cdiv(tiles, max(1, min(tiles, target_programs)))
    rows_per_program = tiles_per_group * block_rows
    return rows_per_program, dsl.cdiv(n_rows, rows_per_program)


def norm_backward(dy: torch.Tensor, x: torch.Tensor, weight: Optional[torch.Tensor], mean: Optional[torch.Tensor],
                  rstd: torch.Tensor, *, subtract_mean: bool, input_grad: bool, weight_grad: bool, bias_grad: bool,
                  bias_dtype: Optional[torch.dtype] = None, n_cols: Optional[int] = None,
                  config: Optional[BackwardConfig] = None, interpret: Optional[bool] = None,
                  allocate: Callable = torch.empty):
    """Gradients of norm_forward.

    Args:
        dy, x: (M, N), any strides (dy may be expanded, stride 0); or, with n_cols = N, any shape whose
            trailing dims hold N elements (as for norm_forward); dy has x's dtype and shape.
        weight: N elements or None; mean (LayerNorm; else None), rstd: (M,) as returned by norm_forward.
        input_grad, weight_grad, bias_grad: which gradients to compute (weight_grad needs a weight).
        bias_dtype: the dtype of dbias (the bias's).
        allocate: makes every output and scratch buffer, as in norm_forward.

    Returns:
        (dx, dweight, dbias): dx shaped like x, contiguous, in x's dtype, dweight (N,) in weight's dtype,
        dbias (N,) in bias_dtype; None for a gradient that was not asked for. dweight and dbias are
        deterministic: per-program partial sums reduced in a fixed order.

    With the default config, interpret and allocate the launches are prepared once per shapes, strides,
    dtypes, devices and flags (`_BACKWARD_LAUNCHES`).
    """
    cached = config is None and interpret is None and allocate is torch.empty
    if cached:
        key = (x.shape, x.stride(), dy.stride(), x.dtype, dy.dtype, x.get_device(), dy.get_device(), n_cols,
               None if weight is None else (weight.dtype, weight.is_contiguous(), weight.get_device()),
               mean is None, rstd.dtype, subtract_mean, input_grad, weight_grad, bias_grad, bias_dtype,
               _interpret_enabled())
        launch = _BACKWARD_LAUNCHES.get(key)
        if launch is not None:
            return launch(dy, x, weight, mean, rstd)
    launch = _backward_launcher(dy, x, weight, mean, rstd, subtract_mean, input_grad, weight_grad, bias_grad,
                                bias_dtype, n_cols, config, interpret, allocate)
    if cached:
        _BACKWARD_LAUNCHES.put(key, launch)
    return launch(dy, x, weight, mean, rstd)


def _backward_launcher(dy, x, weight, mean, rstd, subtract_mean, input_grad, weight_grad, bias_grad, bias_dtype,
                       n_cols, config, interpret, allocate) -> Callable:
    """`launch(dy, x, weight, mean, rstd) -> (dx, dweight, dbias)` for tensors like these (see
    norm_backward)."""
    n_cols = x.shape[-1] if n_cols is None else n_cols
    n_rows, x_row_stride, x_col_stride = _row_geometry(tuple(x.shape), x.stride(), n_cols)
    _, dy_row_stride, dy_col_stride = _row_geometry(tuple(dy.shape), dy.stride(), n_cols)
    x_in_place, dy_in_place = x_row_stride is not None, dy_row_stride is not None
    if not x_in_place:      # as_rows copies: contiguous rows
        x_row_stride, x_col_stride = n_cols, 1
    if not dy_in_place:
        dy_row_stride, dy_col_stride = n_cols, 1
    device, acc = x.device, rstd.dtype
    new_dx = _output_allocator(x, allocate)
    new_dweight = contiguous_allocator((n_cols,), weight.dtype, device, allocate) if weight_grad else None
    new_dbias = contiguous_allocator((n_cols,), bias_dtype, device, allocate) if bias_grad else None
    copy_weight = weight is not None and not weight.is_contiguous()

    def allocate_gradients(x):
        return (new_dx(x) if input_grad else None, new_dweight() if weight_grad else None,
                new_dbias() if bias_grad else None)

    if n_rows == 0 or n_cols == 0:
        def no_rows(dy, x, weight, mean, rstd):
            dx, dweight, dbias = allocate_gradients(x)
            for grad in (dweight, dbias):
                if grad is not None:
                    grad.zero_()
            return dx, dweight, dbias
        return no_rows
    clusters = _has_clusters(device, interpret)
    config = config or backward_config(n_cols, x.dtype, subtract_mean=subtract_mean, clusters=clusters)
    strides = (x_row_stride, x_col_stride, dy_row_stride, dy_col_stride)
    split_shift = 0
    if config.split_window:
        align = min(_stride_alignment(x_row_stride, n_cols, x.element_size()),
                    _stride_alignment(dy_row_stride, n_cols, x.element_size()))
        split_shift = _window_shift(True, None, n_cols, align, x.element_size(), (x_row_stride, x_col_stride),
                                    (dy_row_stride, dy_col_stride))
        if not split_shift:
            config = backward_config(n_cols, x.dtype, subtract_mean=subtract_mean, split_window=False,
                                     clusters=clusters)
    target_programs = _sm_count(device) * config.programs_per_sm
    tiling = dict(SUBTRACT_MEAN=subtract_mean, BLOCK_ROWS=config.block_rows, BLOCK_N=config.block_n,
                  PREFETCH=config.prefetch, num_warps=config.num_warps, interpret=interpret)
    # Example tensors to prepare the launches with (the launches take each call's own).
    dx, dweight, dbias = allocate_gradients(x)
    dy_rows = dy if dy_in_place else as_rows(dy, n_rows, n_cols)
    x_rows = x if x_in_place else as_rows(x, n_rows, n_cols)
    weight = _contiguous_or_none(weight)
    if split_shift:
        if config.block_n < n_cols - 1:
            raise ValueError(f"split window: block_n={config.block_n} is smaller than the row ({n_cols} columns) "
                             f"less one")
        groups = _round_up(min(dsl.cdiv(n_rows, config.block_rows), max(1, target_programs)), split_shift)
        new_partial = contiguous_allocator((groups * config.block_rows, n_cols), acc, device, allocate)
        dweight_partial = new_partial() if weight_grad else None
        dbias_partial = new_partial() if bias_grad else None
        main = W.backward_split_kernel.prepare((groups,), dx, dweight_partial, dbias_partial, dy_rows, x_rows, weight,
                                               mean, rstd, n_rows, n_cols, n_cols, SHIFT=split_shift, **tiling)
        new_chunk_partial, input_kernel = None, None
    elif config.persistent:
        main, new_partial, dweight_partial, dbias_partial = _persistent_backward(
            config, dx, dy_rows, x_rows, weight, mean, rstd, n_rows, n_cols, strides, subtract_mean, weight_grad,
            bias_grad, target_programs, allocate, interpret)
        new_chunk_partial, input_kernel = None, None
    elif not config.split:
        if config.block_n < n_cols:
            raise ValueError(f"block_n={config.block_n} is smaller than the row ({n_cols} columns)")
        rows_per_program, groups = _row_groups(n_rows, config.block_rows, target_programs)
        chunks, new_partial, new_chunk_partial = 0, contiguous_allocator((groups, n_cols), acc, device, allocate), None
        dweight_partial = new_partial() if weight_grad else None
        dbias_partial = new_partial() if bias_grad else None
        main = K.backward_fused_kernel.prepare((groups,), dx, dweight_partial, dbias_partial, dy_rows, x_rows, weight,
                                               mean, rstd, n_rows, n_cols, rows_per_program, *strides, n_cols,
                                               **tiling)
        input_kernel = None
    else:
        chunks = dsl.cdiv(n_cols, config.block_n)
        rows_per_program, groups = _row_groups(n_rows, config.block_rows, max(1, target_programs // chunks))
        new_partial = contiguous_allocator((groups, n_cols), acc, device, allocate)
        new_chunk_partial = contiguous_allocator((n_rows, chunks), acc, device, allocate)
        dweight_partial = new_partial() if weight_grad else None
        dbias_partial = new_partial() if bias_grad else None
        c1_partial = new_chunk_partial() if input_grad else None
        c2_partial = new_chunk_partial() if input_grad and subtract_mean else None
        main = K.backward_partials_kernel.prepare((groups * chunks,), c1_partial, c2_partial, dweight_partial,
                                                  dbias_partial, dy_rows, x_rows, weight, mean, rstd, n_rows, n_cols,
                                                  rows_per_program, *strides, **tiling)
        input_kernel = None
        if input_grad:
            grid = (dsl.cdiv(n_rows, config.input_block_rows) * dsl.cdiv(n_cols, config.input_block_n),)
            input_kernel = K.backward_input_kernel.prepare(
                grid, dx, dy_rows, x_rows, weight, mean, rstd, c1_partial, c2_partial, n_rows, n_cols, chunks,
                *strides, n_cols, SUBTRACT_MEAN=subtract_mean, BLOCK_ROWS=config.input_block_rows,
                BLOCK_N=config.input_block_n, BLOCK_CHUNKS=min(_next_power_of_2(chunks), 64),
                num_warps=config.input_num_warps, interpret=interpret)
    column_sums = None
    if weight_grad or bias_grad:
        column_sums = _column_sums(dweight, dweight_partial, dbias, dbias_partial, interpret)

    split = config.split and not config.persistent

    def launch(dy, x, weight, mean, rstd):
        dx = new_dx(x) if input_grad else None
        dweight = new_dweight() if weight_grad else None
        dbias = new_dbias() if bias_grad else None
        if not dy_in_place:
            dy = as_rows(dy, n_rows, n_cols)
        if not x_in_place:
            x = as_rows(x, n_rows, n_cols)
        if copy_weight:
            weight = weight.reshape(-1).contiguous()
        # Two allocations, not one with dbias's partials a view of its second half: a view costs about the host
        # time of an allocation (measured on the CPU with the driver mocked: the one-buffer variant was slower).
        dweight_partial = new_partial() if weight_grad else None
        dbias_partial = new_partial() if bias_grad else None
        if not split:
            main(dx, dweight_partial, dbias_partial, dy, x, weight, mean, rstd)
        else:
            c1_partial = new_chunk_partial() if input_grad else None
            c2_partial = new_chunk_partial() if input_grad and subtract_mean else None
            main(c1_partial, c2_partial, dweight_partial, dbias_partial, dy, x, weight, mean, rstd)
            if input_kernel is not None:
                input_kernel(dx, dy, x, weight, mean, rstd, c1_partial, c2_partial)
        if column_sums is not None:
            column_sums(dweight, dweight_partial, dbias, dbias_partial)
        return dx, dweight, dbias

    return launch


def _persistent_backward(config, dx, dy, x, weight, mean, rstd, n_rows, n_cols, strides, subtract_mean,
                         weight_grad, bias_grad, target_programs, allocate, interpret) -> tuple:
    """(prepared backward_persistent_kernel taking (dx, dweight_partial, dbias_partial, dy, x, weight, mean,
    rstd), the partial buffers' allocator, and the example dweight and dbias partials it was prepared with)
    for config.persistent (see BackwardConfig)."""
    x_row_stride, x_col_stride, dy_row_stride, dy_col_stride = strides
    align = _stride_alignment(x_row_stride, n_cols, x.element_size())
    align = min(align, _stride_alignment(dy_row_stride, n_cols, x.element_size()))
    shift = _window_shift(config.aligned_window, None, n_cols, align, x.element_size(),
                          (x_row_stride, x_col_stride), (dy_row_stride, dy_col_stride))
    parts = dsl.cdiv(n_cols + max(shift - 1, 0), config.block_n)
    cluster = parts if config.cluster and 1 < parts <= MAX_CLUSTER_SIZE and _has_clusters(x.device, interpret) else 1
    groups = min(dsl.cdiv(n_rows, config.block_rows), max(1, target_programs // parts))
    options = dict(SUBTRACT_MEAN=subtract_mean, BLOCK_ROWS=config.block_rows, BLOCK_N=config.block_n,
                   TWO_PASS=(parts > 1 and cluster == 1) or config.two_pass, CHUNK=min(config.chunk, config.block_n),
                   PREFETCH=config.prefetch, ALIGN=align, SHIFT=shift, CLUSTER=cluster,
                   MIN_BLOCKS_PER_SM=config.min_blocks_per_sm, num_warps=config.num_warps)

    def prepare(groups: int) -> tuple:
        new_partial = contiguous_allocator((groups * config.block_rows, n_cols), rstd.dtype, x.device, allocate)
        dweight_partial = new_partial() if weight_grad else None
        dbias_partial = new_partial() if bias_grad else None
        args = (dx, dweight_partial, dbias_partial, dy, x, weight, mean, rstd, n_rows, n_cols, groups, parts, *strides,
                n_cols)
        return args, new_partial, dweight_partial, dbias_partial

    groups = _round_up(groups, max(shift, 1))
    args, new_partial, dweight_partial, dbias_partial = prepare(groups)
    if cluster > 1 and not _interpreting(interpret):
        # every cluster at once: a GPC holds a whole number of clusters, so the device may hold fewer than
        # SMs * programs_per_sm / cluster (a grid of more runs its last clusters after the others)
        resident = K.backward_persistent_kernel.max_active_clusters(*args, **options)
        if resident < groups:
            groups = max(resident // max(shift, 1), 1) * max(shift, 1)
            args, new_partial, dweight_partial, dbias_partial = prepare(groups)
    main = K.backward_persistent_kernel.prepare((groups * parts,), *args, interpret=interpret, **options)
    return main, new_partial, dweight_partial, dbias_partial


def _interpreting(interpret: Optional[bool]) -> bool:
    """Whether launches with this `interpret` argument run in the interpreter (None: FUSEDOPS_INTERPRET)."""
    return _interpret_enabled() if interpret is None else bool(interpret)


def _has_clusters(device: torch.device, interpret: Optional[bool]) -> bool:
    """Whether kernels on `device` can run in thread block clusters (sm_90 and later; the interpreter can)."""
    if _interpreting(interpret) or device.type != "cuda":
        return True
    return torch.cuda.get_device_capability(device)[0] >= 9


def _column_sums(dweight, dweight_partial, dbias, dbias_partial, interpret) -> Callable:
    """The prepared launch `sums(dweight, dweight_partial, dbias, dbias_partial)` that sets
    dweight = dweight_partial.sum(0) and dbias = dbias_partial.sum(0) in one launch (for tensors like
    these; either pair may be None)."""
    first = dweight_partial if dweight is not None else dbias_partial
    n_partials, n_cols = first.shape
    block_p, block_n, num_warps = column_sum_tiling(n_partials, n_cols, first.element_size())
    grid = (dsl.cdiv(n_cols, block_n),)
    options = dict(BLOCK_P=block_p, BLOCK_N=block_n, num_warps=num_warps, interpret=interpret)
    if dweight is None:
        prepared = K.column_sum_kernel.prepare(grid, dbias, dbias_partial, None, None, n_partials, n_cols, **options)
        return lambda dweight, dweight_partial, dbias, dbias_partial: prepared(dbias, dbias_partial, None, None)
    return K.column_sum_kernel.prepare(grid, dweight, dweight_partial, dbias, dbias_partial, n_partials, n_cols,
                                       **options)


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
    block_n = min(max(_next_power_of_2(dsl.cdiv(n_cols, 256)), 8), 32, _next_power_of_2(n_cols))
    block_p = min(256, 1 << (max(n_partials, 1).bit_length() - 1), 16384 // (block_n * element_size))
    return block_p, block_n, 8 if block_n == 8 and block_p >= 256 else 4
