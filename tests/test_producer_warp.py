"""A producer warp for the TMA operand ring (FUSEDOPS_WS=2; passes/_pipelining_warp_specialized.py
`pipeline_with_producer_warp`, codegen/async_copy.py `_producer_warp`).

CPU tier:
  - the pass's IR: one `producer_warp` before the loop whose loop issues every fill after waiting on the empty
    barrier; the consumer loop only waits for full slots and releases them (right after an in-flight dot);
    no fill issued anywhere else; loops after a memory access keep FUSEDOPS_WS=1's schedule;
  - the sm_90a PTX of the library's TMA kernels (one program per tile, persistent): 4 more warps launched
    (`.maxntid`, CompiledKernel.launch_warps, kept by the disk cache), the consumers' barriers named and
    counted (`bar.sync 1, 32 * num_warps`), none in the K loop, ptxas with no spills for every wgmma config;
  - the knob's modes. (The full/empty protocol with a producer warp is simulated in test_warp_specialization.)
GPU tier (`-m cuda`, H200): both TMA kernels under FUSEDOPS_WS=2 against float64 (ragged M/N/K, K = 0,
transposed operands, program counts, bias and activations, 16-bit and float32 C).
"""

from __future__ import annotations


import pytest
import torch

import fusedops.dsl as dsl
from fusedops.dsl.ir import OpCode
from fusedops.dsl.passes.dot_layouts import PRODUCER_WARPS
from fusedops.dsl.passes.manager import run_pipeline
from fusedops.dsl.passes.pipeline import default_pipeline
from fusedops.dsl.codegen.async_copy import producer_registers
from fusedops.dsl.target import assemble, ptxas_available
from fusedops.kernels.matmul_configs import WGMMA_CONFIGS
from fusedops.kernels.matmul_kernels import matmul_tma_kernel
from fusedops.kernels import matmul_persistent as mp
from matmul_helpers import check_gpu, gpu_operands
from tests.helpers import poison
from tests.test_warp_specialization import _launch_args, ring_mode

needs_ptxas = pytest.mark.skipif(not ptxas_available(), reason="ptxas is not on the PATH")


@pytest.fixture
def producer_warp(monkeypatch, tmp_path):
    return ring_mode(monkeypatch, tmp_path, "2")


# -- the pass ---------------------------------------------------------------------------------------------

def _pipelined_tma_matmul(num_stages: int):
    _, _, _, args, constexprs = _launch_args(64, 32, 96, b_t=True)
    function = dsl.jit(matmul_tma_kernel.fn).ir(*args, **constexprs, BLOCK_M=64, BLOCK_N=32, BLOCK_K=32, GROUP_M=1)
    run_pipeline(function, default_pipeline(4, "sm_90a", num_stages=num_stages))
    return function


@pytest.mark.parametrize("num_stages", [2, 3, 4])      # the dot in flight from 3 stages on
def test_producer_warp_issues_every_fill(num_stages, producer_warp):
    function = _pipelined_tma_matmul(num_stages)
    top = [op.opcode for op in function.body.ops]
    assert top.count(OpCode.PRODUCER_WARP) == 1 and top.index(OpCode.PRODUCER_WARP) < top.index(OpCode.FOR)
    (producer,) = [op for op in function.body.ops if op.opcode == OpCode.PRODUCER_WARP]
    producer_ops = list(producer.walk())
    copies = [op for op in function.walk() if op.opcode == OpCode.TMA_COPY]
    assert len(copies) == 2 and all(op in producer_ops for op in copies)     # A and B, issued by the producer
    (producer_loop,) = [op for op in producer_ops if op.opcode == OpCode.FOR]
    body = [op.opcode for op in producer_loop.regions[0].ops]
    assert body.index(OpCode.MBARRIER_WAIT) < body.index(OpCode.TMA_COPY)
    (wait,) = [op for op in producer_loop.regions[0].ops if op.opcode == OpCode.MBARRIER_WAIT]
    assert wait.attrs == {"cta_barrier": False, "issuer": True}

    (loop,) = [op for op in function.body.ops if op.opcode == OpCode.FOR]
    consumer = loop.regions[0].ops
    consumer_codes = [op.opcode for op in consumer]
    assert OpCode.TMA_COPY not in consumer_codes
    waits = [op for op in consumer if op.opcode == OpCode.MBARRIER_WAIT]
    assert [w.attrs for w in waits] == [{"cta_barrier": False}]
    assert consumer_codes.index(OpCode.DOT) < consumer_codes.index(OpCode.MBARRIER_ARRIVE)
    dot = next(op for op in consumer if op.opcode == OpCode.DOT)
    if num_stages >= 3:     # released right after the in-flight dot, whose wait_group 1 retired the last one
        assert dot.attrs.get("pending") == 1
        assert consumer_codes[consumer_codes.index(OpCode.DOT) + 1:].index(OpCode.MBARRIER_ARRIVE) <= 2
    allocs = [op for op in function.body.ops if op.opcode == OpCode.LOCAL_ALLOC and op.result.type.tile_shape == (1,)]
    assert [sorted(a.attrs) for a in allocs] == [["mbarrier_arrivals"], ["mbarrier_per_warp"]]
    assert waits[0].operands[0] is allocs[0].result and wait.operands[0] is allocs[1].result


