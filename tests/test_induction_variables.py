"""Induction-variable substitution (passes/induction_variables.py): `p += step` carries recomputed from
the loop's induction variable.

CPU tier: which carries are rewritten and which are not (IR); the rewritten IR against the frontend's in
the interpreter (pointer and integer carries, scalar and block, negative and runtime steps, lower bounds
other than 0, zero-trip loops, results used after the loop, nested loops, int32 wrap-around); the
Triton-tutorial matmul, whose A and B pointers are carried, now pipelined through cp.async with 16-byte
copies on sm_80 and sm_90a (B a transposed view too; before: no ring, and B one 2-byte load per element).
GPU tier: that matmul against torch with poisoned outputs; a pointer walked past 2^31 elements.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import fusedops.dsl as dsl
from codegen_helpers import interpret_ir
from fusedops.dsl.ir import OpCode
from fusedops.dsl.passes.induction_variables import substitute_induction_variables
from fusedops.dsl.passes.simplify import simplify
from helpers import assert_close, poison

pytest.importorskip("llvmlite")


# -- kernels ------------------------------------------------------------------------------------------------

@dsl.jit
def walk_rows(out_ptr, x_ptr, lb, ub, stride, BLOCK: dsl.constexpr, STEP: dsl.constexpr):
    # rows lb, lb + STEP, ... (< ub, or > ub for a negative STEP) of x, weighted by r + 1, summed
    cols = dsl.arange(0, BLOCK)
    ptrs = x_ptr + lb * stride + cols
    acc = dsl.zeros((BLOCK,), dsl.float32)
    for r in range(lb, ub, STEP):
        acc += dsl.load(ptrs).to(dsl.float32) * (r + 1)
        ptrs += STEP * stride
    dsl.store(out_ptr + cols, acc)


@dsl.jit
def scalar_carries(out_ptr, n, step, BLOCK: dsl.constexpr):
    # a scalar int32 offset (advanced `step + offset`), an int64 one, and a pointer, all used after the loop
    offset = 0
    wide = dsl.zeros((BLOCK,), dsl.int64) + 3
    where = out_ptr + 4
    for i in range(0, n, 1):
        dsl.store(where + dsl.arange(0, BLOCK), wide + offset + i)
        offset = step + offset
        wide += 1 << 33
        where += BLOCK
    dsl.store(out_ptr + dsl.arange(0, 2), dsl.where(dsl.arange(0, 2) == 0, offset, 7).to(dsl.int64))
    dsl.store(where + dsl.arange(0, BLOCK), wide)


@dsl.jit
def runtime_step(out_ptr, x_ptr, n, step, BLOCK: dsl.constexpr):
    # a runtime step, the pointer's final value read after the loop, and two carries sharing one offset
    cols = dsl.arange(0, BLOCK)
    p = x_ptr + cols
    q = x_ptr + 1 + cols
    total = dsl.zeros((BLOCK,), dsl.float32)
    for i in range(2, n, step):
        total += dsl.load(p) - dsl.load(q)
        advance = step * BLOCK
        p += advance
        q += advance
    dsl.store(out_ptr + cols, total + dsl.load(p))


@dsl.jit
def nested(out_ptr, x_ptr, rows, cols_count, BLOCK: dsl.constexpr):
    # the inner loop's carry starts from the outer loop's
    cols = dsl.arange(0, BLOCK)
    row_ptr = x_ptr + cols
    acc = dsl.zeros((BLOCK,), dsl.float32)
    for r in range(0, rows):
        p = row_ptr
        for c in range(0, cols_count, 2):
            acc += dsl.load(p) * (c + r)
            p += 2 * BLOCK
        row_ptr += cols_count * BLOCK
    dsl.store(out_ptr + cols, acc)


@dsl.jit
def not_rewritten(out_ptr, x_ptr, steps_ptr, n, BLOCK: dsl.constexpr):
    # a step loaded in the loop, a float carry, and a block step defined before the loop: kept carried
    cols = dsl.arange(0, BLOCK)
    p = x_ptr + cols
    q = x_ptr + cols
    block_step = cols * 0 + 3
    f = dsl.zeros((BLOCK,), dsl.float32)
    for i in range(0, n):
        f += dsl.load(p) + dsl.load(q)
        p += dsl.load(steps_ptr + i)
        q += block_step
        f += 0.5
    dsl.store(out_ptr + cols, f)


@dsl.jit
def wrapping(out_ptr, n, BLOCK: dsl.constexpr):
    # an int32 carry that wraps around: i * step wraps the same way
    value = 5
    for i in range(0, n):
        value += 1 << 30
        dsl.store(out_ptr + i * BLOCK + dsl.arange(0, BLOCK), dsl.zeros((BLOCK,), dsl.int32) + value)


@dsl.jit
def tutorial_matmul(c_ptr, a_ptr, b_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                    BLOCK_M: dsl.constexpr, BLOCK_N: dsl.constexpr, BLOCK_K: dsl.constexpr):
    # the Triton tutorial's K loop: the A and B pointer blocks advanced by BLOCK_K every trip
    rm = dsl.program_id(0) * BLOCK_M + dsl.arange(0, BLOCK_M)
    rn = dsl.program_id(1) * BLOCK_N + dsl.arange(0, BLOCK_N)
    rk = dsl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rm[:, None] * stride_am + rk[None, :] * stride_ak
    b_ptrs = b_ptr + rk[:, None] * stride_bk + rn[None, :] * stride_bn
    acc = dsl.zeros((BLOCK_M, BLOCK_N), dsl.float32)
    for k in range(0, K, BLOCK_K):
        a = dsl.load(a_ptrs, mask=(rm[:, None] < M) & (rk[None, :] + k < K), other=0.0)
        b = dsl.load(b_ptrs, mask=(rk[:, None] + k < K) & (rn[None, :] < N), other=0.0)
        acc = dsl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    c_mask = (rm[:, None] < M) & (rn[None, :] < N)
    dsl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn, acc.to(c_ptr.dtype.element), mask=c_mask)


@dsl.jit
def walk_far(out_ptr, x_ptr, rows, stride, BLOCK: dsl.constexpr):
    # one column block summed down `rows` rows of `stride` elements: the last rows lie past 2^31 elements
    cols = dsl.program_id(0) * BLOCK + dsl.arange(0, BLOCK)
    ptrs = x_ptr + cols
    acc = dsl.zeros((BLOCK,), dsl.float32)
    for r in range(0, rows):
        acc += dsl.load(ptrs).to(dsl.float32)
        ptrs += stride
    dsl.store(out_ptr + cols, acc)


@dsl.jit
def k_loop_with_stores(c_ptr, a_ptr, b_ptr, log_ptr, K, WRITE: dsl.constexpr, BLOCK: dsl.constexpr):
    # a K loop that also writes in the loop: WRITE 0 to another argument, 1 to A itself, 2 through a
    # pointer that is A's or B's
    r = dsl.arange(0, BLOCK)
    a_ptrs = a_ptr + r[:, None] * K + r[None, :]
    b_ptrs = b_ptr + r[:, None] * BLOCK + r[None, :]
    acc = dsl.zeros((BLOCK, BLOCK), dsl.float32)
    for k in range(0, K, BLOCK):
        acc = dsl.dot(dsl.load(a_ptrs), dsl.load(b_ptrs), acc)
        if WRITE == 0:
            dsl.store(log_ptr + k // BLOCK, dsl.sum(dsl.sum(acc, 1), 0))
        elif WRITE == 1:
            dsl.store(a_ptrs + BLOCK, acc.to(dsl.float16))
        else:
            dsl.store(dsl.where(k > BLOCK, b_ptr, a_ptr) + K, dsl.sum(dsl.sum(acc, 1), 0).to(dsl.float16))
        a_ptrs += BLOCK
        b_ptrs += BLOCK * BLOCK
    dsl.store(c_ptr + r[:, None] * BLOCK + r[None, :], acc)


# -- helpers ------------------------------------------------------------------------------------------------

def _rewritten(kernel, args, kwargs):
    """(frontend IR, IR after the substitution and simplify) of a fresh copy of `kernel`."""
    original = dsl.jit(kernel.fn).ir(*args, **kwargs)
    function = dsl.jit(kernel.fn).ir(*args, **kwargs)
    substitute_induction_variables(function)
    simplify(function)
    return original, function


def _carried(function) -> list:
    """The carried types of every `for` loop, outermost first."""
    return [[str(arg.type) for arg in op.regions[0].args[1:]] for op in function.walk() if op.opcode == OpCode.FOR]


def _both(kernel, args, kwargs, grid, outputs):
    """Interpret the frontend IR and the rewritten one on copies of `outputs` (poisoned); both results."""
    original, function = _rewritten(kernel, args, kwargs)
    results = []
    for ir in (original, function):
        copies = [poison(o.clone()) for o in outputs]
        it = iter(copies)
        bound = tuple(next(it) if any(a is o for o in outputs) else a for a in args)
        interpret_ir(dsl.jit(kernel.fn), ir, grid, bound, kwargs)
        results.append(copies)
    return original, function, results


# -- CPU tier: IR and interpreter -----------------------------------------------------------------------------

@pytest.mark.parametrize("lb, ub, step", [(0, 9, 1), (3, 17, 2), (5, 5, 1), (7, 2, 1), (15, -1, -3), (12, 12, -2),
                                         (1, 16, 4)])
def test_walk_rows_pointer_block_matches_and_is_no_longer_carried(lb, ub, step):
    rows, block = 17, 8
    x = torch.randn(rows * block)
    out = torch.empty(block)
    args = (out, x, lb, ub, block)
    original, function, (before, after) = _both(walk_rows, args, dict(BLOCK=block, STEP=step), (1,), [out])
    assert _carried(original) == [["<8xfloat32>", "<8xptr<float32>>"]]
    assert _carried(function) == [["<8xfloat32>"]]
    expected = torch.zeros(block, dtype=torch.float64)
    for r in range(lb, ub, step):
        expected += x[r * block:(r + 1) * block].double() * (r + 1)
    for result in (before, after):
        assert_close(result[0], expected, torch.float32)


@pytest.mark.parametrize("n, step", [(0, 3), (1, -4), (6, 5), (9, 1 << 29)])
def test_scalar_integer_and_pointer_carries_used_after_the_loop(n, step):
    block = 4
    out = torch.empty(4 + block * (n + 1), dtype=torch.int64)
    args = (out, n, step)
    original, function, (before, after) = _both(scalar_carries, args, dict(BLOCK=block), (1,), [out])
    # the results are read after the loop: rebuilt there from the trip count, so nothing stays carried
    assert len(_carried(original)[0]) == 3 and _carried(function) == [[]]
    assert torch.equal(before[0], after[0])
    offset = np.int32(0)
    for _ in range(n):
        offset = np.int32(np.int64(offset) + step)      # int32 wrap-around
    assert after[0][0].item() == int(offset) and after[0][1].item() == 7
    assert after[0][4 + block * n:].tolist() == [3 + n * (1 << 33)] * block


@pytest.mark.parametrize("n, step", [(2, 1), (3, 1), (11, 3), (12, 4), (1, 2)])
def test_runtime_step_shared_offset_and_final_pointer(n, step):
    block = 4
    x = torch.randn(block * (n + 8) + 1)
    out = torch.empty(block)
    args = (out, x, n, step)
    original, function, (before, after) = _both(runtime_step, args, dict(BLOCK=block), (1,), [out])
    assert _carried(function) == [["<4xfloat32>"]]    # p (read after the loop) and q are gone
    trips = len(range(2, n, step))
    expected = torch.zeros(block, dtype=torch.float64)
    for t in range(trips):
        at = t * step * block
        expected += x[at:at + block].double() - x[at + 1:at + 1 + block].double()
    expected += x[trips * step * block:trips * step * block + block].double()
    for result in (before, after):
        assert_close(result[0], expected, torch.float32)


def test_nested_loops_inner_carry_starts_from_the_outer_one():
    block, rows, cols_count = 4, 3, 5
    x = torch.randn(rows * cols_count * block + 2 * block)
    out = torch.empty(block)
    args = (out, x, rows, cols_count)
    original, function, (before, after) = _both(nested, args, dict(BLOCK=block), (1,), [out])
    assert _carried(function) == [["<4xfloat32>"], ["<4xfloat32>"]]
    expected = torch.zeros(block, dtype=torch.float64)
    for r in range(rows):
        for t, c in enumerate(range(0, cols_count, 2)):
            at = r * cols_count * block + t * 2 * block
            expected += x[at:at + block].double() * (c + r)
    for result in (before, after):
        assert_close(result[0], expected, torch.float32)


def test_steps_that_are_not_loop_invariant_scalars_stay_carried():
    block = 4
    x = torch.randn(64)
    steps = torch.tensor([1, 5, 2, 0, 3], dtype=torch.int32)
    out = torch.empty(block)
    args = (out, x, steps, 5)
    original, function, (before, after) = _both(not_rewritten, args, dict(BLOCK=block), (1,), [out])
    assert _carried(function) == _carried(original)
    assert sorted(_carried(function)[0]) == ["<4xfloat32>", "<4xptr<float32>>", "<4xptr<float32>>"]
    assert torch.equal(before[0], after[0])


def test_int32_wrap_around_is_the_same():
    block, n = 2, 9
    out = torch.empty(n * block, dtype=torch.int32)
    original, function, (before, after) = _both(wrapping, (out, n), dict(BLOCK=block), (1,), [out])
    assert _carried(function) == [[]]
    expected = []
    value = 5
    for _ in range(n):
        value = (value + (1 << 30) + (1 << 31)) % (1 << 32) - (1 << 31)     # int32 addition
        expected += [value] * block
    assert before[0].tolist() == after[0].tolist() == expected


def test_pointer_offsets_are_multiplied_in_int64():
    _, function = _rewritten(walk_far, (torch.empty(1), torch.empty(1), 4, 1 << 20), dict(BLOCK=8))
    loop = next(op for op in function.walk() if op.opcode == OpCode.FOR)
    (product,) = [op for op in loop.regions[0].ops if op.opcode == OpCode.MUL]
    assert str(product.result.type) == "int64"


def test_tutorial_matmul_in_the_interpreter_after_the_substitution():
    m, n, k = 33, 20, 70
    a, b = torch.randn(m, k).half(), torch.randn(n, k).half().t()
    c = torch.empty(m, n, dtype=torch.float16)
    args = (c, a, b, m, n, k, *a.stride(), *b.stride(), *c.stride())
    kwargs = dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16)
    original, function, (before, after) = _both(tutorial_matmul, args, kwargs, (3, 2), [c])
    assert _carried(function) == [["<16x16xfloat32>"]]
    expected = a.double() @ b.double()
    for result in (before, after):
        assert_close(result[0], expected, torch.float16)


@pytest.mark.parametrize("write, rings", [(0, 2), (1, 1), (2, 0)])
def test_loads_from_memory_the_loop_writes_are_not_fetched_ahead(write, rings):
    from codegen_helpers import pipelined_ir

    args = (torch.empty(1), torch.empty(1, dtype=torch.float16), torch.empty(1, dtype=torch.float16), torch.empty(1),
            256)
    function, _ = pipelined_ir(k_loop_with_stores, args, dict(WRITE=write, BLOCK=32), 4, arch="sm_80", num_stages=3)
    assert sum(op.opcode == OpCode.LOCAL_ALLOC for op in function.walk()) == rings    # one per ringed operand


# -- CPU tier: PTX ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("b_transposed", [False, True])
def test_tutorial_matmul_is_pipelined_with_16_byte_copies(arch, b_transposed, tmp_path, monkeypatch):
    from fusedops.dsl.target import assemble

    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    x = torch.empty(16, dtype=torch.float16)
    b_strides = (1, 4096) if b_transposed else (4096, 1)
    compiled = dsl.jit(tutorial_matmul.fn).compile(x, x, x, 4096, 4096, 4096, 4096, 1, *b_strides, 4096, 1,
                                                   target=arch, num_warps=4, num_stages=3,
                                                   BLOCK_M=128, BLOCK_N=128, BLOCK_K=32)
    ptx = compiled.asm["ptx"]
    assert "local_alloc" in compiled.asm["ir"]
    assert "ld.global" not in ptx                      # every A and B element comes in through cp.async
    copies = re.findall(r"cp\.async\.cg\.shared\.global \[[^]]*\], \[[^]]*\], (\d+)", ptx)
    assert copies and set(copies) == {"16"}
    assert ("wgmma.mma_async" in ptx) == (arch == "sm_90a")
    assert assemble(ptx, arch).spill_bytes == 0


# -- GPU tier ------------------------------------------------------------------------------------------------

@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("m, n, k, b_transposed", [(512, 384, 1024, False), (500, 300, 1000, True),
                                                   (129, 257, 33, True), (64, 64, 16, False), (1, 1, 1, True)])
def test_gpu_tutorial_matmul_matches_torch(m, n, k, b_transposed, dtype):
    a = torch.randn(m, k, device="cuda", dtype=dtype)
    b = torch.randn(n, k, device="cuda", dtype=dtype).t() if b_transposed else torch.randn(k, n, device="cuda",
                                                                                          dtype=dtype)
    c = poison(torch.empty(m, n, device="cuda", dtype=dtype))
    for num_warps, num_stages in ((4, 3), (8, 4)):
        grid = (-(-m // 64), -(-n // 64))
        tutorial_matmul[grid](c, a, b, m, n, k, *a.stride(), *b.stride(), *c.stride(), BLOCK_M=64, BLOCK_N=64,
                              BLOCK_K=32, num_warps=num_warps, num_stages=num_stages)
        assert_close(c, a.double() @ b.double(), dtype)


@pytest.mark.cuda
def test_gpu_pointer_walked_past_2_to_the_31_elements():
    rows, stride, block = 67000, 1 << 15, 128           # the last row starts past element 2^31
    x = torch.zeros(rows, stride, device="cuda", dtype=torch.float16)
    x[:, :block] = 1.0
    x[-1, :block] = torch.arange(block, device="cuda", dtype=torch.float16)
    out = poison(torch.empty(block, device="cuda"))
    walk_far[(1,)](out, x, rows, stride, BLOCK=block)
    expected = (rows - 1) + torch.arange(block, device="cuda", dtype=torch.float32)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
