"""Review (session 21) of passes/induction_variables.py (`p += step` carries recomputed from the loop's
induction variable), by a fresh reviewer trying to break it. CPU only.

DEFECTS found (each fixed in the same change; the tests below were strict xfails until then):
  1. test_trip_index_of_a_range_wider_than_int32: `(k - lb) / step` is computed in the induction
     variable's type; for an int32 range whose span passes 2^31 (lb = -2e9, ub = 2e9, step = 1e9, four
     trips, which codegen's FOR runs exactly: control.py saturates `iv + step`), `k - lb` wraps and the
     trip index of the last trip is -1: the rewritten loop reads before the tensor.
  2. test_the_pass_writes_no_file: the pass appends to /tmp/iv_log.txt on every kernel it changes
     (debug code left in substitute_induction_variables).
  3. test_decrementing_pointer_is_rewritten: `p -= stride` is `addptr(p, neg(s))`; NEG is not in
     _MOVABLE (and the pass runs before simplify, so even `neg` of a constant is not folded): the carry
     stays (no pipelining / layout freedom for reverse walks).
  4. test_invariance_check_is_not_exponential: `_invariant` re-walks shared operands without a memo:
     an offset built by DEPTH doublings (`s = s + s`) costs 2^DEPTH calls (DEPTH = 19: ~1 s; the depth
     cap 32 allows 2^32).
  5. test_store_feeding_a_later_trip_is_not_prefetched_stale: a loop that stores the tile the next trip
     loads (x_{k+1} = x_k @ w) was correct with its carried pointer (not pipelined); with the pass the
     load's address is a function of k, pipelining.py makes it a cp.async ring issued num_stages - 1
     trips ahead, and the copy reads the tile before the store that writes it: wrong results. (The
     pipeliner has no memory-dependence check; the same kernel written with k-based addresses was
     already wrong: test_pipeliner_store_then_load_with_k_addresses.)
  6. test_no_more_spills_when_the_carry_is_used_after_the_loop: when the loop's result is read after
     the loop the carry stays *and* p0 is live across the loop (p_k = p0 + trip * s): three 4096-element
     pointer blocks read after the loop go from ~440 to ~3270 spill bytes on sm_80.
Fixes: the trip index in the unsigned type of the induction variable's width; no file written; `-=`
rewritten (NEG movable, SUB carries); the invariance check memoized; pipelining.py does not ring a load
whose kernel arguments (passes/pointer_roots.py) the loop writes through; a result read after the loop is
rebuilt there as p0 + trip count * s (the carry is dropped).
"""

from __future__ import annotations

import re

import pytest
import torch

import fusedops.dsl as dsl
import fusedops.dsl.passes.induction_variables as iv_module
import fusedops.dsl.passes.pipeline as pipeline_module
from codegen_helpers import interpret_ir, pipelined_ir
from fusedops.dsl.ir import OpCode, verify
from fusedops.dsl.passes.induction_variables import substitute_induction_variables
from fusedops.dsl.passes.simplify import simplify
from helpers import assert_close, poison

pytest.importorskip("llvmlite")


# -- kernels ------------------------------------------------------------------------------------------------

@dsl.jit
def span_walk(out_ptr, x_ptr, lb, ub, step, BLOCK: dsl.constexpr):
    # row t of x (t = trip number) weighted by 10^t; the pointer advances one row per trip
    cols = dsl.arange(0, BLOCK)
    p = x_ptr + cols
    acc = dsl.zeros((BLOCK,), dsl.float32)
    w = 1.0
    for k in range(lb, ub, step):
        acc += dsl.load(p) * w
        w = w * 10.0
        p += BLOCK
    dsl.store(out_ptr + cols, acc)


@dsl.jit
def swap(out_ptr, n, s, BLOCK: dsl.constexpr):
    # a, b = b, a + s: neither slot advances itself; the output pointer does
    a = 0
    b = 100
    q = out_ptr
    for i in range(0, n):
        a, b = b, a + s
        dsl.store(q + dsl.arange(0, BLOCK), dsl.zeros((BLOCK,), dsl.int32) + a * 1000 + b)
        q += BLOCK


@dsl.jit
def cond_reassign(out_ptr, x_ptr, n, flag_ptr, BLOCK: dsl.constexpr):
    # p reset in an `if` before the advance: the yield is addptr(if result, s), not of the carried p
    cols = dsl.arange(0, BLOCK)
    p = x_ptr + cols
    acc = dsl.zeros((BLOCK,), dsl.float32)
    for i in range(0, n):
        if dsl.load(flag_ptr + i) != 0:
            p = x_ptr + cols
        acc += dsl.load(p)
        p += BLOCK
    dsl.store(out_ptr + cols, acc)


