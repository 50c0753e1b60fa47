"""ONNX op converters, one module per family. Importing this package registers them."""

from ember.frontends.onnx.ops import (  # noqa: F401  (registration)
    attention,
    control,
    elementwise,
    nn,
    tensor,
)
