"""Rules for the ops the pipelining pass inserts (local_alloc, async_copy, async_commit, async_wait,
local_load, local_dealloc, wgmma_wait), so that a pipelined function can be run and compared with
the original.

The kernels users write never contain these ops (the interpreter runs the frontend's IR); the rules
exist to test the pass. They model cp.async's completion rule: a copy lands in its buffer only when
an `async_wait` retires its commit group (all groups but the newest `pending`), or at
`local_dealloc`; buffers start as NaN (or the integer minimum), so a `local_load` of a tile whose
copy has not been waited for reads poison instead of data.
"""

from __future__ import annotations

import numpy as np

from ..ir.ops import OpCode
from .context import element_type, register
from .rules_memory import _access

_QUEUE = object()      # key of the program's async-copy state in ProgramContext.env


def _queue(ctx) -> dict:
    return ctx.env.setdefault(_QUEUE, {"open": [], "groups": []})


def _retire(groups: list, keep: int) -> None:
    while len(groups) > keep:
        for buffer, index, values in groups.pop(0):
            buffer[index] = values


@register(OpCode.LOCAL_ALLOC)
def _local_alloc(ctx, op):
    buffer_type = op.result.type
    dtype = buffer_type.element.numpy_dtype
    shape = (buffer_type.num_buffers,) + tuple(buffer_type.tile_shape)
    if np.issubdtype(dtype, np.floating):
        return np.full(shape, np.nan, dtype=dtype)
    return np.full(shape, np.iinfo(dtype).min, dtype=dtype)


@register(OpCode.ASYNC_COPY)
def _async_copy(ctx, op, buffer, index, pointer, *mask):
    # A masked load with other = 0 (masked-off elements are zero-filled), landing later.
    dtype = op.operands[0].type.element
    shape = tuple(op.operands[0].type.tile_shape)
    addresses = np.asarray(pointer, dtype=np.int64).reshape(-1)
    flat_mask = np.broadcast_to(mask[0], shape).reshape(-1) if mask else np.ones(addresses.size, dtype=bool)
    positions = np.flatnonzero(flat_mask)
    values = np.zeros(addresses.size, dtype=dtype.numpy_dtype)
    values[positions] = _access(ctx, op, "async copy", dtype, shape, positions,
                                lambda: ctx.memory.read(addresses[positions], dtype))
    _queue(ctx)["open"].append((buffer, int(index), values.reshape(shape)))


@register(OpCode.ASYNC_COMMIT)
def _async_commit(ctx, op):
    queue = _queue(ctx)
    queue["groups"].append(queue["open"])
    queue["open"] = []


@register(OpCode.ASYNC_WAIT)
def _async_wait(ctx, op):
    _retire(_queue(ctx)["groups"], op.attrs["pending"])


@register(OpCode.LOCAL_DEALLOC)
def _local_dealloc(ctx, op, buffer):
    queue = _queue(ctx)
    _retire(queue["groups"], 0)
    _retire([queue["open"]], 0)
    queue["open"] = []


@register(OpCode.LOCAL_LOAD)
def _local_load(ctx, op, buffer, index):
    return np.array(buffer[int(index)], dtype=element_type(op.result.type).numpy_dtype)


@register(OpCode.WGMMA_WAIT, multiple_results=True)
def _wgmma_wait(ctx, op, *values):
    # Completion of in-flight tensor-core work: the interpreter's dots are synchronous.
    return list(values)
