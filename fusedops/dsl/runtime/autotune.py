"""`dsl.autotune(configs, key)`: pick the fastest launch configuration of a kernel per problem key.

    @dsl.autotune(configs=[dsl.Config({"BLOCK_M": 128, "BLOCK_N": 128}, num_warps=4, num_stages=3), ...],
                  key=["M", "N", "K"])
    @dsl.jit
    def kernel(..., M, N, K, BLOCK_M: dsl.constexpr, BLOCK_N: dsl.constexpr): ...

    kernel[grid](...)          # grid may be a function of the meta-parameters, as for @dsl.jit

On the first launch with a new key (the values of the `key` arguments, defaults included, a tensor's
shape and dtype; the dtypes of the tensor arguments; the device), every config is launched with the
real arguments and timed with CUDA events, in TUNING_ROUNDS rounds that each time every config in
turn (a clock or power change during the search falls on all of them alike), each launch timed
alone; a config's time is the median of its launches. The fastest is used from then on and
recorded, through an atomic write, in a JSON file in the cache directory
($FUSEDOPS_CACHE_DIR/autotune/; merged under a file lock, so processes tuning at once keep each
other's entries), so later processes skip the search. A config whose compilation or launch fails
(e.g. it needs more shared memory than the device has) is skipped, not fatal, and one whose kernel
spills registers to local memory is chosen only when every config spills.
In the interpreter the first config whose kernel compiles is used without timing (times mean nothing
there). A key may not name a constexpr the configs set (TypeError).

Tuning launches the kernel several times on the caller's arguments. A kernel that accumulates into
an argument (atomic adds, `out += ...`) names it: `reset_to_zero=["out"]` zeroes those tensors before
every tuning launch and after the search (the real launch then starts from zeros, as a first launch
from a zeroed buffer does); `restore_value=["x"]` saves those tensors before the search and copies
them back before every tuning launch and after it (the real launch sees the caller's values). Those
copies and zeroings run in inference mode, so they take tensors that require grad (an nn.Parameter that
an in-place kernel updates) and inference tensors, as the kernel's own writes do. A new key cannot be
tuned while a CUDA graph is being captured (timing synchronizes the stream): that launch raises
LaunchError; launch once before the capture (a key already tuned, or recorded on disk, launches as usual).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import statistics
import sys
import tempfile
import threading
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence

from ..errors import CompilationError, LaunchError, UnsupportedError
from . import knobs
from .jit import attribute_at
from .launcher import warps_and_stages_problem

TUNING_WARMUP = 2       # untimed launches of a config before its first round
TUNING_ROUNDS = 4       # rounds over the configs (see the module docstring)
TUNING_REPS = 5         # timed launches of a config per round
RECORD_LOCK_SECONDS = 10   # how long a process waits for another's write of the record before giving up on its own
HOST_LEAD_CYCLES = 200_000  # GPU clock cycles of sleep queued per timed launch (~0.1 ms, `time_launches`)
_SKIPPED = (CompilationError, LaunchError, UnsupportedError)
_MAX_NAME = 150     # bytes (UTF-8) of the kernel's module.qualname kept in its record's file name


@dataclasses.dataclass(frozen=True)
class Config:
    """One launch configuration: constexpr values (`kwargs`), num_warps and num_stages."""

    kwargs: Mapping
    num_warps: int = 4
    num_stages: int = 3

    def __post_init__(self):
        """Raises ValueError for num_warps other than a power of two from 1 to 32 or num_stages below 1
        (found here, not when autotuning skips the config)."""
        problem = warps_and_stages_problem(self.num_warps, self.num_stages)
        if problem is not None:
            raise ValueError(f"Config: {problem[0]} {problem[1]}")
        object.__setattr__(self, "kwargs", tuple(sorted(dict(self.kwargs).items())))

    @property
    def constexprs(self) -> dict:
        return dict(self.kwargs)

    def __str__(self) -> str:
        values = ", ".join(f"{k}={v}" for k, v in self.kwargs)
        return f"Config({values}, num_warps={self.num_warps}, num_stages={self.num_stages})"


@dataclasses.dataclass(frozen=True)
class Measurement:
    """The outcome of trying one config: its time in ms and whether it spills registers, or why it
    was skipped (ms is None then)."""

    config: Config
    ms: Optional[float]
    spills: bool = False
    skipped: Optional[str] = None


def _index_of(configs, config) -> int:
    """`config`'s position in `configs`, by identity first: two configs may compare equal yet compile different
    code (constexprs 0.0 and -0.0, 1 and True), and the record must name the one chosen; else by equality."""
    for index, candidate in enumerate(configs):
        if candidate is config:
            return index
    return configs.index(config)


def _read_record(path: Path) -> dict:
    """The {launch key: config index} entries of the autotune record at `path`; {} for a file that does not
    parse or parses to something else than an object (written by another tool). Raises OSError."""
    try:
        record = json.loads(path.read_text())
    except (ValueError, RecursionError):     # RecursionError: JSON nested past the parser's depth
        return {}
    if not isinstance(record, dict):
        return {}
    return {key: index for key, index in record.items() if type(index) is int}     # not bools


class Autotuner:
    """A kernel wrapped by `autotune`; launch it as `tuner[grid](*args, **kwargs)`.

    `best` maps a key to the chosen Config; `measurements` to what tuning measured (this process).
    """

    def __init__(self, fn, configs: Sequence[Config], key: Sequence[str], reset_to_zero: Sequence[str] = (),
                 restore_value: Sequence[str] = ()):
        from .jit import JITFunction
        if not isinstance(fn, JITFunction):
            raise TypeError(f"dsl.autotune decorates a @dsl.jit kernel, got {fn!r}")
        configs = tuple(configs)        # (read once: a generator would be used up by the checks below)
        if not configs:
            raise ValueError("autotune needs at least one Config")
        wrong = [c for c in configs if not isinstance(c, Config)]
        if wrong:
            raise TypeError(f"autotune configs must be dsl.Config objects, got {wrong[0]!r}")
        names = [p.name for p in fn.params]
        self.fn = fn
        self.configs = configs
        self.key = _argument_names("key", key, fn, names)
        self._tuned = frozenset({"num_warps", "num_stages"}.union(*(c.constexprs for c in self.configs)))
        tuned_keys = [name for name in self.key if name in self._tuned]
        if tuned_keys:
            raise TypeError(f"autotune key names {tuned_keys}, which the configs set (a launch does not pass them): "
                            "key on the problem's arguments instead")
        self._defaults = {p.name: p.default for p in fn.params if p.has_default}
        self._names = names
        self.reset_to_zero = _argument_names("reset_to_zero", reset_to_zero, fn, names)
        self.restore_value = _argument_names("restore_value", restore_value, fn, names)
        self.best: dict = {}
        self.measurements: dict = {}
        self._lock = threading.Lock()
        self._loaded = False
        self._recorded: set = set()     # keys whose `best` came from the on-disk record, not this process

    def __repr__(self) -> str:
        return f"<dsl.autotune {self.fn!r}, {len(self.configs)} configs>"

    def __reduce__(self):
        """Pickled (and deep-copied) as the kernel is: by reference, where its module binds the kernel's name to this
        tuner (`@dsl.autotune(...)` over `@dsl.jit`); else as a new tuner of the same kernel (pickled by reference),
        configs and options, which reads the on-disk record again (`tuned = dsl.autotune(...)(kernel)`)."""
        module = sys.modules.get(self.fn.fn.__module__)
        if attribute_at(module, self.fn.fn.__qualname__) is self:
            return _by_name, (self.fn.fn.__module__, self.fn.fn.__qualname__)
        return Autotuner, (self.fn, self.configs, self.key, self.reset_to_zero, self.restore_value)

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.run(grid, *args, **kwargs)

    # -- keys and the on-disk record ----------------------------------------------------------------
    def key_of(self, args: Sequence, kwargs: Mapping) -> str:
        """The tuning key of a launch: key argument values, tensor dtypes, device."""
        values = dict(self._defaults)
        values.update(zip(self._names, args))
        values.update(kwargs)
        parts = [f"{name}={_key_part(values.get(name))}" for name in self.key]
        device = "cpu"
        for name in self._names:
            value = values.get(name)
            if hasattr(value, "dtype") and hasattr(value, "data_ptr"):
                parts.append(f"{name}:{value.dtype}")
                device = str(value.device)
        parts.append(_device_name(device) if device.startswith("cuda") else device)
        return "|".join(parts)

    def _record_path(self) -> Optional[Path]:
        settings = knobs.current()
        if settings.disable_cache:
            return None
        try:
            source = "".join(self.fn.source.lines)
        except (OSError, TypeError, AttributeError):    # no retrievable source: name and configs only
            source = ""
        # the compiler's version and the settings that change the compiled code are part of the record's name:
        # a choice timed on other code is not reused (as in the kernel cache's key)
        from ... import __version__
        from .cache import compiler_fingerprint

        compiled_by = (__version__, compiler_fingerprint(), settings.default_arch, settings.disable_wgmma,
                       settings.tma, settings.ws)
        text = source + "\n".join(map(str, self.configs)) + repr(compiled_by)
        digest = hashlib.sha256(text.encode()).hexdigest()[:16]
        name = f"{self.fn.fn.__module__}.{self.fn.fn.__qualname__}"
        if len(name.encode()) > _MAX_NAME:    # a file name has at most 255 bytes: the rest of a long name as a hash
            kept = name.encode()[:_MAX_NAME].decode(errors="ignore")
            name = f"{kept}~{hashlib.sha256(name.encode()).hexdigest()[:16]}"
        return Path(settings.cache_dir).expanduser() / "autotune" / f"{name}-{digest}.json"

    def _recorded_config(self, key: str) -> Optional[Config]:
        """The config chosen for `key` in this process or recorded on disk (read once), else None. The caller
        holds self._lock."""
        if not self._loaded:
            self._load_record()
        return self.best.get(key)

    def _load_record(self) -> None:
        self._loaded = True
        path = self._record_path()
        try:
            if path is None or not path.is_file():
                return
            record = _read_record(path)
        except OSError:     # unreadable: the keys are tuned again
            return
        for key, index in record.items():
            if 0 <= index < len(self.configs) and key not in self.best:
                self.best[key] = self.configs[index]
                self._recorded.add(key)

    def _save_record(self) -> None:
        path = self._record_path()
        if path is None:
            return
        import filelock

        record = {key: _index_of(self.configs, config) for key, config in self.best.items()}
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            # read-merge-replace under a lock: two processes tuning at once keep both their entries
            locks = path.parent.with_name(path.parent.name + ".locks")     # beside the records, not among them
            locks.mkdir(exist_ok=True)
            with filelock.FileLock(str(locks / (path.name + ".lock")), timeout=RECORD_LOCK_SECONDS):
                if path.is_file():
                    record = {**_read_record(path), **record}
                handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".autotune-", suffix=".json")
                try:
                    with os.fdopen(handle, "w") as file:
                        json.dump(record, file, indent=1, sort_keys=True)
                    os.replace(temporary, path)
                except BaseException:
                    os.unlink(temporary)
                    raise
        except (OSError, filelock.Timeout):
            pass      # an unwritable (or long-locked) cache only costs a re-tune in the next process

    # -- choosing ------------------------------------------------------------------------------------
    def select(self, key: str, measure: Callable[[Config], tuple]) -> Config:
        """The config for `key`: recorded, or the fastest by the median of `measure(config) -> (ms, spills)`
        over TUNING_ROUNDS rounds (each measuring every config in turn), preferring configs that do not
        spill registers; a config whose measure raises a compilation/launch error is skipped from then
        on. Records the choice."""
        with self._lock:
            found = self._recorded_config(key)
            if found is not None:
                return found
            # by position: a config's constexpr values may be unhashable (lists)
            times = [[] for _ in self.configs]
            spilled, skipped = {}, {}
            for _ in range(TUNING_ROUNDS):
                for index, config in enumerate(self.configs):
                    if index in skipped:
                        continue
                    try:
                        ms, spills = measure(config)
                    except _SKIPPED as error:
                        skipped[index] = f"{type(error).__name__}: {(str(error).splitlines() or [''])[0]}"
                        continue
                    times[index].append(float(ms))
                    spilled[index] = bool(spills)
            results = [Measurement(config, None, skipped=skipped[index]) if index in skipped
                       else Measurement(config, statistics.median(times[index]), spilled[index])
                       for index, config in enumerate(self.configs)]
            self.measurements[key] = results
            timed = [m for m in results if m.ms is not None]
            if not timed:
                reasons = "; ".join(f"{m.config}: {m.skipped}" for m in results)
                raise LaunchError(f"autotune of `{self.fn.__name__}`: no config could run ({reasons})")
            best = min(timed, key=lambda m: (m.spills, m.ms)).config
            self.best[key] = best
            self._save_record()
            return best

    def run(self, grid, *args, interpret: Optional[bool] = None, **kwargs):
        """Launch with the best config for this launch's key (tuning it first if needed)."""
        conflicts = sorted(self._tuned.intersection(kwargs))
        if conflicts:
            raise TypeError(f"`{conflicts[0]}` is set by the autotune Configs of `{self.fn.__name__}`; a launch "
                            "may not also pass it")
        if interpret is None:
            interpret = knobs.current().interpret
        if interpret:
            config = self._interpreter_config(args, kwargs)
        else:
            key = self.key_of(args, kwargs)
            config = self.best.get(key) or self._tune(key, grid, args, kwargs)
            if key in self._recorded:
                config = self._checked_record(key, config, grid, args, kwargs)
        self.fn.run(grid, *args, num_warps=config.num_warps, num_stages=config.num_stages, interpret=interpret,
                    **kwargs, **config.constexprs)

    def _checked_record(self, key: str, config: Config, grid, args, kwargs) -> Config:
        """`config`, recorded on disk for `key`, once its kernel compiles for these arguments; else the config
        tuned afresh. The record is keyed by the kernel's name and source, so it may come from a kernel of that
        name whose code differed (one factory's other kernel, a helper edited since): a config that kernel
        could compile and this one cannot is not an answer."""
        try:
            self.fn.ir(*args, num_warps=config.num_warps, num_stages=config.num_stages, **kwargs, **config.constexprs)
        except _SKIPPED:
            with self._lock:
                if self.best.get(key) is config:
                    del self.best[key]
            config = self._tune(key, grid, args, kwargs)
        self._recorded.discard(key)
        return config

    def _interpreter_config(self, args, kwargs) -> Config:
        """The first config whose kernel compiles for these arguments (the interpreter times nothing); raises
        the first config's error when none does."""
        errors = []
        for config in self.configs:
            try:
                self.fn.ir(*args, num_warps=config.num_warps, num_stages=config.num_stages, **kwargs,
                           **config.constexprs)
            except _SKIPPED as error:
                errors.append(error)
                continue
            return config
        raise errors[0]

    def _tune(self, key: str, grid, args, kwargs) -> Config:
        """`select` for `key` by timing launches of each config on these arguments; the tensors named by
        reset_to_zero / restore_value are zeroed / restored before each launch and after the search. A
        config `select` finds recorded (no launch) leaves them alone, as a key tuned earlier does. The timing runs
        with the CUDA tensors' device current, where the launches go (whatever device is current at the call).

        The copies, restores and zeroings are not recorded by autograd (inference mode): the kernel writes
        its tensors whether they require grad (an nn.Parameter an in-place kernel updates) or are
        inference tensors, and so may tuning.

        Raises:
            LaunchError: the key must be timed while a CUDA graph is being captured on the current stream
                (timing synchronizes, which would invalidate the capture): launch once before capturing.
        """
        import torch

        values = dict(zip(self._names, args))
        values.update(kwargs)
        with self._lock:
            recorded = self._recorded_config(key) is not None
        if not recorded and _capturing(values.values()):
            raise LaunchError(f"autotune of `{self.fn.__name__}` must time its configs for the new key {key!r}, "
                              "which it cannot do while a CUDA graph is being captured (timing synchronizes the "
                              "stream): launch the kernel once with arguments of this key before the capture")
        zeroed = [values[name] for name in self.reset_to_zero if _is_tensor(values.get(name))]
        saved = []          # (tensor, its copy), taken before the first timed launch

        def reset():        # (a tensor named by both is zeroed: the restore comes first)
            with torch.inference_mode():
                for tensor, copy in saved:
                    tensor.copy_(copy)
                for tensor in zeroed:
                    tensor.zero_()

        launched = []       # ids: a config's constexpr values may be unhashable

        def measure(config):
            if not launched:
                with torch.inference_mode():
                    saved.extend((values[name], values[name].clone()) for name in self.restore_value
                                 if _is_tensor(values.get(name)))
            first = id(config) not in launched
            launched.append(id(config))
            return self._measure(grid, args, kwargs, config, reset, first)

        device = _cuda_device(values.values()) if torch.cuda.is_available() else None
        try:
            # timed on the tensors' device: CUDA events, the GPU sleep and the synchronize go to the current device's
            # stream, the launches to the tensors' device's (pytorch#122479: tensors off the current device)
            with torch.cuda.device(device) if device is not None else contextlib.nullcontext():
                return self.select(key, measure)
        finally:
            if launched:
                reset()

    def _measure(self, grid, args, kwargs, config: Config, reset: Callable[[], None], first: bool) -> tuple:
        """(median ms of a round of launches of `config`, whether its kernel spills to local memory); the
        `first` round of a config compiles it and adds TUNING_WARMUP untimed launches."""
        def launch():
            self.fn.run(grid, *args, num_warps=config.num_warps, num_stages=config.num_stages, interpret=False,
                        **kwargs, **config.constexprs)

        reset()
        launch()          # compiles, loads and checks the launch (the first time)
        values = self.fn._bind(args, {**kwargs, **config.constexprs})
        entry, _, device_index = self.fn._lookup(values, config.num_warps, config.num_stages, "cuda")
        spills = entry.compiled.launcher(device_index).kernel.local_bytes > 0
        return time_launches(launch, reset, warmup=TUNING_WARMUP if first else 0), spills


