"""Review (session 28) of 5a4b9d8 and b017709: the E <= 64 attention backward that adds dQ inside the dK/dV
kernel (DQ_ATOMIC, a float32 buffer, `attention_backward_dq_convert_kernel`), its config selection and launch
caches, and the DSL rules it rests on: (a) a wgmma dot whose A is computed in its block staged every step
(dot_layouts.wgmma_staged_computed_a), (b) block atomics run in their value's layout
(_layout_memory._adds_in_place), (c) `red.relaxed.{gpu,cta}.global.add.v2/.v4.f32` for relaxed float32 adds
whose old values are unused (dce `result_unused`, codegen/atomics.py `_reduction_width` / `_vector_reductions`),
(d) wgmma dots with a staged operand left in flight across "passable" ops, relaxed unused-result atomics among
them (passes/wgmma_waits.py). All on the CPU: no GPU tool was used.

What was tried (peer bug reports the cases come from):
  - Vector reductions, against an independent oracle (`_check_atomics`): the kernel's IR after the sm_90a
    pipeline runs in the interpreter with the atomic rule wrapped; for every (warp, lane) the groups codegen
    forms (`atomics._reduction_width`, the owner rules of ownership.py) are replayed and the multiset of
    (address, value) adds they would do must equal the block's element-wise adds, every vector's first address
    aligned to its size. Adversarial addresses from Triton #1330 (vectorized writes through a misaligned
    address), Triton PR #4971 (vectorized atomics on Hopper; its mask-alignment check) and tile-ai/tilelang
    PR #3219 / #2478 (`B[i // 2]` destinations vectorized, odd bases): offsets `// 2`, `* 2`, `^ 1`, reversed,
    `% 4` (repeated addresses inside a group), `+ 1`, `+ 2` (8-byte aligned only), views 1, 2 and 4 floats
    off, runtime offsets, masks `offs < n` for n multiple of 8 / odd, `r % 2 == 0`, `(r // 4) % 2 == 0`,
    value-dependent masks, broadcast (stride-0) rows, transposed pointers, wgmma / mma.sync accumulators with
    leading dims 64 / 65 / 66, replicated layouts (16-64 elements on 1-8 warps), scalar masks and values,
    duplicate atomics (CSE), old values used in a branch or only by a dead loop-carried sum. Scopes cta / gpu
    / sys and sem variants in the PTX (ptxas assembles v2/v4 for sm_90 and sm_90a). Triton #558 (atomic_add
    with duplicate indices) for the interpreter's semantics. All correct: widths are conservative (e.g. a
    leading dim of 66 takes scalars although v2 would be aligned).
  - Deferred waits and staged A (NVIDIA/Fuser #3561 and Triton PR #3106: shared memory overwritten while a
    wgmma still reads it): attention-like loops (S^T = K Q^T with register A, dQ = dS K with dS^T computed,
    cast and `trans`-ed in the block, dK = dS Q), followed by a plain store, a cross-warp reduction, a
    transposing store, a second staged dot, vector-reduced atomics; casts of a float32 load as A beside a
    register-A dot; 4 / 8 / 16 warps, 1-3 stages, E = 16 / 32 / 64 / 128. Checked: session 17's
    `_wait_violations` (atomics aside, see below), ptxas (no C7513 / C7514, no spills), the post-pass IR in the
    interpreter against the frontend's, and a PTX scan for shared-memory writes while a wgmma group is
    outstanding (`_shared_writes_in_flight`; the library's dK/dV kernels, atomic and deterministic, are clean).
  - The attention backward with forced configs in the interpreter against float64 torch
    (flash-attention #414 / #988 / #1245: dQ is the gradient that takes atomics): GQA, L != S, L or S = 1,
    E != Ev, odd E, causal with L < S and L > S, rows spanning several blocks, expanded / transposed q, k, v and
    grad_out, many heads, the GPU config's 64 x 128 geometry, dK/dV and dQ configs of different BLOCK_M, with
    kv_ring / early_dp / head_major, fp16 / bf16 (bitwise equal to the two-kernel path), empty tensors. The GPU
    launcher observed through spied `prepare`s: DQ_ATOMIC and the buffer per deterministic flag, both launch
    caches (`_BACKWARD_LAUNCHES`, AttentionLaunches.backward) keyed on it, the buffer zeroed every launch.
    All correct.

DEFECTS (defect 1 fixed in session 28: codegen/atomics.py `_set_result` moves no old values that nobody reads;
the observation below too: `backward_configs` takes the device's shared memory per CTA):
  1. A relaxed block atomic whose old values are unused but whose layout replicates elements across threads
     (a block smaller than the CTA: a 16- or 64-element counter on 4 warps; any dtype, float32 included,
     whenever it stays on the per-element path) is "passable" for passes/wgmma_waits.py (`_passable`, the
     ATOMIC_RMW branch: relaxed, `result_unused`, a layout), so a deferred wgmma stays in flight across it. But
     codegen/atomics.py still hands the unused old values to the copies through scratch shared memory
     (`_set_result` -> ownership.owners_values: bar.sync, st.shared at ctx.scratch_offset, bar.sync), exactly
     where `wgmma._stage` put the tiles of a dot whose operands are staged from registers (rule (d) lets such
     a dot stay in flight). Repro (`_staged_dot_then_counter`): x = dot(a, b) of a 64x32 and a 32x64 fp16 tile
     (no loop: both staged into scratch at fusedops_shared + 0), then
     `dsl.atomic_add(cnt_ptr + dsl.arange(0, 16), 1, sem="relaxed")`, then a store of exp2(x). Expected: no
     shared-memory write while a wgmma group is outstanding (the pass's own rule: "stays in flight only across
     ops that write no shared memory: nothing overwrites the tile it reads"). Actual (sm_90a PTX):
     `wgmma.commit_group`, `atom.global.add`, `bar.sync`, `st.shared.b32 [fusedops_shared + 4 * i]`, ...,
     `wgmma.wait_group 0`: the store overwrites the first 64 bytes of the A tile the in-flight wgmma reads,
     a silently wrong product on the GPU (PTX: undefined), and ptxas says nothing. The same happens in a loop
     (a dS^T-K dot staged at scratch + 64 KiB after the ring, a 16-float counter added before dQ is read: the
     counter's st.shared lands at scratch + 64 KiB while that dot is in flight). Likely fix: codegen skips
     owners_values for an atomic with `result_unused` (nothing reads the copies), or `_passable` also asks that
     the atomic's layout holds every element in one thread (owner_predicate None) or takes the vector path.

Observation (not a defect of this change's rules, no test): the dK/dV kernel of ATOMIC_DKDV_CONFIGS needs
163840 bytes of shared memory for sm_80 as well as sm_90a (the deterministic E = 64 one 81920), and
backward_configs does not look at the device: on compute capability 8.6 / 8.9 (99 KB per CTA) the default E <= 64
backward would now raise LaunchError where it ran before (E = 128's forward already needs 128 KB there).
"""

