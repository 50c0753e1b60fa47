"""Converters of core ATen copies and casts (`_to_copy`, `clone`, `copy`, ...) and of the
ops that create tensors (full, zeros, ones, empty, scalar_tensor and their `_like`
and `new_` forms). Random ones (rand, randn, bernoulli, ...) are left unsupported: Ember
cannot reproduce PyTorch's generator.
"""

from __future__ import annotations

import torch

from ember.frontends.torch.aten_pointwise import filled
from ember.frontends.torch.context import ConvertContext, aten


# -- copies and casts ----------------------------------------------------------------------
def check_placement(ctx: ConvertContext, device=None, layout=None, memory_format=None,
                    pin_memory=None, non_blocking=False) -> None:
    """Ember computes on CPU tensors in strided layout (any memory format: the values are
    the same); other requests are refused rather than ignored."""
    if device is not None and torch.device(device).type != "cpu":
        raise ctx.unsupported(f"device {device}")
    if layout not in (None, torch.strided):
        raise ctx.unsupported(f"layout {layout}")
    # Ember's values have no layout: a channels-last copy holds the same values.
    if memory_format not in (None, torch.contiguous_format, torch.preserve_format,
                             torch.channels_last, torch.channels_last_3d):
        raise ctx.unsupported(f"memory_format {memory_format}")


@aten("_to_copy.default")
def to_copy(ctx: ConvertContext, x, dtype=None, **placement):
    check_placement(ctx, **placement)
    return ctx.as_value(x, ctx.result_type().dtype)  # floats to integers truncate in both


@aten("clone.default", "detach.default", "lift_fresh_copy.default")
def identity(ctx: ConvertContext, x, memory_format=None):
    check_placement(ctx, memory_format=memory_format)
    return x  # values are immutable in the IR: a copy is the value itself


@aten("copy.default")
def copy(ctx: ConvertContext, x, src, non_blocking=False):
    src = ctx.as_value(src, x.dtype)
    return src if src.type.shape == x.type.shape else ctx.b.broadcast(src, shape=x.type.shape)


@aten("_assert_tensor_metadata.default")
def assert_metadata(ctx: ConvertContext, x, *args, **kwargs):
    return None  # torch.export checked the metadata when it traced; there is nothing to run


@aten("full.default", "new_full.default")
def full(ctx: ConvertContext, *args, dtype=None, **placement):
    check_placement(ctx, **placement)
    return filled(ctx, args[-1])  # (size, value) or (self, size, value)


@aten("full_like.default", "fill.Scalar", "fill.Tensor")
def full_like(ctx: ConvertContext, x, value, dtype=None, **placement):
    check_placement(ctx, **placement)
    return filled(ctx, value)


# empty's values are unspecified, so zeros are one correct choice (and a deterministic one).
@aten("zeros.default", "zeros_like.default", "new_zeros.default", "empty.memory_format",
      "empty_like.default", "new_empty.default", "empty_permuted.default",
      "empty_strided.default", "new_empty_strided.default")
def zeros(ctx: ConvertContext, *args, dtype=None, **placement):
    check_placement(ctx, **placement)
    return filled(ctx, 0)


@aten("ones.default", "ones_like.default", "new_ones.default")
def ones(ctx: ConvertContext, *args, dtype=None, **placement):
    check_placement(ctx, **placement)
    return filled(ctx, 1)


@aten("scalar_tensor.default")
def scalar_tensor(ctx: ConvertContext, value, dtype=None, **placement):
    check_placement(ctx, **placement)
    return filled(ctx, value)
