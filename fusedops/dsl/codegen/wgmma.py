"""Warpgroup tensor-core lowering (sm_90a): `dot` on `wgmma.mma_async.sync.aligned.m64nNk16.f32.{f16,bf16}`
with B (and A) read from shared memory through matrix descriptors, or A from registers.

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

A from registers (`dot_layouts.wgmma_register_a`: attention's P and Q): A is a list of registers in
`layouts.mma.wgmma_operand_a`; each instruction takes the four .f16x2 (.b32) registers a0..a3 of
its 64x16 sub-tile (PTX ISA 9.7.15.5.1.1.1, the A fragment of .m64nNk16):
    wgmma.mma_async.sync.aligned.m64nNk16.f32.f16.f16 {d..}, {a0, a1, a2, a3}, b-desc, p, 1, 1, trans-b;
(no imm-trans-a: a register A is K-major by definition). Nothing is staged for A, so a dot whose B
comes from the cp.async ring has no st.shared and no barrier of its own. The A registers are tied
through `wgmma.fence` like the accumulator: the ISA asks for the fence between any register write
and a wgmma that reads that register as A (not only as accumulator).

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
    a_registers: tuple = ()     # A from registers: the 8 registers (a0..a7) of its A sub-tile


@dataclasses.dataclass(frozen=True)
class WgmmaPlan:
    """The wgmma instructions of a dot, for warpgroup 0; a thread of another warpgroup adds the XOR
    of `a_warp_offsets[b]` (and `b_warp_offsets[b]`) of its set warp bits b to the offsets."""

    instr_n: int
    a: object                   # WgmmaOperandTile, or None for A from registers
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


def _register_a_fragment(a_layout, accumulator) -> dict:
    """{(row, col): register} of warpgroup 0's lane 0, warp 0 for a register A in `a_layout`
    (`layouts.mma.wgmma_operand_a`); ValueError when the lanes and warps are not the A fragment's."""
    lanes, warps = a_layout.bases_of(LANE), a_layout.bases_of(WARP)
    if lanes != _FRAGMENT_LANES or warps[:2] != _FRAGMENT_WARPS \
            or [w[0] for w in warps[2:]] != [w[0] for w in accumulator.bases_of(WARP)[2:]]:
        raise ValueError(f"not a wgmma A fragment layout for this accumulator: {a_layout!r}")
    out = {}
    for register in range(a_layout.num_registers):
        out.setdefault(a_layout.apply(register=register), register)
    if len(out) != a_layout.num_registers:
        raise ValueError(f"a wgmma A fragment layout with repeated registers: {a_layout!r}")
    return out


