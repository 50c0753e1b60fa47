"""The `ember` backend of torch.compile: `torch.compile(model, backend="ember")`.

Dynamo captures a graph, AOT Autograd lowers it to core ATen ops (parameters become
inputs), and Ember imports and runs it. A graph with ops Ember does not support still
runs: the supported parts are compiled, the rest falls back to eager, with one warning
naming the ops; `counters` shows how many graphs and ops fell back. With
`options={"strict": True}` an unsupported op raises UnsupportedOpError instead;
`options={"executor": "interp"}` runs the reference interpreter instead of compiled code
(default: `Config()`: compiled, unless EMBER_BACKEND says otherwise). A graph with
symbolic sizes (Dynamo's answer to a shape change, `dynamic=True`, `mark_dynamic`) is
imported once with Ember's symbolic sizes and compiled per binding of them
(`_SymbolicSizes`); one that Ember cannot keep symbolic is traced again per call's sizes
(`_Specializing`).
"""

from __future__ import annotations

import warnings
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch._decomp import core_aten_decompositions
from torch._dynamo.backends.common import aot_autograd

from ember.api.torch_fallback import partition
from ember.api.torch_runner import GraphRunner, SymbolicGraphRunner
from ember.config import Config
from ember.errors import EmberError, UnsupportedOpError
from ember.frontends.torch.context import (
    fixed_sizes,
    fixing_sizes,
    size_bounds_of,
    size_values,
    to_dim,
)
from ember.frontends.torch.fx_importer import (
    describe_unsupported,
    import_fx,
    import_fx_with_sizes,
    import_fx_writing,
    unsupported_nodes,
)
from ember.graph.bind import graph_symbols
from ember.graph.symbolic import SymbolicShapeError, evaluate, symbols_in

# graphs: graphs Dynamo handed over; dynamic_graphs: those with symbolic sizes, and
# symbolic_graphs: those imported with them (the rest are traced per size); every_size:
# those compiled once for every size; hot_specializations: code of its own for a size that
# ran long in that (SizeSpecialized.run); partial_specializations: imports with the sizes that
# ops need as numbers fixed, one per value of those; specializations and evictions: code
# compiled per size, and dropped; fallback_graphs: graphs with eager parts; fallback_ops:
# op counts
counters: Counter = Counter()
_warned: set[str] = set()


def _compile_graph(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], strict: bool,
                   config: Config) -> Callable[..., Any]:
    missing = unsupported_nodes(gm)
    if not missing:
        return GraphRunner(import_fx(gm, name="dynamo"), config=config)
    if strict:
        raise UnsupportedOpError("the graph uses " + describe_unsupported(missing))
    counters["fallback_graphs"] += 1
    counters["fallback_ops"] += len(missing)
    fused, names = partition(gm, config)
    key = ",".join(names)
    if key not in _warned:
        _warned.add(key)
        warnings.warn(f"ember: running {len(missing)} unsupported op(s) in eager PyTorch: "
                      f"{', '.join(names)}", stacklevel=2)
    return fused


def ember_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
                  options: dict | None = None, **kwargs: Any) -> Callable[..., Any]:
    """The torch.compile backend function (registered as the entry point `ember`)."""
    options = dict(options or {})
    strict = bool(options.pop("strict", False))
    return backend_with(Config(**options), strict)(gm, example_inputs)


def backend_with(config: Config, strict: bool = False) -> Callable[..., Any]:
    """A torch.compile backend that compiles with `config`."""

    def compile_forward(fx_module: torch.fx.GraphModule, inputs: Sequence[Any]):
        counters["graphs"] += 1
        if _symbolic(fx_module):
            counters["dynamic_graphs"] += 1

        def build(constants: dict[str, torch.Tensor]) -> tuple[Callable[..., Any], bool]:
            if _symbolic(fx_module):
                symbolic = _SymbolicSizes.of_some(fx_module, config, strict, constants)
                if symbolic is not None:
                    return symbolic, True
                return _Specializing(fx_module, strict, config), False
            if unsupported_nodes(fx_module):
                return _compile_graph(fx_module, inputs, strict, config), False
            graph, writes = import_fx_writing(fx_module, constants, name="dynamo")
            return GraphRunner(graph, config=config, writes=writes), True

        candidates = _unmutated_static_inputs(fx_module)
        if not candidates:  # a function's graph: no parameters to wait for
            return _boxed(build({})[0])
        return _boxed(_FrozenParameters(fx_module, candidates, build))

    # With the inputs' mutations kept in the graph (copy_ into them), Ember writes a
    # cache's new rows into the cache itself instead of AOT Autograd copying it back.
    return aot_autograd(fw_compiler=compile_forward, keep_inference_input_mutations=True,
                        decompositions=core_aten_decompositions())


