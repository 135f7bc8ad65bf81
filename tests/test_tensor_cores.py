"""CPU tier of the tensor-core path: layout choice, the ldmatrix plan, and a simulation of the whole
mma lowering (tile stores -> shared memory -> ldmatrix -> mma.sync fragments) against A @ B.

The simulation executes the plans codegen emits (`codegen.mma.tile_store_groups`, `OperandLoader`'s
ldmatrix plan, `mma_schedule`) with the PTX ISA's definitions of ldmatrix and of the m16n8k16
fragments, written here independently as formulas (PTX ISA 9.7.14.5.8 and 9.7.14.5.15).
"""

from __future__ import annotations

import numpy as np
import pytest

import fusedops.dsl as dsl
from fusedops.dsl.codegen.mma import OperandLoader, mma_schedule, operand_tile, tile_store_groups
from fusedops.dsl.ir import OpCode
from fusedops.dsl.language.dtypes import float16
from fusedops.dsl.layouts import mma_accumulator, mma_operand_a, mma_operand_b
from fusedops.dsl.layouts.banks import phase_wavefronts
from fusedops.dsl.layouts.mma_shared import ldmatrix_plan, mma_operand_shared, simulate_ldmatrix
from fusedops.dsl.passes.dot_layouts import mma_warps
from fusedops.dsl.passes.layout_assignment import assign_layouts
from fusedops.dsl.passes.simplify import simplify
from codegen_helpers import source_layout, vector_accesses


def _ptx_a(lane, i):
    return (lane >> 2) + 8 * ((i >> 1) & 1), 2 * (lane % 4) + (i & 1) + 8 * (i >> 2)


def _ptx_b(lane, i):
    return 2 * (lane % 4) + (i & 1) + 8 * (i >> 1), lane >> 2


def _ptx_c(lane, i):
    return (lane >> 2) + 8 * (i >> 1), 2 * (lane % 4) + (i & 1)


