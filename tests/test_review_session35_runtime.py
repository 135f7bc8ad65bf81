"""Review (session 35): the DSL runtime (fusedops/dsl/runtime) broken the way Triton users broke Triton's runtime and
autotuner, CPU only: values come from the NumPy interpreter (checked against torch), PTX is compiled for sm_90a with
llvmlite, and GPU launches go through a mocked driver (as tests/test_launch_fast_path.py does) whose cuLaunchKernel
counts launches and, where a test needs it, applies the kernel's effect to the (CPU) tensors, so the autotuner's
search runs end to end: `_tune` -> `_measure` -> `JITFunction.run` -> plan -> launch.

What was tried (the report each case mirrors in brackets):
- a jit helper passed as a constexpr argument, a helper of a helper, a dsl dtype and a `range` bound read from
  globals, each rebound after the first compile [triton#7322, #590]: the next launch sees the new value;
- a constexpr given at its default vs given explicitly: one specialization, one plan [triton#742];
- kernels whose parameters are all constexprs, or that take none, on the (mocked) GPU [triton#1445];
- int32 / int64 / uint64 scalar arithmetic at the type's edges in the interpreter against the C semantics the
  PTX uses (div.s32 truncates, mul.lo wraps) [integer-overflow reports: int32 index arithmetic wraps on the GPU];
- `kernel.compile` of a parameter annotated `n: dsl.int64` given a value or a dsl type [triton#3102: an
  integer annotation fixes the parameter's type];
- tensors torch makes that no kernel can read (jagged nested, quantized, masked, mkldnn) named at the launch;
  a kernel built with exec and a recursive helper refused with a clear error; unsupported compile targets named;
- two CPU tensors over one memory buffer as NumPy and DLPack hand them to torch (two storages that overlap)
  [triton#3068 / #8926: the interpreter mishandling views of one buffer];
- pickling / deep-copying a kernel, as multiprocessing (spawn) and torch.compile's caches do
  [triton-lang/triton#5900, pytorch/pytorch#146945];
- autotune end to end on the mocked GPU: reset_to_zero / restore_value given by keyword, the grid callable
  seeing each config's constexprs and num_warps, the launch after tuning, a cached key [triton#2549, #7181,
  #6547]; the on-disk record shared between kernels that share a name and source but not their code
  (a kernel factory's closures, a helper edited between runs) [triton#7322 / #590 applied to the autotune
  cache: Triton keys its autotune cache on the kernel's cache key, which covers its dependencies].

DEFECTS found (fixed the same session; their tests below now pass):

1. The interpreter raises a false out-of-bounds error for two tensors whose storages overlap: with
   `buf = np.arange(64, dtype=np.float32)`, `whole = torch.from_numpy(buf)` and `part = torch.from_numpy(buf[:8])`
   (or `buf[8:16]`, or the same through DLPack), a kernel reading all of `whole` and all of `part` raises
   "out-of-bounds load ... byte offset 64 from pointer argument 'b_ptr' (its tensor storage spans byte offsets
   [0, 256) from that pointer)" -- the message contradicts itself -- depending on the argument order.
   Expected: the loads read inside each tensor's storage, as torch computes. Cause: interpreter/arguments.py
   keys regions by (device, storage data_ptr) (a second storage at the same address reuses the first, smaller,
   region) and interpreter/memory.py `Memory.locate` maps an address to the region with the greatest base at
   or below it, a nested smaller region, without looking at the enclosing one.
2. A kernel cannot be pickled or deep-copied: `pickle.dumps(vector_add_kernel)` raises "PicklingError: Can't
   pickle <function vector_add_kernel>: it's not the same object as kernels_for_tests.vector_add_kernel", and
   `copy.deepcopy` "TypeError: cannot pickle 'module' object". Triton made its JITFunction picklable
   (triton-lang/triton#5900) because PyTorch serializes user kernels (pytorch/pytorch#146945); a spawned
   multiprocessing worker given a kernel hits the same error. Expected: a round trip gives a kernel that
   launches the same code (by reference, as a module-level function pickles). Cause: runtime/jit.py
   JITFunction has no __reduce__ / __getstate__: pickle stores `fn` by name (which now names the
   JITFunction) and the state holds modules, an RLock and generated functions.
3. dsl.autotune's on-disk record is keyed by the kernel's module, qualname and own source text (and the
   configs), not by the code it compiles: kernels made by one factory (`def make(max_block): def k(...):
   dsl.static_assert(BLOCK <= max_block) ...; return dsl.jit(k)`), or one kernel whose helper (or a global
   it reads) changed since the record was written, share one record, so a kernel launches the config tuned
   for another -- here BLOCK=64, which its static_assert refuses: "CompilationError: static_assert failed" at
   every launch until the cache directory is deleted, where the docstring promises that a config that fails
   to compile is skipped. Expected: such a kernel tunes for itself (BLOCK=16 here). Cause:
   runtime/autotune.py `_record_path` hashes `fn.source.lines` and the configs only (Triton's autotune cache
   key includes the kernel's cache key: dependencies and globals; triton python/triton/runtime/autotuner.py
   `check_disk_cache`), and `select` trusts a recorded index without checking that its config still compiles.
4. `kernel.compile` ignores a parameter's dsl dtype annotation when it is given a dsl type: for
   `def k(o_ptr, n: dsl.int64)`, `k.compile(o, dsl.pointer_type(dsl.float32))` compiles `n` as a float pointer
   (`n + 2**31 - 1` becomes `add.s64 %rd, %rd, 8589934588`, pointer arithmetic), `k.compile(o, dsl.float32)` as
   an `.f32` and `k.compile(o, dsl.int32)` as a `.u32` parameter, kernels no launch gets: `k[grid](o, t)` with a
   tensor or a float raises "TypeError: argument `n` of kernel `k` is annotated int64", and an int always
   launches the int64 kernel, so an ahead-of-time compiled artifact does not match the launches. Expected: a
   TypeError naming `n` for a type the annotation does not hold (as `run` raises), or the annotated type.
   Cause: runtime/signature.py `specialize` with allow_types takes a DType / PointerType before it looks at
   `param.annotation` (the `_annotated_scalar` branch excludes them).
"""

