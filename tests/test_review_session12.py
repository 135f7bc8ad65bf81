"""Review of passes/sibling_reductions.py and its lowering (codegen/reduce.py `_reduce_group`), CPU only.

For each kernel: the pipelined IR with the pass against the pipelined IR without it (the pass filtered out
of `default_pipeline` by name), run by the interpreter and compared bit for bit (NaN where NaN); the IR
verifies; the groups are well formed (members contiguous, first carries `exchange_group` = size, followers
`exchange_follower`, one kind / axis / operand type / layout, crosses warps, no member reaches another
through its operand); and for a few, the PTX assembles for sm_90a and sm_80 with fewer barriers and no new
spills.

The two defects found, fixed the same session (the pass bounds a group by MAX_GROUP_SCRATCH_BYTES and
MAX_GROUP_LOADS; `_check_groups` checks the bounds; the tests assert the fix):
- The group's scratch (members x numel x warp groups x bytes) is not bounded: a kernel whose ungrouped
  exchanges fit in shared memory gets a grouped one past the H100/H200 limit (232448 bytes), and the launch
  fails (seen on an H200: LaunchError "needs 262144 bytes ... allows at most 232448").
- Register pressure: four int8->int32 column sums of a (128, 64) tile on 8 warps assemble with 3.6 KB of
  spills grouped and none ungrouped (ptxas 13.0, sm_90a).
(Both regressions were confirmed against an H200 by running the grouped and ungrouped kernels: every grouped
kernel that launched gave results bit-identical to the ungrouped one.)
"""

from __future__ import annotations

import pytest
import torch

import fusedops.dsl as dsl
from fusedops.dsl.codegen.kernel import lower_to_llvm
from fusedops.dsl.codegen.tma_store import MAX_SHARED_BYTES
from fusedops.dsl.ir import OpCode
from fusedops.dsl.ir.printer import print_function
from fusedops.dsl.layouts.reduction import reduction_plan
from fusedops.dsl.passes.sibling_reductions import (MAX_GROUP, MAX_GROUP_LOADS, MAX_GROUP_SCRATCH_BYTES, MAX_MOVED,
                                                    _exchange_cost, group_sibling_reductions)
from fusedops.dsl.target import assemble, ptxas_available
from fusedops.dsl.target.ptx import Target, compile_to_ptx

from codegen_helpers import exchange_groups, interpret_ir, pipelined_ir

needs_ptxas = pytest.mark.skipif(not ptxas_available(), reason="ptxas is not on the PATH")


# -- kernels ----------------------------------------------------------------------------------------------

@dsl.jit
def four_kernel(out_ptr, x_ptr, y_ptr, n_rows, n_cols, R: dsl.constexpr, N: dsl.constexpr, AXIS: dsl.constexpr,
                KIND: dsl.constexpr):
    # Four reductions of one kind over a 2-D tile (several result elements per thread along axis 0).
    rows = dsl.arange(0, R)
    cols = dsl.arange(0, N)
    mask = (rows < n_rows)[:, None] & (cols < n_cols)[None, :]
    offs = rows[:, None] * n_cols + cols[None, :]
    x = dsl.load(x_ptr + offs, mask=mask, other=0)
    y = dsl.load(y_ptr + offs, mask=mask, other=0)
    if KIND == 0:
        a = dsl.sum(x, axis=AXIS)
        b = dsl.sum(y, axis=AXIS)
        c = dsl.sum(x * y, axis=AXIS)
        d = dsl.sum(x - y, axis=AXIS)
    elif KIND == 1:
        a = dsl.max(x, axis=AXIS)
        b = dsl.max(y, axis=AXIS)
        c = dsl.max(x * y, axis=AXIS)
        d = dsl.max(x - y, axis=AXIS)
    else:
        a = dsl.min(x, axis=AXIS)
        b = dsl.min(y, axis=AXIS)
        c = dsl.min(x * y, axis=AXIS)
        d = dsl.min(x - y, axis=AXIS)
    if AXIS == 0:
        o = cols
        L = N
    else:
        o = rows
        L = R
    dsl.store(out_ptr + o, a)
    dsl.store(out_ptr + L + o, b)
    dsl.store(out_ptr + 2 * L + o, c)
    dsl.store(out_ptr + 3 * L + o, d)


