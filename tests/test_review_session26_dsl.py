"""Review (session 26, the DSL): a fresh reviewer replayed Triton bug classes (searched in the issue trackers of
triton-lang/triton, FlagTree, PyTorch: "interpreter and GPU disagree" #11153, umulhi / signed operands #11390,
unsigned `>>` lowered as arithmetic FlagTree #1121, keep_dims reductions #2928, reduce_sum crash on odd shapes
#8887, int8 saturation FlagTree #982, ...) as small `fusedops.dsl` kernels on the CPU. Each kernel runs in the
interpreter against an exact / torch reference; where the compiled code could disagree it is compiled for sm_90a
and sm_80 (assembled by ptxas when installed), JIT-compiled on the host from its LLVM IR for scalar kernels
(tests/host_jit.py), or interpreted again after the compiler's pass pipeline (tests/codegen_helpers.interpret_ir),
which exercises induction-variable substitution, dot accumulation, folding / CSE and descriptor expansion.

Tried (cases that held are the plain tests below; many more were tried by hand in the session and held too):
shifts by 0..65 and by negative amounts for int8..int64 / uint8 (host vs interpreter), NaN / signed-zero
comparisons and `not (x < y)`, int64 / uint64 -> float32 with a sticky bit below the float64 rounding point
(single rounding), float32 / float64 -> int32 / uint32 / int64 / uint64 / int16 / uint8 / uint16 of NaN, +-inf,
2**31, 2**63, 2**64, -1.5 (host vs interpreter), float64 literals rounded once to float16 / bfloat16 (PTX
constant 0x3C01), no fp contraction of `x * y + z` (bfloat16 on sm_80 is two fma.rn.bf16), uint8 / uint16
pointer offsets zero-extended, uint8 dots (unsigned products, mul.wide.u16), reductions / argmax / cumsum of
uint32 with the top bit set and of bools, argmax(axis=None), int8 cumsum widening, 0-d / size-1 shapes (zeros(()),
arange(0, 1), reshape to (), scalar[None]), nested runtime `if` with returns, constexpr `if` with a return, helper
early returns, `while` conditions that short-circuit a load (`i < n and load(p + i)`, chained, `not (.. or ..)`,
a conditional expression), loop-carried tuples and blocks, induction-variable substitution (pointer read after
the loop, negative runtime steps, empty ranges, wrap-around, uint carries, int64 ranges with int32 carries, nested
resets, offsets computed in the body), descriptor loads at negative offsets, compile crashes (reductions, argmax,
cumsum over 12 dtypes and 4 shapes; reshape / trans / argmax / cumsum / atomics of dot results on wgmma and mma
layouts; every math function on float64 / float32 / float16 / int32 / uint64: all compiled and assembled), and
the errors for unsupported Python (**, lambda, walrus, with, try, del, global, nested def, dict, divmod, `in`).

Defects (all fixed in session 26; their tests, strict xfails until then, now pass):
- `dsl.cast(<int literal>, <float dtype>, bitcast=True)` converts the value instead of reinterpreting its bits:
  `dsl.cast(0x7F800000, dsl.float32, bitcast=True)` is 2139095040.0, not inf, and `dsl.cast(1, dsl.float32,
  bitcast=True)` is 1.0, not 2**-149 (the same kernel with the int in an int32 variable gives inf / 2**-149; a float
  literal bitcast to int32 already works). Cause: language/semantics.py `Semantics.cast` types a literal with
  `to_value(x, dtype)`, so the literal adopts the float target (an int literal "fits" any float type) and
  `source == dtype` returns it unchanged. The compiled code runs the same frontend IR, so it agrees with the
  interpreter: both wrong.
- A runtime value passed where a compile-time flag is needed is taken as True: `x.to(dsl.float32, bitcast=n > 0)`
  and `dsl.cast(x, dsl.float32, bitcast=n)` bitcast (Semantics.cast: `if bitcast:` on an IR Value), and
  `dsl.device_print("x", n, hex=n)` prints hex (BlockOps.device_print: `hex=bool(hex)`); `cumsum(reverse=)` and
  `keep_dims=` refuse a runtime value with a clear CompilationError.
- Errors for a runtime value where a compile-time string / dtype / int is needed still print the IR internals
  ("got Value(n: int32)"; the class session 23 fixed for arange / reduction axis / program_id with
  shape_ops.shown): load / store cache_modifier and eviction_policy, atomic sem and scope (block_ops.py
  `_check_cache` / `_check_atomic`), dot input_precision and out_dtype (`BlockOps.dot`), dsl.zeros / dsl.full dtype
  (shape_ops), launch_bounds and cluster_dims (`BlockOps.launch_bounds` / `cluster_dims`).
"""

