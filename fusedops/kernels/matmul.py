"""Matrix multiplication with a fused epilogue: C = activation(A @ B + bias), the DSL kernel and its
launcher.

    A: (batch, M, K) or (M, K)    B: (batch, K, N) or (K, N)    bias: (N,)    C: (batch, M, N) / (M, N)

Kernel. One program computes a BLOCK_M x BLOCK_N tile of C for one batch index (grid axis 1),
walking K in BLOCK_K steps and accumulating in float32 with `dsl.dot`. On sm_80+ the compiler puts
the fp16/bf16 dot on tensor cores (mma.sync m16n8k16), stages A and B through swizzled shared
memory read with ldmatrix, and software-pipelines the loads of the K loop `num_stages` deep with
cp.async (passes/pipelining.py): the kernel itself is plain tile code.
  - Grouped program order (GROUP_M): consecutive programs sweep GROUP_M rows of tiles column by
    column, so the A rows and B columns they read stay in L2 (the ordering of Triton's matmul
    tutorial, itself from CUTLASS's threadblock swizzle).
  - Ragged edges are masked (rows >= M, columns >= N, k >= K read as 0), so any M, N, K works,
    including K = 0 (C = activation(bias), or 0).
  - Strides are arguments: transposed and strided views are read in place. Row and batch offsets
    are int64 (tensors over 2**31 elements); the compiler reads along whichever dim is contiguous.
  - Epilogue in float32: + bias, then relu / gelu (erf) / gelu_tanh / silu, then the cast to C's dtype.
    (The interpreter also runs float32 and float64 inputs, accumulating in float64 for the latter:
    that is how gradcheck tests the autograd Function on the CPU.)

Configs are autotuned per (M, N, K, dtypes, device) among `CONFIGS` (fusedops.dsl.autotune) for
problems of at least AUTOTUNE_MIN_WORK multiply-adds; smaller ones use SMALL_CONFIG and the
interpreter INTERPRETER_CONFIG.
"""

from __future__ import annotations

from typing import Optional

import torch

import fusedops.dsl as dsl

ACTIVATIONS = (None, "relu", "gelu", "gelu_tanh", "silu")
INPUT_DTYPES = (torch.float16, torch.bfloat16)
OUTPUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# The CUDA grid's y dimension (the batch) is at most 65535; larger batches launch in slices.
MAX_GRID_Y = 65535

_SQRT_HALF = 0.7071067811865476
_SQRT_2_OVER_PI = 0.7978845608028654


@dsl.jit
def _activation(x, ACTIVATION: dsl.constexpr):
    # x: float32 (or float64) block; ACTIVATION one of ACTIVATIONS
    if ACTIVATION == "relu":
        x = dsl.maximum(x, 0.0)
    elif ACTIVATION == "gelu":
        x = 0.5 * x * (1.0 + dsl.erf(x * _SQRT_HALF))
    elif ACTIVATION == "gelu_tanh":
        x = 0.5 * x * (1.0 + dsl.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)))
    elif ACTIVATION == "silu":
        x = x * dsl.sigmoid(x)
    return x


