"""Session-39 review of the DSL's frontend and language as a Triton user writing their own kernels sees them: control
flow, loops, scoping, constexprs, tuples, calls of other @dsl.jit functions, error messages, and the builtins'
semantics (reductions, casts, bool blocks, integer ranges near the type limits). Each case runs in the interpreter
against a Python / NumPy / torch float64 reference, and where the host can run it (no 16-bit floats, no libdevice)
compiled for sm_90a and run on the host (tests/host_jit.py through test_review_session35_dsl._run_compiled), bit for
bit against the interpreter; PTX is assembled by ptxas where it is on the PATH.

What was tried (peer report -> case), right unless listed under DEFECTS:
- triton #9547 (an int argument specialized to 1 reassigned in a loop: "loop carried variable changed type"), #8615
  (`a: tl.constexpr = ...` inside `tl.static_range`), #9122 (a value defined in a `range(1)` loop used after it: a
  clear error here), #10257 (a constexpr `if` with `return`, then another `return`) -> right.
- triton #713 / #2567 / #1238 style loops: rebinding the loop variable in the body (Python: no effect on the
  iteration), `range` over int8 / uint8 / int16 / int32 / int64 / uint32 bounds whose last step passes the type's
  limit (`range(100, 127, 2)` in int8, `range(-2**63, 2**63 - 1, 2**62)`), negative steps, empty ranges, a while loop
  carrying a swapped tuple, Fibonacci by tuple assignment, a while whose condition is a block reduction, helpers with
  early returns (scalar and tuple results, called in loops), a kernel with nested early returns: interpreted and
  compiled, against Python.
- bool blocks (pytorch / triton #756, #544, #2151): loads of torch.bool, `~`, `^`, `+`, `- 1`, sum / cumsum / max /
  min / argmax / argmin of int1, stores of comparisons, floats (x != 0, NaN true) and ints into bool tensors (0 / 1,
  never 255): interpreted and compiled.
- argmax / argmin / max / sum with `axis=None` on 2-D blocks (flat index, as Triton), compiled too.
- errors a Triton user meets (constexpr `//` by zero, a tuple indexed by a runtime value, helper returns of two
  types, runtime shapes, `x[2]`, `**`, a block as an `if` condition): CompilationErrors at the right line; and each
  Triton name the language lacks (fdiv, div_rn, sqrt_rn, cumprod, sort, histogram, join,
  split, permute, PropagateNan) names what to write instead.
- the session-37 random scalar control-flow generator run on 2,976 more seeds (interpreted; 200 also compiled):
  it found DEFECT 1; the other failures were the generator's own (a helper returning an int or a float by path,
  which Triton refuses too; float32 vs Python float64 after repeated halvings).

DEFECTS found (fixed in fusedops/dsl/frontend/loops.py and fusedops/dsl/language/; README "Coming from Triton"):
1. A loop whose body assigns a variable the number it starts as (`v = 0` before the loop and `v = 0`, or
   `v = max(min(w, 1000.0), -1000.0)` with `w` the literal 0, in the body: in a nested loop, or under an `if`) turned
   that literal into a loop-carried int32 value, so a later `if` that assigns `v` a float32 in one branch was refused
   ("`v` has type float32 in the `if` branch and int32 in the `else` branch"), where the literal alone adopts the
   other branch's type (the documented rule) and Python runs it. loops.py now leaves such a variable uncarried (it
   stays the number after the loop, as it is before it): `_keeps_number` sees the number through inner `if`s and
   loops, and a variable so kept whose body turns out to change it (a number of another type: `0` assigned to a
   `0.0`) is carried after all on the next attempt.
2. Triton's keyword arguments of the reductions were refused with "unexpected keyword argument", though the README
   says a Triton kernel ports line by line except for the differences it lists: `tl.sum(x, axis, dtype=...)`,
   `tl.cumsum(x, axis, dtype=...)`, `tl.max(x, axis, return_indices=True)` (the (values, indices) pair, used by
   argmax-style kernels) and `return_indices_tie_break_left=`, `tl.argmax(x, axis, tie_break_left=...)`; and
   `tl.load(flag, volatile=True)`, the way Triton spin-waits on a flag (a plain load in such a loop is read once
   before it: the PTX branches to itself for ever). block_builtins / block_ops take them (dtype: the input converted
   first, the result of that dtype; ties give the first index, which tie_break_left=False allows too); load's
   volatile=True is the `.cv` cache operator. The README lists them, and that `keep_dims` is the third positional
   argument of max / min / argmax / argmin here (Triton's third is return_indices / tie_break_left), and that there
   is no `propagate_nan=`; `dsl.PropagateNan` now says so.
"""

