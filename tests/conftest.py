"""Shared pytest setup."""

import harness  # noqa: F401  (sets Warp's log level before Warp initialises)
