"""`ember.compile(module)`: an nn.Module compiled per input signature.

A compiled module specializes on the shapes and dtypes of its inputs and recompiles on a
new signature, keeping the most recent `Config.max_specializations`. A module compiled
before loads its code from the disk cache by its fingerprint, without being traced. Ops
Ember does not support run in eager PyTorch (with a warning) unless `strict=True`. A
module that torch.export cannot capture but that runs on the inputs (its output holds a
transformers `DynamicCache`) is compiled through torch.compile with the ember backend
instead, with one warning. With `dynamic=` the module is captured once with those sizes
symbolic, and every signature that binds them shares that capture (code compiled once
for every size, or per binding where a stage needs a size as a number); a model whose
sizes Ember cannot keep symbolic is captured per signature, with one warning. A compiled
module reads the module's attributes, and its `generate` (transformers) runs the module's
own with each forward compiled.
"""

from __future__ import annotations

import contextlib
import inspect
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ember.api.torch_fallback import FallbackRunner
from ember.api.torch_runner import GraphRunner, graph_runner
from ember.config import Config
from ember.driver.pipeline import load_cached
from ember.errors import EmberError, ShapeError, UnsupportedOpError
from ember.frontends.torch import export  # by module: tests count its capture_program calls
from ember.frontends.torch.context import fixing_sizes, size_values
from ember.frontends.torch.fingerprint import load_entry, module_fingerprint, store_entry
from ember.graph.bind import graph_symbols, specialize
from ember.graph.ir import Graph
from ember.graph.symbolic import Dim, SymbolicShapeError, symbol
from ember.util.keys import digests_known
from ember.util.memory import compiling

_MISSING = object()


