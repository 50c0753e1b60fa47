"""Every registered op is exercised by the op tests of its family (a guard for new ops)."""

from __future__ import annotations

import re
from pathlib import Path

from ember.graph.ops import all_opdefs

TEXT = "\n".join(p.read_text() for p in Path(__file__).parent.glob("test_*.py"))


def test_every_op_is_named_in_the_op_tests() -> None:
    missing = [d.name for d in all_opdefs()
               if not re.search(rf"""(["'.]){re.escape(d.name)}(["'(])""", TEXT)]
    assert not missing, f"ops without tests in tests/graph/ops/: {missing}"
