"""Worked examples for the on-policy methods (ppo ... ttrl)."""

from . import example  # noqa: F401
