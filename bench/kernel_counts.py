"""How many kernels each model compiles to, without and with fusion (no LLVM runs).

    python bench/kernel_counts.py [--models mlp,bert,gpt2,resnet50,mobilenet_v2] [--no-record]

For each model: the graph ops after the default passes, the kernels without fusion (one
per op), the kernels with fusion, and how many of those are fused (by kind). Appended to
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import datetime
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from bench.bench_models import make_model, publish  # noqa: E402
from ember.driver.pass_manager import PassManager  # noqa: E402
from ember.frontends.torch.export import capture_program, import_program  # noqa: E402
from ember.graph.ir import clone_graph  # noqa: E402
from ember.graph.passes import DEFAULT_PIPELINE  # noqa: E402
from ember.loops.lower import lower_graph  # noqa: E402
from ember.target import Target  # noqa: E402

HOST = Target.host()


def counts(name: str) -> dict:
    model, inputs = make_model(name)
    with torch.no_grad():
        program, _ = capture_program(model, inputs, {})
    graph = import_program(program)
    plain = PassManager(DEFAULT_PIPELINE).run(graph)
    ops = sum(1 for op in plain.ops if op.name != "constant")
    unfused = len(lower_graph(plain, target=HOST).kernels)
    fused = PassManager(["fuse", "dce"]).run(clone_graph(plain))
    kinds = Counter(op.attrs["kind"] for op in fused.ops if op.name == "fused")
    return {"model": name, "ops": ops, "unfused": unfused,
            "fused": len(lower_graph(fused, target=HOST).kernels), "kinds": kinds}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="mlp,bert,gpt2,resnet50,mobilenet_v2")
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    rows = []
    for name in args.models.split(","):
        print(f"counting {name} ...", file=sys.stderr)
        rows.append(counts(name))
    lines = [f"### {datetime.date.today()}: kernels per model, without and with fusion", "",
             "| model | graph ops | kernels unfused | kernels fused | fused kernels by kind |",
             "|---|---:|---:|---:|---|"]
    for r in rows:
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(r["kinds"].items()))
        lines.append(f"| {r['model']} | {r['ops']} | {r['unfused']} | {r['fused']} | {kinds} |")
    publish(lines, not args.no_record)


if __name__ == "__main__":
    main()
