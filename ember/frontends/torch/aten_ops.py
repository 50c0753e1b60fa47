"""The ATen op converters, one module per family; importing this module registers them."""

from ember.frontends.torch import (  # noqa: F401  (registration)
    aten_creation,
    aten_index,
    aten_linalg,
    aten_math,
    aten_nn,
    aten_pointwise,
    aten_reduce,
    aten_special,
    aten_tensor,
)
