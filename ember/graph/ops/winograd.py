"""Winograd's minimal filtering F(2x2, 3x3) for 3x3 convolutions at stride 1 (Lavin and
Gray, "Fast Algorithms for Convolutional Neural Networks", 2016).

Each 2x2 block of outputs is computed from a 4x4 tile of input d (tiles overlap by two)
and the 3x3 filter g as

    Y = A^T [ (G g G^T) * (B^T d B) ] A          (* elementwise over the 4x4 points)

Over channels, the elementwise products sum to 16 matrix products, one per point:
M[a] = U[a] @ V[a], with U[a] [M, C] the transformed filters (at compile time) and V[a]
[C, T] the transformed input tiles. That is 16 multiplies per 4 outputs where the direct
conv does 36: 2.25x fewer FLOPs, traded for two cheap transforms (additions only). The
transforms' coefficients are 0, +-1 and 1/2, so the result differs from the direct sum's
by rounding of the same order (ResNet-50's output: by 2.7e-6 of its largest magnitude).

    winograd_input(x){pitch}  x [N, C, 2TH + 2, 2TW + 2] (padded)  ->  V [16, C, P]
    winograd_output(m){size = [OH, OW], batch = N}  m [16, M, P]  ->  y [N, M, OH, OW],
                              TH = ceil(OH / 2), TW = ceil(OW / 2)

Point a = 4 * i + j is row i, column j of the 4x4 transform; tile t = (n * TH + th) *
TW + tw. P, the pitch, is N * TH * TW or more: V's columns past the tiles are zero, and
winograd_output ignores m's (ember/graph/passes/winograd_convs.py, which makes these ops
from convs, picks a pitch that keeps the 16 points of a tile out of each other's cache
sets).
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ember.dtypes import FLOAT_TYPES
from ember.errors import ShapeError
from ember.graph.ir import TensorType
from ember.graph.ops.common import require_dtype
from ember.graph.ops.registry import Attr, define

# The transforms (B^T and A^T act on the tile's rows, then on its columns).
INPUT_T = np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], np.float64)
FILTER = np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]], np.float64)
OUTPUT_T = np.array([[1, 1, 1, 0], [0, 1, -1, -1]], np.float64)
POINTS = 16  # 4 x 4


def winograd_weights(w: np.ndarray) -> np.ndarray:
    """3x3 filters w [M, C, 3, 3] transformed, U[a] = (G w G^T) at point a: [16, M, C]."""
    u = np.einsum("ik,mckl,jl->ijmc", FILTER, w.astype(np.float64), FILTER)
    return np.ascontiguousarray(u.reshape(POINTS, *w.shape[:2]).astype(w.dtype))


def _input_infer(types, attrs):
    (x,) = types
    require_dtype(x, FLOAT_TYPES)
    if x.rank != 4 or any(d < 4 or d % 2 for d in x.shape[2:]):
        raise ShapeError(f"winograd_input takes x [N, C, 2TH + 2, 2TW + 2] (even, at least"
                         f" 4), got {x}")
    n, c, h, w = x.shape
    tiles = n * ((h - 2) // 2) * ((w - 2) // 2)
    pitch = attrs["pitch"] or tiles
    if pitch < tiles:
        raise ShapeError(f"winograd_input's pitch {pitch} is less than its {tiles} tiles")
    return TensorType(x.dtype, (POINTS, c, pitch))


def _input_reference(x, pitch):
    tiles = sliding_window_view(x, (4, 4), axis=(2, 3))[:, :, ::2, ::2]  # n c th tw i j
    v = np.einsum("ai,ncxyij,bj->abcnxy", INPUT_T, tiles, INPUT_T)
    v = v.reshape(POINTS, x.shape[1], -1)
    padded = np.zeros((*v.shape[:2], max(pitch, v.shape[2])), x.dtype)
    padded[:, :, :v.shape[2]] = v
    return padded


def output_tiles(size) -> tuple[int, int]:
    """The tiles (TH, TW) of 2x2 outputs that cover an output of `size` [OH, OW]."""
    return -(-size[0] // 2), -(-size[1] // 2)


def _output_infer(types, attrs):
    (m,) = types
    require_dtype(m, FLOAT_TYPES)
    size = attrs["size"]
    if len(size) != 2 or min(size) < 1:
        raise ShapeError(f"winograd_output's size must be [OH, OW], got {list(size)}")
    th, tw = output_tiles(size)
    images = attrs["batch"]
    if images < 1 or m.rank != 3 or m.shape[0] != POINTS or m.shape[2] < images * th * tw:
        raise ShapeError(f"winograd_output takes m [16, M, {images * th * tw} or more] for"
                         f" {images} output(s) of {size[0]}x{size[1]}, got {m}")
    return TensorType(m.dtype, (images, m.shape[1], *size))


def _output_reference(m, size, batch):
    th, tw = output_tiles(size)
    points = m[:, :, :batch * th * tw].astype(np.float64)
    points = points.reshape(4, 4, m.shape[1], batch, th, tw)  # i j m n x y
    y = np.einsum("ri,ijmnxy,sj->nmxrys", OUTPUT_T, points, OUTPUT_T)
    y = y.reshape(y.shape[0], m.shape[1], 2 * th, 2 * tw)[:, :, :size[0], :size[1]]
    return np.ascontiguousarray(y.astype(m.dtype))


define("winograd_input", arity=1, infer=_input_infer, reference=_input_reference,
       attrs={"pitch": Attr("int", 0)}, traits=("pure",), family="linalg",
       summary="Winograd F(2x2,3x3) input transform: x [N, C, 2TH+2, 2TW+2] (padded) ->"
               " [16, C, P], B^T d B of each 4x4 tile at stride 2 (P = pitch, at least"
               " N*TH*TW, 0 for that; zero past the tiles)")
define("winograd_output", arity=1, infer=_output_infer, reference=_output_reference,
       attrs={"size": Attr("ints"), "batch": Attr("int", 1)}, traits=("pure",),
       family="linalg", category="contraction",
       summary="Winograd F(2x2,3x3) output transform: [16, M, P] -> [batch, M, OH, OW],"
               " A^T m A of each tile's 16 points (columns past batch*TH*TW unread)")
