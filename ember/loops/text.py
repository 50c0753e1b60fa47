"""The loop IR's text form; `parse_program(print_program(p))` prints identically.

    kernel @add_relu(%x: f32[4,8], %b: f32[8], %out: f32[4,8]) {
      for %i0 = 0 to 4 parallel {
        for %i1 = 0 to 8 vectorized {
          %out[%i0, %i1] = max(add(%x[%i0, %i1], %b[%i1]), 0.0:f32)
        }
      }
    }

Expressions are calls (`add(a, b)`, `select(c, a, b)`, `fma(a, b, c)`, `f16(a)` for a
cast), loads `%buf[i, j]`, index variables `%i0`, and constants: bare integers are i64
indices, others carry their type (`0.5:f32`, `true`). Programs list their buffers by kind,
then steps.
"""

from __future__ import annotations

from ember.dtypes import DType
from ember.errors import ParseError
from ember.graph.text.parser import GraphParser
from ember.graph.text.printer import format_constant_table, format_element
from ember.lexer import TokenStream, describe, quote
from ember.loops.ir import (
    BINARY_OPS,
    BUFFER_KINDS,
    INDEX,
    LOOP_KINDS,
    UNARY_OPS,
    Binary,
    Bitcast,
    Buffer,
    Call,
    Cast,
    Const,
    Expr,
    Fma,
    For,
    If,
    Kernel,
    Load,
    Prefetch,
    Program,
    ProgramBuffer,
    ProgramIf,
    ProgramLoop,
    ProgramStep,
    Select,
    Stmt,
    Store,
    Unary,
    Var,
    const,
    is_size,
)

# -- printing ----------------------------------------------------------------------------------


def format_expr(e: Expr) -> str:
    if isinstance(e, Const):
        if e.dtype is INDEX:
            return str(e.value)
        if e.dtype is DType.bool:
            return "true" if e.value else "false"
        return f"{format_element(e.value, e.dtype)}:{e.dtype.value}"
    if isinstance(e, Var):
        return e.name if is_size(e) else f"%{e.name}"
    if isinstance(e, Load):
        return f"%{e.buffer}[{', '.join(format_expr(i) for i in e.index)}]"
    if isinstance(e, Unary):
        return f"{e.op}({format_expr(e.a)})"
    if isinstance(e, Binary):
        return f"{e.op}({format_expr(e.a)}, {format_expr(e.b)})"
    if isinstance(e, Select):
        return f"select({format_expr(e.cond)}, {format_expr(e.a)}, {format_expr(e.b)})"
    if isinstance(e, Fma):
        return f"fma({format_expr(e.a)}, {format_expr(e.b)}, {format_expr(e.c)})"
    if isinstance(e, Cast):
        return f"{e.dtype.value}({format_expr(e.a)})"
    if isinstance(e, Bitcast):
        return f"bitcast<{e.dtype.value}>({format_expr(e.a)})"
    raise TypeError(e)


def _buffer(b: Buffer) -> str:
    return f"%{b.name}: {b.dtype.value}[{','.join(map(str, b.shape))}]"


def _stmts(stmts: list[Stmt], indent: str, lines: list[str]) -> None:
    for s in stmts:
        if isinstance(s, For):
            step = f" step {s.step}" if s.step != 1 else ""
            kind = f" {s.kind}" if s.kind != "serial" else ""
            lines.append(f"{indent}for %{s.var.name} = {format_expr(s.start)} to"
                         f" {format_expr(s.stop)}{step}{kind} {{")
            _stmts(s.body, indent + "  ", lines)
            lines.append(f"{indent}}}")
        elif isinstance(s, Store):
            lines.append(f"{indent}%{s.buffer}[{', '.join(format_expr(i) for i in s.index)}]"
                         f" = {format_expr(s.value)}")
        elif isinstance(s, Prefetch):
            lines.append(f"{indent}prefetch %{s.buffer}"
                         f"[{', '.join(format_expr(i) for i in s.index)}]")
        elif isinstance(s, If):
            lines.append(f"{indent}if {format_expr(s.cond)} {{")
            _stmts(s.then, indent + "  ", lines)
            if s.orelse:
                lines.append(f"{indent}}} else {{")
                _stmts(s.orelse, indent + "  ", lines)
            lines.append(f"{indent}}}")
        else:
            raise TypeError(s)


