"""Review of the kernel language, session 6: cases modelled on real Triton bug reports (integer division
and modulo of negatives, shifts, casts, NaN in reductions, argmax ties, cumsum axes, masked loads,
`other` of another dtype, 3-D grids, constexpr, loops, atomics' returned values, small dots, math at
special values, launch errors), each run by the interpreter on the CPU and, as a `cuda` variant, by the
compiled kernel on the GPU against the same reference.

Bugs found (each test marked `# BUG:` asserts the correct behaviour):
- a float16 constant beyond the type's range (`x_fp16 + 70000.0`, `other=1e6`, `dsl.full(..., 1e6,
  dsl.float16)`) crashed code generation with a Python OverflowError from llvmlite (the interpreter gives
  inf): fixed, codegen/shapes.py `_scalar_constant` rounds to half (inf beyond 65504).
Found at the end of session 6 (GPU only), fixed in session 7:
- `for i in range(lb, ub, step)` whose last `i + step` overflows the induction type: the interpreter
  runs Python's range, the compiled loop wrapped around and kept going (codegen/control.py `_for` now
  counts a narrower induction variable in 64 bits and stops a 64-bit one when the step overflows).
- an atomic's returned old values in a layout that replicates the block (block smaller than the CTA):
  non-owning copies held 0 instead of the old value, so a reduction of them stored as a scalar (every
  thread stores) or an address computed from them was wrong (Triton issue #7402); copies now get their
  owner's value (codegen/ownership.py `owners_values`).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import fusedops.dsl as dsl
from helpers import assert_close
from test_gpu_semantics import int_kernel, unary_kernel

NAN, INF = float("nan"), float("inf")
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


def _run(kernel, grid, *args, device, num_warps=4, **constexprs):
    """Launch with the interpreter on the CPU, compiled on CUDA (whatever FUSEDOPS_INTERPRET says)."""
    kernel[grid](*args, num_warps=num_warps, interpret=(device == "cpu"), **constexprs)


def _t(values, dtype, device):
    return torch.tensor(values, dtype=dtype, device=device)


def _assert_same(actual, expected):
    """Exact equality, NaN equal to NaN, and the sign of zeros checked."""
    actual, expected = actual.cpu(), torch.as_tensor(expected).to(actual.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    if actual.dtype.is_floating_point:
        same = (actual == expected) | (actual.isnan() & expected.isnan())
        same &= (actual.signbit() == expected.signbit()) | actual.isnan()
    else:
        same = actual == expected
    assert bool(same.all()), f"got {actual.tolist()}, expected {expected.tolist()}"


def _compiles_and_assembles(kernel, *args, **constexprs):
    from fusedops.dsl.target import assemble, ptxas_available
    compiled = kernel.compile(*args, target="sm_90a", **constexprs)
    if ptxas_available():
        assemble(compiled.asm["ptx"], "sm_90a")


# -- bugs -------------------------------------------------------------------------------------------

@dsl.jit
def _half_constant_kernel(o_ptr, x_ptr, n, MODE: dsl.constexpr, BIG: dsl.constexpr):
    i = dsl.arange(0, 4)
    x = dsl.load(x_ptr + i, mask=i < n, other=BIG)
    if MODE == 0:
        y = x + BIG
    elif MODE == 1:
        y = dsl.full((4,), BIG, x.dtype) + x
    else:
        y = x
    dsl.store(o_ptr + i, y)


_BEYOND = [(torch.float16, 70000.0), (torch.float16, 1e6), (torch.bfloat16, 1e39)]


@pytest.mark.parametrize("dtype, big", _BEYOND)
@pytest.mark.parametrize("mode", [0, 1, 2])
def test_half_constant_beyond_range_compiles_to_inf(mode, dtype, big):
    # BUG (fixed): an fp16 constant past 65504 crashed codegen (llvmlite OverflowError in _scalar_constant).
    x, out = torch.ones(4, dtype=dtype), torch.zeros(4, dtype=dtype)
    _half_constant_kernel[(1,)](out, x, 2, MODE=mode, BIG=big, interpret=True)
    _assert_same(out, [1.0, 1.0, INF, INF] if mode == 2 else [INF] * 4)
    _compiles_and_assembles(_half_constant_kernel, out, x, 2, MODE=mode, BIG=big)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype, big", _BEYOND)
@pytest.mark.parametrize("mode", [0, 1, 2])
def test_half_constant_beyond_range_on_gpu(mode, dtype, big):
    # BUG: same as above, compiled and run.
    x, out = torch.ones(4, dtype=dtype, device="cuda"), torch.zeros(4, dtype=dtype, device="cuda")
    _half_constant_kernel[(1,)](out, x, 2, MODE=mode, BIG=big, interpret=False)
    _assert_same(out, [1.0, 1.0, INF, INF] if mode == 2 else [INF] * 4)


@dsl.jit
def _range_count_kernel(o_ptr, lb, ub, step):
    count = 0
    for i in range(lb, ub, step):
        count += 1
    dsl.store(o_ptr, count)


_OVERFLOWING_RANGES = [(2**31 - 2, 2**31 - 1, 2**31 - 1), (-2**31 + 1, -2**31, -(2**31 - 1)),
                       (2**31 - 10, 2**31 - 1, 4), (-2**31 + 9, -2**31, -4),
                       (2**63 - 2, 2**63 - 1, 2**63 - 1), (-2**63 + 1, -2**63, -(2**63 - 1)),
                       (2**63 - 10, 2**63 - 1, 4)]


@pytest.mark.parametrize("bounds", _OVERFLOWING_RANGES)
def test_range_whose_last_step_overflows_interpreted(bounds):
    out = torch.zeros(1, dtype=torch.int32)
    _range_count_kernel[(1,)](out, *bounds, interpret=True)
    assert out.item() == len(range(*bounds))


@pytest.mark.cuda
@pytest.mark.parametrize("bounds", _OVERFLOWING_RANGES)
def test_range_whose_last_step_overflows_on_gpu(bounds, tmp_path):
    # BUG (fixed): the compiled loop computed iv + step in int32, wrapped and ran ~2**31 times (or forever).
    # Run in a subprocess with a timeout: with the bug the kernel may not finish quickly.
    script = tmp_path / "loop.py"
    script.write_text(textwrap.dedent(f"""
        import sys, torch
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_review_dsl_session6 import _range_count_kernel
        out = torch.zeros(1, dtype=torch.int32, device="cuda")
        _range_count_kernel[(1,)](out, {bounds[0]}, {bounds[1]}, {bounds[2]}, interpret=False)
        print("COUNT", out.item())
    """))
    try:
        result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("the loop did not finish in 120 s (induction variable overflow)")
    assert result.returncode == 0, result.stderr
    assert f"COUNT {len(range(*bounds))}" in result.stdout, result.stdout


@dsl.jit
def _atomic_old_sum_kernel(counter_ptr, out_ptr, BLOCK: dsl.constexpr):
    i = dsl.arange(0, BLOCK)
    old = dsl.atomic_add(counter_ptr + i, 1)
    dsl.store(out_ptr, dsl.sum(old, axis=0))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("block", [8, 32])
def test_atomic_old_values_reduced_in_a_replicated_layout(block, device):
    # BUG (cuda, fixed): BLOCK < 128 threads: non-owner copies of `old` were 0, every thread stored its sum.
    counter = (torch.arange(block, dtype=torch.int32) * 10).to(device)
    out = torch.full((1,), -1, dtype=torch.int32, device=device)
    _run(_atomic_old_sum_kernel, (1,), counter, out, device=device, num_warps=4, BLOCK=block)
    assert out.item() == 10 * block * (block - 1) // 2
    assert counter.cpu().tolist() == [10 * k + 1 for k in range(block)]


@dsl.jit
def _atomic_old_as_address_kernel(index_ptr, out_ptr):
    # Triton issue #7402: the old value of a one-element atomic used as a row index of a (1, 8) store.
    row = dsl.atomic_add(index_ptr + dsl.arange(0, 1), 1)
    dsl.store(out_ptr + row[:, None] * 8 + dsl.arange(0, 8)[None, :], dsl.full((1, 8), 2, dsl.int64))


@pytest.mark.parametrize("device", DEVICES)
def test_atomic_old_value_used_as_an_address(device):
    # BUG (cuda, fixed): threads that did not perform the atomic saw row 0 and stored there.
    index = torch.ones(1, dtype=torch.int32, device=device)
    out = torch.zeros(2, 8, dtype=torch.int64, device=device)
    _run(_atomic_old_as_address_kernel, (1,), index, out, device=device)
    assert out.cpu().tolist() == [[0] * 8, [2] * 8]
    assert index.item() == 2


@dsl.jit
def _publish_kernel(data_ptr, flag_ptr, out_ptr, BLOCK: dsl.constexpr):
    # Program 0 stores a block (every thread a part) and then sets a flag; program 1 waits for the flag and
    # copies the block. The flag's release must order all of program 0's stores, not only thread 0's.
    i = dsl.arange(0, BLOCK)
    if dsl.program_id(0) == 0:
        dsl.store(data_ptr + i, i + 1)
        dsl.atomic_xchg(flag_ptr, 1, sem="release")
    else:
        seen = dsl.atomic_add(flag_ptr, 0, sem="acquire")
        while seen == 0:
            seen = dsl.atomic_add(flag_ptr, 0, sem="acquire")
        dsl.store(out_ptr + i, dsl.load(data_ptr + i))


@pytest.mark.parametrize("device", DEVICES)
def test_scalar_atomic_release_orders_every_threads_writes(device):
    block = 4096
    for _ in range(5 if device == "cuda" else 1):
        data = torch.zeros(block, dtype=torch.int32, device=device)
        flag = torch.zeros(1, dtype=torch.int32, device=device)
        out = torch.full((block,), -1, dtype=torch.int32, device=device)
        _run(_publish_kernel, (2,), data, flag, out, device=device, num_warps=8, BLOCK=block)
        assert torch.equal(out.cpu(), torch.arange(1, block + 1, dtype=torch.int32))


def test_scalar_atomic_with_release_semantics_follows_a_barrier():
    from fusedops.dsl.target import ptxas_available, assemble
    x = torch.zeros(8, dtype=torch.int32)
    ptx = _publish_kernel.compile(x, x, x, BLOCK=1024, target="sm_90a", num_warps=4).asm["ptx"]
    release = ptx.index("atom.global.exch")
    assert "bar.sync" in ptx[:release][ptx[:release].rindex("st.global"):]
    if ptxas_available():
        assemble(ptx, "sm_90a")


@pytest.mark.parametrize("bounds", _OVERFLOWING_RANGES)
def test_range_whose_last_step_overflows_assembles(bounds):
    _compiles_and_assembles(_range_count_kernel, torch.zeros(1, dtype=torch.int32), *bounds)


# -- integer rules ----------------------------------------------------------------------------------

_INT_CASES = [
    # C semantics (truncation), x // 0 == -1, x % 0 == x, MIN // -1 wraps to MIN, MIN % -1 == 0.
    (torch.int32, "floordiv", [7, -7, 7, -7, -2**31, 5, 0, -1], [2, 2, -2, -2, -1, 0, 3, 4],
     [3, -3, -3, 3, -2**31, -1, 0, 0]),
    (torch.int32, "mod", [7, -7, 7, -7, -2**31, 5, 0, -1], [2, 2, -2, -2, -1, 0, 3, 4],
     [1, -1, 1, -1, 0, 5, 0, -1]),
    (torch.int8, "add", [127, -128, 100, 5, 0, 1, 2, 3], [1, -1, 100, -128, 0, 1, 2, 3],
     [-128, 127, -56, -123, 0, 2, 4, 6]),
    (torch.int8, "mul", [127, -128, 100, 5, 0, 1, 2, 3], [1, -1, 100, -128, 0, 1, 2, 3],
     [127, -128, 16, -128, 0, 1, 4, 9]),
    (torch.int8, "floordiv", [127, -128, 100, 5, 0, 1, -7, 3], [1, -1, 100, -128, 0, 1, 2, 3],
     [127, -128, 1, 0, -1, 1, -3, 1]),
    # shift amounts >= the width (or negative): 0, or the sign fill for an arithmetic right shift
    (torch.int8, "shr", [127, -128, 100, 5, -3, 1, 2, 3], [1, -1, 100, -128, 8, 1, 2, 3],
     [63, -1, 0, 0, -1, 0, 0, 0]),
    (torch.int32, "shl", [1, 1, 3, -1, 5, 6, 7, 8], [31, 32, 33, 1, 2, 3, 0, -1],
     [-2**31, 0, 0, -2, 20, 48, 7, 0]),
    (torch.int32, "min", [1, -2**31, 5, 2**31 - 1, 0, -1, 3, 3], [0, 0, -5, 0, 0, 0, 3, -3],
     [0, -2**31, -5, 0, 0, -1, 3, -3]),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype, op, a, b, expected", _INT_CASES)
def test_integer_rules(dtype, op, a, b, expected, device):
    out = torch.zeros(8, dtype=dtype, device=device)
    _run(int_kernel, (1,), out, _t(a, dtype, device), _t(b, dtype, device), 8, device=device, OP=op, BLOCK=8)
    _assert_same(out, expected)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op, expected", [("shl", [2**31, 0, 0, 4294967294, 20, 48, 7, 0]),
                                          ("shr", [0, 2**30, 0, 2**31 - 1, 1, 0, 7, 0]),
                                          ("floordiv", [0, 2**31, 0, 2**32 - 1, 2, 2, 2**32 - 1, 0]),
                                          ("max", [31, 2**31, 32, 2**32 - 1, 5, 6, 7, 100])])
def test_uint32_rules(op, expected, device):
    a = torch.tensor([1, 2**31, 3, 2**32 - 1, 5, 6, 7, 8], dtype=torch.int64).to(torch.uint32).to(device)
    b = torch.tensor([31, 1, 32, 1, 2, 3, 0, 100], dtype=torch.int64).to(torch.uint32).to(device)
    out = torch.zeros(8, dtype=torch.uint32, device=device)
    _run(int_kernel, (1,), out, a, b, 8, device=device, OP=op, BLOCK=8)
    assert out.cpu().to(torch.int64).tolist() == expected


@pytest.mark.parametrize("device", DEVICES)
def test_float_floordiv_floors_and_mod_is_fmod(device):
    a = _t([7., -7., 7., -7., 5.5, -5.5, 1., 0.], torch.float32, device)
    b = _t([2., 2., -2., -2., 2., 2., 0., 0.], torch.float32, device)
    out = torch.zeros(8, device=device)
    _run(int_kernel, (1,), out, a, b, 8, device=device, OP="floordiv", BLOCK=8)
    _assert_same(out, [3., -4., -4., 3., 2., -3., INF, NAN])
    _run(int_kernel, (1,), out, a, b, 8, device=device, OP="mod", BLOCK=8)
    _assert_same(out, torch.fmod(a.cpu(), b.cpu()))


@pytest.mark.parametrize("device", DEVICES)
def test_mixed_int_float_minimum_and_maximum_promote_to_float(device):
    a = _t([1, -3, 5, 7, 0, 2, 3, 4], torch.int32, device)
    b = _t([7., -7., 7., -7., 5.5, -5.5, 1., 0.], torch.float32, device)
    out = torch.zeros(8, device=device)
    _run(int_kernel, (1,), out, a, b, 8, device=device, OP="min", BLOCK=8)
    _assert_same(out, torch.minimum(a.cpu().float(), b.cpu()))
    _run(int_kernel, (1,), out, a, b, 8, device=device, OP="max", BLOCK=8)
    _assert_same(out, torch.maximum(a.cpu().float(), b.cpu()))


@pytest.mark.parametrize("device", DEVICES)
def test_abs_of_int_min_wraps(device):
    x = _t([-2**31, -1, 5, 0], torch.int32, device)
    out = torch.zeros(4, dtype=torch.int32, device=device)
    _run(unary_kernel, (1,), out, x, 4, device=device, OP="abs", BLOCK=4)
    _assert_same(out, [-2**31, 1, 5, 0])


_SPECIAL = [-INF, INF, NAN, 0.0, -0.0, -1.0, 100.0, -100.0]
_MATH = {"exp": torch.exp, "exp2": torch.exp2, "log": torch.log, "log2": torch.log2, "sqrt": torch.sqrt,
         "rsqrt": torch.rsqrt, "erf": torch.erf, "tanh": torch.tanh, "sigmoid": torch.sigmoid,
         "floor": torch.floor, "abs": torch.abs}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", sorted(_MATH))
def test_math_at_special_values(op, device):
    # exp(-inf) = 0, log(0) = -inf, log(-0) = -inf, sqrt(-1) = nan, rsqrt(-0) = -inf, tanh/erf saturate.
    x = _t(_SPECIAL, torch.float32, device)
    out = torch.zeros(8, device=device)
    _run(unary_kernel, (1,), out, x, 8, device=device, OP=op, BLOCK=8)
    reference = _MATH[op](x.cpu().double()).float().double()     # float32 range: exp(100) is inf
    finite = torch.isfinite(reference) & (reference != 0)
    _assert_same(out[~finite.to(out.device)], reference[~finite].float())     # inf, nan, signed zeros exactly
    assert_close(out[finite.to(out.device)], reference[finite], torch.float32)


# -- casts ------------------------------------------------------------------------------------------

@dsl.jit
def _cast_kernel(o_ptr, x_ptr, DT: dsl.constexpr, N: dsl.constexpr):
    i = dsl.arange(0, N)
    dsl.store(o_ptr + i, dsl.load(x_ptr + i).to(DT))


_TORCH_OF = {dsl.int32: torch.int32, dsl.int8: torch.int8, dsl.uint8: torch.uint8, dsl.int64: torch.int64,
             dsl.int16: torch.int16, dsl.bfloat16: torch.bfloat16}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("source, target, expected", [
    # float -> int truncates toward zero, saturates, NaN -> 0
    (torch.float32, dsl.int32, [0, 2**31 - 1, -2**31, 2**31 - 1, -2**31, 2, -2, 0]),
    (torch.float32, dsl.uint8, [0, 255, 0, 255, 0, 2, 0, 0]),
    (torch.float32, dsl.int8, [0, 127, -128, 127, -128, 2, -2, 0]),
    (torch.float32, dsl.int64, [0, 2**63 - 1, -2**63, 3 * 10**9, -3 * 10**9, 2, -2, 0]),
    (torch.float16, dsl.int8, [0, 127, -128, 127, -128, 2, -2, 0]),
    (torch.float16, dsl.int16, [0, 32767, -32768, 32767, -32768, 2, -2, 0]),
])
def test_float_to_int_casts_truncate_and_saturate(source, target, expected, device):
    values = [NAN, INF, -INF, 3e9, -3e9, 2.7, -2.7, -0.5]
    if source == torch.float16:
        values = [NAN, INF, -INF, 65504., -65504., 2.7, -2.7, -0.5]
    x = _t(values, source, device)
    out = torch.zeros(8, dtype=_TORCH_OF[target], device=device)
    _run(_cast_kernel, (1,), out, x, device=device, DT=target, N=8)
    _assert_same(out, expected)


@pytest.mark.parametrize("device", DEVICES)
def test_int32_to_bfloat16_rounds_once(device):
    # 2**24 + 2**16 + 1 lies just above the midpoint of two bfloat16 values: one rounding goes up; a
    # double rounding through float32 (2**24 + 2**16, a tie) would go down to 2**24.
    x = _t([16842753, -16842753, 2**24 + 1, 1, 0, -1, 2**31 - 1, -2**31], torch.int32, device)
    out = torch.zeros(8, dtype=torch.bfloat16, device=device)
    _run(_cast_kernel, (1,), out, x, device=device, DT=dsl.bfloat16, N=8)
    _assert_same(out.float(), [16908288., -16908288., 2.**24, 1., 0., -1., 2.**31, -2.**31])


# -- reductions and scans ---------------------------------------------------------------------------

@dsl.jit
def _reduce_kernel(o_ptr, x_ptr, n, OP: dsl.constexpr, OTHER: dsl.constexpr, BLOCK: dsl.constexpr):
    i = dsl.arange(0, BLOCK)
    x = dsl.load(x_ptr + i, mask=i < n, other=OTHER)
    if OP == "sum":
        r = dsl.sum(x, axis=0)
    elif OP == "max":
        r = dsl.max(x, axis=0)
    elif OP == "min":
        r = dsl.min(x, axis=0)
    elif OP == "argmax":
        r = dsl.argmax(x, axis=0)
    else:
        r = dsl.argmin(x, axis=0)
    dsl.store(o_ptr, r)


_REDUCE_CASES = [
    ("max", [1., NAN, 3.], -INF, NAN), ("min", [1., NAN, 3.], INF, NAN), ("sum", [1., NAN], 0., NAN),
    ("max", [-INF, -INF], -INF, -INF), ("max", [], -INF, -INF), ("sum", [], 0., 0.),
    ("argmax", [1., 3., 3., 2.], -INF, 1), ("argmin", [2., 1., 1., 2.], INF, 1),
    ("argmax", [1., NAN, 3., NAN], -INF, 1), ("argmin", [1., NAN, 0., NAN], INF, 1),
    ("argmax", [-INF] * 3, -INF, 0), ("argmax", [5.] * 37, -INF, 0), ("argmin", [5.] * 37, INF, 0),
    ("argmax", [0.] * 36 + [7.], -INF, 36), ("sum", [1.] * 37, 0., 37.),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("block", [64, 1024])
@pytest.mark.parametrize("op, values, other, expected", _REDUCE_CASES)
def test_reductions_nan_inf_ties_and_masked_lengths(op, values, other, expected, block, device):
    x = torch.zeros(block, device=device)
    x[:len(values)] = torch.tensor(values)
    out = torch.full((1,), -99, dtype=torch.int32 if op.startswith("arg") else torch.float32, device=device)
    _run(_reduce_kernel, (1,), out, x, len(values), device=device, OP=op, OTHER=other, BLOCK=block)
    _assert_same(out, [expected])


@pytest.mark.parametrize("device", DEVICES)
def test_float16_sum_accumulates_in_float32(device):
    x = torch.full((64,), 60000., dtype=torch.float16, device=device)
    out = torch.zeros(1, device=device)
    _run(_reduce_kernel, (1,), out, x, 64, device=device, OP="sum", OTHER=0., BLOCK=64)
    assert out.item() == 64 * 60000.


@dsl.jit
def _axis_kernel(o_ptr, x_ptr, AXIS: dsl.constexpr, M: dsl.constexpr, N: dsl.constexpr, OP: dsl.constexpr):
    r = dsl.arange(0, M)[:, None]
    c = dsl.arange(0, N)[None, :]
    x = dsl.load(x_ptr + r * N + c)
    if OP == "cumsum":
        dsl.store(o_ptr + r * N + c, dsl.cumsum(x, axis=AXIS))
    else:
        y = dsl.argmax(x, axis=AXIS) if OP == "argmax" else dsl.sum(x, axis=AXIS)
        if AXIS == 0:
            dsl.store(o_ptr + dsl.arange(0, N), y)
        else:
            dsl.store(o_ptr + dsl.arange(0, M), y)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.float16, torch.int8])
@pytest.mark.parametrize("axis", [0, 1])
def test_cumsum_and_argmax_along_each_axis(axis, dtype, device):
    x = torch.randint(-5, 5, (4, 16)).to(dtype).to(device)
    out = torch.zeros(4, 16, dtype=torch.float32 if dtype == torch.float16 else dtype, device=device)
    _run(_axis_kernel, (1,), out, x, device=device, AXIS=axis, M=4, N=16, OP="cumsum")
    _assert_same(out, torch.cumsum(x.cpu().double(), dim=axis))
    index = torch.zeros(16 if axis == 0 else 4, dtype=torch.int32, device=device)
    _run(_axis_kernel, (1,), index, x, device=device, AXIS=axis, M=4, N=16, OP="argmax")
    # torch.argmax's ties are not documented as first on every device: compare with the first index
    reference = x.cpu().double()
    first = (reference == reference.max(dim=axis, keepdim=True).values).int().argmax(dim=axis)
    _assert_same(index, first)


# -- where, load/store masks and `other` ------------------------------------------------------------

@dsl.jit
def _where_kernel(o_ptr, x_ptr, MODE: dsl.constexpr, N: dsl.constexpr):
    i = dsl.arange(0, N)
    x = dsl.load(x_ptr + i)
    if MODE == 0:
        y = dsl.where(x > 0, 1.5, -2)
    elif MODE == 1:
        y = dsl.where(x > 0, x, 0)
    elif MODE == 2:
        y = dsl.sum(dsl.where(dsl.arange(0, 4)[:, None] < 2, x[None, :], -x[None, :]), axis=0)
    else:
        y = dsl.where(x > 0, x.to(dsl.int32), 0.5)
    dsl.store(o_ptr + i, y)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode, expected", [(0, [1.5, -2, 1.5, -2]), (1, [1, 0, 2, 0]), (2, [0, 0, 0, 0]),
                                            (3, [1, .5, 2, .5])])
def test_where_with_scalars_and_broadcasting(mode, expected, device):
    x = _t([1., -1., 2., -3.], torch.float32, device)
    out = torch.full((4,), -99., device=device)
    _run(_where_kernel, (1,), out, x, device=device, MODE=mode, N=4)
    _assert_same(out, expected)


@dsl.jit
def _load_other_kernel(o_ptr, x_ptr, n, OTHER: dsl.constexpr, N: dsl.constexpr):
    i = dsl.arange(0, N)
    dsl.store(o_ptr + i, dsl.load(x_ptr + i, mask=i < n, other=OTHER))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype, other, expected", [
    (torch.int32, 2.7, 2), (torch.int32, -1, -1), (torch.float32, NAN, NAN), (torch.int32, -INF, -2**31),
    (torch.float16, -INF, -INF), (torch.float32, -0.0, -0.0)])
def test_load_other_converted_to_the_pointer_type(dtype, other, expected, device):
    x, out = torch.ones(4, dtype=dtype, device=device), torch.zeros(4, dtype=dtype, device=device)
    _run(_load_other_kernel, (1,), out, x, 2, device=device, OTHER=other, N=4)
    _assert_same(out, [1, 1, expected, expected])


@dsl.jit
def _mask_broadcast_kernel(o_ptr, x_ptr, n, M: dsl.constexpr, N: dsl.constexpr):
    r = dsl.arange(0, M)[:, None]
    c = dsl.arange(0, N)[None, :]
    x = dsl.load(x_ptr + r * N + c, mask=c < n, other=-1.0)     # (1, N) mask, (M, N) pointers
    dsl.store(o_ptr + r * N + c, x, mask=r < 2)                  # (M, 1) mask


@pytest.mark.parametrize("device", DEVICES)
def test_masks_broadcast_against_the_pointer_block(device):
    x = torch.arange(16., device=device).reshape(4, 4)
    out = torch.zeros(4, 4, device=device)
    _run(_mask_broadcast_kernel, (1,), out, x, 3, device=device, M=4, N=4)
    _assert_same(out, [[0., 1., 2., -1.], [4., 5., 6., -1.], [0.] * 4, [0.] * 4])


@dsl.jit
def _scalar_kernel(o_ptr, x_ptr, i_ptr):
    dsl.store(o_ptr, dsl.load(x_ptr + 3) * 2)
    dsl.store(o_ptr + 1, dsl.load(i_ptr) + 1)


@pytest.mark.parametrize("device", DEVICES)
def test_scalar_loads_and_stores(device):
    out = torch.zeros(2, device=device)
    _run(_scalar_kernel, (1,), out, torch.arange(8., device=device), _t([5], torch.int32, device), device=device)
    _assert_same(out, [6., 6.])


@dsl.jit
def _int64_offset_kernel(o_ptr, x_ptr, stride, BLOCK: dsl.constexpr):
    offsets = dsl.program_id(0).to(dsl.int64) * stride + dsl.arange(0, BLOCK)
    dsl.store(o_ptr + dsl.program_id(0) * BLOCK + dsl.arange(0, BLOCK), dsl.load(x_ptr + offsets))


@pytest.mark.large_memory
@pytest.mark.cuda
def test_int64_offsets_past_two_to_the_31():
    stride = 2**31 + 32
    x = torch.empty(stride + 64, dtype=torch.int8, device="cuda")
    x[:64] = torch.arange(64, dtype=torch.int8, device="cuda")
    x[stride:stride + 64] = -torch.arange(64, dtype=torch.int8, device="cuda")
    out = torch.zeros(2 * 64, dtype=torch.int8, device="cuda")
    _int64_offset_kernel[(2,)](out, x, stride, BLOCK=64, interpret=False)
    expected = torch.cat([torch.arange(64), -torch.arange(64)]).to(torch.int8)
    _assert_same(out, expected)


# -- grids, constexprs, control flow ----------------------------------------------------------------

@dsl.jit
def _grid_kernel(o_ptr):
    x, y, z = dsl.program_id(0), dsl.program_id(1), dsl.program_id(2)
    nx, ny = dsl.num_programs(0), dsl.num_programs(1)
    index = (z * ny + y) * nx + x
    value = index * 1000 + x * 100 + y * 10 + z + dsl.num_programs(2) * 100000
    dsl.store(o_ptr + index * 4 + dsl.arange(0, 4), dsl.zeros((4,), dsl.int32) + value)


@pytest.mark.parametrize("device", DEVICES)
def test_three_dimensional_grid_and_num_programs(device):
    out = torch.zeros(2 * 3 * 4 * 4, dtype=torch.int32, device=device)
    _run(_grid_kernel, (2, 3, 4), out, device=device)
    expected = [((z * 3 + y) * 2 + x) * 1000 + x * 100 + y * 10 + z + 400000
                for z in range(4) for y in range(3) for x in range(2) for _ in range(4)]
    assert out.cpu().tolist() == expected


@pytest.mark.parametrize("device", DEVICES)
def test_empty_grid_is_a_no_op_and_oversized_grids_are_refused(device):
    out = torch.zeros(4, dtype=torch.int32, device=device)
    _run(_grid_kernel, (0,), out, device=device)
    _run(_grid_kernel, (4, 0, 2), out, device=device)
    assert out.cpu().tolist() == [0] * 4
    for grid in [(1, 65536), (1, 1, 65536), (-1,), (2**31,), (1, 1, 1, 1), (1.0,)]:
        with pytest.raises(dsl.LaunchError):
            _run(_grid_kernel, grid, out, device=device)


@dsl.jit
def _constexpr_kernel(o_ptr, FLAG: dsl.constexpr, NAME: dsl.constexpr, NOTHING: dsl.constexpr,
                      N: dsl.constexpr):
    v = dsl.zeros((N,), dsl.int32)
    if FLAG:
        v += 1
    if not FLAG:
        v += 10
    if NAME == "abc":
        v += 100
    if NOTHING is None:
        v += 1000
    if FLAG and NOTHING is None:
        v += 10000
    for k in dsl.static_range(3):
        v += k
    dsl.store(o_ptr + dsl.arange(0, N), v)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("flag, expected", [(True, 11104), (False, 1113)])
def test_constexpr_bool_str_none_and_static_range(flag, expected, device):
    out = torch.zeros(2, dtype=torch.int32, device=device)
    _run(_constexpr_kernel, (1,), out, device=device, FLAG=flag, NAME="abc", NOTHING=None, N=2)
    assert out.cpu().tolist() == [expected] * 2


@dsl.jit
def _loops_kernel(o_ptr, lb, ub, step):
    total = 0
    count = 0
    for i in range(lb, ub, step):
        total += i
        count += 1
    j = lb
    halvings = 0
    while j > 0:
        j = j // 2
        halvings += 1
    dsl.store(o_ptr, total)
    dsl.store(o_ptr + 1, count)
    dsl.store(o_ptr + 2, halvings)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bounds", [(0, 10, 3), (10, 0, -3), (5, 5, 1), (-5, 7, 4), (0, 10, -1), (7, 2, 9),
                                    (2, 7, 9), (1000, -3, -7)])
def test_loops_with_runtime_bounds_and_steps(bounds, device):
    out = torch.zeros(3, dtype=torch.int32, device=device)
    _run(_loops_kernel, (1,), out, *bounds, device=device)
    r = range(*bounds)
    assert out.cpu().tolist() == [sum(r), len(r), max(bounds[0], 0).bit_length()]


@dsl.jit
def _early_return_kernel(o_ptr, n):
    pid = dsl.program_id(0)
    if pid >= n:
        return
    dsl.store(o_ptr + pid, pid + 1)


@pytest.mark.parametrize("device", DEVICES)
def test_early_return(device):
    out = torch.zeros(8, dtype=torch.int32, device=device)
    _run(_early_return_kernel, (8,), out, 5, device=device)
    assert out.cpu().tolist() == [1, 2, 3, 4, 5, 0, 0, 0]


# -- atomics and dot --------------------------------------------------------------------------------

@dsl.jit
def _atomic_kernel(o_ptr, old_ptr, v_ptr, n, OP: dsl.constexpr, N: dsl.constexpr):
    i = dsl.arange(0, N)
    v = dsl.load(v_ptr + i)
    m = i < n
    if OP == "add":
        old = dsl.atomic_add(o_ptr + i % 2, v, mask=m)
    elif OP == "max":
        old = dsl.atomic_max(o_ptr + i % 2, v, mask=m)
    elif OP == "min":
        old = dsl.atomic_min(o_ptr + i % 2, v, mask=m)
    else:
        old = dsl.atomic_xchg(o_ptr + i, v, mask=m)
    dsl.store(old_ptr + i, old, mask=m)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.int32, torch.float32])
@pytest.mark.parametrize("op", ["add", "max", "min", "xchg"])
def test_atomics_masks_and_returned_old_values(op, dtype, device):
    # 32 lanes and one warp: no replicated copies (see the replicated-layout bug above). Lanes of one
    # address may be ordered either way on the GPU, so the checks are order-independent.
    n, N = 24, 32
    values = torch.randint(-9, 10, (N,)).to(dtype)
    out = torch.zeros(N, dtype=dtype, device=device)
    old = torch.full((N,), -77, dtype=dtype, device=device)
    _run(_atomic_kernel, (1,), out, old, values.to(device), n, device=device, num_warps=1, OP=op, N=N)
    out, old = out.cpu(), old.cpu()
    assert old[n:].tolist() == [-77] * (N - n)                       # masked lanes store nothing
    if op == "xchg":
        assert out.tolist() == values[:n].tolist() + [0] * (N - n) and old[:n].tolist() == [0] * n
        return
    step = {"add": lambda a, b: a + b, "max": max, "min": min}[op]
    for address in (0, 1):
        lanes, olds = values[address:n:2].tolist(), old[address:n:2].tolist()
        final = 0
        for v in lanes:
            final = step(final, v)
        assert out[address].item() == final
        # Order-independent: each lane's new value is another lane's old value or the final one.
        news = [step(o, v) for o, v in zip(olds, lanes)]
        assert sorted(olds + [final]) == sorted([0] + news)


@dsl.jit
def _dot_kernel(c_ptr, a_ptr, b_ptr, M: dsl.constexpr, N: dsl.constexpr, K: dsl.constexpr, ACC: dsl.constexpr):
    m, n, k = dsl.arange(0, M), dsl.arange(0, N), dsl.arange(0, K)
    a = dsl.load(a_ptr + m[:, None] * K + k[None, :])
    b = dsl.load(b_ptr + k[:, None] * N + n[None, :])
    if ACC:
        c = dsl.dot(a, b, dsl.full((M, N), 1.0, dsl.float32))
    else:
        c = dsl.dot(a, b)
    dsl.store(c_ptr + m[:, None] * N + n[None, :], c)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.int8])
@pytest.mark.parametrize("shape", [(16, 16, 16), (16, 32, 64), (64, 16, 32), (8, 8, 8), (16, 8, 16), (2, 2, 2)])
def test_dot_shapes_and_dtypes(shape, dtype, device, seed):
    M, N, K = shape
    generator = torch.Generator().manual_seed(seed)
    if dtype == torch.int8:
        a = torch.randint(-100, 100, (M, K), generator=generator, dtype=torch.int8)
        b = torch.randint(-100, 100, (K, N), generator=generator, dtype=torch.int8)
        c = torch.zeros(M, N, dtype=torch.int32, device=device)
        _run(_dot_kernel, (1,), c, a.to(device), b.to(device), device=device, M=M, N=N, K=K, ACC=False)
        _assert_same(c, a.long() @ b.long())
        return
    a = torch.randn(M, K, generator=generator).to(dtype)
    b = torch.randn(K, N, generator=generator).to(dtype)
    c = torch.zeros(M, N, device=device)
    _run(_dot_kernel, (1,), c, a.to(device), b.to(device), device=device, M=M, N=N, K=K, ACC=True)
    # float32 inputs may run as tf32 on tensor cores only when asked; the default is exact fp32
    assert_close(c, a.double() @ b.double() + 1, torch.float32)


# -- launch errors ----------------------------------------------------------------------------------

@dsl.jit
def _add_one_kernel(o_ptr, x_ptr, n, BLOCK: dsl.constexpr):
    i = dsl.program_id(0) * BLOCK + dsl.arange(0, BLOCK)
    dsl.store(o_ptr + i, dsl.load(x_ptr + i, mask=i < n) + 1, mask=i < n)


@pytest.mark.parametrize("device", DEVICES)
def test_bad_arguments_raise_clear_errors(device):
    x, out = torch.ones(8, device=device), torch.zeros(8, device=device)
    with pytest.raises(TypeError, match="missing argument `n`"):
        _run(_add_one_kernel, (1,), out, x, device=device, BLOCK=8)
    with pytest.raises(TypeError, match="unexpected keyword argument `FOO`"):
        _run(_add_one_kernel, (1,), out, x, 8, device=device, BLOCK=8, FOO=1)
    with pytest.raises(TypeError, match="must be a torch.Tensor"):
        _run(_add_one_kernel, (1,), out, [1.0] * 8, 8, device=device, BLOCK=8)
    with pytest.raises(TypeError, match="does not fit in 64 bits"):
        _run(_add_one_kernel, (1,), out, x, 2**64, device=device, BLOCK=8)
    with pytest.raises(dsl.CompilationError, match="power of two"):
        _run(_add_one_kernel, (1,), out, x, 8, device=device, BLOCK=6)
    with pytest.raises(dsl.CompilationError, match="expects a pointer"):
        _run(_add_one_kernel, (1,), out, 12345, 8, device=device, BLOCK=8)
    _run(_add_one_kernel, (1,), out, x, 8, device=device, BLOCK=8)
    assert out.cpu().tolist() == [2.0] * 8


@pytest.mark.cuda
def test_a_cpu_tensor_in_a_gpu_launch_is_refused():
    x, out = torch.ones(8), torch.zeros(8, device="cuda")
    with pytest.raises((ValueError, TypeError, dsl.LaunchError)):
        _add_one_kernel[(1,)](out, x, 8, BLOCK=8, interpret=False)
    torch.cuda.synchronize()
