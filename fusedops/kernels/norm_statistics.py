"""Row statistics of the norm kernels: the shifted sums (a row's mean and variance in one cross-warp exchange),
their second sums about the mean, and the corrected two-pass mean.

Used by the whole-row forward (norm_forward_kernels.py), the row sweeps (norm_row_sweeps.py) and the split
window (norm_split_window.py). All arithmetic is in the accumulation dtype (rstd's).
"""

from __future__ import annotations

import fusedops.dsl as dsl


@dsl.jit
def corrected_mean(mean, centered, mask, n_cols):
    # (mean, centered) with the rounding of sum(x) / N taken out: the mean of the centered rows, added to the
    # mean and taken from them (the corrected two-pass algorithm: T. Chan, G. Golub, R. LeVeque, "Algorithms
    # for computing the sample variance", The American Statistician 37(3), 1983). Without it a row of one
    # repeated float32 value (10000.3) kept x - mean = 1 ulp, which rstd ~ 1/sqrt(eps) turned into +-0.3.
    # Float32 / float64 rows only: for 16-bit rows the float32 mean's rounding is far below their own ulp.
    correction = dsl.sum(centered, axis=1) / n_cols
    return mean + correction, dsl.where(mask, centered - correction[:, None], 0.0)


# Shifted sums (norm_forward_kernels.forward_kernel's SHIFTED_SUMS, LayerNorm): with a shift K near the row and
# d = x - K, the mean is K + sum(d) / N and the variance sum(d^2) / N - (sum(d) / N)^2. The two sums do not depend
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
# 8192, the row sweeps otherwise (norm_forward_config.forward_config), and the split window's
# (norm_split_window.py, up to 4097 columns).
@dsl.jit
def _median_of_three(a, b, c):
    return dsl.maximum(dsl.minimum(a, b), dsl.minimum(dsl.maximum(a, b), c))


@dsl.jit
def sampled_median(row_start, n_cols, col_stride, mask):
    # -> K of the row(s) starting at `row_start` (a pointer, or a block of them), in x's dtype: the median of
    # columns 0, (N - 1) // 2, N - 1; 0 where `mask` is off (None: every row is read).
    return _median_of_three(dsl.load(row_start, mask=mask, other=0.0),
                            dsl.load(row_start + (n_cols - 1) // 2 * col_stride, mask=mask, other=0.0),
                            dsl.load(row_start + (n_cols - 1) * col_stride, mask=mask, other=0.0))


@dsl.jit
def row_shifts(x_ptr, rows, row_mask, n_cols, row_stride, col_stride):
    # -> K of `rows` ((R,), x's dtype; 0 for rows masked off): sampled_median of each row.
    return sampled_median(x_ptr + rows.to(dsl.int64) * row_stride, n_cols, col_stride, row_mask)


@dsl.jit
def scaled_difference(x, shift, scale):
    # -> (x - shift) * scale (scale a power of two) formed as x * scale - shift * scale: the same single
    # rounding, but finite where x - shift itself overflows float32 (bfloat16 rows of +-2e38).
    return x * scale - shift * scale


@dsl.jit
def shifted_moments(x, shift, mask, scale=1.52587890625e-05):
    # -> (sum of d, sum of d^2) per row, d = (x - K) * scale over the lanes of the tile x (R, C) where
    # `mask` is on (accumulation dtype); shift: K (R,) (see the comment above); scale: 2^-16, or (R, 1) for
    # the second sums (second_sums).
    d = dsl.where(mask, scaled_difference(x, shift[:, None], scale), 0.0)
    return dsl.sum(d, axis=1), dsl.sum(d * d, axis=1)


@dsl.jit
def shifted_mean_rstd(total, squares, shift, n_cols, eps, scale):
    # -> (mean, rstd) of rows from their shifted_moments sums over all n_cols columns, sums of (x - K) *
    # scale (a power of two: 2^-16, or the second sums' second_scale).
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
def needs_second_sums(total, squares, n_cols):
    # -> whether rows whose shifted sums (of (x - K) * scale over all n_cols columns, after the exchange) are
    # `total` and `squares` must take them again, about their mean (second_scale): the shift lies far from the
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
def second_scale(rstd):
    # -> the scale of the second sums of rows whose first gave `rstd`: 1.0 (unscaled: tiny spreads keep their
    # squares), but 2^-16 where rstd is 0 (a variance past float32's range: the unscaled sums about the mean
    # could overflow too, and the mean is what they are taken again for).
    return dsl.where(rstd == 0.0, 1.52587890625e-05, 1.0)


@dsl.jit
def second_sums(x, mask, x_edge, edge_mask, row_mask, total, squares, mean, rstd, n_cols, eps):
    # -> (mean, rstd) of the rows of the tiles x (R, C) and, unless None, x_edge (R, E) (accumulation dtype,
    # 0 where their masks are off), whose first shifted sums `total` and `squares` gave `mean` and `rstd`:
    # the rows on row_mask ((R,)) that needs_second_sums take the sums again about `mean` (second_scale; a
    # loop of 0 or 1 trips: the common tile pays one test, no exchange). The other rows keep their first
    # statistics (a fine row beside one that needs them is not summed again: unscaled, its squares could
    # overflow), and rows off row_mask (padding rows, all 0) do not start the loop.
    needs = needs_second_sums(total, squares, n_cols) & row_mask
    again = dsl.max(needs.to(dsl.int32), axis=0)
    for _ in range(0, again):
        scale = second_scale(rstd)
        total, squares = shifted_moments(x, mean, mask, scale[:, None])
        if x_edge is not None:
            edge_total, edge_squares = shifted_moments(x_edge, mean, edge_mask, scale[:, None])
            total, squares = total + edge_total, squares + edge_squares
        second_mean, second_rstd = shifted_mean_rstd(total, squares, mean, n_cols, eps, scale)
        mean = dsl.where(needs, second_mean, mean)
        rstd = dsl.where(needs, second_rstd, rstd)
    return mean, rstd


@dsl.jit
def shifted_statistics(x, shift, mask, row_mask, n_cols, eps):
    # -> (x - mean (lanes where `mask` is off: anything), mean, rstd) of the rows of the tile x (R, C) in
    # the accumulation dtype (float32), 0 where masked off; shift: K (R,) (see the comment above); row_mask:
    # (R,) the rows in the tensor.
    total, squares = shifted_moments(x, shift, mask)
    mean, rstd = shifted_mean_rstd(total, squares, shift, n_cols, eps, 1.52587890625e-05)
    mean, rstd = second_sums(x, mask, None, None, row_mask, total, squares, mean, rstd, n_cols, eps)
    return x - mean[:, None], mean, rstd
