"""`@ember.script`: a Python function on NumPy arrays, compiled per argument signature.

    @ember.script
    def step(x, w, n):
        for i in range(n):
            x = np.tanh(x @ w)
        return x

    y = step(x, w, 3)          # NumPy arrays in, NumPy arrays out (torch in, torch out)
    step.stats                  # {"compiles": 1, "calls": 1, "hits": 0, "evictions": 0}

The first call with a new signature (arrays by dtype and shape, Python ints and bools by
value, floats as runtime scalars) emits the graph (ember/frontends/script) and compiles it
with `ember.compile`; later calls with that signature run the compiled code.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ember.api.compile import CompiledGraph
from ember.api.compile import compile as compile_graph
from ember.config import Config
from ember.dtypes import DType, from_numpy
from ember.errors import ScriptTypeError
from ember.frontends.script import (
    RuntimeInput,
    ScriptedFunction,
    TensorSpec,
    arg_key,
    emit_function,
)
from ember.graph.ir import Graph


@dataclass
class Specialization:
    """One compiled signature: its graph, the compiled callable, the return value's tree."""

    key: tuple
    graph: Graph
    compiled: CompiledGraph | None  # None when the function returns Python constants only
    tree: tuple

    natives: dict[str, Any] = field(default_factory=dict)

    @property
    def executable(self) -> Any:
        return self.compiled.run if self.compiled is not None else None

    def native(self, arguments: int) -> Any:
        """The compiled code as one native call of `arguments` arrays that returns the
        function's result (ember.runtime.fastcall), or None: where the code is not native,
        its inputs are not the arguments, or the result is not one array or a tuple of
        arrays."""
        if "call" not in self.natives:
            self.natives["call"] = None
            result = ("single" if self.tree[0] == "tensor" else "tuple"
                      if self.tree[0] == "tuple" and all(t[0] == "tensor" for t in self.tree[1])
                      else None)
            native = getattr(self.executable, "native", None)
            if result is not None and native is not None and \
                    len(self.executable.input_types) == arguments:
                self.natives["call"] = native(result)
        return self.natives["call"]


class ScriptFunction:
    """A scripted function: call it like the Python function it wraps."""

    def __init__(self, fn: Callable[..., Any], config: Config | None = None,
                 dynamic: Sequence[str] = (), max_specializations: int | None = None):
        self.__ember_script__ = ScriptedFunction(fn)
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.config = config or Config()
        self.dynamic = frozenset(dynamic)
        self.max_specializations = max_specializations or self.config.max_specializations
        self.signature = self.__ember_script__.signature
        self.names = tuple(self.signature.parameters)
        self.positional = all(p.kind is p.POSITIONAL_OR_KEYWORD
                              for p in self.signature.parameters.values())
        unknown = self.dynamic - set(self.signature.parameters)
        if unknown:
            raise ScriptTypeError(f"dynamic=: {fn.__name__} has no argument"
                                  f" {', '.join(sorted(unknown))}")
        self.cache: OrderedDict[tuple, Specialization] = OrderedDict()
        # Calls on arrays only, by their dtypes and shapes: the common call skips the key.
        self.by_arrays: dict[tuple, Specialization] = {}
        # The latest arrays-only specialization's native call (Specialization.native): a
        # call it takes costs one native call, checks included.
        self._native: Any = None
        self._native_calls = 0
        self._counts = {"compiles": 0, "calls": 0, "hits": 0, "evictions": 0}
        specs = annotated_specs(fn, self.signature)
        if specs is not None:  # every argument annotated: compile now
            self.specialize(tuple(s.key() for s in specs.values()), specs)

    @property
    def stats(self) -> dict[str, int]:
        """Compiles, calls, calls that found their compiled code, and evictions."""
        counts = dict(self._counts)
        counts["calls"] += self._native_calls
        counts["hits"] += self._native_calls
        return counts

    @property
    def compiles(self) -> int:
        return self._counts["compiles"]

    def specializations(self) -> list[Specialization]:
        return list(self.cache.values())

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        native = self._native
        if native is not None and not kwargs:
            result = native(*args)
            if result is not NotImplemented:
                self._native_calls += 1
                return result
        arrays_only = not kwargs and self.positional and len(args) == len(self.names) and \
            all(type(a) is np.ndarray for a in args)
        if arrays_only:
            spec = self.by_arrays.get(tuple((a.dtype, a.shape) for a in args))
            if spec is not None:
                self._counts["calls"] += 1
                self._counts["hits"] += 1
                self.cache.move_to_end(spec.key)
                self._native = spec.native(len(args))
                return _rebuild(spec.tree, list(spec.compiled(*args))
                                if spec.compiled is not None else [])
        if kwargs or len(args) != len(self.names) or not self.positional:
            bound = self.signature.bind(*args, **kwargs)
            bound.apply_defaults()
            args = tuple(bound.arguments.values())
        from_torch = any(is_torch_tensor(v) for v in _leaves(args))
        if from_torch:
            args = tuple(_to_numpy(v) for v in args)
        arguments = dict(zip(self.names, args))
        key = self.key(arguments)
        self._counts["calls"] += 1
        spec = self.cache.get(key)
        if spec is None:
            spec = self.specialize(key, arguments)
        else:
            self._counts["hits"] += 1
            self.cache.move_to_end(key)
        outputs = []
        if spec.compiled is not None:
            inputs = [a for n, v in arguments.items()
                      for a in runtime_arrays(v, n in self.dynamic)]
            outputs = list(spec.compiled(*inputs))
        if arrays_only:
            self.by_arrays[tuple((a.dtype, a.shape) for a in args)] = spec
        result = _rebuild(spec.tree, outputs)
        return _to_torch(result) if from_torch else result

    def key(self, arguments: dict[str, Any]) -> tuple:
        parts = []
        for name, value in arguments.items():
            try:
                parts.append(arg_key(value, name in self.dynamic))
            except TypeError:
                raise ScriptTypeError(
                    f"{self.__name__}: argument `{name}` is a {type(value).__name__}; a"
                    " scripted function takes arrays, Python numbers, bools, strings, dtypes"
                    " and tuples of them") from None
        return tuple(parts)

    def specialize(self, key: tuple, arguments: dict[str, Any]) -> Specialization:
        params = {n: emission_param(v, n in self.dynamic) for n, v in arguments.items()}
        graph, tree = emit_function(self.__ember_script__, params)
        compiled = compile_graph(graph, config=self.config) if graph.outputs else None
        spec = Specialization(key, graph, compiled, tree)
        self._counts["compiles"] += 1
        self.cache[key] = spec
        if len(self.cache) > self.max_specializations:
            self.evict()
        return spec

    def evict(self) -> None:
        varying = [name for k, name in enumerate(self.signature.parameters)
                   if len({key[k] for key in self.cache}) > 1]
        _, dropped = self.cache.popitem(last=False)
        self.by_arrays = {k: v for k, v in self.by_arrays.items() if v is not dropped}
        if dropped.natives.get("call") is self._native:
            self._native = None
        self._counts["evictions"] += 1
        hint = (f" (the argument{'s' if len(varying) > 1 else ''} that vary:"
                f" {', '.join(varying)})") if varying else ""
        warnings.warn(f"{self.__name__} compiled for more than {self.max_specializations}"
                      f" signatures{hint}; dropping the oldest. Ints and bools specialize by"
                      " value: pass dynamic=(name,) to make one a runtime value",
                      stacklevel=3)


