"""passes/sibling_reductions.py and its lowering (codegen/reduce.py `_reduce_group`): independent
reductions along one axis of one layout share one cross-warp exchange through shared memory.

CPU: which reductions are grouped (and which not: dependent ones, other axes or kinds, operands that
need a load moved), the reordered IR run by the interpreter against the IR without the pass (bit for
bit) and against float64 torch, the barriers saved in the PTX, ptxas accepting it. GPU: the grouped
kernels against float64 torch with ragged rows, poisoned outputs.
"""

from __future__ import annotations

import pytest
import torch

import fusedops.dsl as dsl
from fusedops.dsl.ir import OpCode
from fusedops.dsl.target import assemble, ptxas_available
from codegen_helpers import exchange_groups, interpret_ir, pipelined_ir
from helpers import poison


@dsl.jit
def row_moments_kernel(out_ptr, x_ptr, n_rows, n_cols, BLOCK_ROWS: dsl.constexpr, BLOCK_N: dsl.constexpr):
    # out[row] = (sum(x), sum(x^2 - 1), sum(2 x + 1)) of each row: three independent sums of one layout, the
    # second and third computed after the first reduction in program order (the pass moves them).
    rows = dsl.program_id(0) * BLOCK_ROWS + dsl.arange(0, BLOCK_ROWS)
    cols = dsl.arange(0, BLOCK_N)
    mask = (rows < n_rows)[:, None] & (cols < n_cols)[None, :]
    x = dsl.load(x_ptr + rows[:, None] * n_cols + cols[None, :], mask=mask, other=0.0).to(dsl.float32)
    s1 = dsl.sum(x, axis=1)
    dsl.store(out_ptr + rows * 3, s1, mask=rows < n_rows)
    s2 = dsl.sum(dsl.where(mask, x * x - 1.0, 0.0), axis=1)
    s3 = dsl.sum(dsl.where(mask, 2.0 * x + 1.0, 0.0), axis=1)
    dsl.store(out_ptr + rows * 3 + 1, s2, mask=rows < n_rows)
    dsl.store(out_ptr + rows * 3 + 2, s3, mask=rows < n_rows)


@dsl.jit
def dependent_kernel(out_ptr, x_ptr, n_cols, BLOCK_N: dsl.constexpr):
    # A variance: the second sum needs the first (not grouped).
    cols = dsl.arange(0, BLOCK_N)
    mask = cols < n_cols
    x = dsl.load(x_ptr + dsl.program_id(0) * n_cols + cols, mask=mask, other=0.0).to(dsl.float32)
    mean = dsl.sum(x, axis=0) / n_cols
    d = dsl.where(mask, x - mean, 0.0)
    dsl.store(out_ptr + dsl.program_id(0), dsl.sum(d * d, axis=0))


@dsl.jit
def not_siblings_kernel(out_ptr, x_ptr, y_ptr, n_cols, BLOCK_N: dsl.constexpr):
    # A sum and a max (other kinds), and a sum whose operand is loaded after the first sum (a load does
    # not move): none is grouped.
    cols = dsl.arange(0, BLOCK_N)
    mask = cols < n_cols
    x = dsl.load(x_ptr + dsl.program_id(0) * n_cols + cols, mask=mask, other=0.0)
    a = dsl.sum(x, axis=0)
    b = dsl.max(dsl.where(mask, x, -float("inf")), axis=0)
    y = dsl.load(y_ptr + dsl.program_id(0) * n_cols + cols, mask=mask, other=0.0)
    c = dsl.sum(y * a, axis=0)
    dsl.store(out_ptr + dsl.program_id(0) * 3, a)
    dsl.store(out_ptr + dsl.program_id(0) * 3 + 1, b)
    dsl.store(out_ptr + dsl.program_id(0) * 3 + 2, c)


@pytest.mark.parametrize("n_rows, n_cols, block_rows, block_n, num_warps", [
    (5, 1000, 2, 1024, 4), (1, 1, 1, 128, 4), (7, 300, 4, 512, 8), (3, 2049, 1, 4096, 16)])
