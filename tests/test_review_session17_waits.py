"""Review (session 17): deferred wgmma waits (passes/wgmma_waits.py, codegen/wgmma.py `_wgmma_wait`) and
runtime conditional expressions (frontend/expressions.py `visit_IfExp`), tried on the CPU.

Deferred waits. Kernels with 2-4 dots per K step whose operands come through the cp.async / TMA ring, in
many read orders: results read in issue order, in reverse, before a later dot is issued, inside an `if`,
only by the loop's yield, chained through accumulators, one result feeding another dot's accumulator, an
unused result, atomics / stores / device_assert / device_print / reductions / math between issue and read,
a dot inside an `if`, nested loops (an outer-ring dot beside an inner loop whose wgmma stays in flight),
a persistent-style flattened loop with an `if k == last` epilogue, TMA rings (FUSEDOPS_TMA=1, with and
without FUSEDOPS_WS=1, and multicast in a 2-CTA cluster), 2-4 stages, 4 and 8 warps, register A operands
(attention's software-pipelined P V), and a tiny mma.sync dot in the same loop. Checked:
  - the IR, by an independent checker (`_wait_violations`) that walks every block simulating the queue of
    wgmma groups in flight: every read of a deferred dot's result goes through a `wgmma_wait` whose pending
    count retires it, and no deferred dot is in flight at a terminator, control flow, barrier, mbarrier op,
    async copy, dealloc, atomic, print or assert (only register math, loads / stores, reductions, layout
    conversions, ring reads and other wgmmas may pass);
  - the PTX, by ptxas (no spills, no "wgmma ... serialized" message of any C75xx code) and by a scan
    (`_ptx_in_flight_accesses`) for instructions touching the accumulators (any access) or the A fragment
    (writes) of a wgmma between its commit and the wait_group that retires it (PTX ISA: undefined behaviour);
  - the kernels in the interpreter against float64 (the interpreter runs the frontend's IR: this checks
    the kernels), and the post-pass IR in the interpreter (`codegen_helpers.interpret_ir`: the pass's
    rewiring of the results through the waits keeps the values).

Conditional expressions. Arms with loads, atomics, stores through helpers, early-returning and looping
helpers, tensor-descriptor loads, pointer arms, nested conditional expressions, mixed dtypes and shapes
(the result type must be what `dsl.where` gives), inside loops and `if`s, as `while` conditions and
`range` bounds, expression statements; in the interpreter, compiled for sm_80 and sm_90a (ptxas), and
(scalar kernels) run on the host from the sm_90a LLVM IR (tests/host_jit.py).

DEFECTS found by the review, both fixed in the same session (the tests now pass):
  1. test_register_a_fragment_is_not_rewritten_while_its_wgmma_is_in_flight: the wait ties only the
     accumulators, not a register A operand; in a software-pipelined P V loop that also stores each block's
     16-bit P, LLVM writes the next P into the in-flight wgmma's A registers before `wgmma.wait_group 0`
     (the registers of the loop-carried P are the A fragment): PTX-level undefined behaviour, and ptxas
     serializes every wgmma of the kernel (C7513; the existing tests look for C7514 only). Without the
     pass the same kernel has no serialization. Fixed: the wait keeps the A registers live, and no wgmma
     stays in flight across an op that writes shared memory (the cause of C7513 here: the store's layout
     conversion of P through shared memory).
  2. test_sibling_column_sums_of_deferred_dots_compile: a `wgmma_wait` inserted between the members of a
     sibling-reduction group (passes/sibling_reductions.py: codegen lowers the group at its first member,
     taking the next ops of the block as the other members) crashes codegen with KeyError: 'kind' for two
     column sums of two dots of a K step read in issue order. Fixed: a wait the group needs goes before
     its first member.
"""

from __future__ import annotations

import re

import pytest
import torch

import fusedops.dsl as dsl
import fusedops.dsl.passes.pipeline as pipeline_module
from fusedops.dsl.ir import OpCode
from fusedops.dsl.layouts.mma_shared import is_shared_layout
from fusedops.dsl.passes.manager import pass_name, run_pipeline
from fusedops.dsl.passes.pipeline import default_pipeline
from fusedops.dsl.target import assemble, ptxas_available
from codegen_helpers import interpret_ir
from helpers import assert_close
from host_jit import run_on_host

needs_ptxas = pytest.mark.skipif(not ptxas_available(), reason="ptxas is not on the PATH")
ARCHS = ("sm_80", "sm_90a")


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path / "cache"))


# == the independent checkers =====================================================================

# Ops a deferred (in-flight) wgmma may stay in flight across: they neither touch the ring slots nor its
# registers nor synchronize. Written here from the PTX ISA's rules, not copied from the pass.
_MAY_PASS = {
    OpCode.CONSTANT, OpCode.PROGRAM_ID, OpCode.NUM_PROGRAMS, OpCode.ARANGE, OpCode.SPLAT, OpCode.BROADCAST,
    OpCode.EXPAND_DIMS, OpCode.RESHAPE, OpCode.TRANS, OpCode.CAST, OpCode.BITCAST, OpCode.ADDPTR, OpCode.ADD,
    OpCode.SUB, OpCode.MUL, OpCode.DIV, OpCode.IDIV, OpCode.MOD, OpCode.AND, OpCode.OR, OpCode.XOR, OpCode.SHL,
    OpCode.SHR, OpCode.MINIMUM, OpCode.MAXIMUM, OpCode.EQ, OpCode.NE, OpCode.LT, OpCode.LE, OpCode.GT, OpCode.GE,
    OpCode.NEG, OpCode.INVERT, OpCode.EXP, OpCode.EXP2, OpCode.LOG, OpCode.LOG2, OpCode.SQRT, OpCode.RSQRT,
    OpCode.ABS, OpCode.SIN, OpCode.COS, OpCode.ERF, OpCode.TANH, OpCode.FLOOR, OpCode.CEIL, OpCode.FMA,
    OpCode.WHERE, OpCode.MULTIPLE_OF, OpCode.MAX_CONTIGUOUS, OpCode.LOAD, OpCode.STORE, OpCode.REDUCE,
    OpCode.ARGREDUCE, OpCode.SCAN, OpCode.CONVERT_LAYOUT, OpCode.LOCAL_LOAD,
}


def _wait_violations(function) -> list:
    """Walk every block simulating the wgmma groups in flight (in-order retirement: wait_group n keeps
    the n newest); returns what is wrong (empty when the waits are sound)."""
    problems = []

    def check(block, where):
        queue, raw = [], set()          # dots in flight (issue order); ids of deferred dots' raw results
        for op in block.ops:
            for nested in op.walk():
                if nested is op and op.opcode == OpCode.WGMMA_WAIT:
                    continue
                if any(id(v) in raw for v in nested.operands):
                    problems.append(f"{where}: {nested.opcode.value} reads a deferred dot's result without a wait")
            deferred = [d for d in queue if d.attrs.get("deferred")]
            if op.opcode == OpCode.WGMMA_WAIT:
                keep = op.attrs["pending"]
                queue = queue[len(queue) - keep:] if keep else []
                for value in op.operands:
                    if any(value.defining_op is d for d in queue):
                        problems.append(f"{where}: wgmma_wait {{pending = {keep}}} leaves its own dot in flight")
            elif op.opcode == OpCode.DOT and op.attrs.get("engine") == "wgmma":
                if op.attrs.get("deferred"):
                    for operand in op.operands[:2]:
                        producer = operand.defining_op
                        staged = producer is None or producer.opcode != OpCode.LOCAL_LOAD
                        if is_shared_layout(operand.layout) and staged and deferred:
                            # (session 28: a dot staging a tile may stay in flight, but its st.shared must
                            # not run beside other in-flight dots, nor a later staging overwrite its tile)
                            problems.append(f"{where}: a dot staging a shared tile is issued with deferred dots "
                                            f"in flight")
                    queue.append(op)
                    raw.add(id(op.result))
                else:
                    if deferred:
                        problems.append(f"{where}: a dot that waits for itself is issued with deferred dots in flight")
                    queue.append(op)
                    keep = op.attrs.get("pending", 0)
                    queue = queue[len(queue) - keep:] if keep else []
            elif op.opcode not in _MAY_PASS and deferred:
                problems.append(f"{where}: a deferred dot is in flight at {op.opcode.value}")
        if any(d.attrs.get("deferred") for d in queue):
            problems.append(f"{where}: a deferred dot is in flight at the end of the block")
        for op in block.ops:
            for index, region in enumerate(op.regions):
                check(region, f"{where}/{op.opcode.value}[{index}]")

    check(function.body, "body")
    return problems


_REGISTER = re.compile(r"%[a-z]+\d+")