@dsl.jit
def matmul_kernel(c_ptr, a_ptr, b_ptr, bias_ptr, M, N, K,
                  stride_ab, stride_am, stride_ak, stride_bb, stride_bk, stride_bn,
                  stride_cb, stride_cm, stride_cn, stride_bias,
                  BLOCK_M: dsl.constexpr, BLOCK_N: dsl.constexpr, BLOCK_K: dsl.constexpr, GROUP_M: dsl.constexpr,
                  HAS_BIAS: dsl.constexpr, ACTIVATION: dsl.constexpr, ACC: dsl.constexpr):
    # c_ptr: (batch, M, N); a_ptr: (batch, M, K); b_ptr: (batch, K, N); bias_ptr: (N,) or unused.
    # Grid: (cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N), batch). ACC: float32 (float64 for float64 inputs).
    pid = dsl.program_id(0)
    batch = dsl.program_id(1).to(dsl.int64)
    tiles_m = dsl.cdiv(M, BLOCK_M)
    tiles_n = dsl.cdiv(N, BLOCK_N)
    group = pid // (GROUP_M * tiles_n)
    group_rows = dsl.minimum(tiles_m - group * GROUP_M, GROUP_M)
    pid_m = group * GROUP_M + (pid % (GROUP_M * tiles_n)) % group_rows
    pid_n = (pid % (GROUP_M * tiles_n)) // group_rows

    rm = pid_m * BLOCK_M + dsl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + dsl.arange(0, BLOCK_N)
    rk = dsl.arange(0, BLOCK_K)
    a_rows = a_ptr + batch * stride_ab + rm.to(dsl.int64)[:, None] * stride_am
    b_cols = b_ptr + batch * stride_bb + rn.to(dsl.int64)[None, :] * stride_bn
    acc = dsl.zeros((BLOCK_M, BLOCK_N), ACC)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + rk
        a = dsl.load(a_rows + kk[None, :] * stride_ak, mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
        b = dsl.load(b_cols + kk[:, None] * stride_bk, mask=(kk[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc = dsl.dot(a, b, acc)

    if HAS_BIAS:
        bias = dsl.load(bias_ptr + rn * stride_bias, mask=rn < N, other=0.0)
        acc = acc + bias.to(ACC)[None, :]
    acc = _activation(acc, ACTIVATION)
    c = c_ptr + batch * stride_cb + rm.to(dsl.int64)[:, None] * stride_cm + rn[None, :] * stride_cn
    dsl.store(c, acc.to(c_ptr.dtype.element), mask=(rm[:, None] < M) & (rn[None, :] < N))


def _config(block_m, block_n, block_k, num_warps, num_stages, group_m=8) -> dsl.Config:
    return dsl.Config({"BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": block_k, "GROUP_M": group_m},
                      num_warps=num_warps, num_stages=num_stages)


# Tile configs for mma.sync on sm_80/sm_90 (fp16/bf16): big tiles with 8 warps for big problems
# (warp tiles of 64x64 or 64x32), 4-warp tiles that fit 2-3 programs per SM, smaller tiles for small
# M or N. Every one assembles without spills (tests/test_matmul.py).
CONFIGS = [
    _config(128, 256, 64, 8, 3),
    _config(256, 128, 64, 8, 3),
    _config(128, 256, 32, 8, 4),
    _config(128, 128, 64, 8, 4),
    _config(128, 128, 32, 4, 4),
    _config(128, 64, 32, 4, 4),
    _config(64, 128, 32, 4, 4),
    _config(64, 64, 32, 4, 4),
]
INTERPRETER_CONFIG = _config(16, 16, 16, 4, 1, group_m=2)
# Problems smaller than this many multiply-adds run SMALL_CONFIG without tuning: they take a few
# microseconds, less than what the search would cost per new shape.
AUTOTUNE_MIN_WORK = 1 << 27
SMALL_CONFIG = _config(64, 64, 32, 4, 3)

tuned_matmul_kernel = dsl.autotune(CONFIGS, key=["M", "N", "K"])(matmul_kernel)


def _grid(tiles: tuple, batch: int):
    return lambda meta: (dsl.cdiv(tiles[0], meta["BLOCK_M"]) * dsl.cdiv(tiles[1], meta["BLOCK_N"]), batch)


def matmul_into(c: torch.Tensor, a: torch.Tensor, b: torch.Tensor, bias: Optional[torch.Tensor] = None,
                activation: Optional[str] = None, *, interpret: Optional[bool] = None,
                config: Optional[dsl.Config] = None) -> torch.Tensor:
    """c[i] = activation(a[i] @ b[i] + bias) for 3-D a (batch, M, K), b (batch, K, N), c (batch, M, N).

    Any strides (a batch stride of 0 broadcasts that operand); a and b share a dtype (float16 or
    bfloat16 on the GPU; the interpreter also takes float32); bias: (N,) of any float dtype, any
    stride, or None. `config` forces a config (tests, benchmarks); by default it is autotuned (the
    interpreter uses INTERPRETER_CONFIG). Returns c.
    """
    batch, m, n = c.shape
    k = a.shape[2]
    if c.numel() == 0:
        return c
    if interpret is None:
        from fusedops.dsl.runtime import knobs
        interpret = knobs.current().interpret
    has_bias = bias is not None
    bias_arg = bias if has_bias else c
    acc = dsl.float64 if torch.float64 in (a.dtype, c.dtype) else dsl.float32
    constexprs = {"HAS_BIAS": has_bias, "ACTIVATION": activation, "ACC": acc}
    for start in range(0, batch, MAX_GRID_Y):
        stop = min(batch, start + MAX_GRID_Y)
        cs, as_, bs = c[start:stop], a[start:stop] if a.shape[0] > 1 else a, b[start:stop] if b.shape[0] > 1 else b
        args = (cs, as_, bs, bias_arg, m, n, k,
                as_.stride(0) if as_.shape[0] > 1 else 0, as_.stride(1), as_.stride(2),
                bs.stride(0) if bs.shape[0] > 1 else 0, bs.stride(1), bs.stride(2),
                cs.stride(0), cs.stride(1), cs.stride(2), bias.stride(0) if has_bias else 0)
        grid = _grid((m, n), stop - start)
        chosen = config or (INTERPRETER_CONFIG if interpret else None)
        if chosen is None and m * n * max(k, 1) < AUTOTUNE_MIN_WORK:
            chosen = SMALL_CONFIG
        if chosen is None:
            tuned_matmul_kernel[grid](*args, interpret=False, **constexprs)
        else:
            matmul_kernel[grid](*args, num_warps=chosen.num_warps, num_stages=chosen.num_stages,
                                interpret=interpret, **constexprs, **chosen.constexprs)
    return c


def matmul(a: torch.Tensor, b: torch.Tensor, bias: Optional[torch.Tensor] = None, activation: Optional[str] = None,
           out_dtype: Optional[torch.dtype] = None, *, interpret: Optional[bool] = None,
           config: Optional[dsl.Config] = None) -> torch.Tensor:
    """activation(a @ b + bias) for 3-D a (batch or 1, M, K) and b (batch or 1, K, N) on one device.

    Returns a new contiguous (batch, M, N) tensor of `out_dtype` (default a's dtype). See
    `matmul_into` for dtypes, strides and `config`.
    """
    batch = max(a.shape[0], b.shape[0])
    c = torch.empty((batch, a.shape[1], b.shape[2]), dtype=out_dtype or a.dtype, device=a.device)
    return matmul_into(c, a, b, bias, activation, interpret=interpret, config=config)