def wgmma_plan(a_shared, b_shared, accumulator, element_bits: int = 16) -> WgmmaPlan:
    """The wgmma instructions computing accumulator (M x N, `layouts.mma.wgmma_accumulator`) +=
    A (M x K, tile `a_shared`, or registers in `layouts.mma.wgmma_operand_a`) @ B (K x N, tile
    `b_shared`), K step by K step.

    Raises ValueError when the layouts are not a wgmma accumulator, canonical wgmma tiles and an A
    fragment."""
    from ..layouts.mma_shared import is_shared_layout
    register_a = not is_shared_layout(a_shared)
    b = wgmma_operand_tile(b_shared, 1, element_bits)
    a = None if register_a else wgmma_operand_tile(a_shared, 0, element_bits)
    fragment = _register_a_fragment(a_shared, accumulator) if register_a else None
    k = a_shared.shape[1]
    low = _check_fragment(accumulator)
    per_instruction = 1 << low
    instr_n = per_instruction * 2
    warp_a, warp_b = [], []
    for row, col in accumulator.bases_of(WARP)[2:]:
        warp_a.append(0 if register_a else a.byte_offset((row, 0)))
        warp_b.append(b.byte_offset((0, col)))
    instructions = []
    for kk in range(k // WGMMA_K):
        for tile in range(accumulator.num_registers // per_instruction):
            row, col = accumulator.apply(register=tile * per_instruction)
            registers = ()
            if register_a:     # a0..a7: rows +8 * ((e >> 1) & 1), columns (e & 1) + 8 * (e >> 2)
                registers = tuple(fragment[(row + 8 * (e >> 1 & 1), kk * WGMMA_K + (e & 1) + 8 * (e >> 2))]
                                  for e in range(8))
                if any(registers[e] % 2 or registers[e + 1] != registers[e] + 1 for e in range(0, 8, 2)):
                    raise ValueError(f"the A pairs of a wgmma are not register pairs: {a_shared!r}")
            instructions.append(WgmmaInstruction(kk, 0 if register_a else a.byte_offset((row, kk * WGMMA_K)),
                                                 b.byte_offset((kk * WGMMA_K, col)), tile * per_instruction,
                                                 registers))
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

def _tied_asm(ctx, asm: str, registers: list, words=()) -> tuple:
    """Inline asm `asm` that takes and returns `registers` (f32) and `words` (i32), tied in place:
    an ordering point for them that emits only `asm`. Returns (registers, words) after it."""
    count, words = len(registers), list(words)
    total = count + len(words)
    if total == 0:
        T.inline_asm(ctx.builder, asm, "", [], convergent=True)
        return [], []
    struct = ir.LiteralStructType([T.f32] * count + [T.i32] * len(words))
    constraints = ",".join(["=f"] * count + ["=r"] * len(words) + [str(i) for i in range(total)])
    call = T.inline_asm(ctx.builder, asm, constraints, list(registers) + words, struct, convergent=True)
    out = [ctx.builder.extract_value(call, i) for i in range(total)]
    return out[:count], out[count:]


def wgmma_fence(ctx, registers: list, words=()) -> tuple:
    """`wgmma.fence.sync.aligned`, after every write of `registers` (accumulators) and `words` (A
    fragment registers) by other instructions: returns them (registers, words) after it."""
    return _tied_asm(ctx, "wgmma.fence.sync.aligned;", registers, words)


def wgmma_wait(ctx, registers: list, pending: int, words=()) -> list:
    """`wgmma.wait_group.sync.aligned pending`: at most `pending` groups of this warpgroup's wgmmas
    stay in flight; reads of `registers` (the results) come after it, and `words` (the A fragment
    registers of the wgmmas it retires) stay live until it, so that nothing is written into them while a
    wgmma may still read them (PTX ISA 9.7.15.5.2: undefined; ptxas would serialize every wgmma, C7513)."""
    return _tied_asm(ctx, f"wgmma.wait_group.sync.aligned {int(pending)};", registers, words)[0]


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


def _mma_async(ctx, instr_n: int, type_name: str, trans_a: int, trans_b: int, desc_a, desc_b, registers,
               a_words=None, count=None):
    """One wgmma.mma_async on `registers` (the accumulator); A through `desc_a`, or from the four
    .b32 registers `a_words` (then desc_a and trans_a are unused). registers None: a zero accumulator
    of `count` registers, which the instruction does not read (scale-d false: D = A B, PTX ISA 9.7.15.5.2),
    so that no register is zeroed or kept for it before the instruction."""
    fresh = registers is None
    count = count if fresh else len(registers)
    scale = ir.Constant(T.i32, 0 if fresh else 1)
    outputs = ", ".join(f"${i}" for i in range(count))
    name = f"wgmma.mma_async.sync.aligned.m64n{instr_n}k16.f32.{type_name}.{type_name}"
    if a_words is None:
        inputs = [desc_a, desc_b, scale]
        asm = ("{\n.reg .pred p;\n"
               f"setp.ne.b32 p, ${count + 2}, 0;\n"
               f"{name} {{{outputs}}}, ${count}, ${count + 1}, p, 1, 1, {trans_a}, {trans_b};\n}}")
        constraints = ["l", "l", "r"]
    else:
        inputs = list(a_words) + [desc_b, scale]
        a_operands = ", ".join(f"${count + i}" for i in range(4))
        asm = ("{\n.reg .pred p;\n"
               f"setp.ne.b32 p, ${count + 5}, 0;\n"
               f"{name} {{{outputs}}}, {{{a_operands}}}, ${count + 4}, p, 1, 1, {trans_b};\n}}")
        constraints = ["r"] * 4 + ["l", "r"]
    constraints = ",".join(["=f"] * count + constraints + ([] if fresh else [str(i) for i in range(count)]))
    struct = ir.LiteralStructType([T.f32] * count)
    call = T.inline_asm(ctx.builder, asm, constraints, inputs + ([] if fresh else list(registers)), struct,
                        convergent=True)
    return [ctx.builder.extract_value(call, i) for i in range(count)]


def _zero_accumulator(registers: list) -> bool:
    """Whether an accumulator's registers are all the constant 0 (+0 or -0: A B + -0 is A B)."""
    return all(isinstance(r, ir.Constant) and r.constant == 0.0 for r in registers)


def _pack_words(ctx, registers: list, element) -> list:
    """The .b32 words (pairs 2p, 2p+1 as .f16x2 / .bf16x2) of 16-bit `registers`."""
    b = ctx.builder
    pair_type = ir.VectorType(T.llvm_type(element), 2)
    words = []
    for p in range(0, len(registers), 2):
        pair = b.insert_element(ir.Constant(pair_type, ir.Undefined), registers[p], ir.Constant(T.i32, 0))
        pair = b.insert_element(pair, registers[p + 1], ir.Constant(T.i32, 1))
        words.append(b.bitcast(pair, T.i32))
    return words


def lower_wgmma_dot(ctx, op) -> None:
    """`dot` with B (and A) in canonical wgmma tiles or A in registers, and the accumulator in the
    wgmma layout (see the module docstring). The dot's attr `pending` (default 0) is the wait_group
    count after it; with attr `deferred` no wait follows it (a later `wgmma_wait` op retires it)."""
    a, b_operand, acc = op.operands
    if ctx.arch != "sm_90a":
        raise CompilationError(f"internal error: wgmma needs sm_90a, the target is {ctx.arch}", op.loc)
    element = a.type.element
    a_value, b_value = ctx.get(a), ctx.get(b_operand)
    register_a = not isinstance(a_value, SharedOperand)
    if not isinstance(b_value, SharedOperand):
        raise CompilationError("internal error: the wgmma B operand must be in shared memory", op.loc)
    try:
        plan = wgmma_plan(a.layout, b_operand.layout, acc.layout, element.bits)
    except ValueError as error:
        raise CompilationError(f"internal error: {error}", op.loc) from None
    _stage(ctx, (b_value,) if register_a else (a_value, b_value), element)
    packed = _pack_words(ctx, list(a_value), element) if register_a else []
    registers = list(ctx.get(acc))
    zero = _zero_accumulator(registers)
    fenced, words = wgmma_fence(ctx, [] if zero else registers, packed)
    registers = [None] * len(registers) if zero else fenced
    # the wait that retires this dot keeps the A registers (before and after the fence, which ties them)
    # live up to it: a register reused for the next value while the wgmma reads it serializes every wgmma
    a_registers = packed + words
    desc_a = None if register_a else _descriptor(ctx, a_value.base, plan.a, plan.a_warp_offsets)
    desc_b = _descriptor(ctx, b_value.base, plan.b, plan.b_warp_offsets)
    b = ctx.builder
    per_instruction = plan.instr_n // 2
    for instruction in plan.instructions:      # (the first k-step's instructions come first: wgmma_plan)
        first = instruction.first_register
        a_words = [words[r // 2] for r in instruction.a_registers[::2]] if register_a else None
        accumulator = registers[first:first + per_instruction]
        result = _mma_async(ctx, plan.instr_n, _TYPE_NAME[element], 0 if register_a else int(plan.a.mn_major),
                            int(plan.b.mn_major),
                            None if register_a else b.add(desc_a, ir.Constant(T.i64, instruction.a_offset >> 4)),
                            b.add(desc_b, ir.Constant(T.i64, instruction.b_offset >> 4)),
                            None if accumulator[0] is None else accumulator, a_words, per_instruction)
        registers[first:first + per_instruction] = result
    _commit(ctx)
    if op.attrs.get("deferred"):       # passes/wgmma_waits.py: a later wgmma_wait retires it
        ctx.set(op.result, registers)
        ctx.wgmma_a_words[id(op.result)] = a_registers
    else:
        ctx.set(op.result, wgmma_wait(ctx, registers, op.attrs.get("pending", 0), a_registers))


@lowering(OpCode.WGMMA_WAIT)
def _wgmma_wait(ctx, op):
    """`wgmma_wait {pending}` on the results of dots left in flight (a pipelined loop's accumulator, the
    deferred dots of passes/wgmma_waits.py)."""
    values = [list(ctx.get(v)) for v in op.operands]
    words = [w for v in op.operands for w in ctx.wgmma_a_words.pop(id(v), ())]
    flat = wgmma_wait(ctx, [r for registers in values for r in registers], op.attrs["pending"], words)
    start = 0
    for result, registers in zip(op.results, values):
        ctx.set(result, flat[start:start + len(registers)])
        start += len(registers)
