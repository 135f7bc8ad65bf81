"""GPU tier: the Foundation kernels compiled and run on the GPU against float64 references and the
interpreter, at many sizes (1, primes, 2^k +- 1, several blocks), with poisoned outputs."""

from __future__ import annotations

import pytest
import torch

import fusedops.dsl as dsl
import kernels_for_tests as K
from helpers import assert_close, random_tensor

pytestmark = pytest.mark.cuda

SIZES = [1, 2, 3, 17, 127, 128, 129, 1000, 1023, 1024, 1025, 4097, 65537, 1_000_003]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("block", [128, 1024])
def test_vector_add(n, dtype, block, seed):
    x = random_tensor((n,), dtype, "cuda", seed)
    y = random_tensor((n,), dtype, "cuda", seed + 1)
    out = K.vector_add(x, y, block=block, interpret=False)
    assert_close(out, x.double() + y.double(), dtype)


def test_vector_add_matches_interpreter(seed):
    x = random_tensor((1000,), torch.float32, "cuda", seed)
    y = random_tensor((1000,), torch.float32, "cuda", seed + 1)
    gpu = K.vector_add(x, y, interpret=False)
    cpu = K.vector_add(x.cpu(), y.cpu(), interpret=True)
    torch.testing.assert_close(gpu.cpu(), cpu, rtol=0, atol=0)


def test_vector_add_unaligned_view(seed):
    base = random_tensor((4099,), torch.float16, "cuda", seed)
    x, y = base[1:4097], base[3:4099]   # 2- and 6-byte offsets: no 16-byte vectors allowed
    out = K.vector_add(x, y, block=1024, interpret=False)
    assert_close(out, x.double() + y.double(), torch.float16)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (37, 1000), (128, 1024), (5, 1025), (2, 4096), (64, 3001)])
def test_softmax(shape, dtype, seed):
    x = random_tensor(shape, dtype, "cuda", seed, scale=4.0)
    y = K.softmax(x, interpret=False)
    assert_close(y, torch.softmax(x.double(), dim=-1), dtype)


def test_softmax_large_shift(seed):
    x = random_tensor((16, 999), torch.float32, "cuda", seed) + 1e4
    assert_close(K.softmax(x, interpret=False), torch.softmax(x.double(), dim=-1), torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("mnk", [(1, 1, 1), (33, 47, 71), (16, 16, 16), (100, 3, 257), (128, 128, 64)])
def test_matmul(mnk, dtype, seed):
    m, n, k = mnk
    a = random_tensor((m, k), dtype, "cuda", seed)
    b = random_tensor((k, n), dtype, "cuda", seed + 1)
    c = K.matmul(a, b, interpret=False)
    tol = 1e-5 if dtype == torch.float32 else 5e-3
    assert_close(c, a.double() @ b.double(), dtype, tol=tol)


def test_matmul_transposed_inputs(seed):
    a = random_tensor((71, 33), torch.float32, "cuda", seed).t()
    b = random_tensor((47, 71), torch.float32, "cuda", seed + 1).t()
    assert_close(K.matmul(a, b, interpret=False), a.double() @ b.double(), torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32])
@pytest.mark.parametrize("shape", [(1, 1), (5, 17), (33, 64), (9, 100)])
def test_cumsum_rows(shape, dtype, seed):
    if dtype.is_floating_point:
        x = random_tensor(shape, dtype, "cuda", seed)
    else:
        x = torch.randint(-50, 50, shape, dtype=dtype, device="cuda")
    y = K.cumsum_rows(x, interpret=False)
    reference = torch.cumsum(x.double(), dim=1)
    if dtype.is_floating_point:
        assert_close(y, reference, dtype)
    else:
        assert torch.equal(y.long(), reference.long())


@pytest.mark.parametrize("n", [1, 100, 4097, 100_000])
def test_histogram(n, seed):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 37, (n,), generator=generator, dtype=torch.int32).cuda()
    hist = K.histogram(x, 37, interpret=False)
    assert torch.equal(hist.cpu(), torch.bincount(x.cpu().long(), minlength=37).int())


@dsl.jit
def copy_kernel(out_ptr, x_ptr, n, BLOCK: dsl.constexpr):
    # x_ptr, out_ptr: (n,) of one dtype; 64-bit offsets so that n may pass 2**31
    offsets = dsl.program_id(0).to(dsl.int64) * BLOCK + dsl.arange(0, BLOCK)
    mask = offsets < n
    dsl.store(out_ptr + offsets, dsl.load(x_ptr + offsets, mask=mask), mask=mask)


def test_copy_more_than_2_pow_31_elements():
    n = (1 << 31) + 17
    x = torch.arange(n, dtype=torch.int64, device="cuda").to(torch.int8)
    out = torch.full((n,), -1, dtype=torch.int8, device="cuda")
    copy_kernel[(dsl.cdiv(n, 4096),)](out, x, n, BLOCK=4096)
    assert torch.equal(out[-4096:], x[-4096:]) and torch.equal(out[:4096], x[:4096])
    assert bool((out == x).all())
