"""Loop-carried 16-bit floats travel in pairs (codegen/control.py `_pairing`): a FOR's neighbouring half /
bfloat registers share one <2 x T> phi, so that ptxas holds a pair in one 32-bit register; an IF merges
16-bit blocks the same way, packed in each branch (test_tensor_core_carries.py: the deferred epilogue that
needs it). CPU tier: the pairing plan, the optimized LLVM IR's phis, ptxas, and the interpreter's results;
GPU tier (`-m cuda`): an IF's 16-bit merge against float64 (the FOR kernels run on the GPU in
test_gpu_semantics.py / the norms' prefetching loops)."""

from __future__ import annotations

import re

import pytest
import torch
from llvmlite import ir

import fusedops.dsl as dsl
from fusedops.dsl.codegen.control import _pairing
from fusedops.dsl.target import assemble, ptxas_available
from fusedops.dsl.target import llvm_types as T

from helpers import assert_close, poison, random_tensor


def _values(*values):
    """Lowered values: a type is a scalar of it, a list of types a block's registers."""
    return [[ir.Constant(t, 0) for t in v] if isinstance(v, list) else ir.Constant(v, 0) for v in values]


HALF, FLOAT = ir.HalfType(), ir.FloatType()


@pytest.mark.parametrize("values, plan", [
    (([HALF, HALF, HALF],), [(0, 2), (2, 1)]),
    ((FLOAT, [HALF, HALF]), [(0, 1), (1, 2)]),
    (([HALF, T.bf16, T.bf16, HALF],), [(0, 1), (1, 2), (3, 1)]),
    (([ir.IntType(16), ir.IntType(16)],), [(0, 1), (1, 1)]),         # only floats pair
    # never across values: a 16-bit scalar or a one-register block before a block keeps the block's pairs
    ((HALF, [HALF, HALF, HALF, HALF]), [(0, 1), (1, 2), (3, 2)]),
    (([HALF], [HALF, HALF], HALF, HALF), [(0, 1), (1, 2), (3, 1), (4, 1)]),
    ((), []),
])
def test_pairing_plan(values, plan):
    assert _pairing(_values(*values)) == plan


@dsl.jit
def _prefetch_rows(y_ptr, x_ptr, n_rows, BLOCK: dsl.constexpr):
    # y[r] = x[r] * 2 + x[r + 1], the next row loaded one iteration ahead (carried in its own dtype)
    cols = dsl.arange(0, BLOCK)
    current = dsl.load(x_ptr + cols)
    for row in range(0, n_rows):
        following = dsl.load(x_ptr + (row + 1) * BLOCK + cols, mask=row + 1 < n_rows, other=0.0)
        dsl.store(y_ptr + row * BLOCK + cols, current * 2.0 + following)
        current = following


@pytest.mark.parametrize("dtype, llvm", [(torch.float16, "half"), (torch.bfloat16, "bfloat")])
def test_carried_16_bit_block_is_carried_in_pairs(dtype, llvm):
    x = torch.empty(64, 256, dtype=dtype)
    compiled = _prefetch_rows.compile(x, x, 64, BLOCK=256, target="sm_90a", num_warps=1)
    phis = re.findall(r"= phi (<2 x \w+>|\w+) ", compiled.asm["llir"])
    assert f"<2 x {llvm}>" in phis and llvm not in phis       # 256 / 32 = 8 registers a thread: 4 pairs
    if ptxas_available():
        assert assemble(compiled.asm["ptx"], "sm_90a").spill_bytes == 0


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("block", [32, 64])
def test_carried_pairs_interpreted_match_float64(dtype, block, seed):
    n_rows = 7
    x = random_tensor((n_rows, block), dtype, seed=seed)
    y = poison(torch.empty_like(x))
    _prefetch_rows[(1,)](y, x, n_rows, block, interpret=True)
    following = torch.cat([x[1:], torch.zeros_like(x[:1])]).double()
    assert_close(y, x.double() * 2 + following, dtype)


@dsl.jit
def _merged_rows(y_ptr, x_ptr, n_rows, BLOCK: dsl.constexpr):
    # y[r] = 3 * x[r] on even rows, x[r] + 1 on odd rows: a 16-bit block merged by an IF (no loop carries it)
    cols = dsl.arange(0, BLOCK)
    row = dsl.program_id(0)
    x = dsl.load(x_ptr + row * BLOCK + cols)
    if row % 2 == 0:
        y = x * 3.0
    else:
        y = x + 1.0
    dsl.store(y_ptr + row * BLOCK + cols, y)


def _merged_reference(x):
    even = torch.arange(x.shape[0], device=x.device)[:, None] % 2 == 0
    return torch.where(even, x.double() * 3, x.double() + 1)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_if_merge_interpreted_match_float64(dtype, seed):
    x = random_tensor((5, 64), dtype, seed=seed)
    y = poison(torch.empty_like(x))
    _merged_rows[(5,)](y, x, 5, 64, interpret=True)
    assert_close(y, _merged_reference(x), dtype)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("block", [64, 1024])
def test_gpu_if_merge_match_float64(dtype, block, seed):
    x = random_tensor((9, block), dtype, seed=seed, device="cuda")
    y = poison(torch.empty_like(x))
    _merged_rows[(9,)](y, x, 9, block, num_warps=4)
    torch.cuda.synchronize()
    assert_close(y, _merged_reference(x), dtype)
