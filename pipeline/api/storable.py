"""What PostgreSQL cannot store, found before it is stored: a NUL character (no text or jsonb
holds one) and a lone surrogate (no valid Unicode does). Without this, such a value reached the
database and came back as a 500 whose log line quoted PostgreSQL's CONTEXT: the input."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

from starlette.datastructures import Headers
from starlette.types import Scope

from pipeline.errors import Invalid


# The API's own check of a body (only this edge raises it), so it stays beside it.
class Unstorable(Invalid):
    """A value holds a character PostgreSQL cannot store."""


NUL = "a value holds a NUL (U+0000) character, which cannot be stored"
SURROGATE = "a value holds a lone surrogate (U+D800 to U+DFFF), which is not valid Unicode"
# A JSON string holds either as an escape, or a surrogate as its raw UTF-8 bytes (ED A0..BF),
# which Python's JSON decoder lets through: where neither is, the body is not parsed again.
_SUSPECT = re.compile(rb"\\u(?:0000|[dD][89a-fA-F])|\xed[\xa0-\xbf]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def unstorable_body(body: bytes) -> Unstorable | None:
    """Why a JSON body cannot be stored (a NUL, a lone surrogate), or None. A body that is not
    JSON is the route's to refuse, with its own message."""
    if not _SUSPECT.search(body):
        return None
    try:
        document = json.loads(body)
    except (ValueError, RecursionError):
        return None
    return unstorable_document(document)


def unstorable_document(document: Any) -> Unstorable | None:
    """Why a parsed JSON document cannot be stored, or None."""
    for text in _strings(document):
        if "\x00" in text:
            return Unstorable(NUL)
        if _SURROGATE.search(text):
            return Unstorable(SURROGATE)
    return None


def _strings(document: Any) -> Iterator[str]:
    """Every key and string value, however deep (without recursion)."""
    pending = [document]
    while pending:
        value = pending.pop()
        if isinstance(value, str):
            yield value
        elif isinstance(value, dict):
            pending.extend(value)
            pending.extend(value.values())
        elif isinstance(value, list):
            pending.extend(value)


def unstorable_request(scope: Scope, body: bytes) -> Unstorable | None:
    """A NUL in the path, the query or a form (PostgreSQL text cannot hold one), or what
    `unstorable_body` finds in a JSON body."""
    if "\x00" in scope["path"] or b"%00" in scope.get("query_string", b""):
        return Unstorable(NUL)
    if b"\x00" in body or b"%00" in body:  # a form's field, or a raw byte no JSON may hold
        content_type = Headers(scope=scope).get("content-type", "")
        if content_type.startswith("application/x-www-form-urlencoded"):
            return Unstorable(NUL)
    return unstorable_body(body)
