"""Worked examples for corrections and trust-region objectives (tis ... sis)."""

from . import example  # noqa: F401
