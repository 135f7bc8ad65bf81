"""States what legal block IR is: every op's operand and result types, dominance, terminators.

`verify(function)` raises `VerificationError` naming the op, its location and the broken rule. Passes
and the frontend run it in tests; a failure is a compiler bug, not a user error.
"""

from __future__ import annotations

from ..language.dtypes import BlockType, DType, PointerType, int1, int32, int64, shape_of, with_element
from .core import Block, Function, Operation
from .shared_buffer import SharedBufferType
from .ops import (BINARY_ARITH, COMPARISON, CONTROL_FLOW, FLOAT_ONLY, INTEGER_ONLY, MAX_CLUSTER_SIZE, UNARY,
                  OpCode)


class VerificationError(Exception):
    pass


def _fail(op: Operation, message: str):
    raise VerificationError(f"{op.opcode.value} at {op.loc}: {message}")


def _element(type_):
    return type_.element if isinstance(type_, BlockType) else type_


def _check_types(op: Operation) -> None:
    code = op.opcode
    ins = [v.type for v in op.operands]
    outs = [v.type for v in op.results]

    def expect(cond: bool, message: str):
        if not cond:
            _fail(op, message)

    if code in BINARY_ARITH or code in COMPARISON:
        expect(len(ins) == 2 and ins[0] == ins[1], f"operands must have one type, got {ins}")
        element = _element(ins[0])
        expect(not isinstance(element, PointerType) or code in COMPARISON,
               "pointer arithmetic goes through addptr")
        if code in FLOAT_ONLY:
            expect(element.is_floating, f"needs floating operands, got {element}")
        if code in INTEGER_ONLY:
            expect(element.is_integer, f"needs integer operands, got {element}")
        expected = ins[0] if code in BINARY_ARITH else (BlockType(ins[0].shape, int1)
                                                      if isinstance(ins[0], BlockType) else int1)
        expect(outs == [expected], f"result must be {expected}, got {outs}")
    elif code in UNARY:
        expect(len(ins) == 1 and outs == ins, "result type must equal operand type")
        if code in FLOAT_ONLY:
            expect(_element(ins[0]).is_floating, f"needs a floating operand, got {ins[0]}")
    elif code == OpCode.MATH2:
        expect(len(ins) == 2 and outs == ins[:1] and _element(ins[0]).is_floating, "math2 takes a float first operand "
               f"and returns its type, got {ins} -> {outs}")
        second = with_element(ins[0], int32) if op.attrs.get("fn") == "powi" else ins[0]
        expect(ins[1] == second, f"math2 {op.attrs.get('fn')}: the second operand must be {second}, got {ins[1]}")
    elif code == OpCode.FMA:
        expect(len(ins) == 3 and ins[0] == ins[1] == ins[2] == outs[0], "fma operands must share a type")
    elif code == OpCode.WHERE:
        expect(len(ins) == 3 and ins[1] == ins[2] == outs[0], "where branches must share the result type")
        expect(_element(ins[0]) == int1 and shape_of(ins[0]) == shape_of(ins[1]), "where condition must be int1 of the same shape")
    elif code in (OpCode.CAST, OpCode.BITCAST):
        expect(shape_of(ins[0]) == shape_of(outs[0]), "cast keeps the shape")
    elif code == OpCode.ADDPTR:
        expect(isinstance(_element(ins[0]), PointerType) and ins[0] == outs[0], "addptr takes and returns a pointer")
        expect(_element(ins[1]).is_integer and shape_of(ins[1]) == shape_of(ins[0]), "addptr offset must be an integer of the pointer's shape")
    elif code == OpCode.SPLAT:
        expect(not isinstance(ins[0], BlockType) and isinstance(outs[0], BlockType)
               and outs[0].element == ins[0], "splat turns a scalar into a block of it")
    elif code == OpCode.BROADCAST:
        expect(isinstance(ins[0], BlockType) and isinstance(outs[0], BlockType)
               and len(ins[0].shape) == len(outs[0].shape) and ins[0].element == outs[0].element
               and all(a in (1, b) for a, b in zip(ins[0].shape, outs[0].shape)), "bad broadcast")
    elif code == OpCode.LOAD:
        pointer = _element(ins[0])
        expect(isinstance(pointer, PointerType), "load needs a pointer")
        expect(_element(outs[0]) == pointer.element and shape_of(outs[0]) == shape_of(ins[0]), "load result type")
        expected_count = 1 + bool(op.attrs.get("masked")) + bool(op.attrs.get("has_other"))
        expect(len(ins) == expected_count, "load operand count does not match masked/has_other")
    elif code == OpCode.STORE:
        pointer = _element(ins[0])
        expect(isinstance(pointer, PointerType), "store needs a pointer")
        expect(_element(ins[1]) == pointer.element and shape_of(ins[1]) == shape_of(ins[0]), "store value type")
    elif code == OpCode.DOT:
        a, b, acc = ins
        expect(len(a.shape) == len(b.shape) == 2 and a.shape[1] == b.shape[0]
               and acc.shape == (a.shape[0], b.shape[1]) and outs[0] == acc, "dot shapes")
    elif code in (OpCode.PROGRAM_ID, OpCode.NUM_PROGRAMS):
        expect(outs == [int32] and op.attrs.get("axis") in (0, 1, 2), "program_id/num_programs axis")
    elif code == OpCode.FOR:
        body = op.regions[0]
        carried = [v.type for v in op.operands[3:]]
        expect([a.type for a in body.args[1:]] == carried and outs == carried, "for carried types")
        expect([v.type for v in body.terminator.operands] == carried, "for yield types")
    elif code == OpCode.LOCAL_ALLOC:
        expect(not ins and len(outs) == 1 and isinstance(outs[0], SharedBufferType), "local_alloc makes one buffer")
    elif code in (OpCode.LOCAL_LOAD, OpCode.ASYNC_COPY, OpCode.LOCAL_DEALLOC):
        expect(bool(ins) and isinstance(ins[0], SharedBufferType), f"{code.value} takes a shared buffer first")
        buffer = ins[0]
        if code != OpCode.LOCAL_DEALLOC:
            expect(ins[1] == int32, f"{code.value} takes an int32 buffer index")
        if code == OpCode.LOCAL_LOAD:
            expect(outs == [BlockType(buffer.tile_shape, buffer.element)], "local_load gives a block of one tile")
        if code == OpCode.ASYNC_COPY:
            pointer = _element(ins[2])
            expect(isinstance(pointer, PointerType) and pointer.element == buffer.element
                   and shape_of(ins[2]) == buffer.tile_shape, "async_copy pointers must match the tile")
            expect(len(ins) == 3 + bool(op.attrs.get("masked")), "async_copy operand count does not match masked")
    elif code == OpCode.DESCRIPTOR_LOAD:
        expect(len(ins) == 7 and isinstance(ins[0], PointerType), "descriptor_load takes base, 2 sizes, 2 strides, 2 offsets")
        expect(all(t in (int32, int64) for t in ins[1:5]) and ins[5:] == [int32, int32],
               "descriptor_load sizes and strides are int32/int64 scalars, offsets int32")
        expect(outs == [BlockType(tuple(op.attrs.get("block_shape", ())), ins[0].element)],
               "descriptor_load gives a block_shape block of the base's element")
    elif code in (OpCode.DESCRIPTOR_STORE, OpCode.TMA_STORE):
        base, value = (0, 7) if code == OpCode.DESCRIPTOR_STORE else (1, 0)
        sizes = ins[base + 1:base + 7]
        expect(len(ins) == 8 and isinstance(ins[base], PointerType) and not outs,
               f"{code.value} takes a base, 2 sizes, 2 strides, 2 offsets and a value, and gives nothing")
        expect(all(t in (int32, int64) for t in sizes[:4]) and sizes[4:] == [int32, int32],
               f"{code.value} sizes and strides are int32/int64 scalars, offsets int32")
        expect(ins[value] == BlockType(tuple(op.attrs.get("block_shape", ())), ins[base].element),
               f"{code.value} stores a block_shape block of the base's element")
    elif code == OpCode.CLUSTER_DIMS:
        size = op.attrs.get("size")
        expect(not ins and not outs and type(size) is int and 1 <= size <= MAX_CLUSTER_SIZE,
               f"cluster_dims takes nothing and a size from 1 to {MAX_CLUSTER_SIZE}")
    elif code == OpCode.WGMMA_WAIT:
        expect(ins == outs and isinstance(op.attrs.get("pending"), int), "wgmma_wait returns its operands")
    elif code == OpCode.IF:
        expect(ins == [int1], "if condition must be a scalar int1")
        for region in op.regions:
            expect([v.type for v in region.terminator.operands] == outs, "if yield types")


def _verify_block(block: Block, defined: set, function: Function) -> None:
    defined = set(defined)
    defined.update(id(a) for a in block.args)
    for index, op in enumerate(block.ops):
        for operand in op.operands:
            if id(operand) not in defined:
                _fail(op, f"operand {operand!r} is used before it is defined")
        if op.opcode in (OpCode.YIELD, OpCode.CONDITION) and index != len(block.ops) - 1:
            _fail(op, "a terminator must be the last op of its block")
        if op.opcode in CONTROL_FLOW:
            for region in op.regions:
                if region.terminator is None:
                    _fail(op, "each region must end in yield or condition")
        for result in op.results:
            if not isinstance(result.type, (DType, PointerType, BlockType, SharedBufferType)):
                _fail(op, f"result type {result.type!r} is not a dsl type")
        _check_types(op)
        for region in op.regions:
            _verify_block(region, defined, function)
        defined.update(id(r) for r in op.results)


def verify(function: Function) -> None:
    """Raise VerificationError when `function` breaks a rule of the IR."""
    _verify_block(function.body, set(), function)
