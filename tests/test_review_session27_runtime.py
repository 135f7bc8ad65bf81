"""Review (session 27): the DSL runtime (fusedops/dsl/runtime: jit.py, fast_path.py, signature.py, autotune.py,
cache.py, knobs.py, bounded_cache.py), attacked as a demanding Triton / PyTorch user would, CPU only: values come
from the NumPy interpreter, PTX is compiled for sm_90a (and assembled by ptxas where it is on the PATH), and GPU
launches go through the mocked driver of tests/test_launch_fast_path.py (`gpu`, `_cuda`), whose cuLaunchKernel
records the packed kernel parameters.

What was tried (the peer report each case mirrors in brackets):
- tensors of every dtype (bool, uint8, int8, int16..int64, uint16..uint64, fp16, bf16, fp32, fp64; fp8 and complex
  refused naming the argument), 0-d, empty, expanded (stride 0), transposed, meta, freed-storage tensors
  (interpreter only: torch itself segfaults on `t + 1` after `t.untyped_storage().resize_(0)`), and
  tensors without storage: a __torch_dispatch__ wrapper subclass, torch.func.vmap's BatchedTensor and
  torch.func.grad's wrapper [pytorch#105301 vmap with triton.jit, pytorch#91810 GradTrackingTensor data_ptr,
  pytorch#121412 a FakeTensor given to a Triton kernel is an illegal memory access, pytorch#124601];
- scalars: ints equal to 1, multiples of 16, negative, past 2**31 and 2**63, past 64 bits, bools, floats at and
  past float32's / float16's range, numpy scalars, a 0-d tensor where a scalar is meant; annotated int64 / uint32
  parameters equal to 1 keep their type [triton#3102, triton#2236];
- what recompiles: constexpr values, int specializations, do_not_specialize (one kernel for n in 1, 16, 17), and
  do_not_specialize naming a constexpr or given as a string [triton#8273: constexpr params cannot be
  do_not_specialize, the maintainers want an error];
- grids: tuple, list, int, numpy and 0-d tensor sizes, callables of the meta-parameters (also one returning an
  int) [triton#5704], zero-size grids, y / z past 65535 and x past 2**31 - 1 [triton#3299, triton#580,
  fla#172], bad forms;
- launches with a missing / extra argument, an unknown keyword constexpr, Triton-only launch options
  (num_ctas), reserved names, bad num_warps / interpret;
- knobs: bad values name the variable, also at a launch; interpret=True with a bad FUSEDOPS_INTERPRET;
- the disk cache: truncated entries, entries of another format or fusedops version, a cache dir that is a file
  or sits under one, a symlinked cache dir [triton#518 permissions, triton#4002 symlinked cache dir], three
  forked processes compiling one kernel at once [triton#4295, triton#11512];
- dsl.autotune: config list validation (empty, dicts, a generator), key / reset_to_zero names [triton#11602],
  prune_configs_by (not offered then: TypeError; since session 41 a dict, checked), a config that fails to compile, all configs failing with a clear
  error [triton#8059] in the interpreter and on the (mocked) GPU;
- prepared launches (`kernel.prepare`) given the wrong number of tensors, interpreter vs GPU.

DEFECTS (all fixed in session 27; their tests, strict xfails until then, now pass. A tensor without memory a
kernel can read is a TypeError naming the argument at launch, on every path; a freed storage too):

1. dsl.autotune given its configs as a generator (or any one-shot iterator, e.g. `map(...)`) consumes them while
   validating and keeps none: `dsl.autotune((dsl.Config({"BLOCK": b}) for b in (8, 16)), key=["n"])(k)` decorates
   fine, then the first interpreter launch raises `IndexError: list index out of range` and a GPU launch
   `LaunchError: autotune of `k`: no config could run ()`; the key-vs-config check at decoration is skipped too.
   Expected: the configs materialized once (the launch runs with BLOCK=8), or a TypeError at decoration. Cause:
   runtime/autotune.py `Autotuner.__init__`: `if not configs` (a generator is truthy), the list comprehension
   over `configs` exhausts it, then `self.configs = tuple(configs)` is empty; `_interpreter_config` then raises
   `errors[0]` of an empty list.
2. `dsl.jit(do_not_specialize=["BLOCK"])` where BLOCK is a `dsl.constexpr` parameter is accepted silently, and
   every BLOCK value still compiles its own kernel (a constexpr is a literal of the code: it cannot be left
   unspecialized). Expected: a TypeError naming BLOCK at decoration, as Triton's maintainers decided in
   triton#8273 (vLLM hit the recompilations). Cause: runtime/kernel_parameters.py `parameters` checks only that
   the names exist, not that they are runtime parameters.
3. `dsl.jit(do_not_specialize="n_cols")` iterates the string character by character: the TypeError says
   "do_not_specialize names ['_', 'c', 'l', 'n', 'o', 's'], which are not parameters", naming neither `n_cols`
   nor that a list is expected (and a one-letter name such as "n" silently works). dsl.autotune's key= /
   reset_to_zero= refuse a str ("must be a list of the kernel's parameter names"). Expected: the same TypeError
   here, or the string taken as one name. Cause: runtime/kernel_parameters.py `parameters` (and `jit`) take any
   iterable.
4. A CUDA tensor that has no storage reaches the GPU launch as a NULL pointer instead of being refused: a
   `__torch_dispatch__` wrapper subclass (built with `torch.Tensor._make_wrapper_subclass(cls, (4,), ...,
   device="cuda:0")`, as many tensor subclasses are: data_ptr() is 0, numel() is 4, layout strided) given as
   `x_ptr` is specialized as a 16-byte aligned float32 pointer, compiled and launched with address 0 on its
   first launch, and on a cached launch it finds the plan of an ordinary aligned float32 CUDA tensor and is
   launched with address 0 too (mocked driver: the packed parameter is 0; on a GPU an illegal memory access,
   which poisons the CUDA context). Expected: a TypeError / ValueError naming `x_ptr` (a tensor without
   storage), as pytorch#121412 asks of raw Triton kernels given FakeTensors; torch's own ops never read such a
   tensor's address (they dispatch to its __torch_dispatch__). Cause: runtime/signature.py `specialize` reads
   only `data_ptr() % 16` (0 passes as aligned) and launcher.cuda_device only the device; fast_path's key
   (`_branches` / `_other_key`) treats address 0 as an aligned tensor, so the plan launches it. (An empty
   tensor's address may legitimately be 0: the test is numel() > 0 with no storage.)
5. In the interpreter, a tensor without storage raises torch's internal error, naming neither the argument nor
   the kernel: under `torch.func.vmap` or `torch.func.grad` a kernel launch raises "RuntimeError: Cannot access
   data pointer of Tensor that doesn't have storage" (pytorch#105301, pytorch#91810), a wrapper subclass
   "RuntimeError: Attempted to access the data pointer on an invalid python storage" (a FakeTensor:
   "NotImplementedError: Cannot copy out of meta tensor; no data!"). Expected: a
   TypeError / ValueError naming `x_ptr` and saying it has no storage (a meta tensor already gets "argument
   `x_ptr` of kernel k is a meta tensor, which has no data to run on"). Cause: runtime/signature.py `specialize`
   (`value.data_ptr()`) and interpreter/arguments.py `bind_arguments` (`untyped_storage()`) call torch without
   catching its error.
6. An interpreter prepared launch takes any number of tensors: `p = k.prepare((1,), x, y, b)` (k(x_ptr, y_ptr,
   b_ptr=None)) then `p(x, y)` runs the no-bias specialization and stores x (silently wrong), `p(x, y, b, b)`
   ignores the extra tensor; the GPU prepared launch of the same kernel raises TypeError for both (a generated
   function of three parameters). Expected: a TypeError for a wrong number of tensors on both paths. Cause:
   runtime/jit.py `prepare`'s `fallback(*tensors)` zips `positions` with the tensors (zip truncates; the
   template's None fills the rest).

What works (plain tests): every tensor dtype the language has, through the interpreter, and fp8 / complex
refused naming the argument; scalars at the int32 / int64 / uint64 boundaries, bools, floats at float32's and
float16's rounding boundary; numpy scalars and over-wide ints refused naming the argument, a 0-d tensor given
for a scalar explained; annotated int64 / uint32 parameters equal to 1 keep their type; constexpr values and int
specializations compile one kernel each and do_not_specialize one kernel for every value; grids of every
accepted form, zero-size grids, and every bad grid a LaunchError; bad arguments and launch options named; knobs'
bad values named at launches; meta / freed / empty / 0-d / expanded / transposed tensors in the interpreter;
corrupt, foreign-format and other-version cache entries recompiled; a cache dir that is a file, under a file,
or a symlink; three processes compiling at once; PTX of bool / uint8 / int8 / bf16 kernels with int64 / uint64 /
negative scalars assembled by ptxas; autotune's validation, a failing config skipped and all configs failing
named (interpreter and mocked GPU); the GPU prepared launch refusing a wrong tensor count.
"""

