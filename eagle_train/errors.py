"""The one base class of every user-facing error.

A ``UserError`` is a mistake the user can fix (a config key, a path, a damaged or foreign
file): the command line prints it as one line, ``error: <path or key>: <what was expected>``,
and exits with code 2, without a traceback. Every other exception is a bug and keeps its
traceback. Each module's error class derives from ``UserError`` (and keeps the builtin base it
had, so ``except ValueError`` callers are unchanged).
"""

from __future__ import annotations


class UserError(Exception):
    """A mistake the user can fix; its message names the path or key and what was expected."""