@dsl.jit
def colsums_kernel(out_ptr, x_ptr, g_ptr, n_rows, n_cols, R: dsl.constexpr, N: dsl.constexpr, M: dsl.constexpr):
    # dweight / dbias-like column sums (2 to 4 of them), each stored before the next is computed.
    rows = dsl.arange(0, R)
    cols = dsl.arange(0, N)
    mask = (rows < n_rows)[:, None] & (cols < n_cols)[None, :]
    offs = rows[:, None] * n_cols + cols[None, :]
    x = dsl.load(x_ptr + offs, mask=mask, other=0)
    g = dsl.load(g_ptr + offs, mask=mask, other=0)
    dsl.store(out_ptr + cols, dsl.sum(x * g, axis=0), mask=cols < n_cols)
    dsl.store(out_ptr + N + cols, dsl.sum(g, axis=0), mask=cols < n_cols)
    if M > 2:
        dsl.store(out_ptr + 2 * N + cols, dsl.sum(x, axis=0), mask=cols < n_cols)
    if M > 3:
        dsl.store(out_ptr + 3 * N + cols, dsl.sum(x * x, axis=0), mask=cols < n_cols)


@dsl.jit
def loop_kernel(out_ptr, x_ptr, n_iter, N: dsl.constexpr):
    # In a loop body, operands from loop-carried values; a dependent sum, a store and a barrier between.
    cols = dsl.arange(0, N)
    acc = dsl.load(x_ptr + cols)
    t = dsl.zeros((N,), dsl.float32)
    for i in range(n_iter):
        a = dsl.sum(acc, axis=0)
        dsl.store(out_ptr + i * 4, a)
        b = dsl.sum(acc * acc - a * 0.0, axis=0)     # depends on a: not grouped with it
        c = dsl.sum(acc * 0.5 + 1.0, axis=0)
        dsl.barrier()
        d = dsl.sum(dsl.where(acc > 0.0, acc, t), axis=0)
        dsl.store(out_ptr + i * 4 + 1, b)
        dsl.store(out_ptr + i * 4 + 2, c)
        dsl.store(out_ptr + i * 4 + 3, d)
        t = t + acc
        acc = acc * 0.75 + c * 0.001


@dsl.jit
def if_kernel(out_ptr, x_ptr, flag, N: dsl.constexpr):
    # max / min pairs in both branches of an if (NaN in x: the NaN handling must not change).
    cols = dsl.arange(0, N)
    x = dsl.load(x_ptr + cols)
    if flag > 0:
        a = dsl.max(x, axis=0)
        y = dsl.exp(x)
        b = dsl.max(y, axis=0)
        dsl.store(out_ptr, a)
        dsl.store(out_ptr + 1, b)
    else:
        a = dsl.min(x, axis=0)
        dsl.store(out_ptr, a)
        b = dsl.min(x * 2.0, axis=0)
        dsl.store(out_ptr + 1, b)


@dsl.jit
def three_d_kernel(out_ptr, x_ptr, A: dsl.constexpr, B: dsl.constexpr, C: dsl.constexpr, AXIS: dsl.constexpr):
    # 3-D operands, keep_dims and not (different result shapes, one operand type).
    a = dsl.arange(0, A)[:, None, None]
    b = dsl.arange(0, B)[None, :, None]
    c = dsl.arange(0, C)[None, None, :]
    x = dsl.load(x_ptr + a * (B * C) + b * C + c)
    s1 = dsl.sum(x, axis=AXIS, keep_dims=True)
    s2 = dsl.sum(x * x, axis=AXIS, keep_dims=False)
    s3 = dsl.sum(x + 1.0, axis=AXIS, keep_dims=True)
    if AXIS == 0:
        o1 = b * C + c
        o2 = dsl.arange(0, B)[:, None] * C + dsl.arange(0, C)[None, :]
        L = B * C
    else:
        o1 = a * C + c
        o2 = dsl.arange(0, A)[:, None] * C + dsl.arange(0, C)[None, :]
        L = A * C
    dsl.store(out_ptr + o1, s1)
    dsl.store(out_ptr + L + o2, s2)
    dsl.store(out_ptr + 2 * L + o1, s3)