from __future__ import annotations

import re

import pytest
import torch

import fusedops.dsl as dsl
from fusedops.dsl.target import assemble, ptxas_available
from codegen_helpers import interpret_ir
from host_jit import run_on_host
from kernel_source import jit_from_source

NAN, INF = float("nan"), float("inf")


def _kernel(source: str, tag: str, namespace=None):
    return jit_from_source(source, f"<review26 {tag}>", namespace=namespace)


def _compile(kernel, *args, arch="sm_90a", **constexprs):
    compiled = kernel.compile(*args, target=arch, **constexprs)
    if ptxas_available():
        assemble(compiled.asm["ptx"], arch)
    return compiled


def _after_passes(kernel, args, grid=(1,), arch="sm_90a", num_warps=4, num_stages=3, **constexprs):
    """Run `kernel` in the interpreter on its IR after the compiler's default pass pipeline."""
    from fusedops.dsl.passes.manager import run_pipeline
    from fusedops.dsl.passes.pipeline import default_pipeline
    fresh = dsl.jit(kernel.fn)
    function = fresh.ir(*args, **constexprs)
    run_pipeline(function, default_pipeline(num_warps, arch, num_stages=num_stages))
    interpret_ir(fresh, function, grid, args, constexprs)


# ================================================================================================
# DEFECT: bitcast of an int literal is a value conversion
# ================================================================================================
_BITCAST_LITERAL = _kernel(
    "def k(o_ptr, n):\n"
    "    dsl.store(o_ptr, dsl.cast(0x7F800000, dsl.float32, bitcast=True))\n"
    "    dsl.store(o_ptr + 1, dsl.cast(1, dsl.float32, bitcast=True))\n"
    "    dsl.store(o_ptr + 2, dsl.cast(n, dsl.float32, bitcast=True))\n", "bitcast_literal")


def test_bitcast_of_runtime_ints_and_float_literals_reinterprets_the_bits():
    out = torch.zeros(3)
    _BITCAST_LITERAL[(1,)](out, 0x7F800000, interpret=True)
    assert out[2].item() == INF                     # the same bits in a runtime int32: inf
    k = _kernel("def k(o_ptr):\n    dsl.store(o_ptr, dsl.cast(1.0, dsl.int32, bitcast=True))\n"
                "    dsl.store(o_ptr + 1, dsl.cast(-1, dsl.uint32, bitcast=True).to(dsl.int64))\n", "bitcast_float_literal")
    ints = torch.zeros(2, dtype=torch.int64)
    k[(1,)](ints, interpret=True)
    assert ints.tolist() == [0x3F800000, 0xFFFFFFFF]


def test_bitcast_of_an_int_literal_reinterprets_its_bits():
    out = torch.zeros(3)
    _BITCAST_LITERAL[(1,)](out, 0x7F800000, interpret=True)
    assert out[0].item() == INF, out.tolist()       # was 2139095040.0
    assert out[1].item() == 2.0 ** -149             # was 1.0


# ================================================================================================
# DEFECT: runtime values taken as True where a compile-time flag is needed (bitcast=, hex=)
# ================================================================================================
_RUNTIME_FLAGS = {
    "to_bitcast": "dsl.store(o_ptr, n.to(dsl.float32, bitcast=n > 0))",
    "cast_bitcast": "dsl.store(o_ptr, dsl.cast(n, dsl.float32, bitcast=n))",
    "print_hex": "dsl.device_print('n', n, hex=n > 0)",
}


