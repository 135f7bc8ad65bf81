"""Matrix multiplication with a fused epilogue: C = activation(A @ B + bias), the DSL kernel and its
launcher.

    A: (batch, M, K) or (M, K)    B: (batch, K, N) or (K, N)    bias: (N,)    C: (batch, M, N) / (M, N)

Kernel. One program computes a BLOCK_M x BLOCK_N tile of C for one batch index (grid axis 1),
walking K in BLOCK_K steps and accumulating in float32 with `dsl.dot`. On sm_80+ the compiler puts
the fp16/bf16 dot on tensor cores (mma.sync m16n8k16; on sm_90a wgmma.mma_async m64nNk16, reading
A and B from shared memory through descriptors), stages A and B through swizzled shared memory
(read with ldmatrix for mma.sync), and software-pipelines the loads of the K loop `num_stages`
deep with cp.async (passes/pipelining.py): the kernel itself is plain tile code.
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

TMA (sm_90a; FUSEDOPS_TMA=0 turns it off): a single product (batch 1)
whose operands a tensor map can describe runs `matmul_tma_kernel`, the same kernel reading A and B
through `dsl.make_tensor_descriptor`, so that on sm_90a the bulk tensor copy engine fills the wgmma
operand ring (passes/pipelining.py) and zero-fills the ragged edges; its configs are TMA_CONFIGS.
TMA products of at least matmul_persistent.MIN_WAVES waves of tiles on an 8-warp config, with a
16-bit C, on an sm_90 GPU, run matmul_persistent's kernel instead: one program per SM whose tiles
follow each other through one operand ring, the epilogue (a TMA store) overlapping the next tile's
loads (FUSEDOPS_PERSISTENT=0 turns it off; on the H200 it beat one program per tile at 2 to 21 waves
and stream-K at 8192^3 and 8192 x 11008 x 4096, session 10). Where it does not run, long products
whose last wave is partial (at least matmul_stream_k.MIN_WAVES waves) run matmul_stream_k's kernel,
which splits that wave along K (stream-K; FUSEDOPS_STREAM_K=0 turns it off).
Clusters (CLUSTER_M / CLUSTER_N, `TMA_CLUSTER_CONFIGS`, only by `config=`): programs in clusters of 2
or 4 tiles of a column (row) of tiles, which copy the shared B (A) tile once from L2 for the cluster (TMA
multicast): measured no faster on the H200, so not tuned over.
FUSEDOPS_WS=1 (read at compile time, runtime/knobs.py) replaces the K loop's CTA barrier by per-stage
"empty" mbarriers (passes/pipelining.py); the default stays 0: on the H200 (session 29, bench/matmul.py, the
persistent kernel, x cuBLAS in the same run) 1 was slower, fp16 4096^3 0.99 -> 0.92, bf16 1.00 -> 0.93, 8192^3
fp16 1.02 -> 0.90, bf16 0.97 -> 0.93.
FUSEDOPS_WS=2 (a producer warpgroup issues the ring's copies, the 8 consumer warps never wait for a release): correct
(tests/test_producer_warp.py, GPU tier) but slower too; session 32 (H200, persistent kernel x cuBLAS timed
interleaved in one process, two runs): 128x256x64 s4 fp16 4096^3 0.997-1.000 -> 0.90-0.94, 8192^3 1.005-1.013 -> 0.92, bf16 0.998-1.000
-> 0.92-0.93, 1.010-1.016 -> 0.90-0.93; 256x128x64 alike. A CTA barrier added back to its K loop changed nothing (the
lockstep is not what 0 gains), nor did 3 stages (0.92: the producer warp hides the ring's depth, where 3 stages under 0
give 0.72), nor BLOCK_K = 32 with 6-8 stages (0.70 under 0 and 2, and under 0 with 2-5 wgmma groups left in flight
instead of 1: neither the barrier nor the wgmma queue bounds those; a 32-column A tile takes the 64-byte swizzle). Those runs had one producer warp (168 registers per thread for 9 warps); the producer warpgroup that
gives the consumers 240 registers (setmaxnreg) measured the same: 4096^3 0.905-0.927, 8192^3 0.90-0.94 (both dtypes,
both tiles). Nsight Compute (fp16 4096^3, one launch each): 183 us under 0, 196 us under 2; the consumers' samples
sit at WARPGROUP.DEPBAR.LE 1 (the previous step's wgmma: 36% under 2, 1.5% under 0, whose warps wait at the CTA
barrier instead, 28%) and in the full barrier's try_wait retries (12% against 9%: tiles land later), the tensor
pipe is full less often (gmma stall 0.55 warps per issue against 1.35) and the MIO queue throttles 4x more (1.22
against 0.28). Where the lateness comes from is open.
Prepared launches (`prepare_matmul`) are made for the setting in force when they are prepared.

Configs are autotuned per (M, N, K, dtypes, device) among `CONFIGS` (fusedops.dsl.autotune) for
problems of at least AUTOTUNE_MIN_WORK multiply-adds; smaller ones use SMALL_CONFIG and the
interpreter INTERPRETER_CONFIG. On the TMA path each config is timed as it will run (persistent,
stream-K or one program per tile: `_tuned_tma_config`).
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

import fusedops.dsl as dsl
from fusedops.dsl.runtime.autotune import TUNING_WARMUP, time_launches
from fusedops.dsl.runtime.knobs import interpret_enabled as _interpret_enabled

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
        # 0.5 x (1 + tanh(u)) = x sigmoid(2 u), u = sqrt(2 / pi) (x + 0.044715 x^3): one exp and one
        # approximate reciprocal, where libdevice's tanhf made the persistent kernel's epilogue spill 448 bytes
        # (128 x 256 on 8 warps, no bias; ptxas, sm_90a)
        x = x * dsl.sigmoid(2.0 * _SQRT_2_OVER_PI * (x + 0.044715 * x * x * x))
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
        k64 = kk.to(dsl.int64)      # int64 offsets: a K stride times K may pass 2**31
        a = dsl.load(a_rows + k64[None, :] * stride_ak, mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
        b = dsl.load(b_cols + k64[:, None] * stride_bk, mask=(kk[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc = dsl.dot(a, b, acc)

    if HAS_BIAS:
        bias = dsl.load(bias_ptr + rn.to(dsl.int64) * stride_bias, mask=rn < N, other=0.0)
        acc = acc + bias.to(ACC)[None, :]
    acc = _activation(acc, ACTIVATION)
    c = c_ptr + batch * stride_cb + rm.to(dsl.int64)[:, None] * stride_cm + rn.to(dsl.int64)[None, :] * stride_cn
    dsl.store(c, acc.to(c_ptr.dtype.element), mask=(rm[:, None] < M) & (rn[None, :] < N))


@dsl.jit
def _tile_coordinates(tile, M, N, BLOCK_M: dsl.constexpr, BLOCK_N: dsl.constexpr, GROUP_M: dsl.constexpr):
    # (pid_m, pid_n) of `tile` in grouped order (GROUP_M rows of tiles swept column by column).
    tiles_n = dsl.cdiv(N, BLOCK_N)
    group = tile // (GROUP_M * tiles_n)
    group_rows = dsl.minimum(dsl.cdiv(M, BLOCK_M) - group * GROUP_M, GROUP_M)
    pid_m = group * GROUP_M + (tile % (GROUP_M * tiles_n)) % group_rows
    pid_n = (tile % (GROUP_M * tiles_n)) // group_rows
    return pid_m, pid_n


@dsl.jit
def _epilogue(c_ptr, bias_ptr, acc, first_row, first_col, M, N, stride_cm, stride_cn, stride_bias,
              ROWS: dsl.constexpr, COLS: dsl.constexpr, HAS_BIAS: dsl.constexpr, ACTIVATION: dsl.constexpr,
              ACC: dsl.constexpr):
    # c[first_row:, first_col:][:ROWS, :COLS] = activation(acc + bias), masked to (M, N).
    rm = first_row + dsl.arange(0, ROWS)
    rn = first_col + dsl.arange(0, COLS)
    if HAS_BIAS:
        bias = dsl.load(bias_ptr + rn.to(dsl.int64) * stride_bias, mask=rn < N, other=0.0)
        acc = acc + bias.to(ACC)[None, :]
    acc = _activation(acc, ACTIVATION)
    c = c_ptr + rm.to(dsl.int64)[:, None] * stride_cm + rn.to(dsl.int64)[None, :] * stride_cn
    dsl.store(c, acc.to(c_ptr.dtype.element), mask=(rm[:, None] < M) & (rn[None, :] < N))


@dsl.jit
def matmul_tma_kernel(c_ptr, a_ptr, b_ptr, bias_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                      stride_cm, stride_cn, stride_bias,
                      BLOCK_M: dsl.constexpr, BLOCK_N: dsl.constexpr, BLOCK_K: dsl.constexpr, GROUP_M: dsl.constexpr,
                      HAS_BIAS: dsl.constexpr, ACTIVATION: dsl.constexpr, ACC: dsl.constexpr,
                      CLUSTER_M: dsl.constexpr = 1, CLUSTER_N: dsl.constexpr = 1):
    # matmul_kernel for one (M, K) @ (K, N) product (the TMA path), reading A and B through tensor
    # descriptors: on sm_90a the compiler fills the wgmma operand ring with TMA copies, whose ragged
    # edges the copy engine zero-fills. c_ptr: (M, N); a_ptr: (M, K); b_ptr: (K, N);
    # grid: (`_programs`,): one program per tile, the tiles rounded up to whole clusters.
    # CLUSTER_M > 1: clusters of CLUSTER_M programs computing CLUSTER_M consecutive tiles of one column
    # of tiles, which all read the same B tiles: each copies 1 / CLUSTER_M of them from L2 for all
    # (TMA multicast); past the last row of tiles a program still loads its share (and stores nothing).
    # CLUSTER_N > 1 (CLUSTER_M 1): the same along a row of tiles, sharing the A tiles.
    if CLUSTER_M * CLUSTER_N == 1:
        pid_m, pid_n = _tile_coordinates(dsl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    elif CLUSTER_N == 1:
        dsl.cluster_dims(CLUSTER_M)
        pid = dsl.program_id(0)
        GROUP_CLUSTERS: dsl.constexpr = GROUP_M // CLUSTER_M if GROUP_M >= CLUSTER_M else 1
        cluster_m, pid_n = _tile_coordinates(pid // CLUSTER_M, M, N, BLOCK_M * CLUSTER_M, BLOCK_N, GROUP_CLUSTERS)
        pid_m = cluster_m * CLUSTER_M + pid % CLUSTER_M
    else:
        dsl.cluster_dims(CLUSTER_N)
        pid = dsl.program_id(0)
        pid_m, cluster_n = _tile_coordinates(pid // CLUSTER_N, M, N, BLOCK_M, BLOCK_N * CLUSTER_N, GROUP_M)
        pid_n = cluster_n * CLUSTER_N + pid % CLUSTER_N
    a_desc = dsl.make_tensor_descriptor(a_ptr, (M, K), (stride_am, stride_ak), (BLOCK_M, BLOCK_K))
    b_desc = dsl.make_tensor_descriptor(b_ptr, (K, N), (stride_bk, stride_bn), (BLOCK_K, BLOCK_N))
    acc = dsl.zeros((BLOCK_M, BLOCK_N), ACC)
    for k0 in range(0, K, BLOCK_K):
        acc = dsl.dot(a_desc.load((pid_m * BLOCK_M, k0), multicast=CLUSTER_N > 1),
                      b_desc.load((k0, pid_n * BLOCK_N), multicast=CLUSTER_M > 1 and CLUSTER_N == 1), acc)
    _epilogue(c_ptr, bias_ptr, acc, pid_m * BLOCK_M, pid_n * BLOCK_N, M, N, stride_cm, stride_cn, stride_bias,
              BLOCK_M, BLOCK_N, HAS_BIAS, ACTIVATION, ACC)


def _config(block_m, block_n, block_k, num_warps, num_stages, group_m=8, cluster_m=1, cluster_n=1) -> dsl.Config:
    constexprs = {"BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": block_k, "GROUP_M": group_m}
    if cluster_m > 1:       # matmul_tma_kernel only
        constexprs["CLUSTER_M"] = cluster_m
    if cluster_n > 1:
        constexprs["CLUSTER_N"] = cluster_n
    return dsl.Config(constexprs, num_warps=num_warps, num_stages=num_stages)


# Tile configs for mma.sync on sm_80/sm_90 (fp16/bf16): big tiles with 8 warps for big problems
# (warp tiles of 64x64 or 64x32), 4-warp tiles that fit 2-3 programs per SM, smaller tiles for small
# M or N. Every one assembles without spills (tests/test_matmul.py).
MMA_CONFIGS = [
    _config(128, 256, 64, 8, 3),
    _config(256, 128, 64, 8, 3),
    _config(128, 256, 32, 8, 4),
    _config(128, 128, 64, 8, 4),
    _config(128, 128, 32, 4, 4),
    _config(128, 64, 32, 4, 4),
    _config(64, 128, 32, 4, 4),
    _config(64, 64, 32, 4, 4),
]
# Tile configs for wgmma on sm_90a (the configs above run there too, as wgmma): two consumer
# warpgroups of 64 x 256 or 128 x 128 each, or one of 128 x 128, with 4 stages (the K loop keeps
# one wgmma in flight, which holds one stage, so 2 tiles load while one computes): 192 KB and
# 128 KB of shared memory, within the 227 KB an sm_90 CTA may use (on sm_80, 164 KB at most, the
# 192 KB ones fail to launch and the autotuner skips them). The last two take at most 96 KB and
# ~195 registers x 128 threads, so two CTAs share an SM and one's epilogue and prologue overlap
# the other's main loop (the epilogue's tile reuses the operand ring: it adds no shared memory).
WGMMA_CONFIGS = [
    _config(128, 256, 64, 8, 4),
    _config(256, 128, 64, 8, 4),
    _config(128, 128, 64, 4, 4),
    _config(128, 128, 64, 4, 3),
    _config(128, 128, 32, 4, 5),
]
CONFIGS = MMA_CONFIGS + WGMMA_CONFIGS
INTERPRETER_CONFIG = _config(16, 16, 16, 4, 1, group_m=2)
# Problems smaller than this many multiply-adds run SMALL_CONFIG without tuning: they take a few
# microseconds, less than what the search would cost per new shape.
AUTOTUNE_MIN_WORK = 1 << 27
SMALL_CONFIG = _config(64, 64, 32, 4, 3)

tuned_matmul_kernel = dsl.autotune(CONFIGS, key=["M", "N", "K"])(matmul_kernel)
# The TMA path: wgmma configs only (TMA fills wgmma operand rings; elsewhere descriptors are plain loads).
TMA_CONFIGS = WGMMA_CONFIGS + [SMALL_CONFIG]
# matmul_tma_kernel in clusters of 2 programs sharing their B (CLUSTER_M) or A (CLUSTER_N) tiles through TMA
# multicast. Not tuned over: on the H200 (session 9, runs 49-51, fp16/bf16 4096^3, 8192^3, 8192x4096x4096) each
# ran within +-2% of the same tile without a cluster (4-CTA clusters 5-25% slower): halving the L2 -> SM
# traffic of the shared operand does not shorten the main loop. Kept for `config=` and the GPU tests.
TMA_CLUSTER_CONFIGS = [
    _config(128, 256, 64, 8, 4, cluster_m=2),
    _config(256, 128, 64, 8, 4, cluster_n=2),
    _config(64, 256, 32, 4, 5, cluster_m=2),
]
tuned_matmul_tma_kernel = dsl.autotune(TMA_CONFIGS, key=["M", "N", "K"])(matmul_tma_kernel)


def _uses_tma(c: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether a launch takes matmul_tma_kernel: FUSEDOPS_TMA on (the default), one product (batch 1), 16-bit
    inputs, and operands a tensor map can describe (16-byte aligned, one unit stride, the other a
    multiple of 16 elements: what the kernel's specialization must prove for the compiler to use
    TMA; anything else keeps the cp.async kernel)."""
    if not _tma_enabled() or c.shape[0] != 1 or a.shape[0] != 1 or b.shape[0] != 1 or a.dtype not in INPUT_DTYPES:
        return False
    for operand in (a[0], b[0]):
        strides = operand.stride()
        if operand.data_ptr() % 16 or sorted(strides)[0] != 1 or max(strides) % 16 or 1 not in strides:
            return False
        if strides[0] == strides[1] == 1:
            return False
    return True


