"""Joining the values a name has where control flow meets: after an `if`, around a loop.

A value's *shape tree* says what must agree: ("tuple", children), ("const", v) for a Python
constant that both sides share, ("tensor", TensorType, weak) for an IR value, ("undef",)
for no value. Two trees join when their structure agrees, their shapes are equal, and their
dtypes are equal up to weak scalars (a weak `0.0` joins a float32 array as float32). What
does not join raises `Mismatch`, which the emitter turns into an error naming the variable.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ember.frontends.script.arrays import ArrayOps
from ember.frontends.script.types import (
    ArrayValue,
    Undefined,
    describe_type,
    is_python_scalar,
    promote,
    python_dtype,
)
from ember.graph.ir import TensorType

Tree = tuple


class Mismatch(Exception):
    """Two values that cannot share one variable: (description a, description b, tree a,
    tree b)."""


def tree_of(value: Any) -> Tree:
    if isinstance(value, tuple):
        return ("tuple", tuple(tree_of(v) for v in value))
    if isinstance(value, ArrayValue):
        return ("tensor", value.type, value.weak)
    if isinstance(value, Undefined):
        return ("undef",)
    return ("const", value)


def describe_tree(tree: Tree) -> str:
    kind = tree[0]
    if kind == "tuple":
        return "(" + ", ".join(describe_tree(t) for t in tree[1]) + ")"
    if kind == "tensor":
        return describe_type(tree[1], tree[2])
    if kind == "undef":
        return "undefined"
    return f"{type(tree[1]).__name__} {tree[1]!r}"


def is_scalar(tree: Tree) -> bool:
    return tree[0] == "const" or (tree[0] == "tensor" and tree[1].shape == ())


def _as_tensor(tree: Tree) -> Tree | None:
    if tree[0] == "tensor":
        return tree
    if tree[0] == "const" and is_python_scalar(tree[1]):
        return ("tensor", TensorType(python_dtype(tree[1]), ()), True)
    return None


def join(a: Tree, b: Tree) -> Tree:
    """The tree both `a` and `b` fit, or Mismatch."""
    if a[0] == "undef":
        return b
    if b[0] == "undef":
        return a
    if a[0] == "tuple" or b[0] == "tuple":
        if a[0] != b[0] or len(a[1]) != len(b[1]):
            raise Mismatch(describe_tree(a), describe_tree(b), a, b)
        return ("tuple", tuple(join(x, y) for x, y in zip(a[1], b[1])))
    if a[0] == b[0] == "const" and type(a[1]) is type(b[1]) and a[1] == b[1]:
        return a
    ta, tb = _as_tensor(a), _as_tensor(b)
    if ta is None or tb is None:
        raise Mismatch(describe_tree(a), describe_tree(b), a, b)
    (_, type_a, weak_a), (_, type_b, weak_b) = ta, tb
    if type_a.shape != type_b.shape:
        raise Mismatch(describe_tree(a), describe_tree(b), a, b)
    if type_a.dtype is type_b.dtype:
        return ("tensor", type_a, weak_a and weak_b)
    dtype, weak = promote((type_a.dtype, weak_a), (type_b.dtype, weak_b))
    strong = [t.dtype for t, w in ((type_a, weak_a), (type_b, weak_b)) if not w]
    if strong and dtype is not strong[0]:  # a weak value would change a strong dtype
        raise Mismatch(describe_tree(a), describe_tree(b), a, b)
    return ("tensor", type_a.with_dtype(dtype), weak)


def tensor_leaves(tree: Tree) -> list[tuple[TensorType, bool]]:
    if tree[0] == "tuple":
        return [leaf for t in tree[1] for leaf in tensor_leaves(t)]
    return [(tree[1], tree[2])] if tree[0] == "tensor" else []


def coerce(ops: ArrayOps, value: Any, tree: Tree) -> list[ArrayValue]:
    """The tensor leaves of `value` made to fit `tree`, emitted by `ops`: casts, constants
    made tensors, zeros for an undefined value."""
    kind = tree[0]
    if kind == "tuple":
        parts = value if isinstance(value, tuple) else (Undefined(),) * len(tree[1])
        return [leaf for v, t in zip(parts, tree[1]) for leaf in coerce(ops, v, t)]
    if kind != "tensor":
        return []
    _, t, weak = tree
    if isinstance(value, Undefined):
        return [ops.broadcast_to(ops.constant(np.zeros((), t.dtype.np)), t.shape)]
    array = ops.array(value)
    return [ArrayValue(ops.cast(array, t.dtype).value, weak=weak)]


def rebuild(tree: Tree, leaves: list[ArrayValue], fallback: Any = None) -> Any:
    """The value of shape `tree` whose tensor leaves are `leaves`, consumed in order."""
    kind = tree[0]
    if kind == "tuple":
        return tuple(rebuild(t, leaves) for t in tree[1])
    if kind == "tensor":
        return leaves.pop(0)
    if kind == "undef":
        return Undefined()
    return tree[1]

