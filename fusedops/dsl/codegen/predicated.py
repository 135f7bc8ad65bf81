"""Predicated global loads and stores as inline PTX (`@p ld.global.v4.b32` / `@p st.global...`).

A masked vector access written as a branch around a load serializes the loads behind the branches;
a predicated instruction lets every load of a thread issue back to back, which is what keeps enough
bytes in flight to reach DRAM bandwidth. A group of `width` elements moves as 32-bit words (or one
16/8-bit value for 2/1-byte groups); the destination registers start as the `other` values, so a
masked-off load leaves them (PTX ISA, "ld" and predicated execution).
"""

from __future__ import annotations

from llvmlite import ir

from ..target import llvm_types as T


def _word_layout(nbytes: int):
    """(word LLVM type, word count, PTX type suffix, constraint letter) for a group of `nbytes`."""
    if nbytes >= 4:
        return T.i32, nbytes // 4, "b32", "r"
    if nbytes == 2:
        return T.i16, 1, "b16", "h"
    return T.i16, 1, "u8", "h"


def _vector_prefix(count: int) -> str:
    return {1: "", 2: ".v2", 4: ".v4"}[count]


def _to_words(b, vector, nbytes: int):
    word, count, _, _ = _word_layout(nbytes)
    if nbytes == 1:
        byte = b.extract_element(b.bitcast(vector, ir.VectorType(T.i8, 1)), ir.Constant(T.i32, 0))
        return [b.zext(byte, T.i16)]
    words = b.bitcast(vector, ir.VectorType(word, count))
    return [b.extract_element(words, ir.Constant(T.i32, i)) for i in range(count)]


def _from_words(b, words, vector_type, nbytes: int):
    word, count, _, _ = _word_layout(nbytes)
    if nbytes == 1:
        byte = b.trunc(words[0], T.i8)
        packed = b.insert_element(ir.Constant(ir.VectorType(T.i8, 1), None), byte, ir.Constant(T.i32, 0))
        return b.bitcast(packed, vector_type)
    packed = ir.Constant(ir.VectorType(word, count), None)
    for i, w in enumerate(words):
        packed = b.insert_element(packed, w, ir.Constant(T.i32, i))
    return b.bitcast(packed, vector_type)


def predicated_load(b, pointer, predicate, passthru, vector_type, nbytes: int, hint=None):
    """`vector_type` value loaded from `pointer` where `predicate` (i1) holds, else `passthru`;
    hint: a cache_hints.CacheHint or None."""
    word, count, suffix, letter = _word_layout(nbytes)
    outputs = ", ".join(f"${i}" for i in range(count))
    destination = outputs if count == 1 else "{" + outputs + "}"
    qualifiers, policy = _qualifiers(hint, 2 * count + 2)
    asm = f"@${count + 1} ld.global{qualifiers}{_vector_prefix(count)}.{suffix} {destination}, [${count}]{policy};"
    constraints = ",".join([f"={letter}"] * count + ["l", "b"] + [str(i) for i in range(count)])
    args = [pointer, predicate] + _to_words(b, passthru, nbytes)
    constraints, args = _with_policy(hint, constraints, args)
    return_type = word if count == 1 else ir.LiteralStructType([word] * count)
    call = T.inline_asm(b, asm, constraints, args, return_type)
    words = [call] if count == 1 else [b.extract_value(call, i) for i in range(count)]
    return _from_words(b, words, vector_type, nbytes)


def predicated_store(b, pointer, predicate, vector, nbytes: int, hint=None):
    """Store `vector` to `pointer` where `predicate` (i1) holds; hint: a cache_hints.CacheHint or None."""
    _, count, suffix, letter = _word_layout(nbytes)
    values = ", ".join(f"${i + 1}" for i in range(count))
    source = values if count == 1 else "{" + values + "}"
    qualifiers, policy = _qualifiers(hint, count + 2)
    asm = f"@${count + 1} st.global{qualifiers}{_vector_prefix(count)}.{suffix} [$0], {source}{policy};"
    constraints = ",".join(["l"] + [letter] * count + ["b"])
    args = [pointer] + _to_words(b, vector, nbytes) + [predicate]
    constraints, args = _with_policy(hint, constraints, args)
    T.inline_asm(b, asm, constraints, args)


def _qualifiers(hint, policy_operand: int) -> tuple:
    """(the qualifiers after `ld.global` / `st.global`, the `, $n` cache-policy operand or "")."""
    if hint is None:
        return "", ""
    return hint.qualifiers, "" if hint.policy is None else f", ${policy_operand}"


def _with_policy(hint, constraints: str, args: list) -> tuple:
    if hint is None or hint.policy is None:
        return constraints, args
    return constraints + ",l", args + [hint.policy]
