"""Where a flash-attention program lies on its grid: its batch, head and block, in launch order or head by
head.

Shared by the forward kernel (attention_forward_kernels.py) and the backward kernels
(attention_backward_kernels.py); the grids' limits: fusedops/kernels/attention.py's module docstring.
"""

from __future__ import annotations

import fusedops.dsl as dsl


@dsl.jit
def head_major_program():
    """(batch * heads index, block index) of a program on a grid (batch * heads, blocks), taking the
    programs in launch order (axis 0 fastest) head by head: the programs running at once share their
    head's Q / dO stream in L2, instead of each reading another head's (the dK/dV kernel's HEAD_MAJOR)."""
    blocks = dsl.num_programs(1)
    launched = dsl.program_id(1).to(dsl.int64) * dsl.num_programs(0) + dsl.program_id(0)
    return (launched // blocks).to(dsl.int32), (launched % blocks).to(dsl.int32)


@dsl.jit
def query_program(H, GROUP, HEAD_MAJOR: dsl.constexpr):
    """(batch * heads index, batch, head, kv head, query block) of a program on the grid
    (B * H, cdiv(L, BLOCK_M)); batch and heads as int64 offsets. The last query blocks have the most keys
    under a causal mask: they run first (HEAD_MAJOR: the blocks of a head one after the other in launch
    order, `head_major_program`, the last first; else every head's last block first)."""
    if HEAD_MAJOR:
        bh, block = head_major_program()
    else:
        bh = dsl.program_id(0)
        block = dsl.program_id(1)
    pid_m = dsl.num_programs(1) - 1 - block
    b = (bh // H).to(dsl.int64)
    h = bh % H
    kvh = (h // GROUP).to(dsl.int64)
    return bh, b, h.to(dsl.int64), kvh, pid_m


@dsl.jit
def row_tile(H, L, COLS, BLOCK_M: dsl.constexpr, BLOCK_C: dsl.constexpr):
    """(bh, b, h, rows, cols, mask) of a program on the grid (B * H, cdiv(L, BLOCK_M)) over the (L, COLS) rows
    of head bh = b * H + h (b and h as int64 offsets), its block of BLOCK_M rows and BLOCK_C columns and
    their bounds mask."""
    bh = dsl.program_id(0)
    b = (bh // H).to(dsl.int64)
    h = (bh % H).to(dsl.int64)
    rm = dsl.program_id(1) * BLOCK_M + dsl.arange(0, BLOCK_M)
    rc = dsl.arange(0, BLOCK_C)
    return bh, b, h, rm, rc, (rm[:, None] < L) & (rc[None, :] < COLS)
