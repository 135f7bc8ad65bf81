"""`@dsl.jit`: the kernel object users launch as `kernel[grid](*args, **constexprs)`.

A `JITFunction` binds a launch's arguments to its parameters, computes the `SpecializationKey`
(signature.py), and keeps per key the frontend's IR and, for the GPU, the compiled kernel. It then
runs the IR in the NumPy interpreter (`interpret=True` or FUSEDOPS_INTERPRET=1; CPU and CUDA tensors)
or launches the compiled kernel on the tensors' device and current stream.

Cached GPU launches take a fast path: after the first GPU launch, `kernel[grid]` (and `run`) is an
entry function generated for the kernel's signature (fast_path.make_entry, like Triton's binder), so
CPython binds the arguments; it computes a launch key (per tensor its dtype, 16-byte alignment and
device; per int its width and whether it is 1 or divisible by 16; the class of floats, bools and
None; constexpr values and their classes; the launch options) and the runtime values (tensors as
data pointers). The key finds a plan (launch_plans.make_plan), made by the first launch with that key
after the full path has checked everything (binding, argument kinds, devices) and compiled, so a
launch whose arguments differ in anything those checks look at misses the cache and takes the full
path, which raises or makes a new plan. The plan is a function generated for its launch: it checks
the globals the kernel read, and packs the runtime values and launches on the device's current
stream with the driver's statements inlined.

Launch wrappers that already know everything but the tensors' addresses (the library's, which cache
per shapes, strides, dtypes and device) use `prepare` instead: it returns a launch of fixed grid and
arguments taking only the tensors.

Compilation errors are re-raised from here without the compiler's frames: the error's message
points at the kernel source (file:line:col, the line and a caret).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import os
import sys
import threading
import types
import weakref
from typing import Callable, Optional

from ..errors import CompilationError, InterpreterError, UnsupportedError
from ..ir import Function, print_function
from ..ir.ops import cluster_size
from ..language import core
from . import knobs
from .fast_path import MISSING, make_binder, make_entry
from .kernel_parameters import parameters
from .launch_plans import make_plan, make_prepared
from .launcher import (check_arch, check_cluster_grid, check_interpret, check_num_warps, cuda_device, device_arch,
                       normalize_grid)
from .signature import SpecializationKey, bind_parameters, specialize

_interpret_enabled = knobs.interpret_enabled

# Every JITFunction made in this process, for the child of os.fork (`_reset_in_forked_child`).
_KERNELS: "weakref.WeakSet" = weakref.WeakSet()


def _reset_in_forked_child() -> None:
    """Run in the child of os.fork (a DataLoader worker, multiprocessing's "fork"), which has only the thread that
    forked: a compile another thread had in flight never finishes there. Each kernel gets a new compile lock (the
    old one may be held by a thread the child does not have, so that every later launch, compile or `ir` of the
    kernel, interpreter included, would wait for ever), and its GPU specializations not compiled yet are dropped
    (the passes rewrite their IR in place: one may be half rewritten); they are generated again when used."""
    for kernel in list(_KERNELS):
        kernel._compile_lock = threading.RLock()
        for key, entry in list(kernel._cache.items()):
            if key.arch is not None and entry.compiled is None:
                del kernel._cache[key]


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_in_forked_child)


@dataclasses.dataclass
class _Entry:
    """One specialization: the frontend's result, and the compiled kernel once there is one."""

    kernel: object               # frontend.GeneratedKernel
    compiled: object = None      # compiler.CompiledKernel (GPU keys)
    interpreter: object = None   # interpreter.Interpreter (the interpreter's key)


@dataclasses.dataclass
class FrontendOnlyKernel:
    """What `kernel.compile` returns while `fusedops.dsl.compiler` does not exist: the IR only."""

    name: str
    function: Function
    asm: dict

    def launch(self, grid, args, stream) -> None:
        raise UnsupportedError(f"`{self.name}` was compiled by the frontend only: the GPU compiler "
                               "(fusedops.dsl.compiler) is not available")


def attribute_at(owner, qualname: str):
    """`owner.a.b` for qualname "a.b" (None where a name is missing, e.g. a kernel defined in a function)."""
    for name in qualname.split("."):
        owner = getattr(owner, name, None)
    return owner


class JITFunction:
    """A kernel (or a helper called from kernels) written in the kernel language."""

    __dsl_jit__ = True

    def __init__(self, fn, do_not_specialize=(), enable_fp_fusion: bool = False):
        if not inspect.isfunction(fn):
            raise TypeError(f"@dsl.jit decorates a Python function, got {type(fn).__name__}")
        if not isinstance(enable_fp_fusion, bool):
            raise TypeError(f"@dsl.jit: enable_fp_fusion must be a bool, got {enable_fp_fusion!r}")
        self._enable_fp_fusion = enable_fp_fusion
        self.fn = fn
        functools.update_wrapper(self, fn)
        self.params = parameters(fn, do_not_specialize)
        self._index = {p.name: i for i, p in enumerate(self.params)}
        from ..frontend import read_source
        self._source_text = read_source(fn)     # the file as decorated: parsed at the first compile
        self._source = None
        self._cache: dict = {}      # SpecializationKey -> _Entry
        # Held while an entry is made or compiled: the passes rewrite the entry's IR in place, so two
        # threads launching a new specialization at once must not both compile it.
        self._compile_lock = threading.RLock()      # (a new one in a forked child: _reset_in_forked_child)
        self._plans: dict = {}      # launch key (fast_path.make_binder) -> launch_plans.make_plan's launch
        self._is_constexpr = tuple(p.is_constexpr for p in self.params)
        self._constexpr_names = frozenset(p.name for p in self.params if p.is_constexpr)
        self._tensor_type = None    # torch.Tensor, set by the first GPU launch (torch is imported then)
        self._binder = None         # fast_path.make_binder's, made by the first GPU launch
        self._launch_entry = None   # fast_path.make_entry's, made by the first GPU launch
        _KERNELS.add(self)

    def __repr__(self) -> str:
        return f"<dsl.jit {self.fn.__module__}.{self.fn.__qualname__}>"

    @property
    def enable_fp_fusion(self) -> bool:
        """Whether the compiled kernel may contract a multiply and the add it feeds into an FMA (`jit`'s argument;
        read-only: the compiled specializations were made with it)."""
        return self._enable_fp_fusion

    def __reduce__(self):
        # pickled by reference, as a function is: its module and qualified name (copy.deepcopy returns the
        # kernel itself); a kernel not reachable by that name does not pickle (pickle.PicklingError). Under
        # `@dsl.autotune` that name is the tuner's: the kernel is the tuner's `fn` (the tuner pickles by reference).
        owner = attribute_at(sys.modules.get(self.__module__), self.__qualname__)
        if owner is not self and getattr(owner, "fn", None) is self:
            return getattr, (owner, "fn")
        return self.__qualname__

    @property
    def source(self):
        """The parsed source (frontend.SourceInfo) of the function as it was decorated, parsed on first use."""
        if self._source is None:
            from ..frontend import parse_function
            self._source = parse_function(self.fn, self._source_text)
        return self._source

    def __call__(self, *args, **kwargs):
        if (getattr(self.fn, "__module__", "") or "").startswith("fusedops.dsl."):   # dsl.reduce, dsl.rand, ...
            raise RuntimeError(f"dsl.{self.__name__} can only be called inside a @dsl.jit kernel")
        raise RuntimeError(f"`{self.__name__}` is a @dsl.jit function: launch it with {self.__name__}[grid](...) "
                           "or call it from another @dsl.jit function")

    # -- launching ---------------------------------------------------------------------------------
    def __getitem__(self, grid):
        """`kernel[grid]`: the launcher; grid is a tuple of 1-3 ints or a callable of the meta-parameters.
        After the first GPU launch it is the generated entry (fast_path.make_entry), which does what
        `run` does, bound to `grid` as a method is to its object: cheaper to make and to call than a
        functools.partial (~0.2 us)."""
        entry = self._launch_entry
        if entry is None or grid is None:   # MethodType refuses None: `run` names the bad grid
            return functools.partial(self.run, grid)
        return types.MethodType(entry, grid)

    def run(self, grid, *args, num_warps: int = 4, num_stages: int = 3, interpret: Optional[bool] = None,
            **kwargs) -> None:
        """Launch over `grid`; `kernel[grid](...)` is `kernel.run(grid, ...)`.

        Raises:
            TypeError: wrong argument count, unknown keyword, or an argument of an unsupported kind
                (the message names the parameter).
            ValueError: a CPU tensor (or tensors on two devices) without the interpreter.
            LaunchError: a bad grid, num_warps or num_stages.
            CompilationError: the kernel is not valid kernel-language code.
            InterpreterError: the interpreter found a fault (e.g. an out-of-bounds access).
        """
        entry = self._launch_entry
        if entry is not None:   # made by the first GPU launch: the cached path, or the full one
            return entry(grid, *args, num_warps=num_warps, num_stages=num_stages, interpret=interpret, **kwargs)
        if interpret is None:
            interpret = _interpret_enabled()
        try:
            self._run(grid, args, kwargs, num_warps, num_stages, interpret)
        except (CompilationError, InterpreterError) as error:
            raise error.with_traceback(None) from None

    def _slow(self, grid, values: tuple, extra: tuple, unknown: dict, num_warps, num_stages, interpret,
              launch_key) -> None:
        """The full path of a call of the generated entry: its arguments as the call gave them (the
        values up to the first one not given by position, the others by keyword)."""
        args, kwargs = list(extra), dict(unknown)
        given = [value is not MISSING for value in values]
        positional = given.index(False) if False in given else len(values)
        positional = min(positional, sum(p.kind != "keyword_only" for p in self.params))  # keyword-only: keywords
        args[:0] = values[:positional]
        for param, value in zip(self.params[positional:], values[positional:]):
            if value is not MISSING:
                kwargs[param.name] = value
        if interpret is None:
            interpret = _interpret_enabled()
        try:
            self._run(grid, tuple(args), kwargs, num_warps, num_stages, interpret, launch_key)
        except (CompilationError, InterpreterError) as error:
            raise error.with_traceback(None) from None

    def _meta_of_values(self, values: tuple, num_warps: int, num_stages: int) -> dict:
        meta = {p.name: (v.value if isinstance(v, core.constexpr) else v) for p, v in zip(self.params, values)}
        meta.update(num_warps=num_warps, num_stages=num_stages)
        return meta

    def prepare(self, grid, *args, num_warps: int = 4, num_stages: int = 3, interpret: Optional[bool] = None,
                **kwargs) -> Callable:
        """Check and compile `kernel[grid](*args, **kwargs)` without launching it, and return
        `prepared(*tensors)`, which launches it with new tensors: one argument per parameter that was
        given a tensor or None here (non-constexpr parameters only), in parameter order, None where None
        was given. A launch wrapper caches it per (shapes, strides, dtypes, devices, ...), so that a
        call costs the tensors' data pointers, an alignment check and the launch (the other arguments
        are packed once, see launch_plans.make_prepared).

        The caller guarantees that the tensors have the dtypes and the device of those given here (the
        prepared launch does not look): wrappers key their caches on them. A tensor that was 16-byte
        aligned here and is not in a call, a tensor where None was given, or a kernel global rebound
        since, makes that call take the full path of `run`, so the kernel is never launched with a
        specialization its arguments do not satisfy. The interpreter flag is read here: under the
        interpreter (or for an empty grid) `prepared` calls `run` each time.

        Raises: what `run` raises for these arguments; LaunchError for a scalar its parameter cannot
        take (e.g. a float beyond float32's range), which `run` raises at the launch.
        """
        if interpret is None:
            interpret = _interpret_enabled()
        check_interpret(interpret, self.__name__)
        values = self._bind(args, kwargs)
        tensor_type = self._tensor_type
        if tensor_type is None:
            import torch
            tensor_type = torch.Tensor
        positions = [i for i, value in enumerate(values)
                     if isinstance(value, tensor_type) or (value is None and not self.params[i].is_constexpr)]
        template = [None if i in positions else value for i, value in enumerate(values)]

        def fallback(*tensors):
            if len(tensors) != len(positions):     # as the GPU's prepared(t0, t1, ...) refuses another count
                taken = ", ".join(self.params[i].name for i in positions)
                raise TypeError(f"the prepared launch of `{self.__name__}` takes {len(positions)} tensors ({taken}), "
                                f"got {len(tensors)}")
            call = list(template)
            for position, tensor in zip(positions, tensors):
                call[position] = tensor
            keywords = {p.name: value for p, value in zip(self.params, call) if p.kind == "keyword_only"}
            call = [value for p, value in zip(self.params, call) if p.kind != "keyword_only"]
            self.run(grid, *call, num_warps=num_warps, num_stages=num_stages, interpret=interpret, **keywords)

        try:
            num_warps, num_stages = check_num_warps(num_warps, num_stages, self.__name__)
            launch_grid = grid(self._meta(args, kwargs, num_warps, num_stages)) if callable(grid) else grid
            launch_grid = normalize_grid(launch_grid, self.__name__)
            if interpret:
                entry, _, _ = self._lookup(values, num_warps, num_stages, "interpreter")   # checks the arguments
                check_cluster_grid(launch_grid, cluster_size(entry.kernel.function), self.__name__)
                return fallback
            entry, runtime, device_index = self._lookup(values, num_warps, num_stages, "cuda")
            check_cluster_grid(launch_grid, entry.compiled.cluster_size, self.__name__)
        except (CompilationError, InterpreterError) as error:
            raise error.with_traceback(None) from None
        if 0 in launch_grid:
            return fallback
        # A tensor is always a runtime argument (a pointer), None never; `checked`: the tensors that
        # were 16-byte aligned, as the kernel is specialized on.
        slots = [runtime.index(i) if values[i] is not None else None for i in positions]
        checked = [n for n, i in enumerate(positions) if values[i] is not None
                   and not self.params[i].do_not_specialize and values[i].data_ptr() & 15 == 0]
        for position in positions:
            values[position] = None     # the prepared launch must not keep the tensors alive
        return make_prepared(entry.compiled.launcher(device_index), device_index, launch_grid,
                             [values[i] for i in runtime], slots, checked, entry.kernel.used_globals, fallback)

    def max_active_clusters(self, *args, num_warps: int = 4, num_stages: int = 3, **kwargs) -> int:
        """How many clusters (`dsl.cluster_dims`; programs, for a kernel without) of this kernel, compiled
        for these arguments as a launch would compile it, run at once on the arguments' CUDA device
        (`driver.max_active_clusters`): what a persistent grid sizes itself by.

        Raises: what `run` raises for these arguments on the GPU path; LaunchError where the driver
        rejects the query.
        """
        values = self._bind(args, kwargs)
        import torch
        if not any(isinstance(value, torch.Tensor) and value.is_cuda for value in values):
            raise ValueError(f"max_active_clusters of kernel `{self.__name__}` asks a GPU's driver: give it the "
                             f"CUDA tensors of a launch (it has no interpreter mode)")
        try:
            num_warps, num_stages = check_num_warps(num_warps, num_stages, self.__name__)
            entry, _, device_index = self._lookup(values, num_warps, num_stages, "cuda")
        except (CompilationError, InterpreterError) as error:
            raise error.with_traceback(None) from None
        from .driver import max_active_clusters
        launcher = entry.compiled.launcher(device_index)
        while not hasattr(launcher, "kernel"):      # a wrapper (tensor maps) of the KernelLauncher
            launcher = launcher.launcher
        return max_active_clusters(launcher.kernel, entry.compiled.launch_warps, entry.compiled.shared_bytes,
                                   entry.compiled.cluster_size)

    def _meta(self, args: tuple, kwargs: dict, num_warps: int, num_stages: int) -> dict:
        """The meta-parameters a grid callable sees: every argument by name, and the launch options."""
        values = self._bind(args, kwargs)
        meta = {p.name: (v.value if isinstance(v, core.constexpr) else v) for p, v in zip(self.params, values)}
        meta.update(num_warps=num_warps, num_stages=num_stages)
        return meta

    def _run(self, grid, args, kwargs, num_warps, num_stages, interpret, launch_key=None) -> None:
        # The full path: every check, compiling on a cache miss; a GPU launch then records its plan
        # (under `launch_key`, the entry's; the first GPU launch computes it with the binder).
        name = self.__name__
        values = self._bind(args, kwargs)
        num_warps, num_stages = check_num_warps(num_warps, num_stages, name)
        check_interpret(interpret, name)
        if callable(grid):
            grid = grid(self._meta(args, kwargs, num_warps, num_stages))
        grid = normalize_grid(grid, name)
        if interpret:
            entry, runtime, _ = self._lookup(values, num_warps, num_stages, "interpreter")
            if entry.interpreter is None:
                from ..interpreter import Interpreter
                entry.interpreter = Interpreter(entry.kernel.function)
            if 0 not in grid:
                entry.interpreter.launch(grid, [values[i] for i in runtime], kernel_name=name)
            return
        import torch

        entry, runtime, device_index = self._lookup(values, num_warps, num_stages, "cuda")
        if self._tensor_type is None:
            self._tensor_type = torch.Tensor
            self._binder = make_binder(self.params, torch.Tensor)
            name = self.__name__
            self._launch_entry = make_entry(name, self.params, torch.Tensor, self._plans, _interpret_enabled,
                                            lambda grid: normalize_grid(grid, name), self._meta_of_values,
                                            self._slow, sample=values)
            try:
                launch_key = self._binder(num_warps, num_stages, *args, **kwargs)[0] if self._binder else None
            except TypeError:
                launch_key = None
        # No plan for a launch without tensor arguments: it runs on the current device, which may change.
        if launch_key is not None and any(isinstance(values[i], torch.Tensor) for i in runtime):
            self._plans[launch_key] = self._plan(entry, runtime, device_index)
        if 0 in grid:
            return
        addresses = [v.data_ptr() if isinstance(v, torch.Tensor) else v for v in (values[i] for i in runtime)]
        entry.compiled.launch(grid, addresses, None, device_index=device_index)

    def _plan(self, entry: _Entry, runtime: tuple, device_index: int) -> Callable:
        """The plan of a launch whose runtime arguments are the parameters at indices `runtime` (the
        entry's values are every non-constexpr parameter's, see `fast_path.make_binder`)."""
        collected = [i for i in range(len(self.params)) if not self._is_constexpr[i]]
        return make_plan(entry.compiled.launcher(device_index), device_index, len(collected),
                         [collected.index(i) for i in runtime], entry.kernel.used_globals)

    def _lookup(self, values: list, num_warps: int, num_stages: int, backend: str):
        """(entry, indices of the runtime arguments, CUDA device index) for a launch on `backend`
        ("cuda" or "interpreter"): checks the arguments and their devices, computes the
        `SpecializationKey` and the target architecture, and compiles when that key is new."""
        specs = specialize(self.__name__, self.params, values)
        runtime = tuple(i for i, spec in enumerate(specs) if spec.is_runtime)
        if backend != "cuda":
            return self._entry(SpecializationKey(specs, num_warps, num_stages, None)), runtime, None
        import torch

        device = cuda_device(self.__name__, self.params, values)
        if device is None:      # no tensor arguments: the current CUDA device (a LaunchError without one)
            from .driver import require_gpu
            device = torch.device("cuda", require_gpu(None))
        key = SpecializationKey(specs, num_warps, num_stages, knobs.current().default_arch or device_arch(device))
        return self._compiled_entry(key, missing_ok=False), runtime, device.index

    # -- ahead-of-time compilation and IR ----------------------------------------------------------
    def compile(self, *args, target: str = "", num_warps: int = 4, num_stages: int = 3, **kwargs):
        """Compile for `target` ("sm_80", "sm_90", "sm_90a"; "", the default: FUSEDOPS_DEFAULT_ARCH, else sm_90a)
        with no GPU needed; args may be tensors (any device), Python scalars or dsl types
        (`dsl.pointer_type(dsl.float16)`, `dsl.int32`). Returns the compiled kernel, whose `.asm["ir"]` is the
        frontend's IR text (and, with the GPU compiler, more dumps)."""
        try:
            target = target if target != "" else (knobs.current().default_arch or "sm_90a")
            check_arch(target)
            num_warps, num_stages = check_num_warps(num_warps, num_stages, self.__name__)
            specs = specialize(self.__name__, self.params, self._bind(args, kwargs), allow_types=True)
            key = SpecializationKey(specs, num_warps, num_stages, target)
            entry = self._compiled_entry(key, missing_ok=True)
            asm = getattr(entry.compiled, "asm", None)
            if isinstance(asm, dict) and "ir" not in asm:
                asm["ir"] = print_function(entry.kernel.function)
            return entry.compiled
        except CompilationError as error:
            raise error.with_traceback(None) from None

    def ir(self, *args, num_warps: int = 4, num_stages: int = 3, **kwargs) -> Function:
        """The frontend's IR for these arguments (tensors, scalars or dsl types, and constexprs)."""
        try:
            num_warps, num_stages = check_num_warps(num_warps, num_stages, self.__name__)
            specs = specialize(self.__name__, self.params, self._bind(args, kwargs), allow_types=True)
            return self._entry(SpecializationKey(specs, num_warps, num_stages, None)).kernel.function
        except CompilationError as error:
            raise error.with_traceback(None) from None

    # -- internals ---------------------------------------------------------------------------------
    def _bind(self, args: tuple, kwargs: dict) -> list:
        return bind_parameters(self.params, args, kwargs, f"kernel `{self.__name__}`", TypeError, listing=True)

    def _entry(self, key: SpecializationKey) -> _Entry:
        entry = self._cache.get(key)
        if entry is None or not entry.kernel.globals_unchanged():
            with self._compile_lock:
                entry = self._cache.get(key)
                if entry is None or not entry.kernel.globals_unchanged():
                    from ..frontend import generate
                    entry = self._cache[key] = _Entry(generate(self, key.args))
        return entry

    def _compiled_entry(self, key: SpecializationKey, missing_ok: bool) -> _Entry:
        """The entry of GPU key `key`, compiled once however many threads ask at the same time. A compile that
        raises (or is interrupted: KeyboardInterrupt) drops the entry: the passes rewrite its IR in place, so the
        next attempt starts again from the frontend (compiling the half-rewritten IR gave other code, or a raw
        internal error)."""
        entry = self._entry(key)
        if entry.compiled is None:
            with self._compile_lock:
                entry = self._entry(key)
                if entry.compiled is None:
                    try:
                        entry.compiled = self._compile_ir(entry.kernel.function, key, missing_ok=missing_ok)
                    except BaseException:
                        if self._cache.get(key) is entry:
                            del self._cache[key]
                        raise
        return entry

    def _compile_ir(self, function: Function, key: SpecializationKey, missing_ok: bool):
        try:
            compiler = importlib.import_module("fusedops.dsl.compiler")
        except ModuleNotFoundError as e:
            if e.name != "fusedops.dsl.compiler":
                raise
            if missing_ok:
                return FrontendOnlyKernel(self.__name__, function, {"ir": print_function(function)})
            raise UnsupportedError(f"cannot compile `{self.__name__}` for the GPU: the GPU compiler "
                                   "(fusedops.dsl.compiler) is not available; run it in the interpreter with "
                                   "FUSEDOPS_INTERPRET=1 or interpret=True") from None
        options = compiler.CompileOptions(arch=key.arch, num_warps=key.num_warps, num_stages=key.num_stages,
                                          fp_fusion=self._enable_fp_fusion)
        try:
            return compiler.compile_function(function, options)
        except NotImplementedError as e:
            raise UnsupportedError(f"compiling `{self.__name__}` for {key.arch} is not supported yet: {e}") from None


def jit(fn=None, *, do_not_specialize=(), enable_fp_fusion: bool = False):
    """Decorate a kernel: `@dsl.jit` or `@dsl.jit(do_not_specialize=["n"], enable_fp_fusion=True)`.

    do_not_specialize: parameter names (or indices) whose int values are not specialized on being 1
    or divisible by 16 (one compiled kernel for all their values).
    enable_fp_fusion: the compiled kernel may contract a floating-point multiply and the add or subtract it
    feeds (elementwise, or the first step of a `sum`) into one FMA, rounded once (Triton's option of the same
    name, whose default is True). Off (the default), every operation rounds as written, as the interpreter
    computes: compiled and interpreted results then agree bit for bit. Fewer instructions and a more accurate
    product-sum, but a value may differ from the unfused one in its last bits, and an expression such as
    a * b - a * b need not be 0. The kernel's setting covers the helpers it calls (theirs is not read).
    Raises TypeError for a non-bool.
    """
    if fn is None:
        return lambda f: JITFunction(f, do_not_specialize, enable_fp_fusion)
    return JITFunction(fn, do_not_specialize, enable_fp_fusion)
