"""The abstract interpreter: runs a scripted function's AST on compile-time values and
emits graph IR for what depends on arrays.

Python constants compute in Python (so a branch on an int argument folds and a loop over
constant state unrolls); array values emit ops. A name is rebound, never mutated (SSA by
renaming). An `if` on an array condition becomes an `if` op yielding the names both
branches may bind that are live after it; a loop becomes a `loop` op carrying the names
its body binds that are live at its head (see liveness.py). Loops are in loops.py,
expressions in expressions.py, values and their joins in types.py and joins.py.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from ember.errors import (
    EmberError,
    ScriptError,
    ScriptInternalError,
    ScriptSyntaxError,
    ScriptTypeError,
)
from ember.frontends.script.arrays import ArrayOps, ScriptOpError
from ember.frontends.script.exits import describe_name
from ember.frontends.script.expressions import ExpressionEmitter
from ember.frontends.script.function import ScriptedFunction
from ember.frontends.script.joins import Mismatch, coerce, join, rebuild, tensor_leaves, tree_of
from ember.frontends.script.liveness import bound_names
from ember.frontends.script.loops import LoopEmitter
from ember.frontends.script.source import FunctionSource
from ember.frontends.script.types import ArrayValue, Env, RuntimeInput, Undefined
from ember.graph.builder import Builder
from ember.graph.ir import Region

MAX_INLINE_DEPTH = 32


@dataclass
class Frame:
    script: ScriptedFunction
    env: Env
    result: Any = None
    returned: bool = False


class Emitter(LoopEmitter, ExpressionEmitter):
    def __init__(self, builder: Builder):
        self.builder = builder
        self.ops = ArrayOps(builder)
        self.frame: Frame | None = None
        self.depth = 0

    # -- positions ---------------------------------------------------------------------------
    @property
    def source(self) -> FunctionSource:
        return self.frame.script.source

    def error(self, cls: type[ScriptError], node: ast.AST, message: str,
              notes: tuple = ()) -> ScriptError:
        return self.source.error(cls, node, message, notes)

    # -- functions ---------------------------------------------------------------------------
    def call(self, script: ScriptedFunction, args: list[Any], kwargs: dict[str, Any],
             node: ast.AST | None = None) -> Any:
        """Emit `script` inline on argument values; its return value."""
        try:
            bound = script.signature.bind(*args, **kwargs)
        except TypeError as e:
            raise ScriptOpError(f"{script.name}(): {e}") from None
        bound.apply_defaults()
        if self.depth >= MAX_INLINE_DEPTH:
            raise ScriptOpError(f"calls nest deeper than {MAX_INLINE_DEPTH} (is {script.name}"
                                " recursive? scripted functions are inlined)")
        env = Env()
        for name, value in bound.arguments.items():
            env.bind(name, mark_argument(value, name), script.source.tree)
        caller, self.frame = self.frame, Frame(script, env)
        self.depth += 1
        try:
            self.block(script.source.tree.body)
            return self.frame.result
        except ScriptError as e:
            if node is None or caller is None:
                raise
            raise with_note(e, caller.script.source, node, f"in this call of {script.name}") \
                from None
        finally:
            self.frame, self.depth = caller, self.depth - 1

    # -- statements --------------------------------------------------------------------------
    def block(self, stmts: list[ast.stmt]) -> None:
        for stmt in stmts:
            if self.frame.returned:
                return
            try:
                getattr(self, f"stmt_{type(stmt).__name__}")(stmt)
            except EmberError:
                raise
            except Exception as e:  # a bug of this frontend: say so, and where
                raise self.error(ScriptInternalError, stmt, "internal error of @ember.script"
                                 f" ({type(e).__name__}: {e}); please report it with this"
                                 " function") from e

    def stmt_Pass(self, node: ast.Pass) -> None:
        pass

    def stmt_Expr(self, node: ast.Expr) -> None:
        if not isinstance(node.value, ast.Constant):  # (a docstring)
            self.expr(node.value)

    def stmt_Return(self, node: ast.Return) -> None:
        self.frame.result = self.expr(node.value) if node.value is not None else None
        self.frame.returned = True

    def stmt_Assign(self, node: ast.Assign) -> None:
        value = self.expr(node.value)
        for target in node.targets:
            self.assign(target, value, node)

    def stmt_AnnAssign(self, node: ast.AnnAssign) -> None:
        self.assign(node.target, self.expr(node.value), node)

    def stmt_AugAssign(self, node: ast.AugAssign) -> None:
        current = self.expr(_as_load(node.target))
        if isinstance(node.target, ast.Name):  # (`x[i] += v` is a setitem: assign checks it)
            name, symbol = node.target.id, _symbol(node.op)
            self.check_in_place(name, current, node,
                                f"`{name} {symbol}= ...` updates `{name}` in place in NumPy",
                                f"write `{name} = {name} {symbol} ...`")
        value = self.binary(node.op, current, self.expr(node.value), node)
        self.assign(node.target, value, node)

    def check_in_place(self, name: str, value: Any, stmt: ast.AST, what: str,
                       fix: str) -> None:
        """Refuse an in-place update that NumPy would make visible through another name (an
        argument, or a live name bound to the same array); the graph only rebinds `name`."""
        if not isinstance(value, ArrayValue) or value.weak or value.shape == ():
            return  # Python numbers and NumPy scalars are immutable
        env = self.frame.env
        at = stmt.targets[0] if isinstance(stmt, ast.Assign) else stmt.target
        if value.argument is not None:
            notes = () if name == value.argument else \
                ((env.origins.get(name), f"`{name}` is bound to `{value.argument}` here"),)
            raise self.error(ScriptTypeError, at, f"{what}, which would change the caller's"
                             f" array `{value.argument}`: {fix}", notes)
        live = getattr(stmt, "ember_live_out", set())
        for other, bound in env.values.items():
            if other != name and other in live and isinstance(bound, ArrayValue) \
                    and bound.value is value.value:
                raise self.error(ScriptTypeError, at, f"{what}, and `{other}` is the same"
                                 f" array, which would change too: {fix}",
                                 ((env.origins.get(other), f"`{other}` is bound here"),))

    def assign(self, target: ast.expr, value: Any, stmt: ast.AST) -> None:
        env = self.frame.env
        if isinstance(target, ast.Name):
            env.bind(target.id, rebind(value, stmt), stmt)
        elif isinstance(target, (ast.Tuple, ast.List)):
            items = self.unpack(value, len(target.elts), target)
            for item, value_item in zip(target.elts, items):
                self.assign(item, value_item, stmt)
        elif isinstance(target, ast.Subscript):
            name = target.value.id
            base = self.expr(target.value)
            if not isinstance(base, ArrayValue):
                raise self.error(ScriptTypeError, target, f"cannot assign into `{name}`, a"
                                 f" {type(base).__name__}: only arrays support `x[i] = v`")
            self.check_in_place(name, base, stmt, f"`{ast.unparse(target)} = ...` writes into"
                                f" `{name}`", f"copy it first (`{name} = {name}.copy()`)")
            index = self.index(target.slice)
            with self.positioned(target):
                updated = self.ops.setitem(base, index, value)
            env.bind(name, rebind(updated, stmt), stmt)

    def unpack(self, value: Any, count: int, node: ast.AST) -> list[Any]:
        if isinstance(value, ArrayValue) and value.shape and value.shape[0] == count:
            with self.positioned(node):
                return [self.ops.getitem(value, k) for k in range(count)]
        if not isinstance(value, tuple) or len(value) != count:
            got = f"{len(value)} values" if isinstance(value, tuple) else \
                f"a {type(value).__name__}"
            raise self.error(ScriptTypeError, node, f"cannot unpack {got} into {count} names")
        return list(value)

    # -- if ----------------------------------------------------------------------------------
    def stmt_If(self, node: ast.If) -> None:
        cond = self.expr(node.test)
        if not isinstance(cond, ArrayValue):
            self.block(node.body if self.constant_truth(cond, node.test) else node.orelse)
            return
        with self.positioned(node.test):
            cond = self.ops.truth(cond)
        names = sorted((bound_names(node.body) | bound_names(node.orelse))
                       & node.ember_live_out)
        env = self.frame.env
        branches = []
        for block in (node.body, node.orelse):
            region, branch_env = Region(), env.copy()
            with self.in_region(region, branch_env):
                self.block(block)
            branches.append((region, branch_env))
        guard = getattr(node, "ember_guard", False)
        self.join_branches(node, cond, names, branches, guard)

    def join_branches(self, node: ast.AST, cond: ArrayValue, names: list[str],
                      branches: list[tuple[Region, Env]], guard: bool) -> None:
        """Emit the `if` op of two filled branches, yielding `names` joined."""
        env = self.frame.env
        live = getattr(node, "ember_live_out", set())
        trees = {}
        for name in names:
            (_, then_env), (_, else_env) = branches
            then_value = then_env.values.get(name, Undefined())
            else_value = else_env.values.get(name, Undefined())
            try:
                trees[name] = join(tree_of(then_value), tree_of(else_value))
            except Mismatch as e:
                a, b = e.args[:2]
                raise self.error(
                    ScriptTypeError, node, f"{describe_name(name)} is {a} after the then branch"
                    f" but {b} after the else branch: both must have one type",
                    ((then_env.origins.get(name), f"{describe_name(name)} is {a} here"),
                     (else_env.origins.get(name), f"{describe_name(name)} is {b} here"))) \
                    from None
        for region, branch_env in branches:
            ops = ArrayOps(self.builder.region_builder(region))
            region.outputs = [leaf.value for name in names
                              for leaf in coerce(ops, branch_env.values.get(name, Undefined()),
                                                 trees[name])]
        if not names:
            return  # nothing flows out: graph ops have no effects, so the `if` is dead
        op = self.builder.op("if", [cond.value], {}, [r for r, _ in branches])
        results = [ArrayValue(v, weak=weak)
                   for v, (_, weak) in zip(op.results, [leaf for n in names
                                                        for leaf in tensor_leaves(trees[n])])]
        for name in names:
            value = rebuild(trees[name], results)
            one_sided = [e for _, e in branches if (name not in e.values
                         or isinstance(e.values[name], Undefined)) and not exits(e, live)]
            if one_sided and not guard and not name.startswith("$") \
                    and isinstance(value, ArrayValue) and name not in env.values:
                defined = next(e for _, e in branches if e not in one_sided)
                value.partial = defined.origins.get(name)
            origin = next((e.origins[name] for _, e in branches if name in e.origins), node)
            env.bind(name, value, origin)

    # -- helpers -----------------------------------------------------------------------------
    @contextmanager
    def in_region(self, region: Region, env: Env) -> Iterator[None]:
        saved = self.builder, self.ops, self.frame.env
        self.builder = self.builder.region_builder(region)
        self.ops = ArrayOps(self.builder)
        self.frame.env = env
        try:
            yield
        finally:
            self.builder, self.ops, self.frame.env = saved

    @contextmanager
    def positioned(self, node: ast.AST) -> Iterator[None]:
        """ScriptOpErrors raised inside become ScriptTypeErrors at `node`."""
        try:
            yield
        except ScriptOpError as e:
            raise self.error(ScriptTypeError, node, str(e)) from None

    def constant_truth(self, value: Any, node: ast.AST) -> bool:
        try:
            return bool(value)
        except Exception as e:
            raise self.error(ScriptTypeError, node, f"cannot use this as a condition: {e}") \
                from None


def exits(env: Env, live: set[str]) -> bool:
    """Whether a branch ended by an early exit: it set a flag that is read later (a flag of
    an inner loop that finished is dead by then)."""
    return any(name.startswith("$") and name in live and value is True
               for name, value in env.values.items())


def with_note(error: ScriptError, source: FunctionSource, node: ast.AST,
              message: str) -> ScriptError:
    """`error` with a note at `node` (a call site, in another function's source)."""
    line, column, end = source.span(node)
    error.notes = (*error.notes, (message, line, column, end, source.source_line(line),
                                  source.file))
    error.args = (error.render(),)
    return error


def rebind(value: Any, origin: ast.AST) -> Any:
    """`value` as bound by the statement `origin` (a new binding of the same IR value)."""
    if isinstance(value, tuple):
        return tuple(rebind(v, origin) for v in value)
    if isinstance(value, ArrayValue):
        return ArrayValue(value.value, value.weak, origin, value.argument, value.partial)
    return value


def mark_argument(value: Any, name: str) -> Any:
    if isinstance(value, tuple):
        return tuple(mark_argument(v, name) for v in value)
    if isinstance(value, ArrayValue):
        return ArrayValue(value.value, value.weak, value.origin, name)
    return value


def _symbol(op: ast.operator) -> str:
    return ast.unparse(ast.BinOp(ast.Name("a"), op, ast.Name("b")))[2:-2]


def _as_load(target: ast.expr) -> ast.expr:
    """The expression reading what `target` (of an augmented assignment) names."""
    copy = ast.parse(ast.unparse(target), mode="eval").body
    for a, b in zip(ast.walk(copy), ast.walk(target)):
        ast.copy_location(a, b)
    return copy


def emit_function(script: ScriptedFunction, params: dict[str, Any], name: str | None = None):
    """The graph of `script` specialized on `params` (name -> a Python constant, a
    RuntimeInput, or a tuple of these) and the shape tree of its return value."""
    builder = Builder(name or script.name)
    values = {}

    def bind(value: Any, path: str) -> Any:
        if isinstance(value, RuntimeInput):
            return ArrayValue(builder.input(path, value.dtype, value.shape), weak=value.weak)
        if isinstance(value, tuple):
            return tuple(bind(v, f"{path}_{k}") for k, v in enumerate(value))
        return value

    for param, value in params.items():
        values[param] = bind(value, param)
    emitter = Emitter(builder)
    caller = Frame(script, Env())
    emitter.frame = caller
    try:
        result = emitter.call(script, [], values)
    except ScriptOpError as e:  # raised outside any positioned expression
        raise script.source.error(ScriptTypeError, script.source.tree, str(e),
                                  length=len("def")) from None
    tree = tree_of(result)
    leaves = flatten_arrays(result)
    if tree_has(tree, "undef"):
        raise script.source.error(ScriptSyntaxError, script.source.tree,
                                  f"`{script.name}` may return an undefined value",
                                  length=len("def"))
    builder.output(*(v.value for v in leaves))
    return builder.build(), tree


def flatten_arrays(value: Any) -> list[ArrayValue]:
    if isinstance(value, tuple):
        return [leaf for v in value for leaf in flatten_arrays(v)]
    return [value] if isinstance(value, ArrayValue) else []


def tree_has(tree: tuple, kind: str) -> bool:
    if tree[0] == "tuple":
        return any(tree_has(t, kind) for t in tree[1])
    return tree[0] == kind

