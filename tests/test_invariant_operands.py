"""Loop-invariant wgmma operands copied into shared memory once (dot_layouts.wgmma_staged_a,
passes/invariant_operands.py).

The kernel loads A (and with PAIR a second tile C) once, before its loops, and accumulates A B_j (and
C B_j) over J tiles of B, in G passes of an outer loop (NESTED) and again in a second loop
(TWO_LOOPS, A only): o = ((G + TWO_LOOPS) A + 2 G C) sum_j B_j. On 8 warps a 64-row accumulator has its
warpgroups tile N, which register A cannot take, so A is read from shared memory: one cp.async copy
before the loops, one wait, the ring's local_load in place of a conversion per iteration, and the
buffer freed after the last loop that reads it. A load whose masked-off value is not 0 (OTHER) cannot
be a cp.async copy: its tile is staged from registers at each dot instead. With PAIR at 128 x 128 the
two accumulators (128 registers per thread) and A's fragment (32) fill the register budget (255 less
REGISTER_A_HEADROOM): A stays in
registers, C (32 more) goes to shared memory although its warpgroups tile M.

CPU tier: the IR on sm_90a, the register budget's choice, ptxas (no spills, no serialized wgmmas, no
st.shared in the loops of the copied forms), the interpreter against float64 (ragged shapes).
GPU tier (`-m cuda`): the compiled kernels against float64 with poisoned outputs, fp16 and bf16.
"""

from __future__ import annotations

import re

import pytest
import torch

import fusedops.dsl as dsl
from fusedops.dsl.ir import OpCode
from fusedops.dsl.passes import dot_layouts
from fusedops.dsl.passes.manager import run_pipeline
from fusedops.dsl.passes.pipeline import default_pipeline
from fusedops.dsl.target import assemble, ptxas_available
from helpers import assert_close, poison


@dsl.jit
def invariant_a_kernel(o_ptr, a_ptr, c_ptr, b_ptr, M, N, K, J, G, stride_am, stride_ak,
                       BLOCK_M: dsl.constexpr, BLOCK_N: dsl.constexpr, BLOCK_K: dsl.constexpr,
                       OTHER: dsl.constexpr, PAIR: dsl.constexpr, TWO_LOOPS: dsl.constexpr):
    # o_ptr: (M, N) float32; a_ptr, c_ptr: (M, K) with strides (stride_am, stride_ak); b_ptr: (J, K, N)
    # contiguous. Grid: cdiv(M, BLOCK_M). K <= BLOCK_K, N <= BLOCK_N (see the module docstring).
    rm = dsl.program_id(0) * BLOCK_M + dsl.arange(0, BLOCK_M)
    rn = dsl.arange(0, BLOCK_N)
    rk = dsl.arange(0, BLOCK_K)
    rows = (rm[:, None] < M) & (rk[None, :] < K)
    a = dsl.load(a_ptr + rm[:, None] * stride_am + rk[None, :] * stride_ak, mask=rows, other=OTHER)
    b_tile = b_ptr + rk[:, None] * N + rn[None, :]
    b_mask = (rk[:, None] < K) & (rn[None, :] < N)
    acc = dsl.zeros((BLOCK_M, BLOCK_N), dsl.float32)
    acc2 = dsl.zeros((BLOCK_M, BLOCK_N), dsl.float32)
    if PAIR:
        c = dsl.load(c_ptr + rm[:, None] * stride_am + rk[None, :] * stride_ak, mask=rows, other=0.0)
    for g in range(0, G):
        for j in range(0, J):
            acc = dsl.dot(a, dsl.load(b_tile + j * K * N, mask=b_mask, other=0.0), acc)
            if PAIR:
                acc2 = dsl.dot(c, dsl.load(b_tile + j * K * N, mask=b_mask, other=0.0), acc2)
    if TWO_LOOPS:
        for j in range(0, J):
            acc = dsl.dot(a, dsl.load(b_tile + j * K * N, mask=b_mask, other=0.0), acc)
    dsl.store(o_ptr + rm[:, None] * N + rn[None, :], acc + 2.0 * acc2, mask=(rm[:, None] < M) & (rn[None, :] < N))


# name -> (constexprs and launch, A stored transposed (M contiguous))
SMALL = dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=64)
VARIANTS = {
    "copied": (dict(SMALL, OTHER=0.0, PAIR=False, TWO_LOOPS=False), False),
    "transposed": (dict(SMALL, OTHER=0.0, PAIR=False, TWO_LOOPS=False), True),
    "two_loops": (dict(SMALL, OTHER=0.0, PAIR=True, TWO_LOOPS=True), False),
    "staged_each_dot": (dict(SMALL, OTHER=1.0, PAIR=False, TWO_LOOPS=False), False),
    "over_budget": (dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=128, OTHER=0.0, PAIR=True, TWO_LOOPS=False), False),
}
NUM_WARPS = 8


