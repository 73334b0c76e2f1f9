"""Credentials in URIs: the one function that hides them, and the refusal of a URI that carries a password."""

from __future__ import annotations

import re

__all__ = ["REDACTED", "password_problem", "redact"]

REDACTED = "***"

# scheme://user:password@host...: the password is everything between the first ':' after '//' and the last '@'
# before the host (a password may hold '@' or ':'; a user name may not hold ':').
_USERINFO = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^/@:\s]*):(?P<secret>[^/\s]*)@")


def redact(text: str) -> str:
    """`text` with the password of every `scheme://user:password@host` in it replaced by ***."""
    return _USERINFO.sub(lambda m: f"{m.group('head')}:{REDACTED}@", text)


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
    bare = _USERINFO.sub(lambda m: f"{m.group('head')}@", uri)
    return (
        f"{field}: the URI carries a password ({redact(uri)}); it would be printed, tagged in MLflow and written to "
        f"Ray's storage. Fix: drop it from the URI ({bare}) and {where}."
    )