@dsl.jit
def many_kernel(out_ptr, x_ptr, N: dsl.constexpr):
    # Six independent sums: a group of MAX_GROUP and one of the rest.
    cols = dsl.arange(0, N)
    x = dsl.load(x_ptr + cols)
    dsl.store(out_ptr + 0, dsl.sum(x, axis=0))
    dsl.store(out_ptr + 1, dsl.sum(x * 2.0, axis=0))
    dsl.store(out_ptr + 2, dsl.sum(x * 3.0, axis=0))
    dsl.store(out_ptr + 3, dsl.sum(x * 4.0, axis=0))
    dsl.store(out_ptr + 4, dsl.sum(x * 5.0, axis=0))
    dsl.store(out_ptr + 5, dsl.sum(x * 6.0, axis=0))


@dsl.jit
def chain_kernel(out_ptr, x_ptr, N: dsl.constexpr, STEPS: dsl.constexpr):
    # The second sum's operand takes 2 * STEPS elementwise ops (and two constants) after the first sum.
    cols = dsl.arange(0, N)
    x = dsl.load(x_ptr + cols)
    a = dsl.sum(x, axis=0)
    dsl.store(out_ptr, a)
    y = x
    for i in dsl.static_range(STEPS):
        y = y * 0.5 + 0.25
    dsl.store(out_ptr + 1, dsl.sum(y, axis=0))


@dsl.jit
def arg_scan_kernel(out_ptr, idx_ptr, x_ptr, N: dsl.constexpr):
    # argmax / argmin / cumsum between max reductions: only the two independent maxes group.
    cols = dsl.arange(0, N)
    x = dsl.load(x_ptr + cols)
    m = dsl.max(x, axis=0)
    i = dsl.argmax(x, axis=0)
    c = dsl.cumsum(x, axis=0)
    j = dsl.argmin(x, axis=0)
    m2 = dsl.max(c, axis=0)
    m3 = dsl.max(x * 2.0, axis=0)
    dsl.store(out_ptr, m)
    dsl.store(out_ptr + 1, m2)
    dsl.store(out_ptr + 2, m3)
    dsl.store(idx_ptr, i)
    dsl.store(idx_ptr + 1, j)
    dsl.store(out_ptr + 3 + cols, c)


@dsl.jit
def memory_kernel(out_ptr, tmp_ptr, x_ptr, N: dsl.constexpr):
    # Operands behind a store-barrier-load and an atomic (stay put), one pure one (moves past them).
    cols = dsl.arange(0, N)
    x = dsl.load(x_ptr + cols)
    a = dsl.sum(x, axis=0)
    dsl.store(tmp_ptr + cols, x * a)
    dsl.barrier()
    y = dsl.load(tmp_ptr + N - 1 - cols)
    b = dsl.sum(y, axis=0)
    old = dsl.atomic_add(tmp_ptr + cols, x)
    c = dsl.sum(old, axis=0)
    d = dsl.sum(x * 3.0, axis=0)
    dsl.store(out_ptr, a)
    dsl.store(out_ptr + 1, b)
    dsl.store(out_ptr + 2, c)
    dsl.store(out_ptr + 3, d)


@dsl.jit
def shared_operand_kernel(out_ptr, y_ptr, x_ptr, N: dsl.constexpr):
    # The joining sum's operand (x * x) also feeds a store before it and an op after it.
    cols = dsl.arange(0, N)
    x = dsl.load(x_ptr + cols)
    a = dsl.sum(x, axis=0)
    xx = x * x
    dsl.store(y_ptr + cols, xx)
    dsl.store(out_ptr, a)
    b = dsl.sum(xx, axis=0)
    dsl.store(out_ptr + 1, b)
    dsl.store(y_ptr + N + cols, xx + b)


@dsl.jit
def indirect_dependency_kernel(out_ptr, x_ptr, N: dsl.constexpr):
    # s3's operand reaches s1 through ops that sit between the group's members before the moves.
    cols = dsl.arange(0, N)
    x = dsl.load(x_ptr + cols)
    s1 = dsl.sum(x, axis=0)
    y = x * s1
    s2 = dsl.sum(x + 1.0, axis=0)
    z = y + 1.0
    s3 = dsl.sum(z, axis=0)
    dsl.store(out_ptr, s1)
    dsl.store(out_ptr + 1, s2)
    dsl.store(out_ptr + 2, s3)


