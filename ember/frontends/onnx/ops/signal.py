"""Converters of ONNX signal ops: DFT, STFT and MelWeightMatrix.

ONNX holds complex values as a trailing axis of 1 (real) or 2 (real, imaginary). A DFT of
length N is linear in its input, so it is one matmul: the transformed axis and the
complex axis flatten into one, against a constant matrix of cosines and sines.
"""

from __future__ import annotations

import numpy as np

from ember.frontends.onnx.context import ConvertContext, converter, onnx_dtype
from ember.graph.builder import Builder
from ember.graph.ir import Value


def dft_matrix(n_in: int, parts_in: int, n: int, inverse: bool, onesided: bool) -> np.ndarray:
    """The matrix taking n_in samples of `parts_in` components (flattened sample-major) to
    the transform's output, flattened the same way (f64).

    Forward and inverse complex DFTs of length n give n (onesided forward: n // 2 + 1)
    complex values; the onesided inverse (IRFFT) takes the n // 2 + 1 first bins of a
    Hermitian spectrum to n real samples.
    """
    sign = 1.0 if inverse else -1.0
    scale = 1.0 / n if inverse else 1.0
    if inverse and onesided:
        k = np.arange(n_in)[:, None]
        t = np.arange(n)[None, :]
        theta = 2 * np.pi * ((k * t) % n) / n
        # Bins strictly between 0 and n/2 stand for their mirror images too.
        weight = np.where((k == 0) | (2 * k == n), 1.0, 2.0) * scale
        rows = [weight * np.cos(theta), -weight * np.sin(theta)][:parts_in]
        return np.stack(rows, axis=1).reshape(n_in * parts_in, n)
    n_out = n // 2 + 1 if onesided else n
    t = np.arange(n_in)[:, None]
    k = np.arange(n_out)[None, :]
    theta = sign * 2 * np.pi * ((k * t) % n) / n
    cos, sin = np.cos(theta) * scale, np.sin(theta) * scale
    # (a + ib) e^{i theta} = (a cos - b sin) + i (a sin + b cos)
    blocks = [np.stack([cos, sin], axis=-1), np.stack([-sin, cos], axis=-1)][:parts_in]
    return np.stack(blocks, axis=1).reshape(n_in * parts_in, n_out * 2)


def fit_length(b: Builder, x: Value, axis: int, length: int) -> Value:
    """x cut or zero-padded to `length` along `axis`."""
    size = x.shape[axis]
    if length < size:
        ends = list(x.shape)
        ends[axis] = length
        return b.slice(x, starts=[0] * x.type.rank, ends=ends, steps=[1] * x.type.rank)
    if length > size:
        pads = [0] * (2 * x.type.rank)
        pads[x.type.rank + axis] = length - size
        return b.pad(x, pads=pads)
    return x


