"""The Foundation acceptance kernels, written in the DSL, with their launch wrappers.

The interpreter tests (test_kernels_interpreted.py) run them on CPU tensors; the code generation and
GPU tests compile and launch the same kernels. Every wrapper takes `interpret` and passes it through
(None: follow FUSEDOPS_INTERPRET), allocates its output poisoned, and returns it.
"""

from __future__ import annotations

import torch

import fusedops.dsl as dsl
from helpers import poison


@dsl.jit
def vector_add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: dsl.constexpr):
    # x_ptr, y_ptr, out_ptr: (n,) tensors of one dtype
    pid = dsl.program_id(0)
    offsets = pid * BLOCK + dsl.arange(0, BLOCK)
    mask = offsets < n
    x = dsl.load(x_ptr + offsets, mask=mask)
    y = dsl.load(y_ptr + offsets, mask=mask)
    dsl.store(out_ptr + offsets, x + y, mask=mask)


def vector_add(x: torch.Tensor, y: torch.Tensor, *, block: int = 256, interpret=None) -> torch.Tensor:
    out = poison(torch.empty_like(x))
    n = x.numel()
    vector_add_kernel[(dsl.cdiv(n, block),)](x, y, out, n, BLOCK=block, interpret=interpret)
    return out


@dsl.jit
def softmax_kernel(y_ptr, x_ptr, x_row_stride, y_row_stride, n_cols, BLOCK: dsl.constexpr):
    # x_ptr, y_ptr: (n_rows, n_cols) with unit column stride; one program per row; BLOCK >= n_cols
    row = dsl.program_id(0)
    cols = dsl.arange(0, BLOCK)
    mask = cols < n_cols
    x = dsl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=-float("inf"))
    x = x.to(dsl.float32)
    numerator = dsl.exp(x - dsl.max(x, axis=0))
    denominator = dsl.sum(numerator, axis=0)
    y = numerator / denominator
    dsl.store(y_ptr + row * y_row_stride + cols, y, mask=mask)


def softmax(x: torch.Tensor, *, interpret=None) -> torch.Tensor:
    n_rows, n_cols = x.shape
    y = poison(torch.empty_like(x))
    block = 1 << max(0, (n_cols - 1).bit_length())
    softmax_kernel[(n_rows,)](y, x, x.stride(0), y.stride(0), n_cols, BLOCK=block, interpret=interpret)
    return y


@dsl.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                  BLOCK_M: dsl.constexpr, BLOCK_N: dsl.constexpr, BLOCK_K: dsl.constexpr):
    # a_ptr: (M, K), b_ptr: (K, N), c_ptr: (M, N), any strides; one program per BLOCK_M x BLOCK_N tile of c
    pid_m = dsl.program_id(0)
    pid_n = dsl.program_id(1)
    rm = pid_m * BLOCK_M + dsl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + dsl.arange(0, BLOCK_N)
    rk = dsl.arange(0, BLOCK_K)
    acc = dsl.zeros((BLOCK_M, BLOCK_N), dsl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + rk
        a = dsl.load(a_ptr + rm[:, None] * stride_am + kk[None, :] * stride_ak,
                     mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
        b = dsl.load(b_ptr + kk[:, None] * stride_bk + rn[None, :] * stride_bn,
                     mask=(kk[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc = dsl.dot(a, b, acc)
    c = acc.to(c_ptr.dtype.element)
    dsl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn, c,
              mask=(rm[:, None] < M) & (rn[None, :] < N))


def matmul(a: torch.Tensor, b: torch.Tensor, *, block_m=16, block_n=16, block_k=16, interpret=None) -> torch.Tensor:
    M, K = a.shape
    _, N = b.shape
    c = poison(torch.empty((M, N), dtype=a.dtype, device=a.device))
    grid = lambda meta: (dsl.cdiv(M, meta["BLOCK_M"]), dsl.cdiv(N, meta["BLOCK_N"]))  # noqa: E731
    matmul_kernel[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0),
                        c.stride(1), BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, interpret=interpret)
    return c


@dsl.jit
def cumsum_rows_kernel(y_ptr, x_ptr, n_rows, n_cols, stride_x, stride_y,
                       BLOCK_ROWS: dsl.constexpr, BLOCK_COLS: dsl.constexpr):
    # x_ptr, y_ptr: (n_rows, n_cols) with unit column stride; each program scans BLOCK_ROWS rows
    rows = dsl.program_id(0) * BLOCK_ROWS + dsl.arange(0, BLOCK_ROWS)
    cols = dsl.arange(0, BLOCK_COLS)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    x = dsl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0)
    y = dsl.cumsum(x, axis=1)
    dsl.store(y_ptr + rows[:, None] * stride_y + cols[None, :], y, mask=mask)


def cumsum_rows(x: torch.Tensor, *, block_rows=4, interpret=None) -> torch.Tensor:
    n_rows, n_cols = x.shape
    y = poison(torch.empty_like(x))
    block_cols = 1 << max(0, (n_cols - 1).bit_length())
    cumsum_rows_kernel[(dsl.cdiv(n_rows, block_rows),)](y, x, n_rows, n_cols, x.stride(0), y.stride(0),
                                                        BLOCK_ROWS=block_rows, BLOCK_COLS=block_cols,
                                                        interpret=interpret)
    return y


@dsl.jit
def histogram_kernel(hist_ptr, x_ptr, n, BLOCK: dsl.constexpr):
    # x_ptr: (n,) int32 bin indices in [0, n_bins); hist_ptr: (n_bins,) int32 counts, zeroed by the caller
    offsets = dsl.program_id(0) * BLOCK + dsl.arange(0, BLOCK)
    mask = offsets < n
    bins = dsl.load(x_ptr + offsets, mask=mask, other=0)
    dsl.atomic_add(hist_ptr + bins, 1, mask=mask)


def histogram(x: torch.Tensor, n_bins: int, *, block=128, interpret=None) -> torch.Tensor:
    hist = torch.zeros(n_bins, dtype=torch.int32, device=x.device)
    n = x.numel()
    histogram_kernel[(dsl.cdiv(n, block),)](hist, x, n, BLOCK=block, interpret=interpret)
    return hist
