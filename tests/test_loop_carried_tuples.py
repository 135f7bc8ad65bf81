"""Loop-carried tuples (frontend/loops.py `_TupleSlots`): a name whose value before a `for`/`while` loop is a
tuple of kernel values and numbers, reassigned in the body, is carried item by item (as Triton carries
tuples); its length must not change. Checked in the interpreter against torch, compiled and run on the host
for scalar kernels, and compiled for sm_90a (a carried pointer pair feeding a pipelined dot)."""

from __future__ import annotations

import pytest
import torch

import fusedops.dsl as dsl
from fusedops.dsl.target import assemble, ptxas_available
from host_jit import run_on_host
from kernel_source import jit_from_source


def _kernel(source: str, tag: str):
    return jit_from_source(source, f"<loop tuples {tag}>")


_pointer_pair = _kernel('''
def k(o_ptr, x_ptr, n, B: dsl.constexpr):
    i = dsl.arange(0, B)
    p = (x_ptr + i, o_ptr + i)
    acc = dsl.zeros((B,), dsl.float32)
    for t in range(n):
        acc += dsl.load(p[0])
        p = (p[0] + B, p[1])          # one item advances, the other is unchanged (not carried)
    dsl.store(p[1], acc)
''', "pointer_pair")


@pytest.mark.parametrize("n", [0, 1, 3])
def test_a_pointer_pair_advances_item_by_item(n):
    x = torch.randn(32)
    out = torch.full((8,), float("nan"))
    _pointer_pair[(1,)](out, x, n, B=8, interpret=True)
    torch.testing.assert_close(out, x[:8 * n].view(n, 8).sum(0) if n else torch.zeros(8))


_swap_and_count = _kernel('''
def k(o_ptr, n):
    state = (0, 1, 0)                  # (fib(i), fib(i + 1), i): numbers adopt the carried types
    for t in range(n):
        state = (state[1], state[0] + state[1], state[2] + 1)
    a, b, count = state
    dsl.store(o_ptr, a)
    dsl.store(o_ptr + 1, b)
    dsl.store(o_ptr + 2, count)
''', "swap_and_count")


@pytest.mark.parametrize("n", [0, 1, 10, 40])
def test_a_tuple_of_numbers_is_carried_in_the_interpreter_and_on_the_host(n):
    fib = [0, 1]
    for _ in range(n):
        fib = [fib[1], fib[0] + fib[1]]
    expected = [fib[0], fib[1], n]
    out = torch.full((3,), -1, dtype=torch.int32)
    _swap_and_count[(1,)](out, n, interpret=True)
    assert out.tolist() == expected
    out.fill_(-1)
    run_on_host(_swap_and_count, out, n)
    assert out.tolist() == expected


_while_tuple = _kernel('''
def k(o_ptr, n):
    pair = (n, 0)
    while pair[0] > 1:                 # Collatz steps of n
        value = pair[0]
        if value % 2 == 0:
            value = value // 2
        else:
            value = 3 * value + 1
        pair = (value, pair[1] + 1)
    dsl.store(o_ptr, pair[1])
''', "while_tuple")


@pytest.mark.parametrize("n", [1, 6, 27])
def test_a_while_loop_carries_a_tuple(n):
    steps, value = 0, n
    while value > 1:
        value = value // 2 if value % 2 == 0 else 3 * value + 1
        steps += 1
    out = torch.full((1,), -1, dtype=torch.int32)
    _while_tuple[(1,)](out, n, interpret=True)
    assert out.item() == steps
    out.fill_(-1)
    run_on_host(_while_tuple, out, n)
    assert out.item() == steps


_nested = _kernel('''
def k(o_ptr, n, m):
    sums = (0, 0)
    for i in range(n):
        for j in range(m):
            sums = (sums[0] + i, sums[1] + j)
    dsl.store(o_ptr, sums[0])
    dsl.store(o_ptr + 1, sums[1])
''', "nested")


def test_nested_loops_carry_one_tuple():
    out = torch.zeros(2, dtype=torch.int32)
    _nested[(1,)](out, 4, 5, interpret=True)
    assert out.tolist() == [sum(range(4)) * 5, sum(range(5)) * 4]
    out.zero_()
    run_on_host(_nested, out, 4, 5)
    assert out.tolist() == [sum(range(4)) * 5, sum(range(5)) * 4]


