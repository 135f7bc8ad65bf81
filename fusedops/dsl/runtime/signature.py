"""Specialization: what a launch's arguments tell the compiler, as a hashable key.

Per parameter an `ArgSpec` records either a runtime type (a tensor becomes a pointer to its dtype;
a Python int int32, int64 or uint64 by its value; a float float32, a numpy.float64 float64; a bool
int1) or a compile-time value (a `dsl.constexpr` parameter, a `None` argument, a
`dsl.constexpr(...)`-wrapped value). Ints
equal to 1 become the IR constant 1 and leave the runtime signature; ints divisible by 16 (or else by
8: rows of 8 16-bit elements keep 16-byte vectors and masks) and 16-byte aligned pointers are recorded
as hints (`Function.arg_hints`). `SpecializationKey` adds the
launch options and the target, and keys the JITFunction's cache of compiled kernels.
"""

from __future__ import annotations

import dataclasses
import functools
import struct
from typing import Any, Optional

import numpy as np

from ..language import core, dtypes
from ..language.dtypes import DType, PointerType

NO_DEFAULT = object()


@dataclasses.dataclass(frozen=True)
class Parameter:
    """A parameter of a `@dsl.jit` function."""

    name: str
    is_constexpr: bool = False
    default: Any = NO_DEFAULT
    do_not_specialize: bool = False     # no equal-to-1 / divisible-by-16 specialization
    annotation: Optional[DType] = None  # `n: dsl.int64`: a scalar argument of that type (`_annotated_scalar`)
    kind: str = "positional_or_keyword"     # or "positional_only" (before `/`), "keyword_only" (after `*`)

    @property
    def has_default(self) -> bool:
        return self.default is not NO_DEFAULT


def bind_parameters(params, args, kwargs, subject: str, error, listing: bool = False) -> list:
    """One value per parameter of `params` from a call's `args` and `kwargs`, by Python's rules (keyword-only
    parameters take no positional argument, positional-only ones no keyword); defaults fill the rest. Raises
    `error` (TypeError for a launch, CompilationError for a call inside a kernel) whose message starts with
    `subject`; `listing` adds the parameter names to an unknown keyword's message."""
    positional = [p for p in params if p.kind != "keyword_only"]
    if len(args) > len(positional):
        names = f" ({', '.join(p.name for p in positional)})" if listing else ""
        what = "positional arguments" if len(positional) < len(params) else "arguments"
        raise error(f"{subject} takes {len(positional)} {what}{names} but {len(args)} were given")
    values = list(args) + [_UNBOUND] * (len(params) - len(args))
    index = {p.name: i for i, p in enumerate(params)}
    for key, value in kwargs.items():
        if key not in index:
            names = f"; its parameters are {', '.join(p.name for p in params)}" if listing else ""
            raise error(f"{subject} got an unexpected keyword argument `{key}`{names}")
        if params[index[key]].kind == "positional_only":
            raise error(f"{subject} got the positional-only argument `{key}` as a keyword")
        if values[index[key]] is not _UNBOUND:
            raise error(f"{subject} got multiple values for argument `{key}`")
        values[index[key]] = value
    for i, param in enumerate(params):
        if values[i] is _UNBOUND:
            if not param.has_default:
                raise error(f"{subject} is missing argument `{param.name}`")
            values[i] = param.default
    return values


_UNBOUND = object()


@dataclasses.dataclass(frozen=True)
class ArgSpec:
    """What the compiler knows about one argument."""

    name: str
    type: Optional[object] = None        # runtime dsl type; None for a compile-time value
    value: Any = dataclasses.field(default=None, compare=False)   # the compile-time value (type None)
    value_class: Optional[type] = None   # type(value): keeps True, 1 and 1.0 apart in the key
    # What keys `value`: the value itself, or for a float its 8 bytes, which keep -0.0 and 0.0 (and
    # -NaN and NaN) apart, as 1 / C differs, and make a NaN equal to itself.
    value_key: Any = None
    equal_to_one: bool = False           # an int equal to 1: the IR constant 1, not a runtime argument
    divisible_by_16: bool = False        # an int divisible by 16, or a 16-byte aligned pointer
    divisible_by_8: bool = False         # an int divisible by 8 but not by 16
    positive: bool = False               # an int divisible by 8 and above 0 (a TMA stride must be)

    @property
    def divisibility(self) -> int:
        """The power of two the compiler may assume divides the argument (1: nothing known)."""
        return 16 if self.divisible_by_16 else 8 if self.divisible_by_8 else 1

    @property
    def is_runtime(self) -> bool:
        return self.type is not None and not self.equal_to_one


