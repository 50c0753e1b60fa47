"""PyTorch's OpInfo database through `torch.compile(backend="ember")`.

    python -m ember.conformance.torch_opinfo                  # all ops: totals and reasons
    python -m ember.conformance.torch_opinfo -k 'softmax|^add$' -v
    python -m ember.conformance.torch_opinfo --write-docs     # rewrite docs/conformance-torch.md
    python -m ember.conformance.torch_opinfo --update-ratchet # add new passes to the ratchet

Each OpInfo's float32 CPU sample inputs run through
`torch.compile(fn, backend="ember", fullgraph=True, dynamic=False,
options={"strict": True})`, where fn calls `op.op(sample.input, *sample.args,
**sample.kwargs)`, and are compared with eager PyTorch the way Inductor's
test/inductor/test_torchinductor_opinfo.py compares (float32: rtol 1.3e-5, atol 1.5e-5,
NaNs equal, dtypes exact; outputs may be tensors, tuples, lists or non-tensors; inputs
that the op mutates are compared too). Strict mode makes an ATen op without a converter
raise instead of running in eager PyTorch, and a sample counts only when
`ember.torch.counters["graphs"]` grew, i.e. Dynamo handed Ember a graph.

An op passes when all its samples pass; it stops at its first failing sample. Each
sample is compiled from a fresh code object, so it really compiles through Ember (no
reuse of another sample's cache entry, no Dynamo recompile limit); Dynamo is reset once
per op. The other statuses:

  nondeterministic  random ops (and uninitialized memory: empty*), not run
  capture           Dynamo cannot capture the op in one graph (graph break, or an output
                    shape that depends on the data)
  no-graph          Dynamo produced no graph for Ember (nothing left to compute)
  unsupported       an ATen op without a converter (named), or arguments its converter
                    refuses (the converter's reason: a dtype, an attribute)
  wrong             a result differs from eager
  error             anything else (Ember or PyTorch raised)

The full sweep took about 24 min (1,449 s in the harness) on 2 shared cores with 489 passing
OpInfos (12,074 samples); passing ops cost almost all of it, so it grows as ops pass.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
import types
import warnings
from collections import Counter
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import torch
import torch._dynamo

import ember.torch
from ember.errors import EmberError, UnsupportedOpError

ROOT = Path(__file__).resolve().parents[2]
RATCHET = ROOT / "tests" / "conformance" / "torch" / "opinfo_ratchet.txt"
# The compiled path's ratchet: OpInfos that pass with executor "cpu" (LLVM code).
RATCHET_CPU = RATCHET.with_name("opinfo_ratchet_cpu.txt")


def ratchet_path(executor: str) -> Path:
    return RATCHET_CPU if executor == "cpu" else RATCHET
DOC = ROOT / "docs" / "conformance-torch.md"
# The options handed to the ember backend: strict (no silent eager fallback) and the executor.
BACKEND_OPTIONS = {"strict": True, "executor": "interp"}

RTOL, ATOL = 1.3e-5, 1.5e-5  # Inductor's float32 tolerances

# Ops whose results are random or uninitialized memory: eager and Ember cannot agree.
# Names with a random word (a dotted or underscored part of op.name) count too.
RANDOM_WORDS = re.compile(r"(^|[._])(bernoulli|normal|uniform|rand\w*|multinomial"
                          r"|cauchy|log_normal|geometric|dropout\dd)($|[._])|dropout$")
NONDETERMINISTIC = {
    "exponential": "random", "nn.functional.rrelu": "random (training=True samples)",
    "empty": "uninitialized memory", "empty_like": "uninitialized memory",
    "empty_strided": "uninitialized memory", "empty_permuted": "uninitialized memory",
    "new_empty": "uninitialized memory", "new_empty_strided": "uninitialized memory",
    "resize_": "uninitialized memory", "resize_as_": "uninitialized memory",
    "svd_lowrank": "random (random projections)", "pca_lowrank": "random (random projections)",
    "nn.functional.fractional_max_pool2d": "random (pooling regions)",
    "nn.functional.fractional_max_pool3d": "random (pooling regions)",
}
DETERMINISTIC = {"nn.functional.feature_alpha_dropout.without_train"}  # training=False

# Errors that mean Dynamo cannot capture the op as one static graph.
_DATA_DEPENDENT = ("GuardOnDataDependentSymNode", "DataDependentOutputException",
                   "DynamicOutputShapeException", "UserError")
# Nodes that only appear when a shape is data-dependent (unbacked SymInts).
_SYMBOLIC_NODES = re.compile(r"aten\.(sym_\S*|_local_scalar_dense\S*|_assert_\S*"
                             r"|(ge|gt|le|lt|eq|ne|mul|add|sub|floordiv|mod)) ")
_ATEN_NAME = re.compile(r"aten\.([\w.]+)")
# The location in a converter's message: " (fx node at file.py:12 (fn): code)"
_LOCATION = re.compile(r" \(fx [^:]*?(\)|at .*?\): .*?\))(?=:)")


@dataclass
class OpResult:
    name: str
    status: str  # pass, nondeterministic, capture, no-graph, unsupported, wrong, error
    detail: str = ""
    samples: int = 0  # samples run (up to and including the first failure)
    total_samples: int = 0
    skipped_samples: int = 0  # eager itself raised, or a random sample (dropout_p > 0)
    seconds: float = 0.0
    missing: tuple[str, ...] = field(default_factory=tuple)  # unsupported ATen ops


def full_name(op: Any) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


@cache
def float32_ops() -> dict[str, Any]:
    """full name -> OpInfo, for every OpInfo with float32 CPU samples (677 in torch 2.13)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torch.testing._internal.common_methods_invocations import op_db
    return {full_name(op): op for op in op_db
            if torch.float32 in op.supported_dtypes("cpu")}


