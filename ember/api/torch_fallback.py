"""Running a graph whose unsupported ops fall back to eager PyTorch.

The supported ops are grouped into maximal partitions (torch.fx's capability-based
partitioner), each imported and run by Ember; the rest of the graph runs in eager mode
around them.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupport

from ember.api.torch_runner import GraphRunner
from ember.config import Config
from ember.frontends.torch.context import find_converter
from ember.frontends.torch.export import program_constants
from ember.frontends.torch.fx_importer import import_fx, unsupported_nodes


class _EmberSupport(OperatorSupport):
    def is_node_supported(self, submodules: Any, node: torch.fx.Node) -> bool:
        return node.op == "call_function" and (node.target is operator.getitem
                                               or find_converter(node.target) is not None)


class _Partition(torch.nn.Module):
    """A partition run by Ember, called like the GraphModule it replaces."""

    def __init__(self, runner: GraphRunner):
        super().__init__()
        self.runner = runner

    def forward(self, *args: Any) -> Any:
        return self.runner(*args)


def partition(gm: torch.fx.GraphModule, config: Config | None = None
              ) -> tuple[torch.fx.GraphModule, list[str]]:
    """`gm` with its supported parts replaced by Ember partitions; and the eager op names."""
    eager = sorted({str(n.target) for n in unsupported_nodes(gm)})
    fused = CapabilityBasedPartitioner(gm, _EmberSupport(),
                                       allows_single_node_partition=True).partition_and_fuse()
    for name, sub in list(fused.named_children()):
        if isinstance(sub, torch.fx.GraphModule):
            output = next(n for n in sub.graph.nodes if n.op == "output")
            single = not isinstance(output.args[0], (tuple, list))
            runner = GraphRunner(import_fx(sub, name=name), single_output=single, config=config)
            setattr(fused, name, _Partition(runner))
    fused.recompile()
    return fused, eager


class FallbackRunner:
    """An exported program run partly by Ember, partly in eager mode."""

    def __init__(self, program: torch.export.ExportedProgram, config: Config | None = None):
        self.module, self.eager_ops = partition(program.graph_module, config)
        constants = program_constants(program)
        placeholders = [n.name for n in program.graph_module.graph.nodes
                        if n.op == "placeholder"]
        self.constants = [constants.get(name) for name in placeholders]

    def describe(self) -> str:
        return f"{len(self.eager_ops)} unsupported op(s) ({', '.join(self.eager_ops)})"

    def __call__(self, *inputs: torch.Tensor) -> list[torch.Tensor]:
        it = iter(inputs)
        args = [c if c is not None else next(it) for c in self.constants]
        with torch.no_grad():
            out = self.module(*args)
        return list(out) if isinstance(out, (tuple, list)) else [out]
