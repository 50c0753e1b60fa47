"""Liveness on the (exit-transformed) AST: what an `if` yields and what a loop carries.

An `if` yields the names either branch binds that are live after it; a loop carries the
names its body binds that are live at its head (read by the next iteration or the
condition, or after the loop). The results go on the nodes: `ember_live_out` on every
`if`, `for`, `while` and assignment, `ember_carried` on loops. `x[i] = v` reads and rebinds `x` (a
functional update).
"""

from __future__ import annotations

import ast


def reads(node: ast.AST | None) -> set[str]:
    """The names an expression (or an assignment target: `x[i]`, `x.attr`) reads."""
    if node is None:
        return set()
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def target_names(target: ast.expr) -> tuple[set[str], set[str]]:
    """(names bound, names read) by assigning to `target`."""
    if isinstance(target, ast.Name):
        return {target.id}, set()
    if isinstance(target, (ast.Tuple, ast.List)):
        bound, read = set(), set()
        for item in target.elts:
            b, r = target_names(item)
            bound |= b
            read |= r
        return bound, read
    if isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name):
        return {target.value.id}, reads(target)
    return set(), reads(target)


def statement_targets(stmt: ast.stmt) -> list[ast.expr]:
    if isinstance(stmt, ast.Assign):
        return stmt.targets
    if isinstance(stmt, (ast.AugAssign, ast.AnnAssign)):
        return [stmt.target]
    return []


def bound_names(stmts: list[ast.stmt]) -> set[str]:
    """Every name that `stmts` (nested blocks included) may bind."""
    names: set[str] = set()
    for stmt in stmts:
        for target in statement_targets(stmt):
            names |= target_names(target)[0]
        if isinstance(stmt, ast.For):
            names.add(stmt.target.id)
        for block in (getattr(stmt, "body", None), getattr(stmt, "orelse", None)):
            if isinstance(block, list):
                names |= bound_names(block)
    return names


def live_block(stmts: list[ast.stmt], live_out: set[str]) -> set[str]:
    live = set(live_out)
    for stmt in reversed(stmts):
        live = live_statement(stmt, live)
    return live


def live_statement(stmt: ast.stmt, live_out: set[str]) -> set[str]:
    """The names live before `stmt`, given those live after it; annotates control flow."""
    if isinstance(stmt, ast.Return):
        return reads(stmt.value)
    if isinstance(stmt, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
        stmt.ember_live_out = set(live_out)  # (an in-place update must not show elsewhere)
        bound, read = set(), reads(stmt.value)
        for target in statement_targets(stmt):
            b, r = target_names(target)
            bound |= b
            read |= r
        if isinstance(stmt, ast.AugAssign):
            read |= bound
        return (live_out - bound) | read
    if isinstance(stmt, ast.If):
        stmt.ember_live_out = set(live_out)
        return reads(stmt.test) | live_block(stmt.body, live_out) | \
            live_block(stmt.orelse, live_out)
    if isinstance(stmt, (ast.For, ast.While)):
        stmt.ember_live_out = set(live_out)
        head = set(live_out) | set(stmt.ember_stop)
        if isinstance(stmt, ast.While):
            head |= reads(stmt.test)
        while True:  # the head's live set: a fixpoint over the back edge
            body_start = live_block(stmt.body, head)
            if isinstance(stmt, ast.For):
                body_start.discard(stmt.target.id)
            new = head | body_start
            if new == head:
                break
            head = new
        bound = bound_names(stmt.body)
        if isinstance(stmt, ast.For):
            bound.add(stmt.target.id)
        stmt.ember_carried = sorted(bound & head)
        return head | (reads(stmt.iter) if isinstance(stmt, ast.For) else set())
    return live_out | reads(stmt)


def annotate_liveness(tree: ast.FunctionDef) -> None:
    live_block(tree.body, set())
