"""The LayerNorm/RMSNorm forward's tilings: ForwardConfig, and forward_config's choice of one by row size, dtype
and op, with the measurements behind its tables.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import torch

import fusedops.dsl as dsl
from fusedops.kernels.norm_rows import accumulation_dtype
from fusedops.kernels.sizes import next_power_of_2


@dataclasses.dataclass(frozen=True)
class ForwardConfig:
    """Tiling of the forward. looped=False: norm_forward_kernels.forward_kernel, (block_rows, block_n) tiles
    of whole rows (block_n >= N). looped=True: norm_forward_kernels.forward_looped_kernel, one row per program
    in block_n-column chunks.

    Options of the whole-row kernels (looped=False):
    affine_first: weight and bias are loaded with x, before the reductions (else after them).
    aligned_window: rows that start off 16-byte boundaries (odd N) are read and written through a
        16-byte-aligned window (row_windows.window_offsets' SHIFT), where it applies: unit column stride,
        x's row stride N (y's), block_n >= N + 7 (fp16); else ignored.
    programs_per_sm > 0: norm_forward_kernels.forward_persistent_kernel on a grid of that many programs per
        SM, weight and bias loaded once per program; prefetch: it loads the next tile's x before reducing
        this one.
        With looped=True: the looped kernel on that grid (each program loops over its rows, whose second
        pass reads them from L2), else one program per row.
    reload: the variance and the output read x again (L1 hits; DRAM sees x once) instead of keeping it in
        registers: only the first read's 16-bit tile is live until the mean is taken, and weight and bias
        are read per output chunk (norm_forward_kernels._normalize_rows_reloaded; affine_first ignored; with
        programs_per_sm, weight and bias are not kept per program). Fewer registers: more programs per SM,
        more bytes of x in flight.
    output_chunks: with reload, the output is written in this many column chunks (block_n divisible).
    cache_hints: weight and bias are loaded with eviction_policy="evict_last" (every row reads them);
        without reload x is loaded with "evict_first", with reload y is stored with "evict_first".
    shifted_sums (LayerNorm, not with reload or programs_per_sm; with row_sweeps too): the mean and
        variance from the sums of x - K and of its squares (K a median of three of the row's elements),
        which cross the warps in one exchange instead of two dependent ones (norm_statistics' comment on
        the shifted sums: the rounding).

    split_window=True (block_rows, block_n, num_warps, output_chunks, programs_per_sm, prefetch; the rest
    ignored): rows that start off 16-byte boundaries (N % 8 != 0 for 16-bit rows) through the split window
    of norm_split_window (a main tile of block_n >= N - 1 columns in whole 16-byte vectors plus 2 * 8 edge
    elements; LayerNorm with the shifted sums), where it applies: unit column stride, x's row stride N;
    elsewhere the launcher takes forward_config's choice without it. programs_per_sm > 0: a persistent
    grid whose programs gather weight and bias once (norm_split_window.forward_split_persistent_kernel;
    output_chunks ignored), else one program per row tile gathering them per row (forward_split_kernel).
    staged_affine=True (with split_window; block_rows 1, programs_per_sm > 0): the main window in main_tiles
    (1 to 3) tiles of block_n positions (main_tiles * block_n >= N - 1), weight and bias staged by each program
    into shifted copies that every row reads in vectors (norm_split_staged.forward_split_staged_kernel).

    row_sweeps=True (looped, block_rows, affine_first, prefetch, reload and output_chunks ignored):
    norm_row_sweeps.forward_row_sweeps_kernel, one row per program (programs_per_sm > 0: that many programs
    per SM, each looping over rows) in two sweeps over block_n-column chunks (any N: the rest in masked pieces):
    per-thread statistics, one CTA reduction per row, then the row read again for y (norm_row_sweeps'
    comment above _thread_sum). cache_hints: the first sweep loads x with "evict_last", the second with
    "evict_first", weight and bias "evict_last", y is stored ".cs". min_blocks_per_sm > 0:
    dsl.launch_bounds (ptxas caps the registers for that many CTAs per SM). aligned_window: rows off
    16-byte boundaries (odd N; unit column stride, x's row stride N) go through the aligned window
    (norm_row_sweeps' comment above _window_moments: masked edges, unmasked 16-byte chunks, masked
    pieces; weight and bias read per element); else ignored. forward_config chooses it for odd 16-bit rows.
    shifted_affine (with aligned_window, where the window applies, and at least SHIFTED_AFFINE_MIN_ELEMENTS
    elements, norm_forward_launcher's): each call copies weight and bias into shifted copies
    (`norm_forward_launcher.shifted_affine_copies`: two more small copy kernels) that the window reads in
    16-byte vectors instead of per element.
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
    main_tiles: int = 1
    staged_affine: bool = False


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
# (norm_statistics.second_sums) for rows whose scaled squares underflow or whose shift lies far from the mean.
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


# 16-bit rows off 16-byte boundaries of 4098 to 12289 columns whose N is at most a limit here take the
# staged-affine split window (ForwardConfig.staged_affine; norm_split_staged's docstring has the measurements):
# (largest N, block_n, num_warps, programs_per_sm, prefetch) by op (subtract_mean), the first limit at or
# above N; None: the choice without it (LayerNorm 8194..10240: the row sweeps were as fast or faster).
_HALF_STAGED_WINDOW = {
    True: ((6145, (2048, 8, 2, True)), (8193, (4096, 8, 2, True)), (10240, None), (12289, (4096, 8, 2, False))),
    False: ((6145, (2048, 4, 4, True)), (8193, (4096, 8, 2, True)), (12289, (4096, 8, 2, False))),
}


def _staged_window_config(n_cols: int, subtract_mean: bool) -> Optional[ForwardConfig]:
    """The staged-affine split-window config of a 16-bit row of n_cols columns off 16-byte boundaries (None:
    not one of its rows)."""
    choice = next((choice for limit, choice in _HALF_STAGED_WINDOW[subtract_mean] if n_cols <= limit), None)
    if n_cols <= 4097 or choice is None:
        return None
    block_n, num_warps, per_sm, prefetch = choice
    return ForwardConfig(looped=False, block_rows=1, block_n=block_n, num_warps=num_warps, programs_per_sm=per_sm,
                         prefetch=prefetch, split_window=True, staged_affine=True, shifted_sums=subtract_mean,
                         main_tiles=dsl.cdiv(n_cols - 1, block_n))


def _split_window_config(n_cols: int, dtype: torch.dtype, subtract_mean: bool) -> Optional[ForwardConfig]:
    """The split-window config of a row of n_cols columns of `dtype` (None: not one of its rows)."""
    if dtype.itemsize != 2 or n_cols % 8 == 0 or n_cols < 2:
        return None
    staged = _staged_window_config(n_cols, subtract_mean)
    if staged is not None:
        return staged
    block_n = next_power_of_2(n_cols - 1)
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
    main tile padded from N - 1, not N; where it does not apply, the choice without it), and those of 4098 to
    12289 columns the staged-affine split window (`_HALF_STAGED_WINDOW`; LayerNorm's of 8194 to 10240 excepted).

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
    block_n = next_power_of_2(n_cols)
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