class CompiledModule:
    """An nn.Module compiled per input signature; called like the module."""

    def __init__(self, module: Any, config: Config, strict: bool, dynamic: Any = None):
        self.module = module
        self.config = config
        self.strict = strict
        self.dynamic = dynamic
        self._symbolic_failed = False  # a symbolic capture failed: specialize instead
        self._dynamo: _DynamoRunner | None = None  # torch.export failed: Dynamo captures
        self.cache: OrderedDict[tuple, Any] = OrderedDict()
        self.compilations = 0
        # The runner of the latest call that passed tensors only, positionally: the next
        # such call tries it first, and its own checks of the tensors stand in for the
        # signature (which costs microseconds to build).
        self._latest_plain: _ModuleRunner | None = None

    @staticmethod
    def signature(args: tuple, kwargs: dict) -> tuple:
        if _plain_tensors(args, kwargs):  # the common call
            return ("tensors",) + tuple((str(a.dtype), tuple(a.shape)) for a in args)
        leaves, spec = torch.utils._pytree.tree_flatten((args, kwargs))
        return (str(spec),) + tuple(
            (str(x.dtype), tuple(x.shape)) if isinstance(x, torch.Tensor) else ("value", repr(x))
            for x in leaves)

    def specialize(self, args: tuple, kwargs: dict) -> Any:
        key = self.signature(args, kwargs)
        if key in self.cache:
            self.cache.move_to_end(key)
            return self.cache[key]
        runner = self._symbolic_runner_for(args, kwargs)
        if runner is None:
            with self._forward_original():
                runner = self._build(args, kwargs)
            self.compilations += 1
        self.cache[key] = runner
        while len(self.cache) > self.config.max_specializations:
            _, evicted = self.cache.popitem(last=False)
            if evicted is self._latest_plain:
                self._latest_plain = None
        return runner

    def _symbolic_runner_for(self, args: tuple, kwargs: dict) -> Any:
        """A runner captured with symbolic sizes (`dynamic=`) that takes these inputs: the
        new signature shares it, with no new capture."""
        if self.dynamic is None or self._symbolic_failed:
            return None
        structure = torch.utils._pytree.tree_structure((args, kwargs))
        for runner in dict.fromkeys(self.cache.values()):
            if isinstance(runner, _ModuleRunner) and runner.takes(structure, args, kwargs):
                return runner
        return None

    @compiling()
    def _build(self, args: tuple, kwargs: dict) -> Any:
        if self._dynamo is not None:
            return self._dynamo
        if self.dynamic is not None and not self._symbolic_failed:
            try:
                return self._build_symbolic(args, kwargs)
            except UnsupportedOpError:
                raise
            except EmberError as e:
                if not self._runs_eagerly(args, kwargs):
                    raise
                # A size that Ember cannot keep symbolic (an op that needs its value, a
                # bound it cannot decide): every signature gets a capture of its own.
                self._symbolic_failed = True
                warnings.warn(f"ember: {type(self.module).__name__} is compiled per input"
                              f" shape, not for symbolic sizes: {e}", stacklevel=3)
        # One scope for the fingerprint and the compile: the weights' bytes, hashed for the
        # one, are not hashed again for the other's key.
        with digests_known():
            return self._build_traced(args, kwargs)

    def _build_traced(self, args: tuple, kwargs: dict) -> Any:
        fingerprint = self._fingerprint(args, kwargs)
        if fingerprint is not None and (warm := self._warm(fingerprint)) is not None:
            return warm
        try:
            program, spec = export.capture_program(self.module, args, kwargs)
        except UnsupportedOpError:
            raise
        except EmberError as e:
            # Inputs the module itself refuses raise (the error says what failed); a trial
            # run would change the state of inputs that are objects (a transformers cache).
            if self.strict or not (_opaque(args, kwargs) or self._runs_eagerly(args, kwargs)):
                raise
            # torch.export cannot take every model (a transformers decoder returns a
            # DynamicCache or takes a StaticCache): Dynamo captures what it can and runs
            # the rest in Python, for this signature and every later one.
            warnings.warn(f"ember: {e}; compiling {type(self.module).__name__} through"
                          " torch.compile (Dynamo) instead", stacklevel=3)
            self._dynamo = _DynamoRunner(self.module, self.config, self._forward_original)
            return self._dynamo
        try:
            runner = GraphRunner(export.import_program(program), config=self.config)
        except UnsupportedOpError:
            if self.strict:
                raise
        else:
            key = getattr(runner.run, "cache_key", None)
            if fingerprint is not None and key is not None:
                store_entry(fingerprint, key, spec)
            return _ModuleRunner(runner, spec)
        runner = FallbackRunner(program, self.config)
        warnings.warn(f"ember: {type(self.module).__name__} runs {runner.describe()} in eager"
                      " PyTorch", stacklevel=3)
        return _ModuleRunner(runner, spec)

    def _build_symbolic(self, args: tuple, kwargs: dict) -> Any:
        """The runner of the module captured with the sizes `dynamic` names symbolic:
        compiled for every size (or per binding of those sizes), shared by every signature
        that binds them."""
        program = None
        wide = _widened(self.module, args, kwargs, self.dynamic)
        if wide is not None:
            # torch.export takes a dynamic dim of size 1 in the example to be 1 always (its
            # 0/1 specialization): the capture sees it as 2, the batch of two copies.
            with contextlib.suppress(EmberError):
                program, spec = export.capture_program(self.module, *wide, self.dynamic)
        if program is None:
            program, spec = export.capture_program(self.module, args, kwargs, self.dynamic)
        # The sizes an op needs as numbers (a pool's window over the height, say) are
        # fixed at the capture's; the rest stay symbolic.
        traced = size_values([n.meta.get("val") for n in program.graph_module.graph.nodes
                              if n.op == "placeholder"])
        try:
            graph, fixed = fixing_sizes(lambda: export.import_program(program), traced)
        except SymbolicShapeError as e:
            raise EmberError(f"importing with symbolic sizes: {e}") from e
        graph = _named_sizes(graph, self.dynamic)
        structure = torch.utils._pytree.tree_structure((args, kwargs))
        runner = _ModuleRunner(graph_runner(graph, config=self.config), spec, structure)
        if fixed and not runner.takes(structure, args, kwargs):  # (a widened size fixed)
            raise EmberError(f"the sizes {', '.join(sorted(fixed))} are needed as numbers,"
                             " and the capture's are not the call's")
        return runner

    def _runs_eagerly(self, args: tuple, kwargs: dict) -> bool:
        try:
            with torch.no_grad():
                self.module(*args, **kwargs)
        except Exception:  # any failure of the module on these inputs
            return False
        return True

    def __getattr__(self, name: str) -> Any:
        """The module's attributes (`config`, `generation_config`, ...), as torch.compile's
        wrapper gives them."""
        if name == "module":  # not set yet (copy, unpickle): no recursion
            raise AttributeError(name)
        return getattr(self.module, name)

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        """The module's own `generate` (transformers), with each forward it runs compiled:
        the prompt's and the decode step's, each captured once per signature."""
        with self._forward_compiled():
            return self.module.generate(*args, **kwargs)

    @contextlib.contextmanager
    def _forward_compiled(self) -> Iterator[None]:
        state = self.module.__dict__
        saved = state.get("forward", _MISSING)
        state["forward"] = self
        try:
            yield
        finally:
            if saved is _MISSING:
                state.pop("forward", None)
            else:
                state["forward"] = saved

    @contextlib.contextmanager
    def _forward_original(self) -> Iterator[None]:
        """The module's own forward while it is captured or run eagerly, inside
        `_forward_compiled`."""
        state = self.module.__dict__
        patched = state.get("forward") is self
        if patched:
            del state["forward"]
        try:
            yield
        finally:
            if patched:
                state["forward"] = self

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        latest = self._latest_plain
        if latest is not None and not kwargs:
            result = latest.run_plain(args)
            if result is not None:
                return result
        runner = self.specialize(args, kwargs)
        if _plain_tensors(args, kwargs):
            self._latest_plain = runner
        return runner(args, kwargs)

    def _fingerprint(self, args: tuple, kwargs: dict) -> str | None:
        """The module's fingerprint for the warm path (compiled code cached on disk), or
        None when that path does not apply."""
        if self.config.executor != "cpu" or not self.config.disk_cache:
            return None
        self.module.eval()  # as capture_program does: the fingerprint sees eval mode
        return module_fingerprint(self.module, self.signature(args, kwargs), self.config)

    def _warm(self, fingerprint: str) -> Any:
        """The runner of the code cached for `fingerprint`, or None: nothing is traced."""
        entry = load_entry(fingerprint)
        executable = load_cached(entry[0], self.config) if entry is not None else None
        if executable is None:
            return None
        return _ModuleRunner(GraphRunner(None, executable=executable), entry[1])


