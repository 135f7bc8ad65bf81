"""The LayerNorm/RMSNorm forward in row sweeps (ForwardConfig.row_sweeps: norm_row_sweeps.forward_row_sweeps_kernel),
forced through norms.norm_forward: the candidates of the H200 probe (.scratch/ln_fwd_probe.py, LN_SWEEPS=1).

CPU tier: the interpreter against torch in float64 with small chunks, so that rows run several unmasked
chunks and a masked tail (one or more pieces, rows shorter than a piece, odd N), float16/bfloat16/float32,
every affine combination, strided rows (row stride != N, column stride 2), the rows that break
E[x^2] - E[x]^2 (shifted by 1e4), zeros with a tiny eps, a far outlier in column 0, persistent programs.
For fp16 and bf16 every candidate of PROBE_CANDIDATES assembles for sm_90a at 16384 and 32768 columns
without spills, with 16-byte accesses, the hints and no barrier per chunk. GPU tier (`-m cuda`):
poisoned outputs at long rows and odd N, > 2**31 elements.

The aligned window (ForwardConfig.aligned_window with row_sweeps: the SHIFT of forward_row_sweeps_kernel) is
tested the same way at odd N: rows starting at every offset modulo the 16-byte vector (odd N and sliced
views), rows of one element, the special rows (column 0 is then window position `first`), every affine
combination, strided rows (the window does not apply: the plain sweeps run); its candidates of the probe
(LN_ODD=1) assemble at N = 4097, 12289, 20001 with 16-byte accesses and no spills.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fusedops.dsl.target import assemble, ptxas_available
from fusedops.kernels import norm_forward_config
from fusedops.kernels import norm_forward_launcher
from fusedops.kernels import norm_row_sweeps
from fusedops.kernels import norms
from fusedops.kernels.norm_forward_config import ForwardConfig
from helpers import assert_close, poison, random_tensor

FC = ForwardConfig
LAYER_NORM, RMS_NORM = True, False
OPS = pytest.mark.parametrize("subtract_mean", [LAYER_NORM, RMS_NORM], ids=["layer_norm", "rms_norm"])


@pytest.fixture
def interpret(monkeypatch):
    monkeypatch.setenv("FUSEDOPS_INTERPRET", "1")


def _sweeps(chunk, num_warps=1, **options):
    return FC(True, 1, chunk, num_warps, row_sweeps=True, **options)


def _poisoned_empty(shape, dtype, device):
    return poison(torch.empty(shape, dtype=dtype, device=device))


def _check(config, x, subtract_mean, seed, weight=True, bias=True, eps=1e-5):
    """norm_forward of x (poisoned outputs) against torch in float64: y, mean and rstd. The mean's error is
    measured in row standard deviations (at most 2e-5 of one, plus the float32 rounding of the stored mean),
    not relative to the mean: a row of N(0, 1) values has a mean near 0 that float32 sums over thousands of
    elements cannot match to 1e-5 of itself, and a row shifted by 1e4 with a standard deviation of ~4 cannot
    store its mean closer than ~1e-4 of one. (One element left out or counted twice moves the mean by
    ~1 / N of a standard deviation: far above the bound for every row here.)"""
    n, dtype = x.shape[-1], x.dtype
    w = random_tensor((n,), dtype, x.device, seed + 1, scale=0.5) + 1 if weight else None
    b = random_tensor((n,), dtype, x.device, seed + 2) if bias and subtract_mean else None
    y, mean, rstd = norms.norm_forward(x, w, b, eps, subtract_mean=subtract_mean, config=config,
                                       allocate=_poisoned_empty)
    x64, w64, b64 = (None if t is None else t.double() for t in (x, w, b))
    if subtract_mean:
        assert_close(y, F.layer_norm(x64, (n,), w64, b64, eps), dtype)
        exact = x64.mean(-1)
        std = x64.std(-1, unbiased=False)
        allowed = 2e-5 * std + exact.abs() * 2.0 ** -23          # float32: relative spacing 2^-23 at most
        assert ((mean.double() - exact).abs() <= allowed).all(), ((mean.double() - exact) / std)
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
def test_row_sweeps_strided_rows(interpret, subtract_mean, seed):
    wide = random_tensor((3, 1200), torch.float16, "cpu", seed)
    _check(_sweeps(512), wide[:, 3:1103], subtract_mean, seed)          # row stride 1200, unaligned rows
    _check(_sweeps(256), wide[:, ::2], subtract_mean, seed)             # column stride 2


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
    constexprs = norm_forward_launcher.row_sweep_constexprs(config, dtype, x, bias, n, n, subtract_mean)
    return norm_row_sweeps.forward_row_sweeps_kernel.compile(*args, target="sm_90a", **constexprs).asm["ptx"]


_HINTED = ("ld.global.L1::evict_last.L2::cache_hint.v4", "ld.global.L1::evict_first.L2::cache_hint.v4",
           "st.global.cs.v4")


def _assembly_problems(config, n, dtype, subtract_mean) -> list:
    """What is wrong with `config`'s kernel for rows of n columns under ptxas: spills, registers over
    its min_blocks_per_sm cap, no 16-byte accesses (with hints: no hinted 16-byte loads and stores of x and
    y), more barriers than the once-per-row CTA reductions (LayerNorm two sums, RMSNorm one; two each)."""
    ptx = _compile_candidate(config, n, dtype, subtract_mean)
    result = assemble(ptx, "sm_90a")
    name = f"{config} {dtype} subtract_mean={subtract_mean}: {result.registers} registers"
    problems = []
    if result.spill_bytes:
        problems.append(f"{name}, {result.spill_bytes} bytes spilled")
    if config.min_blocks_per_sm and result.registers > 65536 // (32 * config.num_warps * config.min_blocks_per_sm):
        problems.append(f"{name} > the cap of {config.min_blocks_per_sm} CTAs per SM")
    if ".v4.b32" not in ptx or config.cache_hints and not all(text in ptx for text in _HINTED):
        problems.append(f"{name}: x or y without (hinted) 16-byte accesses")
    if ptx.count("bar.sync") > (4 if subtract_mean else 2):
        problems.append(f"{name}: {ptx.count('bar.sync')} bar.sync")
    return problems


@pytest.mark.skipif(not ptxas_available(), reason="ptxas is not on the PATH")
@pytest.mark.parametrize("n", [16384, 32768])
def test_probe_candidates_assemble_without_spills(n, tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    problems = []
    for chunk, num_warps, min_blocks, hints in PROBE_CANDIDATES:
        config = _sweeps(chunk, num_warps, min_blocks_per_sm=min_blocks, cache_hints=hints)
        for dtype, subtract_mean in ((torch.float16, LAYER_NORM), (torch.float16, RMS_NORM),
                                     (torch.bfloat16, LAYER_NORM)):
            problems += _assembly_problems(config, n, dtype, subtract_mean)
    assert not problems, "\n".join(problems)


# -- aligned window (ForwardConfig.aligned_window + row_sweeps) -------------------------------------
@pytest.fixture(autouse=True)
def _shifted_affine_at_any_size(monkeypatch):
    # ForwardConfig.shifted_affine applies from SHIFTED_AFFINE_MIN_ELEMENTS on; the interpreter's rows are few.
    monkeypatch.setattr(norm_forward_launcher, "SHIFTED_AFFINE_MIN_ELEMENTS", 0)


def _window(chunk, num_warps=1, **options):
    return _sweeps(chunk, num_warps, aligned_window=True, **options)


SHIFTED = pytest.mark.parametrize("shifted", [False, True], ids=["affine", "shifted_affine"])


def _shift_of(config, x, subtract_mean):
    """The SHIFT the launcher passes for x (2-D) with a weight and bias of x's dtype (0: none)."""
    return norm_forward_launcher.row_sweep_constexprs(config, x.dtype, x, x, x.stride(0), x.shape[1], subtract_mean,
                                                      x.stride(1)).get("SHIFT", 0)


