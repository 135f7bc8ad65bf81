"""Semantics of block creation and shape manipulation (a mixin of `Semantics`)."""

from __future__ import annotations

from ..errors import CompilationError
from ..ir import OpCode, Value
from .core import constexpr
from .dtypes import BlockType, DType, PointerType, int32, shape_of, with_shape
from .promotion import literal_fits, printable

_MAX_BLOCK_NUMEL = 1 << 20


def check_block_size(shape: tuple, what: str) -> None:
    """Raise CompilationError for a block `shape` of more than _MAX_BLOCK_NUMEL elements (every op that
    makes a block of a new size checks it where the user wrote it)."""
    numel = 1
    for dim in shape:
        numel *= dim
    if numel > _MAX_BLOCK_NUMEL:
        raise CompilationError(f"{what} {shown(tuple(shape))} has {printable(numel)} elements; blocks hold at most "
                               f"{_MAX_BLOCK_NUMEL}")


def compile_time_flag(value, what: str) -> bool:
    """`value` as a bool, for a flag that changes what is compiled (bitcast, hex, reverse...); Triton's ints
    (`descending=constexpr(0)`) read as their truth.

    Raises:
        CompilationError: `value` is a runtime value, whose truth the compiler cannot know, or a string, which
            would read as true whatever it says (`reverse="False"`).
    """
    if isinstance(value, (Value, str, bytes)):
        raise CompilationError(f"{what} must be a constexpr bool, got {shown(value)}")
    return bool(value)


def compile_time_bool(value, what: str) -> bool:
    """`value` (a dsl.constexpr's value unwrapped) where it must be a bool, for a flag that a truth value
    would misread (`ftz="False"` is truthy).

    Raises:
        CompilationError: `value` is a runtime value or not a bool.
    """
    if isinstance(value, constexpr):
        value = value.value
    if not isinstance(value, bool):
        raise CompilationError(f"{what} must be a constexpr bool, got {shown(value)}")
    return value


def shown(value) -> str:
    """`value` as an error message shows it: a Python value's repr; an IR value, which stands where a
    compile-time value is needed, as a runtime value of its type and how to make it a compile-time one
    (its repr is the compiler's internal `Value(...)`)."""
    if isinstance(value, Value):
        return (f"a runtime {value.type} value (it must be known at compile time: a dsl.constexpr parameter "
                "or a Python constant)")
    if holds_runtime(value):
        return "(" + ", ".join(shown(item) for item in value) + ")"
    return printable(value)


def described(value) -> str:
    """`value` as an error about where it stands shows it: a tuple that holds runtime values by its length (the
    repr of an IR value is the compiler's internal `Value(...)`), a runtime value by its type, a compile-time
    one as `shown` gives it."""
    if holds_runtime(value):
        return f"a {type(value).__name__} of {len(value)} items"
    if isinstance(value, Value):
        return f"a {value.type} value"
    return shown(value)


def holds_runtime(value) -> bool:
    """Whether `value` is a tuple or list with an IR value among its items (or theirs)."""
    return isinstance(value, (tuple, list)) and any(isinstance(item, Value) or holds_runtime(item) for item in value)


def _check_shape(shape, what: str) -> tuple:
    if isinstance(shape, int):
        shape = (shape,)
    if not isinstance(shape, (tuple, list)):
        raise CompilationError(f"{what} must be a tuple of constexpr ints, got {shown(shape)}")
    shape = tuple(shape)
    for dim in shape:
        if isinstance(dim, Value):
            raise CompilationError(f"{what} must be known at compile time (constexpr), got a runtime value")
        if not isinstance(dim, int) or isinstance(dim, bool) or dim < 1 or dim & (dim - 1):
            raise CompilationError(f"{what} must be powers of two (ints), got {shown(shape)}")
    check_block_size(shape, what)
    return shape


def _is_int(value) -> bool:
    """A Python int that is not a bool (an axis, a dim, a hint value)."""
    return isinstance(value, int) and not isinstance(value, bool)


