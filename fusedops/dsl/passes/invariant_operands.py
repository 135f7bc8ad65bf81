"""Loop-invariant wgmma operands in shared memory: a tile loaded once, before a loop, that the loop's
wgmma dots read from shared memory (`dot_layouts.wgmma_staged_a`) is copied there once, not staged
from registers every iteration.

The layout pass converts such an operand to its wgmma tile before the loop (`convert_layout
{dot_operand, hoisted}`). Where the load qualifies for cp.async (as a pipelined ring's loads do:
`other` 0 or absent, copies of at least 4 bytes along the tile's contiguous dim), this pass turns

    %k = load %p, %m, 0.0;  %k_t = convert_layout %k {dot_operand = 0, hoisted}
    for ...: dot %k_t, ...

into

    %buf = local_alloc {swizzle_bytes} : !shared<1 x tile>      (where the load was: a later store
    async_copy %buf[0], %p, %m;  async_commit                    to that memory is not seen)
    ...
    async_wait {pending = 0, proxy_fence}    (before the first reader or an earlier write to memory;
                                              one for the tiles first read by the same op)
    %k_t = local_load %buf[0]            (the wgmma reads the tile in place, codegen/async_copy.py)
    for ...: dot %k_t, ...
    local_dealloc %buf                   (after the last op of the block that reads the tile)

The wait's CTA barrier makes every thread's copies visible before any wgmma reads the tile; the
proxy fence orders cp.async's generic-proxy writes before wgmma's async-proxy reads (as for the
rings, passes/pipelining.py). A load that does not qualify gets its conversion back in front of each
dot (staged through scratch shared memory with st.shared every iteration: right, but slower).
Triton keeps such operands in shared memory the same way (a `local_alloc` of the loaded tile that
the MMA reads, "memory descriptors"); this is our formulation of it.
"""

from __future__ import annotations

from ..ir import Function, Operation, OpCode
from ..ir.shared_buffer import SharedBufferType
from ..language.dtypes import shape_of
from ..layouts.mma_shared import shared_contiguous_dim, wgmma_operand_tile
from ..layouts.swizzle import contiguous_dim
from .dce import eliminate_dead_code
from ._copy_width import MIN_COPY_BYTES, copy_width
from ._rewriting import Inserter, is_zero_constant, replace_uses
from .pointer_analysis import analyze_pointers


def stage_invariant_operands(function: Function) -> bool:
    """Rewrite every hoisted wgmma operand conversion (see the module docstring). Returns whether the
    IR changed."""
    converts = [op for op in function.walk()
                if op.opcode == OpCode.CONVERT_LAYOUT and op.attrs.get("hoisted")]
    if not converts:
        return False
    analysis = analyze_pointers(function)
    for convert in converts:
        width = _qualifying_width(analysis, convert)
        if width:
            _copy_once(convert, width)
        else:
            _stage_at_each_dot(function, convert)
    eliminate_dead_code(function)
    return True


def _qualifying_width(analysis, convert: Operation) -> int:
    """Elements per cp.async of the hoisted operand's load, or 0 when it does not qualify."""
    load = convert.operands[0].defining_op
    if load is None or load.opcode != OpCode.LOAD or load.parent is not convert.parent:
        return 0
    if load.attrs.get("has_other") and not is_zero_constant(load.operands[-1]):
        return 0
    element = load.result.type.element
    if shared_contiguous_dim(convert.result.layout) != contiguous_dim(load.result.layout, element.bits):
        return 0
    width = copy_width(analysis, load, convert.result.layout)
    return width if width * element.itemsize >= MIN_COPY_BYTES else 0


def _copy_once(convert: Operation, width: int) -> None:
    block = convert.parent
    load = convert.operands[0].defining_op
    tile = convert.result.layout
    element = load.result.type.element
    readers = [op for op in block.ops if any(convert.result in nested.operands for nested in op.walk())]
    at = Inserter(block, load)      # the copy reads the memory where the load did (a store may follow it)
    attrs = {"contiguous_dim": shared_contiguous_dim(tile),
             "swizzle_bytes": wgmma_operand_tile(tile, convert.attrs["dot_operand"], element.bits).swizzle_bytes}
    buffer = at.value(OpCode.LOCAL_ALLOC, [], SharedBufferType(1, shape_of(load.result.type), element), attrs)
    zero = at.constant(0)
    operands = [buffer, zero, load.operands[0]] + ([load.operands[1]] if load.attrs.get("masked") else [])
    at.op(OpCode.ASYNC_COPY, operands, [], {"masked": bool(load.attrs.get("masked")), "width": width}, load.loc)
    commit = at.op(OpCode.ASYNC_COMMIT, [], [])
    _insert(block, block.ops.index(readers[-1]) + 1, Operation(OpCode.LOCAL_DEALLOC, [buffer], [], {}, (), convert.loc))
    # the wait: before the first reader, or before a write to memory in between (the copy's reads are
    # ordered before later writes only by the wait); one wait serves the tiles first read by the same op
    wait_at = next(i for i in range(block.ops.index(commit) + 1, len(block.ops))
                   if block.ops[i] is readers[0] or _writes_memory(block.ops[i]))
    before = wait_at - 1
    while before >= 0 and block.ops[before].opcode == OpCode.LOCAL_LOAD:
        before -= 1
    if before < 0 or not _waits_for_all(block.ops[before]):
        _insert(block, wait_at, Operation(OpCode.ASYNC_WAIT, [], [], {"pending": 0, "proxy_fence": True}, (),
                                          readers[0].loc))
    tile_value = Inserter(block, readers[0]).value(OpCode.LOCAL_LOAD, [buffer, zero], convert.result.type,
                                                   layout=tile)
    replace_uses(block, 0, convert.result, tile_value)
    block.ops.remove(convert)


_WRITES = frozenset({OpCode.STORE, OpCode.ATOMIC_RMW, OpCode.ATOMIC_CAS, OpCode.DESCRIPTOR_STORE, OpCode.TMA_STORE})


def _writes_memory(op: Operation) -> bool:
    return any(nested.opcode in _WRITES for nested in op.walk())


def _waits_for_all(op: Operation) -> bool:
    return op.opcode == OpCode.ASYNC_WAIT and op.attrs.get("pending") == 0 and bool(op.attrs.get("proxy_fence"))


def _insert(block, index: int, op: Operation) -> None:
    op.parent = block
    block.ops.insert(index, op)


def _stage_at_each_dot(function: Function, convert: Operation) -> None:
    """The conversion again right before each dot that reads it (staged there, every iteration)."""
    for dot in [op for op in function.walk() if convert.result in op.operands]:
        for index, operand in enumerate(dot.operands):
            if operand is convert.result:
                at = Inserter(dot.parent, dot)
                attrs = {k: v for k, v in convert.attrs.items() if k != "hoisted"}
                dot.operands[index] = at.value(OpCode.CONVERT_LAYOUT, [convert.operands[0]], convert.result.type,
                                               attrs, layout=convert.result.layout)
    convert.parent.ops.remove(convert)