def _symbolic(gm: torch.fx.GraphModule) -> bool:
    """Whether Dynamo gave `gm` symbolic sizes (a SymInt input, or a tensor of symbolic
    shape): after a shape change, with `dynamic=True`, or `mark_dynamic`."""
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        val = node.meta.get("val")
        if isinstance(val, torch.SymInt) or isinstance(val, torch.Tensor) and any(
                not isinstance(d, int) for d in val.shape):
            return True
    return False


class _SymbolicSizes:
    """A graph with symbolic sizes imported once, with them as Ember's symbols: compiled
    once for every size where Ember can (`counters["every_size"]`), else each call binds
    them to its tensors' shapes and runs the code compiled for those sizes (made at the
    first call that binds them; counted in `counters["specializations"]`). Dynamo's
    SymInt inputs are dropped (their values are sizes of the tensors), and the sizes the
    graph returns are computed from the binding."""

    def __init__(self, graph: Any, tensor_positions: list[int], sizes: dict[int, Any],
                 outputs: int, config: Config, writes: dict[int, int]):
        self.tensor_positions = tensor_positions
        self.sizes = sizes
        self.outputs = outputs
        self.runner = SymbolicGraphRunner(graph, config=config, writes=writes)
        self.graph = graph
        if self.runner.sizes.generic is not None:
            counters["every_size"] += 1

    @staticmethod
    def of(gm: torch.fx.GraphModule, config: Config, constants: dict[str, torch.Tensor],
           bounded: bool = True) -> _SymbolicSizes | None:
        """The symbolic runner of `gm` (the placeholders named in `constants` are those
        tensors, and not its inputs; the sizes `fixed_sizes` names are those numbers), or
        None when Ember cannot keep its sizes symbolic (a size input that no tensor's shape
        gives); an EmberError when an op is not supported or needs a size as a number
        (`SymbolicShapeError.symbols` says which)."""
        placeholders = _inputs(gm, constants)
        tensors = [i for i, n in enumerate(placeholders)
                   if isinstance(n.meta.get("val"), torch.Tensor)]
        if any(not isinstance(n.meta.get("val"), (torch.Tensor, torch.SymInt))
               for n in placeholders):
            return None
        graph, sizes, writes = import_fx_with_sizes(gm, constants, "dynamo", bounded)
        given = graph_symbols(graph)
        for node in placeholders:
            if isinstance(node.meta["val"], torch.SymInt) and not \
                    symbols_in(to_dim(node.meta["val"])) <= given:
                return None  # a size that no tensor input's shape gives
        if any(symbols_in(d) - given for d in sizes.values()):
            return None
        output = next(n for n in gm.graph.nodes if n.op == "output")
        count = len(torch.utils._pytree.tree_leaves(output.args[0]))
        return _SymbolicSizes(graph, tensors, sizes, count, config, writes)

    @staticmethod
    def of_some(gm: torch.fx.GraphModule, config: Config, strict: bool,
                constants: dict[str, torch.Tensor]) -> Callable[..., Any] | None:
        """`of`, where the sizes an op needs as numbers (a pool's window over a symbolic
        height, say) are fixed to the traced values and the rest kept symbolic: then a
        `_FixedSizes` over them; None when not even that imports."""
        placeholders = _inputs(gm, constants)
        where = _size_locations(placeholders)
        vals = [n.meta.get("val") for n in placeholders]
        values = {name: value for name, value in size_values(vals).items() if name in where}
        bounded = size_bounds_of(vals)
        try:
            # Without PyTorch's bounds first: a guard such as `?b <= 15` (its fake conv's
            # choice of memory format) splits Dynamo's graphs where Ember's code need not
            # differ, and graphs equal but for it share one compile (the caches' key). A
            # size whose bound an op needs (BERT's `?s <= 512`) keeps the bounds.
            bounded_import = False
            try:
                runner, fixed = fixing_sizes(
                    lambda: _SymbolicSizes.of(gm, config, constants, bounded=False), values,
                    fixable=values.keys() - bounded.keys())
            except SymbolicShapeError:
                bounded_import = True
                runner, fixed = fixing_sizes(
                    lambda: _SymbolicSizes.of(gm, config, constants), values)
        except EmberError:
            return None
        if runner is None:
            return None
        counters["symbolic_graphs"] += 1
        if not fixed:
            return runner
        return _FixedSizes(gm, config, strict, constants, fixed, where, runner,
                           bounded_import)

    def __call__(self, *args: Any) -> Any:
        tensors = [args[i] for i in self.tensor_positions]
        shapes = [tuple(t.shape) for t in tensors]
        sizes = self.runner.sizes
        before = (sizes.compilations, sizes.evictions, sizes.hot_compilations)
        results = self.runner(*tensors)
        counters["specializations"] += sizes.compilations - before[0]
        counters["evictions"] += sizes.evictions - before[1]
        counters["hot_specializations"] += sizes.hot_compilations - before[2]
        if not self.sizes:
            return results
        env = sizes.binding(shapes)
        values = iter(results)
        return [evaluate(self.sizes[k], env) if k in self.sizes else next(values)
                for k in range(self.outputs)]


