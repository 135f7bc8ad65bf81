"""Layout assignment: give every block value a distributed layout and insert `convert_layout` where
an op needs its operand in another layout.

Rules, applied op by op in program order:
- Memory ops anchor layouts: a load/store/atomic whose pointer has no layout yet gets the default
  blocked layout of its shape (coalesced, 16-byte vectors of the narrowest element type the kernel
  moves at that shape) along the dim the pointer analysis finds its addresses contiguous in (so a
  transposed view is read along its columns), and its mask, value and `other` follow the
  pointer's layout. Exceptions, each saving a trip through shared memory:
  - a store of a value whose layout holds every element once with pairs along the contiguous last
    dim (the mma.sync accumulator), or of a small block (at most one element per thread, such as the
    per-row statistics a reduction leaves in a slice layout), stores from the value's layout
    (replicated copies are stored by their owner only); a large block in a wgmma accumulator
    layout is instead converted to the blocked layout through a swizzled shared tile (the
    conversion gets attr `swizzled`; codegen/swizzled_exchange.py), so the stores are 16-byte;
  - a load whose only use, through casts and expand_dims, is a broadcast (`w[None, :]` against a
    2-D tile) is done directly in the layout the broadcast asks for, when that layout reads
    vectors as wide as the default one with at most twice its registers per thread (replicated threads
    read the same addresses: one L1 transaction).
- An elementwise op whose operands disagree only because of broadcast operands re-does those
  broadcasts in the other operands' layout (a bias row is moved, not the accumulator).
- Constants, splats and aranges are *flexible*: they take the layout their first user needs and are
  recomputed (cloned) for a user that needs another one, which is cheaper than moving data. So are
  cheap elementwise ops (integer and pointer arithmetic, comparisons, casts), expand_dims and
  broadcasts whose block operands are all flexible: index computations such as
  `ptr + rows[:, None] * stride + cols[None, :]` are then computed directly in the layout of the
  load or store that uses them, instead of being moved between layouts through shared memory.
- Elementwise ops keep the layout their operands share, else use the default layout.
- Reductions produce `slice_layout` of the operand's layout; expand_dims, reshape and trans relabel
  the operand's layout (free); broadcast results use the default layout and ask for the operand in
  that layout with the broadcast dims projected away.
- `dot` on tensor cores (`dot_layouts.uses_tensor_cores`: fp16/bf16 on sm_80+) puts the accumulator
  in the mma accumulator layout and asks for A and B in the mma operand layouts; the conversions it
  inserts carry `dot_operand` = 0 / 1 (codegen stages them through swizzled shared memory and reads
  them with ldmatrix). On sm_90a a dot that fits wgmma (`dot_layouts.uses_wgmma`) takes the wgmma
  accumulator layout instead, and its operands are converted to *shared* layouts (input dim
  "offset"): the canonical wgmma tiles the instruction reads through matrix descriptors; a wgmma
  dot with A from registers (`dot_layouts.wgmma_register_a`) asks for A in the wgmma A fragment
  layout instead, converted where A is defined when that is outside the dot's block (a
  loop-invariant Q is converted once, before the loop, not every iteration); a loop-invariant A
  read from shared memory (`dot_layouts.wgmma_staged_a`) is converted before the loop too, the
  conversion marked `hoisted` for passes/invariant_operands.py. The FMA
  path keeps the accumulator in the default layout and A and B in the layouts they have (codegen/
  dot.py writes them to shared memory and reads one k at a time).
- Loop-carried values keep their initial value's layout, except that a carried value used as a
  tensor-core `dot` accumulator in the loop is carried in the mma/wgmma accumulator layout (so the
  loop does not convert it every trip), and so is a carried value that starts as a constant block
  and is yielded as an elementwise function of a tensor-core dot's result (a finished tile kept for
  a later iteration's store); yields are converted to the carried layout.
The pass sets `Value.layout`; scalars keep `None`. Source of the approach: Triton's layout
propagation and "Linear Layouts" (Zhou et al., 2025), in our own formulation.
"""

from __future__ import annotations

import dataclasses