def nondeterminism(name: str, op: Any) -> str | None:
    if name in DETERMINISTIC:
        return None
    if name in NONDETERMINISTIC:
        return NONDETERMINISTIC[name]
    if RANDOM_WORDS.search(op.name):
        return "random"
    return None


@contextmanager
def _traceable_seed_wrapper():
    """Some OpInfos of deterministic ops (item, attention, dropout with training=False) call
    through `wrapper_set_seed`, whose `freeze_rng_state` Dynamo cannot trace; Inductor's
    OpInfo test replaces it the same way. Random ops are not run, so no seed is needed."""
    import torch.testing._internal.common_methods_invocations as cmi

    saved = cmi.wrapper_set_seed
    cmi.wrapper_set_seed = lambda op, *args, **kwargs: op(*args, **kwargs)
    try:
        yield
    finally:
        cmi.wrapper_set_seed = saved


def _random_sample(sample: Any) -> bool:
    """Samples of deterministic ops that draw random numbers (attention dropout)."""
    p = sample.kwargs.get("dropout_p", 0.0)
    return isinstance(p, (int, float)) and p > 0


def run_op(name: str, max_samples: int | None = None) -> OpResult:
    """Run the float32 CPU samples of the OpInfo `name` (all, or the first `max_samples`)."""
    op = float32_ops()[name]
    why = nondeterminism(name, op)
    if why:
        return OpResult(name, "nondeterministic", why)
    start = time.perf_counter()
    torch._dynamo.reset()
    torch.manual_seed(0)
    result = OpResult(name, "pass")
    with warnings.catch_warnings(), _traceable_seed_wrapper():
        warnings.simplefilter("ignore")
        try:
            samples = list(op.sample_inputs("cpu", torch.float32, requires_grad=False))
        except Exception as e:  # noqa: BLE001  (a broken OpInfo is reported, not raised)
            result.status, result.detail = "error", f"sample_inputs raised {_brief(e)}"
            samples = []
        result.total_samples = len(samples)
        fn_op = op.op if op.op is not None else op.method_variant
        eager_error = ""
        for index, sample in enumerate(samples[:max_samples]):
            if _random_sample(sample):
                result.skipped_samples += 1
                continue
            status, detail, missing = run_sample(fn_op, sample)
            if status == "skip":
                result.skipped_samples += 1
                eager_error = eager_error or detail
                continue
            result.samples += 1
            if status != "pass":
                result.status = status
                result.detail = f"sample {index}: {detail}"
                result.missing = missing
                break
    if result.status == "pass" and result.samples == 0:
        result.status = "error"
        result.detail = f"eager PyTorch raises on every sample ({eager_error})"
    torch._dynamo.reset()
    result.seconds = time.perf_counter() - start
    return result


