"""Review (session 21, the DSL): a fresh reviewer tried to break `fusedops.dsl` on the CPU the way users
broke Triton (integer division / modulo / shifts of negative and unsigned values over every pair of integer
dtypes, the compiled lowering of the same rules run on the host, reductions / argmin / cumsum over size-1
axes with keep_dims, dot at small and odd shapes and dtypes, atomics per dtype and arch, frontend constructs
that Triton users reach for (builtins, chained comparisons, break / continue, recursion, default and None
arguments), passes checked by interpreting the IR before and after the pipeline, 64-bit address math, grid
limits).

Defect found: `dsl.cdiv` of runtime ints computed (x + d - 1) // d in the operands' type, which wraps near the
type's max (uint8 cdiv(250, 10) gave 0); fixed (x // d, plus 1 where the remainder is positive). The other tests
pin behaviour that held.
"""

from __future__ import annotations

import itertools
import random
import re

import numpy as np
import pytest
import torch

import fusedops.dsl as dsl
from codegen_helpers import interpret_ir, pipelined_ir
from fusedops.dsl.target import assemble, ptxas_available
from host_jit import run_on_host
from kernel_source import jit_from_source

ARCHS = ("sm_80", "sm_90a")


def _assemble(compiled, arch):
    if ptxas_available():
        assemble(compiled.asm["ptx"], arch)


# ================================================================================================
# Defect: dsl.cdiv on runtime values overflows in the narrow operand type.
# `dsl.cdiv(x, d)` with runtime x, d is lowered as `(x + d - 1) // d` in the promoted type of x and d
# (language/elementwise_builtins.py `cdiv`). Its docstring promises ceiling division "for non-negative x and positive
# div", but for uint8 x = 250, d = 10 the intermediate x + d wraps (260 -> 4) and the result is 0 instead
# of 25; int8 100 / 64 gives -1 instead of 2; int32 2**31 - 10 / 64 gives -33554431. Expected: the ceiling
# quotient whenever it is representable (e.g. x // d + (x % d != 0), which cannot overflow).
# ================================================================================================
@dsl.jit
def _cdiv_kernel(o_ptr, x_ptr, d_ptr, N: dsl.constexpr):
    i = dsl.arange(0, N)
    dsl.store(o_ptr + i, dsl.cdiv(dsl.load(x_ptr + i), dsl.load(d_ptr + i)).to(dsl.int64))


