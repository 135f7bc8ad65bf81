"""Review (session 26, the session's own changes, `git diff 675f60d HEAD -- fusedops README.md`): a fresh reviewer
tried to break each change on the CPU (interpreter values, PTX compiled for sm_80 / sm_90a and assembled by ptxas
when installed, GPU launches through test_launch_fast_path's mocked driver), comparing with the tree at 675f60d
(extracted with `git archive`) where a case could be a regression, and with Triton / PyTorch behaviour.

Tried:
(a) class attributes and module-valued globals as used globals: Enum / IntEnum members, a module with a PEP 562
    `__getattr__`, classmethods, a dsl.jit helper held by a class, tuples and dtypes on classes, attributes read
    many times (static_range), an attribute inherited and then shadowed in the subclass the kernel names, launches
    repeated with nothing changed (must not recompile);
(b) the source snapshot: @dsl.jit over a functools.wraps decorator, multi-line decorators (autotune + jit(...)),
    kernels in a class body and nested functions, a module imported from a zip, IPython-style linecache entries
    (mtime None), a file edited then importlib.reload()ed, a function jitted after its file was edited so that
    its first line falls inside a docstring, a lambda;
(c) prepared launches given None, an int, a list or a numpy array where a tensor was prepared, with a bool to an
    int-annotated parameter (uint8, do_not_specialize);
(d) autotune: a recorded config with restore_value (no copy, tensors untouched), the copies of a real search;
(e) bitcast of literals: negative ints, 16-bit targets (float16 / bfloat16), bool literals, ints too wide, float
    literals to 16-bit ints and to bfloat16, constexpr ints;
(f) atomic_cas for every sem x scope on sm_80 and sm_90a, 16-/32-/64-bit and float elements, block and scalar:
    the `atom.<sem>.<scope>.cas` (or LLVM's 32-bit loop with fences for 16-bit), assembled by ptxas; the CTA
    barrier before a scalar CAS only with release semantics;
(g) dsl.pointer_type in kernels (bad arguments), static_assert (tuples, shapes, keyword msg, runtime `if`),
    dsl.clamp, Python min / max with mixed, three and NaN arguments, `.T` on 1-D / 3-D blocks;
(h) MultiheadAttention on 16-bit modules with float64 / float16 / float32 masks and merged masks (against the
    exact float64 result and torch), gradients through a float32 mask (against a float64 module); float64 SDPA
    scales at both ends of float32's range.

DEFECTS (all fixed in session 26; their tests, strict xfails until then, now pass):

1. Enum members can no longer be read in a kernel (regression): `class Act(enum.Enum): GELU = 2` and a kernel
   doing `if ACT == Act.GELU.value:` compiled at 675f60d; now CompilationError "global `Act.GELU` is a
   __main__.Act; a kernel can only read constexpr globals ...". Cause: expressions.visit_Attribute now runs
   check_global on every class attribute, and an Enum member (an instance, not callable) is refused although
   only its `.value` is used (IntEnum members pass, being ints). Expected: as before (Triton reads attributes of
   any Python object at compile time).
2. A module attribute served by a PEP 562 module `__getattr__` (lazy modules, deprecation shims) crashes the
   frontend with a bare `KeyError: 'X'` (regression: 675f60d compiled it). Cause: visit_Attribute records
   `table[name]` with `table = vars(module)`, where the name is not. Expected: compiled (recorded as absent, or
   not recorded), or a CompilationError.
3. Each read of a class attribute adds one more used_globals entry: 50 reads of `Cfg.S` in a static_range loop
   record 50 (vars(Cfg), "S") entries (53 in all; 2 at 675f60d), each checked by every cached / prepared
   launch. Cause: `vars(cls)` is a new mappingproxy on each read, and generator.used_globals is keyed by
   `id(table)`. Expected: one entry per (class, name), as for module attributes (`vars(module)` is the dict).
4. A class attribute inherited from a base and then set on the subclass the kernel names is not seen: the kernel
   reads `Sub.S` (defined on Base); after `Sub.S = 5.0` launches still use Base's 2.0 (stale kernel). Cause:
   `_class_attribute_table` records only the defining class's namespace (its docstring calls this "a rare
   edit"; monkeypatching a subclass attribute in a test is not rare). Expected: recompiled, e.g. by recording
   the name as absent in each class of the MRO before the defining one.
5. @dsl.jit over a functools.wraps decorator compiles the wrapper's body (regression): with `@dsl.jit @deco def
   k(o_ptr): dsl.store(o_ptr, 4.0)`, 675f60d compiled k's body (inspect.getsourcelines unwraps `__wrapped__`, as
   Triton's inspect.getsource does); now CompilationError "name `args` is not defined" at the wrapper's
   `return f(*args, **kwargs)`. Cause: frontend/errors.py read_source / parse_function use `fn.__code__` (the
   wrapper's) and do not follow `__wrapped__`.
6. A function jitted after its file was edited so that its old first line falls inside a docstring raises
   `tokenize.TokenError: ('EOF in multi-line string', ...)` instead of the CompilationError parse_function
   means to give ("the file changed after it was imported"). Cause: parse_function catches (IndexError,
   SyntaxError) around inspect.getblock, but on Python 3.11 tokenize raises TokenError, not a SyntaxError.
7. `dsl.cast(1.0, dsl.bfloat16, bitcast=True)` is 0.0078125 (the bits of float16's 1.0, 0x3C00, read as
   bfloat16), while the same literal bitcast to float16 / float32 / float64 is 1.0. Cause: Semantics.
   _bitcast_literal types a float literal as promotion.float_of_bits(16) = float16 for every 16-bit target.
   Expected: 1.0 (the literal as bfloat16, a same-type bitcast), or an error (Triton: a float literal is
   fp32 and the fp32 -> bf16 bitcast is refused).
8. `dsl.clamp(x, min=lo, max=hi)`, Triton's keyword form (`tl.clamp(x, min, max, propagate_nan=...)`), fails:
   "bad arguments to dsl.clamp(): missing a required argument: 'lo'" - the parameters are named lo / hi. The
   README says Triton kernels port line by line including dsl.clamp. Expected: Triton's parameter names.
9. float64 scaled_dot_product_attention on the kernel route with a tiny scale loses float64 precision: scale=1e-42
   (q, k ~1e21, logits ~3) differs from torch's float64 op by 1.9e-4 (1e-40: 6.6e-7, 1e-38: 6.6e-9; 1e-30:
   2e-16). Cause: kernels/attention._float_pair passes scale * log2(e) as a float32 (hi, lo) pair; below
   float32's normal range (1.18e-38) both are subnormal and keep few bits. scale_beyond_kernels (this session's
   fix for the other end) checks only |scale| * log2(e) >= float32 max. Low severity (float64 runs the kernels
   only in the interpreter).

Also seen, not flagged: Python's `min(x, float("nan"))` / dsl.clamp of NaN give NaN (dsl.minimum / maximum
propagate NaN, as torch) where Triton's default PropagateNan.NONE gives the non-NaN operand; the README's
"Coming from Triton" list does not mention it. `x.T` reverses all dims of a 3-D block and leaves a 1-D block as it
is (NumPy's `.T`; Triton's is 2-D only). A float literal bitcast to a narrower width overflows silently (1e300 to
int32 gives inf's bits), as dsl.cast(1e300, dsl.float32) gives inf.

Held (plain tests below): classmethods, IntEnum members, tuples, dtypes and dsl.jit helpers read through classes
do not recompile launches with nothing changed, and a rebound class attribute recompiles; source snapshots of
nested / class-body / multi-line-decorated kernels, a zipped module, IPython-style linecache entries, importlib.reload after an
edit (the old JITFunction keeps its body), the lambda error; prepared launches given None / int / list / ndarray
where a tensor was prepared take the full path (launch the None specialization, or raise naming nothing worse
than the full path); bools to uint8-annotated and do_not_specialize int parameters launch the full path's kernel;
a recorded autotune config copies no restore_value tensor and leaves it alone, a search copies it before its
first launch and restores it; literal bitcasts (negative ints, 16-bit, unsigned, too-wide ints and bools
refused, constexpr ints); atomic_cas PTX for all 4 sems x 3 scopes x {int32, int64, float16, bfloat16, float32,
float64} on sm_80 / sm_90a, assembled; static_assert forms; min / max / clamp values; pointer_type errors;
MultiheadAttention 16-bit masks (float64 / float16 / float32, merged with bool or float key_padding_masks) within
torch's error where torch runs, and float32-mask gradients against float64.
"""

