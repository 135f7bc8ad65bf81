"""Warpgroup tensor-core lowering (sm_90a): `dot` on `wgmma.mma_async.sync.aligned.m64nNk16.f32.{f16,bf16}`
with both operands read from shared memory through matrix descriptors.

Layouts come from the layout pass (`passes/dot_layouts.py`): the accumulator is in
`layouts.mma.wgmma_accumulator` (register d + (N/2) * (j + repN * i) is element d of the
instruction tile (i, j) of this warpgroup; warp bits 0-1 are the warp in its warpgroup, higher warp
bits the warpgroup), and A and B are *shared* layouts, canonical wgmma tiles
(`layouts.mma_shared.wgmma_operand_shared`, 32/64/128-byte swizzle, K-major or M/N-major). An
operand reaches the dot as a `SharedOperand`: a ring slot of the cp.async pipeline (`local_load`,
`async_copy.py`; its base is computed at run time from the slot index) or registers still to be
staged (`convert_layout {dot_operand}`): the dot then stores them into scratch tiles with st.shared,
`fence.proxy.async.shared::cta`, and a CTA barrier. wgmma reads shared memory through the async
proxy, st.shared and cp.async write it through the generic proxy, and the PTX ISA asks for that
proxy fence between the two (wgmma section "async proxy"; the memory model's proxy rules). Whether
cp.async (non-bulk) counts as a generic-proxy write is not spelled out where wgmma is described:
we assume it does and fence after `cp.async.wait_group` too (`async_copy.py`), which is cheap.

One dot is (PTX ISA 9.7.15.5 "Asynchronous Warpgroup Level Matrix Multiply-Accumulate"):
    wgmma.fence.sync.aligned                 accumulator registers written by other instructions
    wgmma.mma_async ... (per K step of 16, per M/N instruction tile)   imm-trans-a/b = M/N-major
    wgmma.commit_group.sync.aligned
    wgmma.wait_group.sync.aligned N          N = the dot's `pending` attr (0: results ready)
The fence and the wait are inline asm that take and return every accumulator register (tied), so
LLVM cannot move a read or write of them across (the intrinsics would not order them).

Descriptors (PTX ISA 9.7.15.5.1.2.2): the constant part (LBO, SBO, swizzle mode) comes from
`WgmmaOperandTile`; the start address is the tile's run-time base >> 4, plus per warpgroup and per
instruction the byte offset >> 4 of its sub-tile (computed once: those start on swizzle pattern
boundaries, so the offsets add without carries; shared addresses are below 2**18). Tiles start on a
1024-byte boundary (the dynamic shared buffer is declared `.align 1024` and wgmma tiles are placed
at multiples of 1024), so the descriptor's base offset is 0: the ISA ties the swizzle pattern to
address bits ("base offset is 0 when the repeating pattern starts on a 1024/512/256-byte boundary"),
and our stores swizzle by offset within the tile, so the two agree only on such boundaries. Later
instructions' descriptors advance the start address inside a swizzle row (K-major: +32, +64, +96
bytes), where the hardware keeps XOR-ing address bits 4-6 with bits 7-9 of the row (as CUTLASS's
descriptor iteration does); tests/test_wgmma.py simulates exactly that model.
"""

from __future__ import annotations

import dataclasses

from llvmlite import ir

from ..errors import CompilationError
from ..ir import OpCode
from ..language.dtypes import bfloat16, float16
from ..layouts.linear import LANE, REGISTER, WARP
from ..layouts.mma_shared import WGMMA_K, WgmmaOperandTile, wgmma_operand_tile
from ..target import llvm_types as T
from .mma import byte_pointer, store_tile, thread_offset
from .registry import lowering
from .shared import align_shared_memory, barrier, reserve, shared_base

