"""The LayerNorm / RMSNorm forward of whole 16-bit rows of 4098 to 12289 columns that start off 16-byte
boundaries (N % 8 != 0), in registers, with weight and bias staged by the kernel into shifted copies.

Rows are read through norm_split_window's split window (window position p holds column p - first, first =
r * N mod SHIFT; edges [0, SHIFT) and [middle, middle + SHIFT) masked per element), but the main part of the
window is TILES equal power-of-two tiles of BLOCK_N positions (TILES * BLOCK_N >= N - 1; 12289 columns take
3 x 4096 where one 16384-position tile would leave a quarter of its lanes padding). The tiles share one
layout, so the row sums add them lane by lane before one exchange (LayerNorm's shifted sums: both sums in
one exchange, norm_statistics).

weight and bias: the grid is persistent and a multiple of SHIFT, so a program's rows all start at the same
`first` and read weight at the same window positions. Gathered element by element and kept, they would take
a register per element (twice what a 16-bit pair packed in one register takes) and leave no room for a
whole row; read per row at p - first, they would be one load per element. Instead each program first
copies them into the shifted copy `first` of a scratch buffer (copy f holds column c at f * copy_stride +
c + f: norm_forward_launcher.shifted_affine_copies' layout), and every row then reads that copy in 16-byte
vectors at the window's own positions (L1 hits). Programs with the same `first` write the same bytes to
the same copy (a race of identical values); a program reads back only positions it staged itself, after a
CTA barrier, so it never reads a position no one has written yet. This costs no copy kernel: a launch of
its own took ~10 us of GPU time at 12289 columns (H100, session 42: with the copies made by two torch copy
kernels beforehand, LayerNorm 0.83 of a copy; staged here, 0.86).

H100, fp16, M = 8192, fraction of an interleaved copy of the same bytes (.scratch/s42/probe_fwd.py), the
shipped path (the aligned-window row sweeps) -> this: LayerNorm 5001 0.73 -> 0.81 (3 x 2048, 8 warps, next row
prefetched), 6151 0.73 -> 0.84 (2 x 4096, prefetched), 8191 0.71 -> 0.88, 9001 0.83 -> 0.80 (3 x 4096: not
taken), 10241 0.81 -> 0.82, 12289 0.79 -> 0.86 (3 x 4096, no prefetch); RMSNorm 5001 0.91 -> 0.92-0.94, 6151
0.92 -> 0.95, 8191 0.87 -> 0.93, 9001 0.90 -> 0.91, 10241 0.88 -> 0.92, 12289 0.83 -> 0.89
(norm_forward_config._HALF_STAGED_WINDOW).

Arguments as norm_split_window.forward_split_persistent_kernel, plus weight_copies_ptr / bias_copies_ptr (the
scratch, SHIFT * copy_stride elements of weight's / bias's dtype, or None with weight / bias None) and
copy_stride (norm_row_sweeps.affine_copy_stride).
"""

from __future__ import annotations

import fusedops.dsl as dsl
from fusedops.kernels.norm_statistics import needs_second_sums, row_shifts, scaled_difference, second_scale, \
    shifted_mean_rstd, shifted_moments
from fusedops.kernels.row_windows import split_window

# (the shifted sums' scale: 2^-16, norm_statistics)
_SCALE: dsl.constexpr = 1.52587890625e-05


@dsl.jit
def _tile_positions(tile, BLOCK_N: dsl.constexpr, SHIFT: dsl.constexpr):
    # -> the window positions (1, BLOCK_N) of main tile `tile` (0, 1, 2).
    return SHIFT + tile * BLOCK_N + dsl.arange(0, BLOCK_N)[None, :]


@dsl.jit
def _stage(source_ptr, copies_ptr, copy_base, positions, in_tile, first):
    # Copies source (weight or bias; None: nothing) at the columns of `positions` into the shifted copy at
    # copy_base ((R,)): element copy_base + p holds column p - first.
    if source_ptr is not None:
        values = dsl.load(source_ptr + (positions - first[:, None]), mask=in_tile, other=0.0)
        dsl.store(copies_ptr + copy_base[:, None] + positions, values, mask=in_tile)


@dsl.jit
def _staged(copies_ptr, copy_base, positions, in_tile):
    # -> the staged tile at `positions` (own dtype), or None without copies.
    if copies_ptr is None:
        return None
    return dsl.load(copies_ptr + copy_base[:, None] + positions, mask=in_tile, other=0.0)


