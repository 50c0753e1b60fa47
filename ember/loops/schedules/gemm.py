"""The matmul schedule: cache blocks, a packed B operand and a register-blocked micro-kernel
(GotoBLAS, BLIS), applied to the plain nest that `graph.matmul` lowers to.

Before: for each output element, a scalar accumulator summed over k. `match_gemm` finds this
shape and the roles of its loops (A is the operand the row indexes, B the one the column
indexes; the other output loops are batch dims):

    for %i0 = 0 to M { for %i1 = 0 to N {
      %t0[] = 0.0:f32
      for %i2 = 0 to K { %t0[] = add(%t0[], mul(%x0[%i0, %i2], %x1[%i2, %i1])) }
      %y0[%i0, %i1] = %t0[]
    } }

After (`apply_gemm`; the rows of all batches make one matrix when B is the same for every
batch, so that a [batch, seq, K] x [K, N] product is one GEMM):

    local %acc: f32[mr, nr]                     the register tile
    local %bp: f32[nc/nr, K, nr]                a B block, packed in panels of nr columns
    for %task = 0 to batches * column blocks * row groups parallel {
      %bp = B[0:K, j0:j0+nc]                    (zeros past N)
      for %ic = row blocks of mc in the group { for %jr = panels { for %ir = tiles {
        %acc = 0
        for %k = 0 to K { for %ii = 0 to mr unrolled { for %jj = 0 to nr vectorized {
          %acc[%ii, %jj] = fma(A[row + %ii, %k], %bp[%jr, %k, %jj], %acc[%ii, %jj])
        } } }
        for %ii = 0 to min(mr, M - row) unrolled { for %jj = 0 to min(nr, N - col) vectorized {
          %y0[row + %ii, col + %jj] = %acc[%ii, %jj]
        } }
      } } }
    }

Code generation keeps the tile in vector registers (%ii is unrolled, %jj is one vector
instruction; ember/codegen/vector.py): per k, one load of B's panel row, mr broadcasts of A
and mr * nr / lanes FMAs. Tiles past M read A's last row (those lanes are never stored);
the write-back masks the columns past N, where B's panels hold zeros.

The schedule is data, a `GemmSchedule`: the tile (mr x nr), the most k per pass (kc), the
most rows and columns per block (mc, nc), whether to copy A, and how many parallel tasks
to aim for. Blocks shrink to the problem and to the stack budgets below (packed blocks are
locals, on each thread's stack: `fit_schedule` cuts them to the target's budgets). The
scheduling stage applies it as one step of the kernel's schedule, the primitive
`gemm <outer loop> mr nr kc mc nc pack_a parallel`, which prints, is written out and
replays like the others. The nest above is its primitives applied in order: tile
the output by mr x nr, block rows by mc and columns by nc, pack B per block, reorder the
k loop inside the tile, unroll %ii, vectorize %jj, fuse the batch, column-block and
row-group loops into one and make it parallel.

**One store per element.** The write-back is the nest's only store to the output, done
once per element after its whole sum, so a fused epilogue (the statements that
ember/loops/lower/fused.py puts in place of the plain nest's store, `Gemm.result`) runs
once per element. When K is longer than kc, it is summed in
passes: per pass a task packs that slice of B, its tiles start from partial sums in a
per-thread workspace `%ws: f32[blocks, mc/mr, nc/nr, mr, nr]` (zeroed at the task's start)
and go back to it, and only in the last pass are they written to the output. When the
epilogue has transcendental math (a GELU's erf, in `Gemm.result`), the tile is
first copied to a local `%stage: f32[mr, nr]` and written a row at a time (%ii serial), so
that LLVM evaluates one row's polynomials at once instead of mr rows' and does not spill.

A is read in place, or copied per row block and pass into `%ap: f32[mc/mr, mr, kc]` (each
row contiguous) when its term is more than an f32 load: an f16 or bf16 operand is then
widened once per block instead of once per use. B is read in place when all the rows fit
one tile (a vector times a matrix): each element is used once, so packing would only copy
it; such a product wider than the tile streams B's rows instead (`_RowStream`: per k, a
task's columns of row k into sums in L1, not a tile's 256 bytes of every row); and when
it comes packed already (`Gemm.b_panels`: a constant matrix that the
pack_matmuls pass packed at compile time into panels of the tile's width, so that the
micro-kernel reads %bp's layout from the operand itself). Integer and f64 matmuls keep the
plain nest.
"""

from __future__ import annotations

import dataclasses
import math
import operator
from collections.abc import Callable
from dataclasses import dataclass

from ember.dtypes import DType
from ember.errors import ScheduleError
from ember.graph.symbolic import (
    DimLike,
    SymbolicShapeError,
    definitely,
    size_hint,
    symbols_in,
)
from ember.loops.analysis import access_kind, transcendental
from ember.loops.ir import (
    Binary,
    Const,
    Expr,
    Fma,
    For,
    If,
    Kernel,
    Load,
    Prefetch,
    Select,
    Stmt,
    Store,
    Var,
    as_expr,
    binary,
    const,
    expr_dim,
    map_expr,
    substitute,
    walk_expr,
)
from ember.loops.schedules.lanes import serial_unless_vectorizable
from ember.loops.schedules.names import FreshNames
from ember.loops.verify import verify_kernel
from ember.target import Target

F32 = DType.f32
# A parallel loop needs this much work (multiply-adds, ~10 us) to pay for a fork (~8 us).
MIN_PARALLEL_FMAS = 1 << 19
# A matrix-vector product streams its matrix, one multiply-add per float read: 64K of them
# (256 KiB) take a few microseconds, which a fork to a spinning team repays. The MLP's
# 784x512 layer on 2 threads: 0.045 -> 0.03 ms a call in bench_models (ONNX Runtime 0.03).
# (An earlier try measured 0.05-0.11 ms there, when bench_models timed single calls.)
MIN_PARALLEL_MATVEC_FMAS = 1 << 16
B_IN_PLACE_BYTES = 1 << 14  # a panel of contiguous B rows read in place, not copied ...
B_IN_PLACE_TILES = 8  # ... by at most this many row tiles
# A row-major B this small is read in place by few row tiles: copying it cost 9-18% of
# 12-32-row matmuls (32x128x128 on one thread: 17.0 -> 15.4 us; an RNN step at batch 32
# with its 128x128 weights as inputs, 7%).
B_IN_PLACE_WHOLE_BYTES = 1 << 16
WORKSPACE_BYTES = 1 << 19  # partial sums of a task's rows when K takes several passes
A_LANES = 16  # the width of A's packing copy
CACHE_LINE_BYTES = 64


@dataclass(frozen=True)
class GemmSchedule:
    """The parameters of the blocked matmul, by BLIS's names. Tile sizes shrink to the
    problem (a 1-row matmul gets mr = 1)."""

    mr: int = 6  # rows of the register tile
    nr: int = 16  # columns of the register tile: the micro-kernel's vector lanes
    kc: int = 4096  # the most k per pass; a longer K sums partial results over passes
    mc: int = 96  # the most rows per block (the copied A block, mc x kc)
    nc: int = 256  # the most columns per block (the packed B block, kc x nc)
    pack_a: bool | None = None  # copy A's blocks; None: when its term is more than a load
    # Split rows into groups until there are this many parallel tasks (each packs its own B
    # block: on one thread, 256^3 ran at 107, 100 and 95 GFLOP/s with 1, 4 and 8 tasks).
    # matrix_tile asks for one a core.
    parallel: int = 4

    def __str__(self) -> str:
        return (f"gemm(mr={self.mr}, nr={self.nr}, kc={self.kc}, mc={self.mc}, nc={self.nc},"
                f" pack_a={self.pack_a}, parallel={self.parallel})")


