"""Stream-K matmul (kernels/matmul_stream_k.py): the plan, the fix-up protocol and the public path.

CPU tier: `plan`'s choices; the kernel in the interpreter (programs run in order, each owner after the
programs it waits for) against float64 for many (programs, split tiles) splits, ragged edges, bias and
activation, the flags left at 0, the same bits on a second run and with the workspace reused (a CUDA
graph's replay); the public matmul taking it (and FUSEDOPS_STREAM_K=0 not); the sm_90a PTX (wgmma fed
by TMA, no spills under ptxas).
GPU tier (`-m cuda`, H200): every wgmma config with one program per SM and several splits at ragged
sizes, the public matmul at shapes whose last wave is partial, a CUDA graph replayed twice.
"""

from __future__ import annotations

from unittest import mock

import pytest
import torch

import fusedops.dsl as dsl
from fusedops.kernels import matmul as mm
from fusedops.kernels import matmul_configs
from fusedops.kernels.matmul_configs import INTERPRETER_CONFIG, WGMMA_CONFIGS
from fusedops.kernels import matmul_stream_k as sk
from fusedops.kernels.device_info import sm_count
from fusedops.dsl.target import assemble, ptxas_available
from helpers import poison
from matmul_helpers import check_gpu as _check_gpu, gpu_operands as _gpu_operands, reference as _reference

CPU = torch.device("cpu")


def _config(block_m=16, block_n=16, block_k=16, group_m=2):
    return matmul_configs._config(block_m, block_n, block_k, 4, 1, group_m=group_m)


def _launch(c, a, b, bias, activation, config, programs, sk_tiles, interpret, epoch=None, workspace=None):
    """matmul_stream_k_kernel over 2-D c, a, b, with a given epoch and workspace when asked."""
    args, options = sk._arguments(c, a, b, bias, activation, config, programs, sk_tiles,
                                  epoch if epoch is not None else sk.new_epoch())
    if workspace is not None:
        args = args[:4] + workspace + args[6:]
    sk.matmul_stream_k_kernel[(programs,)](*args, interpret=interpret, **options)
    return args[4], args[5]


# -- plan ------------------------------------------------------------------------------------------

def test_plan_splits_only_a_partial_last_wave_of_a_long_problem():
    config = _config(16, 16, 16)        # the interpreter plans for sm_count(cpu) = 4 programs
    assert sm_count(CPU) == 4
    waves = sk.MIN_WAVES * 4            # tiles of MIN_WAVES waves
    assert sk.plan(16 * (waves + 2), 16, 16 * 16, config, CPU) == (4, 2)           # + 2 tiles
    assert sk.plan(16 * (waves + 1), 16 * 3, 16 * 32, config, CPU) == (4, 3)       # 3 * (waves + 1) tiles
    assert sk.plan(16 * (waves + 1), 16, 16 * 16, config, CPU) is None             # 1 tile of 16 iterations over 4
    assert sk.plan(16 * waves, 16, 16 * 16, config, CPU) is None                   # whole waves
    assert sk.plan(16 * (waves - 2), 16, 16 * 16, config, CPU) is None             # fewer than MIN_WAVES
    assert sk.plan(16 * (waves + 2), 16, 16 * 7, config, CPU) is None              # 7 < MIN_K_ITERATIONS
    assert sk.plan(16 * (waves + 2) - 3, 16, 16 * 16 - 5, config, CPU) == (4, 2)   # ragged: cdiv counts


# -- the kernel in the interpreter -------------------------------------------------------------------

SPLITS = [  # (M, N, K, programs, sk_tiles): M x N in 16 x 16 tiles, K in 16-deep iterations
    (40, 50, 100, 3, 5),        # 12 tiles, ranges of 11-12 iterations over 7-iteration tiles
    (40, 50, 100, 7, 12),       # every tile split, most over 2-3 programs
    (33, 17, 7, 4, 4),          # 1 iteration per tile: no tile split
    (40, 50, 100, 7, 1),        # one split tile of 7 iterations over 7 programs
    (64, 64, 160, 5, 16),       # all 16 tiles split, 32 iterations per program
    (64, 64, 160, 5, 0),        # nothing split: the data-parallel loop alone
    (64, 64, 160, 16, 16),      # as many programs as tiles: ranges of one tile each (no fix-up)
    (1, 1, 300, 3, 1),          # one tile, its 19 iterations split three ways
]