from __future__ import annotations

import random
import re

import numpy as np
import pytest
import torch

import fusedops.dsl as dsl
from fusedops.dsl import CompilationError
from fusedops.dsl.target import assemble, ptxas_available
from kernel_source import jit_from_source
from python_dsl import PythonDsl, PythonPointer
from test_review_session35_dsl import _run_compiled, _same_bits

NAN = float("nan")


@pytest.fixture(autouse=True)
def _own_cache(monkeypatch, tmp_path_factory):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "s39_dsl_cache"))


def _both(kernel, args, out_index=0, **constexprs):
    """Run `kernel` interpreted and compiled on the host on copies of `args` (the output at `out_index` poisoned
    first); -> (interpreted output, compiled output)."""
    results = []
    for run in ("interpret", "compiled"):
        copies = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        if run == "interpret":
            kernel[(1,)](*copies, interpret=True, **constexprs)
        else:
            _run_compiled(kernel, tuple(copies), num_warps=1, **constexprs)
        results.append(copies[out_index])
    return results


# == DEFECT 1: a loop that assigns a variable the number it starts as ===========================================
@dsl.jit
def _same_literal_kernel(o_ptr, x, n, CASE: dsl.constexpr):
    v = 0
    if CASE == "for":
        for i in range(n):
            v = 0
        if x > 0:
            v = x           # float32 here, the literal 0 otherwise: float32 after the `if`
    elif CASE == "while":
        while n > 5:
            v = 0
            n -= 1
        v = v if x > 0 else x
    elif CASE == "nested":
        for i in range(n):
            for j in range(2):
                v = max(min(0, 1000.0), -1000.0)      # Python's max / min of constants: the int 0
        if x > 0:
            v = x
    elif CASE == "if_in_loop":
        for i in range(n):
            if i > 1:
                v = 0
        if x > 0:
            v = x
    elif CASE == "changes":         # assigns 1: a carried int32, which a float32 branch cannot then be
        for i in range(n):
            v = 1
        v = v * 1.0
    dsl.store(o_ptr, v * 1.0)


def _same_literal_python(case, x, n):
    v = 0
    if case in ("for", "nested", "if_in_loop"):
        if x > 0:
            v = x
    elif case == "while":
        v = v if x > 0 else x
    elif case == "changes":
        v = 1.0 if n > 0 else 0.0
    return float(v)


@pytest.mark.parametrize("case", ["for", "while", "nested", "if_in_loop", "changes"])
def test_defect_a_loop_assigning_the_starting_number_keeps_it_a_literal(case):
    for x, n in ((1.5, 3), (-2.5, 7), (1.5, 0)):
        interpreted, compiled = _both(_same_literal_kernel, (torch.full((1,), NAN), x, n), CASE=case)
        assert interpreted.item() == _same_literal_python(case, x, n), (case, x, n)
        assert _same_bits(interpreted, compiled), (case, x, n, compiled)


@dsl.jit
def _kept_literal_changes_type_kernel(o_ptr, n):
    v = 0.0
    w = 0
    for i in range(n):
        for j in range(2):
            v = max(min(w, 1000.0), -1000.0)    # the int 0 into a float 0.0 carry: a change of type, carried
        v = v + 0.25
    dsl.store(o_ptr, v)


def test_defect_fix_carries_a_number_of_another_type():
    for n in (0, 3):
        out = torch.full((1,), NAN)
        _kept_literal_changes_type_kernel[(1,)](out, n, interpret=True)
        assert out.item() == (0.25 if n else 0.0)


