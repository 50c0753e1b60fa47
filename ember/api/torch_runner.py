"""Running an imported graph on torch tensors: NumPy views in, torch tensors out.

The executor is compiled code or the reference interpreter (Config.executor); tensors
cross the boundary without copies where NumPy can view them (contiguous CPU tensors).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from ember.config import Config
from ember.driver.compile import SizeSpecialized, executor_for
from ember.driver.pipeline import compile_graph
from ember.dtypes import DType
from ember.errors import ShapeError
from ember.frontends.torch.context import to_dtype, to_torch_dtype
from ember.graph.bind import is_symbolic
from ember.graph.ir import Graph
from ember.loops.ir import Buffer
from ember.runtime.executable import Executable, SizedExecutable
from ember.runtime.pool import OUTPUTS


def tensor_to_array(tensor: torch.Tensor) -> np.ndarray:
    """A NumPy view of a CPU tensor (a copy only when it is not contiguous)."""
    if not isinstance(tensor, torch.Tensor):
        return np.asarray(tensor)
    tensor = tensor.detach().resolve_conj().resolve_neg()  # (numpy() refuses lazy views)
    if tensor.device.type != "cpu":
        tensor = tensor.cpu()
    if not tensor.is_contiguous():
        tensor = tensor.contiguous()
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(DType.bf16.np)
    return tensor.numpy()


def array_to_tensor(array: np.ndarray) -> torch.Tensor:
    if not array.flags.c_contiguous:
        array = array.copy(order="C")  # (np.ascontiguousarray would make a 0-d array 1-d)
    if array.dtype == DType.bf16.np:
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    if not array.flags.writeable:
        array = array.copy()
    return torch.from_numpy(array)


class GraphRunner:
    """Calls a graph with torch tensors; returns a list of tensors (or one tensor)."""

    def __init__(self, graph: Graph | None, single_output: bool = False,
                 config: Config | None = None, executable: Any = None,
                 writes: dict[int, int] | None = None):
        """Runs `graph` (compiled by `config`), or an already compiled `executable` (the
        warm path, which has no graph). `writes`: graph outputs that are new values of
        inputs (output position -> input position), written into those tensors and not
        returned; where the graph computes one in place of its input (a scatter that is
        the input's only reader: a cache's new rows), the kernel writes the tensor itself."""
        self.graph = graph
        self.single_output = single_output
        self.writes = dict(writes or {})
        self.run = executable if executable is not None else \
            executor_for(graph, config or Config())
        # Writes the graph computes in its input's memory (`Graph.aliases`): the kernel is
        # given the input's tensor as that output.
        self.in_place = dict(graph.aliases) if graph is not None else \
            dict(getattr(getattr(executable, "interface", None), "aliases", ()))
        self.input_dtypes = [b.dtype for b in executable.interface.inputs] \
            if executable is not None else [v.dtype for v in graph.inputs]
        # Compiled code takes tensors by their data addresses, with no NumPy views between:
        # the views cost more than the kernels of a small model.
        # Code of every size binds its sizes from the tensors' shapes (`_run_sized`).
        self._sized = isinstance(self.run, SizedExecutable)
        compiled = isinstance(self.run, Executable) and not self._sized
        self._expected = [(to_torch_dtype(b.dtype), b.shape) for b in self.run.input_types] \
            if compiled else None
        self._new_outputs = [_output_maker(b) for b in self.run.output_types] \
            if compiled else None
        self._dtypes = [to_torch_dtype(b.dtype) for b in self.run.input_types] \
            if self._sized else None
        self._output_dtypes = [to_torch_dtype(b.dtype) for b in self.run.output_types] \
            if self._sized else None

    def __call__(self, *tensors: Any) -> Any:
        outputs = self.run_plain(tensors)
        if outputs is None:
            arrays = []
            for i, (dtype, tensor) in enumerate(zip(self.input_dtypes, tensors)):
                if isinstance(tensor, torch.Tensor) and to_dtype(tensor.dtype) is not dtype:
                    raise ShapeError(f"input {i}: expected {dtype}, got {tensor.dtype}")
                arrays.append(tensor_to_array(tensor))
            outputs = [array_to_tensor(a) for a in self.run(*arrays)]
            for k, j in self.writes.items():
                tensors[j].copy_(outputs[k])
            outputs = [t for k, t in enumerate(outputs) if k not in self.writes]
        return outputs[0] if self.single_output else outputs

    def run_plain(self, tensors: Sequence[Any]) -> list[torch.Tensor] | None:
        """The common call, or None when `tensors` are not what the compiled code takes
        as they are (CPU, contiguous, the exact dtypes and shapes): then the caller takes
        the general path, which converts or explains. Every microsecond here counts for
        a small model: a 30-us MLP paid 13 us around its kernels before this path."""
        if self._sized:
            return self._run_sized(tensors)
        expected = self._expected
        if expected is None or len(tensors) != len(expected):
            return None
        inputs = []
        for t, (dtype, shape) in zip(tensors, expected):
            if not (type(t) is torch.Tensor and t.dtype is dtype and t.shape == shape
                    and t.is_cpu and t.is_contiguous() and not t.is_neg()):
                return None
            inputs.append(t.data_ptr())
        return self._run_with(tensors, inputs, self._new_outputs, self.run.run_into)

    def _run_sized(self, tensors: Sequence[Any]) -> list[torch.Tensor] | None:
        """`run_plain` for code of every size: the binding of these shapes (made once per
        shapes), outputs of its shapes, one native call; None for the general path."""
        if len(tensors) != len(self._dtypes) or not all(
                type(t) is torch.Tensor and t.dtype is dtype and t.is_cpu and t.is_contiguous()
                and not t.is_neg() for t, dtype in zip(tensors, self._dtypes)):
            return None
        try:
            bound = self.run.binding([t.shape for t in tensors])
        except ShapeError:
            return None  # the general call explains
        makers = [lambda b=b, dtype=dtype: torch.empty(b.shape, dtype=dtype)
                  for b, dtype in zip(bound.outputs, self._output_dtypes)]
        return self._run_with(tensors, [t.data_ptr() for t in tensors], makers,
                              lambda ins, outs: self.run.run_bound(bound, ins, outs))

    def _run_with(self, tensors: Sequence[Any], inputs: list[int],
                  makers: Sequence[Callable[[], torch.Tensor]],
                  run: Callable[[list[int], list[int]], None]) -> list[torch.Tensor] | None:
        """Outputs from `makers` (a written input's own tensor where the graph updates it in
        place), `run` on the addresses, the other writes copied into their inputs."""
        if not self.writes:
            outputs = [new() for new in makers]
            if outputs and type(outputs[0]) is not torch.Tensor:
                return None  # a mode that makes tensors without memory (FakeTensor)
            run(inputs, [t.data_ptr() for t in outputs])
            return outputs
        outputs = [tensors[self.in_place[k]] if k in self.in_place else new()
                   for k, new in enumerate(makers)]
        if any(type(t) is not torch.Tensor for t in outputs):
            return None
        run(inputs, [t.data_ptr() for t in outputs])
        for k, j in self.writes.items():
            if k not in self.in_place:
                tensors[j].copy_(outputs[k])
        return [t for k, t in enumerate(outputs) if k not in self.writes]


def _output_maker(buffer: Buffer) -> Callable[[], torch.Tensor]:
    """A function that makes an output tensor for `buffer`: `torch.empty_like` a template
    when it is small (faster than a NumPy array, its address and `torch.from_numpy`),
    from the output pool when it is large (fresh pages fault on first touch)."""
    if buffer.nbytes < OUTPUTS.min_bytes:
        template = torch.empty(buffer.shape, dtype=to_torch_dtype(buffer.dtype))
        return lambda: torch.empty_like(template)
    return lambda: array_to_tensor(OUTPUTS.array(buffer.shape, buffer.dtype.np))


class SymbolicGraphRunner:
    """Calls a graph with symbolic sizes with torch tensors: one `GraphRunner` (and its fast
    path) of code compiled for every size, else one per binding of the sizes, made when a
    call first binds them (SizeSpecialized)."""

    def __init__(self, graph: Graph, single_output: bool = False,
                 config: Config | None = None, writes: dict[int, int] | None = None):
        config = config or Config()
        self.graph = graph
        generic = None
        if config.executor == "cpu":
            def generic(g: Graph) -> GraphRunner:
                return GraphRunner(g, single_output, config, compile_graph(g, config), writes)

        self.sizes = SizeSpecialized(
            graph, lambda g: GraphRunner(g, single_output, config, writes=writes),
            config.max_specializations, generic)

    def __call__(self, *tensors: Any) -> Any:
        return self.sizes.run([tuple(t.shape) for t in tensors],
                              lambda runner: runner(*tensors))

    def run_plain(self, tensors: Sequence[Any]) -> list[torch.Tensor] | None:
        shapes = [tuple(t.shape) for t in tensors]
        try:
            self.sizes.binding(shapes)
        except (ShapeError, AttributeError):
            return None  # the general call explains
        return self.sizes.run(shapes, lambda runner: runner.run_plain(tensors))

    def accepts(self, tensors: Sequence[Any]) -> bool:
        """Whether the graph's sizes bind to these tensors' shapes."""
        return self.sizes.accepts([tuple(t.shape) for t in tensors])


def graph_runner(graph: Graph, single_output: bool = False,
                 config: Config | None = None) -> GraphRunner | SymbolicGraphRunner:
    """The runner of `graph`: symbolic sizes bound per call, or its one compiled code."""
    if is_symbolic(graph):
        return SymbolicGraphRunner(graph, single_output, config)
    return GraphRunner(graph, single_output, config)
