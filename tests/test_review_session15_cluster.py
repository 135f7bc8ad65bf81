"""Review (session 15) of `dsl.cluster_sum` and the LayerNorm / RMSNorm backward in thread block clusters.

CPU tier: the interpreter's sums (mixed dtypes in one call, int32 wrap-around, branches, nested loops,
`while` conditions, scalar results driving control flow and addresses, a failing program) bitwise against
NumPy adding the programs' values in rank order; the PTX (slot layout of a mixed call, one cluster barrier
per call, alternating buffers in straight code and in loops, ptxas) and the slot region kept ahead of the
other shared-memory users (a wgmma ring, a TMA store's staging); the norms' cluster launches (default
configs at 8200 / 16384 / 24576 / 32768 columns, offset and strided views, forced clusters of 3..8 parts, more
than 8 parts, > 65535 rows, zero and one row, weight-only gradients) against float64.

CPU tier also: a cluster_sum inside a TMA multicast ring (the split cluster barrier's halves still
alternate; the pipelined IR interpreted).

GPU tier (`cuda`): the compiled sums bit for bit against the interpreter, programs that drift apart over
many calls (a race on the alternating buffers would show), a cluster_sum next to a wgmma ring and inside
a multicast ring, and `max_active_clusters`.

The review's four defects were fixed the same session; their tests are under "review fixes".
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import fusedops
import fusedops.dsl as dsl
from fusedops.dsl.target import assemble, ptxas_available
from fusedops.kernels import norm_backward_config
from fusedops.kernels import norm_backward_kernels
from fusedops.kernels import norm_backward_launcher
from fusedops.kernels import norms
from fusedops.kernels.norm_backward_config import BackwardConfig
from fusedops.kernels.norm_forward_config import ForwardConfig

from helpers import assert_close, launch_promptly, poison, random_tensor
from test_cluster_sum_codegen import _compile_sums
from test_norms import (LAYER_NORM, RMS_NORM, _check_with_configs, _compare, _fresh_launch_caches, _inputs,
                        _poisoned_cpu_empty, _reference)


def _rank_order(values: np.ndarray, size: int) -> np.ndarray:
    """Per program (axis 0; clusters of `size` consecutive programs): its cluster's values added in rank
    order, in `values`' dtype (int32 wraps around as on the GPU)."""
    out = np.empty_like(values)
    for first in range(0, len(values), size):
        total = values[first].copy()
        for rank in range(1, size):
            total = np.add(total, values[first + rank])
        out[first:first + size] = total
    return out


# -- interpreter: one call of several dtypes and shapes ---------------------------------------------------------

@dsl.jit
def _mixed(i_out, d_out, f_out, l_out, b_out, i_ptr, d_ptr, f_ptr, l_ptr, b_ptr, SIZE: dsl.constexpr):
    # Program p sums, in one call: an int32 scalar i[p], a float64 (8,) block d[p], a float32 (4, 8) block
    # f[p], an int64 scalar l[p] and an int8 (8,) block b[p] (added in int32).
    dsl.cluster_dims(SIZE)
    p = dsl.program_id(0)
    r = dsl.arange(0, 4)[:, None]
    c = dsl.arange(0, 8)[None, :]
    e = dsl.arange(0, 8)
    si, sd, sf, sl, sb = dsl.cluster_sum(dsl.load(i_ptr + p), dsl.load(d_ptr + p * 8 + e),
                                         dsl.load(f_ptr + p * 32 + r * 8 + c), dsl.load(l_ptr + p),
                                         dsl.load(b_ptr + p * 8 + e))
    dsl.store(i_out + p, si)
    dsl.store(d_out + p * 8 + e, sd)
    dsl.store(f_out + p * 32 + r * 8 + c, sf)
    dsl.store(l_out + p, sl)
    dsl.store(b_out + p * 8 + e, sb)


def _mixed_inputs(programs: int, seed: int, device="cpu"):
    generator = np.random.default_rng(seed)
    i = torch.from_numpy(generator.integers(-2**31, 2**31, (programs,), dtype=np.int32))    # wraps around
    d = torch.from_numpy(generator.standard_normal((programs, 8)))
    f = torch.from_numpy(generator.standard_normal((programs, 4, 8)).astype(np.float32) * 1e3)
    l = torch.from_numpy(generator.integers(-2**62, 2**62, (programs,), dtype=np.int64))
    b = torch.from_numpy(generator.integers(-128, 128, (programs, 8), dtype=np.int8))
    return tuple(t.to(device) for t in (i, d, f, l, b))


def _mixed_outputs(programs: int, device="cpu"):
    return (poison(torch.empty(programs, dtype=torch.int32, device=device)),
            poison(torch.empty(programs, 8, dtype=torch.float64, device=device)),
            poison(torch.empty(programs, 4, 8, device=device)),
            poison(torch.empty(programs, dtype=torch.int64, device=device)),
            poison(torch.empty(programs, 8, dtype=torch.int32, device=device)))


