"""Review session 7 (b): stream-K matmul (kernels/matmul_stream_k.py) and the compiled `for` loop,
atomics' old values and dsl.barrier() (commit a572ca2). CPU only.

Bugs found (fixed in session 8; the tests below now pass):
- FUSEDOPS_STREAM_K is not part of the key under which the public matmul (autograd/matmul.py
  `_product`) caches its prepared launches (the key has FUSEDOPS_TMA only), so on the GPU a shape seen
  once keeps its stream-K (or data-parallel) launch whatever the knob says afterwards, although knobs.py
  says the library matmul asks the knob on every call and the module docstring gives FUSEDOPS_STREAM_K=0
  as the escape hatch for processes with fewer SMs than the device (where the persistent grid may hang).
- `_arguments` accepts sk_tiles > 0 with K == 0 (sk_tiles * k_iters == 0 passes the check): every
  range is empty, so the split tiles are never written (C keeps its old contents instead of
  activation(bias)).
- `for i in range(u, 0, -1)` with a uint32 `u`: the literal step is converted to uint32 (4294967295,
  C's promotion), the loop is a forward loop and runs 0 times in the interpreter and compiled, where
  Python runs u times (frontend/loops.py `_range_bounds` says literals that do not fit widen the type).

The compiled loop's behaviour is checked by JIT-compiling the kernel's optimized LLVM IR (sm_90a) for the
host with llvmlite (single-thread kernels whose IR uses no NVVM intrinsics).
"""

from __future__ import annotations

import re
from unittest import mock

import pytest
import torch

import fusedops.dsl as dsl
from fusedops.kernels import matmul as mm
from fusedops.kernels.matmul_configs import INTERPRETER_CONFIG
from fusedops.kernels import matmul_stream_k as sk
from fusedops.dsl.target import assemble, ptxas_available
from helpers import poison
from host_jit import run_on_host
from test_matmul_stream_k import _config, _reference

CPU = torch.device("cpu")


# -- helpers -----------------------------------------------------------------------------------------

def _launch(c, a, b, bias, activation, config, programs, sk_tiles, flags=None):
    args, options = sk._arguments(c, a, b, bias, activation, config, programs, sk_tiles, sk.new_epoch())
    if flags is not None:
        args = args[:5] + (flags,) + args[6:]
    sk.matmul_stream_k_kernel[(programs,)](*args, interpret=True, **options)
    return args[5]


def _run_compiled_on_host(kernel, out, *args, **constexprs):
    """Compile `kernel` for sm_90a, JIT its LLVM IR for the host and run it once (one thread)."""
    run_on_host(kernel, out, *args, **constexprs)
    return out


# -- stream-K: edge shapes through the public kernels.matmul (interpreter, 4 programs) -------------------

def _operands(m, n, k, dtype, seed, a_column_major=False, b_column_major=False):
    generator = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=generator)
    b = torch.randn(k, n, generator=generator) * k ** -0.5
    a = (a.t().contiguous().t() if a_column_major else a).to(dtype)
    b = (b.t().contiguous().t() if b_column_major else b).to(dtype)
    return a, b


_PUBLIC_SHAPES = [  # (m, n, k, a column-major, b column-major): all planned for stream-K on 4 "SMs"
    (16 * 49, 16, 512, False, False),    # 49 tiles: a last wave of exactly 1 tile, 32 iterations over 4
    (16 * 49 - 5, 16, 512, False, False),  # ragged M
    (16 * 16 + 3, 16 * 3, 176, False, False),  # 17 x 3 = 51 tiles (3 split of 11 iterations), ragged M
    (16 * 50, 16 * 3 - 7, 256, False, True),     # ragged N (B column-major), 150 tiles (2 split)
    (16 * 50, 16 * 3, 16 * 16 - 9, True, False),  # ragged K (A column-major): K not a multiple of BLOCK_K
]


