"""Composite ops: activations, softmax, mean/variance reductions, normalizations, attention.

Each has type inference and a direct NumPy reference like any op, plus a decomposition
that emits primitive ops (or other composites; the decompose pass repeats until only
primitives remain) computing the same thing with exactly the composite's result types.
Decompositions of f16/bf16 operands cast to f32, compute there and cast the result back,
so that they round once at the output as the reference does.
"""


from ember.graph.ops.composite import activation, attention, normalization  # noqa: F401
