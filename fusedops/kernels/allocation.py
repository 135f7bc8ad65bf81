"""Output allocation for the op wrappers' prepared launches, at the least host cost."""

from __future__ import annotations

import functools
from typing import Callable

import torch


def contiguous_allocator(shape: tuple, dtype: torch.dtype, device: torch.device,
                         allocate: Callable = torch.empty) -> Callable[[], torch.Tensor]:
    """`new()`: an uninitialized contiguous tensor of `shape` and `dtype` on `device`, made by
    `allocate` (torch.empty, or a stand-in with its signature, e.g. a test's poisoning allocator).

    With torch.empty and a shape of at least one dim and no 0, `new` is torch.empty_like of one element expanded to
    `shape`: those strides (0) are not dense, so empty_like returns a contiguous tensor
    (torch.preserve_format). Inside a training step that costs under half the host time of
    torch.empty(shape, ...) or new_empty(shape), which parse the shape on every call
    (.scratch/bench_host_cpu.py).
    """
    if allocate is torch.empty and shape and 0 not in shape:      # (a 0-d shape: one element cannot expand to it)
        return functools.partial(torch.empty_like, torch.empty(1, dtype=dtype, device=device).expand(shape))
    return functools.partial(allocate, shape, dtype=dtype, device=device)
