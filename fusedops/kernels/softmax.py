"""Softmax and log-softmax along one dimension: DSL kernels (forward and backward) and launchers.

    y = softmax(x)      = exp(x - max(x)) / sum(exp(x - max(x)))
    y = log_softmax(x)  = x - max(x) - log(sum(exp(x - max(x))))
    dx (softmax)        = y * (dy - sum(dy * y))
    dx (log_softmax)    = dy - exp(y) * sum(dy)

Geometry. A tensor reduced over `dim` is addressed as rows: every index of the other dims is one
row of `n` elements. `plan_rows` groups the other dims into at most two (size, stride) groups,
outer and inner, so that row (o, i) of tensor t starts at o * outer_stride[t] + i * inner_stride[t]
and its k-th element sits k * col_stride[t] further: strided inputs need no copy as long as the
other dims collapse to two groups (they always do for contiguous tensors, transposes and
permutations of them; a tensor that does not is copied, see `plan_rows`). Offsets are int64.

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
Persistent configs (Config.programs_per_sm > 0): a grid of min(tiles, SMs x programs_per_sm)
programs, each looping over tiles pid, pid + programs, ... A one-row online "rows" tile then takes
the row sweeps (_forward_row_sweeps, _backward_row_sweeps): the same two sweeps, with the chunks
inside the row moved unmasked as whole 16-byte vectors, per-thread statistics reduced in
registers, and few enough rows in flight that the second sweep reads them from L2, so that DRAM
sees each input once (forward 1 read + 1 write, backward 2 reads + 1 write).

Configs (`choose_config`, a small table): BLOCK is the next power of two >= n; the forward reads
rows of up to MAX_ONE_PASS_BLOCK 2-byte elements in one pass, the backward (two tensors in
registers), fp32 rows and column tiles up to MAX_ONE_PASS_TILE; num_warps by block from
ROW_NUM_WARPS; longer 2-byte rows take the persistent row sweeps of ROW_SWEEPS, longer fp32 rows
the online path. The limits are what ptxas fits in registers without spilling
(tests/test_softmax.py::test_shipped_configs_assemble_without_spills checks every config);
`bench/softmax.py --sweep` and .scratch/sm_long_sweep.py time the alternatives on a GPU.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Optional, Sequence

import torch

import fusedops.dsl as dsl
from fusedops.dsl.runtime.bounded_cache import BoundedCache
from fusedops.dsl.runtime.knobs import interpret_enabled as _interpret_enabled
from fusedops.kernels.allocation import contiguous_allocator
from fusedops.kernels.device_info import INTERPRETER_SMS, sm_count as device_sm_count
from fusedops.kernels.row_windows import sweep_parts

# Longest row the forward reads in one pass (elements); longer rows take the row sweeps (ROW_SWEEPS).
# H200, M=8192 fp16, N=32768: one pass (32 warps, 1 CTA per SM) 0.335-0.345 ms (session 4), the row
# sweeps 0.274 ms (94% of a 0.258 ms copy of the same bytes; .scratch/sm_long_sweep.py, session 5).
MAX_ONE_PASS_BLOCK = 16384
# Largest one-pass tile of the backward (dy and y in registers) and of column tiles.
MAX_ONE_PASS_TILE = 16384
# Chunk of a row per step of the online path: 2048 columns at 4 warps (16 per thread) let 8 programs
# share an SM, which kept the most bytes in flight (H200, M=8192, N=50257 fp16: forward 0.87 ms against
# 1.38 ms with 8192-column chunks at 16 warps; N=65536: 0.86 ms against 0.88 ms).
ONLINE_BLOCK = 2048
# num_warps of a one-row tile by its block: 8 to 32 elements per thread, i.e. one to four 16-byte
# fp16 loads in flight, and at most 64 registers at 32 warps (what 1024 threads may use).
# 8192: 8 warps (48 registers, 5 CTAs per SM) read at 108.8% of the copy against 100.3% at 16 warps
# (H200, M=8192 fp16; the backward is at 100% either way).
ROW_NUM_WARPS = {1024: 4, 2048: 4, 4096: 8, 8192: 8, 16384: 16, 32768: 32}
# Rows shorter than MIN_ROW_BLOCK are packed several per program, ROW_TILE_ELEMENTS elements in all.
MIN_ROW_BLOCK = 1024
ROW_TILE_ELEMENTS = 2048
# Column tiles: neighbouring rows per tile (8: 16 bytes of fp16, 64 when there are that many), and
# the tile's size in the online path.
COLUMN_ROWS = (8, 64)
COLUMN_TILE_ELEMENTS = 4096
# Rows of 2-byte elements past the one-pass limit, by direction: None, the online path (one program
# per row, ONLINE_BLOCK); or ((largest row block, (block, num_warps, programs_per_sm, sweep_hints,
# reverse, min_blocks_per_sm)), ...) in increasing order (None: any longer row), the persistent row
# sweeps, whose rows in flight (resident programs x row bytes x tensors read) stay in L2 between the
# two sweeps: the first sweep's loads evict_last, the second's evict_first, and streaming (.cs) stores
# keep them there. programs_per_sm = 64 leaves the grid at one program per row for M <= 64 x SMs:
# residency then bounds the rows in flight, and min_blocks_per_sm (dsl.launch_bounds) holds ptxas to
# the registers of that residency. H200, M=8192 fp16, % of a device copy / vs torch
# (.scratch/sm_long_sweep.py, session 5; session 4's configs without hints in brackets):
#   forward  32768: (16384, 16, 64, lb 2) 94.2%, 1.65x [79.0%]; 50257: (16384, 16, 2, lb 2) 91.8%, 1.45x
#            [72.6%]; 65536: 89.5%, 1.67x [75.1%];
#   backward 32768: (16384, 32, 1) 100.7%, 2.21x [80.9%]; 50257: 1.76x [1.71x]; 65536: 94.8%, 2.16x [1.66x].
L2_HINTS = ("evict_last", "evict_first", ".cs")
ROW_SWEEPS = {
    "forward": ((32768, (16384, 16, 64, L2_HINTS, False, 2)), (None, (16384, 16, 2, L2_HINTS, False, 2))),
    "backward": ((None, (16384, 32, 1, L2_HINTS, False, 0)),),
}


# ------------------------------------------------------------------------------------------------
# Kernels
# ------------------------------------------------------------------------------------------------
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
def _forward_tile(
    tile, y_ptr, x_ptr, n_rows, n_cols, n_inner, inner_blocks,
    x_outer_stride, x_inner_stride, x_col_stride, y_outer_stride, y_inner_stride, y_col_stride,
    LOG: dsl.constexpr, TILE: dsl.constexpr, ROWS: dsl.constexpr, BLOCK: dsl.constexpr,
    ONE_PASS: dsl.constexpr, SPLIT: dsl.constexpr, WIDE: dsl.constexpr, ALIGN: dsl.constexpr, ACC: dsl.constexpr,
    SHIFT: dsl.constexpr,
):
    # The forward of one tile (see _forward_kernel).
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
def _backward_tile(
    tile, dx_ptr, dy_ptr, y_ptr, n_rows, n_cols, n_inner, inner_blocks,
    dx_outer_stride, dx_inner_stride, dx_col_stride,
    dy_outer_stride, dy_inner_stride, dy_col_stride,
    y_outer_stride, y_inner_stride, y_col_stride,
    LOG: dsl.constexpr, TILE: dsl.constexpr, ROWS: dsl.constexpr, BLOCK: dsl.constexpr,
    ONE_PASS: dsl.constexpr, SPLIT: dsl.constexpr, WIDE: dsl.constexpr, ALIGN: dsl.constexpr, ACC: dsl.constexpr,
    SHIFT: dsl.constexpr,
):
    # The backward of one tile (see _backward_kernel).
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


# -- persistent row sweeps (PERSISTENT with one-row, multi-chunk "rows" tiles) ---------------------
# A row of a tensor is addressed as a window (see _tile): window positions [first, end) hold its
# columns 0 .. n_cols - 1 (first = 0 unless SHIFT). A sweep reads the window in three parts:
#   edges   [0, GROUP) and [middle, middle + GROUP): one element per thread (EDGE = max(THREADS,
#           2 GROUP) elements), masked per element;
#   chunks  of BLOCK from GROUP on, as long as they end by `middle`: unmasked, so they move as
#           whole 16-byte vectors, with no per-element predicates or addresses;
#   pieces  of PIECE = THREADS * VECTOR (one vector per thread) from there to `middle`, masked by
#           `positions < middle` alone, which is constant over each vector: one predicated vector
#           access each.
# GROUP = max(SHIFT, VECTOR) > first (0 when there is no SHIFT: first = 0, so the row's head needs no
# edge and chunks start at its column 0) and middle = max(GROUP, end rounded down to VECTOR) are
# multiples of VECTOR, so the masked parts stay light in registers.
# Per-thread statistics: a chunk viewed as [BLOCK // PIECE, THREADS, VECTOR] (a piece as
# [1, THREADS, VECTOR], the edges as [EDGE // THREADS, THREADS, 1]) matches its load layout (a
# thread's vector along axis 2, threads along axis 1, a thread's further vectors along axis 0):
# reducing axes 0 and 2 stays in each thread's registers and every part gives statistics in one
# layout, [1, THREADS, 1]; the CTA reduces across threads once per row (no barrier per chunk).
# The second sweep goes in the first one's order (least recently read first), while the row is
# still in L2, or backwards (REVERSE); eviction hints (ROW_SWEEPS) keep the first sweep's reads in L2.
@dsl.jit
def _row_start(row, n_inner, outer_stride, inner_stride, SPLIT: dsl.constexpr):
    # -> the int64 offset of row `row`'s column 0 in one tensor.
    row = row.to(dsl.int64)
    if SPLIT:
        outer = row // n_inner
        return outer * outer_stride + (row - outer * n_inner) * inner_stride
    return row * outer_stride


@dsl.jit
def _row_window(ptr, start, first, ALIGN: dsl.constexpr, SHIFT: dsl.constexpr):
    # -> the pointer to window position 0 of the row whose column 0 is at `ptr + start`.
    if SHIFT:
        return ptr + dsl.multiple_of(start - first, SHIFT)
    return ptr + dsl.multiple_of(start, ALIGN)


@dsl.jit
def _window_pointers(window, positions, col_stride, WIDE: dsl.constexpr):
    if WIDE:
        return window + positions.to(dsl.int64) * col_stride
    return window + positions * col_stride


@dsl.jit
def _load_window(window, positions, col_stride, mask, OTHER: dsl.constexpr, MASKED: dsl.constexpr,
                 WIDE: dsl.constexpr, ACC: dsl.constexpr, EVICTION: dsl.constexpr = ""):
    # -> the elements at window `positions`, in ACC (OTHER where MASKED and not `mask`).
    pointers = _window_pointers(window, positions, col_stride, WIDE)
    if MASKED:
        return dsl.load(pointers, mask=mask, other=OTHER, eviction_policy=EVICTION).to(ACC)
    return dsl.load(pointers, eviction_policy=EVICTION).to(ACC)


@dsl.jit
def _store_window(window, positions, col_stride, mask, value, MASKED: dsl.constexpr, WIDE: dsl.constexpr,
                  CACHE: dsl.constexpr = ""):
    pointers = _window_pointers(window, positions, col_stride, WIDE)
    if MASKED:
        dsl.store(pointers, value.to(window.dtype.element), mask=mask, cache_modifier=CACHE)
    else:
        dsl.store(pointers, value.to(window.dtype.element), cache_modifier=CACHE)


@dsl.jit
def _add_statistics(x, running_max, running_sum, THREADS: dsl.constexpr, VECTOR: dsl.constexpr):
    # -> each thread's (max, sum of exp(x - max)) over its elements so far and those of x, a chunk,
    # piece or the edges (-inf where masked): one exp per element, two per thread.
    x = dsl.reshape(x, (x.shape[0] // (THREADS * VECTOR), THREADS, VECTOR))
    new_max = dsl.maximum(running_max, dsl.max(dsl.max(x, axis=2, keep_dims=True), axis=0, keep_dims=True))
    # Shift by 0 while a thread has seen only -inf (exp(-inf - (-inf)) is NaN).
    shift = dsl.where(new_max == -float("inf"), 0.0, new_max)
    terms = dsl.sum(dsl.sum(dsl.exp(x - shift), axis=2, keep_dims=True), axis=0, keep_dims=True)
    return new_max, running_sum * dsl.exp(running_max - shift) + terms


@dsl.jit
def _forward_outputs(y_window, x_window, at, mask, x_col_stride, y_col_stride, row_max, scale, LOG: dsl.constexpr,
                     MASKED: dsl.constexpr, WIDE: dsl.constexpr, ACC: dsl.constexpr, EVICTION: dsl.constexpr,
                     CACHE: dsl.constexpr):
    # Writes y at window positions `at`: scale is 1 / sum (softmax) or log(sum) (log_softmax).
    x = _load_window(x_window, at, x_col_stride, mask, -float("inf"), MASKED, WIDE, ACC, EVICTION)
    if LOG:
        y = (x - row_max) - scale      # x - max is exact; adding log(sum) to the max first would round
    else:
        y = dsl.exp(x - row_max) * scale
    _store_window(y_window, at, y_col_stride, mask, y, MASKED, WIDE, CACHE)


@dsl.jit
def _forward_row_sweeps(
    row, y_ptr, x_ptr, n_cols, n_inner,
    x_outer_stride, x_inner_stride, x_col_stride, y_outer_stride, y_inner_stride, y_col_stride,
    LOG: dsl.constexpr, BLOCK: dsl.constexpr, SPLIT: dsl.constexpr, WIDE: dsl.constexpr, ALIGN: dsl.constexpr,
    ACC: dsl.constexpr, SHIFT: dsl.constexpr, THREADS: dsl.constexpr, VECTOR: dsl.constexpr,
    FIRST_EVICTION: dsl.constexpr, SECOND_EVICTION: dsl.constexpr, STORE_CACHE: dsl.constexpr,
    REVERSE: dsl.constexpr,
):
    # The forward of one row in two sweeps (see above): statistics, then outputs. FIRST_EVICTION /
    # SECOND_EVICTION: the eviction_policy of x's loads in each sweep; STORE_CACHE: y's cache_modifier;
    # REVERSE: the second sweep walks the row backwards (the last parts read, likeliest still cached, first).
    x_start = _row_start(row, n_inner, x_outer_stride, x_inner_stride, SPLIT)
    y_start = _row_start(row, n_inner, y_outer_stride, y_inner_stride, SPLIT)
    first = (x_start % SHIFT).to(dsl.int32) if SHIFT else 0     # SHIFT: every tensor's rows start alike
    x_window = _row_window(x_ptr, x_start, first, ALIGN, SHIFT)
    y_window = _row_window(y_ptr, y_start, first, ALIGN, SHIFT)
    PIECE: dsl.constexpr = THREADS * VECTOR
    GROUP: dsl.constexpr = (SHIFT if SHIFT > VECTOR else VECTOR) if SHIFT else 0
    EDGE: dsl.constexpr = THREADS if THREADS > 2 * GROUP else 2 * GROUP
    edges, edge_mask, middle, chunks, tail, pieces = sweep_parts(n_cols, first, BLOCK, PIECE, GROUP, VECTOR, EDGE)
    piece = dsl.arange(0, PIECE)
    chunk = dsl.arange(0, BLOCK)
    x = _load_window(x_window, edges, x_col_stride, edge_mask, -float("inf"), True, WIDE, ACC, FIRST_EVICTION)
    thread_max, thread_sum = _add_statistics(x, dsl.full((1, THREADS, 1), -float("inf"), ACC),
                                             dsl.zeros((1, THREADS, 1), ACC), THREADS, 1)
    for index in range(0, chunks):
        x_chunk = _load_window(x_window, GROUP + index * BLOCK + chunk, x_col_stride, None, 0.0, False, WIDE, ACC,
                               FIRST_EVICTION)
        thread_max, thread_sum = _add_statistics(x_chunk, thread_max, thread_sum, THREADS, VECTOR)
    for index in range(0, pieces):
        at = tail + index * PIECE + piece
        x_piece = _load_window(x_window, at, x_col_stride, at < middle, -float("inf"), True, WIDE, ACC,
                               FIRST_EVICTION)
        thread_max, thread_sum = _add_statistics(x_piece, thread_max, thread_sum, THREADS, VECTOR)
    thread_max = dsl.reshape(thread_max, (THREADS,))
    row_max = dsl.max(thread_max, axis=0)
    # A row of only -inf: shift by 0; its outputs are NaN, like torch's.
    shift = dsl.where(row_max == -float("inf"), 0.0, row_max)
    total = dsl.sum(dsl.reshape(thread_sum, (THREADS,)) * dsl.exp(thread_max - shift), axis=0)
    scale = dsl.log(total) if LOG else 1.0 / total
    if REVERSE:
        for step in range(0, pieces):
            at = tail + (pieces - 1 - step) * PIECE + piece
            _forward_outputs(y_window, x_window, at, at < middle, x_col_stride, y_col_stride, row_max, scale, LOG,
                             True, WIDE, ACC, SECOND_EVICTION, STORE_CACHE)
        for step in range(0, chunks):
            _forward_outputs(y_window, x_window, GROUP + (chunks - 1 - step) * BLOCK + chunk, None, x_col_stride,
                             y_col_stride, row_max, scale, LOG, False, WIDE, ACC, SECOND_EVICTION, STORE_CACHE)
    _forward_outputs(y_window, x_window, edges, edge_mask, x_col_stride, y_col_stride, row_max, scale, LOG, True,
                     WIDE, ACC, SECOND_EVICTION, STORE_CACHE)
    if not REVERSE:
        for index in range(0, chunks):
            _forward_outputs(y_window, x_window, GROUP + index * BLOCK + chunk, None, x_col_stride, y_col_stride,
                             row_max, scale, LOG, False, WIDE, ACC, SECOND_EVICTION, STORE_CACHE)
        for index in range(0, pieces):
            at = tail + index * PIECE + piece
            _forward_outputs(y_window, x_window, at, at < middle, x_col_stride, y_col_stride, row_max, scale, LOG,
                             True, WIDE, ACC, SECOND_EVICTION, STORE_CACHE)


@dsl.jit
def _backward_partial(dy_window, y_window, at, mask, dy_col_stride, y_col_stride, LOG: dsl.constexpr,
                      MASKED: dsl.constexpr, WIDE: dsl.constexpr, ACC: dsl.constexpr, THREADS: dsl.constexpr,
                      VECTOR: dsl.constexpr, EVICTION: dsl.constexpr):
    # -> each thread's sum of dy (LOG) or dy * y at window positions `at`, [1, THREADS, 1].
    terms = _load_window(dy_window, at, dy_col_stride, mask, 0.0, MASKED, WIDE, ACC, EVICTION)
    if not LOG:
        terms = terms * _load_window(y_window, at, y_col_stride, mask, 0.0, MASKED, WIDE, ACC, EVICTION)
    terms = dsl.reshape(terms, (terms.shape[0] // (THREADS * VECTOR), THREADS, VECTOR))
    return dsl.sum(dsl.sum(terms, axis=2, keep_dims=True), axis=0, keep_dims=True)


@dsl.jit
def _backward_outputs(dx_window, dy_window, y_window, at, mask, dx_col_stride, dy_col_stride, y_col_stride, total,
                      LOG: dsl.constexpr, MASKED: dsl.constexpr, WIDE: dsl.constexpr, ACC: dsl.constexpr,
                      EVICTION: dsl.constexpr, CACHE: dsl.constexpr):
    # Writes dx at window positions `at`, given the row's sum(dy * y) (sum(dy), LOG).
    dy = _load_window(dy_window, at, dy_col_stride, mask, 0.0, MASKED, WIDE, ACC, EVICTION)
    y = _load_window(y_window, at, y_col_stride, mask, 0.0, MASKED, WIDE, ACC, EVICTION)
    dx = dy - dsl.exp(y) * total if LOG else y * (dy - total)
    _store_window(dx_window, at, dx_col_stride, mask, dx, MASKED, WIDE, CACHE)


@dsl.jit
def _backward_row_sweeps(
    row, dx_ptr, dy_ptr, y_ptr, n_cols, n_inner,
    dx_outer_stride, dx_inner_stride, dx_col_stride,
    dy_outer_stride, dy_inner_stride, dy_col_stride,
    y_outer_stride, y_inner_stride, y_col_stride,
    LOG: dsl.constexpr, BLOCK: dsl.constexpr, SPLIT: dsl.constexpr, WIDE: dsl.constexpr, ALIGN: dsl.constexpr,
    ACC: dsl.constexpr, SHIFT: dsl.constexpr, THREADS: dsl.constexpr, VECTOR: dsl.constexpr,
    FIRST_EVICTION: dsl.constexpr, SECOND_EVICTION: dsl.constexpr, STORE_CACHE: dsl.constexpr,
    REVERSE: dsl.constexpr,
):
    # The backward of one row in two sweeps (see above): the row's sum, then dx (hints and REVERSE as in
    # the forward).
    dx_start = _row_start(row, n_inner, dx_outer_stride, dx_inner_stride, SPLIT)
    dy_start = _row_start(row, n_inner, dy_outer_stride, dy_inner_stride, SPLIT)
    y_start = _row_start(row, n_inner, y_outer_stride, y_inner_stride, SPLIT)
    first = (y_start % SHIFT).to(dsl.int32) if SHIFT else 0
    dx_window = _row_window(dx_ptr, dx_start, first, ALIGN, SHIFT)
    dy_window = _row_window(dy_ptr, dy_start, first, ALIGN, SHIFT)
    y_window = _row_window(y_ptr, y_start, first, ALIGN, SHIFT)
    PIECE: dsl.constexpr = THREADS * VECTOR
    GROUP: dsl.constexpr = (SHIFT if SHIFT > VECTOR else VECTOR) if SHIFT else 0
    EDGE: dsl.constexpr = THREADS if THREADS > 2 * GROUP else 2 * GROUP
    edges, edge_mask, middle, chunks, tail, pieces = sweep_parts(n_cols, first, BLOCK, PIECE, GROUP, VECTOR, EDGE)
    piece = dsl.arange(0, PIECE)
    chunk = dsl.arange(0, BLOCK)
    thread_total = _backward_partial(dy_window, y_window, edges, edge_mask, dy_col_stride, y_col_stride, LOG, True,
                                     WIDE, ACC, THREADS, 1, FIRST_EVICTION)
    for index in range(0, chunks):
        thread_total += _backward_partial(dy_window, y_window, GROUP + index * BLOCK + chunk, None, dy_col_stride,
                                          y_col_stride, LOG, False, WIDE, ACC, THREADS, VECTOR, FIRST_EVICTION)
    for index in range(0, pieces):
        at = tail + index * PIECE + piece
        thread_total += _backward_partial(dy_window, y_window, at, at < middle, dy_col_stride, y_col_stride, LOG,
                                          True, WIDE, ACC, THREADS, VECTOR, FIRST_EVICTION)
    total = dsl.sum(dsl.reshape(thread_total, (THREADS,)), axis=0)
    if REVERSE:
        for step in range(0, pieces):
            at = tail + (pieces - 1 - step) * PIECE + piece
            _backward_outputs(dx_window, dy_window, y_window, at, at < middle, dx_col_stride, dy_col_stride,
                              y_col_stride, total, LOG, True, WIDE, ACC, SECOND_EVICTION, STORE_CACHE)
        for step in range(0, chunks):
            _backward_outputs(dx_window, dy_window, y_window, GROUP + (chunks - 1 - step) * BLOCK + chunk, None,
                              dx_col_stride, dy_col_stride, y_col_stride, total, LOG, False, WIDE, ACC,
                              SECOND_EVICTION, STORE_CACHE)
    _backward_outputs(dx_window, dy_window, y_window, edges, edge_mask, dx_col_stride, dy_col_stride, y_col_stride,
                      total, LOG, True, WIDE, ACC, SECOND_EVICTION, STORE_CACHE)
    if not REVERSE:
        for index in range(0, chunks):
            _backward_outputs(dx_window, dy_window, y_window, GROUP + index * BLOCK + chunk, None, dx_col_stride,
                              dy_col_stride, y_col_stride, total, LOG, False, WIDE, ACC, SECOND_EVICTION, STORE_CACHE)
        for index in range(0, pieces):
            at = tail + index * PIECE + piece
            _backward_outputs(dx_window, dy_window, y_window, at, at < middle, dx_col_stride, dy_col_stride,
                              y_col_stride, total, LOG, True, WIDE, ACC, SECOND_EVICTION, STORE_CACHE)


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
    # (one-row multi-chunk "rows" tiles by _forward_row_sweeps, THREADS and VECTOR describing the
    # chunk's load layout: see above).
    if MIN_BLOCKS:
        dsl.launch_bounds(MIN_BLOCKS)
    if PERSISTENT:
        if TILE == "rows" and ROWS == 1 and not ONE_PASS:
            for row in range(dsl.program_id(0), n_rows, dsl.num_programs(0)):
                _forward_row_sweeps(row, y_ptr, x_ptr, n_cols, n_inner, x_outer_stride, x_inner_stride,
                                    x_col_stride, y_outer_stride, y_inner_stride, y_col_stride, LOG, BLOCK,
                                    SPLIT, WIDE, ALIGN, ACC, SHIFT, THREADS, VECTOR, FIRST_EVICTION,
                                    SECOND_EVICTION, STORE_CACHE, REVERSE)
        else:
            for tile in range(dsl.program_id(0), _tile_count(n_rows, n_inner, inner_blocks, TILE, ROWS),
                              dsl.num_programs(0)):
                _forward_tile(tile, y_ptr, x_ptr, n_rows, n_cols, n_inner, inner_blocks, x_outer_stride,
                              x_inner_stride, x_col_stride, y_outer_stride, y_inner_stride, y_col_stride, LOG,
                              TILE, ROWS, BLOCK, ONE_PASS, SPLIT, WIDE, ALIGN, ACC, SHIFT)
    else:
        _forward_tile(dsl.program_id(0), y_ptr, x_ptr, n_rows, n_cols, n_inner, inner_blocks, x_outer_stride,
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
                _backward_row_sweeps(row, dx_ptr, dy_ptr, y_ptr, n_cols, n_inner, dx_outer_stride, dx_inner_stride,
                                     dx_col_stride, dy_outer_stride, dy_inner_stride, dy_col_stride, y_outer_stride,
                                     y_inner_stride, y_col_stride, LOG, BLOCK, SPLIT, WIDE, ALIGN, ACC, SHIFT,
                                     THREADS, VECTOR, FIRST_EVICTION, SECOND_EVICTION, STORE_CACHE, REVERSE)
        else:
            for tile in range(dsl.program_id(0), _tile_count(n_rows, n_inner, inner_blocks, TILE, ROWS),
                              dsl.num_programs(0)):
                _backward_tile(tile, dx_ptr, dy_ptr, y_ptr, n_rows, n_cols, n_inner, inner_blocks, dx_outer_stride,
                               dx_inner_stride, dx_col_stride, dy_outer_stride, dy_inner_stride, dy_col_stride,
                               y_outer_stride, y_inner_stride, y_col_stride, LOG, TILE, ROWS, BLOCK, ONE_PASS, SPLIT,
                               WIDE, ALIGN, ACC, SHIFT)
    else:
        _backward_tile(dsl.program_id(0), dx_ptr, dy_ptr, y_ptr, n_rows, n_cols, n_inner, inner_blocks,
                       dx_outer_stride, dx_inner_stride, dx_col_stride, dy_outer_stride, dy_inner_stride, dy_col_stride,
                       y_outer_stride, y_inner_stride, y_col_stride, LOG, TILE, ROWS, BLOCK, ONE_PASS, SPLIT, WIDE,
                       ALIGN, ACC, SHIFT)


# ------------------------------------------------------------------------------------------------
# Geometry: rows of a reduction over one dim
# ------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class RowLayout:
    """The rows of a reduction over one dim, shared by every tensor of one launch.

    Row (o, i), o < outer, i < inner, of tensor t starts at element offset
    o * strides[t][0] + i * strides[t][1]; its k-th element (k < n_cols) is k * strides[t][2] further.
    """

    outer: int
    n_cols: int
    inner: int
    strides: tuple      # per tensor: (outer_stride, inner_stride, col_stride), in elements

    @property
    def n_rows(self) -> int:
        return self.outer * self.inner


def _contiguous_strides(shape: Sequence[int]) -> tuple:
    """torch's strides for a contiguous tensor of `shape` (a dim of size 0 or 1 counts as 1)."""
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def _dim_order(shape: Sequence[int], strides: Sequence[int]) -> list:
    """The dims from the slowest to the fastest in memory (ties keep the dims' order)."""
    return sorted(range(len(shape)), key=lambda d: (-strides[d], d))


