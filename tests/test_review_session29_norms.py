"""Review (session 29, norms): a demanding user tried to break the LayerNorm / RMSNorm backward on the CPU (the
kernels in the NumPy interpreter), aiming at the persistent backward's aligned window for 16-bit rows whose length
N is not a multiple of 8 (rows that start off 16-byte boundaries), and at today's change there: a program's tiles
are masked by its FIRST tile's window placement (norm_backward_kernels.backward_persistent_kernel,
_placed_window_loads), which relies on the launcher making (groups * block_rows) a multiple of the window's SHIFT = 8.

Small forced configs (the interpreter plans for 4 SMs) run the same code paths as the shipped 8193..32761-column
configs: clusters of parts, the two-pass parts, whole rows in one pass, 1-, 2- and 4-row tiles, prefetch or not.
Every output and scratch buffer is poisoned (NaN) so that an element no program writes is caught, and every value
is compared with torch in float64. Cases come from peer bug reports (cited next to each test):
FlagOpen/FlagGems#59 (2-row tiles in a LayerNorm backward), BobMcDear/attorch#17 (a row's correction broadcast to
the wrong rows of a multi-row tile) and #18 (per-program dweight partials sized by floor while the grid is a
ceiling: the last block lost), linkedin/Liger-Kernel#945 (persistent partial-sum reduction of dweight/dbias),
pytorch/pytorch#189405 (weight=None with bias.requires_grad; multi-dim normalized_shape in the partials),
flashinfer-ai/flashinfer#634 and Dao-AILab/flash-attention#289 (misaligned vector accesses for hidden sizes and
views off 16-byte boundaries), unslothai/unsloth#4550 (a weight gradient never computed).

DEFECT (fixed in session 29; the test below passes)

1. A split-window backward config with programs_per_sm=0 returns garbage without an error.
   - Repro: norms.norm_backward(..., config=BackwardConfig(False, 1, 32, 1, 0, split_window=True)) for fp16
     LayerNorm rows of 21 columns (7 rows, contiguous; the window applies).
   - Expected: the gradients (as every other backward path gives for programs_per_sm=0: the fused, split and
     persistent launchers take at least one program), or a ValueError naming the field.
   - Actual: dx is never written (NaN where the allocation was poisoned, garbage with torch.empty), dweight and
     dbias are exactly 0.
   - Cause: norm_backward_launcher.backward_launcher, split-window branch: groups =
     round_up(min(cdiv(n_rows, block_rows), target_programs), split_shift) with target_programs = SMs * 0 = 0
     gives a grid of 0 programs and a (0, N) partial buffer whose column sums are 0 (the persistent branch takes
     max(1, target // parts)).
     ForwardConfig documents programs_per_sm=0 as "one program per row tile" for the split window, so the same
     value is natural for the backward.
"""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

import fusedops
import fusedops.nn
from fusedops.dsl.target import assemble, ptxas_available
from fusedops.kernels import norm_backward_config
from fusedops.kernels import norm_backward_kernels
from fusedops.kernels import norm_backward_launcher
from fusedops.kernels import norm_forward_launcher
from fusedops.kernels import norm_split_window as W
from fusedops.kernels import norms
from fusedops.kernels.norm_backward_config import BackwardConfig
from fusedops.kernels.norm_forward_config import ForwardConfig
from helpers import assert_close

from test_norms import (LAYER_NORM, RMS_NORM, _compare, _fresh_launch_caches, _poisoned_cpu_empty, _reference,
                        interpret)  # noqa: F401  (interpret: a fixture)

BC = BackwardConfig
# Persistent backward configs through the aligned window, at 8-column parts (N + 7 window positions).
WINDOW_CONFIGS = {
    "clusters, 1-row tiles, prefetch": BC(False, 1, 8, 1, 1, persistent=True, prefetch=True, cluster=True,
                                          aligned_window=True),
    "clusters, 2-row tiles": BC(False, 2, 8, 1, 1, persistent=True, cluster=True, aligned_window=True),
    "two-pass parts, 4-row tiles, prefetch": BC(False, 4, 8, 1, 1, persistent=True, prefetch=True,
                                                aligned_window=True, chunk=4),
    "whole rows two-pass, 2 programs per SM": BC(False, 2, 64, 1, 2, persistent=True, two_pass=True, chunk=16,
                                                 aligned_window=True),
}


