"""The LayerNorm/RMSNorm forward in row sweeps (ForwardConfig.row_sweeps): `forward_row_sweeps_kernel`, one row
per step of a program's row loop in two sweeps over CHUNK-column chunks.

Per-thread Welford/Chan statistics in registers reduced across the CTA once per row, then the row read
again (from L2) for y; L2 eviction hints and a register cap (dsl.launch_bounds) per config. Candidates
for long 16-bit rows (see the comment above _thread_sum). SHIFT (ForwardConfig.aligned_window): rows off
16-byte boundaries (odd N) through an aligned window, as softmax's row sweeps (the comment above
_window_moments).

The ops, dtypes and addressing are norm_forward_kernels.py's; the shifted sums' statistics
(SHIFTED_SUMS) are norm_statistics.py's.
"""

from __future__ import annotations

import fusedops.dsl as dsl
from fusedops.kernels.norm_statistics import needs_second_sums, sampled_median, scaled_difference, second_scale, \
    shifted_mean_rstd
from fusedops.kernels.row_windows import sweep_parts


# -- row sweeps (ForwardConfig.row_sweeps) ---------------------------------------------------------
# forward_row_sweeps_kernel normalizes one row per step of a program's row loop in two sweeps over
# CHUNK-column chunks: the first keeps per-thread statistics in registers and the CTA reduces them once
# per row (no barrier per chunk); the second reads the row again (from L2: few rows are in flight; the
# first sweep's loads evict_last, the second's evict_first) and writes y (streaming stores).
# A chunk is viewed as [CHUNK // PIECE, THREADS, VECTOR] (PIECE = THREADS * VECTOR), which matches its
# load layout (a thread's 16-byte vector along axis 2, the threads along axis 1, a thread's further
# vectors along axis 0), so reducing axes 0 and 2 stays in a thread's registers and leaves [1, THREADS,
# 1] statistics (softmax_row_sweeps.py does the same). The n_cols // CHUNK full chunks are unmasked
# (whole 16-byte vectors, no per-element predicates); the rest of the row goes in pieces of PIECE
# columns (one vector per thread) masked by `column < n_cols`, so padded lanes never enter a statistic.
# LayerNorm's statistics are Welford-quality (no value is squared before a mean is taken off it, so rows
# shifted by large constants keep their variance): a chunk's per-thread (count, mean, M2) is computed
# in two passes over the chunk in registers and merged into the thread's running ones by Chan et al.'s
# update ("Updating formulae and a pairwise algorithm for computing sample variances", 1979):
#     n = n_a + n_b,  d = mean_b - mean_a,  mean = mean_a + d n_b / n,  M2 = M2_a + M2_b + d^2 n_a n_b / n;
# the CTA then merges the threads in two reductions: mean = sum(n_t mean_t) / N, then
# M2 = sum(M2_t + n_t (mean_t - mean)^2). All of it on x - x[row, 0] (exact for 16-bit x): the means
# stay near 0, so their rounding does not leak into the d^2 and (mean_t - mean)^2 terms (rows of mean
# 1e4 and variance 9 in float32: rstd to 1e-7 relative instead of 1e-5, torch's), and y is formed as
# ((x - x[row, 0]) - mean) * rstd. A far outlier in column 0 only brings back the unshifted rounding.
# With SHIFTED_SUMS (the launchers' default for 16-bit LayerNorm rows since session 14: 2-6% faster, one
# exchange a row) the threads keep the shifted sums of norm_statistics.py's comment instead, about a
# median of three of the row's elements. A row whose shift lies far from its mean (|K - mean| > 8
# deviations: two of the sampled columns are outliers), or whose scaled squares left float32's normal
# range (needs_second_sums), takes the sums once more, from L2, about its mean: Welford-grade statistics
# for those rows (one more sweep and exchange), the one-exchange speed for the others. RMSNorm keeps
# per-thread sums of squares.
@dsl.jit
def _thread_sum(values):
    # [K, THREADS, VECTOR] -> [1, THREADS, 1]: the sum of each thread's own elements (no shuffles).
    return dsl.sum(dsl.sum(values, axis=2, keep_dims=True), axis=0, keep_dims=True)


