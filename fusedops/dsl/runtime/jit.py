"""`@dsl.jit`: the kernel object users launch as `kernel[grid](*args, **constexprs)`.

A `JITFunction` binds a launch's arguments to its parameters, computes the `SpecializationKey`
(signature.py), and keeps per key the frontend's IR and, for the GPU, the compiled kernel. It then
runs the IR in the NumPy interpreter (`interpret=True` or FUSEDOPS_INTERPRET=1; CPU and CUDA tensors)
or launches the compiled kernel on the tensors' device and current stream.

Compilation errors are re-raised from here without the compiler's frames: the error's message
points at the kernel source (file:line:col, the line and a caret).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
from typing import Optional

from ..errors import CompilationError, InterpreterError, UnsupportedError
from ..ir import Function, print_function
from ..language import core
from . import knobs
from .launcher import check_arch, check_num_warps, cuda_device, device_arch, normalize_grid
from .signature import NO_DEFAULT, Parameter, SpecializationKey, fingerprint, specialize

_RESERVED = ("num_warps", "num_stages", "interpret", "target", "grid")
_MISSING = object()


def _is_constexpr_annotation(annotation) -> bool:
    if annotation is core.constexpr:
        return True
    return isinstance(annotation, str) and (annotation == "constexpr" or annotation.endswith(".constexpr"))


def _parameters(fn, do_not_specialize) -> tuple:
    signature = inspect.signature(fn)
    names = list(signature.parameters)
    skip = {names[i] if isinstance(i, int) else i for i in do_not_specialize}
    unknown = skip - set(names)
    if unknown:
        raise TypeError(f"do_not_specialize names {sorted(unknown)}, which are not parameters of `{fn.__name__}`")
    params = []
    for p in signature.parameters.values():
        if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            raise TypeError(f"`{fn.__name__}`: kernels cannot take *args or **kwargs (parameter `{p.name}`)")
        if p.name in _RESERVED:
            raise TypeError(f"`{fn.__name__}`: the parameter name `{p.name}` is reserved for launch options")
        default = p.default if p.default is not p.empty else NO_DEFAULT
        params.append(Parameter(p.name, _is_constexpr_annotation(p.annotation), default, p.name in skip))
    return tuple(params)


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


class JITFunction:
    """A kernel (or a helper called from kernels) written in the kernel language."""

    __dsl_jit__ = True

    def __init__(self, fn, do_not_specialize=()):
        if not inspect.isfunction(fn):
            raise TypeError(f"@dsl.jit decorates a Python function, got {type(fn).__name__}")
        self.fn = fn
        functools.update_wrapper(self, fn)
        self.params = _parameters(fn, do_not_specialize)
        self._index = {p.name: i for i, p in enumerate(self.params)}
        self._source = None
        self._cache: dict = {}      # SpecializationKey -> _Entry
        self._fast: dict = {}       # (fingerprint, options, backend) -> (_Entry, runtime indices, device index)

    def __repr__(self) -> str:
        return f"<dsl.jit {self.fn.__module__}.{self.fn.__qualname__}>"

    @property
    def source(self):
        """The parsed source (frontend.SourceInfo), read on first use."""
        if self._source is None:
            from ..frontend import parse_function
            self._source = parse_function(self.fn)
        return self._source

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"`{self.__name__}` is a @dsl.jit function: launch it with {self.__name__}[grid](...) "
                           "or call it from another @dsl.jit function")

    # -- launching ---------------------------------------------------------------------------------
    def __getitem__(self, grid):
        """`kernel[grid]`: the launcher; grid is a tuple of 1-3 ints or a callable of the meta-parameters."""
        return functools.partial(self.run, grid)

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
        try:
            self._run(grid, args, kwargs, num_warps, num_stages, interpret)
        except (CompilationError, InterpreterError) as error:
            raise error.with_traceback(None) from None

    def _run(self, grid, args, kwargs, num_warps, num_stages, interpret) -> None:
        name = self.__name__
        values = self._bind(args, kwargs)
        check_num_warps(num_warps, num_stages, name)
        if interpret is None:
            interpret = knobs.interpret_enabled()
        if callable(grid):
            meta = {p.name: (v.value if isinstance(v, core.constexpr) else v) for p, v in zip(self.params, values)}
            meta.update(num_warps=num_warps, num_stages=num_stages)
            grid = grid(meta)
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
        if 0 in grid:
            return
        addresses = [v.data_ptr() if isinstance(v, torch.Tensor) else v for v in (values[i] for i in runtime)]
        entry.compiled.launch(grid, addresses, None, device_index=device_index)

    def _lookup(self, values: list, num_warps: int, num_stages: int, backend: str):
        """(entry, indices of the runtime arguments, CUDA device index) for a launch on `backend`
        ("cuda" or "interpreter").

        A launch first looks up a cheap fingerprint of its arguments (which includes each tensor's
        device); only a miss checks the devices, computes the `SpecializationKey` and the target
        architecture, and compiles when that key is new.
        """
        print_key = fingerprint(self.params, values)
        fast_key = (print_key, num_warps, num_stages, backend)
        try:
            hit = self._fast.get(fast_key) if print_key is not None else None
        except TypeError:      # an unhashable constexpr (a list): `specialize` converts or explains
            print_key = hit = None
        if hit is not None and hit[0].kernel.globals_unchanged():
            return hit
        specs = specialize(self.__name__, self.params, values)
        if backend == "cuda":
            import torch

            device = cuda_device(self.__name__, self.params, values)
            if device is None:
                device = torch.device("cuda", torch.cuda.current_device())
            key = SpecializationKey(specs, num_warps, num_stages, knobs.current().default_arch or device_arch(device))
            entry = self._entry(key)
            if entry.compiled is None:
                entry.compiled = self._compile_ir(entry.kernel.function, key, missing_ok=False)
            device_index = device.index
        else:
            entry = self._entry(SpecializationKey(specs, num_warps, num_stages, None))
            device_index = None
        hit = (entry, tuple(i for i, spec in enumerate(specs) if spec.is_runtime), device_index)
        if print_key is not None:
            self._fast[fast_key] = hit
        return hit

    # -- ahead-of-time compilation and IR ----------------------------------------------------------
    def compile(self, *args, target: str = "sm_90a", num_warps: int = 4, num_stages: int = 3, **kwargs):
        """Compile for `target` with no GPU needed; args may be tensors (any device), Python scalars or
        dsl types (`dsl.pointer_type(dsl.float16)`, `dsl.int32`). Returns the compiled kernel, whose
        `.asm["ir"]` is the frontend's IR text (and, with the GPU compiler, more dumps)."""
        try:
            check_arch(target)
            check_num_warps(num_warps, num_stages, self.__name__)
            specs = specialize(self.__name__, self.params, self._bind(args, kwargs), allow_types=True)
            key = SpecializationKey(specs, num_warps, num_stages, target)
            entry = self._entry(key)
            if entry.compiled is None:
                entry.compiled = self._compile_ir(entry.kernel.function, key, missing_ok=True)
            asm = getattr(entry.compiled, "asm", None)
            if isinstance(asm, dict) and "ir" not in asm:
                asm["ir"] = print_function(entry.kernel.function)
            return entry.compiled
        except CompilationError as error:
            raise error.with_traceback(None) from None

    def ir(self, *args, num_warps: int = 4, num_stages: int = 3, **kwargs) -> Function:
        """The frontend's IR for these arguments (tensors, scalars or dsl types, and constexprs)."""
        try:
            specs = specialize(self.__name__, self.params, self._bind(args, kwargs), allow_types=True)
            return self._entry(SpecializationKey(specs, num_warps, num_stages, None)).kernel.function
        except CompilationError as error:
            raise error.with_traceback(None) from None

    # -- internals ---------------------------------------------------------------------------------
    def _bind(self, args: tuple, kwargs: dict) -> list:
        params, name = self.params, self.__name__
        if len(args) > len(params):
            raise TypeError(f"kernel `{name}` takes {len(params)} arguments ({', '.join(p.name for p in params)}) "
                            f"but {len(args)} were given")
        values = list(args) + [_MISSING] * (len(params) - len(args))
        for key, value in kwargs.items():
            index = self._index.get(key)
            if index is None:
                raise TypeError(f"kernel `{name}` got an unexpected keyword argument `{key}`; its parameters are "
                                f"{', '.join(p.name for p in params)}")
            if values[index] is not _MISSING:
                raise TypeError(f"kernel `{name}` got multiple values for argument `{key}`")
            values[index] = value
        for index, param in enumerate(params):
            if values[index] is _MISSING:
                if not param.has_default:
                    raise TypeError(f"kernel `{name}` is missing argument `{param.name}`")
                values[index] = param.default
        return values

    def _entry(self, key: SpecializationKey) -> _Entry:
        entry = self._cache.get(key)
        if entry is None or not entry.kernel.globals_unchanged():
            from ..frontend import generate
            entry = self._cache[key] = _Entry(generate(self, key.args))
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
        options = compiler.CompileOptions(arch=key.arch, num_warps=key.num_warps, num_stages=key.num_stages)
        try:
            return compiler.compile_function(function, options)
        except NotImplementedError as e:
            raise UnsupportedError(f"compiling `{self.__name__}` for {key.arch} is not supported yet: {e}") from None


def jit(fn=None, *, do_not_specialize=()):
    """Decorate a kernel: `@dsl.jit` or `@dsl.jit(do_not_specialize=["n"])`.

    do_not_specialize: parameter names (or indices) whose int values are not specialized on being 1
    or divisible by 16 (one compiled kernel for all their values).
    """
    if fn is None:
        return lambda f: JITFunction(f, do_not_specialize)
    return JITFunction(fn, do_not_specialize)
