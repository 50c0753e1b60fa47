"""Lowering a whole graph to a loop-IR Program: one kernel per op, calls in order.

Graph inputs, outputs and constants become program buffers of those kinds; every other
value a temp. `if` and `loop` become ProgramIf / ProgramLoop steps whose bodies are the
lowered regions; values flowing out of regions are copied into the op's result buffers.
The graph must hold primitive ops only (run the `decompose` pass first).
"""

from __future__ import annotations

from ember.dtypes import DType
from ember.errors import UnsupportedOpError
from ember.graph.ir import Graph, Op, Region, TensorType, Value, sanitize_name
from ember.loops.ir import (
    STATUS_DTYPE,
    Buffer,
    Call,
    Const,
    For,
    Kernel,
    Load,
    Program,
    ProgramBuffer,
    ProgramIf,
    ProgramLoop,
    ProgramStep,
    Store,
    Var,
    as_expr,
)
from ember.loops.lower.core import LowerContext, find_lowering
from ember.loops.lower.fused import lower_fused
from ember.loops.schedules.lanes import serial_unless_vectorizable
from ember.target import Target

SCATTERS = ("scatter_nd", "scatter_elements")


def lower_graph(graph: Graph, target: Target) -> Program:
    """The loop-IR program of `graph` (primitive ops only): each kernel its op's algorithm,
    a plain nest that the scheduling stage fits to `target` (ember/loops/schedule.py)."""
    return _Lowerer(graph, target).run()


