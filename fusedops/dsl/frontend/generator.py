"""Function-level code generation: binds a kernel's signature to IR arguments, inlines calls to
`@dsl.jit` helpers, and walks statement lists (including `return`).

`generate(jit_function, arg_specs)` is the entry point: it returns the kernel's IR `Function`,
specialized on `arg_specs` (one per parameter, see `runtime/signature.py`: a runtime type, a
compile-time value, or an int known to equal 1, which becomes the IR constant 1).

The visitor is split by concern into mixins: statements.py (assignments, assert, ...),
control_flow.py (`if`, merging the values of branches), loops.py (`for`, `while`, loop-carried
values), expressions.py, calls.py. Names are resolved by scope.py; errors get their source
location through errors.py.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
from typing import Optional

from ..errors import CompilationError, UnsupportedError
from ..ir import Block, Builder, Function, Value, verify
from ..language import core
from ..language.dtypes import int32
from ..language.semantics import Semantics
from ..language.shape_ops import described
from ..runtime.signature import bind_parameters
from .calls import CallsMixin
from .control_flow import ControlFlowMixin
from .errors import SourceInfo, with_location
from .expressions import ExpressionsMixin
from .loops import LoopsMixin
from .scope import ClassNamespace, InstanceNamespace, Scope, is_runtime
from .statements import StatementsMixin

_UNSUPPORTED = {
    "Lambda": "lambda expressions", "ListComp": "list comprehensions", "SetComp": "set comprehensions",
    "DictComp": "dict comprehensions", "GeneratorExp": "generator expressions", "Dict": "dicts",
    "Set": "sets", "Await": "await", "Yield": "yield", "YieldFrom": "yield from", "NamedExpr": "`:=`",
    "FunctionDef": "nested function definitions (define a @dsl.jit function at module level)",
    "AsyncFunctionDef": "async functions", "ClassDef": "class definitions", "With": "`with` blocks",
    "AsyncWith": "`async with`", "AsyncFor": "`async for`", "Try": "try/except", "TryStar": "try/except*",
    "Raise": "raise (use dsl.device_assert)", "Delete": "del", "Global": "global declarations",
    "Nonlocal": "nonlocal declarations", "Import": "imports (import at module level)",
    "ImportFrom": "imports (import at module level)", "Match": "match statements",
    "Starred": "`*` unpacking here", "FormattedValue": "f-strings",
}


@dataclasses.dataclass
class CompilationContext:
    """State shared by every function generated for one kernel (the kernel and inlined helpers)."""

    builder: Builder
    semantic: Semantics
    used_globals: dict = dataclasses.field(default_factory=dict)   # (table key, name) -> (table, name, obj)
    call_stack: list = dataclasses.field(default_factory=list)     # jit functions being compiled
    # a loop's block argument -> its initial value (a number or an IR value), while the loop body compiles
    carry_inits: dict = dataclasses.field(default_factory=dict)
    # an IF result made of numbers only -> those numbers (control_flow._Leaf)
    literal_results: dict = dataclasses.field(default_factory=dict)

    def record_global(self, table, name: str, obj) -> None:
        # a dict by identity; a ClassNamespace (made anew at each read) by its class, an InstanceNamespace by its object
        key = table if isinstance(table, (ClassNamespace, InstanceNamespace)) else id(table)
        self.used_globals[(key, name)] = (table, name, obj)


class Returned:
    """The outcome of a statement list that ends in `return` (or falls off the function's end)."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value


class FunctionGenerator(StatementsMixin, ControlFlowMixin, LoopsMixin, ExpressionsMixin, CallsMixin,
                        ast.NodeVisitor):
    """Compiles the body of one Python function (a kernel, or a helper inlined into it)."""

    def __init__(self, context: CompilationContext, source: SourceInfo, scope: Scope, is_kernel: bool):
        self.context = context
        self.builder = context.builder
        self.semantic = context.semantic
        self.source = source
        self.scope = scope
        self.is_kernel = is_kernel
        self.loops: list = []          # enclosing for/while nodes (unrolled ones too)
        self._loads = _name_loads(source.tree)

    # -- visiting with locations -----------------------------------------------------------------
    def visit(self, node):
        with self.located(node):
            return super().visit(node)

    @contextlib.contextmanager
    def located(self, node):
        """Stamp the IR built inside with `node`'s location; give errors raised inside that location."""
        previous = self.builder.loc
        loc = self.source.location(node) if hasattr(node, "lineno") else previous
        self.builder.loc = loc
        try:
            yield loc
        except CompilationError as error:
            raise with_location(error, loc) from None
        finally:
            self.builder.loc = previous

    def generic_visit(self, node):
        what = _UNSUPPORTED.get(type(node).__name__, f"`{type(node).__name__}` nodes")
        raise UnsupportedError(f"not supported in kernels: {what}")

    # -- statement lists and return --------------------------------------------------------------
    def compile_body(self) -> Optional[object]:
        """Compile the whole function body; the value it returns (None when it returns nothing)."""
        outcome = self.compile_statements(self.source.tree.body)
        return outcome.value if isinstance(outcome, Returned) else None

    def compile_statements(self, statements) -> Optional[Returned]:
        """Compile `statements` in order; a `Returned` when they end the function.

        A constexpr `if` splices its taken branch into the list. A runtime `if` that contains a
        `return` takes the rest of the list into both of its branches (see `compile_if`), so every
        path ends in a return and the IF op merges the returned values.
        """
        statements = list(statements)
        index = 0
        while index < len(statements):
            statement = statements[index]
            try:
                if isinstance(statement, ast.Return):
                    return Returned(self.visit_return_value(statement))
                if isinstance(statement, ast.If):
                    rest = statements[index + 1:]
                    with self.located(statement):
                        outcome = self.compile_if(statement, rest)
                    if isinstance(outcome, list):       # constexpr condition: the taken branch
                        statements, index = outcome + rest, 0
                        continue
                    if isinstance(outcome, Returned):
                        return outcome
                else:
                    self.visit(statement)
            except RecursionError:
                # the frontend recurses once per nested operation and per `elif`: hundreds of them exhaust
                # Python's recursion limit (caught here, by the innermost statement with room to report it)
                raise with_location(CompilationError(
                    "this statement nests too deeply for the compiler (Python's recursion limit): split a long "
                    "expression into several statements, or a long `elif` chain into separate `if`s"),
                    self.source.location(statement)) from None
            index += 1
        return None

    def visit_return_value(self, node: ast.Return):
        with self.located(node):
            if self.loops:
                raise UnsupportedError("`return` inside a loop is not supported; carry a flag through the "
                                       "loop (or use a `while` loop whose condition stops it) and return after")
            if node.value is None:
                return None
            value = self.visit(node.value)
            if self.is_kernel and value is not None:
                raise CompilationError("a kernel cannot return a value; write results to memory with dsl.store")
            return value

    # -- liveness for loop-carried values ---------------------------------------------------------
    def read_at_or_after(self, name: str, position: tuple) -> bool:
        """Whether `name` is read anywhere at or after source `position` (line, col) in this function."""
        return any(n == name and p >= position for n, p in self._loads)

    # -- calls to other @dsl.jit functions --------------------------------------------------------
    def inline_call(self, callee, args: list, kwargs: dict):
        """Compile `callee(*args, **kwargs)` in place and return what it returns. A parameter annotated with
        a dsl dtype converts its argument to it (`_annotated_argument`)."""
        if callee in self.context.call_stack:
            raise UnsupportedError(f"recursive call to `{callee.__name__}`: kernels cannot recurse")
        names = bind_arguments(callee, args, kwargs)
        source = callee.source
        scope = Scope(source, self.context.record_global)
        for param, value in zip(callee.params, names):
            if param.is_constexpr and isinstance(value, Value):
                raise CompilationError(f"argument `{param.name}` of `{callee.__name__}` is a dsl.constexpr "
                                       "parameter, but a runtime value was passed")
            if param.annotation is not None and not param.is_constexpr:
                value = self._annotated_argument(callee, param, value)
            scope.assign(param.name, value)
        # an error inside a helper of the language itself (dsl.rand, ...) called from user code is reported at the
        # user's call, naming the helper, rather than at a line of fusedops/dsl; but an error inside a user function
        # that such a helper calls (dsl.reduce's combine_fn) stays at its line of the user's source, naming the
        # function, the helper and the helper's call
        caller = self.context.call_stack[-1] if self.context.call_stack else None
        library_entry = _is_library_helper(callee) and not _is_library_helper(caller)
        callback = _is_library_helper(caller) and not _is_library_helper(callee)
        self.context.call_stack.append(callee)
        try:
            generator = FunctionGenerator(self.context, source, scope, is_kernel=False)
            return generator.compile_body()
        except CompilationError as error:
            if callback and not getattr(error, "in_user_function", False) and error.loc is not None:
                located = type(error)(f"in `{callee.__name__}`, called by dsl.{caller.__name__}: {error.message}",
                                      error.loc)
                located.in_user_function = True
                raise located from None
            if not library_entry:
                raise
            if getattr(error, "in_user_function", False):
                call = self.builder.loc
                at = f" (the dsl.{callee.__name__} call at {call.file}:{call.line})" if \
                    getattr(call, "line", 0) > 0 else ""
                raise type(error)(error.message + at, error.loc) from None
            raise type(error)(f"dsl.{callee.__name__}: {error.message}") from None
        finally:
            self.context.call_stack.pop()

    def _annotated_argument(self, callee, param, value):
        """`value` converted to the dsl dtype `param` is annotated with (`def helper(n: dsl.int64)`), as
        `n: dsl.int64 = value` converts it; None and dsl.constexpr(...) values stay compile-time values, as
        they do for an annotated kernel parameter. Raises CompilationError for any other compile-time value
        (a tuple, a string, a dtype) and for a conversion that does not exist (a pointer to int32)."""
        if value is None or isinstance(value, core.constexpr):
            return value
        where = f"argument `{param.name}` of `{callee.__name__}` is annotated {param.annotation.name}"
        if not is_runtime(value) and not isinstance(value, (bool, int, float)):
            raise CompilationError(f"{where}, which takes a number or a kernel value, but got {described(value)}")
        try:
            return self.semantic.cast(value, param.annotation)
        except CompilationError as error:
            raise CompilationError(f"{where}: {error.message}") from None


def _is_library_helper(function) -> bool:
    """Whether `function` is a `@dsl.jit` helper of the language (fusedops.dsl's own modules), not user code."""
    module = getattr(getattr(function, "fn", None), "__module__", "") or ""
    return module.startswith("fusedops.dsl.")


def _name_loads(tree: ast.AST) -> list:
    loads = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            loads.append((node.id, (node.lineno, node.col_offset)))
        elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
            loads.append((node.target.id, (node.lineno, node.col_offset)))
    return loads


_MISSING = object()


def bind_arguments(callee, args: list, kwargs: dict) -> list:
    """One value per parameter of `callee` from a call's arguments (Python's binding rules)."""
    return bind_parameters(callee.params, args, kwargs, f"`{callee.__name__}`", CompilationError)


@dataclasses.dataclass(frozen=True)
class GeneratedKernel:
    """The frontend's result: the IR and the globals it read (to detect a later rebinding)."""

    function: Function
    used_globals: tuple     # (globals dict, name, object read)

    def globals_unchanged(self) -> bool:
        return all(table.get(name, _MISSING) is obj for table, name, obj in self.used_globals)


def _hints(spec) -> dict:
    """What the compiler may assume of a runtime argument (ir Function.arg_hints): the power of two that
    divides it, and for an int divisible by 8 whether it is positive (a TMA stride must be)."""
    hints = {"divisibility": spec.divisibility} if spec.divisibility > 1 else {}
    if spec.positive:
        hints["positive"] = True
    return hints


def generate(kernel, arg_specs, name: Optional[str] = None) -> GeneratedKernel:
    """The IR of `kernel` (a JITFunction) specialized on `arg_specs` (one `ArgSpec` per parameter).

    Raises:
        CompilationError / UnsupportedError: the kernel is not valid kernel-language code; the error
            carries the file, line, column and source line of the offending construct.
    """
    source = kernel.source
    runtime = [spec for spec in arg_specs if spec.is_runtime]
    body = Block([spec.type for spec in runtime], [spec.name for spec in runtime])
    function = Function(name or kernel.__name__, body, [spec.name for spec in runtime], source.location(None),
                        [_hints(spec) for spec in runtime])
    builder = Builder(body)
    context = CompilationContext(builder, Semantics(builder))
    scope = Scope(source, context.record_global)
    arguments = iter(body.args)
    builder.loc = source.location(None)
    for spec in arg_specs:
        if spec.is_runtime:
            scope.assign(spec.name, next(arguments))
        elif spec.equal_to_one:
            scope.assign(spec.name, context.semantic.constant(1, spec.type or int32))
        else:
            scope.assign(spec.name, spec.value)
    context.call_stack.append(kernel)
    FunctionGenerator(context, source, scope, is_kernel=True).compile_body()
    verify(function)
    return GeneratedKernel(function, tuple(context.used_globals.values()))
