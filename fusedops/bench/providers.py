"""Who computes a case: the providers a run compares, and how each one's implementation is found.

    torch          the case's native PyTorch function (eager): the baseline of "speedup vs torch"
    fusedops       the library's implementation (skipped, with the reason, while it does not exist)
    <extra>        more baselines a case lists (e.g. torch-naive, torch-flash, torch-cudnn)
    torch.compile  torch.compile(torch_fn), with --compile
    triton         a Triton kernel from the repository's bench/triton_reference.py, with --triton
                   when triton is installed. The fusedops package never imports Triton: that file
                   lives outside the package and is loaded from its path only when asked for.

Every implementation has the case's calling convention: fn(*inputs, **options).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Callable, List, Sequence, Tuple

from .cases import BenchCase

TORCH = "torch"
FUSEDOPS = "fusedops"
COMPILE = "torch.compile"
TRITON = "triton"

TRITON_REFERENCE = Path(__file__).resolve().parents[2] / "bench" / "triton_reference.py"
_TRITON_MODULE = "fusedops_bench_triton_reference"


class Unavailable(Exception):
    """A provider that cannot run here; the message is the one-line reason."""


def names(case: BenchCase, *, compile: bool = False, triton: bool = False, extras: bool = True) -> Tuple[str, ...]:
    """The providers of `case`, baseline first (the others' checks are relative to it)."""
    result = [TORCH, FUSEDOPS]
    if extras:
        result += [name for name, _ in case.extra_providers]
    if compile and case.compile:
        result.append(COMPILE)
    if triton and case.triton is not None:
        result.append(TRITON)
    return tuple(result)


def available(cases: Sequence[BenchCase]) -> Tuple[List[BenchCase], List[str]]:
    """The cases whose fusedops op exists, and one line per reason for leaving the others out
    ("skipped softmax, softmax_backward: fusedops.softmax is not available yet (...)")."""
    kept, reasons = [], {}
    for case in cases:
        try:
            resolve(case, FUSEDOPS)
            kept.append(case)
        except Unavailable as reason:
            reasons.setdefault(str(reason), []).append(case.name)
    return kept, [f"skipped {', '.join(names)}: {reason}" for reason, names in reasons.items()]


def resolve(case: BenchCase, provider: str) -> Callable:
    """The implementation of `case` by `provider`.

    Raises:
        Unavailable: the fusedops op does not exist yet, triton is not installed, or the case has no
            such provider (the message says which).
    """
    if provider == TORCH:
        return case.torch_fn
    if provider == FUSEDOPS:
        try:
            return case.fusedops()
        except (ImportError, AttributeError) as error:
            raise Unavailable(f"fusedops.{case.fusedops_path} is not available yet "
                              f"({type(error).__name__}: {error})") from None
    if provider == COMPILE:
        import torch

        # A fresh compile per shape and dtype: dynamo's per-function cache of specializations is
        # small (recompile limit), and a run over many shapes would silently fall back to eager.
        torch._dynamo.reset()
        return torch.compile(case.torch_fn, dynamic=False)
    if provider == TRITON:
        if case.triton is None:
            raise Unavailable(f"{case.name} has no Triton reference kernel")
        return getattr(_triton_module(), case.triton)
    for name, fn in case.extra_providers:
        if name == provider:
            return fn
    offered = ", ".join(names(case, compile=True, triton=True))
    raise Unavailable(f"{case.name} has no provider {provider!r}; it has {offered}")


def _triton_module():
    module = sys.modules.get(_TRITON_MODULE)
    if module is not None:
        return module
    if importlib.util.find_spec("triton") is None:
        raise Unavailable("triton is not installed")
    if not TRITON_REFERENCE.is_file():
        raise Unavailable(f"{TRITON_REFERENCE} not found: the Triton references live in the repository's "
                          "bench/ folder, not in the installed package")
    spec = importlib.util.spec_from_file_location(_TRITON_MODULE, TRITON_REFERENCE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[_TRITON_MODULE] = module     # Triton's @jit looks its kernels' module up by name
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[_TRITON_MODULE]
        raise
    return module
