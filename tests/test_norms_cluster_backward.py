"""The LayerNorm / RMSNorm backward of long 16-bit rows in thread block clusters (BackwardConfig.cluster:
the parts of a row in one cluster, their row sums added by dsl.cluster_sum).

CPU tier: the default config at 16384 columns in the interpreter against float64, the fallback where a
device has no clusters. GPU tier: poisoned outputs against float64 at ragged sizes (clusters of 2 to 8),
run-to-run determinism, and the resident-cluster count the launcher sizes its grid by (strided and
expanded views: test_norms.py's test_gpu_strided_and_expanded). (Forced small cluster configs: test_norms.py's VARIANTS; the DSL op: test_cluster_sum_*.py.)
"""

from __future__ import annotations

import pytest
import torch

from fusedops.kernels import norm_backward_config
from fusedops.kernels import norm_backward_kernels
from fusedops.kernels import norm_backward_launcher
from fusedops.kernels import norms
from fusedops.kernels.norm_backward_config import BackwardConfig
from fusedops.kernels.norm_forward_config import ForwardConfig
from helpers import poison

from test_norms import (LAYER_NORM, RMS_NORM, _check, _check_with_configs, _compare, _inputs, _poisoned_empty,
                        _reference, interpret)  # noqa: F401  (interpret: a fixture)

HALF_DTYPES = [torch.float16, torch.bfloat16]


def _backward(op, x, w, b, dy, allocate=_poisoned_empty):
    subtract_mean = op == LAYER_NORM
    y, mean, rstd = norms.norm_forward(x, w, b, 1e-5, subtract_mean=subtract_mean, allocate=allocate)
    grads = norms.norm_backward(dy, x, w, mean, rstd, subtract_mean=subtract_mean, input_grad=True,
                                weight_grad=w is not None, bias_grad=b is not None, bias_dtype=x.dtype,
                                allocate=allocate)
    return (y,) + tuple(grads)


@pytest.mark.parametrize("op", [LAYER_NORM, RMS_NORM])
@pytest.mark.parametrize("n_cols", [16384, 16392, 12289, 16383])
def test_default_half_backward_in_clusters(interpret, op, n_cols, seed):
    # 16384-column rows in 8 parts of 2048 columns; rows off 16-byte boundaries whose aligned window (N + 7
    # positions at most) fits 8 such parts too (12289: 6 parts of whole vectors and the edges); else 4096-column
    # parts (16392: 5 parts, the last of 8 columns; 16383: 4 parts of whole vectors)
    config = norm_backward_config.backward_config(n_cols, torch.float16, subtract_mean=op == LAYER_NORM)
    in_2048 = n_cols == 16384 or (n_cols % 8 != 0 and n_cols + 7 <= 8 * 2048)
    assert config.cluster and config.persistent and config.block_n == (2048 if in_2048 else 4096)
    assert config.prefetch
    assert config.aligned_window == (n_cols % 8 != 0)
    _check(op, (3, n_cols), (n_cols,), torch.float16, seed)


def test_devices_without_clusters_take_the_split_backward(monkeypatch):
    monkeypatch.setattr(norm_backward_launcher, "_has_clusters", lambda device, interpret: False)
    launched = []
    monkeypatch.setattr(norm_backward_kernels.backward_partials_kernel, "prepare",
                        lambda *a, **k: launched.append("split") or None)
    monkeypatch.setattr(norm_backward_kernels.backward_input_kernel, "prepare", lambda *a, **k: None)
    monkeypatch.setattr(norm_backward_kernels.backward_persistent_kernel, "prepare",
                        lambda *a, **k: launched.append("cluster") or None)
    x = torch.zeros(4, 16384, dtype=torch.float16)
    rstd = torch.ones(4)
    norm_backward_launcher.backward_launcher(x, x, None, torch.zeros(4), rstd, True, True, False, False, None, None,
                                             None, False, torch.empty)
    assert launched == ["split"]


