"""LayerNorm and RMSNorm of whole 16-bit rows that start off 16-byte boundaries (N % 8 != 0), read
through a split window: a power-of-two main tile of whole 16-byte vectors plus a small edge tile.

A contiguous (M, N) tensor's row r starts at element r * N; unless N is a multiple of the SHIFT elements
of a 16-byte vector, most rows start inside a vector, and a tile laid over the row's columns can only be
read and written element by element (2-byte accesses: a quarter of a copy's bandwidth, or less). Here a
row is addressed from the vector boundary at or before its start (window position p holds column
p - first, first = r * N mod SHIFT) and its window is cut in two:

    main   positions [SHIFT, SHIFT + BLOCK_N), masked by p < middle: whole vectors only;
    edges  positions [0, SHIFT) and [middle, middle + SHIFT) (2 * SHIFT lanes), masked per element
           by first <= p < first + N;

with middle = max(SHIFT, (first + N) rounded down to SHIFT). The edges hold what the main tile leaves
of the row, so BLOCK_N >= N - 1 is enough (N = 4097 takes a 4096-column main tile, not 8192 columns of
which half are padding). The main tile's mask is constant over each vector (middle is a multiple of
SHIFT), so its loads and stores stay 16-byte vectors (8-byte ones where output chunks leave a thread
fewer than 8 elements of a chunk); the edges are one element per lane, inside one warp (their
reductions need no cross-warp exchange). Every statistic and sum adds the two tiles; padded lanes are
masked out of all of them.

weight and bias are read at the row's columns (p - first: not vector aligned, element loads from L1).
The backward walks the rows g, g + G, ... of a persistent grid whose size G * BLOCK_ROWS the launcher
makes a multiple of SHIFT: every row a lane sees starts at the same place in its window, so the lane
gathers weight once and keeps its dweight/dbias column sums at fixed window positions.

Arguments as norm_forward_kernels.forward_kernel / norm_backward_kernels.backward_persistent_kernel, except:
x, y, dy and dx share one row stride (`row_stride`: N, contiguous rows) and have unit column strides.
"""

from __future__ import annotations

import fusedops.dsl as dsl
from fusedops.kernels.norm_backward_kernels import load_statistics, normalize
from fusedops.kernels.norm_forward_kernels import affine_tiles
from fusedops.kernels.norm_statistics import row_shifts, second_sums, shifted_mean_rstd, shifted_moments