def _arguments(variant, m, n, k, j, device="cpu", dtype=torch.float16):
    generator = torch.Generator().manual_seed(m * 7919 + n * 31 + k + j)
    transposed = VARIANTS[variant][1]
    a, c = (torch.randn(m, k, generator=generator) for _ in range(2))
    if transposed:      # stored (K, M): A's rows are M-contiguous
        a, c = (t.t().contiguous().t() for t in (a, c))
    a, c = (t.to(device=device, dtype=dtype) for t in (a, c))
    b = torch.randn(j, k, n, generator=generator).to(device=device, dtype=dtype)
    o = poison(torch.empty(m, n, device=device, dtype=torch.float32))
    return o, a, c, b


def _launch_args(o, a, c, b, g):
    m, k = a.shape
    return (o, a, c, b, m, b.shape[2], k, b.shape[0], g, a.stride(0), a.stride(1))


def _reference(a, c, b, g, variant):
    constexprs = VARIANTS[variant][0]
    weights = a.double() * (g + (1 if constexprs["TWO_LOOPS"] else 0))    # (C is read by the nested loops only)
    if constexprs["PAIR"]:
        weights = weights + 2.0 * g * c.double()
    return (weights @ b.double().sum(0)).cpu()


# 112 rows, 40 and 56 columns: every row of A, A^T and B starts on a 16-byte boundary (cp.async copies 16
# bytes); at 100 rows or 50 columns they would not, and the tiles would be staged at each dot (the
# GPU tier runs both).
IR_SHAPE = (112, 56, 40, 3)


def _function(variant):
    o, a, c, b = _arguments(variant, *IR_SHAPE)
    function = dsl.jit(invariant_a_kernel.fn).ir(*_launch_args(o, a, c, b, 2), **VARIANTS[variant][0])
    run_pipeline(function, default_pipeline(NUM_WARPS, "sm_90a", num_stages=2))
    return function


def _loops(block):
    return [op for op in block.ops if op.opcode == OpCode.FOR]


@pytest.mark.parametrize("variant", ["copied", "transposed", "two_loops", "over_budget"])
def test_invariant_tiles_are_copied_once_before_the_loops(variant):
    function = _function(variant)
    top = function.body
    dots = [op for op in top.walk() if op.opcode == OpCode.DOT]
    assert dots and all(op.attrs.get("engine") == "wgmma" for op in dots)
    copied = dots[1:] if variant == "over_budget" else dots       # (over budget: A in registers, C copied)
    for dot in copied:
        a = dot.operands[0].defining_op
        assert a.opcode == OpCode.LOCAL_LOAD and a.parent is top, "A is the shared tile copied before the loops"
        alloc = a.operands[0].defining_op
        assert alloc.result.type.num_buffers == 1 and "swizzle_bytes" in alloc.attrs
    tiles = 2 if variant == "two_loops" else 1
    copies = [op for op in top.ops if op.opcode == OpCode.ASYNC_COPY      # (not a ring's prologue)
              and op.operands[0].defining_op.result.type.num_buffers == 1]
    assert len(copies) == tiles
    waits = [i for i, op in enumerate(top.ops) if op.opcode == OpCode.ASYNC_WAIT]
    loops = [i for i, op in enumerate(top.ops) if op.opcode == OpCode.FOR]
    assert len(waits) == 1, "one wait for the tiles"
    between = top.ops[waits[0] + 1:loops[0]]     # the tiles' local_loads, after the wait that lands them
    assert [op.opcode for op in between] == [OpCode.LOCAL_LOAD] * tiles
    assert top.ops[waits[0]].attrs == {"pending": 0, "proxy_fence": True}
    deallocs = {id(op.operands[0]): i for i, op in enumerate(top.ops) if op.opcode == OpCode.LOCAL_DEALLOC
                and op.operands[0].defining_op.result.type.num_buffers == 1}
    assert len(deallocs) == tiles
    for tile in [op for op in top.ops if op.opcode == OpCode.LOCAL_LOAD]:
        readers = [i for i in loops if any(tile.result in op.operands for op in top.ops[i].walk())]
        between = top.ops[readers[-1] + 1:deallocs[id(tile.operands[0])]]
        assert all(op.opcode in (OpCode.LOCAL_DEALLOC, OpCode.WGMMA_WAIT) for op in between), \
            "freed right after the last loop reading it"
    for loop in _loops(top):
        assert not any(op.opcode == OpCode.CONVERT_LAYOUT and op.attrs.get("dot_operand") == 0 for op in loop.walk())
    assert not any(op.attrs.get("hoisted") for op in top.walk())


