"""CPU tier of fusedops.matmul: the library kernel in the interpreter against float64 (odd shapes,
strides, batches, bias, activations, K = 0), its PTX (mma.sync, ldmatrix, cp.async; ptxas with 0
spill bytes), the pipelining pass's IR, autograd through the interpreter (gradcheck in float64),
fusedops.nn.Linear, and the autotuner's choice and on-disk record."""

from __future__ import annotations

import json

import pytest
import torch

import fusedops
import fusedops.nn
import fusedops.dsl as dsl
from fusedops.autograd.matmul import MatmulFunction
from fusedops.autograd.matmul_reference import reference
from fusedops.dsl.errors import CompilationError, LaunchError
from fusedops.dsl.ir import OpCode
from fusedops.dsl.target import assemble, ptxas_available
from fusedops.kernels import matmul as mm
from fusedops.kernels.matmul_configs import _config, CONFIGS, INTERPRETER_CONFIG
from fusedops.kernels.matmul_kernels import matmul_kernel
from codegen_helpers import compile_library_matmul
from helpers import assert_close, poison, random_tensor

needs_ptxas = pytest.mark.skipif(not ptxas_available(), reason="ptxas is not on the PATH")


@pytest.fixture
def interpret(monkeypatch):
    monkeypatch.setenv("FUSEDOPS_INTERPRET", "1")


def _reference64(a, b, bias=None, activation=None):
    return reference(a.double(), b.double(), None if bias is None else bias.double(), activation)


# -- the kernel in the interpreter ------------------------------------------------------------------------

@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (5, 3, 7), (17, 19, 33), (31, 2, 47), (3, 4, 0), (33, 17, 16)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_interpreted_matmul_matches_float64(m, n, k, dtype, seed, interpret):
    a = random_tensor((m, k), dtype, seed=seed)
    b = random_tensor((k, n), dtype, seed=seed + 1)
    c = fusedops.matmul(a, b)
    assert c.dtype == dtype and c.shape == (m, n)
    assert_close(c, _reference64(a, b), dtype)


@pytest.mark.parametrize("activation", mm.ACTIVATIONS)
def test_bias_and_activations(activation, seed, interpret):
    a = random_tensor((19, 23), torch.float16, seed=seed)
    b = random_tensor((23, 13), torch.float16, seed=seed + 1)
    bias = random_tensor((13,), torch.float32, seed=seed + 2)
    c = fusedops.matmul(a, b, bias, activation, out_dtype=torch.float32)
    assert c.dtype == torch.float32
    assert_close(c, _reference64(a, b, bias, activation), torch.float16)


def test_k_zero_gives_activation_of_bias(interpret):
    a, b = torch.empty(4, 0, dtype=torch.float16), torch.empty(0, 6, dtype=torch.float16)
    bias = torch.linspace(-1, 1, 6, dtype=torch.float16)
    assert torch.equal(fusedops.matmul(a, b), torch.zeros(4, 6, dtype=torch.float16))
    assert_close(fusedops.matmul(a, b, bias, "relu"), torch.relu(bias.double()).expand(4, 6), torch.float16)
    assert fusedops.matmul(torch.empty(0, 5, dtype=torch.float16), torch.ones(5, 3, dtype=torch.float16)).shape == (0, 3)


def test_transposed_strided_and_batched_operands(seed, interpret):
    base_a = random_tensor((2, 40, 30), torch.float16, seed=seed)
    base_b = random_tensor((2, 26, 40), torch.float16, seed=seed + 1)
    a = base_a.transpose(1, 2)[:, ::2, 3:]                # (2, 15, 37) non-contiguous both ways
    b = base_b.transpose(1, 2)[:, 3:, ::2]                # (2, 37, 13)
    assert_close(fusedops.matmul(a, b), _reference64(a, b), torch.float16)
    shared_b = random_tensor((37, 9), torch.float16, seed=seed + 2).t().contiguous().t()   # column-major
    assert_close(fusedops.matmul(a, shared_b), _reference64(a, shared_b), torch.float16)   # b broadcast
    one = random_tensor((1, 15, 37), torch.float16, seed=seed + 3)
    assert_close(fusedops.matmul(one, b), _reference64(one, b), torch.float16)             # batch of 1
    vector = random_tensor((37,), torch.float16, seed=seed + 4)
    assert_close(fusedops.matmul(a, vector), _reference64(a, vector), torch.float16)
    assert_close(fusedops.matmul(vector, b), _reference64(vector, b), torch.float16)