from __future__ import annotations

import enum
import functools
import json
import os
import re
import sys
import types
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import fusedops
import fusedops.dsl as dsl
import fusedops.nn as fnn
from fusedops.dsl import CompilationError
from fusedops.dsl.runtime import autotune as autotune_module
from fusedops.dsl.runtime.signature import SpecializationKey, specialize
from fusedops.dsl.target import assemble, ptxas_available
from helpers import import_module_from_text
from kernel_source import jit_from_source
from test_launch_fast_path import _cuda, gpu  # noqa: F401  (the mocked driver, fake CUDA tensors)
from test_review_session26_launch import _function_of, _optional_bias_kernel, tracked  # noqa: F401
from test_review_session26_modules import _value_passthrough_pair


@pytest.fixture(autouse=True)
def _private_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("FUSEDOPS_CACHE_DIR", str(tmp_path / "kernels"))
    monkeypatch.delenv("FUSEDOPS_INTERPRET", raising=False)


def _entries(kernel):
    return [id(entry) for entry in kernel._cache.values()]


# =================================================================================================
# (a) class attributes and module-valued globals
# =================================================================================================
class _Act(enum.Enum):
    RELU = 1
    GELU = 2


class _IAct(enum.IntEnum):
    RELU = 1


def _enum_kernel(o_ptr, ACT: dsl.constexpr):
    if ACT == _Act.GELU.value:
        dsl.store(o_ptr, 2.0)
    else:
        dsl.store(o_ptr, 1.0)


