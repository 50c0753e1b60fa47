"""The whitelist check: constructs a scripted function may not use, refused at decoration.

Every AST node type is either allowed (ALLOWED), refused with a message saying what to
write instead (REFUSED), or unknown (refused too). A few allowed nodes have rules of their
own (RULES): `for` over `range` only, no `for`/`while` ... `else`, setitem on locals only.
"""

from __future__ import annotations

import ast
import builtins
from collections.abc import Callable
from typing import Any

from ember.errors import ScriptNameError, ScriptSyntaxError
from ember.frontends.script.source import FunctionSource

ALLOWED = (
    ast.FunctionDef, ast.arguments, ast.arg, ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Expr,
    ast.If, ast.For, ast.While, ast.Break, ast.Continue, ast.Return, ast.Pass,
    ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare, ast.Call, ast.keyword, ast.Attribute,
    ast.Subscript, ast.Slice, ast.Name, ast.Constant, ast.Tuple, ast.List, ast.IfExp,
    ast.expr_context, ast.operator, ast.unaryop, ast.boolop, ast.cmpop,
)

# node type: (the keyword its span covers, or None for the whole node; the message)
REFUSED: dict[type, tuple[str | None, str]] = {
    ast.Try: ("try", "try/except is not supported in a scripted function"),
    ast.With: ("with", "`with` blocks are not supported in a scripted function"),
    ast.Raise: ("raise", "`raise` is not supported in a scripted function"),
    ast.Assert: ("assert", "`assert` is not supported in a scripted function"),
    ast.Global: ("global", "`global` is not supported: pass the value as an argument"),
    ast.Nonlocal: ("nonlocal", "`nonlocal` is not supported: pass the value as an argument"),
    ast.Delete: ("del", "`del` is not supported in a scripted function"),
    ast.Import: ("import", "import at module level, not inside a scripted function"),
    ast.ImportFrom: ("from", "import at module level, not inside a scripted function"),
    ast.FunctionDef: ("def", "nested functions are not supported: define the function at"
                      " module level and decorate it with @ember.script"),
    ast.ClassDef: ("class", "classes cannot be defined in a scripted function"),
    ast.Lambda: ("lambda", "lambdas are not supported: define a function at module level"
                 " and decorate it with @ember.script"),
    ast.ListComp: (None, "list comprehensions are not supported: make the array with"
                   " np.zeros(...) and fill it with `out[i] = ...` in a for loop"),
    ast.SetComp: (None, "set comprehensions are not supported in a scripted function"),
    ast.DictComp: (None, "dict comprehensions are not supported in a scripted function"),
    ast.GeneratorExp: (None, "generator expressions are not supported: write a for loop"),
    ast.Yield: (None, "generators (`yield`) are not supported in a scripted function"),
    ast.YieldFrom: (None, "generators (`yield from`) are not supported in a scripted function"),
    ast.Await: (None, "`await` is not supported in a scripted function"),
    ast.NamedExpr: (None, "assignment expressions (`:=`) are not supported: assign first"),
    ast.Dict: (None, "dicts are not supported in a scripted function: use a tuple"),
    ast.Set: (None, "sets are not supported in a scripted function: use a tuple"),
    ast.JoinedStr: (None, "f-strings are not supported in a scripted function"),
    ast.Starred: (None, "`*` unpacking is not supported in a scripted function"),
    ast.Match: ("match", "`match` is not supported: use if/elif"),
}
if hasattr(ast, "TryStar"):
    REFUSED[ast.TryStar] = ("try", "try/except* is not supported in a scripted function")


