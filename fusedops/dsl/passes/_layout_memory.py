"""The layouts of memory ops (passes/layout_assignment.py): coalesced blocked layouts along the dim the
pointer analysis proves contiguous, stores and atomics done in their value's layout, loads done in the
layout the broadcast of their result asks for, and the loads cp.async could copy.
"""

from __future__ import annotations

from ..ir import Function, Operation, OpCode, Value
from ..ir.ops import ELEMENTWISE
from ..ir.rewrite import uses
from ..language.dtypes import shape_of
from ..layouts.blocked import default_blocked
import fusedops.dsl.layouts.shape_ops as layout_shapes
from ..layouts.linear import LinearLayout
from ..layouts.reduction import reduction_plan
from ..layouts.vectorize import vector_width
from ._copy_width import MIN_COPY_BYTES, proven_copy_width
from ._layout_conversions import require
from ._layout_state import State, element_bits, is_block, project_broadcast
from ._rewriting import is_zero_constant
from .dot_layouts import accumulator_layout, uses_tensor_cores


def _contiguous_dim(state: State, pointer: Value) -> int:
    """The dim along which the pointer analysis proved the longest runs of consecutive addresses
    (the last dim on ties, and when nothing is known)."""
    rank = len(shape_of(pointer.type))
    info = state.axis_info.get(pointer) if state.axis_info is not None else None
    if info is None or rank < 2:
        return rank - 1
    best = max(info.contiguity)
    return rank - 1 if best <= 1 or info.contiguity[-1] == best else info.contiguity.index(best)


def copyable_loads(state: State, function: Function) -> frozenset:
    """The ids of the 2-D `load` ops that cp.async could copy to shared memory: masked-off elements 0,
    at least 4 bytes per copy along the dim the pointer analysis proved contiguous (as the rings and
    passes/invariant_operands.py require, there with the final layouts)."""
    found = set()
    for op in function.walk():
        if op.opcode != OpCode.LOAD or len(shape_of(op.result.type)) != 2:
            continue
        if op.attrs.get("has_other") and not is_zero_constant(op.operands[-1]):
            continue
        width = proven_copy_width(state.axis_info, op, _contiguous_dim(state, op.operands[0]))
        if width * op.result.type.element.itemsize >= MIN_COPY_BYTES:
            found.add(id(op))
    return frozenset(found)


def _memory_layout(state: State, pointer: Value):
    """The coalesced blocked layout for a block of pointers: 16-byte vectors along the dim its
    addresses are contiguous in (a transposed view is read along its contiguous dim)."""
    shape = shape_of(pointer.type)
    dim = _contiguous_dim(state, pointer)
    if dim == len(shape) - 1:
        return state.default(shape)
    perm = tuple(d for d in range(len(shape)) if d != dim) + (dim,)
    permuted = default_blocked(tuple(shape[d] for d in perm), state.num_warps, state.bits_by_shape.get(shape, 32))
    inverse = tuple(perm.index(d) for d in range(len(shape)))
    return layout_shapes.transpose(permuted, inverse)


def _stores_in_place(state: State, op: Operation) -> bool:
    """A store whose value's layout is fine to store from directly, where converting it to a
    blocked layout would cost a shared-memory trip: a small block (at most one element per thread,
    e.g. per-row statistics in a slice layout; owners store, see codegen/ownership.py), or every
    element held once (no replicated threads or registers) with pairs along the contiguous last dim,
    as the mma accumulator does."""
    if op.opcode != OpCode.STORE:
        return False
    value = op.operands[1]
    if not is_block(value) or id(value) in state.flexible or value.layout is None:
        return False
    layout = value.layout
    if layout.numel <= 32 * state.num_warps:
        return True
    if layout in state.wgmma_accumulators:      # converted through a swizzled tile instead
        return False
    if any(not any(v) for name in layout.in_dims for v in layout.bases_of(name)):
        return False
    registers = layout.bases_of("register")
    rank = layout.rank
    pairs = bool(registers) and registers[0] == tuple(1 if d == rank - 1 else 0 for d in range(rank))
    return pairs and _contiguous_dim(state, op.operands[0]) == rank - 1


def _adds_in_place(state: State, op: Operation) -> bool:
    """An atomic read-modify-write of a computed block whose layout holds every element once (e.g. a
    dot's accumulator added into a float32 buffer): it runs in that layout. An atomic moves one element
    per instruction in any layout, so the blocked layout's vectors gain nothing (its consecutive
    elements per thread put every lane of a warp on another 32-byte sector: 4x the accumulator's
    sectors), and moving the block there would cost a shared-memory trip."""
    if op.opcode != OpCode.ATOMIC_RMW:
        return False
    value = op.operands[1]
    if not is_block(value) or id(value) in state.flexible or value.layout is None:
        return False
    return all(any(v) for name in value.layout.in_dims for v in value.layout.bases_of(name))


