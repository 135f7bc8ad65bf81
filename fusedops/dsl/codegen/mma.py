"""Tensor-core lowering: `dot` on `mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}` and its operands
staged through swizzled shared memory and read with `ldmatrix`.

Layouts come from the layout pass (`passes/dot_layouts.py`): the accumulator is in the mma
accumulator layout, A and B in the mma operand layouts, all for the same warp grid (wm, wn). So in
every thread, accumulator register c + 4 * (j + repN * i) is element c of the 16x8 tile (i, j); A
register e + 8 * (kk + repK * i) is element e of the 16x16 tile (i, kk); B register
e + 4 * (kk + repK * j) is element e of the 16x8 tile (kk, j) (`layouts/mma.py`), and one mma per
(kk, i, j) does the work. Operand registers 2p and 2p+1 are one 32-bit fragment register.

A `convert_layout` to a dot operand (attr `dot_operand`) becomes a `StagedOperand`: the dot stores
its operands, in their own (blocked) layouts, into scratch tiles laid out by
`layouts.mma_shared.mma_operand_shared` (16-byte vector stores, XOR-swizzled 16-byte chunks), then
reads them back one 16-wide K slice at a time with `ldmatrix.x4` (`.trans` when the tile is
contiguous along M for A or N for B; `layouts.mma_shared.ldmatrix_plan`) right before that slice's
mmas, so only one slice of the operands is held in registers. The pipelined path (`pipelining.py`)
writes the same tiles with cp.async and its `local_load` gives the dot a `StagedOperand` too.
(A dot operand conversion to a *shared* layout belongs to a wgmma dot: `wgmma.py`.)

Intrinsics (TOOLCHAIN.md section 2): f16 inputs take `<2 x half>` operands; bf16 inputs take i32.
float32 inputs of a tf32 dot run on m16n8k8 instead, read with ld.shared and rounded with cvt.rna.tf32.f32
(`mma_tf32.py`).
"""

from __future__ import annotations

from llvmlite import ir

from ..errors import CompilationError
from ..language.dtypes import bfloat16, float16, float32
from ..layouts.mma_shared import is_shared_layout, ldmatrix_plan, mma_operand_shared
from ..layouts.shared import shared_offsets
from ..layouts.swizzle import contiguous_dim
from ..layouts.vectorize import vector_width
from ..passes.dot_layouts import mma_dot_layouts, mma_warps
from ..target import llvm_types as T
from .mma_tf32 import Tf32OperandLoader, declare_mma_tf32, mma_tf32_schedule, round_to_tf32
from .ownership import owned_registers
from .shared import barrier, reserve, scratch_base

_MMA_INTRINSIC = {float16: "llvm.nvvm.mma.m16n8k16.row.col.f32.f32",
                  bfloat16: "llvm.nvvm.mma.m16n8k16.row.col.bf16"}


# -- offsets: thread part (lane, warp bits; computed once) XOR a constant per access ---------------------

def thread_offset(ctx, lane_bases, warp_bases, here: bool = False):
    """(LLVM i32 computed in the prologue, mask of the bits it can have): the XOR of the bases of
    this thread's set lane and warp bits. `here`: computed at the builder's position instead, not
    cached (a value computed in the prologue stays live through every loop before its use)."""
    key = ("shared-offset", tuple(lane_bases), tuple(warp_bases))
    cached = None if here else ctx._coordinate_cache.get(key)
    if cached is not None:
        return cached
    b = ctx.builder if here else ctx.prologue
    value = ir.Constant(T.i32, 0)
    mask = 0
    for source, bases in ctx.thread_bit_sources(here, lane_bases, warp_bases):
        for bit, basis in bases:
            if not basis:
                continue
            flag = b.and_(b.lshr(source, ir.Constant(T.i32, bit)), ir.Constant(T.i32, 1))
            value = b.xor(value, b.mul(flag, ir.Constant(T.i32, basis)))
            mask |= basis
    result = (value, mask)
    if not here:
        ctx._coordinate_cache[key] = result
    return result


