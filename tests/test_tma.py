"""The bulk tensor copy engine (TMA): host-side tensor-map encoding (runtime/tensor_map.py) and the
kernel-side building blocks (codegen/tma.py: a by-value grid-constant tensor-map parameter, mbarrier
init / expect_tx / try_wait.parity, cp.async.bulk.tensor.2d).

CPU tier: the arguments `encode_tensor_map` gives cuTensorMapEncodeTiled (a fake driver records
them), the documented limits it checks, and the PTX of a small TMA kernel built from the blocks
(the 128-byte `.param`, the copy, the waits), which ptxas must accept for sm_90a with no spills.
GPU tier (`-m cuda`, H200): that kernel copies a ragged edge box of a real tensor through TMA; the
shared tile it dumps must be the box laid out by `layouts.shared.nvmma_shared` (the swizzle model
the wgmma operand tiles use) with the out-of-bounds part zero-filled.
"""

from __future__ import annotations

import contextlib
import ctypes
import types

import numpy as np
import pytest
import torch
from llvmlite import ir

import fusedops
import fusedops.dsl as dsl
from fusedops.dsl.codegen import tma
from fusedops.dsl.errors import LaunchError
from fusedops.dsl.layouts.shared import nvmma_shared
from fusedops.dsl.runtime.tensor_map import (TensorMapSpec, encode_arguments, encode_tensor_map,
                                             matrix_spec)
from fusedops.dsl.target import Target, assemble, compile_to_ptx, ptxas_available
from fusedops.dsl.target import llvm_types as T
from fusedops.dsl.passes.manager import run_pipeline
from fusedops.dsl.passes.pipeline import default_pipeline

needs_ptxas = pytest.mark.skipif(not ptxas_available(), reason="ptxas is not on the PATH")


# -- host side: the encoding arguments -----------------------------------------------------------------

class _FakeDriver:
    """Stands in for cuda.bindings.driver: enum members are their names; the call is recorded."""

    def __init__(self, status=0):
        names = lambda *members: types.SimpleNamespace(**{m: m for m in members})     # noqa: E731
        self.CUtensorMapDataType = names("CU_TENSOR_MAP_DATA_TYPE_FLOAT16", "CU_TENSOR_MAP_DATA_TYPE_BFLOAT16",
                                         "CU_TENSOR_MAP_DATA_TYPE_FLOAT32")
        self.CUtensorMapInterleave = names("CU_TENSOR_MAP_INTERLEAVE_NONE")
        self.CUtensorMapSwizzle = names(*(f"CU_TENSOR_MAP_SWIZZLE_{m}" for m in ("NONE", "32B", "64B", "128B")))
        self.CUtensorMapL2promotion = names(*(f"CU_TENSOR_MAP_L2_PROMOTION_{m}"
                                              for m in ("NONE", "L2_64B", "L2_128B", "L2_256B")))
        self.CUtensorMapFloatOOBfill = names("CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE")
        self.status, self.calls = status, []

    def cuTensorMapEncodeTiled(self, *args):
        self.calls.append(args)
        return self.status, "the tensor map"


def test_encode_passes_dims_innermost_first_and_byte_strides():
    # A (300, 1000) fp16 row-major matrix at 0x10000, 128 x 64 boxes, 128-byte swizzle.
    fake = _FakeDriver()
    spec = matrix_spec(dsl.float16, (300, 1000), (1000, 1), (128, 64))
    assert encode_tensor_map(spec, 0x10000, driver=fake) == "the tensor map"
    (call,) = fake.calls
    assert call == ("CU_TENSOR_MAP_DATA_TYPE_FLOAT16", 2, 0x10000, [1000, 300], [2000], [64, 128], [1, 1],
                    "CU_TENSOR_MAP_INTERLEAVE_NONE", "CU_TENSOR_MAP_SWIZZLE_128B",
                    "CU_TENSOR_MAP_L2_PROMOTION_L2_256B", "CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE")
    assert spec.box_bytes == 128 * 64 * 2