@dsl.jit
def dot_loop_kernel(out_ptr, a_ptr, b_ptr, K, M: dsl.constexpr, N: dsl.constexpr, BK: dsl.constexpr):
    # Column sums of the A tile inside a (pipelined) matmul loop.
    rm = dsl.arange(0, M)
    rn = dsl.arange(0, N)
    rk = dsl.arange(0, BK)
    acc = dsl.zeros((M, N), dsl.float32)
    s = dsl.zeros((BK,), dsl.float32)
    q = dsl.zeros((BK,), dsl.float32)
    for k in range(0, K, BK):
        a = dsl.load(a_ptr + rm[:, None] * K + (k + rk)[None, :])
        b = dsl.load(b_ptr + (k + rk)[:, None] * N + rn[None, :])
        acc = dsl.dot(a, b, acc)
        s += dsl.sum(a.to(dsl.float32), axis=0)
        q += dsl.sum(a.to(dsl.float32) * 2.0, axis=0)
    dsl.store(out_ptr + rm[:, None] * N + rn[None, :], acc)
    dsl.store(out_ptr + M * N + rk, s)
    dsl.store(out_ptr + M * N + BK + rk, q)


@dsl.jit
def while_kernel(out_ptr, x_ptr, limit, N: dsl.constexpr):
    # A pair in a while body (the carried x feeds both; the second uses the induction value).
    cols = dsl.arange(0, N)
    x = dsl.load(x_ptr + cols)
    total = 0.0
    i = 0
    while total < limit:
        a = dsl.sum(x, axis=0)
        dsl.store(out_ptr + 2 * i, a)
        b = dsl.sum(dsl.abs(x) + i, axis=0)
        dsl.store(out_ptr + 2 * i + 1, b)
        total += b
        x = x * 1.5
        i += 1


@dsl.jit
def uint_kernel(out_ptr, x_ptr, N: dsl.constexpr):
    # uint32 max and min pairs (unsigned compares).
    cols = dsl.arange(0, N)
    x = dsl.load(x_ptr + cols)
    dsl.store(out_ptr, dsl.max(x, axis=0))
    b = dsl.max(x ^ 0x80000000, axis=0)
    c = dsl.min(x, axis=0)
    d = dsl.min(x >> 1, axis=0)
    dsl.store(out_ptr + 1, b)
    dsl.store(out_ptr + 2, c)
    dsl.store(out_ptr + 3, d)


@dsl.jit
def multi_result_loop_kernel(out_ptr, x_ptr, n, N: dsl.constexpr):
    # A two-result loop between sums: the sum of one of its results stays, the pure one moves before it.
    cols = dsl.arange(0, N)
    x = dsl.load(x_ptr + cols)
    s1 = dsl.sum(x, axis=0)
    u = x
    v = x * 0.0
    for i in range(n):
        u = u * 0.5
        v = v + u
    s2 = dsl.sum(v, axis=0)
    s3 = dsl.sum(x * 2.0, axis=0)
    dsl.store(out_ptr, s1)
    dsl.store(out_ptr + 1, s2)
    dsl.store(out_ptr + 2, s3)


# -- helpers ----------------------------------------------------------------------------------------------

def _reaches(value, targets, seen=None) -> bool:
    """Whether `value` is computed (transitively, through defining ops in any block) from one of `targets`."""
    seen = set() if seen is None else seen
    if id(value) in targets:
        return True
    op = value.defining_op
    if op is None or id(op) in seen:
        return False
    seen.add(id(op))
    return any(_reaches(v, targets, seen) for v in op.operands)


