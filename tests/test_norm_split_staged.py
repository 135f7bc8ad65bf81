"""LayerNorm/RMSNorm forward of 16-bit rows of 4098..12289 columns off 16-byte boundaries, whole rows in
registers with weight and bias staged by the kernel into shifted copies (fusedops/kernels/norm_split_staged.py;
ForwardConfig.staged_affine).

CPU tier: which rows the defaults send there; the interpreter against torch in float64 with poisoned outputs
and poisoned scratch copies (a position the kernel read before staging it would be NaN): consecutive rows at
every offset modulo the vector, one to three main tiles (forced at small sizes), prefetch or not, fewer rows
than programs, every affine combination, weight and bias of another dtype, sliced views, layouts the window
does not apply to; ptxas: the shipped configs assemble with 16-byte accesses and no spills. GPU tier
(`-m cuda`): the defaults at many rows with poisoned outputs and scratch, sliced views, > 2**31 elements.
"""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch
import torch.nn.functional as F

from fusedops.dsl.target import assemble, ptxas_available
from fusedops.kernels import norm_forward_config, norms
from fusedops.kernels.norm_split_staged import forward_split_staged_kernel
from helpers import assert_close, poison, random_tensor

OPS = pytest.mark.parametrize("subtract_mean", [True, False], ids=["layer_norm", "rms_norm"])
HALF = pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])


@pytest.fixture
def interpret(monkeypatch):
    monkeypatch.setenv("FUSEDOPS_INTERPRET", "1")


def _poisoned_empty(shape, dtype, device):
    return poison(torch.empty(shape, dtype=dtype, device=device))


def _check(x, subtract_mean, seed, weight=True, bias=True, config=None, parameter_dtype=None):
    """norm_forward of x (poisoned outputs and scratch; the default or the given config) against torch in
    float64: y, mean, rstd."""
    n, dtype = x.shape[-1], x.dtype
    parameter_dtype = parameter_dtype or dtype
    w = random_tensor((n,), parameter_dtype, x.device, seed + 1, scale=0.5) + 1 if weight else None
    b = random_tensor((n,), parameter_dtype, x.device, seed + 2) if bias and subtract_mean else None
    y, mean, rstd = norms.norm_forward(x, w, b, 1e-5, subtract_mean=subtract_mean, config=config,
                                       allocate=_poisoned_empty)
    x64 = x.double()
    w64, b64 = (None if t is None else t.double() for t in (w, b))
    if subtract_mean:
        reference = F.layer_norm(x64, (n,), w64, b64, 1e-5)
        assert_close(mean, x64.mean(-1), torch.float32)
        variance = x64.var(-1, unbiased=False)
    else:
        reference = F.rms_norm(x64, (n,), w64, 1e-5)
        assert mean is None
        variance = x64.pow(2).mean(-1)
    assert_close(rstd, torch.rsqrt(variance + 1e-5), torch.float32)
    assert y.dtype == dtype
    assert_close(y, reference, dtype)


# -- the defaults ---------------------------------------------------------------------------------------
@HALF
def test_defaults_take_the_staged_window_for_odd_rows_of_4098_to_12289_columns(dtype):
    for subtract_mean in (True, False):
        for n in (4099, 4105, 5001, 6145, 6151, 8191, 8193, 10241, 12287, 12289):
            config = norm_forward_config.forward_config(n, dtype, subtract_mean=subtract_mean)
            assert config.split_window and config.staged_affine, (n, subtract_mean)
            assert config.block_n * config.main_tiles >= n - 1 and 1 <= config.main_tiles <= 3, n
        for n in (4097, 4104, 8192, 12288, 12291, 12297, 16377, 20001):
            assert not norm_forward_config.forward_config(n, dtype, subtract_mean=subtract_mean).staged_affine, n
    # LayerNorm rows of 8194..10240 columns keep the row sweeps (as fast there); RMSNorm's take it
    assert not norm_forward_config.forward_config(9001, dtype, subtract_mean=True).staged_affine
    assert norm_forward_config.forward_config(9001, dtype, subtract_mean=False).staged_affine
    assert not norm_forward_config.forward_config(5001, torch.float32, subtract_mean=True).staged_affine