def combine_offset(ctx, thread, constant: int):
    """thread ^ constant, as an add where their bits cannot overlap (so it folds into addressing)."""
    value, mask = thread
    b = ctx.builder
    low, high = constant & mask, constant & ~mask
    if low:
        value = b.xor(value, ir.Constant(T.i32, low))
    if high:
        value = b.add(value, ir.Constant(T.i32, high))
    return value


def byte_pointer(ctx, base, byte_offset):
    return ctx.builder.gep(base, [byte_offset], source_etype=T.i8)


# -- storing a block into a shared tile ------------------------------------------------------------------

def tile_store_groups(layout, shared, element_bits: int, width=None) -> tuple:
    """(width, [(first register, byte offset)], lane byte bases, warp byte bases) of storing a
    distributed `layout` into the shared tile `shared`, `width` elements per vector (default: the
    widest the two layouts allow)."""
    offsets = shared_offsets(layout, shared)
    widest = vector_width(offsets, 0, element_bits)
    if width is None:
        width = widest
    elif widest % width:
        raise CompilationError(f"internal error: a {width}-element shared store where {widest} is the widest")
    size = element_bits // 8
    owned = owned_registers(layout)
    groups = [(r, offsets.apply(register=r)[0] * size) for r in range(0, layout.num_registers, width) if r in owned]
    lanes = tuple(offsets.apply(lane=1 << b)[0] * size for b in range(layout.in_dim_bits("lane")))
    warps = tuple(offsets.apply(warp=1 << b)[0] * size for b in range(layout.in_dim_bits("warp")))
    return width, groups, lanes, warps


