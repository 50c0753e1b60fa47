"""The API layer: the objects that `ember.compile`, `ember.torch` and `ember.onnx` hand
out. They join a frontend (model -> graph IR) to the driver (graph -> running code); the
frontends and the driver know nothing of each other.

    compile.py        ember.compile: dispatch on the kind of model; CompiledGraph
    torch_module.py   a compiled nn.Module, specialized per input signature
    torch_runner.py   a graph run on torch tensors
    torch_fallback.py unsupported ops run in eager PyTorch between Ember partitions
    torch_dynamo.py   the `ember` torch.compile backend
    onnx_backend.py   the ONNX Backend API
"""
