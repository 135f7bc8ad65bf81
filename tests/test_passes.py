"""Tests of the target-independent passes: fold, CSE, DCE, simplify, the pass manager, pointer analysis.

Every transforming test runs the interpreter on the IR before and after the pass, on the same random
inputs, and requires bit-identical outputs (DESIGN.md: "a test that runs the interpreter on the IR
before and after the pass and compares results"). Kernels are built directly with `Semantics`.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fusedops.dsl.interpreter import launch
from fusedops.dsl.ir import Block, Builder, Function, OpCode, Operation, VerificationError, print_function, verify
from fusedops.dsl.ir.rewrite import ValueSubstitution, erase_op, insert_before, replace_all_uses, uses
from fusedops.dsl.language import dtypes as dt
from fusedops.dsl.language.semantics import Semantics
from fusedops.dsl.passes.cse import eliminate_common_subexpressions
from fusedops.dsl.passes.dce import eliminate_dead_code
from fusedops.dsl.passes.fold import fold_constants
from fusedops.dsl.passes.manager import run_pipeline
from fusedops.dsl.passes.pipeline import default_pipeline
from fusedops.dsl.passes.pointer_analysis import AnalysisResult, analyze_pointers, vector_width
from fusedops.dsl.passes.simplify import simplify

BLOCK = 64


# -- building kernels ---------------------------------------------------------------------------------

class KernelBuilder:
    """A Function under construction: `params` are (name, type, hints) of the runtime arguments."""

    def __init__(self, name: str, params):
        self.body = Block([t for _, t, _ in params], [n for n, _, _ in params])
        self.function = Function(name, self.body, [n for n, _, _ in params],
                                 arg_hints=[dict(h or {}) for _, _, h in params])
        self.builder = Builder(self.body)
        self.s = Semantics(self.builder)
        self.arg = {n: v for (n, _, _), v in zip(params, self.body.args)}

    def region(self, arg_types, fill) -> Block:
        block = Block(arg_types)
        with self.builder.insert_into(block):
            self.builder.create(OpCode.YIELD, list(fill(*block.args)))
        return block

    def for_loop(self, lower, upper, step, inits, body):
        """`body(iv, *carried) -> yielded values`; returns the loop's results."""
        s = self.s
        bounds = [s.constant(v, dt.int32) if isinstance(v, int) else v for v in (lower, upper, step)]
        types = [v.type for v in inits]
        block = self.region([dt.int32] + types, body)
        return self.builder.create(OpCode.FOR, bounds + list(inits), types, regions=[block]).results

    def if_else(self, condition, then, otherwise, types=()):
        regions = [self.region([], then), self.region([], otherwise)]
        return self.builder.create(OpCode.IF, [condition], list(types), regions=regions).results


def ptr(dtype):
    return dt.pointer_type(dtype)


def count(function: Function, opcode: OpCode) -> int:
    return sum(op.opcode == opcode for op in function.walk())


