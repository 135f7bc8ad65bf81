"""LayerNorm and RMSNorm backward kernels in the DSL: dx, and dweight / dbias reduced in two deterministic stages.

The forward (norm_forward_kernels.py: the ops, xhat and the accumulation dtype) saves mean (LayerNorm) and rstd
per row; the constexpr SUBTRACT_MEAN selects LayerNorm (True) or RMSNorm (False).

Backward, with g = dy * weight (dy without weight) and c1 = sum(xhat * g) / N, c2 = sum(g) / N:

    dx = rstd * (g - xhat * c1 - c2)      (RMSNorm: rstd * (g - xhat * c1))
    dweight = sum over rows of dy * xhat,    dbias = sum over rows of dy

dweight and dbias are reduced in two stages with no atomics, so results are bitwise reproducible for
a given shape and device: each program owns a contiguous group of rows and writes its column sums to
its own row of a (num_programs, N) float32 partial buffer; `column_sum_kernel` then adds the rows of
that buffer up in a fixed order.

Kernels and when the launchers (norm_backward_launcher.py) use them:
- `backward_fused_kernel`: a program walks its row group BLOCK_ROWS rows at a time with whole rows in
  registers and keeps its dweight/dbias column sums in registers (x and dy are read once).
- `backward_partials_kernel` + `backward_input_kernel`: the split backward for rows too long to keep
  in registers next to the column sums. The first kernel tiles (row group, column chunk); it reads x
  and dy once to produce the dweight/dbias partials and each row's c1/c2 restricted to its chunk. The
  second sums a row's chunk contributions to c1/c2 and writes dx (x and dy are read a second time).
  Both row loops are `_group_column_sums`; with PREFETCH it issues the next row block's loads before
  reducing the current one, so that a program keeps two blocks of loads in flight.
- `backward_persistent_kernel` (BackwardConfig.persistent): a fixed grid whose programs walk strided row
  tiles over a column part of the row each, for 16-bit rows of 8192 columns (whole rows) and, in thread
  block clusters whose programs add their parts' row sums through distributed shared memory (CLUSTER, one
  pass over x and dy), of 8193 to 32768 columns, through the split window where rows start off 16-byte
  boundaries (EDGES; see norm_backward_config.backward_config).
- `column_sum_kernel`: the second stage of the dweight/dbias reduction.
norm_split_window.py has the backward of 16-bit rows of 514 to 4097 columns off 16-byte boundaries.

Addressing and padded lanes as in norm_forward_kernels.py (row offsets in int64, column offsets in int32;
padded lanes load 0 and are masked out of every sum).
"""

from __future__ import annotations

import fusedops.dsl as dsl
from fusedops.kernels.row_windows import split_window, window_offsets


@dsl.jit
def load_statistics(mean_ptr, rstd_ptr, rows, row_mask, SUBTRACT_MEAN: dsl.constexpr):
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
    mean, rstd = load_statistics(mean_ptr, rstd_ptr, rows, row_mask, SUBTRACT_MEAN)
    return x, dy, mean, rstd


@dsl.jit
def normalize(x, dy, mean, rstd, weight, mask, SUBTRACT_MEAN: dsl.constexpr):
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
    # dx = rstd * (g - xhat * c1 - c2) of an (R, C) tile (xhat, dy: normalize's) and the rows' c1, c2 ((R,),
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
        xhat, dy_acc, g = normalize(x, dy, mean, rstd, weight, mask, SUBTRACT_MEAN)
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
    xhat, dy, g = normalize(x, dy, mean, rstd, weight, mask, SUBTRACT_MEAN)
    dx = g - xhat * (dsl.sum(c1, axis=1) / n_cols)[:, None]
    if SUBTRACT_MEAN:
        dx = dx - (dsl.sum(c2, axis=1) / n_cols)[:, None]
    dsl.store(dx_ptr + rows.to(dsl.int64)[:, None] * dx_row_stride + cols[None, :], dx * rstd[:, None], mask=mask)


