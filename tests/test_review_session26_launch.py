"""Review (session 26): the kernel-launch, specialization, caching and autotuning machinery of fusedops.dsl,
attacked with cases taken from Triton bug reports. CPU only: values come from the NumPy interpreter, PTX is
compiled with llvmlite for sm_90a, and GPU launches go through a mocked driver (as tests/test_launch_fast_path.py
does) whose cuLaunchKernel records which loaded kernel each launch used, so a stale plan shows as the wrong
kernel launched.

What was tried (Triton report it mirrors in brackets):
- globals and helpers a kernel reads changing after the first compile [triton#7322 constexpr globals not in the
  cache key; #4051 a helper chosen through a constexpr; #586 edited functions not recompiled]: a helper's global
  on the cached-launch path, a helper rebound through a module attribute, a closure variable, a class attribute,
  a global naming a module rebound to another module, the kernel's source file edited after import;
- specialization vs. the cached-launch key: a differential run of 120 launches over tensors with storage offsets
  (aligned / 4-byte / 16-byte), ints at the divisibility and width boundaries (0, 1, -16, 24, 2**31, 2**63),
  bools, floats, constexprs that compare equal (1, True, 1.0, 0.0, -0.0) and a defaulted runtime parameter
  given by keyword, each launch checked to run the kernel the full path specializes for its arguments;
  bools given to a parameter annotated with an integer dtype [triton equal_to_1 / bool argument reports];
- prepared launches given None where a tensor was prepared [triton None-argument reports];
- autotune: reset_to_zero when the config comes from the on-disk record [triton#7181 reset_to_zero and the
  autotune disk cache]; the in-memory hit;
- the on-disk cache: an entry path that is a directory or a dangling symlink;
- threads: interpreter launches of several specializations of one kernel, and compiles of distinct kernels
  at once (PTX equal to the serial compile);
- grids: a z dimension past 65535 on both paths.

DEFECTS (all fixed in session 26; their tests, strict xfails until then, now pass):

1. A class attribute a kernel reads is neither tracked nor checked: with `class Consts: SCALE = 3.0` and a
   kernel storing `x * Consts.SCALE`, after `Consts.SCALE = 7.0` the next launch (interpreter, cached GPU
   launch or `compile`) still runs the x * 3.0 kernel (stale). Expected: recompiled, as for a module attribute
   (`mod.SCALE`, fixed in session 16) or a global. (Also: a list read through a class attribute is accepted,
   where a global list is refused, and its mutation is never seen.) Cause: frontend/expressions.py
   `visit_Attribute` returns `getattr(value, name)` for any non-module object without `check_global` and
   without `on_global`; only module attributes are recorded in used_globals.
2. Rebinding a global that names a module keeps the stale kernel: `cfg = cfg_a` (cfg_a.SCALE = 3.0), kernel
   reads `cfg.SCALE`; after `cfg = cfg_b` (cfg_b.SCALE = 7.0) launches still multiply by 3.0. Expected: 7.0.
   Cause: frontend/scope.py `Scope.lookup` (and `visit_Attribute`) do not record globals bound to a
   `types.ModuleType`, so used_globals holds (vars(cfg_a), "SCALE", 3.0), which never changes.
3. A kernel's source is read when it is first compiled, not when it is decorated: if the module's file is
   edited after import (a notebook importing a .py file that is then edited, without reload), the kernel
   compiles what is now at its old line numbers. Adding one line to the body of `ones` (stores 1.0) makes the
   untouched `twos` (stores 2.0), launched afterwards, store 1.0: `inspect.getsourcelines(twos)` scans back from
   its old first line to `def ones`, and `frontend.errors.parse_function` takes that def without checking
   its name. Expected: the function that was decorated (Triton reads the source in JITFunction.__init__), or
   an error. Cause: JITFunction.source (runtime/jit.py) parses lazily; parse_function does not compare the
   FunctionDef's name with fn.__name__.
4. A prepared launch given None where it was prepared with a tensor crashes inside generated code:
   `p = kernel.prepare((1,), x, b, y)` then `p(x, None, y)` raises "AttributeError: 'NoneType' object has no
   attribute 'data_ptr'" from `<prepared launch>`; the interpreter's prepared launch runs the None
   specialization. Expected: the full path (as for a tensor where None was prepared), or an error naming
   `b_ptr`. Cause: launch_plans._prepared_factory reads `t{i}.data_ptr()` for every tensor slot before any test.
5. reset_to_zero zeroes the caller's tensor although no tuning launch ran: when the config comes from the
   on-disk autotune record (a later process), the first launch for the key zeroes `out` (Autotuner._tune's
   `finally: reset()` after `select` found the record), so `out` pre-filled with 5.0 plus one launch gives
   x instead of 5 + x; a key found in memory does not reset ("tuned: no reset now",
   tests/test_autotune_search.py), and Triton's autotune cache hit runs no reset. Expected: a recorded key
   behaves like a key tuned earlier in this process. Cause: runtime/autotune.py `_tune` resets in `finally`
   even when `select` returned a recorded config without measuring.
6. A bool given to a parameter annotated with an integer dtype reuses the wrong cached kernel: for
   `def k(o_ptr, a: dsl.int32)`, `k[(1,)](o, True)` specializes `a` as equal to 1 (the IR constant 1, not a
   parameter) and makes a plan keyed (bool, 0); `k[(1,)](o, False)` then finds that plan and launches the
   kernel that stores 1 (the interpreter stores 0). Expected: False is a runtime 0 (another specialization).
   Cause: fast_path._other_key keys every bool as (bool, 0), while signature._annotated_scalar specializes an
   annotated integer's bool by value (_int_spec: True == 1 is equal_to_one, False is divisible by 16).

What matched (plain tests): a helper's global rebound misses the cached plan and the new kernel is launched; a
helper rebound through a module attribute and a closure variable recompile; the differential run of the
cached-launch key against the full path's specialization; the interpreter's bool values for an annotated
int; threads; an in-memory autotune hit leaves the tensor alone; cache entries that are directories or dangling
symlinks only cost the cache; grid z past 65535 is a LaunchError on both paths.
"""

