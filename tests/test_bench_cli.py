"""CPU tier of the main job, `python -m fusedops.bench`: the self-check mode of the CLI, its usage
errors, the case table's consistency, and the runner, checks and reports on CPU tensors (the GPU
run itself is `python -m fusedops.bench --quick` on the H200).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from fusedops.bench import cases, checks, providers, report, runner, selfcheck
from fusedops.bench.__main__ import main
from fusedops.bench.workload import Workload

ROOT = Path(__file__).resolve().parents[1]


def _host_timer(fn):
    times = []
    for _ in range(3):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return times


# -- the command line -------------------------------------------------------------------------------
def test_selfcheck_command_exits_zero():
    # The acceptance command of the CPU tier, in a fresh process (the self-check expects one). One
    # op keeps it short; with no library op present it checks its own kernels instead.
    completed = subprocess.run([sys.executable, "-m", "fusedops.bench", "--selfcheck", "--ops", "softmax"],
                               cwd=ROOT, capture_output=True, text=True, timeout=300,
                               env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert "self-check passed" in completed.stdout
    assert " ptx " in completed.stdout          # PTX was generated, not only interpreted


@pytest.mark.parametrize("argv, message", [
    (["--ops", "nonsense"], "valid ops: softmax, softmax_backward"),
    (["--ops", "softmax,nonsense"], "unknown value(s) nonsense"),
    (["--ops", ","], "an empty list"),
    (["--dtype", "fp8"], "valid dtypes: fp16, bf16, fp32"),
    (["--quick", "--bogus-flag"], "unrecognized arguments: --bogus-flag"),
])
def test_argument_errors_are_usage_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: fusedops-bench")
    assert message in err


def test_argument_lists_are_parsed():
    from fusedops.bench.__main__ import parse_args

    args = parse_args(["--ops", "softmax, matmul,softmax", "--dtype", "bf16,fp16", "--quick"])
    assert args.ops == ("softmax", "matmul")
    assert args.dtypes == (torch.bfloat16, torch.float16)
    assert args.quick and not args.compile and not args.triton and args.out == "bench-results"


# -- the case table -------------------------------------------------------------------------------
def test_case_names_are_unique_and_selectable():
    names = [case.name for case in cases.CASES]
    assert len(names) == len(set(names))
    assert [c.name for c in cases.select(["matmul", "softmax"])] == ["softmax", "matmul"]   # table order
    with pytest.raises(KeyError, match="valid ops"):
        cases.select(["softmax", "nope"])


@pytest.mark.parametrize("case", cases.CASES, ids=lambda case: case.name)
def test_case_is_well_formed(case):
    assert case.shapes and case.quick_shapes and case.selfcheck_shapes
    assert case.unit in cases.UNITS
    assert case.dtypes and set(case.dtypes) <= set(cases.DTYPE_NAMES.values())
    assert case.name == (f"{case.op}_backward" if case.backward else case.op)
    assert case.triton is None or not case.backward
    for shape in case.shapes + case.quick_shapes + case.selfcheck_shapes:
        assert len(shape) == len(case.dims), (case.name, shape)
        assert case.work(shape, 2) > 0
        assert case.label(shape)
    assert set(case.quick_shapes) <= set(case.shapes)
    if case.backward:
        assert case.grad_inputs and max(case.grad_inputs) < len(case.make_inputs(
            case.selfcheck_shapes[0], torch.float32, torch.device("cpu"), torch.Generator().manual_seed(0)))


@pytest.mark.parametrize("case", cases.CASES, ids=lambda case: case.name)
def test_case_reference_agrees_with_torch(case):
    # The float64 reference (and its gradients), the inputs and the PyTorch baseline of each case
    # agree to float32's flat tolerance at the self-check's first shape: the case is consistent.
    workload = Workload(case, case.selfcheck_shapes[0], torch.float32, "cpu")
    errors = workload.errors(workload.bind(case.torch_fn)())
    flat = checks.allowed_error(torch.float32, None)
    assert all(checks.within(e, flat) for e in errors), errors
    assert len(errors) == (len(case.grad_inputs) if case.backward else 1)


def test_quick_run_is_small():
    # --quick must finish in under a minute on one H200: one dtype and at most two shapes per case.
    settings = runner.Settings(cases=cases.CASES, quick=True)
    points = [p for case in cases.CASES for p in runner.points_of(case, settings)]
    assert all(len(runner.points_of(case, settings)) <= 2 for case in cases.CASES)
    assert len(points) <= 2 * len(cases.CASES)


def test_dtype_filter_leaves_out_cases_without_that_dtype():
    settings = runner.Settings(cases=cases.select(["matmul"]), dtypes=(torch.float32,), quick=True)
    assert runner.points_of(settings.cases[0], settings) == []


def test_missing_op_is_unavailable_with_a_reason():
    case = dataclasses.replace(cases.CASES_BY_NAME["softmax"], fusedops=cases.Library("no_such_op"))
    kept, lines = providers.available([case])
    assert kept == [] and lines == [
        "skipped softmax: fusedops.no_such_op is not available yet "
        "(AttributeError: module 'fusedops' has no attribute 'no_such_op')"]
    with pytest.raises(providers.Unavailable, match="no provider 'nope'"):
        providers.resolve(case, "nope")


# -- checks -----------------------------------------------------------------------------------------
def test_measure_error_catches_nan_shape_and_a_single_wrong_element():
    reference = torch.linspace(1, 2, 1000, dtype=torch.float64)
    assert checks.measure_error(reference.float(), reference).relative < 1e-7
    one_nan = reference.clone()
    one_nan[7] = float("nan")
    assert not checks.measure_error(one_nan, reference).finite
    assert not checks.measure_error(reference[:10], reference).finite
    one_off = reference.clone()
    one_off[-1] += 0.05           # a tail element: small in the norm, large per element
    error = checks.measure_error(one_off.half(), reference)
    flat = checks.allowed_error(torch.float16, None)
    assert error.relative <= flat.relative and not checks.within(error, flat)


def test_allowed_error_is_twice_torch_when_torch_is_less_exact():
    assert checks.allowed_error(torch.float16, checks.Error(1e-2, 1e-2)) == checks.Error(2e-2, 2e-2)
    assert checks.allowed_error(torch.float16, checks.INFINITE) == checks.Error(2e-3, 8e-3)


# -- the runner and reports on CPU tensors -----------------------------------------------------------
def _softmax_with(fn):
    return dataclasses.replace(cases.CASES_BY_NAME["softmax"], fusedops=lambda: fn)


def _rows_for(case, names=("torch", "fusedops")):
    point = runner.Point(case, (4, 64), torch.float32)
    messages = []
    rows = runner.measure_point(point, names, _host_timer, ceiling=1000.0, device="cpu", say=messages.append)
    return rows, messages


def test_measure_point_times_what_passes():
    rows, _ = _rows_for(_softmax_with(lambda x: torch.softmax(x, dim=-1)))
    assert [r["provider"] for r in rows] == ["torch", "fusedops"]
    for row in rows:
        assert row["check"] == "ok" and row["ms"] > 0 and row["GB/s"] > 0 and row["TFLOP/s"] is None
        assert row["% of ceiling"] == pytest.approx(100 * row["GB/s"] / 1000.0)
        assert row["work"] == 2 * 4 * 64 * 4
    assert rows[0]["vs torch"] == 1.0
    assert runner._status(rows, [object()])[0] == 0


def test_measure_point_reports_wrong_and_crashing_providers():
    wrong, messages = _rows_for(_softmax_with(lambda x: torch.softmax(x, dim=-1) * 1.01))
    assert wrong[1]["check"] == "FAIL" and wrong[1]["ms"] is None and "FAIL: relative error" in messages[0]

    def crash(x):
        raise ValueError("boom")

    crashed, messages = _rows_for(_softmax_with(crash))
    assert crashed[1]["check"] == "error" and crashed[1]["note"] == "ValueError: boom"
    status, message = runner._status(wrong + crashed, [object()])
    assert status == 1 and "2 of 2 fusedops checks failed" in message
    assert runner._status([], [])[0] == 1      # nothing benchmarked is a failure too


def test_unavailable_provider_gives_a_message_and_no_row():
    rows, messages = _rows_for(_softmax_with(torch.softmax), names=("torch", "triton", "torch-naive"))
    assert [r["provider"] for r in rows] == ["torch", "torch-naive"]
    assert messages and messages[0].startswith("no triton provider:")


def test_backward_case_checks_the_gradients():
    case = dataclasses.replace(cases.CASES_BY_NAME["layer_norm_backward"],
                               fusedops=lambda: cases.CASES_BY_NAME["layer_norm"].torch_fn)
    rows, _ = _rows_for(case)
    assert [r["check"] for r in rows] == ["ok", "ok"]


def test_reports_are_written(tmp_path):
    rows, _ = _rows_for(_softmax_with(lambda x: torch.softmax(x, dim=-1)))
    env = {"gpu": "test-gpu", "driver": "1.0", "torch": torch.__version__, "fusedops": "0"}
    csv_path, json_path = report.write_rows(rows, str(tmp_path), "results", env)
    loaded = json.loads(json_path.read_text())
    assert loaded[0]["gpu"] == "test-gpu" and loaded[0]["provider"] == "torch"
    header = csv_path.read_text().splitlines()[0].split(",")
    assert {"op", "shape", "dtype", "provider", "ms", "GB/s", "driver", "fusedops"} <= set(header)
    table = report.format_table(rows)
    assert all(column in table for column in ("provider", "% of ceiling", "vs torch", "1.00x"))
    if importlib.util.find_spec("matplotlib") is not None:
        png = report.plot_op("softmax", rows, tmp_path / "softmax.png", ceiling=1000.0)
        assert png.read_bytes().startswith(b"\x89PNG")


def test_environment_is_stamped():
    env = report.environment()
    assert {"gpu", "driver", "torch", "fusedops"} <= set(env)


def test_bench_scripts_share_the_timing_implementation():
    spec = importlib.util.spec_from_file_location("bench_timing", ROOT / "bench" / "timing.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    from fusedops.bench import timing

    assert module.gpu_time_ms is timing.gpu_time_ms and module.write_rows is report.write_rows


def test_interleaved_timing_takes_rounds_side_by_side(monkeypatch):
    # Each round times every function in turn (a clock change mid-run falls on all alike); the result is the
    # median of each function's runs over the rounds.
    from fusedops.bench import timing

    calls = []

    def fake_times(fn, *, warmup, repeats, flush_l2):
        calls.append((fn(), repeats))
        return [float(fn()) + len(calls)] * repeats

    monkeypatch.setattr(timing, "gpu_times_ms", fake_times)
    result = timing.interleaved_gpu_times_ms({"a": lambda: 10, "b": lambda: 20}, rounds=3, repeats=7)
    assert calls == [(10, 2), (20, 2), (10, 2), (20, 2), (10, 2), (20, 2)]
    assert result == {"a": 13.0, "b": 24.0}
    assert timing.interleaved_gpu_times_ms({"a": lambda: 1}, rounds=5, repeats=2) is not None
    assert len(calls) == 11 and calls[-1] == (1, 1)       # at least one run per round
    with pytest.raises(ValueError, match="rounds must be at least 1"):
        timing.interleaved_gpu_times_ms({"a": lambda: 1}, rounds=0)


# -- self-check failures ---------------------------------------------------------------------------------
def test_selfcheck_fails_on_a_wrong_result(capsys):
    case = dataclasses.replace(cases.CASES_BY_NAME["softmax"], selfcheck_shapes=((2, 8),),
                               fusedops=lambda: lambda x: torch.softmax(x, dim=-1) + 0.1)
    assert selfcheck.check_cases([case], [torch.float32]) == 1
    captured = capsys.readouterr()
    assert "self-check FAILED" in captured.err and "FAIL  interpreter  softmax M=2 N=8 fp32" in captured.err


def test_selfcheck_fails_when_no_kernel_ran(capsys):
    # An op that falls back to PyTorch gets right answers without running a kernel: not a pass.
    case = dataclasses.replace(cases.CASES_BY_NAME["softmax"], selfcheck_shapes=((2, 8),),
                               fusedops=lambda: lambda x: torch.softmax(x, dim=-1))
    assert selfcheck.check_cases([case], [torch.float32]) == 1
    assert "no new kernel of fusedops.kernels was launched" in capsys.readouterr().err


def test_a_point_whose_inputs_fail_is_a_fusedops_error():
    def broken_inputs(shape, dtype, device, generator):
        raise RuntimeError("out of memory")

    case = dataclasses.replace(cases.CASES_BY_NAME["softmax"], make_inputs=broken_inputs)
    rows, messages = _rows_for(case)
    assert [(r["provider"], r["check"]) for r in rows] == [("fusedops", "error")]
    assert rows[0]["note"] == "inputs or reference: RuntimeError: out of memory" and messages
