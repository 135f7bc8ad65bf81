"""LayerNorm and RMSNorm forward kernels of whole rows in registers and of looped rows, in the DSL (one set of
kernels for both ops).

Both ops normalize each row of a (M, N) matrix x (the leading dims flattened into M rows, the
normalized dims into N columns):

    LayerNorm:  mean = sum(x) / N,  rstd = 1 / sqrt(sum((x - mean)^2) / N + eps),  xhat = (x - mean) * rstd
    RMSNorm:                        rstd = 1 / sqrt(sum(x^2) / N + eps),           xhat = x * rstd
    y = xhat * weight + bias        (weight and bias optional; RMSNorm has no bias)

The constexpr SUBTRACT_MEAN selects LayerNorm (True) or RMSNorm (False). Statistics, eps and all
arithmetic are in the accumulation dtype: float32 for 16- and 32-bit inputs, float64 for float64 (it is
the element type of the rstd buffer). The forward saves mean (LayerNorm) and rstd per row; the backward
is norm_backward_kernels.py's.

Kernels and when the launchers (norm_forward_launcher.py) use them:
- `forward_kernel`: a (BLOCK_ROWS, BLOCK_N) tile of whole rows in registers, one pass over memory.
  Used while the padded row fits (see norm_forward_config.forward_config). RELOAD
  (`_normalize_rows_reloaded`): the variance and the output re-read x (L1 hits) instead of keeping it in
  registers (16-bit LayerNorm rows of 4096, 16384 and 32768 padded columns; CACHE_HINTS at 1024 to 16384).
- `forward_looped_kernel`: one row per program in BLOCK_N-column chunks: a first pass keeps per-lane
  Welford statistics (count, mean, M2) that are merged exactly at the end, a second pass normalizes.
- norm_row_sweeps.py: `forward_row_sweeps_kernel` (ForwardConfig.row_sweeps), two sweeps over a row, for
  long 16-bit rows.
- norm_split_window.py: the forward and backward of 16-bit rows of 514 to 4097 columns that start off
  16-byte boundaries (N % 8 != 0), through a split window (a power-of-two main tile of whole vectors
  plus a small edge tile).
The shifted sums' statistics (SHIFTED_SUMS) and the corrected mean are norm_statistics.py's.

Addressing: row r, column c of x is at x_ptr + r * x_row_stride + c * x_col_stride, with the row
offset computed in int64 (tensors may hold more than 2**31 elements); column offsets stay int32 (the
launcher guarantees (N - 1) * |col stride| < 2**31). Padded lanes (columns >= N, rows >= M) load 0
and are excluded from every statistic with explicit masks. Output and statistics buffers are
contiguous.
"""

from __future__ import annotations

import fusedops.dsl as dsl
from fusedops.kernels.norm_statistics import corrected_mean, row_shifts, sampled_median, shifted_statistics
from fusedops.kernels.row_windows import window_offsets


@dsl.jit
def affine_tiles(weight_ptr, bias_ptr, logical, in_row, EVICTION: dsl.constexpr = ""):
    # -> (weight, bias) at columns `logical` (masked by in_row) in their own dtype; None for a None pointer.
    # EVICTION: their loads' eviction_policy ("evict_last": every row of the launch reads them again).
    weight = None
    bias = None
    if weight_ptr is not None:
        weight = dsl.load(weight_ptr + logical, mask=in_row, other=0.0, eviction_policy=EVICTION)
    if bias_ptr is not None:
        bias = dsl.load(bias_ptr + logical, mask=in_row, other=0.0, eviction_policy=EVICTION)
    return weight, bias