class _Lowerer:
    def __init__(self, graph: Graph, target: Target):
        self.graph = graph
        self.target = target
        self.buffers: list[ProgramBuffer] = []
        self.names: set[str] = set()
        self.kernels: list[Kernel] = []
        self.env: dict[Value, str] = {}
        self.constants = {}
        self.in_place: dict[Op, Value] = {}  # scatters computed in their data's memory
        self.given: dict[Value, str] = {}  # results computed in a buffer given beforehand
        self.status_name: str | None = None

    # -- buffers -------------------------------------------------------------------------------
    def new_buffer(self, hint: str | None, value_type, kind: str) -> str:
        base = sanitize_name(hint) or "t"
        name, i = base, 0
        while name in self.names:
            i += 1
            name = f"{base}_{i}"
        self.names.add(name)
        self.buffers.append(ProgramBuffer(Buffer(name, value_type.dtype, value_type.shape), kind))
        return name

    def buffer_of(self, value: Value) -> str:
        return self.env[value]

    # -- driver --------------------------------------------------------------------------------
    def run(self) -> Program:
        g = self.graph
        for value in g.inputs:
            self.env[value] = self.new_buffer(value.name or "input", value.type, "input")
        # The scatters that compute an output in their input's memory (`Graph.aliases`)
        self.in_place.update({g.outputs[k].producer: g.inputs[j]
                              for k, j in g.aliases.items()})
        outputs = {v for v in g.outputs if v.producer is not None
                   and v.producer.name not in ("constant",)}
        steps = self.region(g.body, outputs)
        final: list[str] = []  # the output buffer of each graph output, in order
        for i, value in enumerate(g.outputs):
            name = self.env[value]
            if self.kind(name) != "output" or name in final:
                # An input, a constant or a repeated value: copy into a fresh output buffer.
                out = self.new_buffer(f"out{i}", value.type, "output")
                steps.append(self.copy(name, out))
                name = out
            final.append(name)
        order = {"input": 0, "output": 1, "constant": 2, "temp": 3, "status": 4}
        self.buffers.sort(key=lambda b: (order[b.kind], final.index(b.buffer.name)
                                         if b.kind == "output" else 0))
        aliases = {final[k]: self.env[g.inputs[j]] for k, j in g.aliases.items()}
        return Program(sanitize_name(g.name) or "main", self.buffers, self.kernels, steps,
                       self.constants, dict(g.size_bounds), aliases)

    def kind(self, name: str) -> str:
        return next(b.kind for b in self.buffers if b.buffer.name == name)

    def region(self, region: Region, outputs: set[Value] = frozenset()) -> list[ProgramStep]:
        steps: list[ProgramStep] = []
        for op in region.ops:
            if op.name == "constant":
                data = self.graph.constant_data(op)
                name = self.new_buffer(op.attrs["name"] or op.result.name or "cst", op.result.type,
                                       "constant")
                # (The graph may hold a view of another constant: code reads it laid out.)
                self.constants[name] = data if data.flags.c_contiguous else data.copy(order="C")
                self.env[op.result] = name
            elif op.name == "if":
                steps.append(self.lower_if(op))
            elif op.name == "loop":
                steps.extend(self.lower_loop(op))
            else:
                steps.append(self.lower_op(op, outputs))
        return steps

    def lower_op(self, op: Op, outputs: set[Value]) -> Call:
        if op.name == "fused":
            members = [m.name for m in op.regions[0].ops if m.name != "constant"]
            name = "_".join(list(dict.fromkeys(members))[:3])
            origin = f"{op.where()} [{', '.join(members)}]"

            ctx = LowerContext(op, self.target)
            body, inputs, results, locals_ = lower_fused(op, self.graph, ctx)
            lowered = serial_unless_vectorizable(Kernel("k", [*inputs, *results], body,
                                                        locals_))
            checks = False
        else:
            fn = find_lowering(op.name)
            if fn is None:
                raise UnsupportedOpError(f"{op.where()}: no lowering to loops for"
                                         f" graph.{op.name}")
            name, origin = op.name, op.where()

            ctx = LowerContext(op, self.target)
            ctx.in_place = op in self.in_place
            body = fn(ctx)
            lowered = serial_unless_vectorizable(Kernel("k", ctx.params, body, ctx.locals))
            checks = ctx.status is not None
        kernel = Kernel(f"k{len(self.kernels)}_{name}", lowered.params, lowered.body,
                        lowered.locals, origin)
        self.kernels.append(kernel)
        results = []
        for value in op.results:
            kind = "output" if value in outputs else "temp"
            hint = value.name or ("out" if kind == "output" else "t")
            self.env[value] = self.given.get(value) or self.new_buffer(hint, value.type, kind)
            results.append(self.env[value])
        status = [self.status()] if checks else []
        return Call(kernel.name, [self.env[v] for v in op.operands] + results + status)

    def status(self) -> str:
        """The program's status word (made at its first use)."""
        if self.status_name is None:
            self.status_name = self.new_buffer("status", TensorType(STATUS_DTYPE, ()), "status")
        return self.status_name

    def scatter_in_place(self, body: Region, carried: list[str], nexts: list[Value]) -> None:
        """Scatters in a loop body that turn a carried array into the next one write their
        updates into the carried buffer itself: the step costs its updates, not a copy of
        the array (`out[i] = v` in a loop of n steps is O(n), not O(n^2)). That takes a
        chain of scatters from the carried array to what the body yields for it, each
        the last reader of the array it updates (every other reader runs before it)."""
        at = {op: k for k, op in enumerate(body.ops)}
        readers: dict[Value, list[int]] = {}  # where each value is read: top-level positions
        for k, top in enumerate(body.ops):
            for op in (top, *(o for r in top.regions for o in r.walk())):
                for value in (*op.operands, *(v for r in op.regions for v in r.outputs)):
                    readers.setdefault(value, []).append(k)
        for value in body.outputs:
            readers.setdefault(value, []).append(len(body.ops))
        for arg, name, value in zip(body.args[1:], carried, nexts):
            chain = []
            while value is not arg:
                op = value.producer
                if op is None or op.name not in SCATTERS or op not in at:
                    break
                data = op.operands[0]
                reads = readers.get(data, [])
                if reads.count(at[op]) != 1 or any(k > at[op] for k in reads):
                    break
                chain.append(op)
                value = data
            if value is arg:
                for op in chain:
                    self.in_place[op] = arg
                    self.given[op.results[0]] = name

    # -- control flow ----------------------------------------------------------------------------
    def copy(self, src: str, dst: str, index_buffer: str | None = None) -> Call:
        """A kernel copying buffer `src` into `dst` (into dst[counter] when index_buffer)."""
        source = next(b.buffer for b in self.buffers if b.buffer.name == src)
        target = next(b.buffer for b in self.buffers if b.buffer.name == dst)
        x = Buffer("x0", source.dtype, source.shape)
        y = Buffer("y0", target.dtype, target.shape)
        params = [x, y]
        index = [Var(f"i{d}") for d in range(len(source.shape))]
        prefix = []
        if index_buffer is not None:
            params.insert(1, Buffer("n", DType.i64, ()))
            prefix = [Load("n", (), DType.i64)]
        body = [Store("y0", tuple(prefix + index), Load("x0", tuple(index), source.dtype))]
        for d in reversed(range(len(source.shape))):
            body = [For(index[d], Const(0), as_expr(source.shape[d]), body)]
        kernel = Kernel(f"k{len(self.kernels)}_copy", params, body, [], "copy")
        self.kernels.append(kernel)
        args = [src, index_buffer, dst] if index_buffer else [src, dst]
        return Call(kernel.name, args)

    def lower_if(self, op: Op) -> ProgramIf:
        results = [self.new_buffer(v.name, v.type, "temp") for v in op.results]
        branches = []
        for region in op.regions:
            steps = self.region(region)
            steps += [self.copy(self.env[v], r) for v, r in zip(region.outputs, results)]
            branches.append(steps)
        for value, name in zip(op.results, results):
            self.env[value] = name
        return ProgramIf(self.env[op.operands[0]], branches[0], branches[1])

    def lower_loop(self, op: Op) -> list[ProgramStep]:
        trip, cond0, *inits = op.operands
        body = op.regions[0]
        num_carried = len(inits)
        cond = self.new_buffer("cond", cond0.type, "temp")
        counter = self.new_buffer("iteration", body.args[0].type, "temp")
        carried = [self.new_buffer(v.name, v.type, "temp") for v in op.results[:num_carried]]
        scans = [self.new_buffer(v.name, v.type, "temp") for v in op.results[num_carried:]]
        steps: list[ProgramStep] = [self.copy(self.env[cond0], cond)]
        steps += [self.copy(self.env[v], c) for v, c in zip(inits, carried)]
        self.env[body.args[0]] = counter
        for arg, name in zip(body.args[1:], carried):
            self.env[arg] = name
        yielded = body.outputs
        self.scatter_in_place(body, carried, yielded[1:1 + num_carried])
        inner = self.region(body)
        # Yields may be the carried values themselves (even swapped): read every yield that
        # is a carried buffer (scan slices, the condition, staged carried values) before any
        # carried is written. A carried value yielded unchanged needs no copy, and one the
        # body computed goes straight into its carried buffer.
        inner += [self.copy(self.env[v], s, counter)
                  for v, s in zip(yielded[1 + num_carried:], scans)]
        sources = [self.env[v] for v in yielded[1:1 + num_carried]]
        staged = {k: self.new_buffer("next", v.type, "temp")
                  for k, (v, src) in enumerate(zip(yielded[1:1 + num_carried], sources))
                  if src in carried and src != carried[k]}
        inner += [self.copy(sources[k], s) for k, s in staged.items()]
        inner += [self.copy(self.env[yielded[0]], cond)]
        inner += [self.copy(staged.get(k, src), c)
                  for k, (src, c) in enumerate(zip(sources, carried)) if src != c]
        steps.append(ProgramLoop(self.env[trip], cond, counter, inner))
        for value, name in zip(op.results, carried + scans):
            self.env[value] = name
        return steps
