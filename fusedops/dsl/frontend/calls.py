"""Calls: dsl builtins, methods of block values, other `@dsl.jit` functions (inlined), and the few
Python builtins a kernel may use on compile-time values (min, max, len, isinstance, int, float,
bool, abs, tuple, print)."""

from __future__ import annotations

import ast
import builtins
import inspect

from ..errors import CompilationError, UnsupportedError
from ..ir import Value
from ..language import core, triton_compat
from ..language.dtypes import TRITON_QUERIES, BlockType, DType, PointerType, pointer_type, triton_query
from .expressions import BoundMethod
from .scope import is_jit_function, is_runtime


class CallsMixin:
    def visit_Call(self, node: ast.Call):
        if isinstance(node.func, ast.Attribute):
            with self.located(node.func):
                owner = self.visit(node.func.value)
                if isinstance(owner, (DType, PointerType)) and node.func.attr in TRITON_QUERIES:
                    # Triton's dtype queries, answered at compile time (`x.dtype.is_floating()`, `is_fp16()`, ...)
                    if node.args or node.keywords:
                        raise CompilationError(f"{ast.unparse(node.func)}() takes no arguments")
                    try:
                        return triton_query(owner, node.func.attr)
                    except TypeError as e:
                        raise CompilationError(str(e)) from None
                function = self.attribute(owner, node.func)
        else:
            function = self.visit(node.func)
        args = []
        for argument in node.args:
            if isinstance(argument, ast.Starred):
                value = self.visit(argument.value)
                if is_runtime(value) or not isinstance(value, (tuple, list)):
                    raise CompilationError("only compile-time tuples can be unpacked with `*` in a call")
                args.extend(value)
            else:
                args.append(self.visit(argument))
        kwargs = {}
        for keyword in node.keywords:
            if keyword.arg is None:
                raise UnsupportedError("`**kwargs` in calls is not supported in kernels")
            kwargs[keyword.arg] = self.visit(keyword.value)
        return self.call(function, args, kwargs, ast.unparse(node.func))

    def call(self, function, args: list, kwargs: dict, shown: str):
        """Call `function` (what the callee expression evaluated to) at compile time."""
        if isinstance(function, BoundMethod):
            if is_jit_function(function.function):      # a method written as a @dsl.jit helper (x.reduce(...))
                return self.inline_call(function.function, [function.value] + args, kwargs)
            return self.call_builtin(function.function, [function.value] + args, kwargs, shown)
        if core.is_builtin(function):
            return self.call_builtin(function, args, kwargs, shown)
        if is_jit_function(function):
            return self.inline_call(function, args, kwargs)
        if function is core.constexpr:
            if len(args) != 1 or kwargs:
                raise CompilationError("dsl.constexpr(value) takes one argument")
            if is_runtime(args[0]):
                raise CompilationError("dsl.constexpr() needs a compile-time value, got a runtime value")
            return args[0]
        if function is pointer_type:        # a type built at compile time (for .to(), pointer casts)
            if any(is_runtime(a) for a in [*args, *kwargs.values()]):
                raise CompilationError(f"{shown}() needs compile-time arguments (a dsl dtype, an address space)")
            try:
                return pointer_type(*args, **kwargs)
            except TypeError as e:
                raise CompilationError(f"{shown}(): {e}") from None
        if function is core.static_range or function is builtins.range or function is triton_compat.range:
            raise CompilationError(f"{shown}() can only be used as the iterable of a `for` loop")
        handler = _PYTHON_BUILTINS.get(function) if _hashable(function) else None
        if handler is not None:
            return handler(self, args, kwargs, shown)
        if isinstance(function, (DType, PointerType)):
            raise CompilationError(f"dtypes are not callable; convert with x.to({shown})")
        if isinstance(function, type):
            raise CompilationError(f"`{shown}` is a class; kernels can only call dsl builtins and @dsl.jit functions")
        raise CompilationError(f"`{shown}` is not a @dsl.jit function; kernels can only call dsl builtins and "
                               "other @dsl.jit functions (decorate it with @dsl.jit to call it from a kernel)")

    def call_builtin(self, function, args: list, kwargs: dict, shown: str):
        target = getattr(function, "__wrapped__", function)
        try:
            inspect.signature(target).bind(*args, _semantic=None, **kwargs)
        except TypeError as e:
            raise CompilationError(f"bad arguments to {shown}(): {e}") from None
        args = [a.value if isinstance(a, core.constexpr) else a for a in args]
        kwargs = {k: (v.value if isinstance(v, core.constexpr) else v) for k, v in kwargs.items()}
        return function(*args, _semantic=self.semantic, **kwargs)