def test_runtime_reverse_and_keep_dims_are_refused():
    for body in ("dsl.store(o_ptr + dsl.arange(0, 4), dsl.cumsum(dsl.arange(0, 4), 0, n > 0).to(dsl.float32))",
                 "dsl.store(o_ptr, dsl.sum(dsl.arange(0, 4), axis=0, keep_dims=n > 0).to(dsl.float32))"):
        kernel = _kernel(f"def k(o_ptr, n):\n    {body}\n", "flag_ok")
        with pytest.raises(dsl.CompilationError, match="constexpr"):
            kernel[(1,)](torch.zeros(4), 3, interpret=True)


@pytest.mark.parametrize("what", sorted(_RUNTIME_FLAGS))
def test_runtime_value_as_a_compile_time_flag_is_refused(what):
    kernel = _kernel(f"def k(o_ptr, n):\n    {_RUNTIME_FLAGS[what]}\n", f"flag_{what}")
    with pytest.raises(dsl.CompilationError, match="constexpr|compile[- ]time"):
        kernel[(1,)](torch.zeros(1), 3, interpret=True)


# ================================================================================================
# DEFECT (messages): more places that print "Value(n: int32)" for a runtime value
# ================================================================================================
_NAMED_PLAINLY = {
    "cache_modifier": "dsl.store(o_ptr, dsl.load(o_ptr, cache_modifier=n))",
    "eviction_policy": "dsl.store(o_ptr, 1.0, eviction_policy=n)",
    "atomic_sem": "dsl.atomic_add(o_ptr, 1.0, sem=n)",
    "atomic_scope": "dsl.atomic_add(o_ptr, 1.0, scope=n)",
    "dot_input_precision": "a = dsl.zeros((16, 16), dsl.float32)\n    dsl.store(o_ptr, dsl.max(dsl.max(dsl.dot(a, a, input_precision=n), axis=0), axis=0))",
    "dot_out_dtype": "a = dsl.zeros((16, 16), dsl.float32)\n    dsl.store(o_ptr, dsl.max(dsl.max(dsl.dot(a, a, out_dtype=n), axis=0), axis=0))",
    "zeros_dtype": "dsl.store(o_ptr, dsl.sum(dsl.zeros((4,), n), axis=0))",
    "launch_bounds": "dsl.launch_bounds(n)",
    "cluster_dims": "dsl.cluster_dims(n)",
}


@pytest.mark.parametrize("what", sorted(_NAMED_PLAINLY))
def test_more_runtime_values_where_a_constexpr_is_needed_are_named_plainly(what):
    kernel = _kernel(f"def k(o_ptr, n):\n    {_NAMED_PLAINLY[what]}\n", f"plain_{what}")
    with pytest.raises(dsl.CompilationError, match=f"<review26 plain_{what}>:") as info:
        kernel[(1,)](torch.zeros(1), 3, interpret=True)
    assert "Value(" not in str(info.value), str(info.value)


# ================================================================================================
# Passing: shifts by >= the width, NaN comparisons: compiled (on the host) == interpreted
# ================================================================================================
_SHIFT = _kernel("def k(o_ptr, x_ptr, s_ptr):\n    x = dsl.load(x_ptr)\n    s = dsl.load(s_ptr)\n"
                 "    dsl.store(o_ptr, x << s)\n    dsl.store(o_ptr + 1, x >> s)\n", "shift")


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64])
def test_shifts_past_the_width_compiled_as_interpreted(dtype):
    bits = torch.iinfo(dtype).bits
    value = -77 if dtype.is_signed else 201
    expected_right_fill = -1 if dtype.is_signed else 0
    for amount in sorted({0, 1, bits - 1, bits, bits + 1, 100 if bits > 8 else 9, -1 if dtype.is_signed else 255}):
        if not torch.iinfo(dtype).min <= amount <= torch.iinfo(dtype).max:
            continue
        x, s = torch.tensor([value], dtype=dtype), torch.tensor([amount], dtype=dtype)
        interpreted, compiled = torch.zeros(2, dtype=dtype), torch.zeros(2, dtype=dtype)
        _SHIFT[(1,)](interpreted, x, s, interpret=True)
        run_on_host(_SHIFT, compiled, x, s)
        assert interpreted.tolist() == compiled.tolist(), (dtype, amount)
        if not 0 <= amount < bits:
            assert interpreted.tolist() == [0, expected_right_fill], (dtype, amount)