def script(fn: Callable[..., Any] | None = None, *, config: Config | None = None,
           dynamic: Sequence[str] = (), max_specializations: int | None = None) -> Any:
    """Compile a Python function on NumPy arrays with Ember (see docs/script.md).

    `@ember.script` or `@ember.script(config=..., dynamic=("n",), max_specializations=8)`.
    Unsupported constructs raise a ScriptSyntaxError here, at decoration; type errors come
    at the first call with a signature."""
    def decorate(f: Callable[..., Any]) -> ScriptFunction:
        return ScriptFunction(f, config, dynamic, max_specializations)

    return decorate(fn) if fn is not None else decorate


# -- arguments -----------------------------------------------------------------------------------

def annotated_specs(fn: Callable[..., Any], signature: inspect.Signature) \
        -> dict[str, TensorSpec] | None:
    try:
        annotations = inspect.get_annotations(fn, eval_str=True)
    except Exception:
        return None
    specs = {n: annotations.get(n) for n in signature.parameters}
    if specs and all(isinstance(s, TensorSpec) for s in specs.values()):
        return specs
    return None


def emission_param(value: Any, dynamic: bool) -> Any:
    """What the emitter sees of an argument: a graph input, or the Python constant."""
    if isinstance(value, TensorSpec):
        return RuntimeInput(value.dtype, value.shape)
    if isinstance(value, (np.ndarray, np.generic)):
        return RuntimeInput(from_numpy(value.dtype), np.shape(value))
    if isinstance(value, float):
        return RuntimeInput(DType.f64, (), weak=True)
    if isinstance(value, int) and not isinstance(value, bool) and dynamic:
        return RuntimeInput(DType.i64, (), weak=True)
    if isinstance(value, tuple):
        return tuple(emission_param(v, dynamic) for v in value)
    return value


def runtime_arrays(value: Any, dynamic: bool) -> list[np.ndarray]:
    """The graph inputs an argument supplies, in emission_param's order."""
    if isinstance(value, (np.ndarray, np.generic)):
        return [np.asarray(value)]
    if isinstance(value, float):
        return [np.asarray(value, np.float64)]
    if isinstance(value, int) and not isinstance(value, bool) and dynamic:
        return [np.asarray(value, np.int64)]
    if isinstance(value, tuple):
        return [a for v in value for a in runtime_arrays(v, dynamic)]
    return []


def _rebuild(tree: tuple, outputs: list[np.ndarray]) -> Any:
    kind = tree[0]
    if kind == "tuple":
        return tuple(_rebuild(t, outputs) for t in tree[1])
    if kind == "tensor":
        return outputs.pop(0)
    return tree[1]


def _leaves(values: Any) -> list[Any]:
    out = []
    for v in values:
        if isinstance(v, tuple):
            out.extend(_leaves(v))
        else:
            out.append(v)
    return out


def is_torch_tensor(x: Any) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "numpy")


def _to_numpy(value: Any) -> Any:
    if isinstance(value, tuple):
        return tuple(_to_numpy(v) for v in value)
    if is_torch_tensor(value):
        from ember.api.torch_runner import tensor_to_array

        return tensor_to_array(value)
    return value


def _to_torch(value: Any) -> Any:
    if isinstance(value, tuple):
        return tuple(_to_torch(v) for v in value)
    if isinstance(value, np.ndarray):
        from ember.api.torch_runner import array_to_tensor

        return array_to_tensor(value)
    return value