from __future__ import annotations

import json
import multiprocessing
import shutil

import numpy as np
import pytest
import torch

import fusedops
import fusedops.dsl as dsl
from fusedops.dsl.errors import CompilationError, InterpreterError, LaunchError
from fusedops.dsl.runtime import autotune as autotune_module
from fusedops.dsl.runtime import knobs
from test_launch_fast_path import _cuda, gpu  # noqa: F401  (the mocked driver: a fixture, fake CUDA tensors)


@pytest.fixture(autouse=True)
def _private_cache(monkeypatch, tmp_path):
    """Every compile of this file into a fresh disk cache, with the interpreter setting unset."""
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path / "kernels"))
    monkeypatch.delenv("FUSEDOPS_INTERPRET", raising=False)
    monkeypatch.delenv("FUSEDOPS_DISABLE_CACHE", raising=False)


# ------------------------------------------------------------------------------------------------
# Kernels (fresh JITFunctions per test, so that no specialization or plan leaks between tests)
# ------------------------------------------------------------------------------------------------
def _masked_copy():
    def masked_copy(o_ptr, x_ptr, n_cols, BLOCK: dsl.constexpr):
        offs = dsl.arange(0, BLOCK)
        m = offs < n_cols
        dsl.store(o_ptr + offs, dsl.load(x_ptr + offs, mask=m), mask=m)
    return masked_copy