# (chunk, num_warps, N) at 9 rows (fp16: row r starts at r * N mod 8: every offset for odd N): 512 at 1
# warp = 256-column pieces, so 1500 = edges + 1 chunk + pieces, 1001 = edges + 1 chunk + 1 piece + the
# tail edge; 64 at 1 warp = 2-element vectors (GROUP 8 > VECTOR), N = 37, 9, 7 and 1: edges (and pieces).
WINDOW_SHAPES = [(512, 1, 1500), (512, 1, 1001), (64, 1, 301), (64, 1, 37), (64, 1, 9), (64, 1, 7), (64, 1, 1)]


@OPS
@SHIFTED
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("chunk, num_warps, n", WINDOW_SHAPES)
def test_window_rows_match_float64(interpret, chunk, num_warps, n, dtype, shifted, subtract_mean, seed):
    x = random_tensor((9, n), dtype, "cpu", seed) * 3 + 0.25
    vector = 16 // dtype.itemsize
    config = _window(chunk, num_warps, shifted_affine=shifted)
    assert _shift_of(config, x, subtract_mean) == (vector if n % vector else 0)   # fp32 1500: 0
    _check(config, x, subtract_mean, seed)


@OPS
@SHIFTED
@pytest.mark.parametrize("offset", range(8))
def test_window_rows_starting_at_every_offset(interpret, offset, shifted, subtract_mean, seed):
    # Sliced views: the tensor itself starts `offset` elements past a 16-byte boundary (rows of stride N).
    n = 301
    flat = random_tensor((4 * n + 8,), torch.float16, "cpu", seed + offset)
    x = flat[offset:offset + 4 * n].view(4, n)
    config = _window(64, shifted_affine=shifted)
    assert _shift_of(config, x, subtract_mean) == 8
    _check(config, x, subtract_mean, seed)


