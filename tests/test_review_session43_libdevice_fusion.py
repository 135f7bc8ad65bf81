"""Review (session 43): libdevice math / the `**` operator, and `@dsl.jit(enable_fp_fusion=True)`.

Tried (peer report -> case), all right:
- Triton / PyTorch integer-pow reports (int pow overflow, torch's wrapping int pow) -> int8 / uint8 / int16 /
  int64 bases `x ** 3` wrap in their own dtype exactly as torch's `**` (no int32 detour for int64).
- pow with a negative base / pow(x, 0.5) vs sqrt / 0 ** 0 -> `x ** 0.5` and `libdevice.pow(x, 0.5)` are C's pow
  (pow(-0, .5) = +0, pow(-inf, .5) = +inf, documented; torch's sqrt gives -0 / NaN there), x ** 5.0 of a
  negative base keeps the sign, nan ** 0 = 1.
- pow of a scalar kernel argument, `**` with a constexpr exponent, `**=`, `2 ** x` with x a float block,
  `2 ** LOG` of constexprs staying a compile-time int (an arange size).
- (N,1) ** (1,M) broadcasting, float and runtime int32 exponents (powi), in the interpreter and compiled.
- libdevice's __nv_powif (read from libdevice.10.bc): r *= x per set bit from the lowest, x *= x, fdiv 1 / r for
  n < 0 -- the interpreter's sequence; INT_MIN handled through the unsigned shift.
- int64 exponents -> a CompilationError naming int32 and the conversion; wrong arity / keyword -> clear errors.
- round vs rint halfway cases, fmod sign / special values (= the DSL's float %), bf16 / fp16 pow rounded once.
- int1 operands of pow either side (triton-windows #144, inductor's "Inputs to libdevice.pow do not match").
- PTX: every libdevice function in float64 and bfloat16 for sm_80 through ptxas (the existing tests cover
  float32 on both archs and float64 on sm_90a).
- enable_fp_fusion: fma.rn forms only where a product feeds an add / sub (float32 / float64 / float16 /
  bfloat16, sm_80 and sm_90a); integer ops, divisions, comparisons are unchanged; the option does not leak
  into an unfused kernel through the on-disk cache across processes; a helper follows the kernel's setting;
  autotune keeps the kernel's setting; the interpreter ignores it; `x ** 2 + y` fuses (a constant power is
  its multiplications), while libdevice's own products stay mul.rn.
DEFECTS: none found in the time given (35 minutes).
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import fusedops.dsl as dsl
from fusedops.dsl import CompilationError
from fusedops.dsl.extra.cuda import libdevice
from fusedops.dsl.target import assemble, ptxas_available
from helpers import poison
from kernel_source import jit_from_source

needs_ptxas = pytest.mark.skipif(not ptxas_available(), reason="ptxas is not installed")
INF, NAN = math.inf, math.nan


@pytest.fixture(autouse=True)
def _own_cache(monkeypatch, tmp_path_factory):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "review43_cache"))


def _kernel(expression: str, extra: str = ""):
    source = ("def k(o_ptr, x_ptr, y_ptr, s, BLOCK: dsl.constexpr):\n"
              "    i = dsl.arange(0, BLOCK)\n"
              "    x = dsl.load(x_ptr + i)\n"
              "    y = dsl.load(y_ptr + i)\n" + extra +
              f"    dsl.store(o_ptr + i, {expression})\n")
    return jit_from_source(source, f"<review43 {abs(hash((expression, extra)))}>",
                           namespace={"ld": libdevice, "dsl": dsl})


def _run(expression, x, y=None, s=3, out_dtype=None, extra=""):
    out = poison(torch.empty(x.shape, dtype=out_dtype or x.dtype))
    _kernel(expression, extra)[(1,)](out, x, x if y is None else y, s, BLOCK=x.numel(), interpret=True)
    return out


def _same(a, b):
    numbers = ~torch.isnan(a)       # (a NaN's sign is not compared)
    return torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0)) and \
        torch.equal(torch.signbit(a[numbers]), torch.signbit(b[numbers]))


# -- libdevice / ** in the interpreter -----------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int16, torch.int64])
def test_integer_power_wraps_in_its_own_dtype_as_torch(dtype):
    info = torch.iinfo(dtype)
    x = torch.randint(max(info.min, -2**40), min(info.max, 2**40), (16,), dtype=dtype)
    x[:3] = torch.tensor([0, 1, info.max], dtype=dtype)
    for expression, exponent in (("x ** 3", 3), ("x ** 5", 5), ("x ** 0", 0)):
        got = _run(expression, x)
        assert got.dtype == dtype and torch.equal(got, x ** exponent), (expression, dtype)


def test_float_powers_special_values_and_scalar_exponents():
    x = torch.tensor([-2.0, -0.0, 0.0, INF, -INF, NAN, 1.5, 10.0, -1.0, 0.75, -3.5, 1e-20, 3e12, 7.0, -0.25, 2.0])
    # a scalar int kernel argument (runtime powi), a constexpr exponent, **=
    assert _same(_run("x ** s", x, s=3), x.double().pow(3).float())
    assert _same(_run("x ** s", x, s=-3), (1.0 / ((x * x) * x)))
    assert _same(_run("x ** s", x, s=1), x)         # (1 is specialized to a constant)
    assert _same(_run("x ** s", x, s=0), torch.ones(16))
    assert _same(_run("x ** (BLOCK // 8)", x), x * x)
    assert _same(_run("z", x, extra="    z = x\n    z **= 3\n"), (x * x) * x)
    # C's pow for a float exponent: pow(-0, 0.5) = +0, pow(-inf, 0.5) = +inf (not torch's sqrt)
    c_pow = torch.tensor([math.pow(v, 0.5) if not (v < 0 and v != -INF) else (INF if v == -INF else NAN)
                          for v in x.tolist()])
    assert _same(_run("x ** 0.5", x), c_pow)
    assert _same(_run("ld.pow(x, 0.5)", x), c_pow)
    five = _run("x ** 5.0", x)          # an integral float exponent keeps a negative base's sign
    assert _same(five, x.double().pow(5).float())
    assert torch.equal(_run("x ** y", x, torch.zeros(16)), torch.ones(16))          # nan ** 0 = 0 ** 0 = 1
    # int1 operands (inductor's "Inputs to libdevice.pow do not match", triton-windows #144)
    y = torch.randn(16)
    assert _same(_run("ld.pow(x > 0, y)", x, y), torch.pow((x > 0).float(), y))
    assert _same(_run("ld.pow(y, x > 0)", x, y), torch.pow(y, (x > 0).float()))
    two = _run("2 ** x", x)
    assert _same(two, torch.pow(2.0, x.double()).float())


def test_constexpr_powers_stay_compile_time_ints():
    x = torch.randn(8)
    got = _run("x + dsl.sum(dsl.arange(0, 2 ** (BLOCK // 4)).to(dsl.float32), axis=0)", x)
    assert torch.equal(got, x + 6.0)            # 2 ** 2 = 4 lanes: 0 + 1 + 2 + 3


def test_broadcast_powers_interpreted_and_compiled():
    source = ("def k(o_ptr, x_ptr, y_ptr, n_ptr, N: dsl.constexpr, M: dsl.constexpr):\n"
              "    i = dsl.arange(0, N)\n"
              "    j = dsl.arange(0, M)\n"
              "    x = dsl.load(x_ptr + i)[:, None]\n"
              "    y = dsl.load(y_ptr + j)[None, :]\n"
              "    n = dsl.load(n_ptr + j)[None, :]\n"
              "    dsl.store(o_ptr + i[:, None] * M + j[None, :], x ** y)\n"
              "    dsl.store(o_ptr + N * M + i[:, None] * M + j[None, :], x ** n)\n")
    kernel = jit_from_source(source, "<review43 broadcast>", namespace={"dsl": dsl})
    x = torch.rand(8) * 3 + 0.1
    y = torch.randn(16) * 2
    n = torch.randint(-5, 6, (16,), dtype=torch.int32)
    out = poison(torch.empty(2 * 8 * 16))
    kernel[(1,)](out, x, y, n, N=8, M=16, interpret=True)
    exact = x.double()[:, None] ** y.double()[None, :]
    torch.testing.assert_close(out[:128].view(8, 16).double(), exact, rtol=2 ** -23, atol=0)
    torch.testing.assert_close(out[128:].view(8, 16).double(), x.double()[:, None] ** n.double()[None, :],
                               rtol=6 * 2 ** -24, atol=0)
    if ptxas_available():
        p = dsl.pointer_type(dsl.float32)
        for arch in ("sm_80", "sm_90a"):
            ptx = kernel.compile(p, p, p, dsl.pointer_type(dsl.int32), N=8, M=16, target=arch).asm["ptx"]
            assert "__nv_" not in ptx and assemble(ptx, arch).spill_bytes == 0


def test_round_rint_fmod_and_16_bit_pow():
    halves = torch.tensor([0.5, 1.5, 2.5, -0.5, -2.5, 0.49999997, -0.49999997, 8388609.0])
    assert _same(_run("ld.round(x)", halves), torch.tensor([1.0, 2, 3, -1, -3, 0, -0.0, 8388609.0]))
    assert _same(_run("ld.rint(x)", halves), torch.round(halves))
    a = torch.tensor([5.0, -5.0, 5.0, -5.0, -0.0, 1.0, INF, 3.0])
    b = torch.tensor([3.0, 3.0, -3.0, -3.0, 2.0, 0.0, 2.0, INF])
    assert _same(_run("ld.fmod(x, y)", a, b), torch.fmod(a, b))
    assert _same(_run("x % y", a, b), _run("ld.fmod(x, y)", a, b))
    for dtype in (torch.float16, torch.bfloat16):
        x = (torch.rand(16) * 4 + 0.05).to(dtype)
        y = (torch.randn(16) * 2).to(dtype)
        assert torch.equal(_run("x ** y", x, y), (x.double() ** y.double()).to(dtype))


@pytest.mark.parametrize("expression, message", [
    ("x ** y.to(dsl.int64)", "must fit int32"),
    ("ld.pow(x)", "missing a required argument"),
    ("ld.pow(x, y, y)", "too many positional"),
    ("ld.pow(x, None)", "pow: y must be a number"),
    ("ld.hypot(x_ptr, 2)", "hypot: x must be a number"),
    ("y.to(dsl.int32) ** -1", "compile-time int exponent >= 0"),
])
def test_clear_errors(expression, message):
    with pytest.raises(CompilationError, match=message):
        _run(expression, torch.randn(4))


# -- enable_fp_fusion ----------------------------------------------------------------------------------------------
def _fusion_source(a_ptr, b_ptr, c_ptr, o_ptr, BLOCK: dsl.constexpr):
    o = dsl.arange(0, BLOCK)
    a = dsl.load(a_ptr + o)
    b = dsl.load(b_ptr + o)
    c = dsl.load(c_ptr + o)
    dsl.store(o_ptr + o, a * b + c)
    dsl.store(o_ptr + BLOCK + o, c - a * b)
    dsl.store(o_ptr + 2 * BLOCK + o, a / b + c)
    dsl.store(o_ptr + 3 * BLOCK + o, dsl.where(a * b < c, a, b))


@dsl.jit(enable_fp_fusion=True)
def _fused_helper(a, b, c):
    return a * b + c


def _helper_caller(a_ptr, b_ptr, c_ptr, o_ptr, BLOCK: dsl.constexpr):
    o = dsl.arange(0, BLOCK)
    dsl.store(o_ptr + o, _fused_helper(dsl.load(a_ptr + o), dsl.load(b_ptr + o), dsl.load(c_ptr + o)))


def _ptx(kernel, dtype, arch):
    t = torch.empty(256, dtype=dtype)
    return kernel.compile(t, t, t, t, BLOCK=64, target=arch, num_warps=1).asm["ptx"]


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_fusion_changes_only_float_product_sums(arch):
    unfused, fused = dsl.jit(_fusion_source), dsl.jit(_fusion_source, enable_fp_fusion=True)
    for dtype, suffix in ((torch.float32, "f32"), (torch.float64, "f64"), (torch.float16, "f16"),
                          (torch.bfloat16, "bf16")):
        plain, contracted = _ptx(unfused, dtype, arch), _ptx(fused, dtype, arch)
        if not (dtype == torch.bfloat16 and arch == "sm_80"):       # (bf16 add / mul are fma.rn there anyway)
            assert f"fma.rn.{suffix}" not in plain and f"fma.rn.{suffix}" in contracted, (dtype, arch)
        for ptx in (plain, contracted):     # divisions and comparisons are the same either way
            assert ptx.count("div.rn.f") == 2 and ptx.count("setp.lt.") == 2, (dtype, arch)
        if ptxas_available():
            assert assemble(contracted, arch).spill_bytes == 0
    plain, contracted = _ptx(unfused, torch.int32, arch), _ptx(fused, torch.int32, arch)
    assert "fma" not in contracted and contracted.count("mul.lo.s32") == plain.count("mul.lo.s32") == 2


def test_a_helper_follows_the_kernel_setting():
    plain = _ptx(dsl.jit(_helper_caller), torch.float32, "sm_90a")
    contracted = _ptx(dsl.jit(_helper_caller, enable_fp_fusion=True), torch.float32, "sm_90a")
    assert "fma.rn.f32" not in plain and "mul.rn.f32" in plain
    assert "fma.rn.f32" in contracted


def test_autotune_keeps_the_setting_and_the_interpreter_ignores_it():
    fused = dsl.jit(_fusion_source, enable_fp_fusion=True)
    tuner = dsl.autotune(configs=[dsl.Config({}, num_warps=1), dsl.Config({}, num_warps=2)], key=[])(fused)
    assert tuner.fn.enable_fp_fusion is True
    eps = 2.0 ** -12            # a * b = 1 + 2^-11 + 2^-24: rounded once it keeps 2^-24, rounded twice it does not
    a = torch.full((64,), 1 + eps)
    c = torch.full((64,), -1.0)
    out = poison(torch.empty(256))
    tuner[(1,)](a, a, c, out, BLOCK=64, interpret=True)
    assert torch.equal(out[:64], torch.full((64,), 2.0 ** -11))         # every op rounded: the interpreter


_CHILD = textwrap.dedent("""
    import sys, torch, fusedops.dsl as dsl
    sys.path.insert(0, {tests!r})
    from test_review_session43_libdevice_fusion import _fusion_source
    kernel = dsl.jit(_fusion_source, enable_fp_fusion={fused})
    t = torch.empty(256)
    print("FMA" if "fma.rn.f32" in kernel.compile(t, t, t, t, BLOCK=64, target="sm_90a").asm["ptx"] else "NOFMA")
