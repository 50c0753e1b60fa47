"""The op table of docs/graph-ir.md, generated from the registry so it cannot drift.

`python -m ember.graph.ops.doc` rewrites the table in place; a test checks it is current.
"""

from __future__ import annotations

import sys
from pathlib import Path

from ember.graph.ops.registry import REQUIRED, all_opdefs
from ember.graph.text.printer import format_attr

BEGIN, END = "<!-- op-table:begin -->", "<!-- op-table:end -->"
DOC = Path(__file__).resolve().parents[3] / "docs" / "graph-ir.md"


def _arity(lo: int, hi: int | None) -> str:
    return str(lo) if lo == hi else f"{lo}+" if hi is None else f"{lo}-{hi}"


def op_table() -> str:
    rows = ["| family | op | operands | attributes (default) | meaning |", "|---|---|---|---|---|"]
    for d in all_opdefs():
        attrs = ", ".join(
            f"{k}: {a.kind}" + ("" if a.default is REQUIRED or a.default is None
                                else f" = {format_attr(a.kind, a.default)}")
            + (f" ({'/'.join(a.choices)})" if a.choices else "")
            for k, a in d.attrs.items())
        kind = " (composite)" if d.is_composite else ""
        regions = f", {d.num_regions} regions" if d.num_regions else ""
        rows.append(f"| {d.family} | `{d.name}`{kind} | {_arity(*d.arity)}{regions} |"
                    f" {attrs.replace('|', '/')} | {d.summary.replace('|', '/')} |")
    return "\n".join(rows)


def updated_doc(text: str) -> str:
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{op_table()}\n{END}{tail}"


if __name__ == "__main__":
    DOC.write_text(updated_doc(DOC.read_text()))
    sys.stdout.write(f"wrote the op table of {DOC}\n")
