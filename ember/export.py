"""`ember.export` and `ember.load`: ahead-of-time libraries that run with no Python.

    ember.export(model, (x,), "out/")     # libmodel.so, model.h, model.json, main.c
    ember.export("model.onnx", [x], "out/", target="aarch64-linux-gnu")
    ember.export(model, (x,), "out/", target="sm_90")   # PTX, cubin, a JSON manifest
    run = ember.load("out/"); y = run(x)   # back in Python, for testing

The model goes through the same stages as `ember.compile` (frontend, graph passes and
fusion, lowering, schedule, memory plan, LLVM); only the last step differs: the object
code is written for the target and linked into a shared library with its C runtime and
embedded weights (ember/runtime/aot.py documents the files and the C API).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from ember.config import Config
from ember.errors import EmberError, UnsupportedOpError
from ember.graph.ir import Graph
from ember.target import Target


def _graph_of(model: Any, example_inputs: Any, dynamic: Any = None
              ) -> tuple[Graph, list[str] | None]:
    """The graph of `model` specialized to the example inputs (a torch module's sizes that
    `dynamic` names kept symbolic), and its input names."""
    from ember.api.compile import is_onnx, is_torch_module

    if isinstance(model, Graph):
        return model, [v.name or f"input{i}" for i, v in enumerate(model.inputs)]
    inputs = example_inputs if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
    if is_torch_module(model):
        from ember.frontends.torch.export import export as torch_export

        if dynamic is not None:
            from ember.frontends.torch.export import capture_program, import_program

            program, _ = capture_program(model, tuple(inputs), {}, dynamic)
            graph = import_program(program, "model")
        else:
            graph = torch_export(model, tuple(inputs))  # in the mode the caller set (eval)
        return graph, [v.name or f"input{i}" for i, v in enumerate(graph.inputs)]
    if is_onnx(model):
        from ember.frontends.onnx.importer import Importer, load_model

        proto = load_model(model)
        initializers = {t.name for t in proto.graph.initializer}
        names = [i.name for i in proto.graph.input if i.name not in initializers]
        if len(names) != len(inputs):
            raise EmberError(f"the ONNX model takes {len(names)} inputs ({', '.join(names)}),"
                             f" got {len(inputs)} example inputs")
        arrays = {n: np.asarray(x) for n, x in zip(names, inputs)}
        shapes = {n: a.shape for n, a in arrays.items()}
        return Importer(proto, shapes, arrays).run(), names
    raise EmberError(f"cannot export a {type(model).__name__}: expected a torch.nn.Module, an"
                     " ONNX model or path, or an ember Graph")


def export(model: Any, example_inputs: Any, out_dir: str | Path, *,
           target: Target | str | None = None, name: str = "model",
           config: Config | None = None, dynamic: Any = None) -> Path:
    """Compile `model` for `target` (a Target or a preset's name such as
    "aarch64-linux-gnu" or "neoverse-n1"; default: the config's, else this machine) into a
    shared library, a C header, metadata and an example program in `out_dir`; returns
    `out_dir`. The kernels are shaped for that target (its vectors, registers, caches).
    `dynamic` (a torch module's, as `ember.compile` takes it, each size with a largest
    value: `{"x": {0: torch.export.Dim("batch", max=64)}}`), or a graph with bounded
    symbolic sizes: the library takes the sizes at each run (`<name>_run_sized`)."""
    from ember.driver.pipeline import lower_to_program, resolve
    from ember.runtime.aot import write_library

    config = config or Config(executor="cpu")
    if target is not None:
        config = dataclasses.replace(config, target=target)
    config = resolve(config)  # an unknown target fails before any work
    graph, input_names = _graph_of(model, example_inputs, dynamic)
    if graph.aliases:  # (a C caller's separate output buffers would miss the input's data)
        raise UnsupportedOpError(f"graph @{graph.name} computes outputs in its inputs' memory"
                                 " (`in %input`): that is for code run in this process")
    output_names = [v.name or f"output{i}" for i, v in enumerate(graph.outputs)]
    if config.target.kind == "gpu":  # PTX, a cubin and a manifest (docs/gpu.md)
        from ember.runtime.aot import write_gpu_bundle

        program, plan = lower_to_program(graph, config)
        return write_gpu_bundle(program, plan, out_dir, config.target, name, input_names,
                                output_names)
    # Sizes known at call time stay symbolic: the library takes them at each run, up to the
    # bounds the graph gives them (ember/runtime/aot.py).
    program, plan = lower_to_program(graph, config, every_size=True)
    return write_library(program, plan, out_dir, config.target, name, input_names,
                         output_names)


def load(out_dir: str | Path):
    """A library written by `export`, as a callable of NumPy arrays (host target only)."""
    from ember.runtime.aot import Library

    return Library(out_dir)
