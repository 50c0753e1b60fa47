"""`ember.compile`: the one entry point for every frontend.

    fast = ember.compile(model)                 # an nn.Module
    out = fast(x)                               # same output structure as model(x)
    run = ember.compile("model.onnx")           # an ONNX model: run([x]) -> outputs
    fn = ember.compile(graph)                   # a graph: fn(*arrays) -> list of arrays

A compiled module specializes on the shapes and dtypes of its inputs, and recompiles on a
new signature, keeping the most recent `Config.max_specializations`. Ops Ember does not
support run in eager PyTorch (with a warning) unless `strict=True`.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections import OrderedDict
from typing import Any

import numpy as np

from ember.config import Config
from ember.errors import EmberError, UnsupportedOpError
from ember.graph.interp import interpret
from ember.graph.ir import Graph


def compile(obj: Any, example_inputs: Any = None, *, config: Config | None = None,
            strict: bool = False, tune: bool | None = None) -> Any:
    """Compile a torch.nn.Module, an ONNX model (ModelProto, path or bytes) or a Graph.
    `tune=True` searches matmul schedules on this machine (see Config.tune)."""
    config = config or Config()
    if tune is not None:
        config = dataclasses.replace(config, tune=tune)
    config = config.resolved()  # the target, once: every stage and cache key sees it
    if isinstance(obj, Graph):
        return CompiledGraph(obj, config)
    if _is_torch_module(obj):
        compiled = CompiledModule(obj, config, strict)
        if example_inputs is not None:
            args = example_inputs if isinstance(example_inputs, tuple) else (example_inputs,)
            compiled.specialize(args, {})
        return compiled
    if _is_onnx(obj):
        from ember.frontends.onnx.backend import EmberRep
        from ember.frontends.onnx.importer import load_model

        return EmberRep(load_model(obj), config=config)
    raise EmberError(f"cannot compile a {type(obj).__name__}: expected a torch.nn.Module,"
                     " an ONNX model or path, or an ember Graph")


def _is_torch_module(obj: Any) -> bool:
    try:
        import torch
    except ImportError:
        return False
    return isinstance(obj, torch.nn.Module)


def _is_onnx(obj: Any) -> bool:
    if isinstance(obj, (str, os.PathLike)):
        return str(obj).endswith(".onnx")
    if isinstance(obj, (bytes, bytearray)):
        return True
    return type(obj).__name__ == "ModelProto"


def executor_for(graph: Graph, config: Config) -> Any:
    """A function running `graph` on arrays (or tensors): compiled, or the interpreter."""
    if config.executor == "cpu":
        from ember.driver.pipeline import compile_graph

        return compile_graph(graph, config)
    return lambda *arrays: interpret(graph, list(arrays))


class CompiledGraph:
    """A graph as a function of NumPy arrays (inputs checked against the graph's types)."""

    def __init__(self, graph: Graph, config: Config | None = None):
        self.graph = graph
        self.run = executor_for(graph, config or Config())

    def __call__(self, *arrays: Any) -> list[np.ndarray]:
        return self.run(*arrays)


class CompiledModule:
    """An nn.Module compiled per input signature; called like the module."""

    def __init__(self, module: Any, config: Config, strict: bool):
        self.module = module
        self.config = config
        self.strict = strict
        self.cache: OrderedDict[tuple, Any] = OrderedDict()
        self.compilations = 0
        # The runner of the latest call that passed tensors only, positionally: the next
        # such call tries it first, and its own checks of the tensors stand in for the
        # signature (which costs microseconds to build).
        self._latest_plain: _ModuleRunner | None = None

    @staticmethod
    def signature(args: tuple, kwargs: dict) -> tuple:
        import torch

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
        runner = self._build(args, kwargs)
        self.compilations += 1
        self.cache[key] = runner
        while len(self.cache) > self.config.max_specializations:
            _, evicted = self.cache.popitem(last=False)
            if evicted is self._latest_plain:
                self._latest_plain = None
        return runner

    def _build(self, args: tuple, kwargs: dict) -> Any:
        from ember.frontends.torch.export import capture_program, import_program

        fingerprint = self._fingerprint(args, kwargs)
        if fingerprint is not None and (warm := self._warm(fingerprint)) is not None:
            return warm
        program, spec = capture_program(self.module, args, kwargs)
        try:
            runner = import_program(program, config=self.config)
        except UnsupportedOpError:
            if self.strict:
                raise
        else:
            key = getattr(runner.run, "cache_key", None)
            if fingerprint is not None and key is not None:
                from ember.frontends.torch.fingerprint import store_entry

                store_entry(fingerprint, key, spec)
            return _ModuleRunner(runner, spec)
        from ember.frontends.torch.fallback import FallbackRunner

        runner = FallbackRunner(program, self.config)
        warnings.warn(f"ember: {type(self.module).__name__} runs {runner.describe()} in eager"
                      " PyTorch", stacklevel=3)
        return _ModuleRunner(runner, spec)

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
        from ember.frontends.torch.fingerprint import module_fingerprint

        self.module.eval()  # as capture_program does: the fingerprint sees eval mode
        return module_fingerprint(self.module, self.signature(args, kwargs), self.config)

    def _warm(self, fingerprint: str) -> Any:
        """The runner of the code cached for `fingerprint`, or None: nothing is traced."""
        from ember.driver.pipeline import load_cached
        from ember.frontends.torch.fingerprint import load_entry
        from ember.frontends.torch.runtime import GraphRunner

        entry = load_entry(fingerprint)
        executable = load_cached(entry[0], self.config) if entry is not None else None
        if executable is None:
            return None
        return _ModuleRunner(GraphRunner(None, executable=executable), entry[1])


def _plain_tensors(args: tuple, kwargs: dict) -> bool:
    """Whether a call passes tensors only, positionally: its leaves are its arguments (the
    common call, which then skips the pytree walks)."""
    import torch

    return not kwargs and all(type(a) is torch.Tensor for a in args)


class _ModuleRunner:
    """Flattens the call's tensors, runs the graph, rebuilds the module's output structure."""

    def __init__(self, graph_runner: Any, out_spec: Any):
        self.graph_runner = graph_runner
        self.out_spec = out_spec
        self._single_output = out_spec.is_leaf()
        # Compiled graphs have a fast path for tensors they take as they are.
        self._run_plain = getattr(graph_runner, "run_plain", None)

    def __call__(self, args: tuple, kwargs: dict) -> Any:
        import torch

        if _plain_tensors(args, kwargs):  # no pytree walk
            if (result := self.run_plain(args)) is not None:
                return result
            leaves = list(args)
        else:
            leaves = [x for x in torch.utils._pytree.tree_leaves((args, kwargs))
                      if isinstance(x, torch.Tensor)]
        return self._structure(self.graph_runner(*leaves))

    def run_plain(self, args: tuple) -> Any:
        """The module's output for a call that passed tensors only, positionally, or None
        when the graph cannot take them as they are (the caller takes the general path)."""
        outputs = self._run_plain(args) if self._run_plain is not None else None
        return None if outputs is None else self._structure(outputs)

    def _structure(self, outputs: list) -> Any:
        import torch

        if self._single_output:
            return outputs[0]
        return torch.utils._pytree.tree_unflatten(list(outputs), self.out_spec)
