"""The schedule of scaled dot-product attention: one kernel with an online softmax
(FlashAttention's recurrence, for a group of query rows), so that the scores of a row are
never stored whole. For each batch index b and group of query rows, the keys are taken in
blocks:

    top = -inf; total = 0; acc[0:E] = 0                                        per row
    for each block of keys [k0, k0 + n):
      s[0:n] = q[b, i, :] @ kt[b, :, k0:k0+n] * scale (+ mask[b, i, k0:k0+n])
      new = max(top, max(s))
      corr = exp(top - new); s = exp(s - new)            (0 and unchanged where new is -inf)
      total = total * corr + sum(s)
      acc = acc * corr + s @ v[b, k0:k0+n, :]
      top = new
    out[b, i, :] = acc / total                 (0 for a row of -inf scores, empty_rows_zero)

The two products are register tiles, the group's rows by `tile_vectors` vectors of keys
(of output columns for `s @ v`) with the sum along the innermost serial loop: each load of
kt or v serves every row of the group. A block's max and sum are vectorized loops that
reduce across their lanes (serial, they would be dependent chains as long as the block).
The batch loop is the one the default schedule parallelizes.

Reads from the target: the f32 lanes (a tile's vectors).
The measurements behind these choices: docs/decisions.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from ember.dtypes import DType
from ember.loops.ir import (
    Binary,
    Buffer,
    Const,
    Expr,
    Fma,
    For,
    If,
    Load,
    Select,
    Stmt,
    Store,
    Unary,
    binary,
)
from ember.loops.schedules.lanes import lane_chunks, vector_loop
from ember.loops.schedules.params import Parameters, chosen

F32 = DType.f32
NEG_INF = Const(float("-inf"), F32)
ZERO = Const(0.0, F32)
# key_block: keys per block (the scores of a group's rows take 4 KiB); row_group: query
# rows at once (each load of kt and v serves them all); tile_vectors: vectors per row of a
# register tile (4 x 4 accumulators).
PARAMETERS: Parameters = {"key_block": (256, (64, 128, 256, 512)),
                          "row_group": (4, (2, 4, 6, 8)),
                          "tile_vectors": (4, (1, 2, 3, 4))}

Read = Callable[[list[Expr]], Expr]


@dataclass(frozen=True)
class Attention:
    """softmax(q @ kt * scale + mask) @ v for q [*batch, rows, dim], kt [*batch, dim,
    keys], v [*batch, keys, width]: each read gives its operand at a full index (the mask,
    [*batch, row, key], broadcast as the lowering reads it), and store(index, value) stores
    out at [*batch, row, column]. `empty_rows_zero`: a row of -inf scores gives 0."""

    batch: tuple[int, ...]
    rows: int
    dim: int
    keys: int
    width: int
    scale: float
    empty_rows_zero: bool
    q: Read
    kt: Read
    v: Read
    mask: Read | None
    store: Callable[[list[Expr], Expr], Stmt]


def _ceil_div(a: Expr | int, b: int) -> Expr:
    return binary("floordiv", binary("add", a, Const(b - 1)), Const(b))


def schedule_attention(ctx, att: Attention) -> list[Stmt]:
    """The scheduled nest of `att`; `ctx` (a LowerContext) makes its variables and locals
    and gives its parameters."""
    batch, rows, dim, keys, width = att.batch, att.rows, att.dim, att.keys, att.width
    scale = att.scale
    parameters = chosen(ctx, "attention", PARAMETERS)
    tile = parameters["tile_vectors"] * ctx.target.lanes(F32)
    group = max(1, min(parameters["row_group"], rows))
    block = min(parameters["key_block"], keys)
    scores = ctx.local(F32, (group, block))
    acc = ctx.local(F32, (group, width))
    top, total, part, fresh, corr, shift = (ctx.local(F32, (group,)) for _ in range(6))

    def at(buf: Buffer, *index: Expr) -> Load:
        return Load(buf.name, tuple(index), F32)

    def put(buf: Buffer, index: tuple, value: Expr) -> Store:
        return Store(buf.name, index, value)

    def loop(stop: Expr | int, body: Callable[[Expr], list[Stmt]], kind: str = "serial") -> For:
        j = ctx.var("j")
        return For(j, Const(0), stop if isinstance(stop, Expr) else Const(stop), body(j), 1,
                   kind)

    vector = partial(vector_loop, ctx)

    def each_row(body: Callable[[Expr], list[Stmt]]) -> For:
        """body(ii) for the group's rows, unrolled: their vectors share each load."""
        return loop(group, body, "unrolled")

    def tiles(extent: Expr | int, size: int,
              body: Callable[[Expr, Expr | int], list[Stmt]]) -> For:
        """body(start, count) over [0, extent) in tiles of `size` (constant counts when
        `extent` is a whole number of them)."""
        if isinstance(extent, int) and extent % size == 0:
            return loop(extent // size, lambda t: body(t * size, size))
        return loop(_ceil_div(extent, size), lambda t: body(
            t * size, binary("min", Const(size), binary("sub", extent, t * size))))

    def rows_of(b: list[Expr], r0: Expr) -> list[Stmt]:
        def row(ii: Expr) -> Expr:  # rows past the end repeat the last (never stored)
            return r0 + ii if rows % group == 0 else binary("min", r0 + ii, Const(rows - 1))

        def key_block(kb: Expr) -> list[Stmt]:
            k0 = kb * block
            whole = keys % block == 0
            count = Const(block) if whole else binary("min", Const(block),
                                                        binary("sub", Const(keys), k0))

            def s(ii: Expr, j: Expr) -> Load:
                return at(scores, ii, j)

            def score_tile(t0: Expr, n: Expr | int) -> list[Stmt]:
                stmts: list[Stmt] = [
                    each_row(lambda ii: [vector(n, lambda j: [put(scores, (ii, t0 + j),
                                                                  ZERO)])]),
                    loop(dim, lambda d: [each_row(lambda ii: [vector(n, lambda j: [
                        put(scores, (ii, t0 + j), Fma(
                            att.q([*b, row(ii), d]), att.kt([*b, d, k0 + t0 + j]),
                            s(ii, t0 + j)))])])]),
                ]
                if att.mask is not None or scale != 1:  # s * scale + mask, in one pass
                    def scaled(ii: Expr, j: Expr) -> Expr:
                        if att.mask is None:
                            return Binary("mul", s(ii, j), Const(scale, F32))
                        bias = att.mask([*b, row(ii), k0 + j])
                        return Binary("add", s(ii, j), bias) if scale == 1 else \
                            Fma(s(ii, j), Const(scale, F32), bias)

                    stmts.append(each_row(lambda ii: [vector(n, lambda j: [
                        put(scores, (ii, t0 + j), scaled(ii, t0 + j))])]))
                return stmts

            key_tiles = partial(tiles, block if whole else count, tile)

            def reduce_into(buf: Buffer, op: str, first: Expr,
                            lanes_of: Callable[[Expr, Expr], list[Stmt]]) -> list[Stmt]:
                """buf[ii] = op over the block's scores of row ii, from `first`, the tile's
                lanes reduced by vector code (ember/codegen/vector.py)."""
                return [each_row(lambda ii: [put(buf, (ii,), first)]),
                        key_tiles(lambda t0, n: [each_row(lambda ii: [vector(
                            n, lambda j: [*lanes_of(ii, t0 + j), put(buf, (ii,), Binary(
                                op, at(buf, ii), s(ii, t0 + j)))])])])]

            def block_max(ii: Expr) -> list[Stmt]:
                new = at(fresh, ii)
                empty = Binary("eq", new, NEG_INF)
                return [
                    put(fresh, (ii,), Binary("max", at(top, ii), at(part, ii))),
                    put(corr, (ii,), Select(empty, ZERO,
                                            Unary("exp", Binary("sub", at(top, ii), new)))),
                    put(shift, (ii,), Select(empty, ZERO, new)),
                    put(top, (ii,), new),
                ]

            def exp_shifted(ii: Expr, k: Expr) -> list[Stmt]:
                return [put(scores, (ii, k), Unary("exp", Binary("sub", s(ii, k),
                                                                  at(shift, ii))))]

            stmts = [
                key_tiles(score_tile),
                *reduce_into(part, "max", NEG_INF, lambda ii, k: []),
                each_row(block_max),
                *reduce_into(part, "add", ZERO, exp_shifted),
                each_row(lambda ii: [put(total, (ii,), Fma(at(total, ii), at(corr, ii),
                                                           at(part, ii)))]),
            ]

            def value_tile(e0: Expr, n: Expr | int) -> list[Stmt]:
                return [
                    each_row(lambda ii: [vector(n, lambda e: [put(acc, (ii, e0 + e), Binary(
                        "mul", at(acc, ii, e0 + e), at(corr, ii)))])]),
                    loop(count, lambda j: [each_row(lambda ii: [vector(n, lambda e: [
                        put(acc, (ii, e0 + e), Fma(s(ii, j), att.v([*b, k0 + j, e0 + e]),
                                                   at(acc, ii, e0 + e)))])])]),
                ]

            stmts.append(tiles(width, tile, value_tile))
            return stmts

        def finish(ii: Expr) -> list[Stmt]:
            def value(e: Expr) -> Expr:
                result = Binary("div", at(acc, ii, e), at(total, ii))
                if att.empty_rows_zero:
                    result = Select(Binary("eq", at(total, ii), ZERO), ZERO, result)
                return result

            store = lane_chunks(ctx, width, tile,
                                lambda e: [att.store([*b, r0 + ii, e], value(e))])
            if rows % group == 0:
                return store
            return [If(Binary("lt", r0 + ii, Const(rows)), store, [])]

        return [each_row(lambda ii: [put(top, (ii,), NEG_INF), put(total, (ii,), ZERO),
                                     *lane_chunks(ctx, width, tile,
                                                  lambda e: [put(acc, (ii, e), ZERO)])]),
                loop(-(-keys // block), key_block),
                each_row(finish)]

    return ctx.nest((*batch, -(-rows // group)), lambda index: rows_of(index[:-1],
                                                                         index[-1] * group))
