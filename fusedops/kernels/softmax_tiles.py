"""Softmax and log-softmax tiles: a program's rows in one pass or by the online path, forward and backward.

Tiles. A program loads a tile of rows and reduces each row (the TILE constexpr):
  - "rows": ROWS rows as [ROWS, BLOCK], reduced along axis 1: the reduced dim is the fastest in
    memory (col stride 1, the usual `dim=-1`), or neither layout is contiguous. One row per
    program from 1024 elements on (and in the online path), several for shorter rows.
  - "columns": ROWS neighbouring rows of one outer index as [BLOCK, ROWS], reduced along axis 0:
    used when the reduced dim is strided and the inner dims are contiguous (`dim` not last on a
    contiguous tensor). The tile's contiguous axis runs over neighbouring rows, so loads stay
    coalesced and vectorized with no transposing copy (which would cost a full extra read and
    write of the tensor).
One pass (ONE_PASS): the whole row is one tile, read once. Otherwise the online path of Milakov &
Gimelshein, "Online normalizer calculation for softmax" (2018): a first sweep over the row in
BLOCK-wide chunks keeps a running max m and a sum s rescaled by exp(m_old - m_new) whenever the
max grows; a second sweep writes the outputs. The backward sweeps once for sum(dy * y) (or
sum(dy)), once for dx. Statistics are in ACC: float32 (float64 for float64 tensors, which only
the interpreter runs).
"""

from __future__ import annotations

import fusedops.dsl as dsl

# TILE (a constexpr string) says how a program's tile covers rows (see "Tiles" above):
#   "rows":    ROWS rows, [ROWS, BLOCK], reduced along axis 1;
#   "columns": ROWS neighbouring rows of one outer index, [BLOCK, ROWS], reduced along axis 0.


@dsl.jit
def _program_rows(tile, n_rows, n_inner, inner_blocks, TILE: dsl.constexpr, ROWS: dsl.constexpr,
                  SPLIT: dsl.constexpr):
    # -> (outer index, inner index, row mask) of tile `tile`'s ROWS rows, (ROWS,) int64 blocks.
    # SPLIT: rows have an inner index (inner > 1; always for "columns").
    pid = tile.to(dsl.int64)
    if TILE == "columns":
        outer = pid // inner_blocks
        inner = (pid - outer * inner_blocks) * ROWS + dsl.arange(0, ROWS)
        return outer, inner, inner < n_inner
    rows = pid * ROWS + dsl.arange(0, ROWS)
    if SPLIT:
        outer = rows // n_inner
        return outer, rows - outer * n_inner, rows < n_rows
    return rows, rows * 0, rows < n_rows


@dsl.jit
def _tile(outer, inner, row_mask, cols, n_cols, outer_stride, inner_stride, col_stride,
          TILE: dsl.constexpr, SPLIT: dsl.constexpr, WIDE: dsl.constexpr, ALIGN: dsl.constexpr,
          SHIFT: dsl.constexpr):
    # -> (offsets, mask) of one tensor's tile: rows (outer, inner) x columns `cols`.
    # ALIGN: a power of two dividing the strides that start each contiguous run (row strides for
    # "rows", outer and col strides for "columns"), so that e.g. rows of 1000 fp16 elements
    # still get 16-byte vectors (the launcher only specializes strides divisible by 16).
    # SHIFT (0, or the elements of a 16-byte vector; "rows" tiles without SPLIT, unit column
    # strides, one row stride shared by every tensor, 16-byte aligned tensors): rows that start
    # anywhere (odd N) are addressed through a window starting at the 16-byte boundary at or before
    # the row: `cols` are then window positions, and the row's column c sits at window position
    # c + (row start mod SHIFT), the same for every tensor. Whole 16-byte groups move as vectors.
    if SPLIT:
        base = outer * outer_stride + inner * inner_stride
    else:
        base = outer * outer_stride
    if SHIFT:
        shift = base % SHIFT
        window = dsl.multiple_of(base - shift, SHIFT)
        logical = cols[None, :] - shift.to(dsl.int32)[:, None]
        return window[:, None] + cols[None, :], row_mask[:, None] & (logical >= 0) & (logical < n_cols)
    base = dsl.multiple_of(base, ALIGN)
    if WIDE:
        col_offsets = cols.to(dsl.int64) * col_stride
    else:
        col_offsets = cols * col_stride
    if TILE == "columns":
        col_offsets = dsl.multiple_of(col_offsets, ALIGN)
    if TILE == "rows":
        return base[:, None] + col_offsets[None, :], row_mask[:, None] & (cols[None, :] < n_cols)
    return col_offsets[:, None] + base[None, :], (cols[:, None] < n_cols) & row_mask[None, :]


