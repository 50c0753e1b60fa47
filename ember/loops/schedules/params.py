"""A schedule's tunable parameters, declared as data: name -> (default, the values a search
tries). The scheduling stage gives a step the defaults (some derived from the target),
unless a tuned compile gives others (ember/loops/schedule.py, ember/loops/tune/knobs.py)."""

from __future__ import annotations

Parameters = dict[str, tuple[int, tuple[int, ...]]]