from ..ir import Block, Function, Operation, OpCode, Value
from ..ir.ops import ELEMENTWISE, UNARY_MATH
from ..ir.rewrite import uses
from ..language.dtypes import BlockType, PointerType, shape_of
from ..layouts.blocked import default_blocked
import fusedops.dsl.layouts.shape_ops as layout_shapes
from ..layouts.linear import LinearLayout
from ..layouts.reduction import reduction_plan
from ..layouts.vectorize import vector_width
from ..codegen import layout_access
from .dce import eliminate_dead_code
from .pointer_analysis import analyze_pointers
from .pipelining import MIN_COPY_BYTES, is_zero_constant, proven_copy_width
from .dot_layouts import (accumulator_layout, mma_dot_layouts, uses_tensor_cores, uses_wgmma,
                          wgmma_dot_layouts, wgmma_register_a, wgmma_staged_a)

_FLEXIBLE = frozenset({OpCode.CONSTANT, OpCode.SPLAT, OpCode.ARANGE})
_MEMORY = frozenset({OpCode.LOAD, OpCode.STORE, OpCode.ATOMIC_RMW, OpCode.ATOMIC_CAS})
# Elementwise ops cheap enough to recompute in every layout a user needs (see the module docstring).
_REMATERIALIZABLE = ELEMENTWISE - UNARY_MATH - frozenset({OpCode.DIV, OpCode.FMA})


def _is_block(value: Value) -> bool:
    return isinstance(value.type, BlockType)


def _element_bits(type_) -> int:
    element = type_.element if isinstance(type_, BlockType) else type_
    if isinstance(element, PointerType):
        element = element.element
    return max(8, element.bits)


def project_broadcast(layout: LinearLayout, operand_shape: tuple) -> LinearLayout:
    """`layout` with the dims where `operand_shape` is 1 (and layout's is not) projected to size 1."""
    dims = [d for d, (o, s) in enumerate(zip(operand_shape, layout.shape)) if o == 1 and s != 1]
    bases = {name: [tuple(0 if d in dims else c for d, c in enumerate(v)) for v in layout.bases_of(name)]
             for name in layout.in_dims}
    return LinearLayout(bases, tuple(operand_shape))


def broadcast_projection(operand_shape: tuple, result_shape: tuple):
    dims = {d for d, (o, s) in enumerate(zip(operand_shape, result_shape)) if o == 1 and s != 1}
    return lambda coords: tuple(0 if d in dims else c for d, c in enumerate(coords))


@dataclasses.dataclass
class _State:
    num_warps: int
    bits_by_shape: dict
    arch: object = None                                         # "sm_90a"...; None: FMA dots only
    axis_info: object = None                                    # pointer analysis of the input IR
    flexible: dict = dataclasses.field(default_factory=dict)   # id(value) -> {layout: value}
    preferred: dict = dataclasses.field(default_factory=dict)  # id(loop block arg) -> carried layout
    load_hints: dict = dataclasses.field(default_factory=dict)  # id(load op) -> layout of its pointer
    wgmma_accumulators: set = dataclasses.field(default_factory=set)  # layouts of wgmma dot results
    hoisted: dict = dataclasses.field(default_factory=dict)     # (id(value), layout) -> converted value
    copyable_loads: frozenset = frozenset()                     # ids of loads cp.async can copy (_copyable_loads)

    def default(self, shape) -> LinearLayout:
        return default_blocked(tuple(shape), self.num_warps, self.bits_by_shape.get(tuple(shape), 32))


def _memory_bits(function: Function) -> dict:
    out = {}
    for op in function.walk():
        if op.opcode in _MEMORY and _is_block(op.operands[0]):
            shape = shape_of(op.operands[0].type)
            out[shape] = min(out.get(shape, 64), _element_bits(op.operands[0].type))
    return out


def _insert_before(anchor: Operation, new: Operation) -> None:
    block = anchor.parent
    new.parent = block
    block.ops.insert(block.ops.index(anchor), new)


def _clone_flexible(state: _State, value: Value, layout, before: Operation) -> Value:
    op = value.defining_op
    clone = Operation(op.opcode, list(op.operands), [value.type], dict(op.attrs), (), op.loc)
    clone.results[0].layout = layout
    _insert_before(before, clone)
    _materialize_operands(state, clone, layout)
    return clone.results[0]