class ShapeOps:
    def program_id(self, axis) -> Value:
        if not _is_int(axis) or axis not in (0, 1, 2):
            raise CompilationError(f"program_id axis must be 0, 1 or 2, got {shown(axis)}")
        return self.builder.value(OpCode.PROGRAM_ID, [], int32, axis=axis)

    def num_programs(self, axis) -> Value:
        if not _is_int(axis) or axis not in (0, 1, 2):
            raise CompilationError(f"num_programs axis must be 0, 1 or 2, got {shown(axis)}")
        return self.builder.value(OpCode.NUM_PROGRAMS, [], int32, axis=axis)

    def arange(self, start, end) -> Value:
        """int32 block [start, start + 1, ..., end - 1]; end - start a power of two, both constexpr."""
        if not isinstance(start, int) or not isinstance(end, int) or isinstance(start, bool):
            raise CompilationError(f"arange bounds must be constexpr ints, got {shown(start)}, {shown(end)}")
        size = end - start
        if size < 1 or size & (size - 1):
            raise CompilationError(f"arange(start, end) needs end - start to be a power of two, got {size}")
        if not (-2**31 <= start and end <= 2**31):
            raise CompilationError("arange bounds must fit in int32")
        check_block_size((size,), "arange block")
        return self.builder.value(OpCode.ARANGE, [], BlockType((size,), int32), start=start, end=end)

    def full(self, shape, value, dtype) -> Value:
        """A block of `shape` filled with `value`, of element type `dtype`."""
        shape = _check_shape(shape, "shape")
        if not isinstance(dtype, DType):
            raise CompilationError(f"dtype must be a dsl dtype such as dsl.float32, got {shown(dtype)}")
        if isinstance(value, Value):
            if isinstance(value.type, BlockType):
                raise CompilationError("full() takes a scalar value")
            return self.broadcast_to(self.cast(value, dtype), shape)
        if not isinstance(value, (bool, int, float)):
            raise CompilationError(f"full: value must be a number or a scalar, got {shown(value)}")
        if (isinstance(value, float) and not dtype.is_floating) or not literal_fits(value, dtype):
            # converted as `.to()` converts a literal: a float to an integer type from its exact value (toward
            # zero, saturating, NaN to 0), not by wrapping its integer part nor rounded to float32 first; an int
            # the type cannot hold wraps to its width (C), and one past 64 bits is an error, as everywhere else
            return self.broadcast_to(self.cast(value, dtype), shape)
        return self.constant(value, dtype, shape)

    def splat(self, x: Value, shape: tuple) -> Value:
        return self.builder.value(OpCode.SPLAT, [x], BlockType(tuple(shape), x.type))

    def broadcast_to(self, x, shape) -> Value:
        """`x` stretched to `shape` (NumPy rules; an int is a 1-D shape); scalars are splatted."""
        x = self.to_value(x)
        if isinstance(shape, int) and not isinstance(shape, bool):
            shape = (shape,)
        if not isinstance(shape, (tuple, list)):
            raise CompilationError(f"broadcast_to: shape must be a tuple of constexpr ints, got {shown(shape)}")
        shape = tuple(shape)
        current = shape_of(x.type)
        if current == shape:
            return x
        if not shape:
            raise CompilationError(f"cannot broadcast a block of shape {current} to a scalar")
        shape = _check_shape(shape, "broadcast_to: shape")
        if not current:
            if x.defining_op is not None and x.defining_op.opcode == OpCode.CONSTANT:
                return self.constant(x.defining_op.attrs["value"], x.type, shape)
            return self.splat(x, shape)
        if len(current) > len(shape):
            raise CompilationError(f"cannot broadcast shape {current} to {shape}")
        while len(current) < len(shape):
            x = self.expand_dims(x, 0)
            current = shape_of(x.type)
        for have, want in zip(current, shape):
            if have != want and have != 1:
                raise CompilationError(f"cannot broadcast shape {current} to {shape}")
        return self.builder.value(OpCode.BROADCAST, [x], BlockType(shape, x.type.element))

    def expand_dims(self, x, axis) -> Value:
        """`x` with a new size-1 dim at `axis`, or at each of a tuple / list of axes (as Triton takes them:
        each counted in the result's dims, negative from its end; no axis twice)."""
        x = self.to_value(x)
        shape = shape_of(x.type)
        if isinstance(axis, (tuple, list)):
            rank = len(shape) + len(axis)
            if not all(_is_int(a) and -rank <= a < rank for a in axis):
                raise CompilationError(f"expand_dims axes must be constexpr ints in range for a result of {rank} "
                                       f"dims (the block has shape {shape}), got {shown(axis)}")
            axes = sorted(a % rank for a in axis)
            if len(set(axes)) != len(axes):
                raise CompilationError(f"expand_dims got the same axis twice: {shown(axis)}")
            for a in axes:
                x = self.expand_dims(x, a)
            return x
        if not isinstance(axis, int) or not -len(shape) - 1 <= axis <= len(shape):
            raise CompilationError(f"expand_dims axis must be a constexpr int in range for shape {shape}, got {shown(axis)}")
        if axis < 0:
            axis += len(shape) + 1
        new_shape = shape[:axis] + (1,) + shape[axis:]
        return self.builder.value(OpCode.EXPAND_DIMS, [x], with_shape(x.type.scalar, new_shape), axis=axis)

    def reshape(self, x, shape) -> Value:
        """Row-major reshape to `shape` (same number of elements)."""
        x = self.to_value(x)
        shape = _check_shape(shape, "reshape shape")
        old = shape_of(x.type)
        old_numel = 1
        for dim in old:
            old_numel *= dim
        new_numel = 1
        for dim in shape:
            new_numel *= dim
        if old_numel != new_numel:
            raise CompilationError(f"cannot reshape a block of shape {old} into {shape}")
        if not old:
            return self.broadcast_to(x, shape)
        if not shape:       # a one-element block to a scalar: its only element (a max over one is exact)
            if isinstance(x.type.element, PointerType):
                raise CompilationError(f"cannot reshape a block of pointers of shape {old} into a scalar: "
                                       "compute the scalar pointer from scalar offsets instead")
            return self.reduce(x, None, "max")
        if shape == old:
            return x
        return self.builder.value(OpCode.RESHAPE, [x], BlockType(shape, x.type.element))

    def trans(self, x, *dims) -> Value:
        """Permute dims; with no dims, reverse them (a 2-D transpose)."""
        x = self.to_value(x)
        shape = shape_of(x.type)
        if len(dims) == 1 and isinstance(dims[0], (tuple, list)):
            dims = tuple(dims[0])
        perm = tuple(dims) if dims else tuple(reversed(range(len(shape))))
        if not all(_is_int(d) for d in perm) or sorted(perm) != list(range(len(shape))):
            raise CompilationError(f"trans dims {shown(perm)} are not a permutation of the {len(shape)} dims "
                                   "(constexpr ints)")
        if perm == tuple(range(len(shape))):
            return x
        new_shape = tuple(shape[p] for p in perm)
        return self.builder.value(OpCode.TRANS, [x], BlockType(new_shape, x.type.element), perm=perm)

    def subscript(self, x, index) -> Value:
        """`x[...]` with `None` (new axis) and full slices `:` only."""
        x = self.to_value(x)
        if not isinstance(index, tuple):
            index = (index,)
        axis = 0
        for item in index:
            if item is None:
                x = self.expand_dims(x, axis)
                axis += 1
            elif isinstance(item, slice) and item == slice(None, None, None):
                axis += 1
            else:
                raise CompilationError("blocks can only be indexed with None (new axis) and `:`; "
                                       "use masks and pointer arithmetic to select elements")
        if axis > len(shape_of(x.type)):
            raise CompilationError(f"too many indices for a block of shape {shape_of(x.type)}")
        return x

    def _hint(self, code: OpCode, x, values) -> Value:
        x = self.to_value(x)
        if not isinstance(values, (tuple, list)):
            values = (values,)
        values = tuple(values)
        rank = max(1, len(shape_of(x.type)))
        if len(values) != rank or not all(_is_int(v) and v >= 1 for v in values):
            raise CompilationError(f"{code.value} needs {rank} positive constexpr ints, got {shown(values)}")
        return self.builder.value(code, [x], x.type, values=values)

    def multiple_of(self, x, values) -> Value:
        return self._hint(OpCode.MULTIPLE_OF, x, values)

    def max_contiguous(self, x, values) -> Value:
        return self._hint(OpCode.MAX_CONTIGUOUS, x, values)
