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
  Used while the padded row fits (see norms.forward_config).
- `forward_looped_kernel`: one row per program in BLOCK_N-column chunks: a first pass keeps per-lane
  Welford statistics (count, mean, M2) that are merged exactly at the end, a second pass normalizes.
- `backward_fused_kernel`: a program walks its row group BLOCK_ROWS rows at a time with whole rows in
  registers and keeps its dweight/dbias column sums in registers (x and dy are read once).
- `backward_partials_kernel` + `backward_input_kernel`: the split backward for rows too long to keep
  in registers next to the column sums. The first kernel tiles (row group, column chunk); it reads x
  and dy once to produce the dweight/dbias partials and each row's c1/c2 restricted to its chunk. The
  second sums a row's chunk contributions to c1/c2 and writes dx (x and dy are read a second time).
  Both row loops are `_group_column_sums`; with PREFETCH it issues the next row block's loads before
  reducing the current one, so that a program keeps two blocks of loads in flight.
- `column_sum_kernel`: the second stage of the dweight/dbias reduction.

Addressing: row r, column c of x is at x_ptr + r * x_row_stride + c * x_col_stride, with the row
offset computed in int64 (tensors may hold more than 2**31 elements); column offsets stay int32 (the
launcher guarantees (N - 1) * |col stride| < 2**31). Padded lanes (columns >= N, rows >= M) load 0
and are excluded from every statistic with explicit masks. Output and statistics buffers are
contiguous.
"""

from __future__ import annotations

import fusedops.dsl as dsl


@dsl.jit
def forward_kernel(y_ptr, mean_ptr, rstd_ptr, x_ptr, weight_ptr, bias_ptr,
                   n_rows, n_cols, x_row_stride, x_col_stride, y_row_stride, eps,
                   SUBTRACT_MEAN: dsl.constexpr, BLOCK_ROWS: dsl.constexpr, BLOCK_N: dsl.constexpr,
                   ALIGN: dsl.constexpr = 1):
    # x_ptr: (n_rows, n_cols) strided; y_ptr: (n_rows, n_cols) unit column stride; weight_ptr, bias_ptr:
    # (n_cols,) contiguous or None; mean_ptr (LayerNorm only, else None), rstd_ptr: (n_rows,) float32/64.
    # One program per BLOCK_ROWS rows; BLOCK_N >= n_cols.
    # ALIGN: a power of two dividing both row strides (in elements), so that rows of e.g. 1000 fp16
    # elements still start 16-byte vectors.
    acc_dtype = rstd_ptr.dtype.element
    rows = dsl.program_id(0) * BLOCK_ROWS + dsl.arange(0, BLOCK_ROWS)
    row_mask = rows < n_rows
    rows64 = rows.to(dsl.int64)
    cols = dsl.arange(0, BLOCK_N)[None, :]
    col_mask = cols < n_cols
    x_offsets = dsl.multiple_of(rows64 * x_row_stride, ALIGN)[:, None] + cols * x_col_stride
    y_offsets = dsl.multiple_of(rows64 * y_row_stride, ALIGN)[:, None] + cols
    mask = row_mask[:, None] & col_mask
    x = dsl.load(x_ptr + x_offsets, mask=mask, other=0.0)
    x = x.to(acc_dtype)
    if SUBTRACT_MEAN:
        mean = dsl.sum(x, axis=1) / n_cols
        x = dsl.where(mask, x - mean[:, None], 0.0)
    rstd = 1.0 / dsl.sqrt(dsl.sum(x * x, axis=1) / n_cols + eps)
    y = x * rstd[:, None]
    if weight_ptr is not None:
        y = y * dsl.load(weight_ptr + cols, mask=col_mask, other=0.0).to(acc_dtype)
    if bias_ptr is not None:
        y = y + dsl.load(bias_ptr + cols, mask=col_mask, other=0.0).to(acc_dtype)
    dsl.store(y_ptr + y_offsets, y, mask=mask)
    if SUBTRACT_MEAN:
        dsl.store(mean_ptr + rows, mean, mask=row_mask)
    dsl.store(rstd_ptr + rows, rstd, mask=row_mask)


@dsl.jit
def forward_looped_kernel(y_ptr, mean_ptr, rstd_ptr, x_ptr, weight_ptr, bias_ptr,
                          n_rows, n_cols, x_row_stride, x_col_stride, y_row_stride, eps,
                          SUBTRACT_MEAN: dsl.constexpr, BLOCK_N: dsl.constexpr):
    # Arguments as forward_kernel; one program per row, any n_cols, BLOCK_N columns at a time.
    acc_dtype = rstd_ptr.dtype.element
    row = dsl.program_id(0)
    x_row = x_ptr + row.to(dsl.int64) * x_row_stride
    y_row = y_ptr + row.to(dsl.int64) * y_row_stride
    lanes = dsl.arange(0, BLOCK_N)
    n_chunks = dsl.cdiv(n_cols, BLOCK_N)
    # Pass 1. LayerNorm: lane j runs Welford's update over the columns j, j + BLOCK_N, ... it owns;
    # every chunk but the last is full, so a lane valid in chunk k has seen exactly k + 1 values.
    # RMSNorm: lane-wise sums of squares.
    count = dsl.zeros((BLOCK_N,), acc_dtype)
    lane_mean = dsl.zeros((BLOCK_N,), acc_dtype)
    lane_m2 = dsl.zeros((BLOCK_N,), acc_dtype)
    for chunk in range(0, n_chunks):
        cols = chunk * BLOCK_N + lanes
        mask = cols < n_cols
        x = dsl.load(x_row + cols * x_col_stride, mask=mask, other=0.0).to(acc_dtype)
        if SUBTRACT_MEAN:
            count += dsl.where(mask, 1.0, 0.0)
            delta = x - lane_mean
            lane_mean += dsl.where(mask, delta / (chunk + 1.0), 0.0)
            lane_m2 += dsl.where(mask, delta * (x - lane_mean), 0.0)
        else:
            lane_m2 += x * x
    if SUBTRACT_MEAN:
        # Merge the lanes (Chan et al.'s pairwise formula, summed over all lanes at once):
        # M2 = sum(M2_j) + sum(n_j * (mean_j - mean)^2), mean = sum(n_j * mean_j) / N.
        mean = dsl.sum(count * lane_mean, axis=0) / n_cols
        spread = lane_mean - mean
        variance = (dsl.sum(lane_m2, axis=0) + dsl.sum(count * spread * spread, axis=0)) / n_cols
        dsl.store(mean_ptr + row, mean)
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
            x = x - mean
        y = x * rstd
        if weight_ptr is not None:
            y = y * dsl.load(weight_ptr + cols, mask=mask, other=0.0).to(acc_dtype)
        if bias_ptr is not None:
            y = y + dsl.load(bias_ptr + cols, mask=mask, other=0.0).to(acc_dtype)
        dsl.store(y_row + cols, y, mask=mask)


@dsl.jit
def _load_tile(x_ptr, dy_ptr, mean_ptr, rstd_ptr, rows, cols, row_mask, col_mask,
               x_row_stride, x_col_stride, dy_row_stride, dy_col_stride, SUBTRACT_MEAN: dsl.constexpr):
    # The (rows, cols) tiles of x and dy in their own dtype and the rows' mean and rstd; 0 where masked
    # off (a masked-off row's rstd of 0 zeroes its xhat). For RMSNorm `mean` is rstd, unused.
    mask = row_mask[:, None] & col_mask[None, :]
    rows64 = rows.to(dsl.int64)
    x = dsl.load(x_ptr + rows64[:, None] * x_row_stride + cols[None, :] * x_col_stride, mask=mask, other=0.0)
    dy = dsl.load(dy_ptr + rows64[:, None] * dy_row_stride + cols[None, :] * dy_col_stride, mask=mask, other=0.0)
    rstd = dsl.load(rstd_ptr + rows, mask=row_mask, other=0.0)
    mean = rstd
    if SUBTRACT_MEAN:
        mean = dsl.load(mean_ptr + rows, mask=row_mask, other=0.0)
    return x, dy, mean, rstd


@dsl.jit
def _normalize(x, dy, mean, rstd, weight, mask, SUBTRACT_MEAN: dsl.constexpr):
    # (xhat, dy, g = dy * weight) of a tile from _load_tile, in the accumulation dtype (rstd's); weight:
    # the (BLOCK_N,) weight in its own dtype, or None. Masked-off elements of all three are 0.
    acc_dtype = rstd.dtype
    x = x.to(acc_dtype)
    if SUBTRACT_MEAN:
        x = dsl.where(mask, x - mean[:, None], 0.0)
    xhat = x * rstd[:, None]
    dy = dy.to(acc_dtype)
    g = dy
    if weight is not None:
        g = dy * weight.to(acc_dtype)[None, :]
    return xhat, dy, g


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