def run_sample(fn_op: Callable[..., Any], sample: Any) -> tuple[str, str, tuple[str, ...]]:
    """(status, detail, missing ATen ops) of one sample; status "skip" when eager raises."""
    eager_in = _clone((sample.input, sample.args, sample.kwargs))
    ember_in = _clone((sample.input, sample.args, sample.kwargs))
    try:
        with torch.no_grad():
            expected = fn_op(eager_in[0], *eager_in[1], **eager_in[2])
    except Exception as e:  # noqa: BLE001  (a sample eager PyTorch rejects says nothing)
        return "skip", _brief(e), ()

    compiled = torch.compile(_fresh_caller(fn_op), backend="ember", fullgraph=True,
                             dynamic=False, options=dict(BACKEND_OPTIONS))
    graphs = ember.torch.counters["graphs"]
    fallbacks = ember.torch.counters["fallback_graphs"]
    try:
        with torch.no_grad():
            actual = compiled(ember_in[0], *ember_in[1], **ember_in[2])
    except Exception as e:  # noqa: BLE001  (every failure is classified)
        return classify(e)
    if ember.torch.counters["fallback_graphs"] != fallbacks:
        return "error", "a graph fell back to eager despite strict mode", ()
    if ember.torch.counters["graphs"] == graphs:
        return "no-graph", "Dynamo produced no graph for Ember", ()
    for what, got, want in (("output", actual, expected), ("mutated input", ember_in, eager_in)):
        problem = compare(got, want)
        if problem:
            return "wrong", f"{what}: {problem}", ()
    return "pass", "", ()


def _fresh_caller(fn_op: Callable[..., Any]) -> Callable[..., Any]:
    """`fn(x, *args, **kwargs) -> fn_op(...)` with a code object of its own, so Dynamo
    compiles it afresh instead of reusing (or running out of) another sample's entries."""

    def fn(x, *args, **kwargs):
        return fn_op(x, *args, **kwargs)

    code = fn.__code__.replace()
    return types.FunctionType(code, fn.__globals__, fn.__name__, None, fn.__closure__)


def _clone(tree: Any) -> Any:
    return torch.utils._pytree.tree_map(
        lambda x: x.clone() if isinstance(x, torch.Tensor) else x, tree)


def compare(actual: Any, expected: Any) -> str:
    """"" when `actual` matches `expected` within the float32 tolerances, else why not.

    Both are flattened as pytrees (tuples, lists, dicts, return types); the structures
    must agree, tensors and numbers match with `assert_close`, other leaves (dtypes,
    sizes, strings, None) with ==."""
    pytree = torch.utils._pytree
    got, got_spec = pytree.tree_flatten(actual)
    want, want_spec = pytree.tree_flatten(expected)
    if got_spec != want_spec:
        return f"structure {got_spec} differs from eager's {want_spec}"[:300]
    for i, (a, e) in enumerate(zip(got, want)):
        where = f"leaf {i}: " if len(want) > 1 else ""
        if isinstance(e, (torch.Tensor, bool, int, float, complex)) or isinstance(
                a, torch.Tensor):
            try:
                torch.testing.assert_close(a, e, rtol=RTOL, atol=ATOL, equal_nan=True,
                                           check_device=False)
            except (AssertionError, TypeError) as err:
                return where + " ".join(str(err).split())[:300]
        elif not _equal(a, e):
            return f"{where}{a!r} != {e!r}"[:300]
    return ""


def _equal(a: Any, e: Any) -> bool:
    try:
        return bool(a == e)
    except Exception:  # noqa: BLE001  (incomparable values differ)
        return False


def _chain(e: BaseException) -> Iterable[BaseException]:
    """`e` and the exceptions it wraps (BackendCompilerFailed, __cause__, __context__)."""
    seen: set[int] = set()
    todo = [e]
    while todo:
        x = todo.pop(0)
        if x is None or id(x) in seen:
            continue
        seen.add(id(x))
        yield x
        todo += [getattr(x, "inner_exception", None), x.__cause__, x.__context__]