WGMMA_ALIGN = 1024            # the 128-byte swizzle's pattern: tiles start on such a boundary
_TYPE_NAME = {float16: "f16", bfloat16: "bf16"}
# The accumulator fragment of m64nNk16 (PTX ISA 9.7.15.5.1.1.1, Figure 149), as layout bases:
# registers d0, d1 step the column, d2 the row by 8, d4.. the column by 8, 16, ...; lanes: the
# thread in its group of 4 steps the column by 2, the group the row; the warp the row by 16.
_FRAGMENT_LANES = ((0, 2), (0, 4), (1, 0), (2, 0), (4, 0))
_FRAGMENT_WARPS = ((16, 0), (32, 0))


# -- the plan (pure Python, tested against the PTX ISA's definitions) -----------------------------------

@dataclasses.dataclass(frozen=True)
class WgmmaInstruction:
    """One wgmma.mma_async of warpgroup 0: the byte offsets in the A and B tiles of its sub-tiles'
    first elements and its accumulator registers first_register .. first_register + N/2 - 1."""

    k_slice: int
    a_offset: int
    b_offset: int
    first_register: int


@dataclasses.dataclass(frozen=True)
class WgmmaPlan:
    """The wgmma instructions of a dot, for warpgroup 0; a thread of another warpgroup adds the XOR
    of `a_warp_offsets[b]` (and `b_warp_offsets[b]`) of its set warp bits b to the offsets."""

    instr_n: int
    a: WgmmaOperandTile
    b: WgmmaOperandTile
    a_warp_offsets: tuple
    b_warp_offsets: tuple
    instructions: tuple


def _check_fragment(accumulator) -> int:
    """log2(N/2) of the instruction whose fragment `accumulator` repeats; ValueError otherwise."""
    registers, lanes, warps = (accumulator.bases_of(d) for d in (REGISTER, LANE, WARP))
    low = 2          # the instruction's N is the columns the fragment bits cover, at most 256
    while low < min(len(registers), 7) and registers[low] == (0, 8 << (low - 2)):
        low += 1
    if registers[:2] != ((0, 1), (8, 0)) or lanes != _FRAGMENT_LANES or warps[:2] != _FRAGMENT_WARPS:
        raise ValueError(f"not a wgmma accumulator layout: {accumulator!r}")
    return low


