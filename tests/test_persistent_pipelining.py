"""A persistent kernel's flattened loop: one `for` over (tile, k) whose body reads the accumulator in a
conditional epilogue (`if k == last: store(acc); acc = zeros`).

- Pipelining (passes/pipelining.py): the wgmma stays in flight (wait_group 1 in the loop); the
  epilogue's region waits for it first (wait_group 0); TMA copies of later iterations (the next
  tile's first ones too) run ahead through the epilogue.
- Shared memory (codegen/async_copy.py): the epilogue's scratch (the swizzled exchange of the
  accumulator, 16-byte vector accesses) starts after the live ring and its mbarriers on a 16-byte
  boundary (3 mbarriers end on an 8-byte one: the H200 raised "misaligned address" before).
CPU tier: the IR schedule, the rule, ptxas. GPU tier: the kernel against float64 at ragged shapes.
"""

from __future__ import annotations

import types

import pytest
import torch

import fusedops.dsl as dsl
from fusedops.dsl.errors import LaunchError
from fusedops.dsl.codegen import async_copy
from fusedops.dsl.target import assemble, ptxas_available
from fusedops.kernels.matmul_configs import WGMMA_CONFIGS
from fusedops.kernels.matmul_kernels import epilogue, tile_coordinates
from helpers import poison

needs_ptxas = pytest.mark.skipif(not ptxas_available(), reason="ptxas is not on the PATH")