def test_matmul_into_writes_only_its_tile(seed, interpret):
    a = random_tensor((1, 9, 11), torch.float16, seed=seed)
    b = random_tensor((1, 11, 7), torch.float16, seed=seed + 1)
    big = poison(torch.empty(1, 12, 10, dtype=torch.float16))
    mm.matmul_into(big[:, 1:10, 2:9], a, b)
    assert_close(big[:, 1:10, 2:9], _reference64(a, b), torch.float16)
    outside = torch.ones_like(big, dtype=torch.bool)
    outside[:, 1:10, 2:9] = False
    assert torch.isnan(big[outside]).all()


def test_argument_errors():
    a = torch.ones(3, 4, dtype=torch.float16)
    with pytest.raises(ValueError, match="cannot be multiplied"):
        fusedops.matmul(a, torch.ones(5, 2, dtype=torch.float16))
    with pytest.raises(TypeError, match="same dtype"):
        fusedops.matmul(a, torch.ones(4, 2, dtype=torch.float32))
    with pytest.raises(ValueError, match="activation"):
        fusedops.matmul(a, torch.ones(4, 2, dtype=torch.float16), activation="tanh")
    with pytest.raises(ValueError, match="bias"):
        fusedops.matmul(a, torch.ones(4, 2, dtype=torch.float16), torch.ones(3))


def test_cpu_without_interpreter_runs_torch(seed, monkeypatch):
    monkeypatch.delenv("FUSEDOPS_INTERPRET", raising=False)
    a = random_tensor((6, 5), torch.float32, seed=seed)
    b = random_tensor((5, 4), torch.float32, seed=seed + 1)
    bias = random_tensor((4,), torch.float32, seed=seed + 2)
    torch.testing.assert_close(fusedops.matmul(a, b, bias, "silu"), torch.nn.functional.silu(a @ b + bias))


# -- autograd and nn.Linear -------------------------------------------------------------------------------

@pytest.mark.parametrize("activation", mm.ACTIVATIONS)
def test_gradcheck_in_float64(activation, seed, interpret):
    a = random_tensor((2, 5, 7), torch.float64, seed=seed).requires_grad_()
    b = random_tensor((7, 3), torch.float64, seed=seed + 1).requires_grad_()
    bias = random_tensor((3,), torch.float64, seed=seed + 2).requires_grad_()
    if activation == "relu":        # keep the pre-activation away from the kink
        with torch.no_grad():
            bias += 3.0 * torch.sign(bias)
    assert torch.autograd.gradcheck(lambda x, y, z: MatmulFunction.apply(x, y, z, activation, None), (a, b, bias))


def test_gradients_match_torch_for_broadcast_batches(seed, interpret):
    a = random_tensor((3, 6, 5), torch.float64, seed=seed).requires_grad_()
    b = random_tensor((1, 5, 4), torch.float64, seed=seed + 1).requires_grad_()
    fusedops.matmul(a, b, activation="gelu").sum().backward()
    a2, b2 = a.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
    torch.nn.functional.gelu(a2 @ b2).sum().backward()
    torch.testing.assert_close(a.grad, a2.grad)
    torch.testing.assert_close(b.grad, b2.grad)


@pytest.mark.parametrize("bias", [True, False])
def test_linear_is_a_drop_in(bias, seed, interpret):
    torch.manual_seed(seed)
    ours = fusedops.nn.Linear(11, 7, bias=bias, activation="silu", dtype=torch.float64)
    theirs = torch.nn.Linear(11, 7, bias=bias, dtype=torch.float64)
    theirs.load_state_dict(ours.state_dict())
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    assert isinstance(ours, torch.nn.Linear) and "activation='silu'" in repr(ours)
    x = random_tensor((2, 3, 11), torch.float64, seed=seed).requires_grad_()
    y = ours(x)
    x2 = x.detach().clone().requires_grad_()
    expected = torch.nn.functional.silu(theirs(x2))
    torch.testing.assert_close(y, expected)
    y.square().sum().backward()
    expected.square().sum().backward()
    torch.testing.assert_close(x.grad, x2.grad)
    torch.testing.assert_close(ours.weight.grad, theirs.weight.grad)


# -- PTX ------------------------------------------------------------------------------------------------

# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps). 128x256 with 4 warps cannot avoid spills: each thread would
# hold a 64x128 warp tile's accumulator, 256 fp32 registers, over the 255-register limit.
_TILES = [(64, 64, 32, 4), (64, 64, 32, 8), (128, 128, 32, 4), (128, 128, 32, 8), (128, 256, 64, 8)]