def _load_one():
    def load_one(o_ptr, x_ptr):
        dsl.store(o_ptr, dsl.load(x_ptr))
    return dsl.jit(load_one)


def _add_one():
    def add_one(o_ptr, x_ptr, n, BLOCK: dsl.constexpr):
        offs = dsl.program_id(0) * BLOCK + dsl.arange(0, BLOCK)
        m = offs < n
        dsl.store(o_ptr + offs, dsl.load(x_ptr + offs, mask=m) + 1.0, mask=m)
    return dsl.jit(add_one)


def _optional_bias():
    def optional_bias(x_ptr, y_ptr, b_ptr=None, BLOCK: dsl.constexpr = 8):
        offs = dsl.arange(0, BLOCK)
        v = dsl.load(x_ptr + offs)
        if b_ptr is not None:
            v = v + dsl.load(b_ptr + offs)
        dsl.store(y_ptr + offs, v)
    return dsl.jit(optional_bias)


def _grid_of(meta):
    return ((meta["n"] + meta["BLOCK"] - 1) // meta["BLOCK"],)


class _NoStorage(torch.Tensor):
    """A __torch_dispatch__ wrapper subclass (as DTensor, NJT or a quantized-weight tensor are): metadata of a
    tensor, no storage of its own (data_ptr() is 0)."""

    @staticmethod
    def __new__(cls, shape, device):
        return torch.Tensor._make_wrapper_subclass(cls, shape, dtype=torch.float32, device=torch.device(device))

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise NotImplementedError(f"_NoStorage does not run {func}")


# ------------------------------------------------------------------------------------------------
# Tensors and scalars in the interpreter
# ------------------------------------------------------------------------------------------------
_DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint16, torch.uint32,
           torch.uint64, torch.float16, torch.bfloat16, torch.float32, torch.float64]


def test_every_tensor_dtype_copies_through_the_interpreter_and_others_are_named():
    kernel = dsl.jit(_masked_copy())
    for dtype in _DTYPES:
        x = (torch.arange(12) % 3).to(dtype)
        out = torch.zeros(16, dtype=dtype)
        kernel[(1,)](out, x, 12, BLOCK=16, interpret=True)
        assert torch.equal(out[:12], x) and not out[12:].any(), dtype
    for dtype in (torch.float8_e4m3fn, torch.float8_e5m2, torch.complex64):
        x = torch.zeros(4, dtype=dtype)
        with pytest.raises(TypeError, match=r"argument `o_ptr` of kernel `masked_copy`.*no fusedops.dsl equivalent"):
            kernel[(1,)](x, x, 4, BLOCK=4, interpret=True)


def test_int_and_bool_scalars_at_their_boundaries():
    kernel = dsl.jit(_masked_copy())
    x = torch.arange(1.0, 17.0)
    for n, expected in [(True, 1), (False, 0), (1, 1), (0, 0), (-16, 0), (7, 7), (2**31, 16), (2**63, 16),
                        (-2**63, 0), (2**64 - 1, 16)]:
        out = torch.zeros(16)
        kernel[(1,)](out, x, n, BLOCK=16, interpret=True)
        assert torch.equal(out, torch.where(torch.arange(16) < expected, x, 0.0)), n
    for bad, pattern in [(2**64, "does not fit in 64 bits"), (-2**63 - 1, "does not fit in 64 bits"),
                         (np.int64(5), "numpy.int64"), (np.float32(5), "numpy.float32"), ("5", "builtins.str")]:
        with pytest.raises(TypeError, match=f"argument `n_cols` of kernel `masked_copy`.*{pattern}"):
            kernel[(1,)](torch.zeros(16), x, bad, BLOCK=16, interpret=True)
    with pytest.raises(CompilationError, match="pass a Python number where the kernel means a scalar"):
        kernel[(1,)](torch.zeros(16), x, torch.tensor(5), BLOCK=16, interpret=True)


