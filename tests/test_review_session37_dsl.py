"""Session-37 review of the DSL: cases an experienced Triton user writes, drawn from triton-lang/triton bug reports
and the Triton tutorials, run through the interpreter against Python / torch semantics (as fusedops documents
them), through the compiled sm_90a LLVM IR on the host (tests/host_jit.py) against the interpreter, and to PTX
that ptxas accepts.

Defects found and fixed (frontend/control_flow.py, frontend/loops.py, frontend/carried_types.py, frontend/generator.py):
- a loop-carried variable whose literal initial value should adopt the type the loop body gives it (`acc = 0`,
  `for ...: acc = x_f32` works) was refused when the body assigned it inside an `if` (`for ...: if c: acc = x_f32`,
  `if c: acc = acc + 0.5`, `if c: acc = acc * 2 else: acc = 0.25`), and a literal the body assigns (`s = 1`, then
  `s = 0.5` in the loop) did not promote with the initial literal as two literals do; an `if` in the body of an
  int carry `x` doing `x = x + 1.5` was refused though the same statement outside the `if` converts back as C does.
  Found by a random scalar control-flow kernel generator (kept below) that runs each kernel as plain Python too.
- an expression of a few hundred nested operations (`x + x + ...`, as generated code writes) or an `elif` chain of
  a few hundred branches (triton #5864) raised Python's RecursionError with a traceback into the frontend; it is
  now a CompilationError located at the statement, which says to split it.

Triton reports the other cases come from: #619 and #954 (`//` truncation, cdiv of negatives), #4676 (x // 0 and
x % 0 in one kernel), #532 / #633 / #1880 (where / store broadcasting, a scalar-condition select of a block),
#3214 / #7957 (broadcast blocks stored and reloaded), #10298 / #1813 (argmax / argmin NaN and ties), #605 (int `/`),
#11153 (interpreter and compiled code disagree), tutorial 05's lock (`while atomic_cas(...) == 1: pass`).
"""

from __future__ import annotations

import math
import random

import pytest
import torch

import fusedops.dsl as dsl
from fusedops.dsl import CompilationError
from fusedops.dsl.target import assemble, ptxas_available
from host_jit import run_on_host
from kernel_source import jit_from_source
from python_dsl import PythonDsl, PythonPointer
from test_review_session35_dsl import _run_compiled, _same_bits

NAN = float("nan")
needs_ptxas = pytest.mark.skipif(not ptxas_available(), reason="ptxas is not on the PATH")


@pytest.fixture(autouse=True)
def _own_cache(monkeypatch, tmp_path_factory):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "s37_cache"))


def _ptx_assembles(kernel, *args, **constexprs):
    ptx = kernel.compile(*args, target="sm_90a", **constexprs).asm["ptx"]
    if ptxas_available():
        assemble(ptx, "sm_90a")
    return ptx


# == defect: a literal-initialized loop carry assigned inside an `if` ============================================
@dsl.jit
def _carry_in_if_kernel(o_ptr, i_ptr, x, n, CASE: dsl.constexpr, B: dsl.constexpr):
    offs = dsl.arange(0, B)
    acc = 0
    if CASE == "if":
        for i in range(n):
            if i > 1:
                acc = x
    elif CASE == "if_else_keeps":
        for i in range(n):
            if i > 1:
                acc = x
            else:
                acc = acc
    elif CASE == "if_add_literal":
        for i in range(n):
            if i > 1:
                acc = acc + 0.5
    elif CASE == "while_if":
        i = 0
        while i < n:
            if i > 1:
                acc = x
            i += 1
    elif CASE == "nested_loops_if":
        for i in range(n):
            for j in range(2):
                if i > 1:
                    acc = acc + x
    elif CASE == "elif_chain":
        for i in range(n):
            if i == 1:
                acc = x
            elif i == 2:
                acc = acc * 2
    elif CASE == "derived_and_literal":
        acc = 1
        for i in range(n):
            if i > 1:
                acc = acc * 2
            else:
                acc = 0.25
    elif CASE == "literal_in_body":
        acc = 1
        for i in range(n):
            acc = 0.5
    elif CASE == "literal_in_if":
        acc = 1
        for i in range(n):
            if i > 1:
                acc = 2.75
    elif CASE == "int64_literal_in_if":
        acc = 1
        for i in range(n):
            if i > 1:
                acc = 2**40
    elif CASE == "convert_back":        # an int32 carry: x + 1.5 converts back (C's `v += 1.5`), in an `if` too
        acc = dsl.load(i_ptr)
        for i in range(n):
            if i > 0:
                acc = acc + 1.5
    elif CASE == "scalar_literal_to_block":
        for i in range(n):
            if i > 1:
                acc = offs.to(dsl.float32) * x
    if CASE == "scalar_literal_to_block":
        dsl.store(o_ptr + offs, acc * 1.0)
    else:
        dsl.store(o_ptr + offs, acc * 1.0 + offs * 0)


