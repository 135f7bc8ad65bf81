"""`dsl.exp` / `dsl.exp2` with `ftz=True`: float32 subnormal results flushed to zero (`ex2.approx.ftz.f32`),
against float64 references in the interpreter and on the GPU, the PTX of both variants, and the
rejection of a run-time flag."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import fusedops.dsl as dsl
from fusedops.dsl import CompilationError
from fusedops.dsl.target import assemble, ptxas_available
from helpers import poison

TINY = float(np.finfo(np.float32).tiny)     # 2^-126, float32's smallest normal


@dsl.jit
def _exponentials(o_ptr, x_ptr, n, BLOCK: dsl.constexpr, FTZ: dsl.constexpr):
    # row 0: exp2(x, ftz=FTZ), row 1: exp(x, ftz=FTZ), row 2: exp2(x) (the default: no flush), so that
    # one kernel holds both variants of one expression (common subexpressions must keep them apart)
    i = dsl.program_id(0) * BLOCK + dsl.arange(0, BLOCK)
    x = dsl.load(x_ptr + i, mask=i < n, other=0.0)
    dsl.store(o_ptr + i, dsl.exp2(x, ftz=FTZ), mask=i < n)
    dsl.store(o_ptr + n + i, dsl.exp(x, ftz=FTZ), mask=i < n)
    dsl.store(o_ptr + 2 * n + i, dsl.exp2(x), mask=i < n)


def _inputs(n: int, device="cpu") -> torch.Tensor:
    """Exponents across float32's subnormal results (2^-149 .. 2^-126 for exp2, e^-103 .. e^-87 for exp),
    the edges and specials, and ordinary values."""
    torch.manual_seed(n)
    x = torch.cat([torch.empty(n - 12).uniform_(-160.0, 20.0),
                   torch.tensor([-126.0, -126.0000076, -125.99999, -149.0, -150.0, -87.4, -103.0, 0.0, -0.0,
                                 float("inf"), float("-inf"), float("nan")])])
    return x.to(device)


def _expected(x: torch.Tensor, ftz: bool) -> torch.Tensor:
    """(exp2, exp, exp2 without flush) of x in float64; with ftz the results below 2^-126 are 0."""
    xd = x.double().cpu()
    rows = [torch.exp2(xd), torch.exp(xd), torch.exp2(xd)]
    if ftz:
        rows[:2] = [torch.where(r < TINY, torch.zeros_like(r), r) for r in rows[:2]]
    return torch.stack(rows)


def _check(out: torch.Tensor, x: torch.Tensor, ftz: bool) -> None:
    got = out.view(3, -1).double().cpu()
    want = _expected(x, ftz)
    # the flushed range is exactly zero; elsewhere within ex2's 2^-22 relative error (exp also rounds
    # x * log2(e): 2^-24 |x log2 e| more), a subnormal result within one float32 subnormal step
    tolerance = want.abs() * (2.0 ** -21 + 2.0 ** -23 * x.double().cpu().abs().clamp(max=200) * 1.45) + 2.0 ** -149
    finite = want.isfinite()
    assert torch.all((got[finite] - want[finite]).abs() <= tolerance[finite]), (got - want).abs().max()
    assert torch.equal(got[~finite].isnan(), want[~finite].isnan())
    assert torch.equal(got[want.isinf()], want[want.isinf()])
    if ftz:
        flushed = want[:2] == 0
        assert torch.all(got[:2][flushed] == 0)
        assert torch.all(got[2][(x.cpu() > -149.5) & (x.cpu() < -126.5)] > 0)   # the default keeps subnormals


@pytest.mark.parametrize("ftz", [False, True])
def test_interpreter_flushes_float32_subnormal_results(ftz):
    x = _inputs(300)
    out = poison(torch.empty(3 * x.numel()))
    _exponentials[(3,)](out, x, x.numel(), BLOCK=128, FTZ=ftz, interpret=True)
    _check(out, x, ftz)


def test_half_and_double_inputs():
    """bfloat16 (float32's exponent range): computed in float32, flushed, then rounded; float64 ignores ftz."""
    x = torch.tensor([-130.0, -127.0, -126.0, -1.0, 3.0])
    out = poison(torch.empty(15, dtype=torch.bfloat16))
    _exponentials[(1,)](out, x.bfloat16(), 5, BLOCK=8, FTZ=True, interpret=True)
    assert out[:2].tolist() == [0.0, 0.0] and out[2].item() == 2.0 ** -126 and out[3].item() == 0.5
    assert out[10].item() > 0 and out[11].item() > 0                  # the unflushed row keeps subnormals
    wide = poison(torch.empty(15, dtype=torch.float64))
    _exponentials[(1,)](wide, x.double(), 5, BLOCK=8, FTZ=True, interpret=True)
    assert wide[0].item() == 2.0 ** -130 and wide[1].item() == 2.0 ** -127


@dsl.jit
def _runtime_flag(o_ptr, x_ptr, flag):
    dsl.store(o_ptr, dsl.exp2(dsl.load(x_ptr), ftz=flag > 0))


def test_runtime_flag_is_rejected():
    with pytest.raises(CompilationError, match="exp2: ftz must be a constexpr bool"):
        _runtime_flag[(1,)](torch.empty(1), torch.empty(1), 1, interpret=True)


@pytest.mark.skipif(not ptxas_available(), reason="ptxas is not on the PATH")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_ptx_takes_the_ftz_instruction_only_where_asked(arch):
    ptr = dsl.pointer_type(dsl.float32)
    flushed = _exponentials.compile(ptr, ptr, 1024, BLOCK=128, FTZ=True, target=arch).asm["ptx"]
    plain = _exponentials.compile(ptr, ptr, 1024, BLOCK=128, FTZ=False, target=arch).asm["ptx"]
    # FTZ: exp2 and exp flush, the third row's default exp2 does not (not merged with the first)
    assert sorted(re.findall(r"ex2\.approx[\w.]*", flushed)) == ["ex2.approx.f32"] + ["ex2.approx.ftz.f32"] * 2
    assert re.findall(r"ex2\.approx[\w.]*", plain) == ["ex2.approx.f32"] * 2     # exp2(x) twice: one op
    for text in (flushed, plain):
        assemble(text, arch)


@pytest.mark.cuda
@pytest.mark.parametrize("ftz", [False, True])
def test_gpu_matches_float64(ftz):
    x = _inputs(5000, "cuda")
    out = poison(torch.empty(3 * x.numel(), device="cuda"))
    _exponentials[(-(-x.numel() // 256),)](out, x, x.numel(), BLOCK=256, FTZ=ftz)
    _check(out, x, ftz)
