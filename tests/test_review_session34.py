"""Review of `dsl.exp(x, ftz=...)` / `dsl.exp2(x, ftz=...)` (commit c6cd792 and the tests after it) and of the
attention kernels that now take `ftz=True` for P and alpha, probed as a new user on the CPU (interpreter, PTX
text, ptxas).

Probed:
- spellings of the flag: a literal, 1 / 0 / None, a dsl.constexpr parameter, a module-global dsl.constexpr, a
  jit helper's parameter (plain, constexpr, defaulted, keyword-only), a dsl.static_range variable; a positional
  flag, a misspelt keyword, `ftz` on dsl.log, and run-time flags (int, bool, a block comparison);
- every input dtype (float32, float16, bfloat16, float64, int8/int32/int64, uint8, bool) against float64,
  at the flush boundary (2^-126 exactly, one float32 step below it, 2^-149, e^-87.3365...), on specials
  (+-inf, NaN, +-0.0, subnormal inputs) and overflow; the sign of flushed zeros;
- 0-d values (a loaded scalar, a run-time float argument, Python int / float literals) in the contexts a
  scalar reaches (if / while conditions, range bounds, atomics, where, maximum, splats);
- broadcast 2-D blocks (a softmax row over s - max[:, None]), loops carrying exp2 results, an exp inside an
  if, and flushed and unflushed copies of one expression in one kernel (CSE, the IR text, the disk cache);
- the default path's PTX against a checkout of 5fde7f5 (before the change): byte-identical for 34 probe
  kernels (exp / exp2 / sigmoid in each dtype, loops, reductions, scalars, sm_80 and sm_90a) and for 12
  softmax library kernels; the attention kernels' PTX (forward in all mask kinds, dK/dV and dQ with and
  without an additive mask) is the old PTX with `ex2.approx.f32` -> `ex2.approx.ftz.f32` and nothing else;
  LLVM (22) does not constant-fold `llvm.nvvm.ex2.approx.ftz.f32` of a constant;
- the attention interpreter path against float64 at L, S in {1, 17, 100}, causal, bool masks and additive
  masks of -1e30, -inf, -87..-120 (weights under 2^-126), alpha underflowing between key blocks, and a key
  whose every weight is subnormal; old (5fde7f5) and new outputs differ only in dK / dV / dQ entries made
  of subnormal-weighted terms alone (about 1e-45 .. 4e-37 -> exactly 0), never a NaN.

Found: no functional defect in the flushing itself (interpreter, codegen, CSE, cache key, attention).
- At 6be27f3 `ftz` was read with `bool(...)` (compile_time_flag), so `ftz="False"`, `ftz=(False,)` or 2 flushed
  silently and 1 / 0 / None were accepted; the working tree's (uncommitted) semantics.py edit makes any
  non-bool a CompilationError naming `exp2: ftz`. test_non_bool_flags_are_rejected_not_read_as_truth_values
  pins that (it fails against 6be27f3's semantics.py, 7 cases). Dependent consequence: a loop index from
  dsl.static_range is an int and must be turned into a bool (`ftz=j == 1`).
- Notes, not failing tests: the interpreter's `_math_rule` honours an `ftz` attr on every UNARY_MATH op while
  codegen does only on exp / exp2 (unreachable from the language, which sets it on float32 exp / exp2 only);
  a positional flag gets the generic "too many positional arguments" (the keyword is not named); with
  ftz=True, dK / dV / dQ entries made only of subnormal-weighted terms become exactly 0 (measured up to
  ~4e-37 for bfloat16 inputs before), as documented.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch

import fusedops.dsl as dsl
from fusedops.dsl import CompilationError
from fusedops.dsl.target import assemble, ptxas_available
from fusedops.kernels import attention as at
from fusedops.kernels.attention_configs import INTERPRETER_CONFIG
from fusedops.kernels.attention_logits import ADDITIVE_MASK
from helpers import assert_close, poison

needs_ptxas = pytest.mark.skipif(not ptxas_available(), reason="ptxas is not on the PATH")

TINY = 2.0 ** -126                    # float32's smallest normal
F32_DENORM = 2.0 ** -149              # float32's smallest subnormal
_PTR32 = dsl.pointer_type(dsl.float32)


def _flushed(reference: torch.Tensor) -> torch.Tensor:
    """float64 values with those below float32's smallest normal made +0 (ftz's contract)."""
    return torch.where(reference.abs() < TINY, torch.zeros_like(reference), reference)


def _assert_float32_close(got: torch.Tensor, want: torch.Tensor) -> None:
    """got (float32 results) against float64 `want`: NaN and inf at the same places, zeros exactly zero,
    elsewhere a few float32 ulp (NumPy's float32 exp / exp2) or one subnormal step."""
    got, want = got.double(), want.double()
    overflow = want.abs() > float(torch.finfo(torch.float32).max)
    want = torch.where(overflow, want.sign() * math.inf, want)              # beyond float32's range: inf
    assert torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got[want.isinf()], want[want.isinf()])
    finite = want.isfinite()
    g, w = got[finite], want[finite]
    assert torch.all((g - w).abs() <= w.abs() * 2.0 ** -20 + F32_DENORM), (g - w).abs().max()
    assert torch.all(g[w == 0] == 0)


