"""Review (session 27, the DSL): a fresh reviewer played a demanding Triton user against `fusedops.dsl` on the
CPU, writing small kernels the way Triton users do, running them in the interpreter (interpret=True) against
torch / NumPy / Python and, where the compiled code matters, compiling them for sm_90a (assembled by ptxas
when it is on the PATH) or JIT-compiling a scalar kernel's LLVM IR on the host (tests/host_jit.py).

Cases were drawn from peer bug reports: Triton #11402 (a `while` whose condition starts false hangs the
interpreter), #9022 / #10291 / #10697 / #11615 (argmax / argmin / max / min with NaN, ties and all-NaN slices),
#1423 / #3307 / #2151 (types of `if` branches and of loop-carried values, an int1 carry OR-ed with loads),
#1340 (a helper called with int32 then uint32 must not share one signedness), #3391 (uint32 `%` a literal),
#10435 (an int argument in [2**31, 2**32) in the interpreter), #4613 (how a Python scalar promotes against a
block), #7402 / #7957 / #1074 (atomics' old values, broadcasts), #2060 (dot dtype-mismatch message),
triton-lang/triton-cpu #200 (device_print of negative ints); plus the project's rules: C `//` / `%` and shifts
past the width (README, language/numerics/), weakly typed literals (promotion.py), loop-carried values
(frontend/control_flow.py docstring), non-power-of-two / size-1 / empty / transposed / expanded inputs and
rows longer than one block.

Also tried and held (plain tests below, or checked by hand): break / continue / return-in-loop refused with
a located error; zero / negative / empty / int32-edge `range` steps; loop-carried tuples in `for` and `while`;
nested helpers with early returns inside a loop; constexpr `if` and `is None`; reductions sum / max / min /
argmax / argmin over float (NaN, ties, -0.0), int16 / int32 and bool blocks at (4, 8), (1, 8), (8, 1), (1, 1),
every axis, axis=None, keep_dims; float `//` and `%` of +-0, +-inf, NaN, 1e30, 0.1 in four float dtypes
against torch.floor_divide / torch.fmod (all equal, except that torch.fmod(1e30, -3e-30) is NaN in float32 and
bfloat16 where NumPy and the DSL give the exact remainder; the compiled `%` calls libdevice's exact fmod);
masked loads with `other` of every dtype; atomics add / max / min / xchg / and / or / xor on int32 / int64 /
uint32 / float32 / float64 with repeated addresses; about 150 misuse cases for their CompilationError or
TypeError (no Python traceback, no IR internals except defect 4); float64 -> bfloat16 on sm_80 (LLVM's
round-to-odd expansion, one rounding); control-flow, reduction, argmax and cumsum kernels at 1 to 64 elements
and seven dtypes compiled for sm_90a and assembled by ptxas.

DEFECTS (fixed in session 27; each has the test below, once a strict xfail, that asserts the correct behaviour,
and tests of the whole kind after it):

1. A loop-carried value whose type changes for a reason other than a literal is silently converted back
   when the new value's expression merely *contains* a literal operand.
   Repro: `x = dsl.load(i32_ptr); for i in range(n): x = dsl.load(f32_ptr) + 1; dsl.store(out, x)` with
   *f32_ptr = 2.75 stores 3.0. Expected: the CompilationError the rules promise ("any other change is a
   CompilationError naming the variable"; `x = dsl.load(f32_ptr)` alone does raise it) or Python's 3.75.
   Same with an int64 value: `x = y_int64 + 1` into an int32 carry truncates 2**40 + 1 to 1.
   Cause: frontend/loops.py `_is_literal_promotion` accepts any binary op with a CONSTANT operand, without
   checking that the non-literal operand already had the carried type (that the literal won the promotion).
   Fix: frontend/carried_types.py `is_literal_promotion` (moved out of loops.py) takes `x <op> literal` only
   when x, before the conversion the promotion inserted, has the carried type and the literal's own type
   wins the promotion against it; `load_f32 + 1`, `x.to(dsl.int32) + 1` (into a float32 carry) and a typed
   `dsl.full` constant are refused.

2. A dtype annotation on a @dsl.jit *helper's* parameter is silently ignored.
   Repro: `@dsl.jit def sq(n: dsl.int64): return n * n`, called from a kernel with n = 100000, stores
   1410065408 (int32 wrap-around). Expected 10**10, what the same annotation gives on a kernel parameter
   (runtime/signature.py `_annotated_scalar`) and on `m: dsl.int64 = n` (visit_AnnAssign).
   Cause: frontend/generator.py `inline_call` binds the arguments without applying `param.annotation`.
   Fix: `inline_call` converts each annotated argument as `n: dsl.int64 = arg` does (`_annotated_argument`);
   None and dsl.constexpr values stay compile-time (as for a kernel parameter); a tuple, string or dtype, or
   a conversion that does not exist (a pointer to int32), is a CompilationError naming the parameter.

3. A bool (int1) block shifted left by the literal 1 is 0: `(x > 0) << 1` stores [0, 0, ...] where Python,
   C, NumPy and torch give 2 (and the DSL itself gives `b << 2` == 4, `b * 2` == 2). Interpreter and
   compiled code agree: the sm_90a LLVM IR stores a constant 0 for `b << 1` and `select i1 %b, i32 4, i32 0`
   for `b << 2`, and its host-JIT run gives [0, 4].
   Cause: language/semantics.py `Semantics.binary` applies C's integer promotion of int1 to int32 for
   add / sub / mul / floordiv / mod only; the weak literal 1 fits int1, so `<<` is computed in 1 bit and
   the shift amount (1) is >= the width.
   Fix: `Semantics.binary` computes int1 operands of << and >> in int32 too (`_INT1_PROMOTED`); & | ^, min /
   max and comparisons keep int1 (promotion.py's rules say so).

4. Merging the branches of a runtime `if` prints the compiler's IR values and calls runtime tuples
   "compile-time values": `t = (x, n); if n > 0: t = (x,)` gives "`t` is the compile-time value
   (Value(?: float32),) in one branch ... and (Value(?: float32), Value(n: int32))"; the same for a runtime
   value against a tuple and for a helper returning tuples of different lengths. (The loop-carried case
   says "a tuple of 2 items before the loop but a tuple of 1 items", the class sessions 23 and 26 fixed.)
   Cause: frontend/control_flow.py `_merge` formats the branch values with repr().
   Fix: `_merge` describes values with `described` (a tuple holding runtime values by its length, the loop's
   wording; a runtime value by its type; a compile-time one by `shown`) and names the branches (`before the
   `if`` where there is no `else`); the loop's "becomes ..." error and `x + (x, n)` use it too.

5. The rule "a literal initial value (`acc = 0`) adopts the type the loop body gives it" holds only for a
   single loop. Nested, `acc = 0; for i in range(3): for j in range(4): acc += 0.5` stores 0.0 (the
   un-nested loop and Python give 6.0): the inner loop sees the outer loop's int32 block argument, takes
   `acc + 0.5` for a literal promotion and converts it back to int32 every trip. `acc += 3000000000`
   wraps in int32 (1640261632, not 36000000000), a loop-carried tuple slot `t[0] + 0.5` stays 0, and
   `acc += dsl.load(f32_ptr)` (fine in one loop) becomes a CompilationError. (Related, not wrong output:
   an `elif` chain of literals `-1 / 0.5 / True / 2**40` is refused, while two literal branches promote.)
   Cause: frontend/loops.py `_compile_loop` / `_carried_type_ok`: the retype is decided per loop; an
   inner loop's cast-back hides the type change from the loop that owns the literal initial value.
   Fix: a loop registers its block arguments' initial values while its body compiles (CompilationContext
   `carry_inits`); a nested loop whose initial value is computed from an enclosing loop's literal
   (frontend/carried_types.py `literals_reaching`, through any ops, `if`s, loops and helpers) adopts its
   body's type as the literal would, converting that value (frontend/loops.py `_adopts`, `_loop_init`), and
   the enclosing loop then sees the change and promotes its literal by the one-loop rule. The `elif` chain
   of literals: an `if` result made of numbers only promotes on with the next literal (control_flow.py
   `_literal_leaf`).

What passed: everything else tried (the plain tests below are the meaningful ones kept).
"""