@dsl.jit
def _window_loads(x_ptr, dy_ptr, mean_ptr, rstd_ptr, rows, cols, n_rows, n_cols, x_row_stride, x_col_stride,
                  dy_row_stride, dy_col_stride, ALIGN: dsl.constexpr, SHIFT: dsl.constexpr,
                  SUBTRACT_MEAN: dsl.constexpr):
    # -> (x, dy, mean, rstd, mask) of the (rows, cols) tile addressed through window_offsets: x and dy in
    # their own dtype (0 where masked off), the rows' statistics (rstd 0 for rows past the end; for
    # RMSNorm `mean` is rstd, unused). With SHIFT, x and dy share one row stride.
    _, _, in_row = window_offsets(rows, cols, n_cols, x_row_stride, x_col_stride, ALIGN, SHIFT)
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
    x_offsets, _, _ = window_offsets(rows, cols, n_cols, x_row_stride, x_col_stride, ALIGN, SHIFT)
    dy_offsets, _, _ = window_offsets(rows, cols, n_cols, dy_row_stride, dy_col_stride, ALIGN, SHIFT)
    mask = row_mask[:, None] & in_row
    x = dsl.load(x_ptr + x_offsets, mask=mask, other=0.0)
    dy = dsl.load(dy_ptr + dy_offsets, mask=mask, other=0.0)
    mean, rstd = load_statistics(mean_ptr, rstd_ptr, rows, row_mask, SUBTRACT_MEAN)
    return x, dy, mean, rstd, mask


@dsl.jit
def _edge_loads(x_ptr, dy_ptr, rows, edges, edge_in_row, n_rows, n_cols, row_stride, SHIFT: dsl.constexpr):
    # -> (x, dy, mask) of the split window's edge lanes `edges` of rows (row_windows.split_window; own dtype, 0
    # where masked off)
    mask = (rows < n_rows)[:, None] & edge_in_row
    start, _, _, _, _, _ = split_window(rows, n_cols, row_stride, SHIFT)
    offsets = start[:, None] + edges
    return (dsl.load(x_ptr + offsets, mask=mask, other=0.0), dsl.load(dy_ptr + offsets, mask=mask, other=0.0),
            mask)