# -- the flag's spellings and errors ------------------------------------------------------------------------

_GLOBAL_ON = dsl.constexpr(True)
_GLOBAL_OFF = dsl.constexpr(False)
_X4 = torch.tensor([-130.0, -126.0, -1.0, -127.0])          # subnormal, 2^-126, ordinary, subnormal results


@dsl.jit
def _spelled(o_ptr, x_ptr, N: dsl.constexpr, F: dsl.constexpr):
    i = dsl.arange(0, N)
    dsl.store(o_ptr + i, dsl.exp2(dsl.load(x_ptr + i), ftz=F))


@pytest.mark.parametrize("flag", [False, True])
def test_constexpr_flag_values(flag):
    out = poison(torch.empty(4))
    _spelled[(1,)](out, _X4, 4, flag, interpret=True)
    want = torch.exp2(_X4.double())
    _assert_float32_close(out, _flushed(want) if flag else want)


@pytest.mark.parametrize("flag", [1, 0, None, "False", 2, 0.0, (False,)])
def test_non_bool_flags_are_rejected_not_read_as_truth_values(flag):
    # bool() would make ftz="False" or a stray tuple flush silently (commits c6cd792..6be27f3 did)
    with pytest.raises(CompilationError, match=r"exp2: ftz must be a constexpr bool, got " + re.escape(repr(flag))):
        _spelled[(1,)](torch.empty(4), _X4, 4, flag, interpret=True)


@dsl.jit
def _helper_plain(x, flag):
    return dsl.exp2(x, ftz=flag)


@dsl.jit
def _helper_default(x, flag: dsl.constexpr = True):
    return dsl.exp2(x, ftz=flag)


@dsl.jit
def _helper_keyword(x, *, flag=True):
    return dsl.exp2(x, ftz=flag)


@dsl.jit
def _spellings(o_ptr, x_ptr, F: dsl.constexpr):
    # rows: the global constexprs, inline dsl.constexpr, helpers (plain parameter, constexpr default,
    # keyword-only default), a static_range variable (0 then 1), a tuple loop (False then True)
    i = dsl.arange(0, 4)
    x = dsl.load(x_ptr + i)
    dsl.store(o_ptr + i, dsl.exp2(x, ftz=_GLOBAL_ON))
    dsl.store(o_ptr + 4 + i, dsl.exp2(x, ftz=_GLOBAL_OFF))
    dsl.store(o_ptr + 8 + i, dsl.exp2(x, ftz=dsl.constexpr(False)))
    dsl.store(o_ptr + 12 + i, _helper_plain(x, F))
    dsl.store(o_ptr + 16 + i, _helper_default(x))
    dsl.store(o_ptr + 20 + i, _helper_keyword(x))
    for j in dsl.static_range(2):
        dsl.store(o_ptr + (24 + 4 * j) + i, dsl.exp2(x, ftz=j == 1))
    for flag in (False, True):
        dsl.store(o_ptr + (32 + 4 * flag) + i, dsl.exp(x * 0.6931471805599453, ftz=flag))