@dataclass(frozen=True)
class Gemm:
    """A matmul found in a plain nest: out[batch, row, col] = sum_k a * b, where `a` is an
    expression of the batch, row and k variables and `b` of the batch, k and col ones."""

    # Batch loop variables and extents, outermost first. The extents and m may be sizes
    # known only at call time (graph Dims); the schedule's choices then take them to be
    # SIZE_HINT, and the nest computes its tiles and tasks from them at run time.
    batch: tuple[tuple[str, DimLike], ...]
    row: str | None  # None: A is a vector (one row)
    m: DimLike
    col: str | None  # None: B is a vector (one column)
    n: int
    k: str
    depth: int
    a: Expr
    b: Expr
    acc: str  # the scalar accumulator of the plain nest
    # The plain nest's statements after the sum, at the element's index: they read %acc
    # (the store of the result, or a fused epilogue's scalar and stores).
    result: tuple[Stmt, ...]
    # B's packing, when the operand has a cheaper form per panel than `b` (a conv's im2col
    # gathers x with div/mod on the column): b_panel(values, col0, jj) is B at column
    # col0 + jj, with `values` the batch and k variables' expressions, col0 uniform and jj
    # the lane; it must stay in bounds for columns past N (those lanes are zeroed).
    b_panel: Callable[[dict[str, Expr], Expr, Var], Expr] | None = None
    # A faster form for some panels: b_direct(col0) is (cond, value) where cond (uniform,
    # of col0) says that the panel's columns are contiguous in memory (a conv's output
    # row segment away from the padding), and value(values, jj) is B there, one vector
    # load per k instead of a gather.
    b_direct: Callable[[Expr], tuple[Expr, Callable[[dict[str, Expr], Var], Expr]]] | None = \
        None
    # B already lies in panels of this many columns, zero past N, as `b` reads them
    # (Wp[col // L, k, col % L], a packed_matmul's weights): a schedule whose tile is as
    # wide reads them in place instead of copying them.
    b_panels: int | None = None
    # B's rows lie contiguous in memory as `b` reads them (a 1x1 conv's input, unpadded, at
    # stride 1): a tile's panel row is one vector load from the operand itself.
    b_rows_contiguous: bool = False


def _variables(e: Expr) -> set[str]:
    return {x.name for x in walk_expr(e) if isinstance(x, Var)}


def match_gemm(body: list[Stmt], shapes: dict[str, tuple[int, ...]] | None = None
               ) -> Gemm | None:
    """The matmul computed by `body` when it has the plain lowering's shape: a perfect nest
    over the output (batch dims, then the row if A is a matrix, then the column if B is),
    around acc = 0; for k { acc = add(acc, mul(a, b)) }; out[index] = f(acc) (or a fused
    epilogue's stores at the index). `shapes`: the buffers' shapes, when known."""
    loops: list[For] = []
    while len(body) == 1 and isinstance(body[0], For):
        loop = body[0]
        if loop.start != Const(0) or loop.step != 1 or expr_dim(loop.stop) is None:
            return None  # (rows and batches may be sizes known at call time)
        loops.append(loop)
        body = loop.body
    if len(body) < 3:
        return None
    init, reduce, *result = body
    if not (isinstance(init, Store) and init.index == () and init.value == const(0, F32)
            and isinstance(reduce, For) and reduce.start == Const(0) and reduce.step == 1
            and isinstance(reduce.stop, Const) and len(reduce.body) == 1):
        return None
    acc, step = init.buffer, reduce.body[0]
    term = step.value if isinstance(step, Store) else None
    if not (isinstance(step, Store) and step.buffer == acc and step.index == ()
            and isinstance(term, Binary) and term.op == "add"
            and term.a == Load(acc, (), F32) and isinstance(term.b, Binary)
            and term.b.op == "mul"):
        return None
    a, b = term.b.a, term.b.b
    names = [loop.var.name for loop in loops]
    if not element_result(result, acc, tuple(loop.var for loop in loops)) or any(
            isinstance(x, Load) and x.buffer == acc for e in (a, b) for x in walk_expr(e)):
        return None
    in_a, in_b, rest = _variables(a), _variables(b), list(names)
    col = rest.pop() if rest and rest[-1] in in_b and rest[-1] not in in_a else None
    row = rest.pop() if rest and rest[-1] in in_a and rest[-1] not in in_b else None
    k = reduce.var.name
    if not (in_a <= {*rest, row, k} and in_b <= {*rest, col, k}):
        return None
    extent = {loop.var.name: expr_dim(loop.stop) for loop in loops}
    if col is not None and not isinstance(extent[col], int):
        # The columns make the packed panels: a number is needed (a plain nest would be
        # many times slower; the driver compiles per size instead).
        raise SymbolicShapeError(f"a matmul of {extent[col]} columns, a size known only at"
                                 " call time", symbols_in(extent[col]))
    return Gemm(tuple((n, extent[n]) for n in rest), row, extent.get(row, 1), col,
                extent.get(col, 1), k, int(reduce.stop.value), a, b, acc, tuple(result),
                b_panels=_panel_width(b, k, col, shapes))


def element_result(result: list[Stmt], acc: str, index: tuple[Var, ...]) -> bool:
    """Whether `result` writes the sum in %acc per output element: stores at the nest's
    index, the last one among them, or into scalars that later ones read (a fused
    epilogue), none into %acc."""
    return all(isinstance(s, Store) and s.buffer != acc and s.index in ((), index)
               for s in result) and result[-1].index == index


def _panel_width(b: Expr, k: str, col: str | None,
                 shapes: dict[str, tuple[int, ...]] | None) -> int | None:
    """L when B is read from panels of L columns, wp[col // L, k, col % L] (a
    packed_matmul's weights; wp[0, k, col] when N fits one panel), else None."""
    if not (isinstance(b, Load) and len(b.index) == 3 and col is not None
            and b.index[1] == Var(k)):
        return None
    panel, _, lane = b.index
    shape = shapes.get(b.buffer) if shapes else None
    if panel == Const(0) and lane == Var(col) and shape is not None and shape[0] == 1:
        return shape[2]  # col // L and col % L simplified away by col's range
    if isinstance(panel, Binary) and panel.op == "floordiv" and panel.a == Var(col) and \
            isinstance(panel.b, Const) and lane == binary("mod", Var(col), panel.b):
        return int(panel.b.value)
    return None


def b_rows_contiguous(g: Gemm) -> bool:
    """Whether a row of a tile's panel of B is one contiguous run of the operand that the
    tiles may read in place: a 1x1 conv's input (`Gemm.b_rows_contiguous`), or a
    row-major B of at most B_IN_PLACE_WHOLE_BYTES, which stays in cache whole (a larger
    one's rows, a page apart at N = 1024, share L1's sets: 40x256x1024 ran 1.09x slower
    in place, interleaved runs on one thread)."""
    return g.b_rows_contiguous or (
        isinstance(g.b, Load) and g.col is not None and g.b_panel is None and
        g.b_panels is None and g.depth * g.n * 4 <= B_IN_PLACE_WHOLE_BYTES and
        access_kind(g.b.index, g.col) == "contiguous")


# Panels of B that each pass's slice of A serves, at least, when A is larger than half of
# L2: the slice streams from L3 once per column block.
A_REUSE_PANELS = 4


def default_gemm_schedule(g: Gemm, target: Target) -> GemmSchedule:
    """The schedule a matmul gets on `target` (a tuned compile asks the database first)."""
    rows = g.m * math.prod(e for _, e in g.batch) if folds_batches(g) else g.m
    schedule = default_tile(g.m, bool(g.batch), g.n, target, size_hint(rows), a_row_pitch(g))
    kc = pass_depth(schedule, target, rows, g.depth)
    nc = block_columns(schedule, g.depth, g.n)
    if kc < schedule.kc and 4 * rows * hint(g.depth) > target.l2_bytes // 2:
        nc = max(nc, schedule.nr * A_REUSE_PANELS)
    return dataclasses.replace(schedule, nc=nc, kc=kc)