@dsl.jit
def backward_persistent_kernel(dx_ptr, dweight_partial_ptr, dbias_partial_ptr, dy_ptr, x_ptr, weight_ptr, mean_ptr,
                               rstd_ptr, n_rows, n_cols, n_groups, n_parts, x_row_stride, x_col_stride, dy_row_stride,
                               dy_col_stride, dx_row_stride, SUBTRACT_MEAN: dsl.constexpr, BLOCK_ROWS: dsl.constexpr,
                               BLOCK_N: dsl.constexpr, TWO_PASS: dsl.constexpr, CHUNK: dsl.constexpr,
                               PREFETCH: dsl.constexpr, ALIGN: dsl.constexpr = 1, SHIFT: dsl.constexpr = 0,
                               CLUSTER: dsl.constexpr = 1, MIN_BLOCKS_PER_SM: dsl.constexpr = 0,
                               EDGES: dsl.constexpr = False):
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
    # EDGES (with SHIFT, not TWO_PASS): the window is split as norm_split_window's (n_parts = cdiv(n_cols - 1,
    # BLOCK_N)): part p holds positions SHIFT + [p * BLOCK_N, (p + 1) * BLOCK_N) masked by position < middle (whole
    # 16-byte vectors: no per-element predicates), and part 0 also the 2 * SHIFT edge lanes, per element. Without
    # it the parts' lanes are masked element by element (first <= position < first + n_cols): session 42 (H100,
    # fp16, 8192 rows, x torch's): 12289 columns 1.67x, against 2.11x for 12288 columns (no window).
    dsl.static_assert(not (EDGES and (TWO_PASS or not SHIFT)), "EDGES needs SHIFT and one pass")
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
    if EDGES:
        cols = cols + SHIFT
    _, logical, in_row = window_offsets(group * BLOCK_ROWS + lanes, cols, n_cols, x_row_stride, x_col_stride, ALIGN,
                                        SHIFT)
    edges = None
    edge_in_row = None
    edge_columns = None
    edge_weight = None
    edge_dweight_sum = None
    edge_dbias_sum = None
    if EDGES:
        _, _, middle, edges, edge_columns, edge_in_row = split_window(group * BLOCK_ROWS + lanes, n_cols,
                                                                      x_row_stride, SHIFT)
        in_row = cols[None, :] < middle[:, None]
        edge_in_row = edge_in_row & (part == 0)
        if weight_ptr is not None:
            edge_weight = dsl.load(weight_ptr + edge_columns, mask=edge_in_row, other=0.0)
        edge_dweight_sum = dsl.zeros((BLOCK_ROWS, 2 * SHIFT), acc_dtype)
        edge_dbias_sum = dsl.zeros((BLOCK_ROWS, 2 * SHIFT), acc_dtype)
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
                _, chunk_logical, chunk_in_row = window_offsets(rows, start + chunk_cols, n_cols, x_row_stride,
                                                                x_col_stride, ALIGN, SHIFT)
                chunk_weight = None
                if weight_ptr is not None:
                    chunk_weight = dsl.load(weight_ptr + chunk_logical, mask=chunk_in_row, other=0.0)
                chunk_x, chunk_dy, chunk_mean, chunk_rstd, chunk_mask = _window_loads(
                    x_ptr, dy_ptr, mean_ptr, rstd_ptr, rows, start + chunk_cols, n_rows, n_cols, x_row_stride,
                    x_col_stride, dy_row_stride, dy_col_stride, ALIGN, SHIFT, SUBTRACT_MEAN)
                chunk_xhat, _, chunk_g = normalize(chunk_x, chunk_dy, chunk_mean, chunk_rstd, chunk_weight,
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
        if EDGES:       # (not prefetched: a few lanes; their registers across the loop spilled at 128)
            x_edge, dy_edge, edge_mask = _edge_loads(x_ptr, dy_ptr, rows, edges, edge_in_row, n_rows, n_cols,
                                                     x_row_stride, SHIFT)
        xhat, dy_acc, g = normalize(x, dy, mean, rstd, weight, mask, SUBTRACT_MEAN)
        dweight_sum += dy_acc * xhat
        dbias_sum += dy_acc
        if EDGES:
            edge_xhat, edge_dy, edge_g = normalize(x_edge, dy_edge, mean, rstd, edge_weight, edge_mask, SUBTRACT_MEAN)
            edge_dweight_sum += edge_dy * edge_xhat
            edge_dbias_sum += edge_dy
        if dx_ptr is not None:
            if TWO_PASS:
                dx = g - xhat * c1[:, None]
                if SUBTRACT_MEAN:
                    dx = dx - c2[:, None]
                dx = dx * rstd[:, None]
            else:
                c1 = dsl.sum(xhat * g, axis=1)
                c2 = dsl.sum(g, axis=1)
                if EDGES:
                    c1 += dsl.sum(edge_xhat * edge_g, axis=1)
                    c2 += dsl.sum(edge_g, axis=1)
                if CLUSTER > 1 and SUBTRACT_MEAN:
                    c1, c2 = dsl.cluster_sum(c1, c2)
                elif CLUSTER > 1:
                    c1 = dsl.cluster_sum(c1)
                dx = _input_gradient(xhat, dy_acc, weight, rstd, c1 / n_cols, c2 / n_cols, SUBTRACT_MEAN)
            dx_offsets, _, _ = window_offsets(rows, cols, n_cols, dx_row_stride, 1, ALIGN, SHIFT)
            dsl.store(dx_ptr + dx_offsets, dx, mask=mask)
            if EDGES:
                edge_dx = _input_gradient(edge_xhat, edge_dy, edge_weight, rstd, c1 / n_cols, c2 / n_cols,
                                          SUBTRACT_MEAN)
                dx_start, _, _, _, _, _ = split_window(rows, n_cols, dx_row_stride, SHIFT)
                dsl.store(dx_ptr + dx_start[:, None] + edges, edge_dx, mask=edge_mask)
        if PREFETCH:
            x, dy, mean, rstd, mask = x_next, dy_next, mean_next, rstd_next, mask_next
    partial_rows = (group * BLOCK_ROWS + lanes).to(dsl.int64)[:, None] * n_cols
    partial = partial_rows + logical
    if dweight_partial_ptr is not None:
        dsl.store(dweight_partial_ptr + partial, dweight_sum, mask=in_row)
        if EDGES:
            dsl.store(dweight_partial_ptr + partial_rows + edge_columns, edge_dweight_sum, mask=edge_in_row)
    if dbias_partial_ptr is not None:
        dsl.store(dbias_partial_ptr + partial, dbias_sum, mask=in_row)
        if EDGES:
            dsl.store(dbias_partial_ptr + partial_rows + edge_columns, edge_dbias_sum, mask=edge_in_row)


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
