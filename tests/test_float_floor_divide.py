"""Float `//` in the DSL (language/semantics.py `_float_floor_divide`) against torch.floor_divide, and signed
zeros in max/min reductions and scans (language/numerics/reductions.py `_order_zeros`), in the interpreter; the compiled
floor division assembles for sm_80 and sm_90a."""

from __future__ import annotations

import pytest
import torch

import fusedops.dsl as dsl
from fusedops.dsl.target import assemble, ptxas_available

_SPECIAL = [0.0, -0.0, 1.0, -1.0, 0.1, -0.1, 3.0, -3.0, 7.0, 1e-30, -1e30, float("inf"), float("-inf"), float("nan")]


@dsl.jit
def _floor_divide(o_ptr, x_ptr, y_ptr, n, BLOCK: dsl.constexpr):
    offsets = dsl.program_id(0) * BLOCK + dsl.arange(0, BLOCK)
    mask = offsets < n
    x = dsl.load(x_ptr + offsets, mask=mask, other=1.0)
    y = dsl.load(y_ptr + offsets, mask=mask, other=1.0)
    dsl.store(o_ptr + offsets, x // y, mask=mask)


def _pairs(dtype, generator):
    special = torch.tensor(_SPECIAL, dtype=torch.float64)
    grid_x, grid_y = special.repeat_interleave(len(_SPECIAL)), special.repeat(len(_SPECIAL))
    random_x = torch.randn(3000, generator=generator, dtype=torch.float64) * 100
    random_y = torch.randn(3000, generator=generator, dtype=torch.float64) * torch.tensor(10.0).pow(
        torch.randint(-3, 3, (3000,), generator=generator))
    # quotients next to integers: x = k * y, where x / y may round onto the integer
    k = torch.randint(-50, 50, (1000,), generator=generator).double()
    near_y = torch.rand(1000, generator=generator, dtype=torch.float64) + 0.05
    x = torch.cat([grid_x, random_x, k * near_y]).to(dtype)
    y = torch.cat([grid_y, random_y, near_y]).to(dtype)
    return x, y


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_float_floor_divide_matches_torch(dtype):
    x, y = _pairs(dtype, torch.Generator().manual_seed(23))
    out = torch.full_like(x, 12345.0)
    _floor_divide[(dsl.cdiv(x.numel(), 1024),)](out, x, y, x.numel(), BLOCK=1024, interpret=True)
    # 16-bit: the exact floor rounded once (torch's CPU half kernel rounds its steps in half: 963 for
    # 14.0 // 0.0145, where the quotient is 964.6)
    expected = torch.floor_divide(x.double(), y.double()).to(dtype) if dtype.itemsize == 2 else torch.floor_divide(x, y)
    torch.testing.assert_close(out, expected, rtol=0, atol=0, equal_nan=True)
    numbers = ~torch.isnan(expected)
    assert torch.equal(torch.signbit(out[numbers]), torch.signbit(expected[numbers]))   # -0.0 where torch has it


@pytest.mark.skipif(not ptxas_available(), reason="ptxas is not on the PATH")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_compiled_float_floor_divide_assembles(dtype, arch):
    x = torch.empty(16, dtype=dtype)
    compiled = _floor_divide.compile(x, x, x, 16, BLOCK=128, target=arch)
    result = assemble(compiled.asm["ptx"], arch)
    assert result.spill_bytes == 0, result.log


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_max_min_scans_order_signed_zeros(dtype):
    # reductions.scan's max/min kinds (the interpreter's SCAN), as the compiled combiner (llvm.maximum/minimum)
    from fusedops.dsl.language.numerics import reductions
    from fusedops.dsl.language.dtypes import float16, float32
    x = torch.tensor([-0.0, 0.0, -0.0, -1.0, 0.0, -0.0, float("nan"), 0.0], dtype=dtype).numpy()
    kind = float32 if dtype == torch.float32 else float16
    cummax = torch.from_numpy(reductions.scan(x, "max", 0, False, kind))
    cummin = torch.from_numpy(reductions.scan(x, "min", 0, False, kind))
    # running maximum: -0.0 until a +0.0 is seen; running minimum: -0.0 from the first -0.0; NaN from the NaN on
    assert torch.signbit(cummax[:6]).tolist() == [True, False, False, False, False, False]
    assert torch.signbit(cummin[:3]).tolist() == [True, True, True] and cummin[3:6].tolist() == [-1.0] * 3
    assert torch.isnan(cummax[6:]).all() and torch.isnan(cummin[6:]).all()
    reversed_max = torch.from_numpy(reductions.scan(x[:3], "max", 0, True, kind).copy())
    assert torch.signbit(reversed_max).tolist() == [False, False, True]
