"""LayerNorm and RMSNorm kernels, forward and backward, in the DSL (one set of kernels for both ops).

Both ops normalize each row of a (M, N) matrix x (the leading dims flattened into M rows, the
normalized dims into N columns):

    LayerNorm:  mean = sum(x) / N,  rstd = 1 / sqrt(sum((x - mean)^2) / N + eps),  xhat = (x - mean) * rstd
    RMSNorm:                        rstd = 1 / sqrt(sum(x^2) / N + eps),           xhat = x * rstd
    y = xhat * weight + bias        (weight and bias optional; RMSNorm has no bias)

The constexpr SUBTRACT_MEAN selects LayerNorm (True) or RMSNorm (False). Statistics, eps and all
arithmetic are in the accumulation dtype: float32 for 16- and 32-bit inputs, float64 for float64 (it is
the element type of the rstd buffer). The forward saves mean (LayerNorm) and rstd per row.

Backward, with g = dy * weight (dy without weight) and c1 = sum(xhat * g) / N, c2 = sum(g) / N:

    dx = rstd * (g - xhat * c1 - c2)      (RMSNorm: rstd * (g - xhat * c1))
    dweight = sum over rows of dy * xhat,    dbias = sum over rows of dy

dweight and dbias are reduced in two stages with no atomics, so results are bitwise reproducible for
a given shape and device: each program owns a contiguous group of rows and writes its column sums to
its own row of a (num_programs, N) float32 partial buffer; `column_sum_kernel` then adds the rows of
that buffer up in a fixed order.

Kernels and when the launchers (norms.py) use them:
- `forward_kernel`: a (BLOCK_ROWS, BLOCK_N) tile of whole rows in registers, one pass over memory.
  Used while the padded row fits (see norms.forward_config). RELOAD (`_normalize_rows_reloaded`): the
  variance and the output re-read x (L1 hits) instead of keeping it in registers (16-bit LayerNorm
  rows of 4096, 16384 and 32768 padded columns; CACHE_HINTS at 1024 to 16384).
- `forward_looped_kernel`: one row per program in BLOCK_N-column chunks: a first pass keeps per-lane
  Welford statistics (count, mean, M2) that are merged exactly at the end, a second pass normalizes.
- `forward_row_sweeps_kernel` (ForwardConfig.row_sweeps): one row per step of a program's row loop in
  two sweeps over CHUNK-column chunks: per-thread Welford/Chan statistics in registers reduced across
  the CTA once per row, then the row read again (from L2) for y; L2 eviction hints and a register cap
  (dsl.launch_bounds) per config. Candidates for long 16-bit rows (see the comment above it). SHIFT
  (ForwardConfig.aligned_window): rows off 16-byte boundaries (odd N) through an aligned window, as
  softmax's row sweeps (the comment above _window_moments).
- `backward_fused_kernel`: a program walks its row group BLOCK_ROWS rows at a time with whole rows in
  registers and keeps its dweight/dbias column sums in registers (x and dy are read once).
- `backward_partials_kernel` + `backward_input_kernel`: the split backward for rows too long to keep
  in registers next to the column sums. The first kernel tiles (row group, column chunk); it reads x
  and dy once to produce the dweight/dbias partials and each row's c1/c2 restricted to its chunk. The
  second sums a row's chunk contributions to c1/c2 and writes dx (x and dy are read a second time).
  Both row loops are `_group_column_sums`; with PREFETCH it issues the next row block's loads before
  reducing the current one, so that a program keeps two blocks of loads in flight.
- `column_sum_kernel`: the second stage of the dweight/dbias reduction.
- norm_split_window.py: the forward and backward of 16-bit rows of 514 to 4097 columns that start off
  16-byte boundaries (N % 8 != 0), through a split window (a power-of-two main tile of whole vectors
  plus a small edge tile).

Addressing: row r, column c of x is at x_ptr + r * x_row_stride + c * x_col_stride, with the row
offset computed in int64 (tensors may hold more than 2**31 elements); column offsets stay int32 (the
launcher guarantees (N - 1) * |col stride| < 2**31). Padded lanes (columns >= N, rows >= M) load 0
and are excluded from every statistic with explicit masks. Output and statistics buffers are
contiguous.
"""

from __future__ import annotations

import fusedops.dsl as dsl
from fusedops.kernels.row_windows import sweep_parts


@dsl.jit
def _row_window(rows, cols, n_cols, row_stride, col_stride, ALIGN: dsl.constexpr, SHIFT: dsl.constexpr):
    # -> (offsets, logical, in_row): element offsets of the (rows, cols) tile of a tensor, the column of
    # the row each element holds and whether it holds one (0 <= logical < n_cols). rows: (R,) int32.
    # SHIFT = 0: `cols` are the row's columns; ALIGN (a power of two dividing the row stride) keeps
    # 16-byte vectors for row strides such as 1000 fp16 elements. logical and in_row are then (1, C).
    # SHIFT > 0 (the elements of a 16-byte vector; unit column stride, a row stride shared by every
    # tensor addressed with it): rows that start anywhere (odd N) are read through a window that starts
    # at the SHIFT-element boundary at or before the row, so whole 16-byte groups move as vectors;
    # `cols` are window positions and the row's column c sits at position c + (row start mod SHIFT).
    # logical and in_row are then (R, C). Row offsets are int64 (tensors may exceed 2**31 elements).
    base = rows.to(dsl.int64) * row_stride
    if SHIFT:
        shift = base % SHIFT
        logical = cols[None, :] - shift.to(dsl.int32)[:, None]
        return (dsl.multiple_of(base - shift, SHIFT)[:, None] + cols[None, :], logical,
                (logical >= 0) & (logical < n_cols))
    logical = cols[None, :]
    return dsl.multiple_of(base, ALIGN)[:, None] + logical * col_stride, logical, logical < n_cols


@dsl.jit
def _affine_tiles(weight_ptr, bias_ptr, logical, in_row, EVICTION: dsl.constexpr = ""):
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
    # shifted by them (see the comment above forward_kernel).
    acc_dtype = rstd_ptr.dtype.element
    wide_input = x.dtype.bits > 16      # 16-bit rows: the float32 mean's rounding is far below their ulp
    x = x.to(acc_dtype)
    if SUBTRACT_MEAN and first is not None:
        x, mean, rstd = _shifted_statistics(x, first.to(acc_dtype), mask, row_mask, n_cols, eps)
    else:
        if SUBTRACT_MEAN:
            mean = dsl.sum(x, axis=1) / n_cols
            x = dsl.where(mask, x - mean[:, None], 0.0)
            if wide_input:
                mean, x = _corrected_mean(mean, x, mask, n_cols)
        rstd = 1.0 / dsl.sqrt(dsl.sum(x * x, axis=1) / n_cols + eps)
    y = x * rstd[:, None]
    if weight_ptr is not None or bias_ptr is not None:
        weight, bias = _affine_tiles(weight_ptr, bias_ptr, logical, in_row, EVICTION)
    if weight is not None:
        y = y * weight.to(acc_dtype)
    if bias is not None:
        y = y + bias.to(acc_dtype)
    dsl.store(y_ptr + y_offsets, y, mask=mask)
    if SUBTRACT_MEAN:
        dsl.store(mean_ptr + rows, mean, mask=row_mask)
    dsl.store(rstd_ptr + rows, rstd, mask=row_mask)