def _stage_and_load(values, shape, source, operand, num_warps):
    """Registers of `operand` after storing `values` (block in `source`) into the staging tile and
    reading it with the ldmatrix plan: {(register, lane, warp): value}."""
    shared = operand_tile(shape, source, float16)
    width, groups, lanes, warps = tile_store_groups(source, shared, 16)
    memory = {}
    for warp, lane, first, address in vector_accesses(groups, lanes, warps, num_warps):
        assert address % (2 * width) == 0, "misaligned vector store"
        for i in range(width):
            coords = source.apply(register=first + i, lane=lane, warp=warp)
            assert memory.setdefault(address // 2 + i, coords) == coords
    assert len(memory) == shape[0] * shape[1]
    plan = OperandLoader(operand, shared, float16).plan
    out = {}
    for warp in range(num_warps):
        for instruction in plan.instructions:
            for q, register in enumerate(instruction.registers):
                rows = [instruction.offset ^ plan.lane_offset(8 * q + r) ^ plan.warp_offset(warp) for r in range(8)]
                for lane in range(32):
                    for half in range(2):
                        row, col = (2 * (lane % 4) + half, lane // 4) if plan.trans else (lane // 4, 2 * (lane % 4) + half)
                        out[(register + half, lane, warp)] = values[memory[rows[row] + col]]
    return out


_CASES = [  # (M, N, K, num_warps)
    (16, 8, 16, 1), (16, 16, 16, 4), (64, 64, 32, 4), (32, 64, 64, 2), (128, 64, 32, 8), (64, 128, 16, 8),
]


@pytest.mark.parametrize("a_contiguous,b_contiguous", [(1, 1), (0, 1), (1, 0), (0, 0)])
@pytest.mark.parametrize("m,n,k,num_warps", _CASES)
def test_simulated_mma_lowering_computes_a_times_b(m, n, k, num_warps, a_contiguous, b_contiguous, seed):
    rng = np.random.default_rng(seed)
    a = rng.integers(-4, 5, size=(m, k)).astype(np.float64)
    b = rng.integers(-4, 5, size=(k, n)).astype(np.float64)
    warps = mma_warps((m, n), num_warps)
    layout_a, layout_b = mma_operand_a((m, k), warps), mma_operand_b((k, n), warps)
    layout_acc = mma_accumulator((m, n), warps)
    a_regs = _stage_and_load(a, (m, k), source_layout((m, k), a_contiguous, num_warps), layout_a, num_warps)
    b_regs = _stage_and_load(b, (k, n), source_layout((k, n), b_contiguous, num_warps), layout_b, num_warps)
    for (register, lane, warp), value in a_regs.items():     # ldmatrix gave exactly the operand layout
        assert value == a[layout_a.apply(register=register, lane=lane, warp=warp)]
    acc = {(r, lane, w): 0.0 for r in range(layout_acc.num_registers) for lane in range(32) for w in range(num_warps)}
    for _, a_registers, b_registers, acc_registers in mma_schedule(m, n, k, num_warps):
        for warp in range(num_warps):        # one mma.sync per warp, by the PTX fragment definitions
            tile_a, tile_b, tile_c = np.zeros((16, 16)), np.zeros((16, 8)), np.zeros((16, 8))
            for lane in range(32):
                for e in range(8):
                    tile_a[_ptx_a(lane, e)] = a_regs[(a_registers[e], lane, warp)]
                for e in range(4):
                    tile_b[_ptx_b(lane, e)] = b_regs[(b_registers[e], lane, warp)]
                    tile_c[_ptx_c(lane, e)] = acc[(acc_registers[e], lane, warp)]
            tile_d = tile_a @ tile_b + tile_c
            for lane in range(32):
                for e in range(4):
                    acc[(acc_registers[e], lane, warp)] = tile_d[_ptx_c(lane, e)]
    expected = a @ b
    for (register, lane, warp), value in acc.items():
        assert value == expected[layout_acc.apply(register=register, lane=lane, warp=warp)]


@pytest.mark.parametrize("shape,warps,operand", [((128, 32), (2, 2), "a"), ((32, 128), (2, 2), "b"),
                                                 ((64, 64), (1, 8), "b"), ((16, 16), (4, 1), "a"),
                                                 ((128, 64), (2, 4), "a"), ((64, 256), (2, 4), "b")])
@pytest.mark.parametrize("contiguous", [0, 1])
def test_ldmatrix_plan_is_exact_aligned_and_conflict_free(shape, warps, operand, contiguous):
    layout = (mma_operand_a if operand == "a" else mma_operand_b)(shape, warps)
    shared = mma_operand_shared(shape, 16, contiguous)
    plan = ldmatrix_plan(layout, shared)
    k_dim = 1 if operand == "a" else 0
    assert plan.trans == (contiguous != k_dim)
    for warp in range(layout.num_warps):
        simulated = simulate_ldmatrix(plan, shared, warp)
        assert len(simulated) == layout.num_registers * 32
        for (register, lane), coords in simulated.items():
            assert layout.apply(register=register, lane=lane, warp=warp) == coords
    for instruction in plan.instructions:   # every 8-row matrix is one conflict-free 128-byte wavefront
        for q in range(plan.count):
            rows = [2 * (instruction.offset ^ plan.lane_offset(8 * q + r)) for r in range(8)]
            assert all(row % 16 == 0 for row in rows)
            assert phase_wavefronts(rows, 16) == (1, 1)
        assert {instruction.offset} and 0 <= instruction.k_slice < shape[k_dim] // 16
    slices = [i.k_slice for i in plan.instructions]
    assert sorted(set(slices)) == list(range(shape[k_dim] // 16))


def test_mma_warps_prefers_square_warp_tiles():
    assert mma_warps((128, 128), 4) == (2, 2)
    assert mma_warps((128, 256), 8) == (2, 4)
    assert mma_warps((64, 64), 4) == (2, 2)
    assert mma_warps((16, 8), 4) == (4, 1)          # one tile: the other warps hold copies
    assert mma_warps((16, 64), 4) == (1, 4)
    assert mma_warps((256, 16), 8) == (8, 1)


@dsl.jit
def _dot_kernel(a_ptr, b_ptr, c_ptr, M: dsl.constexpr, N: dsl.constexpr, K: dsl.constexpr):
    rm, rn, rk = dsl.arange(0, M), dsl.arange(0, N), dsl.arange(0, K)
    a = dsl.load(a_ptr + rm[:, None] * K + rk[None, :])
    b = dsl.load(b_ptr + rk[:, None] * N + rn[None, :])
    acc = dsl.zeros((M, N), dsl.float32)
    for _ in range(2):
        acc = dsl.dot(a, b, acc)
    dsl.store(c_ptr + rm[:, None] * N + rn[None, :], acc)


def _laid_out(dtype, arch, m=32, n=32, k=32, num_warps=4):
    p, f = dsl.pointer_type(dtype), dsl.pointer_type(dsl.float32)
    function = dsl.jit(_dot_kernel.fn).ir(p, p, f, M=m, N=n, K=k)   # a fresh IR: the passes mutate it
    simplify(function)
    assign_layouts(function, num_warps, arch)
    return function


@pytest.mark.parametrize("dtype", [dsl.float16, dsl.bfloat16])
def test_fp16_dot_on_sm80_gets_mma_layouts_and_a_carried_mma_accumulator(dtype):
    function = _laid_out(dtype, "sm_80")
    dots = [op for op in function.walk() if op.opcode == OpCode.DOT]
    assert len(dots) == 1 and dots[0].attrs["engine"] == "mma"
    dot = dots[0]
    warps = mma_warps((32, 32), 4)
    assert dot.operands[0].layout == mma_operand_a((32, 32), warps)
    assert dot.operands[1].layout == mma_operand_b((32, 32), warps)
    assert dot.result.layout == mma_accumulator((32, 32), warps)
    assert dot.operands[0].defining_op.attrs["dot_operand"] == 0
    assert dot.operands[1].defining_op.attrs["dot_operand"] == 1
    loop = next(op for op in function.walk() if op.opcode == OpCode.FOR)
    # the accumulator is carried in the mma layout: the only conversions in the loop are the operands'
    inside = [op for op in loop.regions[0].walk() if op.opcode == OpCode.CONVERT_LAYOUT]
    assert all("dot_operand" in op.attrs for op in inside)
    assert loop.regions[0].args[1].layout == dot.result.layout


@pytest.mark.parametrize("dtype,arch,shape", [(dsl.float32, "sm_90a", (32, 32, 32)), (dsl.float16, "sm_75", (32, 32, 32)),
                                              (dsl.float16, None, (32, 32, 32)), (dsl.float16, "sm_90a", (8, 32, 32)),
                                              (dsl.float16, "sm_90a", (32, 4, 32)), (dsl.float16, "sm_90a", (32, 32, 8))])
def test_fma_path_is_kept_for_fp32_old_targets_and_small_blocks(dtype, arch, shape):
    m, n, k = shape
    function = _laid_out(dtype, arch, m, n, k)
    dot = next(op for op in function.walk() if op.opcode == OpCode.DOT)
    assert "engine" not in dot.attrs
    assert not any("dot_operand" in op.attrs for op in function.walk())


# -- layout-assignment rules the matmul relies on (regression tests) --------------------------------------

@dsl.jit
def _epilogue_kernel(c_ptr, a_ptr, b_ptr, bias_ptr, stride_am, stride_ak, M: dsl.constexpr, N: dsl.constexpr,
                     K: dsl.constexpr):
    rm, rn, rk = dsl.arange(0, M), dsl.arange(0, N), dsl.arange(0, K)
    a = dsl.load(a_ptr + rm[:, None] * stride_am + rk[None, :] * stride_ak)
    b = dsl.load(b_ptr + rk[:, None] * N + rn[None, :])
    acc = dsl.dot(a, b, dsl.zeros((M, N), dsl.float32))
    acc = acc + dsl.load(bias_ptr + rn)[None, :]
    dsl.store(c_ptr + rm[:, None] * N + rn[None, :], acc.to(dsl.float16))


def _epilogue_ir(stride_am, stride_ak, arch="sm_90a"):
    p, f = dsl.pointer_type(dsl.float16), dsl.pointer_type(dsl.float32)
    function = dsl.jit(_epilogue_kernel.fn).ir(p, p, p, f, stride_am, stride_ak, M=64, N=64, K=32)
    simplify(function)
    assign_layouts(function, 4, arch)
    return function


def test_index_arithmetic_is_recomputed_per_layout_not_converted():
    function = _epilogue_ir(32, 1)
    converts = [op for op in function.walk() if op.opcode == OpCode.CONVERT_LAYOUT]
    # on sm_90a (wgmma) the stored accumulator goes to the store's blocked layout through a swizzled
    # tile (16-byte global stores; test_wgmma.py): that one conversion is meant
    (epilogue,) = [op for op in converts if op.attrs.get("swizzled")]
    assert epilogue.result.type.shape == (64, 64) and epilogue.result.type.element == dsl.float16
    converts.remove(epilogue)
    # only the two dot operands (to ldmatrix tiles) and the bias row (64 elements) move between layouts
    assert sorted(op.attrs.get("dot_operand", -1) for op in converts) == [-1, 0, 1]
    bias_convert = next(op for op in converts if "dot_operand" not in op.attrs)
    assert bias_convert.result.type.shape == (1, 64)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_accumulator_epilogue_stays_in_the_mma_layout(arch):
    function = _epilogue_ir(32, 1, arch)
    dot = next(op for op in function.walk() if op.opcode == OpCode.DOT)
    store = next(op for op in function.walk() if op.opcode == OpCode.STORE)
    stored = store.operands[1]
    if arch == "sm_90a":    # wgmma: the final value moves to the store's layout through a swizzled tile
        assert stored.defining_op.opcode == OpCode.CONVERT_LAYOUT and stored.defining_op.attrs["swizzled"]
        stored = stored.defining_op.operands[0]
    assert stored.layout == dot.result.layout       # bias re-broadcast; the epilogue runs in the mma layout


def test_transposed_operand_is_loaded_along_its_contiguous_dim():
    function = _epilogue_ir(1, 64)          # a is column-major: stride_am == 1 is specialized away
    load_a = next(op for op in function.walk() if op.opcode == OpCode.LOAD)
    registers = load_a.result.layout.bases_of("register")
    assert registers[0] == (1, 0) and registers[1] == (2, 0)    # vectors run along M, the contiguous dim