@pytest.mark.parametrize("n, shift", [(1, 8), (7, 8), (301, 8), (1001, 4)])
def test_shifted_affine_copies_line_up_with_every_window(n, shift):
    t = torch.arange(1, n + 1, dtype=torch.float32)
    copies = norm_forward_launcher.shifted_affine_copies(t, n, shift)
    stride = copies.numel() // shift
    assert stride % shift == 0 and stride >= n + shift - 1
    for first in range(shift):                  # window position p of a row starting `first` past a boundary
        assert torch.equal(copies[first * stride + first:first * stride + first + n], t)


@OPS
def test_window_strided_rows_take_the_plain_sweeps(interpret, subtract_mean, seed):
    wide = random_tensor((3, 1200), torch.float16, "cpu", seed)
    for x in (wide[:, 3:1104], wide[:, ::2]):                           # row stride != N; column stride 2
        assert _shift_of(_window(256), x, subtract_mean) == 0
        _check(_window(256), x, subtract_mean, seed)


# The plain sweeps (aligned rows of 1100 columns) and the aligned window (odd rows of 1001 columns, row r
# starting at r mod 8) through the same cases.
KINDS = pytest.mark.parametrize("make, n", [(None, 1100), ("window", 1001), ("shifted", 1001)],
                                ids=["sweeps", "window", "shifted_affine"])


def _kind(make, chunk, num_warps=1, **options):
    if make == "shifted":
        return _window(chunk, num_warps, shifted_affine=True, **options)
    return (_window if make == "window" else _sweeps)(chunk, num_warps, **options)


@OPS
@KINDS
@pytest.mark.parametrize("weight, bias", [(True, True), (True, False), (False, True), (False, False)])
def test_every_affine_combination(interpret, make, n, weight, bias, subtract_mean, seed):
    if not subtract_mean and bias:
        pytest.skip("RMSNorm has no bias")
    x = random_tensor((3, n), torch.bfloat16, "cpu", seed)
    _check(_kind(make, 512, cache_hints=True, min_blocks_per_sm=2), x, subtract_mean, seed, weight, bias)


@OPS
@KINDS
def test_persistent_programs(interpret, make, n, subtract_mean, seed):
    # 4 interpreter "SMs" x 1 program: each program loops over 2-3 of the 11 rows.
    x = random_tensor((11, n), torch.float16, "cpu", seed)
    _check(_kind(make, 256, programs_per_sm=1), x, subtract_mean, seed)


@KINDS
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_layer_norm_rows_shifted_by_1e4_keep_their_variance(interpret, make, n, dtype, seed):
    # var(x) = 9 under a mean of 1e4: E[x^2] - E[x]^2 in float32 would lose it (1e8 * 6e-8 = 6).
    x = random_tensor((9, n), dtype, "cpu", seed, scale=3.0) + 1e4
    _check(_kind(make, 512), x, LAYER_NORM, seed)


@OPS
@KINDS
def test_row_of_zeros_with_tiny_eps_gives_no_nan(interpret, make, n, subtract_mean, seed):
    x = random_tensor((3, n), torch.float16, "cpu", seed)
    x[1] = 0
    y = _check(_kind(make, 512), x, subtract_mean, seed, eps=1e-12)
    assert torch.isfinite(y).all()


@OPS
@KINDS
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_far_outlier_in_the_first_column(interpret, make, n, dtype, subtract_mean, seed):
    # One thread's first chunk mean is pulled far from the row's: Chan's merge and the CTA merge carry it.
    # LayerNorm shifts by column 0 (with the window: at window position `first`), here 3e4 away from the
    # mean of 27: the statistics of x - 3e4 are Welford-exact, but mean = 3e4 + (27 - 3e4) rounds at 3e4's
    # float32 spacing (2e-3): about 1e-6 of a standard deviation, harmless for y.
    x = random_tensor((5, n), dtype, "cpu", seed)
    x[:, 0] = 3e4
    _check(_kind(make, 512), x, subtract_mean, seed)