@dsl.jit
def nested_if_read(out_ptr, x_ptr, n, flag_ptr, BLOCK: dsl.constexpr):
    # the carried pointer read in both branches of an `if` and in an inner loop
    cols = dsl.arange(0, BLOCK)
    p = x_ptr + cols
    acc = dsl.zeros((BLOCK,), dsl.float32)
    for i in range(0, n):
        if dsl.load(flag_ptr + i) != 0:
            acc += dsl.load(p)
            for j in range(0, 2):
                acc += dsl.load(p + j) * 2.0
        else:
            acc -= dsl.load(p + 1)
        p += BLOCK
    dsl.store(out_ptr + cols, acc)


@dsl.jit
def body_offset(out_ptr, x_ptr, n, stride, BLOCK: dsl.constexpr):
    # the step computed in the body from invariant values (hoisted), and also used by a load
    cols = dsl.arange(0, BLOCK)
    p = x_ptr + cols
    acc = dsl.zeros((BLOCK,), dsl.float32)
    for i in range(0, n):
        s = stride * 2 + 1
        acc += dsl.load(p) + dsl.load(x_ptr + s + cols) * 0.5
        p += s
    dsl.store(out_ptr + cols, acc)


@dsl.jit
def body_offset_variant(out_ptr, x_ptr, n, BLOCK: dsl.constexpr):
    # the step is itself carried (doubles every trip): must stay carried
    cols = dsl.arange(0, BLOCK)
    p = x_ptr + cols
    acc = dsl.zeros((BLOCK,), dsl.float32)
    s = 1
    for i in range(0, n):
        acc += dsl.load(p)
        s = s * 2
        p += s
    dsl.store(out_ptr + cols, acc)


@dsl.jit
def uint_offset(out_ptr, x_ptr, n, s, BLOCK: dsl.constexpr):
    cols = dsl.arange(0, BLOCK)
    p = x_ptr + cols
    acc = dsl.zeros((BLOCK,), dsl.float32)
    su = s.to(dsl.uint32)
    for i in range(0, n):
        acc += dsl.load(p) * (i + 1)
        p += su
    dsl.store(out_ptr + cols, acc)


@dsl.jit
def narrow_offset(out_ptr, x_ptr, n, s, BLOCK: dsl.constexpr):
    # a negative int8 step (sign-extended by addptr and by the pass's cast alike)
    cols = dsl.arange(0, BLOCK)
    p = x_ptr + 40 * BLOCK + cols
    acc = dsl.zeros((BLOCK,), dsl.float32)
    s8 = s.to(dsl.int8)
    for i in range(0, n):
        acc += dsl.load(p) * (i + 1)
        p += s8
    dsl.store(out_ptr + cols, acc)


@dsl.jit
def uint_carry(out_ptr, n, s, BLOCK: dsl.constexpr):
    # a uint32 carry that wraps past 2^32
    v = s.to(dsl.uint32) * 0 + 7
    su = s.to(dsl.uint32)
    for i in range(0, n):
        dsl.store(out_ptr + i * BLOCK + dsl.arange(0, BLOCK), dsl.zeros((BLOCK,), dsl.int64) + v.to(dsl.int64))
        v += su
    dsl.store(out_ptr + n * BLOCK + dsl.arange(0, BLOCK), dsl.zeros((BLOCK,), dsl.int64) + v.to(dsl.int64))


@dsl.jit
def int64_bounds(out_ptr, x_ptr, lb, ub, step, BLOCK: dsl.constexpr):
    # int64 induction variable (bounds past 2^31), an int32 and a pointer carry
    cols = dsl.arange(0, BLOCK)
    p = x_ptr + cols
    o = 0
    acc = dsl.zeros((BLOCK,), dsl.float32)
    for k in range(lb, ub, step):
        acc += dsl.load(p) * (o + 1)
        p += BLOCK
        o += 1
    dsl.store(out_ptr + cols, acc)


@dsl.jit
def int64_carry_down(out_ptr, n, BLOCK: dsl.constexpr):
    # an int64 block carry with a runtime int64 step, counted down by an int32 induction variable
    v = dsl.zeros((BLOCK,), dsl.int64) - (1 << 40)
    s = n.to(dsl.int64) * (1 << 35)
    for i in range(n, 0, -1):
        dsl.store(out_ptr + (n - i) * BLOCK + dsl.arange(0, BLOCK), v)
        v += s


