"""One benchmark point: a case at one shape and dtype on one device, with its inputs, its float64
reference, and the check of any provider's result against it.

    workload = Workload(case, shape, torch.float16, "cuda", seed=0)
    run = workload.bind(providers.resolve(case, "fusedops"))   # run() -> tuple of output tensors
    result = workload.check(run)                               # CheckResult (passed, errors, allowed)

A forward case's `run()` calls the implementation on the inputs. A backward case's `bind` runs the
forward once with the differentiated inputs as leaves, and `run()` is
`torch.autograd.grad(output, leaves, grad_output, retain_graph=True)`: only the backward is timed.
The allowed error comes from PyTorch's own error on the same point (checks.allowed_error), measured
once per workload on first use.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional, Sequence, Tuple, Union

import torch

from . import checks
from .cases import BenchCase, Shape

Outputs = Tuple[torch.Tensor, ...]


def _as_tuple(value) -> tuple:
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


@dataclasses.dataclass(frozen=True)
class CheckResult:
    """Per output tensor: the error and the allowed error; `passed` when every one is within."""

    passed: bool
    errors: Tuple[checks.Error, ...]
    allowed: Tuple[checks.Error, ...]

    @property
    def worst(self) -> Tuple[checks.Error, checks.Error]:
        """(error, allowed) of the output whose norm-relative error is largest against its bound."""
        if not self.errors:
            return checks.INFINITE, checks.INFINITE
        index = max(range(len(self.errors)), key=lambda i: self.errors[i].relative / self.allowed[i].relative)
        return self.errors[index], self.allowed[index]

    def describe(self) -> str:
        error, allowed = self.worst
        verdict = "ok" if self.passed else "FAIL"
        return (f"{verdict}: relative error {error.relative:.2e} (allowed {allowed.relative:.2e}), "
                f"largest element error {error.element:.2e} (allowed {allowed.element:.2e})")


class Workload:
    """Inputs, reference and checks of `case` at `shape` and `dtype` on `device` (see module docstring)."""

    def __init__(self, case: BenchCase, shape: Shape, dtype: torch.dtype, device: Union[str, torch.device],
                 seed: int = 0):
        self.case, self.shape, self.dtype = case, shape, dtype
        self.device = torch.device(device)
        self.options = case.options(shape)
        generator = torch.Generator(device=self.device).manual_seed(seed)
        self.inputs: Outputs = tuple(case.make_inputs(shape, dtype, self.device, generator))
        inputs64 = tuple(t.to(torch.float64) for t in self.inputs)
        self.grad_output: Optional[torch.Tensor] = None
        if not case.backward:
            with torch.no_grad():
                self.reference: Outputs = _as_tuple(case.reference(*inputs64, **self.options))
        else:
            self.reference = self._reference_grads(inputs64, generator)
        self._allowed: Optional[Tuple[checks.Error, ...]] = None

    @property
    def work(self) -> float:
        """Bytes or FLOPs of one call (the case's unit)."""
        return self.case.work(self.shape, self.inputs[0].element_size())

    def _reference_grads(self, inputs64: Outputs, generator: torch.Generator) -> Outputs:
        case = self.case
        if case.reference_grads is not None:
            output = case.reference(*inputs64, **self.options)
            self.grad_output = torch.randn(output.shape, dtype=self.dtype, device=self.device, generator=generator)
            return tuple(case.reference_grads(inputs64, self.grad_output.to(torch.float64), **self.options))
        leaves = self._leaves(inputs64)
        with torch.enable_grad():
            output = case.reference(*leaves, **self.options)
        self.grad_output = torch.randn(output.shape, dtype=self.dtype, device=self.device, generator=generator)
        targets = [leaves[i] for i in case.grad_inputs]
        return tuple(torch.autograd.grad(output, targets, self.grad_output.to(torch.float64)))

    def _leaves(self, inputs: Sequence[torch.Tensor]) -> list:
        leaves = list(inputs)
        for i in self.case.grad_inputs:
            leaves[i] = inputs[i].detach().requires_grad_()
        return leaves

    def bind(self, fn: Callable) -> Callable[[], Outputs]:
        """The zero-argument call that is checked and timed for implementation `fn`.

        For a backward case this runs `fn`'s forward once (and raises what it raises)."""
        inputs, options = self.inputs, self.options
        if not self.case.backward:
            return lambda: fn(*inputs, **options)
        leaves = self._leaves(inputs)
        with torch.enable_grad():
            output = fn(*leaves, **options)
        targets = [leaves[i] for i in self.case.grad_inputs]
        grad_output = self.grad_output
        return lambda: torch.autograd.grad(output, targets, grad_output, retain_graph=True)

    def errors(self, outputs) -> Tuple[checks.Error, ...]:
        """The error of each output against the reference (infinite for a missing or extra one)."""
        outputs = _as_tuple(outputs)
        if len(outputs) != len(self.reference):
            return tuple(checks.INFINITE for _ in self.reference)
        return tuple(checks.measure_error(o, r) for o, r in zip(outputs, self.reference))

    def allowed(self) -> Tuple[checks.Error, ...]:
        """The allowed error per output: the dtype's tolerance, or twice PyTorch's own error."""
        if self._allowed is None:
            try:
                baseline = self.errors(self.bind(self.case.torch_fn)())
            except (RuntimeError, NotImplementedError):   # e.g. an op torch lacks for this dtype on the CPU
                baseline = (None,) * len(self.reference)
            self._allowed = tuple(checks.allowed_error(self.dtype, e) for e in baseline)
        return self._allowed

    def check(self, run: Callable[[], Outputs]) -> CheckResult:
        """Run `run()` once and compare every output with the float64 reference."""
        with torch.no_grad() if not self.case.backward else torch.enable_grad():
            outputs = run()
        errors = self.errors(outputs)
        allowed = self.allowed()
        return CheckResult(all(checks.within(e, a) for e, a in zip(errors, allowed)), errors, allowed)