@pytest.mark.parametrize("m,n,k,programs,sk_tiles", SPLITS)
def test_interpreted_splits_match_float64(m, n, k, programs, sk_tiles, seed):
    generator = torch.Generator().manual_seed(seed)
    a, b = torch.randn(m, k, generator=generator), torch.randn(k, n, generator=generator)
    c = poison(torch.empty(m, n))
    flags = torch.zeros(programs, dtype=torch.int64)
    _launch(c, a, b, None, None, _config(), programs, sk_tiles, True, workspace=(poison(torch.empty(2 * programs, 256)),
                                                                                 flags))
    torch.testing.assert_close(c.double(), _reference(a, b), rtol=1e-5, atol=1e-4)
    assert flags.tolist() == [0] * programs     # every handed-over flag reset by its owner


@pytest.mark.parametrize("programs,sk_tiles", [(9, 1), (4, 13), (4, -1)])
def test_splits_that_would_leave_a_program_nothing_or_overrun_are_refused(programs, sk_tiles):
    # 1 split tile of 7 iterations over 9 programs: 2 programs with empty ranges, whose owners would wait
    # forever (the H200 hung on it before the check); 13 > 12 tiles; a negative count.
    a, b, c = torch.zeros(40, 100), torch.zeros(100, 50), torch.zeros(40, 50)
    with pytest.raises(ValueError, match="sk_tiles"):
        _launch(c, a, b, None, None, _config(), programs, sk_tiles, True)


def test_interpreted_bias_activation_fp16_and_same_bits_on_replay(seed):
    generator = torch.Generator().manual_seed(seed)
    m, n, k, programs, sk_tiles = 45, 70, 230, 5, 9
    a = torch.randn(m, k, generator=generator).half()
    b = (torch.randn(k, n, generator=generator) * k ** -0.5).half()
    bias = torch.randn(n, generator=generator).half()
    config, epoch = _config(), sk.new_epoch()
    first = poison(torch.empty(m, n, dtype=torch.float16))
    workspace = _launch(first, a, b, bias, "relu", config, programs, sk_tiles, True, epoch=epoch)
    torch.testing.assert_close(first.double(), _reference(a, b, bias, "relu"), rtol=2e-3, atol=2e-3)
    # A replay: the same epoch and the same workspace (flags reset, partials stale) give the same bits.
    again = poison(torch.empty(m, n, dtype=torch.float16))
    _launch(again, a, b, bias, "relu", config, programs, sk_tiles, True, epoch=epoch, workspace=workspace)
    assert torch.equal(first, again)


def test_public_matmul_takes_stream_k_where_planned_and_not_when_off(monkeypatch, seed):
    generator = torch.Generator().manual_seed(seed)
    m, n, k = 16 * 50, 48, 320      # TMA-describable fp16; INTERPRETER_CONFIG's 16 x 16 tiles: 150, 2 split
    a = torch.randn(1, m, k, generator=generator).half()
    b = (torch.randn(1, k, n, generator=generator) * k ** -0.5).half()
    assert sk.plan(m, n, k, INTERPRETER_CONFIG, CPU) == (4, 150 % 4)
    for setting, calls in (("1", 1), ("0", 0)):
        monkeypatch.setenv("FUSEDOPS_STREAM_K", setting)
        with mock.patch.object(sk, "launch", wraps=sk.launch) as spy:
            c = mm.matmul(a, b, interpret=True)
        assert spy.call_count == calls
        torch.testing.assert_close(c[0].double(), _reference(a[0], b[0]), rtol=2e-3, atol=2e-3)


# -- PTX ---------------------------------------------------------------------------------------------

