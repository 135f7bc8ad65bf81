"""Several threads asking for the same new specialization at once compile it once.

The passes rewrite a specialization's IR in place, so two threads compiling one entry together raced
(found on the H200: `test_stub_launches_on_the_gpu_from_several_threads` failed with "Value used before
it was lowered"). Each test widens the window with a compile that sleeps, so the threads overlap.
"""

from __future__ import annotations

import threading
import time

import pytest

import fusedops.dsl as dsl
from fusedops.dsl import compiler
from helpers import run_in_threads
from test_native_launch import _scale_kernel   # the same small test kernel

pytest.importorskip("llvmlite")


@pytest.fixture
def slow_compiles(monkeypatch, tmp_path):
    """compile_function with a pause before the passes; returns the ids of the IR functions compiled."""
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    real = compiler.compile_function
    compiled = []
    lock = threading.Lock()

    def slow(function, options):
        with lock:
            compiled.append(id(function))
        time.sleep(0.05)
        return real(function, options)

    monkeypatch.setattr(compiler, "compile_function", slow)
    return compiled


def test_threads_compiling_one_new_specialization_compile_it_once(slow_compiles):
    kernel = dsl.jit(_scale_kernel.fn)
    f32 = dsl.pointer_type(dsl.float32)
    results = [None] * 8

    def work(index):
        results[index] = kernel.compile(f32, f32, 4096, 1.0, BLOCK=128, target="sm_90a")

    assert run_in_threads(work, 8) == []
    assert len(slow_compiles) == 1
    assert all(result is results[0] for result in results)
    ptx = results[0].asm["ptx"]
    assert ptx.count("ld.global") >= 1 and ptx.count("st.global") >= 1


def test_threads_compiling_different_specializations_each_get_their_own(slow_compiles):
    kernel = dsl.jit(_scale_kernel.fn)
    f32, f16 = dsl.pointer_type(dsl.float32), dsl.pointer_type(dsl.float16)
    signatures = [(f32, 4096, 128), (f16, 4096, 128), (f32, 4095, 128), (f32, 4096, 256)] * 2
    results = [None] * len(signatures)

    def work(index):
        pointer, n, block = signatures[index]
        results[index] = kernel.compile(pointer, pointer, n, 1.0, BLOCK=block, target="sm_90a")

    assert run_in_threads(work, len(signatures)) == []
    assert len(slow_compiles) == 4
    assert len({id(result) for result in results}) == 4
    for index in range(4):
        assert results[index] is results[index + 4]
    assert ".f16" in results[1].asm["ptx"] and ".f16" not in results[0].asm["ptx"]


@dsl.jit
def _parse_kernel_0(x_ptr):
    dsl.store(x_ptr, 0.0)


@dsl.jit
def _parse_kernel_1(x_ptr):
    dsl.store(x_ptr, 1.0)


@dsl.jit
def _parse_kernel_2(x_ptr):
    dsl.store(x_ptr, 2.0)


def test_kernel_sources_are_parsed_one_thread_at_a_time(monkeypatch):
    # CPython 3.11 / 3.12's ast.parse keeps its recursion depth in interpreter-wide state: threads compiling
    # different kernels at once failed with "SystemError: AST constructor recursion depth mismatch" (a CI run,
    # tests/test_review_session40_concurrency.py; cpython gh-106905). Here each parse pauses, so unserialized
    # parses overlap for sure.
    import ast
    real, active, most, lock = ast.parse, [0], [0], threading.Lock()

    def slow_parse(*args, **kwargs):
        with lock:
            active[0] += 1
            most[0] = max(most[0], active[0])
        time.sleep(0.05)
        try:
            return real(*args, **kwargs)
        finally:
            with lock:
                active[0] -= 1

    monkeypatch.setattr(ast, "parse", slow_parse)
    kernels = [_parse_kernel_0, _parse_kernel_1, _parse_kernel_2]
    assert run_in_threads(lambda i: kernels[i].ir(dsl.pointer_type(dsl.float32)), 3) == []
    assert most[0] == 1