def test_an_enum_members_value_can_be_read_in_a_kernel():
    out = torch.zeros(1)
    dsl.jit(_enum_kernel)[(1,)](out, ACT=2, interpret=True)
    assert out.item() == 2.0


_lazy = types.ModuleType("_rv26c_lazy")
_lazy.__getattr__ = lambda name: 3.0 if name == "X" else (_ for _ in ()).throw(AttributeError(name))


def _lazy_module_kernel(o_ptr):
    dsl.store(o_ptr, _lazy.X)


def test_a_module_getattr_attribute_compiles_or_is_a_compilation_error():
    out = torch.zeros(1)
    try:
        dsl.jit(_lazy_module_kernel)[(1,)](out, interpret=True)
    except CompilationError:
        return
    assert out.item() == 3.0


class _Cfg:
    S = 2.0


def _many_reads_kernel(o_ptr):
    acc = dsl.load(o_ptr) * 0.0
    for i in dsl.static_range(50):
        acc = acc + _Cfg.S
    dsl.store(o_ptr, acc)


def test_repeated_class_attribute_reads_are_recorded_once():
    kernel = dsl.jit(_many_reads_kernel)
    out = torch.zeros(1)
    kernel[(1,)](out, interpret=True)
    assert out.item() == 100.0
    (entry,) = kernel._cache.values()
    assert len(entry.kernel.used_globals) <= 4, [(n, o) for _, n, o in entry.kernel.used_globals][:6]


class _Base:
    S = 2.0


class _Sub(_Base):
    pass


def _shadowed_kernel(o_ptr):
    dsl.store(o_ptr, dsl.load(o_ptr) * 0.0 + _Sub.S)


def test_a_class_attribute_shadowed_in_the_subclass_recompiles(monkeypatch):
    kernel = dsl.jit(_shadowed_kernel)
    out = torch.zeros(1)
    kernel[(1,)](out, interpret=True)
    assert out.item() == 2.0
    monkeypatch.setattr(_Sub, "S", 5.0, raising=False)
    kernel[(1,)](out, interpret=True)
    assert out.item() == 5.0, "still Base's 2.0 after Sub.S = 5.0"


@dsl.jit
def _class_helper(v):
    return v * 3.0


class _Holder:
    h = _class_helper
    T = (1, 2)
    D = dsl.float16
    S = 1.5

    @classmethod
    def cm(cls):
        return 1


def _class_reads_kernel(o_ptr):
    v = dsl.load(o_ptr) * 0.0 + _Holder.S + _IAct.RELU + _Holder.T[1]
    v = _Holder.h(v)
    dsl.store(o_ptr, v.to(_Holder.D).to(dsl.float32))


def test_class_attributes_read_by_a_kernel_do_not_recompile_unchanged_launches(monkeypatch):
    kernel = dsl.jit(_class_reads_kernel)
    out = torch.zeros(1)
    kernel[(1,)](out, interpret=True)
    assert out.item() == (1.5 + 1 + 2) * 3.0
    first = _entries(kernel)
    for _ in range(3):
        kernel[(1,)](out, interpret=True)
    assert _entries(kernel) == first and len(first) == 1
    monkeypatch.setattr(_Holder, "S", 2.5)
    kernel[(1,)](out, interpret=True)
    assert out.item() == (2.5 + 1 + 2) * 3.0 and _entries(kernel) != first


def test_class_attribute_reads_keep_the_cached_gpu_plan(tracked, monkeypatch):
    kernel = dsl.jit(_class_reads_kernel)
    out = _cuda(torch.zeros(1))
    for _ in range(3):
        kernel[(1,)](out)
    assert len(set(map(id, tracked))) == 1 and len(kernel._cache) == 1
    monkeypatch.setattr(_Holder, "S", 2.5)
    kernel[(1,)](out)
    assert tracked[-1] is not tracked[0]


# =================================================================================================
# (b) the source snapshot
# =================================================================================================
def _deco(f):
    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        return f(*args, **kwargs)
    return wrapper


def test_jit_over_a_wrapping_decorator_compiles_the_wrapped_function():
    @dsl.jit
    @_deco
    def wrapped(o_ptr):
        dsl.store(o_ptr, 4.0)

    out = torch.zeros(1)
    wrapped[(1,)](out, interpret=True)
    assert out.item() == 4.0