def _tma_enabled() -> bool:
    from fusedops.dsl.runtime import knobs
    return knobs.tma_enabled()


def _tma_launch(c: torch.Tensor, a: torch.Tensor, b: torch.Tensor, bias: Optional[torch.Tensor],
                activation: Optional[str]) -> tuple:
    """(arguments, constexprs, tiles) of a matmul_tma_kernel launch over batch-1 c, a, b."""
    m, n, k = c.shape[1], c.shape[2], a.shape[2]
    has_bias = bias is not None
    args = (c, a, b, bias if has_bias else c, m, n, k, a.stride(1), a.stride(2), b.stride(1), b.stride(2),
            c.stride(1), c.stride(2), bias.stride(0) if has_bias else 0)
    acc = dsl.float64 if a.dtype == torch.float64 else dsl.float32     # a float64 c of narrower operands: float32 sums
    return args, {"HAS_BIAS": has_bias, "ACTIVATION": activation, "ACC": acc}, (m, n, k)


def _stream_k_plan(m: int, n: int, k: int, config: dsl.Config, device: torch.device) -> Optional[tuple]:
    """matmul_stream_k.plan where FUSEDOPS_STREAM_K is on (the default) and the config is not a cluster
    one (the stream-K kernel runs without clusters), else None."""
    from fusedops.dsl.runtime import knobs
    if not knobs.stream_k_enabled() or _cluster_sizes(config.constexprs) != (1, 1):
        return None
    return matmul_stream_k.plan(m, n, k, config, device)