def test_nan_and_signed_zero_comparisons_compiled_as_interpreted():
    kernel = _kernel("def k(o_ptr, x_ptr, y_ptr):\n    x = dsl.load(x_ptr)\n    y = dsl.load(y_ptr)\n"
                     "    dsl.store(o_ptr, x != y)\n    dsl.store(o_ptr + 1, x == y)\n    dsl.store(o_ptr + 2, x < y)\n"
                     "    dsl.store(o_ptr + 3, not (x < y))\n    dsl.store(o_ptr + 4, x >= y)\n", "nan_compare")
    for a, b, expected in [(NAN, 1.0, [1, 0, 0, 1, 0]), (NAN, NAN, [1, 0, 0, 1, 0]), (0.0, -0.0, [0, 1, 0, 1, 1])]:
        x, y = torch.tensor([a]), torch.tensor([b])
        interpreted, compiled = torch.zeros(5, dtype=torch.int32), torch.zeros(5, dtype=torch.int32)
        kernel[(1,)](interpreted, x, y, interpret=True)
        run_on_host(kernel, compiled, x, y)
        assert interpreted.tolist() == compiled.tolist() == expected


# ================================================================================================
# Passing: conversions (64-bit ints -> float32 rounded once; float -> int saturating), interpreted and on the host
# ================================================================================================
def _round_int(value: int, bits: int) -> int:
    extra = abs(value).bit_length() - bits
    if extra <= 0:
        return value
    q, r = divmod(abs(value), 1 << extra)
    if r > 1 << (extra - 1) or (r == 1 << (extra - 1) and q & 1):
        q += 1
    return (q << extra) * (1 if value >= 0 else -1)


def test_wide_ints_to_float32_round_once():
    kernel = _kernel("def k(o_ptr, x_ptr):\n    dsl.store(o_ptr, dsl.load(x_ptr).to(dsl.float32))\n", "i64_f32")
    cases = [(torch.int64, 2**60 + 2**36 + 1), (torch.int64, -(2**60 + 2**36 + 1)), (torch.int64, 2**63 - 1),
             (torch.uint64, 2**63 + 2**39 + 1), (torch.uint64, 2**64 - 1)]
    for dtype, value in cases:
        x = torch.tensor([value - 2**64 if value >= 2**63 else value], dtype=torch.int64).view(dtype)
        interpreted, compiled = torch.zeros(1), torch.zeros(1)
        kernel[(1,)](interpreted, x, interpret=True)
        run_on_host(kernel, compiled, x)
        assert interpreted.item() == compiled.item() == float(_round_int(value, 24)), value


@pytest.mark.parametrize("target", ["int32", "uint32", "int64", "uint64", "uint8"])
def test_float_to_int_saturates_on_the_host_as_in_the_interpreter(target):
    kernel = _kernel(f"def k(o_ptr, x_ptr):\n    dsl.store(o_ptr, dsl.load(x_ptr).to(dsl.{target}))\n", f"f2i_{target}")
    info = {"int32": (-2**31, 2**31 - 1), "uint32": (0, 2**32 - 1), "int64": (-2**63, 2**63 - 1),
            "uint64": (0, 2**64 - 1), "uint8": (0, 255)}[target]
    out_dtype = getattr(torch, target)
    for source in (torch.float32, torch.float64):
        for value in (NAN, INF, -INF, -1.5, 3.7, 2.0**31, 2.0**63, 2.0**64, -2.0**63, 1e30):
            x = torch.tensor([value], dtype=source)
            interpreted, compiled = torch.zeros(1, dtype=out_dtype), torch.zeros(1, dtype=out_dtype)
            kernel[(1,)](interpreted, x, interpret=True)
            run_on_host(kernel, compiled, x)
            got = [int(v) for v in interpreted.view(-1).to(torch.uint64 if target == "uint64" else torch.int64).tolist()]
            host = [int(v) for v in compiled.view(-1).to(torch.uint64 if target == "uint64" else torch.int64).tolist()]
            stored = float(x.item())
            expected = 0 if stored != stored else max(info[0], min(info[1], int(stored) if abs(stored) != INF
                                                                   else (info[1] if stored > 0 else info[0])))
            assert got == host == [expected], (source, value)


