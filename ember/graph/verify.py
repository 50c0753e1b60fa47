"""The graph verifier: structural rules that every stage boundary checks.

Use before definition (and use outside the defining region), unknown ops, operand
counts, attribute schemas, region signatures and result types that disagree with type
inference, dangling constant-table references. Each error names the op and its origin.
"""

from __future__ import annotations

from ember.dtypes import from_numpy
from ember.errors import EmberError, VerificationError
from ember.graph.builder import constant_table_type
from ember.graph.ir import Graph, Op, Region, TensorType, Value, may_update_in_place
from ember.graph.ops.registry import get_opdef, has_op
from ember.graph.symbolic import size_bounds


def verify_graph(graph: Graph) -> Graph:
    """Check `graph`; raises VerificationError naming the first broken rule. Returns graph."""
    _Verifier(graph).region(graph.body, [], "graph @" + graph.name)
    for output, input in graph.aliases.items():
        if not (0 <= output < len(graph.outputs) and 0 <= input < len(graph.inputs)):
            raise VerificationError(f"graph @{graph.name}: output {output} is computed in"
                                    f" input {input}, and one of them does not exist")
        if not may_update_in_place(graph, output, input):
            raise VerificationError(
                f"graph @{graph.name}: output {output} is computed in the memory of"
                f" %{graph.inputs[input].name}, which is only right for a scatter of that"
                " input that is its only reader")
    for key, data in graph.constants.items():
        try:
            from_numpy(data.dtype)
        except EmberError:
            raise VerificationError(f"constant @{key} has unsupported dtype {data.dtype}") from None
    return graph


class _Verifier:
    def __init__(self, graph: Graph):
        self.graph = graph
        self.defined: set[Value] = set()  # every value defined so far, to catch reuse

    def region(self, region: Region, scopes: list[set[Value]], where: str) -> None:
        scope: set[Value] = set()
        scopes = [*scopes, scope]
        for i, arg in enumerate(region.args):
            if arg.owner is not region or arg.index != i:
                raise VerificationError(f"{where}: argument {i} does not belong to its region")
            self.define(arg, scope, where)
        for op in region.ops:
            self.op(op, scopes)
        for value in region.outputs:
            self.check_visible(value, scopes, f"{where}: the terminator")

    def define(self, value: Value, scope: set[Value], where: str) -> None:
        if value in self.defined:
            raise VerificationError(f"{where}: value {value!r} is defined twice")
        self.defined.add(value)
        scope.add(value)

    def check_visible(self, value: Value, scopes: list[set[Value]], where: str) -> None:
        if not any(value in scope for scope in scopes):
            producer = value.producer
            origin = f" (defined by {producer.where()})" if producer else ""
            state = "outside its region" if value in self.defined else "before its definition"
            raise VerificationError(f"{where} uses {value!r}{origin} {state}")

    def op(self, op: Op, scopes: list[set[Value]]) -> None:
        where = op.where()
        if not has_op(op.name):
            raise VerificationError(f"{where}: unknown op")
        for value in op.operands:
            self.check_visible(value, scopes, where)
        opdef = get_opdef(op.name)
        if len(op.regions) != opdef.num_regions:
            raise VerificationError(
                f"{where}: has {len(op.regions)} regions, expected {opdef.num_regions}")
        # An isolated region (graph.fused) sees only its own arguments.
        outer = [] if "isolated" in opdef.traits else scopes
        for i, region in enumerate(op.regions):
            self.region(region, outer, f"{where} region {i}")
        try:
            normalized = opdef.normalize_attrs(op.attrs)
            if op.name == "constant" and normalized["name"] is not None:
                inferred = [constant_table_type(self.graph, normalized["name"])]
            else:
                with size_bounds(self.graph.size_bounds):
                    inferred = opdef.infer_types([v.type for v in op.operands], normalized,
                                                 op.regions)
        except EmberError as e:
            raise VerificationError(f"{where}: {e}") from None
        if set(op.attrs) != set(normalized):
            raise VerificationError(f"{where}: attributes are not normalized (missing defaults)")
        actual: list[TensorType] = [v.type for v in op.results]
        if actual != inferred:
            raise VerificationError(
                f"{where}: result types ({', '.join(map(str, actual))}) disagree with inference"
                f" ({', '.join(map(str, inferred))})")
        for i, result in enumerate(op.results):
            if result.owner is not op or result.index != i:
                raise VerificationError(f"{where}: result {i} does not belong to the op")
            self.define(result, scopes[-1], where)
