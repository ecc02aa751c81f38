"""Errors every layer may raise toward the user, kept apart from the CLI so that lower
layers never import it."""

from __future__ import annotations


class UserError(Exception):
    """Bad input from the user or a guest; printed as one line, exit status 2."""