def _check_groups(function):
    """The invariants codegen relies on, for every group."""
    blocks = [function.body] + [region for op in function.walk() for region in op.regions]
    followers = 0
    for block in blocks:
        for op in block.ops:
            assert op.parent is block
        for i, op in enumerate(block.ops):
            if op.opcode != OpCode.REDUCE:
                continue
            if op.attrs.get("exchange_follower"):
                followers += 1
            size = op.attrs.get("exchange_group")
            if size is None:
                continue
            assert 2 <= size <= MAX_GROUP
            scratch, loads = _exchange_cost(op)                 # the group's bounds
            assert size * scratch <= MAX_GROUP_SCRATCH_BYTES and size * loads <= MAX_GROUP_LOADS
            members = block.ops[i:i + size]
            assert all(m.opcode == OpCode.REDUCE for m in members)
            assert all(m.attrs.get("exchange_follower") for m in members[1:])
            assert not op.attrs.get("exchange_follower")
            source = op.operands[0]
            assert reduction_plan(source.layout, op.attrs["axis"]).warp_bits
            for m in members[1:]:
                assert m.attrs["kind"] == op.attrs["kind"] and m.attrs["axis"] == op.attrs["axis"]
                assert m.operands[0].type == source.type and m.operands[0].layout == source.layout
            for k, m in enumerate(members):
                others = {id(o.result) for o in members if o is not m}
                assert not _reaches(m.operands[0], others), f"member {k} depends on another member"
    assert followers == sum(size - 1 for size in exchange_groups(function))


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.is_floating_point():
        return torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0))
    return torch.equal(a, b)


def _compare(kernel, make, kwargs, num_warps, grid=(1,), num_stages=1, arch="sm_90a"):
    """Interpret the pipelined IR with and without the pass on the same inputs; returns the groups."""
    results, groups = [], None
    for siblings in (True, False):
        torch.manual_seed(1234)
        args, outs = make()
        function, _ = pipelined_ir(kernel, args, kwargs, num_warps, siblings, arch, num_stages)
        if siblings:
            _check_groups(function)
            groups = exchange_groups(function)
        else:
            assert exchange_groups(function) == []
        initial = [o.clone() for o in outs]
        interpret_ir(kernel, function, grid, args, kwargs)
        assert all(not _same(o, i) for o, i in zip(outs, initial))     # the kernel wrote its outputs
        results.append([o.clone() for o in outs])
    for a, b in zip(*results):
        assert _same(a, b)
    return groups


def _ptx(kernel, args, kwargs, num_warps, siblings, arch, num_stages=1):
    function, report = pipelined_ir(kernel, args, kwargs, num_warps, siblings, arch, num_stages)
    lowered = lower_to_llvm(function, arch=arch, num_warps=num_warps, axis_info=report.analyses["analyze_pointers"])
    return lowered, compile_to_ptx(lowered.llvm_ir, Target(arch)).ptx


def _barriers(ptx: str) -> int:
    return ptx.count("bar.sync") + ptx.count("barrier.sync")


# -- interpreter: grouped IR == ungrouped IR, bit for bit -------------------------------------------------

def _four_inputs(dtype, kind, R, N):
    def make():
        if dtype.is_floating_point:
            x, y = torch.randn(R, N).to(dtype), torch.randn(R, N).to(dtype)
            x[3, 5] = float("nan")
            y[7, 9] = float("nan")
            x[1, 1] = float("-inf")
            y[2, 2] = float("inf")
        else:
            x, y = torch.randint(-100, 100, (R, N)).to(dtype), torch.randint(-100, 100, (R, N)).to(dtype)
        acc = {torch.float16: torch.float32, torch.int8: torch.int32}.get(dtype, dtype) if kind == 0 else dtype
        out = torch.full((4 * N,), 99, dtype=acc)
        return (out, x, y, R - 1, N - 3), [out]
    return make


@pytest.mark.parametrize("dtype, kind, R, N, num_warps", [
    (torch.float32, 0, 64, 128, 8), (torch.float16, 0, 32, 256, 4), (torch.float16, 1, 128, 64, 16),
    (torch.float64, 2, 64, 128, 8), (torch.float32, 1, 32, 256, 4), (torch.int32, 0, 64, 128, 8),
    (torch.int64, 0, 32, 256, 4), (torch.int64, 2, 128, 64, 16), (torch.int8, 1, 64, 128, 8),
    (torch.int8, 0, 32, 256, 4)])
def test_four_reductions_of_a_tile_bit_identical(dtype, kind, R, N, num_warps):
    # Grouped as far as the bounds allow (_check_groups checks them): [4], [2, 2] or none.
    groups = _compare(four_kernel, _four_inputs(dtype, kind, R, N), dict(R=R, N=N, AXIS=0, KIND=kind), num_warps)
    assert groups in ([4], [2, 2], [3], [])