def _plain_tensors(args: tuple, kwargs: dict) -> bool:
    """Whether a call passes tensors only, positionally: its leaves are its arguments (the
    common call, which then skips the pytree walks)."""
    return not kwargs and all(type(a) is torch.Tensor for a in args)


def _opaque(args: tuple, kwargs: dict) -> bool:
    """Whether a call passes objects that are neither tensors nor plain values among its
    pytree leaves (a transformers cache)."""
    plain = (torch.Tensor, int, float, bool, str, type(None), torch.dtype, torch.device)
    return not all(isinstance(x, plain)
                   for x in torch.utils._pytree.tree_leaves((args, kwargs)))


def _tensor_leaves(args: tuple, kwargs: dict) -> list[torch.Tensor]:
    return [x for x in torch.utils._pytree.tree_leaves((args, kwargs))
            if isinstance(x, torch.Tensor)]


def _named_sizes(graph: Graph, dynamic: Any) -> Graph:
    """`graph` with the sizes that `dynamic` names (`{"x": {0: "batch"}}`, or a
    torch.export.Dim's name) called so in place of PyTorch's (`?s31`), where the input's
    dim is that size alone: errors and reports read the user's names."""
    if not isinstance(dynamic, dict):
        return graph
    inputs = {v.name: v.type.shape for v in graph.inputs}
    taken = set(graph_symbols(graph))
    renames: dict[str, Dim] = {}
    for name, axes in dynamic.items():
        shape = inputs.get(name)
        if shape is None or not isinstance(axes, dict):
            continue
        for axis, spec in axes.items():
            label = spec if isinstance(spec, str) else getattr(spec, "__name__", None)
            dim = shape[axis] if isinstance(axis, int) and -len(shape) <= axis < len(shape) \
                else None
            old = dim.as_symbol() if isinstance(dim, Dim) else None
            if old is None or old in renames or not label or label in taken:
                continue
            try:
                renames[old] = symbol(label)
            except ShapeError:  # (not a symbol's name: PyTorch's stays)
                continue
            taken.add(label)
    return specialize(graph, renames) if renames else graph