def time_launches(launch: Callable[[], object], before: Callable[[], None] = lambda: None, *,
                  warmup: int = TUNING_WARMUP, reps: int = TUNING_REPS) -> float:
    """Median GPU time in ms of `reps` calls of `launch()`, each timed alone by CUDA events after
    `before()` (which is not timed), following `warmup` untimed calls. A GPU sleep queued first keeps
    the stream busy while the host queues the timed calls, so a short kernel's time is the GPU's, not
    the host's launch latency."""
    import torch

    for _ in range(warmup):
        before()
        launch()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    sleep = getattr(torch.cuda, "_sleep", None)
    if sleep is not None:
        sleep(HOST_LEAD_CYCLES * reps)
    for start, end in events:
        before()
        start.record()
        launch()
        end.record()
    events[-1][1].synchronize()
    return statistics.median(start.elapsed_time(end) for start, end in events)


def _capturing(values) -> bool:
    """Whether a CUDA graph is being captured on the current stream of the device of the CUDA tensors
    among `values` (the current device where there are none)."""
    import torch

    if not torch.cuda.is_available():
        return False
    with torch.cuda.device(_cuda_device(values)):
        return torch.cuda.is_current_stream_capturing()


def _cuda_device(values):
    """The device of the first CUDA tensor among `values`, or None."""
    return next((value.device for value in values if _is_tensor(value)
                 and getattr(value, "device", None) is not None and value.device.type == "cuda"), None)