@dsl.jit
def outer_inner(out_ptr, x_ptr, rows, inner, BLOCK: dsl.constexpr):
    # one pointer advanced by the inner loop and by the outer one (the inner's init is the outer carry)
    cols = dsl.arange(0, BLOCK)
    p = x_ptr + cols
    acc = dsl.zeros((BLOCK,), dsl.float32)
    for r in range(0, rows):
        for c in range(0, inner):
            acc += dsl.load(p) * (c + 1)
            p += BLOCK
        p += 1
    dsl.store(out_ptr + cols, acc)


@dsl.jit
def carried_bound(out_ptr, x_ptr, n, BLOCK: dsl.constexpr):
    # the inner loop's bounds, step and pointer step are outer carries (rewritten themselves)
    cols = dsl.arange(0, BLOCK)
    acc = dsl.zeros((BLOCK,), dsl.float32)
    start = 0
    st = 1
    for r in range(0, n):
        q = x_ptr + cols + start * BLOCK
        for j in range(start, start + 6, st):
            acc += dsl.load(q) * (j + r + 1)
            q += st * BLOCK
        start += 2
        st += 1
    dsl.store(out_ptr + cols, acc)


@dsl.jit
def for_in_while(out_ptr, x_ptr, n, m, BLOCK: dsl.constexpr):
    # a for loop whose init is a while loop's carry; the while loop itself is not touched
    cols = dsl.arange(0, BLOCK)
    acc = dsl.zeros((BLOCK,), dsl.float32)
    p = x_ptr + cols
    t = 0
    while t < n:
        for i in range(0, m):
            acc += dsl.load(p) * (t + 1)
            p += BLOCK
        t += 1
    dsl.store(out_ptr + cols, acc + dsl.load(p))


@dsl.jit
def loop_in_if(out_ptr, x_ptr, n, flag, BLOCK: dsl.constexpr):
    cols = dsl.arange(0, BLOCK)
    acc = dsl.zeros((BLOCK,), dsl.float32)
    if flag > 0:
        p = x_ptr + cols
        for i in range(0, n):
            acc += dsl.load(p) * (i + 1)
            p += BLOCK
    dsl.store(out_ptr + cols, acc)


@dsl.jit
def follow(out_ptr, x_ptr, n, BLOCK: dsl.constexpr):
    # q takes p's value before p advances; both read after the loop
    cols = dsl.arange(0, BLOCK)
    p = x_ptr + BLOCK + cols
    q = x_ptr + cols
    acc = dsl.zeros((BLOCK,), dsl.float32)
    for i in range(0, n):
        acc += dsl.load(q) * (i + 1) + dsl.load(p)
        q = p
        p += BLOCK
    dsl.store(out_ptr + cols, acc + dsl.load(q))


@dsl.jit
def scalar_pointer(out_ptr, x_ptr, n, step):
    p = x_ptr
    acc = 0.0
    for i in range(3, n, step):
        acc += dsl.load(p) * i
        p += step
    dsl.store(out_ptr, acc)


@dsl.jit
def while_and_static(out_ptr, x_ptr, n, BLOCK: dsl.constexpr):
    # no FOR op: a while loop and an unrolled static_range
    cols = dsl.arange(0, BLOCK)
    p = x_ptr + cols
    acc = dsl.zeros((BLOCK,), dsl.float32)
    i = 0
    while i < n:
        acc += dsl.load(p)
        p += BLOCK
        i += 1
    for j in dsl.static_range(3):
        acc += dsl.load(p) * (j + 2)
        p += BLOCK
    dsl.store(out_ptr + cols, acc)


@dsl.jit
def int16_and_float_carries(out_ptr, n, BLOCK: dsl.constexpr):
    # an int16 carry (wraps) and a float carry: both left alone
    v = dsl.zeros((BLOCK,), dsl.int16) + 7
    f = dsl.zeros((BLOCK,), dsl.float32) + 0.1
    for i in range(0, n):
        dsl.store(out_ptr + i * BLOCK + dsl.arange(0, BLOCK), v.to(dsl.int32) + (f * 1000.0).to(dsl.int32))
        v += 20000
        f += 0.1


