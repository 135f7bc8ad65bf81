"""Review (session 16, the on-disk kernel cache and the compile bookkeeping), CPU only.

Each test asserts the correct behaviour of one defect found; all eight were fixed the same session:
constexpr tuples keyed by their items' classes and bytes (runtime/signature.py, fast_path.py); the
disk-cache key covers device_assert locations and FUSEDOPS_LIBDEVICE_PATH (compiler.py); a module
attribute a kernel reads is tracked like a global (frontend/expressions.py); FUSEDOPS_DUMP_DIR reaches the
pass manager and FUSEDOPS_DUMP_IR compiles afresh (compiler.py); cache entries missing a field or holding
one of another type are recompiled (runtime/cache.py); autotune records that are not objects are ignored
(runtime/autotune.py). Kernels are compiled for sm_90a without a GPU (`kernel.compile`), which goes
through the disk cache in tmp_path.
"""

from __future__ import annotations

import json
import re

import llvmlite.binding as llvm
import pytest
import torch

import fusedops.dsl as dsl
from fusedops.dsl.runtime.autotune import Autotuner, Config
from helpers import import_module_from_text


def _ptx_strings(ptx: str) -> list:
    """The constant strings of a PTX module (`.b8 name[N] = {104, 105, ...}`)."""
    out = []
    for match in re.finditer(r"\.b8 \w+\[\d+\] = \{([0-9, ]+)\}", ptx):
        out.append(bytes(int(v) for v in match.group(1).split(",")).rstrip(b"\0").decode())
    return out


@dsl.jit
def _scale_by_tuple_kernel(out_ptr, x_ptr, C: dsl.constexpr, BLOCK: dsl.constexpr):
    offsets = dsl.arange(0, BLOCK)
    dsl.store(out_ptr + offsets, dsl.load(x_ptr + offsets) * C[0])


def test_constexpr_tuples_that_compare_equal_are_separate_specializations(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    x = torch.empty(64)
    positive = _scale_by_tuple_kernel.compile(x, x, C=(0.0,), BLOCK=64)
    negative = _scale_by_tuple_kernel.compile(x, x, C=(-0.0,), BLOCK=64)
    assert "0f80000000" in negative.asm["ptx"], "x * -0.0 compiled as x * 0.0"
    assert negative is not positive
    xi = torch.empty(64, dtype=torch.int32)
    _scale_by_tuple_kernel.compile(xi, xi, C=(1,), BLOCK=64)
    as_float = _scale_by_tuple_kernel.compile(xi, xi, C=(1.0,), BLOCK=64)
    assert "cast" in as_float.asm["ir"], "int * 1.0 compiled as the int * 1 kernel"


def _log_kernel(tmp_path, monkeypatch, name: str):
    """A fresh module's `log_kernel` (out = log(x): libdevice's __nv_logf), compiled once for 64 floats."""
    module = import_module_from_text(tmp_path, monkeypatch, name, """
        import fusedops.dsl as dsl

        @dsl.jit
        def log_kernel(out_ptr, x_ptr, BLOCK: dsl.constexpr):
            offsets = dsl.arange(0, BLOCK)
            dsl.store(out_ptr + offsets, dsl.log(dsl.load(x_ptr + offsets)))
    """)
    x = torch.empty(64)
    module.log_kernel.compile(x, x, BLOCK=64)
    return module.log_kernel, x


def _write_fake_libdevice(path) -> None:
    """A "libdevice" at `path` whose logf(x) is x + 4 (4.0 is 0f40800000 in the PTX)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(llvm.parse_assembly(
        "define float @__nv_logf(float %x) {\n  %y = fadd float %x, 4.0\n  ret float %y\n}\n").as_bitcode())


def test_libdevice_path_is_part_of_the_disk_cache_key(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path / "cache"))
    log_kernel, x = _log_kernel(tmp_path, monkeypatch, "_rv16_log_kernel")     # the real libdevice, into the cache
    fake = tmp_path / "libdevice.10.bc"
    _write_fake_libdevice(fake)
    monkeypatch.setenv("FUSEDOPS_LIBDEVICE_PATH", str(fake))
    log_kernel._cache.clear()                     # as a new process would
    ptx = log_kernel.compile(x, x, BLOCK=64).asm["ptx"]
    assert "0f40800000" in ptx, "the PTX linked with the previous libdevice was reused"


def test_searched_libdevice_is_part_of_the_disk_cache_key(tmp_path, monkeypatch):
    """Without FUSEDOPS_LIBDEVICE_PATH the libdevice the search finds (here through $CUDA_HOME, as after a CUDA
    upgrade) keys the entry too (session 40's specialization review: the cache reused PTX of the old one)."""
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("FUSEDOPS_LIBDEVICE_PATH", raising=False)
    log_kernel, x = _log_kernel(tmp_path, monkeypatch, "_rv40_log_kernel")     # the libdevice found now
    _write_fake_libdevice(tmp_path / "cuda" / "nvvm" / "libdevice" / "libdevice.10.bc")   # found first: $CUDA_HOME
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda"))
    log_kernel._cache.clear()                     # as a new process would
    ptx = log_kernel.compile(x, x, BLOCK=64).asm["ptx"]
    assert "0f40800000" in ptx, "the PTX linked with the previously found libdevice was reused"


_ASSERT_KERNEL = """
    import fusedops.dsl as dsl
    {padding}
    @dsl.jit
    def checked(x_ptr, n, BLOCK: dsl.constexpr):
        offsets = dsl.arange(0, BLOCK)
        value = dsl.load(x_ptr + offsets, mask=offsets < n)
        dsl.device_assert(value > 0, "positive")
"""


def test_device_assert_location_is_part_of_the_disk_cache_key(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path / "cache"))
    first = import_module_from_text(tmp_path, monkeypatch, "_rv16_assert_a", _ASSERT_KERNEL.format(padding=""))
    second = import_module_from_text(tmp_path, monkeypatch, "_rv16_assert_b", _ASSERT_KERNEL.format(padding="\n" * 20))
    x = torch.empty(64)
    first.checked.compile(x, 100, BLOCK=64)
    strings = _ptx_strings(second.checked.compile(x, 100, BLOCK=64).asm["ptx"])
    assert any(s.endswith("_rv16_assert_b.py") for s in strings), strings


def test_rebinding_a_module_attribute_the_kernel_reads_recompiles(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path / "cache"))
    config = import_module_from_text(tmp_path, monkeypatch, "_rv16_cfg", "SCALE = 3.0\n")
    module = import_module_from_text(tmp_path, monkeypatch, "_rv16_uses_cfg", """
        import fusedops.dsl as dsl
        import _rv16_cfg

        @dsl.jit
        def scaled(out_ptr, x_ptr, BLOCK: dsl.constexpr):
            offsets = dsl.arange(0, BLOCK)
            dsl.store(out_ptr + offsets, dsl.load(x_ptr + offsets) * _rv16_cfg.SCALE)
    """)
    x = torch.empty(64)
    assert "0f40400000" in module.scaled.compile(x, x, BLOCK=64).asm["ptx"]     # 3.0
    monkeypatch.setattr(config, "SCALE", 7.0)
    assert "0f40E00000" in module.scaled.compile(x, x, BLOCK=64).asm["ptx"], "still x * 3.0 after SCALE = 7.0"


