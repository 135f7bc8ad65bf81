"""The LayerNorm/RMSNorm forward in row sweeps (ForwardConfig.row_sweeps: norm_kernels.forward_row_sweeps_kernel),
forced through norms.norm_forward: the candidates of the H200 probe (.scratch/ln_fwd_probe.py, LN_SWEEPS=1).

CPU tier: the interpreter against torch in float64 with small chunks, so that rows run several unmasked
chunks and a masked tail (one or more pieces, rows shorter than a piece, odd N), float16/bfloat16/float32,
every affine combination, strided rows (row stride != N, column stride 2), the rows that break
E[x^2] - E[x]^2 (shifted by 1e4), zeros with a tiny eps, a far outlier in column 0, persistent programs.
For fp16 and bf16 every candidate of PROBE_CANDIDATES assembles for sm_90a at 16384 and 32768 columns
without spills, with 16-byte accesses, the hints and no barrier per chunk. GPU tier (`-m cuda`):
poisoned outputs at long rows and odd N, > 2**31 elements.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fusedops.dsl.target import assemble, ptxas_available
from fusedops.kernels import norm_kernels as K
from fusedops.kernels import norms
from helpers import assert_close, poison, random_tensor

FC = norms.ForwardConfig
LAYER_NORM, RMS_NORM = True, False
OPS = pytest.mark.parametrize("subtract_mean", [LAYER_NORM, RMS_NORM], ids=["layer_norm", "rms_norm"])


@pytest.fixture
def interpret(monkeypatch):
    monkeypatch.setenv("FUSEDOPS_INTERPRET", "1")


def _sweeps(chunk, num_warps=1, **options):
    return FC(True, 1, chunk, num_warps, row_sweeps=True, **options)


def _poisoned_empty(shape, dtype, device):
    return poison(torch.empty(shape, dtype=dtype, device=device))


def _check(config, x, subtract_mean, seed, weight=True, bias=True, eps=1e-5, mean_in_std=False):
    """norm_forward of x (poisoned outputs) against torch in float64: y, mean and rstd. mean_in_std: the mean's
    error is measured in row standard deviations (at most 1e-5 of one, plus the float32 rounding of the
    stored mean: a row shifted by 1e4 with a standard deviation of ~4 cannot store its mean closer than
    ~1e-4 of one), not relative to the mean."""
    n, dtype = x.shape[-1], x.dtype
    w = random_tensor((n,), dtype, x.device, seed + 1, scale=0.5) + 1 if weight else None
    b = random_tensor((n,), dtype, x.device, seed + 2) if bias and subtract_mean else None
    y, mean, rstd = norms.norm_forward(x, w, b, eps, subtract_mean=subtract_mean, config=config,
                                       allocate=_poisoned_empty)
    x64, w64, b64 = (None if t is None else t.double() for t in (x, w, b))
    if subtract_mean:
        assert_close(y, F.layer_norm(x64, (n,), w64, b64, eps), dtype)
        if mean_in_std:
            exact = x64.mean(-1)
            std = x64.std(-1, unbiased=False)
            allowed = 1e-5 * std + exact.abs() * 2.0 ** -23          # float32: relative spacing 2^-23 at most
            assert ((mean.double() - exact).abs() <= allowed).all(), ((mean.double() - exact) / std)
        else:
            assert_close(mean, x64.mean(-1), torch.float32)
        x64 = x64 - x64.mean(-1, keepdim=True)
    else:
        assert_close(y, F.rms_norm(x64, (n,), w64, eps), dtype)
    assert_close(rstd, torch.rsqrt(x64.pow(2).mean(-1) + eps), torch.float32)
    return y


# (chunk, num_warps, N) at fp16's 8-element vectors: chunk 512 at 1 warp is two 256-column pieces (32
# threads x 8), so 1500 = 2 chunks + 2 pieces (the second masked), 1100 = 2 chunks + 1 masked piece,
# 1024 = 2 chunks and no tail, 37 = a piece, most threads without an element; 256 at 2 warps: one piece;
# 64 at 1 warp: 32 threads x 2, N = 1: one element.
SHAPES = [(512, 1, 1500), (512, 1, 1100), (512, 1, 1024), (512, 1, 37), (256, 2, 777), (64, 1, 301), (64, 1, 1)]


@OPS
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("chunk, num_warps, n", SHAPES)
def test_row_sweeps_match_float64(interpret, chunk, num_warps, n, dtype, subtract_mean, seed):
    x = random_tensor((3, n), dtype, "cpu", seed) * 3 + 0.25          # a mean away from 0
    _check(_sweeps(chunk, num_warps), x, subtract_mean, seed)


@OPS
@pytest.mark.parametrize("weight, bias", [(True, True), (True, False), (False, True), (False, False)])
def test_row_sweeps_every_affine_combination(interpret, weight, bias, subtract_mean, seed):
    if not subtract_mean and bias:
        pytest.skip("RMSNorm has no bias")
    x = random_tensor((2, 1100), torch.bfloat16, "cpu", seed)
    _check(_sweeps(512, cache_hints=True, min_blocks_per_sm=2), x, subtract_mean, seed, weight, bias)


@OPS
def test_row_sweeps_strided_rows(interpret, subtract_mean, seed):
    wide = random_tensor((3, 1200), torch.float16, "cpu", seed)
    _check(_sweeps(512), wide[:, 3:1103], subtract_mean, seed)          # row stride 1200, unaligned rows
    _check(_sweeps(256), wide[:, ::2], subtract_mean, seed)             # column stride 2


@OPS
def test_row_sweeps_persistent_programs(interpret, subtract_mean, seed):
    # 4 interpreter "SMs" x 1 program: each program loops over 2-3 of the 11 rows.
    x = random_tensor((11, 700), torch.float16, "cpu", seed)
    _check(_sweeps(256, programs_per_sm=1), x, subtract_mean, seed)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_layer_norm_rows_shifted_by_1e4_keep_their_variance(interpret, dtype, seed):
    # var(x) = 9 under a mean of 1e4: E[x^2] - E[x]^2 in float32 would lose it (1e8 * 6e-8 = 6).
    x = random_tensor((3, 1500), dtype, "cpu", seed, scale=3.0) + 1e4
    _check(_sweeps(512), x, LAYER_NORM, seed)


@OPS
def test_row_of_zeros_with_tiny_eps_gives_no_nan(interpret, subtract_mean, seed):
    x = random_tensor((3, 1100), torch.float16, "cpu", seed)
    x[1] = 0
    y = _check(_sweeps(512), x, subtract_mean, seed, eps=1e-12)
    assert torch.isfinite(y).all()


@OPS
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_far_outlier_in_the_first_column(interpret, dtype, subtract_mean, seed):
    # One thread's first chunk mean is pulled far from the row's: Chan's merge and the CTA merge carry it.
    # LayerNorm shifts by column 0, here 3e4 away from the mean of 27: the statistics of x - 3e4 are
    # Welford-exact, but mean = 3e4 + (27 - 3e4) rounds at 3e4's float32 spacing (2e-3): about 1e-6 of a
    # standard deviation (an element lies at most sqrt(N - 1) deviations from the mean), harmless for y.
    x = random_tensor((2, 1100), dtype, "cpu", seed)
    x[:, 0] = 3e4
    _check(_sweeps(512), x, subtract_mean, seed, mean_in_std=True)


def test_chunk_must_be_a_power_of_two(interpret):
    with pytest.raises(ValueError, match="block_n=384 is not a power of two"):
        norms.norm_forward(torch.ones(2, 1000), None, None, 1e-5, subtract_mean=True, config=_sweeps(384))


# The row-sweep candidates of .scratch/ln_fwd_probe.py (LN_SWEEPS=1), kept in step by hand: (chunk,
# num_warps, min_blocks_per_sm, cache_hints) -> ptxas registers at fp16 (LayerNorm / RMSNorm, sm_90a).
PROBE_CANDIDATES = [
    (16384, 16, 2, True),       # 64 / 54: softmax's forward (2 CTAs of 16 warps per SM)
    (16384, 16, 2, False),      # 64 / 54 (uncapped: 87 / 63)
    (8192, 16, 2, True),        # 56 / 48
    (8192, 16, 3, True),        # 40 / 40
    (8192, 8, 4, True),         # 64 / 59
    (8192, 8, 3, True),         # 72 / 59
    (4096, 8, 6, True),         # 40 / 40
    (4096, 4, 8, True),         # 64 / 59
    (16384, 32, 1, True),       # 56 / 48
]


def _compile_candidate(config, n, dtype, subtract_mean):
    """forward_row_sweeps_kernel's PTX for `config` at (8192, n) rows of `dtype` (weight, bias (LayerNorm) of
    that dtype), specialized as the launcher prepares it."""
    x = torch.empty(64, dtype=dtype, device="meta")
    stats = torch.empty(64, dtype=torch.float32, device="meta")
    bias = x if subtract_mean else None
    args = (x, stats if subtract_mean else None, stats, x, x, bias, 8192, n, n, 1, n, 1e-5)
    constexprs = norms.row_sweep_constexprs(config, dtype, x, bias, n, n, subtract_mean)
    return K.forward_row_sweeps_kernel.compile(*args, target="sm_90a", **constexprs).asm["ptx"]


@pytest.mark.skipif(not ptxas_available(), reason="ptxas is not on the PATH")
@pytest.mark.parametrize("n", [16384, 32768])
def test_probe_candidates_assemble_without_spills(n, tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    problems = []
    for chunk, num_warps, min_blocks, hints in PROBE_CANDIDATES:
        config = _sweeps(chunk, num_warps, min_blocks_per_sm=min_blocks, cache_hints=hints)
        for dtype, subtract_mean in ((torch.float16, LAYER_NORM), (torch.float16, RMS_NORM),
                                     (torch.bfloat16, LAYER_NORM)):
            ptx = _compile_candidate(config, n, dtype, subtract_mean)
            result = assemble(ptx, "sm_90a")
            name = f"{config} {dtype} subtract_mean={subtract_mean}: {result.registers} registers"
            if result.spill_bytes:
                problems.append(f"{name}, {result.spill_bytes} bytes spilled")
            if result.registers > 65536 // (32 * num_warps * min_blocks):
                problems.append(f"{name} > the cap of {min_blocks} CTAs per SM")
            if ".v4.b32" not in ptx:
                problems.append(f"{name}: no 16-byte accesses")
            # the CTA reductions only, once per row: LayerNorm two sums, RMSNorm one (two barriers each)
            if ptx.count("bar.sync") > (4 if subtract_mean else 2):
                problems.append(f"{name}: {ptx.count('bar.sync')} bar.sync")
            hinted = ("ld.global.L1::evict_last.L2::cache_hint.v4", "ld.global.L1::evict_first.L2::cache_hint.v4",
                      "st.global.cs.v4")
            if hints and not all(text in ptx for text in hinted):
                problems.append(f"{name}: the sweeps' cache hints are missing")
    assert not problems, "\n".join(problems)


# -- GPU tier ------------------------------------------------------------------------------------------
GPU_CONFIGS = [_sweeps(16384, 16, min_blocks_per_sm=2, cache_hints=True),
               _sweeps(8192, 8, min_blocks_per_sm=4, cache_hints=True),
               _sweeps(8192, 16, min_blocks_per_sm=3, cache_hints=True, programs_per_sm=2)]


@pytest.mark.cuda
@OPS
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", [(65, 32768), (33, 16384), (17, 20001), (9, 40000), (5, 8190), (3, 100)])
@pytest.mark.parametrize("config", GPU_CONFIGS, ids=["16k-w16-lb2", "8k-w8-lb4", "8k-w16-lb3-pps2"])
def test_gpu_row_sweeps_poisoned_outputs(config, shape, dtype, subtract_mean, seed):
    x = random_tensor(shape, dtype, "cuda", seed) * 3 + 0.25
    _check(config, x, subtract_mean, seed)


@pytest.mark.cuda
@OPS
def test_gpu_row_sweeps_special_rows(subtract_mean, seed):
    config = GPU_CONFIGS[0]
    x = random_tensor((4, 32768), torch.float16, "cuda", seed, scale=3.0)
    x[1] += 1e4
    x[2] = 0
    x[3, 0] = 3e4
    _check(config, x[[0, 1, 3]], subtract_mean, seed, mean_in_std=True)
    y = _check(config, x, subtract_mean, seed, eps=1e-12, mean_in_std=True)
    assert torch.isfinite(y).all()
    wide = random_tensor((8, 33000), torch.float16, "cuda", seed)
    _check(config, wide[:, 100:32868], subtract_mean, seed)             # row stride != N


@pytest.mark.cuda
@OPS
def test_gpu_row_sweeps_more_than_2_31_elements(subtract_mean, seed):
    n_cols = 32768
    n_rows = 2**31 // n_cols + 3                    # 2**31 + 3 * n_cols elements: int64 row offsets needed
    x = torch.randn((n_rows, n_cols), dtype=torch.float16, device="cuda")
    w = random_tensor((n_cols,), torch.float16, "cuda", seed, scale=0.5) + 1
    b = random_tensor((n_cols,), torch.float16, "cuda", seed + 1) if subtract_mean else None
    y, mean, rstd = norms.norm_forward(x, w, b, 1e-5, subtract_mean=subtract_mean, config=GPU_CONFIGS[0])
    boundary = 2**31 // n_cols                      # the first row past element 2**31
    rows = torch.tensor([0, 1, n_rows // 2, boundary - 1, boundary, n_rows - 1], device="cuda")
    x64 = x[rows].double()
    if subtract_mean:
        expected = F.layer_norm(x64, (n_cols,), w.double(), b.double(), 1e-5)
    else:
        expected = F.rms_norm(x64, (n_cols,), w.double(), 1e-5)
    assert_close(y[rows], expected, torch.float16)
    assert x.numel() > 2**31
