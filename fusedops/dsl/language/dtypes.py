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


ScalarType = Union[DType, PointerType]


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
