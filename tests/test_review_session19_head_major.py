"""Review (session 19): the head-major dK/dV kernel (HEAD_MAJOR, `head_major_program`, AttentionConfig.head_major,
on for BACKWARD_CONFIGS[64]; commits d9df98b..a2293a2), tried on the CPU.

Tried: the mapping alone, through a kernel that records what `head_major_program` gives each program:
every (head, key block) taken exactly once and in launch order (t = y * B * H_kv + x -> (t // blocks,
t % blocks)) on 18 grids (1 x 1, one head, one key block, coprime, dividing either way, primes, 1000 x 1);
the same on the IR after the sm_90a / sm_80 pass pipelines; grids at CUDA's limits (B * H_kv = 2**31 - 1,
65535 key blocks, program counts just past 2**31 and 2**32) by running single programs of the grid in the
interpreter (frontend and pipelined IR), with a control showing the check catches an int32 launch index;
the kernel's IR (int64 mul / idiv / mod; no num_programs without HEAD_MAJOR). End to end in the
interpreter, outputs poisoned (NaN): attention_backward with forced (head-major dK/dV, interpreter dQ)
configs against the same config in launch order (bit for bit) and float64 autograd, over one head / one
key block, ragged lengths, causal with L < S and L > S, GQA groups 1-4 (H_kv 1 and 2), broadcast and
per-head bool / additive masks with dead rows, E 16 / 32 / 48 / 64 / 80, float16 / float32 / float64, the
table's 64 x 128 tile, BLOCK_M != BLOCK_N and kv_ring + head_major; the table's tile after the sm_90a and
sm_80 pass pipelines (the IR lowered to PTX), float16, head-major vs launch order bit for bit and vs
float64; fusedops.scaled_dot_product_attention + autograd with INTERPRETER_CONFIG made head-major. The GPU
launcher's choice (kernels' `prepare` replaced by a spy): HEAD_MAJOR exactly where the padded head dims
select the 64 entry (E, Ev <= 64, masked or not; E = 80 pads to 128: launch order), grid (B * H_kv, cdiv(S,
BLOCK_N)), never for dQ. The sweep: the table entry's launch-order twin is an alternative; bench
`_config_name` ("hm" suffix, every sweep name distinct, format_sweep lines). ptxas (sm_90a and sm_80): the
head-major table entry (E 64 and 32, causal, bool / additive masks) and the head-major alternatives (64 x 64
w4, E = 128 32 x 128) spill no more than launch order (0 on sm_90a), same shared memory, same loop-body
instruction mix, and a 64-bit divide outside the loops. GPU tier (`-m cuda`, skipped here): head-major vs
launch-order dQ / dK / dV bit for bit, poisoned, for 7 shapes (masks, one head / one key block, 64 key
blocks, B * H_kv = 70000) and the autograd default path.

Held: all of the above (the mapping is a bijection in launch order, exact up to 2**31 - 1 x 65535; results
are bit-identical to launch order in the frontend and pipelined IR; no extra spills).

Defect found (tests/test_attention.py, not fusedops; fixed): `compile_backward` passed KV_RING but not
HEAD_MAJOR (nor EARLY_DP) from its config, so the repository's PTX tests of the E = 64 dK/dV kernel (wgmma with
register A, 1 barrier per block, 0 spills, the sweep alternatives) compiled it in launch order: the shipped
head-major kernel was never compiled by them (test_compile_backward_compiles_the_shipped_head_major_kernel).

Observations: the CPU paths (INTERPRETER_CONFIG) never take the head-major kernel unless a config is forced;
a head_major config given to the forward or as the dQ config is accepted and ignored; on sm_80 the E = 64
table dK/dV tile spills 104 bytes with a bool attn_mask (4 causal) in either mapping (not new).
"""

from __future__ import annotations

import collections
import dataclasses
import importlib.util
import random
import re
import sys
from pathlib import Path

import pytest
import torch

import fusedops
import fusedops.dsl as dsl
from fusedops.dsl.interpreter import Interpreter
from fusedops.dsl.interpreter.arguments import bind_arguments
from fusedops.dsl.interpreter.context import ProgramContext
from fusedops.dsl.ir import print_function
from fusedops.dsl.target import assemble, ptxas_available
from fusedops.kernels import attention as at, attention_backward_kernels
from fusedops.kernels.attention_backward_kernels import attention_backward_dkdv_kernel
from fusedops.kernels.attention_configs import (
    BACKWARD_CONFIGS, DKDV_ALTERNATIVES, DQ_HEAD_MAJOR_PER_SM, INTERPRETER_CONFIG, MASKED_DKDV_CONFIGS, AttentionConfig,
    backward_configs, head_block, sweep_configs)
from fusedops.kernels.attention_grid import head_major_program
from fusedops.kernels.attention_logits import ADDITIVE_MASK, BOOL_MASK, NO_MASK
from fusedops.kernels.device_info import INTERPRETER_SMS
from codegen_helpers import interpret_ir, pipelined_ir
from helpers import assert_close, poison, random_tensor
from test_attention import _loop_bodies, _mask_with_dead_rows, _qkv, compile_backward, reference

