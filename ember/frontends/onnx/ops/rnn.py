"""Converters of the ONNX recurrent layers RNN, GRU and LSTM, unrolled over the sequence.

The sequence length is static, so each step becomes its own ops: the input projection
of all steps is one matmul, then every step adds the recurrent projection and applies
the gates. `sequence_lens` masks the steps past a sequence's end (the state holds, the
output is 0), which also starts reverse directions at each sequence's own end.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ember.frontends.onnx.context import ConvertContext, converter
from ember.frontends.onnx.ops.control import stack
from ember.graph.builder import Builder
from ember.graph.ir import Value
from ember.graph.symbolic import SymbolicShapeError, symbols_in

Act = Callable[[Builder, Value], Value]

# name: (build(b, x, alpha, beta), default alpha or None if unused, default beta or None)
ACTIVATIONS = {
    "relu": (lambda b, x, a, c: b.relu(x), None, None),
    "tanh": (lambda b, x, a, c: b.tanh(x), None, None),
    "sigmoid": (lambda b, x, a, c: b.sigmoid(x), None, None),
    "affine": (lambda b, x, a, c: b.add(b.mul(x, a), c), 1.0, 0.0),
    "leakyrelu": (lambda b, x, a, c: b.leaky_relu(x, alpha=a), 0.01, None),
    "thresholdedrelu": (lambda b, x, a, c: b.where(b.gt(x, a), x, 0.0), 1.0, None),
    "scaledtanh": (lambda b, x, a, c: b.mul(b.tanh(b.mul(x, c)), a), 1.0, 1.0),
    "hardsigmoid": (lambda b, x, a, c: b.hard_sigmoid(x, alpha=a, beta=c), 0.2, 0.5),
    "elu": (lambda b, x, a, c: b.elu(x, alpha=a), 1.0, None),
    "softsign": (lambda b, x, a, c: b.softsign(x), None, None),
    "softplus": (lambda b, x, a, c: b.softplus(x), None, None),
}


@dataclass(frozen=True)
class Cell:
    gates: int  # blocks of hidden_size rows in W and R
    default_acts: tuple[str, ...]
    states: int  # 1 (H) or 2 (H, C)


CELLS = {"RNN": Cell(1, ("Tanh",), 1), "GRU": Cell(3, ("Sigmoid", "Tanh"), 1),
         "LSTM": Cell(4, ("Sigmoid", "Tanh", "Tanh"), 2)}


def activations(ctx: ConvertContext, cell: Cell, num_dirs: int) -> list[list[Act]]:
    """Each direction's activation functions; alphas and betas are consumed in order by
    the functions that take them (as ONNX Runtime does)."""
    names = ctx.attr("activations", list(cell.default_acts) * num_dirs)
    if len(names) == len(cell.default_acts) and num_dirs == 2:
        names = names * 2
    if len(names) != len(cell.default_acts) * num_dirs:
        raise ctx.error(f"expected {len(cell.default_acts) * num_dirs} activations, got"
                        f" {len(names)}")
    alphas = list(ctx.attr("activation_alpha", []))
    betas = list(ctx.attr("activation_beta", []))
    acts = []
    for name in names:
        if name.lower() not in ACTIVATIONS:
            raise ctx.unsupported(f"activation '{name}'")
        build, alpha, beta = ACTIVATIONS[name.lower()]
        if alpha is not None and alphas:
            alpha = alphas.pop(0)
        if beta is not None and betas:
            beta = betas.pop(0)
        acts.append(lambda b, x, f=build, a=alpha, c=beta: f(b, x, a, c))
    n = len(cell.default_acts)
    return [acts[d * n:(d + 1) * n] for d in range(num_dirs)]


def split(b: Builder, x: Value, parts: int) -> list[Value]:
    """x split into `parts` equal blocks along its last axis."""
    *lead, width = x.shape
    size = width // parts
    return [b.slice(x, starts=[0] * len(lead) + [k * size], ends=[*lead, (k + 1) * size],
                    steps=[1] * x.type.rank) for k in range(parts)]


@converter("RNN", "GRU", "LSTM", since=1)
def recurrent(ctx: ConvertContext):
    b, cell = ctx.b, CELLS[ctx.op_type]
    x, lens = ctx.require(0), ctx.input(4)
    for index, rank in ((0, 3), (1, 3), (2, 3)):  # X, W and R
        if ctx.require(index).type.rank != rank:
            raise ctx.error(f"input {index} must have rank {rank}, not"
                            f" {ctx.require(index).type}")
    steps = x.shape[1 if ctx.attr("layout", 0) else 0]
    if not isinstance(steps, int):  # (the steps are unrolled: one import per length)
        raise SymbolicShapeError(f"{ctx.op_type} unrolls its steps: their number must be"
                                 " known", symbols_in(steps))
    if steps == 0:
        raise ctx.unsupported("a sequence of 0 steps")
    layout = ctx.attr("layout", 0)
    direction = ctx.attr("direction", "forward")
    if direction not in ("forward", "reverse", "bidirectional"):
        raise ctx.error(f"unknown direction '{direction}'")
    num_dirs = 2 if direction == "bidirectional" else 1
    if layout:  # batch-major [B, T, I] and [B, dirs, H]: make them time-major
        x = b.transpose(x, perm=(1, 0, 2))
    states = [ctx.input(5 + k) for k in range(cell.states)]
    if layout:
        states = [s if s is None else b.transpose(s, perm=(1, 0, 2)) for s in states]
    masks = None
    if lens is not None:  # masks[t]: [B, 1], whether step t is inside each sequence
        lens = b.reshape(lens, shape=(x.shape[1], 1))
        masks = [b.lt(b.constant(np.array(t, lens.dtype.np)), lens) for t in range(x.shape[0])]
    acts = activations(ctx, cell, num_dirs)
    ys, finals = [], []
    for d in range(num_dirs):
        outs, state = run_direction(ctx, cell, x, d, states, masks, acts[d],
                                    reverse=direction == "reverse" or d == 1)
        if lens is not None:  # ONNX Runtime gives empty sequences zero final states
            nonempty = b.gt(lens, b.constant(np.zeros((), lens.dtype.np)))
            state = [b.where(nonempty, s, 0.0) for s in state]
        ys.append(stack(b, outs) if ctx.output_used(0) else None)  # [T, B, H]
        finals.append(state)
    results = [None]
    if ctx.output_used(0):
        y = stack(b, ys, axis=1)  # [T, dirs, B, H]
        results[0] = b.transpose(y, perm=(2, 0, 1, 3)) if layout else y
    for k in range(cell.states):
        final = stack(b, [f[k] for f in finals])  # [dirs, B, H]
        results.append(b.transpose(final, perm=(1, 0, 2)) if layout else final)
    return results


def run_direction(ctx: ConvertContext, cell: Cell, x: Value, d: int,
                  states: list[Value | None], masks: list[Value] | None, acts: list[Act],
                  reverse: bool) -> tuple[list[Value], list[Value]]:
    """Direction d over x [T, B, I]: each step's output [B, H] and the final states."""
    b = ctx.b
    pick = b.constant(np.int64(d))

    def per_dir(v: Value | None) -> Value | None:
        return None if v is None else b.gather(v, pick, axis=0)

    w, r, bias = (per_dir(ctx.input(i)) for i in (1, 2, 3))
    steps, batch, _ = x.shape
    zeros = np.zeros((batch, r.shape[-1]), x.dtype.np)
    state = [b.constant(zeros) if s is None else per_dir(s) for s in states]
    # The input projection of every step at once: [T, B, gates * H].
    xw = b.matmul(x, b.transpose(w, perm=(1, 0)))
    rb = None
    if bias is not None:
        wb, rb = split(b, bias, 2)
        xw = b.add(xw, wb)
    r_t = b.transpose(r, perm=(1, 0))
    params = Params(r_t, rb, split(b, r_t, cell.gates),
                    split(b, rb, cell.gates) if rb is not None else [None] * cell.gates,
                    per_dir(ctx.input(7)) if ctx.op_type == "LSTM" else None, acts,
                    ctx.attr("clip"), bool(ctx.attr("linear_before_reset", 0)),
                    bool(ctx.attr("input_forget", 0)))
    step = STEPS[ctx.op_type]
    outs: list[Value | None] = [None] * steps
    for t in (reversed(range(steps)) if reverse else range(steps)):
        new = step(b, b.gather(xw, b.constant(np.int64(t)), axis=0), state, params)
        if masks is not None:  # past a sequence's end its state holds and its output is 0
            new = [b.where(masks[t], n, s) for n, s in zip(new, state)]
            outs[t] = b.where(masks[t], new[0], 0.0)
        else:
            outs[t] = new[0]
        state = new
    return outs, state


