"""Binding a graph's symbolic sizes: from a call's input shapes to the symbols' values
(`bind_sizes`), and from those values to the graph with every size a number
(`specialize`, for all of them or some), which the rest of the pipeline compiles.

A graph's symbols are those of its inputs' types: each dim of an input is a number that
the call must match, a bare symbol that the call binds (the first input that has it; the
others must agree), or an expression of symbols, which is checked once they are bound (a
linear one in a single unbound symbol, `2*?n+1`, binds it). A call that disagrees gets a
ShapeError naming the input, the dim and what it was bound to.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ember.errors import ShapeError
from ember.graph.ir import Graph, TensorType, clone_graph
from ember.graph.symbolic import Dim, DimLike, bind, symbol, symbols_in


def graph_symbols(graph: Graph) -> frozenset[str]:
    """The symbols of `graph`'s input types (empty for a graph of static shapes)."""
    return frozenset().union(*(symbols_in(v.type.shape) for v in graph.inputs))


def is_symbolic(graph: Graph) -> bool:
    return any(not v.type.is_static for v in graph.inputs)


def bind_sizes(graph: Graph, shapes: Sequence[Sequence[int]]) -> dict[str, int]:
    """The values of `graph`'s symbols given its inputs' `shapes`; a ShapeError when a
    shape does not fit its input's type."""
    return bind_shapes(f"graph @{graph.name}", [v.name for v in graph.inputs],
                       [v.type.shape for v in graph.inputs], shapes, graph.size_bounds)


def bind_shapes(what: str, names: Sequence[str | None], declared_shapes: Sequence[Sequence],
                shapes: Sequence[Sequence[int]], bounds: Mapping[str, int]) -> dict[str, int]:
    """`bind_sizes` for inputs of `declared_shapes` (named `names`; `what` owns them, for
    messages): also what a program compiled for every size binds at each call."""
    if len(shapes) != len(declared_shapes):
        raise ShapeError(f"{what} takes {len(declared_shapes)} inputs, got {len(shapes)}")
    env: dict[str, int] = {}
    bound_by: dict[str, str] = {}
    pending: list[tuple[str, int, Dim, int]] = []

    def label(i: int) -> str:
        return f"input {i} (%{names[i]})" if names[i] else f"input {i}"

    for i, (declared, shape) in enumerate(zip(declared_shapes, shapes)):
        if len(shape) != len(declared):
            raise ShapeError(f"{what} {label(i)}: expected shape"
                             f" {_text(declared)} ({len(declared)} dims), got {list(shape)}")
        for axis, (want, got) in enumerate(zip(declared, shape)):
            got = int(got)
            name = want.as_symbol() if isinstance(want, Dim) else None
            if name is not None and name not in env:
                env[name], bound_by[name] = got, f"{label(i)} dim {axis}"
            elif isinstance(want, Dim):
                pending.append((label(i), axis, want, got))
            elif want != got:
                raise ShapeError(f"{what} {label(i)}: dim {axis} is {got},"
                                 f" expected {want} (shape {_text(declared)})")
    for where, axis, want, got in pending:
        unbound = want.symbols - env.keys()
        if len(unbound) == 1 and (solved := _solve(want, next(iter(unbound)), got, env)):
            env[solved[0]], bound_by[solved[0]] = solved[1], f"{where} dim {axis}"
            continue
        if unbound:
            raise ShapeError(f"{what} {where}: dim {axis} is {want}, and no"
                             f" input's shape gives {', '.join('?' + s for s in sorted(unbound))}")
        value = want.evaluate(env)
        if value != got:
            bindings = ", ".join(f"?{s} = {env[s]} (from {bound_by[s]})"
                                 for s in sorted(want.symbols))
            raise ShapeError(f"{what} {where}: dim {axis} is {got}, expected"
                             f" {want} = {value} with {bindings}")
    for name, value in env.items():
        if value < 1:
            raise ShapeError(f"{what}: the size ?{name} is {value} (from"
                             f" {bound_by[name]}); a symbolic size is at least 1")
        if value > bounds.get(name, value):
            raise ShapeError(f"{what}: the size ?{name} is {value} (from"
                             f" {bound_by[name]}), above its bound {bounds[name]}")
    return env


def specialize(graph: Graph, env: Mapping[str, DimLike]) -> Graph:
    """A copy of `graph` with each symbol of its types and attributes that `env` names
    replaced by its value: a number, or another symbol (a renaming, which keeps the
    bound); the others stay symbols, with their bounds. The constants are shared."""
    env = {**{name: symbol(name) for name in graph_symbols(graph) | graph.size_bounds.keys()},
           **env}

    def bound_type(t: TensorType) -> TensorType:
        return t if t.is_static else TensorType(t.dtype, bind(t.shape, env))

    copy = clone_graph(graph, bound_type, lambda attrs: {k: bind(v, env)
                                                         for k, v in attrs.items()})
    copy.size_bounds = {env[name].as_symbol(): most for name, most in graph.size_bounds.items()
                        if isinstance(env[name], Dim) and env[name].as_symbol()}
    return copy


def _solve(dim: Dim, name: str, value: int, env: Mapping[str, int]) -> tuple[str, int] | None:
    """(name, x) when `dim` is linear in `name` (a*x + rest, the rest bound) and equals
    `value` at a whole x."""
    coefficient, rest = 0, 0
    for monomial, c in dim.terms:
        if monomial == (name,):
            coefficient = c
        elif name in symbols_in(Dim({monomial: 1})):
            return None
        else:
            rest += Dim({monomial: c}).evaluate(env) if monomial else c
    if coefficient == 0 or (value - rest) % coefficient:
        return None
    return name, (value - rest) // coefficient


def _text(shape: Sequence) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"