def _inputs(gm: torch.fx.GraphModule, constants: dict[str, torch.Tensor]) -> list[Any]:
    """The placeholders the runner is called with (those not frozen into constants)."""
    return [n for n in gm.graph.nodes if n.op == "placeholder" and n.name not in constants]


class _FixedSizes:
    """A symbolic graph imported with some of its sizes fixed (those that an op needs as
    numbers) and the rest symbolic: one `_SymbolicSizes` per value of the fixed sizes
    (a CNN's height and width, say, while its batch varies), made at the first call that
    has them, at most Config.max_specializations (counted in `counters`:
    "partial_specializations", "evictions"). Values whose import fails are traced per
    size (`_Specializing`)."""

    def __init__(self, gm: torch.fx.GraphModule, config: Config, strict: bool,
                 constants: dict[str, torch.Tensor], fixed: dict[str, int],
                 where: dict[str, tuple], first: _SymbolicSizes, bounded: bool):
        self.gm, self.config, self.constants, self.bounded = gm, config, constants, bounded
        self.names = sorted(fixed)
        self.where = [where[n] for n in self.names]
        self.runners: OrderedDict[tuple[int, ...], Any] = OrderedDict()
        self.runners[tuple(fixed[n] for n in self.names)] = first
        self.traced = _Specializing(gm, strict, config)
        counters["partial_specializations"] += 1

    def __call__(self, *args: Any) -> Any:
        key = tuple(int(args[i] if axis is None else args[i].shape[axis])
                    for i, axis in self.where)
        runner = self.runners.get(key)
        if runner is None:
            try:
                with fixed_sizes(dict(zip(self.names, key))):
                    runner = _SymbolicSizes.of(self.gm, self.config, self.constants,
                                               self.bounded)
            except EmberError:
                runner = None
            runner = runner or self.traced
            counters["partial_specializations"] += 1
            self.runners[key] = runner
            if len(self.runners) > self.config.max_specializations:
                self.runners.popitem(last=False)
                counters["evictions"] += 1
        else:
            self.runners.move_to_end(key)
        return runner(*args)


def _size_locations(placeholders: Sequence[Any]) -> dict[str, tuple]:
    """Where a call's inputs give each size symbol: (input, axis) for a tensor's dim that
    is the bare symbol, (input, None) for a SymInt input that is."""
    found: dict[str, tuple] = {}
    for i, node in enumerate(placeholders):
        val = node.meta["val"]
        dims = [(None, val)] if isinstance(val, torch.SymInt) else \
            list(enumerate(val.shape)) if isinstance(val, torch.Tensor) else []
        for axis, size in dims:
            if isinstance(size, torch.SymInt) and size.node.expr.is_Symbol:
                found.setdefault(size.node.expr.name, (i, axis))
    return found