def test_float64_literals_round_once_to_16_bit_floats_interpreted_and_compiled():
    for name, dtype, value, expected, bits in [("float16", torch.float16, 1 + 2**-11 + 2**-40, 1 + 2**-10, "0xH3C01"),
                                               ("bfloat16", torch.bfloat16, 1 + 2**-8 + 2**-40, 1 + 2**-7, "0xR3F81")]:
        kernel = _kernel(f"def k(o_ptr, x_ptr):\n    i = dsl.arange(0, 4)\n"
                         f"    dsl.store(o_ptr + i, dsl.load(x_ptr + i) + {value!r})\n", f"literal_{name}")
        x, out = torch.zeros(4, dtype=dtype), torch.zeros(4, dtype=dtype)
        kernel[(1,)](out, x, interpret=True)
        assert out.tolist() == [expected] * 4
        assert bits in _compile(kernel, out, x).asm["llir"]


def test_sixteen_bit_multiply_add_is_not_contracted():
    kernel = _kernel("def k(o_ptr, x_ptr, y_ptr, z_ptr):\n    x = dsl.load(x_ptr)\n    y = dsl.load(y_ptr)\n"
                     "    z = dsl.load(z_ptr)\n    dsl.store(o_ptr, x * y + z)\n", "no_contract")
    for dtype, arch in [(torch.bfloat16, "sm_80"), (torch.float16, "sm_90a"), (torch.float32, "sm_90a")]:
        t = torch.zeros(1, dtype=dtype)
        ptx = _compile(kernel, t, t, t, t, arch=arch).asm["ptx"]
        fmas = re.findall(r"\bfma\.rn\.[a-z0-9]+", ptx)
        assert len(fmas) == (2 if (dtype, arch) == (torch.bfloat16, "sm_80") else 0), (dtype, arch, fmas)


def test_narrow_unsigned_pointer_offsets_are_zero_extended():
    kernel = _kernel("def k(o_ptr, x_ptr, i_ptr):\n    dsl.store(o_ptr, dsl.load(x_ptr + dsl.load(i_ptr)))\n", "uoffset")
    x = torch.arange(70000, dtype=torch.float32)
    for dtype, index in [(torch.uint8, 200), (torch.uint16, 40000), (torch.int8, 100)]:
        i = torch.tensor([index], dtype=dtype)
        interpreted, compiled = torch.zeros(1), torch.zeros(1)
        kernel[(1,)](interpreted, x, i, interpret=True)
        run_on_host(kernel, compiled, x, i)
        assert interpreted.item() == compiled.item() == float(index)


# ================================================================================================
# Passing: unsigned / bool reductions, argmax, cumsum; uint8 dots
# ================================================================================================
_REDUCE_SRC = """def k(o_ptr, x_ptr, M: dsl.constexpr, N: dsl.constexpr):
    r = dsl.arange(0, M)[:, None]
    c = dsl.arange(0, N)[None, :]
    x = dsl.load(x_ptr + r * N + c)
    dsl.store(o_ptr + {target}, {expr})
"""


def _reduce(expr, target, x, out_dtype, n_out, tag):
    kernel = _kernel(_REDUCE_SRC.format(expr=expr, target=target), tag)
    out = torch.zeros(n_out, dtype=out_dtype)
    kernel[(1,)](out, x.reshape(-1), M=x.shape[0], N=x.shape[1], interpret=True)
    return out


