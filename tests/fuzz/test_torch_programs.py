"""Random PyTorch programs through `torch.compile(backend="ember")` against eager, on the
model fuzzer's idea (tests/fuzz/onnx_models.py): a module's forward runs a drawn list of
operations, each chosen among those whose shape constraints the values so far meet; Dynamo
traces it into one graph, which Ember compiles. Outputs agree within RTOL/ATOL, and the
graph must have reached Ember (`ember.torch.counters`).

CI runs EXAMPLES programs; `make fuzz-models` runs them for EMBER_FUZZ_SECONDS too.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fuzz.budget import FUZZ, run_for_a_while, timed, workers

torch = pytest.importorskip("torch")
F = torch.nn.functional

EXAMPLES = 10
RTOL, ATOL = 1e-3, 1e-4
UNARY = ["relu", "sigmoid", "tanh", "abs", "neg", "sin", "cos", "erf", "gelu", "silu"]
BINARY = ["add", "sub", "mul", "maximum", "minimum"]


def _broadcast(a, b):
    try:
        return tuple(torch.broadcast_shapes(a, b))
    except RuntimeError:
        return None


class Program(torch.nn.Module):
    """Runs `steps` ((op, operand indices, parameter name or None, options)) on a pool of
    values that starts with the inputs; returns the values at `outputs`."""

    def __init__(self, steps, params, outputs):
        super().__init__()
        self.steps, self.outputs = steps, outputs
        self.weights = torch.nn.ParameterDict(
            {k: torch.nn.Parameter(v, requires_grad=False) for k, v in params.items()})

    def forward(self, *inputs):
        pool = list(inputs)
        for op, args, weight, options in self.steps:
            xs = [pool[i] for i in args]
            w = self.weights[weight] if weight else None
            pool.append(_apply(op, xs, w, options))
        return tuple(pool[i] for i in self.outputs)


def _apply(op, xs, w, options):
    if op in UNARY:
        return getattr(torch, op)(xs[0]) if hasattr(torch, op) else getattr(F, op)(xs[0])
    if op in BINARY:
        return getattr(torch, op)(xs[0], xs[1])
    if op == "safe_log":
        return torch.log(xs[0].abs() + 1)
    if op == "safe_div":
        return xs[0] / (xs[1].abs() + 1)
    if op == "matmul":
        return xs[0] @ w
    if op == "transpose":
        return xs[0].transpose(*options["dims"])
    if op == "flatten":
        return xs[0].reshape(-1)
    if op == "cat":
        return torch.cat([xs[0], xs[0]], dim=options["dim"])
    if op == "slice":
        dim, start, end, step = options["slice"]
        return xs[0].narrow(dim, start, end - start)[(slice(None),) * dim + (slice(None, None,
                                                                                   step),)]
    if op == "reduce":
        fn = {"sum": torch.sum, "mean": torch.mean, "amax": torch.amax}[options["kind"]]
        return fn(xs[0], dim=options["dims"], keepdim=options["keep"])
    if op == "softmax":
        return torch.softmax(xs[0], dim=options["dim"])
    if op == "layer_norm":
        return F.layer_norm(xs[0], xs[0].shape[-1:], w, None)
    if op == "conv":
        return F.conv2d(xs[0], w, stride=options["stride"], padding=options["pad"],
                        groups=options["groups"])
    if op == "pool":
        pool = F.max_pool2d if options["max"] else F.avg_pool2d
        return pool(xs[0], options["k"], options["stride"])
    if op == "where":
        return torch.where(xs[0] > xs[1], xs[0], xs[1])
    raise AssertionError(op)


@st.composite
def programs(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    shapes, steps, params = [], [], {}
    sizes = st.sampled_from([1, 2, 3, 5, 8])

    def new_input(shape):
        shapes.append(tuple(shape))

    def pick(rank=None, min_rank=0):
        choices = [i for i, s in enumerate(shapes)
                   if (rank is None or len(s) == rank) and len(s) >= min_rank]
        return draw(st.sampled_from(choices)) if choices else None

    def weight(shape):
        name = f"w{len(params)}"
        params[name] = torch.from_numpy((rng.standard_normal(shape) * 0.5).astype(np.float32))
        return name

    def add(op, args, shape, w=None, **options):
        steps.append((op, args, w, options))
        shapes.append(tuple(shape))

    for _ in range(draw(st.integers(1, 2))):
        new_input([draw(sizes) for _ in range(draw(st.integers(1, 4)))])
    if draw(st.booleans()):  # an image for convolutions and pools
        new_input((draw(st.integers(1, 2)), draw(st.integers(1, 4)), draw(st.integers(3, 9)),
                   draw(st.integers(3, 9))))
    inputs = list(shapes)  # (the pool's first values: the module's arguments)
    for _ in range(draw(st.integers(3, 20))):
        kind = draw(st.sampled_from(["unary", "binary", "safe", "matmul", "transpose",
                                     "flatten", "cat", "slice", "reduce", "softmax",
                                     "layer_norm", "conv", "pool", "where"]))
        x = pick()
        s = shapes[x]
        if kind == "unary":
            add(draw(st.sampled_from(UNARY)), [x], s)
        elif kind in ("binary", "where", "safe"):
            y = pick()
            out = _broadcast(s, shapes[y])
            if out is None:
                continue
            op = draw(st.sampled_from(BINARY)) if kind == "binary" else kind if \
                kind == "where" else draw(st.sampled_from(["safe_log", "safe_div"]))
            add(op, [x] if op == "safe_log" else [x, y], s if op == "safe_log" else out)
        elif kind == "matmul" and s:
            n = draw(st.sampled_from([1, 4, 9]))
            add("matmul", [x], (*s[:-1], n), weight((s[-1], n)))
        elif kind == "transpose" and len(s) >= 2:
            a, b = draw(st.permutations(range(len(s))))[:2]
            t = list(s)
            t[a], t[b] = t[b], t[a]
            add("transpose", [x], t, dims=(a, b))
        elif kind == "flatten":
            add("flatten", [x], (int(np.prod(s)),))
        elif kind == "cat" and s:
            dim = draw(st.integers(0, len(s) - 1))
            add("cat", [x], [d * 2 if i == dim else d for i, d in enumerate(s)], dim=dim)
        elif kind == "slice" and s:
            dim = draw(st.integers(0, len(s) - 1))
            if s[dim] < 2:
                continue
            start = draw(st.integers(0, s[dim] - 2))
            end = draw(st.integers(start + 1, s[dim]))
            step = draw(st.sampled_from([1, 2]))
            add("slice", [x], [len(range(start, end, step)) if i == dim else d
                               for i, d in enumerate(s)], slice=(dim, start, end, step))
        elif kind == "reduce" and s:
            dims = tuple(sorted(draw(st.sets(st.integers(0, len(s) - 1), min_size=1))))
            keep = draw(st.booleans())
            out = [1 if i in dims else d for i, d in enumerate(s)] if keep else \
                [d for i, d in enumerate(s) if i not in dims]
            add("reduce", [x], out, kind=draw(st.sampled_from(["sum", "mean", "amax"])),
                dims=dims, keep=keep)
        elif kind == "softmax" and s:
            add("softmax", [x], s, dim=draw(st.integers(-len(s), len(s) - 1)))
        elif kind == "layer_norm" and s:
            add("layer_norm", [x], s, weight((s[-1],)))
        elif kind == "conv":
            x = pick(rank=4)
            if x is None:
                continue
            n, c, h, w_ = shapes[x]
            groups = draw(st.sampled_from([g for g in (1, 2) if c % g == 0]))
            out_c = groups * draw(st.integers(1, 3))
            k = draw(st.integers(1, min(3, h, w_)))
            stride, pad = draw(st.integers(1, 2)), draw(st.integers(0, 1))
            oh, ow = (h + 2 * pad - k) // stride + 1, (w_ + 2 * pad - k) // stride + 1
            add("conv", [x], (n, out_c, oh, ow), weight((out_c, c // groups, k, k)),
                stride=stride, pad=pad, groups=groups)
        elif kind == "pool":
            x = pick(rank=4)
            if x is None:
                continue
            n, c, h, w_ = shapes[x]
            k = draw(st.integers(1, min(3, h, w_)))
            stride = draw(st.integers(1, 2))
            add("pool", [x], (n, c, (h - k) // stride + 1, (w_ - k) // stride + 1),
                max=draw(st.booleans()), k=k, stride=stride)
    produced = list(range(len(shapes)))[len(inputs):] or [0]
    outputs = draw(st.lists(st.sampled_from(produced), min_size=1, max_size=3, unique=True))
    arrays = [torch.from_numpy(rng.standard_normal(s).astype(np.float32)) for s in inputs]
    return Program(steps, params, outputs).eval(), arrays


COUNTS = {"checked": 0}


def check_program(module, inputs) -> None:
    import ember.torch

    torch._dynamo.reset()  # (one class for every program: no guard-driven recompiles)
    with torch.no_grad():
        want = module(*inputs)
        before = dict(ember.torch.counters)
        got = torch.compile(module, backend="ember")(*inputs)
    graphs = ember.torch.counters["graphs"] - before.get("graphs", 0)
    # (A program that returns only its inputs computes nothing: Dynamo calls no backend.)
    computes = any(i >= len(inputs) for i in module.outputs)
    assert graphs >= 1 or not computes, "the program never reached Ember"
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape, f"output {i}"
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=RTOL, atol=ATOL,
                                   equal_nan=True, err_msg=f"output {i}")
    COUNTS["checked"] += 1


@settings(max_examples=EXAMPLES, **FUZZ)
@given(programs())
def test_random_torch_programs_agree_with_eager(case) -> None:
    check_program(*case)


@timed
@workers
def test_fuzz_models_for_a_while_through_torch_compile(worker: int) -> None:
    before = COUNTS["checked"]
    ran = run_for_a_while(programs(), check_program, worker)
    print(f"\nfuzz-models (torch.compile): {COUNTS['checked'] - before} random programs"
          f" agreed with eager {ran}")
