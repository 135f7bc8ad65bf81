"""K-loop synchronization of the TMA operand ring (sm_90a) without a CTA barrier per step:
FUSEDOPS_WS=1, per-stage "empty" mbarriers (passes/_pipelining_warp_specialized.py,
`pipeline_with_empty_barriers`).

CPU tier:
  - a simulation of the full/empty mbarrier protocol (PTX ISA mbarrier phases and try_wait.parity),
    run under random interleavings of warps and copy completions, for the schedule the pass emits
    (thread 0 of the consumer warps issues the copies) and for a producer warp (the planned warp
    specialization): no deadlock, every read sees its own fill, no slot refilled while a wgmma
    reads it; trip counts 0, 1, ragged, and several laps of the ring;
  - the pass's IR (two barrier arrays, one arrival per step, no CTA barrier in the loop) and its
    interpreter run against float64 (ragged M/N/K, K smaller than a block, K = 0, 2-4 stages);
  - the sm_90a PTX of the library TMA matmul: no `bar.sync` in the K loop, the arrival and the
    issuer's wait in it, ptxas with no spills for every wgmma config.
GPU tier (`-m cuda`, H200): the library matmul under FUSEDOPS_WS=1 against float64.
"""

from __future__ import annotations

import random
import re

import pytest
import torch

import fusedops.dsl as dsl
from fusedops.dsl.ir import OpCode
from fusedops.dsl.passes.manager import run_pipeline
from fusedops.dsl.passes.pipeline import default_pipeline
from fusedops.dsl.target import assemble, ptxas_available
from fusedops.kernels import matmul as mm
from fusedops.kernels.matmul_configs import WGMMA_CONFIGS
from fusedops.kernels.matmul_kernels import matmul_tma_kernel
from tests.helpers import assert_close, poison, random_tensor
from tests.codegen_helpers import interpret_pipelined_tma_matmul

needs_ptxas = pytest.mark.skipif(not ptxas_available(), reason="ptxas is not on the PATH")


# -- the protocol, simulated -----------------------------------------------------------------------------

class _MBarrier:
    """An mbarrier (PTX ISA 9.7.13.15): a phase completes when its pending arrivals and transaction
    bytes are both zero; then the next phase starts expecting `count` arrivals again."""

    def __init__(self, count: int):
        self.count, self.pending, self.tx, self.phase = count, count, 0, 0

    def arrive(self, expect_tx: int = 0) -> None:
        self.tx += expect_tx
        self.pending -= 1
        self._complete()

    def complete_tx(self, nbytes: int) -> None:
        self.tx -= nbytes
        self._complete()

    def _complete(self) -> None:
        assert self.pending >= 0 and self.tx >= 0, "more arrivals or bytes than the phase expects"
        if self.pending == 0 and self.tx == 0:
            self.phase += 1
            self.pending = self.count

    def try_wait_parity(self, parity: int) -> bool:
        # True for the parity of the completed phase just before the current (incomplete) one.
        return (self.phase & 1) != parity


class _Ring:
    """Shared state of one simulated CTA: the slots, full/empty barriers, copies in flight, and the
    checks (each read sees its fill; no fill lands in a slot a wgmma still reads)."""

    COPIES = 2          # A and B: two copies, two expect_tx arrivals per fill

    def __init__(self, stages: int, trips: int, warps: int):
        self.stages, self.trips, self.warps = stages, trips, warps
        self.full = [_MBarrier(self.COPIES) for _ in range(stages)]
        self.empty = [_MBarrier(warps) for _ in range(stages)]
        self.slot = [None] * stages
        self.in_flight = []                          # (slot, fill) copies not landed yet
        self.reading = [[] for _ in range(warps)]    # per warp: iterations whose wgmma is not retired
        self.consumed = [0] * warps                  # per warp: iterations whose full wait passed

    def issue(self, fill: int) -> None:
        slot = fill % self.stages
        for warp in range(self.warps):
            assert self.consumed[warp] > fill - self.stages, f"fill {fill} before warp {warp} read {fill - self.stages}"
            assert all(k % self.stages != slot for k in self.reading[warp]), f"fill {fill} over a slot being read"
        for _ in range(self.COPIES):
            self.full[slot].arrive(expect_tx=1)
            self.in_flight.append((slot, fill))

    def land(self, rng: random.Random) -> None:
        slot, fill = self.in_flight.pop(rng.randrange(len(self.in_flight)))
        self.slot[slot] = fill
        self.full[slot].complete_tx(1)

    def retire(self, warp: int, keep: int) -> None:
        while len(self.reading[warp]) > keep:
            k = self.reading[warp].pop(0)
            assert self.slot[k % self.stages] == k, f"slot of iteration {k} was overwritten while read"