@pytest.mark.parametrize("dtype,xs,ds", [
    (torch.uint8, [250, 255, 7, 0], [10, 2, 3, 5]),
    (torch.int8, [100, 127, 7, 0], [64, 2, 3, 5]),
    (torch.int32, [2**31 - 10, 2**31 - 1, 7, 0], [64, 2, 3, 5]),
    (torch.int32, [-7, -1, -64, -65], [2, 64, 64, 64]),       # negative x: still the ceiling
    (torch.int64, [2**63 - 1, 2**63 - 2, -(2**63), 1], [2, 3, 7, 2**62]),
], ids=str)
def test_cdiv_of_runtime_values_near_the_types_max(dtype, xs, ds):
    x, d, out = torch.tensor(xs, dtype=dtype), torch.tensor(ds, dtype=dtype), torch.zeros(4, dtype=torch.int64)
    _cdiv_kernel[(1,)](out, x, d, N=4, interpret=True)
    assert out.tolist() == [-(-a // b) for a, b in zip(xs, ds)]


def test_cdiv_of_small_runtime_values_and_constexprs():
    x, d = torch.tensor([0, 1, 64, 65], dtype=torch.int32), torch.tensor([64, 64, 64, 7], dtype=torch.int32)
    out = torch.zeros(4, dtype=torch.int64)
    _cdiv_kernel[(1,)](out, x, d, N=4, interpret=True)
    assert out.tolist() == [0, 1, 1, 10]
    assert dsl.cdiv(1000, 64) == 16 and dsl.cdiv(0, 7) == 0


# ================================================================================================
# Integer rules over every pair of integer dtypes (promotion, C division, shifts), against Python ints
# ================================================================================================
_TD = {"int8": torch.int8, "uint8": torch.uint8, "int16": torch.int16, "uint16": torch.uint16,
       "int32": torch.int32, "uint32": torch.uint32, "int64": torch.int64, "uint64": torch.uint64}
_BITS = {k: int(re.search(r"\d+", k).group()) for k in _TD}
_OPS = ["div", "mod", "shl", "shr", "lt", "mul", "max", "and", "xor"]


@dsl.jit
def _binary(a, b, OP: dsl.constexpr):
    if OP == "div":
        r = a // b
    elif OP == "mod":
        r = a % b
    elif OP == "shl":
        r = a << b
    elif OP == "shr":
        r = a >> b
    elif OP == "lt":
        r = a < b
    elif OP == "mul":
        r = a * b
    elif OP == "max":
        r = dsl.maximum(a, b)
    elif OP == "and":
        r = a & b
    else:
        r = a ^ b
    return r


@dsl.jit
def _binary_kernel(o_ptr, a_ptr, b_ptr, N: dsl.constexpr, OP: dsl.constexpr):
    i = dsl.arange(0, N)
    dsl.store(o_ptr + i, _binary(dsl.load(a_ptr + i), dsl.load(b_ptr + i), OP))


@dsl.jit
def _scalar_binary_kernel(o_ptr, a_ptr, b_ptr, N: dsl.constexpr, OP: dsl.constexpr):
    for j in dsl.static_range(N):
        dsl.store(o_ptr + j, _binary(dsl.load(a_ptr + j), dsl.load(b_ptr + j), OP))


def _promote(a, b):
    if a == b:
        return a
    if _BITS[a] != _BITS[b]:
        return a if _BITS[a] > _BITS[b] else b
    return a if a.startswith("u") else b


def _wrap(v, t):
    bits = _BITS[t]
    v &= (1 << bits) - 1
    if not t.startswith("u") and v >= 1 << (bits - 1):
        v -= 1 << bits
    return v


def _reference(op, x, y, t):
    bits, signed = _BITS[t], not t.startswith("u")
    x, y = _wrap(x, t), _wrap(y, t)
    if op == "div":
        if y == 0:
            return _wrap(-1, t)
        q = abs(x) // abs(y)
        return _wrap(q if (x >= 0) == (y >= 0) else -q, t)
    if op == "mod":
        if y == 0:
            return x
        r = abs(x) % abs(y)
        return _wrap(r if x >= 0 else -r, t)
    if op in ("shl", "shr"):
        amount = y & ((1 << bits) - 1)
        if op == "shl":
            return 0 if amount >= bits else _wrap(x << amount, t)
        return (-1 if signed and x < 0 else 0) if amount >= bits else x >> amount
    return {"lt": lambda: x < y, "mul": lambda: _wrap(x * y, t), "max": lambda: max(x, y),
            "and": lambda: _wrap(x & y, t), "xor": lambda: _wrap(x ^ y, t)}[op]()


def _samples(rng, t, n):
    bits = _BITS[t]
    lo = 0 if t.startswith("u") else -(1 << (bits - 1))
    hi = (1 << bits) - 1 + lo
    specials = [lo, hi, 0, 1, -1 if lo < 0 else 2, lo + 1, hi - 1, 7, -7 if lo < 0 else 9, bits, bits - 1, bits + 1]
    return [rng.choice(specials) if rng.random() < 0.6 else rng.randint(lo, hi) for _ in range(n)]


def _tensor(values, t):
    raw = np.array([_wrap(v, t) & ((1 << _BITS[t]) - 1) for v in values], dtype=np.uint64)
    return torch.from_numpy(raw.astype(np.dtype(f"u{_BITS[t] // 8}"))).view(_TD[t])


def _as_ints(t: torch.Tensor, name):
    if name == "uint64":
        return [int(v) for v in t.view(torch.int64).numpy().view(np.uint64).tolist()]
    return [int(v) for v in t.tolist()]


@pytest.mark.parametrize("ta", list(_TD))
def test_integer_rules_for_every_dtype_pair_interpreted(ta):
    rng = random.Random(hash(ta) % 1000 + 21)
    for tb in _TD:
        t = _promote(ta, tb)
        for op in _OPS:
            xs, ys = _samples(rng, ta, 16), _samples(rng, tb, 16)
            out = torch.zeros(16, dtype=torch.bool if op == "lt" else _TD[t])
            _binary_kernel[(1,)](out, _tensor(xs, ta), _tensor(ys, tb), N=16, OP=op, interpret=True)
            got = [bool(v) for v in out.tolist()] if op == "lt" else _as_ints(out, t)
            expected = [_reference(op, x, y, t) for x, y in zip(xs, ys)]
            if op != "lt":
                expected = [_wrap(e, t) for e in expected]
            assert got == expected, (ta, tb, op, xs, ys)


@pytest.mark.parametrize("ta,tb", [("uint64", "int64"), ("int64", "int64"), ("uint32", "int32"),
                                   ("uint8", "int8"), ("uint32", "int64"), ("int16", "uint8")])
def test_integer_rules_compiled_on_the_host_match_the_interpreter(ta, tb):
    rng = random.Random(_BITS[ta] * 31 + _BITS[tb])
    t = _promote(ta, tb)
    for op in ["div", "mod", "shl", "shr", "lt", "max", "mul"]:
        xs, ys = _samples(rng, ta, 12), _samples(rng, tb, 12)
        a, b = _tensor(xs, ta), _tensor(ys, tb)
        dtype = torch.bool if op == "lt" else _TD[t]
        interpreted, compiled = torch.zeros(12, dtype=dtype), torch.ones(12, dtype=dtype)
        _scalar_binary_kernel[(1,)](interpreted, a, b, N=12, OP=op, interpret=True)
        run_on_host(_scalar_binary_kernel, compiled, a, b, N=12, OP=op)
        assert torch.equal(compiled, interpreted), (ta, tb, op, xs, ys)
        expected = [_reference(op, x, y, t) for x, y in zip(xs, ys)]
        got = [bool(v) for v in interpreted.tolist()] if op == "lt" else _as_ints(interpreted, t)
        assert got == (expected if op == "lt" else [_wrap(e, t) for e in expected])


def test_literal_only_integer_arithmetic_is_python_and_block_arithmetic_is_c():
    @dsl.jit
    def fold(o_ptr, N: dsl.constexpr):
        dsl.store(o_ptr + 0, (-7) // 2)           # compile-time Python value (Triton constexpr rules)
        dsl.store(o_ptr + 1, (-7) % 2)
        x = dsl.full((2,), -7, dsl.int32)
        dsl.store(o_ptr + 2 + dsl.arange(0, 2), x // 2)  # runtime: C truncation
        dsl.store(o_ptr + 4 + dsl.arange(0, 2), x % 2)
        dsl.store(o_ptr + 6, N // -2)

    out = torch.zeros(7, dtype=torch.int64)
    fold[(1,)](out, N=-7, interpret=True)
    assert out.tolist() == [-4, 1, -3, -3, -1, -1, 3]


# ================================================================================================
# Reductions, scans and arg-reductions on tiny / degenerate shapes compile and assemble
# ================================================================================================
@dsl.jit
def _reduce_kernel(o_ptr, x_ptr, M: dsl.constexpr, N: dsl.constexpr, OP: dsl.constexpr, AX: dsl.constexpr,
                   KD: dsl.constexpr):
    r = dsl.arange(0, M)[:, None]
    c = dsl.arange(0, N)[None, :]
    x = dsl.load(x_ptr + r * N + c)
    if OP == "sum":
        y = dsl.sum(x, axis=AX, keep_dims=KD)
    elif OP == "max":
        y = dsl.max(x, axis=AX, keep_dims=KD)
    elif OP == "argmin":
        y = dsl.argmin(x, axis=AX, keep_dims=KD)
    else:
        y = dsl.cumsum(x, axis=AX)
    if AX is None:
        dsl.store(o_ptr, dsl.sum(y) if KD else y)
    elif OP == "cumsum":
        dsl.store(o_ptr + r * N + c, y)
    elif KD:
        if AX == 0:
            dsl.store(o_ptr + c, y)
        else:
            dsl.store(o_ptr + r, y)
    elif AX == 0:
        dsl.store(o_ptr + dsl.arange(0, N), y)
    else:
        dsl.store(o_ptr + dsl.arange(0, M), y)


_RED_CASES = [(m, n, op, ax, kd) for (m, n) in [(1, 1), (1, 2), (64, 1), (2, 256)]
              for op in ["sum", "max", "argmin", "cumsum"] for ax, kd in [(0, False), (1, True), (None, True)]
              if not (op in ("cumsum", "argmin") and ax is None) and not (op == "cumsum" and kd)]


@pytest.mark.parametrize("dtype", [dsl.float16, dsl.bfloat16, dsl.int8, dsl.uint64, dsl.int1], ids=str)
def test_reductions_on_tiny_shapes_compile_and_assemble(dtype):
    out_dtype = dsl.float64 if dtype == dsl.int1 else dtype
    for (m, n, op, ax, kd), arch in itertools.product(_RED_CASES[::2], ARCHS):
        compiled = _reduce_kernel.compile(dsl.pointer_type(out_dtype), dsl.pointer_type(dtype), target=arch,
                                          num_warps=4, M=m, N=n, OP=op, AX=ax, KD=kd)
        _assemble(compiled, arch)


@pytest.mark.parametrize("m,n,op,ax,kd", _RED_CASES[:12])
def test_reductions_on_tiny_shapes_interpreted(m, n, op, ax, kd):
    x = torch.randn(m, n, dtype=torch.float64)
    x[0, 0] = x.flatten()[-1]           # a tie
    out = torch.full((max(m, n) * max(m, n),), -99.0, dtype=torch.float64)
    _reduce_kernel[(1,)](out, x, M=m, N=n, OP=op, AX=ax, KD=kd, interpret=True)
    if op == "cumsum":
        expected = torch.cumsum(x, dim=ax).flatten()
    elif ax is None:
        expected = (x.sum() if op == "sum" else x.max()).reshape(1)
    else:
        fn = {"sum": lambda t: t.sum(dim=ax), "max": lambda t: t.amax(dim=ax),
              "argmin": lambda t: t.argmin(dim=ax).double()}[op]
        expected = fn(x).flatten()
    torch.testing.assert_close(out[:expected.numel()], expected, rtol=1e-12, atol=1e-12)


@dsl.jit
def _arg_kernel(i_ptr, x_ptr, N: dsl.constexpr):
    x = dsl.load(x_ptr + dsl.arange(0, N))
    dsl.store(i_ptr, dsl.argmin(x, axis=0))
    dsl.store(i_ptr + 1, dsl.argmax(x, axis=0))
    dsl.store(i_ptr + 2, dsl.argmax(dsl.reshape(x, (2, N // 2)), axis=None))
    dsl.store(i_ptr + 3, dsl.argmin(dsl.reshape(x, (2, N // 2)), axis=None))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("values", [[0.0, -0.0, 1.0, -1.0, -1.0, 5.0, 5.0, 0.0],
                                    [float("nan"), 1.0, float("nan"), -3.0, 9.0, 9.0, -3.0, 2.0],
                                    [3.0, 1.0, 2.0, 1.0, 0.5, 9.0, 0.5, 9.0]])
def test_argmin_argmax_ties_nan_and_flattened_axis_none_follow_torch(dtype, values):
    x = torch.tensor(values, dtype=dtype)
    idx = torch.full((4,), -1, dtype=torch.int32)
    _arg_kernel[(1,)](idx, x, N=8, interpret=True)
    assert idx.tolist() == [torch.argmin(x).item(), torch.argmax(x).item(), torch.argmax(x).item(),
                            torch.argmin(x).item()]


# ================================================================================================
# dot at small / odd shapes and every supported dtype compiles and assembles; atomics per dtype
# ================================================================================================
@dsl.jit
def _dot_kernel(o_ptr, a_ptr, b_ptr, M: dsl.constexpr, N: dsl.constexpr, K: dsl.constexpr, PREC: dsl.constexpr):
    rm = dsl.arange(0, M)
    rn = dsl.arange(0, N)
    rk = dsl.arange(0, K)
    a = dsl.load(a_ptr + rm[:, None] * K + rk[None, :])
    b = dsl.load(b_ptr + rk[:, None] * N + rn[None, :])
    dsl.store(o_ptr + rm[:, None] * N + rn[None, :], dsl.dot(a, b, input_precision=PREC))


_DOT_DT = {"f16": (dsl.float16, dsl.float32), "bf16": (dsl.bfloat16, dsl.float32), "f32": (dsl.float32, dsl.float32),
           "f64": (dsl.float64, dsl.float64), "i8": (dsl.int8, dsl.int32), "u8": (dsl.uint8, dsl.int32)}


@pytest.mark.parametrize("name", list(_DOT_DT))
def test_dot_small_and_odd_shapes_compile_and_assemble(name):
    src, acc = _DOT_DT[name]
    shapes = [(16, 16, 16), (16, 16, 8), (16, 8, 32), (1, 16, 16), (16, 1, 16), (2, 2, 2), (16, 16, 4)]
    for (m, n, k), arch in itertools.product(shapes, ARCHS):
        for prec in ([None, "tf32"] if name == "f32" else [None]):
            compiled = _dot_kernel.compile(dsl.pointer_type(acc), dsl.pointer_type(src), dsl.pointer_type(src),
                                           target=arch, num_warps=4, M=m, N=n, K=k, PREC=prec)
            _assemble(compiled, arch)


@pytest.mark.parametrize("dtype,m,n,k", [(torch.int8, 16, 16, 8), (torch.float64, 2, 2, 2), (torch.float16, 1, 16, 4)])
def test_dot_small_shapes_interpreted_exactly(dtype, m, n, k):
    if dtype == torch.int8:
        a, b = torch.randint(-128, 128, (m, k), dtype=dtype), torch.randint(-128, 128, (k, n), dtype=dtype)
        out, expected = torch.zeros(m, n, dtype=torch.int32), (a.long() @ b.long()).int()
    else:
        a, b = torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)
        out = torch.zeros(m, n, dtype=torch.float64 if dtype == torch.float64 else torch.float32)
        expected = (a.double() @ b.double()).to(out.dtype)
    _dot_kernel[(1,)](out, a, b, M=m, N=n, K=k, PREC=None, interpret=True)
    torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-6)


@dsl.jit
def _atomic_kernel(o_ptr, x_ptr, B: dsl.constexpr, KIND: dsl.constexpr):
    i = dsl.arange(0, B)
    v = dsl.load(x_ptr + i)
    if KIND == "add":
        old = dsl.atomic_add(o_ptr + i % 2, v)
    elif KIND == "max":
        old = dsl.atomic_max(o_ptr + i % 2, v)
    elif KIND == "xchg":
        old = dsl.atomic_xchg(o_ptr + i % 2, v)
    elif KIND == "cas":
        old = dsl.atomic_cas(o_ptr + i % 2, v, v + 1)
    else:
        old = dsl.atomic_add(o_ptr, dsl.sum(v, axis=0).to(v.dtype))
    dsl.store(x_ptr + i, old)


@pytest.mark.parametrize("dtype", [dsl.float16, dsl.bfloat16, dsl.float32, dsl.float64, dsl.int32, dsl.uint64,
                                   dsl.int16, dsl.int8], ids=str)
def test_atomics_compile_or_are_refused_clearly(dtype):
    for kind, b, arch in itertools.product(["add", "max", "xchg", "cas", "scalar_add"], [1, 128], ARCHS):
        try:
            compiled = _atomic_kernel.compile(dsl.pointer_type(dtype), dsl.pointer_type(dtype), target=arch,
                                              num_warps=4, B=b, KIND=kind)
        except dsl.CompilationError as e:
            assert "does not support" in str(e) and str(dtype) in str(e)
            assert dtype in (dsl.int8, dsl.int16, dsl.bfloat16, dsl.float16)
            continue
        _assemble(compiled, arch)


# ================================================================================================
# frontend: constructs Triton users write; each is supported correctly or a CompilationError
# ================================================================================================
_SUPPORTED = {   # body -> expected y for x = arange(8) - 3, n = 3, m = 5
    "chained_block": ("y = dsl.where(0 <= x < 5, x, 0.0)", [0, 0, 0, 0, 1, 2, 3, 4]),
    "and_block": ("y = dsl.where((x > 0) and (x < 5), x, 0.0)", [0, 0, 0, 0, 1, 2, 3, 4]),
    "not_block": ("y = dsl.where(not (x > 0), x, 0.0)", [-3, -2, -1, 0, 0, 0, 0, 0]),
    "chained_scalar": ("y = x + (0 <= n < m)", [-2, -1, 0, 1, 2, 3, 4, 5]),
    "abs_builtin": ("y = x + abs(n - m)", [-1, 0, 1, 2, 3, 4, 5, 6]),
    "len_shape": ("y = x + len(x) + x.shape[0]", [13, 14, 15, 16, 17, 18, 19, 20]),
    "tuple_index": ("t = (x, x + 1)\n    y = t[1]", [-2, -1, 0, 1, 2, 3, 4, 5]),
    "static_range_down": ("y = x\n    for k in dsl.static_range(4, 0, -1):\n        y += k", [7, 8, 9, 10, 11, 12, 13, 14]),
    "int_div_zero": ("y = x + (n // 0) + (m % 0)", [1, 2, 3, 4, 5, 6, 7, 8]),
    "atomic_old": ("y = x + dsl.atomic_add(x_ptr + i, 1)", [-6, -4, -2, 0, 2, 4, 6, 8]),
}
_UNSUPPORTED = {   # body -> a fragment of the message
    "pow": ("y = x + n ** m", "`**` of an integer base needs a compile-time int exponent"),   # (x ** 2: session 43)
    "builtin_min": ("y = x + min(n)", "dsl.minimum"),
    "builtin_max": ("y = max(x)", "dsl.maximum"),
    "int_builtin": ("y = x + int(n)", ""),
    "index_int": ("y = x + x[0]", "indexed with None"),
    "slice": ("y = x[2:4]", "indexed"),
    "continue": ("y = x\n    for k in range(n):\n        if k > 1:\n            continue\n        y += 1", "continue"),
    "for_else": ("y = x\n    for k in range(n):\n        y += 1\n    else:\n        y += 2", ""),
    "undefined_after_if": ("if n > 0:\n        z = x\n    y = z", "only one branch"),
    "range_step0": ("y = x\n    for k in range(0, 4, 0):\n        y += 1", "step must not be zero"),
    "static_range_step0": ("y = x\n    for k in dsl.static_range(0, 4, 0):\n        y += k", ""),
    "for_over_block": ("y = x\n    for k in x:\n        y += k", "range"),
    "arange_np2": ("y = x + dsl.sum(dsl.arange(0, 3))", ""),
    "arange_empty": ("y = x + dsl.sum(dsl.arange(5, 5))", ""),
    "arange_runtime": ("y = x + dsl.sum(dsl.arange(0, n))", ""),
    "zeros_3": ("y = x + dsl.sum(dsl.zeros((3,), dsl.float32))", ""),
    "reshape_minus1": ("y = dsl.reshape(x, (-1,))", "powers of two"),
    "sum_axis_tuple": ("y = dsl.sum(x[None, :], axis=(0,))", "axis"),
    "unknown_kwarg": ("y = dsl.max(x, axis=0, return_indices=True) + x", "return_indices"),
    "dot_int32": ("y = dsl.dot(i[:, None], i[None, :]).to(dsl.float32)[:, 0]", "dot supports"),
    "program_id_3": ("y = x + dsl.program_id(3)", ""),
    "program_id_runtime": ("y = x + dsl.program_id(n)", ""),
    "nested_def": ("def f(v):\n        return v + 1\n    y = f(x)", "nested function"),
    "import": ("y = x\n    import os", "imports"),
    "return_value": ("y = x\n    return y", "cannot return a value"),
    "fstring": ("s = f'{n}'\n    y = x", ""),
    "to_torch_dtype": ("y = x.to(torch.float16)", ""),
    "lshift_float": ("y = x + (n << 1.5)", ""),
    "literal_too_big": ("y = x + (n + 2**70)", "64 bits"),
    "none_operand": ("y = x + None", ""),
    "walrus": ("y = x + (k := n)", ""),
}


def _kernel_from_body(body: str, tag: str):
    source = ("def k(o_ptr, x_ptr, n, m):\n    i = dsl.arange(0, 8)\n    x = dsl.load(x_ptr + i)\n"
              f"    {body}\n    dsl.store(o_ptr + i, y)\n")
    return jit_from_source(source, f"<review21 {tag}>", namespace={"torch": torch})


@pytest.mark.parametrize("name", list(_SUPPORTED))
def test_supported_frontend_constructs_give_python_results(name):
    body, expected = _SUPPORTED[name]
    kernel = _kernel_from_body(body, name)
    out, x = torch.full((8,), float("nan")), torch.arange(8.0) - 3
    kernel[(1,)](out, x, 3, 5, interpret=True)
    assert out.tolist() == [float(v) for v in expected]
    kernel.compile(out, x, 3, 5, target="sm_90a")


@pytest.mark.parametrize("name", list(_UNSUPPORTED))
def test_unsupported_frontend_constructs_are_located_compilation_errors(name):
    body, fragment = _UNSUPPORTED[name]
    kernel = _kernel_from_body(body, name)
    out, x = torch.zeros(8), torch.arange(8.0)
    for run in (lambda: kernel[(1,)](out, x, 3, 5, interpret=True),
                lambda: kernel.compile(out, x, 3, 5, target="sm_90a")):
        with pytest.raises(dsl.CompilationError) as info:
            run()
        assert f"<review21 {name}>:" in str(info.value) and fragment in str(info.value)


@dsl.jit
def _recursive(x, N: dsl.constexpr):
    if N == 0:
        return x
    return _recursive(x + 1, N - 1)


@dsl.jit
def _recursion_kernel(o_ptr, n, N: dsl.constexpr):
    dsl.store(o_ptr, _recursive(n, N))


def test_recursion_is_a_compilation_error_not_a_recursion_error():
    out = torch.zeros(1, dtype=torch.int32)
    with pytest.raises(dsl.CompilationError, match="recurs"):
        _recursion_kernel[(1,)](out, 1, N=3, interpret=True)


@dsl.jit
def _helper_with_defaults(x, scale=2, OFF: dsl.constexpr = 10, flag=None):
    if flag is None:
        return x * scale + OFF
    return x


@dsl.jit
def _helper_that_rebinds(x):
    x = x + 100
    return 0


@dsl.jit
def _defaults_kernel(o_ptr, b_ptr, n, k=3):
    dsl.store(o_ptr + 0, _helper_with_defaults(n))
    dsl.store(o_ptr + 1, _helper_with_defaults(n, 3))
    dsl.store(o_ptr + 2, _helper_with_defaults(n, OFF=100))
    dsl.store(o_ptr + 3, _helper_with_defaults(n, flag=1))
    dsl.store(o_ptr + 4, _helper_with_defaults(x=n, scale=n))
    v = n
    _helper_that_rebinds(v)
    dsl.store(o_ptr + 5, v)
    w = k
    if b_ptr is not None:
        w += dsl.load(b_ptr)
    dsl.store(o_ptr + 6, w)


def test_helper_defaults_keywords_none_arguments_and_pass_by_value():
    out = torch.zeros(7, dtype=torch.int32)
    _defaults_kernel[(1,)](out, None, 4, interpret=True)
    assert out.tolist() == [18, 22, 108, 4, 26, 4, 3]
    _defaults_kernel[(1,)](out, torch.tensor([10], dtype=torch.int32), 4, k=5, interpret=True)
    assert out.tolist()[6] == 15
    _defaults_kernel.compile(out, None, 4, target="sm_90a")
    with pytest.raises(TypeError, match="missing argument `o_ptr`"):
        _defaults_kernel[(1,)](interpret=True)
    with pytest.raises(TypeError, match="no fusedops.dsl equivalent"):
        _defaults_kernel[(1,)](torch.zeros(7, dtype=torch.complex64), None, 4, interpret=True)
    with pytest.raises(TypeError, match="does not fit in 64 bits"):
        _defaults_kernel[(1,)](out, None, 2**64, interpret=True)


# ================================================================================================
# passes: interpreting the IR after the sm_80 / sm_90a pipeline (cp.async rings) changes nothing
# ================================================================================================
@dsl.jit
def _triangular_matmul(c_ptr, a_ptr, b_ptr, M, N, K, BM: dsl.constexpr, BN: dsl.constexpr, BK: dsl.constexpr):
    # program m reads K only up to (m + 1) * BM, as causal attention does
    pid_m = dsl.program_id(0)
    pid_n = dsl.program_id(1)
    rm = pid_m * BM + dsl.arange(0, BM)
    rn = pid_n * BN + dsl.arange(0, BN)
    rk = dsl.arange(0, BK)
    acc = dsl.zeros((BM, BN), dsl.float32)
    hi = dsl.minimum((pid_m + 1) * BM, K)
    for k in range(0, hi, BK):
        a = dsl.load(a_ptr + rm[:, None] * K + (k + rk)[None, :],
                     mask=(rm[:, None] < M) & ((k + rk)[None, :] < hi), other=0.0)
        b = dsl.load(b_ptr + (k + rk)[:, None] * N + rn[None, :],
                     mask=((k + rk)[:, None] < hi) & (rn[None, :] < N), other=0.0)
        acc = dsl.dot(a, b, acc)
    dsl.store(c_ptr + rm[:, None] * N + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


@dsl.jit
def _nested_matmul(c_ptr, a_ptr, b_ptr, M, N, K, BM: dsl.constexpr, BN: dsl.constexpr, BK: dsl.constexpr):
    # an outer loop over column tiles; the inner K loop starts at a bound that depends on the outer iv
    pid_m = dsl.program_id(0)
    rm = pid_m * BM + dsl.arange(0, BM)
    rk = dsl.arange(0, BK)
    for n0 in range(0, N, BN):
        rn = n0 + dsl.arange(0, BN)
        acc = dsl.zeros((BM, BN), dsl.float32)
        for k in range(n0 % BK, K, BK):
            a = dsl.load(a_ptr + rm[:, None] * K + (k + rk)[None, :],
                         mask=(rm[:, None] < M) & ((k + rk)[None, :] < K), other=0.0)
            b = dsl.load(b_ptr + (k + rk)[:, None] * N + rn[None, :],
                         mask=((k + rk)[:, None] < K) & (rn[None, :] < N), other=0.0)
            acc = dsl.dot(a, b, acc)
        dsl.store(c_ptr + rm[:, None] * N + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


@pytest.mark.parametrize("kernel", [_triangular_matmul, _nested_matmul], ids=["triangular", "nested"])
@pytest.mark.parametrize("mnk", [(32, 32, 0), (32, 48, 16), (33, 40, 50), (64, 64, 130)], ids=str)
@pytest.mark.parametrize("arch,stages", [("sm_80", 3), ("sm_90a", 4)])
def test_pipelined_ir_interprets_like_the_frontend_ir(kernel, mnk, arch, stages):
    m, n, k = mnk
    torch.manual_seed(m * 7 + n * 3 + k)
    a, b = torch.randn(m, k).half(), torch.randn(k, n).half()
    grid = (-(-m // 32), -(-n // 32))
    kw = dict(BM=32, BN=32, BK=16)
    c1, c2 = torch.full((m, n), float("nan")), torch.full((m, n), float("nan"))
    kernel[grid](c1, a, b, m, n, k, interpret=True, **kw)
    function, _ = pipelined_ir(kernel, (c2, a, b, m, n, k), kw, 4, arch=arch, num_stages=stages)
    if k >= 32:
        assert any(op.opcode.name == "ASYNC_COPY" for op in function.walk())    # the loop was pipelined
    interpret_ir(kernel, function, grid, (c2, a, b, m, n, k), kw)
    assert torch.equal(c1, c2)
    reference = a.double() @ b.double()
    if kernel is _triangular_matmul:
        for i in range(m):
            hi = min((i // 32 + 1) * 32, k)
            reference[i] = a[i, :hi].double() @ b[:hi].double()
    torch.testing.assert_close(c1.double(), reference, rtol=1e-4, atol=1e-4)


# ================================================================================================
# 64-bit address math and grid limits
# ================================================================================================
@dsl.jit
def _row_kernel(o_ptr, x_ptr, stride, n, BLOCK: dsl.constexpr):
    pid = dsl.program_id(0)
    offs = dsl.arange(0, BLOCK)
    base = pid.to(dsl.int64) * stride
    dsl.store(o_ptr + base + offs, dsl.load(x_ptr + base + offs, mask=offs < n) + 1, mask=offs < n)


def test_row_offsets_widened_to_int64_use_64_bit_multiplies():
    for stride in (2**33, 2**20):   # int64 argument, and int32 argument widened by the pid's int64
        llir = _row_kernel.compile(dsl.pointer_type(dsl.float32), dsl.pointer_type(dsl.float32), stride, 7,
                                   target="sm_90a", BLOCK=128).asm["llir"]
        products = re.findall(r"= mul (?:nsw |nuw )*(i\d+) ", llir)
        assert products and set(products) == {"i64"}, products
        assert not re.search(r"getelementptr float, ptr addrspace\(1\) %\w+, i32", llir)


@dsl.jit
def _grid_kernel(o_ptr):
    dsl.store(o_ptr, dsl.program_id(1) + dsl.num_programs(2))


@pytest.mark.parametrize("grid", [(1, 65536), (1, 1, 65536), (0, 70000), (2**31,)], ids=str)
def test_oversized_grids_are_refused_in_the_interpreter(grid):
    with pytest.raises(dsl.LaunchError, match="grid entry"):
        _grid_kernel[grid](torch.zeros(1, dtype=torch.int32), interpret=True)


def test_program_id_and_num_programs_on_axes_1_and_2():
    out = torch.zeros(1, dtype=torch.int32)
    _grid_kernel[(1, 1, 3)](out, interpret=True)
    assert out.item() == 3
    _grid_kernel[(1, 0, 3)](out.zero_(), interpret=True)     # an empty grid runs nothing
    assert out.item() == 0


@dsl.jit
def _bounded_iota(o_ptr, n, BLOCK: dsl.constexpr):
    i = dsl.arange(0, BLOCK)
    dsl.store(o_ptr + i, i, mask=i < n)


def test_a_0d_tensor_where_a_scalar_is_meant_gets_a_hint():
    # a torch.Tensor argument is a pointer, a 0-d one too (as in Triton): the error says so
    out = torch.zeros(8, dtype=torch.int32)
    with pytest.raises(dsl.CompilationError, match=r"`lt` is not defined for int32 and ptr<int64>.*0-d one included"):
        _bounded_iota[(1,)](out, torch.tensor(5), BLOCK=8, interpret=True)
    _bounded_iota[(1,)](out, 5, BLOCK=8, interpret=True)
    assert out.tolist() == [0, 1, 2, 3, 4, 0, 0, 0]