def _persistent_plan(c: torch.Tensor, k: int, config: dsl.Config) -> Optional[int]:
    """matmul_persistent.plan for batch-1 `c` where FUSEDOPS_PERSISTENT is on (the default), the config is an
    8-warp one (one program per SM either way; the 4-warp configs rely on two per SM) without clusters, C
    is 16-bit (a float32 C's epilogue with a bias and an activation spills there; measured for 16-bit C)
    and the device is an sm_90 GPU (where it was measured) or the interpreter's CPU; else None."""
    from fusedops.dsl.runtime import knobs
    if not knobs.persistent_enabled() or config.num_warps != 8 or _cluster_sizes(config.constexprs) != (1, 1):
        return None
    if c.element_size() != 2 or (c.device.type == "cuda" and torch.cuda.get_device_capability(c.device)[0] != 9):
        return None
    return matmul_persistent.plan(c.shape[1], c.shape[2], k, config, c.device)


def _cluster_sizes(constexprs) -> tuple:
    """(CLUSTER_M, CLUSTER_N) of a config's constexprs (1 where absent).

    Raises:
        ValueError: one not an int from 1 to 8, or both above 1.
    """
    cluster_m, cluster_n = constexprs.get("CLUSTER_M", 1), constexprs.get("CLUSTER_N", 1)
    for name, value in (("CLUSTER_M", cluster_m), ("CLUSTER_N", cluster_n)):
        if type(value) is not int or not 1 <= value <= 8:
            raise ValueError(f"matmul config: {name} must be an int from 1 to 8 (programs per cluster), got {value!r}")
    if cluster_m > 1 and cluster_n > 1:
        raise ValueError(f"matmul config: CLUSTER_M={cluster_m} and CLUSTER_N={cluster_n}: clusters run along one "
                         "dim of the tiles, so at most one of them may be above 1")
    return cluster_m, cluster_n


