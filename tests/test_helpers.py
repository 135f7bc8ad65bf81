"""The shared test helpers must be able to fail: each check is shown to reject a wrong result."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from helpers import (
    ELEMENT_FACTOR,
    MAX_TOLERANCE,
    TF32,
    TOLERANCE,
    assert_close,
    int_sentinel,
    poison,
    random_tensor,
    seed_for,
)

FLOAT_DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16]
INT_DTYPES = [torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8]
SHAPES = [(1,), (7,), (33, 17), (4, 5, 129)]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_rounded_reference_passes(dtype, shape, seed):
    # A correct low-precision result is the float64 reference rounded to the dtype.
    reference = random_tensor(shape, torch.float64, "cpu", seed)
    assert_close(reference.to(dtype), reference, dtype)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES + [TF32])
def test_error_just_above_tolerance_fails(dtype, seed):
    reference = random_tensor((64, 64), torch.float64, "cpu", seed)
    tol = TOLERANCE[dtype]
    direction = random_tensor((64, 64), torch.float64, "cpu", seed + 1)
    direction = direction / torch.linalg.vector_norm(direction) * torch.linalg.vector_norm(reference)
    assert_close(reference + 0.5 * tol * direction, reference, dtype)
    with pytest.raises(AssertionError, match="norm-relative error"):
        assert_close(reference + 2.0 * tol * direction, reference, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_one_wrong_element_in_a_large_tensor_fails(dtype, seed):
    # A forgotten tail element barely moves the norm of 2**20 elements; the element check sees it.
    reference = random_tensor((1 << 20,), torch.float64, "cpu", seed)
    actual = reference.to(dtype).clone()
    actual[-1] = reference[-1] + 2 * ELEMENT_FACTOR * TOLERANCE[dtype] * reference.abs().max()
    with pytest.raises(AssertionError, match="one element is off"):
        assert_close(actual, reference, dtype)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_nan_where_reference_is_finite_fails(dtype, seed):
    reference = random_tensor((9, 10), torch.float64, "cpu", seed)
    actual = reference.to(dtype).clone()
    actual[3, 4] = float("nan")
    with pytest.raises(AssertionError, match=r"NaN mismatch at 1 of 90 elements; first at \(3, 4\)"):
        assert_close(actual, reference, dtype)


def test_finite_where_reference_is_nan_fails():
    reference = torch.tensor([1.0, float("nan"), 3.0], dtype=torch.float64)
    with pytest.raises(AssertionError, match="NaN mismatch"):
        assert_close(torch.tensor([1.0, 2.0, 3.0]), reference, torch.float32)


def test_nan_at_the_same_place_passes():
    reference = torch.tensor([1.0, float("nan"), 3.0], dtype=torch.float64)
    assert_close(torch.tensor([1.0, float("nan"), 3.0]), reference, torch.float32)


def test_all_nan_output_fails():
    # A poisoned output the kernel never wrote.
    reference = random_tensor((5, 5), torch.float64, "cpu", 0)
    with pytest.raises(AssertionError, match="NaN mismatch at 25 of 25"):
        assert_close(poison(torch.empty(5, 5)), reference, torch.float32)


@pytest.mark.parametrize(
    "actual, reference",
    [
        ([float("inf"), 1.0], [float("-inf"), 1.0]),
        ([float("inf"), 1.0], [3e38, 1.0]),
        ([5.0, 1.0], [float("inf"), 1.0]),
    ],
)
def test_infinity_mismatch_fails(actual, reference):
    actual = torch.tensor(actual, dtype=torch.float64)
    reference = torch.tensor(reference, dtype=torch.float64)
    with pytest.raises(AssertionError, match="infinity mismatch"):
        assert_close(actual, reference, torch.float32)


def test_matching_infinities_pass():
    values = torch.tensor([float("-inf"), 2.0, float("inf")], dtype=torch.float64)
    assert_close(values.float(), values, torch.float32)


def test_all_zero_reference_uses_absolute_error():
    reference = torch.zeros(8, dtype=torch.float64)
    assert_close(torch.full((8,), 1e-7), reference, torch.float32)
    with pytest.raises(AssertionError):
        assert_close(torch.full((8,), 1e-3), reference, torch.float32)


def test_shape_mismatch_fails():
    with pytest.raises(AssertionError, match="shape mismatch"):
        assert_close(torch.zeros(4, 1), torch.zeros(4, dtype=torch.float64), torch.float32)


@pytest.mark.parametrize("dtype", INT_DTYPES + [torch.bool])
def test_integers_must_be_equal(dtype, seed):
    reference = random_tensor((6, 7), dtype, "cpu", seed)
    assert_close(reference.clone(), reference, dtype)
    actual = reference.clone()
    actual[5, 6] = ~actual[5, 6] if dtype == torch.bool else actual[5, 6] + 1
    with pytest.raises(AssertionError, match=r"1 of 42 .* elements differ; first at \(5, 6\)"):
        assert_close(actual, reference, dtype)


def test_int64_compared_without_float_rounding():
    reference = torch.tensor([2**62], dtype=torch.int64)
    with pytest.raises(AssertionError, match="differ"):
        assert_close(reference + 1, reference, torch.int64)


def test_numpy_inputs_are_accepted():
    reference = np.linspace(-1.0, 1.0, 11)
    assert_close(reference.astype(np.float32), reference, torch.float32)
    with pytest.raises(AssertionError):
        assert_close((reference + 1e-2).astype(np.float32), reference, torch.float32)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_tolerance_cannot_be_loosened_past_the_maximum(dtype):
    values = torch.ones(3, dtype=torch.float64)
    assert_close(values, values, dtype, tol=MAX_TOLERANCE[dtype])
    with pytest.raises(ValueError, match="outside"):
        assert_close(values, values, dtype, tol=2 * MAX_TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_poison_floats_with_nan(dtype):
    tensor = torch.zeros(3, 4, dtype=dtype)
    assert poison(tensor) is tensor
    assert torch.isnan(tensor).all()


@pytest.mark.parametrize("dtype", INT_DTYPES + [torch.bool])
def test_poison_integers_with_a_sentinel(dtype):
    tensor = torch.zeros(3, 4, dtype=dtype)
    poison(tensor)
    expected = True if dtype == torch.bool else int_sentinel(dtype)
    assert (tensor == expected).all()
    assert int_sentinel(torch.int32) == -(2**31) and int_sentinel(torch.uint8) == 255


@pytest.mark.parametrize("dtype", FLOAT_DTYPES + INT_DTYPES + [torch.bool])
def test_random_tensor_is_deterministic_per_seed(dtype):
    first = random_tensor((5, 6), dtype, "cpu", 3)
    assert first.shape == (5, 6) and first.dtype == dtype and first.device.type == "cpu"
    assert torch.equal(first, random_tensor((5, 6), dtype, "cpu", 3))
    assert not torch.equal(first, random_tensor((5, 6), dtype, "cpu", 4))


def test_random_tensor_leaves_the_global_rng_alone():
    state = torch.get_rng_state()
    random_tensor((100,), torch.float32, "cpu", 1)
    assert torch.equal(state, torch.get_rng_state())


def test_seed_fixture_is_the_node_id_hash(request, seed):
    assert seed == seed_for(request.node.nodeid)
    assert seed_for("a::b[0]") != seed_for("a::b[1]")


@pytest.mark.cuda
def test_cuda_tier_is_skipped_without_a_gpu():
    # Fails if conftest's skip hook ever lets a `cuda` test run on a machine without a GPU.
    assert torch.cuda.is_available()
