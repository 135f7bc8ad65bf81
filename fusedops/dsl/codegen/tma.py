"""The bulk tensor copy engine (TMA, sm_90) and the mbarriers its copies complete on: the LLVM IR
building blocks, on an `ir.IRBuilder` (no lowering context needed, so tests build kernels with them
directly).

A tensor map (runtime/tensor_map.py: 128 bytes, built on the host by cuTensorMapEncodeTiled)
reaches the kernel as a by-value `__grid_constant__` parameter: in LLVM 22 an argument
`ptr byval([128 x i8]) align 64 "nvvm.grid_constant"`, which NVPTX prints as
`.param .align 64 .b8 name[128]` and whose address (a generic address into the param space,
`cvta.param`) the TMA instruction takes as is (TOOLCHAIN.md section 2, "tensor map").
llvmlite prints `byval(<pointee>)` only for a typed pointer, hence `tensor_map_parameter_type`.

One copy (PTX ISA 9.7.9.25.5.2 cp.async.bulk.tensor; 9.7.13.15 mbarrier):
    mbarrier.init.shared::cta.b64 [bar], 1               once, by one thread, then
    fence.mbarrier_init.release.cluster + a CTA barrier  the init is visible to the copy engine
    mbarrier.arrive.expect_tx.shared::cta.b64 _, [bar], bytes     the issuing thread: phase
                                                         completes when `bytes` have landed
    cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes
        [dst], [tensor_map, {c0, c1}], [bar]             c0: innermost coordinate (elements)
    mbarrier.try_wait.parity.shared::cta.b64 p, [bar], phase     every consumer, in a loop
    mbarrier.arrive.shared::cta.b64 _, [empty]           FUSEDOPS_WS=1: one per warp once its
                                                         wgmma reading the slot retired; the
                                                         issuing thread try_waits before the refill
The destination must be 128-byte aligned (1024 for the 128-byte swizzle, whose pattern is tied to
address bits, as for wgmma tiles). Out-of-bounds box elements are written as zeros and still count
toward `bytes`. A reused barrier alternates phase parity 0, 1, 0, ...

Wired into the DSL as planned (issue 7, step 2): an explicit construct,
`desc = dsl.make_tensor_descriptor(base, shape, strides, block_shape)` + `desc.load(offsets)`, whose
base, shape and strides must be kernel arguments (so the host can encode the map from the launch's
arguments; ints equal to 1 are specialized, so the compiler knows the contiguous dim and the
operand tile's major-ness), with interpreter semantics "load the box, zeros out of bounds". The
pipelining pass treats a descriptor load that feeds a wgmma like a cp.async candidate but issues
`tma_load_2d` into the ring slot with one mbarrier per slot (expect_tx by one thread; consumers
`mbarrier_wait` on the slot's phase instead of cp.async.wait_group), and the runtime appends one
`.param .align 64 .b8 [128]` per distinct map (`tensor_map_parameters`; the rules that lower the ops
are in async_copy.py). Chosen over inferring TMA from pointer loads: the
box, the bounds and the base would have to be recovered from address arithmetic and masks, and a
kernel could not tell whether it got TMA; the explicit form is what Triton and CuTe do.

Clusters (`dsl.cluster_dims(n)`: `.reqnctapercluster n, 1, 1`, so a plain cuLaunchKernel launches them)
and `desc.load(..., multicast=True)`: `.multicast::cluster` copies with a CTA mask (`tma_load_2d`), each
CTA issuing its share (`%cluster_ctarank`), and `barrier.cluster` arrive / wait for the ring's slot reuse
across the cluster (passes/pipelining.py has the schedule).
"""

from __future__ import annotations

from llvmlite import ir

from ..ir import Block, Function, OpCode
from ..layouts.mma_shared import WGMMA_SWIZZLE_MODE
from ..runtime.tensor_map import TENSOR_MAP_ALIGN, TENSOR_MAP_BYTES, TensorMapParam
from ..target import llvm_types as T

_GRID_CONSTANT = '"nvvm.grid_constant"'
SHARED_CLUSTER_ADDRESS_SPACE = 7


def tensor_map_parameter_type() -> ir.PointerType:
    """The LLVM type of a tensor-map kernel parameter (a typed pointer, so `byval` prints its type)."""
    return ir.PointerType(ir.ArrayType(T.i8, TENSOR_MAP_BYTES))


def mark_tensor_map_parameter(argument: ir.Argument) -> None:
    """Make kernel argument `argument` (of `tensor_map_parameter_type`) a by-value, 64-byte-aligned
    grid constant: `.param .align 64 .b8 name[128]` in PTX."""
    attributes = argument.attributes
    attributes._known = dict(type(attributes)._known, **{_GRID_CONSTANT: False})   # llvmlite's whitelist
    attributes.add("byval")
    attributes.add(_GRID_CONSTANT)
    attributes.align = TENSOR_MAP_ALIGN


