"""The options of `dsl.autotune` beyond configs, key, reset_to_zero and restore_value, as Triton 3.6's
`triton.autotune` names them (its documentation and python/triton/runtime/autotuner.py are the reference; README,
"Coming from Triton", lists where we differ): `prune_configs_by` (which configs a new key times), `pre_hook` /
`post_hook` (run around every tuning launch), `warmup` / `rep` (time budgets of the timing, ms), `do_bench` (a
benchmarking function of the user's instead of ours), `use_cuda_graph` (False only) and `cache_results` (the
on-disk record). `check_options` checks them once, when the kernel is decorated; `Pruning.prune` and
`TuningHooks` apply them.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Callable, Mapping, Optional, Sequence, Union

from .autotune_config import Config

PRUNE_KEYS = ("early_config_prune", "perf_model", "top_k")
MAX_BUDGET_LAUNCHES = 100   # launches per round (and warm-up launches) a `rep` / `warmup` budget can ask for


@dataclasses.dataclass(frozen=True)
class Pruning:
    """`prune_configs_by`: which of the configs a new key times.

    early_config_prune(configs, named_args, **launch_kwargs) -> configs: keeps (or makes) the configs worth trying;
        `named_args` maps every parameter of the kernel to this launch's argument (defaults included),
        `launch_kwargs` are the launch's keyword arguments. It must return at least one Config.
    perf_model(**named_args, **config.all_kwargs()) -> estimated time: consulted only when more than `top_k`
        configs are left, which are then sorted by it (ties keep their order) and cut to the `top_k` first.
    top_k: an int >= 1 (a count) or a float in (0, 1] (that fraction of the configs early_config_prune left, at
        least one); 1.0 by default (all).
    """

    early_config_prune: Optional[Callable] = None
    perf_model: Optional[Callable] = None
    top_k: Union[int, float] = 1.0

    def prune(self, configs: Sequence, named_args: Mapping, launch_kwargs: Mapping, kernel: str) -> tuple:
        """The configs to try, in order (the interpreter takes the first that compiles).

        Raises:
            TypeError: early_config_prune returned something else than a list of dsl.Config, or perf_model
                something else than a real number.
            ValueError: early_config_prune returned no config.
        """
        kept = tuple(configs)
        if self.early_config_prune is not None:
            returned = self.early_config_prune(list(kept), dict(named_args), **launch_kwargs)
            if isinstance(returned, (str, bytes, Mapping)) or not hasattr(returned, "__iter__"):
                raise TypeError(f"autotune of `{kernel}`: prune_configs_by's early_config_prune must return a list of "
                                f"dsl.Config, got {returned!r}")
            kept = tuple(returned)
            wrong = [config for config in kept if not isinstance(config, Config)]
            if wrong:
                raise TypeError(f"autotune of `{kernel}`: prune_configs_by's early_config_prune must return dsl.Config "
                                f"objects, got {wrong[0]!r}")
            if not kept:
                raise ValueError(f"autotune of `{kernel}`: prune_configs_by's early_config_prune returned no config "
                                 "for this launch; it must keep at least one")
        if self.perf_model is not None:
            top_k = self.top_k if isinstance(self.top_k, int) else max(1, int(len(kept) * self.top_k))
            if len(kept) > top_k:
                estimates = [_estimate(self.perf_model, named_args, config, kernel) for config in kept]
                order = sorted(range(len(kept)), key=estimates.__getitem__)     # stable: ties keep their order
                kept = tuple(kept[index] for index in order[:top_k])
        return kept


def _estimate(perf_model: Callable, named_args: Mapping, config, kernel: str) -> float:
    estimate = perf_model(**{**named_args, **config.all_kwargs()})
    if isinstance(estimate, bool) or not isinstance(estimate, numbers.Real) or math.isnan(estimate):
        raise TypeError(f"autotune of `{kernel}`: prune_configs_by's perf_model must return an estimated time (a "
                        f"real number, not NaN), got {estimate!r} for {config}")
    return float(estimate)


@dataclasses.dataclass(frozen=True)
class Options:
    """The checked options (see `check_options`)."""

    pruning: Optional[Pruning] = None
    pre_hook: Optional[Callable] = None
    post_hook: Optional[Callable] = None
    warmup: Optional[float] = None
    rep: Optional[float] = None
    do_bench: Optional[Callable] = None
    cache_results: bool = True


def check_options(prune_configs_by=None, pre_hook=None, post_hook=None, warmup=None, rep=None, use_cuda_graph=False,
                  do_bench=None, cache_results=True) -> Options:
    """The options of `dsl.autotune`, checked. Raises TypeError (a hook or do_bench that is not callable, a
    prune_configs_by that is not a dict or names another key, a budget or flag of another type) or ValueError
    (top_k below 1 or a fraction outside (0, 1], a budget that is not positive, use_cuda_graph=True, do_bench with
    warmup / rep)."""
    for name, value in (("pre_hook", pre_hook), ("post_hook", post_hook), ("do_bench", do_bench)):
        if value is not None and not callable(value):
            raise TypeError(f"autotune {name} must be a function or None, got {value!r}")
    for name, value in (("use_cuda_graph", use_cuda_graph), ("cache_results", cache_results)):
        if not isinstance(value, bool):
            raise TypeError(f"autotune {name} must be True or False, got {value!r}")
    if use_cuda_graph:
        raise ValueError("autotune use_cuda_graph=True is not offered: configs are timed launch by launch with CUDA "
                         "events; pass do_bench= to time them your way (e.g. replaying a CUDA graph)")
    for name, value in (("warmup", warmup), ("rep", rep)):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(f"autotune {name} must be a time in ms (a number) or None, got {value!r}")
        if not value > 0 or math.isinf(value):
            raise ValueError(f"autotune {name} must be a positive, finite time in ms, got {value!r}")
    if do_bench is not None and (warmup is not None or rep is not None):
        raise ValueError("autotune do_bench replaces the autotuner's timing, which warmup / rep bound: give do_bench "
                         "or warmup / rep, not both")
    return Options(_check_pruning(prune_configs_by), pre_hook, post_hook,
                   None if warmup is None else float(warmup), None if rep is None else float(rep), do_bench,
                   cache_results)


def _check_pruning(value) -> Optional[Pruning]:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise TypeError(f"autotune prune_configs_by must be a dict with keys among {list(PRUNE_KEYS)}, got {value!r}")
    unknown = [name for name in value if name not in PRUNE_KEYS]
    if unknown:
        raise TypeError(f"autotune prune_configs_by has the key {unknown[0]!r}; its keys are {list(PRUNE_KEYS)} "
                        "(early_config_prune(configs, named_args, **kwargs) -> configs, perf_model(**args) -> time, "
                        "top_k)")
    for name in ("early_config_prune", "perf_model"):
        if value.get(name) is not None and not callable(value[name]):
            raise TypeError(f"autotune prune_configs_by[{name!r}] must be a function or None, got {value[name]!r}")
    top_k = value.get("top_k")
    if top_k is None:
        top_k = 1.0
    elif isinstance(top_k, bool) or not isinstance(top_k, (int, float)):
        raise TypeError(f"autotune prune_configs_by['top_k'] must be an int (how many configs to time) or a float in "
                        f"(0, 1] (which fraction of them), got {top_k!r}")
    elif isinstance(top_k, int) and top_k < 1:
        raise ValueError(f"autotune prune_configs_by['top_k'] must be at least 1 (configs to time), got {top_k}")
    elif isinstance(top_k, float) and not 0.0 < top_k <= 1.0:
        raise ValueError(f"autotune prune_configs_by['top_k'] as a float is the fraction of the configs to time, in "
                         f"(0, 1], got {top_k}; give an int to time that many")
    return Pruning(value.get("early_config_prune"), value.get("perf_model"), top_k)


def budget_launches(budget_ms: Optional[float], estimate_ms: float, default: int, share: int = 1) -> int:
    """How many launches of `estimate_ms` each fill `budget_ms / share` (at least 1, at most MAX_BUDGET_LAUNCHES);
    `default` where there is no budget."""
    if budget_ms is None:
        return default
    if not estimate_ms > 0:
        return MAX_BUDGET_LAUNCHES
    return max(1, min(MAX_BUDGET_LAUNCHES, int(budget_ms / share / estimate_ms)))


def bench_milliseconds(result, kernel: str) -> float:
    """The time `do_bench` returned: a number, or a sequence whose first item is (its median, as Triton's
    do_bench returns for quantiles=(0.5, 0.2, 0.8)). Raises TypeError for anything else."""
    value = result[0] if isinstance(result, (list, tuple)) and result else result
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or math.isnan(value):
        raise TypeError(f"autotune of `{kernel}`: do_bench must return a time in ms (a number, or a list whose first "
                        f"item is the median), got {result!r}")
    return float(value)


class TuningHooks:
    """What runs around each tuning launch of one config (the launches after the search run only the config's
    pre_hook): calling it restores / zeroes the restore_value / reset_to_zero tensors (`reset`), then calls the
    config's pre_hook and the tuner's pre_hook with `named_args` (the launch's arguments by name with the
    config's values, one dict for all the hooks of the config's launches, as Triton's); `after(exception=None)`
    calls the tuner's post_hook with them and the exception the launch raised (None after a launch that did not
    raise). `after` is None without a post_hook."""

    def __init__(self, reset: Callable[[], None], config_pre_hook: Optional[Callable], pre_hook: Optional[Callable],
                 post_hook: Optional[Callable], named_args: dict):
        self._reset = reset
        self._before = [hook for hook in (config_pre_hook, pre_hook) if hook is not None]
        self._post_hook = post_hook
        self.named_args = named_args
        self.after = self._after if post_hook is not None else None

    def __call__(self) -> None:
        self._reset()
        for hook in self._before:
            hook(self.named_args)

    def _after(self, exception: Optional[BaseException] = None) -> None:
        self._post_hook(self.named_args, exception=exception)
