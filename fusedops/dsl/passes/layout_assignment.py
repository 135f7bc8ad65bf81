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
- `dot` on tensor cores (`dot_layouts.uses_tensor_cores`: fp16/bf16, or float32 as tf32, on sm_80+) puts the accumulator
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

This file walks the kernel with the per-op rules; memory ops' layouts are `_layout_memory.py`, the
carried layouts chosen beforehand `_layout_preferences.py`, materializing and converting operands
`_layout_conversions.py`, the pass's state `_layout_state.py`.
"""

from __future__ import annotations

from ..ir import Block, Function, Operation, OpCode
from ..ir.ops import ELEMENTWISE
from ..language.dtypes import shape_of
import fusedops.dsl.layouts.shape_ops as layout_shapes
from ..layouts.reduction import reduction_plan
from ..codegen import layout_access
from ._layout_conversions import convert, insert_before, is_flexible_composite, require, require_hoisted
from ._layout_memory import anchor_memory, copyable_loads, hint_broadcast_loads, mark_swizzled_store
from ._layout_preferences import prefer_mma_accumulators, prefer_tensor_core_carries
from ._layout_state import FLEXIBLE, MEMORY, State, broadcast_projection, is_block, memory_bits, project_broadcast
from .dce import eliminate_dead_code
from .pointer_analysis import analyze_pointers
from .dot_layouts import (mma_dot_layouts, uses_tensor_cores, uses_wgmma, wgmma_dot_layouts, wgmma_register_a,
                          wgmma_staged_a)


def _rebroadcast_operands(state: State, op: Operation):
    """For an elementwise op whose operands disagree, where all but broadcast results agree on one
    layout L: re-do those broadcasts in L (moving the small un-broadcast block, not the big one)
    and return L; None otherwise. `acc + bias[None, :]` keeps `acc` in its mma layout this way."""
    def broadcast_result(v):
        return v.defining_op is not None and v.defining_op.opcode == OpCode.BROADCAST
    blocks = [v for v in op.operands if is_block(v) and id(v) not in state.flexible]
    others = {v.layout for v in blocks if not broadcast_result(v)}
    if len(others) != 1:
        return None
    (layout,) = others
    for index, value in enumerate(op.operands):
        if is_block(value) and id(value) not in state.flexible and broadcast_result(value) \
                and value.layout != layout:
            source = value.defining_op
            small = source.operands[0]
            if small.defining_op is not None and small.defining_op.opcode == OpCode.CONVERT_LAYOUT:
                small = small.defining_op.operands[0]       # convert from the original, not twice
            clone = Operation(OpCode.BROADCAST, [small], [value.type], dict(source.attrs), (), source.loc)
            clone.results[0].layout = layout
            insert_before(op, clone)
            require(state, clone, 0, project_broadcast(layout, shape_of(source.operands[0].type)))
            op.operands[index] = clone.results[0]
    return layout


def _anchor(state: State, op: Operation, index: int):
    """The layout of operand `index`, fixing a flexible one to the default layout."""
    value = op.operands[index]
    if id(value) in state.flexible and value.layout is None:
        require(state, op, index, state.default(shape_of(value.type)))
    return op.operands[index].layout


def _assign_op(state: State, op: Operation) -> None:
    code = op.opcode
    results = [r for r in op.results if is_block(r)]
    if code in FLEXIBLE or is_flexible_composite(state, op):
        for r in results:
            state.flexible[id(r)] = {}
        return
    if code in MEMORY:
        if not is_block(op.operands[0]):
            return
        layout = anchor_memory(state, op)
        for i in range(1, len(op.operands)):
            require(state, op, i, layout)
        mark_swizzled_store(state, op)
        for r in results:
            r.layout = layout
        return
    if code in ELEMENTWISE:
        if not results:
            return
        rigid = [v.layout for v in op.operands if is_block(v) and id(v) not in state.flexible]
        if rigid and all(layout == rigid[0] for layout in rigid):
            layout = rigid[0]
        else:
            layout = _rebroadcast_operands(state, op) or state.default(shape_of(op.result.type))
        for i in range(len(op.operands)):
            require(state, op, i, layout)
        op.result.layout = layout
        return
    if code in (OpCode.REDUCE, OpCode.ARGREDUCE):
        layout = _anchor(state, op, 0)
        try:
            plan = reduction_plan(layout, op.attrs["axis"])
        except Exception:
            layout = state.default(shape_of(op.operands[0].type))
            require(state, op, 0, layout)
            plan = reduction_plan(layout, op.attrs["axis"])
        for r in results:
            r.layout = plan.result_layout
        return
    if code == OpCode.CLUSTER_SUM:
        for index, result in enumerate(op.results):
            if is_block(result):
                result.layout = _anchor(state, op, index)
        return
    if code == OpCode.SCAN:
        layout = _anchor(state, op, 0)
        op.result.layout = layout
        return
    if code == OpCode.EXPAND_DIMS:
        if is_block(op.operands[0]):
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
            require(state, op, 0, projected)
        elif layout_access.register_map(operand.layout, target,
                                        broadcast_projection(shape_of(operand.type), target.shape)) is None:
            require(state, op, 0, projected)
        op.result.layout = target
        return
    if code == OpCode.DOT and uses_wgmma(op, state.arch, state.num_warps):
        _assign_wgmma_dot(state, op)
        return
    if code == OpCode.DOT and uses_tensor_cores(op, state.arch):
        layouts = mma_dot_layouts(op, state.num_warps)
        for index, layout in ((2, layouts[2]), (0, layouts[0]), (1, layouts[1])):
            before = op.operands[index]
            require(state, op, index, layout)
            converted = op.operands[index]
            if index < 2 and converted is not before and converted.defining_op.opcode == OpCode.CONVERT_LAYOUT:
                converted.defining_op.attrs["dot_operand"] = index
        op.attrs["engine"] = "mma"
        op.result.layout = layouts[2]
        return
    if code == OpCode.DOT:      # the FMA path: A and B keep their layouts (codegen/dot.py stages them)
        acc_layout = state.default(shape_of(op.operands[2].type))
        require(state, op, 2, acc_layout)
        _anchor(state, op, 0)
        _anchor(state, op, 1)
        op.result.layout = acc_layout
        return
    if code in (OpCode.PRINT, OpCode.ASSERT, OpCode.CONVERT_LAYOUT, OpCode.TMA_STORE):
        # (a TMA store writes its value to shared memory from whatever layout it has: codegen/tma_store.py)
        for i, v in enumerate(op.operands):
            if is_block(v):
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


def _assign_wgmma_dot(state: State, op: Operation) -> None:
    """A wgmma dot: the accumulator in the wgmma accumulator layout; B (and A, unless A comes from
    registers) converted to shared tiles (`convert_layout {dot_operand}` to a shared layout)
    contiguous along the dim their own layouts hold as vectors (a flexible operand is first fixed to
    the default layout); a register A converted to the A fragment layout (`require_hoisted`)."""
    register_a = wgmma_register_a(op, state.arch, state.num_warps, state.copyable_loads)
    staged_a = wgmma_staged_a(op, state.arch, state.num_warps, state.copyable_loads)
    _anchor(state, op, 0)
    _anchor(state, op, 1)
    tile_a, tile_b, accumulator = wgmma_dot_layouts(op, state.num_warps, register_a)
    require(state, op, 2, accumulator)
    if register_a or staged_a:
        require_hoisted(state, op, 0, tile_a)
    if staged_a:
        op.operands[0].defining_op.attrs.update(dot_operand=0, hoisted=True)
    for index, tile in ((1, tile_b),) if register_a or staged_a else ((0, tile_a), (1, tile_b)):
        op.operands[index] = convert(op.operands[index], tile, op)
        op.operands[index].defining_op.attrs["dot_operand"] = index
    op.attrs["engine"] = "wgmma"
    op.result.layout = accumulator
    state.wgmma_accumulators.add(accumulator)


def _init_layouts(state, op, first_index, count, args=()):
    layouts = []
    for i in range(first_index, first_index + count):
        arg = args[i - first_index] if i - first_index < len(args) else None
        preferred = state.preferred.get(id(arg)) if arg is not None else None
        if is_block(op.operands[i]) and preferred is not None:
            require(state, op, i, preferred)
            layouts.append(preferred)
        elif is_block(op.operands[i]):
            layouts.append(_anchor(state, op, i))
        else:
            layouts.append(None)
    return layouts


def _assign_loop(state, op, inits, args, region: Block, first_index: int):
    layouts = _init_layouts(state, op, first_index, len(inits), args)
    for arg, layout in zip(args, layouts):
        arg.layout = layout
    _assign_block(state, region)
    terminator = region.terminator
    for i, layout in enumerate(layouts):
        if layout is not None:
            require(state, terminator, i, layout)
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
        forwarded.append(_anchor(state, condition, i) if is_block(value) else None)
    for arg, layout in zip(after.args, forwarded):
        arg.layout = layout
    _assign_block(state, after)
    for i, layout in enumerate(layouts):
        if layout is not None:
            require(state, after.terminator, i, layout)
    for result, layout in zip(op.results, forwarded):
        result.layout = layout


def _assign_if(state, op):
    then_region, else_region = op.regions
    _assign_block(state, then_region)
    _assign_block(state, else_region)
    for i, result in enumerate(op.results):
        if not is_block(result):
            continue
        layout = _anchor(state, then_region.terminator, i)
        require(state, else_region.terminator, i, layout)
        result.layout = layout


def _assign_block(state: State, block: Block) -> None:
    for arg in block.args:
        if is_block(arg) and arg.layout is None:
            arg.layout = state.default(shape_of(arg.type))
    for op in list(block.ops):
        _assign_op(state, op)


def assign_layouts(function: Function, num_warps: int, arch=None) -> bool:
    """Set `layout` on every block value of `function` and insert conversions. Returns True.

    arch: the target ("sm_80", "sm_90a", ...); tensor-core dots need sm_80+, None means FMA dots.
    """
    state = State(num_warps, memory_bits(function), arch, analyze_pointers(function))
    state.copyable_loads = copyable_loads(state, function)
    prefer_mma_accumulators(state, function)
    prefer_tensor_core_carries(state, function)
    hint_broadcast_loads(state, function)
    _assign_block(state, function.body)
    for op in function.walk():
        for r in op.results:
            if is_block(r) and r.layout is None:
                r.layout = state.default(shape_of(r.type))
    eliminate_dead_code(function)     # broadcasts and conversions that re-done broadcasts replaced
    return True