from __future__ import annotations

import json
import os
import random
import threading
import types

import pytest
import torch

import fusedops.dsl as dsl
from fusedops.dsl.errors import LaunchError
from fusedops.dsl.runtime import autotune as autotune_module
from fusedops.dsl.runtime import driver
from fusedops.dsl.runtime.signature import SpecializationKey, specialize
from helpers import import_module_from_text
from mock_gpu import accumulate_kernel
from test_launch_fast_path import _cuda, gpu  # noqa: F401  (the mocked driver: a fixture, fake CUDA tensors)


@pytest.fixture(autouse=True)
def _private_cache(monkeypatch, tmp_path):
    """Every compile of this file into a fresh disk cache (no hit from, nor write into, the user's)."""
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path / "kernels"))
    monkeypatch.delenv("FUSEDOPS_INTERPRET", raising=False)


@pytest.fixture
def tracked(monkeypatch, tmp_path):
    """The mocked driver of test_launch_fast_path's `gpu`, with one token per loaded kernel: returns the list of
    the tokens launched (compare with `_function_of(entry)`)."""
    launched = []

    def cu_launch_kernel(function, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        launched.append(function)
        return (0,)

    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path / "tracked"))
    monkeypatch.setenv("FUSEDOPS_DEFAULT_ARCH", "sm_90a")
    monkeypatch.setattr(driver, "cuda_driver", lambda: types.SimpleNamespace(cuLaunchKernel=cu_launch_kernel))
    monkeypatch.setattr(driver, "load_module", lambda ptx, name, index=None: driver.LoadedKernel(
        name, None, types.SimpleNamespace(ptx=ptx), None, 32, 0, 0, 1024, driver.DEFAULT_SHARED_MEMORY_LIMIT))
    monkeypatch.setattr(driver, "raw_stream_getter", lambda: (lambda index: 0))
    return launched


def _function_of(entry):
    return entry.compiled.launcher(0).kernel.function


# ------------------------------------------------------------------------------------------------
# Globals, helpers, closures, classes, modules read by kernels
# ------------------------------------------------------------------------------------------------
class _Consts:
    SCALE = 3.0


_cfg_a = types.ModuleType("_rv26_cfg_a")
_cfg_a.SCALE = 3.0
_cfg_b = types.ModuleType("_rv26_cfg_b")
_cfg_b.SCALE = 7.0
_cfg = _cfg_a