def test_unsigned_and_bool_reductions_follow_torch():
    g = torch.Generator().manual_seed(26)
    wide = torch.randint(0, 2**32, (4, 8), generator=g, dtype=torch.int64)
    x = wide.to(torch.uint32)
    assert _reduce("dsl.max(x, axis=1).to(dsl.int64)", "dsl.arange(0, M)", x, torch.int64, 4, "umax").tolist() \
        == wide.max(1).values.tolist()
    assert _reduce("dsl.argmax(x, axis=1)", "dsl.arange(0, M)", x, torch.int32, 4, "uargmax").tolist() \
        == wide.argmax(1).tolist()
    assert _reduce("dsl.argmin(x, axis=None)", "0", x, torch.int32, 1, "uargmin_all").item() \
        == wide.reshape(-1).argmin().item()
    flags = torch.rand(4, 8, generator=g) > 0.5
    assert _reduce("dsl.argmax(x, axis=1)", "dsl.arange(0, M)", flags, torch.int32, 4, "bargmax").tolist() \
        == flags.int().argmax(1).tolist()
    assert _reduce("dsl.sum(x, axis=1)", "dsl.arange(0, M)", flags, torch.int32, 4, "bsum").tolist() \
        == flags.int().sum(1).tolist()
    assert _reduce("dsl.cumsum(x, axis=1)", "r * N + c", flags, torch.int32, 32, "bcumsum").tolist() \
        == flags.int().cumsum(1).reshape(-1).tolist()
    small = torch.full((4, 8), 100, dtype=torch.int8)
    assert _reduce("dsl.cumsum(x, axis=1, reverse=True)", "r * N + c", small, torch.int32, 32, "i8cumsum")[:8].tolist() \
        == [800, 700, 600, 500, 400, 300, 200, 100]


_DOT = _kernel("""def k(o_ptr, a_ptr, b_ptr, M: dsl.constexpr, N: dsl.constexpr, KK: dsl.constexpr):
    m = dsl.arange(0, M)
    n = dsl.arange(0, N)
    kk = dsl.arange(0, KK)
    a = dsl.load(a_ptr + m[:, None] * KK + kk[None, :])
    b = dsl.load(b_ptr + kk[:, None] * N + n[None, :])
    dsl.store(o_ptr + m[:, None] * N + n[None, :], dsl.dot(a, b))
""", "dot")


def test_uint8_dot_is_unsigned_interpreted_and_compiled():
    g = torch.Generator().manual_seed(26)
    a = torch.randint(0, 256, (16 * 32,), generator=g).to(torch.uint8)
    b = torch.randint(0, 256, (32 * 16,), generator=g).to(torch.uint8)
    out = torch.zeros(256, dtype=torch.int32)
    _DOT[(1,)](out, a, b, M=16, N=16, KK=32, interpret=True)
    assert torch.equal(out.long(), (a.long().reshape(16, 32) @ b.long().reshape(32, 16)).reshape(-1))
    ptx = _compile(_DOT, out, a, b, M=16, N=16, KK=32).asm["ptx"]
    assert "mul.wide.u16" in ptx and ".s8" not in ptx and "mul.wide.s16" not in ptx