def test_a_function_jitted_after_its_file_moved_into_a_docstring_is_a_compilation_error(tmp_path, monkeypatch):
    module = import_module_from_text(tmp_path, monkeypatch, "_rv26c_moved", """
        import fusedops.dsl as dsl


        def k(o_ptr):
            dsl.store(o_ptr, 1.0)
    """)
    (tmp_path / "_rv26c_moved.py").write_text(
        'import fusedops.dsl as dsl\ndef other():\n    """doc\n    more words\n    """\n'
        'def k(o_ptr):\n    dsl.store(o_ptr, 1.0)\n')
    kernel = dsl.jit(module.k)          # jitted after the edit (a kernel factory, a notebook)
    try:
        kernel[(1,)](torch.zeros(1), interpret=True)
    except CompilationError:
        return
    except Exception as error:          # noqa: BLE001
        pytest.fail(f"{type(error).__module__}.{type(error).__name__}: {error}")


_SNAPSHOT_MODULE = """
    import fusedops.dsl as dsl


    @dsl.autotune(
        [dsl.Config({"B": 1}),
         dsl.Config({"B": 2})],
        key=[],
    )
    @dsl.jit(
        do_not_specialize=[],
    )
    def multi(o_ptr, B: dsl.constexpr):
        dsl.store(o_ptr, 5.0)


    class Holder:
        @staticmethod
        @dsl.jit
        def in_class(o_ptr):
            dsl.store(o_ptr, 6.0)


    def outer():
        @dsl.jit
        def nested(o_ptr):
            dsl.store(o_ptr, 7.0)
        return nested


    @dsl.jit
    def edited(o_ptr):
        dsl.store(o_ptr, 1.0)
"""


def test_snapshots_of_decorated_nested_and_class_kernels_and_a_reload(tmp_path, monkeypatch):
    import importlib
    import textwrap

    module = import_module_from_text(tmp_path, monkeypatch, "_rv26c_snap", _SNAPSHOT_MODULE)
    out = torch.zeros(1)
    module.multi[(1,)](out, interpret=True)
    assert out.item() == 5.0
    module.Holder.in_class[(1,)](out, interpret=True)
    assert out.item() == 6.0
    module.outer()[(1,)](out, interpret=True)
    assert out.item() == 7.0
    old = module.edited
    path = tmp_path / "_rv26c_snap.py"
    text = textwrap.dedent(_SNAPSHOT_MODULE).replace("dsl.store(o_ptr, 1.0)", "# moved\n    dsl.store(o_ptr, 2.0)")
    path.write_text("# a new first line\n" + text)
    os.utime(path, (1, 1))                  # another mtime even within the same second
    importlib.reload(module)
    module.edited[(1,)](out, interpret=True)
    assert out.item() == 2.0
    old[(1,)](out, interpret=True)          # the JITFunction decorated before the edit keeps its body
    assert out.item() == 1.0
    module.outer()[(1,)](out, interpret=True)
    assert out.item() == 7.0


def test_ipython_style_linecache_entries_and_lambdas():
    import linecache

    source = "@dsl.jit\ndef cell(o_ptr):\n    dsl.store(o_ptr, 3.0)\n"
    name = "<ipython-input-26-rv26c>"
    linecache.cache[name] = (len(source), None, source.splitlines(True), name)
    scope = {"dsl": dsl}
    exec(compile(source, name, "exec"), scope)
    linecache.checkcache()                  # IPython's entries (mtime None) survive a full check
    out = torch.zeros(1)
    scope["cell"][(1,)](out, interpret=True)
    assert out.item() == 3.0
    lam = dsl.jit(lambda o_ptr: dsl.store(o_ptr, 1.0))
    with pytest.raises(CompilationError, match="not a lambda"):
        lam[(1,)](out, interpret=True)


def test_a_kernel_in_a_zipped_module(tmp_path, monkeypatch):
    import importlib
    import zipfile

    archive = tmp_path / "kernels.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("_rv26c_zipped.py", "import fusedops.dsl as dsl\n\n@dsl.jit\ndef k(o_ptr):\n    dsl.store(o_ptr, 9.0)\n")
    monkeypatch.syspath_prepend(str(archive))
    monkeypatch.delitem(sys.modules, "_rv26c_zipped", raising=False)
    importlib.invalidate_caches()
    module = importlib.import_module("_rv26c_zipped")
    out = torch.zeros(1)
    module.k[(1,)](out, interpret=True)
    assert out.item() == 9.0