@pytest.mark.parametrize("F", [False, True])
def test_flag_through_globals_helpers_and_unrolled_loops(F):
    out = poison(torch.empty(40))
    _spellings[(1,)](out, _X4, F, interpret=True)
    plain = torch.exp2(_X4.double())
    flushed = _flushed(plain)
    rows = out.view(10, 4)
    for row, want in zip(rows[:8], [flushed, plain, plain, flushed if F else plain, flushed, flushed, plain,
                                    flushed]):
        _assert_float32_close(row, want)
    # exp(x ln 2): x ln 2 rounds in float32, so compare against exp of the rounded product
    e = torch.exp((_X4 * 0.6931471805599453).double())
    _assert_float32_close(rows[8], e)
    _assert_float32_close(rows[9], _flushed(e))


@dsl.jit
def _positional(o_ptr, x_ptr):
    dsl.store(o_ptr, dsl.exp2(dsl.load(x_ptr), True))


@dsl.jit
def _misspelt(o_ptr, x_ptr):
    dsl.store(o_ptr, dsl.exp(dsl.load(x_ptr), fzt=True))


@dsl.jit
def _on_log(o_ptr, x_ptr):
    dsl.store(o_ptr, dsl.log(dsl.load(x_ptr), ftz=True))


@pytest.mark.parametrize("kernel,message", [(_positional, r"dsl\.exp2\(\): too many positional"),
                                            (_misspelt, r"dsl\.exp\(\): got an unexpected keyword argument 'fzt'"),
                                            (_on_log, r"dsl\.log\(\): got an unexpected keyword argument 'ftz'")])
def test_bad_calls_are_compilation_errors(kernel, message):
    with pytest.raises(CompilationError, match=message):
        kernel[(1,)](torch.empty(1), torch.ones(1), interpret=True)


@dsl.jit
def _runtime_exp(o_ptr, x_ptr, flag):
    dsl.store(o_ptr, dsl.exp(dsl.load(x_ptr), ftz=flag))


@dsl.jit
def _block_condition(o_ptr, x_ptr):
    x = dsl.load(x_ptr + dsl.arange(0, 4))
    dsl.store(o_ptr + dsl.arange(0, 4), dsl.exp2(x, ftz=x < 0))


@pytest.mark.parametrize("flag", [1, True])
def test_runtime_flags_name_the_argument(flag):
    with pytest.raises(CompilationError, match=r"exp: ftz must be a constexpr bool, got a runtime int(32|1) value"):
        _runtime_exp[(1,)](torch.empty(1), torch.zeros(1), flag, interpret=True)
    with pytest.raises(CompilationError, match=r"exp2: ftz must be a constexpr bool, got a runtime <4xint1> value"):
        _block_condition[(1,)](torch.empty(4), torch.zeros(4), interpret=True)
    with pytest.raises(CompilationError, match="exp2: ftz"):        # .compile says the same
        _block_condition.compile(_PTR32, _PTR32, target="sm_80")


# -- values against float64, every dtype ---------------------------------------------------------------------

@dsl.jit
def _both(o_ptr, x_ptr, N: dsl.constexpr, F: dsl.constexpr):
    # row 0: exp2(x, ftz=F); row 1: exp(x, ftz=F)
    i = dsl.arange(0, N)
    x = dsl.load(x_ptr + i)
    dsl.store(o_ptr + i, dsl.exp2(x, ftz=F))
    dsl.store(o_ptr + N + i, dsl.exp(x, ftz=F))


_EDGES = [-126.0, float(np.nextafter(np.float32(-126), np.float32(-200))), -125.99999, -127.0, -149.0, -149.5,
          -150.0, -1000.0, 0.0, -0.0, 1e-45, -1e-45, 1e-40, math.inf, -math.inf, math.nan, 127.9, 128.0,
          -87.33654, -87.33655, -87.4, -103.0, -104.0, 3.0, -20.5, 88.0, 89.0, -0.5, 1.0, 2.5, -60.0, -90.0]


def _float_inputs(dtype):
    return torch.tensor(_EDGES, dtype=torch.float64).to(dtype)


def _int_inputs(dtype):
    if dtype == torch.bool:
        return torch.arange(32) % 3 == 0
    if dtype == torch.uint8:
        return torch.arange(0, 256, 8, dtype=dtype)
    low = -128 if dtype == torch.int8 else -200
    return torch.linspace(low, 100, 32).round().to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int8,
                                   torch.int32, torch.int64, torch.uint8, torch.bool])
