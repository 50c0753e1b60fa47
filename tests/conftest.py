"""Test-wide settings: compiled code goes to a fresh cache folder per test session, so
that no test reads what an earlier run (or another checkout) left in the user's cache.

Tests that do not name an executor run the reference interpreter (EMBER_BACKEND=interp):
they test frontends and graph capture against the oracle. The compiled path, the default
of `ember.compile`, is tested where tests ask for `Config(executor="cpu")`: the compiled
model tests, the ONNX ratchet's `cpu:` entries, the compiled OpInfo ratchet, and the
codegen, loop and fusion tests."""

from __future__ import annotations

import os
import tempfile

os.environ.setdefault("EMBER_CACHE_DIR", tempfile.mkdtemp(prefix="ember-test-cache-"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("EMBER_BACKEND", "interp")
