"""GPU tier: the language's semantics compiled for the GPU agree with the interpreter (exactly for
integer rules, within documented tolerance for math functions) on fresh random inputs."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

import fusedops.dsl as dsl
from helpers import assert_close, poison

pytestmark = pytest.mark.cuda

BLOCK = 256


@dsl.jit
def unary_kernel(out_ptr, x_ptr, n, OP: dsl.constexpr, BLOCK: dsl.constexpr):
    offsets = dsl.program_id(0) * BLOCK + dsl.arange(0, BLOCK)
    mask = offsets < n
    x = dsl.load(x_ptr + offsets, mask=mask, other=1.0)
    if OP == "exp":
        y = dsl.exp(x)
    elif OP == "exp2":
        y = dsl.exp2(x)
    elif OP == "log":
        y = dsl.log(x)
    elif OP == "log2":
        y = dsl.log2(x)
    elif OP == "sqrt":
        y = dsl.sqrt(x)
    elif OP == "rsqrt":
        y = dsl.rsqrt(x)
    elif OP == "sin":
        y = dsl.sin(x)
    elif OP == "cos":
        y = dsl.cos(x)
    elif OP == "erf":
        y = dsl.erf(x)
    elif OP == "tanh":
        y = dsl.tanh(x)
    elif OP == "sigmoid":
        y = dsl.sigmoid(x)
    elif OP == "floor":
        y = dsl.floor(x)
    elif OP == "ceil":
        y = dsl.ceil(x)
    else:
        y = dsl.abs(x)
    dsl.store(out_ptr + offsets, y, mask=mask)


_REFERENCE = {"exp": torch.exp, "exp2": torch.exp2, "log": torch.log, "log2": torch.log2, "sqrt": torch.sqrt,
              "rsqrt": torch.rsqrt, "sin": torch.sin, "cos": torch.cos, "erf": torch.erf, "tanh": torch.tanh,
              "sigmoid": torch.sigmoid, "floor": torch.floor, "ceil": torch.ceil, "abs": torch.abs}
_POSITIVE = {"log", "log2", "sqrt", "rsqrt"}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("op", sorted(_REFERENCE))
def test_math_functions(op, dtype, seed):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(1000, generator=generator, dtype=torch.float64) * 3
    if op in _POSITIVE:
        x = x.abs() + 1e-3
    x = x.to(dtype).cuda()
    out = poison(torch.empty_like(x))
    unary_kernel[(dsl.cdiv(1000, BLOCK),)](out, x, 1000, OP=op, BLOCK=BLOCK)
    reference = _REFERENCE[op](x.double())
    tol = {torch.float32: 2e-6, torch.float64: 1e-13}.get(dtype)
    assert_close(out, reference, dtype, tol=tol)


@dsl.jit
def int_kernel(out_ptr, a_ptr, b_ptr, n, OP: dsl.constexpr, BLOCK: dsl.constexpr):
    offsets = dsl.program_id(0) * BLOCK + dsl.arange(0, BLOCK)
    mask = offsets < n
    a = dsl.load(a_ptr + offsets, mask=mask)
    b = dsl.load(b_ptr + offsets, mask=mask)
    if OP == "floordiv":
        y = a // b
    elif OP == "mod":
        y = a % b
    elif OP == "shl":
        y = a << b
    elif OP == "shr":
        y = a >> b
    elif OP == "min":
        y = dsl.minimum(a, b)
    elif OP == "max":
        y = dsl.maximum(a, b)
    elif OP == "mul":
        y = a * b
    elif OP == "add":
        y = a + b
    else:
        y = (a < b).to(a.dtype) + (a == b).to(a.dtype) * 2
    dsl.store(out_ptr + offsets, y, mask=mask)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint32, torch.int16, torch.uint8])
@pytest.mark.parametrize("op", ["floordiv", "mod", "shl", "shr", "min", "max", "mul", "compare"])
def test_integer_rules_match_the_interpreter_exactly(op, dtype, seed):
    generator = torch.Generator().manual_seed(seed)
    info = torch.iinfo(dtype)
    a = torch.randint(max(info.min, -2**40), min(info.max, 2**40), (777,), generator=generator, dtype=torch.int64)
    if op in ("shl", "shr"):
        b = torch.randint(0, torch.iinfo(dtype).bits + 3, (777,), generator=generator, dtype=torch.int64)
    else:
        b = torch.randint(max(info.min, -70), min(info.max, 70), (777,), generator=generator, dtype=torch.int64)
    a, b = a.to(dtype), b.to(dtype)
    a[:4] = torch.tensor([info.min, info.max, 0, 1 if info.min == 0 else -1], dtype=torch.int64).to(dtype)
    b[:4] = torch.tensor([-1 if info.min else 1, 0, 0, 3], dtype=torch.int64).to(dtype)
    if op in ("shl", "shr"):
        b[:4] = torch.tensor([1, 3, info.bits - 1, info.bits], dtype=torch.int64).to(dtype)
    gpu = poison(torch.empty_like(a)).cuda()
    int_kernel[(dsl.cdiv(777, BLOCK),)](gpu, a.cuda(), b.cuda(), 777, OP=op, BLOCK=BLOCK)
    cpu = torch.empty_like(a)
    int_kernel[(dsl.cdiv(777, BLOCK),)](cpu, a, b, 777, OP=op, BLOCK=BLOCK, interpret=True)
    assert torch.equal(gpu.cpu(), cpu)


@dsl.jit
def cast_kernel(out_ptr, x_ptr, n, BLOCK: dsl.constexpr):
    offsets = dsl.program_id(0) * BLOCK + dsl.arange(0, BLOCK)
    mask = offsets < n
    dsl.store(out_ptr + offsets, dsl.load(x_ptr + offsets, mask=mask).to(out_ptr.dtype.element), mask=mask)


@pytest.mark.parametrize("source, target", [
    (torch.float32, torch.int32), (torch.float32, torch.uint8), (torch.float64, torch.int64),
    (torch.float32, torch.float16), (torch.float32, torch.bfloat16), (torch.float16, torch.bfloat16),
    (torch.int32, torch.float16), (torch.int64, torch.float32), (torch.float32, torch.bool),
    (torch.int32, torch.int8), (torch.uint8, torch.int32),
])
def test_casts_match_the_interpreter(source, target, seed):
    generator = torch.Generator().manual_seed(seed)
    x = (torch.randn(1000, generator=generator, dtype=torch.float64) * 1e3)
    x[:6] = torch.tensor([float("nan"), float("inf"), -float("inf"), 3e9, -3e9, 0.5])
    if not source.is_floating_point:
        x = x.nan_to_num(0, 0, 0).clamp(torch.iinfo(source).min, torch.iinfo(source).max)
    x = x.to(source)
    gpu = torch.empty(1000, dtype=target, device="cuda")
    cast_kernel[(dsl.cdiv(1000, BLOCK),)](gpu, x.cuda(), 1000, BLOCK=BLOCK)
    cpu = torch.empty(1000, dtype=target)
    cast_kernel[(dsl.cdiv(1000, BLOCK),)](cpu, x, 1000, BLOCK=BLOCK, interpret=True)
    torch.testing.assert_close(gpu.cpu(), cpu, rtol=0, atol=0, equal_nan=True)


@dsl.jit
def reduce_kernel(values_ptr, indices_ptr, x_ptr, n_cols, BLOCK: dsl.constexpr, KIND: dsl.constexpr):
    row = dsl.program_id(0)
    cols = dsl.arange(0, BLOCK)
    x = dsl.load(x_ptr + row * n_cols + cols, mask=cols < n_cols, other=-float("inf") if KIND == "max" else float("inf"))
    if KIND == "max":
        dsl.store(values_ptr + row, dsl.max(x, axis=0))
        dsl.store(indices_ptr + row, dsl.argmax(x, axis=0))
    else:
        dsl.store(values_ptr + row, dsl.min(x, axis=0))
        dsl.store(indices_ptr + row, dsl.argmin(x, axis=0))


@pytest.mark.parametrize("kind", ["max", "min"])
@pytest.mark.parametrize("n_cols", [1, 5, 100, 1000, 4096])
def test_reductions_and_arg_reductions_with_ties_and_nan(kind, n_cols, seed):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randint(-5, 5, (8, n_cols), generator=generator).float()   # many ties
    x[3, n_cols // 2] = float("nan")
    x = x.cuda()
    values = poison(torch.empty(8, device="cuda"))
    indices = torch.full((8,), -7, dtype=torch.int32, device="cuda")
    block = 1 << max(0, (n_cols - 1).bit_length())
    reduce_kernel[(8,)](values, indices, x, n_cols, BLOCK=block, KIND=kind, num_warps=4)
    reference = x.max(dim=1) if kind == "max" else x.min(dim=1)
    torch.testing.assert_close(values, reference.values, equal_nan=True)
    expected = (x.argmax(dim=1) if kind == "max" else x.argmin(dim=1)).int()
    assert torch.equal(indices, expected)


@dsl.jit
def control_kernel(out_ptr, limit):
    # while and if on scalars, a loop-carried block
    i = 0
    acc = dsl.zeros((128,), dsl.int32)
    while i < limit:
        if i % 3 == 0:
            acc += dsl.arange(0, 128)
        else:
            acc -= 1
        i += 1
    dsl.store(out_ptr + dsl.arange(0, 128), acc)


@pytest.mark.parametrize("limit", [0, 1, 7, 30])
def test_control_flow_matches_the_interpreter(limit):
    gpu = torch.full((128,), -99, dtype=torch.int32, device="cuda")
    control_kernel[(1,)](gpu, limit)
    cpu = torch.empty(128, dtype=torch.int32)
    control_kernel[(1,)](cpu, limit, interpret=True)
    assert torch.equal(gpu.cpu(), cpu)


@dsl.jit
def atomics_kernel(counters_ptr, x_ptr, n, BLOCK: dsl.constexpr):
    offsets = dsl.program_id(0) * BLOCK + dsl.arange(0, BLOCK)
    mask = offsets < n
    x = dsl.load(x_ptr + offsets, mask=mask)
    dsl.atomic_max(counters_ptr + 0, x, mask=mask)
    dsl.atomic_min(counters_ptr + 1, x, mask=mask)
    dsl.atomic_add(counters_ptr + 2, 1, mask=mask)
    dsl.atomic_cas(counters_ptr + 3, 0, 5)


def test_atomics_on_colliding_addresses(seed):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randint(-10**6, 10**6, (5003,), generator=generator, dtype=torch.int32).cuda()
    counters = torch.tensor([-2**31, 2**31 - 1, 0, 0], dtype=torch.int32, device="cuda")
    atomics_kernel[(dsl.cdiv(5003, BLOCK),)](counters, x, 5003, BLOCK=BLOCK)
    assert counters.tolist() == [int(x.max()), int(x.min()), 5003, 5]


def _run_script(body: str, tmp_path) -> subprocess.CompletedProcess:
    """Run `body` in a fresh process (a failed device assert leaves its CUDA context unusable); the
    script is a file because kernels need readable source."""
    script = tmp_path / "script.py"
    script.write_text("import torch, fusedops.dsl as dsl\n" + textwrap.dedent(body))
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)


def test_device_print_prints_values(tmp_path):
    result = _run_script("""
        @dsl.jit
        def k(x_ptr):
            dsl.device_print("value ", dsl.load(x_ptr + dsl.arange(0, 4)))
        k[(1,)](torch.tensor([1.5, 2.5, 3.5, 4.5], device="cuda"), num_warps=1)
        torch.cuda.synchronize()
    """, tmp_path)
    assert result.returncode == 0, result.stderr
    assert "value 3.500000" in result.stdout and "pid (0, 0, 0)" in result.stdout


def test_device_assert_fails_the_launch(tmp_path):
    result = _run_script("""
        @dsl.jit
        def k(x_ptr):
            x = dsl.load(x_ptr + dsl.arange(0, 4))
            dsl.device_assert(x < 3, "x must stay below 3")
        k[(1,)](torch.tensor([1, 2, 3, 4], device="cuda"), num_warps=1)
        torch.cuda.synchronize()
    """, tmp_path)
    assert result.returncode != 0
    assert "device_assert failed: x must stay below 3" in result.stdout + result.stderr


@dsl.jit
def scalar_atomic_kernel(counter_ptr, old_ptr):
    old = dsl.atomic_add(counter_ptr, 1)
    dsl.store(old_ptr + dsl.program_id(0) * 128 + dsl.arange(0, 128), old + dsl.zeros((128,), dsl.int32))


def test_a_scalar_atomic_happens_once_per_program():
    counter = torch.zeros(1, dtype=torch.int32, device="cuda")
    old = torch.full((50 * 128,), -1, dtype=torch.int32, device="cuda")
    scalar_atomic_kernel[(50,)](counter, old, num_warps=4)
    assert int(counter) == 50
    per_program = old.view(50, 128)
    assert bool((per_program == per_program[:, :1]).all())          # every thread sees its program's value
    assert sorted(per_program[:, 0].tolist()) == list(range(50))