def store_tile(ctx, registers, layout, shared, element, base, here: bool = False) -> None:
    """Store a thread's `registers` (block in `layout`) into the tile `shared` at `base` (`here`: the
    thread's offset computed at the builder's position, see `thread_offset`)."""
    bits = element.bits
    width, groups, lanes, warps = tile_store_groups(layout, shared, bits)
    thread = thread_offset(ctx, lanes, warps, here=here)
    b = ctx.builder
    memory_type = T.llvm_memory_type(element)
    vector_type = ir.VectorType(memory_type, width)
    for first, constant in groups:
        value = ir.Constant(vector_type, ir.Undefined)
        for i in range(width):
            value = b.insert_element(value, registers[first + i], ir.Constant(T.i32, i))
        b.store(value, byte_pointer(ctx, base, combine_offset(ctx, thread, constant)), align=width * bits // 8)


# -- ldmatrix --------------------------------------------------------------------------------------------

def _ldmatrix(ctx, count: int, trans: bool, pointer):
    name = f"llvm.nvvm.ldmatrix.sync.aligned.m8n8.x{count}{'.trans' if trans else ''}.b16"
    result = T.i32 if count == 1 else ir.LiteralStructType([T.i32] * count)
    fn = T.declare_intrinsic(ctx.module, name, result, [T.pointer(3)])
    call = ctx.builder.call(fn, [pointer])
    return [call] if count == 1 else [ctx.builder.extract_value(call, q) for q in range(count)]


def _split_word(ctx, word, element):
    b = ctx.builder
    pair = b.bitcast(word, ir.VectorType(T.llvm_type(element), 2))
    return [b.extract_element(pair, ir.Constant(T.i32, i)) for i in range(2)]


class OperandLoader:
    """Reads an mma operand (layout `operand`) from a shared tile laid out as `shared` with ldmatrix.

    `load(ctx, base, registers, k_slice)` fills, in the list `registers`, the thread's operand
    registers of one 16-wide K slice from the tile at `base` (a `ptr addrspace(3)`). The per-thread
    part of the addresses is computed once in the prologue.
    """

    def __init__(self, operand, shared, element):
        self.operand = operand
        self.shared = shared
        self.element = element
        self.plan = ldmatrix_plan(operand, shared, element.bits)

    @property
    def tile_bytes(self) -> int:
        return self.operand.numel * self.element.bits // 8

    def load(self, ctx, base, registers: list, k_slice: int) -> None:
        plan, size = self.plan, self.element.bits // 8
        thread = thread_offset(ctx, [o * size for o in plan.lane_offsets], [o * size for o in plan.warp_offsets])
        for instruction in plan.slice(k_slice):
            pointer = byte_pointer(ctx, base, combine_offset(ctx, thread, instruction.offset * size))
            for register, word in zip(instruction.registers, _ldmatrix(ctx, plan.count, plan.trans, pointer)):
                registers[register], registers[register + 1] = _split_word(ctx, word, self.element)


def operand_loader(operand, shared, element):
    """The loader of an mma operand in layout `operand` from the tile `shared`: ldmatrix for 16-bit
    elements (`OperandLoader`), ld.shared for the float32 operands of a tf32 dot (`mma_tf32.py`)."""
    if element == float32:
        return Tf32OperandLoader(operand, shared, element)
    return OperandLoader(operand, shared, element)


class StagedOperand:
    """A dot operand that lives in a shared tile; the dot reads it slice by slice with ldmatrix
    (interleaved with its mmas, which keeps only one K slice of the operands in registers).

    `base` is the tile's `ptr addrspace(3)`, or None while the tile still has to be written from
    `source` registers (a `convert_layout {dot_operand}`: the dot stages its operands together).
    Only the `dot` that the layout or pipelining pass made its user reads this value.
    """

    def __init__(self, loader: OperandLoader, base=None, source=None, source_layout=None):
        self.loader = loader
        self.base = base
        self.source = source
        self.source_layout = source_layout


def operand_tile(shape, source_layout, element) -> object:
    """The shared tile layout for staging a dot operand of `shape` stored from `source_layout`: the
    tile is contiguous along the dim the source holds as vectors (so the stores are 16-byte)."""
    return mma_operand_shared(shape, element.bits, contiguous_dim(source_layout, element.bits))


def can_stage_operand(op) -> bool:
    """Whether a dot-operand `convert_layout` can go through a staged tile (16-bit elements, or the float32
    operands of a tf32 dot: only tensor-core dots mark their operand conversions)."""
    return op.attrs.get("dot_operand") is not None and (op.result.type.element in _MMA_INTRINSIC
                                                        or op.result.type.element == float32)


def convert_to_dot_operand(ctx, op) -> None:
    """Lower `convert_layout {dot_operand}`: record the staging; the dot writes the tile. A shared
    target layout is a wgmma operand (`wgmma.py`), a distributed one an mma.sync operand."""
    if is_shared_layout(op.result.layout):
        from .wgmma import convert_to_wgmma_operand
        convert_to_wgmma_operand(ctx, op)
        return
    source = op.operands[0]
    element = op.result.type.element
    shared = operand_tile(tuple(op.result.type.shape), source.layout, element)
    loader = operand_loader(op.result.layout, shared, element)
    ctx.set(op.result, StagedOperand(loader, source=ctx.get(source), source_layout=source.layout))


def _stage(ctx, operands) -> None:
    """Write the tiles of the operands still in registers into scratch: barrier, stores, barrier."""
    pending = [o for o in operands if isinstance(o, StagedOperand) and o.base is None]
    if not pending:
        return
    reserve(ctx, sum(o.loader.tile_bytes for o in pending))
    barrier(ctx)
    offset = 0
    for staged in pending:
        base = byte_pointer(ctx, scratch_base(ctx), ir.Constant(T.i32, offset))
        loader = staged.loader
        store_tile(ctx, staged.source, staged.source_layout, loader.shared, loader.element, base)
        staged.base, staged.source = base, None
        offset += loader.tile_bytes
    barrier(ctx)


# -- mma.sync --------------------------------------------------------------------------------------------

def _pack(ctx, low, high, element):
    b = ctx.builder
    pair_type = ir.VectorType(T.llvm_type(element), 2)
    pair = b.insert_element(ir.Constant(pair_type, ir.Undefined), low, ir.Constant(T.i32, 0))
    pair = b.insert_element(pair, high, ir.Constant(T.i32, 1))
    return b.bitcast(pair, T.i32) if element == bfloat16 else pair


def mma_schedule(m: int, n: int, k: int, num_warps: int) -> list:
    """The mma.sync instructions of an (M, N, K) dot, in issue order: tuples (kk, a_registers (8),
    b_registers (4), acc_registers (4)) of thread-local register indices (fragment elements a0..a7,
    b0..b3, c0..c3 of PTX ISA 9.7.14.5.8), K slice by K slice."""
    wm, wn = mma_warps((m, n), num_warps)
    rep_m, rep_n, rep_k = max(1, m // (16 * wm)), max(1, n // (8 * wn)), k // 16
    out = []
    for kk in range(rep_k):
        for i in range(rep_m):
            for j in range(rep_n):
                out.append((kk, tuple(e + 8 * (kk + rep_k * i) for e in range(8)),
                            tuple(e + 4 * (kk + rep_k * j) for e in range(4)),
                            tuple(c + 4 * (j + rep_n * i) for c in range(4))))
    return out


def lower_mma_dot(ctx, op) -> None:
    """`dot` with A, B and the accumulator in the mma layouts (see the module docstring)."""
    a, b_operand, acc = op.operands
    expected = mma_dot_layouts(op, ctx.num_warps)
    if (a.layout, b_operand.layout, acc.layout) != expected:
        raise CompilationError("internal error: a tensor-core dot whose operands are not in the mma layouts", op.loc)
    if not ctx.arch_at_least(80):
        raise CompilationError(f"internal error: mma.sync needs sm_80+, the target is {ctx.arch}", op.loc)
    element = a.type.element
    m, k = a.type.shape
    n = acc.type.shape[1]
    a_value, b_value, acc_regs = ctx.get(a), ctx.get(b_operand), list(ctx.get(acc))
    _stage(ctx, (a_value, b_value))
    a_regs = [None] * a.layout.num_registers if isinstance(a_value, StagedOperand) else a_value
    b_regs = [None] * b_operand.layout.num_registers if isinstance(b_value, StagedOperand) else b_value
    tf32 = element == float32
    if tf32:        # m16n8k8: each operand register rounded to one .b32 tf32 word (mma_tf32.py)
        fn = declare_mma_tf32(ctx)
        schedule = mma_tf32_schedule(m, n, k, ctx.num_warps)
    else:
        operand_type = T.i32 if element == bfloat16 else ir.VectorType(T.f16, 2)
        fn = T.declare_intrinsic(ctx.module, _MMA_INTRINSIC[element], ir.LiteralStructType([T.f32] * 4),
                                 [operand_type] * 6 + [T.f32] * 4)
        schedule = mma_schedule(m, n, k, ctx.num_warps)
    bld = ctx.builder
    words: dict = {}
    loaded_slice = None

    def pack(regs, registers):
        key = (id(regs), registers[0])
        if key not in words:
            if tf32:
                words[key] = [round_to_tf32(ctx, regs[r]) for r in registers]
            else:
                words[key] = [_pack(ctx, regs[r], regs[r + 1], element) for r in registers[::2]]
        return words[key]

    for kk, a_registers, b_registers, acc_registers in schedule:
        if kk != loaded_slice:     # ldmatrix one K slice of the staged operands, just before its mmas
            for value, regs in ((a_value, a_regs), (b_value, b_regs)):
                if isinstance(value, StagedOperand):
                    value.loader.load(ctx, value.base, regs, kk)
            loaded_slice = kk
        first = acc_registers[0]
        result = bld.call(fn, pack(a_regs, a_registers) + pack(b_regs, b_registers) + acc_regs[first:first + 4])
        acc_regs[first:first + 4] = [bld.extract_value(result, c) for c in range(4)]
    ctx.set(op.result, acc_regs)