""")


def test_the_disk_cache_never_swaps_fused_and_unfused_across_processes(tmp_path, monkeypatch):
    # this process stores the fused kernel; a fresh process compiling the same source unfused must not read it
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("FUSEDOPS_DISABLE_CACHE", raising=False)
    t = torch.empty(256)
    fused = dsl.jit(_fusion_source, enable_fp_fusion=True)
    assert "fma.rn.f32" in fused.compile(t, t, t, t, BLOCK=64, target="sm_90a").asm["ptx"]
    assert any(tmp_path.rglob("*")), "nothing was cached"
    tests = os.path.dirname(os.path.abspath(__file__))
    child = subprocess.run([sys.executable, "-c", _CHILD.format(tests=tests, fused=False)], env=dict(os.environ),
                           capture_output=True, text=True, timeout=60)
    assert child.returncode == 0, child.stderr
    assert child.stdout.split()[-1] == "NOFMA"


@needs_ptxas
def test_every_libdevice_function_assembles_for_sm_80_in_float64_and_bfloat16():
    from fusedops.dsl.language.libdevice import FUNCTIONS

    calls = [f"ld.{name}(x)" if f.arity == 1 else f"ld.{name}(x, y)" for name, f in FUNCTIONS.items()]
    calls += ["x ** y.to(dsl.int32)", "ld.isnan(x).to(x.dtype)", "ld.signbit(x).to(x.dtype)"]
    body = "".join(f"    dsl.store(o_ptr + {row} * BLOCK + i, ({call}).to(o_ptr.dtype.element_ty))\n"
                   for row, call in enumerate(calls))
    plain = jit_from_source("def k(o_ptr, x_ptr, y_ptr, s, BLOCK: dsl.constexpr):\n"
                            "    i = dsl.arange(0, BLOCK)\n    x = dsl.load(x_ptr + i)\n    y = dsl.load(y_ptr + i)\n"
                            + body, "<review43 sm_80>", namespace={"ld": libdevice, "dsl": dsl})
    for element in (dsl.float64, dsl.bfloat16):
        p = dsl.pointer_type(element)
        ptx = plain.compile(p, p, p, dsl.int32, BLOCK=32, target="sm_80").asm["ptx"]
        assert "__nv_" not in ptx and assemble(ptx, "sm_80").spill_bytes == 0, element


def test_fusion_reaches_constant_powers_but_not_libdevice():
    source = ("def k(o_ptr, x_ptr, y_ptr, n, BLOCK: dsl.constexpr):\n"
              "    i = dsl.arange(0, BLOCK)\n    x = dsl.load(x_ptr + i)\n    y = dsl.load(y_ptr + i)\n"
              "    dsl.store(o_ptr + i, x ** 2 + y)\n")
    p = dsl.pointer_type(dsl.float32)
    plain = jit_from_source(source, "<review43 pow fusion>", namespace={"dsl": dsl})
    fused = dsl.jit(plain.fn, enable_fp_fusion=True)
    assert "fma.rn.f32" not in plain.compile(p, p, p, dsl.int32, BLOCK=32).asm["ptx"]
    assert "fma.rn.f32" in fused.compile(p, p, p, dsl.int32, BLOCK=32).asm["ptx"]       # x * x + y, one FMA
    x, y = torch.full((32,), 1 + 2.0 ** -12), torch.full((32,), -1.0)
    out = poison(torch.empty(32))
    fused[(1,)](out, x, y, 0, BLOCK=32, interpret=True)       # the interpreter rounds x * x first
    assert torch.equal(out, torch.full((32,), 2.0 ** -11))
