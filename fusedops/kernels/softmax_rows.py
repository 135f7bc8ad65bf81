"""Softmax geometry: the rows of a reduction over one dim, addressed through every tensor's strides.

Geometry. A tensor reduced over `dim` is addressed as rows: every index of the other dims is one
row of `n` elements. `plan_rows` groups the other dims into at most two (size, stride) groups,
outer and inner, so that row (o, i) of tensor t starts at o * outer_stride[t] + i * inner_stride[t]
and its k-th element sits k * col_stride[t] further: strided inputs need no copy as long as the
other dims collapse to two groups (they always do for contiguous tensors, transposes and
permutations of them; a tensor that does not is copied, see `plan_rows`). Offsets are int64.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import torch


@dataclasses.dataclass(frozen=True)
class RowLayout:
    """The rows of a reduction over one dim, shared by every tensor of one launch.

    Row (o, i), o < outer, i < inner, of tensor t starts at element offset
    o * strides[t][0] + i * strides[t][1]; its k-th element (k < n_cols) is k * strides[t][2] further.
    """

    outer: int
    n_cols: int
    inner: int
    strides: tuple      # per tensor: (outer_stride, inner_stride, col_stride), in elements

    @property
    def n_rows(self) -> int:
        return self.outer * self.inner


def contiguous_strides(shape: Sequence[int]) -> tuple:
    """torch's strides for a contiguous tensor of `shape` (a dim of size 0 or 1 counts as 1)."""
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def _dim_order(shape: Sequence[int], strides: Sequence[int]) -> list:
    """The dims from the slowest to the fastest in memory (ties keep the dims' order)."""
    return sorted(range(len(shape)), key=lambda d: (-strides[d], d))


def plan_rows(shape: Sequence[int], dim: int, strides: Sequence[Sequence[int]]) -> Optional[RowLayout]:
    """Address the rows of a reduction of tensors of `shape` over `dim` through their strides.

    strides: one stride tuple per tensor; the first one's memory order decides how the other dims
        are grouped. Dims are merged where every tensor allows it (stride_a == size_b * stride_b).
    Returns None when the other dims do not collapse to two groups in every tensor (e.g. a
    slice of a slice in two different dims): the caller then copies to contiguous tensors.
    """
    n_cols = shape[dim]
    col_strides = tuple(s[dim] if n_cols > 1 else 1 for s in strides)
    dims = [d for d in _dim_order(shape, strides[0]) if d != dim and shape[d] > 1]
    groups = []     # [size, strides per tensor], slowest first
    for d in dims:
        if groups and all(g == shape[d] * s[d] for g, s in zip(groups[-1][1], strides)):
            groups[-1] = [groups[-1][0] * shape[d], tuple(s[d] for s in strides)]
        else:
            groups.append([shape[d], tuple(s[d] for s in strides)])
    if len(groups) > 2:
        return None
    zeros = (0,) * len(strides)
    if not groups:
        outer, inner = (1, zeros), (1, zeros)
    elif len(groups) == 1:
        size, group_strides = groups[0]
        is_inner = col_strides[0] != 1 and group_strides[0] == 1
        outer, inner = ((1, zeros), (size, group_strides)) if is_inner else ((size, group_strides), (1, zeros))
    else:
        outer, inner = groups
    per_tensor = tuple((o, i, c) for o, i, c in zip(outer[1], inner[1], col_strides))
    return RowLayout(outer[0], n_cols, inner[0], per_tensor)


def empty_in_order_of(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """An uninitialized dense tensor shaped like `x` whose dims lie in memory in `x`'s order, so
    that it groups into rows exactly as `x` does (what empty_like does for dense `x`, extended
    to sliced ones); contiguous for an expanded `x` (a dim of stride 0), as torch's results are:
    there `x`'s order would make the output strided along the expanded dims."""
    if x.is_contiguous() or any(stride == 0 and size > 1 for size, stride in zip(x.shape, x.stride())):
        # empty_like keeps a contiguous x's strides (those of its size-1 dims included, which no
        # row plan reads); it costs half of torch.empty(shape, ...) on the host.
        return torch.empty_like(x) if dtype == x.dtype else torch.empty_like(x, dtype=dtype)
    order = _dim_order(x.shape, x.stride())
    dense = torch.empty([x.shape[d] for d in order], dtype=dtype, device=x.device)
    inverse = [order.index(d) for d in range(x.dim())]
    return dense.permute(inverse)