@pytest.mark.parametrize("seed", [454, 1965, 2126])
def test_defect_random_control_flow_seeds_that_found_it(seed):
    """The session-37 generator's kernels that hit DEFECT 1 (454, 1965) and the fix's first version (2126)."""
    import test_review_session37_dsl as s37
    outputs = 5
    source = s37._Generator(random.Random(seed)).kernel(outputs)
    clampf, pick = (jit_from_source(s37._HELPERS, f"<s39 helpers {seed}>", name) for name in ("clampf", "pick"))
    kernel = jit_from_source(source, f"<s39 random control flow {seed}>", namespace={"clampf": clampf, "pick": pick})
    python = {"dsl": PythonDsl}
    exec(s37._HELPERS + source, python)
    rng = random.Random(seed + 1000)
    for _ in range(3):
        a, b, x, c = rng.randint(-3, 4), rng.randint(-2, 4), rng.randint(-8, 8) * 0.25, rng.randint(-1, 3)
        table = [rng.randint(-8, 8) * 0.25 for _ in range(6)]
        stored = {}
        python["k"](PythonPointer(stored), PythonPointer(table), a, b, x, c)
        out = torch.full((outputs,), NAN)
        kernel[(1,)](out, torch.tensor(table), a, b, x, C=c, interpret=True)
        assert out.tolist() == [stored.get(i, NAN) for i in range(outputs)], (source, (a, b, x, c))


# == DEFECT 2: Triton's keyword arguments of the reductions and of load ===========================================
@dsl.jit
def _reduction_keywords_kernel(o_ptr, i_ptr, x_ptr, CASE: dsl.constexpr, M: dsl.constexpr, N: dsl.constexpr):
    rows = dsl.arange(0, M)
    cols = dsl.arange(0, N)
    x = dsl.load(x_ptr + rows[:, None] * N + cols[None, :])
    if CASE == "max_indices":
        v, i = dsl.max(x, axis=1, return_indices=True)
    elif CASE == "min_indices":
        v, i = dsl.min(x, 1, return_indices=True, return_indices_tie_break_left=False)
    elif CASE == "max_indices_keep_dims":
        v, i = x.max(1, keep_dims=True, return_indices=True)
        v, i = dsl.reshape(v, M), dsl.reshape(i, M)
    elif CASE == "argmax_tie_break":
        v, i = dsl.max(x, 1), dsl.argmax(x, 1, tie_break_left=True)
    else:
        v, i = dsl.min(x, 1), x.argmin(1, tie_break_left=False)
    dsl.store(o_ptr + rows, v)
    dsl.store(i_ptr + rows, i)


@pytest.mark.parametrize("case", ["max_indices", "min_indices", "max_indices_keep_dims", "argmax_tie_break",
                                  "argmin_tie_break"])
def test_defect_max_min_return_indices_and_tie_break(case):
    M, N = 4, 8
    x = torch.randint(-3, 3, (M, N)).float()             # ties
    x[1, 5] = NAN                                           # NaN wins, first index (torch's rule)
    x[2, 0], x[2, 7] = 9.0, 9.0
    values = torch.full((M,), NAN)
    indices = torch.full((M,), -1, dtype=torch.int32)
    _reduction_keywords_kernel[(1,)](values, indices, x, CASE=case, M=M, N=N, interpret=True)
    maximum = "max" in case
    expected_values = x.amax(1) if maximum else x.amin(1)
    first = [int(np.flatnonzero(np.isnan(r) if np.isnan(e) else r == e)[0])
             for r, e in zip(x.numpy(), expected_values.numpy())]
    assert torch.equal(values, expected_values, ) or _same_bits(values, expected_values)
    assert indices.tolist() == first
    compiled_values = torch.full((M,), NAN)
    compiled_indices = torch.full((M,), -1, dtype=torch.int32)
    _run_compiled(_reduction_keywords_kernel, (compiled_values, compiled_indices, x), num_warps=1, CASE=case, M=M, N=N)
    assert _same_bits(compiled_values, values) and torch.equal(compiled_indices, indices)


