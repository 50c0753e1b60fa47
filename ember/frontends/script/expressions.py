"""Expressions of a scripted function: Python on constants, NumPy semantics on arrays.

Each AST expression type has a method `expr_<Type>`; operators are tables from the AST
operator to the Python operator (constants) and to the ArrayOps emission (arrays).
"""

from __future__ import annotations

import ast
import operator
from typing import Any

import numpy as np

from ember.dtypes import DType
from ember.errors import ScriptNameError, ScriptSyntaxError, ScriptTypeError
from ember.frontends.script.arrays import DynamicSlice
from ember.frontends.script.checks import resolve_global
from ember.frontends.script.exits import IFEXP, UNDEFINED
from ember.frontends.script.function import is_scripted
from ember.frontends.script.library import ATTRIBUTES, BUILTINS, METHODS, NUMPY
from ember.frontends.script.types import ArrayValue, Undefined, describe
from ember.graph.ir import Region, Value

# ast operator: (Python operator, emission on arrays)
BINARY = {
    ast.Add: (operator.add, lambda ops, a, b: ops.binary("add", a, b)),
    ast.Sub: (operator.sub, lambda ops, a, b: ops.binary("sub", a, b)),
    ast.Mult: (operator.mul, lambda ops, a, b: ops.binary("mul", a, b)),
    ast.Div: (operator.truediv, lambda ops, a, b: ops.true_divide(a, b)),
    ast.FloorDiv: (operator.floordiv, lambda ops, a, b: ops.floor_divide(a, b)),
    ast.Mod: (operator.mod, lambda ops, a, b: ops.binary("mod", a, b)),
    ast.Pow: (operator.pow, lambda ops, a, b: ops.binary("pow", a, b)),
    ast.MatMult: (operator.matmul, lambda ops, a, b: ops.matmul(a, b)),
    ast.BitAnd: (operator.and_, lambda ops, a, b: ops.binary("bitwise_and", a, b)),
    ast.BitOr: (operator.or_, lambda ops, a, b: ops.binary("bitwise_or", a, b)),
    ast.BitXor: (operator.xor, lambda ops, a, b: ops.binary("bitwise_xor", a, b)),
    ast.LShift: (operator.lshift, lambda ops, a, b: ops.binary("shl", a, b)),
    ast.RShift: (operator.rshift, lambda ops, a, b: ops.binary("shr", a, b)),
}
COMPARE = {
    ast.Eq: (operator.eq, "eq"), ast.NotEq: (operator.ne, "ne"), ast.Lt: (operator.lt, "lt"),
    ast.LtE: (operator.le, "le"), ast.Gt: (operator.gt, "gt"), ast.GtE: (operator.ge, "ge"),
}
IDENTITY = {ast.Is: operator.is_, ast.IsNot: operator.is_not}


def is_array(x: Any) -> bool:
    return isinstance(x, (ArrayValue, np.ndarray))