@dsl.jit
def _load_row(x_ptr, rows, n_rows, n_cols, row_stride, TILES: dsl.constexpr, BLOCK_N: dsl.constexpr,
              SHIFT: dsl.constexpr):
    # -> (tile 0, tile 1 or None, tile 2 or None, edges) of x at `rows`, own dtype, 0 where masked off.
    start, _, middle, edges, _, edge_in_row = split_window(rows, n_cols, row_stride, SHIFT)
    row_mask = (rows < n_rows)[:, None]
    offsets = x_ptr + start[:, None]
    positions = _tile_positions(0, BLOCK_N, SHIFT)
    x0 = dsl.load(offsets + positions, mask=row_mask & (positions < middle[:, None]), other=0.0)
    x1 = None
    x2 = None
    if TILES >= 2:
        positions = _tile_positions(1, BLOCK_N, SHIFT)
        x1 = dsl.load(offsets + positions, mask=row_mask & (positions < middle[:, None]), other=0.0)
    if TILES >= 3:
        positions = _tile_positions(2, BLOCK_N, SHIFT)
        x2 = dsl.load(offsets + positions, mask=row_mask & (positions < middle[:, None]), other=0.0)
    return x0, x1, x2, dsl.load(offsets + edges, mask=row_mask & edge_in_row, other=0.0)


@dsl.jit
def _add_lanes(a, b):
    # a + b, where b may be None
    if b is None:
        return a
    return a + b


@dsl.jit
def _differences(x, shift, mask, scale):
    # -> (d, d * d), d = (x - shift) * scale where mask is on, else 0 (norm_statistics.shifted_moments' terms)
    if x is None:
        return None, None
    d = dsl.where(mask, scaled_difference(x, shift[:, None], scale), 0.0)
    return d, d * d


@dsl.jit
def _row_moments(x0, x1, x2, masks, x_edge, edge_mask, shift, scale):
    # -> the shifted sums (of d and d^2) of rows held in up to three main tiles and the edges; the tiles'
    # terms are added lane by lane first (one layout), so both sums cross the warps in one exchange.
    # masks: the tiles' masks (three, the unused ones ignored).
    d, squares = _differences(x0, shift, masks[0], scale)
    d1, squares1 = _differences(x1, shift, masks[1], scale)
    d2, squares2 = _differences(x2, shift, masks[2], scale)
    d = _add_lanes(_add_lanes(d, d1), d2)
    squares = _add_lanes(_add_lanes(squares, squares1), squares2)
    edge_total, edge_squares = shifted_moments(x_edge, shift, edge_mask, scale)
    return dsl.sum(d, axis=1) + edge_total, dsl.sum(squares, axis=1) + edge_squares


@dsl.jit
def _row_squares(x0, x1, x2, x_edge):
    # -> sum(x^2) of rows held in up to three main tiles and the edges (0 where masked off)
    squares = x0 * x0
    if x1 is not None:
        squares += x1 * x1
    if x2 is not None:
        squares += x2 * x2
    return dsl.sum(squares, axis=1) + dsl.sum(x_edge * x_edge, axis=1)


@dsl.jit
def _statistics(x_ptr, x0, x1, x2, masks, x_edge, edge_mask, rows, row_mask, n_cols, row_stride, eps,
                SUBTRACT_MEAN: dsl.constexpr):
    # -> (mean (0.0 for RMSNorm), rstd) of the rows (accumulation dtype tiles, 0 where masked off).
    # LayerNorm: the shifted sums about a median of three of the row's elements, taken again about the mean
    # where norm_statistics.needs_second_sums says so (a loop of 0 or 1 trips).
    if SUBTRACT_MEAN:
        shift = row_shifts(x_ptr, rows, row_mask, n_cols, row_stride, 1).to(x0.dtype)
        total, squares = _row_moments(x0, x1, x2, masks, x_edge, edge_mask, shift, _SCALE)
        mean, rstd = shifted_mean_rstd(total, squares, shift, n_cols, eps, _SCALE)
        needs = needs_second_sums(total, squares, n_cols) & row_mask
        for _ in range(0, dsl.max(needs.to(dsl.int32), axis=0)):
            scale = second_scale(rstd)
            total, squares = _row_moments(x0, x1, x2, masks, x_edge, edge_mask, mean, scale[:, None])
            second_mean, second_rstd = shifted_mean_rstd(total, squares, mean, n_cols, eps, scale)
            mean = dsl.where(needs, second_mean, mean)
            rstd = dsl.where(needs, second_rstd, rstd)
        return mean, rstd
    return 0.0, 1.0 / dsl.sqrt(_row_squares(x0, x1, x2, x_edge) / n_cols + eps)


@dsl.jit
def _store_tile(y_ptr, start, positions, x, mean, rstd, weight, bias, mask):
    # y = (x - mean) * rstd * weight + bias at `positions` of the rows' windows (weight, bias own dtype or None).
    if x is not None:
        y = (x - mean) * rstd[:, None]
        if weight is not None:
            y = y * weight.to(y.dtype)
        if bias is not None:
            y = y + bias.to(y.dtype)
        dsl.store(y_ptr + start[:, None] + positions, y, mask=mask)


@dsl.jit
def _store_staged_tile(y_ptr, weight_copies_ptr, bias_copies_ptr, copy_base, start, tile, x, mean, rstd,
                       in_tile, row_mask, BLOCK_N: dsl.constexpr, SHIFT: dsl.constexpr):
    # _store_tile of main tile `tile` (x None: no such tile), its weight and bias read from the staged copies.
    if x is not None:
        positions = _tile_positions(tile, BLOCK_N, SHIFT)
        weight = _staged(weight_copies_ptr, copy_base, positions, in_tile)
        bias = _staged(bias_copies_ptr, copy_base, positions, in_tile)
        _store_tile(y_ptr, start, positions, x, mean, rstd, weight, bias, row_mask[:, None] & in_tile)


