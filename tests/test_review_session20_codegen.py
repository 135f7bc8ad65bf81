"""Review of b1b3b8c: global accesses vectorized along the dim a layout's leading registers step in (dim 0 for a
transposed view), and every 2-D tile conversion of 16/32-bit elements through the swizzled shared tile.

Neither change runs in the interpreter (it runs the IR, not codegen), so the CPU tier checks codegen's own plans
against ground truth:
- global accesses: the kernel's IR after the passes runs in the interpreter with the load/store rules wrapped;
  for every thread (lane, warp) and every vector group codegen forms (`memory.vector_widths` / `_contiguous_registers`,
  the very functions `_load` / `_store` call) the concrete addresses of the group must be consecutive elements,
  the first aligned to the vector's size, and the mask uniform over the vector (over each sub-group where the
  mask is narrower). Adversarial index expressions: ragged and odd sizes, misaligned views, strides 0 and 2,
  `//`, `%`, `^`, reversed rows, triangular masks, 3-D blocks, 1- to 8-byte elements, replicated layouts,
  transposed mma accumulators stored from their own layout (pairs along dim 0) through pointers contiguous along
  dim 0, along dim 1 only, every other element or 2 bytes off, and transposed pointer blocks carried through a
  loop whose alignment is the join over the trips. The expected (dim, width, mask width) of each case is pinned,
  and two tests show the oracles fail on a wrong plan.
- conversions: `mma.tile_store_groups` / `swizzled_exchange.tile_load_groups` (the plans `store_tile` /
  `load_tile` emit) simulated for every thread: no two elements stored at one byte, every load reads the element
  its target register holds, every vector aligned; for blocked, transposed, mma, wgmma, FMA-operand and
  broadcast layouts, tiny and replicated tiles. The bank model: never more wavefronts than the old row-major
  scalar exchange. The PTX of conversions of every 16/32-bit dtype (ptxas, no spills), and 8/64-bit ones staying
  on the scalar path.
GPU tier: transposed views and conversions against torch with poisoned outputs.

Finding (was a strict xfail): a transposed view read through a loop-carried pointer block (`ptrs += step`, the
usual K-loop idiom) took one 2-byte load per element: the carried block kept its initial value's row-major
layout. Fixed by passes/induction_variables.py (the block is recomputed from the induction variable, an index
computation the layout pass places in the load's column-major memory layout).
"""

from __future__ import annotations

import re
import types

import numpy as np
import pytest
import torch

import fusedops.dsl as dsl
from fusedops.dsl.codegen import layout_access
from fusedops.dsl.codegen import memory as codegen_memory
from fusedops.dsl.codegen import swizzled_exchange
from fusedops.dsl.codegen.mma import tile_store_groups
from fusedops.dsl.codegen.ownership import owned_registers
from fusedops.dsl.interpreter import context as interpreter_context
from fusedops.dsl.ir import OpCode
from fusedops.dsl.language.dtypes import BlockType
from fusedops.dsl.layouts import default_blocked, transpose
from fusedops.dsl.layouts import mma as mma_layouts
from fusedops.dsl.layouts import shape_ops
from fusedops.dsl.layouts.banks import shared_access_cost
from fusedops.dsl.layouts.shared import swizzled_shared
from fusedops.dsl.layouts.swizzle import choose_swizzle
from fusedops.dsl.layouts.linear import LinearLayout
from fusedops.dsl.target import assemble, ptxas_available
from codegen_helpers import interpret_ir, pipelined_ir, xor_bits
from helpers import poison

needs_ptxas = pytest.mark.skipif(not ptxas_available(), reason="ptxas is not on the PATH")


@pytest.fixture(autouse=True)
def _fresh_kernel_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))


# -- kernels ----------------------------------------------------------------------------------------------

@dsl.jit
def tile_kernel(out_ptr, x_ptr, M, N, stride, MODE: dsl.constexpr, BM: dsl.constexpr, BN: dsl.constexpr):
    # out[offs] = x[offs] + 1 over a (BM, BN) tile of offsets contiguous along dim 0 (a transposed view), each
    # MODE bending the facts the pointer analysis must get right along dim 0.
    rm = dsl.program_id(0) * BM + dsl.arange(0, BM)
    rn = dsl.program_id(1) * BN + dsl.arange(0, BN)
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    if MODE == 0:      # plain transposed view
        offs = rm[:, None] + rn[None, :] * stride
    elif MODE == 1:    # every column the same (stride 0 along dim 1: a broadcast pointer, duplicate stores)
        offs = rm[:, None] + rn[None, :] * 0
    elif MODE == 2:    # pairs of rows on one element: constant in runs of 2, never contiguous
        offs = rm[:, None] // 2 + rn[None, :] * stride
    elif MODE == 3:    # every other element
        offs = rm[:, None] * 2 + rn[None, :] * stride
        mask = (rm[:, None] * 2 < M) & (rn[None, :] < N)
    elif MODE == 4:    # runs of 4 consecutive elements, repeated
        offs = rm[:, None] % 4 + rn[None, :] * stride
    elif MODE == 5:    # reversed rows (consecutive, decreasing)
        offs = (M - 1 - rm[:, None]) + rn[None, :] * stride
    elif MODE == 6:    # pairs swapped
        offs = (rm[:, None] ^ 1) + rn[None, :] * stride
    else:              # a triangular mask (varies inside every group along dim 0)
        offs = rm[:, None] + rn[None, :] * stride
        mask = mask & (rm[:, None] <= rn[None, :])
    tile = dsl.load(x_ptr + offs, mask=mask, other=1)
    dsl.store(out_ptr + offs, tile + 1, mask=mask)


