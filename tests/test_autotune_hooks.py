"""Triton's autotuner options on `dsl.autotune` / `dsl.Config` (fusedops/dsl/runtime/autotune_options.py and
autotune.py): `prune_configs_by` (early_config_prune, perf_model, top_k: which configs are tried), `Config.pre_hook`,
the tuner's `pre_hook` / `post_hook`, `warmup` / `rep`, `do_bench`, `cache_results`, `Config(num_ctas, maxnreg)` and
`best_config`, with the interactions Triton users reported (an empty pruned list [triton#8059], top_k past the list
or rounding to 0 [triton#10689, #10964], a pre_hook changing a tensor in place while tuning, hooks beside
reset_to_zero / restore_value, the disk record of a choice made after pruning).

CPU: the NumPy interpreter, and a mocked CUDA driver (tests/mock_gpu.py) whose launches apply the kernel's effect
to the CPU tensors, with the autotuner's `time_launches` replaced by one that runs the launches it is given and
returns a time set per config, so the search runs end to end. The `cuda` tests launch real kernels.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch

import fusedops.dsl as dsl
from fusedops.dsl.runtime import autotune as autotune_module
from fusedops.dsl.runtime.autotune_options import MAX_BUDGET_LAUNCHES
from mock_gpu import accumulate_kernel, mock_cuda_driver, private_cache
from test_launch_fast_path import _cuda


@dsl.jit
def _scaled_copy(out_ptr, x_ptr, n, SCALE: dsl.constexpr, BLOCK: dsl.constexpr):
    # out = x * SCALE: the output tells which config ran.
    offsets = dsl.program_id(0) * BLOCK + dsl.arange(0, BLOCK)
    mask = offsets < n
    dsl.store(out_ptr + offsets, dsl.load(x_ptr + offsets, mask=mask) * SCALE, mask=mask)


def _double_in_place_kernel():
    def double_in_place(x_ptr, n, BLOCK: dsl.constexpr):
        offsets = dsl.program_id(0) * BLOCK + dsl.arange(0, BLOCK)
        mask = offsets < n
        dsl.store(x_ptr + offsets, dsl.load(x_ptr + offsets, mask=mask) * 2.0, mask=mask)
    return dsl.jit(double_in_place)


_SCALED = [dsl.Config({"SCALE": scale, "BLOCK": 16}) for scale in (1.0, 2.0, 3.0)]
_BLOCKS = [dsl.Config({"BLOCK": block}, num_warps=4) for block in (8, 16, 32, 64)]    # n = 64: grids 8, 4, 2, 1


def _grid(meta):
    return (dsl.cdiv(meta["n"], meta["BLOCK"]),)


def _scaled(scale, x):
    return (x.double() * scale).float()     # one rounding, as the kernel's float32 product


@pytest.fixture(autouse=True)
def _private_cache(monkeypatch, tmp_path):
    private_cache(monkeypatch, tmp_path)


@pytest.fixture
def gpu(monkeypatch):
    """A mocked driver whose launches log ("launch", grid x) in `log` and then run `effects`; `time_launches`
    replaced by one that runs its warm-up and timed launches (with `before` / `after`), logs (warmup, reps) in
    `timed`, and returns `times[grid x of its last launch]` (5.0 where unset)."""
    import types

    state = types.SimpleNamespace(log=[], times={}, timed=[], effects=None)
    state.effects = mock_cuda_driver(monkeypatch, lambda grid, function: state.log.append(("launch", grid[0])))

    def time_launches(launch, before=lambda: None, *, warmup=0, reps=autotune_module.TUNING_REPS, after=None):
        state.timed.append((warmup, reps))
        for _ in range(warmup + reps):
            before()
            launch()
            if after is not None:
                after()
        return state.times.get(_launches(state.log)[-1], 5.0)

    monkeypatch.setattr(autotune_module, "time_launches", time_launches)
    return state


def _launches(log) -> list:
    return [entry[1] for entry in log if entry[0] == "launch"]


# ------------------------------------------------------------------------------------------------
# prune_configs_by in the interpreter: the first config left that compiles
# ------------------------------------------------------------------------------------------------
def test_interpreter_takes_the_first_config_early_pruning_leaves(seed):
    calls = []

    def early_config_prune(configs, named_args, **kwargs):
        calls.append((configs, dict(named_args), kwargs))
        return [config for config in configs if config.constexprs["SCALE"] != 1.0]

    tuner = dsl.autotune(_SCALED, key=["n"], prune_configs_by={"early_config_prune": early_config_prune})(_scaled_copy)
    n = 37
    x, out = torch.randn(n, generator=torch.Generator().manual_seed(seed)), torch.full((n,), float("nan"))
    tuner[_grid](out, x, n=n, interpret=True)
    assert torch.equal(out, _scaled(2.0, x))
    assert tuner.best_config is _SCALED[1]
    ((configs, named_args, kwargs),) = calls
    assert configs == _SCALED and kwargs == {"n": n}
    assert named_args["out_ptr"] is out and named_args["x_ptr"] is x and named_args["n"] == n


@pytest.mark.parametrize("top_k, scale, modelled", [(1, 3.0, True), (0.5, 3.0, True), (2, 3.0, True),
                                                    (10, 1.0, False), (1.0, 1.0, False)])
def test_interpreter_perf_model_sorts_and_top_k_cuts(top_k, scale, modelled, seed):
    # the model ranks SCALE 3 first, then 1, then 2; it is consulted only where more than top_k configs are left
    # (a fraction of 3 configs: int(1.5) = 1), and the interpreter takes the first of those left
    asked = []

    def perf_model(**args):
        asked.append(args)
        return {1.0: 2.0, 2.0: 3.0, 3.0: 1.0}[args["SCALE"]]

    tuner = dsl.autotune(_SCALED, key=["n"], prune_configs_by={"perf_model": perf_model, "top_k": top_k})(_scaled_copy)
    n = 1
    x, out = torch.randn(n, generator=torch.Generator().manual_seed(seed)), torch.full((n,), float("nan"))
    tuner[_grid](out, x, n, interpret=True)
    assert torch.equal(out, _scaled(scale, x)) and tuner.best_config.constexprs["SCALE"] == scale
    assert bool(asked) == modelled
    if modelled:
        assert [args["SCALE"] for args in asked] == [1.0, 2.0, 3.0]
        assert {"out_ptr", "x_ptr", "n", "SCALE", "BLOCK", "num_warps", "num_stages", "num_ctas"} == set(asked[0])
        assert asked[0]["x_ptr"] is x and asked[0]["num_ctas"] == 1


def test_a_fractional_top_k_is_of_the_configs_early_pruning_left(seed):
    # 4 configs, early pruning keeps SCALE 2 and 3, top_k=0.5 keeps 1 of those 2 (the model's: 3), not 2 of 4
    # [triton#10964]
    configs = [dsl.Config({"SCALE": scale, "BLOCK": 16}) for scale in (1.0, 2.0, 3.0, 4.0)]
    tuner = dsl.autotune(configs, key=["n"], prune_configs_by={
        "early_config_prune": lambda configs, args, **kw: configs[1:3],
        "perf_model": lambda SCALE, **args: -SCALE, "top_k": 0.5})(_scaled_copy)
    n = 18
    x, out = torch.randn(n, generator=torch.Generator().manual_seed(seed)), torch.full((n,), float("nan"))
    tuner[_grid](out, x, n, interpret=True)
    assert torch.equal(out, _scaled(3.0, x)) and tuner.best_config is configs[2]


def test_config_pre_hook_runs_before_every_interpreter_launch(seed):
    # out += x, after a pre_hook that fills out with 1: every launch gives x + 1 (the poison never shows)
    seen = []

    def fill_with_one(named_args):
        seen.append(dict(named_args))
        named_args["out_ptr"].fill_(1.0)

    config = dsl.Config({"BLOCK": 16}, num_warps=2, pre_hook=fill_with_one)
    tuner = dsl.autotune([config], key=["n"])(accumulate_kernel())
    n = 21
    x, out = torch.randn(n, generator=torch.Generator().manual_seed(seed)), torch.full((n,), 1e30)
    for launch in range(2):
        tuner[_grid](out, x, n, interpret=True)
        assert torch.equal(out, (x.double() + 1.0).float()), launch
    assert len(seen) == 2 and seen[0]["out_ptr"] is out and seen[0]["x_ptr"] is x
    assert {k: v for k, v in seen[0].items() if not k.endswith("_ptr")} == {
        "n": n, "BLOCK": 16, "num_warps": 2, "num_stages": 3, "num_ctas": 1}


@pytest.mark.parametrize("returned, error, message", [
    ([], ValueError, "early_config_prune returned no config"),
    (None, TypeError, "must return a list of dsl.Config"),
    ([{"SCALE": 1.0}], TypeError, "must return dsl.Config objects"),
])
def test_a_bad_early_config_prune_result_is_a_clear_error(returned, error, message):
    tuner = dsl.autotune(_SCALED, key=["n"], prune_configs_by={"early_config_prune": lambda c, a, **k: returned})(
        _scaled_copy)
    with pytest.raises(error, match=message):
        tuner[_grid](torch.zeros(4), torch.zeros(4), 4, interpret=True)


@pytest.mark.parametrize("estimate", ["fast", None, float("nan")])
def test_a_perf_model_that_returns_no_time_is_a_clear_error(estimate):
    tuner = dsl.autotune(_SCALED, key=["n"], prune_configs_by={"perf_model": lambda **a: estimate, "top_k": 1})(
        _scaled_copy)
    with pytest.raises(TypeError, match="perf_model must return an estimated time"):
        tuner[_grid](torch.zeros(4), torch.zeros(4), 4, interpret=True)


# ------------------------------------------------------------------------------------------------
# option checks (when decorating)
# ------------------------------------------------------------------------------------------------
def _noop(*args, **kwargs):
    return None


@pytest.mark.parametrize("options, error, message", [
    ({"prune_configs_by": [_noop]}, TypeError, "prune_configs_by must be a dict"),
    ({"prune_configs_by": {"prune_num_stages_by": _noop}}, TypeError, "has the key 'prune_num_stages_by'"),
    ({"prune_configs_by": {"perf_model": 3}}, TypeError, r"prune_configs_by\['perf_model'\] must be a function"),
    ({"prune_configs_by": {"early_config_prune": "f"}}, TypeError, "early_config_prune'\\] must be a function"),
    ({"prune_configs_by": {"perf_model": _noop, "top_k": 0}}, ValueError, "at least 1"),
    ({"prune_configs_by": {"perf_model": _noop, "top_k": 1.5}}, ValueError, r"in \(0, 1\]"),
    ({"prune_configs_by": {"perf_model": _noop, "top_k": 0.0}}, ValueError, r"in \(0, 1\]"),
    ({"prune_configs_by": {"perf_model": _noop, "top_k": True}}, TypeError, "top_k'\\] must be an int"),
    ({"prune_configs_by": {"perf_model": _noop, "top_k": "2"}}, TypeError, "top_k'\\] must be an int"),
    ({"pre_hook": 3}, TypeError, "pre_hook must be a function"),
    ({"post_hook": "log"}, TypeError, "post_hook must be a function"),
    ({"do_bench": 1}, TypeError, "do_bench must be a function"),
    ({"warmup": 0}, ValueError, "warmup must be a positive"),
    ({"rep": "100"}, TypeError, "rep must be a time in ms"),
    ({"rep": float("inf")}, ValueError, "rep must be a positive, finite"),
    ({"do_bench": _noop, "warmup": 25}, ValueError, "do_bench or warmup / rep, not both"),
    ({"use_cuda_graph": True}, ValueError, "pass do_bench="),
    ({"cache_results": 1}, TypeError, "cache_results must be True or False"),
])
def test_bad_autotune_options_are_clear_errors(options, error, message):
    with pytest.raises(error, match=message):
        dsl.autotune(_SCALED, key=["n"], **options)(_scaled_copy)


def test_config_num_ctas_maxnreg_and_pre_hook_are_checked():
    assert dsl.Config({"B": 1}, num_ctas=1, maxnreg=None).all_kwargs() == {
        "B": 1, "num_warps": 4, "num_ctas": 1, "num_stages": 3}
    with pytest.raises(ValueError, match=r"num_ctas=2: only 1.*dsl.cluster_dims\(size\)"):
        dsl.Config({"B": 1}, num_ctas=2)
    with pytest.raises(ValueError, match="num_ctas=True"):
        dsl.Config({"B": 1}, num_ctas=True)
    with pytest.raises(ValueError, match=r"maxnreg=128.*dsl.launch_bounds\(min_blocks_per_sm\)` \(2 caps them at 128"):
        dsl.Config({"B": 1}, num_warps=8, maxnreg=128)
    with pytest.raises(TypeError, match="pre_hook must be a function"):
        dsl.Config({"B": 1}, pre_hook="zero")
    # a pre_hook makes another config (Triton's ==); equal configs without one stay equal (the library's)
    assert dsl.Config({"B": 1}, pre_hook=_noop) != dsl.Config({"B": 1})
    assert dsl.Config({"B": 1}, num_ctas=1) == dsl.Config({"B": 1}) and str(dsl.Config({"B": 1}, pre_hook=_noop)) \
        == str(dsl.Config({"B": 1}))


def test_a_tuner_with_options_copies_with_them():
    tuner = dsl.autotune(_SCALED, key=["n"], pre_hook=_noop, prune_configs_by={"perf_model": _noop, "top_k": 2},
                         cache_results=False)(_scaled_copy)
    copied = copy.deepcopy(tuner)
    assert copied is not tuner and copied.options == tuner.options and copied.configs == tuner.configs


# ------------------------------------------------------------------------------------------------
# the GPU search (mocked driver)
# ------------------------------------------------------------------------------------------------
def test_gpu_times_only_the_pruned_configs_and_records_the_choice(gpu, tmp_path):
    # early pruning drops BLOCK 8, the model ranks 64, 16, 32 and top_k keeps 2: only BLOCK 64 and 16 run
    pruned = []

    def early_config_prune(configs, named_args, **kwargs):
        pruned.append(named_args["n"])
        return [config for config in configs if config.constexprs["BLOCK"] != 8]

    def perf_model(BLOCK, **args):
        return {16: 2.0, 32: 3.0, 64: 1.0}[BLOCK]

    gpu.times.update({4: 1.0, 1: 2.0})      # by grid: BLOCK 16 is the faster of the two timed
    options = dict(prune_configs_by={"early_config_prune": early_config_prune, "perf_model": perf_model, "top_k": 2})
    kernel = accumulate_kernel()
    tuner = dsl.autotune(_BLOCKS, key=["n"], **options)(kernel)
    out, x = _cuda(torch.zeros(64)), _cuda(torch.ones(64))
    tuner[_grid](out, x, 64)
    (key,) = tuner.best
    assert [m.config for m in tuner.measurements[key]] == [_BLOCKS[3], _BLOCKS[1]]      # model order
    assert tuner.best[key] is _BLOCKS[1] and tuner.best_config is _BLOCKS[1]
    assert set(_launches(gpu.log)) == {1, 4} and _launches(gpu.log)[-1] == 4
    assert len(gpu.timed) == 2 * autotune_module.TUNING_ROUNDS
    # the record names the choice by its index in the full list; a new process's tuner neither prunes nor times
    (record,) = (tmp_path / "kernels" / "autotune").glob("*.json")
    assert json.loads(record.read_text()) == {key: 1}
    again = dsl.autotune(_BLOCKS, key=["n"], **options)(kernel)
    gpu.log.clear()
    again[_grid](out, x, 64)
    assert again.best_config == _BLOCKS[1] and _launches(gpu.log) == [4] and pruned == [64]


def test_gpu_one_config_left_is_chosen_untimed(gpu):
    hooks = []
    tuner = dsl.autotune(_BLOCKS, key=["n"], pre_hook=lambda args, reset_only=False: hooks.append(reset_only),
                         prune_configs_by={"early_config_prune": lambda configs, args, **kw: [configs[2]]})(
        accumulate_kernel())
    tuner[_grid](_cuda(torch.zeros(64)), _cuda(torch.ones(64)), 64)
    (key,) = tuner.best
    assert tuner.best[key] is _BLOCKS[2] and tuner.measurements[key] == []
    assert not gpu.timed and not hooks and _launches(gpu.log) == [2]      # the real launch only


def test_gpu_a_config_early_pruning_made_is_used_but_not_recorded(gpu, tmp_path):
    made = dsl.Config({"BLOCK": 64}, num_warps=8)       # not one of _BLOCKS (equal to none of them: num_warps)
    gpu.times.update({1: 1.0, 2: 2.0})
    tuner = dsl.autotune(_BLOCKS, key=["n"], prune_configs_by={
        "early_config_prune": lambda configs, args, **kw: [configs[2], made]})(accumulate_kernel())
    tuner[_grid](_cuda(torch.zeros(64)), _cuda(torch.ones(64)), 64)
    assert tuner.best_config is made
    assert not list((tmp_path / "kernels" / "autotune").glob("*.json"))     # nothing to name it by


def test_gpu_hooks_run_in_order_around_each_tuning_launch(gpu, seed):
    # reset_to_zero zeroes out, then the config's pre_hook, then the tuner's pre_hook; the tuner's post_hook after
    # each launch; after the search the tuner's pre_hook once with reset_only=True; later launches: the config's only
    log = gpu.log
    out, x = _cuda(torch.full((64,), 1e30)), _cuda(torch.randn(64, generator=torch.Generator().manual_seed(seed)))
    gpu.effects.append(lambda: out.add_(x))
    configs = [dsl.Config({"BLOCK": block}, pre_hook=lambda args, block=block: log.append(("config", block)))
               for block in (16, 64)]

    def pre_hook(args, reset_only=False):
        log.append(("pre", reset_only, float(args["out_ptr"].abs().sum()), args["BLOCK"]))

    def post_hook(args, exception):
        log.append(("post", exception, args["BLOCK"]))

    gpu.times.update({4: 2.0, 1: 1.0})
    tuner = dsl.autotune(configs, key=["n"], reset_to_zero=["out_ptr"], pre_hook=pre_hook, post_hook=post_hook)(
        accumulate_kernel())
    tuner[_grid](out, x, 64)
    # a round: a checking launch, then the timed ones; the first round adds the warm-up launches
    rounds, reps, warmup = autotune_module.TUNING_ROUNDS, autotune_module.TUNING_REPS, autotune_module.TUNING_WARMUP
    launches_per_config = rounds * (1 + reps) + warmup
    tuning = log[:-3]
    assert len(tuning) == 4 * 2 * launches_per_config
    for index in range(0, len(tuning), 4):
        config, pre, launch, post = tuning[index:index + 4]
        block = config[1]
        assert config == ("config", block) and pre == ("pre", False, 0.0, block)       # out zeroed before the hooks
        assert launch == ("launch", 64 // block) and post == ("post", None, block)
    assert log[-3:] == [("pre", True, 0.0, 64), ("config", 64), ("launch", 1)]
    assert torch.equal(out, x), "one addition: the tuning launches' sums were zeroed"
    log.clear()
    tuner[_grid](out, x, 64)
    assert log == [("config", 64), ("launch", 1)] and torch.equal(out, 2 * x)


def test_gpu_post_hook_gets_the_error_of_a_config_that_fails(gpu):
    seen = []
    configs = [dsl.Config({"BLOCK": 24}), dsl.Config({"BLOCK": 32})]        # arange(0, 24): CompilationError
    tuner = dsl.autotune(configs, key=["n"], post_hook=lambda args, exception: seen.append((args["BLOCK"], exception)))(
        accumulate_kernel())
    tuner[_grid](_cuda(torch.zeros(64)), _cuda(torch.ones(64)), 64)
    (key,) = tuner.best
    assert tuner.best[key] is configs[1] and tuner.measurements[key][0].skipped.startswith("CompilationError")
    failed = [exception for block, exception in seen if block == 24]
    assert len(failed) == 1 and isinstance(failed[0], dsl.CompilationError)
    assert {exception for block, exception in seen if block == 32} == {None}


def test_gpu_config_pre_hook_changing_its_input_with_restore_value(gpu, seed):
    # x *= 2 after a pre_hook that adds 1 to x: restore_value gives every launch the caller's x first, so the
    # tuning launches do not compound and the real launch leaves (x + 1) * 2
    x0 = torch.randn(64, generator=torch.Generator().manual_seed(seed))
    x = _cuda(x0.clone())
    gpu.effects.append(lambda: x.mul_(2.0))
    configs = [dsl.Config({"BLOCK": block}, pre_hook=lambda args: args["x_ptr"].add_(1.0)) for block in (16, 32)]
    tuner = dsl.autotune(configs, key=["n"], restore_value=["x_ptr"])(_double_in_place_kernel())
    tuner[_grid](x, 64)
    assert torch.equal(x, (x0 + 1.0) * 2.0)


@pytest.mark.parametrize("result", [[1.0, 0.5, 2.0], 1.0])
def test_gpu_do_bench_replaces_the_timing(gpu, result):
    calls = []

    def do_bench(kernel_call, quantiles):
        calls.append(quantiles)
        for _ in range(3):
            kernel_call()
        last = _launches(gpu.log)[-1]
        return [value * last for value in result] if isinstance(result, list) else result * last

    tuner = dsl.autotune(_BLOCKS[1:], key=["n"], do_bench=do_bench)(accumulate_kernel())
    tuner[_grid](_cuda(torch.zeros(64)), _cuda(torch.ones(64)), 64)
    assert tuner.best_config is _BLOCKS[3]          # grid 1: the smallest time
    assert calls == [(0.5, 0.2, 0.8)] * 3 and not gpu.timed        # one call a config, no rounds of ours
    assert _launches(gpu.log) == [4] * 3 + [2] * 3 + [1] * 3 + [1]


def test_gpu_do_bench_returning_no_time_is_a_clear_error(gpu):
    tuner = dsl.autotune(_BLOCKS[1:], key=["n"], do_bench=lambda call, quantiles: "fast")(accumulate_kernel())
    with pytest.raises(TypeError, match="do_bench must return a time in ms"):
        tuner[_grid](_cuda(torch.zeros(64)), _cuda(torch.ones(64)), 64)


@pytest.mark.parametrize("warmup, rep, expected", [
    (5.0, 20.0, (10, 10)),                  # 0.5 ms a launch: 10 fill 5 ms; 20 ms over 4 rounds: 10 a round
    (None, 20.0, (autotune_module.TUNING_WARMUP, 10)),
    (1e6, 1e6, (MAX_BUDGET_LAUNCHES, MAX_BUDGET_LAUNCHES)),
    (0.1, 0.1, (1, 1)),
])
def test_gpu_warmup_and_rep_budgets_bound_the_launch_counts(gpu, warmup, rep, expected):
    gpu.times.update({4: 0.5})
    tuner = dsl.autotune(_BLOCKS[1:2], key=["n"], warmup=warmup, rep=rep)(accumulate_kernel())
    tuner[_grid](_cuda(torch.zeros(64)), _cuda(torch.ones(64)), 64)
    first_warmup, reps = expected
    assert gpu.timed == [(0, 1), (first_warmup, reps)] + [(0, reps)] * (autotune_module.TUNING_ROUNDS - 1)


def test_gpu_cache_results_false_keeps_the_choice_off_disk(gpu, tmp_path):
    kernel = accumulate_kernel()
    for _ in range(2):      # a new tuner (a new process) times again
        gpu.timed.clear()
        tuner = dsl.autotune(_BLOCKS[2:], key=["n"], cache_results=False)(kernel)
        tuner[_grid](_cuda(torch.zeros(64)), _cuda(torch.ones(64)), 64)
        assert len(gpu.timed) == 2 * autotune_module.TUNING_ROUNDS
    assert not (tmp_path / "kernels" / "autotune").exists()


# ------------------------------------------------------------------------------------------------
# GPU
# ------------------------------------------------------------------------------------------------
@pytest.mark.cuda
def test_gpu_config_pre_hook_and_pruning_on_a_real_launch(seed):
    # out += x after a config pre_hook that zeroes out: every launch, tuning or not, leaves exactly x
    def zero_out(args):
        args["out_ptr"].zero_()

    configs = [dsl.Config({"BLOCK": block}, num_warps=warps, pre_hook=zero_out)
               for block, warps in ((32, 1), (64, 2), (128, 4), (256, 8))]
    tuner = dsl.autotune(configs, key=["n"], prune_configs_by={
        "early_config_prune": lambda configs, args, **kw: [c for c in configs if c.constexprs["BLOCK"] <= args["n"]],
        "perf_model": lambda BLOCK, num_warps, **args: 1.0 / BLOCK, "top_k": 2})(accumulate_kernel())
    n = 129
    x = torch.randn(n, device="cuda", generator=torch.Generator("cuda").manual_seed(seed))
    out = torch.full((n,), float("nan"), device="cuda")
    for _ in range(2):
        tuner[_grid](out, x, n)
        torch.testing.assert_close(out, x, rtol=0, atol=0)
    assert [m.config for m in next(iter(tuner.measurements.values()))] == [configs[2], configs[1]]
    assert tuner.best_config in (configs[1], configs[2])


@pytest.mark.cuda
def test_gpu_do_bench_and_hooks_with_restore_value_on_a_real_launch(seed):
    # x *= 2 in place; restore_value keeps the caller's x for every launch; a user do_bench with CUDA events
    def do_bench(kernel_call, quantiles):
        kernel_call()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(5):
            kernel_call()
        end.record()
        end.synchronize()
        return [start.elapsed_time(end) / 5] * len(quantiles)

    posts = []
    tuner = dsl.autotune([dsl.Config({"BLOCK": 64}), dsl.Config({"BLOCK": 256}, num_warps=8)], key=["n"],
                         restore_value=["x_ptr"], do_bench=do_bench,
                         post_hook=lambda args, exception: posts.append(exception))(_double_in_place_kernel())
    n = 1000
    x = torch.randn(n, device="cuda", generator=torch.Generator("cuda").manual_seed(seed))
    expected = (x.double() * 2).float()
    tuner[_grid](x, n)
    torch.testing.assert_close(x, expected, rtol=0, atol=0)
    assert len(posts) == 12 and set(posts) == {None}