@dsl.jit
def _copy_kernel(out_ptr, x_ptr, BLOCK: dsl.constexpr):
    offsets = dsl.arange(0, BLOCK)
    dsl.store(out_ptr + offsets, dsl.load(x_ptr + offsets))


def test_dump_dir_knob_receives_the_dumps(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("FUSEDOPS_DUMP_IR", "1")
    monkeypatch.setenv("FUSEDOPS_DUMP_DIR", str(tmp_path / "dumps"))
    x = torch.empty(64)
    _copy_kernel.compile(x, x, BLOCK=16)
    assert (tmp_path / "dumps").is_dir() and any((tmp_path / "dumps").iterdir())
    assert "IR before pass" not in capsys.readouterr().err


def test_dump_ir_dumps_on_a_disk_cache_hit(tmp_path, monkeypatch, capfd):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path / "cache"))
    x = torch.empty(64)
    _copy_kernel.compile(x, x, BLOCK=32)           # fills the disk cache
    _copy_kernel._cache.clear()                    # a new process
    monkeypatch.setenv("FUSEDOPS_DUMP_IR", "1")
    capfd.readouterr()
    _copy_kernel.compile(x, x, BLOCK=32)
    assert "IR before pass" in capfd.readouterr().err


@pytest.mark.parametrize("entry", [
    {"format": 1, "ptx": "garbage"},
    {"format": 1, "ptx": 5, "ir": 1, "llir": 1, "name": "k", "shared_bytes": None},
], ids=["missing-fields", "wrong-types"])
def test_an_incomplete_cache_entry_is_recompiled(entry, tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    _copy_kernel._cache.clear()                    # compiled in this tmp_path, whatever ran before
    x = torch.empty(64)
    good = _copy_kernel.compile(x, x, BLOCK=64).asm["ptx"]
    [path] = list(tmp_path.glob("*/*.json"))
    path.write_text(json.dumps(entry))
    _copy_kernel._cache.clear()
    assert _copy_kernel.compile(x, x, BLOCK=64).asm["ptx"] == good


def test_a_non_dict_autotune_record_is_ignored(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    tuner = Autotuner(_copy_kernel, [Config({"BLOCK": 32}), Config({"BLOCK": 64})], key=[])
    path = tuner._record_path()
    path.parent.mkdir(parents=True)
    path.write_text("[]")
    chosen = tuner.select("k", lambda config: (1.0 if config.constexprs["BLOCK"] == 64 else 2.0, False))
    assert chosen.constexprs == {"BLOCK": 64}


def test_fast_path_launch_keys_keep_equal_comparing_tuples_apart():
    # the GPU launch cache's key (runtime/fast_path.py make_binder), as the full path's specialization
    from fusedops.dsl.runtime import fast_path
    from fusedops.dsl.runtime.signature import Parameter

    params = (Parameter("x", False), Parameter("C", True))
    bind = fast_path.make_binder(params, torch.Tensor)
    keys = [bind(4, 3, 1, value)[0] for value in [(0.0,), (-0.0,), (1,), (1.0,), (True,)]]   # all == (0,) or (1,)
    assert len(set(keys)) == 5
    wrapped = bind(4, 3, 1, dsl.constexpr((-0.0,)))[0]
    assert wrapped == keys[1] and wrapped != keys[0]