def test_float_scalars_round_at_the_edge_of_their_type_like_torch():
    def store_scalars(o_ptr, h_ptr, f, h: dsl.float16):
        dsl.store(o_ptr, f)
        dsl.store(h_ptr, h)
    kernel = dsl.jit(store_scalars)
    out, half = torch.zeros(1), torch.zeros(1, dtype=torch.float16)
    for f, h in [(float("inf"), float("-inf")), (3.402823567797336e38, 65519.0), (1e-46, 1e-8), (-0.0, -0.0)]:
        kernel[(1,)](out, half, f, h, interpret=True)
        assert torch.equal(out, torch.tensor([f]).float()) and torch.equal(half, torch.tensor([h]).half())
        assert torch.equal(out.signbit(), torch.tensor([f]).signbit())
    kernel[(1,)](out, half, float("nan"), float("nan"), interpret=True)
    assert out.isnan().all() and half.isnan().all()
    for f, h, name in [(3.4028235677973366e38, 1.0, "f"), (1e39, 1.0, "f"), (1.0, 65520.0, "h")]:
        with pytest.raises(LaunchError, match=f"argument `{name}` .*range"):
            kernel[(1,)](out, half, f, h, interpret=True)


def test_annotated_int_parameters_equal_to_one_keep_their_type():
    # triton#3102: an annotation fixes the type; the equal-to-1 constant must keep it (int64 shifts, uint32 wraps)
    def typed(o_ptr, n: dsl.int64, u: dsl.uint32):
        dsl.store(o_ptr, n << 40)
        dsl.store(o_ptr + 1, (u - 2).to(dsl.int64))
    kernel = dsl.jit(typed)
    for n, u in [(1, 1), (3, 3)]:
        out = torch.zeros(2, dtype=torch.int64)
        kernel[(1,)](out, n, u, interpret=True)
        assert out.tolist() == [n << 40, (u - 2) % 2**32]


def test_what_recompiles_and_what_does_not():
    kernel = dsl.jit(_masked_copy())
    x = torch.arange(32.0)
    for block in (16, 32, 16, 32):
        kernel[(1,)](torch.zeros(32), x, 5, BLOCK=block, interpret=True)
    assert len(kernel._cache) == 2                       # one per constexpr value, none for a repeat
    for n in (1, 16, 17, 24, -16, 1, 16):                # equal to 1, 16 / 8 positive, 16 not positive, other
        out = torch.zeros(32)
        kernel[(1,)](out, x, n, BLOCK=32, interpret=True)
        assert torch.equal(out, torch.where(torch.arange(32) < n, x, 0.0))
    assert len(kernel._cache) == 2 + 4                   # n = 17 specializes as n = 5 did (no hint)
    unspecialized = dsl.jit(do_not_specialize=["n_cols"])(_masked_copy())
    for n in (1, 16, 17, 24):
        out = torch.zeros(32)
        unspecialized[(1,)](out, x, n, BLOCK=32, interpret=True)
        assert torch.equal(out, torch.where(torch.arange(32) < n, x, 0.0))
    assert len(unspecialized._cache) == 1


# ------------------------------------------------------------------------------------------------
# Grids, arguments, launch options, knobs
# ------------------------------------------------------------------------------------------------
def _program_ids():
    def program_ids(o_ptr):
        dsl.store(o_ptr + dsl.program_id(0) + 4 * dsl.program_id(1) + 16 * dsl.program_id(2), 1.0)
    return dsl.jit(program_ids)