@pytest.mark.parametrize("op", [LAYER_NORM, RMS_NORM])
@pytest.mark.parametrize("block_rows", [1, 2])
def test_window_programs_walk_rows_of_one_window_offset(op, block_rows, seed, monkeypatch):
    # The persistent backward masks every tile of a program by its first tile's window placement (computed
    # once): that needs groups * block_rows to be a multiple of the window's SHIFT, so that the rows a
    # program walks all start at the same offset from a 16-byte boundary. Rows of 21 fp16 columns start at
    # all 8 offsets; 61 rows give each program several tiles (the interpreter plans for 4 SMs: 8 groups).
    grids = []
    prepare = norm_backward_kernels.backward_persistent_kernel.prepare
    monkeypatch.setattr(norm_backward_kernels.backward_persistent_kernel, "prepare",
                        lambda grid, *a, **k: grids.append((grid, k)) or prepare(grid, *a, **k))
    config = BackwardConfig(False, block_rows, 8, 1, 1, persistent=True, prefetch=True, cluster=True,
                            aligned_window=True)
    _check_with_configs(op, (61, 21), torch.float16, seed, ForwardConfig(False, 1, 32, 1), config)
    ((grid,), options), = grids
    # (the window's whole vectors in cdiv(21 - 1, 8) = 3 parts, its edges in part 0: EDGES)
    assert options["SHIFT"] == 8 and options["CLUSTER"] == 3 and options["EDGES"]
    groups = grid // options["CLUSTER"]
    assert groups * block_rows % 8 == 0 and groups * block_rows < 61


# Rows off 16-byte boundaries in clusters take the split window (backward_persistent_kernel's EDGES): whole
# vectors in cdiv(N - 1, block_n) parts, the 2 * 8 edge lanes in part 0. Forced 8-column parts over N of every
# residue mod 8: N - 1 a multiple of the parts (17, 25: the last vector ends the main positions), one part more
# than the rows' whole vectors need, 2 to 8 parts; prefetch or not; weight and bias or neither; many rows
# (several tiles per program) with poisoned outputs.
@pytest.mark.parametrize("op", [LAYER_NORM, RMS_NORM])
@pytest.mark.parametrize("n_cols", [17, 19, 21, 23, 25, 26, 28, 31, 57, 65])
@pytest.mark.parametrize("prefetch, affine", [(True, True), (False, False)])
def test_cluster_edges_every_offset_and_part_count(op, n_cols, prefetch, affine, seed, monkeypatch):
    grids = []
    prepare = norm_backward_kernels.backward_persistent_kernel.prepare
    monkeypatch.setattr(norm_backward_kernels.backward_persistent_kernel, "prepare",
                        lambda grid, *a, **k: grids.append(k) or prepare(grid, *a, **k))
    config = BackwardConfig(False, 1, 8, 1, 1, persistent=True, prefetch=prefetch, cluster=True, aligned_window=True)
    _check_with_configs(op, (43, n_cols), torch.bfloat16, seed, ForwardConfig(False, 1, 128, 1), config,
                        weight=affine, bias=affine)
    options, = grids
    assert options["EDGES"] and options["CLUSTER"] == -(-(n_cols - 1) // 8)


def test_default_odd_rows_in_clusters_take_the_edges(monkeypatch):
    # 12289 columns: 6 parts of 2048 whole-vector positions (the aligned window took 7), edges in part 0
    grids = []
    monkeypatch.setattr(norm_backward_kernels.backward_persistent_kernel, "prepare",
                        lambda grid, *a, **k: grids.append((grid, k)))
    monkeypatch.setattr(norm_backward_launcher, "_has_clusters", lambda device, interpret: True)
    x = torch.zeros(64, 12289, dtype=torch.float16)
    norm_backward_launcher.backward_launcher(x, x, None, torch.zeros(64), torch.ones(64), True, True, False, False,
                                             None, None, None, True, torch.empty)
    ((grid,), options), = grids
    assert options["EDGES"] and options["CLUSTER"] == 6 and options["BLOCK_N"] == 2048


# -- GPU tier -------------------------------------------------------------------------------------------

# (rows, columns): clusters of 8 at 16384, 5 at 16392 (a last part of 8 columns),
# 6 at 24576, 8 at 32768; fewer rows than resident clusters, and many more
GPU_SHAPES = [(1, 16384), (257, 16392), (1000, 16384), (61, 24576), (130, 32768), (2, 32768),
              # rows off 16-byte boundaries (the split window's EDGES): 6 parts (12289), 5 (10001), 10 -> 5 of 4096
              # (20001), 4 (16383), 8 (32761)
              (300, 12289), (129, 10001), (33, 20001), (65, 16383), (17, 32761)]


@pytest.mark.cuda
@pytest.mark.parametrize("op", [LAYER_NORM, RMS_NORM])
@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=str)
def test_gpu_cluster_backward_poisoned_outputs(op, dtype, shape, seed):
    assert norm_backward_config.backward_config(shape[1], dtype, subtract_mean=op == LAYER_NORM).cluster
    x, w, b, dy = _inputs(shape, shape[-1:], dtype, seed, True, op == LAYER_NORM, device="cuda")
    x = x * 3 + 0.25
    y, dx, dw, db = _backward(op, x, w, b, dy)
    _compare(op, shape[-1:], (y.view(shape), dx, dw, db), _reference(op, x, shape[-1:], w, b, 1e-5, dy), dtype)


