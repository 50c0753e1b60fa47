"""Test-wide settings: compiled code goes to a fresh cache folder per test session, so
that no test reads what an earlier run (or another checkout) left in the user's cache."""

from __future__ import annotations

import os
import tempfile

os.environ.setdefault("EMBER_CACHE_DIR", tempfile.mkdtemp(prefix="ember-test-cache-"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