def _programs(m: int, n: int, constexprs) -> int:
    """Programs along grid axis 0 of an (m, n) product: one per tile, with the rows (CLUSTER_M) or columns
    (CLUSTER_N) of tiles rounded up to whole clusters (matmul_tma_kernel). Raises what `_cluster_sizes`
    raises."""
    cluster_m, cluster_n = _cluster_sizes(constexprs)
    return (dsl.cdiv(m, constexprs["BLOCK_M"] * cluster_m) * cluster_m
            * dsl.cdiv(n, constexprs["BLOCK_N"] * cluster_n) * cluster_n)


def _grid(tiles: tuple, batch: int):
    return lambda meta: (_programs(tiles[0], tiles[1], meta), batch)


def _chosen_config(m: int, n: int, k: int, interpret: bool, config: Optional[dsl.Config]) -> Optional[dsl.Config]:
    """The config of a launch: `config`, the interpreter's, SMALL_CONFIG for small problems, or None
    (autotune)."""
    chosen = config or (INTERPRETER_CONFIG if interpret else None)
    if chosen is None and m * n * max(k, 1) < AUTOTUNE_MIN_WORK:
        chosen = SMALL_CONFIG
    return chosen


def _launch(c: torch.Tensor, a: torch.Tensor, b: torch.Tensor, bias: Optional[torch.Tensor],
            activation: Optional[str]) -> tuple:
    """(arguments, constexprs, tiles) of one launch over 3-D c, a, b (batch <= MAX_GRID_Y)."""
    m, n, k = c.shape[1], c.shape[2], a.shape[2]
    has_bias = bias is not None
    args = (c, a, b, bias if has_bias else c, m, n, k,
            a.stride(0) if a.shape[0] > 1 else 0, a.stride(1), a.stride(2),
            b.stride(0) if b.shape[0] > 1 else 0, b.stride(1), b.stride(2),
            c.stride(0), c.stride(1), c.stride(2), bias.stride(0) if has_bias else 0)
    acc = dsl.float64 if a.dtype == torch.float64 else dsl.float32     # a float64 c of narrower operands: float32 sums
    return args, {"HAS_BIAS": has_bias, "ACTIVATION": activation, "ACC": acc}, (m, n, k)


