"""Converters of ONNX control flow: If, Loop and Scan, as the IR's `if` and `loop` regions.

The bodies are converted by the importer into the op's regions (`ctx.subgraph`); they see
the names of the graphs around them. Shapes are static: a branch pair must yield the same
types (else the condition must be known), loop-carried values keep their type, and a loop
with scan outputs must run a number of iterations known before run time.
"""

from __future__ import annotations

import numpy as np

from ember.dtypes import DType
from ember.errors import EmberError, ShapeError
from ember.frontends.onnx.context import ConvertContext, converter
from ember.graph.builder import Builder
from ember.graph.ir import Region, Value

INT64_MAX = np.iinfo(np.int64).max


def scalar(b: Builder, value: Value) -> Value:
    """A one-element tensor (ONNX allows [1] for conditions and trip counts) as a scalar."""
    if value.shape == ():
        return value
    if value.type.numel != 1:
        raise ShapeError(f"expected a single element, got {value.type}")
    return b.reshape(value, shape=())


def stack(b: Builder, values: list[Value], axis: int = 0) -> Value:
    """np.stack: the values joined along a new `axis`."""
    shape = values[0].shape
    grown = [b.reshape(v, shape=(*shape[:axis], 1, *shape[axis:])) for v in values]
    return grown[0] if len(grown) == 1 else b.concat(*grown, axis=axis)


def reverse(b: Builder, x: Value, axis: int) -> Value:
    """x with `axis` reversed."""
    n = x.shape[axis]
    starts = [0] * x.type.rank
    ends = list(x.shape)
    steps = [1] * x.type.rank
    starts[axis], ends[axis], steps[axis] = n - 1, -1, -1
    return b.slice(x, starts=starts, ends=ends, steps=steps)


def move_first_axis(b: Builder, x: Value, axis: int) -> Value:
    """x with its axis 0 moved to `axis`."""
    if axis == 0:
        return x
    perm = list(range(1, x.type.rank))
    perm.insert(axis, 0)
    return b.transpose(x, perm=perm)


# -- If -------------------------------------------------------------------------------------

@converter("If")
def if_(ctx: ConvertContext):
    """An `if` op when both branches convert to the same types; otherwise (a branch whose
    shapes only work out for one condition) the condition must be known, and only the
    chosen branch is converted, in place."""
    cond = scalar(ctx.b, ctx.require(0))
    failure: EmberError | None = None
    try:
        branches = []
        for name in ("then_branch", "else_branch"):
            region = Region()
            region.outputs = ctx.subgraph(ctx.attr(name), ctx.b.region_builder(region), [])
            branches.append(region)
        then_types, else_types = (r.output_types for r in branches)
        if then_types == else_types:
            return ctx.b.op("if", [cond], {}, branches).results
    except EmberError as e:
        failure = e
    known = ctx.importer.constant_value(cond)
    if known is None:
        if failure is not None:
            raise failure
        raise ctx.unsupported("the branches yield different types ("
                              + ", ".join(map(str, then_types)) + " vs "
                              + ", ".join(map(str, else_types)) + ") and the condition is"
                              " not known before run time")
    chosen = "then_branch" if bool(np.asarray(known)) else "else_branch"
    return ctx.subgraph(ctx.attr(chosen), ctx.b, [])


# -- Loop -----------------------------------------------------------------------------------

MAX_UNROLL = 256  # iterations a loop that fits no `loop` op may be unrolled to


@converter("Loop", since=1)
def loop(ctx: ConvertContext):
    """A `loop` op; failing that (the body needs the iteration number as a constant, a
    carried value changes shape, the condition may end a loop with scan outputs early),
    the loop unrolled, when its trip count and conditions are known before run time."""
    body = ctx.attr("body")
    carried = [ctx.require(i) for i in range(2, len(ctx.inputs))]
    num_scan = len(body.output) - 1 - len(carried)
    if num_scan < 0 or len(body.input) != 2 + len(carried):
        raise ctx.error(f"the body takes {len(body.input)} inputs and yields"
                        f" {len(body.output)} for {len(carried)} carried values")
    try:
        return _loop_op(ctx, body, carried, num_scan)
    except EmberError as failure:
        count = _known_trip_count(ctx)
        if count is None or count > MAX_UNROLL:
            raise failure
        return _unroll(ctx, body, carried, num_scan, count)


def _loop_op(ctx: ConvertContext, body, carried: list[Value], num_scan: int) -> list[Value]:
    trip, cond = ctx.input(0), ctx.input(1)
    scan_length = 0
    if num_scan:
        scan_length = _known_trip_count(ctx)
        if scan_length is None:
            raise ctx.unsupported("a loop with scan outputs needs a trip count and initial"
                                  " condition known before run time")

    def body_fn(lb: Builder, i: Value, *values: Value) -> list[Value]:
        # The body runs only while the condition holds, so its condition input is true.
        outs = ctx.subgraph(body, lb, [i, lb.constant(True), *values])
        if cond is None:  # a for loop: the body's condition is ignored
            next_cond = lb.constant(True)
        else:
            next_cond = scalar(lb, outs[0])
            known = ctx.importer.constant_value(next_cond)
            if num_scan and not (known is not None and bool(known)):
                raise ctx.unsupported("a loop with scan outputs must run a number of"
                                      " iterations known before run time, but its"
                                      " condition may end it early")
        for k, (value, out) in enumerate(zip(values, outs[1:])):
            if out.type != value.type:
                raise ctx.unsupported(f"loop-carried value {k} changes from {value.type} to"
                                      f" {out.type} in the body")
        return [next_cond, *outs[1:]]

    b = ctx.b
    trip = b.constant(np.int64(INT64_MAX)) if trip is None else scalar(b, trip)
    if trip.dtype is not DType.i64:
        trip = b.cast(trip, to=DType.i64)
    initial_cond = b.constant(True) if cond is None else scalar(b, cond)
    return b.loop(trip, initial_cond, carried, body_fn, num_scan=num_scan,
                  scan_length=scan_length)