@needs_ptxas
@pytest.mark.parametrize("tile", _TILES, ids=lambda t: "x".join(map(str, t)))
def test_library_kernel_ptx_uses_tensor_cores_and_does_not_spill(tile, tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    block_m, block_n, block_k, num_warps = tile
    config = _config(block_m, block_n, block_k, num_warps, 3)
    compiled = compile_library_matmul(config, arch="sm_90")   # sm_90a: test_wgmma.py
    ptx = compiled.asm["ptx"]
    assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in ptx
    assert "ldmatrix.sync.aligned.m8n8.x4" in ptx
    assert "cp.async.cg.shared.global" in ptx and "cp.async.wait_group" in ptx
    result = assemble(ptx, "sm_90")
    assert result.spill_bytes == 0, result.log
    assert compiled.shared_bytes == 3 * (block_m * block_k + block_k * block_n) * 2


@needs_ptxas
@pytest.mark.parametrize("config", [c for c in CONFIGS if (c.constexprs["BLOCK_M"], c.constexprs["BLOCK_N"],
                                                              c.constexprs["BLOCK_K"], c.num_warps) not in _TILES],
                         ids=str)
def test_shipped_configs_assemble_without_spills(config, tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    compiled = compile_library_matmul(config, transposed_b=True)          # the nn.Linear case: B = weight^T
    result = assemble(compiled.asm["ptx"], "sm_90a")
    assert result.spill_bytes == 0, result.log
    assert compiled.shared_bytes <= 227 * 1024


@needs_ptxas
def test_bf16_on_sm80_and_unaligned_shapes(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    ptx = compile_library_matmul(CONFIGS[3], torch.bfloat16, "sm_80").asm["ptx"]
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in ptx and "cp.async" in ptx
    assert assemble(ptx, "sm_80").spill_bytes == 0
    # K = 4099: rows are not 16-byte aligned, so no cp.async; the dot still runs on tensor cores
    odd = compile_library_matmul(CONFIGS[3], arch="sm_90", m=4095, n=4093, k=4099).asm["ptx"]
    assert "mma.sync" in odd and "ldmatrix" in odd and "cp.async" not in odd
    assert assemble(odd, "sm_90").spill_bytes == 0


def test_pipelining_pass_builds_the_ring(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    from fusedops.dsl.passes.manager import run_pipeline
    from fusedops.dsl.passes.pipeline import default_pipeline
    x = torch.empty(16, dtype=torch.float16)
    config = CONFIGS[3]
    function = dsl.jit(matmul_kernel.fn).ir(x, x, x, x, 256, 256, 256, 0, 256, 1, 0, 256, 1, 0, 256, 1, 1,
                                               HAS_BIAS=False, ACTIVATION=None, ACC=dsl.float32, **config.constexprs)
    run_pipeline(function, default_pipeline(4, "sm_80", num_stages=4))
    top = [op.opcode for op in function.body.ops]
    assert top.count(OpCode.LOCAL_ALLOC) == 2 and top.count(OpCode.LOCAL_DEALLOC) == 2
    assert top.count(OpCode.ASYNC_COMMIT) == 3 and top.count(OpCode.ASYNC_COPY) == 6     # 3 prologue stages
    loop = next(op for op in function.body.ops if op.opcode == OpCode.FOR)
    body = [op.opcode for op in loop.regions[0].ops]
    assert body[0] == OpCode.ASYNC_WAIT and loop.regions[0].ops[0].attrs["pending"] == 2
    assert body.count(OpCode.ASYNC_COPY) == 2 and body.count(OpCode.LOCAL_LOAD) == 2
    assert OpCode.LOAD not in body and OpCode.CONVERT_LAYOUT not in body
    assert body.index(OpCode.ASYNC_COMMIT) < body.index(OpCode.LOCAL_LOAD) < body.index(OpCode.DOT)


def _runtime_values(kernel, args, kwargs):
    from fusedops.dsl.runtime.signature import specialize
    values = kernel._bind(args, kwargs)
    return [v for v, spec in zip(values, specialize(kernel.__name__, kernel.params, values)) if spec.is_runtime]


@pytest.mark.parametrize("m,n,k,num_stages", [(40, 32, 96, 3), (40, 32, 16, 3), (40, 32, 0, 3), (33, 16, 48, 2),
                                              (16, 16, 160, 4), (20, 48, 64, 5)])
def test_pipelined_ir_computes_the_same_in_the_interpreter(m, n, k, num_stages, seed):
    """The interpreter's model of cp.async lands a copy only when a wait retires its group, so a
    wrong ring index or wait count reads NaN poison here."""
    from fusedops.dsl.interpreter import Interpreter
    from fusedops.dsl.passes.manager import run_pipeline
    from fusedops.dsl.passes.pipeline import default_pipeline
    a = random_tensor((m, k), torch.float16, seed=seed)
    b = random_tensor((k, n), torch.float16, seed=seed + 1)
    c = poison(torch.empty(m, n, dtype=torch.float16))
    kernel = dsl.jit(matmul_kernel.fn)
    args = (c, a, b, c, m, n, k, 0, a.stride(0), a.stride(1), 0, b.stride(0), b.stride(1), 0, c.stride(0), 1, 0)
    kwargs = dict(HAS_BIAS=False, ACTIVATION=None, ACC=dsl.float32, **INTERPRETER_CONFIG.constexprs)
    function = kernel.ir(*args, **kwargs)
    run_pipeline(function, default_pipeline(4, "sm_80", num_stages=num_stages))
    assert sum(op.opcode == OpCode.LOCAL_ALLOC for op in function.body.ops) >= 1
    grid = (dsl.cdiv(m, 16) * dsl.cdiv(n, 16), 1)
    Interpreter(function).launch(grid, _runtime_values(kernel, args, kwargs))
    assert_close(c, _reference64(a, b), torch.float16)


@dsl.jit
def _not_pipelinable(a_ptr, b_ptr, c_ptr, K, BLOCK: dsl.constexpr):
    r = dsl.arange(0, BLOCK)
    acc = dsl.zeros((BLOCK, BLOCK), dsl.float32)
    offset = 0
    for k0 in range(0, K, BLOCK):
        a = dsl.load(a_ptr + offset + r[:, None] * BLOCK + r[None, :])       # address from a carried value
        b = dsl.load(b_ptr + k0 + r[:, None] * BLOCK + r[None, :], mask=r[None, :] < K, other=1.0)
        acc = dsl.dot(a, b, acc)
        offset ^= BLOCK     # not a fixed step (passes/induction_variables.py would recompute that from k0)
    dsl.store(c_ptr + r[:, None] * BLOCK + r[None, :], acc)


@dsl.jit
def _narrow_rows(a_ptr, b_ptr, c_ptr, K, ROW: dsl.constexpr, BLOCK: dsl.constexpr):
    r = dsl.arange(0, BLOCK)
    acc = dsl.zeros((BLOCK, BLOCK), dsl.float32)
    for k0 in range(0, K, BLOCK):
        a = dsl.load(a_ptr + k0 + r[:, None] * ROW + r[None, :])
        b = dsl.load(b_ptr + k0 * ROW + r[:, None] * ROW + r[None, :])
        acc = dsl.dot(a, b, acc)
    dsl.store(c_ptr + r[:, None] * BLOCK + r[None, :], acc)


@needs_ptxas
@pytest.mark.parametrize("row,copy_bytes", [(36, 8), (34, 4)])
def test_rows_aligned_to_8_or_4_bytes_use_narrow_cp_async(row, copy_bytes, tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    x = torch.empty(64, dtype=torch.float16)
    compiled = _narrow_rows.compile(x, x, torch.empty(4), 4096, ROW=row, BLOCK=32, target="sm_80")
    ptx = compiled.asm["ptx"]
    assert f"], {copy_bytes}, %r" in ptx and "cp.async.ca.shared.global" in ptx and "cp.async.cg" not in ptx
    assert assemble(ptx, "sm_80").spill_bytes == 0


def test_loads_that_do_not_qualify_stay_synchronous(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    p = dsl.pointer_type(dsl.float16)
    compiled = _not_pipelinable.compile(p, p, dsl.pointer_type(dsl.float32), dsl.int32, BLOCK=32, target="sm_80")
    assert "local_alloc" not in compiled.asm["ir"] and "cp.async" not in compiled.asm["ptx"]
    assert "mma.sync" in compiled.asm["ptx"] and "ldmatrix" in compiled.asm["ptx"]


# -- autotune ---------------------------------------------------------------------------------------------

def test_autotune_picks_the_fastest_skips_failures_and_persists(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    configs = [dsl.Config({"BLOCK_M": 16}, num_warps=w) for w in (1, 2, 4, 8)]
    times = {1: 3.0, 2: LaunchError("too much shared memory"), 4: 1.0, 8: 0.5}
    spills = {8}

    def measure(config):
        value = times[config.num_warps]
        if isinstance(value, Exception):
            raise value
        return value, config.num_warps in spills

    tuner = dsl.autotune(configs, key=["M", "N", "K"])(matmul_kernel)
    assert tuner.select("key-1", measure) == configs[2]       # 8 warps is faster but spills
    skipped = [m for m in tuner.measurements["key-1"] if m.skipped]
    assert len(skipped) == 1 and "shared memory" in skipped[0].skipped
    files = list((tmp_path / "autotune").iterdir())
    assert len(files) == 1 and json.loads(files[0].read_text()) == {"key-1": 2}
    fresh = dsl.autotune(configs, key=["M", "N", "K"])(matmul_kernel)

    def must_not_measure(config):
        raise AssertionError("the recorded choice should be used")
    assert fresh.select("key-1", must_not_measure) == configs[2]
    with pytest.raises(LaunchError, match="no config could run"):
        fresh.select("key-2", lambda c: (_ for _ in ()).throw(CompilationError("bad")))
    with pytest.raises(TypeError, match="not parameters"):
        dsl.autotune(configs, key=["Q"])(matmul_kernel)