from __future__ import annotations

import copy
import pickle
import re
import sys
import types

import numpy as np
import pytest
import torch

import fusedops.dsl as dsl
from fusedops.dsl.errors import CompilationError, UnsupportedError
from fusedops.dsl.runtime import autotune as autotune_module
from helpers import import_module_from_text
from mock_gpu import accumulate_kernel, mock_cuda_driver, private_cache
from test_launch_fast_path import _cuda


@pytest.fixture(autouse=True)
def _private_cache(monkeypatch, tmp_path):
    private_cache(monkeypatch, tmp_path)


@pytest.fixture
def mock_gpu(monkeypatch):
    """A mocked CUDA driver (mock_gpu.mock_cuda_driver): every cuLaunchKernel is recorded (grid, id of the loaded
    function) and then calls the functions in `effects` (what the kernel would do to the tests' CPU tensors).
    Returns a namespace (launches, effects)."""
    state = types.SimpleNamespace(launches=[], effects=None)
    state.effects = mock_cuda_driver(monkeypatch, lambda grid, function: state.launches.append((grid, id(function))))
    return state


@pytest.fixture
def timings(monkeypatch):
    """Autotune timing without CUDA events: `time_launches` runs the reset and one launch and returns the time
    the test set for the config being measured (by its BLOCK and num_warps, see `_time_of`)."""
    table = {}
    measuring = []
    original = autotune_module.Autotuner._measure

    def measure(self, grid, args, kwargs, config, reset, first):
        measuring.append(config)
        return original(self, grid, args, kwargs, config, reset, first)

    def time_launches(launch, before=lambda: None, *, warmup=0, reps=1):
        before()
        launch()
        config = measuring[-1]
        return table.get((config.constexprs.get("BLOCK"), config.num_warps), 5.0)

    monkeypatch.setattr(autotune_module.Autotuner, "_measure", measure)
    monkeypatch.setattr(autotune_module, "time_launches", time_launches)
    return table


