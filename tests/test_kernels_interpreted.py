"""The Foundation acceptance kernels (tests/kernels_for_tests.py) run in the interpreter against
torch float64 references."""

from __future__ import annotations

import pytest
import torch

import kernels_for_tests as kernels
from helpers import assert_close, random_tensor


@pytest.mark.parametrize("n", [1, 1000, 4097])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_vector_add_with_tail(n, dtype, seed):
    x = random_tensor((n,), dtype, seed=seed)
    y = random_tensor((n,), dtype, seed=seed + 1)
    out = kernels.vector_add(x, y, block=1024, interpret=True)
    assert_close(out, x.double() + y.double(), dtype)


@pytest.mark.parametrize("shape", [(37, 1000), (5, 1), (3, 129)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_row_softmax_non_power_of_two_width(shape, dtype, seed):
    x = random_tensor(shape, dtype, seed=seed, scale=3.0)
    y = kernels.softmax(x, interpret=True)
    assert_close(y, torch.softmax(x.double(), dim=-1), dtype)


def test_row_softmax_strided_rows(seed):
    base = random_tensor((6, 80), torch.float32, seed=seed)
    x = base[::2, :50]              # row stride 160, 50 columns
    y = kernels.softmax(x, interpret=True)
    assert_close(y, torch.softmax(x.double(), dim=-1), torch.float32)


@pytest.mark.parametrize("M, N, K", [(33, 47, 71), (16, 16, 16), (1, 5, 3)])
def test_blocked_matmul_with_masks_on_all_dims(M, N, K, seed):
    a = random_tensor((M, K), torch.float32, seed=seed)
    b = random_tensor((K, N), torch.float32, seed=seed + 1)
    c = kernels.matmul(a, b, interpret=True)
    assert_close(c, a.double() @ b.double(), torch.float32)


def test_blocked_matmul_float16_transposed_operand(seed):
    a = random_tensor((33, 71), torch.float16, seed=seed)
    b = random_tensor((47, 71), torch.float16, seed=seed + 1).t()     # (71, 47) with strides (1, 71)
    c = kernels.matmul(a, b, interpret=True)
    assert_close(c, a.double() @ b.double(), torch.float16)


@pytest.mark.parametrize("shape", [(13, 37), (4, 1), (9, 64)])
@pytest.mark.parametrize("dtype", [torch.int32, torch.float32])
def test_cumsum_along_rows(shape, dtype, seed):
    x = random_tensor(shape, dtype, seed=seed)
    y = kernels.cumsum_rows(x, interpret=True)
    assert_close(y, torch.cumsum(x.double(), dim=1).to(y.dtype) if dtype == torch.int32
                 else torch.cumsum(x.double(), dim=1), dtype)


@pytest.mark.parametrize("n, n_bins", [(1000, 10), (333, 1), (77, 100)])
def test_atomic_add_histogram_with_collisions(n, n_bins, seed):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randint(0, n_bins, (n,), generator=generator, dtype=torch.int32)
    hist = kernels.histogram(x, n_bins, interpret=True)
    assert hist.tolist() == torch.bincount(x, minlength=n_bins).tolist()
    assert int(hist.sum()) == n