@pytest.mark.parametrize("ftz", [False, True])
def test_every_dtype_against_float64(dtype, ftz):
    x = _float_inputs(dtype) if dtype.is_floating_point else _int_inputs(dtype)
    out_dtype = dtype if dtype.is_floating_point else torch.float32
    out = poison(torch.empty(64, dtype=out_dtype))
    _both[(1,)](out, x, 32, ftz, interpret=True)
    xd = x.double()
    if dtype == torch.float64:                                    # float64 ignores the flag
        got = out.view(2, 32)
        torch.testing.assert_close(got, torch.stack([torch.exp2(xd), torch.exp(xd)]), rtol=1e-15, atol=0,
                                   equal_nan=True)
        assert got[0, 5].item() == 2.0 ** -149.5 and got[1, 21].item() > 0       # subnormal-range results kept
        return
    # the float32 computation: float32 inputs (exact for every dtype here); flushed in float32; rounded once
    want = torch.stack([torch.exp2(xd), torch.exp(xd)])
    want32 = _flushed(want) if ftz else want
    got = out.view(2, 32).double()
    if out_dtype == torch.float32:
        _assert_float32_close(got, want32)
        if not ftz and dtype == torch.float32:
            assert got[0, 3].item() == 2.0 ** -127 and got[0, 4].item() == 2.0 ** -149     # subnormals kept
    else:
        # 16-bit: the float32 result (flushed or not) rounded to the type: within one 16-bit ulp of that
        expected = want32.to(out_dtype).double()
        ulp = 2.0 ** (-10 if out_dtype == torch.float16 else -7)
        finite = expected.isfinite() & got.isfinite()
        assert torch.equal(got.isnan(), expected.isnan())
        assert torch.equal(got[~finite & ~got.isnan()], expected[~finite & ~expected.isnan()])
        assert torch.all((got[finite] - expected[finite]).abs()
                         <= expected[finite].abs() * ulp + torch.finfo(out_dtype).smallest_normal * ulp)
        if out_dtype == torch.bfloat16:                           # bfloat16 has float32's exponent range
            assert (got[0, 3].item() == 0.0) == ftz               # 2^-127: a bfloat16 subnormal unless flushed
            assert got[0, 0].item() == TINY                       # 2^-126 itself is never flushed


def test_flushed_zeros_are_positive_and_specials_pass_through():
    x = torch.tensor([-130.0, -math.inf, math.inf, math.nan, -0.0, 0.0, -1e-45, 1e-45, -200.0, -1e30,
                      -126.0, 128.0] + [0.0] * 4)
    out = poison(torch.empty(32))
    _both[(1,)](out, x, 16, True, interpret=True)
    exp2_row, exp_row = out.view(2, 16)[:, :12]
    for row in (exp2_row, exp_row):
        zeros = row[[0, 1, 8, 9]]
        assert torch.all(zeros == 0) and not torch.signbit(zeros).any()          # +0, never -0
        assert row[2].item() == math.inf and math.isnan(row[3].item())
        assert row[4:8].tolist() == [1.0, 1.0, 1.0, 1.0]                        # +-0 and subnormal inputs: 1
    assert exp2_row[10].item() == TINY and exp2_row[11].item() == math.inf
    assert exp_row[10].item() == 0.0                                              # e^-126


# -- scalars and literals ---------------------------------------------------------------------------------------

@dsl.jit
def _scalars(o_ptr, x_ptr, s, F: dsl.constexpr):
    v = dsl.load(x_ptr)                               # 0-d
    e = dsl.exp2(s, ftz=F)                            # a run-time float argument
    dsl.store(o_ptr, dsl.exp2(v, ftz=F))
    dsl.store(o_ptr + 1, e)
    dsl.store(o_ptr + 2, dsl.exp2(-130.0, ftz=F))     # Python float literal (float32)
    dsl.store(o_ptr + 3, dsl.exp(-100, ftz=F))        # Python int literal
    dsl.store(o_ptr + 4, dsl.exp2(v, ftz=F) + dsl.exp2(v))            # both variants of one expression
    dsl.store(o_ptr + 5, dsl.where(e == 0, 5.0, e))
    dsl.store(o_ptr + 6, dsl.maximum(e, dsl.exp2(s, ftz=True)))
    if e > 0:
        dsl.store(o_ptr + 7, 1.0)
    else:
        dsl.store(o_ptr + 7, -1.0)
    n = dsl.minimum(e * 1.0e21 * 1.0e19, 16.0).to(dsl.int32)             # a loop bound from a flushed scalar
    acc = 0.0
    for i in range(n):
        acc += dsl.exp2(s - i, ftz=F)
    dsl.store(o_ptr + 8, acc)
    dsl.atomic_add(o_ptr + 9, e)
    t = dsl.exp2(s + 20.0, ftz=F)                     # 2^(s + 20), halved while above 1
    while t > 1.0:
        t = dsl.exp2(dsl.log2(t) - 1.0, ftz=F)
    dsl.store(o_ptr + 10, t)
    dsl.store(o_ptr + 11 + dsl.arange(0, 4), e + dsl.zeros((4,), dsl.float32))


