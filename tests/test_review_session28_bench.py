"""Review (session 28): the benchmark tooling used as a demanding user on a CPU-only machine.

What was tried: the command lines of `python -m fusedops.bench` (fusedops/bench/__main__.py) and of the
per-op scripts bench/softmax.py, layernorm.py, matmul.py, attention.py (their shared argparse types in
fusedops/bench/scripts.py) with bad, empty, duplicate, zero, too large and conflicting values; the
behaviour without a GPU (the main command's self-check dispatch, with the self-check itself stubbed;
the scripts' messages); the report functions of fusedops/bench/report.py (tables with None / NaN /
failed rows, fixed-width and key=value rows, CSV/JSON into a new or an existing directory, plots with a
single point or a single provider); the runner's rows on CPU tensors with a host timer (a provider
that fails, a missing baseline, a timer that returns no times or 0 ms); the case table (B*S and H*E of
the attention shapes, the issue's odd N, the bytes the scripts count against the table's); the checks'
verdicts on NaN / inf / empty / mismatched inputs; the self-check's verdict with nothing checked.

Peer bug reports the cases were drawn from: triton-lang/triton#6868 and #8948 (a 0 ms measurement
dividing by zero in do_bench / in a speedup), samuelcolvin/pytest-speed#5 (statistics over too few
samples), ionelmc/pytest-benchmark#27 (a time column in an unreadable unit), mlcommons/mobile_app_open#623
and bytecodealliance/sightglass#330 (result files overwritten or lost), conbench/conbench#1325 (a value
shown in the wrong unit), microsoft/onnxruntime-genai#2404 (NaN silently propagated into JSON results).

DEFECTS (all fixed in session 28, 7 in both scripts):

1. The scripts' list options keep duplicates, unlike `python -m fusedops.bench` (whose --ops/--dtype lists
   are deduplicated, tests/test_review_session24_docs.py pins that).
   Repro: `python bench/softmax.py --dtypes fp16,fp16 --ns 1024,1024` (or matmul --shapes
   4096x4096x4096,4096x4096x4096). Expected: each point once (or a usage error). Actual:
   scripts.choice_list(...)("fp16,fp16") == ["fp16", "fp16"], scripts.int_list("1024,1024") == [1024, 1024],
   scripts.shape_list gives the shape twice: every point is measured twice and written twice to the CSV/JSON.
   Cause: fusedops/bench/scripts.py int_list / shape_list / choice_list (no dict.fromkeys as in
   __main__._comma_list).

2. bench/attention.py accepts --seqlens and --head-dims that give a batch or head count of 0 (and values that
   do not divide B*S = 16384 or H*E = 2048, which silently change the documented token / model size).
   Repro: `python bench/attention.py --seqlens 32768` (B = 16384 // 32768 = 0) or `--head-dims 4096` (H = 0).
   Expected: a usage error naming the option, exit 2 (as `--head-dims 0` already is). Actual: parsed; on a
   GPU the run builds empty (0, H, S, E) inputs and reports 0 TFLOP/s rows; without a GPU it exits 1
   "needs a CUDA GPU", i.e. the bad value is not even reported.
   Cause: bench/attention.py main() uses scripts.int_list (any positive int) with no check against TOKENS /
   MODEL_DIM.

3. bench/layernorm.py --name is not validated: "" or a name with a path separator is accepted.
   Repro: `python bench/layernorm.py --name sub/run1` (or `--name ""`). Expected: a usage error, exit 2,
   before anything is measured. Actual: accepted (exit 0 without a GPU); on a GPU the whole run (minutes)
   completes and then write_rows raises FileNotFoundError for OUT/sub/run1.json, losing every result
   (`--name ""` writes hidden files OUT/.csv, OUT/.json, OUT/.png).
   Cause: bench/layernorm.py main(), `parser.add_argument("--name", default="layernorm")` without a type.

4. report.write_rows writes NaN / Infinity tokens into the .json file, which is then not JSON (RFC 8259):
   jq, JavaScript's JSON.parse and strict parsers reject it. NaN occurs in real rows: bench/layernorm.py's
   "vs torch" is float("nan") when torch's CUDA-graph capture failed but fusedops' did not.
   Repro: report.write_rows([{"vs torch": float("nan")}], out, "r", {}) -> `"vs torch": NaN`.
   Expected: null (or the run refuses to write a non-finite number). Cause: fusedops/bench/report.py
   write_rows, json.dumps without allow_nan=False / a NaN -> None mapping.

5. The printed table rounds fraction columns to one decimal: bench/layernorm.py's table shows
   fraction_of_copy 0.86 and 0.94 both as "0.9" (everything in [0.85, 0.95) alike), while its acceptance
   line checks >= 0.90 and README quotes these fractions to two decimals (0.89-1.02): a failing 0.86 and a
   passing 0.94 look the same. Repro: report.format_table([{"fraction_of_copy": 0.86},
   {"fraction_of_copy": 0.94}], ("fraction_of_copy",)). Expected: two decimals ("0.86" / "0.94", or
   "86.0%" / "94.0%"). Actual: "0.9" twice.
   Cause: fusedops/bench/report.py _cell formats every float column other than "ms"/"vs torch" with ".1f",
   a format meant for GB/s, TFLOP/s and percentages.

6. A missing baseline written as NaN prints as "nanx" in the table.
   Repro: report.format_table([{"vs torch": float("nan")}], ("vs torch",)) -> "nanx" (bench/layernorm.py
   sets "vs torch" to NaN when the torch row is missing). Expected: an empty cell, as for None (the
   runner's own missing ratio). Cause: fusedops/bench/report.py _cell (no check for a non-finite float).

7. bench/softmax.py (and bench/layernorm.py, same structure) lose the whole run when one provider raises:
   bench_shape times the providers in a dict comprehension with no try, so one failure (torch.compile
   failing to compile, a backend refusing a shape) propagates out of main() and nothing is printed or
   written for any shape measured before. bench/matmul.py and bench/attention.py catch it ("one failing
   provider must not lose the others' numbers") and write an "error" row.
   Repro (CPU, with the GPU timer and copy stubbed): bench_shape with a provider that raises -> RuntimeError.
   Expected: the other providers' rows plus a row for the failed provider with its error; format_table
   prints both. Cause: bench/softmax.py bench_shape (and bench/layernorm.py measure).

Observations not reported as defects: the scripts' --quick overrides --dtypes (fp16 only) by design
(its help says so and tests/test_bench_scripts.py pins it); matmul.py / attention.py exit 1 without a GPU
while softmax.py / layernorm.py / vector_add.py exit 0 (both pinned by tests/test_bench_scripts.py);
attention.py's plot puts every panel in one row (16 panels -> an 80-inch-wide PNG), a layout choice.
Everything else tried holds and is kept below as plain tests.
"""

