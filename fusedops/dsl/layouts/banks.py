"""Shared-memory vector width and a bank-conflict model for a warp's access through a layout.

Model (CUDA C++ Programming Guide, "Shared Memory" of compute capability 5.x and later; the
wavefront view of Nsight Compute): shared memory has 32 banks of 4-byte words; a warp's access
instruction is served in phases of 128 bytes (32 lanes for accesses of up to 4 bytes per lane, 16
lanes for 8-byte vectors, 8 lanes for 16-byte vectors). A phase takes as many wavefronts as the
largest number of *distinct* words it touches in one bank (lanes reading the same word share it).
The ideal is one wavefront per phase; the excess is the bank conflicts.

Because the map (register, lane, warp) -> offset is linear, the address set of any register group
of any warp is that of group 0 of warp 0 XORed with a constant, which permutes banks and words: all
access instructions of all warps have the same number of wavefronts. We still count every register
group of warp 0, which keeps the counter independent of that argument.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from .linear import LinearLayout
from .shared import shared_offsets
from . import vectorize
from .vectorize import element_bytes

NUM_BANKS = 32
BANK_BYTES = 4
PHASE_BYTES = 128


def shared_vector_width(layout: LinearLayout, shared: LinearLayout, element_bits: int) -> int:
    """The widest shared-memory vector access (elements) for distributed `layout` with `shared`."""
    return vectorize.vector_width(shared_offsets(layout, shared), 0, element_bits)


@dataclasses.dataclass(frozen=True)
class SharedAccessCost:
    """The cost of one warp storing or loading all its registers of a block through shared memory.

    vector_width: elements per access; accesses: access instructions per thread; wavefronts: total
    wavefronts of those instructions for warp 0; ideal_wavefronts: the same without bank conflicts.
    """

    vector_width: int
    accesses: int
    wavefronts: int
    ideal_wavefronts: int

    @property
    def conflicts(self) -> int:
        """Extra wavefronts caused by bank conflicts (0: conflict-free)."""
        return self.wavefronts - self.ideal_wavefronts


def _lanes_per_phase(access_bytes: int) -> int:
    return NUM_BANKS if access_bytes <= BANK_BYTES else PHASE_BYTES // access_bytes


def phase_wavefronts(byte_addresses: list, access_bytes: int) -> tuple:
    """(wavefronts, phases) of one warp access: lane i accesses access_bytes at byte_addresses[i]."""
    per_phase = _lanes_per_phase(access_bytes)
    wavefronts = phases = 0
    for start in range(0, len(byte_addresses), per_phase):
        words_per_bank: dict = {}
        for address in byte_addresses[start:start + per_phase]:
            for word in range(address // BANK_BYTES, (address + access_bytes - 1) // BANK_BYTES + 1):
                words_per_bank.setdefault(word % NUM_BANKS, set()).add(word)
        wavefronts += max(len(words) for words in words_per_bank.values())
        phases += 1
    return wavefronts, phases


def group_wavefronts(offsets: LinearLayout, vector_width: int, element_bits: int, group: int = 0) -> tuple:
    """(wavefronts, phases) of warp 0's access instruction for register group `group`."""
    size = element_bytes(element_bits)
    base = offsets.apply(register=group * vector_width)[0]
    addresses = [(base ^ offsets.apply(lane=lane)[0]) * size for lane in range(offsets.num_lanes)]
    return phase_wavefronts(addresses, vector_width * size)


def shared_access_cost(layout: LinearLayout, shared: LinearLayout, element_bits: int,
                       vector_width: Optional[int] = None) -> SharedAccessCost:
    """The wavefronts warp 0 needs to store (or load) all registers of `layout` into `shared`.

    vector_width: elements per access; default the widest legal one (`shared_vector_width`).
    Raises ValueError if `vector_width` is wider than the layouts allow.
    """
    offsets = shared_offsets(layout, shared)
    widest = vectorize.vector_width(offsets, 0, element_bits)
    vector_width = widest if vector_width is None else vector_width
    if vector_width > widest or widest % vector_width:
        raise ValueError(f"vector width {vector_width} is not possible here (at most {widest})")
    accesses = max(1, layout.num_registers // vector_width)
    wavefronts = ideal = 0
    for group in range(accesses):
        w, p = group_wavefronts(offsets, vector_width, element_bits, group)
        wavefronts += w
        ideal += p
    return SharedAccessCost(vector_width, accesses, wavefronts, ideal)


def bank_conflicts(layout: LinearLayout, shared: LinearLayout, element_bits: int,
                   vector_width: Optional[int] = None) -> int:
    """Extra wavefronts from bank conflicts for warp 0's access (0 = conflict-free)."""
    return shared_access_cost(layout, shared, element_bits, vector_width).conflicts
