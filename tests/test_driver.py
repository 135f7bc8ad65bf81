"""Tests of the kernel-argument packer (CPU) and the cuda-python driver layer (GPU tier: `cuda`)."""

from __future__ import annotations

import contextlib
import ctypes
import math
import struct
import threading
import types

import numpy as np
import pytest
import torch
from llvmlite import ir

from fusedops.dsl.errors import LaunchError
from fusedops.dsl.language import dtypes
from fusedops.dsl.runtime import driver, kernel_launcher
from fusedops.dsl.runtime.launcher_args import ArgumentPacker, ParamKind, param_kind

K = ParamKind
_MIXED = [K.POINTER, K.INT1, K.INT32, K.INT8, K.INT64, K.FLOAT16, K.FLOAT32, K.UINT16, K.FLOAT64, K.UINT32,
          K.BFLOAT16, K.POINTER]


def _reference_bytes(values) -> bytes:
    """The values of _MIXED packed by hand with struct, each at its natural alignment."""
    (pointer_a, flag, int32, int8, int64, half, single, uint16, double, uint32, bf16_bits, pointer_b) = values
    return (struct.pack("<Q", pointer_a) + struct.pack("<?", flag) + b"\0" * 3 + struct.pack("<i", int32)
            + struct.pack("<b", int8) + b"\0" * 7 + struct.pack("<q", int64) + struct.pack("<e", half)
            + b"\0" * 2 + struct.pack("<f", single) + struct.pack("<H", uint16) + b"\0" * 6
            + struct.pack("<d", double) + struct.pack("<I", uint32) + struct.pack("<H", bf16_bits)
            + b"\0" * 2 + struct.pack("<Q", pointer_b))


def _random_mixed_values(rng):
    return [int(rng.integers(0, 2**48)) * 256, bool(rng.integers(0, 2)), int(rng.integers(-2**31, 2**31)),
            int(rng.integers(-128, 128)), int(rng.integers(-2**63, 2**63)), float(rng.standard_normal()),
            float(rng.standard_normal()), int(rng.integers(0, 2**16)), float(rng.standard_normal()),
            int(rng.integers(0, 2**32)), float(rng.standard_normal()), int(rng.integers(0, 2**48)) * 16]


@pytest.mark.parametrize("case", range(4))
def test_packer_writes_exact_bytes_and_pointer_array(seed, case):
    rng = np.random.default_rng(seed)
    values = _random_mixed_values(rng)
    packer = ArgumentPacker(_MIXED)
    address = packer.pack(values)
    raw = ctypes.string_at(address, packer.buffer_size)
    bf16_bits = int(torch.tensor(values[10], dtype=torch.float32).to(torch.bfloat16).view(torch.int16)) & 0xFFFF
    expected_values = _reference_bytes(values[:10] + [bf16_bits] + values[11:])
    assert raw[packer.values_offset:] == expected_values
    assert packer.pack_values(values) == expected_values
    pointers = struct.unpack_from(f"<{len(_MIXED)}Q", raw)
    assert [p - address - packer.values_offset for p in pointers] == list(packer.offsets)
    assert packer.offsets == (0, 8, 12, 16, 24, 32, 36, 40, 48, 56, 60, 64)


def test_packer_reuses_its_buffer_and_rewrites_it():
    packer = ArgumentPacker([K.INT32, K.FLOAT32])
    first = packer.pack([1, 2.0])
    second = packer.pack([-7, 0.25])
    assert first == second
    assert ctypes.string_at(first + packer.values_offset, 8) == struct.pack("<if", -7, 0.25)


def test_packer_gives_each_thread_its_own_buffer():
    packer = ArgumentPacker([K.INT64])
    main = packer.pack([1])
    seen = []
    thread = threading.Thread(target=lambda: seen.append(packer.pack([2])))
    thread.start()
    thread.join()
    assert seen[0] != main
    assert ctypes.string_at(main + 8, 8) == struct.pack("<q", 1)  # untouched by the other thread


