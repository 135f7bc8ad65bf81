"""Pointer analysis: contiguity, divisibility and constancy of every integer and pointer value.

For each value and each dimension of its block the analysis proves (definitions in `_axis_info.py`):
- contiguity: runs of consecutive values (`arange(0, 128)` -> 128);
- divisibility: the largest power of two dividing the first element of each run (pointers: bytes);
- constancy: runs of equal values (`offs < n` with n a multiple of 16 -> runs of 16).
Code generation turns these into vector widths: `vector_width` says how many consecutive elements
along a dim (the one a layout's leading registers step in) one load or store may move at once.

It is a forward dataflow analysis over the structured IR, one transfer rule per op
(`_axis_rules.py`); loop-carried values are iterated to a fixed point of the join (the facts that
hold for both the initial and the yielded value). Kernel arguments start from
`Function.arg_hints`: {"divisibility": 16} makes a pointer 16-byte aligned and an integer a multiple
of 16; otherwise pointers are element-aligned (torch allocations are) and integers divisible by 1.
`multiple_of` / `max_contiguous` hints raise the facts to what they state (trusted, not checked).

Source of the idea: Triton's AxisInfo analysis (`lib/Analysis/AxisInfo.cpp`, contiguity /
divisibility / constancy per dimension). This is our own code and formulation.
"""

from __future__ import annotations

import types
from typing import Mapping, Optional

from ..ir.core import Block, Function, Operation, Value
from ..ir.ops import OpCode
from ..language.dtypes import PointerType, shape_of
from ._axis_info import (MAX_DIVISIBILITY, AxisInfo, default_info, element_type, floor_pow2, info_shape,
                         join, pow2_divisor, unit, with_facts)
from ._axis_rules import infer

__all__ = ["AxisInfo", "AnalysisResult", "analyze_pointers", "vector_width", "MAX_DIVISIBILITY"]

# Each round of a loop's fixed point can only lower facts (powers of two), so a handful suffices;
# past this bound the carried values fall back to "nothing known", which is always sound.
_MAX_LOOP_ROUNDS = 8


class AnalysisResult:
    """The AxisInfo of every value of one function, looked up by value.

    `result[value]` raises KeyError for a value that is not in the analysed function; `by_id` is
    the underlying read-only mapping id(value) -> AxisInfo. The result keeps the values alive, so
    their ids stay unique while it exists; it is not updated when the IR changes (re-run the
    analysis after a pass that rewrites pointers or offsets).
    """

    def __init__(self, infos: dict, values: dict):
        self._infos = infos
        self._values = values
        self.by_id: Mapping[int, AxisInfo] = types.MappingProxyType(infos)

    def get(self, value: Value, default: Optional[AxisInfo] = None) -> Optional[AxisInfo]:
        if self._values.get(id(value)) is not value:
            return default
        return self._infos[id(value)]

    def __getitem__(self, value: Value) -> AxisInfo:
        info = self.get(value)
        if info is None:
            raise KeyError(f"{value!r} was not analysed (not in the function, or created after the analysis)")
        return info

    def __contains__(self, value: Value) -> bool:
        return self.get(value) is not None

    def __len__(self) -> int:
        return len(self._infos)


def analyze_pointers(function: Function) -> AnalysisResult:
    """Compute the AxisInfo of every value of `function` (scalars and blocks, any element type;
    only constancy is meaningful for float values). Does not change the IR."""
    analysis = _Analysis()
    for index, arg in enumerate(function.args):
        hints = function.arg_hints[index] if index < len(function.arg_hints) else None
        analysis.set(arg, _argument_info(arg, hints or {}))
    analysis.block(function.body)
    return AnalysisResult(analysis.infos, analysis.values)


