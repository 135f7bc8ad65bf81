"""The interpreter's memory: tensor storages as byte regions, addressed by int64 byte addresses.

A pointer value is an int64 byte address. Every tensor argument registers its whole underlying storage
as a `Region` (a writable uint8 NumPy view of the bytes, or of a CPU copy of them); a load or store
finds the region of each address, checks bounds and alignment, and gathers or scatters typed values.
Values cross the memory boundary in their compute representation (see `language/numerics/`):
bfloat16 is stored as its 16 high float32 bits, int1 as one byte (0 or 1; any non-zero byte loads as
True).
"""

from __future__ import annotations

import bisect
import ctypes
import dataclasses

import numpy as np

from ..language.numerics import conversions
from ..language.dtypes import DType, bfloat16


class AccessFault(Exception):
    """An access touched bytes outside every region, or was not aligned to its element size.

    `lanes` are positions in the flat array of addresses passed in (not yet mapped back to block
    coordinates); the caller turns the fault into an `InterpreterError` with source location.
    """

    def __init__(self, kind: str, addresses: np.ndarray, lanes: np.ndarray, itemsize: int):
        self.kind = kind              # "out of bounds" or "misaligned"
        self.addresses = addresses    # the offending addresses, int64
        self.lanes = lanes            # their positions in the access
        self.itemsize = itemsize
        super().__init__(f"{kind} access at {len(addresses)} lanes")