@dsl.jit
def _normalize_rows(y_ptr, mean_ptr, rstd_ptr, x, first, mask, weight, bias, weight_ptr, bias_ptr, logical, in_row,
                    y_offsets, rows, row_mask, n_cols, eps, SUBTRACT_MEAN: dsl.constexpr,
                    EVICTION: dsl.constexpr = ""):
    # The forward of a tile of whole rows: x (R, C) in its own dtype, 0 where `mask` is off; writes y at
    # y_offsets and the rows' mean (LayerNorm) and rstd. weight, bias: loaded tiles (own dtype) or None;
    # weight_ptr, bias_ptr: not None to load them here, after the reductions, at `logical` (masked by
    # in_row): fewer registers live across the reductions; EVICTION: their loads' eviction_policy.
    # first: None, or (LayerNorm) the rows' shifts ((R,), own dtype): the statistics then come from sums
    # shifted by them (see norm_statistics.py's comment on the shifted sums).
    acc_dtype = rstd_ptr.dtype.element
    wide_input = x.dtype.bits > 16      # 16-bit rows: the float32 mean's rounding is far below their ulp
    x = x.to(acc_dtype)
    if SUBTRACT_MEAN and first is not None:
        x, mean, rstd = shifted_statistics(x, first.to(acc_dtype), mask, row_mask, n_cols, eps)
    else:
        if SUBTRACT_MEAN:
            mean = dsl.sum(x, axis=1) / n_cols
            x = dsl.where(mask, x - mean[:, None], 0.0)
            if wide_input:
                mean, x = corrected_mean(mean, x, mask, n_cols)
        rstd = 1.0 / dsl.sqrt(dsl.sum(x * x, axis=1) / n_cols + eps)
    y = x * rstd[:, None]
    if weight_ptr is not None or bias_ptr is not None:
        weight, bias = affine_tiles(weight_ptr, bias_ptr, logical, in_row, EVICTION)
    if weight is not None:
        y = y * weight.to(acc_dtype)
    if bias is not None:
        y = y + bias.to(acc_dtype)
    dsl.store(y_ptr + y_offsets, y, mask=mask)
    if SUBTRACT_MEAN:
        dsl.store(mean_ptr + rows, mean, mask=row_mask)
    dsl.store(rstd_ptr + rows, rstd, mask=row_mask)


@dsl.jit
def _normalize_rows_reloaded(y_ptr, mean_ptr, rstd_ptr, x_ptr, weight_ptr, bias_ptr, x, rows, row_mask, n_cols,
                             x_row_stride, x_col_stride, y_row_stride, eps, SUBTRACT_MEAN: dsl.constexpr,
                             BLOCK_N: dsl.constexpr, ALIGN: dsl.constexpr, SHIFT: dsl.constexpr,
                             CHUNKS: dsl.constexpr, CACHE_HINTS: dsl.constexpr):
    # _normalize_rows for a tile whose x (R, BLOCK_N, its own dtype, 0 where masked off) was just loaded
    # at window positions arange(BLOCK_N) of `rows`, keeping fewer registers live: x is read again
    # (L1 hits: this program read it a moment ago; DRAM sees it once) for the variance (LayerNorm) and
    # for the output, so that only the tile of the first read, in its own 16-bit dtype, is live until
    # the mean is taken. (Converting the kept 16-bit tile a second time does not help: the compiler
    # reuses the first float32 conversion, keeping it live across the reduction.) The output is written
    # in CHUNKS column chunks of BLOCK_N // CHUNKS, each reading its x, weight and bias: weight and bias
    # are never live as whole rows. CACHE_HINTS: weight and bias are loaded with evict_last and y is
    # stored with evict_first.
    acc_dtype = rstd_ptr.dtype.element
    x_offsets, _, in_row = window_offsets(rows, dsl.arange(0, BLOCK_N), n_cols, x_row_stride, x_col_stride, ALIGN,
                                          SHIFT)
    mask = row_mask[:, None] & in_row
    if SUBTRACT_MEAN:
        mean = dsl.sum(x.to(acc_dtype), axis=1) / n_cols
        x = dsl.load(x_ptr + x_offsets, mask=mask, other=0.0)
        centered = dsl.where(mask, x.to(acc_dtype) - mean[:, None], 0.0)
        if x.dtype.bits > 16:       # (16-bit rows: the float32 mean's rounding is far below their ulp)
            mean, centered = corrected_mean(mean, centered, mask, n_cols)
        rstd = 1.0 / dsl.sqrt(dsl.sum(centered * centered, axis=1) / n_cols + eps)
    else:
        x = x.to(acc_dtype)
        rstd = 1.0 / dsl.sqrt(dsl.sum(x * x, axis=1) / n_cols + eps)
    CHUNK: dsl.constexpr = BLOCK_N // CHUNKS
    for chunk in dsl.static_range(CHUNKS):
        cols = chunk * CHUNK + dsl.arange(0, CHUNK)
        chunk_offsets, logical, chunk_in_row = window_offsets(rows, cols, n_cols, x_row_stride, x_col_stride, ALIGN,
                                                              SHIFT)
        chunk_mask = row_mask[:, None] & chunk_in_row
        y = dsl.load(x_ptr + chunk_offsets, mask=chunk_mask, other=0.0).to(acc_dtype)
        if SUBTRACT_MEAN:
            y = y - mean[:, None]
        y = y * rstd[:, None]
        weight, bias = affine_tiles(weight_ptr, bias_ptr, logical, chunk_in_row,
                                    "evict_last" if CACHE_HINTS else "")
        if weight is not None:
            y = y * weight.to(acc_dtype)
        if bias is not None:
            y = y + bias.to(acc_dtype)
        y_offsets, _, _ = window_offsets(rows, cols, n_cols, y_row_stride, 1, ALIGN, SHIFT)
        dsl.store(y_ptr + y_offsets, y, mask=chunk_mask, eviction_policy="evict_first" if CACHE_HINTS else "")
    if SUBTRACT_MEAN:
        dsl.store(mean_ptr + rows, mean, mask=row_mask)
    dsl.store(rstd_ptr + rows, rstd, mask=row_mask)


