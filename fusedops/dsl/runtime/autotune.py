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

Triton's other options (autotune_options.py; Triton 3.6's semantics where README, "Coming from Triton", does not
say otherwise):
- `prune_configs_by={"early_config_prune": ..., "perf_model": ..., "top_k": ...}` narrows the configs a new key
  times (in the interpreter: the first of those left that compiles); a single config left is chosen untimed.
  It runs once per key, on that key's first launch: a pruning function that reads arguments outside `key`
  sees only that launch's. A key recorded on disk is not pruned again.
- `Config(..., pre_hook=fn)`: fn(named_args) before every launch of that config (tuning and after).
- `pre_hook` / `post_hook` of the tuner: around every tuning launch, after the zeroing / restoring of
  reset_to_zero / restore_value (which they add to, where Triton's replace them); they, like those copies,
  run outside the timed region.
- `warmup=` / `rep=` (ms) bound the timing by time instead of launch counts; `do_bench=` replaces it.
- `cache_results=False` keeps this tuner's choices off the disk record (the default, True, keeps them).
- `best_config`: the config of the last launch.
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
from .autotune_config import Config
from .autotune_options import TuningHooks, bench_milliseconds, budget_launches, check_options
from .jit import attribute_at

TUNING_WARMUP = 2       # untimed launches of a config before its first round
TUNING_ROUNDS = 4       # rounds over the configs (see the module docstring)
TUNING_REPS = 5         # timed launches of a config per round
RECORD_LOCK_SECONDS = 10   # how long a process waits for another's write of the record before giving up on its own
HOST_LEAD_CYCLES = 200_000  # GPU clock cycles of sleep queued per timed launch (~0.1 ms, `time_launches`)
_SKIPPED = (CompilationError, LaunchError, UnsupportedError)
_MAX_NAME = 150     # bytes (UTF-8) of the kernel's module.qualname kept in its record's file name


@dataclasses.dataclass(frozen=True)
class Measurement:
    """The outcome of trying one config: its time in ms and whether it spills registers, or why it
    was skipped (ms is None then)."""

    config: Config
    ms: Optional[float]
    spills: bool = False
    skipped: Optional[str] = None


def _index_of(configs, config) -> Optional[int]:
    """`config`'s position in `configs`, by identity first: two configs may compare equal yet compile different
    code (constexprs 0.0 and -0.0, 1 and True), and the record must name the one chosen; else by equality; None
    where it is not there (a config early_config_prune made)."""
    for index, candidate in enumerate(configs):
        if candidate is config:
            return index
    for index, candidate in enumerate(configs):
        if candidate == config:
            return index
    return None


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

    `best` maps a key to the chosen Config; `measurements` to what tuning measured (this process);
    `best_config` is the config of the last launch (Triton's attribute; None before the first).
    The keyword options are `autotune`'s (autotune_options.check_options).
    """

    def __init__(self, fn, configs: Sequence[Config], key: Sequence[str], reset_to_zero: Sequence[str] = (),
                 restore_value: Sequence[str] = (), **options):
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
        self._given = options           # as given, for __reduce__
        self.options = check_options(**options)
        self.best: dict = {}
        self.best_config: Optional[Config] = None
        # id(config) -> ms of one launch, under a warmup / rep budget: set by a config's first round of each search
        # (`select` holds self._lock over the search), read by its later rounds
        self._estimates: dict = {}
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
        return _new_tuner, (self.fn, self.configs, self.key, self.reset_to_zero, self.restore_value, self._given)

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
        if settings.disable_cache or not self.options.cache_results:
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

        # (a config early_config_prune made, not one of self.configs, is not recorded: the next process tunes again)
        record = {key: index for key, index in ((key, _index_of(self.configs, config)) for key, config in
                                                self.best.items()) if index is not None}
        if not record:
            return
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
    def select(self, key: str, measure: Callable[[Config], tuple], configs: Optional[Sequence[Config]] = None,
               rounds: int = TUNING_ROUNDS) -> Config:
        """The config for `key`: recorded, or the fastest of `configs` (all the tuner's by default) by the median
        of `measure(config) -> (ms, spills)` over `rounds` rounds (each measuring every config in turn), preferring
        configs that do not spill registers; a config whose measure raises a compilation/launch error is skipped
        from then on. Records the choice."""
        configs = self.configs if configs is None else tuple(configs)
        with self._lock:
            found = self._recorded_config(key)
            if found is not None:
                return found
            # by position: a config's constexpr values may be unhashable (lists)
            times = [[] for _ in configs]
            spilled, skipped = {}, {}
            for _ in range(rounds):
                for index, config in enumerate(configs):
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
                       for index, config in enumerate(configs)]
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
        """Launch with the best config for this launch's key (tuning it first if needed), after the config's
        pre_hook."""
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
        self.best_config = config
        if config.pre_hook is not None:
            config.pre_hook(self._named_args(args, kwargs, config))
        self.fn.run(grid, *args, num_warps=config.num_warps, num_stages=config.num_stages, interpret=interpret,
                    **kwargs, **config.constexprs)

    def _named_args(self, args: Sequence, kwargs: Mapping, config: Optional[Config] = None) -> dict:
        """A launch's arguments by parameter name (defaults included), and `config`'s constexprs and launch options
        (`Config.all_kwargs`): what prune functions and hooks are given."""
        named = dict(self._defaults)
        named.update(zip(self._names, args))
        named.update(kwargs)
        if config is not None:
            named.update(config.all_kwargs())
        return named

    def _pruned(self, args: Sequence, kwargs: Mapping) -> tuple:
        """The configs this launch tries: all, or those `prune_configs_by` leaves (autotune_options.Pruning)."""
        pruning = self.options.pruning
        if pruning is None:
            return self.configs
        return pruning.prune(self.configs, self._named_args(args, kwargs), kwargs, self.fn.__name__)

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
        """The first config whose kernel compiles for these arguments, of those `prune_configs_by` leaves (the
        interpreter times nothing); raises the first config's error when none does."""
        errors = []
        for config in self._pruned(args, kwargs):
            try:
                self.fn.ir(*args, num_warps=config.num_warps, num_stages=config.num_stages, **kwargs,
                           **config.constexprs)
            except _SKIPPED as error:
                errors.append(error)
                continue
            return config
        raise errors[0]

    def _tune(self, key: str, grid, args, kwargs) -> Config:
        """`select` for `key` by timing launches of each config `prune_configs_by` leaves on these arguments (one
        config left is chosen untimed, as in Triton); before each launch, the tensors named by reset_to_zero /
        restore_value are zeroed / restored, then the config's pre_hook and the tuner's pre_hook run, and after it
        the tuner's post_hook (autotune_options.TuningHooks). After the search the tensors are zeroed / restored
        again and the tuner's pre_hook is called with reset_only=True. A config `select` finds recorded (no
        launch, no pruning) leaves them alone, as a key tuned earlier does. The timing runs with the CUDA
        tensors' device current, where the launches go (whatever device is current at the call).

        The copies, restores and zeroings are not recorded by autograd (inference mode): the kernel writes
        its tensors whether they require grad (an nn.Parameter an in-place kernel updates) or are
        inference tensors, and so may tuning.

        Raises:
            LaunchError: the key must be timed while a CUDA graph is being captured on the current stream
                (timing synchronizes, which would invalidate the capture): launch once before capturing.
            TypeError, ValueError: from prune_configs_by's functions (autotune_options.Pruning.prune).
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
        configs = self.configs if recorded else self._pruned(args, kwargs)
        if len(configs) == 1 and self.options.pruning is not None:
            return self._choose_untimed(key, configs[0])
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
            hooks = TuningHooks(reset, config.pre_hook, self.options.pre_hook, self.options.post_hook,
                                self._named_args(args, kwargs, config))
            return self._measure(grid, args, kwargs, config, hooks, first)

        device = _cuda_device(values.values()) if torch.cuda.is_available() else None
        rounds = 1 if self.options.do_bench is not None else TUNING_ROUNDS     # do_bench repeats as it likes
        try:
            # timed on the tensors' device: CUDA events, the GPU sleep and the synchronize go to the current device's
            # stream, the launches to the tensors' device's (pytorch#122479: tensors off the current device)
            with torch.cuda.device(device) if device is not None else contextlib.nullcontext():
                chosen = self.select(key, measure, configs, rounds)
        finally:
            if launched:
                reset()
        if launched and self.options.pre_hook is not None:
            self.options.pre_hook(self._named_args(args, kwargs, chosen), reset_only=True)
        return chosen

    def _choose_untimed(self, key: str, config: Config) -> Config:
        """Record `config`, the one config pruning left for `key`, as its choice without timing it (unless a
        choice was recorded meanwhile, which is returned); its `measurements` are empty."""
        with self._lock:
            found = self._recorded_config(key)
            if found is not None:
                return found
            self.measurements[key] = []
            self.best[key] = config
            self._save_record()
            return config

    def _measure(self, grid, args, kwargs, config: Config, reset: Callable[[], None], first: bool) -> tuple:
        """(median ms of a round of launches of `config`, whether its kernel spills to local memory). `reset()`
        runs (untimed) before every launch, and `reset.after(exception)`, where `reset` has one that is not None
        (TuningHooks with a post_hook), after every launch, with the exception the launch raised or None.

        The `first` round of a config compiles it and adds TUNING_WARMUP untimed launches; a round times
        TUNING_REPS launches. With a `warmup` / `rep` budget (ms), one launch is timed first to estimate a
        launch's time, and the warm-up launches fill `warmup` and the timed launches of a round a
        TUNING_ROUNDS-th of `rep` (each at least 1, at most MAX_BUDGET_LAUNCHES). With `do_bench`, the round is
        `do_bench(kernel_call, quantiles=(0.5, 0.2, 0.8))`, kernel_call running the hooks and one launch."""
        after = getattr(reset, "after", None)
        options = self.options

        def launch():
            try:
                self.fn.run(grid, *args, num_warps=config.num_warps, num_stages=config.num_stages, interpret=False,
                            **kwargs, **config.constexprs)
            except Exception as error:
                if after is not None:
                    after(error)
                raise

        def kernel_call():
            reset()
            launch()
            if after is not None:
                after(None)

        if options.do_bench is not None:
            ms = bench_milliseconds(options.do_bench(kernel_call, quantiles=(0.5, 0.2, 0.8)), self.fn.__name__)
        else:
            kernel_call()       # compiles, loads and checks the launch (the first time)
        values = self.fn._bind(args, {**kwargs, **config.constexprs})
        entry, _, device_index = self.fn._lookup(values, config.num_warps, config.num_stages, "cuda")
        spills = entry.compiled.launcher(device_index).kernel.local_bytes > 0
        if options.do_bench is not None:
            return ms, spills
        timing = {} if after is None else {"after": after}
        warmup, reps = TUNING_WARMUP if first else 0, TUNING_REPS
        if options.warmup is not None or options.rep is not None:
            if first:
                self._estimates[id(config)] = time_launches(launch, reset, warmup=0, reps=1, **timing)
            estimate = self._estimates[id(config)]
            warmup = budget_launches(options.warmup, estimate, TUNING_WARMUP) if first else 0
            reps = budget_launches(options.rep, estimate, TUNING_REPS, share=TUNING_ROUNDS)
            timing["reps"] = reps
        return time_launches(launch, reset, warmup=warmup, **timing), spills


def time_launches(launch: Callable[[], object], before: Callable[[], None] = lambda: None, *,
                  warmup: int = TUNING_WARMUP, reps: int = TUNING_REPS,
                  after: Optional[Callable[[], None]] = None) -> float:
    """Median GPU time in ms of `reps` calls of `launch()`, each timed alone by CUDA events after
    `before()` and followed by `after()` where given (neither timed), following `warmup` untimed calls. A
    GPU sleep queued first keeps the stream busy while the host queues the timed calls, so a short kernel's
    time is the GPU's, not the host's launch latency."""
    import torch

    for _ in range(warmup):
        before()
        launch()
        if after is not None:
            after()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    sleep = getattr(torch.cuda, "_sleep", None)
    if sleep is not None:
        sleep(HOST_LEAD_CYCLES * reps)
    for start, end in events:
        before()
        start.record()
        launch()
        end.record()
        if after is not None:
            after()
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


def _new_tuner(fn, configs, key, reset_to_zero, restore_value, options: dict) -> Autotuner:
    """A tuner made again from what it was made of (unpickling one pickled by value, `Autotuner.__reduce__`)."""
    return Autotuner(fn, configs, key, reset_to_zero, restore_value, **options)


def autotune(configs: Sequence[Config], key: Sequence[str], prune_configs_by: Optional[Mapping] = None,
             reset_to_zero: Optional[Sequence[str]] = (), restore_value: Optional[Sequence[str]] = (),
             pre_hook: Optional[Callable] = None, post_hook: Optional[Callable] = None, warmup: Optional[float] = None,
             rep: Optional[float] = None, use_cuda_graph: bool = False, do_bench: Optional[Callable] = None,
             cache_results: bool = True):
    """Decorate a `@dsl.jit` kernel to pick the fastest of `configs` per value of the `key` arguments
    (Triton's `triton.autotune`, same parameters in the same order; see the module docstring).

    reset_to_zero / restore_value: names of tensor arguments the kernel accumulates into / updates in place.
    prune_configs_by: {"early_config_prune": fn(configs, named_args, **kwargs) -> configs,
        "perf_model": fn(**named_args, **config.all_kwargs()) -> estimated time, "top_k": int or fraction}
        (autotune_options.Pruning).
    pre_hook(named_args, reset_only=False) / post_hook(named_args, exception): called before / after every
        tuning launch (pre_hook also once after the search, with reset_only=True).
    warmup / rep: time budgets in ms of a config's warm-up launches / timed launches (default: counts,
        TUNING_WARMUP and TUNING_ROUNDS * TUNING_REPS). do_bench(kernel_call, quantiles) -> ms: times a config
        instead (a number, or a list whose first item is the median).
    use_cuda_graph: False only. cache_results: keep the choice on disk (True, the default here; Triton's is False).

    Raises TypeError for names that are not parameters and for options of the wrong type, ValueError for
    option values out of range (autotune_options.check_options)."""
    check_options(prune_configs_by, pre_hook, post_hook, warmup, rep, use_cuda_graph, do_bench, cache_results)
    options = dict(prune_configs_by=prune_configs_by, pre_hook=pre_hook, post_hook=post_hook, warmup=warmup, rep=rep,
                   use_cuda_graph=use_cuda_graph, do_bench=do_bench, cache_results=cache_results)

    def decorator(fn):
        return Autotuner(fn, configs, key, () if reset_to_zero is None else reset_to_zero,
                         () if restore_value is None else restore_value, **options)
    return decorator