# -- CPU tier: the interpreter ------------------------------------------------------------------------
@HALF
@OPS
@pytest.mark.parametrize("shape", [(9, 4099), (11, 5001), (9, 8191), (10, 12289)])
def test_default_launches_match_float64(interpret, dtype, subtract_mean, shape, seed):
    # Nine or more consecutive rows of odd N start at every offset modulo 8; a mean away from 0 (shifted sums).
    _check(random_tensor(shape, dtype, "cpu", seed) * 3 + 0.25, subtract_mean, seed)


def _forced(n, subtract_mean, **changes):
    base = norm_forward_config.forward_config(5001, torch.float16, subtract_mean=subtract_mean)
    return dataclasses.replace(base, **changes)


# (block_n, main_tiles) over rows of 1031 columns (N = 7 mod 8) and 1025 (N - 1 fills the tiles exactly):
# one, two and three main tiles; programs_per_sm 1 (8 programs: the interpreter's 4 "SMs", rounded up to a
# multiple of 8) or 6 (24), prefetch or not, fewer rows than programs and more.
@OPS
@pytest.mark.parametrize("n, block_n, main_tiles", [(1031, 2048, 1), (1025, 1024, 1), (1031, 1024, 2),
                                                    (1025, 512, 2), (1031, 512, 3), (1537, 512, 3)])
@pytest.mark.parametrize("programs_per_sm, prefetch, n_rows", [(1, False, 3), (1, True, 37), (6, True, 29),
                                                               (6, False, 50)])
def test_forced_tiles_grids_and_prefetch(interpret, subtract_mean, n, block_n, main_tiles, programs_per_sm, prefetch,
                                         n_rows, seed):
    config = _forced(n, subtract_mean, block_n=block_n, main_tiles=main_tiles, programs_per_sm=programs_per_sm,
                     prefetch=prefetch, num_warps=4)
    _check(random_tensor((n_rows, n), torch.bfloat16, "cpu", seed) - 2, subtract_mean, seed, config=config)


@OPS
@pytest.mark.parametrize("weight, bias", [(True, True), (True, False), (False, True), (False, False)])
def test_every_affine_combination(interpret, subtract_mean, weight, bias, seed):
    _check(random_tensor((9, 4105), torch.float16, "cpu", seed), subtract_mean, seed, weight, bias)


@OPS
def test_weight_and_bias_of_another_dtype(interpret, subtract_mean, seed):
    # float32 parameters: the copies are float32 (their own dtype), read in two 16-byte vectors per 8 columns
    _check(random_tensor((9, 4099), torch.float16, "cpu", seed), subtract_mean, seed, parameter_dtype=torch.float32)


@OPS
def test_sliced_views_off_16_byte_boundaries(interpret, subtract_mean, seed):
    flat = random_tensor((5 * 4099 + 8,), torch.float16, "cpu", seed)
    for offset in (1, 4, 7):
        _check(flat[offset:offset + 5 * 4099].view(5, 4099), subtract_mean, seed)


@OPS
def test_layouts_outside_the_window_take_the_other_kernels(interpret, subtract_mean, seed):
    # a column slice (row stride != N): the window does not apply; the launcher must fall back
    wide = random_tensor((4, 4200), torch.float16, "cpu", seed)
    _check(wide[:, :4099], subtract_mean, seed)


def test_invalid_staged_configs_are_refused(interpret):
    x = torch.zeros(4, 4099, dtype=torch.float16)
    w = torch.ones(4099, dtype=torch.float16)
    for changes in (dict(main_tiles=1), dict(main_tiles=4, block_n=2048), dict(programs_per_sm=0),
                    dict(block_rows=2)):
        with pytest.raises(ValueError, match="main_tiles|staged_affine"):
            norms.norm_forward(x, w, None, 1e-5, subtract_mean=False, config=_forced(4099, False, **changes))


