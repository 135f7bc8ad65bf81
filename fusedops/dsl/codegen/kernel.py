"""Lower a laid-out IR function to an LLVM module holding one PTX kernel.

Kernel parameters follow the function's runtime arguments in order: pointers as `ptr addrspace(1)`
(with `align 16` when the specialization proved it), int1 as i8, other scalars as their LLVM type;
then one 128-byte grid-constant tensor map per distinct map the `tma_copy` ops read (codegen/tma.py),
which the runtime appends to the launch's values (runtime/tensor_map.py).
The entry block ("prologue") computes per-thread constants (thread, lane and warp ids, layout
coordinates) once; the body follows.
"""

from __future__ import annotations

import dataclasses

from llvmlite import ir

from ..errors import CompilationError
from ..ir import Function, OpCode
from ..ir.ops import cluster_size
from ..passes.dot_layouts import PRODUCER_WARPS, arch_number
from ..language.dtypes import PointerType
from ..target import llvm_types as T
from . import async_copy, atomics, cluster_sum, control, debug, dot, elementwise, memory, reduce, shapes, tma, tma_store  # noqa: F401,E501  (rules)
from .context import LoweringContext
from .control import lower_block


@dataclasses.dataclass(frozen=True)
class LoweredKernel:
    name: str
    llvm_ir: str
    shared_bytes: int
    parameter_types: tuple   # the dsl type of each kernel parameter, in order
    tensor_maps: tuple = ()  # runtime.tensor_map.TensorMapParam of each tensor-map parameter, after those
    cluster_size: int = 1    # dsl.cluster_dims: CTAs per cluster along grid axis 0
    producer_warps: int = 0  # warps launched beyond num_warps (a TMA ring's producer warpgroup: OpCode.PRODUCER_WARP)


def _parameter_type(type_):
    if isinstance(type_, PointerType):
        return T.pointer(type_.address_space)
    if type_.is_bool:
        return T.i8
    return T.llvm_type(type_)


# Threads one SM holds at once (sm_80, sm_90): more CTAs than fit make ptxas ignore `.minnctapersm`
# with only a warning.
_MAX_THREADS_PER_SM = 2048


def _min_blocks_per_sm(function: Function, num_warps: int):
    """The kernel's `dsl.launch_bounds(min_blocks_per_sm)` (None when it has none)."""
    values = {op.attrs["min_blocks_per_sm"] for op in function.walk() if op.opcode == OpCode.LAUNCH_BOUNDS}
    if len(values) > 1:
        raise CompilationError(f"launch_bounds: the kernel asks for different min_blocks_per_sm {sorted(values)}")
    value = values.pop() if values else None
    if value is not None and value * 32 * num_warps > _MAX_THREADS_PER_SM:
        raise CompilationError(f"launch_bounds: {value} CTAs of {num_warps} warps ({value * 32 * num_warps} threads) "
                               f"do not fit on one SM ({_MAX_THREADS_PER_SM} threads at most)")
    return value


def lower_to_llvm(function: Function, *, arch: str, num_warps: int, axis_info, fp_fusion: bool = False) -> LoweredKernel:
    module = ir.Module(name=function.name)
    param_types = [a.type for a in function.args]
    tensor_maps, tensor_map_of = tma.tensor_map_parameters(function)
    llvm_types = [_parameter_type(t) for t in param_types] + [tma.tensor_map_parameter_type()] * len(tensor_maps)
    fn = ir.Function(module, ir.FunctionType(T.void, llvm_types), function.name)
    cluster = cluster_size(function)
    clustered = cluster > 1 and arch_number(arch) >= 90      # older GPUs launch the same grid without clusters
    producer_warps = PRODUCER_WARPS if any(op.opcode == OpCode.PRODUCER_WARP for op in function.walk()) else 0
    launched = num_warps + producer_warps
    T.mark_kernel(fn, max_threads=32 * launched, min_blocks_per_sm=_min_blocks_per_sm(function, launched),
                  extra={"nvvm.cluster_dim": f"{cluster},1,1"} if clustered else None)
    hints = function.arg_hints or [{}] * len(param_types)
    for arg, type_, hint, name in zip(fn.args, param_types, hints, function.arg_names):
        arg.name = name
        if isinstance(type_, PointerType) and hint.get("divisibility", 1) >= 16:
            arg.add_attribute("noundef")
            arg.attributes.align = 16

    prologue_block = fn.append_basic_block("prologue")
    body_block = fn.append_basic_block("body")
    prologue = ir.IRBuilder(prologue_block)
    builder = ir.IRBuilder(body_block)
    tid_fn = T.declare_intrinsic(module, "llvm.nvvm.read.ptx.sreg.tid.x", T.i32, [])
    thread_id = prologue.call(tid_fn, [], name="tid")
    lane_id = prologue.and_(thread_id, ir.Constant(T.i32, 31), name="lane")
    warp_id = prologue.lshr(thread_id, ir.Constant(T.i32, 5), name="warp")

    ctx = LoweringContext(module=module, function=fn, builder=builder, prologue=prologue, arch=arch,
                          num_warps=num_warps, axis_info=axis_info, thread_id=thread_id, lane_id=lane_id,
                          warp_id=warp_id, fp_fusion=fp_fusion)
    maps = fn.args[len(param_types):]
    for index, arg in enumerate(maps):
        arg.name = f"tensor_map{index}"
        tma.mark_tensor_map_parameter(arg)
    ctx.tensor_maps = {key: (maps[index], tensor_maps[index]) for key, index in tensor_map_of.items()}
    for value, arg, type_ in zip(function.args, fn.args, param_types):
        if not isinstance(type_, PointerType) and type_.is_bool:
            ctx.set(value, prologue.icmp_unsigned("!=", arg, ir.Constant(T.i8, 0)))
        else:
            ctx.set(value, arg)
    cluster_sum.prepare(ctx, function, cluster, arch_number(arch))
    lower_block(ctx, function.body)
    builder.ret_void()
    prologue.branch(body_block)
    return LoweredKernel(function.name, str(module), ctx.shared_bytes, tuple(param_types), tensor_maps, cluster,
                         producer_warps)
