"""`dsl.sigmoid`'s float32 division is the approximate reciprocal (the DIV op's `approx` attr: rcp.approx.f32),
while `/` in a kernel stays IEEE: the PTX of both in one kernel (common subexpressions keep them apart), the
float64 path, values against float64 in the interpreter and on the GPU, and the matmul epilogues it freed from
spilling (silu, gelu_tanh)."""

from __future__ import annotations

import re

import pytest
import torch

import fusedops.dsl as dsl
from fusedops.dsl.target import assemble, ptxas_available
from fusedops.kernels import matmul as mm
from fusedops.kernels.matmul_configs import WGMMA_CONFIGS
from fusedops.kernels.matmul_kernels import matmul_tma_kernel
from helpers import poison

needs_ptxas = pytest.mark.skipif(not ptxas_available(), reason="ptxas is not on the PATH")


@dsl.jit
def _sigmoid_and_quotient(o_ptr, x_ptr, n, BLOCK: dsl.constexpr, WIDE: dsl.constexpr = dsl.float32):
    # row 0: sigmoid(x); row 1: sigmoid(-x) written with `/` (an IEEE division; not the same expression, which
    # LLVM would merge with the approximate one, dropping its fast-math flag)
    i = dsl.program_id(0) * BLOCK + dsl.arange(0, BLOCK)
    x = dsl.load(x_ptr + i, mask=i < n, other=0.0)
    dsl.store(o_ptr + i, dsl.sigmoid(x), mask=i < n)
    dsl.store(o_ptr + n + i, 1.0 / (1.0 + dsl.exp(x.to(WIDE))), mask=i < n)


def _divisions(ptx: str) -> set:
    return set(re.findall(r"\b((?:rcp|div)\.[a-z0-9.]+)", ptx))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_ptx_sigmoid_approximate_reciprocal_beside_an_ieee_division(dtype):
    x = torch.empty(256, dtype=dtype)
    ptx = _sigmoid_and_quotient.compile(x, x, 256, target="sm_90a", BLOCK=256).asm["ptx"]
    assert _divisions(ptx) == {"rcp.approx.f32", "rcp.rn.f32"}, _divisions(ptx)


def test_ptx_float64_sigmoid_stays_exact():
    x = torch.empty(256, dtype=torch.float64)
    ptx = _sigmoid_and_quotient.compile(x, x, 256, target="sm_90a", BLOCK=256, WIDE=dsl.float64).asm["ptx"]
    assert "approx" not in " ".join(_divisions(ptx)) and _divisions(ptx)


def _inputs(device="cpu") -> torch.Tensor:
    torch.manual_seed(0)
    edges = [0.0, -0.0, 1e-30, -1e-30, 15.0, -15.0, 88.0, -88.0, -87.3, -100.0, -104.0, 104.0,
             float("inf"), float("-inf"), float("nan")]
    return torch.cat([torch.randn(1009) * 12, torch.tensor(edges)]).to(device)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_interpreter_values(dtype):
    x = _inputs().to(dtype)
    n = x.numel()
    out = poison(torch.empty(2 * n, dtype=dtype))
    wide = dsl.float64 if dtype == torch.float64 else dsl.float32
    _sigmoid_and_quotient[(dsl.cdiv(n, 512),)](out, x, n, BLOCK=512, WIDE=wide, interpret=True)
    tol = {torch.float32: 1e-6, torch.float64: 1e-15, torch.float16: 1e-3, torch.bfloat16: 8e-3}[dtype]
    _check(out, x, tol)


def _check(out, x, rtol, rtol_per_unit_x=0.0):
    """Both rows of `out` against float64 sigmoid rounded to x's dtype, within atol + rtol' |expected| where
    rtol' = rtol + rtol_per_unit_x * |x| (an error that grows with |x|: exp(x) as ex2 of x * log2(e) rounded)."""
    n = x.numel()
    atol = torch.finfo(x.dtype).smallest_normal     # 1 / (1 + exp(-x)) underflows where exp(-x) overflows
    for row, sign in ((out[:n], 1), (out[n:], -1)):
        expected = torch.sigmoid(sign * x.double()).to(x.dtype).double()     # rounded once to x's dtype
        actual = row.double()
        allowed = atol + (rtol + rtol_per_unit_x * x.double().abs()) * expected.abs()
        same = (actual == expected) | (actual.isnan() & expected.isnan())
        bad = ~same & ~((actual - expected).abs() <= allowed)
        assert not bad.any(), (f"{int(bad.sum())} of {n} values off: x={x[bad][:5].tolist()} "
                               f"got={actual[bad][:5].tolist()} expected={expected[bad][:5].tolist()}")


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_gpu_values_within_a_few_ulp(dtype):
    x = _inputs("cuda").to(dtype)
    n = x.numel()
    out = poison(torch.empty(2 * n, dtype=dtype, device="cuda"))
    _sigmoid_and_quotient[(dsl.cdiv(n, 512),)](out, x, n, BLOCK=512)
    # float32: exp(x) is ex2.approx of x * log2(e) rounded to float32, whose rounding (half an ulp of the
    # product) makes a relative error of up to |x| * 2^-24 in the result (2.8e-6 at |x| = 47: seen on the H200),
    # plus ex2.approx's and rcp.approx's few ulp
    _check(out.cpu(), x.cpu(), {torch.float32: 1e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}[dtype],
           rtol_per_unit_x=2.0 ** -24 if dtype == torch.float32 else 0.0)


@needs_ptxas
@pytest.mark.parametrize("index", [0, 1])
@pytest.mark.parametrize("activation, bias", [("silu", False), ("gelu_tanh", True)])
def test_tma_matmul_silu_and_gelu_tanh_epilogues_do_not_spill(index, activation, bias, tmp_path, monkeypatch):
    # 128 x 256 and 256 x 128 on 8 warps: 255 registers and 168-328 bytes spilled with the IEEE division
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    config = WGMMA_CONFIGS[index]
    c = torch.empty(1, 4096, 4096, dtype=torch.float16)
    args, constexprs, _ = mm._tma_launch(c, c, c, torch.empty(4096, dtype=torch.float16) if bias else None,
                                         activation)
    ptx = matmul_tma_kernel.compile(*args, target="sm_90a", num_warps=config.num_warps,
                                       num_stages=config.num_stages, **dict(constexprs, **config.constexprs)).asm["ptx"]
    assert "rcp.approx.f32" in ptx
    result = assemble(ptx, "sm_90a")
    assert result.spill_bytes == 0, f"{config}: {result.registers} registers, {result.spill_bytes} bytes spilled"