def _hashable(obj) -> bool:
    try:
        hash(obj)
    except TypeError:
        return False
    return True


def _compile_time(args, kwargs, shown: str, instead: str = ""):
    values = list(args) + list(kwargs.values())
    if any(is_runtime(v) or (isinstance(v, tuple) and any(is_runtime(x) for x in v)) for v in values):
        hint = f"; {instead}" if instead else ""
        raise CompilationError(f"Python's {shown}() needs compile-time arguments{hint}")


def _python(function, instead: str = ""):
    def handler(generator, args, kwargs, shown):
        _compile_time(args, kwargs, shown, instead)
        try:
            return function(*args, **kwargs)
        except Exception as e:
            raise CompilationError(f"compile-time {shown}() failed: {e}") from None
    return handler


def _len(generator, args, kwargs, shown):
    if len(args) == 1 and isinstance(args[0], Value):
        if not isinstance(args[0].type, BlockType):
            raise CompilationError("len() of a scalar")
        return args[0].type.shape[0]
    return _python(builtins.len)(generator, args, kwargs, shown)


def _isinstance(generator, args, kwargs, shown):
    if len(args) != 2 or kwargs:
        raise CompilationError("isinstance() takes two arguments")
    value, classes = args
    classes = classes if isinstance(classes, tuple) else (classes,)
    if core.constexpr in classes and not is_runtime(value):
        return True
    if is_runtime(value):
        return False
    try:
        return isinstance(value, tuple(c for c in classes if c is not core.constexpr))
    except TypeError as e:
        raise CompilationError(f"isinstance() failed: {e}") from None


def _tuple(generator, args, kwargs, shown):
    if kwargs or len(args) != 1 or is_runtime(args[0]) or not isinstance(args[0], (tuple, list)):
        raise CompilationError(f"{shown}() in a kernel takes one tuple")
    return tuple(args[0])


def _abs(generator, args, kwargs, shown):
    if len(args) == 1 and not kwargs and is_runtime(args[0]):
        return generator.semantic.unary("abs", args[0])
    return _python(builtins.abs)(generator, args, kwargs, shown)


def _print(generator, args, kwargs, shown):
    if kwargs:
        raise CompilationError("print() in a kernel takes no keyword arguments; use dsl.device_print")
    prefix_parts, values = [], []
    for arg in args:
        if isinstance(arg, str) and not values:
            prefix_parts.append(arg)
        else:
            values.append(arg)
    prefix = " ".join(prefix_parts)
    return generator.semantic.device_print(prefix, *values)


def _extremum(function, op: str):
    # min(a, b, ...) / max(a, b, ...) of kernel values: dsl.minimum / dsl.maximum folded left to right (as
    # Triton maps them); compile-time arguments run Python's
    def handler(generator, args, kwargs, shown):
        if len(args) >= 2 and not kwargs and any(is_runtime(a) for a in args):
            result = args[0]
            for arg in args[1:]:
                result = generator.semantic.binary(op, result, arg)
            return result
        return _python(function, f"use dsl.{op}(a, b) on kernel values, or {shown}(a, b, ...) of two or more")(
            generator, args, kwargs, shown)
    return handler


_PYTHON_BUILTINS = {
    builtins.min: _extremum(builtins.min, "minimum"),
    builtins.max: _extremum(builtins.max, "maximum"),
    builtins.int: _python(builtins.int, "convert kernel values with x.to(dsl.int32)"),
    builtins.float: _python(builtins.float, "convert kernel values with x.to(dsl.float32)"),
    builtins.bool: _python(builtins.bool, "compare kernel values with != 0"),
    builtins.tuple: _tuple,
    builtins.list: _tuple,    # kernels have no mutable lists: a tuple stands in
    builtins.len: _len,
    builtins.isinstance: _isinstance,
    builtins.abs: _abs,
    builtins.print: _print,
}
