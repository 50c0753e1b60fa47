"""Runs the text-IR tests in this folder, lit-style.

Each `*.ir` file holds one or more `// RUN: <command>` lines. `%s` is the file itself and
`ember-opt` is `python -m ember opt` and `ember-lower` is `python -m ember lower`; the
command runs in a shell and must succeed.
Checks use the `filecheck` package (`// CHECK:`, `// CHECK-NEXT:`, `// CHECK-NOT:`, ...).
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
BIN = Path(sys.executable).parent
CASES = sorted(HERE.glob("**/*.ir"))


def run_lines(path: Path) -> list[str]:
    lines = [line.split("RUN:", 1)[1].strip() for line in path.read_text().splitlines()
             if line.lstrip().startswith("// RUN:")]
    assert lines, f"{path.name} has no RUN line"
    return lines


@pytest.mark.parametrize("path", CASES, ids=[str(p.relative_to(HERE)) for p in CASES])
def test_ir_file(path: Path) -> None:
    for line in run_lines(path):
        command = (line.replace("%s", shlex.quote(str(path)))
                   .replace("ember-opt", f"{shlex.quote(sys.executable)} -m ember opt")
                   .replace("ember-lower", f"{shlex.quote(sys.executable)} -m ember lower")
                   .replace("filecheck", shlex.quote(str(BIN / "filecheck"))))
        done = subprocess.run(["bash", "-o", "pipefail", "-c", command], capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, (
            f"{path.name}: `{line}` failed\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}")
