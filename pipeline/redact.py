"""Credentials out of what is shown or stored: a URL keeps its scheme, host, port and path,
and loses its password (or token) and its query string."""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

HIDDEN = "***"
_URL = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"<>()\[\]{},]+")
_WEB = frozenset({"http", "https", "ws", "wss"})


def redact_url(url: str) -> str:
    """`postgresql://app:s3cret@db/x?sslpassword=y` -> `postgresql://app:***@db/x?***`.

    A lone user name stays for databases and brokers (it says which account); on the web a
    lone user part is a token (`https://TOKEN@host`) and is hidden too.
    """
    try:
        parts = urlsplit(url)
    except ValueError:
        return HIDDEN
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, host = netloc.rsplit("@", 1)
        user, has_password, _ = userinfo.partition(":")
        if has_password:
            userinfo = f"{user}:{HIDDEN}"
        elif parts.scheme.lower() in _WEB:
            userinfo = HIDDEN
        netloc = f"{userinfo}@{host}"
    query = HIDDEN if parts.query else ""
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))


def redact_urls(text: str) -> str:
    """Every URL in a message (an HTTP error names the URL it failed on) redacted."""
    return _URL.sub(lambda match: redact_url(match.group(0)), text)
