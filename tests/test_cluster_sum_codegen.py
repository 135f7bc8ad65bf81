"""`dsl.cluster_sum` compiled: the PTX (distributed shared memory stores, one cluster barrier per call,
two alternating slot buffers), its compile-time errors, and on the H200 its results against float64
and the same bits in every program of a cluster. The interpreter's side: test_cluster_sum_interpreter.py.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import fusedops.dsl as dsl
from fusedops.dsl.target import ptxas_available

from helpers import poison, random_tensor

needs_ptxas = pytest.mark.skipif(not ptxas_available(), reason="ptxas is not on the PATH")


@dsl.jit
def _cluster_sums(out_ptr, scalar_out_ptr, x_ptr, n_rounds, n_programs, SIZE: dsl.constexpr, BLOCK: dsl.constexpr):
    # Round r: every program adds x[r, program] (a block) and its sum (a scalar) over its cluster; the
    # block sums are weighted by r + 1 and accumulated, so each round's result must be the right one.
    dsl.cluster_dims(SIZE)
    pid = dsl.program_id(0)
    offsets = dsl.arange(0, BLOCK)
    total = dsl.zeros((BLOCK,), dsl.float32)
    scalar_total = dsl.sum(dsl.zeros((BLOCK,), dsl.float32), axis=0)
    for r in range(0, n_rounds):
        x = dsl.load(x_ptr + (r * n_programs + pid) * BLOCK + offsets)
        block_sum, row_sum = dsl.cluster_sum(x, dsl.sum(x, axis=0))
        total += block_sum * (r + 1).to(dsl.float32)
        scalar_total += row_sum
    dsl.store(out_ptr + pid * BLOCK + offsets, total)
    dsl.store(scalar_out_ptr + pid, scalar_total)


@dsl.jit
def _cluster_int_sum(out_ptr, x_ptr, SIZE: dsl.constexpr, BLOCK: dsl.constexpr):
    dsl.cluster_dims(SIZE)
    offsets = dsl.program_id(0) * BLOCK + dsl.arange(0, BLOCK)
    dsl.store(out_ptr + offsets, dsl.cluster_sum(dsl.load(x_ptr + offsets)))


def _reference(x: torch.Tensor, size: int):
    """(out, scalar_out) of _cluster_sums in float64: x is (rounds, programs, block)."""
    rounds, programs, block = x.shape
    clusters = x.double().reshape(rounds, programs // size, size, block).sum(2)          # (rounds, clusters, block)
    weights = torch.arange(1, rounds + 1, dtype=torch.float64)[:, None, None]
    out = (clusters * weights).sum(0).repeat_interleave(size, 0)                        # (programs, block)
    scalar = clusters.sum(2).sum(0).repeat_interleave(size, 0)
    return out, scalar


def _compile_sums(size=2, arch="sm_90a", block=64, num_warps=4):
    x = torch.empty(3, 2 * size, block)
    return _cluster_sums.compile(torch.empty(2 * size, block), torch.empty(2 * size), x, 3, 2 * size, SIZE=size,
                                 BLOCK=block, target=arch, num_warps=num_warps)


# -- CPU tier: PTX and errors ------------------------------------------------------------------------------------

@pytest.mark.parametrize("size", [2, 4, 8])
def test_cluster_sum_ptx(size):
    ptx = _compile_sums(size).asm["ptx"]
    assert f".reqnctapercluster {size}, 1, 1" in ptx
    # the kernel's first cluster barrier, then one per call (the loop's call lowered once)
    assert ptx.count("barrier.cluster.arrive.release") == 2
    assert ptx.count("barrier.cluster.wait.acquire") == 2
    # each owner writes its values into every CTA of the cluster: 2 values x `size` peers
    assert len(re.findall(r"st\.shared::cluster\.b32", ptx)) == 2 * size
    assert len(re.findall(r"mapa\.shared::cluster", ptx)) == 2 * size


@needs_ptxas
@pytest.mark.parametrize("size", [2, 8])
@pytest.mark.parametrize("num_warps", [1, 4, 8])
def test_cluster_sum_ptx_is_accepted_by_ptxas(size, num_warps):
    from fusedops.dsl.target import assemble
    result = assemble(_compile_sums(size, num_warps=num_warps).asm["ptx"], "sm_90a")
    assert result.spill_bytes == 0, result.log


def test_cluster_sum_slots_are_kept_out_of_scratch():
    """The slots (2 buffers x 2 ranks x (64 + 1) float32, rounded to 16 bytes) come first; scratch follows."""
    kernel = _compile_sums(2)
    assert kernel.shared_bytes > 2 * 2 * 272


def test_cluster_sum_of_one_program_clusters_is_the_value():
    kernel = _compile_sums(1)
    ptx = kernel.asm["ptx"]
    assert "barrier.cluster" not in ptx and "mapa" not in ptx and "st.shared::cluster" not in ptx


def test_cluster_sum_before_sm90_is_rejected():
    with pytest.raises(dsl.CompilationError, match=r"cluster_sum needs thread block clusters.*sm_80"):
        _compile_sums(2, arch="sm_80")


@dsl.jit
def _sum_of_pointer(x_ptr):
    dsl.cluster_dims(2)
    dsl.cluster_sum(x_ptr)


@dsl.jit
def _sum_of_nothing(x_ptr):
    dsl.cluster_dims(2)
    dsl.cluster_sum()


@pytest.mark.parametrize("kernel,message", [(_sum_of_pointer, "value 0 must be a number"),
                                            (_sum_of_nothing, "needs at least one value")])
def test_cluster_sum_rejects_bad_values(kernel, message):
    with pytest.raises(dsl.CompilationError, match=message):
        kernel.compile(torch.empty(4), target="sm_90a")


# -- GPU tier ----------------------------------------------------------------------------------------------------

@pytest.mark.cuda
@pytest.mark.parametrize("size", [1, 2, 4, 8])
@pytest.mark.parametrize("rounds", [1, 2, 7])
@pytest.mark.parametrize("num_warps", [1, 4])
def test_gpu_cluster_sum_matches_float64(size, rounds, num_warps, seed):
    programs, block = 6 * size, 64
    x = random_tensor((rounds, programs, block), torch.float32, "cuda", seed)
    out = poison(torch.empty(programs, block, device="cuda"))
    scalar = poison(torch.empty(programs, device="cuda"))
    _cluster_sums[(programs,)](out, scalar, x, rounds, programs, size, block, num_warps=num_warps)
    expected, expected_scalar = _reference(x.cpu(), size)
    torch.testing.assert_close(out.cpu().double(), expected, rtol=1e-5, atol=1e-4 * rounds)
    torch.testing.assert_close(scalar.cpu().double(), expected_scalar, rtol=1e-5, atol=1e-3 * rounds)
    # every program of a cluster holds the same bits
    clusters = out.cpu().reshape(programs // size, size, block)
    assert torch.equal(clusters, clusters[:, :1].expand_as(clusters))


@pytest.mark.cuda
@pytest.mark.parametrize("size", [2, 4])
def test_gpu_cluster_sum_of_integers_is_exact(size, seed):
    programs, block = 4 * size, 128
    generator = np.random.default_rng(seed)
    x = torch.from_numpy(generator.integers(-2**20, 2**20, (programs, block), dtype=np.int32)).cuda()
    out = poison(torch.empty_like(x))
    _cluster_int_sum[(programs,)](out, x, size, block)
    expected = x.cpu().long().reshape(programs // size, size, block).sum(1).repeat_interleave(size, 0)
    assert torch.equal(out.cpu().long(), expected)