def _operand_layout(op: Operation, index: int, layout):
    """The layout operand `index` of a flexible op needs for its result to have `layout`."""
    operand_shape = shape_of(op.operands[index].type)
    if op.opcode == OpCode.EXPAND_DIMS:
        axis = op.attrs["axis"]
        bases = {name: [tuple(c for d, c in enumerate(v) if d != axis) for v in layout.bases_of(name)]
                 for name in layout.in_dims}
        return LinearLayout(bases, operand_shape)
    if op.opcode == OpCode.BROADCAST:
        return project_broadcast(layout, operand_shape)
    return layout


def _materialize_operands(state: _State, op: Operation, layout) -> None:
    """Materialize the flexible block operands of flexible `op` (result in `layout`) before it."""
    for index, operand in enumerate(op.operands):
        if _is_block(operand):
            op.operands[index] = _materialize(state, operand, _operand_layout(op, index, layout), op)


def _materialize(state: _State, value: Value, layout, before: Operation) -> Value:
    """Give a flexible value `layout`, or a clone of it in that layout."""
    versions = state.flexible[id(value)]
    if value.layout is None:
        value.layout = layout
        versions[layout] = value
        _materialize_operands(state, value.defining_op, layout)
        return value
    if layout in versions:
        found = versions[layout]
        if found is value or _dominates(found, before):
            return found
    clone = _clone_flexible(state, value, layout, before)
    versions[layout] = clone
    state.flexible[id(clone)] = versions      # a clone is flexible too, with the same versions
    return clone


def _is_flexible_composite(state: _State, op: Operation) -> bool:
    """A cheap op whose block operands are all flexible (so it can be recomputed in any layout)."""
    if len(op.results) != 1 or not _is_block(op.result):
        return False
    if op.opcode not in _REMATERIALIZABLE and op.opcode not in (OpCode.EXPAND_DIMS, OpCode.BROADCAST):
        return False
    blocks = [v for v in op.operands if _is_block(v)]
    if op.opcode == OpCode.EXPAND_DIMS and not blocks:
        return True
    return bool(blocks) and all(id(v) in state.flexible for v in blocks)


def _dominates(value: Value, before: Operation) -> bool:
    op = value.defining_op
    block = op.parent
    current = before
    while current is not None:
        if current.parent is block:
            return block.ops.index(op) < block.ops.index(current)
        current = current.parent.parent if current.parent is not None else None
    return False


def _convert(value: Value, layout, before: Operation) -> Value:
    op = Operation(OpCode.CONVERT_LAYOUT, [value], [value.type], {}, (), before.loc)
    op.results[0].layout = layout
    _insert_before(before, op)
    return op.results[0]


def _require(state: _State, op: Operation, index: int, layout) -> None:
    """Make operand `index` of `op` have `layout` (materialize a flexible value or convert)."""
    value = op.operands[index]
    if not _is_block(value):
        return
    if id(value) in state.flexible:
        op.operands[index] = _materialize(state, value, layout, op)
    elif value.layout != layout:
        op.operands[index] = _convert(value, layout, op)


def _contiguous_dim(state: _State, pointer: Value) -> int:
    """The dim along which the pointer analysis proved the longest runs of consecutive addresses
    (the last dim on ties, and when nothing is known)."""
    rank = len(shape_of(pointer.type))
    info = state.axis_info.get(pointer) if state.axis_info is not None else None
    if info is None or rank < 2:
        return rank - 1
    best = max(info.contiguity)
    return rank - 1 if best <= 1 or info.contiguity[-1] == best else info.contiguity.index(best)


def _copyable_loads(state: _State, function: Function) -> frozenset:
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


def _memory_layout(state: _State, pointer: Value):
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


def _stores_in_place(state: _State, op: Operation) -> bool:
    """A store whose value's layout is fine to store from directly, where converting it to a
    blocked layout would cost a shared-memory trip: a small block (at most one element per thread,
    e.g. per-row statistics in a slice layout; owners store, see codegen/ownership.py), or every
    element held once (no replicated threads or registers) with pairs along the contiguous last dim,
    as the mma accumulator does."""
    if op.opcode != OpCode.STORE:
        return False
    value = op.operands[1]
    if not _is_block(value) or id(value) in state.flexible or value.layout is None:
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