def _at_offset(t: torch.Tensor, offset: int) -> torch.Tensor:
    """A contiguous copy of t whose storage starts `offset` elements into its buffer (rows then start at other
    places relative to 16-byte boundaries than t's)."""
    buffer = torch.full((t.numel() + offset,), float("nan"), dtype=t.dtype)
    view = buffer[offset:].view(t.shape)
    view.copy_(t)
    return view


def _data(op, shape, dtype, seed, weight=True, bias=True, param_dtype=None):
    g = torch.Generator().manual_seed(seed)

    def rand(*s, scale=1.0, shift=0.0):
        return (torch.randn(*s, generator=g, dtype=torch.float64) * scale + shift).to(param_dtype or dtype)

    x = rand(*shape).to(dtype)
    dy = rand(*shape).to(dtype)
    w = rand(shape[-1], scale=0.5, shift=1.0) if weight else None
    b = rand(shape[-1]) if bias and op == LAYER_NORM else None
    return x, w, b, dy


def _forward_config(n_cols):
    return ForwardConfig(False, 1, max(32, 1 << (n_cols + 7).bit_length()), 1)


def _kernel_grads(op, x, w, b, dy, config, grads=(True, True, True), eps=1e-5):
    """(dx, dweight, dbias) of the launchers under `config`, outputs and scratch poisoned."""
    subtract_mean = op == LAYER_NORM
    _, mean, rstd = norms.norm_forward(x, w, b, eps, subtract_mean=subtract_mean,
                                       config=_forward_config(x.shape[-1]), interpret=True,
                                       allocate=_poisoned_cpu_empty)
    return norms.norm_backward(dy, x, w, mean, rstd, subtract_mean=subtract_mean, input_grad=grads[0],
                               weight_grad=w is not None and grads[1], bias_grad=b is not None and grads[2],
                               bias_dtype=None if b is None else b.dtype, config=config, interpret=True,
                               allocate=_poisoned_cpu_empty)


def _check(op, x, w, b, dy, config, eps=1e-5):
    dx, dw, db = _kernel_grads(op, x, w, b, dy, config, eps=eps)
    n = x.shape[-1]
    expected = _reference(op, x, (n,), w, b, eps, dy)
    _compare(op, (n,), (expected[0].to(x.dtype), dx, dw, db), expected, x.dtype)


@pytest.fixture
def spy(monkeypatch):
    """The (grid, constexprs) of every backward_persistent_kernel / backward_split_kernel launch prepared."""
    seen = []
    for kernel in (norm_backward_kernels.backward_persistent_kernel, W.backward_split_kernel):
        def prepare(grid, *args, _original=kernel.prepare, _name=kernel.__name__, **options):
            seen.append((_name, grid, options))
            return _original(grid, *args, **options)
        monkeypatch.setattr(kernel, "prepare", prepare)
    return seen


# =================================================================================================
# Defect (fixed in session 29: the split-window branch takes at least one program)
# =================================================================================================
def test_split_window_backward_with_zero_programs_per_sm_still_computes_the_gradients(seed):
    x, w, b, dy = _data(LAYER_NORM, (7, 21), torch.float16, seed)
    _check(LAYER_NORM, x, w, b, dy, BC(False, 1, 32, 1, 0, split_window=True))


def test_every_other_backward_takes_at_least_one_program_for_zero_programs_per_sm(seed):
    # The contrast cases of the defect: the persistent window, the fused and the split backward.
    x, w, b, dy = _data(LAYER_NORM, (7, 21), torch.float16, seed)
    for config in (BC(False, 1, 32, 1, 0, persistent=True, aligned_window=True), BC(False, 1, 32, 1, 0),
                   BC(True, 1, 8, 1, 0, input_block_rows=1, input_block_n=8, input_num_warps=1)):
        _check(LAYER_NORM, x, w, b, dy, config)


