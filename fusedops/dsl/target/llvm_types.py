"""llvmlite.ir helpers for the NVPTX back end: the bfloat type, dtype -> LLVM type, intrinsics,
inline asm and string function attributes.

llvmlite 0.50 lacks three things the code generator needs (see TOOLCHAIN.md section 1):
- a `bfloat` type: `BFloatType` below prints `bfloat` and `0xRXXXX` constants;
- string function attributes such as `"nvvm.maxntid"="128,1,1"`: its attribute sets accept only a
  fixed whitelist, so `add_string_attribute` widens the whitelist of that one function;
- convergent inline asm: `inline_asm(..., convergent=True)` marks the call.
"""

from __future__ import annotations

import math
import struct
from typing import Iterable, Mapping, Optional, Sequence

from llvmlite import ir

from fusedops.dsl.language import dtypes

GLOBAL_ADDRESS_SPACE = 1
SHARED_ADDRESS_SPACE = 3


class BFloatType(ir.types._BaseFloatType):
    """LLVM's `bfloat` (1 sign, 8 exponent, 7 mantissa bits): a float32 with the low 16 bits cut.

    Constants print as `0xRXXXX` (LLVM's hex form for bfloat), rounded to nearest-even from the
    float32 value of the Python float.
    """

    null = "0.0"
    intrinsic_name = "bf16"

    def _to_string(self) -> str:
        return "bfloat"

    def format_constant(self, value: float) -> str:
        return "0xR%04X" % bfloat16_bits(value)


BFloatType._create_instance()

i1 = ir.IntType(1)
i8 = ir.IntType(8)
i16 = ir.IntType(16)
i32 = ir.IntType(32)
i64 = ir.IntType(64)
f16 = ir.HalfType()
bf16 = BFloatType()
f32 = ir.FloatType()
f64 = ir.DoubleType()
void = ir.VoidType()


def bfloat16_bits(value: float) -> int:
    """The 16-bit pattern of `value` as a bfloat16, rounded to nearest-even (NaN stays a quiet NaN).

    Values beyond float32's range become infinity, as the float32 -> bfloat16 conversion does.
    """
    if math.isnan(value):
        return 0x7FC0
    try:
        nearest = struct.unpack("<f", struct.pack("<f", value))[0]
    except OverflowError:
        return 0xFF80 if value < 0 else 0x7F80
    bits = struct.unpack("<I", struct.pack("<f", nearest))[0]
    if nearest != value and not math.isinf(nearest):
        # float32 rounded to odd (truncated toward zero, last bit set where inexact): rounding that to
        # bfloat16 gives the double's nearest bfloat16 (rounding to nearest twice does not: 1 + 2**-8 +
        # 2**-30 became 1.0)
        if abs(nearest) > abs(value):
            bits -= 1
        bits |= 1
    rounding_bias = 0x7FFF + ((bits >> 16) & 1)
    return ((bits + rounding_bias) >> 16) & 0xFFFF


def pointer(address_space: int = GLOBAL_ADDRESS_SPACE) -> ir.PointerType:
    """An opaque pointer, `ptr addrspace(N)`; loads and GEPs through it must name their type."""
    return ir.PointerType(addrspace=address_space)


_SCALAR = {
    "int1": i1, "int8": i8, "int16": i16, "int32": i32, "int64": i64,
    "uint8": i8, "uint16": i16, "uint32": i32, "uint64": i64,
    "float16": f16, "bfloat16": bf16, "float32": f32, "float64": f64,
}


def llvm_type(type_) -> ir.Type:
    """The LLVM register type of a scalar kernel-language type.

    int1 -> i1; signed and unsigned ints -> iN (LLVM integers carry no sign); float16 -> half;
    bfloat16 -> bfloat; float32 -> float; float64 -> double; a `PointerType` -> opaque
    `ptr addrspace(N)`.

    Raises:
        TypeError: `type_` is a block type (codegen lowers a block to per-thread scalars first) or
            not a kernel-language type.
    """
    if isinstance(type_, dtypes.PointerType):
        return pointer(type_.address_space)
    if isinstance(type_, dtypes.DType):
        return _SCALAR[type_.name]
    if isinstance(type_, dtypes.BlockType):
        raise TypeError(f"llvm_type takes a scalar type; got the block type {type_} (lower it per thread first)")
    raise TypeError(f"llvm_type expects a fusedops dtype or pointer type, got {type_!r}")