@pytest.mark.skipif(not ptxas_available(), reason="ptxas is not on the PATH")
@pytest.mark.parametrize("index", range(len(WGMMA_CONFIGS)))
def test_sm90a_ptx_uses_wgmma_and_tma_without_spills(index, tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    config = WGMMA_CONFIGS[index]
    a, b, c = (torch.empty(4096, 4096, dtype=torch.float16) for _ in range(3))
    args, options = sk._arguments(c, a, b, None, None, config, 132, 116, sk.new_epoch())
    ptx = sk.matmul_stream_k_kernel.compile(*args, target="sm_90a", **options).asm["ptx"]
    assert "wgmma.mma_async" in ptx and "cp.async.bulk.tensor" in ptx and "bar.sync" in ptx
    assert "atom.global.exch.b64" in ptx        # the flags
    result = assemble(ptx, "sm_90a")
    assert result.spill_bytes == 0, f"{config}: {result.registers} registers, {result.spill_bytes} bytes spilled"


# -- GPU tier ----------------------------------------------------------------------------------------

@pytest.mark.cuda
@pytest.mark.parametrize("index", range(len(WGMMA_CONFIGS)))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gpu_every_config_and_split(index, dtype, seed):
    config = WGMMA_CONFIGS[index]
    programs = sm_count(torch.device("cuda"))
    m, n, k = 2000, 1040, 1000     # ragged in M and K; 16 x 5..9 tiles of 128 or 256
    a, b = _gpu_operands(m, n, k, dtype, seed)
    tiles = dsl.cdiv(m, config.constexprs["BLOCK_M"]) * dsl.cdiv(n, config.constexprs["BLOCK_N"])
    bias = torch.randn(n, device="cuda", dtype=dtype)
    fewest = dsl.cdiv(programs, dsl.cdiv(k, config.constexprs["BLOCK_K"]))      # a K iteration per program
    for sk_tiles in sorted({fewest, tiles // 3, tiles - 1, tiles}):
        c = poison(torch.empty(m, n, device="cuda", dtype=dtype))
        partial, _ = sk.workspace(c.device, config, programs)
        flags = torch.zeros(programs, dtype=torch.int64, device="cuda")
        _launch(c, a, b, bias, "relu", config, programs, sk_tiles, False, workspace=(poison(partial), flags))
        _check_gpu(c, a, b, bias, "relu")
        assert int(flags.abs().sum()) == 0      # every handed-over flag reset by its owner
        again = poison(torch.empty_like(c))
        _launch(again, a, b, bias, "relu", config, programs, sk_tiles, False)
        assert torch.equal(c, again)        # the fix-up adds in a fixed order: the same bits


@pytest.mark.cuda
@pytest.mark.parametrize("m,n,k", [(4096, 4096, 1024), (8192, 8192, 1024), (8320, 8192, 2048)], ids=str)
def test_gpu_public_matmul_with_a_partial_last_wave(m, n, k, seed, monkeypatch):
    import fusedops
    monkeypatch.setenv("FUSEDOPS_PERSISTENT", "0")      # the persistent kernel goes first where it runs
    a, b = _gpu_operands(m, n, k, torch.float16, seed)
    c = fusedops.matmul(a, b)           # autotunes
    chosen = mm.tuned_matmul_tma_kernel.best[mm.tuned_matmul_tma_kernel.key_of((a, a, b, a, m, n, k), {})]
    with mock.patch.object(sk, "launch", wraps=sk.launch) as launched:
        again = mm.matmul(a[None], b[None])[0]
    assert launched.call_count == (sk.plan(m, n, k, chosen, a.device) is not None)
    _check_gpu(c, a, b)
    assert torch.equal(c, again)


@pytest.mark.cuda
def test_gpu_cuda_graph_replays_the_fix_up(seed):
    config = WGMMA_CONFIGS[0]
    programs = sm_count(torch.device("cuda"))
    a, b = _gpu_operands(1536, 2048, 2048, torch.float16, seed)
    c = torch.empty(1536, 2048, device="cuda", dtype=torch.float16)
    run = sk.prepare(c, a, b, None, None, config, programs, 40)
    run(c, a, b, None)      # compile and load outside the capture
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        run(c, a, b, None)
    torch.cuda.current_stream().wait_stream(stream)
    for _ in range(2):
        c.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        _check_gpu(c, a, b)