@dsl.jit
def _row_max(x, TILE: dsl.constexpr):
    # The max of every row of the tile, shaped to broadcast against it.
    if TILE == "rows":
        return dsl.max(x, axis=1, keep_dims=True)
    return dsl.max(x, axis=0, keep_dims=True)


@dsl.jit
def _row_sum(x, TILE: dsl.constexpr):
    if TILE == "rows":
        return dsl.sum(x, axis=1, keep_dims=True)
    return dsl.sum(x, axis=0, keep_dims=True)


@dsl.jit
def forward_tile(
    tile, y_ptr, x_ptr, n_rows, n_cols, n_inner, inner_blocks,
    x_outer_stride, x_inner_stride, x_col_stride, y_outer_stride, y_inner_stride, y_col_stride,
    LOG: dsl.constexpr, TILE: dsl.constexpr, ROWS: dsl.constexpr, BLOCK: dsl.constexpr,
    ONE_PASS: dsl.constexpr, SPLIT: dsl.constexpr, WIDE: dsl.constexpr, ALIGN: dsl.constexpr, ACC: dsl.constexpr,
    SHIFT: dsl.constexpr,
):
    # The forward of one tile (see softmax_kernels._forward_kernel).
    outer, inner, row_mask = _program_rows(tile, n_rows, n_inner, inner_blocks, TILE, ROWS, SPLIT)
    cols = dsl.arange(0, BLOCK)
    if ONE_PASS:
        x_offsets, mask = _tile(outer, inner, row_mask, cols, n_cols, x_outer_stride, x_inner_stride,
                                x_col_stride, TILE, SPLIT, WIDE, ALIGN, SHIFT)
        y_offsets, _ = _tile(outer, inner, row_mask, cols, n_cols, y_outer_stride, y_inner_stride,
                             y_col_stride, TILE, SPLIT, WIDE, ALIGN, SHIFT)
        x = dsl.load(x_ptr + x_offsets, mask=mask, other=-float("inf")).to(ACC)
        shifted = x - _row_max(x, TILE)
        numerator = dsl.exp(shifted)
        total = _row_sum(numerator, TILE)
        if LOG:
            y = shifted - dsl.log(total)
        else:
            y = numerator * (1.0 / total)
        dsl.store(y_ptr + y_offsets, y.to(y_ptr.dtype.element), mask=mask)
    else:
        # Every lane keeps its own running max and rescaled sum over the columns it sees, so the loop
        # has no cross-thread reduction (no barrier: warps and chunks overlap); one exp per element:
        # with d = x - lane_max, a larger x rescales the sum by exp(-d) and adds 1, a smaller one adds
        # exp(d). Masked-off (-inf) elements leave a lane unchanged. The lanes merge once at the end.
        lane_max = dsl.full((BLOCK, ROWS) if TILE == "columns" else (ROWS, BLOCK), -float("inf"), ACC)
        lane_sum = dsl.zeros((BLOCK, ROWS) if TILE == "columns" else (ROWS, BLOCK), ACC)
        for start in range(0, n_cols + SHIFT, BLOCK):
            x_offsets, mask = _tile(outer, inner, row_mask, start + cols, n_cols, x_outer_stride,
                                    x_inner_stride, x_col_stride, TILE, SPLIT, WIDE, ALIGN, SHIFT)
            x = dsl.load(x_ptr + x_offsets, mask=mask, other=-float("inf")).to(ACC)
            difference = x - lane_max
            scale = dsl.exp(-dsl.abs(difference))
            updated = dsl.where(difference > 0.0, lane_sum * scale + 1.0, lane_sum + scale)
            lane_sum = dsl.where(x == -float("inf"), lane_sum, updated)
            lane_max = dsl.maximum(lane_max, x)
        running_max = _row_max(lane_max, TILE)
        # A row that has seen only -inf: shift by 0 instead of -inf (exp(-inf - (-inf)) is NaN).
        shift = dsl.where(running_max == -float("inf"), 0.0, running_max)
        running_sum = _row_sum(lane_sum * dsl.exp(lane_max - shift), TILE)
        # x - max is exact; adding log(sum) to the max first would round at the max's magnitude.
        if LOG:
            log_total = dsl.log(running_sum)
        else:
            inverse = 1.0 / running_sum
        for start in range(0, n_cols + SHIFT, BLOCK):
            x_offsets, mask = _tile(outer, inner, row_mask, start + cols, n_cols, x_outer_stride,
                                    x_inner_stride, x_col_stride, TILE, SPLIT, WIDE, ALIGN, SHIFT)
            y_offsets, _ = _tile(outer, inner, row_mask, start + cols, n_cols, y_outer_stride,
                                 y_inner_stride, y_col_stride, TILE, SPLIT, WIDE, ALIGN, SHIFT)
            x = dsl.load(x_ptr + x_offsets, mask=mask, other=-float("inf")).to(ACC)
            if LOG:
                y = (x - running_max) - log_total
            else:
                y = dsl.exp(x - running_max) * inverse
            dsl.store(y_ptr + y_offsets, y.to(y_ptr.dtype.element), mask=mask)


