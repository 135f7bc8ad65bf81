"""What the launchers ask of a device: its SM count (persistent grids size themselves from it)."""

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
