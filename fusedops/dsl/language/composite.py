"""Composite compile-time values: Python objects made of kernel values and numbers (a block pointer) that the
frontend carries through loops, merges after a runtime `if` and passes to and returns from helpers item by
item, as it does a tuple of kernel values and numbers (frontend/loops.py `_TupleSlots`, frontend/control_flow.py
`_merge`). The static part (a block shape, an order) must be the same wherever the value flows.
"""

from __future__ import annotations


class Composite:
    """Base of the composite values. A subclass gives its runtime items (IR values or numbers), their names
    (how errors name a carried item, after the variable's name: `p.offsets[1]`), a copy of itself with other
    items, and whether another value has its static part (so that the items of one can replace the other's).
    What it describes in errors is its repr."""

    __slots__ = ()

    def items(self) -> tuple:
        raise NotImplementedError

    def item_names(self) -> tuple:
        raise NotImplementedError

    def with_items(self, items: tuple) -> "Composite":
        raise NotImplementedError

    def same_layout(self, other) -> bool:
        raise NotImplementedError


def is_composite(value) -> bool:
    return isinstance(value, Composite)