# ================================================================================================
# Passing: small shapes, control flow (returns, short-circuit while conditions), compiled too
# ================================================================================================
_PROGRAMS = {
    "zeros_0d": ("def k(o_ptr, n):\n    dsl.store(o_ptr, dsl.zeros((), dsl.int32) + n)\n", [3, 0, 0, 0]),
    "arange_1": ("def k(o_ptr, n):\n    i = dsl.arange(0, 1)\n"
                 "    dsl.store(o_ptr + i, dsl.sum(i + n, axis=0) + dsl.max(i, axis=0))\n", [3, 0, 0, 0]),
    "reshape_0d": ("def k(o_ptr, n):\n    dsl.store(o_ptr, dsl.reshape(dsl.arange(0, 1) + n, ()))\n", [3, 0, 0, 0]),
    "scalar_none": ("def k(o_ptr, n):\n    dsl.store(o_ptr + dsl.arange(0, 1), n[None])\n", [3, 0, 0, 0]),
    "nested_return": ("def k(o_ptr, n):\n    if n > 0:\n        if n > 5:\n            dsl.store(o_ptr, 1)\n"
                      "            return\n        dsl.store(o_ptr + 1, 2)\n    dsl.store(o_ptr + 2, 3)\n", [0, 2, 3, 0]),
    "constexpr_return": ("def k(o_ptr, n, F: dsl.constexpr = True):\n    if F:\n        dsl.store(o_ptr, n)\n"
                         "        return\n    dsl.store(o_ptr + 1, n)\n", [3, 0, 0, 0]),
    "while_and_load": ("def k(o_ptr, n):\n    i = 0\n    while i < n and dsl.load(o_ptr + 8 + i) > 0:\n        i += 1\n"
                       "    dsl.store(o_ptr, i)\n", [3, 0, 0, 0]),
    "while_chained": ("def k(o_ptr, n):\n    i = 0\n    while 0 <= i < n and dsl.load(o_ptr + 8 + i) > 0:\n"
                      "        i += 1\n    dsl.store(o_ptr, i)\n", [3, 0, 0, 0]),
    "while_not_or": ("def k(o_ptr, n):\n    i = 0\n    while not (i >= n or dsl.load(o_ptr + 8 + i) <= 0):\n"
                     "        i += 1\n    dsl.store(o_ptr, i)\n", [3, 0, 0, 0]),
    "while_ifexp": ("def k(o_ptr, n):\n    i = 0\n    while (dsl.load(o_ptr + 8 + i) > 0 if i < n else False):\n"
                    "        i += 1\n    dsl.store(o_ptr, i)\n", [3, 0, 0, 0]),
    "while_tuple": ("def k(o_ptr, n):\n    t = (0, 1)\n    while t[0] < n:\n        t = (t[0] + 1, t[1] * 2)\n"
                    "    dsl.store(o_ptr, t[1])\n", [8, 0, 0, 0]),
}


@pytest.mark.parametrize("name", sorted(_PROGRAMS))
def test_small_shapes_and_control_flow(name):
    source, expected = _PROGRAMS[name]
    kernel = _kernel(source, name)
    out = torch.zeros(11, dtype=torch.int32)
    out[8:] = 1                  # three ones; reading o_ptr + 11 would be out of bounds
    kernel[(1,)](out, 3, interpret=True)
    assert out[:4].tolist() == expected
    _compile(kernel, out, 3)


def test_helper_with_an_early_return():
    source = ("@dsl.jit\ndef h(x):\n    if x > 2:\n        return x * 2\n    return x + 100\n\n"
              "def k(o_ptr, n):\n    dsl.store(o_ptr, h(n))\n    dsl.store(o_ptr + 1, h(n - 2))\n")
    kernel = _kernel(source, "helper_return")
    out = torch.zeros(2, dtype=torch.int32)
    kernel[(1,)](out, 3, interpret=True)
    assert out.tolist() == [6, 101]
    _compile(kernel, out, 3, arch="sm_80")