@dataclass(frozen=True)
class Params:
    """One direction's weights and settings, shared by its steps."""

    r_t: Value  # R transposed: [H, gates * H]
    rb: Value | None  # the recurrence bias [gates * H]
    r_blocks: list[Value]  # r_t split by gate
    rb_blocks: list[Value | None]  # rb split by gate
    peephole: Value | None  # LSTM's [3 * H]
    acts: list[Act]
    clip: float | None
    linear_before_reset: bool  # GRU
    input_forget: bool  # LSTM


def _gate(b: Builder, act: Act, x: Value, clip: float | None) -> Value:
    return act(b, x if clip is None else b.clip(x, min=-clip, max=clip))


def _recurrence(b: Builder, h: Value, p: Params) -> Value:
    """h @ R^T + Rb: [B, gates * H]."""
    rec = b.matmul(h, p.r_t)
    return rec if p.rb is None else b.add(rec, p.rb)


def rnn_step(b: Builder, xt: Value, state: list[Value], p: Params) -> list[Value]:
    (h,) = state
    return [_gate(b, p.acts[0], b.add(xt, _recurrence(b, h, p)), p.clip)]


def gru_step(b: Builder, xt: Value, state: list[Value], p: Params) -> list[Value]:
    (h,) = state
    f, g = p.acts
    x_z, x_r, x_h = split(b, xt, 3)
    (r_z, r_r, r_h), (rb_z, rb_r, rb_h) = p.r_blocks, p.rb_blocks
    rec_z, rec_r = (b.matmul(h, r_k) if rb_k is None else b.add(b.matmul(h, r_k), rb_k)
                    for r_k, rb_k in ((r_z, rb_z), (r_r, rb_r)))
    z = _gate(b, f, b.add(x_z, rec_z), p.clip)
    reset = _gate(b, f, b.add(x_r, rec_r), p.clip)
    if p.linear_before_reset:  # r * (h @ Rh^T + Rbh)
        rec_h = b.matmul(h, r_h)
        rec_h = b.mul(reset, rec_h if rb_h is None else b.add(rec_h, rb_h))
    else:  # (r * h) @ Rh^T + Rbh
        rec_h = b.matmul(b.mul(reset, h), r_h)
        rec_h = rec_h if rb_h is None else b.add(rec_h, rb_h)
    candidate = _gate(b, g, b.add(x_h, rec_h), p.clip)
    # H = (1 - z) * candidate + z * h
    return [b.add(b.mul(b.sub(1.0, z), candidate), b.mul(z, h))]


def lstm_step(b: Builder, xt: Value, state: list[Value], p: Params) -> list[Value]:
    h, c = state
    f, g, hact = p.acts
    x_i, x_o, x_f, x_c = split(b, b.add(xt, _recurrence(b, h, p)), 4)
    p_i, p_o, p_f = split(b, p.peephole, 3) if p.peephole is not None else (None,) * 3

    def peep(x: Value, weight: Value | None, cell: Value) -> Value:
        return x if weight is None else b.add(x, b.mul(weight, cell))

    i = _gate(b, f, peep(x_i, p_i, c), p.clip)
    if p.input_forget:  # coupled gates: f = 1 - i
        forget = b.sub(1.0, i)
    else:
        forget = _gate(b, f, peep(x_f, p_f, c), p.clip)
    c_new = b.add(b.mul(forget, c), b.mul(i, _gate(b, g, x_c, p.clip)))
    o = _gate(b, f, peep(x_o, p_o, c_new), p.clip)
    return [b.mul(o, hact(b, c_new)), c_new]


STEPS = {"RNN": rnn_step, "GRU": gru_step, "LSTM": lstm_step}
