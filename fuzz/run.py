"""Run one fuzz target under atheris: `python fuzz/run.py <target> [libFuzzer flags]`; its
corpus folder is `fuzz/corpus/<target>/` (new inputs that reach new code are added there).
`python fuzz/run.py <target> -merge=1 NEW OLD...` keeps in NEW the inputs of OLD that
reach new code (how the checked-in corpora were minimized).
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import atheris

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

with atheris.instrument_imports(include=["ember"]):
    from fuzz.harness import TARGETS


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in TARGETS:
        sys.exit(f"usage: python fuzz/run.py {{{','.join(TARGETS)}}} [libFuzzer flags]")
    target = sys.argv[1]
    corpus = ROOT / "fuzz" / "corpus" / target
    corpus.mkdir(parents=True, exist_ok=True)
    check = TARGETS[target]
    # libFuzzer runs argv[0] again for -merge, -fork and -jobs: a script that runs this one
    # under this Python, with the target.
    with tempfile.NamedTemporaryFile("w", suffix=".sh", delete=False) as again:
        again.write(f'#!/bin/sh\nexec "{sys.executable}" "{__file__}" {target} "$@"\n')
    os.chmod(again.name, 0o755)
    flags = [a for a in sys.argv[2:] if a.startswith("-")]
    folders = [a for a in sys.argv[2:] if not a.startswith("-")] or [str(corpus)]
    atheris.Setup([again.name, *flags, *folders], check)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
