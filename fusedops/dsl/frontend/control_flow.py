"""`if` statements, and the rules of all control flow (loops are compiled by loops.py): compile-time
resolution, the IR IF / FOR / WHILE ops and the values they carry.

Rules (tests in tests/test_control_flow.py):
- `if` on a compile-time value compiles only the taken branch, in place.
- `if` on a runtime scalar builds an IF op. Each branch is compiled from a copy of the scope; a
  name assigned in either branch (and defined in both, or before the `if`) becomes an IF result,
  with one type in both branches (a literal adopts the other branch's type). A name defined in
  only one branch is not defined after the `if`. An `if` containing a `return` takes the
  statements after it into both branches, so each path ends in a return; the IF merges the
  returned values.
- `for i in range(a, b, step)` builds a FOR op (even with constexpr bounds), following Python's
  `range`: no iteration when the range is empty, negative steps count down; a constexpr step of 0
  is a CompilationError, a runtime one an error in the interpreter (undefined on the GPU). The
  bounds are converted to one integer type, which is the loop variable's. `dsl.static_range` and
  iteration over a compile-time tuple unroll instead (the loop variable is then a constexpr).
  The loop variable is not defined after the loop; `break`, `continue` and `return` inside a loop
  are not supported.
- Loop-carried values: a name assigned in the body, defined before the loop and read at or after
  the loop's start (in this loop, an enclosing loop, or after). Its type must stay the same:
  a literal initial value (`acc = 0`) adopts the type the body gives it; a body value whose type
  changed only because a literal won the promotion (`x = x + 1.5` with x an int32) is converted
  back, as C's `x += 1.5` would; any other change is a CompilationError naming the variable.
  A tuple of kernel values and numbers is carried item by item (`name[i]` in errors); its length
  must not change. Names first assigned inside a loop are not defined after it.
- `while cond:` builds a WHILE op whose before-region evaluates `cond` on the carried values; a
  compile-time false condition removes the loop, a compile-time true one is an error.
- A block-valued condition (`if`, `while`, `a if c else b`) is a CompilationError that says to use
  dsl.where.
"""

from __future__ import annotations

import ast

from ..errors import CompilationError
from ..ir import Block, OpCode, Value
from ..language import promotion
from ..language.dtypes import BlockType, DType, shape_of
from .scope import is_runtime

_MISSING = object()


def _is_number(value) -> bool:
    return isinstance(value, (bool, int, float)) and not isinstance(value, Value)


def _element(type_):
    return type_.element if isinstance(type_, BlockType) else type_


def _same_constant(a, b) -> bool:
    return a is b or (type(a) is type(b) and a == b)


def _always_returns(statements) -> bool:
    if not statements:
        return False
    last = statements[-1]
    if isinstance(last, ast.Return):
        return True
    return isinstance(last, ast.If) and _always_returns(last.body) and _always_returns(last.orelse)


def _contains_return(node) -> bool:
    return any(isinstance(n, ast.Return) for n in ast.walk(node))


def _assigned_names(statements) -> list:
    found = {}
    for statement in statements:
        for node in ast.walk(statement):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                found.setdefault(node.id, (node.lineno, node.col_offset))
    return sorted(found, key=found.get)


class _Constant:
    """A name whose compile-time value is the same after both branches."""

    def __init__(self, value):
        self.value = value


class _Leaf:
    """One value an IF op yields: its value in each branch and its type."""

    def __init__(self, values, type_):
        self.values, self.type = values, type_