@dsl.jit
def flat_matmul_kernel(c_ptr, a_ptr, b_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                       BLOCK_M: dsl.constexpr, BLOCK_N: dsl.constexpr, BLOCK_K: dsl.constexpr,
                       GROUP_M: dsl.constexpr):
    # c = a @ b; each program takes tiles pid, pid + programs, ... in one loop over (tile, k).
    pid = dsl.program_id(0)
    programs = dsl.num_programs(0)
    k_iters = dsl.cdiv(K, BLOCK_K)
    my_tiles = (dsl.cdiv(M, BLOCK_M) * dsl.cdiv(N, BLOCK_N) - pid + programs - 1) // programs
    a_desc = dsl.make_tensor_descriptor(a_ptr, (M, K), (stride_am, stride_ak), (BLOCK_M, BLOCK_K))
    b_desc = dsl.make_tensor_descriptor(b_ptr, (K, N), (stride_bk, stride_bn), (BLOCK_K, BLOCK_N))
    acc = dsl.zeros((BLOCK_M, BLOCK_N), dsl.float32)
    for it in range(0, my_tiles * k_iters):
        local = it // k_iters
        k = it - local * k_iters
        pid_m, pid_n = tile_coordinates(pid + local * programs, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        acc = dsl.dot(a_desc.load((pid_m * BLOCK_M, k * BLOCK_K)), b_desc.load((k * BLOCK_K, pid_n * BLOCK_N)), acc)
        if k == k_iters - 1:
            epilogue(c_ptr, c_ptr, acc, pid_m * BLOCK_M, pid_n * BLOCK_N, M, N, stride_cm, stride_cn, 0,
                      BLOCK_M, BLOCK_N, False, None, dsl.float32)
            acc = dsl.zeros((BLOCK_M, BLOCK_N), dsl.float32)


def _arguments(c, a, b):
    return (c, a, b, c.shape[0], c.shape[1], a.shape[1], a.stride(0), a.stride(1), b.stride(0), b.stride(1),
            c.stride(0), c.stride(1))


def _compile(config, num_stages, m=4096, n=4096, k=4096):
    a, b, c = torch.empty(m, k, dtype=torch.float16), torch.empty(k, n, dtype=torch.float16), \
        torch.empty(m, n, dtype=torch.float16)
    return dsl.jit(flat_matmul_kernel.fn).compile(*_arguments(c, a, b), target="sm_90a", num_warps=config.num_warps,
                                                  num_stages=num_stages, **config.constexprs)


def test_flattened_loop_keeps_the_wgmma_in_flight_and_the_epilogue_waits(tma_ws0):
    ir_text = _compile(WGMMA_CONFIGS[0], 3).asm["ir"]
    loop = ir_text[ir_text.index(" = for "):]
    dot = loop.index(" = dot ")
    assert 'pending=1' in loop[dot:loop.index("\n", dot)]
    branch = loop.index(" = if ", dot)
    region = [line.strip() for line in loop[branch:].split("\n")[1:4]]
    first = next(line for line in region if " = " in line)       # after the region's `^():` header
    assert first.split(" = ")[1].startswith(f"wgmma_wait {loop[:dot].split()[-1]} ") and "pending=0" in first
    assert loop.count("tma_copy") == 2        # A and B, issued each iteration (also across tiles)


@needs_ptxas
@pytest.mark.parametrize("num_stages", [3, 4])
def test_flattened_loop_ptx_is_accepted_without_spills(tma_ws0, num_stages):
    compiled = _compile(WGMMA_CONFIGS[0], num_stages)
    ptx = compiled.asm["ptx"]
    assert ptx.count("wgmma.wait_group.sync.aligned 1;") == 1 and "cp.async.bulk.tensor" in ptx
    result = assemble(ptx, "sm_90a")
    assert result.spill_bytes == 0, f"{result.registers} registers, {result.spill_bytes} bytes spilled"


@pytest.mark.parametrize("start, nbytes", [(0, 24), (147456, 24), (100, 1), (16, 16), (0, 0)])
def test_scratch_after_live_buffers_starts_on_16_bytes(start, nbytes):
    ctx = types.SimpleNamespace(live_buffers={}, scratch_offset=start, shared_bytes=0)
    async_copy._push_live(ctx, object(), start + nbytes)
    assert ctx.scratch_offset % 16 == 0 and start + nbytes <= ctx.scratch_offset < start + nbytes + 16
    assert ctx.shared_bytes == ctx.scratch_offset


def test_three_stage_flattened_kernel_scratch_is_aligned(tma_ws0):
    # ring (144 KB) + 3 mbarriers (24 bytes) + the epilogue's exchange tile: its start is rounded up
    compiled = _compile(WGMMA_CONFIGS[0], 3)
    assert compiled.shared_bytes == 3 * (128 * 64 + 64 * 256) * 2 + 32 + 128 * 256 * 2


# -- GPU tier ---------------------------------------------------------------------------------------------

@pytest.mark.cuda
@pytest.mark.parametrize("m, n, k, programs", [(1000, 1500, 700, 132), (384, 512, 64, 5), (129, 257, 1000, 7),
                                               (4096, 4096, 512, 132)])
def test_gpu_flattened_persistent_matmul(m, n, k, programs, seed):
    # 3 stages: the ring (144 KB) and the epilogue's exchange tile (64 KB) fit together; the TMA-store
    # epilogue (tests/test_tma_store.py) takes 4
    generator = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(m, k, device="cuda", generator=generator).to(torch.float16)
    b = torch.randn(k, n, device="cuda", generator=generator).to(torch.float16)
    c = poison(torch.empty(m, n, device="cuda", dtype=torch.float16))
    config = WGMMA_CONFIGS[0]
    flat_matmul_kernel[(programs,)](*_arguments(c, a, b), num_warps=config.num_warps, num_stages=3,
                                    **config.constexprs)
    expected = a.double() @ b.double()
    torch.testing.assert_close(c.double(), expected, rtol=2e-3, atol=2e-3 * k ** 0.5)


@pytest.mark.cuda
def test_gpu_too_much_shared_memory_is_a_clear_error():
    # 4 stages (192 KB) + the 64 KB exchange tile: over the 227 KB a CTA may have
    a, b, c = (torch.zeros(512, 512, device="cuda", dtype=torch.float16) for _ in range(3))
    with pytest.raises(LaunchError, match="bytes of shared memory per CTA"):
        flat_matmul_kernel[(4,)](*_arguments(c, a, b), num_warps=8, num_stages=4,
                                 **WGMMA_CONFIGS[0].constexprs)
