"""`dsl.Config`: one launch configuration an autotuned kernel may run with (Triton's `triton.Config`); see
autotune.py for the search and autotune_options.py for the options around it."""

from __future__ import annotations

import dataclasses
from typing import Callable, Mapping, Optional

from .launcher import DEFAULT_NUM_STAGES, DEFAULT_NUM_WARPS, warps_and_stages_problem


@dataclasses.dataclass(frozen=True)
class Config:
    """One launch configuration, as Triton's `triton.Config(kwargs, num_warps, num_stages, num_ctas, maxnreg,
    pre_hook)`: constexpr values (`kwargs`, a dict of names to values), num_warps and num_stages (None: the
    launch defaults, 4 and 3, as Triton takes None; num_ctas None is 1).

    pre_hook: None, or `pre_hook(named_args)` called before every launch of this config, the tuning launches
        and every launch after the search alike (the interpreter's too): `named_args` maps each kernel parameter
        to the launch's argument (defaults included) and the config's constexprs, num_warps, num_stages and
        num_ctas to theirs. It may change tensors in place (e.g. zero a buffer the kernel accumulates into).
        Configs with different pre_hooks are different configs (==, hash), as in Triton.
    num_ctas: 1 only: a cluster of CTAs is a kernel statement here, `dsl.cluster_dims(size)`.
    maxnreg: None only: a kernel caps its registers with `dsl.launch_bounds(min_blocks_per_sm)`.
    """

    kwargs: Mapping
    num_warps: Optional[int] = 4
    num_stages: Optional[int] = 3
    num_ctas: Optional[int] = 1
    maxnreg: Optional[int] = None
    pre_hook: Optional[Callable] = None

    def __post_init__(self):
        """None num_warps / num_stages / num_ctas become the defaults (4, 3, 1). Raises ValueError for num_warps
        other than a power of two from 1 to 32, num_stages below 1, num_ctas other than 1 or a maxnreg (found
        here, not when autotuning skips the config); TypeError for a pre_hook that is not callable."""
        if self.num_warps is None:
            object.__setattr__(self, "num_warps", DEFAULT_NUM_WARPS)
        if self.num_stages is None:
            object.__setattr__(self, "num_stages", DEFAULT_NUM_STAGES)
        if self.num_ctas is None:
            object.__setattr__(self, "num_ctas", 1)
        problem = warps_and_stages_problem(self.num_warps, self.num_stages)
        if problem is not None:
            raise ValueError(f"Config: {problem[0]} {problem[1]}")
        if type(self.num_ctas) is not int or self.num_ctas != 1:
            raise ValueError(f"Config: num_ctas={self.num_ctas!r}: only 1 (one CTA per program); a kernel launches "
                             "its programs in clusters with `dsl.cluster_dims(size)`, size a constexpr the config can "
                             "set (README, \"Coming from Triton\")")
        if self.maxnreg is not None:
            raise ValueError(f"Config: maxnreg={self.maxnreg!r}: there is no per-launch register cap; a kernel caps "
                             f"its registers with `dsl.launch_bounds(min_blocks_per_sm)`{_blocks_hint(self)}, "
                             "min_blocks_per_sm a constexpr the config can set")
        if self.pre_hook is not None and not callable(self.pre_hook):
            raise TypeError(f"Config: pre_hook must be a function of the named arguments or None, got "
                            f"{self.pre_hook!r}")
        object.__setattr__(self, "kwargs", tuple(sorted(dict(self.kwargs).items())))

    @property
    def constexprs(self) -> dict:
        return dict(self.kwargs)

    def all_kwargs(self) -> dict:
        """The constexprs and the launch options (num_warps, num_ctas, num_stages) by name, as Triton's
        `Config.all_kwargs()`: what a perf_model and the hooks see of the config."""
        return {**self.constexprs, "num_warps": self.num_warps, "num_ctas": self.num_ctas,
                "num_stages": self.num_stages}

    def __str__(self) -> str:
        values = ", ".join(f"{k}={v}" for k, v in self.kwargs)
        return f"Config({values}, num_warps={self.num_warps}, num_stages={self.num_stages})"


def _blocks_hint(config: Config) -> str:
    """For `Config(maxnreg=R)`: the launch_bounds whose register cap (65536 per SM over that many CTAs of
    num_warps * 32 threads) is at most R, where one is in launch_bounds' range (at most 2048 threads an SM)."""
    registers = config.maxnreg
    if type(registers) is not int or registers <= 0:
        return ""
    blocks = -(-65536 // (registers * config.num_warps * 32))
    fits = 1 <= blocks <= 32 and blocks * config.num_warps * 32 <= 2048
    return f" ({blocks} caps them at {registers} or fewer with num_warps={config.num_warps})" if fits else ""
