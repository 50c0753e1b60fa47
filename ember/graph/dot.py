"""A graph as Graphviz DOT, each fused kernel drawn as a coloured cluster of its ops.

    text = to_dot(fused_graph)              # `dot -Tsvg` renders it
    render_svg(fused_graph, "model.svg")    # runs graphviz's `dot`

Nodes are ops (constants are left out, inputs and outputs are drawn); a `graph.fused` op
becomes a cluster holding its region's ops, so one colour is one kernel. Edges follow
values, through a fused op's region arguments and yields.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from ember.errors import EmberError
from ember.graph.ir import Graph, Op, Value

PALETTE = ("#fde2e4", "#e2ece9", "#dfe7fd", "#fff1e6", "#e8e8e4", "#f0efeb", "#d8e2dc",
           "#cddafd", "#fad2e1", "#bee1e6")


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def to_dot(graph: Graph) -> str:
    lines = [f"digraph {_quote(graph.name)} {{", "  rankdir=TB;",
             '  node [shape=box, style="rounded,filled", fillcolor=white, fontsize=10];']
    source: dict[Value, str] = {}  # the node that produces each value
    edges: list[tuple[str, str]] = []
    for i, value in enumerate(graph.inputs):
        node = f"in{i}"
        lines.append(f"  {node} [label={_quote(f'%{value.name or i}: {value.type}')},"
                     " shape=ellipse];")
        source[value] = node
    counter = 0

    def add_op(op: Op, indent: str) -> str:
        nonlocal counter
        node = f"op{counter}"
        counter += 1
        label = op.name + (f"\\n{op.result.type}" if len(op.results) == 1 else "")
        lines.append(f"{indent}{node} [label={_quote(label)}];")
        for value in op.operands:
            if value in source:
                edges.append((source[value], node))
        for r in op.results:
            source[r] = node
        return node

    for k, op in enumerate(o for o in graph.ops if o.name != "constant"):
        if op.name != "fused":
            add_op(op, "  ")
            continue
        region = op.regions[0]
        for arg, operand in zip(region.args, op.operands):
            if operand in source:
                source[arg] = source[operand]
        lines.append(f"  subgraph cluster_{k} {{")
        lines.append(f'    label={_quote(op.attrs["kind"])}; style="rounded,filled";'
                     f" fillcolor={_quote(PALETTE[k % len(PALETTE)])}; fontsize=9;")
        for inner in region.ops:
            if inner.name != "constant":
                add_op(inner, "    ")
        lines.append("  }")
        for result, yielded in zip(op.results, region.outputs):
            source[result] = source.get(yielded, "")
    for i, value in enumerate(graph.outputs):
        node = f"out{i}"
        lines.append(f"  {node} [label={_quote(f'output {i}: {value.type}')}, shape=ellipse];")
        if source.get(value):
            edges.append((source[value], node))
    lines += [f"  {a} -> {b};" for a, b in dict.fromkeys(edges) if a]
    lines.append("}")
    return "\n".join(lines) + "\n"


def render_svg(graph: Graph, path: str | Path) -> Path:
    """Draw `graph` into an SVG file with graphviz's `dot`."""
    dot = shutil.which("dot")
    if dot is None:
        raise EmberError("drawing needs graphviz's `dot` (Debian: apt-get install graphviz)")
    done = subprocess.run([dot, "-Tsvg", "-o", str(path)], input=to_dot(graph), text=True,
                          capture_output=True)
    if done.returncode != 0:
        raise EmberError(f"dot failed: {done.stderr.strip()[:300]}")
    return Path(path)
