"""Review (session 40): concurrency -- threads and processes using fusedops at once (the DSL runtime's in-memory
compile caches and locks, the on-disk cache, os.fork, spawned workers, torch.compile in a thread, the library's
lazily built tables). CPU only: values come from the NumPy interpreter, PTX is compiled for sm_80 / sm_90a with
llvmlite; threads are lined up with threading.Barrier, forks run their child under an alarm (a hang fails the
test instead of hanging it).

What was tried (the peer report each case mirrors in brackets), and what was right:
- (read first: test_concurrent_compile.py, sessions 24 / 26 / 27 / 35 / 39 pin threads compiling one or several
  specializations of one kernel, threads launching through the native stubs and cached plans, concurrent cache
  writers of one key, forked processes compiling one kernel into one cache, threads tuning one autotuned kernel,
  an unwritable cache directory, unreadable / corrupt records);
- the first call of every op (softmax, layer_norm, rms_norm, matmul, attention, an nn module, a torch.ops operator)
  from six threads at once in a fresh process, forward and backward [ROCm/aiter#4966: lru_cache misses traced
  one kernel twice; pytorch#192368: a process-global cache reached from a second thread] -- right;
- threads compiling different library kernels at once (norm forward, a wgmma dot, attention forward) give the PTX
  a serial compile gives [triton#5933: kernels failing to compile from several threads] -- right;
- torch.compile(fullgraph=True) of fusedops ops called from two threads at once -- right;
- the tensor-map encoder's caches (TensorMapEncoder) hit from threads with different addresses, cleared while
  full -- right (each launch gets the maps of its own addresses);
- a forked child (a DataLoader worker) of a parent that compiled and ran kernels: the interpreter, cached and new
  compiles, and a library op work there [triton#10938, pytorch#184643: CUDA state poisoned across fork];
  CPU-only use (the interpreter, torch's fallback, compiling to PTX, an autotuned kernel in the interpreter)
  never calls into CUDA (torch.cuda.* or the driver), so it cannot poison a later fork -- right;
- spawned processes compiling one kernel into one cache directory while the parent compiles it too (the
  kernel pickled to them by reference) [triton#11512: concurrent multi-process compiles into a shared cache
  dir crash] -- right: one entry, one PTX;
- a cache directory that fills up (ENOSPC) in the middle of writing an entry -- right: the compile returns, no
  partial or temporary file is left, a later compile writes the entry;
- concurrent first imports of `fusedops.nn` and `fusedops.nn.patch` from two threads can fail with
  "ImportError: cannot import name ... from partially initialized module" / _DeadlockError: CPython's import
  locks (python/cpython#83065, fixed in 3.15: a package whose __init__ imports its submodule), not fusedops';
  fusedops' own call-time imports (first calls from threads, above) never failed in about 40 runs.

DEFECTS (fixed this session; their tests below pass):

1. os.fork while another thread compiles hangs the child for ever. (a) A kernel's compile lock (JITFunction
   `_compile_lock`, held through the whole compile) stays held in the child by a thread the child does not have:
   every later use of that kernel there (another specialization, the interpreter, `ir`) waits for ever. (b)
   llvmlite runs every call into LLVM under one process-wide lock: a fork while another thread is inside LLVM
   (most of a compile's time) leaves the child that lock held, so its first compile of any kernel waits for
   ever. [the at-fork lock bugs of ruby#10889 / flang#1025; a DataLoader forking workers while a background
   thread warms kernels up]. Fix: runtime/jit.py registers an after-fork hook that gives every kernel a new
   compile lock in the child and drops its GPU specializations not compiled yet (their IR may be half rewritten
   by the passes); target/ptx.py makes the fork take llvmlite's lock first (it waits for the LLVM call in flight)
   and release it in both processes.
2. A compile interrupted part way (KeyboardInterrupt in a notebook during a slow first compile; any exception
   raised after the passes started) left the specialization's entry with its IR half rewritten in place, and
   the next launch or compile of that specialization compiled the rewritten IR again: a wgmma dot kernel then
   raised a raw "TypeError: 'SharedOperand' object is not subscriptable" for ever in that process, attention's
   forward on sm_80 compiled to other PTX than a clean compile. A deterministic failure did the same: a compile
   that LLVM refused (BackendError) raised that raw TypeError on its next attempt instead of the BackendError (an
   autotuned config that fails, tried again for another key). Fix: runtime/jit.py `_compiled_entry` drops the
   entry when its compile raises, so the next attempt starts from the frontend.

Not fixed (GPU only, in off-limits files): in a forked child of a parent that used CUDA, a cached fusedops launch
with an inherited CUDA tensor is not refused with torch's "Cannot re-initialize CUDA in forked subprocess": its plan
calls the driver directly (kernel_launcher.py / driver.py), which reports the driver's own error.
"""

