"""The questions codegen asks of a distributed layout, answered from its linear-layout bases.

A distributed layout maps the bits of (register, lane, warp) to element coordinates by XOR of one
basis vector per set bit (see fusedops/dsl/layouts). Codegen needs the bases per input dim, the
coordinates a register index contributes, and which registers hold which element.
"""

from __future__ import annotations

import functools


def shape(layout) -> tuple:
    return tuple(layout.shape)


def register_bases(layout) -> tuple:
    return tuple(tuple(b) for b in layout.bases_of("register"))


def lane_bases(layout) -> tuple:
    return tuple(tuple(b) for b in layout.bases_of("lane"))


def warp_bases(layout) -> tuple:
    return tuple(tuple(b) for b in layout.bases_of("warp"))


def cache_key(layout):
    return (shape(layout), register_bases(layout), lane_bases(layout), warp_bases(layout))


def num_registers(layout) -> int:
    return 1 << len(register_bases(layout))


@functools.lru_cache(maxsize=4096)
def register_table(layout) -> tuple:
    """The coordinates each register contributes (the XOR of its set bits' bases), in register order."""
    return tuple(tuple(layout.apply(register=r)) for r in range(num_registers(layout)))


def register_coordinates(layout, register: int) -> tuple:
    """The coordinates register `register` contributes (with lane 0 and warp 0)."""
    return register_table(layout)[register]


def register_bits_disjoint(layout, dim: int) -> bool:
    """Whether, along `dim`, the register bases use bits no lane/warp basis uses (then XOR == OR)."""
    reg_bits = 0
    for basis in register_bases(layout):
        reg_bits |= basis[dim]
    other = 0
    for basis in lane_bases(layout) + warp_bases(layout):
        other |= basis[dim]
    return reg_bits & other == 0


def register_map(source, target, project=None):
    """For each register of `target`, the register of `source` that holds, in the same thread, the
    element `project(target coords)`; None when no such register exists for some thread.

    `project` maps target coordinates to source coordinates and must be linear over GF(2) (identity,
    zeroing broadcast dims, dropping or adding size-1 dims, permuting, reshaping power-of-two dims):
    then the lanes and warps agree exactly when the projected lane and warp bases equal the
    source's, and registers can be matched by their constant coordinates.
    """
    project = project or (lambda coords: tuple(coords))
    for bases_of in (lane_bases, warp_bases):
        projected = tuple(project(b) for b in bases_of(target))
        if projected != bases_of(source):
            return None
    index = {}
    for r, coords in enumerate(register_table(source)):
        index.setdefault(coords, r)
    out = []
    for coords in register_table(target):
        found = index.get(project(coords))
        if found is None:
            return None
        out.append(found)
    return out