def pass_depth(schedule: GemmSchedule, target: Target, rows: DimLike, depth: DimLike) -> int:
    """The most k of one pass (kc): as deep as keeps a panel's block of B (kc x nr) in half
    of L1, where every row tile reads it instead of from L2; `schedule.kc` (all of K,
    `cache_blocks`) when K is that shallow already or A's rows are known only at call time
    (code for every size is one code whatever they turn out to be), or A is larger than
    the cores' L2s together (its rows then stream from L3 or memory, and a pass would cut
    each row's run into short ones). Where A's rows fill more than half of L2, a block of
    columns is several panels (A_REUSE_PANELS), so that a pass's slice of A, read from
    L3, serves them all from L2. Transformer projections of 32-64 rows (K = 768 and 3072,
    weights from memory) ran 1.1-1.2x faster on 2 threads and 1.2x on 1 (stop 47);
    128-197 rows by K = 3072 1.15x on 1 and 2 threads, 256x4096x1024 1.4x, with four
    panels a block; 1024^3 the same; 2048^3 (16 MB of A) 0.9x in passes, so one pass
    (Sapphire Rapids, docs/benchmarks.md, stop 48)."""
    in_l1 = max(1, target.l1d_bytes // 2 // (4 * schedule.nr))
    if not isinstance(rows, int) or hint(depth) <= in_l1 or \
            4 * rows * hint(depth) > target.cores * target.l2_bytes:
        return schedule.kc
    return in_l1


def block_columns(schedule: GemmSchedule, depth: DimLike, n: int) -> int:
    """The columns of a B block for a matmul of depth K: `schedule.nc`, or more (up to N) at
    a depth under 256, so that the block keeps B_BLOCK_BYTES. Each column block reads all
    of A again: at K = 32, 64 or 96, A is the larger operand, and N in one block ran 1.2-
    3.4x faster (SegFormer's and LeViT's matmuls, docs/benchmarks.md, stop 40)."""
    nr = schedule.nr
    widest = B_BLOCK_BYTES // (4 * hint(depth)) // nr * nr
    return max(schedule.nc, min(widest, -(-n // nr) * nr))


def default_tile(rows: DimLike, batched: bool, n: int, target: Target,
                 matrix_rows: DimLike | None = None, a_pitch: int | None = None
                 ) -> GemmSchedule:
    """The default schedule of a matmul of `rows` rows (per batch) by `n` columns on
    `target`: also the panel width of the matrices packed at compile time (pack_matmuls),
    so that the micro-kernel reads them in place. `matrix_rows`: the rows that the tiles
    cover (all batches' when they fold into one matrix); `a_pitch`: see matrix_tile."""
    width = matvec_width(target)
    if matrix_vector(rows, batched) and n >= width:
        return GemmSchedule(mr=2, nr=width)
    return matrix_tile(target, hint(matrix_rows or rows), a_pitch, n)


def folds_batches(g: Gemm) -> bool:
    """Whether the rows of every batch make one matrix: B does not depend on the batch."""
    return not _variables(g.b) & {n for n, _ in g.batch}


def a_row_pitch(g: Gemm) -> int | None:
    """The bytes from one row of A to the next as the micro-kernel reads them, when it
    reads them in place from a row-major operand (A[..., row, k]); None otherwise (a copied
    A gets a pitch of its own)."""
    a = g.a
    if not (isinstance(a, Load) and g.row is not None and len(a.index) >= 2
            and a.index[-1] == Var(g.k) and a.index[-2] == Var(g.row)):
        return None
    return g.depth * a.dtype.itemsize


# A matrix-vector product streams B, one multiply-add per element: its tile reads this many
# bytes of each row of B per k, so that the reads are long runs for the prefetchers.
MATVEC_ROW_BYTES = 256


def matvec_width(target: Target) -> int:
    """The columns of a matrix-vector product's tile: MATVEC_ROW_BYTES of f32, as far as
    the vector registers hold two rows' accumulators and broadcasts, in a power of two of
    vectors (`whole_vectors`: 7 vectors fit 16 registers, and would go through the stack)."""
    lanes = target.lanes(F32)
    vectors = max(1, min(MATVEC_ROW_BYTES // (4 * lanes), (target.vector_registers - 2) // 2))
    return lanes * 2 ** (vectors.bit_length() - 1)


def matrix_vector(rows: int, batched: bool) -> bool:
    """Whether a matmul of `rows` rows (per batch) is a matrix-vector product: one row tile
    that reads each element of B once."""
    return definitely(operator.le, rows, 2) and not batched  # (sizes: taken to be many)


def register_tile(target: Target, vectors: int | None = None) -> tuple[int, int]:
    """(most rows, nr) of the micro-kernel on `target`: `vectors` vectors of f32 across
    (nr; None: `tile_vectors`) and as many rows as the vector registers hold. Per k the
    tile takes `vectors` loads of B's panel, mr broadcasts of A and mr * vectors FMAs into
    as many accumulators; the accumulators, B's vectors and one broadcast must fit the
    registers (else LLVM spills in the innermost loop). More rows read each row of B's
    panel for more FMAs: `tile_rows` picks the rows of a given matmul."""
    if vectors is None:
        vectors = tile_vectors(target)
    vectors = max(1, min(vectors, (target.vector_registers - 2) // 2))
    rows = (target.vector_registers - vectors - 1) // vectors
    return max(1, rows), vectors * target.lanes(F32)


# The loads a cycle that a micro-kernel may ask while its FMA units run at full rate: its
# broadcasts come from A's rows, streams of their own, and its B vectors from a panel in
# L2. On Sapphire Rapids (two FMA units) a 12 x 2-vector tile (14 loads per 12 cycles) ran
# 0.95-0.97x a 6 x 4-vector one (10 per 12) at 2048^3 (docs/benchmarks.md).
TILE_LOADS_PER_CYCLE = 1.0


def tile_vectors(target: Target) -> int:
    """The vectors across the micro-kernel on `target`: the fewest (the narrowest panels,
    the fewest columns past N) whose tallest tile asks at most TILE_LOADS_PER_CYCLE loads
    a cycle of the FMA units at full rate; else the one that asks the fewest. Each vector
    across lets one broadcast of A feed one more FMA, and costs a row of accumulators per
    vector: one FMA unit and 32 registers take two vectors (14 rows: 16 loads per 28
    cycles), two units four (6 rows: 10 loads per 12 cycles), and 16 registers two."""
    def loads_per_cycle(vectors: int) -> float:
        rows = register_tile(target, vectors)[0]
        return (rows + vectors) * target.fma_units / (rows * vectors)

    widths = [v for v in (1, 2, 4, 8)
              if v <= (target.vector_registers - 2) // 2
              and (target.vector_registers - v - 1) // v >= 1]
    fed = [v for v in widths if loads_per_cycle(v) <= TILE_LOADS_PER_CYCLE]
    return min(fed) if fed else min(widths, key=loads_per_cycle)


def _busy_rows(target: Target, vectors: int) -> int:
    """The fewest tile rows whose accumulators keep every FMA unit busy: fma_units *
    fma_latency independent chains."""
    return -(-target.fma_units * target.fma_latency // vectors)


# The cost of a tile per k, in FMA rounds, that does not grow with its rows: its loads of
# B's panel and the loop (a model for trading rows per tile against rows past the end).
TILE_FIXED_COST = 3


def tile_rows(target: Target, rows: int | None, a_pitch: int | None,
              vectors: int | None = None, most: int | None = None) -> int:
    """The rows of the register tile of a matmul of `rows` rows on `target`, between the
    FMA units' need and the registers' room (register_tile). Each row of A is read in
    place, a stream of its own: when the pitch from row to row puts more of the tile's rows
    in one set of L1 than it has ways (a pitch of a multiple of 4 KiB on a 48 KiB 12-way
    L1), they evict each other every k, so such tiles are out. Among the rest, the one
    that covers the rows in the fewest FMA rounds, tiles past the end included: each tile
    costs its rows plus TILE_FIXED_COST per k (16 rows: two tiles of 8, not two of 12).
    `vectors`: across the tile (None: `tile_vectors`); `most`: a lower cap on the rows
    than the registers'."""
    vectors = vectors or tile_vectors(target)
    most = min(register_tile(target, vectors)[0], most or 1 << 30)
    fewest = min(most, _busy_rows(target, vectors))
    fits = [r for r in range(fewest, most + 1)
            if a_pitch is None or _rows_per_l1_set(target, a_pitch, r) <= target.l1d_ways]
    fits = fits or [fewest]
    if rows is None:
        return max(fits)
    return min(fits, key=lambda r: (_ceil(rows, r) * (r + TILE_FIXED_COST), -r))


def _rows_per_l1_set(target: Target, pitch: int, rows: int) -> int:
    """The most of `rows` rows, `pitch` bytes apart, whose lines fall in one set of L1."""
    sets = max(1, target.l1d_bytes // (64 * target.l1d_ways))
    count: dict[int, int] = {}
    for i in range(rows):
        line = i * pitch // 64 % sets
        count[line] = count.get(line, 0) + 1
    return max(count.values())


def conv_tile(target: Target) -> tuple[int, int]:
    """(mr, nr) of an implicit-GEMM convolution's micro-kernel on `target`: CONV_COLUMNS
    output positions across, and at least two vectors (wider tiles leave fewer panels
    inside an output row), and as many output channels as the registers hold, up to
    MAX_CONV_TILE_ROWS (A is the filter read in place: a stream per row). With one vector
    across, each broadcast of A feeds one FMA: AVX-512's 8 x 16 tile asked 9 loads per 8
    FMAs, and 8 x 32 ran RegNet's and ResNet-50's implicit-GEMM convs 1.2x faster on
    Sapphire Rapids (docs/benchmarks.md, stop 45)."""
    lanes = target.lanes(F32)
    vectors = max(2, CONV_COLUMNS // lanes)
    rows = (target.vector_registers - vectors - 1) // vectors
    return max(1, min(rows, MAX_CONV_TILE_ROWS)), vectors * lanes


CONV_COLUMNS = 16
MAX_CONV_TILE_ROWS = 8


def matrix_tile(target: Target, rows: int | None = None, a_pitch: int | None = None,
                cols: int | None = None) -> GemmSchedule:
    """The default schedule on `target` of a matmul of `rows` rows (more than two; None:
    many) whose micro-kernel reads A's rows in place `a_pitch` bytes apart (None: A is
    copied, or its rows are not apart in memory), of `cols` columns (None: many).

    The tile is `tile_vectors` vectors across, or the widest narrower one that computes
    less than an eighth more columns than the narrowest (`padded_columns`: N = 40 of 16
    lanes is 48 columns in tiles of one vector, 64 in tiles of two or four). Its rows stay
    at most the two-vector tile's: each is a stream of A read in place, and more measured
    slower (512x512x40 on Zen 4: 14 rows 89 GFLOP/s, 24 rows 46; docs/benchmarks.md);
    unless the FMA units need more independent accumulators than that (AVX2's 16
    registers hold 6 rows of two vectors: a one-vector tile of 6 rows was latency-bound,
    256x256x49 at 80 GFLOP/s on Zen 2, 105-111 with 10)."""
    lanes = target.lanes(F32)
    widths = [v for v in (1, 2, 4, 8) if v <= tile_vectors(target)]
    vectors = widths[-1]
    if cols is not None:
        fewest = min(padded_columns(cols, v * lanes, lanes) for v in widths)
        vectors = max(v for v in widths if 7 * padded_columns(cols, v * lanes, lanes)
                      < 8 * fewest)
    most = max(register_tile(target, max(vectors, 2))[0],
               min(register_tile(target, vectors)[0], _busy_rows(target, vectors)))
    nr = vectors * lanes
    mr = tile_rows(target, rows, a_pitch, vectors, most=most)
    # A task per core: each task packs its own B block, so tasks beyond the team repack B
    # for nothing (256^3: 4 tasks 0.90x torch.matmul on 1 thread and 0.91x on 2; one a core
    # 1.08x and 1.02x; docs/benchmarks.md).
    return GemmSchedule(mr=mr, nr=nr, parallel=max(1, target.cores),
                        **cache_blocks(target, mr, nr))


# A block's rows and columns, about: each packed B panel serves MC_ROWS rows of tiles
# before the next, and each block of A's rows NC_COLUMNS of panels. A narrow B block leaves
# L2 to the rows of A streaming past it: on Sapphire Rapids, 64 columns ran 3-8% faster
# than 256 at 256-2048 (docs/benchmarks.md).
MC_ROWS = 96
NC_COLUMNS = 64

# The bytes of a packed B block that NC_COLUMNS columns make at K = 256, where they were
# measured best: a shallower matmul's block is as many bytes, so more columns.
B_BLOCK_BYTES = 4 * 256 * NC_COLUMNS


def cache_blocks(target: Target, mr: int, nr: int) -> dict[str, int]:
    """The blocks (kc, mc, nc) around an mr x nr tile on `target`, from its L2 (BLIS's
    blocking, with this micro-kernel's reads). A task's packed B block (kc x nc) stays in
    L2 while its row tiles stream A past it, in half of L2 (`packed_b_bytes`); A's rows are
    read in place, long runs that the prefetchers follow, and a pass over k would cut them
    into short ones and reload every tile's partial sums, so a pass is as deep as one
    packed panel (kc x nr) that fills that half: K is summed in one pass unless it is
    longer. mc and nc are whole tiles and panels near MC_ROWS and NC_COLUMNS."""
    return {"kc": packed_b_bytes(target) // (4 * nr), "mc": mr * max(1, round(MC_ROWS / mr)),
            "nc": nr * max(1, round(NC_COLUMNS / nr))}


# Packed blocks are locals, on each thread's stack (8 MiB by default): the budgets below
# stop at these however large the caches.
MOST_PACKED_B_BYTES = 1 << 20
MOST_PACKED_A_BYTES = 1 << 19


def packed_b_bytes(target: Target) -> int:
    """The most bytes of a task's packed B block: half of L2."""
    return min(target.l2_bytes // 2, MOST_PACKED_B_BYTES)


def packed_a_bytes(target: Target) -> int:
    """The most bytes of a copied A block (mc x kc): a quarter of L2, beside B's block."""
    return min(target.l2_bytes // 4, MOST_PACKED_A_BYTES)


def next_panel_prefetches(panels: str, following: Expr, first_row: Expr, rows: int,
                          width: int, tile: Expr, tiles: int) -> list[Stmt]:
    """Prefetches of the lines of `rows` rows of packed panel `following` (rows of `width`
    f32s, from `first_row`), for one step of tile `tile` of `tiles` that read the current
    panel: the tiles take different lines, tile t every one of the rows' L lines from
    t * n on (n per step), so that together they fetch all of them, spread over the whole
    panel's work."""
    per_line = CACHE_LINE_BYTES // 4
    per_row = max(1, width // per_line)
    lines = rows * per_row  # (L)
    per_step = _ceil(lines, tiles)  # (n)
    out: list[Stmt] = []
    for s in range(per_step):
        line = (tile * per_step + s) % lines if lines > 1 else Const(0)
        row = first_row if rows == 1 else first_row + line // per_row
        out.append(Prefetch(panels, (following, row, (line % per_row) * per_line)))
    return out


def _ceil(a: DimLike, b: int) -> DimLike:
    return -(-a // b) if isinstance(a, int) else (a + b - 1) // b


def hint(size: DimLike) -> int:
    """A number for a size in a choice of the schedule: itself, or a size known at call
    time at its SIZE_HINT."""
    return size if isinstance(size, int) else size_hint(size)


def _min(a: Expr | int, b: Expr | int) -> Expr:
    return binary("min", a, b)


class _Builder:
    """Builds the scheduled nest of one Gemm; `ctx` makes its variables and locals."""

    def __init__(self, ctx, g: Gemm, s: GemmSchedule, most_rows: int | None = None):
        """`most_rows`: the rows are known at call time but at most this many (the small
        variant of a matmul of every size): its choices take them to be that many."""
        self.ctx, self.g = ctx, g
        # Rows and batches may be sizes known at call time (Dims): the choices below take
        # them at their SIZE_HINT (`hint`), and the nest computes the counts that depend on
        # them (tiles, row groups' ranges, tasks) at run time.
        self.nbatch = math.prod(e for _, e in g.batch)
        self.fold = folds_batches(g)
        self.rows = g.m * (self.nbatch if self.fold else 1)
        self.nb = 1 if self.fold else self.nbatch
        self.symbolic = not isinstance(self.rows, int) or not isinstance(self.nb, int)
        rows_hint = hint(self.rows) if most_rows is None else most_rows
        # nr as fitted (`fit_schedule`): past N only when rounded up to whole vectors.
        self.mr, self.nr = min(s.mr, rows_hint), s.nr
        self.npc = _ceil(g.depth, s.kc)
        self.kc = _ceil(g.depth, self.npc)
        # Packed blocks are locals, on the stack of each thread: `fit_schedule` cuts them
        # to the target's budgets; these caps hold on any target.
        widest = max(self.nr, MOST_PACKED_B_BYTES // (4 * self.kc) // self.nr * self.nr)
        self.njc = _ceil(g.n, min(s.nc, widest))
        self.work = hint(self.nbatch * g.n * g.depth) * (hint(g.m) if most_rows is None
                                                          else most_rows)
        matvec = matrix_vector(g.m if most_rows is None else most_rows, bool(g.batch))
        self.threaded = self.work >= (MIN_PARALLEL_MATVEC_FMAS if matvec else MIN_PARALLEL_FMAS)
        if matvec and self.threaded:
            # A matrix-vector product has one tile of rows: its columns make the tasks. Each
            # thread then streams its own part of the matrix, which stays in its core's L2
            # from call to call (the MLP's 512x256 layer on 2 threads: 7 -> 4 us).
            self.njc = max(self.njc, min(s.parallel, _ceil(g.n, self.nr)))
        # An odd number of column blocks leaves one thread of a pair idle for the last one:
        # one more block evens them (a 56x56 conv's 3136 columns: 13 blocks of 256 -> 14
        # of 224, 8% faster on 2 threads).
        if self.njc % 2 and 1 < self.njc < 16 and hint(self.nb) % 2 and \
                _ceil(g.n, self.nr) > self.njc:
            self.njc += 1
        self.ncp = _ceil(_ceil(g.n, self.njc), self.nr)  # panels per column block
        self.nc = self.ncp * self.nr
        self.njc = _ceil(g.n, self.nc)  # fewer when rounding up to panels made blocks wider
        tallest = max(1, MOST_PACKED_A_BYTES // (4 * self.kc) // self.mr)
        self.mcp = min(max(1, s.mc // self.mr), tallest, _ceil(rows_hint, self.mr))
        self.mc = self.mcp * self.mr
        # Row groups: the tiles split evenly, into enough groups for `parallel` tasks, and
        # small enough that a group's partial sums fit the workspace budget. (With fewer
        # tiles at run time than groups, some groups have none.)
        self.tiles = _ceil(self.rows, self.mr)
        wanted = s.parallel if self.threaded else 1  # too little work for a team
        tiles_hint = _ceil(rows_hint, self.mr)
        groups = min(tiles_hint, max(1, _ceil(wanted, hint(self.nb) * self.njc)))
        if self.npc > 1 and self.symbolic:  # (a workspace per group: sized by the tiles)
            raise SymbolicShapeError(f"gemm: K = {g.depth} summed in passes needs a"
                                     " workspace sized by the rows, known at call time",
                                     symbols_in((self.rows, self.nb)))
        if self.npc > 1:
            most = max(1, WORKSPACE_BYTES // (4 * self.mc * self.nc)) * self.mcp
            groups = max(groups, _ceil(self.tiles, most))
        self.nmg = groups
        self.per_group = _ceil(_ceil(self.tiles, groups), self.mcp)  # the most blocks
        self.pack_a = s.pack_a if s.pack_a is not None else not isinstance(g.a, Load)
        self.acc = ctx.local(F32, (self.mr, self.nr))
        # With transcendental math in the stores (a fused GELU), writing the unrolled tile
        # at once gives LLVM mr * nr / lanes polynomials to interleave, more live values
        # than registers: it spills. The tile goes to a staging buffer, and the stores run
        # a row at a time from there (linear 128x768x3072 + GELU on 1 thread: 6.03 -> 5.65
        # ms, 5.45 without the GELU).
        heavy = any(transcendental(x) for st in g.result for x in walk_expr(st.value))
        self.stage = ctx.local(F32, (self.mr, self.nr)) if heavy else None
        # One tile of rows uses each element of B once: packing would only copy it.
        self.b_in_panels = g.b_panels == self.nr and isinstance(g.b, Load)
        # A short panel of contiguous rows read by few row tiles is read in place: it stays
        # in L1 between them, and copying it would cost about what they spend reading it.
        # MobileNetV2's 1x1 convs down to 16-64 channels, one thread: 0.19 -> 0.13 ms
        # (96->24 at 56x56: 0.27 -> 0.20); with more tiles the copy paid (16->96 at
        # 112x112: 0.44 -> 0.48 in place; 96->576 at 14x14: 0.24 -> 0.26).
        in_place = b_rows_contiguous(g) and self.kc * self.nr * 4 <= B_IN_PLACE_BYTES \
            and tiles_hint <= B_IN_PLACE_TILES
        self.bp = ctx.local(F32, (self.ncp, self.kc, self.nr)) \
            if tiles_hint > 1 and not self.b_in_panels and not in_place else None
        # A's rows are copied in chunks of a_lanes; a pitch of a multiple of 4 KiB would put
        # the same k of every row of a tile in one L1 set, so such pitches get one more.
        self.a_lanes = min(self.kc, A_LANES)
        pitch = _ceil(self.kc, self.a_lanes) * self.a_lanes
        pitch += self.a_lanes if pitch % 1024 == 0 else 0
        self.ap = ctx.local(F32, (self.mcp, self.mr, pitch)) if self.pack_a else None
        self.ws = ctx.local(F32, (self.per_group, self.mcp, self.ncp, self.mr, self.nr)) \
            if self.npc > 1 else None

    def var(self, hint: str) -> Var:
        return self.ctx.var(hint)

    def loop(self, hint: str, stop: Expr | int, body, kind: str = "serial") -> list[Stmt]:
        """for %<hint> = 0 to stop { body(var) }; just body(0) when it runs once."""
        stop = as_expr(stop)
        if stop == Const(1):
            return body(Const(0))
        v = self.var(hint)
        return [For(v, Const(0), stop, body(v), 1, kind)]

    # -- operand terms at scheduled indices
    def values(self, batch: Expr, row: Expr, k: Expr | None, col: Expr | None) -> dict:
        """The plain nest's variables as expressions of the scheduled ones."""
        g = self.g
        if self.fold and self.nbatch != 1:  # (a Dim is never 1)
            batch, row = row // g.m, row % g.m
        values: dict[str, Expr] = {}
        for depth, (name, extent) in reversed(list(enumerate(g.batch))):
            values[name] = batch % extent if depth else batch  # the outermost needs no mod
            batch = batch // extent
        if g.row is not None:
            values[g.row] = row
        if g.col is not None and col is not None:
            values[g.col] = col
        if k is not None:
            values[g.k] = k
        return values

    def a_term(self, batch: Expr, row: Expr, k: Expr) -> Expr:
        return substitute(self.g.a, self.values(batch, row, k, None))

    def b_term(self, batch: Expr, k: Expr, col: Expr) -> Expr:
        return substitute(self.g.b, self.values(batch, Const(0), k, col))

    def clamp_row(self, row: Expr) -> Expr:
        """`row` of a tile, or the last row for the rows of the last tile past the end."""
        return row if self.rows % self.mr == 0 else _min(row, as_expr(self.rows - 1))

    def clamp_k(self, k: Expr) -> Expr:
        return k if self.g.depth % self.kc == 0 else _min(k, self.g.depth - 1)

    # -- the nest
    def build(self) -> list[Stmt]:
        tasks = self.nb * self.njc * self.nmg
        kind = "parallel" if self.threaded else "serial"
        return self.loop("task", tasks, self.task, kind)

    def task(self, t: Expr) -> list[Stmt]:
        """One parallel task: a column block of one batch, for one group of row blocks."""
        batch = t // (self.njc * self.nmg)
        jc = t // self.nmg
        j0 = (jc if self.nb == 1 else jc % self.njc) * self.nc
        group = t % self.nmg
        first = group * self.tiles // self.nmg  # the group's tiles: [first, last)
        last = (group + 1) * self.tiles // self.nmg
        blocks = (last - first + (self.mcp - 1)) // self.mcp

        def block(k0: Expr, pc: Expr | None):
            return lambda ic: self.k_pass(batch, j0, first + ic * self.mcp, last, ic, k0, pc)

        if self.ws is None:
            return [*self.pack_b(batch, j0, Const(0)),
                    *self.loop("ic", blocks, block(Const(0), None))]

        def k_pass(pc: Expr) -> list[Stmt]:
            k0 = pc * self.kc
            return [*self.pack_b(batch, j0, k0), *self.loop("ic", blocks, block(k0, pc))]

        return [*self.fill(self.ws, Const(0.0, F32)), *self.loop("pc", self.npc, k_pass)]

    def fill(self, buf, value: Expr) -> list[Stmt]:
        index = [self.var("z") for _ in buf.shape]
        stmts: list[Stmt] = [Store(buf.name, tuple(index), value)]
        for depth in reversed(range(len(buf.shape))):
            kind = "vectorized" if depth == len(buf.shape) - 1 else "serial"
            stmts = [For(index[depth], Const(0), Const(buf.shape[depth]), stmts, 1, kind)]
        return stmts

    def pack_b(self, batch: Expr, j0: Expr, k0: Expr) -> list[Stmt]:
        """%bp[jp, k, jj] = B[k0 + k, j0 + jp * nr + jj], zero past N."""
        g, nr = self.g, self.nr
        if self.bp is None:
            return []

        def panel(jp: Expr, edge: bool) -> list[Stmt]:
            k, jj = self.var("k"), self.var("jj")
            col = j0 + jp * nr + jj
            if g.b_panel is not None:
                values = self.values(batch, Const(0), self.clamp_k(k0 + k), None)
                value = g.b_panel(values, j0 + jp * nr, jj)
                if edge:
                    value = Select(binary("lt", col, g.n), value, Const(0.0, F32))
                store = Store(self.bp.name, (jp, k, jj), value)
                general = [For(k, Const(0), Const(self.kc),
                               [For(jj, Const(0), Const(nr), [store], 1, "vectorized")])]
                if g.b_direct is None or edge:
                    return general
                cond, direct = g.b_direct(j0 + jp * nr)
                fast = Store(self.bp.name, (jp, k, jj), direct(values, jj))
                return [If(cond, [For(k, Const(0), Const(self.kc),
                                      [For(jj, Const(0), Const(nr), [fast], 1, "vectorized")])],
                           general)]
            value = self.b_term(batch, self.clamp_k(k0 + k), col)
            if edge:  # the last panel: past N, zeros (the load stays in bounds)
                inside = self.b_term(batch, self.clamp_k(k0 + k), _min(col, g.n - 1))
                value = Select(binary("lt", col, g.n), inside, Const(0.0, F32))
            store = Store(self.bp.name, (jp, k, jj), value)
            return [For(k, Const(0), Const(self.kc),
                        [For(jj, Const(0), Const(nr), [store], 1, "vectorized")])]

        def panels(jp: Expr) -> list[Stmt]:
            if g.n % self.nc == 0:  # every panel is full
                return panel(jp, False)
            full = binary("le", j0 + jp * nr + nr, g.n)
            if isinstance(full, Const):
                return panel(jp, not full.value)
            return [If(full, panel(jp, False), panel(jp, True))]

        return self.loop("jp", self.ncp, panels)

    def copy_a(self, batch: Expr, ib: Expr, k0: Expr) -> list[Stmt]:
        """%ap[ip, ii, k] = A[ib + ip * mr + ii, k0 + k]: the block's rows copied, each row
        contiguous, in chunks of a_lanes (rows past the end repeat the last one; a chunk
        that crosses K repeats A's last column)."""
        g, lanes = self.g, self.a_lanes
        chunks = _ceil(self.kc, lanes)
        crosses = (self.npc - 1) * self.kc + chunks * lanes > g.depth  # some chunk crosses K

        def copy(ip: Expr, ii: Expr, kb: Expr) -> list[Stmt]:
            row = ib + ip * self.mr + ii
            if self.rows % self.mc != 0 or self.nmg > 1:  # the copy may run past the rows
                row = _min(row, as_expr(self.rows - 1))

            def chunk(edge: bool) -> list[Stmt]:
                kv = self.var("kv")
                k = kb * lanes + kv
                depth = _min(k0 + k, g.depth - 1) if edge else k0 + k
                store = Store(self.ap.name, (ip, ii, k), self.a_term(batch, row, depth))
                return [For(kv, Const(0), Const(lanes), [store], 1, "vectorized")]

            inside = binary("le", k0 + (kb + 1) * lanes, g.depth)
            if not crosses or isinstance(inside, Const):
                return chunk(crosses and not inside.value)
            return [If(inside, chunk(False), chunk(True))]

        return self.loop("ip", self.mcp, lambda ip: self.loop(
            "ii", self.mr, lambda ii: self.loop("kb", chunks, lambda kb: copy(ip, ii, kb))))

    def k_pass(self, batch: Expr, j0: Expr, tile0: Expr, last: Expr, ic: Expr, k0: Expr,
               pc: Expr | None) -> list[Stmt]:
        """One block's tiles (from tile0, before `last`) over one pass of k, its B block
        already packed; `ic` is the block's number in its group."""
        g, ib = self.g, tile0 * self.mr
        stmts = self.copy_a(batch, ib, k0) if self.ap is not None else []
        jr_stop = _min(self.ncp, (Const(g.n) - j0 + (self.nr - 1)) // self.nr)
        ir_stop = _min(self.mcp, last - tile0)
        stmts += self.loop("jr", jr_stop, lambda jr: self.loop(
            "ir", ir_stop, lambda ir: self.tile(batch, ib + ir * self.mr, j0 + jr * self.nr,
                                                (ic, ir, jr), k0, pc)))
        return stmts

    def tile_loops(self, body, rows: Expr | int, cols: Expr | int,
                   row_kind: str = "unrolled") -> For:
        """for ii < rows <row_kind> { for jj < cols vectorized { body(ii, jj) } }"""
        ii, jj = self.var("ii"), self.var("jj")
        rows = rows if isinstance(rows, Expr) else Const(rows)
        cols = cols if isinstance(cols, Expr) else Const(cols)
        return For(ii, Const(0), rows, [For(jj, Const(0), cols, body(ii, jj), 1, "vectorized")],
                   1, row_kind)

    def tile(self, batch: Expr, row: Expr, col: Expr, at: tuple[Expr, Expr, Expr], k0: Expr,
             pc: Expr | None) -> list[Stmt]:
        """The micro-kernel: the mr x nr tile at (row, col), over one pass of k; `at` is
        (block in the group, tile in the block, panel), where its partial sums are kept."""
        g, acc = self.g, self.acc.name
        ic, ir, jr = at

        def acc_at(ii, jj) -> Load:
            return Load(acc, (ii, jj), F32)

        if self.ws is None:
            init = self.tile_loops(lambda ii, jj: [Store(acc, (ii, jj), Const(0.0, F32))],
                                   self.mr, self.nr)
        else:
            init = self.tile_loops(lambda ii, jj: [Store(acc, (ii, jj),
                                                         Load(self.ws.name, (ic, ir, jr, ii, jj),
                                                              F32))], self.mr, self.nr)
        depth = Const(self.kc) if pc is None or g.depth % self.kc == 0 else \
            _min(self.kc, Const(g.depth) - k0)

        def update(edge: bool) -> For:
            k = self.var("k")

            def step(ii, jj) -> list[Stmt]:
                if self.ap is not None:
                    a = Load(self.ap.name, (ir, ii, k), F32)
                else:
                    a = self.a_term(batch, self.clamp_row(row + ii), k0 + k)
                if self.bp is not None:
                    b = Load(self.bp.name, (jr, k, jj), F32)
                elif self.b_in_panels:  # the tile's panel, zero past N
                    b = Load(g.b.buffer, (col // self.nr, k0 + k, jj), F32)
                else:  # B in place; past N (edge), its last column
                    b = self.b_term(batch, k0 + k, _min(col + jj, g.n - 1) if edge
                                    else col + jj)
                return [Store(acc, (ii, jj), Fma(a, b, acc_at(ii, jj)))]

            return For(k, Const(0), depth, [*self.prefetch_next_panel(col, k0 + k, ir),
                                            self.tile_loops(step, self.mr, self.nr)])

        full = binary("le", col + self.nr, g.n)  # no column of the tile is past N
        if self.bp is not None or self.b_in_panels or g.n % self.nr == 0:
            updates = [update(False)]  # (tiles start at multiples of nr: none is past N)
        elif isinstance(full, Const):
            updates = [update(not full.value)]
        else:
            updates = [If(full, [update(False)], [update(True)])]

        def result(ii, jj, tile: str = acc) -> list[Stmt]:
            """The nest's statements after the sum, for the sum in `tile` at (ii, jj)."""
            return self.result_at(batch, row + ii, col + jj, Load(tile, (ii, jj), F32))

        # A partial tile's bounds, where there can be one (the loops' ranges alone cannot
        # tell that a task's last panel is whole: its count depends on the task).
        whole_rows = isinstance(self.rows, int) and self.rows % self.mr == 0
        rows = self.mr if whole_rows else _min(self.mr, as_expr(self.rows) - row)
        cols = self.nr if g.n % self.nr == 0 else _min(self.nr, Const(g.n) - col)
        if self.stage is None:
            write = [self.tile_loops(result, rows, cols)]
        else:
            stage = self.stage.name
            write = [self.tile_loops(lambda ii, jj: [Store(stage, (ii, jj), acc_at(ii, jj))],
                                     self.mr, self.nr),
                     self.tile_loops(lambda ii, jj: result(ii, jj, stage), rows, cols, "serial")]
        if pc is None:
            return [init, *updates, *write]
        save = self.tile_loops(lambda ii, jj: [Store(self.ws.name, (ic, ir, jr, ii, jj),
                                                     acc_at(ii, jj))], self.mr, self.nr)
        return [init, *updates, If(binary("eq", pc, self.npc - 1), write, [save])]

    def prefetch_next_panel(self, col: Expr, k: Expr, ir: Expr) -> list[Stmt]:
        """Where B comes packed (a model's weights), prefetches of row k of the panel after
        the tile's, shared by the block's tiles (`next_panel_prefetches`): the first tile
        to read a panel would otherwise wait on memory for all of it (BERT's 768x768
        weights, 128 rows: 217 GFLOP/s against 262 with them in cache)."""
        if not self.b_in_panels:
            return []
        panels = _ceil(self.g.n, self.nr)
        tiles = max(1, min(self.mcp, _ceil(hint(self.rows), self.mr)))
        return next_panel_prefetches(self.g.b.buffer, _min(col // self.nr + 1, panels - 1),
                                     k, 1, self.nr, ir, tiles)

    def result_at(self, batch: Expr, row: Expr, col: Expr, value: Load) -> list[Stmt]:
        """The nest's statements after the sum (its store, or a fused epilogue's), for the
        sum `value` of the element at (batch, row, col)."""
        g = self.g
        values = self.values(batch, row, None, col)

        def at(e: Expr) -> Expr:
            return substitute(map_expr(e, lambda x: value if isinstance(x, Load) and
                                       x.buffer == g.acc else None), values)

        return [Store(s.buffer, tuple(at(i) for i in s.index), at(s.value)) for s in g.result]


class _RowStream(_Builder):
    """A matrix-vector product whose B is read in place row by row: per k, the task's
    columns of row k of B, one contiguous run, into sums kept in L1 (`%acc: f32[m, W]`):

        for %task = 0 to column blocks of W parallel {
          %acc = 0
          for %k = 0 to K { for %q = chunks of nr { for %ii = 0 to m unrolled {
            for %jj = 0 to nr vectorized {
              %acc[%ii, %q * nr + %jj] = fma(A[%ii, %k], B[%k, j0 + %q * nr + %jj], ..) } } } }
          for %ii, %q, %jj { out[%ii, j0 + ..] = %acc[..] }    (the nest's result)
        }

    A register tile over nr columns would read nr columns of every row per k: runs of
    256 bytes a page apart, which the prefetchers do not follow (1x768x3072 on one
    thread: 785 us against 293 for torch.matmul; docs/benchmarks.md)."""

    def __init__(self, ctx, g: Gemm, s: GemmSchedule):
        # Only the state the inherited helpers read (values, a_term, b_term, result_at,
        # loop, var): one batch, no packed blocks, no passes over k.
        self.ctx, self.g = ctx, g
        self.nbatch, self.fold = 1, True
        self.mr, self.nr = g.m, s.nr
        self.threaded = g.m * g.n * g.depth >= MIN_PARALLEL_MATVEC_FMAS
        tasks = min(s.parallel, _ceil(g.n, s.nr)) if self.threaded else 1
        width = _ceil(_ceil(g.n, tasks), s.nr) * s.nr
        self.width = min(width, max(s.nr, ROW_STREAM_BYTES // (4 * g.m) // s.nr * s.nr))
        self.tasks = _ceil(g.n, self.width)
        self.acc = ctx.local(F32, (g.m, self.width))

    def build(self) -> list[Stmt]:
        kind = "parallel" if self.threaded else "serial"
        return self.loop("task", self.tasks, self.task, kind)

    def chunks(self, j0: Expr, body) -> list[Stmt]:
        """body(q, lanes) over the task's chunks of nr columns from j0: whole ones, then
        the rest of N (a shorter, masked one)."""
        g, nr = self.g, self.nr
        whole = Const(self.width // nr) if g.n % self.width == 0 else \
            _min(self.width // nr, (Const(g.n) - j0) // nr)
        stmts = self.loop("q", whole, lambda q: body(q, Const(nr)))
        if g.n % nr:
            last = Const(g.n // nr)  # the chunk past the whole ones of N, in the last task
            rest = binary("eq", j0 + self.width, Const(self.tasks * self.width))
            q = last - j0 // nr
            stmts.append(If(rest, body(q, Const(g.n % nr)), []))
        return stmts

    def task(self, t: Expr) -> list[Stmt]:
        g, nr, acc = self.g, self.nr, self.acc.name
        j0 = t * self.width

        def lanes(count: Expr, body) -> For:
            jj = self.var("jj")
            return For(jj, Const(0), count, body(jj), 1, "vectorized")

        def rows(body) -> For:
            ii = self.var("ii")
            return For(ii, Const(0), Const(self.mr), body(ii), 1, "unrolled")

        zero = rows(lambda ii: self.loop("q", self.width // nr, lambda q: [lanes(
            Const(nr), lambda jj: [Store(acc, (ii, q * nr + jj), Const(0.0, F32))])]))
        k = self.var("k")

        def fma(q: Expr, count: Expr) -> list[Stmt]:
            return [rows(lambda ii: [lanes(count, lambda jj: [Store(acc, (ii, q * nr + jj), Fma(
                self.a_term(Const(0), ii, k), self.b_term(Const(0), k, j0 + q * nr + jj),
                Load(acc, (ii, q * nr + jj), F32)))])])]

        def result(q: Expr, count: Expr) -> list[Stmt]:
            def stores(ii: Expr) -> list[Stmt]:
                return [lanes(count, lambda jj: self.result_at(
                    Const(0), ii, j0 + q * nr + jj, Load(acc, (ii, q * nr + jj), F32)))]
            return [rows(stores)]

        return [zero, For(k, Const(0), Const(g.depth), self.chunks(j0, fma)),
                *self.chunks(j0, result)]


class _DotRows(_Builder):
    """A matmul of fewer columns than a vector's lanes whose A and B both run contiguous
    along k (a matrix times a vector: `A @ v`): each element is a dot product, on lanes
    along k into partial sums, mr rows at a time, with one horizontal sum a row:

        for %task = 0 to row groups parallel {  for %r = tiles of mr rows {
          for %col = 0 to N { %acc[.., ..] = 0
            for %kv = 0 to K / L { for %ii = 0 to mr unrolled { for %l = 0 to L vectorized {
              %acc[%ii, %l] = fma(A[r + %ii, %kv * L + %l], B[%kv * L + %l, %col], ..) } } }
            (K % L more: one shorter vector)
            for %ii { %sum = 0; for %l vectorized { %sum += %acc[%ii, %l] }; out = %sum }
        } } }

    A tile of nr lanes along the columns ran one of its lanes (512x512 @ v on one thread:
    70 us, 16-33 this way; docs/loop-ir.md). Rows past the end of the last tile read the
    last row and store nothing."""

    def __init__(self, ctx, g: Gemm, s: GemmSchedule):
        self.ctx, self.g = ctx, g
        self.nbatch, self.fold = 1, True
        # The tile's lanes run along k: nr of them, or the power of two that covers a
        # shallower K.
        self.lanes = lanes = min(s.nr, 1 << (g.depth - 1).bit_length())
        self.mr = max(1, min(s.mr, g.m))
        self.tiles = _ceil(g.m, self.mr)
        self.threaded = g.m * g.n * g.depth >= MIN_PARALLEL_MATVEC_FMAS
        self.tasks = min(s.parallel, self.tiles) if self.threaded else 1
        self.acc = ctx.local(F32, (self.mr, lanes))
        self.sum = ctx.local(F32, ())

    def build(self) -> list[Stmt]:
        per_task = _ceil(self.tiles, self.tasks)
        kind = "parallel" if self.tasks > 1 else "serial"
        return self.loop("task", self.tasks, lambda t: self.loop(
            "tile", _min(per_task, Const(self.tiles) - t * per_task) if self.tasks > 1
            else per_task, lambda r: self.tile((t * per_task + r) * self.mr)), kind)

    def tile(self, row0: Expr) -> list[Stmt]:
        g, lanes, acc = self.g, self.lanes, self.acc.name
        last = as_expr(g.m - 1)

        def row(ii: Expr) -> Expr:
            return row0 + ii if g.m % self.mr == 0 else _min(row0 + ii, last)

        def rows(body, kind: str = "unrolled") -> For:
            ii = self.var("ii")
            return For(ii, Const(0), Const(self.mr), body(ii), 1, kind)

        def on_lanes(count: int, body) -> For:
            ll = self.var("l")
            return For(ll, Const(0), Const(count), body(ll), 1, "vectorized")

        def column(col: Expr) -> list[Stmt]:
            def fma(k0: Expr, count: int) -> For:
                return rows(lambda ii: [on_lanes(count, lambda ll: [Store(acc, (ii, ll), Fma(
                    self.a_term(Const(0), row(ii), k0 + ll),
                    self.b_term(Const(0), k0 + ll, col), Load(acc, (ii, ll), F32)))])])

            zero = rows(lambda ii: [on_lanes(lanes, lambda ll: [
                Store(acc, (ii, ll), Const(0.0, F32))])])
            whole, rest = divmod(g.depth, lanes)
            stmts = [zero, *self.loop("kv", whole, lambda kv: [fma(kv * lanes, lanes)])]
            if rest:
                stmts.append(fma(Const(whole * lanes), rest))
            total = self.sum.name

            def reduce(ii: Expr) -> list[Stmt]:
                stored = self.result_at(Const(0), row0 + ii, col, Load(total, (), F32))
                keep = stored if g.m % self.mr == 0 else \
                    [If(binary("lt", row0 + ii, as_expr(g.m)), stored, [])]
                return [Store(total, (), Const(0.0, F32)),
                        on_lanes(lanes, lambda ll: [Store(total, (), Binary(
                            "add", Load(total, (), F32), Load(acc, (ii, ll), F32)))]),
                        *keep]

            return [*stmts, rows(reduce, "serial")]

        return self.loop("col", g.n, column)


MIN_DOT_DEPTH = 4  # a shallower dot product costs more in its horizontal sum than it saves


def dots_rows(g: Gemm, nr: int) -> bool:
    """Whether matmul `g` under a schedule of `nr`-wide tiles is one `_DotRows` schedules
    (its tile's lanes along k): one batch, fewer columns than `nr`, a K of a few lanes at
    least, and A and B contiguous along k, read in place."""
    def along_k(e: Expr) -> bool:
        return isinstance(e, Load) and access_kind(e.index, g.k) == "contiguous"

    return not g.batch and isinstance(g.m, int) and g.n < nr and g.depth >= MIN_DOT_DEPTH and \
        g.b_panel is None and g.b_panels is None and along_k(g.a) and along_k(g.b)


# The sums of a row-streamed matrix-vector task stay in L1: at most this many bytes.
ROW_STREAM_BYTES = 1 << 14


def streams_rows(g: Gemm, s: GemmSchedule) -> bool:
    """Whether matmul `g` under schedule `s` is a matrix-vector product whose B is read in
    place, contiguous along its columns, with rows longer than a tile's read
    (MATVEC_ROW_BYTES; a tile over a shorter row reads all of it anyway): `_RowStream`
    schedules it."""
    return matrix_vector(g.m, bool(g.batch)) and g.col is not None and g.b_panels is None \
        and g.b_panel is None and isinstance(g.b, Load) and \
        access_kind(g.b.index, g.col) == "contiguous" and \
        g.n * g.b.dtype.itemsize > max(MATVEC_ROW_BYTES, s.nr * 4)


def apply_gemm(ctx, g: Gemm, schedule: GemmSchedule) -> list[Stmt]:
    """The scheduled nest of matmul `g`; `ctx` makes its variables and locals (`var(hint)`,
    `local(dtype, shape)`)."""
    if streams_rows(g, schedule):
        return _RowStream(ctx, g, schedule).build()
    if dots_rows(g, schedule.nr):
        return _DotRows(ctx, g, schedule).build()
    rows = g.m * (math.prod(e for _, e in g.batch) if folds_batches(g) else 1)
    if isinstance(rows, int) or not folds_batches(g) and not all(
            isinstance(e, int) for _, e in g.batch) or g.row is None:
        return _Builder(ctx, g, schedule).build()
    # Rows known at call time: a matrix-vector product when they are few (one tile of
    # SMALL_ROWS, B read in place, the columns split among the threads) and the blocked
    # matmul otherwise, chosen at run time. The blocked one alone packed B at every call
    # and ran tiles of 13 rows for one: 3.8x the static code at batch 1 (an MLP,
    # docs/benchmarks.md).
    small = _Builder(ctx, g, dataclasses.replace(schedule, mr=SMALL_ROWS), SMALL_ROWS)
    return [If(binary("le", as_expr(rows), SMALL_ROWS), small.build(),
               _Builder(ctx, g, schedule).build())]


SMALL_ROWS = 2  # a matmul of every size runs up to this many rows as a matrix-vector one


def fit_schedule(g: Gemm, s: GemmSchedule, target: Target) -> GemmSchedule:
    """`s` as matmul `g` runs it on `target`: tiles no larger than the problem, k passes of
    equal depth, A's copy decided, and the packed blocks (locals, on each thread's stack)
    cut to the target's budgets. What a kernel's schedule records as its `gemm` step."""
    rows = g.m * (math.prod(e for _, e in g.batch) if folds_batches(g) else 1)
    lanes = target.lanes(F32)
    if not whole_vectors(s.nr, lanes):
        raise ScheduleError(
            f"gemm: a tile of nr={s.nr} columns is not one vector or a power of two of"
            f" vectors of {lanes} f32 lanes on {target.name}: LLVM widens such a vector"
            " type and shuffles it through the stack (a <48 x float> tile ran 20x slower);"
            f" use nr <= {lanes} or {lanes} * 2**k")
    mr, nr = (min(s.mr, rows) if isinstance(rows, int) else s.mr), min(s.nr, g.n)
    if dots_rows(g, s.nr):  # lanes along k: the tile keeps its width
        return GemmSchedule(mr, s.nr, g.depth, mr, s.nr, False, s.parallel)
    if not whole_vectors(nr, lanes):
        # Narrower than the tile's but wider than a vector: round up to whole vectors
        # (B's panels hold zeros past N and the write-back masks those columns).
        nr = lanes * 2 ** math.ceil(math.log2(nr / lanes))
    kc = _ceil(g.depth, _ceil(g.depth, s.kc))
    widest = max(nr, packed_b_bytes(target) // (4 * kc) // nr * nr)
    tallest = max(1, packed_a_bytes(target) // (4 * kc) // mr)
    pack_a = s.pack_a if s.pack_a is not None else not isinstance(g.a, Load)
    return GemmSchedule(mr, nr, kc, min(s.mc, tallest * mr), min(s.nc, widest), pack_a,
                        s.parallel)


def padded_columns(n: int, nr: int, lanes: int) -> int:
    """The columns that tiles of `nr` compute for a matmul of `n` columns (a narrower
    matmul's tile fitted to it: `fit_schedule`)."""
    if n <= nr:
        return n if whole_vectors(n, lanes) else lanes * 2 ** math.ceil(math.log2(n / lanes))
    return _ceil(n, nr) * nr


def whole_vectors(nr: int, lanes: int) -> bool:
    """Whether a vectorized loop of `nr` lanes is at most one vector of `lanes`, or a power
    of two of them: the vector types LLVM splits into registers without shuffles."""
    vectors = nr // lanes
    return nr <= lanes or (nr % lanes == 0 and vectors & (vectors - 1) == 0)


def matmul_nests(kernel: Kernel) -> list[tuple[str, Gemm]]:
    """The top-level nests of `kernel` that are f32 matmuls with work in them, each with
    its outermost loop's name: what the `gemm` step schedules."""
    shapes = {b.name: b.shape for b in (*kernel.params, *kernel.locals)}
    found = []
    for top in kernel.body:
        g = match_gemm([top], shapes) if isinstance(top, For) else None
        if g is not None and g.m * g.n * g.depth and all(e for _, e in g.batch) and \
                g.a.dtype is F32 and g.b.dtype is F32:
            found.append((top.var.name, g))
    return found


def gemm_step(loop: str, s: GemmSchedule) -> tuple[str, tuple]:
    """The `gemm` step (name, arguments) that schedules the nest of `loop` by `s`."""
    return "gemm", (loop, s.mr, s.nr, s.kc, s.mc, s.nc, int(bool(s.pack_a)), s.parallel)


def gemm(kernel: Kernel, loop: str, mr: int, nr: int, kc: int, mc: int, nc: int,
         pack_a: int, parallel: int) -> Kernel:
    """The schedule primitive: the matmul nest of `loop` (a top-level loop of `kernel`)
    blocked by this GemmSchedule, its index arithmetic simplified."""
    top = next((s for s in kernel.body if isinstance(s, For) and s.var.name == loop), None)
    g = dict(matmul_nests(kernel)).get(loop)
    if top is None or g is None:
        raise ScheduleError(f"kernel @{kernel.name}: %{loop} is not the outermost loop of an"
                            " f32 matmul nest")
    if min(mr, nr, kc, mc, nc, parallel) < 1:
        raise ScheduleError(f"kernel @{kernel.name}: gemm %{loop}: tile and block sizes and"
                            " the task count must be positive")
    names = FreshNames(kernel)
    body = apply_gemm(names, g, GemmSchedule(mr, nr, kc, mc, nc, bool(pack_a), parallel))
    at = kernel.body.index(top)
    scheduled = dataclasses.replace(kernel, body=[*kernel.body[:at], *body,
                                                  *kernel.body[at + 1:]],
                                    locals=[*kernel.locals, *names.locals])
    # A one-column tile's write-back has no vector code: its loop runs serially.
    return verify_kernel(serial_unless_vectorizable(scheduled, simplified=True))