def llvm_memory_type(type_) -> ir.Type:
    """The LLVM type a scalar is stored as in memory: as `llvm_type`, except int1 is one byte (i8)."""
    if isinstance(type_, dtypes.DType) and type_.is_bool:
        return i8
    return llvm_type(type_)


def vector_type(type_, width: int) -> ir.Type:
    """`<width x T>` for the LLVM type T of a scalar dtype; `width == 1` gives T itself."""
    if width < 1:
        raise ValueError(f"vector width must be >= 1, got {width}")
    element = llvm_type(type_)
    return element if width == 1 else ir.VectorType(element, width)


def declare_intrinsic(module: ir.Module, name: str, return_type: ir.Type, arg_types: Sequence[ir.Type],
                      attributes: Iterable[str] = ()) -> ir.Function:
    """The declaration of intrinsic (or external function) `name` in `module`, created on first use.

    Later calls with the same name return the same `ir.Function` (looked up in `module.globals`).
    `attributes` are function attributes from llvmlite's whitelist (e.g. "nounwind", "convergent").

    Raises:
        TypeError: `name` is already declared in `module` with a different signature.
    """
    function_type = ir.FunctionType(return_type, list(arg_types))
    existing = module.globals.get(name)
    if existing is not None:
        if not isinstance(existing, ir.Function) or existing.function_type != function_type:
            raise TypeError(f"{name} is already declared as {existing.type}, not as {function_type}")
        return existing
    function = ir.Function(module, function_type, name)
    for attribute in attributes:
        function.attributes.add(attribute)
    return function


def _escape_asm(text: str) -> str:
    # The asm string is printed inside an LLVM string literal, where only \XX hex escapes exist.
    return text.replace("\\", "\\5C").replace('"', "\\22").replace("\n", "\\0A")


def inline_asm(builder: ir.IRBuilder, asm: str, constraints: str, args: Sequence[ir.Value],
               return_type: ir.Type = void, *, side_effect: bool = True, convergent: bool = False,
               name: str = "") -> ir.CallInstr:
    """Emit a call to inline PTX `asm` with LLVM `constraints` (e.g. "=r,l,b").

    Constraint letters for NVPTX: r = 32-bit, l = 64-bit or pointer, h = 16-bit, f = f32,
    d = f64, b = i1 predicate; "0" ties an input to output 0. A struct `return_type` returns several
    outputs. Use `convergent=True` for warp- or CTA-synchronous asm (shfl, wgmma, bar): LLVM must
    not move such a call into or out of control flow, and inline asm is not convergent by default.
    Newlines and quotes in `asm` are escaped for the IR text.
    """
    function_type = ir.FunctionType(return_type, [arg.type for arg in args])
    callee = ir.InlineAsm(function_type, _escape_asm(asm), constraints, side_effect)
    attrs = ("convergent",) if convergent else ()
    return builder.call(callee, list(args), name=name, attrs=attrs)


def add_string_attribute(function: ir.Function, key: str, value: str) -> None:
    """Add the string function attribute `"key"="value"` (e.g. "nvvm.maxntid" = "128,1,1").

    llvmlite only accepts attributes from a fixed whitelist; this widens the whitelist of
    `function` alone (an instance attribute shadowing the class one) and adds the attribute.
    """
    text = f'"{key}"="{value}"'
    attributes = function.attributes
    attributes._known = frozenset(attributes._known) | {text}
    attributes.add(text)


def mark_kernel(function: ir.Function, *, max_threads: Optional[int] = None,
                min_blocks_per_sm: Optional[int] = None, extra: Optional[Mapping[str, str]] = None) -> None:
    """Make `function` a kernel entry point (`.entry`) with optional launch bounds.

    max_threads -> `.maxntid N, 1, 1` (the block size the kernel is launched with must not exceed
    it; ptxas uses it to budget registers); min_blocks_per_sm -> `.minnctapersm`. `extra` adds
    further string attributes, e.g. {"nvvm.maxnreg": "128"}.
    """
    function.calling_convention = "ptx_kernel"
    if max_threads is not None:
        add_string_attribute(function, "nvvm.maxntid", f"{int(max_threads)},1,1")
    if min_blocks_per_sm is not None:
        add_string_attribute(function, "nvvm.minctasm", str(int(min_blocks_per_sm)))
    for key, value in (extra or {}).items():
        add_string_attribute(function, key, value)
