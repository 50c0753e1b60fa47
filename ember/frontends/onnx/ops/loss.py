"""Converters of the ONNX loss ops: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss."""

from __future__ import annotations

from ember.dtypes import DType
from ember.frontends.onnx.context import ConvertContext, converter
from ember.graph.ir import Value

REDUCTIONS = ("none", "sum", "mean")


@converter("NegativeLogLikelihoodLoss", since=12)
def negative_log_likelihood_loss(ctx: ConvertContext):
    return _nll(ctx, ctx.require(0))


@converter("SoftmaxCrossEntropyLoss", since=12)
def softmax_cross_entropy_loss(ctx: ConvertContext):
    """The NLL of log_softmax(scores) over the class axis; the log-probabilities are the
    optional second output."""
    log_prob = ctx.b.log_softmax(ctx.require(0), axis=1)
    return [_nll(ctx, log_prob), log_prob]


def _nll(ctx: ConvertContext, log_prob: Value) -> Value:
    """-log_prob[n, target[n, d...], d...] * weight[target], 0 where target is ignore_index;
    'mean' divides the sum by the total weight of the samples not ignored."""
    b = ctx.b
    target, weight = ctx.require(1), ctx.input(2)
    reduction = ctx.attr("reduction", "mean")
    ignore = ctx.attr("ignore_index")
    if reduction not in REDUCTIONS:
        raise ctx.error(f"reduction '{reduction}' is not one of {', '.join(REDUCTIONS)}")
    shape = log_prob.shape
    if log_prob.type.rank < 2 or target.shape != shape[:1] + shape[2:]:
        raise ctx.error(f"input {log_prob.type} must be [N, C, d...] and target"
                        f" {target.type} [N, d...]")
    dtype = log_prob.dtype
    zero = b.constant(0, dtype=dtype)
    if not target.dtype.is_int:
        raise ctx.error(f"target {target.type} must be integer")
    target = target if target.dtype is DType.i64 else b.cast(target, to=DType.i64)
    keep = None
    if ignore is not None:  # ignored targets may be any value: gather at class 0 instead
        keep = b.ne(target, ignore)
        target = b.where(keep, target, 0)
    index = b.reshape(target, shape=(shape[0], 1, *shape[2:]))
    loss = b.neg(b.reshape(b.gather_elements(log_prob, index, axis=1), shape=target.shape))
    if keep is not None:
        loss = b.where(keep, loss, zero)
    sample_weight = None
    if weight is not None:
        sample_weight = b.gather(weight, target, axis=0)
        if keep is not None:
            sample_weight = b.where(keep, sample_weight, zero)
        loss = b.mul(loss, sample_weight)
    elif keep is not None:
        sample_weight = b.cast(keep, to=dtype)
    if reduction == "none":
        return loss
    axes = tuple(range(loss.type.rank))
    total = b.reduce_sum(loss, axes=axes)
    if reduction == "sum":
        return total
    if sample_weight is None:
        return b.reduce_mean(loss, axes=axes)
    return b.div(total, b.reduce_sum(sample_weight, axes=axes))