class Checker(ast.NodeVisitor):
    """Raises ScriptSyntaxError at the first construct outside the subset."""

    def __init__(self, source: FunctionSource, is_supported_global: Callable[[Any], bool]):
        self.source = source
        self.is_supported_global = is_supported_global
        self.fn = source.fn
        tree = source.tree
        self.params = {a.arg for a in tree.args.args + tree.args.kwonlyargs}
        self.assigned = assigned_names(tree.body)

    def fail(self, node: ast.AST, message: str, keyword: str | None = None,
             cls: type = ScriptSyntaxError):
        raise self.source.error(cls, node, message, length=len(keyword) if keyword else None)

    def visit(self, node: ast.AST) -> None:
        if node is self.source.tree:
            # Decorators, annotations and defaults are Python's, evaluated when defined.
            self.check_FunctionDef(node)
            for stmt in node.body:
                self.visit(stmt)
            return
        refused = REFUSED.get(type(node))
        if refused is not None:
            keyword, message = refused
            self.fail(node, message, keyword)
        if not isinstance(node, ALLOWED):
            self.fail(node, f"{type(node).__name__} is not supported in a scripted function")
        rule = getattr(self, f"check_{type(node).__name__}", None)
        if rule is not None:
            rule(node)
        self.generic_visit(node)

    def check_FunctionDef(self, node: ast.FunctionDef) -> None:
        args = node.args
        if args.vararg or args.kwarg or args.posonlyargs:
            self.fail(node, "*args, **kwargs and positional-only arguments are not supported",
                      "def")

    def check_For(self, node: ast.For) -> None:
        if node.orelse:
            self.fail(node, "`for ... else` is not supported: use a flag", "for")
        iterator = node.iter
        if not (isinstance(iterator, ast.Call) and isinstance(iterator.func, ast.Name)
                and iterator.func.id == "range" and "range" not in self.assigned):
            self.fail(iterator, "a scripted `for` loops over range(...) only: index the"
                      " array inside (`for i in range(len(x)): ... x[i] ...`)")
        if iterator.keywords or not 1 <= len(iterator.args) <= 3:
            self.fail(iterator, "range takes 1 to 3 positional arguments")
        if not isinstance(node.target, ast.Name):
            self.fail(node.target, "the loop variable of a scripted `for` must be one name")

    def check_While(self, node: ast.While) -> None:
        if node.orelse:
            self.fail(node, "`while ... else` is not supported: use a flag", "while")

    def check_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            self.check_target(target)

    def check_AugAssign(self, node: ast.AugAssign) -> None:
        self.check_target(node.target)

    def check_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is None:
            self.fail(node, "an annotation without a value binds nothing: assign a value")
        self.check_target(node.target)

    def check_target(self, target: ast.expr) -> None:
        if isinstance(target, ast.Name):
            return
        if isinstance(target, (ast.Tuple, ast.List)):
            for item in target.elts:
                self.check_target(item)
            return
        if isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name):
            name = target.value.id
            if name in self.params and name not in self.assigned:
                self.fail(target, f"setitem on the argument `{name}` would change the caller's"
                          f" array: make a local copy first (`{name} = {name}.copy()`)")
            return
        self.fail(target, "only names, tuples of names and `name[index]` can be assigned to")

    def check_Call(self, node: ast.Call) -> None:
        # A call of a global or builtin name that no assignment hides: known now.
        func = node.func
        if isinstance(func, ast.Name) and func.id not in self.assigned | self.params:
            found, obj = resolve_global(self.fn, func.id)
            if found and not self.is_supported_global(obj):
                what = "builtin" if obj is getattr(builtins, func.id, None) else "function"
                self.fail(func, f"the {what} `{func.id}` cannot be called in a scripted"
                          " function (only NumPy functions Ember knows, a few builtins and"
                          " other @ember.script functions)")
        if isinstance(func, ast.Attribute):
            found, obj = self.module_attribute(func)
            if found and not self.is_supported_global(obj):
                self.fail(func, f"`{ast.unparse(func)}` is not supported in a scripted"
                          " function")

    def module_attribute(self, node: ast.expr) -> tuple[bool, Any]:
        """(found, value) of `np.linalg.svd`-like chains of global module attributes."""
        if isinstance(node, ast.Name):
            if node.id in self.assigned | self.params:
                return False, None
            return resolve_global(self.fn, node.id)
        if not isinstance(node, ast.Attribute):
            return False, None
        found, base = self.module_attribute(node.value)
        if not found or type(base).__name__ != "module":
            return False, None
        if not hasattr(base, node.attr):
            self.fail(node, f"module `{ast.unparse(node.value)}` has no attribute"
                      f" `{node.attr}`", cls=ScriptNameError)
        return True, getattr(base, node.attr)


def check_function(source: FunctionSource, is_supported_global: Callable[[Any], bool]) -> None:
    Checker(source, is_supported_global).visit(source.tree)


def resolve_global(fn: Any, name: str) -> tuple[bool, Any]:
    """(found, value) of `name` in `fn`'s closure, globals, then builtins."""
    code = fn.__code__
    if name in code.co_freevars and fn.__closure__:
        cell = fn.__closure__[code.co_freevars.index(name)]
        try:
            return True, cell.cell_contents
        except ValueError:  # a cell not filled yet
            return False, None
    if name in fn.__globals__:
        return True, fn.__globals__[name]
    if hasattr(builtins, name):
        return True, getattr(builtins, name)
    return False, None


def assigned_names(stmts: list[ast.stmt]) -> set[str]:
    """The names any statement of `stmts` (nested ones included) binds."""
    names: set[str] = set()
    for stmt in stmts:
        for node in ast.walk(stmt):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
    return names