def _tma_path(c: torch.Tensor, a: torch.Tensor, b: torch.Tensor, bias: Optional[torch.Tensor],
              activation: Optional[str], config: dsl.Config, interpret: bool) -> Callable[[], None]:
    """`launch()`: c = activation(a @ b + bias) over batch-1 c, a, b (`_uses_tma`) with `config`, by the
    kernel its plan takes: persistent (`_persistent_plan`), stream-K (`_stream_k_plan`) or one program
    per tile (matmul_tma_kernel)."""
    args, constexprs, (m, n, k) = _tma_launch(c, a, b, bias, activation)
    programs = _persistent_plan(c, k, config)
    if programs is not None:
        return lambda: matmul_persistent.launch(c[0], a[0], b[0], bias, activation, config, programs,
                                                interpret=interpret)
    stream_k = _stream_k_plan(m, n, k, config, c.device)
    if stream_k is not None:
        return lambda: matmul_stream_k.launch(c[0], a[0], b[0], bias, activation, config, *stream_k,
                                              interpret=interpret)
    grid = (_programs(m, n, config.constexprs),)
    return lambda: matmul_tma_kernel[grid](*args, num_warps=config.num_warps, num_stages=config.num_stages,
                                           interpret=interpret, **constexprs, **config.constexprs)


