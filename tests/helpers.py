"""Shared test helpers: per-dtype tolerances (written once), comparison, poisoning, random inputs.

Usage:
    from helpers import assert_close, poison, random_tensor

    x = random_tensor((37, 1000), torch.float16, "cpu", seed)
    y = poison(torch.empty_like(x))
    kernel[grid](y, x, ...)
    assert_close(y, torch.softmax(x.double(), dim=-1), torch.float16)

The error measure (DESIGN.md "Testing") is relative to the reference's norm:
    ||actual - reference||_2 / ||reference||_2 <= tol(dtype)
plus a per-element guard, so that a few wrong elements in a large tensor (a classic
tail-mask bug) cannot hide inside the norm:
    max_i |actual_i - reference_i| <= ELEMENT_FACTOR * tol(dtype) * max_i |reference_i|
NaN never passes unless the reference is NaN at the same place; infinities must match exactly.
Integer and bool outputs must be equal.
"""

from __future__ import annotations

import threading
import zlib
from typing import Callable, Optional, Sequence, Union

import numpy as np
import torch

# TF32 is not a torch dtype: it is float32 storage with 10-bit-mantissa products (tensor cores).
TF32 = "tf32"
DTypeKey = Union[torch.dtype, str]

# Norm-relative error a correct kernel stays under. float64 outputs are compared against a float64
# reference computed in a different order, hence not zero.
TOLERANCE: dict = {
    torch.float64: 1e-12,
    torch.float32: 1e-5,
    TF32: 1e-3,
    torch.float16: 2e-3,
    torch.bfloat16: 1e-2,
}

# The loosest a test may ask for with `tol=` (DESIGN.md: fp16 1e-3 to 5e-3, e.g. long-K matmuls).
# A looser tolerance is refused: a test that cannot fail is a defect.
MAX_TOLERANCE: dict = {
    torch.float64: 1e-10,
    torch.float32: 1e-5,
    TF32: 1e-3,
    torch.float16: 5e-3,
    torch.bfloat16: 1e-2,
}

# How much larger than `tol` one element's error may be, relative to the largest reference value.
ELEMENT_FACTOR = 4.0


def tolerance(dtype: DTypeKey) -> float:
    """The default norm-relative tolerance of `dtype` (a floating torch.dtype or TF32)."""
    try:
        return TOLERANCE[dtype]
    except KeyError:
        raise ValueError(f"no tolerance for {dtype!r}; integer dtypes are compared exactly") from None


def _to_cpu(x) -> torch.Tensor:
    if isinstance(x, np.ndarray):
        x = torch.from_numpy(x)
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"expected a torch.Tensor or numpy.ndarray, got {type(x).__name__}")
    return x.detach().to(device="cpu")


def _exact_domain(a: torch.Tensor, r: torch.Tensor) -> tuple:
    """Both as int64 when both are integer/bool (float64 would round values above 2**53)."""
    if a.dtype.is_floating_point or r.dtype.is_floating_point:
        return a.to(torch.float64), r.to(torch.float64)
    return a.to(torch.int64), r.to(torch.int64)


def _first_index(mask: torch.Tensor) -> tuple:
    return tuple(int(i) for i in torch.nonzero(mask)[0])