def _adds_in_place(state: _State, op: Operation) -> bool:
    """An atomic read-modify-write of a computed block whose layout holds every element once (e.g. a
    dot's accumulator added into a float32 buffer): it runs in that layout. An atomic moves one element
    per instruction in any layout, so the blocked layout's vectors gain nothing (its consecutive
    elements per thread put every lane of a warp on another 32-byte sector: 4x the accumulator's
    sectors), and moving the block there would cost a shared-memory trip."""
    if op.opcode != OpCode.ATOMIC_RMW:
        return False
    value = op.operands[1]
    if not _is_block(value) or id(value) in state.flexible or value.layout is None:
        return False
    return all(any(v) for name in value.layout.in_dims for v in value.layout.bases_of(name))


def _mark_swizzled_store(state: _State, op: Operation) -> None:
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


def _anchor_memory(state: _State, op: Operation):
    """The layout of a memory op: its pointer's, fixing a flexible pointer to `_memory_layout` (or
    to the stored value's layout, see `_stores_in_place`)."""
    pointer = op.operands[0]
    if id(pointer) in state.flexible and pointer.layout is None:
        if _stores_in_place(state, op) or _adds_in_place(state, op):
            layout = op.operands[1].layout
        else:
            layout = state.load_hints.get(id(op)) or _memory_layout(state, pointer)
        _require(state, op, 0, layout)
    return op.operands[0].layout


def _rebroadcast_operands(state: _State, op: Operation):
    """For an elementwise op whose operands disagree, where all but broadcast results agree on one
    layout L: re-do those broadcasts in L (moving the small un-broadcast block, not the big one)
    and return L; None otherwise. `acc + bias[None, :]` keeps `acc` in its mma layout this way."""
    def broadcast_result(v):
        return v.defining_op is not None and v.defining_op.opcode == OpCode.BROADCAST
    blocks = [v for v in op.operands if _is_block(v) and id(v) not in state.flexible]
    others = {v.layout for v in blocks if not broadcast_result(v)}
    if len(others) != 1:
        return None
    (layout,) = others
    for index, value in enumerate(op.operands):
        if _is_block(value) and id(value) not in state.flexible and broadcast_result(value) \
                and value.layout != layout:
            source = value.defining_op
            small = source.operands[0]
            if small.defining_op is not None and small.defining_op.opcode == OpCode.CONVERT_LAYOUT:
                small = small.defining_op.operands[0]       # convert from the original, not twice
            clone = Operation(OpCode.BROADCAST, [small], [value.type], dict(source.attrs), (), source.loc)
            clone.results[0].layout = layout
            _insert_before(op, clone)
            _require(state, clone, 0, project_broadcast(layout, shape_of(source.operands[0].type)))
            op.operands[index] = clone.results[0]
    return layout


def _anchor(state: _State, op: Operation, index: int):
    """The layout of operand `index`, fixing a flexible one to the default layout."""
    value = op.operands[index]
    if id(value) in state.flexible and value.layout is None:
        _require(state, op, index, state.default(shape_of(value.type)))
    return op.operands[index].layout


