"""The LayerNorm/RMSNorm forward variants that re-read x (ForwardConfig.reload, output_chunks) and carry
cache hints (cache_hints), forced through norms.norm_forward: the candidates of the H200 sweep
(.scratch/ln_fwd_probe.py), some of which the shipped 16-bit LayerNorm configs use
(norm_forward_config.forward_config; tests/test_norms.py checks those defaults).

CPU tier: the interpreter against torch in float64 at odd shapes (whole-row and persistent kernels, the
aligned window, strided columns, every affine combination, float16 and float32, rows past the end of the
last tile); for fp16 LayerNorm and RMSNorm every variant of the probe's table assembles for sm_90a
without spills.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fusedops.dsl.target import assemble, ptxas_available
from fusedops.kernels import norm_forward_config
from fusedops.kernels import norm_forward_kernels
from fusedops.kernels import norms
from fusedops.kernels.norm_forward_config import ForwardConfig
from helpers import assert_close, random_tensor

FC = ForwardConfig


@pytest.fixture
def interpret(monkeypatch):
    monkeypatch.setenv("FUSEDOPS_INTERPRET", "1")


def _reference(x, w, b, eps, subtract_mean):
    n = x.shape[-1]
    w64 = None if w is None else w.double()
    if subtract_mean:
        return F.layer_norm(x.double(), (n,), w64, None if b is None else b.double(), eps)
    return F.rms_norm(x.double(), (n,), w64, eps)


def _check(config, shape, dtype, seed, subtract_mean, weight=True, bias=True, x_transform=None):
    x = random_tensor(shape, dtype, "cpu", seed) * 3 + 0.25       # a mean away from 0
    if x_transform is not None:
        x = x_transform(x)
    n = x.shape[-1]
    w = random_tensor((n,), dtype, "cpu", seed + 1, scale=0.5) + 1 if weight else None
    b = random_tensor((n,), dtype, "cpu", seed + 2) if bias and subtract_mean else None
    y, mean, rstd = norms.norm_forward(x, w, b, 1e-5, subtract_mean=subtract_mean, config=config)
    assert_close(y, _reference(x, w, b, 1e-5, subtract_mean), dtype)
    x64 = x.double()
    if subtract_mean:
        assert_close(mean, x64.mean(-1), torch.float32)
        x64 = x64 - x64.mean(-1, keepdim=True)
    assert_close(rstd, torch.rsqrt(x64.pow(2).mean(-1) + 1e-5), torch.float32)


# (config, shape): whole-row tiles of one and several rows (the last tile partly past the end), one to
# four output chunks, the persistent kernel with and without prefetch.
VARIANTS = [
    (FC(False, 1, 64, 4, reload=True), (3, 37)),
    (FC(False, 2, 128, 4, reload=True, output_chunks=2), (5, 101)),
    (FC(False, 4, 64, 4, reload=True, output_chunks=4, cache_hints=True), (7, 61)),
    (FC(False, 1, 128, 4, cache_hints=True), (3, 100)),
    (FC(False, 2, 64, 4, affine_first=True, cache_hints=True), (5, 33)),
    (FC(False, 2, 128, 4, programs_per_sm=1, prefetch=True, reload=True, output_chunks=2), (11, 77)),
    (FC(False, 1, 64, 4, programs_per_sm=2, reload=True, output_chunks=2, cache_hints=True), (9, 50)),
]


@pytest.mark.parametrize("subtract_mean", [True, False], ids=["layer_norm", "rms_norm"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("config, shape", VARIANTS)
def test_variants_match_float64(interpret, config, shape, dtype, subtract_mean, seed):
    _check(config, shape, dtype, seed, subtract_mean)


@pytest.mark.parametrize("subtract_mean", [True, False], ids=["layer_norm", "rms_norm"])
@pytest.mark.parametrize("weight, bias", [(True, False), (False, True), (False, False)])
def test_reload_every_affine_combination(interpret, weight, bias, subtract_mean, seed):
    _check(FC(False, 2, 64, 4, reload=True, output_chunks=2), (3, 45), torch.bfloat16, seed, subtract_mean,
           weight, bias)


@pytest.mark.parametrize("subtract_mean", [True, False], ids=["layer_norm", "rms_norm"])
def test_reload_through_the_aligned_window(interpret, subtract_mean, seed):
    # Odd rows (N % 8 != 0, unit strides): 16-byte windows; the chunks are window positions.
    config = FC(False, 1, 128, 4, aligned_window=True, reload=True, output_chunks=4)
    _check(config, (5, 99), torch.float16, seed, subtract_mean)


@pytest.mark.parametrize("subtract_mean", [True, False], ids=["layer_norm", "rms_norm"])
def test_reload_strided_columns(interpret, subtract_mean, seed):
    # Column stride 2 and a row stride that is not N: the re-reads address x like the first read.
    _check(FC(False, 2, 64, 4, reload=True, output_chunks=2), (4, 86), torch.float16, seed, subtract_mean,
           x_transform=lambda x: x[:, ::2])


def test_output_chunks_must_divide_block_n(interpret):
    x = torch.ones(2, 40)
    with pytest.raises(ValueError, match="output_chunks=3"):
        norms.norm_forward(x, None, None, 1e-5, subtract_mean=True, config=FC(False, 1, 64, 4, reload=True,
                                                                                        output_chunks=3))


def _probe_variants(n):
    """The candidate configs of .scratch/ln_fwd_probe.py at n columns (fp16): kept in step by hand."""
    shipped = norm_forward_config.forward_config(n, torch.float16, subtract_mean=False)     # the base tiles (RMSNorm's)
    block, rows, warps = shipped.block_n, shipped.block_rows, shipped.num_warps
    out = [FC(False, rows, block, warps, cache_hints=True)]

    def reload(chunks, w=warps, r=rows, per_sm=0):
        out.append(FC(False, r, block, w, reload=True, output_chunks=chunks, programs_per_sm=per_sm,
                      prefetch=per_sm > 0))

    if block <= 2048:
        reload(2), reload(4), reload(2, r=2 * rows), reload(2, per_sm=4)
    elif block <= 4096:
        reload(2), reload(2, w=8), reload(4), reload(2, per_sm=6)
    elif block <= 8192:
        reload(2), reload(2, w=8), reload(4)
    elif block <= 16384:
        reload(2), reload(4), reload(2, w=16)
    else:
        reload(8), reload(4), reload(2), reload(4, w=32)
    return out


def _compile(config, n, subtract_mean):
    """ptxas's result for `config`'s forward at (8192, n) fp16 rows, compiled as the launcher prepares it."""
    x = torch.empty(64, dtype=torch.float16, device="meta")
    stats = torch.empty(64, dtype=torch.float32, device="meta")
    args = (x, stats if subtract_mean else None, stats, x, x, x if subtract_mean else None, 8192, n, n, 1, n, 1e-5)
    constexprs = dict(SUBTRACT_MEAN=subtract_mean, BLOCK_ROWS=config.block_rows, BLOCK_N=config.block_n, ALIGN=8,
                      RELOAD=config.reload, CHUNKS=config.output_chunks, CACHE_HINTS=config.cache_hints)
    if config.programs_per_sm:
        kernel = norm_forward_kernels.forward_persistent_kernel
        constexprs["PREFETCH"] = config.prefetch
    else:
        kernel = norm_forward_kernels.forward_kernel
    compiled = kernel.compile(*args, target="sm_90a", num_warps=config.num_warps, **constexprs)
    return assemble(compiled.asm["ptx"], "sm_90a")


@pytest.mark.skipif(not ptxas_available(), reason="ptxas is not on the PATH")
@pytest.mark.parametrize("n", [1024, 2048, 4096, 8192, 16384, 32768])
def test_probe_variants_assemble_without_spills(n, tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    for subtract_mean in (True, False):
        for config in _probe_variants(n):
            result = _compile(config, n, subtract_mean)
            assert result.spill_bytes == 0, (config, subtract_mean, result.log)
