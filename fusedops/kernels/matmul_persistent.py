"""Persistent matmul for the TMA path: one program per SM, the epilogue of a tile overlapping the loads of the next.

    C = activation(A @ B + bias)    A: (M, K)    B: (K, N)    C: (M, N)    (one product, as matmul_tma_kernel)

Each of P programs computes tiles p, p + P, ... of BLOCK_M x BLOCK_N, all their K steps in one flattened
loop of (tile, K step) iterations. The operand ring the compiler builds around that loop (TMA copies
completing on mbarriers, passes/pipelining.py) therefore runs on across tile boundaries: the first K
steps of the next tile load while the last wgmma of this one and its epilogue run, where a grid of one
program per tile starts every tile with an empty ring. The epilogue writes C through a tensor descriptor
(a TMA store on sm_90a, codegen/tma_store.py; masked stores elsewhere) inside the loop
(`if k == last`), with the wgmma kept in flight across the branch; or, with DEFERRED_STORE, the tile converted to
C's dtype waits in registers and goes out during the next tile's first K step, that step's wgmma in flight
(the last tile's after the loop).

The ring prefetches iterations ahead of the current one, so the tile coordinates of an iteration are
computed from its index, not carried: iteration -> (tile, K step) and tile -> group of GROUP_M rows
of tiles are two divisions by run-time values per iteration. A hardware division there cost 38% of
the kernel's time on the H200 (session 8); here they are multiplications by host-computed reciprocals
(`magic_numbers`; T. Granlund and P. Montgomery, "Division by Invariant Integers using
Multiplication", PLDI 1994, section 4). GROUP_M is chosen per launch to divide the rows of tiles
(`group_rows`), so the grouped tile order needs no division by a partial last group.

Measured on the H200 (session 10, run 61, 128 x 256 x 64 tiles on 8 warps, 4 stages, x cuBLAS in the same
process; in brackets one program per tile, then stream-K): fp16 4096^3 0.981 (0.968), bf16 0.989 (0.975);
fp16 8192^3 1.035 (1.002, 1.015), bf16 1.037 (0.997, 1.017); 8192 x 4096 x 4096 0.970 (0.966);
8192 x 11008 x 4096 0.999 (0.977, 0.965); 8192 x 4096 x 14336 0.992 (0.989); 4096 x 2048 x 4096 (1.9 waves)
0.988 (0.976); 4096 x 3072 x 4096 0.989 (0.974). Which products take it: `plan`.
Session 11 (bench/matmul.py, providers timed side by side): the epilogue cost 4-6% at 4096^3 (the kernel
with it left out ran at 1.02-1.04x); a TMA store fencing only its shared tile (passes/descriptors.py
`fence_global`) and its chunks through two buffers (codegen/tma_store.py) brought fp16 4096^3 to 0.996,
bf16 0.999, 8192^3 1.02, the LLM shapes 0.97-1.01.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

import fusedops.dsl as dsl
from fusedops.kernels.device_info import sm_count
from fusedops.kernels.matmul_kernels import activation

# The quotients below are exact for dividends below 2**31 (`magic_numbers`).
DIVIDEND_BITS = 31


def magic_numbers(divisor: int) -> tuple:
    """(magic, shift) with n // divisor == (n * magic) >> shift for every 0 <= n < 2**31.

    shift = 31 + ceil(log2(divisor)) and magic = ceil(2**shift / divisor) < 2**32 (Granlund and
    Montgomery 1994, theorem 4.2 with N = 31 bits): the product stays below 2**63, an int64.

    Raises:
        ValueError: `divisor` not an int from 1 to 2**31 - 1.
    """
    if type(divisor) is not int or not 1 <= divisor < 1 << DIVIDEND_BITS:
        raise ValueError(f"divisor must be an int from 1 to 2**31 - 1, got {divisor!r}")
    shift = DIVIDEND_BITS + (divisor - 1).bit_length()
    return -(-(1 << shift) // divisor), shift


@dsl.jit
def _quotient(n, magic, shift):
    # n // d for 0 <= n < 2**31, with (magic, shift) = magic_numbers(d).
    return ((n.to(dsl.int64) * magic) >> shift).to(dsl.int32)


@dsl.jit
def matmul_persistent_kernel(c_ptr, a_ptr, b_ptr, bias_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                             stride_cm, stride_cn, stride_bias, k_magic, k_shift, group_magic, group_shift,
                             BLOCK_M: dsl.constexpr, BLOCK_N: dsl.constexpr, BLOCK_K: dsl.constexpr,
                             GROUP_M: dsl.constexpr, HAS_BIAS: dsl.constexpr, ACTIVATION: dsl.constexpr,
                             ACC: dsl.constexpr, DEFERRED_STORE: dsl.constexpr = False):
    # c_ptr: (M, N); a_ptr: (M, K); b_ptr: (K, N); grid: (programs,), programs <= tiles.
    # (k_magic, k_shift): magic_numbers(cdiv(K, BLOCK_K)); (group_magic, group_shift): magic_numbers(GROUP_M *
    # cdiv(N, BLOCK_N)); GROUP_M divides cdiv(M, BLOCK_M).
    # DEFERRED_STORE: a tile's output (in C's dtype) is stored during the next tile's first K step, while that
    # step's wgmma runs; the last tile's after the loop.
    pid = dsl.program_id(0)
    programs = dsl.num_programs(0)
    tiles_n = dsl.cdiv(N, BLOCK_N)
    k_iters = dsl.cdiv(K, BLOCK_K)
    my_tiles = dsl.cdiv(dsl.cdiv(M, BLOCK_M) * tiles_n - pid, programs)
    a_desc = dsl.make_tensor_descriptor(a_ptr, (M, K), (stride_am, stride_ak), (BLOCK_M, BLOCK_K))
    b_desc = dsl.make_tensor_descriptor(b_ptr, (K, N), (stride_bk, stride_bn), (BLOCK_K, BLOCK_N))
    c_desc = dsl.make_tensor_descriptor(c_ptr, (M, N), (stride_cm, stride_cn), (BLOCK_M, BLOCK_N))
    acc = dsl.zeros((BLOCK_M, BLOCK_N), ACC)
    out = dsl.zeros((BLOCK_M, BLOCK_N), c_ptr.dtype.element)     # DEFERRED_STORE: the tile not yet stored
    out_m = 0
    out_n = 0
    for it in range(0, my_tiles * k_iters):
        local = _quotient(it, k_magic, k_shift)
        k = it - local * k_iters
        tile = pid + local * programs
        group = _quotient(tile, group_magic, group_shift)
        within = tile - group * (GROUP_M * tiles_n)
        pid_m = group * GROUP_M + within % GROUP_M
        pid_n = within // GROUP_M
        acc = dsl.dot(a_desc.load((pid_m * BLOCK_M, k * BLOCK_K)), b_desc.load((k * BLOCK_K, pid_n * BLOCK_N)), acc)
        if DEFERRED_STORE:
            if k == 0 and local > 0:
                c_desc.store((out_m, out_n), out)
        if k == k_iters - 1:
            result = acc
            if HAS_BIAS:
                rn = pid_n * BLOCK_N + dsl.arange(0, BLOCK_N)
                result = result + dsl.load(bias_ptr + rn.to(dsl.int64) * stride_bias, mask=rn < N,
                                           other=0.0).to(ACC)[None, :]
            result = activation(result, ACTIVATION).to(c_ptr.dtype.element)
            if DEFERRED_STORE:
                out = result
                out_m = pid_m * BLOCK_M
                out_n = pid_n * BLOCK_N
            else:
                c_desc.store((pid_m * BLOCK_M, pid_n * BLOCK_N), result)
            acc = dsl.zeros((BLOCK_M, BLOCK_N), ACC)
    if DEFERRED_STORE:
        c_desc.store((out_m, out_n), out)


# Whether a tile's store is deferred into the next tile's first K step (the kernel's DEFERRED_STORE): the copy
# engine's reads of the output tile and the CTA barriers around its chunks then overlap that step's wgmma instead
# of leaving the tensor cores idle (the epilogue cost 4-6% at 4096^3, session 11; its chunk read waits 1.5-2%,
# session 32). The tile waits in registers in C's dtype: 128 x 256 fp16 on 8 warps, 156 -> 242 registers without
# an activation or with relu, 184 -> 242 with a bias (ptxas, sm_90a, no spills); the other activations spill
# there in one config or both (gelu 44-48 bytes, silu 4-36, gelu_tanh 4; inline only gelu without a bias, 12-24),
# and a float32 C (324 bytes; the plan takes 16-bit C only).
# Off until timed on the H200 (session 35 had no GPU): `bench/matmul.py --store-variants` times both against
# cuBLAS; the GPU tier checks both.
DEFERRED_STORE = False

# At least this many waves of tiles (tiles / SMs): below, most programs have one or two tiles and the
# overlap has little to hide.
MIN_WAVES = 2


def group_rows(tiles_m: int, group_m: int) -> int:
    """The largest power of two <= `group_m` that divides `tiles_m` (rows of tiles per group)."""
    rows = 1
    while rows * 2 <= group_m and tiles_m % (rows * 2) == 0:
        rows *= 2
    return rows


def plan(m: int, n: int, k: int, config: dsl.Config, device: torch.device) -> Optional[int]:
    """The programs of a persistent launch of `config` over an (m, n, k) product, or None where a grid of
    one program per tile does as well: fewer than MIN_WAVES waves of tiles, or K = 0.

    At most one per SM, and no more than the longest program's tile count needs: 512 tiles on 132 SMs
    take 4 tiles' time on 128 programs as on 132, and the 4 idle SMs leave the others more L2 and power
    (H200, session 10, run 63, x cuBLAS, 128 vs 132 programs: fp16 4096^3 0.991 vs 0.982, bf16 0.974 vs
    0.968, 8192 x 4096 x 4096 0.980 vs 0.977, 8192^3 1.052 vs 0.999, 4096 x 3072 x 4096 0.990 vs 0.979)."""
    tiles = dsl.cdiv(m, config.constexprs["BLOCK_M"]) * dsl.cdiv(n, config.constexprs["BLOCK_N"])
    sms = sm_count(device)
    if k == 0 or tiles < MIN_WAVES * sms:
        return None
    return dsl.cdiv(tiles, dsl.cdiv(tiles, sms))


def _arguments(c, a, b, bias, activation, config, programs, deferred_store: bool = DEFERRED_STORE) -> tuple:
    m, n, k = c.shape[0], c.shape[1], a.shape[1]
    block_m, block_n, block_k = (config.constexprs[key] for key in ("BLOCK_M", "BLOCK_N", "BLOCK_K"))
    tiles_m, tiles_n = dsl.cdiv(m, block_m), dsl.cdiv(n, block_n)
    if not 1 <= programs <= tiles_m * tiles_n or k == 0:
        raise ValueError(f"programs={programs}: expected 1 to the {tiles_m * tiles_n} tiles of an ({m}, {n}) "
                         f"product, and K >= 1 (K={k})")
    group_m = group_rows(tiles_m, config.constexprs.get("GROUP_M", 1))
    has_bias = bias is not None
    args = (c, a, b, bias if has_bias else c, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
            c.stride(0), c.stride(1), bias.stride(0) if has_bias else 0,
            *magic_numbers(dsl.cdiv(k, block_k)), *magic_numbers(group_m * tiles_n))
    acc = dsl.float64 if a.dtype == torch.float64 else dsl.float32
    options = dict(config.constexprs, GROUP_M=group_m, HAS_BIAS=has_bias, ACTIVATION=activation, ACC=acc,
                   DEFERRED_STORE=deferred_store, num_warps=config.num_warps, num_stages=config.num_stages)
    return args, options


def launch(c: torch.Tensor, a: torch.Tensor, b: torch.Tensor, bias: Optional[torch.Tensor],
           activation: Optional[str], config: dsl.Config, programs: int, interpret: bool = False,
           deferred_store: bool = DEFERRED_STORE) -> torch.Tensor:
    """c = activation(a @ b + bias) by matmul_persistent_kernel with `config` over `programs` programs.
    c: (M, N), a: (M, K), b: (K, N) as matmul_tma_kernel takes them; bias: (N,) or None. Returns c.
    deferred_store: each tile's store waits for the next tile's first K step (`DEFERRED_STORE`).

    Raises:
        ValueError: `programs` not from 1 to the number of tiles, or K = 0 (no tile would be written).
    """
    args, options = _arguments(c, a, b, bias, activation, config, programs, deferred_store)
    matmul_persistent_kernel[(programs,)](*args, interpret=interpret, **options)
    return c


def prepare(c: torch.Tensor, a: torch.Tensor, b: torch.Tensor, bias: Optional[torch.Tensor],
            activation: Optional[str], config: dsl.Config, programs: int,
            deferred_store: bool = DEFERRED_STORE) -> Callable:
    """`launch(c, a, b, bias)`: `launch` prepared for tensors like these (JITFunction.prepare)."""
    args, options = _arguments(c, a, b, bias, activation, config, programs, deferred_store)
    prepared = matmul_persistent_kernel.prepare((programs,), *args, interpret=False, **options)
    return lambda c, a, b, bias: prepared(c, a, b, c if bias is None else bias)
