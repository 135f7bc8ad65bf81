"""Review of session 5 (softmax row sweeps with L2 hints / reverse / launch bounds, dsl cache hints,
dsl.launch_bounds): cases a demanding user tries, kept as regression tests.

CPU tier: the row sweeps at small forced configs that mimic the shipped ones (chunks of 16-128,
1-4 warps, reverse, hints, min_blocks) against float64 over odd lengths, every row alignment,
strided/split/expanded layouts and special values; the public API on rows past 16384 columns
through the interpreter; every cache_modifier x eviction_policy combination through ptxas, for
scalar pointers and 1/8-byte element types; launch_bounds that cannot fit on an SM as a clear error.
"""

from __future__ import annotations

import itertools
import re

import pytest
import torch

import fusedops
import fusedops.dsl as dsl
from fusedops.dsl.errors import CompilationError
from fusedops.dsl.target import assemble, ptxas_available
from fusedops.kernels import softmax as K
from fusedops.kernels.softmax_configs import L2_HINTS, Config
from fusedops.kernels.softmax_kernels import _backward_kernel, _forward_kernel
from helpers import assert_close, random_tensor
from test_softmax import poisoned_outputs  # noqa: F401  (fixture)

needs_ptxas = pytest.mark.skipif(not ptxas_available(), reason="ptxas is not installed")


@pytest.fixture
def interpret(monkeypatch):
    monkeypatch.setenv("FUSEDOPS_INTERPRET", "1")


def _reference(x, dim, log):
    return (torch.log_softmax if log else torch.softmax)(x.double(), dim)


def _reference_backward(y, dy, dim, log):
    y, dy = y.detach().double(), dy.double()
    if log:
        return dy - torch.exp(y) * dy.sum(dim, keepdim=True)
    return y * (dy - (dy * y).sum(dim, keepdim=True))


# ------------------------------------------------------------------------------------------------
# Softmax row sweeps at small forced configs
# ------------------------------------------------------------------------------------------------
def _config(block, warps, programs_per_sm=2, hints=True, reverse=False, min_blocks=0):
    return Config("rows", 1, block, False, warps, programs_per_sm, L2_HINTS if hints else (), reverse, min_blocks)


# (config, dtype, output dtype, n_cols, rows, start offset of the rows in their storage, row padding)
SWEEP_CASES = {
    "shipped_like_64_w2_pps64_lb2": (_config(64, 2, 64, min_blocks=2), torch.float16, None, 1001, 5, 0, 0),
    "reverse_odd_offset": (_config(128, 4, 1, reverse=True), torch.bfloat16, None, 517, 3, 5, 2),
    "no_hints_one_short_row": (_config(64, 1, 2, hints=False), torch.float16, None, 7, 3, 3, 0),
    "fp16_in_fp32_out": (_config(128, 2, 2, reverse=True, min_blocks=2), torch.float16, torch.float32, 389, 4, 1, 0),
    "aligned_rows_tail": (_config(128, 4, 64), torch.bfloat16, None, 1029, 3, 0, 3),
    "fp32_rows": (_config(16, 1, 1, reverse=True), torch.float32, None, 61, 6, 2, 1),
}


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("case", SWEEP_CASES, ids=str)
def test_row_sweeps_forced_configs(case, log, seed, interpret, poisoned_outputs):  # noqa: F811
    config, dtype, out_dtype, n, rows, offset, pad = SWEEP_CASES[case]
    x = random_tensor((rows, offset + n + pad), dtype, seed=seed, scale=3.0)[:, offset:offset + n]
    y = K.softmax_forward(x, 1, log=log, dtype=out_dtype, config=config)
    assert_close(y, _reference(x, 1, log), out_dtype or dtype)
    dy = random_tensor(y.shape, y.dtype, seed=seed + 1)
    dx = K.softmax_backward(dy, y, 1, log=log, dtype=dtype, config=config)
    assert_close(dx, _reference_backward(y, dy, 1, log), dtype)


def test_row_sweeps_rows_at_every_alignment_forward_and_backward(seed, interpret, poisoned_outputs):  # noqa: F811
    # fp16 rows of 45 starting at every element offset mod 8 (SHIFT windows), chunks of 16 at 1 warp, reversed
    config = _config(16, 1, 1, reverse=True)
    for offset in range(9):
        x = random_tensor((2, 64), torch.float16, seed=seed + offset, scale=3.0)[:, offset:offset + 45]
        for log in (False, True):
            y = K.softmax_forward(x, 1, log=log, config=config)
            assert_close(y, _reference(x, 1, log), torch.float16)
            dy = random_tensor(y.shape, torch.float16, seed=seed)
            assert_close(K.softmax_backward(dy, y, 1, log=log, config=config), _reference_backward(y, dy, 1, log),
                         torch.float16)


