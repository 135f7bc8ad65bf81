"""Softmax and log-softmax of one long row in two sweeps, forward and backward (persistent configs).

Persistent configs (Config.programs_per_sm > 0): a grid of min(tiles, SMs x programs_per_sm)
programs, each looping over tiles pid, pid + programs, ... A one-row online "rows" tile then takes
the row sweeps (forward_row_sweeps, backward_row_sweeps): the same two sweeps, with the chunks
inside the row moved unmasked as whole 16-byte vectors, per-thread statistics reduced in
registers, and few enough rows in flight that the second sweep reads them from L2, so that DRAM
sees each input once (forward 1 read + 1 write, backward 2 reads + 1 write).
"""

from __future__ import annotations

import fusedops.dsl as dsl
from fusedops.kernels.row_windows import sweep_parts


# -- persistent row sweeps (PERSISTENT with one-row, multi-chunk "rows" tiles) ---------------------
# A row of a tensor is addressed as a window (see softmax_tiles._tile): window positions [first, end) hold its
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
# still in L2, or backwards (REVERSE); eviction hints (softmax_configs.ROW_SWEEPS) keep the first sweep's reads in L2.
@dsl.jit
def _row_start(row, n_inner, outer_stride, inner_stride, SPLIT: dsl.constexpr):
    # -> the int64 offset of row `row`'s column 0 in one tensor.
    row = row.to(dsl.int64)
    if SPLIT:
        outer = row // n_inner
        return outer * outer_stride + (row - outer * n_inner) * inner_stride
    return row * outer_stride


@dsl.jit
def _window_base(ptr, start, first, ALIGN: dsl.constexpr, SHIFT: dsl.constexpr):
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
def forward_row_sweeps(
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
    x_window = _window_base(x_ptr, x_start, first, ALIGN, SHIFT)
    y_window = _window_base(y_ptr, y_start, first, ALIGN, SHIFT)
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
def backward_row_sweeps(
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
    dx_window = _window_base(dx_ptr, dx_start, first, ALIGN, SHIFT)
    dy_window = _window_base(dy_ptr, dy_start, first, ALIGN, SHIFT)
    y_window = _window_base(y_ptr, y_start, first, ALIGN, SHIFT)
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
