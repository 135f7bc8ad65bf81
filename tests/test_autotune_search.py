"""The autotuner's search (fusedops/dsl/runtime/autotune.py): configs timed in interleaved rounds and chosen by
their median, `reset_to_zero` / `restore_value` for kernels that accumulate into an argument, and the TMA
matmul timing each config as it will run (kernels/matmul.py `_tuned_tma_config`). CPU tests drive the search
with fake timings; the `cuda` tests launch real kernels."""

from __future__ import annotations

import pytest
import torch

import fusedops.dsl as dsl
from fusedops.dsl.runtime import autotune as at
from fusedops.kernels import matmul as mm
from fusedops.kernels.matmul_configs import TMA_CONFIGS


@dsl.jit
def _accumulate(out_ptr, x_ptr, n, BLOCK: dsl.constexpr):
    # out += x (atomically): the launch's result depends on out's previous contents.
    offsets = dsl.program_id(0) * BLOCK + dsl.arange(0, BLOCK)
    mask = offsets < n
    dsl.atomic_add(out_ptr + offsets, dsl.load(x_ptr + offsets, mask=mask), mask=mask)


@dsl.jit
def _scale_in_place(x_ptr, n, BLOCK: dsl.constexpr):
    # x *= 2: each launch changes its own input.
    offsets = dsl.program_id(0) * BLOCK + dsl.arange(0, BLOCK)
    mask = offsets < n
    dsl.store(x_ptr + offsets, dsl.load(x_ptr + offsets, mask=mask) * 2.0, mask=mask)


_CONFIGS = [dsl.Config({"BLOCK": block}, num_warps=4) for block in (64, 128, 256)]


