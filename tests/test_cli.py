"""The `ember` command, run as a subprocess: each model command on a small ONNX model, and
the error paths (missing file, unsupported op, bad target, bad arguments): a non-zero exit
and one line on stderr."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402


def ember(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ember", *args], capture_output=True,
                          text=True, timeout=600, cwd=cwd)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("models")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    w = helper.make_tensor("w", TensorProto.FLOAT, [16, 8],
                           np.random.default_rng(0).standard_normal(128).astype(np.float32))
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["y"])]
    graph = helper.make_graph(nodes, "mlp", [x], [y], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
              folder / "mlp.onnx")
    bad = helper.make_graph([helper.make_node("NoSuchOp", ["x"], ["y"])], "bad", [x], [y])
    onnx.save(helper.make_model(bad, opset_imports=[helper.make_opsetid("", 17)]),
              folder / "bad.onnx")
    np.save(folder / "x.npy", np.ones((3, 16), np.float32))
    return folder


def ok(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 0, done.stderr
    return done.stdout


def one_line_error(done: subprocess.CompletedProcess, *words: str) -> None:
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    for word in words:
        assert word in lines[0]


def test_compile_summarizes(models) -> None:
    out = ok(ember("compile", str(models / "mlp.onnx"), "--shape", "x=4,16"))
    assert "1 kernels, 1 fused" in out and "graph passes" in out


def test_run_checks_against_the_reference(models, tmp_path) -> None:
    out = ok(ember("run", str(models / "mlp.onnx"), "--input", f"x={models / 'x.npy'}",
                   "--save", str(tmp_path)))
    assert "y: float32[3, 8]" in out and "matches the reference interpreter" in out
    saved = np.load(tmp_path / "y.npy")
    w = onnx.numpy_helper.to_array(onnx.load(models / "mlp.onnx").graph.initializer[0])
    np.testing.assert_allclose(saved, np.maximum(np.ones((3, 16)) @ w, 0), rtol=1e-5)


def test_bench_explain_ir(models) -> None:
    model = str(models / "mlp.onnx")
    assert "inferences/s" in ok(ember("bench", model, "--shape", "x=4,16", "--repeat", "3"))
    assert "k0_matmul_max" in ok(ember("explain", model, "--shape", "x=4,16"))
    assert "kernel @k0_matmul_max" in ok(ember("ir", model, "--shape", "x=4,16", "--stage",
                                               "loops"))
    assert "graph.fused" in ok(ember("ir", model, "--shape", "x=4,16"))
    assert "define" in ok(ember("ir", model, "--shape", "x=4,16", "--stage", "llvm"))


def test_tune_then_merge_another_machines_database(models, tmp_path) -> None:
    db, theirs = tmp_path / "tuning.json", tmp_path / "theirs.json"
    out = ok(ember("tune", str(models / "mlp.onnx"), "--shape", "x=64,16", "--budget", "0.2",
                   "--repeat", "3", "--db", str(db)))
    assert "tuned 1 kernels" in out and "tuned  " in out and "x)" in out
    (key, record), = json.loads(db.read_text()).items()
    assert key.startswith("gemm/-/64x8x16/") and record["tried"] >= 1
    theirs.write_text(json.dumps({"gemm/another-machine": record}))
    out = ok(ember("merge-tuning", str(theirs), "--db", str(db)))
    assert "1 records taken" in out and f"{db}: 2 records" in out
    one_line_error(ember("merge-tuning", str(tmp_path / "none.json"), "--db", str(db)),
                   "no tuning database")
    one_line_error(ember("tune", str(models / "mlp.onnx"), "--shape", "x=64,16",
                         "--executor", "slurm", "--db", str(db)), "unknown tuning executor")


def test_export_then_run_without_python(models, tmp_path) -> None:
    out = tmp_path / "out"
    assert "wrote" in ok(ember("export", str(models / "mlp.onnx"), "--shape", "x=4,16", "-o",
                               str(out)))
    subprocess.run(["cc", "-O2", "main.c", "-L.", "-lmodel", "-Wl,-rpath,$ORIGIN", "-o", "main"],
                   cwd=out, check=True)
    done = subprocess.run(["./main"], cwd=out, capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.startswith("y:")


def test_errors_are_one_line(models, tmp_path) -> None:
    model = str(models / "mlp.onnx")
    one_line_error(ember("run", str(tmp_path / "missing.onnx")), "no such file")
    one_line_error(ember("compile", str(models / "bad.onnx"), "--shape", "x=2,16"),
                   "NoSuchOp", "not support")
    one_line_error(ember("export", model, "--shape", "x=2,16", "-o", str(tmp_path / "o"),
                         "--target", "sparc"), "unknown target 'sparc'")
    one_line_error(ember("run", model), "symbolic dim 'N'", "--shape")
    one_line_error(ember("run", model, "--input", "x"), "NAME=FILE.npy")
    one_line_error(ember("explain", str(models / "x.npy")), "expected an ONNX model")
    bad_args = ember("export", model)  # -o missing: argparse's usage error
    assert bad_args.returncode == 2 and "required" in bad_args.stderr


def test_verbose_prints_the_details(models) -> None:
    done = ember("-v", "compile", str(models / "bad.onnx"), "--shape", "x=2,16")
    assert done.returncode == 1 and len(done.stderr.strip().splitlines()) == 2


def test_explain_resnet50_lists_every_kernel_with_time_and_roofline(tmp_path) -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    if __import__("shutil").which("dot") is None:
        pytest.skip("graphviz's dot is not installed (`make cross-tools` installs it)")
    torch.manual_seed(0)
    model = transformers.ResNetModel(transformers.ResNetConfig()).eval()

    class Features(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, x):
            return self.model(x).last_hidden_state

    path = tmp_path / "resnet50.onnx"
    with torch.no_grad():
        torch.onnx.export(Features(), (torch.randn(1, 3, 224, 224),), str(path), dynamo=False,
                          opset_version=17, input_names=["pixels"])
    done = ember("explain", str(path), "--svg", str(tmp_path / "resnet50.svg"))
    out = ok(done)
    rows = [line for line in out.splitlines() if line[:1] == "k" and line[1:2].isdigit()]
    assert len(rows) >= 50  # every kernel: ~53 fused convolutions, pooling, ...
    assert all(line.rstrip().endswith("%") for line in rows)  # each with its roofline
    assert "kernels" in out and "roofs:" in out
    fused = int(__import__("re").search(r"\((\d+) fused\)", out).group(1))
    svg = (tmp_path / "resnet50.svg").read_text()
    assert svg.startswith("<?xml") and svg.count("cluster_") == fused >= 45