def _ptx_in_flight_accesses(ptx: str) -> list:
    """PTX lines (straight-line text order) that touch the accumulator registers (any access) or write
    the A-fragment registers of a wgmma.mma_async between its commit group and the wgmma.wait_group
    that retires the group."""
    groups, current, found = [], [set(), set()], []
    for line in (raw.strip() for raw in ptx.splitlines()):
        if not line or line.startswith(("//", ".reg", "{", "}", "wgmma.fence", "setp.ne.b32 p,")):
            continue
        if line.startswith("wgmma.mma_async"):
            operands = line.split(None, 1)[1]
            close = operands.index("}")
            current[0] |= set(_REGISTER.findall(operands[:close]))
            rest = operands[close + 1:].lstrip(", ")
            if rest.startswith("{"):
                current[1] |= set(_REGISTER.findall(rest[:rest.index("}")]))
            continue
        if line.startswith("wgmma.commit_group"):
            groups.append(current)
            current = [set(), set()]
            continue
        match = re.match(r"wgmma\.wait_group\.sync\.aligned (\d+);", line)
        if match:
            keep = int(match.group(1))
            groups = groups[len(groups) - keep:] if keep else []
            continue
        registers = _REGISTER.findall(line)
        written = registers[0] if registers and not line.startswith(("st.", "red.", "bar", "@", "cp.")) else None
        if any(set(registers) & acc or written in a for acc, a in groups):
            found.append(line)
    return found


def _waits_of(block) -> list:
    """(pending, number of results) of each wgmma_wait of `block`, in order."""
    return [(op.attrs["pending"], len(op.operands)) for op in block.ops if op.opcode == OpCode.WGMMA_WAIT]


def _pipelined(kernel, args, num_warps=4, num_stages=3, combine=False, **constexprs):
    """The kernel's IR after the sm_90a pipeline; combine=False leaves passes/dot_accumulation.py out: the
    schedules asserted here were written for these kernels' adds of products (`acc + x`), which it folds
    into the dots (tests/test_dot_accumulation.py covers that; soundness is checked with it too)."""
    function = dsl.jit(kernel.fn).ir(*args, **constexprs)
    passes = [p for p in default_pipeline(num_warps, "sm_90a", num_stages=num_stages)
              if combine or pass_name(p) != "combine_dot_accumulation"]
    run_pipeline(function, passes)
    return function


def _loop_body(function):
    return next(op for op in function.body.ops if op.opcode == OpCode.FOR).regions[0]


def _assemble_sm90a(kernel, args, num_warps=4, num_stages=3, defer=True, **constexprs):
    """(compiled, ptxas result) for sm_90a; defer=False compiles with the deferred-waits pass left out."""
    saved = pipeline_module.defer_wgmma_waits
    if not defer:
        pipeline_module.defer_wgmma_waits = lambda function: False
    try:
        compiled = dsl.jit(kernel.fn).compile(*args, target="sm_90a", num_warps=num_warps, num_stages=num_stages,
                                              **constexprs)
    finally:
        pipeline_module.defer_wgmma_waits = saved
    return compiled, assemble(compiled.asm["ptx"], "sm_90a")


def _serialized(log: str) -> list:
    return [line for line in log.splitlines() if "serialized" in line]


# == kernels: several dots per K step through the ring ============================================

@dsl.jit
def _three_products_kernel(o_ptr, a_ptr, b_ptr, cnt_ptr, M, N, K, BM: dsl.constexpr, BN: dsl.constexpr,
                           BK: dsl.constexpr, MODE: dsl.constexpr):
    # a: (3, M, K), b: (3, K, N) fp16, o: (M, N) fp32, cnt: int32[1]. Per K step three products
    # x, y, z = A_i B_i (each operand its own ring); MODE picks how and when they are read (`_three_reference`).
    rm = dsl.program_id(0) * BM + dsl.arange(0, BM)
    rn = dsl.arange(0, BN)
    rk = dsl.arange(0, BK)
    acc = dsl.zeros((BM, BN), dsl.float32)
    acc2 = dsl.zeros((BM, BN), dsl.float32)
    omask = (rm[:, None] < M) & (rn[None, :] < N)
    for k0 in range(0, K, BK):
        kk = k0 + rk
        rows = (rm[:, None] < M) & (kk[None, :] < K)
        cols = (kk[:, None] < K) & (rn[None, :] < N)
        pa = a_ptr + rm[:, None] * K + kk[None, :]
        pb = b_ptr + kk[:, None] * N + rn[None, :]
        a0 = dsl.load(pa, mask=rows, other=0.0)
        b0 = dsl.load(pb, mask=cols, other=0.0)
        a1 = dsl.load(pa + M * K, mask=rows, other=0.0)
        b1 = dsl.load(pb + K * N, mask=cols, other=0.0)
        a2 = dsl.load(pa + 2 * M * K, mask=rows, other=0.0)
        b2 = dsl.load(pb + 2 * K * N, mask=cols, other=0.0)
        if MODE == 0:      # read in issue order
            x = dsl.dot(a0, b0, dsl.zeros((BM, BN), dsl.float32))
            y = dsl.dot(a1, b1, dsl.zeros((BM, BN), dsl.float32))
            z = dsl.dot(a2, b2, dsl.zeros((BM, BN), dsl.float32))
            acc = acc + x * 0.5
            acc = acc - y
            acc = acc + dsl.exp2(z * 0.0625)
        elif MODE == 1:    # the newest first (retires all three)
            x = dsl.dot(a0, b0, dsl.zeros((BM, BN), dsl.float32))
            y = dsl.dot(a1, b1, dsl.zeros((BM, BN), dsl.float32))
            z = dsl.dot(a2, b2, dsl.zeros((BM, BN), dsl.float32))
            acc = acc + dsl.exp2(z * 0.0625)
            acc = acc + x * 0.5
            acc = acc - y
        elif MODE == 2:    # x read before z is issued
            x = dsl.dot(a0, b0, dsl.zeros((BM, BN), dsl.float32))
            y = dsl.dot(a1, b1, dsl.zeros((BM, BN), dsl.float32))
            acc = acc + x * 0.5
            z = dsl.dot(a2, b2, dsl.zeros((BM, BN), dsl.float32))
            acc = acc - y + dsl.exp2(z * 0.0625)
        elif MODE == 3:    # chained through the accumulators, then an independent one
            x = dsl.dot(a0, b0, acc)
            y = dsl.dot(a1, b1, x)
            z = dsl.dot(a2, b2, dsl.zeros((BM, BN), dsl.float32))
            acc = y + dsl.exp2(z * 0.0625)
        elif MODE == 4:    # carried accumulators read only by the yield
            acc = dsl.dot(a0, b0, acc)
            acc2 = dsl.dot(a1, b1, acc2)
            acc2 = dsl.dot(a2, b2, acc2)
        elif MODE == 5:    # one read inside an `if`
            x = dsl.dot(a0, b0, dsl.zeros((BM, BN), dsl.float32))
            y = dsl.dot(a1, b1, dsl.zeros((BM, BN), dsl.float32))
            z = dsl.dot(a2, b2, dsl.zeros((BM, BN), dsl.float32))
            acc = acc - y
            if k0 == 0:
                acc = acc + x
            acc = acc + dsl.exp2(z * 0.0625)
        elif MODE == 6:    # an atomic between issue and read
            x = dsl.dot(a0, b0, dsl.zeros((BM, BN), dsl.float32))
            y = dsl.dot(a1, b1, dsl.zeros((BM, BN), dsl.float32))
            dsl.atomic_add(cnt_ptr, 1)
            z = dsl.dot(a2, b2, dsl.zeros((BM, BN), dsl.float32))
            acc = acc + x - y + dsl.exp2(z * 0.0625)
        elif MODE == 7:    # a global store and an assert between issue and read
            x = dsl.dot(a0, b0, dsl.zeros((BM, BN), dsl.float32))
            y = dsl.dot(a1, b1, dsl.zeros((BM, BN), dsl.float32))
            dsl.store(o_ptr + rm[:, None] * N + rn[None, :], acc2, mask=omask)
            dsl.device_assert(k0 >= 0, "k0")
            z = dsl.dot(a2, b2, dsl.zeros((BM, BN), dsl.float32))
            acc = acc + x - y + dsl.exp2(z * 0.0625)
        elif MODE == 8:    # an unused result; a result as another dot's accumulator
            x = dsl.dot(a0, b0, dsl.zeros((BM, BN), dsl.float32))
            u = dsl.dot(a1, b1, dsl.zeros((BM, BN), dsl.float32))
            z = dsl.dot(a2, b2, x)
            acc = acc + z
        elif MODE == 9:    # reductions of results between issues
            x = dsl.dot(a0, b0, dsl.zeros((BM, BN), dsl.float32))
            y = dsl.dot(a1, b1, dsl.zeros((BM, BN), dsl.float32))
            m = dsl.max(x, axis=1)
            z = dsl.dot(a2, b2, dsl.zeros((BM, BN), dsl.float32))
            acc = acc + x - m[:, None] + y * dsl.sum(z, axis=1)[:, None] * 0.001
        elif MODE == 10:   # dots inside an `if` of the loop
            x = dsl.dot(a0, b0, dsl.zeros((BM, BN), dsl.float32))
            if k0 % (2 * BK) == 0:
                acc = dsl.dot(a1, b1, acc)
                acc = acc + dsl.dot(a2, b2, dsl.zeros((BM, BN), dsl.float32)) * 0.5
            acc = acc + x
        else:              # a device_print between issue and read
            x = dsl.dot(a0, b0, dsl.zeros((BM, BN), dsl.float32))
            y = dsl.dot(a1, b1, dsl.zeros((BM, BN), dsl.float32))
            dsl.device_print("k0", k0)
            z = dsl.dot(a2, b2, dsl.zeros((BM, BN), dsl.float32))
            acc = acc + x - y + dsl.exp2(z * 0.0625)
    if MODE == 4:
        acc = acc + acc2 * 0.5
    dsl.store(o_ptr + rm[:, None] * N + rn[None, :], acc, mask=omask)


