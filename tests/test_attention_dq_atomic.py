"""The attention backward that adds dQ inside the dK/dV kernel (ATOMIC_DKDV_CONFIGS, session 28), and the
compiler rules it rests on: a wgmma dot whose A is computed in its own block (staged into shared memory
each step), an atomic reduction run in its value's layout, vector reductions (`red.global.add.v2/.v4.f32`)
where the old values are unused, and a dot with a staged operand left in flight across ops that write no
shared memory.

CPU: the config table and deterministic switch, the PTX of the kernel (all dots on wgmma, 8 vector
reductions per step, no spills), interpreter results of the atomic path against the two-kernel path and
float64 torch at odd shapes, and the DSL rules on small kernels. GPU (`-m cuda`): the atomic path within
twice torch's error of float64 with non-contiguous inputs (test_attention.py's _GPU_CASES take it at
ragged shapes, GQA, L != S, small and odd head dims); torch.use_deterministic_algorithms(True) giving
bitwise-repeatable dQ through the dQ kernel; the vector reductions' sums with colliding programs and masks.
"""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch

import fusedops
import fusedops.dsl as dsl
from fusedops.dsl.target import assemble, ptxas_available
from fusedops.kernels import attention as at
from fusedops.kernels.attention_backward_kernels import attention_backward_dkdv_kernel, attention_backward_dq_kernel
from fusedops.kernels.attention_configs import (
    ATOMIC_DKDV_CONFIGS, ATOMIC_DKDV_SHARED_BYTES, BACKWARD_CONFIGS, INTERPRETER_CONFIG, backward_configs, head_block,
    sweep_configs)
from fusedops.kernels.attention_logits import NO_MASK
from helpers import random_tensor
from test_attention import _assert_within_twice_torch, _loop_bodies, _qkv, compile_backward, reference

needs_ptxas = pytest.mark.skipif(not ptxas_available(), reason="ptxas is not on the PATH")
_ATOMIC = ATOMIC_DKDV_CONFIGS[64]


# -- the config table ----------------------------------------------------------------------------------

@pytest.mark.parametrize("dim,dim_v", [(16, 16), (32, 64), (64, 64), (64, 16)])
def test_head_dims_up_to_64_add_dq_in_the_dkdv_kernel_unless_deterministic_or_masked(dim, dim_v):
    block_e, block_ev = head_block(dim), head_block(dim_v)
    assert backward_configs(block_e, block_ev)[0].dq_atomic
    assert backward_configs(block_e, block_ev, query_heads=1 << 20, sms=132)[0].dq_atomic
    assert not backward_configs(block_e, block_ev, deterministic=True)[0].dq_atomic
    assert not backward_configs(block_e, block_ev, masked=True)[0].dq_atomic
    assert backward_configs(block_e, block_ev, deterministic=True) == BACKWARD_CONFIGS[64]
    # a GPU granting a CTA 99 KiB (compute capability 8.6 / 8.9) keeps the deterministic kernels (80 KiB)
    assert backward_configs(block_e, block_ev, shared_memory=99 * 1024) == BACKWARD_CONFIGS[64]
    assert backward_configs(block_e, block_ev, shared_memory=227 * 1024)[0].dq_atomic


@pytest.mark.parametrize("dim", [80, 128, 256])
def test_wider_head_dims_keep_the_dq_kernel(dim):
    block = head_block(dim)
    assert not backward_configs(block, block)[0].dq_atomic
    assert backward_configs(block, block)[0] == backward_configs(block, block, deterministic=True)[0]


def test_the_sweep_times_the_atomic_kernel_first_and_the_deterministic_one_beside_it():
    _, backward = sweep_configs(64, 64)
    assert backward[0] == backward_configs(64, 64)
    assert any(kv == BACKWARD_CONFIGS[64][0] for kv, _ in backward[1:])


def _count_dq_kernel_preparations(monkeypatch) -> list:
    """A list that gets an entry at every `prepare` of the dQ kernel (which then runs as usual)."""
    calls = []
    prepare = attention_backward_dq_kernel.prepare
    monkeypatch.setattr(attention_backward_dq_kernel, "prepare",
                        lambda *args, **kwargs: calls.append(1) or prepare(*args, **kwargs))
    return calls


# -- the kernel's PTX -----------------------------------------------------------------------------------