def _tuned_tma_config(c: torch.Tensor, a: torch.Tensor, b: torch.Tensor, bias: Optional[torch.Tensor],
                      activation: Optional[str]) -> dsl.Config:
    """The fastest of TMA_CONFIGS for this product (GPU), recorded by tuned_matmul_tma_kernel (its key and
    on-disk record). Each config is timed as `_tma_path` launches it: the persistent or stream-K kernel
    where its plan takes one. (Timing matmul_tma_kernel for every config instead picked configs whose
    persistent launch was slower: fp16 4096^3 on the H200, session 23, 0.964x cuBLAS against 1.000x for
    128 x 256 x 64 persistent in the same run.) Tuning writes c."""
    args, constexprs, _ = _tma_launch(c, a, b, bias, activation)
    key = tuned_matmul_tma_kernel.key_of(args, constexprs)
    chosen = tuned_matmul_tma_kernel.best.get(key)
    if chosen is not None:
        return chosen
    warmed = set()

    def measure(config: dsl.Config) -> tuple:
        launch = _tma_path(c, a, b, bias, activation, config, False)
        launch()        # compiles and checks the launch
        warmup = 0 if config in warmed else TUNING_WARMUP
        warmed.add(config)
        return time_launches(launch, warmup=warmup), False
    return tuned_matmul_tma_kernel.select(key, measure)


