"""Small utilities for passes that rewrite the IR: finding uses, replacing values, erasing ops.

The IR keeps no use lists (a `Value` does not know its users), so these helpers walk the function.
Values are tracked by `id()`; every map here also holds a strong reference to the values it is keyed
by, so that an id cannot be reused by a new object while the map is alive.
"""

from __future__ import annotations

from .core import Function, Operation, Value


def uses(function: Function) -> dict:
    """Map id(value) -> list of (operation, operand index) that read it, over the whole function.

    Values without uses are absent. Uses inside nested regions are included.
    """
    result: dict = {}
    for op in function.walk():
        for index, operand in enumerate(op.operands):
            result.setdefault(id(operand), []).append((op, index))
    return result


def replace_all_uses(function: Function, old: Value, new: Value) -> int:
    """Make every operand of `function` that reads `old` read `new` instead; return how many changed.

    The caller keeps the IR well typed: `new` must have `old`'s type and dominate its uses.
    """
    if old is new:
        return 0
    count = 0
    for op in function.walk():
        for index, operand in enumerate(op.operands):
            if operand is old:
                op.operands[index] = new
                count += 1
    return count


class ValueSubstitution:
    """A set of pending replacements old -> new, applied to operands as a pass walks the IR.

    Passes that visit operations in program order (definitions before uses, including uses in
    nested regions) record a replacement when they fold or merge an op and call `apply(op)` on every
    later op: one walk replaces all uses, instead of one walk per replaced value.
    Chains (a -> b, b -> c) resolve to the last value.
    """

    def __init__(self):
        self._map: dict = {}   # id(old) -> (old, new); `old` is kept alive so its id stays unique

    def __bool__(self) -> bool:
        return bool(self._map)

    def __len__(self) -> int:
        return len(self._map)

    def add(self, old: Value, new: Value) -> None:
        if old is not new:
            self._map[id(old)] = (old, new)

    def lookup(self, value: Value) -> Value:
        """The value `value` is replaced by (itself when there is no replacement)."""
        seen = 0
        while True:
            entry = self._map.get(id(value))
            if entry is None or entry[0] is not value:
                return value
            value = entry[1]
            seen += 1
            if seen > len(self._map):
                raise RuntimeError("cyclic value substitution")

    def apply(self, op: Operation) -> bool:
        """Rewrite `op`'s operands through the substitution; True when one changed."""
        changed = False
        if not self._map:
            return False
        for index, operand in enumerate(op.operands):
            new = self.lookup(operand)
            if new is not operand:
                op.operands[index] = new
                changed = True
        return changed

    def apply_to_function(self, function: Function) -> bool:
        """Apply the substitution to every op of `function`; True when an operand changed."""
        changed = False
        for op in function.walk():
            changed |= self.apply(op)
        return changed


def erase_op(op: Operation) -> None:
    """Remove `op` from its block. The caller makes sure nothing still reads its results."""
    block = op.parent
    if block is not None:
        block.ops.remove(op)
        op.parent = None


def insert_before(anchor: Operation, op: Operation) -> Operation:
    """Insert `op` into `anchor`'s block just before `anchor`; returns `op`."""
    block = anchor.parent
    if block is None:
        raise ValueError(f"{anchor!r} is not in a block")
    index = _index_of(block.ops, anchor)
    block.ops.insert(index, op)
    op.parent = block
    return op


def _index_of(ops: list, op: Operation) -> int:
    for index, candidate in enumerate(ops):
        if candidate is op:
            return index
    raise ValueError(f"{op!r} is not in its parent block")