def test_grids_of_every_accepted_form_and_every_bad_one_named():
    kernel = _program_ids()
    out = torch.zeros(64)
    for grid, launched in [((2, 3), 6), ([2], 2), (3, 3), ((np.int64(2),), 2), ((torch.tensor(2),), 2),
                           (lambda meta: (meta["o_ptr"].numel() // 32, 2, 2), 8), (lambda meta: 3, 3),
                           ((0,), 0), ((4, 0), 0), ((2**31 - 1, 0), 0)]:
        out.zero_()
        kernel[grid](out, interpret=True)
        assert int(out.sum()) == launched, grid
    for grid, pattern in [((), "1 to 3 dimensions, got 0"), ((1, 1, 1, 1), "got 4"), ((2.0,), "entry 0 .* float"),
                          ((True,), "is a bool"), ((-1,), r"entry 0 .* is -1"), ((2**31,), r"\[0, 2147483647\]"),
                          ((1, 65536), r"entry 1 .*\[0, 65535\]"), ((1, 1, 65536), r"entry 2 .*\[0, 65535\]"),
                          (None, "NoneType"), ("2", "str"), (lambda meta: None, "NoneType")]:
        with pytest.raises(LaunchError, match=pattern) as raised:
            kernel[grid](out, interpret=True)
        assert "`program_ids`" in str(raised.value)


def test_bad_arguments_and_launch_options_are_named():
    def k(o_ptr, n, BLOCK: dsl.constexpr = 4):
        offs = dsl.arange(0, BLOCK)
        dsl.store(o_ptr + offs, n + offs * 0, mask=offs < n)
    kernel = dsl.jit(k)
    out = torch.zeros(4, dtype=torch.int32)
    cases = [((), {}, TypeError, "missing argument `n`"),
             ((1, 4, 5), {}, TypeError, r"takes 3 arguments \(o_ptr, n, BLOCK\) but 4 were given"),
             ((1,), {"BLOK": 4}, TypeError, "unexpected keyword argument `BLOK`; its parameters are o_ptr, n, BLOCK"),
             ((1,), {"num_ctas": 1}, TypeError, "unexpected keyword argument `num_ctas`"),
             ((1,), {"target": "sm_90a"}, TypeError, "unexpected keyword argument `target`"),
             ((1,), {"n": 2}, TypeError, "multiple values for argument `n`"),
             ((1,), {"num_warps": 3}, LaunchError, "num_warps of `k`"),
             ((1,), {"num_stages": 0}, LaunchError, "num_stages of `k`"),
             ((1,), {"BLOCK": torch.tensor(4)}, TypeError, "`BLOCK` of kernel `k` is a dsl.constexpr"),
             ((1,), {"BLOCK": np.int64(4)}, TypeError, "`BLOCK` of kernel `k` is a dsl.constexpr")]
    for args, kwargs, error, pattern in cases:
        with pytest.raises(error, match=pattern):
            kernel[(1,)](out, *args, interpret=True, **kwargs)
    with pytest.raises(LaunchError, match="interpret of `k` must be True, False or None"):
        kernel[(1,)](out, 1, interpret="yes")
    with pytest.raises(RuntimeError, match=r"launch it with k\[grid\]"):
        kernel(out, 1)
    with pytest.raises(ValueError, match="argument `o_ptr` of kernel `k` is a cpu tensor.*interpret"):
        kernel[(1,)](out, 1)                     # a CPU tensor without the interpreter (no GPU here)


def test_bad_knob_values_are_named_at_the_launch(monkeypatch):
    kernel = _program_ids()
    out = torch.zeros(64)
    monkeypatch.setenv("FUSEDOPS_INTERPRET", "2")
    with pytest.raises(ValueError, match="FUSEDOPS_INTERPRET='2' is not a boolean"):
        kernel[(1,)](out)
    kernel[(1,)](out, interpret=True)           # an explicit flag does not read the variable
    assert out.sum() == 1
    monkeypatch.setenv("FUSEDOPS_INTERPRET", " On ")
    kernel[(2,)](out)
    assert out.sum() == 2
    for variable, text in [("FUSEDOPS_WS", "3"), ("FUSEDOPS_DEFAULT_ARCH", "sm9"), ("FUSEDOPS_TMA", "maybe")]:
        with pytest.raises(ValueError, match=variable):
            knobs.current({variable: text})
    monkeypatch.setenv("FUSEDOPS_TMA", "maybe")
    with pytest.raises(ValueError, match="FUSEDOPS_TMA='maybe'"):
        kernel.compile(out, target="sm_90a")


def test_interpreter_storage_edge_cases():
    kernel = dsl.jit(_masked_copy())
    load_one = _load_one()
    empty = torch.empty(0)
    kernel[(1,)](empty, empty, 0, BLOCK=16, interpret=True)                       # masked: nothing accessed
    zero_d, out_d = torch.tensor(3.0), torch.tensor(0.0)
    load_one[(1,)](out_d, zero_d, interpret=True)
    assert out_d.item() == 3.0
    expanded = torch.tensor([7.0]).expand(16)                                     # stride 0: one element stored
    out = torch.zeros(16)
    kernel[(1,)](out, expanded, 1, BLOCK=16, interpret=True)
    assert out.tolist() == [7.0] + [0.0] * 15
    with pytest.raises(InterpreterError, match="x_ptr"):
        kernel[(1,)](out, expanded, 16, BLOCK=16, interpret=True)               # past its one-element storage
    column = torch.arange(32.0).reshape(4, 8).t()[1]                             # a strided view at offset 1
    kernel[(1,)](out, column, 1, BLOCK=16, interpret=True)
    assert out[0].item() == 1.0
    with pytest.raises(ValueError, match="argument `x_ptr` of kernel load_one is a meta tensor"):
        load_one[(1,)](torch.zeros(1), torch.empty(4, device="meta"), interpret=True)
    freed = torch.ones(4)
    freed.untyped_storage().resize_(0)
    with pytest.raises(TypeError, match="`x_ptr` of kernel `load_one` is a tensor without memory"):
        load_one[(1,)](torch.zeros(1), freed, interpret=True)     # (until session 27 an InterpreterError at the load)


# ------------------------------------------------------------------------------------------------
# The disk cache
# ------------------------------------------------------------------------------------------------
def _entries(directory):
    return sorted(p for p in directory.rglob("*.json") if not p.name.startswith("."))


def test_damaged_foreign_and_other_version_cache_entries_are_not_used(tmp_path, monkeypatch):
    cache = tmp_path / "c"
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(cache))
    x = torch.empty(16)
    good = dsl.jit(_masked_copy()).compile(x, x, 5, BLOCK=16, target="sm_90a").asm["ptx"]
    (path,) = _entries(cache)
    original = path.read_bytes()
    for damage in (original[: len(original) // 2], b"\xff\xfe\x00", json.dumps({**json.loads(original),
                                                                                   "format": 0}).encode()):
        path.write_bytes(damage)
        assert dsl.jit(_masked_copy()).compile(x, x, 5, BLOCK=16, target="sm_90a").asm["ptx"] == good
        assert path.read_bytes() == original, "the damaged entry should be rewritten"
    path.write_text(json.dumps({**json.loads(original), "ptx": "// from another version"}))
    monkeypatch.setattr(fusedops, "__version__", "99.0.0")
    assert dsl.jit(_masked_copy()).compile(x, x, 5, BLOCK=16, target="sm_90a").asm["ptx"] == good
    assert len(_entries(cache)) == 2, "another fusedops version keys its own entry"