needs_ptxas = pytest.mark.skipif(not ptxas_available(), reason="ptxas is not on the PATH")

INT32_MAX = 2**31 - 1
MAX_GRID_Y = at.MAX_GRID_Y


# -- the mapping itself: a kernel that records what `head_major_program` gives each program ---------------

@dsl.jit
def _coverage_kernel(count_ptr, launch_ptr):
    # count_ptr, launch_ptr: (grid x * grid y,) int32 / int64, slot head * blocks + block. The interpreter
    # runs one program at a time, so the load + store count is exact; a head or block out of range is an
    # out-of-bounds access (an InterpreterError).
    head, block = head_major_program()
    slot = head.to(dsl.int64) * dsl.num_programs(1) + block
    dsl.store(count_ptr + slot, dsl.load(count_ptr + slot) + 1)
    dsl.store(launch_ptr + slot, dsl.program_id(1).to(dsl.int64) * dsl.num_programs(0) + dsl.program_id(0))


@dsl.jit
def _mapping_kernel(out_ptr):
    # out_ptr: (2,) int32: (head, block) of the program
    head, block = head_major_program()
    dsl.store(out_ptr, head)
    dsl.store(out_ptr + 1, block)


@dsl.jit
def _int32_mapping_kernel(out_ptr):
    # the same mapping with the launch index in int32: what the int64 cast guards against (a control: the
    # checker below must catch it)
    blocks = dsl.num_programs(1)
    launched = dsl.program_id(1) * dsl.num_programs(0) + dsl.program_id(0)
    dsl.store(out_ptr, launched // blocks)
    dsl.store(out_ptr + 1, launched % blocks)


# grids (B * H_KV, key blocks): one head, one key block, coprime, dividing either way, primes, long rows
_SMALL_GRIDS = [(1, 1), (1, 7), (7, 1), (2, 3), (3, 2), (6, 4), (4, 6), (6, 3), (3, 6), (5, 5), (12, 8), (8, 12),
                (97, 3), (3, 97), (33, 31), (1, 1000), (1000, 1), (64, 65)]


@pytest.mark.parametrize("grid", _SMALL_GRIDS, ids=str)
def test_every_head_and_key_block_once_in_launch_order(grid):
    """Over every program of the grid, each (head, key block) is taken exactly once (count 1, nothing out of
    range), and the program launched t-th (t = y * grid_x + x) takes (t // blocks, t % blocks): consecutive
    programs walk one head's key blocks before the next head's."""
    heads, blocks = grid
    counts = torch.zeros(heads * blocks, dtype=torch.int32)
    launched = poison(torch.empty(heads * blocks, dtype=torch.int64))
    _coverage_kernel[grid](counts, launched, interpret=True)
    assert counts.min().item() == 1 and counts.max().item() == 1, counts.bincount()
    assert torch.equal(launched, torch.arange(heads * blocks, dtype=torch.int64))


@pytest.mark.parametrize("arch,num_warps", [("sm_90a", 8), ("sm_80", 4)])
@pytest.mark.parametrize("grid", [(6, 4), (97, 3), (1, 7)], ids=str)
def test_mapping_survives_the_pass_pipeline(grid, arch, num_warps):
    """The same over the IR after the default pass pipeline (the IR the GPU compiler lowers): no rewrite
    (simplify, fold, CSE) turns the int64 launch index or its division back into something else."""
    heads, blocks = grid
    counts = torch.zeros(heads * blocks, dtype=torch.int32)
    launched = poison(torch.empty(heads * blocks, dtype=torch.int64))
    function, _ = pipelined_ir(_coverage_kernel, (counts, launched), {}, num_warps, arch=arch)
    interpret_ir(_coverage_kernel, function, grid, (counts, launched), {})
    assert counts.min().item() == 1 and counts.max().item() == 1
    assert torch.equal(launched, torch.arange(heads * blocks, dtype=torch.int64))


def _run_programs_alone(function, grid, programs) -> list:
    """(head, block) that `function` (the IR of a kernel storing them into its (2,) int32 argument)
    computes for each program (x, y) of `programs` on `grid`, each run alone: a grid of 2**31 - 1 x 65535
    programs cannot be run whole, but one program reads its grid only through num_programs."""
    interpreter = Interpreter(function)
    out = torch.empty(2, dtype=torch.int32)
    results = []
    for x, y in programs:
        poison(out)
        bound = bind_arguments(function, [out], interpreter.arg_names)
        try:
            context = ProgramContext((x, y, 0), (grid[0], grid[1], 1), bound.memory, interpreter._plans,
                                     function.name, function, bound.pointer_names)
            context.run_region(function.body, bound.values)
        finally:
            bound.finish()
        results.append((int(out[0]), int(out[1])))
    return results


# grids up to CUDA's limits (2**31 - 1 on x, 65535 on y), and ones whose program count just passes 2**31
# (46341**2) or 2**32
_HUGE_GRIDS = [(INT32_MAX, MAX_GRID_Y), (INT32_MAX, 1), (INT32_MAX, 2), (INT32_MAX, 3), (2**30 + 1, MAX_GRID_Y),
               (65537, MAX_GRID_Y), (1, MAX_GRID_Y), (46341, 46341), (65536, 65536 - 1), (3 * 2**29, 7)]


def _probe_programs(grid, count=24, seed=0) -> list:
    """Corners, the programs whose launch index crosses 2**31 and 2**32, and random ones."""
    nx, ny = grid
    programs = {(0, 0), (nx - 1, 0), (0, ny - 1), (nx - 1, ny - 1), (nx // 2, ny // 2)}
    for boundary in (2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**33):
        if boundary < nx * ny:
            programs.add((boundary % nx, boundary // nx))
    generator = random.Random(seed * 7919 + nx + ny)
    programs.update((generator.randrange(nx), generator.randrange(ny)) for _ in range(count))
    return sorted(programs)


def _mapping_errors(function, grid) -> list:
    programs = _probe_programs(grid)
    nx, ny = grid
    errors = []
    for (x, y), got in zip(programs, _run_programs_alone(function, grid, programs)):
        launched = y * nx + x
        want = (launched // ny, launched % ny)
        if got != want:
            errors.append(((x, y), got, want))
    return errors


@pytest.mark.parametrize("ir", ["frontend", "sm_90a", "sm_80"])
@pytest.mark.parametrize("grid", _HUGE_GRIDS, ids=str)
def test_huge_grids_map_exactly(grid, ir):
    """B * H_KV up to 2**31 - 1 and 65535 key blocks: the launch index y * B * H_KV + x (up to ~2**47)
    is formed in int64, so the (head, block) of every probed program is exact, and both fit int32 again
    (head < B * H_KV <= 2**31 - 1)."""
    out = torch.empty(2, dtype=torch.int32)
    if ir == "frontend":
        function = dsl.jit(_mapping_kernel.fn).ir(out)
    else:
        function, _ = pipelined_ir(_mapping_kernel, (out,), {}, 8 if ir == "sm_90a" else 4, arch=ir)
    assert _mapping_errors(function, grid) == []


def test_the_huge_grid_check_catches_int32_launch_indices():
    """Control: the same check on the mapping with an int32 launch index finds wrong programs on every grid
    of more than 2**31 programs (so the test above can fail)."""
    out = torch.empty(2, dtype=torch.int32)
    function = dsl.jit(_int32_mapping_kernel.fn).ir(out)
    for grid in _HUGE_GRIDS:
        errors = _mapping_errors(function, grid)
        assert bool(errors) == (grid[0] * grid[1] > 2**31), (grid, errors[:3])


def test_head_major_ir_forms_the_launch_index_in_int64():
    """The dK/dV kernel's frontend IR with HEAD_MAJOR: program_id(1) * num_programs(0) + program_id(0), the
    division and the remainder are int64 ops; without HEAD_MAJOR none of num_programs is read."""
    texts = {}
    for head_major in (False, True):
        args, constexprs, _ = _dkdv_arguments((1, 2, 1, 20, 40, 64), torch.float16, False, None, 1,
                                              BACKWARD_CONFIGS[64][0], head_major)
        texts[head_major] = print_function(dsl.jit(attention_backward_dkdv_kernel.fn).ir(*args, **constexprs))
    assert "num_programs" not in texts[False]
    head_major = texts[True]
    assert "num_programs {axis=0}" in head_major and "num_programs {axis=1}" in head_major
    assert re.search(r"= idiv %\d+, %\d+ : int64", head_major) and re.search(r"= mod %\d+, %\d+ : int64", head_major)


# -- the kernel end to end in the interpreter ----------------------------------------------------------------

@pytest.fixture
def poisoned(monkeypatch):
    """Every tensor the attention launchers allocate (o, lse, delta, dq, dk, dv) starts as NaN, so a
    (head, key block) the dK/dV kernel skips cannot pass. Launches prepared before hold their allocators:
    the caches are emptied before and after."""
    allocator = at.contiguous_allocator
    monkeypatch.setattr(at, "contiguous_allocator", lambda shape, dtype, device: (
        lambda new: lambda: poison(new()))(allocator(shape, dtype, device)))
    caches = (at._FORWARD_LAUNCHES, at._BACKWARD_LAUNCHES)
    for cache in caches:
        cache.clear()
    yield
    for cache in caches:
        cache.clear()


def _mask(kind, batch, heads, length_q, length_k, seed, dtype, per_head, device="cpu"):
    if kind is None:
        return None
    shape = (batch, heads, length_q, length_k) if per_head else (length_q, length_k)
    return _mask_with_dead_rows(kind, shape, seed, dtype, device).expand(batch, heads, length_q, length_k)


def _backward_pair(shape, dtype, causal, kind, per_head, config, seed, scale=0.3):
    """(head-major grads, launch-order grads, float64 grads) of attention_backward in the interpreter with the
    dK/dV config `config` forced both ways (dQ: the interpreter's config)."""
    batch, heads, heads_kv, length_q, length_k, dim = shape
    q, k, v = _qkv((batch, heads, length_q, dim), (batch, heads_kv, length_k, dim), (batch, heads_kv, length_k, dim),
                   dtype, seed)
    grad_out = random_tensor((batch, heads, length_q, dim), dtype, seed=seed + 5)
    mask = _mask(kind, batch, heads, length_q, length_k, seed, dtype if dtype == torch.float64 else torch.float32,
                 per_head)
    out, lse = at.attention_forward(q, k, v, mask, causal, scale, interpret=True)
    results = []
    for head_major in (True, False):
        kv_config = dataclasses.replace(config, head_major=head_major)
        results.append(at.attention_backward(grad_out, q, k, v, out, lse, mask, causal, scale, interpret=True,
                                             configs=(kv_config, INTERPRETER_CONFIG)))
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    expected = reference(q64, k64, v64, mask, causal=causal, scale=scale, enable_gqa=True)
    return results[0], results[1], torch.autograd.grad(expected, (q64, k64, v64), grad_out.double())


_HM = AttentionConfig(16, 16, 4, 1, head_major=True)
# (B, H, H_kv, L, S, E), dtype, causal, mask kind, mask per (batch, head), dK/dV config
_CASES = [
    ((1, 1, 1, 9, 9, 32), torch.float32, False, None, False, _HM),           # one head, one key block
    ((1, 1, 1, 20, 7, 32), torch.float32, True, None, False, _HM),           # causal L > S, one key block
    ((1, 1, 1, 23, 50, 64), torch.float32, True, None, False, _HM),          # one head, 4 ragged key blocks
    ((3, 6, 2, 37, 50, 64), torch.float32, False, None, False, _HM),         # GQA 3: grid 6 x 4
    ((5, 4, 1, 19, 41, 64), torch.float32, True, None, False, _HM),          # GQA 4, H_kv 1: grid 5 x 3
    ((2, 4, 2, 33, 45, 64), torch.float32, False, "bool", False, _HM),       # broadcast bool mask, dead rows
    ((2, 4, 2, 33, 45, 32), torch.float32, True, "float", True, _HM),        # per-head additive mask, causal
    ((1, 3, 1, 17, 40, 80), torch.float32, True, "bool", True, _HM),         # E = 80 (BLOCK_E 128)
    ((2, 2, 1, 21, 35, 16), torch.float64, True, "float", False, _HM),       # float64 (gradcheck's dtype)
    ((2, 4, 2, 30, 70, 64), torch.float16, False, None, False, _HM),
    ((2, 4, 2, 100, 300, 64), torch.float32, True, "bool", False, BACKWARD_CONFIGS[64][0]),   # the table's
    ((2, 6, 2, 37, 70, 64), torch.float32, True, None, False,
     AttentionConfig(16, 32, 4, 1, kv_ring=True, head_major=True)),       # with kv_ring
    ((3, 2, 1, 40, 37, 48), torch.float32, True, "float", False, AttentionConfig(32, 16, 4, 1, head_major=True)),
]


@pytest.mark.parametrize("shape,dtype,causal,kind,per_head,config", _CASES,
                         ids=[f"{c[0]}-{str(c[1])[6:]}-{'causal' if c[2] else 'full'}-{c[3]}-"
                              f"{c[5].block_m}x{c[5].block_n}{'kvring' if c[5].kv_ring else ''}" for c in _CASES])
def test_head_major_backward_against_float64_and_launch_order(shape, dtype, causal, kind, per_head, config, seed,
                                                               poisoned):
    """Forced (head-major dK/dV, interpreter dQ) configs through attention_backward in the interpreter, outputs
    poisoned: dQ, dK and dV equal those of the launch-order mapping bit for bit (each (head, key block) sums
    the same terms in the same order), and are within the dtype's tolerance of float64 autograd."""
    head_major, launch_order, expected = _backward_pair(shape, dtype, causal, kind, per_head, config, seed)
    for ours, theirs, want in zip(head_major, launch_order, expected):
        assert torch.isfinite(ours).all()
        assert torch.equal(ours, theirs)
        assert_close(ours, want, dtype, tol=5e-3 if dtype == torch.float16 else None)


def _dkdv_arguments(shape, dtype, causal, kind, seed, config, head_major):
    """(arguments, constexprs, grid) of attention_backward_dkdv_kernel as `_backward_launcher` makes them, dk and
    dv poisoned, lse from the interpreter's forward and delta = rowsum(dO * O)."""
    batch, heads, heads_kv, length_q, length_k, dim = shape
    q, k, v = _qkv((batch, heads, length_q, dim), (batch, heads_kv, length_k, dim), (batch, heads_kv, length_k, dim),
                   dtype, seed)
    grad_out = random_tensor((batch, heads, length_q, dim), dtype, seed=seed + 5)
    mask = _mask(kind, batch, heads, length_q, length_k, seed, torch.float32, False)
    out, lse = at.attention_forward(q, k, v, mask, causal, 0.3, interpret=True)
    delta = (out.float() * grad_out.float()).sum(-1).contiguous()
    dk, dv = poison(torch.empty_like(k)), poison(torch.empty_like(v))
    mask_arg, mask_strides, mask_kind = at._mask_arguments(mask, q)
    strides = [stride for t in (q, k, v, grad_out, dk, dv) for stride in at._strides(t)]
    block = head_block(dim)
    arguments = (dk, dv, q, k, v, grad_out, lse, delta, mask_arg, *strides, *mask_strides, heads_kv, heads // heads_kv,
                 length_q, length_k, dim, dim, *at._float_pair(0.3 * at.LOG2E), *at._float_pair(0.3))
    constexprs = dict(BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_E=block, BLOCK_EV=block, CAUSAL=causal,
                      MASK_KIND=mask_kind, ACC=dsl.float32, KV_RING=config.kv_ring, EARLY_DP=config.early_dp,
                      HEAD_MAJOR=head_major)
    return arguments, constexprs, (batch * heads_kv, -(-length_k // config.block_n))


@pytest.mark.parametrize("arch", ["sm_90a", "sm_80"])
@pytest.mark.parametrize("shape,causal,kind", [((2, 4, 2, 100, 300, 64), True, None),
                                               ((3, 2, 1, 70, 200, 64), False, "bool"),
                                               ((1, 3, 3, 65, 129, 32), True, "float")], ids=str)
def test_pipelined_table_kernel_head_major_equals_launch_order(shape, causal, kind, arch, seed):
    """The table's E = 64 dK/dV config (64 x 128, 8 warps, 2 stages) after the GPU pass pipeline (the IR
    that is lowered to PTX), float16, in the interpreter, dk / dv poisoned: head-major and launch-order
    give the same bits, and are within float16's tolerance of float64."""
    config = BACKWARD_CONFIGS[64][0]
    results = []
    for head_major in (True, False):
        arguments, constexprs, grid = _dkdv_arguments(shape, torch.float16, causal, kind, seed, config, head_major)
        function, _ = pipelined_ir(attention_backward_dkdv_kernel, arguments, constexprs, config.num_warps,
                                   arch=arch, num_stages=config.num_stages)
        interpret_ir(attention_backward_dkdv_kernel, function, grid, arguments, constexprs)
        results.append(arguments[:6])
    (dk, dv, q, k, v, grad_out), (dk_lo, dv_lo, *_) = results
    assert torch.isfinite(dk).all() and torch.isfinite(dv).all()
    assert torch.equal(dk, dk_lo) and torch.equal(dv, dv_lo)
    batch, heads, heads_kv, length_q, length_k, dim = shape
    mask = _mask(kind, batch, heads, length_q, length_k, seed, torch.float32, False)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    expected = reference(q64, k64, v64, mask, causal=causal, scale=0.3, enable_gqa=True)
    _, dk64, dv64 = torch.autograd.grad(expected, (q64, k64, v64), grad_out.double())
    assert_close(dk, dk64, torch.float16, tol=5e-3)
    assert_close(dv, dv64, torch.float16, tol=5e-3)


@pytest.mark.parametrize("kind,causal", [(None, True), ("bool", False), ("float", True)])
def test_autograd_with_a_head_major_interpreter_config(kind, causal, seed, monkeypatch, poisoned):
    """fusedops.scaled_dot_product_attention + autograd in the interpreter take INTERPRETER_CONFIG (never
    head-major: the CPU path does not reach the new mapping on its own); with that config made head-major,
    GQA and masks, the gradients equal the launch-order ones bit for bit and float64's within tolerance."""
    monkeypatch.setenv("FUSEDOPS_INTERPRET", "1")
    assert not INTERPRETER_CONFIG.head_major
    q, k, v = _qkv((2, 6, 29, 24), (2, 2, 45, 24), (2, 2, 45, 24), torch.float32, seed, requires_grad=True)
    grad_out = random_tensor((2, 6, 29, 24), torch.float32, seed=seed + 5)
    mask = None if kind is None else _mask_with_dead_rows(kind, (29, 45), seed)
    grads = {}
    for head_major in (False, True):
        # patched where the launchers (kernels/attention.py) look it up
        monkeypatch.setattr(at, "INTERPRETER_CONFIG", dataclasses.replace(INTERPRETER_CONFIG, head_major=head_major))
        for cache in (at._FORWARD_LAUNCHES, at._BACKWARD_LAUNCHES):
            cache.clear()
        out = fusedops.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=True)
        grads[head_major] = torch.autograd.grad(out, (q, k, v), grad_out)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    expected = torch.autograd.grad(reference(q64, k64, v64, mask, causal=causal, enable_gqa=True), (q64, k64, v64),
                                   grad_out.double())
    for ours, theirs, want in zip(grads[True], grads[False], expected):
        assert torch.isfinite(ours).all() and torch.equal(ours, theirs)
        assert_close(ours, want, torch.float32)


# -- which launches take it -----------------------------------------------------------------------------------

class _PrepareSpy:
    """Stands in for a kernel's `prepare`: records its keyword arguments, returns a launch that does nothing
    (so the GPU launcher's choices can be seen on a machine without a GPU)."""

    def __init__(self):
        self.calls = []

    def __call__(self, grid, *args, **kwargs):
        self.calls.append((grid, kwargs))
        return lambda *tensors: None


@pytest.mark.parametrize("dim,dim_v,masked,head_major", [
    (64, 64, False, True), (64, 64, True, True), (32, 32, False, True), (16, 16, True, True), (48, 64, False, True),
    (33, 33, False, True), (80, 80, False, False), (65, 65, False, False), (64, 80, False, False),
    (128, 128, True, False), (256, 256, False, False)])
def test_gpu_launcher_asks_for_head_major_exactly_for_the_64_entry(dim, dim_v, masked, head_major, monkeypatch):
    """attention_backward's GPU launcher (interpret=False, configs=None) prepares the dK/dV kernel with
    HEAD_MAJOR where the padded head dims select BACKWARD_CONFIGS[64] (E, Ev <= 64; with or without an
    attn_mask: MASKED_DKDV_CONFIGS has no 64 entry), on the grid (B * H_kv, cdiv(S, BLOCK_N)); E = 80
    pads to 128 and keeps the launch order. The dQ kernel takes its programs head by head from
    DQ_HEAD_MAJOR_PER_SM query heads per SM on (session 27; CPU tensors plan for INTERPRETER_SMS)."""
    spies = {name: _PrepareSpy() for name in ("attention_backward_preprocess_kernel", "attention_backward_dkdv_kernel",
                                              "attention_backward_dq_kernel", "attention_backward_dq_convert_kernel")}
    for name, spy in spies.items():
        monkeypatch.setattr(getattr(attention_backward_kernels, name), "prepare", spy)
    batch, heads, heads_kv, length_q, length_k = 3, 4, 2, 50, 300
    q = torch.randn(batch, heads, length_q, dim)
    k = torch.randn(batch, heads_kv, length_k, dim)
    v = torch.randn(batch, heads_kv, length_k, dim_v)
    mask = torch.ones(length_q, length_k, dtype=torch.bool).expand(batch, heads, -1, -1) if masked else None
    out, lse = torch.randn(batch, heads, length_q, dim_v), torch.randn(batch, heads, 2, length_q)
    at.attention_backward(out, q, k, v, out, lse, mask, False, 0.1, interpret=False)
    (grid, kwargs), = spies["attention_backward_dkdv_kernel"].calls
    kv_config = backward_configs(head_block(dim), head_block(dim_v), masked)[0]
    assert kwargs["HEAD_MAJOR"] is head_major and kv_config.head_major is head_major
    assert grid == (batch * heads_kv, -(-length_k // kv_config.block_n))
    many_heads = batch * heads >= DQ_HEAD_MAJOR_PER_SM * INTERPRETER_SMS
    if kv_config.dq_atomic:     # (session 28: dQ added by the dK/dV kernel, then scaled by the conversion kernel)
        assert kwargs["DQ_ATOMIC"] and not masked and max(dim, dim_v) <= 64
        assert spies["attention_backward_dq_convert_kernel"].calls and not spies["attention_backward_dq_kernel"].calls
    else:
        assert spies["attention_backward_dq_kernel"].calls[0][1]["HEAD_MAJOR"] is many_heads


def test_sweep_keeps_the_launch_order_twin_of_the_table_entry():
    """The sweep times the E = 64 table entry (head-major) and the same tile in launch order, so one run
    compares the two; every head-major config in the tables is a dK/dV config (the dQ kernel's order
    follows the head count: backward_configs), and the interpreter's config is not head-major."""
    table = BACKWARD_CONFIGS[64][0]
    assert table.head_major and not table.kv_ring
    _, backward = sweep_configs(64, 64)
    assert backward[0][0] == backward_configs(64, 64)[0] and (table, BACKWARD_CONFIGS[64][1]) in backward
    assert (dataclasses.replace(table, head_major=False), BACKWARD_CONFIGS[64][1]) in backward
    for dim in (64, 128, 256):
        forward, pairs = sweep_configs(dim, dim)
        assert not any(c.head_major for c in forward) and not any(q.head_major for _, q in pairs)
    assert not INTERPRETER_CONFIG.head_major
    assert not any(c.head_major for c in MASKED_DKDV_CONFIGS.values())


# -- bench/attention.py --sweep names ---------------------------------------------------------------------------

def _bench_attention():
    name = "bench_attention"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parents[1] / "bench" / "attention.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def test_sweep_config_names_tell_head_major_apart():
    """`_config_name` ends in "hm" exactly for head-major configs, and every config of a sweep gets its own
    name (the table's 64x128w8s2hm and its launch-order twin 64x128w8s2 would otherwise be one row group in
    format_sweep); each name is the launch-order name plus the suffix."""
    bench = _bench_attention()
    name = bench._config_name
    assert name(BACKWARD_CONFIGS[64][0]) == "64x128w8s2hm"
    assert name(dataclasses.replace(BACKWARD_CONFIGS[64][0], head_major=False)) == "64x128w8s2"
    assert name(AttentionConfig(16, 32, 4, 1, kv_ring=True, head_major=True)) == "16x32w4s1kvringhm"
    for dim in (64, 128, 256):
        forward, backward = sweep_configs(dim, dim)
        kv_configs = list(dict.fromkeys(kv for kv, _ in backward))
        kv_names = [name(c) for c in kv_configs]
        assert len(set(kv_names)) == len(kv_names), kv_names
        for config, config_name in zip(kv_configs, kv_names):
            assert config_name.endswith("hm") == config.head_major
            assert config_name == name(dataclasses.replace(config, head_major=False)) + ("hm" if config.head_major else "")
        pair_names = [f"kv{name(kv)}/q{name(q)}" for kv, q in backward]
        assert len(set(pair_names)) == len(pair_names)


def test_format_sweep_gives_head_major_and_launch_order_their_own_lines():
    bench = _bench_attention()
    _, backward = sweep_configs(64, 64)
    rows = []
    for index, (kv, q) in enumerate(backward):
        config = ("*" if index == 0 else "") + f"kv{bench._config_name(kv)}/q{bench._config_name(q)}"
        rows.append({"S": 4096, "E": 64, "causal": False, "pass": "backward", "config": config, "ms": 1.0 + index,
                     "TFLOP/s": 100.0 / (1 + index), "vs flash": 1.0 / (1 + index)})
    text = bench.format_sweep(rows)
    lines = [line for line in text.splitlines() if line.startswith("backward")]
    assert len(lines) == len(backward) + 1           # one per config and the "best" line
    assert "*kv64x128w8s3dqahm/q64x32w4s2" in lines[0] and "kv64x128w8s2/q64x32w4s2 " in text
    assert "kv64x128w8s2hm/q64x32w4s2 " in text


# -- ptxas ----------------------------------------------------------------------------------------------------

def _compile_dkdv(dim, causal, mask_kind, arch, config):
    """attention_backward_dkdv_kernel compiled as compile_backward does, but with every field of `config`
    (HEAD_MAJOR and EARLY_DP too)."""
    x, stats = torch.empty(16, dtype=torch.float16), torch.empty(16, dtype=torch.float32)
    mask = torch.empty(16, dtype=torch.uint8) if mask_kind == BOOL_MASK else x
    block = head_block(dim)
    strides = (16 * 4096 * dim, 4096 * dim, dim, 1)
    mask_strides = (0, 0, 4096, 1) if mask_kind else (0,) * 4
    return dsl.jit(attention_backward_dkdv_kernel.fn).compile(
        x, x, x, x, x, x, stats, stats, mask, *strides * 6, *mask_strides, 16, 1, 4096, 4096, dim, dim, 0.18, 0.0,
        0.125, 0.0, target=arch, num_warps=config.num_warps, num_stages=config.num_stages, BLOCK_M=config.block_m,
        BLOCK_N=config.block_n, BLOCK_E=block, BLOCK_EV=block, CAUSAL=causal, MASK_KIND=mask_kind, ACC=dsl.float32,
        KV_RING=config.kv_ring, EARLY_DP=config.early_dp, HEAD_MAJOR=config.head_major)


_LOOP_OPS = ("wgmma.mma_async", "mma.sync", "bar.sync", "cp.async", "ld.global", "st.shared", "ld.shared", "ldmatrix",
             "ex2.approx")


@needs_ptxas
@pytest.mark.parametrize("arch", ["sm_90a", "sm_80"])
@pytest.mark.parametrize("dim,causal,mask_kind,config", [
    (64, False, NO_MASK, None), (64, True, NO_MASK, None), (64, False, BOOL_MASK, None),
    (64, True, ADDITIVE_MASK, None), (32, True, NO_MASK, None),
    (64, True, NO_MASK, DKDV_ALTERNATIVES[64][1]), (128, True, NO_MASK, DKDV_ALTERNATIVES[128][0])],
    ids=["64", "64-causal", "64-bool", "64-additive-causal", "32-causal", "64x64w4hm-causal", "32x128w8hm-E128-causal"])
def test_head_major_configs_assemble_like_launch_order(dim, causal, mask_kind, config, arch, tmp_path, monkeypatch):
    """ptxas: each head-major config (the E = 64 table entry, also for E = 32 and with attn_masks; the head-major
    sweep alternatives at E = 64 and 128) spills no more than the same tile in launch order (0 on sm_90a; causal
    without attn_mask, two loops: within 16 bytes of it, at most 64 on sm_90a), its loop bodies hold the same
    instructions (the mapping is outside the loops), and its PTX reads nctaid.x / nctaid.y and divides in 64 bits,
    which the launch-order kernel does not."""
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    block = head_block(dim)
    config = config or backward_configs(block, block, mask_kind != NO_MASK)[0]
    assert config.head_major
    compiled = {hm: _compile_dkdv(dim, causal, mask_kind, arch, dataclasses.replace(config, head_major=hm))
                for hm in (True, False)}
    ptx = {hm: c.asm["ptx"] for hm, c in compiled.items()}
    results = {hm: assemble(text, arch) for hm, text in ptx.items()}
    # a causal kernel without attn_mask has two query-block loops (session 33): at 255 registers ptxas spills
    # values live across them, a few bytes more or less by the mapping's registers (session 34, ex2.ftz: the
    # E = 64 atomic tile on sm_80 spills 20 bytes head major as before, 8 instead of 16 in launch order)
    slack = 16 if causal and mask_kind == NO_MASK else 0
    assert results[True].spill_bytes <= results[False].spill_bytes + slack, results[True].log
    if arch == "sm_90a":
        assert results[True].spill_bytes <= (64 if slack else 0), results[True].log
    assert "warning" not in results[True].log.lower(), results[True].log
    assert compiled[True].shared_bytes == compiled[False].shared_bytes
    assert "%nctaid.x" in ptx[True] and "%nctaid.y" in ptx[True] and re.search(r"\bdiv\.[us]64\b", ptx[True])
    assert "%nctaid" not in ptx[False]
    bodies = {hm: _loop_bodies(text) for hm, text in ptx.items()}
    assert len(bodies[True]) == len(bodies[False]) >= 1
    for ours, theirs in zip(bodies[True], bodies[False]):
        count = lambda body: collections.Counter(op for op in _LOOP_OPS for _ in re.finditer(re.escape(op), body))
        assert count(ours) == count(theirs)


@needs_ptxas
def test_compile_backward_compiles_the_shipped_head_major_kernel(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    assert backward_configs(64, 64)[0].head_major
    assert "%nctaid" in compile_backward("dkdv", 64, True).asm["ptx"]


# -- GPU tier: head-major against launch order, bit for bit ------------------------------------------------------

_GPU_CASES = [  # (B, H, H_kv, L, S, E), dtype, causal, mask kind, mask per (batch, head)
    ((3, 8, 2, 1000, 777, 64), torch.float16, True, "bool", True),
    ((2, 4, 4, 333, 1000, 64), torch.bfloat16, False, "float", False),
    ((1, 1, 1, 64, 100, 32), torch.float16, True, None, False),          # one head, one key block
    ((3, 5, 5, 1, 129, 64), torch.float16, False, None, False),
    ((2, 8, 1, 512, 8192, 64), torch.float16, True, None, False),        # 64 key blocks of 2 heads
    ((35000, 2, 2, 64, 200, 64), torch.float16, False, None, False),     # B * H_kv = 70000 > 65535
    ((2, 6, 3, 700, 700, 48), torch.bfloat16, True, "float", True),
]


@pytest.mark.cuda
@pytest.mark.parametrize("shape,dtype,causal,kind,per_head", _GPU_CASES, ids=str)
def test_gpu_head_major_dkdv_equals_launch_order_bit_for_bit(shape, dtype, causal, kind, per_head, seed, poisoned):
    """The table's E <= 64 dK/dV config on the GPU, head-major and in launch order, outputs poisoned: dQ, dK,
    dV equal bit for bit and finite, with GQA, ragged lengths, bool / additive masks with dead rows,
    one head and one key block, and B * H_kv past 65535."""
    batch, heads, heads_kv, length_q, length_k, dim = shape
    q, k, v = _qkv((batch, heads, length_q, dim), (batch, heads_kv, length_k, dim), (batch, heads_kv, length_k, dim),
                   dtype, seed, "cuda")
    grad_out = random_tensor((batch, heads, length_q, dim), dtype, "cuda", seed + 5)
    mask = _mask(kind, batch, heads, length_q, length_k, seed, dtype, per_head, "cuda")
    scale = dim ** -0.5
    out, lse = at.attention_forward(q, k, v, mask, causal, scale)
    block = head_block(dim)
    kv_config, q_config = backward_configs(block, block, mask is not None)
    assert kv_config.head_major
    results = []
    for config in (kv_config, dataclasses.replace(kv_config, head_major=False)):
        results.append(at.attention_backward(grad_out, q, k, v, out, lse, mask, causal, scale,
                                             configs=(config, q_config)))
        torch.cuda.synchronize()
    for ours, theirs in zip(*results):
        assert torch.isfinite(ours).all()
        assert torch.equal(ours, theirs)


@pytest.mark.cuda
@pytest.mark.parametrize("kind", [None, "bool"])
def test_gpu_autograd_default_path_equals_forced_launch_order(kind, seed, poisoned):
    """fusedops.scaled_dot_product_attention's backward on the GPU (the table: head-major at E = 64) against
    attention_backward forced to the launch-order twin: the same bits."""
    q, k, v = _qkv((2, 8, 1000, 64), (2, 2, 1000, 64), (2, 2, 1000, 64), torch.float16, seed, "cuda",
                   requires_grad=True)
    grad_out = random_tensor((2, 8, 1000, 64), torch.float16, "cuda", seed + 5)
    mask = _mask(kind, 2, 8, 1000, 1000, seed, torch.float16, False, "cuda")
    out = fusedops.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=True, enable_gqa=True)
    grads = torch.autograd.grad(out, (q, k, v), grad_out)
    kv_config, q_config = backward_configs(64, 64, mask is not None)
    assert kv_config.head_major
    detached = [t.detach() for t in (q, k, v)]
    o, lse = at.attention_forward(*detached, mask, True, 0.125)
    forced = at.attention_backward(grad_out, *detached, o, lse, mask, True, 0.125,
                                   configs=(dataclasses.replace(kv_config, head_major=False), q_config))
    for ours, theirs in zip(grads, forced):
        assert torch.equal(ours, theirs)
