"""Stable text form of the block IR, used by golden tests and `kernel.asm["ir"]`.

    kernel add(%x_ptr: ptr<float32>, %n: int32) {
      %0 = program_id {axis=0} : int32
      %1 = for %a, %b, %c iter(%d) {
      ^(%2: int32, %3: float32):
        yield %3
      } : float32
    }
"""

from __future__ import annotations

import math

from .core import Block, Function, Operation, Value


class _Namer:
    def __init__(self):
        self._names: dict[int, str] = {}
        self._counter = 0

    def define(self, value: Value) -> str:
        if value.name and value.owner is not None and not isinstance(value.owner, Operation) \
                and value.name not in self._names.values():
            name = value.name
        else:
            name = str(self._counter)
            self._counter += 1
        self._names[id(value)] = name
        return "%" + name

    def use(self, value: Value) -> str:
        return "%" + self._names.get(id(value), "<undefined>")


def _format_attr(value) -> str:
    if isinstance(value, float):
        if math.isnan(value) and math.copysign(1.0, value) < 0:
            return "-nan"   # repr() drops a NaN's sign, and the printed IR is the disk cache key
        return repr(value)
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(_format_attr(v) for v in value) + "]"
    if isinstance(value, str):
        return '"' + value + '"'
    return str(value)


def _print_block(block: Block, namer: _Namer, indent: str, lines: list, header: bool) -> None:
    if header:
        args = ", ".join(f"{namer.define(a)}: {a.type}" for a in block.args)
        lines.append(f"{indent[:-2]}^({args}):")
    for op in block.ops:
        _print_op(op, namer, indent, lines)


def _print_op(op: Operation, namer: _Namer, indent: str, lines: list) -> None:
    operands = ", ".join(namer.use(v) for v in op.operands)
    attrs = ""
    if op.attrs:
        attrs = " {" + ", ".join(f"{k}={_format_attr(v)}" for k, v in sorted(op.attrs.items())) + "}"
    results = [namer.define(r) for r in op.results]
    lhs = (", ".join(results) + " = ") if results else ""
    types = (" : " + ", ".join(str(r.type) for r in op.results)) if op.results else ""
    head = f"{indent}{lhs}{op.opcode.value}{(' ' + operands) if operands else ''}{attrs}"
    if not op.regions:
        lines.append(head + types)
        return
    lines.append(head + " {")
    for i, region in enumerate(op.regions):
        if i:
            lines.append(indent + "} {")
        _print_block(region, namer, indent + "  ", lines, header=True)
    lines.append(indent + "}" + types)


def print_function(function: Function) -> str:
    namer = _Namer()
    args = ", ".join(f"{namer.define(a)}: {a.type}" for a in function.args)
    lines = [f"kernel {function.name}({args}) {{"]
    _print_block(function.body, namer, "  ", lines, header=False)
    lines.append("}")
    return "\n".join(lines) + "\n"
