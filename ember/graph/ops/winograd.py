"""Winograd's minimal filtering F(mxm, 3x3) for 3x3 convolutions at stride 1, with output
tiles of m = 2 or 4 (Lavin and Gray, "Fast Algorithms for Convolutional Neural Networks",
2016).

Each m x m block of outputs is computed from an (m + 2) x (m + 2) tile of input d (tiles
overlap by two) and the 3x3 filter g as

    Y = A^T [ (G g G^T) * (B^T d B) ] A          (* elementwise over the tile's points)

Over channels, the elementwise products sum to (m + 2)^2 matrix products, one per point:
M[a] = U[a] @ V[a], with U[a] [M, C] the transformed filters (at compile time) and V[a]
[C, T] the transformed input tiles. F(2x2, 3x3) does 16 multiplies per 4 outputs where the
direct conv does 36 (2.25x fewer FLOPs), F(4x4, 3x3) 36 per 16 (4x fewer), traded for two
transforms (additions, and for m = 4 multiplies by small constants). F(2x2)'s
coefficients are 0, +-1 and 1/2, so its result differs from the direct sum's by rounding
of the same order (ResNet-50's output: by 2.7e-6 of its largest magnitude); F(4x4)'s
(up to 8 and 1/24) round a little more (docs/decisions.md).

    winograd_input(x){pitch, tile = m}  x [N, C, m TH + 2, m TW + 2] (padded) -> V [P', C, P]
    winograd_output(m){size = [OH, OW], batch = N, tile = m}  [P', M, P] -> y [N, M, OH, OW]
                          TH = ceil(OH / m), TW = ceil(OW / m), P' = (m + 2)^2 points

Point a = (m + 2) i + j is row i, column j of the transform; tile t = (n * TH + th) *
TW + tw. P, the pitch, is N * TH * TW or more: V's columns past the tiles are zero, and
winograd_output ignores m's (ember/graph/passes/winograd_convs.py, which makes these ops
from convs, picks a pitch that keeps the points of a tile out of each other's cache
sets).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ember.dtypes import FLOAT_TYPES
from ember.errors import ShapeError
from ember.graph.ir import TensorType
from ember.graph.ops.common import require_dtype
from ember.graph.ops.registry import Attr, define


@dataclass(frozen=True)
class Transform:
    """F(m x m, 3 x 3)'s matrices: B^T and A^T act on a tile's rows, then on its columns."""

    tile: int  # m, the outputs along each side of a tile
    input_t: np.ndarray  # B^T [m + 2, m + 2]
    filter: np.ndarray  # G [m + 2, 3]
    output_t: np.ndarray  # A^T [m, m + 2]

    @property
    def side(self) -> int:
        return self.tile + 2

    @property
    def points(self) -> int:
        return self.side ** 2


TRANSFORMS = {
    2: Transform(2,
                 np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]],
                          np.float64),
                 np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]],
                          np.float64),
                 np.array([[1, 1, 1, 0], [0, 1, -1, -1]], np.float64)),
    4: Transform(4,
                 np.array([[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0],
                           [0, -2, -1, 2, 1, 0], [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]],
                          np.float64),
                 np.array([[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6],
                           [1 / 24, 1 / 12, 1 / 6], [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]],
                          np.float64),
                 np.array([[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0],
                           [0, 1, -1, 8, -8, 1]], np.float64)),
}


def transform(tile: int) -> Transform:
    """The matrices of F(tile x tile, 3x3); ShapeError for a tile Ember has none of."""
    if tile not in TRANSFORMS:
        raise ShapeError(f"Winograd tiles are {sorted(TRANSFORMS)} outputs a side, got {tile}")
    return TRANSFORMS[tile]


def winograd_weights(w: np.ndarray, tile: int = 2) -> np.ndarray:
    """3x3 filters w [M, C, 3, 3] transformed, U[a] = (G w G^T) at point a: [P', M, C]."""
    f = transform(tile)
    u = np.einsum("ik,mckl,jl->ijmc", f.filter, w.astype(np.float64), f.filter)
    return np.ascontiguousarray(u.reshape(f.points, *w.shape[:2]).astype(w.dtype))


def _input_infer(types, attrs):
    (x,) = types
    require_dtype(x, FLOAT_TYPES)
    f = transform(attrs["tile"])
    m = f.tile
    if x.rank != 4 or any(d < f.side or (d - 2) % m for d in x.shape[2:]):
        raise ShapeError(f"winograd_input takes x [N, C, {m}TH + 2, {m}TW + 2] (at least"
                         f" {f.side}), got {x}")
    n, c, h, w = x.shape
    tiles = n * ((h - 2) // m) * ((w - 2) // m)
    pitch = attrs["pitch"] or tiles
    if pitch < tiles:
        raise ShapeError(f"winograd_input's pitch {pitch} is less than its {tiles} tiles")
    return TensorType(x.dtype, (f.points, c, pitch))


def _input_reference(x, pitch, tile):
    f = transform(tile)
    windows = sliding_window_view(x, (f.side, f.side), axis=(2, 3))
    tiles = windows[:, :, ::tile, ::tile]  # n c th tw i j
    v = np.einsum("ai,ncxyij,bj->abcnxy", f.input_t, tiles, f.input_t)
    v = v.reshape(f.points, x.shape[1], -1)
    padded = np.zeros((*v.shape[:2], max(pitch, v.shape[2])), x.dtype)
    padded[:, :, :v.shape[2]] = v
    return padded


def output_tiles(size, tile: int = 2) -> tuple[int, int]:
    """The tiles (TH, TW) of tile x tile outputs that cover an output of `size` [OH, OW]."""
    return -(-size[0] // tile), -(-size[1] // tile)


def _output_infer(types, attrs):
    (m,) = types
    require_dtype(m, FLOAT_TYPES)
    size, f = attrs["size"], transform(attrs["tile"])
    if len(size) != 2 or min(size) < 1:
        raise ShapeError(f"winograd_output's size must be [OH, OW], got {list(size)}")
    th, tw = output_tiles(size, f.tile)
    images = attrs["batch"]
    if images < 1 or m.rank != 3 or m.shape[0] != f.points or m.shape[2] < images * th * tw:
        raise ShapeError(f"winograd_output takes m [{f.points}, M, {images * th * tw} or"
                         f" more] for {images} output(s) of {size[0]}x{size[1]}, got {m}")
    return TensorType(m.dtype, (images, m.shape[1], *size))


def _output_reference(m, size, batch, tile):
    f = transform(tile)
    th, tw = output_tiles(size, tile)
    points = m[:, :, :batch * th * tw].astype(np.float64)
    points = points.reshape(f.side, f.side, m.shape[1], batch, th, tw)  # i j m n x y
    y = np.einsum("ri,ijmnxy,sj->nmxrys", f.output_t, points, f.output_t)
    y = y.reshape(y.shape[0], m.shape[1], tile * th, tile * tw)[:, :, :size[0], :size[1]]
    return np.ascontiguousarray(y.astype(m.dtype))


define("winograd_input", arity=1, infer=_input_infer, reference=_input_reference,
       attrs={"pitch": Attr("int", 0), "tile": Attr("int", 2)}, traits=("pure",),
       family="linalg",
       summary="Winograd F(mxm,3x3) input transform (m = tile, 2 or 4): x [N, C, mTH+2,"
               " mTW+2] (padded) -> [(m+2)^2, C, P], B^T d B of each (m+2)x(m+2) tile at"
               " stride m (P = pitch, at least N*TH*TW, 0 for that; zero past the tiles)")
define("winograd_output", arity=1, infer=_output_infer, reference=_output_reference,
       attrs={"size": Attr("ints"), "batch": Attr("int", 1), "tile": Attr("int", 2)},
       traits=("pure",), family="linalg", category="contraction",
       summary="Winograd F(mxm,3x3) output transform (m = tile): [(m+2)^2, M, P] -> [batch,"
               " M, OH, OW], A^T m A of each tile's points (columns past batch*TH*TW"
               " unread)")
