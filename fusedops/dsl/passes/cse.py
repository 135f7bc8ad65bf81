"""Common-subexpression elimination of pure ops.

Two ops are the same expression when they have the same op code, attrs, result types and operands
(in any order for commutative ops). The later one is removed and its uses read the earlier one's
results. What may be merged:
- pure ops without regions: not LOAD (a store between two loads may change memory), not atomics,
  stores, print or assert, not FOR/IF/WHILE or terminators;
- across regions: an op inside a loop or branch body reuses an equal op of an enclosing region that
  comes before it; ops in sibling regions (the then/else of an IF, two loops) never share, since
  one region's values do not dominate the other's.
"""

from __future__ import annotations

import collections
import struct

from ..ir.core import Block, Function, Operation
from ..ir.ops import COMMUTATIVE, CONTROL_FLOW, SIDE_EFFECTS, OpCode
from ..ir.rewrite import ValueSubstitution

_NOT_MERGEABLE = SIDE_EFFECTS | CONTROL_FLOW | frozenset({OpCode.LOAD, OpCode.DESCRIPTOR_LOAD})


def eliminate_common_subexpressions(function: Function) -> bool:
    """Merge equal pure ops of `function` (see the module docstring); True when the IR changed."""
    return _cse_block(function.body, collections.ChainMap(), ValueSubstitution())


def _cse_block(block: Block, scope: collections.ChainMap, substitution: ValueSubstitution) -> bool:
    changed = False
    kept = []
    for op in block.ops:
        changed |= substitution.apply(op)
        for region in op.regions:
            changed |= _cse_block(region, scope.new_child(), substitution)
        key = _key(op)
        if key is None:
            kept.append(op)
            continue
        existing = scope.get(key)
        if existing is None:
            scope[key] = op
            kept.append(op)
            continue
        for old, new in zip(op.results, existing.results):
            substitution.add(old, new)
        op.parent = None
        changed = True
    block.ops = kept
    return changed


def _key(op: Operation):
    """A hashable description of what `op` computes, or None when it must not be merged."""
    if op.opcode in _NOT_MERGEABLE or op.regions or not op.results:
        return None
    if any(result.layout is not None for result in op.results):
        return None   # values with layouts are merged by the layout passes, if at all
    operands = tuple(id(v) for v in op.operands)
    if op.opcode in COMMUTATIVE:
        operands = tuple(sorted(operands))
    attrs = tuple(sorted((name, _freeze(value)) for name, value in op.attrs.items()))
    types = tuple(result.type for result in op.results)
    return (op.opcode, operands, attrs, types)


def _freeze(value):
    """A hashable form of an attr that tells apart what == does not (0.0 and -0.0, 1 and True, and
    NaNs of either sign, which float.hex() writes alike)."""
    if isinstance(value, float):
        return ("float", struct.pack("<d", value))
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, (list, tuple)):
        return ("seq", tuple(_freeze(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple(sorted((k, _freeze(v)) for k, v in value.items())))
    return (type(value).__name__, value)
