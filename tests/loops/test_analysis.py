"""The loop-IR analyses that scheduling, verification and code generation share: the affine
form, access kinds and dependence (ember/loops/analysis.py)."""

from __future__ import annotations

from ember.loops.analysis import (
    access_kind,
    affine_form,
    affine_map,
    coefficient,
    independent,
)
from ember.loops.ir import Binary, Const, Load, Var
from ember.loops.text import parse_kernel

I, J = Var("i"), Var("j")


def test_affine_form_splits_variables_constant_and_rest() -> None:
    n = Load("n", (), Const(0).dtype)
    e = I * 3 + J * 2 + 5 + n - I
    form = affine_form(e, {"i", "j"})
    assert form is not None and form.coefficients == {"i": 2, "j": 2} and form.constant == 5
    assert form.rest == n
    assert affine_form(Binary("mod", I, Const(4)) + J, {"i"}) is None
    assert coefficient(e, "j") == 2 and coefficient(Binary("floordiv", J, Const(2)), "j") is None


def test_affine_map_needs_nothing_but_variables() -> None:
    assert affine_map(I * 4 + J - 1) == {"i": 4, "j": 1, None: -1}
    assert affine_map(I + Load("n", (), Const(0).dtype)) is None
    # A product by a constant not yet folded (parsed text may hold one) is still affine.
    assert affine_map(Binary("mul", Binary("add", Const(1), Const(2)), I)) == {"i": 3, None: 0}


def test_access_kinds_see_merged_dimensions() -> None:
    flat = [Binary("floordiv", J, Const(7)), Binary("mod", J, Const(7))]
    assert access_kind(flat, "j", (3, 7)) == "contiguous"
    assert access_kind([J * 2], "j") == "strided" and access_kind([J * 9], "j") == "gather"
    assert access_kind([I], "j") == "uniform"


def test_independent_names_the_dependence() -> None:
    scan = parse_kernel("""kernel @scan(%x: f32[8], %y: f32[8]) {
  for %i = 1 to 8 {
    %y[%i] = add(%y[sub(%i, 1)], %x[%i])
  }
}""")
    assert independent(scan.body[0], scan) == "%y is both read and written in the loop"


def _rows_kernel(group: int, rows: int, offsets: tuple[int, ...] = (0,)) -> str:
    stores = "\n".join(f"      %y[add(add(mul(%i, 6), %j), {o})] = %x[%j]" for o in offsets)
    return f"""kernel @k(%x: f32[8], %y: f32[64]) {{
  for %i = 0 to {rows} {{
    for %j = 0 to {group} unrolled {{
{stores}
    }}
  }}
}}"""


def test_a_loop_writing_a_block_of_rows_each_is_independent() -> None:
    """An attention kernel's group of six query rows a step stores rows 6 * i + j, j < 6:
    each iteration writes a block of its own (SegFormer's one head of 3136 rows has no
    other loop to share among threads)."""
    ok = parse_kernel(_rows_kernel(6, 9))
    assert independent(ok.body[0], ok) is None
    for overlapping in (_rows_kernel(7, 8), _rows_kernel(3, 9, offsets=(0, 4))):
        kernel = parse_kernel(overlapping)
        assert independent(kernel.body[0], kernel) == "a store to %y does not index by %i"
    apart = parse_kernel(_rows_kernel(3, 9, offsets=(0, 3)))
    assert independent(apart.body[0], apart) is None