def _scale_by_class_attribute(out_ptr, x_ptr, BLOCK: dsl.constexpr):
    offs = dsl.arange(0, BLOCK)
    dsl.store(out_ptr + offs, dsl.load(x_ptr + offs) * _Consts.SCALE)


def _scale_by_module_global(out_ptr, x_ptr, BLOCK: dsl.constexpr):
    offs = dsl.arange(0, BLOCK)
    dsl.store(out_ptr + offs, dsl.load(x_ptr + offs) * _cfg.SCALE)


def test_rebinding_a_class_attribute_the_kernel_reads_recompiles(monkeypatch):
    kernel = dsl.jit(_scale_by_class_attribute)
    x, out = torch.ones(8), torch.zeros(8)
    kernel[(1,)](out, x, BLOCK=8, interpret=True)
    assert torch.equal(out, torch.full((8,), 3.0))
    monkeypatch.setattr(_Consts, "SCALE", 7.0)
    kernel[(1,)](out, x, BLOCK=8, interpret=True)
    assert torch.equal(out, torch.full((8,), 7.0)), "still x * 3.0 after Consts.SCALE = 7.0"


def test_rebinding_a_global_that_names_a_module_recompiles(monkeypatch):
    kernel = dsl.jit(_scale_by_module_global)
    x, out = torch.ones(8), torch.zeros(8)
    kernel[(1,)](out, x, BLOCK=8, interpret=True)
    assert torch.equal(out, torch.full((8,), 3.0))
    monkeypatch.setitem(globals(), "_cfg", _cfg_b)
    kernel[(1,)](out, x, BLOCK=8, interpret=True)
    assert torch.equal(out, torch.full((8,), 7.0)), "still _cfg_a.SCALE after _cfg = _cfg_b"


_EDITED_SOURCE = """
    import fusedops.dsl as dsl


    @dsl.jit
    def ones(out_ptr, BLOCK: dsl.constexpr):
        offs = dsl.arange(0, BLOCK)
        dsl.store(out_ptr + offs, dsl.zeros((BLOCK,), dsl.float32) + 1.0)


    @dsl.jit
    def twos(out_ptr, BLOCK: dsl.constexpr):
        offs = dsl.arange(0, BLOCK)
        dsl.store(out_ptr + offs, dsl.zeros((BLOCK,), dsl.float32) + 2.0)
"""


def test_a_kernel_compiles_the_function_that_was_decorated_after_its_file_is_edited(tmp_path, monkeypatch):
    import textwrap

    module = import_module_from_text(tmp_path, monkeypatch, "_rv26_edited", _EDITED_SOURCE)
    path = tmp_path / "_rv26_edited.py"
    text = textwrap.dedent(_EDITED_SOURCE)
    edited = text.replace("    offs = dsl.arange(0, BLOCK)\n", "    offs = dsl.arange(0, BLOCK)\n    offs = offs + 0\n", 1)
    path.write_text(edited)                 # `ones` gains a line; `twos` is not touched
    out = torch.zeros(4)
    try:
        module.twos[(1,)](out, BLOCK=4, interpret=True)
    except dsl.CompilationError:
        return                              # refusing a source that changed is a fine answer too
    assert torch.equal(out, torch.full((4,), 2.0)), f"`twos` ran another function's body: {out.tolist()}"


def _helper_module(tmp_path, monkeypatch, name):
    return import_module_from_text(tmp_path, monkeypatch, name, """
        import fusedops.dsl as dsl

        FACTOR = 3.0

        @dsl.jit
        def helper(v):
            return v * FACTOR

        @dsl.jit
        def other_helper(v):
            return v * 5.0

        @dsl.jit
        def kern(out_ptr, x_ptr, BLOCK: dsl.constexpr):
            offsets = dsl.arange(0, BLOCK)
            dsl.store(out_ptr + offsets, helper(dsl.load(x_ptr + offsets)))
    """)