def test_reductions_within_warps_are_not_grouped():
    # axis 1 of these tiles lies within a warp: no exchange to share
    assert _compare(four_kernel, _four_inputs(torch.float32, 0, 64, 128), dict(R=64, N=128, AXIS=1, KIND=0), 8) == []


def test_loop_body_with_carried_operands_dependent_sum_store_and_barrier():
    def make():
        out = torch.zeros(12)
        return (out, torch.randn(1024), 3), [out]
    # a, c and d group (c and d move before the store and the barrier); b depends on a
    assert _compare(loop_kernel, make, dict(N=1024), 4) == [3]


@pytest.mark.parametrize("flag", [0, 1])
def test_if_regions_max_and_min_with_nan(flag):
    def make():
        out, x = torch.zeros(2), torch.randn(1024)
        x[5] = float("nan")
        return (out, x, flag), [out]
    assert _compare(if_kernel, make, dict(N=1024), 8) == [2, 2]


@pytest.mark.parametrize("shape, axis, num_warps, groups", [     # [2]: the group bounds (_check_groups)
    ((8, 16, 32), 0, 4, [2]), ((4, 64, 16), 0, 8, [2]), ((4, 64, 16), 1, 8, [3]), ((32, 8, 8), 1, 8, [])])
def test_three_d_keep_dims_and_not(shape, axis, num_warps, groups):
    A, B, C = shape

    def make():
        out = torch.zeros(3 * A * B * C)
        return (out, torch.randn(A, B, C)), [out]
    assert _compare(three_d_kernel, make, dict(A=A, B=B, C=C, AXIS=axis), num_warps) == groups


def test_more_than_max_group_siblings():
    def make():
        out = torch.zeros(6)
        return (out, torch.randn(1024)), [out]
    assert MAX_GROUP == 4
    assert _compare(many_kernel, make, dict(N=1024), 4) == [4, 2]


def test_max_moved_bounds_the_operand_computation():
    def make():
        out = torch.zeros(2)
        return (out, torch.randn(1024)), [out]
    assert MAX_MOVED == 16
    assert _compare(chain_kernel, make, dict(N=1024, STEPS=7), 4) == [2]       # 14 ops + 2 constants move
    assert _compare(chain_kernel, make, dict(N=1024, STEPS=8), 4) == []        # 18 would


def test_argreduce_and_cumsum_are_not_grouped():
    def make():
        out, idx, x = torch.zeros(3 + 1024), torch.zeros(2, dtype=torch.int32), torch.randn(1024)
        x[7] = float("nan")
        return (out, idx, x), [out, idx]
    assert _compare(arg_scan_kernel, make, dict(N=1024), 4) == [2]
    function, _ = pipelined_ir(arg_scan_kernel, make()[0], dict(N=1024), 4)
    assert not any("exchange_group" in op.attrs or "exchange_follower" in op.attrs
                   for op in function.walk() if op.opcode in (OpCode.ARGREDUCE, OpCode.SCAN))


def test_store_load_and_atomic_operands_stay_the_pure_one_moves():
    def make():
        out, tmp = torch.zeros(4), torch.zeros(1024)
        return (out, tmp, torch.randn(1024)), [out, tmp]
    assert _compare(memory_kernel, make, dict(N=1024), 4) == [2]               # a and d


def test_operand_shared_with_earlier_and_later_users():
    def make():
        out, y = torch.zeros(2), torch.zeros(2048)
        return (out, y, torch.randn(1024)), [out, y]
    assert _compare(shared_operand_kernel, make, dict(N=1024), 4) == [2]


def test_dependency_through_ops_between_members_is_seen():
    def make():
        out = torch.zeros(3)
        return (out, torch.randn(1024)), [out]
    assert _compare(indirect_dependency_kernel, make, dict(N=1024), 4) == [2]  # s1, s2; s3 needs s1


@pytest.mark.parametrize("arch, num_stages", [("sm_90a", 3), ("sm_80", 3), ("sm_80", 1)])
def test_sums_in_a_pipelined_matmul_loop(arch, num_stages):
    def make():
        out = torch.zeros(64 * 64 + 64)
        return (out, torch.randn(64, 128).half(), torch.randn(128, 64).half(), 128), [out]
    assert _compare(dot_loop_kernel, make, dict(M=64, N=64, BK=32), 4, num_stages=num_stages, arch=arch) == [2]