@dsl.jit
def forward_kernel(y_ptr, mean_ptr, rstd_ptr, x_ptr, weight_ptr, bias_ptr,
                   n_rows, n_cols, x_row_stride, x_col_stride, y_row_stride, eps,
                   SUBTRACT_MEAN: dsl.constexpr, BLOCK_ROWS: dsl.constexpr, BLOCK_N: dsl.constexpr,
                   ALIGN: dsl.constexpr = 1, SHIFT: dsl.constexpr = 0, AFFINE_FIRST: dsl.constexpr = False,
                   RELOAD: dsl.constexpr = False, CHUNKS: dsl.constexpr = 1, CACHE_HINTS: dsl.constexpr = False,
                   SHIFTED_SUMS: dsl.constexpr = False):
    # x_ptr: (n_rows, n_cols) strided; y_ptr: (n_rows, n_cols) unit column stride; weight_ptr, bias_ptr:
    # (n_cols,) contiguous or None; mean_ptr (LayerNorm only, else None), rstd_ptr: (n_rows,) float32/64.
    # One program per BLOCK_ROWS rows; BLOCK_N >= n_cols (>= n_cols + SHIFT - 1 with SHIFT).
    # ALIGN, SHIFT: see row_windows.window_offsets (SHIFT needs x_row_stride == y_row_stride and x_col_stride == 1).
    # AFFINE_FIRST: weight and bias are loaded with x, before the reductions (their latency overlaps
    # x's), instead of after them. RELOAD (AFFINE_FIRST ignored): _normalize_rows_reloaded, with
    # CHUNKS and CACHE_HINTS (with CACHE_HINTS and without RELOAD: x is loaded with evict_first,
    # weight and bias with evict_last). SHIFTED_SUMS (LayerNorm; ignored with RELOAD): the statistics from
    # sums shifted by a median of three of the row's elements (see norm_statistics.py's comment on the
    # shifted sums).
    rows = dsl.program_id(0) * BLOCK_ROWS + dsl.arange(0, BLOCK_ROWS)
    row_mask = rows < n_rows
    cols = dsl.arange(0, BLOCK_N)
    x_offsets, logical, in_row = window_offsets(rows, cols, n_cols, x_row_stride, x_col_stride, ALIGN, SHIFT)
    y_offsets, _, _ = window_offsets(rows, cols, n_cols, y_row_stride, 1, ALIGN, SHIFT)
    mask = row_mask[:, None] & in_row
    x = dsl.load(x_ptr + x_offsets, mask=mask, other=0.0,
                 eviction_policy="evict_first" if CACHE_HINTS and not RELOAD else "")
    affine_eviction: dsl.constexpr = "evict_last" if CACHE_HINTS else ""
    first = None
    if SHIFTED_SUMS and SUBTRACT_MEAN and not RELOAD:
        first = row_shifts(x_ptr, rows, row_mask, n_cols, x_row_stride, x_col_stride)
    if RELOAD:
        _normalize_rows_reloaded(y_ptr, mean_ptr, rstd_ptr, x_ptr, weight_ptr, bias_ptr, x, rows, row_mask, n_cols,
                                 x_row_stride, x_col_stride, y_row_stride, eps, SUBTRACT_MEAN, BLOCK_N, ALIGN, SHIFT,
                                 CHUNKS, CACHE_HINTS)
    elif AFFINE_FIRST:
        weight, bias = affine_tiles(weight_ptr, bias_ptr, logical, in_row, affine_eviction)
        _normalize_rows(y_ptr, mean_ptr, rstd_ptr, x, first, mask, weight, bias, None, None, logical, in_row,
                        y_offsets, rows, row_mask, n_cols, eps, SUBTRACT_MEAN)
    else:
        _normalize_rows(y_ptr, mean_ptr, rstd_ptr, x, first, mask, None, None, weight_ptr, bias_ptr, logical, in_row,
                        y_offsets, rows, row_mask, n_cols, eps, SUBTRACT_MEAN, affine_eviction)


