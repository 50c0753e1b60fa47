"""Ahead-of-time libraries: exported models run from C with no Python (the example
main.c, built with the system C compiler) and give the JIT's outputs; AArch64 libraries
run under qemu-aarch64 and give the host's outputs."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import ember
from ember.target import Target, TargetError

SLOW = pytest.mark.slow
QEMU = ["qemu-aarch64", "-L", "/usr/aarch64-linux-gnu"]
needs_cross = pytest.mark.skipif(
    shutil.which("aarch64-linux-gnu-gcc") is None or shutil.which("qemu-aarch64") is None,
    reason="the AArch64 toolchain or qemu-user is not installed (`make cross-tools` installs"
           " gcc-aarch64-linux-gnu and qemu-user on Debian)")


def mlp_graph():
    rng = np.random.default_rng(0)
    b = ember.Builder("mlp")
    x = b.input("x", "f32", (8, 64))
    w1 = b.constant(rng.standard_normal((64, 256)).astype(np.float32) / 8, name="w1")
    w2 = b.constant(rng.standard_normal((256, 16)).astype(np.float32) / 16, name="w2")
    h = b.relu(b.matmul(x, w1))
    b.output(b.softmax(b.matmul(h, w2), axis=-1), b.reduce_sum(h, axes=(1,), keepdims=False))
    return b.build()


def build_main(out: Path, cc: str = "cc") -> None:
    subprocess.run([cc, "-O2", "main.c", "-L.", "-lmodel", "-Wl,-rpath,$ORIGIN", "-o", "main"],
                   cwd=out, check=True, capture_output=True)


def run_main(out: Path, inputs, prefix=()) -> list[np.ndarray]:
    """Run the example with the inputs as raw files; read its outputs back."""
    meta = json.loads((out / "model.json").read_text())
    names = []
    for i, a in enumerate(inputs):
        np.ascontiguousarray(a).tofile(out / f"in{i}.bin")
        names.append(f"in{i}.bin")
    names += [f"out{i}.bin" for i in range(len(meta["outputs"]))]
    done = subprocess.run([*prefix, "./main", *names], cwd=out, capture_output=True, text=True,
                          timeout=1800)
    assert done.returncode == 0, done.stderr
    return [np.fromfile(out / f"out{i}.bin", ember.DType(m["dtype"]).np).reshape(
        m.get("max_shape", m["shape"])) for i, m in enumerate(meta["outputs"])]


def assert_close(got, want, atol=1e-5) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, np.asarray(w), rtol=1e-5, atol=atol)


def test_exported_graph_runs_from_c_and_from_python(tmp_path) -> None:
    graph = mlp_graph()
    x = np.random.default_rng(1).standard_normal((8, 64)).astype(np.float32)
    want = ember.compile(graph, config=ember.Config(executor="cpu"))(x)
    out = ember.export(graph, [x], tmp_path)
    assert {p.name for p in out.iterdir()} >= {"libmodel.so", "model.h", "model.json", "main.c"}
    header = (out / "model.h").read_text()
    assert "model_t *model_create(void);" in header and "#define MODEL_INPUT0_BYTES 2048" in header
    assert_close(ember.load(out)(x), want)
    build_main(out)
    assert_close(run_main(out, [x]), want)


def test_a_library_of_every_size_runs_from_c_at_its_bounds(tmp_path) -> None:
    """A batch known at call time, up to 16: `main.c` (its `model_run`) runs at the bound;
    from Python, each call's batch binds (tests/graph/test_symbolic.py has more)."""
    from ember.graph.symbolic import symbol

    rng = np.random.default_rng(0)
    b = ember.Builder("mlp")
    x = b.input("x", "f32", (symbol("n"), 64))
    w = b.constant(rng.standard_normal((64, 32)).astype(np.float32) / 8, name="w")
    b.output(b.softmax(b.relu(b.matmul(x, w)), axis=-1))
    graph = b.build()
    graph.size_bounds = {"n": 16}
    out = ember.export(graph, None, tmp_path)
    meta = json.loads((out / "model.json").read_text())
    assert meta["sizes"] == [{"name": "n", "bound": 16}]
    assert meta["inputs"][0]["shape"] == ["?n", 64] and meta["inputs"][0]["max_shape"] == [16, 64]
    x16 = rng.standard_normal((16, 64)).astype(np.float32)
    build_main(out)
    assert_close(run_main(out, [x16]), ember.interpret(graph, [x16]))
    x3 = x16[:3]
    assert_close(ember.load(out)(x3), ember.interpret(graph, [x3]))