# -- CPU tier: ptxas --------------------------------------------------------------------------------
@pytest.mark.skipif(not ptxas_available(), reason="ptxas is not on the PATH")
@HALF
@OPS
@pytest.mark.parametrize("n", [5001, 8191, 12289])
def test_shipped_configs_assemble_with_vectors_no_spills(dtype, subtract_mean, n, tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    config = norm_forward_config.forward_config(n, dtype, subtract_mean=subtract_mean)
    x = torch.empty(64, dtype=dtype, device="meta")
    stats = torch.empty(64, dtype=torch.float32, device="meta")
    mean, bias = (stats, x) if subtract_mean else (None, None)
    compiled = forward_split_staged_kernel.compile(
        x, mean, stats, x, x, bias, x, bias, 8192, n, n, n + 7, 1e-5, SUBTRACT_MEAN=subtract_mean,
        BLOCK_N=config.block_n, TILES=config.main_tiles, SHIFT=8, PREFETCH=config.prefetch,
        num_warps=config.num_warps, target="sm_90a")
    ptx = compiled.asm["ptx"]
    assert re.search(r"ld\.global[.\w:]*\.v4", ptx) and re.search(r"st\.global[.\w:]*\.v4", ptx)
    # the staging barrier, the statistics' one exchange (LayerNorm: and its rare second sums' one)
    assert ptx.count("bar.sync") == (5 if subtract_mean else 3)
    info = assemble(ptx, "sm_90a")
    assert info.spill_bytes == 0
    assert info.registers * 32 * config.num_warps * config.programs_per_sm <= 65536   # the programs fit an SM


# -- GPU tier ---------------------------------------------------------------------------------------------
@pytest.mark.cuda
@HALF
@OPS
@pytest.mark.parametrize("shape", [(1000, 12289), (517, 5001), (333, 8191), (64, 4099), (700, 10241)])
def test_gpu_default_launches_poisoned_outputs(dtype, subtract_mean, shape, seed):
    x = random_tensor(shape, dtype, "cuda", seed) * 3 + 0.25
    _check(x, subtract_mean, seed)
    flat = random_tensor((shape[0] * shape[1] + 8,), dtype, "cuda", seed + 1)
    for offset in (1, 3, 6):                                            # sliced views off 16-byte boundaries
        _check(flat[offset:offset + shape[0] * shape[1]].view(shape), subtract_mean, seed)


@pytest.mark.cuda
@OPS
def test_gpu_forced_tiles_and_affine(subtract_mean, seed):
    for changes in (dict(main_tiles=2, block_n=4096), dict(main_tiles=3, block_n=2048, prefetch=False),
                    dict(programs_per_sm=1, prefetch=True)):
        config = _forced(5001, subtract_mean, **changes)
        for weight, bias in ((True, False), (False, True), (False, False)):
            _check(random_tensor((300, 5001), torch.float16, "cuda", seed), subtract_mean, seed, weight, bias,
                   config=config)


@pytest.mark.large_memory
@pytest.mark.cuda
@OPS
def test_gpu_more_than_2_31_elements(subtract_mean, seed):
    n_cols = 12289
    n_rows = 2**31 // n_cols + 3                    # int64 row offsets needed past row 2**31 // n_cols
    x = torch.randn((n_rows, n_cols), dtype=torch.float16, device="cuda")
    w = random_tensor((n_cols,), torch.float16, "cuda", seed, scale=0.5) + 1
    b = random_tensor((n_cols,), torch.float16, "cuda", seed + 1) if subtract_mean else None
    assert norm_forward_config.forward_config(n_cols, x.dtype, subtract_mean=subtract_mean).staged_affine
    y, mean, rstd = norms.norm_forward(x, w, b, 1e-5, subtract_mean=subtract_mean)
    boundary = 2**31 // n_cols
    rows = torch.tensor([0, 1, n_rows // 2, boundary - 1, boundary, n_rows - 1], device="cuda")
    x64 = x[rows].double()
    reference = (F.layer_norm(x64, (n_cols,), w.double(), None if b is None else b.double(), 1e-5)
                 if subtract_mean else F.rms_norm(x64, (n_cols,), w.double(), 1e-5))
    assert_close(y[rows], reference, torch.float16)