@dsl.jit
def forward_persistent_kernel(y_ptr, mean_ptr, rstd_ptr, x_ptr, weight_ptr, bias_ptr,
                              n_rows, n_cols, x_row_stride, x_col_stride, y_row_stride, eps,
                              SUBTRACT_MEAN: dsl.constexpr, BLOCK_ROWS: dsl.constexpr, BLOCK_N: dsl.constexpr,
                              ALIGN: dsl.constexpr = 1, SHIFT: dsl.constexpr = 0, PREFETCH: dsl.constexpr = False,
                              RELOAD: dsl.constexpr = False, CHUNKS: dsl.constexpr = 1,
                              CACHE_HINTS: dsl.constexpr = False):
    # Arguments as forward_kernel. A fixed grid (a few programs per SM); program p handles the row
    # tiles p, p + G, p + 2G, ... (G = num_programs). weight and bias are loaded once per program and
    # kept in registers (with SHIFT the launcher makes G * BLOCK_ROWS a multiple of SHIFT, so that lane
    # i of every tile of a program sits at the same place in its window). PREFETCH: the next tile's x
    # is loaded before the current tile is reduced (loads stay in flight across the reductions).
    # RELOAD: each tile by _normalize_rows_reloaded (CHUNKS, CACHE_HINTS there); weight and bias are
    # then read per output chunk, not kept.
    pid = dsl.program_id(0)
    n_programs = dsl.num_programs(0)
    n_tiles = dsl.cdiv(n_rows, BLOCK_ROWS)
    lanes = dsl.arange(0, BLOCK_ROWS)
    cols = dsl.arange(0, BLOCK_N)
    _, logical, in_row = window_offsets(pid * BLOCK_ROWS + lanes, cols, n_cols, x_row_stride, x_col_stride, ALIGN,
                                        SHIFT)
    weight = None
    bias = None
    if not RELOAD:
        weight, bias = affine_tiles(weight_ptr, bias_ptr, logical, in_row)
    if PREFETCH:
        rows = pid * BLOCK_ROWS + lanes
        x_offsets, _, _ = window_offsets(rows, cols, n_cols, x_row_stride, x_col_stride, ALIGN, SHIFT)
        x = dsl.load(x_ptr + x_offsets, mask=(rows < n_rows)[:, None] & in_row, other=0.0)
    for tile in range(pid, n_tiles, n_programs):
        rows = tile * BLOCK_ROWS + lanes
        row_mask = rows < n_rows
        mask = row_mask[:, None] & in_row
        if PREFETCH:
            next_rows = rows + n_programs * BLOCK_ROWS
            next_offsets, _, _ = window_offsets(next_rows, cols, n_cols, x_row_stride, x_col_stride, ALIGN, SHIFT)
            x_next = dsl.load(x_ptr + next_offsets, mask=(next_rows < n_rows)[:, None] & in_row, other=0.0)
        else:
            x_offsets, _, _ = window_offsets(rows, cols, n_cols, x_row_stride, x_col_stride, ALIGN, SHIFT)
            x = dsl.load(x_ptr + x_offsets, mask=mask, other=0.0)
        if RELOAD:
            _normalize_rows_reloaded(y_ptr, mean_ptr, rstd_ptr, x_ptr, weight_ptr, bias_ptr, x, rows, row_mask, n_cols,
                                     x_row_stride, x_col_stride, y_row_stride, eps, SUBTRACT_MEAN, BLOCK_N, ALIGN,
                                     SHIFT, CHUNKS, CACHE_HINTS)
        else:
            y_offsets, _, _ = window_offsets(rows, cols, n_cols, y_row_stride, 1, ALIGN, SHIFT)
            _normalize_rows(y_ptr, mean_ptr, rstd_ptr, x, None, mask, weight, bias, None, None, logical, in_row,
                            y_offsets, rows, row_mask, n_cols, eps, SUBTRACT_MEAN)
        if PREFETCH:
            x = x_next