@pytest.mark.cuda
@pytest.mark.parametrize("op", [LAYER_NORM, RMS_NORM])
@pytest.mark.parametrize("weight, bias", [(False, True), (True, False), (False, False)])
def test_gpu_cluster_backward_affine_combinations(op, weight, bias, seed):
    if op == RMS_NORM and bias:
        pytest.skip("RMSNorm has no bias")
    shape = (77, 16384)
    x, w, b, dy = _inputs(shape, shape[-1:], torch.bfloat16, seed, weight, bias, device="cuda")
    y, dx, dw, db = _backward(op, x, w, b, dy)
    _compare(op, shape[-1:], (y.view(shape), dx, dw, db), _reference(op, x, shape[-1:], w, b, 1e-5, dy),
             torch.bfloat16)


@pytest.mark.cuda
@pytest.mark.parametrize("op", [LAYER_NORM, RMS_NORM])
def test_gpu_cluster_backward_is_deterministic(op, seed):
    shape = (4000, 16384)
    x, w, b, dy = _inputs(shape, shape[-1:], torch.float16, seed, True, op == LAYER_NORM, device="cuda")
    first = _backward(op, x, w, b, dy)
    for _ in range(3):
        again = _backward(op, x, w, b, dy)
        for a, e in zip(again, first):
            assert e is None or torch.equal(a, e)


@pytest.mark.cuda
@pytest.mark.parametrize("n_cols", [16384, 32768])
def test_gpu_resident_clusters_bound_the_grid(n_cols, monkeypatch):
    counts = []
    query = norm_backward_kernels.backward_persistent_kernel.max_active_clusters

    def spy(*args, **kwargs):
        counts.append((query(*args, **kwargs), kwargs["CLUSTER"]))
        return counts[-1][0]

    monkeypatch.setattr(norm_backward_kernels.backward_persistent_kernel, "max_active_clusters", spy)
    prepared = []
    prepare = norm_backward_kernels.backward_persistent_kernel.prepare
    monkeypatch.setattr(norm_backward_kernels.backward_persistent_kernel, "prepare",
                        lambda grid, *a, **k: prepared.append(grid) or prepare(grid, *a, **k))
    x = poison(torch.empty(8192, n_cols, dtype=torch.float16, device="cuda"))
    norm_backward_launcher.backward_launcher(x, x, None, torch.zeros(8192, device="cuda"),
                                             torch.ones(8192, device="cuda"), True, True, False, False, None, None,
                                             None, None, torch.empty)
    (resident, cluster), = counts
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    config = norm_backward_config.backward_config(n_cols, torch.float16)
    assert cluster == n_cols // config.block_n
    per_sm = config.programs_per_sm
    assert 0 < resident <= per_sm * sms // cluster
    assert prepared == [(min(resident, per_sm * sms // cluster) * cluster,)]