def assert_close(actual, reference, dtype: DTypeKey, *, tol: Optional[float] = None) -> None:
    """Assert that `actual` matches the float64 `reference` to the tolerance of `dtype`.

    Args:
        actual: the kernel's output, a tensor (any device, any dtype) or NumPy array.
        reference: the expected values, computed in float64 (any tensor/array; upcast to float64).
            Must have exactly the shape of `actual`: nothing is broadcast.
        dtype: the precision the kernel computed in: a floating torch.dtype, TF32, or an integer /
            bool dtype (then every element must be equal).
        tol: overrides the default `TOLERANCE[dtype]`, at most `MAX_TOLERANCE[dtype]`.

    Raises:
        AssertionError: shapes differ; NaN or ±inf at different places; an integer element differs;
            the norm-relative error exceeds `tol`; or one element's error exceeds
            ELEMENT_FACTOR * tol * max|reference|. The message gives the error and the worst index.
        ValueError: `tol` is looser than MAX_TOLERANCE[dtype], or `dtype` has no tolerance.
    """
    a = _to_cpu(actual)
    r = _to_cpu(reference)
    if a.shape != r.shape:
        raise AssertionError(f"shape mismatch: actual {tuple(a.shape)} vs reference {tuple(r.shape)}")

    if isinstance(dtype, torch.dtype) and not dtype.is_floating_point:
        a, r = _exact_domain(a, r)
        differs = a != r
        if differs.any():
            index = _first_index(differs)
            raise AssertionError(
                f"{int(differs.sum())} of {a.numel()} {dtype} elements differ; first at {index}: "
                f"actual {a[index].item()} vs reference {r[index].item()}"
            )
        return

    default = tolerance(dtype)  # also rejects a dtype that has no tolerance
    if tol is None:
        tol = default
    elif not 0 < tol <= MAX_TOLERANCE[dtype]:
        raise ValueError(f"tol={tol} is outside (0, {MAX_TOLERANCE[dtype]}], the range allowed for {dtype}")
    a, r = a.to(torch.float64), r.to(torch.float64)

    nan_mismatch = torch.isnan(a) != torch.isnan(r)
    if nan_mismatch.any():
        index = _first_index(nan_mismatch)
        raise AssertionError(
            f"NaN mismatch at {int(nan_mismatch.sum())} of {a.numel()} elements; first at {index}: "
            f"actual {a[index].item()} vs reference {r[index].item()}"
        )
    inf_mismatch = torch.isinf(a) | torch.isinf(r)
    inf_mismatch &= a != r
    if inf_mismatch.any():
        index = _first_index(inf_mismatch)
        raise AssertionError(
            f"infinity mismatch at {int(inf_mismatch.sum())} elements; first at {index}: "
            f"actual {a[index].item()} vs reference {r[index].item()}"
        )

    finite = torch.isfinite(r)
    a, r = a[finite], r[finite]
    if r.numel() == 0:
        return
    error = a - r
    reference_norm = float(torch.linalg.vector_norm(r))
    # An all-zero reference has no scale: the error is then measured in absolute terms.
    scale = reference_norm if reference_norm > 0 else 1.0
    relative = float(torch.linalg.vector_norm(error)) / scale
    worst = int(torch.argmax(error.abs()))
    worst_error = float(error.abs()[worst])
    details = (
        f"norm-relative error {relative:.3e} (tol {tol:.1e} for {dtype}); "
        f"worst element: actual {a[worst].item()!r} vs reference {r[worst].item()!r} "
        f"(flat index {worst} among finite elements, |error| {worst_error:.3e})"
    )
    if not relative <= tol:
        raise AssertionError(details)
    max_reference = float(r.abs().max())
    element_bound = ELEMENT_FACTOR * tol * (max_reference if max_reference > 0 else 1.0)
    if not worst_error <= element_bound:
        raise AssertionError(f"one element is off by more than {element_bound:.3e}: {details}")


def poison(tensor: torch.Tensor) -> torch.Tensor:
    """Fill `tensor` in place with values no correct kernel writes, and return it.

    Floating tensors get NaN (which `assert_close` never accepts where the reference is finite);
    signed integers get their minimum, unsigned integers their maximum, bool gets True. Use it on
    outputs before a launch so that an element the kernel forgot to write is caught.
    """
    if tensor.dtype.is_floating_point or tensor.dtype.is_complex:
        return tensor.fill_(float("nan"))
    if tensor.dtype == torch.bool:
        return tensor.fill_(True)
    return tensor.fill_(int_sentinel(tensor.dtype))


def int_sentinel(dtype: torch.dtype) -> int:
    """The value `poison` writes into an integer tensor of `dtype`."""
    info = torch.iinfo(dtype)
    return info.min if info.min < 0 else info.max


def seed_for(node_id: str) -> int:
    """A stable 31-bit seed for a test id (the same across runs, processes and machines)."""
    return zlib.crc32(node_id.encode("utf-8")) & 0x7FFFFFFF