from __future__ import annotations

import errno
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import warnings

import pytest
import torch
import torch.nn.functional as F

import fusedops
import fusedops.dsl as dsl
from fusedops.dsl import compiler
from fusedops.dsl.runtime import cache

pytest.importorskip("llvmlite")

_F16, _F32 = dsl.pointer_type(dsl.float16), dsl.pointer_type(dsl.float32)


@pytest.fixture
def no_disk_cache(monkeypatch):
    """Every compile really compiles (an entry on disk would hide what the in-memory state did)."""
    monkeypatch.setenv("FUSEDOPS_DISABLE_CACHE", "1")
    monkeypatch.delenv("FUSEDOPS_INTERPRET", raising=False)


# -- kernels ------------------------------------------------------------------------------------------------------
def _dot(c_ptr, a_ptr, b_ptr, K, BLOCK: dsl.constexpr):
    r = dsl.arange(0, BLOCK)
    acc = dsl.zeros((BLOCK, BLOCK), dtype=dsl.float32)
    for k in range(0, K, BLOCK):
        a = dsl.load(a_ptr + r[:, None] * K + (k + r)[None, :])
        b = dsl.load(b_ptr + (k + r)[:, None] * BLOCK + r[None, :])
        acc = dsl.dot(a, b, acc)
    dsl.store(c_ptr + r[:, None] * BLOCK + r[None, :], acc)


def _compile_dot(kernel):
    """The wgmma dot whose half-rewritten IR does not compile again (defect 2)."""
    return kernel.compile(_F32, _F16, _F16, 256, BLOCK=64, target="sm_90a", num_warps=8)


@dsl.jit
def scale_kernel(y_ptr, x_ptr, n, s, BLOCK: dsl.constexpr):
    offs = dsl.program_id(0) * BLOCK + dsl.arange(0, BLOCK)
    m = offs < n
    dsl.store(y_ptr + offs, dsl.load(x_ptr + offs, mask=m) * s, mask=m)


def _scale():
    return dsl.jit(scale_kernel.fn)     # a fresh kernel: no specialization shared with other tests


@pytest.fixture(scope="module")
def clean_dot_ptx():
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FUSEDOPS_DISABLE_CACHE", "1")
        return _compile_dot(dsl.jit(_dot)).asm["ptx"]