@dsl.jit
def _store_then_loop_kernel(c_ptr, a_ptr, b_ptr, flag_ptr, M, N, K, BLOCK: dsl.constexpr):
    # A store before the loop: the producer warp would run it too, so the loop keeps FUSEDOPS_WS=1's schedule.
    dsl.store(flag_ptr + dsl.arange(0, BLOCK), dsl.zeros((BLOCK,), dsl.float32))
    a_desc = dsl.make_tensor_descriptor(a_ptr, (M, K), (K, 1), (BLOCK, BLOCK))
    b_desc = dsl.make_tensor_descriptor(b_ptr, (K, N), (N, 1), (BLOCK, BLOCK))
    acc = dsl.zeros((BLOCK, BLOCK), dsl.float32)
    for k in range(0, K, BLOCK):
        acc = dsl.dot(a_desc.load((0, k)), b_desc.load((k, 0)), acc)
    rows = dsl.arange(0, BLOCK)
    dsl.store(c_ptr + rows[:, None] * N + rows[None, :], acc.to(dsl.float16))


def test_a_memory_access_before_the_loop_keeps_the_consumer_issuing(producer_warp):
    a, b = torch.empty(64, 256, dtype=torch.float16), torch.empty(256, 64, dtype=torch.float16)
    c, flag = torch.empty(64, 64, dtype=torch.float16), torch.empty(64)
    function = _store_then_loop_kernel.ir(c, a, b, flag, 64, 64, 256, BLOCK=64)
    run_pipeline(function, default_pipeline(4, "sm_90a", num_stages=3))
    codes = [op.opcode for op in function.walk()]
    assert OpCode.PRODUCER_WARP not in codes
    (loop,) = [op for op in function.body.ops if op.opcode == OpCode.FOR]
    assert OpCode.TMA_COPY in [op.opcode for op in loop.regions[0].ops]          # the issuer thread's refill


def test_the_knob_modes():
    from fusedops.dsl.runtime import knobs
    assert [knobs.current({"FUSEDOPS_WS": mode}).ws for mode in ("0", "1", "2")] == [0, 1, 2]
    with pytest.raises(ValueError, match="FUSEDOPS_WS.*producer warpgroup"):
        knobs.current({"FUSEDOPS_WS": "3"})


# -- PTX ---------------------------------------------------------------------------------------------------

def _compile_tma(config, dtype=torch.float16, b_t=False):
    _, _, _, args, constexprs = _launch_args(304, 496, 208, dtype, False, b_t)
    return dsl.jit(matmul_tma_kernel.fn).compile(*args, target="sm_90a", num_warps=config.num_warps,
                                                    num_stages=config.num_stages, **constexprs, **config.constexprs)


def _compile_persistent(config, dtype=torch.float16):
    a, c = torch.empty(4096, 4096, dtype=dtype), torch.empty(4096, 4096, dtype=dtype)
    args, options = mp._arguments(c, a, a, None, None, config, 128)
    return dsl.jit(mp.matmul_persistent_kernel.fn).compile(*args, target="sm_90a", **options)


def _consumer_k_loop(ptx: str) -> str:
    """The consumers' K loop: from the block of their full wait (the second try_wait in the text: the
    producer's loop comes first) to the dot's wait_group 0."""
    first = ptx.index("mbarrier.try_wait.parity")
    start = ptx.rindex("\n$L__BB", 0, ptx.index("mbarrier.try_wait.parity", first + 1))
    return ptx[start:ptx.index("wgmma.wait_group.sync.aligned 0", start)]


