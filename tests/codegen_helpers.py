"""Helpers shared by the CPU tests of tensor-core codegen (test_tensor_cores, test_wgmma, test_matmul):
the register/lane/warp arithmetic of linear layouts, the blocked layout a load gives, the
per-vector accesses of a tile store/load plan, and compiling the library matmul kernel."""

from __future__ import annotations

import torch

import fusedops.dsl as dsl
from fusedops.dsl.layouts import default_blocked, transpose
from fusedops.kernels import matmul as mm


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
    return dsl.jit(mm.matmul_kernel.fn).compile(
        x, x, x, x, m, n, k, m * k, k, 1, *b_strides, m * n, n, 1, 1, target=arch,
        num_warps=config.num_warps, num_stages=config.num_stages, HAS_BIAS=True, ACTIVATION="gelu",
        ACC=dsl.float32, **config.constexprs)
