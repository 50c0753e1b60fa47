"""The `ember` backend of torch.compile: `torch.compile(model, backend="ember")`.

Dynamo captures a graph, AOT Autograd lowers it to core ATen ops (parameters become
inputs), and Ember imports and runs it. A graph with ops Ember does not support still
runs: the supported parts are compiled, the rest falls back to eager, with one warning
naming the ops; `counters` shows how many graphs and ops fell back. With
`options={"strict": True}` an unsupported op raises UnsupportedOpError instead;
`options={"executor": "interp"}` runs the reference interpreter instead of compiled code
(default: `Config()`: compiled, unless EMBER_BACKEND says otherwise).
"""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch._decomp import core_aten_decompositions
from torch._dynamo.backends.common import aot_autograd

from ember.api.torch_fallback import partition
from ember.api.torch_runner import GraphRunner
from ember.config import Config
from ember.errors import UnsupportedOpError
from ember.frontends.torch.fx_importer import describe_unsupported, import_fx, unsupported_nodes

# graphs: graphs compiled; fallback_graphs: those with eager parts; fallback_ops: op counts
counters: Counter = Counter()
_warned: set[str] = set()


def _compile_graph(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], strict: bool,
                   config: Config) -> Callable[..., Any]:
    counters["graphs"] += 1
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
    config = Config(**options)

    def compile_forward(fx_module: torch.fx.GraphModule, inputs: Sequence[Any]):
        compiled = _compile_graph(fx_module, inputs, strict, config)
        return _boxed(compiled)

    backend = aot_autograd(fw_compiler=compile_forward,
                           decompositions=core_aten_decompositions())
    return backend(gm, example_inputs)


def _boxed(fn: Callable[..., Any]) -> Callable[..., Any]:
    """AOT Autograd calls compiled functions with one list of arguments ("boxed")."""

    def run(args: list[Any]) -> Any:
        result = fn(*args)
        args.clear()
        return result

    run._boxed_call = True  # noqa: SLF001  (AOT Autograd's convention)
    return run