def _in_forked_child(work, seconds: int = 30):
    """Run `work()` (returning something JSON-able) in a child of os.fork, on one torch thread as a DataLoader worker;
    (exit status, its result or error text). The child is killed by SIGALRM after `seconds`: a hang there fails the
    test instead of hanging it."""
    read, write = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)     # 3.12+: "use of fork() may lead to deadlocks"
        pid = os.fork()
    if pid == 0:    # pragma: no cover -- the child
        code = 1
        try:
            signal.alarm(seconds)
            # as a DataLoader worker does: torch's OpenMP pool is not fork-safe (a parallel op in the child of a
            # parent that ran parallel ops waits for ever, in torch's own F.layer_norm too)
            torch.set_num_threads(1)
            os.close(read)
            try:
                text, code = json.dumps({"result": work()}), 0
            except BaseException as error:      # noqa: BLE001 -- reported to the parent
                text = json.dumps({"error": f"{type(error).__name__}: {error}"})
            os.write(write, text.encode())
        finally:
            os._exit(code)
    os.close(write)
    chunks = []
    while True:
        chunk = os.read(read, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(read)
    _, status = os.waitpid(pid, 0)
    return status, (json.loads(b"".join(chunks)) if chunks else None)


# ------------------------------------------------------------------------------------------------------------------
# DEFECT 1: os.fork while another thread compiles
# ------------------------------------------------------------------------------------------------------------------
def test_defect1_a_fork_during_a_compile_in_another_thread_leaves_the_kernel_usable_in_the_child(
        no_disk_cache, monkeypatch, clean_dot_ptx):
    """The thread is part way through the compile (the passes have rewritten the IR in place) when the main thread
    forks: in the child the kernel's compile lock was held for ever, so the interpreter, `ir` and every compile
    of the kernel waited; the entry being compiled must be generated again, not compiled half rewritten."""
    from fusedops.dsl.passes.manager import run_pipeline
    from fusedops.dsl.passes.pipeline import default_pipeline

    kernel = dsl.jit(_dot)
    inside, release = threading.Event(), threading.Event()
    real = compiler.compile_function

    def stalled(function, options):     # the passes, then a long LLVM phase (the thread gives up afterwards)
        run_pipeline(function, default_pipeline(options.num_warps, options.arch, options.num_stages))
        inside.set()
        release.wait(30)
        raise RuntimeError("the parent's compile stops here")

    monkeypatch.setattr(compiler, "compile_function", stalled)
    thread = threading.Thread(target=lambda: pytest.raises(RuntimeError, _compile_dot, kernel))
    thread.start()
    try:
        assert inside.wait(30)

        def child():
            compiler.compile_function = real
            a = torch.randn(64, 256, dtype=torch.float16)
            b = torch.randn(256, 64, dtype=torch.float16)
            c = torch.full((64, 64), float("nan"))
            kernel[(1,)](c, a, b, 256, BLOCK=64, interpret=True)
            error = float((c.double() - a.double() @ b.double()).abs().max())
            return [error, _compile_dot(kernel).asm["ptx"] == clean_dot_ptx]

        status, outcome = _in_forked_child(child)
    finally:
        release.set()
        thread.join()
    assert status == 0, (status, outcome)       # 14 (SIGALRM): the child hung
    error, same_ptx = outcome["result"]
    assert error < 1e-2 and same_ptx


def test_defect1_a_fork_while_another_thread_is_inside_llvm_leaves_compiling_usable_in_the_child(no_disk_cache):
    """llvmlite's process-wide lock was held in the child by the thread that was inside LLVM at the fork: the
    child's first compile of any kernel waited for ever. The fork now waits for that LLVM call to return."""
    from llvmlite.binding import ffi

    worker = {}
    inside = threading.Event()

    def slow_call():        # called by llvmlite with its lock held, at the start of every LLVM call
        if threading.current_thread() is worker.get("thread") and not inside.is_set():
            inside.set()
            time.sleep(0.5)

    def nothing():
        pass

    ffi.register_lock_callback(slow_call, nothing)
    try:
        worker["thread"] = threading.Thread(target=lambda: _scale().compile(_F32, _F32, 4096, 1.0, BLOCK=256,
                                                                             target="sm_80"))
        worker["thread"].start()
        assert inside.wait(30)
        status, outcome = _in_forked_child(
            lambda: ".entry" in _scale().compile(_F32, _F32, 4096, 2.0, BLOCK=128, target="sm_90a").asm["ptx"])
        worker["thread"].join()
    finally:
        ffi.unregister_lock_callback(slow_call, nothing)
    assert status == 0, (status, outcome)       # 14 (SIGALRM): the child hung
    assert outcome == {"result": True}


# ------------------------------------------------------------------------------------------------------------------
# DEFECT 2: an interrupted compile
# ------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("where", ["llvm", "passes"])
def test_defect2_an_interrupted_compile_is_compiled_again_from_the_source(no_disk_cache, monkeypatch, clean_dot_ptx,
                                                                           where):
    """Ctrl-C during the first compile of a specialization, then the same launch again: the entry kept its IR
    rewritten by the passes, and compiling that again raised a raw TypeError (or gave other code)."""
    kernel = dsl.jit(_dot)
    if where == "llvm":
        real = compiler.compile_to_ptx

        def interrupted(*args, **kwargs):
            monkeypatch.setattr(compiler, "compile_to_ptx", real)
            raise KeyboardInterrupt
        monkeypatch.setattr(compiler, "compile_to_ptx", interrupted)
    else:
        from fusedops.dsl.passes import manager
        real = manager.run_pipeline

        def interrupted(function, passes, **kwargs):   # half the pipeline, then the interrupt
            real(function, passes[:len(passes) // 2], **kwargs)
            monkeypatch.setattr(manager, "run_pipeline", real)
            raise KeyboardInterrupt
        monkeypatch.setattr(manager, "run_pipeline", interrupted)
    with pytest.raises(KeyboardInterrupt):
        _compile_dot(kernel)
    assert _compile_dot(kernel).asm["ptx"] == clean_dot_ptx
    a, b = torch.randn(64, 256, dtype=torch.float16), torch.randn(256, 64, dtype=torch.float16)
    c = torch.full((64, 64), float("nan"))
    kernel[(1,)](c, a, b, 256, BLOCK=64, interpret=True)
    assert float((c.double() - a.double() @ b.double()).abs().max()) < 1e-2


def test_a_compile_that_fails_raises_the_same_error_again(no_disk_cache, monkeypatch):
    """A deterministic failure (here LLVM refusing the module) is raised again by the next attempt, not another
    error from the half-compiled entry."""
    from fusedops.dsl.errors import BackendError

    def refused(*args, **kwargs):
        raise BackendError("LLVM refused it", stage="codegen", arch="sm_90a")

    monkeypatch.setattr(compiler, "compile_to_ptx", refused)
    kernel = dsl.jit(_dot)
    for _ in range(2):
        with pytest.raises(BackendError, match="LLVM refused it"):
            _compile_dot(kernel)


# ------------------------------------------------------------------------------------------------------------------
# Right: forked children, CPU-only use never touches CUDA
# ------------------------------------------------------------------------------------------------------------------
def test_a_forked_child_interprets_compiles_and_runs_library_ops(monkeypatch, tmp_path, seed):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("FUSEDOPS_INTERPRET", "1")
    kernel = _scale()
    compiled = kernel.compile(_F32, _F32, 4096, 1.0, BLOCK=128, target="sm_90a")
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(100, generator=gen)
    y = torch.full((100,), float("nan"))
    kernel[(4,)](y, x, 100, 2.0, BLOCK=32)
    assert torch.equal(y, x * 2)
    fusedops.softmax(x[None], -1)

    def child():
        out = torch.full((100,), float("nan"))
        kernel[(4,)](out, x, 100, 3.0, BLOCK=32)
        again = kernel.compile(_F32, _F32, 4096, 1.0, BLOCK=128, target="sm_90a") is compiled
        new = kernel.compile(_F32, _F32, 4096, 1.0, BLOCK=256, target="sm_90a").asm["ptx"]
        rows = x.double().reshape(4, 25).requires_grad_()
        got = fusedops.layer_norm(rows, (25,))
        got.sum().backward()
        want = F.layer_norm(rows.detach(), (25,))
        return [torch.equal(out, x * 3), again, ".entry" in new, float((got - want).abs().max())]

    status, outcome = _in_forked_child(child)
    assert status == 0, (status, outcome)
    same, again, new, error = outcome["result"]
    assert same and again and new and error < 1e-12
    # the child's entry is on disk: a fresh kernel here loads it
    assert len(list(tmp_path.rglob("*.json"))) == 2


def test_cpu_only_use_never_calls_into_cuda(monkeypatch, tmp_path, seed):
    """A parent that used fusedops only on the CPU (the interpreter, torch's fallback, compiling to PTX, an
    autotuned kernel in the interpreter) has not initialized CUDA, so its forked workers may still use it."""
    from fusedops.dsl.runtime import driver

    touched = []

    def refuse(name):
        def call(*args, **kwargs):
            touched.append(name)
            raise AssertionError(f"{name} was called")
        return call

    for name in ("is_available", "device_count", "init", "_lazy_init", "current_device", "get_device_capability",
                 "get_device_properties", "get_device_name", "synchronize", "current_stream", "set_device"):
        monkeypatch.setattr(torch.cuda, name, refuse(f"torch.cuda.{name}"))
    monkeypatch.setattr(driver, "cuda_driver", refuse("driver.cuda_driver"))
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(4, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    q = x[None, None]
    for interpret in ("1", "0"):
        monkeypatch.setenv("FUSEDOPS_INTERPRET", interpret)
        pairs = [(fusedops.softmax(x, -1), torch.softmax(x, -1)),
                 (fusedops.layer_norm(x, (8,)), F.layer_norm(x, (8,))),
                 (fusedops.rms_norm(x, (8,)), F.rms_norm(x, (8,))),
                 (fusedops.matmul(x, x.t()), x @ x.t()),
                 (fusedops.scaled_dot_product_attention(q, q, q, is_causal=True),
                  F.scaled_dot_product_attention(q, q, q, is_causal=True))]
        for got, want in pairs:
            assert float((got - want).detach().abs().max()) < 1e-12
            got.sum().backward()
    assert ".entry" in _scale().compile(_F32, _F32, 4096, 1.0, BLOCK=128, target="sm_90a").asm["ptx"]
    tuned = dsl.autotune([dsl.Config({"BLOCK": 16}), dsl.Config({"BLOCK": 32})], key=["n"])(_scale())
    values, out = torch.randn(40, generator=gen), torch.full((40,), float("nan"))
    tuned[lambda meta: ((40 + meta["BLOCK"] - 1) // meta["BLOCK"],)](out, values, 40, 2.0, interpret=True)
    assert torch.equal(out, values * 2)
    assert touched == []


# ------------------------------------------------------------------------------------------------------------------
# Right: threads
# ------------------------------------------------------------------------------------------------------------------
_FIRST_CALLS = textwrap.dedent("""
    import os, sys, threading, traceback
    os.environ["FUSEDOPS_INTERPRET"] = "1"
    import torch
    import torch.nn.functional as F
    import fusedops         # cheap: the ops, their kernels and tables are made by the first calls below
    N = 6
    barrier, errors, results = threading.Barrier(N), [], {}

    def job(i):
        try:
            g = torch.Generator().manual_seed(100 + i)
            x = torch.randn(3, 7, generator=g, dtype=torch.float64, requires_grad=True)
            w = torch.randn(7, generator=g, dtype=torch.float64)
            barrier.wait()
            kind = (i + int(sys.argv[1])) % N
            if kind == 0:
                got, want = fusedops.softmax(x, -1), torch.softmax(x, -1)
            elif kind == 1:
                got, want = fusedops.layer_norm(x, (7,), w), F.layer_norm(x, (7,), w)
            elif kind == 2:
                got, want = fusedops.matmul(x, w[:, None]), x @ w[:, None]
            elif kind == 3:
                q = x[None, None]
                got = fusedops.scaled_dot_product_attention(q, q, q, is_causal=True)
                want = F.scaled_dot_product_attention(q, q, q, is_causal=True)
            elif kind == 4:
                import fusedops.nn as fnn
                norm = fnn.RMSNorm(7, dtype=torch.float64)
                got, want = norm(x), F.rms_norm(x, (7,), norm.weight, norm.eps)
            else:
                import fusedops.library as flib
                got, want = torch.ops.fusedops.log_softmax(x, 0, None), torch.log_softmax(x, 0)
            grad, = torch.autograd.grad((got * w).sum(), x)
            grad_want, = torch.autograd.grad((want * w).sum(), x)
            results[i] = max(float((got - want).abs().max()), float((grad - grad_want).abs().max()))
        except BaseException:
            errors.append(traceback.format_exc())

    threads = [threading.Thread(target=job, args=(i,)) for i in range(N)]
    for t in threads: t.start()
    for t in threads: t.join()
    print("ERRORS", errors)
    print("RESULTS", sorted(results.items()))
    sys.exit(1 if errors or len(results) != N or max(results.values()) > 1e-12 else 0)
""")


def test_first_calls_of_every_op_from_threads_at_once_in_a_fresh_process():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-c", _FIRST_CALLS, "1"], capture_output=True, text=True, timeout=120,
                          env=env, cwd=root)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def test_threads_compiling_different_library_kernels_give_the_serial_ptx(no_disk_cache):
    from fusedops.kernels import norm_forward_config, norm_forward_kernels
    from fusedops.kernels.attention_forward_kernels import attention_forward_kernel

    def norm():
        x, stats = torch.empty(8, 1024, dtype=torch.float16), torch.empty(8)
        config = norm_forward_config.forward_config(1024, x.dtype, subtract_mean=True)
        return dsl.jit(norm_forward_kernels.forward_kernel.fn).compile(
            x, stats, stats, x, x[0], x[0], 8, 1024, 1024, 1, 1024, 1e-5, target="sm_90a",
            num_warps=config.num_warps, SUBTRACT_MEAN=True, BLOCK_ROWS=config.block_rows, BLOCK_N=config.block_n,
            ALIGN=8, SHIFTED_SUMS=config.shifted_sums, CACHE_HINTS=config.cache_hints)

    def attention():
        x, stats = torch.empty(16, dtype=torch.float16), torch.empty(16)
        strides = (16 * 4096 * 64, 4096 * 64, 64, 1)
        return dsl.jit(attention_forward_kernel.fn).compile(
            x, stats, x, x, x, x, *strides * 4, 0, 0, 0, 0, 16, 1, 4096, 4096, 64, 64, 0.18, 0.0, target="sm_80",
            num_warps=4, num_stages=2, BLOCK_M=64, BLOCK_N=64, BLOCK_E=64, BLOCK_EV=64, CAUSAL=True, MASK_KIND=0,
            ACC=dsl.float32, MIN_BLOCKS=1)

    jobs = [norm, lambda: _compile_dot(dsl.jit(_dot)), attention]
    serial = [job().asm["ptx"] for job in jobs]
    barrier, results = threading.Barrier(len(jobs)), [None] * len(jobs)

    def work(index):
        barrier.wait()
        results[index] = jobs[index]().asm["ptx"]

    from helpers import run_in_threads
    assert run_in_threads(work, len(jobs)) == []
    assert results == serial


def test_torch_compile_called_from_two_threads(monkeypatch, reset_dynamo, seed):
    monkeypatch.setenv("FUSEDOPS_INTERPRET", "1")

    def f(x, w):
        return fusedops.layer_norm(fusedops.softmax(x, -1), (x.shape[-1],), w) @ w[:, None]

    def reference(x, w):
        return F.layer_norm(torch.softmax(x, -1), (x.shape[-1],), w) @ w[:, None]

    barrier, errors = threading.Barrier(2), {}

    def work(index):
        compiled = torch.compile(f, backend="aot_eager", fullgraph=True, dynamic=False)
        gen = torch.Generator().manual_seed(seed + index)
        x = torch.randn(2 + index, 6, generator=gen, dtype=torch.float64, requires_grad=True)
        w = torch.randn(6, generator=gen, dtype=torch.float64, requires_grad=True)
        barrier.wait()
        got = compiled(x, w)
        grads = torch.autograd.grad(got.sum(), (x, w))
        want = reference(x, w)
        grads_want = torch.autograd.grad(want.sum(), (x, w))
        errors[index] = max(float((a - b).detach().abs().max()) for a, b in zip((got, *grads), (want, *grads_want)))

    from helpers import run_in_threads
    assert run_in_threads(work, 2) == []
    assert max(errors.values()) < 1e-12


def test_tensor_map_encoder_from_threads_gives_each_launch_its_own_maps(monkeypatch):
    from fusedops.dsl.runtime import tensor_map

    class Driver:       # the map holds the address it was encoded for
        def __init__(self):
            names = lambda prefix, *m: type("E", (), {x: x for x in m})    # noqa: E731
            self.CUtensorMapDataType = names("", "CU_TENSOR_MAP_DATA_TYPE_FLOAT16")
            self.CUtensorMapInterleave = names("", "CU_TENSOR_MAP_INTERLEAVE_NONE")
            self.CUtensorMapSwizzle = names("", "CU_TENSOR_MAP_SWIZZLE_128B")
            self.CUtensorMapL2promotion = names("", "CU_TENSOR_MAP_L2_PROMOTION_L2_256B")
            self.CUtensorMapFloatOOBfill = names("", "CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE")

        def cuTensorMapEncodeTiled(self, data_type, rank, address, dims, *rest):
            time.sleep(0)       # let another thread run inside the encoder
            return 0, address.to_bytes(8, "little") + int(dims[1]).to_bytes(8, "little") + bytes(112)

    monkeypatch.setattr(tensor_map, "MAX_CACHED_MAPS", 3)      # full caches start over while others read them
    param = tensor_map.TensorMapParam("float16", 0, (("arg", 1), ("const", 64)), (("const", 64), ("const", 1)), 1,
                                      (64, 64), 128)
    encoder = tensor_map.TensorMapEncoder([param], Driver())
    barrier, wrong = threading.Barrier(4), []

    def work(index):
        barrier.wait()
        for step in range(200):
            address, rows = 0x10000 * (1 + (index * 7 + step) % 9), 64 + 16 * index
            (encoded,) = encoder.encode((address, rows))
            if (int.from_bytes(encoded[:8], "little"), int.from_bytes(encoded[8:16], "little")) != (address, rows):
                wrong.append((index, step))

    from helpers import run_in_threads
    assert run_in_threads(work, 4) == []
    assert wrong == []


# ------------------------------------------------------------------------------------------------------------------
# Right: processes and the disk cache
# ------------------------------------------------------------------------------------------------------------------
def _compile_in_spawned_child(kernel, cache_dir: str) -> str:
    os.environ["FUSEDOPS_CACHE_DIR"] = cache_dir
    return kernel.compile(_F32, _F32, 4096, 1.0, BLOCK=512, target="sm_90a").asm["ptx"]


def test_spawned_processes_and_the_parent_compiling_one_kernel_share_one_entry(monkeypatch, tmp_path):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    context = multiprocessing.get_context("spawn")
    with context.Pool(2) as pool:
        pending = [pool.apply_async(_compile_in_spawned_child, (scale_kernel, str(tmp_path))) for _ in range(2)]
        mine = _scale().compile(_F32, _F32, 4096, 1.0, BLOCK=512, target="sm_90a").asm["ptx"]
        theirs = [result.get(timeout=120) for result in pending]
    assert theirs == [mine, mine]
    entries = list(tmp_path.rglob("*.json"))
    assert len(entries) == 1 and not list(tmp_path.rglob(".tmp*"))
    assert cache._well_formed(json.loads(entries[0].read_text()))


def test_a_cache_directory_that_fills_up_mid_write_only_costs_the_entry(monkeypatch, tmp_path):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("FUSEDOPS_DISABLE_CACHE", raising=False)
    real_dump = json.dump

    def full(obj, file, **kwargs):      # half the entry reaches the disk, then ENOSPC
        file.write(json.dumps(obj)[:1000])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(json, "dump", full)
    first = _scale().compile(_F32, _F32, 4096, 1.0, BLOCK=128, target="sm_90a").asm["ptx"]
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []
    monkeypatch.setattr(json, "dump", real_dump)
    assert _scale().compile(_F32, _F32, 4096, 1.0, BLOCK=128, target="sm_90a").asm["ptx"] == first
    (entry,) = tmp_path.rglob("*.json")
    assert json.loads(entry.read_text())["ptx"] == first