@pytest.mark.parametrize("ftz", [False, True])
@pytest.mark.parametrize("s", [-130.0, -131.0, -2.0])
def test_scalars_in_every_context(s, ftz):
    out = torch.zeros(15)
    _scalars[(1,)](out, torch.tensor([-130.0]), s, ftz, interpret=True)
    f = _flushed if ftz else (lambda t: t)
    e = f(torch.exp2(torch.tensor(s, dtype=torch.float64))).item()
    v = f(torch.exp2(torch.tensor(-130.0, dtype=torch.float64))).item()
    n = int(min(e * 1.0e21 * 1.0e19, 16.0))
    acc = sum(f(torch.exp2(torch.tensor(s - i, dtype=torch.float64))).item() for i in range(n))
    want = [v, e, v, f(torch.exp(torch.tensor(-100.0, dtype=torch.float64))).item(), v + 2.0 ** -130,
            5.0 if e == 0 else e, e, 1.0 if e > 0 else -1.0, acc, e, 1.0 if s + 20 > 0 else 2.0 ** (s + 20)] + [e] * 4
    _assert_float32_close(out, torch.tensor(want, dtype=torch.float64))


# -- blocks, broadcasting, loops, CSE ---------------------------------------------------------------------------

@dsl.jit
def _row_softmax(o_ptr, x_ptr, M: dsl.constexpr, N: dsl.constexpr, F: dsl.constexpr):
    r = dsl.arange(0, M)[:, None] * N + dsl.arange(0, N)[None, :]
    s = dsl.load(x_ptr + r)
    m = dsl.max(s, axis=1)
    p = dsl.exp2(s - m[:, None], ftz=F)
    dsl.store(o_ptr + r, p)
    dsl.store(o_ptr + M * N + r, p / dsl.sum(p, axis=1)[:, None])


@pytest.mark.parametrize("shape", [(1, 16), (16, 2), (4, 32)])
@pytest.mark.parametrize("ftz", [False, True])
def test_broadcast_rows_against_float64(shape, ftz):
    m, n = shape
    g = torch.Generator().manual_seed(m * 100 + n)
    s = torch.randn(m, n, generator=g) * 80                       # spreads of hundreds: subnormal weights
    s[0, -1] = s[0, :-1].max() - 130.0                                 # a weight of 2^-130 in row 0
    out = poison(torch.empty(2 * m * n))
    _row_softmax[(1,)](out, s, m, n, ftz, interpret=True)
    d = (s - s.max(1, keepdim=True).values).double()              # the kernel's float32 subtraction
    p = torch.exp2(d)
    p = _flushed(p) if ftz else p
    got = out.view(2, m, n)
    _assert_float32_close(got[0], p)
    _assert_float32_close(got[1], p / p.sum(1, keepdim=True))
    assert (got[0, 0, -1].item() == 0) == ftz


@dsl.jit
def _carried(o_ptr, x_ptr, n_iter, BLOCK: dsl.constexpr, F: dsl.constexpr):
    # outside the loop: exp2(x) (never flushed) and exp2(x, ftz=F); inside: the same expressions again (the
    # flushed one may reuse the outer one, the plain one must not stand in for it), a value carried through
    # exp2, and an exp in an if
    i = dsl.arange(0, BLOCK)
    v = dsl.load(x_ptr + i)
    plain = dsl.exp2(v)
    acc = dsl.zeros((BLOCK,), dsl.float32)
    carried = dsl.exp2(v, ftz=F)
    for t in range(n_iter):
        acc = acc + dsl.exp2(v, ftz=F)
        carried = dsl.exp2(carried - 127.0, ftz=F) + carried
    if dsl.sum(v, axis=0) < 0:
        acc = acc + dsl.exp(v * 0.5, ftz=F)
    dsl.store(o_ptr + i, acc)
    dsl.store(o_ptr + BLOCK + i, plain)
    dsl.store(o_ptr + 2 * BLOCK + i, carried)