class ExpressionEmitter:
    """The expression half of the Emitter (emit.py), which provides frame, ops, error,
    positioned and call."""

    def expr(self, node: ast.expr) -> Any:
        handler = getattr(self, f"expr_{type(node).__name__}", None)
        if handler is None:
            raise self.error(ScriptSyntaxError, node,
                             f"{type(node).__name__} is not supported in a scripted function")
        with self.positioned(node):
            return handler(node)

    def expr_Constant(self, node: ast.Constant) -> Any:
        return node.value

    def expr_Tuple(self, node: ast.Tuple) -> tuple:
        return tuple(self.expr(e) for e in node.elts)

    expr_List = expr_Tuple

    def expr_Name(self, node: ast.Name) -> Any:
        if node.id == UNDEFINED:
            return Undefined(node)
        env = self.frame.env
        if node.id in env.values:
            value = env.values[node.id]
            if isinstance(value, Undefined):
                raise self.error(ScriptNameError, node,
                                 f"`{node.id}` may be undefined here (it is bound only inside"
                                 " a loop or after an early exit)",
                                 ((env.origins.get(node.id), f"`{node.id}` is bound here"),))
            partial = [v.partial for v in flatten(value) if isinstance(v, ArrayValue)
                       and v.partial is not None]
            if partial:
                raise self.error(ScriptNameError, node,
                                 f"`{node.id}` is bound in only one branch of an `if` and may"
                                 " be undefined here: bind it before the `if` or in both"
                                 " branches", ((partial[0], f"`{node.id}` is bound here"),))
            return value
        found, value = resolve_global(self.frame.script.fn, node.id)
        if not found:
            raise self.error(ScriptNameError, node, f"name `{node.id}` is not defined")
        return value

    def expr_BinOp(self, node: ast.BinOp) -> Any:
        return self.binary(node.op, self.expr(node.left), self.expr(node.right), node)

    def binary(self, op: ast.operator, a: Any, b: Any, node: ast.AST) -> Any:
        python_op, array_op = BINARY[type(op)]
        if not (is_array(a) or is_array(b)):
            try:
                return python_op(a, b)
            except Exception as e:
                raise self.error(ScriptTypeError, node, f"{type(e).__name__}: {e}") from None
        with self.positioned(node):
            return array_op(self.ops, a, b)

    def expr_UnaryOp(self, node: ast.UnaryOp) -> Any:
        value = self.expr(node.operand)
        if not is_array(value):
            python_op = {ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Not: operator.not_,
                         ast.Invert: operator.invert}[type(node.op)]
            try:
                return python_op(value)
            except Exception as e:
                raise self.error(ScriptTypeError, node, f"{type(e).__name__}: {e}") from None
        value = self.ops.array(value)
        if isinstance(node.op, ast.USub):
            return self.ops.unary("neg", value)
        if isinstance(node.op, ast.UAdd):
            return value
        if isinstance(node.op, ast.Not):
            return self.ops.logical_not(self.ops.truth(value))
        return self.ops.unary("not" if value.dtype.np.kind == "b" else "bitwise_not", value)

    def logical_not(self, value: Any) -> Any:
        if not is_array(value):
            return not value
        return self.ops.logical_not(self.ops.truth(value))

    def logical_and(self, a: Any, b: Any) -> Any:
        """Python's `and` on truth values; a constant operand decides at compile time."""
        if not is_array(a):
            return b if a else a
        if not is_array(b):
            return self.ops.truth(a) if b else b
        return self.ops.op("and", self.ops.truth(a), self.ops.truth(b))

    def logical_or(self, a: Any, b: Any) -> Any:
        if not is_array(a):
            return a if a else b
        if not is_array(b):
            return True if b else self.ops.truth(a)
        return self.ops.op("or", self.ops.truth(a), self.ops.truth(b))

    def expr_BoolOp(self, node: ast.BoolOp) -> Any:
        combine = self.logical_and if isinstance(node.op, ast.And) else self.logical_or
        result = self.expr(node.values[0])
        for value_node in node.values[1:]:
            if not is_array(result):  # short-circuit as Python does
                if isinstance(node.op, ast.And) and not result:
                    return result
                if isinstance(node.op, ast.Or) and result:
                    return result
            result = combine(result, self.expr(value_node))
        return result

    def expr_Compare(self, node: ast.Compare) -> Any:
        left = self.expr(node.left)
        result: Any = True
        for op, right_node in zip(node.ops, node.comparators):
            right = self.expr(right_node)
            if type(op) in IDENTITY:
                if is_array(left) or is_array(right):
                    if left is not None and right is not None:
                        raise self.error(ScriptTypeError, node, "`is` compares with None only")
                    value = not isinstance(op, ast.Is)
                else:
                    value = IDENTITY[type(op)](left, right)
            elif type(op) in COMPARE:
                python_op, name = COMPARE[type(op)]
                value = self.ops.compare(name, left, right) if is_array(left) or is_array(right) \
                    else python_op(left, right)
            else:
                raise self.error(ScriptSyntaxError, node, "`in` is not supported in a scripted"
                                 " function")
            result = value if len(node.ops) == 1 else self.logical_and(result, value)
            left = right
        return result

    def expr_IfExp(self, node: ast.IfExp) -> Any:
        cond = self.expr(node.test)
        if not is_array(cond):
            return self.expr(node.body if self.constant_truth(cond, node.test) else node.orelse)
        cond = self.ops.truth(cond)
        branches = []
        for branch in (node.body, node.orelse):
            region, env = Region(), self.frame.env.copy()
            with self.in_region(region, env):
                env.bind(IFEXP, self.expr(branch), branch)
            branches.append((region, env))
        self.join_branches(node, cond, [IFEXP], branches, guard=True)
        return self.frame.env.values.pop(IFEXP)

    def expr_Attribute(self, node: ast.Attribute) -> Any:
        base = self.expr(node.value)
        if isinstance(base, np.ndarray):
            base = self.ops.array(base)
        if isinstance(base, ArrayValue):
            if node.attr not in ATTRIBUTES:
                raise self.error(ScriptNameError, node, f"arrays have no attribute"
                                 f" `{node.attr}` in a scripted function")
            return ATTRIBUTES[node.attr](self.ops, base)
        if type(base).__name__ == "module" or isinstance(base, type):
            if not hasattr(base, node.attr):
                raise self.error(ScriptNameError, node, f"`{node.attr}` is not an attribute of"
                                 f" {getattr(base, '__name__', base)}")
            return getattr(base, node.attr)
        raise self.error(ScriptTypeError, node, f"cannot read `.{node.attr}` of {describe(base)}"
                         " in a scripted function")

    def expr_Subscript(self, node: ast.Subscript) -> Any:
        base = self.expr(node.value)
        index = self.index(node.slice)
        if isinstance(base, np.ndarray):
            base = self.ops.array(base)
        if isinstance(base, ArrayValue):
            return self.ops.getitem(base, index)
        if isinstance(base, tuple) and not any(isinstance(i, ArrayValue) for i in flatten(index)):
            try:
                return base[index]
            except (IndexError, TypeError) as e:
                raise self.error(ScriptTypeError, node, str(e)) from None
        raise self.error(ScriptTypeError, node, f"cannot index {describe(base)} with"
                         f" {describe(index)}")

    def index(self, node: ast.expr) -> Any:
        """A subscript's index: ints, slices, None, `...`, arrays. A slice with runtime
        bounds must have a length known now (`x[i:i + 3]`): a DynamicSlice."""
        if isinstance(node, ast.Slice):
            lower, upper, step = [self.expr(b) if b is not None else None
                                  for b in (node.lower, node.upper, node.step)]
            if not any(is_array(b) for b in (lower, upper, step)):
                return slice(lower, upper, step)
            length = static_length(lower, upper) if step in (None, 1) else None
            if length is None:
                raise self.error(ScriptTypeError, node, "a slice with runtime bounds needs a"
                                 " length known when compiling, and step 1: write"
                                 " `x[i:i + n]` with n a Python int")
            return DynamicSlice(self.ops.cast(self.ops.array(lower), DType.i64), length)
        if isinstance(node, ast.Tuple):
            return tuple(self.index(e) for e in node.elts)
        value = self.expr(node)
        if isinstance(value, np.ndarray):
            value = self.ops.array(value)
        return value

    def expr_Call(self, node: ast.Call) -> Any:
        args = [self.expr(a) for a in node.args]
        kwargs = {k.arg: self.expr(k.value) for k in node.keywords}
        if None in kwargs:
            raise self.error(ScriptSyntaxError, node, "`**` arguments are not supported")
        func = node.func
        if isinstance(func, ast.Attribute):
            base = self.expr(func.value)
            if isinstance(base, np.ndarray):
                base = self.ops.array(base)
            if isinstance(base, ArrayValue):
                method = METHODS.get(func.attr)
                if method is None:
                    raise self.error(ScriptNameError, func, f"arrays have no method"
                                     f" `{func.attr}` in a scripted function")
                return method(self.ops, base, args, kwargs)
            target = self.expr(func)
        else:
            target = self.expr(func)
        return self.call_value(target, args, kwargs, node)

    def call_value(self, target: Any, args: list, kwargs: dict, node: ast.Call) -> Any:
        if is_scripted(target):
            return self.call(target.__ember_script__, args, kwargs, node)
        try:
            numpy_handler, builtin = NUMPY.get(target), BUILTINS.get(target)
        except TypeError:
            numpy_handler = builtin = None
        if numpy_handler is not None:
            folded = fold_numpy_call(target, args, kwargs)
            if folded is not None:  # a strong constant, as NumPy's scalars are
                return self.ops.array(folded)
            return numpy_handler(self.ops, args, kwargs)
        if builtin is not None:
            return builtin(self.ops, args, kwargs)
        if target is range:
            raise self.error(ScriptSyntaxError, node, "range() is supported as the iterable of a"
                             " `for` only")
        name = getattr(target, "__name__", type(target).__name__)
        raise self.error(ScriptNameError, node.func, f"cannot call `{name}` in a scripted"
                         " function (only NumPy functions Ember knows, a few builtins and other"
                         " @ember.script functions)")