@dsl.jit
def _shifted(x, shift, scale, SUMS: dsl.constexpr):
    # -> what _add_moments takes of x: x - shift, or with SUMS (x - shift) * scale (scaled_difference).
    if SUMS:
        return scaled_difference(x, shift, scale)
    return x - shift


@dsl.jit
def _add_moments(x, mask, count, mean, m2, THREADS: dsl.constexpr, VECTOR: dsl.constexpr,
                 SUBTRACT_MEAN: dsl.constexpr, MASKED: dsl.constexpr, SUMS: dsl.constexpr = False):
    # -> the per-thread (count, mean, M2) ([1, THREADS, 1]) of the elements seen so far and those of x (a
    # chunk or a piece in the accumulation dtype, 0 where masked off; _shifted); RMSNorm: m2 is the sum of
    # squares (count and mean unused). MASKED: `mask` says which elements of x are the row's. SUMS
    # (LayerNorm): the shifted sums instead (norm_statistics.py's comment): `mean` accumulates x (the
    # scaled differences) and m2 their squares (count unused).
    x = dsl.reshape(x, (x.shape[0] // (THREADS * VECTOR), THREADS, VECTOR))
    if not SUBTRACT_MEAN:
        return count, mean, m2 + _thread_sum(x * x)
    if SUMS:
        return count, mean + _thread_sum(x), m2 + _thread_sum(x * x)
    if MASKED:
        mask = dsl.reshape(mask, (mask.shape[0] // (THREADS * VECTOR), THREADS, VECTOR))
        part_count = _thread_sum(dsl.where(mask, 1.0, 0.0))
        part_mean = _thread_sum(x) / dsl.maximum(part_count, 1.0)
        deviation = dsl.where(mask, x - part_mean, 0.0)
    else:
        part_count = x.shape[0] * VECTOR * 1.0
        part_mean = _thread_sum(x) * (1.0 / part_count)
        deviation = x - part_mean
    total = count + part_count
    share = part_count / dsl.maximum(total, 1.0)        # 0 for a thread with no element in x or before
    delta = part_mean - mean
    return total, mean + delta * share, m2 + _thread_sum(deviation * deviation) + delta * delta * (count * share)


@dsl.jit
def _row_statistics(mean_ptr, rstd_ptr, row, count, mean, m2, shift, n_cols, eps, THREADS: dsl.constexpr,
                    SUBTRACT_MEAN: dsl.constexpr):
    # Once per row: the CTA's statistics from the per-thread ones (see above), stored; -> (the mean of
    # x - shift, rstd) (mean 0.0 for RMSNorm).
    m2 = dsl.reshape(m2, (THREADS,))
    row_mean = 0.0
    if SUBTRACT_MEAN:
        count = dsl.reshape(count, (THREADS,))
        mean = dsl.reshape(mean, (THREADS,))
        row_mean = dsl.sum(count * mean, axis=0) / n_cols
        spread = mean - row_mean
        m2 = m2 + count * spread * spread
        dsl.store(mean_ptr + row, shift + row_mean)
    rstd = 1.0 / dsl.sqrt(dsl.sum(m2, axis=0) / n_cols + eps)
    dsl.store(rstd_ptr + row, rstd)
    return row_mean, rstd


@dsl.jit
def _row_shifted_statistics(mean_ptr, rstd_ptr, row, total, squares, shift, n_cols, eps, scale,
                            THREADS: dsl.constexpr):
    # Once per row, LayerNorm with SUMS: the statistics from the per-thread shifted sums (_add_moments'
    # `mean` and `m2` of (x - shift) * scale; one exchange), stored; -> (the mean of x - shift, rstd, again).
    # again: needs_second_sums; the caller takes the sums once more, about this mean (second_scale).
    total = dsl.sum(dsl.reshape(total, (THREADS,)), axis=0)
    squares = dsl.sum(dsl.reshape(squares, (THREADS,)), axis=0)
    absolute, rstd = shifted_mean_rstd(total, squares, shift, n_cols, eps, scale)
    dsl.store(mean_ptr + row, absolute)
    dsl.store(rstd_ptr + row, rstd)
    return total / n_cols * (1.0 / scale), rstd, needs_second_sums(total, squares, n_cols)


@dsl.jit
def _row_shift(x_row, n_cols, col_stride, SUMS: dsl.constexpr):
    # The LayerNorm row sweeps' shift (n_cols >= 1): x[row, 0], or with SUMS the median of three of the
    # row's elements (norm_statistics.py's comment on the shifted sums), in x's own dtype.
    if SUMS:
        return sampled_median(x_row, n_cols, col_stride, None)
    return dsl.load(x_row)


@dsl.jit
def _load_part(pointers, mask, EVICTION: dsl.constexpr, MASKED: dsl.constexpr):
    if MASKED:
        return dsl.load(pointers, mask=mask, other=0.0, eviction_policy=EVICTION)
    return dsl.load(pointers, eviction_policy=EVICTION)


@dsl.jit
def _write_part(y_row, x_row, weight_ptr, bias_ptr, cols, mask, x_col_stride, shift, mean, rstd,
                SUBTRACT_MEAN: dsl.constexpr, MASKED: dsl.constexpr, SECOND_EVICTION: dsl.constexpr,
                AFFINE_EVICTION: dsl.constexpr, STORE_CACHE: dsl.constexpr):
    # The second sweep over the columns `cols` of one row (a chunk, or a piece masked by `mask`); LayerNorm:
    # `mean` is that of x - shift.
    y = _load_part(x_row + cols * x_col_stride, mask, SECOND_EVICTION, MASKED).to(rstd.dtype)
    if SUBTRACT_MEAN:
        y = (y - shift) - mean
    y = y * rstd
    if weight_ptr is not None:
        y = y * _load_part(weight_ptr + cols, mask, AFFINE_EVICTION, MASKED).to(rstd.dtype)
    if bias_ptr is not None:
        y = y + _load_part(bias_ptr + cols, mask, AFFINE_EVICTION, MASKED).to(rstd.dtype)
    if MASKED:
        dsl.store(y_row + cols, y.to(y_row.dtype.element), mask=mask, cache_modifier=STORE_CACHE)
    else:
        dsl.store(y_row + cols, y.to(y_row.dtype.element), cache_modifier=STORE_CACHE)


@dsl.jit
def _row_moments(x_row, shift, scale, n_cols, x_col_stride, acc_dtype: dsl.constexpr, CHUNK: dsl.constexpr,
                 THREADS: dsl.constexpr, VECTOR: dsl.constexpr, SUBTRACT_MEAN: dsl.constexpr,
                 EVICTION: dsl.constexpr, SUMS: dsl.constexpr):
    # Sweep 1 of _normalize_row_sweeps: -> the per-thread (count, mean, M2) of the row's x - shift (see
    # _add_moments; SUMS: the shifted sums of (x - shift) * scale) over its CHUNK-column chunks, then masked
    # pieces.
    PIECE: dsl.constexpr = THREADS * VECTOR
    chunk = dsl.arange(0, CHUNK)
    piece = dsl.arange(0, PIECE)
    chunks = n_cols // CHUNK
    tail = chunks * CHUNK
    count = dsl.zeros((1, THREADS, 1), acc_dtype)
    mean = dsl.zeros((1, THREADS, 1), acc_dtype)
    m2 = dsl.zeros((1, THREADS, 1), acc_dtype)
    for index in range(0, chunks):
        x = _load_part(x_row + (index * CHUNK + chunk) * x_col_stride, None, EVICTION, False).to(acc_dtype)
        count, mean, m2 = _add_moments(_shifted(x, shift, scale, SUMS), None, count, mean, m2, THREADS, VECTOR,
                                       SUBTRACT_MEAN, False, SUMS)
    for index in range(0, (n_cols - tail + PIECE - 1) // PIECE):
        cols = tail + index * PIECE + piece
        in_row = cols < n_cols
        x = _load_part(x_row + cols * x_col_stride, in_row, EVICTION, True).to(acc_dtype)
        count, mean, m2 = _add_moments(dsl.where(in_row, _shifted(x, shift, scale, SUMS), 0.0), in_row, count, mean,
                                       m2, THREADS, VECTOR, SUBTRACT_MEAN, True, SUMS)
    return count, mean, m2


@dsl.jit
def _normalize_row_sweeps(y_ptr, mean_ptr, rstd_ptr, x_ptr, weight_ptr, bias_ptr, row, n_cols, x_row_stride,
                          x_col_stride, y_row_stride, eps, SUBTRACT_MEAN: dsl.constexpr, CHUNK: dsl.constexpr,
                          THREADS: dsl.constexpr, VECTOR: dsl.constexpr, ALIGN: dsl.constexpr,
                          FIRST_EVICTION: dsl.constexpr, SECOND_EVICTION: dsl.constexpr,
                          AFFINE_EVICTION: dsl.constexpr, STORE_CACHE: dsl.constexpr, SUMS: dsl.constexpr = False):
    acc_dtype = rstd_ptr.dtype.element
    x_row = x_ptr + dsl.multiple_of(row.to(dsl.int64) * x_row_stride, ALIGN)
    y_row = y_ptr + dsl.multiple_of(row.to(dsl.int64) * y_row_stride, ALIGN)
    PIECE: dsl.constexpr = THREADS * VECTOR
    chunk = dsl.arange(0, CHUNK)
    piece = dsl.arange(0, PIECE)
    chunks = n_cols // CHUNK
    tail = chunks * CHUNK
    pieces = (n_cols - tail + PIECE - 1) // PIECE
    shift = 0.0
    if SUBTRACT_MEAN:
        shift = _row_shift(x_row, n_cols, x_col_stride, SUMS).to(acc_dtype)
    # Sweep 1: per-thread statistics of x - shift.
    count, mean, m2 = _row_moments(x_row, shift, 1.52587890625e-05, n_cols, x_col_stride, acc_dtype, CHUNK, THREADS,
                                   VECTOR, SUBTRACT_MEAN, FIRST_EVICTION, SUMS)
    if SUBTRACT_MEAN and SUMS:
        row_mean, rstd, again = _row_shifted_statistics(mean_ptr, rstd_ptr, row, mean, m2, shift, n_cols, eps,
                                                        1.52587890625e-05, THREADS)
        for _ in range(0, again.to(dsl.int32)):       # the sums again (from L2), about the mean (second_scale)
            scale = second_scale(rstd)
            shift = shift + row_mean
            count, mean, m2 = _row_moments(x_row, shift, scale, n_cols, x_col_stride, acc_dtype, CHUNK, THREADS,
                                           VECTOR, SUBTRACT_MEAN, FIRST_EVICTION, SUMS)
            row_mean, rstd, again = _row_shifted_statistics(mean_ptr, rstd_ptr, row, mean, m2, shift, n_cols, eps,
                                                            scale, THREADS)
    else:
        row_mean, rstd = _row_statistics(mean_ptr, rstd_ptr, row, count, mean, m2, shift, n_cols, eps, THREADS,
                                         SUBTRACT_MEAN)
    # Sweep 2: y, in the first sweep's order (the least recently read chunk first).
    for index in range(0, chunks):
        _write_part(y_row, x_row, weight_ptr, bias_ptr, index * CHUNK + chunk, None, x_col_stride, shift, row_mean,
                    rstd, SUBTRACT_MEAN, False, SECOND_EVICTION, AFFINE_EVICTION, STORE_CACHE)
    for index in range(0, pieces):
        cols = tail + index * PIECE + piece
        _write_part(y_row, x_row, weight_ptr, bias_ptr, cols, cols < n_cols, x_col_stride, shift, row_mean, rstd,
                    SUBTRACT_MEAN, True, SECOND_EVICTION, AFFINE_EVICTION, STORE_CACHE)


# With SHIFT (ForwardConfig.aligned_window; rows that start off 16-byte boundaries, odd N) a row is
# addressed through a window (softmax_row_sweeps.py, "persistent row sweeps" there): window position p
# of x and y is the row's column p - first, first = (row start mod SHIFT) (x and y share one row stride
# and have unit column strides, so first is the same for both), and the window starts on a 16-byte
# boundary when the tensor does. Each sweep goes over it in three parts:
#   edges   [0, GROUP) and [middle, middle + GROUP), EDGE elements (one per thread), masked per
#           element by first <= p < first + n_cols, viewed as [EDGE // THREADS, THREADS, 1];
#   chunks  of CHUNK from GROUP on, as long as they end by `middle`: unmasked whole 16-byte vectors;
#   pieces  of PIECE from there to `middle`, masked by p < middle (constant over each vector);
# GROUP = max(SHIFT, VECTOR) > first and middle = max(GROUP, (first + n_cols) rounded down to VECTOR).
# Masked lanes never enter a statistic (the masked _add_moments counts only the row's elements);
# weight and bias are read at the row's columns, p - first (not 16-byte aligned: scalar loads, from L1
# and L2), or with AFFINE_SHIFTED from shifted copies made by the launcher (`shifted_affine_copies`):
# SHIFT rows of affine_copy_stride(n_cols, SHIFT) elements (a multiple of SHIFT), copy f holding
# column c at position c + f, so that copy `first` lines up with the window and the chunks read it in
# 16-byte vectors as they read x; LayerNorm's shift is x[row, 0], at window position first.
@dsl.jit
def affine_copy_stride(n_cols, SHIFT: dsl.constexpr):
    # The row stride of the shifted affine copies: n_cols + SHIFT - 1 positions, rounded up to SHIFT.
    return (n_cols + 2 * SHIFT - 2) // SHIFT * SHIFT



@dsl.jit
def _window_moments(x_window, at, mask, shift, count, mean, m2, THREADS: dsl.constexpr, VECTOR: dsl.constexpr,
                    SUBTRACT_MEAN: dsl.constexpr, MASKED: dsl.constexpr, EVICTION: dsl.constexpr,
                    SUMS: dsl.constexpr = False, scale=1.0):
    # -> the per-thread statistics updated with x - shift at window positions `at` (masked by `mask`).
    x = _shifted(_load_part(x_window + at, mask, EVICTION, MASKED).to(count.dtype), shift, scale, SUMS)
    if MASKED:
        x = dsl.where(mask, x, 0.0)
    return _add_moments(x, mask, count, mean, m2, THREADS, VECTOR, SUBTRACT_MEAN, MASKED, SUMS)


@dsl.jit
def _window_row_moments(x_window, shift, scale, edges, edge_mask, middle, chunks, tail, pieces, acc_dtype: dsl.constexpr,
                        CHUNK: dsl.constexpr, THREADS: dsl.constexpr, VECTOR: dsl.constexpr, GROUP: dsl.constexpr,
                        SUBTRACT_MEAN: dsl.constexpr, EVICTION: dsl.constexpr, SUMS: dsl.constexpr):
    # Sweep 1 of _normalize_row_window_sweeps: -> the per-thread (count, mean, M2) of the row's x - shift over
    # the window's edges, chunks and pieces (see the comment above).
    PIECE: dsl.constexpr = THREADS * VECTOR
    count = dsl.zeros((1, THREADS, 1), acc_dtype)
    mean = dsl.zeros((1, THREADS, 1), acc_dtype)
    m2 = dsl.zeros((1, THREADS, 1), acc_dtype)
    count, mean, m2 = _window_moments(x_window, edges, edge_mask, shift, count, mean, m2, THREADS, 1, SUBTRACT_MEAN,
                                      True, EVICTION, SUMS, scale)
    for index in range(0, chunks):
        count, mean, m2 = _window_moments(x_window, GROUP + index * CHUNK + dsl.arange(0, CHUNK), None, shift, count,
                                          mean, m2, THREADS, VECTOR, SUBTRACT_MEAN, False, EVICTION, SUMS, scale)
    for index in range(0, pieces):
        at = tail + index * PIECE + dsl.arange(0, PIECE)
        count, mean, m2 = _window_moments(x_window, at, at < middle, shift, count, mean, m2, THREADS, VECTOR,
                                          SUBTRACT_MEAN, True, EVICTION, SUMS, scale)
    return count, mean, m2


@dsl.jit
def _normalize_row_window_sweeps(y_ptr, mean_ptr, rstd_ptr, x_ptr, weight_ptr, bias_ptr, row, n_cols, x_row_stride,
                                 y_row_stride, eps, SUBTRACT_MEAN: dsl.constexpr, CHUNK: dsl.constexpr,
                                 THREADS: dsl.constexpr, VECTOR: dsl.constexpr, SHIFT: dsl.constexpr,
                                 FIRST_EVICTION: dsl.constexpr, SECOND_EVICTION: dsl.constexpr,
                                 AFFINE_EVICTION: dsl.constexpr, STORE_CACHE: dsl.constexpr,
                                 AFFINE_SHIFTED: dsl.constexpr, SUMS: dsl.constexpr = False):
    # _normalize_row_sweeps through the aligned window (see above); x_row_stride == y_row_stride.
    acc_dtype = rstd_ptr.dtype.element
    x_start = row.to(dsl.int64) * x_row_stride
    first = (x_start % SHIFT).to(dsl.int32)
    x_window = x_ptr + dsl.multiple_of(x_start - first, SHIFT)
    y_window = y_ptr + dsl.multiple_of(row.to(dsl.int64) * y_row_stride - first, SHIFT)
    affine_offset = -first                      # weight_window + p: the weight of window position p
    if AFFINE_SHIFTED:
        affine_offset = dsl.multiple_of(first * affine_copy_stride(n_cols, SHIFT), SHIFT)
    weight_window = weight_ptr
    if weight_ptr is not None:
        weight_window = weight_ptr + affine_offset
    bias_window = bias_ptr
    if bias_ptr is not None:
        bias_window = bias_ptr + affine_offset
    PIECE: dsl.constexpr = THREADS * VECTOR
    GROUP: dsl.constexpr = SHIFT if SHIFT > VECTOR else VECTOR
    EDGE: dsl.constexpr = THREADS if THREADS > 2 * GROUP else 2 * GROUP
    edges, edge_mask, middle, chunks, tail, pieces = sweep_parts(n_cols, first, CHUNK, PIECE, GROUP, VECTOR, EDGE)
    chunk = dsl.arange(0, CHUNK)
    piece = dsl.arange(0, PIECE)
    shift = 0.0
    if SUBTRACT_MEAN:
        shift = _row_shift(x_window + first, n_cols, 1, SUMS).to(acc_dtype)
    # Sweep 1: per-thread statistics of x - shift.
    count, mean, m2 = _window_row_moments(x_window, shift, 1.52587890625e-05, edges, edge_mask, middle, chunks, tail,
                                          pieces, acc_dtype, CHUNK, THREADS, VECTOR, GROUP, SUBTRACT_MEAN,
                                          FIRST_EVICTION, SUMS)
    if SUBTRACT_MEAN and SUMS:
        row_mean, rstd, again = _row_shifted_statistics(mean_ptr, rstd_ptr, row, mean, m2, shift, n_cols, eps,
                                                        1.52587890625e-05, THREADS)
        for _ in range(0, again.to(dsl.int32)):       # the sums again (from L2), about the mean (second_scale)
            scale = second_scale(rstd)
            shift = shift + row_mean
            count, mean, m2 = _window_row_moments(x_window, shift, scale, edges, edge_mask, middle, chunks, tail,
                                                  pieces, acc_dtype, CHUNK, THREADS, VECTOR, GROUP, SUBTRACT_MEAN,
                                                  FIRST_EVICTION, SUMS)
            row_mean, rstd, again = _row_shifted_statistics(mean_ptr, rstd_ptr, row, mean, m2, shift, n_cols, eps,
                                                            scale, THREADS)
    else:
        row_mean, rstd = _row_statistics(mean_ptr, rstd_ptr, row, count, mean, m2, shift, n_cols, eps, THREADS,
                                         SUBTRACT_MEAN)
    # Sweep 2: y, in the first sweep's order.
    _write_part(y_window, x_window, weight_window, bias_window, edges, edge_mask, 1, shift, row_mean, rstd,
                SUBTRACT_MEAN, True, SECOND_EVICTION, AFFINE_EVICTION, STORE_CACHE)
    for index in range(0, chunks):
        _write_part(y_window, x_window, weight_window, bias_window, GROUP + index * CHUNK + chunk, None, 1, shift,
                    row_mean, rstd, SUBTRACT_MEAN, False, SECOND_EVICTION, AFFINE_EVICTION, STORE_CACHE)
    for index in range(0, pieces):
        at = tail + index * PIECE + piece
        _write_part(y_window, x_window, weight_window, bias_window, at, at < middle, 1, shift, row_mean, rstd,
                    SUBTRACT_MEAN, True, SECOND_EVICTION, AFFINE_EVICTION, STORE_CACHE)


@dsl.jit
def forward_row_sweeps_kernel(y_ptr, mean_ptr, rstd_ptr, x_ptr, weight_ptr, bias_ptr,
                              n_rows, n_cols, x_row_stride, x_col_stride, y_row_stride, eps,
                              SUBTRACT_MEAN: dsl.constexpr, CHUNK: dsl.constexpr, THREADS: dsl.constexpr,
                              VECTOR: dsl.constexpr, ALIGN: dsl.constexpr = 1, FIRST_EVICTION: dsl.constexpr = "",
                              SECOND_EVICTION: dsl.constexpr = "", AFFINE_EVICTION: dsl.constexpr = "",
                              STORE_CACHE: dsl.constexpr = "", MIN_BLOCKS: dsl.constexpr = 0,
                              SHIFT: dsl.constexpr = 0, AFFINE_SHIFTED: dsl.constexpr = False,
                              SHIFTED_SUMS: dsl.constexpr = False):
    # Arguments as norm_forward_kernels.forward_kernel; any n_cols. Program p normalizes the rows p, p + G,
    # ... (G = num_programs) by the row sweeps (see above). THREADS, VECTOR: the chunk's load layout (THREADS
    # threads of VECTOR consecutive elements; the launcher derives them as the default blocked layout
    # lays out CHUNK elements of the narrowest dtype moved); ALIGN: a power of two dividing both row
    # strides. FIRST_EVICTION / SECOND_EVICTION: eviction_policy of x's loads in each sweep;
    # AFFINE_EVICTION: of weight's and bias's; STORE_CACHE: y's cache_modifier. MIN_BLOCKS > 0:
    # dsl.launch_bounds (registers capped for that many CTAs per SM). SHIFT > 0 (the elements of a
    # 16-byte vector of x; x_row_stride == y_row_stride, x_col_stride == 1; ALIGN unused): rows through
    # the aligned window (_normalize_row_window_sweeps); AFFINE_SHIFTED: weight_ptr and bias_ptr are then
    # the launcher's shifted copies of them (see above). SHIFTED_SUMS (LayerNorm): the statistics from the
    # shifted sums (norm_statistics.py's comment; one exchange a row) instead of Welford/Chan.
    if MIN_BLOCKS:
        dsl.launch_bounds(MIN_BLOCKS)
    for row in range(dsl.program_id(0), n_rows, dsl.num_programs(0)):
        if SHIFT:
            _normalize_row_window_sweeps(y_ptr, mean_ptr, rstd_ptr, x_ptr, weight_ptr, bias_ptr, row, n_cols,
                                         x_row_stride, y_row_stride, eps, SUBTRACT_MEAN, CHUNK, THREADS, VECTOR,
                                         SHIFT, FIRST_EVICTION, SECOND_EVICTION, AFFINE_EVICTION, STORE_CACHE,
                                         AFFINE_SHIFTED, SHIFTED_SUMS)
        else:
            _normalize_row_sweeps(y_ptr, mean_ptr, rstd_ptr, x_ptr, weight_ptr, bias_ptr, row, n_cols,
                                  x_row_stride, x_col_stride, y_row_stride, eps, SUBTRACT_MEAN, CHUNK, THREADS, VECTOR,
                                  ALIGN, FIRST_EVICTION, SECOND_EVICTION, AFFINE_EVICTION, STORE_CACHE, SHIFTED_SUMS)