@pytest.mark.parametrize("view", ["split_rows", "transposed", "expanded_dy", "expanded_x"])
def test_row_sweeps_layouts(view, seed, interpret, poisoned_outputs):  # noqa: F811
    config = _config(64, 2, 2, reverse=True, min_blocks=2)
    dim, n = 1, 301
    if view == "split_rows":        # other dims that do not merge: an inner index (SPLIT)
        x, dim = random_tensor((2, 4, n), torch.float16, seed=seed, scale=3.0)[:, :3, :], 2
    elif view == "transposed":      # reduced dim strided (col stride 3)
        x, dim = random_tensor((n, 3), torch.bfloat16, seed=seed, scale=3.0).t(), 1
    elif view == "expanded_x":      # row stride 0
        x = random_tensor((1, n), torch.bfloat16, seed=seed, scale=3.0).expand(3, n)
    else:
        x = random_tensor((3, n), torch.float16, seed=seed, scale=3.0)
    for log in (False, True):
        y = K.softmax_forward(x, dim, log=log, config=config)
        assert_close(y, _reference(x, dim, log), x.dtype)
        dy = random_tensor(y.shape, y.dtype, seed=seed + 1)
        if view == "expanded_dy":
            dy = dy[:1].expand(y.shape)
        assert_close(K.softmax_backward(dy, y, dim, log=log, config=config), _reference_backward(y, dy, dim, log),
                     x.dtype)


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_row_sweeps_special_values(log, seed, interpret):
    x = random_tensor((6, 200), torch.bfloat16, seed=seed, scale=3.0)
    x[0] = -float("inf")
    x[1, :190] = -float("inf")          # the chunks see only -inf, the tail does not
    x[2, 17] = float("inf")             # NaN row, like torch
    x[3, 5] = float("nan")
    x[4] += 1e4
    x[5] -= 1e4
    y = K.softmax_forward(x, 1, log=log, config=_config(64, 1, 1, reverse=True))
    expected = _reference(x, 1, log)
    assert torch.equal(torch.isnan(y), torch.isnan(expected)) and torch.equal(torch.isinf(y), torch.isinf(expected))
    finite = torch.isfinite(expected)
    assert_close(y[finite], expected[finite], torch.bfloat16)


@pytest.mark.parametrize("n_cols, dtype, offset", [(16385, torch.float16, 3), (50257, torch.bfloat16, 0)])
def test_public_api_long_rows_through_the_interpreter(n_cols, dtype, offset, seed, interpret):
    # rows past 16384 columns: the shipped row sweeps (16384-column chunks), forward and autograd backward
    base = random_tensor((2, n_cols + offset), dtype, seed=seed, scale=4.0).requires_grad_()
    x = base[:, offset:]
    for log in (False, True):
        y = (fusedops.log_softmax if log else fusedops.softmax)(x, -1)
        assert_close(y, _reference(x.detach(), -1, log), dtype)
        dy = random_tensor(y.shape, dtype, seed=seed + 1)
        (grad,) = torch.autograd.grad(y, base, dy)
        assert_close(grad[:, offset:], _reference_backward(y, dy, -1, log), dtype)


@needs_ptxas
@pytest.mark.parametrize("direction, dtypes", [
    ("forward", (torch.float16, torch.float32)),                    # x fp16, y fp32 (dtype=torch.float32)
    ("backward", (torch.bfloat16, torch.bfloat16, torch.float32)),  # y, dy bf16, dx fp32
])
def test_shipped_32768_sweeps_with_mixed_dtypes_assemble(direction, dtypes):
    backward = direction == "backward"
    strides = ((32768, 1),) * len(dtypes)
    launch = K._plan_launch((8192, 32768), 1, strides, dtypes, backward, True, None, None, sm_count=132)
    assert launch.constexprs["PERSISTENT"] and launch.config.sweep_hints == L2_HINTS
    pointers = [torch.empty(16, dtype=d, device="meta") for d in dtypes][::-1]     # kernel order
    kernel = _backward_kernel if backward else _forward_kernel
    ptx = kernel.compile(*pointers, *launch.arguments, target="sm_90a", **launch.constexprs).asm["ptx"]
    result = assemble(ptx, "sm_90a")
    assert result.spill_bytes <= 8
    assert "ld.global.L1::evict_last.L2::cache_hint.v4.b32" in ptx
    assert "ld.global.L1::evict_first.L2::cache_hint.v4.b32" in ptx and "st.global.cs.v4.b32" in ptx
    if launch.config.min_blocks_per_sm:
        assert f".minnctapersm {launch.config.min_blocks_per_sm}" in ptx


