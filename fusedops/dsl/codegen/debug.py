"""Lowering of `device_print` (CUDA's `vprintf`) and `device_assert` (`__assertfail`, which stops
the kernel and makes the launch fail with an assertion error naming the kernel's source line).

device_print prints one line per element a thread holds: `pid (x, y, z) idx (i, j) prefix value`. With
`hex=True` the value is its bit pattern in hex (floats too, and a negative int8 / int16 in its own 8 / 16 bits:
0x80, not 0xffffff80), as the interpreter prints it.
"""

from __future__ import annotations

from llvmlite import ir

from ..ir import OpCode
from ..language.dtypes import BlockType, PointerType
from ..target import llvm_types as T
from .registry import lowering


def _string(ctx, text: str):
    """A generic `ptr` to a NUL-terminated constant string in global memory."""
    data = bytearray(text.encode("utf-8")) + b"\0"
    name = f"fusedops_str_{len(ctx.module.globals)}"
    g = ir.GlobalVariable(ctx.module, ir.ArrayType(T.i8, len(data)), name, addrspace=1)
    g.global_constant = True
    g.linkage = "internal"
    g.initializer = ir.Constant(ir.ArrayType(T.i8, len(data)), data)
    g.type = T.pointer(1)
    return ctx.builder.addrspacecast(g, T.pointer(0))


def _format(element, hex_: bool) -> str:
    if isinstance(element, PointerType):
        return "%p"
    if hex_:        # the bit pattern (`_printable` passes it zero-extended), floats included
        return "0x%llx" if element.bits == 64 else "0x%x"
    if element.is_floating:
        return "%f"
    if element.bits == 64:
        return "%lld" if element.is_signed else "%llu"
    return "%d" if element.is_signed or element.is_bool else "%u"


def _printable(bld, value, element, hex_: bool = False):
    if isinstance(element, PointerType):
        return value
    if hex_:        # the element's own bits, zero-extended to the 32 or 64 bits `_format`'s %x / %llx reads
        bits = value if not element.is_floating else bld.bitcast(value, ir.IntType(element.bits))
        return bits if element.bits in (32, 64) else bld.zext(bits, T.i32)
    if element.is_floating:
        return value if value.type == T.f64 else bld.fpext(value, T.f64)
    if element.bits == 64:
        return value
    return bld.sext(value, T.i32) if element.is_signed else bld.zext(value, T.i32)


def _printf(ctx, fmt: str, args):
    bld = ctx.builder
    vprintf = T.declare_intrinsic(ctx.module, "vprintf", T.i32, [T.pointer(0), T.pointer(0)])
    struct = ir.LiteralStructType([a.type for a in args]) if args else ir.LiteralStructType([T.i32])
    buffer = ctx.prologue.alloca(struct)   # allocas belong in the entry block
    for i, a in enumerate(args):
        bld.store(a, bld.gep(buffer, [ir.Constant(T.i32, 0), ir.Constant(T.i32, i)], inbounds=True))
    bld.call(vprintf, [_string(ctx, fmt), bld.addrspacecast(buffer, T.pointer(0)) if buffer.type != T.pointer(0) else buffer])


def _program_ids(ctx):
    bld = ctx.builder
    out = []
    for axis in "xyz":
        fn = T.declare_intrinsic(ctx.module, f"llvm.nvvm.read.ptx.sreg.ctaid.{axis}", T.i32, [])
        out.append(bld.call(fn, []))
    return out


@lowering(OpCode.PRINT)
def _print(ctx, op):
    bld = ctx.builder
    # the prefix is text, not format: a "%" in it would take an argument (or read a string pointer: %s)
    prefix, hex_ = op.attrs.get("prefix", "").replace("%", "%%"), op.attrs.get("hex", False)
    pids = _program_ids(ctx)
    if not op.operands:
        _printf(ctx, f"pid (%d, %d, %d) {prefix}\n", pids)
        return
    for value in op.operands:
        element = value.type.element if isinstance(value.type, BlockType) else value.type
        lowered = ctx.get(value)
        if not isinstance(value.type, BlockType):
            _printf(ctx, f"pid (%d, %d, %d) {prefix}{_format(element, hex_)}\n",
                    pids + [_printable(bld, lowered, element, hex_)])
            continue
        rank = len(value.type.shape)
        index_format = ", ".join(["%d"] * rank)
        for r, register in enumerate(lowered):
            coords = list(ctx.element_coordinates(value.layout, r))
            _printf(ctx, f"pid (%d, %d, %d) idx ({index_format}) {prefix}{_format(element, hex_)}\n",
                    pids + coords + [_printable(bld, register, element, hex_)])


@lowering(OpCode.LAUNCH_BOUNDS)
def _launch_bounds(ctx, op):
    """Nothing in the body: kernel.py turns the directive into `.minnctapersm`."""


@lowering(OpCode.CLUSTER_DIMS)
def _cluster_dims(ctx, op):
    """Nothing in the body: kernel.py turns the directive into `.reqnctapercluster`."""


@lowering(OpCode.ASSERT)
def _assert(ctx, op):
    bld = ctx.builder
    condition = op.operands[0]
    lowered = ctx.get(condition)
    registers = lowered if isinstance(condition.type, BlockType) else [lowered]
    ok = registers[0]
    for register in registers[1:]:
        ok = bld.and_(ok, register)
    loc = op.loc
    fail = T.declare_intrinsic(ctx.module, "__assertfail", T.void,
                               [T.pointer(0), T.pointer(0), T.i32, T.pointer(0), T.i64])
    with bld.if_then(bld.not_(ok), likely=False):
        bld.call(fail, [_string(ctx, f"device_assert failed: {op.attrs.get('message', '')}"),
                        _string(ctx, loc.file), ir.Constant(T.i32, loc.line),
                        _string(ctx, loc.function or "kernel"), ir.Constant(T.i64, 1)])