@dsl.jit
def _sum_dtype_kernel(o_ptr, x_ptr, CASE: dsl.constexpr, B: dsl.constexpr):
    offs = dsl.arange(0, B)
    x = dsl.load(x_ptr + offs)
    if CASE == "sum_int8":
        r = dsl.sum(x, axis=0, dtype=dsl.int8) + offs * 0          # wraps as an int8 sum
    elif CASE == "sum_int64":
        r = x.sum(0, dtype=dsl.int64) + offs * 0
    elif CASE == "cumsum_int8":
        r = dsl.cumsum(x, 0, dtype=dsl.int8)
    elif CASE == "cumsum_reverse_int64":
        r = dsl.cumsum(x, axis=0, reverse=True, dtype=dsl.int64)
    else:
        r = dsl.sum(x.to(dsl.float32), dtype=dsl.float64) + offs * 0
    dsl.store(o_ptr + offs, r)


@pytest.mark.parametrize("case", ["sum_int8", "sum_int64", "cumsum_int8", "cumsum_reverse_int64", "sum_float64"])
def test_defect_sum_and_cumsum_take_a_dtype(case):
    B = 16
    x = torch.randint(2**30, 2**31 - 1, (B,), dtype=torch.int32)     # int32 sums would wrap
    out = torch.full((B,), -7, dtype=torch.int64)
    _reduction_keywords = _sum_dtype_kernel
    interpreted, compiled = _both(_reduction_keywords, (out, x), CASE=case, B=B)
    wide = x.long()
    if case == "sum_int8":
        expected = wide.to(torch.int8).sum().to(torch.int8).expand(B)
    elif case == "sum_int64":
        expected = wide.sum().expand(B)
    elif case == "cumsum_int8":
        expected = wide.to(torch.int8).cumsum(0).to(torch.int8)
    elif case == "cumsum_reverse_int64":
        expected = wide.flip(0).cumsum(0).flip(0)
    else:
        expected = wide.to(torch.float32).double().sum().long().expand(B)
    assert interpreted.tolist() == expected.long().tolist()
    assert torch.equal(compiled, interpreted)


def test_defect_reduction_keywords_check_their_values():
    source = "def k(o_ptr):\n    x = dsl.arange(0, 8)\n    r = {}\n    dsl.store(o_ptr + x, r)\n"
    for expression, message in [("dsl.sum(x, dtype=dsl.int1)", "dtype must be a dsl number dtype"),
                                ("dsl.cumsum(x, dtype='int64')", "dtype must be a dsl number dtype"),
                                ("dsl.argmax(x, 0, tie_break_left=1)", "tie_break_left must be a constexpr bool"),
                                ("dsl.max(x, 0, return_indices=x > 0)[0]", "return_indices must be a constexpr bool"),
                                ("dsl.maximum(x, x, propagate_nan=True)", "propagate_nan"),
                                ("dsl.load(o_ptr, volatile=True, cache_modifier='.cg')", "volatile=True")]:
        kernel = jit_from_source(source.format(expression), f"<s39 keyword {expression}>")
        with pytest.raises(CompilationError, match=re.escape(message)):
            kernel[(1,)](torch.zeros(8, dtype=torch.int64), interpret=True)


@dsl.jit
def _spin_kernel(flag_ptr, o_ptr, VOLATILE: dsl.constexpr):
    while dsl.load(flag_ptr, volatile=VOLATILE) == 0:
        pass
    dsl.store(o_ptr, dsl.load(flag_ptr, volatile=VOLATILE) + 1)