# ------------------------------------------------------------------------------------------------
# cache_modifier / eviction_policy
# ------------------------------------------------------------------------------------------------
@dsl.jit
def _hinted(y_ptr, x_ptr, n, BLOCK: dsl.constexpr, LOAD_CACHE: dsl.constexpr, LOAD_EVICTION: dsl.constexpr,
            STORE_CACHE: dsl.constexpr, STORE_EVICTION: dsl.constexpr, MASKED: dsl.constexpr, SCALAR: dsl.constexpr):
    if SCALAR:
        offsets = dsl.program_id(0)
    else:
        offsets = dsl.program_id(0) * BLOCK + dsl.arange(0, BLOCK)
    if MASKED:
        x = dsl.load(x_ptr + offsets, mask=offsets < n, cache_modifier=LOAD_CACHE, eviction_policy=LOAD_EVICTION)
        dsl.store(y_ptr + offsets, x, mask=offsets < n, cache_modifier=STORE_CACHE, eviction_policy=STORE_EVICTION)
    else:
        x = dsl.load(x_ptr + offsets, cache_modifier=LOAD_CACHE, eviction_policy=LOAD_EVICTION)
        dsl.store(y_ptr + offsets, x, cache_modifier=STORE_CACHE, eviction_policy=STORE_EVICTION)


LOADS = list(itertools.product(["", ".ca", ".cg", ".cs", ".lu", ".cv"], ["", "evict_first", "evict_last",
                                                                         "evict_normal"]))
STORES = list(itertools.product(["", ".wb", ".cg", ".cs", ".wt"], ["", "evict_first", "evict_last", "evict_normal"]))


def _expected(cache, eviction):
    if eviction in ("evict_first", "evict_last"):
        return (cache or f".L1::{eviction}") + ".L2::cache_hint"
    return cache or (f".L1::{eviction}" if eviction else "")


def _check_hinted(dtype, masked, scalar, load, store):
    x = torch.empty(4096, dtype=dtype, device="meta")
    ptx = _hinted.compile(x, x, 4095 if masked else 4096, BLOCK=256, LOAD_CACHE=load[0], LOAD_EVICTION=load[1],
                          STORE_CACHE=store[0], STORE_EVICTION=store[1], MASKED=masked, SCALAR=scalar,
                          target="sm_90a", num_warps=1).asm["ptx"]
    for kind, hint in (("ld", load), ("st", store)):
        found = set(re.findall(rf"{kind}\.global((?:\.(?:c[agsv]|lu|w[bt]|L[12]::\w+))*)\.", ptx))
        assert found == {_expected(*hint)}, (kind, hint, found)
    assemble(ptx, "sm_90a")