# Bytes the dK/dV kernel with dQ (255 registers) may spill, by causal: values live across its query-block
# loops, stored before them and reloaded after (the SASS of E = 64: 24 bytes not causal, no local memory access
# inside the loop; causal 144 bytes, 3 accesses inside the loop over the blocks that cross the diagonal and
# none in the other; the comments above attention_configs.ATOMIC_DKDV_CONFIGS and in the dK/dV kernel).
ATOMIC_SPILL_BYTES = {False: 32, True: 160}

@needs_ptxas
@pytest.mark.parametrize("causal", [False, True])
def test_dkdv_kernel_adds_dq_with_vector_reductions_all_dots_on_wgmma(causal, tmp_path, monkeypatch):
    """Per query block: the four dK/dV dots plus dQ's (64 x 64, K = 128: 8 wgmmas, A = dS staged into
    shared memory: 2 barriers besides the ring's), 8 `red.global.add.v2.f32` per thread straight from the
    accumulator (no conversion, no scalar atomics), issued after a wait that leaves dK's dot in flight."""
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    compiled = compile_backward("dkdv", 64, causal, config=_ATOMIC)
    ptx = compiled.asm["ptx"]
    bodies = _loop_bodies(ptx)      # causal: the query blocks that cross the diagonal, then the rest
    assert len(bodies) == (2 if causal else 1)
    for body in bodies:
        assert "mma.sync" not in body
        assert len(re.findall(r"wgmma\.mma_async", body)) == 16 + 8
        assert len(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n32k16", body)) == 8    # 2 warpgroups split N
        reductions = re.findall(r"red\.relaxed\.gpu\.global\.add\.v2\.f32", body)
        assert len(reductions) == 8 and not re.search(r"\batom\.", body)
        assert len(re.findall(r"\bbar\.sync", body)) == 3
        before_reductions = body.split("red.relaxed")[0]
        assert re.findall(r"wgmma\.wait_group\.sync\.aligned\s+(\d)", before_reductions)[-1] == "1"
    result = assemble(ptx, "sm_90a")
    assert result.spill_bytes <= ATOMIC_SPILL_BYTES[causal], result.log
    assert compiled.shared_bytes <= ATOMIC_DKDV_SHARED_BYTES


@needs_ptxas
@pytest.mark.parametrize("dim,dim_v", [(16, 16), (32, 64), (48, 48), (64, 16)])
def test_dkdv_kernel_with_dq_for_other_head_dims_assembles(dim, dim_v, tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    x, stats = torch.empty(16, dtype=torch.float16), torch.empty(16, dtype=torch.float32)
    strides = (16 * 4096 * dim, 4096 * dim, dim, 1)
    compiled = dsl.jit(attention_backward_dkdv_kernel.fn).compile(
        x, x, x, x, x, x, stats, stats, x, *strides * 6, 0, 0, 0, 0, 16, 1, 4096, 4096, dim, dim_v,
        0.18, 0.0, 0.125, 0.0, dq_ptr=stats, target="sm_90a", num_warps=_ATOMIC.num_warps,
        num_stages=_ATOMIC.num_stages,
        BLOCK_M=_ATOMIC.block_m, BLOCK_N=_ATOMIC.block_n, BLOCK_E=head_block(dim), BLOCK_EV=head_block(dim_v),
        CAUSAL=True, MASK_KIND=NO_MASK, ACC=dsl.float32, HEAD_MAJOR=True, DQ_ATOMIC=True)
    ptx = compiled.asm["ptx"]
    bodies = _loop_bodies(ptx)
    assert len(bodies) == 2
    for body in bodies:
        assert "mma.sync" not in body and re.search(r"red\.relaxed\.gpu\.global\.add\.v[24]\.f32", body)
    result = assemble(ptx, "sm_90a")
    assert result.spill_bytes <= ATOMIC_SPILL_BYTES[True], result.log
    assert compiled.shared_bytes <= ATOMIC_DKDV_SHARED_BYTES


# -- interpreter results --------------------------------------------------------------------------------

_CASES = [  # (B, H, H_kv, L, S, E, E_v, causal)
    (1, 2, 1, 17, 33, 24, 24, False), (2, 2, 2, 33, 17, 16, 16, True), (1, 1, 1, 1, 5, 8, 8, True),
    (1, 3, 3, 20, 20, 40, 40, False), (1, 4, 2, 100, 17, 16, 8, True), (1, 1, 1, 17, 1, 8, 16, False),
]


@pytest.mark.parametrize("case", _CASES, ids=str)
def test_atomic_dq_in_the_interpreter_matches_the_dq_kernel_and_float64_torch(case):
    batch, heads, heads_kv, length_q, length_k, dim, dim_v, causal = case
    generator = torch.Generator().manual_seed(28)
    q = torch.randn(batch, heads, length_q, dim, dtype=torch.float64, generator=generator)
    k = torch.randn(batch, heads_kv, length_k, dim, dtype=torch.float64, generator=generator)
    v = torch.randn(batch, heads_kv, length_k, dim_v, dtype=torch.float64, generator=generator)
    do = torch.randn(batch, heads, length_q, dim_v, dtype=torch.float64, generator=generator)
    scale = 0.3
    o, lse = at.attention_forward(q, k, v, None, causal, scale, interpret=True)
    plain = INTERPRETER_CONFIG
    atomic = dataclasses.replace(plain, dq_atomic=True)
    two_kernels = at.attention_backward(do, q, k, v, o, lse, None, causal, scale, interpret=True,
                                        configs=(plain, plain))
    one_kernel = at.attention_backward(do, q, k, v, o, lse, None, causal, scale, interpret=True,
                                       configs=(atomic, plain))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    expected = torch.autograd.grad(reference(*leaves, causal=causal, scale=scale, enable_gqa=heads != heads_kv),
                                   leaves, do)
    for ours, theirs, want in zip(one_kernel, two_kernels, expected):
        torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(ours, want, rtol=1e-9, atol=1e-9)


def test_an_attn_mask_keeps_the_dq_kernel_even_with_an_atomic_config(monkeypatch):
    """A forced dq_atomic config with an attn_mask runs the dQ kernel (the masked tiles stay on mma.sync)."""
    generator = torch.Generator().manual_seed(5)
    q, k, v, do = (torch.randn(1, 2, 9, 8, dtype=torch.float64, generator=generator) for _ in range(4))
    mask = torch.rand(1, 1, 9, 9, generator=generator) > 0.3
    o, lse = at.attention_forward(q, k, v, mask, False, 0.4, interpret=True)
    calls = _count_dq_kernel_preparations(monkeypatch)
    atomic = dataclasses.replace(INTERPRETER_CONFIG, dq_atomic=True)
    grads = at.attention_backward(do, q, k, v, o, lse, mask, False, 0.4, interpret=True,
                                  configs=(atomic, INTERPRETER_CONFIG))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    expected = torch.autograd.grad(reference(*leaves, mask, scale=0.4), leaves, do)
    assert calls
    for ours, want in zip(grads, expected):
        torch.testing.assert_close(ours, want, rtol=1e-9, atol=1e-9)


# -- the DSL rules on small kernels ---------------------------------------------------------------------

@dsl.jit
def _add_block(out_ptr, x_ptr, n, BLOCK: dsl.constexpr, MASKED: dsl.constexpr, SEM: dsl.constexpr,
               USE_OLD: dsl.constexpr):
    offsets = (dsl.program_id(0) % 3) * BLOCK + dsl.arange(0, BLOCK)
    x = dsl.load(x_ptr + dsl.program_id(0) * BLOCK + dsl.arange(0, BLOCK))
    if MASKED:
        old = dsl.atomic_add(out_ptr + offsets, x, mask=offsets < n, sem=SEM)
    else:
        old = dsl.atomic_add(out_ptr + offsets, x, sem=SEM)
    if USE_OLD:
        dsl.store(x_ptr + dsl.program_id(0) * BLOCK + dsl.arange(0, BLOCK), old)


def _compile_add_block(masked, sem, use_old, dtype=torch.float32, target="sm_90a"):
    x = torch.empty(16, dtype=dtype)
    return dsl.jit(_add_block.fn).compile(x, x, 1000, BLOCK=1024, MASKED=masked, SEM=sem, USE_OLD=use_old,
                                          target=target, num_warps=4).asm["ptx"]


@pytest.mark.parametrize("masked", [False, True])
def test_a_relaxed_float32_block_add_whose_old_values_are_unused_takes_vector_reductions(masked, tmp_path,
                                                                                        monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    ptx = _compile_add_block(masked, "relaxed", False)
    assert len(re.findall(r"red\.relaxed\.gpu\.global\.add\.v4\.f32", ptx)) == 1024 // 128 // 4   # per thread
    assert not re.search(r"\batom\.", ptx)
    assert assemble(ptx, "sm_90a").spill_bytes == 0


@pytest.mark.parametrize("sem,use_old,dtype,target", [("acq_rel", False, torch.float32, "sm_90a"),
                                                      ("relaxed", True, torch.float32, "sm_90a"),
                                                      ("relaxed", False, torch.float64, "sm_90a"),
                                                      ("relaxed", False, torch.float32, "sm_80")])
def test_other_block_atomics_keep_one_atomic_per_element(sem, use_old, dtype, target, tmp_path, monkeypatch):
    """Ordering semantics, used old values, other dtypes and targets before sm_90: `atom` per element."""
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    ptx = _compile_add_block(False, sem, use_old, dtype, target)
    assert not re.search(r"\bred\.[a-z.]*v[24]", ptx)
    assert len(re.findall(r"\b(atom|red)\.", ptx)) == 1024 // 128


def test_vector_reductions_add_every_element_in_the_interpreter(monkeypatch):
    monkeypatch.setenv("FUSEDOPS_INTERPRET", "1")
    x = torch.randn(7, 1024, dtype=torch.float32)
    out = torch.zeros(3 * 1024)
    _add_block[(7,)](out, x, 2500, BLOCK=1024, MASKED=True, SEM="relaxed", USE_OLD=False)
    expected = torch.zeros(3 * 1024, dtype=torch.float64)
    for p in range(7):
        expected[(p % 3) * 1024:(p % 3 + 1) * 1024] += x[p].double()
    expected[2500:] = 0
    torch.testing.assert_close(out.double(), expected, rtol=1e-6, atol=1e-5)


# -- GPU ------------------------------------------------------------------------------------------------

@pytest.mark.cuda
def test_gpu_atomic_dq_with_non_contiguous_inputs_and_grad_out(seed):
    dtype = torch.float16
    q = random_tensor((2, 700, 8, 64), dtype, "cuda", seed).transpose(1, 2).requires_grad_()
    k = random_tensor((1, 8, 900, 64), dtype, "cuda", seed + 1).expand(2, 8, 900, 64).detach().requires_grad_()
    v = random_tensor((2, 8, 64, 900), dtype, "cuda", seed + 2).transpose(-1, -2).detach().requires_grad_()
    grad_out = random_tensor((1, 8, 1, 64), dtype, "cuda", seed + 3).expand(2, 8, 700, 64)
    grads = torch.autograd.grad(fusedops.scaled_dot_product_attention(q, k, v), (q, k, v), grad_out)
    torch_grads = torch.autograd.grad(torch.nn.functional.scaled_dot_product_attention(q, k, v), (q, k, v),
                                      grad_out)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    expected = torch.autograd.grad(reference(q64, k64, v64), (q64, k64, v64), grad_out.double())
    for name, ours, theirs, want in zip("qkv", grads, torch_grads, expected):
        _assert_within_twice_torch(ours, theirs, want, f"d{name}")


@pytest.mark.cuda
def test_gpu_deterministic_mode_runs_the_dq_kernel_bitwise_repeatably(monkeypatch, seed):
    q, k, v = _qkv((4, 16, 1024, 64), (4, 16, 1024, 64), (4, 16, 1024, 64), torch.float16, seed, "cuda",
                   requires_grad=True)
    grad_out = random_tensor((4, 16, 1024, 64), torch.float16, "cuda", seed + 3)
    calls = _count_dq_kernel_preparations(monkeypatch)

    def gradients():
        return torch.autograd.grad(fusedops.scaled_dot_product_attention(q, k, v), (q, k, v), grad_out)
    fast = gradients()
    assert not calls                                        # the atomic path, no dQ kernel
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        first, second = gradients(), gradients()
    finally:
        torch.use_deterministic_algorithms(previous)
    assert calls
    for a, b, c in zip(first, second, fast):
        assert torch.equal(a, b)
        torch.testing.assert_close(a, c, rtol=2e-3, atol=2e-3)


@pytest.mark.cuda
@pytest.mark.parametrize("masked", [False, True])
def test_gpu_vector_reductions_add_every_program_exactly(masked):
    """Integer-valued floats: every order of the colliding programs' adds gives the exact sum."""
    x = torch.randint(-8, 9, (7, 1024), device="cuda").float()
    out = torch.full((3 * 1024,), 0.0, device="cuda")
    _add_block[(7,)](out, x, 2500 if masked else 3 * 1024, BLOCK=1024, MASKED=masked, SEM="relaxed", USE_OLD=False)
    expected = torch.zeros(3 * 1024, device="cuda")
    for p in range(7):
        expected[(p % 3) * 1024:(p % 3 + 1) * 1024] += x[p]
    if masked:
        expected[2500:] = 0
    assert torch.equal(out, expected)