from __future__ import annotations

import collections
import dataclasses
import re
import types

import numpy as np
import pytest
import torch

import fusedops.dsl as dsl
from fusedops.dsl.codegen import atomics as codegen_atomics
from fusedops.dsl.codegen import layout_access
from fusedops.dsl.codegen.ownership import owned_registers
from fusedops.dsl.interpreter import context as interpreter_context
from fusedops.dsl.ir import OpCode
from fusedops.dsl.language.dtypes import BlockType
from fusedops.dsl.runtime.bounded_cache import BoundedCache
from fusedops.dsl.target import assemble, ptxas_available
from fusedops.kernels import attention as at, attention_backward_kernels
from fusedops.kernels.attention_configs import (
    ATOMIC_DKDV_CONFIGS, BACKWARD_CONFIGS, INTERPRETER_CONFIG, AttentionConfig, backward_configs, sweep_configs)
from fusedops.kernels.attention_forward_kernels import attention_forward_kernel
from codegen_helpers import interpret_ir, pipelined_ir
from test_attention import compile_backward
from test_review_session17_waits import _wait_violations

needs_ptxas = pytest.mark.skipif(not ptxas_available(), reason="ptxas is not on the PATH")
_ATOMIC = dataclasses.replace(INTERPRETER_CONFIG, dq_atomic=True)


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path / "cache"))


# == oracles ========================================================================================

def _replicated_bits(bases) -> int:
    return sum(1 << bit for bit, basis in enumerate(bases) if not any(basis))


def _is_owner(layout, lane: int, warp: int, num_warps: int) -> bool:
    """Whether thread (lane, warp) owns its elements (no replicating lane / warp bit set), as ownership.py."""
    lane_mask = _replicated_bits(layout_access.lane_bases(layout))
    warp_bits = len(layout_access.warp_bases(layout))
    warp_mask = _replicated_bits(layout_access.warp_bases(layout))
    if num_warps > 1 << warp_bits:          # warps beyond the layout's hold copies
        warp_mask |= ~((1 << warp_bits) - 1) & 0xFFFF
    return (lane & lane_mask) == 0 and (warp & warp_mask) == 0


def _check_atomics(kernel, grid, args, kwargs, num_warps, arch="sm_90a") -> tuple:
    """(sorted widths codegen picks for the block atomics, problems): the IR after the pipeline runs in the
    interpreter; at every block atomic the adds of codegen's plan (groups of `_reduction_width` registers,
    owners only, each group under its first element's mask, to its first element's address and the ones
    after it) are replayed for every thread and compared with the block's element-wise adds."""
    function, report = pipelined_ir(kernel, args, kwargs, num_warps, arch=arch)
    ctx = types.SimpleNamespace(axis_info=report.analyses["analyze_pointers"], arch=arch,
                                arch_at_least=lambda sm: int(arch[3:5]) >= sm)
    plans = {id(op): (op, codegen_atomics._reduction_width(ctx, op)) for op in function.walk()
             if op.opcode == OpCode.ATOMIC_RMW and isinstance(op.operands[0].type, BlockType)}
    problems = []
    rule = interpreter_context.RULES[OpCode.ATOMIC_RMW]

    def wrapped(ictx, op, pointer, value, *rest):
        if id(op) in plans:
            mask = rest[0] if op.attrs.get("masked") else None
            problems.extend(_plan_problems(*plans[id(op)], pointer, value, mask, num_warps))
        return rule.fn(ictx, op, pointer, value, *rest)

    interpreter_context.RULES[OpCode.ATOMIC_RMW] = interpreter_context.Rule(wrapped, rule.multiple_results, rule.static)
    try:
        interpret_ir(dsl.jit(kernel.fn), function, grid, args, kwargs)
    finally:
        interpreter_context.RULES[OpCode.ATOMIC_RMW] = rule
    return sorted(width for _, width in plans.values()), problems