def test_a_load_that_cannot_be_a_copy_is_staged_at_each_dot():
    function = _function("staged_each_dot")
    top = function.body
    dot = next(op for op in top.walk() if op.opcode == OpCode.DOT)
    convert = dot.operands[0].defining_op
    assert dot.attrs.get("engine") == "wgmma" and convert.opcode == OpCode.CONVERT_LAYOUT
    assert convert.parent is dot.parent and convert.attrs.get("dot_operand") == 0 and "hoisted" not in convert.attrs
    assert not any(op.opcode == OpCode.ASYNC_COPY for op in top.ops)


def _decisions(variant):
    o, a, c, b = _arguments(variant, 100, 50, 40, 3)
    function = dsl.jit(invariant_a_kernel.fn).ir(*_launch_args(o, a, c, b, 2), **VARIANTS[variant][0])
    dots = [op for op in function.body.walk() if op.opcode == OpCode.DOT]
    return [(dot_layouts.wgmma_register_a(d, "sm_90a", NUM_WARPS), dot_layouts.wgmma_staged_a(d, "sm_90a", NUM_WARPS))
            for d in dots]


def test_the_register_budget_picks_registers_or_shared_memory():
    # 64 rows on 8 warps: warpgroups tile N, so never register A
    assert _decisions("copied") == [(False, True)]
    # 128 x 128 with two products: 2 x 64 accumulator + 32 fragment registers fill the budget (255 less
    # REGISTER_A_HEADROOM), so A (first in program order) stays in registers and C goes to shared memory
    assert 160 <= 255 - dot_layouts.REGISTER_A_HEADROOM < 192
    assert _decisions("over_budget") == [(True, False), (False, True)]
    # one 128 x 128 product: 64 + 32 registers, A stays in registers
    o, a, c, b = _arguments("over_budget", 100, 50, 40, 3)
    constexprs = dict(VARIANTS["over_budget"][0], PAIR=False)
    function = dsl.jit(invariant_a_kernel.fn).ir(*_launch_args(o, a, c, b, 2), **constexprs)
    dot = next(op for op in function.body.walk() if op.opcode == OpCode.DOT)
    assert dot_layouts.wgmma_register_a(dot, "sm_90a", NUM_WARPS) and not dot_layouts.wgmma_staged_a(
        dot, "sm_90a", NUM_WARPS)
    # no loop invariance, no wgmma on sm_80
    assert not dot_layouts.wgmma_staged_a(dot, "sm_80", NUM_WARPS)


def _loop_bodies(ptx):
    from test_attention import _loop_bodies as bodies
    return bodies(ptx)


@pytest.mark.skipif(not ptxas_available(), reason="ptxas is not on the PATH")
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_ptx_assembles_without_spills_or_serialization(variant, tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    o, a, c, b = _arguments(variant, *IR_SHAPE)
    compiled = dsl.jit(invariant_a_kernel.fn).compile(*_launch_args(o, a, c, b, 2), target="sm_90a",
                                                      num_warps=NUM_WARPS, num_stages=2, **VARIANTS[variant][0])
    ptx = compiled.asm["ptx"]
    bodies = _loop_bodies(ptx)
    assert bodies and all("wgmma.mma_async" in body for body in bodies)
    staged = variant == "staged_each_dot"
    assert all(("st.shared" in body) == staged for body in bodies)
    register_a = len(re.findall(r"wgmma\.mma_async[^;]*\}, \{%r", ptx))
    if variant == "over_budget":      # A from registers (8 k-steps x 2 warpgroups' halves of N), C copied
        assert 0 < register_a < len(re.findall(r"wgmma\.mma_async", ptx))
    elif not staged:    # every wgmma of the loops reads A through a descriptor (no register A)
        assert register_a == 0
    result = assemble(ptx, "sm_90a")
    assert "serialized" not in result.log, result.log
    assert result.spill_bytes == 0, result.log


SHAPES = [(1, 1, 1, 1), (100, 50, 40, 3), (130, 64, 64, 2)]


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("m, n, k, j", SHAPES[:2])
def test_interpreter_against_float64(variant, m, n, k, j):
    o, a, c, b = _arguments(variant, m, n, k, j)
    grid = (dsl.cdiv(m, VARIANTS[variant][0]["BLOCK_M"]),)
    invariant_a_kernel[grid](*_launch_args(o, a, c, b, 2), interpret=True, **VARIANTS[variant][0])
    assert_close(o, _reference(a, c, b, 2, variant), dtype=torch.float32)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("m, n, k, j", SHAPES + [(1000, 33, 17, 5)])
def test_gpu_against_float64(variant, m, n, k, j, dtype):
    o, a, c, b = _arguments(variant, m, n, k, j, "cuda", dtype)
    constexprs = VARIANTS[variant][0]
    invariant_a_kernel[(dsl.cdiv(m, constexprs["BLOCK_M"]),)](*_launch_args(o, a, c, b, 2), num_warps=NUM_WARPS,
                                                              num_stages=2, **constexprs)
    torch.cuda.synchronize()
    assert_close(o, _reference(a, c, b, 2, variant), dtype=torch.float32)
