"""Rows read through 16-byte-aligned windows: the split of a swept window into masked edges, unmasked
chunks and masked pieces (`sweep_parts`, shared by the softmax and norm row sweeps), the offsets of a
tile of rows in their windows (`window_offsets`, the norm kernels' whole-row tiles), and the geometry of the
split window's rows and edge lanes (`split_window`: the staged forward and the backward's clusters).

Window positions [first, first + n_cols) hold a row's columns (first > 0 when the row starts off a
16-byte boundary and is read from the boundary below it). A sweep reads the window in three parts:
  edges   [0, GROUP) and [middle, middle + GROUP): one element per thread (EDGE elements), masked per
          element by first <= position < first + n_cols;
  chunks  of BLOCK from GROUP on, as long as they end by `middle`: unmasked whole 16-byte vectors;
  pieces  of PIECE (one vector per thread) from there to `middle`, masked by `position < middle`,
          which is constant over each vector.
GROUP > first (or 0 when first is always 0) and middle = max(GROUP, (first + n_cols) rounded down to
VECTOR) are multiples of VECTOR. (fusedops/kernels/softmax_row_sweeps.py's comment above its row
sweeps says more.)
"""

from __future__ import annotations

import fusedops.dsl as dsl


@dsl.jit
def sweep_parts(n_cols, first, BLOCK: dsl.constexpr, PIECE: dsl.constexpr, GROUP: dsl.constexpr,
                VECTOR: dsl.constexpr, EDGE: dsl.constexpr):
    # -> (edge positions, edge mask, middle, chunks, pieces' start, pieces) of a row (see above).
    end = first + n_cols
    middle = dsl.maximum(end // VECTOR * VECTOR, GROUP)
    lanes = dsl.arange(0, EDGE)
    edges = dsl.where(lanes < GROUP, lanes, middle - GROUP + lanes)     # lanes >= 2 GROUP: past `end`
    chunks = (middle - GROUP) // BLOCK
    tail = GROUP + chunks * BLOCK
    return edges, (edges >= first) & (edges < end), middle, chunks, tail, (middle - tail + PIECE - 1) // PIECE


@dsl.jit
def split_window(rows, n_cols, row_stride, SHIFT: dsl.constexpr):
    # -> (start, first, middle, edges, edge_columns, edge_in_row) of the rows `rows` ((R,) int32, unit column
    # stride) read through the split window (norm_split_window.py's docstring): the element where each row's
    # window starts (int64, a multiple of SHIFT), the row's first position in it and the end of its whole
    # 16-byte vectors (middle, a multiple of SHIFT), all (R,); and the 2 * SHIFT edge lanes [0, SHIFT) and
    # [middle, middle + SHIFT) ((R, 2 * SHIFT) positions), the row's columns there and whether each is one.
    base = rows.to(dsl.int64) * row_stride
    first = (base % SHIFT).to(dsl.int32)
    middle = dsl.maximum((first + n_cols) // SHIFT * SHIFT, SHIFT)
    lanes = dsl.arange(0, 2 * SHIFT)[None, :]
    edges = dsl.where(lanes < SHIFT, lanes, middle[:, None] - SHIFT + lanes)
    columns = edges - first[:, None]
    return (dsl.multiple_of(base - first, SHIFT), first, middle, edges, columns,
            (columns >= 0) & (columns < n_cols))


@dsl.jit
def window_offsets(rows, cols, n_cols, row_stride, col_stride, ALIGN: dsl.constexpr, SHIFT: dsl.constexpr):
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