@dsl.jit
def _split_window(rows, n_cols, row_stride, BLOCK_N: dsl.constexpr, SHIFT: dsl.constexpr, FROM: dsl.constexpr = 0):
    # -> (main offsets, main columns, main in_row, edge offsets, edge columns, edge in_row), all (R, C),
    # of the rows `rows` ((R,) int32) through the split window (see the module docstring); the main
    # tile's positions [SHIFT + FROM, SHIFT + FROM + BLOCK_N) (FROM > 0: a later chunk of it). Row
    # offsets are int64 (tensors may hold more than 2**31 elements).
    base = rows.to(dsl.int64) * row_stride
    first = (base % SHIFT).to(dsl.int32)
    start = dsl.multiple_of(base - first, SHIFT)[:, None]
    middle = dsl.maximum((first + n_cols) // SHIFT * SHIFT, SHIFT)[:, None]
    main = SHIFT + FROM + dsl.arange(0, BLOCK_N)[None, :]
    lanes = dsl.arange(0, 2 * SHIFT)[None, :]
    edges = dsl.where(lanes < SHIFT, lanes, middle - SHIFT + lanes)
    edge_columns = edges - first[:, None]
    return (start + main, main - first[:, None], main < middle, start + edges, edge_columns,
            (edge_columns >= 0) & (edge_columns < n_cols))


@dsl.jit
def _affine(y, weight, bias):
    # y * weight + bias in y's dtype; weight, bias: tiles in their own dtype, or None.
    if weight is not None:
        y = y * weight.to(y.dtype)
    if bias is not None:
        y = y + bias.to(y.dtype)
    return y


@dsl.jit
def _normalize_split_rows(y_ptr, mean_ptr, rstd_ptr, x_ptr, weight_ptr, bias_ptr, x, x_edge, weight, bias,
                          edge_weight, edge_bias, rows, n_rows, n_cols, row_stride, eps, SUBTRACT_MEAN: dsl.constexpr,
                          BLOCK_N: dsl.constexpr, SHIFT: dsl.constexpr, CHUNKS: dsl.constexpr):
    # The forward of the rows `rows` ((R,)) whose split-window tiles x and x_edge (own dtype, 0 where masked
    # off) were just loaded. weight, bias, edge_weight, edge_bias: their tiles (gathered once by a persistent
    # program), or None to gather them here from weight_ptr / bias_ptr (None: no weight / bias). LayerNorm:
    # the shifted sums of norm_statistics (the comment there: one cross-warp exchange for both statistics).
    # CHUNKS > 1 (gathering here): the main tile's output in that many column chunks, each reading its x
    # again (L1 hits) and gathering its weight and bias: fewer registers live at once.
    acc_dtype = rstd_ptr.dtype.element
    row_mask = rows < n_rows
    offsets, columns, in_row, edge_offsets, edge_columns, edge_in_row = _split_window(rows, n_cols, row_stride,
                                                                                      BLOCK_N, SHIFT)
    mask = row_mask[:, None] & in_row
    edge_mask = row_mask[:, None] & edge_in_row
    x = x.to(acc_dtype)
    x_edge = x_edge.to(acc_dtype)
    mean = 0.0
    if SUBTRACT_MEAN:
        shift = row_shifts(x_ptr, rows, row_mask, n_cols, row_stride, 1).to(acc_dtype)
        total, squares = shifted_moments(x, shift, mask)
        edge_total, edge_squares = shifted_moments(x_edge, shift, edge_mask)
        total, squares = total + edge_total, squares + edge_squares
        mean, rstd = shifted_mean_rstd(total, squares, shift, n_cols, eps, 1.52587890625e-05)
        mean, rstd = second_sums(x, mask, x_edge, edge_mask, row_mask, total, squares, mean, rstd, n_cols, eps)
        dsl.store(mean_ptr + rows, mean, mask=row_mask)
        mean = mean[:, None]
    else:
        rstd = 1.0 / dsl.sqrt((dsl.sum(x * x, axis=1) + dsl.sum(x_edge * x_edge, axis=1)) / n_cols + eps)
    dsl.store(rstd_ptr + rows, rstd, mask=row_mask)
    gather = weight is None and bias is None
    if CHUNKS == 1 or not gather:
        if gather:
            weight, bias = affine_tiles(weight_ptr, bias_ptr, columns, in_row)
        dsl.store(y_ptr + offsets, _affine((x - mean) * rstd[:, None], weight, bias), mask=mask)
    else:
        CHUNK: dsl.constexpr = BLOCK_N // CHUNKS
        for chunk in dsl.static_range(CHUNKS):
            offsets, columns, in_row, _, _, _ = _split_window(rows, n_cols, row_stride, CHUNK, SHIFT, chunk * CHUNK)
            mask = row_mask[:, None] & in_row
            x = dsl.load(x_ptr + offsets, mask=mask, other=0.0).to(acc_dtype)
            weight, bias = affine_tiles(weight_ptr, bias_ptr, columns, in_row)
            dsl.store(y_ptr + offsets, _affine((x - mean) * rstd[:, None], weight, bias), mask=mask)
    if gather:
        edge_weight, edge_bias = affine_tiles(weight_ptr, bias_ptr, edge_columns, edge_in_row)
    dsl.store(y_ptr + edge_offsets, _affine((x_edge - mean) * rstd[:, None], edge_weight, edge_bias), mask=edge_mask)


@dsl.jit
def _split_x(x_ptr, rows, n_rows, n_cols, row_stride, BLOCK_N: dsl.constexpr, SHIFT: dsl.constexpr):
    # -> the split-window tiles (main, edges) of x at `rows`, own dtype, 0 where masked off.
    row_mask = rows < n_rows
    offsets, _, in_row, edge_offsets, _, edge_in_row = _split_window(rows, n_cols, row_stride, BLOCK_N, SHIFT)
    return (dsl.load(x_ptr + offsets, mask=row_mask[:, None] & in_row, other=0.0),
            dsl.load(x_ptr + edge_offsets, mask=row_mask[:, None] & edge_in_row, other=0.0))


@dsl.jit
def forward_split_kernel(y_ptr, mean_ptr, rstd_ptr, x_ptr, weight_ptr, bias_ptr, n_rows, n_cols, row_stride, eps,
                         SUBTRACT_MEAN: dsl.constexpr, BLOCK_ROWS: dsl.constexpr, BLOCK_N: dsl.constexpr,
                         SHIFT: dsl.constexpr, CHUNKS: dsl.constexpr = 1):
    # One program per BLOCK_ROWS rows; BLOCK_N >= n_cols - 1; weight and bias gathered per row
    # (CHUNKS: see _normalize_split_rows).
    rows = dsl.program_id(0) * BLOCK_ROWS + dsl.arange(0, BLOCK_ROWS)
    x, x_edge = _split_x(x_ptr, rows, n_rows, n_cols, row_stride, BLOCK_N, SHIFT)
    _normalize_split_rows(y_ptr, mean_ptr, rstd_ptr, x_ptr, weight_ptr, bias_ptr, x, x_edge, None, None, None, None,
                          rows, n_rows, n_cols, row_stride, eps, SUBTRACT_MEAN, BLOCK_N, SHIFT, CHUNKS)


@dsl.jit
def forward_split_persistent_kernel(y_ptr, mean_ptr, rstd_ptr, x_ptr, weight_ptr, bias_ptr, n_rows, n_cols,
                                    row_stride, eps, SUBTRACT_MEAN: dsl.constexpr, BLOCK_ROWS: dsl.constexpr,
                                    BLOCK_N: dsl.constexpr, SHIFT: dsl.constexpr, PREFETCH: dsl.constexpr = False):
    # A fixed grid of G programs, G * BLOCK_ROWS a multiple of SHIFT: program p normalizes the row tiles
    # p, p + G, ..., all at one place in their windows, with weight and bias gathered once (kept in
    # registers). PREFETCH: the next tile's x is loaded before this one is reduced.
    pid = dsl.program_id(0)
    n_programs = dsl.num_programs(0)
    lanes = dsl.arange(0, BLOCK_ROWS)
    _, columns, in_row, _, edge_columns, edge_in_row = _split_window(pid * BLOCK_ROWS + lanes, n_cols, row_stride,
                                                                     BLOCK_N, SHIFT)
    weight, bias = affine_tiles(weight_ptr, bias_ptr, columns, in_row)
    edge_weight, edge_bias = affine_tiles(weight_ptr, bias_ptr, edge_columns, edge_in_row)
    if PREFETCH:
        x, x_edge = _split_x(x_ptr, pid * BLOCK_ROWS + lanes, n_rows, n_cols, row_stride, BLOCK_N, SHIFT)
    for tile in range(pid, dsl.cdiv(n_rows, BLOCK_ROWS), n_programs):
        rows = tile * BLOCK_ROWS + lanes
        if PREFETCH:
            x_next, x_edge_next = _split_x(x_ptr, rows + n_programs * BLOCK_ROWS, n_rows, n_cols, row_stride, BLOCK_N,
                                           SHIFT)
        else:
            x, x_edge = _split_x(x_ptr, rows, n_rows, n_cols, row_stride, BLOCK_N, SHIFT)
        _normalize_split_rows(y_ptr, mean_ptr, rstd_ptr, x_ptr, weight_ptr, bias_ptr, x, x_edge, weight, bias,
                              edge_weight, edge_bias, rows, n_rows, n_cols, row_stride, eps, SUBTRACT_MEAN, BLOCK_N,
                              SHIFT, 1)
        if PREFETCH:
            x, x_edge = x_next, x_edge_next


@dsl.jit
def _split_loads(x_ptr, dy_ptr, mean_ptr, rstd_ptr, rows, n_rows, n_cols, row_stride, BLOCK_N: dsl.constexpr,
                 SHIFT: dsl.constexpr, SUBTRACT_MEAN: dsl.constexpr):
    # -> (x, dy, edge x, edge dy, mean, rstd) of `rows` through the split window: x and dy in their own
    # dtype (0 where masked off), rstd 0 for rows past the end (for RMSNorm `mean` is rstd, unused).
    row_mask = rows < n_rows
    offsets, _, in_row, edge_offsets, _, edge_in_row = _split_window(rows, n_cols, row_stride, BLOCK_N, SHIFT)
    mask = row_mask[:, None] & in_row
    edge_mask = row_mask[:, None] & edge_in_row
    x = dsl.load(x_ptr + offsets, mask=mask, other=0.0)
    dy = dsl.load(dy_ptr + offsets, mask=mask, other=0.0)
    x_edge = dsl.load(x_ptr + edge_offsets, mask=edge_mask, other=0.0)
    dy_edge = dsl.load(dy_ptr + edge_offsets, mask=edge_mask, other=0.0)
    mean, rstd = load_statistics(mean_ptr, rstd_ptr, rows, row_mask, SUBTRACT_MEAN)
    return x, dy, x_edge, dy_edge, mean, rstd


@dsl.jit
def backward_split_kernel(dx_ptr, dweight_partial_ptr, dbias_partial_ptr, dy_ptr, x_ptr, weight_ptr, mean_ptr,
                          rstd_ptr, n_rows, n_cols, row_stride, SUBTRACT_MEAN: dsl.constexpr,
                          BLOCK_ROWS: dsl.constexpr, BLOCK_N: dsl.constexpr, SHIFT: dsl.constexpr,
                          PREFETCH: dsl.constexpr):
    # A fixed grid of G programs (G * BLOCK_ROWS a multiple of SHIFT); program p handles the row tiles
    # p, p + G, ... whole (BLOCK_N >= n_cols - 1), writes their dx and keeps their dweight/dbias column
    # sums per lane: lane i's go to row p * BLOCK_ROWS + i of d{weight,bias}_partial ((G * BLOCK_ROWS,
    # n_cols) float32/64, or None). PREFETCH: the next tile's x and dy are loaded before this one is reduced.
    acc_dtype = rstd_ptr.dtype.element
    pid = dsl.program_id(0)
    n_programs = dsl.num_programs(0)
    n_tiles = dsl.cdiv(n_rows, BLOCK_ROWS)
    lanes = dsl.arange(0, BLOCK_ROWS)
    _, columns, in_row, _, edge_columns, edge_in_row = _split_window(pid * BLOCK_ROWS + lanes, n_cols, row_stride,
                                                                     BLOCK_N, SHIFT)
    weight = None
    edge_weight = None
    if weight_ptr is not None:
        weight = dsl.load(weight_ptr + columns, mask=in_row, other=0.0)
        edge_weight = dsl.load(weight_ptr + edge_columns, mask=edge_in_row, other=0.0)
    dweight_sum = dsl.zeros((BLOCK_ROWS, BLOCK_N), acc_dtype)
    dbias_sum = dsl.zeros((BLOCK_ROWS, BLOCK_N), acc_dtype)
    edge_dweight_sum = dsl.zeros((BLOCK_ROWS, 2 * SHIFT), acc_dtype)
    edge_dbias_sum = dsl.zeros((BLOCK_ROWS, 2 * SHIFT), acc_dtype)
    if PREFETCH:
        x, dy, x_edge, dy_edge, mean, rstd = _split_loads(x_ptr, dy_ptr, mean_ptr, rstd_ptr, pid * BLOCK_ROWS + lanes,
                                                          n_rows, n_cols, row_stride, BLOCK_N, SHIFT, SUBTRACT_MEAN)
    for tile in range(pid, n_tiles, n_programs):
        rows = tile * BLOCK_ROWS + lanes
        row_mask = rows < n_rows
        if PREFETCH:
            x_next, dy_next, x_edge_next, dy_edge_next, mean_next, rstd_next = _split_loads(
                x_ptr, dy_ptr, mean_ptr, rstd_ptr, rows + n_programs * BLOCK_ROWS, n_rows, n_cols, row_stride, BLOCK_N,
                SHIFT, SUBTRACT_MEAN)
        else:
            x, dy, x_edge, dy_edge, mean, rstd = _split_loads(x_ptr, dy_ptr, mean_ptr, rstd_ptr, rows, n_rows, n_cols,
                                                              row_stride, BLOCK_N, SHIFT, SUBTRACT_MEAN)
        mask = row_mask[:, None] & in_row
        edge_mask = row_mask[:, None] & edge_in_row
        xhat, dy_acc, g = normalize(x, dy, mean, rstd, weight, mask, SUBTRACT_MEAN)
        edge_xhat, edge_dy, edge_g = normalize(x_edge, dy_edge, mean, rstd, edge_weight, edge_mask, SUBTRACT_MEAN)
        dweight_sum += dy_acc * xhat
        dbias_sum += dy_acc
        edge_dweight_sum += edge_dy * edge_xhat
        edge_dbias_sum += edge_dy
        if dx_ptr is not None:
            c1 = (dsl.sum(xhat * g, axis=1) + dsl.sum(edge_xhat * edge_g, axis=1)) / n_cols
            dx = g - xhat * c1[:, None]
            dx_edge = edge_g - edge_xhat * c1[:, None]
            if SUBTRACT_MEAN:
                c2 = (dsl.sum(g, axis=1) + dsl.sum(edge_g, axis=1)) / n_cols
                dx = dx - c2[:, None]
                dx_edge = dx_edge - c2[:, None]
            offsets, _, _, edge_offsets, _, _ = _split_window(rows, n_cols, row_stride, BLOCK_N, SHIFT)
            dsl.store(dx_ptr + offsets, dx * rstd[:, None], mask=mask)
            dsl.store(dx_ptr + edge_offsets, dx_edge * rstd[:, None], mask=edge_mask)
        if PREFETCH:
            x, dy, x_edge, dy_edge, mean, rstd = x_next, dy_next, x_edge_next, dy_edge_next, mean_next, rstd_next
    partial_rows = (pid * BLOCK_ROWS + lanes).to(dsl.int64)[:, None] * n_cols
    if dweight_partial_ptr is not None:
        dsl.store(dweight_partial_ptr + partial_rows + columns, dweight_sum, mask=in_row)
        dsl.store(dweight_partial_ptr + partial_rows + edge_columns, edge_dweight_sum, mask=edge_in_row)
    if dbias_partial_ptr is not None:
        dsl.store(dbias_partial_ptr + partial_rows + columns, dbias_sum, mask=in_row)
        dsl.store(dbias_partial_ptr + partial_rows + edge_columns, edge_dbias_sum, mask=edge_in_row)