def _carry_in_if_python(x, n, case, start):
    acc = 0
    if case in ("if", "if_else_keeps", "while_if"):
        for i in range(n):
            if i > 1:
                acc = x
    elif case == "if_add_literal":
        for i in range(n):
            if i > 1:
                acc = acc + 0.5
    elif case == "nested_loops_if":
        for i in range(n):
            for _ in range(2):
                if i > 1:
                    acc = acc + x
    elif case == "elif_chain":
        for i in range(n):
            if i == 1:
                acc = x
            elif i == 2:
                acc = acc * 2
    elif case == "derived_and_literal":
        acc = 1
        for i in range(n):
            acc = acc * 2 if i > 1 else 0.25
    elif case == "literal_in_body":
        acc = 1
        for i in range(n):
            acc = 0.5
    elif case == "literal_in_if":
        acc = 1
        for i in range(n):
            if i > 1:
                acc = 2.75
    elif case == "int64_literal_in_if":
        acc = 1
        for i in range(n):
            if i > 1:
                acc = 2**40
    elif case == "convert_back":
        acc = start
        for i in range(n):
            if i > 0:
                acc = int(acc + 1.5)        # truncation toward zero, as the C conversion back
    return [float(acc)] * 4


_CARRY_CASES = ["if", "if_else_keeps", "if_add_literal", "while_if", "nested_loops_if", "elif_chain",
                "derived_and_literal", "literal_in_body", "literal_in_if", "int64_literal_in_if", "convert_back"]


@pytest.mark.parametrize("case", _CARRY_CASES)
@pytest.mark.parametrize("n", [0, 2, 5])
def test_defect_literal_carry_assigned_in_an_if_adopts_the_body_type(case, n):
    x = random.Random(n).choice([2.75, -1.25, 3.5])
    start = torch.tensor([7], dtype=torch.int32)
    out = torch.full((4,), NAN, dtype=torch.float64)
    _carry_in_if_kernel[(1,)](out, start, x, n, CASE=case, B=4, interpret=True)
    assert out.tolist() == _carry_in_if_python(x, n, case, 7)


def test_defect_literal_carry_to_block_in_an_if():
    out = torch.full((4,), NAN)
    _carry_in_if_kernel[(1,)](out, torch.zeros(1, dtype=torch.int32), 1.5, 4, CASE="scalar_literal_to_block", B=4,
                              interpret=True)
    assert out.tolist() == [0.0, 1.5, 3.0, 4.5]
    out.fill_(NAN)
    _carry_in_if_kernel[(1,)](out, torch.zeros(1, dtype=torch.int32), 1.5, 2, CASE="scalar_literal_to_block", B=4,
                              interpret=True)
    assert out.tolist() == [0.0] * 4


@pytest.mark.parametrize("case", ["if", "if_add_literal", "derived_and_literal", "literal_in_if", "convert_back"])
def test_defect_carry_in_an_if_compiled_matches_the_interpreter(case):
    start = torch.tensor([7], dtype=torch.int32)
    for n in (1, 4):
        expected = torch.full((4,), NAN, dtype=torch.float64)
        _carry_in_if_kernel[(1,)](expected, start, 2.75, n, CASE=case, B=4, interpret=True)
        out = torch.full((4,), NAN, dtype=torch.float64)
        _run_compiled(_carry_in_if_kernel, (out, start, 2.75, n), num_warps=1, CASE=case, B=4)
        assert _same_bits(out, expected), (case, n, out, expected)


@needs_ptxas
def test_defect_carry_in_an_if_assembles():
    args = (torch.zeros(4), torch.zeros(1, dtype=torch.int32), 1.5, 3)
    for case in ("if", "while_if", "nested_loops_if", "scalar_literal_to_block"):
        _ptx_assembles(_carry_in_if_kernel, *args, CASE=case, B=4)


@dsl.jit
def _carry_refused_kernel(o_ptr, i_ptr, x, n, CASE: dsl.constexpr):
    v = dsl.load(i_ptr)                 # an int32 carry that no literal started: its type must not change
    for i in range(n):
        if CASE == "load":
            if i > 0:
                v = x
        else:
            if i > 0:
                v = v + x               # x, not a literal, made it float32
    dsl.store(o_ptr, v * 1.0)


@pytest.mark.parametrize("case", ["load", "runtime_float"])
def test_a_carry_not_started_by_a_literal_still_keeps_its_type_in_an_if(case):
    with pytest.raises(CompilationError, match="`v` has type float32 in the `if` branch and int32"):
        _carry_refused_kernel[(1,)](torch.zeros(1), torch.ones(1, dtype=torch.int32), 2.5, 3, CASE=case,
                                    interpret=True)


def test_an_if_outside_loops_still_refuses_a_type_change():
    kernel = jit_from_source("def k(o_ptr, i_ptr, x):\n    v = dsl.load(i_ptr)\n    if x > 0:\n        v = x\n"
                             "    dsl.store(o_ptr, v * 1.0)\n", "<s37 if type change>")
    with pytest.raises(CompilationError, match="`v` has type float32 in the `if` branch and int32 before"):
        kernel[(1,)](torch.zeros(1), torch.ones(1, dtype=torch.int32), 2.5, interpret=True)


# == random scalar control flow, run as Python too (the generator that found the defect) ==========================
_HELPERS = '''
def clampf(f, i):
    if f > i:
        return i * 1.0
    if f < -i:
        return -i * 1.0
    return f


def pick(p, q, K: dsl.constexpr):
    r = 0
    if K > 0:
        for j in range(K):
            if p > q:
                r += p
            else:
                r -= q
        return max(min(r, 1000), -1000)
    elif p < q:
        return p
    return q
'''