@dsl.jit
def forward_split_staged_kernel(y_ptr, mean_ptr, rstd_ptr, x_ptr, weight_ptr, bias_ptr, weight_copies_ptr,
                                bias_copies_ptr, n_rows, n_cols, row_stride, copy_stride, eps,
                                SUBTRACT_MEAN: dsl.constexpr, BLOCK_N: dsl.constexpr, TILES: dsl.constexpr,
                                SHIFT: dsl.constexpr, PREFETCH: dsl.constexpr = False):
    # A fixed grid of G programs (G a multiple of SHIFT): program p normalizes rows p, p + G, ... (one row a
    # step), all `first` positions into their windows; TILES (1 to 3) main tiles of BLOCK_N positions,
    # TILES * BLOCK_N >= n_cols - 1. PREFETCH: the next row's x is loaded before this one is reduced.
    acc_dtype = rstd_ptr.dtype.element
    pid = dsl.program_id(0)
    n_programs = dsl.num_programs(0)
    lanes = dsl.arange(0, 1)
    _, first, middle, edges, edge_columns, edge_in_row = split_window(pid + lanes, n_cols, row_stride, SHIFT)
    copy_base = dsl.multiple_of(first * copy_stride, SHIFT)
    in_tile0 = _tile_positions(0, BLOCK_N, SHIFT) < middle[:, None]
    in_tile1 = _tile_positions(1, BLOCK_N, SHIFT) < middle[:, None]
    in_tile2 = _tile_positions(2, BLOCK_N, SHIFT) < middle[:, None]
    for tile in dsl.static_range(TILES):
        in_tile = (in_tile0, in_tile1, in_tile2)[tile]
        _stage(weight_ptr, weight_copies_ptr, copy_base, _tile_positions(tile, BLOCK_N, SHIFT), in_tile, first)
        _stage(bias_ptr, bias_copies_ptr, copy_base, _tile_positions(tile, BLOCK_N, SHIFT), in_tile, first)
    dsl.debug_barrier()     # the staged copies visible to every thread of the program
    edge_weight = None
    edge_bias = None
    if weight_ptr is not None:
        edge_weight = dsl.load(weight_ptr + edge_columns, mask=edge_in_row, other=0.0)
    if bias_ptr is not None:
        edge_bias = dsl.load(bias_ptr + edge_columns, mask=edge_in_row, other=0.0)
    if PREFETCH:
        x0, x1, x2, x_edge = _load_row(x_ptr, pid + lanes, n_rows, n_cols, row_stride, TILES, BLOCK_N, SHIFT)
    for row in range(pid, n_rows, n_programs):
        rows = row + lanes
        row_mask = rows < n_rows
        if PREFETCH:
            next0, next1, next2, next_edge = _load_row(x_ptr, rows + n_programs, n_rows, n_cols, row_stride, TILES,
                                                       BLOCK_N, SHIFT)
        else:
            x0, x1, x2, x_edge = _load_row(x_ptr, rows, n_rows, n_cols, row_stride, TILES, BLOCK_N, SHIFT)
        f0 = x0.to(acc_dtype)
        f1 = None
        f2 = None
        if TILES >= 2:
            f1 = x1.to(acc_dtype)
        if TILES >= 3:
            f2 = x2.to(acc_dtype)
        f_edge = x_edge.to(acc_dtype)
        masks = (row_mask[:, None] & in_tile0, row_mask[:, None] & in_tile1, row_mask[:, None] & in_tile2)
        edge_mask = row_mask[:, None] & edge_in_row
        mean, rstd = _statistics(x_ptr, f0, f1, f2, masks, f_edge, edge_mask, rows, row_mask, n_cols, row_stride,
                                 eps, SUBTRACT_MEAN)
        if SUBTRACT_MEAN:
            dsl.store(mean_ptr + rows, mean, mask=row_mask)
            mean = mean[:, None]
        dsl.store(rstd_ptr + rows, rstd, mask=row_mask)
        start, _, _, _, _, _ = split_window(rows, n_cols, row_stride, SHIFT)
        _store_staged_tile(y_ptr, weight_copies_ptr, bias_copies_ptr, copy_base, start, 0, f0, mean, rstd, in_tile0,
                           row_mask, BLOCK_N, SHIFT)
        _store_staged_tile(y_ptr, weight_copies_ptr, bias_copies_ptr, copy_base, start, 1, f1, mean, rstd, in_tile1,
                           row_mask, BLOCK_N, SHIFT)
        _store_staged_tile(y_ptr, weight_copies_ptr, bias_copies_ptr, copy_base, start, 2, f2, mean, rstd, in_tile2,
                           row_mask, BLOCK_N, SHIFT)
        _store_tile(y_ptr, start, edges, f_edge, mean, rstd, edge_weight, edge_bias, edge_mask)
        if PREFETCH:
            x0, x1, x2, x_edge = next0, next1, next2, next_edge
