"""Descriptor atomic adds: `desc.atomic_add(offsets, value)` (language/descriptors.py), the copy engine's bulk
reduction it becomes on sm_90a (passes/descriptors.py, codegen/tma_store.py: cp.reduce.async.bulk.tensor .add)
and the per-element atomics it is everywhere else.

CPU tier: the interpreter's semantics (many programs adding into overlapping boxes, only the elements inside
the tensor, negative and past-the-end offsets, a column-major tensor, int32 and uint32 wrapping, a scalar
value), the errors, which adds become the copy engine's and which atomics, and the PTX, which ptxas must
accept. GPU tier: the same boxes through the copy engine and through the per-element fallback (exact
integer sums in float32), and a split-K matrix product whose programs add their wgmma partial products.
"""

from __future__ import annotations

import pytest
import torch

import fusedops.dsl as dsl
from fusedops.dsl.ir import OpCode
from fusedops.dsl.target import assemble, ptxas_available
from helpers import random_tensor

needs_ptxas = pytest.mark.skipif(not ptxas_available(), reason="ptxas is not on the PATH")


@dsl.jit
def _box_add_kernel(y_ptr, x_ptr, rows, cols, stride_r, stride_c, offset_r, offset_c,
                    BLOCK_R: dsl.constexpr, BLOCK_C: dsl.constexpr):
    # program p: y[offset_r + p:, offset_c:][:BLOCK_R, :BLOCK_C] += (p + 1) * x (x: row-major BLOCK_R x BLOCK_C)
    p = dsl.program_id(0)
    tile = dsl.load(x_ptr + dsl.arange(0, BLOCK_R)[:, None] * BLOCK_C + dsl.arange(0, BLOCK_C)[None, :])
    y = dsl.make_tensor_descriptor(y_ptr, (rows, cols), (stride_r, stride_c), (BLOCK_R, BLOCK_C))
    y.atomic_add((offset_r + p, offset_c), tile * (p + 1))


def _add_boxes(y, x, r0, c0, programs, interpret):
    _box_add_kernel[(programs,)](y, x, y.shape[0], y.shape[1], y.stride(0), y.stride(1), r0, c0,
                                 BLOCK_R=x.shape[0], BLOCK_C=x.shape[1], interpret=interpret)


def _expected(y, x, r0, c0, programs):
    out = y.clone()
    rows, cols = y.shape
    for p in range(programs):
        for i in range(x.shape[0]):
            r = r0 + p + i
            if 0 <= r < rows:
                c = torch.arange(c0, c0 + x.shape[1])
                keep = (c >= 0) & (c < cols)
                out[r, c[keep]] += (x[i, keep] * (p + 1)).to(y.dtype)
    return out


OFFSETS = [(0, 0), (3, -2), (-5, 4), (6, 6), (40, 0), (-8, -8)]


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("r0,c0", OFFSETS, ids=str)
def test_interpreter_adds_only_inside(r0, c0, transposed, seed):
    y = random_tensor((9, 5) if transposed else (5, 9), torch.float32, seed=seed)
    y = y.t() if transposed else y
    x = random_tensor((8, 8), torch.float32, seed=seed + 1)
    expected = _expected(y, x, r0, c0, 3)
    _add_boxes(y, x, r0, c0, 3, interpret=True)
    torch.testing.assert_close(y, expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.int32, torch.uint32])
def test_interpreter_integer_adds_wrap(dtype):
    y = torch.full((4, 8), 2**31 - 2 if dtype == torch.int32 else 2**32 - 2, dtype=torch.int64).to(dtype)
    x = torch.full((4, 8), 3, dtype=dtype)
    _add_boxes(y, x, 0, 0, 1, interpret=True)
    expected = -2**31 + 0 if dtype == torch.int32 else 0
    assert y.to(torch.int64).eq(expected + 1).all(), y       # (max - 1) + 3 wraps round to min + 1 (or 1)


def test_interpreter_a_stride_of_zero_adds_every_element():
    # a (4, 8) box over a tensor whose rows all alias (stride 0): each element of a column adds
    y = torch.zeros(1, 8)
    x = torch.arange(32, dtype=torch.float32).reshape(4, 8)
    _box_add_kernel[(1,)](y, x, 4, 8, 0, 1, 0, 0, BLOCK_R=4, BLOCK_C=8, interpret=True)
    assert torch.equal(y[0], x.sum(0))