from __future__ import annotations

import csv
import dataclasses
import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch

from fusedops.bench import cases, checks, providers, report, runner, scripts, selfcheck, timing
from fusedops.bench import __main__ as bench_main
from test_bench_scripts import ENV, HAS_MATPLOTLIB, _load

NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour on a machine without CUDA")


def _usage_error(call, capsys):
    with pytest.raises(SystemExit) as info:
        call()
    err = capsys.readouterr().err
    return info.value.code, err


def _host_timer(fn):
    fn()
    return [0.5, 0.25, 1.0]


def _softmax_case(fusedops_fn):
    return dataclasses.replace(cases.CASES_BY_NAME["softmax"], fusedops=lambda: fusedops_fn)


def _point(case, shape=(4, 64), dtype=torch.float32):
    return runner.Point(case, shape, dtype)


# =====================================================================================================
# python -m fusedops.bench: usage errors (exit 2, message naming the option, no traceback)
# =====================================================================================================
@pytest.mark.parametrize("argv, option", [
    (["--ops", "softmax,Softmax"], "--ops"),
    (["--ops", ""], "--ops"),
    (["--ops", " , ,"], "--ops"),
    (["--dtype", "float16"], "--dtype"),
    (["--dtype", "fp16,fp64"], "--dtype"),
    (["--dtype", ","], "--dtype"),
    (["--out", ""], "--out"),
    (["--dtypes", "fp16"], "--dtypes"),          # the scripts' spelling: not an abbreviation here
    (["--ops"], "--ops"),
])
def test_main_cli_bad_values_are_usage_errors(argv, option, capsys):
    code, err = _usage_error(lambda: bench_main.main(argv), capsys)
    assert code == 2
    assert err.startswith("usage: fusedops-bench") and option in err
    assert "Traceback" not in err


def test_main_cli_out_under_an_existing_file_is_a_usage_error(tmp_path, capsys):
    blocker = tmp_path / "results"
    blocker.write_text("not a directory")
    code, err = _usage_error(lambda: bench_main.parse_args(["--out", str(blocker / "deeper" / "dir")]), capsys)
    assert code == 2 and "argument --out" in err


def test_main_cli_out_may_be_new_or_existing(tmp_path):
    assert bench_main.parse_args(["--out", str(tmp_path)]).out == str(tmp_path)
    assert bench_main.parse_args(["--out", str(tmp_path / "a" / "b")]).out == str(tmp_path / "a" / "b")
    assert not (tmp_path / "a").exists()             # parsing creates nothing


