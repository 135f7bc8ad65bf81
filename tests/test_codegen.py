"""CPU tier of the code generator: every Foundation kernel to PTX that ptxas accepts, golden LLVM IR
of small kernels (re-parsed and verified by LLVM), vectorized global access, and the disk cache."""

from __future__ import annotations

import json
import os
import re

import llvmlite.binding as llvm
import pytest
import torch

import fusedops.dsl as dsl
import kernels_for_tests as K
from fusedops.dsl.target import assemble, ptxas_available

needs_ptxas = pytest.mark.skipif(not ptxas_available(), reason="ptxas is not on the PATH")


def _pointer(dtype):
    return dsl.pointer_type(dsl.language.dtypes.from_torch(dtype))


def _foundation_cases(dtype):
    p = _pointer(dtype)
    i32 = dsl.int32
    return [
        ("vector_add", K.vector_add_kernel, (torch.empty(64, dtype=dtype),) * 3 + (1000,), dict(BLOCK=1024)),
        ("softmax", K.softmax_kernel, (p, p, i32, i32, i32), dict(BLOCK=2048)),
        ("matmul", K.matmul_kernel, (p, p, p) + (i32,) * 9, dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=16)),
        ("cumsum", K.cumsum_rows_kernel, (p, p) + (i32,) * 4, dict(BLOCK_ROWS=4, BLOCK_COLS=128)),
        ("histogram", K.histogram_kernel, (_pointer(torch.int32),) * 2 + (i32,), dict(BLOCK=256)),
    ]