def _asm(builder: ir.IRBuilder, asm: str, constraints: str, args, result=T.void):
    """Convergent inline asm that clobbers memory: LLVM keeps shared-memory reads of a copy's
    destination after the wait, and writes of a slot before the copy that reuses it."""
    constraints = f"{constraints},~{{memory}}" if constraints else "~{memory}"
    return T.inline_asm(builder, asm, constraints, list(args), result, convergent=True)


def mbarrier_init(builder: ir.IRBuilder, barrier, count: int) -> None:
    """`mbarrier.init.shared::cta.b64 [barrier], count` (barrier: `ptr addrspace(3)`, 8-byte aligned)."""
    _asm(builder, f"mbarrier.init.shared::cta.b64 [$0], {int(count)};", "r", [builder.ptrtoint(barrier, T.i32)])


def fence_mbarrier_init(builder: ir.IRBuilder) -> None:
    """`fence.mbarrier_init.release.cluster`: this thread's mbarrier.init visible to the async proxy
    (the copy engine) once a barrier orders it before the first copy."""
    _asm(builder, "fence.mbarrier_init.release.cluster;", "", [])


def mbarrier_arrive_expect_tx(builder: ir.IRBuilder, barrier, nbytes: int) -> None:
    """`mbarrier.arrive.expect_tx`: arrive on `barrier` and expect `nbytes` more bytes of copies."""
    _asm(builder, f"mbarrier.arrive.expect_tx.shared::cta.b64 _, [$0], {int(nbytes)};", "r",
         [builder.ptrtoint(barrier, T.i32)])


def mbarrier_arrive(builder: ir.IRBuilder, barrier) -> None:
    """`mbarrier.arrive.shared::cta.b64`: one arrival on `barrier` (release semantics at CTA scope:
    this thread's earlier shared-memory accesses, and the wgmmas it waited for, happen before the
    phase completes for a waiter)."""
    _asm(builder, "mbarrier.arrive.shared::cta.b64 _, [$0];", "r", [builder.ptrtoint(barrier, T.i32)])


def mbarrier_wait(builder: ir.IRBuilder, barrier, phase) -> None:
    """Wait until the phase of `barrier` with parity `phase` (LLVM i32, 0 or 1) has completed:
    `mbarrier.try_wait.parity` in a loop (the instruction itself waits a bounded, hardware-chosen
    time, so the loop rarely spins)."""
    asm = ("{\n.reg .pred done;\nL_wait_${:uid}:\n"
           "mbarrier.try_wait.parity.shared::cta.b64 done, [$0], $1;\n"
           "@!done bra L_wait_${:uid};\n}")
    _asm(builder, asm, "r,r", [builder.ptrtoint(barrier, T.i32), phase])


def tma_load_2d(builder: ir.IRBuilder, module: ir.Module, destination, barrier, tensor_map, c0, c1,
                multicast_mask: int = 0) -> None:
    """`cp.async.bulk.tensor.2d ... mbarrier::complete_tx::bytes`: the box of `tensor_map` at
    coordinates (c0 innermost, c1) (LLVM i32, elements; may be out of bounds, even negative) into
    shared memory at `destination` (`ptr addrspace(3)`), completing `barrier`'s transaction count.
    multicast_mask != 0: `.multicast::cluster`, the box lands at the same offsets of the shared memory
    (and completes the barrier at the same offset) of every CTA of the cluster whose rank's bit is set."""
    cluster = ir.PointerType(addrspace=SHARED_CLUSTER_ADDRESS_SPACE)
    function = T.declare_intrinsic(
        module, "llvm.nvvm.cp.async.bulk.tensor.g2s.tile.2d", T.void,
        [cluster, T.pointer(3), ir.PointerType(), T.i32, T.i32, T.i16, T.i64, T.i1, T.i1, T.i32])
    builder.call(function, [builder.addrspacecast(destination, cluster), barrier, _generic(builder, tensor_map), c0, c1,
                            ir.Constant(T.i16, multicast_mask), ir.Constant(T.i64, 0),
                            ir.Constant(T.i1, bool(multicast_mask)), ir.Constant(T.i1, 0), ir.Constant(T.i32, 0)])


def _generic(builder: ir.IRBuilder, tensor_map):
    """A tensor-map parameter (a typed pointer, `tensor_map_parameter_type`) as the opaque `ptr` the TMA
    intrinsics take."""
    return tensor_map if tensor_map.type == ir.PointerType() else builder.bitcast(tensor_map, ir.PointerType())


