"""Scaled dot-product attention as one kernel with an online softmax (FlashAttention's
recurrence, per query row): the scores of a row are never stored whole.

For each batch b and query row i, the keys are taken in blocks of KEY_BLOCK:

    top = -inf; total = 0; acc[0:E] = 0
    for each block of keys [k0, k0 + n):
      s[0:n] = q[b, i, :] @ kt[b, :, k0:k0+n] (+ mask[b, i, k0:k0+n])     vectors over keys
      new = max(top, max(s))
      corr = exp(top - new); s = exp(s - new)            (0 and unchanged where new is -inf)
      total = total * corr + sum(s)
      acc = acc * corr + s @ v[b, k0:k0+n, :]                              vectors over E
      top = new
    out[b, i, :] = acc / total                 (0 for a row of -inf scores, empty_rows_zero)

so a block rescales what came before it by exp(old max - new max). Query rows go in groups
of ROW_GROUP (unrolled), so that each load of kt and v serves them all; the batch loop is
the one the default schedule parallelizes. It is 2x slower than the unfused GEMMs and
softmax here (12 heads, sequence 128: 0.93 against 0.38 ms), which is why compiles form
it only on request; the scores' row maxima and sums are serial loops, and the tiles' stay
in registers is the next thing to check. f32 only: the graph pass that forms this op
(ember/graph/passes/attention.py) makes it for f32 attention only.
"""

from __future__ import annotations

from ember.dtypes import DType
from ember.errors import UnsupportedOpError
from ember.loops.ir import (
    Binary,
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
from ember.loops.lower.core import LowerContext, lowering

KEY_BLOCK = 64  # keys per block: a row's block of scores is 4 AVX-512 or 8 AVX2 registers
ROW_GROUP = 4  # query rows at once: each load of kt and v serves them all

F32 = DType.f32
NEG_INF = Const(float("-inf"), F32)
ZERO = Const(0.0, F32)


@lowering("attention")
def attention(ctx: LowerContext) -> list[Stmt]:
    q, kt, v = ctx.inputs[:3]
    mask = ctx.inputs[3] if len(ctx.inputs) == 4 else None
    out = ctx.outputs[0]
    if any(b.dtype is not F32 for b in (*ctx.inputs, out)):
        raise UnsupportedOpError(f"graph.attention lowers for f32 only, not {q.dtype}")
    batch, rows, dim = q.shape
    keys, width = kt.shape[2], v.shape[2]
    block = max(1, min(KEY_BLOCK, keys))
    group = max(1, min(ROW_GROUP, rows))
    scores, acc = ctx.local(F32, (group, block)), ctx.local(F32, (group, width))
    top, total, part, fresh, corr = (ctx.local(F32, (group,)) for _ in range(5))

    def at(buf, *index: Expr) -> Load:
        return Load(buf.name, tuple(index), F32)

    def put(buf, index: tuple, value: Expr) -> Store:
        return Store(buf.name, index, value)

    def loop(stop: Expr | int, body, kind: str = "serial") -> For:
        j = ctx.var("j")
        return For(j, Const(0), stop if isinstance(stop, Expr) else Const(stop), body(j), 1,
                   kind)

    def each_row(body) -> For:
        """body(ii) for the group's rows, unrolled: their vectors share each load of kt, v."""
        return loop(group, body, "unrolled")

    def rows_of(b: Expr, r0: Expr) -> list[Stmt]:
        def row(ii: Expr) -> Expr:  # rows past the end repeat the last (never stored)
            return r0 + ii if rows % group == 0 else binary("min", r0 + ii, Const(rows - 1))

        def key_block(kb: Expr) -> list[Stmt]:
            k0 = kb * block
            count = Const(block) if keys % block == 0 else binary("min", Const(block),
                                                                    Const(keys) - k0)
            def s(ii: Expr, j: Expr) -> Load:
                return at(scores, ii, j)

            stmts: list[Stmt] = [
                each_row(lambda ii: [loop(count, lambda j: [put(scores, (ii, j), ZERO)],
                                          "vectorized")]),
                loop(dim, lambda d: [each_row(lambda ii: [loop(count, lambda j: [
                    put(scores, (ii, j), Fma(ctx.load(0, [b, row(ii), d]),
                                             ctx.load(1, [b, d, k0 + j]), s(ii, j)))],
                    "vectorized")])]),
            ]
            if mask is not None:
                mb = b if mask.shape[0] == batch and batch > 1 else Const(0)
                stmts.append(each_row(lambda ii: [loop(count, lambda j: [
                    put(scores, (ii, j), Binary("add", s(ii, j),
                                                ctx.load(3, [mb, row(ii), k0 + j])))],
                    "vectorized")]))

            def softmax_step(ii: Expr) -> list[Stmt]:
                new = at(fresh, ii)
                empty = Binary("eq", new, NEG_INF)
                return [
                    put(part, (ii,), NEG_INF),
                    loop(count, lambda j: [put(part, (ii,), Binary("max", at(part, ii),
                                                                    s(ii, j)))]),
                    put(fresh, (ii,), Binary("max", at(top, ii), at(part, ii))),
                    put(corr, (ii,), Select(empty, ZERO,
                                            Unary("exp", Binary("sub", at(top, ii), new)))),
                    loop(count, lambda j: [put(scores, (ii, j), Unary(
                        "exp", Binary("sub", s(ii, j), Select(empty, ZERO, new))))],
                        "vectorized"),
                    put(part, (ii,), ZERO),
                    loop(count, lambda j: [put(part, (ii,), Binary("add", at(part, ii),
                                                                    s(ii, j)))]),
                    put(total, (ii,), Fma(at(total, ii), at(corr, ii), at(part, ii))),
                    loop(width, lambda e: [put(acc, (ii, e), Binary("mul", at(acc, ii, e),
                                                                     at(corr, ii)))],
                         "vectorized"),
                    put(top, (ii,), new),
                ]

            stmts += [
                each_row(softmax_step),
                loop(count, lambda j: [each_row(lambda ii: [loop(width, lambda e: [
                    put(acc, (ii, e), Fma(s(ii, j), ctx.load(2, [b, k0 + j, e]),
                                          at(acc, ii, e)))], "vectorized")])]),
            ]
            return stmts

        def finish(ii: Expr) -> list[Stmt]:
            def value(e: Expr) -> Expr:
                result = Binary("div", at(acc, ii, e), at(total, ii))
                if ctx.attrs["empty_rows_zero"]:
                    result = Select(Binary("eq", at(total, ii), ZERO), ZERO, result)
                return result

            store = [loop(width, lambda e: [Store(out.name, (b, r0 + ii, e), value(e))],
                          "vectorized")]
            if rows % group == 0:
                return store
            return [If(Binary("lt", r0 + ii, Const(rows)), store, [])]

        return [each_row(lambda ii: [put(top, (ii,), NEG_INF), put(total, (ii,), ZERO),
                                     loop(width, lambda e: [put(acc, (ii, e), ZERO)],
                                          "vectorized")]),
                loop(-(-keys // block), key_block),
                each_row(finish)]

    return ctx.nest((batch, -(-rows // group)), lambda index: rows_of(index[0],
                                                                        index[1] * group))