def _consumer(ring: _Ring, warp: int, lag: int, ahead: int, issues: bool):
    """One warp running the loop the pass emits (yielding a condition wherever it waits). With
    `issues`, thread 0 of this warp issues the prologue and the refills (FUSEDOPS_WS=1)."""
    stages, trips = ring.stages, ring.trips
    if issues:
        for fill in range(ahead):
            if fill < trips:
                ring.issue(fill)
    read, read_phase = 0, 0
    write, write_phase = ahead % stages, (ahead // stages) & 1
    for k in range(trips):
        yield lambda: ring.full[read].try_wait_parity(read_phase)
        assert ring.slot[read] == k, f"iteration {k} read fill {ring.slot[read]}"
        ring.consumed[warp] += 1
        ring.reading[warp].append(k)                  # the wgmma of iteration k, in flight
        ring.retire(warp, lag)                        # wgmma.wait_group lag
        assert write == (k - lag) % stages
        if k >= lag:
            ring.empty[write].arrive()
        if issues:
            waited = write_phase ^ 1
            yield lambda: ring.empty[write].try_wait_parity(waited)
            if k + ahead < trips:
                assert write == (k + ahead) % stages and write_phase == ((k + ahead) // stages) & 1
                ring.issue(k + ahead)
        read, read_phase = (read + 1) % stages, read_phase ^ (read + 1 == stages)
        write, write_phase = (write + 1) % stages, write_phase ^ (write + 1 == stages)
    ring.retire(warp, 0)                              # wgmma_wait {pending = 0} after the loop


def _producer(ring: _Ring):
    """A producer warp (warp specialization): every fill, each after the release it needs."""
    for fill in range(ring.trips):
        slot, parity = fill % ring.stages, ((fill // ring.stages) & 1) ^ 1
        yield lambda: ring.empty[slot].try_wait_parity(parity)
        ring.issue(fill)


def _simulate(stages: int, trips: int, warps: int, lag: int, producer: bool, seed: int) -> None:
    rng = random.Random(seed)
    ring = _Ring(stages, trips, warps)
    ahead = stages - lag
    actors = [_consumer(ring, w, lag, ahead, issues=(w == 0 and not producer)) for w in range(warps)]
    if producer:
        actors.append(_producer(ring))
    waiting = {id(a): (lambda: True) for a in actors}
    while actors:
        runnable = [a for a in actors if waiting[id(a)]()]
        if ring.in_flight and (not runnable or rng.random() < 0.4):
            ring.land(rng)
            continue
        assert runnable, f"deadlock: {len(actors)} actors waiting, no copy in flight"
        actor = rng.choice(runnable)
        try:
            waiting[id(actor)] = next(actor)
        except StopIteration:
            actors.remove(actor)
    assert not ring.in_flight, "copies still in flight after the loop (their barriers are invalidated)"


@pytest.mark.parametrize("producer", [False, True], ids=["issuer_thread", "producer_warp"])
@pytest.mark.parametrize("lag", [0, 1])
@pytest.mark.parametrize("stages", [2, 3, 4, 5])
def test_full_empty_protocol_never_deadlocks_or_races(stages, lag, producer):
    for trips in sorted({0, 1, 2, stages - 1, stages, stages + 1, 2 * stages + 3, 7}):
        for warps in (1, 3):
            for seed in range(6):
                _simulate(stages, trips, warps, lag, producer, seed)


def test_simulation_catches_a_wrong_phase():
    """The checker is not vacuous: an issuer waiting on the wrong parity refills too early."""
    original = _MBarrier.try_wait_parity
    try:
        _MBarrier.try_wait_parity = lambda self, parity: True       # every wait passes at once
        with pytest.raises(AssertionError):
            for seed in range(20):
                _simulate(3, 9, 3, 1, False, seed)
    finally:
        _MBarrier.try_wait_parity = original


# -- the pass ---------------------------------------------------------------------------------------------

def ring_mode(monkeypatch, tmp_path, mode: str):
    """TMA on, FUSEDOPS_WS = `mode`, a fresh compile cache; returns `monkeypatch` (to change them again)."""
    monkeypatch.setenv("FUSEDOPS_TMA", "1")
    monkeypatch.setenv("FUSEDOPS_WS", mode)
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    return monkeypatch


@pytest.fixture
def empty_barriers(monkeypatch, tmp_path):
    return ring_mode(monkeypatch, tmp_path, "1")


def _operand(rows, cols, dtype, transposed, seed):
    if transposed:
        return random_tensor((cols, rows), dtype, seed=seed).t()
    return random_tensor((rows, cols), dtype, seed=seed)


def _tma_operand(rows, cols, dtype, transposed, seed):
    """A CUDA (rows, cols) operand a tensor map can describe: its outer stride padded to a multiple of 16
    elements (ragged sizes such as 1000 would otherwise take the cp.async kernel)."""
    outer, inner = (cols, rows) if transposed else (rows, cols)
    padded = torch.zeros(outer, max(16, -(-inner // 16) * 16), dtype=dtype, device="cuda")
    padded[:, :inner] = random_tensor((outer, inner), dtype, seed=seed).cuda()
    view = padded[:, :inner]
    return view.t() if transposed else view


def _launch_args(m, n, k, dtype=torch.float16, a_t=False, b_t=False, seed=0):
    a, b = _operand(m, k, dtype, a_t, seed), _operand(k, n, dtype, b_t, seed + 1)
    c = poison(torch.empty(1, m, n, dtype=dtype))
    args, constexprs, _ = mm._tma_launch(c, a[None], b[None], None, None)
    return a, b, c, args, constexprs


@pytest.mark.parametrize("num_stages,fills", [(4, 3), (2, 2)])     # one wgmma in flight at 4; none at 2
def test_empty_barrier_schedule(num_stages, fills, empty_barriers):
    _, _, _, args, constexprs = _launch_args(64, 32, 96, b_t=True)
    function = dsl.jit(matmul_tma_kernel.fn).ir(*args, **constexprs, BLOCK_M=64, BLOCK_N=32, BLOCK_K=32, GROUP_M=1)
    run_pipeline(function, default_pipeline(4, "sm_90a", num_stages=num_stages))
    ops = list(function.walk())
    allocs = [op for op in ops if op.opcode == OpCode.LOCAL_ALLOC and op.result.type.tile_shape == (1,)]
    assert [sorted(a.attrs) for a in allocs] == [["mbarrier_arrivals"], ["mbarrier_per_warp"]]
    copies = [op for op in ops if op.opcode == OpCode.TMA_COPY]
    assert len(copies) == 2 * (fills + 1)             # prologue fills + the loop's refill, per operand
    (loop,) = [op for op in ops if op.opcode == OpCode.FOR]
    body = [op.opcode for op in loop.regions[0].ops]
    waits = [op for op in loop.regions[0].ops if op.opcode == OpCode.MBARRIER_WAIT]
    assert [w.attrs for w in waits] == [{"cta_barrier": False}, {"cta_barrier": False, "issuer": True}]
    assert body.index(OpCode.DOT) < body.index(OpCode.MBARRIER_ARRIVE) < body.index(OpCode.TMA_COPY)
    assert waits[0].operands[0] is allocs[0].result and waits[1].operands[0] is allocs[1].result


@pytest.mark.parametrize("m,n,k,num_stages,b_t", [(70, 32, 96, 4, False), (64, 48, 160, 3, True),
                                                  (65, 40, 0, 4, False), (100, 48, 16, 4, True),
                                                  (33, 36, 48, 2, False), (64, 32, 32, 3, False)], ids=str)
def test_empty_barrier_ir_computes_the_same_in_the_interpreter(m, n, k, num_stages, b_t, empty_barriers, seed):
    """The interpreter lands a copy only at the full wait of its slot (NaN poison before): a wrong
    slot, a refill before its read, or a missing fill shows here. Ragged M/N/K, K < BLOCK_K, K = 0."""
    a, b, c, _, _ = _launch_args(m, n, k, b_t=b_t, seed=seed)
    interpret_pipelined_tma_matmul(c, a, b, num_stages, OpCode.MBARRIER_ARRIVE)
    assert_close(c[0], a.double() @ b.double(), torch.float16)


# -- PTX ---------------------------------------------------------------------------------------------------

def _compile(config, dtype=torch.float16, a_t=False, b_t=False, m=304, n=496, k=208):
    _, _, _, args, constexprs = _launch_args(m, n, k, dtype, a_t, b_t)
    return dsl.jit(matmul_tma_kernel.fn).compile(*args, target="sm_90a", num_warps=config.num_warps,
                                                    num_stages=config.num_stages, **constexprs, **config.constexprs)


def k_loop(ptx: str) -> str:
    """The PTX of the K loop: from the block holding the first full wait to the last TMA copy of
    the loop (the one whose barrier address is computed, not a constant offset)."""
    start = ptx.index("mbarrier.try_wait.parity")
    start = ptx.rindex("\n$L__BB", 0, start)
    end = ptx.index("wgmma.wait_group.sync.aligned 0")
    return ptx[start:end]


@needs_ptxas
@pytest.mark.parametrize("config,dtype,a_t,b_t", [(c, torch.float16, False, False) for c in WGMMA_CONFIGS]
                         + [(WGMMA_CONFIGS[0], torch.bfloat16, True, True),
                            (WGMMA_CONFIGS[2], torch.bfloat16, False, True)], ids=str)
def test_empty_barrier_ptx_has_no_cta_barrier_in_the_k_loop(config, dtype, a_t, b_t, empty_barriers):
    ptx = _compile(config, dtype, a_t, b_t).asm["ptx"]
    loop = k_loop(ptx)
    assert "bar.sync" not in loop and "barrier.sync" not in loop
    for needed in ("mbarrier.arrive.shared::cta.b64", "mbarrier.arrive.expect_tx", "cp.async.bulk.tensor.2d",
                   "wgmma.commit_group"):
        assert needed in loop, needed
    # full (everyone), empty (the issuer) per iteration; LLVM may peel the first iteration (it does since the
    # loop lowering of session 7 compares iv < max(ub, 0) unsigned), which the window then also holds
    assert loop.count("mbarrier.try_wait.parity") in (2, 4)
    pending = 1 if config.num_stages >= 3 else 0
    assert f"wgmma.wait_group.sync.aligned {pending};" in loop
    inits = re.findall(r"mbarrier\.init\.shared::cta\.b64 \[%r\d+\], (\d+);", ptx)
    assert sorted(inits) == sorted(["2"] * config.num_stages + [str(config.num_warps)] * config.num_stages)
    result = assemble(ptx, "sm_90a")
    assert result.spill_bytes == 0, result.log


@needs_ptxas
def test_the_knob_is_part_of_the_compile_cache_key(monkeypatch, tmp_path):
    monkeypatch.setenv("FUSEDOPS_TMA", "1")
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    texts = []
    for knob in ("0", "1", "0"):
        monkeypatch.setenv("FUSEDOPS_WS", knob)
        texts.append(_compile(WGMMA_CONFIGS[2]).asm["ptx"])
    assert "bar.sync" in k_loop(texts[0]) and "bar.sync" not in k_loop(texts[1]) and texts[0] == texts[2]


def test_the_knob_rejects_unknown_modes():
    from fusedops.dsl.runtime import knobs
    assert knobs.current({}).ws == 0 and knobs.current({"FUSEDOPS_WS": "1"}).ws == 1
    with pytest.raises(ValueError, match="FUSEDOPS_WS"):
        knobs.current({"FUSEDOPS_WS": "3"})


# -- GPU tier ----------------------------------------------------------------------------------------------

# (M, N, K, A transposed, B transposed): ragged, K below a block and K = 0, several laps of the ring
GPU_TMA_SHAPES = [(1000, 1000, 1000, False, False), (304, 496, 208, True, False), (4096, 4096, 72, False, True),
                  (64, 16, 16, False, False), (130, 260, 0, False, False), (1008, 784, 4096, True, True)]

@pytest.mark.cuda
@pytest.mark.parametrize("config", WGMMA_CONFIGS, ids=str)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("m,n,k,a_t,b_t", GPU_TMA_SHAPES, ids=str)
@pytest.mark.parametrize("mode", ["1", "2"], ids=["empty_barriers", "producer_warp"])
def test_gpu_ring_modes_match_float64(m, n, k, a_t, b_t, dtype, config, mode, monkeypatch, tmp_path, seed):
    ring_mode(monkeypatch, tmp_path, mode)
    check_tma_kernel_against_float64(m, n, k, a_t, b_t, dtype, config, seed)


def check_tma_kernel_against_float64(m, n, k, a_t, b_t, dtype, config, seed) -> None:
    """matmul_tma_kernel under the FUSEDOPS_WS in force, one program per tile, against float64."""
    # A fresh JIT function: the library's keeps the kernels it compiled under the other setting.
    kernel = dsl.jit(matmul_tma_kernel.fn)
    a, b = _tma_operand(m, k, dtype, a_t, seed), _tma_operand(k, n, dtype, b_t, seed + 1)
    c = poison(torch.empty(1, m, n, dtype=dtype, device="cuda"))
    assert mm._uses_tma(c, a[None], b[None])
    args, constexprs, _ = mm._tma_launch(c, a[None], b[None], None, None)
    grid = (dsl.cdiv(m, config.constexprs["BLOCK_M"]) * dsl.cdiv(n, config.constexprs["BLOCK_N"]),)
    kernel[grid](*args, num_warps=config.num_warps, num_stages=config.num_stages, **constexprs, **config.constexprs)
    torch.cuda.synchronize()
    assert_close(c[0], a.double() @ b.double(), dtype)
