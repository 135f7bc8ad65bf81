"""What the launchers ask of a device: its SM count (persistent grids size themselves from it), the shared
memory one CTA may take (configs that need more fall back to smaller ones) and whether its dots run on
wgmma (configs tuned for that path)."""

from __future__ import annotations

import functools

import torch

# The SMs the interpreter plans persistent grids for (CPU tensors have no device to ask).
INTERPRETER_SMS = 4


@functools.lru_cache(maxsize=64)
def _cuda_sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def sm_count(device: torch.device) -> int:
    """The streaming multiprocessors of a CUDA `device` (its current device when it has no index), or
    INTERPRETER_SMS for any other device."""
    if device.type == "cuda":
        return _cuda_sm_count(device.index if device.index is not None else torch.cuda.current_device())
    return INTERPRETER_SMS


# What CPU tensors (the interpreter) plan for: no limit on a CTA's shared memory.
INTERPRETER_SHARED_MEMORY = 1 << 30


@functools.lru_cache(maxsize=64)
def _cuda_shared_memory(index: int) -> int:
    from fusedops.dsl.runtime.driver import device_context
    return device_context(index).properties.max_shared_memory_optin


def max_shared_memory(device: torch.device) -> int:
    """Bytes of shared memory one CTA may use (after the opt-in) on a CUDA `device`, or
    INTERPRETER_SHARED_MEMORY for any other device."""
    if device.type == "cuda":
        return _cuda_shared_memory(device.index if device.index is not None else torch.cuda.current_device())
    return INTERPRETER_SHARED_MEMORY


def wgmma_target(device: torch.device) -> bool:
    """Whether kernels compiled for a CUDA `device` run their dots on wgmma (its target, or
    FUSEDOPS_DEFAULT_ARCH's, is sm_90a and FUSEDOPS_DISABLE_WGMMA is not set); False for any other
    device (the interpreter)."""
    if device.type != "cuda":
        return False
    from fusedops.dsl.passes.dot_layouts import wgmma_enabled
    from fusedops.dsl.runtime import knobs
    from fusedops.dsl.runtime.launcher import device_arch
    return wgmma_enabled(knobs.current().default_arch or device_arch(device))
