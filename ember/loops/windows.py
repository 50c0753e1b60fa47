"""Window arithmetic of convolutions and pools, shared by their lowerings and schedules: the
input position a window reads at a kernel tap, and the in-bounds conditions of such reads,
left out on axes where they cannot fail."""

from __future__ import annotations

from collections.abc import Sequence

from ember.loops.ir import Binary, Const, Expr


def all_of(conds: Sequence[Expr]) -> Expr | None:
    """The conjunction of `conds` (None when there are none)."""
    result = None
    for c in conds:
        result = c if result is None else Binary("and", result, c)
    return result


def window_position(out: Expr, tap: Expr, stride: int, pad_begin: int,
                    dilation: int) -> Expr:
    """The input position that window `out` reads at kernel tap `tap`."""
    return out * stride + tap * dilation - pad_begin


def position_checks(pos: Expr, size: int, low: int, high: int) -> list[Expr]:
    """Conditions for 0 <= pos < size, given that pos always lies in [low, high]."""
    conds = []
    if low < 0:
        conds.append(Binary("ge", pos, Const(0)))
    if high >= size:
        conds.append(Binary("lt", pos, Const(size)))
    return conds


def window_checks(positions: Sequence[Expr], sizes: Sequence[int], outs: Sequence[int],
                  kernel: Sequence[int], strides: Sequence[int], pads_begin: Sequence[int],
                  dilations: Sequence[int]) -> list[Expr]:
    """The in-bounds conditions of windowed reads, only on axes where one can fail."""
    conds = []
    for pos, size, out, k, s, pb, d in zip(positions, sizes, outs, kernel, strides,
                                           pads_begin, dilations):
        conds += position_checks(pos, size, -pb, (out - 1) * s + (k - 1) * d - pb)
    return conds