def matmul_into(c: torch.Tensor, a: torch.Tensor, b: torch.Tensor, bias: Optional[torch.Tensor] = None,
                activation: Optional[str] = None, *, interpret: Optional[bool] = None,
                config: Optional[dsl.Config] = None) -> torch.Tensor:
    """c[i] = activation(a[i] @ b[i] + bias) for 3-D a (batch, M, K), b (batch, K, N), c (batch, M, N).

    Any strides (a batch stride of 0 broadcasts that operand); a and b share a dtype (float16 or
    bfloat16 on the GPU; the interpreter also takes float32); bias: (N,) of any float dtype, any
    stride, or None. `config` forces a config (tests, benchmarks); by default it is autotuned (the
    interpreter uses INTERPRETER_CONFIG). Returns c.
    """
    batch = c.shape[0]
    if c.numel() == 0:
        return c
    if interpret is None:
        interpret = _interpret_enabled()
    if _uses_tma(c, a, b):
        args, constexprs, (m, n, k) = _tma_launch(c, a, b, bias, activation)
        chosen = _chosen_config(m, n, k, interpret, config) or _tuned_tma_config(c, a, b, bias, activation)
        _tma_path(c, a, b, bias, activation, chosen, interpret)()
        return c
    for start in range(0, batch, MAX_GRID_Y):
        stop = min(batch, start + MAX_GRID_Y)
        cs, as_, bs = c[start:stop], a[start:stop] if a.shape[0] > 1 else a, b[start:stop] if b.shape[0] > 1 else b
        args, constexprs, (m, n, k) = _launch(cs, as_, bs, bias, activation)
        chosen = _chosen_config(m, n, k, interpret, config)
        if chosen is not None and _cluster_sizes(chosen.constexprs) != (1, 1):     # a TMA-path config
            chosen = dsl.Config({key: value for key, value in chosen.constexprs.items()
                                 if not key.startswith("CLUSTER_")}, num_warps=chosen.num_warps,
                                num_stages=chosen.num_stages)
        if chosen is None:
            tuned_matmul_kernel[_grid((m, n), stop - start)](*args, interpret=False, **constexprs)
        else:
            grid = (_programs(m, n, chosen.constexprs), stop - start)
            matmul_kernel[grid](*args, num_warps=chosen.num_warps, num_stages=chosen.num_stages,
                                interpret=interpret, **constexprs, **chosen.constexprs)
    return c


