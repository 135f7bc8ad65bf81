"""fusedops.dsl.runtime.knobs: every variable, its parsing, its default, and its errors."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from fusedops.dsl.runtime import knobs


@pytest.fixture
def clean_env(monkeypatch):
    for variable in knobs.variables():
        monkeypatch.delenv(variable, raising=False)
    return monkeypatch


def test_defaults(clean_env, tmp_path):
    clean_env.setenv("HOME", str(tmp_path))
    settings = knobs.current()
    assert settings == knobs.Knobs(
        interpret=False,
        cache_dir=tmp_path / ".cache" / "fusedops",
        disable_cache=False,
        dump_ir=False,
        dump_dir=None,
        default_arch=None,
        libdevice_path=None,
    )


@pytest.mark.parametrize("text", ["1", "true", "TRUE", "yes", "On", " 1 "])
@pytest.mark.parametrize("variable, field", [
    ("FUSEDOPS_INTERPRET", "interpret"),
    ("FUSEDOPS_DUMP_IR", "dump_ir"),
    ("FUSEDOPS_DISABLE_CACHE", "disable_cache"),
])
def test_booleans_true(clean_env, variable, field, text):
    clean_env.setenv(variable, text)
    assert getattr(knobs.current(), field) is True


@pytest.mark.parametrize("text", ["0", "false", "No", "off", ""])
def test_booleans_false(clean_env, text):
    clean_env.setenv("FUSEDOPS_INTERPRET", text)
    assert knobs.current().interpret is False


@pytest.mark.parametrize("text", ["2", "maybe", "enabled"])
def test_boolean_typo_names_the_variable(clean_env, text):
    clean_env.setenv("FUSEDOPS_DUMP_IR", text)
    with pytest.raises(ValueError, match=f"FUSEDOPS_DUMP_IR='{text}' is not a boolean"):
        knobs.current()


def test_paths(clean_env, tmp_path):
    clean_env.setenv("HOME", str(tmp_path))
    clean_env.setenv("FUSEDOPS_CACHE_DIR", "~/kernels")
    clean_env.setenv("FUSEDOPS_DUMP_DIR", str(tmp_path / "dumps"))
    clean_env.setenv("FUSEDOPS_LIBDEVICE_PATH", "/usr/local/cuda/nvvm/libdevice/libdevice.10.bc")
    settings = knobs.current()
    assert settings.cache_dir == tmp_path / "kernels"
    assert settings.dump_dir == tmp_path / "dumps"
    assert settings.libdevice_path == Path("/usr/local/cuda/nvvm/libdevice/libdevice.10.bc")


def test_empty_cache_dir_means_default(clean_env, tmp_path):
    clean_env.setenv("HOME", str(tmp_path))
    clean_env.setenv("FUSEDOPS_CACHE_DIR", "")
    assert knobs.current().cache_dir == tmp_path / ".cache" / "fusedops"


@pytest.mark.parametrize("text, expected", [("sm_90a", "sm_90a"), ("SM_80", "sm_80"), ("sm_100a", "sm_100a"), ("", None)])
def test_default_arch(clean_env, text, expected):
    clean_env.setenv("FUSEDOPS_DEFAULT_ARCH", text)
    assert knobs.current().default_arch == expected


@pytest.mark.parametrize("text", ["90", "sm90", "compute_90", "sm_9"])
def test_bad_arch_names_the_variable(clean_env, text):
    clean_env.setenv("FUSEDOPS_DEFAULT_ARCH", text)
    with pytest.raises(ValueError, match="FUSEDOPS_DEFAULT_ARCH=.* is not a GPU architecture"):
        knobs.current()


def test_read_on_each_call_not_at_import(clean_env):
    assert knobs.current().interpret is False
    clean_env.setenv("FUSEDOPS_INTERPRET", "1")
    assert knobs.current().interpret is True


def test_explicit_mapping_ignores_os_environ(clean_env):
    clean_env.setenv("FUSEDOPS_INTERPRET", "1")
    assert knobs.current({"FUSEDOPS_DUMP_IR": "1"}).interpret is False
    assert knobs.current({"FUSEDOPS_DUMP_IR": "1"}).dump_ir is True


def test_settings_are_frozen(clean_env):
    with pytest.raises(dataclasses.FrozenInstanceError):
        knobs.current().interpret = True


def test_every_field_has_a_variable():
    names = knobs.variables()
    assert len(names) == len(dataclasses.fields(knobs.Knobs)) == len(set(names)) == 13
    assert all(name.startswith("FUSEDOPS_") for name in names)