def dft(b: Builder, x: Value, axis: int, n: int, inverse: bool, onesided: bool) -> Value:
    """The DFT of x [..., L at axis, ..., 1 or 2] along `axis`, in ONNX's layout."""
    rank, parts = x.type.rank, x.shape[-1]
    # Bring the axis next to the complex axis: [..., L, parts].
    perm = [a for a in range(rank - 1) if a != axis] + [axis, rank - 1]
    moved = b.transpose(x, perm=perm) if axis != rank - 2 else x
    n_in = n // 2 + 1 if inverse and onesided else n
    moved = fit_length(b, moved, rank - 2, n_in)
    lead = moved.shape[:-2]
    flat = b.reshape(moved, shape=(*lead, n_in * parts))
    matrix = dft_matrix(n_in, parts, n, inverse, onesided)
    out = b.matmul(flat, b.constant(matrix.astype(x.dtype.np)))
    parts_out = 1 if inverse and onesided else 2
    out = b.reshape(out, shape=(*lead, out.shape[-1] // parts_out, parts_out))
    if axis == rank - 2:
        return out
    # Put the transformed axis back where it was.
    order = list(range(rank - 2))
    order.insert(axis, rank - 2)
    return b.transpose(out, perm=[*order, rank - 1])


@converter("DFT", since=17)
def dft_op(ctx: ConvertContext):
    x = ctx.require(0)
    rank = x.type.rank
    if ctx.opset >= 20:
        axis = int(ctx.const(2, "axis")) if ctx.input(2) is not None else -2
    else:
        axis = ctx.attr("axis", 1)
    if not (-rank <= axis < rank - 1) or axis == -1:
        raise ctx.error(f"axis {axis} is out of range for input {x.type}")
    axis %= rank
    inverse, onesided = bool(ctx.attr("inverse", 0)), bool(ctx.attr("onesided", 0))
    if x.shape[-1] not in (1, 2):
        raise ctx.error(f"the last axis of the input must be 1 or 2, got {x.type}")
    if ctx.input(1) is not None:
        n = int(ctx.const(1, "dft_length"))
    else:
        n = 2 * (x.shape[axis] - 1) if inverse and onesided else x.shape[axis]
    if n < 1:
        raise ctx.error(f"dft_length must be positive, got {n}")
    return dft(ctx.b, x, axis, n, inverse, onesided)


@converter("STFT", since=17)
def stft(ctx: ConvertContext):
    b, signal = ctx.b, ctx.require(0)
    if signal.type.rank != 3 or signal.shape[-1] not in (1, 2):
        raise ctx.error(f"the signal must be [batch, length, 1 or 2], got {signal.type}")
    length = signal.shape[1]
    step = int(ctx.const(1, "frame_step"))
    window = ctx.input(2)
    if ctx.input(3) is not None:
        frame = int(ctx.const(3, "frame_length"))
    else:
        frame = window.shape[0] if window is not None else length
    if step < 1 or not 1 <= frame <= length:
        raise ctx.error(f"frame_step {step} and frame_length {frame} do not fit a signal of"
                        f" length {length}")
    count = (length - frame) // step + 1
    starts = np.arange(count)[:, None] * step + np.arange(frame)[None, :]
    frames = b.gather(signal, b.constant(starts.astype(np.int64)), axis=1)  # [B, F, W, c]
    if window is not None:
        if window.shape != (frame,):
            raise ctx.error(f"the window {window.type} must have frame_length {frame}")
        if window.dtype is not signal.dtype:
            window = b.cast(window, to=signal.dtype)
        frames = b.mul(frames, b.reshape(window, shape=(frame, 1)))
    return dft(b, frames, 2, frame, False, bool(ctx.attr("onesided", 1)))


@converter("MelWeightMatrix", since=17)
def mel_weight_matrix(ctx: ConvertContext):
    """The bins are integers floored from f64 arithmetic: computing them now, exactly as the
    ONNX reference does, keeps them exact. All inputs must be known before run time."""
    bins, n = int(ctx.const(0, "num_mel_bins")), int(ctx.const(1, "dft_length"))
    rate = float(ctx.const(2, "sample_rate"))
    low, high = (np.float64(ctx.const(i, name)) for i, name in
                 ((3, "lower_edge_hertz"), (4, "upper_edge_hertz")))
    if bins < 1 or n < 1 or rate <= 0:
        raise ctx.error("num_mel_bins, dft_length and sample_rate must be positive")
    low_mel, high_mel = (2595 * np.log10(1 + f / 700) for f in (low, high))
    step = (high_mel - low_mel) / (bins + 2)
    hertz = 700 * np.expm1((np.arange(bins + 2) * step + low_mel) / 2595 * np.log(10))
    edges = (((n + 1) * hertz) // rate).astype(np.int64)
    j = np.arange(n // 2 + 1)[:, None]  # the spectrogram bins
    lo, mid, hi = edges[None, :-2], edges[None, 1:-1], edges[None, 2:]
    rise = np.where(mid > lo, (j - lo) / np.maximum(mid - lo, 1), 1.0)
    fall = (hi - j) / np.maximum(hi - mid, 1)
    weights = np.where((mid <= j) & (j < hi), fall, np.where((lo <= j) & (j <= mid), rise, 0))
    dtype = onnx_dtype(ctx.attr("output_datatype", 1), "output_datatype")
    return ctx.constant(weights, dtype)