@dsl.jit
def decrement(out_ptr, x_ptr, n, stride, BLOCK: dsl.constexpr):
    # rows n-1, ..., 0 of x weighted by i + 1: the pointer walks backwards with `-=`
    cols = dsl.arange(0, BLOCK)
    p = x_ptr + (n - 1) * stride + cols
    acc = dsl.zeros((BLOCK,), dsl.float32)
    for i in range(0, n):
        acc += dsl.load(p) * (i + 1)
        p -= stride
    dsl.store(out_ptr + cols, acc)


@dsl.jit
def doubling(out_ptr, x_ptr, n, stride, BLOCK: dsl.constexpr, DEPTH: dsl.constexpr):
    # the step is stride * 2^DEPTH, built in the body by DEPTH doublings (each reads its operand twice)
    cols = dsl.arange(0, BLOCK)
    p = x_ptr + cols
    acc = dsl.zeros((BLOCK,), dsl.float32)
    for i in range(0, n):
        acc += dsl.load(p) * (i + 1)
        s = stride
        for _ in dsl.static_range(DEPTH):
            s = s + s
        p += s
    dsl.store(out_ptr + cols, acc)


@dsl.jit
def chain(x_ptr, w_ptr, n, BLOCK: dsl.constexpr):
    # tile k + 1 of x is written by trip k (x_{k+1} = x_k @ w) and read by trip k + 1
    r = dsl.arange(0, BLOCK)
    offs = r[:, None] * BLOCK + r[None, :]
    w = dsl.load(w_ptr + offs)
    p = x_ptr + offs
    for k in range(0, n):
        a = dsl.load(p)
        y = dsl.dot(a, w)
        p += BLOCK * BLOCK
        dsl.store(p, y.to(dsl.float16))


@dsl.jit
def chain_k(x_ptr, w_ptr, n, BLOCK: dsl.constexpr):
    # chain with the addresses computed from k (no carry, so no substitution is involved)
    r = dsl.arange(0, BLOCK)
    offs = r[:, None] * BLOCK + r[None, :]
    w = dsl.load(w_ptr + offs)
    for k in range(0, n):
        a = dsl.load(x_ptr + k * BLOCK * BLOCK + offs)
        y = dsl.dot(a, w)
        dsl.store(x_ptr + (k + 1) * BLOCK * BLOCK + offs, y.to(dsl.float16))