def _known_trip_count(ctx: ConvertContext) -> int | None:
    """The iterations a loop runs when its trip count and initial condition are known (a
    body's condition may still end it earlier), else None."""
    if ctx.input(0) is None:
        return None
    count, start = ctx.maybe_const(0), ctx.maybe_const(1)
    if count is None or (ctx.input(1) is not None and start is None):
        return None
    if start is not None and not bool(np.asarray(start).reshape(())):
        return 0
    return max(int(np.asarray(count).reshape(())), 0)


def _unroll(ctx: ConvertContext, body, carried: list[Value], num_scan: int,
            count: int) -> list[Value]:
    b, values = ctx.b, list(carried)
    scans: list[list[Value]] = [[] for _ in range(num_scan)]
    for i in range(count):
        outs = ctx.subgraph(body, b, [b.constant(np.int64(i)), b.constant(True), *values])
        values = outs[1:1 + len(carried)]
        for scan_values, value in zip(scans, outs[1 + len(carried):]):
            scan_values.append(value)
        if ctx.input(1) is not None:
            go_on = ctx.importer.constant_value(outs[0])
            if go_on is None:
                raise ctx.unsupported("the loop's condition is not known before run time,"
                                      " and its body fits no loop op")
            if not bool(np.asarray(go_on).reshape(())):
                break
    if any(not s for s in scans):
        raise ctx.unsupported("a loop with scan outputs that runs no iteration")
    for k, s in enumerate(scans):
        if len({v.type for v in s}) > 1:
            raise ctx.error(f"scan output {k} changes shape across iterations")
    return values + [stack(b, s) for s in scans]


# -- Scan -----------------------------------------------------------------------------------

@converter("Scan", since=9)
def scan(ctx: ConvertContext):
    body = ctx.attr("body")
    m = ctx.attr("num_scan_inputs")
    values = [ctx.require(i) for i in range(len(ctx.inputs))]
    states, inputs = values[:len(values) - m], values[len(values) - m:]
    k = len(body.output) - len(states)
    in_axes = ctx.attr("scan_input_axes", [0] * m)
    in_dirs = ctx.attr("scan_input_directions", [0] * m)
    out_axes = ctx.attr("scan_output_axes", [0] * k)
    out_dirs = ctx.attr("scan_output_directions", [0] * k)
    return run_scan(ctx, body, states, inputs, in_axes, in_dirs, out_axes, out_dirs)


@converter("Scan", since=8)
def scan8(ctx: ConvertContext):
    """Opset 8: axis 0 of every state and scan input is a batch, and axis 1 is scanned."""
    body = ctx.attr("body")
    m = ctx.attr("num_scan_inputs")
    values = [ctx.require(i) for i in range(1, len(ctx.inputs))]
    states, inputs = values[:len(values) - m], values[len(values) - m:]
    k = len(body.output) - len(states)
    if not inputs:
        raise ctx.error("Scan needs at least one scan input")
    batch, length = inputs[0].shape[:2]
    if ctx.input(0) is not None:
        lens = ctx.const(0, "sequence_lens")
        if np.any(np.asarray(lens) != length):
            raise ctx.unsupported("sequence_lens shorter than the sequence axis are not"
                                  " supported")
    dirs = ctx.attr("directions", [0] * m)
    per_batch = []
    for n in range(batch):
        index = ctx.constant(np.int64(n))
        pick = [ctx.b.gather(v, index, axis=0) for v in (*states, *inputs)]
        per_batch.append(run_scan(ctx, body, pick[:len(states)], pick[len(states):],
                                  [0] * m, dirs, [0] * k, [0] * k))
    return [stack(ctx.b, list(outs)) for outs in zip(*per_batch)]


def run_scan(ctx: ConvertContext, body, states: list[Value], inputs: list[Value],
             in_axes, in_dirs, out_axes, out_dirs) -> list[Value]:
    """Scan as a loop over the slices of `inputs`; the scan outputs stacked, then reversed
    and moved to their axes as asked."""
    b = ctx.b
    in_axes = [a % v.type.rank if v.type.rank else a for a, v in zip(in_axes, inputs)]
    lengths = {v.shape[a] for a, v in zip(in_axes, inputs)}
    if len(lengths) != 1:
        raise ctx.error(f"the scan inputs have different lengths {sorted(lengths)}")
    (length,) = lengths
    num_scan = len(body.output) - len(states)

    def body_fn(lb: Builder, i: Value, *carried: Value) -> list[Value]:
        last = lb.constant(np.int64(length - 1))
        slices = [lb.gather(v, lb.sub(last, i) if d else i, axis=a)
                  for v, a, d in zip(inputs, in_axes, in_dirs)]
        outs = ctx.subgraph(body, lb, [*carried, *slices])
        for k, (value, out) in enumerate(zip(carried, outs)):
            if out.type != value.type:
                raise ctx.unsupported(f"scan state {k} changes from {value.type} to"
                                      f" {out.type} in the body")
        return [lb.constant(True), *outs]

    trip = b.constant(np.int64(length))
    results = b.loop(trip, b.constant(True), states, body_fn, num_scan=num_scan,
                     scan_length=length)
    finals, stacked = list(results[:len(states)]), []
    for value, axis, direction in zip(results[len(states):], out_axes, out_dirs):
        if direction:
            value = reverse(b, value, 0)
        stacked.append(move_first_axis(b, value, axis % value.type.rank))
    return finals + stacked