@dataclasses.dataclass(frozen=True)
class SpecializationKey:
    args: tuple                 # ArgSpec per parameter
    num_warps: int
    num_stages: int
    arch: Optional[str]         # "sm_90a", ...; None in the interpreter


@functools.lru_cache(maxsize=None)
def _tensor_dtype(torch_dtype) -> DType:
    return dtypes.from_torch(torch_dtype)


def int_type(value: int) -> DType:
    """int32, int64 or uint64: the narrowest that holds `value`."""
    if -2**31 <= value < 2**31:
        return dtypes.int32
    if -2**63 <= value < 2**63:
        return dtypes.int64
    if 0 <= value < 2**64:
        return dtypes.uint64
    raise OverflowError(f"{value} does not fit in 64 bits")


def _constexpr_spec(kernel: str, param: Parameter, value) -> ArgSpec:
    if isinstance(value, list):
        value = tuple(value)
    try:
        key = _constexpr_key(value)
        hash(value), hash(key)      # (the key of a dataclass holds every field, those its hash skips too)
    except TypeError:
        raise TypeError(f"argument `{param.name}` of kernel `{kernel}` is a dsl.constexpr and must be a hashable "
                        f"Python value (int, float, bool, str, None, dtype, tuple); got {type(value).__name__}") from None
    if type(value).__module__.startswith(("torch", "numpy")) and not isinstance(value, (DType, PointerType)):
        raise TypeError(f"argument `{param.name}` of kernel `{kernel}` is a dsl.constexpr and must be a Python "
                        f"value, got a {type(value).__module__}.{type(value).__name__}")
    return ArgSpec(param.name, None, value, type(value), value_key=key)


def _constexpr_key(value):
    """What tells two constexpr values apart: a float's 8 bytes (0.0 and -0.0 differ), a tuple's (a
    namedtuple's too) items' keys with their types (so (1,), (True,) and (1.0,) differ, as 1, True and 1.0 do
    by value_class), and likewise a dataclass instance's fields (a config object read as `CFG.scale`:
    Cfg(0.0) == Cfg(-0.0) and Cfg(2**30) == Cfg(2.0**30), but a kernel reading the field compiles other code),
    every field, also those its __eq__ skips (compare=False), which a kernel may read too. Any other value:
    itself (its class keys it apart from equal values of other classes)."""
    if type(value) is float:
        return struct.pack("<d", value)
    if isinstance(value, tuple):
        return (type(value),) + tuple((type(item), _constexpr_key(item)) for item in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, (type, DType, PointerType)):
        return (type(value),) + tuple((field.name, type(item), _constexpr_key(item))
                                      for field in dataclasses.fields(value) for item in (getattr(value, field.name),))
    return value


def _annotated_scalar(kernel: str, param: Parameter, value) -> ArgSpec:
    """The ArgSpec of a scalar argument whose parameter is annotated with a dsl dtype (`n: dsl.int64`): that
    type, whatever the value's own (an int annotated int64 stays int64 below 2**31; a float annotated float64
    keeps its 53 bits). Integer types take Python ints (and bools) within their range, float types ints and
    floats, int1 bools (or 0 / 1). Ints keep the equal-to-1 / divisibility specializations.

    Raises:
        TypeError: naming the argument, for a tensor or another value the annotated type does not hold.
    """
    dtype = param.annotation
    where = f"argument `{param.name}` of kernel `{kernel}` is annotated {dtype.name}"
    if isinstance(value, np.generic) and not isinstance(value, np.ndarray):
        value = value.item()
    if not isinstance(value, (bool, int, float)):
        raise TypeError(f"{where} (a scalar); pass a Python number, got {type(value).__module__}."
                        f"{type(value).__qualname__}")
    if dtype.is_floating:
        return ArgSpec(param.name, dtype)
    if isinstance(value, float) or (dtype.is_bool and value not in (0, 1)):
        raise TypeError(f"{where}; got {value!r}, which is not {'a bool' if dtype.is_bool else 'an int'}")
    if dtype.is_bool:
        return ArgSpec(param.name, dtype)
    low, high = integer_range(dtype)
    if not low <= value <= high:
        raise TypeError(f"{where}; got {value}, outside its range [{low}, {high}]")
    return _int_spec(param, dtype, value)


def integer_range(dtype: DType) -> tuple:
    """(low, high), both included: the values of integer type `dtype` (int1: 0 and 1)."""
    if dtype.is_bool:
        return 0, 1
    if dtype.is_signed:
        return -(1 << (dtype.bits - 1)), (1 << (dtype.bits - 1)) - 1
    return 0, (1 << dtype.bits) - 1


