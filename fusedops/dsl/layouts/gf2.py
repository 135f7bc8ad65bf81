"""Linear algebra over GF(2) on Python ints used as bit vectors.

A vector is an int whose bit k is its k-th component. A set of vectors is kept in echelon form
(one row per leading bit), each row remembering which of the inserted vectors it is the XOR of, so
that a target vector can be written as a combination of the inserted ones. This is all the
arithmetic linear layouts need (Zhou et al., "Linear Layouts", arXiv 2505.23819).
"""

from __future__ import annotations

from typing import Iterable, Optional


class Span:
    """The span of a growing list of vectors, with combinations tracked.

    `add(v, label)` inserts a vector under a label (an int bit mask, usually `1 << index`);
    `solve(t)` returns the XOR of the labels of inserted vectors whose XOR is `t`, or None when `t`
    is outside the span. Vectors that are dependent on earlier ones are not kept, so solutions only
    use the earliest independent vectors: insertion order is the preference order.
    """

    __slots__ = ("_rows",)

    def __init__(self, vectors: Iterable[int] = ()):
        self._rows: dict[int, tuple[int, int]] = {}   # leading bit -> (vector, label combination)
        for index, vector in enumerate(vectors):
            self.add(vector, 1 << index)

    def _reduce(self, vector: int, label: int) -> tuple[int, int]:
        while vector:
            top = vector.bit_length() - 1
            row = self._rows.get(top)
            if row is None:
                break
            vector ^= row[0]
            label ^= row[1]
        return vector, label

    def add(self, vector: int, label: int) -> bool:
        """Insert `vector`; True if it was independent of the vectors already inserted."""
        residual, combination = self._reduce(vector, label)
        if residual == 0:
            return False
        self._rows[residual.bit_length() - 1] = (residual, combination)
        return True

    def solve(self, target: int) -> Optional[int]:
        """The label combination whose vectors XOR to `target`, or None if `target` is not in the span."""
        residual, combination = self._reduce(target, 0)
        return combination if residual == 0 else None

    def contains(self, target: int) -> bool:
        return self._reduce(target, 0)[0] == 0

    @property
    def rank(self) -> int:
        return len(self._rows)


def rank(vectors: Iterable[int]) -> int:
    """The dimension of the span of `vectors`."""
    return Span(vectors).rank


def xor_combination(vectors: list[int], mask: int) -> int:
    """XOR of vectors[i] for every set bit i of `mask`."""
    out = 0
    index = 0
    while mask:
        if mask & 1:
            out ^= vectors[index]
        mask >>= 1
        index += 1
    return out