class _Generator:
    """Random kernels over int and float scalars: assignments, `if` / `elif` / `else`, `for` over range and
    static_range, `while` with a counter, ternaries, and / or / not, chained comparisons, Python's min / max, tuple
    swaps, helper calls with early returns, and loads guarded by a short-circuit (run as Python, a load out of
    bounds raises). Ints stay within +-1000 and floats are multiples of 1/4, so Python's
    arithmetic is the DSL's (no `//`, `%` or overflow): the kernel and the same text run as Python must agree."""

    def __init__(self, rng: random.Random):
        self.r, self.types, self.loop_vars, self.depth = rng, {}, [], 0

    def _vars(self, kind):
        return [v for v, t in self.types.items() if t == kind]

    def iexpr(self, d=0):
        r = self.r.random()
        if d > 2 or r < 0.3:
            return self.r.choice(self._vars("i") + self.loop_vars + ["a", "b", "C", str(self.r.randint(-5, 5))])
        if r < 0.55:
            return f"({self.iexpr(d + 1)} {self.r.choice('+-')} {self.iexpr(d + 1)})"
        if r < 0.65:
            return f"({self.iexpr(d + 1)} * {self.r.randint(-3, 3)})"
        if r < 0.75:
            return f"{self.r.choice(['min', 'max'])}({self.iexpr(d + 1)}, {self.iexpr(d + 1)})"
        if r < 0.85:
            return f"({self.iexpr(d + 1)} if {self.cond(d + 1)} else {self.iexpr(d + 1)})"
        if r < 0.92:
            return f"(({self.cond(d + 1)}) * {self.r.randint(1, 3)})"
        return f"(-{self.iexpr(d + 1)})"

    def fexpr(self, d=0):
        r = self.r.random()
        if d > 2 or r < 0.3:
            return self.r.choice(self._vars("f") + ["x", str(self.r.randint(-8, 8) * 0.25)])
        if r < 0.55:
            return f"({self.fexpr(d + 1)} {self.r.choice('+-')} {self.fexpr(d + 1)})"
        if r < 0.65:
            return f"({self.fexpr(d + 1)} * {self.r.choice(['0.5', '2.0', '-1.0'])})"
        if r < 0.75:
            return f"({self.iexpr(d + 1)} + {self.fexpr(d + 1)})"
        if r < 0.85:
            return f"({self.fexpr(d + 1)} if {self.cond(d + 1)} else {self.fexpr(d + 1)})"
        return f"{self.r.choice(['min', 'max'])}({self.fexpr(d + 1)}, {self.fexpr(d + 1)})"

    def cond(self, d=0):
        r = self.r.random()
        if r < 0.12:        # a load that only an in-bounds index may reach (short-circuit `and` / `or`)
            i = self.iexpr(d + 1)
            if self.r.random() < 0.5:
                return f"(0 <= {i} < 6 and dsl.load(t_ptr + {i}) > {self.fexpr(d + 1)})"
            return f"({i} < 0 or {i} >= 6 or dsl.load(t_ptr + {i}) < {self.fexpr(d + 1)})"
        if r < 0.16:        # ... or that only the arm of a conditional expression that runs may reach
            i = self.iexpr(d + 1)
            return f"(dsl.load(t_ptr + {i}) > 0.0 if 0 <= {i} < 6 else {self.cond(d + 1)})"
        r = self.r.random()
        if d > 2 or r < 0.6:
            if self.r.random() < 0.7:
                return f"{self.iexpr(d + 1)} {self.r.choice(['<', '<=', '>', '>=', '==', '!='])} {self.iexpr(d + 1)}"
            return f"{self.fexpr(d + 1)} {self.r.choice(['<', '>=', '!='])} {self.fexpr(d + 1)}"
        if r < 0.8:
            return f"({self.cond(d + 1)}) {self.r.choice(['and', 'or'])} ({self.cond(d + 1)})"
        if r < 0.9:
            return f"not ({self.cond(d + 1)})"
        return f"{self.iexpr(d + 1)} < {self.iexpr(d + 1)} <= {self.iexpr(d + 1)}"

    def assign(self):
        ints, floats = self._vars("i"), self._vars("f")
        r = self.r.random()
        if r < 0.08 and len(ints) >= 2:
            p, q = self.r.sample(ints, 2)
            return [f"{p}, {q} = {q}, {p}"]
        if r < 0.16 and floats:
            return [f"{self.r.choice(floats)} = clampf({self.fexpr()}, {self.iexpr()})"]
        if r < 0.24 and ints:
            return [f"{self.r.choice(ints)} = pick({self.iexpr()}, {self.iexpr()}, {self.r.randint(-2, 2)})"]
        v = self.r.choice(list(self.types))
        e, lo, hi = (self.iexpr(), "-1000", "1000") if self.types[v] == "i" else (self.fexpr(), "-1000.0", "1000.0")
        if self.r.random() < 0.3:
            return [f"{v} += {e}", f"{v} = max(min({v}, {hi}), {lo})"]
        return [f"{v} = max(min({e}, {hi}), {lo})"]

    def block(self, count):
        out = []
        for _ in range(count):
            r = self.r.random()
            if self.depth >= 3 or r < 0.5:
                out += self.assign()
                continue
            self.depth += 1
            if r < 0.7:
                out.append(f"if {self.cond()}:")
                out += ["    " + line for line in self.block(self.r.randint(1, 3))]
                if self.r.random() < 0.4:
                    out.append(f"elif {self.cond()}:")
                    out += ["    " + line for line in self.block(self.r.randint(1, 2))]
                if self.r.random() < 0.5:
                    out.append("else:")
                    out += ["    " + line for line in self.block(self.r.randint(1, 2))]
            elif r < 0.85:
                var = f"i{self.depth}"
                lo, hi = self.r.choice(["0", "a", "-1", "C"]), self.r.choice(["3", "b", "a + 2", "C"])
                step = self.r.choice(["", ", 2", ", -1"])
                if step == ", -1":
                    lo, hi = hi, lo
                static = lo in ("0", "-1", "C", "3") and hi in ("0", "-1", "3", "C") and self.r.random() < 0.4
                out.append(f"for {var} in {'dsl.static_range' if static else 'range'}({lo}, {hi}{step}):")
                self.loop_vars.append(var)
                out += ["    " + line for line in self.block(self.r.randint(1, 3))]
                self.loop_vars.pop()
            else:
                var = f"w{self.depth}"
                out += [f"{var} = 0",
                        f"while {var} < {self.r.choice(['2', 'b', '3'])} and ({self.cond()} or {var} < 1):"]
                out += ["    " + line for line in self.block(self.r.randint(1, 2))]
                out.append(f"    {var} += 1")
            self.depth -= 1
        return out

    def kernel(self, outputs):
        lines = []
        for k in range(outputs):
            kind = self.r.choice("iif")
            self.types[f"v{k}"] = kind
            starts = ["0", "a", "b", "1", "C"] if kind == "i" else ["0.0", "x", "0", "1.5"]
            lines.append(f"v{k} = " + self.r.choice(starts))
        lines += self.block(self.r.randint(3, 7))
        lines += [f"dsl.store(o_ptr + {k}, v{k} * 1.0)" for k in range(outputs)]
        return "def k(o_ptr, t_ptr, a, b, x, C: dsl.constexpr):\n" + "".join(f"    {line}\n" for line in lines)


