"""Tests of fusedops.dsl.target: llvmlite helpers, LLVM IR -> PTX, libdevice, ptxas.

The kernels are built directly with llvmlite.ir (no block IR), so these tests only depend on the
back end. ptxas checks are skipped when ptxas is not installed.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from llvmlite import ir

from fusedops.dsl.errors import BackendError
from fusedops.dsl.language import dtypes
from fusedops.dsl.target import libdevice, ptxas
from fusedops.dsl.target import llvm_types as T
from fusedops.dsl.target.ptx import SUPPORTED_ARCHS, Target, compile_to_ptx

needs_ptxas = pytest.mark.skipif(not ptxas.ptxas_available(), reason="ptxas is not installed")


def _kernel_module(*, with_expf: bool = True) -> ir.Module:
    """kern(y: f32*, x: f32*, b: bf16*, v: <4 x f32>*): y[t] = expf(x[t]); b[t] += 1.5; v[t] *= v[t]."""
    module = ir.Module("test")
    kernel = ir.Function(module, ir.FunctionType(T.void, [T.pointer()] * 4), "kern")
    T.mark_kernel(kernel, max_threads=128)
    for argument in kernel.args:
        argument.attributes.align = 16
    kernel.args[0].add_attribute("noalias")
    kernel.args[1].add_attribute("noalias")
    b = ir.IRBuilder(kernel.append_basic_block("entry"))
    tid = b.zext(b.call(T.declare_intrinsic(module, "llvm.nvvm.read.ptx.sreg.tid.x", T.i32, []), []), T.i64)
    x = b.load(b.gep(kernel.args[1], [tid], inbounds=True, source_etype=T.f32), typ=T.f32, align=4)
    if with_expf:
        x = b.call(T.declare_intrinsic(module, "__nv_expf", T.f32, [T.f32]), [x])
    b.store(x, b.gep(kernel.args[0], [tid], inbounds=True, source_etype=T.f32), align=4)
    bf_pointer = b.gep(kernel.args[2], [tid], inbounds=True, source_etype=T.bf16)
    b.store(b.fadd(b.load(bf_pointer, typ=T.bf16, align=2), ir.Constant(T.bf16, 1.5)), bf_pointer, align=2)
    v4 = ir.VectorType(T.f32, 4)
    vector_pointer = b.gep(kernel.args[3], [tid], inbounds=True, source_etype=v4)
    vector = b.load(vector_pointer, typ=v4, align=16)
    b.store(b.fmul(vector, vector), vector_pointer, align=16)
    b.ret_void()
    return module


@pytest.fixture(scope="module")
def compiled():
    text = str(_kernel_module())
    return {arch: compile_to_ptx(text, Target(arch)) for arch in SUPPORTED_ARCHS}


@pytest.mark.parametrize("arch", SUPPORTED_ARCHS)
def test_ptx_has_entry_vector_load_and_launch_bounds(compiled, arch):
    result = compiled[arch]
    assert result.entry_names == ("kern",)
    assert re.search(r"\.entry\s+kern\(", result.ptx)
    assert re.search(r"ld\.global(\.nc)?\.v4\.", result.ptx), result.ptx
    assert re.search(r"st\.global\.v4\.", result.ptx)
    assert ".maxntid 128, 1, 1" in result.ptx
    assert f".target {arch}" in result.ptx
    assert ".version 8.4" in result.ptx
    assert "define ptx_kernel void @kern" in result.llir


def test_bf16_add_is_native_on_hopper(compiled):
    assert "add.rn.bf16" in compiled["sm_90a"].ptx
    assert "0x3FC0" in compiled["sm_90a"].ptx  # 1.5 as bfloat16


def test_libdevice_is_internalized(compiled):
    # Without internalization the PTX holds all of libdevice (~21 000 lines).
    ptx = compiled["sm_90a"].ptx
    assert len(ptx.splitlines()) < 150
    assert "__nv_" not in ptx
    assert "ex2.approx" in ptx  # __nv_expf was inlined


def test_without_libdevice_link_the_call_stays_external():
    result = compile_to_ptx(str(_kernel_module()), Target("sm_90a"), link_libdevice=False)
    assert ".extern .func" in result.ptx and "__nv_expf" in result.ptx


@needs_ptxas
@pytest.mark.parametrize("arch", SUPPORTED_ARCHS)
def test_ptxas_accepts(compiled, arch):
    result = ptxas.assemble(compiled[arch].ptx, arch)
    assert result.cubin.startswith(b"\x7fELF")
    assert 0 < result.registers <= 255
    assert result.spill_bytes == 0
    assert result.shared_bytes == 0
    assert "kern" in result.log


@needs_ptxas
def test_ptxas_reports_shared_memory():
    module = ir.Module("smem")
    kernel = ir.Function(module, ir.FunctionType(T.void, [T.pointer()]), "smem_kernel")
    T.mark_kernel(kernel)
    buffer = ir.GlobalVariable(module, ir.ArrayType(T.f32, 1024), "buffer", addrspace=T.SHARED_ADDRESS_SPACE)
    buffer.linkage = "internal"
    buffer.initializer = ir.Constant(ir.ArrayType(T.f32, 1024), None)
    buffer.type = T.pointer(T.SHARED_ADDRESS_SPACE)
    b = ir.IRBuilder(kernel.append_basic_block("entry"))
    tid = b.zext(b.call(T.declare_intrinsic(module, "llvm.nvvm.read.ptx.sreg.tid.x", T.i32, []), []), T.i64)
    b.store(ir.Constant(T.f32, 2.0), b.gep(buffer, [tid], source_etype=T.f32))
    b.call(T.declare_intrinsic(module, "llvm.nvvm.barrier.cta.sync.aligned.all", T.void, [T.i32]),
           [ir.Constant(T.i32, 0)])
    value = b.load(b.gep(buffer, [b.xor(tid, ir.Constant(T.i64, 1))], source_etype=T.f32), typ=T.f32)
    b.store(value, b.gep(kernel.args[0], [tid], source_etype=T.f32))
    b.ret_void()
    result = ptxas.assemble(compile_to_ptx(str(module), Target("sm_80")).ptx, "sm_80")
    assert result.shared_bytes == 4096


@needs_ptxas
def test_ptxas_failure_raises_with_log():
    bad = (".version 8.4\n.target sm_90a\n.address_size 64\n.visible .entry k()\n"
           "{\n  bogus.instruction %r1;\n  ret;\n}\n")
    with pytest.raises(BackendError) as info:
        ptxas.assemble(bad, "sm_90a")
    message = str(info.value)
    assert "ptxas failed for sm_90a" in message
    assert "bogus.instruction" in message  # the PTX excerpt around the error line
    assert info.value.stage == "ptxas" and info.value.artifact == bad


@needs_ptxas
@pytest.mark.skipif(ptxas._find_tool("cuobjdump") is None and ptxas._find_tool("nvdisasm") is None,
                    reason="neither cuobjdump nor nvdisasm is installed")
def test_sass_lists_the_kernel(compiled):
    listing = ptxas.sass(ptxas.assemble(compiled["sm_90a"].ptx, "sm_90a").cubin)
    assert listing is not None and "kern" in listing
    assert re.search(r"\bLDG\.E\.(\w+\.)?128\b", listing)  # the <4 x float> load, one 128-bit load


def test_sass_is_none_without_disassemblers(monkeypatch):
    monkeypatch.setattr(ptxas, "_find_tool", lambda name: None)
    assert ptxas.sass(b"\x7fELF") is None


@pytest.mark.parametrize("arch", ["sm_75", "sm_100a", "SM_90", "", "sm90"])
def test_unknown_arch_raises_value_error(arch):
    with pytest.raises(ValueError, match="supported: sm_80, sm_90, sm_90a"):
        Target(arch)


@pytest.mark.parametrize("arch, version, match", [
    ("sm_90a", 78, r"sm_90a needs PTX >= 8\.0"),   # LLVM would abort the process
    ("sm_90", 77, r"sm_90 needs PTX >= 7\.8"),
    ("sm_80", 79, "unknown PTX version 79"),        # LLVM would ignore it with a warning
    ("sm_80", 91, "unknown PTX version 91"),        # ptxas 13.0 rejects 9.1
    ("sm_80", 8.4, "unknown PTX version"),
])
def test_bad_ptx_version_raises_value_error(arch, version, match):
    with pytest.raises(ValueError, match=match):
        Target(arch, version)


def test_target_defaults_and_capability():
    assert Target("sm_80").ptx_version == 84
    assert Target("sm_90a", 86).features == "+ptx86"
    assert Target("sm_90a").capability == (9, 0)
    assert Target("sm_80").requiring_ptx(86) == Target("sm_80", 86)
    assert Target("sm_80", 88).requiring_ptx(86) == Target("sm_80", 88)
    assert Target.from_capability(9, 0).arch == "sm_90a"
    assert Target.from_capability(10, 0).arch == "sm_90"
    assert Target.from_capability(8, 9).arch == "sm_80"
    with pytest.raises(ValueError, match="7.5"):
        Target.from_capability(7, 5)


_BAD_PARSE = """define ptx_kernel void @k(ptr addrspace(1) %p) {
entry:
  %x = load float, ptr addrspace(1) %p
  %y = fadd float %x, i32 1
  store float %y, ptr addrspace(1) %p
  ret void
}
"""

_BAD_VERIFY = """define ptx_kernel void @k(ptr addrspace(1) %p) {
entry:
  br label %loop
loop:
  %y = add i32 %y, 1
  store i32 %y, ptr addrspace(1) %p
  br label %loop
}
"""


@pytest.mark.parametrize("text, stage, offending", [
    (_BAD_PARSE, "parse", "%y = fadd float %x, i32 1"),
    (_BAD_VERIFY, "verify", "%y = add i32 %y, 1"),
])
def test_invalid_ir_raises_backend_error_with_ir(text, stage, offending):
    with pytest.raises(BackendError) as info:
        compile_to_ptx(text, Target("sm_90a"))
    error = info.value
    message = str(error)
    assert f"LLVM {stage} failed for sm_90a" in message
    assert re.search(r"\d+> +" + re.escape(offending), message), message  # marked line of the excerpt
    assert error.stage == stage and error.arch == "sm_90a" and error.artifact == text


def test_long_ir_is_truncated_in_the_message():
    filler = "".join(f"  %v{i} = add i32 {i}, {i}\n" for i in range(500))
    text = f"define void @f() {{\nentry:\n{filler}  %bad = add i32 1, float 2.0\n  ret void\n}}\n"
    with pytest.raises(BackendError) as info:
        compile_to_ptx(text, Target("sm_80"))
    message = str(info.value)
    assert "%bad = add i32 1, float 2.0" in message
    assert "%v10 = " not in message  # far from the error line
    assert len(message) < 4000
    assert "lines in all" in message


@pytest.mark.parametrize("call", [
    "call float @llvm.exp.f32(float %x)",
    "call float @llvm.sin.f32(float %x)",
    "call double @llvm.exp2.f64(double %d)",
])
def test_unlowerable_intrinsics_raise_instead_of_aborting(call):
    declaration = {"exp.f32": "declare float @llvm.exp.f32(float)", "sin.f32": "declare float @llvm.sin.f32(float)",
                   "exp2.f64": "declare double @llvm.exp2.f64(double)"}
    name = re.search(r"@llvm\.([\w.]+)\(", call).group(1)
    result_type = "double" if "double" in call else "float"
    text = (f"{declaration[name]}\n"
            "define ptx_kernel void @k(ptr addrspace(1) %p) {\nentry:\n"
            "  %x = load float, ptr addrspace(1) %p\n  %d = fpext float %x to double\n"
            f"  %r = {call}\n  store {result_type} %r, ptr addrspace(1) %p\n  ret void\n}}\n")
    with pytest.raises(BackendError, match="cannot lower"):
        compile_to_ptx(text, Target("sm_90a"))


def test_sin_with_afn_is_allowed():
    text = ("declare float @llvm.sin.f32(float)\n"
            "define ptx_kernel void @k(ptr addrspace(1) %p) {\nentry:\n"
            "  %x = load float, ptr addrspace(1) %p\n  %r = call afn float @llvm.sin.f32(float %x)\n"
            "  store float %r, ptr addrspace(1) %p\n  ret void\n}\n")
    assert "sin.approx.f32" in compile_to_ptx(text, Target("sm_80")).ptx


def test_opt_level_is_validated():
    with pytest.raises(ValueError, match="opt_level"):
        compile_to_ptx(str(_kernel_module()), Target("sm_80"), opt_level=4)


# -- llvm_types ------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype, expected", [
    (dtypes.int1, "i1"), (dtypes.int8, "i8"), (dtypes.uint16, "i16"), (dtypes.int32, "i32"),
    (dtypes.uint64, "i64"), (dtypes.float16, "half"), (dtypes.bfloat16, "bfloat"),
    (dtypes.float32, "float"), (dtypes.float64, "double"),
    (dtypes.pointer_type(dtypes.float16), "ptr addrspace(1)"),
    (dtypes.pointer_type(dtypes.float32, 3), "ptr addrspace(3)"),
])
def test_llvm_type(dtype, expected):
    assert str(T.llvm_type(dtype)) == expected


def test_llvm_memory_type_and_errors():
    assert str(T.llvm_memory_type(dtypes.int1)) == "i8"
    assert str(T.vector_type(dtypes.float16, 8)) == "<8 x half>"
    with pytest.raises(TypeError, match="block type"):
        T.llvm_type(dtypes.BlockType((4,), dtypes.float32))
    with pytest.raises(TypeError):
        T.llvm_type("float32")


def test_bfloat_type_is_distinct_and_prints():
    assert str(T.bf16) == "bfloat" and T.bf16 == T.BFloatType()
    assert T.bf16 != T.f16 and T.f16 != T.bf16
    assert str(ir.Constant(T.bf16, 1.0)) == "bfloat 0xR3F80"


def test_bfloat16_bits_round_to_nearest_even_like_torch(seed):
    rng = np.random.default_rng(seed)
    values = np.concatenate([
        rng.standard_normal(2000).astype(np.float32) * np.float32(1e3),
        # exact ties between two bfloat16 values: 1 + k/256 + 1/512 (low 16 bits = 0x8000)
        (np.float32(1.0) + np.arange(64, dtype=np.float32) / np.float32(128.0) + np.float32(2.0**-8)),
        np.array([0.0, -0.0, 3.0e38, -3.0e38, 1e-40, np.inf, -np.inf], dtype=np.float32),
    ])
    expected = torch.from_numpy(values).to(torch.bfloat16).view(torch.int16).numpy().astype(np.uint16)
    ours = np.array([T.bfloat16_bits(float(v)) for v in values], dtype=np.uint16)
    np.testing.assert_array_equal(ours, expected)
    assert T.bfloat16_bits(float("nan")) & 0x7FC0 == 0x7FC0


def test_declare_intrinsic_caches_and_checks_signature():
    module = ir.Module()
    first = T.declare_intrinsic(module, "llvm.nvvm.read.ptx.sreg.ctaid.x", T.i32, [])
    assert T.declare_intrinsic(module, "llvm.nvvm.read.ptx.sreg.ctaid.x", T.i32, []) is first
    assert str(module).count("declare") == 1
    with pytest.raises(TypeError, match="already declared"):
        T.declare_intrinsic(module, "llvm.nvvm.read.ptx.sreg.ctaid.x", T.i64, [])


def test_string_attributes_widen_only_one_function():
    module = ir.Module()
    first = ir.Function(module, ir.FunctionType(T.void, []), "first")
    second = ir.Function(module, ir.FunctionType(T.void, []), "second")
    T.add_string_attribute(first, "nvvm.maxnreg", "128")
    assert '"nvvm.maxnreg"="128"' in str(first)
    with pytest.raises(ValueError):
        second.attributes.add('"nvvm.maxnreg"="128"')


def test_convergent_inline_asm_assembles():
    module = ir.Module("asm")
    kernel = ir.Function(module, ir.FunctionType(T.void, [T.pointer()]), "shuffle")
    T.mark_kernel(kernel)
    b = ir.IRBuilder(kernel.append_basic_block("entry"))
    value = b.load(kernel.args[0], typ=T.i32, align=4)
    swapped = T.inline_asm(b, "// butterfly\nshfl.sync.bfly.b32 $0, $1, 16, 31, -1;", "=r,r", [value], T.i32,
                           convergent=True)
    b.store(swapped, kernel.args[0], align=4)
    b.ret_void()
    text = str(module)
    assert re.search(r"call i32 asm sideeffect .*\\0Ashfl.*convergent", text)
    result = compile_to_ptx(text, Target("sm_80"))
    assert "shfl.sync.bfly.b32" in result.ptx
    if ptxas.ptxas_available():
        ptxas.assemble(result.ptx, "sm_80")


# -- libdevice -------------------------------------------------------------------------------------

def test_libdevice_override_must_exist(tmp_path):
    with pytest.raises(BackendError, match="FUSEDOPS_LIBDEVICE_PATH"):
        libdevice.find_libdevice({"FUSEDOPS_LIBDEVICE_PATH": str(tmp_path / "missing.bc")})


def test_libdevice_override_accepts_a_directory(tmp_path):
    (tmp_path / libdevice.LIBDEVICE_FILENAME).write_bytes(b"BC")
    found = libdevice.find_libdevice({"FUSEDOPS_LIBDEVICE_PATH": str(tmp_path)})
    assert found == tmp_path / libdevice.LIBDEVICE_FILENAME


def test_libdevice_cuda_home_is_searched(tmp_path):
    target = tmp_path / "nvvm" / "libdevice" / libdevice.LIBDEVICE_FILENAME
    target.parent.mkdir(parents=True)
    target.write_bytes(b"BC")
    assert libdevice.find_libdevice({"CUDA_HOME": str(tmp_path)}) == target


def test_missing_libdevice_error_lists_places(monkeypatch):
    monkeypatch.setattr(libdevice, "_candidates", lambda environ: [("nowhere", libdevice.Path("/nonexistent/x.bc"))])
    monkeypatch.setattr(libdevice, "_from_pip_wheels", lambda: (None, "no wheels here"))
    with pytest.raises(BackendError, match=r"(?s)cannot find libdevice\.10\.bc.*/nonexistent/x\.bc.*no wheels here"):
        libdevice.find_libdevice({})