def test_the_median_of_the_rounds_decides_not_the_first_measurement(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    tuner = dsl.autotune(_CONFIGS, key=["n"])(_accumulate)
    # BLOCK=64 is slow only in its first round (a cold GPU); BLOCK=128 is steady and slower than 64's median.
    series = {64: iter([9.0, 1.0, 1.0, 1.0]), 128: iter([2.0] * 4), 256: iter([3.0, 3.0, 0.5, 3.0])}
    calls = []

    def measure(config):
        calls.append(config.constexprs["BLOCK"])
        return next(series[config.constexprs["BLOCK"]]), False

    assert tuner.select("k", measure) == _CONFIGS[0]
    assert calls == [64, 128, 256] * at.TUNING_ROUNDS          # interleaved: every config once per round
    assert [m.ms for m in tuner.measurements["k"]] == [1.0, 2.0, 3.0]


def test_a_config_that_fails_is_not_measured_again(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    tuner = dsl.autotune(_CONFIGS, key=["n"])(_accumulate)
    calls = []

    def measure(config):
        calls.append(config.constexprs["BLOCK"])
        if config.constexprs["BLOCK"] == 128:
            raise dsl.CompilationError("too big")
        return float(config.constexprs["BLOCK"]), False

    assert tuner.select("k", measure) == _CONFIGS[0]
    assert calls.count(128) == 1 and calls.count(64) == at.TUNING_ROUNDS
    assert [m.skipped is not None for m in tuner.measurements["k"]] == [False, True, False]


@pytest.mark.parametrize("option", ["reset_to_zero", "restore_value"])
def test_reset_and_restore_names_are_checked(option):
    with pytest.raises(TypeError, match=f"{option} names \\['nope'\\], which are not parameters of `_accumulate`"):
        dsl.autotune(_CONFIGS, key=["n"], **{option: ["nope"]})(_accumulate)
    with pytest.raises(TypeError, match=f"{option} must be a list"):
        dsl.autotune(_CONFIGS, key=["n"], **{option: "out_ptr"})(_accumulate)


def test_tuning_launches_start_from_zeroed_and_restored_tensors(tmp_path, monkeypatch):
    # The search's launches run on the caller's tensors; `_measure` is replaced by one that runs the kernel's
    # effect (out += x, x *= 2) on the CPU after the reset it is given, as the GPU launches would.
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    tuner = dsl.autotune(_CONFIGS, key=["n"], reset_to_zero=["out_ptr"], restore_value=["x_ptr"])(_accumulate)
    out, x = torch.full((5,), 7.0), torch.arange(5.0)
    seen = []

    def fake_measure(grid, args, kwargs, config, reset, first):
        reset()
        seen.append((out.clone(), x.clone()))
        out.add_(x)
        x.mul_(2)
        return float(config.constexprs["BLOCK"]), False

    monkeypatch.setattr(tuner, "_measure", fake_measure)
    chosen = tuner._tune("k", (1,), (out, x, 5), {})
    assert chosen == _CONFIGS[0] and len(seen) == len(_CONFIGS) * at.TUNING_ROUNDS
    for before_out, before_x in seen:
        assert torch.equal(before_out, torch.zeros(5)) and torch.equal(before_x, torch.arange(5.0))
    # after the search: out zeroed, x as the caller passed it (the real launch follows)
    assert torch.equal(out, torch.zeros(5)) and torch.equal(x, torch.arange(5.0))


def test_the_tma_matmul_times_each_config_as_it_will_run(tmp_path, monkeypatch):
    # `_tuned_tma_config` times `_tma_path`'s launch of every config (the persistent kernel where its plan
    # takes one), not matmul_tma_kernel's; fake launches and times stand in for the GPU.
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(mm.tuned_matmul_tma_kernel, "best", {})
    monkeypatch.setattr(mm.tuned_matmul_tma_kernel, "_loaded", True)
    a, b = torch.zeros(1, 256, 64, dtype=torch.float16), torch.zeros(1, 64, 128, dtype=torch.float16)
    c = torch.empty(1, 256, 128, dtype=torch.float16)
    launched = []

    def fake_path(c_, a_, b_, bias, activation, config, interpret):
        assert (c_, a_, b_, interpret) == (c, a, b, False)
        return lambda: launched.append(config)

    times = {index: 5.0 - index * 0.5 for index in range(len(TMA_CONFIGS))}
    fastest = TMA_CONFIGS[max(times)]
    monkeypatch.setattr(mm, "_tma_path", fake_path)
    monkeypatch.setattr(mm, "time_launches", lambda launch, warmup=0: (launch(), times[TMA_CONFIGS.index(launched[-1])])[1])
    assert mm._tuned_tma_config(c, a, b, None, None) == fastest
    assert set(launched) == set(TMA_CONFIGS)
    key = mm.tuned_matmul_tma_kernel.key_of(mm._tma_launch(c, a, b, None, None)[0], mm._tma_launch(c, a, b, None, None)[1])
    assert mm.tuned_matmul_tma_kernel.best[key] == fastest
    launched.clear()
    assert mm._tuned_tma_config(c, a, b, None, None) == fastest and not launched     # recorded: no new search


# -- GPU ---------------------------------------------------------------------------------------------------------

@pytest.mark.cuda
def test_gpu_accumulating_kernel_autotuned_with_reset_to_zero_adds_once(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    tuner = dsl.autotune(_CONFIGS, key=["n"], reset_to_zero=["out_ptr"])(_accumulate)
    n = 1000
    x = torch.randn(n, device="cuda")
    out = torch.zeros(n, device="cuda")
    tuner[lambda meta: (dsl.cdiv(n, meta["BLOCK"]),)](out, x, n)
    torch.testing.assert_close(out, x, rtol=0, atol=0)          # one addition, not one per tuning launch
    tuner[lambda meta: (dsl.cdiv(n, meta["BLOCK"]),)](out, x, n)  # tuned: no reset now
    torch.testing.assert_close(out, 2 * x, rtol=0, atol=0)


@pytest.mark.cuda
def test_gpu_in_place_kernel_autotuned_with_restore_value_runs_once(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    tuner = dsl.autotune(_CONFIGS, key=["n"], restore_value=["x_ptr"])(_scale_in_place)
    n = 777
    x = torch.randn(n, device="cuda")
    expected = 2 * x
    tuner[lambda meta: (dsl.cdiv(n, meta["BLOCK"]),)](x, n)
    torch.testing.assert_close(x, expected, rtol=0, atol=0)


@pytest.mark.cuda
def test_gpu_time_launches_measures_the_kernel_not_the_host():
    # A short kernel queued behind the sleep: its median time is microseconds, and a kernel 64x longer
    # measures longer (the events time the GPU's work).
    small, large = torch.empty(1 << 12, device="cuda"), torch.empty(1 << 26, device="cuda")
    t_small = at.time_launches(lambda: small.fill_(1.0))
    t_large = at.time_launches(lambda: large.fill_(1.0))
    assert 0 < t_small < 0.05 and t_large > 4 * t_small, (t_small, t_large)
