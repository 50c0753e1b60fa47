"""Test-wide settings: compiled code goes to a fresh cache folder per test session, so
that no test reads what an earlier run (or another checkout) left in the user's cache.

Tests that do not name an executor run the reference interpreter (EMBER_BACKEND=interp):
they test frontends and graph capture against the oracle. The compiled path, the default
of `ember.compile`, is tested where tests ask for `Config(executor="cpu")`: the compiled
model tests, the ONNX ratchet's `cpu:` entries, the compiled OpInfo ratchet, and the
codegen, loop and fusion tests."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

if "EMBER_CACHE_DIR" not in os.environ:
    # Made once, by the process that starts the session (pytest-xdist's workers inherit
    # the variable), and removed when it ends: a run leaves 350 MB of compiled code, and
    # CI runs on the same machine again and again.
    _cache = tempfile.mkdtemp(prefix="ember-test-cache-")
    os.environ["EMBER_CACHE_DIR"] = _cache
    atexit.register(shutil.rmtree, _cache, ignore_errors=True)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("EMBER_BACKEND", "interp")
