"""The pass manager's instruments: printing, dumping, verification, timing, reproducers."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ember import Builder, DType, EmberError, PassError, interpret, parse_graph, print_graph
from ember.driver.pass_manager import PassManager, run_passes
from ember.graph.ir import TensorType
from ember.graph.passes import GraphPass, get_pass


def sample_graph():
    b = Builder("g")
    x = b.input("x", DType.f32, (2, 2))
    dead = b.exp(x)  # noqa: F841  (dead code for dce)
    y = b.add(b.tanh(x), b.tanh(x))
    b.output(b.mul(y, 1.0))
    return b.build()


def test_pipeline_optimizes_and_keeps_values() -> None:
    graph = sample_graph()
    x = np.array([[0.5, -1.0], [2.0, 0.0]], np.float32)
    want = interpret(graph, [x])[0]
    optimized = run_passes(graph, ["canonicalize", "cse", "dce"])
    assert [op.name for op in optimized.ops] == ["tanh", "add"]
    np.testing.assert_array_equal(interpret(optimized, [x])[0], want)


def test_print_after_all_and_print_after() -> None:
    stream = io.StringIO()
    PassManager(["cse", "dce"], print_after_all=True, print_stream=stream).run(sample_graph())
    text = stream.getvalue()
    assert "// ----- IR after cse -----" in text and "// ----- IR after dce -----" in text
    stream = io.StringIO()
    PassManager(["cse", "dce"], print_after=["dce"], print_stream=stream).run(sample_graph())
    assert "after cse" not in stream.getvalue() and "after dce" in stream.getvalue()


def test_dump_every_stage_to_a_folder(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("EMBER_DUMP", str(tmp_path))
    manager = PassManager(["canonicalize", "dce"])
    manager.run(sample_graph())
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["00-input.ir", "01-canonicalize.ir", "02-dce.ir"]
    assert "graph.exp" in (tmp_path / "00-input.ir").read_text()
    assert "graph.exp" not in (tmp_path / "02-dce.ir").read_text()
    assert [t.name for t in manager.timings] == ["canonicalize", "dce"]
    assert "total" in manager.timing_report()


def _break_types(graph):
    graph.ops[-1].results[0].type = TensorType(DType.f32, (9,))
    return graph


def test_verify_each_catches_a_broken_pass_and_writes_a_reproducer(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBER_REPRO_DIR", str(tmp_path))
    broken = GraphPass("break-types", _break_types, "corrupts a result type")
    original = print_graph(sample_graph())
    with pytest.raises(PassError, match="pass 'break-types' failed") as info:
        PassManager(["cse", broken], verify_each=True).run(sample_graph())
    (folder,) = tmp_path.iterdir()
    assert str(folder) in str(info.value)
    reproducer = (folder / "input.ir").read_text()
    assert print_graph(parse_graph(reproducer)) == print_graph(
        run_passes(parse_graph(original), ["cse"]))
    assert "break-types" in (folder / "README.txt").read_text()


def test_unknown_pass_is_a_clear_error() -> None:
    with pytest.raises(EmberError, match="unknown pass 'fuse-everything'"):
        get_pass("fuse-everything")


def _opt(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ember", "opt", *args], input=stdin,
                          capture_output=True, text=True, timeout=120)


def test_opt_tool_reads_stdin_reports_errors_without_traceback(tmp_path: Path) -> None:
    text = print_graph(sample_graph())
    done = _opt("-", "-p", "cse,dce", "--timing", stdin=text)
    assert done.returncode == 0, done.stderr
    assert "graph.exp" not in done.stdout and "total" in done.stderr
    done = _opt("-", stdin=text.replace("graph.tanh", "graph.tanhh"))
    assert done.returncode == 1
    assert "error: <stdin>:" in done.stderr and "unknown op 'graph.tanhh'" in done.stderr
    assert "Traceback" not in done.stderr
    done = _opt(str(tmp_path / "missing.ir"))
    assert done.returncode == 1 and "cannot read" in done.stderr
    done = _opt("-", "-p", "nope", stdin=text)
    assert done.returncode == 1 and "unknown pass 'nope'" in done.stderr
    out = tmp_path / "out.ir"
    done = _opt("-", "-p", "dce", "--dump", str(tmp_path / "dump"), "-o", str(out), stdin=text)
    assert done.returncode == 0 and out.read_text().startswith("graph @g")
    assert (tmp_path / "dump" / "01-dce.ir").exists()