def test_packer_without_parameters_returns_null():
    assert ArgumentPacker([]).pack([]) == 0


def test_fp16_packing_rounds_like_numpy(seed):
    values = np.random.default_rng(seed).standard_normal(64) * 100
    packer = ArgumentPacker([K.FLOAT16] * 64)
    assert packer.pack_values(list(map(float, values))) == values.astype(np.float16).tobytes()


@pytest.mark.parametrize("index, value, match", [
    (2, 2**31, r"argument 2 \(n\) of kind int32: expected an int in \[-2\*\*31, 2\*\*31\), got 2147483648"),
    (2, 1.5, r"argument 2 \(n\) of kind int32: .*got 1\.5 \(float"),
    (0, -16, r"argument 0 \(x_ptr\) of kind pointer: expected a device address"),
    (0, 3.0, r"argument 0 \(x_ptr\) of kind pointer"),
    (1, "2.0", r"argument 1 \(scale\) of kind float32: .*got '2\.0' \(str"),
    (1, 1e39, r"argument 1 \(scale\) of kind float32: expected a float within float32's range"),
    (3, 70000.0, r"argument 3 \(eps\) of kind float16"),
    (4, -1, r"argument 4 \(count\) of kind uint32"),
    (5, "x", r"argument 5 \(beta\) of kind bfloat16"),
])
def test_packer_errors_name_the_argument(index, value, match):
    packer = ArgumentPacker([K.POINTER, K.FLOAT32, K.INT32, K.FLOAT16, K.UINT32, K.BFLOAT16],
                            names=["x_ptr", "scale", "n", "eps", "count", "beta"])
    values = [4096, 1.0, 10, 0.5, 3, 1.0]
    values[index] = value
    with pytest.raises(LaunchError, match=match):
        packer.pack(values)


def test_packer_error_without_names_and_wrong_count():
    packer = ArgumentPacker([K.INT8, K.INT8])
    with pytest.raises(LaunchError, match=r"^argument 1 of kind int8"):
        packer.pack([1, 200])
    with pytest.raises(LaunchError, match="takes 2 arguments, got 3"):
        packer.pack([1, 2, 3])
    with pytest.raises(TypeError, match="parameter 1"):
        ArgumentPacker([K.INT8, "int8"])


@pytest.mark.parametrize("type_, kind", [
    (dtypes.pointer_type(dtypes.bfloat16), K.POINTER), (dtypes.int1, K.INT1), (dtypes.int32, K.INT32),
    (dtypes.uint64, K.UINT64), (dtypes.float16, K.FLOAT16), (dtypes.bfloat16, K.BFLOAT16),
    (dtypes.float64, K.FLOAT64),
])
def test_param_kind_of_dtypes(type_, kind):
    assert param_kind(type_) is kind


def test_param_kind_rejects_blocks():
    with pytest.raises(TypeError):
        param_kind(dtypes.BlockType((2,), dtypes.float32))


def test_check_unwraps_results_and_names_errors():
    cu = pytest.importorskip("cuda.bindings.driver")
    assert driver.check((cu.CUresult.CUDA_SUCCESS,)) is None
    assert driver.check((cu.CUresult.CUDA_SUCCESS, 5)) == 5
    assert driver.check((cu.CUresult.CUDA_SUCCESS, 5, 6)) == (5, 6)
    with pytest.raises(LaunchError, match="cuFoo failed: CUDA_ERROR_INVALID_VALUE"):
        driver.check((cu.CUresult.CUDA_ERROR_INVALID_VALUE, None), "cuFoo")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")
def test_without_gpu_driver_calls_raise_launch_error():
    with pytest.raises(LaunchError, match="no CUDA GPU"):
        driver.device_context()
    with pytest.raises(LaunchError, match="no CUDA GPU"):
        driver.load_module(b"", "k")


