"""Capture by tracing: torch.export to functional ATen in one trace, then the FX importer.

torch.export's public path traces twice: to the training IR (views and in-place ops, ops
above ATen such as `linear`), then again to decompose it (`run_decompositions`), which
takes half the time of a cold compile. Export's own ATen dispatch (`pre_dispatch=False`)
gives functional ATen in one trace; the core decompositions run only when that graph
holds an op the importer has no converter for.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import torch
from torch.export.graph_signature import InputKind, OutputKind

from ember.errors import EmberError, UnsupportedOpError
from ember.frontends.torch.fx_importer import import_fx, unsupported_nodes
from ember.graph.ir import Graph, sanitize_name
from ember.util.memory import compiling


@compiling()
def capture_program(module: torch.nn.Module, args: Sequence[Any], kwargs: dict | None = None,
                    dynamic: Any = None) -> tuple[torch.export.ExportedProgram, Any]:
    """`module` exported in eval mode without gradients, to functional ATen ops that the
    importer converts (`_aten_program`, then the core decompositions if one has none); also
    the pytree spec of its output structure. `dynamic`: the dims to keep symbolic
    (`dynamic_shapes`, see `dynamic_shapes`)."""
    if not isinstance(module, torch.nn.Module):
        raise EmberError(f"expected a torch.nn.Module, got {type(module).__name__}")
    module.eval()
    shapes = dynamic_shapes(dynamic, module, tuple(args), dict(kwargs or {}))
    try:
        with torch.no_grad():
            program = _aten_program(module, tuple(args), dict(kwargs or {}), shapes)
            if unsupported_nodes(program.graph_module):
                program = program.run_decompositions()
    except Exception as e:  # torch.export raises many kinds; all mean "cannot capture"
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise EmberError(f"torch.export could not capture {type(module).__name__} on these"
                         f" inputs: {type(e).__name__}: {first}") from e
    if any(s.kind != OutputKind.USER_OUTPUT for s in program.graph_signature.output_specs):
        raise UnsupportedOpError(f"{type(module).__name__} mutates its buffers in forward;"
                                 " Ember compiles inference graphs only")
    return program, program.module_call_graph[0].signature.out_spec


def _aten_program(module: torch.nn.Module, args: tuple, kwargs: dict,
                  shapes: Any) -> torch.export.ExportedProgram:
    """`module` traced once to functional ATen, through torch.export's own ATen dispatch
    (a private entry: where this torch lacks it, the public export and the core
    decompositions)."""
    try:
        from torch.export._trace import _export
    except ImportError:
        _export = None
    if _export is None or "pre_dispatch" not in inspect.signature(_export).parameters:
        return torch.export.export(module, args, kwargs,
                                   dynamic_shapes=shapes).run_decompositions()
    return _export(module, args, kwargs, shapes, strict=False, pre_dispatch=False)


def dynamic_shapes(dynamic: Any, module: torch.nn.Module, args: tuple, kwargs: dict) -> Any:
    """torch.export's `dynamic_shapes` for `dynamic`: None (every size static); True (every
    dim of every tensor input may vary: torch.export keeps symbolic those the model lets
    vary); or torch.export's own form (per input, by position or by the forward's
    parameter names, a dict from axis to a `torch.export.Dim`), where a string names a Dim
    (`{"x": {0: "batch"}}`; one name, one size)."""
    if dynamic is None or dynamic is False:
        return None
    if dynamic is True:
        def every_dim(x: Any) -> Any:
            return {axis: torch.export.Dim.AUTO for axis in range(x.dim())} \
                if isinstance(x, torch.Tensor) else None

        if not kwargs:
            return torch.utils._pytree.tree_map(every_dim, args)
        # With keywords, by the forward's parameter names (a tuple is positional only).
        bound = inspect.signature(module.forward).bind(*args, **kwargs)
        return {name: torch.utils._pytree.tree_map(every_dim, value)
                for name, value in bound.arguments.items()}
    dims: dict[str, Any] = {}

    def named(x: Any) -> Any:
        if isinstance(x, str):
            return dims.setdefault(x, torch.export.Dim(x))
        if isinstance(x, dict):
            return {k: named(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return type(x)(named(v) for v in x)
        return x

    return named(dynamic)


def program_constants(program: torch.export.ExportedProgram) -> dict[str, torch.Tensor]:
    """Placeholder name -> tensor for the parameters, buffers and constants of `program`."""
    constants = {}
    for spec in program.graph_signature.input_specs:
        if spec.kind == InputKind.USER_INPUT:
            continue
        if spec.kind not in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
            raise UnsupportedOpError(f"export input of kind {spec.kind.name} is not supported")
        source = program.state_dict if spec.target in program.state_dict else program.constants
        constants[spec.arg.name] = source[spec.target]
    return constants


def import_program(program: torch.export.ExportedProgram, name: str = "main") -> Graph:
    """The graph IR of an exported (and decomposed) program."""
    return import_fx(program.graph_module, program_constants(program), name)


def export(module: torch.nn.Module, example_args: Sequence[Any],
           example_kwargs: dict | None = None) -> Graph:
    """The graph IR of `module` traced on the example inputs.

    Parameters and buffers become constants; the graph's inputs are the tensors of
    (example_args, example_kwargs) in pytree order. Each op's `loc` names its FX node and
    Python source line.
    """
    program, _ = capture_program(module, example_args, example_kwargs)
    return import_program(program, sanitize_name(type(module).__name__) or "main")