def test_while_body_pair():
    def make():
        out = torch.zeros(64)
        return (out, torch.randn(1024), 20000.0), [out]
    assert _compare(while_kernel, make, dict(N=1024), 4) == [2]


def test_uint32_max_and_min_pairs():
    def make():
        out = torch.zeros(4, dtype=torch.uint32)
        return (out, torch.randint(0, 2 ** 32, (1024,), dtype=torch.int64).to(torch.uint32)), [out]
    assert _compare(uint_kernel, make, dict(N=1024), 4) == [2, 2]


def test_result_of_a_multi_result_loop_is_not_moved():
    def make():
        out = torch.zeros(3)
        return (out, torch.randn(1024), 3), [out]
    assert _compare(multi_result_loop_kernel, make, dict(N=1024), 4) == [2]   # s1 and s3


def test_pass_is_idempotent():
    x = torch.randn(64, 128)
    function, _ = pipelined_ir(four_kernel, (torch.zeros(512), x, x, 63, 125), dict(R=64, N=128, AXIS=0, KIND=0), 8)
    before = print_function(function)
    assert group_sibling_reductions(function) is False
    assert print_function(function) == before


# -- codegen: PTX, barriers, scratch, spills --------------------------------------------------------------

@needs_ptxas
@pytest.mark.parametrize("arch", ["sm_90a", "sm_80"])
def test_ptx_group_assembles_fewer_barriers_scratch_for_all_members(arch):
    x = torch.zeros(64, 128, dtype=torch.float16)
    args, kwargs = (torch.zeros(512), x, x, 64, 128), dict(R=64, N=128, AXIS=0, KIND=0)
    stats = {}
    for siblings in (True, False):
        lowered, ptx = _ptx(four_kernel, args, kwargs, 8, siblings, arch)
        result = assemble(ptx, arch)
        stats[siblings] = (_barriers(ptx), result.spill_bytes, lowered.shared_bytes)
    assert stats[True][0] == 4 and stats[False][0] == 8   # two groups of two (MAX_GROUP_LOADS)
    assert stats[True][1] <= stats[False][1]              # (sm_90a: 0 grouped, 16 bytes ungrouped)
    assert stats[True][2] == 2 * stats[False][2]          # two members' slots side by side


@needs_ptxas
def test_ptx_loop_and_if_kernels_assemble():
    for kernel, args, kwargs, num_warps in [
            (loop_kernel, (torch.zeros(12), torch.zeros(1024), 3), dict(N=1024), 4),
            (if_kernel, (torch.zeros(2), torch.zeros(1024), 1), dict(N=1024), 8)]:
        for arch in ("sm_90a", "sm_80"):
            counts = []
            for siblings in (True, False):
                _, ptx = _ptx(kernel, args, kwargs, num_warps, siblings, arch)
                assert assemble(ptx, arch).spill_bytes == 0
                counts.append(_barriers(ptx))
            assert counts[0] < counts[1]


def test_grouped_scratch_stays_within_shared_memory_when_ungrouped_fits():
    x = torch.zeros(32, 2048)
    args, kwargs = (torch.zeros(2 * 2048), x, x, 32, 2048), dict(R=32, N=2048, M=2)
    grouped, _ = _ptx(colsums_kernel, args, kwargs, 16, True, "sm_90a")
    ungrouped, _ = _ptx(colsums_kernel, args, kwargs, 16, False, "sm_90a")
    assert ungrouped.shared_bytes <= MAX_SHARED_BYTES
    assert grouped.shared_bytes <= MAX_SHARED_BYTES


@needs_ptxas
def test_grouping_adds_no_spills_int8_column_sums():
    x = torch.zeros(128, 64, dtype=torch.int8)
    args, kwargs = (torch.zeros(4 * 64, dtype=torch.int32), x, x, 128, 64), dict(R=128, N=64, M=4)
    spills = {}
    for siblings in (True, False):
        _, ptx = _ptx(colsums_kernel, args, kwargs, 8, siblings, "sm_90a")
        spills[siblings] = assemble(ptx, "sm_90a").spill_bytes
    assert spills[False] == 0
    assert spills[True] == 0