def wgmma_plan(a_shared, b_shared, accumulator, element_bits: int = 16) -> WgmmaPlan:
    """The wgmma instructions computing accumulator (M x N, `layouts.mma.wgmma_accumulator`) +=
    A (M x K, tile `a_shared`) @ B (K x N, tile `b_shared`), K step by K step.

    Raises ValueError when the layouts are not a wgmma accumulator and canonical wgmma tiles."""
    a, b = wgmma_operand_tile(a_shared, 0, element_bits), wgmma_operand_tile(b_shared, 1, element_bits)
    k = a_shared.shape[1]
    low = _check_fragment(accumulator)
    per_instruction = 1 << low
    instr_n = per_instruction * 2
    warp_a, warp_b = [], []
    for row, col in accumulator.bases_of(WARP)[2:]:
        warp_a.append(a.byte_offset((row, 0)))
        warp_b.append(b.byte_offset((0, col)))
    instructions = []
    for kk in range(k // WGMMA_K):
        for tile in range(accumulator.num_registers // per_instruction):
            row, col = accumulator.apply(register=tile * per_instruction)
            instructions.append(WgmmaInstruction(kk, a.byte_offset((row, kk * WGMMA_K)),
                                                 b.byte_offset((kk * WGMMA_K, col)), tile * per_instruction))
    return WgmmaPlan(instr_n, a, b, tuple(warp_a), tuple(warp_b), tuple(instructions))


# -- operands in shared memory ---------------------------------------------------------------------------

class SharedOperand:
    """A wgmma operand that lives in a shared tile laid out as `shared` (a canonical wgmma tile).

    `base` is the tile's `ptr addrspace(3)`, or None while the tile still has to be written from
    `source` registers in `source_layout` (a `convert_layout {dot_operand}`: the dot stages its
    operands together). Only the `dot` that the layout or pipelining pass made its user reads it.
    """

    def __init__(self, shared, base=None, source=None, source_layout=None):
        self.shared = shared
        self.base = base
        self.source = source
        self.source_layout = source_layout


def convert_to_wgmma_operand(ctx, op) -> None:
    """Lower `convert_layout {dot_operand}` to a shared layout: record the staging; the dot writes
    the tile."""
    source = op.operands[0]
    ctx.set(op.result, SharedOperand(op.result.layout, source=ctx.get(source), source_layout=source.layout))


def _fence_proxy_async(ctx) -> None:
    fn = T.declare_intrinsic(ctx.module, "llvm.nvvm.fence.proxy.async.shared_cta", T.void, [],
                             attributes=("convergent", "nounwind"))
    ctx.builder.call(fn, [])


def fence_generic_to_async(ctx) -> None:
    """`fence.proxy.async.shared::cta`: this thread's generic-proxy writes to shared memory (st.shared,
    cp.async) become visible to async-proxy reads (wgmma) ordered after it, e.g. by a barrier."""
    _fence_proxy_async(ctx)


def _stage(ctx, operands, element) -> None:
    """Write the tiles of the operands still in registers into scratch (each on a 1024-byte
    boundary): barrier, st.shared, fence.proxy.async, barrier."""
    pending = [o for o in operands if o.base is None]
    if not pending:
        return
    size = element.bits // 8
    start = -ctx.scratch_offset % WGMMA_ALIGN
    offsets, end = [], start
    for staged in pending:
        offsets.append(end)
        end += -(-staged.shared.numel * size // WGMMA_ALIGN) * WGMMA_ALIGN
    reserve(ctx, end)
    align_shared_memory(ctx, WGMMA_ALIGN)
    barrier(ctx)
    for staged, offset in zip(pending, offsets):
        base = byte_pointer(ctx, shared_base(ctx), ir.Constant(T.i32, ctx.scratch_offset + offset))
        store_tile(ctx, staged.source, staged.source_layout, staged.shared, element, base)
        staged.base, staged.source = base, None
    _fence_proxy_async(ctx)
    barrier(ctx)


# -- the instructions ------------------------------------------------------------------------------------

def _tied_asm(ctx, asm: str, registers: list) -> list:
    """Inline asm `asm` that takes and returns `registers` (f32, tied in place): an ordering point
    for them that emits only `asm`."""
    count = len(registers)
    struct = ir.LiteralStructType([T.f32] * count)
    constraints = ",".join(["=f"] * count + [str(i) for i in range(count)])
    call = T.inline_asm(ctx.builder, asm, constraints, registers, struct, convergent=True)
    return [ctx.builder.extract_value(call, i) for i in range(count)]


def wgmma_fence(ctx, registers: list) -> list:
    """`wgmma.fence.sync.aligned`, after every write of `registers` by other instructions."""
    return _tied_asm(ctx, "wgmma.fence.sync.aligned;", registers)


def wgmma_wait(ctx, registers: list, pending: int) -> list:
    """`wgmma.wait_group.sync.aligned pending`: at most `pending` groups of this warpgroup's wgmmas
    stay in flight; reads of `registers` (the results) come after it."""
    return _tied_asm(ctx, f"wgmma.wait_group.sync.aligned {int(pending)};", registers)


def _commit(ctx) -> None:
    fn = T.declare_intrinsic(ctx.module, "llvm.nvvm.wgmma.commit_group.sync.aligned", T.void, [],
                             attributes=("convergent", "nounwind"))
    ctx.builder.call(fn, [])


def _descriptor(ctx, base, tile: WgmmaOperandTile, warp_offsets: tuple):
    """The i64 descriptor of warpgroup-local offset 0 of the tile at `base` (run time)."""
    b = ctx.builder
    address = b.ptrtoint(base, T.i32)
    start = b.and_(b.lshr(address, ir.Constant(T.i32, 4)), ir.Constant(T.i32, 0x3FFF))
    if any(warp_offsets):
        group, _ = thread_offset(ctx, (), (0, 0) + tuple(warp_offsets))
        start = b.add(start, b.lshr(group, ir.Constant(T.i32, 4)))
    return b.or_(b.zext(start, T.i64), ir.Constant(T.i64, tile.descriptor_fields()))


def _mma_async(ctx, instr_n: int, type_name: str, trans_a: int, trans_b: int, desc_a, desc_b, scale, registers):
    count = len(registers)
    outputs = ", ".join(f"${i}" for i in range(count))
    asm = ("{\n.reg .pred p;\n"
           f"setp.ne.b32 p, ${count + 2}, 0;\n"
           f"wgmma.mma_async.sync.aligned.m64n{instr_n}k16.f32.{type_name}.{type_name} "
           f"{{{outputs}}}, ${count}, ${count + 1}, p, 1, 1, {trans_a}, {trans_b};\n}}")
    constraints = ",".join(["=f"] * count + ["l", "l", "r"] + [str(i) for i in range(count)])
    struct = ir.LiteralStructType([T.f32] * count)
    call = T.inline_asm(ctx.builder, asm, constraints, [desc_a, desc_b, scale] + list(registers), struct,
                        convergent=True)
    return [ctx.builder.extract_value(call, i) for i in range(count)]


def lower_wgmma_dot(ctx, op) -> None:
    """`dot` with A and B in canonical wgmma tiles and the accumulator in the wgmma layout (see the
    module docstring). The dot's attr `pending` (default 0) is the wait_group count after it."""
    a, b_operand, acc = op.operands
    if ctx.arch != "sm_90a":
        raise CompilationError(f"internal error: wgmma needs sm_90a, the target is {ctx.arch}", op.loc)
    element = a.type.element
    a_value, b_value = ctx.get(a), ctx.get(b_operand)
    if not isinstance(a_value, SharedOperand) or not isinstance(b_value, SharedOperand):
        raise CompilationError("internal error: wgmma operands must be in shared memory", op.loc)
    try:
        plan = wgmma_plan(a.layout, b_operand.layout, acc.layout, element.bits)
    except ValueError as error:
        raise CompilationError(f"internal error: {error}", op.loc) from None
    _stage(ctx, (a_value, b_value), element)
    registers = wgmma_fence(ctx, list(ctx.get(acc)))
    desc_a = _descriptor(ctx, a_value.base, plan.a, plan.a_warp_offsets)
    desc_b = _descriptor(ctx, b_value.base, plan.b, plan.b_warp_offsets)
    b = ctx.builder
    per_instruction = plan.instr_n // 2
    scale = ir.Constant(T.i32, 1)
    for instruction in plan.instructions:
        first = instruction.first_register
        result = _mma_async(ctx, plan.instr_n, _TYPE_NAME[element], int(plan.a.mn_major), int(plan.b.mn_major),
                            b.add(desc_a, ir.Constant(T.i64, instruction.a_offset >> 4)),
                            b.add(desc_b, ir.Constant(T.i64, instruction.b_offset >> 4)), scale,
                            registers[first:first + per_instruction])
        registers[first:first + per_instruction] = result
    _commit(ctx)
    ctx.set(op.result, wgmma_wait(ctx, registers, op.attrs.get("pending", 0)))


@lowering(OpCode.WGMMA_WAIT)
def _wgmma_wait(ctx, op):
    """`wgmma_wait {pending}` on the results of dots left in flight (a pipelined loop's accumulator)."""
    values = [list(ctx.get(v)) for v in op.operands]
    flat = wgmma_wait(ctx, [r for registers in values for r in registers], op.attrs["pending"])
    start = 0
    for result, registers in zip(op.results, values):
        ctx.set(result, flat[start:start + len(registers)])
        start += len(registers)