@dsl.jit
def _corrected_mean(mean, centered, mask, n_cols):
    # (mean, centered) with the rounding of sum(x) / N taken out: the mean of the centered rows, added to the
    # mean and taken from them (the corrected two-pass algorithm: T. Chan, G. Golub, R. LeVeque, "Algorithms
    # for computing the sample variance", The American Statistician 37(3), 1983). Without it a row of one
    # repeated float32 value (10000.3) kept x - mean = 1 ulp, which rstd ~ 1/sqrt(eps) turned into +-0.3.
    # Float32 / float64 rows only: for 16-bit rows the float32 mean's rounding is far below their own ulp.
    correction = dsl.sum(centered, axis=1) / n_cols
    return mean + correction, dsl.where(mask, centered - correction[:, None], 0.0)


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
    x_offsets, _, in_row = _row_window(rows, dsl.arange(0, BLOCK_N), n_cols, x_row_stride, x_col_stride, ALIGN,
                                       SHIFT)
    mask = row_mask[:, None] & in_row
    if SUBTRACT_MEAN:
        mean = dsl.sum(x.to(acc_dtype), axis=1) / n_cols
        x = dsl.load(x_ptr + x_offsets, mask=mask, other=0.0)
        centered = dsl.where(mask, x.to(acc_dtype) - mean[:, None], 0.0)
        if x.dtype.bits > 16:       # (16-bit rows: the float32 mean's rounding is far below their ulp)
            mean, centered = _corrected_mean(mean, centered, mask, n_cols)
        rstd = 1.0 / dsl.sqrt(dsl.sum(centered * centered, axis=1) / n_cols + eps)
    else:
        x = x.to(acc_dtype)
        rstd = 1.0 / dsl.sqrt(dsl.sum(x * x, axis=1) / n_cols + eps)
    CHUNK: dsl.constexpr = BLOCK_N // CHUNKS
    for chunk in dsl.static_range(CHUNKS):
        cols = chunk * CHUNK + dsl.arange(0, CHUNK)
        chunk_offsets, logical, chunk_in_row = _row_window(rows, cols, n_cols, x_row_stride, x_col_stride, ALIGN,
                                                           SHIFT)
        chunk_mask = row_mask[:, None] & chunk_in_row
        y = dsl.load(x_ptr + chunk_offsets, mask=chunk_mask, other=0.0).to(acc_dtype)
        if SUBTRACT_MEAN:
            y = y - mean[:, None]
        y = y * rstd[:, None]
        weight, bias = _affine_tiles(weight_ptr, bias_ptr, logical, chunk_in_row,
                                     "evict_last" if CACHE_HINTS else "")
        if weight is not None:
            y = y * weight.to(acc_dtype)
        if bias is not None:
            y = y + bias.to(acc_dtype)
        y_offsets, _, _ = _row_window(rows, cols, n_cols, y_row_stride, 1, ALIGN, SHIFT)
        dsl.store(y_ptr + y_offsets, y, mask=chunk_mask, eviction_policy="evict_first" if CACHE_HINTS else "")
    if SUBTRACT_MEAN:
        dsl.store(mean_ptr + rows, mean, mask=row_mask)
    dsl.store(rstd_ptr + rows, rstd, mask=row_mask)


# Shifted sums (forward_kernel's SHIFTED_SUMS, LayerNorm): with a shift K near the row and d = x - K,
# the mean is K + sum(d) / N and the variance sum(d^2) / N - (sum(d) / N)^2. The two sums do not depend
# on each other, so they cross the warps in one exchange (passes/sibling_reductions.py) instead of the
# two dependent ones of mean-then-centered-squares. K is the median of three of the row's elements
# (columns 0, (N - 1) // 2, N - 1: one outlier column, such as a transformer's "massive activation"
# channel, is never the shift), which keeps the subtraction from cancelling where the mean is large
# against the spread. What still cancels is (K - mean)^2 against the variance: the variance's relative
# rounding error is about eps_f32 * (run + log2(N)) * (1 + (K - mean)^2 / variance), each thread first adding
# up a run of its own elements (block_n / threads in whole rows; N / threads in the row sweeps; measured on the
# H200 at 8192 columns: rstd within 5.4e-7 relative in the row sweeps, 7.6e-7 in the whole rows' runs of 32,
# against 1.4e-7 for Welford/Chan and torch's), ~1e-6 for rows whose median-of-three lies within a few
# deviations of the mean, up to ~N * log2(N) * 2^-24 when two of the three sampled columns are outliers
# carrying the row's variance. The sums are of d * 2^-16 (exact scaling), so that bfloat16 rows overflow
# them only past 1e22 (unscaled: 1.8e19 / sqrt(N)), beyond torch's own float32 statistics (1.8e19). The
# launchers use it for 16-bit LayerNorm rows: the whole-row tiles of at most 4096 columns and of 6145 to
# 8192, the row sweeps otherwise (norms.forward_config), and the split window's (norm_split_window.py, up
# to 4097 columns).
@dsl.jit
def _median_of_three(a, b, c):
    return dsl.maximum(dsl.minimum(a, b), dsl.minimum(dsl.maximum(a, b), c))