from __future__ import annotations

import pytest
import torch

import fusedops.dsl as dsl
from fusedops.dsl.ir import Block, Builder
from fusedops.dsl.language.semantics import Semantics
from fusedops.dsl.target import assemble, ptxas_available
from host_jit import run_on_host
from test_review_session23_dsl import _range_sum

NAN, INF = float("nan"), float("inf")


def _compile(kernel, *args, arch="sm_90a", **constexprs):
    """Compile for `arch`; assemble with ptxas when it is installed. Returns the PTX text."""
    compiled = kernel.compile(*args, target=arch, **constexprs)
    ptx = compiled.asm["ptx"]
    if ptxas_available():
        assemble(ptx, arch)
    return ptx


# ================================================================================================
# Control flow
# ================================================================================================
@dsl.jit
def _while_count_kernel(o_ptr, n):
    i = 0
    while i < n:            # Triton #11402: the interpreter hung when this starts false
        i += 1
    dsl.store(o_ptr, i)


@pytest.mark.parametrize("n", [0, 1, 5, -3])
def test_while_whose_condition_starts_false_terminates(n):
    out = torch.full((1,), -7, dtype=torch.int32)
    _while_count_kernel[(1,)](out, n, interpret=True)
    assert out.item() == max(n, 0)


def test_while_kernel_compiles_for_sm90a():
    ptx = _compile(_while_count_kernel, torch.zeros(1, dtype=torch.int32), 5)
    assert "max.s32" in ptx or "bra" in ptx         # LLVM folds the counting loop into max(n, 0)


@dsl.jit
def _break_kernel(o_ptr, n):
    s = 0
    for i in range(n):
        if i == 3:
            break
        s += i
    dsl.store(o_ptr, s)


@dsl.jit
def _continue_kernel(o_ptr, n):
    s = 0
    for i in range(n):
        if i % 2 == 0:
            continue
        s += i
    dsl.store(o_ptr, s)


@dsl.jit
def _return_in_loop_kernel(o_ptr, n):
    for i in range(n):
        if i == 2:
            return
        dsl.store(o_ptr + i, i)


@pytest.mark.parametrize("kernel, word", [(_break_kernel, "break"), (_continue_kernel, "continue"),
                                          (_return_in_loop_kernel, "return")])
def test_break_continue_and_return_in_a_loop_are_located_errors(kernel, word):
    with pytest.raises(dsl.CompilationError) as info:
        kernel[(1,)](torch.zeros(4, dtype=torch.int32), 4, interpret=True)
    message = str(info.value)
    assert word in message and "test_review_session27_dsl.py" in message and "^" in message


@dsl.jit
def _clamp_low(x, lo):
    if x < lo:
        if x < 0:
            return -1.0
        return 0.5
    return x * 1.0


@dsl.jit
def _helper_return_in_loop_kernel(o_ptr, n):
    acc = 0.0
    for i in range(n):
        acc += _clamp_low(i, 3)          # a helper's early returns inside the caller's loop
    dsl.store(o_ptr, acc)


def test_helper_with_early_returns_called_in_a_loop():
    out = torch.zeros(1)
    _helper_return_in_loop_kernel[(1,)](out, 6, interpret=True)
    assert out.item() == 0.5 * 3 + 3 + 4 + 5
    _compile(_helper_return_in_loop_kernel, out, 6)


@pytest.mark.parametrize("a, b, s", [(10, 0, -3), (0, 10, 3), (5, 5, 1), (5, 0, 1), (0, 5, -1), (-5, 5, 4),
                                     (2**31 - 3, 2**31 - 1, 1)])
def test_runtime_range_follows_python(a, b, s):
    out = torch.zeros(2, dtype=torch.int64)
    _range_sum[(1,)](out, a, b, s, interpret=True)
    expected = sum(range(a, b, s))
    expected = (expected + 2**31) % 2**32 - 2**31        # the int32 carry wraps (C semantics)
    assert out.tolist() == [expected, len(range(a, b, s))]


def test_runtime_zero_range_step_is_an_interpreter_error():
    with pytest.raises(dsl.InterpreterError, match="step is zero"):
        _range_sum[(1,)](torch.zeros(2, dtype=torch.int64), 0, 5, 0, interpret=True)


@dsl.jit
def _fib_while_kernel(o_ptr, n):
    ab = (0, 1)
    i = 0
    while i < n:
        ab = (ab[1], ab[0] + ab[1])      # a loop-carried tuple in a while loop
        i += 1
    dsl.store(o_ptr, ab[0])


def test_loop_carried_tuple_in_a_while_loop():
    out = torch.zeros(1, dtype=torch.int32)
    _fib_while_kernel[(1,)](out, 20, interpret=True)
    assert out.item() == 6765


@dsl.jit
def _nested_if_literals_kernel(o_ptr, c, d):
    if c > 0:
        if d > 0:
            x = 1
        else:
            x = 2.5
    else:
        x = 3
    dsl.store(o_ptr, x)


@pytest.mark.parametrize("c, d, expected", [(1, 1, 1.0), (1, 0, 2.5), (0, 0, 3.0)])
def test_if_branches_with_literals_of_different_kinds_promote(c, d, expected):
    out = torch.zeros(1)
    _nested_if_literals_kernel[(1,)](out, c, d, interpret=True)
    assert out.item() == expected


@dsl.jit
def _if_types_kernel(o_ptr, c, x_ptr):
    x = dsl.load(x_ptr)
    if c > 0:
        y = x
    else:
        y = x.to(dsl.float32)
    dsl.store(o_ptr, y)


def test_if_branches_with_different_runtime_types_name_the_variable():
    # Triton #1423 / #3307: the error names the variable and both types
    with pytest.raises(dsl.CompilationError, match=r"`y` has type int32 in the `if` branch and float32"):
        _if_types_kernel[(1,)](torch.zeros(1), 1, torch.zeros(1, dtype=torch.int32), interpret=True)


@dsl.jit
def _single_loop_literal_kernel(o_ptr, n):
    acc = 0
    big = 0
    for i in range(n):
        acc += 0.5
        big += 3000000000
    dsl.store(o_ptr, acc)
    dsl.store(o_ptr + 1, big)


def test_literal_initial_value_adopts_the_type_of_a_single_loop():
    out = torch.zeros(2, dtype=torch.float64)
    _single_loop_literal_kernel[(1,)](out, 12, interpret=True)
    assert out.tolist() == [6.0, 36000000000.0]


@dsl.jit
def _bool_or_carry_kernel(o_ptr, x_ptr, n, BLOCK: dsl.constexpr):
    offs = dsl.arange(0, BLOCK)
    acc = dsl.zeros((BLOCK,), dsl.int1)
    for start in range(0, n, BLOCK):
        m = start + offs < n
        v = dsl.load(x_ptr + start + offs, mask=m)       # a bool tensor loads as int1 (Triton #2151)
        acc = dsl.where(m, acc | v, acc)
    dsl.store(o_ptr, dsl.max(acc, axis=0))


@pytest.mark.parametrize("hot", [None, 0, 37, 99])
def test_int1_carry_ored_with_bool_loads(hot):
    x = torch.zeros(100, dtype=torch.bool)
    if hot is not None:
        x[hot] = True
    out = torch.full((1,), True)
    _bool_or_carry_kernel[(1,)](out, x, 100, BLOCK=32, interpret=True)
    assert out.item() == bool(x.any())


