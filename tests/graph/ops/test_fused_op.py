"""graph.fused: its checks (region signature, kind against the region) and semantics (the
interpreter runs its region on the operands)."""

from __future__ import annotations

import numpy as np
import pytest

from ember import EmberError, interpret, parse_graph

OP = "fused"
FUSED = """graph @g(%x: f32[2,3], %y: f32[3]) -> (f32[2,3]) {{
  %0 = graph.fused %x, {second} {{kind = "{kind}"}} : f32[2,3] (%a: f32[2,3], %b: f32[3]) {{
    %1 = graph.mul %a, %b : f32[2,3]
    %2 = graph.tanh %1 : f32[2,3]
    yield %2
  }}
  return %0
}}
"""


def test_fused_runs_its_region() -> None:
    graph = parse_graph(FUSED.format(kind="injective", second="%y"))
    x = np.arange(6, dtype=np.float32).reshape(2, 3) / 6
    y = np.array([1, -2, 0.5], np.float32)
    (out,) = interpret(graph, [x, y])
    np.testing.assert_allclose(out, np.tanh(x * y), rtol=1e-6)


@pytest.mark.parametrize("kind, second, message", [
    ("injective", "%x", "region arguments"),
    ("nope", "%y", "unknown fusion kind"),
    ("row", "%y", "is a injective kernel, not row"),
])
def test_fused_checks(kind, second, message) -> None:
    assert OP == "fused"
    with pytest.raises(EmberError, match=message):
        parse_graph(FUSED.format(kind=kind, second=second))


def test_fused_region_must_be_one_kernel() -> None:
    text = """graph @g(%x: f32[4,4]) -> (f32[4,4]) {
  %0 = graph.fused %x {kind = "contraction"} : f32[4,4] (%a: f32[4,4]) {
    %1 = graph.matmul %a, %a : f32[4,4]
    %2 = graph.matmul %1, %a : f32[4,4]
    yield %2
  }
  return %0
}
"""
    with pytest.raises(EmberError, match="not one kernel: two contractions"):
        parse_graph(text)
