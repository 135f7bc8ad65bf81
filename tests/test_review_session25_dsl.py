"""Review (session 25, the DSL): a fresh reviewer replayed bug classes reported against Triton as small
`fusedops.dsl` kernels on the CPU: fused multiply-add rounding ("fma differs from the CPU reference"), histograms built from `atomic_add` with duplicate bins in one block (Triton's histogram /
scatter-add reports), 16-bit atomics (add / xchg / cas on int16, float16, bfloat16, sm_80 and sm_90a),
constexpr arithmetic that fails at compile time (division / modulo by zero, negative shifts), `range` steps
of zero, `trans` with a tuple of dims, `static_range` counting down, negative `arange` starts, loop-carried
values that widen (int32 -> int64), carried pointers, lazily evaluated ternaries around loads, float64 ->
float16 rounding, and unsupported Python constructs for their error types. Each kernel runs in the
interpreter against an exact / float64 reference and is compiled for sm_90a (assembled by ptxas when
installed); scalar kernels are also JIT-compiled on the host from their LLVM IR (tests/host_jit.py) where
the compiled rounding matters.

Defect found and fixed: the interpreter's `dsl.fma` rounded a * b + c through float64 and then to the
type, twice, where the compiled `llvm.fma` rounds once: bfloat16 fma(1.0078125, 1.5, -2**-100) gave
1.515625 (a * b is a bfloat16 tie that the float64 sum kept), float32 fma(1 + 2**-23, 1.5, -2**-100) gave
1.5 + 2**-22. numerics.arithmetic.fma now rounds the exact sum once (TwoSum, then rounding to odd);
tests/test_numerics.py checks it against rationals.
"""

from __future__ import annotations

import random
from fractions import Fraction

import numpy as np
import pytest
import torch

import fusedops.dsl as dsl
from fusedops.dsl.errors import CompilationError, InterpreterError, UnsupportedError
from fusedops.dsl.target import assemble, ptxas_available
from host_jit import run_on_host
from kernel_source import jit_from_source


def _kernel(source: str, tag: str):
    return jit_from_source(source, f"<review25 {tag}>")


def _compile(kernel, *args, arch="sm_90a", **constexprs):
    compiled = kernel.compile(*args, target=arch, **constexprs)
    if ptxas_available():
        assemble(compiled.asm["ptx"], arch)
    return compiled


def _round_fraction(exact: Fraction, dtype: torch.dtype) -> float:
    """`exact` rounded once to `dtype` (nearest, ties to even), by bisection over the dtype's neighbours."""
    approx = torch.tensor(float(exact), dtype=torch.float64).to(dtype)      # within one ulp
    candidates = {float(approx)}
    for direction in (float("inf"), -float("inf")):
        candidates.add(float(torch.nextafter(approx, torch.tensor(direction, dtype=dtype))))
    best = sorted(candidates, key=lambda v: (abs(Fraction(v) - exact),
                                             int(torch.tensor(v, dtype=dtype).view(torch.int16 if dtype in
                                                 (torch.float16, torch.bfloat16) else torch.int32)) & 1))
    return best[0]


# ================================================================================================
# dsl.fma rounds once in the interpreter as in the compiled code (bfloat16, float32; was twice)
# ================================================================================================
_FMA_BLOCK = _kernel("def k(o_ptr, a_ptr, b_ptr, c_ptr):\n    i = dsl.arange(0, 2)\n"
                     "    dsl.store(o_ptr + i, dsl.fma(dsl.load(a_ptr + i), dsl.load(b_ptr + i), dsl.load(c_ptr + i)))\n",
                     "fma_block")
_FMA_SCALAR = _kernel("def k(o_ptr, a_ptr, b_ptr, c_ptr):\n"
                      "    dsl.store(o_ptr, dsl.fma(dsl.load(a_ptr), dsl.load(b_ptr), dsl.load(c_ptr)))\n", "fma_scalar")


def test_bfloat16_fma_compiles_to_one_fused_instruction():
    t = torch.ones(2, dtype=torch.bfloat16)
    for arch in ("sm_90a", "sm_80"):
        ptx = _compile(_FMA_BLOCK, t, t, t, t, arch=arch).asm["ptx"]
        assert "fma.rn.bf16" in ptx