@pytest.mark.parametrize("where", ["a file", "under a file", "a symlink to a directory"])
def test_cache_dirs_that_are_files_or_symlinks(tmp_path, monkeypatch, where):
    x = torch.empty(16)
    monkeypatch.setenv("FUSEDOPS_DISABLE_CACHE", "1")
    good = dsl.jit(_masked_copy()).compile(x, x, 5, BLOCK=16, target="sm_90a").asm["ptx"]
    monkeypatch.delenv("FUSEDOPS_DISABLE_CACHE")
    afile = tmp_path / "afile"
    afile.write_text("not a directory")
    target = tmp_path / "real"
    target.mkdir()
    directory = {"a file": afile, "under a file": afile / "sub", "a symlink to a directory": tmp_path / "link"}[where]
    if where == "a symlink to a directory":
        directory.symlink_to(target)
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(directory))
    assert dsl.jit(_masked_copy()).compile(x, x, 5, BLOCK=16, target="sm_90a").asm["ptx"] == good
    assert afile.read_text() == "not a directory"
    assert len(_entries(target)) == (1 if where == "a symlink to a directory" else 0)


def _compile_in_child(barrier, results, index):
    barrier.wait(timeout=60)
    x = torch.empty(16)
    ptx = dsl.jit(_masked_copy()).compile(x, x, 5, BLOCK=16, target="sm_90a").asm["ptx"]
    results.put((index, ptx))


