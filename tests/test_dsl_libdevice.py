"""libdevice's math functions (`dsl.extra.cuda.libdevice.<fn>`, `dsl.math.<fn>`) and the `**` operator: values
against exact references (mpmath at 113 bits, rounded once) within the documented ulp bounds, in float32 and
float64, 16-bit and integer inputs, C99 Annex F's special values, broadcasting and masked tails, in the
interpreter; the PTX (libdevice linked and inlined, ptxas accepts it); the compiled values on the GPU (cuda);
and the errors."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
import torch

import fusedops.dsl as dsl
from fusedops.dsl import CompilationError
from fusedops.dsl.extra.cuda import libdevice
from fusedops.dsl.language.core import is_builtin
from fusedops.dsl.language.libdevice import FUNCTIONS, NEW_NAMES
from fusedops.dsl.target import assemble, ptxas_available
from helpers import poison
from kernel_source import jit_from_source

INF, NAN = math.inf, math.nan
UNARY = [name for name, f in FUNCTIONS.items() if f.arity == 1]
BINARY = [name for name, f in FUNCTIONS.items() if f.arity == 2]
# (significand bits, smallest normal exponent) of the float dtypes, for ulps
_FORMAT = {torch.float16: (11, -14), torch.bfloat16: (8, -126), torch.float32: (24, -126), torch.float64: (53, -1022)}


@pytest.fixture(autouse=True)
def _own_cache(monkeypatch, tmp_path_factory):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "libdevice_cache"))


# -- exact references ----------------------------------------------------------------------------------------------
def _half_even(v):
    return mpmath.nint(v)       # ties to even


_EXACT = {
    "exp": mpmath.exp, "log1p": mpmath.log1p, "expm1": mpmath.expm1, "exp10": lambda v: mpmath.power(10, v),
    "log10": mpmath.log10, "tan": mpmath.tan, "asin": mpmath.asin, "acos": mpmath.acos, "atan": mpmath.atan,
    "sinh": mpmath.sinh, "cosh": mpmath.cosh, "asinh": mpmath.asinh, "acosh": mpmath.acosh, "atanh": mpmath.atanh,
    "erfc": mpmath.erfc, "cbrt": lambda v: mpmath.sign(v) * mpmath.cbrt(abs(v)),
    "trunc": lambda v: mpmath.floor(v) if v >= 0 else mpmath.ceil(v),
    "round": lambda v: mpmath.sign(v) * mpmath.floor(abs(v) + mpmath.mpf(0.5)),
    "rint": _half_even, "nearbyint": _half_even,
    "pow": mpmath.power, "atan2": mpmath.atan2, "hypot": mpmath.hypot,
    "copysign": lambda a, b: math.copysign(float(a), float(b)), "fmod": lambda a, b: math.fmod(float(a), float(b)),
}


# f(-x) = -f(x) near 0: a zero result has the sign of x (mpmath's zeros have none)
_SIGNED_ZEROS = {"trunc", "round", "rint", "nearbyint", "sinh", "tan", "asin", "atan", "asinh", "atanh", "expm1",
                 "log1p", "cbrt"}


def _exact(name: str, *args: torch.Tensor) -> np.ndarray:
    """name(*args) elementwise in mpmath, rounded once to float64 (args: the kernel's own inputs)."""
    columns = [a.double().cpu().numpy().ravel() for a in args]
    with mpmath.workprec(113):      # (scoped: mpmath's precision is process-wide, and sympy / torch share it)
        values = [float(_EXACT[name](*(mpmath.mpf(float(c[j])) for c in columns))) for j in range(len(columns[0]))]
    if name in _SIGNED_ZEROS:
        values = [math.copysign(0.0, x) if v == 0 else v for v, x in zip(values, columns[0])]
    return np.array(values).reshape(args[0].shape)


def _ulps(dtype, values: np.ndarray) -> np.ndarray:
    bits, emin = _FORMAT[dtype]
    with np.errstate(divide="ignore"):
        exponent = np.floor(np.log2(np.abs(values)))
    return 2.0 ** (np.maximum(np.where(np.isfinite(exponent), exponent, emin), emin) - (bits - 1))


def _assert_ulps(got: torch.Tensor, exact: np.ndarray, bound: float, what: str):
    """got within `bound` ulps (of got's dtype) of the exact values; NaN where they are NaN, infinities and
    the signs of zeros as the exact value rounded to the dtype has them."""
    rounded = torch.from_numpy(np.asarray(exact, dtype=np.float64)).to(got.dtype).double().numpy()
    value = got.double().cpu().numpy()
    same = (np.isnan(value) & np.isnan(rounded)) | ((value == rounded) & (np.signbit(value) == np.signbit(rounded)))
    with np.errstate(invalid="ignore"):
        error = np.abs(value - exact) / _ulps(got.dtype, rounded)
    ok = same | (np.isfinite(value) & np.isfinite(rounded) & (rounded != 0) & (error <= bound))
    assert ok.all(), f"{what}: {value[~ok][:6]} (exact {np.asarray(exact)[~ok][:6]}, ulps {error[~ok][:6]})"


# -- kernels: one row per function ---------------------------------------------------------------------------------
_KERNELS: dict = {}


def _rows_kernel(expressions: tuple):
    """A kernel storing row r of o (r * n .. r * n + n) = expressions[r] of row r of x (and of y)."""
    if expressions not in _KERNELS:
        lines = ["def k(o_ptr, x_ptr, y_ptr, n, BLOCK: dsl.constexpr):", "    i = dsl.arange(0, BLOCK)",
                 "    m = i < n"]
        for r, expression in enumerate(expressions):
            lines += [f"    x = dsl.load(x_ptr + {r} * n + i, mask=m)", f"    y = dsl.load(y_ptr + {r} * n + i, mask=m)",
                      f"    dsl.store(o_ptr + {r} * n + i, {expression}, mask=m)"]
        source = "\n".join(lines) + "\n"
        _KERNELS[expressions] = jit_from_source(source, f"<libdevice rows {len(_KERNELS)}>", namespace={
            "ld": libdevice})
    return _KERNELS[expressions]


def _run_rows(expressions, x: torch.Tensor, y: torch.Tensor = None, out_dtype=None, device="cpu"):
    """Launch `_rows_kernel(expressions)` on rows x (F, n) and y; the (F, n) result, on the CPU."""
    rows, n = x.shape
    y = x if y is None else y
    out = poison(torch.empty(rows, n, dtype=out_dtype or x.dtype, device=device))
    block = 1 << max(n - 1, 0).bit_length()
    kernel = _rows_kernel(tuple(expressions))
    kernel[(1,)](out, x.to(device).contiguous(), y.to(device).contiguous(), n, BLOCK=block,
                 **({"interpret": True} if device == "cpu" else {}))
    return out.cpu()


def _domain(name: str, n: int, generator) -> tuple:
    """Random float64 arguments of `name` inside its domain (x, and y for two-argument functions)."""
    def uniform(low, high):
        return torch.empty(n, dtype=torch.float64).uniform_(low, high, generator=generator)
    x = {"log1p": uniform(-0.999, 20.0), "expm1": uniform(-12, 12), "exp10": uniform(-30, 30),
         "log10": torch.exp(uniform(-60, 60)), "tan": uniform(-12, 12), "asin": uniform(-1, 1),
         "acos": uniform(-1, 1), "atan": uniform(-40, 40), "sinh": uniform(-20, 20), "cosh": uniform(-20, 20),
         "asinh": uniform(-500, 500), "acosh": 1 + torch.exp(uniform(-12, 12)), "atanh": uniform(-1, 1),
         "erfc": uniform(-3, 9), "cbrt": uniform(-3000, 3000), "exp": uniform(-80, 80),
         "pow": uniform(0.01, 8.0), "hypot": uniform(-1e3, 1e3), "copysign": uniform(-9, 9),
         "atan2": uniform(-5, 5), "fmod": uniform(-100, 100)}.get(name)
    if x is None:                                   # the rounding functions: halfway cases and ordinary values
        halves = torch.arange(-4, 4, dtype=torch.float64) + 0.5
        x = torch.cat([halves, torch.tensor([2.0 ** 22 + 0.5, -(2.0 ** 22 + 0.5), -0.25]), uniform(-50, 50)])[:n]
    y = {"pow": uniform(-9, 9), "hypot": uniform(-1e3, 1e3), "copysign": uniform(-1, 1),
         "atan2": uniform(-5, 5), "fmod": uniform(0.5, 7.0) * torch.where(uniform(-1, 1) < 0, -1.0, 1.0)}.get(name)
    return x, (y if y is not None else torch.zeros(n, dtype=torch.float64))


def _random_rows(names, dtype, n: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    pairs = [_domain(name, n, generator) for name in names]
    return torch.stack([p[0] for p in pairs]).to(dtype), torch.stack([p[1] for p in pairs]).to(dtype)


def _expression(name: str) -> str:
    return f"ld.{name}(x)" if FUNCTIONS[name].arity == 1 else f"ld.{name}(x, y)"


def _check_rows(names, x, y, got, bounds, what):
    for r, name in enumerate(names):
        args = (x[r],) if FUNCTIONS[name].arity == 1 else (x[r], y[r])
        _assert_ulps(got[r], _exact(name, *args), bounds(name), f"{what} {name}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_interpreter_values_within_an_ulp_of_exact(dtype):
    names = UNARY + BINARY
    x, y = _random_rows(names, dtype, 37, seed=11 if dtype == torch.float32 else 12)
    got = _run_rows([_expression(name) for name in names], x, y)
    assert got.dtype == dtype
    # float32: computed in float64 and rounded once; float64: NumPy's (glibc's) functions, a few ulps at most
    _check_rows(names, x, y, got, lambda name: 1 if dtype == torch.float32 else 4, f"interpreter {dtype}")


# -- special values: C99 Annex F, as libdevice ---------------------------------------------------------------------
_SPECIAL = {
    "exp": [(-INF, 0.0), (INF, INF), (NAN, NAN), (-0.0, 1.0), (-1000.0, 0.0), (1000.0, INF)],
    "log1p": [(-1.0, -INF), (-2.0, NAN), (-0.0, -0.0), (INF, INF), (NAN, NAN)],
    "expm1": [(-INF, -1.0), (-0.0, -0.0), (INF, INF), (NAN, NAN)],
    "exp10": [(2.0, 100.0), (-INF, 0.0), (INF, INF), (0.0, 1.0)],
    "log10": [(0.0, -INF), (-0.0, -INF), (-1.0, NAN), (1000.0, 3.0), (INF, INF)],
    "tan": [(INF, NAN), (-0.0, -0.0), (NAN, NAN)],
    "asin": [(2.0, NAN), (-1.5, NAN), (-0.0, -0.0), (1.0, math.pi / 2)],
    "acos": [(1.0, 0.0), (2.0, NAN), (-1.0, math.pi)],
    "atan": [(INF, math.pi / 2), (-INF, -math.pi / 2), (-0.0, -0.0)],
    "sinh": [(-0.0, -0.0), (-INF, -INF), (NAN, NAN)],
    "cosh": [(-INF, INF), (0.0, 1.0), (NAN, NAN)],
    "asinh": [(-INF, -INF), (-0.0, -0.0)],
    "acosh": [(1.0, 0.0), (0.5, NAN), (INF, INF)],
    "atanh": [(1.0, INF), (-1.0, -INF), (1.5, NAN), (-0.0, -0.0)],
    "erfc": [(INF, 0.0), (-INF, 2.0), (0.0, 1.0), (NAN, NAN)],
    "cbrt": [(-8.0, -2.0), (-INF, -INF), (-0.0, -0.0), (27.0, 3.0)],
    "trunc": [(-1.7, -1.0), (-0.4, -0.0), (INF, INF), (NAN, NAN)],
    "round": [(2.5, 3.0), (-2.5, -3.0), (0.5, 1.0), (-0.4, -0.0), (0.49999997, 0.0), (-INF, -INF)],
    "rint": [(2.5, 2.0), (3.5, 4.0), (-0.5, -0.0), (-2.5, -2.0), (NAN, NAN)],
    "nearbyint": [(2.5, 2.0), (-3.5, -4.0), (0.5, 0.0)],
    "pow": [(-INF, 0.5, INF), (-0.0, 0.5, 0.0), (NAN, 0.0, 1.0), (NAN, -0.0, 1.0), (1.0, NAN, 1.0), (-1.0, INF, 1.0), (-1.0, -INF, 1.0),
            (-8.0, 1 / 3, NAN), (0.0, -1.0, INF), (-0.0, -1.0, -INF), (-0.0, -2.0, INF), (0.0, -INF, INF),
            (-INF, 3.0, -INF), (-INF, -3.0, -0.0), (2.0, INF, INF), (0.5, INF, 0.0), (INF, -1.0, 0.0),
            (-2.0, 3.0, -8.0), (NAN, 1.0, NAN), (-0.0, 3.0, -0.0), (4.0, 0.5, 2.0)],
    "atan2": [(0.0, -1.0, math.pi), (-0.0, -1.0, -math.pi), (-0.0, 1.0, -0.0), (1.0, 0.0, math.pi / 2),
              (INF, INF, math.pi / 4), (NAN, 1.0, NAN)],
    "hypot": [(INF, NAN, INF), (NAN, -INF, INF), (3.0, 4.0, 5.0), (NAN, 1.0, NAN), (-0.0, 0.0, 0.0)],
    "copysign": [(1.0, -0.0, -1.0), (-2.0, 3.0, 2.0), (INF, -1.0, -INF), (0.0, -NAN, -0.0)],
    "fmod": [(5.5, 2.0, 1.5), (-5.5, 2.0, -1.5), (1.0, 0.0, NAN), (INF, 1.0, NAN), (3.0, INF, 3.0),
             (-0.0, 2.0, -0.0), (-4.0, 2.0, -0.0)],
}


def _special_rows(dtype):
    names = list(_SPECIAL)
    width = max(len(cases) for cases in _SPECIAL.values())
    padded = {name: (cases * width)[:width] for name, cases in _SPECIAL.items()}
    x = torch.tensor([[case[0] for case in padded[name]] for name in names], dtype=torch.float64).to(dtype)
    y = torch.tensor([[case[1] if len(case) == 3 else 0.0 for case in padded[name]] for name in names],
                     dtype=torch.float64).to(dtype)
    expected = np.array([[case[-1] for case in padded[name]] for name in names])
    return names, x, y, expected


def _check_special(got, names, expected, bounds=lambda name: 1):
    for r, name in enumerate(names):
        _assert_ulps(got[r], expected[r], bounds(name), f"{name} special values")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_interpreter_special_values(dtype):
    names, x, y, expected = _special_rows(dtype)
    _check_special(_run_rows([_expression(name) for name in names], x, y), names, expected)


# -- the `**` operator and pow's integer exponents -----------------------------------------------------------------
def _identical(a: torch.Tensor, b: torch.Tensor) -> bool:
    """The same values, NaN where NaN, and the signs of zeros."""
    nan = torch.isnan(a)
    return bool(torch.equal(nan, torch.isnan(b)) and torch.equal(a[~nan], b[~nan])
                and torch.equal(torch.signbit(a[~nan]), torch.signbit(b[~nan])))


def test_power_operator_and_integer_exponents():
    generator = torch.Generator().manual_seed(5)
    x = torch.randn(13, generator=generator) * 3
    x[:3] = torch.tensor([0.0, -0.0, NAN])
    k = torch.randint(-6, 7, (13,), generator=generator, dtype=torch.int32)
    y = torch.rand(13, generator=generator) * 4 - 2
    rows = ["x ** 2", "x ** -1", "x ** 4", "x ** 0", "x ** 3", "x ** y.to(dsl.int32)", "ld.pow(x, y.to(dsl.int32))",
            "ld.pow(x, 3)", "x ** 0.5", "2.0 ** x", "(x.to(dsl.float16) ** 3).to(dsl.float32)"]
    ys = torch.stack([k.float() if "y" in row else y for row in rows])
    got = _run_rows(rows, x.expand(len(rows), 13).contiguous(), ys)
    assert _identical(got[0], x * x)                            # the correctly rounded x * x
    assert _identical(got[1], 1 / x)                            # the IEEE 1 / x (inf of the sign of 0)
    assert _identical(got[2], (x * x) * (x * x))
    assert torch.equal(got[3], torch.ones(13))                  # NaN ** 0 is 1 too
    exact_k = np.array([float(mpmath.power(mpmath.mpf(a), b)) if a == a and (a != 0 or b >= 0) else
                        (NAN if a != a else math.copysign(INF, a) if b % 2 else INF)
                        for a, b in zip(x.tolist(), k.tolist())])
    for row in (5, 6):                  # |k| <= 6: at most 5 products and a division, each rounded once
        _assert_ulps(got[row], exact_k, 4, rows[row])
    assert _identical(got[5], got[6])
    _assert_ulps(got[4], (x.double() ** 3).numpy(), 2, "x ** 3")
    assert _identical(got[7], got[4])
    roots = [math.pow(a, 0.5) if not a < 0 else NAN for a in x.tolist()]       # C's pow: pow(-0.0, 0.5) = +0.0
    _assert_ulps(got[8], np.array(roots), 1, "x ** 0.5")
    _assert_ulps(got[9], _exact("pow", torch.full((13,), 2.0), x), 1, "2.0 ** x")
    half = x.half().float()
    assert _identical(got[10], ((half * half) * half).half().float())    # float16 in float32, rounded once
    positive = x.abs().nan_to_num(1.0) + 0.5
    got = _run_rows(["dsl.math.pow(x, y)"], positive[None, :], y[None, :])
    _assert_ulps(got[0], _exact("pow", positive, y), 1, "pow(x, y)")


def test_integer_power_wraps_and_integer_inputs_give_float32():
    values = torch.tensor([0, 1, -1, 2, -3, 7, 2000, -2000, 46341, 123457, 5, 0, -9], dtype=torch.int32)
    rows = ["x ** 3", "x ** 0", "x ** 1", "(x > 0) ** 2", "x ** 2"]
    got = _run_rows(rows, values.expand(len(rows), 13).contiguous(), out_dtype=torch.int32)
    wide = values.long()
    assert torch.equal(got[0], (wide ** 3).to(torch.int32))      # wraps as int32 (torch's int pow wraps too)
    assert torch.equal(got[1], torch.ones(13, dtype=torch.int32))
    assert torch.equal(got[2], values)
    assert torch.equal(got[3], (values > 0).to(torch.int32))
    assert torch.equal(got[4], (wide * wide).to(torch.int32))
    float_rows = ["ld.log1p(x)", "ld.atan2(x, 3)", "dsl.math.pow(x, 2)", "ld.cbrt(x)", "ld.round(x)"]
    small = values.clamp(-100, 100)
    got = _run_rows(float_rows, small.expand(5, 13).contiguous(), out_dtype=torch.float32)
    as_float = small.double()
    with np.errstate(invalid="ignore", divide="ignore"):
        _assert_ulps(got[0], np.log1p(as_float.numpy()), 1, "log1p(int)")
    _assert_ulps(got[1], _exact("atan2", as_float, torch.full((13,), 3.0)), 1, "atan2(int, 3)")
    assert torch.equal(got[2], (as_float ** 2).float())
    _assert_ulps(got[3], _exact("cbrt", as_float), 1, "cbrt(int)")
    assert torch.equal(got[4], as_float.float())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_16_bit_floats_round_the_float32_result(dtype):
    names = ["log1p", "tan", "erfc", "rint", "round", "pow", "atan2", "hypot", "fmod"]
    x, y = _random_rows(names, torch.float64, 16, seed=3)
    x[names.index("pow")] = x[names.index("pow")].clamp(0.1, 4)
    y[names.index("pow")] = y[names.index("pow")].clamp(-4, 4)
    x, y = x.to(dtype), y.to(dtype)
    got = _run_rows([_expression(name) for name in names], x, y)
    assert got.dtype == dtype
    _check_rows(names, x, y, got, lambda name: 1, f"interpreter {dtype}")


def _broadcast_kernel():
    source = ("def k(o_ptr, x_ptr, y_ptr, s, n, BLOCK: dsl.constexpr):\n"
              "    i = dsl.arange(0, BLOCK)\n"
              "    j = dsl.arange(0, 8)\n"
              "    x = dsl.load(x_ptr + i, mask=i < n)\n"
              "    y = dsl.load(y_ptr + j)\n"
              "    grid = ld.atan2(x[:, None], y[None, :])\n"
              "    dsl.store(o_ptr + i[:, None] * 8 + j[None, :], grid, mask=(i < n)[:, None])\n"
              "    dsl.store(o_ptr + 8 * n + i, ld.hypot(x, 3) + ld.pow(2.0, x) + ld.log1p(s), mask=i < n)\n")
    return jit_from_source(source, "<libdevice broadcast>", namespace={"ld": libdevice})


def test_broadcasting_scalars_masked_tails_and_size_one():
    kernel = _broadcast_kernel()
    generator = torch.Generator().manual_seed(9)
    for n, block in ((13, 16), (1, 1)):
        x, y = torch.randn(n, generator=generator), torch.randn(8, generator=generator)
        out = poison(torch.empty(9 * n))
        kernel[(1,)](out, x, y, 0.25, n, BLOCK=block, interpret=True)
        grid = torch.tensor([[float(mpmath.atan2(a, b)) for b in y.tolist()] for a in x.tolist()])
        _assert_ulps(out[:8 * n].view(n, 8), grid.numpy(), 1, f"atan2 grid n={n}")
        wanted = np.hypot(x.double().numpy(), 3) + np.exp2(x.double().numpy()) + math.log1p(0.25)
        torch.testing.assert_close(out[8 * n:].double(), torch.from_numpy(wanted), rtol=2e-7, atol=0)


def test_predicates_are_int1_and_signbit_int32():
    values = [0.0, -0.0, 1.5, -2.0, INF, -INF, NAN, -NAN, 1e-40, 3e38, -1e-300]
    rows = ["ld.isnan(x).to(dsl.int32)", "ld.isinf(x).to(dsl.int32)", "ld.isfinite(x).to(dsl.int32)",
            "ld.signbit(x)", "ld.finitef(x).to(dsl.int32) + 2 * ld.isfinited(x).to(dsl.int32)"]
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        x = torch.tensor(values, dtype=torch.float64).to(dtype)
        x[7] = -x[6].abs()                        # a NaN with the sign bit set
        got = _run_rows(rows, x.expand(len(rows), len(values)).contiguous(), out_dtype=torch.int32)
        want = torch.stack([torch.isnan(x), torch.isinf(x), torch.isfinite(x), torch.signbit(x),
                            torch.isfinite(x)]).to(torch.int32) * torch.tensor([1, 1, 1, 1, 3])[:, None]
        assert torch.equal(got, want), (dtype, got, want)
    ints = torch.tensor([-3, 0, 5, -2 ** 31], dtype=torch.int32)
    got = _run_rows(rows[:4], ints.expand(4, 4).contiguous(), out_dtype=torch.int32)
    assert torch.equal(got, torch.stack([torch.zeros(4), torch.zeros(4), torch.ones(4), (ints < 0).float()]).int())
    checked = jit_from_source(
        "def k(o_ptr, x_ptr):\n    x = dsl.load(x_ptr + dsl.arange(0, 4))\n"
        "    dsl.static_assert(ld.isnan(x).dtype == dsl.int1 and ld.isfinite(x).dtype == dsl.int1)\n"
        "    dsl.static_assert(ld.signbit(x).dtype == dsl.int32 and dsl.math.isinf(x).dtype == dsl.int1)\n"
        "    dsl.store(o_ptr + dsl.arange(0, 4), ld.signbit(x))\n", "<libdevice predicate types>",
        namespace={"ld": libdevice})
    out = poison(torch.empty(4, dtype=torch.int32))
    checked[(1,)](out, torch.tensor([-0.0, 0.0, -NAN, 1.0]), interpret=True)
    assert out.tolist() == [1, 0, int(torch.signbit(torch.tensor(-NAN)).item()), 0]


# -- names ---------------------------------------------------------------------------------------------------------
def test_namespaces():
    import fusedops.dsl.extra.cuda.libdevice as cuda_libdevice
    import fusedops.dsl.extra.libdevice as extra_libdevice
    from fusedops.dsl.math import log1p
    assert cuda_libdevice is extra_libdevice is libdevice is dsl.extra.cuda.libdevice is dsl.extra.libdevice
    assert log1p is libdevice.log1p
    for name in libdevice.__all__:
        assert is_builtin(getattr(libdevice, name)), name
    assert set(NEW_NAMES) <= set(dsl.math.__all__) and set(NEW_NAMES) <= set(libdevice.__all__)
    for name in [*UNARY, *BINARY, "isnan", "isinf", "isfinite", "signbit"]:
        if name != "exp":
            assert getattr(dsl.math, name) is getattr(libdevice, name), name
    assert dsl.math.exp is dsl.exp and libdevice.exp is not dsl.exp       # libdevice's expf, not ex2.approx
    assert libdevice.exp2 is dsl.exp2 and libdevice.sqrt is dsl.sqrt and libdevice.fma is dsl.fma
    with pytest.raises(RuntimeError, match=r"dsl.log1p can only be called inside a @dsl.jit kernel"):
        libdevice.log1p(torch.ones(1))
    with pytest.raises(AttributeError, match=r"'lgamma'.*dsl.extra.cuda.libdevice has exp, log1p"):
        libdevice.lgamma                                                        # noqa: B018
    with pytest.raises(AttributeError, match=r"Triton's tl.log1p: use dsl.math.log1p"):
        dsl.log1p                                                               # noqa: B018


@pytest.mark.parametrize("expression, message", [
    ("ld.log1p(x_ptr)", r"log1p: x must be a number \(a float or integer scalar or block\), got ptr<float32>"),
    ("ld.isnan('a')", r"isnan: x must be a number .*got 'a'"),
    ("ld.atan2(x)", r"bad arguments to ld.atan2\(\).*missing a required argument: 'y'"),
    ("ld.log1p(x, x)", r"bad arguments to ld.log1p\(\)"),
    ("ld.pow(x, x.to(dsl.int64))", r"pow: an integer exponent must fit int32 .*got int64"),
    ("ld.pow(x, 2 ** 40)", r"pow: the integer exponent 1099511627776 does not fit int32"),
    ("x.to(dsl.int32) ** -2", r"`\*\*` of an integer base needs a compile-time int exponent >= 0, got the exponent -2"),
    ("x.to(dsl.int32) ** x.to(dsl.int32)", r"integer base needs a compile-time int exponent >= 0, got a runtime"),
    ("ld.lgamma(x)", r"module `fusedops.dsl.extra.cuda.libdevice` has no attribute `lgamma` \(Triton's "
                     r"libdevice.lgamma is not in the language"),
    ("dsl.math.erfinv(x)", r"module `fusedops.dsl.math` has no attribute `erfinv`"),
])
def test_errors(expression, message):
    kernel = jit_from_source(f"def k(o_ptr, x_ptr):\n    x = dsl.load(x_ptr + dsl.arange(0, 4))\n"
                             f"    dsl.store(o_ptr + dsl.arange(0, 4), {expression})\n",
                             f"<libdevice error {abs(hash(expression))}>", namespace={"ld": libdevice})
    with pytest.raises(CompilationError, match=message):
        kernel[(1,)](torch.empty(4), torch.randn(4), interpret=True)


# -- PTX -----------------------------------------------------------------------------------------------------------
needs_ptxas = pytest.mark.skipif(not ptxas_available(), reason="ptxas is not installed")


@needs_ptxas
def test_ptx_links_and_inlines_libdevice():
    expressions = tuple([_expression(name) for name in UNARY + BINARY] + ["x ** y.to(dsl.int32)"])
    kernel = _rows_kernel(expressions)
    for element, arch in ((dsl.float32, "sm_90a"), (dsl.float32, "sm_80"), (dsl.float64, "sm_90a")):
        pointer = dsl.pointer_type(element)
        ptx = kernel.compile(pointer, pointer, pointer, dsl.int32, BLOCK=32, target=arch).asm["ptx"]
        assert "__nv_" not in ptx, (element, arch)        # every libdevice call linked and inlined
        assert assemble(ptx, arch).spill_bytes == 0
    pointer = dsl.pointer_type(dsl.float32)
    grid = _broadcast_kernel().compile(pointer, pointer, pointer, dsl.float32, dsl.int32, BLOCK=16,
                                       target="sm_90a").asm["ptx"]                # 2-D blocks and a scalar
    assert "__nv_" not in grid and assemble(grid, "sm_90a").spill_bytes == 0
    square = _rows_kernel(("x ** 2 + x ** -1",)).compile(pointer, pointer, pointer, dsl.int32, BLOCK=128,
                                                        target="sm_90a").asm["ptx"]
    # a compile-time exponent is its multiplications: one mul for x ** 2, the IEEE reciprocal for x ** -1
    assert square.count("mul.rn.f32") == 1 and square.count("rcp.rn.f32") == 1 and "bra" not in square


# -- on the GPU: the same references -------------------------------------------------------------------------------
@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_compiled_values_within_libdevice_bounds(dtype):
    names = UNARY + BINARY
    x, y = _random_rows(names, dtype, 61, seed=21)
    got = _run_rows([_expression(name) for name in names], x, y, device="cuda")
    column = 0 if dtype == torch.float32 else 1
    _check_rows(names, x, y, got, lambda name: FUNCTIONS[name].ulps[column] + 1, f"compiled {dtype}")


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_compiled_special_values(dtype):
    names, x, y, expected = _special_rows(dtype)
    got = _run_rows([_expression(name) for name in names], x, y, device="cuda")
    column = 0 if dtype == torch.float32 else 1        # (the exact cases, exp10(2) = 100, within the bounds)
    _check_special(got, names, expected, lambda name: FUNCTIONS[name].ulps[column] + 1)


@pytest.mark.cuda
def test_compiled_power_and_16_bit_match_the_interpreter():
    generator = torch.Generator().manual_seed(31)
    x = torch.randn(3, 29, generator=generator) * 3
    k = torch.randint(-9, 10, (3, 29), generator=generator).float()
    rows = ["x ** 2 + x ** -3", "x ** y.to(dsl.int32)", "ld.pow(x.to(dsl.bfloat16), 3).to(dsl.float32)"]
    compiled, interpreted = (_run_rows(rows, x, k, device=device) for device in ("cuda", "cpu"))
    # powi and constant exponents repeat libdevice's products exactly: bit for bit with the interpreter
    assert torch.equal(compiled.nan_to_num(7.0), interpreted.nan_to_num(7.0))
    names = ["log1p", "atan2", "round", "pow"]
    half = _random_rows(names, torch.float16, 29, seed=4)
    got = _run_rows([_expression(name) for name in names], *half, device="cuda")
    _check_rows(names, *half, got, lambda name: 1, "compiled float16")       # float32's error, rounded to 16 bits