@dsl.jit
def _sampled_median(row_start, n_cols, col_stride, mask):
    # -> K of the row(s) starting at `row_start` (a pointer, or a block of them), in x's dtype: the median of
    # columns 0, (N - 1) // 2, N - 1; 0 where `mask` is off (None: every row is read).
    return _median_of_three(dsl.load(row_start, mask=mask, other=0.0),
                            dsl.load(row_start + (n_cols - 1) // 2 * col_stride, mask=mask, other=0.0),
                            dsl.load(row_start + (n_cols - 1) * col_stride, mask=mask, other=0.0))


@dsl.jit
def _row_shifts(x_ptr, rows, row_mask, n_cols, row_stride, col_stride):
    # -> K of `rows` ((R,), x's dtype; 0 for rows masked off): _sampled_median of each row.
    return _sampled_median(x_ptr + rows.to(dsl.int64) * row_stride, n_cols, col_stride, row_mask)


@dsl.jit
def _scaled_difference(x, shift, scale):
    # -> (x - shift) * scale (scale a power of two) formed as x * scale - shift * scale: the same single
    # rounding, but finite where x - shift itself overflows float32 (bfloat16 rows of +-2e38).
    return x * scale - shift * scale


@dsl.jit
def _shifted_moments(x, shift, mask, scale=1.52587890625e-05):
    # -> (sum of d, sum of d^2) per row, d = (x - K) * scale over the lanes of the tile x (R, C) where
    # `mask` is on (accumulation dtype); shift: K (R,) (see the comment above); scale: 2^-16, or (R, 1) for
    # the second sums (_second_sums).
    d = dsl.where(mask, _scaled_difference(x, shift[:, None], scale), 0.0)
    return dsl.sum(d, axis=1), dsl.sum(d * d, axis=1)


@dsl.jit
def _shifted_mean_rstd(total, squares, shift, n_cols, eps, scale):
    # -> (mean, rstd) of rows from their _shifted_moments sums over all n_cols columns, sums of (x - K) *
    # scale (a power of two: 2^-16, or the second sums' _second_scale).
    inverse = 1.0 / scale
    scaled_mean = total / n_cols
    second = squares / n_cols
    # (an overflowed sum of squares stays +inf: rstd 0, as torch's overflowed float32 statistics)
    variance = dsl.maximum(second - scaled_mean * scaled_mean, 0.0) * (inverse * inverse)
    # The variance unscaled before eps is added (exact; +inf, rstd 0, where torch's float32 variance
    # overflows too): eps scaled by 2^-32 instead would underflow for eps below ~1e-29.
    rstd = dsl.where(second == float("inf"), 0.0, 1.0 / dsl.sqrt(variance + eps))
    return shift + scaled_mean * inverse, rstd


@dsl.jit
def _needs_second_sums(total, squares, n_cols):
    # -> whether rows whose shifted sums (of (x - K) * scale over all n_cols columns, after the exchange) are
    # `total` and `squares` must take them again, about their mean (_second_scale): the shift lies far from the
    # mean, (K - mean)^2 > 64 variance, where the variance cancels digits; the scaled second moment fell
    # below float32's normal range, where the squares of a tiny spread (bfloat16 rows of ~1e-17) were flushed
    # or rounded away (rows of one repeated value take them too: their sums are 0, whatever their shift); or
    # it overflowed (bfloat16 rows past ~1e22: rstd is 0, as torch's, but the mean, K plus the sum, may have
    # cancelled digits against K). About the mean the sums cancel nothing, and underflow and overflow only
    # where torch's float32 statistics do.
    scaled_mean = total / n_cols
    second = squares / n_cols
    spread = dsl.sqrt(dsl.maximum(second - scaled_mean * scaled_mean, 0.0))
    # (the square root: mean^2 does not underflow against 0)
    return ((dsl.abs(scaled_mean) > 8.0 * spread) | (second < 1.1754943508222875e-38)
            | (second == float("inf")))


@dsl.jit
def _second_scale(rstd):
    # -> the scale of the second sums of rows whose first gave `rstd`: 1.0 (unscaled: tiny spreads keep their
    # squares), but 2^-16 where rstd is 0 (a variance past float32's range: the unscaled sums about the mean
    # could overflow too, and the mean is what they are taken again for).
    return dsl.where(rstd == 0.0, 1.52587890625e-05, 1.0)


@dsl.jit
def _second_sums(x, mask, x_edge, edge_mask, row_mask, total, squares, mean, rstd, n_cols, eps):
    # -> (mean, rstd) of the rows of the tiles x (R, C) and, unless None, x_edge (R, E) (accumulation dtype,
    # 0 where their masks are off), whose first shifted sums `total` and `squares` gave `mean` and `rstd`:
    # the rows on row_mask ((R,)) that _needs_second_sums take the sums again about `mean` (_second_scale; a
    # loop of 0 or 1 trips: the common tile pays one test, no exchange). The other rows keep their first
    # statistics (a fine row beside one that needs them is not summed again: unscaled, its squares could
    # overflow), and rows off row_mask (padding rows, all 0) do not start the loop.
    needs = _needs_second_sums(total, squares, n_cols) & row_mask
    again = dsl.max(needs.to(dsl.int32), axis=0)
    for _ in range(0, again):
        scale = _second_scale(rstd)
        total, squares = _shifted_moments(x, mean, mask, scale[:, None])
        if x_edge is not None:
            edge_total, edge_squares = _shifted_moments(x_edge, mean, edge_mask, scale[:, None])
            total, squares = total + edge_total, squares + edge_squares
        second_mean, second_rstd = _shifted_mean_rstd(total, squares, mean, n_cols, eps, scale)
        mean = dsl.where(needs, second_mean, mean)
        rstd = dsl.where(needs, second_rstd, rstd)
    return mean, rstd


@dsl.jit
def _shifted_statistics(x, shift, mask, row_mask, n_cols, eps):
    # -> (x - mean (lanes where `mask` is off: anything), mean, rstd) of the rows of the tile x (R, C) in
    # the accumulation dtype (float32), 0 where masked off; shift: K (R,) (see the comment above); row_mask:
    # (R,) the rows in the tensor.
    total, squares = _shifted_moments(x, shift, mask)
    mean, rstd = _shifted_mean_rstd(total, squares, shift, n_cols, eps, 1.52587890625e-05)
    mean, rstd = _second_sums(x, mask, None, None, row_mask, total, squares, mean, rstd, n_cols, eps)
    return x - mean[:, None], mean, rstd


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
    # ALIGN, SHIFT: see _row_window (SHIFT needs x_row_stride == y_row_stride and x_col_stride == 1).
    # AFFINE_FIRST: weight and bias are loaded with x, before the reductions (their latency overlaps
    # x's), instead of after them. RELOAD (AFFINE_FIRST ignored): _normalize_rows_reloaded, with
    # CHUNKS and CACHE_HINTS (with CACHE_HINTS and without RELOAD: x is loaded with evict_first,
    # weight and bias with evict_last). SHIFTED_SUMS (LayerNorm; ignored with RELOAD): the statistics from
    # sums shifted by a median of three of the row's elements (see the comment above).
    rows = dsl.program_id(0) * BLOCK_ROWS + dsl.arange(0, BLOCK_ROWS)
    row_mask = rows < n_rows
    cols = dsl.arange(0, BLOCK_N)
    x_offsets, logical, in_row = _row_window(rows, cols, n_cols, x_row_stride, x_col_stride, ALIGN, SHIFT)
    y_offsets, _, _ = _row_window(rows, cols, n_cols, y_row_stride, 1, ALIGN, SHIFT)
    mask = row_mask[:, None] & in_row
    x = dsl.load(x_ptr + x_offsets, mask=mask, other=0.0,
                 eviction_policy="evict_first" if CACHE_HINTS and not RELOAD else "")
    affine_eviction: dsl.constexpr = "evict_last" if CACHE_HINTS else ""
    first = None
    if SHIFTED_SUMS and SUBTRACT_MEAN and not RELOAD:
        first = _row_shifts(x_ptr, rows, row_mask, n_cols, x_row_stride, x_col_stride)
    if RELOAD:
        _normalize_rows_reloaded(y_ptr, mean_ptr, rstd_ptr, x_ptr, weight_ptr, bias_ptr, x, rows, row_mask, n_cols,
                                 x_row_stride, x_col_stride, y_row_stride, eps, SUBTRACT_MEAN, BLOCK_N, ALIGN, SHIFT,
                                 CHUNKS, CACHE_HINTS)
    elif AFFINE_FIRST:
        weight, bias = _affine_tiles(weight_ptr, bias_ptr, logical, in_row, affine_eviction)
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
    _, logical, in_row = _row_window(pid * BLOCK_ROWS + lanes, cols, n_cols, x_row_stride, x_col_stride, ALIGN,
                                     SHIFT)
    weight = None
    bias = None
    if not RELOAD:
        weight, bias = _affine_tiles(weight_ptr, bias_ptr, logical, in_row)
    if PREFETCH:
        rows = pid * BLOCK_ROWS + lanes
        x_offsets, _, _ = _row_window(rows, cols, n_cols, x_row_stride, x_col_stride, ALIGN, SHIFT)
        x = dsl.load(x_ptr + x_offsets, mask=(rows < n_rows)[:, None] & in_row, other=0.0)
    for tile in range(pid, n_tiles, n_programs):
        rows = tile * BLOCK_ROWS + lanes
        row_mask = rows < n_rows
        mask = row_mask[:, None] & in_row
        if PREFETCH:
            next_rows = rows + n_programs * BLOCK_ROWS
            next_offsets, _, _ = _row_window(next_rows, cols, n_cols, x_row_stride, x_col_stride, ALIGN, SHIFT)
            x_next = dsl.load(x_ptr + next_offsets, mask=(next_rows < n_rows)[:, None] & in_row, other=0.0)
        else:
            x_offsets, _, _ = _row_window(rows, cols, n_cols, x_row_stride, x_col_stride, ALIGN, SHIFT)
            x = dsl.load(x_ptr + x_offsets, mask=mask, other=0.0)
        if RELOAD:
            _normalize_rows_reloaded(y_ptr, mean_ptr, rstd_ptr, x_ptr, weight_ptr, bias_ptr, x, rows, row_mask, n_cols,
                                     x_row_stride, x_col_stride, y_row_stride, eps, SUBTRACT_MEAN, BLOCK_N, ALIGN,
                                     SHIFT, CHUNKS, CACHE_HINTS)
        else:
            y_offsets, _, _ = _row_window(rows, cols, n_cols, y_row_stride, 1, ALIGN, SHIFT)
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
def _normalize_row_looped(y_ptr, mean_ptr, rstd_ptr, x_ptr, weight_ptr, bias_ptr, row, n_cols, x_row_stride,
                          x_col_stride, y_row_stride, eps, SUBTRACT_MEAN: dsl.constexpr, BLOCK_N: dsl.constexpr):
    acc_dtype = rstd_ptr.dtype.element
    x_row = x_ptr + row.to(dsl.int64) * x_row_stride
    y_row = y_ptr + row.to(dsl.int64) * y_row_stride
    lanes = dsl.arange(0, BLOCK_N)
    n_chunks = dsl.cdiv(n_cols, BLOCK_N)
    # Pass 1. LayerNorm: lane j runs Welford's update over the columns j, j + BLOCK_N, ... it owns;
    # every chunk but the last is full, so a lane valid in chunk k has seen exactly k + 1 values. The
    # values are taken relative to the row's first one (shift): the merged mean's rounding, which rstd
    # multiplies, is then relative to the row's spread, not its magnitude (a constant row gives exactly
    # the bias; without it a float32 row of 16385 x 12345.678 gave |y| = 0.5).
    # RMSNorm: lane-wise sums of squares.
    shift = 0.0
    if SUBTRACT_MEAN:
        shift = dsl.load(x_row, mask=n_cols > 0, other=0.0).to(acc_dtype)
    count = dsl.zeros((BLOCK_N,), acc_dtype)
    lane_mean = dsl.zeros((BLOCK_N,), acc_dtype)
    lane_m2 = dsl.zeros((BLOCK_N,), acc_dtype)
    for chunk in range(0, n_chunks):
        cols = chunk * BLOCK_N + lanes
        mask = cols < n_cols
        x = dsl.load(x_row + cols * x_col_stride, mask=mask, other=0.0).to(acc_dtype)
        if SUBTRACT_MEAN:
            x = x - shift
            count += dsl.where(mask, 1.0, 0.0)
            delta = x - lane_mean
            # one division per chunk, not per element (the loop is otherwise ALU-bound on divisions)
            # (chunk + 1 in acc_dtype: `chunk + 1.0` is a float32, whose 1 / 3, 1 / 5... cost float64 rows
            # their precision)
            lane_mean += dsl.where(mask, delta * (1.0 / (chunk + 1).to(acc_dtype)), 0.0)
            lane_m2 += dsl.where(mask, delta * (x - lane_mean), 0.0)
        else:
            lane_m2 += x * x
    if SUBTRACT_MEAN:
        # Merge the lanes (Chan et al.'s pairwise formula, summed over all lanes at once):
        # M2 = sum(M2_j) + sum(n_j * (mean_j - mean)^2), mean = sum(n_j * mean_j) / N.
        mean = dsl.sum(count * lane_mean, axis=0) / n_cols
        spread = lane_mean - mean
        variance = (dsl.sum(lane_m2, axis=0) + dsl.sum(count * spread * spread, axis=0)) / n_cols
        dsl.store(mean_ptr + row, shift + mean)
    else:
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


# -- row sweeps (ForwardConfig.row_sweeps) ---------------------------------------------------------
# forward_row_sweeps_kernel normalizes one row per step of a program's row loop in two sweeps over
# CHUNK-column chunks: the first keeps per-thread statistics in registers and the CTA reduces them once
# per row (no barrier per chunk); the second reads the row again (from L2: few rows are in flight; the
# first sweep's loads evict_last, the second's evict_first) and writes y (streaming stores).
# A chunk is viewed as [CHUNK // PIECE, THREADS, VECTOR] (PIECE = THREADS * VECTOR), which matches its
# load layout (a thread's 16-byte vector along axis 2, the threads along axis 1, a thread's further
# vectors along axis 0), so reducing axes 0 and 2 stays in a thread's registers and leaves [1, THREADS,
# 1] statistics (softmax.py's row sweeps do the same). The n_cols // CHUNK full chunks are unmasked
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
# exchange a row) the threads keep the shifted sums of the comment above forward_kernel instead, about a
# median of three of the row's elements. A row whose shift lies far from its mean (|K - mean| > 8
# deviations: two of the sampled columns are outliers), or whose scaled squares left float32's normal
# range (_needs_second_sums), takes the sums once more, from L2, about its mean: Welford-grade statistics
# for those rows (one more sweep and exchange), the one-exchange speed for the others. RMSNorm keeps
# per-thread sums of squares.
@dsl.jit
def _thread_sum(values):
    # [K, THREADS, VECTOR] -> [1, THREADS, 1]: the sum of each thread's own elements (no shuffles).
    return dsl.sum(dsl.sum(values, axis=2, keep_dims=True), axis=0, keep_dims=True)


@dsl.jit
def _shifted(x, shift, scale, SUMS: dsl.constexpr):
    # -> what _add_moments takes of x: x - shift, or with SUMS (x - shift) * scale (_scaled_difference).
    if SUMS:
        return _scaled_difference(x, shift, scale)
    return x - shift


@dsl.jit
def _add_moments(x, mask, count, mean, m2, THREADS: dsl.constexpr, VECTOR: dsl.constexpr,
                 SUBTRACT_MEAN: dsl.constexpr, MASKED: dsl.constexpr, SUMS: dsl.constexpr = False):
    # -> the per-thread (count, mean, M2) ([1, THREADS, 1]) of the elements seen so far and those of x (a
    # chunk or a piece in the accumulation dtype, 0 where masked off; _shifted); RMSNorm: m2 is the sum of
    # squares (count and mean unused). MASKED: `mask` says which elements of x are the row's. SUMS
    # (LayerNorm): the shifted sums instead (the comment above forward_kernel): `mean` accumulates x (the
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
    # again: _needs_second_sums; the caller takes the sums once more, about this mean (_second_scale).
    total = dsl.sum(dsl.reshape(total, (THREADS,)), axis=0)
    squares = dsl.sum(dsl.reshape(squares, (THREADS,)), axis=0)
    absolute, rstd = _shifted_mean_rstd(total, squares, shift, n_cols, eps, scale)
    dsl.store(mean_ptr + row, absolute)
    dsl.store(rstd_ptr + row, rstd)
    return total / n_cols * (1.0 / scale), rstd, _needs_second_sums(total, squares, n_cols)


@dsl.jit
def _row_shift(x_row, n_cols, col_stride, SUMS: dsl.constexpr):
    # The LayerNorm row sweeps' shift (n_cols >= 1): x[row, 0], or with SUMS the median of three of the
    # row's elements (the comment above forward_kernel), in x's own dtype.
    if SUMS:
        return _sampled_median(x_row, n_cols, col_stride, None)
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
        for _ in range(0, again.to(dsl.int32)):       # the sums again (from L2), about the mean (_second_scale)
            scale = _second_scale(rstd)
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
# addressed through a window (softmax.py's row sweeps, "persistent row sweeps" there): window position p
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
        for _ in range(0, again.to(dsl.int32)):       # the sums again (from L2), about the mean (_second_scale)
            scale = _second_scale(rstd)
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
    # Arguments as forward_kernel; any n_cols. Program p normalizes the rows p, p + G, ... (G =
    # num_programs) by the row sweeps (see above). THREADS, VECTOR: the chunk's load layout (THREADS
    # threads of VECTOR consecutive elements; the launcher derives them as the default blocked layout
    # lays out CHUNK elements of the narrowest dtype moved); ALIGN: a power of two dividing both row
    # strides. FIRST_EVICTION / SECOND_EVICTION: eviction_policy of x's loads in each sweep;
    # AFFINE_EVICTION: of weight's and bias's; STORE_CACHE: y's cache_modifier. MIN_BLOCKS > 0:
    # dsl.launch_bounds (registers capped for that many CTAs per SM). SHIFT > 0 (the elements of a
    # 16-byte vector of x; x_row_stride == y_row_stride, x_col_stride == 1; ALIGN unused): rows through
    # the aligned window (_normalize_row_window_sweeps); AFFINE_SHIFTED: weight_ptr and bias_ptr are then
    # the launcher's shifted copies of them (see above). SHIFTED_SUMS (LayerNorm): the statistics from the
    # shifted sums (the comment above forward_kernel; one exchange a row) instead of Welford/Chan.
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


@dsl.jit
def _load_statistics(mean_ptr, rstd_ptr, rows, row_mask, SUBTRACT_MEAN: dsl.constexpr):
    # -> (mean, rstd) of `rows` saved by the forward, 0 where row_mask is off (a masked-off row's rstd of 0
    # zeroes its xhat). For RMSNorm `mean` is rstd, unused.
    rstd = dsl.load(rstd_ptr + rows, mask=row_mask, other=0.0)
    mean = rstd
    if SUBTRACT_MEAN:
        mean = dsl.load(mean_ptr + rows, mask=row_mask, other=0.0)
    return mean, rstd


@dsl.jit
def _load_tile(x_ptr, dy_ptr, mean_ptr, rstd_ptr, rows, cols, row_mask, col_mask,
               x_row_stride, x_col_stride, dy_row_stride, dy_col_stride, SUBTRACT_MEAN: dsl.constexpr):
    # The (rows, cols) tiles of x and dy in their own dtype and the rows' mean and rstd; 0 where masked
    # off (a masked-off row's rstd of 0 zeroes its xhat). For RMSNorm `mean` is rstd, unused.
    mask = row_mask[:, None] & col_mask[None, :]
    rows64 = rows.to(dsl.int64)
    x = dsl.load(x_ptr + rows64[:, None] * x_row_stride + cols[None, :] * x_col_stride, mask=mask, other=0.0)
    dy = dsl.load(dy_ptr + rows64[:, None] * dy_row_stride + cols[None, :] * dy_col_stride, mask=mask, other=0.0)
    mean, rstd = _load_statistics(mean_ptr, rstd_ptr, rows, row_mask, SUBTRACT_MEAN)
    return x, dy, mean, rstd


@dsl.jit
def _normalize(x, dy, mean, rstd, weight, mask, SUBTRACT_MEAN: dsl.constexpr):
    # (xhat, dy, g = dy * weight) of an (R, C) tile (from _load_tile or a window), in the accumulation
    # dtype (rstd's); weight: a tile in its own dtype that broadcasts against x ((C,): one per column,
    # (1, C) or (R, C): window positions), or None. Masked-off elements of all three are 0.
    acc_dtype = rstd.dtype
    x = x.to(acc_dtype)
    if SUBTRACT_MEAN:
        x = dsl.where(mask, x - mean[:, None], 0.0)
    xhat = x * rstd[:, None]
    dy = dy.to(acc_dtype)
    g = dy
    if weight is not None:
        g = dy * weight.to(acc_dtype)
    return xhat, dy, g


@dsl.jit
def _input_gradient(xhat, dy, weight, rstd, c1, c2, SUBTRACT_MEAN: dsl.constexpr):
    # dx = rstd * (g - xhat * c1 - c2) of an (R, C) tile (xhat, dy: _normalize's) and the rows' c1, c2 ((R,),
    # RMSNorm: c2 unused), as dy * rstd * weight - xhat * (rstd c1) - rstd c2: g (dy * weight) need not stay
    # live across the row reductions (one-pass persistent tiles: LayerNorm 8192 columns 1.93x -> 2.08x
    # torch's backward on the H200, session 22, with the per-row factor -rstd^2 c1 on x - mean, which
    # overflowed float32 where rstd c1 and xhat did not; the fused kernel's row loop was slower with it and
    # keeps the xhat/g form).
    dx = dy * rstd[:, None]
    if weight is not None:
        dx = dx * weight.to(rstd.dtype)
    dx = dx - xhat * (rstd * c1)[:, None]
    if SUBTRACT_MEAN:
        dx = dx - (rstd * c2)[:, None]
    return dx


@dsl.jit
def _group_column_sums(dx_ptr, c1_partial_ptr, c2_partial_ptr, dweight_partial_ptr, dbias_partial_ptr, dy_ptr,
                       x_ptr, weight_ptr, mean_ptr, rstd_ptr, row_start, row_end, cols, n_cols, partial_row,
                       c_column, n_c_columns, x_row_stride, x_col_stride, dy_row_stride, dy_col_stride,
                       dx_row_stride, SUBTRACT_MEAN: dsl.constexpr, BLOCK_ROWS: dsl.constexpr,
                       BLOCK_N: dsl.constexpr, PREFETCH: dsl.constexpr):
    # The row loop of both backward kernels: walks rows [row_start, row_end) BLOCK_ROWS at a time over
    # the columns `cols`, adds dy * xhat and dy into column sums stored at the end to
    # d{weight,bias}_partial[partial_row, cols], and per row block either
    #   - writes dx (dx_ptr not None; `cols` must then cover the whole row), or
    #   - writes the row sums of xhat * g and g restricted to `cols` to c{1,2}_partial[row, c_column]
    #     (rows of n_c_columns; c1_partial_ptr not None).
    # PREFETCH: the next row block's loads are issued before this one is reduced (two blocks in flight).
    acc_dtype = rstd_ptr.dtype.element
    col_mask = cols < n_cols
    dweight_sum = dsl.zeros((BLOCK_ROWS, BLOCK_N), acc_dtype)
    dbias_sum = dsl.zeros((BLOCK_ROWS, BLOCK_N), acc_dtype)
    if PREFETCH:
        rows = row_start + dsl.arange(0, BLOCK_ROWS)
        x, dy, mean, rstd = _load_tile(x_ptr, dy_ptr, mean_ptr, rstd_ptr, rows, cols, rows < row_end, col_mask,
                                       x_row_stride, x_col_stride, dy_row_stride, dy_col_stride, SUBTRACT_MEAN)
    for first in range(row_start, row_end, BLOCK_ROWS):
        rows = first + dsl.arange(0, BLOCK_ROWS)
        row_mask = rows < row_end
        if PREFETCH:
            next_rows = rows + BLOCK_ROWS
            x_next, dy_next, mean_next, rstd_next = _load_tile(
                x_ptr, dy_ptr, mean_ptr, rstd_ptr, next_rows, cols, next_rows < row_end, col_mask,
                x_row_stride, x_col_stride, dy_row_stride, dy_col_stride, SUBTRACT_MEAN)
        else:
            x, dy, mean, rstd = _load_tile(x_ptr, dy_ptr, mean_ptr, rstd_ptr, rows, cols, row_mask, col_mask,
                                           x_row_stride, x_col_stride, dy_row_stride, dy_col_stride, SUBTRACT_MEAN)
        mask = row_mask[:, None] & col_mask[None, :]
        weight = None
        if weight_ptr is not None:     # reloaded per row block (L1 hits): fewer registers held across the loop
            weight = dsl.load(weight_ptr + cols, mask=col_mask, other=0.0)
        xhat, dy_acc, g = _normalize(x, dy, mean, rstd, weight, mask, SUBTRACT_MEAN)
        # Accumulated first, so that dy is dead before the row reductions (fewer live registers).
        dweight_sum += dy_acc * xhat
        dbias_sum += dy_acc
        if dx_ptr is not None:
            c1 = dsl.sum(xhat * g, axis=1) / n_cols
            dx = g - xhat * c1[:, None]
            if SUBTRACT_MEAN:
                dx = dx - (dsl.sum(g, axis=1) / n_cols)[:, None]
            dsl.store(dx_ptr + rows.to(dsl.int64)[:, None] * dx_row_stride + cols[None, :], dx * rstd[:, None],
                      mask=mask)
        if c1_partial_ptr is not None:
            c_offsets = rows.to(dsl.int64) * n_c_columns + c_column
            dsl.store(c1_partial_ptr + c_offsets, dsl.sum(xhat * g, axis=1), mask=row_mask)
            if SUBTRACT_MEAN:
                dsl.store(c2_partial_ptr + c_offsets, dsl.sum(g, axis=1), mask=row_mask)
        if PREFETCH:
            x, dy, mean, rstd = x_next, dy_next, mean_next, rstd_next
    partial = partial_row.to(dsl.int64) * n_cols + cols
    if dweight_partial_ptr is not None:
        dsl.store(dweight_partial_ptr + partial, dsl.sum(dweight_sum, axis=0), mask=col_mask)
    if dbias_partial_ptr is not None:
        dsl.store(dbias_partial_ptr + partial, dsl.sum(dbias_sum, axis=0), mask=col_mask)


@dsl.jit
def backward_fused_kernel(dx_ptr, dweight_partial_ptr, dbias_partial_ptr, dy_ptr, x_ptr, weight_ptr, mean_ptr,
                          rstd_ptr, n_rows, n_cols, rows_per_program, x_row_stride, x_col_stride, dy_row_stride,
                          dy_col_stride, dx_row_stride, SUBTRACT_MEAN: dsl.constexpr, BLOCK_ROWS: dsl.constexpr,
                          BLOCK_N: dsl.constexpr, PREFETCH: dsl.constexpr):
    # x_ptr, dy_ptr: (n_rows, n_cols) strided; dx_ptr: (n_rows, n_cols) unit column stride, or None;
    # weight_ptr: (n_cols,) or None; mean_ptr (LayerNorm, else None), rstd_ptr: (n_rows,) from the forward;
    # d{weight,bias}_partial_ptr: (num_programs, n_cols) contiguous float32/64, or None (not wanted).
    # Program p owns rows [p * rows_per_program, (p + 1) * rows_per_program); BLOCK_N >= n_cols.
    pid = dsl.program_id(0)
    row_start = pid * rows_per_program
    _group_column_sums(dx_ptr, None, None, dweight_partial_ptr, dbias_partial_ptr, dy_ptr, x_ptr, weight_ptr,
                       mean_ptr, rstd_ptr, row_start, dsl.minimum(row_start + rows_per_program, n_rows),
                       dsl.arange(0, BLOCK_N), n_cols, pid, 0, 0, x_row_stride, x_col_stride, dy_row_stride,
                       dy_col_stride, dx_row_stride, SUBTRACT_MEAN, BLOCK_ROWS, BLOCK_N, PREFETCH)


@dsl.jit
def backward_partials_kernel(c1_partial_ptr, c2_partial_ptr, dweight_partial_ptr, dbias_partial_ptr, dy_ptr, x_ptr,
                             weight_ptr, mean_ptr, rstd_ptr, n_rows, n_cols, rows_per_program, x_row_stride,
                             x_col_stride, dy_row_stride, dy_col_stride, SUBTRACT_MEAN: dsl.constexpr,
                             BLOCK_ROWS: dsl.constexpr, BLOCK_N: dsl.constexpr, PREFETCH: dsl.constexpr):
    # Split backward, first kernel. Program p = group * n_chunks + chunk (n_chunks = cdiv(n_cols, BLOCK_N))
    # owns rows [group * rows_per_program, ...) and columns [chunk * BLOCK_N, ...). Writes
    # c1_partial[row, chunk] = sum over its columns of xhat * g and c2_partial[row, chunk] = sum of g
    # ((n_rows, n_chunks) contiguous float32/64; None when dx is not wanted; c2 LayerNorm only) and the
    # group's column sums to d{weight,bias}_partial[group, cols] ((num_groups, n_cols), or None).
    pid = dsl.program_id(0)
    n_chunks = dsl.cdiv(n_cols, BLOCK_N)
    group = pid // n_chunks
    chunk = pid % n_chunks
    row_start = group * rows_per_program
    _group_column_sums(None, c1_partial_ptr, c2_partial_ptr, dweight_partial_ptr, dbias_partial_ptr, dy_ptr, x_ptr,
                       weight_ptr, mean_ptr, rstd_ptr, row_start, dsl.minimum(row_start + rows_per_program, n_rows),
                       chunk * BLOCK_N + dsl.arange(0, BLOCK_N), n_cols, group, chunk, n_chunks, x_row_stride,
                       x_col_stride, dy_row_stride, dy_col_stride, 0, SUBTRACT_MEAN, BLOCK_ROWS, BLOCK_N, PREFETCH)


@dsl.jit
def backward_input_kernel(dx_ptr, dy_ptr, x_ptr, weight_ptr, mean_ptr, rstd_ptr, c1_partial_ptr, c2_partial_ptr,
                          n_rows, n_cols, n_partial_chunks, x_row_stride, x_col_stride, dy_row_stride,
                          dy_col_stride, dx_row_stride,
                          SUBTRACT_MEAN: dsl.constexpr, BLOCK_ROWS: dsl.constexpr, BLOCK_N: dsl.constexpr,
                          BLOCK_CHUNKS: dsl.constexpr):
    # Split backward, second kernel: dx of one (BLOCK_ROWS, BLOCK_N) tile per program, program
    # p = row_tile * cdiv(n_cols, BLOCK_N) + column_tile. c{1,2}_partial_ptr: (n_rows, n_partial_chunks)
    # from backward_partials_kernel (c2 LayerNorm only); a row's c1 and c2 are the sums of its row there.
    acc_dtype = rstd_ptr.dtype.element
    pid = dsl.program_id(0)
    n_column_tiles = dsl.cdiv(n_cols, BLOCK_N)
    rows = (pid // n_column_tiles) * BLOCK_ROWS + dsl.arange(0, BLOCK_ROWS)
    cols = (pid % n_column_tiles) * BLOCK_N + dsl.arange(0, BLOCK_N)
    row_mask = rows < n_rows
    col_mask = cols < n_cols
    x, dy, mean, rstd = _load_tile(x_ptr, dy_ptr, mean_ptr, rstd_ptr, rows, cols, row_mask, col_mask,
                                   x_row_stride, x_col_stride, dy_row_stride, dy_col_stride, SUBTRACT_MEAN)
    c_rows = rows.to(dsl.int64)[:, None] * n_partial_chunks
    c1 = dsl.zeros((BLOCK_ROWS, BLOCK_CHUNKS), acc_dtype)
    c2 = dsl.zeros((BLOCK_ROWS, BLOCK_CHUNKS), acc_dtype)
    for first in range(0, n_partial_chunks, BLOCK_CHUNKS):
        chunks = first + dsl.arange(0, BLOCK_CHUNKS)
        c_mask = row_mask[:, None] & (chunks < n_partial_chunks)[None, :]
        c1 += dsl.load(c1_partial_ptr + c_rows + chunks[None, :], mask=c_mask, other=0.0)
        if SUBTRACT_MEAN:
            c2 += dsl.load(c2_partial_ptr + c_rows + chunks[None, :], mask=c_mask, other=0.0)
    weight = None
    if weight_ptr is not None:
        weight = dsl.load(weight_ptr + cols, mask=col_mask, other=0.0)
    mask = row_mask[:, None] & col_mask[None, :]
    xhat, dy, g = _normalize(x, dy, mean, rstd, weight, mask, SUBTRACT_MEAN)
    dx = g - xhat * (dsl.sum(c1, axis=1) / n_cols)[:, None]
    if SUBTRACT_MEAN:
        dx = dx - (dsl.sum(c2, axis=1) / n_cols)[:, None]
    dsl.store(dx_ptr + rows.to(dsl.int64)[:, None] * dx_row_stride + cols[None, :], dx * rstd[:, None], mask=mask)


@dsl.jit
def _window_loads(x_ptr, dy_ptr, mean_ptr, rstd_ptr, rows, cols, n_rows, n_cols, x_row_stride, x_col_stride,
                  dy_row_stride, dy_col_stride, ALIGN: dsl.constexpr, SHIFT: dsl.constexpr,
                  SUBTRACT_MEAN: dsl.constexpr):
    # -> (x, dy, mean, rstd, mask) of the (rows, cols) tile addressed through _row_window: x and dy in
    # their own dtype (0 where masked off), the rows' statistics (rstd 0 for rows past the end; for
    # RMSNorm `mean` is rstd, unused). With SHIFT, x and dy share one row stride.
    _, _, in_row = _row_window(rows, cols, n_cols, x_row_stride, x_col_stride, ALIGN, SHIFT)
    return _placed_window_loads(x_ptr, dy_ptr, mean_ptr, rstd_ptr, rows, cols, in_row, n_rows, n_cols, x_row_stride,
                                x_col_stride, dy_row_stride, dy_col_stride, ALIGN, SHIFT, SUBTRACT_MEAN)


@dsl.jit
def _placed_window_loads(x_ptr, dy_ptr, mean_ptr, rstd_ptr, rows, cols, in_row, n_rows, n_cols, x_row_stride,
                         x_col_stride, dy_row_stride, dy_col_stride, ALIGN: dsl.constexpr, SHIFT: dsl.constexpr,
                         SUBTRACT_MEAN: dsl.constexpr):
    # _window_loads for rows whose columns sit where `in_row` ((R, C) or (1, C)) says in their windows: a
    # persistent program's rows all start at the same place in their windows, so their mask is computed
    # once, not per tile (the aligned window's per-element masks cost registers).
    row_mask = rows < n_rows
    x_offsets, _, _ = _row_window(rows, cols, n_cols, x_row_stride, x_col_stride, ALIGN, SHIFT)
    dy_offsets, _, _ = _row_window(rows, cols, n_cols, dy_row_stride, dy_col_stride, ALIGN, SHIFT)
    mask = row_mask[:, None] & in_row
    x = dsl.load(x_ptr + x_offsets, mask=mask, other=0.0)
    dy = dsl.load(dy_ptr + dy_offsets, mask=mask, other=0.0)
    mean, rstd = _load_statistics(mean_ptr, rstd_ptr, rows, row_mask, SUBTRACT_MEAN)
    return x, dy, mean, rstd, mask


@dsl.jit
def backward_persistent_kernel(dx_ptr, dweight_partial_ptr, dbias_partial_ptr, dy_ptr, x_ptr, weight_ptr, mean_ptr,
                               rstd_ptr, n_rows, n_cols, n_groups, n_parts, x_row_stride, x_col_stride, dy_row_stride,
                               dy_col_stride, dx_row_stride, SUBTRACT_MEAN: dsl.constexpr, BLOCK_ROWS: dsl.constexpr,
                               BLOCK_N: dsl.constexpr, TWO_PASS: dsl.constexpr, CHUNK: dsl.constexpr,
                               PREFETCH: dsl.constexpr, ALIGN: dsl.constexpr = 1, SHIFT: dsl.constexpr = 0,
                               CLUSTER: dsl.constexpr = 1, MIN_BLOCKS_PER_SM: dsl.constexpr = 0):
    # A fixed grid of n_groups * n_parts programs (n_parts = cdiv(n_cols + max(SHIFT - 1, 0), BLOCK_N):
    # the window's columns); program p = group * n_parts + part handles the row tiles group, group + n_groups, ... and
    # the columns (window positions) [part * BLOCK_N, (part + 1) * BLOCK_N) of them: it writes their dx
    # and keeps their dweight/dbias column sums in registers across its tiles.
    # TWO_PASS=False (needs n_parts = 1): the tile holds whole rows; c1 = sum(xhat * g) / N and c2 = sum(g) / N
    # come from it (x and dy read once). PREFETCH: the next tile's x and dy are loaded first.
    # TWO_PASS=True: rows longer than a tile (or whole rows whose registers would not hold x and dy next
    # to the column sums). A first pass walks the whole row (window) in CHUNK-column
    # pieces for c1 and c2 (lane-wise sums, one cross-thread reduction per tile); the second pass reads
    # the part's tile again: this program read it a moment ago, so from L1/L2 as long as the live rows
    # (n_groups * BLOCK_ROWS rows) fit in L2, and DRAM sees x and dy once.
    # Partial sums: lane i of the tiles keeps its own column sums, written to row
    # group * BLOCK_ROWS + i of d{weight,bias}_partial ((n_groups * BLOCK_ROWS, n_cols) float32/64, or
    # None) at the row's own columns. With SHIFT the launcher makes n_groups * BLOCK_ROWS a multiple of
    # SHIFT, so lane i of every tile of a program sits at the same place in its window.
    # CLUSTER > 1 (= n_parts, TWO_PASS=False): the parts of a row tile go to the programs of one cluster
    # (sm_90), which add their parts' row sums with dsl.cluster_sum: x and dy read once, in one pass.
    # Arguments otherwise as backward_fused_kernel; with SHIFT, x, dy and dx share one row stride.
    # MIN_BLOCKS_PER_SM > 0: dsl.launch_bounds(MIN_BLOCKS_PER_SM).
    if CLUSTER > 1:
        dsl.cluster_dims(CLUSTER)
    if MIN_BLOCKS_PER_SM > 0:
        dsl.launch_bounds(MIN_BLOCKS_PER_SM)
    acc_dtype = rstd_ptr.dtype.element
    pid = dsl.program_id(0)
    group = pid // n_parts
    part = pid % n_parts
    n_tiles = dsl.cdiv(n_rows, BLOCK_ROWS)
    lanes = dsl.arange(0, BLOCK_ROWS)
    cols = part * BLOCK_N + dsl.arange(0, BLOCK_N)
    _, logical, in_row = _row_window(group * BLOCK_ROWS + lanes, cols, n_cols, x_row_stride, x_col_stride, ALIGN,
                                     SHIFT)
    hoisted_weight = None
    if weight_ptr is not None and not TWO_PASS:     # kept in registers (two-pass tiles reload it: L1 hits)
        hoisted_weight = dsl.load(weight_ptr + logical, mask=in_row, other=0.0)
    dweight_sum = dsl.zeros((BLOCK_ROWS, BLOCK_N), acc_dtype)
    dbias_sum = dsl.zeros((BLOCK_ROWS, BLOCK_N), acc_dtype)
    if PREFETCH:
        x, dy, mean, rstd, mask = _placed_window_loads(x_ptr, dy_ptr, mean_ptr, rstd_ptr, group * BLOCK_ROWS + lanes,
                                                       cols, in_row, n_rows, n_cols, x_row_stride, x_col_stride,
                                                       dy_row_stride, dy_col_stride, ALIGN, SHIFT, SUBTRACT_MEAN)
    for tile in range(group, n_tiles, n_groups):
        rows = tile * BLOCK_ROWS + lanes
        if TWO_PASS and dx_ptr is not None:
            chunk_cols = dsl.arange(0, CHUNK)
            lane_c1 = dsl.zeros((BLOCK_ROWS, CHUNK), acc_dtype)
            lane_c2 = dsl.zeros((BLOCK_ROWS, CHUNK), acc_dtype)
            for start in range(0, n_cols + SHIFT, CHUNK):
                _, chunk_logical, chunk_in_row = _row_window(rows, start + chunk_cols, n_cols, x_row_stride,
                                                             x_col_stride, ALIGN, SHIFT)
                chunk_weight = None
                if weight_ptr is not None:
                    chunk_weight = dsl.load(weight_ptr + chunk_logical, mask=chunk_in_row, other=0.0)
                chunk_x, chunk_dy, chunk_mean, chunk_rstd, chunk_mask = _window_loads(
                    x_ptr, dy_ptr, mean_ptr, rstd_ptr, rows, start + chunk_cols, n_rows, n_cols, x_row_stride,
                    x_col_stride, dy_row_stride, dy_col_stride, ALIGN, SHIFT, SUBTRACT_MEAN)
                chunk_xhat, _, chunk_g = _normalize(chunk_x, chunk_dy, chunk_mean, chunk_rstd, chunk_weight,
                                                    chunk_mask, SUBTRACT_MEAN)
                lane_c1 += chunk_xhat * chunk_g
                if SUBTRACT_MEAN:
                    lane_c2 += chunk_g
            c1 = dsl.sum(lane_c1, axis=1) / n_cols
            c2 = dsl.sum(lane_c2, axis=1) / n_cols
        weight = hoisted_weight
        if TWO_PASS and weight_ptr is not None:
            weight = dsl.load(weight_ptr + logical, mask=in_row, other=0.0)
        if PREFETCH:
            next_rows = rows + n_groups * BLOCK_ROWS
            x_next, dy_next, mean_next, rstd_next, mask_next = _placed_window_loads(
                x_ptr, dy_ptr, mean_ptr, rstd_ptr, next_rows, cols, in_row, n_rows, n_cols, x_row_stride,
                x_col_stride, dy_row_stride, dy_col_stride, ALIGN, SHIFT, SUBTRACT_MEAN)
        else:
            x, dy, mean, rstd, mask = _placed_window_loads(x_ptr, dy_ptr, mean_ptr, rstd_ptr, rows, cols, in_row,
                                                           n_rows, n_cols, x_row_stride, x_col_stride, dy_row_stride,
                                                           dy_col_stride, ALIGN, SHIFT, SUBTRACT_MEAN)
        xhat, dy_acc, g = _normalize(x, dy, mean, rstd, weight, mask, SUBTRACT_MEAN)
        dweight_sum += dy_acc * xhat
        dbias_sum += dy_acc
        if dx_ptr is not None:
            if TWO_PASS:
                dx = g - xhat * c1[:, None]
                if SUBTRACT_MEAN:
                    dx = dx - c2[:, None]
                dx = dx * rstd[:, None]
            else:
                c1 = dsl.sum(xhat * g, axis=1)
                c2 = dsl.sum(g, axis=1)
                if CLUSTER > 1 and SUBTRACT_MEAN:
                    c1, c2 = dsl.cluster_sum(c1, c2)
                elif CLUSTER > 1:
                    c1 = dsl.cluster_sum(c1)
                dx = _input_gradient(xhat, dy_acc, weight, rstd, c1 / n_cols, c2 / n_cols, SUBTRACT_MEAN)
            dx_offsets, _, _ = _row_window(rows, cols, n_cols, dx_row_stride, 1, ALIGN, SHIFT)
            dsl.store(dx_ptr + dx_offsets, dx, mask=mask)
        if PREFETCH:
            x, dy, mean, rstd, mask = x_next, dy_next, mean_next, rstd_next, mask_next
    partial = (group * BLOCK_ROWS + lanes).to(dsl.int64)[:, None] * n_cols + logical
    if dweight_partial_ptr is not None:
        dsl.store(dweight_partial_ptr + partial, dweight_sum, mask=in_row)
    if dbias_partial_ptr is not None:
        dsl.store(dbias_partial_ptr + partial, dbias_sum, mask=in_row)


@dsl.jit
def column_sum_kernel(out_ptr, partial_ptr, out2_ptr, partial2_ptr, n_partials, n_cols,
                      BLOCK_P: dsl.constexpr, BLOCK_N: dsl.constexpr):
    # out[c] = sum over p of partial[p, c], adding BLOCK_P rows at a time in a fixed order (deterministic);
    # the same for (out2, partial2) when they are not None. partial: (n_partials, n_cols) contiguous
    # float32/64; out: (n_cols,) contiguous, any float dtype. One program per BLOCK_N columns.
    cols = dsl.program_id(0) * BLOCK_N + dsl.arange(0, BLOCK_N)
    col_mask = cols < n_cols
    total = dsl.zeros((BLOCK_P, BLOCK_N), partial_ptr.dtype.element)
    total2 = dsl.zeros((BLOCK_P, BLOCK_N), partial_ptr.dtype.element)
    for first in range(0, n_partials, BLOCK_P):
        parts = first + dsl.arange(0, BLOCK_P)
        offsets = parts.to(dsl.int64)[:, None] * n_cols + cols[None, :]
        mask = (parts < n_partials)[:, None] & col_mask[None, :]
        total += dsl.load(partial_ptr + offsets, mask=mask, other=0.0)
        if partial2_ptr is not None:
            total2 += dsl.load(partial2_ptr + offsets, mask=mask, other=0.0)
    dsl.store(out_ptr + cols, dsl.sum(total, axis=0), mask=col_mask)
    if out2_ptr is not None:
        dsl.store(out2_ptr + cols, dsl.sum(total2, axis=0), mask=col_mask)
