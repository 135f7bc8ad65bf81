"""Which engine a `dot` runs on, and the layouts of its operands and accumulator there (with the register
budget facts the engines share: REGISTERS_PER_SM, MAX_THREAD_REGISTERS, the producer warpgroup's PRODUCER_WARPS).

- Warpgroup tensor cores (`wgmma.mma_async.sync.aligned.m64nNk16.f32.{f16,bf16}`, sm_90a only, not
  with FUSEDOPS_DISABLE_WGMMA=1): float16/bfloat16 inputs, float32 accumulator, num_warps a
  multiple of 4 (warpgroups of 4 warps), M a multiple of 64 (64 rows per instruction and
  warpgroup), N >= 16, K a multiple of 16, and B loaded from global memory in the dot's own block
  (a `load` there, e.g. in the loop body: the pipelined ring, or st.shared staging when cp.async
  does not apply, puts it in shared memory, where wgmma reads it). A comes either
  - from shared memory too, when it is also loaded in the dot's block (the matmul), or
  - from registers (`wgmma_register_a`), when it is any other 16-bit block: attention's P (an
    accumulator cast to 16 bits: the accumulator fragment *is* the A fragment, no data moves) or
    a loop-invariant block loaded before the loop (Q: converted to the A layout once, before the
    loop, not staged into shared memory every iteration). This form needs the accumulator's
    warpgroups to tile M only (each holds the A rows it multiplies), and every dot of the block to
    qualify for wgmma: one dot left on mma.sync beside it would move its values between the wgmma
    and mma.sync layouts through shared memory every iteration.
  - from shared memory written once, before the loop (`wgmma_staged_a`), when it is a loop-invariant
    load (in a block enclosing the dot's loop) that register A does not take: its warpgroups tile
    N, or its fragment would take the registers per thread of the loop nest's carried accumulators
    and of the invariant fragments kept before it (in program order) past the kernel's register cap
    (`register_cap`) less REGISTER_A_HEADROOM (attention's dK/dV kernel at
    E = 128: dK and dV are 128 registers, K as a fragment 32 more, so V is read from shared memory;
    with both as fragments the per-block tiles spilled).
    The conversion to the wgmma tile is hoisted out of the loop (`hoisted`), and
    passes/invariant_operands.py fills a shared buffer from global memory once (cp.async) that
    every iteration's wgmma reads in place.
  - from shared memory written with st.shared at every iteration (`wgmma_staged_computed_a`), when it is
    computed in the dot's own block (not a load) and its warpgroups tile N, so that no A fragment holds
    it, while another dot of the block takes A from registers: left on mma.sync it would take that
    form from its neighbours (attention's dK/dV kernel adding dQ = dS K, 64 x 64 on 2 warpgroups, beside
    register-A S^T, dP^T, dV and dK).
  An operand may also be a `trans` of such a load (the attention backward's dS^T Q, dS K): `trans`
  relabels the load's registers, so the converted tile is contiguous along the dim the *load*
  reads as vectors (K-major or M/N-major for the transposed view, both of which wgmma reads for
  16-bit inputs: PTX ISA 9.7.15.5.1.2 "Shared Memory Matrix Layout"); such a tile is staged from
  registers with st.shared (the cp.async ring takes only a load whose single use is the dot, so
  a kernel that wants the ring loads the transposed view itself, as attention's backward does).
  Other dots stay on mma.sync. Warpgroups tile M
  first (up to M / 64), then N (each keeping an instruction N >= 16, at most 256); warpgroups left
  over hold copies. The accumulator takes `layouts.mma.wgmma_accumulator`; a register A takes
  `layouts.mma.wgmma_operand_a`; operands in shared memory stay there: their
  `convert_layout {dot_operand}` asks for the canonical wgmma tile (`layouts.mma_shared.
  wgmma_operand_shared`) contiguous along the dim the operand's own layout holds as vectors, i.e.
  the dim contiguous in global memory, so a transposed operand is read with the instruction's
  transpose bit instead of a transposing copy. The swizzle is the widest of 128/64/32 bytes that
  the tile's contiguous extent allows (for M/N-major operands: that one instruction reads).
- Tensor cores (`mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}`, sm_80+): float16/bfloat16 inputs,
  float32 accumulator, M >= 16, N >= 8, K >= 16. The accumulator takes the mma accumulator layout
  and A/B the mma operand layouts of `layouts.mma`, with the CTA's warps tiling (M, N).
- Tensor cores in tf32 (`mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32`, sm_80+, sm_90a too):
  float32 inputs with input_precision "tf32" (`is_tf32_dot`), float32 accumulator, M >= 16, N >= 8,
  K >= 8: the accumulator layout of mma.sync, A and B in the tf32 operand layouts of
  `layouts.mma_tf32` (codegen/mma.py reads them from the same swizzled tiles with ld.shared and
  rounds them with cvt.rna.tf32.f32). Never wgmma: its tf32 operands are K-major only and read from
  shared memory as they are (their low mantissa bits ignored, not rounded).
- Otherwise the FMA path (codegen/dot.py; A and B keep their layouts): exact float32/float64, int8,
  small blocks, and targets before sm_80.
"""

