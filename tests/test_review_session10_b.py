"""Review (session 10, part b) of `desc.atomic_add` (cb701e7, a57f609) and the rewritten TMA-store fallback
(bb74520, codegen/tma_store.py `_ElementStores.copy_out`). CPU only: the sm_90a PTX of small kernels.

Confirmed defects are `xfail(strict=True, reason="BUG: ...")`: a fix makes them XPASS (then drop the mark).
What was checked and found fine is in the review report, not tested again here.
"""

from __future__ import annotations

import re

import pytest
import torch

import fusedops.dsl as dsl

_REDUCE = "cp.reduce.async.bulk.tensor.2d.global.shared::cta.add"


@dsl.jit
def _write_then_add_kernel(y_ptr, x_ptr, rows, cols, stride_r, BLOCK_R: dsl.constexpr, BLOCK_C: dsl.constexpr):
    # y[:BLOCK_R, :BLOCK_C] = x, then y[:BLOCK_R, :BLOCK_C] += x through the descriptor: y ends as 2 * x
    tile = dsl.load(x_ptr + dsl.arange(0, BLOCK_R)[:, None] * BLOCK_C + dsl.arange(0, BLOCK_C)[None, :])
    dsl.store(y_ptr + dsl.arange(0, BLOCK_R)[:, None] * stride_r + dsl.arange(0, BLOCK_C)[None, :], tile)
    y = dsl.make_tensor_descriptor(y_ptr, (rows, cols), (stride_r, 1), (BLOCK_R, BLOCK_C))
    y.atomic_add((0, 0), tile)


# Fixed in session 10: the TMA store / bulk reduction fenced only the shared tile (fence.proxy.async.shared::cta)
# before the engine's async-proxy access; earlier st.global of the same elements could be lost.
def test_generic_global_writes_are_fenced_before_the_bulk_reduction(tma_ws0):
    y, x = torch.zeros(1024, 1024), torch.zeros(32, 64)
    ptx = _write_then_add_kernel.compile(y, x, 1024, 1024, 1024, target="sm_90a", BLOCK_R=32,
                                         BLOCK_C=64).asm["ptx"]
    lines = ptx.splitlines()
    reduce = next(i for i, line in enumerate(lines) if _REDUCE in line)
    last_store = max(i for i, line in enumerate(lines[:reduce]) if "st.global" in line)
    between = "\n".join(lines[last_store:reduce])
    assert re.search(r"fence\.proxy\.async(\.global)?\s*;", between), between


def test_several_boxes_of_fewer_than_8_rows_stay_masked_stores(tma_ws0):
    # The 128-byte swizzle spans 8 rows of 128 bytes and the engine takes its phase from the shared address:
    # after a box of 4 rows the next would start mid-pattern (passes/descriptors.py MIN_BOX_ROWS). One box
    # (32 fp32 columns) of any height is fine.
    for rows, columns, expected in ((4, 64, False), (8, 64, True), (4, 32, True), (1, 32, True)):
        y, x = torch.zeros(1024, 1024), torch.zeros(rows, columns)
        ir = dsl.jit(_write_then_add_kernel.fn).compile(y, x, 1024, 1024, 1024, target="sm_90a", BLOCK_R=rows,
                                                        BLOCK_C=columns).asm["ir"]
        assert ("tma_store" in ir) is expected, (rows, columns)