@dsl.jit
def backward_tile(
    tile, dx_ptr, dy_ptr, y_ptr, n_rows, n_cols, n_inner, inner_blocks,
    dx_outer_stride, dx_inner_stride, dx_col_stride,
    dy_outer_stride, dy_inner_stride, dy_col_stride,
    y_outer_stride, y_inner_stride, y_col_stride,
    LOG: dsl.constexpr, TILE: dsl.constexpr, ROWS: dsl.constexpr, BLOCK: dsl.constexpr,
    ONE_PASS: dsl.constexpr, SPLIT: dsl.constexpr, WIDE: dsl.constexpr, ALIGN: dsl.constexpr, ACC: dsl.constexpr,
    SHIFT: dsl.constexpr,
):
    # The backward of one tile (see softmax_kernels._backward_kernel).
    outer, inner, row_mask = _program_rows(tile, n_rows, n_inner, inner_blocks, TILE, ROWS, SPLIT)
    cols = dsl.arange(0, BLOCK)
    if ONE_PASS:
        dy_offsets, mask = _tile(outer, inner, row_mask, cols, n_cols, dy_outer_stride, dy_inner_stride,
                                 dy_col_stride, TILE, SPLIT, WIDE, ALIGN, SHIFT)
        y_offsets, _ = _tile(outer, inner, row_mask, cols, n_cols, y_outer_stride, y_inner_stride,
                             y_col_stride, TILE, SPLIT, WIDE, ALIGN, SHIFT)
        dx_offsets, _ = _tile(outer, inner, row_mask, cols, n_cols, dx_outer_stride, dx_inner_stride,
                              dx_col_stride, TILE, SPLIT, WIDE, ALIGN, SHIFT)
        dy = dsl.load(dy_ptr + dy_offsets, mask=mask, other=0.0).to(ACC)
        y = dsl.load(y_ptr + y_offsets, mask=mask, other=0.0).to(ACC)
        if LOG:
            dx = dy - dsl.exp(y) * _row_sum(dy, TILE)
        else:
            dx = y * (dy - _row_sum(dy * y, TILE))
        dsl.store(dx_ptr + dx_offsets, dx.to(dx_ptr.dtype.element), mask=mask)
    else:
        # Lane-wise partial sums, reduced across threads once after the loop (no barrier inside it).
        lane_total = dsl.zeros((BLOCK, ROWS) if TILE == "columns" else (ROWS, BLOCK), ACC)
        for start in range(0, n_cols + SHIFT, BLOCK):
            dy_offsets, mask = _tile(outer, inner, row_mask, start + cols, n_cols, dy_outer_stride,
                                     dy_inner_stride, dy_col_stride, TILE, SPLIT, WIDE, ALIGN, SHIFT)
            dy = dsl.load(dy_ptr + dy_offsets, mask=mask, other=0.0).to(ACC)
            if LOG:
                lane_total += dy
            else:
                y_offsets, _ = _tile(outer, inner, row_mask, start + cols, n_cols, y_outer_stride,
                                     y_inner_stride, y_col_stride, TILE, SPLIT, WIDE, ALIGN, SHIFT)
                y = dsl.load(y_ptr + y_offsets, mask=mask, other=0.0).to(ACC)
                lane_total += dy * y
        total = _row_sum(lane_total, TILE)
        for start in range(0, n_cols + SHIFT, BLOCK):
            dy_offsets, mask = _tile(outer, inner, row_mask, start + cols, n_cols, dy_outer_stride,
                                     dy_inner_stride, dy_col_stride, TILE, SPLIT, WIDE, ALIGN, SHIFT)
            y_offsets, _ = _tile(outer, inner, row_mask, start + cols, n_cols, y_outer_stride,
                                 y_inner_stride, y_col_stride, TILE, SPLIT, WIDE, ALIGN, SHIFT)
            dx_offsets, _ = _tile(outer, inner, row_mask, start + cols, n_cols, dx_outer_stride,
                                  dx_inner_stride, dx_col_stride, TILE, SPLIT, WIDE, ALIGN, SHIFT)
            dy = dsl.load(dy_ptr + dy_offsets, mask=mask, other=0.0).to(ACC)
            y = dsl.load(y_ptr + y_offsets, mask=mask, other=0.0).to(ACC)
            if LOG:
                dx = dy - dsl.exp(y) * total
            else:
                dx = y * (dy - total)
            dsl.store(dx_ptr + dx_offsets, dx.to(dx_ptr.dtype.element), mask=mask)
