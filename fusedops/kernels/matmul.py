"""Matrix multiplication with a fused epilogue: C = activation(A @ B + bias), the host launch: which kernel
and config a product runs, and its launch (the kernels: matmul_kernels.py; their configs: matmul_configs.py).

    A: (batch, M, K) or (M, K)    B: (batch, K, N) or (K, N)    bias: (N,)    C: (batch, M, N) / (M, N)

TMA (sm_90a; FUSEDOPS_TMA=0 turns it off): a single product (batch 1) whose operands a tensor map can
describe runs `matmul_tma_kernel` (its operands read through tensor descriptors); its configs are TMA_CONFIGS.
TMA products of at least matmul_persistent.MIN_WAVES waves of tiles on an 8-warp config, with a
16-bit C, on an sm_90 GPU, run matmul_persistent's kernel instead: one program per SM whose tiles
follow each other through one operand ring, the epilogue (a TMA store) overlapping the next tile's
loads (FUSEDOPS_PERSISTENT=0 turns it off; on the H200 it beat one program per tile at 2 to 21 waves
and stream-K at 8192^3 and 8192 x 11008 x 4096, session 10). Where it does not run, long products
whose last wave is partial (at least matmul_stream_k.MIN_WAVES waves) run matmul_stream_k's kernel,
which splits that wave along K (stream-K; FUSEDOPS_STREAM_K=0 turns it off).

Prepared launches (`prepare_matmul`) are made for the setting in force when they are prepared.

Configs are autotuned per (M, N, K, dtypes, device) among matmul_configs.CONFIGS (fusedops.dsl.autotune) for
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
from fusedops.dsl.runtime.tensor_map import MAX_SIZE, MAX_STRIDE_BYTES
from fusedops.kernels import matmul_persistent, matmul_stream_k
from fusedops.kernels.matmul_configs import AUTOTUNE_MIN_WORK, CONFIGS, INTERPRETER_CONFIG, SMALL_CONFIG, TMA_CONFIGS
from fusedops.kernels.matmul_kernels import matmul_kernel, matmul_tma_kernel

ACTIVATIONS = (None, "relu", "gelu", "gelu_tanh", "silu")
INPUT_DTYPES = (torch.float16, torch.bfloat16)
# The CUDA grid's y dimension (the batch) is at most 65535; larger batches launch in slices.
MAX_GRID_Y = 65535

tuned_matmul_kernel = dsl.autotune(CONFIGS, key=["M", "N", "K"])(matmul_kernel)
tuned_matmul_tma_kernel = dsl.autotune(TMA_CONFIGS, key=["M", "N", "K"])(matmul_tma_kernel)


def _uses_tma(c: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether a launch takes matmul_tma_kernel: FUSEDOPS_TMA on (the default), one product (batch 1), 16-bit
    inputs, and operands a tensor map can describe (16-byte aligned, one unit stride, the other a
    multiple of 16 elements: what the kernel's specialization must prove for the compiler to use
    TMA; anything else keeps the cp.async kernel). The specialization cannot see a stride's or a
    size's magnitude, so the map's limits are checked here: strides below 2**40 bytes and sizes up to
    2**32 (a dim of size 1 may have any stride: `x[::2**40]`; the driver would refuse the map at launch)."""
    if not _tma_enabled() or c.shape[0] != 1 or a.shape[0] != 1 or b.shape[0] != 1 or a.dtype not in INPUT_DTYPES:
        return False
    for operand in (a[0], b[0]):
        strides = operand.stride()
        if operand.data_ptr() % 16 or sorted(strides)[0] != 1 or max(strides) % 16 or 1 not in strides:
            return False
        if strides[0] == strides[1] == 1:
            return False
        if max(strides) * operand.element_size() >= MAX_STRIDE_BYTES or max(operand.shape) > MAX_SIZE:
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