@pytest.mark.parametrize("code_name, match", [
    ("CUDA_ERROR_NOT_FOUND", "the loaded module has no kernel named 'k': CUDA_ERROR_NOT_FOUND"),
    # lazy loading: the kernel's code is loaded by cuModuleGetFunction, so a full GPU fails there
    ("CUDA_ERROR_OUT_OF_MEMORY", "could not load kernel 'k' from its module on <ctx>: CUDA_ERROR_OUT_OF_MEMORY"),
])
def test_get_function_failure_names_its_cause(monkeypatch, code_name, match):
    cu = pytest.importorskip("cuda.bindings.driver")
    unloaded = []
    monkeypatch.setattr(driver, "device_context", lambda device_index=None: _NamedContext())
    monkeypatch.setattr(driver, "cuda_driver", lambda: types.SimpleNamespace(
        CUresult=cu.CUresult, CUjit_option=cu.CUjit_option,
        cuModuleLoadDataEx=lambda *args: (cu.CUresult.CUDA_SUCCESS, "module"),
        cuModuleGetFunction=lambda module, name: (getattr(cu.CUresult, code_name), None),
        cuModuleUnload=lambda module: unloaded.append(module) or (cu.CUresult.CUDA_SUCCESS,),
        cuGetErrorString=lambda code: (cu.CUresult.CUDA_ERROR_INVALID_VALUE, None)))
    with pytest.raises(LaunchError, match=match):
        driver.load_module(".version 8.0", "k")
    assert unloaded == ["module"]


class _NamedContext:
    def pushed(self):
        return contextlib.nullcontext()

    def __repr__(self):
        return "<ctx>"


# -- GPU tier --------------------------------------------------------------------------------------

def _affine_kernel_ptx(arch: str) -> str:
    """affine(y: f32*, x: f32*, n: i32, alpha: f32, h: half, b: bfloat, offset: i64, flag: i1, small: i16):
    y[i] = x[i] * alpha + h + b + (offset >> 32) + small + (flag ? 1000 : 0) for i < n."""
    from fusedops.dsl.target import llvm_types as T
    from fusedops.dsl.target.ptx import Target, compile_to_ptx

    module = ir.Module("affine")
    kernel = ir.Function(module, ir.FunctionType(T.void, [T.pointer(), T.pointer(), T.i32, T.f32, T.f16, T.bf16,
                                                          T.i64, T.i1, T.i16]), "affine")
    T.mark_kernel(kernel, max_threads=128)
    y, x, n, alpha, half, bf16, offset, flag, small = kernel.args
    b = ir.IRBuilder(kernel.append_basic_block("entry"))

    def sreg(name):
        return b.call(T.declare_intrinsic(module, f"llvm.nvvm.read.ptx.sreg.{name}", T.i32, []), [])

    i = b.add(b.mul(sreg("ctaid.x"), sreg("ntid.x")), sreg("tid.x"))
    body, done = kernel.append_basic_block("body"), kernel.append_basic_block("done")
    b.cbranch(b.icmp_signed("<", i, n), body, done)
    b.position_at_end(body)
    index = b.sext(i, T.i64)
    value = b.fmul(b.load(b.gep(x, [index], source_etype=T.f32), typ=T.f32, align=4), alpha)
    value = b.fadd(value, b.fpext(half, T.f32))
    value = b.fadd(value, b.fpext(bf16, T.f32))
    value = b.fadd(value, b.sitofp(b.ashr(offset, ir.Constant(T.i64, 32)), T.f32))  # high word: all 8 bytes read
    value = b.fadd(value, b.sitofp(small, T.f32))
    value = b.fadd(value, b.select(flag, ir.Constant(T.f32, 1000.0), ir.Constant(T.f32, 0.0)))
    b.store(value, b.gep(y, [index], source_etype=T.f32), align=4)
    b.branch(done)
    b.position_at_end(done)
    b.ret_void()
    return compile_to_ptx(str(module), Target(arch)).ptx


_AFFINE_KINDS = [K.POINTER, K.POINTER, K.INT32, K.FLOAT32, K.FLOAT16, K.BFLOAT16, K.INT64, K.INT1, K.INT16]