from __future__ import annotations

from typing import Optional

from ..ir import Block, Operation, OpCode
from ..language.dtypes import bfloat16, float16, float32, shape_of
from ..layouts.mma import (MMA_K, MMA_M, MMA_N, WARPGROUP_WARPS, WGMMA_M, WGMMA_MAX_N, mma_accumulator,
                           mma_operand_a, mma_operand_b, wgmma_accumulator, wgmma_operand_a,
                           wgmma_warpgroups_per_cta)
from ..layouts.mma_tf32 import MMA_TF32_K, mma_tf32_operand_a, mma_tf32_operand_b
from ..layouts.mma_shared import WGMMA_K, is_shared_layout, wgmma_operand_shared, wgmma_swizzle_bytes
from ..layouts.swizzle import contiguous_dim

TENSOR_CORE_INPUTS = (float16, bfloat16)


def arch_number(arch: Optional[str]) -> int:
    """"sm_90a" -> 90; None (no target: the FMA path everywhere) -> 0."""
    return int(arch[3:5]) if arch else 0


def is_tf32_dot(op: Operation) -> bool:
    """Whether `dot` op multiplies float32 inputs as tf32 (input_precision "tf32")."""
    return op.operands[0].type.element == float32 and op.attrs.get("input_precision") == "tf32"


def uses_tensor_cores(op: Operation, arch: Optional[str]) -> bool:
    """Whether `dot` op runs on mma.sync (16-bit or tf32) for `arch` (see the module docstring)."""
    a, _, acc = op.operands
    m, k = shape_of(a.type)
    n = shape_of(acc.type)[1]
    if is_tf32_dot(op):
        return arch_number(arch) >= 80 and m >= MMA_M and n >= MMA_N and k >= MMA_TF32_K
    return (arch_number(arch) >= 80 and a.type.element in TENSOR_CORE_INPUTS and acc.type.element == float32
            and m >= MMA_M and n >= MMA_N and k >= MMA_K)


# An instruction N of at least 16 keeps an N-major B tile swizzled (32 bytes of 16-bit elements).
WGMMA_MIN_N = 16


def wgmma_enabled(arch: Optional[str]) -> bool:
    """Whether dots may use wgmma on `arch`: sm_90a, unless FUSEDOPS_DISABLE_WGMMA=1 (read now; the
    compiler keys its cache on it)."""
    if arch != "sm_90a":
        return False
    from ..runtime import knobs
    return not knobs.current().disable_wgmma