def test_main_cli_lists_are_deduplicated_and_ordered():
    args = bench_main.parse_args(["--ops", "matmul,softmax,matmul", "--dtype", "fp16,,fp16,bf16"])
    assert args.ops == ("matmul", "softmax") and args.dtypes == (torch.float16, torch.bfloat16)
    # the runner selects in table order whatever order was asked
    assert [c.name for c in cases.select(args.ops)] == ["softmax", "matmul"]


@NO_CUDA
def test_main_without_a_gpu_runs_the_selfcheck_and_returns_its_status(monkeypatch, capsys):
    seen = []

    def fake_run(ops, dtypes):
        seen.append((ops, dtypes))
        return 1

    monkeypatch.setattr(selfcheck, "run", fake_run)
    status = bench_main.main(["--ops", "softmax", "--quick", "--out", "elsewhere", "--compile"])
    out = capsys.readouterr().out
    assert status == 1 and seen == [(("softmax",), None)]
    assert out.startswith("no CUDA GPU: running the CPU self-check\n")
    assert "--quick, --compile, --out apply to the GPU benchmark" in out
    assert not Path("elsewhere").exists()


@NO_CUDA
def test_main_selfcheck_flag_without_a_gpu_prints_no_gpu_line_once(monkeypatch, capsys):
    monkeypatch.setattr(selfcheck, "run", lambda ops, dtypes: 0)
    assert bench_main.main(["--selfcheck", "--dtype", "bf16"]) == 0
    out = capsys.readouterr().out
    assert "no CUDA GPU" not in out and "note:" not in out


# =====================================================================================================
# the per-op scripts: usage errors and the behaviour without a GPU
# =====================================================================================================
@NO_CUDA
@pytest.mark.parametrize("name, argv, option", [
    ("softmax", ["--ns", "1024,"], "--ns"),
    ("softmax", ["--ns", "0"], "--ns"),
    ("softmax", ["--ns", "1e3"], "--ns"),
    ("softmax", ["--ns", "²"], "--ns"),               # isdigit() but not int(): still a usage error
    ("softmax", ["--dtypes", "fp32"], "--dtypes"),
    ("softmax", ["--dtypes", ""], "--dtypes"),
    ("softmax", ["--out", ""], "--out"),
    ("matmul", ["--shapes", "4096x4096x0"], "--shapes"),
    ("matmul", ["--shapes", "-1x2x3"], "--shapes"),
    ("matmul", ["--shapes", "1x2x3,"], "--shapes"),
    ("attention", ["--seqlens", "-1024"], "--seqlens"),
    ("attention", ["--head-dims", "64,,128"], "--head-dims"),
    ("layernorm", ["--ops", "layer_norm,group_norm"], "--ops"),
    ("layernorm", ["--dtypes", "fp16,fp8"], "--dtypes"),
])
def test_scripts_bad_values_are_usage_errors(name, argv, option, capsys):
    code, err = _usage_error(lambda: _load(name).main(argv), capsys)
    assert code == 2 and option in err and "Traceback" not in err