def test_a_helpers_global_rebound_misses_the_cached_plan(tracked, tmp_path, monkeypatch):
    module = _helper_module(tmp_path, monkeypatch, "_rv26_helper_plan")
    x, out = _cuda(torch.ones(16)), _cuda(torch.zeros(16))
    module.kern[(1,)](out, x, BLOCK=16)
    module.kern[(1,)](out, x, BLOCK=16)     # the plan
    first = tracked[-1]
    assert tracked == [first, first] and "0f40400000" in first.ptx.lower()      # x * 3.0
    monkeypatch.setattr(module, "FACTOR", 7.0)       # a global of the helper, read by the cached plan's check
    module.kern[(1,)](out, x, BLOCK=16)
    assert tracked[-1] is not first and "0f40e00000" in tracked[-1].ptx.lower()     # x * 7.0
    module.kern[(1,)](out, x, BLOCK=16)
    assert tracked[-1] is tracked[-2]


def test_a_helper_rebound_through_a_module_attribute_and_a_closure_recompile(tmp_path, monkeypatch):
    module = _helper_module(tmp_path, monkeypatch, "_rv26_helper_attr")
    holder = import_module_from_text(tmp_path, monkeypatch, "_rv26_holder", """
        import fusedops.dsl as dsl
        import _rv26_helper_attr as ops

        @dsl.jit
        def kern(out_ptr, x_ptr, BLOCK: dsl.constexpr):
            offsets = dsl.arange(0, BLOCK)
            dsl.store(out_ptr + offsets, ops.helper(dsl.load(x_ptr + offsets)))

        def make():
            scale = 2.0

            @dsl.jit
            def closure_kernel(out_ptr, x_ptr, BLOCK: dsl.constexpr):
                offsets = dsl.arange(0, BLOCK)
                dsl.store(out_ptr + offsets, dsl.load(x_ptr + offsets) * scale)

            def set_scale(value):
                nonlocal scale
                scale = value
            return closure_kernel, set_scale
    """)
    x, out = torch.ones(8), torch.zeros(8)
    holder.kern[(1,)](out, x, BLOCK=8, interpret=True)
    assert out[0].item() == 3.0
    monkeypatch.setattr(module, "helper", module.other_helper)
    holder.kern[(1,)](out, x, BLOCK=8, interpret=True)
    assert out[0].item() == 5.0
    closure_kernel, set_scale = holder.make()
    closure_kernel[(1,)](out, x, BLOCK=8, interpret=True)
    assert out[0].item() == 2.0
    set_scale(9.0)
    closure_kernel[(1,)](out, x, BLOCK=8, interpret=True)
    assert out[0].item() == 9.0


# ------------------------------------------------------------------------------------------------
# The cached-launch key against the full path's specialization
# ------------------------------------------------------------------------------------------------
def _mixed_kernel():
    def mixed(p, q, n, flag, C: dsl.constexpr, r=2):
        offs = dsl.arange(0, 16)
        v = dsl.load(p + offs).to(dsl.float32) + q.to(dsl.float32) + n + r + C
        if flag:
            v = v * 2.0
        dsl.store(p + offs, v, mask=offs < 0)
    return dsl.jit(mixed)


def test_every_cached_launch_runs_the_kernel_the_full_path_specializes(tracked):
    kernel = _mixed_kernel()
    base = torch.zeros(64)
    tensors = [_cuda(base), _cuda(base[1:]), _cuda(base[4:])]
    ints = [0, 1, -16, 24, 7, 2**31, 2**63]
    scalars = [1.0, True, 1]
    constexprs = [1, True, 1.0, -0.0, 0.0]
    rng = random.Random(26)
    pool = [([rng.choice(tensors), rng.choice(ints), rng.choice(scalars), rng.choice([True, False, 0, 1]),
              rng.choice(constexprs)], {"r": rng.choice(ints)} if rng.random() < 0.3 else {}) for _ in range(40)]
    wrong = []
    for args, kwargs in pool * 3:          # every combination three times: the later ones take the plans
        kernel[(1,)](*args, **kwargs)
        key = SpecializationKey(specialize("mixed", kernel.params, kernel._bind(args, kwargs)), 4, 3, "sm_90a")
        if tracked[-1] is not _function_of(kernel._cache[key]):
            wrong.append((args, kwargs))
    assert not wrong
    assert len(kernel._plans) <= len(pool) < len(tracked)


def _store_annotated_int32():
    def store_a(o_ptr, a: dsl.int32):
        dsl.store(o_ptr, a)
    return dsl.jit(store_a)