def classify(e: BaseException) -> tuple[str, str, tuple[str, ...]]:
    chain = list(_chain(e))
    for x in chain:
        if isinstance(x, UnsupportedOpError):
            message = str(x)
            if _SYMBOLIC_NODES.search(message + " ") or "symbolic dim" in message:
                ops = [m for m in _ATEN_NAME.findall(message) if "." in m
                       and not m.startswith(("sym_", "_local_scalar", "_assert"))]
                return "capture", ("data-dependent shape or value (unbacked SymInt)"
                                   + (f" ({', '.join(sorted(set(ops)))})" if ops else "")), ()
            if not message.startswith("the graph uses"):  # a converter refused arguments
                return "unsupported", _LOCATION.sub("", _first_line(message)), ()
            missing = tuple(sorted({m for m in _ATEN_NAME.findall(message) if "." in m}))
            return "unsupported", ", ".join(f"aten.{m}" for m in missing), missing
    for x in chain:
        if type(x).__name__ in _DATA_DEPENDENT:
            return "capture", f"data-dependent: {_brief(x)}", ()
    for x in chain:
        if isinstance(x, torch._dynamo.exc.Unsupported):
            return "capture", "graph break: " + _first_line(str(x)), ()
    for x in chain:
        if isinstance(x, EmberError):
            return "error", f"{type(x).__name__}: {_first_line(str(x))}", ()
    inner = chain[1] if len(chain) > 1 and type(e).__name__ == "BackendCompilerFailed" else e
    return "error", _brief(inner), ()


def _first_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    line = lines[0] if lines else ""
    if line.startswith("backend='ember' raised:") and len(lines) > 1:
        line = lines[1]
    return line[:240]


def _brief(e: BaseException) -> str:
    return f"{type(e).__name__}: {_first_line(str(e))}"


def read_ratchet(path: Path = RATCHET) -> list[str]:
    if not path.exists():
        return []
    return [line.strip() for line in path.read_text().splitlines()
            if line.strip() and not line.startswith("#")]


def write_ratchet(names: Iterable[str], path: Path = RATCHET) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    executor = "cpu" if path == RATCHET_CPU else "interp"
    flag = " --executor cpu" if executor == "cpu" else ""
    path.write_text("# OpInfos whose float32 CPU samples all pass through torch.compile(backend="
                    f"'ember'), executor {executor};\n# CI fails when one stops passing. Grow it"
                    f" with:\n#   python -m ember.conformance.torch_opinfo{flag} --update-ratchet\n"
                    + "\n".join(sorted(set(names))) + "\n")


STATUS_ORDER = ("pass", "wrong", "unsupported", "capture", "no-graph", "error",
                "nondeterministic")


