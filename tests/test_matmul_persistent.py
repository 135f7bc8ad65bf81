"""Persistent TMA matmul (kernels/matmul_persistent.py): division by reciprocals, the plan, the kernel, the public path.

CPU tier: `magic_numbers` exact for every dividend below 2**31 at many divisors (and refusing others);
`group_rows`; `plan`; the kernel in the interpreter against float64 at ragged shapes, every program count,
bias and activations, fp16 and float32, transposed operands and a column-major C; bad launches refused;
the public matmul and prepared launches taking it where planned and not under FUSEDOPS_PERSISTENT=0, the
autograd launch cache keyed on the knob; the sm_90a PTX (wgmma fed by TMA, a TMA-store epilogue, no
spills, no wgmma serialization under ptxas; with the store deferred, the store under an in-flight wgmma).
The interpreter and GPU kernel tests run with each tile's store inline and deferred (deferred_store).
GPU tier (`-m cuda`, H200): both 8-warp configs at ragged sizes and program counts, fp16/bf16 in, fp16/bf16/
float32 out, bias and activations, strided and column-major C, the public matmul at shapes of several
waves, a C of more than 2**31 elements.
"""

from __future__ import annotations

import random
import re
from unittest import mock

import pytest
import torch

import fusedops.dsl as dsl
from fusedops.kernels import matmul as mm
from fusedops.kernels import matmul_configs
from fusedops.kernels.matmul_configs import WGMMA_CONFIGS
from fusedops.kernels import matmul_persistent as mp
from fusedops.kernels.device_info import sm_count
from fusedops.dsl.target import assemble, ptxas_available
from helpers import poison
from matmul_helpers import check_gpu as _check_gpu, gpu_operands as _gpu_operands, reference as _reference

CPU = torch.device("cpu")


def _config(block_m=16, block_n=16, block_k=16, group_m=4, num_warps=8):
    return matmul_configs._config(block_m, block_n, block_k, num_warps, 1, group_m=group_m)


# -- division by reciprocals -----------------------------------------------------------------------

