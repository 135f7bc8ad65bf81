"""The softmax and log-softmax kernels a launch runs: each program's tiles or, persistent, its rows' sweeps.

Every program of _forward_kernel / _backward_kernel takes one tile of rows (softmax_tiles), or,
PERSISTENT, loops over tiles, or over one-row online tiles by the row sweeps (softmax_row_sweeps).
"""

from __future__ import annotations

import fusedops.dsl as dsl
from fusedops.kernels.softmax_row_sweeps import backward_row_sweeps, forward_row_sweeps
from fusedops.kernels.softmax_tiles import backward_tile, forward_tile


@dsl.jit
def _tile_count(n_rows, n_inner, inner_blocks, TILE: dsl.constexpr, ROWS: dsl.constexpr):
    if TILE == "columns":
        return (n_rows // n_inner) * inner_blocks
    return dsl.cdiv(n_rows, ROWS)


@dsl.jit
def _forward_kernel(
    y_ptr, x_ptr,                                   # (outer, n_cols, inner) through the strides below
    n_rows, n_cols, n_inner, inner_blocks,          # n_rows = outer * inner; inner_blocks: "columns" only
    x_outer_stride, x_inner_stride, x_col_stride,   # in elements
    y_outer_stride, y_inner_stride, y_col_stride,
    LOG: dsl.constexpr, TILE: dsl.constexpr, ROWS: dsl.constexpr, BLOCK: dsl.constexpr,
    ONE_PASS: dsl.constexpr, SPLIT: dsl.constexpr, WIDE: dsl.constexpr, ALIGN: dsl.constexpr, ACC: dsl.constexpr,
    SHIFT: dsl.constexpr = 0, PERSISTENT: dsl.constexpr = False, THREADS: dsl.constexpr = 1,
    VECTOR: dsl.constexpr = 1, FIRST_EVICTION: dsl.constexpr = "", SECOND_EVICTION: dsl.constexpr = "",
    STORE_CACHE: dsl.constexpr = "", REVERSE: dsl.constexpr = False, MIN_BLOCKS: dsl.constexpr = 0,
):
    # One tile per program; PERSISTENT: each program loops over tiles pid, pid + programs, ...
    # (one-row multi-chunk "rows" tiles by forward_row_sweeps, THREADS and VECTOR describing the
    # chunk's load layout: see softmax_row_sweeps).
    if MIN_BLOCKS:
        dsl.launch_bounds(MIN_BLOCKS)
    if PERSISTENT:
        if TILE == "rows" and ROWS == 1 and not ONE_PASS:
            for row in range(dsl.program_id(0), n_rows, dsl.num_programs(0)):
                forward_row_sweeps(row, y_ptr, x_ptr, n_cols, n_inner, x_outer_stride, x_inner_stride,
                                   x_col_stride, y_outer_stride, y_inner_stride, y_col_stride, LOG, BLOCK,
                                   SPLIT, WIDE, ALIGN, ACC, SHIFT, THREADS, VECTOR, FIRST_EVICTION,
                                   SECOND_EVICTION, STORE_CACHE, REVERSE)
        else:
            for tile in range(dsl.program_id(0), _tile_count(n_rows, n_inner, inner_blocks, TILE, ROWS),
                              dsl.num_programs(0)):
                forward_tile(tile, y_ptr, x_ptr, n_rows, n_cols, n_inner, inner_blocks, x_outer_stride,
                             x_inner_stride, x_col_stride, y_outer_stride, y_inner_stride, y_col_stride, LOG,
                             TILE, ROWS, BLOCK, ONE_PASS, SPLIT, WIDE, ALIGN, ACC, SHIFT)
    else:
        forward_tile(dsl.program_id(0), y_ptr, x_ptr, n_rows, n_cols, n_inner, inner_blocks, x_outer_stride,
                     x_inner_stride, x_col_stride, y_outer_stride, y_inner_stride, y_col_stride, LOG, TILE, ROWS,
                     BLOCK, ONE_PASS, SPLIT, WIDE, ALIGN, ACC, SHIFT)


@dsl.jit
def _backward_kernel(
    dx_ptr, dy_ptr, y_ptr,                          # (outer, n_cols, inner) through the strides below
    n_rows, n_cols, n_inner, inner_blocks,
    dx_outer_stride, dx_inner_stride, dx_col_stride,
    dy_outer_stride, dy_inner_stride, dy_col_stride,
    y_outer_stride, y_inner_stride, y_col_stride,
    LOG: dsl.constexpr, TILE: dsl.constexpr, ROWS: dsl.constexpr, BLOCK: dsl.constexpr,
    ONE_PASS: dsl.constexpr, SPLIT: dsl.constexpr, WIDE: dsl.constexpr, ALIGN: dsl.constexpr, ACC: dsl.constexpr,
    SHIFT: dsl.constexpr = 0, PERSISTENT: dsl.constexpr = False, THREADS: dsl.constexpr = 1,
    VECTOR: dsl.constexpr = 1, FIRST_EVICTION: dsl.constexpr = "", SECOND_EVICTION: dsl.constexpr = "",
    STORE_CACHE: dsl.constexpr = "", REVERSE: dsl.constexpr = False, MIN_BLOCKS: dsl.constexpr = 0,
):
    # One tile per program, or PERSISTENT (see _forward_kernel).
    if MIN_BLOCKS:
        dsl.launch_bounds(MIN_BLOCKS)
    if PERSISTENT:
        if TILE == "rows" and ROWS == 1 and not ONE_PASS:
            for row in range(dsl.program_id(0), n_rows, dsl.num_programs(0)):
                backward_row_sweeps(row, dx_ptr, dy_ptr, y_ptr, n_cols, n_inner, dx_outer_stride, dx_inner_stride,
                                    dx_col_stride, dy_outer_stride, dy_inner_stride, dy_col_stride, y_outer_stride,
                                    y_inner_stride, y_col_stride, LOG, BLOCK, SPLIT, WIDE, ALIGN, ACC, SHIFT,
                                    THREADS, VECTOR, FIRST_EVICTION, SECOND_EVICTION, STORE_CACHE, REVERSE)
        else:
            for tile in range(dsl.program_id(0), _tile_count(n_rows, n_inner, inner_blocks, TILE, ROWS),
                              dsl.num_programs(0)):
                backward_tile(tile, dx_ptr, dy_ptr, y_ptr, n_rows, n_cols, n_inner, inner_blocks, dx_outer_stride,
                              dx_inner_stride, dx_col_stride, dy_outer_stride, dy_inner_stride, dy_col_stride,
                              y_outer_stride, y_inner_stride, y_col_stride, LOG, TILE, ROWS, BLOCK, ONE_PASS, SPLIT,
                              WIDE, ALIGN, ACC, SHIFT)
    else:
        backward_tile(dsl.program_id(0), dx_ptr, dy_ptr, y_ptr, n_rows, n_cols, n_inner, inner_blocks,
                      dx_outer_stride, dx_inner_stride, dx_col_stride, dy_outer_stride, dy_inner_stride, dy_col_stride,
                      y_outer_stride, y_inner_stride, y_col_stride, LOG, TILE, ROWS, BLOCK, ONE_PASS, SPLIT, WIDE,
                      ALIGN, ACC, SHIFT)
