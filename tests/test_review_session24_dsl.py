"""Review (session 24, the DSL): a fresh reviewer played a demanding Triton user on the CPU: C-style `//` / `%`
against constexpr folding (Python's), shifts past the bit width, float -> unsigned saturation, 64-bit ints to
float32, bool arguments, reductions / argmax with NaN, ties and keep_dims, cumsum along either axis (reversed),
zero-rank shapes, dots at odd shapes and dtypes (uint8 included), atomics (float max / min with signed zeros,
bitwise compare-and-swap of floats, masked), runtime `range` bounds at the int32 edge, tensor descriptors at
negative and huge offsets, nested jit functions with defaults / keywords / early returns, grids and argument
errors. Kernels run in the interpreter, compile for sm_90a (assembled by ptxas when installed), and scalar ones
are JIT-compiled on the host from their LLVM IR (tests/host_jit.py) where the compiled rule matters.

Defects found (fixed in the same session; the tests assert the correct behaviour):
- `dsl.reshape(x, ())` of a one-element block makes a zero-rank *block* type (BlockType(shape=())) that no
  other op accepts: storing it compiles to an AttributeError deep in codegen ("'list' object has no attribute
  'type'", codegen/memory.py), while the interpreter runs the same kernel; using it in arithmetic, a
  comparison or a broadcast raises the IR verifier's VerificationError ("operands must have one type") in
  both, which is not a CompilationError and names IR internals. It should either give the scalar (as
  reshape of a scalar to () already does) or be a CompilationError at the reshape.
  Fixed: reshape of a one-element block to () gives its element as a scalar (pointer blocks: a
  CompilationError).
- An int literal (or `dsl.full` value) wider than 53 bits that adopts a float32 type is rounded twice:
  `x_f32 + 9007199791611905` (2**53 + 2**29 + 1) adds 2**53, where the one rounding the conversion rules
  promise (numerics.conversions.cast: int -> float32 rounds to nearest even; `.to(dsl.float32)` of the same int64, and
  Triton's sitofp) gives 9007200328482816.0. `Semantics.constant` turns the int into a Python float
  (float64) first, and the compiled constant is that double rounded again (same wrong value on the host).
  Fixed: the int is rounded to the dtype's significand first (`semantics._int_rounded`), then converted.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import fusedops.dsl as dsl
from fusedops.dsl.errors import CompilationError
from fusedops.dsl.target import assemble, ptxas_available
from host_jit import run_on_host
from kernel_source import jit_from_source

NAN, INF = float("nan"), float("inf")


def _kernel(source: str, tag: str, namespace=None):
    return jit_from_source(source, f"<review24 {tag}>", namespace=namespace)


def _compile(kernel, *args, arch="sm_90a", **constexprs):
    compiled = kernel.compile(*args, target=arch, **constexprs)
    if ptxas_available():
        assemble(compiled.asm["ptx"], arch)
    return compiled


# ================================================================================================
# DEFECT: reshape of a one-element block to () makes a zero-rank block no op accepts
# ================================================================================================
_RESHAPE_0D_BODIES = {
    "store": "    y = dsl.reshape(x, ())\n    dsl.store(o_ptr, y)\n",
    "add": "    y = dsl.reshape(x, ())\n    dsl.store(o_ptr, y + 1.0)\n",
    "compare": "    y = dsl.reshape(x, ())\n    dsl.store(o_ptr, dsl.where(y > 0.0, y, 0.0))\n",
}


def _reshape_0d_kernel(use: str):
    return _kernel("def k(o_ptr, x_ptr):\n    x = dsl.load(x_ptr + dsl.arange(0, 1))\n" + _RESHAPE_0D_BODIES[use],
                   f"reshape_0d_{use}")


def _scalar_or_compilation_error(action):
    """Run `action`; True when it succeeded, False when it raised a CompilationError (any other exception
    propagates and fails the test)."""
    try:
        action()
    except CompilationError:
        return False
    return True


@pytest.mark.parametrize("use", sorted(_RESHAPE_0D_BODIES))
def test_reshape_of_one_element_block_to_empty_shape(use):
    kernel = _reshape_0d_kernel(use)
    x, out = torch.tensor([3.0]), torch.zeros(1)
    expected = {"store": 3.0, "add": 4.0, "compare": 3.0}[use]
    interpreted = _scalar_or_compilation_error(lambda: kernel[(1,)](out, x, interpret=True))
    if interpreted:
        assert out.item() == expected
    compiled = _scalar_or_compilation_error(lambda: _compile(kernel, out, x))
    assert interpreted == compiled      # the interpreter and the compiler accept the same programs


def test_reshape_of_a_scalar_to_empty_shape_and_back_works():
    kernel = _kernel("def k(o_ptr, x_ptr):\n    x = dsl.load(x_ptr)\n    y = dsl.reshape(x, ()) * 2.0\n"
                     "    z = dsl.reshape(y, (1, 1))\n    dsl.store(o_ptr + dsl.arange(0, 1)[:, None], z)\n",
                     "reshape_scalar_0d")
    out = torch.zeros(1)
    kernel[(1,)](out, torch.tensor([3.0]), interpret=True)
    assert out.item() == 6.0
    _compile(kernel, out, torch.tensor([3.0]))


# ================================================================================================
# DEFECT: int literals past 2**53 adopting float32 are rounded twice
# ================================================================================================
_BIG = 2**53 + 2**29 + 1                       # exactly halfway + 1 between two float32 values, above 2**53
_BIG_F32 = float(np.float32(np.int64(_BIG)))   # the one correct rounding: 9007200328482816.0


def test_int64_to_float32_conversion_rounds_once():
    """The rule holds for runtime values: .to(dsl.float32) of an int64 (interpreted and on the host)."""
    kernel = _kernel("def k(o_ptr, a_ptr):\n    dsl.store(o_ptr, dsl.load(a_ptr).to(dsl.float32))\n", "i64_f32")
    a, out = torch.tensor([_BIG], dtype=torch.int64), torch.zeros(1)
    kernel[(1,)](out, a, interpret=True)
    assert out.item() == _BIG_F32 == torch.tensor([_BIG]).float().item()
    out.zero_()
    run_on_host(kernel, out, a)
    assert out.item() == _BIG_F32


def test_big_int_literal_adopting_float32_rounds_once():
    kernel = _kernel(f"def k(o_ptr, a_ptr):\n    dsl.store(o_ptr, dsl.load(a_ptr) + {_BIG})\n"
                     f"    dsl.store(o_ptr + 1 + dsl.arange(0, 1), dsl.full((1,), {_BIG}, dsl.float32))\n",
                     "big_literal_f32")
    out = torch.zeros(2)
    kernel[(1,)](out, torch.zeros(1), interpret=True)
    assert out.tolist() == [_BIG_F32, _BIG_F32]


# ================================================================================================
# Tricky cases that hold
# ================================================================================================
def test_runtime_division_is_c_style_and_constexpr_folding_is_pythons():
    kernel = _kernel("def k(o_ptr, a, A: dsl.constexpr, B: dsl.constexpr):\n"
                     "    dsl.store(o_ptr, a // 2)\n    dsl.store(o_ptr + 1, a % 2)\n"
                     "    dsl.store(o_ptr + 2, A // B)\n    dsl.store(o_ptr + 3, A % B)\n", "div_fold")
    out = torch.zeros(4, dtype=torch.int32)
    kernel[(1,)](out, -7, A=-7, B=2, interpret=True)
    assert out.tolist() == [-3, -1, -4, 1]      # DESIGN.md: C for runtime values; Python for compile-time ones
    out.zero_()
    run_on_host(kernel, out, -7, A=-7, B=2)
    assert out.tolist() == [-3, -1, -4, 1]


def test_shifts_past_the_bit_width_and_float_to_uint8_saturation():
    shift = _kernel("def k(o_ptr, a_ptr, s_ptr):\n    i = dsl.arange(0, 4)\n    x = dsl.load(a_ptr + i)\n"
                    "    s = dsl.load(s_ptr + i)\n    dsl.store(o_ptr + i, x << s)\n    dsl.store(o_ptr + 4 + i, x >> s)\n",
                    "shifts")
    a = torch.tensor([-8, 8, -8, 1], dtype=torch.int32)
    s = torch.tensor([32, 33, -1, 31], dtype=torch.int32)
    out = torch.zeros(8, dtype=torch.int32)
    shift[(1,)](out, a, s, interpret=True)
    assert out.tolist() == [0, 0, 0, -2**31, -1, 0, -1, 0]
    _compile(shift, out, a, s)
    cast = _kernel("def k(o_ptr, a_ptr):\n    i = dsl.arange(0, 8)\n    dsl.store(o_ptr + i, dsl.load(a_ptr + i).to(dsl.uint8))\n",
                   "f32_u8")
    a = torch.tensor([NAN, INF, -INF, 300.0, -3.0, -0.7, 255.9, 127.5])
    out = torch.zeros(8, dtype=torch.uint8)
    cast[(1,)](out, a, interpret=True)
    assert out.tolist() == [0, 255, 0, 255, 0, 0, 255, 127]


def test_bool_arguments_compute_in_int32_like_the_compiled_code():
    kernel = _kernel("def k(o_ptr, f, g):\n    dsl.store(o_ptr, f + g)\n    dsl.store(o_ptr + 1, f * 3)\n"
                     "    dsl.store(o_ptr + 2, f % g)\n    dsl.store(o_ptr + 3, ~f)\n    dsl.store(o_ptr + 4, f - g)\n"
                     "    dsl.store(o_ptr + 5, f // g)\n    dsl.store(o_ptr + 6, f.to(dsl.int8) - 2)\n", "bools")
    for f, g in [(True, True), (True, False), (False, True)]:
        interpreted, host = torch.zeros(7, dtype=torch.int32), torch.zeros(7, dtype=torch.int32)
        kernel[(1,)](interpreted, f, g, interpret=True)
        run_on_host(kernel, host, f, g)
        assert interpreted.tolist() == host.tolist()
        assert interpreted[0].item() == int(f) + int(g) and interpreted[4].item() == int(f) - int(g)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_cumsum_along_either_axis_of_a_2d_block(axis, reverse):
    kernel = _kernel("def k(o_ptr, a_ptr, AX: dsl.constexpr, REV: dsl.constexpr):\n"
                     "    r = dsl.arange(0, 2)[:, None]\n    c = dsl.arange(0, 4)[None, :]\n"
                     "    dsl.store(o_ptr + r * 4 + c, dsl.cumsum(dsl.load(a_ptr + r * 4 + c), AX, reverse=REV))\n",
                     "cumsum2d")
    a = torch.tensor([[1, -2, 3, 4], [5, 6, -7, 8]], dtype=torch.int8)
    out = torch.zeros(2, 4, dtype=torch.int32)
    kernel[(1,)](out, a, AX=axis, REV=reverse, interpret=True)
    ref = a.long().flip(axis).cumsum(axis).flip(axis) if reverse else a.long().cumsum(axis)
    assert out.tolist() == ref.tolist()
    _compile(kernel, out, a, AX=axis, REV=reverse)


def test_argmax_argmin_ties_nan_and_keep_dims():
    kernel = _kernel("def k(o_ptr, a_ptr):\n    r = dsl.arange(0, 2)[:, None]\n    c = dsl.arange(0, 4)[None, :]\n"
                     "    x = dsl.load(a_ptr + r * 4 + c)\n"
                     "    dsl.store(o_ptr + r + dsl.arange(0, 1)[None, :], dsl.argmax(x, 1, keep_dims=True))\n"
                     "    dsl.store(o_ptr + 2 + dsl.arange(0, 4), dsl.argmin(x, 0))\n", "argreduce")
    a = torch.tensor([[1.0, 5.0, 5.0, NAN], [7.0, 7.0, -1.0, -1.0]])
    out = torch.zeros(6, dtype=torch.int32)
    kernel[(1,)](out, a, interpret=True)
    assert out.tolist() == [3, 0, 0, 0, 1, 0]     # NaN is the extreme (first NaN wins); first index on ties
    _compile(kernel, out, a)


def test_float_atomics_order_signed_zeros_and_cas_compares_bits():
    amax = _kernel("def k(o_ptr, a_ptr):\n    i = dsl.arange(0, 4)\n    dsl.atomic_max(o_ptr + i, dsl.load(a_ptr + i))\n",
                   "atomic_max")
    out, a = torch.tensor([-5.0, -1.0, 0.0, -0.0]), torch.tensor([-3.0, -2.0, -0.0, 0.0])
    amax[(1,)](out, a, interpret=True)
    assert out.tolist() == [-3.0, -1.0, 0.0, 0.0] and not torch.signbit(out[2:]).any()
    _compile(amax, out, a)
    cas = _kernel("def k(o_ptr, a_ptr):\n    i = dsl.arange(0, 4)\n    dsl.atomic_cas(o_ptr + i, dsl.load(a_ptr + i), 7.0)\n",
                  "atomic_cas")
    out, cmp = torch.tensor([0.0, -0.0, NAN, 1.0]), torch.tensor([-0.0, 0.0, NAN, 1.0])
    cas[(1,)](out, cmp, interpret=True)
    assert out[:2].tolist() == [0.0, -0.0] and torch.signbit(out[1]) and out[2:].tolist() == [7.0, 7.0]
    _compile(cas, out, cmp)


def test_runtime_range_at_the_int32_edge_matches_python_interpreted_and_on_host():
    kernel = _kernel("def k(o_ptr, lo, hi, st):\n    c = 0\n    for i in range(lo, hi, st):\n        c += 1\n"
                     "    dsl.store(o_ptr, c)\n", "range_edge")
    for lo, hi, st in [(-2**31, 2**31 - 1, 2**31 - 1), (2**31 - 1, -2**31, -(2**31 - 1)),
                       (2**31 - 3, 2**31 - 1, 1), (5, -2**31, -2**31), (3, 3, 1)]:
        out = torch.zeros(1, dtype=torch.int32)
        kernel[(1,)](out, lo, hi, st, interpret=True)
        assert out.item() == len(range(lo, hi, st))
        out.zero_()
        run_on_host(kernel, out, lo, hi, st)
        assert out.item() == len(range(lo, hi, st))


def test_descriptor_loads_at_negative_and_huge_offsets_read_zeros_outside():
    kernel = _kernel("def k(o_ptr, x_ptr, R, C, o0, o1, BR: dsl.constexpr, BC: dsl.constexpr):\n"
                     "    d = dsl.make_tensor_descriptor(x_ptr, (R, C), (C, 1), (BR, BC))\n"
                     "    r = dsl.arange(0, BR)[:, None]\n    c = dsl.arange(0, BC)[None, :]\n"
                     "    dsl.store(o_ptr + r * BC + c, d.load((o0, o1)))\n", "descriptor")
    x = torch.arange(20.0).reshape(4, 5)
    for o0, o1 in [(-1, -2), (3, 4), (-2**31, 0), (2**31 - 1, 2**31 - 1)]:
        out = torch.full((4, 4), NAN)
        kernel[(1,)](out, x, 4, 5, o0, o1, BR=4, BC=4, interpret=True)
        ref = torch.zeros(4, 4)
        for i in range(4):
            for j in range(4):
                if 0 <= o0 + i < 4 and 0 <= o1 + j < 5:
                    ref[i, j] = x[o0 + i, o1 + j]
        assert torch.equal(out, ref)


def test_nested_jit_calls_with_defaults_keywords_and_early_returns():
    kernel = _kernel(
        "@dsl.jit\ndef helper(x, scale: dsl.constexpr = 2, bias=1):\n    return x * scale + bias\n\n"
        "@dsl.jit\ndef sign_abs(x):\n    if x > 0:\n        return x\n    return -x\n\n"
        "def k(o_ptr, a_ptr):\n    x = dsl.load(a_ptr)\n    dsl.store(o_ptr, helper(x))\n"
        "    dsl.store(o_ptr + 1, helper(x, 3))\n    dsl.store(o_ptr + 2, helper(x, bias=5, scale=4))\n"
        "    dsl.store(o_ptr + 3, sign_abs(x - 10))\n", "nested")
    out = torch.zeros(4, dtype=torch.int32)
    kernel[(1,)](out, torch.tensor([3], dtype=torch.int32), interpret=True)
    assert out.tolist() == [7, 10, 17, 7]
    _compile(kernel, out, torch.tensor([3], dtype=torch.int32))


def test_uint8_dot_is_unsigned_and_odd_shapes_compile():
    kernel = _kernel("def k(c_ptr, a_ptr, b_ptr, M: dsl.constexpr, N: dsl.constexpr, K: dsl.constexpr):\n"
                     "    m = dsl.arange(0, M)\n    n = dsl.arange(0, N)\n    kk = dsl.arange(0, K)\n"
                     "    a = dsl.load(a_ptr + m[:, None] * K + kk[None, :])\n"
                     "    b = dsl.load(b_ptr + kk[:, None] * N + n[None, :])\n"
                     "    dsl.store(c_ptr + m[:, None] * N + n[None, :], dsl.dot(a, b))\n", "dot_u8")
    gen = torch.Generator().manual_seed(0)
    for m, n, k in [(16, 16, 32), (2, 4, 8)]:
        a = torch.randint(0, 256, (m, k), dtype=torch.uint8, generator=gen)
        b = torch.randint(0, 256, (k, n), dtype=torch.uint8, generator=gen)
        c = torch.zeros(m, n, dtype=torch.int32)
        kernel[(1,)](c, a, b, M=m, N=n, K=k, interpret=True)
        assert torch.equal(c.long(), a.long() @ b.long())
        _compile(kernel, c, a, b, M=m, N=n, K=k)


def test_launch_argument_errors_name_the_problem():
    kernel = _kernel("def k(o_ptr, n):\n    dsl.store(o_ptr, n)\n", "arg_errors")
    out = torch.zeros(1)
    with pytest.raises(TypeError, match="numpy.int64"):
        kernel[(1,)](out, np.int64(2), interpret=True)
    with pytest.raises(TypeError, match="does not fit in 64 bits"):
        kernel[(1,)](out, 2**64, interpret=True)
    with pytest.raises(dsl.LaunchError, match="grid entry 0"):
        kernel[(-1,)](out, 1, interpret=True)
    kernel[(0,)](out, 1, interpret=True)      # an empty grid runs nothing
    assert out.item() == 0.0


def test_pointer_element_type_by_tritons_name():
    """`o_ptr.dtype.element_ty` (Triton's spelling) is `o_ptr.dtype.element`, interpreted and compiled."""
    kernel = _kernel("def k(o_ptr, x_ptr):\n    r = dsl.arange(0, 8)\n    x = dsl.load(x_ptr + r).to(dsl.float32)\n"
                     "    dsl.store(o_ptr + r, (x * 2.0).to(o_ptr.dtype.element_ty))\n", "element_ty")
    x, out = torch.arange(8, dtype=torch.float16), torch.zeros(8, dtype=torch.float16)
    kernel[(1,)](out, x, interpret=True)
    assert out.tolist() == [2.0 * v for v in range(8)]
    _compile(kernel, out, x)
