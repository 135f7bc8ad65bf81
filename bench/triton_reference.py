"""Triton reference kernels: a peer for fusedops in the benchmark (`python -m fusedops.bench --triton`).

This file lives outside the fusedops package on purpose: fusedops never imports Triton. The
benchmark's "triton" provider loads this file by path, only when asked and only when triton is
installed; each function has the calling convention of its case in fusedops/bench/cases.py.

    softmax(x)                 x: (M, N) fp16/bf16/fp32, contiguous rows; softmax over the last dim
    layer_norm(x, w, b)        x: (M, N), w and b: (N,); eps 1e-5 as torch's default
    matmul(a, b)               a: (M, K), b: (K, N) fp16/bf16; fp32 accumulation

Written for this benchmark in the usual style of Triton kernels (one program per row for the row
ops, tiled matmul with grouped program order); not tuned beyond a few configs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_MAX_ONE_PASS = 16384   # longest row held in registers in one tile; longer rows loop over chunks


def _warps(block: int) -> int:
    return max(1, min(16, block // 512))


@triton.jit
def _softmax_kernel(y_ptr, x_ptr, x_stride, y_stride, n_cols, BLOCK: tl.constexpr, ONE_PASS: tl.constexpr):
    # x_ptr, y_ptr: (M, n_cols) with unit column stride; one program per row
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_stride
    y_row = y_ptr + row * y_stride
    cols = tl.arange(0, BLOCK)
    if ONE_PASS:
        x = tl.load(x_row + cols, mask=cols < n_cols, other=-float("inf")).to(tl.float32)
        numerator = tl.exp(x - tl.max(x, axis=0))
        y = numerator / tl.sum(numerator, axis=0)
        tl.store(y_row + cols, y.to(y_ptr.dtype.element_ty), mask=cols < n_cols)
    else:
        # online max and rescaled sum over chunks, then a second sweep writing the outputs
        running_max = tl.full((BLOCK,), -float("inf"), tl.float32)
        running_sum = tl.zeros((BLOCK,), tl.float32)
        for start in range(0, n_cols, BLOCK):
            x = tl.load(x_row + start + cols, mask=start + cols < n_cols, other=-float("inf")).to(tl.float32)
            new_max = tl.maximum(running_max, x)
            shift = tl.where(new_max == -float("inf"), 0.0, new_max)
            running_sum = running_sum * tl.exp(running_max - shift) + tl.exp(x - shift)
            running_max = new_max
        row_max = tl.max(running_max, axis=0)
        total = tl.sum(running_sum * tl.exp(running_max - row_max), axis=0)
        for start in range(0, n_cols, BLOCK):
            mask = start + cols < n_cols
            x = tl.load(x_row + start + cols, mask=mask, other=-float("inf")).to(tl.float32)
            tl.store(y_row + start + cols, (tl.exp(x - row_max) / total).to(y_ptr.dtype.element_ty), mask=mask)


def softmax(x: torch.Tensor) -> torch.Tensor:
    """softmax over the last dim of a 2-D tensor with unit column stride."""
    n_rows, n_cols = x.shape
    assert x.stride(1) == 1, "the Triton reference needs rows with unit column stride"
    y = torch.empty_like(x)
    block = triton.next_power_of_2(n_cols)
    one_pass = block <= _MAX_ONE_PASS
    block = min(block, _MAX_ONE_PASS // 4) if not one_pass else block
    _softmax_kernel[(n_rows,)](y, x, x.stride(0), y.stride(0), n_cols, BLOCK=block, ONE_PASS=one_pass,
                               num_warps=_warps(block))
    return y


@triton.jit
def _layer_norm_kernel(y_ptr, x_ptr, w_ptr, b_ptr, x_stride, y_stride, n_cols, eps, BLOCK: tl.constexpr,
                       ONE_PASS: tl.constexpr):
    # x_ptr, y_ptr: (M, n_cols) with unit column stride; w_ptr, b_ptr: (n_cols,); one program per row
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_stride
    y_row = y_ptr + row * y_stride
    cols = tl.arange(0, BLOCK)
    if ONE_PASS:
        mask = cols < n_cols
        x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
        mean = tl.sum(x, axis=0) / n_cols
        centered = tl.where(mask, x - mean, 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(centered * centered, axis=0) / n_cols + eps)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_row + cols, (centered * rstd * w + b).to(y_ptr.dtype.element_ty), mask=mask)
    else:
        total = tl.zeros((BLOCK,), tl.float32)
        for start in range(0, n_cols, BLOCK):
            total += tl.load(x_row + start + cols, mask=start + cols < n_cols, other=0.0).to(tl.float32)
        mean = tl.sum(total, axis=0) / n_cols
        squares = tl.zeros((BLOCK,), tl.float32)
        for start in range(0, n_cols, BLOCK):
            mask = start + cols < n_cols
            x = tl.load(x_row + start + cols, mask=mask, other=0.0).to(tl.float32)
            centered = tl.where(mask, x - mean, 0.0)
            squares += centered * centered
        rstd = 1.0 / tl.sqrt(tl.sum(squares, axis=0) / n_cols + eps)
        for start in range(0, n_cols, BLOCK):
            mask = start + cols < n_cols
            x = tl.load(x_row + start + cols, mask=mask, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + start + cols, mask=mask, other=0.0).to(tl.float32)
            b = tl.load(b_ptr + start + cols, mask=mask, other=0.0).to(tl.float32)
            tl.store(y_row + start + cols, ((x - mean) * rstd * w + b).to(y_ptr.dtype.element_ty), mask=mask)


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """layer_norm over the last dim of a 2-D tensor with unit column stride, with weight and bias."""
    n_rows, n_cols = x.shape
    assert x.stride(1) == 1, "the Triton reference needs rows with unit column stride"
    y = torch.empty_like(x)
    block = triton.next_power_of_2(n_cols)
    one_pass = block <= _MAX_ONE_PASS
    block = min(block, _MAX_ONE_PASS // 4) if not one_pass else block
    _layer_norm_kernel[(n_rows,)](y, x, weight, bias, x.stride(0), y.stride(0), n_cols, eps, BLOCK=block,
                                  ONE_PASS=one_pass, num_warps=_warps(block))
    return y


_MATMUL_CONFIGS = [
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8}, num_stages=3, num_warps=8),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8}, num_stages=4, num_warps=4),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 32, "GROUP_M": 8}, num_stages=4, num_warps=4),
]


@triton.autotune(configs=_MATMUL_CONFIGS, key=["M", "N", "K"])
@triton.jit
def _matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    # a: (M, K), b: (K, N), c: (M, N); one program per BLOCK_M x BLOCK_N tile of c. Programs are
    # ordered in groups of GROUP_M tile rows so that neighbours share tiles of a and b in L2.
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * tiles_n
    first_m = (pid // per_group) * GROUP_M
    group_rows = min(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_rows
    pid_n = (pid % per_group) // group_rows
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rm[:, None].to(tl.int64) * stride_am + rk[None, :] * stride_ak
    b_ptrs = b_ptr + rk[:, None].to(tl.int64) * stride_bk + rn[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=(rm[:, None] < M) & (rk[None, :] < k_left), other=0.0)
        b = tl.load(b_ptrs, mask=(rk[:, None] < k_left) & (rn[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    c_ptrs = c_ptr + rm[:, None].to(tl.int64) * stride_cm + rn[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b for 2-D fp16/bf16 tensors (any strides), accumulated in fp32."""
    (M, K), (_, N) = a.shape, b.shape
    c = torch.empty((M, N), dtype=a.dtype, device=a.device)
    grid = lambda meta: (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),)  # noqa: E731
    _matmul_kernel[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0),
                         c.stride(1))
    return c