def _widened(module: Any, args: tuple, kwargs: dict, dynamic: Any) -> tuple | None:
    """(args, kwargs) with every dim of size 1 that `dynamic` marks (every dim, for True;
    the named axes of inputs named by the forward's parameters) doubled by concatenating
    the tensor with itself; None when there is none."""
    def double(x: Any, axes) -> Any:
        if not isinstance(x, torch.Tensor):
            return x
        for axis in range(x.dim()) if axes is True else axes:
            if -x.dim() <= axis < x.dim() and x.shape[axis] == 1:
                x = torch.cat([x, x], dim=axis)
        return x

    if dynamic is True:
        wide = torch.utils._pytree.tree_map(lambda x: double(x, True), (args, kwargs))
    elif isinstance(dynamic, dict):
        try:
            bound = inspect.signature(module.forward).bind(*args, **kwargs)
        except TypeError:
            return None
        for name, axes in dynamic.items():
            if name in bound.arguments and isinstance(axes, dict):
                bound.arguments[name] = double(bound.arguments[name], list(axes))
        wide = (bound.args, bound.kwargs)
    else:
        return None
    same = all(a is b for a, b in zip(torch.utils._pytree.tree_leaves(wide),
                                      torch.utils._pytree.tree_leaves((args, kwargs))))
    return None if same else wide


class _ModuleRunner:
    """Flattens the call's tensors, runs the graph, rebuilds the module's output structure."""

    def __init__(self, graph_runner: Any, out_spec: Any, in_structure: Any = None):
        self.graph_runner = graph_runner
        self.out_spec = out_spec
        self.in_structure = in_structure  # of (args, kwargs), for a symbolic graph
        self._single_output = out_spec.is_leaf()
        # Compiled graphs have a fast path for tensors they take as they are.
        self._run_plain = getattr(graph_runner, "run_plain", None)

    def __call__(self, args: tuple, kwargs: dict) -> Any:
        if _plain_tensors(args, kwargs):  # no pytree walk
            if (result := self.run_plain(args)) is not None:
                return result
            leaves = list(args)
        else:
            leaves = _tensor_leaves(args, kwargs)
        return self._structure(self.graph_runner(*leaves))

    def takes(self, structure: Any, args: tuple, kwargs: dict) -> bool:
        """Whether a symbolic graph's runner takes a call of this input structure and these
        tensors' shapes."""
        accepts = getattr(self.graph_runner, "accepts", None)
        if accepts is None or structure != self.in_structure:
            return False
        return accepts(_tensor_leaves(args, kwargs))

    def run_plain(self, args: tuple) -> Any:
        """The module's output for a call that passed tensors only, positionally, or None
        when the graph cannot take them as they are (the caller takes the general path)."""
        outputs = self._run_plain(args) if self._run_plain is not None else None
        return None if outputs is None else self._structure(outputs)

    def _structure(self, outputs: list) -> Any:
        if self._single_output:
            return outputs[0]
        return torch.utils._pytree.tree_unflatten(list(outputs), self.out_spec)


class _DynamoRunner:
    """A module that torch.export could not capture, compiled by torch.compile with the
    ember backend: its outputs are the module's own, whatever their structure."""

    def __init__(self, module: Any, config: Config,
                 forward_original: Callable[[], contextlib.AbstractContextManager]):
        from ember.api.torch_dynamo import backend_with

        self.compiled = torch.compile(module, backend=backend_with(config))
        self.forward_original = forward_original  # (Dynamo traces the module's own)

    def __call__(self, args: tuple, kwargs: dict) -> Any:
        with torch.no_grad(), self.forward_original():
            return self.compiled(*args, **kwargs)

    def run_plain(self, args: tuple) -> Any:
        return None  # no fast path: the general call