# =================================================================================================
# (c) prepared launches and bools
# =================================================================================================
@pytest.mark.parametrize("bad", [3, [1.0], np.zeros(8, np.float32), "x"])
def test_a_prepared_launch_given_a_non_tensor_takes_the_full_path(tracked, bad):
    kernel = _optional_bias_kernel()
    x, b, y = _cuda(torch.arange(8.0)), _cuda(torch.ones(8)), _cuda(torch.zeros(8))
    prepared = kernel.prepare((1,), x, b, y)
    prepared(x, b, y)
    with pytest.raises((TypeError, CompilationError)) as error:
        prepared(x, bad, y)
    assert "b_ptr" in str(error.value) or isinstance(error.value, CompilationError), error.value
    prepared(x, b, y)                       # the prepared launch still works after
    prepared(x, None, y)                    # None: the None specialization through the full path
    key = SpecializationKey(specialize("biased", kernel.params, [x, None, y, 8]), 4, 3, "sm_90a")
    assert tracked[-1] is _function_of(kernel._cache[key])


def test_a_prepared_launch_given_a_tensor_where_none_was_prepared(tracked):
    kernel = _optional_bias_kernel()
    x, b, y = _cuda(torch.arange(8.0)), _cuda(torch.ones(8)), _cuda(torch.zeros(8))
    prepared = kernel.prepare((1,), x, None, y)
    prepared(x, None, y)
    prepared(x, b, y)
    key = SpecializationKey(specialize("biased", kernel.params, [x, b, y, 8]), 4, 3, "sm_90a")
    assert tracked[-1] is _function_of(kernel._cache[key])


def _annotated(annotation, do_not_specialize=()):
    def store_a(o_ptr, a: annotation):
        dsl.store(o_ptr, a.to(dsl.int32))
    return dsl.jit(store_a, do_not_specialize=do_not_specialize)


@pytest.mark.parametrize("annotation,dns", [(dsl.uint8, ()), (dsl.int64, ()), (dsl.int32, ("a",))])
def test_bools_to_annotated_ints_launch_the_full_paths_kernel(tracked, annotation, dns):
    kernel = _annotated(annotation, dns)
    out = _cuda(torch.zeros(1, dtype=torch.int32))
    for value in (True, False, 1, 0, False, True):
        kernel[(1,)](out, value)
        key = SpecializationKey(specialize("store_a", kernel.params, [out, value]), 4, 3, "sm_90a")
        assert tracked[-1] is _function_of(kernel._cache[key]), value


# =================================================================================================
# (d) autotune: restore_value with a recorded config, and the copies of a search
# =================================================================================================
def _scale_in_place():
    def scale(x_ptr, n, BLOCK: dsl.constexpr):
        offs = dsl.program_id(0) * BLOCK + dsl.arange(0, BLOCK)
        dsl.store(x_ptr + offs, dsl.load(x_ptr + offs, mask=offs < n) * 2.0, mask=offs < n)
    return dsl.jit(scale)


_TUNED = [dsl.Config({"BLOCK": 8}), dsl.Config({"BLOCK": 16})]


