"""Random 2-D convs and pools through the scheduling stage's window steps (conv_gemm,
packed_conv, depthwise_conv, pool: ember/loops/schedules/window_nest.py finds their plain
nests): whatever the geometry, groups, fused producer or epilogue, the compiled graph
gives the interpreter's values."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ember
from ember import Builder

CPU = ember.Config(executor="cpu", disk_cache=False)


@st.composite
def window_graphs(draw):
    op = draw(st.sampled_from(["conv", "depthwise", "max_pool", "avg_pool"]))
    n = draw(st.integers(1, 2))
    c = draw(st.sampled_from([1, 3, 4, 8]))
    h, w = draw(st.integers(3, 13)), draw(st.integers(3, 21))
    kh, kw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    sh, sw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    dh, dw = (1, 1) if op == "avg_pool" else (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    pads = [draw(st.integers(0, k - 1)) for k in (kh, kw, kh, kw)]
    if (h + pads[0] + pads[2] - dh * (kh - 1) - 1) < 0 or \
            (w + pads[1] + pads[3] - dw * (kw - 1) - 1) < 0:
        pads = [0, 0, 0, 0]
        kh = kw = dh = dw = 1
    rng = np.random.default_rng(draw(st.integers(0, 1000)))
    b = Builder("window")
    x = b.input("x", "f32", (n, c, h, w))
    source = b.relu(x) if draw(st.booleans()) else x  # a fused producer
    attrs = {"strides": (sh, sw), "pads": tuple(pads), "dilations": (dh, dw)}
    if op in ("conv", "depthwise"):
        groups = c if op == "depthwise" else 1
        m = c * draw(st.sampled_from([1, 2])) if op == "depthwise" else \
            draw(st.sampled_from([1, 5, 16, 32]))
        weights = b.constant((rng.standard_normal((m, c // groups, kh, kw)) / 3)
                             .astype(np.float32))
        bias = [b.constant(rng.standard_normal(m).astype(np.float32))] \
            if draw(st.booleans()) else []
        y = b.op("conv", [source, weights, *bias], {**attrs, "groups": groups}).result
    else:
        if op == "avg_pool":
            attrs.pop("dilations")
            attrs["count_include_pad"] = draw(st.booleans())
        attrs["ceil_mode"] = draw(st.booleans())
        y = getattr(b, op)(source, kernel=(kh, kw), **attrs)
    if draw(st.booleans()):
        y = b.tanh(y)  # a fused (transcendental) epilogue
    b.output(y)
    return b.build(), rng.standard_normal((n, c, h, w)).astype(np.float32)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(window_graphs())
def test_window_steps_compute_what_the_interpreter_does(case) -> None:
    graph, x = case
    want = ember.interpret(graph, [x])[0]
    got = ember.compile(graph, config=CPU)(x)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
