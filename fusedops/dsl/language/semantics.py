"""Typed construction of block IR: the kernel language's semantics.

`Semantics` turns operations on IR values and Python literals into typed IR, applying the promotion
and broadcasting rules of `promotion.py`: after it, every IR op is monomorphic (operands of one type
and shape), so the interpreter and the code generator never promote. Errors are `CompilationError`s
without a location; the frontend adds the location of the expression being compiled.

The class is split by concern: elementwise ops here, shapes in `shape_ops.py`, memory, reductions and
`dot` in `block_ops.py`.
"""

from __future__ import annotations

import math

from ..errors import CompilationError
from ..ir import Builder, OpCode, Value
from . import promotion
from .block_ops import BlockOps
from .dtypes import (BlockType, DType, PointerType, float32, float64, int1, int32, int64, shape_of,
                     with_element, with_shape)
from .shape_ops import ShapeOps, compile_time_bool, compile_time_flag, described, shown

_BINARY = {
    "add": OpCode.ADD, "sub": OpCode.SUB, "mul": OpCode.MUL, "truediv": OpCode.DIV,
    "floordiv": OpCode.IDIV, "mod": OpCode.MOD, "and": OpCode.AND, "or": OpCode.OR, "xor": OpCode.XOR,
    "lshift": OpCode.SHL, "rshift": OpCode.SHR, "minimum": OpCode.MINIMUM, "maximum": OpCode.MAXIMUM,
    "eq": OpCode.EQ, "ne": OpCode.NE, "lt": OpCode.LT, "le": OpCode.LE, "gt": OpCode.GT, "ge": OpCode.GE,
}
# The ops that compute int1 operands in int32, as C's integer promotion does (arithmetic and shifts); the
# bitwise & | ^, min / max and comparisons keep int1, whose values they cannot take out of {0, 1}.
_INT1_PROMOTED = frozenset({"add", "sub", "mul", "floordiv", "mod", "lshift", "rshift"})
_MATH = {
    "exp": OpCode.EXP, "exp2": OpCode.EXP2, "log": OpCode.LOG, "log2": OpCode.LOG2, "sqrt": OpCode.SQRT,
    "rsqrt": OpCode.RSQRT, "sin": OpCode.SIN, "cos": OpCode.COS, "erf": OpCode.ERF, "tanh": OpCode.TANH,
    "floor": OpCode.FLOOR, "ceil": OpCode.CEIL,
}


def is_literal(x) -> bool:
    return isinstance(x, (bool, int, float)) and not isinstance(x, Value)


def element_of(x: Value):
    return x.type.element if isinstance(x.type, BlockType) else x.type


# Significand bits (with the implicit one) of the float dtypes: an int literal is rounded to these once.
_SIGNIFICAND_BITS = {"float16": 11, "bfloat16": 8, "float32": 24, "float64": 53}


def _is_plain_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int_to_float(value: int, bits: int) -> float:
    """`_int_rounded(value, bits)` as a Python float: +-inf past float64's range (every float dtype
    overflows there too), where float() of the int would raise OverflowError."""
    rounded = _int_rounded(value, bits)
    if abs(rounded).bit_length() > 1024:
        return math.inf if rounded > 0 else -math.inf
    return float(rounded)


def _int_rounded(value: int, bits: int) -> int:
    """`value` rounded to `bits` significant bits, to nearest, ties to even: exactly representable as a
    Python float, so that float() of it and the later narrowing to the dtype round once in all (float() of
    an int above 2**53 would round it to 53 bits first: 2**53 + 2**29 + 1 became 2**53 in float32, not
    2**53 + 2**30)."""
    magnitude = abs(value)
    extra = magnitude.bit_length() - bits
    if extra <= 0:
        return value
    quotient, remainder = divmod(magnitude, 1 << extra)
    half = 1 << (extra - 1)
    if remainder > half or (remainder == half and quotient & 1):
        quotient += 1
    return (quotient << extra) * (1 if value >= 0 else -1)