@pytest.mark.parametrize("seed", range(24))
def test_random_scalar_control_flow_follows_python(seed):
    outputs = 5
    source = _Generator(random.Random(seed)).kernel(outputs)
    helpers_file = f"<s37 helpers {seed}>"
    clampf, pick = (jit_from_source(_HELPERS, helpers_file, name) for name in ("clampf", "pick"))
    kernel = jit_from_source(source, f"<s37 random control flow {seed}>", namespace={"clampf": clampf, "pick": pick})
    python = {"dsl": PythonDsl}
    exec(_HELPERS + source, python)
    rng = random.Random(seed + 1000)
    for _ in range(3):
        a, b, x, c = rng.randint(-3, 4), rng.randint(-2, 4), rng.randint(-8, 8) * 0.25, rng.randint(-1, 3)
        table = [rng.randint(-8, 8) * 0.25 for _ in range(6)]
        stored = {}
        python["k"](PythonPointer(stored), PythonPointer(table), a, b, x, c)
        expected = [stored.get(i, NAN) for i in range(outputs)]
        out = torch.full((outputs,), NAN)
        kernel[(1,)](out, torch.tensor(table), a, b, x, C=c, interpret=True)
        assert out.tolist() == expected, (source, (a, b, x, c))
        compiled = torch.full((outputs,), NAN)
        run_on_host(kernel, compiled, torch.tensor(table), a, b, x, C=c)
        assert compiled.tolist() == expected, (source, (a, b, x, c))


@dsl.jit
def _clamp_helper(f, i):
    if f > i:
        return i * 1.0
    if f < -i:
        return -i * 1.0
    return f


@dsl.jit
def _carry_through_helper_kernel(o_ptr, a, n, CASE: dsl.constexpr):
    v = 0
    w = 0.0
    for j in range(n):
        if CASE == "assigned":
            v = _clamp_helper(v + j, a)     # the helper returns the carry (int32 at first) or a float
        else:
            w = _clamp_helper(v, a) + w     # v stays int32: only the helper's result is a float
            v = v + 1
    dsl.store(o_ptr, v * 1.0)
    dsl.store(o_ptr + 1, w)


def _clamp_python(f, i):
    if f > i:
        return i * 1.0
    if f < -i:
        return -i * 1.0
    return f


@pytest.mark.parametrize("case", ["assigned", "not_assigned"])
@pytest.mark.parametrize("a, n", [(2, 5), (10, 3), (-1, 2), (3, 0)])
def test_defect_a_helper_returning_the_literal_carry_or_a_float(case, a, n):
    v, w = 0, 0.0
    for j in range(n):
        if case == "assigned":
            v = _clamp_python(v + j, a)
        else:
            w = _clamp_python(v, a) + w
            v = v + 1
    out = torch.full((2,), NAN)
    _carry_through_helper_kernel[(1,)](out, a, n, CASE=case, interpret=True)
    assert out.tolist() == [float(v), w]
    compiled = torch.full((2,), NAN)
    run_on_host(_carry_through_helper_kernel, compiled, a, n, CASE=case)
    assert compiled.tolist() == [float(v), w]