def test_magic_numbers_divide_exactly_below_2_to_the_31(seed):
    rng = random.Random(seed)
    divisors = list(range(1, 2049)) + [(1 << e) + d for e in range(11, 31) for d in (-1, 0, 1)]
    divisors += [rng.randrange(1, 1 << 31) for _ in range(3000)] + [(1 << 31) - 1]
    for divisor in divisors:
        magic, shift = mp.magic_numbers(divisor)
        assert 0 < magic < 1 << 32 and (magic * ((1 << 31) - 1)) < 1 << 63, divisor
        top = (1 << 31) - 1
        dividends = {0, 1, divisor - 1, divisor, divisor + 1, top, top - 1, top // divisor * divisor,
                     top // divisor * divisor - 1, rng.randrange(0, 1 << 31), rng.randrange(0, 4 * divisor)}
        for n in dividends:
            if 0 <= n <= top:
                assert (n * magic) >> shift == n // divisor, (n, divisor)


@pytest.mark.parametrize("divisor", [0, -3, 1 << 31, 2.0, True, None])
def test_magic_numbers_refuse_what_they_cannot_divide_by(divisor):
    with pytest.raises(ValueError, match="divisor must be an int from 1 to 2\\*\\*31 - 1"):
        mp.magic_numbers(divisor)


def test_group_rows_divide_the_rows_of_tiles():
    assert [mp.group_rows(t, 8) for t in (1, 2, 3, 4, 6, 8, 12, 16, 32, 33, 40)] == [1, 2, 1, 4, 2, 8, 4, 8, 8, 1, 8]
    assert mp.group_rows(32, 1) == 1 and mp.group_rows(32, 4) == 4


def test_plan_needs_two_waves_and_k():
    config = _config()          # the interpreter plans for sm_count(cpu) = 4 programs
    assert sm_count(CPU) == 4
    assert mp.plan(16 * 8, 16, 64, config, CPU) == 4             # 8 tiles: 2 waves
    assert mp.plan(16 * 7, 16, 64, config, CPU) is None          # 7 tiles
    assert mp.plan(16 * 9, 16, 64, config, CPU) == 3             # 9 tiles: 3 each on 3 programs, as on 4
    assert mp.plan(16 * 13, 16, 64, config, CPU) == 4            # 13 tiles: 4 on the first, 3 on the others
    assert mp.plan(16 * 8, 16, 0, config, CPU) is None           # nothing to multiply: the grid writes the bias


# -- the kernel in the interpreter -------------------------------------------------------------------

@pytest.mark.parametrize("deferred_store", [False, True])
@pytest.mark.parametrize("m, n, k", [(37, 50, 33), (64, 64, 16), (5, 100, 70), (1, 1, 1), (70, 17, 1), (96, 48, 250)])
def test_interpreted_kernel_every_program_count(m, n, k, deferred_store, seed):
    generator = torch.Generator().manual_seed(seed)
    a, b = torch.randn(m, k, generator=generator), torch.randn(k, n, generator=generator)
    config = _config()
    tiles = dsl.cdiv(m, 16) * dsl.cdiv(n, 16)
    for programs in sorted({1, min(2, tiles), min(3, tiles), tiles}):
        c = poison(torch.empty(m, n))
        mp.launch(c, a, b, None, None, config, programs, interpret=True, deferred_store=deferred_store)
        torch.testing.assert_close(c.double(), _reference(a, b), rtol=1e-4, atol=1e-4, msg=f"{programs} programs")


@pytest.mark.parametrize("deferred_store", [False, True])
@pytest.mark.parametrize("activation", mm.ACTIVATIONS)
def test_interpreted_bias_activation_fp16(activation, deferred_store, seed):
    generator = torch.Generator().manual_seed(seed)
    m, n, k = 45, 70, 130
    a = torch.randn(m, k, generator=generator).half()
    b = (torch.randn(k, n, generator=generator) * k ** -0.5).half()
    bias = torch.randn(2 * n, generator=generator).half()[::2]          # strided bias
    c = poison(torch.empty(m, n, dtype=torch.float16))
    mp.launch(c, a, b, bias, activation, _config(group_m=8), 5, interpret=True, deferred_store=deferred_store)
    torch.testing.assert_close(c.double(), _reference(a, b, bias, activation), rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("deferred_store", [False, True])
def test_interpreted_transposed_operands_and_column_major_c(deferred_store, seed):
    generator = torch.Generator().manual_seed(seed)
    m, n, k = 50, 40, 36
    a = torch.randn(k, m, generator=generator).t()           # column-major A
    b = torch.randn(n, k, generator=generator).t()           # column-major B
    c = poison(torch.empty(n, m)).t()                        # column-major C
    mp.launch(c, a, b, None, "relu", _config(), 3, interpret=True, deferred_store=deferred_store)
    torch.testing.assert_close(c.double(), _reference(a, b, None, "relu"), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("programs, k", [(0, 16), (-1, 16), (5, 16), (2, 0)])
def test_launch_refuses_bad_program_counts_and_empty_k(programs, k):
    a, b, c = torch.zeros(32, k), torch.zeros(k, 32), torch.zeros(32, 32)       # 4 tiles of 16 x 16
    with pytest.raises(ValueError, match="programs="):
        mp.launch(c, a, b, None, None, _config(), programs, interpret=True)


# -- the public path --------------------------------------------------------------------------------

def _operands(m, n, k, seed):
    generator = torch.Generator().manual_seed(seed)
    a = torch.randn(1, m, k, generator=generator).half()
    b = (torch.randn(1, k, n, generator=generator) * k ** -0.5).half()
    return a, b


def test_public_matmul_takes_it_where_planned_and_not_when_off(monkeypatch, seed):
    m, n, k = 16 * 9, 32, 48        # TMA-describable fp16; 16 x 16 tiles: 18 tiles, 4.5 waves on 4 programs
    a, b = _operands(m, n, k, seed)
    monkeypatch.setenv("FUSEDOPS_STREAM_K", "0")
    for setting, calls in (("1", 1), ("0", 0)):
        monkeypatch.setenv("FUSEDOPS_PERSISTENT", setting)
        with mock.patch.object(mp, "launch", wraps=mp.launch) as spy:
            c = mm.matmul(a, b, interpret=True, config=_config())
        assert spy.call_count == calls
        torch.testing.assert_close(c[0].double(), _reference(a[0], b[0]), rtol=2e-3, atol=2e-3)
    # 4-warp configs keep one program per tile (they rely on two programs per SM).
    monkeypatch.setenv("FUSEDOPS_PERSISTENT", "1")
    with mock.patch.object(mp, "launch", wraps=mp.launch) as spy:
        mm.matmul(a, b, interpret=True, config=_config(num_warps=4))
    assert spy.call_count == 0


@pytest.mark.parametrize("variable, reader", [("FUSEDOPS_PERSISTENT", "persistent_enabled"),
                                              ("FUSEDOPS_STREAM_K", "stream_k_enabled"),
                                              ("FUSEDOPS_TMA", "tma_enabled")])
def test_public_matmul_cache_sees_the_kernel_knobs(variable, reader, monkeypatch):
    # The GPU path of fusedops.matmul caches a _Product (prepared launches) per layout; one made with a knob
    # that picks the kernel on must not be reused once it is off (and the reverse). A stand-in _Product.
    from fusedops.autograd import matmul as amm
    from fusedops.dsl.runtime import knobs

    class Recorder:
        def __init__(self, a, b, bias, activation, out_dtype):
            self.setting = getattr(knobs, reader)()

    monkeypatch.setattr(amm, "_interpret_enabled", lambda: False)
    monkeypatch.setattr(amm, "_Product", Recorder)
    monkeypatch.setattr(amm, "_FORWARD_LAUNCHES", type(amm._FORWARD_LAUNCHES)(16))     # a private cache
    a, b = torch.zeros(4096, 64, dtype=torch.float16)[:, :61], torch.zeros(64, 4096, dtype=torch.float16)[:61]
    for setting, expected in (("1", True), ("0", False), ("1", True)):
        monkeypatch.setenv(variable, setting)
        assert amm._product(a, b, None, None, None).setting is expected


def test_bad_knob_value_is_loud(monkeypatch):
    from fusedops.dsl.runtime import knobs
    monkeypatch.setenv("FUSEDOPS_PERSISTENT", "maybe")
    with pytest.raises(ValueError, match="FUSEDOPS_PERSISTENT"):
        knobs.persistent_enabled()


# -- PTX ---------------------------------------------------------------------------------------------

_EIGHT_WARP_CONFIGS = [config for config in WGMMA_CONFIGS if config.num_warps == 8]


@pytest.mark.skipif(not ptxas_available(), reason="ptxas is not on the PATH")
@pytest.mark.parametrize("index", range(len(_EIGHT_WARP_CONFIGS)))
@pytest.mark.parametrize("dtype, out_dtype, bias, activation", [
    (torch.float16, torch.float16, False, None), (torch.bfloat16, torch.bfloat16, True, "gelu"),
    (torch.float16, torch.float16, True, "silu"), (torch.float16, torch.float32, False, "relu"),
    (torch.float16, torch.float16, False, "gelu_tanh"), (torch.bfloat16, torch.bfloat16, True, "gelu_tanh")])
def test_sm90a_ptx_tma_ring_tma_store_no_spills_no_serialization(index, dtype, out_dtype, bias, activation, tmp_path,
                                                                  monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    config = _EIGHT_WARP_CONFIGS[index]
    a, b = torch.empty(4096, 4096, dtype=dtype), torch.empty(4096, 4096, dtype=dtype)
    c = torch.empty(4096, 4096, dtype=out_dtype)
    args, options = mp._arguments(c, a, b, torch.empty(4096, dtype=dtype) if bias else None, activation, config, 132)
    compiled = mp.matmul_persistent_kernel.compile(*args, target="sm_90a", **options)
    ptx = compiled.asm["ptx"]
    assert "wgmma.mma_async" in ptx and "cp.async.bulk.tensor.2d.shared::cluster.global" in ptx
    assert "cp.async.bulk.tensor.2d.global.shared::cta" in ptx          # the TMA-store epilogue
    result = assemble(ptx, "sm_90a")
    assert result.spill_bytes == 0, f"{config}: {result.registers} registers, {result.spill_bytes} bytes spilled"
    assert "C7514" not in result.log, result.log       # ptxas would serialize every wgmma


@pytest.mark.skipif(not ptxas_available(), reason="ptxas is not on the PATH")
@pytest.mark.parametrize("index", range(len(_EIGHT_WARP_CONFIGS)))
@pytest.mark.parametrize("dtype, bias, activation", [(torch.float16, False, None), (torch.bfloat16, True, None),
                                                     (torch.float16, True, "gelu")])
def test_sm90a_ptx_deferred_store_overlaps_the_next_tiles_wgmma(index, dtype, bias, activation, tmp_path,
                                                                 monkeypatch):
    # deferred_store: the first TMA store of C comes while a K step's wgmma group is in flight (the last wait
    # before it leaves one group pending; the inline store waits for all), its fence covers the shared tile
    # only (the loads are of other arguments: passes/descriptors.py), and ptxas keeps it without spills.
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    config = _EIGHT_WARP_CONFIGS[index]
    a, c = torch.empty(4096, 4096, dtype=dtype), torch.empty(4096, 4096, dtype=dtype)
    waits = {}
    for deferred in (False, True):
        args, options = mp._arguments(c, a, a, torch.empty(4096, dtype=dtype) if bias else None, activation, config,
                                      132, deferred)
        ptx = mp.matmul_persistent_kernel.compile(*args, target="sm_90a", **options).asm["ptx"]
        first_store = ptx.index("cp.async.bulk.tensor.2d.global.shared::cta")
        waits[deferred] = re.findall(r"wgmma\.wait_group\.sync\.aligned (\d+);", ptx[:first_store])[-1]
        if deferred:
            assert not re.search(r"fence\.proxy\.async\s*;", ptx), "a fence of every state space"
            result = assemble(ptx, "sm_90a")
            assert result.spill_bytes == 0, f"{config}: {result.registers} registers, {result.spill_bytes} spilled"
            assert "C7514" not in result.log, result.log
    assert waits == {False: "0", True: "1"}


# -- GPU tier ----------------------------------------------------------------------------------------

@pytest.mark.cuda
@pytest.mark.parametrize("deferred_store", [False, True])
@pytest.mark.parametrize("index", range(len(_EIGHT_WARP_CONFIGS)))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gpu_every_config_and_program_count(index, dtype, deferred_store, seed):
    config = _EIGHT_WARP_CONFIGS[index]
    m, n, k = 2000, 1040, 1000      # ragged in M, N and K
    a, b = _gpu_operands(m, n, k, dtype, seed)
    tiles = dsl.cdiv(m, config.constexprs["BLOCK_M"]) * dsl.cdiv(n, config.constexprs["BLOCK_N"])
    for programs in sorted({1, 7, min(tiles, sm_count(a.device)), tiles}):
        c = poison(torch.empty(m, n, device="cuda", dtype=dtype))
        mp.launch(c, a, b, None, None, config, programs, deferred_store=deferred_store)
        _check_gpu(c, a, b)


@pytest.mark.cuda
@pytest.mark.parametrize("deferred_store", [False, True])
@pytest.mark.parametrize("out_dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("activation", mm.ACTIVATIONS)
def test_gpu_bias_activation_out_dtypes(out_dtype, activation, deferred_store, seed):
    dtype = torch.bfloat16 if out_dtype == torch.bfloat16 else torch.float16
    m, n, k = 1500, 2100, 700
    a, b = _gpu_operands(m, n, k, dtype, seed)
    bias = torch.randn(n, device="cuda", dtype=dtype)
    c = poison(torch.empty(m, n, device="cuda", dtype=out_dtype))
    mp.launch(c, a, b, bias, activation, _EIGHT_WARP_CONFIGS[0], 50, deferred_store=deferred_store)  # 108 tiles
    _check_gpu(c, a, b, bias, activation)


@pytest.mark.cuda
@pytest.mark.parametrize("layout", ["column_major", "row_stride_not_16_bytes", "offset_view"])
def test_gpu_strided_c(layout, seed):
    m, n, k = 1000, 1100, 300
    a, b = _gpu_operands(m, n, k, torch.float16, seed)
    if layout == "column_major":
        c = torch.empty(n, m, device="cuda", dtype=torch.float16).t()
    elif layout == "row_stride_not_16_bytes":
        c = torch.empty(m, n + 3, device="cuda", dtype=torch.float16)[:, :n]
    else:
        c = torch.empty(m + 1, n + 8, device="cuda", dtype=torch.float16)[1:, 8:]
    poison(c)
    mp.launch(c, a, b, None, None, _EIGHT_WARP_CONFIGS[0], 40)
    _check_gpu(c, a, b)


@pytest.mark.cuda
@pytest.mark.parametrize("m, n, k", [(4096, 4096, 4096), (4000, 4144, 1008), (8192, 2048, 1024)])
def test_gpu_public_matmul_takes_it(m, n, k, seed, monkeypatch):
    # TMA-describable operands (rows of multiples of 16 elements), ragged against the 128 x 256 tiles
    monkeypatch.setenv("FUSEDOPS_STREAM_K", "0")
    a, b = _gpu_operands(m, n, k, torch.float16, seed)
    with mock.patch.object(mp, "launch", wraps=mp.launch) as spy:
        c = mm.matmul(a[None], b[None], config=_EIGHT_WARP_CONFIGS[0])[0]
    assert spy.call_count == 1
    _check_gpu(c, a, b)


@pytest.mark.cuda
def test_gpu_c_of_more_than_2_to_the_31_elements(seed):
    m, n, k = 40000, 60000, 64          # C: 2.4e9 elements, 4.8 GB of fp16
    a, b = _gpu_operands(m, n, k, torch.float16, seed)
    c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16)
    mp.launch(c, a, b, None, None, _EIGHT_WARP_CONFIGS[0], sm_count(a.device))
    for rows in (slice(0, 256), slice(m - 300, m)):
        for cols in (slice(0, 512), slice(n - 700, n)):
            _check_gpu(c[rows, cols], a[rows], b[:, cols])
    assert not torch.isnan(c).any().item()
    del c