def test_a_recorded_config_copies_and_touches_no_restore_value_tensor(tracked, monkeypatch):
    monkeypatch.setattr(autotune_module, "_device_name", lambda device: "Fake H200")
    tuner = dsl.autotune(_TUNED, key=["n"], restore_value=["x_ptr"], reset_to_zero=["x_ptr"])(_scale_in_place())
    x = _cuda(torch.full((16,), 5.0))
    path = tuner._record_path()
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({tuner.key_of((x, 16), {}): 0}))
    clones = []
    original = torch.Tensor.clone
    monkeypatch.setattr(torch.Tensor, "clone", lambda self, *a, **k: (clones.append(1), original(self, *a, **k))[1])
    tuner[lambda meta: (16 // meta["BLOCK"],)](x, 16)
    monkeypatch.undo()
    assert len(tracked) == 1 and not clones
    assert torch.equal(x.as_subclass(torch.Tensor), torch.full((16,), 5.0))


def test_a_search_copies_restore_value_tensors_before_its_first_launch(monkeypatch):
    tuner = dsl.autotune(_TUNED, key=["n"], restore_value=["x_ptr"])(_scale_in_place())
    x = torch.arange(16.0)
    seen = []

    def fake_measure(grid, args, kwargs, config, reset, first):
        reset()
        seen.append(x.clone())
        x.mul_(2)
        return float(config.constexprs["BLOCK"]), False

    monkeypatch.setattr(tuner, "_measure", fake_measure)
    assert tuner._tune("k", (1,), (x, 16), {}) == _TUNED[0]
    assert seen and all(torch.equal(s, torch.arange(16.0)) for s in seen)
    assert torch.equal(x, torch.arange(16.0))


# =================================================================================================
# (e) bitcast of literals
# =================================================================================================
def _store_expr(expr, tag):
    return jit_from_source(f"def k(o_ptr, C: dsl.constexpr):\n    dsl.store(o_ptr, {expr})\n", f"<rv26c {tag}>")


def _bits(t):
    view = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return t.view(view).item() & ((1 << 8 * t.element_size()) - 1)


@pytest.mark.parametrize("expr,dtype,bits", [
    ("dsl.cast(-1, dsl.float32, bitcast=True)", torch.float32, 0xFFFFFFFF),
    ("dsl.cast(-1, dsl.float16, bitcast=True)", torch.float16, 0xFFFF),
    ("dsl.cast(0x8000, dsl.bfloat16, bitcast=True)", torch.bfloat16, 0x8000),
    ("dsl.cast(0x3F80, dsl.bfloat16, bitcast=True)", torch.bfloat16, 0x3F80),
    ("dsl.cast(1.0, dsl.float16, bitcast=True)", torch.float16, 0x3C00),
    ("dsl.cast(1.0, dsl.int16, bitcast=True)", torch.int16, 0x3C00),
    ("dsl.cast(3.0, dsl.int64, bitcast=True)", torch.int64, 0x4008000000000000),
    ("dsl.cast(-0.0, dsl.int64, bitcast=True)", torch.int64, 1 << 63),
    ("dsl.cast(2**64 - 1, dsl.float64, bitcast=True)", torch.float64, 2**64 - 1),
    ("dsl.cast(-1, dsl.uint8, bitcast=True).to(dsl.int32)", torch.int32, 255),
    ("dsl.cast(C, dsl.float32, bitcast=True)", torch.float32, 0x3F800000),
    ("dsl.cast(True, dsl.int1, bitcast=True).to(dsl.int32)", torch.int32, 1),
])
def test_literal_bitcasts_keep_their_bits(expr, dtype, bits):
    out = torch.zeros(1, dtype=dtype)
    _store_expr(expr, expr)[(1,)](out, C=0x3F800000, interpret=True)
    assert _bits(out) == bits


@pytest.mark.parametrize("expr,match", [
    ("dsl.cast(300, dsl.int8, bitcast=True)", "does not fit in 8 bits"),
    ("dsl.cast(True, dsl.int8, bitcast=True)", "equal bit widths"),
    ("dsl.cast(2**64, dsl.float64, bitcast=True)", "does not fit in 64 bits"),
])
def test_literal_bitcasts_that_cannot_keep_their_bits_are_refused(expr, match):
    with pytest.raises(CompilationError, match=match):
        _store_expr(expr, expr)[(1,)](torch.zeros(1), C=1, interpret=True)


def test_a_float_literal_bitcast_to_bfloat16_is_itself_or_refused():
    out = torch.zeros(1, dtype=torch.bfloat16)
    try:
        _store_expr("dsl.cast(1.0, dsl.bfloat16, bitcast=True)", "bf16 literal")[(1,)](out, C=1, interpret=True)
    except CompilationError:
        return
    assert out.item() == 1.0


# =================================================================================================
# (f) atomic_cas: ordering and scope in the PTX, assembled
# =================================================================================================
@dsl.jit
def _cas_block(p, o, SEM: dsl.constexpr, SCOPE: dsl.constexpr):
    offs = dsl.arange(0, 32)
    old = dsl.atomic_cas(p + offs, dsl.load(o + offs), dsl.load(o + offs), sem=SEM, scope=SCOPE)
    dsl.store(o + offs, old)


@dsl.jit
def _cas_scalar(p, o, SEM: dsl.constexpr, SCOPE: dsl.constexpr):
    dsl.store(o, dsl.atomic_cas(p, dsl.load(o), dsl.load(o) + 1, sem=SEM, scope=SCOPE))


_SEMS = ["relaxed", "acquire", "release", "acq_rel"]


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.float64, torch.float16, torch.bfloat16])
def test_atomic_cas_ptx_has_the_requested_ordering_and_scope(arch, dtype):
    x = torch.zeros(32, dtype=dtype)
    width = {2: 32, 4: 32, 8: 64}[x.element_size()]
    for sem in _SEMS:
        for scope in ("gpu", "cta", "sys"):
            ptx = _cas_block.compile(x, x, SEM=sem, SCOPE=scope, target=arch).asm["ptx"]
            atoms = set(re.findall(r"atom\.[\w.]*cas\.b\d+", ptx))
            fences = set(re.findall(r"fence\.[\w.]+", ptx))
            if x.element_size() == 2:       # LLVM's 32-bit CAS loop, ordered by fences at the scope
                assert atoms == {f"atom.relaxed.{scope}.global.cas.b32"}, (sem, scope, atoms)
                assert fences == (set() if sem == "relaxed" else {f"fence.acq_rel.{scope}"}), (sem, scope, fences)
            else:
                assert atoms == {f"atom.{sem}.{scope}.global.cas.b{width}"}, (sem, scope, atoms)
            if ptxas_available() and scope == "gpu":
                assemble(ptx, arch)