def _current_target_arch() -> str:
    from fusedops.dsl.target.ptx import Target

    return Target.from_capability(*torch.cuda.get_device_capability()).arch


@pytest.mark.cuda
def test_device_context_properties():
    context = driver.device_context()
    properties = context.properties
    assert properties.compute_capability == torch.cuda.get_device_capability()
    assert properties.sm_count == torch.cuda.get_device_properties(0).multi_processor_count
    assert properties.max_threads_per_block == 1024
    assert properties.max_shared_memory_optin >= 48 * 1024
    assert driver.device_context() is context
    context.activate()


@pytest.mark.cuda
@pytest.mark.parametrize("form", ["ptx", "cubin"])
def test_load_and_launch_mixed_scalar_arguments(seed, form):
    from fusedops.dsl.target import ptxas

    arch = _current_target_arch()
    image = _affine_kernel_ptx(arch)
    if form == "cubin":
        if not ptxas.ptxas_available():
            pytest.skip("ptxas is not installed")
        image = ptxas.assemble(image, arch).cubin
    kernel = driver.load_module(image, "affine")
    launcher = kernel_launcher.KernelLauncher(kernel, _AFFINE_KINDS, num_warps=4)
    n = 1000
    generator = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(n + 17, device="cuda", generator=generator)
    y = torch.full_like(x, float("nan"))  # poisoned; elements past n must stay NaN
    args = [y.data_ptr(), x.data_ptr(), n, 1.75, 0.1, -2.5, -3 * 2**32 + 5, True, -300]
    launcher.launch((math.ceil(n / 128), 1, 1), driver.current_raw_stream(0), args)
    torch.cuda.synchronize()
    expected = x[:n].double() * 1.75 + float(np.float16(0.1)) - 2.5 - 3 - 300 + 1000
    torch.testing.assert_close(y[:n].double(), expected, rtol=1e-6, atol=1e-5)
    assert torch.isnan(y[n:]).all()


@pytest.mark.cuda
def test_launch_on_the_null_stream_from_a_thread_that_never_used_cuda(seed):
    # The thread has no current context: the launch fails with CUDA_ERROR_INVALID_CONTEXT and is retried
    # with the kernel's context; torch's current device in that thread stays what it was.
    kernel = driver.load_module(_affine_kernel_ptx(_current_target_arch()), "affine")
    launcher = kernel_launcher.KernelLauncher(kernel, _AFFINE_KINDS, num_warps=4)
    n = 300
    x = torch.randn(n, device="cuda", generator=torch.Generator(device="cuda").manual_seed(seed))
    ys = [torch.full_like(x, float("nan")) for _ in range(2)]
    torch.cuda.synchronize()
    seen = []

    def work():
        for y in ys:        # the second launch finds the context current
            launcher.launch((math.ceil(n / 128), 1, 1), 0, [y.data_ptr(), x.data_ptr(), n, 2.0, 0.0, 0.0, 0, False, 0])
        seen.append(torch.cuda.current_device())
        torch.cuda.synchronize()

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert seen == [kernel.context.device_index]
    for y in ys:
        torch.testing.assert_close(y, x * 2.0, rtol=1e-6, atol=1e-6)


@pytest.mark.cuda
def test_jit_error_log_is_surfaced():
    bad = ".version 8.0\n.target sm_80\n.address_size 64\n.visible .entry k()\n{\n  bogus.op %r1;\n  ret;\n}\n"
    with pytest.raises(LaunchError, match=r"(?s)could not load.*CUDA_ERROR_INVALID_PTX.*JIT log:.*bogus"):
        driver.load_module(bad, "k")


@pytest.mark.cuda
def test_missing_kernel_name_raises():
    with pytest.raises(LaunchError, match="no kernel named 'nope'"):
        driver.load_module(_affine_kernel_ptx(_current_target_arch()), "nope")


