"""Thread block clusters (`dsl.cluster_dims`) and TMA multicast (`desc.load(..., multicast=True)`).

CPU tier: the directive's checks, the grid check of every launch path, the interpreter's check that the
programs of a cluster make the same multicast loads, the pipelined IR (shares of boxes or of rows, the
cluster barrier's halves) run in the interpreter, the PTX (`.reqnctapercluster`, `.multicast::cluster`,
`barrier.cluster`) and ptxas. GPU tier: the library's TMA matmul in clusters against float64 at ragged
shapes and both operand orientations, and the grid check on the device.
"""

from __future__ import annotations

import re

import pytest
import torch

import fusedops.dsl as dsl
from fusedops.dsl.ir import OpCode
from fusedops.dsl.runtime.launcher import ClusterLauncher, check_cluster_grid
from fusedops.dsl.target import ptxas_available
from fusedops.kernels import matmul as mm
from fusedops.kernels.matmul_configs import _config, TMA_CLUSTER_CONFIGS, WGMMA_CONFIGS
from fusedops.kernels.matmul_kernels import matmul_tma_kernel

from codegen_helpers import interpret_pipelined_tma_matmul
from helpers import assert_close, poison, random_tensor

needs_ptxas = pytest.mark.skipif(not ptxas_available(), reason="ptxas is not on the PATH")


def _operand(rows, cols, dtype, transposed, seed, device="cpu"):
    """A (rows, cols) operand, row-major or (transposed) a column-major view."""
    if transposed:
        return random_tensor((cols, rows), dtype, device, seed).t()
    return random_tensor((rows, cols), dtype, device, seed)


def _compile(config, dtype=torch.float16, arch="sm_90a", a_t=False, b_t=False, m=512, n=512, k=256):
    a, b = _operand(m, k, dtype, a_t, 0), _operand(k, n, dtype, b_t, 1)
    c = torch.empty(1, m, n, dtype=dtype)
    args, constexprs, _ = mm._tma_launch(c, a[None], b[None], None, None)
    return dsl.jit(matmul_tma_kernel.fn).compile(*args, target=arch, num_warps=config.num_warps,
                                                    num_stages=config.num_stages, **constexprs, **config.constexprs)


# -- the directive -----------------------------------------------------------------------------------------------

@dsl.jit
def _cluster_copy(x_ptr, y_ptr, n, SIZE: dsl.constexpr, OTHER: dsl.constexpr):
    dsl.cluster_dims(SIZE)
    if OTHER > 0:
        dsl.cluster_dims(OTHER)
    offsets = dsl.program_id(0) * 16 + dsl.arange(0, 16)
    dsl.store(y_ptr + offsets, dsl.load(x_ptr + offsets, mask=offsets < n), mask=offsets < n)


@pytest.mark.parametrize("size", [0, 9, -1, 2.0, True, "2"])
def test_cluster_dims_rejects_a_bad_size(size):
    x = torch.zeros(32)
    with pytest.raises(dsl.CompilationError, match="cluster_dims: size must be a constexpr int from 1 to 8"):
        _cluster_copy[(2,)](x, x, 32, size, 0, interpret=True)


def test_cluster_dims_rejects_two_sizes():
    x = torch.zeros(32)
    with pytest.raises(dsl.CompilationError, match=r"kernel `_cluster_copy` asks for different cluster sizes 2 \(at .*test_clusters.py:\d+:\d+\) and 4"):
        _cluster_copy.compile(x, x, 32, target="sm_90a", SIZE=2, OTHER=4)
    _cluster_copy.compile(x, x, 32, target="sm_90a", SIZE=2, OTHER=2)        # the same size twice is one


@pytest.mark.parametrize("size,programs", [(2, 3), (4, 6), (8, 4)])
def test_interpreter_rejects_a_grid_not_made_of_whole_clusters(size, programs):
    x = torch.zeros(16 * programs)
    with pytest.raises(dsl.LaunchError, match=f"clusters of {size} programs .* multiple of {size}, got {programs}"):
        _cluster_copy[(programs,)](x, x, x.numel(), size, 0, interpret=True)