def test_a_scalar_cas_has_a_barrier_before_it_only_with_release_semantics():
    x = torch.zeros(4, dtype=torch.int32)
    for sem in _SEMS:
        ptx = _cas_scalar.compile(x, x, SEM=sem, SCOPE="gpu", target="sm_90a").asm["ptx"]
        body = ptx[ptx.index("{"):]
        before = body[:body.index("atom.")]
        barriers = before.count("bar.sync") + before.count("barrier.sync")
        assert barriers == (1 if sem in ("release", "acq_rel") else 0), (sem, barriers)
        if ptxas_available():
            assemble(ptx, "sm_90a")


# =================================================================================================
# (g) pointer_type, static_assert, clamp, min / max, .T
# =================================================================================================
_G_CASES = {
    "static_assert_tuple": ("dsl.static_assert((B, 4) == (4, 4), 'tuple')\n"
                            "    x = dsl.load(x_ptr + dsl.arange(0, B))\n"
                            "    dsl.static_assert(x.shape == (4,), 'shape')\n"
                            "    dsl.static_assert(x.dtype == dsl.float32, msg='dtype')\n"
                            "    dsl.store(o_ptr + dsl.arange(0, B), x)", [3.0, -1.0, 2.0, 0.5]),
    "static_assert_runtime_if": ("if dsl.load(x_ptr) > 0:\n        dsl.static_assert(B == 4, 'in if')\n"
                                 "    dsl.store(o_ptr, 1.0)", [1.0]),
    "min_three_mixed": ("x = dsl.load(x_ptr + dsl.arange(0, 4))\n"
                        "    dsl.store(o_ptr + dsl.arange(0, 4), min(2.5, x, 1.5))", [1.5, -1.0, 1.5, 0.5]),
    "max_int_float": ("x = dsl.load(x_ptr + dsl.arange(0, 4)).to(dsl.int32)\n"
                      "    dsl.store(o_ptr + dsl.arange(0, 4), max(x, 1.5))", [3.0, 1.5, 2.0, 1.5]),
    "max_python": ("dsl.store(o_ptr + dsl.arange(0, 4), dsl.zeros((4,), dsl.float32) + max((1, 3, 2)))",
                   [3.0] * 4),
    "clamp_int": ("x = dsl.load(x_ptr + dsl.arange(0, 4)).to(dsl.int32)\n"
                  "    dsl.store(o_ptr + dsl.arange(0, 4), dsl.clamp(x, 0, 2))", [2.0, 0.0, 2.0, 0.0]),
    "pointer_type": ("p = x_ptr.to(dsl.int64).to(dsl.pointer_type(dsl.float32, address_space=1))\n"
                     "    dsl.store(o_ptr + dsl.arange(0, 4), dsl.load(p + dsl.arange(0, 4)))", [3.0, -1.0, 2.0, 0.5]),
    "T_1d": ("dsl.store(o_ptr + dsl.arange(0, 4), dsl.load(x_ptr + dsl.arange(0, 4)).T)", [3.0, -1.0, 2.0, 0.5]),
    "T_3d": ("i = dsl.arange(0, 2)\n"
             "    off = i[:, None, None] * 4 + i[None, :, None] * 2 + i[None, None, :]\n"
             "    dsl.store(o_ptr + off, dsl.load(x_ptr + off).T)", [3.0, 1.0, 2.0, 3.0, -1.0, 2.0, 0.5, 4.0]),
}


@pytest.mark.parametrize("case", sorted(_G_CASES))
def test_triton_idioms(case):
    body, want = _G_CASES[case]
    kernel = jit_from_source(f"def k(o_ptr, x_ptr, B: dsl.constexpr):\n    {body}\n", f"<rv26c g {case}>")
    x = torch.tensor([3.0, -1.0, 2.0, 0.5, 1.0, 2.0, 3.0, 4.0])
    out = torch.full((8,), -9.0)
    kernel[(1,)](out, x, B=4, interpret=True)
    assert out[:len(want)].tolist() == want


@pytest.mark.parametrize("body,match", [
    ("dsl.static_assert((B, 4) == (8, 4), 'tuple mismatch')", "static_assert failed: tuple mismatch"),
    ("dsl.static_assert(None)", "static_assert failed"),
    ("PT = dsl.pointer_type(3)", "pointer_type expects a dsl dtype"),
    ("PT = dsl.pointer_type(dsl.load(x_ptr).to(dsl.int32))", "compile-time arguments"),
    ("y = min(dsl.load(x_ptr), 1.0, key=None)", "min"),
])
def test_triton_idioms_errors(body, match):
    kernel = jit_from_source(f"def k(o_ptr, x_ptr, B: dsl.constexpr):\n    {body}\n    dsl.store(o_ptr, 1.0)\n",
                             f"<rv26c gerr {body}>")
    with pytest.raises(CompilationError, match=match):
        kernel[(1,)](torch.zeros(1), torch.zeros(1), B=4, interpret=True)