def _check_ptx(compiled, num_warps: int) -> None:
    ptx = compiled.asm["ptx"]
    assert compiled.launch_warps == num_warps + PRODUCER_WARPS
    assert f".maxntid {32 * (num_warps + PRODUCER_WARPS)}, 1, 1" in ptx
    registers = producer_registers(num_warps)
    if registers is None:
        assert "setmaxnreg" not in ptx
    else:       # the producer gives registers back before its loop, the consumers take them before theirs
        assert ptx.count(f"setmaxnreg.dec.sync.aligned.u32 {registers[0]};") == 1
        assert ptx.count(f"setmaxnreg.inc.sync.aligned.u32 {registers[1]};") == 1
    # every thread before the loops (the barriers' initialization); the consumers' named barrier after
    split = ptx.index("mbarrier.try_wait.parity")
    assert "bar.sync \t0;" in ptx[:split] and "bar.sync \t0;" not in ptx[split:]
    assert f"bar.sync \t1, {32 * num_warps};" in ptx[split:]
    loop = _consumer_k_loop(ptx)
    assert "bar.sync" not in loop and "mbarrier.arrive.shared::cta.b64" in loop
    assert "cp.async.bulk.tensor.2d.shared::cluster.global" not in loop          # the producer's alone
    result = assemble(ptx, "sm_90a")
    assert result.spill_bytes == 0, result.log
    assert "C7514" not in result.log and "C7515" not in result.log, result.log


@needs_ptxas
@pytest.mark.parametrize("config", WGMMA_CONFIGS, ids=str)
def test_tma_kernel_ptx(config, producer_warp):
    _check_ptx(_compile_tma(config), config.num_warps)


@needs_ptxas
@pytest.mark.parametrize("config", [c for c in WGMMA_CONFIGS if c.num_warps == 8], ids=str)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_persistent_kernel_ptx(config, dtype, producer_warp):
    _check_ptx(_compile_persistent(config, dtype), config.num_warps)


@needs_ptxas
def test_the_disk_cache_keeps_the_producer_warp(producer_warp):
    config = WGMMA_CONFIGS[2]
    first = _compile_tma(config)
    again = _compile_tma(config)            # a new JIT function: read back from the disk cache
    assert first.asm["ptx"] == again.asm["ptx"] and again.launch_warps == first.launch_warps == config.num_warps + 4
    producer_warp.setenv("FUSEDOPS_WS", "0")
    assert _compile_tma(config).launch_warps == config.num_warps


# -- GPU tier ----------------------------------------------------------------------------------------------

# (the one-tile TMA kernel against float64: tests/test_warp_specialization.py's GPU test, both ring modes)

@pytest.mark.cuda
@pytest.mark.parametrize("config", [c for c in WGMMA_CONFIGS if c.num_warps == 8], ids=str)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("m,n,k", [(2000, 1040, 1000), (4096, 4096, 4096), (1500, 2100, 16)], ids=str)
def test_gpu_persistent_kernel_matches_float64(m, n, k, dtype, config, producer_warp, monkeypatch, seed):
    monkeypatch.setattr(mp, "matmul_persistent_kernel", dsl.jit(mp.matmul_persistent_kernel.fn))
    a, b = gpu_operands(m, n, k, dtype, seed)
    tiles = dsl.cdiv(m, config.constexprs["BLOCK_M"]) * dsl.cdiv(n, config.constexprs["BLOCK_N"])
    for programs in sorted({1, 7, min(tiles, 132), tiles}):
        c = poison(torch.empty(m, n, device="cuda", dtype=dtype))
        mp.launch(c, a, b, None, None, config, programs)
        check_gpu(c, a, b)


@pytest.mark.cuda
@pytest.mark.parametrize("out_dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("activation", [None, "gelu", "silu"])
def test_gpu_persistent_bias_activation(out_dtype, activation, producer_warp, monkeypatch, seed):
    monkeypatch.setattr(mp, "matmul_persistent_kernel", dsl.jit(mp.matmul_persistent_kernel.fn))
    dtype = torch.bfloat16 if out_dtype == torch.bfloat16 else torch.float16
    m, n, k = 1500, 2100, 700
    a, b = gpu_operands(m, n, k, dtype, seed)
    bias = torch.randn(n, device="cuda", dtype=dtype)
    c = poison(torch.empty(m, n, device="cuda", dtype=out_dtype))
    mp.launch(c, a, b, bias, activation, WGMMA_CONFIGS[0], 50)
    check_gpu(c, a, b, bias, activation)