def test_interpreter_bools_given_to_an_annotated_int_parameter():
    kernel = _store_annotated_int32()
    out = torch.zeros(1, dtype=torch.int32)
    for flag in (True, False, True):
        kernel[(1,)](out, flag, interpret=True)
        assert out.item() == int(flag)


def test_bools_given_to_an_annotated_int_parameter_launch_their_own_kernels(tracked):
    kernel = _store_annotated_int32()
    out = _cuda(torch.zeros(1, dtype=torch.int32))
    kernel[(1,)](out, True)
    kernel[(1,)](out, False)
    key = SpecializationKey(specialize("store_a", kernel.params, [out, False]), 4, 3, "sm_90a")
    assert key in kernel._cache, "no kernel was compiled for a = False (a runtime 0)"
    assert tracked[-1] is _function_of(kernel._cache[key]), "a = False launched the kernel storing the constant 1"


# ------------------------------------------------------------------------------------------------
# Prepared launches and None
# ------------------------------------------------------------------------------------------------
def _optional_bias_kernel():
    def biased(x_ptr, b_ptr, y_ptr, BLOCK: dsl.constexpr = 8):
        offs = dsl.arange(0, BLOCK)
        v = dsl.load(x_ptr + offs)
        if b_ptr is not None:
            v = v + dsl.load(b_ptr + offs)
        dsl.store(y_ptr + offs, v)
    return dsl.jit(biased)


def test_interpreter_prepared_launch_given_none_where_a_tensor_was_prepared():
    kernel = _optional_bias_kernel()
    x, b, y = torch.arange(8.0), torch.ones(8), torch.zeros(8)
    prepared = kernel.prepare((1,), x, b, y, interpret=True)
    prepared(x, None, y)
    assert torch.equal(y, x)
    prepared(x, b, y)
    assert torch.equal(y, x + 1)


def test_prepared_launch_given_none_where_a_tensor_was_prepared(tracked):
    kernel = _optional_bias_kernel()
    x, b, y = _cuda(torch.arange(8.0)), _cuda(torch.ones(8)), _cuda(torch.zeros(8))
    prepared = kernel.prepare((1,), x, b, y)
    prepared(x, b, y)
    try:
        prepared(x, None, y)
    except (TypeError, ValueError) as error:       # an error naming the argument is a fine answer too
        assert "b_ptr" in str(error)
        return
    key = SpecializationKey(specialize("biased", kernel.params, [x, None, y, 8]), 4, 3, "sm_90a")
    assert tracked[-1] is _function_of(kernel._cache[key])


# ------------------------------------------------------------------------------------------------
# Autotune: reset_to_zero and the on-disk record
# ------------------------------------------------------------------------------------------------
_TUNED = [dsl.Config({"BLOCK": 8}), dsl.Config({"BLOCK": 16})]


def _grid(meta):
    return (16 // meta["BLOCK"],)


def test_an_in_memory_autotune_hit_leaves_reset_to_zero_tensors_alone(tracked, monkeypatch):
    monkeypatch.setattr(autotune_module, "_device_name", lambda device: "Fake H200")
    tuner = dsl.autotune(_TUNED, key=["n"], reset_to_zero=["out_ptr"])(accumulate_kernel())
    out, x = _cuda(torch.full((16,), 5.0)), _cuda(torch.ones(16))
    tuner.best[tuner.key_of((out, x, 16), {})] = _TUNED[1]      # tuned earlier in this process
    tuner[_grid](out, x, 16)
    assert torch.equal(out, torch.full((16,), 5.0)) and len(tracked) == 1


def test_a_recorded_autotune_config_leaves_reset_to_zero_tensors_alone(tracked, monkeypatch):
    monkeypatch.setattr(autotune_module, "_device_name", lambda device: "Fake H200")
    tuner = dsl.autotune(_TUNED, key=["n"], reset_to_zero=["out_ptr"])(accumulate_kernel())
    out, x = _cuda(torch.full((16,), 5.0)), _cuda(torch.ones(16))
    path = tuner._record_path()
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({tuner.key_of((out, x, 16), {}): 1}))     # tuned by an earlier process
    tuner[_grid](out, x, 16)
    assert tuner.best[tuner.key_of((out, x, 16), {})] is _TUNED[1] and len(tracked) == 1    # no search
    assert torch.equal(out, torch.full((16,), 5.0)), "the caller's tensor was zeroed though nothing was tuned"


