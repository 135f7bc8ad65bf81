"""Output allocation for the op wrappers' prepared launches, at the least host cost."""

from __future__ import annotations

import functools
from typing import Callable

import torch
from torch.fx.experimental.symbolic_shapes import guard_or_false


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


def stride_order(t: torch.Tensor) -> tuple:
    """`t`'s dims from the outermost in memory to the innermost: by decreasing stride, a dim of size 1 inside
    another of its stride (as a dense tensor lays them out), other ties in their order."""
    strides, sizes = t.stride(), t.shape
    if not any(isinstance(n, torch.SymInt) for n in (*strides, *sizes)):
        return tuple(sorted(range(t.dim()), key=lambda d: (-strides[d], bool(sizes[d] == 1))))
    # Symbolic sizes (a fake tensor of torch.compile or torch.export with dynamic shapes): compared in pairs, each
    # comparison guarded as it is made; one that unbacked sizes (which may be 0 or 1) leave undecided (guard_or_false)
    # counts as a tie, so that the dims keep their order (a contiguous tensor's whatever its sizes; only a size-1
    # dim's own stride depends on it), where sorting by the strides raised a data-dependent error.
    return tuple(sorted(range(t.dim()), key=functools.cmp_to_key(
        lambda a, b: _symbolic_stride_order(strides[a], strides[b], sizes[a], sizes[b]))))


def _symbolic_stride_order(stride_a, stride_b, size_a, size_b) -> int:
    """stride_order's comparison of dims a and b (-1: a outer) for symbolic strides and sizes."""
    if guard_or_false(stride_a > stride_b):
        return -1
    if guard_or_false(stride_a < stride_b):
        return 1
    return int(guard_or_false(size_a == 1)) - int(guard_or_false(size_b == 1))


def ordered_strides(shape: tuple, order: tuple) -> tuple:
    """The strides of a dense tensor of `shape` whose dims lie in memory in `order`, outermost first (what
    ordered_allocator's tensors have)."""
    strides, step = [0] * len(shape), 1
    for d in reversed(order):
        strides[d] = step
        step *= shape[d]
    return tuple(strides)


def ordered_allocator(shape: tuple, order: tuple, dtype: torch.dtype, device: torch.device) -> Callable[[], torch.Tensor]:
    """`new()`: an uninitialized dense tensor of `shape` whose dims lie in memory in `order`, outermost first
    (a permutation of range(len(shape)); the identity gives contiguous_allocator's tensor)."""
    if tuple(order) == tuple(range(len(shape))):
        return contiguous_allocator(shape, dtype, device)
    new = contiguous_allocator(tuple(shape[d] for d in order), dtype, device)
    inverse = tuple(order.index(d) for d in range(len(shape)))
    return lambda: new().permute(inverse)


def alias(t: torch.Tensor, shape: tuple, strides: tuple) -> torch.Tensor:
    """A tensor over `t`'s memory (from its storage offset) with `shape` and `strides` that is not a view of `t`
    (t.as_strided would be one): an op's output that is a view is, to autograd, a view made inside a custom
    Function, which may not be modified in place (`y += r`), where torch's own ops' outputs may be. No copy."""
    return t.new_empty(0).set_(t.untyped_storage(), t.storage_offset(), shape, strides)