def cluster_rank(builder: ir.IRBuilder, module: ir.Module):
    """`%cluster_ctarank` (LLVM i32): this CTA's rank in its cluster (sm_90)."""
    return builder.call(T.declare_intrinsic(module, "llvm.nvvm.read.ptx.sreg.cluster.ctarank", T.i32, []), [])


def cluster_barrier(builder: ir.IRBuilder) -> None:
    """`barrier.cluster.arrive.release` + `barrier.cluster.wait.acquire`: every thread of every CTA of the
    cluster waits for all the others (every thread must execute it); the memory accesses before it, to
    any CTA's shared memory, happen before those after it (PTX ISA 9.7.13.3 barrier.cluster)."""
    _asm(builder, "barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;", "", [])


def cluster_arrive(builder: ir.IRBuilder) -> None:
    """`barrier.cluster.arrive.relaxed`: this thread's arrival on the cluster barrier, ordering no memory
    access (a release at cluster scope costs ~0.3 us per K step of a multicast ring on the H200, run 48).
    Enough where what must precede the waiters is a completed read: a multicast ring's slot, read by
    wgmmas that `wgmma.wait_group` retired before the arrival (the next copy into it is issued after the
    wait)."""
    _asm(builder, "barrier.cluster.arrive.relaxed.aligned;", "", [])


def cluster_wait(builder: ir.IRBuilder) -> None:
    """`barrier.cluster.wait.acquire`: wait until every thread of the cluster arrived (each thread
    alternates arrive and wait)."""
    _asm(builder, "barrier.cluster.wait.acquire.aligned;", "", [])


def tma_store_2d(builder: ir.IRBuilder, module: ir.Module, source, tensor_map, c0, c1) -> None:
    """`cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group`: the box of `tensor_map` at
    coordinates (c0 innermost, c1) written from shared memory at `source` (`ptr addrspace(3)`, laid
    out as the map's swizzle says); box elements outside the tensor are not written. Needs a
    `fence.proxy.async` after the writes of `source` and a `bulk_commit_group` after the copies."""
    _shared_to_global(builder, module, "s2g", source, tensor_map, c0, c1)


def tma_reduce_add_2d(builder: ir.IRBuilder, module: ir.Module, source, tensor_map, c0, c1) -> None:
    """`cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.tile.bulk_group`: `tma_store_2d`, but each
    element of the box is added to global memory (atomically per element) instead of written; the
    element type is the map's (PTX ISA 9.7.9.25.5.3)."""
    _shared_to_global(builder, module, "reduce.add", source, tensor_map, c0, c1)


def _shared_to_global(builder: ir.IRBuilder, module: ir.Module, kind: str, source, tensor_map, c0, c1) -> None:
    """`llvm.nvvm.cp.async.bulk.tensor.<kind>.tile.2d` of the box at (c0, c1) from shared `source`, no cache hint."""
    function = T.declare_intrinsic(module, f"llvm.nvvm.cp.async.bulk.tensor.{kind}.tile.2d", T.void,
                                   [T.pointer(3), ir.PointerType(), T.i32, T.i32, T.i64, T.i1])
    builder.call(function, [source, _generic(builder, tensor_map), c0, c1, ir.Constant(T.i64, 0), ir.Constant(T.i1, 0)])


def fence_proxy_async(builder: ir.IRBuilder, module: ir.Module) -> None:
    """`fence.proxy.async` (every state space): this thread's earlier generic-proxy accesses, to shared
    memory (the tile a bulk copy reads) and to global memory (what a bulk store or reduction then
    writes), are ordered before async-proxy accesses that a barrier orders after it (PTX ISA 9.7.13.4.13)."""
    builder.call(T.declare_intrinsic(module, "llvm.nvvm.fence.proxy.async", T.void, [],
                                     attributes=("convergent", "nounwind")), [])


def bulk_commit_group(builder: ir.IRBuilder, module: ir.Module) -> None:
    """`cp.async.bulk.commit_group`: the bulk copies issued since the last commit form one group."""
    builder.call(T.declare_intrinsic(module, "llvm.nvvm.cp.async.bulk.commit.group", T.void, []), [])


def bulk_wait_group_read(builder: ir.IRBuilder, module: ir.Module, pending: int) -> None:
    """`cp.async.bulk.wait_group.read pending`: at most `pending` groups still read their shared source."""
    function = T.declare_intrinsic(module, "llvm.nvvm.cp.async.bulk.wait.group.read", T.void, [T.i32])
    builder.call(function, [ir.Constant(T.i32, pending)])


def bulk_wait_group(builder: ir.IRBuilder, module: ir.Module, pending: int) -> None:
    """`cp.async.bulk.wait_group pending`: at most `pending` groups of bulk copies are not complete (their
    writes to global memory done)."""
    function = T.declare_intrinsic(module, "llvm.nvvm.cp.async.bulk.wait.group", T.void, [T.i32])
    builder.call(function, [ir.Constant(T.i32, pending)])