def test_bfloat16_fma_rounds_once_in_the_interpreter():
    bf = torch.bfloat16
    a, b = torch.tensor([1.0078125] * 2, dtype=bf), torch.tensor([1.5] * 2, dtype=bf)
    c = torch.tensor([-2.0 ** -100, 2.0 ** -100], dtype=bf)
    out = torch.zeros(2, dtype=bf)
    _FMA_BLOCK[(1,)](out, a, b, c, interpret=True)
    expected = [_round_fraction(Fraction(1.0078125) * Fraction(1.5) + Fraction(float(v)), bf) for v in c]
    assert expected == [1.5078125, 1.515625]
    assert out.float().tolist() == expected


def test_float32_fma_interpreter_matches_the_compiled_code():
    a, b, c = torch.tensor([1 + 2 ** -23]), torch.tensor([1.5]), torch.tensor([-2.0 ** -100])
    compiled, interpreted = torch.zeros(1), torch.zeros(1)
    run_on_host(_FMA_SCALAR, compiled, a, b, c)
    assert compiled.item() == 1.5 + 2 ** -23            # the single rounding
    _FMA_SCALAR[(1,)](interpreted, a, b, c, interpret=True)
    assert interpreted.item() == compiled.item()


def test_float16_fma_rounds_once_in_the_interpreter():
    """float16's range keeps a * b + c within float64's 53 bits: the interpreter's rule is exact there."""
    rng = random.Random(25)
    values = []
    for _ in range(256):
        a, b = (rng.choice([-1, 1]) * rng.uniform(0.5, 200) for _ in range(2))
        c = rng.choice([-1, 1]) * 2.0 ** rng.randint(-24, 10) * rng.uniform(1, 2)
        values.append((a, b, c))
    a, b, c = (torch.tensor([v[i] for v in values], dtype=torch.float16) for i in range(3))
    kernel = _kernel("def k(o_ptr, a_ptr, b_ptr, c_ptr):\n    i = dsl.arange(0, 256)\n"
                     "    dsl.store(o_ptr + i, dsl.fma(dsl.load(a_ptr + i), dsl.load(b_ptr + i), dsl.load(c_ptr + i)))\n",
                     "fma16")
    out = torch.zeros(256, dtype=torch.float16)
    kernel[(1,)](out, a, b, c, interpret=True)
    for i in range(256):
        exact = Fraction(float(a[i])) * Fraction(float(b[i])) + Fraction(float(c[i]))
        if abs(exact) < 65504:
            assert float(out[i]) == _round_fraction(exact, torch.float16), i


# ================================================================================================
# Histograms and 16-bit atomics
# ================================================================================================
_HISTOGRAM = _kernel("def k(h_ptr, x_ptr, N: dsl.constexpr):\n    i = dsl.arange(0, N)\n"
                     "    b = dsl.load(x_ptr + i)\n    dsl.atomic_add(h_ptr + b, 1)\n", "histogram")


@pytest.mark.parametrize("dtype", [torch.int32, torch.float32])
def test_histogram_with_duplicate_bins_in_one_block(dtype):
    x = torch.tensor([0, 1, 1, 3, 3, 3, 0, 2] * 4, dtype=torch.int32)
    hist = torch.zeros(4, dtype=dtype)
    _HISTOGRAM[(3,)](hist, x, N=32, interpret=True)
    assert hist.tolist() == (3 * torch.bincount(x, minlength=4)).to(dtype).tolist()
    _compile(_HISTOGRAM, hist, x, N=32)