@dataclasses.dataclass
class Region:
    """`nbytes` bytes at address `base`; `data` is a writable uint8 array over them; `names` are the
    arguments whose storage it is (for messages); `parts`: the regions a merged one covers (their arrays own
    the memory `data` views)."""

    base: int
    nbytes: int
    data: np.ndarray
    names: list
    parts: tuple = ()

    def __post_init__(self):
        self._typed: dict = {}

    def _typed_view(self, storage: np.dtype) -> np.ndarray:
        view = self._typed.get(storage)
        if view is None:
            usable = self.nbytes - self.nbytes % storage.itemsize
            view = self._typed[storage] = self.data[:usable].view(storage)
        return view

    def gather(self, addresses: np.ndarray, storage: np.dtype) -> np.ndarray:
        offsets = addresses - self.base
        size = storage.itemsize
        if self.base % size == 0:
            return self._typed_view(storage)[offsets // size]
        return self.data[offsets[:, None] + np.arange(size)].view(storage).reshape(-1)

    def scatter(self, addresses: np.ndarray, values: np.ndarray, storage: np.dtype) -> None:
        offsets = addresses - self.base
        size = storage.itemsize
        if self.base % size == 0:
            self._typed_view(storage)[offsets // size] = values
        else:
            self.data[offsets[:, None] + np.arange(size)] = \
                np.ascontiguousarray(values, dtype=storage).view(np.uint8).reshape(-1, size)


def storage_dtype(dtype: DType) -> np.dtype:
    """The NumPy dtype of `dtype`'s bytes in memory."""
    if dtype == bfloat16:
        return np.dtype(np.uint16)
    if dtype.is_bool:
        return np.dtype(np.uint8)
    return dtype.numpy_dtype


def _from_storage(raw: np.ndarray, dtype: DType) -> np.ndarray:
    if dtype == bfloat16 or dtype.is_bool:
        return conversions.from_bits(raw, dtype)
    return raw


def _to_storage(values: np.ndarray, dtype: DType) -> np.ndarray:
    if dtype == bfloat16:
        # values that already are bfloat16 (low 16 float32 bits zero) keep their bits, signalling NaNs
        # included (rounding would set their quiet bit; the GPU's 16-bit store moves the bits as they are)
        bits = np.asarray(values, dtype=np.float32).view(np.uint32)
        exact = (bits & 0xFFFF) == 0
        if exact.all():
            return (bits >> 16).astype(np.uint16)
        return np.where(exact, (bits >> 16).astype(np.uint16),
                        conversions.to_bits(conversions.round_to_bfloat16(values), dtype))
    if dtype.is_bool:
        return np.asarray(values, dtype=np.bool_).view(np.uint8)
    return np.asarray(values, dtype=dtype.numpy_dtype)


def _bits(raw: np.ndarray) -> np.ndarray:
    """Stored values as unsigned integers of their width (NaNs compare by their bits)."""
    raw = np.ascontiguousarray(raw)
    return raw.view(np.dtype(f"u{raw.dtype.itemsize}"))


def _merge_overlapping(regions: list) -> list:
    """`regions` (sorted by base) with each run of overlapping ones made one region over their union, so that
    an access finds all the bytes around it (storages over one buffer: a NumPy array and a slice of it, each
    through torch.from_numpy). Only CPU storages used in place can overlap (a device storage's bytes are a
    fresh copy), so the union is memory those storages' owner holds, contiguous, and addressed as it is."""
    merged = []
    for region in regions:
        last = merged[-1] if merged else None
        if last is None or region.base >= last.base + last.nbytes:
            merged.append(region)
            continue
        end = max(last.base + last.nbytes, region.base + region.nbytes)
        union = np.ctypeslib.as_array((ctypes.c_uint8 * (end - last.base)).from_address(last.base))
        merged[-1] = Region(base=last.base, nbytes=end - last.base, data=union, names=last.names + region.names,
                            parts=(last.parts or (last,)) + (region,))
    return merged


class Memory:
    """The regions of one launch, sorted by address. Accesses take flat int64 address arrays.

    `version` counts the writes that may have changed memory: every store, and the atomics that changed
    some value's bits (an `atomic_add(p, 0)` or a failed `atomic_cas` does not), so that a loop can tell
    that memory is as it was (rules_control's spin-wait check).
    """

    def __init__(self, regions: list):
        self.version = 0
        self.regions = _merge_overlapping(sorted(regions, key=lambda r: r.base))
        self._base_list = [r.base for r in self.regions]
        self._bases = np.array(self._base_list, dtype=np.int64)
        self._ends = np.array([r.base + r.nbytes for r in self.regions], dtype=np.int64)

    def locate(self, addresses: np.ndarray, itemsize: int) -> np.ndarray:
        """The region index of each address; AccessFault when any access of `itemsize` bytes starting
        there is misaligned or not wholly inside one region."""
        if itemsize > 1 and np.bitwise_and(addresses, itemsize - 1).any():
            lanes = np.flatnonzero(np.bitwise_and(addresses, itemsize - 1))
            raise AccessFault("misaligned", addresses[lanes], lanes, itemsize)
        if not self.regions and addresses.size:
            raise AccessFault("out of bounds", addresses, np.arange(addresses.size), itemsize)
        if not self.regions:
            return np.zeros(0, dtype=np.int64)
        index = np.searchsorted(self._bases, addresses, side="right") - 1
        clipped = np.maximum(index, 0)
        # `addresses <= end - itemsize` rather than `addresses + itemsize <= end`: no int64 overflow.
        inside = (index >= 0) & (addresses <= self._ends[clipped] - itemsize)
        if not inside.all():
            lanes = np.flatnonzero(~inside)
            raise AccessFault("out of bounds", addresses[lanes], lanes, itemsize)
        return clipped

    def _split(self, addresses: np.ndarray, itemsize: int):
        """(region, selector) pairs covering all addresses; the selector is None for all of them."""
        if addresses.size == 0:
            return []
        if self.regions and (itemsize == 1 or not int(np.bitwise_or.reduce(addresses)) & (itemsize - 1)):
            # Fast path: when the lowest and highest access fall in one region, all of them do.
            low, high = int(addresses.min()), int(addresses.max())
            first = bisect.bisect_right(self._base_list, low) - 1
            if first >= 0 and high <= int(self._ends[first]) - itemsize:
                return [(self.regions[first], None)]
        index = self.locate(addresses, itemsize)
        return [(self.regions[r], index == r) for r in np.unique(index)]

    def read(self, addresses: np.ndarray, dtype: DType) -> np.ndarray:
        """Values of `dtype` at the flat int64 `addresses`, in compute representation."""
        storage = storage_dtype(dtype)
        raw = np.empty(addresses.shape, dtype=storage)
        for region, selector in self._split(addresses, storage.itemsize):
            if selector is None:
                raw = region.gather(addresses, storage)
            else:
                raw[selector] = region.gather(addresses[selector], storage)
        return _from_storage(raw, dtype)

    def write(self, addresses: np.ndarray, values: np.ndarray, dtype: DType) -> None:
        """Store `values` (same length as the flat `addresses`); with repeated addresses the last lane
        wins."""
        storage = storage_dtype(dtype)
        raw = _to_storage(values, dtype)
        self.version += 1
        for region, selector in self._split(addresses, storage.itemsize):
            if selector is None:
                region.scatter(addresses, raw, storage)
            else:
                region.scatter(addresses[selector], raw[selector], storage)

    def read_modify_write(self, addresses: np.ndarray, dtype: DType, update) -> np.ndarray:
        """Atomically, lane by lane in lane order: old = memory[address]; memory[address] =
        update(old, lanes). Returns every lane's old value.

        Lanes with distinct addresses are applied together, in rounds: round k handles the k-th lane
        of every address, so lanes that share an address see each other's writes in lane order.
        `update(old_values, lane_indices)` gets the old values and the lanes they belong to.
        """
        old = np.empty(addresses.shape, dtype=dtype.numpy_dtype)
        if addresses.size:
            self.locate(addresses, storage_dtype(dtype).itemsize)   # fault before any lane writes
        remaining = np.arange(addresses.size)
        while remaining.size:
            _, first = np.unique(addresses[remaining], return_index=True)
            lanes = remaining[first]
            current = self.read(addresses[lanes], dtype)
            old[lanes] = current
            new = update(current, lanes)
            if not np.array_equal(_bits(_to_storage(new, dtype)), _bits(_to_storage(current, dtype))):
                self.write(addresses[lanes], new, dtype)     # (unchanged bits: no write, memory's version kept)
            keep = np.ones(remaining.size, dtype=bool)
            keep[first] = False
            remaining = remaining[keep]
        return old
