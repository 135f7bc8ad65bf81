"""`dsl.cluster_sum` in the interpreter: the programs of a cluster run side by side, one at a time.

CPU tier only (interpret=True). The sums are checked bitwise against NumPy adding the programs' values in
rank order in the accumulation type; programs whose cluster_sum calls differ, and programs that fail,
raise (the first error) without hanging and without leaving a thread behind; atomics stay exact and
run in a fixed order; the multicast-load check still holds between cluster_sum calls.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import fusedops.dsl as dsl

from helpers import assert_close, launch_promptly, poison, random_tensor

# torch dtype of the input -> torch dtype cluster_sum adds in (16-bit floats in float32, as dsl.sum)
ACCUMULATION = {torch.float32: torch.float32, torch.float64: torch.float64, torch.int32: torch.int32,
                torch.float16: torch.float32}
SAME_CALLS = r"every program of a cluster must make the same cluster_sum calls \(on the GPU the cluster would hang\)"


def _rank_order_sum(values: np.ndarray, size: int) -> np.ndarray:
    """Per program (axis 0, in program order, clusters of `size` consecutive programs): the sum of its
    cluster's values, added in rank order in `values`' dtype (what cluster_sum promises)."""
    sums = np.empty_like(values)
    for first in range(0, len(values), size):
        total = values[first].copy()
        for rank in range(1, size):
            total = total + values[first + rank]
        sums[first:first + size] = total
    return sums


# -- sums of blocks and scalars ----------------------------------------------------------------------------------

@dsl.jit
def _sum_rows(x_ptr, block_ptr, scalar_ptr, doubled_ptr, BLOCK: dsl.constexpr, SIZE: dsl.constexpr):
    # x: (2, programs, BLOCK); program (i, j) owns row (j, i). Outputs (the cluster's sums, accumulation
    # type): block_ptr (2, programs, BLOCK) the rows, scalar_ptr (2, programs) the rows' first elements
    # (a tuple of two results), doubled_ptr (2, programs, BLOCK) twice the rows (a single result).
    dsl.cluster_dims(SIZE)
    row = dsl.program_id(1) * dsl.num_programs(0) + dsl.program_id(0)
    offsets = row * BLOCK + dsl.arange(0, BLOCK)
    x = dsl.load(x_ptr + offsets)
    block_sum, scalar_sum = dsl.cluster_sum(x, dsl.load(x_ptr + row * BLOCK))
    dsl.store(block_ptr + offsets, block_sum)
    dsl.store(scalar_ptr + row, scalar_sum)
    dsl.store(doubled_ptr + offsets, dsl.cluster_sum(x * 2))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int32, torch.float16], ids=str)
@pytest.mark.parametrize("size", [1, 2, 4])
def test_cluster_sum_of_blocks_and_scalars_is_the_rank_order_sum(size, dtype, seed):
    """3 clusters along axis 0 times 2 along axis 1; size 1: each program gets its own values."""
    programs, block = 3 * size, 32
    x = random_tensor((2, programs, block), dtype, "cpu", seed)
    accumulation = ACCUMULATION[dtype]
    block_sums = poison(torch.empty(2, programs, block, dtype=accumulation))
    scalar_sums = poison(torch.empty(2, programs, dtype=accumulation))
    doubled_sums = poison(torch.empty(2, programs, block, dtype=accumulation))
    _sum_rows[(programs, 2)](x, block_sums, scalar_sums, doubled_sums, block, size, interpret=True)

    rows = x.to(accumulation).numpy()
    expected = np.stack([_rank_order_sum(rows[j], size) for j in range(2)])
    np.testing.assert_array_equal(block_sums.numpy(), expected)
    np.testing.assert_array_equal(scalar_sums.numpy(), expected[:, :, 0])
    np.testing.assert_array_equal(doubled_sums.numpy(), np.stack([_rank_order_sum(2 * rows[j], size)
                                                                  for j in range(2)]))
    if size == 1:
        np.testing.assert_array_equal(block_sums.numpy(), rows)
    if dtype == torch.float32 and size > 1:
        # the reference above is the cluster's sum indeed: within float32 rounding of a float64 one
        assert_close(block_sums, x.double().view(2, 3, size, block).sum(2, keepdim=True)
                     .expand(2, 3, size, block).reshape(2, programs, block), torch.float32)


# -- calls in a loop, sums feeding later ones ---------------------------------------------------------------------

@dsl.jit
def _running_sums(x_ptr, y_ptr, BLOCK: dsl.constexpr, SIZE: dsl.constexpr):
    # Cluster c makes c + 1 steps (as a persistent kernel's tile loop: the same count in each of its
    # programs). Step s: sum (the program's tile of step s, x[s, pid, :], plus its state) over the cluster,
    # state = state / 2 + that sum. y[pid, :]: the last state.
    dsl.cluster_dims(SIZE)
    pid = dsl.program_id(0)
    columns = dsl.arange(0, BLOCK)
    state = dsl.zeros((BLOCK,), dsl.float32)
    for step in range(pid // SIZE + 1):
        tile = dsl.load(x_ptr + (step * dsl.num_programs(0) + pid) * BLOCK + columns)
        state = state * 0.5 + dsl.cluster_sum(tile + state)
    dsl.store(y_ptr + pid * BLOCK + columns, state)


@pytest.mark.parametrize("size", [2, 4])
def test_cluster_sum_in_a_loop_feeds_later_sums(size, seed):
    clusters, block = 3, 16
    programs = clusters * size
    x = random_tensor((clusters, programs, block), torch.float32, "cpu", seed)
    y = poison(torch.empty(programs, block))
    _running_sums[(programs,)](x, y, block, size, interpret=True)

    tiles = x.numpy()
    expected = np.empty((programs, block), np.float32)
    for cluster in range(clusters):
        ranks = slice(cluster * size, (cluster + 1) * size)
        state = np.zeros((size, block), np.float32)
        for step in range(cluster + 1):
            state = state * np.float32(0.5) + _rank_order_sum(tiles[step, ranks] + state, size)
        expected[ranks] = state
    np.testing.assert_array_equal(y.numpy(), expected)


# -- programs whose calls differ ----------------------------------------------------------------------------------

@dsl.jit
def _uneven_calls(x_ptr, SIZE: dsl.constexpr, SHORT: dsl.constexpr, FEWER: dsl.constexpr):
    # Every program sums x[pid] over the cluster twice and stores it back, except rank SHORT of cluster 1,
    # which makes 2 - FEWER calls.
    dsl.cluster_dims(SIZE)
    pid = dsl.program_id(0)
    value = dsl.load(x_ptr + pid)
    calls = dsl.where((pid // SIZE == 1) & (pid % SIZE == SHORT), 2 - FEWER, 2)
    for _ in range(calls):
        value = dsl.cluster_sum(value)
    dsl.store(x_ptr + pid, value)


@pytest.mark.parametrize("size,short,fewer,failing", [
    (2, 1, 1, 0),      # rank 0 waits in its second call while rank 1 ends
    (2, 0, 1, 1),      # rank 0 has ended when rank 1 makes its second call
    (4, 2, 1, 0),      # ranks 0 and 1 wait while rank 2 ends: the error is rank 0's
    (4, 3, 2, 0),      # rank 3 makes no call at all
], ids=["ends while a peer waits", "calls after a peer ended", "size 4", "no call"])
def test_programs_making_different_calls_raise(size, short, fewer, failing):
    x = torch.arange(3 * size, dtype=torch.int32)
    with pytest.raises(dsl.InterpreterError) as caught:
        launch_promptly(lambda: _uneven_calls[(3 * size,)](x, size, short, fewer, interpret=True))
    message = str(caught.value)
    assert (f"cluster_sum runs {3 - fewer} times in this program but {2 - fewer} times in program "
            f"({size + short}, 0, 0) of its cluster, which has ended: ") in message
    assert re.search(SAME_CALLS, message)
    assert f"program_id=({size + failing}, 0, 0)" in message
    assert "test_cluster_sum_interpreter.py" in message and "cluster_sum(value)" in message
    # cluster 0 ran (each program: `size` times its cluster's sum), the launch stopped at cluster 1
    assert x[:size].tolist() == [size * sum(range(size))] * size
    assert x[2 * size:].tolist() == list(range(2 * size, 3 * size))


@dsl.jit
def _unlike_calls(x_ptr, y_ptr):
    # Program 0 sums a block, program 1 a scalar: the same call with values of other types.
    dsl.cluster_dims(2)
    x = dsl.load(x_ptr + dsl.arange(0, 16))
    if dsl.program_id(0) == 0:
        dsl.store(y_ptr + dsl.arange(0, 16), dsl.cluster_sum(x))
    else:
        dsl.store(y_ptr, dsl.cluster_sum(dsl.sum(x, 0)))


def test_programs_summing_values_of_other_types_raise():
    x = torch.zeros(16)
    with pytest.raises(dsl.InterpreterError, match=rf"cluster_sum call 1 sums values of types \(.+\) in this "
                                                   rf"program but \(.+\) in program \(0, 0, 0\) of its cluster: "
                                                   rf"{SAME_CALLS} \(program_id=\(1, 0, 0\)\)"):
        launch_promptly(lambda: _unlike_calls[(2,)](x, torch.zeros(16), interpret=True))


# -- a failing program --------------------------------------------------------------------------------------------

@dsl.jit
def _faulting(x_ptr, y_ptr, distance, SIZE: dsl.constexpr, FAULTY: dsl.constexpr, AFTER: dsl.constexpr):
    # Program FAULTY reads `distance` elements past its block: before the first cluster_sum (AFTER 0) or
    # between the two (AFTER 1).
    dsl.cluster_dims(SIZE)
    pid = dsl.program_id(0)
    offsets = pid * 16 + dsl.arange(0, 16)
    reach = dsl.where(pid == FAULTY, distance, 0)
    x = dsl.load(x_ptr + offsets)
    if AFTER == 0:
        x += dsl.load(x_ptr + offsets + reach)
    x = dsl.cluster_sum(x)
    if AFTER == 1:
        x += dsl.load(x_ptr + offsets + reach)
    dsl.store(y_ptr + offsets, dsl.cluster_sum(x))


@pytest.mark.parametrize("size,faulty,after", [(2, 0, 0), (2, 1, 0), (2, 0, 1), (4, 3, 1), (4, 5, 1)],
                         ids=["rank 0 first", "rank 1 while rank 0 waits", "rank 0 between sums",
                              "rank 3 between sums", "second cluster"])
def test_an_error_in_a_program_propagates(size, faulty, after, seed):
    """The first error (the out-of-bounds load) is raised, not the cluster_sum mismatch it leaves."""
    n = 2 * size * 16
    # x and y in one storage, so that a read 2n past x's start is outside every argument's storage
    storage = torch.cat([random_tensor((n,), torch.float32, "cpu", seed), poison(torch.empty(n))])
    x, y = storage[:n], storage[n:]
    with pytest.raises(dsl.InterpreterError, match=r"out-of-bounds load") as caught:
        launch_promptly(lambda: _faulting[(2 * size,)](x, y, 2 * n, size, faulty, after, interpret=True))
    assert f"program_id=({faulty}, 0, 0)" in str(caught.value)
    assert "cluster_sum calls" not in str(caught.value) and "which has ended" not in str(caught.value)


# -- atomics ------------------------------------------------------------------------------------------------------

@dsl.jit
def _tickets(counter_ptr, tickets_ptr, total_ptr, bins_ptr, histogram_ptr, SIZE: dsl.constexpr):
    # Each program takes a ticket (counter_ptr, atomically), sums the tickets over its cluster, takes a second
    # ticket, adds the sum to total_ptr, and counts its 32 bins (bins_ptr: (programs, 32)) in histogram_ptr
    # before and after the sum. tickets_ptr: (programs, 2).
    dsl.cluster_dims(SIZE)
    pid = dsl.program_id(0)
    bins = dsl.load(bins_ptr + pid * 32 + dsl.arange(0, 32))
    first = dsl.atomic_add(counter_ptr, 1)
    dsl.atomic_add(histogram_ptr + bins, 1)
    tickets = dsl.cluster_sum(first)
    dsl.atomic_add(histogram_ptr + bins, 1)
    second = dsl.atomic_add(counter_ptr, 1)
    dsl.atomic_add(total_ptr, tickets)
    dsl.store(tickets_ptr + pid * 2, first)
    dsl.store(tickets_ptr + pid * 2 + 1, second)


@pytest.mark.parametrize("size", [2, 4])
def test_atomics_in_a_cluster_kernel_are_exact_and_ordered(size, seed):
    """One program runs at a time, rank 0 first between two sums, and clusters one after another."""
    clusters = 3
    programs = clusters * size
    bins = torch.randint(0, 8, (programs, 32), generator=torch.Generator().manual_seed(seed), dtype=torch.int32)
    counter, total = torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
    histogram = torch.zeros(8, dtype=torch.int32)
    tickets = poison(torch.empty(programs, 2, dtype=torch.int32))
    _tickets[(programs,)](counter, tickets, total, bins, histogram, size, interpret=True)

    cluster, rank = np.divmod(np.arange(programs), size)
    expected = np.stack([2 * size * cluster + rank, 2 * size * cluster + size + rank], axis=1)
    assert tickets.tolist() == expected.tolist()
    assert counter.item() == 2 * programs
    assert total.item() == size * expected[:, 0].sum()
    assert histogram.tolist() == (2 * torch.bincount(bins.view(-1), minlength=8)).tolist()


# -- multicast loads and cluster_sum ------------------------------------------------------------------------------

@dsl.jit
def _multicast_and_sum(x_ptr, y_ptr, K, LATE: dsl.constexpr):
    # Two steps, each a cluster_sum of `total`; every program adds the column sums of the 16 x 16 box at
    # (0, 0) (one multicast load op) in step 0, or with LATE rank 1 in step 1.
    dsl.cluster_dims(2)
    pid = dsl.program_id(0)
    desc = dsl.make_tensor_descriptor(x_ptr, (K, K), (K, 1), (16, 16))
    load_step = dsl.where(pid % 2 == 1, LATE, 0)
    total = dsl.zeros((16,), dsl.float32)
    for step in range(2):
        for _ in range(dsl.where(step == load_step, 1, 0)):
            total += dsl.sum(desc.load((0, 0), multicast=True), 0)
        total = dsl.cluster_sum(total)
    dsl.store(y_ptr + pid * 16 + dsl.arange(0, 16), total)


def test_multicast_loads_with_cluster_sum(seed):
    x = random_tensor((32, 32), torch.float32, "cpu", seed)
    y = poison(torch.empty(4 * 16))
    _multicast_and_sum[(4,)](x, y, 32, 0, interpret=True)
    assert_close(y.view(4, 16), 4 * x[:16, :16].double().sum(0).expand(4, 16), torch.float32)


def test_multicast_load_on_the_other_side_of_a_cluster_sum_raises():
    with pytest.raises(dsl.InterpreterError, match=r"makes its call 1 after 1 cluster_sum calls in this program but "
                                                   r"after 0 in rank 0 of its cluster") as caught:
        launch_promptly(lambda: _multicast_and_sum[(2,)](torch.zeros(32, 32), torch.zeros(32), 32, 1,
                                                          interpret=True))
    assert "program_id=(1, 0, 0)" in str(caught.value)