@dsl.jit
def forward_looped_kernel(y_ptr, mean_ptr, rstd_ptr, x_ptr, weight_ptr, bias_ptr,
                          n_rows, n_cols, x_row_stride, x_col_stride, y_row_stride, eps,
                          SUBTRACT_MEAN: dsl.constexpr, BLOCK_N: dsl.constexpr):
    # Arguments as forward_kernel; any n_cols, BLOCK_N columns at a time. Program p normalizes the rows
    # p, p + G, p + 2G, ... (G = num_programs: n_rows, one row each, or a few programs per SM, whose
    # second pass then finds the row in L2 as long as G rows fit there).
    for row in range(dsl.program_id(0), n_rows, dsl.num_programs(0)):
        _normalize_row_looped(y_ptr, mean_ptr, rstd_ptr, x_ptr, weight_ptr, bias_ptr, row, n_cols, x_row_stride,
                              x_col_stride, y_row_stride, eps, SUBTRACT_MEAN, BLOCK_N)


@dsl.jit
def _looped_moments(x_row, n_cols, x_col_stride, shift, BLOCK_N: dsl.constexpr):
    # -> (mean, variance) of x_row's n_cols values less `shift` (accumulation dtype): lane j runs Welford's update
    # over the columns j, j + BLOCK_N, ... it owns (every chunk but the last is full, so a lane valid in chunk k has
    # seen exactly k + 1 values), then the lanes are merged (Chan et al.'s pairwise formula over all lanes at once:
    # M2 = sum(M2_j) + sum(n_j * (mean_j - mean)^2), mean = sum(n_j * mean_j) / N).
    acc_dtype = shift.dtype
    lanes = dsl.arange(0, BLOCK_N)
    count = dsl.zeros((BLOCK_N,), acc_dtype)
    lane_mean = dsl.zeros((BLOCK_N,), acc_dtype)
    lane_m2 = dsl.zeros((BLOCK_N,), acc_dtype)
    for chunk in range(0, dsl.cdiv(n_cols, BLOCK_N)):
        cols = chunk * BLOCK_N + lanes
        mask = cols < n_cols
        x = dsl.load(x_row + cols * x_col_stride, mask=mask, other=0.0).to(acc_dtype) - shift
        count += dsl.where(mask, 1.0, 0.0)
        delta = x - lane_mean
        # one division per chunk, not per element (the loop is otherwise ALU-bound on divisions)
        # (chunk + 1 in acc_dtype: `chunk + 1.0` is a float32, whose 1 / 3, 1 / 5... cost float64 rows
        # their precision)
        lane_mean += dsl.where(mask, delta * (1.0 / (chunk + 1).to(acc_dtype)), 0.0)
        lane_m2 += dsl.where(mask, delta * (x - lane_mean), 0.0)
    mean = dsl.sum(count * lane_mean, axis=0) / n_cols
    spread = lane_mean - mean
    return mean, (dsl.sum(lane_m2, axis=0) + dsl.sum(count * spread * spread, axis=0)) / n_cols


