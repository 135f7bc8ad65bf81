"""CPU tier of the per-op scripts of bench/ (`python bench/softmax.py --out DIR`, ...) and of what they
share (fusedops.bench.scripts, and the tables and plots of fusedops.bench.report): their command
lines, printed tables, CSV columns and plots on made-up rows. The runs themselves need the H200.
"""

from __future__ import annotations

import argparse

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from fusedops.bench import report, scripts, timing

BENCH = Path(__file__).resolve().parents[1] / "bench"
SCRIPTS = ("attention", "matmul", "softmax", "layernorm", "vector_add")
ENV = {"gpu": "test-gpu", "driver": "1.0", "torch": "2.x", "fusedops": "0"}
HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None


def _load(name):
    """bench/<name>.py as the module bench_<name> (bench/ is not a package)."""
    module_name = f"bench_{name}"
    if module_name not in sys.modules:
        spec = importlib.util.spec_from_file_location(module_name, BENCH / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module       # dataclasses look their module up while it executes
        spec.loader.exec_module(module)
    return sys.modules[module_name]


def _csv_header(rows, tmp_path, name):
    csv_path, _ = report.write_rows(rows, str(tmp_path), name, ENV)
    return csv_path.read_text().splitlines()[0].split(",")


# -- the command lines ------------------------------------------------------------------------------
@pytest.mark.parametrize("name, options", [
    ("attention", ["--out", "--quick", "--dtypes", "--seqlens", "--head-dims", "--compile"]),
    ("matmul", ["--out", "--quick", "--dtypes", "--shapes", "--epilogue", "--no-triton", "--store-variants"]),
    ("softmax", ["--out", "--quick", "--dtypes", "--ns", "--log", "--no-compile", "--sweep", "--details"]),
    ("layernorm", ["--out", "--name", "--quick", "--ops", "--dtypes", "--no-compile", "--sweep"]),
    ("vector_add", ["--out"]),
])
def test_help_lists_the_options(name, options, capsys):
    with pytest.raises(SystemExit) as exit_info:
        _load(name).main(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith("usage: ")
    positions = [text.index(f"  {option} ") for option in options]
    assert positions == sorted(positions), text           # declared in this order, as before
    assert f"python bench/{name}.py" in text               # the docstring, printed as written


@pytest.mark.parametrize("name, argv", [
    ("softmax", ["--no-compile", "--dtypes", "fp16", "--out", "DIR", "--sweep", "--details"]),
    ("layernorm", ["--no-compile", "--ops", "layer_norm,rms_norm", "--dtypes", "fp16", "--out", "DIR", "--sweep"]),
    ("vector_add", ["--out", "DIR"]),
])
def test_lead_commands_parse_and_say_there_is_no_gpu(name, argv, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert _load(name).main(argv) == 0
    assert capsys.readouterr().out == "no CUDA GPU: nothing to benchmark\n"


@pytest.mark.parametrize("name", ["attention", "matmul"])
def test_tensor_core_scripts_without_a_gpu_exit(name, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match=f"bench/{name}.py needs a CUDA GPU"):
        _load(name).main(["--quick", "--out", "DIR"])


def test_argument_parser_and_run_size():
    parser = scripts.argument_parser("doc", quick="N in [1]")
    args = parser.parse_args([])
    assert (args.out, args.quick, args.dtypes) == ("bench-results", False, ["fp16", "bf16"])
    assert scripts.run_dtypes(args) == ["fp16", "bf16"] and scripts.run_repeats(args) == 30
    quick = parser.parse_args(["--quick", "--dtypes", "bf16", "--out", "x"])
    assert scripts.run_dtypes(quick) == ["fp16"] and scripts.run_repeats(quick) == 10 and quick.out == "x"
    assert not hasattr(scripts.argument_parser("doc").parse_args([]), "quick")
    assert scripts.int_list("1024,50257") == [1024, 50257] and scripts.int_list(" 7") == [7]
    assert scripts.shape_list("1x2x3, 4x5x6") == [(1, 2, 3), (4, 5, 6)]
    for bad in ("0", "-5", "abc", "1,,2", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="positive integers"):
            scripts.int_list(bad)
    for bad in ("4096x4096", "1x2x0", "axbxc"):
        with pytest.raises(argparse.ArgumentTypeError, match="MxNxK"):
            scripts.shape_list(bad)


# -- shared helpers -----------------------------------------------------------------------------------
def test_relative_error_of_tensors_and_sequences():
    expected = torch.tensor([3.0, 4.0])
    assert scripts.relative_error(expected.half(), expected) == 0.0
    assert scripts.relative_error(torch.tensor([3.0, 4.5]), expected) == pytest.approx(0.1)
    pairs = (torch.tensor([3.0, 4.5]), torch.tensor([1.0, 1.0]))
    assert scripts.relative_error(pairs, (expected, torch.tensor([1.0, 1.0]))) == pytest.approx(0.1)
    assert scripts.relative_error(torch.ones(2), torch.zeros(2)) > 1e20      # no division by zero


def test_failure_text_is_cut():
    assert scripts.failure_text(ValueError("x" * 300), 160) == "ValueError: " + "x" * 160
    assert scripts.failure_text(RuntimeError("boom")) == "RuntimeError: boom"


def test_fixed_width_table():
    rows = [{"a": 1.23456, "flag": True, "speed": 2.0, "name": "p"}, {"a": None, "flag": False}]
    text = report.format_fixed_width(rows, ["name", "a", "flag", "speed"], 6, {"speed": "{:.1f}x"})
    assert text.splitlines() == ["  name       a    flag   speed",
                                 "     p   1.235       1    2.0x",   # bools print as 1/0, as before
                                 "                     0        "]


def test_key_values():
    assert report.format_key_values({"op": "sweep", "ms": 0.0123456, "N": 4}) == "op=sweep ms=0.01235 N=4"


def test_plot_panels_without_panels_or_matplotlib(tmp_path, monkeypatch):
    assert report.plot_panels(tmp_path / "x.png", [], lambda axis, panel: None, columns=1, panel_size=(1, 1)) is None
    assert report.plot_message(None).startswith("plot: skipped")
    assert report.plot_message(tmp_path / "x.png") == f"plot: {tmp_path / 'x.png'}"
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert report.plot_panels(tmp_path / "x.png", [1], lambda axis, panel: None, columns=1, panel_size=(1, 1)) is None


@pytest.mark.skipif(not HAS_MATPLOTLIB, reason="matplotlib is not installed")
def test_plot_panels_draws_each_panel_in_a_grid(tmp_path):
    drawn = []
    path = report.plot_panels(tmp_path / "sub" / "grid.png", ["a", "b", "c"],
                              lambda axis, panel: drawn.append((panel, axis.get_subplotspec().get_geometry())),
                              columns=2, panel_size=(2, 2))
    assert path.read_bytes().startswith(b"\x89PNG")
    assert [(panel, geometry[2]) for panel, geometry in drawn] == [("a", 0), ("b", 1), ("c", 2)]


# -- each script's table, CSV columns and plot on made-up rows --------------------------------------------
def _attention_rows():
    label = {"dtype": "fp16", "B": 4, "H": 16, "S": 4096, "E": 128, "causal": True}
    return [dict(label, provider="fusedops", **{"pass": "forward"}, ms=1.234567, **{"TFLOP/s": 456.789},
                 **{"vs flash": 1.1}),
            dict(label, provider="torch-flash", **{"pass": "forward"}, ms=1.3, **{"TFLOP/s": 430.0},
                 rel_diff=1.234e-3, **{"vs flash": 1.0}),
            dict(label, provider="torch-math", error="OutOfMemoryError: CUDA out of memory. Tried")]


def test_attention_table_and_csv(tmp_path):
    attention = _load("attention")
    lines = attention.format_table(_attention_rows()).splitlines()
    assert lines[0].split() == ["dtype", "B", "H", "S", "E", "causal", "pass", "provider", "ms", "TFLOP/s", "vs",
                                "flash", "rel_diff"]
    assert lines[1].split() == ["fp16", "4", "16", "4096", "128", "1", "forward", "fusedops", "1.235", "456.789",
                                "1.10x"]
    assert lines[2].split()[-1] == "1.2e-03"
    assert lines[3].split()[-2:] == ["torch-math", "OutOfMemoryErro"]      # the error, where ms would be
    assert all(len(line) == len(lines[0]) for line in lines)
    header = _csv_header(_attention_rows(), tmp_path, "attention")
    assert header[:11] == ["dtype", "B", "H", "S", "E", "causal", "provider", "pass", "ms", "TFLOP/s", "vs flash"]
    assert {"rel_diff", "error", "gpu", "fusedops"} <= set(header)
    if HAS_MATPLOTLIB:
        assert attention.plot(_attention_rows(), tmp_path / "attention.png").read_bytes().startswith(b"\x89PNG")


def _matmul_rows():
    shape = {"op": "matmul", "M": 4096, "N": 4096, "K": 4096, "dtype": "fp16"}
    return [dict(shape, provider="torch", ms=0.2, **{"TFLOP/s": 687.1}, rel_error=1e-4, **{"vs torch": 1.0}),
            dict(shape, provider="fusedops", ms=0.25, **{"TFLOP/s": 550.0}, rel_error=2e-4, **{"vs torch": 0.8},
                 config="Config(128, 256, 64)", kernel="tma"),
            dict(shape, provider="triton", error="ImportError: no triton")]


def test_matmul_table_and_csv(tmp_path):
    matmul = _load("matmul")
    lines = matmul.format_table(_matmul_rows()).splitlines()
    assert lines[0] == "     dtype           M           N           K    provider          ms     TFLOP/s" \
                       "    vs torch   rel_error"
    assert lines[2] == "      fp16        4096        4096        4096    fusedops       0.250     550.000" \
                       "       0.80x    2.00e-04"
    assert lines[3].split() == ["fp16", "4096", "4096", "4096", "triton"]
    assert lines[4] == "fp16 4096x4096x4096 fusedops (tma kernel): Config(128, 256, 64)"
    header = _csv_header(_matmul_rows(), tmp_path, "matmul")
    assert header[:10] == ["op", "M", "N", "K", "dtype", "provider", "ms", "TFLOP/s", "rel_error", "vs torch"]
    assert {"config", "error", "gpu", "fusedops"} <= set(header)
    if HAS_MATPLOTLIB:
        assert matmul.plot(_matmul_rows(), tmp_path / "matmul.png").read_bytes().startswith(b"\x89PNG")


def test_softmax_table_and_csv(tmp_path):
    softmax = _load("softmax")
    nbytes = 2 * softmax.M * 1024 * 2
    rows = [softmax.result_row("softmax", pass_name, 1024, "fp16", provider, ms, nbytes, 0.01, 0.02)
            for pass_name in softmax.PASS_BYTES for provider, ms in (("torch", 0.02), ("fusedops", 0.015))]
    lines = softmax.format_table(rows).splitlines()
    assert lines[0] == "pass     dtype      N provider              ms     GB/s  of copy vs torch"
    assert lines[1] == "-" * len(lines[0])
    assert lines[3] == "forward  fp16    1024 fusedops          0.0150     2237    66.7%    1.33x"
    assert _csv_header(rows, tmp_path, "softmax")[:11] == [
        "op", "pass", "M", "N", "dtype", "provider", "ms", "GB/s", "copy_GB/s", "fraction_of_copy",
        "speedup_vs_torch"]
    if HAS_MATPLOTLIB:
        assert softmax.plot(rows, tmp_path / "softmax.png").read_bytes().startswith(b"\x89PNG")


def _layernorm_rows():
    rows = []
    for op, fraction, speedup in (("layer_norm", 0.95, 1.2), ("layer_norm_backward", 0.5, 1.5)):
        base = {"op": op, "shape": "8192x1024", "M": 8192, "N": 1024, "dtype": "fp16", "unit": "GB/s",
                "bytes": 100, "copy_ms": 0.01, "copy_GB/s": 3000.0}
        providers = (("fusedops", 0.01, speedup), ("torch", 0.012, 1.0))
        if op.endswith("_backward"):        # the backward's graph replays: the rows its acceptance reads
            providers += (("fusedops (graph)", 0.005, 2.4), ("torch (graph)", 0.012, 1.0))
        for provider, ms, vs_torch in providers:
            rows.append(dict(base, provider=provider, ms=ms, **{"GB/s": 2800.0}, fraction_of_copy=fraction,
                             max_error=1e-3, error="1.0e-03", **{"vs torch": vs_torch}))
    return rows


def test_layernorm_table_acceptance_and_csv(tmp_path):
    layernorm = _load("layernorm")
    rows = _layernorm_rows()
    table = report.format_table(rows, layernorm.TABLE)
    assert table.splitlines()[0].split()[:4] == ["op", "shape", "dtype", "provider"]
    assert "1.20x" in table and "0.9" in table
    assert layernorm.acceptance(rows) == [
        "PASS layer_norm 8192x1024 fp16: copy fraction 0.95 (>= 0.90), vs torch 1.20x (>= 1)",
        "PASS layer_norm_backward 8192x1024 fp16: GPU time vs torch 2.40x (>= 2); called from Python (host "
        "included) 1.50x"]
    rows[-2]["vs torch"] = 1.9
    assert layernorm.acceptance(rows)[-1].startswith("FAIL layer_norm_backward 8192x1024 fp16: GPU time vs torch 1.90x")
    assert _csv_header(rows, tmp_path, "layernorm")[:15] == [
        "op", "shape", "M", "N", "dtype", "unit", "bytes", "copy_ms", "copy_GB/s", "provider", "ms", "GB/s",
        "fraction_of_copy", "max_error", "error"]
    if HAS_MATPLOTLIB:
        assert layernorm.plot(rows, tmp_path / "layernorm.png").read_bytes().startswith(b"\x89PNG")


def test_vector_add_rows_and_csv(tmp_path):
    vector_add = _load("vector_add")
    row = vector_add.bandwidth_row(1 << 20, torch.float16, "torch.add", 0.01, 3 << 21, 0.008)
    assert report.format_key_values(row) == ("op=vector_add n=1048576 dtype=float16 provider=torch.add ms=0.01 "
                                             "GB/s=629.1 copy_GB/s=786.4 fraction_of_copy=0.8")
    assert _csv_header([row], tmp_path, "vector_add")[:8] == ["op", "n", "dtype", "provider", "ms", "GB/s",
                                                              "copy_GB/s", "fraction_of_copy"]


@pytest.mark.cuda
def test_copy_call_times_a_copy():
    assert timing.gpu_time_ms(scripts.copy_call(1 << 20)) > 0
