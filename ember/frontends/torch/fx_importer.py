"""Importing an FX graph of ATen ops into the graph IR.

Both doors use it: `ember.torch.export` (torch.export to functional ATen in one trace,
and the core ATen decompositions where an op has no converter)
and the `ember` torch.compile backend (Dynamo, then AOT Autograd). Placeholders become
graph inputs or constants, get_attr nodes constants, and each call_function node goes
through the converter registered for its ATen overload (aten_*.py). Every op remembers
the FX node and the Python source line it came from.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Mapping
from typing import Any

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.fx.node import map_arg

from ember.errors import EmberError, InternalError, UnsupportedOpError
from ember.frontends.torch.context import (
    ConvertContext,
    check_result,
    find_converter,
    overload_name,
    size_bounds_of,
    tensor_type,
    to_dim,
    to_numpy,
)
from ember.graph.builder import Builder, located
from ember.graph.ir import Graph, Value, may_update_in_place
from ember.graph.symbolic import Dim, size_bounds
from ember.util.memory import compiling

_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)\n\s*(.*)')


def source_line(node: torch.fx.Node) -> str | None:
    """`model.py:12 (forward): return self.fc(x)` for the innermost user frame, if known."""
    trace = node.meta.get("stack_trace") or ""
    frames = _FRAME.findall(trace)
    if not frames:
        return None
    path, line, func, code = frames[-1]
    return f"{path.rsplit('/', 1)[-1]}:{line} ({func}): {code.strip()}"


def node_location(node: torch.fx.Node) -> str:
    line = source_line(node)
    return f"fx {node.name}" + (f" at {line}" if line else "")


def unsupported_nodes(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "call_function"
            and n.target is not operator.getitem and not _is_size(n)
            and not writes_input(n) and find_converter(n.target) is None]


def writes_input(node: torch.fx.Node) -> bool:
    """Whether `node` writes a new value into a graph input (`copy_` into a placeholder:
    AOT Autograd's in-graph mutation of an input, a cache written in place)."""
    return (node.op == "call_function" and node.target is torch.ops.aten.copy_.default
            and isinstance(node.args[0], torch.fx.Node) and node.args[0].op == "placeholder")


def _is_size(node: torch.fx.Node) -> bool:
    """Whether `node` computes a size (sym_size, arithmetic on sizes): the importer takes
    its expression from the node's meta."""
    return isinstance(node.meta.get("val"), torch.SymInt)


def describe_unsupported(nodes: list[torch.fx.Node]) -> str:
    lines = []
    for node in nodes:
        where = source_line(node)
        lines.append(f"  aten.{overload_name(node.target)} (fx node {node.name}"
                     + (f", {where}" if where else "") + ")")
    return f"{len(nodes)} op(s) that Ember does not support:\n" + "\n".join(lines)


def import_fx(gm: torch.fx.GraphModule, constants: Mapping[str, torch.Tensor] | None = None,
              name: str = "main") -> Graph:
    """Import `gm`; placeholders named in `constants` become constants, the rest inputs."""
    graph, writes = import_fx_writing(gm, constants, name)
    if writes:
        raise UnsupportedOpError("the graph writes into its inputs (copy_)")
    return graph


def import_fx_writing(gm: torch.fx.GraphModule,
                      constants: Mapping[str, torch.Tensor] | None = None,
                      name: str = "main") -> tuple[Graph, dict[int, int]]:
    """Import `gm` as `import_fx` does, where the graph may write new values into its
    inputs (`copy_`): those values are the graph's last outputs, and output position ->
    input position says which input each one is written into."""
    graph, sizes, writes = import_fx_with_sizes(gm, constants, name)
    if sizes:
        position = next(iter(sizes))
        raise UnsupportedOpError(f"graph output {position} is a size, not a tensor")
    return graph, writes


@compiling()
def import_fx_with_sizes(gm: torch.fx.GraphModule,
                         constants: Mapping[str, torch.Tensor] | None = None,
                         name: str = "main", bounded: bool = True
                         ) -> tuple[Graph, dict[int, Any], dict[int, int]]:
    """Import `gm` as `import_fx_writing` does, where some outputs may be sizes (AOT
    Autograd returns the sizes of its graphs' outputs): the graph of the tensor outputs,
    position -> size (an int or a Dim of the inputs' sizes) for the others, and the
    writes into inputs. SymInt placeholders are not inputs: their values are sizes of
    the tensor inputs. Not `bounded`: without the bounds PyTorch knows of the sizes (an
    op that needs one raises SymbolicShapeError)."""
    missing = unsupported_nodes(gm)
    if missing:
        raise UnsupportedOpError("the graph uses " + describe_unsupported(missing))
    constants = constants or {}
    gm.graph.eliminate_dead_code()  # raw traces keep unused nodes (max_pool's indices, say)
    b = Builder(name)
    b.graph.size_bounds = size_bounds_of([n.meta.get("val") for n in gm.graph.nodes
                                          if n.op == "placeholder"]) if bounded else {}
    env: dict[torch.fx.Node, Any] = {}
    outputs: list[Value] = []
    sizes: dict[int, Any] = {}
    written: dict[Value, Value] = {}  # graph input -> the value written into it
    with size_bounds(b.graph.size_bounds):  # the converters compare sizes too
        for node in gm.graph.nodes:
            if _is_size(node):
                # A size (Dynamo passes sizes as inputs; sym_size and arithmetic on sizes):
                # its expression, which the ops that take it read as a Dim.
                env[node] = to_dim(node.meta["val"], f"FX node {node.name}")
            elif node.op == "placeholder":
                if node.name in constants:
                    env[node] = b.constant(to_numpy(constants[node.name]), name=node.name)
                else:
                    t = tensor_type(node.meta.get("val"), f"input {node.name}")
                    env[node] = b.input(node.name, t.dtype, t.shape)
            elif node.op == "get_attr":
                attr = _fetch_attr(gm, node.target)
                if isinstance(attr, torch.Tensor):
                    # Under torch.compile a fake-tensor mode may be active; constants are real.
                    with unset_fake_temporarily():
                        env[node] = b.constant(to_numpy(attr), name=node.name)
                else:
                    env[node] = attr
            elif writes_input(node):
                target = env[node.args[0]]
                written[target] = env[node] = _written_value(node, env[node.args[1]], target, b)
            elif node.op == "call_function":
                env[node] = _convert(node, env, b)
            elif node.op == "output":
                flat = torch.utils._pytree.tree_leaves(node.args[0])
                for position, item in enumerate(flat):
                    value = env.get(item) if isinstance(item, torch.fx.Node) else item
                    if isinstance(value, Value):
                        outputs.append(value)
                    elif isinstance(value, (int, Dim)) and not isinstance(value, bool):
                        sizes[position] = value
                    else:
                        raise UnsupportedOpError(f"graph output {item} is not a tensor")
            else:
                raise UnsupportedOpError(f"FX node {node.name}: '{node.op}' nodes are not"
                                         " supported")
    positions = {id(v): i for i, v in enumerate(b.graph.inputs)}
    writes = {len(outputs) + k: positions[id(target)] for k, target in enumerate(written)}
    b.output(*outputs, *written.values())
    graph = b.build()
    # A scatter into the input that is its only reader (a cache's new rows) is computed in
    # the input's memory: the kernel writes the new rows, and nothing is copied.
    graph.aliases = {k: j for k, j in writes.items() if may_update_in_place(graph, k, j)}
    return graph, sizes, writes


def _written_value(node: torch.fx.Node, value: Any, target: Value, b: Builder) -> Value:
    """The value that `copy_` writes into the input `target`: cast and broadcast to it."""
    b.loc = node_location(node)
    ctx = ConvertContext(node, b)
    value = ctx.as_value(value, target.dtype)
    if value.shape != target.shape:
        value = b.broadcast(value, shape=list(target.shape))
    return value


def _convert(node: torch.fx.Node, env: dict, b: Builder) -> Any:
    args = map_arg(node.args, lambda n: env[n])
    kwargs = map_arg(node.kwargs, lambda n: env[n])
    if node.target is operator.getitem:
        return args[0][args[1]]
    b.loc = node_location(node)
    ctx = ConvertContext(node, b)
    try:
        result = find_converter(node.target)(ctx, *args, **kwargs)
    except EmberError as e:
        raise e if ctx.where in str(e) else located(e, f"aten.{overload_name(node.target)}"
                                                      f" ({ctx.where})") from None
    except (ArithmeticError, LookupError, TypeError, ValueError, AttributeError) as e:
        # A node the converter did not expect: an error naming the node, not a traceback
        # from inside the converter.
        raise InternalError(f"aten.{overload_name(node.target)} ({ctx.where}): the converter"
                            f" failed on this node ({type(e).__name__}: {e})") from e
    check_result(ctx, list(result) if isinstance(result, (tuple, list)) else [result])
    return result


def _fetch_attr(gm: torch.nn.Module, target: str) -> Any:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj
