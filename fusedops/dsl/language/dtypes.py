"""Types of the kernel language: scalar dtypes, pointers and blocks.

Types are interned objects compared by identity or equality, never strings. A value in a kernel has
either a scalar type (a `DType` or a `PointerType`) or a `BlockType`: a power-of-two shaped block of a
scalar type.
"""

from __future__ import annotations

import dataclasses
from typing import Union

import numpy as np


@dataclasses.dataclass(frozen=True)
class DType:
    """A scalar numeric type.

    kind is one of "int" (signed), "uint", "float", "bool" (the 1-bit `int1`).
    """

    name: str
    kind: str
    bits: int

    def __repr__(self) -> str:
        return f"dsl.{self.name}"

    def __str__(self) -> str:
        return self.name

    # -- classification ---------------------------------------------------------------------------
    @property
    def is_floating(self) -> bool:
        return self.kind == "float"

    @property
    def is_integer(self) -> bool:
        """True for signed/unsigned integers and int1."""
        return self.kind in ("int", "uint", "bool")

    @property
    def is_signed(self) -> bool:
        return self.kind == "int"

    @property
    def is_bool(self) -> bool:
        return self.kind == "bool"

    @property
    def itemsize(self) -> int:
        """Bytes per element in memory (int1 is stored as one byte)."""
        return max(1, self.bits // 8)

    @property
    def numpy_dtype(self) -> np.dtype:
        """The NumPy dtype the interpreter computes this type in (bfloat16 is held in float32)."""
        return _NUMPY[self.name]

    @property
    def scalar(self) -> "DType":
        return self

    # -- Triton's tl.dtype attributes (the queries it calls are `triton_query`) -----------------------
    @property
    def primitive_bitwidth(self) -> int:
        """Bits of the type (1 for int1), Triton's `dtype.primitive_bitwidth`."""
        return self.bits

    @property
    def int_bitwidth(self) -> int:
        """Bits of an integer type, Triton's `dtype.int_bitwidth`; AttributeError for floats."""
        if not self.is_integer:
            raise AttributeError(f"int_bitwidth of the float type {self.name}")
        return self.bits

    @property
    def fp_mantissa_width(self) -> int:
        """Stored significand bits of a float type, Triton's `dtype.fp_mantissa_width`; AttributeError for ints."""
        if not self.is_floating:
            raise AttributeError(f"fp_mantissa_width of the integer type {self.name}")
        return {"float16": 10, "bfloat16": 7, "float32": 23, "float64": 52}[self.name]


@dataclasses.dataclass(frozen=True)
class PointerType:
    """A pointer to elements of `element` in `address_space` (1 = global)."""

    element: DType
    address_space: int = 1

    def __repr__(self) -> str:
        return f"dsl.pointer_type({self.element!r})"

    def __str__(self) -> str:
        return f"ptr<{self.element}>"

    is_floating = False
    is_integer = False
    is_bool = False

    @property
    def scalar(self) -> "PointerType":
        return self

    @property
    def element_ty(self) -> DType:
        """`element`, by the name Triton kernels use (`x_ptr.dtype.element_ty`)."""
        return self.element

    @property
    def itemsize(self) -> int:
        return 8

    @property
    def primitive_bitwidth(self) -> int:
        """64 (an address), Triton's `dtype.primitive_bitwidth` of a pointer."""
        return 64


ScalarType = Union[DType, PointerType]


def _int_limit(type_, highest: bool) -> int:
    if not isinstance(type_, DType) or not type_.is_integer:
        raise TypeError(f"get_int_{'max' if highest else 'min'}_value() of {type_}, which is not an integer type")
    if type_.is_signed:
        return (1 << (type_.bits - 1)) - 1 if highest else -(1 << (type_.bits - 1))
    return (1 << type_.bits) - 1 if highest else 0


def _triton_queries() -> dict:
    scalar = lambda test: lambda t: isinstance(t, DType) and test(t)          # noqa: E731
    named = lambda name: scalar(lambda t: t.name == name)                      # noqa: E731
    queries = {f"is_{short}": named(name) for short, name in (
        ("fp16", "float16"), ("bf16", "bfloat16"), ("fp32", "float32"), ("fp64", "float64"), ("int1", "int1"),
        ("int8", "int8"), ("int16", "int16"), ("int32", "int32"), ("int64", "int64"), ("uint8", "uint8"),
        ("uint16", "uint16"), ("uint32", "uint32"), ("uint64", "uint64"))}
    queries.update({name: lambda t: False for name in (     # no fp8 types, no block or void dtypes
        "is_fp8", "is_fp8e4nv", "is_fp8e4b8", "is_fp8e4b15", "is_fp8e5", "is_fp8e5b16", "is_block", "is_void")})
    queries.update({
        "is_floating": scalar(lambda t: t.is_floating), "is_standard_floating": scalar(lambda t: t.is_floating),
        "is_int": scalar(lambda t: t.is_integer), "is_int_signed": scalar(lambda t: t.is_signed),
        # (Triton counts int1 with the unsigned types)
        "is_int_unsigned": scalar(lambda t: t.kind in ("uint", "bool")), "is_bool": scalar(lambda t: t.is_bool),
        "is_ptr": lambda t: isinstance(t, PointerType),
        "get_int_max_value": lambda t: _int_limit(t, True), "get_int_min_value": lambda t: _int_limit(t, False),
    })
    return queries


TRITON_QUERIES = _triton_queries()


def triton_query(type_, name: str):
    """The answer of Triton's `tl.dtype` method `name` called on `type_` (a DType or PointerType), as a ported kernel
    calls it at compile time (`x_ptr.dtype.element_ty.is_floating()`, `x.dtype.is_fp16()`, `dt.get_int_max_value()`):
    a bool (an int for the get_int_* ones). `is_floating` / `is_bool` are also properties of DType, read without a
    call. Raises KeyError for a name that is not one of Triton's queries, TypeError for get_int_* of a non-integer."""
    return TRITON_QUERIES[name](type_)


@dataclasses.dataclass(frozen=True)
class BlockType:
    """A block of `element` values with power-of-two `shape`."""

    shape: tuple
    element: ScalarType

    def __post_init__(self):
        for dim in self.shape:
            if not isinstance(dim, int) or dim < 1 or dim & (dim - 1):
                raise ValueError(f"block dimensions must be powers of two, got shape {self.shape}")

    def __str__(self) -> str:
        return f"<{'x'.join(map(str, self.shape))}x{self.element}>"

    @property
    def scalar(self) -> ScalarType:
        return self.element

    @property
    def numel(self) -> int:
        n = 1
        for dim in self.shape:
            n *= dim
        return n


Type = Union[DType, PointerType, BlockType]


def shape_of(type_: Type) -> tuple:
    """The block shape of a type, () for a scalar."""
    return type_.shape if isinstance(type_, BlockType) else ()


def with_shape(element: ScalarType, shape: tuple) -> Type:
    """`element` as a scalar if shape is (), else a block of that shape."""
    return BlockType(tuple(shape), element) if shape else element


def with_element(type_: Type, element: ScalarType) -> Type:
    """The same shape as `type_` with a different element type."""
    return with_shape(element, shape_of(type_))


int1 = DType("int1", "bool", 1)
int8 = DType("int8", "int", 8)
int16 = DType("int16", "int", 16)
int32 = DType("int32", "int", 32)
int64 = DType("int64", "int", 64)
uint8 = DType("uint8", "uint", 8)
uint16 = DType("uint16", "uint", 16)
uint32 = DType("uint32", "uint", 32)
uint64 = DType("uint64", "uint", 64)
float16 = DType("float16", "float", 16)
bfloat16 = DType("bfloat16", "float", 16)
float32 = DType("float32", "float", 32)
float64 = DType("float64", "float", 64)

ALL_DTYPES = (int1, int8, int16, int32, int64, uint8, uint16, uint32, uint64,
              float16, bfloat16, float32, float64)

_NUMPY = {
    "int1": np.dtype(np.bool_), "int8": np.dtype(np.int8), "int16": np.dtype(np.int16),
    "int32": np.dtype(np.int32), "int64": np.dtype(np.int64), "uint8": np.dtype(np.uint8),
    "uint16": np.dtype(np.uint16), "uint32": np.dtype(np.uint32), "uint64": np.dtype(np.uint64),
    "float16": np.dtype(np.float16), "bfloat16": np.dtype(np.float32),
    "float32": np.dtype(np.float32), "float64": np.dtype(np.float64),
}


def pointer_type(element: DType, address_space: int = 1) -> PointerType:
    """The type of a pointer to `element` (use in `kernel.compile` signatures)."""
    if not isinstance(element, DType):
        raise TypeError(f"pointer_type expects a dsl dtype such as dsl.float16, got {element!r}")
    return PointerType(element, address_space)


def from_torch(torch_dtype) -> DType:
    """The dsl dtype of a torch dtype; TypeError for dtypes the language does not have."""
    name = str(torch_dtype).replace("torch.", "")
    aliases = {"bool": "int1", "half": "float16", "float": "float32", "double": "float64"}
    name = aliases.get(name, name)
    for dtype in ALL_DTYPES:
        if dtype.name == name:
            return dtype
    raise TypeError(f"torch dtype {torch_dtype} has no fusedops.dsl equivalent")


def to_torch(dtype: DType):
    """The torch dtype of a dsl dtype."""
    import torch

    name = "bool" if dtype is int1 or dtype == int1 else dtype.name
    return getattr(torch, name)