# =================================================================================================
# The aligned window of the persistent backward: shapes, tiles, offsets
# =================================================================================================
@pytest.mark.parametrize("config", list(WINDOW_CONFIGS))
@pytest.mark.parametrize("op", [LAYER_NORM, RMS_NORM])
@pytest.mark.parametrize("n_cols", [1, 7, 9, 15, 17])
def test_window_rows_of_every_placement_ragged_tiles_and_idle_programs(config, op, n_cols, seed, spy):
    # 1 row (7 of 8 groups idle), 3 rows (fewer rows than groups; a 2- or 4-row tile half empty), 19 rows (several
    # tiles a program, the last ragged: FlagGems#59, attorch#17/#18); x and dy at storage offsets that move the row
    # starts against 16-byte boundaries (flash-attention#289): the window's placement is from the row index alone.
    dtype = torch.float16 if n_cols % 2 else torch.bfloat16
    cfg = WINDOW_CONFIGS[config]
    for rows, x_offset, dy_offset in ((1, 0, 0), (3, 1, 5), (19, 3, 0), (19, 0, 7)):
        x, w, b, dy = _data(op, (rows, n_cols), dtype, seed + rows)
        spy.clear()
        _check(op, _at_offset(x, x_offset), w, b, _at_offset(dy, dy_offset), cfg)
        (name, (grid,), options), = spy
        assert name == "backward_persistent_kernel" and options["SHIFT"] == 8
        parts = -(-(n_cols + 7) // cfg.block_n)
        if options.get("EDGES"):    # (clusters since session 42: the split window's whole vectors, N - 1 positions)
            parts = options["CLUSTER"]
            assert parts == -(-(n_cols - 1) // cfg.block_n)
        assert grid % parts == 0 and (grid // parts) * cfg.block_rows % 8 == 0, (grid, parts)


@pytest.mark.parametrize("op", [LAYER_NORM, RMS_NORM])
def test_many_tiles_a_program_at_odd_row_counts(op, seed, spy):
    # 8 groups of 2-row tiles over 101 rows: each program walks 6-7 tiles, all at its first tile's window placement.
    x, w, b, dy = _data(op, (101, 23), torch.float16, seed)
    _check(op, x, w, b, dy, WINDOW_CONFIGS["clusters, 2-row tiles"])
    assert spy[0][2]["SHIFT"] == 8


@pytest.mark.parametrize("op", [LAYER_NORM, RMS_NORM])
@pytest.mark.parametrize("x_layout, dy_layout, window", [
    ("rows", "sliced", False), ("sliced", "rows", False), ("rows", "transposed", False), ("transposed", "rows", False),
    ("offset", "rows", True), ("rows", "expanded", False), ("expanded", "rows", False)])
def test_window_only_where_x_and_dy_are_both_rows_of_stride_n(op, x_layout, dy_layout, window, seed, spy):
    # Only one of x and dy laid out as rows of stride N (kernl#193-style strided inputs): no window, the plain
    # addressing, the same values.
    x, w, b, dy = _data(op, (9, 21), torch.float16, seed)

    def lay_out(t, layout):
        if layout == "sliced":
            wide = torch.zeros(9, 29, dtype=t.dtype)
            wide[:, 3:24] = t
            return wide[:, 3:24]
        if layout == "transposed":
            return t.t().contiguous().t()
        if layout == "offset":
            return _at_offset(t, 5)
        if layout == "expanded":
            return t[4:5].expand(9, 21)
        return t

    _check(op, lay_out(x, x_layout), w, b, lay_out(dy, dy_layout), WINDOW_CONFIGS["clusters, 2-row tiles"])
    assert (spy[0][2]["SHIFT"] == 8) == window


@pytest.mark.parametrize("op", [LAYER_NORM, RMS_NORM])
@pytest.mark.parametrize("config", ["clusters, 1-row tiles, prefetch", "two-pass parts, 4-row tiles, prefetch"])
def test_float32_and_float64_rows_through_their_window(op, config, seed, spy):
    # The window is written for any element size: SHIFT 4 (float32) and 2 (float64) rows off 16-byte boundaries.
    for dtype, shift in ((torch.float32, 4), (torch.float64, 2)):
        x, w, b, dy = _data(op, (13, 11), dtype, seed)
        spy.clear()
        _check(op, _at_offset(x, 1), w, b, dy, WINDOW_CONFIGS[config])
        assert spy[0][2]["SHIFT"] == shift


# =================================================================================================
# Which gradients, which parameters
# =================================================================================================
@pytest.mark.parametrize("op", [LAYER_NORM, RMS_NORM])
@pytest.mark.parametrize("weight, bias", [(True, True), (True, False), (False, True), (False, False)])
@pytest.mark.parametrize("grads", [(True, False, False), (False, True, True), (False, False, True)], ids=str)
def test_each_gradient_alone_through_the_window(op, weight, bias, grads, seed):
    # pytorch#189405 (weight None with the bias's gradient), unsloth#4550 (a weight gradient never computed).
    if op == RMS_NORM and bias:
        pytest.skip("RMSNorm has no bias")
    x, w, b, dy = _data(op, (11, 17), torch.bfloat16, seed, weight, bias)
    dx, dw, db = _kernel_grads(op, x, w, b, dy, WINDOW_CONFIGS["clusters, 1-row tiles, prefetch"], grads)
    expected = _reference(op, x, (17,), w, b, 1e-5, dy)
    for got, want, asked in zip((dx, dw, db), expected[1:], grads):
        assert (got is None) == (want is None or not asked)
        if got is not None:
            assert_close(got, want, torch.bfloat16)


@pytest.mark.parametrize("op", [LAYER_NORM, RMS_NORM])
def test_float32_parameters_of_a_half_input_through_the_window(op, seed):
    # torch's CPU "mixed" LayerNorm (and any rms_norm weight dtype): dweight and dbias in float32.
    x, w, b, dy = _data(op, (10, 21), torch.float16, seed, param_dtype=torch.float32)
    x, dy = x.half(), dy.half()
    dx, dw, db = _kernel_grads(op, x, w, b, dy, WINDOW_CONFIGS["clusters, 2-row tiles"])
    expected = _reference(op, x, (21,), w, b, 1e-5, dy)
    assert_close(dx, expected[1], torch.float16)
    assert dw.dtype == torch.float32
    assert_close(dw, expected[2], torch.float32)
    if b is not None:
        assert db.dtype == torch.float32
        assert_close(db, expected[3], torch.float32)


@pytest.fixture
def forced_window(interpret, monkeypatch):
    """The public functions and modules with the persistent window backward forced (2-row tiles in clusters)."""
    _fresh_launch_caches(monkeypatch)
    monkeypatch.setattr(norm_forward_launcher, "forward_config", lambda n, d, **_: _forward_config(n))
    monkeypatch.setattr(norm_backward_launcher, "backward_config",
                        lambda n, d, **_: WINDOW_CONFIGS["clusters, 2-row tiles"])


@pytest.mark.parametrize("op", [LAYER_NORM, RMS_NORM])
@pytest.mark.parametrize("shape, normalized", [((5, 21), (21,)), ((2, 3, 3, 7), (3, 7)), ((4, 1, 21), (1, 21))],
                         ids=str)
@pytest.mark.parametrize("loss", ["sum", "mean", "weighted"])
def test_public_functions_with_losses_that_expand_the_gradient(forced_window, op, shape, normalized, loss, seed, spy):
    # y.sum(): dy of stride (0, 0), read in place (no window); y.mean() (autograd divides the expanded gradient: a
    # contiguous dy) and a weighted loss: through the window (multi-dim normalized_shape, pytorch#189405: dweight
    # shaped like the weight).
    x, _, _, _ = _data(op, shape, torch.float16, seed)
    g = torch.Generator().manual_seed(seed + 1)
    w = (torch.randn(normalized, generator=g) * 0.5 + 1).half()
    b = torch.randn(normalized, generator=g).half() if op == LAYER_NORM else None
    weights = torch.randn(shape, generator=g, dtype=torch.float64)
    results = []
    for module, dtype in ((fusedops, torch.float16), (F, torch.float64)):
        leaves = [t.detach().to(dtype).requires_grad_() for t in (x, w, b) if t is not None]
        args = leaves + [None] * (3 - len(leaves))
        y = (module.layer_norm(args[0], normalized, args[1], args[2]) if op == LAYER_NORM
             else module.rms_norm(args[0], normalized, args[1]))
        (y.sum() if loss == "sum" else y.mean() if loss == "mean" else (y * weights.to(dtype)).sum()).backward()
        results.append([t.grad for t in leaves])
    for ours, reference in zip(*results):
        assert ours.shape == reference.shape
        assert_close(ours, reference, torch.float16)
    assert any(options["SHIFT"] == 8 for _, _, options in spy) == (loss != "sum")


@pytest.mark.parametrize("kind", ["layer", "layer no bias", "layer no affine", "rms", "rms no affine"])
def test_modules_with_only_the_parameters_requiring_grad(forced_window, kind, seed):
    affine = "no affine" not in kind
    if kind.startswith("layer"):
        ours = fusedops.nn.LayerNorm(21, elementwise_affine=affine, bias="no bias" not in kind, dtype=torch.float16)
        theirs = torch.nn.LayerNorm(21, elementwise_affine=affine, bias="no bias" not in kind, dtype=torch.float64)
    else:
        ours = fusedops.nn.RMSNorm(21, elementwise_affine=affine, dtype=torch.float16)
        theirs = torch.nn.RMSNorm(21, elementwise_affine=affine, dtype=torch.float64)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p, q in zip(ours.parameters(), theirs.parameters()):
            p.copy_(torch.randn(p.shape, generator=g) * 0.5 + 1)
            q.copy_(p)
    # x requires grad only without parameters: else only the parameters' gradients are asked for
    x = torch.randn(6, 3, 21, generator=g).half().requires_grad_(not affine)
    x64 = x.detach().double().requires_grad_(not affine)
    dy = torch.randn(6, 3, 21, generator=g).half()
    ours(x).backward(dy)
    theirs(x64).backward(dy.double())
    pairs = list(zip(ours.parameters(), theirs.parameters())) + ([] if affine else [(x, x64)])
    assert pairs
    for p, q in pairs:
        assert p.grad is not None
        assert_close(p.grad, q.grad, torch.float16)


# =================================================================================================
# Special values, determinism
# =================================================================================================
@pytest.mark.parametrize("op", [LAYER_NORM, RMS_NORM])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_non_finite_row_does_not_leak_into_rows_sharing_its_vectors(op, bad, seed):
    # Row 3 of 21 fp16 columns shares 16-byte vectors with rows 2 and 4: the window reads them masked. dbias does not
    # depend on x at all, so it must stay finite and exact.
    x, w, b, dy = _data(op, (9, 21), torch.float16, seed)
    x[3, 10] = bad
    config = WINDOW_CONFIGS["clusters, 2-row tiles"]
    dx, _, db = _kernel_grads(op, x, w, b, dy, config, grads=(True, False, True))
    expected = _reference(op, x, (21,), w, b, 1e-5, dy)
    others = [r for r in range(9) if r != 3]
    assert torch.isfinite(dx[others]).all()
    assert_close(dx[others], expected[1][others], torch.float16)
    assert not torch.isfinite(dx[3]).any()
    if b is not None:
        assert_close(db, expected[3], torch.float16)


@pytest.mark.parametrize("op", [LAYER_NORM, RMS_NORM])
def test_zero_row_with_tiny_eps_through_the_window(op, seed):
    # rstd = 1e6 for a row of zeros (TF PR #24979-style tiny eps): no NaN anywhere, the other rows unaffected.
    x, w, b, dy = _data(op, (6, 15), torch.float16, seed)
    x[2] = 0
    dx, dw, db = _kernel_grads(op, x, w, b, dy, WINDOW_CONFIGS["two-pass parts, 4-row tiles, prefetch"], eps=1e-12)
    for t in (dx, dw, db):
        assert t is None or not torch.isnan(t).any()
    expected = _reference(op, x, (15,), w, b, 1e-12, dy)
    assert_close(dx[[0, 1, 3, 4, 5]], expected[1][[0, 1, 3, 4, 5]], torch.float16)
    assert_close(dw, expected[2], torch.float16)        # the zero row's xhat is 0: no contribution


@pytest.mark.parametrize("op", [LAYER_NORM, RMS_NORM])
def test_half_weight_and_bias_gradients_overflow_exactly_where_the_reference_does(op, seed):
    # Large |dy * xhat| sums over 40 rows: some columns past float16's range (inf, as torch's), others just below.
    x, w, b, dy = _data(op, (40, 21), torch.float16, seed)
    x[:, :5] = torch.tensor([300.0, -300.0, 250.0, 0.0, 100.0], dtype=torch.float16)
    dy[:, :10] = 2000
    dx, dw, db = _kernel_grads(op, x, w, b, dy, WINDOW_CONFIGS["clusters, 1-row tiles, prefetch"])
    expected = _reference(op, x, (21,), w, b, 1e-5, dy)
    assert torch.isinf(dw).any() and torch.isfinite(dw).any()
    assert torch.equal(torch.isinf(dw), torch.isinf(expected[2].half()))
    assert_close(dw, expected[2].half(), torch.float16)
    if b is not None:
        assert torch.isinf(db[:10]).all()
        assert_close(db, expected[3].half(), torch.float16)
    assert_close(dx, expected[1], torch.float16)


@pytest.mark.parametrize("config", ["clusters, 2-row tiles", "two-pass parts, 4-row tiles, prefetch"])
def test_bitwise_deterministic_and_independent_of_the_storage_offset(config, seed):
    # The same values at other storage offsets take the same programs and the same summation order.
    x, w, b, dy = _data(LAYER_NORM, (37, 19), torch.float16, seed)
    first = _kernel_grads(LAYER_NORM, x, w, b, dy, WINDOW_CONFIGS[config])
    for x_offset, dy_offset in ((0, 0), (1, 3), (6, 6)):
        again = _kernel_grads(LAYER_NORM, _at_offset(x, x_offset), w, b, _at_offset(dy, dy_offset),
                              WINDOW_CONFIGS[config])
        for a, e in zip(again, first):
            assert torch.equal(a, e)


@pytest.mark.parametrize("op", [LAYER_NORM, RMS_NORM])
@pytest.mark.parametrize("n_cols", [8193, 16383])
def test_default_backward_of_long_odd_rows_at_an_odd_storage_offset(interpret, op, n_cols, seed):
    # The shipped window configs (clusters of 2048- and 4096-column parts) on rows shifted by one element.
    config = norm_backward_config.backward_config(n_cols, torch.float16, subtract_mean=op == LAYER_NORM)
    assert config.persistent and config.cluster and config.aligned_window
    x, w, b, dy = _data(op, (11, n_cols), torch.float16, seed)
    x, dy = _at_offset(x, 1), _at_offset(dy, 3)
    leaves = [t.detach().clone().requires_grad_() for t in (x, w, b) if t is not None]
    y = (fusedops.layer_norm(leaves[0], (n_cols,), leaves[1], leaves[2]) if op == LAYER_NORM
         else fusedops.rms_norm(leaves[0], (n_cols,), leaves[1]))
    y.backward(dy)
    expected = _reference(op, x, (n_cols,), w, b, 1e-5, dy)
    for leaf, want in zip(leaves, expected[1:]):
        assert_close(leaf.grad, want, torch.float16)


# =================================================================================================
# The compiled window kernel
# =================================================================================================
@pytest.mark.skipif(not ptxas_available(), reason="ptxas is not on the PATH")
def test_window_kernel_keeps_vectors_only_for_a_16_byte_aligned_base(tmp_path, monkeypatch):
    # The window's placement is from the row index, not the address (flashinfer#634: vectors on misaligned
    # addresses): a view starting one element into its buffer must compile without 16-byte vector accesses.
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    n = 1001
    buffer = torch.empty(64 * n + 8, dtype=torch.float16)
    stats = torch.empty(64)
    counts = {}
    for offset in (0, 1):
        x = buffer[offset:offset + 64 * n]
        compiled = norm_backward_kernels.backward_persistent_kernel.compile(
            x, stats, stats, x, x, x, stats, stats, 64, n, 8, 1, n, 1, n, 1, n, target="sm_90a", num_warps=4,
            SUBTRACT_MEAN=True, BLOCK_ROWS=1, BLOCK_N=1024, TWO_PASS=False, CHUNK=1024, PREFETCH=True, SHIFT=8)
        ptx = compiled.asm["ptx"]
        counts[offset] = tuple(len(re.findall(rf"{access}\.global[.\w:]*\.v4", ptx)) for access in ("ld", "st"))
        assemble(ptx, "sm_90a")
    assert counts[0][0] > 0 and counts[0][1] > 0
    assert counts[1] == (0, 0)