def plan_rows(shape: Sequence[int], dim: int, strides: Sequence[Sequence[int]]) -> Optional[RowLayout]:
    """Address the rows of a reduction of tensors of `shape` over `dim` through their strides.

    strides: one stride tuple per tensor; the first one's memory order decides how the other dims
        are grouped. Dims are merged where every tensor allows it (stride_a == size_b * stride_b).
    Returns None when the other dims do not collapse to two groups in every tensor (e.g. a
    slice of a slice in two different dims): the caller then copies to contiguous tensors.
    """
    n_cols = shape[dim]
    col_strides = tuple(s[dim] if n_cols > 1 else 1 for s in strides)
    dims = [d for d in _dim_order(shape, strides[0]) if d != dim and shape[d] > 1]
    groups = []     # [size, strides per tensor], slowest first
    for d in dims:
        if groups and all(g == shape[d] * s[d] for g, s in zip(groups[-1][1], strides)):
            groups[-1] = [groups[-1][0] * shape[d], tuple(s[d] for s in strides)]
        else:
            groups.append([shape[d], tuple(s[d] for s in strides)])
    if len(groups) > 2:
        return None
    zeros = (0,) * len(strides)
    if not groups:
        outer, inner = (1, zeros), (1, zeros)
    elif len(groups) == 1:
        size, group_strides = groups[0]
        is_inner = col_strides[0] != 1 and group_strides[0] == 1
        outer, inner = ((1, zeros), (size, group_strides)) if is_inner else ((size, group_strides), (1, zeros))
    else:
        outer, inner = groups
    per_tensor = tuple((o, i, c) for o, i, c in zip(outer[1], inner[1], col_strides))
    return RowLayout(outer[0], n_cols, inner[0], per_tensor)


