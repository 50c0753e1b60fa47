"""`ember.onnx.backend`: the ONNX Backend API (`prepare`, `run_model`, `run_node`,
`supports_device`), through which the onnx test runner drives a runtime.

A prepared model whose inputs have dim_params is imported once with them as symbolic
sizes (the ONNX importer's `symbolic=True`), and compiled code is made per binding of
them. Where that import needs a size as a number, or a model has none, it is imported
lazily, at its first run, when the input values are known: inputs that decide shapes (a
Reshape target fed as an input, say) are specialized on their values, and the compiled
graph is cached per input signature and those values.
The executor is compiled code (the default) or the reference interpreter
(`EMBER_BACKEND=interp`, or the `executor=` keyword of `prepare`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep

from ember.config import Config
from ember.driver.compile import SizeSpecialized, executor_for
from ember.errors import EmberError, ShapeError
from ember.frontends.onnx.importer import Importer, load_model
from ember.graph.bind import is_symbolic
from ember.graph.ir import Graph


@dataclass
class _Specialization:
    signature: tuple
    values: dict[str, np.ndarray]  # inputs whose values the graph was specialized on
    graph: Graph
    run: Any  # the graph's executor: the interpreter, or compiled code


class EmberRep(BackendRep):
    """A prepared model: run(inputs) returns the outputs as a tuple of arrays."""

    def __init__(self, model: onnx.ModelProto, executor: str | None = None,
                 config: Config | None = None):
        self.model = model
        self.config = config or (Config(executor=executor) if executor else Config())
        initializers = {t.name for t in model.graph.initializer}
        self.input_names = [i.name for i in model.graph.input if i.name not in initializers]
        self.specializations: list[_Specialization] = []
        Importer(model).check_supported()  # unsupported ops fail at prepare, all at once
        self._symbolic: tuple[Graph, SizeSpecialized] | None | bool = False  # False: not tried

    def _arrays(self, inputs: Any) -> list[np.ndarray]:
        if isinstance(inputs, Mapping):
            missing = [n for n in self.input_names if n not in inputs]
            if missing:
                raise ShapeError(f"missing model inputs: {', '.join(missing)}")
            inputs = [inputs[n] for n in self.input_names]
        inputs = list(inputs)
        if len(inputs) != len(self.input_names):
            raise ShapeError(f"the model takes {len(self.input_names)} inputs, got {len(inputs)}")
        return [np.asarray(a) for a in inputs]

    def graph_for(self, arrays: Sequence[np.ndarray]) -> _Specialization:
        """The imported (and compiled) graph for these inputs, cached or made now."""
        signature = tuple((a.dtype.str, a.shape) for a in arrays)
        by_name = dict(zip(self.input_names, arrays))
        for entry in self.specializations:
            if entry.signature == signature and all(
                    np.array_equal(by_name[n], v) for n, v in entry.values.items()):
                return entry
        importer = Importer(self.model, input_values=by_name)
        graph = importer.run()
        values = {n: by_name[n].copy() for n in importer.specialized}
        run = executor_for(graph, self.config)
        self.specializations.insert(0, _Specialization(signature, values, graph, run))
        del self.specializations[self.config.max_specializations:]
        return self.specializations[0]

    def symbolic(self) -> tuple[Graph, SizeSpecialized] | None:
        """(graph, executor) of the model imported once with its dim_params as symbolic
        sizes, or None: its inputs have none, or the import needs a size as a number (an
        input's value that decides a shape, an op Ember cannot size symbolically)."""
        if self._symbolic is False:
            self._symbolic = None
            if any(not d.HasField("dim_value") for i in self.model.graph.input
                   if i.name in self.input_names and i.type.HasField("tensor_type")
                   for d in i.type.tensor_type.shape.dim):
                try:
                    graph = Importer(self.model, symbolic=True).run()
                except EmberError:
                    graph = None
                if graph is not None and is_symbolic(graph):
                    self._symbolic = graph, executor_for(graph, self.config)
        return self._symbolic

    def run(self, inputs: Any, **kwargs: Any) -> tuple[np.ndarray, ...]:
        arrays = self._arrays(inputs)
        symbolic = self.symbolic()
        # (A shape that the dim_params do not allow: the import per signature says why.)
        if symbolic is not None and symbolic[1].accepts([a.shape for a in arrays]):
            return tuple(symbolic[1](*arrays))
        return tuple(self.graph_for(arrays).run(*arrays))


class EmberBackend(Backend):
    @classmethod
    def is_compatible(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> bool:
        return cls.supports_device(device)

    @classmethod
    def prepare(cls, model: Any, device: str = "CPU", **kwargs: Any) -> EmberRep:
        if not cls.supports_device(device):
            raise EmberError(f"device '{device}' is not supported (Ember runs on CPU here)")
        return EmberRep(load_model(model), kwargs.get("executor"))

    @classmethod
    def run_model(cls, model: Any, inputs: Any, device: str = "CPU",
                  **kwargs: Any) -> tuple[np.ndarray, ...]:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node: onnx.NodeProto, inputs: Any, device: str = "CPU",
                 outputs_info: Sequence[tuple[np.dtype, tuple[int, ...]]] | None = None,
                 **kwargs: Any) -> tuple[np.ndarray, ...]:
        arrays = [np.asarray(a) for a in inputs]
        graph_inputs = [onnx.helper.make_tensor_value_info(
            name, onnx.helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
            for name, a in zip(node.input, arrays) if name]
        graph_outputs = [onnx.helper.make_empty_tensor_value_info(name)
                         for name in node.output if name]
        graph = onnx.helper.make_graph([node], "run_node", graph_inputs, graph_outputs)
        opset = kwargs.get("opset_version", onnx.defs.onnx_opset_version())
        model = onnx.helper.make_model(
            graph, opset_imports=[onnx.helper.make_opsetid(node.domain or "", opset)])
        return cls.run_model(model, [a for name, a in zip(node.input, arrays) if name],
                             device, **kwargs)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return str(device).upper().startswith("CPU")


backend = EmberBackend
prepare = EmberBackend.prepare
run_model = EmberBackend.run_model
run_node = EmberBackend.run_node
supports_device = EmberBackend.supports_device