@pytest.mark.parametrize("ftz", [False, True])
def test_loop_carried_exp2_and_cse(ftz):
    x = torch.tensor([-130.0, -125.0, -1.0, -127.0, -149.0, 0.0, -1e9, 3.0])
    out = poison(torch.empty(24))
    _carried[(1,)](out, x, 3, 8, ftz, interpret=True)
    f = _flushed if ftz else (lambda t: t)
    xd = x.double()
    e = f(torch.exp2(xd))
    carried = e.clone()
    for _ in range(3):
        carried = f(torch.exp2(carried - 127.0)) + carried
    acc = 3 * e + f(torch.exp(xd * 0.5))
    got = out.view(3, 8)
    _assert_float32_close(got[0], acc)
    _assert_float32_close(got[1], torch.exp2(xd))
    _assert_float32_close(got[2], carried)
    ir = _carried.compile(_PTR32, _PTR32, 3, BLOCK=128, F=ftz, target="sm_80").asm["ir"]
    assert len(re.findall(r"= exp2 %\w+ : ", ir)) == (1 if ftz else 2)       # plain: outer and the carried one
    assert len(re.findall(r"= exp2 %\w+ \{ftz=True\}", ir)) == (2 if ftz else 0)
    assert len(re.findall(r"= exp %\w+ \{ftz=True\}", ir)) == int(ftz)


# -- IR text, the disk cache, PTX -------------------------------------------------------------------------------

@dsl.jit
def _modes(o_ptr, x_ptr, n, BLOCK: dsl.constexpr, MODE: dsl.constexpr):
    # MODE 0: no keyword; 1: ftz=False; 2: ftz=True; 3: sigmoid and the default exp only
    i = dsl.program_id(0) * BLOCK + dsl.arange(0, BLOCK)
    v = dsl.load(x_ptr + i, mask=i < n, other=0.0)
    if MODE == 0:
        r = dsl.exp2(v) * dsl.exp(v)
    elif MODE == 1:
        r = dsl.exp2(v, ftz=False) * dsl.exp(v, ftz=False)
    elif MODE == 2:
        r = dsl.exp2(v, ftz=True) * dsl.exp(v, ftz=True)
    else:
        r = dsl.sigmoid(v) + dsl.exp(-v)
    dsl.store(o_ptr + i, r, mask=i < n)


_DTYPES = ["float32", "float16", "bfloat16", "float64", "int32"]


@pytest.mark.parametrize("dtype", _DTYPES)
def test_ir_text_differs_only_by_the_attr(dtype):
    p = dsl.pointer_type(getattr(dsl, dtype))
    po = _PTR32 if dtype == "int32" else p
    irs = [_modes.compile(po, p, 1000, BLOCK=256, MODE=m, target="sm_80").asm["ir"] for m in range(3)]
    assert irs[0] == irs[1]
    if dtype == "float64":
        assert irs[2] == irs[0] and "ftz" not in irs[2]            # float64 ignores the flag: one cache entry
    else:
        assert irs[2] != irs[0] and irs[2].count("{ftz=True}") == 2
        assert irs[2].replace(" {ftz=True}", "") == irs[0]