def kernel_structure(kernel: Kernel) -> str:
    """The kernel's loop-IR text without its name and origin: equal for identical code (a
    model's repeated blocks), which is scheduled and emitted once."""
    return print_kernel(Kernel("_", kernel.params, kernel.body, kernel.locals))


def print_kernel(k: Kernel) -> str:
    origin = f" loc({quote(k.origin)})" if k.origin else ""
    lines = [f"kernel @{k.name}({', '.join(_buffer(b) for b in k.params)}){origin} {{"]
    for b in k.locals:
        lines.append(f"  local {_buffer(b)}")
    _stmts(k.body, "  ", lines)
    lines.append("}")
    return "\n".join(lines) + "\n"


def _steps(steps: list[ProgramStep], indent: str, lines: list[str]) -> None:
    for s in steps:
        if isinstance(s, Call):
            lines.append(f"{indent}call @{s.kernel}({', '.join('%' + a for a in s.args)})")
        elif isinstance(s, ProgramIf):
            lines.append(f"{indent}if %{s.cond} {{")
            _steps(s.then, indent + "  ", lines)
            lines.append(f"{indent}}} else {{")
            _steps(s.orelse, indent + "  ", lines)
            lines.append(f"{indent}}}")
        elif isinstance(s, ProgramLoop):
            lines.append(f"{indent}loop %{s.trip_count}, %{s.cond}, %{s.counter} {{")
            _steps(s.body, indent + "  ", lines)
            lines.append(f"{indent}}}")
        else:
            raise TypeError(s)


def print_program(p: Program, constants: str = "table") -> str:
    """The text of a program: its kernels, then its buffers and steps, then constants."""
    parts = [print_kernel(k) for k in p.kernels]
    lines = [f"program @{p.name} {{"]
    for b in p.buffers:
        alias = p.aliases.get(b.buffer.name)
        lines.append(f"  {b.kind} {_buffer(b.buffer)}" + (f" in %{alias}" if alias else ""))
    _steps(p.steps, "  ", lines)
    lines.append("}")
    parts.append("\n".join(lines) + "\n")
    text = "\n".join(parts)
    if constants != "omit":
        text += format_constant_table(p.constants, elide=constants == "elide")
    return text


# -- parsing -------------------------------------------------------------------------------------