def test_interpreter_runs_whole_clusters(seed):
    x = random_tensor((100,), torch.float32, "cpu", seed)
    y = poison(torch.empty(100))
    _cluster_copy[(8,)](x, y, 100, 4, 0, interpret=True)
    assert torch.equal(x, y)


@pytest.mark.parametrize("arch,clustered", [("sm_90a", True), ("sm_90", True), ("sm_80", False)])
def test_cluster_directive_in_ptx(arch, clustered):
    x = torch.zeros(32)
    compiled = _cluster_copy.compile(x, x, 32, target=arch, SIZE=4, OTHER=0)
    ptx = compiled.asm["ptx"]
    assert (".reqnctapercluster 4, 1, 1" in ptx) == clustered and (".explicitcluster" in ptx) == clustered
    assert compiled.cluster_size == 4            # the grid check holds on every target
    plain = _cluster_copy.compile(x, x, 32, target=arch, SIZE=1, OTHER=0)
    assert "reqnctapercluster" not in plain.asm["ptx"] and plain.cluster_size == 1


def test_cluster_grid_check_on_every_launch_path():
    """Every GPU launch of a cluster kernel goes through ClusterLauncher (cached plans and prepared
    launches call the wrapper's `launch`, which is never inlined)."""
    launched = []

    class _Inner:
        stream_of = staticmethod(lambda device: 0)
        kernel = "inner"

        def launch(self, grid, stream, values):
            launched.append(grid)

    launcher = ClusterLauncher(_Inner(), 2, "k")
    launcher.launch((4, 1, 1), 0, ())
    with pytest.raises(dsl.LaunchError, match=r"`k` runs in clusters of 2 programs .* got 5"):
        launcher.launch((5, 1, 1), 0, ())
    assert launched == [(4, 1, 1)] and launcher.kernel == "inner"
    check_cluster_grid((6,), 3, "k")
    with pytest.raises(dsl.LaunchError, match="multiple of 3, got 7"):
        check_cluster_grid(7, 3, "k")


# -- multicast loads: the interpreter's check ---------------------------------------------------------------------

@dsl.jit
def _multicast_sum(x_ptr, y_ptr, K, ROW_STEP: dsl.constexpr, EXTRA: dsl.constexpr):
    # Every program sums the 16 x 16 box at (pid * ROW_STEP, 0) (the same box for all when ROW_STEP is 0);
    # program 1 of each cluster loads it EXTRA more times (negative: fewer: only program 0 loads).
    dsl.cluster_dims(2)
    pid = dsl.program_id(0)
    desc = dsl.make_tensor_descriptor(x_ptr, (K, K), (K, 1), (16, 16))
    total = dsl.zeros((16,), dsl.float32)
    calls = 1
    if EXTRA > 0:
        calls = dsl.where(pid % 2 == 1, 1 + EXTRA, 1)
    if EXTRA < 0:
        calls = dsl.where(pid % 2 == 1, 0, 1)
    for _ in range(calls):
        total += dsl.sum(desc.load((pid * ROW_STEP, 0), multicast=True), 0)
    dsl.store(y_ptr + pid * 16 + dsl.arange(0, 16), total)


def test_interpreter_multicast_loads_of_one_box(seed):
    x = random_tensor((32, 32), torch.float32, "cpu", seed)
    y = poison(torch.empty(4 * 16))
    _multicast_sum[(4,)](x, y, 32, 0, 0, interpret=True)
    assert_close(y.view(4, 16), x[:16, :16].double().sum(0).expand(4, 16), torch.float32)


@pytest.mark.parametrize("row_step,extra,message", [
    (16, 0, r"loads the box at \(16, 0\) in this program but at \(0, 0\) in rank 0 of its cluster"),
    (0, 2, "runs 2 times in this program but 1 times in rank 0"),
    (0, -1, "runs 0 times in this program but 1 times in rank 0"),
], ids=["other box", "more calls", "fewer calls"])
def test_interpreter_rejects_cluster_programs_loading_differently(row_step, extra, message):
    x = torch.zeros(64, 64)
    with pytest.raises(dsl.InterpreterError, match=message) as caught:
        _multicast_sum[(2,)](x, torch.zeros(32), 64, row_step, extra, interpret=True)
    assert "program_id=(1, 0, 0)" in str(caught.value)


