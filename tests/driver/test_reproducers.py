"""A compile that fails after the input was accepted (a pass, the lowering, LLVM) writes a
reproducer (the IR it failed on, the stage, the error, the replay command) and names it."""

from __future__ import annotations

from pathlib import Path

import pytest

import ember
import ember.graph.passes as passes
from ember.errors import CompileError, PassError
from ember.graph.passes import get_pass
from ember.loops.lower import core


def graph():
    b = ember.Builder("repro")
    x = b.input("x", "f32", (4,))
    b.output(b.exp(x))
    return b.build()


def reproducer(error: Exception) -> Path:
    line = next(li for li in str(error).splitlines() if "reproducer:" in li)
    return Path(line.split("reproducer:", 1)[1].strip())


def test_a_failing_lowering_leaves_a_reproducer(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("EMBER_REPRO_DIR", str(tmp_path))

    def broken(ctx):
        raise KeyError("a bug")

    monkeypatch.setitem(core._LOWERINGS, "exp", broken)
    with pytest.raises(CompileError, match="lowering to loops failed: internal error") as e:
        ember.compile(graph(), config=ember.Config(executor="cpu", disk_cache=False))
    folder = reproducer(e.value)
    assert folder.parent == tmp_path
    assert "graph.exp" in (folder / "input.ir").read_text()
    readme = (folder / "README.txt").read_text()
    assert "KeyError" in readme and "python -m ember lower" in readme


def test_a_pass_with_an_internal_error_leaves_a_reproducer(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("EMBER_REPRO_DIR", str(tmp_path))

    def broken(g):
        raise IndexError("off by one")

    original = get_pass("fuse")
    monkeypatch.setitem(passes._PASSES, "fuse", type(original)("fuse", broken, original.summary))
    with pytest.raises(PassError, match="pass 'fuse' failed: internal error") as e:
        ember.compile(graph(), config=ember.Config(executor="cpu", disk_cache=False))
    folder = reproducer(e.value)
    assert "-p fuse" in (folder / "README.txt").read_text()
    assert "graph.exp" in (folder / "input.ir").read_text()