@dsl.jit
def block3d_kernel(out_ptr, x_ptr, A, B, C, s_a, s_b, s_c, BA: dsl.constexpr, BB: dsl.constexpr,
                   BC: dsl.constexpr):
    a, b, c = dsl.arange(0, BA), dsl.arange(0, BB), dsl.arange(0, BC)
    offs = a[:, None, None] * s_a + b[None, :, None] * s_b + c[None, None, :] * s_c
    mask = (a[:, None, None] < A) & (b[None, :, None] < B) & (c[None, None, :] < C)
    tile = dsl.load(x_ptr + offs, mask=mask, other=0)
    dsl.store(out_ptr + offs, tile * 2, mask=mask)


@dsl.jit
def transposed_dot_kernel(out_ptr, a_ptr, b_ptr, M, N, stride, BM: dsl.constexpr, BN: dsl.constexpr,
                          BK: dsl.constexpr):
    # out^T = (a @ b)^T: the (transposed) mma accumulator is small enough to be stored from its own layout,
    # pairs along the tile's first dim, through a pointer contiguous along that dim
    rm, rn, rk = dsl.arange(0, BM), dsl.arange(0, BN), dsl.arange(0, BK)
    a = dsl.load(a_ptr + rm[:, None] * BK + rk[None, :])
    b = dsl.load(b_ptr + rk[:, None] * BN + rn[None, :])
    acc = dsl.trans(dsl.dot(a, b))
    dsl.store(out_ptr + rn[:, None] + rm[None, :] * stride, acc.to(dsl.float16),
              mask=(rn[:, None] < N) & (rm[None, :] < M))


@dsl.jit
def small_transposed_dot_kernel(out_ptr, a_ptr, b_ptr, M, N, stride, BM: dsl.constexpr, BN: dsl.constexpr,
                                BK: dsl.constexpr, KIND: dsl.constexpr):
    # a (BN, BM) transposed mma accumulator of at most one element per thread is stored from its own layout
    # (pairs along dim 0) whatever the pointer: contiguous along dim 0, along dim 1, or every other element
    rm, rn, rk = dsl.arange(0, BM), dsl.arange(0, BN), dsl.arange(0, BK)
    a = dsl.load(a_ptr + rm[:, None] * BK + rk[None, :])
    b = dsl.load(b_ptr + rk[:, None] * BN + rn[None, :])
    acc = dsl.trans(dsl.dot(a, b))
    if KIND == 0:
        pointers = out_ptr + rn[:, None] + rm[None, :] * stride
    elif KIND == 1:
        pointers = out_ptr + rn[:, None] * stride + rm[None, :]
    else:
        pointers = out_ptr + rn[:, None] * 2 + rm[None, :] * stride
    dsl.store(pointers, acc.to(dsl.float16), mask=(rn[:, None] < N) & (rm[None, :] < M))


@dsl.jit
def carried_after_a_load_kernel(out_ptr, x_ptr, K, stride, step, BM: dsl.constexpr, BN: dsl.constexpr):
    # a transposed view loaded once before the loop (so the pointer block is carried in the transposed
    # layout) and advanced by `step` elements each trip: the loop's facts are the join over every trip
    rm, rn = dsl.arange(0, BM), dsl.arange(0, BN)
    ptrs = x_ptr + rm[:, None] + rn[None, :] * stride
    acc = dsl.load(ptrs).to(dsl.float32)
    for _ in range(1, K):
        ptrs += step
        acc += dsl.load(ptrs).to(dsl.float32)
    dsl.store(out_ptr + rm[:, None] + rn[None, :] * stride, acc.to(dsl.float16))


@dsl.jit
def add_transposed_kernel(out_ptr, x_ptr, y_ptr, M, N, BM: dsl.constexpr, BN: dsl.constexpr):
    # out = x + y^T: the two tiles arrive in different layouts, one is converted to the other's
    rm = dsl.program_id(0) * BM + dsl.arange(0, BM)
    rn = dsl.program_id(1) * BN + dsl.arange(0, BN)
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    x = dsl.load(x_ptr + rm[:, None] * N + rn[None, :], mask=mask)
    y = dsl.load(y_ptr + rn[None, :] * M + rm[:, None], mask=mask)
    dsl.store(out_ptr + rm[:, None] * N + rn[None, :], x + y, mask=mask)


