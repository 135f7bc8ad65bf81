"""Triton idioms the DSL takes as Triton does (from the session-26 tutorials review): dsl.static_assert,
dsl.clamp, Python's min / max of kernel values (dsl.minimum / dsl.maximum folded left to right) and `x.T`.
Values from the interpreter against torch, and the kernels compiled for sm_90a."""

from __future__ import annotations

import pytest
import torch

import fusedops.dsl as dsl
from fusedops.dsl import CompilationError


@dsl.jit
def _static_assert_kernel(o_ptr, B: dsl.constexpr):
    dsl.static_assert(B >= 16, "B must be at least 16")
    dsl.store(o_ptr + dsl.arange(0, B), 1.0)


def test_static_assert_passes_and_fails_at_compile_time():
    out = torch.zeros(16)
    _static_assert_kernel[(1,)](out, B=16, interpret=True)
    assert out.eq(1.0).all()
    with pytest.raises(CompilationError, match="B must be at least 16"):
        _static_assert_kernel[(1,)](torch.zeros(8), B=8, interpret=True)


@dsl.jit
def _static_assert_runtime(o_ptr, n):
    dsl.static_assert(n > 0)
    dsl.store(o_ptr, 1.0)


def test_static_assert_of_a_runtime_value_is_refused():
    with pytest.raises(CompilationError, match="compile-time condition.*device_assert"):
        _static_assert_runtime[(1,)](torch.zeros(1), 3, interpret=True)


@dsl.jit
def _clamp_kernel(o_ptr, x_ptr, lo, hi, n, BLOCK: dsl.constexpr):
    offsets = dsl.arange(0, BLOCK)
    x = dsl.load(x_ptr + offsets, mask=offsets < n, other=0.0)
    dsl.store(o_ptr + offsets, dsl.clamp(x, lo, hi), mask=offsets < n)


def test_clamp_matches_torch():
    x = torch.randn(37, generator=torch.Generator().manual_seed(1)) * 3
    out = torch.full_like(x, float("nan"))
    _clamp_kernel[(1,)](out, x, -1.25, 0.5, 37, BLOCK=64, interpret=True)
    assert torch.equal(out, x.clamp(-1.25, 0.5))
    assert "max.NaN.f32" in _clamp_kernel.compile(out, x, -1.25, 0.5, 37, BLOCK=64, target="sm_90a").asm["ptx"]


@dsl.jit
def _min_max_kernel(o_ptr, x_ptr, n, cap, BLOCK: dsl.constexpr):
    offsets = dsl.arange(0, BLOCK)
    x = dsl.load(x_ptr + offsets, mask=offsets < n, other=0)
    dsl.store(o_ptr + offsets, max(min(x, cap, 100), -7), mask=offsets < n)
    dsl.store(o_ptr + BLOCK, min(n, 3))             # scalars (tutorial 03's group size)


def test_python_min_max_of_kernel_values():
    x = torch.randint(-50, 200, (29,), dtype=torch.int32, generator=torch.Generator().manual_seed(2))
    out = torch.full((33,), -999, dtype=torch.int32)
    _min_max_kernel[(1,)](out, x, 29, 40, BLOCK=32, interpret=True)
    assert torch.equal(out[:29], x.clamp(max=40).clamp(min=-7))
    assert out[29:32].eq(-999).all() and out[32].item() == 3
    _min_max_kernel.compile(out, x, 29, 40, BLOCK=32, target="sm_90a")


@dsl.jit
def _min_of_one_block(o_ptr, x_ptr, BLOCK: dsl.constexpr):
    dsl.store(o_ptr, min(dsl.load(x_ptr + dsl.arange(0, BLOCK))))


def test_python_min_of_one_block_points_to_dsl():
    with pytest.raises(CompilationError, match="dsl.minimum"):
        _min_of_one_block[(1,)](torch.zeros(1), torch.zeros(16), BLOCK=16, interpret=True)


@dsl.jit
def _transpose_dot(o_ptr, x_ptr, BLOCK: dsl.constexpr):
    i = dsl.arange(0, BLOCK)
    a = dsl.load(x_ptr + i[:, None] * BLOCK + i[None, :])
    dsl.store(o_ptr + i[:, None] * BLOCK + i[None, :], dsl.dot(a, a.T))


def test_T_is_the_transpose():
    x = torch.randn(16, 16, generator=torch.Generator().manual_seed(3)).half()
    out = torch.full((16, 16), float("nan"))
    _transpose_dot[(1,)](out, x, BLOCK=16, interpret=True)
    assert torch.allclose(out.double(), x.double() @ x.double().T, atol=1e-5, rtol=1e-5)
    assert "mma" in _transpose_dot.compile(out, x, BLOCK=16, target="sm_90a", num_warps=4).asm["ptx"]