def test_multicast_is_a_constexpr_bool():
    with pytest.raises(dsl.CompilationError, match="multicast must be a constexpr bool, got 1"):
        _bad_multicast[(1,)](torch.zeros(16, 16), interpret=True)


@dsl.jit
def _bad_multicast(x_ptr):
    desc = dsl.make_tensor_descriptor(x_ptr, (16, 16), (16, 1), (16, 16))
    dsl.store(x_ptr + dsl.arange(0, 16), dsl.sum(desc.load((0, 0), multicast=1), 0))


# -- the library matmul in clusters: interpreter and pipelined IR -------------------------------------------------

@pytest.mark.parametrize("cluster", [{"CLUSTER_M": 2}, {"CLUSTER_N": 2}, {"CLUSTER_M": 4}], ids=str)
@pytest.mark.parametrize("m,n,k", [(40, 32, 48), (48, 16, 16), (72, 48, 32), (16, 16, 16)], ids=str)
def test_interpreter_cluster_matmul_matches_float64(m, n, k, cluster, seed):
    """fp16 operands a tensor map can describe: the TMA path's matmul_tma_kernel in clusters (ragged
    clusters past the last row / column of tiles)."""
    a = random_tensor((1, m, k), torch.float16, "cpu", seed)
    b = random_tensor((1, k, n), torch.float16, "cpu", seed + 1)
    c = poison(torch.empty(1, m, n, dtype=torch.float16))
    assert mm._uses_tma(c, a, b)
    config = dsl.Config(dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=4, **cluster), num_warps=4, num_stages=1)
    mm.matmul_into(c, a, b, interpret=True, config=config)
    assert_close(c[0], a[0].double() @ b[0].double(), torch.float16)


@pytest.mark.parametrize("b_t", [False, True])
def test_cluster_config_on_the_cp_async_path_drops_the_cluster(b_t, seed):
    """A cluster config forced on operands the TMA path does not take (a batch of 2) runs matmul_kernel."""
    a = random_tensor((2, 24, 40), torch.float32, "cpu", seed)
    b = _operand(40, 20, torch.float32, b_t, seed + 1)[None].expand(2, 40, 20)
    c = poison(torch.empty(2, 24, 20))
    mm.matmul_into(c, a, b, interpret=True, config=_config(16, 16, 16, 4, 1, group_m=2, cluster_n=2))
    assert_close(c, a.double() @ b.double(), torch.float32)


@pytest.mark.parametrize("cluster,operand,rows", [
    ({"CLUSTER_M": 2}, 1, True),               # B's 32 x 32 tile (one 64-byte box): a share of its rows
    ({"CLUSTER_N": 2}, 0, True),               # A's 64 x 32 tile: a share of its rows
    ({"CLUSTER_M": 2, "BLOCK_N": 128}, 1, False),    # B's 32 x 128 tile (two 128-byte boxes): one box each
], ids=str)
@pytest.mark.parametrize("m,n,k,num_stages", [(70, 104, 96, 4), (64, 48, 160, 3), (130, 40, 40, 4)], ids=str)
def test_pipelined_multicast_ir_computes_the_same_in_the_interpreter(m, n, k, num_stages, cluster, operand, rows,
                                                                     tma_ws0, seed):
    a, b = _operand(m, k, torch.float16, False, seed), _operand(k, n, torch.float16, False, seed + 1)
    c = poison(torch.empty(1, m, n, dtype=torch.float16))
    function = interpret_pipelined_tma_matmul(c, a, b, num_stages, OpCode.TMA_COPY, **cluster)
    assert_close(c[0], a.double() @ b.double(), torch.float16)
    ops = list(function.walk())
    copies = [op for op in ops if op.opcode == OpCode.TMA_COPY]
    assert {op.attrs.get("multicast", 0) for op in copies} == {0, 2}
    shared = [op for op in copies if op.attrs.get("multicast")]
    assert all(op.operands[3] is function.args[1 + operand] for op in shared)      # a_ptr / b_ptr
    assert all(bool(op.attrs.get("multicast_rows")) == rows for op in shared)
    (barriers,) = [op for op in ops if op.opcode == OpCode.LOCAL_ALLOC and "mbarrier_arrivals" in op.attrs]
    assert barriers.attrs.get("cluster_sync")
    halves = [op.attrs["half"] for op in ops if op.opcode == OpCode.CLUSTER_BARRIER]
    assert halves == ["arrive", "arrive", "wait"]          # before the loop, ending each iteration, after it
    (wait,) = [op for op in ops if op.opcode == OpCode.MBARRIER_WAIT]
    assert wait.attrs.get("cluster_wait")


