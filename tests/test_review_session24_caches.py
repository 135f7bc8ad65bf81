"""Review (session 24): the runtime's caches and the autotuner, CPU only.

Scope: the on-disk compile cache (fusedops/dsl/runtime/cache.py and compiler.compile_function, which
reads its entries back), the autotuner (runtime/autotune.py: keys, the on-disk record, the
interpreter's choice) and the host-side launch caches (runtime/bounded_cache.py).

The defects it found (fixed in the same session; the tests assert the correct behaviour): disk-cache entries
of kernels with tensor maps never read back (every TMA kernel recompiled per process), entries with empty
PTX / cluster_size 0 / unreadable tensor maps / JSON nested past the parser trusted or crashing; the
autotuner keying a tensor key argument on its contents and a defaulted key argument apart from the same
value passed, accepting a key on a tuned constexpr, reading `true` as index 1, crashing on a deeply nested
record, leaking its temporary file, losing entries when two processes save at once (now a file lock), and
its interpreter launches not taking the first config that compiles; BoundedCache.put of a present key
evicting another. The other tests pin behaviour that works and is easy to break. Kernels are compiled for sm_90a without a GPU
(`kernel.compile`, through a disk cache in tmp_path); the autotuner's search is driven with fake timings
(`Autotuner.select(key, measure)`), as tests/test_autotune_search.py does.
"""

from __future__ import annotations

import json
import os
import threading

import pytest
import torch

import fusedops.dsl as dsl
import fusedops.dsl.compiler as compiler
from fusedops.dsl.runtime import cache
from fusedops.dsl.runtime.bounded_cache import BoundedCache
from helpers import import_module_from_text
from test_tma_store import _box_store_kernel


# -- kernels ---------------------------------------------------------------------------------------------------

@dsl.jit
def _double_kernel(out_ptr, x_ptr, BLOCK: dsl.constexpr):
    offsets = dsl.arange(0, BLOCK)
    dsl.store(out_ptr + offsets, dsl.load(x_ptr + offsets) * 2.0)


@dsl.jit
def _scale_kernel(out_ptr, x_ptr, n, SCALE: dsl.constexpr = 2, BLOCK: dsl.constexpr = 64):
    offsets = dsl.program_id(0) * BLOCK + dsl.arange(0, BLOCK)
    mask = offsets < n
    dsl.store(out_ptr + offsets, dsl.load(x_ptr + offsets, mask=mask) * SCALE, mask=mask)


_CONFIGS = [dsl.Config({"BLOCK": 32}, num_warps=4), dsl.Config({"BLOCK": 64}, num_warps=4)]


def _count_compiles(monkeypatch) -> list:
    """A list that grows by one each time the compiler generates PTX (a disk-cache miss)."""
    calls = []
    real = compiler.compile_to_ptx

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(compiler, "compile_to_ptx", counting)
    return calls


def _only_entry(directory):
    (path,) = [p for p in directory.rglob("*.json") if not p.name.startswith(".")]
    return path


def _compile_double(kernel=None):
    x = torch.empty(64)
    return (kernel or dsl.jit(_double_kernel.fn)).compile(x, x, BLOCK=64)


# -- the on-disk compile cache -----------------------------------------------------------------------------------

def test_a_kernel_with_tensor_maps_is_read_back_from_the_disk_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("FUSEDOPS_TMA", "1")
    monkeypatch.setenv("FUSEDOPS_WS", "0")
    y, x = torch.empty(1024, 1024, dtype=torch.float16), torch.empty(64, 64, dtype=torch.float16)
    args = (y, x, 1024, 1024, 1024, 1, 0, 0)
    first = dsl.jit(_box_store_kernel.fn).compile(*args, BLOCK_R=64, BLOCK_C=64)
    assert len(first.tensor_maps) == 1
    compiles = _count_compiles(monkeypatch)
    again = dsl.jit(_box_store_kernel.fn).compile(*args, BLOCK_R=64, BLOCK_C=64)     # as a new process would
    assert again.tensor_maps == first.tensor_maps
    assert compiles == [], "the cached entry of a TMA kernel was thrown away and the kernel recompiled"


def _rewrite_entry(tmp_path, mutate) -> None:
    path = _only_entry(tmp_path)
    entry = json.loads(path.read_text())
    mutate(entry)
    path.write_text(json.dumps(entry))


