"""The `AxisInfo` lattice of the pointer analysis and the arithmetic on it shared by its rules.

Definitions, per dimension d of a value of shape S (a scalar is treated as shape (1,)); every number
is a power of two:
- contiguity c: along d the value splits into aligned runs of c elements (starting at indices that
  are multiples of c) in which each element is the previous plus one. For a pointer the step is one
  element (its pointee's itemsize in bytes).
- divisibility v: the first element of every run of c is divisible by v. With c == 1 every element
  is. For a pointer v is in bytes (an address alignment); for an integer, in units of 1.
- constancy k: along d the value splits into aligned runs of k equal elements.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from ..ir.core import Value
from ..language.dtypes import BlockType, DType, PointerType, shape_of

# Divisibility of 0, and the cap of every divisibility (a larger power of two is never useful).
MAX_DIVISIBILITY = 1 << 32


@dataclasses.dataclass(frozen=True)
class AxisInfo:
    """What the pointer analysis proved about one value; tuples have one entry per dimension.

    Attributes:
        contiguity: per dim, the length of the aligned runs of consecutive values (see module doc).
        divisibility: per dim, the largest power of two known to divide the first element of each
            run of `contiguity` elements (every element when contiguity is 1). Pointers: in bytes.
        constancy: per dim, the length of the aligned runs of equal values.
        constant: the integer value of every element, when all are equal and known; else None.
        nonnegative: every element is >= 0 (ignoring wrap-around), which the rules for `//` and `%`
            need because those truncate toward zero.
    Scalars have 1-tuples: (1,), (their divisibility,), (1,).
    """

    contiguity: tuple
    divisibility: tuple
    constancy: tuple
    constant: Optional[int] = None
    nonnegative: bool = False

    @property
    def rank(self) -> int:
        return len(self.contiguity)


def pow2_divisor(n: int) -> int:
    """The largest power of two dividing `n` (MAX_DIVISIBILITY for 0), capped."""
    n = abs(int(n))
    return MAX_DIVISIBILITY if n == 0 else min(n & -n, MAX_DIVISIBILITY)


def floor_pow2(n: int) -> int:
    """The largest power of two <= n (1 for n < 1)."""
    return 1 << (int(n).bit_length() - 1) if n >= 1 else 1


def cap(v: int) -> int:
    return min(v, MAX_DIVISIBILITY)


def info_shape(value: Value) -> tuple:
    """The shape a value's AxisInfo describes: its block shape, or (1,) for a scalar."""
    return shape_of(value.type) or (1,)


def element_type(value: Value):
    return value.type.element if isinstance(value.type, BlockType) else value.type


def unit(value: Value) -> int:
    """What one step of a run adds to the divisibility measure: the pointee size for pointers."""
    element = element_type(value)
    return element.element.itemsize if isinstance(element, PointerType) else 1


def is_unsigned(value: Value) -> bool:
    element = element_type(value)
    return isinstance(element, DType) and element.kind in ("uint", "bool")


def default_info(shape: tuple) -> AxisInfo:
    """Nothing known: runs of 1, divisibility 1."""
    ones = (1,) * len(shape)
    return AxisInfo(ones, ones, ones)


def constant_info(shape: tuple, value: int) -> AxisInfo:
    """A block (or scalar) whose every element is the integer `value`."""
    ones = (1,) * len(shape)
    return AxisInfo(ones, (pow2_divisor(value),) * len(shape), tuple(shape), int(value), value >= 0)


def uniform_info(shape: tuple) -> AxisInfo:
    """A block whose elements are all equal, value unknown (e.g. a float constant)."""
    ones = (1,) * len(shape)
    return AxisInfo(ones, ones, tuple(shape))


def divisibility_at(info: AxisInfo, d: int, run: int, step: int) -> int:
    """The divisibility of the elements at indices that are multiples of `run` along dim d.

    Runs of `run` >= the contiguity start where the value's runs start; shorter runs start inside
    a run, at first + j * run elements, so they keep at most `run * step` of the divisibility.
    """
    c, v = info.contiguity[d], info.divisibility[d]
    return v if run >= c else min(v, run * step)


def element_divisibility(info: AxisInfo, step: int) -> int:
    """A power of two dividing every element of the value."""
    return max(divisibility_at(info, d, 1, step) for d in range(info.rank))


def without_contiguity(info: AxisInfo, step: int) -> AxisInfo:
    """`info` claiming runs of 1 only: the divisibility becomes that of every element."""
    divisibility = tuple(divisibility_at(info, d, 1, step) for d in range(info.rank))
    return dataclasses.replace(info, contiguity=(1,) * info.rank, divisibility=divisibility)


def join(a: AxisInfo, b: AxisInfo, step: int) -> AxisInfo:
    """What holds for a value that is either `a` or `b` (loop-carried values, if results)."""
    contiguity, divisibility, constancy = [], [], []
    for d in range(a.rank):
        c = min(a.contiguity[d], b.contiguity[d])
        contiguity.append(c)
        divisibility.append(min(divisibility_at(a, d, c, step), divisibility_at(b, d, c, step)))
        constancy.append(min(a.constancy[d], b.constancy[d]))
    constant = a.constant if a.constant is not None and a.constant == b.constant else None
    return AxisInfo(tuple(contiguity), tuple(divisibility), tuple(constancy), constant,
                    a.nonnegative and b.nonnegative)


def with_facts(info: AxisInfo, value: Value) -> AxisInfo:
    """`info` with what the value's type implies: unsigned and int1 values are non-negative."""
    if is_unsigned(value) and not info.nonnegative:
        return dataclasses.replace(info, nonnegative=True)
    return info