def _identical(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype.is_floating_point:   # bit patterns: tells -0.0 from 0.0 and compares NaNs
        bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
        return torch.equal(a.view(bits), b.view(bits))
    return torch.equal(a, b)


def assert_pass_preserves(build, transform, make_args, grid=(2,)) -> Function:
    """Run a fresh `build()` before and after `transform` in the interpreter; outputs must be
    bit-identical. Returns the transformed function (verified)."""
    reference, transformed = build(), build()
    transform(transformed)
    verify(transformed)
    args_before = make_args()
    args_after = [a.clone() if isinstance(a, torch.Tensor) else a for a in args_before]
    launch(reference, grid, args_before)
    launch(transformed, grid, args_after)
    for before, after in zip(args_before, args_after):
        if isinstance(before, torch.Tensor):
            assert _identical(before, after), print_function(transformed)
    return transformed


def _floats(n, seed):
    return torch.randn(n, generator=torch.Generator().manual_seed(seed))


# -- constant folding: every rule against the interpreter -----------------------------------------------

_INT_OPS = ["add", "sub", "mul", "floordiv", "mod", "and", "or", "xor", "lshift", "rshift", "minimum",
            "maximum", "eq", "ne", "lt", "le", "gt", "ge"]
_CODES = {"add": OpCode.ADD, "sub": OpCode.SUB, "mul": OpCode.MUL, "floordiv": OpCode.IDIV,
          "mod": OpCode.MOD, "and": OpCode.AND, "or": OpCode.OR, "xor": OpCode.XOR, "lshift": OpCode.SHL,
          "rshift": OpCode.SHR, "minimum": OpCode.MINIMUM, "maximum": OpCode.MAXIMUM, "eq": OpCode.EQ,
          "ne": OpCode.NE, "lt": OpCode.LT, "le": OpCode.LE, "gt": OpCode.GT, "ge": OpCode.GE,
          "truediv": OpCode.DIV}
_COMPARISONS = {"eq", "ne", "lt", "le", "gt", "ge"}


def _int_pairs(dtype):
    """Edge values of `dtype` against each other, plus a few random pairs (fixed seed)."""
    if dtype.is_bool:
        lo, hi = 0, 1
    elif dtype.is_signed:
        lo, hi = -(1 << (dtype.bits - 1)), (1 << (dtype.bits - 1)) - 1
    else:
        lo, hi = 0, (1 << dtype.bits) - 1
    rng = np.random.default_rng(dtype.bits)
    edges = sorted({lo, hi, 0, 1, min(hi, 7), max(lo, -7), max(lo, -1)})
    pairs = [(a, b) for a in edges for b in sorted({0, 1, max(lo, -1), min(hi, 3), hi, min(hi, 40)})]
    pairs += [(int(rng.integers(lo, hi, endpoint=True)), int(rng.integers(lo, hi, endpoint=True)))
              for _ in range(4)]
    return pairs


def _foldable_int(op, dtype, a, b) -> bool:
    if op in ("floordiv", "mod"):
        return b != 0 and not (dtype.is_signed and b == -1 and a == -(1 << (dtype.bits - 1)))
    if op in ("lshift", "rshift"):     # (int1 operands shift in int32, as C promotes them: True << 1 is 2)
        return 0 <= b < (32 if dtype == dt.int1 else dtype.bits)
    return True


def _fold_kernel(op, dtype, pairs, result_dtype):
    """out[i] = a_i <op> b_i for constant pairs; odd pairs as block (splat) constants."""
    def build():
        k = KernelBuilder("fold", [("out", ptr(result_dtype), None)])
        s = k.s
        for index, (a, b) in enumerate(pairs):
            shape = (4,) if index % 2 else ()
            x = s.constant(a, dtype, shape)
            value = s.binary(op, x, s.constant(b, dtype, shape)) if b is not None else s.unary(op, x)
            target = s.binary("add", k.arg["out"], 4 * index)
            s.store(s.binary("add", target, s.arange(0, 4)) if shape else target, value)
        return k.function
    return build


def _check_fold(build, opcode, unfolded: int, out_dtype, n):
    """The folded IR keeps `unfolded` ops of `opcode` and computes what the original does."""
    def make_args():
        return [torch.zeros(4 * n, dtype=dt.to_torch(out_dtype))]

    folded = assert_pass_preserves(build, fold_constants, make_args, grid=(1,))
    assert count(folded, opcode) == unfolded, print_function(folded)


@pytest.mark.parametrize("dtype", [dt.int8, dt.int32, dt.int64, dt.uint8, dt.uint32, dt.int1], ids=str)
@pytest.mark.parametrize("op", _INT_OPS)
def test_fold_integer_binary_matches_interpreter(op, dtype):
    pairs = _int_pairs(dtype)
    result = dt.int1 if op in _COMPARISONS else dtype
    unfolded = sum(not _foldable_int(op, dtype, a, b) for a, b in pairs)
    _check_fold(_fold_kernel(op, dtype, pairs, result), _CODES[op], unfolded, result, len(pairs))


_FLOATS = [0.0, -0.0, 1.0, -2.5, 0.1, 3.0e38, 1.0e-40, float("inf"), float("-inf"), float("nan"), 1.0 / 3.0]


@pytest.mark.parametrize("dtype", [dt.float32, dt.float64, dt.float16, dt.bfloat16], ids=str)
@pytest.mark.parametrize("op", ["add", "sub", "mul", "truediv", "minimum", "lt", "eq", "ne"])
def test_fold_float_binary_only_when_exact(op, dtype):
    foldable = dtype in (dt.float32, dt.float64) and op in ("add", "sub", "mul", "lt", "eq", "ne")
    result = dt.int1 if op in _COMPARISONS else dtype
    pairs = [(a, _FLOATS[(i * 7 + 3) % len(_FLOATS)]) for i, a in enumerate(_FLOATS)]
    unfolded = 0 if foldable else len(pairs)
    _check_fold(_fold_kernel(op, dtype, pairs, result), _CODES[op], unfolded, result, len(pairs))


@pytest.mark.parametrize("op, dtype, value", [
    ("neg", dt.int32, -(1 << 31)), ("neg", dt.uint8, 3), ("invert", dt.int16, 5), ("invert", dt.int1, True),
    ("abs", dt.int8, -128), ("abs", dt.int32, -5), ("neg", dt.float32, 0.0), ("neg", dt.float64, 0.1),
    ("neg", dt.float16, 1.5),
])
def test_fold_unary(op, dtype, value):
    code = {"neg": OpCode.NEG, "invert": OpCode.INVERT, "abs": OpCode.ABS}[op]
    unfolded = 1 if dtype == dt.float16 else 0
    _check_fold(_fold_kernel(op, dtype, [(value, None)], dtype), code, unfolded, dtype, 1)


@pytest.mark.parametrize("source, target, value, folds", [
    (dt.int32, dt.int8, 300, True), (dt.int32, dt.uint8, -1, True), (dt.int64, dt.int32, (1 << 40) + 5, True),
    (dt.int32, dt.int64, -7, True), (dt.uint32, dt.int64, (1 << 32) - 1, True), (dt.int32, dt.int1, 2, True),
    (dt.int1, dt.int32, True, True), (dt.int32, dt.float32, 16777217, True),
    (dt.int64, dt.float32, (1 << 62) + 1, True),
    (dt.float32, dt.int32, -3.7, True), (dt.float32, dt.int32, 1e10, True), (dt.float32, dt.int32, float("nan"), True),
    (dt.float64, dt.float32, 0.1, True), (dt.float32, dt.float64, 0.1, True), (dt.float64, dt.uint8, -1.5, True),
    (dt.int32, dt.float16, 7, False), (dt.float32, dt.bfloat16, 0.1, False), (dt.float16, dt.float32, 0.1, False),
])
def test_fold_cast(source, target, value, folds):
    def build():
        k = KernelBuilder("cast", [("out", ptr(target), None)])
        k.s.store(k.arg["out"], k.s.cast(k.s.constant(value, source), target))
        return k.function
    _check_fold(build, OpCode.CAST, 0 if folds else 1, target, 1)


def _identities_kernel():
    k = KernelBuilder("identities", [("x_ptr", ptr(dt.int32), None), ("f_ptr", ptr(dt.float32), None),
                                     ("out", ptr(dt.int32), None), ("fout", ptr(dt.float32), None)])
    s = k.s
    offs = s.arange(0, BLOCK)
    x = s.load(s.binary("add", k.arg["x_ptr"], offs))
    f = s.load(s.binary("add", k.arg["f_ptr"], offs))
    zero, one = s.full((BLOCK,), 0, dt.int32), s.full((BLOCK,), 1, dt.int32)
    y = s.binary("mul", s.binary("add", s.binary("sub", x, zero), zero), one)      # x
    y = s.binary("add", y, s.binary("mul", x, zero))                               # + 0
    y = s.binary("add", y, s.binary("sub", x, x))                                   # + 0
    y = s.binary("floordiv", s.binary("or", s.binary("lshift", y, 0), zero), one)  # x
    where = s.where(s.full((BLOCK,), True, dt.int1), y, x)                          # y
    s.store(s.add_pointer(s.binary("add", k.arg["out"], offs), zero), where)
    g = s.binary("add", s.binary("mul", f, 0.0), s.binary("mul", f, 1.0))          # NaN/-0.0 sensitive
    s.store(s.binary("add", k.arg["fout"], offs), s.binary("add", g, 0.0))
    return k.function


def test_fold_integer_identities_but_not_float_ones():
    def make_args():
        f = _floats(BLOCK, 1)
        f[3], f[5] = float("nan"), -0.0
        return [torch.randint(-1000, 1000, (BLOCK,), generator=torch.Generator().manual_seed(2), dtype=torch.int32),
                f, torch.zeros(BLOCK, dtype=torch.int32), torch.zeros(BLOCK, dtype=torch.float32)]

    folded = assert_pass_preserves(_identities_kernel, simplify, make_args, grid=(1,))
    text = print_function(folded)
    int_ops = [op for op in folded.walk() if op.opcode in (OpCode.ADD, OpCode.SUB, OpCode.MUL, OpCode.IDIV,
                                                           OpCode.OR, OpCode.SHL, OpCode.WHERE)
               and op.results[0].type.element == dt.int32]
    assert not int_ops, text
    assert count(folded, OpCode.ADDPTR) == 4, text          # x, f, out, fout: `+ 0` offsets are gone
    assert count(folded, OpCode.MUL) == 2 and count(folded, OpCode.ADD) == 2, text   # float math kept


# -- CSE ----------------------------------------------------------------------------------------------

def _cse_kernel():
    k = KernelBuilder("cse", [("x_ptr", ptr(dt.float32), None), ("out", ptr(dt.float32), None),
                              ("n", dt.int32, None)])
    s = k.s
    offs = s.binary("add", s.binary("mul", s.program_id(0), BLOCK), s.arange(0, BLOCK))
    offs_again = s.binary("add", s.binary("mul", s.program_id(0), BLOCK), s.arange(0, BLOCK))
    x = s.load(s.binary("add", k.arg["x_ptr"], offs))
    x_again = s.load(s.binary("add", k.arg["x_ptr"], offs_again))       # same address: kept (a load)
    a = s.binary("add", s.binary("mul", x, x_again), x)
    b = s.binary("add", x, s.binary("mul", x, x_again))                 # commutative duplicate of a
    zeros = s.binary("add", s.full((BLOCK,), 0.0, dt.float32), s.full((BLOCK,), -0.0, dt.float32))

    def body(i, acc):
        inner = s.binary("mul", s.program_id(0), BLOCK)                 # reuses the outer value
        return [s.binary("add", acc, s.cast(s.binary("add", inner, i), dt.float32))]

    (acc,) = k.for_loop(0, k.arg["n"], 1, [s.binary("add", a, b)], body)
    total = s.binary("add", acc, zeros)
    s.store(s.binary("add", k.arg["out"], offs_again), total)
    return k.function


def test_cse_merges_pure_duplicates_and_keeps_loads():
    def make_args():
        return [_floats(2 * BLOCK, 3), torch.zeros(2 * BLOCK), 3]

    after = assert_pass_preserves(_cse_kernel, eliminate_common_subexpressions, make_args)
    assert count(after, OpCode.LOAD) == 2
    assert count(after, OpCode.PROGRAM_ID) == 1 and count(after, OpCode.ARANGE) == 1
    assert count(after, OpCode.ADDPTR) == 2                       # out + offs reuses the offsets
    loop = next(op for op in after.walk() if op.opcode == OpCode.FOR)
    assert not any(op.opcode == OpCode.MUL for op in loop.regions[0].ops)
    constants = [op.attrs["value"] for op in after.walk() if op.opcode == OpCode.CONSTANT
                 and op.results[0].type == dt.BlockType((BLOCK,), dt.float32)]
    assert sorted(map(str, constants)) == ["-0.0", "0.0"]         # 0.0 and -0.0 are not one constant
    assert count(after, OpCode.MUL) == 2                            # x * x_again, pid * BLOCK


def test_cse_does_not_share_between_sibling_regions():
    def build():
        k = KernelBuilder("siblings", [("out", ptr(dt.int32), None), ("n", dt.int32, None)])
        s = k.s
        n = k.arg["n"]
        then = lambda: [s.binary("mul", n, 3)]
        (r,) = k.if_else(s.binary("gt", n, 2), then, then, [dt.int32])
        s.store(k.arg["out"], s.binary("add", r, s.binary("mul", n, 3)))
        return k.function

    for n in (1, 5):
        after = assert_pass_preserves(build, eliminate_common_subexpressions,
                                      lambda: [torch.zeros(1, dtype=torch.int32), n], grid=(1,))
        branches = next(op for op in after.walk() if op.opcode == OpCode.IF).regions
        assert all(any(op.opcode == OpCode.MUL for op in region.ops) for region in branches)
        assert count(after, OpCode.MUL) == 3


# -- DCE ----------------------------------------------------------------------------------------------

def _dce_kernel():
    k = KernelBuilder("dce", [("x_ptr", ptr(dt.float32), None), ("out", ptr(dt.float32), None),
                              ("flags", ptr(dt.int32), None), ("n", dt.int32, None)])
    s = k.s
    offs = s.arange(0, BLOCK)
    x = s.load(s.binary("add", k.arg["x_ptr"], offs))
    s.unary("exp", x)                                                   # unused
    s.load(s.binary("add", k.arg["out"], offs))                         # unused load
    n = k.arg["n"]
    # a loop without side effects whose result nobody reads
    k.for_loop(0, n, 1, [x], lambda i, a: [s.binary("mul", a, 2.0)])
    # a loop with a used carried value, a dead one (reads itself only), and a counter whose
    # result is unused but which a store in the loop reads
    def body(i, used, dead, counter):
        s.store(s.binary("add", k.arg["flags"], i), counter)
        return [s.binary("add", used, x), s.binary("mul", dead, s.binary("add", dead, used)),
                s.binary("add", counter, 3)]
    used, _, _ = k.for_loop(0, n, 1, [x, x, s.constant(5, dt.int32)], body)
    # an if without side effects (removed) and one with a store (kept)
    k.if_else(s.binary("gt", n, 1), lambda: [s.binary("add", n, 1)], lambda: [n], [dt.int32])
    def store_flag():
        s.store(k.arg["flags"], 7)
        return []
    k.if_else(s.binary("gt", n, 2), store_flag, lambda: [])
    s.store(s.binary("add", k.arg["out"], offs), used)
    return k.function


def test_dce_removes_dead_code_and_keeps_side_effects():
    def make_args():
        return [_floats(BLOCK, 5), torch.zeros(BLOCK), torch.zeros(8, dtype=torch.int32), 4]

    after = assert_pass_preserves(_dce_kernel, eliminate_dead_code, make_args, grid=(1,))
    text = print_function(after)
    assert count(after, OpCode.EXP) == 0 and count(after, OpCode.LOAD) == 1, text
    assert count(after, OpCode.FOR) == 1 and count(after, OpCode.IF) == 1, text
    loop = next(op for op in after.walk() if op.opcode == OpCode.FOR)
    assert len(loop.results) == 2 and len(loop.operands) == 5, text    # the dead carried value is gone
    assert count(after, OpCode.STORE) == 3 and count(after, OpCode.MUL) == 0, text


def test_dce_keeps_while_loops():
    k = KernelBuilder("spin", [("n", dt.int32, None)])
    s = k.s
    before = Block([dt.int32])
    with k.builder.insert_into(before):
        k.builder.create(OpCode.CONDITION, [s.binary("lt", before.args[0], k.arg["n"]), before.args[0]])
    after = Block([dt.int32])
    with k.builder.insert_into(after):
        k.builder.create(OpCode.YIELD, [s.binary("add", after.args[0], 1)])
    k.builder.create(OpCode.WHILE, [s.constant(0, dt.int32)], [dt.int32], regions=[before, after])
    assert not eliminate_dead_code(k.function)
    assert count(k.function, OpCode.WHILE) == 1


# -- simplify and the pass manager ---------------------------------------------------------------------

def test_simplify_reaches_a_fixed_point_and_preserves_results():
    def make_args():
        return [_floats(2 * BLOCK, 9), torch.zeros(2 * BLOCK), 3]

    after = assert_pass_preserves(_cse_kernel, simplify, make_args)
    assert not simplify(after)
    assert not fold_constants(after) and not eliminate_common_subexpressions(after)
    assert not eliminate_dead_code(after)


def test_pipeline_report_dumps_and_analysis(tmp_path, capsys):
    function = _cse_kernel()
    report = run_pipeline(function, default_pipeline(num_warps=4), dump_dir=str(tmp_path), dump=True)
    names = ["combine_dot_accumulation", "substitute_induction_variables", "simplify", "expand_descriptor_loads",
             "assign_layouts", "stage_invariant_operands", "pipeline_loops", "group_sibling_reductions", "defer_wgmma_waits",
             "analyze_pointers"]
    assert [r.name for r in report.records] == names
    assert not report.records[0].changed and not report.records[1].changed and report.records[2].changed
    assert not report.records[3].changed and not any(record.changed for record in report.records[5:])
    assert all(r.seconds >= 0 for r in report.records) and "simplify" in str(report)
    assert isinstance(report.analyses["analyze_pointers"], AnalysisResult)
    assert [p.name for p in tmp_path.iterdir()] == ["cse"]       # a folder per kernel
    assert sorted(p.name for p in (tmp_path / "cse").iterdir()) == sorted(
        f"{i:02d}_{name}.{when}.ir" for i, name in enumerate(names) for when in ("before", "after"))
    assert (tmp_path / "cse" / "09_analyze_pointers.after.ir").read_text() == print_function(function)
    run_pipeline(_cse_kernel(), [simplify], dump={"simplify"})
    assert "IR before pass 00 simplify" in capsys.readouterr().err


def test_pipeline_names_the_pass_that_broke_the_ir():
    def break_it(function):
        function.body.ops.pop(0)     # the program_id: its users now read an undefined value
        return True

    with pytest.raises(VerificationError, match="break_it"):
        run_pipeline(_cse_kernel(), [simplify, break_it])
    report = run_pipeline(_cse_kernel(), [lambda f: None], verify=True)
    assert report.records[0].changed      # no answer and no dump: assumed changed


# -- rewrite utilities ---------------------------------------------------------------------------------

def test_rewrite_utilities():
    k = KernelBuilder("rewrite", [("out", ptr(dt.int32), None), ("n", dt.int32, None)])
    s = k.s
    n = k.arg["n"]
    doubled = s.binary("add", n, n)
    (looped,) = k.for_loop(0, 4, 1, [doubled], lambda i, acc: [s.binary("add", acc, doubled)])
    s.store(k.arg["out"], looped)
    table = uses(k.function)
    assert len(table[id(n)]) == 2 and len(table[id(doubled)]) == 2   # one use inside the loop body
    three = Operation(OpCode.CONSTANT, [], [dt.int32], {"value": 3})
    tripled = Operation(OpCode.MUL, [n, three.result], [dt.int32])
    insert_before(doubled.defining_op, three)
    insert_before(doubled.defining_op, tripled)
    assert replace_all_uses(k.function, doubled, tripled.result) == 2
    erase_op(doubled.defining_op)
    verify(k.function)
    out = torch.zeros(1, dtype=torch.int32)
    launch(k.function, (1,), [out, 5])
    assert out.item() == 5 * 3 * 5

    substitution = ValueSubstitution()
    a, b, c = (s.constant(v, dt.int32) for v in (1, 2, 3))
    substitution.add(a, b)
    substitution.add(b, c)
    assert substitution.lookup(a) is c and substitution.lookup(c) is c and len(substitution) == 2


def test_analysis_leaves_the_ir_alone():
    function = _copy_kernel(dt.float32, True, True)
    text = print_function(function)
    result = analyze_pointers(function)
    assert print_function(function) == text
    assert all(v.layout is None for op in function.walk() for v in op.results)
    assert len(result) == sum(len(op.results) for op in function.walk()) + len(function.args)
    report = run_pipeline(function, [lambda f: _copy_kernel(dt.float16, True, True)])
    assert report.records[0].changed and report.function is not function


# -- pointer analysis ---------------------------------------------------------------------------------

def _copy_kernel(dtype, pointer_hint, n_hint, masked=True):
    hint = {"divisibility": 16} if pointer_hint else {}
    k = KernelBuilder("copy", [("x_ptr", ptr(dtype), hint), ("y_ptr", ptr(dtype), hint),
                               ("n", dt.int32, {"divisibility": 16} if n_hint else {})])
    s = k.s
    offs = s.binary("add", s.binary("mul", s.program_id(0), BLOCK), s.arange(0, BLOCK))
    mask = s.binary("lt", offs, k.arg["n"]) if masked else None
    x = s.load(s.binary("add", k.arg["x_ptr"], offs), mask=mask)
    s.store(s.binary("add", k.arg["y_ptr"], offs), x, mask=mask)
    return k.function


def _access_widths(function):
    result = analyze_pointers(function)
    widths = []
    for op in function.walk():
        if op.opcode in (OpCode.LOAD, OpCode.STORE):
            mask = op.operands[1] if op.opcode == OpCode.LOAD and op.attrs["masked"] else (
                op.operands[2] if op.opcode == OpCode.STORE and op.attrs["masked"] else None)
            pointee = op.operands[0].type.element.element
            widths.append(vector_width(result, op.operands[0], mask, pointee.itemsize))
    return widths


@pytest.mark.parametrize("dtype, pointer_hint, n_hint, masked, width", [
    (dt.float32, True, False, False, 4), (dt.float16, True, False, False, 8),
    (dt.float32, False, False, False, 1), (dt.float16, False, True, True, 1),
    (dt.float32, True, True, True, 4), (dt.float16, True, True, True, 8), (dt.float32, True, False, True, 1),
    (dt.int8, True, True, True, 16), (dt.float64, True, True, True, 2),
])
def test_copy_kernel_vector_width(dtype, pointer_hint, n_hint, masked, width):
    assert _access_widths(_copy_kernel(dtype, pointer_hint, n_hint, masked)) == [width, width]


def test_copy_kernel_facts():
    function = _copy_kernel(dt.float32, True, True)
    result = analyze_pointers(function)
    load = next(op for op in function.walk() if op.opcode == OpCode.LOAD)
    pointer, mask = result[load.operands[0]], result[load.operands[1]]
    assert (pointer.contiguity, pointer.divisibility) == ((BLOCK,), (16,))
    assert mask.constancy == (16,)
    offsets = result[load.operands[0].defining_op.operands[1]]
    assert offsets == type(offsets)((BLOCK,), (BLOCK,), (1,), None, True)
    with pytest.raises(KeyError):
        result[_copy_kernel(dt.float32, True, True).args[0]]


def _tile_kernel(stride_hint, cols_hint):
    k = KernelBuilder("tile", [("x_ptr", ptr(dt.float32), {"divisibility": 16}),
                               ("stride", dt.int32, {"divisibility": 16} if stride_hint else {}),
                               ("n_cols", dt.int32, {"divisibility": 16} if cols_hint else {})])
    s = k.s
    rows = s.expand_dims(s.arange(0, 16), 1)
    cols = s.expand_dims(s.arange(0, 32), 0)
    offs = s.binary("add", s.binary("mul", rows, k.arg["stride"]), cols)
    mask = s.binary("lt", cols, k.arg["n_cols"])
    x = s.load(s.binary("add", k.arg["x_ptr"], offs), mask=mask)
    s.store(s.binary("add", k.arg["x_ptr"], offs), s.binary("add", x, 1.0), mask=mask)
    return k.function


@pytest.mark.parametrize("stride_hint, cols_hint, width", [(True, True, 4), (False, True, 1), (True, False, 1)])
def test_two_dimensional_row_stride_pattern(stride_hint, cols_hint, width):
    function = _tile_kernel(stride_hint, cols_hint)
    assert _access_widths(function) == [width, width]
    result = analyze_pointers(function)
    load = next(op for op in function.walk() if op.opcode == OpCode.LOAD)
    assert result[load.operands[0]].contiguity == (1, 32)


def test_hints_raise_the_facts():
    k = KernelBuilder("hinted", [("x_ptr", ptr(dt.float32), {"divisibility": 16}),
                                 ("idx_ptr", ptr(dt.int32), {"divisibility": 16}), ("stride", dt.int32, {})])
    s = k.s
    base = s.binary("mul", s.program_id(0), k.arg["stride"])
    plain = s.binary("add", base, s.arange(0, BLOCK))
    hinted = s.binary("add", s.multiple_of(base, 16), s.arange(0, BLOCK))
    gathered = s.load(s.binary("add", k.arg["idx_ptr"], s.arange(0, BLOCK)))
    promised = s.max_contiguous(s.multiple_of(gathered, 8), 32)
    for offsets in (plain, hinted, promised):
        s.store(s.binary("add", k.arg["x_ptr"], offsets), 1.0)
    assert _access_widths(k.function) == [4, 1, 4, 4]   # idx load, plain, hinted, promised
    facts = analyze_pointers(k.function)[promised]
    assert (facts.contiguity, facts.divisibility) == ((32,), (8,))


def test_loop_carried_pointer_keeps_its_facts():
    k = KernelBuilder("walk", [("x_ptr", ptr(dt.float32), {"divisibility": 16}), ("n", dt.int32, {}),
                               ("out", ptr(dt.float32), {"divisibility": 16})])
    s = k.s
    start = s.binary("add", k.arg["x_ptr"], s.arange(0, BLOCK))

    def body(i, p, acc):
        return [s.binary("add", p, BLOCK), s.binary("add", acc, s.load(p))]

    _, acc = k.for_loop(0, k.arg["n"], 1, [start, s.full((BLOCK,), 0.0, dt.float32)], body)
    s.store(s.binary("add", k.arg["out"], s.arange(0, BLOCK)), acc)
    assert _access_widths(k.function) == [4, 4]
    # a step that breaks the alignment is seen through the loop
    k2 = KernelBuilder("walk", [("x_ptr", ptr(dt.float32), {"divisibility": 16}), ("n", dt.int32, {})])
    p0 = k2.s.binary("add", k2.arg["x_ptr"], k2.s.arange(0, BLOCK))

    def unaligned_step(i, p):
        k2.s.store(p, 0.0)
        return [k2.s.binary("add", p, 3)]

    (p_end,) = k2.for_loop(0, k2.arg["n"], 1, [p0], unaligned_step)
    k2.s.store(p_end, 0.0)
    assert _access_widths(k2.function) == [1, 1]


# -- pointer analysis soundness: the claims hold on the values the interpreter computes ------------------

def _check_claims(info, values: np.ndarray, step: int):
    array = values.reshape(values.shape or (1,))
    for d in range(array.ndim):
        lines = np.moveaxis(array, d, -1).reshape(-1, array.shape[d])
        c, v, k = info.contiguity[d], info.divisibility[d], info.constancy[d]
        runs = lines.reshape(lines.shape[0], -1, c)
        assert (np.diff(runs, axis=-1) == step).all(), ("contiguity", d, info, lines[:2])
        assert (runs[..., 0] % v == 0).all(), ("divisibility", d, info, lines[:2])
        same = lines.reshape(lines.shape[0], -1, k)
        assert (same == same[..., :1]).all(), ("constancy", d, info, lines[:2])
    if info.constant is not None:
        assert (array == info.constant).all(), info
    if info.nonnegative:
        assert (array >= 0).all(), info


_SHAPE = (4, 64)
_NUMEL = 256


def _random_index_kernel(seed: int):
    """A kernel of random index arithmetic whose every integer/pointer block is also stored."""
    rng = np.random.default_rng(seed)
    k = KernelBuilder("random", [("x_ptr", ptr(dt.float32), {"divisibility": 16}),
                                 ("y_ptr", ptr(dt.float16), {}), ("m", dt.int32, {"divisibility": 16}),
                                 ("q", dt.int32, {}), ("out", ptr(dt.int64), {"divisibility": 16})])
    s = k.s
    row = s.broadcast_to(s.expand_dims(s.arange(0, _SHAPE[0]), 1), _SHAPE)
    col = s.broadcast_to(s.expand_dims(s.arange(0, _SHAPE[1]), 0), _SHAPE)
    pid, m, q = (s.broadcast_to(v, _SHAPE) for v in (s.program_id(0), k.arg["m"], k.arg["q"]))
    pool = [row, col, pid, m, q, s.binary("add", s.binary("mul", pid, _SHAPE[1]), col),
            s.binary("add", s.binary("mul", row, m), col), s.binary("sub", col, 8),
            s.broadcast_to(s.trans(s.expand_dims(s.arange(64, 128), 1)), _SHAPE)]
    offs = pool[5]
    pool += [s.binary("lt", offs, m), s.binary("ge", offs, m), s.binary("gt", m, col), s.binary("floordiv", offs, 4),
             s.binary("mod", col, 8), s.binary("and", offs, 7), s.binary("rshift", pool[7], 2),
             s.binary("mod", pool[7], 8), s.binary("floordiv", pool[7], 4), s.binary("le", offs, m),
             s.binary("lt", m, offs), s.binary("lt", s.binary("add", col, 3), m),
             s.binary("floordiv", s.binary("mul", m, 4), 4), s.binary("rshift", m, 2)]
    constants = [1, 2, 4, 8, 16, 32, 3, 5, 0]
    for _ in range(16):
        a, b = (pool[int(i)] for i in rng.integers(0, len(pool), 2))
        choice = int(rng.integers(0, 12))
        constant = int(rng.choice(constants))
        if choice == 0:
            pool.append(s.binary("add", a, b))
        elif choice == 1:
            pool.append(s.binary("sub", a, b))
        elif choice == 2:
            pool.append(s.binary("mul", a, constant))
        elif choice == 3:
            pool.append(s.binary(str(rng.choice(["floordiv", "mod"])), a, max(constant, 1)))
        elif choice == 4:
            pool.append(s.binary(str(rng.choice(["rshift", "lshift"])), a, int(rng.integers(0, 4))))
        elif choice == 5:
            pool.append(s.binary("and", a, constant - 1 if rng.integers(0, 2) else constant))
        elif choice == 6:
            pool.append(s.where(s.binary(str(rng.choice(["lt", "ge", "gt", "le"])), a, b), a, b))
        elif choice == 7:
            pool.append(s.binary(str(rng.choice(["minimum", "maximum", "or", "xor"])), a, b))
        elif choice == 8:
            pool.append(s.reshape(s.trans(s.reshape(a, (64, 4))), _SHAPE))
        elif choice in (9, 10):
            pool.append(s.binary(str(rng.choice(["lt", "ge", "gt", "le", "eq"])), a, b))
        else:
            pool.append(s.cast(a, dt.int64))
    integers = [i for i, v in enumerate(pool) if not v.type.element.is_bool]
    pointers = [s.binary("add", k.arg["x_ptr"], s.binary("add", pool[-1], col)),
                s.binary("add", k.arg["y_ptr"], pool[int(rng.choice(integers))])]
    checked = pool + pointers
    flat = s.reshape(s.arange(0, _NUMEL), _SHAPE)
    base = s.binary("add", k.arg["out"], s.binary("mul", s.program_id(0), _NUMEL * len(checked)))
    for index, value in enumerate(checked):
        s.store(s.binary("add", base, s.binary("add", flat, index * _NUMEL)), s.cast(value, dt.int64))
    return k.function, checked


@pytest.mark.parametrize("seed", range(24))
def test_pointer_analysis_claims_hold_on_interpreted_values(seed):
    function, checked = _random_index_kernel(seed)
    verify(function)
    result = analyze_pointers(function)
    grid = 3
    out = torch.zeros(grid * _NUMEL * len(checked), dtype=torch.int64)
    x, y = torch.zeros(1024), torch.zeros(2048, dtype=torch.float16)[1:]
    launch(function, (grid,), [x, y, 48, 7, out])
    values = out.view(grid, len(checked), *_SHAPE).numpy()
    for index, value in enumerate(checked):
        element = value.type.element
        step = element.element.itemsize if isinstance(element, dt.PointerType) else 1
        for program in range(grid):
            _check_claims(result[value], values[program, index], step)