def random_tensor(
    shape: Sequence[int],
    dtype: torch.dtype,
    device: Union[str, torch.device] = "cpu",
    seed: int = 0,
    *,
    scale: float = 1.0,
) -> torch.Tensor:
    """A tensor of `shape` and `dtype` on `device`, the same for the same `seed` on every device.

    Floating dtypes: standard normal values times `scale`, drawn in float64 and rounded to `dtype`.
    Integers: uniform in [-100, 100) for signed, [0, 200) for unsigned (small enough for int8/uint8
    and for sums that do not overflow int32). bool: fair coin flips. The data is drawn on the CPU
    from a private generator (the global RNG is untouched), then moved to `device`.
    """
    generator = torch.Generator(device="cpu").manual_seed(seed)
    shape = tuple(shape)
    if dtype.is_floating_point:
        values = torch.randn(shape, generator=generator, dtype=torch.float64) * scale
    elif dtype == torch.bool:
        values = torch.randint(0, 2, shape, generator=generator) == 1
    else:
        low, high = (-100, 100) if torch.iinfo(dtype).min < 0 else (0, 200)
        values = torch.randint(low, high, shape, generator=generator, dtype=torch.int64)
    return values.to(dtype=dtype).to(device)


def run_in_threads(work: Callable[[int], None], count: int) -> list:
    """Run `work(0)`, ..., `work(count - 1)` in `count` threads at once; the exceptions they raised."""
    errors = []

    def guarded(index: int) -> None:
        try:
            work(index)
        except Exception as error:  # noqa: BLE001  (reported to the caller)
            errors.append(error)

    threads = [threading.Thread(target=guarded, args=(index,)) for index in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return errors


def assert_same_tensor(actual, expected, atol: float = 1e-9, rtol: float = 1e-7) -> None:
    """`actual` is a tensor of `expected`'s shape and dtype, close to it (NaN where it has NaN): the
    comparison of an op's result with torch's own in the same dtype (not against float64, see assert_close)."""
    assert isinstance(actual, torch.Tensor), type(actual)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    torch.testing.assert_close(actual, expected, atol=atol, rtol=rtol, equal_nan=True)


def assert_layer_norm_against_float64(x, weight, bias, dy, dtype) -> None:
    """fusedops.layer_norm over the last dim of x (requires grad, as weight and bias) and its gradients for the
    output gradient dy, against torch's in float64 (assert_close at `dtype`)."""
    import fusedops
    n = x.shape[-1]
    inputs = (x, weight, bias)
    wide = [t.detach().double().requires_grad_() for t in inputs]
    y = fusedops.layer_norm(x, (n,), weight, bias, 1e-5)
    reference = torch.nn.functional.layer_norm(wide[0], (n,), wide[1], wide[2], 1e-5)
    assert_close(y, reference.detach(), dtype)
    for got, want in zip(torch.autograd.grad(y, inputs, dy), torch.autograd.grad(reference, wide, dy.double())):
        assert_close(got, want, dtype)


def module_pair(ours_cls, torch_cls, *args, **kwargs) -> tuple:
    """(ours, theirs): a fusedops.nn module and its torch.nn counterpart built with the same arguments,
    holding the same random parameters (theirs drawn from N(0, 1), loaded into ours through state_dict)."""
    theirs = torch_cls(*args, **kwargs)
    ours = ours_cls(*args, **kwargs)
    with torch.no_grad():
        for p in theirs.parameters():
            p.copy_(torch.randn_like(p))
    ours.load_state_dict(theirs.state_dict())
    return ours, theirs


def launch_promptly(launch, timeout: float = 20.0) -> None:
    """Run `launch()` in a thread; fail if it takes over `timeout` seconds (a hang) or leaves a thread
    behind; re-raise its error in the caller's thread."""
    before = threading.active_count()
    outcome = []

    def target():
        try:
            launch()
        except BaseException as error:      # handed to the test's thread
            outcome.append(error)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout=timeout)
    assert not thread.is_alive(), "the launch hangs"
    assert threading.active_count() == before, "the launch left threads running"
    if outcome:
        raise outcome[0]


def import_module_from_text(tmp_path, monkeypatch, name: str, text: str):
    """Write `text` (dedented) as the module `name` in tmp_path and import it afresh (kernels whose source
    must live in a real file: linecache, inspect)."""
    import importlib
    import sys
    import textwrap

    (tmp_path / f"{name}.py").write_text(textwrap.dedent(text))
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    monkeypatch.delitem(sys.modules, name, raising=False)
    return importlib.import_module(name)
