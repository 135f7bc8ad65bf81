"""Control flow in kernels: loops with carried values, while, runtime and compile-time if,
static_range, inlined @dsl.jit helpers with returns, and the errors of type-changing loop variables."""

from __future__ import annotations

import pytest
import torch

import fusedops.dsl as dsl
from fusedops.dsl.ir import OpCode
from helpers import assert_close, poison, random_tensor


def _opcodes(function) -> list:
    return [op.opcode for op in function.walk()]


# -- for loops -------------------------------------------------------------------------------------
@dsl.jit
def sum_and_count_kernel(x_ptr, out_ptr, count_ptr, n, BLOCK: dsl.constexpr):
    acc = dsl.zeros((BLOCK,), dsl.float32)      # a carried block
    count = 0                                   # a carried scalar (a literal: int32)
    for start in range(0, n, BLOCK):
        offsets = start + dsl.arange(0, BLOCK)
        acc += dsl.load(x_ptr + offsets, mask=offsets < n, other=0.0)
        count += 1
    dsl.store(out_ptr, dsl.sum(acc, axis=0))
    dsl.store(count_ptr, count)


@pytest.mark.parametrize("n", [0, 1, 64, 100])
def test_for_with_carried_block_and_scalar(n, seed):
    x = random_tensor((max(n, 1),), torch.float32, seed=seed)
    out = poison(torch.empty(1))
    count = poison(torch.empty(1, dtype=torch.int32))
    sum_and_count_kernel[(1,)](x, out, count, n, BLOCK=32, interpret=True)
    assert count.item() == -(-n // 32)
    assert_close(out, x[:n].double().sum().reshape(1), torch.float32)


@dsl.jit
def nested_loops_kernel(out_ptr, n, m):
    total = 0
    for i in range(n):
        row = 0
        for j in range(i, m):
            row += j
        total += row * (i + 1)
    dsl.store(out_ptr, total)


def test_nested_loops_with_dependent_bounds():
    out = poison(torch.empty(1, dtype=torch.int32))
    nested_loops_kernel[(1,)](out, 5, 7, interpret=True)
    expected = sum(sum(range(i, 7)) * (i + 1) for i in range(5))
    assert out.item() == expected
    assert _opcodes(nested_loops_kernel.ir(out, 5, 7)).count(OpCode.FOR) == 2


@dsl.jit
def range_kernel(out_ptr, start, stop, step):
    total = 0
    count = 0
    for i in range(start, stop, step):
        total += i
        count += 1
    dsl.store(out_ptr, total)
    dsl.store(out_ptr + 1, count)


@pytest.mark.parametrize("start, stop, step", [(0, 10, 3), (10, 0, -3), (5, 5, 1), (5, 0, 1), (-4, 4, 2)])
def test_runtime_range_follows_python(start, stop, step):
    out = poison(torch.empty(2, dtype=torch.int32))
    range_kernel[(1,)](out, start, stop, step, interpret=True)
    assert out.tolist() == [sum(range(start, stop, step)), len(range(start, stop, step))]


@dsl.jit
def constexpr_range_kernel(out_ptr, N: dsl.constexpr):
    total = 0
    for i in range(N):
        total += i
    dsl.store(out_ptr, total)


def test_range_of_constexprs_stays_a_loop():
    out = poison(torch.empty(1, dtype=torch.int32))
    constexpr_range_kernel[(1,)](out, N=10, interpret=True)
    assert out.item() == 45
    assert OpCode.FOR in _opcodes(constexpr_range_kernel.ir(out, N=10))


@dsl.jit
def static_range_kernel(out_ptr, x_ptr, N: dsl.constexpr):
    total = 0.0
    weights = (1.0, 10.0, 100.0, 1000.0)
    for i in dsl.static_range(N):
        total += dsl.load(x_ptr + i) * weights[i]     # i is a constexpr: it can index a tuple
    dsl.store(out_ptr, total)


def test_static_range_unrolls():
    x = torch.tensor([1.0, 2.0, 3.0, 4.0])
    out = poison(torch.empty(1))
    static_range_kernel[(1,)](out, x, N=4, interpret=True)
    assert out.item() == 4321.0
    opcodes = _opcodes(static_range_kernel.ir(out, x, N=4))
    assert OpCode.FOR not in opcodes and opcodes.count(OpCode.LOAD) == 4


@dsl.jit
def literal_init_kernel(x_ptr, out_ptr, n):
    acc = 0                       # a literal: adopts the float32 type the loop gives it
    half_steps = 0                # likewise: becomes float32
    i = dsl.program_id(0)         # an int32 value (0)
    for k in range(n):
        acc = acc + dsl.load(x_ptr + k)
        half_steps = half_steps + 1.5
        i = i + 1.5               # int32 + float literal: converted back to int32 (C's `i += 1.5`)
    dsl.store(out_ptr, acc)
    dsl.store(out_ptr + 1, half_steps)
    dsl.store(out_ptr + 2, i)


def test_literal_initial_value_adopts_the_loop_type():
    x = torch.tensor([0.25, 0.5, 1.0])
    out = poison(torch.empty(3))
    literal_init_kernel[(1,)](x, out, 3, interpret=True)
    # i: int(0 + 1.5) = 1, int(1 + 1.5) = 2, int(2 + 1.5) = 3
    assert out.tolist() == [1.75, 4.5, 3.0]
    types = [op.results[1].type for op in literal_init_kernel.ir(x, out, 3).walk() if op.opcode == OpCode.FOR]
    assert types == [dsl.float32]


# -- while -----------------------------------------------------------------------------------------
@dsl.jit
def collatz_kernel(out_ptr, start):
    value = start
    steps = 0
    while value != 1:
        if value % 2 == 0:
            value = value // 2
        else:
            value = 3 * value + 1
        steps += 1
    dsl.store(out_ptr, steps)


@pytest.mark.parametrize("start, steps", [(1, 0), (6, 8), (27, 111)])
def test_while_with_if_inside(start, steps):
    out = poison(torch.empty(1, dtype=torch.int32))
    collatz_kernel[(1,)](out, start, interpret=True)
    assert out.item() == steps


@dsl.jit
def while_false_kernel(out_ptr, FLAG: dsl.constexpr):
    x = 1
    while FLAG and x < 10:
        x = x * 2
    dsl.store(out_ptr, x)


def test_while_with_compile_time_false_condition_is_removed():
    out = poison(torch.empty(1, dtype=torch.int32))
    while_false_kernel[(1,)](out, FLAG=False, interpret=True)
    assert out.item() == 1
    assert OpCode.WHILE not in _opcodes(while_false_kernel.ir(out, FLAG=False))
    while_false_kernel[(1,)](out, FLAG=True, interpret=True)
    assert out.item() == 16


# -- if --------------------------------------------------------------------------------------------
@dsl.jit
def branches_kernel(out_ptr, x_ptr, threshold, BLOCK: dsl.constexpr):
    pid = dsl.program_id(0)
    x = dsl.load(x_ptr + pid * BLOCK + dsl.arange(0, BLOCK))
    if pid < threshold:
        scaled = x * 2.0
        tag = 1
    elif pid == threshold:
        scaled = x
        tag = 2
    else:
        scaled = -x
        tag = 3
    dsl.store(out_ptr + pid * BLOCK + dsl.arange(0, BLOCK), scaled + tag)


def test_runtime_if_elif_else_merges_values(seed):
    x = random_tensor((4, 8), torch.float32, seed=seed)
    out = poison(torch.empty_like(x))
    branches_kernel[(4,)](out, x, 1, BLOCK=8, interpret=True)
    expected = torch.stack([x[0] * 2 + 1, x[1] + 2, -x[2] + 3, -x[3] + 3])
    assert_close(out, expected.double(), torch.float32)


@dsl.jit
def constexpr_if_kernel(out_ptr, x, MODE: dsl.constexpr, SCALE: dsl.constexpr = None):
    if MODE == "double":
        y = x * 2
    elif MODE == "square" and SCALE is None:
        y = x * x
    else:
        y = x * SCALE
    dsl.store(out_ptr, y)


def test_constexpr_if_compiles_only_the_taken_branch():
    out = poison(torch.empty(1, dtype=torch.int32))
    for mode, scale, expected in [("double", None, 14), ("square", None, 49), ("scale", 3, 21)]:
        constexpr_if_kernel[(1,)](out, 7, MODE=mode, SCALE=scale, interpret=True)
        assert out.item() == expected
        function = constexpr_if_kernel.ir(out, 7, MODE=mode, SCALE=scale)
        assert OpCode.IF not in _opcodes(function)


@dsl.jit
def ternary_and_logic_kernel(out_ptr, a, b):
    both = (a > 0) and (b > 0)
    either = a > 0 or b > 0
    neither = not either
    pick = a if a > b else b
    dsl.store(out_ptr, both)
    dsl.store(out_ptr + 1, either)
    dsl.store(out_ptr + 2, neither)
    dsl.store(out_ptr + 3, pick)
    dsl.store(out_ptr + 4, 0 < a < b)


@pytest.mark.parametrize("a, b", [(1, 2), (-1, 2), (-3, -2), (5, 3)])
def test_boolean_operators_and_conditional_expression_on_runtime_values(a, b):
    out = poison(torch.empty(5, dtype=torch.int32))
    ternary_and_logic_kernel[(1,)](out, a, b, interpret=True)
    assert out.tolist() == [int(a > 0 and b > 0), int(a > 0 or b > 0), int(not (a > 0 or b > 0)), max(a, b),
                            int(0 < a < b)]


# -- helpers ---------------------------------------------------------------------------------------
@dsl.jit
def _clamp(x, low, HIGH: dsl.constexpr):
    if x < low:
        return low
    if x > HIGH:
        return HIGH
    return x


@dsl.jit
def _min_max(a, b):
    if a < b:
        return a, b
    else:
        return b, a


@dsl.jit
def _row_scale(x, SCALE: dsl.constexpr):
    return x * SCALE, dsl.sum(x, axis=0)


@dsl.jit
def helpers_kernel(out_ptr, x_ptr, a, b, BLOCK: dsl.constexpr):
    low, high = _min_max(a, b)
    dsl.store(out_ptr, _clamp(a * 10, low, 50))
    dsl.store(out_ptr + 1, low)
    dsl.store(out_ptr + 2, high)
    scaled, total = _row_scale(dsl.load(x_ptr + dsl.arange(0, BLOCK)), 3)
    dsl.store(out_ptr + 3, dsl.sum(scaled, axis=0) - total)


@pytest.mark.parametrize("a, b", [(2, 9), (9, 2), (-4, 3), (7, 7)])
def test_helpers_with_returns_in_branches_and_tuples(a, b):
    x = torch.arange(4, dtype=torch.int32)
    out = poison(torch.empty(4, dtype=torch.int32))
    helpers_kernel[(1,)](out, x, a, b, BLOCK=4, interpret=True)
    low, high = min(a, b), max(a, b)
    assert out.tolist() == [min(max(a * 10, low), 50), low, high, 2 * 6]


@dsl.jit
def early_exit_kernel(out_ptr, n):
    pid = dsl.program_id(0)
    if pid >= n:
        return
    dsl.store(out_ptr + pid, pid * pid)


def test_early_return_in_a_kernel():
    out = torch.full((8,), -1, dtype=torch.int32)
    early_exit_kernel[(8,)](out, 5, interpret=True)
    assert out.tolist() == [0, 1, 4, 9, 16, -1, -1, -1]


# -- errors ----------------------------------------------------------------------------------------
@dsl.jit
def type_changing_loop_kernel(x_ptr, n):
    acc = dsl.zeros((16,), dsl.int32)
    for i in range(n):
        acc = acc + dsl.load(x_ptr + dsl.arange(0, 16))
    dsl.store(x_ptr + dsl.arange(0, 16), acc)


def test_type_changing_loop_variable_is_an_error():
    x = torch.zeros(16)
    with pytest.raises(dsl.CompilationError) as info:
        type_changing_loop_kernel[(1,)](x, 3, interpret=True)
    message = str(info.value)
    assert "`acc`" in message and "<16xint32>" in message and "<16xfloat32>" in message
    assert "acc = acc + dsl.load" in message      # points at the assignment in the loop body


@dsl.jit
def loop_local_kernel(out_ptr, n):
    for i in range(n):
        t = i * 2
    dsl.store(out_ptr, t)


@dsl.jit
def loop_variable_after_loop_kernel(out_ptr, n):
    i = 7
    for i in range(n):
        pass
    dsl.store(out_ptr, i)


@dsl.jit
def one_branch_kernel(out_ptr, n):
    if n > 0:
        t = 1
    dsl.store(out_ptr, t)


@dsl.jit
def branch_type_mismatch_kernel(out_ptr, x_ptr, n):
    if n > 0:
        t = dsl.load(x_ptr)
    else:
        t = n
    dsl.store(out_ptr, t)


@dsl.jit
def return_in_loop_kernel(out_ptr, n):
    for i in range(n):
        if i > 2:
            return
    dsl.store(out_ptr, n)


@pytest.mark.parametrize("kernel, pattern", [
    (loop_local_kernel, "`t` is first assigned inside the loop"),
    (loop_variable_after_loop_kernel, "`i` is the variable of the loop at line"),
    (one_branch_kernel, "`t` is assigned in only one branch"),
    (branch_type_mismatch_kernel, "`t` has type float32 in the `if` branch and int32 in the `else` branch"),
    (return_in_loop_kernel, "`return` inside a loop is not supported"),
])
def test_control_flow_errors(kernel, pattern):
    out = torch.zeros(4)
    args = (out, out, 3) if kernel is branch_type_mismatch_kernel else (out, 3)
    with pytest.raises(dsl.CompilationError, match=pattern):
        kernel[(1,)](*args, interpret=True)