_grows = _kernel('''
def k(o_ptr, n):
    pair = (0, 1)
    for t in range(n):
        pair = (pair[0], pair[1], 2)
    dsl.store(o_ptr, pair[0])
''', "grows")

_becomes_value = _kernel('''
def k(o_ptr, n):
    pair = (0, 1)
    for t in range(n):
        pair = pair[0] + pair[1]
    dsl.store(o_ptr, pair)
''', "becomes_value")


@pytest.mark.parametrize("kernel, found", [(_grows, "a tuple of 3 items"), (_becomes_value, "a int32")])
def test_a_carried_tuple_must_keep_its_length(kernel, found):
    with pytest.raises(dsl.CompilationError, match=rf"`pair` is a tuple of 2 items before the loop but {found}"):
        kernel[(1,)](torch.zeros(1, dtype=torch.int32), 3, interpret=True)


_changes_type = _kernel('''
def k(o_ptr, x_ptr, n):
    pair = (dsl.load(x_ptr), 0)
    for t in range(n):
        pair = (pair[0].to(dsl.float16), pair[1] + 1)
    dsl.store(o_ptr, pair[0])
''', "changes_type")


def test_an_item_whose_type_changes_is_named_by_its_slot():
    with pytest.raises(dsl.CompilationError, match=r"loop-carried variable `pair\[0\]` has type float32"):
        _changes_type[(1,)](torch.zeros(1), torch.ones(1), 3, interpret=True)


_dot_pointers = _kernel('''
def k(c_ptr, a_ptr, b_ptr, K, BM: dsl.constexpr, BN: dsl.constexpr, BK: dsl.constexpr):
    rm = dsl.arange(0, BM); rn = dsl.arange(0, BN); rk = dsl.arange(0, BK)
    ptrs = (a_ptr + rm[:, None] * K + rk[None, :], b_ptr + rk[:, None] * BN + rn[None, :])
    acc = dsl.zeros((BM, BN), dsl.float32)
    for k in range(0, K // BK):
        acc += dsl.dot(dsl.load(ptrs[0]), dsl.load(ptrs[1]))
        ptrs = (ptrs[0] + BK, ptrs[1] + BK * BN)
    dsl.store(c_ptr + rm[:, None] * BN + rn[None, :], acc)
''', "dot_pointers")


def test_a_carried_pointer_pair_feeds_a_dot():
    a = torch.randn(16, 64).half()
    b = torch.randn(64, 32).half()
    c = torch.full((16, 32), float("nan"))
    _dot_pointers[(1,)](c, a, b, 64, BM=16, BN=32, BK=16, interpret=True)
    torch.testing.assert_close(c, a.double().matmul(b.double()).float(), atol=1e-2, rtol=1e-3)


@pytest.mark.skipif(not ptxas_available(), reason="ptxas is not on the PATH")
def test_a_carried_pointer_pair_pipelines_like_separate_pointers():
    # the induction-variable pass and the pipeliner see two carried pointers, as if written separately
    a, b, c = torch.zeros(64 * 256, dtype=torch.float16), torch.zeros(256 * 64, dtype=torch.float16), torch.zeros(64 * 64)
    compiled = _dot_pointers.compile(c, a, b, 256, target="sm_90a", num_warps=4, num_stages=3, BM=64, BN=64, BK=32)
    ptx = compiled.asm["ptx"]
    assert "wgmma.mma_async" in ptx and "cp.async" in ptx
    result = assemble(ptx, "sm_90a")
    assert result.spill_bytes == 0 and "C7514" not in result.log


_nested_tuple = _kernel('''
def k(o_ptr, n):
    pair = ((0, 1), 2)
    for t in range(n):
        pair = (pair[0], pair[1] + 1)
    dsl.store(o_ptr, pair[1])
''', "nested_tuple")


def test_a_tuple_holding_a_tuple_is_refused_with_what_can_be_carried():
    with pytest.raises(dsl.CompilationError, match=r"`pair` is a tuple before the loop .* only tuples of kernel "
                                                   r"values and numbers can be loop-carried"):
        _nested_tuple[(1,)](torch.zeros(1, dtype=torch.int32), 3, interpret=True)
