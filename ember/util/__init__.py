"""Shared basics below every level: files written atomically, values for cache keys."""