# ================================================================================================
# Passing: the pass pipeline (induction variables, dot accumulation, folding) keeps the frontend's results
# ================================================================================================
_PIPELINE_CASES = {
    "pointer_read_after_loop": ("""def k(o_ptr, x_ptr, n, s):
    p = x_ptr
    acc = 0.0
    for i in range(0, n, 2):
        acc += dsl.load(p)
        p += s
    dsl.store(o_ptr, acc)
    dsl.store(o_ptr + 1, dsl.load(p))
""", lambda: [torch.zeros(2), torch.arange(100.), 7, 3]),
    "negative_runtime_step": ("""def k(o_ptr, a, b, s):
    j = 0
    c = 0
    for i in range(a, b, s):
        j += 4
        c += i
    dsl.store(o_ptr, j.to(dsl.float32))
    dsl.store(o_ptr + 1, c.to(dsl.float32))
""", lambda: [torch.zeros(2), 10, -7, -3]),
    "empty_and_wrapping": ("""def k(o_ptr, n):
    j = 1
    w = 0
    for i in range(n, 0, 3):
        j += 5
    for i in range(n):
        w += 1073741824
    dsl.store(o_ptr, j.to(dsl.float32))
    dsl.store(o_ptr + 1, w.to(dsl.float32))
""", lambda: [torch.zeros(2), 7]),
    "int64_range_int32_carry": ("""def k(o_ptr, lo, hi):
    j = 0
    for i in range(lo, hi, 1000000000):
        j += 7
    dsl.store(o_ptr, j.to(dsl.float32))
""", lambda: [torch.zeros(1), -2**40, 2**40]),
    "nested_reset_and_block_carry": ("""def k(o_ptr, x_ptr, n, m):
    for i in range(n):
        p = x_ptr + i * 10 + dsl.arange(0, 2)
        for j in range(m):
            dsl.store(o_ptr + (i * m + j) * 2 + dsl.arange(0, 2), dsl.load(p))
            p += 3
""", lambda: [torch.zeros(24), torch.arange(100.), 3, 4]),
    "offset_from_body": ("""def k(o_ptr, n, s):
    j = 0
    t = 1
    for i in range(n):
        o = dsl.minimum(s * 3, 10) << 1
        j += o
        j -= t
        t += 2
    dsl.store(o_ptr, j.to(dsl.float32))
    dsl.store(o_ptr + 1, t.to(dsl.float32))
""", lambda: [torch.zeros(2), 5, 2]),
    "descriptor_negative_offsets": ("""def k(o_ptr, x_ptr, M, N, s0, off0, off1):
    desc = dsl.make_tensor_descriptor(x_ptr, (M, N), (s0, 1), (4, 4))
    r = dsl.arange(0, 4)
    dsl.store(o_ptr + r[:, None] * 4 + r[None, :], desc.load((off0, off1)))
""", lambda: [torch.zeros(16), torch.arange(35.), 5, 7, 7, -2, 5]),
}


@pytest.mark.parametrize("name", sorted(_PIPELINE_CASES))
def test_pass_pipeline_keeps_the_frontend_results(name):
    source, make = _PIPELINE_CASES[name]
    kernel = _kernel(source, f"pipeline_{name}")
    before, after = make(), make()
    kernel[(1,)](*before, interpret=True)
    _after_passes(kernel, after)
    assert before[0].tolist() == after[0].tolist()
    assert before[0].abs().sum() > 0


def test_pipeline_reference_values():
    kernel = _kernel(_PIPELINE_CASES["negative_runtime_step"][0], "pipeline_values")
    out = torch.zeros(2)
    kernel[(1,)](out, 10, -7, -3, interpret=True)
    trips = list(range(10, -7, -3))
    assert out.tolist() == [4.0 * len(trips), float(sum(trips))]


# ================================================================================================
# Passing: layouts of dot results feeding argmax / cumsum / trans / reshape compile on wgmma and mma
# ================================================================================================
@pytest.mark.parametrize("arch", ["sm_90a", "sm_80"])
def test_dot_results_feeding_scans_and_shape_ops_compile(arch):
    source = """def k(o_ptr, a_ptr, b_ptr, M: dsl.constexpr, N: dsl.constexpr, KK: dsl.constexpr):
    m = dsl.arange(0, M)
    n = dsl.arange(0, N)
    kk = dsl.arange(0, KK)
    c = dsl.dot(dsl.load(a_ptr + m[:, None] * KK + kk[None, :]), dsl.load(b_ptr + kk[:, None] * N + n[None, :]))
    dsl.store(o_ptr + m, dsl.argmax(c, axis=1).to(dsl.float32))
    dsl.store(o_ptr + M + m[:, None] * N + n[None, :], dsl.cumsum(c, axis=0, reverse=True))
    dsl.store(o_ptr + 2 * M * N + n[:, None] * M + m[None, :], dsl.trans(c))
"""
    kernel = _kernel(source, f"dot_layouts_{arch}")
    a = torch.zeros(64 * 32, dtype=torch.float16)
    _compile(kernel, torch.zeros(4 * 64 * 64), a, a, M=64, N=64, KK=32, arch=arch)
