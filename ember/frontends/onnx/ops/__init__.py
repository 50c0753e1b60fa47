"""ONNX op converters, one module per family. Importing this package registers them."""

from ember.frontends.onnx.ops import (  # noqa: F401  (registration)
    activation,
    attention,
    control,
    elementwise,
    generator,
    loss,
    nn,
    nn_conv,
    nn_norm,
    nn_quant,
    nn_resize,
    recurrent,
    rnn,
    sampling,
    signal,
    tensor,
    tensor_index,
)
