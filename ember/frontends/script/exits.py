"""Early exits to flags, on the AST (TorchScript's exit transform, done before emission).

`break`, `continue` and a `return` inside control flow become assignments of flags; the
statements after one that may have exited are guarded by `if not flag:`; a loop stops
when its `break` (or `return`) flag is set, through the loop op's condition, which the
emitter reads from `loop.ember_stop`. So every loop stays one structured `loop` op.

A statement that always exits (both branches return, say) needs no guard after it: the
rest of its block is dead and dropped, so the common `if c: return a` / `return b` shape
costs one `if` and nothing more.

Flag names start with `$`, which no Python name can: they never clash with the user's,
and errors name them by INTERNAL_NAMES.
"""

from __future__ import annotations

import ast
import itertools

from ember.errors import ScriptSyntaxError
from ember.frontends.script.source import FunctionSource

RETURNED, RETVAL, UNDEFINED = "$returned", "$retval", "$undefined"
IFEXP = "$ifexp"  # the value of `a if c else b`, joined like a name bound in both branches
# How errors speak of the frontend's own names.
INTERNAL_NAMES = {RETVAL: "the return value", RETURNED: "the return flag",
                  IFEXP: "the conditional expression"}


def describe_name(name: str) -> str:
    if name in INTERNAL_NAMES:
        return INTERNAL_NAMES[name]
    if name.startswith("$"):
        return "a break or continue flag"
    return f"`{name}`"


def _assign(name: str, value: ast.expr, at: ast.AST) -> ast.Assign:
    node = ast.Assign(targets=[ast.Name(name, ast.Store())], value=value)
    return _located(node, at)


def _located(node: ast.AST, at: ast.AST) -> ast.AST:
    ast.copy_location(node, at)
    for child in ast.walk(node):
        ast.copy_location(child, at)
    return node


class ExitTransform:
    def __init__(self, source: FunctionSource):
        self.source = source
        self.loop_ids = itertools.count()
        top = set(map(id, source.tree.body))
        # Returns as flags only when one is inside control flow; else they end the function.
        self.returns_as_flags = any(isinstance(n, ast.Return) and id(n) not in top
                                    for n in ast.walk(source.tree))

    def run(self) -> None:
        tree = self.source.tree
        has_value = any(isinstance(n, ast.Return) and n.value is not None
                        for n in ast.walk(tree))
        body, _, always = self.block(tree.body, None)
        if has_value and not always:
            raise self.source.error(
                ScriptSyntaxError, tree, f"`{tree.name}` returns a value on some paths only:"
                " a scripted function returns on every path (add a final `return`)",
                length=len("def"))
        if self.returns_as_flags:
            start = tree.body[0]
            prelude = [_assign(RETURNED, ast.Constant(False), start),
                       _assign(RETVAL, ast.Name(UNDEFINED, ast.Load()), start)]
            end = _located(ast.Return(ast.Name(RETVAL, ast.Load())), tree.body[-1])
            body = prelude + body + [end]
        tree.body = body

    def block(self, stmts: list[ast.stmt], loop: int | None):
        """(new statements, flags they may set, whether they always exit)."""
        out: list[ast.stmt] = []
        flags: set[str] = set()
        for k, stmt in enumerate(stmts):
            new, may, always = self.statement(stmt, loop)
            out.extend(new)
            flags |= may
            if always:
                return out, flags, True
            if may:
                rest, rest_flags, rest_always = self.block(stmts[k + 1:], loop)
                if rest:
                    out.append(self.guard(may, rest))
                return out, flags | rest_flags, rest_always
        return out, flags, False

    def guard(self, flags: set[str], body: list[ast.stmt]) -> ast.If:
        at = body[0]
        names = [ast.Name(f, ast.Load()) for f in sorted(flags)]
        test = names[0] if len(names) == 1 else ast.BoolOp(ast.Or(), names)
        node = _located(ast.If(test=ast.UnaryOp(ast.Not(), test), body=[], orelse=[]), at)
        node.body = body
        node.ember_guard = True  # its one-branch bindings are not the user's doing
        return node

    def statement(self, stmt: ast.stmt, loop: int | None):
        if isinstance(stmt, ast.Return):
            if not self.returns_as_flags:
                return [stmt], set(), True
            value = stmt.value if stmt.value is not None else ast.Constant(None)
            return [_assign(RETVAL, value, stmt), _assign(RETURNED, ast.Constant(True), stmt)], \
                {RETURNED}, True
        if isinstance(stmt, (ast.Break, ast.Continue)):
            flag = f"$broke{loop}" if isinstance(stmt, ast.Break) else f"$continued{loop}"
            return [_assign(flag, ast.Constant(True), stmt)], {flag}, True
        if isinstance(stmt, ast.If):
            body, body_flags, body_always = self.block(stmt.body, loop)
            orelse, else_flags, else_always = self.block(stmt.orelse, loop)
            stmt.body = body or [_located(ast.Pass(), stmt)]
            stmt.orelse = orelse
            return [stmt], body_flags | else_flags, body_always and else_always
        if isinstance(stmt, (ast.For, ast.While)):
            k = next(self.loop_ids)
            body, flags, _ = self.block(stmt.body, k)
            broke, continued = f"$broke{k}", f"$continued{k}"
            prelude = [_assign(broke, ast.Constant(False), stmt)] if broke in flags else []
            reset = [_assign(continued, ast.Constant(False), stmt)] if continued in flags else []
            stmt.body = reset + (body or [_located(ast.Pass(), stmt)])
            stmt.ember_stop = [f for f in (broke, RETURNED) if f in flags]
            return prelude + [stmt], flags & {RETURNED}, False
        return [stmt], set(), False


def transform_exits(source: FunctionSource) -> None:
    """Rewrite `source.tree` in place: no break, continue or nested return remains."""
    ExitTransform(source).run()