# NumPy calls on constants run in Python (exactly NumPy's result, a NumPy scalar being a
# strong type) when the result is at most this many elements: larger ones stay ops.
FOLD_LIMIT = 16


def fold_numpy_call(fn: Any, args: list, kwargs: dict) -> Any:
    """fn(*args, **kwargs) computed now when no argument is an array value, else None."""
    if any(isinstance(v, (ArrayValue, Undefined)) for v in flatten((*args, *kwargs.values()))):
        return None
    try:
        result = fn(*args, **kwargs)
    except Exception:
        return None  # the emission raises the positioned error
    if not isinstance(result, (np.ndarray, np.generic)) or np.size(result) > FOLD_LIMIT:
        return None
    return result


def static_length(lower: Any, upper: Any) -> int | None:
    """upper - lower when it is a Python int: upper is `lower + n` (or `n + lower`)."""
    if not (isinstance(lower, ArrayValue) and isinstance(upper, ArrayValue)
            and lower.dtype.np.kind in "iu"):
        return None
    op = upper.value.producer
    if op is None or op.name != "add":
        return None
    for base, offset in (op.operands, reversed(op.operands)):
        if same_value(base, lower.value) and offset.producer is not None \
                and offset.producer.name == "constant" \
                and offset.producer.attrs.get("value") is not None:
            return int(offset.producer.attrs["value"])
    return None


def same_value(a: Value, b: Value, depth: int = 4) -> bool:
    """Whether two IR values surely hold the same number: one value, equal constants, or
    the same pure op on the same values (`2 * i` written twice)."""
    if a is b:
        return True
    pa, pb = a.producer, b.producer
    if depth == 0 or pa is None or pb is None or pa.name != pb.name or pa.regions \
            or len(pa.operands) != len(pb.operands) or a.type != b.type:
        return False
    if pa.name == "constant":
        va, vb = pa.attrs.get("value"), pb.attrs.get("value")
        return va is not None and vb is not None and np.array_equal(va, vb)
    return pa.attrs.keys() == pb.attrs.keys() \
        and all(_same_attr(pa.attrs[k], pb.attrs[k]) for k in pa.attrs) \
        and all(same_value(x, y, depth - 1) for x, y in zip(pa.operands, pb.operands))


def _same_attr(a: Any, b: Any) -> bool:
    return np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b


def flatten(value: Any) -> list[Any]:
    if isinstance(value, tuple):
        return [leaf for v in value for leaf in flatten(v)]
    return [value]

