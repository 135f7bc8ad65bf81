"""A stand-in for `fusedops.dsl` that runs a scalar kernel's source as plain Python (the reference the frontend's
control-flow tests compare the interpreter and the compiled kernel with): pointers are (dict or list, offset)
pairs, `dsl.load` / `dsl.store` read and write them, stores as Python floats."""

from __future__ import annotations


class PythonPointer:
    """A pointer into `out` (a dict of stored values, or a list to load from) at `offset`."""

    def __init__(self, out, offset=0):
        self.out, self.offset = out, offset

    def __add__(self, k):
        return PythonPointer(self.out, self.offset + k)


class PythonDsl:
    """The names a scalar kernel's source uses from `dsl`, in plain Python."""

    constexpr = int
    static_range = range

    @staticmethod
    def load(pointer):
        if not 0 <= pointer.offset < len(pointer.out):
            raise IndexError(f"the Python run loads out of bounds: {pointer.offset}")
        return pointer.out[pointer.offset]

    @staticmethod
    def store(pointer, value):
        pointer.out[pointer.offset] = float(value)