def mark_swizzled_store(state: State, op: Operation) -> None:
    """A store of a wgmma accumulator (or a value computed from it elementwise, in its layout)
    converted to the store's blocked layout: mark the conversion `swizzled` (codegen moves it
    through a bank-conflict-free swizzled tile with vector accesses, then the store writes 16-byte
    vectors, instead of the accumulator's scattered 4-byte pairs)."""
    if op.opcode != OpCode.STORE:
        return
    convert = op.operands[1].defining_op
    if convert is not None and convert.opcode == OpCode.CONVERT_LAYOUT \
            and convert.operands[0].layout in state.wgmma_accumulators:
        convert.attrs["swizzled"] = True


def anchor_memory(state: State, op: Operation):
    """The layout of a memory op: its pointer's, fixing a flexible pointer to `_memory_layout` (or
    to the stored value's layout, see `_stores_in_place`)."""
    pointer = op.operands[0]
    if id(pointer) in state.flexible and pointer.layout is None:
        if _stores_in_place(state, op) or _adds_in_place(state, op):
            layout = op.operands[1].layout
        else:
            layout = state.load_hints.get(id(op)) or _memory_layout(state, pointer)
        require(state, op, 0, layout)
    return op.operands[0].layout


def _broadcast_load_layout(state: State, load: Operation, users: dict):
    """The layout the broadcast using `load`'s result (through single-use casts and expand_dims)
    asks for, mapped back to the load's shape; None when there is no such broadcast, or when that
    layout reads narrower vectors or holds over twice the registers per thread of the default
    memory layout (a consumer in another layout, such as an mma accumulator, converts it anyway)."""
    value, axes = load.results[0], []
    while True:
        readers = users.get(id(value), [])
        if len(readers) != 1:
            return None
        ((user, _),) = readers
        if user.opcode == OpCode.CAST:
            value = user.results[0]
        elif user.opcode == OpCode.EXPAND_DIMS:
            axes.append(user.attrs["axis"])
            value = user.results[0]
        elif user.opcode == OpCode.BROADCAST:
            break
        else:
            return None
    accumulator = _accumulator_beside(state, user, users)
    if accumulator is not None and len(axes) == 1 and len(shape_of(user.result.type)) == 2:
        # the row (column) slice a reduction of the accumulator leaves: no repeated registers
        return reduction_plan(accumulator, axes[0]).result_layout
    target = state.default(shape_of(user.result.type))
    layout = project_broadcast(target, shape_of(value.type))
    for axis in reversed(axes):
        bases = {name: [tuple(c for d, c in enumerate(v) if d != axis) for v in layout.bases_of(name)]
                 for name in layout.in_dims}
        layout = LinearLayout(bases, tuple(s for d, s in enumerate(layout.shape) if d != axis))
    pointer = load.operands[0]
    dim = _contiguous_dim(state, pointer)
    bits = element_bits(pointer.type)
    memory = _memory_layout(state, pointer)
    if vector_width(layout, dim, bits) < vector_width(memory, dim, bits) \
            or layout.num_registers > 2 * memory.num_registers:
        return None
    return layout


def _accumulator_beside(state: State, broadcast: Operation, users: dict):
    """The tensor-core accumulator layout of the dot that the broadcast's only user combines it
    with elementwise (`s - lse[:, None]` with s computed elementwise from a dot's result, through
    scalings, `where` and `if` results), or None. A small per-row vector loaded in that layout's
    row slice (2 values per thread) is combined in place; loaded in the default layout it would move
    through shared memory (2 barriers) every iteration of the loop that holds the dot."""
    readers = users.get(id(broadcast.result), [])
    if state.arch is None or len(readers) != 1 or readers[0][0].opcode not in ELEMENTWISE:
        return None
    user = readers[0][0]
    for start in user.operands:
        if start is broadcast.result or not is_block(start):
            continue
        value = start
        for _ in range(8):
            op = value.defining_op
            if op is None:
                break
            if op.opcode == OpCode.DOT:
                if uses_tensor_cores(op, state.arch):
                    return accumulator_layout(op, state.arch, state.num_warps)
                break
            if op.opcode == OpCode.IF:          # the else branch's value (the one not masked)
                value = op.regions[1].terminator.operands[op.results.index(value)]
                continue
            if op.opcode not in ELEMENTWISE:
                break
            blocks = [v for v in op.operands if is_block(v) and shape_of(v.type) == shape_of(value.type)
                      and (v.defining_op is None or v.defining_op.opcode != OpCode.BROADCAST)]
            if not blocks:
                break
            value = op.operands[1] if op.opcode == OpCode.WHERE and op.operands[1] in blocks else blocks[0]
    return None


def hint_broadcast_loads(state: State, function: Function) -> None:
    users = uses(function)
    for op in function.walk():
        if op.opcode == OpCode.LOAD and is_block(op.operands[0]):
            layout = _broadcast_load_layout(state, op, users)
            if layout is not None:
                state.load_hints[id(op)] = layout