@dsl.jit
def carried_transposed_kernel(out_ptr, x_ptr, K, stride, BM: dsl.constexpr, BN: dsl.constexpr):
    # sum over K / BM blocks of x^T tiles, the pointer block advanced each trip (the K-loop idiom)
    rm, rn = dsl.arange(0, BM), dsl.arange(0, BN)
    ptrs = x_ptr + rm[:, None] + rn[None, :] * stride
    acc = dsl.zeros((BM, BN), dsl.float32)
    for _ in range(0, K, BM):
        acc += dsl.load(ptrs).to(dsl.float32)
        ptrs += BM
    dsl.store(out_ptr + rm[:, None] * BN + rn[None, :], acc.to(dsl.float16))


# -- the oracle for global accesses ----------------------------------------------------------------------

def _memory_plans(function, axis_info) -> dict:
    """id(load/store op) -> (op, layout, width, mask width, dim): what codegen/memory.py does with it."""
    plans = {}
    for op in function.walk():
        if op.opcode not in (OpCode.LOAD, OpCode.STORE) or not isinstance(op.operands[0].type, BlockType):
            continue
        pointer = op.operands[0]
        mask = None
        if op.attrs.get("masked"):
            mask = op.operands[1] if op.opcode == OpCode.LOAD else op.operands[2]
        ctx = types.SimpleNamespace(axis_info=axis_info)
        width, mask_width = codegen_memory.vector_widths(ctx, pointer, mask, pointer.type.element.element.itemsize)
        dim, _ = codegen_memory._contiguous_registers(pointer.layout)
        plans[id(op)] = (op, pointer.layout, width, mask_width, dim)
    return plans


def _group_problems(plan, pointer, mask, num_warps: int) -> list:
    """Every vector group of `plan` whose active elements are not consecutive, aligned and uniformly masked."""
    op, layout, width, mask_width, _ = plan
    shape = tuple(layout.shape)
    pointer = np.broadcast_to(np.asarray(pointer, dtype=np.int64), shape)
    mask = None if mask is None else np.broadcast_to(np.asarray(mask), shape)
    size = op.operands[0].type.element.element.itemsize
    registers = layout_access.num_registers(layout)
    warp_bits = layout.in_dim_bits("warp")
    owned = owned_registers(layout) if op.opcode == OpCode.STORE else None
    problems = []

    def consecutive(addresses, count):
        return all(a == addresses[0] + i * size for i, a in enumerate(addresses)) and addresses[0] % (count * size) == 0

    for warp in range(num_warps):
        for lane in range(32):
            coords = [tuple(layout.apply(register=r, lane=lane, warp=warp % (1 << warp_bits))) for r in range(registers)]
            for start in range(0, registers, width):
                if owned is not None and start not in owned:
                    continue
                group = coords[start:start + width]
                addresses = [int(pointer[c]) for c in group]
                active = [True if mask is None else bool(mask[c]) for c in group]
                where = (op.opcode.value, warp, lane, start, addresses, active)
                subs = [active[j:j + mask_width] for j in range(0, width, mask_width)]
                if any(len(set(sub)) > 1 for sub in subs):
                    problems.append(("mask not uniform over a (sub-)vector",) + where)
                elif all(active):
                    if not consecutive(addresses, width):
                        problems.append(("vector not consecutive/aligned",) + where)
                else:
                    for j in range(0, width, mask_width):
                        if active[j] and not consecutive(addresses[j:j + mask_width], mask_width):
                            problems.append(("sub-vector not consecutive/aligned",) + where)
    return problems


def check_vector_groups(kernel, grid, args, kwargs, num_warps, arch="sm_90a") -> tuple:
    """(sorted [(opcode, dim, width, mask width)], problems) of `kernel` run in the interpreter after the passes."""
    function, report = pipelined_ir(kernel, args, kwargs, num_warps, arch=arch)
    plans = _memory_plans(function, report.analyses["analyze_pointers"])
    problems = []
    rules = {code: interpreter_context.RULES[code] for code in (OpCode.LOAD, OpCode.STORE)}

    def wrap(code):
        rule = rules[code]

        def fn(ctx, op, pointer, *rest):
            plan = plans.get(id(op))
            if plan is not None:
                masked = bool(op.attrs.get("masked"))
                mask = (rest[0] if code == OpCode.LOAD else rest[1]) if masked else None
                problems.extend(_group_problems(plan, pointer, mask, num_warps))
            return rule.fn(ctx, op, pointer, *rest)
        return interpreter_context.Rule(fn, rule.multiple_results, rule.static)

    try:
        for code in rules:
            interpreter_context.RULES[code] = wrap(code)
        interpret_ir(dsl.jit(kernel.fn), function, grid, args, kwargs)
    finally:
        interpreter_context.RULES.update(rules)
    summary = sorted((p[0].opcode.value, p[4], p[2], p[3]) for p in plans.values())
    return summary, problems