@NO_CUDA
def test_script_out_that_is_a_file_is_a_usage_error(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    code, err = _usage_error(lambda: _load("softmax").main(["--out", str(blocker)]), capsys)
    assert code == 2 and "--out" in err


@NO_CUDA
@pytest.mark.parametrize("name", ["softmax", "layernorm", "vector_add"])
def test_scripts_without_a_gpu_say_so_and_exit_0(name, monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert _load(name).main(["--out", str(tmp_path / "new")]) == 0
    assert capsys.readouterr().out == "no CUDA GPU: nothing to benchmark\n"
    assert not (tmp_path / "new").exists()           # nothing written


def test_quick_forces_fp16_in_the_scripts_by_design():
    parser = scripts.argument_parser("doc", quick="N in [1]")
    assert scripts.run_dtypes(parser.parse_args(["--quick", "--dtypes", "bf16"])) == ["fp16"]
    assert scripts.run_dtypes(parser.parse_args(["--dtypes", "bf16"])) == ["bf16"]


def test_script_lists_drop_duplicates():
    assert scripts.choice_list(["fp16", "bf16"])("fp16,fp16") == ["fp16"]
    assert scripts.int_list("1024,1024,2048") == [1024, 2048]
    assert scripts.shape_list("1x2x3,1x2x3") == [(1, 2, 3)]


@NO_CUDA
@pytest.mark.parametrize("argv", [["--seqlens", "32768"], ["--head-dims", "4096"]])
def test_attention_rejects_shapes_with_no_batch_or_no_heads(argv, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    code, err = _usage_error(lambda: _load("attention").main(argv), capsys)
    assert code == 2 and argv[0] in err


@NO_CUDA
def test_attention_accepts_the_issue_seqlens_and_head_dims(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        _load("attention").main(["--seqlens", "1024,16384", "--head-dims", "64,128"])


@NO_CUDA
@pytest.mark.parametrize("name", ["sub/run1", ""])
def test_layernorm_name_must_be_a_file_stem(name, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    code, err = _usage_error(lambda: _load("layernorm").main(["--name", name]), capsys)
    assert code == 2 and "--name" in err


def test_write_rows_under_a_name_with_a_missing_folder_fails(tmp_path):
    # what defect 3 ends in on a GPU, after the whole run
    with pytest.raises(FileNotFoundError):
        report.write_rows([{"a": 1}], str(tmp_path), "sub/run1", ENV)


# =====================================================================================================
# report: CSV / JSON
# =====================================================================================================
def test_write_rows_into_new_nested_and_existing_directories(tmp_path):
    out = tmp_path / "a" / "b"
    first = report.write_rows([{"op": "x", "ms": 1.5}], str(out), "results", ENV)
    assert [p.name for p in first] == ["results.csv", "results.json"]
    # a second run into the same (now existing) directory replaces the files, not appends to them
    report.write_rows([{"op": "y", "ms": 2.5}], str(out), "results", ENV)
    loaded = json.loads((out / "results.json").read_text())
    assert [r["op"] for r in loaded] == ["y"]
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert [r["op"] for r in rows] == ["y"] and rows[0]["gpu"] == "test-gpu"


def test_write_rows_union_of_keys_none_and_failed_rows(tmp_path):
    rows = [{"op": "matmul", "provider": "torch", "ms": 1.0, "TFLOP/s": 500.0},
            {"op": "matmul", "provider": "triton", "error": "RuntimeError: x, \"quoted\"\nsecond line"},
            {"op": "matmul", "provider": "fusedops", "ms": None}]
    csv_path, json_path = report.write_rows(rows, str(tmp_path), "m", ENV)
    read = list(csv.DictReader(csv_path.open(newline="")))
    assert list(read[0])[:5] == ["op", "provider", "ms", "TFLOP/s", "gpu"]
    assert read[1]["error"] == "RuntimeError: x, \"quoted\"\nsecond line" and read[1]["ms"] == ""
    assert read[2]["ms"] == "" and json.loads(json_path.read_text())[2]["ms"] is None


def test_write_rows_floats_are_locale_independent(tmp_path):
    import locale

    saved = locale.setlocale(locale.LC_NUMERIC)
    try:
        for name in ("de_DE.UTF-8", "fr_FR.UTF-8"):
            try:
                locale.setlocale(locale.LC_NUMERIC, name)
                break
            except locale.Error:
                continue
        csv_path, _ = report.write_rows([{"ms": 1.25}], str(tmp_path), "r", ENV)
        assert csv_path.read_text().splitlines()[1].startswith("1.25,")
        assert "1.25" in report.format_table([{"ms": 1.25}], ("ms",))
    finally:
        locale.setlocale(locale.LC_NUMERIC, saved)


def test_write_rows_of_no_rows(tmp_path):
    csv_path, json_path = report.write_rows([], str(tmp_path), "empty", ENV)
    assert json.loads(json_path.read_text()) == [] and csv_path.exists()


def test_write_rows_json_is_strict_json(tmp_path):
    _, json_path = report.write_rows([{"vs torch": float("nan"), "GB/s": float("inf")}], str(tmp_path), "r", ENV)

    def reject(token):
        raise ValueError(f"non-standard JSON token {token}")

    loaded = json.loads(json_path.read_text(), parse_constant=reject)
    assert loaded[0]["vs torch"] is None


# =====================================================================================================
# report: tables
# =====================================================================================================
def test_table_of_failed_rows_and_missing_values():
    rows = [runner._row(_point(cases.CASES_BY_NAME["softmax"]), "torch"),
            dict(runner._row(_point(cases.CASES_BY_NAME["softmax"]), "fusedops"), check="error")]
    rows[0].update(check="ok", ms=0.01234, **{"GB/s": 1234.56, "vs torch": 1.0})
    text = report.format_table(rows)
    lines = text.splitlines()
    assert len(lines) == 4 and "0.01234" in lines[2] and "1234.6" in lines[2] and "1.00x" in lines[2]
    assert "error" in lines[3] and "None" not in text and "nan" not in text
    markdown = report.format_table(rows, markdown=True)
    assert markdown.splitlines()[0].startswith("| op") and markdown.count("\n") == 3


def test_table_without_tabulate_falls_back_to_aligned_columns(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tabulate" else real(name, *a))
    text = report.format_table([{"op": "softmax", "ms": 0.5, "vs torch": 2.0}], ("op", "ms", "vs torch"))
    assert text.splitlines() == ["op       ms   vs torch", "-------  ---  --------", "softmax  0.5  2.00x"]
    md = report.format_table([{"op": "a"}], ("op",), markdown=True)
    assert md.splitlines()[0] == "| op |"


def test_table_ms_keeps_small_times_readable():
    # 4 significant digits whatever the magnitude: no "0.0" for a microsecond kernel
    assert report._cell("ms", 0.0012345) == "0.001234" and report._cell("ms", 12.3456) == "12.35"
    assert report._cell("ms", 0.0) == "0"


def test_table_fraction_of_copy_keeps_two_decimals():
    # 0.86 fails layernorm.py's ">= 0.90" acceptance and 0.94 passes it: both print as "0.9" now
    cells = report.format_table([{"fraction_of_copy": 0.86}, {"fraction_of_copy": 0.94}],
                                ("fraction_of_copy",)).splitlines()[-2:]
    values = [float(c.strip().rstrip("%")) / (100.0 if c.strip().endswith("%") else 1.0) for c in cells]
    assert cells[0] != cells[1]
    assert abs(values[0] - 0.86) < 0.005 and abs(values[1] - 0.94) < 0.005


def test_table_nan_ratio_is_an_empty_cell():
    assert "nan" not in report.format_table([{"op": "x", "vs torch": float("nan")}], ("op", "vs torch"))


def test_fixed_width_and_key_values_with_missing_and_special_values():
    text = report.format_fixed_width([{"a": 1.0, "b": None}, {"a": 2, "c": "err"}], ["a", "b", "c"], 6,
                                     {"a": "{:.2f}x"})
    assert text.splitlines() == ["     a       b       c", " 1.00x" + " " * 16, "     2" + " " * 13 + "err"]
    assert report.format_key_values({"ms": 1.23456789, "n": 3, "e": None}) == "ms=1.235 n=3 e=None"


# =====================================================================================================
# report: plots (one point, one provider, nothing timed)
# =====================================================================================================
@pytest.mark.skipif(not HAS_MATPLOTLIB, reason="matplotlib is not installed")
def test_plot_op_with_one_point_and_one_provider(tmp_path):
    rows = [{"op": "softmax", "shape": "M=4 N=64", "dtype": "fp32", "provider": "torch", "unit": "GB/s",
             "GB/s": 12.5},
            {"op": "softmax", "shape": "M=4 N=64", "dtype": "fp32", "provider": "fusedops", "unit": "GB/s",
             "GB/s": None, "check": "error"}]
    path = report.plot_op("softmax", rows, tmp_path / "deep" / "softmax.png", ceiling=None)
    assert path.read_bytes().startswith(b"\x89PNG")
    assert report.plot_op("softmax", rows[1:], tmp_path / "none.png") is None     # nothing timed
    assert not (tmp_path / "none.png").exists()
    assert report.plot_message(None).startswith("plot: skipped")


@pytest.mark.skipif(not HAS_MATPLOTLIB, reason="matplotlib is not installed")
def test_script_plots_with_a_single_point(tmp_path):
    import warnings

    attention, softmax = _load("attention"), _load("softmax")
    with warnings.catch_warnings():
        warnings.simplefilter("error")      # a log axis or a legend over one point must not warn
        point = {"dtype": "fp16", "B": 16, "H": 32, "S": 1024, "E": 64, "causal": False, "pass": "forward",
                 "provider": "fusedops", "ms": 1.0, "TFLOP/s": 100.0}
        assert attention.plot([point, {"provider": "torch-math", "error": "x"}], tmp_path / "a.png").exists()
        row = softmax.result_row("softmax", "forward", 1024, "fp16", "torch", 0.1, 10**8, 0.1, 0.1)
        assert softmax.plot([row], tmp_path / "s.png").exists()
    assert attention.plot([{"provider": "fusedops", "error": "x"}], tmp_path / "none.png") is None


def test_attention_table_of_a_failed_provider():
    attention = _load("attention")
    rows = [{"dtype": "fp16", "S": 1024, "provider": "torch-cudnn", "error": "RuntimeError: " + "z" * 300}]
    line = attention.format_table(rows).splitlines()[1]
    assert "RuntimeError: z" in line and "z" * 16 not in line


# =====================================================================================================
# runner rows on the CPU: failures, missing baseline, degenerate timers
# =====================================================================================================
def _rows(case, names=("torch", "fusedops"), timer=_host_timer, ceiling=1000.0):
    messages = []
    rows = runner.measure_point(_point(case), names, timer, ceiling=ceiling, device="cpu", say=messages.append)
    return rows, messages


def test_ratios_when_the_baseline_failed():
    def broken(x):
        raise RuntimeError("torch refused")

    case = dataclasses.replace(_softmax_case(lambda x: torch.softmax(x, dim=-1)), torch_fn=broken,
                               reference_fn=lambda x: torch.softmax(x, dim=-1))
    rows, messages = _rows(case)
    assert [(r["provider"], r["check"]) for r in rows] == [("torch", "error"), ("fusedops", "ok")]
    assert rows[1]["vs torch"] is None and rows[1]["GB/s"] > 0        # no ratio, no ZeroDivisionError
    assert "torch refused" in messages[0]
    assert runner._status(rows, [object()])[0] == 0                     # a baseline's failure is not ours


def test_one_provider_only():
    rows, _ = _rows(_softmax_case(lambda x: torch.softmax(x, dim=-1)), names=("fusedops",))
    assert len(rows) == 1 and rows[0]["check"] == "ok" and rows[0]["vs torch"] is None


def test_zero_ms_timer_gives_no_rate_instead_of_dividing_by_zero():
    # triton#6868 / #8948: a 0 ms measurement
    rows, _ = _rows(_softmax_case(lambda x: torch.softmax(x, dim=-1)), timer=lambda fn: [0.0, 0.0, 0.0])
    assert all(r["ms"] == 0.0 and r["GB/s"] is None and r["vs torch"] is None for r in rows)


def test_empty_timer_is_a_reported_error_not_a_crash():
    # pytest-speed#5: statistics over no samples
    rows, messages = _rows(_softmax_case(lambda x: torch.softmax(x, dim=-1)), timer=lambda fn: [])
    assert [r["check"] for r in rows] == ["error", "error"]
    assert "StatisticsError" in rows[1]["note"] and messages
    status, message = runner._status(rows, [object()])
    assert status == 1 and "1 of 1 fusedops checks failed" in message


def test_no_ceiling_leaves_percent_empty():
    rows, _ = _rows(_softmax_case(lambda x: torch.softmax(x, dim=-1)), ceiling=None)
    assert rows[0]["% of ceiling"] is None and rows[0]["GB/s"] > 0


def test_gpu_timer_rejects_zero_repeats_before_touching_cuda():
    with pytest.raises(ValueError, match="repeats must be at least 1"):
        timing.gpu_times_ms(lambda: None, repeats=0)
    with pytest.raises(ValueError, match="no ceiling for the unit"):
        timing.Ceilings(1.0, 1.0).for_unit("ms")


def test_write_outputs_on_cpu_rows(tmp_path, capsys):
    rows, _ = _rows(_softmax_case(lambda x: torch.softmax(x, dim=-1)))
    settings = runner.Settings(cases=(cases.CASES_BY_NAME["softmax"],), out=str(tmp_path / "new"))
    paths = runner.write_outputs(rows, settings, timing.Ceilings(3000.0, 700.0), dict(ENV, cuda=""),
                                 say=lambda text: None)
    names = sorted(p.name for p in paths)
    assert names[:3] == ["results.csv", "results.json", "results.md"]
    assert (tmp_path / "new" / "results.md").read_text().startswith("test-gpu, driver 1.0")
    loaded = json.loads((tmp_path / "new" / "results.json").read_text())
    assert loaded[0]["copy_GB_per_s"] == 3000.0


def test_plan_says_why_a_dtype_selection_leaves_a_case_out():
    settings = runner.Settings(cases=(cases.CASES_BY_NAME["matmul"],), dtypes=(torch.float32,))
    points, skipped = runner.plan(settings)
    assert points == [] and any("matmul" in line and "fp32" in line for line in skipped)
    assert runner._status([], points)[0] == 1


# =====================================================================================================
# the case table against the issues' shapes and the scripts' byte counts
# =====================================================================================================
def test_attention_shapes_keep_tokens_and_model_dim():
    case = cases.CASES_BY_NAME["attention"]
    for b, h, s, e, causal in case.shapes + case.quick_shapes:
        assert b * s == 16384 and h * e == 2048 and isinstance(causal, bool)
    assert {s for _, _, s, _, _ in case.shapes} == {1024, 2048, 4096, 8192, 16384}


def test_odd_n_shapes_are_present_and_labelled():
    softmax = cases.CASES_BY_NAME["softmax"]
    assert {1000, 50257} <= {n for _, n in softmax.shapes}
    assert 4097 in {n for _, n in cases.CASES_BY_NAME["layer_norm"].shapes}
    assert softmax.label((8192, 50257)) == "M=8192 N=50257"
    assert cases.CASES_BY_NAME["attention"].label((1, 2, 17, 64, False)) == "B=1 H=2 S=17 E=64"
    assert cases.CASES_BY_NAME["attention"].label((1, 2, 17, 64, True)).endswith("causal")


@pytest.mark.parametrize("op, has_bias", [("layer_norm", True), ("rms_norm", False)])
def test_layernorm_script_counts_the_bytes_of_the_case_table(op, has_bias):
    layernorm = _load("layernorm")
    script_op = layernorm.OPS[op]
    for n in (1000, 4097, 32768):
        for backward in (False, True):
            case = cases.CASES_BY_NAME[op + ("_backward" if backward else "")]
            assert script_op.bytes(n, 2, backward) == case.work((layernorm.M, n), 2)


def test_attention_script_counts_the_flops_of_the_case_table():
    case = cases.CASES_BY_NAME["attention"]
    for b, h, s, e, causal in case.shapes:
        assert case.work((b, h, s, e, causal), 2) == 4.0 * b * h * s * s * e * (0.5 if causal else 1.0)
        assert cases.CASES_BY_NAME["attention_backward"].work((b, h, s, e, causal), 2) == \
            2.5 * case.work((b, h, s, e, causal), 2)


# =====================================================================================================
# checks and the self-check's verdict on edge inputs
# =====================================================================================================
@pytest.mark.parametrize("actual, reference, finite", [
    (torch.tensor([1.0, float("nan")]), torch.tensor([1.0, 2.0], dtype=torch.float64), False),
    (torch.tensor([float("inf")]), torch.tensor([float("-inf")], dtype=torch.float64), False),
    (torch.tensor([float("nan"), 1.0]), torch.tensor([float("nan"), 1.0], dtype=torch.float64), True),
    (torch.tensor([1.0, 2.0]), torch.tensor([float("nan"), 2.0], dtype=torch.float64), False),
    (torch.ones(2, 1), torch.ones(2, dtype=torch.float64), False),         # broadcastable is not equal
    (None, torch.ones(2, dtype=torch.float64), False),
    (torch.empty(0), torch.empty(0, dtype=torch.float64), True),
    (torch.zeros(3), torch.zeros(3, dtype=torch.float64), True),
])
def test_measure_error_edge_inputs(actual, reference, finite):
    error = checks.measure_error(actual, reference)
    assert error.finite == finite
    if finite:
        assert error == checks.Error(0.0, 0.0)


def test_checks_verdicts():
    flat = checks.allowed_error(torch.float16, None)
    assert flat == checks.Error(2e-3, 8e-3)
    assert checks.allowed_error(torch.float16, checks.INFINITE) == flat      # a broken baseline widens nothing
    assert not checks.within(checks.Error(math.nan, 0.0), flat)
    assert checks.within(checks.Error(2e-3, 8e-3), flat)                      # the bound itself passes
    with pytest.raises(ValueError, match="no tolerance for torch.int32"):
        checks.tolerance(torch.int32)


def test_selfcheck_verdict_of_nothing_and_of_failures(capsys):
    assert selfcheck._verdict([], 0.0) == 1
    assert "nothing was checked" in capsys.readouterr().err
    outcomes = [selfcheck.Outcome("interpreter", "a", True, "ok"), selfcheck.Outcome("ptx", "b", False, "boom")]
    assert selfcheck._verdict(outcomes, 1.0) == 1
    err = capsys.readouterr().err
    assert "1 of 2 checks failed" in err and "FAIL  ptx          b: boom" in err
    assert selfcheck._verdict(outcomes[:1], 1.0) == 0


def test_selfcheck_with_a_dtype_no_case_has_checks_nothing(capsys):
    case = dataclasses.replace(cases.CASES_BY_NAME["matmul"],
                                     fusedops=lambda: lambda a, b: torch.matmul(a, b))
    assert selfcheck.check_cases([case], [torch.float32]) == 1
    captured = capsys.readouterr()
    assert "skipped matmul: no fp32 case" in captured.out and "nothing was checked" in captured.err


# =====================================================================================================
# defect 7: one failing provider loses a script's whole run
# =====================================================================================================
def test_softmax_script_keeps_the_other_providers_when_one_fails(monkeypatch):
    softmax = _load("softmax")
    monkeypatch.setattr(softmax, "DEVICE", "cpu")
    monkeypatch.setattr(softmax, "M", 4)
    monkeypatch.setattr(scripts, "copy_call", lambda nbytes, device="cuda": lambda: None)
    # the copy and the providers are timed in interleaved rounds (session 32); a raising provider fails the
    # rounds, and each is then timed alone
    monkeypatch.setattr(timing, "interleaved_gpu_times_ms",
                        lambda fns, **options: {name: (fn(), 0.5)[1] for name, fn in fns.items()})
    monkeypatch.setattr(timing, "gpu_time_ms", lambda fn, **options: (fn(), 0.5)[1])
    original = softmax.providers

    def providers_with_a_broken_one(x, dy, log, use_compile):
        table, y = original(x, dy, log, False)
        table = {name: {p: (lambda: None) for p in fns} for name, fns in table.items()}   # CPU: time nothing

        def refuse():
            raise RuntimeError("backend refused the shape")

        table["torch.compile"] = {p: refuse for p in softmax.PASS_BYTES}
        return table, y

    monkeypatch.setattr(softmax, "providers", providers_with_a_broken_one)
    rows = softmax.bench_shape("fp16", 16, False, True, 1)
    assert {r["provider"] for r in rows if r.get("ms")} == {"fusedops", "torch", "naive eager"}
    assert any(r["provider"] == "torch.compile" and "refused" in str(r.get("error")) for r in rows)
    assert "refused" in softmax.format_table(rows) or "error" in softmax.format_table(rows)


def test_layernorm_script_keeps_the_other_providers_when_one_fails(monkeypatch):
    """Defect 7's twin in bench/layernorm.py's measure (fixed in session 28): a provider that raises becomes
    an error row, the others are timed, compared and kept, and the acceptance lines say it was not measured."""
    layernorm = _load("layernorm")
    monkeypatch.setattr(layernorm, "M", 4)
    monkeypatch.setattr(scripts, "copy_call", lambda nbytes, device="cuda": lambda: None)
    monkeypatch.setattr(timing, "interleaved_gpu_times_ms",
                        lambda fns, **options: {name: (fn(), 0.5)[1] for name, fn in fns.items()})
    monkeypatch.setattr(timing, "gpu_time_ms", lambda fn, **options: (fn(), 0.5)[1])

    def inputs(op, n, dtype):
        x = torch.randn(4, n, dtype=torch.float32)
        params = (torch.ones(n), torch.zeros(n)) if op.has_bias else (torch.ones(n),)
        return (x,) + params, torch.randn(4, n)
    monkeypatch.setattr(layernorm, "_inputs", inputs)

    def refuse(*args):
        raise RuntimeError("backend refused the shape")

    def providers(op, n, compile_torch):
        torch_fn = (lambda x, w, b: torch.nn.functional.layer_norm(x, (n,), w, b)) if op.has_bias else \
            (lambda x, w: torch.nn.functional.layer_norm(x, (n,), w))
        return {"torch": torch_fn, "fusedops": torch_fn, "torch.compile": refuse}
    monkeypatch.setattr(layernorm, "_providers", providers)
    op = layernorm.OPS["layer_norm"]
    rows = layernorm.measure(op, 1024, "fp16", False, True, False)
    assert {r["provider"] for r in rows if r.get("ms")} == {"torch", "fusedops"}
    failed, = [r for r in rows if r["provider"] == "torch.compile"]
    assert failed["ms"] is None and "refused" in failed["error"] and failed["vs torch"] is None
    assert all(r["vs torch"] == 1.0 for r in rows if r.get("ms"))
    assert not any("not measured" in line for line in layernorm.acceptance(rows))


def test_the_scripts_time_the_others_alone_when_one_raises_in_the_rounds(monkeypatch):
    """bench/layernorm.py and bench/softmax.py time the copy and the providers in interleaved rounds (sessions 31,
    32: fusedops.bench.timing.times_or_failures_ms); a function that raises there fails the rounds, and each is
    then timed alone: the one that raised maps to its exception."""
    calls = []

    def rounds(fns, **options):
        calls.append(sorted(fns))
        for fn in fns.values():
            fn()
        raise AssertionError("unreachable: a function raised")

    monkeypatch.setattr(timing, "interleaved_gpu_times_ms", rounds)
    monkeypatch.setattr(timing, "gpu_time_ms", lambda fn, **options: (fn(), 0.25)[1])

    def refuse():
        raise RuntimeError("illegal shape")
    times = timing.times_or_failures_ms({"copy": lambda: None, "torch": lambda: None, "broken": refuse})
    assert calls == [["broken", "copy", "torch"]]
    assert times["copy"] == times["torch"] == 0.25
    assert isinstance(times["broken"], RuntimeError) and "illegal shape" in str(times["broken"])