@needs_ptxas
@pytest.mark.parametrize("masked", [False, True])
def test_every_cache_hint_combination_assembles(masked, tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    for i in range(len(LOADS)):
        _check_hinted(torch.float16, masked, False, LOADS[i], STORES[i % len(STORES)])


@needs_ptxas
@pytest.mark.parametrize("dtype", [torch.int8, torch.bool, torch.float64], ids=str)
@pytest.mark.parametrize("scalar", [False, True], ids=["block", "scalar"])
def test_cache_hints_on_other_element_types_and_scalar_pointers(dtype, scalar, tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    for load, store in (((".cg", "evict_last"), ("", "evict_first")), (("", "evict_normal"), (".wt", "evict_last"))):
        _check_hinted(dtype, True, scalar, load, store)


# ------------------------------------------------------------------------------------------------
# launch_bounds
# ------------------------------------------------------------------------------------------------
@dsl.jit
def _bounded_add(y_ptr, x_ptr, n, BLOCK: dsl.constexpr, MIN_BLOCKS: dsl.constexpr, WHERE: dsl.constexpr):
    offsets = dsl.program_id(0) * BLOCK + dsl.arange(0, BLOCK)
    if WHERE == "runtime_if":
        if n > 5:
            dsl.launch_bounds(MIN_BLOCKS)
    elif WHERE == "loop":
        for _ in range(0, n):
            dsl.launch_bounds(MIN_BLOCKS)
    elif WHERE == "arithmetic":
        dsl.launch_bounds(MIN_BLOCKS * 2 - MIN_BLOCKS)
    else:
        dsl.launch_bounds(MIN_BLOCKS)
    dsl.store(y_ptr + offsets, dsl.load(x_ptr + offsets, mask=offsets < n) + 1.0, mask=offsets < n)


def _bounded_ptx(min_blocks, num_warps, where="top"):
    x = torch.empty(16, dtype=torch.float32, device="meta")
    return _bounded_add.compile(x, x, 100, BLOCK=1024, MIN_BLOCKS=min_blocks, WHERE=where, num_warps=num_warps,
                                target="sm_90a").asm["ptx"]


@pytest.mark.parametrize("min_blocks, num_warps", [(3, 32), (8, 16), (32, 4), (32, 32)])
def test_launch_bounds_that_cannot_fit_are_a_clear_error(min_blocks, num_warps, tmp_path, monkeypatch):
    # ptxas only warns ("Value of threads per SM ... is out of range. .minnctapersm will be ignored")
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    with pytest.raises(CompilationError, match="do not fit on one SM"):
        _bounded_ptx(min_blocks, num_warps)


@needs_ptxas
@pytest.mark.parametrize("min_blocks, num_warps, where", [(2, 32, "top"), (32, 2, "top"), (3, 4, "runtime_if"),
                                                          (3, 4, "loop"), (5, 8, "arithmetic")])
def test_launch_bounds_that_fit_reach_ptxas_without_warnings(min_blocks, num_warps, where, tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    ptx = _bounded_ptx(min_blocks, num_warps, where)
    assert f".minnctapersm {min_blocks}" in ptx and f".maxntid {32 * num_warps}, 1, 1" in ptx
    assert "out of range" not in assemble(ptx, "sm_90a").log


def test_launch_bounds_in_the_interpreter(seed):
    # the interpreter ignores the directive (even one that could not fit on an SM)
    x = random_tensor((1000,), torch.float32, seed=seed)
    y = torch.full_like(x, float("nan"))
    _bounded_add[(1,)](y, x, 1000, BLOCK=1024, MIN_BLOCKS=32, WHERE="top", num_warps=32, interpret=True)
    assert_close(y, x.double() + 1, torch.float32)


# ------------------------------------------------------------------------------------------------
# GPU tier
# ------------------------------------------------------------------------------------------------
@pytest.fixture
def compiled(monkeypatch):
    monkeypatch.delenv("FUSEDOPS_INTERPRET", raising=False)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_gpu_shipped_sweeps_more_rows_than_the_grid(dtype, seed, compiled):
    # 32768 columns: 64 programs per SM and 2 CTAs per SM, so past 64 x SMs rows each program loops over rows
    x = random_tensor((9001, 32768), dtype, "cuda", seed, scale=2.0).requires_grad_()
    for log in (False, True):
        y = (fusedops.log_softmax if log else fusedops.softmax)(x, -1)
        dy = random_tensor(y.shape, dtype, "cuda", seed + 1)
        (grad,) = torch.autograd.grad(y, x, dy)
        for start in (0, 4500, 9001 - 64):
            rows = slice(start, start + 64)
            assert_close(y[rows], _reference(x[rows].detach(), -1, log), dtype)
            assert_close(grad[rows], _reference_backward(y[rows], dy[rows], -1, log), dtype)


@pytest.mark.cuda
@pytest.mark.parametrize("config", [
    Config("rows", 1, 16384, False, 16, 2, L2_HINTS, True, 2),
    Config("rows", 1, 16384, False, 32, 1, L2_HINTS, True),
    Config("rows", 1, 8192, False, 16, 64, L2_HINTS, False, 3),
], ids=str)
@pytest.mark.parametrize("n_cols, offset, out_dtype", [(50257, 3, None), (40000, 0, torch.float32), (16391, 5, None)])
def test_gpu_sweeps_reverse_bounds_and_mixed_dtypes(config, n_cols, offset, out_dtype, seed, compiled,
                                                     poisoned_outputs):  # noqa: F811
    x = random_tensor((67, n_cols + offset), torch.float16, "cuda", seed, scale=2.0)[:, offset:]
    for log in (False, True):
        y = K.softmax_forward(x, 1, log=log, dtype=out_dtype, config=config)
        assert_close(y, _reference(x, 1, log), out_dtype or torch.float16)
        dy = random_tensor(y.shape, y.dtype, "cuda", seed + 1)
        dx = K.softmax_backward(dy, y, 1, log=log, dtype=torch.float16, config=config)
        assert_close(dx, _reference_backward(y, dy, 1, log), torch.float16)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.int8, torch.bool, torch.float64], ids=str)
@pytest.mark.parametrize("scalar", [False, True], ids=["block", "scalar"])
def test_gpu_cache_hints_on_other_element_types(dtype, scalar):
    x = (torch.arange(4096, device="cuda") % 7).to(dtype)
    for load, store in zip(LOADS, STORES + STORES):
        y = torch.zeros_like(x)
        grid = (4095,) if scalar else (16,)
        _hinted[grid](y, x, 4095, BLOCK=256, LOAD_CACHE=load[0], LOAD_EVICTION=load[1], STORE_CACHE=store[0],
                      STORE_EVICTION=store[1], MASKED=True, SCALAR=scalar, num_warps=1)
        assert torch.equal(y[:4095], x[:4095]) and y[4095] == 0, (load, store)