def test_processes_compiling_one_kernel_at_once_share_one_entry(tmp_path, monkeypatch):
    cache = tmp_path / "shared"
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(cache))
    context = multiprocessing.get_context("fork")
    barrier, results = context.Barrier(3), context.Queue()
    children = [context.Process(target=_compile_in_child, args=(barrier, results, i), daemon=True) for i in range(3)]
    for child in children:
        child.start()
    ptx = dict(results.get(timeout=120) for _ in children)
    for child in children:
        child.join(timeout=60)
    assert [child.exitcode for child in children] == [0, 0, 0]
    assert len(set(ptx.values())) == 1
    assert len(_entries(cache)) == 1
    assert not [p for p in cache.rglob("*") if p.name.startswith(".tmp")], "a temporary file was left behind"
    x = torch.empty(16)
    assert dsl.jit(_masked_copy()).compile(x, x, 5, BLOCK=16, target="sm_90a").asm["ptx"] == ptx[0]


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas is not on the PATH")
def test_ptx_of_narrow_and_16_bit_tensors_with_wide_and_negative_scalars_assembles(monkeypatch):
    from fusedops.dsl.target.ptxas import assemble

    def strided(o_ptr, x_ptr, n, s, f, BLOCK: dsl.constexpr):
        offs = dsl.arange(0, BLOCK)
        m = offs < n
        dsl.store(o_ptr + offs, dsl.load(x_ptr + offs * s, mask=m) * f, mask=m)
    monkeypatch.setenv("FUSEDOPS_DISABLE_CACHE", "1")
    kernel = dsl.jit(strided)
    for dtype, n, s, f in [(torch.bool, 2**40, 2**33, 1.5), (torch.uint8, 2**63 + 1, 16, True),
                           (torch.int8, -3, -16, 0.5), (torch.bfloat16, 5, 1, 2.0)]:
        x = torch.zeros(16, dtype=dtype)
        ptx = kernel.compile(x, x, n, s, f, BLOCK=16, target="sm_90a").asm["ptx"]
        assert assemble(ptx, "sm_90a").cubin


# ------------------------------------------------------------------------------------------------
# dsl.autotune
# ------------------------------------------------------------------------------------------------
def test_autotune_validates_its_arguments():
    kernel = _add_one()
    one = [dsl.Config({"BLOCK": 8})]
    with pytest.raises(ValueError, match="at least one Config"):
        dsl.autotune([], key=["n"])(kernel)
    with pytest.raises(TypeError, match="must be dsl.Config objects"):
        dsl.autotune([{"BLOCK": 8}], key=["n"])(kernel)
    with pytest.raises(TypeError, match="key must be a list"):
        dsl.autotune(one, key="n")(kernel)
    with pytest.raises(TypeError, match=r"key names \['m'\], which are not parameters of `add_one`"):
        dsl.autotune(one, key=["m"])(kernel)
    with pytest.raises(TypeError, match=r"reset_to_zero names \['q'\]"):
        dsl.autotune(one, key=["n"], reset_to_zero=["q"])(kernel)
    with pytest.raises(TypeError, match=r"key names \['BLOCK'\], which the configs set"):
        dsl.autotune(one, key=["BLOCK"])(kernel)
    with pytest.raises(TypeError, match="prune_configs_by must be a dict"):     # (offered since session 41)
        dsl.autotune(one, key=["n"], prune_configs_by=[])(kernel)
    with pytest.raises(ValueError, match="Config: num_warps"):
        dsl.Config({}, num_warps=3)
    with pytest.raises(TypeError, match="decorates a @dsl.jit kernel"):
        dsl.autotune(one, key=["n"])(kernel.fn)
    tuner = dsl.autotune(one, key=["n"])(kernel)
    with pytest.raises(TypeError, match="`num_warps` is set by the autotune Configs"):
        tuner[(1,)](torch.zeros(8), torch.zeros(8), 8, num_warps=8, interpret=True)


def test_autotune_in_the_interpreter_skips_a_failing_config_and_names_the_error_when_all_fail():
    x = torch.arange(20.0)
    out = torch.zeros(20)
    tuner = dsl.autotune([dsl.Config({"BLOCK": 3}), dsl.Config({"BLOCK": 8})], key=["n"])(_add_one())
    tuner[_grid_of](out, x, 20, interpret=True)
    assert torch.equal(out, x + 1)
    tuner = dsl.autotune([dsl.Config({"BLOCK": 3}), dsl.Config({"BLOCK": 5})], key=["n"])(_add_one())
    with pytest.raises(CompilationError, match="power of two, got 3"):
        tuner[_grid_of](out, x, 20, interpret=True)


@pytest.fixture
def fake_timing(monkeypatch):
    monkeypatch.setattr(autotune_module, "_device_name", lambda device: "Fake H200")
    monkeypatch.setattr(autotune_module, "time_launches",
                        lambda launch, before=lambda: None, warmup=0, reps=1: (before(), launch(), 1.0)[2])


def test_autotune_on_the_gpu_skips_a_failing_config_and_lists_every_reason_when_all_fail(gpu, fake_timing):
    out, x = _cuda(torch.zeros(20)), _cuda(torch.ones(20))
    tuner = dsl.autotune([dsl.Config({"BLOCK": 3}), dsl.Config({"BLOCK": 8})], key=["n"])(_add_one())
    tuner[_grid_of](out, x, 20)
    key = tuner.key_of((out, x, 20), {})
    assert tuner.best[key] == dsl.Config({"BLOCK": 8})
    assert [m.skipped is not None for m in tuner.measurements[key]] == [True, False]
    tuner = dsl.autotune([dsl.Config({"BLOCK": 3}), dsl.Config({"BLOCK": 5})], key=["n"])(_add_one())
    with pytest.raises(LaunchError, match=r"no config could run \(Config\(BLOCK=3.*got 3; Config\(BLOCK=5.*got 5\)"):
        tuner[_grid_of](out, x, 20)