def _assign_op(state: _State, op: Operation) -> None:
    code = op.opcode
    results = [r for r in op.results if _is_block(r)]
    if code in _FLEXIBLE or _is_flexible_composite(state, op):
        for r in results:
            state.flexible[id(r)] = {}
        return
    if code in _MEMORY:
        if not _is_block(op.operands[0]):
            return
        layout = _anchor_memory(state, op)
        for i in range(1, len(op.operands)):
            _require(state, op, i, layout)
        _mark_swizzled_store(state, op)
        for r in results:
            r.layout = layout
        return
    if code in ELEMENTWISE:
        if not results:
            return
        rigid = [v.layout for v in op.operands if _is_block(v) and id(v) not in state.flexible]
        if rigid and all(layout == rigid[0] for layout in rigid):
            layout = rigid[0]
        else:
            layout = _rebroadcast_operands(state, op) or state.default(shape_of(op.result.type))
        for i in range(len(op.operands)):
            _require(state, op, i, layout)
        op.result.layout = layout
        return
    if code in (OpCode.REDUCE, OpCode.ARGREDUCE):
        layout = _anchor(state, op, 0)
        try:
            plan = reduction_plan(layout, op.attrs["axis"])
        except Exception:
            layout = state.default(shape_of(op.operands[0].type))
            _require(state, op, 0, layout)
            plan = reduction_plan(layout, op.attrs["axis"])
        for r in results:
            r.layout = plan.result_layout
        return
    if code == OpCode.CLUSTER_SUM:
        for index, result in enumerate(op.results):
            if _is_block(result):
                result.layout = _anchor(state, op, index)
        return
    if code == OpCode.SCAN:
        layout = _anchor(state, op, 0)
        op.result.layout = layout
        return
    if code == OpCode.EXPAND_DIMS:
        if _is_block(op.operands[0]):
            layout = _anchor(state, op, 0)
            op.result.layout = layout_shapes.expand_dims(layout, op.attrs["axis"])
        else:
            op.result.layout = state.default(shape_of(op.result.type))
        return
    if code == OpCode.RESHAPE:
        layout = _anchor(state, op, 0)
        op.result.layout = layout_shapes.reshape(layout, shape_of(op.result.type))
        return
    if code == OpCode.TRANS:
        layout = _anchor(state, op, 0)
        op.result.layout = layout_shapes.transpose(layout, op.attrs["perm"])
        return
    if code == OpCode.BROADCAST:
        target = state.default(shape_of(op.result.type))
        operand = op.operands[0]
        projected = project_broadcast(target, shape_of(operand.type))
        if id(operand) in state.flexible or operand.layout is None:
            _require(state, op, 0, projected)
        elif layout_access.register_map(operand.layout, target,
                                        broadcast_projection(shape_of(operand.type), target.shape)) is None:
            _require(state, op, 0, projected)
        op.result.layout = target
        return
    if code == OpCode.DOT and uses_wgmma(op, state.arch, state.num_warps):
        _assign_wgmma_dot(state, op)
        return
    if code == OpCode.DOT and uses_tensor_cores(op, state.arch):
        layouts = mma_dot_layouts(op, state.num_warps)
        for index, layout in ((2, layouts[2]), (0, layouts[0]), (1, layouts[1])):
            before = op.operands[index]
            _require(state, op, index, layout)
            converted = op.operands[index]
            if index < 2 and converted is not before and converted.defining_op.opcode == OpCode.CONVERT_LAYOUT:
                converted.defining_op.attrs["dot_operand"] = index
        op.attrs["engine"] = "mma"
        op.result.layout = layouts[2]
        return
    if code == OpCode.DOT:      # the FMA path: A and B keep their layouts (codegen/dot.py stages them)
        acc_layout = state.default(shape_of(op.operands[2].type))
        _require(state, op, 2, acc_layout)
        _anchor(state, op, 0)
        _anchor(state, op, 1)
        op.result.layout = acc_layout
        return
    if code in (OpCode.PRINT, OpCode.ASSERT, OpCode.CONVERT_LAYOUT, OpCode.TMA_STORE):
        # (a TMA store writes its value to shared memory from whatever layout it has: codegen/tma_store.py)
        for i, v in enumerate(op.operands):
            if _is_block(v):
                _anchor(state, op, i)
        return
    if code == OpCode.FOR:
        _assign_loop(state, op, op.operands[3:], op.regions[0].args[1:], op.regions[0], 3)
        return
    if code == OpCode.WHILE:
        _assign_while(state, op)
        return
    if code == OpCode.IF:
        _assign_if(state, op)
        return
    for r in results:
        if r.layout is None:
            r.layout = state.default(shape_of(r.type))


def _assign_wgmma_dot(state: _State, op: Operation) -> None:
    """A wgmma dot: the accumulator in the wgmma accumulator layout; B (and A, unless A comes from
    registers) converted to shared tiles (`convert_layout {dot_operand}` to a shared layout)
    contiguous along the dim their own layouts hold as vectors (a flexible operand is first fixed to
    the default layout); a register A converted to the A fragment layout (`_require_hoisted`)."""
    register_a = wgmma_register_a(op, state.arch, state.num_warps, state.copyable_loads)
    staged_a = wgmma_staged_a(op, state.arch, state.num_warps, state.copyable_loads)
    _anchor(state, op, 0)
    _anchor(state, op, 1)
    tile_a, tile_b, accumulator = wgmma_dot_layouts(op, state.num_warps, register_a)
    _require(state, op, 2, accumulator)
    if register_a or staged_a:
        _require_hoisted(state, op, 0, tile_a)
    if staged_a:
        op.operands[0].defining_op.attrs.update(dot_operand=0, hoisted=True)
    for index, tile in ((1, tile_b),) if register_a or staged_a else ((0, tile_a), (1, tile_b)):
        op.operands[index] = _convert(op.operands[index], tile, op)
        op.operands[index].defining_op.attrs["dot_operand"] = index
    op.attrs["engine"] = "wgmma"
    op.result.layout = accumulator
    state.wgmma_accumulators.add(accumulator)