def test_an_entry_with_empty_ptx_is_recompiled(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    _compile_double()
    _rewrite_entry(tmp_path, lambda entry: entry.update(ptx=""))
    compiled = _compile_double()
    assert ".entry" in compiled.asm["ptx"]


def test_an_entry_with_cluster_size_zero_is_recompiled(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    _compile_double()
    _rewrite_entry(tmp_path, lambda entry: entry.update(cluster_size=0))
    assert _compile_double().cluster_size == 1


def test_an_entry_with_unreadable_tensor_maps_is_recompiled(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    _compile_double()
    _rewrite_entry(tmp_path, lambda entry: entry.update(tensor_maps=[{}]))
    compiled = _compile_double()
    assert compiled.tensor_maps == () and ".entry" in compiled.asm["ptx"]


def test_a_deeply_nested_garbage_entry_is_recompiled(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    _compile_double()
    _only_entry(tmp_path).write_text("[" * 100_000 + "]" * 100_000)
    assert ".entry" in _compile_double().asm["ptx"]


@pytest.mark.parametrize("damage", ["truncated", "zero bytes", "not utf-8", "a list", "wrong format"])
def test_corrupt_entries_are_recompiled_and_rewritten(tmp_path, monkeypatch, damage):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    good = _compile_double().asm["ptx"]
    path = _only_entry(tmp_path)
    text = path.read_text()
    path.write_bytes({"truncated": text[: len(text) // 2].encode(), "zero bytes": b"", "not utf-8": b"\xff\xfe{",
                      "a list": b"[1, 2]", "wrong format": text.replace('"format": 1', '"format": 99').encode()}[damage])
    compiles = _count_compiles(monkeypatch)
    assert _compile_double().asm["ptx"] == good and compiles == [1]
    assert cache._well_formed(json.loads(path.read_text()))      # rewritten
    assert not [p for p in tmp_path.rglob(".tmp-*")]


def test_a_cache_dir_that_is_a_file_or_disabled_only_costs_the_cache(tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(blocker))
    assert ".entry" in _compile_double().asm["ptx"]
    assert blocker.read_text() == "x"
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("FUSEDOPS_DISABLE_CACHE", "1")
    assert ".entry" in _compile_double().asm["ptx"]
    assert not (tmp_path / "cache").exists()


def test_concurrent_writers_of_one_key_leave_one_well_formed_entry(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    entry = {"name": "k", "ir": "", "llir": "", "ptx": ".entry k" + " " * 200_000, "shared_bytes": 0}
    threads = [threading.Thread(target=cache.store, args=("ab" + "0" * 62, dict(entry, name=f"k{i}")))
               for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    loaded = cache.load("ab" + "0" * 62)
    assert loaded is not None and loaded["name"] in {f"k{i}" for i in range(8)}
    assert [p.name for p in (tmp_path / "ab").iterdir()] == ["ab" + "0" * 62 + ".json"]


def test_the_cache_key_covers_the_llvmlite_version_and_the_options(monkeypatch):
    import llvmlite

    options = compiler.CompileOptions(arch="sm_90a", num_warps=4, num_stages=3)
    base = cache.cache_key("ir", [{"divisible_by_16": True}], options)
    assert cache.cache_key("ir", [{"divisible_by_16": False}], options) != base
    assert cache.cache_key("ir", [{"divisible_by_16": True}],
                           compiler.CompileOptions(arch="sm_90a", num_warps=4, num_stages=2)) != base
    monkeypatch.setattr(llvmlite, "__version__", llvmlite.__version__ + ".post1")
    assert cache.cache_key("ir", [{"divisible_by_16": True}], options) != base


def test_rebinding_a_helper_or_a_global_the_helper_reads_recompiles(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path / "cache"))
    module = import_module_from_text(tmp_path, monkeypatch, "_rv24_helper_kernel", """
        import fusedops.dsl as dsl

        FACTOR = 3.0

        @dsl.jit
        def helper(v):
            return v * FACTOR

        @dsl.jit
        def kern(out_ptr, x_ptr, BLOCK: dsl.constexpr):
            offsets = dsl.arange(0, BLOCK)
            dsl.store(out_ptr + offsets, helper(dsl.load(x_ptr + offsets)))
    """)
    x = torch.empty(64)

    def ptx():
        return module.kern.compile(x, x, BLOCK=64).asm["ptx"].lower()

    assert "0f40400000" in ptx()                        # 3.0
    monkeypatch.setattr(module, "FACTOR", 7.0)          # a global of the helper, not of the kernel
    assert "0f40e00000" in ptx()

    @dsl.jit
    def other(v):
        return v * 5.0

    monkeypatch.setattr(module, "helper", other)        # a notebook re-running the helper's cell
    assert "0f40a00000" in ptx()


# -- the autotuner: keys -------------------------------------------------------------------------------------------

def test_a_tensor_key_argument_does_not_key_on_the_tensors_contents():
    tuner = dsl.autotune(_CONFIGS, key=["n", "x_ptr"])(_scale_kernel)
    out = torch.zeros(8)
    try:
        zeros = tuner.key_of((out, torch.zeros(8), 8), {})
        ones = tuner.key_of((out, torch.ones(8), 8), {})
    except TypeError:       # refusing a tensor as a key argument is a fine answer too
        return
    assert zeros == ones and "tensor(" not in zeros


def test_a_key_argument_at_its_default_keys_like_the_default_given_explicitly():
    tuner = dsl.autotune(_CONFIGS, key=["n", "SCALE"])(_scale_kernel)
    x = torch.zeros(8)
    assert tuner.key_of((x, x, 8), {}) == tuner.key_of((x, x, 8), {"SCALE": 2})


def test_a_key_naming_a_tuned_constexpr_is_refused_at_decoration():
    with pytest.raises(TypeError, match="BLOCK"):
        dsl.autotune(_CONFIGS, key=["n", "BLOCK"])(_scale_kernel)


def test_key_parts_by_position_or_keyword_and_value_types():
    tuner = dsl.autotune(_CONFIGS, key=["n"])(_scale_kernel)
    x, h = torch.zeros(8), torch.zeros(8, dtype=torch.float16)
    assert tuner.key_of((x, x, 8), {}) == tuner.key_of((), {"out_ptr": x, "x_ptr": x, "n": 8})
    assert tuner.key_of((x, x, 8), {}) != tuner.key_of((x, h, 8), {})          # dtypes are part of the key
    assert tuner.key_of((x, x, 8), {}) != tuner.key_of((x, x, 8.0), {})        # 8 and 8.0 specialize apart
    assert tuner.key_of((x, x, None), {}) != tuner.key_of((x, x, 0), {})


# -- the autotuner: the on-disk record ---------------------------------------------------------------------------

def _by_block(times: dict):
    return lambda config: (times[config.constexprs["BLOCK"]], False)


def test_configs_differing_only_in_warps_or_stages_are_recorded_apart(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    configs = [dsl.Config({"BLOCK": 64}, num_warps=4, num_stages=3), dsl.Config({"BLOCK": 64}, num_warps=8),
               dsl.Config({"BLOCK": 64}, num_warps=4, num_stages=2), dsl.Config({"BLOCK": 64}, num_warps=8)]
    times = {(4, 3): 3.0, (8, 3): 1.0, (4, 2): 2.0}
    tuner = dsl.autotune(configs, key=["n"])(_scale_kernel)
    assert tuner.select("k", lambda c: (times[c.num_warps, c.num_stages], False)) == configs[1]
    assert json.loads(tuner._record_path().read_text()) == {"k": 1}
    fresh = dsl.autotune(configs, key=["n"])(_scale_kernel)

    def must_not_measure(config):
        raise AssertionError("the record was not used")

    chosen = fresh.select("k", must_not_measure)
    assert (chosen.num_warps, chosen.num_stages) == (8, 3)


def test_a_record_of_another_config_list_is_not_used(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    old = dsl.autotune(_CONFIGS, key=["n"])(_scale_kernel)
    assert old.select("k", _by_block({32: 1.0, 64: 2.0})) == _CONFIGS[0]      # recorded as index 0
    reordered = dsl.autotune(_CONFIGS[::-1], key=["n"])(_scale_kernel)        # index 0 is now BLOCK=64
    assert reordered.select("k", _by_block({32: 1.0, 64: 2.0})) == _CONFIGS[0]
    assert reordered._record_path() != old._record_path()


@pytest.mark.parametrize("text", ['{"k": 7}', '{"k": -1}', '{"k": 1.0}', '{"k": "1"}', '{"k": nul', "",
                                  '[1]', '{"k": {"index": 1}}'])
def test_record_entries_out_of_range_or_unreadable_are_retuned(tmp_path, monkeypatch, text):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    tuner = dsl.autotune(_CONFIGS, key=["n"])(_scale_kernel)
    path = tuner._record_path()
    path.parent.mkdir(parents=True)
    path.write_text(text)
    assert tuner.select("k", _by_block({32: 2.0, 64: 1.0})) == _CONFIGS[1]
    assert json.loads(path.read_text())["k"] == 1


def test_a_boolean_record_entry_is_not_an_index(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    tuner = dsl.autotune(_CONFIGS, key=["n"])(_scale_kernel)
    path = tuner._record_path()
    path.parent.mkdir(parents=True)
    path.write_text('{"k": true}')
    assert tuner.select("k", _by_block({32: 1.0, 64: 2.0})) == _CONFIGS[0]


def test_a_deeply_nested_garbage_record_is_ignored(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    tuner = dsl.autotune(_CONFIGS, key=["n"])(_scale_kernel)
    path = tuner._record_path()
    path.parent.mkdir(parents=True)
    path.write_text("[" * 100_000 + "]" * 100_000)
    assert tuner.select("k", _by_block({32: 1.0, 64: 2.0})) == _CONFIGS[0]


def test_a_failed_record_write_leaves_no_temporary_file(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    tuner = dsl.autotune(_CONFIGS, key=["n"])(_scale_kernel)
    tuner._record_path().mkdir(parents=True)          # the rename onto it fails
    assert tuner.select("k", _by_block({32: 1.0, 64: 2.0})) == _CONFIGS[0]
    assert [p.name for p in tuner._record_path().parent.iterdir()] == [tuner._record_path().name]


def test_an_unwritable_cache_dir_only_costs_the_record(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(blocker))
    tuner = dsl.autotune(_CONFIGS, key=["n"])(_scale_kernel)
    assert tuner.select("k", _by_block({32: 2.0, 64: 1.0})) == _CONFIGS[1]
    assert tuner.best == {"k": _CONFIGS[1]} and blocker.read_text() == "x"


def _tune_keys(prefix: str, start) -> None:
    """In a forked process: wait for `start`, then tune 25 keys (each saves the record)."""
    tuner = dsl.autotune(_CONFIGS, key=["n"])(_scale_kernel)
    start.wait()
    for i in range(25):
        tuner.select(f"{prefix}-{i}", _by_block({32: 1.0, 64: 2.0}))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="forks two tuning processes")
def test_two_processes_saving_at_once_keep_both_entries(tmp_path, monkeypatch):
    """Each save reads the record, merges its entries and replaces the file: without the record's file lock,
    two processes doing that at once lose one's entries."""
    import multiprocessing

    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    context = multiprocessing.get_context("fork")
    start = context.Event()
    workers = [context.Process(target=_tune_keys, args=(prefix, start)) for prefix in ("a", "b")]
    for worker in workers:
        worker.start()
    start.set()
    for worker in workers:
        worker.join(60)
        assert worker.exitcode == 0
    path = dsl.autotune(_CONFIGS, key=["n"])(_scale_kernel)._record_path()
    assert json.loads(path.read_text()) == {f"{p}-{i}": 0 for p in ("a", "b") for i in range(25)}


# -- the autotuner: launching ---------------------------------------------------------------------------------------

def test_a_config_constexpr_passed_by_the_launch_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    tuner = dsl.autotune([dsl.Config({"SCALE": 3, "BLOCK": 64})], key=["n"])(_scale_kernel)
    out, x = torch.zeros(64), torch.arange(64.0)
    with pytest.raises(TypeError, match="`SCALE` is set by the autotune Configs"):
        tuner[(1,)](out, x, 64, SCALE=5, interpret=True)
    with pytest.raises(TypeError, match="num_warps"):
        tuner[(1,)](out, x, 64, num_warps=8, interpret=True)
    with pytest.raises(TypeError, match="multiple values for argument `SCALE`"):
        tuner[(1,)](out, x, 64, 5, interpret=True)                  # by position
    assert torch.equal(out, torch.zeros(64))


def test_the_interpreter_launch_sees_the_config_in_the_grid_and_keyword_arguments(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    tuner = dsl.autotune([dsl.Config({"BLOCK": 16}, num_warps=2), dsl.Config({"BLOCK": 64})],
                         key=["n"])(_scale_kernel)
    out, x = torch.zeros(40), torch.arange(40.0)
    seen = []

    def grid(meta):
        seen.append((meta["BLOCK"], meta["num_warps"], meta["SCALE"]))
        return ((meta["n"] + meta["BLOCK"] - 1) // meta["BLOCK"],)

    tuner[grid](out_ptr=out, x_ptr=x, n=40, SCALE=3, interpret=True)
    assert seen == [(16, 2, 3)] and torch.equal(out, x * 3)
    assert tuner.best == {} and not tuner._record_path().parent.exists()     # no timing, no record


def test_the_interpreter_uses_the_first_config_that_fits(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    tuner = dsl.autotune([dsl.Config({"BLOCK": 3}), dsl.Config({"BLOCK": 64})], key=["n"])(_scale_kernel)
    out, x = torch.zeros(64), torch.arange(64.0)
    tuner[(1,)](out, x, 64, interpret=True)
    assert torch.equal(out, x * 2)


# -- host-side launch caches ---------------------------------------------------------------------------------------

def test_bounded_cache_replacing_a_key_evicts_nothing():
    launches = BoundedCache(2)
    launches.put("a", 1)
    launches.put("b", 2)
    launches.put("b", 3)
    assert launches == {"a": 1, "b": 3}


def test_bounded_cache_stays_bounded():
    launches = BoundedCache(4)
    for i in range(100):
        assert launches.put(i, i * i) == i * i
    assert launches == {96: 9216, 97: 9409, 98: 9604, 99: 9801}
