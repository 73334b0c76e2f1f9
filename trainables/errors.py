"""User errors: the one base class for a mistake the user fixes (the CLI catches it once), and how values are echoed."""

from __future__ import annotations

from typing import Any

__all__ = ["MAX_SHOWN_CHARS", "TrialRefused", "UserError", "shown"]

# An error message quotes the value it refuses; a pasted file or an expanded YAML alias must not become megabytes of it.
MAX_SHOWN_CHARS = 120


class UserError(ValueError):
    """Input the user can correct (a study file, an option, a path, data on disk): its message names the field,
    the rule, the value and the fix. The CLI prints it without a traceback and exits 2."""


class TrialRefused(UserError):
    """Settings a trial refuses from inside, once it has built what shows the problem (its model, its training
    subset): a finite-difference measure on a kinked model, a measurement set or batch larger than the subset. The
    same settings fail the same way on every attempt, so the trial fails once: trainables.ray_train records it as
    failed and ends it without raising, which Tune's max_failures would retry."""


def shown(value: Any, limit: int = MAX_SHOWN_CHARS) -> str:
    """`repr(value)` for an error message, cut to `limit` characters (the cut says how long the whole was)."""
    from trainables.secrets import redact

    try:
        text = redact(repr(value))  # a value echoed in a message never shows a URI's password
    except Exception:  # noqa: BLE001 - a value whose repr fails is still named
        text = f"<{type(value).__name__}>"
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} chars)"