def test_multicast_needs_a_tile_that_splits(tma_ws0, seed):
    """B's 16 x 32 tile (one box of 16 rows) does not split among 4 CTAs (shares of whole 8-row swizzle
    patterns): plain copies, no cluster barrier (the cluster still launches)."""
    a, b = _operand(64, 48, torch.float16, False, seed), _operand(48, 32, torch.float16, False, seed + 1)
    c = poison(torch.empty(1, 64, 32, dtype=torch.float16))
    function = interpret_pipelined_tma_matmul(c, a, b, 3, OpCode.TMA_COPY, BLOCK_K=16, CLUSTER_M=4)
    assert_close(c[0], a.double() @ b.double(), torch.float16)
    ops = list(function.walk())
    assert not any(op.attrs.get("multicast") for op in ops if op.opcode == OpCode.TMA_COPY)
    assert not any(op.opcode == OpCode.CLUSTER_BARRIER for op in ops)


def test_multicast_ring_ignores_empty_barriers(tma_ws0):
    """FUSEDOPS_WS=1's empty mbarriers release a slot within one CTA only: a multicast ring keeps the
    cluster barrier schedule."""
    tma_ws0.setenv("FUSEDOPS_WS", "1")
    ptx = _compile(TMA_CLUSTER_CONFIGS[0]).asm["ptx"]
    assert "barrier.cluster.wait" in ptx and "mbarrier.arrive.shared::cta" not in ptx
    assert "mbarrier.arrive.shared::cta" in _compile(WGMMA_CONFIGS[0]).asm["ptx"]


# -- PTX ---------------------------------------------------------------------------------------------------------

def _multicast_copies(ptx: str) -> list:
    return re.findall(r"cp\.async\.bulk\.tensor\.2d\.shared::cluster\.global\.tile\.mbarrier::complete_tx::bytes"
                      r"\.multicast::cluster \[[^]]+\], \[[^]]+\], \[[^]]+\], %rs\d+;", ptx)


@pytest.mark.parametrize("config,shared_boxes,boxes", [
    (TMA_CLUSTER_CONFIGS[0], 2, {(128, 64), (64, 64)}),    # B: 64 x 256, four 64 x 64 boxes, two per CTA
    (TMA_CLUSTER_CONFIGS[1], 1, {(128, 64), (64, 64)}),    # A: 256 x 64, each CTA 128 rows of the one box
    (TMA_CLUSTER_CONFIGS[2], 2, {(64, 32), (32, 64)}),     # B: 32 x 256 (BLOCK_K 32), two boxes each
], ids=["cluster_m 128x256", "cluster_n 256x128", "cluster_m 64x256x32"])
def test_cluster_matmul_ptx(config, shared_boxes, boxes, tma_ws0):
    compiled = _compile(config)
    ptx = compiled.asm["ptx"]
    assert ".reqnctapercluster 2, 1, 1" in ptx and compiled.cluster_size == 2
    stages = config.num_stages
    # per copy site (the unrolled prologue's and the loop's): this CTA's share, into every CTA of the cluster
    assert len(_multicast_copies(ptx)) == shared_boxes * (stages - 2 + 1)
    assert "%cluster_ctarank" in ptx
    assert ptx.count("barrier.cluster.arrive.relaxed.aligned") == 2
    assert ptx.count("barrier.cluster.arrive.release.aligned") == 1          # after the mbarrier init
    assert ptx.count("barrier.cluster.wait.acquire.aligned") == 3
    assert {param.box for param in compiled.tensor_maps} == boxes