def test_clamp_takes_tritons_keyword_names():
    kernel = jit_from_source("def k(o_ptr, x_ptr):\n    x = dsl.load(x_ptr + dsl.arange(0, 4))\n"
                             "    dsl.store(o_ptr + dsl.arange(0, 4), dsl.clamp(x, min=0.0, max=2.0))\n",
                             "<rv26c clamp kw>")
    x, out = torch.tensor([3.0, -1.0, 2.0, 0.5]), torch.zeros(4)
    kernel[(1,)](out, x, interpret=True)
    assert out.tolist() == [2.0, 0.0, 2.0, 0.5]


# =================================================================================================
# (h) MultiheadAttention masks on 16-bit modules, float64 SDPA scales
# =================================================================================================
_MASKS = [
    (torch.tensor([[200.0, 200.6]], dtype=torch.float64), None),
    (None, torch.tensor([[200.0, 200.6]], dtype=torch.float64)),
    (torch.tensor([[200.0, 200.6]], dtype=torch.float16), None),
    (torch.tensor([[200.0, 200.5]]), torch.tensor([[0.0, 0.1]], dtype=torch.float64)),
    (torch.tensor([[200.0, 200.5]], dtype=torch.float16), torch.tensor([[0.0, 0.1]])),
    (torch.tensor([[200.0, 200.5]]), torch.tensor([[False, False]])),
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_mha_16bit_masks_of_other_float_dtypes(interpret, dtype):
    ours, theirs = _value_passthrough_pair(dtype)
    x = torch.arange(8.0).view(1, 2, 4).to(dtype)
    tol = {torch.bfloat16: 1.2e-2, torch.float16: 1.6e-3}[dtype]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for attn_mask, padding in _MASKS:
            bias = sum(m.double() for m in (attn_mask, padding) if m is not None)
            exact = torch.softmax(bias, -1) @ x[0].double()
            got = ours(x[:, :1], x, x, attn_mask=attn_mask, key_padding_mask=padding, need_weights=False)[0]
            assert got.dtype == dtype
            error = (got.double()[0] - exact).abs().max().item()
            assert error < tol, (attn_mask, padding, error)
            try:
                want = theirs(x[:, :1], x, x, attn_mask=attn_mask, key_padding_mask=padding, need_weights=False)[0]
            except RuntimeError:            # torch's SDPA refuses float64 / other-16-bit masks
                continue
            assert torch.equal(got, want), (attn_mask, padding)


def test_mha_gradient_through_a_float32_mask_on_a_bfloat16_module(interpret):
    import copy

    torch.manual_seed(0)
    theirs = torch.nn.MultiheadAttention(8, 2, batch_first=True).to(torch.bfloat16)
    reference = copy.deepcopy(theirs).double()
    ours = fnn.MultiheadAttention(8, 2, batch_first=True).to(torch.bfloat16)
    ours.load_state_dict(theirs.state_dict())
    g = torch.Generator().manual_seed(5)
    x, base = torch.randn(2, 3, 8, generator=g).bfloat16(), torch.randn(3, 3, generator=g)
    padding = torch.tensor([[False, False, True], [False, False, False]])
    results = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for module, inputs in ((ours, x), (theirs, x), (reference, x.double())):
            mask = base.clone().requires_grad_(True)
            out = module(inputs, inputs, inputs, attn_mask=mask, key_padding_mask=padding, need_weights=False)[0]
            out.double().sum().backward()
            assert mask.grad.dtype == torch.float32
            results.append((out.detach().double(), mask.grad.double()))
    (out, grad), (t_out, t_grad), (r_out, r_grad) = results
    assert (out - r_out).abs().max() <= (t_out - r_out).abs().max() * 1.5 + 1e-3
    assert (grad - r_grad).abs().max() <= (t_grad - r_grad).abs().max() * 1.5 + 1e-3


def test_sdpa_float64_tiny_scale_keeps_float64_precision(interpret):
    g = torch.Generator().manual_seed(3)
    q = torch.randn(1, 1, 3, 4, generator=g, dtype=torch.float64) * 1e21
    k = torch.randn(1, 1, 5, 4, generator=g, dtype=torch.float64) * 1e21
    v = torch.randn(1, 1, 5, 4, generator=g, dtype=torch.float64)
    want = F.scaled_dot_product_attention(q, k, v, scale=1e-42)
    got = fusedops.scaled_dot_product_attention(q, k, v, scale=1e-42)
    assert (got - want).abs().max().item() < 1e-12


def test_sdpa_float64_scales_near_float32_max(interpret):
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 1, 3, 4, generator=g, dtype=torch.float64) for _ in range(3))
    for scale in (2.3e38, -2.4e38, 1e39, -1e300):
        want = F.scaled_dot_product_attention(q, k, v, scale=scale)
        got = fusedops.scaled_dot_product_attention(q, k, v, scale=scale)
        assert torch.equal(got.isnan(), want.isnan())
        finite = want.isfinite()
        assert (got[finite] - want[finite]).abs().max().item() < 1e-12, scale
