"""Kernel-argument packing for `cuLaunchKernel`, planned once per signature.

`cuLaunchKernel` takes `kernelParams`: an array of N `void*`, the i-th pointing at the bytes of
argument i (the driver reads each argument's size from the kernel image). The cheapest form
cuda-python accepts is that array's address as a plain int (TOOLCHAIN.md: 4.1 us per launch on the
H200 against 5.7 us for `(values, ctypes)` tuples). An `ArgumentPacker` lays out, once, a buffer
holding the pointer array followed by the argument values, each naturally aligned; a launch then
costs one `struct.pack_into` of the values.

Thread safety: each thread gets its own buffer (a `threading.local` of the packer), so launches of
one kernel from several threads do not overwrite each other's arguments. A buffer is reused by
the next `pack` call of the same thread, which is safe because the driver copies the arguments
before `cuLaunchKernel` returns.

CPU-only module: it needs neither a GPU nor cuda-python.
"""

from __future__ import annotations

import ctypes
import enum
import struct
import threading
from typing import Mapping, Optional, Sequence

from fusedops.dsl.errors import LaunchError
from fusedops.dsl.language import dtypes
from fusedops.dsl.target.llvm_types import bfloat16_bits


class ParamKind(enum.Enum):
    """How one kernel parameter is passed: (struct format, size in bytes, what a value must be)."""

    POINTER = ("Q", 8, "a device address (int >= 0)")
    INT1 = ("?", 1, "a bool")
    INT8 = ("b", 1, "an int in [-2**7, 2**7)")
    INT16 = ("h", 2, "an int in [-2**15, 2**15)")
    INT32 = ("i", 4, "an int in [-2**31, 2**31)")
    INT64 = ("q", 8, "an int in [-2**63, 2**63)")
    UINT8 = ("B", 1, "an int in [0, 2**8)")
    UINT16 = ("H", 2, "an int in [0, 2**16)")
    UINT32 = ("I", 4, "an int in [0, 2**32)")
    UINT64 = ("Q", 8, "an int in [0, 2**64)")
    FLOAT16 = ("e", 2, "a float within float16's range")
    BFLOAT16 = ("H", 2, "a float")  # packed as its bit pattern, see _bfloat16_bits
    FLOAT32 = ("f", 4, "a float within float32's range")
    FLOAT64 = ("d", 8, "a float")
    TENSOR_MAP = ("128s", 128, "the 128 bytes of a CUtensorMap")   # a TMA descriptor (runtime/tensor_map.py)

    @property
    def format(self) -> str:
        return self.value[0]

    @property
    def size(self) -> int:
        return self.value[1]

    @property
    def expected(self) -> str:
        return self.value[2]


_KIND_OF_DTYPE = {
    "int1": ParamKind.INT1, "int8": ParamKind.INT8, "int16": ParamKind.INT16, "int32": ParamKind.INT32,
    "int64": ParamKind.INT64, "uint8": ParamKind.UINT8, "uint16": ParamKind.UINT16,
    "uint32": ParamKind.UINT32, "uint64": ParamKind.UINT64, "float16": ParamKind.FLOAT16,
    "bfloat16": ParamKind.BFLOAT16, "float32": ParamKind.FLOAT32, "float64": ParamKind.FLOAT64,
}


def param_kind(type_) -> ParamKind:
    """The ParamKind of a kernel parameter of scalar type `type_` (a DType or a PointerType).

    Raises:
        TypeError: `type_` is not a scalar kernel-language type.
    """
    if isinstance(type_, dtypes.PointerType):
        return ParamKind.POINTER
    if isinstance(type_, dtypes.DType):
        return _KIND_OF_DTYPE[type_.name]
    raise TypeError(f"a kernel parameter has a scalar dtype or a pointer type, not {type_!r}")




def _aligned(offset: int, alignment: int) -> int:
    return (offset + alignment - 1) // alignment * alignment


