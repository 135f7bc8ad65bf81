"""Helpers shared by the CPU tests of tensor-core codegen (test_tensor_cores, test_wgmma, test_matmul):
the register/lane/warp arithmetic of linear layouts, the blocked layout a load gives, the
per-vector accesses of a tile store/load plan, and compiling the library matmul kernel."""

from __future__ import annotations

import torch

import fusedops.dsl as dsl
from fusedops.dsl.layouts import default_blocked, transpose
from fusedops.kernels import matmul as mm
from fusedops.kernels.matmul_kernels import matmul_kernel, matmul_tma_kernel


def xor_bits(bases, index: int) -> int:
    """The XOR of the `bases` whose bit is set in `index` (a linear layout's image of `index`)."""
    out = 0
    for bit, basis in enumerate(bases):
        if index >> bit & 1:
            out ^= basis
    return out


def source_layout(shape, contiguous, num_warps):
    """A blocked layout of `shape` holding 16-byte vectors along `contiguous` (what a load gives)."""
    if contiguous == 1:
        return default_blocked(shape, num_warps, 16)
    return transpose(default_blocked((shape[1], shape[0]), num_warps, 16), (1, 0))


def vector_accesses(groups, lanes, warps, num_warps: int):
    """(warp, lane, first register, byte offset in the tile) of every vector that a plan of
    codegen's `tile_store_groups` / `tile_load_groups` (its groups, lane and warp bases) moves."""
    for warp in range(num_warps):
        for lane in range(32):
            thread = xor_bits(lanes, lane) ^ xor_bits(warps, warp)
            for first, constant in groups:
                yield warp, lane, first, thread ^ constant


def compile_library_matmul(config, dtype=torch.float16, arch="sm_90a", transposed_b=False, m=4096, n=4096, k=4096):
    """The library's matmul_kernel (bias + gelu epilogue) compiled for `arch` with `config`, A and C
    row-major, B row-major or (transposed_b) column-major, no GPU needed."""
    x = torch.empty(16, dtype=dtype)
    b_strides = (k * n, 1, k) if transposed_b else (k * n, n, 1)
    return dsl.jit(matmul_kernel.fn).compile(
        x, x, x, x, m, n, k, m * k, k, 1, *b_strides, m * n, n, 1, 1, target=arch,
        num_warps=config.num_warps, num_stages=config.num_stages, HAS_BIAS=True, ACTIVATION="gelu",
        ACC=dsl.float32, **config.constexprs)


def interpret_pipelined_tma_matmul(c, a, b, num_stages, expected_op, **tile):
    """Run the library's matmul_tma_kernel over batch-1 c, a, b (2-D a and b, c (1, M, N)) in the
    interpreter after the sm_90a pass pipeline (64 x 32 x 32 tiles unless `tile` overrides constexprs,
    4 warps, `num_stages`), asserting that the pipelined IR holds an `expected_op` (an OpCode) whenever
    K > 0; returns the pipelined IR function. The interpreter lands a TMA copy only at the mbarrier wait
    of its slot, so a wrong slot, phase or wait changes c."""
    from fusedops.dsl.passes.manager import run_pipeline
    from fusedops.dsl.passes.pipeline import default_pipeline

    m, k, n = a.shape[0], a.shape[1], b.shape[1]
    args, constexprs, _ = mm._tma_launch(c, a[None], b[None], None, None)
    kwargs = dict(constexprs, **dict(dict(BLOCK_M=64, BLOCK_N=32, BLOCK_K=32, GROUP_M=1), **tile))
    kernel = dsl.jit(matmul_tma_kernel.fn)
    function = kernel.ir(*args, **kwargs)
    run_pipeline(function, default_pipeline(4, "sm_90a", num_stages=num_stages))
    assert (k > 0) <= any(op.opcode == expected_op for op in function.walk())
    interpret_ir(kernel, function, (mm._programs(m, n, kwargs), 1), args, kwargs)
    return function


def interpret_ir(kernel, function, grid, args, kwargs) -> None:
    """Run `function` (kernel's IR, e.g. after passes) in the interpreter over `grid` with the runtime
    arguments that `args` and constexprs `kwargs` bind to."""
    from fusedops.dsl.interpreter import Interpreter
    from fusedops.dsl.runtime.signature import specialize

    values = kernel._bind(args, kwargs)
    runtime = [v for v, spec in zip(values, specialize(kernel.__name__, kernel.params, values)) if spec.is_runtime]
    Interpreter(function).launch(grid, runtime)


def exchange_groups(function) -> list:
    """The sizes of the groups of reductions that share one exchange (passes/sibling_reductions.py)."""
    from fusedops.dsl.ir import OpCode

    return [op.attrs["exchange_group"] for op in function.walk()
            if op.opcode == OpCode.REDUCE and "exchange_group" in op.attrs]


def pipelined_ir(kernel, args, kwargs, num_warps, siblings=True, arch="sm_90a", num_stages=1):
    """(function, report): the IR of a fresh copy of `kernel` (its own IR cache) for args / constexprs
    kwargs after the default pass pipeline, without group_sibling_reductions when `siblings` is False;
    verified."""
    from fusedops.dsl.ir import verify
    from fusedops.dsl.passes.manager import run_pipeline
    from fusedops.dsl.passes.pipeline import default_pipeline

    function = dsl.jit(kernel.fn).ir(*args, **kwargs)
    passes = default_pipeline(num_warps, arch, num_stages)
    if not siblings:
        passes = [p for p in passes if getattr(p, "__name__", "") != "group_sibling_reductions"]
    report = run_pipeline(function, passes)
    verify(function)
    return function, report
