"""Credentials in URIs: the one function that hides them, and the refusal of a URI that carries a password."""

from __future__ import annotations

import re

__all__ = ["REDACTED", "password_problem", "redact"]

REDACTED = "***"

# scheme://user:password@host...: the password is everything between the first ':' after '//' and the last '@'
# before the host (a password may hold '@' or ':'; a user name may not hold ':'). The scheme starts at the first
# letter of a run of scheme characters; `lead` holds the run's non-letters before it (kept as they are). A match is
# tried only where such a run begins (the lookbehind) and the run is read once (possessive): scheme://... as a plain
# [A-Za-z][A-Za-z0-9+.-]*:// was tried from every letter of a long word, quadratic in its length (an error message
# echoing a 100,000-character value took 25 s to redact).
_USERINFO = re.compile(
    r"(?<![A-Za-z0-9+.-])(?P<lead>[0-9+.-]*+)(?P<head>[A-Za-z][A-Za-z0-9+.-]*+://[^/@:\s]*+):(?P<secret>[^/\s]*)@"
)


def _sub(text: str, secret: str) -> str:
    """`text` with the `:password` of every URI's user info replaced by `secret` (e.g. ':***')."""
    if "://" not in text:
        return text
    return _USERINFO.sub(lambda m: f"{m.group('lead')}{m.group('head')}{secret}@", text)


def redact(text: str) -> str:
    """`text` with the password of every `scheme://user:password@host` in it replaced by ***."""
    return _sub(text, f":{REDACTED}")


def password_problem(field: str, uri: str) -> str | None:
    """Why `uri`, the value of `field`, may not be used as it is (it carries a password), or None.

    A URI is printed, tagged on the study's MLflow run, written into Ray's trial configs on shared storage: a
    password in it would land in all of them. The credentials go where the library reads them instead.
    """
    if _USERINFO.search(uri) is None:
        return None
    scheme = uri.split("://", 1)[0].split("+", 1)[0].lower()
    if scheme in ("http", "https"):
        where = (
            "export MLFLOW_TRACKING_USERNAME=... MLFLOW_TRACKING_PASSWORD=... (or MLFLOW_TRACKING_TOKEN) in the "
            "driver's environment: sharpscale forwards them to every trial (docs/cluster.md)"
        )
    elif scheme == "postgresql":
        where = "put the password in ~/.pgpass (mode 600) or PGPASSWORD, which PostgreSQL's client reads"
    elif scheme == "mysql":
        where = "put the password in the driver's option file (~/.my.cnf), which the MySQL client reads"
    else:
        where = "give the credentials through the client's own environment variables or credentials file"
    bare = _sub(uri, "")
    return (
        f"{field}: the URI carries a password ({redact(uri)}); it would be printed, tagged in MLflow and written to "
        f"Ray's storage. Fix: drop it from the URI ({bare}) and {where}."
    )