def prepare_matmul(c: torch.Tensor, a: torch.Tensor, b: torch.Tensor, bias: Optional[torch.Tensor] = None,
                   activation: Optional[str] = None) -> Optional[Callable]:
    """`launch(c, a, b, bias)`, the GPU launch of `matmul_into(c, a, b, bias, activation)` prepared for
    tensors shaped, strided and typed like these on their device (JITFunction.prepare); `bias` is None
    where it is None here. None where one launch does not do (an empty c, batches over MAX_GRID_Y).
    An autotuned problem is tuned here first (which launches)."""
    if c.numel() == 0 or c.shape[0] > MAX_GRID_Y:
        return None
    if _uses_tma(c, a, b):
        kernel, tuned, (args, constexprs, (m, n, k)) = (matmul_tma_kernel, tuned_matmul_tma_kernel,
                                                        _tma_launch(c, a, b, bias, activation))
    else:
        kernel, tuned, (args, constexprs, (m, n, k)) = (matmul_kernel, tuned_matmul_kernel,
                                                        _launch(c, a, b, bias, activation))
    chosen = _chosen_config(m, n, k, False, None)
    if chosen is None and kernel is matmul_tma_kernel:
        chosen = _tuned_tma_config(c, a, b, bias, activation)
    if chosen is None:
        tuned[_grid((m, n), c.shape[0])](*args, interpret=False, **constexprs)
        chosen = tuned.best.get(tuned.key_of(args, constexprs))
        if chosen is None:
            return None
    programs = _persistent_plan(c, k, chosen) if kernel is matmul_tma_kernel else None
    if programs is not None:
        launch = matmul_persistent.prepare(c[0], a[0], b[0], bias, activation, chosen, programs)
        return lambda c, a, b, bias: launch(c[0], a[0], b[0], bias)
    stream_k = _stream_k_plan(m, n, k, chosen, c.device) if kernel is matmul_tma_kernel else None
    if stream_k is not None:
        launch = matmul_stream_k.prepare(c[0], a[0], b[0], bias, activation, chosen, *stream_k)
        return lambda c, a, b, bias: launch(c[0], a[0], b[0], bias)
    grid = (_programs(m, n, chosen.constexprs), c.shape[0])
    prepared = kernel.prepare(grid, *args, num_warps=chosen.num_warps, num_stages=chosen.num_stages,
                              interpret=False, **constexprs, **chosen.constexprs)
    if bias is None:    # the kernel's bias pointer is c then (unread)
        return lambda c, a, b, bias: prepared(c, a, b, c)
    return prepared


def product_batch(a: torch.Tensor, b: torch.Tensor) -> int:
    """The batch of a product of 3-D a (batch or 1, M, K) and b (batch or 1, K, N): a size-1 batch broadcasts,
    so 1 against 0 is 0."""
    return b.shape[0] if a.shape[0] == 1 else a.shape[0]


def matmul(a: torch.Tensor, b: torch.Tensor, bias: Optional[torch.Tensor] = None, activation: Optional[str] = None,
           out_dtype: Optional[torch.dtype] = None, *, interpret: Optional[bool] = None,
           config: Optional[dsl.Config] = None) -> torch.Tensor:
    """activation(a @ b + bias) for 3-D a (batch or 1, M, K) and b (batch or 1, K, N) on one device.

    Returns a new contiguous (batch, M, N) tensor of `out_dtype` (default a's dtype). See
    `matmul_into` for dtypes, strides and `config`.
    """
    c = torch.empty((product_batch(a, b), a.shape[1], b.shape[2]), dtype=out_dtype or a.dtype, device=a.device)
    return matmul_into(c, a, b, bias, activation, interpret=interpret, config=config)


from fusedops.kernels import matmul_persistent, matmul_stream_k  # noqa: E402  (they import this module's helpers)