# == Triton reports: broadcasting and layouts, compiled code run on the host against the interpreter =============
@dsl.jit
def _first_column_kernel(y_ptr, M: dsl.constexpr, N: dsl.constexpr):        # triton #3214
    y = dsl.zeros([M, N], dtype=dsl.float32)
    y += dsl.arange(0, N)[None, :] == 0
    dsl.store(y_ptr + dsl.arange(0, M)[:, None] * N + dsl.arange(0, N)[None, :], y)


@pytest.mark.parametrize("M, N", [(16, 16), (4, 64), (64, 4), (2, 2)])
def test_broadcast_comparison_added_to_zeros(M, N):
    expected = torch.zeros(M, N)
    expected[:, 0] = 1
    out = torch.full((M, N), NAN)
    _first_column_kernel[(1,)](out, M=M, N=N, interpret=True)
    assert torch.equal(out, expected)
    out.fill_(NAN)
    _run_compiled(_first_column_kernel, (out,), M=M, N=N)
    assert torch.equal(out, expected)


@dsl.jit
def _store_reload_kernel(a_ptr, tmp_ptr, res_ptr, res2_ptr, m, N, B: dsl.constexpr):    # triton #7957
    cols = dsl.arange(0, B)
    offs = dsl.arange(0, B)[:, None] * N + cols[None, :]
    a = dsl.load(a_ptr + offs)
    data = dsl.zeros((B,), dtype=dsl.int32) + m + cols
    dsl.store(tmp_ptr + offs, data[None, :])
    dsl.barrier()
    dsl.store(res_ptr + offs, dsl.load(tmp_ptr + offs))
    dsl.store(res2_ptr + offs, a.to(dsl.int32))


def test_broadcast_row_stored_and_reloaded():
    B = 16
    a = torch.randint(-5, 5, (B, B)).float()
    expected = (torch.arange(B, dtype=torch.int32) + 3).expand(B, B)
    outs = [torch.full((B, B), -7, dtype=torch.int32) for _ in range(3)]
    _store_reload_kernel[(1,)](a, *outs, 3, B, B=B, interpret=True)
    assert torch.equal(outs[1], expected) and torch.equal(outs[2], a.int())
    compiled = [torch.full((B, B), -7, dtype=torch.int32) for _ in range(3)]
    _run_compiled(_store_reload_kernel, (a, *compiled, 3, B), B=B)
    assert torch.equal(compiled[1], expected) and torch.equal(compiled[2], a.int())


@dsl.jit
def _scalar_condition_block_kernel(in_ptr, out_ptr, cond, X: dsl.constexpr):    # triton #1880
    offs = dsl.arange(0, X)
    tmp = dsl.load(in_ptr + offs)
    if cond:
        a = tmp * 0.0 - 1.0
    else:
        a = tmp
    dsl.store(out_ptr + offs, a)


@pytest.mark.parametrize("cond", [True, False, 0, 3])
def test_runtime_if_choosing_a_block(cond):
    x = torch.randn(128)
    expected = torch.full((128,), -1.0) if cond else x
    out = torch.full((128,), NAN)
    _scalar_condition_block_kernel[(1,)](x, out, cond, X=128, interpret=True)
    assert torch.equal(out, expected)
    out.fill_(NAN)
    _run_compiled(_scalar_condition_block_kernel, (x, out, cond), X=128)
    assert torch.equal(out, expected)


@dsl.jit
def _broadcast_where_kernel(x_ptr, y_ptr, o_ptr, XB: dsl.constexpr, YB: dsl.constexpr):    # triton #532 / #633
    xi = dsl.arange(0, XB)[:, None]
    yi = dsl.arange(0, YB)[None, :]
    a = dsl.load(x_ptr + xi)                        # (XB, 1)
    b = dsl.load(y_ptr + yi * XB + xi)              # (XB, YB)
    keep = (dsl.load(x_ptr + yi) > 0) == 0          # (1, YB), int1 compared with a literal
    dsl.store(o_ptr + yi * XB + xi, dsl.where(keep, -1e9, b / 8.0) + a)
    dsl.store(o_ptr + XB * YB + xi * 0, 1.0, mask=xi == 0)     # a scalar value under a block mask


def test_where_of_broadcast_condition_and_scalar():
    XB, YB = 8, 8
    x, y = torch.randn(XB), torch.randn(YB, XB)
    keep = ~(x[:YB] > 0)
    expected = torch.where(keep[:, None], torch.tensor(-1e9), y / 8.0) + x[None, :]
    out = torch.full((XB * YB + 1,), NAN)
    _broadcast_where_kernel[(1,)](x, y, out, XB=XB, YB=YB, interpret=True)
    assert torch.equal(out[:-1].view(YB, XB), expected) and out[-1].item() == 1.0
    out.fill_(NAN)
    _run_compiled(_broadcast_where_kernel, (x, y, out), XB=XB, YB=YB)
    assert torch.equal(out[:-1].view(YB, XB), expected) and out[-1].item() == 1.0


