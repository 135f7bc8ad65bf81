"""Review (session 24, the DSL frontend): a reviewer played a Triton user porting kernels and tried the Python
syntax and idioms Triton kernels use: chained comparisons, `not` / `and` / `or` on blocks and runtime scalars,
`is None` tests of constexprs, constexpr arithmetic and the Python builtins on constexprs, `.shape` / `.dtype`
and the method forms, augmented assignment, tuple unpacking and tuples returned by nested jit functions,
`static_range` / `range` / `while`, unsupported statements (break, continue, f-strings, lambdas, nested def, del,
with, ...), globals, `if` / ternaries on constexprs and runtime values, shadowed builtins, docstrings, local
annotations, keyword-only and positional-only parameters. Each kernel runs in the interpreter against a
reference, compiles for sm_90a, and scalar ones run compiled on the host (tests/host_jit.py) where the compiled
rule matters; a construct that is refused must be a CompilationError naming it at its source line.

Defects found (fixed in the same session; the tests assert the correct behaviour):
- `==` / `!=` between tuples holding runtime values is folded at compile time by Python's object equality
  (identity of the IR values): `(a, 1) == (b, 1)` stores 0 when a == b at run time, `(a + 0, 1) != (a, 1)`
  stores 1, `S == (a, a)` with a constexpr S is 0 whatever `a` is. Expected: the elementwise answer, or a
  CompilationError (as `(a, 1) < (b, 1)` and `a in t` already give).
- A nested @dsl.jit function's keyword-only parameter accepts a positional argument (`f(x, 3)` with
  `def f(x, *, scale=2)` binds scale=3), and a positional-only one accepts a keyword (`h(x=a, y=1)` with
  `def h(x, /, y)`): `generator.bind_arguments` ignores the parameter kinds. Expected: a CompilationError, as
  Python's TypeError.
- The same at launch: `kernel[grid](o, 4)` with `def k(o_ptr, *, a)` binds a=4 (interpreter and
  kernel.compile); `kernel[grid](o, a=6)` with `def k(o_ptr, a, /)` too. Expected: Python's TypeError.
- `B: "dsl.constexpr"` (a quoted annotation) in a module with `from __future__ import annotations` is not a
  constexpr parameter: the annotation string is then `'dsl.constexpr'` with its quotes, which
  `kernel_parameters._is_constexpr_annotation` does not recognize, so B silently becomes a runtime int32
  (`dsl.arange(0, B)` then fails with "arange bounds must be constexpr ints"). Expected: a constexpr parameter,
  as without the quotes or without the __future__ import.
- `and` / `or` on runtime scalars evaluate both operands: `i < n and dsl.load(x_ptr + i) > 0` loads
  x_ptr + i even when i >= n (an out-of-bounds error in the interpreter, an unguarded read on the GPU), while
  `dsl.load(x_ptr + i) if i < n else 0`, the same guard written as a ternary, branches and does not load
  (expressions.py: "only the chosen one runs, as in Python"). Expected: Python's short circuit for an operand
  with a memory access, like the ternary.
Fixes: comparisons of tuples holding runtime values are CompilationErrors; one binder with Python's rules
for launches and nested calls (runtime/signature.py `bind_parameters`, and the fast path's generated binder
keeps the kernel's `/` and `*`); quoted annotations are unquoted; a scalar `and` / `or` whose right side
touches memory short-circuits through an `if` (frontend/expressions.py `_runtime_bool_op`).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import fusedops.dsl as dsl
from fusedops.dsl.errors import CompilationError
from host_jit import run_on_host
from kernel_source import jit_from_source

_COUNT = [0]


def _kernel(source: str, namespace=None, name: str = "k"):
    _COUNT[0] += 1
    return jit_from_source(source, f"<review24 frontend {_COUNT[0]}>", name=name, namespace=namespace)


def _i32(n):
    return torch.zeros(n, dtype=torch.int32)


def _f32(n):
    return torch.zeros(n)


def _check(kernel, make_args, expected, host=False, **constexprs):
    """Interpret, compare with `expected`, compile for sm_90a, and (host) run the compiled code on the host."""
    args = make_args()
    kernel[(1,)](*args, interpret=True, **constexprs)
    assert args[0].tolist() == expected
    kernel.compile(*make_args(), target="sm_90a", **constexprs)
    if host:
        args = make_args()
        run_on_host(kernel, *args, **constexprs)
        assert args[0].tolist() == expected


def _refused(kernel, make_args, words, line: int, source_line: str, **constexprs):
    """Both the interpreter and the sm_90a compiler refuse with a CompilationError naming `words` at `line`."""
    for action in (lambda: kernel[(1,)](*make_args(), interpret=True, **constexprs),
                   lambda: kernel.compile(*make_args(), target="sm_90a", **constexprs)):
        with pytest.raises(CompilationError) as info:
            action()
        text = str(info.value)
        for word in words:
            assert word in text, text
        assert f":{line}:" in text and source_line.strip() in text, text


# ================================================================================================
# DEFECT: tuple == / != with runtime items folded by object identity
# ================================================================================================
def _correct_or_refused(kernel, make_args, expected):
    try:
        args = make_args()
        kernel[(1,)](*args, interpret=True)
    except CompilationError:
        return
    assert args[0].tolist() == expected


@pytest.mark.parametrize("body, args, expected", [
    ("dsl.store(o_ptr, (a, 1) == (b, 1))", (3, 3), [1]),
    ("dsl.store(o_ptr, (a + 0, 1) != (a, 1))", (3, 3), [0]),
])
def test_tuple_equality_with_runtime_items_is_not_identity(body, args, expected):
    kernel = _kernel(f"def k(o_ptr, a, b):\n    {body}\n")
    _correct_or_refused(kernel, lambda: [_i32(1), *args], expected)


def test_constexpr_tuple_equals_runtime_tuple():
    kernel = _kernel("def k(o_ptr, a, S: dsl.constexpr):\n    dsl.store(o_ptr, S == (a, a))\n")
    try:
        out = _i32(1)
        kernel[(1,)](out, 3, S=(3, 3), interpret=True)
    except CompilationError:
        return
    assert out.tolist() == [1]


def test_tuple_ordering_and_membership_with_runtime_items_are_refused():
    kernel = _kernel("def k(o_ptr, a, b):\n    dsl.store(o_ptr, (a, 1) < (b, 1))\n")
    _refused(kernel, lambda: [_i32(1), 3, 4], ["<"], 2, "dsl.store(o_ptr, (a, 1) < (b, 1))")
    kernel = _kernel("def k(o_ptr, a):\n    t = (a, 1)\n    dsl.store(o_ptr, a in t)\n")
    _refused(kernel, lambda: [_i32(1), 3], ["`in`"], 3, "dsl.store(o_ptr, a in t)")


# ================================================================================================
# DEFECT: keyword-only / positional-only parameters are bound like ordinary ones
# ================================================================================================
def _helper(source: str, name: str):
    _COUNT[0] += 1
    return jit_from_source(source, f"<review24 frontend helper {_COUNT[0]}>", name=name)


def test_helper_keyword_only_parameter_refuses_a_positional_argument():
    helper = _helper("def scaled(x, *, scale=2):\n    return x * scale\n", "scaled")
    kernel = _kernel("def k(o_ptr, a):\n    dsl.store(o_ptr, scaled(a, 3))\n", {"scaled": helper})
    with pytest.raises(CompilationError, match="scale|positional"):
        kernel[(1,)](_i32(1), 3, interpret=True)


def test_helper_positional_only_parameter_refuses_a_keyword():
    helper = _helper("def minus(x, /, y):\n    return x - y\n", "minus")
    kernel = _kernel("def k(o_ptr, a):\n    dsl.store(o_ptr, minus(x=a, y=1))\n", {"minus": helper})
    with pytest.raises(CompilationError, match="positional|`x`"):
        kernel[(1,)](_i32(1), 4, interpret=True)


def test_helper_keyword_only_parameter_by_keyword_and_default_works():
    helper = _helper("def scaled(x, *, scale=2):\n    return x * scale\n", "scaled")
    kernel = _kernel("def k(o_ptr, a):\n    dsl.store(o_ptr, scaled(a) + scaled(a, scale=3) * 10)\n", {"scaled": helper})
    _check(kernel, lambda: [_i32(1), 3], [96], host=True)


def test_kernel_keyword_only_parameter_refuses_a_positional_argument():
    kernel = _kernel("def k(o_ptr, *, a):\n    dsl.store(o_ptr, a)\n")
    with pytest.raises(TypeError):
        kernel[(1,)](_i32(1), 4, interpret=True)


def test_kernel_positional_only_parameter_refuses_a_keyword():
    kernel = _kernel("def k(o_ptr, a, /):\n    dsl.store(o_ptr, a)\n")
    with pytest.raises(TypeError):
        kernel[(1,)](_i32(1), a=6, interpret=True)


def test_kernel_keyword_only_parameters_by_keyword_work():
    kernel = _kernel("def k(o_ptr, *, a, B: dsl.constexpr):\n    dsl.store(o_ptr + dsl.arange(0, B), a)\n")
    out = _i32(4)
    kernel[(1,)](out, a=4, B=4, interpret=True)
    assert out.tolist() == [4] * 4
    kernel.compile(_i32(4), a=4, B=4, target="sm_90a")


def test_kernel_star_args_are_refused_at_decoration():
    with pytest.raises(TypeError, match=r"\*args"):
        _kernel("def k(o_ptr, *args):\n    dsl.store(o_ptr, args[0])\n")


# ================================================================================================
# DEFECT: a quoted "dsl.constexpr" annotation under `from __future__ import annotations`
# ================================================================================================
# kernel_source.py has `from __future__ import annotations`, which the compile() in jit_from_source inherits:
# the kernel below is exactly what a module with that import and a quoted annotation defines.
def test_quoted_constexpr_annotation_under_future_annotations():
    kernel = _kernel("def k(o_ptr, B: 'dsl.constexpr'):\n    dsl.store(o_ptr + dsl.arange(0, B), dsl.arange(0, B))\n")
    assert [p.is_constexpr for p in kernel.params] == [False, True]
    out = _i32(4)
    kernel[(1,)](out, B=4, interpret=True)
    assert out.tolist() == [0, 1, 2, 3]


def test_constexpr_annotation_spellings_under_future_annotations():
    kernel = _kernel("def k(o_ptr, A: dsl.constexpr, B: tl.constexpr, C: constexpr):\n"
                     "    dsl.store(o_ptr + dsl.arange(0, A), dsl.arange(0, B) + C)\n",
                     {"tl": dsl, "constexpr": dsl.constexpr})
    assert [p.is_constexpr for p in kernel.params] == [False, True, True, True]
    _check(kernel, lambda: [_i32(4)], [5, 6, 7, 8], A=4, B=4, C=5)


# ================================================================================================
# DEFECT: `and` / `or` on runtime scalars do not short-circuit a load (the ternary does)
# ================================================================================================
_GUARDS = {
    "and": ("    dsl.store(o_ptr, (i < n and dsl.load(x_ptr + i) > 0).to(dsl.int32))\n", [0]),
    "or": ("    dsl.store(o_ptr, (i >= n or dsl.load(x_ptr + i) > 0).to(dsl.int32))\n", [1]),
    "if_and": ("    r = 0\n    if i < n and dsl.load(x_ptr + i) > 0:\n        r = 1\n    dsl.store(o_ptr, r)\n", [0]),
}


@pytest.mark.parametrize("form", sorted(_GUARDS))
def test_boolean_operator_guards_a_load_like_python(form):
    body, expected = _GUARDS[form]
    kernel = _kernel("def k(o_ptr, x_ptr, i, n):\n" + body)
    out = _i32(1)
    kernel[(1,)](out, torch.tensor([7], dtype=torch.int32), 5, 1, interpret=True)   # i=5 is past the end
    assert out.tolist() == expected


def test_ternary_guards_a_load_and_while_with_and_stops_in_bounds():
    kernel = _kernel("def k(o_ptr, x_ptr, i, n):\n    dsl.store(o_ptr, dsl.load(x_ptr + i) if i < n else -1)\n")
    _check(kernel, lambda: [_i32(1), torch.tensor([7], dtype=torch.int32), 5, 1], [-1], host=True)
    kernel = _kernel("def k(o_ptr, x_ptr, n):\n    i = 0\n    while i < n and dsl.load(x_ptr + i) != 0:\n"
                     "        i += 1\n    dsl.store(o_ptr, i)\n")
    _check(kernel, lambda: [_i32(1), torch.tensor([1, 2, 0, 4], dtype=torch.int32), 4], [2], host=True)


# ================================================================================================
# Tricky cases that hold: comparisons and boolean logic
# ================================================================================================
def test_chained_comparisons_on_blocks():
    kernel = _kernel("def k(o_ptr, n):\n    x = dsl.arange(0, 8) - 2\n    dsl.store(o_ptr + dsl.arange(0, 8), (0 <= x < n).to(dsl.int32))\n"
                     "    dsl.store(o_ptr + 8 + dsl.arange(0, 8), (-1 < x < n < 10).to(dsl.int32))\n")
    x = np.arange(8) - 2
    expected = list(((0 <= x) & (x < 3)).astype(int)) + list(((-1 < x) & (x < 3)).astype(int))
    _check(kernel, lambda: [_i32(16), 3], expected)


@pytest.mark.parametrize("a, n, expected", [(3, 5, [1, 1, 0]), (-1, 5, [0, 0, 0]), (5, 5, [0, 1, 0])])
def test_chained_comparisons_on_scalars_and_constant_links(a, n, expected):
    kernel = _kernel("def k(o_ptr, a, n):\n    dsl.store(o_ptr, (0 <= a < n).to(dsl.int32))\n"
                     "    dsl.store(o_ptr + 1, (0 <= a <= n > 3).to(dsl.int32))\n"
                     "    dsl.store(o_ptr + 2, (a < 3 < 2).to(dsl.int32))\n")
    _check(kernel, lambda: [_i32(3), a, n], expected, host=True)


def test_chained_comparison_evaluates_the_middle_operand_once():
    kernel = _kernel("def k(o_ptr, x_ptr):\n    r = 0\n    if 0 < dsl.atomic_add(x_ptr, 1) < 10:\n        r = 1\n"
                     "    dsl.store(o_ptr, r)\n    dsl.store(o_ptr + 1, dsl.load(x_ptr))\n")
    _check(kernel, lambda: [_i32(2), torch.tensor([5], dtype=torch.int32)], [1, 6])


def test_not_and_or_on_blocks_with_floats_nan_and_broadcasting():
    kernel = _kernel("def k(o_ptr, x_ptr):\n    i = dsl.arange(0, 4)\n    x = dsl.load(x_ptr + i)\n"
                     "    dsl.store(o_ptr + i, (not x).to(dsl.int32))\n"
                     "    dsl.store(o_ptr + 4 + i, (x and 1.0).to(dsl.int32))\n"
                     "    dsl.store(o_ptr + 8 + i, ((i < 1) or (i > 2)).to(dsl.int32))\n"
                     "    dsl.store(o_ptr + 12 + i[:, None] * 4 + i[None, :], ((i[:, None] < 2) and (i[None, :] > 1)).to(dsl.int32))\n")
    x = torch.tensor([0.0, -0.0, float("nan"), 2.0])
    grid = [int(r < 2 and c > 1) for r in range(4) for c in range(4)]
    _check(kernel, lambda: [_i32(28), x], [1, 1, 0, 0, 0, 0, 1, 1, 1, 0, 0, 1] + grid)


@pytest.mark.parametrize("a, b", [(2, 0), (0, 3), (0, 0), (4, 5)])
def test_not_and_or_on_runtime_scalars_agree_with_the_compiled_code(a, b):
    kernel = _kernel("def k(o_ptr, a, b):\n    dsl.store(o_ptr, (not a).to(dsl.int32))\n"
                     "    dsl.store(o_ptr + 1, (a and b).to(dsl.int32))\n    dsl.store(o_ptr + 2, (a or b).to(dsl.int32))\n"
                     "    dsl.store(o_ptr + 3, (not (a > b)).to(dsl.int32))\n")
    _check(kernel, lambda: [_i32(4), a, b], [int(not a), int(bool(a and b)), int(bool(a or b)), int(not a > b)], host=True)


def test_float_truth_of_runtime_values_nan_is_true():
    kernel = _kernel("def k(o_ptr, x_ptr):\n    x = dsl.load(x_ptr)\n    r = 0\n    if x:\n        r = 1\n"
                     "    dsl.store(o_ptr, r)\n    dsl.store(o_ptr + 1, (not x).to(dsl.int32))\n"
                     "    dsl.store(o_ptr + 2, 1 if x else 2)\n")
    for value, expected in [(float("nan"), [1, 0, 1]), (-0.0, [0, 1, 2]), (0.25, [1, 0, 1])]:
        _check(kernel, lambda: [_i32(3), torch.tensor([value])], expected, host=True)


def test_constexpr_boolean_operators_keep_python_values():
    kernel = _kernel("def k(o_ptr, a, A: dsl.constexpr, B: dsl.constexpr, T: dsl.constexpr):\n"
                     "    dsl.store(o_ptr, A and B)\n    dsl.store(o_ptr + 1, (T and a > 0).to(dsl.int32))\n"
                     "    dsl.store(o_ptr + 2, (not T) + 2)\n")
    _check(kernel, lambda: [_i32(3), 3], [5, 1, 2], A=3, B=5, T=True)


# ================================================================================================
# is None, constexpr arithmetic and builtins, shape / dtype, methods
# ================================================================================================
def test_is_none_tests_of_constexpr_and_pointer_arguments():
    kernel = _kernel("def k(o_ptr, b_ptr, B: dsl.constexpr = None):\n    r = 0\n    if B is None:\n        r += 1\n"
                     "    if B is not None:\n        r += B\n    if b_ptr is not None:\n        r += dsl.load(b_ptr) * 100\n"
                     "    dsl.store(o_ptr, r)\n")
    _check(kernel, lambda: [_i32(1), None], [1])
    _check(kernel, lambda: [_i32(1), None], [5], B=5)
    _check(kernel, lambda: [_i32(1), torch.tensor([2], dtype=torch.int32)], [205], B=5)


def test_constexpr_arithmetic_and_python_builtins():
    kernel = _kernel("def k(o_ptr, A: dsl.constexpr, B: dsl.constexpr):\n"
                     "    dsl.store(o_ptr, min(A, B) + max(A, B, 2) * 10 + abs(A - B) * 100 + len((A, B, 1)) * 1000)\n"
                     "    dsl.store(o_ptr + 1, int(A / B * 10) + int(bool(A)) * 100 + int(float(B) * 2))\n"
                     "    dsl.store(o_ptr + 2, A ** 2 + (1 << A) + (-A // B) + (-A % B))\n"
                     "    dsl.store(o_ptr + 3, dsl.cdiv(B * 3 + 1, A))\n")
    _check(kernel, lambda: [_i32(4)], [3341, 2 + 100 + 8, 1 + 2 + (-1) + 3, 13], A=1, B=4)


def test_python_builtins_on_runtime_values_are_refused_with_a_hint():
    # (min / max of two or more kernel values are dsl.minimum / maximum since session 26; of one, refused)
    kernel = _kernel("def k(o_ptr, a):\n    dsl.store(o_ptr, min(a))\n")
    _refused(kernel, lambda: [_i32(1), 3], ["min()", "dsl.minimum"], 2, "dsl.store(o_ptr, min(a))")


def test_shape_dtype_len_and_pointer_element_type():
    kernel = _kernel("def k(o_ptr, x_ptr):\n    z = dsl.zeros((4, 8), dsl.float32)\n    M, N = z.shape\n"
                     "    x = dsl.load(x_ptr)\n    r = M * 100 + z.shape[1] + len(z.shape) * 1000 + len(dsl.arange(0, 16)) * 10000\n"
                     "    if x.dtype == dsl.float16:\n        r += 100000\n    if o_ptr.dtype.element_ty is dsl.int32:\n"
                     "        r += 200000\n    dsl.store(o_ptr, r + x.dtype.bits * 1000000 + len(x.shape))\n")
    _check(kernel, lambda: [_i32(1), torch.ones(1, dtype=torch.float16)], [16 * 1000000 + 300000 + 160000 + 2408])


def test_method_forms_of_block_builtins():
    kernel = _kernel("def k(o_ptr, x_ptr):\n    x = dsl.arange(0, 8).reshape((4, 2))\n"
                     "    dsl.store(o_ptr + dsl.arange(0, 2), x.sum(axis=0))\n"
                     "    dsl.store(o_ptr + 2, x.max(0).sum() * 10 + x.min(axis=1).argmax(0))\n"
                     "    t = x.trans()\n    dsl.store(o_ptr + 3 + dsl.arange(0, 2)[:, None] * 4 + dsl.arange(0, 4)[None, :], t)\n"
                     "    y = dsl.arange(0, 4).expand_dims(0).broadcast_to((2, 4))\n"
                     "    dsl.store(o_ptr + 11 + dsl.arange(0, 4), y.sum(0) + dsl.arange(0, 4).cumsum(0))\n"
                     "    f = dsl.load(x_ptr)\n    dsl.store(o_ptr + 15, f.to(dsl.int32, bitcast=True) - 0x3f800000 + (f * 2.5).to(dsl.int32))\n")
    x = np.arange(8).reshape(4, 2)
    expected = list(x.sum(0)) + [int(x.max(0).sum()) * 10 + int(x.min(1).argmax())] + list(x.T.reshape(-1)) \
        + list(2 * np.arange(4) + np.cumsum(np.arange(4))) + [2]
    _check(kernel, lambda: [_i32(16), torch.tensor([1.0])], expected)


@pytest.mark.parametrize("expr, words", [("x.shape_", ["`shape_`", ".trans()"]), ("x.reshape(2, 2)", ["reshape"]),
                                         ("x[0]", ["indexed"]), ("x[1:3]", ["indexed"]), ("x[None, ...]", ["ellipsis"])])
def test_unsupported_block_forms_are_clear_errors(expr, words):
    kernel = _kernel(f"def k(o_ptr):\n    x = dsl.arange(0, 8)\n    y = {expr}\n")
    _refused(kernel, lambda: [_i32(1)], words, 3, f"y = {expr}")


# ================================================================================================
# assignments, tuples, nested jit functions
# ================================================================================================
def test_augmented_assignment_on_blocks_and_scalars():
    kernel = _kernel("def k(o_ptr, s, a, b):\n    x = dsl.arange(0, 4) + 10\n    x += 3\n    x -= 1\n    x *= 2\n"
                     "    x //= 3\n    x %= 7\n    x <<= 2\n    x &= 0xC\n    x |= 1\n    x ^= 2\n    x >>= 1\n"
                     "    s += x.sum()\n    s -= 1\n    s *= 3\n    s //= 2\n    a //= b\n    a %= 5\n"
                     "    dsl.store(o_ptr + dsl.arange(0, 4), x)\n    dsl.store(o_ptr + 4, s)\n    dsl.store(o_ptr + 5, a)\n")
    x = np.arange(4) + 10
    x += 3; x -= 1; x *= 2; x //= 3; x %= 7; x <<= 2; x &= 0xC; x |= 1; x ^= 2; x >>= 1   # noqa: E702
    s = ((5 + int(x.sum()) - 1) * 3) // 2
    _check(kernel, lambda: [_i32(6), 5, -7, 2], list(x) + [s, -3])     # -7 // 2 truncates (C): -3; -3 % 5 = -3


def test_augmented_assignment_of_a_float_to_an_int_scalar_and_of_constexprs():
    kernel = _kernel("def k(o_ptr, a, A: dsl.constexpr):\n    a += 1.5\n    B = A\n    B += 2\n    B *= 3\n"
                     "    dsl.store(o_ptr, a)\n    dsl.store(o_ptr + 1, B)\n")
    _check(kernel, lambda: [_f32(2), 3], [4.5, 15.0], A=3)


def test_tuple_unpacking_swaps_and_chained_assignment():
    kernel = _kernel("def k(o_ptr, a, b):\n    a, b = b, a\n    (c, d), e = (a * 2, a + b), 1\n    f = g = b\n"
                     "    t = (a,) + (b + 1,)\n    dsl.store(o_ptr, a * 10 + b)\n    dsl.store(o_ptr + 1, c + d + e + f + g + t[1])\n")
    _check(kernel, lambda: [_i32(2), 1, 2], [21, 4 + 3 + 1 + 1 + 1 + 2], host=True)


def test_unpacking_errors_are_clear():
    kernel = _kernel("def k(o_ptr):\n    a, b = dsl.arange(0, 2)\n")
    _refused(kernel, lambda: [_i32(1)], ["unpack"], 2, "a, b = dsl.arange(0, 2)")
    kernel = _kernel("def k(o_ptr):\n    t = (1, 2)\n    t[0] += 1\n")
    _refused(kernel, lambda: [_i32(1)], ["immutable"], 3, "t[0] += 1")


def _helpers():
    namespace = {}
    for name, source in [("two", "def two(x, y):\n    return x + y, x * y\n"),
                         ("nested", "def nested(x):\n    a, b = two(x, x)\n    return two(a, b)\n"),
                         ("single", "def single(x):\n    return (x,)\n"),
                         ("cond", "def cond(x, c):\n    if c > 0:\n        return x + 1, x\n    return x - 1, x\n"),
                         ("nothing", "def nothing(x):\n    return\n"),
                         ("maybe", "def maybe(x, B: dsl.constexpr = None):\n    if B is None:\n        return x\n    return x + B\n")]:
        _COUNT[0] += 1
        namespace[name] = jit_from_source(source, f"<review24 frontend helper {_COUNT[0]}>", name=name, namespace=namespace)
    return namespace


@pytest.mark.parametrize("c", [0, 1])
def test_tuples_returned_by_nested_jit_functions(c):
    kernel = _kernel("def k(o_ptr, a, c):\n    s, p = nested(a)\n    (q,) = single(a)\n    r = two(a, 2)\n    u, v = cond(a, c)\n"
                     "    w, z = two(*(a, 2))\n    dsl.store(o_ptr, s * 100 + p)\n    dsl.store(o_ptr + 1, q + r[0] * 10 + r[1] * 100)\n"
                     "    dsl.store(o_ptr + 2, u * 10 + v)\n    dsl.store(o_ptr + 3, w * 10 + z + maybe(a) * 100 + maybe(a, 4) * 1000)\n",
                     _helpers())
    _check(kernel, lambda: [_i32(4), 3, c], [1554, 3 + 50 + 600, (43 if c else 23), 56 + 300 + 7000], host=True)


def test_using_the_none_a_helper_returns_is_a_clear_error():
    kernel = _kernel("def k(o_ptr, a):\n    s, p = nothing(a)\n", _helpers())
    _refused(kernel, lambda: [_i32(1), 3], ["unpack", "None"], 2, "s, p = nothing(a)")


# ================================================================================================
# loops
# ================================================================================================
def test_static_range_with_start_stop_step_and_tuple_indexing():
    kernel = _kernel("def k(o_ptr):\n    acc = 0\n    for i in dsl.static_range(1, 10, 3):\n        acc = acc * 10 + i\n"
                     "    down = 0\n    for i in dsl.static_range(5, 0, -2):\n        down = down * 10 + i\n"
                     "    t = (3, 5, 7)\n    blk = dsl.zeros((4,), dsl.int32)\n    for j in dsl.static_range(len(t)):\n        blk += t[j]\n"
                     "    pairs = 0\n    for a, b in ((1, 3), (2, 4)):\n        pairs += a * b\n"
                     "    dsl.store(o_ptr, acc)\n    dsl.store(o_ptr + 1, down)\n    dsl.store(o_ptr + 2, pairs)\n"
                     "    dsl.store(o_ptr + 3 + dsl.arange(0, 4), blk)\n")
    _check(kernel, lambda: [_i32(7)], [147, 531, 11, 15, 15, 15, 15])


@pytest.mark.parametrize("start, stop, step", [(1, 8, 3), (7, 0, -3), (3, 1, 1), (10, 0, -4)])
def test_range_with_runtime_bounds_and_steps(start, stop, step):
    kernel = _kernel("def k(o_ptr, a, b, s):\n    acc = 0\n    for i in range(a, b, s):\n        acc = acc * 10 + i\n"
                     "    dsl.store(o_ptr, acc)\n")
    expected = 0
    for i in range(start, stop, step):
        expected = expected * 10 + i
    _check(kernel, lambda: [_i32(1), start, stop, step], [expected], host=True)


def test_range_with_constexpr_and_shape_bounds_and_carried_tuples():
    kernel = _kernel("def k(o_ptr, n, N: dsl.constexpr):\n    acc = 0\n    for i in range(2, N, 2):\n        acc += i\n"
                     "    x = dsl.arange(0, 8)\n    s = 0\n    for i in range(x.shape[0]):\n        s += i\n"
                     "    a, b = 0, 1\n    for i in range(n):\n        a, b = b, a + b\n    t = (0, 1)\n"
                     "    for i in range(n):\n        t = (t[1], t[0] + t[1])\n    f = 0\n    for i in range(n):\n        f += 0.5\n"
                     "    dsl.store(o_ptr, acc)\n    dsl.store(o_ptr + 1, s)\n    dsl.store(o_ptr + 2, a + t[0])\n    dsl.store(o_ptr + 3, f)\n")
    _check(kernel, lambda: [_i32(4), 10], [20, 28, 110, 5], host=True, N=10)


def test_while_loops_with_chained_and_not_conditions():
    kernel = _kernel("def k(o_ptr, n, a, b):\n    i = 0\n    while 0 <= i < n and i != 3:\n        i += 1\n"
                     "    j = 0\n    done = j >= n\n    while not done:\n        j += 2\n        done = j >= n\n"
                     "    while b != 0:\n        a, b = b, a % b\n    c = 0\n    while False:\n        c += 1\n"
                     "    dsl.store(o_ptr, i * 1000 + j * 100 + a + c)\n")
    _check(kernel, lambda: [_i32(1), 5, 48, 18], [3000 + 600 + 6], host=True)


@pytest.mark.parametrize("body, words, line, text", [
    ("    for i in range(n):\n        if i == 2:\n            break\n", ["`break`"], 4, "break"),
    ("    for i in dsl.static_range(4):\n        if i == 2:\n            break\n", ["`break`"], 4, "break"),
    ("    for i in range(n):\n        if i == 2:\n            continue\n", ["`continue`"], 4, "continue"),
    ("    while True:\n        n += 1\n", ["always true"], 2, "while True:"),
    ("    for i in range(n):\n        pass\n    dsl.store(o_ptr, i)\n", ["`i`", "after the loop"], 4, "dsl.store(o_ptr, i)"),
    ("    for i, v in enumerate((1, 2)):\n        pass\n", ["enumerate"], 2, "for i, v in enumerate((1, 2)):"),
    ("    for i in dsl.static_range(0, 4, step=2):\n        pass\n", ["range()"], 2, "for i in dsl.static_range(0, 4, step=2):"),
])
def test_loop_constructs_that_are_refused(body, words, line, text):
    kernel = _kernel("def k(o_ptr, n):\n" + body)
    _refused(kernel, lambda: [_i32(1), 5], words, line, text)


# ================================================================================================
# statements and expressions that are refused (clear errors naming them at their line)
# ================================================================================================
@pytest.mark.parametrize("statement, words", [
    ("s = f'{a}'", ["f-strings"]),
    ("f = lambda v: v + 1", ["lambda"]),
    ("def f(v):\n        return v", ["nested function"]),
    ("del a", ["del"]),
    ("with ctx():\n        pass", ["`with`"]),
    ("try:\n        pass\n    except Exception:\n        pass", ["try"]),
    ("if (b := a + 1) > 0:\n        pass", ["`:=`"]),
    ("global Q", ["global"]),
    ("import math", ["import"]),
    ("t = [i for i in (1, 2)]", ["list comprehensions"]),
    ("t = {1: 2}", ["dicts"]),
    ("b: int = a", ["annotation"]),
    ("b: dsl.int32", ["bare annotation"]),
    ("dsl.static_assert(a > 0)", ["static_assert"]),
    ("r = math.sqrt(4)", ["math.sqrt", "@dsl.jit"]),
    ("assert a > 0, f'a={a}'", ["f-strings"]),
    ("r = a in (1, 2)", ["`in`"]),
])
def test_unsupported_statements_name_the_construct_and_line(statement, words):
    kernel = _kernel(f"def k(o_ptr, a):\n    {statement}\n", {"ctx": lambda: None, "math": __import__("math")})
    _refused(kernel, lambda: [_i32(1), 3], words, 2, statement.splitlines()[0])


def test_assert_on_constexpr_runtime_scalars_and_blocks():
    kernel = _kernel("def k(o_ptr, a, B: dsl.constexpr):\n    assert B % 2 == 0, 'B even'\n    assert a > 0, 'a positive'\n"
                     "    dsl.device_assert(dsl.arange(0, 4) < a + 4, 'in range')\n    assert dsl.arange(0, 4) < a + 4\n"
                     "    dsl.store(o_ptr, a + B)\n")
    _check(kernel, lambda: [_i32(1), 3], [7], B=4)
    _refused(kernel, lambda: [_i32(1), 3], ["compile-time assertion failed: B even"], 2,
             "assert B % 2 == 0, 'B even'", B=3)
    with pytest.raises(Exception, match="a positive"):
        kernel[(1,)](_i32(1), -3, B=4, interpret=True)


def test_print_and_device_print(capsys):
    kernel = _kernel("def k(o_ptr, a, B: dsl.constexpr):\n    print('a is', a)\n    print('B', B)\n"
                     "    dsl.device_print('x ', dsl.arange(0, 2) + a)\n    dsl.store(o_ptr, a)\n")
    _check(kernel, lambda: [_i32(1), 3], [3], B=5)
    out = capsys.readouterr().out
    assert "a is 3" in out and "B 5" in out and "[3, 4]" in out


# ================================================================================================
# globals, if / ternaries, names
# ================================================================================================
_GLOBALS = {"GI": 7, "GF": 0.5, "GC": dsl.constexpr(4), "GT": (1, 2, 3), "GD": dsl.float16, "GB": True, "GN": None,
            "GS": "abc", "GCT": dsl.constexpr((2, 4)), "GL": [1, 2], "GTEN": torch.ones(2), "GNP": np.int32(3)}


def test_global_constants_read_by_kernels():
    kernel = _kernel("def k(o_ptr, x_ptr):\n    dsl.store(o_ptr, GI + GF)\n    dsl.store(o_ptr + 1 + dsl.arange(0, GC), dsl.arange(0, GC).to(dsl.float32))\n"
                     "    dsl.store(o_ptr + 5, GT[1] + len(GT))\n    z = dsl.zeros(GCT, dsl.int32) + 1\n    dsl.store(o_ptr + 6, z.sum(1).sum(0))\n"
                     "    dsl.store(o_ptr + 7, dsl.load(x_ptr).to(GD).to(dsl.float32))\n"
                     "    if GB and GN is None and GS == 'abc':\n        dsl.store(o_ptr + 8, 1.0)\n", _GLOBALS)
    _check(kernel, lambda: [_f32(9), torch.tensor([1.0009765625 * 1.0001])], [7.5, 0, 1, 2, 3, 5, 8, 1.0009765625, 1.0])


@pytest.mark.parametrize("name, kind", [("GL", "list"), ("GTEN", "Tensor"), ("GNP", "int32")])
def test_global_data_is_refused_with_its_type(name, kind):
    kernel = _kernel(f"def k(o_ptr):\n    dsl.store(o_ptr, {name}[0] if False else {name})\n", _GLOBALS)
    _refused(kernel, lambda: [_i32(1)], [f"global `{name}`", kind], 2, f"dsl.store(o_ptr, {name}[0] if False else {name})")


@pytest.mark.parametrize("half", [False, True])
def test_constexpr_if_may_change_a_variables_type_and_kind(half):
    kernel = _kernel("def k(o_ptr, x_ptr, HALF: dsl.constexpr):\n    x = dsl.load(x_ptr)\n    if HALF:\n        x = x.to(dsl.float16)\n"
                     "        v = (1, 2)\n    else:\n        x = x * 2\n        v = 3\n"
                     "    w = v[1] if HALF else v\n    dsl.store(o_ptr, x + w)\n    dsl.store(o_ptr + 1, 1.5 if HALF else 2)\n")
    _check(kernel, lambda: [_f32(2), torch.tensor([1.5])], [3.5, 1.5] if half else [6.0, 2.0], HALF=half)


@pytest.mark.parametrize("c", [0, 1])
def test_runtime_if_merges_literals_into_one_type(c):
    kernel = _kernel("def k(o_ptr, x_ptr, c):\n    if c > 0:\n        y = dsl.load(x_ptr)\n    else:\n        y = 0\n"
                     "    if c > 0:\n        z = 1\n    else:\n        z = 2.5\n    if c > 0:\n        t = True\n    else:\n        t = False\n"
                     "    dsl.store(o_ptr, y)\n    dsl.store(o_ptr + 1, z)\n    dsl.store(o_ptr + 2, t.to(dsl.float32))\n")
    _check(kernel, lambda: [_f32(3), torch.tensor([1.5]), c], [1.5, 1.0, 1.0] if c else [0.0, 2.5, 0.0])


@pytest.mark.parametrize("body, words, line, text", [
    ("    x = dsl.load(x_ptr)\n    if c > 0:\n        x = x.to(dsl.float16)\n    dsl.store(o_ptr, x)\n",
     ["`x`", "float16", "float32"], 3, "if c > 0:"),
    ("    if c > 0:\n        y = 1\n    dsl.store(o_ptr, y)\n", ["`y`", "only one branch"], 4, "dsl.store(o_ptr, y)"),
    ("    y = dsl.load(x_ptr).to(dsl.int8)\n    if c > 0:\n        y = 300\n    dsl.store(o_ptr, y)\n", ["`y`", "int8", "300"], 3,
     "if c > 0:"),
    ("    x = dsl.arange(0, 4)\n    dsl.store(o_ptr + x, 1.0 if x > 1 else 0.0)\n", ["dsl.where"], 3,
     "dsl.store(o_ptr + x, 1.0 if x > 1 else 0.0)"),
    ("    x = dsl.arange(0, 4)\n    if x > 1:\n        pass\n", ["dsl.where"], 3, "if x > 1:"),
])
def test_runtime_if_errors_name_the_variable_and_line(body, words, line, text):
    kernel = _kernel("def k(o_ptr, x_ptr, c):\n" + body)
    _refused(kernel, lambda: [_f32(4), torch.ones(4), 1], words, line, text)


@pytest.mark.parametrize("a", [-3, 0, 4])
def test_ternaries_on_runtime_scalars(a):
    kernel = _kernel("def k(o_ptr, x_ptr, a):\n    dsl.store(o_ptr, a * 2 if a > 0 else -a)\n"
                     "    dsl.store(o_ptr + 1, 1 if a < 0 else (2 if a == 0 else 3))\n"
                     "    dsl.store(o_ptr + 2, (1.5 if a > 0 else a).to(dsl.int32))\n"
                     "    dsl.store(o_ptr + 3, (dsl.load(x_ptr) if a > 0 else 2.5).to(dsl.int32))\n")
    expected = [a * 2 if a > 0 else -a, 1 if a < 0 else (2 if a == 0 else 3), int(1.5 if a > 0 else a), 7 if a > 0 else 2]
    _check(kernel, lambda: [_i32(4), torch.tensor([7.0]), a], expected, host=True)


@pytest.mark.parametrize("a, b", [(1, 1), (1, 0), (0, 0), (-1, 0)])
def test_early_returns_in_runtime_ifs(a, b):
    kernel = _kernel("def k(o_ptr, a, b):\n    x = 1\n    if a > 0:\n        x = 2\n        if b > 0:\n            return\n"
                     "        dsl.store(o_ptr, 3)\n    elif a == 0:\n        dsl.store(o_ptr + 1, 4)\n    else:\n        return\n"
                     "    dsl.store(o_ptr + 2, x)\n")
    expected = {(1, 1): [0, 0, 0], (1, 0): [3, 0, 2], (0, 0): [0, 4, 1], (-1, 0): [0, 0, 0]}[(a, b)]
    _check(kernel, lambda: [_i32(3), a, b], expected, host=True)


def test_shadowed_builtins_docstrings_annotations_and_pass():
    kernel = _kernel("def k(o_ptr, len, sum):\n    '''Docstring.'''\n    min = len + 1\n    'a string statement'\n"
                     "    range = dsl.static_range\n    acc = 0\n    for i in range(3):\n        acc += i\n"
                     "    b: dsl.float32 = min\n    B: dsl.constexpr = 4\n    h: dsl.float16 = dsl.arange(0, B)\n"
                     "    if len > 0:\n        pass\n    else:\n        acc = 0\n"
                     "    dsl.store(o_ptr, b / 2 + acc + sum + h.to(dsl.float32).sum(0) + dsl.sum(dsl.arange(0, B), 0))\n")
    _check(kernel, lambda: [_f32(1), 3, 10], [2.0 + 3 + 10 + 6 + 6])


@pytest.mark.parametrize("form", sorted(_GUARDS))
@pytest.mark.parametrize("i, n", [(5, 1), (0, 1)])
def test_boolean_operator_guarding_a_load_compiles_and_agrees_on_the_host(form, i, n):
    """The short-circuit `if` of `and` / `or` (frontend/expressions.py `_runtime_bool_op`), interpreted and
    compiled (sm_90a PTX; the host-JIT run of the same IR), for a guard that holds and one that does not."""
    body, expected_past_the_end = _GUARDS[form]
    kernel = _kernel("def k(o_ptr, x_ptr, i, n):\n" + body)
    expected = expected_past_the_end if i >= n else [1]
    _check(kernel, lambda: [_i32(1), torch.tensor([7], dtype=torch.int32), i, n], expected, host=True)