def test_autotune_configs_given_as_a_generator():
    configs = (dsl.Config({"BLOCK": block}) for block in (8, 16))
    try:
        tuner = dsl.autotune(configs, key=["n"])(_add_one())
    except TypeError:
        return                                  # refusing a one-shot iterator at decoration is a fine answer
    assert len(tuner.configs) == 2
    x, out = torch.arange(20.0), torch.zeros(20)
    tuner[_grid_of](out, x, 20, interpret=True)
    assert torch.equal(out, x + 1)


# ------------------------------------------------------------------------------------------------
# do_not_specialize
# ------------------------------------------------------------------------------------------------
def test_do_not_specialize_naming_a_constexpr_is_refused():
    with pytest.raises(TypeError, match="BLOCK"):
        dsl.jit(do_not_specialize=["BLOCK"])(_masked_copy())


def test_do_not_specialize_given_one_string():
    try:
        kernel = dsl.jit(do_not_specialize="n_cols")(_masked_copy())
    except TypeError as error:
        assert "n_cols" in str(error) or "list" in str(error), f"the message names neither: {error}"
        return
    assert [p.name for p in kernel.params if p.do_not_specialize] == ["n_cols"]


# ------------------------------------------------------------------------------------------------
# Tensors without data
# ------------------------------------------------------------------------------------------------
def test_a_cuda_wrapper_tensor_without_storage_is_refused_naming_it(gpu):
    kernel = _load_one()
    wrapper = _NoStorage((4,), "cuda:0")
    assert wrapper.data_ptr() == 0 and wrapper.numel() == 4
    with pytest.raises((TypeError, ValueError), match="x_ptr"):
        kernel[(1,)](_cuda(torch.zeros(1)), wrapper)
    assert not gpu, "the kernel was launched with address 0"


def test_a_cuda_wrapper_tensor_without_storage_is_refused_on_a_cached_launch(gpu):
    kernel = _load_one()
    out = _cuda(torch.zeros(1))
    kernel[(1,)](out, _cuda(torch.ones(4)))
    kernel[(1,)](out, _cuda(torch.ones(4)))      # the plan of (float32, 16-byte aligned, cuda:0)
    launched = len(gpu)
    with pytest.raises((TypeError, ValueError), match="x_ptr"):
        kernel[(1,)](out, _NoStorage((4,), "cuda:0"))
    assert len(gpu) == launched, "the kernel was launched with address 0"


def _under(transform, kernel):
    out = torch.zeros(1)

    def f(x):
        kernel[(1,)](out, x, interpret=True)
        return (x * out).sum()
    if transform == "vmap":
        return lambda: torch.func.vmap(f)(torch.ones(3, 1))
    return lambda: torch.func.grad(f)(torch.ones(1))


@pytest.mark.parametrize("case", ["vmap", "grad", "wrapper"])
def test_interpreter_names_a_tensor_without_storage(case):
    kernel = _load_one()
    if case == "wrapper":
        call = lambda: kernel[(1,)](torch.zeros(1), _NoStorage((4,), "cpu"), interpret=True)   # noqa: E731
    else:
        call = _under(case, kernel)
    with pytest.raises((TypeError, ValueError), match="x_ptr"):
        call()


# ------------------------------------------------------------------------------------------------
# Prepared launches
# ------------------------------------------------------------------------------------------------
def test_gpu_prepared_launch_refuses_a_wrong_number_of_tensors(gpu):
    kernel = _optional_bias()
    x, y, b = (_cuda(torch.ones(8)) for _ in range(3))
    prepared = kernel.prepare((1,), x, y, b)
    prepared(x, y, b)
    for tensors in [(x, y), (x, y, b, b)]:
        with pytest.raises(TypeError):
            prepared(*tensors)
    assert len(gpu) == 1


def test_interpreter_prepared_launch_refuses_a_wrong_number_of_tensors():
    kernel = _optional_bias()
    x, b = torch.arange(8.0), torch.ones(8)
    y = torch.zeros(8)
    prepared = kernel.prepare((1,), x, y, b, interpret=True)
    prepared(x, y, b)
    assert torch.equal(y, x + 1)
    y.zero_()
    with pytest.raises(TypeError):
        prepared(x, y)                          # runs the no-bias kernel now: y == x
    with pytest.raises(TypeError):
        prepared(x, y, b, b)