def _grid(meta):
    return ((meta["n"] + meta["BLOCK"] - 1) // meta["BLOCK"],)


# ------------------------------------------------------------------------------------------------
# Globals, helpers and constexprs: what recompiles (interpreter)
# ------------------------------------------------------------------------------------------------
_SCALE = 2.0
_STORE_DTYPE = dsl.float16
_TRIPS = dsl.constexpr(3)


@dsl.jit
def _times_scale(x):
    return x * _SCALE


@dsl.jit
def _times_scale_plus_one(x):
    return _times_scale(x) + 1.0


def _apply_kernel():
    def apply(o_ptr, x_ptr, ACT: dsl.constexpr, BLOCK: dsl.constexpr):
        offs = dsl.arange(0, BLOCK)
        dsl.store(o_ptr + offs, ACT(dsl.load(x_ptr + offs)))
    return dsl.jit(apply)


def _nested_kernel():
    def nested(o_ptr, x_ptr, BLOCK: dsl.constexpr):
        offs = dsl.arange(0, BLOCK)
        dsl.store(o_ptr + offs, _times_scale_plus_one(dsl.load(x_ptr + offs)))
    return dsl.jit(nested)


def _round_trip_kernel():
    def round_trip(o_ptr, x_ptr, BLOCK: dsl.constexpr):
        offs = dsl.arange(0, BLOCK)
        dsl.store(o_ptr + offs, dsl.load(x_ptr + offs).to(_STORE_DTYPE).to(dsl.float32))
    return dsl.jit(round_trip)


def _count_kernel():
    def count(o_ptr, BLOCK: dsl.constexpr):
        acc = 0.0
        for _ in range(_TRIPS):
            acc += 1.0
        dsl.store(o_ptr + dsl.arange(0, BLOCK), dsl.zeros((BLOCK,), dsl.float32) + acc)
    return dsl.jit(count)


def _launch(kernel, *args, **constexprs):
    out = torch.zeros(8)
    kernel[(1,)](out, *args, BLOCK=8, interpret=True, **constexprs)
    return out


def test_a_helper_given_as_a_constexpr_argument_recompiles_when_its_global_is_rebound(monkeypatch):
    x = torch.linspace(-1, 1, 8)
    kernel = _apply_kernel()
    assert torch.equal(_launch(kernel, x, ACT=_times_scale), x * 2.0)
    monkeypatch.setitem(globals(), "_SCALE", 3.0)
    assert torch.equal(_launch(kernel, x, ACT=_times_scale), x * 3.0)


def test_a_global_read_two_helpers_deep_recompiles_when_rebound(monkeypatch):
    x = torch.linspace(-1, 1, 8)
    kernel = _nested_kernel()
    assert torch.equal(_launch(kernel, x), x * 2.0 + 1.0)
    monkeypatch.setitem(globals(), "_SCALE", 5.0)
    assert torch.equal(_launch(kernel, x), x * 5.0 + 1.0)


def test_a_dtype_global_and_a_constexpr_loop_bound_recompile_when_rebound(monkeypatch):
    x = torch.full((8,), 1.0 + 2.0 ** -12)            # not a float16
    kernel = _round_trip_kernel()
    assert torch.equal(_launch(kernel, x), x.half().float())
    monkeypatch.setitem(globals(), "_STORE_DTYPE", dsl.float32)
    assert torch.equal(_launch(kernel, x), x)
    counting = _count_kernel()
    assert torch.equal(_launch(counting), torch.full((8,), 3.0))
    monkeypatch.setitem(globals(), "_TRIPS", dsl.constexpr(5))
    assert torch.equal(_launch(counting), torch.full((8,), 5.0))


def _defaulted_kernel():
    def defaulted(o_ptr, x_ptr, n, BLOCK: dsl.constexpr = 16, SCALE: dsl.constexpr = 2.0):
        offs = dsl.arange(0, BLOCK)
        m = offs < n
        dsl.store(o_ptr + offs, dsl.load(x_ptr + offs, mask=m) * SCALE, mask=m)
    return dsl.jit(defaulted)


def test_a_constexpr_at_its_default_or_given_explicitly_is_one_specialization(mock_gpu):
    x, out = torch.arange(16.0), torch.zeros(16)
    kernel = _defaulted_kernel()
    kernel[(1,)](out, x, 16, interpret=True)
    kernel[(1,)](out, x, 16, BLOCK=16, SCALE=2.0, interpret=True)
    kernel[(1,)](out, x, 16, 16, 2.0, interpret=True)
    assert torch.equal(out, x * 2.0) and len(kernel._cache) == 1
    gpu_out, gpu_x = _cuda(torch.zeros(16)), _cuda(torch.arange(16.0))
    kernel[(1,)](gpu_out, gpu_x, 16)
    kernel[(1,)](gpu_out, gpu_x, 16, BLOCK=16, SCALE=2.0)
    kernel[(1,)](gpu_out, gpu_x, n=16, SCALE=2.0)
    assert len(mock_gpu.launches) == 3 and len({token for _, token in mock_gpu.launches}) == 1
    assert len([e for e in kernel._cache.values() if e.compiled is not None]) == 1
    kernel[(1,)](gpu_out, gpu_x, 16, SCALE=2)               # an int constexpr is another constant
    assert len([e for e in kernel._cache.values() if e.compiled is not None]) == 2


def test_kernels_with_only_constexpr_parameters_or_none_launch(mock_gpu):
    def only_constexprs(A: dsl.constexpr, B: dsl.constexpr):
        dsl.static_assert(A + B > 0)

    def no_parameters():
        pass

    for fn, args in [(only_constexprs, (3, 4)), (no_parameters, ())]:
        kernel = dsl.jit(fn)
        for _ in range(3):          # the full path, then the generated entry
            kernel[(2,)](*args)
        kernel[(2,)](*args, interpret=True)
    assert [grid for grid, _ in mock_gpu.launches] == [(2, 1, 1)] * 6
    with pytest.raises(CompilationError, match="static_assert"):
        dsl.jit(only_constexprs)[(1,)](-3, 1, interpret=True)


# ------------------------------------------------------------------------------------------------
# Scalars at their type's edges: the interpreter against the C semantics of the PTX
# ------------------------------------------------------------------------------------------------
def _arithmetic_kernel():
    def arithmetic(o_ptr, a, b):
        dsl.store(o_ptr + 0, a * b)
        dsl.store(o_ptr + 1, a + b)
        dsl.store(o_ptr + 2, a // b)
        dsl.store(o_ptr + 3, a % b)
        dsl.store(o_ptr + 4, a - b)
        dsl.store(o_ptr + 5, a >> 1)
    return dsl.jit(arithmetic)


def _wrap(value: int, bits: int, signed: bool) -> int:
    value %= 1 << bits
    return value - (1 << bits) if signed and value >= 1 << (bits - 1) else value


def _c_div(a: int, b: int) -> tuple:
    quotient = abs(a) // abs(b) * (1 if (a >= 0) == (b >= 0) else -1)
    return quotient, a - quotient * b


@pytest.mark.parametrize("a,b,bits,signed", [
    (65536, 65536, 32, True), (2**31 - 1, 2, 32, True), (-7, 2, 32, True), (7, -2, 32, True),
    (-2**31, -1, 32, True), (2**31, 3, 64, True), (2**64 - 1, 3, 64, False), (2**63 + 5, 10, 64, False)])
def test_interpreter_scalar_arithmetic_wraps_and_truncates_as_the_ptx_does(a, b, bits, signed):
    kernel = _arithmetic_kernel()
    dtype = {(32, True): torch.int32, (64, True): torch.int64, (64, False): torch.uint64}[bits, signed]
    out = torch.zeros(6, dtype=dtype)
    kernel[(1,)](out, a, b, interpret=True)
    quotient, remainder = _c_div(a, b)
    expected = [a * b, a + b, quotient, remainder, a - b, a >> 1]
    assert out.tolist() == [_wrap(v, bits, signed) for v in expected]
    ptx = kernel.compile(torch.empty(6, dtype=dtype), a, b).asm["ptx"]
    division = {(32, True): "div.s32", (64, True): "div.s64", (64, False): "div.u64"}[bits, signed]
    assert division in ptx      # C's truncating division, which the interpreter reproduces


# ------------------------------------------------------------------------------------------------
# Arguments a kernel cannot take, named
# ------------------------------------------------------------------------------------------------
def _copy_kernel():
    def copy(o_ptr, x_ptr, n, BLOCK: dsl.constexpr):
        offs = dsl.arange(0, BLOCK)
        m = offs < n
        dsl.store(o_ptr + offs, dsl.load(x_ptr + offs, mask=m), mask=m)
    return dsl.jit(copy)


_UNREADABLE = {
    "jagged nested": (lambda: torch.nested.nested_tensor([torch.ones(3), torch.ones(5)], layout=torch.jagged),
                      "dense \\(strided\\)"),
    "quantized": (lambda: torch.quantize_per_tensor(torch.ones(8), 0.1, 0, torch.quint8), "quint8"),
    "mkldnn": (lambda: torch.ones(8).to_mkldnn(), "dense \\(strided\\)"),
    "masked": (lambda: torch.masked.masked_tensor(torch.ones(8), torch.ones(8, dtype=torch.bool)), "without memory"),
}


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("kind", sorted(_UNREADABLE))
@pytest.mark.parametrize("interpret", [True, False])
def test_tensors_no_kernel_can_read_are_named_at_the_launch(kind, interpret, mock_gpu):
    make, pattern = _UNREADABLE[kind]
    out = torch.zeros(16) if interpret else _cuda(torch.zeros(16))
    with pytest.raises(TypeError, match=f"argument `x_ptr` of kernel `copy`.*{pattern}"):
        _copy_kernel()[(1,)](out, make(), 8, BLOCK=16, interpret=interpret)
    assert not mock_gpu.launches


def test_kernels_built_with_exec_or_recursing_are_refused_clearly():
    namespace = {"dsl": dsl}
    exec("def made(o_ptr, BLOCK: dsl.constexpr):\n    dsl.store(o_ptr + dsl.arange(0, BLOCK), "
         "dsl.zeros((BLOCK,), dsl.float32))\n", namespace)
    with pytest.raises(CompilationError, match="cannot read the source of `made`"):
        dsl.jit(namespace["made"])[(1,)](torch.zeros(4), BLOCK=4, interpret=True)

    @dsl.jit
    def countdown(x, D: dsl.constexpr):
        if D == 0:
            return x
        else:
            return countdown(x + 1.0, D - 1)

    @dsl.jit
    def uses_countdown(o_ptr, BLOCK: dsl.constexpr):
        dsl.store(o_ptr + dsl.arange(0, BLOCK), countdown(dsl.zeros((BLOCK,), dsl.float32), 3))

    with pytest.raises(UnsupportedError, match="recursive call to `countdown`"):
        uses_countdown[(1,)](torch.zeros(4), BLOCK=4, interpret=True)


@pytest.mark.parametrize("target", ["sm_75", "sm_89", "sm_100", "sm_120a"])
def test_compile_for_an_unsupported_target_names_it(target):
    x = torch.empty(16)
    with pytest.raises(ValueError, match=f"'{target}'.*sm_80, sm_90, sm_90a"):
        _copy_kernel().compile(x, x, 16, BLOCK=16, target=target)
    assert ".target sm_80" in _copy_kernel().compile(x, x, 16, BLOCK=16, target="sm_80").asm["ptx"]


def _annotated_kernel():
    def annotated(o_ptr, n: dsl.int64):
        dsl.store(o_ptr, n + 2**31 - 1)
    return dsl.jit(annotated)


def test_compile_of_an_annotated_parameter_from_a_value_keeps_its_type():
    out = torch.zeros(1, dtype=torch.int64)
    kernel = _annotated_kernel()
    kernel[(1,)](out, 5, interpret=True)
    assert out.item() == 5 + 2**31 - 1
    for given in (5, 1, dsl.int64):
        assert re.search(r"\.param \.[us]64 annotated_param_1", kernel.compile(out, given).asm["ptx"]) or given == 1
    with pytest.raises(TypeError, match="argument `n` of kernel `annotated` is annotated int64"):
        kernel[(1,)](out, torch.zeros(1), interpret=True)


@pytest.mark.parametrize("given", [dsl.pointer_type(dsl.float32), dsl.float32, dsl.int32])
def test_compile_of_an_annotated_parameter_from_a_type_keeps_the_annotation_or_refuses(given):
    out = torch.zeros(1, dtype=torch.int64)
    try:
        ptx = _annotated_kernel().compile(out, given).asm["ptx"]
    except TypeError as error:
        assert "argument `n`" in str(error)
        return
    assert re.search(r"\.param \.[us]64 annotated_param_1", ptx), "compiled for a type the annotation does not allow"


# ------------------------------------------------------------------------------------------------
# DEFECT 1: tensors over one memory buffer (two storages that overlap) in the interpreter
# ------------------------------------------------------------------------------------------------
def _two_inputs_kernel():
    def two_inputs(o_ptr, a_ptr, b_ptr, na, nb, start, BLOCK: dsl.constexpr):
        offs = dsl.arange(0, BLOCK)
        a = dsl.load(a_ptr + offs, mask=offs < na, other=0.0)
        b = dsl.load(b_ptr + start + offs, mask=offs < nb, other=0.0)
        dsl.store(o_ptr + offs, a + b, mask=offs < nb)
    return dsl.jit(two_inputs)


def test_interpreter_tensors_over_one_buffer_in_the_order_that_works():
    buf = np.arange(64, dtype=np.float32)
    whole, part = torch.from_numpy(buf), torch.from_numpy(buf[:8])
    out = torch.zeros(8)
    _two_inputs_kernel()[(1,)](out, whole, part, 64, 8, 0, BLOCK=64, interpret=True)
    assert torch.equal(out, whole[:8] + part)


@pytest.mark.parametrize("window", ["same start", "nested", "dlpack"])
def test_interpreter_reads_tensors_whose_storages_overlap(window):
    buf = np.arange(64, dtype=np.float32)
    whole = torch.from_numpy(buf)
    if window == "same start":
        part = torch.from_numpy(buf[:8])
    elif window == "nested":
        part = torch.from_numpy(buf[8:16])
    else:
        part = torch.from_dlpack(whole[8:16])
    assert part.untyped_storage().data_ptr() != whole.untyped_storage().data_ptr() or \
        part.untyped_storage().nbytes() != whole.untyped_storage().nbytes()      # two storages, one memory
    out = torch.zeros(54)
    _two_inputs_kernel()[(1,)](out, part, whole, 8, 54, 10, BLOCK=64, interpret=True)
    expected = whole[10:].clone()
    expected[:8] += part
    assert torch.equal(out, expected)


# ------------------------------------------------------------------------------------------------
# DEFECT 2: pickling and copying a kernel
# ------------------------------------------------------------------------------------------------
def test_a_kernel_copies_shallowly_and_keeps_its_identity_in_containers():
    import kernels_for_tests

    kernel = kernels_for_tests.vector_add_kernel
    shallow = copy.copy(kernel)
    x, y, out = torch.arange(8.0), torch.ones(8), torch.zeros(8)
    shallow[(1,)](x, y, out, 8, BLOCK=8, interpret=True)
    assert torch.equal(out, x + y)
    assert {kernel: 1}[kernel] == 1 and repr(kernel) == "<dsl.jit kernels_for_tests.vector_add_kernel>"


@pytest.mark.parametrize("how", ["pickle", "deepcopy"])
def test_a_module_level_kernel_pickles_and_deep_copies(how):
    import kernels_for_tests

    kernel = kernels_for_tests.vector_add_kernel
    again = pickle.loads(pickle.dumps(kernel)) if how == "pickle" else copy.deepcopy(kernel)
    x, y, out = torch.arange(8.0), torch.ones(8), torch.zeros(8)
    again[(1,)](x, y, out, 8, BLOCK=8, interpret=True)
    assert torch.equal(out, x + y)


# ------------------------------------------------------------------------------------------------
# The autotuner end to end on the mocked GPU
# ------------------------------------------------------------------------------------------------
def _double_in_place_kernel():
    def double_in_place(x_ptr, n, BLOCK: dsl.constexpr):
        offs = dsl.program_id(0) * BLOCK + dsl.arange(0, BLOCK)
        m = offs < n
        dsl.store(x_ptr + offs, dsl.load(x_ptr + offs, mask=m) * 2.0, mask=m)
    return dsl.jit(double_in_place)


_CONFIGS = [dsl.Config({"BLOCK": 16}, num_warps=4), dsl.Config({"BLOCK": 64}, num_warps=8),
            dsl.Config({"BLOCK": 32}, num_warps=2)]


def test_autotune_reset_to_zero_given_by_keyword_leaves_one_launchs_sum(mock_gpu, timings):
    timings.update({(16, 4): 3.0, (64, 8): 1.0, (32, 2): 2.0})
    out, x = _cuda(torch.full((64,), 7.0)), _cuda(torch.arange(64.0))
    mock_gpu.effects.append(lambda: out.add_(x))
    tuner = dsl.autotune(_CONFIGS, key=["n"], reset_to_zero=["out_ptr"])(accumulate_kernel())
    tuner[_grid](x_ptr=x, n=64, out_ptr=out)
    key = tuner.key_of((), {"x_ptr": x, "n": 64, "out_ptr": out})
    assert tuner.best == {key: _CONFIGS[1]}
    assert [m.ms for m in tuner.measurements[key]] == [3.0, 1.0, 2.0]
    assert torch.equal(out, x), "the tuning launches' sums were left in out"
    # each config's grid from its own BLOCK; the real launch last, with the best config's
    tuned = len(_CONFIGS) * autotune_module.TUNING_ROUNDS
    # (each measurement: a checking launch, then the timed one)
    assert [grid for grid, _ in mock_gpu.launches[:6]] == [(4, 1, 1)] * 2 + [(1, 1, 1)] * 2 + [(2, 1, 1)] * 2
    assert len(mock_gpu.launches) == 2 * tuned + 1 and mock_gpu.launches[-1][0] == (1, 1, 1)
    # a cached key: no reset, one more launch adds once more
    tuner[_grid](out, x, 64)
    assert torch.equal(out, 2 * x) and len(mock_gpu.launches) == 2 * tuned + 2


def test_autotune_restore_value_given_by_keyword_runs_the_in_place_kernel_once(mock_gpu, timings):
    timings.update({(16, 4): 1.0, (64, 8): 2.0, (32, 2): 3.0})
    x = _cuda(torch.arange(64.0))
    mock_gpu.effects.append(lambda: x.mul_(2.0))
    seen_meta = []

    def grid(meta):
        seen_meta.append((meta["BLOCK"], meta["num_warps"], meta["num_stages"]))
        return _grid(meta)

    tuner = dsl.autotune(_CONFIGS, key=["n"], restore_value=["x_ptr"])(_double_in_place_kernel())
    tuner[grid](n=64, x_ptr=x)
    assert torch.equal(x, 2 * torch.arange(64.0)), "the tuning launches' doublings were kept"
    assert set(seen_meta) == {(16, 4, 3), (64, 8, 3), (32, 2, 3)} and seen_meta[-1] == (16, 4, 3)


def test_autotune_keys_apart_optional_tensors_and_their_dtypes(mock_gpu, timings):
    def scale(o_ptr, x_ptr, b_ptr, n, BLOCK: dsl.constexpr):
        offs = dsl.program_id(0) * BLOCK + dsl.arange(0, BLOCK)
        m = offs < n
        v = dsl.load(x_ptr + offs, mask=m)
        if b_ptr is not None:
            v = v + dsl.load(b_ptr + offs, mask=m)
        dsl.store(o_ptr + offs, v, mask=m)

    tuner = dsl.autotune(_CONFIGS, key=["n"])(dsl.jit(scale))
    out, x = _cuda(torch.zeros(64)), _cuda(torch.ones(64))
    keys = {tuner.key_of((out, x, None, 64), {}), tuner.key_of((out, x, x, 64), {}),
            tuner.key_of((out, x, _cuda(torch.ones(64, dtype=torch.float16)), 64), {})}
    assert len(keys) == 3
    tuner[_grid](out, x, None, 64)
    tuner[_grid](out, x, x, 64)
    assert len(tuner.best) == 2


# ------------------------------------------------------------------------------------------------
# DEFECT 3: the autotune record of one kernel used by another
# ------------------------------------------------------------------------------------------------
def _bounded_kernel(max_block):
    def bounded_add(o_ptr, x_ptr, n, BLOCK: dsl.constexpr):
        dsl.static_assert(BLOCK <= max_block)
        offs = dsl.program_id(0) * BLOCK + dsl.arange(0, BLOCK)
        m = offs < n
        dsl.store(o_ptr + offs, dsl.load(x_ptr + offs, mask=m) + 1.0, mask=m)
    return dsl.jit(bounded_add)


_HELPER = """
import fusedops.dsl as dsl


@dsl.jit
def check(BLOCK: dsl.constexpr):
    dsl.static_assert(BLOCK <= {limit})
"""

_TUNED_KERNEL = """
import fusedops.dsl as dsl
import rv35_helper


@dsl.jit
def bounded_add(o_ptr, x_ptr, n, BLOCK: dsl.constexpr):
    rv35_helper.check(BLOCK)
    offs = dsl.program_id(0) * BLOCK + dsl.arange(0, BLOCK)
    m = offs < n
    dsl.store(o_ptr + offs, dsl.load(x_ptr + offs, mask=m) + 1.0, mask=m)
"""


def _kernels(how, tmp_path, monkeypatch):
    """(the kernel tuned first, allowing BLOCK up to 64; the kernel launched next, allowing 16), which share a
    module, a qualname and a source: made by one factory, or one module imported before and after its helper
    was edited (a later process)."""
    if how == "factory":
        return _bounded_kernel(64), (lambda: _bounded_kernel(16))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)

    def load(limit):
        import_module_from_text(tmp_path, monkeypatch, "rv35_helper", _HELPER.format(limit=limit))
        return import_module_from_text(tmp_path, monkeypatch, "rv35_tuned", _TUNED_KERNEL).bounded_add
    return load(64), (lambda: load(16))


@pytest.mark.parametrize("how", ["factory", "helper edited"])
def test_a_kernel_whose_code_differs_does_not_share_the_autotune_record_in_memory(how, mock_gpu, timings,
                                                                                   tmp_path, monkeypatch):
    # the same tuner object keeps its in-memory choice (as Triton's does); a new kernel object tunes afresh
    timings.update({(16, 4): 2.0, (64, 8): 1.0})
    monkeypatch.setenv("FUSEDOPS_DISABLE_CACHE", "1")
    configs = _CONFIGS[:2]
    first, make_second = _kernels(how, tmp_path, monkeypatch)
    out, x = _cuda(torch.zeros(64)), _cuda(torch.ones(64))
    tuner = dsl.autotune(configs, key=["n"])(first)
    tuner[_grid](out, x, 64)
    assert list(tuner.best.values()) == [configs[1]]
    second = dsl.autotune(configs, key=["n"])(make_second())
    second[_grid](out, x, 64)
    assert list(second.best.values()) == [configs[0]]


@pytest.mark.parametrize("how", ["factory", "helper edited"])
def test_a_kernel_whose_code_differs_does_not_use_anothers_autotune_record(how, mock_gpu, timings, tmp_path,
                                                                           monkeypatch):
    timings.update({(16, 4): 2.0, (64, 8): 1.0})
    configs = _CONFIGS[:2]
    first, make_second = _kernels(how, tmp_path, monkeypatch)
    out, x = _cuda(torch.zeros(64)), _cuda(torch.ones(64))
    tuner = dsl.autotune(configs, key=["n"])(first)
    tuner[_grid](out, x, 64)
    assert list(tuner.best.values()) == [configs[1]]            # BLOCK=64, recorded on disk
    second = dsl.autotune(configs, key=["n"])(make_second())     # BLOCK=64 does not compile for it
    second[_grid](out, x, 64)
    assert list(second.best.values()) == [configs[0]]