def vector_width(result: AnalysisResult, pointer_value: Value, mask_value: Optional[Value],
                 element_bytes: int, max_bytes: int = 16, dim: int = -1) -> int:
    """How many consecutive elements along `dim` (default: the last) one vector access may move.

    min(contiguity of the pointer, its divisibility / element_bytes, the mask's constancy,
    max_bytes / element_bytes), rounded down to a power of two, at least 1. Groups start at indices
    (along the last dim) that are multiples of the width; a scalar pointer gives 1.

    Args:
        result: `analyze_pointers` of the function holding the values.
        pointer_value: a block of pointers (LOAD/STORE/atomic operand 0).
        mask_value: the access's mask (same shape), or None when unmasked.
        element_bytes: bytes per element moved (the pointee's itemsize).
        max_bytes: the widest access in bytes (16 for `ld.global.v4.b32`).
        dim: the dim the access steps along (a transposed view's is its first).
    """
    if not shape_of(pointer_value.type):
        return 1
    info = result[pointer_value]
    width = min(info.contiguity[dim], info.divisibility[dim] // element_bytes, max_bytes // element_bytes)
    if mask_value is not None and shape_of(mask_value.type):
        width = min(width, result[mask_value].constancy[dim])
    return floor_pow2(max(1, width))


def _argument_info(arg: Value, hints: dict) -> AxisInfo:
    hinted = pow2_divisor(int(hints.get("divisibility", 1) or 1))
    element = element_type(arg)
    if isinstance(element, PointerType):
        hinted = max(hinted, element.element.itemsize)
    info = AxisInfo((1,), (hinted,), (1,))
    return with_facts(info, arg)


class _Analysis:
    """The analysis state of one function: the facts so far and the values they belong to."""

    def __init__(self):
        self.infos: dict = {}
        self.values: dict = {}

    def set(self, value: Value, info: AxisInfo) -> None:
        self.infos[id(value)] = with_facts(info, value)
        self.values[id(value)] = value

    def get(self, value: Value) -> AxisInfo:
        info = self.infos.get(id(value))
        if info is None or self.values[id(value)] is not value:
            return default_info(info_shape(value))
        return info

    def block(self, block: Block) -> None:
        for op in block.ops:
            if op.opcode == OpCode.FOR:
                self._for(op)
            elif op.opcode == OpCode.WHILE:
                self._while(op)
            elif op.opcode == OpCode.IF:
                self._if(op)
            elif op.opcode == OpCode.PRODUCER_WARP:
                self.block(op.regions[0])
            elif op.results:
                for result, info in zip(op.results, infer(op, [self.get(v) for v in op.operands])):
                    self.set(result, info)

    def _joined(self, values_a, values_b) -> list:
        return [join(self.get(a), self.get(b), unit(a)) for a, b in zip(values_a, values_b)]

    def _loop(self, region: Block, carried_args: list, inits: list, yielded) -> list:
        """Iterate `region` until its carried arguments' facts hold for every trip; returns them.

        `yielded()` gives the values that flow back into the carried arguments after a trip.
        """
        current = [self.get(v) for v in inits]
        for _ in range(_MAX_LOOP_ROUNDS):
            for arg, info in zip(carried_args, current):
                self.set(arg, info)
            self.block(region)
            following = [join(self.get(init), self.get(back), unit(init)) for init, back in zip(inits, yielded())]
            if following == current:
                return current
            current = following
        for arg in carried_args:
            self.set(arg, default_info(info_shape(arg)))
        self.block(region)
        return [join(self.get(init), self.get(back), unit(init)) for init, back in zip(inits, yielded())]

    def _for(self, op: Operation) -> None:
        lower, _, step = (self.get(v) for v in op.operands[:3])
        body = op.regions[0]
        induction = body.args[0]
        divisibility = min(max(lower.divisibility), max(step.divisibility))
        self.set(induction, AxisInfo((1,), (divisibility,), (1,), None, lower.nonnegative and step.nonnegative))
        carried = self._loop(body, body.args[1:], op.operands[3:], lambda: body.terminator.operands)
        for result, info in zip(op.results, carried):
            self.set(result, info)

    def _while(self, op: Operation) -> None:
        before, after = op.regions
        self._loop(before, before.args, op.operands, lambda: self._after(before, after))
        forwarded = before.terminator.operands[1:]
        for result, value in zip(op.results, forwarded):
            self.set(result, self.get(value))

    def _after(self, before: Block, after: Block) -> list:
        for arg, value in zip(after.args, before.terminator.operands[1:]):
            self.set(arg, self.get(value))
        self.block(after)
        return after.terminator.operands

    def _if(self, op: Operation) -> None:
        then_block, else_block = op.regions
        self.block(then_block)
        self.block(else_block)
        for result, info in zip(op.results, self._joined(then_block.terminator.operands,
                                                         else_block.terminator.operands)):
            self.set(result, info)