class LoopParser:
    def __init__(self, text: str, source_name: str = "<text>"):
        self.ts = TokenStream(text, source_name)
        self.graph_parser = GraphParser.__new__(GraphParser)  # reuse its type/dense readers
        self.graph_parser.ts = self.ts
        self.buffers: dict[str, Buffer] = {}
        self.vars: set[str] = set()

    def error(self, message: str, token=None) -> ParseError:
        return self.ts.error(message, token)

    def buffer_decl(self) -> Buffer:
        token = self.ts.expect_kind("value", "a buffer (%name)")
        self.ts.expect(":")
        t = self.graph_parser.tensor_type()
        name = token.text[1:]
        if name in self.buffers:
            raise self.error(f"buffer %{name} is declared twice", token)
        self.buffers[name] = Buffer(name, t.dtype, t.shape)
        return self.buffers[name]

    def buffer_ref(self) -> tuple[str, object]:
        token = self.ts.expect_kind("value", "a buffer (%name)")
        name = token.text[1:]
        if name not in self.buffers:
            raise self.error(f"unknown buffer %{name}", token)
        return name, token

    # -- expressions
    def expr(self) -> Expr:
        ts = self.ts
        token = ts.peek
        if token.kind == "number":
            ts.next()
            value = float(token.text) if any(c in token.text for c in ".ein") else int(
                token.text)
            if ts.accept(":"):
                return const(value, self.graph_parser.dtype())
            if isinstance(value, float):
                raise self.error("a non-integer constant needs a type (1.5:f32)", token)
            return Const(value, INDEX)
        if token.kind == "ident" and token.text in ("true", "false"):
            ts.next()
            return Const(token.text == "true", DType.bool)
        if token.kind == "value":
            ts.next()
            name = token.text[1:]
            if ts.at("["):
                if name not in self.buffers:
                    raise self.error(f"unknown buffer %{name}", token)
                return Load(name, self.index(), self.buffers[name].dtype)
            if name not in self.vars:
                raise self.error(f"unknown index variable %{name}", token)
            return Var(name)
        if token.kind == "dim":  # a size known at call time, ?b
            ts.next()
            return Var(token.text)
        if token.kind == "ident" and token.text == "bitcast":
            ts.next()
            ts.expect("<")
            dtype = self.graph_parser.dtype()
            ts.expect(">")
            ts.expect("(")
            operand = self.expr()
            ts.expect(")")
            return Bitcast(dtype, operand)
        if token.kind == "ident":
            ts.next()
            ts.expect("(")
            args = [self.expr()]
            while ts.accept(","):
                args.append(self.expr())
            ts.expect(")")
            return self.call(token, args)
        raise self.error(f"expected an expression, found {describe(token)}")

    def call(self, token, args: list[Expr]) -> Expr:
        name = token.text
        want = 3 if name in ("select", "fma") else 2 if name in BINARY_OPS else 1
        if name not in UNARY_OPS and name not in BINARY_OPS and name not in ("select", "fma") \
                and name not in DType.__members__:
            raise self.error(f"unknown operation '{name}'", token)
        if len(args) != want:
            raise self.error(f"{name} takes {want} operands, got {len(args)}", token)
        if name == "select":
            return Select(*args)
        if name == "fma":
            return Fma(*args)
        if name in BINARY_OPS:
            return Binary(name, *args)
        if name in UNARY_OPS:
            return Unary(name, args[0])
        return Cast(DType(name), args[0])

    def index(self) -> tuple[Expr, ...]:
        self.ts.expect("[")
        items = []
        if not self.ts.at("]"):
            items.append(self.expr())
            while self.ts.accept(","):
                items.append(self.expr())
        self.ts.expect("]")
        return tuple(items)

    # -- statements
    def body(self) -> list[Stmt]:
        self.ts.expect("{")
        return self.stmts_to_close()

    def stmts_to_close(self) -> list[Stmt]:
        """Statements up to the closing brace (the opening one already read)."""
        stmts = []
        while not self.ts.accept("}"):
            if self.ts.peek.kind == "eof":
                raise self.error("expected a statement or '}', found end of input")
            stmts.append(self.stmt())
        return stmts

    def stmt(self) -> Stmt:
        ts = self.ts
        if ts.accept("for"):
            token = ts.expect_kind("value", "a loop variable")
            name = token.text[1:]
            if name in self.vars or name in self.buffers:
                raise self.error(f"%{name} is already defined", token)
            ts.expect("=")
            start = self.expr()
            ts.expect("to")
            stop = self.expr()
            step = ts.expect_int("a step") if ts.accept("step") else 1
            kind = "serial"
            if ts.peek.kind == "ident" and ts.peek.text in LOOP_KINDS:
                kind = ts.next().text
            self.vars.add(name)
            body = self.body()
            self.vars.discard(name)
            return For(Var(name), start, stop, body, step, kind)
        if ts.accept("if"):
            cond = self.expr()
            then = self.body()
            orelse = self.body() if ts.accept("else") else []
            return If(cond, then, orelse)
        if ts.accept("prefetch"):
            name, _ = self.buffer_ref()
            return Prefetch(name, self.index())
        name, _ = self.buffer_ref()
        index = self.index()
        ts.expect("=")
        return Store(name, index, self.expr())

    def kernel(self) -> Kernel:
        ts = self.ts
        ts.expect("kernel")
        name = ts.expect_kind("symbol", "a kernel name (@name)").text[1:]
        self.buffers, self.vars = {}, set()
        ts.expect("(")
        params = []
        while not ts.at(")"):
            params.append(self.buffer_decl())
            if not ts.accept(","):
                break
        ts.expect(")")
        origin = ""
        if ts.accept("loc"):
            ts.expect("(")
            origin = ts.expect_string()
            ts.expect(")")
        ts.expect("{")
        locals_ = []
        while ts.accept("local"):
            locals_.append(self.buffer_decl())
        return Kernel(name, params, self.stmts_to_close(), locals_, origin)

    def steps(self) -> list[ProgramStep]:
        self.ts.expect("{")
        return self.steps_to_close()

    def steps_to_close(self) -> list[ProgramStep]:
        ts = self.ts
        steps: list[ProgramStep] = []
        while not ts.accept("}"):
            if ts.accept("call"):
                kernel = ts.expect_kind("symbol", "a kernel name").text[1:]
                ts.expect("(")
                args = []
                while not ts.at(")"):
                    args.append(self.buffer_ref()[0])
                    if not ts.accept(","):
                        break
                ts.expect(")")
                steps.append(Call(kernel, args))
            elif ts.accept("if"):
                cond = self.buffer_ref()[0]
                then = self.steps()
                ts.expect("else")
                steps.append(ProgramIf(cond, then, self.steps()))
            elif ts.accept("loop"):
                trip = self.buffer_ref()[0]
                ts.expect(",")
                cond = self.buffer_ref()[0]
                ts.expect(",")
                counter = self.buffer_ref()[0]
                steps.append(ProgramLoop(trip, cond, counter, self.steps()))
            else:
                raise self.error(f"expected a program step, found {describe(ts.peek)}")
        return steps

    def program(self) -> Program:
        ts = self.ts
        kernels = []
        while ts.at("kernel"):
            kernels.append(self.kernel())
        ts.expect("program")
        name = ts.expect_kind("symbol", "a program name (@name)").text[1:]
        ts.expect("{")
        self.buffers, self.vars = {}, set()
        buffers, aliases = [], {}
        while ts.peek.kind == "ident" and ts.peek.text in BUFFER_KINDS:
            kind = ts.next().text
            buffers.append(ProgramBuffer(self.buffer_decl(), kind))
            if kind == "output" and ts.accept("in"):  # computed in an input's memory
                token = ts.expect_kind("value", "an input buffer (%name)")
                if not any(b.kind == "input" and b.buffer.name == token.text[1:]
                           for b in buffers):
                    raise self.error(f"{token.text} is not an input buffer", token)
                aliases[buffers[-1].buffer.name] = token.text[1:]
        steps = self.steps_to_close()
        program = Program(name, buffers, kernels, steps, aliases=aliases)
        if ts.accept("constants"):
            self.graph_parser.table_refs = {}
            from ember.graph.ir import Graph

            holder = Graph()
            self.graph_parser.constants_section(holder)
            program.constants = holder.constants
        if ts.peek.kind != "eof":
            raise self.error(f"expected end of input, found {describe(ts.peek)}")
        return program


def parse_program(text: str, source_name: str = "<text>") -> Program:
    """Parse a loop IR program; ParseError with line and column on malformed text."""
    return LoopParser(text, source_name).program()


def parse_kernel(text: str, source_name: str = "<text>") -> Kernel:
    parser = LoopParser(text, source_name)
    kernel = parser.kernel()
    if parser.ts.peek.kind != "eof":
        raise parser.error(f"expected end of input, found {describe(parser.ts.peek)}")
    return kernel
