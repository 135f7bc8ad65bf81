"""Rules for pointer arithmetic, loads, stores and atomics.

Masked-off lanes are never touched: their addresses are not even bounds-checked; a load fills them with
`other` (0 / False without it), an atomic returns 0 for them. Accessed lanes are bounds-checked, and a
fault raises InterpreterError (see `diagnostics.py`).
"""

from __future__ import annotations

import numpy as np

from ..ir.ops import OpCode
from ..language.numerics import arithmetic, conversions
from ..language.dtypes import shape_of
from .context import element_type, register
from .diagnostics import access_error
from .memory import AccessFault


@register(OpCode.ADDPTR)
def _addptr(ctx, op, pointer, offset):
    """pointer + offset * element size, with int64 wrap-around (offsets sign- or zero-extend by their
    signedness, as a cast to int64 does)."""
    size = element_type(op.operands[0].type).element.itemsize
    return np.add(pointer, np.multiply(offset, size, dtype=np.int64, casting="unsafe"))


def _lanes(op, pointer, mask):
    """(shape, flat addresses of the accessed lanes, their flat positions, flat mask).

    Positions and mask are None when every lane is accessed (no mask, or an all-true one)."""
    shape = shape_of(op.operands[0].type)
    addresses = np.asarray(pointer, dtype=np.int64).reshape(-1)
    if mask is None:
        return shape, addresses, None, None
    mask = np.broadcast_to(mask, shape).reshape(-1)
    if mask.all():
        return shape, addresses, None, None
    positions = np.flatnonzero(mask)
    return shape, addresses[positions], positions, mask


def _access(ctx, op, kind, dtype, shape, positions, action):
    try:
        return action()
    except AccessFault as fault:
        raise access_error(ctx, op, fault, kind, dtype, shape, positions) from None


@register(OpCode.LOAD)
def _load(ctx, op, pointer, *rest):
    masked, has_other = bool(op.attrs.get("masked")), bool(op.attrs.get("has_other"))
    mask = rest[0] if masked else None
    other = rest[-1] if has_other else None
    dtype = element_type(op.operands[0].type).element
    shape, addresses, positions, flat_mask = _lanes(op, pointer, mask)
    values = _access(ctx, op, "load", dtype, shape, positions,
                     lambda: ctx.memory.read(addresses, dtype))
    if positions is None:
        return values.reshape(shape)
    if other is None:
        result = np.zeros(flat_mask.size, dtype=dtype.numpy_dtype)
    else:
        result = np.array(np.broadcast_to(other, shape), dtype=dtype.numpy_dtype).reshape(-1)
    result[positions] = values
    return result.reshape(shape)


@register(OpCode.STORE)
def _store(ctx, op, pointer, value, *rest):
    mask = rest[0] if op.attrs.get("masked") else None
    dtype = element_type(op.operands[0].type).element
    shape, addresses, positions, _ = _lanes(op, pointer, mask)
    values = np.broadcast_to(value, shape).reshape(-1)
    if positions is not None:
        values = values[positions]
    _access(ctx, op, "store", dtype, shape, positions,
            lambda: ctx.memory.write(addresses, values, dtype))


def _combine(kind: str, dtype):
    if kind == "add":
        return lambda old, new: arithmetic.add(old, new, dtype)
    if kind == "max":
        return lambda old, new: arithmetic.maximum(old, new, dtype)
    if kind == "min":
        return lambda old, new: arithmetic.minimum(old, new, dtype)
    if kind in ("and", "or", "xor") and dtype.is_integer:
        function = {"and": arithmetic.bitwise_and, "or": arithmetic.bitwise_or,
                    "xor": arithmetic.bitwise_xor}[kind]
        return lambda old, new: function(old, new, dtype)
    if kind == "xchg":
        return lambda old, new: new
    raise NotImplementedError(f"atomic_rmw kind {kind!r} on {dtype}")


def _atomic(ctx, op, pointer, mask, update):
    """Apply `update(old, lanes) -> new` atomically to the accessed lanes; returns the old values,
    0 in masked-off lanes. Lanes are flat positions in the block."""
    dtype = element_type(op.operands[0].type).element
    shape, addresses, positions, _ = _lanes(op, pointer, mask)
    old = _access(ctx, op, "atomic", dtype, shape, positions,
                  lambda: ctx.memory.read_modify_write(
                      addresses, dtype, lambda current, lanes: update(
                          current, lanes if positions is None else positions[lanes])))
    if positions is None:
        return old.reshape(shape)
    result = np.zeros(int(np.prod(shape, dtype=np.int64)), dtype=dtype.numpy_dtype)
    result[positions] = old
    return result.reshape(shape)


@register(OpCode.ATOMIC_RMW)
def _atomic_rmw(ctx, op, pointer, value, *rest):
    """Kinds add, max, min, and, or, xor, xchg; lanes that share an address apply in lane order."""
    mask = rest[0] if op.attrs.get("masked") else None
    dtype = element_type(op.operands[0].type).element
    combine = _combine(op.attrs["kind"], dtype)
    flat_value = np.broadcast_to(value, shape_of(op.operands[0].type)).reshape(-1)
    return _atomic(ctx, op, pointer, mask, lambda old, lanes: combine(old, flat_value[lanes]))


@register(OpCode.ATOMIC_CAS)
def _atomic_cas(ctx, op, pointer, compare, value, *rest):
    """Where memory's bits equal `compare`'s bits, write `value`; return the old values."""
    mask = rest[0] if op.attrs.get("masked") else None
    dtype = element_type(op.operands[0].type).element
    shape = shape_of(op.operands[0].type)
    flat_compare = np.broadcast_to(compare, shape).reshape(-1)
    flat_value = np.broadcast_to(value, shape).reshape(-1)

    def update(old, lanes):
        equal = conversions.to_bits(old, dtype) == conversions.to_bits(flat_compare[lanes], dtype)
        return np.where(equal, flat_value[lanes], old)
    return _atomic(ctx, op, pointer, mask, update)