# == integer rules (triton #619, #954, #4676, #605) ===============================================================
@dsl.jit
def _int_rules_kernel(o_ptr, x_ptr, y_ptr, B: dsl.constexpr):
    offs = dsl.arange(0, B)
    x = dsl.load(x_ptr + offs)
    y = dsl.load(y_ptr + offs)
    dsl.store(o_ptr + offs, x // y)
    dsl.store(o_ptr + B + offs, x % y)
    dsl.store(o_ptr + 2 * B + offs, dsl.cdiv(x, 7))
    dsl.store(o_ptr + 3 * B + offs, (x / y).to(dsl.int32))
    dsl.store(o_ptr + 4 * B + offs, x // -2)


def test_integer_division_modulo_and_cdiv_follow_c():
    x = torch.tensor([7, -7, 7, -7, 0, 5, -2**31, -50, 9, -9, 2**31 - 1, 13, -13, 100, 3, -3], dtype=torch.int32)
    y = torch.tensor([2, 2, -2, -2, 3, 0, -1, 7, 0, 4, 1, -5, 5, 7, -3, 0], dtype=torch.int32)
    out = torch.full((5 * 16,), -12345, dtype=torch.int32)
    _int_rules_kernel[(1,)](out, x, y, B=16, interpret=True)
    xs, ys = x.tolist(), y.tolist()

    def trunc_div(a, b):
        if b == 0:
            return -1
        if a == -2**31 and b == -1:
            return -2**31
        q = abs(a) // abs(b)
        return q if (a >= 0) == (b > 0) else -q

    def c_mod(a, b):
        if b == 0:
            return a
        if b == -1:
            return 0
        return a - trunc_div(a, b) * b

    def float_quotient(a, b):       # float32 quotient, converted toward zero, saturating, NaN to 0
        q = (torch.tensor(a, dtype=torch.float32) / torch.tensor(b, dtype=torch.float32)).item()
        if math.isnan(q):
            return 0
        return max(-2**31, min(2**31 - 1, int(q) if math.isfinite(q) else int(q > 0) * 2**32 - 2**31))

    assert out[:16].tolist() == [trunc_div(a, b) for a, b in zip(xs, ys)]
    assert out[16:32].tolist() == [c_mod(a, b) for a, b in zip(xs, ys)]
    assert out[32:48].tolist() == [math.ceil(a / 7) if abs(a) < 2**31 - 7 else -(-a // 7) for a in xs]
    assert out[48:64].tolist() == [float_quotient(a, b) for a, b in zip(xs, ys)]
    assert out[64:].tolist() == [trunc_div(a, -2) for a in xs]
    compiled = torch.full((5 * 16,), -12345, dtype=torch.int32)
    _run_compiled(_int_rules_kernel, (compiled, x, y), B=16)
    assert torch.equal(compiled, out)


# == argmax / argmin with NaN and ties (triton #10298, #1813) ======================================================
@dsl.jit
def _arg_kernel(o_ptr, x_ptr, R: dsl.constexpr, C: dsl.constexpr):
    r = dsl.arange(0, R)[:, None]
    c = dsl.arange(0, C)[None, :]
    x = dsl.load(x_ptr + r * C + c)
    dsl.store(o_ptr + dsl.arange(0, R), dsl.argmax(x, axis=1))
    dsl.store(o_ptr + R + dsl.arange(0, R), dsl.argmin(x, axis=1))
    dsl.store(o_ptr + 2 * R + dsl.arange(0, C), dsl.argmax(x, axis=0))
    dsl.store(o_ptr + 2 * R + C, dsl.argmax(x, axis=None))


def test_argmax_argmin_with_nan_and_ties_follow_torch():
    x = torch.tensor([[3.0, NAN, 1.0, 5.0], [NAN, 1.0, 2.0, NAN], [1.0, 2.0, NAN, 2.0], [-1.0, -1.0, -2.0, -2.0],
                      [float("inf"), NAN, float("-inf"), 0.0], [0.0, -0.0, 0.0, -0.0], [7.0, 7.0, 7.0, 7.0],
                      [-5.0, 4.0, 4.0, -5.0]])
    out = torch.full((2 * 8 + 4 + 1,), -9, dtype=torch.int32)
    _arg_kernel[(1,)](out, x, R=8, C=4, interpret=True)
    assert out[:8].tolist() == x.argmax(1).tolist()
    assert out[8:16].tolist() == x.argmin(1).tolist()
    assert out[16:20].tolist() == x.argmax(0).tolist()
    assert out[20].item() == x.argmax().item()


# == specialization and constexprs ================================================================================
@dsl.jit
def _one_specialized_kernel(o_ptr, x_ptr, n):
    x = dsl.load(x_ptr)
    dsl.store(o_ptr, (x + n).to(dsl.float32))        # an int argument equal to 1 is an int32, not a weak literal
    dsl.store(o_ptr + 1, (n << 31).to(dsl.float32))


@pytest.mark.parametrize("dtype, value", [(torch.int8, 127), (torch.uint8, 255), (torch.int16, 32767),
                                          (torch.float16, 2049.0)])
@pytest.mark.parametrize("n", [1, 2, 16])
def test_an_int_argument_of_one_promotes_as_int32(dtype, value, n):
    out = torch.full((2,), NAN)
    _one_specialized_kernel[(1,)](out, torch.tensor([value], dtype=dtype), n, interpret=True)
    if dtype.is_floating_point:
        expected_sum = float(torch.tensor(value, dtype=dtype) + torch.tensor(n, dtype=dtype))
    else:
        expected_sum = float(value + n)
    assert out.tolist() == [expected_sum, float(-2**31 if n % 2 else 0)]
    ir = _one_specialized_kernel.compile(out, torch.tensor([value], dtype=dtype), n, target="sm_90a").asm["ir"]
    adds = [line for line in ir.splitlines() if "= add " in line]
    assert adds and adds[0].endswith(": float16" if dtype.is_floating_point else ": int32"), ir


@dsl.jit
def _constexpr_kind_kernel(o_ptr, S: dsl.constexpr):
    # (an int64 zero plus the constant: a float literal makes the sum float32, which rounds 16777217.0; a float
    # literal stored as it is converts from its exact value, session 38)
    dsl.store(o_ptr, dsl.load(o_ptr) + (S * 16777216 + 1))


def test_constexprs_one_one_point_zero_and_true_are_distinct_specializations():
    results = []
    for value in (1, 1.0, True, 1.0, 1):
        out = torch.zeros(1, dtype=torch.int64)
        _constexpr_kind_kernel[(1,)](out, S=value, interpret=True)
        results.append(out.item())
    assert results == [16777217, 16777216, 16777217, 16777216, 16777217]
    irs = [_constexpr_kind_kernel.compile(torch.zeros(1, dtype=torch.int64), S=v, target="sm_90a").asm["ir"]
           for v in (1.0, 1)]
    assert "{value=16777217.0} : float32" in irs[0] and "{value=16777217} : int64" in irs[1]


# == tutorial 05's lock and the helpers with constexpr parameters ================================================
@dsl.jit
def _locked_partial_sums_kernel(DW, Lock, X, N, GROUP: dsl.constexpr, BLOCK: dsl.constexpr):
    row = dsl.program_id(0)
    cols = dsl.arange(0, BLOCK)
    mask = cols < N
    x = dsl.load(X + row * N + cols, mask=mask, other=0.0)
    lock_id = row % GROUP
    Lock += lock_id
    Count = Lock + GROUP
    DW = DW + lock_id * N + cols
    while dsl.atomic_cas(Lock, 0, 1) == 1:
        pass
    count = dsl.load(Count)
    if count == 0:
        dsl.atomic_xchg(Count, 1)
    else:
        x += dsl.load(DW, mask=mask)
    dsl.store(DW, x, mask=mask)
    dsl.atomic_xchg(Lock, 0)


def test_tutorial_05_lock_loop():
    M, N, G = 37, 50, 4
    x = torch.randn(M, N)
    dw = torch.full((G, N), NAN)
    lock = torch.zeros(2 * G, dtype=torch.int32)
    _locked_partial_sums_kernel[(M,)](dw, lock, x, N, GROUP=G, BLOCK=64, interpret=True)
    expected = torch.stack([x[i::G].double().sum(0) for i in range(G)])
    assert (dw.double() - expected).abs().max().item() < 1e-5
    assert lock.tolist() == [0] * G + [1] * G
    _ptx_assembles(_locked_partial_sums_kernel, dw, lock, x, N, GROUP=G, BLOCK=64)


@dsl.jit
def _scaled_sum(x, N: dsl.constexpr, SCALE: dsl.constexpr = None, off=0):
    if SCALE is not None:
        x = x * SCALE
    return x + dsl.sum(dsl.arange(0, N), axis=0) + off


@dsl.jit
def _helpers_kernel(o_ptr, v, B: dsl.constexpr):
    dsl.store(o_ptr + 0, _scaled_sum(v, 4))
    dsl.store(o_ptr + 1, _scaled_sum(v, 8, 2.0))
    dsl.store(o_ptr + 2, _scaled_sum(v, N=B * 2, off=1))
    dsl.store(o_ptr + 3, _scaled_sum(v, 4, SCALE=None, off=v))


def test_helpers_with_constexpr_defaults_and_keywords():
    out = torch.full((4,), NAN)
    _helpers_kernel[(1,)](out, 1.5, B=4, interpret=True)
    assert out.tolist() == [1.5 + 6, 3.0 + 28, 1.5 + 28 + 1, 3.0 + 6]
    _ptx_assembles(_helpers_kernel, out, 1.5, B=4)
    bad = jit_from_source("def k(o_ptr, n):\n    dsl.store(o_ptr, h(1.0, n))\n", "<s37 runtime constexpr>",
                          namespace={"h": _scaled_sum})
    with pytest.raises(CompilationError, match="argument `N` of `_scaled_sum` is a dsl.constexpr parameter"):
        bad[(1,)](out, 3, interpret=True)


# == unsupported Python: clear, located errors ====================================================================
@pytest.mark.parametrize("body, message", [
    ("f = lambda v: v + 1\n    dsl.store(o_ptr, f(1.0))", "lambda"),
    ("a = [i for i in range(3)]", "list comprehensions"),
    ("try:\n        dsl.store(o_ptr, 1.0)\n    except Exception:\n        pass", "try"),
    ("with open('x'):\n        pass", "with"),
    ("if (k := n) > 0:\n        dsl.store(o_ptr, 1.0)", ":="),
    ("match n:\n        case 1:\n            dsl.store(o_ptr, 1.0)", "match"),
    ("for i in range(n):\n        pass\n    else:\n        dsl.store(o_ptr, 1.0)", "for ... else"),
    ("dsl.store(o_ptr, n ** n)", r"\*\*` of an integer base"),        # (n ** 2 works since session 43)
    ("dsl.store(o_ptr, dsl.program_id(n) * 1.0)", "program_id axis"),
    ("x = dsl.arange(0, n)", "arange bounds must be constexpr"),
    ("x = dsl.arange(0, 6)", "power of two"),
    ("dsl.store(o_ptr, dsl.cdiv(5, 0) * 1.0)", "cdiv by zero"),
    ("dsl.store(o_ptr, dsl.max(dsl.arange(0, 8), axis=0, return_indices=True) * 1.0)", "return_indices"),
    ("dsl.store(o_ptr, dsl.sum(dsl.arange(0, 8), axis=1) * 1.0)", "axis 1 is out of range"),
    ("dsl.store(o_ptr, dsl.sum(dsl.dot(dsl.zeros((16, 16), dsl.int16), dsl.zeros((16, 16), dsl.int16))) * 1.0)",
     "dot supports"),
    ("dsl.store(o_ptr, dsl.reduce(dsl.arange(0, 8), 0, dsl.maximum) * 1.0)", "no attribute `reduce`"),
    ("x = dsl.arange(0, 8)\n    y = 1 if x > 2 else 0", "dsl.where"),
])
def test_unsupported_constructs_are_located_compilation_errors(body, message):
    kernel = jit_from_source(f"def k(o_ptr, n):\n    {body}\n", f"<s37 unsupported {message}>")
    with pytest.raises(CompilationError, match=message) as info:
        kernel[(1,)](torch.zeros(4), 3, interpret=True)
    assert f"<s37 unsupported {message}>:" in str(info.value)


@pytest.mark.parametrize("body", [
    "acc = 0\n    for i in range(n):\n        if i > 1:\n            acc = 2**70\n    dsl.store(o_ptr, acc * 1.0)",
    "acc = 0\n    for i in range(n):\n        acc = 2**70\n    dsl.store(o_ptr, acc * 1.0)",
])
def test_a_literal_past_64_bits_in_a_carry_is_a_compilation_error(body):
    kernel = jit_from_source(f"def k(o_ptr, n):\n    {body}\n", "<s37 huge literal carry>")
    with pytest.raises(CompilationError):
        kernel[(1,)](torch.zeros(1), 3, interpret=True)


def test_a_deeply_nested_expression_is_a_located_compilation_error():
    short = jit_from_source("def k(o_ptr, x):\n    dsl.store(o_ptr, " + " + ".join(["x"] * 200) + ")\n", "<s37 sum 200>")
    out = torch.zeros(1)
    short[(1,)](out, 0.5, interpret=True)
    assert out.item() == 100.0
    deep = jit_from_source("def k(o_ptr, x):\n    y = x\n    dsl.store(o_ptr, " + " + ".join(["x"] * 1500) + ")\n",
                           "<s37 sum 1500>")
    for run in (lambda: deep[(1,)](out, 0.5, interpret=True), lambda: deep.compile(out, 0.5, target="sm_90a")):
        with pytest.raises(CompilationError, match="nests too deeply.*split a long expression") as info:
            run()
        assert "<s37 sum 1500>:3:" in str(info.value)


def _elif_chain(count):
    lines = ["def k(o_ptr, x):", "    v = 0", "    if x < 1:", "        v = 1"]
    for i in range(2, count + 1):
        lines += [f"    elif x < {i}:", f"        v = {i}"]
    return "\n".join(lines) + "\n    dsl.store(o_ptr, v * 1.0)\n"


def test_a_long_elif_chain_compiles_or_is_a_located_compilation_error():     # triton #5864
    out = torch.zeros(1)
    chain = jit_from_source(_elif_chain(100), "<s37 elif 100>")
    chain[(1,)](out, 37.5, interpret=True)
    assert out.item() == 38.0
    chain.compile(out, 37.5, target="sm_90a")
    too_long = jit_from_source(_elif_chain(500), "<s37 elif 500>")
    with pytest.raises(CompilationError, match="nests too deeply.*`elif` chain into separate `if`s") as info:
        too_long[(1,)](out, 37.5, interpret=True)
    assert "<s37 elif 500>:" in str(info.value)


def test_a_literal_carry_that_one_branch_makes_a_block_and_the_other_a_float():
    kernel = jit_from_source("def k(o_ptr, a, n):\n    offs = dsl.arange(0, 4)\n    v = 0\n    for i in range(n):\n"
                             "        if i > a:\n            v = v * -1.0 + offs * 0.5\n        else:\n"
                             "            v = v * -1.0 + 1.5\n    dsl.store(o_ptr + offs, v + offs * 0.0)\n",
                             "<s37 scalar and block branches>")
    for a, n in ((1, 4), (5, 3), (0, 0), (2, 5)):
        v = 0
        for i in range(n):
            v = [-(v[j] if isinstance(v, list) else v) + j * 0.5 for j in range(4)] if i > a else \
                ([-x + 1.5 for x in v] if isinstance(v, list) else -v + 1.5)
        out = torch.full((4,), NAN)
        kernel[(1,)](out, a, n, interpret=True)
        assert out.tolist() == (v if isinstance(v, list) else [float(v)] * 4), (a, n)