def _require_hoisted(state: _State, op: Operation, index: int, layout) -> None:
    """`_require`, but a conversion of a value defined in an enclosing block goes right before the
    op of that block that holds `op` (a loop-invariant operand is converted once, before the loop),
    shared by every later op that needs it in that layout."""
    value = op.operands[index]
    if value.layout == layout:
        return
    home = value.owner if isinstance(value.owner, Block) else value.defining_op.parent
    anchor = op
    while anchor.parent is not home:
        anchor = anchor.parent.parent
        if anchor is None:
            return _require(state, op, index, layout)
    if anchor is op:
        return _require(state, op, index, layout)
    key = (id(value), layout)
    found = state.hoisted.get(key)
    if found is None or not _dominates(found, anchor):
        found = state.hoisted[key] = _convert(value, layout, anchor)
    op.operands[index] = found


def _init_layouts(state, op, first_index, count, args=()):
    layouts = []
    for i in range(first_index, first_index + count):
        arg = args[i - first_index] if i - first_index < len(args) else None
        preferred = state.preferred.get(id(arg)) if arg is not None else None
        if _is_block(op.operands[i]) and preferred is not None:
            _require(state, op, i, preferred)
            layouts.append(preferred)
        elif _is_block(op.operands[i]):
            layouts.append(_anchor(state, op, i))
        else:
            layouts.append(None)
    return layouts


def _broadcast_load_layout(state: _State, load: Operation, users: dict):
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
    bits = _element_bits(pointer.type)
    memory = _memory_layout(state, pointer)
    if vector_width(layout, dim, bits) < vector_width(memory, dim, bits) \
            or layout.num_registers > 2 * memory.num_registers:
        return None
    return layout


def _accumulator_beside(state: _State, broadcast: Operation, users: dict):
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
        if start is broadcast.result or not _is_block(start):
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
            blocks = [v for v in op.operands if _is_block(v) and shape_of(v.type) == shape_of(value.type)
                      and (v.defining_op is None or v.defining_op.opcode != OpCode.BROADCAST)]
            if not blocks:
                break
            value = op.operands[1] if op.opcode == OpCode.WHERE and op.operands[1] in blocks else blocks[0]
    return None


def _hint_broadcast_loads(state: _State, function: Function) -> None:
    users = uses(function)
    for op in function.walk():
        if op.opcode == OpCode.LOAD and _is_block(op.operands[0]):
            layout = _broadcast_load_layout(state, op, users)
            if layout is not None:
                state.load_hints[id(op)] = layout


def _prefer_mma_accumulators(state: _State, function: Function) -> None:
    """Record the mma/wgmma accumulator layout for loop block arguments used as tensor-core dot
    accumulators."""
    for op in function.walk():
        if op.opcode != OpCode.DOT or not uses_tensor_cores(op, state.arch):
            continue
        acc = op.operands[2]
        owner = acc.owner
        if isinstance(owner, Block) and owner.parent is not None and owner.parent.opcode == OpCode.FOR \
                and acc.index > 0:
            state.preferred[id(acc)] = accumulator_layout(op, state.arch, state.num_warps)
        if uses_wgmma(op, state.arch, state.num_warps):
            state.wgmma_accumulators.add(accumulator_layout(op, state.arch, state.num_warps))