# ------------------------------------------------------------------------------------------------
# The on-disk cache
# ------------------------------------------------------------------------------------------------
def _double(out_ptr, x_ptr, BLOCK: dsl.constexpr):
    offs = dsl.arange(0, BLOCK)
    dsl.store(out_ptr + offs, dsl.load(x_ptr + offs) * 2.0)


@pytest.mark.parametrize("damage", ["directory", "dangling symlink"])
def test_a_cache_entry_that_is_not_a_file_only_costs_the_cache(tmp_path, monkeypatch, damage):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path / "c"))
    x = torch.empty(64)
    good = dsl.jit(_double).compile(x, x, BLOCK=64).asm["ptx"]
    (path,) = [p for p in (tmp_path / "c").rglob("*.json") if not p.name.startswith(".")]
    path.unlink()
    if damage == "directory":
        path.mkdir()
    else:
        os.symlink(tmp_path / "missing" / "target.json", path)
    assert dsl.jit(_double).compile(x, x, BLOCK=64).asm["ptx"] == good


# ------------------------------------------------------------------------------------------------
# Threads
# ------------------------------------------------------------------------------------------------
def _scale_kernel_fn(out_ptr, x_ptr, n, SCALE: dsl.constexpr, BLOCK: dsl.constexpr):
    offs = dsl.program_id(0) * BLOCK + dsl.arange(0, BLOCK)
    m = offs < n
    dsl.store(out_ptr + offs, dsl.load(x_ptr + offs, mask=m) * SCALE, mask=m)


def _in_threads(work, count):
    errors, barrier = [], threading.Barrier(count)

    def run(index):
        try:
            barrier.wait()
            work(index)
        except Exception as error:      # noqa: BLE001 (reported by the test)
            errors.append(repr(error))
    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return errors


def test_threads_launching_and_compiling_several_specializations_at_once(monkeypatch):
    monkeypatch.setenv("FUSEDOPS_DISABLE_CACHE", "1")
    kernel = dsl.jit(_scale_kernel_fn)
    ok = {}

    def interpret(index):
        block = (8, 16, 32, 64)[index % 4]
        x, out = torch.arange(37.0), torch.zeros(37)
        kernel[(-(-37 // block),)](out, x, 37, SCALE=float(index), BLOCK=block, interpret=True)
        ok[index] = torch.equal(out, torch.arange(37.0) * index)

    assert _in_threads(interpret, 8) == [] and all(ok.values()) and len(ok) == 8
    f32 = dsl.pointer_type(dsl.float32)
    signatures = [dict(SCALE=float(i), BLOCK=128 << (i % 3)) for i in range(6)]
    serial = [dsl.jit(_scale_kernel_fn).compile(f32, f32, 100, **s).asm["ptx"] for s in signatures]
    kernels = [dsl.jit(_scale_kernel_fn) for _ in signatures]
    together = [None] * len(signatures)

    def compile_one(index):
        together[index] = kernels[index].compile(f32, f32, 100, **signatures[index]).asm["ptx"]

    assert _in_threads(compile_one, len(signatures)) == []
    assert together == serial


# ------------------------------------------------------------------------------------------------
# Grids
# ------------------------------------------------------------------------------------------------
def test_a_z_dimension_past_65535_is_a_launch_error_on_both_paths(gpu):
    kernel = dsl.jit(_double)
    x, out = torch.ones(8), torch.zeros(8)
    with pytest.raises(LaunchError, match="grid entry 2"):
        kernel[(1, 1, 65536)](out, x, BLOCK=8, interpret=True)
    xc, outc = _cuda(x), _cuda(out)
    kernel[(1,)](outc, xc, BLOCK=8)
    kernel[(1,)](outc, xc, BLOCK=8)     # a plan: the next launch goes through the generated entry
    with pytest.raises(LaunchError, match="grid entry 2"):
        kernel[(1, 1, 65536)](outc, xc, BLOCK=8)
    kernel[(2, 65535, 65535)](outc, xc, BLOCK=8)        # the largest y and z are accepted
    assert [grid for grid, _ in gpu] == [(1, 1, 1), (1, 1, 1), (2, 65535, 65535)]