@dsl.jit
def matmul_split_k(c_ptr, a_ptr, b_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                   BLOCK_M: dsl.constexpr, BLOCK_N: dsl.constexpr, BLOCK_K: dsl.constexpr):
    # K halves over program_id(2): the loop and the pointers start at the half's first k (lb != 0)
    rm = dsl.program_id(0) * BLOCK_M + dsl.arange(0, BLOCK_M)
    rn = dsl.program_id(1) * BLOCK_N + dsl.arange(0, BLOCK_N)
    start = dsl.program_id(2) * (K // 2)
    rk = dsl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rm[:, None] * stride_am + (start + rk[None, :]) * stride_ak
    b_ptrs = b_ptr + (start + rk[:, None]) * stride_bk + rn[None, :] * stride_bn
    acc = dsl.zeros((BLOCK_M, BLOCK_N), dsl.float32)
    for k in range(start, start + K // 2, BLOCK_K):
        a = dsl.load(a_ptrs)
        b = dsl.load(b_ptrs)
        acc = dsl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    c_mask = (rm[:, None] < M) & (rn[None, :] < N)
    dsl.atomic_add(c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn, acc, mask=c_mask)


@dsl.jit
def matmul_tail_after_loop(c_ptr, a_ptr, b_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm,
                           stride_cn, BLOCK_M: dsl.constexpr, BLOCK_N: dsl.constexpr, BLOCK_K: dsl.constexpr):
    # the last K block is multiplied after the loop, through the carried pointers' final values
    rm = dsl.program_id(0) * BLOCK_M + dsl.arange(0, BLOCK_M)
    rn = dsl.program_id(1) * BLOCK_N + dsl.arange(0, BLOCK_N)
    rk = dsl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rm[:, None] * stride_am + rk[None, :] * stride_ak
    b_ptrs = b_ptr + rk[:, None] * stride_bk + rn[None, :] * stride_bn
    acc = dsl.zeros((BLOCK_M, BLOCK_N), dsl.float32)
    for k in range(0, K - BLOCK_K, BLOCK_K):
        a = dsl.load(a_ptrs)
        b = dsl.load(b_ptrs)
        acc = dsl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    acc = dsl.dot(dsl.load(a_ptrs), dsl.load(b_ptrs), acc)
    dsl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn, acc.to(c_ptr.dtype.element))


@dsl.jit
def walks_used_after(out_ptr, x_ptr, y_ptr, z_ptr, w_ptr, rows, stride, BLOCK: dsl.constexpr):
    # four pointer blocks walked down rows; three of their final values read after the loop
    cols = dsl.program_id(0) * BLOCK + dsl.arange(0, BLOCK)
    px = x_ptr + cols
    py = y_ptr + cols * 2
    pz = z_ptr + cols * 3
    pw = w_ptr + cols * 5
    acc = dsl.zeros((BLOCK,), dsl.float32)
    for r in range(0, rows):
        acc += dsl.load(px) * dsl.load(py) + dsl.load(pz) * dsl.load(pw)
        px += stride
        py += stride
        pz += stride
        pw += stride
    acc += dsl.load(px) + dsl.load(py) + dsl.load(pz)
    dsl.store(out_ptr + cols, acc)


# -- helpers ------------------------------------------------------------------------------------------------

def _rewritten(kernel, args, kwargs):
    """(frontend IR, IR after the substitution and simplify, whether the pass changed it), verified."""
    original = dsl.jit(kernel.fn).ir(*args, **kwargs)
    function = dsl.jit(kernel.fn).ir(*args, **kwargs)
    changed = substitute_induction_variables(function)
    simplify(function)
    verify(function)
    return original, function, changed


def _carried(function) -> list:
    return [[str(arg.type) for arg in op.regions[0].args[1:]] for op in function.walk() if op.opcode == OpCode.FOR]


def _run(kernel, ir, args, kwargs, outputs, grid=(1,)):
    """Interpret `ir` on poisoned copies of `outputs`; the copies."""
    copies = [poison(o.clone()) for o in outputs]
    it = iter(copies)
    bound = tuple(next(it) if any(a is o for o in outputs) else a for a in args)
    interpret_ir(dsl.jit(kernel.fn), ir, grid, bound, kwargs)
    return copies


def _both(kernel, args, kwargs, outputs, grid=(1,)):
    original, function, changed = _rewritten(kernel, args, kwargs)
    before = _run(kernel, original, args, kwargs, outputs, grid)
    after = _run(kernel, function, args, kwargs, outputs, grid)
    return original, function, changed, before, after


def _written(tensor) -> bool:
    if tensor.dtype.is_floating_point:
        return not torch.isnan(tensor).any().item()
    return not (tensor == torch.iinfo(tensor.dtype).min).any().item()


def _without_the_pass(monkeypatch):
    default = pipeline_module.default_pipeline

    def without(*args, **kwargs):
        return [p for p in default(*args, **kwargs) if getattr(p, "__name__", "") != "substitute_induction_variables"]
    monkeypatch.setattr(pipeline_module, "default_pipeline", without)


B = 4


def _x(n=80 * B):
    return torch.randn(n)


# -- interpreter: original IR against the rewritten one (held up) -----------------------------------------

def _battery():
    f = torch.empty(B)
    flags = torch.tensor([0, 1, 0, 0, 1, 1, 0], dtype=torch.int32)
    return [
        # name, kernel, args (out first), constexprs, rewritten?
        ("swap", swap, (torch.empty(B * 7, dtype=torch.int32), 7, 3), dict(BLOCK=B), True),
        ("cond_reassign", cond_reassign, (f, _x(), 7, flags), dict(BLOCK=B), False),
        ("nested_if_read", nested_if_read, (f, _x(), 7, flags), dict(BLOCK=B), True),
        ("body_offset", body_offset, (f, _x(), 5, 3), dict(BLOCK=B), True),
        ("body_offset_variant", body_offset_variant, (f, _x(), 5), dict(BLOCK=B), False),
        ("uint_offset", uint_offset, (f, _x(), 5, 7), dict(BLOCK=B), True),
        ("narrow_offset", narrow_offset, (f, _x(), 9, -3), dict(BLOCK=B), True),
        ("uint_carry", uint_carry, (torch.empty(B * 10, dtype=torch.int64), 9, (1 << 31) + 5), dict(BLOCK=B), True),
        ("int64_bounds_high", int64_bounds, (f, _x(), (1 << 40), (1 << 40) + 9, 2), dict(BLOCK=B), True),
        ("int64_bounds_low", int64_bounds, (f, _x(), -(1 << 40), -(1 << 40) + 9, 2), dict(BLOCK=B), True),
        ("int64_bounds_zero_trip", int64_bounds, (f, _x(), (1 << 40), (1 << 40), 2), dict(BLOCK=B), True),
        ("int64_carry_down", int64_carry_down, (torch.empty(B * 7, dtype=torch.int64), 7), dict(BLOCK=B), True),
        ("outer_inner", outer_inner, (f, _x(), 3, 4), dict(BLOCK=B), True),
        ("carried_bound", carried_bound, (f, _x(), 4), dict(BLOCK=B), True),
        ("for_in_while", for_in_while, (f, _x(), 3, 4), dict(BLOCK=B), True),
        ("loop_in_if", loop_in_if, (f, _x(), 5, 1), dict(BLOCK=B), True),
        ("loop_in_if_skipped", loop_in_if, (f, _x(), 5, 0), dict(BLOCK=B), True),
        ("follow", follow, (f, _x(), 5), dict(BLOCK=B), True),
        ("follow_one_trip", follow, (f, _x(), 1), dict(BLOCK=B), True),
        ("scalar_pointer", scalar_pointer, (torch.empty(1), _x(), 20, 3), dict(), True),
        ("while_and_static", while_and_static, (f, _x(), 5), dict(BLOCK=B), False),
        ("int16_and_float", int16_and_float_carries, (torch.empty(B * 9, dtype=torch.int32), 9), dict(BLOCK=B),
         False),
        ("span_below_2_31", span_walk, (f, _x(), -1_000_000_000, 1_000_000_000, 500_000_000), dict(BLOCK=B), True),
        ("span_int64_bounds", span_walk, (f, _x(), 0, 3_000_000_000, 1_000_000_000), dict(BLOCK=B), True),
        ("decrement", decrement, (f, _x(), 5, 8), dict(BLOCK=B), True),
        ("doubling", doubling, (f, _x(), 3, 1), dict(BLOCK=B, DEPTH=3), True),
    ]


@pytest.mark.parametrize("case", range(len(_battery())), ids=[c[0] for c in _battery()])
def test_rewritten_ir_matches_the_frontend_ir(case):
    torch.manual_seed(case)
    name, kernel, args, kwargs, rewritten = _battery()[case]
    out = args[0]
    original, function, changed, (before,), (after,) = _both(kernel, args, kwargs, [out])
    assert changed == rewritten
    if not rewritten:
        assert _carried(function) == _carried(original)
    assert _written(before)
    assert torch.equal(before, after) or (before.dtype.is_floating_point and
                                          torch.equal(before.nan_to_num(), after.nan_to_num()))


def test_swap_reference():
    n, s = 7, 3
    out = torch.empty(B * n, dtype=torch.int32)
    _, function, _, (before,), (after,) = _both(swap, (out, n, s), dict(BLOCK=B), [out])
    a, b, expected = 0, 100, []
    for _ in range(n):
        a, b = b, a + s
        expected += [a * 1000 + b] * B
    assert before.tolist() == after.tolist() == expected
    assert len(_carried(function)[0]) == 2            # a and b carried; the output pointer is not


def test_carried_bound_reference():
    n = 4
    x = _x()
    out = torch.empty(B)
    _, function, _, (before,), (after,) = _both(carried_bound, (out, x, n), dict(BLOCK=B), [out])
    expected = torch.zeros(B, dtype=torch.float64)
    for r in range(n):
        start, st = 2 * r, 1 + r
        for t, j in enumerate(range(start, start + 6, st)):
            at = (start + t * st) * B
            expected += x[at:at + B].double() * (j + r + 1)
    for result in (before, after):
        assert_close(result, expected, torch.float32)
    assert _carried(function) == [["<4xfloat32>"], ["<4xfloat32>"]]


def test_follow_reference():
    n = 5
    x = _x()
    out = torch.empty(B)
    _, _, _, (before,), (after,) = _both(follow, (out, x, n), dict(BLOCK=B), [out])
    row = lambda i: x[i * B:(i + 1) * B].double()
    expected = sum(row(i) * (i + 1) + row(i + 1) for i in range(n)) + row(n)
    for result in (before, after):
        assert_close(result, expected, torch.float32)


# -- defect 1: the trip index wraps in the induction variable's type ---------------------------------------

@pytest.mark.parametrize("lb, ub, step", [(-2_000_000_000, 2_000_000_000, 1_000_000_000),
                                         (2_000_000_000, -2_000_000_000, -1_000_000_000)])
def test_frontend_ir_runs_a_range_wider_than_int32(lb, ub, step):
    x, out = _x(), torch.empty(B)
    original = dsl.jit(span_walk.fn).ir(out, x, lb, ub, step, BLOCK=B)
    assert str(original.args[2].type) == "int32"           # the induction variable is int32
    (result,) = _run(span_walk, original, (out, x, lb, ub, step), dict(BLOCK=B), [out])
    expected = sum(x[t * B:(t + 1) * B].double() * 10.0 ** t for t in range(4))
    assert_close(result, expected, torch.float32)


@pytest.mark.parametrize("lb, ub, step", [(-2_000_000_000, 2_000_000_000, 1_000_000_000),
                                         (2_000_000_000, -2_000_000_000, -1_000_000_000)])
def test_trip_index_of_a_range_wider_than_int32(lb, ub, step):
    x, out = _x(), torch.empty(B)
    _, function, changed = _rewritten(span_walk, (out, x, lb, ub, step), dict(BLOCK=B))
    assert changed
    (result,) = _run(span_walk, function, (out, x, lb, ub, step), dict(BLOCK=B), [out])
    expected = sum(x[t * B:(t + 1) * B].double() * 10.0 ** t for t in range(4))
    assert_close(result, expected, torch.float32)


# -- defect 2: debug output -------------------------------------------------------------------------------

def test_the_pass_writes_no_file(monkeypatch):
    opened = []

    def recording_open(*args, **kwargs):
        opened.append(args[0] if args else kwargs.get("file"))
        raise AssertionError(f"the pass opened {opened[-1]!r}")
    monkeypatch.setattr(iv_module, "open", recording_open, raising=False)
    function = dsl.jit(span_walk.fn).ir(torch.empty(B), _x(), 0, 4, 1, BLOCK=B)
    assert substitute_induction_variables(function)
    assert opened == []


# -- defect 3: `p -= s` is not recognized -----------------------------------------------------------------

def test_decrementing_pointer_reference():
    n, stride = 5, 8
    x, out = _x(), torch.empty(B)
    _, _, _, (before,), (after,) = _both(decrement, (out, x, n, stride), dict(BLOCK=B), [out])
    expected = sum(x[(n - 1 - i) * stride:(n - 1 - i) * stride + B].double() * (i + 1) for i in range(n))
    for result in (before, after):
        assert_close(result, expected, torch.float32)


def test_decrementing_pointer_is_rewritten():
    _, function, changed = _rewritten(decrement, (torch.empty(B), _x(), 5, 8), dict(BLOCK=B))
    assert changed
    assert _carried(function) == [["<4xfloat32>"]]


# -- defect 4: exponential invariance check ---------------------------------------------------------------

def test_invariance_check_is_not_exponential(monkeypatch):
    calls = []
    real = iv_module._invariant

    def counting(value, loop, depth=32):
        calls.append(1)
        return real(value, loop, depth)
    monkeypatch.setattr(iv_module, "_invariant", counting)
    function = dsl.jit(doubling.fn).ir(torch.empty(B), _x(), 3, 1, BLOCK=B, DEPTH=12)
    assert substitute_induction_variables(function)
    ops = sum(1 for _ in function.walk())
    assert len(calls) <= 4 * ops, (len(calls), ops)


def test_doubling_offset_reference():
    n, stride, depth = 3, 1, 3
    x, out = _x(), torch.empty(B)
    _, function, changed, (before,), (after,) = _both(doubling, (out, x, n, stride), dict(BLOCK=B, DEPTH=depth), [out])
    assert changed and _carried(function) == [["<4xfloat32>"]]
    step = stride << depth
    expected = sum(x[i * step:i * step + B].double() * (i + 1) for i in range(n))
    for result in (before, after):
        assert_close(result, expected, torch.float32)


# -- defect 5: pipelining now reaches loops that store what a later trip loads ----------------------------

def _chain_case(kernel, arch, monkeypatch, with_pass):
    n = 5
    torch.manual_seed(5)
    w = (torch.eye(16) * 0.5 + torch.randn(16, 16) * 0.1).half()
    x0 = torch.randn(16, 16).half()
    reference = [x0.double()]
    for _ in range(n):
        reference.append((reference[-1].half().double() @ w.double()).half().double())
    x = torch.zeros((n + 1) * 16, 16).half()
    x[:16] = x0
    if not with_pass:
        _without_the_pass(monkeypatch)
    function, _ = pipelined_ir(kernel, (x, w, n), dict(BLOCK=16), 4, arch=arch, num_stages=3)
    ring = any(op.opcode == OpCode.LOCAL_ALLOC for op in function.walk())
    interpret_ir(dsl.jit(kernel.fn), function, (1,), (x, w, n), dict(BLOCK=16))
    return ring, x, torch.cat(reference)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_chain_without_the_pass_is_not_pipelined_and_right(arch, monkeypatch):
    ring, x, reference = _chain_case(chain, arch, monkeypatch, with_pass=False)
    assert not ring
    assert_close(x, reference, torch.float16)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_store_feeding_a_later_trip_is_not_prefetched_stale(arch, monkeypatch):
    ring, x, reference = _chain_case(chain, arch, monkeypatch, with_pass=True)
    assert_close(x, reference, torch.float16)


def test_pipeliner_store_then_load_with_k_addresses(monkeypatch):
    ring, x, reference = _chain_case(chain_k, "sm_80", monkeypatch, with_pass=False)
    assert_close(x, reference, torch.float16)


# -- pipelined IR in the interpreter (held up) --------------------------------------------------------------

@pytest.mark.parametrize("arch, num_stages", [("sm_80", 3), ("sm_90a", 4)])
@pytest.mark.parametrize("kernel, k", [(matmul_split_k, 96), (matmul_tail_after_loop, 80),
                                       (matmul_tail_after_loop, 16)])
def test_pipelined_ir_of_substituted_matmuls(kernel, k, arch, num_stages):
    m = n = 64
    a, b = torch.randn(m, k).half(), torch.randn(k, n).half()
    split = kernel is matmul_split_k
    c = torch.zeros(m, n) if split else poison(torch.empty(m, n, dtype=torch.float16))
    args = (c, a, b, m, n, k, *a.stride(), *b.stride(), *c.stride())
    kwargs = dict(BLOCK_M=32, BLOCK_N=32, BLOCK_K=16)
    function, _ = pipelined_ir(kernel, args, kwargs, 4, arch=arch, num_stages=num_stages)
    assert any(op.opcode == OpCode.LOCAL_ALLOC for op in function.walk())      # a cp.async ring
    interpret_ir(dsl.jit(kernel.fn), function, (2, 2, 2) if split else (2, 2), args, kwargs)
    assert_close(c, a.double() @ b.double(), torch.float16)


# -- PTX ---------------------------------------------------------------------------------------------------

def _compile(kernel, args, kwargs, arch, num_warps, num_stages, cache_dir, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(cache_dir))
    return dsl.jit(kernel.fn).compile(*args, target=arch, num_warps=num_warps, num_stages=num_stages, **kwargs)


@pytest.mark.parametrize("arch, num_stages", [("sm_80", 3), ("sm_90a", 4)])
@pytest.mark.parametrize("kernel", [matmul_split_k, matmul_tail_after_loop])
def test_ptx_of_substituted_matmuls(kernel, arch, num_stages, tmp_path, monkeypatch):
    from fusedops.dsl.target import assemble

    h = torch.empty(16, dtype=torch.float16)
    c = torch.empty(16) if kernel is matmul_split_k else h
    compiled = _compile(kernel, (c, h, h, 4096, 4096, 4096, 4096, 1, 4096, 1, 4096, 1),
                        dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=32), arch, 4, num_stages, tmp_path, monkeypatch)
    ptx = compiled.asm["ptx"]
    copies = re.findall(r"cp\.async\.cg\.shared\.global \[[^]]*\], \[[^]]*\], (\d+)", ptx)
    assert copies and set(copies) == {"16"}
    # the loop's loads all go through the ring; only the tail kernel's after-loop block is loaded directly
    loads = set(re.findall(r"ld\.global(?:\.[a-z0-9]+)*", ptx))
    assert loads <= {"ld.global.v4.b32"} and (bool(loads) == (kernel is matmul_tail_after_loop))
    assert assemble(ptx, arch).spill_bytes == 0


def test_no_more_spills_when_the_carry_is_used_after_the_loop(tmp_path, monkeypatch):
    from fusedops.dsl.target import assemble

    f = torch.empty(16)
    args, kwargs = (f, f, f, f, f, 64, 4096), dict(BLOCK=4096)
    with_pass = _compile(walks_used_after, args, kwargs, "sm_80", 4, 1, tmp_path / "with", monkeypatch)
    _without_the_pass(monkeypatch)
    without = _compile(walks_used_after, args, kwargs, "sm_80", 4, 1, tmp_path / "without", monkeypatch)
    spills_with = assemble(with_pass.asm["ptx"], "sm_80").spill_bytes
    spills_without = assemble(without.asm["ptx"], "sm_80").spill_bytes
    assert spills_with <= spills_without + 64, (spills_with, spills_without)