def _int_spec(param: Parameter, type_: DType, value: int) -> ArgSpec:
    """The ArgSpec of int `value` as a runtime argument of `type_`: whether it equals 1, is divisible by 16 or
    else by 8 and then positive (unless the parameter is in do_not_specialize)."""
    special = not param.do_not_specialize
    return ArgSpec(param.name, type_, equal_to_one=special and value == 1, divisible_by_16=special and value % 16 == 0,
                   divisible_by_8=special and value % 16 == 8, positive=special and value % 8 == 0 and value > 0)


def _address(kernel: str, name: str, value) -> int:
    """The data pointer of tensor argument `name`. Raises TypeError naming it for a tensor without memory a
    kernel could read: one of torch.func's transforms (vmap, grad: no storage, pytorch#105301), a wrapper
    subclass without data (address 0 with elements, pytorch#121412) or a tensor whose storage was freed
    (`untyped_storage().resize_(0)`)."""
    try:
        address = value.data_ptr()
        # (meta tensors are refused where they run; a freed storage's views have addresses past 0)
        readable = value.numel() == 0 or value.is_meta or value.untyped_storage().data_ptr() != 0
    except RuntimeError:
        readable = False
    if not readable:
        raise TypeError(f"argument `{name}` of kernel `{kernel}` is a tensor without memory a kernel can read (a "
                        f"tensor of torch.func's vmap / grad, or a wrapper subclass): pass a plain tensor")
    return address


def specialize(kernel: str, params: tuple, values: list, *, allow_types: bool = False) -> tuple:
    """One `ArgSpec` per parameter for the bound argument `values`.

    allow_types: also accept dsl types (`dsl.int32`, `dsl.pointer_type(dsl.float16)`) standing for
    an argument of that type (ahead-of-time compilation).

    Raises:
        TypeError: naming the argument, for a value that is neither a tensor, a Python scalar, None,
            nor a constexpr; a constexpr parameter given a non-Python value; an unsupported dtype.
    """
    import torch

    specs = []
    for param, value in zip(params, values):
        if param.annotation is not None and not param.is_constexpr and value is not None \
                and not isinstance(value, core.constexpr) and not (allow_types and isinstance(value, (DType, PointerType))):
            specs.append(_annotated_scalar(kernel, param, value))
        elif isinstance(value, core.constexpr):
            specs.append(_constexpr_spec(kernel, param, value.value))
        elif param.is_constexpr:
            specs.append(_constexpr_spec(kernel, param, value))
        elif value is None:
            specs.append(ArgSpec(param.name, None, None, type(None)))
        elif isinstance(value, torch.Tensor):
            try:
                element = _tensor_dtype(value.dtype)
            except TypeError as e:
                raise TypeError(f"argument `{param.name}` of kernel `{kernel}`: {e}") from None
            if value.layout != torch.strided:
                raise TypeError(f"argument `{param.name}` of kernel `{kernel}` must be a dense (strided) tensor, "
                                f"got a {value.layout} one (e.g. .to_dense() it)")
            if value.is_neg():
                raise TypeError(f"argument `{param.name}` of kernel `{kernel}` has its negative bit set (a lazily "
                                f"negated view, e.g. z.conj().imag), which a kernel would read un-negated: pass "
                                f"`.resolve_neg()` of it")
            address = _address(kernel, param.name, value)
            aligned = not param.do_not_specialize and address % 16 == 0
            specs.append(ArgSpec(param.name, PointerType(element), divisible_by_16=aligned))
        elif isinstance(value, bool):
            specs.append(ArgSpec(param.name, dtypes.int1))
        elif isinstance(value, int):
            try:
                type_ = int_type(value)
            except OverflowError as e:
                raise TypeError(f"argument `{param.name}` of kernel `{kernel}`: {e}") from None
            specs.append(_int_spec(param, type_, value))
        elif type(value) is np.float64:       # a float64 scalar asked for by its type (a float subclass)
            specs.append(ArgSpec(param.name, dtypes.float64))
        elif isinstance(value, float):
            specs.append(ArgSpec(param.name, dtypes.float32))
        elif allow_types and isinstance(value, (DType, PointerType)):
            if param.annotation is not None and value != param.annotation:
                raise TypeError(f"argument `{param.name}` of kernel `{kernel}` is annotated {param.annotation.name}; "
                                f"got the type {value}")
            specs.append(ArgSpec(param.name, value))
        else:
            expected = "a torch.Tensor, a Python int, float or bool, or None"
            if allow_types:
                expected += ", or a dsl type such as dsl.pointer_type(dsl.float16)"
            raise TypeError(f"argument `{param.name}` of kernel `{kernel}` must be {expected}; "
                            f"got {type(value).__module__}.{type(value).__qualname__}")
    return tuple(specs)