def _three_reference(a, b, mode, block_k):
    a, b = a.double(), b.double()
    acc = torch.zeros(a.shape[1], b.shape[2], dtype=torch.float64)
    acc2 = torch.zeros_like(acc)
    for k0 in range(0, a.shape[2], block_k):
        x, y, z = (a[i][:, k0:k0 + block_k] @ b[i][k0:k0 + block_k] for i in range(3))
        if mode in (0, 1, 2):
            acc = acc + x * 0.5 - y + torch.exp2(z * 0.0625)
        elif mode in (6, 7, 11):
            acc = acc + x - y + torch.exp2(z * 0.0625)
        elif mode == 3:
            acc = acc + x + y + torch.exp2(z * 0.0625)
        elif mode == 4:
            acc, acc2 = acc + x, acc2 + y + z
        elif mode == 5:
            acc = acc - y + (x if k0 == 0 else 0.0) + torch.exp2(z * 0.0625)
        elif mode == 8:
            acc = acc + x + z
        elif mode == 9:
            acc = acc + x - x.max(dim=1, keepdim=True).values + y * z.sum(dim=1, keepdim=True) * 0.001
        elif mode == 10:
            if k0 % (2 * block_k) == 0:
                acc = acc + y + z * 0.5
            acc = acc + x
    return acc + acc2 * 0.5 if mode == 4 else acc


THREE = dict(BM=64, BN=64, BK=32)
# The loop body's waits (pending, results retired) where they document the overlap.
THREE_WAITS = {0: [(2, 1), (1, 1), (0, 1)], 1: [(0, 3)], 2: [(1, 1), (1, 1), (0, 1)], 3: [(0, 1), (0, 2)],
               4: [(0, 2), (0, 1)], 5: [(1, 2), (0, 1)], 6: [(0, 2), (0, 1)], 7: [(0, 2), (0, 1)], 8: [(0, 1)],
               9: [(1, 1), (0, 2)], 10: [(0, 1)], 11: [(0, 2), (0, 1)]}


def _three_arguments(m=100, n=64, k=96):
    generator = torch.Generator().manual_seed(m + 7 * n + 13 * k)
    a = torch.randn(3, m, k, generator=generator).half()
    b = torch.randn(3, k, n, generator=generator).half()
    return torch.full((m, n), float("nan")), a, b, torch.zeros(1, dtype=torch.int32), m, n, k


@pytest.mark.parametrize("mode", sorted(THREE_WAITS))
def test_three_products_waits_are_sound(mode):
    args = _three_arguments()
    function = _pipelined(_three_products_kernel, args, MODE=mode, **THREE)
    assert _wait_violations(function) == []
    assert _waits_of(_loop_body(function)) == THREE_WAITS[mode]
    assert _wait_violations(_pipelined(_three_products_kernel, args, combine=True, MODE=mode, **THREE)) == []


@pytest.mark.parametrize("num_stages,num_warps", [(2, 4), (4, 4), (3, 8)])
@pytest.mark.parametrize("mode", [0, 2, 5, 9])
def test_three_products_waits_are_sound_for_other_rings_and_warps(mode, num_stages, num_warps):
    function = _pipelined(_three_products_kernel, _three_arguments(), num_warps, num_stages, MODE=mode, **THREE)
    assert _wait_violations(function) == []
    assert any(op.attrs.get("deferred") for op in function.walk())


@pytest.mark.parametrize("mode", sorted(THREE_WAITS))
def test_three_products_in_the_interpreter(mode):
    o, a, b, cnt, m, n, k = _three_arguments(100, 50, 80)       # ragged M, N and K
    _three_products_kernel[(dsl.cdiv(m, 64),)](o, a, b, cnt, m, n, k, interpret=True, MODE=mode, **THREE)
    assert_close(o, _three_reference(a, b, mode, 32), dtype=torch.float32)


@pytest.mark.parametrize("mode", [0, 2, 3, 9])
def test_three_products_post_pass_ir_in_the_interpreter(mode):
    args = _three_arguments()
    constexprs = dict(MODE=mode, **THREE)
    function = _pipelined(_three_products_kernel, args, **constexprs)
    interpret_ir(dsl.jit(_three_products_kernel.fn), function, (dsl.cdiv(args[4], 64),), args, constexprs)
    assert_close(args[0], _three_reference(args[1], args[2], mode, 32), dtype=torch.float32)


@needs_ptxas
@pytest.mark.parametrize("mode,num_stages,num_warps", [(0, 3, 4), (2, 3, 4), (5, 3, 4), (9, 3, 4), (0, 2, 4),
                                                       (0, 4, 4), (2, 3, 8)])
def test_three_products_ptx(mode, num_stages, num_warps):
    compiled, result = _assemble_sm90a(_three_products_kernel, _three_arguments(), num_warps, num_stages,
                                       MODE=mode, **THREE)
    assert result.spill_bytes == 0 and not _serialized(result.log), result.log
    assert _ptx_in_flight_accesses(compiled.asm["ptx"]) == []
    if mode in (0, 2):
        assert "wgmma.wait_group.sync.aligned 1;" in compiled.asm["ptx"]


# == math, reductions, stores between issue and read ===============================================