def test_shipped_configs_shift_odd_rows_only():
    # The default row sweeps of aligned rows compile as before the window existed (no SHIFT constexpr:
    # byte-identical PTX); odd rows go through the window (16-byte vectors of 8 elements). (Odd rows of up to
    # 4097 columns take the split window instead: test_split_window_norms.py; those of 4098..12289 mostly the
    # staged one: test_norm_split_staged.py.)
    for n in (8192, 16384, 32768, 6001, 4105, 9001, 12289, 20001, 40001):
        for dtype in (torch.float16, torch.bfloat16):
            for subtract_mean in (LAYER_NORM, RMS_NORM):
                config = norm_forward_config.forward_config(n, dtype, subtract_mean=subtract_mean)
                if config.row_sweeps:
                    x = torch.empty((2, n), dtype=dtype, device="meta")
                    assert _shift_of(config, x, subtract_mean) == (8 if n % 8 else 0), (n, dtype, subtract_mean)
                elif not config.staged_affine:  # RMSNorm 16384 keeps its tiles; LayerNorm 8192 whole rows (s. 31)
                    assert n == 16384 and not subtract_mean or n == 8192 and subtract_mean


# The window candidates of .scratch/ln_fwd_probe.py (LN_ODD=1; it leaves (2048, 4, 8) and (4096, 4, 6) out for
# its time budget), kept in step by hand: (chunk, num_warps, min_blocks_per_sm) -> ptxas registers at fp16
# (LayerNorm / RMSNorm, sm_90a; hints on). About 16 elements of
# a chunk per thread under a 64-register cap fit: weight and bias come in 2-byte loads (they sit at the row's
# columns, not on the window's 16-byte boundaries). (16384, 16, 2), (8192, 8, 4) and (4096, 4, 8) spill
# 172 / 288 / 288 bytes in LayerNorm; (16384, 16, 2), (8192, 8, 3) and (4096, 4, 6) fit RMSNorm only.
WINDOW_CANDIDATES = [
    (8192, 16, 2),      # 64 / 56
    (4096, 8, 4),       # 64 / 54
    (16384, 32, 1),     # 64 / 56
    (2048, 4, 8),       # 64 / 54
]
WINDOW_RMS_CANDIDATES = [(16384, 16, 2), (8192, 8, 3), (4096, 4, 6)]     # 64 / 80 / 80 registers


