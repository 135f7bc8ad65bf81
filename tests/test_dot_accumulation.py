"""passes/dot_accumulation.py: `c + dot(a, b)` -> `dot(a, b, c)`, and where it must not apply.

CPU tier: the rewrite on the frontend's IR of kernels written `acc += dsl.dot(a, b)` (either operand order, in a
K loop), the cases it leaves alone (a nonzero accumulator, a dot read twice, a dot outside the add's loop, an
add of another type), the rewritten kernel's results through the interpreter against float64, and no
spills for the Triton idiom at 128 x 128 x 64 (tests/test_review_session24_compiler.py).
"""

from __future__ import annotations

import copy

import pytest
import torch

import fusedops.dsl as dsl
from fusedops.dsl.interpreter import launch
from fusedops.dsl.ir import OpCode
from fusedops.dsl.passes.dot_accumulation import combine_dot_accumulation


@dsl.jit
def _plus_equals_kernel(c_ptr, a_ptr, b_ptr, K, SWAP: dsl.constexpr, BLOCK: dsl.constexpr):
    r = dsl.arange(0, BLOCK)
    acc = dsl.zeros((BLOCK, BLOCK), dsl.float32)
    for k in range(0, K, BLOCK):
        a = dsl.load(a_ptr + r[:, None] * K + (k + r)[None, :])
        b = dsl.load(b_ptr + (k + r)[:, None] * BLOCK + r[None, :])
        if SWAP:
            acc = dsl.dot(a, b) + acc
        else:
            acc += dsl.dot(a, b)
    dsl.store(c_ptr + r[:, None] * BLOCK + r[None, :], acc)


@dsl.jit
def _left_alone_kernel(c_ptr, a_ptr, b_ptr, CASE: dsl.constexpr, BLOCK: dsl.constexpr):
    r = dsl.arange(0, BLOCK)
    a = dsl.load(a_ptr + r[:, None] * BLOCK + r[None, :])
    b = dsl.load(b_ptr + r[:, None] * BLOCK + r[None, :])
    base = dsl.load(c_ptr + r[:, None] * BLOCK + r[None, :])
    if CASE == "nonzero":
        out = dsl.dot(a, b, dsl.full((BLOCK, BLOCK), 1.0, dsl.float32)) + base
    elif CASE == "read_twice":
        d = dsl.dot(a, b)
        out = (d + base) * d
    else:       # "outside_loop": the dot is computed once, the add runs per iteration
        d = dsl.dot(a, b)
        out = base
        for _ in range(0, 3):
            out = out + d
    dsl.store(c_ptr + r[:, None] * BLOCK + r[None, :], out)


def _ir(kernel, *args, **kwargs):
    """A copy of the kernel's frontend IR (`ir()` returns the one its interpreter launches run)."""
    return copy.deepcopy(kernel.ir(*args, **kwargs))


def _ops(function, opcode):
    return [op for op in function.walk() if op.opcode == opcode]


def _operands(block, k, dtype=torch.float16):
    gen = torch.Generator().manual_seed(1234)
    return (torch.randn(block, k, generator=gen).to(dtype), torch.randn(k, block, generator=gen).to(dtype))


@pytest.mark.parametrize("swap", [False, True])
def test_plus_equals_dot_becomes_one_dot_accumulating_into_the_carry(swap):
    a, b = _operands(16, 48)
    c = torch.empty(16, 16)
    function = _ir(_plus_equals_kernel, c, a.flatten(), b.flatten(), 48, SWAP=swap, BLOCK=16)
    [dot] = _ops(function, OpCode.DOT)
    [add] = [op for op in _ops(function, OpCode.ADD) if op.result.type == dot.result.type]
    assert combine_dot_accumulation(function)
    [loop] = _ops(function, OpCode.FOR)
    assert add.opcode == OpCode.DOT and add.operands[2] is loop.regions[0].args[1]     # accumulates into the carry
    assert add.operands[:2] == dot.operands[:2]
    assert not combine_dot_accumulation(function)     # nothing more to do


@pytest.mark.parametrize("case", ["nonzero", "read_twice", "outside_loop"])
def test_dots_that_do_not_qualify_are_left_alone(case):
    a, b = _operands(16, 16)
    c = torch.empty(16, 16)
    function = _ir(_left_alone_kernel, c, a, b, CASE=case, BLOCK=16)
    assert not combine_dot_accumulation(function)


@pytest.mark.parametrize("swap", [False, True])
@pytest.mark.parametrize("k", [16, 48])
def test_rewritten_kernel_matches_float64(swap, k):
    from fusedops.dsl.passes.pipeline import default_pipeline
    from fusedops.dsl.passes.manager import run_pipeline

    a, b = _operands(16, k)
    c = torch.full((16, 16), float("nan"))
    function = _ir(_plus_equals_kernel, c, a.flatten(), b.flatten(), k, SWAP=swap, BLOCK=16)
    function = run_pipeline(function, default_pipeline(num_warps=4)).function
    assert not [op for op in _ops(function, OpCode.ADD) if len(getattr(op.result.type, "shape", ())) == 2]
    launch(function, (1, 1, 1), [c, a.flatten(), b.flatten(), k])
    torch.testing.assert_close(c.double(), a.double() @ b.double(), rtol=1e-5, atol=1e-5)