@dsl.jit
def _scalar_add_kernel(y_ptr, n, value, BLOCK: dsl.constexpr):
    dsl.make_tensor_descriptor(y_ptr, (n, n), (n, 1), (BLOCK, BLOCK)).atomic_add((1, 1), value)


def test_interpreter_scalar_adds_to_the_box_converted():
    y = torch.ones(4, 4, dtype=torch.int32)
    _scalar_add_kernel[(2,)](y, 4, 2.75, BLOCK=2, interpret=True)
    expected = torch.ones(4, 4, dtype=torch.int32)
    expected[1:3, 1:3] += 4
    assert torch.equal(y, expected)


def test_other_element_types_are_refused():
    for dtype in (torch.float16, torch.bfloat16, torch.float64, torch.int64):
        with pytest.raises(dsl.CompilationError, match=r"atomic_add: the tensor's element type must be one of "
                                                        r"float32, int32, uint32, got"):
            _scalar_add_kernel[(1,)](torch.zeros(4, 4, dtype=dtype), 4, 1, BLOCK=2, interpret=True)


@dsl.jit
def _wrong_shape_kernel(y_ptr, n, BLOCK: dsl.constexpr):
    d = dsl.make_tensor_descriptor(y_ptr, (n, n), (n, 1), (BLOCK, BLOCK))
    d.atomic_add((0, 0), dsl.zeros((BLOCK, 2 * BLOCK), dsl.float32))


def test_wrong_block_shape_names_the_method():
    with pytest.raises(dsl.CompilationError, match=r"descriptor atomic_add: the value must be a \(4, 4\) block"):
        _wrong_shape_kernel[(1,)](torch.zeros(8, 8), 8, BLOCK=4, interpret=True)


# -- lowering ----------------------------------------------------------------------------------------

def _compile(arch, y=None, block=(32, 64)):
    y = torch.zeros(4096, 4096) if y is None else y
    x = torch.zeros(block)
    # a fresh JITFunction: the knobs are read at compile time, and a compiled kernel is kept per JITFunction
    return dsl.jit(_box_add_kernel.fn).compile(y, x, y.shape[0], y.shape[1], y.stride(0), y.stride(1), 0, 0,
                                               target=arch, BLOCK_R=block[0], BLOCK_C=block[1])


def test_copy_engine_on_sm90a_atomics_elsewhere(tma_ws0, monkeypatch):
    ir = _compile("sm_90a").asm["ir"]
    assert "tma_store" in ir and 'reduce="add"' in ir and "atomic_rmw" not in ir, ir
    for arch in ("sm_80",):
        ir = _compile(arch).asm["ir"]
        assert "tma_store" not in ir and "atomic_rmw" in ir and "relaxed" in ir
    monkeypatch.setenv("FUSEDOPS_TMA", "0")
    ir = _compile("sm_90a").asm["ir"]
    assert "tma_store" not in ir and "atomic_rmw" in ir


@needs_ptxas
@pytest.mark.parametrize("column_major", [False, True])
def test_ptx_bulk_reduction_and_fallback_assemble(tma_ws0, column_major):
    y = torch.zeros(4096, 4096)
    y = y.t() if column_major else y
    ptx = _compile("sm_90a", y, (32, 64) if not column_major else (64, 32)).asm["ptx"]
    assert ptx.count("cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.tile.bulk_group") == 2
    assert "cp.async.bulk.tensor.2d.global.shared::cta" not in ptx          # no plain TMA store
    assert "cp.async.bulk.commit_group" in ptx and "atom.global.add.f32" in ptx or "red.global.add.f32" in ptx
    result = assemble(ptx, "sm_90a")
    assert result.spill_bytes == 0 and "warning" not in result.log.lower(), result.log
    assert "atom.global" in _compile("sm_80").asm["ptx"] or "red.global" in _compile("sm_80").asm["ptx"]


# -- GPU tier ----------------------------------------------------------------------------------------