@pytest.mark.skipif(not ptxas_available(), reason="ptxas is not on the PATH")
@pytest.mark.parametrize("n", [4097, 12289, 20001])
def test_window_candidates_assemble_without_spills(n, tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    problems = []
    cases = [(candidate, dtype, subtract_mean) for candidate in WINDOW_CANDIDATES
             for dtype, subtract_mean in ((torch.float16, LAYER_NORM), (torch.float16, RMS_NORM),
                                          (torch.bfloat16, LAYER_NORM))]
    cases += [(candidate, torch.float16, RMS_NORM) for candidate in WINDOW_RMS_CANDIDATES]
    for (chunk, num_warps, min_blocks), dtype, subtract_mean in cases:
        config = _window(chunk, num_warps, min_blocks_per_sm=min_blocks, cache_hints=True)
        assert _shift_of(config, torch.empty((2, n), dtype=dtype, device="meta"), subtract_mean) == 8
        problems += _assembly_problems(config, n, dtype, subtract_mean)
    assert not problems, "\n".join(problems)


# -- GPU tier ------------------------------------------------------------------------------------------
GPU_CONFIGS = [_sweeps(16384, 16, min_blocks_per_sm=2, cache_hints=True),
               _sweeps(8192, 8, min_blocks_per_sm=4, cache_hints=True),
               _sweeps(8192, 16, min_blocks_per_sm=3, cache_hints=True, programs_per_sm=2)]
GPU_WINDOW_CONFIGS = [_window(8192, 16, min_blocks_per_sm=2, cache_hints=True),
                      _window(4096, 8, min_blocks_per_sm=4, cache_hints=True, programs_per_sm=4),
                      _window(1024, 4, min_blocks_per_sm=8, cache_hints=True, shifted_affine=True),
                      _window(4096, 8, min_blocks_per_sm=4, cache_hints=True, shifted_affine=True)]


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
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", [(33, 12289), (17, 20001), (9, 4097), (5, 8191), (3, 101), (9, 1)])
@pytest.mark.parametrize("config", GPU_WINDOW_CONFIGS, ids=["8k-w16-lb2", "4k-w8-lb4-pps4", "1k-w4-lb8-shifted",
                                                            "4k-w8-lb4-shifted"])
def test_gpu_window_poisoned_outputs(config, shape, dtype, subtract_mean, seed):
    x = random_tensor(shape, dtype, "cuda", seed) * 3 + 0.25
    assert _shift_of(config, x, subtract_mean) == 8
    _check(config, x, subtract_mean, seed)
    flat = random_tensor((shape[0] * shape[1] + 8,), dtype, "cuda", seed + 1)
    for offset in (1, 3, 6):                                            # sliced views off 16-byte boundaries
        _check(config, flat[offset:offset + shape[0] * shape[1]].view(shape), subtract_mean, seed)


@pytest.mark.cuda
@OPS
@pytest.mark.parametrize("config, n_cols", [(GPU_CONFIGS[0], 32768), (GPU_WINDOW_CONFIGS[0], 12289),
                                             (GPU_WINDOW_CONFIGS[2], 12289)], ids=["sweeps", "window", "shifted"])
def test_gpu_special_rows(config, n_cols, subtract_mean, seed):
    x = random_tensor((9, n_cols), torch.float16, "cuda", seed, scale=3.0)
    x[1] += 1e4
    x[2] = 0
    x[3:, 0] = 3e4                                  # (with the window: column 0 at every window offset)
    _check(config, x[[0, 1, 3, 4, 5]], subtract_mean, seed)
    y = _check(config, x, subtract_mean, seed, eps=1e-12)
    assert torch.isfinite(y).all()
    wide = random_tensor((8, n_cols + 232), torch.float16, "cuda", seed)
    _check(config, wide[:, 100:100 + n_cols], subtract_mean, seed)      # row stride != N


@pytest.mark.cuda
@OPS
@pytest.mark.parametrize("config, n_cols", [(GPU_CONFIGS[0], 32768), (GPU_WINDOW_CONFIGS[0], 32767),
                                             (GPU_WINDOW_CONFIGS[3], 32767)], ids=["sweeps", "window", "shifted"])
@pytest.mark.large_memory
def test_gpu_more_than_2_31_elements(config, n_cols, subtract_mean, seed):
    n_rows = 2**31 // n_cols + 3                    # 2**31 + 3 rows of elements: int64 row offsets needed
    x = torch.randn((n_rows, n_cols), dtype=torch.float16, device="cuda")
    w = random_tensor((n_cols,), torch.float16, "cuda", seed, scale=0.5) + 1
    b = random_tensor((n_cols,), torch.float16, "cuda", seed + 1) if subtract_mean else None
    y, mean, rstd = norms.norm_forward(x, w, b, 1e-5, subtract_mean=subtract_mean, config=config)
    boundary = 2**31 // n_cols                      # the first row past element 2**31
    rows = torch.tensor([0, 1, n_rows // 2, boundary - 1, boundary, boundary + 1, n_rows - 1], device="cuda")
    x64 = x[rows].double()
    if subtract_mean:
        expected = F.layer_norm(x64, (n_cols,), w.double(), b.double(), 1e-5)
    else:
        expected = F.rms_norm(x64, (n_cols,), w.double(), 1e-5)
    assert_close(y[rows], expected, torch.float16)
    assert x.numel() > 2**31


@OPS
def test_shifted_affine_copies_of_strided_weight_and_bias(interpret, subtract_mean, seed):
    # The launch makes the shifted copies straight from strided parameters (no contiguous copy first).
    n = 301
    x = random_tensor((9, n), torch.float16, "cpu", seed) * 3 + 0.25
    w = random_tensor((2 * n,), torch.float16, "cpu", seed + 1)[::2] + 1
    b = random_tensor((3, n), torch.float16, "cpu", seed + 2)[1] if subtract_mean else None
    y, _, _ = norms.norm_forward(x, w, b, 1e-5, subtract_mean=subtract_mean,
                                 config=_window(64, shifted_affine=True), allocate=_poisoned_empty)
    x64, w64 = x.double(), w.double()
    expected = (F.layer_norm(x64, (n,), w64, b.double(), 1e-5) if subtract_mean
                else F.rms_norm(x64, (n,), w64, 1e-5))
    assert_close(y, expected, torch.float16)