def test_grouped_ir_runs_bit_identical_and_right(n_rows, n_cols, block_rows, block_n, num_warps):
    torch.manual_seed(n_rows * 7 + n_cols)
    x = torch.randn(n_rows, n_cols, dtype=torch.float16)
    grid = (-(-n_rows // block_rows), 1)
    outputs = []
    for siblings in (True, False):
        out = poison(torch.empty(n_rows, 3))
        args, kwargs = (out, x, n_rows, n_cols), dict(BLOCK_ROWS=block_rows, BLOCK_N=block_n)
        function = pipelined_ir(row_moments_kernel, args, kwargs, num_warps, siblings)[0]
        assert exchange_groups(function) == ([3] if siblings else [])
        interpret_ir(row_moments_kernel, function, grid, args, kwargs)
        outputs.append(out)
    assert torch.equal(outputs[0], outputs[1])
    xd = x.double()
    expected = torch.stack([xd.sum(1), (xd * xd - 1).sum(1), (2 * xd + 1).sum(1)], dim=1)
    torch.testing.assert_close(outputs[0].double(), expected, rtol=1e-5, atol=1e-3)


def test_grouped_members_follow_the_first_and_keep_their_order():
    x = torch.randn(4, 1000, dtype=torch.float16)
    args, kwargs = (torch.empty(4, 3), x, 4, 1000), dict(BLOCK_ROWS=2, BLOCK_N=1024)
    function = pipelined_ir(row_moments_kernel, args, kwargs, 4)[0]
    ops = function.body.ops
    reduces = [i for i, op in enumerate(ops) if op.opcode == OpCode.REDUCE]
    assert len(reduces) == 3 and reduces == list(range(reduces[0], reduces[0] + 3))
    # The first sum's store stays after the group's operands were computed, and before the others' stores.
    stores = [i for i, op in enumerate(ops) if op.opcode == OpCode.STORE]
    assert stores[0] > reduces[-1] and ops[stores[0]].operands[1] is ops[reduces[0]].result


def test_dependent_other_kind_and_loaded_operands_are_not_grouped():
    x = torch.randn(3, 1000, dtype=torch.float32)
    function = pipelined_ir(dependent_kernel, (torch.empty(3), x, 1000), dict(BLOCK_N=1024), 4)[0]
    assert exchange_groups(function) == []
    args = (torch.empty(3, 3), x, x.clone(), 1000)
    function = pipelined_ir(not_siblings_kernel, args, dict(BLOCK_N=1024), 4)[0]
    assert exchange_groups(function) == []


def test_single_warp_reductions_are_left_alone():
    # Within one warp there is no exchange to share: nothing moves.
    x = torch.randn(4, 64, dtype=torch.float16)
    args, kwargs = (torch.empty(4, 3), x, 4, 64), dict(BLOCK_ROWS=1, BLOCK_N=64)
    assert exchange_groups(pipelined_ir(row_moments_kernel, args, kwargs, 1)[0]) == []


@pytest.mark.skipif(not ptxas_available(), reason="ptxas is not on the PATH")
def test_ptx_one_exchange_for_the_group():
    x = torch.empty(8, 1000, dtype=torch.float16)
    args = (torch.empty(8, 3), x, 8, 1000)
    compiled = row_moments_kernel.compile(*args, BLOCK_ROWS=2, BLOCK_N=1024, num_warps=4, target="sm_90a")
    ptx = compiled.asm["ptx"]
    assert ptx.count("bar.sync") == 2         # three reductions, one exchange (six barriers without the pass)
    result = assemble(ptx, "sm_90a")
    assert result.spill_bytes == 0


@pytest.mark.cuda
@pytest.mark.parametrize("n_rows, n_cols, block_rows, block_n, num_warps", [
    (1, 1, 1, 128, 4), (33, 1000, 2, 1024, 4), (1000, 4097, 1, 8192, 16), (257, 300, 4, 512, 8)])
def test_gpu_grouped_sums(n_rows, n_cols, block_rows, block_n, num_warps):
    torch.manual_seed(n_rows + n_cols)
    x = torch.randn(n_rows, n_cols, device="cuda", dtype=torch.float16)
    out = poison(torch.empty(n_rows, 3, device="cuda"))
    row_moments_kernel[(-(-n_rows // block_rows),)](out, x, n_rows, n_cols, BLOCK_ROWS=block_rows, BLOCK_N=block_n,
                                                    num_warps=num_warps)
    xd = x.double()
    expected = torch.stack([xd.sum(1), (xd * xd - 1).sum(1), (2 * xd + 1).sum(1)], dim=1)
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-3 * (1 + n_cols ** 0.5))
