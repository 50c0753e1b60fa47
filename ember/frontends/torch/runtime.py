"""Running an imported graph on torch tensors: NumPy views in, torch tensors out.

The executor is compiled code or the reference interpreter (Config.executor); tensors
cross the boundary without copies where NumPy can view them (contiguous CPU tensors).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ember.config import Config
from ember.dtypes import DType
from ember.errors import ShapeError
from ember.frontends.torch.context import to_dtype, to_torch_dtype
from ember.graph.ir import Graph
from ember.runtime.executable import Executable


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
                 config: Config | None = None, executable: Any = None):
        """Runs `graph` (compiled by `config`), or an already compiled `executable` (the
        warm path, which has no graph)."""
        from ember.driver.compile import executor_for

        self.graph = graph
        self.single_output = single_output
        self.run = executable if executable is not None else \
            executor_for(graph, config or Config())
        self.input_dtypes = [b.dtype for b in executable.interface.inputs] \
            if executable is not None else [v.dtype for v in graph.inputs]
        # Compiled code takes tensors by their data addresses, with no NumPy views between:
        # the views cost more than the kernels of a small model.
        compiled = isinstance(self.run, Executable)
        self._expected = [(to_torch_dtype(b.dtype), b.shape) for b in self.run.input_types] \
            if compiled else None
        self._plain_outputs = compiled and all(b.dtype is not DType.bf16
                                               for b in self.run.output_types)

    def __call__(self, *tensors: Any) -> Any:
        if self._expected is not None and len(tensors) == len(self._expected) and all(
                type(t) is torch.Tensor and t.dtype is dtype and t.shape == shape and t.is_cpu
                and t.is_contiguous() and not t.is_neg()
                for t, (dtype, shape) in zip(tensors, self._expected)):
            arrays = self.run.run_addresses([t.data_ptr() for t in tensors])
            outputs = [torch.from_numpy(a) if self._plain_outputs else array_to_tensor(a)
                       for a in arrays]
            return outputs[0] if self.single_output else outputs
        arrays = []
        for i, (dtype, tensor) in enumerate(zip(self.input_dtypes, tensors)):
            if isinstance(tensor, torch.Tensor) and to_dtype(tensor.dtype) is not dtype:
                raise ShapeError(f"input {i}: expected {dtype}, got {tensor.dtype}")
            arrays.append(tensor_to_array(tensor))
        outputs = [array_to_tensor(a) for a in self.run(*arrays)]
        return outputs[0] if self.single_output else outputs