def test_defect_volatile_load_is_read_every_iteration():
    flag, out = torch.ones(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
    _spin_kernel[(1,)](flag, out, VOLATILE=True, interpret=True)
    assert out.item() == 2
    plain = _spin_kernel.compile(flag, out, target="sm_90a", VOLATILE=False).asm["ptx"]
    volatile = _spin_kernel.compile(flag, out, target="sm_90a", VOLATILE=True).asm["ptx"]
    # the plain load is hoisted out of the loop, which then spins on nothing (as Triton's without volatile=True)
    assert re.search(r"(\$L__BB0_\d+):\s*\n\s*bra\.uni\s+\1;", plain), plain
    loop = volatile[volatile.index("$L__BB0_1:"):]
    assert "ld.global.cv.b32" in loop.split("@%p2 bra")[0], volatile
    if ptxas_available():
        assemble(volatile, "sm_90a")


def test_defect_triton_only_names_say_what_to_write():
    source = "def k(o_ptr):\n    x = dsl.{}\n"
    # (fdiv, div_rn, sqrt_rn, cumprod, join, split and permute: in the language since session 41)
    for name, hint in [("PropagateNan", "always propagate NaN"),      # (associative_scan: in the language)
                       ("map_elementwise", "not in the language"), ("softmax", "write it out"), ("dot_scaled", "fp8 and scaled dots"),
                       ("pow", "use dsl.math.pow or dsl.extra.cuda.libdevice.pow")]:      # (`**` works since session 43)
        kernel = jit_from_source(source.format(name), f"<s39 name {name}>")
        with pytest.raises(CompilationError, match=re.escape(hint)):
            kernel[(1,)](torch.zeros(1), interpret=True)


# == right: loops near the integer limits, loop variables, peer repros ==========================================
@dsl.jit
def _range_kernel(o_ptr, p_ptr):
    s = 0
    t = 0
    for i in range(dsl.load(p_ptr), dsl.load(p_ptr + 1), dsl.load(p_ptr + 2)):
        s += 1
        t += i.to(dsl.int64)
    dsl.store(o_ptr, s)
    dsl.store(o_ptr + 1, t)


@pytest.mark.parametrize("dtype, bounds", [
    (torch.int8, (100, 127, 2)), (torch.int8, (-100, -128, -3)), (torch.int8, (-128, 127, 127)),
    (torch.uint8, (250, 255, 3)), (torch.int16, (-32768, 32767, 30000)), (torch.int32, (2**31 - 4, 2**31 - 1, 2)),
    (torch.int64, (-2**63, 2**63 - 1, 2**62)), (torch.int64, (2**63 - 1, -2**63, -2**62)),
    (torch.int32, (0, 10, -1))])
def test_range_whose_last_step_passes_the_type_limit(dtype, bounds):
    r = range(*bounds)
    total = (sum(r) + 2**63) % 2**64 - 2**63           # int64 wraps
    interpreted, compiled = _both(_range_kernel, (torch.full((2,), -1, dtype=torch.int64),
                                                  torch.tensor(bounds, dtype=dtype)))
    assert interpreted.tolist() == [len(r), total]
    assert torch.equal(compiled, interpreted)


@dsl.jit
def _loop_semantics_kernel(o_ptr, n, CASE: dsl.constexpr):
    s = 0
    if CASE == "rebind":
        for i in range(n):
            i = i + 10              # Python: the next iteration's i is range's, not this one
            s += i
    elif CASE == "fibonacci":
        a = 0
        b = 1
        for i in range(n):
            a, b = b, a + b
        s = a
    elif CASE == "countdown":
        for i in range(n, -1, -3):
            s += i
    elif CASE == "while_tuple":
        t = (1, 2, 3)
        while t[0] < n:
            t = (t[1], t[2], t[0] + t[1] + t[2])
        s = t[0] * 1000 + t[2]
    dsl.store(o_ptr, s)


def _loop_semantics_python(case, n):
    if case == "rebind":
        return sum(i + 10 for i in range(n))
    if case == "fibonacci":
        a, b = 0, 1
        for _ in range(n):
            a, b = b, a + b
        return a
    if case == "countdown":
        return sum(range(n, -1, -3))
    t = (1, 2, 3)
    while t[0] < n:
        t = (t[1], t[2], t[0] + t[1] + t[2])
    return t[0] * 1000 + t[2]


@pytest.mark.parametrize("case", ["rebind", "fibonacci", "countdown", "while_tuple"])
def test_loop_semantics_follow_python(case):
    for n in (0, 1, 7, 20):
        interpreted, compiled = _both(_loop_semantics_kernel, (torch.full((1,), -1, dtype=torch.int64), n), CASE=case)
        assert interpreted.item() == _loop_semantics_python(case, n), (case, n)
        assert torch.equal(compiled, interpreted)


@dsl.jit
def _triton_9547_kernel(a_ptr, a0, b_ptr, b0, out, o0):
    for i in range(0, 8, 2):
        dsl.store(out + i * o0, dsl.load(a_ptr + i * a0))
        a_ptr = b_ptr
        a0 = b0                     # a0 == 1 is specialized to the constant 1; b0 need not be


@dsl.jit
def _triton_8615_kernel(o_ptr):
    for i in dsl.static_range(0, 2):
        a: dsl.constexpr = 2 + i
        dsl.store(o_ptr + i, a)


@dsl.jit
def _triton_10257_helper(x, KIND: dsl.constexpr):
    if KIND == "double":
        return x * 2
    return x + 1


@dsl.jit
def _triton_10257_kernel(o_ptr, x):
    dsl.store(o_ptr, _triton_10257_helper(x, "double"))
    dsl.store(o_ptr + 1, _triton_10257_helper(x, "inc"))


def test_triton_issue_repros():
    a = torch.arange(8, dtype=torch.int32)
    b = torch.arange(16, dtype=torch.int32) + 10
    for b0 in (1, 2):
        out = torch.full((8,), -1, dtype=torch.int32)
        _triton_9547_kernel[(1,)](a, 1, b, b0, out, 1, interpret=True)
        assert out.tolist() == [0, -1] + [v for i in (2, 4, 6) for v in (10 + i * b0, -1)]
    out = torch.zeros(2, dtype=torch.int32)
    _triton_8615_kernel[(1,)](out, interpret=True)
    assert out.tolist() == [2, 3]
    interpreted, compiled = _both(_triton_10257_kernel, (torch.zeros(2, dtype=torch.int32), 5))
    assert interpreted.tolist() == [10, 6] and torch.equal(compiled, interpreted)


# == right: helpers with early returns, nested kernel returns ====================================================
@dsl.jit
def _sign(n):
    if n < 0:
        return -1
    if n == 0:
        return 0
    return 1


@dsl.jit
def _ordered(n):
    if n > 0:
        return n, n + 1
    return n - 1, n


@dsl.jit
def _returns_kernel(o_ptr, n):
    s = 0
    for i in range(n + 3):
        s += _sign(i - 2)
    a, b = _ordered(n)
    dsl.store(o_ptr + 1, a * 10 + b)
    dsl.store(o_ptr + 2, s)
    if n > 0:
        if n > 5:
            dsl.store(o_ptr, 100)
            return
        dsl.store(o_ptr, 50)
    dsl.store(o_ptr + 3, 7)


def test_helper_and_kernel_early_returns():
    for n in (-3, 0, 1, 6):
        interpreted, compiled = _both(_returns_kernel, (torch.full((4,), -9, dtype=torch.int32), n))
        a, b = (n, n + 1) if n > 0 else (n - 1, n)
        first = 100 if n > 5 else 50 if n > 0 else -9
        signs = sum((i - 2 > 0) - (i - 2 < 0) for i in range(n + 3))
        assert interpreted.tolist() == [first, a * 10 + b, signs, -9 if n > 5 else 7], n
        assert torch.equal(compiled, interpreted)


# == right: bool blocks ==========================================================================================
@dsl.jit
def _bool_kernel(o_ptr, ob_ptr, b_ptr, x_ptr, B: dsl.constexpr):
    offs = dsl.arange(0, B)
    b = dsl.load(b_ptr + offs)
    x = dsl.load(x_ptr + offs)
    dsl.store(o_ptr + offs, b.to(dsl.int32) * 10 + (~b).to(dsl.int32))
    dsl.store(o_ptr + B + offs, dsl.sum(b, 0) + offs * 0)
    dsl.store(o_ptr + 2 * B + offs, dsl.cumsum(b, 0))
    dsl.store(o_ptr + 3 * B + offs, (b ^ (x > 0)).to(dsl.int32))
    dsl.store(o_ptr + 4 * B + offs, dsl.max(b, 0).to(dsl.int32) + dsl.min(b, 0).to(dsl.int32) * 10 + offs * 0)
    dsl.store(o_ptr + 5 * B + offs, dsl.argmax(b, 0) + 10 * dsl.argmin(b, 0) + offs * 0)
    dsl.store(o_ptr + 6 * B + offs, b + b)
    dsl.store(o_ptr + 7 * B + offs, b - 1)
    dsl.store(ob_ptr + offs, x > 0)
    dsl.store(ob_ptr + B + offs, x)
    dsl.store(ob_ptr + 2 * B + offs, b * 3)


def test_bool_blocks_follow_torch():
    B = 8
    b = torch.tensor([0, 1, 1, 0, 1, 0, 0, 1], dtype=torch.bool)
    x = torch.tensor([0.5, -1.0, 0.0, -0.0, NAN, 0.25, -3.0, 1e-45])
    ints = torch.full((8 * B,), -99, dtype=torch.int32)
    bools = torch.full((3 * B,), 7, dtype=torch.uint8).view(torch.bool)
    _bool_kernel[(1,)](ints, bools, b, x, B=B, interpret=True)
    i = b.int()
    expected = torch.cat([i * 10 + (~b).int(), i.sum().expand(B), i.cumsum(0), (b ^ (x > 0)).int(),
                          (i.max() + 10 * i.min()).expand(B), (i.argmax() + 10 * i.argmin()).expand(B), 2 * i, i - 1])
    assert ints.tolist() == expected.tolist()
    assert bools.view(torch.uint8).tolist() == torch.cat([(x > 0), (x != 0), b]).to(torch.uint8).tolist()
    compiled_ints = torch.full((8 * B,), -99, dtype=torch.int32)
    compiled_bools = torch.full((3 * B,), 7, dtype=torch.uint8).view(torch.bool)
    _run_compiled(_bool_kernel, (compiled_ints, compiled_bools, b, x), num_warps=1, B=B)
    assert torch.equal(compiled_ints, ints)
    assert torch.equal(compiled_bools.view(torch.uint8), bools.view(torch.uint8))


# == right: whole-block reductions and block control flow ========================================================
@dsl.jit
def _flat_kernel(o_ptr, x_ptr):
    r = dsl.arange(0, 4)
    c = dsl.arange(0, 8)
    x = dsl.load(x_ptr + r[:, None] * 8 + c[None, :])
    dsl.store(o_ptr, dsl.argmax(x, axis=None))
    dsl.store(o_ptr + 1, dsl.argmin(x, axis=None))
    dsl.store(o_ptr + 2, dsl.max(x, axis=None))
    dsl.store(o_ptr + 3, dsl.sum(x))
    dsl.store(o_ptr + 4, dsl.sum(dsl.argmax(x, axis=None, keep_dims=True), axis=None))


def test_whole_block_reductions_give_flat_indices():
    x = torch.randint(-5, 5, (4, 8), dtype=torch.int32)
    x[2, 3], x[3, 6], x[1, 1] = 100, 100, -100
    interpreted, compiled = _both(_flat_kernel, (torch.full((5,), -1, dtype=torch.int32), x))
    assert interpreted.tolist() == [19, 9, 100, int(x.sum()), 19]
    assert torch.equal(compiled, interpreted)


@dsl.jit
def _halve_until(x, limit):
    while dsl.max(dsl.abs(x), 0) > limit:
        x = x * 0.5
    return x


@dsl.jit
def _centered(x, n):
    if n <= 0:
        return dsl.zeros(x.shape, x.dtype), 0.0
    m = dsl.sum(x, 0) / n
    return x - m, m


@dsl.jit
def _block_flow_kernel(o_ptr, x_ptr, n, B: dsl.constexpr):
    offs = dsl.arange(0, B)
    x = dsl.load(x_ptr + offs, mask=offs < n, other=0.0)
    dsl.store(o_ptr + offs, _halve_until(x, 1.0))
    c, m = _centered(x, n)
    dsl.store(o_ptr + B + offs, c)
    dsl.store(o_ptr + 2 * B, m)
    acc = 0
    best = dsl.full((B,), float("-inf"), dsl.float32)
    i = 0
    while i < n:
        v = dsl.load(x_ptr + i)
        if v > 0:
            acc = acc + offs * v        # a literal carry that becomes a float32 block in an `if`
        best = dsl.maximum(best, v + offs)
        i += 1
    dsl.store(o_ptr + 3 * B + offs, acc + best)


def test_block_control_flow_in_helpers_and_loops():
    B = 8
    for n in (0, 3, 8):
        x = torch.randn(B) * 5
        interpreted, compiled = _both(_block_flow_kernel, (torch.full((4 * B,), NAN), x, n), B=B)
        xm = torch.where(torch.arange(B) < n, x, 0.0).double()
        halved = xm.clone()
        while halved.abs().max() > 1.0:
            halved = halved * 0.5
        m = xm.sum() / n if n > 0 else torch.tensor(0.0, dtype=torch.float64)
        centered = xm - m if n > 0 else torch.zeros(B, dtype=torch.float64)
        acc, best = torch.zeros(B, dtype=torch.float64), torch.full((B,), -torch.inf, dtype=torch.float64)
        for i in range(n):
            if x[i] > 0:
                acc = acc + torch.arange(B) * x[i].double()
            best = torch.maximum(best, x[i].double() + torch.arange(B))
        expected = torch.cat([halved, centered, m.reshape(1), torch.full((B - 1,), NAN, dtype=torch.float64),
                              acc + best])
        got = interpreted.double()
        assert torch.allclose(got, expected, rtol=1e-5, atol=1e-5, equal_nan=True), (n, got, expected)
        assert torch.allclose(compiled, interpreted, rtol=1e-6, atol=1e-6, equal_nan=True)


# == right: errors a Triton user meets ===========================================================================
@pytest.mark.parametrize("body, message, line", [
    ("    y = X // 0\n    dsl.store(o_ptr, y)", "compile-time `floordiv` of 4, 0 failed", 2),
    ("    t = (1, 2)\n    dsl.store(o_ptr, t[n])", "cannot be indexed with a runtime value", 3),
    ("    y = dsl.zeros((n,), dsl.float32)", "shape must be known at compile time", 2),
    ("    x = dsl.arange(0, X)\n    dsl.store(o_ptr + x, x[2])", "indexed with None (new axis) and `:`", 3),
    ("    dsl.store(o_ptr, n ** n)", "`**` of an integer base needs a compile-time int exponent", 2),  # (session 43)
    ("    x = dsl.arange(0, X)\n    if x > 0:\n        dsl.store(o_ptr, 1)", "use dsl.where", 3),
    ("    for i in range(2):\n        y = i\n    dsl.store(o_ptr, y)", "first assigned inside the loop at line 2", 4),
    ("    y = n if n > 0 else 0.5\n    if n > 1:\n        y = n\n    dsl.store(o_ptr, y)",
     "`y` has type int32 in the `if` branch and float32 before the `if`", 3),
    ("    y = n if n > 0 else 0.5\n    if n > 1:\n        y = 2\n    dsl.store(o_ptr, y)", "", 0),
])
def test_errors_name_the_construct_and_its_line(body, message, line):
    source = f"def k(o_ptr, n, X: dsl.constexpr):\n{body}\n"
    kernel = jit_from_source(source, f"<s39 error {hash(body)}>")
    out = torch.zeros(4)
    if not message:             # right: the literal 0.5 arm makes y float32, and the literal 2 adopts it
        kernel[(1,)](out, 3, X=4, interpret=True)
        assert out[0].item() == 2.0
        return
    with pytest.raises(CompilationError, match=re.escape(message)) as raised:
        kernel[(1,)](out, 3, X=4, interpret=True)
    assert f":{line}:" in str(raised.value).splitlines()[0], str(raised.value)


@dsl.jit
def _bool_op_kernel(o_ptr, n, x):
    dsl.store(o_ptr, n or 7)
    dsl.store(o_ptr + 1, n and 7)
    dsl.store(o_ptr + 2, x or 2.5)
    dsl.store(o_ptr + 3, dsl.where(n != 0, n, 7))


def test_and_or_of_runtime_values_are_bools_as_documented():
    """README: `a or b` of runtime values is a bool (Triton's logical_or), not Python's operand."""
    for n, x in ((3, 0.0), (0, 1.5)):
        interpreted, compiled = _both(_bool_op_kernel, (torch.full((4,), NAN), n, x))
        assert interpreted.tolist() == [float(bool(n or 7)), float(bool(n and 7)), float(bool(x or 2.5)),
                                        float(n if n != 0 else 7)]
        assert torch.equal(compiled, interpreted)