@pytest.mark.parametrize("element,swizzle,name,mode", [
    (dsl.bfloat16, 64, "BFLOAT16", "64B"), (dsl.float32, 32, "FLOAT32", "32B"), (dsl.float16, None, "FLOAT16", "NONE"),
])
def test_encode_data_types_and_swizzle_modes(element, swizzle, name, mode):
    size = element.itemsize
    spec = TensorMapSpec(element, (4, 64, 256), (64 * 256, 256, 1), (1, 32, 16 // size * 2), swizzle)
    args = encode_arguments(spec, 256)
    assert (args.data_type, args.swizzle) == (f"CU_TENSOR_MAP_DATA_TYPE_{name}", f"CU_TENSOR_MAP_SWIZZLE_{mode}")
    assert args.global_dims == (256, 64, 4) and args.global_strides == (256 * size, 64 * 256 * size)
    assert args.box_dims == (32 // size, 32, 1) and args.rank == 3


@pytest.mark.parametrize("change,message", [
    (dict(shape=(300, 1000), strides=(1000, 1), box=(128, 64)), None),
    (dict(strides=(1001, 1)), "multiple of 16"),                     # row stride of 2002 bytes
    (dict(strides=(1, 300)), "innermost dim must be contiguous"),    # a column-major view, undeclared
    (dict(box=(128, 128)), "exceeds the 128-byte swizzle"),          # 256-byte inner box extent
    (dict(box=(512, 64)), "between 1 and 256"),
    (dict(box=(128, 4)), "multiple of 16 bytes"),                    # 8-byte inner box extent
    (dict(shape=(0, 1000)), "between 1 and 2\\*\\*32"),
    (dict(element=dsl.int1), "no data type"),
    (dict(swizzle_bytes=16), "swizzle must be one of"),
])
def test_encode_checks_the_driver_limits(change, message):
    fields = dict(element=dsl.float16, shape=(300, 1000), strides=(1000, 1), box=(128, 64), swizzle_bytes=128)
    spec = TensorMapSpec(**{**fields, **change})
    if message is None:
        encode_arguments(spec, 0x100)
        with pytest.raises(LaunchError, match="16-byte aligned"):
            encode_arguments(spec, 0x108)
        return
    with pytest.raises(LaunchError, match=message):
        encode_arguments(spec, 0x100)


def test_encode_reports_the_drivers_refusal():
    fake = _FakeDriver(status=_Status())
    with pytest.raises(LaunchError, match="CUDA_ERROR_INVALID_VALUE"):
        encode_tensor_map(matrix_spec(dsl.float16, (64, 64), (64, 1), (64, 64)), 0x100, driver=fake)


class _Status:
    name = "CUDA_ERROR_INVALID_VALUE"

    def __int__(self):
        return 1


# -- kernel side: a TMA copy kernel built from the blocks --------------------------------------------------

BOX = (64, 64)          # rows, cols of fp16: 128-byte rows, the 128-byte swizzle
THREADS = 128


def _tma_tile_kernel() -> str:
    """LLVM IR of `tma_tile(tensor_map, out, c0, c1)`: one CTA copies the box at (c0 column, c1 row)
    of the tensor map into shared memory with TMA and dumps the shared tile, byte for byte, to `out`
    (BOX[0] * BOX[1] fp16)."""
    module = ir.Module(name="tma_tile")
    function = ir.Function(module, ir.FunctionType(T.void, [tma.tensor_map_parameter_type(), T.pointer(1),
                                                             T.i32, T.i32]), "tma_tile")
    T.mark_kernel(function, max_threads=THREADS)
    tensor_map, out, c0, c1 = function.args
    tensor_map.name, out.name = "tensor_map", "out"
    tma.mark_tensor_map_parameter(tensor_map)
    shared = ir.GlobalVariable(module, ir.ArrayType(T.i8, 0), "shared", addrspace=3)
    shared.linkage, shared.align, shared.type = "external", 1024, T.pointer(3)
    tile_bytes = BOX[0] * BOX[1] * 2
    entry, issue, wait = (function.append_basic_block(n) for n in ("entry", "issue", "wait"))
    b = ir.IRBuilder(entry)
    thread = b.call(T.declare_intrinsic(module, "llvm.nvvm.read.ptx.sreg.tid.x", T.i32, []), [])
    barrier = b.gep(shared, [ir.Constant(T.i32, tile_bytes)], source_etype=T.i8)
    first = b.icmp_unsigned("==", thread, ir.Constant(T.i32, 0))
    sync = T.declare_intrinsic(module, "llvm.nvvm.barrier.cta.sync.aligned.all", T.void, [T.i32],
                               attributes=("convergent", "nounwind"))
    b.cbranch(first, issue, wait)
    b = ir.IRBuilder(issue)
    tma.prefetch_tensor_map(b, tensor_map)
    tma.mbarrier_init(b, barrier, 1)
    tma.fence_mbarrier_init(b)
    tma.mbarrier_arrive_expect_tx(b, barrier, tile_bytes)
    tma.tma_load_2d(b, module, shared, barrier, tensor_map, c0, c1)
    b.branch(wait)
    b = ir.IRBuilder(wait)
    b.call(sync, [ir.Constant(T.i32, 0)])          # the other threads wait on an initialized barrier
    tma.mbarrier_wait(b, barrier, ir.Constant(T.i32, 0))
    words = tile_bytes // 16
    for step in range(words // THREADS):
        index = b.add(thread, ir.Constant(T.i32, step * THREADS))
        source = b.gep(shared, [b.mul(index, ir.Constant(T.i32, 16))], source_etype=T.i8)
        value = b.load(source, typ=ir.VectorType(T.i32, 4), align=16)
        target = b.gep(out, [b.zext(index, T.i64)], source_etype=ir.VectorType(T.i32, 4))
        b.store(value, target, align=16)
    b.ret_void()
    return str(module)


def _tma_ptx() -> str:
    return compile_to_ptx(_tma_tile_kernel(), Target("sm_90a")).ptx


def test_tensor_map_parameter_is_a_128_byte_grid_constant():
    text = _tma_tile_kernel()
    (define,) = [line for line in text.splitlines() if line.startswith("define")]
    (parameter,) = [p for p in define.split(", ") if '%"tensor_map"' in p]
    for needed in ("byval([128 x i8])", '"nvvm.grid_constant"', "align 64"):
        assert needed in parameter, parameter
    ptx = _tma_ptx()
    assert ".param .align 64 .b8 tma_tile_param_0[128]" in ptx


@needs_ptxas
def test_tma_kernel_ptx_is_accepted_by_ptxas():
    ptx = _tma_ptx()
    for needed in ("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes",
                   "mbarrier.init.shared::cta.b64", "fence.mbarrier_init.release.cluster",
                   "mbarrier.arrive.expect_tx.shared::cta.b64", "mbarrier.try_wait.parity.shared::cta.b64",
                   "prefetch.tensormap"):
        assert needed in ptx, needed
    # the dump of the tile is ordered after the wait (the asm clobbers memory)
    assert ptx.index("mbarrier.try_wait.parity") < ptx.index("ld.shared")
    result = assemble(ptx, "sm_90a")
    assert result.spill_bytes == 0, result.log


# -- GPU tier ----------------------------------------------------------------------------------------------

def _expected_tile(matrix: np.ndarray, c0: int, c1: int) -> np.ndarray:
    """The shared tile (flat, by offset) TMA writes for the box at (column c0, row c1): the box by
    `nvmma_shared(BOX, 16, 128)`, zero where the box leaves the matrix."""
    layout = nvmma_shared(BOX, 16, 128)
    out = np.zeros(BOX[0] * BOX[1], dtype=matrix.dtype)
    for offset in range(out.size):
        row, col = layout.apply(offset=offset)
        r, c = c1 + row, c0 + col
        if 0 <= r < matrix.shape[0] and 0 <= c < matrix.shape[1]:
            out[offset] = matrix[r, c]
    return out


@pytest.mark.cuda
@pytest.mark.parametrize("rows,cols,c0,c1", [(100, 72, 64, 64), (64, 64, 0, 0), (300, 200, 128, 17), (80, 64, -8, -3)],
                         ids=str)
def test_gpu_tma_box_lands_swizzled_and_zero_filled(rows, cols, c0, c1, seed):
    from fusedops.dsl.runtime import driver
    matrix = torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed)).to(torch.float16).cuda()
    out = torch.full((BOX[0] * BOX[1],), float("nan"), dtype=torch.float16, device="cuda")
    kernel = driver.load_module(_tma_ptx(), "tma_tile")
    spec = matrix_spec(dsl.float16, matrix.shape, matrix.stride(), BOX)
    tensor_map = encode_tensor_map(spec, matrix.data_ptr())
    cu = driver.cuda_driver()
    stream = torch.cuda.current_stream().cuda_stream
    args = ((tensor_map, out.data_ptr(), c0, c1), (None, ctypes.c_void_p, ctypes.c_int, ctypes.c_int))
    with kernel.context.pushed():
        driver.check(cu.cuLaunchKernel(kernel.function, 1, 1, 1, THREADS, 1, 1, spec.box_bytes + 8, stream, args, 0),
                     "cuLaunchKernel(tma_tile)")
    torch.cuda.synchronize()
    expected = _expected_tile(matrix.cpu().numpy(), c0, c1)
    np.testing.assert_array_equal(out.cpu().numpy(), expected)


# -- the DSL construct: dsl.make_tensor_descriptor / desc.load ----------------------------------------------

from fusedops.dsl.ir import OpCode                                        # noqa: E402
from fusedops.dsl.runtime.launcher_args import ArgumentPacker, ParamKind  # noqa: E402
from fusedops.dsl.runtime.tensor_map import TensorMapLauncher             # noqa: E402
from fusedops.kernels import matmul as mm                                  # noqa: E402
from fusedops.kernels.matmul_configs import _config, TMA_CONFIGS, WGMMA_CONFIGS
from fusedops.kernels.matmul_kernels import matmul_tma_kernel
from tests.helpers import assert_close, poison, random_tensor              # noqa: E402
from tests.codegen_helpers import interpret_pipelined_tma_matmul           # noqa: E402


@dsl.jit
def _box_kernel(out_ptr, x_ptr, rows, cols, stride_r, stride_c, offset_r, offset_c,
                BLOCK_R: dsl.constexpr, BLOCK_C: dsl.constexpr):
    # out_ptr: (BLOCK_R, BLOCK_C) row-major; x_ptr: (rows, cols) with any strides
    box = dsl.make_tensor_descriptor(x_ptr, (rows, cols), (stride_r, stride_c), (BLOCK_R, BLOCK_C))
    tile = box.load((offset_r, offset_c))
    dsl.store(out_ptr + dsl.arange(0, BLOCK_R)[:, None] * BLOCK_C + dsl.arange(0, BLOCK_C)[None, :], tile)


def _expected_box(x: torch.Tensor, r0: int, c0: int, shape) -> torch.Tensor:
    out = torch.zeros(shape, dtype=x.dtype)
    for i in range(shape[0]):
        for j in range(shape[1]):
            if 0 <= r0 + i < x.shape[0] and 0 <= c0 + j < x.shape[1]:
                out[i, j] = x[r0 + i, c0 + j]
    return out


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("r0,c0", [(0, 0), (3, -2), (-5, 4), (6, 6), (40, 0)], ids=str)
def test_interpreter_descriptor_load_zero_fills_outside(r0, c0, transposed, seed):
    x = random_tensor((7, 5) if transposed else (5, 7), torch.float32, seed=seed)
    x = x.t() if transposed else x
    out = torch.full((8, 8), float("nan"))
    _box_kernel[(1,)](out, x, x.shape[0], x.shape[1], x.stride(0), x.stride(1), r0, c0, BLOCK_R=8, BLOCK_C=8,
                      interpret=True)
    assert torch.equal(out, _expected_box(x, r0, c0, (8, 8)))


@dsl.jit
def _offset_base_kernel(out_ptr, x_ptr, n, BLOCK: dsl.constexpr):
    d = dsl.make_tensor_descriptor(x_ptr + 1, (n, n), (n, 1), (BLOCK, BLOCK))
    dsl.store(out_ptr + dsl.arange(0, BLOCK)[:, None] * BLOCK + dsl.arange(0, BLOCK)[None, :], d.load((0, 0)))


@dsl.jit
def _computed_shape_kernel(out_ptr, x_ptr, n, BLOCK: dsl.constexpr):
    d = dsl.make_tensor_descriptor(x_ptr, (n * 2, n), (n, 1), (BLOCK, BLOCK))
    dsl.store(out_ptr + dsl.arange(0, BLOCK)[:, None] * BLOCK + dsl.arange(0, BLOCK)[None, :], d.load((0, 0)))


@pytest.mark.parametrize("kernel,message", [(_offset_base_kernel, "base must be a tensor"),
                                            (_computed_shape_kernel, "must be a kernel argument")])
def test_descriptor_arguments_must_be_kernel_arguments(kernel, message):
    x = torch.zeros(64)
    with pytest.raises(dsl.CompilationError, match=message) as info:
        kernel[(1,)](x, x, 8, BLOCK=8, interpret=True)
    assert "make_tensor_descriptor" in str(info.value)


# -- the library matmul with FUSEDOPS_TMA=1 -----------------------------------------------------------------

def _operand(rows, cols, dtype, transposed, seed):
    """A (rows, cols) operand, stored transposed (column-major) when `transposed`."""
    if transposed:
        return random_tensor((cols, rows), dtype, seed=seed).t()
    return random_tensor((rows, cols), dtype, seed=seed)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("a_t,b_t", [(False, False), (True, True), (False, True)])
def test_interpreter_tma_matmul_matches_float64(a_t, b_t, dtype, seed, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_TMA", "1")
    m, n, k = 48, 80, 80                      # strides multiples of 16 (TMA-describable); ragged 32-tiles
    a, b = _operand(m, k, dtype, a_t, seed), _operand(k, n, dtype, b_t, seed + 1)
    c = poison(torch.empty(1, m, n, dtype=dtype))
    assert mm._uses_tma(c, a[None], b[None])
    mm.matmul_into(c, a[None], b[None], interpret=True, config=_config(32, 32, 32, 4, 1, group_m=2))
    assert_close(c[0], a.double() @ b.double(), dtype)


def _tma_matmul_args(m, n, k, dtype, a_t, b_t, seed=0):
    a, b = _operand(m, k, dtype, a_t, seed), _operand(k, n, dtype, b_t, seed + 1)
    c = torch.empty(1, m, n, dtype=dtype)
    args, constexprs, _ = mm._tma_launch(c, a[None], b[None], None, None)
    return args, constexprs


def _compile_tma_matmul(config, dtype=torch.float16, a_t=False, b_t=False, arch="sm_90a", m=304, n=496, k=208):
    args, constexprs = _tma_matmul_args(m, n, k, dtype, a_t, b_t)
    return dsl.jit(matmul_tma_kernel.fn).compile(*args, target=arch, num_warps=config.num_warps,
                                                    num_stages=config.num_stages, **constexprs, **config.constexprs)


@pytest.fixture
def tma_on(monkeypatch, tmp_path):
    monkeypatch.setenv("FUSEDOPS_TMA", "1")
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    return monkeypatch


@pytest.mark.parametrize("knob,arch", [("0", "sm_90a"), ("1", "sm_80")])
def test_descriptor_loads_stay_plain_loads_without_tma(knob, arch, monkeypatch, tmp_path):
    monkeypatch.setenv("FUSEDOPS_TMA", knob)
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    compiled = _compile_tma_matmul(WGMMA_CONFIGS[2], arch=arch)
    ptx = compiled.asm["ptx"]
    assert "cp.async.bulk.tensor" not in ptx and "mbarrier" not in ptx and not compiled.tensor_maps
    assert "cp.async.cg.shared.global" in ptx


def test_pipelined_tma_ring_schedule(tma_on):
    """The ring of a TMA loop: one mbarrier per slot expecting both operands' copies, waits on the
    read slot's phase (carried), copies predicated on the loop range, no cp.async. (FUSEDOPS_WS=0's
    schedule; tests/test_warp_specialization.py has FUSEDOPS_WS=1's.)"""
    tma_on.setenv("FUSEDOPS_WS", "0")
    args, constexprs = _tma_matmul_args(64, 32, 96, torch.float16, False, True)
    kernel = dsl.jit(matmul_tma_kernel.fn)
    function = kernel.ir(*args, **constexprs, BLOCK_M=64, BLOCK_N=32, BLOCK_K=32, GROUP_M=1)
    run_pipeline(function, default_pipeline(4, "sm_90a", num_stages=4))
    ops = list(function.walk())
    (barriers,) = [op for op in ops if op.opcode == OpCode.LOCAL_ALLOC and "mbarrier_arrivals" in op.attrs]
    assert barriers.attrs["mbarrier_arrivals"] == 2 and barriers.result.type.num_buffers == 4
    copies = [op for op in ops if op.opcode == OpCode.TMA_COPY]
    assert len(copies) == 2 * 3          # 2 prologue stages (one wgmma in flight) + the loop's, per operand
    assert [op.opcode for op in ops].count(OpCode.MBARRIER_WAIT) == 1
    assert not any(op.opcode in (OpCode.ASYNC_COPY, OpCode.ASYNC_WAIT, OpCode.LOAD) for op in ops
                   if op.parent is not function.body or op.opcode != OpCode.LOAD)


@pytest.mark.parametrize("m,n,k,num_stages,b_t", [(70, 32, 96, 4, False), (64, 48, 160, 3, True),
                                                  (65, 40, 0, 4, False), (100, 48, 64, 2, True)], ids=str)
def test_pipelined_tma_ir_computes_the_same_in_the_interpreter(m, n, k, num_stages, b_t, tma_on, seed):
    """The interpreter lands a TMA copy only at the mbarrier wait of its slot (NaN poison before),
    so a wrong slot, phase or wait shows here."""
    a, b = _operand(m, k, torch.float16, False, seed), _operand(k, n, torch.float16, b_t, seed + 1)
    c = poison(torch.empty(1, m, n, dtype=torch.float16))
    interpret_pipelined_tma_matmul(c, a, b, num_stages, OpCode.TMA_COPY)
    assert_close(c[0], a.double() @ b.double(), torch.float16)


_PTXAS_CASES = [(config, torch.float16, False, False) for config in TMA_CONFIGS] + [
    (WGMMA_CONFIGS[0], torch.float16, True, True), (WGMMA_CONFIGS[2], torch.bfloat16, False, True),
    (WGMMA_CONFIGS[1], torch.bfloat16, True, False)]


@needs_ptxas
@pytest.mark.parametrize("config,dtype,a_t,b_t", _PTXAS_CASES, ids=str)
def test_tma_matmul_ptx_is_accepted_by_ptxas_without_spills(config, dtype, a_t, b_t, tma_on):
    compiled = _compile_tma_matmul(config, dtype, a_t, b_t)
    ptx = compiled.asm["ptx"]
    for needed in ("cp.async.bulk.tensor.2d", "mbarrier.try_wait.parity", "mbarrier.arrive.expect_tx",
                   "wgmma.mma_async", ".param .align 64 .b8"):
        assert needed in ptx, needed
    assert "cp.async.cg" not in ptx and len(compiled.tensor_maps) == 2
    result = assemble(ptx, "sm_90a")
    assert result.spill_bytes == 0, result.log


# -- host side: tensor maps from a launch's arguments -----------------------------------------------------

class _RecordingLauncher:
    def __init__(self):
        self.calls = []
        self.stream_of = lambda device: 0

    def launch(self, grid, stream, values):
        self.calls.append(tuple(values))


class _BytesDriver(_FakeDriver):
    def cuTensorMapEncodeTiled(self, *args):
        self.calls.append(args)
        return self.status, bytes([len(self.calls) % 256]) * 128


def _runtime_values(compiled, args: tuple) -> tuple:
    """The runtime values a launch of `matmul_tma_kernel` with `args` passes (tensors as addresses)."""
    bound = dict(zip([p.name for p in matmul_tma_kernel.params], args))
    return tuple(bound[name].data_ptr() if isinstance(bound[name], torch.Tensor) else bound[name]
                 for name in compiled.parameter_names)


@pytest.mark.parametrize("dtype,name", [(torch.float16, "FLOAT16"), (torch.bfloat16, "BFLOAT16")])
@pytest.mark.parametrize("a_t,b_t", [(False, False), (True, True)])
def test_tensor_maps_are_encoded_from_the_launch_arguments(dtype, name, a_t, b_t, tma_on):
    m, n, k = 304, 496, 208                            # ragged tiles, strides multiples of 16
    config = WGMMA_CONFIGS[2]                       # 128 x 128 x 64
    args, constexprs = _tma_matmul_args(m, n, k, dtype, a_t, b_t)
    compiled = _compile_tma_matmul(config, dtype, a_t, b_t, m=m, n=n, k=k)
    fake, inner = _BytesDriver(), _RecordingLauncher()
    launcher = TensorMapLauncher(inner, compiled.tensor_maps, driver=fake)
    values = _runtime_values(compiled, args)
    launcher.launch((4, 1, 1), 0, values)
    a, b = args[1][0], args[2][0]
    expected = []
    for tensor, rows, cols, transposed, tile in ((a, m, k, a_t, (128, 64)), (b, k, n, b_t, (64, 128))):
        stride = tensor.stride(1 if transposed else 0) * 2
        if transposed:      # column-major: the rows' dim is contiguous, tiles are M/N-major
            dims, box = [rows, cols], [64, tile[1]]
        else:
            dims, box = [cols, rows], [64, tile[0]]
        expected.append((f"CU_TENSOR_MAP_DATA_TYPE_{name}", 2, tensor.data_ptr(), dims, [stride], box, [1, 1],
                         "CU_TENSOR_MAP_INTERLEAVE_NONE", "CU_TENSOR_MAP_SWIZZLE_128B",
                         "CU_TENSOR_MAP_L2_PROMOTION_L2_256B", "CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE"))
    assert fake.calls == expected
    (sent,) = inner.calls
    assert sent[:len(values)] == values and sent[len(values):] == (bytes([1]) * 128, bytes([2]) * 128)
    # The same addresses reuse the maps; a new address of A re-encodes A's map only.
    launcher.launch((4, 1, 1), 0, values)
    assert len(fake.calls) == 2 and inner.calls[1] == inner.calls[0]
    moved = list(values)
    moved[compiled.tensor_maps[0].base] += 1024
    launcher.launch((4, 1, 1), 0, tuple(moved))
    assert len(fake.calls) == 3 and fake.calls[2][2] == values[compiled.tensor_maps[0].base] + 1024
    assert inner.calls[2][-2:] == (bytes([3]) * 128, bytes([2]) * 128)


class _NoContextStatus:
    name = "CUDA_ERROR_INVALID_CONTEXT"

    def __int__(self):
        return 201


class _NoContextDriver(_BytesDriver):
    """Refuses with CUDA_ERROR_INVALID_CONTEXT until a context is made current (`current` set)."""

    def __init__(self):
        super().__init__()
        self.current = False

    def cuTensorMapEncodeTiled(self, *args):
        if not self.current:
            self.calls.append("refused")
            return _NoContextStatus(), None
        return super().cuTensorMapEncodeTiled(*args)


@pytest.mark.parametrize("torch_device", [0, 1])
def test_tensor_maps_retry_where_the_thread_has_no_context(torch_device, tma_on, monkeypatch):
    """A launch's first driver call on a thread that never used CUDA (autograd's backward thread) may be
    the maps' encode: the driver refuses with CUDA_ERROR_INVALID_CONTEXT (seen on the H200, session 40: a
    backward's TMA matmul raised LaunchError). The encode retries with the kernel's context made current,
    by the launcher's rule (kernel_launcher.made_current): kept current on torch's current device, else
    pushed for the call alone."""
    from fusedops.dsl.runtime import kernel_launcher
    compiled = _compile_tma_matmul(WGMMA_CONFIGS[2])
    args, _ = _tma_matmul_args(304, 496, 208, torch.float16, False, False)
    fake, inner, seen = _NoContextDriver(), _RecordingLauncher(), []

    class Context:
        device_index = 0

        def activate(self):
            seen.append("activated")
            fake.current = True

        @contextlib.contextmanager
        def pushed(self):
            seen.append("pushed")
            fake.current = True
            yield
            fake.current = False

    inner.kernel = types.SimpleNamespace(context=Context())
    monkeypatch.setattr(kernel_launcher, "_torch_current_device", lambda: torch_device)
    launcher = TensorMapLauncher(inner, compiled.tensor_maps, driver=fake)
    launcher.launch((4, 1, 1), 0, _runtime_values(compiled, args))
    assert seen == (["activated"] if torch_device == 0 else ["pushed", "pushed"])
    assert [call for call in fake.calls if call == "refused"] == ["refused"] * (1 if torch_device == 0 else 2)
    (sent,) = inner.calls
    assert len(sent[-1]) == 128 and len(sent[-2]) == 128


def test_compiled_kernel_launcher_appends_tensor_map_parameters(tma_on):
    """CompiledKernel.launcher (what the full path, cached plans and prepared launches all use)
    packs one 128-byte TENSOR_MAP argument per map after the kernel's own parameters."""
    from fusedops.dsl.runtime import driver, kernel_launcher
    compiled = _compile_tma_matmul(WGMMA_CONFIGS[2])
    made = {}

    class FakeKernelLauncher:
        def __init__(self, kernel, kinds, num_warps, shared_bytes, names):
            made.update(kinds=kinds, names=names)
            self.launch, self.stream_of = _RecordingLauncher().launch, lambda device: 0

    tma_on.setattr(driver, "load_module", lambda ptx, name, device=0: object())
    tma_on.setattr(kernel_launcher, "KernelLauncher", FakeKernelLauncher)
    launcher = compiled.launcher(0)
    assert isinstance(launcher, TensorMapLauncher)
    assert made["kinds"][-2:] == [ParamKind.TENSOR_MAP] * 2 and made["names"][-1] == "tensor_map1"
    packer = ArgumentPacker(made["kinds"])
    assert packer.offsets[-1] % 128 == 0 and packer.offsets[-1] - packer.offsets[-2] == 128


def test_tensor_map_encode_host_cost(tma_on):
    """Host cost per launch of the maps (fake driver: the Python side of the encode, not the driver's
    own ~µs): a repeated launch must stay near a dict lookup per map."""
    import time
    compiled = _compile_tma_matmul(WGMMA_CONFIGS[2])
    args, _ = _tma_matmul_args(304, 496, 208, torch.float16, False, False)
    launcher = TensorMapLauncher(_RecordingLauncher(), compiled.tensor_maps, driver=_BytesDriver())
    encoder = launcher.encoder
    values = list(_runtime_values(compiled, args))
    count = 2000
    start = time.perf_counter()
    for i in range(count):
        values[1] = 0x10000 + 1024 * i             # a new address of A each time: A's map re-encoded
        encoder.encode(values)
    miss_us = (time.perf_counter() - start) / count * 1e6
    start = time.perf_counter()
    for _ in range(count):
        encoder.encode(values)
    hit_us = (time.perf_counter() - start) / count * 1e6
    print(f"tensor maps per launch: {miss_us:.2f} us with one re-encode, {hit_us:.2f} us cached")
    assert hit_us < 20 and miss_us < 200


# -- GPU tier: the TMA matmul against float64 ----------------------------------------------------------------

_ORIENTATIONS = [(False, False), (True, False), (False, True), (True, True)]
_GPU_CASES = ([(config, torch.float16, a_t, b_t) for config in TMA_CONFIGS for a_t, b_t in _ORIENTATIONS]
              + [(config, torch.bfloat16, a_t, b_t) for config in TMA_CONFIGS[1:3] for a_t, b_t in _ORIENTATIONS])


@pytest.mark.cuda
@pytest.mark.parametrize("config,dtype,a_t,b_t", _GPU_CASES, ids=str)
@pytest.mark.parametrize("m,n,k", [(304, 496, 208), (144, 272, 1008), (64, 16, 16), (1008, 784, 4096)], ids=str)
def test_gpu_tma_matmul_matches_float64(m, n, k, config, a_t, b_t, dtype, seed, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_TMA", "1")
    a, b = _operand(m, k, dtype, a_t, seed).cuda(), _operand(k, n, dtype, b_t, seed + 1).cuda()
    c = poison(torch.empty(1, m, n, dtype=dtype, device="cuda"))
    assert mm._uses_tma(c, a[None], b[None])
    mm.matmul_into(c, a[None], b[None], config=config)
    assert_close(c[0], a.double() @ b.double(), dtype)


@pytest.mark.cuda
def test_gpu_tma_ptx_is_what_runs(monkeypatch, tmp_path):
    monkeypatch.setenv("FUSEDOPS_TMA", "1")
    a = torch.randn(256, 512, dtype=torch.float16, device="cuda")
    b = torch.randn(512, 384, dtype=torch.float16, device="cuda")
    c = torch.empty(1, 256, 384, dtype=torch.float16, device="cuda")
    config = WGMMA_CONFIGS[2]
    mm.matmul_into(c, a[None], b[None], config=config)
    args, constexprs, _ = mm._tma_launch(c, a[None], b[None], None, None)
    compiled = matmul_tma_kernel.compile(*args, target="sm_90a", num_warps=config.num_warps,
                                            num_stages=config.num_stages, **constexprs, **config.constexprs)
    assert "cp.async.bulk.tensor" in compiled.asm["ptx"]
    assert_close(c[0], a.double() @ b.double(), torch.float16)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gpu_tma_knob_on_and_off_in_one_process(dtype, seed, monkeypatch):
    a, b = _operand(640, 1536, dtype, False, seed).cuda(), _operand(1536, 384, dtype, True, seed + 1).cuda()
    outputs = []
    for knob in ("1", "0", "1"):
        monkeypatch.setenv("FUSEDOPS_TMA", knob)
        c = poison(torch.empty(1, 640, 384, dtype=dtype, device="cuda"))
        mm.matmul_into(c, a[None], b[None], config=WGMMA_CONFIGS[0])
        assert_close(c[0], a.double() @ b.double(), dtype)
        outputs.append(c[0].double())
    assert float((outputs[0] - outputs[1]).abs().max()) <= 2.0 ** -6 * float(outputs[1].abs().max())
    assert torch.equal(outputs[0], outputs[2])


@pytest.mark.cuda
def test_gpu_tma_prepared_launch_follows_new_addresses(seed, monkeypatch):
    """A prepared launch (and the cached plan) re-encodes the maps for new tensors: results follow the
    tensors passed, not the ones it was prepared with."""
    monkeypatch.setenv("FUSEDOPS_TMA", "1")
    shape_a, shape_b = (300, 512), (512, 272)
    a1, b1 = random_tensor(shape_a, torch.float16, "cuda", seed), random_tensor(shape_b, torch.float16, "cuda", seed + 1)
    c = torch.empty(1, 300, 272, dtype=torch.float16, device="cuda")
    prepared = mm.prepare_matmul(c, a1[None], b1[None])
    assert prepared is not None
    for step in range(3):
        a = random_tensor(shape_a, torch.float16, "cuda", seed + 10 + step)
        b = random_tensor(shape_b, torch.float16, "cuda", seed + 20 + step)
        out = poison(torch.empty(1, 300, 272, dtype=torch.float16, device="cuda"))
        prepared(out, a[None], b[None], None)
        assert_close(out[0], a.double() @ b.double(), torch.float16)
        out2 = poison(torch.empty(1, 300, 272, dtype=torch.float16, device="cuda"))
        mm.matmul_into(out2, a[None], b[None])        # the cached plan of the entry
        assert_close(out2[0], a.double() @ b.double(), torch.float16)


@pytest.mark.cuda
def test_gpu_tma_matmul_and_backward_from_a_thread_without_a_context(seed, monkeypatch):
    """The maps' encode is the first driver call of a thread whose CUDA context is not current (a fresh
    thread; autograd's backward thread, where session 40's H200 run raised CUDA_ERROR_INVALID_CONTEXT from
    cuTensorMapEncodeTiled): it runs, right, and leaves torch's current device alone. (torch's allocator may
    make the context current first; test_tensor_maps_retry_where_the_thread_has_no_context mocks the refusal.)"""
    import threading
    from cuda.bindings import driver as cu
    monkeypatch.setenv("FUSEDOPS_TMA", "1")
    a = random_tensor((272, 336), torch.float16, "cuda", seed).requires_grad_()
    b = random_tensor((336, 208), torch.float16, "cuda", seed + 1).requires_grad_()
    grad = random_tensor((272, 208), torch.float16, "cuda", seed + 2)
    torch.cuda.synchronize()
    results = {}

    def work():
        try:
            cu.cuCtxSetCurrent(cu.CUcontext(0))         # no current context on this thread
            c = fusedops.matmul(a, b)
            c.backward(grad)
            torch.cuda.synchronize()
            results.update(c=c.detach(), device=torch.cuda.current_device())
        except BaseException as error:                   # noqa: BLE001 (reported below)
            results["error"] = error

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert "error" not in results, results.get("error")
    assert results["device"] == 0
    a64, b64, g64 = a.detach().double(), b.detach().double(), grad.double()
    assert_close(results["c"], a64 @ b64, torch.float16)
    assert_close(a.grad, g64 @ b64.T, torch.float16)
    assert_close(b.grad, a64.T @ g64, torch.float16)


@pytest.mark.cuda
def test_gpu_tma_sass_uses_utmaldg_and_hgmma(tma_on):
    compiled = _compile_tma_matmul(WGMMA_CONFIGS[0])
    try:
        sass = compiled.asm["sass"]
    except KeyError as error:
        pytest.skip(str(error))
    assert "UTMALDG" in sass and "HGMMA" in sass and "LDGSTS" not in sass
