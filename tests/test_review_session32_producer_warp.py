"""Review of session 32 (41fcc21..f626bc4): FUSEDOPS_WS=2, a producer warp for TMA operand rings.

CPU tier: which loops take the producer warp (pure block math, launch_bounds, a runtime lower bound before the loop
do; a load, atomic, reduction, print or barrier before it, or the loop in an `if` / another loop do not and keep
WS=1's ring; a second ring keeps WS=1's schedule); PTX of crafted kernels (reductions, atomics, a debug barrier, the
store's exchange after the ring; two rings): only ld.param before the split, no `bar.sync 0` after it, every later
barrier `bar.sync 1, 32 * num_warps`, slots released after their wgmma retired (2-5 stages), ptxas; launch_warps and
`.maxntid` through cache round trips between modes; the launcher's CTA size; interpret=True unchanged.
Defects found and fixed in session 32 (the tests below pass now): num_warps=32 (a 1056-thread CTA, the producer
branch folded away: such loops keep WS=1's ring); launch_bounds ignored the extra warp (a kernel with it keeps WS=1's
ring); one extra warp capped every thread at 168 registers (the persistent bias + silu epilogue spilled 768 bytes:
now a producer warpgroup gives its registers to the consumers with setmaxnreg); max_active_clusters asked about
num_warps; the cache's producer_warps was not validated; the interpreter had no rule for `producer_warp`.
GPU tier (`-m cuda`, H200; references checked here in the interpreter): the crafted kernels and the persistent kernel
(transposed, bias + gelu, float32 C) under WS=2 against float64, NaN-poisoned outputs.
"""

from __future__ import annotations

import json
import re
import types

import pytest
import torch

import fusedops.dsl as dsl
from fusedops.dsl.errors import BackendError
from fusedops.dsl.ir import OpCode
from fusedops.dsl.passes.manager import run_pipeline
from fusedops.dsl.passes.pipeline import default_pipeline
from fusedops.dsl.target import assemble, ptxas_available
from fusedops.kernels.matmul_configs import WGMMA_CONFIGS
from fusedops.kernels.matmul_kernels import matmul_tma_kernel
from fusedops.kernels import matmul_persistent as mp
from matmul_helpers import check_gpu, gpu_operands
from tests.codegen_helpers import interpret_pipelined_tma_matmul
from tests.helpers import assert_close, poison
from tests.test_producer_warp import producer_warp  # noqa: F401  (fixture: TMA on, WS=2, a fresh cache)
from tests.test_warp_specialization import _launch_args

needs_ptxas = pytest.mark.skipif(not ptxas_available(), reason="ptxas is not on the PATH")