def _plan_problems(op, width, pointer, value, mask, num_warps) -> list:
    layout = op.operands[0].layout
    shape = tuple(layout.shape)
    pointer = np.broadcast_to(np.asarray(pointer, dtype=np.int64), shape)
    value = np.broadcast_to(np.asarray(value), shape)
    mask = None if mask is None else np.broadcast_to(np.asarray(mask), shape)
    size = op.operands[0].type.element.element.itemsize
    expected = collections.Counter((int(pointer[c]), float(value[c])) for c in np.ndindex(*shape)
                                   if mask is None or mask[c])
    done, problems = collections.Counter(), []
    registers, owned = layout_access.num_registers(layout), owned_registers(layout)
    warp_bits = layout.in_dim_bits("warp")
    for warp in range(num_warps):
        for lane in range(32):
            if not _is_owner(layout, lane, warp, num_warps):
                continue
            coords = [tuple(layout.apply(register=r, lane=lane, warp=warp % (1 << warp_bits)))
                      for r in range(registers)]
            for start in range(0, registers, width):
                if start not in owned or (mask is not None and not mask[coords[start]]):
                    continue
                base = int(pointer[coords[start]])
                if base % (width * size):
                    problems.append(("vector not aligned", warp, lane, start, base, width))
                for i in range(width):
                    done[(base + i * size, float(value[coords[start + i]]))] += 1
    if done != expected:
        problems.append(("adds differ from the block's", width, sorted((done - expected).items())[:3],
                         sorted((expected - done).items())[:3]))
    return problems


def _shared_writes_in_flight(ptx: str) -> list:
    """Shared-memory writes (st.shared, cp.async into shared, shared atomics) in straight-line PTX text
    order while a wgmma group is outstanding (committed, not retired by a wait_group)."""
    found, outstanding = [], 0
    for line in (raw.strip() for raw in ptx.splitlines()):
        if line.startswith("wgmma.commit_group"):
            outstanding += 1
        wait = re.match(r"wgmma\.wait_group\.sync\.aligned\s+(\d+)", line)
        if wait:
            outstanding = min(outstanding, int(wait.group(1)))
        if outstanding and re.match(r"(@!?%p\d+\s+)?(st\.shared|stmatrix|cp\.async\.|atom\.shared|red\.shared)",
                                    line):
            found.append(line)
    return found


def _reductions(ptx: str) -> list:
    return sorted(set(re.findall(r"(?<![\w.])(?:red|atom)\.[\w.]+", ptx)))


# == DEFECT 1: an atomic passed by an in-flight staged wgmma writes the tile it reads =================

@dsl.jit
def _staged_dot_then_counter(o_ptr, a_ptr, b_ptr, cnt_ptr, N, BLOCK_M: dsl.constexpr, BLOCK_N: dsl.constexpr,
                             BLOCK_K: dsl.constexpr, CNT: dsl.constexpr):
    # o = exp2(A B / 8) of one product (no loop: A and B are staged into scratch shared memory); between the
    # dot and the read of its result, a per-program counter of CNT elements is bumped (old values unused).
    rm = dsl.arange(0, BLOCK_M)
    rn = dsl.arange(0, BLOCK_N)
    rk = dsl.arange(0, BLOCK_K)
    a = dsl.load(a_ptr + rm[:, None] * BLOCK_K + rk[None, :])
    b = dsl.load(b_ptr + rk[:, None] * N + rn[None, :])
    x = dsl.dot(a, b, dsl.zeros((BLOCK_M, BLOCK_N), dsl.float32))
    c = dsl.arange(0, CNT)
    dsl.atomic_add(cnt_ptr + c, dsl.full((CNT,), 1, cnt_ptr.dtype.element), sem="relaxed")
    dsl.store(o_ptr + rm[:, None] * N + rn[None, :], dsl.exp2(x * 0.125))


def _counter_ptx(dtype, count):
    o, a, b = torch.empty(64, 64), torch.empty(64, 32, dtype=torch.float16), torch.empty(32, 64, dtype=torch.float16)
    compiled = dsl.jit(_staged_dot_then_counter.fn).compile(o, a, b, torch.empty(count, dtype=dtype), 64, BLOCK_M=64,
                                                            BLOCK_N=64, BLOCK_K=32, CNT=count, target="sm_90a",
                                                            num_warps=4)
    return compiled.asm["ptx"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32])
def test_no_shared_memory_write_while_a_staged_wgmma_is_in_flight_across_a_small_atomic(dtype):
    ptx = _counter_ptx(dtype, 16)
    assert "wgmma.mma_async" in ptx and re.search(r"(?<![\w.])atom\.global\.add", ptx)
    assert not _shared_writes_in_flight(ptx)


def test_the_same_dot_beside_an_atomic_held_once_per_thread_writes_no_shared_memory_in_flight():
    """Control for defect 1: 128 elements on 4 warps (one per thread, nothing to hand to copies) and 512
    (vector reductions) keep the wgmma in flight with no st.shared; the scan sees the staging stores
    before the commit, so it is not blind."""
    for count, kind in ((128, "atom.global.add.f32"), (512, "red.relaxed.gpu.global.add.v4.f32")):
        ptx = _counter_ptx(torch.float32, count)
        assert _reductions(ptx) == [kind]
        assert not _shared_writes_in_flight(ptx)
        before_commit = ptx.split("wgmma.commit_group")[0]
        assert re.search(r"st\.shared\.v4", before_commit)


# == (c) vector reductions: plans replayed against the element-wise adds ============================