class _Specializing:
    """A graph with symbolic sizes, run by specializing it on each call's sizes: the
    graph is traced again with the call's tensors (its SymInt inputs as the call's ints),
    which gives static shapes, and compiled; later calls with the same sizes reuse that.
    Compiled code per size, at most Config.max_specializations of them (counted in `counters`:
    "specializations", "evictions"). Symbolic shapes in Ember's IR are issue 22's."""

    def __init__(self, gm: torch.fx.GraphModule, strict: bool, config: Config):
        self.gm, self.strict, self.config = gm, strict, config
        self.compiled: OrderedDict[tuple, tuple[Callable[..., Any], list[int]]] = OrderedDict()

    def __call__(self, *args: Any) -> Any:
        key = tuple(("int", a) if isinstance(a, int) else
                    (tuple(a.shape), a.dtype, tuple(a.stride())) if isinstance(a, torch.Tensor)
                    else ("other", type(a).__name__) for a in args)
        entry = self.compiled.get(key)
        if entry is None:
            entry = self.specialize(args)
            self.compiled[key] = entry
            if len(self.compiled) > self.config.max_specializations:
                self.compiled.popitem(last=False)
                counters["evictions"] += 1
        else:
            self.compiled.move_to_end(key)
        fn, tensor_positions = entry
        return fn(*(args[i] for i in tensor_positions))

    def specialize(self, args: Sequence[Any]) -> tuple[Callable[..., Any], list[int]]:
        from torch.fx.experimental.proxy_tensor import make_fx

        counters["specializations"] += 1
        positions = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
        values = list(args)

        def on_tensors(*tensors):
            for i, t in zip(positions, tensors):
                values[i] = t
            return self.gm(*values)

        static = make_fx(on_tensors, tracing_mode="fake")(*(args[i] for i in positions))
        # Sizes the graph returns (for AOT Autograd's bookkeeping) are constants now.
        output = next(n for n in static.graph.nodes if n.op == "output")
        items = list(output.args[0])
        sizes = {k: v for k, v in enumerate(items) if not isinstance(v, torch.fx.Node)}
        output.args = (tuple(v for v in items if isinstance(v, torch.fx.Node)),)
        static.recompile()
        compiled = _compile_graph(static, [args[i] for i in positions], self.strict,
                                  self.config)
        if not sizes:
            return compiled, positions

        def with_sizes(*tensors):
            results = iter(compiled(*tensors))
            return [sizes[k] if k in sizes else next(results) for k in range(len(items))]
        return with_sizes, positions


def _unmutated_static_inputs(gm: torch.fx.GraphModule) -> list[int]:
    """The positions of the graph's inputs that Dynamo marked static (the module's
    parameters and buffers, tensors at fixed addresses) and that the graph neither
    mutates nor returns a view of: those that may be frozen into constants."""
    from torch._functorch._aot_autograd.schemas import MutationType

    context = torch._guards.TracingContext.try_get()
    meta = getattr(context, "fw_metadata", None)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if meta is None or len(meta.input_info) != len(placeholders):
        return []
    aliased = {o.base_idx for o in meta.output_info if o.base_idx is not None}
    return [i for i in meta.static_input_indices if i not in aliased
            and meta.input_info[i].mutation_type is MutationType.NOT_MUTATED]


class _FrozenParameters:
    """A graph whose parameter inputs are compiled in as constants, as `ember.compile`
    compiles a module's weights: folded, and packed for the kernels that read them (a
    linear layer's weight is no longer transposed at every call, as it was as an input).
    Built at the first call, which has the parameters' values. Each call checks that they
    are the same tensors, unchanged (their version counters, which every in-place write
    bumps, and their data pointers); a parameter that changed makes the graph compile
    again with its new value (counted in `counters["refreezes"]`). Parameters only:
    buffers and other static tensors (a preallocated cache) stay inputs."""

    def __init__(self, gm: torch.fx.GraphModule, candidates: list[int],
                 build: Callable[[dict[str, torch.Tensor]], tuple[Callable[..., Any], bool]]):
        self.names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
        self.candidates = candidates
        self.build = build
        self.run: Callable[..., Any] | None = None
        self.frozen: list[tuple[int, torch.Tensor, int, int]] = []
        self.kept: list[int] = []

    def __call__(self, *args: Any) -> Any:
        if self.run is None or not self._unchanged(args):
            self._freeze(args)
        return self.run(*[args[i] for i in self.kept])

    def _unchanged(self, args: Sequence[Any]) -> bool:
        return all(args[i] is p and p._version == version and p.data_ptr() == address
                   for i, p, version, address in self.frozen)

    def _freeze(self, args: Sequence[Any]) -> None:
        if self.run is not None:
            counters["refreezes"] += 1
        positions = [i for i in self.candidates if isinstance(args[i], torch.nn.Parameter)]
        self.run, frozen = self.build({self.names[i]: args[i].detach() for i in positions})
        if not frozen:  # a graph that runs with eager parts takes its parameters
            positions = []
        self.frozen = [(i, args[i], args[i]._version, args[i].data_ptr()) for i in positions]
        skipped = set(positions)
        self.kept = [i for i in range(len(args)) if i not in skipped]


def _boxed(fn: Callable[..., Any]) -> Callable[..., Any]:
    """AOT Autograd calls compiled functions with one list of arguments ("boxed")."""

    def run(args: list[Any]) -> Any:
        result = fn(*args)
        args.clear()
        return result

    run._boxed_call = True  # noqa: SLF001  (AOT Autograd's convention)
    return run
