"""Matmul tile configs: the tables the launcher (kernels/matmul.py) autotunes among, and the fixed configs it runs
for small problems and in the interpreter."""

from __future__ import annotations

import fusedops.dsl as dsl


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
