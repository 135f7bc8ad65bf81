"""A row read in sweeps through an aligned window: the split of the window into masked edges,
unmasked chunks and masked pieces, shared by the softmax and norm row sweeps.

Window positions [first, first + n_cols) hold a row's columns (first > 0 when the row starts off a
16-byte boundary and is read from the boundary below it). A sweep reads the window in three parts:
  edges   [0, GROUP) and [middle, middle + GROUP): one element per thread (EDGE elements), masked per
          element by first <= position < first + n_cols;
  chunks  of BLOCK from GROUP on, as long as they end by `middle`: unmasked whole 16-byte vectors;
  pieces  of PIECE (one vector per thread) from there to `middle`, masked by `position < middle`,
          which is constant over each vector.
GROUP > first (or 0 when first is always 0) and middle = max(GROUP, (first + n_cols) rounded down to
VECTOR) are multiples of VECTOR. (fusedops/kernels/softmax.py's comment above its row sweeps says
more.)
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