@dsl.jit
def _add_1d(out_ptr, x_ptr, n, start, BLOCK: dsl.constexpr, MODE: dsl.constexpr):
    r = dsl.arange(0, BLOCK)
    x = dsl.load(x_ptr + dsl.program_id(0) * BLOCK + r)
    offs = dsl.program_id(0) * BLOCK + r
    if MODE == 0:
        dsl.atomic_add(out_ptr + offs, x, sem="relaxed")
    elif MODE == 1:
        dsl.atomic_add(out_ptr + offs, x, mask=offs < n, sem="relaxed")
    elif MODE == 2:
        dsl.atomic_add(out_ptr + offs, x, mask=r % 2 == 0, sem="relaxed")
    elif MODE == 3:
        dsl.atomic_add(out_ptr + offs + start, x, sem="relaxed")
    elif MODE == 4:
        dsl.atomic_add(out_ptr + offs // 2, x, sem="relaxed")
    elif MODE == 5:
        dsl.atomic_add(out_ptr + (offs ^ 1), x, sem="relaxed")
    elif MODE == 6:
        dsl.atomic_add(out_ptr + 2 + offs, x, mask=2 + offs < n, sem="relaxed", scope="cta")
    elif MODE == 7:
        dsl.atomic_add(out_ptr + r % 4, x, sem="relaxed")
    elif MODE == 8:
        dsl.atomic_add(out_ptr + offs, x, mask=(r // 4) % 2 == 0, sem="relaxed")
    elif MODE == 9:
        dsl.atomic_add(out_ptr + offs, x, mask=x > 0, sem="relaxed")
    elif MODE == 10:
        total = dsl.zeros((BLOCK,), dsl.float32)
        for _ in range(n % 3):
            total += dsl.atomic_add(out_ptr + offs, x, sem="relaxed")      # a dead loop-carried sum


# (MODE, n, start, view offset in floats, block, warps, expected width)
_ONE_D = [
    (0, 1000, 0, 0, 1024, 4, 4), (1, 1000, 0, 0, 1024, 4, 4), (1, 1001, 0, 0, 1024, 4, 1),
    (2, 1000, 0, 0, 1024, 4, 1), (3, 1000, 3, 0, 1024, 4, 1), (4, 1000, 0, 0, 1024, 4, 1),
    (5, 1000, 0, 0, 1024, 4, 1), (6, 1000, 0, 0, 1024, 4, 2), (7, 1000, 0, 0, 1024, 4, 4),
    (8, 1000, 0, 0, 1024, 4, 4), (9, 1000, 0, 0, 1024, 4, 1), (0, 1000, 0, 1, 1024, 4, 1),
    (0, 1000, 0, 2, 1024, 4, 1), (0, 1000, 0, 4, 1024, 4, 4), (0, 1000, 0, 0, 64, 4, 1),
    (0, 1000, 0, 0, 64, 1, 2), (0, 1000, 0, 0, 256, 4, 2), (10, 1000, 0, 0, 1024, 4, 4),
]


@pytest.mark.parametrize("mode, n, start, offset, block, warps, expected", _ONE_D)
def test_1d_vector_reduction_groups_add_exactly_the_block(mode, n, start, offset, block, warps, expected, seed):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(2 * block, generator=generator)
    out = torch.zeros(2 * block + 64 + offset)[offset:]
    widths, problems = _check_atomics(_add_1d, (2,), (out, x, n, start), dict(BLOCK=block, MODE=mode), warps)
    assert not problems, problems[:3]
    assert widths == [expected]


@dsl.jit
def _add_product(out_ptr, a_ptr, b_ptr, M, N, ld, MODE: dsl.constexpr):
    # a 64x64 wgmma accumulator (sm_90a, 4 warps) added in place through row / column pointers
    rm = dsl.arange(0, 64)
    rn = dsl.arange(0, 64)
    rk = dsl.arange(0, 32)
    acc = dsl.dot(dsl.load(a_ptr + rm[:, None] * 32 + rk[None, :]), dsl.load(b_ptr + rk[:, None] * 64 + rn[None, :]),
                  dsl.zeros((64, 64), dsl.float32))
    if MODE == 0:
        dsl.atomic_add(out_ptr + rm[:, None] * ld + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N),
                       sem="relaxed")
    elif MODE == 1:
        dsl.atomic_add(out_ptr + rm[:, None] + rn[None, :] * ld, acc, sem="relaxed")
    elif MODE == 2:
        dsl.atomic_add(out_ptr + rn[None, :] + rm[:, None] * 0, acc, sem="relaxed")        # stride-0 rows
    elif MODE == 3:
        dsl.atomic_add(out_ptr + 1 + rm[:, None] * ld + rn[None, :], acc, sem="relaxed")
    elif MODE == 4:
        dsl.atomic_add(out_ptr + rm[:, None] * ld + rn[None, :], acc, mask=rn[None, :] % 2 == 0, sem="relaxed")
    elif MODE == 5:
        dsl.atomic_add(out_ptr + rm[:, None] * ld + rn[None, :] // 2, acc, sem="relaxed")


@pytest.mark.parametrize("mode, m, n, ld, expected", [
    (0, 64, 64, 64, 2), (0, 61, 59, 65, 1), (0, 64, 63, 66, 1), (1, 64, 64, 64, 1), (2, 64, 64, 64, 2),
    (3, 64, 64, 64, 1), (4, 64, 64, 64, 1), (5, 64, 64, 64, 1),
])
def test_accumulator_vector_reduction_groups_add_exactly_the_product(mode, m, n, ld, expected, seed):
    generator = torch.Generator().manual_seed(seed)
    a, b = (torch.randn(64, 32, generator=generator).half(), torch.randn(32, 64, generator=generator).half())
    out = torch.zeros(64 * 66 + 64)
    widths, problems = _check_atomics(_add_product, (1,), (out, a, b, m, n, ld), dict(MODE=mode), 4)
    assert not problems, problems[:3]
    assert widths == [expected]


def test_the_vector_reduction_oracle_catches_a_wrong_width(monkeypatch, seed):
    """The replay above can fail: claim v4 groups for `out + offs // 2` (pairs of equal addresses)."""
    monkeypatch.setattr(codegen_atomics, "_reduction_width", lambda ctx, op: 4)
    x = torch.randn(2048, generator=torch.Generator().manual_seed(seed))
    _, problems = _check_atomics(_add_1d, (2,), (torch.zeros(4096), x, 1000, 0), dict(BLOCK=1024, MODE=4), 4)
    assert {p[0] for p in problems} == {"vector not aligned", "adds differ from the block's"}


@dsl.jit
def _scoped_add(out_ptr, x_ptr, SEM: dsl.constexpr, SCOPE: dsl.constexpr, USE_OLD: dsl.constexpr):
    offs = dsl.arange(0, 1024)
    old = dsl.atomic_add(out_ptr + offs, dsl.load(x_ptr + offs), sem=SEM, scope=SCOPE)
    if USE_OLD:
        if dsl.program_id(0) == 0:          # old values read only in a branch
            dsl.store(x_ptr + offs, old)


@pytest.mark.parametrize("arch", ["sm_90", "sm_90a"])
@pytest.mark.parametrize("sem, scope, use_old, expected", [
    ("relaxed", "cta", False, ["red.relaxed.cta.global.add.v4.f32"]),
    ("relaxed", "gpu", False, ["red.relaxed.gpu.global.add.v4.f32"]),
    ("relaxed", "sys", False, ["atom.relaxed.sys.global.add.f32"]),      # system scope (tests/test_atomic_scopes.py)
    ("release", "gpu", False, ["atom.global.add.f32"]),
    ("relaxed", "gpu", True, ["atom.global.add.f32"]),
])
def test_vector_reductions_only_for_relaxed_gpu_or_cta_adds_whose_old_values_nobody_reads(sem, scope, use_old,
                                                                                         expected, arch):
    x = torch.empty(1024)
    ptx = dsl.jit(_scoped_add.fn).compile(x, x, SEM=sem, SCOPE=scope, USE_OLD=use_old, target=arch,
                                          num_warps=4).asm["ptx"]
    assert _reductions(ptx) == expected
    if ptxas_available():
        assert assemble(ptx, arch).spill_bytes == 0


def test_interpreter_atomics_apply_duplicates_in_lane_order_and_return_old_values():
    """Triton #558: atomic_add through duplicate indices adds every one (int32, float16, float64); the old
    values are those seen in lane order; masked-off lanes read 0 and add nothing."""
    for dtype in (torch.int32, torch.float16, torch.float64):
        out = torch.zeros(8, dtype=dtype)
        x = torch.arange(1, 17).to(dtype)
        values = x.clone()
        _duplicate_add[(1,)](out, x, interpret=True)
        offsets = [i % 5 for i in range(16)]
        expected = torch.zeros(8, dtype=torch.float64)
        olds = []
        for i, o in enumerate(offsets):
            if i == 7:
                olds.append(0.0)
                continue
            olds.append(float(expected[o]))
            expected[o] += float(values[i])
        assert torch.equal(out.double(), expected), (dtype, out)
        assert x.double().tolist() == olds, (dtype, x)


@dsl.jit
def _duplicate_add(out_ptr, x_ptr):
    r = dsl.arange(0, 16)
    old = dsl.atomic_add(out_ptr + r % 5, dsl.load(x_ptr + r), mask=r != 7, sem="relaxed")
    dsl.store(x_ptr + r, old)


# == (a) / (d): staged computed A and deferred waits ================================================

@dsl.jit
def _dkdv_like(out_ptr, dq_ptr, q_ptr, k_ptr, L, BM: dsl.constexpr, BN: dsl.constexpr, E: dsl.constexpr,
               MODE: dsl.constexpr):
    # per query block: S^T = K Q^T (K: register A), P^T = exp2(S^T / 16), dQ = P K (A = trans of the computed
    # P^T, staged), dK += P^T Q (register A); then dQ goes out as MODE says
    rn = dsl.arange(0, BN)
    re = dsl.arange(0, E)
    k = dsl.load(k_ptr + rn[:, None] * E + re[None, :])
    dk = dsl.zeros((BN, E), dsl.float32)
    for m0 in range(0, L, BM):
        rm = m0 + dsl.arange(0, BM)
        st = dsl.dot(k, dsl.load(q_ptr + rm[None, :] * E + re[:, None]), dsl.zeros((BN, BM), dsl.float32))
        pt = dsl.exp2(st * 0.0625)
        kb = dsl.load(k_ptr + rn[:, None] * E + re[None, :])
        if MODE == 4:
            dq = dsl.dot(dsl.trans(pt).to(dsl.float16), kb, dsl.zeros((BM, E), dsl.float32))
        else:
            dq = dsl.dot(dsl.trans(pt.to(dsl.float16)), kb, dsl.zeros((BM, E), dsl.float32))
        dk = dsl.dot(pt.to(dsl.float16), dsl.load(q_ptr + rm[:, None] * E + re[None, :]), dk)
        dq_ptrs = dq_ptr + rm[:, None] * E + re[None, :]
        if MODE == 0 or MODE == 4:
            dsl.atomic_add(dq_ptrs, dq, sem="relaxed")
        elif MODE == 1:
            dsl.store(dq_ptr + L * E + rm, dsl.max(dq, axis=1))       # across warps
            dsl.store(dq_ptr + L * E + L + re, dsl.sum(dq, axis=0))
        elif MODE == 2:
            dsl.store(dq_ptr + rm[None, :] * E + re[:, None], dsl.trans(dq))
        elif MODE == 3:
            kb2 = dsl.load(k_ptr + BN * E + rn[:, None] * E + re[None, :])
            dq2 = dsl.dot(dsl.trans((pt * 0.5).to(dsl.float16)), kb2, dsl.zeros((BM, E), dsl.float32))
            dsl.atomic_add(dq_ptrs, dq + dq2, sem="relaxed")
    dsl.store(out_ptr + rn[:, None] * E + re[None, :], dk)


def _dkdv_like_args(length, bn, e, seed=0):
    generator = torch.Generator().manual_seed(seed)
    q = (torch.randn(length, e, generator=generator) * 0.5).half()
    k = (torch.randn(2 * bn, e, generator=generator) * 0.5).half()
    return torch.zeros(bn, e), torch.zeros(length * e + 2 * length + e), q, k, length


@pytest.mark.parametrize("mode", [0, 1, 2, 3, 4])
def test_staged_computed_a_beside_register_a_dots_keeps_sound_waits(mode):
    """8 warps, BM = 64 (dQ's warpgroups split N: A = dS^T staged each step), E = 64: every dot on wgmma; the
    waits are sound by session 17's checker (its one complaint, a deferred dot at a vector-reduced atomic, is
    what rule (d) allows); the post-pass IR computes what the frontend's does."""
    args = _dkdv_like_args(128, 128, 64)
    kwargs = dict(BM=64, BN=128, E=64, MODE=mode)
    function, _ = pipelined_ir(_dkdv_like, args, kwargs, 8, num_stages=2)
    body = next(op for op in function.body.ops if op.opcode == OpCode.FOR).regions[0]
    assert all(op.attrs.get("engine") == "wgmma" for op in body.ops if op.opcode == OpCode.DOT)
    problems = _wait_violations(function)
    assert all("at atomic_rmw" in p for p in problems), problems
    interpret_ir(dsl.jit(_dkdv_like.fn), function, (1,), args, kwargs)
    expected = _dkdv_like_args(128, 128, 64)
    _dkdv_like[(1,)](*expected, **kwargs, num_warps=8, interpret=True)
    assert torch.equal(args[0], expected[0]) and torch.equal(args[1], expected[1])


@needs_ptxas
@pytest.mark.parametrize("bn, e, warps, stages, mode", [(128, 64, 8, 2, 0), (128, 64, 8, 3, 1), (128, 16, 8, 2, 3),
                                                         (256, 32, 16, 2, 2), (128, 128, 8, 2, 4)])
def test_staged_computed_a_kernels_assemble_unserialized_without_spills(bn, e, warps, stages, mode):
    args = _dkdv_like_args(128, bn, e)
    compiled = dsl.jit(_dkdv_like.fn).compile(*args, BM=64, BN=bn, E=e, MODE=mode, target="sm_90a", num_warps=warps,
                                              num_stages=stages)
    ptx = compiled.asm["ptx"]
    assert "wgmma.mma_async" in ptx and "mma.sync" not in ptx and "fence.proxy.async.shared::cta" in ptx
    result = assemble(ptx, "sm_90a")
    assert result.spill_bytes == 0, result.log
    assert not re.search(r"C751[34]|serializ", result.log), result.log


@needs_ptxas
@pytest.mark.parametrize("causal", [False, True])
def test_the_library_dkdv_kernels_write_no_shared_memory_while_a_wgmma_is_in_flight(causal):
    """The oracle of defect 1 on the shipped kernels (their one loop body; the scan follows text order)."""
    atomic = compile_backward("dkdv", 64, causal, config=ATOMIC_DKDV_CONFIGS[64])
    assert re.search(r"red\.relaxed\.gpu\.global\.add\.v2\.f32", atomic.asm["ptx"])
    assert not _shared_writes_in_flight(atomic.asm["ptx"])
    assert not _shared_writes_in_flight(compile_backward("dkdv", 64, causal, deterministic=True).asm["ptx"])


# == the attention backward with dQ added by the dK/dV kernel ======================================

def _torch_grads(q, k, v, do, causal, scale, gqa):
    leaves = [t.detach().clone().double().requires_grad_() for t in (q, k, v)]
    out = torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=causal, scale=scale, enable_gqa=gqa)
    return torch.autograd.grad(out, leaves, do.double())


def _inputs(batch, heads, heads_kv, length_q, length_k, dim, dim_v, seed, dtype=torch.float64):
    generator = torch.Generator().manual_seed(seed)

    def make(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64).to(dtype)
    return (make(batch, heads, length_q, dim), make(batch, heads_kv, length_k, dim),
            make(batch, heads_kv, length_k, dim_v), make(batch, heads, length_q, dim_v))


_CASES = [  # (B, H, H_kv, L, S, E, Ev, causal)
    (1, 1, 1, 1, 1, 8, 8, True), (1, 2, 1, 40, 3, 5, 7, True), (1, 2, 1, 3, 40, 5, 7, True),
    (2, 4, 2, 33, 18, 17, 9, False), (1, 1, 1, 1, 37, 12, 12, False), (1, 6, 1, 19, 21, 3, 4, True),
]


@pytest.mark.parametrize("case", _CASES, ids=str)
def test_atomic_dq_matches_float64_torch(case, seed):
    batch, heads, heads_kv, length_q, length_k, dim, dim_v, causal = case
    q, k, v, do = _inputs(batch, heads, heads_kv, length_q, length_k, dim, dim_v, seed)
    o, lse = at.attention_forward(q, k, v, None, causal, 0.37, interpret=True)
    grads = at.attention_backward(do, q, k, v, o, lse, None, causal, 0.37, interpret=True,
                                  configs=(_ATOMIC, INTERPRETER_CONFIG))
    for ours, want in zip(grads, _torch_grads(q, k, v, do, causal, 0.37, heads != heads_kv)):
        assert ours.shape == want.shape and ours.is_contiguous()
        torch.testing.assert_close(ours, want, rtol=1e-10, atol=1e-12)


def test_atomic_dq_with_expanded_and_transposed_inputs_and_grad_out(seed):
    generator = torch.Generator().manual_seed(seed)
    b, h, hk, length_q, length_k, e, ev = 2, 4, 2, 21, 26, 12, 20
    q = torch.randn(b, h, 1, e, dtype=torch.float64, generator=generator).expand(b, h, length_q, e)
    k = torch.randn(1, hk, length_k, e, dtype=torch.float64, generator=generator).expand(b, hk, length_k, e)
    v = torch.randn(b, length_k, hk, ev, dtype=torch.float64, generator=generator).transpose(1, 2)
    do = torch.randn(b, h, ev, length_q, dtype=torch.float64, generator=generator).transpose(-1, -2)
    for causal in (False, True):
        o, lse = at.attention_forward(q, k, v, None, causal, 0.3, interpret=True)
        grads = at.attention_backward(do, q, k, v, o, lse, None, causal, 0.3, interpret=True,
                                      configs=(_ATOMIC, INTERPRETER_CONFIG))
        for ours, want in zip(grads, _torch_grads(q, k, v, do, causal, 0.3, True)):
            torch.testing.assert_close(ours, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kv_config, q_config", [
    (ATOMIC_DKDV_CONFIGS[64], BACKWARD_CONFIGS[64][1]),            # the GPU's geometry
    (AttentionConfig(32, 16, 4, 1, dq_atomic=True), INTERPRETER_CONFIG),   # dQ rows padded to 32, read by 16
    (_ATOMIC, AttentionConfig(32, 16, 4, 1)),
    (dataclasses.replace(_ATOMIC, kv_ring=True, early_dp=False, head_major=True), INTERPRETER_CONFIG),
], ids=["gpu-geometry", "kv-block-wider", "q-block-wider", "kv-ring-late-dp-head-major"])
def test_atomic_dq_for_other_block_shapes_and_options(kv_config, q_config, seed):
    q, k, v, do = _inputs(1, 2, 1, 70, 45, 33, 20, seed)
    for causal in (True, False):
        o, lse = at.attention_forward(q, k, v, None, causal, 0.25, interpret=True)
        grads = at.attention_backward(do, q, k, v, o, lse, None, causal, 0.25, interpret=True,
                                      configs=(kv_config, q_config))
        for ours, want in zip(grads, _torch_grads(q, k, v, do, causal, 0.25, True)):
            torch.testing.assert_close(ours, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_16_bit_atomic_dq_equals_the_dq_kernel_bitwise_in_the_interpreter(dtype, seed):
    """One program per key block here (S <= BLOCK_N), so the float32 sums take one order on either path."""
    q, k, v, do = _inputs(1, 2, 1, 19, 13, 24, 24, seed, dtype)
    o, lse = at.attention_forward(q, k, v, None, True, 0.3, interpret=True)
    atomic = at.attention_backward(do, q, k, v, o, lse, None, True, 0.3, interpret=True,
                                   configs=(_ATOMIC, INTERPRETER_CONFIG))
    plain = at.attention_backward(do, q, k, v, o, lse, None, True, 0.3, interpret=True,
                                  configs=(INTERPRETER_CONFIG,) * 2)
    for a, b in zip(atomic, plain):
        assert a.dtype == dtype and torch.equal(a, b)


@pytest.mark.parametrize("shapes", [((1, 2, 0, 8), (1, 2, 5, 8)), ((1, 2, 4, 8), (1, 2, 0, 8)),
                                    ((0, 2, 4, 8), (0, 2, 5, 8))])
def test_atomic_dq_with_empty_tensors(shapes):
    q, k = torch.randn(*shapes[0], dtype=torch.float64), torch.randn(*shapes[1], dtype=torch.float64)
    o, lse = at.attention_forward(q, k, k, None, False, 0.3, interpret=True)
    grads = at.attention_backward(q, q, k, k, o, lse, None, False, 0.3, interpret=True,
                                  configs=(_ATOMIC, INTERPRETER_CONFIG))
    assert [g.shape for g in grads] == [q.shape, k.shape, k.shape]
    assert all(not g.any() for g in grads)


# -- the GPU launcher, observed through `prepare` -------------------------------------------------------

class _Spy:
    """Stands in for a kernel's `prepare`: records grid and keyword arguments; its launch records the tensors
    and, for the dK/dV kernel, checks the dQ buffer arrives zeroed and then dirties it."""

    def __init__(self, dirty_last=False):
        self.calls, self.launches, self.dirty_last = [], [], dirty_last

    def __call__(self, grid, *args, **kwargs):
        self.calls.append((grid, args, kwargs))

        def launch(*tensors):
            self.launches.append(tensors)
            if self.dirty_last and tensors[-1] is not None:
                assert not tensors[-1].any(), "the dQ buffer is not zeroed before the dK/dV kernel"
                tensors[-1].fill_(7.0)
        return launch


@pytest.fixture
def spies(monkeypatch):
    found = {name: _Spy(dirty_last=name == "attention_backward_dkdv_kernel") for name in (
        "attention_backward_preprocess_kernel", "attention_backward_dkdv_kernel", "attention_backward_dq_kernel",
        "attention_backward_dq_convert_kernel")}
    for name, spy in found.items():
        monkeypatch.setattr(getattr(attention_backward_kernels, name), "prepare", spy)
    monkeypatch.setattr(at, "_BACKWARD_LAUNCHES", BoundedCache(16))      # no launch cached by another test
    monkeypatch.setattr(at, "_FORWARD_LAUNCHES", BoundedCache(16))
    previous = torch.are_deterministic_algorithms_enabled()
    yield found
    torch.use_deterministic_algorithms(previous)


def test_gpu_launcher_switches_dq_paths_with_the_deterministic_flag_and_caches_both(spies):
    b, h, hk, length_q, length_k, e = 2, 4, 2, 50, 70, 64
    q, k, v, o = torch.randn(b, h, length_q, e), torch.randn(b, hk, length_k, e), torch.randn(b, hk, length_k, e), \
        torch.randn(b, h, length_q, e)
    lse = torch.randn(b, h, 2, length_q)
    for deterministic in (False, True, False, True):
        torch.use_deterministic_algorithms(deterministic)
        for _ in range(2):
            at.attention_backward(o, q, k, v, o, lse, None, True, 0.1)
    dkdv = spies["attention_backward_dkdv_kernel"]
    assert [c[2]["DQ_ATOMIC"] for c in dkdv.calls] == [True, False]      # prepared once per flag
    kv = ATOMIC_DKDV_CONFIGS[64]
    grid, _, kwargs = dkdv.calls[0]
    assert grid == (b * hk, -(-length_k // kv.block_n)) and kwargs["BLOCK_M"] == kv.block_m
    assert tuple(kwargs["dq_ptr"].shape) == (b * h, -(-length_q // kv.block_m) * kv.block_m, 64)
    assert kwargs["dq_ptr"].dtype == torch.float32 and dkdv.calls[1][2]["dq_ptr"] is None
    assert [t[-1] is None for t in dkdv.launches] == [False, False, True, True] * 2
    (grid, args, kwargs), = spies["attention_backward_dq_convert_kernel"].calls
    assert grid == (b * h, -(-length_q // BACKWARD_CONFIGS[64][1].block_m))
    assert args[-5:-2] == (length_q, e, -(-length_q // kv.block_m) * kv.block_m) and kwargs["BLOCK_E"] == 64
    assert len(spies["attention_backward_dq_kernel"].calls) == 1
    assert len(spies["attention_backward_dq_convert_kernel"].launches) == 4


def test_attention_launches_backward_keys_on_the_deterministic_flag(spies, monkeypatch):
    monkeypatch.setattr(attention_forward_kernel, "prepare", _Spy())
    q = torch.randn(1, 2, 30, 32)
    launches = at.attention_launches(q, q, q, None, False, 0.2)
    lse = torch.randn(1, 2, 2, 30)
    for deterministic in (True, False, True):
        torch.use_deterministic_algorithms(deterministic)
        launches.backward(q, q, q, q, q, lse, None)
    assert [c[2]["DQ_ATOMIC"] for c in spies["attention_backward_dkdv_kernel"].calls] == [False, True]


def test_an_attn_mask_or_wide_head_dims_keep_the_dq_kernel_on_the_gpu_launcher(spies):
    q = torch.randn(1, 2, 20, 64)
    mask = torch.ones(20, 20, dtype=torch.bool).expand(1, 2, 20, 20)
    at.attention_backward(q, q, q, q, q, torch.randn(1, 2, 2, 20), mask, False, 0.2)
    wide = torch.randn(1, 2, 20, 80)
    at.attention_backward(wide, q, q, wide, wide, torch.randn(1, 2, 2, 20), None, False, 0.2)
    assert [c[2]["DQ_ATOMIC"] for c in spies["attention_backward_dkdv_kernel"].calls] == [False, False]
    assert len(spies["attention_backward_dq_kernel"].calls) == 2 and not spies["attention_backward_dq_convert_kernel"].calls


def test_sweep_configs_time_each_pair_once_with_the_atomic_kernel_first():
    for dim in (64, 128, 256):
        _, backward = sweep_configs(dim, dim)
        assert len(set(backward)) == len(backward)
        assert backward[0] == backward_configs(dim, dim)
        assert BACKWARD_CONFIGS[dim] in backward
        assert all(not q.dq_atomic for _, q in backward)
        assert sum(kv.dq_atomic for kv, _ in backward) == (dim == 64)
    for block_e, block_ev in ((16, 128), (128, 16), (64, 64), (32, 16)):
        atomic = backward_configs(block_e, block_ev)[0].dq_atomic
        assert atomic == (max(block_e, block_ev) <= 64)
        assert not backward_configs(block_e, block_ev, masked=True)[0].dq_atomic
        assert not backward_configs(block_e, block_ev, query_heads=10 ** 6, sms=132, deterministic=True)[0].dq_atomic
