"""The symbol table of one function being compiled: local names, globals, closure cells, builtins.

A name is bound to an IR `Value` (a runtime scalar or block) or to a Python object: a constexpr
(int, float, bool, str, None, a dsl dtype, a tuple), a module, a builtin, a `@dsl.jit` function.
Python control flow does not open scopes, so `copy()` is used where the compiler needs to compile
code paths separately (the two branches of a runtime `if`, a loop body) and merge them after.
"""

from __future__ import annotations

import builtins
import enum
import types

from ..errors import CompilationError
from ..ir import Value
from ..language import core
from ..language.dtypes import BlockType, DType, PointerType

# Python builtins a kernel may call (on constexprs; see calls.py for what each does).
PYTHON_BUILTINS = {name: getattr(builtins, name) for name in (
    "range", "min", "max", "len", "isinstance", "int", "float", "bool", "abs", "print", "tuple", "list",
)}


def is_jit_function(obj) -> bool:
    return getattr(type(obj), "__dsl_jit__", False) is True


def _is_plain_constant(value) -> bool:
    if value is None or isinstance(value, (bool, int, float, str, DType, PointerType, BlockType, slice)):
        return True
    if isinstance(value, tuple):
        return all(_is_plain_constant(v) for v in value)
    return False


def check_global(name: str, value):
    """What a kernel sees when it reads global `name` bound to `value`.

    Allowed: `dsl.constexpr(...)` globals (seen as their value), plain immutable constants (ints,
    floats, bools, strings, None, dtypes, tuples of those, enum members), modules, dsl builtins,
    `@dsl.jit` functions, Python functions and classes (a call to one is rejected at the call).

    Raises:
        CompilationError: anything else (a tensor, an array, a list, a dict...): a kernel cannot
            capture runtime data, it must be passed as an argument.
    """
    if isinstance(value, core.constexpr):
        return value.value
    if _is_plain_constant(value) or isinstance(value, (types.ModuleType, enum.Enum)) or callable(value):
        return value
    raise CompilationError(
        f"global `{name}` is a {type(value).__module__}.{type(value).__qualname__}; a kernel can only read "
        "constexpr globals (NAME = dsl.constexpr(value)), constants, modules and functions. Pass tensors and "
        "other data as kernel arguments")


class ClassNamespace:
    """A class's own namespace as a used-globals table (the (table, name, object) triples a kernel records
    to see later rebindings, checked by `table.get(name, missing) is object`): `get` reads the class's
    __dict__ and gives ABSENT for a name it does not hold, whatever the default, so that a kernel that
    read an inherited `Sub.NAME` records (Sub, NAME, ABSENT) and sees NAME set on Sub later. Equal and
    hashed by class: one class's reads share one entry."""

    __slots__ = ("cls",)
    ABSENT = object()

    def __init__(self, cls: type):
        self.cls = cls

    def get(self, name: str, default=None):
        return self.cls.__dict__.get(name, ClassNamespace.ABSENT)

    def __eq__(self, other) -> bool:
        return isinstance(other, ClassNamespace) and other.cls is self.cls

    def __hash__(self) -> int:
        return hash(self.cls)


def class_attribute_reads(cls: type, name: str) -> list:
    """The (table, name, object) triples that keep a kernel's read of `cls.NAME` current: the class in
    `cls`'s MRO that defines NAME with its entry, and ABSENT for every class before it (where setting
    NAME later would shadow it). Empty where no class there defines NAME (the metaclass supplies it)."""
    reads = []
    for klass in cls.__mro__:
        namespace = ClassNamespace(klass)
        value = namespace.get(name)
        reads.append((namespace, name, value))
        if value is not ClassNamespace.ABSENT:
            return reads
    return []


def is_callable_instance(value) -> bool:
    """Whether `value` is an object a kernel may read as a global only because it is callable (check_global): an
    instance with `__call__` (a torch.nn.Module, a functools.partial, ...), not a function, class, builtin or
    @dsl.jit function. Its attributes are state like a module's (`instance_attribute_reads`)."""
    return (callable(value) and not isinstance(value, (type, types.FunctionType, types.BuiltinFunctionType,
                                                       types.MethodType))
            and not is_jit_function(value) and not core.is_builtin(value))


class InstanceNamespace:
    """An instance's own namespace (its __dict__) as a used-globals table, as ClassNamespace is a class's: `get`
    gives ClassNamespace.ABSENT for a name it does not hold (or an instance without a __dict__); equal and hashed by
    the instance's identity (its class may compare by value, or be unhashable)."""

    __slots__ = ("obj",)

    def __init__(self, obj):
        self.obj = obj

    def get(self, name: str, default=None):
        namespace = getattr(self.obj, "__dict__", None)
        return namespace.get(name, ClassNamespace.ABSENT) if isinstance(namespace, dict) else ClassNamespace.ABSENT

    def __eq__(self, other) -> bool:
        return isinstance(other, InstanceNamespace) and other.obj is self.obj

    def __hash__(self) -> int:
        return id(self.obj)


def instance_attribute_reads(obj, name: str) -> list:
    """The (table, name, object) triples that keep a kernel's read of `obj.NAME` current, for a callable
    instance (`is_callable_instance`): its own namespace's entry, else ABSENT there (setting NAME on the instance
    later shadows its class's) and the reads of its class's (class_attribute_reads)."""
    namespace = InstanceNamespace(obj)
    value = namespace.get(name)
    reads = [(namespace, name, value)]
    return reads if value is not ClassNamespace.ABSENT else reads + class_attribute_reads(type(obj), name)


class Scope:
    """Local names of one function plus read-only access to its globals and closure.

    `hidden` maps names that are not visible at this point (first defined inside a loop or in
    one branch of a runtime `if`) to the message that explains why.
    """

    def __init__(self, source, on_global=None, names=None, hidden=None, locations=None):
        self.source = source
        self.on_global = on_global
        self.names: dict = dict(names or {})
        self.hidden: dict = dict(hidden or {})
        self.locations: dict = dict(locations or {})   # name -> Location of its last assignment

    def copy(self) -> "Scope":
        return Scope(self.source, self.on_global, self.names, self.hidden, self.locations)

    def defines(self, name: str) -> bool:
        return name in self.names

    def assign(self, name: str, value, loc=None) -> None:
        if isinstance(value, core.constexpr):
            value = value.value
        self.names[name] = value
        self.hidden.pop(name, None)
        if loc is not None:
            self.locations[name] = loc

    def hide(self, name: str, reason: str) -> None:
        self.names.pop(name, None)
        self.hidden[name] = reason

    def lookup(self, name: str):
        """The value of `name`: locals, then closure, globals and Python builtins.

        Raises:
            CompilationError: the name is not defined, or not visible here, or a global that a
                kernel cannot read.
        """
        if name in self.names:
            return self.names[name]
        if name in self.hidden:
            raise CompilationError(self.hidden[name])
        for table in (self.source.closure, self.source.globals):
            if name in table:
                raw = table[name]
                value = check_global(name, raw)
                if self.on_global is not None and not isinstance(raw, types.FunctionType):
                    self.on_global(table, name, raw)
                return value
        if name in PYTHON_BUILTINS:
            return PYTHON_BUILTINS[name]
        if hasattr(builtins, name):
            raise CompilationError(f"Python's builtin `{name}` cannot be used in a kernel (the builtins a kernel "
                                   f"may call: {', '.join(PYTHON_BUILTINS)})")
        raise CompilationError(f"name `{name}` is not defined")


def is_runtime(value) -> bool:
    """True for IR values (runtime scalars and blocks), False for compile-time Python objects."""
    return isinstance(value, Value)