def empty_in_order_of(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """An uninitialized dense tensor shaped like `x` whose dims lie in memory in `x`'s order, so
    that it groups into rows exactly as `x` does (what empty_like does for dense `x`, extended
    to sliced ones); contiguous for an expanded `x` (a dim of stride 0), as torch's results are:
    there `x`'s order would make the output strided along the expanded dims."""
    if x.is_contiguous() or any(stride == 0 and size > 1 for size, stride in zip(x.shape, x.stride())):
        # empty_like keeps a contiguous x's strides (those of its size-1 dims included, which no
        # row plan reads); it costs half of torch.empty(shape, ...) on the host.
        return torch.empty_like(x) if dtype == x.dtype else torch.empty_like(x, dtype=dtype)
    order = _dim_order(x.shape, x.stride())
    dense = torch.empty([x.shape[d] for d in order], dtype=dtype, device=x.device)
    inverse = [order.index(d) for d in range(x.dim())]
    return dense.permute(inverse)


# ------------------------------------------------------------------------------------------------
# Configs
# ------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Config:
    """How one launch tiles the rows: the kernels' TILE, ROWS, BLOCK, ONE_PASS, PERSISTENT and num_warps.

    programs_per_sm: 0, one program per tile; else a persistent grid of min(tiles, SMs x
    programs_per_sm) programs, each looping over tiles (PERSISTENT). A persistent online "rows"
    tile of one row takes the row sweeps of _forward_row_sweeps / _backward_row_sweeps: with few
    programs in flight their rows stay in L2 between the two sweeps, so DRAM sees one read of each
    input (forward: 1 read + 1 write; backward: 2 reads + 1 write).
    """

    tile: str           # "rows" [rows, block] or "columns" [block, rows]
    rows: int           # rows per program (power of two)
    block: int          # columns per tile (power of two): the whole row when one_pass
    one_pass: bool
    num_warps: int
    programs_per_sm: int = 0
    # Row sweeps: (eviction_policy of the first sweep's loads, of the second's, cache_modifier of the
    # stores), or () for none.
    sweep_hints: tuple = ()
    reverse: bool = False       # row sweeps: the second sweep walks the row backwards
    min_blocks_per_sm: int = 0  # row sweeps: dsl.launch_bounds (registers capped for this many CTAs per SM)


def _next_power_of_2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _column_warps(elements: int) -> int:
    # Not 8: at 8 warps ptxas caps the axis-0 reductions' cross-warp step at 64 registers and
    # spills (fp16 forward); 4 and 16 warps assemble without spills.
    return 4 if elements <= 2048 else 16


def uses_column_tiles(layout: RowLayout) -> bool:
    """True when the first tensor's reduced dim is strided but its rows are contiguous neighbours."""
    _, inner_stride, col_stride = layout.strides[0]
    return layout.inner > 1 and inner_stride == 1 and col_stride != 1


def choose_config(layout: RowLayout, *, backward: bool = False, element_bytes: int = 2,
                  max_one_pass_block: Optional[int] = None) -> Config:
    """The config for `layout` (see the module docstring).

    backward: the backward kernel holds two tensors per element, so its one-pass limit is lower.
    element_bytes: the input's element size; MAX_ONE_PASS_BLOCK is for 2-byte inputs (a 32768
        fp32 log_softmax row spills at 32 warps).
    max_one_pass_block: overrides every one-pass limit (a power of two; tests use it to reach the
        online path with small tensors).
    """
    block = _next_power_of_2(layout.n_cols)
    tile_limit = MAX_ONE_PASS_TILE if max_one_pass_block is None else max_one_pass_block
    if uses_column_tiles(layout):
        rows = COLUMN_ROWS[-1] if layout.inner >= COLUMN_ROWS[-1] else COLUMN_ROWS[0]
        if rows * block > tile_limit and COLUMN_ROWS[0] * block <= tile_limit:
            rows = COLUMN_ROWS[0]
        if rows * block <= tile_limit:
            return Config("columns", rows, block, True, _column_warps(rows * block))
        block = max(1, min(COLUMN_TILE_ELEMENTS, tile_limit) // rows)
        return Config("columns", rows, block, False, _column_warps(rows * block))
    row_limit = tile_limit if backward or element_bytes > 2 or max_one_pass_block is not None else MAX_ONE_PASS_BLOCK
    if block > row_limit:
        sweeps = ROW_SWEEPS["backward" if backward else "forward"]
        if sweeps is not None and element_bytes == 2 and max_one_pass_block is None:
            chunk, *options = next(choice for largest, choice in sweeps if largest is None or block <= largest)
            return Config("rows", 1, chunk, False, *options)
        block = min(ONLINE_BLOCK, row_limit)
        return Config("rows", 1, block, False, ROW_NUM_WARPS.get(block, 4))
    if block < MIN_ROW_BLOCK:
        return Config("rows", ROW_TILE_ELEMENTS // block, block, True, ROW_NUM_WARPS[MIN_ROW_BLOCK])
    return Config("rows", 1, block, True, ROW_NUM_WARPS[block])


def shipped_configs() -> list:
    """Every Config the dispatcher picks with the default limits, over row lengths 1 ... 2^20 in
    row and column tiles: sorted (direction, config, element sizes) triples, direction being
    "forward" or "backward" and element sizes the input element sizes (2, 4) it is picked for.
    The ahead-of-time PTX check compiles this set."""
    picked: dict = {}
    for n_cols in [1 << k for k in range(21)]:
        for inner in (1, 2, 4, 8, 16, 32, 64, 128):
            layout = plan_rows((4, n_cols, inner), 1, ((n_cols * inner, inner, 1),))
            for backward in (False, True):
                for element_bytes in (2, 4):
                    config = choose_config(layout, backward=backward, element_bytes=element_bytes)
                    key = ("backward" if backward else "forward", config)
                    picked.setdefault(key, set()).add(element_bytes)
    return sorted(((direction, config, tuple(sorted(sizes))) for (direction, config), sizes in picked.items()),
                  key=lambda entry: (entry[0], dataclasses.astuple(entry[1])))


# ------------------------------------------------------------------------------------------------
# Launchers
# ------------------------------------------------------------------------------------------------
_INT32_LIMIT = 2**31


@dataclasses.dataclass(frozen=True)
class _Launch:
    """Everything a launch derives from shapes, strides and dtypes. Cached, so that a launch's
    host work is one dictionary lookup."""

    layout: RowLayout
    config: Config
    grid: tuple
    arguments: tuple        # n_rows, n_cols, n_inner, inner_blocks, then the strides in kernel order
    constexprs: dict        # the kernel's constexprs and num_warps


def _run_alignment(layout: RowLayout, config: Config) -> int:
    """The largest power of two up to 16 dividing where every contiguous run of a tile starts:
    row starts for "rows"; for "columns", outer and col strides and the run's first inner index,
    a multiple of `rows`."""
    def divisor(stride: int) -> int:
        return 16 if stride == 0 else min(16, stride & -stride)

    starts = [s[0] for s in layout.strides]
    if config.tile == "columns":
        starts += [s[2] for s in layout.strides] + [config.rows]
    elif layout.inner > 1:
        starts += [s[1] for s in layout.strides]
    return min(divisor(abs(stride)) for stride in starts)


def _row_shift(layout: RowLayout, config: Config, dtypes: tuple, align: int) -> int:
    """The SHIFT of the kernels (see `_tile`): the elements of a 16-byte vector of the narrowest
    dtype when rows start off vector boundaries (align below it) and the shifted window applies
    ("rows" tiles, no inner dim, unit column strides, one row stride for every tensor, and a
    one-pass block that still covers the shifted row); else 0."""
    vector = 16 // min(dtype.itemsize for dtype in dtypes)
    if align >= vector or config.tile != "rows" or layout.inner > 1:
        return 0
    if any(s[2] != 1 or s[0] != layout.strides[0][0] for s in layout.strides):
        return 0
    if config.one_pass and config.block < layout.n_cols + vector - 1:
        return 0
    return vector


def _persistent_constexprs(config: Config, dtypes: tuple) -> dict:
    """PERSISTENT, and the chunk's load layout the row sweeps reduce along (THREADS threads of VECTOR
    consecutive elements; see _forward_row_sweeps): what the default 1-D blocked layout gives a
    block of config.block elements of the narrowest dtype over config.num_warps warps."""
    if not config.programs_per_sm:
        return {}
    vector = max(1, min(16 // min(dtype.itemsize for dtype in dtypes), config.block // (32 * config.num_warps)))
    vector = min(vector, config.block)
    hints = dict(zip(("FIRST_EVICTION", "SECOND_EVICTION", "STORE_CACHE"), config.sweep_hints))
    if config.reverse:
        hints["REVERSE"] = True
    if config.min_blocks_per_sm:
        hints["MIN_BLOCKS"] = config.min_blocks_per_sm
    return dict(PERSISTENT=True, THREADS=min(32 * config.num_warps, config.block // vector), VECTOR=vector, **hints)


@functools.lru_cache(maxsize=1024)
def _plan_launch(shape: tuple, dim: int, strides: tuple, dtypes: tuple, backward: bool, log: bool,
                 config: Optional[Config], max_one_pass_block: Optional[int], device: Optional[torch.device] = None,
                 sm_count: Optional[int] = None) -> Optional[_Launch]:
    # strides, dtypes: (x, y) for the forward, (y, dy, dx) for the backward (the first tensor's
    # memory order groups the rows); the kernels take strides in (x, y) and (dx, dy, y) order.
    # Persistent configs size their grid by sm_count, else by the SMs of `device` (asked only then),
    # else by device_info.INTERPRETER_SMS.
    layout = plan_rows(shape, dim, strides)
    if layout is None:
        return None
    if config is None:
        config = choose_config(layout, backward=backward, element_bytes=dtypes[0].itemsize,
                               max_one_pass_block=max_one_pass_block)
    if config.tile != "columns":
        inner_blocks = 1
        grid = (dsl.cdiv(layout.n_rows, config.rows),)
    else:
        inner_blocks = dsl.cdiv(layout.inner, config.rows)
        grid = (layout.outer * inner_blocks,)
    if config.programs_per_sm:
        if sm_count is None:
            sm_count = INTERPRETER_SMS if device is None else device_sm_count(device)
        grid = (max(1, min(grid[0], sm_count * config.programs_per_sm)),)
    # WIDE: column offsets (up to n_cols + block, times the col stride) may pass int32.
    widest = max(abs(s[2]) for s in layout.strides) * (layout.n_cols + config.block + 16)
    accumulate = dsl.float64 if torch.float64 in dtypes else dsl.float32
    align = _run_alignment(layout, config)
    constexprs = dict(LOG=log, TILE=config.tile, ROWS=config.rows, BLOCK=config.block, ONE_PASS=config.one_pass,
                      SPLIT=layout.inner > 1, WIDE=widest >= _INT32_LIMIT, ALIGN=align, ACC=accumulate,
                      SHIFT=_row_shift(layout, config, dtypes, align), num_warps=config.num_warps,
                      **_persistent_constexprs(config, dtypes))
    kernel_order = layout.strides[::-1] if backward else layout.strides
    arguments = (layout.n_rows, layout.n_cols, layout.inner, inner_blocks,
                 *[stride for per_tensor in kernel_order for stride in per_tensor])
    return _Launch(layout, config, grid, arguments, constexprs)


# Launches prepared (JITFunction.prepare) per everything a launch derives from its tensors but their
# addresses: shapes, strides, dtypes, devices, options and the interpreter flag; a cached launch costs
# the output's allocation, this key and the launch itself. Forward: a SoftmaxLaunches per key (it keeps
# the autograd backward's launches too); backward: softmax_backward's launches.
_FORWARD_LAUNCHES = BoundedCache(1024)
_BACKWARD_LAUNCHES = BoundedCache(1024)


def _no_launch(*tensors) -> None:
    return None


def _dense_allocator(x: torch.Tensor, dtype: torch.dtype) -> Callable:
    """`new(x)`: empty_in_order_of(x, dtype) for tensors laid out like x, at the least host cost."""
    if not x.is_contiguous():
        return lambda x: empty_in_order_of(x, dtype)
    if dtype == x.dtype:
        return torch.empty_like
    if x.numel() == 0:
        return lambda x: torch.empty_like(x, dtype=dtype)
    new = contiguous_allocator(tuple(x.shape), dtype, x.device)
    return lambda x: new()


def _prepare_forward(x: torch.Tensor, y: torch.Tensor, dim: int, log: bool, config: Optional[Config],
                     max_one_pass_block: Optional[int]) -> Callable:
    """`launch(y, x)` for tensors shaped, strided and typed like these, on their device; it returns
    None, or the output when it had to copy x (other dims that do not collapse, see plan_rows)."""
    if y.numel() == 0:
        return _no_launch
    options = ((x.dtype, y.dtype), False, log, config, max_one_pass_block, x.device)
    launch = _plan_launch(x.shape, dim, (x.stride(), y.stride()), *options)
    if launch is None:
        def copy_and_launch(y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
            x = x.contiguous()
            y = torch.empty(x.shape, dtype=y.dtype, device=x.device)
            plan = _plan_launch(x.shape, dim, (x.stride(), y.stride()), *options)
            _forward_kernel[plan.grid](y, x, *plan.arguments, **plan.constexprs)
            return y
        return copy_and_launch
    return _forward_kernel.prepare(launch.grid, y, x, *launch.arguments, **launch.constexprs)


class SoftmaxLaunches:
    """The launches of one softmax layout (x's shape, strides, dtype and device, dim, log, the output
    dtype, options, the interpreter flag):

    forward(x) -> y: softmax_forward(x, dim, log=log, dtype=the output dtype) for an x of this layout.
    backward(dy, y) -> dx: softmax_backward(dy, y, dim, log=log, dtype=x's dtype) for the y of such a
        forward, with launches prepared per layout of dy and y (in that forward's mode: GPU or
        interpreter) and kept here, so that the autograd Function's backward skips softmax_backward's key.
    """

    __slots__ = ("_launch", "_new_output", "_permuted", "_strides", "_dim", "_log", "_dtype", "_backward")

    def __init__(self, x: torch.Tensor, dim: int, log: bool, out_dtype: torch.dtype, config: Optional[Config],
                 max_one_pass_block: Optional[int]):
        self._new_output = _dense_allocator(x, out_dtype)
        y = self._new_output(x)
        self._launch = _prepare_forward(x, y, dim, log, config, max_one_pass_block)
        # the kernels write y in x's dim order (coalesced like x's reads); torch returns a contiguous
        # tensor, so a permuted x's result is copied to one (torch copies x to a contiguous one first: the
        # same traffic); and with torch's strides, which a contiguous tensor's size-1 (or empty) dims may
        # not have (a view of the same memory then)
        self._permuted = not y.is_contiguous()
        standard = _contiguous_strides(tuple(y.shape))
        self._strides = standard if (y.contiguous() if self._permuted else y).stride() != standard else None
        self._dim, self._log, self._dtype = dim, log, x.dtype
        self._backward = BoundedCache(16)

    @property
    def dim(self) -> int:
        return self._dim

    @property
    def log(self) -> bool:
        return self._log

    @property
    def input_dtype(self) -> torch.dtype:
        """x's dtype (dx's)."""
        return self._dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self._new_output(x)
        copied = self._launch(y, x)
        if copied is not None:
            return copied
        if self._permuted:
            y = y.contiguous()
        return y if self._strides is None else y.as_strided(y.shape, self._strides)

    def backward(self, dy: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        # y's strides too: the output of a copied x, or a saved-tensor hook (torch.autograd.graph.save_on_cpu),
        # may lay y out otherwise than the planned output
        key = (dy.stride(), dy.dtype, y.stride())
        launch = self._backward.get(key)
        if launch is None:
            launch = self._backward.put(key, _backward_launcher(dy, y, self._dim, self._log, self._dtype, None, None))
        return launch(dy, y)


def softmax_forward(x: torch.Tensor, dim: int, *, log: bool, dtype: Optional[torch.dtype] = None,
                    config: Optional[Config] = None, max_one_pass_block: Optional[int] = None) -> torch.Tensor:
    """softmax (log=False) or log_softmax (log=True) of `x` over `dim`, by the DSL kernels.

    x: a float16/bfloat16/float32 tensor on a CUDA device (any float dtype, CPU tensors too, when
        FUSEDOPS_INTERPRET=1), of rank >= 1, any strides; dim in [0, x.dim()).
    dtype: the output dtype (default x.dtype); statistics are float32 (float64 for float64).
    config: use this Config instead of `choose_config`'s (benchmark sweeps).
    max_one_pass_block: override the one-pass limits (tests use it to reach the online path).
    Returns a new contiguous tensor shaped like `x` (as torch's softmax).
    """
    return softmax_launches(x, dim, log=log, dtype=dtype, config=config,
                            max_one_pass_block=max_one_pass_block).forward(x)


def softmax_launches(x: torch.Tensor, dim: int, *, log: bool, dtype: Optional[torch.dtype] = None,
                     config: Optional[Config] = None, max_one_pass_block: Optional[int] = None) -> SoftmaxLaunches:
    """The SoftmaxLaunches of tensors like x (arguments as for softmax_forward), made once per layout."""
    out_dtype = dtype or x.dtype
    key = (x.shape, x.stride(), x.dtype, out_dtype, x.get_device(), dim, log, config, max_one_pass_block,
           _interpret_enabled())
    launches = _FORWARD_LAUNCHES.get(key)
    if launches is None:
        launches = _FORWARD_LAUNCHES.put(key, SoftmaxLaunches(x, dim, log, out_dtype, config, max_one_pass_block))
    return launches


def _prepare_backward(dy: torch.Tensor, y: torch.Tensor, dx: torch.Tensor, dim: int, log: bool,
                      config: Optional[Config], max_one_pass_block: Optional[int]) -> Callable:
    """`launch(dx, dy, y)` for tensors like these (see _prepare_forward)."""
    if dx.numel() == 0:
        return _no_launch
    options = ((y.dtype, dy.dtype, dx.dtype), True, log, config, max_one_pass_block, y.device)
    launch = _plan_launch(y.shape, dim, (y.stride(), dy.stride(), dx.stride()), *options)
    if launch is None:
        def copy_and_launch(dx: torch.Tensor, dy: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            dy, y = dy.contiguous(), y.contiguous()
            dx = torch.empty(y.shape, dtype=dx.dtype, device=y.device)
            plan = _plan_launch(y.shape, dim, (y.stride(), dy.stride(), dx.stride()), *options)
            _backward_kernel[plan.grid](dx, dy, y, *plan.arguments, **plan.constexprs)
            return dx
        return copy_and_launch
    return _backward_kernel.prepare(launch.grid, dx, dy, y, *launch.arguments, **launch.constexprs)


def _backward_launcher(dy: torch.Tensor, y: torch.Tensor, dim: int, log: bool, dtype: torch.dtype,
                       config: Optional[Config], max_one_pass_block: Optional[int]) -> Callable:
    """`launch(dy, y) -> dx` (dx in `dtype`) for tensors like these (see softmax_backward)."""
    new_gradient = _dense_allocator(y, dtype)
    launch = _prepare_backward(dy, y, new_gradient(y), dim, log, config, max_one_pass_block)

    def gradient(dy: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        dx = new_gradient(y)
        copied = launch(dx, dy, y)
        return dx if copied is None else copied

    return gradient


def softmax_backward(dy: torch.Tensor, y: torch.Tensor, dim: int, *, log: bool, dtype: Optional[torch.dtype] = None,
                     config: Optional[Config] = None, max_one_pass_block: Optional[int] = None) -> torch.Tensor:
    """The gradient of softmax (log=False) or log_softmax (log=True) with respect to its input.

    dy: the gradient of the output; y: the output (same shape; any strides, e.g. an expanded
    dy); dim in [0, y.dim()); dtype: dx's dtype (default y.dtype; the input's dtype when the
    forward cast it up); config, max_one_pass_block: as for `softmax_forward`.
    Returns dx, dense, with its dims in y's memory order.
    """
    dx_dtype = dtype or y.dtype
    key = (y.shape, y.stride(), dy.stride(), y.dtype, dy.dtype, dx_dtype, y.get_device(), dy.get_device(), dim, log,
           config, max_one_pass_block, _interpret_enabled())
    launch = _BACKWARD_LAUNCHES.get(key)
    if launch is None:
        launch = _BACKWARD_LAUNCHES.put(key, _backward_launcher(dy, y, dim, log, dx_dtype, config, max_one_pass_block))
    return launch(dy, y)