class ControlFlowMixin:
    # -- if ----------------------------------------------------------------------------------------
    def compile_if(self, node: ast.If, rest: list):
        """Compile `if`; returns the taken branch's statements (constexpr condition, for the caller to
        splice in), a `Returned` (the `if` ended the function), or None."""
        condition = self.visit(node.test)
        if not is_runtime(condition):
            return list(node.body if condition else node.orelse)
        with self.located(node.test):
            condition = self.semantic.to_condition(condition)
        if not self.loops and _contains_return(node):
            then_statements = node.body + ([] if _always_returns(node.body) else rest)
            else_statements = node.orelse + ([] if _always_returns(node.orelse) else rest)
            return self._runtime_if(node, condition, then_statements, else_statements, returns=True)
        self._runtime_if(node, condition, node.body, node.orelse, returns=False)
        return None

    def _runtime_if(self, node, condition: Value, then_statements, else_statements, returns: bool):
        from .generator import Returned

        before = self.scope
        blocks, scopes, outcomes = [], [], []
        for statements in (then_statements, else_statements):
            block, scope = Block(), before.copy()
            outcomes.append(self.compile_region(block, scope, statements))
            blocks.append(block)
            scopes.append(scope)
        if returns:
            values = [o.value if isinstance(o, Returned) else None for o in outcomes]
            plan = self._merge("the returned value", values[0], values[1])
            return Returned(self._emit_if(condition, blocks, [plan])[0])
        names, plans = [], []
        for name in dict.fromkeys(list(scopes[0].names) + list(scopes[1].names)):
            old = before.names.get(name, _MISSING)
            new = [scope.names.get(name, _MISSING) for scope in scopes]
            if new[0] is old and new[1] is old:
                continue
            if _MISSING in new:
                before.hide(name, f"`{name}` is assigned in only one branch of the `if` at line "
                                  f"{self.source.location(node).line}, so it is not defined after it; assign it "
                                  "before the `if` or in both branches")
                continue
            names.append(name)
            plans.append(self._merge(f"`{name}`", new[0], new[1]))
        for scope in scopes:
            for name, reason in scope.hidden.items():
                if name not in before.names and name not in before.hidden:
                    before.hide(name, reason)
        for name, value in zip(names, self._emit_if(condition, blocks, plans)):
            before.assign(name, value)
        return None

    def _merge(self, what: str, a, b):
        """How one name's values at the end of the two branches become one value after the `if`: a
        `_Constant`, a tuple of plans, or a `_Leaf` the IF yields."""
        if isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b):
            return tuple(self._merge(f"{what}[{i}]", x, y) for i, (x, y) in enumerate(zip(a, b)))
        if not is_runtime(a) and not is_runtime(b):
            if _same_constant(a, b):
                return _Constant(a)
            if _is_number(a) and _is_number(b):
                dtype = promotion.promote(promotion.literal_dtype(a), promotion.literal_dtype(b))
                return _Leaf((a, b), dtype)
            raise CompilationError(f"{what} is the compile-time value {a!r} in one branch of a runtime `if` and "
                                   f"{b!r} in the other; only numbers can differ between the branches")
        if is_runtime(a) and is_runtime(b):
            if a.type != b.type:
                raise CompilationError(f"{what} has type {a.type} in the `if` branch and {b.type} in the `else` "
                                       "branch; convert one with .to(dtype) (or broadcast it) so that both agree")
            return _Leaf((a, b), a.type)
        value, other = (a, b) if is_runtime(a) else (b, a)
        if _is_number(other) and isinstance(_element(value.type), DType) \
                and promotion.literal_fits(other, _element(value.type)):
            return _Leaf((a, b), value.type)
        raise CompilationError(f"{what} is a {value.type} value in one branch of the `if` and {other!r} in the "
                               "other; give it one type in both branches")

    def _emit_if(self, condition: Value, blocks: list, plans: list) -> list:
        leaves = []

        def collect(plan):
            if isinstance(plan, _Leaf):
                leaves.append(plan)
            elif isinstance(plan, tuple):
                for item in plan:
                    collect(item)

        for plan in plans:
            collect(plan)
        for index, block in enumerate(blocks):
            with self.builder.insert_into(block):
                operands = [self.materialize(leaf.values[index], leaf.type) for leaf in leaves]
                self.builder.create(OpCode.YIELD, operands, [])
        op = self.builder.create(OpCode.IF, [condition], [leaf.type for leaf in leaves], regions=blocks)
        results = iter(op.results)

        def rebuild(plan):
            if isinstance(plan, _Leaf):
                return next(results)
            if isinstance(plan, _Constant):
                return plan.value
            return tuple(rebuild(item) for item in plan)

        return [rebuild(plan) for plan in plans]

    def materialize(self, value, type_) -> Value:
        """`value` (an IR value of `type_`, or a number) as an IR value of `type_`."""
        if is_runtime(value):
            return value
        return self.semantic.constant(value, _element(type_), shape_of(type_))

    def compile_region(self, block: Block, scope, statements):
        """Compile `statements` into `block` with `scope` as the current scope."""
        saved = self.scope
        self.scope = scope
        try:
            with self.builder.insert_into(block):
                return self.compile_statements(statements)
        finally:
            self.scope = saved
