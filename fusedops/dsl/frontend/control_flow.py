"""`if` statements, and the rules of all control flow (loops are compiled by loops.py): compile-time
resolution, the IR IF / FOR / WHILE ops and the values they carry.

Rules (tests in tests/test_control_flow.py):
- `if` on a compile-time value compiles only the taken branch, in place.
- `if` on a runtime scalar builds an IF op. Each branch is compiled from a copy of the scope; a
  name assigned in either branch (and defined in both, or before the `if`) becomes an IF result,
  with one type in both branches (a literal adopts the other branch's type; numbers in every
  branch, as in an `elif` chain of literals, promote together as literals do). A tuple must have
  one length in both branches; a block pointer (language/composite.py) merges item by item too, and must
  have one block_shape and order in both. A name defined in only one branch is not defined after the `if`.
  An `if` containing a `return` takes the statements after it into both branches, so each path
  ends in a return; the IF merges the returned values.
- `for i in range(a, b, step)` builds a FOR op (even with constexpr bounds), following Python's
  `range`: no iteration when the range is empty, negative steps count down; a constexpr step of 0
  is a CompilationError, a runtime one an error in the interpreter (undefined on the GPU). The
  bounds are converted to one integer type, which is the loop variable's. `dsl.static_range` and
  iteration over a compile-time tuple unroll instead (the loop variable is then a constexpr).
  The loop variable is not defined after the loop; `break`, `continue` and `return` inside a loop
  are not supported.
- Loop-carried values: a name assigned in the body, defined before the loop and read at or after
  the loop's start (in this loop, an enclosing loop, or after). Its type must stay the same:
  a literal initial value (`acc = 0`) adopts the type the body gives it, and so does a nested
  loop's initial value computed from such a literal, converted (`for i: for j: acc += 0.5` promotes
  as one loop does, in a helper's loop too), also where the body gives it that type in one branch of
  an `if` (`if c: acc = x`: the IF yields x's type, `_carried_merge`) or assigns it a literal (`acc = 1`,
  then `acc = 0.5`: the two literals promote); a body value whose type changed only because a
  literal won the promotion (`x = x + 1.5` with x an int32) is converted back, as C's
  `x += 1.5` would (not `x = load_f32 + 1`: the load, not the literal, made it a float); any other
  change is a CompilationError naming the variable.
  A tuple of kernel values and numbers is carried item by item (`name[i]` in errors); its length
  must not change. So is a block pointer (`p.offsets[1]` in errors), whose block_shape and order must
  not. A name the body leaves unchanged, or assigns only the number it starts as (`v = 0`
  before the loop and in it, under an `if` or in a nested loop too), is not carried: it stays that
  compile-time value after the loop. Names first assigned inside a loop are not defined after it.
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
from ..language.composite import is_composite
from ..language.dtypes import BlockType, DType, shape_of, with_element
from ..language.shape_ops import described, shown
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


# Where the two values `_merge` joins come from, when the `if` has both branches.
_BRANCHES = ("in the `if` branch", "in the `else` branch")


def _promoted_with_literal(type_, number):
    """`type_` with the element type it promotes to with the literal `number` (as two literals promote when
    `type_` is a literal's), or None where there is none (not a dtype; an int past 64 bits)."""
    element = _element(type_)
    if not isinstance(element, DType):
        return None
    try:
        return with_element(type_, promotion.promote(element, promotion.literal_dtype(number)))
    except promotion.PromotionError:
        return None


def _broadcasts_to(type_, target) -> bool:
    """Whether a value of `type_` broadcasts to `target`'s shape."""
    try:
        return promotion.broadcast_shapes(shape_of(type_), shape_of(target)) == tuple(shape_of(target))
    except promotion.PromotionError:
        return False


def _item(what: str, index: int) -> str:
    """How errors name item `index` of `what`: `t[0]` for `t`, as the loops name a carried tuple's items."""
    return f"{what[:-1]}[{index}]`" if what.endswith("`") else f"{what}[{index}]"


class _Constant:
    """A name whose compile-time value is the same after both branches."""

    def __init__(self, value):
        self.value = value


class _CompositePlan(tuple):
    """The plans of a composite value's items (a tuple of them), and the value they rebuild (`template`)."""

    def __new__(cls, template, plans):
        plan = super().__new__(cls, plans)
        plan.template = template
        return plan


class _Leaf:
    """One value an IF op yields: its value in each branch and its type; `literals`: the numbers it can be
    when every branch gives a literal (an `elif` chain of them), else None; `cast`: the branches' values are
    converted to the type (an earlier `if`'s result made of literals, typed as they alone promote)."""

    def __init__(self, values, type_, literals=None, cast=False):
        self.values, self.type, self.literals = values, type_, literals
        self.cast = cast or literals is not None


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
            sides = _BRANCHES if node.orelse else ("in the `if` branch", "after the `if`")
            plan = self._merge("the returned value", values[0], values[1], sides)
            return Returned(self._emit_if(condition, blocks, [plan])[0])
        sides = _BRANCHES if node.orelse else ("in the `if` branch", "before the `if` (which has no `else`)")
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
            plans.append(self._merge(f"`{name}`", new[0], new[1], sides))
        for scope in scopes:
            for name, reason in scope.hidden.items():
                if name not in before.names and name not in before.hidden:
                    before.hide(name, reason)
        for name, value in zip(names, self._emit_if(condition, blocks, plans)):
            before.assign(name, value)
        return None

    def _merge(self, what: str, a, b, sides: tuple):
        """How one name's values at the end of the two branches become one value after the `if`: a
        `_Constant`, a tuple of plans, or a `_Leaf` the IF yields. `sides` names where `a` and `b` come
        from, for the errors."""
        if isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b):
            return tuple(self._merge(_item(what, i), x, y, sides) for i, (x, y) in enumerate(zip(a, b)))
        where = f"{described(a)} {sides[0]} but {described(b)} {sides[1]}"
        if is_composite(a) or is_composite(b):      # a block pointer: merged item by item
            if not (is_composite(a) and a.same_layout(b)):
                raise CompilationError(f"{what} is {where}; after a runtime `if` it must be one kind of value in both "
                                       "branches (block pointers of one block_shape and order)")
            names = [f"{what[:-1]}.{name}`" if what.endswith("`") else f"{what}.{name}" for name in a.item_names()]
            return _CompositePlan(a, (self._merge(name, x, y, sides)
                                      for name, x, y in zip(names, a.items(), b.items())))
        if isinstance(a, tuple) or isinstance(b, tuple):
            raise CompilationError(f"{what} is {where}; after a runtime `if` it must be a tuple of one length in "
                                   "both branches, or a single value in both")
        if not is_runtime(a) and not is_runtime(b):
            if _same_constant(a, b):
                return _Constant(a)
            if _is_number(a) and _is_number(b):
                return self._literal_leaf(a, b)
            raise CompilationError(f"{what} is the compile-time value {shown(a)} {sides[0]} but {shown(b)} "
                                   f"{sides[1]}; only numbers can differ between the branches of a runtime "
                                   "`if`")
        if is_runtime(a) and is_runtime(b):
            known = self.context.literal_results
            if a in known and b in known:
                return self._literal_leaf(a, b)
            for value, other in ((a, b), (b, a)):       # literals (an elif chain) and a runtime value
                if other in known and other.type != value.type and shape_of(other.type) == shape_of(value.type) \
                        and isinstance(_element(value.type), DType) \
                        and all(promotion.literal_fits(n, _element(value.type)) for n in known[other]):
                    return _Leaf((a, b), value.type, cast=True)
            if a.type != b.type:
                adopted = self._carried_merge(what, a, b)
                if adopted is not None:
                    return adopted
                raise CompilationError(f"{what} has type {a.type} {sides[0]} and {b.type} {sides[1]}; "
                                       "convert one with .to(dtype) (or broadcast it) so that both agree")
            return _Leaf((a, b), a.type)
        value, other = (a, b) if is_runtime(a) else (b, a)
        if _is_number(other) and value in self.context.literal_results:
            return self._literal_leaf(a, b)
        if _is_number(other) and isinstance(_element(value.type), DType) \
                and promotion.literal_fits(other, _element(value.type)):
            return _Leaf((a, b), value.type)
        wider = _promoted_with_literal(value.type, other) if _is_number(other) else None
        adopted = self._carried_merge(what, value, wider) if wider is not None else None
        if adopted is not None:
            return _Leaf((a, b), adopted.type, cast=True)
        raise CompilationError(f"{what} is {where}; give it one type in both branches")

    def _carried_merge(self, what: str, a: Value, b):
        """The `_Leaf` of a loop-carried variable (`what`) that one branch of an `if` in the loop body leaves as the
        loop carries it and the other assigns a value of another type, as the loop rules take that value at the
        end of the body (loops.py): the carried value's literal initial value adopts the other's type (`acc = 0`,
        then `if c: acc = x_f32`: the IF yields float32 and the loop is compiled again with a float32 carry), or
        the other value is the carried one's literal promotion (`if c: x = x + 1.5` with x an int32), converted
        back. The branch that keeps the variable may also compute it from the carried value and literals alone
        (`if c: acc = acc * 2 else: acc = 0.5`), and a helper may return it on one path and a value of another type
        on the other (`acc = pick(acc, x)`). `b` may be a type, a number's in the other branch (`_merge`). None
        otherwise (a type change the loop would refuse too)."""
        from .carried_types import carried_source, is_literal_promotion

        # a helper's returned value: the carried value it was passed, under its parameter's name
        name = None if what.startswith("the returned value") else what.strip("`")
        inits = self.context.carry_inits
        for carried, value in ((a, b), (b, a)):
            source = carried_source(inits, carried, name) if isinstance(carried, Value) else None
            if source is None:
                continue
            type_ = value.type if isinstance(value, Value) else value     # (a type: a number's, see _merge)
            if type_ != source.type and _broadcasts_to(carried.type, type_) and self._adopts(inits[source], type_):
                return _Leaf((a, b), type_, cast=True)
            if carried is source and isinstance(value, Value) and is_literal_promotion(value, carried.type):
                return _Leaf((a, b), carried.type, cast=True)
        return None

    def _literal_leaf(self, a, b) -> _Leaf:
        """The `_Leaf` of two branches that each give a number, or an earlier `if`'s result made of numbers
        only (`literal_results`): typed as those numbers promote together, as one `if` of two literals is."""
        known = self.context.literal_results
        literals = tuple(n for v in (a, b) for n in (known.get(v, ()) if is_runtime(v) else (v,)))
        dtype = promotion.literal_dtype(literals[0])
        for literal in literals[1:]:
            dtype = promotion.promote(dtype, promotion.literal_dtype(literal))
        return _Leaf((a, b), dtype, literals)

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
                # an earlier `if`'s result made of literals converts to the type of this one's
                operands = [self._converted(value, leaf.type) if leaf.cast else value
                            for value, leaf in zip(operands, leaves)]
                self.builder.create(OpCode.YIELD, operands, [])
        op = self.builder.create(OpCode.IF, [condition], [leaf.type for leaf in leaves], regions=blocks)
        results = iter(op.results)

        def rebuild(plan):
            if isinstance(plan, _Leaf):
                result = next(results)
                if plan.literals is not None:
                    self.context.literal_results[result] = plan.literals
                return result
            if isinstance(plan, _Constant):
                return plan.value
            if isinstance(plan, _CompositePlan):
                return plan.template.with_items(tuple(rebuild(item) for item in plan))
            return tuple(rebuild(item) for item in plan)

        return [rebuild(plan) for plan in plans]

    def _converted(self, value: Value, type_) -> Value:
        """`value` converted to `type_`'s element type and broadcast to its shape."""
        value = self.semantic.cast(value, _element(type_))
        if shape_of(value.type) != shape_of(type_):
            value = self.semantic.broadcast_to(value, shape_of(type_))
        return value

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
