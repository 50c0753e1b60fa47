"""The generated docs are current, and the demo runs."""

from __future__ import annotations

from ember.graph.ops.doc import DOC, updated_doc


def test_op_table_in_docs_is_current() -> None:
    text = DOC.read_text()
    assert updated_doc(text) == text, "run `python -m ember.graph.ops.doc` to regenerate it"


def test_demo_runs(capsys) -> None:
    from ember.demo import run_ir_demo

    run_ir_demo()
    assert "demo: OK" in capsys.readouterr().out


def test_readme_example_runs() -> None:
    from pathlib import Path

    readme = (Path(__file__).parents[1] / "README.md").read_text()
    code = readme.split("```python\n", 1)[1].split("```", 1)[0]
    exec(compile(code, "README.md", "exec"), {})


def test_onnx_support_page_is_current() -> None:
    from ember.frontends.onnx.doc import DOC as ONNX_DOC
    from ember.frontends.onnx.doc import onnx_doc

    assert ONNX_DOC.read_text() == onnx_doc(), "run `python -m ember.frontends.onnx.doc`"
