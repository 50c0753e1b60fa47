"""Converters of core ATen reductions (sum, mean, prod, amax, max.dim, argmax, var, any,
...), running sums and products, and softmax.

Reductions compute in the dtype PyTorch recorded for the result (integer and bool sums
are i64), so the operand is cast first. ATen's `dim` comes as None, an int or a list;
an empty list means every dim for most reductions but none for any.dims and all.dims.
"""

from __future__ import annotations

from ember.dtypes import DType
from ember.frontends.torch.aten_pointwise import op_name, require
from ember.frontends.torch.context import ConvertContext, aten
from ember.graph.ir import Value


def _axes(ctx: ConvertContext, x: Value, dim, empty_is_all: bool = True) -> tuple[int, ...]:
    """The IR axes of ATen's `dim` on `x` (a scalar has none: its dim 0 or -1 reduces
    nothing)."""
    if x.type.rank == 0:
        require(ctx, dim is None or all(d in (0, -1) for d in _as_list(dim)),
                f"dim {dim} of a scalar")
        return ()
    if dim is None or (not _as_list(dim) and empty_is_all):
        return tuple(range(x.type.rank))
    return tuple(sorted({d % x.type.rank for d in _as_list(dim)}))


def _as_list(dim) -> list[int]:
    return [dim] if isinstance(dim, int) else list(dim or [])


def _numeric(ctx: ConvertContext, x: Value) -> Value:
    """Bools as u8 for the ops that order numbers (False < True)."""
    return ctx.b.cast(x, to=DType.u8) if x.dtype is DType.bool else x


def _finish(ctx: ConvertContext, x: Value, index: int | None = None) -> Value:
    return ctx.as_value(x, ctx.result_type(index).dtype)


# -- sum, mean, prod, amax, amin -----------------------------------------------------------
_REDUCERS = {"sum": "reduce_sum", "mean": "reduce_mean", "prod": "reduce_prod",
             "amax": "reduce_max", "amin": "reduce_min", "max": "reduce_max",
             "min": "reduce_min"}


@aten("sum.default", "sum.dim_IntList", "mean.default", "mean.dim", "prod.default",
      "prod.dim_int", "amax.default", "amin.default", "max.default", "min.default")
def reduce(ctx: ConvertContext, x, dim=None, keepdim=False, dtype=None):
    op = op_name(ctx)
    out_dtype = ctx.result_type().dtype
    if op in ("amax", "amin", "max", "min"):
        x = _numeric(ctx, x)  # the extremes keep the operand's dtype
    else:
        require(ctx, op != "mean" or out_dtype.is_float, "mean of integers")
        x = ctx.as_value(x, out_dtype)  # ATen accumulates in the result dtype
    out = getattr(ctx.b, _REDUCERS[op])(x, axes=_axes(ctx, x, dim), keepdims=bool(keepdim))
    return _finish(ctx, out)


@aten("max.dim", "min.dim")
def extreme_with_index(ctx: ConvertContext, x, dim, keepdim=False):
    """(values, indices) along `dim`; NaN wins and the first of equal extremes is chosen."""
    largest = op_name(ctx) == "max"
    x = _numeric(ctx, x)
    axes = _axes(ctx, x, dim)
    if not axes:  # a scalar is its own extreme, at index 0
        return _finish(ctx, x, 0), ctx.constant(0, DType.i64)
    values = (ctx.b.reduce_max if largest else ctx.b.reduce_min)(
        x, axes=axes, keepdims=bool(keepdim))
    indices = (ctx.b.argmax if largest else ctx.b.argmin)(
        x, axis=axes[0], keepdims=bool(keepdim))
    return _finish(ctx, values, 0), indices


@aten("argmax.default", "argmin.default")
def arg_extreme(ctx: ConvertContext, x, dim=None, keepdim=False):
    b, t = ctx.b, ctx.result_type()
    x = _numeric(ctx, x)
    if x.type.rank == 0:
        return ctx.constant(0, DType.i64)
    if dim is None:  # the index into the flattened tensor, shaped all-ones with keepdim
        x = b.reshape(x, shape=(x.type.numel,)) if x.type.rank != 1 else x
        dim = 0
    out = getattr(b, op_name(ctx))(x, axis=dim % x.type.rank, keepdims=bool(keepdim))
    return out if out.type.shape == t.shape else b.reshape(out, shape=t.shape)


# -- var, std ------------------------------------------------------------------------------
def _var(ctx: ConvertContext, x: Value, dim, correction, keepdim) -> Value:
    correction = 1 if correction is None else correction
    require(ctx, x.dtype.is_float, f"variance of {x.dtype}")
    axes = _axes(ctx, x, dim)
    if float(correction).is_integer() and correction >= 0:
        return ctx.b.reduce_var(x, axes=axes, keepdims=bool(keepdim),
                                correction=int(correction))
    # A fractional or negative correction: sum((x - mean)**2) / max(N - correction, 0), as ATen's.
    b = ctx.b
    count = 1
    for a in axes:
        count *= x.shape[a]
    d = b.sub(x, b.reduce_mean(x, axes=axes, keepdims=True))
    total = b.reduce_sum(b.mul(d, d), axes=axes, keepdims=bool(keepdim))
    return b.div(total, ctx.constant(max(count - correction, 0), x.dtype))


@aten("var.correction", "std.correction")
def var_std(ctx: ConvertContext, x, dim=None, correction=None, keepdim=False):
    var = _var(ctx, x, dim, correction, keepdim)
    return ctx.b.sqrt(var) if op_name(ctx) == "std" else var


@aten("var_mean.correction")
def var_mean(ctx: ConvertContext, x, dim=None, correction=None, keepdim=False):
    mean = ctx.b.reduce_mean(x, axes=_axes(ctx, x, dim), keepdims=bool(keepdim))
    return _var(ctx, x, dim, correction, keepdim), mean


# -- any, all ------------------------------------------------------------------------------
@aten("any.default", "any.dim", "any.dims", "all.default", "all.dim", "all.dims")
def any_all(ctx: ConvertContext, x, dim=None, keepdim=False):
    # On x != 0 (NaN counts as true) as 0/1 bytes: any is their max, all their min.
    truth = ctx.b.cast(ctx.as_value(x, DType.bool), to=DType.u8)
    reducer = ctx.b.reduce_max if op_name(ctx) == "any" else ctx.b.reduce_min
    out = reducer(truth, axes=_axes(ctx, x, dim, empty_is_all=False), keepdims=bool(keepdim))
    return _finish(ctx, out)  # bool, or u8 for a u8 operand (ATen's legacy rule)


# -- running sums and products, softmax ----------------------------------------------------
@aten("cumsum.default", "cumprod.default")
def cumulative(ctx: ConvertContext, x, dim, dtype=None):
    x = _finish(ctx, x)  # integers and bools accumulate in i64
    if x.type.rank == 0:
        return x
    return getattr(ctx.b, op_name(ctx))(x, axis=dim % x.type.rank)


@aten("_softmax.default", "_log_softmax.default")
def softmax(ctx: ConvertContext, x, dim, half_to_float=False):
    b = ctx.b
    op = "softmax" if op_name(ctx) == "_softmax" else "log_softmax"
    x = _finish(ctx, x)  # half_to_float: f16 in, f32 out
    if x.type.rank == 0:  # the IR's softmax wants an axis: view the scalar as [1]
        return b.reshape(getattr(b, op)(b.reshape(x, shape=(1,)), axis=0), shape=())
    return getattr(b, op)(x, axis=dim % x.type.rank)
