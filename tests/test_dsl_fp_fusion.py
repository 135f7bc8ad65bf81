"""`@dsl.jit(enable_fp_fusion=True)` (CompileOptions.fp_fusion): a multiply feeding an add or subtract, elementwise
or in a `sum`, may compile to one FMA; off (the default) every operation rounds as written and no FMA forms.

CPU: the PTX of the same kernel source with and without the option (fma.rn vs mul.rn / add.rn), the on-disk cache
keyed by it, the bad-argument error, and the interpreter (which never fuses). cuda: the fused kernel rounds a * b + c
once, the unfused one twice, on values where the two differ.
"""

from __future__ import annotations

import pytest
import torch

import fusedops.dsl as dsl
from fusedops.dsl.target import assemble, ptxas_available


def _multiply_add(a_ptr, b_ptr, c_ptr, out_ptr, total_ptr, n, BLOCK: dsl.constexpr):
    offsets = dsl.arange(0, BLOCK)
    mask = offsets < n
    a = dsl.load(a_ptr + offsets, mask=mask, other=0.0)
    b = dsl.load(b_ptr + offsets, mask=mask, other=0.0)
    c = dsl.load(c_ptr + offsets, mask=mask, other=0.0)
    dsl.store(out_ptr + offsets, a * b + c, mask=mask)
    dsl.store(total_ptr + offsets, dsl.sum(a * b, axis=0) - c, mask=mask)


unfused = dsl.jit(_multiply_add)
fused = dsl.jit(_multiply_add, enable_fp_fusion=True)


def _ptx(kernel, dtype=torch.float32) -> str:
    t = torch.empty(64, dtype=dtype)
    return kernel.compile(t, t, t, t, t, 64, BLOCK=64, target="sm_90a", num_warps=1).asm["ptx"]


@pytest.mark.parametrize("dtype, suffix", [(torch.float32, "f32"), (torch.float64, "f64")])
def test_the_option_decides_whether_products_and_adds_become_fmas(dtype, suffix):
    plain, contracted = _ptx(unfused, dtype), _ptx(fused, dtype)
    assert f"fma.rn.{suffix}" not in plain
    assert f"mul.rn.{suffix}" in plain and f"add.rn.{suffix}" in plain
    assert f"fma.rn.{suffix}" in contracted
    assert f"mul.rn.{suffix}" not in contracted     # every product here feeds an add (or the sum's first step)
    if ptxas_available():
        for ptx in (plain, contracted):
            assert assemble(ptx, "sm_90a").spill_bytes == 0


def test_the_cache_keys_the_option(tmp_path, monkeypatch):
    # the same source with and without the option compiles to two cache entries, not one read back for both
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    first = dsl.jit(_multiply_add)
    second = dsl.jit(_multiply_add, enable_fp_fusion=True)
    assert "fma.rn.f32" not in _ptx(first)
    assert "fma.rn.f32" in _ptx(second)
    assert "fma.rn.f32" not in _ptx(dsl.jit(_multiply_add))     # read back from the cache: still unfused
    assert any(tmp_path.rglob("*")), "nothing was cached"


@pytest.mark.parametrize("value", [1, "yes", None])
def test_a_non_bool_option_is_refused(value):
    with pytest.raises(TypeError, match="enable_fp_fusion must be a bool"):
        dsl.jit(_multiply_add, enable_fp_fusion=value)


def test_the_option_is_read_only():
    # compiled specializations are cached per kernel: a later change could not reach them
    assert fused.enable_fp_fusion is True and unfused.enable_fp_fusion is False
    with pytest.raises(AttributeError):
        fused.enable_fp_fusion = False


def _rounding_case(device):
    # a * b = 1 + 2^-11 + 2^-24: float32 keeps 1 + 2^-11 (2^-24 is half an ulp, ties to even), so
    # a * b - 1 is 2^-11 unfused and 2^-11 + 2^-24 fused
    eps = 2.0 ** -12
    a = torch.full((5,), 1 + eps, dtype=torch.float32, device=device)
    b = a.clone()
    c = torch.full((5,), -1.0, dtype=torch.float32, device=device)
    return a, b, c


def _launch(kernel, a, b, c, interpret=None):
    out = torch.full_like(a, float("nan"))
    total = torch.full_like(a, float("nan"))
    kernel[(1,)](a, b, c, out, total, a.numel(), BLOCK=8, interpret=interpret)
    return out, total


def test_the_interpreter_rounds_every_operation_either_way():
    a, b, c = _rounding_case("cpu")
    for kernel in (unfused, fused):
        out, total = _launch(kernel, a, b, c, interpret=True)
        assert torch.equal(out, torch.full_like(a, 2.0 ** -11))
        products = torch.full((5,), float(torch.tensor(1 + 2.0 ** -12, dtype=torch.float32) ** 2), dtype=torch.float32)
        assert torch.equal(total, products.sum() + 1.0 + 0 * a)


@pytest.mark.cuda
def test_gpu_the_fused_kernel_rounds_once():
    a, b, c = _rounding_case("cuda")
    out, _ = _launch(unfused, a, b, c)
    assert torch.equal(out.cpu(), torch.full((5,), 2.0 ** -11))
    out, _ = _launch(fused, a, b, c)
    assert torch.equal(out.cpu(), torch.full((5,), 2.0 ** -11 + 2.0 ** -24))
