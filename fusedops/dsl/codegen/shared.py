"""Shared-memory scratch: the dynamic buffer, CTA barriers, and moving a block between layouts.

Every op that needs scratch space uses the one dynamic shared buffer from `ctx.scratch_offset`
(0, or the end of the shared buffers a pipelined loop keeps alive around it) with the protocol:
barrier, write, barrier, read. The leading barrier keeps a write from overtaking the reads of the
previous use, so scratch uses never overlap in time and the buffer's size is the live buffers plus
the largest single use (`ctx.shared_bytes`).
"""

from __future__ import annotations

from llvmlite import ir

from ..language.dtypes import PointerType
from ..target import llvm_types as T
from . import layout_access


# The named barrier of the consumer warps once a producer warp left the kernel (0 is every thread's).
CONSUMER_BARRIER = 1


def barrier(ctx) -> None:
    """A CTA barrier: every thread (bar.sync 0), or after a producer warp left (`ctx.barrier_threads`) the
    consumer warps' named barrier, of that many threads (PTX ISA 9.7.13.1, barrier.cta)."""
    if ctx.barrier_threads:
        fn = T.declare_intrinsic(ctx.module, "llvm.nvvm.barrier.cta.sync.aligned.count", T.void, [T.i32, T.i32],
                                 attributes=("convergent", "nounwind"))
        ctx.builder.call(fn, [ir.Constant(T.i32, CONSUMER_BARRIER), ir.Constant(T.i32, ctx.barrier_threads)])
        return
    fn = T.declare_intrinsic(ctx.module, "llvm.nvvm.barrier.cta.sync.aligned.all", T.void, [T.i32],
                             attributes=("convergent", "nounwind"))
    ctx.builder.call(fn, [ir.Constant(T.i32, 0)])


def shared_base(ctx):
    """The `ptr addrspace(3)` of the dynamic shared buffer (declared on first use)."""
    if ctx.shared_memory is None:
        g = ir.GlobalVariable(ctx.module, ir.ArrayType(T.i8, 0), "fusedops_shared", addrspace=3)
        g.linkage = "external"
        g.align = 16
        g.type = T.pointer(3)
        ctx.shared_memory = g
    return ctx.shared_memory


def align_shared_memory(ctx, alignment: int) -> None:
    """Declare the dynamic shared buffer aligned to `alignment` bytes (a power of two, at most 1024:
    ptxas's limit), e.g. for wgmma tiles whose swizzle pattern is tied to address bits."""
    memory = shared_base(ctx)
    memory.align = max(memory.align or 16, alignment)


def reserve(ctx, nbytes: int) -> None:
    """Make the scratch region (from ctx.scratch_offset) at least `nbytes` long."""
    ctx.shared_bytes = max(ctx.shared_bytes, ctx.scratch_offset + (nbytes + 15) // 16 * 16)


def scratch_base(ctx):
    """The `ptr addrspace(3)` where scratch space starts (after the live pipelining buffers)."""
    if not ctx.scratch_offset:
        return shared_base(ctx)
    return ctx.builder.gep(shared_base(ctx), [ir.Constant(T.i32, ctx.scratch_offset)], source_etype=T.i8)


def element_pointer(ctx, memory_type, index):
    """Pointer to element `index` (LLVM i32) of `memory_type` in the scratch region."""
    return ctx.builder.gep(scratch_base(ctx), [index], source_etype=memory_type)


def linear_index(ctx, coords, shape):
    """Row-major linear index (LLVM i32) of LLVM coordinates in a block of `shape`."""
    b = ctx.builder
    index = None
    stride = 1
    for coord, size in reversed(list(zip(coords, shape))):
        term = coord if stride == 1 else b.mul(coord, ir.Constant(T.i32, stride))
        index = term if index is None else b.add(index, term)
        stride *= size
    return index if index is not None else ir.Constant(T.i32, 0)


def _to_storage(b, value, element):
    if isinstance(element, PointerType):
        return b.ptrtoint(value, T.i64), T.i64
    if element.is_bool:
        return b.zext(value, T.i8), T.i8
    return value, value.type


def _from_storage(b, value, element):
    if isinstance(element, PointerType):
        return b.inttoptr(value, T.llvm_type(element))
    if element.is_bool:
        return b.icmp_unsigned("!=", value, ir.Constant(T.i8, 0))
    return value


def storage_type(element):
    if isinstance(element, PointerType):
        return T.i64
    return T.llvm_memory_type(element)


def reserve_block(ctx, layout, element) -> tuple:
    """(shape, storage type) of a block in `layout`, after reserving scratch for all its elements."""
    shape = layout_access.shape(layout)
    numel = 1
    for size in shape:
        numel *= size
    reserve(ctx, numel * storage_bytes(element))
    return shape, storage_type(element)


def exchange_through_shared(ctx, registers, source, target, element):
    """Move a block from layout `source` to layout `target` through shared memory; returns the
    target layout's registers."""
    b = ctx.builder
    shape, storage = reserve_block(ctx, source, element)
    barrier(ctx)
    for r, value in enumerate(registers):
        coords = ctx.element_coordinates(source, r)
        stored, _ = _to_storage(b, value, element)
        b.store(stored, element_pointer(ctx, storage, linear_index(ctx, coords, shape)))
    barrier(ctx)
    out = []
    for r in range(layout_access.num_registers(target)):
        coords = ctx.element_coordinates(target, r)
        loaded = b.load(element_pointer(ctx, storage, linear_index(ctx, coords, shape)), typ=storage)
        out.append(_from_storage(b, loaded, element))
    return out


def _bytes(ty) -> int:
    return {"half": 2, "bfloat": 2, "float": 4, "double": 8}[str(ty)]


def storage_bytes(element) -> int:
    storage = storage_type(element)
    return storage.width // 8 if isinstance(storage, ir.IntType) else _bytes(storage)