def test_disk_cache_keeps_the_variants_apart(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("FUSEDOPS_DISABLE_CACHE", raising=False)
    monkeypatch.delenv("FUSEDOPS_DUMP_IR", raising=False)

    def ptx(mode):              # a fresh jit object each time: no in-memory cache, only the disk
        return dsl.jit(_modes.fn).compile(_PTR32, _PTR32, 1000, BLOCK=256, MODE=mode, target="sm_80").asm["ptx"]

    first_plain = ptx(0)
    assert "ftz" not in first_plain
    assert "ex2.approx.ftz.f32" in ptx(2)
    entries = sorted(tmp_path.rglob("*.json"))
    assert len(entries) == 2
    assert ptx(1) == first_plain and "ex2.approx.ftz.f32" in ptx(2)       # served from the disk, apart
    assert sorted(tmp_path.rglob("*.json")) == entries


@needs_ptxas
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("dtype", _DTYPES)
def test_ftz_only_swaps_the_instruction(dtype, arch):
    p = dsl.pointer_type(getattr(dsl, dtype))
    po = _PTR32 if dtype == "int32" else p
    default, explicit, flushed, sigmoid = (_modes.compile(po, p, 1000, BLOCK=256, MODE=m, target=arch).asm["ptx"]
                                           for m in range(4))
    assert default == explicit and "ftz" not in default and "ftz" not in sigmoid
    assert flushed == default.replace("ex2.approx.f32", "ex2.approx.ftz.f32")
    if dtype == "float64":
        assert "ex2" not in flushed
    else:
        assert flushed.count("ex2.approx.ftz.f32") == 4 and "ex2.approx.f32" not in flushed
        assemble(flushed, arch)


@dsl.jit
def _constant_args(o_ptr, F: dsl.constexpr):
    dsl.store(o_ptr, dsl.exp2(-130.0, ftz=F))
    dsl.store(o_ptr + 1 + dsl.arange(0, 4), dsl.exp2(dsl.full((4,), -140.0, dsl.float32), ftz=F))


@needs_ptxas
def test_constant_operands_are_not_folded_past_the_flush():
    # LLVM may fold ex2 of a constant; it must not fold the ftz form to the subnormal 2^-130 (0f00080000)
    for ftz in (False, True):
        text = _constant_args.compile(_PTR32, F=ftz, target="sm_80").asm["ptx"]
        assert "0f00080000" not in text and "0f00000800" not in text
        assert text.count("ex2.approx.ftz.f32" if ftz else "ex2.approx.f32") == 2
        assemble(text, "sm_80")


# -- attention: PTX with masks, and the interpreter against float64 where weights underflow --------------------

@needs_ptxas
@pytest.mark.parametrize("kernel", ["dkdv", "dq"])
def test_attention_backward_with_an_additive_mask_flushes_every_exp2(kernel):
    from test_attention import compile_backward
    ptx = compile_backward(kernel, 64, causal=True, mask_kind=ADDITIVE_MASK).asm["ptx"]
    assert "ex2.approx.ftz.f32" in ptx and "ex2.approx.f32" not in ptx
    assemble(ptx, "sm_90a")


def _reference(q, k, v, mask, causal, scale, grad_out):
    """float64 math attention (fully masked rows: 0) and its gradients."""
    from test_attention import reference
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    out = reference(q64, k64, v64, mask, causal=causal, scale=scale)
    return (out.detach(),) + torch.autograd.grad(out, (q64, k64, v64), grad_out.double())


def _run(q, k, v, mask, causal, scale, grad_out, config=None):
    b, h, length_q, _ = q.shape
    expanded = None if mask is None else mask.expand(b, h, length_q, k.shape[2])
    out, lse = at.attention_forward(q, k, v, expanded, causal, scale, interpret=True, config=config)
    grads = at.attention_backward(grad_out, q, k, v, out, lse, expanded, causal, scale, interpret=True,
                                  configs=None if config is None else (config, config))
    return (out,) + tuple(grads), lse


def _underflowing_mask(kind, length_q, length_k, seed):
    """bool: a random mask with every third row fully masked. additive: per row a mix of 0, -87..-120 (float32
    weights below 2^-126), -1e30, with every fourth row all -1e30 (uniform) and every fifth all -inf (dead)."""
    g = torch.Generator().manual_seed(seed)
    if kind == "bool":
        keep = torch.rand(length_q, length_k, generator=g) > 0.4
        keep[::3] = False
        return keep
    mask = torch.zeros(length_q, length_k)
    pick = torch.rand(length_q, length_k, generator=g)
    mask = torch.where(pick < 0.4, -87.0 - 33.0 * torch.rand(length_q, length_k, generator=g), mask)
    mask = torch.where(pick > 0.85, torch.full_like(mask, -1e30), mask)
    mask[::4] = -1e30
    mask[2::5] = -math.inf
    return mask


@pytest.mark.parametrize("length_q,length_k", [(1, 17), (17, 1), (17, 100), (100, 17)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kind", ["bool", "additive"])
def test_attention_with_underflowing_weights_matches_float64(length_q, length_k, causal, kind):
    seed = length_q * 1000 + length_k + 7 * causal
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 2, n, 16, generator=g) for n in (length_q, length_k, length_k))
    q = q * 3.0                                                    # logits up to ~+-40 beside the masks
    grad_out = torch.randn(1, 2, length_q, 16, generator=g)
    mask = _underflowing_mask(kind, length_q, length_k, seed)
    got, lse = _run(q, k, v, mask, causal, 0.25, grad_out)
    want = _reference(q, k, v, mask, causal, 0.25, grad_out)
    for ours, theirs in zip(got, want):
        assert torch.isfinite(ours).all()
        assert_close(ours, theirs, torch.float32)


def test_alpha_underflowing_between_key_blocks_matches_float64():
    # keys 0..15 (the interpreter's first 16-key block) 95 below the rest in natural units: the running
    # maximum jumps by 137 in base 2 at the second block, so alpha = 2^-137 is flushed to 0
    g = torch.Generator().manual_seed(34)
    q, k, v = (torch.randn(1, 1, n, 16, generator=g) for n in (20, 48, 48))
    grad_out = torch.randn(1, 1, 20, 16, generator=g)
    mask = torch.zeros(20, 48)
    mask[:, :16] = -95.0
    mask[3, 16:] = -1e30                                           # row 3: only the low block (uniform-ish)
    got, lse = _run(q, k, v, mask, False, 0.25, grad_out, config=INTERPRETER_CONFIG)
    want = _reference(q, k, v, mask, False, 0.25, grad_out)
    for ours, theirs in zip(got, want):
        assert torch.isfinite(ours).all()
        assert_close(ours, theirs, torch.float32)
    s = (q.double() @ k.double().transpose(-1, -2)) * 0.25 + mask.double()
    expected_lse = torch.logsumexp(s, -1) / math.log(2)
    assert_close(lse[:, :, 0] + lse[:, :, 1], expected_lse, torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("how", ["additive_mask", "logits"])
def test_a_key_with_only_subnormal_weights(dtype, how):
    """Key 3 is ~95 below the others for every query (an additive mask of -95, or without a mask a key
    pointing away from every query): each of its weights is ~e^-95 (about 2^-137, a float32 subnormal). In
    float32 (ftz) its dK and dV are exactly 0 (float64: ~1e-40, an absolute error far below the other keys'
    gradients); float64 inputs compute in float64 (ftz ignored) and keep them."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 1, n, 16, generator=g, dtype=dtype) for n in (9, 20, 20))
    grad_out = torch.randn(1, 1, 9, 16, generator=g, dtype=dtype)
    mask = None
    if how == "additive_mask":
        mask = torch.zeros(9, 20, dtype=dtype)
        mask[:, 3] = -95.0
    else:
        u = torch.zeros(16, dtype=dtype)
        u[0] = 1.0
        q = q * 0.1 + 10.0 * u                                    # every query ~10 u
        k[0, 0, 3] = -38.0 * u                                    # logit 0.25 * q . k3 ~ -95
    (out, dq, dk, dv), _ = _run(q, k, v, mask, False, 0.25, grad_out)
    want_out, want_dq, want_dk, want_dv = _reference(q, k, v, mask, False, 0.25, grad_out)
    assert 0 < want_dv[0, 0, 3].abs().max().item() < 1e-38 and 0 < want_dk[0, 0, 3].abs().max().item() < 1e-38
    for ours, theirs in zip((out, dq, dk, dv), (want_out, want_dq, want_dk, want_dv)):
        assert torch.isfinite(ours).all()
        assert_close(ours, theirs, dtype)
    if dtype == torch.float32:
        assert torch.all(dv[0, 0, 3] == 0) and torch.all(dk[0, 0, 3] == 0)
    else:
        torch.testing.assert_close(dv[0, 0, 3], want_dv[0, 0, 3], rtol=1e-9, atol=0)
        torch.testing.assert_close(dk[0, 0, 3], want_dk[0, 0, 3], rtol=1e-7, atol=0)