@pytest.mark.parametrize("m,n,k,a_cm,b_cm", _PUBLIC_SHAPES)
def test_public_matmul_stream_k_edge_shapes(m, n, k, a_cm, b_cm, seed, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_STREAM_K", "1")
    a, b = _operands(m, n, k, torch.float16, seed, a_cm, b_cm)
    assert mm._uses_tma(torch.empty(1, m, n), a[None], b[None])
    assert sk.plan(m, n, k, INTERPRETER_CONFIG, CPU) is not None
    with mock.patch.object(sk, "launch", wraps=sk.launch) as spy:
        c = mm.matmul(a[None], b[None], interpret=True)[0]
    assert spy.call_count == 1
    torch.testing.assert_close(c.double(), _reference(a, b), rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("activation", mm.ACTIVATIONS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_public_matmul_stream_k_bias_every_activation_and_float32_output(activation, dtype, seed, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_STREAM_K", "1")
    m, n, k = 16 * 16 + 3, 48, 176          # 51 tiles, 3 split over 4 programs
    a, b = _operands(m, n, k, dtype, seed)
    bias = torch.randn(n, generator=torch.Generator().manual_seed(seed + 1)).to(dtype)
    for out_dtype, tol in ((None, 2e-2 if dtype == torch.bfloat16 else 3e-3), (torch.float32, 1e-4)):
        with mock.patch.object(sk, "launch", wraps=sk.launch) as spy:
            c = mm.matmul(a[None], b[None], bias, activation, out_dtype, interpret=True)[0]
        assert spy.call_count == 1
        assert c.dtype == (out_dtype or dtype)
        torch.testing.assert_close(c.double(), _reference(a, b, bias, activation), rtol=tol, atol=tol)


def test_stream_k_every_tile_split_ragged_and_flags_reset(seed):
    # sk_tiles == tiles on ragged M, N and K with group_m=3 (a last, smaller row group), bias + silu.
    generator = torch.Generator().manual_seed(seed)
    m, n, k, programs = 53, 37, 131, 5        # 4 x 3 = 12 tiles of 9 iterations
    a, b = torch.randn(m, k, generator=generator), torch.randn(k, n, generator=generator)
    bias = torch.randn(n, generator=generator)
    config = _config(group_m=3)
    for sk_tiles in (12, 11, 1):
        c = poison(torch.empty(m, n))
        flags = torch.zeros(programs, dtype=torch.int64)
        _launch(c, a, b, bias, "silu", config, programs, sk_tiles, flags)
        torch.testing.assert_close(c.double(), _reference(a, b, bias, "silu"), rtol=1e-5, atol=1e-4)
        assert flags.tolist() == [0] * programs


@pytest.mark.parametrize("programs,sk_tiles,k", [(9, 1, 100), (4, 13, 100), (4, -1, 100), (200, 12, 100)])
def test_stream_k_bad_split_error_names_the_limits(programs, sk_tiles, k):
    a, b, c = torch.zeros(40, k), torch.zeros(k, 50), torch.zeros(40, 50)
    with pytest.raises(ValueError) as error:
        _launch(c, a, b, None, None, _config(), programs, sk_tiles)
    message = str(error.value)
    assert f"sk_tiles={sk_tiles}" in message and "12 tiles" in message and f"{programs} programs" in message


def test_stream_k_empty_k_with_split_tiles_writes_bias_or_refuses():
    m, n, programs, sk_tiles = 40, 50, 4, 2        # 12 tiles, the last 2 "split"
    a, b, c = torch.zeros(m, 0), torch.zeros(0, n), poison(torch.empty(m, n))
    bias = torch.arange(n, dtype=torch.float32)
    try:
        _launch(c, a, b, bias, None, _config(), programs, sk_tiles)
    except ValueError:
        return      # refusing the split is fine too
    torch.testing.assert_close(c, bias.expand(m, n))


def test_stream_k_off_or_on_per_call_of_kernels_matmul(monkeypatch, seed):
    m, n, k = 16 * 49, 16, 512
    a, b = _operands(m, n, k, torch.float16, seed)
    results = []
    for setting, calls in (("1", 1), ("0", 0), ("1", 1)):
        monkeypatch.setenv("FUSEDOPS_STREAM_K", setting)
        with mock.patch.object(sk, "launch", wraps=sk.launch) as spy:
            results.append(mm.matmul(a[None], b[None], interpret=True)[0])
        assert spy.call_count == calls
    torch.testing.assert_close(results[0].double(), _reference(a, b), rtol=2e-3, atol=2e-3)
    torch.testing.assert_close(results[1], results[0], rtol=2e-3, atol=2e-3)
    assert torch.equal(results[0], results[2])


# (the launch cache keyed on FUSEDOPS_STREAM_K: tests/test_matmul_persistent.py, with the other kernel knobs)


# -- stream-K: the fix-up protocol, from the code -------------------------------------------------------

def _simulate_protocol(total_tiles, sk_tiles, k_iters, programs):
    """Python model of the kernel's stream-K phase: for every program, the ordered list of events
    ('handover', tile) / ('wait', [programs]) / ('full', tile); as the kernel computes them."""
    total = sk_tiles * k_iters
    starts = [total * p // programs for p in range(programs + 1)]
    events = []
    for pid in range(programs):
        first, end, mine = starts[pid], starts[pid + 1], []
        while end > first:
            local = (end - 1) // k_iters
            tile_start = local * k_iters
            start = max(first, tile_start)
            if end - tile_start < k_iters:
                mine.append(("handover", local))
            elif start > tile_start:
                lowest = pid
                waits = []
                while starts[lowest] > tile_start:
                    lowest -= 1
                    waits.append(lowest)
                mine.append(("wait", waits, local))
            else:
                mine.append(("full", local))
            end = start
        events.append(mine)
    return events


@pytest.mark.parametrize("sk_tiles,k_iters,programs", [(s, k, p) for p in (3, 4, 7, 132) for k in (1, 2, 7, 8, 64)
                                                      for s in (1, 2, 5, 13, 131) if s * k >= p])
def test_stream_k_protocol_waits_only_for_lower_programs_whose_first_act_is_the_hand_over(sk_tiles, k_iters,
                                                                                         programs):
    # Forward progress on a GPU: an owner spins on flags of lower-indexed programs; each of those must set
    # its flag before it could wait for anything (its hand-over is its first segment) and set it only once
    # (one flag per program), and the owners' waits cover exactly the contributors of the tile.
    events = _simulate_protocol(None, sk_tiles, k_iters, programs)
    handed = {}
    for pid, mine in enumerate(events):
        kinds = [e[0] for e in mine]
        assert kinds.count("handover") <= 1 and kinds.count("wait") <= 1
        if "handover" in kinds:
            assert kinds[0] == "handover"
            handed[pid] = mine[0][1]
        if "wait" in kinds:
            assert kinds[-1] == "wait"      # the owner waits last: after its own hand-over, if any
    waited = {}
    for pid, mine in enumerate(events):
        for event in mine:
            if event[0] == "wait":
                assert event[1] and all(q < pid and handed.get(q) == event[2] for q in event[1])
                for q in event[1]:
                    assert q not in waited
                    waited[q] = pid
    assert set(waited) == set(handed)       # every flag set is waited for (and reset) by exactly one owner


# -- change 2: the compiled `for` loop, run on the host --------------------------------------------------

@dsl.jit
def _count_kernel(o_ptr, lb, ub, step):
    count = 0
    first = lb.to(dsl.int64) * 0 - 7
    last = lb.to(dsl.int64) * 0 - 7
    for i in range(lb, ub, step):
        count += 1
        first = dsl.where(count == 1, i.to(dsl.int64), first)
        last = i.to(dsl.int64)
    dsl.store(o_ptr, count.to(dsl.int64))
    dsl.store(o_ptr + 1, first)
    dsl.store(o_ptr + 2, last)


def _python(bounds):
    r = range(*bounds)
    return [len(r), r[0] if r else -7, r[-1] if r else -7]


I32, I64 = 2 ** 31, 2 ** 63
_EDGE_RANGES = [
    (5, 0, -1), (0, 10, 3), (10, 0, -3), (3, 3, 1), (3, 3, -1), (-10, -1, 7), (-5, 7, 5), (7, -5, -5),
    (I32 - 2, I32 - 1, I32 - 1), (-I32 + 1, -I32, -(I32 - 1)), (0, I32 - 1, I32 - 1), (0, I32 - 1, 2 ** 30),
    (I32 - 1, -I32, -(2 ** 30)), (-I32, I32 - 1, 2 ** 30), (-I32, -I32 + 3, 2), (I32 - 1, I32 - 4, -2),
    (I32 - 3, I32 + 5, 3),
    (I64 - 2, I64 - 1, I64 - 1), (-I64 + 1, -I64, -(I64 - 1)), (0, I64 - 1, 2 ** 62), (-I64, I64 - 1, 2 ** 62),
    (I64 - 1, -I64, -(2 ** 62)), (-I64 + 9, -I64, -4), (I64 - 10, I64 - 1, 4),
]


@pytest.mark.parametrize("bounds", _EDGE_RANGES, ids=str)
def test_compiled_loop_follows_python_range_at_the_type_edges(bounds):
    interpreted = torch.zeros(3, dtype=torch.int64)
    _count_kernel[(1,)](interpreted, *bounds, interpret=True)
    compiled = _run_compiled_on_host(_count_kernel, torch.zeros(3, dtype=torch.int64), *bounds)
    assert interpreted.tolist() == compiled.tolist() == _python(bounds)


@dsl.jit
def _typed_loop_kernel(o_ptr, lb, ub, step, MODE: dsl.constexpr):
    count = 0
    first = lb.to(dsl.int64) * 0 - 7
    last = lb.to(dsl.int64) * 0 - 7
    if MODE == "u32":
        lo, hi, st = lb.to(dsl.uint32), ub.to(dsl.uint32), step.to(dsl.uint32)
    elif MODE == "i8":
        lo, hi, st = lb.to(dsl.int8), ub.to(dsl.int8), step.to(dsl.int8)
    elif MODE == "u8":
        lo, hi, st = lb.to(dsl.uint8), ub.to(dsl.uint8), step.to(dsl.uint8)
    elif MODE == "max":           # known non-negative start, known positive step
        lo, hi, st = dsl.maximum(lb, 0), ub, dsl.maximum(step, 1)
    else:                         # "min": a start that may be negative
        lo, hi, st = dsl.minimum(lb, 0), ub, dsl.maximum(step, 1)
    for i in range(lo, hi, st):
        count += 1
        first = dsl.where(count == 1, i.to(dsl.int64), first)
        last = i.to(dsl.int64)
    dsl.store(o_ptr, count.to(dsl.int64))
    dsl.store(o_ptr + 1, first)
    dsl.store(o_ptr + 2, last)


U32 = 2 ** 32
_TYPED = [  # (mode, lb, ub, step as passed (int32), the Python range they mean)
    ("u32", -10, -1, 4, range(U32 - 10, U32 - 1, 4)), ("u32", -2, -1, I32 - 1, range(U32 - 2, U32 - 1, I32 - 1)),
    ("u32", 0, -1, I32 - 1, range(0, U32 - 1, I32 - 1)), ("u32", 5, 2, 1, range(5, 2, 1)),
    ("i8", 120, 127, 5, range(120, 127, 5)), ("i8", -120, -128, -5, range(-120, -128, -5)),
    ("u8", 250, 255, 3, range(250, 255, 3)), ("u8", 0, 255, 200, range(0, 255, 200)),
    ("max", I32 - 10, I32 - 1, I32 - 1, range(I32 - 10, I32 - 1, I32 - 1)), ("max", -3, 10, -2, range(0, 10)),
    ("max", I32 - 10, I32 - 1, 3, range(I32 - 10, I32 - 1, 3)), ("max", 5, -3, 2, range(5, -3, 2)),
    ("min", I32 - 10, I32 - 1, I32 - 1, range(0, I32 - 1, I32 - 1)),
    ("min", -I32 + 1, I32 - 1, 2 ** 30 + 7, range(-I32 + 1, I32 - 1, 2 ** 30 + 7)),
]


@pytest.mark.parametrize("mode,lb,ub,step,expected", _TYPED, ids=str)
def test_compiled_loop_unsigned_narrow_and_known_sign_bounds(mode, lb, ub, step, expected):
    interpreted = torch.zeros(3, dtype=torch.int64)
    _typed_loop_kernel[(1,)](interpreted, lb, ub, step, MODE=mode, interpret=True)
    compiled = _run_compiled_on_host(_typed_loop_kernel, torch.zeros(3, dtype=torch.int64), lb, ub, step, MODE=mode)
    python = [len(expected), expected[0] if expected else -7, expected[-1] if expected else -7]
    assert interpreted.tolist() == compiled.tolist() == python


@dsl.jit
def _constant_loop_kernel(o_ptr, LB: dsl.constexpr, UB: dsl.constexpr, STEP: dsl.constexpr, DT: dsl.constexpr):
    count = 0
    last = 0
    for i in range(dsl.cast(LB, DT), dsl.cast(UB, DT), dsl.cast(STEP, DT)):
        count += 1
        last = i.to(dsl.int64)
    dsl.store(o_ptr, count.to(dsl.int64))
    dsl.store(o_ptr + 1, last)


@pytest.mark.parametrize("lb,ub,step,dtype", [(U32 - 6, U32 - 1, 4, dsl.uint32), (U32 - 6, U32 - 1, I32, dsl.uint32),
                                              (I32 - 6, I32 - 1, 4, dsl.int32), (250, 255, 4, dsl.uint8),
                                              (-120, -128, -4, dsl.int8), (2 ** 64 - 6, 2 ** 64 - 1, 4, dsl.uint64)],
                         ids=str)
def test_compiled_loop_constant_bounds_near_the_top(lb, ub, step, dtype):
    expected = range(lb, ub, step)
    last = expected[-1] - (2 ** 64 if expected[-1] >= I64 else 0)
    interpreted = torch.zeros(2, dtype=torch.int64)
    _constant_loop_kernel[(1,)](interpreted, LB=lb, UB=ub, STEP=step, DT=dtype, interpret=True)
    compiled = _run_compiled_on_host(_constant_loop_kernel, torch.zeros(2, dtype=torch.int64), LB=lb, UB=ub,
                                     STEP=step, DT=dtype)
    assert interpreted.tolist() == compiled.tolist() == [len(expected), last]


def test_zero_step_interpreter_raises_and_compiled_loop_runs_no_iteration():
    # Python's range raises ValueError; the interpreter raises InterpreterError; the compiled loop (which
    # cannot raise) runs no iteration instead of hanging (the saturating add of 0 would never end).
    with pytest.raises(ValueError):
        range(0, 10, 0)
    with pytest.raises(dsl.InterpreterError, match="step is zero"):
        _count_kernel[(1,)](torch.zeros(3, dtype=torch.int64), 0, 10, 0, interpret=True)
    for bounds in ((0, 10, 0), (3, 3_000_000_000, 0), (10, 0, 0)):
        compiled = _run_compiled_on_host(_count_kernel, torch.zeros(3, dtype=torch.int64), *bounds)
        assert compiled.tolist() == [0, -7, -7]


@dsl.jit
def _unsigned_countdown_kernel(o_ptr, n):
    count = 0
    for i in range(n.to(dsl.uint32), 0, -1):
        count += 1
    dsl.store(o_ptr, count)


def test_unsigned_countdown_runs_like_python_or_is_refused():
    out = torch.zeros(1, dtype=torch.int32)
    try:
        _unsigned_countdown_kernel[(1,)](out, 5, interpret=True)
    except dsl.CompilationError:
        return
    assert out.item() == len(range(5, 0, -1)) == 5


@dsl.jit
def _mixed_sign_range_kernel(o_ptr, n, start, step, WIDE: dsl.constexpr):
    count = 0
    bound = n.to(dsl.uint64) if WIDE else n.to(dsl.uint32)
    for i in range(bound, start, step):
        count += 1
    dsl.store(o_ptr, count)


@pytest.mark.parametrize("n, start, step", [(5, 0, -1), (5, -3, -2), (0, 4, 1), (7, 2, -3), (3, -1, 1)])
def test_unsigned_bound_with_signed_runtime_bounds_counts_like_python(n, start, step):
    out = poison(torch.empty(1, dtype=torch.int32))
    _mixed_sign_range_kernel[(1,)](out, n, start, step, WIDE=False, interpret=True)
    assert out.item() == len(range(n, start, step))


def test_uint64_bound_with_signed_bounds_is_refused():
    out = torch.zeros(1, dtype=torch.int32)
    with pytest.raises(dsl.CompilationError, match="uint64"):
        _mixed_sign_range_kernel[(1,)](out, 5, 0, -1, WIDE=True, interpret=True)


# -- change 2: atomics' old values in replicated layouts; dsl.barrier ----------------------------------------

@dsl.jit
def _atomic_old_kernel(target_ptr, out_ptr, KIND: dsl.constexpr, BLOCK: dsl.constexpr):
    i = dsl.arange(0, BLOCK)
    p = target_ptr + i
    v = (i + 3).to(target_ptr.dtype.element)
    if KIND == "add":
        old = dsl.atomic_add(p, v)
    elif KIND == "max":
        old = dsl.atomic_max(p, v)
    elif KIND == "min":
        old = dsl.atomic_min(p, v)
    elif KIND == "and":
        old = dsl.atomic_and(p, v)
    elif KIND == "or":
        old = dsl.atomic_or(p, v)
    elif KIND == "xor":
        old = dsl.atomic_xor(p, v)
    elif KIND == "xchg":
        old = dsl.atomic_xchg(p, v)
    else:
        old = dsl.atomic_cas(p, (i * 10).to(target_ptr.dtype.element), v)
    # every thread stores the reduction and uses the old value as an address: copies must agree
    dsl.store(out_ptr + BLOCK, dsl.sum(old, axis=0))
    dsl.store(out_ptr + (old % BLOCK).to(dsl.int32), old)


_KINDS = ["add", "max", "min", "and", "or", "xor", "xchg", "cas"]


@pytest.mark.parametrize("kind", _KINDS)
@pytest.mark.parametrize("block", [1, 2, 8, 32])
def test_atomic_old_values_interpreted_every_kind(kind, block):
    target = torch.arange(block, dtype=torch.int32) * 10
    out = torch.full((block + 1,), -1, dtype=torch.int32)
    _atomic_old_kernel[(1,)](target, out, KIND=kind, BLOCK=block, num_warps=4, interpret=True)
    old = torch.arange(block, dtype=torch.int32) * 10
    v = torch.arange(block, dtype=torch.int32) + 3
    new = {"add": old + v, "max": torch.maximum(old, v), "min": torch.minimum(old, v), "and": old & v,
           "or": old | v, "xor": old ^ v, "xchg": v, "cas": v}[kind]
    assert target.tolist() == new.tolist()
    assert out[block].item() == int(old.sum())
    expected = torch.full((block,), -1, dtype=torch.int32)
    expected[old % block] = old          # every old value stored at old % block (last writer wins: in order)
    assert out[:block].tolist() == expected.tolist()


@pytest.mark.parametrize("kind", _KINDS)
@pytest.mark.parametrize("block", [1, 8, 256])
def test_atomic_old_values_replicated_layout_ptx(kind, block):
    # Replicated (block < 128 threads): the old value reaches copies through shared memory after the atomic.
    target = torch.zeros(block, dtype=torch.int32)
    compiled = _atomic_old_kernel.compile(target, target, KIND=kind, BLOCK=block, num_warps=4, target="sm_90a")
    llir, ptx = compiled.asm["llir"], compiled.asm["ptx"]
    atom = re.search(r"atom\.[a-z_.]*global", ptx).start()
    assert "bar.sync" in ptx[atom:] and "ld.shared" in ptx[atom:]
    if block >= 128:    # no replication: no exchange of the old values needed (the reduction may use shared)
        assert "atomicrmw" in llir or "cmpxchg" in llir
    if ptxas_available():
        assemble(ptx, "sm_90a")


@dsl.jit
def _barrier_kernel(x_ptr, o_ptr, n, MODE: dsl.constexpr, BLOCK: dsl.constexpr):
    i = dsl.arange(0, BLOCK)
    dsl.store(o_ptr + i, dsl.load(x_ptr + i) * 2)
    if MODE == "if":
        if n > 3:
            dsl.barrier()
    elif MODE == "for":
        for _ in range(n):
            dsl.barrier()
    elif MODE == "while":
        j = 0
        while j < n:
            dsl.barrier()
            j += 1
    else:
        dsl.barrier()
    # read back in another (reversed) arrangement: needs the barrier on the GPU
    y = dsl.load(o_ptr + (BLOCK - 1 - i))
    dsl.store(o_ptr + BLOCK + i, y + 1)


@pytest.mark.parametrize("mode", ["plain", "if", "for", "while"])
def test_barrier_in_control_flow_interpreted_and_assembled(mode):
    block = 64
    x = torch.arange(block, dtype=torch.float32)
    for n in (0, 5):
        out = torch.zeros(2 * block)
        _barrier_kernel[(2,)](x, out, n, MODE=mode, BLOCK=block, interpret=True)
        assert out[:block].tolist() == (2 * x).tolist()
        assert out[block:].tolist() == (2 * x.flip(0) + 1).tolist()
    ptx = _barrier_kernel.compile(x, out, 5, MODE=mode, BLOCK=block, target="sm_90a").asm["ptx"]
    first_store = ptx.index("st.global")
    assert "bar.sync" in ptx[first_store:]
    if ptxas_available():
        assemble(ptx, "sm_90a")


def test_barrier_is_not_dead_code_and_takes_no_arguments():
    @dsl.jit
    def only_barrier(x_ptr):
        dsl.barrier()

    x = torch.zeros(4)
    only_barrier[(1,)](x, interpret=True)
    ptx = only_barrier.compile(x, target="sm_90a").asm["ptx"]
    assert "bar.sync" in ptx

    @dsl.jit
    def bad_barrier(x_ptr):
        dsl.barrier(1)

    with pytest.raises(Exception):
        bad_barrier[(1,)](x, interpret=True)
