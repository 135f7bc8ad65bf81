"""Review of the kernel language, session 11 (c): cases modelled on Triton bug reports (casts and their
rounding, float atomics with NaN, 16-bit float arithmetic), checked on the CPU: the interpreter is the
reference; the compiled kernel is checked through its PTX for sm_80 / sm_90a.

Each defect was first seen by running the same kernels compiled on an H200 (with
FUSEDOPS_DEFAULT_ARCH=sm_80 for the sm_80 cases) against the interpreter; the tests below catch each
one without a GPU.

Bugs found, fixed the same session (the tests assert the correct behaviour; their xfail marks dropped):
- `x % y` on float16 / bfloat16 blocks or scalars: the interpreter computes C fmod; code generation
  crashes with a bare TypeError ("math function fmod reached codegen with type half; widen 16-bit
  floats first"), for sm_80 and sm_90a alike.
- `atomic_max` / `atomic_min` on float32 / float64: the interpreter propagates NaN (numerics.arithmetic.maximum,
  like `dsl.maximum`); the compiled kernel lowers to LLVM `atomicrmw fmax/fmin` (maxnum: NaN is
  dropped), a CAS loop around PTX `max.f32` / `min.f32`. On the H200: memory NaN, value 1.0 -> 1.0
  (interpreter NaN); memory 1.0, value NaN -> 1.0 (interpreter NaN).
- int32 / int64 / uint32 -> bfloat16 on sm_80 rounds twice (`cvt.rn.f32.s32` then `cvt.rn.bf16.f32`):
  16842753 (2**24 + 2**16 + 1) gives 16777216 on the GPU with sm_80 code, 16908288 in the interpreter
  and with sm_90a code (`cvt.rn.bf16.s32`, one rounding).
- int64 / uint64 -> bfloat16 in the interpreter rounds twice above 2**53 (through float64):
  2**62 + 2**54 + 1 gives 2**62; the sm_90a kernel (`cvt.rn.bf16.s64`) gives the correctly rounded
  2**62 + 2**55 (seen on the H200).
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import fusedops.dsl as dsl

NAN = float("nan")
TARGETS = ["sm_80", "sm_90a"]


def _assemble(ptx: str, arch: str) -> None:
    from fusedops.dsl.target import assemble, ptxas_available
    if ptxas_available():
        assemble(ptx, arch)


# -- % on 16-bit floats ------------------------------------------------------------------------------

@dsl.jit
def _half_mod_kernel(o_ptr, x_ptr, y_ptr, MODE: dsl.constexpr, N: dsl.constexpr):
    i = dsl.arange(0, N)
    if MODE == "block":
        dsl.store(o_ptr + i, dsl.load(x_ptr + i) % dsl.load(y_ptr + i))
    elif MODE == "literal":
        dsl.store(o_ptr + i, dsl.load(x_ptr + i) % 3.0)
    else:
        dsl.store(o_ptr, dsl.load(x_ptr) % dsl.load(y_ptr))


_MOD_X = [5.5, -5.5, 7.0, -7.0, 0.5, 1.0, 2.0, 3.0]
_MOD_Y = [2.0, 2.0, -2.0, -2.0, 0.25, 3.0, 1.5, 1.0]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("mode", ["block", "literal", "scalar"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_modulo_of_16_bit_floats_compiles(dtype, mode, target):
    x, y = torch.tensor(_MOD_X, dtype=dtype), torch.tensor(_MOD_Y, dtype=dtype)
    out = torch.zeros(8, dtype=dtype)
    _half_mod_kernel[(1,)](out, x, y, MODE=mode, N=8, interpret=True)
    divisor = torch.full((8,), 3.0) if mode == "literal" else y.float()
    expected = torch.fmod(x.float(), divisor).to(dtype)
    if mode == "scalar":
        assert out[0].item() == expected[0].item()
    else:
        assert torch.equal(out, expected)
    compiled = _half_mod_kernel.compile(out, x, y, MODE=mode, N=8, target=target)
    _assemble(compiled.asm["ptx"], target)


# -- float atomic max / min and NaN ------------------------------------------------------------------

@dsl.jit
def _atomic_extremum_kernel(o_ptr, v_ptr, old_ptr, KIND: dsl.constexpr, N: dsl.constexpr):
    i = dsl.arange(0, N)
    v = dsl.load(v_ptr + i)
    if KIND == "max":
        old = dsl.atomic_max(o_ptr + i, v)
    else:
        old = dsl.atomic_min(o_ptr + i, v)
    dsl.store(old_ptr + i, old)


# a float max/min instruction that drops NaN (PTX `max.f32` returns the non-NaN operand; `max.NaN.f32`
# does not match)
_NAN_DROPPING = re.compile(r"\b(max|min)(\.ftz)?\.f(32|64)\b")


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("kind", ["max", "min"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_float_atomic_max_min_propagate_nan_when_compiled(dtype, kind, target):
    memory = torch.tensor([-5., -5., NAN, 1.], dtype=dtype)
    values = torch.tensor([-3., -7., 1., NAN], dtype=dtype)
    old = torch.zeros(4, dtype=dtype)
    _atomic_extremum_kernel[(1,)](memory, values, old, KIND=kind, N=4, interpret=True)
    expected = [-3., -5.] if kind == "max" else [-5., -7.]
    assert memory[:2].tolist() == expected and memory[2:].isnan().all()       # the reference: NaN wins
    assert old[:2].tolist() == [-5., -5.] and old[2].isnan() and old[3].item() == 1.
    compiled = _atomic_extremum_kernel.compile(memory, values, old, KIND=kind, N=4, target=target)
    ptx = compiled.asm["ptx"]
    _assemble(ptx, target)
    nan_aware = "setp.nan" in ptx or "setp.num" in ptx or "testp.notanumber" in ptx
    assert nan_aware or not _NAN_DROPPING.search(ptx), \
        f"NaN-dropping {_NAN_DROPPING.search(ptx).group(0)} with no NaN test in the {target} atomic"


# -- integer -> bfloat16 rounding --------------------------------------------------------------------

@dsl.jit
def _cast_kernel(o_ptr, x_ptr, DT: dsl.constexpr, N: dsl.constexpr):
    i = dsl.arange(0, N)
    dsl.store(o_ptr + i, dsl.load(x_ptr + i).to(DT))


@pytest.mark.parametrize("source", [torch.int32, torch.int64, torch.uint32])
def test_integer_to_bfloat16_rounds_once_on_sm_80(source):
    # 2**24 + 2**16 + 1 is just above the midpoint of two bfloat16 values: the reference rounds up once.
    x = torch.tensor([16842753, 1, 0, 3], dtype=torch.int64).to(source)
    out = torch.zeros(4, dtype=torch.bfloat16)
    _cast_kernel[(1,)](out, x, DT=dsl.bfloat16, N=4, interpret=True)
    assert out.float().tolist() == [16908288., 1., 0., 3.]
    compiled = _cast_kernel.compile(out, x, DT=dsl.bfloat16, N=4, target="sm_80")
    ptx = compiled.asm["ptx"]
    _assemble(ptx, "sm_80")
    through_float32 = re.search(r"cvt\.rn\.f32\.[su](32|64)\b", ptx)
    assert not (through_float32 and "cvt.rn.bf16.f32" in ptx), \
        f"{through_float32.group(0)} then cvt.rn.bf16.f32: two roundings"


@pytest.mark.parametrize("source", ["int64", "uint64"])
def test_wide_integer_to_bfloat16_rounds_once_in_interpreter(source):
    # Each value lies just above a bfloat16 midpoint that float64 cannot hold apart from it.
    values = {"int64": [2**62 + 2**54 + 1, -(2**62 + 2**54 + 1), 2**40 + 2**32 + 1, 5],
              "uint64": [2**63 + 2**55 + 1, 2**62 + 2**54 + 1, 2**40 + 2**32 + 1, 5]}[source]
    expected = {"int64": [2.**62 + 2.**55, -(2.**62 + 2.**55), 2.**40 + 2.**33, 5.],
                "uint64": [2.**63 + 2.**56, 2.**62 + 2.**55, 2.**40 + 2.**33, 5.]}[source]
    x = torch.from_numpy(np.array(values, dtype=np.int64 if source == "int64" else np.uint64))
    out = torch.zeros(4, dtype=torch.bfloat16)
    _cast_kernel[(1,)](out, x, DT=dsl.bfloat16, N=4, interpret=True)
    assert out.double().tolist() == expected
    if source == "int64":   # the compiled sm_90a conversion rounds once (the value the H200 gave)
        ptx = _cast_kernel.compile(out, x, DT=dsl.bfloat16, N=4, target="sm_90a").asm["ptx"]
        assert "cvt.rn.bf16.s64" in ptx