@dsl.jit
def _online_softmax_kernel(y_ptr, x_ptr, n_cols, sx_row, sx_col, sy_row, BLOCK: dsl.constexpr):
    row = dsl.program_id(0)
    offs = dsl.arange(0, BLOCK)
    m = -float("inf")
    d = 0.0
    for start in range(0, n_cols, BLOCK):          # a row longer than one block
        cols = start + offs
        x = dsl.load(x_ptr + row * sx_row + cols * sx_col, mask=cols < n_cols, other=-float("inf"))
        new_m = dsl.maximum(m, dsl.max(x, axis=0))
        d = d * dsl.exp(m - new_m) + dsl.sum(dsl.exp(x - new_m), axis=0)
        m = new_m
    for start in range(0, n_cols, BLOCK):
        cols = start + offs
        x = dsl.load(x_ptr + row * sx_row + cols * sx_col, mask=cols < n_cols, other=-float("inf"))
        dsl.store(y_ptr + row * sy_row + cols, dsl.exp(x - m) / d, mask=cols < n_cols)


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "expanded"])
def test_row_longer_than_one_block_on_strided_inputs(layout):
    g = torch.Generator().manual_seed(27)
    if layout == "contiguous":
        x = torch.randn(3, 100, generator=g)
    elif layout == "transposed":
        x = torch.randn(100, 3, generator=g).t()
    else:
        x = torch.randn(1, 100, generator=g).expand(3, 100)     # stride 0 rows
    y = torch.full((3, 100), NAN)
    _online_softmax_kernel[(3,)](y, x, 100, x.stride(0), x.stride(1), y.stride(0), BLOCK=32, interpret=True)
    reference = torch.softmax(x.double(), dim=-1)
    # float32: exp and the running sums in float32, a few ulp per element
    torch.testing.assert_close(y.double(), reference, rtol=1e-5, atol=1e-7)


# ================================================================================================
# Reductions
# ================================================================================================
@dsl.jit
def _reduce_kernel(x_ptr, o_ptr, KIND: dsl.constexpr, AXIS: dsl.constexpr, KEEP: dsl.constexpr,
                   M: dsl.constexpr, N: dsl.constexpr):
    r = dsl.arange(0, M)[:, None]
    c = dsl.arange(0, N)[None, :]
    x = dsl.load(x_ptr + r * N + c)
    if KIND == "sum":
        y = dsl.sum(x, axis=AXIS, keep_dims=KEEP)
    elif KIND == "max":
        y = dsl.max(x, axis=AXIS, keep_dims=KEEP)
    elif KIND == "min":
        y = dsl.min(x, axis=AXIS, keep_dims=KEEP)
    elif KIND == "argmax":
        y = dsl.argmax(x, axis=AXIS, keep_dims=KEEP)
    else:
        y = dsl.argmin(x, axis=AXIS, keep_dims=KEEP)
    if AXIS is None:
        dsl.store(o_ptr + dsl.arange(0, 1), dsl.reshape(y, (1,)))
    elif AXIS == 0:
        if KEEP:
            dsl.store(o_ptr + c, y)
        else:
            dsl.store(o_ptr + dsl.arange(0, N), y)
    else:
        if KEEP:
            dsl.store(o_ptr + r, y)
        else:
            dsl.store(o_ptr + dsl.arange(0, M), y)


def _torch_reduce(x, kind, axis):
    if kind.startswith("arg"):
        x = x.int() if x.dtype == torch.bool else x
        fn = torch.argmax if kind == "argmax" else torch.argmin
        return fn(x.flatten()).reshape(1) if axis is None else fn(x, dim=axis)
    fn = {"sum": torch.sum, "max": torch.amax, "min": torch.amin}[kind]
    return fn(x).reshape(1) if axis is None else fn(x, dim=axis)


def _reduce_inputs():
    g = torch.Generator().manual_seed(1027)
    x = torch.randn(4, 8, generator=g)
    x[1, 3] = NAN                                   # NaN propagates in max / min and wins argmax / argmin
    x[2, 0] = x[2, 5] = NAN
    x[3] = 1.0                                      # a row of ties: the first index
    x[0, 2], x[0, 6] = -0.0, 0.0
    ints = torch.randint(-3, 3, (4, 8), generator=g, dtype=torch.int32)
    bools = torch.randint(0, 2, (4, 8), generator=g).bool()
    return {"float32": x, "int32": ints, "bool": bools, "row": torch.randn(1, 8, generator=g),
            "col": torch.randint(-9, 9, (8, 1), generator=g, dtype=torch.int16)}


@pytest.mark.parametrize("name", ["float32", "int32", "bool", "row", "col"])
def test_reductions_match_torch(name):
    x = _reduce_inputs()[name]
    M, N = x.shape
    kinds = ["max", "min", "argmax", "argmin"] + ([] if x.dtype == torch.bool else ["sum"])
    for kind in kinds:
        for axis in (0, 1, None):
            for keep in (False, True):
                ref = _torch_reduce(x, kind, axis)
                out_dtype = torch.int32 if kind.startswith("arg") else x.dtype
                out = torch.zeros(max(M, N), dtype=out_dtype)
                _reduce_kernel[(1,)](x, out, kind, axis, keep, M, N, interpret=True)
                got = out[:ref.numel()]
                if ref.dtype.is_floating_point:
                    assert torch.equal(torch.isnan(got), torch.isnan(ref)), (kind, axis, keep)
                    close = torch.allclose(got.double().nan_to_num(), ref.double().nan_to_num(), rtol=1e-6)
                    assert close, (kind, axis, keep, got, ref)
                else:
                    assert got.tolist() == ref.to(torch.int64).tolist(), (kind, axis, keep, got, ref)


@dsl.jit
def _arg_nan_kernel(x_ptr, o_ptr, N: dsl.constexpr):
    x = dsl.load(x_ptr + dsl.arange(0, N))
    dsl.store(o_ptr, dsl.argmax(x, axis=0))
    dsl.store(o_ptr + 1, dsl.argmin(x, axis=0))


@pytest.mark.parametrize("values", [[NAN, 6.0, 8.0, 1.0], [INF, NAN, 0.0, 1.0], [NAN, INF, -INF, NAN],
                                    [NAN, NAN, NAN, NAN], [3.0, 3.0, 1.0, 1.0], [0.0, -0.0, -0.0, 0.0]])
def test_argmax_argmin_nan_and_ties_follow_torch(values):
    # Triton #9022 / #10291 / #10697 / #11615: torch's rule (NaN is the extreme, first index) in every slice
    x = torch.tensor(values)
    out = torch.full((2,), -1, dtype=torch.int32)
    _arg_nan_kernel[(1,)](x, out, 4, interpret=True)
    assert out.tolist() == [torch.argmax(x).item(), torch.argmin(x).item()]