@needs_ptxas
@pytest.mark.parametrize("arch", ["sm_80", "sm_90", "sm_90a"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("num_warps", [1, 4, 8])
def test_foundation_kernels_assemble(arch, dtype, num_warps, tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    for name, kernel, args, constexprs in _foundation_cases(dtype):
        compiled = kernel.compile(*args, target=arch, num_warps=num_warps, **constexprs)
        result = assemble(compiled.asm["ptx"], arch)
        assert result.spill_bytes == 0, (name, result.log)
        assert f".target {arch}" in compiled.asm["ptx"]
        assert f".maxntid {32 * num_warps}" in compiled.asm["ptx"].replace(", 1, 1", "")


@dsl.jit
def copy_kernel(out_ptr, x_ptr, n, BLOCK: dsl.constexpr):
    offsets = dsl.program_id(0) * BLOCK + dsl.arange(0, BLOCK)
    mask = offsets < n
    dsl.store(out_ptr + offsets, dsl.load(x_ptr + offsets, mask=mask), mask=mask)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int8])
def test_aligned_copy_uses_16_byte_vectors(dtype, tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    x = torch.empty(4096, dtype=dtype)
    ptx = copy_kernel.compile(x, x, 4096, BLOCK=2048).asm["ptx"]   # 16 elements per thread
    assert "ld.global.v4.b32" in ptx and "st.global.v4.b32" in ptx
    assert not re.search(r"ld\.global\.(b32|b16|u8|v2)", ptx)


def test_odd_sizes_vectorize_whole_groups_and_unaligned_pointers_do_not(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    x = torch.empty(4096, dtype=torch.float32)
    odd_n = copy_kernel.compile(x, x, 4099, BLOCK=1024).asm["ptx"]
    # `offsets < 4099` is not constant over 4 elements: a v4 access for whole groups, predicated
    # scalar accesses for the partial one
    assert odd_n.count("ld.global.v4.b32") == 2 and odd_n.count("ld.global.b32") == 8
    assert odd_n.count("st.global.v4.b32") == 2 and odd_n.count("st.global.b32") == 8
    unaligned = copy_kernel.compile(x[1:], x[1:], 4080, BLOCK=1024).asm["ptx"]
    assert "ld.global.v4" not in unaligned


def test_specializations_that_differ_only_in_alignment_do_not_share_a_cache_entry(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    x = torch.empty(4096, dtype=torch.float32)
    aligned = dsl.jit(copy_kernel.fn).compile(x, x, 4096, BLOCK=1024).asm["ptx"]
    unaligned = dsl.jit(copy_kernel.fn).compile(x, x, 4095, BLOCK=1024).asm["ptx"]
    assert "ld.global.b32" not in aligned and "ld.global.b32" in unaligned


def test_disk_cache_hit_and_corrupt_entry(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    x = torch.empty(4096, dtype=torch.float32)
    first = dsl.jit(copy_kernel.fn).compile(x, x, 4096, BLOCK=512)
    entries = list(tmp_path.rglob("*.json"))
    assert len(entries) == 1
    assert json.loads(entries[0].read_text())["ptx"] == first.asm["ptx"]
    entries[0].write_text("{ not json")
    again = dsl.jit(copy_kernel.fn).compile(x, x, 4096, BLOCK=512)
    assert again.asm["ptx"] == first.asm["ptx"]
    assert json.loads(entries[0].read_text())["ptx"] == first.asm["ptx"]   # rewritten
    monkeypatch.setenv("FUSEDOPS_DISABLE_CACHE", "1")
    os.remove(entries[0])
    dsl.jit(copy_kernel.fn).compile(x, x, 4096, BLOCK=512)
    assert not list(tmp_path.rglob("*.json"))


@dsl.jit
def scale_kernel(out_ptr, x_ptr, alpha, BLOCK: dsl.constexpr):
    offsets = dsl.arange(0, BLOCK)
    dsl.store(out_ptr + offsets, dsl.load(x_ptr + offsets) * alpha)


_GOLDEN_SCALE = """\
define ptx_kernel void @"scale_kernel"(ptr addrspace(1) noundef align 16 %"out_ptr", ptr addrspace(1) noundef align 16 %"x_ptr", float %"alpha") "nvvm.maxntid"="32,1,1"
{
prologue:
  %"tid" = call i32 @"llvm.nvvm.read.ptx.sreg.tid.x"()
  %"lane" = and i32 %"tid", 31
  %"warp" = lshr i32 %"tid", 5
  %".5" = lshr i32 %"lane", 0
  %".6" = and i32 %".5", 1
  %".7" = mul i32 %".6", 4
  %".8" = xor i32 0, %".7"
  %".9" = lshr i32 %"lane", 1
  %".10" = and i32 %".9", 1
  %".11" = mul i32 %".10", 8
  %".12" = xor i32 %".8", %".11"
  %".13" = lshr i32 %"lane", 2
  %".14" = and i32 %".13", 1
  %".15" = mul i32 %".14", 16
  %".16" = xor i32 %".12", %".15"
  %".17" = lshr i32 %"lane", 3
  %".18" = and i32 %".17", 1
  %".19" = mul i32 %".18", 32
  %".20" = xor i32 %".16", %".19"
  %".21" = lshr i32 %"lane", 4
  %".22" = and i32 %".21", 1
  %".23" = mul i32 %".22", 64
  %".24" = xor i32 %".20", %".23"
  br label %"body"
"""


def test_golden_llvm_ir_of_a_small_kernel(tmp_path, monkeypatch):
    """The prologue of a 1-warp kernel: lane bits 0..4 each own 4 consecutive elements (128 / 32)."""
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    from fusedops.dsl.codegen.kernel import lower_to_llvm
    from fusedops.dsl.passes.layout_assignment import assign_layouts
    from fusedops.dsl.passes.pointer_analysis import analyze_pointers

    x = torch.empty(128, dtype=torch.float32)
    function = scale_kernel.ir(x, x, 0.5, BLOCK=128, num_warps=1)
    assign_layouts(function, 1)
    lowered = lower_to_llvm(function, arch="sm_90a", num_warps=1, axis_info=analyze_pointers(function))
    text = lowered.llvm_ir
    start = text.index("define ptx_kernel")
    assert text[start:start + len(_GOLDEN_SCALE)] == _GOLDEN_SCALE
    body = text[text.index('body:'):]
    assert body.count("load <4 x float>") == 1 and body.count("store <4 x float>") == 1
    assert body.count("fmul float") == 4
    module = llvm.parse_assembly(text)
    module.verify()


@dsl.jit
def _scale_rows_kernel(y_ptr, stat_ptr, x_ptr, w_ptr, n_cols, ROWS: dsl.constexpr, BLOCK: dsl.constexpr):
    rows = dsl.program_id(0) * ROWS + dsl.arange(0, ROWS)
    cols = dsl.arange(0, BLOCK)
    mask = cols[None, :] < n_cols
    x = dsl.load(x_ptr + rows[:, None] * n_cols + cols[None, :], mask=mask, other=0.0).to(dsl.float32)
    w = dsl.load(w_ptr + cols, mask=cols < n_cols, other=0.0).to(dsl.float32)
    dsl.store(y_ptr + rows[:, None] * n_cols + cols[None, :], x * w[None, :], mask=mask)
    dsl.store(stat_ptr + rows, dsl.sum(x, axis=1))


@needs_ptxas
def test_broadcast_loads_and_row_statistics_need_no_layout_conversion(tmp_path, monkeypatch):
    # A weight row loaded for `w[None, :]` is read in the layout of the broadcast, and per-row sums
    # are stored from the reduction's slice layout: no trip through shared memory for either.
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    x = torch.empty(4, 1024, dtype=torch.float16)
    compiled = _scale_rows_kernel.compile(x, torch.empty(4), x, x[0], 1024, target="sm_90a", num_warps=4,
                                          ROWS=2, BLOCK=1024)
    assert "convert_layout" not in compiled.asm["ir"]
    ptx = compiled.asm["ptx"]
    assert "st.shared" not in ptx.replace("st.shared.b32", "")   # only the cross-warp reduction's words
    assert "ld.global.v4" in ptx and not re.search(r"ld\.global[.\w]*\.[bu]16", ptx)
    assert assemble(ptx, "sm_90a").spill_bytes == 0


def test_broadcast_load_layout_keeps_interpreter_semantics():
    x = torch.randn(4, 1000, dtype=torch.float16)
    w = torch.randn(1000, dtype=torch.float16)
    y, stat = torch.empty_like(x), torch.empty(4)
    _scale_rows_kernel[(2,)](y, stat, x, w, 1000, ROWS=2, BLOCK=1024, interpret=True)
    torch.testing.assert_close(y.double(), (x.double() * w.double()).half().double(), atol=1e-3, rtol=1e-3)
    torch.testing.assert_close(stat.double(), x.double().sum(1), atol=1e-3, rtol=1e-4)