def _tensor(n, dtype, generator):
    if dtype.is_floating_point:
        return torch.randn(n, generator=generator).to(dtype)
    return torch.randint(0, 2 if dtype == torch.bool else 7, (n,), generator=generator).to(dtype)


# (MODE, M, N, stride, dtype, view offset, expected (dim, width, mask width) of the load and the store)
TILE_CASES = [
    (0, 64, 32, 64, torch.float16, 0, (0, 8, 8)),     # 16-byte vectors along dim 0
    (0, 61, 32, 64, torch.float16, 0, (0, 8, 1)),     # ragged M: whole vectors where in bounds, else elements
    (0, 56, 32, 56, torch.float16, 0, (0, 8, 8)),     # M and stride multiples of 8: masks constant over 8
    (0, 64, 32, 64, torch.float16, 1, (0, 1, 1)),     # a view 2 bytes off: nothing aligned
    (0, 64, 32, 37, torch.float16, 0, (0, 1, 1)),     # odd stride: columns 2-byte aligned only
    (0, 64, 32, 64, torch.float32, 0, (0, 4, 4)),
    (0, 64, 32, 64, torch.int64, 0, (0, 2, 2)),
    (0, 64, 32, 64, torch.float64, 0, (0, 2, 2)),
    (0, 64, 32, 64, torch.int8, 0, (0, 8, 8)),
    (0, 64, 32, 64, torch.bool, 0, (0, 8, 8)),
    (1, 64, 32, 0, torch.float16, 0, (0, 8, 8)),      # broadcast pointer, duplicate stores
    (2, 64, 32, 64, torch.float16, 0, (1, 1, 1)),     # (no run along dim 0: the row-major layout)
    (3, 64, 32, 128, torch.float16, 0, (1, 1, 1)),
    (4, 64, 32, 64, torch.float16, 0, (0, 4, 4)),     # runs of 4 consecutive elements: 8-byte vectors
    (5, 64, 32, 64, torch.float16, 0, (1, 1, 1)),
    (6, 64, 32, 64, torch.float16, 0, (1, 1, 1)),
    (7, 64, 32, 64, torch.float16, 0, (0, 8, 1)),
]


