"""Loops: `for i in range(...)` and `while`, run at compile time or emitted as `loop` ops.

A loop whose state stays Python constants runs at compile time (up to UNROLL_BUDGET
iterations; a trial iteration in a scratch region tells). Otherwise the loop becomes one
`loop` op carrying `ember_carried` (liveness.py); its body is emitted until the carried
types settle (a weak scalar joining a float32 array makes a second pass), and a carried
value whose shape or dtype changes is an error naming it. The loop stops when a flag of
`ember_stop` (exits.py) is set.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from typing import Any

import numpy as np

from ember.dtypes import DType
from ember.errors import ScriptTypeError
from ember.frontends.script.arrays import ArrayOps
from ember.frontends.script.exits import describe_name
from ember.frontends.script.joins import (
    Mismatch,
    coerce,
    is_scalar,
    join,
    rebuild,
    tensor_leaves,
    tree_of,
)
from ember.frontends.script.types import ArrayValue, Env, Undefined
from ember.graph.ir import Region, TensorType

# Iterations of a loop over Python-constant state run at compile time before the rest
# becomes a loop op (unrolling long loops costs compile time: JAX #2777).
UNROLL_BUDGET = 64
# Passes over a loop body to find the types its carried values settle on.
MAX_TYPE_PASSES = 3
I64_MAX = np.iinfo(np.int64).max


class LoopEmitter:
    """The loop half of the Emitter (emit.py), which provides frame, ops, builder, block,
    expr, error, positioned, in_region and the logical helpers."""

    def stmt_For(self, node: ast.For) -> None:
        args = [self.expr(a) for a in node.iter.args]
        start, stop, step = (0, args[0], 1) if len(args) == 1 else \
            (args[0], args[1], args[2] if len(args) == 3 else 1)
        if not isinstance(step, int) or isinstance(step, bool) or step == 0:
            raise self.error(ScriptTypeError, node.iter, "the step of a scripted range must be"
                             " a nonzero Python int (a constant)")
        for bound in (start, stop):
            if not (isinstance(bound, int) or (isinstance(bound, ArrayValue)
                                               and bound.shape == ()
                                               and bound.dtype.np.kind in "iu")):
                raise self.error(ScriptTypeError, node.iter, "range bounds must be integers")
        if isinstance(start, int) and isinstance(stop, int):
            trip = len(range(start, stop, step))
            done = self.unroll(node, lambda k: (k < trip, start + k * step))
            if done is None:
                return
            start, trip = start + done * step, trip - done
            trip_value = self.ops.index(trip)
        else:
            with self.positioned(node.iter):
                trip_value = self.trip_count(start, stop, step)
        self.emit_loop(node, trip_value, start, step)

    def trip_count(self, start: Any, stop: Any, step: int) -> ArrayValue:
        """max(0, ceil((stop - start) / step)) as an i64 scalar."""
        ops = self.ops
        start, stop = (ops.cast(ops.array(v), DType.i64) for v in (start, stop))
        span = ops.op("sub", stop, start) if step > 0 else ops.op("sub", start, stop)
        size = abs(step)
        count = ops.op("div", ops.op("add", span, ops.index(size - 1)), ops.index(size))
        return ops.op("max", count, ops.index(0))

    def stmt_While(self, node: ast.While) -> None:
        def more(k: int) -> tuple[bool | None, None]:
            test = self.expr(node.test)
            if isinstance(test, ArrayValue):
                return None, None
            return self.constant_truth(test, node.test), None

        if self.unroll(node, more) is None:
            return
        self.emit_loop(node, self.ops.index(I64_MAX), None, None)

    def unroll(self, node: ast.For | ast.While, more: Callable[[int], tuple]) -> int | None:
        """Run iterations at compile time while the loop's state stays Python constants;
        None when the loop ran to its end, else the count run before a loop op is needed."""
        env = self.frame.env
        for k in range(UNROLL_BUDGET + 1):
            go, iv = more(k)
            stops = [env.values.get(f, False) for f in node.ember_stop]
            if go is None or any(isinstance(s, ArrayValue) for s in stops):
                return k
            if not go or any(stops):
                return None
            if k == UNROLL_BUDGET:
                return k
            trial = env.copy()
            if isinstance(node, ast.For):
                trial.bind(node.target.id, iv, node)
            with self.in_region(Region(), trial):
                self.block(node.body)
            carried = [trial.values.get(n) for n in node.ember_carried]
            if not all(is_constant(v) for v in carried):
                return k
            env.values.update(trial.values)
            env.origins.update(trial.origins)
        return UNROLL_BUDGET

    def emit_loop(self, node: ast.For | ast.While, trip: ArrayValue, start: Any,
                  step: int | None) -> None:
        env = self.frame.env
        names = list(node.ember_carried)
        if not names:
            return  # nothing flows out: graph ops have no effects, so the loop is dead
        entry = {n: env.values.get(n, Undefined()) for n in names}
        trees = {n: tree_of(v) for n, v in entry.items()}
        for _ in range(MAX_TYPE_PASSES):
            region, body_env, outs = self.loop_body(node, trees, start, step)
            new_trees = {}
            for name in names:
                try:
                    new_trees[name] = join(trees[name], tree_of(outs[name]))
                except Mismatch as e:
                    self.loop_type_error(node, name, e, env, body_env)
            if new_trees == trees:
                break
            trees = new_trees
        else:
            raise self.error(ScriptTypeError, node, "the loop's carried values do not settle"
                             " on fixed types")
        body_ops = ArrayOps(self.builder.region_builder(region))
        with self.in_region(region, body_env):
            cond = self.loop_condition(node, body_env)
        carried_outs = [leaf.value for n in names
                        for leaf in coerce(body_ops, outs[n], trees[n])]
        region.outputs = [cond.value, *carried_outs]
        initial = [leaf.value for n in names for leaf in coerce(self.ops, entry[n], trees[n])]
        cond0 = self.loop_condition(node, env)
        op = self.builder.op("loop", [trip.value, cond0.value, *initial], {}, [region])
        weak = [w for n in names for _, w in tensor_leaves(trees[n])]
        results = [ArrayValue(v, weak=w) for v, w in zip(op.results, weak)]
        for name in names:
            env.bind(name, rebuild(trees[name], results), body_env.origins.get(name, node))

    def loop_body(self, node: ast.For | ast.While, trees: dict[str, tuple], start: Any,
                  step: int | None) -> tuple[Region, Env, dict[str, Any]]:
        """One emission of the body into a fresh region whose arguments have `trees`' types."""
        leaves = [leaf for n in node.ember_carried for leaf in tensor_leaves(trees[n])]
        region = Region([TensorType(DType.i64, ()), *(t for t, _ in leaves)])
        args = [ArrayValue(a, weak=w) for a, (_, w) in zip(region.args[1:], leaves)]
        body_env = self.frame.env.copy()
        for name in node.ember_carried:
            body_env.values[name] = rebuild(trees[name], args)
        with self.in_region(region, body_env):
            if isinstance(node, ast.For):
                body_env.bind(node.target.id, self.induction(region.args[0], start, step), node)
            self.block(node.body)
        outs = {n: body_env.values.get(n, Undefined()) for n in node.ember_carried}
        return region, body_env, outs

    def induction(self, counter: Any, start: Any, step: int) -> ArrayValue:
        """The loop variable start + counter * step (a Python int in Python: weak)."""
        ops = self.ops
        iv = ArrayValue(counter, weak=True)
        if step != 1:
            iv = ops.op("mul", iv, ops.index(step), weak=True)
        if not (isinstance(start, int) and start == 0):
            begin = ops.index(start) if isinstance(start, int) else ops.cast(start, DType.i64)
            iv = ops.op("add", begin, iv, weak=True)
        return iv

    def loop_condition(self, node: ast.For | ast.While, env: Env) -> ArrayValue:
        """Whether another iteration runs: the while test (not at a for) and no stop flag."""
        go: Any = True
        if isinstance(node, ast.While):
            saved, self.frame.env = self.frame.env, env
            try:
                go = self.expr(node.test)
            finally:
                self.frame.env = saved
        for flag in node.ember_stop:
            value = env.values.get(flag, False)
            go = self.logical_and(go, self.logical_not(value))
        return self.ops.truth(go) if isinstance(go, ArrayValue) else \
            self.ops.constant(np.asarray(bool(go)))

    def loop_type_error(self, node: ast.AST, name: str, mismatch: Mismatch, env: Env,
                        body_env: Env) -> None:
        a, b, tree_a, tree_b = mismatch.args
        what = describe_name(name)
        hint = ""
        if is_scalar(tree_a) and tree_b[0] == "tensor" and not name.startswith("$"):
            hint = f" (start it as an array: `{name} = np.zeros({tree_b[1].shape}, ...)`)"
        raise self.error(
            ScriptTypeError, body_env.origins.get(name, node),
            f"{what} changes type in the loop: {a} before it and {b} after an iteration;"
            f" a loop-carried value keeps its shape and dtype{hint}",
            ((env.origins.get(name), f"{what} is {a} here, before the loop"),
             (node, "in this loop")))


def is_constant(value: Any) -> bool:
    """Whether a value is known at compile time (a name not bound yet counts: it is known to
    have no value)."""
    if isinstance(value, tuple):
        return all(is_constant(v) for v in value)
    return not isinstance(value, ArrayValue)