@dsl.jit
def _between_kernel(o_ptr, a_ptr, b_ptr, e_ptr, M, N, K, BM: dsl.constexpr, BN: dsl.constexpr, BK: dsl.constexpr,
                    OP: dsl.constexpr):
    # a: (2, M, K), b: (2, K, N) fp16; e: (M, N) fp32. x, y issued, then OP on e, then x and y read.
    rm = dsl.program_id(0) * BM + dsl.arange(0, BM)
    rn = dsl.arange(0, BN)
    rk = dsl.arange(0, BK)
    acc = dsl.zeros((BM, BN), dsl.float32)
    omask = (rm[:, None] < M) & (rn[None, :] < N)
    for k0 in range(0, K, BK):
        kk = k0 + rk
        rows = (rm[:, None] < M) & (kk[None, :] < K)
        cols = (kk[:, None] < K) & (rn[None, :] < N)
        pa = a_ptr + rm[:, None] * K + kk[None, :]
        pb = b_ptr + kk[:, None] * N + rn[None, :]
        x = dsl.dot(dsl.load(pa, mask=rows, other=0.0), dsl.load(pb, mask=cols, other=0.0),
                    dsl.zeros((BM, BN), dsl.float32))
        y = dsl.dot(dsl.load(pa + M * K, mask=rows, other=0.0), dsl.load(pb + K * N, mask=cols, other=0.0),
                    dsl.zeros((BM, BN), dsl.float32))
        e = dsl.load(e_ptr + rm[:, None] * N + rn[None, :], mask=omask, other=1.0) + k0 * 0.001
        if OP == "erf":
            t = dsl.erf(e)
        elif OP == "div":
            t = 1.0 / (e + 3.0)
        elif OP == "idiv64":
            t = e + ((rm.to(dsl.int64) * 7919 + k0) // (k0 + 3) % 5)[:, None].to(dsl.float32)
        elif OP == "colsum":        # a reduction across warps (shared memory, barriers)
            t = e + dsl.sum(e, axis=0)[None, :] * 0.01
        elif OP == "argmax":
            t = e + dsl.argmax(e, axis=1)[:, None].to(dsl.float32)
        else:                       # "store"
            dsl.store(o_ptr + rm[:, None] * N + rn[None, :], e, mask=omask)
            t = e
        acc = acc + x * t - y
    dsl.store(o_ptr + rm[:, None] * N + rn[None, :], acc, mask=omask)


def _between_reference(a, b, e, op, block_k):
    a, b, e = a.double(), b.double(), e.double()
    acc = torch.zeros_like(e)
    for k0 in range(0, a.shape[2], block_k):
        x, y = (a[i][:, k0:k0 + block_k] @ b[i][k0:k0 + block_k] for i in range(2))
        ee = e + k0 * 0.001
        rows = torch.arange(e.shape[0], dtype=torch.int64)
        t = {"erf": lambda: torch.erf(ee), "div": lambda: 1.0 / (ee + 3.0),
             "idiv64": lambda: ee + (((rows * 7919 + k0) // (k0 + 3)) % 5)[:, None].double(),
             "colsum": lambda: ee + ee.sum(0, keepdim=True) * 0.01,
             "argmax": lambda: ee + ee.argmax(1, keepdim=True).double()}.get(op, lambda: ee)()
        acc = acc + x * t - y
    return acc


BETWEEN_OPS = ["erf", "div", "idiv64", "colsum", "argmax", "store"]


def _between_arguments():
    generator = torch.Generator().manual_seed(5)
    a = torch.randn(2, 64, 96, generator=generator).half()
    b = torch.randn(2, 96, 64, generator=generator).half()
    return torch.full((64, 64), float("nan")), a, b, torch.randn(64, 64, generator=generator), 64, 64, 96


@pytest.mark.parametrize("op", BETWEEN_OPS)
def test_ops_between_issue_and_read(op):
    args = _between_arguments()
    function = _pipelined(_between_kernel, args, OP=op, **THREE)
    assert _wait_violations(function) == []
    # (after the session's fix of the C7513 serialization) e, loaded in a blocked layout, moves to the
    # accumulator layout through shared memory before `x * t`: no wgmma stays in flight across a st.shared,
    # so one wait retires both dots before that conversion
    assert _waits_of(_loop_body(function)) == [(0, 2)]
    o, a, b, e = args[:4]
    _between_kernel[(1,)](*args, interpret=True, OP=op, **THREE)
    assert_close(o, _between_reference(a, b, e, op, 32), dtype=torch.float32)


@needs_ptxas
@pytest.mark.parametrize("op", ["erf", "colsum", "store"])
def test_ops_between_issue_and_read_ptx(op):
    compiled, result = _assemble_sm90a(_between_kernel, _between_arguments(), OP=op, **THREE)
    assert result.spill_bytes == 0 and not _serialized(result.log), result.log
    assert _ptx_in_flight_accesses(compiled.asm["ptx"]) == []


# == register A: attention's software-pipelined P V ===================================================

@dsl.jit
def _pv_kernel(o_ptr, ps_ptr, q_ptr, k_ptr, v_ptr, L, S, BM: dsl.constexpr, BN: dsl.constexpr, E: dsl.constexpr,
               ORDER: dsl.constexpr, STORE_P: dsl.constexpr):
    # q: (L, E), k, v: (S, E) fp16; o: (L, E) fp32. P_j = fp16(Q K_j^T / 8) of key block j; the loop issues
    # S_j = Q K_j^T and the previous block's acc += P_{j-1} V_{j-1} (P from registers: wgmma register A).
    # ORDER 0: S read first (P V still in flight), then acc *= 0.5; 1: P V issued first and read first;
    # 2: S read first, P V read only by the yield (no halving). STORE_P: each P_j also stored to ps (j, BM, BN).
    rm = dsl.program_id(0) * BM + dsl.arange(0, BM)
    rn0 = dsl.arange(0, BN)
    re = dsl.arange(0, E)
    q = dsl.load(q_ptr + rm[:, None] * E + re[None, :], mask=rm[:, None] < L, other=0.0)
    kt = dsl.load(k_ptr + rn0[None, :] * E + re[:, None], mask=rn0[None, :] < S, other=0.0)
    p = (dsl.dot(q, kt, dsl.zeros((BM, BN), dsl.float32)) * 0.125).to(dsl.float16)
    acc = dsl.zeros((BM, E), dsl.float32)
    for start in range(BN, S, BN):
        rn = start + rn0
        kt = dsl.load(k_ptr + rn[None, :] * E + re[:, None], mask=rn[None, :] < S, other=0.0)
        rv = start - BN + rn0
        if ORDER == 1:
            v = dsl.load(v_ptr + rv[:, None] * E + re[None, :], mask=rv[:, None] < S, other=0.0)
            acc = dsl.dot(p, v, acc)
            s = dsl.dot(q, kt, dsl.zeros((BM, BN), dsl.float32))
            acc = acc * 0.5
            p = (s * 0.125).to(dsl.float16)
        else:
            s = dsl.dot(q, kt, dsl.zeros((BM, BN), dsl.float32))
            v = dsl.load(v_ptr + rv[:, None] * E + re[None, :], mask=rv[:, None] < S, other=0.0)
            acc = dsl.dot(p, v, acc)
            p = (s * 0.125).to(dsl.float16)
            if STORE_P:
                dsl.store(ps_ptr + (start // BN) * BM * BN + (rm[:, None] % BM) * BN + rn0[None, :], p)
            if ORDER == 0:
                acc = acc * 0.5
    rv = dsl.maximum(dsl.cdiv(S, BN) - 1, 0) * BN + rn0
    v = dsl.load(v_ptr + rv[:, None] * E + re[None, :], mask=rv[:, None] < S, other=0.0)
    acc = dsl.dot(p, v, acc)
    dsl.store(o_ptr + rm[:, None] * E + re[None, :], acc, mask=rm[:, None] < L)


def _pv_reference(q, k, v, order, block_n=64):
    q, k, v = q.double(), k.double(), v.double()
    blocks = max(-(-k.shape[0] // block_n), 1)
    acc = torch.zeros(q.shape[0], v.shape[1], dtype=torch.float64)
    for j in range(blocks):
        p = ((q @ k[j * block_n:(j + 1) * block_n].T) * 0.125).half().double()
        acc = acc + p @ v[j * block_n:(j + 1) * block_n]
        if j < blocks - 1 and order in (0, 1):
            acc = acc * 0.5
    return acc


def _pv_arguments(length=200):
    generator = torch.Generator().manual_seed(length)
    q = torch.randn(64, 64, generator=generator).half()
    k, v = (torch.randn(length, 64, generator=generator).half() for _ in range(2))
    ps = torch.zeros(-(-length // 64), 64, 64, dtype=torch.float16)
    return torch.full((64, 64), float("nan")), ps, q, k, v, 64, length


PV = dict(BM=64, BN=64, E=64)


@pytest.mark.parametrize("order", [0, 1, 2])
def test_register_a_waits_are_sound_and_the_kernel_is_right(order):
    args = _pv_arguments()
    function = _pipelined(_pv_kernel, args, ORDER=order, STORE_P=False, **PV)
    assert _wait_violations(function) == []
    body = _loop_body(function)
    assert [op.attrs.get("deferred") for op in body.ops if op.opcode == OpCode.DOT] == [True, True]
    assert _waits_of(body) == [(1, 1), (0, 1)]
    o, _, q, k, v = args[:5]
    _pv_kernel[(1,)](*args, interpret=True, ORDER=order, STORE_P=False, **PV)
    assert_close(o, _pv_reference(q, k, v, order), dtype=torch.float32)


@needs_ptxas
@pytest.mark.parametrize("order", [0, 1, 2])
def test_register_a_ptx(order):
    compiled, result = _assemble_sm90a(_pv_kernel, _pv_arguments(), ORDER=order, STORE_P=False, **PV)
    assert result.spill_bytes == 0 and not _serialized(result.log), result.log
    assert _ptx_in_flight_accesses(compiled.asm["ptx"]) == []


def test_register_a_with_stored_p_in_the_interpreter():
    args = _pv_arguments()
    o, ps, q, k, v = args[:5]
    function = _pipelined(_pv_kernel, args, ORDER=0, STORE_P=True, **PV)
    assert _wait_violations(function) == []      # the IR is sound: the defect below is in the registers
    _pv_kernel[(1,)](*args, interpret=True, ORDER=0, STORE_P=True, **PV)
    assert_close(o, _pv_reference(q, k, v, 0), dtype=torch.float32)
    assert_close(ps[1], (q.double() @ k[64:128].double().T) * 0.125, dtype=torch.float16)


@needs_ptxas
def test_register_a_with_stored_p_without_the_pass_is_not_serialized():
    _, result = _assemble_sm90a(_pv_kernel, _pv_arguments(), defer=False, ORDER=0, STORE_P=True, **PV)
    assert not _serialized(result.log) and result.spill_bytes == 0, result.log


@needs_ptxas
def test_register_a_fragment_is_not_rewritten_while_its_wgmma_is_in_flight():
    # _wgmma_wait ties the accumulators only; the A words are dead to LLVM after the mma_async, so the next
    # block's P (also stored, so computed before the acc read) is packed straight into the same registers.
    compiled, result = _assemble_sm90a(_pv_kernel, _pv_arguments(), ORDER=0, STORE_P=True, **PV)
    assert _ptx_in_flight_accesses(compiled.asm["ptx"]) == []
    assert not _serialized(result.log), result.log


# == sibling reductions of deferred results ===========================================================

@dsl.jit
def _column_sums_kernel(o_ptr, a_ptr, b_ptr, c_ptr, d_ptr, M, N, K, BM: dsl.constexpr, BN: dsl.constexpr,
                        BK: dsl.constexpr):
    # o[0] = column sums of A B, o[1] = of C D, accumulated per K step (two cross-warp sums: siblings)
    rm = dsl.arange(0, BM)
    rn = dsl.arange(0, BN)
    rk = dsl.arange(0, BK)
    sx = dsl.zeros((BN,), dsl.float32)
    sy = dsl.zeros((BN,), dsl.float32)
    for k0 in range(0, K, BK):
        kk = k0 + rk
        rows = (rm[:, None] < M) & (kk[None, :] < K)
        cols = (kk[:, None] < K) & (rn[None, :] < N)
        x = dsl.dot(dsl.load(a_ptr + rm[:, None] * K + kk[None, :], mask=rows, other=0.0),
                    dsl.load(b_ptr + kk[:, None] * N + rn[None, :], mask=cols, other=0.0),
                    dsl.zeros((BM, BN), dsl.float32))
        y = dsl.dot(dsl.load(c_ptr + rm[:, None] * K + kk[None, :], mask=rows, other=0.0),
                    dsl.load(d_ptr + kk[:, None] * N + rn[None, :], mask=cols, other=0.0),
                    dsl.zeros((BM, BN), dsl.float32))
        sx = sx + dsl.sum(x, axis=0)
        sy = sy + dsl.sum(y, axis=0)
    dsl.store(o_ptr + rn, sx, mask=rn < N)
    dsl.store(o_ptr + N + rn, sy, mask=rn < N)


def _column_sums_arguments():
    generator = torch.Generator().manual_seed(9)
    a, c = (torch.randn(64, 96, generator=generator).half() for _ in range(2))
    b, d = (torch.randn(96, 64, generator=generator).half() for _ in range(2))
    return torch.full((2, 64), float("nan")), a, b, c, d, 64, 64, 96


def test_sibling_column_sums_of_deferred_dots_ir_and_interpreter():
    args = _column_sums_arguments()
    function = _pipelined(_column_sums_kernel, args, **THREE)
    assert _wait_violations(function) == []
    body = _loop_body(function)
    kinds = [op.opcode for op in body.ops if op.opcode in (OpCode.REDUCE, OpCode.WGMMA_WAIT)]
    # (fixed) one wait retires both dots before the exchange group's first member: none between the members
    assert kinds == [OpCode.WGMMA_WAIT, OpCode.REDUCE, OpCode.REDUCE]
    assert next(op for op in body.ops if op.opcode == OpCode.REDUCE).attrs.get("exchange_group") == 2
    interpret_ir(dsl.jit(_column_sums_kernel.fn), function, (1,), args, THREE)
    o, a, b, c, d = args[:5]
    assert_close(o, torch.stack([(a.double() @ b.double()).sum(0), (c.double() @ d.double()).sum(0)]),
                 dtype=torch.float32)
    dsl.jit(_column_sums_kernel.fn).compile(*args, target="sm_80", num_stages=3, **THREE)
    if ptxas_available():      # fine without the pass
        _, result = _assemble_sm90a(_column_sums_kernel, args, defer=False, **THREE)
        assert result.spill_bytes == 0 and not _serialized(result.log), result.log


def test_sibling_column_sums_of_deferred_dots_compile():
    try:
        compiled = dsl.jit(_column_sums_kernel.fn).compile(*_column_sums_arguments(), target="sm_90a", num_stages=3,
                                                           **THREE)
    except Exception as error:          # (reported short: pytest takes ~50 s to render codegen's deep traceback)
        crash = f"{type(error).__name__}: {error}"
    else:
        crash = None
    assert crash is None, crash
    if ptxas_available():
        assert not _serialized(assemble(compiled.asm["ptx"], "sm_90a").log)


# == TMA rings (WS 0 / 1, multicast), persistent epilogue, nested loops, mixed engines ====================

@dsl.jit
def _tma_two_kernel(o_ptr, a_ptr, b_ptr, c_ptr, d_ptr, M, N, K, BM: dsl.constexpr, BN: dsl.constexpr,
                    BK: dsl.constexpr, ORDER: dsl.constexpr, CLUSTER: dsl.constexpr):
    # o = sum over K steps of (A_k B_k) / 2 - C_k D_k through tensor descriptors; ORDER 1 reads y first
    if CLUSTER > 1:
        dsl.cluster_dims(CLUSTER)
    pid_m = dsl.program_id(0)
    a_desc = dsl.make_tensor_descriptor(a_ptr, (M, K), (K, 1), (BM, BK))
    b_desc = dsl.make_tensor_descriptor(b_ptr, (K, N), (N, 1), (BK, BN))
    c_desc = dsl.make_tensor_descriptor(c_ptr, (M, K), (K, 1), (BM, BK))
    d_desc = dsl.make_tensor_descriptor(d_ptr, (K, N), (N, 1), (BK, BN))
    acc = dsl.zeros((BM, BN), dsl.float32)
    for k0 in range(0, K, BK):
        x = dsl.dot(a_desc.load((pid_m * BM, k0)), b_desc.load((k0, 0), multicast=CLUSTER > 1),
                    dsl.zeros((BM, BN), dsl.float32))
        y = dsl.dot(c_desc.load((pid_m * BM, k0)), d_desc.load((k0, 0), multicast=CLUSTER > 1),
                    dsl.zeros((BM, BN), dsl.float32))
        if ORDER == 0:
            acc = acc + x * 0.5
            acc = acc - y
        else:
            acc = acc - y
            acc = acc + x * 0.5
    rm = pid_m * BM + dsl.arange(0, BM)
    rn = dsl.arange(0, BN)
    dsl.store(o_ptr + rm[:, None] * N + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


@dsl.jit
def _persistent_two_kernel(o_ptr, a_ptr, b_ptr, c_ptr, d_ptr, M, N, K, BM: dsl.constexpr, BN: dsl.constexpr,
                           BK: dsl.constexpr):
    # one program, every row tile in one flattened loop, `if k == last` epilogue; acc += A B - C D / 4
    k_iters = dsl.cdiv(K, BK)
    rn = dsl.arange(0, BN)
    rk = dsl.arange(0, BK)
    acc = dsl.zeros((BM, BN), dsl.float32)
    for it in range(0, dsl.cdiv(M, BM) * k_iters):
        rm = (it // k_iters) * BM + dsl.arange(0, BM)
        kk = (it % k_iters) * BK + rk
        rows = (rm[:, None] < M) & (kk[None, :] < K)
        cols = (kk[:, None] < K) & (rn[None, :] < N)
        x = dsl.dot(dsl.load(a_ptr + rm[:, None] * K + kk[None, :], mask=rows, other=0.0),
                    dsl.load(b_ptr + kk[:, None] * N + rn[None, :], mask=cols, other=0.0), acc)
        y = dsl.dot(dsl.load(c_ptr + rm[:, None] * K + kk[None, :], mask=rows, other=0.0),
                    dsl.load(d_ptr + kk[:, None] * N + rn[None, :], mask=cols, other=0.0),
                    dsl.zeros((BM, BN), dsl.float32))
        acc = x - y * 0.25
        if it % k_iters == k_iters - 1:
            dsl.store(o_ptr + rm[:, None] * N + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))
            acc = dsl.zeros((BM, BN), dsl.float32)


@dsl.jit
def _two_level_kernel(o_ptr, a_ptr, b_ptr, c_ptr, d_ptr, M, N, K, BM: dsl.constexpr, BN: dsl.constexpr,
                      BK: dsl.constexpr):
    # per N tile: x = C[:, :BK] D[:BK, tile] (the outer loop's ring), acc = A B[:, tile] (inner loop, its one
    # wgmma kept in flight across iterations); o = acc + x / 2
    rm = dsl.arange(0, BM)
    rk = dsl.arange(0, BK)
    for n0 in range(0, N, BN):
        rn = n0 + dsl.arange(0, BN)
        x = dsl.dot(dsl.load(c_ptr + rm[:, None] * K + rk[None, :]), dsl.load(d_ptr + rk[:, None] * N + rn[None, :]),
                    dsl.zeros((BM, BN), dsl.float32))
        acc = dsl.zeros((BM, BN), dsl.float32)
        for k0 in range(0, K, BK):
            kk = k0 + rk
            acc = dsl.dot(dsl.load(a_ptr + rm[:, None] * K + kk[None, :]),
                          dsl.load(b_ptr + kk[:, None] * N + rn[None, :]), acc)
        dsl.store(o_ptr + rm[:, None] * N + rn[None, :], acc + x * 0.5)


@dsl.jit
def _mixed_kernel(o_ptr, t_ptr, a_ptr, b_ptr, c_ptr, d_ptr, e_ptr, f_ptr, M, N, K, BM: dsl.constexpr,
                  BN: dsl.constexpr, BK: dsl.constexpr):
    # a wgmma pair and a 16 x 16 x 16 dot (mma.sync) per K step: t += E_k F_k (e, f: (K, 16, 16))
    rm = dsl.arange(0, BM)
    rn = dsl.arange(0, BN)
    rk = dsl.arange(0, BK)
    r16 = dsl.arange(0, 16)
    acc = dsl.zeros((BM, BN), dsl.float32)
    t = dsl.zeros((16, 16), dsl.float32)
    for k0 in range(0, K, BK):
        kk = k0 + rk
        x = dsl.dot(dsl.load(a_ptr + rm[:, None] * K + kk[None, :]), dsl.load(b_ptr + kk[:, None] * N + rn[None, :]),
                    dsl.zeros((BM, BN), dsl.float32))
        y = dsl.dot(dsl.load(c_ptr + rm[:, None] * K + kk[None, :]), dsl.load(d_ptr + kk[:, None] * N + rn[None, :]),
                    dsl.zeros((BM, BN), dsl.float32))
        t = dsl.dot(dsl.load(e_ptr + k0 * 256 + r16[:, None] * 16 + r16[None, :]),
                    dsl.load(f_ptr + k0 * 256 + r16[:, None] * 16 + r16[None, :]), t)
        acc = acc + x * 0.5 - y
    dsl.store(o_ptr + rm[:, None] * N + rn[None, :], acc)
    dsl.store(t_ptr + r16[:, None] * 16 + r16[None, :], t)


def _four_operands(m, n, k, seed):
    generator = torch.Generator().manual_seed(seed)
    a, c = (torch.randn(m, k, generator=generator).half() for _ in range(2))
    b, d = (torch.randn(k, n, generator=generator).half() for _ in range(2))
    return a, b, c, d


def _steps(a, b, block_k):
    a, b = a.double(), b.double()
    return sum(a[:, k0:k0 + block_k] @ b[k0:k0 + block_k] for k0 in range(0, a.shape[1], block_k))


@pytest.mark.parametrize("tma,ws,order,cluster,num_stages", [("1", "0", 0, 1, 3), ("1", "0", 1, 1, 3),
                                                               ("1", "1", 0, 1, 3), ("1", "1", 1, 1, 4),
                                                               ("1", "0", 0, 2, 3), ("0", "0", 0, 1, 2)])
def test_tma_rings(tma, ws, order, cluster, num_stages, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_TMA", tma)
    monkeypatch.setenv("FUSEDOPS_WS", ws)
    m, n, k = 128, 64, 160
    a, b, c, d = _four_operands(m, n, k, 3)
    args = (torch.full((m, n), float("nan")), a, b, c, d, m, n, k)
    constexprs = dict(BM=64, BN=64, BK=32, ORDER=order, CLUSTER=cluster)
    function = _pipelined(_tma_two_kernel, args, num_stages=num_stages, **constexprs)
    assert any(op.opcode == (OpCode.TMA_COPY if tma == "1" else OpCode.ASYNC_COPY) for op in function.walk())
    assert (ws == "1") == any(op.opcode == OpCode.MBARRIER_ARRIVE for op in function.walk())
    assert _wait_violations(function) == []
    assert _waits_of(_loop_body(function)) == ([(1, 1), (0, 1)] if order == 0 else [(0, 2)])
    interpret_ir(dsl.jit(_tma_two_kernel.fn), function, (2,), args, constexprs)
    assert_close(args[0], _steps(a, b, 32) * 0.5 - _steps(c, d, 32), dtype=torch.float32)
    if ptxas_available() and order == 0:
        compiled, result = _assemble_sm90a(_tma_two_kernel, args, num_stages=num_stages, **constexprs)
        assert result.spill_bytes == 0 and not _serialized(result.log), result.log
        assert _ptx_in_flight_accesses(compiled.asm["ptx"]) == []


@pytest.mark.parametrize("num_stages", [2, 3])
def test_persistent_loop_with_epilogue(num_stages):
    m, n, k = 128, 64, 160
    a, b, c, d = _four_operands(m, n, k, 4)
    args = (torch.full((m, n), float("nan")), a, b, c, d, m, n, k)
    tile = dict(BM=64, BN=64, BK=32)
    function = _pipelined(_persistent_two_kernel, args, num_stages=num_stages, **tile)
    assert _wait_violations(function) == []
    body = _loop_body(function)
    assert _waits_of(body) == [(0, 2)]      # both dots retired before the epilogue's `if`
    assert body.ops.index(next(op for op in body.ops if op.opcode == OpCode.WGMMA_WAIT)) < \
        body.ops.index(next(op for op in body.ops if op.opcode == OpCode.IF))
    interpret_ir(dsl.jit(_persistent_two_kernel.fn), function, (1,), args, tile)
    assert_close(args[0], _steps(a, b, 32) - _steps(c, d, 32) * 0.25, dtype=torch.float32)
    if ptxas_available():
        compiled, result = _assemble_sm90a(_persistent_two_kernel, args, num_stages=num_stages, **tile)
        assert result.spill_bytes == 0 and not _serialized(result.log), result.log


def test_outer_ring_dot_beside_an_inner_loop_with_a_wgmma_in_flight():
    m, n, k = 64, 128, 96
    a, b, c, d = _four_operands(m, n, k, 5)
    args = (torch.full((m, n), float("nan")), a, b, c, d, m, n, k)
    tile = dict(BM=64, BN=64, BK=32)
    function = _pipelined(_two_level_kernel, args, **tile)
    assert _wait_violations(function) == []
    outer = _loop_body(function)
    inner = next(op for op in outer.ops if op.opcode == OpCode.FOR)
    assert [op.attrs.get("pending") for op in inner.regions[0].ops if op.opcode == OpCode.DOT] == [1]
    assert outer.ops.index(next(op for op in outer.ops if op.opcode == OpCode.WGMMA_WAIT)) < outer.ops.index(inner)
    interpret_ir(dsl.jit(_two_level_kernel.fn), function, (1,), args, tile)
    assert_close(args[0], a.double() @ b.double() + 0.5 * (c[:, :32].double() @ d[:32].double()), dtype=torch.float32)
    if ptxas_available():
        _, result = _assemble_sm90a(_two_level_kernel, args, **tile)
        assert result.spill_bytes == 0 and not _serialized(result.log), result.log


def test_mma_sync_dot_in_the_same_loop_retires_the_deferred_ones():
    m, n, k = 64, 64, 96
    a, b, c, d = _four_operands(m, n, k, 6)
    generator = torch.Generator().manual_seed(6)
    e, f = (torch.randn(k * 256, generator=generator).half() for _ in range(2))
    args = (torch.full((m, n), float("nan")), torch.full((16, 16), float("nan")), a, b, c, d, e, f, m, n, k)
    tile = dict(BM=64, BN=64, BK=32)
    function = _pipelined(_mixed_kernel, args, **tile)
    assert _wait_violations(function) == []
    body = _loop_body(function)
    engines = [op.attrs.get("engine") for op in body.ops if op.opcode == OpCode.DOT]
    assert engines == ["wgmma", "wgmma", "mma"] and _waits_of(body) == [(0, 2)]
    interpret_ir(dsl.jit(_mixed_kernel.fn), function, (1,), args, tile)
    tiles = sum(e[k0 * 256:(k0 + 1) * 256].double().view(16, 16) @ f[k0 * 256:(k0 + 1) * 256].double().view(16, 16)
                for k0 in range(0, k, 32))
    assert_close(args[0], _steps(a, b, 32) * 0.5 - _steps(c, d, 32), dtype=torch.float32)
    assert_close(args[1], tiles, dtype=torch.float32)


# == conditional expressions =======================================================================

@dsl.jit
def _checked(x):
    dsl.device_assert(dsl.program_id(0) >= 0, "never")      # an observable op: the arm branches
    return x


@dsl.jit
def _typed_arms_kernel(o_ptr, i8_ptr, u8_ptr, f16_ptr, bf16_ptr, i64_ptr, f32_ptr, flag, CASE: dsl.constexpr,
                       BRANCH: dsl.constexpr):
    # `a if flag else b` (BRANCH: an IF, `a` through an assert) against dsl.where(flag, a, b), stored as float64
    r = dsl.arange(0, 4)
    if CASE == 0:
        a = dsl.load(i8_ptr + r)
        b = 300
    elif CASE == 1:
        a = dsl.load(u8_ptr + r)
        b = -1
    elif CASE == 2:
        a = dsl.load(f16_ptr + r)
        b = 1e6
    elif CASE == 3:
        a = dsl.load(bf16_ptr + r)
        b = dsl.load(f16_ptr)
    elif CASE == 4:
        a = dsl.load(i64_ptr)
        b = 2.5
    elif CASE == 5:
        a = dsl.load(f32_ptr + r) > 0
        b = 2
    elif CASE == 6:
        a = dsl.load(i64_ptr + r)
        b = True
    elif CASE == 7:
        a = dsl.load(i8_ptr + r)[:, None]
        b = dsl.load(f16_ptr + r)[None, :]
    elif CASE == 8:
        a = dsl.load(u8_ptr + r).to(dsl.uint32)
        b = dsl.load(i8_ptr)
    elif CASE == 9:
        a = dsl.load(f16_ptr + r)
        b = dsl.load(bf16_ptr + r)
    else:
        a = -3
        b = dsl.load(u8_ptr + r).to(dsl.uint64)
    if BRANCH:
        v = _checked(a) if flag != 0 else b
    else:
        v = dsl.where(flag != 0, a, b)
    dsl.store(o_ptr + r[:, None] * 4 + r[None, :], (v + dsl.zeros((4, 4), dsl.int8)).to(dsl.float64))


def _typed_arguments(flag):
    return (torch.zeros(16, dtype=torch.float64), torch.tensor([1, -2, 100, -128], dtype=torch.int8),
            torch.tensor([0, 1, 200, 255], dtype=torch.uint8),
            torch.tensor([1.5, -2.25, 60000, 0.1], dtype=torch.float16),
            torch.tensor([3.0, -1.0, 1e30, 0.3], dtype=torch.bfloat16),
            torch.tensor([2 ** 40, -5, 7, 0], dtype=torch.int64), torch.tensor([1.0, -1.0, 0.0, 2.0]), flag)


@pytest.mark.parametrize("case", range(11))
def test_branching_conditional_expression_has_the_type_and_values_of_where(case):
    types, values = [], []
    for branch in (False, True):
        function = dsl.jit(_typed_arms_kernel.fn).ir(*_typed_arguments(1), CASE=case, BRANCH=branch)
        chooser = [op for op in function.walk() if op.opcode == (OpCode.IF if branch else OpCode.WHERE)][-1]
        types.append(chooser.results[0].type)
        for flag in (0, 1):
            arguments = _typed_arguments(flag)
            _typed_arms_kernel[(1,)](*arguments, interpret=True, CASE=case, BRANCH=branch)
            values.append(arguments[0].tolist())
    assert types[0] == types[1]
    assert values[:2] == values[2:]


@needs_ptxas
@pytest.mark.parametrize("case", [0, 3, 7, 10])
def test_branching_conditional_expression_compiles(case):
    for arch in ARCHS:
        compiled = dsl.jit(_typed_arms_kernel.fn).compile(*_typed_arguments(1), target=arch, CASE=case, BRANCH=True)
        assemble(compiled.asm["ptx"], arch)


@dsl.jit
def _store_twice(p, v):
    dsl.store(p, v)
    return v * 2.0


@dsl.jit
def _arms_kernel(o_ptr, x_ptr, idx_ptr, c_ptr, n, a, b, BLOCK: dsl.constexpr):
    # o: (8, BLOCK); x: (4 * BLOCK,) fp32; idx: int32 (BLOCK,); c: int32 counter. Rows of o, one construct each.
    r = dsl.arange(0, BLOCK)
    # 0: a block load against a scalar
    dsl.store(o_ptr + r, dsl.load(x_ptr + r, mask=r < n, other=0.0) if a > 0 else 5.0)
    # 1: pointer arms (a pointer block read from memory against a plain one)
    p = (x_ptr + dsl.load(idx_ptr + r)) if b > 0 else x_ptr + BLOCK + r
    dsl.store(o_ptr + BLOCK + r, dsl.load(p))
    # 2: nested conditional expressions, loads in three arms
    v = (dsl.load(x_ptr + r) if a > 0 else dsl.load(x_ptr + BLOCK + r)) if b > 0 else \
        (2.0 if a > 1 else dsl.load(x_ptr + 2 * BLOCK + r) * 3.0)
    dsl.store(o_ptr + 2 * BLOCK + r, v)
    # 3: inside a loop, the other arm reads the carried value
    acc = dsl.zeros((BLOCK,), dsl.float32)
    for i in range(0, 4):
        acc = acc + (dsl.load(x_ptr + i * BLOCK + r) if i % 2 == a % 2 else acc * 0.5)
    dsl.store(o_ptr + 3 * BLOCK + r, acc)
    # 4: inside an `if`, chained comparison
    w = dsl.zeros((BLOCK,), dsl.float32) - 1.0
    if b >= 0:
        w = dsl.load(x_ptr + a * BLOCK + r) if 0 <= a < 4 else w * 2.0
    dsl.store(o_ptr + 4 * BLOCK + r, w)
    # 5: a (M, 1) load against a (1, N) load, broadcast to (BLOCK, BLOCK), reduced back to a row
    grid = dsl.load(x_ptr + r)[:, None] if a > 0 else dsl.load(x_ptr + BLOCK + r)[None, :]
    dsl.store(o_ptr + 5 * BLOCK + r, dsl.sum(grid + dsl.zeros((BLOCK, BLOCK), dsl.float32), axis=0))
    # 6: an arm storing through a helper (only when taken), then a counter bumped only when taken
    dsl.store(o_ptr + 6 * BLOCK + r, _store_twice(o_ptr + 7 * BLOCK + r, r.to(dsl.float32)) if a > 2 else 3.0)
    old = dsl.atomic_add(c_ptr, 1) if b > 1 else -1
    dsl.store(o_ptr + 7 * BLOCK + r, dsl.load(o_ptr + 7 * BLOCK + r) + old.to(dsl.float32) * 0.0 + (old < 0).to(dsl.float32))


def _arms_reference(x, idx, n, a, b, block):
    rows = torch.zeros(8, block, dtype=torch.float64)
    x = x.double()
    r = torch.arange(block)
    rows[0] = torch.where(r < n, x[:block], 0.0) if a > 0 else 5.0
    rows[1] = x[idx.long()] if b > 0 else x[block:2 * block]
    if b > 0:
        rows[2] = x[:block] if a > 0 else x[block:2 * block]
    else:
        rows[2] = 2.0 if a > 1 else x[2 * block:3 * block] * 3.0
    acc = torch.zeros(block, dtype=torch.float64)
    for i in range(4):
        acc = acc + (x[i * block:(i + 1) * block] if i % 2 == a % 2 else acc * 0.5)
    rows[3] = acc
    w = torch.full((block,), -1.0, dtype=torch.float64)
    if b >= 0:
        w = x[a * block:(a + 1) * block] if 0 <= a < 4 else w * 2.0
    rows[4] = w
    rows[5] = x[:block].sum() if a > 0 else x[block:2 * block] * block
    rows[6] = r.double() * 2.0 if a > 2 else 3.0
    stored = r.double() if a > 2 else torch.full((block,), 7.0, dtype=torch.float64)
    rows[7] = stored + (0.0 if b > 1 else 1.0)
    return rows.reshape(-1)


ARMS_CASES = [(1, 1), (3, 2), (0, 0), (2, -1), (5, 3)]


def _arms_arguments(a, b, block=16):
    x = torch.arange(4 * block, dtype=torch.float32) * 0.5 - 3.0
    idx = torch.arange(block, dtype=torch.int32).flip(0) * 2 + 1
    o = torch.full((8 * block,), 7.0)
    return o, x, idx, torch.zeros(1, dtype=torch.int32), 11, a, b


@pytest.mark.parametrize("a,b", ARMS_CASES)
def test_conditional_expression_arms_in_the_interpreter(a, b):
    o, x, idx, counter, n, *_ = arguments = _arms_arguments(a, b)
    _arms_kernel[(1,)](*arguments, interpret=True, BLOCK=16)
    assert_close(o, _arms_reference(x, idx, n, a, b, 16), dtype=torch.float32)
    assert counter.tolist() == [1 if b > 1 else 0]


@needs_ptxas
def test_conditional_expression_arms_compile():
    for arch in ARCHS:
        compiled = dsl.jit(_arms_kernel.fn).compile(*_arms_arguments(3, 2), target=arch, BLOCK=16)
        assemble(compiled.asm["ptx"], arch)
        assert re.search(r"\batom\.", compiled.asm["ptx"])


@dsl.jit
def _early(p, i, n):
    if i >= n:
        return -1.0
    v = dsl.load(p + i)
    if v < 0.0:
        return 0.0
    return v * 2.0


@dsl.jit
def _prefix(p, n):
    s = 0.0
    for j in range(0, n):
        s += dsl.load(p + j)
    return s


@dsl.jit
def _scalar_arms_kernel(o_ptr, x_ptr, c_ptr, a, b, n, m):
    # scalar-only (host-runnable): o[0..3] as in `_scalar_reference`, o[4 + i] for i < m
    v = (dsl.load(x_ptr + a) if 0 <= a < n else -1.0) if b != 0 else (dsl.load(x_ptr + b + 1) if a > 100 else 2.5)
    dsl.store(o_ptr, v)
    p = (x_ptr + dsl.load(c_ptr + 1)) if a < n else x_ptr
    dsl.store(o_ptr + 1, dsl.load(p))
    total = 0.0
    for i in range(0, n):
        total = total + (dsl.load(c_ptr + i % 3) if i % 2 == 0 else -10).to(dsl.float32)
    dsl.store(o_ptr + 2, total)
    w = dsl.load(c_ptr + 2).to(dsl.int8) if a > 0 else 300
    dsl.store(o_ptr + 3, w.to(dsl.float32))
    for i in range(0, m):
        dsl.store(o_ptr + 4 + i, _early(x_ptr, i, n) if i % 2 == 0 else (_prefix(x_ptr, i) if i < n else 5.0))


def _scalar_reference(x, c, a, b, n, m):
    x = x.tolist()
    out = [(x[a] if 0 <= a < n else -1.0) if b != 0 else (x[b + 1] if a > 100 else 2.5)]
    out.append(x[c[1]] if a < n else x[0])
    out.append(float(sum(c[i % 3] if i % 2 == 0 else -10 for i in range(n))))
    out.append(float(c[2]) if a > 0 else 300.0)
    for i in range(m):
        if i % 2 == 0:
            out.append(-1.0 if i >= n else (0.0 if x[i] < 0 else x[i] * 2.0))
        else:
            out.append(float(sum(x[:i])) if i < n else 5.0)
    return out


@pytest.mark.parametrize("a,b", [(1, 1), (7, 1), (1, 0), (200, 0), (-3, 2)])
def test_scalar_conditional_expressions_on_the_host_and_in_the_interpreter(a, b):
    x = torch.tensor([1.0, -2.0, 3.0, 4.5, -5.0, 6.0, 7.0, 8.0, 9.0, 10.0])
    c = [0, 3, 77]
    n, m = 5, 8
    expected = _scalar_reference(x, c, a, b, n, m)
    for run in ("interpreter", "host"):
        out = torch.full((4 + m,), float("nan"))
        arguments = (out, x, torch.tensor(c, dtype=torch.int32), a, b, n, m)
        if run == "host":
            run_on_host(_scalar_arms_kernel, *arguments)
        else:
            _scalar_arms_kernel[(1,)](*arguments, interpret=True)
        assert out.tolist() == pytest.approx(expected), run


@dsl.jit
def _statement_and_loops_kernel(o_ptr, x_ptr, c_ptr, n_ptr, flag, n):
    dsl.atomic_add(c_ptr, 1) if flag != 0 else 0        # an expression statement
    i = 0
    while (dsl.load(x_ptr + i) if i < n else 0.0) > 0.0:
        i += 1
    dsl.store(o_ptr, i)
    total = 0
    for j in range(0, dsl.load(n_ptr) if flag != 0 else 3):
        total += j
    dsl.store(o_ptr + 1, total)


def test_conditional_expression_as_statement_while_condition_and_range_bound():
    x = torch.tensor([1.0, 2.0, 3.0, -1.0])
    for flag, n, expected in ((0, 4, [3, 3]), (1, 2, [2, 10]), (2, 4, [3, 10])):
        out, counter = torch.zeros(2, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
        _statement_and_loops_kernel[(1,)](out, x, counter, torch.tensor([5], dtype=torch.int32), flag, n,
                                          interpret=True)
        assert out.tolist() == expected and counter.tolist() == [int(flag != 0)]
    if ptxas_available():
        for arch in ARCHS:
            compiled = dsl.jit(_statement_and_loops_kernel.fn).compile(
                torch.zeros(2, dtype=torch.int32), x, torch.zeros(1, dtype=torch.int32),
                torch.zeros(1, dtype=torch.int32), 1, 4, target=arch)
            assemble(compiled.asm["ptx"], arch)
            assert re.search(r"\b(atom|red)\.", compiled.asm["ptx"])     # the statement's atomic is kept


@dsl.jit
def _descriptor_arms_kernel(o_ptr, a_ptr, b_ptr, M, N, K, flag, BM: dsl.constexpr, BN: dsl.constexpr,
                            BK: dsl.constexpr):
    # tensor-descriptor loads in the arms inside a wgmma K loop: acc = flag * A B + column sums of B[:BK]
    a_desc = dsl.make_tensor_descriptor(a_ptr, (M, K), (K, 1), (BM, BK))
    b_desc = dsl.make_tensor_descriptor(b_ptr, (K, N), (N, 1), (BK, BN))
    acc = dsl.zeros((BM, BN), dsl.float32)
    for k0 in range(0, K, BK):
        a = a_desc.load((0, k0)) if flag != 0 else dsl.zeros((BM, BK), dsl.float16)
        acc = dsl.dot(a, b_desc.load((k0, 0)), acc)
        acc = acc + (b_desc.load((k0, 0)).to(dsl.float32).sum(axis=0)[None, :] if k0 == 0 else 0.0)
    rm = dsl.arange(0, BM)
    rn = dsl.arange(0, BN)
    dsl.store(o_ptr + rm[:, None] * N + rn[None, :], acc)


@pytest.mark.parametrize("tma", ["0", "1"])
def test_descriptor_loads_in_the_arms(tma, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_TMA", tma)
    generator = torch.Generator().manual_seed(11)
    a, b = torch.randn(64, 96, generator=generator).half(), torch.randn(96, 64, generator=generator).half()
    tile = dict(BM=64, BN=64, BK=32)
    for flag in (0, 1):
        out = torch.full((64, 64), float("nan"))
        _descriptor_arms_kernel[(1,)](out, a, b, 64, 64, 96, flag, interpret=True, **tile)
        assert_close(out, (a.double() @ b.double()) * flag + b[:32].double().sum(0)[None, :], dtype=torch.float32)
    function = _pipelined(_descriptor_arms_kernel, (torch.empty(64, 64), a, b, 64, 64, 96, 1), **tile)
    assert _wait_violations(function) == []
    if ptxas_available():
        for arch in ARCHS:
            compiled = dsl.jit(_descriptor_arms_kernel.fn).compile(torch.empty(64, 64), a, b, 64, 64, 96, 1,
                                                                    target=arch, num_stages=3, **tile)
            result = assemble(compiled.asm["ptx"], arch)
            assert result.spill_bytes == 0 and not _serialized(result.log), result.log


@dsl.jit
def _ifexp_between_dots_kernel(o_ptr, a_ptr, b_ptr, bias_ptr, M, N, K, BM: dsl.constexpr, BN: dsl.constexpr,
                               BK: dsl.constexpr):
    # x, y issued; a conditional expression loading a bias row (an IF) between issue and read
    rm = dsl.arange(0, BM)
    rn = dsl.arange(0, BN)
    rk = dsl.arange(0, BK)
    acc = dsl.zeros((BM, BN), dsl.float32)
    for k0 in range(0, K, BK):
        kk = k0 + rk
        pa = a_ptr + rm[:, None] * K + kk[None, :]
        pb = b_ptr + kk[:, None] * N + rn[None, :]
        x = dsl.dot(dsl.load(pa), dsl.load(pb), dsl.zeros((BM, BN), dsl.float32))
        y = dsl.dot(dsl.load(pa + M * K), dsl.load(pb + K * N), dsl.zeros((BM, BN), dsl.float32))
        bias = dsl.load(bias_ptr + rn)[None, :] if k0 == 0 else 0.0
        acc = acc + x - y * 0.5 + bias
    dsl.store(o_ptr + rm[:, None] * N + rn[None, :], acc)


def test_conditional_expression_between_deferred_dots():
    generator = torch.Generator().manual_seed(12)
    a = torch.randn(2, 64, 64, generator=generator).half()
    b = torch.randn(2, 64, 64, generator=generator).half()
    bias = torch.randn(64, generator=generator)
    args = (torch.full((64, 64), float("nan")), a, b, bias, 64, 64, 64)
    tile = dict(BM=64, BN=64, BK=32)
    function = _pipelined(_ifexp_between_dots_kernel, args, **tile)
    assert _wait_violations(function) == []
    assert _wait_violations(_pipelined(_ifexp_between_dots_kernel, args, combine=True, **tile)) == []
    body = _loop_body(function)
    assert _waits_of(body) == [(0, 2)]
    assert body.ops.index(next(op for op in body.ops if op.opcode == OpCode.WGMMA_WAIT)) + 1 == \
        body.ops.index(next(op for op in body.ops if op.opcode == OpCode.IF))
    _ifexp_between_dots_kernel[(1,)](*args, interpret=True, **tile)
    expected = _steps(a[0], b[0], 32) - 0.5 * _steps(a[1], b[1], 32) + bias.double()[None, :]
    assert_close(args[0], expected, dtype=torch.float32)


@dsl.jit
def _tuple_arms_kernel(o_ptr, x_ptr, flag, KIND: dsl.constexpr):
    if KIND == 0:
        a, b = (dsl.load(x_ptr), 1.0) if flag != 0 else (2.0, dsl.load(x_ptr + 1))
        dsl.store(o_ptr, a + b)
    else:
        dsl.store(o_ptr, dsl.load(x_ptr) if flag != 0 else None)


@pytest.mark.parametrize("kind", [0, 1])
def test_tuple_and_none_arms_with_a_runtime_condition_are_compilation_errors(kind):
    # (as in Triton, whose runtime ternary takes one value per arm: a clean error, not a crash)
    with pytest.raises(dsl.CompilationError, match="cannot be combined with a kernel value"):
        dsl.jit(_tuple_arms_kernel.fn).ir(torch.zeros(1), torch.zeros(2), 3, KIND=kind)


@pytest.mark.cuda
@pytest.mark.parametrize("store_p", [False, True])
@pytest.mark.parametrize("order", [0, 1, 2])
def test_gpu_register_a_kernel_against_float64(order, store_p):
    # the software-pipelined P V loop compiled with the deferred waits, on the GPU (P rounded to fp16 as in
    # the reference, so the tolerance is fp16's), poisoned output
    o, ps, q, k, v, length_q, length = _pv_arguments()
    o, ps, q, k, v = (t.cuda() for t in (o, ps, q, k, v))
    _pv_kernel[(1,)](o, ps, q, k, v, length_q, length, num_warps=4, num_stages=3, ORDER=order, STORE_P=store_p,
                     **PV)
    torch.cuda.synchronize()
    assert_close(o.cpu(), _pv_reference(q.cpu(), k.cpu(), v.cpu(), order), dtype=torch.float16)
