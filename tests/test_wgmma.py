"""The sm_90a warpgroup tensor-core path: `dot` on `wgmma.mma_async` with A and B read from shared
memory through matrix descriptors, fed by the cp.async pipeline.

CPU tier:
  - the matrix-descriptor encoding, bit by bit (PTX ISA 9.7.15.5.1.2.2);
  - a simulation of whole dots: the tile stores codegen emits (`tile_store_groups`, as cp.async and
    st.shared execute them) fill a model of shared memory, then every wgmma instruction of
    `codegen.wgmma.wgmma_plan` reads its A and B sub-tiles at the byte addresses the hardware
    derives from the descriptor, by the canonical layouts of PTX ISA 9.7.15.5.1.2.1.3 (CuTe form,
    then Swizzle<B,4,3> on the byte address) written here independently, and its results go to
    threads by the accumulator fragment of 9.7.15.5.1.1.1 (Figure 149); the registers must hold
    A @ B where the accumulator layout says;
  - the pipelining ring with a wgmma left in flight: no copy overwrites a slot a wgmma may still
    read, and the pipelined IR computes the same in the interpreter;
  - A from registers: the A fragment layout (`layouts.mma.wgmma_operand_a`) against the ISA's
    figure (every element once per warpgroup; the m64nNk16 accumulator of N = K is the same
    layout), and a simulated dot whose A registers go to the instructions `wgmma_plan` names;
  - PTX: the library matmul's sm_90a configs and a small dot kernel use wgmma.mma_async, fence,
    commit_group, wait_group and fence.proxy.async, and ptxas accepts them with 0 spill bytes;
    a dot whose A is computed in registers takes the register-A form with nothing staged for A;
    sm_80 / sm_90 / FUSEDOPS_DISABLE_WGMMA=1 keep mma.sync.
GPU tier (`-m cuda`, H200): dots against float64 at several tile shapes, both orientations of A and
B, ragged M/N/K, fp16 and bf16, many K iterations, the staged (non-cp.async) path, A from registers,
and HGMMA in SASS.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import fusedops.dsl as dsl
from fusedops.autograd.matmul_reference import reference
from fusedops.dsl.codegen.mma import tile_store_groups
from fusedops.dsl.codegen.wgmma import wgmma_plan
from fusedops.dsl.interpreter import Interpreter
from fusedops.dsl.ir import OpCode
from fusedops.dsl.layouts import default_blocked, wgmma_accumulator, wgmma_operand_a
from fusedops.dsl.layouts.mma_shared import (encode_wgmma_descriptor, wgmma_operand_shared,
                                             wgmma_operand_tile)
from fusedops.dsl.passes.dot_layouts import wgmma_instruction_n, wgmma_operand_layout
from fusedops.dsl.passes.manager import run_pipeline
from fusedops.dsl.passes.pipeline import default_pipeline
from fusedops.dsl.runtime.signature import specialize
from fusedops.dsl.target import assemble, ptxas_available
from fusedops.kernels import matmul as mm
from fusedops.kernels.matmul_configs import CONFIGS, MMA_CONFIGS, SMALL_CONFIG, WGMMA_CONFIGS
from fusedops.kernels.matmul_kernels import matmul_kernel
from codegen_helpers import compile_library_matmul, source_layout, vector_accesses, xor_bits
from helpers import assert_close, poison, random_tensor

needs_ptxas = pytest.mark.skipif(not ptxas_available(), reason="ptxas is not on the PATH")


# -- the descriptor ---------------------------------------------------------------------------------------

def _decode(descriptor: int) -> dict:
    """The fields of a wgmma matrix descriptor (PTX ISA 9.7.15.5.1.2.2), byte values."""
    return {"start": (descriptor & 0x3FFF) << 4, "lbo": (descriptor >> 16 & 0x3FFF) << 4,
            "sbo": (descriptor >> 32 & 0x3FFF) << 4, "base_offset": descriptor >> 49 & 7,
            "swizzle": {0: None, 1: 128, 2: 64, 3: 32}[descriptor >> 62 & 3],
            "reserved": descriptor & (3 << 14 | 3 << 30 | 7 << 46 | 0x3FF << 52)}


def test_descriptor_bits_follow_the_isa():
    # bits 0-13 start >> 4, 16-29 LBO >> 4, 32-45 SBO >> 4, 49-51 base offset, 62-63 swizzle mode
    assert encode_wgmma_descriptor(0x1230, 16, 1024, 128) == 0x123 | 1 << 16 | 64 << 32 | 1 << 62
    assert encode_wgmma_descriptor(0, 0, 0, None) == 0
    assert encode_wgmma_descriptor(0, 0, 0, 64) == 2 << 62 and encode_wgmma_descriptor(0, 0, 0, 32) == 3 << 62
    assert encode_wgmma_descriptor(0, 0, 0, 128, base_offset=5) == 5 << 49 | 1 << 62
    # the ISA's example "MN-major, 64B swizzling, bf16": LBO 256 * 2 bytes -> 32, SBO 512 * 2 -> 64
    assert encode_wgmma_descriptor(0, 512, 1024, 64) == 32 << 16 | 64 << 32 | 2 << 62
    # (x & 0x3FFFF) >> 4: shared addresses up to 256 KB
    assert _decode(encode_wgmma_descriptor(0x3FFF0, 0x3FFF0, 0x3FFF0, 32))["start"] == 0x3FFF0
    for bad in (8, 1 << 18, -16):
        with pytest.raises(ValueError, match="multiple of 16"):
            encode_wgmma_descriptor(bad, 16, 16, 128)


@pytest.mark.parametrize("operand,shape,contiguous,swizzle,mn_major,lbo,sbo", [
    (0, (128, 64), 1, 128, False, 16, 1024),       # A K-major: 128-byte rows
    (0, (64, 32), 1, 64, False, 16, 512),          # A K-major, BLOCK_K = 32: 64-byte swizzle
    (0, (64, 16), 1, 32, False, 16, 256),          # A K-major, BLOCK_K = 16
    (0, (128, 64), 0, 128, True, 64 * 128, 1024),  # A M-major (A^T in memory): atoms of 64 rows along M
    (1, (64, 256), 1, 128, True, 64 * 128, 1024),  # B N-major (row-major B)
    (1, (32, 32), 1, 64, True, 32 * 64, 512),      # B N-major, N = 32
    (1, (64, 128), 0, 128, False, 16, 1024),       # B K-major (B = W^T, nn.Linear)
])
def test_operand_tile_parameters(operand, shape, contiguous, swizzle, mn_major, lbo, sbo):
    tile = wgmma_operand_tile(wgmma_operand_shared(shape, 16, contiguous, swizzle), operand)
    assert (tile.swizzle_bytes, tile.mn_major, tile.leading_byte_offset, tile.stride_byte_offset) == \
        (swizzle, mn_major, lbo, sbo)
    assert tile.tile_bytes % tile.pattern_bytes == 0


def test_operand_tile_rejects_other_layouts():
    from fusedops.dsl.layouts.mma_shared import mma_operand_shared
    with pytest.raises(ValueError, match="not a canonical wgmma tile"):
        wgmma_operand_tile(mma_operand_shared((64, 128), 16, 1), 0)     # 256-byte rows: one XOR pattern
    with pytest.raises(ValueError, match="16-bit"):
        wgmma_operand_tile(wgmma_operand_shared((64, 64), 16, 1, 128), 0, element_bits=32)
    tile = wgmma_operand_tile(wgmma_operand_shared((128, 64), 16, 1, 128), 0)
    with pytest.raises(ValueError, match="cannot start"):
        tile.byte_offset((4, 0))            # not on an 8-row boundary


# -- an independent model of what wgmma reads ---------------------------------------------------------------

_T = 8      # 16-bit elements per 16 bytes (PTX ISA: T = 128 / sizeof-elements-in-bits)


def _hardware_addresses(descriptor: int, mn_major: bool, mn_extent: int) -> dict:
    """{(mn, k): byte address} that one wgmma.m64nNk16 reads for element (mn, k) of its A (mn = m,
    64 of them) or B (mn = n) sub-tile, k < 16, by the canonical layouts of PTX ISA
    9.7.15.5.1.2.1.3 (in elements, T = 8):
        K-major  ((8,m),(T,2)) : ((S/16*T, SBO), (1, T))
        MN-major ((T,S/16,m),(8,2)) : ((1, T, LBO), (S/16*T, SBO))
    then Swizzle<log2(S/16), 4, 3> on the byte address: bits 4.. ^= bits 7.. ."""
    fields = _decode(descriptor)
    assert fields["reserved"] == 0 and fields["base_offset"] == 0
    swizzle = fields["swizzle"]
    atoms = swizzle // 16                   # 16-byte chunks per swizzle row
    lbo, sbo = fields["lbo"] // 2, fields["sbo"] // 2
    out = {}
    for mn in range(mn_extent):
        for k in range(16):
            if mn_major:
                t, c, mi = mn % _T, mn // _T % atoms, mn // (_T * atoms)
                r, kj = k % 8, k // 8
                offset = t + c * _T + mi * lbo + r * atoms * _T + kj * sbo
            else:
                r, mi = mn % 8, mn // 8
                t, kj = k % _T, k // _T
                offset = r * atoms * _T + mi * sbo + t + kj * _T
            address = fields["start"] + 2 * offset
            address ^= (address >> 7 & atoms - 1) << 4
            out[(mn, k)] = address
    return out


def _fragment(lane: int, warp_in_group: int, d: int) -> tuple:
    """(row, col) of accumulator register d of a thread in a 64 x N wgmma tile (PTX ISA Figure 149)."""
    return (16 * warp_in_group + lane // 4 + 8 * (d >> 1 & 1), 8 * (d >> 2) + 2 * (lane % 4) + (d & 1))


def _store(memory: dict, values, source, shared, base: int, num_warps: int, width=None) -> None:
    """Execute the tile stores of codegen (`tile_store_groups`: cp.async / st.shared, `width`
    elements each) of `values` (a block in layout `source`) into the tile at byte `base`."""
    width, groups, lanes, warps = tile_store_groups(source, shared, 16, width)
    for warp, lane, first, offset in vector_accesses(groups, lanes, warps, num_warps):
        address = base + offset
        assert address % (2 * width) == 0, "misaligned vector store"
        for i in range(width):
            coords = source.apply(register=first + i, lane=lane, warp=warp)
            assert memory.setdefault(address + 2 * i, values[coords]) == values[coords]


def _simulate_dot(a, b, m, n, k, num_warps, a_contiguous, b_contiguous, a_base=3 * 1024):
    """Registers {(register, lane, warp): value} after the wgmma lowering of acc = a @ b (acc = 0),
    and the accumulator layout. The A tile starts at byte `a_base`, B 2 KB after A."""
    bases = (a_base, a_base + 2 * m * k + 2048)
    instr_n = wgmma_instruction_n((m, n), num_warps)
    tile_a = wgmma_operand_layout((m, k), 16, 0, source_layout((m, k), a_contiguous, num_warps), 64)
    tile_b = wgmma_operand_layout((k, n), 16, 1, source_layout((k, n), b_contiguous, num_warps), instr_n)
    accumulator = wgmma_accumulator((m, n), num_warps, instr_n)
    plan = wgmma_plan(tile_a, tile_b, accumulator)
    memory = {}
    _store(memory, a, source_layout((m, k), a_contiguous, num_warps), tile_a, bases[0], num_warps)
    _store(memory, b, source_layout((k, n), b_contiguous, num_warps), tile_b, bases[1], num_warps)
    assert len(memory) == m * k + k * n
    per_instruction = plan.instr_n // 2
    acc = {}
    for group in range(num_warps // 4):
        # the descriptor as codegen computes it: fields | (base >> 4 & 0x3FFF) + warpgroup + instruction
        group_a = xor_bits(plan.a_warp_offsets, group) >> 4
        group_b = xor_bits(plan.b_warp_offsets, group) >> 4
        desc_a = plan.a.descriptor_fields() | ((bases[0] >> 4 & 0x3FFF) + group_a)
        desc_b = plan.b.descriptor_fields() | ((bases[1] >> 4 & 0x3FFF) + group_b)
        for instruction in plan.instructions:
            reads_a = _hardware_addresses(desc_a + (instruction.a_offset >> 4), plan.a.mn_major, 64)
            reads_b = _hardware_addresses(desc_b + (instruction.b_offset >> 4), plan.b.mn_major, plan.instr_n)
            sub_a = np.array([[memory[reads_a[(r, kk)]] for kk in range(16)] for r in range(64)])
            sub_b = np.array([[memory[reads_b[(c, kk)]] for c in range(plan.instr_n)] for kk in range(16)])
            _accumulate(acc, sub_a @ sub_b, instruction, group, per_instruction)
    return acc, accumulator


_DOT_CASES = [  # (M, N, K, num_warps)
    (64, 64, 64, 4), (64, 16, 16, 4), (128, 128, 64, 4), (128, 128, 32, 8), (64, 128, 32, 8),
    (128, 256, 64, 8), (256, 128, 64, 8), (64, 32, 128, 4),
]


@pytest.mark.parametrize("a_contiguous,b_contiguous", [(1, 1), (0, 1), (1, 0), (0, 0)],
                         ids=["A-kmajor,B-nmajor", "A-mmajor,B-nmajor", "A-kmajor,B-kmajor", "A-mmajor,B-kmajor"])
@pytest.mark.parametrize("m,n,k,num_warps", _DOT_CASES, ids=lambda v: str(v))
def test_simulated_wgmma_lowering_computes_a_times_b(m, n, k, num_warps, a_contiguous, b_contiguous, seed):
    if (m, n, k) == (256, 128, 64) and (a_contiguous, b_contiguous) != (1, 1):
        pytest.skip("the largest case runs in one orientation (CPU time)")
    rng = np.random.default_rng(seed)
    a = rng.integers(-4, 5, size=(m, k)).astype(np.float64)
    b = rng.integers(-4, 5, size=(k, n)).astype(np.float64)
    acc, layout = _simulate_dot(a, b, m, n, k, num_warps, a_contiguous, b_contiguous)
    assert len(acc) == layout.num_registers * 32 * num_warps
    expected = a @ b
    for (register, lane, warp), value in acc.items():
        assert value == expected[layout.apply(register=register, lane=lane, warp=warp)]


def test_simulation_notices_a_tile_off_its_swizzle_pattern(seed):
    """The model is sensitive to what the 1024-byte alignment of the tiles buys: a 128-byte
    swizzled tile starting 128 bytes off a pattern boundary reads the wrong elements."""
    rng = np.random.default_rng(seed)
    a = rng.integers(-4, 5, size=(64, 64)).astype(np.float64)
    b = rng.integers(-4, 5, size=(64, 64)).astype(np.float64)
    acc, layout = _simulate_dot(a, b, 64, 64, 64, 4, 1, 1, a_base=3 * 1024 + 128)
    expected = a @ b
    assert any(value != expected[layout.apply(register=r, lane=lane, warp=w)] for (r, lane, w), value in acc.items())


# -- A from registers ----------------------------------------------------------------------------------------

def _a_fragment(lane: int, warp_in_group: int, e: int) -> tuple:
    """(row, col) of element a_e (e < 8; a0..a3 as .f16x2 pairs) of a thread in the 64x16 A sub-tile of
    wgmma.m64nNk16 from registers (PTX ISA 9.7.15.5.1.1.1, the A fragment figure)."""
    return (16 * warp_in_group + lane // 4 + 8 * (e >> 1 & 1), 2 * (lane % 4) + (e & 1) + 8 * (e >> 2))


@pytest.mark.parametrize("m,k,n,num_warps", [(64, 16, 64, 4), (64, 64, 64, 4), (128, 64, 64, 8), (128, 128, 64, 4),
                                             (256, 32, 128, 8), (64, 32, 64, 8)], ids=str)
def test_register_a_fragment_follows_the_isa(m, k, n, num_warps):
    instr_n = wgmma_instruction_n((m, n), num_warps)
    layout = wgmma_operand_a((m, k), num_warps, instr_n, n)
    groups_m = max(1, min(num_warps // 4, m // 64))
    owners = {}
    for warp in range(num_warps):
        group, warp_in_group = divmod(warp, 4)
        for lane in range(32):
            for register in range(layout.num_registers):
                row, col = layout.apply(register=register, lane=lane, warp=warp)
                # register a + 8 * (kk + repK * i): element a of the 64x16 tile (i, kk) of its warpgroup
                e, kk, i = register % 8, register // 8 % (k // 16), register // 8 // (k // 16)
                frag_row, frag_col = _a_fragment(lane, warp_in_group, e)
                assert (row, col) == (64 * (group % groups_m) + 64 * groups_m * i + frag_row, 16 * kk + frag_col)
                owners.setdefault((group, row, col), []).append((warp, lane, register))
    # every element once per warpgroup; warpgroups tiling M own disjoint rows, others hold copies
    assert all(len(v) == 1 for v in owners.values())
    assert len(owners) == m * k * (num_warps // 4) // groups_m


@pytest.mark.parametrize("m,n,num_warps", [(64, 64, 4), (128, 64, 8), (128, 128, 8), (128, 32, 4), (256, 64, 8)],
                         ids=str)
def test_accumulator_is_the_next_register_a(m, n, num_warps):
    """The m64nNk16 .f32 accumulator of an (M, N) dot whose warpgroups tile M, cast to 16 bits, is
    already the A fragment of a dot with K = N (FlashAttention-3's P @ V): the same linear layout."""
    instr_n = wgmma_instruction_n((m, n), num_warps)
    assert instr_n == n
    assert wgmma_operand_a((m, n), num_warps, instr_n, 64) == wgmma_accumulator((m, n), num_warps, instr_n)


def _accumulate(acc: dict, product, instruction, group: int, per_instruction: int) -> None:
    """Add one instruction tile's `product` into `acc` ({(register, lane, warp): value}), each element
    at the accumulator fragment register of its thread in warpgroup `group`."""
    for warp_in_group in range(4):
        for lane in range(32):
            for d in range(per_instruction):
                key = (instruction.first_register + d, lane, 4 * group + warp_in_group)
                acc[key] = acc.get(key, 0) + product[_fragment(lane, warp_in_group, d)]


def _simulate_register_a_dot(a, b, m, n, k, num_warps, b_contiguous, b_base=2048):
    """Registers after the wgmma lowering of acc = a @ b with A from registers: each instruction
    takes the thread's registers `plan.instructions[i].a_registers` as a0..a7, which the hardware
    reads as the A fragment figure says (`_a_fragment`)."""
    instr_n = wgmma_instruction_n((m, n), num_warps)
    a_layout = wgmma_operand_a((m, k), num_warps, instr_n, n)
    tile_b = wgmma_operand_layout((k, n), 16, 1, source_layout((k, n), b_contiguous, num_warps), instr_n)
    accumulator = wgmma_accumulator((m, n), num_warps, instr_n)
    plan = wgmma_plan(a_layout, tile_b, accumulator)
    assert plan.a is None and all(len(i.a_registers) == 8 for i in plan.instructions)
    memory = {}
    _store(memory, b, source_layout((k, n), b_contiguous, num_warps), tile_b, b_base, num_warps)
    per_instruction = plan.instr_n // 2
    acc = {}
    for group in range(num_warps // 4):
        desc_b = plan.b.descriptor_fields() | ((b_base >> 4 & 0x3FFF) + (xor_bits(plan.b_warp_offsets, group) >> 4))
        for instruction in plan.instructions:
            sub_a = np.zeros((64, 16))
            for warp_in_group in range(4):
                warp = 4 * group + warp_in_group
                for lane in range(32):
                    for e, register in enumerate(instruction.a_registers):
                        sub_a[_a_fragment(lane, warp_in_group, e)] = a[a_layout.apply(register=register, lane=lane,
                                                                                       warp=warp)]
            reads_b = _hardware_addresses(desc_b + (instruction.b_offset >> 4), plan.b.mn_major, plan.instr_n)
            sub_b = np.array([[memory[reads_b[(c, kk)]] for c in range(plan.instr_n)] for kk in range(16)])
            _accumulate(acc, sub_a @ sub_b, instruction, group, per_instruction)
    return acc, accumulator


@pytest.mark.parametrize("b_contiguous", [1, 0], ids=["B-nmajor", "B-kmajor"])
@pytest.mark.parametrize("m,n,k,num_warps", [(64, 64, 64, 4), (128, 64, 64, 8), (128, 128, 32, 8), (128, 32, 64, 4)],
                         ids=str)
def test_simulated_register_a_wgmma_computes_a_times_b(m, n, k, num_warps, b_contiguous, seed):
    rng = np.random.default_rng(seed)
    a = rng.integers(-4, 5, size=(m, k)).astype(np.float64)
    b = rng.integers(-4, 5, size=(k, n)).astype(np.float64)
    acc, layout = _simulate_register_a_dot(a, b, m, n, k, num_warps, b_contiguous)
    assert len(acc) == layout.num_registers * 32 * num_warps
    expected = a @ b
    for (register, lane, warp), value in acc.items():
        assert value == expected[layout.apply(register=register, lane=lane, warp=warp)]


# -- the epilogue: accumulator -> blocked through a swizzled tile ------------------------------------------

@pytest.mark.parametrize("shape,num_warps", [((128, 256), 8), ((256, 128), 8), ((128, 128), 4), ((64, 64), 4),
                                             ((64, 16), 4)], ids=str)
@pytest.mark.parametrize("bits", [16, 32])
def test_swizzled_exchange_moves_every_element_without_bank_conflicts(shape, num_warps, bits):
    """Execute the epilogue's stores (`tile_store_groups`, from the wgmma accumulator) and loads
    (`tile_load_groups`, into the blocked layout the global store uses) on a model of shared memory:
    every target register gets its element, accesses are aligned vectors, and the chosen swizzle
    costs the ideal number of wavefronts on both sides (no bank conflicts)."""
    from fusedops.dsl.codegen.swizzled_exchange import exchange_tile, tile_load_groups
    from fusedops.dsl.layouts.swizzle import choose_swizzle
    source = wgmma_accumulator(shape, num_warps, wgmma_instruction_n(shape, num_warps))
    target = default_blocked(shape, num_warps, bits)
    tile = exchange_tile(source, target, bits)
    size = bits // 8
    memory = {}
    width, groups, lanes, warps = tile_store_groups(source, tile, bits)
    for warp, lane, first, address in vector_accesses(groups, lanes, warps, num_warps):
        assert address % (width * size) == 0
        for i in range(width):
            coords = source.apply(register=first + i, lane=lane, warp=warp)
            assert memory.setdefault(address + size * i, coords) == coords
    assert len(memory) == shape[0] * shape[1] and max(memory) < shape[0] * shape[1] * size
    width, groups, lanes, warps = tile_load_groups(target, tile, bits)
    assert width * size == 16, "the blocked side should read 16-byte vectors"
    for warp, lane, first, address in vector_accesses(groups, lanes, warps, num_warps):
        assert address % (width * size) == 0
        for i in range(width):
            assert memory[address + size * i] == target.apply(register=first + i, lane=lane, warp=warp)
    choice = choose_swizzle(source, target, bits)
    assert choice.layout == tile
    for cost in (choice.store, choice.load):
        assert cost.wavefronts == cost.ideal_wavefronts, cost


# -- the pipelining ring ------------------------------------------------------------------------------------

def _matmul_ir(m, n, k, arch, num_stages, a=None, b=None, block=(64, 32, 32), num_warps=4):
    x = torch.empty(16, dtype=torch.float16)
    a = x if a is None else a
    b = x if b is None else b
    strides_a = (a.stride(0), a.stride(1)) if a.dim() == 2 else (k, 1)
    strides_b = (b.stride(0), b.stride(1)) if b.dim() == 2 else (n, 1)
    c = x if a.dim() != 2 else poison(torch.empty(m, n, dtype=torch.float16))
    args = (c, a, b, c, m, n, k, 0, *strides_a, 0, *strides_b, 0, n, 1, 0)
    kwargs = dict(HAS_BIAS=False, ACTIVATION=None, ACC=dsl.float32, BLOCK_M=block[0], BLOCK_N=block[1],
                  BLOCK_K=block[2], GROUP_M=1)
    kernel = dsl.jit(matmul_kernel.fn)
    function = kernel.ir(*args, **kwargs)
    run_pipeline(function, default_pipeline(num_warps, arch, num_stages=num_stages))
    values = kernel._bind(args, kwargs)
    runtime = [v for v, spec in zip(values, specialize(kernel.__name__, kernel.params, values)) if spec.is_runtime]
    return function, runtime, c


def _constant(value):
    return value.defining_op.attrs["value"]


def _ring_schedule(function) -> tuple:
    """(prologue groups, first read slot, first write slot, async_wait pending, dot pending, S)."""
    top = function.body.ops
    loop = next(op for op in top if op.opcode == OpCode.FOR)
    prologue = sum(op.opcode == OpCode.ASYNC_COMMIT for op in top[:top.index(loop)])
    body = loop.regions[0]
    wait = next(op for op in body.ops if op.opcode == OpCode.ASYNC_WAIT)
    dot = next(op for op in body.ops if op.opcode == OpCode.DOT)
    stages = next(op for op in top if op.opcode == OpCode.LOCAL_ALLOC).result.type.num_buffers
    read, write = (_constant(v) for v in loop.operands[-2:])
    return prologue, read, write, wait.attrs["pending"], dot.attrs.get("pending", 0), stages


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("num_stages", [2, 3, 4, 5])
def test_ring_never_overwrites_a_slot_in_use(arch, num_stages):
    """Iteration j: wait (its tile landed: all groups but the newest `pending` retired), barrier
    (every thread passed iteration j-1, so only the wgmmas of iterations >= j - dot_pending may
    still read), copy into the write slot, dot on the read slot. The write slot must hold neither a
    tile still to be read (j .. j + prologue - 1) nor one an in-flight wgmma reads."""
    function, _, _ = _matmul_ir(512, 512, 512, arch, num_stages)
    prologue, read, write, pending, dot_pending, stages = _ring_schedule(function)
    assert stages == num_stages
    if arch == "sm_90a" and num_stages >= 3:
        assert dot_pending == 1 and prologue == num_stages - 2, "the wgmma should stay in flight"
        assert any(op.opcode == OpCode.WGMMA_WAIT for op in function.body.ops)
    for j in range(3 * num_stages + 5):
        retired = prologue + j - pending          # groups = prologue + j: iterations < retired landed
        assert j < retired, f"iteration {j} reads a tile whose copy may not have landed"
        assert (read + j) % num_stages == j % num_stages
        written = (write + j) % num_stages
        assert written == (j + prologue) % num_stages, "the copy goes to the slot its iteration reads"
        in_use = {i % num_stages for i in range(j - dot_pending, j + prologue)}
        assert written not in in_use, f"iteration {j} overwrites slot {written} while it is in use"


def test_pipelined_wgmma_ir_has_the_fences_and_waits():
    function, _, _ = _matmul_ir(512, 512, 512, "sm_90a", 4)
    top = [op.opcode for op in function.body.ops]
    assert top.index(OpCode.FOR) < top.index(OpCode.WGMMA_WAIT) < top.index(OpCode.LOCAL_DEALLOC)
    allocs = [op for op in function.body.ops if op.opcode == OpCode.LOCAL_ALLOC]
    assert [op.attrs for op in allocs] == [{"contiguous_dim": 1, "swizzle_bytes": 64}] * 2
    loop = next(op for op in function.body.ops if op.opcode == OpCode.FOR)
    wait = loop.regions[0].ops[0]
    assert wait.opcode == OpCode.ASYNC_WAIT and wait.attrs == {"pending": 1, "proxy_fence": True}
    dot = next(op for op in loop.regions[0].ops if op.opcode == OpCode.DOT)
    assert dot.attrs["engine"] == "wgmma" and dot.attrs["pending"] == 1
    assert all(v.defining_op.opcode == OpCode.LOCAL_LOAD for v in dot.operands[:2])


@pytest.mark.parametrize("m,n,k,num_stages,transposed", [
    (70, 32, 96, 4, False), (64, 32, 160, 3, True), (65, 40, 96, 5, False), (64, 32, 0, 4, False),
    (100, 48, 64, 2, True),
])
def test_pipelined_wgmma_ir_computes_the_same_in_the_interpreter(m, n, k, num_stages, transposed, seed):
    """The interpreter's cp.async model lands a copy only when a wait retires its group (NaN
    poison otherwise), so a wrong ring index or wait count shows here."""
    a = random_tensor((m, k), torch.float16, seed=seed)
    b = random_tensor((n, k), torch.float16, seed=seed + 1).t() if transposed else \
        random_tensor((k, n), torch.float16, seed=seed + 1)
    function, runtime, c = _matmul_ir(m, n, k, "sm_90a", num_stages, a, b)
    assert any(op.opcode == OpCode.DOT and op.attrs.get("engine") == "wgmma" for op in function.walk())
    Interpreter(function).launch((dsl.cdiv(m, 64) * dsl.cdiv(n, 32), 1), runtime)
    assert_close(c, reference(a.double(), b.double(), None, None), torch.float16)


# -- engine selection ---------------------------------------------------------------------------------------

@dsl.jit
def _dot_kernel(a_ptr, b_ptr, c_ptr, stride_am, stride_ak, stride_bk, stride_bn,
                M: dsl.constexpr, N: dsl.constexpr, K: dsl.constexpr, REGISTER_A: dsl.constexpr = False):
    # One dot of a (M, K) and b (K, N), no loop: the operands are staged with st.shared. REGISTER_A:
    # the dot takes a + a (computed in registers, not a load), so wgmma reads A from registers.
    rm, rn, rk = dsl.arange(0, M), dsl.arange(0, N), dsl.arange(0, K)
    a = dsl.load(a_ptr + rm[:, None] * stride_am + rk[None, :] * stride_ak)
    b = dsl.load(b_ptr + rk[:, None] * stride_bk + rn[None, :] * stride_bn)
    if REGISTER_A:
        a = a + a
    acc = dsl.dot(a, b, dsl.zeros((M, N), dsl.float32))
    dsl.store(c_ptr + rm[:, None] * N + rn[None, :], acc)


def _compile_dot(dtype, target, m=64, n=64, k=32, num_warps=4, a_t=False, b_t=False):
    p, f = dsl.pointer_type(dtype), dsl.pointer_type(dsl.float32)
    strides = ((1, m) if a_t else (k, 1)) + ((1, k) if b_t else (n, 1))
    return dsl.jit(_dot_kernel.fn).compile(p, p, f, *strides, M=m, N=n, K=k, num_warps=num_warps, target=target)


@pytest.mark.parametrize("m,n,k,num_warps,wgmma", [
    (64, 64, 32, 4, True), (128, 16, 16, 4, True), (64, 64, 32, 8, True),
    (32, 64, 32, 4, False),     # M < 64
    (64, 8, 32, 4, False),      # N < 16
    (64, 64, 32, 2, False),     # not a warpgroup
    (64, 64, 8, 4, False),      # K < 16: FMA path
])
def test_engine_choice(m, n, k, num_warps, wgmma, tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    ir = _compile_dot(dsl.float16, "sm_90a", m, n, k, num_warps).asm["ir"]
    assert ('engine="wgmma"' in ir) == wgmma


@needs_ptxas
@pytest.mark.parametrize("dtype", [dsl.float16, dsl.bfloat16])
@pytest.mark.parametrize("a_t,b_t", [(False, False), (True, True)])
def test_staged_dot_ptx(dtype, a_t, b_t, tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    compiled = _compile_dot(dtype, "sm_90a", 128, 64, 64, 8, a_t, b_t)
    ptx = compiled.asm["ptx"]
    name = "f16" if dtype == dsl.float16 else "bf16"
    assert f"wgmma.mma_async.sync.aligned.m64n64k16.f32.{name}.{name}" in ptx
    assert f", p, 1, 1, {int(a_t)}, {int(not b_t)};" in ptx           # imm-trans-a / imm-trans-b
    for needed in ("st.shared.v4", "fence.proxy.async.shared::cta", "wgmma.fence.sync.aligned",
                   "wgmma.commit_group.sync.aligned", "wgmma.wait_group.sync.aligned 0",
                   ".extern .shared .align 1024"):
        assert needed in ptx, needed
    assert ptx.index("fence.proxy.async") < ptx.index("wgmma.mma_async")
    result = assemble(ptx, "sm_90a")
    assert result.spill_bytes == 0, result.log


def _scales(ptx: str) -> list:
    """The scale-d value (the register's `mov.b32 %r, imm`) of each wgmma.mma_async in `ptx`, in order."""
    values = dict(re.findall(r"mov\.b32\s+(%r\d+), (\d+);", ptx))
    return [int(values[r]) for r in re.findall(r"setp\.ne\.b32 p, (%r\d+), 0;\nwgmma\.mma_async", ptx)]


@needs_ptxas
@pytest.mark.parametrize("m,n,k,num_warps", [(128, 64, 64, 8), (64, 128, 32, 4)], ids=str)
def test_zero_accumulator_is_not_read(m, n, k, num_warps, tmp_path, monkeypatch):
    """dot(a, b, zeros): the first k-step's instructions run with scale-d false (D = A B, PTX ISA 9.7.15.5.2)
    on accumulator registers nothing wrote before (no zeroing moves, no tied inputs); the later k-steps
    add to what those wrote. (Before session 33 every instruction read the accumulator: scales all 1.)"""
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    ptx = _compile_dot(dsl.float16, "sm_90a", m, n, k, num_warps).asm["ptx"]
    per_step = max(1, m // 64 // max(1, num_warps // 4))
    assert _scales(ptx) == [0] * per_step + [1] * (per_step * (k // 16 - 1))
    result = assemble(ptx, "sm_90a")
    assert result.spill_bytes == 0 and "C75" not in result.log, result.log


def _compile_register_a_dot(dtype, m, n, k, num_warps, b_t=False):
    p, f = dsl.pointer_type(dtype), dsl.pointer_type(dsl.float32)
    strides = (k, 1) + ((1, k) if b_t else (n, 1))
    return dsl.jit(_dot_kernel.fn).compile(p, p, f, *strides, M=m, N=n, K=k, REGISTER_A=True, num_warps=num_warps,
                                           target="sm_90a")


@needs_ptxas
@pytest.mark.parametrize("dtype", [dsl.float16, dsl.bfloat16])
@pytest.mark.parametrize("m,n,k,num_warps,b_t", [(128, 64, 64, 8, False), (64, 128, 32, 4, True)], ids=str)
def test_register_a_dot_ptx(dtype, m, n, k, num_warps, b_t, tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    compiled = _compile_register_a_dot(dtype, m, n, k, num_warps, b_t)
    assert 'engine="wgmma"' in compiled.asm["ir"]
    ptx = compiled.asm["ptx"]
    name = "f16" if dtype == dsl.float16 else "bf16"
    # {d..}, {a0, a1, a2, a3}, b-desc, p, imm-scale-a, imm-scale-b, imm-trans-b
    form = re.compile(rf"wgmma\.mma_async\.sync\.aligned\.m64n{n}k16\.f32\.{name}\.{name} \{{[^}}]*\}}, "
                      rf"\{{%r\d+, %r\d+, %r\d+, %r\d+\}}, %rd\d+, p, 1, 1, {int(not b_t)};")
    assert len(form.findall(ptx)) == k // 16 * (m // 64) // max(1, min(num_warps // 4, m // 64))
    assert ptx.count("fence.proxy.async") == 1        # one tile staged for the async proxy: B's
    result = assemble(ptx, "sm_90a")
    assert result.spill_bytes == 0, result.log
    assert "warning" not in result.log.lower(), result.log


@dsl.jit
def _register_a_loop_kernel(a_ptr, b_ptr, c_ptr, n_steps, limit, M: dsl.constexpr, N: dsl.constexpr,
                            K: dsl.constexpr, BRANCH: dsl.constexpr):
    # A loop whose dot takes A from registers (a + a) and B loaded in the body. BRANCH: how run-time
    # control flow meets the dot's result: "none"; "if" on the loop index (as attention's dK/dV loop
    # once had); the same `if` inside an inner loop; a `while` or a `for` of 0 or 1 trips acting as
    # the `if`; "dot_in_if": a second dot inside the `if`, whose masked result replaces the first's.
    rm, rn, rk = dsl.arange(0, M), dsl.arange(0, N), dsl.arange(0, K)
    a = dsl.load(a_ptr + rm[:, None] * K + rk[None, :])
    acc = dsl.zeros((M, N), dsl.float32)
    for i in range(0, n_steps):
        b = dsl.load(b_ptr + i * K * N + rk[:, None] * N + rn[None, :])
        s = dsl.dot(a + a, b, dsl.zeros((M, N), dsl.float32))
        if BRANCH == "dot_in_if":
            if i < limit:
                s = dsl.where(rm[:, None] >= rn[None, :], dsl.dot(a + a, b, dsl.zeros((M, N), dsl.float32)), 0.0)
        if BRANCH == "if":
            if i < limit:
                s = dsl.where(rm[:, None] >= rn[None, :], s, 0.0)
        if BRANCH == "if_in_inner_for":
            for j in range(0, 1):
                if i < limit:
                    s = dsl.where(rm[:, None] >= rn[None, :], s, 0.0)
        if BRANCH == "while_as_if":
            j = i
            while j < limit:
                s = dsl.where(rm[:, None] >= rn[None, :], s, 0.0)
                j = limit
        if BRANCH == "for_as_if":
            for j in range(i, limit, 1 << 20):
                s = dsl.where(rm[:, None] >= rn[None, :], s, 0.0)
        acc += s
    dsl.store(c_ptr + rm[:, None] * N + rn[None, :], acc)


_BRANCH_KINDS = ["none", "if", "if_in_inner_for", "while_as_if", "for_as_if", "dot_in_if"]


@needs_ptxas
@pytest.mark.parametrize("branch", _BRANCH_KINDS)
def test_register_a_dot_beside_a_runtime_branch_stays_off_wgmma(branch, tmp_path, monkeypatch):
    """A run-time branch in the block of register-A dots gave wrong results on the H200 (attention's
    dK/dV loop, session 4; cause not found): a loop body with run-time control flow keeps its dots
    off register-A wgmma, however the branch is written."""
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    p, f = dsl.pointer_type(dsl.float16), dsl.pointer_type(dsl.float32)
    compiled = dsl.jit(_register_a_loop_kernel.fn).compile(p, p, f, 4, 2, M=128, N=64, K=64, BRANCH=branch,
                                                           num_warps=8, target="sm_90a")
    ptx = compiled.asm["ptx"]
    register_a = re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n64k16\.f32\.f16\.f16 \{[^}]*\}, \{%r", ptx)
    assert bool(register_a) == (branch == "none")
    assert ("mma.sync" in ptx) == (branch != "none")
    assert assemble(ptx, "sm_90a").spill_bytes == 0


@needs_ptxas
@pytest.mark.parametrize("config,dtype,transposed_b", [
    (WGMMA_CONFIGS[0], torch.float16, False), (WGMMA_CONFIGS[1], torch.bfloat16, True),
    (WGMMA_CONFIGS[2], torch.float16, True), (WGMMA_CONFIGS[4], torch.float16, False),
    (SMALL_CONFIG, torch.bfloat16, False),
], ids=lambda v: str(v) if isinstance(v, dsl.Config) else None)
def test_library_matmul_on_sm90a_uses_wgmma_without_spills(config, dtype, transposed_b, tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    compiled = compile_library_matmul(config, dtype, transposed_b=transposed_b)
    ptx = compiled.asm["ptx"]
    name = "f16" if dtype == torch.float16 else "bf16"
    assert "wgmma.mma_async.sync.aligned.m64n" in ptx and f"k16.f32.{name}.{name}" in ptx
    for needed in ("wgmma.fence.sync.aligned", "wgmma.commit_group.sync.aligned",
                   "wgmma.wait_group.sync.aligned 1", "wgmma.wait_group.sync.aligned 0",
                   "fence.proxy.async.shared::cta", "cp.async.cg.shared.global", ".extern .shared .align 1024"):
        assert needed in ptx, needed
    assert "mma.sync" not in ptx and "ldmatrix" not in ptx
    assert f", p, 1, 1, 0, {int(not transposed_b)};" in ptx
    # the epilogue: the accumulator goes through a swizzled tile, C is written with 16-byte stores
    stages, (bm, bn, bk) = config.num_stages, (config.constexprs[d] for d in ("BLOCK_M", "BLOCK_N", "BLOCK_K"))
    threads = 32 * config.num_warps
    assert ptx.count("st.global.v4.b32") == bm * bn * 2 // 16 // threads
    assert ptx.count("ld.shared.v4.b32") == bm * bn * 2 // 16 // threads
    assert ptx.count("st.shared.b32") >= bm * bn // 2 // threads      # (+ the bias row's conversion)
    assert 'swizzled=true' in compiled.asm["ir"].lower()
    result = assemble(ptx, "sm_90a")
    assert result.spill_bytes == 0, result.log
    assert "warning" not in result.log.lower(), result.log          # e.g. wgmma serialized by ptxas
    assert compiled.shared_bytes == stages * (bm * bk + bk * bn) * 2 <= 227 * 1024


@needs_ptxas
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_other_targets_keep_mma_sync(arch, tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    ptx = compile_library_matmul(CONFIGS[3], arch=arch).asm["ptx"]
    assert "mma.sync.aligned.m16n8k16" in ptx and "ldmatrix" in ptx and "wgmma" not in ptx
    assert "fence.proxy" not in ptx and ".align 1024" not in ptx
    assert assemble(ptx, arch).spill_bytes == 0


def test_disable_knob_keeps_mma_sync_and_keys_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("FUSEDOPS_DISABLE_WGMMA", "1")
    ptx = compile_library_matmul(SMALL_CONFIG).asm["ptx"]
    assert "mma.sync" in ptx and "wgmma" not in ptx
    monkeypatch.delenv("FUSEDOPS_DISABLE_WGMMA")
    assert "wgmma.mma_async" in compile_library_matmul(SMALL_CONFIG).asm["ptx"]   # not the cached mma.sync kernel


# -- GPU tier -----------------------------------------------------------------------------------------------

_ROUNDOFF = {torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8}


def _check_gpu(actual, a, b):
    """Our norm-relative error vs float64 at most 2x torch.matmul's in the same dtype (+ roundoff)."""
    ref = reference(a.double(), b.double(), None, None)
    assert not torch.isnan(actual).any(), "NaN in the output (an element was not written?)"

    def relative(x):
        scale = float(torch.linalg.vector_norm(ref))
        return float(torch.linalg.vector_norm(x.double() - ref)) / (scale if scale > 0 else 1.0)
    ours, theirs = relative(actual), relative(reference(a, b, None, None))
    assert ours <= 2 * theirs + _ROUNDOFF[a.dtype], f"error {ours:.3e} vs torch.matmul {theirs:.3e}"


def _operands(m, n, k, dtype, transpose_a, transpose_b, seed):
    a = random_tensor((k, m) if transpose_a else (m, k), dtype, "cuda", seed)
    b = random_tensor((n, k) if transpose_b else (k, n), dtype, "cuda", seed + 1)
    return (a.t() if transpose_a else a), (b.t() if transpose_b else b)


_GPU_CONFIGS = WGMMA_CONFIGS + [SMALL_CONFIG, MMA_CONFIGS[4]]


@pytest.mark.cuda
@pytest.mark.parametrize("transpose_a,transpose_b", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("config", _GPU_CONFIGS, ids=str)
@pytest.mark.parametrize("m,n,k", [(300, 496, 208), (129, 257, 1000)], ids=str)
def test_gpu_wgmma_matmul_matches_float64(m, n, k, config, transpose_a, transpose_b, seed):
    a, b = _operands(m, n, k, torch.float16, transpose_a, transpose_b, seed)
    c = poison(torch.empty(1, m, n, dtype=torch.float16, device="cuda"))
    mm.matmul_into(c, a[None], b[None], config=config)
    _check_gpu(c[0], a, b)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("transpose_b", [False, True])
@pytest.mark.parametrize("m,n,k", [(1024, 768, 8192), (257, 129, 4097), (64, 16, 16), (3, 5, 0)], ids=str)
def test_gpu_many_k_iterations_and_dtypes(m, n, k, dtype, transpose_b, seed):
    a, b = _operands(m, n, k, dtype, False, transpose_b, seed)
    for config in (WGMMA_CONFIGS[0], WGMMA_CONFIGS[2]):
        c = poison(torch.empty(1, m, n, dtype=dtype, device="cuda"))
        mm.matmul_into(c, a[None], b[None], config=config)
        if k:
            _check_gpu(c[0], a, b)
        else:
            assert torch.equal(c[0], torch.zeros_like(c[0]))


def _compile_like_the_runtime(c, a, b, config, arch="sm_90a"):
    """The specialization `matmul_into(c, a, b, config=config)` launches (same args, so the same
    divisibility-by-16 facts), compiled for `arch` without a GPU."""
    args, constexprs, _ = mm._launch(c, a, b, None, None)
    return dsl.jit(matmul_kernel.fn).compile(*args, target=arch, num_warps=config.num_warps,
                                                num_stages=config.num_stages, **constexprs, **config.constexprs)


@pytest.mark.parametrize("m,n,k,b_ring", [(200, 132, 1001, False), (200, 136, 1001, True), (128, 256, 4099, True)],
                         ids=str)
def test_unaligned_rows_stage_through_shared_memory(m, n, k, b_ring, tmp_path, monkeypatch):
    """K odd: A's rows are not 16-byte aligned, so A cannot be copied with cp.async; the dot stages it
    with st.shared + fence.proxy.async + barrier every iteration. B's rows (stride N) are aligned
    when N is divisible by 8 (16 bytes of bf16; the runtime specializes ints divisible by 16, or else
    by 8): then B still comes through the cp.async ring and only A is staged (the case the H200 run
    first tested with the wrong expectation: N = 256); N = 132 (a multiple of 4 only) stages B too."""
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    a, b = torch.empty(1, m, k, dtype=torch.bfloat16), torch.empty(1, k, n, dtype=torch.bfloat16)
    c = torch.empty(1, m, n, dtype=torch.bfloat16)
    compiled = _compile_like_the_runtime(c, a, b, WGMMA_CONFIGS[2])
    ptx = compiled.asm["ptx"]
    assert "wgmma.mma_async" in ptx and "st.shared" in ptx and "fence.proxy.async.shared::cta" in ptx
    assert ("cp.async.cg.shared.global" in ptx) == b_ring
    assert ("wgmma.wait_group.sync.aligned 1" in ptx) is False      # a staged operand: no dot left in flight


@pytest.mark.cuda
@pytest.mark.parametrize("m,n,k", [(200, 132, 1001), (200, 136, 1001), (128, 256, 4099)], ids=str)
def test_gpu_unaligned_rows_use_the_staged_path(m, n, k, seed):
    """K odd: A staged with st.shared every iteration (B too when its rows are not 16-byte aligned:
    N % 8 != 0 for bf16; the runtime specializes ints divisible by 16, or else by 8), then wgmma."""
    a, b = _operands(m, n, k, torch.bfloat16, False, False, seed)
    config = WGMMA_CONFIGS[2]
    c = poison(torch.empty(1, m, n, dtype=torch.bfloat16, device="cuda"))
    ptx = _compile_like_the_runtime(c, a[None], b[None], config).asm["ptx"]
    assert "wgmma.mma_async" in ptx and ("cp.async.cg" in ptx) == (n % 8 == 0)
    mm.matmul_into(c, a[None], b[None], config=config)
    _check_gpu(c[0], a, b)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("m,n,k,num_warps", [(64, 64, 32, 4), (128, 16, 16, 4), (128, 256, 64, 8), (64, 128, 64, 8),
                                             (256, 64, 128, 8)], ids=str)
@pytest.mark.parametrize("a_t,b_t", [(False, False), (True, True), (True, False)])
def test_gpu_single_staged_dot(m, n, k, num_warps, dtype, a_t, b_t, seed):
    a, b = _operands(m, n, k, dtype, a_t, b_t, seed)
    c = poison(torch.empty(m, n, dtype=torch.float32, device="cuda"))
    kernel = dsl.jit(_dot_kernel.fn)
    kernel[(1,)](a, b, c, a.stride(0), a.stride(1), b.stride(0), b.stride(1), M=m, N=n, K=k, num_warps=num_warps)
    assert_close(c, a.double() @ b.double(), dtype)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("m,n,k,num_warps,b_t", [(128, 64, 64, 8, False), (64, 128, 32, 4, True),
                                                 (256, 64, 128, 8, False), (64, 16, 16, 4, True)], ids=str)
def test_gpu_register_a_dot(m, n, k, num_warps, b_t, dtype, seed):
    a, b = _operands(m, n, k, dtype, False, b_t, seed)
    c = poison(torch.empty(m, n, dtype=torch.float32, device="cuda"))
    kernel = dsl.jit(_dot_kernel.fn)
    kernel[(1,)](a, b, c, a.stride(0), a.stride(1), b.stride(0), b.stride(1), M=m, N=n, K=k, REGISTER_A=True,
                 num_warps=num_warps)
    assert_close(c, (a + a).double() @ b.double(), dtype)


@pytest.mark.cuda
def test_gpu_wgmma_and_mma_sync_agree(seed, monkeypatch):
    """The A/B pair the FUSEDOPS_DISABLE_WGMMA knob exists for: both engines, one process."""
    a, b = _operands(640, 384, 1536, torch.float16, False, True, seed)
    outputs = []
    for disabled in ("0", "1"):
        monkeypatch.setenv("FUSEDOPS_DISABLE_WGMMA", disabled)
        monkeypatch.setattr(mm, "matmul_kernel", dsl.jit(matmul_kernel.fn))    # a fresh in-memory cache
        c = poison(torch.empty(1, 640, 384, dtype=torch.float16, device="cuda"))
        mm.matmul_into(c, a[None], b[None], config=MMA_CONFIGS[3])
        _check_gpu(c[0], a, b)
        outputs.append(c[0].double())
    assert float((outputs[0] - outputs[1]).abs().max()) <= 2.0 ** -6 * float(outputs[1].abs().max())


@pytest.mark.cuda
def test_gpu_sass_uses_hgmma(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    compiled = compile_library_matmul(WGMMA_CONFIGS[0])
    try:
        sass = compiled.asm["sass"]
    except KeyError as error:
        pytest.skip(str(error))
    assert "HGMMA" in sass and "HMMA" not in sass


@pytest.mark.cuda
@pytest.mark.parametrize("branch", _BRANCH_KINDS)
def test_gpu_register_a_loop_with_and_without_a_runtime_branch(branch, seed):
    """The loop of `_register_a_loop_kernel` (register-A wgmma without a branch, mma.sync with one)
    against float64, the masked steps (i < limit) included."""
    m, n, k, steps, limit = 128, 64, 64, 4, 2
    a = random_tensor((m, k), torch.float16, device="cuda", seed=seed)
    b = random_tensor((steps, k, n), torch.float16, device="cuda", seed=seed + 1)
    c = poison(torch.empty(m, n, dtype=torch.float32, device="cuda"))
    dsl.jit(_register_a_loop_kernel.fn)[(1,)](a, b, c, steps, limit, M=m, N=n, K=k, BRANCH=branch, num_warps=8)
    products = (2 * a.double()) @ b.double()                         # (steps, m, n)
    if branch != "none":
        keep = torch.arange(m, device="cuda")[:, None] >= torch.arange(n, device="cuda")[None, :]
        products[:limit] = torch.where(keep, products[:limit], torch.zeros((), dtype=torch.float64, device="cuda"))
    assert_close(c, products.sum(0), torch.float16)