def _key_part(value) -> str:
    """A key argument's part of a tuning key: repr of a scalar; a tensor's shape and dtype (not its contents:
    repr would print them, and copy a CUDA tensor to the host)."""
    if _is_tensor(value) and hasattr(value, "shape"):
        return f"<tensor shape={tuple(value.shape)} {value.dtype}>"
    return repr(value)


def _is_tensor(value) -> bool:
    return hasattr(value, "zero_") and hasattr(value, "data_ptr")


def _argument_names(option: str, names: Sequence[str], fn, parameters: Sequence[str]) -> tuple:
    """`names` as a tuple, checked to be parameter names of `fn`. Raises TypeError."""
    if isinstance(names, str) or not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
        raise TypeError(f"autotune {option} must be a list of the kernel's parameter names, got {names!r}")
    unknown = [n for n in names if n not in parameters]
    if unknown:
        raise TypeError(f"autotune {option} names {unknown}, which are not parameters of `{fn.__name__}`")
    return tuple(names)


def _by_name(module: str, qualname: str):
    """What `module.qualname` names (unpickling a tuner pickled by reference). Raises AttributeError naming a
    missing name."""
    import importlib

    owner = importlib.import_module(module)
    for name in qualname.split("."):
        owner = getattr(owner, name)
    return owner


@functools.lru_cache(maxsize=None)
def _device_name(device: str) -> str:
    import torch

    return torch.cuda.get_device_name(torch.device(device))


def autotune(configs: Sequence[Config], key: Sequence[str], *, reset_to_zero: Sequence[str] = (),
             restore_value: Sequence[str] = ()):
    """Decorate a `@dsl.jit` kernel to pick the fastest of `configs` per value of the `key`
    arguments; `reset_to_zero` / `restore_value` name tensor arguments the kernel accumulates into (see
    the module docstring). Raises TypeError for names that are not parameters."""
    def decorator(fn):
        return Autotuner(fn, configs, key, reset_to_zero, restore_value)
    return decorator