@pytest.mark.cuda
def test_dynamic_shared_memory_opt_in_and_limit():
    kernel = driver.load_module(_affine_kernel_ptx(_current_target_arch()), "affine")
    limit = kernel.context.properties.max_shared_memory_optin
    driver.set_dynamic_shared_memory(kernel, 100 * 1024)
    assert kernel.dynamic_shared_limit == 100 * 1024
    launcher = kernel_launcher.KernelLauncher(kernel, _AFFINE_KINDS, num_warps=4, shared_bytes=limit)
    x = torch.zeros(128, device="cuda")
    launcher.launch((1, 1, 1), driver.current_raw_stream(0), [x.data_ptr(), x.data_ptr(), 128, 1.0, 0.0, 0.0, 0,
                                                              False, 1])
    torch.cuda.synchronize()
    assert (x == 1).all()
    with pytest.raises(LaunchError, match="allows at most"):
        driver.set_dynamic_shared_memory(kernel, limit + 1)


@pytest.mark.cuda
def test_launch_errors_are_launch_errors():
    kernel = driver.load_module(_affine_kernel_ptx(_current_target_arch()), "affine")
    with pytest.raises(LaunchError, match="threads per block"):
        kernel_launcher.KernelLauncher(kernel, _AFFINE_KINDS, num_warps=8)  # .maxntid 128
    launcher = kernel_launcher.KernelLauncher(kernel, _AFFINE_KINDS, num_warps=4)
    args = [0, 0, 0, 1.0, 0.0, 0.0, 0, False, 0]
    with pytest.raises(LaunchError, match="grid"):
        launcher.launch((0, 1, 1), driver.current_raw_stream(0), args)
    with pytest.raises(LaunchError, match="grid"):
        launcher.launch((-1, 1, 1), driver.current_raw_stream(0), args)
    with pytest.raises(LaunchError, match=r"argument 2 of kind int32"):
        launcher.launch((1, 1, 1), driver.current_raw_stream(0), [0, 0, 2**40, 1.0, 0.0, 0.0, 0, False, 0])


# ------------------------------------------------------------------------------------------------
# Fixed arguments, the inlined launch statements and the stream handle, on the CPU (driver mocked)
# ------------------------------------------------------------------------------------------------
def test_packer_with_fixed_arguments_packs_them_once_per_thread(seed):
    rng = np.random.default_rng(seed)
    values = _random_mixed_values(rng)
    pointers = {0, 11}                         # the launches pass these; the others are fixed
    fixed = {i: value for i, value in enumerate(values) if i not in pointers}
    packer = ArgumentPacker(_MIXED, fixed=fixed)
    full = ArgumentPacker(_MIXED)
    assert packer.variable == (0, 11)
    assert packer.offsets[:2] == (0, 16)      # the variable values first, then the fixed ones
    for call in range(2):
        launched = [int(rng.integers(0, 2**40)) * 16 for _ in pointers]
        address = packer.pack(launched)
        expected = list(values)
        expected[0], expected[11] = launched
        assert packer.read(address) == full.read(full.pack(expected))
        assert packer.pack_values(launched) == struct.pack("<QQ", *launched)
    seen = []
    thread = threading.Thread(target=lambda: seen.append(packer.read(packer.pack([16, 32]))))
    thread.start()
    thread.join()
    assert seen[0][1:11] == full.read(full.pack(values))[1:11]     # a new thread's buffer has them too


def test_packer_with_fixed_arguments_names_bad_values():
    kinds = [K.POINTER, K.INT32, K.FLOAT32, K.POINTER]
    names = ["x_ptr", "n", "scale", "y_ptr"]
    with pytest.raises(LaunchError, match=r"argument 1 \(n\) of kind int32: .*got 2147483648"):
        ArgumentPacker(kinds, names, fixed={1: 2**31, 2: 1.0})
    with pytest.raises(LaunchError, match=r"argument 2 \(scale\) of kind float32: .*got 'a'"):
        ArgumentPacker(kinds, names, fixed={1: 3, 2: "a"})
    packer = ArgumentPacker(kinds, names, fixed={1: 3, 2: 0.5})
    with pytest.raises(LaunchError, match=r"argument 3 \(y_ptr\) of kind pointer: .*got -16"):
        packer.pack([16, -16])
    with pytest.raises(LaunchError, match="takes 2 arguments, got 3"):
        packer.pack([16, 32, 48])
    with pytest.raises(ValueError, match="fixed parameters"):
        ArgumentPacker(kinds, fixed={4: 1})
    bf16 = ArgumentPacker([K.POINTER, K.BFLOAT16], fixed={1: 1.5})     # converted once, to its bits
    assert bf16.read(bf16.pack([64])) == (64, 0x3FC0)