@dsl.jit
def _normalize_row_looped(y_ptr, mean_ptr, rstd_ptr, x_ptr, weight_ptr, bias_ptr, row, n_cols, x_row_stride,
                          x_col_stride, y_row_stride, eps, SUBTRACT_MEAN: dsl.constexpr, BLOCK_N: dsl.constexpr):
    acc_dtype = rstd_ptr.dtype.element
    x_row = x_ptr + row.to(dsl.int64) * x_row_stride
    y_row = y_ptr + row.to(dsl.int64) * y_row_stride
    lanes = dsl.arange(0, BLOCK_N)
    n_chunks = dsl.cdiv(n_cols, BLOCK_N)
    # Pass 1. LayerNorm: the moments of the values taken relative to a shift K, the median of three of the row's
    # elements (columns 0, (N - 1) // 2, N - 1: one outlier column is never K): the merged mean's rounding, which
    # rstd multiplies, is then relative to the row's spread, not its magnitude (a constant row gives exactly the
    # bias; without a shift a float32 row of 16385 x 12345.678 gave |y| = 0.5). Where K still lies far from the
    # mean (two sampled outliers: |mean - K| > 8 deviations), the shifted values and their mean round to K's
    # magnitude (y off by up to 1e-3 of its size): the moments are taken again about the mean found (a loop of
    # 0 or 1 trips), which cancels nothing.
    # RMSNorm: lane-wise sums of squares.
    if SUBTRACT_MEAN:
        shift = sampled_median(x_row, n_cols, x_col_stride, n_cols > 0).to(acc_dtype)
        mean, variance = _looped_moments(x_row, n_cols, x_col_stride, shift, BLOCK_N)
        again = (dsl.abs(mean) > 8.0 * dsl.sqrt(variance)).to(dsl.int32)
        for _ in range(0, again):
            shift = shift + mean
            mean, variance = _looped_moments(x_row, n_cols, x_col_stride, shift, BLOCK_N)
        dsl.store(mean_ptr + row, shift + mean)
    else:
        lane_m2 = dsl.zeros((BLOCK_N,), acc_dtype)
        for chunk in range(0, n_chunks):
            cols = chunk * BLOCK_N + lanes
            x = dsl.load(x_row + cols * x_col_stride, mask=cols < n_cols, other=0.0).to(acc_dtype)
            lane_m2 += x * x
        variance = dsl.sum(lane_m2, axis=0) / n_cols
    rstd = 1.0 / dsl.sqrt(variance + eps)
    dsl.store(rstd_ptr + row, rstd)
    # Pass 2: normalize (the row is read again, usually from L2).
    for chunk in range(0, n_chunks):
        cols = chunk * BLOCK_N + lanes
        mask = cols < n_cols
        x = dsl.load(x_row + cols * x_col_stride, mask=mask, other=0.0).to(acc_dtype)
        if SUBTRACT_MEAN:
            x = (x - shift) - mean
        y = x * rstd
        if weight_ptr is not None:
            y = y * dsl.load(weight_ptr + cols, mask=mask, other=0.0).to(acc_dtype)
        if bias_ptr is not None:
            y = y + dsl.load(bias_ptr + cols, mask=mask, other=0.0).to(acc_dtype)
        dsl.store(y_row + cols, y, mask=mask)