def _tensor_core_source(state: _State, value: Value, carried: Value, depth: int = 16):
    """The accumulator layout of the tensor-core dot that `value` is computed from elementwise (casts,
    activations, a broadcast bias added), through `if` results (either branch but the one passing
    `carried` on), loop arguments and inner loops' results carried in an accumulator layout; None if
    it is not such a value."""
    if depth == 0 or value is carried or not _is_block(value):
        return None
    if isinstance(value.owner, Block):
        return state.preferred.get(id(value))
    op = value.defining_op
    if op.opcode == OpCode.DOT:
        return accumulator_layout(op, state.arch, state.num_warps) if uses_tensor_cores(op, state.arch) else None
    if op.opcode == OpCode.IF:
        index = op.results.index(value)
        for region in op.regions:
            found = _tensor_core_source(state, region.terminator.operands[index], carried, depth - 1)
            if found is not None:
                return found
        return None
    if op.opcode == OpCode.FOR:     # an inner loop's accumulator, carried in the accumulator layout
        return state.preferred.get(id(op.regions[0].args[1 + value.index]))
    if op.opcode not in ELEMENTWISE:
        return None
    for operand in op.operands:
        if _is_block(operand) and shape_of(operand.type) == shape_of(value.type) \
                and (operand.defining_op is None or operand.defining_op.opcode != OpCode.BROADCAST):
            found = _tensor_core_source(state, operand, carried, depth - 1)
            if found is not None:
                return found
    return None


def _prefer_tensor_core_carries(state: _State, function: Function) -> None:
    """Record the accumulator layout for loop arguments that start as a constant block (flexible: any
    layout is free) and are yielded as a value computed elementwise from a tensor-core dot's result,
    such as a tile's output held for a later iteration's store. Carried in the initial value's
    default layout instead, every trip would move the tile through shared memory at the yield."""
    for op in function.walk():
        if op.opcode != OpCode.FOR:
            continue
        region = op.regions[0]
        for arg, init, yielded in zip(region.args[1:], op.operands[3:], region.terminator.operands):
            if id(arg) in state.preferred or not _is_block(arg) or init.defining_op is None \
                    or init.defining_op.opcode not in _FLEXIBLE:
                continue
            layout = _tensor_core_source(state, yielded, arg)
            if layout is not None:
                state.preferred[id(arg)] = layout


def _assign_loop(state, op, inits, args, region: Block, first_index: int):
    layouts = _init_layouts(state, op, first_index, len(inits), args)
    for arg, layout in zip(args, layouts):
        arg.layout = layout
    _assign_block(state, region)
    terminator = region.terminator
    for i, layout in enumerate(layouts):
        if layout is not None:
            _require(state, terminator, i, layout)
    for result, layout in zip(op.results, layouts):
        result.layout = layout


def _assign_while(state, op):
    before, after = op.regions
    layouts = _init_layouts(state, op, 0, len(op.operands))
    for arg, layout in zip(before.args, layouts):
        arg.layout = layout
    _assign_block(state, before)
    condition = before.terminator
    forwarded = []
    for i, value in enumerate(condition.operands[1:], start=1):
        forwarded.append(_anchor(state, condition, i) if _is_block(value) else None)
    for arg, layout in zip(after.args, forwarded):
        arg.layout = layout
    _assign_block(state, after)
    for i, layout in enumerate(layouts):
        if layout is not None:
            _require(state, after.terminator, i, layout)
    for result, layout in zip(op.results, forwarded):
        result.layout = layout


def _assign_if(state, op):
    then_region, else_region = op.regions
    _assign_block(state, then_region)
    _assign_block(state, else_region)
    for i, result in enumerate(op.results):
        if not _is_block(result):
            continue
        layout = _anchor(state, then_region.terminator, i)
        _require(state, else_region.terminator, i, layout)
        result.layout = layout


def _assign_block(state: _State, block: Block) -> None:
    for arg in block.args:
        if _is_block(arg) and arg.layout is None:
            arg.layout = state.default(shape_of(arg.type))
    for op in list(block.ops):
        _assign_op(state, op)


def assign_layouts(function: Function, num_warps: int, arch=None) -> bool:
    """Set `layout` on every block value of `function` and insert conversions. Returns True.

    arch: the target ("sm_80", "sm_90a", ...); tensor-core dots need sm_80+, None means FMA dots.
    """
    state = _State(num_warps, _memory_bits(function), arch, analyze_pointers(function))
    state.copyable_loads = _copyable_loads(state, function)
    _prefer_mma_accumulators(state, function)
    _prefer_tensor_core_carries(state, function)
    _hint_broadcast_loads(state, function)
    _assign_block(state, function.body)
    for op in function.walk():
        for r in op.results:
            if _is_block(r) and r.layout is None:
                r.layout = state.default(shape_of(r.type))
    eliminate_dead_code(function)     # broadcasts and conversions that re-done broadcasts replaced
    return True