class Semantics(ShapeOps, BlockOps):
    """Builds typed IR through `builder`. Every public method takes IR values or Python literals."""

    def __init__(self, builder: Builder):
        self.builder = builder

    # -- values ------------------------------------------------------------------------------------
    def constant(self, value, dtype: DType, shape: tuple = ()) -> Value:
        if dtype.is_floating:
            value = _int_to_float(value, _SIGNIFICAND_BITS[dtype.name]) if _is_plain_int(value) else float(value)
        elif dtype.is_bool:
            value = bool(value)
        else:
            value = int(value)
            bits = dtype.bits
            value &= (1 << bits) - 1
            if dtype.is_signed and value >= 1 << (bits - 1):
                value -= 1 << bits
        return self.builder.value(OpCode.CONSTANT, [], with_shape(dtype, shape), value=value)

    def to_value(self, x, like: DType = None) -> Value:
        """An IR value for `x`; a literal adopts `like` when it fits (weak typing)."""
        if isinstance(x, Value):
            return x
        if not is_literal(x):
            raise CompilationError(f"{described(x)} (a {type(x).__name__}) cannot be used as a kernel value")
        if like is not None and isinstance(like, DType) and promotion.literal_fits(x, like) \
                and not (isinstance(x, bool) and not like.is_bool):
            return self.constant(x, like)
        try:
            return self.constant(x, promotion.literal_dtype(x))
        except promotion.PromotionError as e:
            raise CompilationError(str(e)) from None

    def _pair(self, a, b):
        """Both operands as values, literals typed after the other operand."""
        if is_literal(a) and is_literal(b):
            return self.to_value(a), self.to_value(b)
        if is_literal(a):
            b = self.to_value(b)
            return self.to_value(a, element_of(b)), b
        if is_literal(b):
            a = self.to_value(a)
            return a, self.to_value(b, element_of(a))
        return self.to_value(a), self.to_value(b)

    # -- casts -------------------------------------------------------------------------------------
    def cast(self, x, dtype, bitcast: bool = False) -> Value:
        """Convert `x` to element type `dtype` (a value conversion; `bitcast` reinterprets bits). A float
        literal converted to an integer type (int1 included) converts from its exact value (float64), an int
        literal the type cannot hold wraps to its width (C's conversion; past 64 bits it is an error). A literal
        bitcast keeps its own bits: an int literal is the integer of dtype's width that holds it (signed
        first: 0x7F800000 -> float32 is inf); a float literal is the float dtype itself (bfloat16 too), or
        for an int dtype the float16 / float32 / float64 of its width."""
        bitcast = compile_time_flag(bitcast, "cast: bitcast")
        if not isinstance(dtype, (DType, PointerType)):
            raise CompilationError(f"cast target must be a dsl dtype such as dsl.float32, got {shown(dtype)}")
        if bitcast:
            x = self._bitcast_literal(x, dtype)
        elif isinstance(x, float) and isinstance(dtype, DType) and not dtype.is_floating:
            # a float literal converts to an integer type from its exact value, as Python's int() and
            # torch.full do: typed alone (float32) it would round first (123456789.0 -> 123456792)
            x = self.to_value(x, float64)
        else:
            x = self.to_value(x, dtype if isinstance(dtype, DType) else None)
        source = element_of(x)
        if source == dtype:
            return x
        if bitcast:
            if source.itemsize * 8 != (dtype.bits if isinstance(dtype, DType) else 64) \
                    or source == int1 or dtype == int1:
                raise CompilationError(f"bitcast needs equal bit widths, got {source} and {dtype}")
            return self.builder.value(OpCode.BITCAST, [x], with_element(x.type, dtype))
        if isinstance(source, PointerType) and isinstance(dtype, PointerType):
            return self.builder.value(OpCode.BITCAST, [x], with_element(x.type, dtype))
        if isinstance(source, PointerType) or isinstance(dtype, PointerType):
            other = dtype if isinstance(source, PointerType) else source
            if other not in (int64,) and not (isinstance(other, DType) and other.kind == "uint" and other.bits == 64):
                raise CompilationError(f"pointers convert only to and from 64-bit integers, not {other}")
        return self.builder.value(OpCode.CAST, [x], with_element(x.type, dtype))

    def _bitcast_literal(self, x, dtype) -> Value:
        """The IR value of the bits of `x` (a literal: see `cast`; an IR value: itself) as a bitcast to
        `dtype` reads them."""
        if isinstance(x, Value) or not is_literal(x) or isinstance(x, bool):
            return self.to_value(x)
        bits = dtype.bits if isinstance(dtype, DType) else 64
        if isinstance(x, float):        # a float target of its width takes it as it is (bfloat16 too)
            same = isinstance(dtype, DType) and dtype.is_floating
            return self.to_value(x, dtype if same else promotion.float_of_bits(bits))
        for candidate in promotion.ints_of_bits(bits):
            if promotion.literal_fits(x, candidate):
                return self.constant(x, candidate)
        raise CompilationError(f"bitcast: the int literal {x} does not fit in {bits} bits")

    def broadcast_pair(self, a: Value, b: Value):
        shape = self._broadcast_shape(shape_of(a.type), shape_of(b.type))
        return self.broadcast_to(a, shape), self.broadcast_to(b, shape)

    def _broadcast_shape(self, a, b):
        try:
            return promotion.broadcast_shapes(a, b)
        except promotion.PromotionError as e:
            raise CompilationError(str(e)) from None

    # -- elementwise -------------------------------------------------------------------------------
    def binary(self, op: str, a, b) -> Value:
        """`a <op> b` for op in add, sub, mul, truediv, floordiv, mod, and, or, xor, lshift, rshift,
        minimum, maximum, eq, ne, lt, le, gt, ge."""
        a, b = self._pair(a, b)
        ea, eb = element_of(a), element_of(b)
        if isinstance(ea, PointerType) or isinstance(eb, PointerType):
            return self._pointer_binary(op, a, b)
        try:
            dtype = promotion.promote(ea, eb)
        except promotion.PromotionError as e:
            raise CompilationError(str(e)) from None
        if op == "truediv" and not dtype.is_floating:
            dtype = float32
        if dtype == int1 and op in _INT1_PROMOTED:
            dtype = int32       # C's integer promotion: True + True is 2 and True << 1 is 2, not a wrapped 0
        if op in ("and", "or", "xor", "lshift", "rshift") and not dtype.is_integer:
            raise CompilationError(f"bitwise `{op}` needs integer operands, got {ea} and {eb}")
        if op == "floordiv" and dtype.is_floating:
            return self._float_floor_divide(a, b, dtype)
        a, b = self.broadcast_pair(self.cast(a, dtype), self.cast(b, dtype))
        code = _BINARY[op]
        result_type = with_element(a.type, int1) if op in ("eq", "ne", "lt", "le", "gt", "ge") else a.type
        return self.builder.value(code, [a, b], result_type)

    def _float_floor_divide(self, a: Value, b: Value, dtype: DType) -> Value:
        """a // b for floats as Python and torch.floor_divide compute it: the floor of the exact quotient,
        which floor(a / b) misses where a / b rounds up to an integer (1.0 // 0.1 is 9.0, a / b 10.0).
        The exact quotient's floor from the remainder (CPython's float floor division; torch's
        div_floor_floating): div = (a - fmod(a, b)) / b, less 1 where the remainder's sign is not b's,
        rounded to the nearest integer; a zero result takes the sign of a / b; b == 0 gives a / b (inf or
        NaN). 16-bit floats are computed in float32 and rounded once."""
        compute = float32 if dtype.bits == 16 else dtype
        # to the promoted type first (an int block divided by a float16 one is rounded to float16), then wider
        a, b = (self.cast(self.cast(v, dtype), compute) for v in (a, b))
        a, b = self.broadcast_pair(a, b)
        mod = self.binary("mod", a, b)
        div = self.binary("truediv", self.binary("sub", a, mod), b)
        other_sign = self.binary("xor", self.binary("lt", b, 0.0), self.binary("lt", mod, 0.0))
        div = self.where(self.binary("and", self.binary("ne", mod, 0.0), other_sign), self.binary("sub", div, 1.0), div)
        floor = self.unary("floor", div)
        floor = self.where(self.binary("gt", self.binary("sub", div, floor), 0.5), self.binary("add", floor, 1.0), floor)
        quotient = self.binary("truediv", a, b)
        result = self.where(self.binary("eq", div, 0.0), self.binary("mul", quotient, 0.0), floor)
        return self.cast(self.where(self.binary("eq", b, 0.0), quotient, result), dtype)

    def _pointer_binary(self, op, a, b):
        ea, eb = element_of(a), element_of(b)
        if op in ("add", "sub") and isinstance(ea, PointerType) and isinstance(eb, DType) and eb.is_integer:
            if op == "sub":
                # negated in a signed type wide enough for -b: an unsigned b negated in its own type would
                # be 2**bits - b, zero-extended into the address
                if not eb.is_bool and (not eb.is_signed or eb.itemsize < 4):
                    b = self.cast(b, int64 if not eb.is_signed and eb.itemsize >= 4 else int32)
                b = self.unary("neg", b)
            return self.add_pointer(a, b)
        if op == "add" and isinstance(eb, PointerType) and isinstance(ea, DType) and ea.is_integer:
            return self.add_pointer(b, a)
        if op in ("eq", "ne", "lt", "le", "gt", "ge") and ea == eb:
            a, b = self.broadcast_pair(a, b)
            return self.builder.value(_BINARY[op], [a, b], with_element(a.type, int1))
        offset = eb if isinstance(ea, PointerType) else ea if op == "add" and isinstance(eb, PointerType) else None
        if op in ("add", "sub") and isinstance(offset, DType):      # a pointer and a float (or bool) offset
            raise CompilationError(f"pointer offsets must be integers, got {offset}")
        hint = ""
        if isinstance(ea, PointerType) != isinstance(eb, PointerType):
            hint = (" (a torch.Tensor argument, a 0-d one included, is a pointer to its data: pass a Python "
                    "number where the kernel means a scalar)")
        raise CompilationError(f"`{op}` is not defined for {ea} and {eb}; pointers support + and - "
                               f"with integer offsets, and comparisons{hint}")

    def add_pointer(self, ptr: Value, offset) -> Value:
        offset = self.to_value(offset, int32)
        if not element_of(offset).is_integer or element_of(offset).is_bool:
            raise CompilationError(f"pointer offsets must be integers, got {element_of(offset)}")
        ptr, offset = self.broadcast_pair(ptr, offset)
        return self.builder.value(OpCode.ADDPTR, [ptr, offset], ptr.type)

    def unary(self, op: str, x, ftz=False) -> Value:
        """`op(x)` for neg, invert, not, abs, and the math functions (exp, exp2, log, log2, sqrt,
        rsqrt, sin, cos, erf, tanh, floor, ceil). Math on integers is done in float32; on float16 and
        bfloat16 it is done in float32 and rounded back. `ftz` (exp, exp2: a constexpr bool): float32
        subnormal results flushed to zero (the op's `ftz` attr; dsl.exp2's docstring)."""
        ftz = compile_time_bool(ftz, f"{op}: ftz")
        x = self.to_value(x)
        element = element_of(x)
        if isinstance(element, PointerType):
            raise CompilationError(f"`{op}` is not defined for pointers")
        if op == "pos":
            return x
        if op == "neg":
            if element.is_bool:
                raise CompilationError("cannot negate an int1 value; use `not` or `~`")
            return self.builder.value(OpCode.NEG, [x], x.type)
        if op == "invert":
            if element.is_floating:
                raise CompilationError(f"`~` needs an integer operand, got {element}")
            return self.builder.value(OpCode.INVERT, [x], x.type)
        if op == "not":
            return self.binary("eq", x, 0) if not element.is_bool else self.builder.value(OpCode.INVERT, [x], x.type)
        if op == "abs":
            if element.is_bool or element.kind == "uint":
                return x
            return self.builder.value(OpCode.ABS, [x], x.type)
        if op not in _MATH:
            raise CompilationError(f"unknown operation `{op}`")
        if not element.is_floating:
            x = self.cast(x, float32)
        elif element.bits == 16:
            return self.cast(self.unary(op, self.cast(x, float32), ftz), element)
        if ftz and element_of(x) == float32:
            return self.builder.value(_MATH[op], [x], x.type, ftz=True)
        return self.builder.value(_MATH[op], [x], x.type)

    def sigmoid(self, x) -> Value:
        """1 / (1 + exp(-x)), computed in float32 for 16-bit and integer inputs. In float32 the division is the
        approximate reciprocal (the DIV op's `approx` attr: rcp.approx.f32, within 1 ulp; exp is approximate
        already): an IEEE division is a subroutine per element, whose calls made matmul epilogues of 128
        values a thread spill 168-328 bytes (ptxas, sm_90a)."""
        x = self.to_value(x)
        element = element_of(x)
        wide = self.cast(x, float32) if not element.is_floating or element.bits == 16 else x
        one, denominator = self._pair(1.0, self.binary("add", 1.0, self.unary("exp", self.unary("neg", wide))))
        one, denominator = self.broadcast_pair(one, denominator)
        approx = {"approx": True} if element_of(denominator) == float32 else {}
        result = self.builder.value(OpCode.DIV, [one, denominator], denominator.type, **approx)
        return self.cast(result, element) if element.is_floating else result

    def fma(self, a, b, c) -> Value:
        """a * b + c with one rounding, in the promoted float type (a float literal takes the type of the
        other operands, as in `a * b + 1.0`)."""
        runtime = [v for v in (a, b, c) if not is_literal(v)]
        if runtime:
            like = [element_of(self.to_value(v)) for v in runtime]
            if any(isinstance(e, PointerType) for e in like):
                raise CompilationError(f"fma needs floating operands, got {', '.join(map(str, like))}")
            common = like[0]
            for other in like[1:]:
                common = promotion.promote(common, other)
            a, b, c = (self.to_value(v, common) if is_literal(v) else v for v in (a, b, c))
        a, b, c = self.to_value(a), self.to_value(b), self.to_value(c)
        dtype = promotion.promote(promotion.promote(element_of(a), element_of(b)), element_of(c))
        if not dtype.is_floating:
            raise CompilationError(f"fma needs floating operands, got {dtype}")
        shape = self._broadcast_shape(self._broadcast_shape(shape_of(a.type), shape_of(b.type)), shape_of(c.type))
        a, b, c = (self.broadcast_to(self.cast(v, dtype), shape) for v in (a, b, c))
        return self.builder.value(OpCode.FMA, [a, b, c], a.type)

    def where(self, condition, a, b) -> Value:
        """Elementwise `a if condition else b`; condition is converted to int1 (!= 0)."""
        condition = self.to_condition(condition, allow_block=True)
        a, b = self._pair(a, b)
        if element_of(a) != element_of(b):
            if isinstance(element_of(a), PointerType) or isinstance(element_of(b), PointerType):
                raise CompilationError(f"where: a pointer can only be chosen against a pointer of the same type; "
                                       f"got {element_of(a)} and {element_of(b)}")
            dtype = promotion.promote(element_of(a), element_of(b))
            a, b = self.cast(a, dtype), self.cast(b, dtype)
        shape = self._broadcast_shape(shape_of(condition.type), self._broadcast_shape(shape_of(a.type), shape_of(b.type)))
        condition, a, b = (self.broadcast_to(v, shape) for v in (condition, a, b))
        return self.builder.value(OpCode.WHERE, [condition, a, b], a.type)

    def to_condition(self, x, allow_block: bool = False) -> Value:
        """`x` as int1 (`x != 0` unless it already is int1)."""
        x = self.to_value(x)
        if isinstance(x.type, BlockType) and not allow_block:
            raise CompilationError("a block cannot be used as a condition; use dsl.where for elementwise "
                                   "choices, or reduce it (dsl.max / dsl.sum) to a scalar first")
        if element_of(x) == int1:
            return x
        if isinstance(element_of(x), PointerType):
            raise CompilationError("a pointer cannot be used as a condition")
        return self.binary("ne", x, 0)

    def logical(self, op: str, a, b) -> Value:
        """`a and b` / `a or b` on scalars or int1 blocks (both sides are evaluated)."""
        a, b = self.to_condition(a, allow_block=True), self.to_condition(b, allow_block=True)
        return self.binary(op, a, b)