# ================================================================================================
# Integer semantics
# ================================================================================================
@dsl.jit
def _int_rules_kernel(o_ptr, a, b, s, u: dsl.uint32, K: dsl.constexpr):
    dsl.store(o_ptr + 0, a // b)                  # C: truncation toward zero
    dsl.store(o_ptr + 1, a % b)                   # C: the sign of the dividend
    dsl.store(o_ptr + 2, K // 2)                  # constexprs fold with Python's rules (documented)
    dsl.store(o_ptr + 3, K % 3)
    dsl.store(o_ptr + 4, a << s)                  # shift >= width: 0
    dsl.store(o_ptr + 5, a >> s)                  # arithmetic shift >= width: the sign fill
    dsl.store(o_ptr + 6, (u >> 1).to(dsl.int64))  # logical shift of an unsigned value
    dsl.store(o_ptr + 7, u - 1)                   # unsigned wrap (u = 0)
    dsl.store(o_ptr + 8, a * 2**31)               # a literal past int32 promotes to int64: no wrap
    dsl.store(o_ptr + 9, (a * 65536) * 65536)     # int32 wraps (C)
    dsl.store(o_ptr + 10, (a < u).to(dsl.int64))  # int32 vs uint32 compares as uint32 (C)


def test_integer_rules_as_documented():
    out = torch.zeros(11, dtype=torch.int64)
    _int_rules_kernel[(1,)](out, -7, 2, 40, 0, -7, interpret=True)
    # -7 // 2, -7 % 2, Python -7 // 2, -7 % 3, -7 << 40 (int32), -7 >> 40, 0 >> 1, uint32 0 - 1, -7 * 2**31,
    # int32 wrap of -7 * 2**32 = 0, uint32(-7) < 0 is False
    assert out.tolist() == [-3, -1, -4, 2, 0, -1, 0, 2**32 - 1, -7 * 2**31, 0, 0]


@dsl.jit
def _shr_helper(x):
    return x >> 1


@dsl.jit
def _signedness_kernel(o_ptr, i_ptr):
    x = dsl.load(i_ptr)
    dsl.store(o_ptr, _shr_helper(x).to(dsl.int64))
    dsl.store(o_ptr + 1, _shr_helper(x.to(dsl.uint32)).to(dsl.int64))


def test_helper_called_with_int32_then_uint32_keeps_each_signedness():
    # Triton #1340: one helper, two signednesses, two different shifts
    out = torch.zeros(2, dtype=torch.int64)
    x = torch.tensor([-8], dtype=torch.int32)
    _signedness_kernel[(1,)](out, x, interpret=True)
    assert out.tolist() == [-4, (2**32 - 8) >> 1]
    ptx = _compile(_signedness_kernel, out, x)
    assert "shr.s32" in ptx and "shr.u32" in ptx


@dsl.jit
def _uint_mod_kernel(o_ptr, N: dsl.constexpr):
    values = dsl.arange(0, N).to(dsl.uint32)
    dsl.store(o_ptr + dsl.arange(0, N), (values % 2).to(dsl.int32))     # Triton #3391: refused there


def test_uint32_modulo_a_literal():
    out = torch.full((8,), -1, dtype=torch.int32)
    _uint_mod_kernel[(1,)](out, 8, interpret=True)
    assert out.tolist() == [0, 1] * 4


@dsl.jit
def _wide_int_arg_kernel(o_ptr, n):
    dsl.store(o_ptr, n + 1)


@pytest.mark.parametrize("n", [2**31 - 1, 2**31 + 5, 2**32 - 1, -2**31 - 1])
def test_int_arguments_past_int32_arrive_as_int64(n):
    # Triton #10435: [2**31, 2**32) was stored in a uint32 buffer by Triton's interpreter
    out = torch.zeros(1, dtype=torch.int64)
    _wide_int_arg_kernel[(1,)](out, n, interpret=True)
    expected = n + 1 if n != 2**31 - 1 else -2**31       # int32 + 1 wraps (C)
    assert out.item() == expected


@dsl.jit
def _float_to_int_kernel(x_ptr, i32_ptr, u8_ptr, i8_ptr, N: dsl.constexpr):
    offs = dsl.arange(0, N)
    x = dsl.load(x_ptr + offs)
    dsl.store(i32_ptr + offs, x.to(dsl.int32))
    dsl.store(u8_ptr + offs, x.to(dsl.uint8))
    dsl.store(i8_ptr + offs, x.to(dsl.int8))


def test_float_to_int_casts_truncate_saturate_and_send_nan_to_zero():
    x = torch.tensor([NAN, INF, -INF, 3e9, -3e9, -1.5, 2.5, 200.75])
    i32, u8, i8 = torch.zeros(8, dtype=torch.int32), torch.zeros(8, dtype=torch.uint8), torch.zeros(8, dtype=torch.int8)
    _float_to_int_kernel[(1,)](x, i32, u8, i8, 8, interpret=True)
    assert i32.tolist() == [0, 2**31 - 1, -2**31, 2**31 - 1, -2**31, -1, 2, 200]
    assert u8.tolist() == [0, 255, 0, 255, 0, 0, 2, 200]
    assert i8.tolist() == [0, 127, -128, 127, -128, -1, 2, 127]


# ================================================================================================
# where, masked loads, atomics
# ================================================================================================
@dsl.jit
def _where_kernel(h_ptr, i_ptr, f_ptr, g_ptr, c, N: dsl.constexpr):
    offs = dsl.arange(0, N)
    h = dsl.load(h_ptr + offs)                                      # float16
    i = dsl.load(i_ptr + offs)                                      # int32
    dsl.static_assert(dsl.where(offs < 2, h, 2.0).dtype == dsl.float16)       # the literal adopts float16
    dsl.store(h_ptr + offs, dsl.where(offs < 2, h, 2.0))
    dsl.store(f_ptr + offs, dsl.where(offs % 2 == 0, i, 0.5))      # int32 with a float literal: float32
    dsl.store(g_ptr + offs[:, None] * N + offs[None, :],
              dsl.where(c > 0, offs[:, None], offs[None, :] * 10))  # a scalar condition, broadcast arms


def test_where_with_scalar_and_broadcast_operands():
    h = torch.tensor([1.5, -2.0, 3.0, 4.0], dtype=torch.float16)
    i = torch.tensor([7, 8, 9, 10], dtype=torch.int32)
    f, g = torch.zeros(4), torch.zeros(4, 4, dtype=torch.int32)
    _where_kernel[(1,)](h, i, f, g, 1, 4, interpret=True)
    assert h.tolist() == [1.5, -2.0, 2.0, 2.0]
    assert f.tolist() == [7.0, 0.5, 9.0, 0.5]
    assert torch.equal(g, torch.arange(4, dtype=torch.int32)[:, None].expand(4, 4))


@dsl.jit
def _masked_other_kernel(o_ptr, x_ptr, n, OTHER: dsl.constexpr, N: dsl.constexpr):
    offs = dsl.arange(0, N)
    dsl.store(o_ptr + offs, dsl.load(x_ptr + offs, mask=offs < n, other=OTHER))


@pytest.mark.parametrize("dtype, other, expected", [
    (torch.float16, -INF, -INF), (torch.float16, 1e6, INF), (torch.bfloat16, 1e6, 999424.0),
    (torch.int8, 300, 44), (torch.uint8, -1, 255), (torch.int32, -INF, -2**31), (torch.bool, 2, True),
    (torch.float64, 0.1, 0.1)])
def test_masked_load_other_of_another_dtype_converts_to_the_pointee(dtype, other, expected):
    x = torch.ones(8, dtype=dtype)
    out = torch.zeros(8, dtype=dtype)
    _masked_other_kernel[(1,)](out, x, 3, other, 8, interpret=True)
    assert out[:3].tolist() == [True if dtype == torch.bool else 1] * 3
    assert out[3:].tolist() == [expected] * 5


@dsl.jit
def _atomics_kernel(p_ptr, v_ptr, i_ptr, add_old, max_old, xchg_old, N: dsl.constexpr):
    offs = dsl.arange(0, N)
    idx = dsl.load(i_ptr + offs)
    v = dsl.load(v_ptr + offs)
    dsl.store(add_old + offs, dsl.atomic_add(p_ptr + idx, v))
    dsl.store(max_old + offs, dsl.atomic_max(p_ptr + 4 + idx, v))
    dsl.store(xchg_old + offs, dsl.atomic_xchg(p_ptr + 8 + idx, v))


def test_interpreter_atomics_with_repeated_addresses_return_each_lanes_old_value():
    # Triton #7402 (old values of an atomic) and histogram-style duplicates: lane order, atomically
    idx = torch.tensor([0, 1, 0, 2, 0, 1, 3, 3], dtype=torch.int32)
    v = torch.tensor([-1, 2, 5, 3, -7, -5, 12, 6], dtype=torch.int32)
    memory = torch.tensor([4, -3, 8, 0] * 3, dtype=torch.int32)
    olds = [torch.zeros(8, dtype=torch.int32) for _ in range(3)]
    _atomics_kernel[(1,)](memory, v, idx, *olds, 8, interpret=True)
    ref, ref_old = [4, -3, 8, 0] * 3, [[], [], []]
    for lane in range(8):
        j = idx[lane].item()
        for k, combine in enumerate((lambda a, b: a + b, max, lambda a, b: b)):
            ref_old[k].append(ref[4 * k + j])
            ref[4 * k + j] = combine(ref[4 * k + j], v[lane].item())
    assert memory.tolist() == ref
    assert [o.tolist() for o in olds] == ref_old


# ================================================================================================
# Misuse: clear errors naming the argument or the construct
# ================================================================================================
@dsl.jit
def _plain_kernel(x_ptr, o_ptr, n, BLOCK: dsl.constexpr):
    offs = dsl.arange(0, BLOCK)
    x = dsl.load(x_ptr + offs, mask=offs < n)
    dsl.store(o_ptr + offs, x * 2, mask=offs < n)


@pytest.mark.parametrize("args, kwargs, error, pattern", [
    (([1, 2], "o", 8), {"BLOCK": 8}, TypeError, "argument `x_ptr` of kernel `_plain_kernel` must be"),
    (("x", "o", "8"), {"BLOCK": 8}, TypeError, "argument `n`"),
    (("x", "o", 8), {"BLOCK": 6}, dsl.CompilationError, "power of two, got 6"),
    (("x", "o", 8), {"BLOCK": torch.tensor(8)}, TypeError, "argument `BLOCK` .* is a dsl.constexpr"),
    (("x", "o", 8), {}, TypeError, "missing argument `BLOCK`"),
    (("x", "o", 2**70), {"BLOCK": 8}, TypeError, "argument `n`.*does not fit in 64 bits"),
    (("x", "o", 8), {"BLOCK": 8, "num_ctas": 2}, TypeError, "num_ctas"),
])
def test_bad_launch_arguments_name_the_argument(args, kwargs, error, pattern):
    tensors = {"x": torch.zeros(8), "o": torch.zeros(8)}
    args = [tensors.get(a, a) if isinstance(a, str) and a in tensors else a for a in args]
    with pytest.raises(error, match=pattern):
        _plain_kernel[(1,)](*args, interpret=True, **kwargs)


@dsl.jit
def _misuse_kernel(x_ptr, n, CASE: dsl.constexpr):
    a = dsl.arange(0, 4).to(dsl.float32)
    b = dsl.arange(0, 8).to(dsl.float32)
    if CASE == "broadcast":
        dsl.store(x_ptr + dsl.arange(0, 4), a + b)
    elif CASE == "runtime_arange":
        dsl.store(x_ptr + dsl.arange(0, n), 1.0)
    elif CASE == "runtime_axis":
        dsl.store(x_ptr, dsl.sum(a, axis=n))
    elif CASE == "dot_dtypes":
        m = dsl.zeros((16, 16), dsl.float16)
        dsl.store(x_ptr, dsl.sum(dsl.sum(dsl.dot(m, m.to(dsl.float32)), axis=0), axis=0))
    elif CASE == "block_if":
        if a > 0:
            dsl.store(x_ptr, 1.0)
    elif CASE == "store_shape":
        dsl.store(x_ptr, a)


@pytest.mark.parametrize("case, pattern", [
    ("broadcast", r"shapes \(4,\) and \(8,\) do not broadcast"),
    ("runtime_arange", "arange bounds must be constexpr ints, got 0, a runtime int32 value"),
    ("runtime_axis", "axis must be a constexpr int, got a runtime int32 value"),
    ("dot_dtypes", "dot operands must have one dtype, got float16 and float32"),       # Triton #2060
    ("block_if", "use dsl.where"),
    ("store_shape", "must broadcast to the pointer's shape"),
])
def test_misuse_is_a_located_compilation_error_without_ir_internals(case, pattern):
    with pytest.raises(dsl.CompilationError, match=pattern) as info:
        _misuse_kernel[(1,)](torch.zeros(16), 4, case, interpret=True)
    assert "Value(" not in str(info.value) and "test_review_session27_dsl.py" in str(info.value)


@dsl.jit
def _print_kernel(x_ptr, n):
    dsl.device_print("v", dsl.load(x_ptr + dsl.arange(0, 2)))
    dsl.device_print("n", n)


def test_device_print_shows_signed_ints_as_signed(capsys):
    # triton-cpu #200: device_print printed int32 -1 as 4294967294
    _print_kernel[(1,)](torch.tensor([-1, 3], dtype=torch.int32), -5, interpret=True)
    text = capsys.readouterr().out
    assert "v [-1, 3]" in text and "n -5" in text


# ================================================================================================
# DEFECT 1: a loop-carried type change not caused by a literal is converted back silently
# ================================================================================================
@dsl.jit
def _carry_float_plus_literal_kernel(o_ptr, i_ptr, f_ptr, n):
    x = dsl.load(i_ptr)                      # int32
    for i in range(n):
        x = dsl.load(f_ptr) + 1              # float32 because of the load, not of the literal
    dsl.store(o_ptr, x)


@dsl.jit
def _carry_int64_plus_literal_kernel(o_ptr, i_ptr, w_ptr, n):
    x = dsl.load(i_ptr)                      # int32
    for i in range(n):
        x = dsl.load(w_ptr) + 1              # int64 because of the load
    dsl.store(o_ptr, x)


@dsl.jit
def _carry_float_alone_kernel(o_ptr, i_ptr, f_ptr, n):
    x = dsl.load(i_ptr)
    for i in range(n):
        x = dsl.load(f_ptr)
    dsl.store(o_ptr, x)


def test_a_loop_carried_type_change_without_a_literal_is_refused():
    with pytest.raises(dsl.CompilationError, match="loop-carried variable `x` has type int32"):
        _carry_float_alone_kernel[(1,)](torch.zeros(1), torch.tensor([7], dtype=torch.int32),
                                        torch.tensor([2.75]), 1, interpret=True)


def test_defect1_float_load_plus_literal_into_an_int_carry():
    out = torch.zeros(1, dtype=torch.float64)
    try:
        _carry_float_plus_literal_kernel[(1,)](out, torch.tensor([7], dtype=torch.int32), torch.tensor([2.75]), 1,
                                               interpret=True)
    except dsl.CompilationError as error:        # what the rules promise
        assert "`x`" in str(error)
        return
    assert out.item() == 3.75, out.item()        # or Python's value; it stores 3.0


def test_defect1_int64_load_plus_literal_into_an_int32_carry():
    out = torch.zeros(1, dtype=torch.int64)
    try:
        _carry_int64_plus_literal_kernel[(1,)](out, torch.tensor([7], dtype=torch.int32),
                                               torch.tensor([2**40], dtype=torch.int64), 1, interpret=True)
    except dsl.CompilationError as error:
        assert "`x`" in str(error)
        return
    assert out.item() == 2**40 + 1, out.item()   # it stores 1


@dsl.jit
def _carry_kind_kernel(o_ptr, i_ptr, f_ptr, n, CASE: dsl.constexpr):
    x = dsl.load(i_ptr)                      # int32
    for i in range(n):
        if CASE == "plus_float_literal":
            x = x + 1.5
        elif CASE == "float_literal_times":
            x = 1.5 * x
        elif CASE == "int64_literal":
            x = x + 2**40                    # wraps as C's `x += 2**40` does: 2**40 is 0 modulo 2**32
        elif CASE == "load_times_literal":
            x = dsl.load(f_ptr) * 2
        elif CASE == "typed_constant":
            x = x + dsl.full((), 1, dsl.int64)
        elif CASE == "maximum_of_load":
            x = dsl.maximum(dsl.load(f_ptr), 0.5)
        else:
            x = x / 2                        # `/` made it float, not the literal
    dsl.store(o_ptr, x)


@pytest.mark.parametrize("case, expected", [("plus_float_literal", 9.0), ("float_literal_times", 15.0),
                                            ("int64_literal", 7.0)])
def test_a_type_change_that_a_literal_won_is_converted_back_as_in_c(case, expected):
    args = (torch.tensor([7], dtype=torch.int32), torch.tensor([2.75]), 2)
    out = torch.full((1,), NAN, dtype=torch.float64)
    _carry_kind_kernel[(1,)](out, *args, case, interpret=True)
    assert out.item() == expected
    out.fill_(NAN)
    run_on_host(_carry_kind_kernel, out, *args, CASE=case)
    assert out.item() == expected


@pytest.mark.parametrize("case, found", [("load_times_literal", "float32"), ("typed_constant", "int64"),
                                         ("maximum_of_load", "float32"), ("true_division", "float32")])
def test_a_type_change_that_a_literal_did_not_win_is_refused(case, found):
    with pytest.raises(dsl.CompilationError, match=f"loop-carried variable `x` has type int32 before the loop "
                                                   rf"\(line \d+\) but is assigned a {found}"):
        _carry_kind_kernel[(1,)](torch.zeros(1), torch.tensor([7], dtype=torch.int32), torch.tensor([2.75]), 2,
                                 case, interpret=True)


@dsl.jit
def _carry_kind_block_kernel(o_ptr, i_ptr, f_ptr, n, CASE: dsl.constexpr, B: dsl.constexpr):
    offs = dsl.arange(0, B)
    x = dsl.load(i_ptr + offs)               # <4xint32>
    for i in range(n):
        if CASE == "literal":
            x = x + 0.5
        elif CASE == "load":
            x = dsl.load(f_ptr + offs) + 1
        else:
            x = x.to(dsl.float32).to(dsl.int32) + 1.5      # the literal wins against int32: converted back
    dsl.store(o_ptr + offs, x)


@pytest.mark.parametrize("case, expected", [("literal", [7.0, 8.0, 9.0, 10.0]), ("load", None),
                                            ("converted_then_literal", [9.0, 10.0, 11.0, 12.0])])
def test_a_block_carry_follows_the_same_rule(case, expected):
    out = torch.full((4,), NAN, dtype=torch.float64)
    args = (out, torch.arange(7, 11, dtype=torch.int32), torch.full((4,), 2.75), 2, case, 4)
    if expected is None:
        with pytest.raises(dsl.CompilationError, match=r"`x` has type <4xint32> before the loop .* <4xfloat32>"):
            _carry_kind_block_kernel[(1,)](*args, interpret=True)
        return
    _carry_kind_block_kernel[(1,)](*args, interpret=True)
    assert out.tolist() == expected


@dsl.jit
def _float_carry_converted_kernel(o_ptr, f_ptr, n):
    x = dsl.load(f_ptr)                      # float32
    for i in range(n):
        x = x.to(dsl.int32) + 1              # int32 because of the conversion: the literal 1 lost to it
    dsl.store(o_ptr, x)


def test_a_conversion_plus_a_literal_is_not_a_literal_promotion():
    with pytest.raises(dsl.CompilationError, match="`x` has type float32 before the loop .* assigned a int32"):
        _float_carry_converted_kernel[(1,)](torch.zeros(1), torch.tensor([2.75]), 2, interpret=True)


# ================================================================================================
# DEFECT 2: a helper parameter's dtype annotation is ignored
# ================================================================================================
@dsl.jit
def _square_int64(n: dsl.int64):
    return n * n


@dsl.jit
def _annotated_helper_kernel(o_ptr, n):
    dsl.store(o_ptr, _square_int64(n))


@dsl.jit
def _annotated_kernel(o_ptr, n: dsl.int64):
    dsl.store(o_ptr, n * n)


@dsl.jit
def _annotated_assignment_kernel(o_ptr, n):
    m: dsl.int64 = n
    dsl.store(o_ptr, m * m)


@pytest.mark.parametrize("kernel", [_annotated_kernel, _annotated_assignment_kernel])
def test_int64_annotations_on_kernel_parameters_and_assignments_widen(kernel):
    out = torch.zeros(1, dtype=torch.int64)
    kernel[(1,)](out, 100000, interpret=True)
    assert out.item() == 10**10


def test_defect2_helper_parameter_annotation_is_applied():
    out = torch.zeros(1, dtype=torch.int64)
    _annotated_helper_kernel[(1,)](out, 100000, interpret=True)
    assert out.item() == 10**10, out.item()      # 1410065408: wrapped in int32


@dsl.jit
def _third(x: dsl.float64):
    return x / 3


@dsl.jit
def _plus_optional(x, bias: dsl.float32 = None):
    if bias is None:
        return x
    return x + bias


@dsl.jit
def _identity_int32(n: dsl.int32):
    return n


@dsl.jit
def _helper_annotation_kernel(o_ptr, p_ptr, n, CASE: dsl.constexpr):
    offs = dsl.arange(0, 4)
    if CASE == "float64":
        dsl.store(o_ptr, _third(n))                          # n / 3 in float64, not float32
    elif CASE == "literal_argument":
        dsl.store(o_ptr, _square_int64(100000))
    elif CASE == "block_argument":
        dsl.store(o_ptr + offs, _square_int64(offs + n))     # an int32 block converts elementwise
    elif CASE == "default_none":
        dsl.store(o_ptr, _plus_optional(n))                  # None stays a compile-time None
    elif CASE == "keyword":
        dsl.store(o_ptr, _plus_optional(n, bias=1))          # the int literal 1 becomes float32
    elif CASE == "tuple":
        dsl.store(o_ptr, _identity_int32((n, n)))
    elif CASE == "string":
        dsl.store(o_ptr, _identity_int32("n"))
    else:
        dsl.store(o_ptr, _identity_int32(p_ptr))


@pytest.mark.parametrize("case, expected", [
    ("float64", [100000 / 3]), ("literal_argument", [1e10]), ("default_none", [100000.0]), ("keyword", [100001.0]),
    ("block_argument", [float((100000 + i) ** 2) for i in range(4)])])
def test_helper_parameter_annotations_convert_the_argument(case, expected):
    out = torch.full((4,), NAN, dtype=torch.float64)
    _helper_annotation_kernel[(1,)](out, torch.zeros(1), 100000, case, interpret=True)
    assert out[:len(expected)].tolist() == expected


@pytest.mark.parametrize("case, pattern", [
    ("tuple", "argument `n` of `_identity_int32` is annotated int32, which takes a number or a kernel value, "
              "but got a tuple of 2 items"),
    ("string", "argument `n` of `_identity_int32` is annotated int32, which takes a number or a kernel value, "
               "but got 'n'"),
    ("pointer", "argument `n` of `_identity_int32` is annotated int32: pointers convert only to and from 64-bit"),
])
def test_a_helper_annotation_that_cannot_apply_is_a_located_error(case, pattern):
    with pytest.raises(dsl.CompilationError, match=pattern) as info:
        _helper_annotation_kernel[(1,)](torch.zeros(4, dtype=torch.float64), torch.zeros(1), 3, case,
                                        interpret=True)
    assert "test_review_session27_dsl.py" in str(info.value) and "Value(" not in str(info.value)


def test_helper_parameter_annotation_compiled_on_the_host():
    out = torch.zeros(1, dtype=torch.int64)
    run_on_host(_annotated_helper_kernel, out, 100000)
    assert out.item() == 10**10


# ================================================================================================
# DEFECT 3: bool << 1 is 0
# ================================================================================================
@dsl.jit
def _bool_shift_kernel(o_ptr, x_ptr, N: dsl.constexpr):
    offs = dsl.arange(0, N)
    b = dsl.load(x_ptr + offs) > 0
    dsl.store(o_ptr + offs, b << 1)
    dsl.store(o_ptr + N + offs, b << 2)
    dsl.store(o_ptr + 2 * N + offs, b * 2)
    dsl.store(o_ptr + 3 * N + offs, (b << 1) | b)


@dsl.jit
def _bool_shift_scalar_kernel(o_ptr, x):
    b = x > 0
    dsl.store(o_ptr, b << 1)
    dsl.store(o_ptr + 1, b << 2)


def _bool_shift_results():
    x = torch.tensor([1.0, -1.0, 2.0, 0.0])
    out = torch.zeros(16, dtype=torch.int32)
    _bool_shift_kernel[(1,)](out, x, 4, interpret=True)
    return x > 0, out.view(4, 4)


def test_bool_shift_by_two_and_bool_times_two_follow_torch():
    b, out = _bool_shift_results()
    assert out[1].tolist() == (b.int() << 2).tolist() == [4, 0, 4, 0]
    assert out[2].tolist() == (b * 2).tolist()


def test_defect3_bool_block_shifted_left_by_one():
    b, out = _bool_shift_results()
    assert out[0].tolist() == (b << 1).tolist() == [2, 0, 2, 0], out[0].tolist()     # torch, NumPy, C: 2
    assert out[3].tolist() == [3, 0, 3, 0], out[3].tolist()


def test_defect3_bool_shift_compiled_on_the_host():
    out = torch.full((2,), -1, dtype=torch.int32)
    run_on_host(_bool_shift_scalar_kernel, out, 5)
    assert out.tolist() == [2, 4], out.tolist()


@dsl.jit
def _bool_shift_kind_kernel(o_ptr, x_ptr, N: dsl.constexpr):
    offs = dsl.arange(0, N)
    x = dsl.load(x_ptr + offs)
    b = x > 0
    c = x > 1
    dsl.store(o_ptr + offs, 1 << b)
    dsl.store(o_ptr + N + offs, b << c)
    dsl.store(o_ptr + 2 * N + offs, (b << 3) >> 1)
    dsl.store(o_ptr + 3 * N + offs, b >> c)
    dsl.store(o_ptr + 4 * N + offs, ~b)


def test_bool_shifts_compute_in_int32_like_python():
    x = torch.tensor([1.0, -1.0, 2.0, 0.0])
    out = torch.full((20,), -7, dtype=torch.int32)
    _bool_shift_kind_kernel[(1,)](out, x, 4, interpret=True)
    b, c = [int(v > 0) for v in x.tolist()], [int(v > 1) for v in x.tolist()]
    assert out.view(5, 4).tolist() == [[1 << p for p in b], [p << q for p, q in zip(b, c)],
                                       [(p << 3) >> 1 for p in b], [p >> q for p, q in zip(b, c)],
                                       [1 - p for p in b]]       # ~ of a bool is logical not (NumPy, torch)


@dsl.jit
def _bool_shift_pair_kernel(o_ptr, x, y):
    b = x > 0
    c = y > 0
    dsl.store(o_ptr, 1 << b)
    dsl.store(o_ptr + 1, b << c)
    dsl.store(o_ptr + 2, (b << 3) >> c)


@pytest.mark.parametrize("x, y", [(1, 1), (1, 0), (0, 1)])
def test_bool_shifts_compiled_on_the_host_match_the_interpreter(x, y):
    expected = [1 << (x > 0), (x > 0) << (y > 0), ((x > 0) << 3) >> (y > 0)]
    for run in ("interpreter", "host"):
        out = torch.full((3,), -1, dtype=torch.int32)
        if run == "host":
            run_on_host(_bool_shift_pair_kernel, out, x, y)
        else:
            _bool_shift_pair_kernel[(1,)](out, x, y, interpret=True)
        assert out.tolist() == expected, run


@pytest.mark.parametrize("op, expected", [
    ("lshift", dsl.int32), ("rshift", dsl.int32), ("add", dsl.int32), ("mod", dsl.int32),
    ("and", dsl.int1), ("or", dsl.int1), ("xor", dsl.int1), ("minimum", dsl.int1), ("eq", dsl.int1)])
def test_int1_operands_promote_for_arithmetic_and_shifts_only(op, expected):
    # promotion.py: C's integer promotion for + - * // % << >>; & | ^, min / max, comparisons keep int1
    block = Block([dsl.int1])
    semantic, b = Semantics(Builder(block)), block.args[0]
    for left, right in [(b, b), (b, 1), (True, b)]:
        assert semantic.binary(op, left, right).type == expected, (left, right)


def test_unary_ops_on_bool_follow_numpy_and_torch():
    block = Block([dsl.int1])
    semantic, b = Semantics(Builder(block)), block.args[0]
    assert semantic.unary("invert", b).type == dsl.int1            # logical not
    with pytest.raises(dsl.CompilationError, match="cannot negate an int1 value"):
        semantic.unary("neg", b)                                    # NumPy and torch refuse `-` of a bool


# ================================================================================================
# DEFECT 4: `if` merge errors print IR values
# ================================================================================================
@dsl.jit
def _merge_error_kernel(x_ptr, n, CASE: dsl.constexpr):
    x = dsl.load(x_ptr)
    if CASE == "tuple_lengths":
        t = (x, n)
        if n > 0:
            t = (x,)
        dsl.store(x_ptr, t[0])
    elif CASE == "value_vs_tuple":
        y = x
        if n > 0:
            y = (x, n)
        dsl.store(x_ptr, x)
    else:
        t = _tuple_of_n(x, n)
        dsl.store(x_ptr, t[0])


@dsl.jit
def _tuple_of_n(x, n):
    if n > 0:
        return (x, n)
    return (x,)


@pytest.mark.parametrize("case", ["tuple_lengths", "value_vs_tuple", "helper_returns"])
def test_defect4_if_merge_errors_do_not_print_ir_values(case):
    with pytest.raises(dsl.CompilationError) as info:
        _merge_error_kernel[(1,)](torch.zeros(4), 3, case, interpret=True)
    message = str(info.value)
    assert "Value(" not in message, message
    assert "compile-time value (" not in message, message


@dsl.jit
def _merge_error_kind_kernel(x_ptr, n, CASE: dsl.constexpr):
    x = dsl.load(x_ptr)
    if CASE == "nested_item":
        t = ((x, n), x)
        if n > 0:
            t = ((x,), x)
        dsl.store(x_ptr, t[1])
    elif CASE == "with_else":
        if n > 0:
            y = x
        else:
            y = (x, n)
        dsl.store(x_ptr, x)
    elif CASE == "constant_tuples":
        t = (1, 2)
        if n > 0:
            t = (1,)
        dsl.store(x_ptr, x)
    elif CASE == "loop_becomes_tuple":
        y = n
        for i in range(n):
            y = (y, n)
        dsl.store(x_ptr, x)
    else:
        dsl.store(x_ptr, x + (x, n))


@pytest.mark.parametrize("kernel, case, message", [
    (_merge_error_kernel, "tuple_lengths", "`t` is a tuple of 1 items in the `if` branch but a tuple of 2 items "
                                           "before the `if` (which has no `else`); after a runtime `if` it must be "
                                           "a tuple of one length in both branches, or a single value in both"),
    (_merge_error_kernel, "value_vs_tuple", "`y` is a tuple of 2 items in the `if` branch but a float32 value "
                                            "before the `if` (which has no `else`)"),
    (_merge_error_kernel, "helper_returns", "the returned value is a tuple of 2 items in the `if` branch but a "
                                            "tuple of 1 items after the `if`"),
    (_merge_error_kind_kernel, "nested_item", "`t[0]` is a tuple of 1 items in the `if` branch but a tuple of 2 "
                                              "items before the `if`"),
    (_merge_error_kind_kernel, "with_else", "`y` is a float32 value in the `if` branch but a tuple of 2 items in "
                                            "the `else` branch"),
    (_merge_error_kind_kernel, "constant_tuples", "`t` is (1,) in the `if` branch but (1, 2) before the `if`"),
    (_merge_error_kind_kernel, "loop_becomes_tuple", "loop-carried variable `y` has type int32 before the loop but "
                                                     "becomes a tuple of 2 items in the loop body"),
    (_merge_error_kind_kernel, "combine", "a tuple of 2 items cannot be combined with a kernel value"),
])
def test_control_flow_errors_describe_values_without_ir_internals(kernel, case, message):
    with pytest.raises(dsl.CompilationError) as info:
        kernel[(1,)](torch.zeros(4), 3, case, interpret=True)
    text = str(info.value)
    assert message in text and "test_review_session27_dsl.py" in text, text
    assert "Value(" not in text and "compile-time value (" not in text, text


# ================================================================================================
# DEFECT 5: a literal initial value does not adopt the type of a nested loop
# ================================================================================================
@dsl.jit
def _nested_literal_kernel(o_ptr, f_ptr, n, m, CASE: dsl.constexpr):
    if CASE == "float":
        acc = 0
        for i in range(n):
            for j in range(m):
                acc += 0.5
        dsl.store(o_ptr, acc)
    elif CASE == "int64":
        acc = 0
        for i in range(n):
            for j in range(m):
                acc += 3000000000
        dsl.store(o_ptr, acc)
    elif CASE == "tuple":
        t = (0, 0)
        for i in range(n):
            for j in range(m):
                t = (t[0] + 0.5, t[1] + 1)
        dsl.store(o_ptr, t[0] * 1000 + t[1])
    elif CASE == "while":
        acc = 0
        i = 0
        while i < n:
            for j in range(m):
                acc += 0.5
            i += 1
        dsl.store(o_ptr, acc)
    else:
        acc = 0
        for i in range(n):
            for j in range(m):
                acc += dsl.load(f_ptr)
        dsl.store(o_ptr, acc)


@pytest.mark.parametrize("case, expected", [("float", 6.0), ("int64", 36000000000.0), ("tuple", 6012.0),
                                            ("while", 6.0), ("load", 3.0)])
def test_defect5_literal_initial_value_in_nested_loops(case, expected):
    out = torch.full((1,), NAN, dtype=torch.float64)
    _nested_literal_kernel[(1,)](out, torch.tensor([0.25]), 3, 4, case, interpret=True)
    assert out.item() == expected, out.item()     # 0.0, 1640261632.0, 12.0, 0.0, CompilationError


@pytest.mark.parametrize("case, expected", [("float", 6.0), ("int64", 36000000000.0), ("tuple", 6012.0),
                                            ("while", 6.0), ("load", 3.0)])
def test_literal_initial_value_in_nested_loops_compiled_on_the_host(case, expected):
    out = torch.full((1,), NAN, dtype=torch.float64)
    run_on_host(_nested_literal_kernel, out, torch.tensor([0.25]), 3, 4, CASE=case)
    assert out.item() == expected


@dsl.jit
def _add_halves(a, m):
    for j in range(m):
        a += 0.5
    return a


@dsl.jit
def _nested_literal_kind_kernel(o_ptr, f_ptr, n, m, CASE: dsl.constexpr):
    acc = 0
    if CASE == "helper_loop":
        for i in range(n):
            acc = _add_halves(acc, m)                # the nested loop is a helper's
    elif CASE == "other_name":
        for i in range(n):
            x = acc
            for j in range(m):
                x += 0.5
            acc = x
    elif CASE == "not_carried_back":
        for i in range(n):
            x = acc                                  # float from here, as in Python; acc stays int32
            for j in range(m):
                x += 0.5
            acc += 1
            dsl.store(o_ptr + 1, x)
    elif CASE == "three_levels":
        for i in range(n):
            for j in range(m):
                for k in range(2):
                    acc += 0.5
    elif CASE == "int_then_inner_float":
        for i in range(n):
            acc += 1                                 # still int32 here: the inner loop's 0.5 makes it float
            for j in range(m):
                acc += 0.5
    elif CASE == "if_then_inner":
        for i in range(n):
            if i > 0:
                acc += 1
            for j in range(m):
                acc += 0.5
    elif CASE == "inner_then_float64":
        for i in range(n):
            for j in range(m):
                acc += 0.5
            acc += dsl.load(f_ptr).to(dsl.float64)
    elif CASE == "reassigned_before_inner":
        for i in range(n):
            acc = dsl.load(f_ptr).to(dsl.int32) + i  # not the literal any more: the inner loop converts back
            for j in range(m):
                acc += 0.5
    if CASE == "block":
        for i in range(n):
            for j in range(m):
                acc = acc + dsl.load(f_ptr + dsl.arange(0, 4))
        dsl.store(o_ptr + dsl.arange(0, 4), acc)
    else:
        dsl.store(o_ptr, acc)


@pytest.mark.parametrize("case, expected", [
    ("helper_loop", [6.0]), ("other_name", [6.0]), ("not_carried_back", [3.0, 4.0]),
    ("three_levels", [12.0]), ("int_then_inner_float", [9.0]), ("if_then_inner", [8.0]),
    ("inner_then_float64", [6.75]), ("block", [3.0] * 4),
    ("reassigned_before_inner", [2.0])])       # int(0.25) + i, + 0.5 converted back to int32 four times
def test_nested_loops_promote_a_literal_initial_value_as_one_loop_does(case, expected):
    out = torch.full((4,), NAN, dtype=torch.float64)
    _nested_literal_kind_kernel[(1,)](out, torch.full((4,), 0.25), 3, 4, case, interpret=True)
    assert out[:len(expected)].tolist() == expected
    if case != "block":              # a scalar kernel: its compiled code runs on the host too
        out.fill_(NAN)
        run_on_host(_nested_literal_kind_kernel, out, torch.full((4,), 0.25), 3, 4, CASE=case)
        assert out[:len(expected)].tolist() == expected


@dsl.jit
def _literal_refused_kernel(o_ptr, n, NESTED: dsl.constexpr):
    acc = 0.5
    if NESTED:
        for i in range(n):
            for j in range(n):
                acc = acc.to(dsl.int32) + 1
    else:
        for i in range(n):
            acc = acc.to(dsl.int32) + 1
    dsl.store(o_ptr, acc)


@pytest.mark.parametrize("nested", [False, True])
def test_a_type_the_literal_cannot_adopt_is_the_same_error_nested_or_not(nested):
    with pytest.raises(dsl.CompilationError, match="loop-carried variable `acc` has type float32 before the loop "
                                                   r"\(line \d+\) but is assigned a int32"):
        _literal_refused_kernel[(1,)](torch.zeros(1), 3, nested, interpret=True)


@dsl.jit
def _elif_literals_helper(c):
    if c == 0:
        return -1
    elif c == 1:
        return 0.5
    elif c == 2:
        return True
    return 2**40


@dsl.jit
def _elif_literals_kernel(o_ptr, w_ptr, c):
    if c == 0:
        x = -1
    elif c == 1:
        x = 0.5
    elif c == 2:
        x = True
    else:
        x = 2**40
    dsl.store(o_ptr, x)
    dsl.store(o_ptr + 1, _elif_literals_helper(c))
    if c == 0:
        w = -1
    elif c == 1:
        w = True
    else:
        w = 2**40 + 1                # int literals only: int64, exact
    dsl.store(w_ptr, w)


@pytest.mark.parametrize("c, expected, wide", [(0, -1.0, -1), (1, 0.5, 1), (2, 1.0, 2**40 + 1),
                                               (3, 2.0**40, 2**40 + 1)])
def test_an_elif_chain_of_literals_promotes_as_two_literals_do(c, expected, wide):
    out = torch.full((2,), NAN, dtype=torch.float64)
    w = torch.zeros(1, dtype=torch.int64)
    _elif_literals_kernel[(1,)](out, w, c, interpret=True)
    assert out.tolist() == [expected, expected] and w.item() == wide
    out.fill_(NAN)
    run_on_host(_elif_literals_kernel, out, w, c)
    assert out.tolist() == [expected, expected]