class ArgumentPacker:
    """Packs the arguments of one kernel signature into a `void**` for `cuLaunchKernel`.

    kinds: the ParamKind of each kernel parameter, in order.
    names: optional parameter names, used in error messages.
    fixed: optional {parameter index: value} of arguments that never change (a prepared launch's
        scalars): they are packed once, into each thread's buffer as it is made, and `pack` takes
        the values of the other parameters only, in order (`variable`).

    `pack(values) -> int` (an attribute built once by `_build_pack`) writes the values into this
    thread's buffer and returns the address of its pointer array, to pass as `kernelParams`.

    Buffer layout: [N x 8-byte pointers][values, each at an offset aligned to its size: the
    variable parameters' in order, then the fixed ones'].

    Raises:
        LaunchError: a fixed value of the wrong type or out of range (naming the parameter).
    """

    def __init__(self, kinds: Sequence[ParamKind], names: Optional[Sequence[str]] = None,
                 fixed: Optional[Mapping[int, object]] = None):
        self.kinds = tuple(kinds)
        if names is not None and len(names) != len(self.kinds):
            raise ValueError(f"{len(names)} names for {len(self.kinds)} parameters")
        self.names = tuple(names) if names is not None else None
        for index, kind in enumerate(self.kinds):
            if not isinstance(kind, ParamKind):
                raise TypeError(f"parameter {index}: expected a ParamKind, got {kind!r}")
        count = len(self.kinds)
        fixed = dict(fixed or {})
        if any(not 0 <= index < count for index in fixed):
            raise ValueError(f"fixed parameters {sorted(fixed)} of a kernel of {count} parameters")
        self.variable = tuple(index for index in range(count) if index not in fixed)
        self.values_offset = 8 * count
        offsets, formats, ends, cursor = [0] * count, [], [], 0
        for index in [*self.variable, *sorted(fixed)]:
            kind = self.kinds[index]
            start = _aligned(cursor, kind.size)
            formats.append("x" * (start - cursor) + kind.format)    # padding, then the value
            offsets[index], cursor = start, start + kind.size
            ends.append(cursor)
        self.offsets = tuple(offsets)  # of each value, relative to the start of the values
        self.values_size = cursor
        self.buffer_size = max(self.values_offset + cursor, 1)
        split = len(self.variable)
        self._values_struct = struct.Struct("<" + "".join(formats[:split]))
        self._pointers_struct = struct.Struct(f"<{count}Q")
        # bfloat16 values are converted first (positions among the values `pack` takes)
        self._convert = tuple(position for position, index in enumerate(self.variable)
                              if self.kinds[index] is ParamKind.BFLOAT16)
        # the fixed values' bytes, from the end of the variable ones (their padding included)
        self._fixed_offset = self.values_offset + (ends[split - 1] if split else 0)
        self._fixed_bytes = self._pack_fixed(struct.Struct("<" + "".join(formats[split:])), fixed) if fixed else b""
        self._local = threading.local()
        self.pack = self._build_pack()

    def __repr__(self) -> str:
        return f"ArgumentPacker([{', '.join(kind.name for kind in self.kinds)}])"

    def _pack_fixed(self, fixed_struct: struct.Struct, fixed: dict) -> bytes:
        values = []
        for index in sorted(fixed):
            value = fixed[index]
            if self.kinds[index] is ParamKind.BFLOAT16:
                value = self._bfloat16_bits(index, value)
            try:
                struct.pack("<" + self.kinds[index].format, value)
            except (struct.error, OverflowError, TypeError) as error:
                self._raise_bad_value(index, value, error)
            values.append(value)
        return fixed_struct.pack(*values)

    def _thread_buffer(self) -> tuple:
        buffer = ctypes.create_string_buffer(self.buffer_size)
        address = ctypes.addressof(buffer)
        values = address + self.values_offset
        self._pointers_struct.pack_into(buffer, 0, *(values + offset for offset in self.offsets))
        if self._fixed_bytes:
            ctypes.memmove(address + self._fixed_offset, self._fixed_bytes, len(self._fixed_bytes))
        slot = self._local.slot = (buffer, address)
        return slot

    def _build_pack(self):
        # A closure over locals: about 130 ns cheaper per launch than a method reading attributes.
        local = self._local
        new_buffer = self._thread_buffer
        pack_into = self._values_struct.pack_into
        values_offset = self.values_offset
        convert = self._converted if self._convert else None
        raise_argument_error = self._raise_argument_error
        has_params = bool(self.kinds)

        def pack(values: Sequence) -> int:
            """Write `values` into this thread's buffer; return the address of its `void*` array.

            The address stays valid until this thread's next `pack` on this packer (0 when the
            kernel has no parameters: cuLaunchKernel accepts NULL then).

            Raises:
                LaunchError: wrong number of values, or a value of the wrong type or out of range
                    for its parameter; the message names the parameter's index (and name).
            """
            try:
                buffer, address = local.slot
            except AttributeError:
                buffer, address = new_buffer()
            if convert is not None:
                values = convert(values)
            try:
                pack_into(buffer, values_offset, *values)
            except (struct.error, OverflowError, TypeError):
                raise_argument_error(values)
            return address if has_params else 0

        return pack

    def writer(self) -> Optional[tuple]:
        """(local, new_buffer, pack_into, values_offset) for a launcher that packs inline, saving the
        call of `pack` (~0.1 us): this thread's (buffer, address of the pointer array) is `local.slot`,
        or `new_buffer()` when the thread has none yet; `pack_into(buffer, values_offset, *values)`
        writes the values `pack` takes (raising struct.error, OverflowError or TypeError for bad
        ones, which `pack` explains). None when the values need converting first (bfloat16
        parameters): use `pack`."""
        if self._convert:
            return None
        return self._local, self._thread_buffer, self._values_struct.pack_into, self.values_offset

    def pack_values(self, values: Sequence) -> bytes:
        """The bytes that `pack` writes for `values` after the pointer array (for tests and
        debugging; the fixed values' follow them)."""
        if self._convert:
            values = self._converted(values)
        try:
            return self._values_struct.pack(*values)
        except (struct.error, OverflowError, TypeError):
            self._raise_argument_error(values)

    def read(self, params: int) -> tuple:
        """The value of each parameter in a `kernelParams` array at address `params`, read through
        its pointers (bfloat16 values as their bit patterns; for tests and debugging)."""
        pointers = self._pointers_struct.unpack(ctypes.string_at(params, self.values_offset)) if self.kinds else ()
        return tuple(struct.unpack("<" + kind.format, ctypes.string_at(pointer, kind.size))[0]
                     for kind, pointer in zip(self.kinds, pointers))

    def _bfloat16_bits(self, index: int, value) -> int:
        # bfloat16 has no struct format: its values are packed as their bit patterns.
        try:
            if isinstance(value, (str, bytes)):  # float() would parse them
                raise TypeError(f"expected a float, got {type(value).__name__}")
            return bfloat16_bits(float(value))
        except (TypeError, ValueError) as error:
            raise LaunchError(f"{self._describe(index)}: expected {ParamKind.BFLOAT16.expected}, "
                              f"got {value!r} ({error})") from None

    def _converted(self, values: Sequence) -> list:
        values = list(values)
        for position in self._convert:
            if position < len(values):
                values[position] = self._bfloat16_bits(self.variable[position], values[position])
        return values

    def _describe(self, index: int) -> str:
        name = f" ({self.names[index]})" if self.names else ""
        return f"argument {index}{name} of kind {self.kinds[index].name.lower()}"

    def _raise_bad_value(self, index: int, value, error: Exception) -> None:
        raise LaunchError(f"{self._describe(index)}: expected {self.kinds[index].expected}, got {value!r} "
                          f"({type(value).__name__}: {error})") from None

    def _raise_argument_error(self, values: Sequence) -> None:
        # Slow path, only after the single pack_into failed: find the first bad value.
        if len(values) != len(self.variable):
            raise LaunchError(f"the kernel takes {len(self.variable)} arguments, got {len(values)}") from None
        for index, value in zip(self.variable, values):
            try:
                struct.pack("<" + self.kinds[index].format, value)
            except (struct.error, OverflowError, TypeError) as error:
                self._raise_bad_value(index, value, error)
        raise LaunchError(f"cannot pack arguments {list(values)!r} for {self!r}") from None