@pytest.mark.parametrize("dtype", [torch.int16, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("kind", ["add", "xchg"])
def test_sixteen_bit_atomic_rmw_with_shared_addresses(dtype, kind):
    kernel = _kernel(f"def k(h_ptr, N: dsl.constexpr):\n    i = dsl.arange(0, N)\n"
                     f"    dsl.atomic_{kind}(h_ptr + i % 4, 1)\n", f"atomic16_{kind}")
    hist = torch.zeros(4, dtype=dtype)
    kernel[(1,)](hist, N=8, interpret=True)
    assert hist.float().tolist() == ([2.0] * 4 if kind == "add" else [1.0] * 4)
    for arch in ("sm_90a", "sm_80"):
        _compile(kernel, hist, N=8, arch=arch)


@pytest.mark.parametrize("dtype", [torch.int16, torch.float16, torch.bfloat16])
def test_sixteen_bit_atomic_cas(dtype):
    kernel = _kernel("def k(h_ptr, o_ptr, N: dsl.constexpr):\n    i = dsl.arange(0, N)\n"
                     "    dsl.store(o_ptr + i, dsl.atomic_cas(h_ptr + i, 0, 1))\n", "cas16")
    memory = torch.tensor([0, 1, 0, 2, 0, 0, 3, 0], dtype=dtype)
    old = torch.full((8,), 9, dtype=dtype)
    kernel[(1,)](memory, old, N=8, interpret=True)
    assert old.float().tolist() == [0, 1, 0, 2, 0, 0, 3, 0]
    assert memory.float().tolist() == [1, 1, 1, 2, 1, 1, 3, 1]
    for arch in ("sm_90a", "sm_80"):
        _compile(kernel, memory, old, N=8, arch=arch)


# ================================================================================================
# Compile-time arithmetic, shapes and loops
# ================================================================================================
@pytest.mark.parametrize("expr, constexprs", [("A // B", dict(A=3, B=0)), ("A % B", dict(A=3, B=0)),
                                               ("A / B", dict(A=3.0, B=0.0)), ("1 << A", dict(A=-1)),
                                               ("3 // 0", {})])
def test_constexpr_arithmetic_errors_are_compilation_errors(expr, constexprs):
    params = "".join(f", {name}: dsl.constexpr" for name in constexprs)
    kernel = _kernel(f"def k(o_ptr{params}):\n    dsl.store(o_ptr, {expr})\n", f"cx {expr}")
    with pytest.raises(CompilationError, match="compile-time"):
        kernel[(1,)](torch.zeros(1), interpret=True, **constexprs)
    with pytest.raises(CompilationError):
        kernel.compile(torch.zeros(1), target="sm_90a", **constexprs)


def test_range_step_zero_compile_time_and_runtime():
    static = _kernel("def k(o_ptr, n):\n    acc = 0\n    for i in range(0, n, 0):\n        acc += 1\n"
                     "    dsl.store(o_ptr, acc)\n", "range0")
    with pytest.raises(CompilationError, match="step must not be zero"):
        static[(1,)](torch.zeros(1, dtype=torch.int32), 5, interpret=True)
    runtime = _kernel("def k(o_ptr, n, s):\n    acc = 0\n    for i in range(0, n, s):\n        acc += 1\n"
                      "    dsl.store(o_ptr, acc)\n", "range0rt")
    with pytest.raises(InterpreterError, match="step is zero"):
        runtime[(1,)](torch.zeros(1, dtype=torch.int32), 5, 0, interpret=True)


def test_trans_tuple_static_range_down_and_negative_arange():
    kernel = _kernel("def k(o_ptr, t_ptr, s_ptr):\n    x = dsl.reshape(dsl.arange(0, 8), (2, 4))\n"
                     "    y = dsl.trans(x, (1, 0))\n"
                     "    dsl.store(o_ptr + dsl.arange(0, 4)[:, None] * 2 + dsl.arange(0, 2)[None, :], y)\n"
                     "    acc = 0\n    for i in dsl.static_range(4, 0, -1):\n        acc = acc * 10 + i\n"
                     "    dsl.store(s_ptr, acc)\n    r = dsl.arange(-4, 4)\n    dsl.store(t_ptr + r + 4, r)\n",
                     "shapes")
    out, neg, scalar = torch.zeros(8, dtype=torch.int32), torch.zeros(8, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
    kernel[(1,)](out, neg, scalar, interpret=True)
    assert out.tolist() == torch.arange(8).reshape(2, 4).t().reshape(-1).tolist()
    assert scalar.item() == 4321
    assert neg.tolist() == list(range(-4, 4))
    _compile(kernel, out, neg, scalar)


def test_loop_carried_values_and_pointers():
    kernel = _kernel("def k(o_ptr, w_ptr, f_ptr, x_ptr, big_ptr, n):\n"
                     "    s = 0\n    for i in range(n):\n        s = s + dsl.load(big_ptr)\n    dsl.store(w_ptr, s)\n"
                     "    a = 1\n    b = 2\n    for i in range(10):\n        a, b = b, a + b\n    dsl.store(f_ptr, a)\n"
                     "    p = x_ptr\n    t = 0.0\n    for i in range(n):\n        t += dsl.load(p)\n        p += 1\n"
                     "    dsl.store(o_ptr, t)\n", "carries")
    out, wide, fib = torch.zeros(1), torch.zeros(1, dtype=torch.int64), torch.zeros(1, dtype=torch.int32)
    args = (out, wide, fib, torch.arange(8.0), torch.tensor([2 ** 40], dtype=torch.int64), 3)
    kernel[(1,)](*args, interpret=True)
    assert (out.item(), wide.item(), fib.item()) == (3.0, 3 * 2 ** 40, 144)
    _compile(kernel, *args)
    out.zero_(), wide.zero_(), fib.zero_()
    run_on_host(kernel, *args)
    assert (out.item(), wide.item(), fib.item()) == (3.0, 3 * 2 ** 40, 144)


def test_ternary_does_not_load_out_of_bounds():
    kernel = _kernel("def k(o_ptr, x_ptr, n):\n    v = dsl.load(x_ptr + n) if n < 8 else -1.0\n"
                     "    dsl.store(o_ptr, v)\n", "ternary_load")
    out = torch.zeros(1)
    kernel[(1,)](out, torch.arange(8.0), 100, interpret=True)
    assert out.item() == -1.0
    kernel[(1,)](out, torch.arange(8.0), 5, interpret=True)
    assert out.item() == 5.0


def test_float64_to_float16_rounds_once():
    kernel = _kernel("def k(o_ptr, x_ptr):\n    i = dsl.arange(0, 4)\n"
                     "    dsl.store(o_ptr + i, dsl.load(x_ptr + i).to(dsl.float16))\n", "f64_f16")
    x = torch.tensor([1 + 2 ** -11 + 2 ** -40, 1 + 2 ** -11 - 2 ** -40, 65519.99999, 2 ** -25 + 2 ** -50],
                     dtype=torch.float64)
    out = torch.zeros(4, dtype=torch.float16)
    kernel[(1,)](out, x, interpret=True)
    assert out.double().tolist() == [1 + 2 ** -10, 1.0, 65504.0, 2 ** -24]
    _compile(kernel, out, x)


_UNSUPPORTED = {
    "for_else": ("    s = 0\n    for i in range(n):\n        s += i\n    else:\n        s += 1\n    dsl.store(o_ptr, s)\n",
                 UnsupportedError),
    "while_else": ("    s = 0\n    while s < n:\n        s += 1\n    else:\n        s += 1\n    dsl.store(o_ptr, s)\n",
                   UnsupportedError),
    "break": ("    s = 0\n    for i in range(n):\n        if i == 2:\n            break\n        s += 1\n"
              "    dsl.store(o_ptr, s)\n", UnsupportedError),
    "lambda": ("    f = lambda v: v + 1\n    dsl.store(o_ptr, f(n))\n", UnsupportedError),
    "fstring": ("    dsl.device_assert(n > 0, f\"{n}\")\n", UnsupportedError),
    "int_index": ("    x = dsl.arange(0, 4)\n    dsl.store(o_ptr, x[0])\n", CompilationError),
    "unknown_builtin": ("    dsl.store(o_ptr, dsl.no_such_builtin(dsl.arange(0, 4), 4))\n", CompilationError),
    "loop_var_after": ("    for i in range(n):\n        pass\n    dsl.store(o_ptr, i)\n", CompilationError),
    "branch_types": ("    x = dsl.load(x_ptr)\n    if n > 0:\n        y = x\n    else:\n        y = 300\n"
                     "    dsl.store(o_ptr, y)\n", CompilationError),
    "python_min": ("    dsl.store(o_ptr, min(n))\n", CompilationError),
    "python_int": ("    dsl.store(o_ptr, int(dsl.load(x_ptr)))\n", CompilationError),
}


@pytest.mark.parametrize("name", sorted(_UNSUPPORTED))
def test_unsupported_constructs_raise_dsl_errors(name):
    body, error = _UNSUPPORTED[name]
    kernel = _kernel("def k(o_ptr, x_ptr, n):\n" + body, f"unsupported {name}")
    args = (torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int8), 4)
    with pytest.raises(error):
        kernel[(1,)](*args, interpret=True)
    with pytest.raises(error):
        kernel.compile(*args, target="sm_90a")
