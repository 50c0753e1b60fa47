"""Static costs of kernels (ember/loops/cost.py), which explain's GFLOP/s and roofline use:
bounds and conditions that follow from outer loops are evaluated per iteration, so blocked
nests count the work their tails run."""

from __future__ import annotations

import pytest

from ember import Builder
from ember.loops.cost import flops, trip_count
from ember.loops.lower import lower_graph
from ember.loops.schedules.gemm import register_tile
from ember.loops.text import parse_kernel
from ember.target import Target

HOST = Target.host()


def test_triangle_counts_each_row() -> None:
    kernel = parse_kernel("""kernel @k(%x: f32[10,10], %y: f32[10,10]) {
  for %i = 0 to 10 {
    for %j = 0 to add(%i, 1) { %y[%i, %j] = mul(%x[%i, %j], 2.0:f32) }
  }
}""")
    assert flops(kernel) == sum(range(1, 11))  # 55 multiplies


def test_conditions_on_loop_variables_pick_their_branch() -> None:
    kernel = parse_kernel("""kernel @k(%x: f32[8], %y: f32[8]) {
  for %i = 0 to 8 {
    if lt(%i, 3) { %y[%i] = fma(%x[%i], %x[%i], 1.0:f32) } else { %y[%i] = %x[%i] }
  }
}""")
    assert flops(kernel) == 3 * 2


def test_unknown_bounds_fall_back() -> None:
    kernel = parse_kernel("""kernel @k(%n: i64[], %x: f32[64], %y: f32[64]) {
  for %b = 0 to 4 {
    for %j = 0 to min(sub(%n[], mul(%b, 16)), 16) { %y[%j] = add(%x[%j], 1.0:f32) }
  }
}""")
    assert flops(kernel) == 4 * 16  # a tail bounded by its block counts the block
    assert trip_count(kernel.body[0].body[0]) == 16


@pytest.mark.parametrize("m, n, k", [(64, 96, 80), (7, 300, 33)])
def test_blocked_matmul_counts_about_its_products(m: int, n: int, k: int) -> None:
    b = Builder("mm")
    b.output(b.matmul(b.input("a", "f32", (m, k)), b.input("b", "f32", (k, n))))
    (kernel,) = lower_graph(b.build(), target=HOST).kernels
    exact = 2 * m * n * k
    # The register tiles are padded to whole tiles (mr x nr): at most that much more.
    mr, nr = register_tile(HOST)
    padded = 2 * (-(-m // mr) * mr) * (-(-n // nr) * nr) * k
    assert exact <= flops(kernel) <= padded


def test_nests_past_the_enumeration_budget_count_their_tails() -> None:
    """A transformer layer's 128 x 768 x 3072 matmul has more tiles than the budget visits
    one by one: past it, a loop counts its first iteration's weight for all but its last,
    which it counts on its own (it counted full blocks: 0.805 GFLOP for 0.604)."""
    b = Builder("mm")
    b.output(b.matmul(b.input("a", "f32", (128, 768)), b.input("b", "f32", (768, 3072))))
    (kernel,) = lower_graph(b.build(), target=HOST).kernels
    tile = 8 * 32 if any(s == (8, 32) for s in (buf.shape for buf in kernel.locals)) else None
    exact = 2 * 128 * 768 * 3072
    if tile:  # AVX-512's 8 x 32 tiles divide it: the count is exact
        assert flops(kernel) == exact
    assert exact <= flops(kernel) <= exact * 1.05
