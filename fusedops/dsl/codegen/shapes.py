"""Lowering of block creation and shape ops: constants, program ids, arange, splat, broadcast,
expand_dims, reshape, trans and convert_layout.

Shape ops whose result layout is a relabeling of the operand's (the layout pass arranges that) are
register permutations; `convert_layout` between layouts that put elements in other threads goes
through shared memory (see `shared.py`; to an mma dot operand: an ldmatrix tile, see `mma.py`; with attr
`swizzled`, a swizzled tile read and written with vectors, see `swizzled_exchange.py`).
"""

from __future__ import annotations

import math
import struct

from llvmlite import ir

from ..errors import CompilationError
from ..ir import OpCode
from ..language.dtypes import BlockType
from ..target import llvm_types as T
from . import layout_access, mma, swizzled_exchange
from .registry import lowering
from .shared import exchange_through_shared


def _scalar_constant(dtype, value):
    ty = T.llvm_type(dtype)
    if dtype.is_floating:
        value = float(value)
        if dtype.name == "float16":
            value = _round_to_half(value)
        return ir.Constant(ty, value)
    return ir.Constant(ty, int(value))


def _round_to_half(value: float) -> float:
    """`value` as float16 rounds it: beyond the largest half (65504, up to rounding) it is +-inf, as the
    interpreter's float16 arithmetic has it (llvmlite cannot pack a half constant that overflows)."""
    try:
        struct.pack("<e", value)
    except OverflowError:
        return math.copysign(math.inf, value)
    return value


@lowering(OpCode.CONSTANT)
def _constant(ctx, op):
    result = op.result
    if isinstance(result.type, BlockType):
        value = _scalar_constant(result.type.element, op.attrs["value"])
        ctx.set(result, [value] * layout_access.num_registers(result.layout))
    else:
        ctx.set(result, _scalar_constant(result.type, op.attrs["value"]))


_SREG = {OpCode.PROGRAM_ID: "ctaid", OpCode.NUM_PROGRAMS: "nctaid"}


@lowering(OpCode.PROGRAM_ID, OpCode.NUM_PROGRAMS)
def _program_id(ctx, op):
    axis = "xyz"[op.attrs["axis"]]
    name = f"llvm.nvvm.read.ptx.sreg.{_SREG[op.opcode]}.{axis}"
    fn = T.declare_intrinsic(ctx.module, name, T.i32, [])
    ctx.set(op.result, ctx.builder.call(fn, []))


@lowering(OpCode.ARANGE)
def _arange(ctx, op):
    layout = op.result.layout
    start = op.attrs["start"]
    out = []
    for r in range(layout_access.num_registers(layout)):
        (coord,) = ctx.element_coordinates(layout, r)
        out.append(ctx.builder.add(coord, ir.Constant(T.i32, start)) if start else coord)
    ctx.set(op.result, out)


@lowering(OpCode.SPLAT)
def _splat(ctx, op):
    ctx.set(op.result, [ctx.get(op.operands[0])] * layout_access.num_registers(op.result.layout))


def _relabel(ctx, op, project):
    source = op.operands[0]
    mapping = layout_access.register_map(source.layout, op.result.layout, project)
    if mapping is None:
        raise CompilationError(f"internal error: {op.opcode.value} between layouts that are not a "
                               f"relabeling:\n{source.layout!r}\n->\n{op.result.layout!r}", op.loc)
    registers = ctx.get(source)
    ctx.set(op.result, [registers[i] for i in mapping])


@lowering(OpCode.BROADCAST)
def _broadcast(ctx, op):
    source_shape = op.operands[0].type.shape
    dims = {d for d, (a, b) in enumerate(zip(source_shape, op.result.type.shape)) if a != b}
    _relabel(ctx, op, lambda coords: tuple(0 if d in dims else c for d, c in enumerate(coords)))


@lowering(OpCode.EXPAND_DIMS)
def _expand_dims(ctx, op):
    axis = op.attrs["axis"]
    if not isinstance(op.operands[0].type, BlockType):
        value = ctx.get(op.operands[0])
        ctx.set(op.result, [value] * layout_access.num_registers(op.result.layout))
        return
    _relabel(ctx, op, lambda coords: tuple(c for d, c in enumerate(coords) if d != axis))


def _row_major_bits(shape):
    offsets, offset = [0] * len(shape), 0
    for d in reversed(range(len(shape))):
        offsets[d] = offset
        offset += shape[d].bit_length() - 1
    return offsets


@lowering(OpCode.RESHAPE)
def _reshape(ctx, op):
    old_shape, new_shape = op.operands[0].type.shape, op.result.type.shape
    old_bits, new_bits = _row_major_bits(old_shape), _row_major_bits(new_shape)

    def project(coords):   # result coords -> operand coords, through the row-major index
        flat = sum(c << b for c, b in zip(coords, new_bits))
        return tuple((flat >> b) & (s - 1) for b, s in zip(old_bits, old_shape))
    _relabel(ctx, op, project)


@lowering(OpCode.TRANS)
def _trans(ctx, op):
    perm = op.attrs["perm"]
    inverse = [0] * len(perm)
    for i, p in enumerate(perm):
        inverse[p] = i
    _relabel(ctx, op, lambda coords: tuple(coords[inverse[d]] for d in range(len(perm))))


@lowering(OpCode.CONVERT_LAYOUT)
def _convert_layout(ctx, op):
    source, target = op.operands[0].layout, op.result.layout
    mapping = layout_access.register_map(source, target)
    registers = ctx.get(op.operands[0])
    if mapping is not None:
        ctx.set(op.result, [registers[i] for i in mapping])
        return
    if mma.can_stage_operand(op):
        mma.convert_to_dot_operand(ctx, op)
        return
    element = op.result.type.element
    marked = bool(op.attrs.get("swizzled"))
    if swizzled_exchange.can_exchange(element) and (marked or swizzled_exchange.exchanges_tiles(source, target)):
        ctx.set(op.result, swizzled_exchange.exchange_through_swizzled_shared(ctx, registers, source, target, element,
                                                                              here=not marked))
        return
    ctx.set(op.result, exchange_through_shared(ctx, registers, source, target, element))