@pytest.mark.parametrize("mode, m, n, stride, dtype, offset, expected", TILE_CASES)
def test_dim0_vector_groups_are_consecutive_aligned_and_uniformly_masked(mode, m, n, stride, dtype, offset,
                                                                         expected, seed):
    generator = torch.Generator().manual_seed(seed)
    x = _tensor(4096 + offset, dtype, generator)[offset:]
    out = torch.zeros(4096 + offset, dtype=dtype)[offset:]
    summary, problems = check_vector_groups(tile_kernel, (-(-m // 32), -(-n // 32)), (out, x, m, n, stride),
                                            dict(MODE=mode, BM=32, BN=32), 4)
    assert not problems, problems[:3]
    assert summary == [("load",) + expected, ("store",) + expected]


@pytest.mark.parametrize("num_warps, block, dtype, expected", [
    (8, (64, 64), torch.int8, (0, 16, 16)),           # 16 one-byte elements along dim 0
    (8, (16, 16), torch.float16, (1, 1, 1)),          # one element per thread (no register bases)
    (8, (8, 8), torch.float32, (1, 1, 1)),            # more threads than elements: replicated, owners store
    (1, (16, 16), torch.float16, (0, 8, 8)),
    (4, (64, 2), torch.float16, (1, 1, 1)),
    (4, (2, 64), torch.float16, (1, 1, 1)),
])
def test_dim0_vector_groups_for_other_tiles_and_warps(num_warps, block, dtype, expected, seed):
    generator = torch.Generator().manual_seed(seed)
    bm, bn = block
    x, out = _tensor(8192, dtype, generator), torch.zeros(8192, dtype=dtype)
    summary, problems = check_vector_groups(tile_kernel, (1, 1), (out, x, bm, bn, 64),
                                            dict(MODE=0, BM=bm, BN=bn), num_warps)
    assert not problems, problems[:3]
    assert summary == [("load",) + expected, ("store",) + expected]


@pytest.mark.parametrize("sizes, strides, expected", [
    ((16, 8, 4), (1, 16, 128), (0, 4, 4)),             # contiguous along dim 0 of three
    ((16, 5, 4), (1, 16, 80), (0, 4, 4)),              # ragged middle dim
    ((13, 8, 4), (1, 13, 104), (0, 1, 1)),             # odd extent and stride along the contiguous dim
    ((16, 8, 4), (8, 1, 128), (1, 4, 4)),              # contiguous along the middle dim
    ((16, 5, 4), (8, 1, 128), (1, 4, 1)),              # ... ragged along it
])
def test_3d_blocks_vectorize_along_their_contiguous_dim(sizes, strides, expected, seed):
    generator = torch.Generator().manual_seed(seed)
    x, out = _tensor(4096, torch.float16, generator), torch.zeros(4096, dtype=torch.float16)
    summary, problems = check_vector_groups(block3d_kernel, (1,), (out, x, *sizes, *strides),
                                            dict(BA=16, BB=8, BC=4), 4)
    assert not problems, problems[:3]
    assert summary == [("load",) + expected, ("store",) + expected]


@pytest.mark.parametrize("block, num_warps, arch, m, expected_store", [
    ((16, 16, 16), 4, "sm_80", 16, (0, 2, 2)),        # transposed mma accumulator stored in place: pairs
    ((16, 16, 16), 4, "sm_80", 13, (0, 2, 2)),
    ((64, 64, 16), 4, "sm_90a", 61, (0, 8, 8)),       # converted to a blocked layout along dim 0
])
def test_transposed_accumulator_stores(block, num_warps, arch, m, expected_store, seed):
    generator = torch.Generator().manual_seed(seed)
    bm, bn, bk = block
    a = torch.randn(bm * bk, generator=generator).half()
    b = torch.randn(bk * bn, generator=generator).half()
    out = torch.zeros(4096, dtype=torch.float16)
    summary, problems = check_vector_groups(transposed_dot_kernel, (1,), (out, a, b, m, bn, 64),
                                            dict(BM=bm, BN=bn, BK=bk), num_warps, arch)
    assert not problems, problems[:3]
    assert [s for s in summary if s[0] == "store"] == [("store",) + expected_store]


@pytest.mark.parametrize("kind, offset, expected_store", [
    (0, 0, (0, 2, 2)),      # contiguous along dim 0: pairs
    (0, 1, (0, 1, 1)),      # ... in a view 2 bytes off
    (1, 0, (0, 1, 1)),      # contiguous along dim 1 only
    (2, 0, (0, 1, 1)),      # every other element
])
def test_in_place_stores_stepping_along_dim_0_through_any_pointer(kind, offset, expected_store, seed):
    generator = torch.Generator().manual_seed(seed)
    a = torch.randn(16 * 16, generator=generator).half()
    b = torch.randn(16 * 8, generator=generator).half()
    out = torch.zeros(4096 + offset, dtype=torch.float16)[offset:]
    summary, problems = check_vector_groups(small_transposed_dot_kernel, (1,), (out, a, b, 11, 8, 32),
                                            dict(BM=16, BN=8, BK=16, KIND=kind), 4, "sm_80")
    assert not problems, problems[:3]
    assert [s for s in summary if s[0] == "store"] == [("store",) + expected_store]


@pytest.mark.parametrize("step, offset, expected_in_loop", [
    (8, 0, (0, 8, 8)),      # every trip stays 16-byte aligned
    (3, 0, (0, 1, 1)),      # the join of trips: 2-byte aligned only
    (64, 1, (0, 1, 1)),     # a view 2 bytes off
])
def test_loop_carried_transposed_pointers_join_their_alignment(step, offset, expected_in_loop, seed):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(64 * 64 + 8 * 64 + 8, generator=generator).half()[offset:]
    out = torch.zeros(8192, dtype=torch.float16)[offset:]
    summary, problems = check_vector_groups(carried_after_a_load_kernel, (1,), (out, x, 4, 64, step),
                                            dict(BM=32, BN=32), 4)
    assert not problems, problems[:3]
    before = (0, 8, 8) if offset == 0 else (0, 1, 1)
    assert sorted(summary) == sorted([("load",) + before, ("load",) + expected_in_loop, ("store",) + before])


def test_the_oracle_catches_a_wrong_vector_width(monkeypatch):
    # the checks above can fail: claim 16-byte vectors where the stride (37) leaves columns 2-byte aligned
    x, out = torch.zeros(4096, dtype=torch.float16), torch.zeros(4096, dtype=torch.float16)
    monkeypatch.setattr(codegen_memory, "vector_widths", lambda ctx, pointer, mask, size: (8, 8))
    _, problems = check_vector_groups(tile_kernel, (2, 1), (out, x, 61, 32, 37), dict(MODE=0, BM=32, BN=32), 4)
    kinds = {p[0] for p in problems}
    assert kinds == {"mask not uniform over a (sub-)vector", "vector not consecutive/aligned"}, kinds


# -- the oracle for tile conversions ---------------------------------------------------------------------

def _vector_addresses(lanes, warps, groups, num_warps: int, alignment: int, what: str, problems: list):
    """(warp, lane, first register, byte address) of every vector of a tile access plan, for every thread;
    appends a problem for each address off `alignment`."""
    for warp in range(num_warps):
        for lane in range(32):
            thread = xor_bits(lanes, lane) ^ xor_bits(warps, warp % (1 << len(warps)))
            for first, constant in groups:
                address = thread ^ constant
                if address % alignment:
                    problems.append((f"{what} misaligned", warp, lane, first))
                yield warp, lane, first, address


def simulate_exchange(source, target, bits: int, num_warps: int) -> tuple:
    """((store width, load width), problems) of moving a block from `source` to `target` the way
    exchange_through_swizzled_shared's plans do, simulated for every thread of `num_warps` warps."""
    size = bits // 8
    shared = swizzled_exchange.exchange_tile(source, target, bits)
    store_width, groups, lanes, warps = tile_store_groups(source, shared, bits)
    memory, problems = {}, []
    for warp, lane, first, address in _vector_addresses(lanes, warps, groups, num_warps, store_width * size, "store",
                                                        problems):
        for i in range(store_width):
            coords = source.apply(register=first + i, lane=lane, warp=warp % (1 << source.in_dim_bits("warp")))
            slot = address + i * size
            if not 0 <= slot < source.numel * size or memory.setdefault(slot, coords) != coords:
                problems.append(("store clash or outside the tile", warp, lane, first + i, slot))
    load_width, groups, lanes, warps = swizzled_exchange.tile_load_groups(target, shared, bits)
    for warp, lane, first, address in _vector_addresses(lanes, warps, groups, num_warps, load_width * size, "load",
                                                        problems):
        for i in range(load_width):
            want = target.apply(register=first + i, lane=lane, warp=warp % (1 << target.in_dim_bits("warp")))
            if memory.get(address + i * size) != want:
                problems.append(("load reads the wrong element", warp, lane, first + i))
    return (store_width, load_width), problems


def _blocked_t(shape, num_warps, bits):
    return transpose(default_blocked(shape[::-1], num_warps, bits), (1, 0))


def _conversion_pairs():
    pairs = []
    for shape, num_warps in [((64, 64), 4), ((128, 64), 8), ((16, 16), 8), ((8, 8), 4), ((2, 2), 1), ((2, 64), 4),
                             ((64, 2), 4)]:
        for bits in (16, 32):
            pairs.append((f"blocked->T {shape} w{num_warps} b{bits}", default_blocked(shape, num_warps, bits),
                          _blocked_t(shape, num_warps, bits), bits, num_warps))
            pairs.append((f"T->blocked {shape} w{num_warps} b{bits}", _blocked_t(shape, num_warps, bits),
                          default_blocked(shape, num_warps, bits), bits, num_warps))
    for shape, num_warps in [((64, 64), 4), ((128, 64), 8)]:
        wgmma = mma_layouts.wgmma_accumulator(shape, num_warps)
        mma = mma_layouts.mma_accumulator(shape, mma_layouts.mma_warps_per_cta(shape, num_warps))
        for bits in (16, 32):
            pairs.append((f"wgmma->T {shape}", wgmma, _blocked_t(shape, num_warps, bits), bits, num_warps))
            pairs.append((f"blocked->mma {shape}", default_blocked(shape, num_warps, bits), mma, bits, num_warps))
            pairs.append((f"mma->wgmma {shape}", mma, wgmma, bits, num_warps))
    # Q (16-byte rows) into the wgmma A fragment, as attention's forward converts it
    pairs.append(("blocked->wgmma A", default_blocked((128, 128), 8, 16), mma_layouts.wgmma_operand_a((128, 128), 8, 64, 64),
                  16, 8))
    # the FMA dot's operand layouts before session 23: registers and lanes replicated
    accumulator = default_blocked((32, 32), 4, 32)
    pairs.append(("T->FMA A", _blocked_t((32, 16), 4, 32), _replicated_operand(accumulator, 16, 0), 32, 4))
    pairs.append(("blocked->FMA B", default_blocked((16, 32), 4, 32), _replicated_operand(accumulator, 16, 1), 32, 4))
    # a broadcast (lanes that held copies now hold columns) to and from blocked layouts
    base = default_blocked((16, 128), 8, 32)
    broadcast = shape_ops.broadcast(shape_ops.expand_dims(shape_ops.slice_layout(base, 1), 1), 1, 128)
    pairs.append(("broadcast->blocked", broadcast, base, 16, 8))
    pairs.append(("T->broadcast", _blocked_t((16, 128), 8, 16), broadcast, 16, 8))
    return pairs


def _replicated_operand(acc, k: int, operand: int):
    # A (operand 0, M x K) or B (1, K x N) as a thread needs it to compute its accumulator elements alone:
    # for each accumulator register, row m of A / column n of B, all of K in registers (copies across the
    # registers and lanes that share a row or column)
    keep = 0 if operand == 0 else 1
    bases = {name: [(v[keep], 0) if operand == 0 else (0, v[keep]) for v in acc.bases_of(name)]
             for name in acc.in_dims}
    k_bases = [(0, 1 << i) if operand == 0 else (1 << i, 0) for i in range(k.bit_length() - 1)]
    bases["register"] = k_bases + list(bases.get("register", []))
    return LinearLayout(bases, (acc.shape[0], k) if operand == 0 else (k, acc.shape[1]))


PAIRS = _conversion_pairs()


@pytest.mark.parametrize("name, source, target, bits, num_warps", PAIRS, ids=[p[0] for p in PAIRS])
def test_swizzled_exchange_moves_every_element_to_its_target_register(name, source, target, bits, num_warps):
    assert swizzled_exchange.exchanges_tiles(source, target)
    widths, problems = simulate_exchange(source, target, bits, num_warps)
    assert not problems, problems[:3]
    if name.startswith("blocked->T (64, 64)"):
        # the transpose: 16-byte vectors on the store side, single elements on the load side
        assert widths == ((8, 1) if bits == 16 else (4, 1))


def test_the_exchange_simulation_catches_a_wrong_tile(monkeypatch):
    # the simulation can fail: the load plan made for another tile (row-major, unswizzled) than the store's
    source, target = default_blocked((64, 64), 4, 16), _blocked_t((64, 64), 4, 16)
    wrong = swizzled_shared((64, 64))
    assert swizzled_exchange.exchange_tile(source, target, 16) != wrong
    plan = swizzled_exchange.tile_load_groups
    monkeypatch.setattr(swizzled_exchange, "tile_load_groups", lambda layout, shared, bits: plan(layout, wrong, bits))
    _, problems = simulate_exchange(source, target, 16, 4)
    assert {p[0] for p in problems} == {"load reads the wrong element"}


def test_which_conversions_take_the_swizzled_path():
    blocked, flipped = default_blocked((64, 64), 4, 16), _blocked_t((64, 64), 4, 16)
    assert swizzled_exchange.exchanges_tiles(blocked, flipped)
    assert swizzled_exchange.exchanges_tiles(default_blocked((2, 2), 1, 16), _blocked_t((2, 2), 1, 16))
    for shape in [(1, 64), (64, 1), (4, 8, 16)]:
        assert not swizzled_exchange.exchanges_tiles(default_blocked(shape, 4, 16), _blocked_t(shape, 4, 16)
                                                     if len(shape) == 2 else default_blocked(shape, 4, 32)), shape
    assert [d.name for d in (dsl.int16, dsl.uint16, dsl.int32, dsl.uint32, dsl.float16, dsl.bfloat16, dsl.float32)
            if swizzled_exchange.can_exchange(d)] == ["int16", "uint16", "int32", "uint32", "float16", "bfloat16",
                                                      "float32"]
    assert not any(swizzled_exchange.can_exchange(d) for d in (dsl.int1, dsl.int8, dsl.uint8, dsl.int64,
                                                                  dsl.float64))


@pytest.mark.parametrize("shape, num_warps, bits", [((64, 64), 4, 16), ((64, 64), 4, 32), ((128, 64), 8, 16),
                                                   ((16, 16), 8, 32)])
def test_the_swizzled_tile_never_costs_more_wavefronts_than_the_row_major_scalar_one(shape, num_warps, bits):
    layouts = [default_blocked(shape, num_warps, bits), _blocked_t(shape, num_warps, bits)]
    if min(shape) >= 64:
        layouts.append(mma_layouts.wgmma_accumulator(shape, num_warps))
    row_major = swizzled_shared(shape)
    for source in layouts:
        for target in layouts:
            if source == target:
                continue
            old = (shared_access_cost(source, row_major, bits, 1).wavefronts
                   + shared_access_cost(target, row_major, bits, 1).wavefronts)
            choice = choose_swizzle(source, target, bits)
            assert choice.store.wavefronts + choice.load.wavefronts <= old


def _shared_accesses(ptx: str) -> set:
    return set(re.findall(r"\b(?:ld|st)\.shared(?:\.[a-z0-9]+)*", ptx))


@needs_ptxas
@pytest.mark.parametrize("dtype, store, load", [
    (torch.int16, "st.shared.v4.b32", "ld.shared.b16"), (torch.uint16, "st.shared.v4.b32", "ld.shared.b16"),
    (torch.int32, "st.shared.v4.b32", "ld.shared.b32"), (torch.uint32, "st.shared.v4.b32", "ld.shared.b32"),
    (torch.bfloat16, "st.shared.v4.b32", "ld.shared.b16"), (torch.float32, "st.shared.v4.b32", "ld.shared.b32"),
])
def test_conversions_of_every_16_and_32_bit_dtype_assemble_with_vectors(dtype, store, load):
    x = torch.empty(16, dtype=dtype)
    ptx = add_transposed_kernel.compile(x, x, x, 4096, 4096, target="sm_90a", num_warps=4, BM=64, BN=64).asm["ptx"]
    assert _shared_accesses(ptx) == {store, load}
    assert ptx.count("bar.sync") == 2
    assert assemble(ptx, "sm_90a").spill_bytes == 0


@needs_ptxas
@pytest.mark.parametrize("dtype, accesses", [
    (torch.float64, {"st.shared.b64", "ld.shared.b64"}), (torch.int64, {"st.shared.b64", "ld.shared.b64"}),
])
def test_64_bit_conversions_stay_on_the_scalar_exchange(dtype, accesses):
    x = torch.empty(16, dtype=dtype)
    ptx = add_transposed_kernel.compile(x, x, x, 4096, 4096, target="sm_90a", num_warps=4, BM=64, BN=64).asm["ptx"]
    assert _shared_accesses(ptx) == accesses
    assert assemble(ptx, "sm_90a").spill_bytes == 0


@needs_ptxas
@pytest.mark.parametrize("block, num_warps", [((2, 64), 4), ((64, 2), 4), ((16, 16), 8), ((2, 2), 1)])
def test_tiny_and_replicated_tile_conversions_assemble(block, num_warps):
    x = torch.empty(16, dtype=torch.float16)
    ptx = add_transposed_kernel.compile(x, x, x, 4096, 4096, target="sm_90a", num_warps=num_warps, BM=block[0],
                                        BN=block[1]).asm["ptx"]
    assert _shared_accesses(ptx) == {"st.shared.b16", "ld.shared.b16"}
    assert assemble(ptx, "sm_90a").spill_bytes == 0


# -- finding: a loop-carried transposed pointer block ----------------------------------------------------

@needs_ptxas
def test_loop_carried_transposed_view_moves_16_byte_vectors():
    x = torch.empty(16, dtype=torch.float16)
    compiled = carried_transposed_kernel.compile(x, x, 4096, 4096, target="sm_90a", num_warps=4, BM=64, BN=64)
    function, report = pipelined_ir(carried_transposed_kernel, (x, x, 4096, 4096), dict(BM=64, BN=64), 4)
    (load,) = [op for op in function.walk() if op.opcode == OpCode.LOAD]
    info = report.analyses["analyze_pointers"][load.operands[0]]
    assert info.contiguity[0] == 64 and info.divisibility[0] == 16     # the facts are there
    ptx = compiled.asm["ptx"]
    assert "ld.global.b16" not in ptx
    assert len(re.findall(r"ld\.global\.v4\.b32", ptx)) == 4


# -- GPU tier ----------------------------------------------------------------------------------------------

def _gpu_tile(mode, m, n, stride, dtype, offset, generator):
    size = 4096 + offset
    x = (torch.randn(size, generator=generator, device="cuda").to(dtype) if dtype.is_floating_point else
         torch.randint(0, 2 if dtype == torch.bool else 7, (size,), generator=generator, device="cuda").to(dtype))
    x = x[offset:]
    out = poison(torch.empty(size, dtype=dtype, device="cuda"))[offset:]
    tile_kernel[(-(-m // 32), -(-n // 32))](out, x, m, n, stride, MODE=mode, BM=32, BN=32, num_warps=4)
    expected = poison(torch.empty(size, dtype=dtype, device="cuda"))[offset:]
    tile_kernel[(-(-m // 32), -(-n // 32))](expected, x, m, n, stride, MODE=mode, BM=32, BN=32, num_warps=4,
                                            interpret=True)
    return out, expected


@pytest.mark.cuda
@pytest.mark.parametrize("mode, m, n, stride, dtype, offset", [c[:6] for c in TILE_CASES])
def test_gpu_dim0_vectors_match_the_interpreter(mode, m, n, stride, dtype, offset, seed):
    generator = torch.Generator(device="cuda").manual_seed(seed)
    out, reference = _gpu_tile(mode, m, n, stride, dtype, offset, generator)
    # elements no program writes stay poisoned in both; compared bitwise (NaN included)
    assert torch.equal(out.view(torch.uint8), reference.view(torch.uint8))


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.int16, torch.int32, torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("block, num_warps, m, n", [((64, 64), 4, 200, 130), ((2, 64), 4, 5, 100),
                                                     ((64, 2), 4, 100, 5), ((16, 16), 8, 33, 17), ((2, 2), 1, 3, 3),
                                                     ((128, 64), 8, 256, 192)])
def test_gpu_conversions_match_torch(dtype, block, num_warps, m, n, seed):
    generator = torch.Generator(device="cuda").manual_seed(seed)
    if dtype.is_floating_point:
        x = torch.randn(m, n, generator=generator, device="cuda").to(dtype)
        y = torch.randn(n, m, generator=generator, device="cuda").to(dtype)
    else:
        x = torch.randint(-1000, 1000, (m, n), generator=generator, device="cuda").to(dtype)
        y = torch.randint(-1000, 1000, (n, m), generator=generator, device="cuda").to(dtype)
    out = poison(torch.empty(m, n, dtype=dtype, device="cuda"))
    grid = (-(-m // block[0]), -(-n // block[1]))
    add_transposed_kernel[grid](out, x, y, m, n, BM=block[0], BN=block[1], num_warps=num_warps)
    assert torch.equal(out, x + y.T)