@dsl.jit
def _ring_epilogue_kernel(c_ptr, rows_ptr, cols_ptr, total_ptr, a_ptr, b_ptr, M, N, K, START,
                          BM: dsl.constexpr, BN: dsl.constexpr, BK: dsl.constexpr, MINB: dsl.constexpr):
    # c = A[:, START:] @ B[START:] (16-bit), its row and column sums and total added atomically. Before the ring
    # loop only register math (which the producer warp runs too, with a warp index outside the layouts).
    if MINB > 0:
        dsl.launch_bounds(MINB)
    pid = dsl.program_id(0)
    tiles_m = dsl.cdiv(M, BM)
    off_m = dsl.multiple_of((pid % tiles_m) * BM, BM)
    off_n = (pid // tiles_m) * BN
    rm = off_m + dsl.arange(0, BM)
    rn = off_n + dsl.arange(0, BN)
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    a_desc = dsl.make_tensor_descriptor(a_ptr, (M, K), (K, 1), (BM, BK))
    b_desc = dsl.make_tensor_descriptor(b_ptr, (K, N), (N, 1), (BK, BN))
    acc = dsl.zeros((BM, BN), dsl.float32)
    for k in range(START, K, BK):                       # a runtime (possibly negative) lower bound
        acc = dsl.dot(a_desc.load((off_m, k)), b_desc.load((k, off_n)), acc)
    dsl.barrier()                                       # a debug barrier after the split
    dsl.atomic_add(rows_ptr + rm, dsl.sum(acc, axis=1), mask=rm < M)
    cols = dsl.sum(acc, axis=0)                         # across warps: scratch and barriers
    dsl.atomic_add(cols_ptr + rn, cols, mask=rn < N)
    dsl.atomic_add(total_ptr, dsl.sum(cols, axis=0))    # a scalar atomic: thread 0, barriers
    dsl.store(c_ptr + rm[:, None] * N + rn[None, :], acc.to(dsl.float16), mask=mask)


@dsl.jit
def _two_rings_kernel(c_ptr, a_ptr, b_ptr, M, N, K, K2, BM: dsl.constexpr, BN: dsl.constexpr, BK: dsl.constexpr):
    # c = A[:, :K] @ B[:K] + A[:, :K2] @ B[:K2]: the first ring may take the producer warp, the second may not
    pid = dsl.program_id(0)
    off_m = (pid % dsl.cdiv(M, BM)) * BM
    off_n = (pid // dsl.cdiv(M, BM)) * BN
    a_desc = dsl.make_tensor_descriptor(a_ptr, (M, K), (K, 1), (BM, BK))
    b_desc = dsl.make_tensor_descriptor(b_ptr, (K, N), (N, 1), (BK, BN))
    acc = dsl.zeros((BM, BN), dsl.float32)
    for k in range(0, K, BK):
        acc = dsl.dot(a_desc.load((off_m, k)), b_desc.load((k, off_n)), acc)
    acc2 = dsl.zeros((BM, BN), dsl.float32)
    for k in range(0, K2, BK):
        acc2 = dsl.dot(a_desc.load((off_m, k)), b_desc.load((k, off_n)), acc2)
    rm, rn = off_m + dsl.arange(0, BM), off_n + dsl.arange(0, BN)
    dsl.store(c_ptr + rm[:, None] * N + rn[None, :], (acc + acc2).to(dsl.float16),
              mask=(rm[:, None] < M) & (rn[None, :] < N))


@dsl.jit
def _prelude_kernel(c_ptr, x_ptr, a_ptr, b_ptr, M, K, FLAG, MODE: dsl.constexpr, BM: dsl.constexpr,
                    BN: dsl.constexpr, BK: dsl.constexpr):
    # c[:, :BN] = FLAG-dependent multiples of A @ B plus `extra`; MODE puts one kind of op before the ring loop,
    # or the loop in an `if` / another loop
    pid = dsl.program_id(0)
    a_desc = dsl.make_tensor_descriptor(a_ptr, (M, K), (K, 1), (BM, BK))
    b_desc = dsl.make_tensor_descriptor(b_ptr, (K, BN), (BN, 1), (BK, BN))
    extra = 0.0
    if MODE == "load":
        extra = dsl.load(x_ptr + pid)
    elif MODE == "atomic":
        dsl.atomic_add(x_ptr + pid, 1.0)
    elif MODE == "reduce":
        extra = dsl.max((dsl.arange(0, BM) * FLAG).to(dsl.float32), axis=0)
    elif MODE == "print":
        dsl.device_print("pid", pid)
    elif MODE == "barrier":
        dsl.barrier()
    acc = dsl.zeros((BM, BN), dsl.float32)
    if MODE == "in_if":
        if FLAG > 0:
            for k in range(0, K, BK):
                acc = dsl.dot(a_desc.load((pid * BM, k)), b_desc.load((k, 0)), acc)
    elif MODE == "in_loop":
        for r in range(0, FLAG):
            for k in range(0, K, BK):
                acc = dsl.dot(a_desc.load((pid * BM, k)), b_desc.load((k, 0)), acc)
    else:
        for k in range(0, K, BK):
            acc = dsl.dot(a_desc.load((pid * BM, k)), b_desc.load((k, 0)), acc)
    rm, rn = pid * BM + dsl.arange(0, BM), dsl.arange(0, BN)
    dsl.store(c_ptr + rm[:, None] * BN + rn[None, :], (acc + extra).to(dsl.float16), mask=rm[:, None] < M)


def _epilogue_args(m=200, n=144, k=528, start=0, device="cpu"):
    a = torch.empty(m, k, dtype=torch.float16, device=device)
    b = torch.empty(k, n, dtype=torch.float16, device=device)
    zeros = [torch.zeros(size, device=device) for size in (m, n, 1)]
    return (torch.empty(m, n, dtype=torch.float16, device=device), *zeros, a, b, m, n, k, start)


def _tiles(nw):
    return dict(BM=64 if nw == 4 else 128, BN=64, BK=64)


def _two_rings_args():
    return (torch.empty(256, 128, dtype=torch.float16), torch.empty(256, 512, dtype=torch.float16),
            torch.empty(512, 128, dtype=torch.float16), 256, 128, 512, 192)


def _pipelined(kernel, args, num_stages=3, num_warps=4, **constexprs):
    function = dsl.jit(kernel.fn).ir(*args, **constexprs)
    run_pipeline(function, default_pipeline(num_warps, "sm_90a", num_stages=num_stages))
    return function


# -- which loops take the producer warp -------------------------------------------------------------------------

FALLBACK_MODES = ["load", "atomic", "reduce", "print", "barrier", "in_if", "in_loop"]


@pytest.mark.parametrize("mode", ["pure"] + FALLBACK_MODES)
def test_eligibility_of_what_comes_before_the_loop(mode, producer_warp):
    """Only register math before a top-level loop gives a producer warp; otherwise FUSEDOPS_WS=1's ring (empty
    barriers, the issuing thread's refill in the loop), and the CTA is not enlarged."""
    a, b = torch.empty(128, 256, dtype=torch.float16), torch.empty(256, 64, dtype=torch.float16)
    args = (torch.empty(128, 64, dtype=torch.float16), torch.empty(4), a, b, 128, 256, 2)
    codes = [op.opcode for op in _pipelined(_prelude_kernel, args, MODE=mode, BM=64, BN=64, BK=64).walk()]
    assert codes.count(OpCode.PRODUCER_WARP) == (mode == "pure")
    assert OpCode.MBARRIER_ARRIVE in codes and OpCode.TMA_COPY in codes
    compiled = dsl.jit(_prelude_kernel.fn).compile(*args, target="sm_90a", num_warps=4, num_stages=3, MODE=mode,
                                                   BM=64, BN=64, BK=64)
    assert compiled.launch_warps == 4 + 4 * (mode == "pure")


def test_runtime_lower_bound_takes_the_producer_and_launch_bounds_does_not(producer_warp):
    """multiple_of and block math before the loop fit; the producer's loop has the consumer loop's own (runtime)
    bounds and step. A kernel with dsl.launch_bounds keeps WS=1's ring (its bounds were meant for num_warps)."""
    bounded = _pipelined(_ring_epilogue_kernel, _epilogue_args(start=-64), MINB=1, **_tiles(4))
    assert OpCode.PRODUCER_WARP not in [op.opcode for op in bounded.walk()]
    function = _pipelined(_ring_epilogue_kernel, _epilogue_args(start=-64), MINB=0, **_tiles(4))
    (producer,) = [op for op in function.body.ops if op.opcode == OpCode.PRODUCER_WARP]
    (inner,) = [op for op in producer.walk() if op.opcode == OpCode.FOR]
    (loop,) = [op for op in function.body.ops if op.opcode == OpCode.FOR]
    assert inner.operands[:3] == loop.operands[:3] and loop.operands[0] is function.args[9]     # START


def test_second_ring_keeps_the_issuing_thread(producer_warp):
    """One producer warp per kernel: the second ring loop is FUSEDOPS_WS=1's (its own refill, empty barriers)."""
    function = _pipelined(_two_rings_kernel, _two_rings_args(), BM=64, BN=64, BK=64)
    top = [op.opcode for op in function.body.ops]
    assert top.count(OpCode.PRODUCER_WARP) == 1 and top.count(OpCode.FOR) == 2
    second = [op for op in function.body.ops if op.opcode == OpCode.FOR][1]
    assert OpCode.TMA_COPY in [op.opcode for op in second.regions[0].ops]


# -- PTX ------------------------------------------------------------------------------------------------------

def _split_checks(compiled, num_warps, full_barriers=3):
    """Before the split (the last `bar.sync 0`) no memory access but ld.param / mbarrier setup; after it no CTA-wide
    barrier, every barrier the consumers' named one; `.maxntid` = the launched CTA."""
    ptx = compiled.asm["ptx"]
    assert compiled.launch_warps == num_warps + 4
    assert re.findall(r"\.maxntid (\d+)", ptx) == [str(32 * (num_warps + 4))]
    assert ptx.count("bar.sync \t0;") == full_barriers
    split = ptx.rindex("bar.sync \t0;")
    before = set(re.findall(r"\b(ld|st|atom|red|cp)\.[\w:.]+", ptx[:split]))
    assert before <= {"ld"} and not re.search(r"\bld\.(?!param)", ptx[:split]), before
    after = re.findall(r"\b(?:bar|barrier)\.[\w.]+[^;]*", ptx[split + len("bar.sync \t0;"):])
    assert after and set(after) == {f"bar.sync \t1, {32 * num_warps}"}, set(after)
    return ptx


@needs_ptxas
@pytest.mark.parametrize("num_warps", [4, 8])
@pytest.mark.parametrize("num_stages", [2, 3, 4, 5])
def test_epilogue_after_the_ring_ptx(num_warps, num_stages, producer_warp):
    """Reductions, atomics, a debug barrier and the store's exchange after the ring: named barriers only; each
    slot released after the wgmma that read it retired (wait_group 0 at 2 stages, 1 with one in flight)."""
    compiled = dsl.jit(_ring_epilogue_kernel.fn).compile(*_epilogue_args(), target="sm_90a", num_warps=num_warps,
                                                         num_stages=num_stages, MINB=0, **_tiles(num_warps))
    ptx = _split_checks(compiled, num_warps)
    second = ptx.index("mbarrier.try_wait.parity", ptx.index("mbarrier.try_wait.parity") + 1)
    start = ptx.rindex("\n$L__BB", 0, second)
    release = ptx[start:ptx.index("mbarrier.arrive.shared::cta.b64", start)]
    pending = 0 if num_stages == 2 else 1
    assert re.findall(r"wgmma\.(?:commit|wait)_group[^;]*", release) == [
        "wgmma.commit_group.sync.aligned", f"wgmma.wait_group.sync.aligned {pending}"]
    result = assemble(ptx, "sm_90a")
    assert result.spill_bytes == 0, result.log


@needs_ptxas
@pytest.mark.parametrize("num_warps", [4, 8])
def test_two_rings_ptx(num_warps, producer_warp):
    """The second ring's allocation, barrier init and dealloc barriers are the consumers' named barrier, its
    empty barriers count num_warps arrivals, its copies are thread 0's."""
    compiled = dsl.jit(_two_rings_kernel.fn).compile(*_two_rings_args(), target="sm_90a", num_warps=num_warps,
                                                     num_stages=3, **_tiles(num_warps))
    ptx = _split_checks(compiled, num_warps)
    inits = re.findall(r"mbarrier\.init\.shared::cta\.b64 \[%r\d+\], (\d+);", ptx)
    assert sorted(inits) == sorted(["2"] * 6 + [str(num_warps)] * 6)
    assert assemble(ptx, "sm_90a").spill_bytes == 0


def test_thirty_two_warps_keep_a_launchable_cta(producer_warp):
    """32 warps leave no room for the producer warpgroup (1024 threads at most): WS=1's ring, its copies issued."""
    _, _, _, args, constexprs = _launch_args(512, 512, 512)
    compiled = dsl.jit(matmul_tma_kernel.fn).compile(*args, target="sm_90a", num_warps=32, num_stages=3,
                                                        **constexprs, BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, GROUP_M=1)
    assert 32 * compiled.launch_warps <= 1024 and "cp.async.bulk.tensor" in compiled.asm["ptx"]


@needs_ptxas
def test_launch_bounds_with_the_extra_warp(producer_warp):
    """launch_bounds(8) with 4 warps: 64 registers; a producer warpgroup would leave 32 (ptxas C7602), so the
    kernel keeps WS=1's ring and its launch size."""
    def assembled():
        compiled = dsl.jit(_ring_epilogue_kernel.fn).compile(*_epilogue_args(), target="sm_90a", num_warps=4,
                                                             num_stages=3, MINB=8, BM=64, BN=64, BK=64)
        return compiled.launch_warps, assemble(compiled.asm["ptx"], "sm_90a")
    producer_warp.setenv("FUSEDOPS_WS", "1")
    try:
        assert assembled()[0] == 4
    except BackendError as error:           # not the defect: the precondition
        pytest.fail(f"WS=1 no longer assembles: {error}")
    producer_warp.setenv("FUSEDOPS_WS", "2")
    assert assembled()[0] == 4


@needs_ptxas
def test_persistent_bias_activation_does_not_spill_more(producer_warp):
    """ptxas sizes a 12-warp CTA's registers at 168 per thread; the consumers take 240 back from the producer
    warpgroup (setmaxnreg): bias + silu spill no more than under WS=0 (one extra warp spilled 768 bytes)."""
    a, c = torch.empty(2048, 2048, dtype=torch.bfloat16), torch.empty(2048, 2048, dtype=torch.bfloat16)
    args, options = mp._arguments(c, a, a, a[0], "silu", WGMMA_CONFIGS[0], 128)     # 128 x 256 x 64, 8 warps
    spills = {}
    for mode in "02":
        producer_warp.setenv("FUSEDOPS_WS", mode)
        compiled = dsl.jit(mp.matmul_persistent_kernel.fn).compile(*args, target="sm_90a", **options)
        spills[compiled.launch_warps] = assemble(compiled.asm["ptx"], "sm_90a").spill_bytes
    if sorted(spills) != [8, 12]:
        pytest.fail(f"launch warps {sorted(spills)}")
    assert spills[12] <= spills[8]


# -- launches and the cache -------------------------------------------------------------------------------------

def _compile_epilogue(kernel=None, num_warps=4):
    kernel = kernel or dsl.jit(_ring_epilogue_kernel.fn)
    return kernel.compile(*_epilogue_args(), target="sm_90a", num_warps=num_warps, num_stages=3, MINB=0,
                          **_tiles(num_warps))


def test_cache_round_trips_keep_the_cta_size(producer_warp):
    """One cache directory, modes 0 2 1 2 0 with fresh JIT functions (entries read back): every kernel launches
    the `.maxntid` its PTX was assembled for; a JIT function keeps its kernel when the knob changes."""
    seen = {}
    for mode in "02120":
        producer_warp.setenv("FUSEDOPS_WS", mode)
        compiled = _compile_epilogue()
        assert f".maxntid {32 * compiled.launch_warps}," in compiled.asm["ptx"]
        assert compiled.launch_warps == 4 + 4 * (mode == "2")
        assert seen.setdefault(mode, compiled.asm["ptx"]) == compiled.asm["ptx"]
    kernel = dsl.jit(_ring_epilogue_kernel.fn)
    first = _compile_epilogue(kernel)
    producer_warp.setenv("FUSEDOPS_WS", "2")
    assert _compile_epilogue(kernel) is first and first.launch_warps == 4


def test_the_driver_launcher_gets_the_launched_warps(producer_warp, monkeypatch):
    """CompiledKernel.launcher sizes the CTA by launch_warps (every launch path, prepared and native, uses it)."""
    from fusedops.dsl.runtime import driver, kernel_launcher, tensor_map
    compiled = _compile_epilogue(num_warps=8)
    seen = []
    monkeypatch.setattr(driver, "load_module", lambda ptx, name, device: "module")
    monkeypatch.setattr(kernel_launcher, "KernelLauncher",
                        lambda kernel, kinds, warps, shared, names: seen.append(warps))
    monkeypatch.setattr(tensor_map, "TensorMapLauncher", lambda launcher, maps: launcher)
    compiled.launcher(0)
    assert seen == [12]


def test_max_active_clusters_asks_about_the_launched_cta(producer_warp, monkeypatch):
    """The occupancy query is about the CTA launched: num_warps and the producer warpgroup."""
    from fusedops.dsl.runtime import driver
    kernel = dsl.jit(_ring_epilogue_kernel.fn)
    compiled = _compile_epilogue(kernel)
    monkeypatch.setattr(kernel, "_lookup", lambda *_: (types.SimpleNamespace(compiled=compiled), None, 0))
    monkeypatch.setattr(compiled, "launcher", lambda device: types.SimpleNamespace(kernel="loaded"))
    seen = []
    monkeypatch.setattr(driver, "max_active_clusters", lambda kernel, warps, shared, cluster: seen.append(warps) or 1)
    args = list(_epilogue_args())
    args[0] = args[0].as_subclass(type("CudaLooking", (torch.Tensor,), {"is_cuda": property(lambda self: True)}))
    kernel.max_active_clusters(*args, num_warps=4, num_stages=3, MINB=0, **_tiles(4))
    assert seen == [compiled.launch_warps] == [8]


@pytest.mark.parametrize("bad", [None, "one", -1, 33])
def test_a_malformed_cached_producer_warps_is_recompiled(bad, producer_warp, tmp_path):
    """A cache entry whose producer_warps is not an int from 0 to 32 is treated as missing: compiled again."""
    assert _compile_epilogue().launch_warps == 8
    (path,) = tmp_path.glob("*/*.json")
    path.write_text(json.dumps(dict(json.loads(path.read_text()), producer_warps=bad)))
    assert _compile_epilogue().launch_warps == 8


# -- the interpreter --------------------------------------------------------------------------------------------

def test_interpret_mode_is_unaffected(producer_warp, seed):
    """interpret=True runs the frontend IR: no pass, no producer warp, the same result."""
    a, b, c, args, constexprs = _launch_args(70, 40, 96, b_t=True, seed=seed)
    kernel = dsl.jit(matmul_tma_kernel.fn)
    kernel[(4,)](*args, **constexprs, BLOCK_M=64, BLOCK_N=32, BLOCK_K=32, GROUP_M=1, num_warps=4, num_stages=3,
                 interpret=True)
    assert_close(c[0], a.double() @ b.double(), torch.float16)


@pytest.mark.parametrize("m,n,k,num_stages", [(70, 32, 160, 3), (64, 48, 160, 2), (65, 40, 0, 4), (100, 48, 16, 4),
                                              (33, 36, 48, 2), (64, 32, 320, 4)], ids=str)
def test_producer_warp_ir_runs_in_the_interpreter(m, n, k, num_stages, producer_warp, seed):
    """WS=2's pipelined IR in the interpreter (the producer's loop first, each full wait landing its slot's oldest
    copy; NaN poison before): a wrong slot, phase or missing fill shows. Ragged M/N/K, K < BLOCK_K, K = 0."""
    a, b, c, _, _ = _launch_args(m, n, k, seed=seed)
    interpret_pipelined_tma_matmul(c, a, b, num_stages, OpCode.PRODUCER_WARP)
    assert_close(c[0], a.double() @ b.double(), torch.float16)


# -- GPU tier ---------------------------------------------------------------------------------------------------

def _check_launched(kernel, args, num_warps, num_stages, **constexprs):
    compiled = kernel.compile(*args, target="sm_90a", num_warps=num_warps, num_stages=num_stages, **constexprs)
    assert compiled.launch_warps == num_warps + 4


@pytest.mark.cuda
@pytest.mark.parametrize("num_warps,num_stages", [(4, 2), (4, 3), (8, 4), (8, 5), (4, 5)], ids=str)
@pytest.mark.parametrize("start", [0, 64, 32, -64, 528, 1000], ids=str)
def test_gpu_ring_then_reductions_and_atomics(start, num_warps, num_stages, producer_warp, seed):
    m, n, k = 200, 144, 528
    c, rows, cols, total, _, _, *scalars = _epilogue_args(m, n, k, start, device="cuda")
    a, b = gpu_operands(m, n, k, torch.float16, seed)
    poison(c)
    kernel = dsl.jit(_ring_epilogue_kernel.fn)
    tiles = _tiles(num_warps)
    grid = (dsl.cdiv(m, tiles["BM"]) * dsl.cdiv(n, tiles["BN"]),)
    args = (c, rows, cols, total, a, b, *scalars)
    kernel[grid](*args, num_warps=num_warps, num_stages=num_stages, MINB=0, **tiles)
    torch.cuda.synchronize()
    _check_launched(kernel, args, num_warps, num_stages, MINB=0, **tiles)
    lo = max(start, 0)
    expected = a[:, lo:].double() @ b[lo:].double()
    assert_close(c, expected, torch.float16)
    assert_close(rows, expected.sum(1), torch.float16)
    assert_close(cols, expected.sum(0), torch.float16)
    assert abs(total.item() - expected.sum().item()) <= 1e-3 * max(1.0, expected.abs().sum().item())


@pytest.mark.cuda
@pytest.mark.parametrize("num_warps", [4, 8])
@pytest.mark.parametrize("k,k2", [(512, 192), (512, 0), (64, 512), (1040, 1040)], ids=str)
def test_gpu_two_rings(k, k2, num_warps, producer_warp, seed):
    """The first ring (producer warp) covers K, the second (thread 0 issuing, named barriers) min(K2, K)."""
    m, n = 300, 208
    a, b = gpu_operands(m, n, k, torch.float16, seed)
    c = poison(torch.empty(m, n, dtype=torch.float16, device="cuda"))
    tiles = _tiles(num_warps)
    kernel = dsl.jit(_two_rings_kernel.fn)
    args = (c, a, b, m, n, k, k2)
    kernel[(dsl.cdiv(m, tiles["BM"]) * dsl.cdiv(n, tiles["BN"]),)](*args, num_warps=num_warps, num_stages=3, **tiles)
    torch.cuda.synchronize()
    _check_launched(kernel, args, num_warps, 3, **tiles)
    k2 = min(k, k2)
    expected = a.double() @ b.double() + a[:, :k2].double() @ b[:k2].double()
    assert_close(c, expected, torch.float16)


@pytest.mark.cuda
@pytest.mark.parametrize("mode", ["pure", "load", "in_if", "in_loop"])
def test_gpu_prelude_modes(mode, producer_warp, seed):
    m, k, flag = 330, 272, 2
    a, b = gpu_operands(m, 64, k, torch.float16, seed)
    x = torch.randn(dsl.cdiv(m, 64), device="cuda")
    c = poison(torch.empty(m, 64, dtype=torch.float16, device="cuda"))
    kernel = dsl.jit(_prelude_kernel.fn)
    kernel[(dsl.cdiv(m, 64),)](c, x, a, b, m, k, flag, MODE=mode, BM=64, BN=64, BK=64, num_warps=4, num_stages=3)
    expected = (a.double() @ b.double()) * (flag if mode == "in_loop" else 1)
    if mode == "load":
        expected = expected + x.double().repeat_interleave(64)[:m, None]
    assert_close(c, expected, torch.float16)


@pytest.mark.cuda
@pytest.mark.parametrize("a_t,b_t", [(True, False), (False, True), (True, True)], ids=str)
@pytest.mark.parametrize("out_dtype", [torch.float16, torch.float32])
def test_gpu_persistent_transposed(a_t, b_t, out_dtype, producer_warp, monkeypatch, seed):
    monkeypatch.setattr(mp, "matmul_persistent_kernel", dsl.jit(mp.matmul_persistent_kernel.fn))
    m, n, k = 2048, 1536, 704                     # 96 tiles of 256 x 128
    a, b = gpu_operands(m, n, k, torch.float16, seed)
    a = a.t().contiguous().t() if a_t else a
    b = b.t().contiguous().t() if b_t else b
    bias = torch.randn(n, device="cuda", dtype=torch.float16)
    for programs in (7, 96):
        c = poison(torch.empty(m, n, device="cuda", dtype=out_dtype))
        mp.launch(c, a, b, bias, "gelu", WGMMA_CONFIGS[1], programs)
        check_gpu(c, a, b, bias, "gelu")