def test_cluster_matmul_ptx_without_tma(monkeypatch, tmp_path):
    """FUSEDOPS_TMA=0: cp.async rings, no multicast, but still clusters (the grid is the same)."""
    monkeypatch.setenv("FUSEDOPS_TMA", "0")
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    ptx = _compile(TMA_CLUSTER_CONFIGS[0]).asm["ptx"]
    assert ".reqnctapercluster 2, 1, 1" in ptx and "multicast" not in ptx and "barrier.cluster" not in ptx


@needs_ptxas
@pytest.mark.parametrize("config", TMA_CLUSTER_CONFIGS, ids=str)
@pytest.mark.parametrize("dtype,a_t,b_t", [(torch.float16, False, False), (torch.bfloat16, True, True),
                                           (torch.float16, False, True)], ids=str)
def test_cluster_matmul_ptx_is_accepted_by_ptxas_without_spills(config, dtype, a_t, b_t, tma_ws0):
    from fusedops.dsl.target import assemble
    result = assemble(_compile(config, dtype, a_t=a_t, b_t=b_t).asm["ptx"], "sm_90a")
    assert result.spill_bytes == 0, result.log


# -- GPU tier ----------------------------------------------------------------------------------------------------

_ORIENTATIONS = [(False, False), (True, False), (False, True), (True, True)]


@pytest.mark.cuda
@pytest.mark.parametrize("config", TMA_CLUSTER_CONFIGS + [_config(128, 256, 64, 8, 4, cluster_n=2),
                                                            _config(128, 128, 64, 4, 4, cluster_m=4)], ids=str)
@pytest.mark.parametrize("a_t,b_t", _ORIENTATIONS, ids=str)
@pytest.mark.parametrize("m,n,k", [(304, 496, 208), (400, 272, 1008), (64, 16, 16), (1008, 784, 4096)], ids=str)
def test_gpu_cluster_matmul_matches_float64(m, n, k, a_t, b_t, config, seed, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_TMA", "1")
    dtype = torch.bfloat16 if a_t != b_t else torch.float16
    a, b = _operand(m, k, dtype, a_t, seed, "cuda"), _operand(k, n, dtype, b_t, seed + 1, "cuda")
    c = poison(torch.empty(1, m, n, dtype=dtype, device="cuda"))
    assert mm._uses_tma(c, a[None], b[None])
    mm.matmul_into(c, a[None], b[None], config=config)
    assert_close(c[0], a.double() @ b.double(), dtype)


@pytest.mark.cuda
def test_gpu_cluster_kernel_grid_check(seed):
    x = random_tensor((96,), torch.float32, "cuda", seed)
    y = poison(torch.empty(96, device="cuda"))
    _cluster_copy[(6,)](x, y, 96, 2, 0)
    assert torch.equal(x, y)
    with pytest.raises(dsl.LaunchError, match="multiple of 4, got 6"):
        _cluster_copy[(6,)](x, y, 96, 4, 0)
    y2 = poison(torch.empty(96, device="cuda"))
    _cluster_copy[(8,)](x, y2, 96, 4, 0)
    assert torch.equal(x, y2)


@pytest.mark.cuda
def test_gpu_cluster_kernel_with_a_multicast_load_outside_a_ring(seed):
    """multicast=True where no TMA ring is built (no dot): an ordinary load, in a cluster launch."""
    x = random_tensor((32, 32), torch.float32, "cuda", seed)
    y = poison(torch.empty(8 * 16, device="cuda"))
    _multicast_sum[(8,)](x, y, 32, 0, 0)
    assert_close(y.view(8, 16), x[:16, :16].double().sum(0).expand(8, 16), torch.float32)