def wgmma_instruction_n(shape, num_warps: int) -> Optional[int]:
    """The N of each wgmma instruction of an (M, N) accumulator on `num_warps` warps, or None when
    the shape does not fit wgmma (see the module docstring)."""
    m, n = shape
    if num_warps % WARPGROUP_WARPS or m % WGMMA_M or n < WGMMA_MIN_N:
        return None
    groups = num_warps // WARPGROUP_WARPS
    along_m = min(groups, m // WGMMA_M)
    along_n = min(groups // along_m, n // WGMMA_MIN_N)
    instr_n = min(WGMMA_MAX_N, n // along_n)
    if wgmma_warpgroups_per_cta(shape, num_warps, instr_n)[1] != along_n:
        return None
    return instr_n


def _loaded_beside(value, dot: Operation) -> bool:
    """Whether `value` is a `load` in the dot's own block (a loop body's per-iteration tile), or a
    2-D `trans` of one (a transposed view of such a tile: its tile is staged contiguous along the
    dim the load reads as vectors, K-major or M/N-major as that falls, see the module docstring)."""
    op = value.defining_op
    if op is not None and op.opcode == OpCode.TRANS and op.parent is dot.parent \
            and tuple(op.attrs.get("perm", (1, 0))) == (1, 0):
        op = op.operands[0].defining_op
    return op is not None and op.opcode == OpCode.LOAD and op.parent is dot.parent


def _loop_invariant_load(value, dot: Operation) -> Optional[Operation]:
    """The outermost op of the block holding `value`'s `load` that holds `dot` when that load is in
    an enclosing block, outside a `for` that holds the dot (a tile loaded once for the whole loop);
    else None."""
    load = value.defining_op
    if load is None or load.opcode != OpCode.LOAD or load.parent is dot.parent:
        return None
    anchor, crossed_loop = dot, False
    while anchor.parent is not None and anchor.parent is not load.parent:
        anchor = anchor.parent.parent
        if anchor is None:
            return None
        crossed_loop = crossed_loop or anchor.opcode == OpCode.FOR
    return anchor if anchor.parent is load.parent and crossed_loop else None


# Registers per thread that the accumulators carried by a loop nest and its loop-invariant register A
# fragments may take together: the kernel's register cap (`register_cap`: 255, or less where its threads
# or `dsl.launch_bounds` leave each thread less) less REGISTER_A_HEADROOM, which the tiles each iteration
# computes need beside them; the invariant A tiles that would go past it are read from shared memory
# (wgmma_staged_a). Up to 8 warps without launch bounds that is 160 of 255. (H200, attention dK/dV at
# E = 128: K in registers and V copied, against both copied: 1.5-5% faster backward but causal S = 4k, 3%
# slower there.)
REGISTER_A_HEADROOM = 95
# The registers of one SM (sm_80, sm_90), and the most one thread may use.
REGISTERS_PER_SM = 65536
MAX_THREAD_REGISTERS = 255
# The warps of the producer warpgroup (FUSEDOPS_WS=2, passes/_pipelining_warp_specialized.py): the launch adds
# them to the kernel's (codegen/kernel.py), and codegen/async_copy.py shares the register file out among them all.
PRODUCER_WARPS = 4


def thread_register_cap(threads: int) -> int:
    """The registers per thread ptxas may give each of `threads` threads resident on one SM at once: their
    share of its 65536, in whole 8s, at most 255."""
    return min(MAX_THREAD_REGISTERS, REGISTERS_PER_SM // threads // 8 * 8)


def register_cap(op: Operation, num_warps: int) -> int:
    """The registers per thread ptxas may give the kernel holding `op` (`thread_register_cap`): n CTAs of
    num_warps warps per SM, n from `dsl.launch_bounds(n)`, else 1 (the kernel's `.maxntid` alone: 128 at
    16 warps)."""
    while op.parent is not None and isinstance(op.parent.parent, Operation):
        op = op.parent.parent
    bounds = [nested.attrs["min_blocks_per_sm"] for root in (op.parent.ops if op.parent is not None else (op,))
              for nested in root.walk() if nested.opcode == OpCode.LAUNCH_BOUNDS]
    return thread_register_cap(max(bounds, default=1) * num_warps * 32)


def _through_conversions(value):
    while value.defining_op is not None and value.defining_op.opcode == OpCode.CONVERT_LAYOUT:
        value = value.defining_op.operands[0]
    return value


def _register_a_tiles(loop: Operation, num_warps: int) -> set:
    """The ids of the loop-invariant A tiles of `loop`'s dots that stay register fragments: in program
    order, while the accumulators the loop carries across iterations (a loop's block argument) and the
    fragments kept so far fit in the register cap less REGISTER_A_HEADROOM registers per thread."""
    threads = num_warps * 32
    budget = register_cap(loop, num_warps) - REGISTER_A_HEADROOM
    carried, tiles, seen = 0, [], set()
    for nested in loop.walk():
        if nested.opcode != OpCode.DOT:
            continue
        a, acc = (_through_conversions(v) for v in (nested.operands[0], nested.operands[2]))
        if isinstance(acc.owner, Block) and id(acc) not in seen:
            seen.add(id(acc))
            carried += _numel(acc) * acc.type.element.bits // 32 // threads
        if _loop_invariant_load(a, nested) is not None and id(a) not in seen:
            seen.add(id(a))
            tiles.append(a)
    kept = set()
    for tile in tiles:
        cost = _numel(tile) * tile.type.element.bits // 32 // threads
        if carried + cost <= budget:
            carried += cost
            kept.add(id(tile))
    return kept


def _numel(value) -> int:
    m, n = shape_of(value.type)
    return m * n


def _fits_wgmma(op: Operation, arch: Optional[str], num_warps: int) -> bool:
    """The shape, type and target conditions of wgmma, and B loaded in the dot's block."""
    a, b, acc = op.operands
    k = shape_of(a.type)[1]
    return (uses_tensor_cores(op, arch) and a.type.element in TENSOR_CORE_INPUTS and wgmma_enabled(arch)
            and k % WGMMA_K == 0 and _loaded_beside(b, op)
            and wgmma_instruction_n(shape_of(acc.type), num_warps) is not None)


def _warpgroups_tile_m(op: Operation, num_warps: int) -> bool:
    shape = shape_of(op.operands[2].type)
    return wgmma_warpgroups_per_cta(shape, num_warps, wgmma_instruction_n(shape, num_warps))[1] == 1


def _register_a_candidate(op: Operation, arch: Optional[str], num_warps: int) -> bool:
    return _fits_wgmma(op, arch, num_warps) and _warpgroups_tile_m(op, num_warps)


def _wgmma_neighbour(op: Operation, arch: Optional[str], num_warps: int) -> bool:
    """Whether another dot of the block runs on wgmma (already assigned by the layout pass, whose
    conversions hide its loads, or about to be)."""
    if "engine" in op.attrs:
        return op.attrs["engine"] == "wgmma"
    return _fits_wgmma(op, arch, num_warps) and (
        _loaded_beside(op.operands[0], op) or _loop_invariant_load(op.operands[0], op) is not None
        or (_warpgroups_tile_m(op, num_warps) and not _near_runtime_branch(op))     # (register A's conditions)
        or wgmma_staged_computed_a(op, arch, num_warps))


def wgmma_staged_computed_a(op: Operation, arch: Optional[str], num_warps: int) -> bool:
    """Whether `dot` op runs on wgmma with A computed in its own block and staged into shared memory
    with st.shared at every iteration (see the module docstring): A is not a load, its warpgroups tile
    N (so no register A fragment holds it), and another dot of the block takes A from registers,
    which one dot left on mma.sync beside it would prevent."""
    a = op.operands[0]
    source = _through_conversions(a).defining_op
    if source is None or source.parent is not op.parent or _loaded_beside(a, op):
        return False
    if not _fits_wgmma(op, arch, num_warps) or _warpgroups_tile_m(op, num_warps) or _near_runtime_branch(op):
        return False
    return any(nested.opcode == OpCode.DOT and nested is not op and _takes_register_a(nested, arch, num_warps)
               for other in op.parent.ops for nested in other.walk())


def _takes_register_a(op: Operation, arch: Optional[str], num_warps: int) -> bool:
    """Whether `dot` op takes (or, before the layout pass assigned it, qualifies to take) A from registers."""
    if "engine" in op.attrs:
        return op.attrs["engine"] == "wgmma" and not is_shared_layout(op.operands[0].layout)
    return _register_a_candidate(op, arch, num_warps) and not _loaded_beside(op.operands[0], op)


def wgmma_register_a(op: Operation, arch: Optional[str], num_warps: int, copyable=None) -> bool:
    """Whether `dot` op runs on wgmma with A from registers (see the module docstring). copyable: the
    ids of the `load` ops whose tiles cp.async can copy (None: every load); a loop-invariant A that it
    cannot copy keeps register A over the budget (staged from registers at every dot, it would cost
    more registers and st.shared in the loop)."""
    if _loaded_beside(op.operands[0], op) or not _register_a_candidate(op, arch, num_warps):
        return False
    if _near_runtime_branch(op) or not _neighbours_on_wgmma(op, arch, num_warps):
        return False
    anchor = _loop_invariant_load(op.operands[0], op)
    if anchor is None or (copyable is not None and id(op.operands[0].defining_op) not in copyable):
        return True
    return id(op.operands[0]) in _register_a_tiles(anchor, num_warps)


def _neighbours_on_wgmma(op: Operation, arch: Optional[str], num_warps: int) -> bool:
    """Whether every other dot of `op`'s block runs on wgmma (see the module docstring)."""
    block = op.parent
    for other in (block.ops if block is not None else ()):
        for nested in other.walk():
            if nested.opcode == OpCode.DOT and nested is not op and not _wgmma_neighbour(nested, arch, num_warps):
                return False
    return True


def wgmma_staged_a(op: Operation, arch: Optional[str], num_warps: int, copyable=None) -> bool:
    """Whether `dot` op runs on wgmma with A a loop-invariant load read from a shared tile written
    once, before the loop (see the module docstring; `copyable` as for wgmma_register_a)."""
    return (_loop_invariant_load(op.operands[0], op) is not None and _fits_wgmma(op, arch, num_warps)
            and _neighbours_on_wgmma(op, arch, num_warps) and not wgmma_register_a(op, arch, num_warps, copyable))


_BRANCHES = (OpCode.IF, OpCode.WHILE)


def _near_runtime_branch(op: Operation) -> bool:
    """Whether run-time control flow surrounds `dot` op: a branch (`if`, `while`) anywhere in its
    block, or a nested loop there when that block is a loop body (a loop of 0 or 1 trips is a
    branch); a branch among the ops of an enclosing block; or the dot itself inside a branch. The
    attention dK/dV loop with an `if` beside its register-A dots gave wrong results on the H200
    (session 4; the IR and PTX read right and the cause is not found), so the register-A form is kept
    to straight-line loop bodies (enclosing loops, and loops beside a dot outside any loop, are what
    the kernels that ship it have)."""
    block = op.parent
    if block is None:
        return False
    in_loop = block.parent is not None and block.parent.opcode == OpCode.FOR
    stops = _BRANCHES + ((OpCode.FOR,) if in_loop else ())
    if any(nested.opcode in stops for other in block.ops for nested in other.walk()):
        return True
    while block is not None and block.parent is not None:
        owner = block.parent
        if owner.opcode in _BRANCHES:
            return True
        block = owner.parent
        if block is not None and any(other.opcode in _BRANCHES for other in block.ops):
            return True
    return False


def uses_wgmma(op: Operation, arch: Optional[str], num_warps: int) -> bool:
    """Whether `dot` op runs on wgmma for `arch` and `num_warps` (see the module docstring)."""
    if not _fits_wgmma(op, arch, num_warps):
        return False
    return (_loaded_beside(op.operands[0], op) or wgmma_register_a(op, arch, num_warps)
            or wgmma_staged_a(op, arch, num_warps) or wgmma_staged_computed_a(op, arch, num_warps))


def wgmma_operand_layout(shape, element_bits: int, operand: int, source_layout, instr_mn: int):
    """The shared tile a wgmma operand of `shape` (A: M x K, operand 0; B: K x N, operand 1) is
    read from, contiguous along the dim `source_layout` (its layout in registers, from global
    memory) holds as vectors; instr_mn: the M (64) or N of one instruction. None when no swizzle
    mode fits (an M/N-major tile whose instruction extent is under 32 bytes)."""
    k_dim = 1 - operand
    contiguous = contiguous_dim(source_layout, element_bits) if source_layout is not None else 1
    extent = shape[contiguous] if contiguous == k_dim else min(shape[contiguous], instr_mn)
    swizzle = wgmma_swizzle_bytes(extent * element_bits // 8)
    if swizzle is None:
        return None
    return wgmma_operand_shared(shape, element_bits, contiguous, swizzle)


def wgmma_accumulator_layout(op: Operation, num_warps: int):
    """The accumulator layout of a `dot` that `uses_wgmma`."""
    shape = shape_of(op.operands[2].type)
    return wgmma_accumulator(shape, num_warps, wgmma_instruction_n(shape, num_warps))


def wgmma_dot_layouts(op: Operation, num_warps: int, register_a: bool = False) -> tuple:
    """(A tile, B tile, accumulator layout) of a `dot` that `uses_wgmma`, whose operands have their
    source layouts (see the module docstring); with `register_a`, A's register layout
    (`layouts.mma.wgmma_operand_a`) instead of a tile. An instruction reads at least 64 rows of A
    and 16 columns of B, so every tile gets at least the 32-byte swizzle."""
    a, b, acc = op.operands
    shape = shape_of(acc.type)
    instr_n = wgmma_instruction_n(shape, num_warps)
    bits = a.type.element.bits
    if register_a:
        tile_a = wgmma_operand_a(shape_of(a.type), num_warps, instr_n, shape[1])
    else:
        tile_a = wgmma_operand_layout(shape_of(a.type), bits, 0, a.layout, WGMMA_M)
    tiles = (tile_a, wgmma_operand_layout(shape_of(b.type), bits, 1, b.layout, instr_n))
    if None in tiles:
        raise ValueError(f"internal error: no wgmma swizzle fits the operands of a {shape} dot")
    return tiles + (wgmma_accumulator(shape, num_warps, instr_n),)


def accumulator_layout(op: Operation, arch: Optional[str], num_warps: int):
    """The accumulator layout of a tensor-core `dot` (wgmma or mma.sync, whichever it uses)."""
    if uses_wgmma(op, arch, num_warps):
        return wgmma_accumulator_layout(op, num_warps)
    return mma_dot_layouts(op, num_warps)[2]


def mma_warps(shape, num_warps: int) -> tuple:
    """(wm, wn) warps along M and N for an (M, N) accumulator.

    Each doubling goes to the dim whose per-warp tile is larger (M on ties), as long as the tile
    stays at least one 16x8 mma tile: square-ish warp tiles read the fewest operand bytes from
    shared memory per mma. Warps left once both dims are at one tile per warp go along M, where
    they hold copies (as in `layouts.mma.mma_warps_per_cta`).
    """
    m, n = shape
    wm = wn = 1
    left = num_warps
    while left > 1:
        can_m, can_n = m // (2 * wm) >= MMA_M, n // (2 * wn) >= MMA_N
        if can_m and (m // wm >= n // wn or not can_n):
            wm *= 2
        elif can_n:
            wn *= 2
        else:
            break
        left //= 2
    return wm * left, wn


def mma_dot_layouts(op: Operation, num_warps: int) -> tuple:
    """(A layout, B layout, accumulator layout) of a tensor-core `dot`."""
    a, b, acc = op.operands
    warps = mma_warps(shape_of(acc.type), num_warps)
    operand_a, operand_b = (mma_tf32_operand_a, mma_tf32_operand_b) if is_tf32_dot(op) else (mma_operand_a,
                                                                                             mma_operand_b)
    return (operand_a(shape_of(a.type), warps), operand_b(shape_of(b.type), warps),
            mma_accumulator(shape_of(acc.type), warps))
