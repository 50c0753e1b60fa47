"""The schedule of scaled dot-product attention: one kernel with an online softmax
(FlashAttention's recurrence, for a group of query rows), so that the scores of a row are
never stored whole.

Before: the plain nest that `graph.attention` lowers to (`plain_attention`), the same
recurrence one key at a time, a row at a time (`match_attention` finds it):

    for b.., i { top = -inf; total = 0; acc[0:E] = 0
      for j { s = q[b, i, :] . kt[b, :, j]; s = s * scale (+ mask[b, i, j])
              new = max(top, s); corr = exp(top - new); p = exp(s - new)   (0 if new = -inf)
              total = total * corr + p; acc[e] = acc[e] * corr + p * v[b, j, e]; top = new }
      out[b, i, e] = acc[e] / total }          (0 for a row of -inf scores, empty_rows_zero)

After (the step `attention <loop> key_block row_group tile`): for each batch index b and
group of `row_group` query rows, the keys in blocks of `key_block`:

    top = -inf; total = 0; acc[0:E] = 0                                        per row
    for each block of keys [k0, k0 + n):
      s[0:n] = q[b, i, :] @ kt[b, :, k0:k0+n] * scale (+ mask[b, i, k0:k0+n])
      new = max(top, max(s))
      corr = exp(top - new); s = exp(s - new)            (0 and unchanged where new is -inf)
      total = total * corr + sum(s)
      acc = acc * corr + s @ v[b, k0:k0+n, :]
      top = new
    out[b, i, :] = acc / total

The two products are register tiles, the group's rows by `tile` lanes of keys (of output
columns for `s @ v`) with the sum along the innermost serial loop: each load of kt or v
serves every row of the group. A block's max and sum are vectorized loops that reduce
across their lanes (serial, they would be dependent chains as long as the block). The
batch loop is the one the default schedule parallelizes.

Reads from the target: the f32 lanes (a tile's vectors).
The measurements behind these choices: docs/decisions.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import NamedTuple

from ember.dtypes import DType
from ember.errors import ScheduleError
from ember.graph.symbolic import DimLike
from ember.loops.ir import (
    Binary,
    Buffer,
    Const,
    Expr,
    Fma,
    For,
    If,
    Kernel,
    Load,
    Select,
    Stmt,
    Store,
    Unary,
    Var,
    as_expr,
    binary,
    expr_dim,
    substitute,
)
from ember.loops.schedules.lanes import lane_chunks, serial_unless_vectorizable, vector_loop
from ember.loops.schedules.names import FreshNames
from ember.loops.schedules.params import Parameters
from ember.loops.schedules.window_nest import replace_nest, step_nest
from ember.loops.verify import verify_kernel
from ember.target import Target

F32 = DType.f32
NEG_INF = Const(float("-inf"), F32)
ZERO = Const(0.0, F32)
# key_block: keys per block (a group's scores take a few KiB); row_group: query rows at
# once (each load of kt and v serves them all); tile_vectors: vectors per row of a register
# tile. The tile's defaults are the target's GEMM micro-kernel (`default_parameters`);
# three vectors are no choice, as no key block is a whole number of them.
PARAMETERS: Parameters = {"key_block": (256, (64, 128, 256, 512)),
                          "row_group": (4, (2, 4, 6, 8)),
                          "tile_vectors": (4, (1, 2, 4))}

# ln of the smallest normal f32: exp below it is a denormal, or 0.
LN_SMALLEST_NORMAL = -87.33654


def _exp_normal(x: Expr) -> Expr:
    """exp(x), or 0 where that is below the smallest normal f32. A weight of a row's
    softmax so small adds nothing its sums can show (the row's largest weight is 1), and
    each product or sum of a denormal costs a microcode assist on Intel cores: Swin's
    shifted windows, whose mask adds -100 to scores, ran their attention 4x slower."""
    return Select(Binary("lt", x, Const(LN_SMALLEST_NORMAL, F32)), ZERO, Unary("exp", x))


# Keys known only at call time run in whole blocks of at most this many, those past the end
# masked: a short sequence wastes less of its last block (bert-base's attention at 128
# tokens: 0.43 ms in blocks of 256, 0.28 in blocks of 128; at 512, 4.33 and 4.23; blocks
# of 64: 0.33 and 4.45).
MASKED_BLOCK = 128

Read = Callable[[list[Expr]], Expr]


@dataclass(frozen=True)
class Attention:
    """softmax(q @ kt * scale + mask) @ v for q [*batch, rows, dim], kt [*batch, dim,
    keys], v [*batch, keys, width]: each read gives its operand at a full index (the mask,
    [*batch, row, key], broadcast as the lowering reads it), and store(index, value) stores
    out at [*batch, row, column]. `empty_rows_zero`: a row of -inf scores gives 0."""

    batch: tuple[DimLike, ...]  # batch, rows and keys may be sizes known at call time
    rows: DimLike
    dim: int
    keys: DimLike
    width: int
    scale: float
    empty_rows_zero: bool
    q: Read
    kt: Read
    v: Read
    mask: Read | None
    store: Callable[[list[Expr], Expr], Stmt]


def _ceil_div(a: Expr | DimLike, b: int) -> Expr:
    return binary("floordiv", binary("add", as_expr(a), Const(b - 1)), Const(b))


def schedule_attention(ctx: FreshNames, att: Attention, key_block: int, row_group: int,
                       tile: int, lanes: int) -> list[Stmt]:
    """The scheduled nest of `att` (the module docstring's After): keys in blocks of
    `key_block`, `row_group` query rows at once, register tiles `tile` lanes wide of
    vectors of `lanes`; `ctx` makes its variables and locals."""
    batch, rows, dim, keys, width = att.batch, att.rows, att.dim, att.keys, att.width
    scale = att.scale
    group = max(1, min(row_group, rows)) if isinstance(rows, int) else row_group
    block = min(key_block, keys) if isinstance(keys, int) else min(key_block, MASKED_BLOCK)

    def in_vectors(n: int) -> int:  # n rounded up to whole vectors
        return -(-n // lanes) * lanes

    scores = ctx.local(F32, (group, in_vectors(block)))
    acc = ctx.local(F32, (group, width))
    top, total, part, fresh, corr, shift = (ctx.local(F32, (group,)) for _ in range(6))

    def at(buf: Buffer, *index: Expr) -> Load:
        return Load(buf.name, tuple(index), F32)

    def put(buf: Buffer, index: tuple, value: Expr) -> Store:
        return Store(buf.name, index, value)

    def loop(stop: Expr | int, body: Callable[[Expr], list[Stmt]], kind: str = "serial") -> For:
        j = ctx.var("j")
        return For(j, Const(0), as_expr(stop), body(j), 1, kind)

    vector = partial(vector_loop, ctx)

    def each_row(body: Callable[[Expr], list[Stmt]]) -> For:
        """body(ii) for the group's rows, unrolled: their vectors share each load."""
        return loop(group, body, "unrolled")

    def tiles(extent: Expr | int, size: int,
              body: Callable[[Expr, Expr | int], list[Stmt]]) -> list[Stmt]:
        """body(start, count) over [0, extent) in tiles of `size`. A constant `extent`
        gets constant counts: its whole tiles, then the rest as one tile of its own (with
        a count computed per tile, every tile's lanes were masked: 197 keys, ViT's, ran
        7x slower than 256)."""
        if isinstance(extent, int):
            whole, rest = divmod(extent, size)
            stmts: list[Stmt] = [loop(whole, lambda t: body(t * size, size))] if whole else []
            return stmts + (body(Const(whole * size), rest) if rest else [])
        return [loop(_ceil_div(extent, size), lambda t: body(
            t * size, binary("min", Const(size), binary("sub", extent, t * size))))]

    def rows_of(b: list[Expr], r0: Expr) -> list[Stmt]:
        def row(ii: Expr) -> Expr:  # rows past the end repeat the last (never stored)
            return r0 + ii if rows % group == 0 else binary("min", r0 + ii, as_expr(rows - 1))

        def key_blocks() -> list[Stmt]:
            """The blocks of keys. A number of keys known only at call time gets whole
            blocks whose keys past the end score -inf (their kt reads masked): every block
            then has the constant trip counts that unroll and vectorize, in one copy of
            the code (a peeled tail block, a second copy, made the loop 1.7x slower in a
            parallel body at 512 keys, where it never ran)."""
            if not isinstance(keys, int):
                return [loop(_ceil_div(keys, block), lambda kb: keys_from(kb * block, block,
                                                                          masked=True))]
            # A static number of keys: whole blocks, then the rest as a block of its own
            # (DINOv2's 257 keys are a block of 256 and one of 1), each of a constant count.
            whole, rest = divmod(keys, block)
            stmts = [loop(whole, lambda kb: keys_from(kb * block, block))] if whole else []
            return stmts + (keys_from(Const(whole * block), rest) if rest else [])

        def keys_from(k0: Expr, size: int, masked: bool = False) -> list[Stmt]:
            """The block of `size` keys from k0; `masked`: those past the end score -inf.
            A block that is not a whole number of vectors is scored in whole vectors, the
            keys past it masked: a last vector of fewer lanes is masked loads and stores
            of the scores at every step of the dot products (Swin's 49 keys: 1.3x the
            time of 48)."""
            if masked:
                count = binary("min", Const(block), binary("sub", as_expr(keys), k0))

                def inside(j: Expr) -> Expr:  # key k0 + j exists
                    return binary("lt", k0 + j, as_expr(keys))
            else:
                count = Const(size)

                def inside(j: Expr) -> Expr:  # key k0 + j is in the block
                    return binary("lt", j, count)
            size, masked = in_vectors(size), masked or size % lanes != 0

            def s(ii: Expr, j: Expr) -> Load:
                return at(scores, ii, j)

            def score_tile(t0: Expr, n: Expr | int) -> list[Stmt]:
                def key(d: Expr, j: Expr) -> Expr:
                    value = att.kt([*b, d, k0 + t0 + j])
                    return Select(inside(t0 + j), value, ZERO) if masked else value

                stmts: list[Stmt] = [
                    each_row(lambda ii: [vector(n, lambda j: [put(scores, (ii, t0 + j),
                                                                  ZERO)])]),
                    loop(dim, lambda d: [each_row(lambda ii: [vector(n, lambda j: [
                        put(scores, (ii, t0 + j), Fma(
                            att.q([*b, row(ii), d]), key(d, j), s(ii, t0 + j)))])])]),
                ]
                if att.mask is not None or scale != 1 or masked:
                    def scaled(ii: Expr, j: Expr) -> Expr:  # s * scale + mask, in one pass
                        value = _scaled(s(ii, j), scale, att.mask([*b, row(ii), k0 + j])
                                        if att.mask is not None else None)
                        value = s(ii, j) if value is None else value
                        return Select(inside(j), value, NEG_INF) if masked else value

                    stmts.append(each_row(lambda ii: [vector(n, lambda j: [
                        put(scores, (ii, t0 + j), scaled(ii, t0 + j))])]))
                return stmts

            key_tiles = partial(tiles, size, tile)  # (masked: whole tiles, lanes past masked)

            def reduce_into(buf: Buffer, op: str, first: Expr,
                            lanes_of: Callable[[Expr, Expr], list[Stmt]]) -> list[Stmt]:
                """buf[ii] = op over the block's scores of row ii, from `first`, the tile's
                lanes reduced by vector code (ember/codegen/vector.py)."""
                return [each_row(lambda ii: [put(buf, (ii,), first)]),
                        *key_tiles(lambda t0, n: [each_row(lambda ii: [vector(
                            n, lambda j: [*lanes_of(ii, t0 + j), put(buf, (ii,), Binary(
                                op, at(buf, ii), s(ii, t0 + j)))])])])]

            def block_max(ii: Expr) -> list[Stmt]:
                new = at(fresh, ii)
                empty = Binary("eq", new, NEG_INF)
                return [
                    put(fresh, (ii,), Binary("max", at(top, ii), at(part, ii))),
                    put(corr, (ii,), Select(empty, ZERO,
                                            _exp_normal(Binary("sub", at(top, ii), new)))),
                    put(shift, (ii,), Select(empty, ZERO, new)),
                    put(top, (ii,), new),
                ]

            def exp_shifted(ii: Expr, k: Expr) -> list[Stmt]:
                return [put(scores, (ii, k), _exp_normal(Binary("sub", s(ii, k),
                                                                   at(shift, ii))))]

            stmts = [
                *key_tiles(score_tile),
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

            stmts += tiles(width, tile, value_tile)
            return stmts

        def finish(ii: Expr) -> list[Stmt]:
            def value(e: Expr) -> Expr:
                return _result(at(acc, ii, e), at(total, ii), att.empty_rows_zero)

            store = lane_chunks(ctx, width, tile,
                                lambda e: [att.store([*b, r0 + ii, e], value(e))])
            if rows % group == 0:
                return store
            return [If(Binary("lt", r0 + ii, as_expr(rows)), store, [])]

        return [each_row(lambda ii: [put(top, (ii,), NEG_INF), put(total, (ii,), ZERO),
                                     *lane_chunks(ctx, width, tile,
                                                  lambda e: [put(acc, (ii, e), ZERO)])]),
                *key_blocks(),
                each_row(finish)]

    index = [ctx.var("i") for _ in (*batch, rows)]
    return _nest(index, (*batch, _ceil_div(rows, group)),
                 rows_of(index[:-1], index[-1] * group))


def _nest(index: list[Var], extents: tuple[DimLike | Expr, ...], body: list[Stmt]
          ) -> list[Stmt]:
    """Loops of `index` over `extents` (outermost first) around `body`."""
    for var, extent in reversed(list(zip(index, extents))):
        body = [For(var, Const(0), as_expr(extent), body)]
    return body


# -- the plain nest ----------------------------------------------------------------------------

def _scaled(s: Expr, scale: float, bias: Expr | None) -> Expr | None:
    """s * scale + bias as the schedule computes it; None when it is s itself."""
    if bias is None:
        return None if scale == 1 else Binary("mul", s, Const(scale, F32))
    return Binary("add", s, bias) if scale == 1 else Fma(s, Const(scale, F32), bias)


def _result(acc: Expr, total: Expr, empty_rows_zero: bool) -> Expr:
    value = Binary("div", acc, total)
    return Select(Binary("eq", total, ZERO), ZERO, value) if empty_rows_zero else value


def plain_attention(ctx, att: Attention) -> list[Stmt]:
    """The plain nest of `att` (the module docstring's Before): the online softmax one key
    at a time; `ctx` makes its variables and locals (a LowerContext or FreshNames)."""
    top, total, s, new, corr, p = (ctx.local(F32).name for _ in range(6))
    acc = ctx.local(F32, (att.width,)).name
    index = [ctx.var("i") for _ in (*att.batch, att.rows)]
    loops = _PlainNames(top, total, s, new, corr, p, acc,
                        *(ctx.var(v) for v in ("j", "d", "e", "e", "e")))
    return _nest(index, (*att.batch, att.rows), _plain_row(att, index[:-1], index[-1], loops))


class _PlainNames(NamedTuple):
    """The plain nest's locals (scalars but acc, [width]) and inner loop variables."""

    top: str
    total: str
    s: str
    new: str
    corr: str
    p: str
    acc: str
    j: Var
    d: Var
    e0: Var
    e1: Var
    e2: Var


def _plain_row(att: Attention, b: list[Expr], i: Var, n: _PlainNames) -> list[Stmt]:
    """The plain nest's statements for query row i of batch index b."""
    def at(buf: str, *index: Expr) -> Load:
        return Load(buf, tuple(index), F32)

    j, d, e0, e1, e2 = n.j, n.d, n.e0, n.e1, n.e2
    empty = Binary("eq", at(n.new), NEG_INF)
    scaled = _scaled(at(n.s), att.scale, att.mask([*b, i, j]) if att.mask else None)
    key = [Store(n.s, (), ZERO),
           For(d, Const(0), Const(att.dim), [Store(n.s, (), Fma(
               att.q([*b, i, d]), att.kt([*b, d, j]), at(n.s)))]),
           *([Store(n.s, (), scaled)] if scaled is not None else []),
           Store(n.new, (), Binary("max", at(n.top), at(n.s))),
           Store(n.corr, (), Select(empty, ZERO,
                                    Unary("exp", Binary("sub", at(n.top), at(n.new))))),
           Store(n.p, (), Select(empty, ZERO, Unary("exp", Binary("sub", at(n.s), at(n.new))))),
           Store(n.total, (), Fma(at(n.total), at(n.corr), at(n.p))),
           For(e1, Const(0), Const(att.width), [Store(n.acc, (e1,), Fma(
               at(n.p), att.v([*b, j, e1]), Binary("mul", at(n.acc, e1), at(n.corr))))]),
           Store(n.top, (), at(n.new))]
    return [Store(n.top, (), NEG_INF), Store(n.total, (), ZERO),
            For(e0, Const(0), Const(att.width), [Store(n.acc, (e0,), ZERO)]),
            For(j, Const(0), as_expr(att.keys), key),
            For(e2, Const(0), Const(att.width), [att.store(
                [*b, i, e2], _result(at(n.acc, e2), at(n.total), att.empty_rows_zero))])]


@dataclass(frozen=True)
class AttentionNest:
    """A plain attention nest found in a kernel: the attention it computes (its reads are
    the plain nest's, at the indices given) and the locals only the plain nest uses."""

    attention: Attention
    locals: frozenset[str]


def _is_store(st: Stmt, buffer: str | None = None, index: tuple = ()) -> bool:
    return isinstance(st, Store) and (buffer is None or st.buffer == buffer) and \
        st.index == index


def _counted(st: Stmt) -> For | None:
    """`st` if it is a loop from 0 by 1 to a constant or a size known at call time."""
    if isinstance(st, For) and st.start == Const(0) and st.step == 1 and \
            expr_dim(st.stop) is not None and st.kind == "serial":
        return st
    return None


def match_attention(loop: For, locals_: set[str]) -> AttentionNest | None:
    """The attention computed by the plain nest `loop` (as `plain_attention` writes it),
    or None when it is not one. `locals_`: the kernel's locals."""
    outer: list[For] = []
    body: list[Stmt] = [loop]
    while len(body) == 1 and _counted(body[0]) is not None:
        outer.append(body[0])
        body = body[0].body
    if len(outer) < 1 or len(body) != 5:
        return None
    init_top, init_total, init_acc, keys, finish = body
    if not (_is_store(init_top) and init_top.value == NEG_INF and _is_store(init_total)
            and init_total.value == ZERO and init_top.buffer in locals_):
        return None
    init_acc, keys, finish = _counted(init_acc), _counted(keys), _counted(finish)
    if init_acc is None or keys is None or finish is None or len(init_acc.body) != 1:
        return None
    top, total, acc = init_top.buffer, init_total.buffer, init_acc.body[0]
    if not (isinstance(acc, Store) and acc.index == (init_acc.var,) and acc.value == ZERO):
        return None
    acc = acc.buffer
    steps = keys.body
    if len(steps) not in (8, 9) or not _is_store(steps[0]) or _counted(steps[1]) is None:
        return None
    s, dots = steps[0].buffer, steps[1]
    dot = dots.body[0] if len(dots.body) == 1 else None
    if not (_is_store(dot, s) and isinstance(dot.value, Fma) and
            dot.value.c == Load(s, (), F32)):
        return None
    scale, mask_term = 1.0, None
    if len(steps) == 9:  # s * scale (+ mask)
        v = steps[2].value if _is_store(steps[2], s) else None
        if isinstance(v, Binary) and v.op == "mul" and isinstance(v.b, Const):
            scale = float(v.b.value)
        elif isinstance(v, Binary) and v.op == "add":
            mask_term = v.b
        elif isinstance(v, Fma) and isinstance(v.b, Const):
            scale, mask_term = float(v.b.value), v.c
        else:
            return None
    *_, update, top_again = steps
    update = _counted(update)
    if update is None or len(update.body) != 1 or not _is_store(top_again, top):
        return None
    av = update.body[0]
    if not (isinstance(av, Store) and av.buffer == acc and isinstance(av.value, Fma)):
        return None
    if len(finish.body) != 1 or not isinstance(finish.body[0], Store):
        return None
    out = finish.body[0]
    empty_rows_zero = isinstance(out.value, Select)
    plain_locals = {top, total, acc, s, *(st.buffer for st in steps[2:-2]
                                          if isinstance(st, Store))}
    if not plain_locals <= locals_:
        return None
    names = [x.var.name for x in outer]
    *batch_vars, row_var = names
    j, d, e, f = keys.var.name, dots.var.name, update.var.name, finish.var.name

    def read(term: Expr, variables: list[str]) -> Callable[[list[Expr]], Expr]:
        return lambda index: substitute(term, dict(zip(variables, index)))

    def store(index: list[Expr], value: Expr) -> Stmt:
        at = dict(zip([*batch_vars, row_var, f], index))
        return Store(out.buffer, tuple(substitute(i, at) for i in out.index), value)

    if not all(isinstance(x.stop, Const) for x in (dots, update)):
        return None  # the dot products' and the values' widths make register tiles
    attention = Attention(
        tuple(expr_dim(x.stop) for x in outer[:-1]), expr_dim(outer[-1].stop),
        int(dots.stop.value), expr_dim(keys.stop), int(update.stop.value), scale,
        empty_rows_zero, read(dot.value.a, [*batch_vars, row_var, d]),
        read(dot.value.b, [*batch_vars, d, j]), read(av.value.b, [*batch_vars, j, e]),
        read(mask_term, [*batch_vars, row_var, j]) if mask_term is not None else None,
        store)
    # What was read off is the plain nest only if it writes the nest back exactly.
    if not all(isinstance(st, Store) for st in steps[-6:-3]):
        return None
    new_, corr, p = (st.buffer for st in steps[-6:-3])
    again = _plain_row(attention, [Var(v) for v in batch_vars], Var(row_var), _PlainNames(
        top, total, s, new_, corr, p, acc, keys.var, dots.var, init_acc.var, update.var,
        finish.var))
    if again != body:
        return None
    return AttentionNest(attention, frozenset(plain_locals))


def nests(kernel: Kernel, windows=None) -> list[tuple[str, AttentionNest]]:
    """The top-level plain attention nests of `kernel`, each with its outermost loop's
    name: what the `attention` step schedules. (`windows`: unused, as NEST_CLASSES
    passes them.)"""
    locals_ = {b.name for b in kernel.locals}
    found = []
    for s in kernel.body:
        if isinstance(s, For) and (nest := match_attention(s, locals_)) is not None:
            found.append((s.var.name, nest))
    return found


def default_parameters(nest: AttentionNest, target: Target) -> dict[str, int]:
    """The attention step's parameters on `target`: a register tile of the GEMM
    micro-kernel's shape (`register_tile`: rows times vectors of accumulators, the
    vectors of kt or v and a broadcast of q fill the registers), at most the largest
    row group; PARAMETERS' key block. A 4 x 4 tile on AVX2's 16 registers spilled: 6 x 2
    ran 1.5-2.9x faster (docs/benchmarks.md, stop 40)."""
    from ember.loops.schedules.gemm import register_tile, tile_vectors

    vectors = tile_vectors(target)
    rows, _ = register_tile(target, vectors)
    return {"key_block": PARAMETERS["key_block"][0],
            "row_group": min(rows, max(PARAMETERS["row_group"][1])),
            "tile_vectors": vectors}


def step_arguments(nest: AttentionNest, values: dict[str, int], target: Target) -> tuple:
    """The step's arguments after its loop: key_block, row_group, the tile's lanes and a
    vector's."""
    lanes = target.lanes(F32)
    return values["key_block"], values["row_group"], values["tile_vectors"] * lanes, lanes


def attention(kernel: Kernel, loop: str, key_block: int, row_group: int, tile: int,
              lanes: int) -> Kernel:
    """The schedule primitive: the plain attention nest of `loop` (a top-level loop of
    `kernel`) with keys in blocks of `key_block`, `row_group` query rows at once and
    register tiles `tile` lanes wide, of vectors of `lanes` (the module docstring's
    After)."""
    nest = step_nest(kernel, loop, nests, "attention", "plain attention nest",
                     key_block=key_block, row_group=row_group, tile=tile, lanes=lanes)
    if tile % lanes:
        raise ScheduleError(f"kernel @{kernel.name}: attention %{loop}: a tile of {tile}"
                            f" lanes is not a whole number of vectors of {lanes}")
    scheduled = replace_nest(kernel, loop, nest.locals, lambda names: schedule_attention(
        names, nest.attention, key_block, row_group, tile, lanes))
    # (A fused epilogue without vector code, sin say, runs its lanes' loop serially.)
    return verify_kernel(serial_unless_vectorizable(scheduled, simplified=True))
