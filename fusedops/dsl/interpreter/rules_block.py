"""Rules for block creation and shape ops, and the block-wide ops: reduce, argreduce, scan, dot.

Block values are NumPy arrays in row-major order; broadcast returns a read-only broadcast view (no
copy): rules never write into their operands.
"""

from __future__ import annotations

import numpy as np

from ..ir.ops import OpCode
from ..language.numerics import conversions, reductions
from ..language.dtypes import shape_of
from .context import element_type, read_only, register


@register(OpCode.CONSTANT, static=True)
def _constant(ctx, op):
    result = op.results[0].type
    scalar = conversions.from_python(op.attrs["value"], element_type(result))
    return read_only(np.array(np.broadcast_to(scalar, shape_of(result))))


@register(OpCode.ARANGE, static=True)
def _arange(ctx, op):
    return read_only(np.arange(op.attrs["start"], op.attrs["end"], dtype=np.int32))


@register(OpCode.SPLAT)
def _splat(ctx, op, x):
    x = np.asarray(x)
    return np.full(shape_of(op.results[0].type), x, dtype=x.dtype)


@register(OpCode.BROADCAST)
def _broadcast(ctx, op, x):
    return np.broadcast_to(x, shape_of(op.results[0].type))


@register(OpCode.EXPAND_DIMS)
def _expand_dims(ctx, op, x):
    return np.expand_dims(x, op.attrs["axis"])


@register(OpCode.RESHAPE)
def _reshape(ctx, op, x):
    return np.reshape(x, shape_of(op.results[0].type))   # row-major


@register(OpCode.TRANS)
def _trans(ctx, op, x):
    return np.transpose(x, op.attrs.get("perm"))


@register(OpCode.REDUCE)
def _reduce(ctx, op, x):
    return reductions.reduce(x, op.attrs["kind"], op.attrs.get("axis"), element_type(op.operands[0].type))


@register(OpCode.ARGREDUCE)
def _argreduce(ctx, op, x):
    return reductions.argreduce(x, op.attrs["kind"], op.attrs.get("axis"))


@register(OpCode.SCAN)
def _scan(ctx, op, x):
    return reductions.scan(x, op.attrs.get("kind", "sum"), op.attrs["axis"], bool(op.attrs.get("reverse")),
                         element_type(op.operands[0].type))


@register(OpCode.DOT)
def _dot(ctx, op, a, b, acc):
    return reductions.dot(a, b, acc, element_type(op.operands[0].type), element_type(op.operands[2].type),
                          op.attrs.get("input_precision"))