@pytest.mark.cuda
@pytest.mark.parametrize("block", [(32, 64), (64, 32), (16, 128)], ids=str)
@pytest.mark.parametrize("r0, c0", [(0, 0), (100, 896), (-20, -40), (250, 1000), (1, 3), (7, 900)], ids=str)
def test_gpu_boxes_add_exactly(block, r0, c0, seed):
    # integers in float32: every order of the additions gives the same sums. (1, 3) and (-20, -40) start
    # off 16 bytes or before the tensor: the per-element atomics; the others: the copy engine.
    generator = torch.Generator().manual_seed(seed)
    y = torch.randint(-50, 50, (300, 1000), generator=generator).float()
    x = torch.randint(-4, 5, block, generator=generator).float()
    expected = _expected(y, x, r0, c0, 40)
    y, x = y.cuda(), x.cuda()
    _add_boxes(y, x, r0, c0, 40, interpret=False)
    assert torch.equal(y.cpu(), expected)


@pytest.mark.cuda
def test_gpu_int32_boxes_add_exactly(seed):
    generator = torch.Generator().manual_seed(seed)
    y = torch.randint(-1000, 1000, (200, 300), generator=generator, dtype=torch.int32)
    x = torch.randint(-9, 10, (32, 64), generator=generator, dtype=torch.int32)
    expected = _expected(y, x, 5, 32, 64)
    y, x = y.cuda(), x.cuda()
    _add_boxes(y, x, 5, 32, 64, interpret=False)
    assert torch.equal(y.cpu(), expected)


@dsl.jit
def _split_k_kernel(c_ptr, a_ptr, b_ptr, M, N, K, split_k,
                    BLOCK_M: dsl.constexpr, BLOCK_N: dsl.constexpr, BLOCK_K: dsl.constexpr):
    # c (float32, zeroed) += a @ b, program (m, n, s) adding the product of its K slice s of split_k
    pid_m, pid_n, split = dsl.program_id(0), dsl.program_id(1), dsl.program_id(2)
    a_desc = dsl.make_tensor_descriptor(a_ptr, (M, K), (K, 1), (BLOCK_M, BLOCK_K))
    b_desc = dsl.make_tensor_descriptor(b_ptr, (K, N), (N, 1), (BLOCK_K, BLOCK_N))
    c_desc = dsl.make_tensor_descriptor(c_ptr, (M, N), (N, 1), (BLOCK_M, BLOCK_N))
    acc = dsl.zeros((BLOCK_M, BLOCK_N), dsl.float32)
    for k0 in range(split * BLOCK_K, K, split_k * BLOCK_K):
        acc = dsl.dot(a_desc.load((pid_m * BLOCK_M, k0)), b_desc.load((k0, pid_n * BLOCK_N)), acc)
    c_desc.atomic_add((pid_m * BLOCK_M, pid_n * BLOCK_N), acc)


def test_interpreter_split_k_matmul(seed):
    generator = torch.Generator().manual_seed(seed)
    m, n, k, split_k = 40, 48, 100, 3
    a, b = torch.randn(m, k, generator=generator), torch.randn(k, n, generator=generator)
    c = torch.zeros(m, n)
    _split_k_kernel[(dsl.cdiv(m, 16), dsl.cdiv(n, 16), split_k)](c, a, b, m, n, k, split_k, BLOCK_M=16, BLOCK_N=16,
                                                                 BLOCK_K=16, interpret=True)
    torch.testing.assert_close(c.double(), a.double() @ b.double(), rtol=1e-4, atol=1e-4)


@pytest.mark.cuda
@pytest.mark.parametrize("m, n, k, split_k", [(1000, 520, 4096, 8), (128, 256, 64, 1), (300, 700, 1000, 5)])
def test_gpu_split_k_matmul_adds_partial_products(m, n, k, split_k, seed):
    generator = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(m, k, device="cuda", dtype=torch.float16, generator=generator)
    b = torch.randn(k, n, device="cuda", dtype=torch.float16, generator=generator) * k ** -0.5
    c = torch.zeros(m, n, device="cuda")
    grid = (dsl.cdiv(m, 128), dsl.cdiv(n, 128), split_k)
    _split_k_kernel[grid](c, a, b, m, n, k, split_k, BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_warps=8,
                          num_stages=3)
    torch.testing.assert_close(c.double(), a.double() @ b.double(), rtol=1e-3, atol=1e-3)
