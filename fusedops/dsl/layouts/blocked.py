"""Blocked layouts: each thread holds a small contiguous tile, threads and warps tile the block.

The semantics are those of Triton's "blocked encoding" (written here from its description, as a
linear layout): along every dim d a thread holds size_per_thread[d] consecutive elements, the lanes
of a warp are spread threads_per_warp[d] along d, and the warps warps_per_cta[d]. `order` lists the
dims from the fastest-varying (contiguous) to the slowest, and says in which order the register,
lane and warp index bits walk the dims. The resulting CTA tile (spt * tpw * wpc along each dim) is
then fitted to the block:
  - a block larger than the tile along d repeats the tile: extra register bits (the "repetitions",
    after all per-thread bits) step by the tile size;
  - a block smaller than the tile along d: register bits past the block are dropped, lane and warp
    bits past it get the zero basis (those threads hold duplicates: a broadcast).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from .linear import LANE_BITS, WARP_SIZE, LinearLayout, distributed, log2_exact, maybe_unit, unit, zero
from .vectorize import MAX_VECTOR_BYTES, element_bytes


@dataclasses.dataclass(frozen=True)
class BlockedParams:
    """The parameters of a blocked layout; see the module docstring.

    shape, size_per_thread, threads_per_warp, warps_per_cta: one power of two per dim;
    prod(threads_per_warp) == 32. order: a permutation of the dims, fastest first.
    """

    shape: tuple
    size_per_thread: tuple
    threads_per_warp: tuple
    warps_per_cta: tuple
    order: tuple

    def __post_init__(self):
        rank = len(self.shape)
        fields = (self.size_per_thread, self.threads_per_warp, self.warps_per_cta, self.order)
        if any(len(f) != rank for f in fields):
            raise ValueError(f"blocked layout parameters must all have rank {rank}: {self}")
        for name in ("shape", "size_per_thread", "threads_per_warp", "warps_per_cta"):
            for value in getattr(self, name):
                log2_exact(value, name)
        threads = 1
        for t in self.threads_per_warp:
            threads *= t
        if threads != WARP_SIZE:
            raise ValueError(f"threads_per_warp {self.threads_per_warp} must multiply to {WARP_SIZE}")
        if sorted(self.order) != list(range(rank)):
            raise ValueError(f"order {self.order} is not a permutation of range({rank})")

    @property
    def num_warps(self) -> int:
        n = 1
        for w in self.warps_per_cta:
            n *= w
        return n

    def layout(self) -> LinearLayout:
        return blocked(self.shape, self.size_per_thread, self.threads_per_warp, self.warps_per_cta,
                       self.order)


def blocked(shape: Sequence[int], size_per_thread: Sequence[int], threads_per_warp: Sequence[int],
            warps_per_cta: Sequence[int], order: Sequence[int]) -> LinearLayout:
    """The blocked layout of a block of `shape` (see the module docstring).

    Register index = per-thread bits (dims in `order`), then repetition bits (dims in `order`);
    lane and warp indices walk the dims in `order` too. Raises ValueError for invalid parameters.
    """
    params = BlockedParams(tuple(shape), tuple(size_per_thread), tuple(threads_per_warp),
                           tuple(warps_per_cta), tuple(order))
    shape = params.shape
    rank = len(shape)
    register, lane, warp = [], [], []
    for d in params.order:
        for k in range(log2_exact(params.size_per_thread[d])):
            basis = maybe_unit(shape, d, 1 << k)
            if basis is not None:            # registers past the block are dropped
                register.append(basis)
    for bases, sizes, inner in ((lane, params.threads_per_warp, params.size_per_thread),
                                (warp, params.warps_per_cta, _tile(params, with_warps=False))):
        for d in params.order:
            for k in range(log2_exact(sizes[d])):
                basis = maybe_unit(shape, d, inner[d] << k)
                bases.append(basis if basis is not None else zero(rank))
    tile = _tile(params, with_warps=True)
    for d in params.order:
        step = tile[d]
        while step < shape[d]:
            register.append(unit(rank, d, step))
            step <<= 1
    return distributed(shape, register, lane, warp)


def _tile(params: BlockedParams, with_warps: bool) -> tuple:
    return tuple(s * t * (w if with_warps else 1) for s, t, w in
                 zip(params.size_per_thread, params.threads_per_warp, params.warps_per_cta))


def default_blocked_params(shape: Sequence[int], num_warps: int, element_bits: int) -> BlockedParams:
    """A coalesced blocked layout for a block of `shape` over `num_warps` warps.

    Each thread holds a vector of up to 16 bytes along the last (contiguous) dim, but no more than
    numel / (32 * num_warps) elements so that threads are not left idle; lanes fill the last dim
    first, then the dims before it; warps go along dim0 first, then later dims. Lanes and warps
    left over once the block is covered are put on dim0, where they hold duplicates (broadcast).
    element_bits: the element type's width (int1 counts as 8, as it is stored in a byte).
    Raises ValueError for a rank-0 shape (it has no blocked parameters) or non-power-of-two sizes.
    """
    shape = tuple(shape)
    rank = len(shape)
    if rank == 0:
        raise ValueError("a rank-0 block has no blocked layout; use scalar_layout(num_warps)")
    log2_exact(num_warps, "num_warps")
    for s in shape:
        log2_exact(s, "block dim")
    numel = 1
    for s in shape:
        numel *= s
    vec = min(MAX_VECTOR_BYTES // element_bytes(element_bits), shape[-1], max(1, numel // (WARP_SIZE * num_warps)))
    size_per_thread = [1] * rank
    size_per_thread[-1] = vec
    threads = [1] * rank
    left = WARP_SIZE
    for d in reversed(range(rank)):
        threads[d] = min(left, max(1, shape[d] // size_per_thread[d]))
        left //= threads[d]
    threads[0] *= left
    warps = [1] * rank
    left = num_warps
    for d in range(rank):
        warps[d] = min(left, max(1, shape[d] // (size_per_thread[d] * threads[d])))
        left //= warps[d]
    warps[0] *= left
    return BlockedParams(shape, tuple(size_per_thread), tuple(threads), tuple(warps),
                         tuple(reversed(range(rank))))


def default_blocked(shape: Sequence[int], num_warps: int, element_bits: int) -> LinearLayout:
    """`default_blocked_params(shape, num_warps, element_bits).layout()`; `scalar_layout` for shape ()."""
    if len(shape) == 0:
        return scalar_layout(num_warps)
    return default_blocked_params(shape, num_warps, element_bits).layout()


def scalar_layout(num_warps: int) -> LinearLayout:
    """The layout of a rank-0 block: one register, every thread holds the value."""
    warp_bits = log2_exact(num_warps, "num_warps")
    return distributed((), [], [()] * LANE_BITS, [()] * warp_bits)
