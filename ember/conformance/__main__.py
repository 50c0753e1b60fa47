"""`python -m ember.conformance onnx`: run the ONNX backend suite and report.

    python -m ember.conformance onnx                 # node suite: totals and per-op table
    python -m ember.conformance onnx -k reshape -v   # only matching cases, with details
    python -m ember.conformance onnx --write-docs    # also rewrite docs/conformance.md
    python -m ember.conformance onnx --update-ratchet  # add new passes to the ratchet
    python -m ember.conformance onnx --executor cpu    # the compiled path (ratchet: cpu:...)
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path

from ember.conformance.onnx_suite import (
    light_models,
    model_cases,
    node_cases,
    run_case,
    run_light_random,
    run_light_shipped,
)

ROOT = Path(__file__).resolve().parents[2]
RATCHET = ROOT / "tests" / "conformance" / "onnx" / "ratchet.txt"
DOC = ROOT / "docs" / "conformance.md"


def primary_op(case_name: str, op_names: list[str]) -> str:
    """The ONNX op a case tests, from its name: the longest op name its name starts with."""
    key = case_name.removeprefix("test_").replace("_", "").lower()
    best = ""
    for op in op_names:
        if key.startswith(op.lower()) and len(op) > len(best):
            best = op
    if not best:  # test_basic_conv_with_padding, test_edge_pad, ...: the longest op inside
        for op in op_names:
            if len(op) > 3 and op.lower() in key and len(op) > len(best):
                best = op
    return best or "(other)"


def read_ratchet() -> list[str]:
    if not RATCHET.exists():
        return []
    return [line.strip() for line in RATCHET.read_text().splitlines()
            if line.strip() and not line.startswith("#")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ember.conformance")
    parser.add_argument("suite", choices=["onnx"])
    parser.add_argument("-k", "--filter", help="regular expression on case names")
    parser.add_argument("-v", "--verbose", action="store_true", help="print each case")
    parser.add_argument("--models", action="store_true",
                        help="also run the simple, pytorch-operator, pytorch-converted and"
                             " light model cases")
    parser.add_argument("--write-docs", action="store_true")
    parser.add_argument("--update-ratchet", action="store_true")
    parser.add_argument("--executor", default=None)
    args = parser.parse_args(argv)

    cases = dict(node_cases())
    pattern = re.compile(args.filter) if args.filter else None
    names = [n for n in cases if pattern is None or pattern.search(n)]
    all_ops = sorted({op for c in cases.values() for n in [c.model.graph.node]
                      for op in (x.op_type for x in n)})
    results = []
    for name in names:
        result = run_case(cases[name], args.executor)
        results.append(result)
        if args.verbose or (pattern and result.status not in ("pass", "excluded")):
            print(f"{result.status:<12} {name} ({result.seconds:.2f}s)")
            if result.status not in ("pass", "excluded") and args.verbose:
                print("    " + result.detail.replace("\n", "\n    ")[:3000])
    core = [r for r in results if r.status != "excluded"]
    counts = Counter(r.status for r in core)
    passed = counts["pass"]
    print(f"\nnode cases: {len(results)} run, {len(core)} in the numeric core;"
          f" passed {passed} ({100 * passed / max(len(core), 1):.1f}%),"
          f" failed {counts['fail']}, unsupported {counts['unsupported']},"
          f" errors {counts['error']}")

    model_results = []
    if args.models:
        for kind in ("simple", "pytorch-operator", "pytorch-converted", "light"):
            for name, case in model_cases(kind).items():
                if pattern and not pattern.search(name):
                    continue
                r = run_case(case, args.executor)
                model_results.append((kind, r))
                _print_model(kind, r)
        for name in light_models():
            if pattern and not pattern.search(f"light_{name}"):
                continue
            for kind, run in (("light", run_light_shipped), ("light-random", run_light_random)):
                r = run(name, args.executor)
                model_results.append((kind, r))
                _print_model(kind, r)

    if args.update_ratchet and pattern is None:
        prefix = f"{args.executor}:" if args.executor and args.executor != "interp" else ""
        passed = {f"{prefix}node/{r.name}" for r in core if r.status == "pass"}
        passed |= {f"{prefix}{kind}/{r.name}" for kind, r in model_results
                   if r.status == "pass"}
        ratchet = sorted(set(read_ratchet()) | passed)
        RATCHET.parent.mkdir(parents=True, exist_ok=True)
        RATCHET.write_text("# ONNX cases that pass (suite/case); CI fails when one stops"
                           " passing.\n# Grow it with: python -m ember.conformance onnx --models"
                           " --update-ratchet\n" + "\n".join(ratchet) + "\n")
        print(f"ratchet: {len(ratchet)} cases in {RATCHET.relative_to(ROOT)}")
    if args.write_docs and pattern is None:
        DOC.write_text(report(core, all_ops, model_results))
        print(f"wrote {DOC.relative_to(ROOT)}")
    return 0


def _why(r) -> str:
    return " ".join(r.detail.split())[:200].replace("|", "/") if r.status != "pass" else ""


def _print_model(kind: str, r) -> None:
    why = f"  {r.detail.splitlines()[0][:150]}" if r.status != "pass" and r.detail else ""
    print(f"{kind:<18} {r.status:<12} {r.name} ({r.seconds:.1f}s){why}")


def report(core, all_ops, model_results) -> str:
    by_op: dict[str, Counter] = defaultdict(Counter)
    for r in core:
        by_op[primary_op(r.name, all_ops)][r.status] += 1
    counts = Counter(r.status for r in core)
    lines = [
        "# Conformance",
        "",
        "Generated by `python -m ember.conformance onnx --models --write-docs`.",
        "",
        "## ONNX backend node suite",
        "",
        f"The numeric core (defined in `ember/conformance/onnx_scope.py`) has {len(core)}"
        f" cases. Ember passes **{counts['pass']}** ({100 * counts['pass'] / len(core):.1f}%);"
        f" {counts['fail']} fail, {counts['unsupported']} are unsupported,"
        f" {counts['error']} raise internal errors. ONNX Runtime 1.32 passes 1,540 (93.7%).",
        "",
        "| op | cases | pass | fail | unsupported |",
        "|---|---:|---:|---:|---:|",
    ]
    for op in sorted(by_op):
        c = by_op[op]
        lines.append(f"| {op} | {sum(c.values())} | {c['pass']} | {c['fail'] + c['error']}"
                     f" | {c['unsupported']} |")
    failing = [r for r in core if r.status != "pass"]
    if failing:
        lines += ["", "### Cases that do not pass", "", "| case | status | why |", "|---|---|---|"]
        for r in sorted(failing, key=lambda r: r.name):
            lines.append(f"| {r.name} | {r.status} | {_why(r)} |")
    if model_results:
        lines += ["", "## Model cases", "", "| suite | case | status | why |", "|---|---|---|---|"]
        for kind, r in model_results:
            lines.append(f"| {kind} | {r.name} | {r.status} | {_why(r)} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