def fence_async_global(builder: ir.IRBuilder) -> None:
    """`fence.proxy.async.global`: global memory written by the async proxy (bulk copies) ordered before this
    thread's later generic-proxy accesses (and, through a barrier, other threads')."""
    _asm(builder, "fence.proxy.async.global;", "", [])


def prefetch_tensor_map(builder: ir.IRBuilder, tensor_map) -> None:
    """`prefetch.tensormap [tensor_map]`: bring the descriptor into the cache before the first copy."""
    _asm(builder, "prefetch.tensormap [$0];", "l", [tensor_map])


def setmaxnreg(builder: ir.IRBuilder, registers: int, increase: bool) -> None:
    """`setmaxnreg.{inc,dec}.sync.aligned.u32 registers` (sm_90a; PTX ISA 9.7.19.5): the executing warpgroup's
    per-thread register maximum raised from the CTA's pool (blocking until it has them) or lowered into it;
    every warp of the warpgroup executes it. registers: a multiple of 8 from 24 to 256."""
    if registers % 8 or not 24 <= registers <= 256:
        raise ValueError(f"setmaxnreg takes a multiple of 8 from 24 to 256, got {registers}")
    action = "inc" if increase else "dec"
    _asm(builder, f"setmaxnreg.{action}.sync.aligned.u32 {registers};", "", [])


def mbarrier_inval(builder: ir.IRBuilder, barrier) -> None:
    """`mbarrier.inval.shared::cta.b64 [barrier]`: required before the barrier's memory is reused."""
    _asm(builder, "mbarrier.inval.shared::cta.b64 [$0];", "r", [builder.ptrtoint(barrier, T.i32)])


def _source(value) -> tuple:
    """("arg", runtime index) for a kernel argument, ("const", int) for a constant."""
    if isinstance(value.owner, Block) and value.owner.parent is None:
        return ("arg", value.index)
    op = value.defining_op
    if op is not None and op.opcode == OpCode.CONSTANT:
        return ("const", int(op.attrs["value"]))
    raise ValueError(f"internal error: a tensor map's size or stride {value!r} is neither an argument nor a constant")


def tma_copy_parameter(op) -> TensorMapParam:
    """The tensor map a `tma_copy` op reads (see ir/ops.py): its ring tile (the buffer's
    `local_alloc` attrs) gives the box (a share of its rows for attr multicast_rows) and the swizzle,
    its operands the tensor."""
    buffer = op.operands[0]
    alloc = buffer.defining_op
    swizzle, contiguous = alloc.attrs["swizzle_bytes"], alloc.attrs["contiguous_dim"]
    if swizzle not in WGMMA_SWIZZLE_MODE:
        raise ValueError(f"internal error: a TMA ring tile needs a 32/64/128-byte swizzle, got {swizzle}")
    element = buffer.type.element
    tile = buffer.type.tile_shape
    atom = swizzle // element.itemsize
    base, shape0, shape1, stride0, stride1 = op.operands[3:8]
    rows = tile[1 - contiguous] // (op.attrs["multicast"] if op.attrs.get("multicast_rows") else 1)
    return TensorMapParam(element.name, _source(base)[1], (_source(shape0), _source(shape1)),
                          (_source(stride0), _source(stride1)), contiguous, (rows, atom), swizzle)


def tma_store_parameter(op) -> TensorMapParam:
    """The tensor map a `tma_store` op writes through: boxes of the block's other extent x one
    STORE_SWIZZLE_BYTES atom along its contiguous dim (passes/descriptors.py)."""
    from ..passes.descriptors import STORE_SWIZZLE_BYTES
    value, base, shape0, shape1, stride0, stride1 = op.operands[:6]
    element = value.type.element
    contiguous = op.attrs["contiguous_dim"]
    rows = op.attrs["block_shape"][1 - contiguous]
    return TensorMapParam(element.name, _source(base)[1], (_source(shape0), _source(shape1)),
                          (_source(stride0), _source(stride1)), contiguous,
                          (rows, STORE_SWIZZLE_BYTES // element.itemsize), STORE_SWIZZLE_BYTES)


def tensor_map_parameters(function: Function) -> tuple:
    """(the distinct `TensorMapParam`s of the `tma_copy` and `tma_store` ops of `function`, in
    first-use order, {id(op): index into them}): one kernel parameter per distinct map."""
    params, index_of = [], {}
    for op in function.walk():
        if op.opcode in (OpCode.TMA_COPY, OpCode.TMA_STORE):
            param = tma_copy_parameter(op) if op.opcode == OpCode.TMA_COPY else tma_store_parameter(op)
            if param not in params:
                params.append(param)
            index_of[id(op)] = params.index(param)
    return tuple(params), index_of