def test_loaded_library_checks_its_inputs(tmp_path) -> None:
    graph = mlp_graph()
    lib = ember.load(ember.export(graph, [np.zeros((8, 64), np.float32)], tmp_path))
    with pytest.raises(ember.ShapeError, match=r"expected f32\[8, 64\]"):
        lib(np.zeros((8, 63), np.float32))
    with pytest.raises(ember.ShapeError, match="takes 1 inputs"):
        lib()


def test_unknown_target_and_missing_compiler(tmp_path) -> None:
    graph = mlp_graph()
    with pytest.raises(TargetError, match="unknown target 'sparc'"):
        ember.export(graph, [np.zeros((8, 64), np.float32)], tmp_path, target="sparc")
    from ember.driver.pipeline import lower_to_program
    from ember.runtime.aot import write_library

    program, plan = lower_to_program(graph, ember.Config(executor="cpu"))
    missing = dataclasses.replace(Target.host(), cc="no-such-cc")
    with pytest.raises(TargetError, match="needs the C compiler 'no-such-cc'"):
        write_library(program, plan, tmp_path, missing)


def _torch_model(name: str):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    if name == "resnet50":
        model = transformers.ResNetModel(transformers.ResNetConfig()).eval()
        return model, torch.randn(1, 3, 224, 224)
    model = transformers.BertModel(transformers.BertConfig()).eval()
    return model, torch.randint(0, 30000, (1, 128))


@pytest.mark.parametrize("name", ["resnet50", pytest.param("bert", marks=SLOW)])
def test_exported_model_matches_the_jit(name, tmp_path) -> None:
    torch = pytest.importorskip("torch")
    model, x = _torch_model(name)
    graph = ember.torch.export(model, (x,))
    want = ember.compile(graph, config=ember.Config(executor="cpu"))(x.numpy())
    out = ember.export(model, (x,), tmp_path)
    build_main(out)
    with torch.no_grad():
        assert_close(run_main(out, [x.numpy()]), want, atol=1e-4)


@needs_cross
def test_mlp_cross_compiled_for_aarch64_runs_under_qemu(tmp_path) -> None:
    graph = mlp_graph()
    x = np.random.default_rng(2).standard_normal((8, 64)).astype(np.float32)
    want = ember.compile(graph, config=ember.Config(executor="cpu"))(x)
    out = ember.export(graph, [x], tmp_path, target="aarch64-linux-gnu")
    arch = subprocess.run(["file", "-b", str(out / "libmodel.so")], capture_output=True,
                          text=True).stdout if shutil.which("file") else "ARM aarch64"
    assert "aarch64" in arch
    build_main(out, "aarch64-linux-gnu-gcc")
    assert_close(run_main(out, [x], QEMU), want)


@SLOW
@needs_cross
def test_resnet50_cross_compiled_for_aarch64_runs_under_qemu(tmp_path) -> None:
    model, x = _torch_model("resnet50")
    graph = ember.torch.export(model, (x,))
    want = ember.compile(graph, config=ember.Config(executor="cpu"))(x.numpy())
    out = ember.export(graph, [x.numpy()], tmp_path, target="aarch64-linux-gnu")
    build_main(out, "aarch64-linux-gnu-gcc")
    assert_close(run_main(out, [x.numpy()], QEMU), want, atol=1e-4)


def test_a_torch_module_exports_for_every_batch_up_to_a_bound(tmp_path) -> None:
    torch = pytest.importorskip("torch")
    model = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU()).eval()
    batch = torch.export.Dim("batch", max=32)
    out = ember.export(model, (torch.randn(4, 16),), tmp_path,
                       dynamic={"input": {0: batch}})
    run = ember.load(out)
    assert list(run.bounds.values()) == [32]  # (the size keeps torch's symbol name)
    with torch.no_grad():
        for n in (1, 7, 32):
            x = torch.randn(n, 16)
            np.testing.assert_allclose(run(x.numpy())[0], model(x).numpy(), rtol=1e-5,
                                       atol=1e-6)
