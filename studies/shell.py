"""Commands printed for the user to paste into a shell: one helper, so that every word is quoted as a shell reads it."""

from __future__ import annotations

import shlex
from pathlib import Path


def shell_command(*words: str | Path) -> str:
    """`words` as one shell command line: a word with a space, a quote or `$` in it (a study path, a URI) is quoted
    (shlex.quote), so that the line pasted runs on exactly those words."""
    return " ".join(shlex.quote(str(word)) for word in words)