def report(results: list[OpResult], seconds: float) -> str:
    counts = Counter(r.status for r in results)
    attempted = [r for r in results if r.status != "nondeterministic"]
    samples = sum(r.samples for r in results)
    blocked: Counter = Counter()
    for r in results:
        for m in r.missing:
            blocked[m] += 1
    lines = [
        "# Conformance: PyTorch OpInfo",
        "",
        "Generated by `python -m ember.conformance.torch_opinfo --write-docs`"
        " (the harness: `ember/conformance/torch_opinfo.py`).",
        "",
        "Every OpInfo of PyTorch's `op_db` with float32 CPU samples runs its sample inputs"
        " through `torch.compile(fn, backend=\"ember\", fullgraph=True, dynamic=False,"
        " options={\"strict\": True})` and is compared with eager PyTorch with Inductor's"
        f" float32 tolerances (rtol {RTOL}, atol {ATOL}). An op passes when all its samples"
        " pass with a graph compiled by Ember (no eager fallback); it stops at its first"
        " failing sample.",
        "",
        f"**{counts['pass']}** of the {len(results)} OpInfos with float32 CPU samples pass"
        f" ({len(attempted)} attempted; {counts['nondeterministic']} random or uninitialized"
        f" ops are not run). {samples} samples ran in {seconds:.0f} s.",
        "",
        "These figures are the reference interpreter's (`executor=\"interp\"`). Compiled"
        f" through LLVM (`--executor cpu`), {len(read_ratchet(RATCHET_CPU))} OpInfos pass;"
        " they are listed in `tests/conformance/torch/opinfo_ratchet_cpu.txt`.",
        "",
        "| status | OpInfos | meaning |",
        "|---|---:|---|",
    ]
    meaning = {
        "pass": "all float32 samples match eager",
        "wrong": "a result differs from eager beyond the tolerances",
        "unsupported": "an ATen op without a converter, or arguments its converter refuses",
        "capture": "Dynamo cannot capture one static graph (graph break, data-dependent shape)",
        "no-graph": "Dynamo produced no graph for Ember",
        "error": "Ember or PyTorch raised",
        "nondeterministic": "random results or uninitialized memory; not run",
    }
    for status in STATUS_ORDER:
        lines.append(f"| {status} | {counts[status]} | {meaning[status]} |")
    if blocked:
        lines += ["", "## Missing ATen ops", "",
                  "Each ATen overload without a converter, with the number of OpInfos whose"
                  " first failing sample needs it.", "", "| ATen op | OpInfos |", "|---|---:|"]
        for m, n in sorted(blocked.items(), key=lambda kv: (-kv[1], kv[0])):
            lines.append(f"| aten.{m} | {n} |")
    lines += ["", "## OpInfos that do not pass", "", "| OpInfo | status | why |", "|---|---|---|"]
    for r in sorted(results, key=lambda r: (STATUS_ORDER.index(r.status), r.name)):
        if r.status != "pass":
            why = r.detail.replace("|", "/").replace("\n", " ")[:200]
            lines.append(f"| {r.name} | {r.status} | {why} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ember.conformance.torch_opinfo")
    parser.add_argument("-k", "--filter", help="regular expression on OpInfo names")
    parser.add_argument("-v", "--verbose", action="store_true", help="print every OpInfo")
    parser.add_argument("--max-samples", type=int, default=None,
                        help="run at most this many samples per OpInfo (default: all)")
    parser.add_argument("--executor", default="interp", choices=("interp", "cpu"),
                        help="run Ember's graphs interpreted or compiled (the report records"
                             " the interpreter's results; each executor has its ratchet)")
    parser.add_argument("--write-docs", action="store_true")
    parser.add_argument("--update-ratchet", action="store_true")
    args = parser.parse_args(argv)
    BACKEND_OPTIONS["executor"] = args.executor
    if args.executor != "interp" and args.write_docs:
        parser.error("--write-docs records interpreter runs only")
    ratchet = ratchet_path(args.executor)

    ops = float32_ops()
    pattern = re.compile(args.filter) if args.filter else None
    names = [n for n in ops if pattern is None or pattern.search(n)]
    start = time.perf_counter()
    results = []
    for name in names:
        r = run_op(name, args.max_samples)
        results.append(r)
        if args.verbose or (pattern and r.status != "pass"):
            print(f"{r.status:<16} {name} ({r.samples}/{r.total_samples} samples,"
                  f" {r.seconds:.2f}s) {r.detail[:200]}", flush=True)
    seconds = time.perf_counter() - start
    counts = Counter(r.status for r in results)
    print(f"\n{len(results)} OpInfos, {len(results) - counts['nondeterministic']} attempted,"
          f" {sum(r.samples for r in results)} samples in {seconds:.0f} s: "
          + ", ".join(f"{s} {counts[s]}" for s in STATUS_ORDER))
    full = pattern is None and args.max_samples is None
    if args.update_ratchet:
        if not full:
            print("ratchet: not updated (needs the full run: no -k, no --max-samples)")
        else:
            names_ = set(read_ratchet(ratchet)) | {r.name for r in results
                                                   if r.status == "pass"}
            write_ratchet(names_, ratchet)
            print(f"ratchet: {len(names_)} OpInfos in {ratchet.relative_to(ROOT)}")
    if args.write_docs:
        if not full:
            print("docs: not written (needs the full run: no -k, no --max-samples)")
        else:
            DOC.write_text(report(results, seconds))
            print(f"wrote {DOC.relative_to(ROOT)}")
    lost = [n for n in read_ratchet(ratchet)
            if n in {r.name for r in results if r.status != "pass"}]
    if lost:
        print(f"ratchet: {len(lost)} listed OpInfo(s) no longer pass: {', '.join(lost)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