@pytest.mark.parametrize("size", [3, 5, 6, 7])
def test_interpreter_mixed_call_is_the_rank_order_sum(size, seed):
    programs = 2 * size
    inputs = _mixed_inputs(programs, seed)
    outputs = _mixed_outputs(programs)
    _mixed[(programs,)](*outputs, *inputs, size, interpret=True)
    i, d, f, l, b = (t.numpy() for t in inputs)
    expected = (_rank_order(i, size), _rank_order(d, size), _rank_order(f, size), _rank_order(l, size),
                _rank_order(b.astype(np.int32), size))
    for out, exp in zip(outputs, expected):
        np.testing.assert_array_equal(out.numpy(), exp)
    # int8 values are added in int32: sums past 127 do not wrap at 8 bits
    assert np.abs(expected[4]).max() > 127


# -- interpreter: branches, nested loops, a while condition -----------------------------------------------------

@dsl.jit
def _control(out_ptr, x_ptr, n_outer, n_inner, SIZE: dsl.constexpr, BLOCK: dsl.constexpr):
    # Even clusters sum x * 2 + j (one op), odd clusters (-x, 1) (another op, other values) in a nested
    # loop; then every program counts up while the cluster's sum of its counts is under 3 * SIZE.
    dsl.cluster_dims(SIZE)
    pid = dsl.program_id(0)
    offs = dsl.arange(0, BLOCK)
    x = dsl.load(x_ptr + pid * BLOCK + offs)
    acc = dsl.zeros((BLOCK,), dsl.float32)
    count = 0
    for i in range(n_outer):
        for j in range(n_inner):
            if (pid // SIZE) % 2 == 0:
                acc += dsl.cluster_sum(x * 2.0 + j.to(dsl.float32))
            else:
                s, c = dsl.cluster_sum(-x, 1)
                acc += s
                count += c
    while dsl.cluster_sum(count) < 3 * SIZE:
        count += 1
    dsl.store(out_ptr + pid * BLOCK + offs, acc + count.to(dsl.float32))


def _control_reference(x: np.ndarray, size: int, n_outer: int, n_inner: int) -> np.ndarray:
    out = np.empty_like(x)
    for cluster in range(len(x) // size):
        ranks = x[cluster * size:(cluster + 1) * size]
        acc, count = np.zeros(x.shape[1], np.float32), 0
        for _ in range(n_outer):
            for j in range(n_inner):
                terms = ranks * np.float32(2) + np.float32(j) if cluster % 2 == 0 else -ranks
                acc = acc + _rank_order(terms, size)[0]
                count += size if cluster % 2 else 0
        while count * size < 3 * size:
            count += 1
        out[cluster * size:(cluster + 1) * size] = acc + np.float32(count)
    return out


@pytest.mark.parametrize("size", [2, 3, 5])
def test_interpreter_branches_nested_loops_and_while(size, seed):
    programs, block = 4 * size, 16
    x = random_tensor((programs, block), torch.float32, "cpu", seed)
    out = poison(torch.empty(programs, block))
    launch_promptly(lambda: _control[(programs,)](out, x, 2, 3, size, block, interpret=True))
    np.testing.assert_array_equal(out.numpy(), _control_reference(x.numpy(), size, 2, 3))


@dsl.jit
def _scalar_uses(out_ptr, x_ptr, SIZE: dsl.constexpr):
    # An int32 and a float32 scalar sum as a pointer offset, a mask bound, a loop step, a where condition.
    dsl.cluster_dims(SIZE)
    pid = dsl.program_id(0)
    s = dsl.cluster_sum(pid)
    f = dsl.cluster_sum(dsl.load(x_ptr + pid))
    v = dsl.load(x_ptr + s)
    w = dsl.full((4,), f, dsl.float32) + dsl.arange(0, 4).to(dsl.float32) * s.to(dsl.float32)
    m = dsl.load(x_ptr + dsl.arange(0, 4), mask=dsl.arange(0, 4) < s, other=-1.0)
    steps = 0.0
    for _ in range(0, 8, s + 1):
        steps += 1.0
    dsl.store(out_ptr + pid, dsl.sum(w + m, axis=0) + v + steps + dsl.where(s > 1, 10.0, 20.0))


@pytest.mark.parametrize("size", [1, 2, 3])
def test_interpreter_scalar_sums_drive_addresses_and_control_flow(size):
    programs = 2 * size
    x = torch.arange(16, dtype=torch.float32) * 0.5
    out = poison(torch.empty(programs))
    _scalar_uses[(programs,)](out, x, size, interpret=True)
    expected = []
    for p in range(programs):
        first = p // size * size
        s, f = sum(range(first, first + size)), float(x[first:first + size].sum())
        w = np.full(4, f) + np.arange(4) * s
        m = np.where(np.arange(4) < s, x[:4].numpy(), -1.0)
        expected.append((w + m).sum() + float(x[s]) + len(range(0, 8, s + 1)) + (10 if s > 1 else 20))
    np.testing.assert_array_equal(out.numpy(), np.float32(expected))


@dsl.jit
def _asserting(x_ptr, SIZE: dsl.constexpr, FAILING: dsl.constexpr):
    # Program FAILING fails an assertion between two cluster_sums while its peers wait in the second.
    dsl.cluster_dims(SIZE)
    pid = dsl.program_id(0)
    v = dsl.cluster_sum(dsl.load(x_ptr + pid))
    dsl.device_assert(pid != FAILING, "program gave up")
    dsl.store(x_ptr + pid, dsl.cluster_sum(v))


@pytest.mark.parametrize("size,failing", [(2, 1), (3, 0), (5, 7)])
def test_interpreter_failing_assertion_in_a_cluster_raises_it(size, failing):
    x = torch.ones(2 * size)
    with pytest.raises(dsl.InterpreterError, match="program gave up") as caught:
        launch_promptly(lambda: _asserting[(2 * size,)](x, size, failing, interpret=True))
    assert f"program_id=({failing}, 0, 0)" in str(caught.value)
    assert "cluster_sum runs" not in str(caught.value)


# -- PTX --------------------------------------------------------------------------------------------------------

def _compile_mixed(size: int, num_warps: int):
    return _mixed.compile(*_mixed_outputs(2 * size), *_mixed_inputs(2 * size, 0), SIZE=size, target="sm_90a",
                          num_warps=num_warps)


_MIXED_OFFSETS = (0, 8, 72, 200, 208)     # int32, float64 x 8, float32 x 32, int64, int32 x 8: 240 bytes a rank


@pytest.mark.parametrize("size,num_warps", [(2, 1), (3, 4), (5, 16), (7, 2), (8, 8)])
def test_ptx_of_a_mixed_call(size, num_warps):
    """A rank's slot holds each value at its own alignment; after the call's barrier each thread reads every
    rank's slot of each value (buffer 0: the kernel's only call)."""
    compiled = _compile_mixed(size, num_warps)
    ptx = compiled.asm["ptx"]
    assert f".reqnctapercluster {size}, 1, 1" in ptx
    assert compiled.shared_bytes == 2 * size * 240
    assert ptx.count("barrier.cluster.arrive.release.aligned") == 2
    loads = [int(m.group(1) or 0) for m in re.finditer(
        r"ld\.shared\.\w+\s+%\w+, \[(?:%rd\d+|fusedops_shared)(?:\+(\d+))?\]", ptx)]
    assert sorted(loads) == sorted(rank * 240 + offset for rank in range(size) for offset in _MIXED_OFFSETS)
    # every value goes to every CTA: 8 bytes (int64, float64) or 4 bytes (the others) a store
    remote = re.findall(r"st\.shared::cluster\.b(32|64)", ptx)
    assert sum(int(bits) for bits in remote) == size * (3 * 32 + 2 * 64)
    if ptxas_available():
        assert assemble(ptx, "sm_90a").spill_bytes == 0


def test_ptx_int64_slot_stores_are_64_bit():
    """An int64 value goes to each peer as one st.shared::cluster.b64 (the slot stores carry their alignment:
    the module has no data layout, so LLVM's default i64 alignment of 4 split them in two; review fix)."""
    size = 3
    ptx = _compile_mixed(size, 1).asm["ptx"]
    assert len(re.findall(r"st\.shared::cluster\.b64", ptx)) == 2 * size


@dsl.jit
def _three_calls(out_ptr, x_ptr, SIZE: dsl.constexpr, BLOCK: dsl.constexpr):
    dsl.cluster_dims(SIZE)
    offs = dsl.program_id(0) * BLOCK + dsl.arange(0, BLOCK)
    a = dsl.cluster_sum(dsl.load(x_ptr + offs))
    b = dsl.cluster_sum(a * 2.0)
    dsl.store(out_ptr + offs, dsl.cluster_sum(b + 1.0))


def test_ptx_three_calls_alternate_buffers_around_one_barrier_each():
    """Barrier; then per call: the remote stores, a barrier, the loads of this CTA's `size` slots of the
    call's buffer (rank slots of 128 bytes; buffer 1 at 3 x 128 bytes): buffers 0, 1, 0."""
    x = torch.zeros(96)
    ptx = _three_calls.compile(x, x, 3, 32, target="sm_90a", num_warps=1).asm["ptx"]
    events = []
    for line in ptx.splitlines():
        if "barrier.cluster.arrive" in line:
            events.append("barrier")
        elif "st.shared::cluster" in line:
            events.append("remote")
        elif line.strip().startswith("ld.shared"):
            offset = re.search(r"\[%rd\d+(?:\+(\d+))?\]", line)
            events.append(int(offset.group(1) or 0))
    calls = [0, 384, 0]
    expected = ["barrier"]
    for base in calls:
        expected += ["remote"] * 3 + ["barrier"] + [base, base + 128, base + 256]
    assert events == expected


def test_llvm_ir_of_a_call_in_a_loop_selects_the_buffer_by_the_call_parity():
    """_cluster_sums' loop makes one call an iteration: its buffer base alternates between 0 and
    size * rank bytes (3 x 272: 64 + 1 float32, rounded up to 16 bytes)."""
    llir = _compile_sums(3).asm["llir"]
    assert re.search(r"select i1 %[\w.]+, i32 (816, i32 0|0, i32 816)", llir)


# The slot region comes first; a ring or a TMA store's staging follows it: the region adds exactly its bytes.

@dsl.jit
def _ring_and_sum(c_ptr, a_ptr, b_ptr, K, SIZE: dsl.constexpr, BM: dsl.constexpr, BN: dsl.constexpr,
                  BK: dsl.constexpr, IN_LOOP: dsl.constexpr):
    # c[pid] = the cluster's sum of a @ b (+ with IN_LOOP, each K step's cluster sum of acc's column sums)
    dsl.cluster_dims(SIZE)
    pid = dsl.program_id(0)
    rm, rn, rk = dsl.arange(0, BM), dsl.arange(0, BN), dsl.arange(0, BK)
    acc = dsl.zeros((BM, BN), dsl.float32)
    s = dsl.zeros((BN,), dsl.float32)
    for k in range(0, K, BK):
        a = dsl.load(a_ptr + rm[:, None] * K + (k + rk)[None, :])
        b = dsl.load(b_ptr + (k + rk)[:, None] * BN + rn[None, :])
        acc = dsl.dot(a, b, acc)
        if IN_LOOP:
            s += dsl.cluster_sum(dsl.sum(acc, axis=0))
    acc = dsl.cluster_sum(acc)
    dsl.store(c_ptr + pid * BM * BN + rm[:, None] * BN + rn[None, :], acc + s[None, :])


def _ring_reference(a: torch.Tensor, b: torch.Tensor, size: int, in_loop: bool, bk: int = 32) -> torch.Tensor:
    out = (a.double() @ b.double()) * size
    if in_loop:
        for k in range(0, a.shape[1], bk):
            out = out + size * (a[:, :k + bk].double() @ b[:k + bk].double()).sum(0)[None, :]
    return out


@pytest.mark.parametrize("in_loop", [False, True])
def test_slot_region_precedes_a_wgmma_ring(in_loop):
    a, b = torch.empty(64, 256, dtype=torch.float16), torch.empty(256, 64, dtype=torch.float16)

    def shared(size):
        compiled = _ring_and_sum.compile(torch.empty(2 * size, 64, 64), a, b, 256, size, 64, 64, 32, in_loop,
                                         target="sm_90a", num_warps=4, num_stages=3)
        assert "wgmma" in compiled.asm["ptx"]
        if ptxas_available():
            assert assemble(compiled.asm["ptx"], "sm_90a").spill_bytes == 0
        return compiled.shared_bytes

    alone = shared(1)
    for size in (2, 3):
        assert shared(size) - alone == 2 * size * 64 * 64 * 4


@pytest.mark.parametrize("in_loop", [False, True])
def test_interpreter_cluster_sum_next_to_a_dot_loop(in_loop, seed):
    a = random_tensor((64, 128), torch.float16, "cpu", seed)
    b = random_tensor((128, 64), torch.float16, "cpu", seed + 1)
    c = poison(torch.empty(4, 64, 64))
    _ring_and_sum[(4,)](c, a, b, 128, 2, 64, 64, 32, in_loop, interpret=True)
    expected = _ring_reference(a, b, 2, in_loop)
    for program in range(4):
        assert_close(c[program], expected, torch.float32)


@dsl.jit
def _store_and_sum(y_ptr, x_ptr, rows, cols, SIZE: dsl.constexpr, BLOCK_R: dsl.constexpr, BLOCK_C: dsl.constexpr):
    dsl.cluster_dims(SIZE)
    offsets = dsl.arange(0, BLOCK_R)[:, None] * BLOCK_C + dsl.arange(0, BLOCK_C)[None, :]
    tile = dsl.cluster_sum(dsl.load(x_ptr + offsets).to(dsl.float32)).to(dsl.float16)
    y = dsl.make_tensor_descriptor(y_ptr, (rows, cols), (cols, 1), (BLOCK_R, BLOCK_C))
    y.store((dsl.program_id(0) * BLOCK_R, 0), tile)
    dsl.store(x_ptr + offsets, dsl.cluster_sum(tile).to(dsl.float16))


def test_slot_region_precedes_a_tma_store_staging(tma_ws0):
    y, x = torch.empty(256, 64, dtype=torch.float16), torch.empty(64, 64, dtype=torch.float16)

    def compiled(size):
        return _store_and_sum.compile(y, x, 256, 64, size, 64, 64, target="sm_90a")

    alone, clustered = compiled(1), compiled(2)
    assert "cp.async.bulk.tensor.2d.global.shared::cta" in clustered.asm["ptx"]
    assert clustered.asm["ptx"].count("barrier.cluster.arrive.release.aligned") == 3
    assert clustered.shared_bytes - alone.shared_bytes == 2 * 2 * 64 * 64 * 4
    if ptxas_available():
        assert assemble(clustered.asm["ptx"], "sm_90a").spill_bytes == 0


@dsl.jit
def _multicast_ring_and_sum(c_ptr, s_ptr, a_ptr, b_ptr, M, N, K, BM: dsl.constexpr, BN: dsl.constexpr,
                            BK: dsl.constexpr, CM: dsl.constexpr):
    # Clusters of CM programs along M share B's tiles (TMA multicast ring); each K step also sums acc's
    # column sums over the cluster: s[pid] = sum over steps of the cluster's column sums of A[:, :k] @ B[:k].
    dsl.cluster_dims(CM)
    pid = dsl.program_id(0)
    a_desc = dsl.make_tensor_descriptor(a_ptr, (M, K), (K, 1), (BM, BK))
    b_desc = dsl.make_tensor_descriptor(b_ptr, (K, N), (N, 1), (BK, BN))
    acc = dsl.zeros((BM, BN), dsl.float32)
    s = dsl.zeros((BN,), dsl.float32)
    for k0 in range(0, K, BK):
        acc = dsl.dot(a_desc.load((pid * BM, k0)), b_desc.load((k0, 0), multicast=True), acc)
        s += dsl.cluster_sum(dsl.sum(acc, axis=0))
    rm, rn = dsl.arange(0, BM), dsl.arange(0, BN)
    dsl.store(c_ptr + (pid * BM + rm)[:, None] * N + rn[None, :], acc)
    dsl.store(s_ptr + pid * BN + rn, s)


_RING = dict(BM=64, BN=64, BK=32, CM=2)


def _multicast_reference(a, b, bk=32):
    s = torch.zeros(b.shape[1], dtype=torch.float64)
    for k in range(0, a.shape[1], bk):
        s += (a[:, :k + bk].double() @ b[:k + bk].double()).sum(0)
    return a.double() @ b.double(), s


def test_cluster_sum_inside_a_multicast_ring(tma_ws0, seed):
    """The ring's split cluster barrier (arrive before the loop and at each iteration's end, wait at its head
    and after it) and the sum's whole ones still alternate arrive / wait; the pipelined IR computes the
    same in the interpreter."""
    from codegen_helpers import interpret_ir
    from fusedops.dsl.passes.manager import run_pipeline
    from fusedops.dsl.passes.pipeline import default_pipeline

    m, n, k = 128, 64, 128
    a = random_tensor((m, k), torch.float16, "cpu", seed)
    b = random_tensor((k, n), torch.float16, "cpu", seed + 1)
    c, s = poison(torch.empty(m, n)), poison(torch.empty(m // 64, n))
    ptx = _multicast_ring_and_sum.compile(c, s, a, b, m, n, k, target="sm_90a", num_warps=4, num_stages=3,
                                          **_RING).asm["ptx"]
    assert "multicast::cluster" in ptx
    # the kernel's first barrier, the ring's mbarrier init, the sum's: release; the ring's arrivals: relaxed
    assert ptx.count("barrier.cluster.arrive.release.aligned") == 3
    assert ptx.count("barrier.cluster.arrive.relaxed.aligned") == 2
    assert ptx.count("barrier.cluster.wait.acquire.aligned") == 5
    if ptxas_available():
        assert assemble(ptx, "sm_90a").spill_bytes == 0
    function = _multicast_ring_and_sum.ir(c, s, a, b, m, n, k, **_RING)
    run_pipeline(function, default_pipeline(4, "sm_90a", num_stages=3))
    loop = next(op for op in function.walk() if op.opcode.value == "for")
    body = [op.opcode.value for op in loop.regions[0].ops]
    head_wait, cluster_sum = body.index("mbarrier_wait"), body.index("cluster_sum")
    tail_arrive = len(body) - 1 - body[::-1].index("cluster_barrier")
    assert head_wait < cluster_sum < tail_arrive
    interpret_ir(_multicast_ring_and_sum, function, (m // 64, 1), (c, s, a, b, m, n, k), _RING)
    expected_c, expected_s = _multicast_reference(a, b)
    assert_close(c, expected_c, torch.float32)
    for program in range(m // 64):
        assert_close(s[program], expected_s, torch.float32)


# -- norms: the default cluster configs -------------------------------------------------------------------------

def _spy_prepare(monkeypatch, kernel) -> list:
    """Record (grid, constexprs) of every `kernel.prepare`, then prepare as usual."""
    launches = []
    prepare = kernel.prepare

    def spy(grid, *args, **kwargs):
        launches.append((grid, kwargs))
        return prepare(grid, *args, **kwargs)

    monkeypatch.setattr(kernel, "prepare", spy)
    return launches


def _backward_all(op, x, w, b, dy, config=None, input_grad=True):
    subtract_mean = op == LAYER_NORM
    y, mean, rstd = norms.norm_forward(x, w, b, 1e-5, subtract_mean=subtract_mean, interpret=True,
                                       allocate=_poisoned_cpu_empty)
    grads = norms.norm_backward(dy, x, w, mean, rstd, subtract_mean=subtract_mean, input_grad=input_grad,
                                weight_grad=w is not None, bias_grad=b is not None, bias_dtype=x.dtype,
                                config=config, interpret=True, allocate=_poisoned_cpu_empty)
    return (y,) + tuple(grads)


@pytest.mark.parametrize("op", [LAYER_NORM, RMS_NORM])
@pytest.mark.parametrize("shape,dtype", [((2, 24576), torch.bfloat16), ((1, 32768), torch.float16),
                                         ((3, 8200), torch.float16), ((4, 16384), torch.bfloat16)], ids=str)
def test_default_cluster_backward_matches_float64(op, shape, dtype, seed, monkeypatch):
    config = norm_backward_config.backward_config(shape[1], dtype, subtract_mean=op == LAYER_NORM)
    assert config.cluster
    launches = _spy_prepare(monkeypatch, norm_backward_kernels.backward_persistent_kernel)
    x, w, b, dy = _inputs(shape, shape[-1:], dtype, seed, True, op == LAYER_NORM)
    x = x * 3 + 0.25
    actual = _backward_all(op, x, w, b, dy)
    _compare(op, shape[-1:], (actual[0].view(shape),) + actual[1:], _reference(op, x, shape[-1:], w, b, 1e-5, dy),
             dtype)
    ((grid,), options), = launches
    parts = -(-shape[1] // config.block_n)
    assert options["CLUSTER"] == parts > 1 and options["TWO_PASS"] is False
    assert grid % parts == 0


@pytest.mark.parametrize("op", [LAYER_NORM, RMS_NORM])
def test_cluster_backward_of_offset_and_strided_views(op, seed, monkeypatch):
    """Rows starting 1 and 3 elements off 16 bytes, and every other column of 32768 (16384 columns), through
    the public functions and autograd in the interpreter."""
    _fresh_launch_caches(monkeypatch)
    monkeypatch.setenv("FUSEDOPS_INTERPRET", "1")
    launches = _spy_prepare(monkeypatch, norm_backward_kernels.backward_persistent_kernel)
    base = random_tensor((3, 32800), torch.float16, "cpu", seed)
    grad = random_tensor((3, 32800), torch.float16, "cpu", seed + 1)
    w = random_tensor((16384,), torch.float16, "cpu", seed + 2) + 1
    function = fusedops.layer_norm if op == LAYER_NORM else fusedops.rms_norm
    for view in (slice(1, 16385), slice(3, 16387), slice(0, 32768, 2)):
        x, dy = base[:, view], grad[:, view]
        leaf, weight = x.detach().requires_grad_(), w.detach().requires_grad_()
        function(leaf, (16384,), weight, eps=1e-5).backward(dy)
        expected = _reference(op, x, (16384,), w, None, 1e-5, dy)
        assert_close(leaf.grad, expected[1], torch.float16)
        assert_close(weight.grad, expected[2], torch.float16)
    # the two offset views share one prepared launch (same shape and strides; alignment is checked per call)
    assert len(launches) == 2 and all(options["CLUSTER"] > 1 for _, options in launches)


@pytest.mark.parametrize("shape", [(0, 16384), (1, 16384)], ids=str)
def test_cluster_backward_of_zero_and_one_row(shape, seed):
    x, w, b, dy = _inputs(shape, shape[-1:], torch.bfloat16, seed, True, True)
    y, dx, dw, db = _backward_all(LAYER_NORM, x, w, b, dy)
    if shape[0] == 0:
        assert dx.shape == shape and torch.equal(dw, torch.zeros_like(dw)) and torch.equal(db, torch.zeros_like(db))
    else:
        _compare(LAYER_NORM, shape[-1:], (y.view(shape), dx, dw, db),
                 _reference(LAYER_NORM, x, shape[-1:], w, b, 1e-5, dy), torch.bfloat16)


# -- norms: forced small cluster configs ------------------------------------------------------------------------

FORWARD = ForwardConfig(False, 1, 128, 1)


@pytest.mark.parametrize("op", [LAYER_NORM, RMS_NORM])
@pytest.mark.parametrize("dtype,block_rows,block_n,num_warps,n_cols,prefetch,window,parts", [
    (torch.float16, 1, 8, 1, 21, False, False, 3),
    (torch.bfloat16, 2, 8, 2, 37, True, False, 5),
    (torch.float32, 2, 16, 4, 90, True, False, 6),
    (torch.float16, 4, 4, 4, 21, True, True, 5),     # through the split window: 20 positions of whole vectors
                                                     # in 5 parts and the edges (session 42; the aligned
                                                     # window's 21 + 7 positions took 7)
    (torch.float64, 4, 8, 16, 64, True, False, 8),   # (4,) row sums over 512 threads
], ids=str)
def test_forced_cluster_configs_match_float64(op, dtype, block_rows, block_n, num_warps, n_cols, prefetch, window,
                                              parts, seed, monkeypatch):
    launches = _spy_prepare(monkeypatch, norm_backward_kernels.backward_persistent_kernel)
    config = BackwardConfig(False, block_rows, block_n, num_warps, 1, persistent=True, prefetch=prefetch,
                            cluster=True, aligned_window=window)
    for weight, bias in [(True, True), (False, True), (True, False), (False, False)]:
        _check_with_configs(op, (9, n_cols), dtype, seed, FORWARD, config, weight=weight, bias=bias)
    assert len(launches) == 4
    for (grid,), options in launches:
        assert options["CLUSTER"] == parts and options["TWO_PASS"] is False and grid % parts == 0


@pytest.mark.parametrize("op", [LAYER_NORM, RMS_NORM])
def test_more_than_eight_parts_take_the_two_pass_kernel(op, seed, monkeypatch):
    launches = _spy_prepare(monkeypatch, norm_backward_kernels.backward_persistent_kernel)
    config = BackwardConfig(False, 1, 8, 1, 1, persistent=True, cluster=True)
    _check_with_configs(op, (5, 75), torch.float16, seed, FORWARD, config)     # 10 parts
    ((_, options),) = launches
    assert options["CLUSTER"] == 1 and options["TWO_PASS"] is True


@pytest.mark.parametrize("op", [LAYER_NORM, RMS_NORM])
def test_more_than_65535_rows_in_clusters(op, seed, monkeypatch):
    launches = _spy_prepare(monkeypatch, norm_backward_kernels.backward_persistent_kernel)
    config = BackwardConfig(False, 2048, 8, 4, 1, persistent=True, cluster=True, prefetch=True)
    _check_with_configs(op, (65537, 16), torch.float16, seed, ForwardConfig(False, 1024, 16, 4), config)
    assert launches[0][1]["CLUSTER"] == 2


def test_weight_gradients_alone_in_clusters(seed):
    """No dx: the kernel runs in clusters without a cluster_sum."""
    x, w, b, dy = _inputs((6, 30), (30,), torch.float16, seed, True, True)
    config = BackwardConfig(False, 1, 8, 1, 1, persistent=True, cluster=True)
    y, dx, dw, db = _backward_all(LAYER_NORM, x, w, b, dy, config=config, input_grad=False)
    _, _, expected_dw, expected_db = _reference(LAYER_NORM, x, (30,), w, b, 1e-5, dy)
    assert dx is None
    assert_close(dw, expected_dw, torch.float16)
    assert_close(db, expected_db, torch.float16)


# -- review fixes ----------------------------------------------------------------------------------------------------

def test_forced_cluster_config_without_clusters_takes_the_two_pass_kernel(monkeypatch, seed):
    """A forced cluster config on a device without clusters takes the two-pass persistent kernel, as
    BackwardConfig's docstring says (the launcher replaced it by the default config; review fix)."""
    monkeypatch.setattr(norm_backward_launcher, "_has_clusters", lambda device, interpret: False)
    persistent = _spy_prepare(monkeypatch, norm_backward_kernels.backward_persistent_kernel)
    fused = _spy_prepare(monkeypatch, norm_backward_kernels.backward_fused_kernel)
    config = BackwardConfig(False, 1, 8, 1, 1, persistent=True, cluster=True)
    _check_with_configs(LAYER_NORM, (5, 21), torch.float16, seed, FORWARD, config)    # right either way
    assert not fused
    ((_, options),) = persistent
    assert options["CLUSTER"] == 1 and options["TWO_PASS"] is True and options["BLOCK_N"] == 8


@dsl.jit
def _cluster_copy_sum(out_ptr, x_ptr, SIZE: dsl.constexpr, BLOCK: dsl.constexpr):
    if SIZE > 1:
        dsl.cluster_dims(SIZE)
    offsets = dsl.program_id(0) * BLOCK + dsl.arange(0, BLOCK)
    dsl.store(out_ptr + offsets, dsl.cluster_sum(dsl.load(x_ptr + offsets)))


def test_max_active_clusters_of_cpu_tensors_gives_applicable_advice():
    """max_active_clusters with CPU tensors says it needs CUDA tensors (it gave the launcher's advice to use
    the interpreter, which it does not have; review fix)."""
    x = torch.zeros(8)
    with pytest.raises(ValueError, match="CUDA tensors") as caught:
        _cluster_copy_sum.max_active_clusters(x, x, 2, 4)
    with pytest.raises(TypeError, match="interpret"):
        _cluster_copy_sum.max_active_clusters(x, x, 2, 4, interpret=True)
    assert "interpret=True" not in str(caught.value)


# -- GPU tier ---------------------------------------------------------------------------------------------------

@pytest.mark.cuda
@pytest.mark.parametrize("size", [2, 3, 5, 6, 7, 8])
@pytest.mark.parametrize("num_warps", [1, 4, 16])
def test_gpu_mixed_call_is_the_interpreters_bit_for_bit(size, num_warps, seed):
    programs = 4 * size
    inputs = _mixed_inputs(programs, seed)
    expected = _mixed_outputs(programs)
    _mixed[(programs,)](*expected, *inputs, size, interpret=True)
    outputs = _mixed_outputs(programs, "cuda")
    _mixed[(programs,)](*outputs, *(t.cuda() for t in inputs), size, num_warps=num_warps)
    for out, exp in zip(outputs, expected):
        assert torch.equal(out.cpu(), exp)


@pytest.mark.cuda
@pytest.mark.parametrize("size", [2, 3, 5])
@pytest.mark.parametrize("num_warps", [1, 8])
def test_gpu_branches_nested_loops_and_while_bit_for_bit(size, num_warps, seed):
    programs, block = 4 * size, 16
    x = random_tensor((programs, block), torch.float32, "cpu", seed)
    out = poison(torch.empty(programs, block, device="cuda"))
    _control[(programs,)](out, x.cuda(), 2, 3, size, block, num_warps=num_warps)
    np.testing.assert_array_equal(out.cpu().numpy(), _control_reference(x.numpy(), size, 2, 3))


@dsl.jit
def _drifting(out_ptr, spin_ptr, x_ptr, delay_ptr, n_rounds, SIZE: dsl.constexpr, BLOCK: dsl.constexpr):
    # Round r: program p spins delay[r, p] steps (so the cluster's programs reach each call at different
    # times), then out[r, p] = the cluster's sum of x[r, p].
    dsl.cluster_dims(SIZE)
    pid = dsl.program_id(0)
    n = dsl.num_programs(0)
    offs = dsl.arange(0, BLOCK)
    spin = 0.0
    for r in range(n_rounds):
        for _ in range(dsl.load(delay_ptr + r * n + pid)):
            spin = spin * 0.999 + 1.0
        at = (r * n + pid) * BLOCK + offs
        dsl.store(out_ptr + at, dsl.cluster_sum(dsl.load(x_ptr + at)))
    dsl.store(spin_ptr + pid, spin)


@pytest.mark.cuda
@pytest.mark.parametrize("size", [2, 3, 8])
@pytest.mark.parametrize("num_warps", [1, 8])
def test_gpu_programs_drifting_apart_over_many_calls(size, num_warps, seed):
    """A CTA reaching call c + 1 early must not overwrite slots a slow peer still reads for call c."""
    programs, block, rounds = 16 * size, 256, 200
    generator = torch.Generator().manual_seed(seed)
    x = random_tensor((rounds, programs, block), torch.float32, "cpu", seed)
    delay = torch.randint(0, 3000, (rounds, programs), generator=generator, dtype=torch.int32)
    out = poison(torch.empty(rounds, programs, block, device="cuda"))
    spin = torch.empty(programs, device="cuda")
    _drifting[(programs,)](out, spin, x.cuda(), delay.cuda(), rounds, size, block, num_warps=num_warps)
    expected = np.stack([_rank_order(x[r].numpy(), size) for r in range(rounds)])
    np.testing.assert_array_equal(out.cpu().numpy(), expected)


@pytest.mark.cuda
@pytest.mark.parametrize("in_loop", [False, True])
@pytest.mark.parametrize("size", [2, 4])
def test_gpu_cluster_sum_next_to_a_wgmma_ring(in_loop, size, seed):
    a = random_tensor((64, 256), torch.float16, "cuda", seed)
    b = random_tensor((256, 64), torch.float16, "cuda", seed + 1)
    c = poison(torch.empty(2 * size, 64, 64, device="cuda"))
    _ring_and_sum[(2 * size,)](c, a, b, 256, size, 64, 64, 32, in_loop, num_warps=4, num_stages=3)
    expected = _ring_reference(a.cpu(), b.cpu(), size, in_loop)
    for program in range(2 * size):
        assert_close(c[program], expected, torch.float32)


@pytest.mark.cuda
def test_gpu_max_active_clusters_of_a_cluster_kernel():
    x = torch.zeros(64, device="cuda")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    resident = _cluster_copy_sum.max_active_clusters(x, x, 4, 16, num_warps=1)
    assert 0 < resident <= 32 * sms // 4


@pytest.mark.cuda
def test_gpu_max_active_clusters_of_a_kernel_without_clusters():
    """A kernel without dsl.cluster_dims: the CTAs that fit at once (the query passes the cluster size of
    one; the driver API's docs: without a compiled-in size the config must give one)."""
    x = torch.zeros(64, device="cuda")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    assert _cluster_copy_sum.max_active_clusters(x, x, 1, 16, num_warps=1) >= sms


@pytest.mark.cuda
def test_gpu_cluster_sum_inside_a_multicast_ring(monkeypatch, tmp_path, seed):
    monkeypatch.setenv("FUSEDOPS_TMA", "1")
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    m, n, k = 512, 64, 1024
    a = random_tensor((m, k), torch.float16, "cuda", seed)
    b = random_tensor((k, n), torch.float16, "cuda", seed + 1)
    c, s = poison(torch.empty(m, n, device="cuda")), poison(torch.empty(m // 64, n, device="cuda"))
    _multicast_ring_and_sum[(m // 64,)](c, s, a, b, m, n, k, num_warps=4, num_stages=3, **_RING)
    expected_c, expected_s = _multicast_reference(a.cpu(), b.cpu())
    assert_close(c, expected_c, torch.float32)
    for cluster in range(m // 128):      # each cluster: the column sums of its own 128 rows
        rows = slice(128 * cluster, 128 * (cluster + 1))
        _, expected = _multicast_reference(a.cpu()[rows], b.cpu())
        assert_close(s[2 * cluster], expected, torch.float32)
        assert torch.equal(s[2 * cluster], s[2 * cluster + 1])
