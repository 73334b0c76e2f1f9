"""Credentials in URIs, the one home of the rule: what counts as one (a password in the user info, a token as an
http(s) user name, a query-string secret), the function that hides them (redact), the refusal of a URI field or flag
that carries one (credential_problem), and the URI without its user info (without_userinfo)."""

from __future__ import annotations

import re
import urllib.parse

__all__ = ["REDACTED", "credential_problem", "redact", "secret_query_key", "without_userinfo"]

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
# http(s)://NAME@host: HTTP has no user name without a password, so NAME is a token (a bearer token, an API key as
# the user, as some proxies take it). Other schemes' bare user names (postgresql://bob@db) are names, shown.
_HTTP_USER = re.compile(r"(?<![A-Za-z0-9+.-])(?P<head>https?://)(?P<user>[^/@:\s?#]+)@", re.IGNORECASE)
# A query parameter anywhere in a text: ?name=value or &name=value (or ;, or #name=value: a fragment, as OAuth
# implicit flows pass access_token), the value up to the next separator.
_QUERY = re.compile(r"(?P<sep>[?&;#])(?P<name>[A-Za-z0-9_.-]{1,64})=(?P<value>[^&;\s'\"#]*)")
# Query keys that hold a secret: databases' password (password, sslpassword, passwd, pwd), clouds' signed URLs
# (sig, signature, X-Amz-Signature, X-Amz-Credential, X-Amz-Security-Token, Azure's SAS `sig`), keys and tokens
# (secret_key, access_key, api_key, account_key, token, auth). A key file's path (sslkey) is no secret.
_SECRET_PARTS = ("password", "passwd", "secret", "token", "credential", "signature")
_SECRET_WORDS = {"pwd", "pass", "sig", "sas", "auth", "apikey", "accesskey", "secretkey", "privatekey"}
_SECRET_KEY_SUFFIX = re.compile(r"(access|secret|api|account|private|client)_?key$")


def secret_query_key(name: str) -> bool:
    """Whether a URI's query parameter `name` holds a credential (its value is then redacted and refused)."""
    key = name.lower().replace("-", "_")
    words = set(re.split(r"[_.]", key))
    return (
        any(part in key for part in _SECRET_PARTS)
        or bool(words & _SECRET_WORDS)
        or _SECRET_KEY_SUFFIX.search(key) is not None
    )


def _sub_userinfo(text: str, secret: str) -> str:
    """`text` with the `:password` of every URI's user info replaced by `secret` (e.g. ':***')."""
    return _USERINFO.sub(lambda m: f"{m.group('lead')}{m.group('head')}{secret}@", text)


def redact(text: str) -> str:
    """`text` with every credential of a URI in it replaced by ***: the password of `scheme://user:password@host`,
    the token of `http(s)://TOKEN@host`, the value of a secret query parameter (`?password=...`, `&sig=...`)."""
    if "://" in text:
        text = _sub_userinfo(text, f":{REDACTED}")
        text = _HTTP_USER.sub(lambda m: f"{m.group('head')}{REDACTED}@", text)
    if "=" in text:
        text = _QUERY.sub(
            lambda m: f"{m.group('sep')}{m.group('name')}={REDACTED}" if secret_query_key(m.group("name")) else m[0],
            text,
        )
    return text


def without_userinfo(uri: str) -> str:
    """`uri` without its user info (`scheme://user[:password]@host/...` -> `scheme://host/...`): what a reachability
    check or a download connects to (urllib takes the user info for part of the host otherwise)."""
    parts = urllib.parse.urlsplit(uri)
    if not parts.netloc or "@" not in parts.netloc:
        return uri
    return urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def _where(scheme: str) -> str:
    if scheme in ("http", "https"):
        return (
            "export MLFLOW_TRACKING_USERNAME=... MLFLOW_TRACKING_PASSWORD=... (or MLFLOW_TRACKING_TOKEN) in the "
            "driver's environment: sharpscale forwards them to every trial (docs/cluster.md)"
        )
    if scheme == "postgresql":
        return "put the password in ~/.pgpass (mode 600) or PGPASSWORD, which PostgreSQL's client reads"
    if scheme == "mysql":
        return "put the password in the driver's option file (~/.my.cnf), which the MySQL client reads"
    return "give the credentials through the client's own environment variables or credentials file"


def credential_problem(field: str, uri: str) -> str | None:
    """Why `uri`, the value of `field` (a study's URI field or a command's flag), may not be used as it is (it
    carries a credential: a password in its user info, a token as an http(s) user name, a secret query parameter),
    or None.

    A URI is printed, tagged on the study's MLflow run, written into Ray's trial configs on shared storage and onto
    child processes' command lines: a credential in it would land in all of them. The credentials go where the
    library reads them instead.
    """
    if not isinstance(uri, str):
        return None
    scheme = uri.split("://", 1)[0].split("+", 1)[0].lower() if "://" in uri else ""
    fix = f"Fix: drop it from the URI ({{bare}}) and {_where(scheme)}."
    if _USERINFO.search(uri) is not None:
        what, bare = "a password", _sub_userinfo(uri, "")
    elif scheme in ("http", "https") and _HTTP_USER.search(uri) is not None:
        what, bare = "a token as its user name", without_userinfo(uri)
    else:
        secrets = [m.group("name") for m in _QUERY.finditer(uri) if secret_query_key(m.group("name"))]
        if not secrets:
            return None
        what = f"a secret in its query ({', '.join(dict.fromkeys(secrets))})"
        bare = _QUERY.sub(lambda m: "" if secret_query_key(m.group("name")) else m[0], uri)
        if "?" not in bare and "&" in bare:
            bare = bare.replace("&", "?", 1)
    return (
        f"{field}: the URI carries {what} ({redact(uri)}); it would be printed, tagged in MLflow and written to "
        f"Ray's storage. " + fix.format(bare=redact(bare))
    )