def _mocked_launcher(monkeypatch, kinds, names=None):
    """A KernelLauncher on a mocked driver, and the list of its cuLaunchKernel calls."""
    calls = []

    def cu_launch_kernel(function, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        calls.append(((gx, gy, gz), stream, params and launcher.packer.read(params)))
        return (0,)

    monkeypatch.setattr(driver, "cuda_driver", lambda: types.SimpleNamespace(cuLaunchKernel=cu_launch_kernel))
    kernel = driver.LoadedKernel("k", None, None, None, 32, 0, 0, 1024, driver.DEFAULT_SHARED_MEMORY_LIMIT)
    launcher = kernel_launcher.KernelLauncher(kernel, kinds, num_warps=4, param_names=names)
    return launcher, calls


def _inlined(launcher, count: int, fixed=None):
    """`launch(grid_x, grid_y, grid_z, stream, v0, ...)` made of kernel_launcher.inline_launch_statements."""
    parts = launcher.inline(fixed)
    names = [f"v{i}" for i in range(count)]
    statements = kernel_launcher.inline_launch_statements(names, "grid_x, grid_y, grid_z", "stream")
    source = "\n".join([f"def launch(grid_x, grid_y, grid_z, stream, {', '.join(names)}):",
                        *("    " + line for line in statements)])
    namespace = {"struct": struct, **parts._asdict()}
    exec(source, namespace)
    return namespace["launch"]


def test_inlined_launch_packs_and_fails_like_launch(monkeypatch):
    kinds = [K.POINTER, K.INT32, K.FLOAT32]
    launcher, calls = _mocked_launcher(monkeypatch, kinds, ["x_ptr", "n", "scale"])
    inlined = _inlined(launcher, 3)
    launcher.launch((2, 1, 1), 0, [4096, 7, 0.5])
    inlined(2, 1, 1, 0, 4096, 7, 0.5)
    assert calls[0] == calls[1] == ((2, 1, 1), None, (4096, 7, 0.5))
    for launch in (lambda *v: launcher.launch((1, 1, 1), 0, v), lambda *v: inlined(1, 1, 1, 0, *v)):
        with pytest.raises(LaunchError, match=r"argument 1 \(n\) of kind int32"):
            launch(4096, 2**40, 0.5)
    with_fixed = _inlined(launcher, 1, fixed={1: 9, 2: 2.0})
    with_fixed(3, 2, 1, 0, 8192)
    assert calls[-1] == ((3, 2, 1), None, (8192, 9, 2.0))
    with pytest.raises(LaunchError, match=r"argument 0 \(x_ptr\) of kind pointer"):
        with_fixed(1, 1, 1, 0, -1)
    assert kernel_launcher.KernelLauncher.inline(_mocked_launcher(monkeypatch, [K.BFLOAT16])[0]) is None
    assert kernel_launcher.KernelLauncher.inline(_mocked_launcher(monkeypatch, [])[0]) is None


def test_default_stream_is_passed_as_none(monkeypatch):
    # cuda-python makes a CUstream of an int handle first; None, the legacy default stream, it takes as is
    launcher, calls = _mocked_launcher(monkeypatch, [K.INT32])
    inlined = _inlined(launcher, 1)
    for stream, passed in [(0, None), (0x7F0000001000, 0x7F0000001000)]:
        launcher.launch((1, 1, 1), stream, [1])
        inlined(1, 1, 1, stream, 1)
        assert [call[1] for call in calls[-2:]] == [passed, passed]
